// ThreadSanitizer support for Debian's uninstrumented libraries, linked into the binaries of
// --config=tsan only.
//
// Abseil: under -fsanitize=thread the happens-before edges of its locks are invisible, so every
// access guarded by an absl::Mutex would read as a data race. This file defines the library's lock
// and wait entry points under their mangled names, which the dynamic linker prefers to the
// library's own: each calls the real function (the next definition, RTLD_NEXT) and tells
// ThreadSanitizer what it did: an unlock is a release on the mutex's address, a lock an acquire, a
// wait both. A Condition is evaluated inside the library with the lock held, by the waiter or by
// the thread that unlocks, so it is wrapped to acquire before and release after.
//
// gRPC: its own synchronization (atomics inside the library) is invisible too, so reports through
// it are suppressed (__tsan_default_suppressions at the end).
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

// The mangled names below are those of Debian 12's Abseil (inline namespace debian3).
static_assert(std::is_same_v<absl::Mutex, absl::debian3::Mutex>,
              "update the mangled names for this Abseil");

namespace {

using absl::Condition;
using absl::CondVar;
using absl::Duration;
using absl::Mutex;
using absl::Notification;
using absl::Time;

template <typename Function>
Function Real(const char* name) {
  void* function = dlsym(RTLD_NEXT, name);
  if (function == nullptr) {
    std::fprintf(stderr, "absl_tsan: %s not found: %s\n", name, dlerror());
    std::abort();
  }
  return reinterpret_cast<Function>(function);
}

void Acquire(const void* address) { __tsan_acquire(const_cast<void*>(address)); }
void Release(const void* address) { __tsan_release(const_cast<void*>(address)); }

// `condition`, evaluated as a holder of `mu` (the waiting thread or the one unlocking `mu`). The
// constructor releases `mu`: whoever evaluates the condition sees it (and the caller's writes).
class HeldCondition {
 public:
  HeldCondition(const Condition& condition, const Mutex* mu)
      : condition_(&condition), mu_(mu), wrapped_(&HeldCondition::Eval, this) {
    Release(mu_);
  }
  const Condition& get() const { return wrapped_; }

 private:
  static bool Eval(void* self) {
    const HeldCondition& held = *static_cast<HeldCondition*>(self);
    Acquire(held.mu_);
    const bool met = held.condition_->Eval();
    Release(held.mu_);
    return met;
  }

  const Condition* const condition_;
  const Mutex* const mu_;
  const Condition wrapped_;
};

}  // namespace

// Each definition below replaces the library's function of that mangled name.
#define K3_REAL(type, mangled) static const auto real = Real<type>(mangled)

// Locks: an acquire once held.
extern "C" void K3TsanLock(Mutex* mu) __asm__("_ZN4absl7debian35Mutex4LockEv");
extern "C" void K3TsanLock(Mutex* mu) {
  K3_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex4LockEv");
  real(mu);
  Acquire(mu);
}

extern "C" void K3TsanReaderLock(Mutex* mu) __asm__("_ZN4absl7debian35Mutex10ReaderLockEv");
extern "C" void K3TsanReaderLock(Mutex* mu) {
  K3_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex10ReaderLockEv");
  real(mu);
  Acquire(mu);
}

extern "C" bool K3TsanTryLock(Mutex* mu) __asm__("_ZN4absl7debian35Mutex7TryLockEv");
extern "C" bool K3TsanTryLock(Mutex* mu) {
  K3_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex7TryLockEv");
  const bool locked = real(mu);
  if (locked) Acquire(mu);
  return locked;
}

extern "C" bool K3TsanReaderTryLock(Mutex* mu) __asm__("_ZN4absl7debian35Mutex13ReaderTryLockEv");
extern "C" bool K3TsanReaderTryLock(Mutex* mu) {
  K3_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex13ReaderTryLockEv");
  const bool locked = real(mu);
  if (locked) Acquire(mu);
  return locked;
}

extern "C" void K3TsanLockWhen(Mutex* mu, const Condition& c) __asm__(
    "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
extern "C" void K3TsanLockWhen(Mutex* mu, const Condition& c) {
  K3_REAL(void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  const HeldCondition held(c, mu);
  real(mu, held.get());
  Acquire(mu);
}

extern "C" void K3TsanReaderLockWhen(Mutex* mu, const Condition& c) __asm__(
    "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
extern "C" void K3TsanReaderLockWhen(Mutex* mu, const Condition& c) {
  K3_REAL(void (*)(Mutex*, const Condition&),
          "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
  const HeldCondition held(c, mu);
  real(mu, held.get());
  Acquire(mu);
}

// The timed LockWhens hold the lock whatever they return.
extern "C" bool K3TsanLockWhenWithTimeout(Mutex* mu, const Condition& c, Duration d) __asm__(
    "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
extern "C" bool K3TsanLockWhenWithTimeout(Mutex* mu, const Condition& c, Duration d) {
  K3_REAL(bool (*)(Mutex*, const Condition&, Duration),
          "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  const HeldCondition held(c, mu);
  const bool met = real(mu, held.get(), d);
  Acquire(mu);
  return met;
}

extern "C" bool K3TsanLockWhenWithDeadline(Mutex* mu, const Condition& c, Time t) __asm__(
    "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
extern "C" bool K3TsanLockWhenWithDeadline(Mutex* mu, const Condition& c, Time t) {
  K3_REAL(bool (*)(Mutex*, const Condition&, Time),
          "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  const HeldCondition held(c, mu);
  const bool met = real(mu, held.get(), t);
  Acquire(mu);
  return met;
}

extern "C" bool K3TsanReaderLockWhenWithTimeout(Mutex* mu, const Condition& c, Duration d) __asm__(
    "_ZN4absl7debian35Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
extern "C" bool K3TsanReaderLockWhenWithTimeout(Mutex* mu, const Condition& c, Duration d) {
  K3_REAL(bool (*)(Mutex*, const Condition&, Duration),
          "_ZN4absl7debian35Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  const HeldCondition held(c, mu);
  const bool met = real(mu, held.get(), d);
  Acquire(mu);
  return met;
}

extern "C" bool K3TsanReaderLockWhenWithDeadline(Mutex* mu, const Condition& c, Time t) __asm__(
    "_ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
extern "C" bool K3TsanReaderLockWhenWithDeadline(Mutex* mu, const Condition& c, Time t) {
  K3_REAL(bool (*)(Mutex*, const Condition&, Time),
          "_ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  const HeldCondition held(c, mu);
  const bool met = real(mu, held.get(), t);
  Acquire(mu);
  return met;
}

// Unlocks: a release while still held.
extern "C" void K3TsanUnlock(Mutex* mu) __asm__("_ZN4absl7debian35Mutex6UnlockEv");
extern "C" void K3TsanUnlock(Mutex* mu) {
  K3_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex6UnlockEv");
  Release(mu);
  real(mu);
}

extern "C" void K3TsanReaderUnlock(Mutex* mu) __asm__("_ZN4absl7debian35Mutex12ReaderUnlockEv");
extern "C" void K3TsanReaderUnlock(Mutex* mu) {
  K3_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex12ReaderUnlockEv");
  Release(mu);
  real(mu);
}

// Waits release the mutex and hold it again when they return.
extern "C" void K3TsanAwait(Mutex* mu, const Condition& c) __asm__(
    "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
extern "C" void K3TsanAwait(Mutex* mu, const Condition& c) {
  K3_REAL(void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  const HeldCondition held(c, mu);
  real(mu, held.get());
  Acquire(mu);
}

extern "C" bool K3TsanAwaitWithTimeout(Mutex* mu, const Condition& c, Duration d) __asm__(
    "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
extern "C" bool K3TsanAwaitWithTimeout(Mutex* mu, const Condition& c, Duration d) {
  K3_REAL(bool (*)(Mutex*, const Condition&, Duration),
          "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  const HeldCondition held(c, mu);
  const bool met = real(mu, held.get(), d);
  Acquire(mu);
  return met;
}

extern "C" bool K3TsanAwaitWithDeadline(Mutex* mu, const Condition& c, Time t) __asm__(
    "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
extern "C" bool K3TsanAwaitWithDeadline(Mutex* mu, const Condition& c, Time t) {
  K3_REAL(bool (*)(Mutex*, const Condition&, Time),
          "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  const HeldCondition held(c, mu);
  const bool met = real(mu, held.get(), t);
  Acquire(mu);
  return met;
}

extern "C" void K3TsanCondVarWait(CondVar* cv, Mutex* mu) __asm__(
    "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
extern "C" void K3TsanCondVarWait(CondVar* cv, Mutex* mu) {
  K3_REAL(void (*)(CondVar*, Mutex*), "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  Release(mu);
  real(cv, mu);
  Acquire(mu);
}

extern "C" bool K3TsanCondVarWaitWithTimeout(CondVar* cv, Mutex* mu, Duration d) __asm__(
    "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
extern "C" bool K3TsanCondVarWaitWithTimeout(CondVar* cv, Mutex* mu, Duration d) {
  K3_REAL(bool (*)(CondVar*, Mutex*, Duration),
          "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  Release(mu);
  const bool timed_out = real(cv, mu, d);
  Acquire(mu);
  return timed_out;
}

extern "C" bool K3TsanCondVarWaitWithDeadline(CondVar* cv, Mutex* mu, Time t) __asm__(
    "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
extern "C" bool K3TsanCondVarWaitWithDeadline(CondVar* cv, Mutex* mu, Time t) {
  K3_REAL(bool (*)(CondVar*, Mutex*, Time),
          "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Release(mu);
  const bool timed_out = real(cv, mu, t);
  Acquire(mu);
  return timed_out;
}

// Notify happens before the waits that see it.
extern "C" void K3TsanNotify(Notification* n) __asm__("_ZN4absl7debian312Notification6NotifyEv");
extern "C" void K3TsanNotify(Notification* n) {
  K3_REAL(void (*)(Notification*), "_ZN4absl7debian312Notification6NotifyEv");
  Release(n);
  real(n);
}

extern "C" void K3TsanWaitForNotification(const Notification* n) __asm__(
    "_ZNK4absl7debian312Notification19WaitForNotificationEv");
extern "C" void K3TsanWaitForNotification(const Notification* n) {
  K3_REAL(void (*)(const Notification*), "_ZNK4absl7debian312Notification19WaitForNotificationEv");
  real(n);
  Acquire(n);
}

extern "C" bool K3TsanWaitForNotificationWithTimeout(const Notification* n, Duration d) __asm__(
    "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
extern "C" bool K3TsanWaitForNotificationWithTimeout(const Notification* n, Duration d) {
  K3_REAL(bool (*)(const Notification*, Duration),
          "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool notified = real(n, d);
  if (notified) Acquire(n);
  return notified;
}

extern "C" bool K3TsanWaitForNotificationWithDeadline(const Notification* n, Time t) __asm__(
    "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
extern "C" bool K3TsanWaitForNotificationWithDeadline(const Notification* n, Time t) {
  K3_REAL(bool (*)(const Notification*, Time),
          "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool notified = real(n, t);
  if (notified) Acquire(n);
  return notified;
}

// Suppressions compiled in, so that no test needs a file: reports with a frame in gRPC (whose
// synchronization is atomics that ThreadSanitizer cannot see: its executor threads, the frees and
// copies inside it), in the absl::Status and Cord code gRPC's threads run (an uninstrumented
// caller leaves no frames of its own) or in Abseil's deadlock-detection graph. Races between our
// own threads stay reported; races on gRPC's callback threads do not (a limit of an
// uninstrumented gRPC). Threads gRPC starts itself (its resolver executor) are joined by its own
// shutdown, which may still run when the process exits: not our leak to report.
extern "C" const char* __tsan_default_suppressions() {
  return "race:libgrpc.so\n"
         "race:libgrpc++.so\n"
         "race:libgpr.so\n"
         "race:libupb.so\n"
         "race:libabsl_status.so\n"
         "race:libabsl_cord.so\n"
         "race:libabsl_graphcycles_internal.so\n"
         "thread:libgpr.so\n";
}
