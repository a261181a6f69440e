# Compares the generated op reference with docs/ops.md.
execute_process(COMMAND ${GEN} OUTPUT_VARIABLE generated RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "duet_op_docs failed (${rc})")
endif()
file(READ ${DOC} current)
if(NOT generated STREQUAL current)
  message(FATAL_ERROR "docs/ops.md is stale: regenerate it with ./build/tests/duet_op_docs > docs/ops.md")
endif()
