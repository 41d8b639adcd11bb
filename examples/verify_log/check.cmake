# Runs ${EXE} with the ;-list ${ARGS} (stdin from ${STDIN} if set) and fails unless the
# exit code is ${RC} and stdout+stderr match ${REGEX}.
if(STDIN)
  execute_process(COMMAND ${EXE} ${ARGS} INPUT_FILE ${STDIN} RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
else()
  execute_process(COMMAND ${EXE} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
endif()
set(all "${out}${err}")
string(REPLACE "\n" " " flat "${all}")
message(STATUS "verify_log ${ARGS} -> exit ${rc}\n${all}")
if(NOT rc STREQUAL RC)
  message(FATAL_ERROR "expected exit code ${RC}, got ${rc}")
endif()
if(NOT flat MATCHES "${REGEX}")
  message(FATAL_ERROR "output does not match: ${REGEX}")
endif()
