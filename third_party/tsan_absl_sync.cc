// ThreadSanitizer annotations for Debian's Abseil synchronization library,
// linked only into --config=tsan builds (third_party/BUILD).
//
// Debian's libabsl_synchronization.so is not built with -fsanitize=thread,
// so TSan cannot see absl::Mutex, absl::CondVar, absl::Notification or
// absl::BlockingCounter order anything: every access guarded by an
// absl::Mutex would be reported as a race. This file defines those classes'
// lock, unlock, wait and signal functions itself. Each one calls the
// library's own (dlsym RTLD_NEXT) between the __tsan_mutex_* annotations
// Abseil makes when it is built for TSan, so that TSan sees the lock and
// unlock (and, for Notification and BlockingCounter, the release and
// acquire) at the right places. Symbol interposition makes the definitions
// here the ones every caller reaches, including gRPC's locks (grpc_core::Mutex
// wraps absl::Mutex) and the library's calls into itself.
//
// Accesses made inside the library's functions (e.g. a condition evaluated
// while a lock is taken or given back) fall inside the annotations' ignore
// regions, as with an instrumented Abseil. Await and CondVar waits are
// modelled as an unlock followed by a lock (what they do); they assume the
// mutex is held exclusively.

#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

// The library's definition of `symbol` (the next one after this object).
void* Next(const char* symbol) {
  void* f = dlsym(RTLD_NEXT, symbol);
  if (f == nullptr) {
    std::fprintf(stderr, "tsan_absl_sync: %s not found: %s\n", symbol,
                 dlerror());
    std::abort();
  }
  return f;
}

// The library's function `symbol`, of type F, looked up once.
#define NEXT(F, symbol) \
  static const auto next = reinterpret_cast<F>(Next(symbol))

// Wrappers entered on this thread and not yet left. The library calls some
// of the functions defined here itself (e.g. CondVar::WaitWithTimeout calls
// WaitWithDeadline, Notification::Notify locks its mutex): only the
// outermost call is annotated, so that each lock is seen once.
thread_local int depth = 0;

// Marks the wrapper it lives in as entered; outermost() says whether it is
// the first on this thread.
class Entered {
 public:
  Entered() : outermost_(depth++ == 0) {}
  ~Entered() { --depth; }
  Entered(const Entered&) = delete;
  Entered& operator=(const Entered&) = delete;
  bool outermost() const { return outermost_; }

 private:
  const bool outermost_;
};

// Calls the library when an enclosing wrapper annotates already.
#define PASS_THROUGH(...) \
  Entered entered;        \
  if (!entered.outermost()) return next(__VA_ARGS__)

void PreLock(const void* mu, unsigned flags = 0) {
  __tsan_mutex_pre_lock(const_cast<void*>(mu), flags);
}
void PostLock(const void* mu, unsigned flags = 0) {
  __tsan_mutex_post_lock(const_cast<void*>(mu), flags, 0);
}
void PreUnlock(const void* mu, unsigned flags = 0) {
  __tsan_mutex_pre_unlock(const_cast<void*>(mu), flags);
}
void PostUnlock(const void* mu, unsigned flags = 0) {
  __tsan_mutex_post_unlock(const_cast<void*>(mu), flags);
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

Mutex::~Mutex() {
  NEXT(void (*)(Mutex*), "_ZN4absl7debian35MutexD2Ev");
  Entered entered;
  if (entered.outermost()) __tsan_mutex_destroy(this, 0);
  next(this);
}

void Mutex::Lock() {
  NEXT(void (*)(Mutex*), "_ZN4absl7debian35Mutex4LockEv");
  PASS_THROUGH(this);
  PreLock(this);
  next(this);
  PostLock(this);
}

void Mutex::ReaderLock() {
  NEXT(void (*)(Mutex*), "_ZN4absl7debian35Mutex10ReaderLockEv");
  PASS_THROUGH(this);
  PreLock(this, __tsan_mutex_read_lock);
  next(this);
  PostLock(this, __tsan_mutex_read_lock);
}

bool Mutex::TryLock() {
  NEXT(bool (*)(Mutex*), "_ZN4absl7debian35Mutex7TryLockEv");
  PASS_THROUGH(this);
  PreLock(this, __tsan_mutex_try_lock);
  const bool locked = next(this);
  PostLock(this, locked ? __tsan_mutex_try_lock
                        : __tsan_mutex_try_lock | __tsan_mutex_try_lock_failed);
  return locked;
}

bool Mutex::ReaderTryLock() {
  NEXT(bool (*)(Mutex*), "_ZN4absl7debian35Mutex13ReaderTryLockEv");
  PASS_THROUGH(this);
  PreLock(this, __tsan_mutex_try_read_lock);
  const bool locked = next(this);
  PostLock(this, locked ? __tsan_mutex_try_read_lock
                        : __tsan_mutex_try_read_lock_failed);
  return locked;
}

void Mutex::Unlock() {
  NEXT(void (*)(Mutex*), "_ZN4absl7debian35Mutex6UnlockEv");
  PASS_THROUGH(this);
  PreUnlock(this);
  next(this);
  PostUnlock(this);
}

void Mutex::ReaderUnlock() {
  NEXT(void (*)(Mutex*), "_ZN4absl7debian35Mutex12ReaderUnlockEv");
  PASS_THROUGH(this);
  PreUnlock(this, __tsan_mutex_read_lock);
  next(this);
  PostUnlock(this, __tsan_mutex_read_lock);
}

void Mutex::LockWhen(const Condition& cond) {
  NEXT(void (*)(Mutex*, const Condition&),
       "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  PASS_THROUGH(this, cond);
  PreLock(this);
  next(this, cond);
  PostLock(this);
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  NEXT(void (*)(Mutex*, const Condition&),
       "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
  PASS_THROUGH(this, cond);
  PreLock(this, __tsan_mutex_read_lock);
  next(this, cond);
  PostLock(this, __tsan_mutex_read_lock);
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  NEXT(bool (*)(Mutex*, const Condition&, Duration),
       "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_"
       "8DurationE");
  PASS_THROUGH(this, cond, timeout);
  PreLock(this);
  const bool r = next(this, cond, timeout);
  PostLock(this);
  return r;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  NEXT(bool (*)(Mutex*, const Condition&, Time),
       "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_"
       "4TimeE");
  PASS_THROUGH(this, cond, deadline);
  PreLock(this);
  const bool r = next(this, cond, deadline);
  PostLock(this);
  return r;
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, Duration timeout) {
  NEXT(bool (*)(Mutex*, const Condition&, Duration),
       "_ZN4absl7debian35Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_"
       "8DurationE");
  PASS_THROUGH(this, cond, timeout);
  PreLock(this, __tsan_mutex_read_lock);
  const bool r = next(this, cond, timeout);
  PostLock(this, __tsan_mutex_read_lock);
  return r;
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, Time deadline) {
  NEXT(
      bool (*)(Mutex*, const Condition&, Time),
      "_ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_"
      "4TimeE");
  PASS_THROUGH(this, cond, deadline);
  PreLock(this, __tsan_mutex_read_lock);
  const bool r = next(this, cond, deadline);
  PostLock(this, __tsan_mutex_read_lock);
  return r;
}

// Await releases the mutex while it waits and holds it again on return.
void Mutex::Await(const Condition& cond) {
  NEXT(void (*)(Mutex*, const Condition&),
       "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  PASS_THROUGH(this, cond);
  PreUnlock(this);
  next(this, cond);
  PostUnlock(this);
  PreLock(this);
  PostLock(this);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  NEXT(bool (*)(Mutex*, const Condition&, Duration),
       "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_"
       "8DurationE");
  PASS_THROUGH(this, cond, timeout);
  PreUnlock(this);
  const bool r = next(this, cond, timeout);
  PostUnlock(this);
  PreLock(this);
  PostLock(this);
  return r;
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  NEXT(bool (*)(Mutex*, const Condition&, Time),
       "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  PASS_THROUGH(this, cond, deadline);
  PreUnlock(this);
  const bool r = next(this, cond, deadline);
  PostUnlock(this);
  PreLock(this);
  PostLock(this);
  return r;
}

// A condition-variable wait gives `mu` back and takes it again.
void CondVar::Wait(Mutex* mu) {
  NEXT(void (*)(CondVar*, Mutex*),
       "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  PASS_THROUGH(this, mu);
  PreUnlock(mu);
  next(this, mu);
  PostUnlock(mu);
  PreLock(mu);
  PostLock(mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  NEXT(bool (*)(CondVar*, Mutex*, Duration),
       "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  PASS_THROUGH(this, mu, timeout);
  PreUnlock(mu);
  const bool r = next(this, mu, timeout);
  PostUnlock(mu);
  PreLock(mu);
  PostLock(mu);
  return r;
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  NEXT(bool (*)(CondVar*, Mutex*, Time),
       "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  PASS_THROUGH(this, mu, deadline);
  PreUnlock(mu);
  const bool r = next(this, mu, deadline);
  PostUnlock(mu);
  PreLock(mu);
  PostLock(mu);
  return r;
}

// Notification and BlockingCounter publish with atomics inside the library:
// what happened before Notify / DecrementCount happens before the wait
// returns.
void Notification::Notify() {
  NEXT(void (*)(Notification*), "_ZN4absl7debian312Notification6NotifyEv");
  PASS_THROUGH(this);
  __tsan_release(this);
  next(this);
}

void Notification::WaitForNotification() const {
  NEXT(void (*)(const Notification*),
       "_ZNK4absl7debian312Notification19WaitForNotificationEv");
  PASS_THROUGH(this);
  next(this);
  __tsan_acquire(const_cast<Notification*>(this));
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  NEXT(bool (*)(const Notification*, Duration),
       "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_"
       "8DurationE");
  PASS_THROUGH(this, timeout);
  const bool r = next(this, timeout);
  if (r) __tsan_acquire(const_cast<Notification*>(this));
  return r;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  NEXT(bool (*)(const Notification*, Time),
       "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_"
       "4TimeE");
  PASS_THROUGH(this, deadline);
  const bool r = next(this, deadline);
  if (r) __tsan_acquire(const_cast<Notification*>(this));
  return r;
}

bool BlockingCounter::DecrementCount() {
  NEXT(bool (*)(BlockingCounter*),
       "_ZN4absl7debian315BlockingCounter14DecrementCountEv");
  PASS_THROUGH(this);
  __tsan_release(this);
  return next(this);
}

void BlockingCounter::Wait() {
  NEXT(void (*)(BlockingCounter*), "_ZN4absl7debian315BlockingCounter4WaitEv");
  PASS_THROUGH(this);
  next(this);
  __tsan_acquire(this);
}

ABSL_NAMESPACE_END
}  // namespace absl
