// benchmarks/support/callgrind_server.hpp — a redis-server under valgrind's callgrind,
// for counting the instructions the server executes (redis_instructions_bench).
//
// `CallgrindServer` starts a ScratchServer (tests/redis/support/redis_server.hpp) with
// valgrind as its wrapper, collecting only inside `processInputBuffer` (reading a request,
// running the command or script, building the reply); `control("-z")` zeroes the count,
// `instructions()` dumps it and reads the dump's total (-1 on failure); `keep_dump` copies
// the latest dump elsewhere (for callgrind_annotate). The count does not depend on the
// machine's load. Thread safety: one thread drives a server.
//
//   CallgrindServer server(dir);
//   server.control("-z");  // ... requests ...
//   long long ir = server.instructions();
#pragma once

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "redis/support/redis_server.hpp"

namespace quota::bench {

// Copies the server's latest dump (written by instructions()) to `to`: a row's profile,
// for callgrind_annotate.
inline void keep_dump(const std::filesystem::path& dir, const std::filesystem::path& to) {
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("callgrind.out.", 0) == 0) {
      std::filesystem::copy_file(e.path(), to, std::filesystem::copy_options::overwrite_existing);
    }
  }
}

// A redis-server under callgrind (a ScratchServer with valgrind as its wrapper), which
// writes its dumps to the server's directory `dir`.
struct CallgrindServer {
  explicit CallgrindServer(const std::string& dir)
      : server(dir,
               "valgrind --tool=callgrind --toggle-collect=processInputBuffer "
               "--callgrind-out-file=" +
                   dir + "/callgrind.out.%p") {}

  quota::testing::ScratchServer server;

  bool started() const { return server.started() && server.pid() > 0; }
  int port() const { return server.port(); }

  bool control(const char* what) const {
    const std::string cmd = "callgrind_control " + std::string(what) + " " +
                            std::to_string(server.pid()) + " >/dev/null 2>&1";
    return std::system(cmd.c_str()) == 0;
  }

  // Instructions counted since the last zero: dumps them and reads the dump's total.
  long long instructions() const {
    for (const auto& e : std::filesystem::directory_iterator(server.dir())) {
      if (e.path().filename().string().rfind("callgrind.out.", 0) == 0) {
        std::filesystem::remove(e.path());
      }
    }
    if (!control("-d")) return -1;
    for (const auto& e : std::filesystem::directory_iterator(server.dir())) {
      if (e.path().filename().string().rfind("callgrind.out.", 0) != 0) continue;
      std::ifstream in(e.path());
      std::string line;
      while (std::getline(in, line)) {
        for (const char* head : {"summary: ", "totals: "}) {
          if (line.rfind(head, 0) == 0) return std::atoll(line.c_str() + std::strlen(head));
        }
      }
    }
    return -1;
  }
};

}  // namespace quota::bench
