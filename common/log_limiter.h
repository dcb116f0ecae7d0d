#ifndef ASYNCPS_COMMON_LOG_LIMITER_H_
#define ASYNCPS_COMMON_LOG_LIMITER_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace asyncps {

// Keeps a line that a loop would print on every turn (a failure that lasts:
// etcd refusing writes, refused TLS handshakes) to one per interval. A line
// is due the first time, whenever its text differs from the last one
// admitted, and otherwise once `interval` has passed since the last one
// admitted. Thread-safe.
//
//   LogLimiter limiter(absl::Seconds(10));
//   if (std::optional<uint64_t> held = limiter.Admit(text, Now())) {
//     logger->warn("{}{}", text, LogLimiter::HeldBack(*held));
//   }
class LogLimiter {
 public:
  explicit LogLimiter(absl::Duration interval) : interval_(interval) {}

  // Whether `text` is to be logged at `now` (a monotonic time); if so, how
  // many lines were held back since the last one admitted.
  std::optional<uint64_t> Admit(absl::string_view text, absl::Time now);

  // The condition ended: the next line is due at once, whatever its text.
  void Reset();

  // " (N more like it since the last one shown)", or "" for 0.
  static std::string HeldBack(uint64_t held);

 private:
  const absl::Duration interval_;
  absl::Mutex mu_;
  std::string last_ ABSL_GUARDED_BY(mu_);
  absl::Time logged_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t held_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_LOG_LIMITER_H_
