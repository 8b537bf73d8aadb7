/*
 * tvm-rtask native runtime: the CPU timeline of persistent kernels (option trace=True).
 *
 * A traced persistent kernel calls tvm_rtask_trace_begin() on a vEU before an rTask or a
 * wait and tvm_rtask_trace_end(kind, program, veu, a, b) after it; the host side of the
 * kernel records the rProgram itself the same way (veu = -1).  Each end appends one record
 * of TRACE_WORDS int64 to one process-wide buffer:
 *
 *   [kind, program, veu, a, b, start_ns, end_ns, 0]
 *
 * kind 0 = an rTask (a = operator index in the plan's graph, b = rtask_id), 1 = a wait
 * (a = the vEU waited for, b = the step count waited for), 2 = an rProgram call (host).
 * Times are CLOCK_MONOTONIC nanoseconds.  The starts of pending events are kept per thread
 * (each vEU is one worker thread) on a small stack, so begin/end need no arguments in common:
 * the thread that calls an rProgram runs vEU 0's events inside the program's own.
 *
 * The buffer exists only between tvm_rtask_trace_reset(capacity) and the next reset with
 * capacity 0: an untraced kernel never calls these functions, and a traced one records
 * nothing while no buffer exists.  A record beyond the capacity is dropped and counted
 * (tvm_rtask_trace_dropped), never written out of bounds.
 */
#define _GNU_SOURCE

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rtask_export.h"

enum { TRACE_WORDS = 8, MAX_DEPTH = 8 };

static int64_t* g_records = NULL;
static int64_t g_capacity = 0; /* records */
static int64_t g_next = 0;     /* claimed records (may exceed the capacity) */
static __thread int64_t tls_begin_ns[MAX_DEPTH];
static __thread int32_t tls_depth = 0;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Drop the buffer and, when capacity > 0, start an empty one of that many records.
 * Returns 0, or 1 when the buffer could not be allocated (tracing stays off).  Not to be
 * called while a traced kernel runs. */
RTASK_EXPORT int32_t tvm_rtask_trace_reset(int64_t capacity) {
  free(g_records);
  g_records = NULL;
  g_capacity = 0;
  __atomic_store_n(&g_next, 0, __ATOMIC_RELEASE);
  if (capacity <= 0) return 0;
  g_records = (int64_t*)calloc((size_t)capacity, TRACE_WORDS * sizeof(int64_t));
  if (g_records == NULL) return 1;
  g_capacity = capacity;
  return 0;
}

/* Note the start of the calling thread's next event. */
RTASK_EXPORT int32_t tvm_rtask_trace_begin(void) {
  int64_t t = now_ns();
  if (tls_depth < MAX_DEPTH) tls_begin_ns[tls_depth] = t;
  tls_depth++;
  return 0;
}

/* Record the event begun last on the calling thread. */
RTASK_EXPORT int32_t tvm_rtask_trace_end(int32_t kind, int32_t program, int32_t veu, int32_t a,
                                         int32_t b) {
  int64_t end = now_ns();
  if (tls_depth > 0) tls_depth--;
  int64_t begin = tls_depth < MAX_DEPTH ? tls_begin_ns[tls_depth] : end;
  if (g_records == NULL) return 0;
  int64_t i = __atomic_fetch_add(&g_next, 1, __ATOMIC_RELAXED);
  if (i >= g_capacity) return 0;
  int64_t* r = g_records + i * TRACE_WORDS;
  r[0] = kind;
  r[1] = program;
  r[2] = veu;
  r[3] = a;
  r[4] = b;
  r[5] = begin;
  r[6] = end;
  r[7] = 0;
  return 0;
}

/* Records held (at most the capacity). */
RTASK_EXPORT int64_t tvm_rtask_trace_count(void) {
  int64_t n = __atomic_load_n(&g_next, __ATOMIC_ACQUIRE);
  return n < g_capacity ? n : g_capacity;
}

/* Records dropped because the buffer was full. */
RTASK_EXPORT int64_t tvm_rtask_trace_dropped(void) {
  int64_t n = __atomic_load_n(&g_next, __ATOMIC_ACQUIRE);
  return n > g_capacity ? n - g_capacity : 0;
}

/* Copy up to max_records records into out (TRACE_WORDS int64 each); returns how many. */
RTASK_EXPORT int64_t tvm_rtask_trace_copy(int64_t* out, int64_t max_records) {
  int64_t n = tvm_rtask_trace_count();
  if (n > max_records) n = max_records;
  if (n > 0) memcpy(out, g_records, (size_t)n * TRACE_WORDS * sizeof(int64_t));
  return n;
}
