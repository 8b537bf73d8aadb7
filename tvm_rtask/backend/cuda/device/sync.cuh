#ifndef TVM_RTASK_SYNC_DEFINED
#define TVM_RTASK_SYNC_DEFINED
__device__ __forceinline__ unsigned long long tvm_rtask_now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Record a timed-out wait once (status[0] = kind), print it and trap if asked. Returns 1.
__device__ __noinline__ int tvm_rtask_timeout(int* status, int kind, int waiter, int waited,
                                              int target, int seen, int trap) {
  if (atomicCAS(status, 0, kind) == 0) {
    status[1] = waiter; status[2] = waited; status[3] = target; status[4] = seen;
    __threadfence();
    if (trap && kind == 1) {
      printf("tvm_rtask: barrier timeout: vEU %d waited for vEU %d to reach step %d "
             "(it reached %d); aborting the kernel\n", waiter, waited, target, seen);
    }
    if (trap && kind == 2) {
      printf("tvm_rtask: dependency timeout: vEU %d waited for operator %d of the rProgram "
             "to finish its %d rTasks (%d finished); aborting the kernel\n",
             waiter, waited, target, seen);
    }
    if (trap && kind == 3) {
      printf("tvm_rtask: vEU claim timeout: block %d without a vEU of its SM waited for all "
             "%d blocks to start (%d started); aborting the kernel\n", waiter, waited, seen);
    }
  }
  if (trap) __trap();
  return 1;
}
// Any thread: wait until step[0] >= target (acquire). Returns 0, or 1 on failure.
__device__ __noinline__ int tvm_rtask_wait(int* step, int target, int* status,
                                           long long timeout_ns, int waiter, int waited,
                                           int trap) {
  volatile int* vstep = step;
  volatile int* vstatus = status;
  unsigned long long start = tvm_rtask_now_ns();
  unsigned int backoff = 32;
  while (true) {
    int seen = *vstep;
    if (seen >= target) { __threadfence(); return 0; }
    if (vstatus[0] != 0) return 1;
    if ((long long)(tvm_rtask_now_ns() - start) > timeout_ns) {
      return tvm_rtask_timeout(status, 1, waiter, waited, target, seen, trap);
    }
    __nanosleep(backoff);
    if (backoff < 1024) backoff <<= 1;
  }
}
// Any thread: wait until an epoch-based counter reaches (epoch + 1) * count (acquire);
// unsigned arithmetic, compared as a signed difference, so the counters may wrap around.
// A timeout records status kind ``kind`` (waiter, waited, count, the count reached).
__device__ __forceinline__ int tvm_rtask_wait_epoch(int* counter, int count, int epoch,
                                                    int* status, long long timeout_ns,
                                                    int kind, int waiter, int waited,
                                                    int trap) {
  volatile unsigned int* vcounter = (volatile unsigned int*)counter;
  volatile int* vstatus = status;
  unsigned int target = ((unsigned int)epoch + 1u) * (unsigned int)count;
  unsigned long long start = tvm_rtask_now_ns();
  unsigned int backoff = 32;
  while (true) {
    unsigned int seen = *vcounter;
    if ((int)(seen - target) >= 0) { __threadfence(); return 0; }
    if (vstatus[0] != 0) return 1;
    if ((long long)(tvm_rtask_now_ns() - start) > timeout_ns) {
      int done = (int)(seen - (unsigned int)epoch * (unsigned int)count);
      return tvm_rtask_timeout(status, kind, waiter, waited, count, done, trap);
    }
    __nanosleep(backoff);
    if (backoff < 1024) backoff <<= 1;
  }
}
// Any thread: wait until operator op's counter reaches (epoch + 1) * count (status kind 2).
__device__ __noinline__ int tvm_rtask_wait_count(int* counter, int count, int epoch,
                                                 int* status, long long timeout_ns,
                                                 int waiter, int op, int trap) {
  return tvm_rtask_wait_epoch(counter, count, epoch, status, timeout_ns, 2, waiter, op, trap);
}
// Thread 0 of a vEU: publish step = value (release).
__device__ __forceinline__ int tvm_rtask_signal(int* step, int value) {
  __threadfence();
  atomicExch(step, value);
  return 0;
}
// Thread 0 of a vEU, after __syncthreads: count finished rTasks (release).
__device__ __forceinline__ int tvm_rtask_arrive(int* counter, int count) {
  __threadfence();
  atomicAdd((unsigned int*)counter, (unsigned int)count);
  return 0;
}
// The epoch of this launch (read by every thread at the start; it changes only after every
// vEU has finished).
__device__ __forceinline__ int tvm_rtask_epoch(int* word) {
  return *(volatile int*)word;
}
// Thread 0 of a vEU at the end: the last of num_veu zeroes the steps for the next replay.
__device__ __noinline__ int tvm_rtask_finish(int* steps, int num_veu) {
  __threadfence();
  if (atomicAdd(&steps[num_veu], 1) == num_veu - 1) {
    for (int v = 0; v <= num_veu; ++v) steps[v] = 0;
    __threadfence();
  }
  return 0;
}
// Thread 0 of a vEU at the end: the last of num_veu advances the epoch (nothing is reset).
__device__ __noinline__ int tvm_rtask_finish_epoch(int* finished, int* epoch_word, int num_veu,
                                                   int epoch) {
  __threadfence();
  unsigned int last = ((unsigned int)epoch + 1u) * (unsigned int)num_veu - 1u;
  if (atomicAdd((unsigned int*)finished, 1u) == last) {
    __threadfence();
    atomicExch(epoch_word, (int)((unsigned int)epoch + 1u));
  }
  return 0;
}
#endif
