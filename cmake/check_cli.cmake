# cmake -DEXE=<binary> -DRC=<exit code> [-DREGEX=<regex>] "-DARGS=<;-list>" -P check_cli.cmake
# Runs ${EXE} ${ARGS} and fails unless it exits with ${RC} and its stdout + stderr
# (newlines as spaces) match ${REGEX}. For the command lines of examples/common/cli.hpp:
# --help exits 0, an unknown flag or a bad value 2.
execute_process(COMMAND ${EXE} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT 60)
set(all "${out}${err}")
string(REPLACE "\n" " " flat "${all}")
message(STATUS "${EXE} ${ARGS} -> exit ${rc}\n${all}")
if(NOT rc STREQUAL RC)
  message(FATAL_ERROR "expected exit code ${RC}, got ${rc}")
endif()
if(REGEX AND NOT flat MATCHES "${REGEX}")
  message(FATAL_ERROR "output does not match: ${REGEX}")
endif()
