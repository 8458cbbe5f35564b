#include "cupti_controller.h"

#include <cstring>
#include <stdexcept>
#include <utility>

#include "cupti_records.h"

namespace ets {

namespace {
struct ActivityName {
  const char* name;
  uint32_t bit;
};
constexpr ActivityName kActivityNames[] = {
    {"kernel", kActKernel},   {"memcpy", kActMemcpy}, {"memset", kActMemset},
    {"runtime", kActRuntime}, {"driver", kActDriver}, {"external_correlation", kActExternalCorrelation},
};
const char* const kNoHeadersReason =
    "built without CUPTI headers (no cupti.h under CUDA_HOME or /usr/local/cuda when ets_hook was "
    "compiled, or ETS_HOOK_NO_CUPTI=1): rebuild with the CUDA toolkit headers to capture kernels";
}  // namespace

uint32_t activity_bit(const std::string& name) noexcept {
  for (const auto& a : kActivityNames) {
    if (name == a.name) return a.bit;
  }
  return 0;
}

std::vector<std::string> activity_names() {
  std::vector<std::string> out;
  for (const auto& a : kActivityNames) out.emplace_back(a.name);
  return out;
}

StartOptions StartOptions::make(std::size_t buffer_size, std::size_t buffer_count,
                                const std::vector<std::string>& activities, bool probe_subscriber,
                                std::vector<std::string> extra_dirs) {
  if (buffer_size < 4096 || buffer_size > (std::size_t{1} << 30)) {
    throw std::invalid_argument("buffer_size_bytes must be in [4096, 2**30], got " +
                                std::to_string(buffer_size));
  }
  if (buffer_count < 2 || buffer_count > 1024) {
    throw std::invalid_argument("buffer_count must be in [2, 1024], got " +
                                std::to_string(buffer_count));
  }
  StartOptions o;
  o.buffer_size = buffer_size;
  o.buffer_count = buffer_count;
  o.activities = 0;
  for (const auto& a : activities) {
    const uint32_t bit = activity_bit(a);
    if (bit == 0) throw std::invalid_argument("unknown activity kind '" + a + "'");
    o.activities |= bit;
  }
  if (o.activities == 0) throw std::invalid_argument("activities must name at least one kind");
  o.probe_subscriber = probe_subscriber;
  o.extra_dirs = std::move(extra_dirs);
  return o;
}

std::vector<std::pair<int, std::string>> memcpy_kind_names() {
#ifdef ETS_HAVE_CUPTI
  return {{CUPTI_ACTIVITY_MEMCPY_KIND_HTOD, "HtoD"}, {CUPTI_ACTIVITY_MEMCPY_KIND_DTOH, "DtoH"},
          {CUPTI_ACTIVITY_MEMCPY_KIND_HTOA, "HtoA"}, {CUPTI_ACTIVITY_MEMCPY_KIND_ATOH, "AtoH"},
          {CUPTI_ACTIVITY_MEMCPY_KIND_ATOA, "AtoA"}, {CUPTI_ACTIVITY_MEMCPY_KIND_ATOD, "AtoD"},
          {CUPTI_ACTIVITY_MEMCPY_KIND_DTOA, "DtoA"}, {CUPTI_ACTIVITY_MEMCPY_KIND_DTOD, "DtoD"},
          {CUPTI_ACTIVITY_MEMCPY_KIND_HTOH, "HtoH"}, {CUPTI_ACTIVITY_MEMCPY_KIND_PTOP, "PtoP"}};
#else
  return {};
#endif
}

CuptiController& CuptiController::instance() {
  static CuptiController* controller = new CuptiController();  // leaked on purpose
  return *controller;
}

#ifdef ETS_HAVE_CUPTI

namespace {

// Static trampolines: CUPTI calls plain functions; they forward to the collector's methods.
void CUPTIAPI buffer_requested_trampoline(uint8_t** buffer, size_t* size, size_t* max_records) {
  CuptiController::instance().collector().on_buffer_requested(buffer, size, max_records);
}

void CUPTIAPI buffer_completed_trampoline(CUcontext, uint32_t, uint8_t* buffer, size_t size,
                                          size_t valid_size) {
  CuptiController::instance().collector().on_buffer_completed(buffer, size, valid_size);
}

void CUPTIAPI probe_callback(void*, CUpti_CallbackDomain, CUpti_CallbackId, const void*) {}

struct KindForBit {
  uint32_t bit;
  CUpti_ActivityKind kind;
};
constexpr KindForBit kKinds[] = {
    {kActKernel, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL},
    {kActMemcpy, CUPTI_ACTIVITY_KIND_MEMCPY},
    {kActMemset, CUPTI_ACTIVITY_KIND_MEMSET},
    {kActRuntime, CUPTI_ACTIVITY_KIND_RUNTIME},
    {kActDriver, CUPTI_ACTIVITY_KIND_DRIVER},
    {kActExternalCorrelation, CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION},
};

}  // namespace

CuptiController::CuptiController() : collector_(StringTable::global()) {}

Status CuptiController::ensure_loaded_locked(const std::vector<std::string>& extra_dirs) {
  if (!driver_override_ok_) {
    Status driver = check_driver(loader_);
    if (!driver.ok()) return driver;
  }
  if (!api_ready_.load(std::memory_order_acquire)) {
    LoaderOptions options = loader_;
    options.extra_dirs.insert(options.extra_dirs.end(), extra_dirs.begin(), extra_dirs.end());
    CuptiApi api;
    Status loaded = load_cupti(options, &api);
    if (!loaded.ok()) return loaded;
    api_ = std::move(api);
    fake_ = false;
    collector_.set_api(&api_);
    api_ready_.store(true, std::memory_order_release);
  }
  Status version = check_cupti_version(kCompiledCuptiVersion, api_.runtime_version);
  if (!version.ok()) return version;
  return {StatusCode::kOk, "CUPTI available: " + api_.library_path + ", " + version.reason};
}

Status CuptiController::probe_locked(const std::vector<std::string>& extra_dirs,
                                     bool probe_subscriber) {
  Status s = ensure_loaded_locked(extra_dirs);
  if (!s.ok() || !probe_subscriber || api_.subscribe == nullptr) return s;
  // One subscriber per process (CUDA <= 13.2): if subscribing fails with MULTIPLE_SUBSCRIBERS,
  // a tool such as Nsight Systems or Kineto is attached. We unsubscribe at once.
  CUpti_SubscriberHandle handle = nullptr;
  const CUptiResult r = api_.subscribe(&handle, reinterpret_cast<CUpti_CallbackFunc>(probe_callback),
                                       nullptr);
  if (r != CUPTI_SUCCESS) return status_from_cupti(api_, r, "cuptiSubscribe (probe)");
  if (api_.unsubscribe != nullptr) api_.unsubscribe(handle);
  return s;
}

Status CuptiController::probe(const std::vector<std::string>& extra_dirs) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (active_.load(std::memory_order_relaxed)) {
    return {StatusCode::kOk, "CUPTI collection active: " + api_.library_path};
  }
  return probe_locked(extra_dirs, /*probe_subscriber=*/true);
}

Status CuptiController::start(std::shared_ptr<RingBuffer> ring, const StartOptions& options) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (active_.load(std::memory_order_relaxed)) {
    return {StatusCode::kAlreadyActive,
            "a CUPTI collection is already running in this process; stop it first"};
  }
  Status s = probe_locked(options.extra_dirs, options.probe_subscriber);
  if (!s.ok()) return s;

  if (!collector_.pool().reset(options.buffer_size, options.buffer_count)) {
    if (collector_.pool().outstanding() == 0) {
      return {StatusCode::kCuptiError, "could not allocate " + std::to_string(options.buffer_count) +
                                           " activity buffers of " +
                                           std::to_string(options.buffer_size) + " bytes"};
    }
    // Buffers from the previous session are still with CUPTI: keep the existing pool.
  }
  collector_.attach(std::move(ring));

  // Thread ids in runtime records = gettid(), the id threading.get_native_id() returns.
  if (api_.setThreadIdType != nullptr) api_.setThreadIdType(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM);

  CUptiResult r = api_.activityRegisterCallbacks(buffer_requested_trampoline,
                                                 buffer_completed_trampoline);
  if (r != CUPTI_SUCCESS) return status_from_cupti(api_, r, "cuptiActivityRegisterCallbacks");
  callbacks_registered_ = true;

  enabled_ = 0;
  for (const auto& k : kKinds) {
    if ((options.activities & k.bit) == 0) continue;
    r = api_.activityEnable(k.kind);
    if (r != CUPTI_SUCCESS) {
      Status failed = status_from_cupti(api_, r, "cuptiActivityEnable");
      for (const auto& e : kKinds) {
        if (enabled_ & e.bit) api_.activityDisable(e.kind);
      }
      enabled_ = 0;
      return failed;
    }
    enabled_ |= k.bit;
  }
  active_.store(true, std::memory_order_release);
  return {StatusCode::kOk, "collecting: " + api_.library_path};
}

Status CuptiController::flush(bool forced) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!callbacks_registered_) return {StatusCode::kOk, "nothing to flush"};
  const CUptiResult r = api_.activityFlushAll(forced ? CUPTI_ACTIVITY_FLAG_FLUSH_FORCED : 0);
  collector_.collect_cupti_dropped();
  if (r != CUPTI_SUCCESS) return status_from_cupti(api_, r, "cuptiActivityFlushAll");
  return {StatusCode::kOk, "flushed"};
}

Status CuptiController::stop_locked(bool flush) {
  if (!active_.load(std::memory_order_relaxed)) return {StatusCode::kOk, "not active"};
  Status result{StatusCode::kOk, "stopped"};
  for (const auto& k : kKinds) {
    if ((enabled_ & k.bit) == 0) continue;
    const CUptiResult r = api_.activityDisable(k.kind);
    if (r != CUPTI_SUCCESS && result.ok()) result = status_from_cupti(api_, r, "cuptiActivityDisable");
  }
  enabled_ = 0;
  active_.store(false, std::memory_order_release);
  if (!flush) return result;
  // Hand every buffer back to us before anyone else can register callbacks.
  const CUptiResult r = api_.activityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  collector_.collect_cupti_dropped();
  if (r != CUPTI_SUCCESS && result.ok()) result = status_from_cupti(api_, r, "cuptiActivityFlushAll");
  return result;
}

Status CuptiController::stop(bool flush) {
  std::lock_guard<std::mutex> lock(mutex_);
  return stop_locked(flush);
}

void CuptiController::detach(const RingBuffer* ring) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (active_.load(std::memory_order_relaxed)) return;
  if (collector_.ring().get() == ring) collector_.attach(nullptr);
}

CollectorStats CuptiController::stats() const { return collector_.stats(); }

std::string CuptiController::last_error() const { return collector_.last_error(); }

CuptiInfo CuptiController::info() {
  std::lock_guard<std::mutex> lock(mutex_);
  CuptiInfo i;
  i.compiled = true;
  i.compiled_version = kCompiledCuptiVersion;
  i.kernel_struct = kKernelActivityName;
  i.memcpy_struct = kMemcpyActivityName;
  i.memset_struct = kMemsetActivityName;
  if (api_ready_.load(std::memory_order_acquire)) {
    i.runtime_version = api_.runtime_version;
    i.library_path = api_.library_path;
    i.fake = fake_;
  }
  return i;
}

bool CuptiController::push_external_id(uint64_t id) noexcept {
  if (!api_ready_.load(std::memory_order_acquire)) return false;
  return api_.activityPushExternalCorrelationId(kExternalKind, id) == CUPTI_SUCCESS;
}

std::optional<uint64_t> CuptiController::pop_external_id() noexcept {
  if (!api_ready_.load(std::memory_order_acquire)) return std::nullopt;
  uint64_t last = 0;
  if (api_.activityPopExternalCorrelationId(kExternalKind, &last) != CUPTI_SUCCESS) return std::nullopt;
  return last;
}

int64_t CuptiController::timestamp_ns() noexcept {
  if (!api_ready_.load(std::memory_order_acquire)) return -1;
  uint64_t ts = 0;
  if (api_.getTimestamp(&ts) != CUPTI_SUCCESS) return -1;
  return static_cast<int64_t>(ts);
}

std::string CuptiController::callback_name(bool driver_domain, uint32_t cbid) {
  if (!api_ready_.load(std::memory_order_acquire) || api_.getCallbackName == nullptr) return "";
  const char* name = nullptr;
  const CUptiResult r = api_.getCallbackName(
      driver_domain ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &name);
  return (r == CUPTI_SUCCESS && name != nullptr) ? std::string(name) : std::string();
}

void CuptiController::set_loader_options(const LoaderOptions& options) {
  std::lock_guard<std::mutex> lock(mutex_);
  loader_ = options;
}

void CuptiController::install_api_for_tests(const CuptiApi& api, bool driver_ok) {
  std::lock_guard<std::mutex> lock(mutex_);
  stop_locked(true);
  api_ = api;
  fake_ = true;
  driver_override_ok_ = driver_ok;
  collector_.set_api(&api_);
  api_ready_.store(true, std::memory_order_release);
}

void CuptiController::reset_for_tests() {
  std::lock_guard<std::mutex> lock(mutex_);
  stop_locked(true);
  collector_.attach(nullptr);
  api_ready_.store(false, std::memory_order_release);
  collector_.set_api(nullptr);
  api_ = CuptiApi();
  fake_ = false;
  driver_override_ok_ = false;
  callbacks_registered_ = false;
  loader_ = LoaderOptions();
}

#else  // !ETS_HAVE_CUPTI: every entry point reports "built without CUPTI headers".

CuptiController::CuptiController() = default;

Status CuptiController::probe(const std::vector<std::string>&) {
  return {StatusCode::kNoHeaders, kNoHeadersReason};
}
Status CuptiController::start(std::shared_ptr<RingBuffer>, const StartOptions&) {
  return {StatusCode::kNoHeaders, kNoHeadersReason};
}
Status CuptiController::flush(bool) { return {StatusCode::kNoHeaders, kNoHeadersReason}; }
Status CuptiController::stop(bool) { return {StatusCode::kOk, "not active"}; }
void CuptiController::detach(const RingBuffer*) {}
CollectorStats CuptiController::stats() const { return {}; }
std::string CuptiController::last_error() const { return ""; }
CuptiInfo CuptiController::info() { return {}; }
bool CuptiController::push_external_id(uint64_t) noexcept { return false; }
std::optional<uint64_t> CuptiController::pop_external_id() noexcept { return std::nullopt; }
int64_t CuptiController::timestamp_ns() noexcept { return -1; }
std::string CuptiController::callback_name(bool, uint32_t) { return ""; }
void CuptiController::set_loader_options(const LoaderOptions& options) { loader_ = options; }
void CuptiController::reset_for_tests() { loader_ = LoaderOptions(); }

#endif  // ETS_HAVE_CUPTI

}  // namespace ets
