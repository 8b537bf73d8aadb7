#ifndef TVM_RTASK_CLAIM_DEFINED
#define TVM_RTASK_CLAIM_DEFINED
// vEU ids by SM: see tvm_rtask/backend/cuda/veu_claim.py (claim_veus is the same in Python).
__shared__ int tvm_rtask_veu_id;
__device__ __forceinline__ unsigned int tvm_rtask_smid() {
  unsigned int s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}
__device__ __noinline__ int tvm_rtask_claim_veu(int* words, int num_veu, int num_sms, int epoch,
                                                int* status, long long timeout_ns, int trap) {
  if (threadIdx.x == 0) {
    unsigned int* arrive = (unsigned int*)words;
    unsigned int* bank = arrive + 1 + (unsigned int)(epoch & 1) * (unsigned int)(num_sms + 1);
    unsigned int* next = arrive + 1 + (unsigned int)((epoch + 1) & 1) * (unsigned int)(num_sms + 1);
    if (blockIdx.x == 0) {
      for (int s = 0; s <= num_sms; ++s) next[s] = 0u;
    }
    unsigned int sm = tvm_rtask_smid();
    int veu = -1;
    if (sm < (unsigned int)num_sms) {
      unsigned int c = atomicAdd(&bank[sm], 1u);
      if (c < (unsigned int)num_veu && (long long)c * num_sms + sm < (long long)num_veu) {
        veu = (int)(c * (unsigned int)num_sms + sm);
      }
    }
    __threadfence();
    atomicAdd(arrive, 1u);
    if (veu < 0) {
      unsigned int rank = atomicAdd(&bank[num_sms], 1u);
      // wait for every block's claim (status kind 3 on timeout)
      tvm_rtask_wait_epoch(words, num_veu, epoch, status, timeout_ns, 3, (int)blockIdx.x,
                           num_veu, trap);
      volatile unsigned int* vbank = bank;
      unsigned int unclaimed = 0;
      for (int v = 0; v < num_veu && veu < 0; ++v) {
        if (vbank[v % num_sms] <= (unsigned int)(v / num_sms)) {
          if (unclaimed == rank) veu = v;
          ++unclaimed;
        }
      }
      if (veu < 0) {  // only after a timeout: run the block's own row, the status says why
        veu = (int)blockIdx.x;
      }
    }
    tvm_rtask_veu_id = veu;
  }
  __syncthreads();
  return 0;
}
// The vEU id this block claimed (every thread, after tvm_rtask_claim_veu).
__device__ __forceinline__ int tvm_rtask_claimed_veu() { return tvm_rtask_veu_id; }
#endif
