#include "common/log_limiter.h"

#include "absl/strings/str_cat.h"

namespace asyncps {

std::optional<uint64_t> LogLimiter::Admit(absl::string_view text,
                                          absl::Time now) {
  absl::MutexLock l(&mu_);
  if (text == last_ && now - logged_ < interval_) {
    ++held_;
    return std::nullopt;
  }
  const uint64_t held = text == last_ ? held_ : 0;
  last_ = std::string(text);
  logged_ = now;
  held_ = 0;
  return held;
}

void LogLimiter::Reset() {
  absl::MutexLock l(&mu_);
  last_.clear();
  logged_ = absl::InfinitePast();
  held_ = 0;
}

std::string LogLimiter::HeldBack(uint64_t held) {
  if (held == 0) return std::string();
  return absl::StrCat(" (", held, " more like it since the last one shown)");
}

}  // namespace asyncps
