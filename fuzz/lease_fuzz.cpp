// fuzz/lease_fuzz.cpp — libFuzzer target: a lease holder over an in-process authority
// against its contract and envelope (check/lease_check.hpp). Built with -DQUOTA_FUZZ=ON
// and clang++; see fuzz/CMakeLists.txt for how to run it.
#include <cstddef>
#include <cstdint>

#include "check/lease_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  quota::fuzz::check_lease_input(data, size);
  return 0;
}
