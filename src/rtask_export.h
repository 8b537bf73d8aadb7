/* The symbols libtvm_rtask_runtime.so exports (step_array.c, trace.c): everything else is
 * built with hidden visibility. */
#ifndef TVM_RTASK_EXPORT_H_
#define TVM_RTASK_EXPORT_H_

#if defined(__GNUC__)
#define RTASK_EXPORT __attribute__((visibility("default")))
#else
#define RTASK_EXPORT
#endif

#endif /* TVM_RTASK_EXPORT_H_ */
