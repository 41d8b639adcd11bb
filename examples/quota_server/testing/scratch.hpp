// examples/quota_server/testing/scratch.hpp — what quota-server's tests share besides the
// process: the environment CTest passes (env), a scratch directory for rule files and
// logs (TempDir), removed with its contents when the test ends, and the server's usual
// command line (server_args).
//
// Thread safety: one thread per TempDir.
//
//   quota::testing::TempDir dir("auth");
//   std::string rules = dir.write("rules.yaml", "routes: ...");
//   std::string exe = quota::testing::env("QUOTA_SERVER");
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace quota::testing {

// The environment variable `name`, empty when unset.
inline std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// A directory /tmp/quota_server_<tag>_XXXXXX of the test's own.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& tag) {
    std::string t = "/tmp/quota_server_" + tag + "_XXXXXX";
    REQUIRE(mkdtemp(t.data()) != nullptr);
    path = t;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  // Writes `text` to the file `name` in it; its path.
  std::string write(const std::string& name, const std::string& text) const {
    const std::string p = path + "/" + name;
    std::ofstream(p) << text;
    return p;
  }
};

// quota-server ($QUOTA_SERVER) with rule file `rules`, plan "free" and route "read" for
// requests that name none, free gRPC and HTTP ports, then `more`.
inline std::vector<std::string> server_args(const std::string& rules,
                                            std::vector<std::string> more = {}) {
  std::vector<std::string> a = {env("QUOTA_SERVER"),
                                "--rules",
                                rules,
                                "--default-plan",
                                "free",
                                "--default-route",
                                "read",
                                "--grpc-port",
                                "0",
                                "--http-port",
                                "0"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

}  // namespace quota::testing
