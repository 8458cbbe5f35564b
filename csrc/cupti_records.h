// The CUPTI activity record structs this build decodes, taken from the headers it is built with.
//
// setup.py scans the headers and defines ETS_CUPTI_{KERNEL,MEMCPY,MEMSET}_T as the newest struct
// version they declare (e.g. CUpti_ActivityKernel10 for CUDA 13.0). A libcupti writes records in
// its own newest layout, which can differ from ours; the decoder therefore reads only the prefix of
// each record that CUPTI has kept at fixed offsets since CUDA 9 (CUpti_ActivityKernel4,
// CUpti_ActivityMemcpy, CUpti_ActivityMemset). The static_asserts below fail the build if headers
// ever move a field we read, and check_cupti_version() refuses a libcupti from a newer CUDA major
// than these headers.
#pragma once

#ifdef ETS_HAVE_CUPTI

#include <cstddef>

#include "cupti_api.h"

#ifndef ETS_CUPTI_KERNEL_T
#define ETS_CUPTI_KERNEL_T CUpti_ActivityKernel4
#endif
#ifndef ETS_CUPTI_MEMCPY_T
#define ETS_CUPTI_MEMCPY_T CUpti_ActivityMemcpy
#endif
#ifndef ETS_CUPTI_MEMSET_T
#define ETS_CUPTI_MEMSET_T CUpti_ActivityMemset
#endif

#define ETS_STR2(x) #x
#define ETS_STR(x) ETS_STR2(x)

namespace ets {

using KernelActivity = ETS_CUPTI_KERNEL_T;
using MemcpyActivity = ETS_CUPTI_MEMCPY_T;
using MemsetActivity = ETS_CUPTI_MEMSET_T;
using ApiActivity = CUpti_ActivityAPI;
using ExternalCorrelationActivity = CUpti_ActivityExternalCorrelation;

inline constexpr const char* kKernelActivityName = ETS_STR(ETS_CUPTI_KERNEL_T);
inline constexpr const char* kMemcpyActivityName = ETS_STR(ETS_CUPTI_MEMCPY_T);
inline constexpr const char* kMemsetActivityName = ETS_STR(ETS_CUPTI_MEMSET_T);

// The stable prefix (offsets as in every version since CUDA 9).
static_assert(offsetof(KernelActivity, start) == 16 && offsetof(KernelActivity, end) == 24 &&
                  offsetof(KernelActivity, deviceId) == 40 &&
                  offsetof(KernelActivity, contextId) == 44 &&
                  offsetof(KernelActivity, streamId) == 48 && offsetof(KernelActivity, gridX) == 52 &&
                  offsetof(KernelActivity, gridY) == 56 && offsetof(KernelActivity, gridZ) == 60 &&
                  offsetof(KernelActivity, blockX) == 64 && offsetof(KernelActivity, blockY) == 68 &&
                  offsetof(KernelActivity, blockZ) == 72 &&
                  offsetof(KernelActivity, correlationId) == 92 &&
                  offsetof(KernelActivity, name) == 104,
              "kernel activity record prefix moved: the decoder must be revisited");
template <typename T>
constexpr bool copy_prefix_ok() {
  return offsetof(T, bytes) == 8 && offsetof(T, start) == 16 && offsetof(T, end) == 24 &&
         offsetof(T, deviceId) == 32 && offsetof(T, contextId) == 36 &&
         offsetof(T, streamId) == 40 && offsetof(T, correlationId) == 44;
}
static_assert(copy_prefix_ok<MemcpyActivity>() && offsetof(MemcpyActivity, copyKind) == 4,
              "memcpy activity record prefix moved");
static_assert(copy_prefix_ok<MemsetActivity>(), "memset activity record prefix moved");
static_assert(offsetof(ApiActivity, cbid) == 4 && offsetof(ApiActivity, start) == 8 &&
                  offsetof(ApiActivity, end) == 16 && offsetof(ApiActivity, threadId) == 28 &&
                  offsetof(ApiActivity, correlationId) == 32,
              "API activity record layout moved");
static_assert(offsetof(ExternalCorrelationActivity, externalKind) == 4 &&
                  offsetof(ExternalCorrelationActivity, externalId) == 8 &&
                  offsetof(ExternalCorrelationActivity, correlationId) == 16,
              "external correlation record layout moved");

// The external-correlation kind ets-hook pushes (Kineto uses CUSTOM0 and CUSTOM1).
constexpr CUpti_ExternalCorrelationKind kExternalKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2;

}  // namespace ets

#undef ETS_STR
#undef ETS_STR2

#endif  // ETS_HAVE_CUPTI
