#ifndef TVM_RTASK_TRACE_DEFINED
#define TVM_RTASK_TRACE_DEFINED
// The CUDA timeline (option trace=True; tvm_rtask/runtime/trace.py): thread 0 of a vEU
// writes one record [kind, program, veu, a, b, start_ns, end_ns, 0] per rTask, wait and
// call of the kernel into its own slots of the program's trace buffer. The slots are fixed
// at compile time (the vEU's call first, then one per event in order), so nothing is counted
// atomically and every call overwrites the previous call's records. The start goes straight
// into the record: nothing but the slot number stays live across a body.
__device__ __forceinline__ int tvm_rtask_trace_begin(int64_t* trace, int slot) {
  trace[(int64_t)slot * 8 + 5] = (int64_t)tvm_rtask_now_ns();
  return 0;
}
__device__ __forceinline__ int tvm_rtask_trace_end(int64_t* trace, int slot, int kind,
                                                   int program, int veu, int a, int b) {
  int64_t end = (int64_t)tvm_rtask_now_ns();
  int64_t* r = trace + (int64_t)slot * 8;
  r[0] = kind; r[1] = program; r[2] = veu; r[3] = a; r[4] = b;
  r[6] = end; r[7] = 0;
  return 0;
}
#endif
