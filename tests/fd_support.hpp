#pragma once
// Raw descriptors for the I/O tests: pipes, socket pairs and a regular file,
// all non-blocking and close-on-exec, owned by the test.

#include "catch.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace spindle::test {

struct fd_pair {
    int a = -1;
    int b = -1;
};

inline fd_pair make_pipe() {
    int fds[2];
    REQUIRE(::pipe2(fds, O_NONBLOCK | O_CLOEXEC) == 0);
    return {fds[0], fds[1]};
}

inline fd_pair make_socketpair() {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) == 0);
    return {fds[0], fds[1]};
}

/// A regular file (epoll refuses those with EPERM), already unlinked.
inline int regular_file() {
    std::string path = "/tmp/spindle-test-XXXXXX";
    int fd = ::mkostemp(path.data(), O_CLOEXEC);
    REQUIRE(fd >= 0);
    ::unlink(path.c_str());
    return fd;
}

/// A non-blocking TCP listener on 127.0.0.1 with an ephemeral port.
inline int tcp_listener(::sockaddr_in& addr) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    REQUIRE(::bind(fd, reinterpret_cast<const ::sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(fd, SOMAXCONN) == 0);
    ::socklen_t len = sizeof addr;
    REQUIRE(::getsockname(fd, reinterpret_cast<::sockaddr*>(&addr), &len) == 0);
    REQUIRE(addr.sin_port != 0);
    return fd;
}

}  // namespace spindle::test
