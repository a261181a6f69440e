# Compares the generated op reference with docs/ops.md. duet_op_docs fails, before printing
# anything, when core/ops.def's cuda column disagrees with the CUDA kernels a build registers.
execute_process(COMMAND ${GEN} OUTPUT_VARIABLE generated ERROR_VARIABLE errors RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "duet_op_docs failed (${rc}):\n${errors}")
endif()
file(READ ${DOC} current)
if(NOT generated STREQUAL current)
  message(FATAL_ERROR "docs/ops.md is stale: regenerate it with ./build/tools/duet_op_docs > docs/ops.md")
endif()
