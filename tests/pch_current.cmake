# cmake -DPCH=<codegen-pch/duet_pch.h> -P pch_current.cmake: fails when the generated kernels'
# precompiled header is older than its source. clang then refuses it, and every generated kernel
# fails to build (the interpreter runs on, with a warning). Before the fix, each reconfigure
# rewrote the source, and the precompiled header was not rebuilt.
if(NOT EXISTS "${PCH}.gch")
  message(FATAL_ERROR "no precompiled header ${PCH}.gch")
endif()
if("${PCH}" IS_NEWER_THAN "${PCH}.gch")
  message(FATAL_ERROR "${PCH} is newer than ${PCH}.gch: the precompiled header is stale")
endif()
