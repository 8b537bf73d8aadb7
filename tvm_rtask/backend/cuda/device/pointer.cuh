#ifndef TVM_RTASK_POINTER_DEFINED
#define TVM_RTASK_POINTER_DEFINED
// A pointer as an integer, and back to any pointer type: lets one rKernel body take the
// tensors of whichever operator runs (a select over integers; TIR selects no pointers).
__device__ __forceinline__ unsigned long long tvm_rtask_addr(const void* p) {
  return (unsigned long long)p;
}
struct tvm_rtask_any_ptr {
  unsigned long long a;
  template <typename T> __device__ __forceinline__ operator T*() const { return (T*)a; }
};
__device__ __forceinline__ tvm_rtask_any_ptr tvm_rtask_ptr(unsigned long long a) {
  tvm_rtask_any_ptr p; p.a = a; return p;
}
#endif
