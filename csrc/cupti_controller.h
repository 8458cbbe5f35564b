// CuptiController: lifecycle of the process-wide CUPTI activity collection.
//
// CUPTI has one set of activity-buffer callbacks per process, so there is one controller, created
// on first use and never destroyed (CUPTI may call back during interpreter shutdown). It owns the
// ActivityCollector, the loaded CuptiApi table and the static trampolines CUPTI calls.
//
// Availability is decided in this order: headers compiled in -> driver (libcuda, cuInit, device
// count; without it cuptiActivityEnable fails with an uninformative CUPTI_ERROR_UNKNOWN) ->
// libcupti found -> cuptiGetVersion compatible -> no other subscriber (a cuptiSubscribe /
// cuptiUnsubscribe probe; collection itself never subscribes). Python adds the checks only it can
// make (torch.profiler active, Nsight environment) before calling start().
//
// Lifecycle: start() registers the buffer callbacks and enables the activity kinds; flush() calls
// cuptiActivityFlushAll (records arrive through the callbacks on the calling thread); stop()
// disables the kinds and, unless told not to, force-flushes so that no buffer stays with CUPTI
// (a caller that skips it must flush() before another CUPTI client starts). cuptiFinalize is never
// called (it crashes under CUDA Graphs). The ring stays attached after stop() so late records
// still land; detach() releases it.
//
// Locking: mutex_ serialises start/flush/stop/probe/detach (Python threads, GIL released). CUPTI
// callbacks never take it. push/pop of external correlation ids take no lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "activity_collector.h"
#include "cupti_api.h"
#include "ring_buffer.h"

namespace ets {

// Activity kinds a caller can ask for (names are the Python spelling).
enum ActivityMask : uint32_t {
  kActKernel = 1u << 0,               // "kernel"  (CONCURRENT_KERNEL, never the serialising KERNEL)
  kActMemcpy = 1u << 1,               // "memcpy"
  kActMemset = 1u << 2,               // "memset"
  kActRuntime = 1u << 3,              // "runtime"
  kActDriver = 1u << 4,               // "driver"
  kActExternalCorrelation = 1u << 5,  // "external_correlation"
};
// Driver API records are needed for kernels launched through cuLaunchKernel (Triton, cuBLASLt).
constexpr uint32_t kDefaultActivities =
    kActKernel | kActMemcpy | kActMemset | kActRuntime | kActDriver | kActExternalCorrelation;

// Name -> mask bit; 0 for an unknown name.
uint32_t activity_bit(const std::string& name) noexcept;
std::vector<std::string> activity_names();

struct StartOptions {
  std::size_t buffer_size = std::size_t{4} << 20;
  std::size_t buffer_count = 8;
  uint32_t activities = kDefaultActivities;
  bool probe_subscriber = true;  // refuse to start when another CUPTI subscriber exists
  std::vector<std::string> extra_dirs;

  // Validated options; std::invalid_argument (naming the bad value) for out-of-range sizes,
  // unknown activity names or an empty activity list.
  static StartOptions make(std::size_t buffer_size, std::size_t buffer_count,
                           const std::vector<std::string>& activities, bool probe_subscriber,
                           std::vector<std::string> extra_dirs);
};

// CUpti_ActivityMemcpyKind value -> "HtoD", ... (empty without CUPTI headers).
std::vector<std::pair<int, std::string>> memcpy_kind_names();

struct CuptiInfo {
  bool compiled = false;
  uint32_t compiled_version = 0;
  uint32_t runtime_version = 0;  // 0 until libcupti is loaded
  std::string library_path;
  std::string kernel_struct, memcpy_struct, memset_struct;
  bool fake = false;
};

class CuptiController {
 public:
  static CuptiController& instance();

  Status probe(const std::vector<std::string>& extra_dirs);
  Status start(std::shared_ptr<RingBuffer> ring, const StartOptions& options);
  Status flush(bool forced);
  // flush=false leaves the final cuptiActivityFlushAll to a later flush() (off the training thread).
  Status stop(bool flush = true);
  // Releases `ring` if it is the attached one and no collection is active.
  void detach(const RingBuffer* ring);

  bool active() const noexcept { return active_.load(std::memory_order_acquire); }
  CollectorStats stats() const;
  std::string last_error() const;
  CuptiInfo info();

  // External correlation (kind CUSTOM2). Lock-free; false / nullopt when CUPTI is not loaded
  // (or, for pop, when nothing was pushed on this thread).
  bool push_external_id(uint64_t id) noexcept;
  std::optional<uint64_t> pop_external_id() noexcept;
  // CUPTI's clock (the clock of every record's start/end); -1 when CUPTI is not loaded.
  int64_t timestamp_ns() noexcept;
  // Name of a runtime ("runtime") or driver ("driver") API callback id; "" if unknown.
  std::string callback_name(bool driver_domain, uint32_t cbid);

  // ---- test hooks ----
  void set_loader_options(const LoaderOptions& options);
  // Stops any collection and forgets the loaded/fake library and loader options.
  void reset_for_tests();

#ifdef ETS_HAVE_CUPTI
  // Replaces the real library with `api` (a fake table). driver_ok=false keeps the driver check.
  void install_api_for_tests(const CuptiApi& api, bool driver_ok);
  ActivityCollector& collector() noexcept { return collector_; }
#endif

 private:
  CuptiController();
  Status ensure_loaded_locked(const std::vector<std::string>& extra_dirs);
  Status probe_locked(const std::vector<std::string>& extra_dirs, bool probe_subscriber);
  Status stop_locked(bool flush);

  mutable std::mutex mutex_;  // lifecycle; never taken by callbacks
  LoaderOptions loader_;
  bool driver_override_ok_ = false;
  std::atomic<bool> active_{false};
  std::atomic<bool> api_ready_{false};  // api_ filled; read lock-free by push/pop/timestamp
  uint32_t enabled_ = 0;                // CUPTI kinds we enabled (bit per ActivityMask)
  bool callbacks_registered_ = false;
#ifdef ETS_HAVE_CUPTI
  CuptiApi api_;
  bool fake_ = false;
  ActivityCollector collector_;
#endif
};

}  // namespace ets
