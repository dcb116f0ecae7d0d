#ifndef ASYNCPS_COMMON_NO_SIGPIPE_H_
#define ASYNCPS_COMMON_NO_SIGPIPE_H_

#include <signal.h>

namespace asyncps {

// Holds SIGPIPE off the calling thread while it lives, for code that writes
// to sockets a peer may have closed through a library that uses write(2)
// (OpenSSL), and discards one raised meanwhile (unless one was pending
// before); the process's signal handling stays as it was.
class NoSigpipe {
 public:
  NoSigpipe();
  ~NoSigpipe();
  NoSigpipe(const NoSigpipe&) = delete;
  NoSigpipe& operator=(const NoSigpipe&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
  bool was_pending_ = false;
};

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_NO_SIGPIPE_H_
