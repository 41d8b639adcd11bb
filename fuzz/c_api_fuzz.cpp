// fuzz/c_api_fuzz.cpp — libFuzzer target: the C interface (quota/c/quota.h) called as a
// hostile host would, every answer against the header's contract (check/c_api_check.hpp).
// Built with -DQUOTA_FUZZ=ON and clang++ where the C interface is (src/c); see
// fuzz/CMakeLists.txt for how to run it.
#include <cstddef>
#include <cstdint>

#include "check/c_api_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  quota::fuzz::check_c_api_input(data, size);
  return 0;
}
