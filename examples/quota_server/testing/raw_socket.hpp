// examples/quota_server/testing/raw_socket.hpp — plain TCP sockets to a server on
// loopback, for tests and benchmarks that must send what no HTTP client would: half a
// request, a body slower than its declared length, a connection that never sends.
//
// connect_to(port, timeout) is a connected socket (reads time out after `timeout`), -1
// when refused; send_all(fd, bytes) sends everything or says it could not. The caller
// closes the socket.
//
// Thread safety: plain functions; a socket belongs to its caller.
//
//   const int fd = quota::testing::connect_to(port);
//   quota::testing::send_all(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace quota::testing {

inline int connect_to(int port,
                      std::chrono::milliseconds timeout = std::chrono::milliseconds(3000)) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

inline bool send_all(int fd, const std::string& s) {
  return send(fd, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size());
}

}  // namespace quota::testing
