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
 * signatures are part of the contract with tvm_rtask.tir.  No dependency on TVM headers:
 * tvm_rtask_cpu_ensure_workers finds the few tvm-ffi C functions it calls at run time
 * (dlsym(RTLD_DEFAULT, ...)), through the mirrors of their C ABI declared below.
 */
#define _GNU_SOURCE

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "rtask_export.h"

#ifndef TVM_RTASK_RUNTIME_VERSION
#define TVM_RTASK_RUNTIME_VERSION "0.0.0"
#endif

/* Backoff schedule: pause-spin, then yield, then sleep with exponential growth.  The phases
 * are measured in wall time: every vEU has a core of its own (num_veu never exceeds the
 * workers that can run at once), and the waits between operators of a model are tens to
 * hundreds of microseconds.  A spin of 512 pauses (about 25 us on a core whose pause takes
 * 140 cycles) fell through to nanosleep, which sleeps at least the timer slack (50 us): 108
 * barriers made MobileNet v2 2.5 ms slower under wavefront than sequential. */
enum {
  kClockEvery = 64, /* read the clock every this many iterations of a phase */
};
static const int64_t kSpinUs = 2000;    /* pause-spin for the first 2 ms of a wait */
static const int64_t kYieldUs = 20000;  /* then sched_yield until 20 ms */
static const long kSleepMinNs = 1000L;  /* then nanosleep from 1 us ... */
static const long kSleepMaxNs = 200000L; /* ... growing up to 200 us */

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

/*
 * Nothing, seen from the caller: LLVM cannot look inside, so it must assume the call reads and
 * writes *workspace.  The CPU dispatcher calls it between two rKernel runs that nothing else
 * separates (one vEU): without it the workspace never escapes the persistent kernel, the
 * inlined bodies' per-buffer alias metadata says a producer's stores and the consumer's loads
 * do not alias, and LLVM folds the consumer's loads to the uninitialised workspace
 * (docs/findings.md, "Unwritten memory").
 */
RTASK_EXPORT int32_t tvm_rtask_cpu_publish(void* workspace) {
  __asm__ __volatile__("" : : "r"(workspace) : "memory");
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
  int64_t waited = 0;
  uint32_t iter = 0;
  for (;;) {
    if (waited < kSpinUs) {
      cpu_relax();
    } else if (waited < kYieldUs) {
      sched_yield();
    } else {
      sleep_ns(sleep);
      sleep = sleep * 2 > kSleepMaxNs ? kSleepMaxNs : sleep * 2;
    }
    ++iter;

    seen = load_acquire(step);
    if (seen >= target) return 0;
    if (status_failed(status)) return 1;

    if (waited >= kSpinUs || iter % kClockEvery == 0) {
      waited = now_us() - start;
      if (waited >= timeout_us) {
        seen = load_acquire(step); /* last look before giving up */
        if (seen >= target) return 0;
        report_timeout(status, waiter_veu, target_veu, target, seen, waited);
        return 1;
      }
    }
  }
}

/* ---------------------------------------------------------------------------------------
 * The calling thread's TVM CPU thread pool (see tvm_rtask/backend/cpu/threads.py).
 *
 * TVM's pool is thread-local and its size is fixed when it is created, at the first
 * parallel work in a thread, from the thread's "max concurrency" (TVM_NUM_THREADS, else
 * hardware_concurrency()/2 on x86: 1 on a 2-core machine).  A fine-barrier dispatcher needs
 * one worker per vEU: with fewer, TVM runs several vEUs one after another on one thread and a
 * vEU waits for one that runs later on its own thread.  The dispatcher therefore calls
 * tvm_rtask_cpu_ensure_workers(num_veu) before its parallel launch, in whatever thread calls
 * the compiled function (a Python thread, a C++ deployment of an exported library).
 *
 * TVM is reached through its global functions "runtime.config_threadpool",
 * "runtime.NumThreads" and "ffi.Array" (tvm-ffi C API: TVMFFIFunctionGetGlobal,
 * TVMFFIFunctionCall, TVMFFIObjectDecRef, TVMFFIErrorMoveFromRaised), as
 * tvm_rtask.runtime.set_num_threads does from Python.
 * ------------------------------------------------------------------------------------- */

/* Mirrors of tvm/ffi/c_api.h (tvm-ffi's stable C ABI): TVMFFIAny, TVMFFIByteArray. */
typedef struct {
  int32_t type_index;
  uint32_t zero_padding;
  union {
    int64_t v_int64;
    const char* v_c_str;
    void* v_obj;
  };
} rtask_ffi_any;
typedef struct {
  const char* data;
  size_t size;
} rtask_ffi_bytes;
enum {
  kFFINone = 0,            /* kTVMFFINone */
  kFFIInt = 1,             /* kTVMFFIInt */
  kFFIRawStr = 8,          /* kTVMFFIRawStr: a '\0'-terminated char*, argument only */
  kFFIObjectBegin = 64,    /* kTVMFFIStaticObjectBegin: reference-counted from here on */
};
_Static_assert(sizeof(rtask_ffi_any) == 16, "TVMFFIAny is 16 bytes");

typedef int (*ffi_get_global_t)(const rtask_ffi_bytes* name, void** out);
typedef int (*ffi_call_t)(void* func, rtask_ffi_any* args, int32_t num_args,
                          rtask_ffi_any* result);
typedef int (*ffi_dec_ref_t)(void* obj);
typedef void (*ffi_move_error_t)(void** out);

enum { kModeShareAllCores = -3 }; /* threading::ThreadGroup::kSpecifyThreadShareAllCore */

static struct {
  ffi_call_t call;
  ffi_dec_ref_t dec_ref;
  ffi_move_error_t move_error;
  void* config_threadpool; /* owned references, kept for the process's lifetime */
  void* num_threads;
  void* make_array;
  int ok;
} g_tvm;
static pthread_once_t g_tvm_once = PTHREAD_ONCE_INIT;

/* The CPUs this process may use, read when the library is loaded (before TVM pins any
 * thread), like threads.py's _CPUS. */
static int* g_cpus = NULL;
static int g_num_cpus = 0;

/* Per thread: whether this thread's pool was sized by tvm-rtask (here or from Python). */
static __thread int tls_pool_configured = 0;

__attribute__((constructor)) static void read_cpus(void) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) {
    int count = CPU_COUNT(&set);
    g_cpus = (int*)malloc(sizeof(int) * (size_t)count);
    if (g_cpus != NULL) {
      for (int cpu = 0; cpu < CPU_SETSIZE && g_num_cpus < count; ++cpu) {
        if (CPU_ISSET(cpu, &set)) g_cpus[g_num_cpus++] = cpu;
      }
      return;
    }
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  g_num_cpus = n > 0 ? (int)n : 1;
  g_cpus = (int*)malloc(sizeof(int) * (size_t)g_num_cpus);
  if (g_cpus == NULL) {
    g_num_cpus = 0;
    return;
  }
  for (int i = 0; i < g_num_cpus; ++i) g_cpus[i] = i;
}

static void* global_func(ffi_get_global_t get, const char* name) {
  rtask_ffi_bytes bytes = {name, 0};
  while (name[bytes.size] != '\0') ++bytes.size;
  void* func = NULL;
  if (get(&bytes, &func) != 0) {
    void* err = NULL;
    g_tvm.move_error(&err);
    if (err != NULL) g_tvm.dec_ref(err);
    return NULL;
  }
  return func;
}

static void find_tvm(void) {
  ffi_get_global_t get = (ffi_get_global_t)dlsym(RTLD_DEFAULT, "TVMFFIFunctionGetGlobal");
  g_tvm.call = (ffi_call_t)dlsym(RTLD_DEFAULT, "TVMFFIFunctionCall");
  g_tvm.dec_ref = (ffi_dec_ref_t)dlsym(RTLD_DEFAULT, "TVMFFIObjectDecRef");
  g_tvm.move_error = (ffi_move_error_t)dlsym(RTLD_DEFAULT, "TVMFFIErrorMoveFromRaised");
  if (get == NULL || g_tvm.call == NULL || g_tvm.dec_ref == NULL || g_tvm.move_error == NULL) {
    return;
  }
  g_tvm.config_threadpool = global_func(get, "runtime.config_threadpool");
  g_tvm.num_threads = global_func(get, "runtime.NumThreads");
  g_tvm.make_array = global_func(get, "ffi.Array");
  g_tvm.ok = g_tvm.config_threadpool != NULL && g_tvm.num_threads != NULL &&
             g_tvm.make_array != NULL && g_num_cpus > 0;
}

static void release(rtask_ffi_any* value) {
  if (value->type_index >= kFFIObjectBegin && value->v_obj != NULL) g_tvm.dec_ref(value->v_obj);
  value->type_index = kFFINone;
}

/* Call func(args); 0 on success (result owned by the caller, see release), else the raised
 * error is cleared and -1 returned. */
static int ffi_call(void* func, rtask_ffi_any* args, int32_t num_args, rtask_ffi_any* result) {
  result->type_index = kFFINone;
  result->zero_padding = 0;
  result->v_int64 = 0;
  if (g_tvm.call(func, args, num_args, result) == 0) return 0;
  void* err = NULL;
  g_tvm.move_error(&err);
  if (err != NULL) g_tvm.dec_ref(err);
  return -1;
}

/* runtime.NumThreads() of the calling thread (creates its pool if none exists), or -1. */
static int32_t pool_threads(void) {
  rtask_ffi_any result;
  if (ffi_call(g_tvm.num_threads, NULL, 0, &result) != 0) return -1;
  int32_t n = result.type_index == kFFIInt ? (int32_t)result.v_int64 : -1;
  release(&result);
  return n;
}

/* runtime.config_threadpool(-3, nthreads, [CPU ids as strings] of length
 * max(nthreads, #cpus)), as threads.set_num_threads does.  0 on success, else -1. */
static int config_pool(int32_t nthreads) {
  int length = nthreads > g_num_cpus ? nthreads : g_num_cpus;
  rtask_ffi_any* items = (rtask_ffi_any*)calloc((size_t)length, sizeof(rtask_ffi_any));
  char(*ids)[16] = (char(*)[16])calloc((size_t)length, sizeof(*ids));
  int rc = -1;
  if (items != NULL && ids != NULL) {
    for (int i = 0; i < length; ++i) {
      snprintf(ids[i], sizeof(ids[i]), "%d", g_cpus[i % g_num_cpus]);
      items[i].type_index = kFFIRawStr;
      items[i].v_c_str = ids[i];
    }
    rtask_ffi_any cpus;
    if (ffi_call(g_tvm.make_array, items, length, &cpus) == 0) {
      rtask_ffi_any args[3] = {{.type_index = kFFIInt, .v_int64 = kModeShareAllCores},
                               {.type_index = kFFIInt, .v_int64 = nthreads},
                               cpus};
      rtask_ffi_any result;
      if (ffi_call(g_tvm.config_threadpool, args, 3, &result) == 0) {
        rc = 0;
        release(&result);
      }
      release(&cpus);
    }
  }
  free(items);
  free(ids);
  return rc;
}

/* The worker count TVM uses in a thread nobody configured (threads._tvm_default_threads). */
static int32_t tvm_default_threads(void) {
  const char* vars[2] = {"TVM_NUM_THREADS", "OMP_NUM_THREADS"};
  for (int i = 0; i < 2; ++i) {
    const char* val = getenv(vars[i]);
    if (val != NULL && val[0] != '\0') {
      char* end = NULL;
      long n = strtol(val, &end, 10);
      if (end != val) return n > 1 ? (int32_t)n : 1;
    }
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
#if defined(__x86_64__) || defined(__i386__)
  n /= 2;
#endif
  return n > 1 ? (int32_t)n : 1;
}

/* Note that the calling thread's pool was sized by tvm-rtask (threads.set_num_threads and
 * threads.num_threads call this), so that tvm_rtask_cpu_ensure_workers keeps its count. */
RTASK_EXPORT void tvm_rtask_cpu_note_pool_configured(void) { tls_pool_configured = 1; }

/* 1 when the calling thread's pool was sized by tvm-rtask, else 0. */
RTASK_EXPORT int32_t tvm_rtask_cpu_pool_configured(void) { return tls_pool_configured; }

/*
 * Make the calling thread's TVM pool run at least num_veu workers.  Returns 0 when it does
 * (or when TVM's C API cannot be found in the process: then nothing is changed and the
 * bounded waits remain the guard), else the number of workers the pool runs (>= 1): the
 * pool was created in this thread, before, with fewer workers and cannot grow.
 *
 * The first call in a thread sizes its pool as tvm_rtask.runtime.num_threads() does
 * (TVM's default count, at least num_veu, with a CPU list long enough for the pool to grow
 * to every CPU later), unless tvm-rtask already did in that thread.  After that a call costs
 * one runtime.NumThreads(), and reconfigures the pool only if someone lowered it meanwhile.
 */
RTASK_EXPORT int32_t tvm_rtask_cpu_ensure_workers(int32_t num_veu) {
  if (num_veu <= 1) return 0;
  pthread_once(&g_tvm_once, find_tvm);
  if (!g_tvm.ok) return 0;
  if (!tls_pool_configured) {
    int32_t n = tvm_default_threads();
    config_pool(n > num_veu ? n : num_veu);
    tls_pool_configured = 1;
  }
  int32_t got = pool_threads();
  if (got >= num_veu || got < 0) return 0;
  config_pool(num_veu);
  got = pool_threads();
  return got >= num_veu || got < 0 ? 0 : (got > 0 ? got : 1);
}

RTASK_EXPORT const char* tvm_rtask_runtime_version(void) { return TVM_RTASK_RUNTIME_VERSION; }
