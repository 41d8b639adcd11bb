// fuzz/corpus_test.cpp — runs every file of a fuzz corpus directory through the same
// check function as the libFuzzer target, without libFuzzer: the corpus as a regular
// test in every build (tests/CMakeLists.txt registers one per target). The c_api target
// is there when the driver is built with QUOTA_FUZZ_C_API (linked with quota::c_static).
//
//   fuzz_corpus_test policy fuzz/corpus/policy
//
// Exit status 0 when every input passes; a failing check prints what failed and traps.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "check/lease_check.hpp"
#include "check/policy_check.hpp"
#ifdef QUOTA_FUZZ_C_API
#include "check/c_api_check.hpp"
#endif

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s policy|lease|c_api <corpus dir>\n", argv[0]);
    return 2;
  }
  const std::string target = argv[1];
#ifdef QUOTA_FUZZ_C_API
  const bool c_api = target == "c_api";
#else
  const bool c_api = false;
#endif
  if (target != "policy" && target != "lease" && !c_api) {
    std::fprintf(stderr, "unknown target %s\n", argv[1]);
    return 2;
  }
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(argv[2])) {
    if (e.is_regular_file() && e.path().filename() != "README.md") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "no inputs in %s\n", argv[2]);
    return 1;
  }
  for (const auto& f : files) {
    std::ifstream is(f, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(is)),
                                  std::istreambuf_iterator<char>());
    std::fprintf(stderr, "%s\n", f.filename().c_str());
    const auto* data = reinterpret_cast<const std::uint8_t*>(bytes.data());
    if (target == "policy") {
      quota::fuzz::check_policy_input(data, bytes.size());
    } else if (target == "lease") {
      quota::fuzz::check_lease_input(data, bytes.size());
    } else {
#ifdef QUOTA_FUZZ_C_API
      quota::fuzz::check_c_api_input(data, bytes.size());
#endif
    }
  }
  std::printf("%zu inputs passed\n", files.size());
  return 0;
}
