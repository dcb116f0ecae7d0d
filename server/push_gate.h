#ifndef ASYNCPS_SERVER_PUSH_GATE_H_
#define ASYNCPS_SERVER_PUSH_GATE_H_

#include <array>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace asyncps {

// Lets pushes be applied in parallel, and lets a checkpoint wait until no
// push is being applied and hold new ones back while it copies the shard's
// state, so that the copy is a consistent cut (every push in it whole or
// not at all, and the de-duplication records agreeing with the values).
//
// A push holds one of several reader locks, picked by its worker id, so
// that pushes of different workers share no lock word; a checkpoint takes
// all of them exclusively. The stripes guard no data of their own (the lock
// annotations have nothing to check). Thread-safe.
class PushGate {
 public:
  static constexpr int kStripes = 16;

  // Held by a push while it is checked and applied.
  class Pass {
   public:
    Pass(PushGate* gate, int32_t worker_id) ABSL_NO_THREAD_SAFETY_ANALYSIS
        : mu_(&gate->stripes_[static_cast<uint32_t>(worker_id) % kStripes].mu) {
      mu_->ReaderLock();
    }
    ~Pass() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_->ReaderUnlock(); }
    Pass(const Pass&) = delete;
    Pass& operator=(const Pass&) = delete;

   private:
    absl::Mutex* const mu_;
  };

  // Held by a checkpoint while it copies the state: no push is in between
  // its checks and its last slice.
  class Closed {
   public:
    explicit Closed(PushGate* gate) ABSL_NO_THREAD_SAFETY_ANALYSIS
        : gate_(gate) {
      for (Stripe& s : gate_->stripes_) s.mu.Lock();
    }
    ~Closed() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      for (Stripe& s : gate_->stripes_) s.mu.Unlock();
    }
    Closed(const Closed&) = delete;
    Closed& operator=(const Closed&) = delete;

   private:
    PushGate* const gate_;
  };

 private:
  struct alignas(64) Stripe {
    absl::Mutex mu;
  };
  std::array<Stripe, kStripes> stripes_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_PUSH_GATE_H_
