# Install rules and a relocatable package config (quotaConfig.cmake), generated only
# when quota is the top-level project.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(DIRECTORY include/quota DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS quota quota_testing EXPORT quotaTargets)
install(EXPORT quotaTargets NAMESPACE quota:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/quota)
if(QUOTA_HAVE_REDIS)
  install(TARGETS quota_redis EXPORT quotaRedisTargets)
  install(EXPORT quotaRedisTargets NAMESPACE quota:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/quota)
endif()
if(QUOTA_HAVE_RULES)
  install(TARGETS quota_rules EXPORT quotaRulesTargets)
  install(EXPORT quotaRulesTargets NAMESPACE quota:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/quota)
endif()

configure_package_config_file(cmake/quotaConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/quotaConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/quota)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/quotaConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/quotaConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/quotaConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/quota)
