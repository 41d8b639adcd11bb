# The Debian package of quota-server (cpack -G DEB): the binary, a systemd unit, the
# example rule files and the nginx config, as the install component "server". Built from
# the build tree with `cpack -G DEB --config CPackConfig.cmake`; its dependencies are
# read from the binary by dpkg-shlibdeps (Debian's dpkg-dev). The library's headers and
# CMake package are not in it (they are installed by `cmake --install`).
set(CPACK_PACKAGE_NAME quota-server)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "rate limit service for gateways: Envoy RLS v3, a JSON check API, nginx auth_request")
set(CPACK_PACKAGE_CONTACT "quota developers <quota@localhost>")
set(CPACK_GENERATOR DEB)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL server)
set(CPACK_DEBIAN_SERVER_PACKAGE_NAME quota-server)
set(CPACK_DEBIAN_SERVER_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
include(CPack)
