#include "common/no_sigpipe.h"

#include <pthread.h>
#include <time.h>

namespace asyncps {

NoSigpipe::NoSigpipe() {
  sigemptyset(&pipe_);
  sigaddset(&pipe_, SIGPIPE);
  sigset_t pending;
  sigpending(&pending);
  was_pending_ = sigismember(&pending, SIGPIPE) == 1;
  pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
}

NoSigpipe::~NoSigpipe() {
  if (!was_pending_) {
    const timespec zero = {0, 0};
    while (sigtimedwait(&pipe_, nullptr, &zero) == SIGPIPE) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old_, nullptr);
}

}  // namespace asyncps
