# quota_cli: the command lines of the examples and benchmarks (examples/common/cli.hpp on
# abseil flags). Included by examples/ and benchmarks/, whichever comes first defines it.
if(NOT TARGET quota_cli)
  add_library(quota_cli INTERFACE)
  target_include_directories(quota_cli INTERFACE ${PROJECT_SOURCE_DIR}/examples)
  target_link_libraries(quota_cli INTERFACE absl::flags absl::flags_parse absl::strings
                                            absl::str_format)
endif()
