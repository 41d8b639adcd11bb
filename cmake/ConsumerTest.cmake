# Run with cmake -P: installs quota from QUOTA_SOURCE_DIR into WORK_DIR/prefix, then
# builds and runs the consumer project in CONSUMER_SOURCE_DIR against that prefix only.
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
