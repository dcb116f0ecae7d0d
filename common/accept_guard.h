#ifndef ASYNCPS_COMMON_ACCEPT_GUARD_H_
#define ASYNCPS_COMMON_ACCEPT_GUARD_H_

// Keeps a flood of connections from taking a server's listening ports down
// for good. gRPC (1.51) stops accepting on a port forever after one
// accept4() fails with EMFILE (grpc/grpc#16058, #20418): 24,000 idle TCP
// connections to a shard at a limit of 20,000 open files left it
// unreachable long after they closed. And connections that take every
// file descriptor leave none for checkpoints, etcd or a backup's stream.
//
// This library defines accept4() for the process (the symbol gRPC's
// listeners call, ahead of libc's): an accepted connection whose
// descriptor would fall among the top `reserve` descriptors of the limit
// is closed at once (so those stay free for the process's own files and
// connections), and an EMFILE/ENFILE sheds the waiting connections and
// reports EAGAIN, after which gRPC waits for the next connection instead
// of giving up the port. Link it into servers only (alwayslink).

#include <cstdint>

namespace asyncps {

struct AcceptGuardReport {
  uint64_t soft_limit = 0;  // RLIMIT_NOFILE after raising it
  uint64_t hard_limit = 0;
  int ceiling = 0;  // accepted descriptors at or above it are closed
};

// Raises the soft open-files limit to the hard one and turns the guard on,
// keeping the top `reserve` descriptors for the process itself. Before
// this, accept4() behaves as libc's.
AcceptGuardReport GuardAccepts(int reserve = 64);

// Connections closed unserved so far (over the ceiling, or shed on
// EMFILE).
uint64_t ConnectionsShed();

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_ACCEPT_GUARD_H_
