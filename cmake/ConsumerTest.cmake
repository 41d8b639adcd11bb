# Run with cmake -P: installs quota from QUOTA_SOURCE_DIR into WORK_DIR/prefix, then
# builds and runs the consumer project in CONSUMER_SOURCE_DIR against that prefix only.
# Its testing-kit tests (Catch2, GoogleTest) must pass on kit/rules.yaml and fail on
# kit/loose.yaml, the rule loosened, with the broken envelope in their output.
foreach(var QUOTA_SOURCE_DIR WORK_DIR CONSUMER_SOURCE_DIR CXX_COMPILER)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "ConsumerTest.cmake: ${var} is not set")
  endif()
endforeach()

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer test: command failed (${rc}): ${ARGN}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
run(${CMAKE_COMMAND} -S ${QUOTA_SOURCE_DIR} -B ${WORK_DIR}/quota-build
    -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_INSTALL_PREFIX=${WORK_DIR}/prefix
    -DQUOTA_BUILD_TESTS=OFF -DQUOTA_BUILD_BENCHMARKS=OFF -DQUOTA_BUILD_EXAMPLES=OFF
    -DQUOTA_BUILD_C=OFF)  # the header-only targets: installed without a build
run(${CMAKE_COMMAND} --install ${WORK_DIR}/quota-build)
run(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/consumer-build
    -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer-build)
run(${WORK_DIR}/consumer-build/consumer)
if(EXISTS ${WORK_DIR}/consumer-build/consumer_rules)
  run(${WORK_DIR}/consumer-build/consumer_rules)
endif()

# A kit test: passes on the rule as written; fails on the loosened rule, saying why.
function(run_kit exe)
  set(kit ${CONSUMER_SOURCE_DIR}/kit)
  run(${CMAKE_COMMAND} -E env QUOTA_RULES=${kit}/rules.yaml ${exe})
  execute_process(COMMAND ${CMAKE_COMMAND} -E env QUOTA_RULES=${kit}/loose.yaml ${exe}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc EQUAL 0 OR NOT out MATCHES "free-read: 20 admitted.*VIOLATED; key [{]acme[}]read")
    message(FATAL_ERROR "consumer test: ${exe} did not fail on the loosened rule "
                        "(${rc}):\n${out}")
  endif()
  message(STATUS "consumer test: ${exe} fails on the loosened rule, as it must")
endfunction()
foreach(kit_test consumer_kit_catch2 consumer_kit_gtest)
  if(EXISTS ${WORK_DIR}/consumer-build/${kit_test})
    run_kit(${WORK_DIR}/consumer-build/${kit_test})
  else()
    message(STATUS "consumer test: ${kit_test} not built (its framework or quota::rules missing)")
  endif()
endforeach()
