// fuzz/policy_fuzz.cpp — libFuzzer target: the four policies against their exact models,
// contracts and envelopes (check/policy_check.hpp). Built with -DQUOTA_FUZZ=ON and
// clang++; see fuzz/CMakeLists.txt for how to run it.
#include <cstddef>
#include <cstdint>

#include "check/policy_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  quota::fuzz::check_policy_input(data, size);
  return 0;
}
