# quota::rules — YAML rule files for the gateway (include/quota/rules/), header-only like
# the rest, linking yaml-cpp (Debian's libyaml-cpp-dev, 0.7 or later). Missing yaml-cpp
# disables the target with a message instead of failing the whole configure, so users who
# build their rule sets in code never link it.
find_package(yaml-cpp 0.7 CONFIG QUIET)
if(yaml-cpp_FOUND)
  # yaml-cpp 0.8 names its target yaml-cpp::yaml-cpp (keeping yaml-cpp as a deprecated
  # alias); 0.7 has only yaml-cpp.
  if(TARGET yaml-cpp::yaml-cpp)
    set(QUOTA_YAML_CPP_TARGET yaml-cpp::yaml-cpp)
  else()
    set(QUOTA_YAML_CPP_TARGET yaml-cpp)
  endif()
  add_library(quota_rules INTERFACE)
  add_library(quota::rules ALIAS quota_rules)
  set_target_properties(quota_rules PROPERTIES EXPORT_NAME rules)
  target_link_libraries(quota_rules INTERFACE quota::quota ${QUOTA_YAML_CPP_TARGET})
  set(QUOTA_HAVE_RULES ON)
else()
  message(STATUS "quota: yaml-cpp not found; the quota::rules target is not built")
  set(QUOTA_HAVE_RULES OFF)
endif()
