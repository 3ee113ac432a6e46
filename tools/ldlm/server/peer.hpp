// ldlm serve: whether the client of a request that is not streamed has gone away.
//
// Why this exists: a streamed request notices a gone client when a write fails, but a
// plain JSON answer is written once, at the end, and httplib 0.11.4 gives its handler
// neither the connection's socket nor an is_connection_closed(). The Request does carry
// the connection's two ends (remote_addr/port, local_addr/port), and a TCP connection is
// the only open socket with that pair of ends: so the socket is found by scanning this
// process's descriptors (/proc/self/fd) for the one whose getpeername/getsockname match.
// That is Linux only; elsewhere gone() is always false (the request then runs until it
// ends or its --timeout passes, as before).
//
// The descriptor cannot be closed and reused under us while the handler runs: httplib
// closes a connection's socket on the thread that runs its handler, after the handler
// returns. Its two ends are still checked again at every poll, so that a wrong guess can
// only make gone() false.
//
// Gone means the peer shut its side (POLLRDHUP: a FIN, even behind unread bytes) or the
// connection broke (POLLHUP, POLLERR). Bytes that are merely readable (a client that
// pipelines its next request) do not count. A client that half-closes after sending its
// request (shutdown(SHUT_WR)) counts as gone; HTTP clients do not do that.
#pragma once

#include <httplib.h>

#include <string>

#ifdef __linux__
#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#endif

namespace ldlm::server {

class PeerWatch {
 public:
  explicit PeerWatch(const httplib::Request& req)
      : remote_addr_(req.remote_addr),
        local_addr_(req.local_addr),
        remote_port_(req.remote_port),
        local_port_(req.local_port) {}

  /// Whether the client has closed the connection (or it broke). Cheap after the first
  /// call: two address look-ups and a poll.
  bool gone() {
#ifdef __linux__
    if (!searched_) {
      fd_ = find();
      searched_ = true;
    }
    if (fd_ < 0 || !matches(fd_)) return false;
    pollfd p{fd_, POLLRDHUP, 0};
    if (::poll(&p, 1, 0) != 1) return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
#else
    return false;
#endif
  }

 private:
#ifdef __linux__
  /// The address and port of one end, as httplib writes them (numeric host).
  static bool end_is(const sockaddr_storage& addr, socklen_t len, const std::string& host, int port) {
    char host_text[NI_MAXHOST], port_text[NI_MAXSERV];
    if (::getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host_text, sizeof host_text, port_text,
                      sizeof port_text, NI_NUMERICHOST | NI_NUMERICSERV) != 0)
      return false;
    return std::atoi(port_text) == port && host == host_text;
  }

  bool matches(int fd) const {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
        !end_is(addr, len, remote_addr_, remote_port_))
      return false;
    len = sizeof addr;
    return ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0 &&
           end_is(addr, len, local_addr_, local_port_);
  }

  /// The descriptor of this request's connection, or -1.
  int find() const {
    if (remote_port_ < 0 || local_port_ < 0) return -1;
    DIR* dir = ::opendir("/proc/self/fd");
    if (!dir) return -1;
    int found = -1;
    while (const dirent* entry = ::readdir(dir)) {
      char* end = nullptr;
      const long fd = std::strtol(entry->d_name, &end, 10);
      if (end == entry->d_name || *end != '\0' || fd == ::dirfd(dir)) continue;
      if (matches(static_cast<int>(fd))) {
        found = static_cast<int>(fd);
        break;
      }
    }
    ::closedir(dir);
    return found;
  }
#endif

  std::string remote_addr_, local_addr_;
  int remote_port_, local_port_;
  int fd_ = -1;
  bool searched_ = false;
};

}  // namespace ldlm::server
