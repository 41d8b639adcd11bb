# quota::redis — header-only like the rest, but it links hiredis (Debian's
# libhiredis-dev, found through pkg-config). Missing hiredis disables the target with a
# message instead of failing the whole configure, so in-process users are not affected.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(HIREDIS QUIET IMPORTED_TARGET hiredis)
endif()
if(HIREDIS_FOUND)
  add_library(quota_redis INTERFACE)
  add_library(quota::redis ALIAS quota_redis)
  set_target_properties(quota_redis PROPERTIES EXPORT_NAME redis)
  target_link_libraries(quota_redis INTERFACE quota::quota PkgConfig::HIREDIS)
  set(QUOTA_HAVE_REDIS ON)
else()
  message(STATUS "quota: hiredis not found; the quota::redis target is not built")
  set(QUOTA_HAVE_REDIS OFF)
endif()
