# quota_cli: the command lines of the examples and benchmarks (examples/common/cli.hpp on
# abseil flags). Included by examples/ and benchmarks/, whichever comes first defines it.
if(NOT TARGET quota_cli)
  add_library(quota_cli INTERFACE)
  target_include_directories(quota_cli INTERFACE ${PROJECT_SOURCE_DIR}/examples)
  target_link_libraries(quota_cli INTERFACE absl::flags absl::flags_parse absl::strings
                                            absl::str_format)
endif()

# quota_cli_tests(<target> HELP <regex> [VALUE_FLAG <--flag>] [BAD <--flag=value> <regex>]):
# CTest checks (<target>.cli_*) that `<target> --help` prints <regex> and exits 0, and
# that an unknown flag, <--flag> without its value and a bad value exit 2 with a message
# naming the flag.
function(quota_cli_tests target)
  cmake_parse_arguments(C "" "HELP;VALUE_FLAG" "BAD" ${ARGN})
  set(script ${PROJECT_SOURCE_DIR}/cmake/check_cli.cmake)
  add_test(NAME ${target}.cli_help
    COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:${target}> -DRC=0 "-DREGEX=${C_HELP}"
      -DARGS=--help -P ${script})
  add_test(NAME ${target}.cli_unknown_flag
    COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:${target}> -DRC=2
      "-DREGEX=unknown flag '--frobnicate'" -DARGS=--frobnicate=3 -P ${script})
  if(C_VALUE_FLAG)
    add_test(NAME ${target}.cli_no_value
      COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:${target}> -DRC=2
        "-DREGEX=${C_VALUE_FLAG} needs a value" -DARGS=${C_VALUE_FLAG} -P ${script})
  endif()
  if(C_BAD)
    list(GET C_BAD 0 arg)
    list(GET C_BAD 1 regex)
    add_test(NAME ${target}.cli_bad_value
      COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:${target}> -DRC=2 "-DREGEX=${regex}"
        -DARGS=${arg} -P ${script})
  endif()
endfunction()
