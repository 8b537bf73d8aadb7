/*
 * tvm-rtask native runtime: CPU step-array primitives.
 *
 * A step array holds one int32 counter per vEU (virtual execution unit): the number of
 * rTasks that vEU has finished.  A producer publishes progress with a release store
 * (tvm_rtask_cpu_signal); a consumer waits with acquire loads until the counter reaches a
 * target (tvm_rtask_cpu_wait).  Every wait is bounded: on timeout it records the failure in
 * a shared status array and returns 1 instead of hanging, and every later wait that sees a
 * recorded failure returns 1 at once, so the whole persistent program drains quickly.
 *
 * Status array layout (int32[5], zero-initialised by the host before a launch):
 *   status[0]  0 = ok, non-zero = failure (1 = barrier timeout); set by compare-exchange,
 *              so only the first failure records its details
 *   status[1]  the waiting vEU
 *   status[2]  the vEU it waited for
 *   status[3]  the step value it waited for (target)
 *   status[4]  the step value it saw last
 * status[1..4] are written after status[0] is claimed: read them after the launch has
 * joined, not while other threads may still be running.
 *
 * These functions are called from TVM-generated code via T.call_extern, so their names and
 * signatures are part of the contract with tvm_rtask.tir.  No dependency on TVM headers.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#if defined(__GNUC__)
#define RTASK_EXPORT __attribute__((visibility("default")))
#else
#define RTASK_EXPORT
#endif

#ifndef TVM_RTASK_RUNTIME_VERSION
#define TVM_RTASK_RUNTIME_VERSION "0.0.0"
#endif

/* Backoff schedule: pause-spin, then yield, then sleep with exponential growth. */
enum {
  kPauseIters = 512,    /* iterations of a CPU pause before yielding */
  kYieldIters = 64,     /* sched_yield calls before sleeping */
  kClockEvery = 64,     /* during the pause phase, read the clock every this many iterations */
};
static const long kSleepMinNs = 1000L;    /* first nanosleep: 1 us */
static const long kSleepMaxNs = 200000L;  /* nanosleep grows up to 200 us */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield" ::: "memory");
#else
  __asm__ __volatile__("" ::: "memory");
#endif
}

static inline int64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000LL + (int64_t)(ts.tv_nsec / 1000L);
}

static inline int32_t load_acquire(const int32_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

static inline int status_failed(int32_t* status) {
  return status != NULL && load_acquire(&status[0]) != 0;
}

static void sleep_ns(long ns) {
  struct timespec req = {0, ns};
  struct timespec rem;
  while (nanosleep(&req, &rem) != 0 && errno == EINTR) req = rem;
}

/* Record a barrier timeout; only the first failure (status[0]: 0 -> 1) records and prints. */
static void report_timeout(int32_t* status, int32_t waiter_veu, int32_t target_veu,
                           int32_t target, int32_t seen, int64_t waited_us) {
  if (status != NULL) {
    int32_t expected = 0;
    if (!__atomic_compare_exchange_n(&status[0], &expected, 1, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
      return; /* another failure was recorded first */
    }
    __atomic_store_n(&status[1], waiter_veu, __ATOMIC_RELAXED);
    __atomic_store_n(&status[2], target_veu, __ATOMIC_RELAXED);
    __atomic_store_n(&status[3], target, __ATOMIC_RELAXED);
    __atomic_store_n(&status[4], seen, __ATOMIC_RELEASE);
  }
  fprintf(stderr,
          "tvm_rtask: barrier timeout: vEU %d waited %lld us for vEU %d to reach step %d "
          "(step seen: %d)\n",
          (int)waiter_veu, (long long)waited_us, (int)target_veu, (int)target, (int)seen);
  fflush(stderr);
}

RTASK_EXPORT int32_t tvm_rtask_cpu_signal(int32_t* step, int32_t value) {
  __atomic_store_n(step, value, __ATOMIC_RELEASE);
  return 0;
}

RTASK_EXPORT int32_t tvm_rtask_cpu_status_ok(int32_t* status) {
  return status_failed(status) ? 0 : 1;
}

/*
 * Wait until *step >= target (acquire).  Returns 0 on success, 1 when a failure is (or
 * becomes) recorded in status or when timeout_us of wall time (CLOCK_MONOTONIC) pass.
 * timeout_us <= 0 means "do not wait": fail unless the target is already reached.
 */
RTASK_EXPORT int32_t tvm_rtask_cpu_wait(int32_t* step, int32_t target, int32_t* status,
                                        int64_t timeout_us, int32_t waiter_veu,
                                        int32_t target_veu) {
  if (status_failed(status)) return 1;
  int32_t seen = load_acquire(step);
  if (seen >= target) return 0;

  if (timeout_us <= 0) {
    report_timeout(status, waiter_veu, target_veu, target, seen, 0);
    return 1;
  }

  const int64_t start = now_us();
  long sleep = kSleepMinNs;
  uint32_t iter = 0;
  for (;;) {
    if (iter < kPauseIters) {
      cpu_relax();
    } else if (iter < kPauseIters + kYieldIters) {
      sched_yield();
    } else {
      sleep_ns(sleep);
      sleep = sleep * 2 > kSleepMaxNs ? kSleepMaxNs : sleep * 2;
    }
    if (iter < 0xFFFFFFFFu) ++iter;

    seen = load_acquire(step);
    if (seen >= target) return 0;
    if (status_failed(status)) return 1;

    if (iter >= kPauseIters || iter % kClockEvery == 0) {
      int64_t waited = now_us() - start;
      if (waited >= timeout_us) {
        seen = load_acquire(step); /* last look before giving up */
        if (seen >= target) return 0;
        report_timeout(status, waiter_veu, target_veu, target, seen, waited);
        return 1;
      }
    }
  }
}

RTASK_EXPORT const char* tvm_rtask_runtime_version(void) { return TVM_RTASK_RUNTIME_VERSION; }
