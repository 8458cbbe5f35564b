// CuptiApi: the thin vendor wrapper. A table of libcupti entry points filled with dlsym() from a
// libcupti found at run time (never linked), plus the libcuda driver check that must come first.
//
// Search order for libcupti (the first hit wins; nothing hard-codes an ABI tag):
//   1. $ETS_HOOK_CUPTI_LIBRARY, an explicit path;
//   2. a libcupti already loaded in this process (found with dl_iterate_phdr; PyTorch's copy),
//      because two copies of libcupti in one process collide;
//   3. the sonames "libcupti.so.<major of the headers we were built with>" and "libcupti.so",
//      through the normal dynamic-linker search;
//   4. $CUDA_HOME (default /usr/local/cuda) extras/CUPTI/lib64, lib64, lib: libcupti.so, then the
//      versioned files found there, newest first;
//   5. extra directories passed by Python (pip wheels' nvidia/*/lib), same rule as 4.
// Handles are never dlclose()d: CUPTI cannot be unloaded safely.
//
// Without CUPTI headers (ETS_HAVE_CUPTI undefined) only the status vocabulary is compiled.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#ifdef ETS_HAVE_CUPTI
#include <cupti_activity.h>
#include <cupti_callbacks.h>
#include <cupti_version.h>
#endif

namespace ets {

// Why CUPTI collection is (un)available. Names are the Python-visible codes.
enum class StatusCode {
  kOk,
  kNoHeaders,               // "no_headers"
  kNoDriver,                // "no_driver": libcuda missing, cuInit failed, or no visible GPU
  kNoLibcupti,              // "no_libcupti"
  kVersionMismatch,         // "version_mismatch"
  kMultipleSubscribers,     // "multiple_subscribers": another CUPTI subscriber holds the callbacks
  kInsufficientPrivileges,  // "insufficient_privileges"
  kOtherClient,             // "other_client" (decided in Python: nsys env, active torch.profiler)
  kCuptiError,              // "cupti_error": any other CUPTI failure
  kAlreadyActive,           // "already_active": a collection is already running in this process
};

const char* status_code_name(StatusCode code) noexcept;

struct Status {
  StatusCode code = StatusCode::kOk;
  std::string reason;
  bool ok() const noexcept { return code == StatusCode::kOk; }
};

// Which libraries to look for and where. Tests replace these to simulate missing pieces.
struct LoaderOptions {
  std::string driver_library = "libcuda.so.1";  // the driver's soname is part of the driver ABI
  bool check_driver = true;
  bool use_env_override = true;
  bool use_loaded = true;
  bool use_sonames = true;
  bool use_cuda_home = true;
  std::vector<std::string> extra_dirs;
};

// Paths of shared objects loaded in this process whose file name contains `needle`.
std::vector<std::string> loaded_library_paths(const std::string& needle);

// The CUPTI API version scheme: v1..v28 (CUDA 4.0 .. 12.9), then xxyyzz from CUDA 13.0 on.
// Returns the CUDA major version an API version belongs to (0 if unknown / older than CUDA 9).
int cuda_major_of_cupti_version(uint32_t api_version) noexcept;

// Oldest libcupti whose activity records this decoder can read (CUDA 11.0, API v13).
constexpr uint32_t kMinRuntimeCuptiVersion = 13;

// Compatibility rule: the decoder reads only the record prefix that has been stable since CUDA 9
// (checked at compile time against the headers), so any libcupti from CUDA 11.0 up to the CUDA
// major of the headers is accepted; a libcupti from a newer CUDA major may have moved fields we
// cannot verify, so it is refused with a "rebuild" hint.
Status check_cupti_version(uint32_t compiled, uint32_t runtime);

#ifdef ETS_HAVE_CUPTI

constexpr uint32_t kCompiledCuptiVersion = CUPTI_API_VERSION;

struct CuptiApi {
  // Required entry points.
  decltype(&::cuptiGetVersion) getVersion = nullptr;
  decltype(&::cuptiGetResultString) getResultString = nullptr;
  decltype(&::cuptiActivityRegisterCallbacks) activityRegisterCallbacks = nullptr;
  decltype(&::cuptiActivityEnable) activityEnable = nullptr;
  decltype(&::cuptiActivityDisable) activityDisable = nullptr;
  decltype(&::cuptiActivityFlushAll) activityFlushAll = nullptr;
  decltype(&::cuptiActivityGetNextRecord) activityGetNextRecord = nullptr;
  decltype(&::cuptiActivityGetNumDroppedRecords) activityGetNumDroppedRecords = nullptr;
  decltype(&::cuptiActivityPushExternalCorrelationId) activityPushExternalCorrelationId = nullptr;
  decltype(&::cuptiActivityPopExternalCorrelationId) activityPopExternalCorrelationId = nullptr;
  decltype(&::cuptiGetTimestamp) getTimestamp = nullptr;
  // Optional entry points (null when the library lacks them).
  decltype(&::cuptiSubscribe) subscribe = nullptr;
  decltype(&::cuptiUnsubscribe) unsubscribe = nullptr;
  decltype(&::cuptiGetCallbackName) getCallbackName = nullptr;
  decltype(&::cuptiSetThreadIdType) setThreadIdType = nullptr;

  std::string library_path;  // where it came from ("<fake>" in tests)
  uint32_t runtime_version = 0;

  bool complete() const noexcept;
  // "CUPTI_ERROR_X (message)" for `r`, usable before/without a loaded library.
  std::string describe(CUptiResult r) const;
};

// dlopen libcuda, cuInit(0), cuDeviceGetCount. Ok only with >= 1 visible device.
Status check_driver(const LoaderOptions& options);

// Finds and loads libcupti (search order above) and fills `api` (incl. runtime_version).
Status load_cupti(const LoaderOptions& options, CuptiApi* api);

// Maps a failed CUPTI call to a status: MULTIPLE_SUBSCRIBERS, INSUFFICIENT_PRIVILEGES, or
// kCuptiError with the CUPTI error name. `what` names the call that failed.
Status status_from_cupti(const CuptiApi& api, CUptiResult r, const char* what);

#endif  // ETS_HAVE_CUPTI

}  // namespace ets
