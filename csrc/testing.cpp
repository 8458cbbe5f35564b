#include "testing.h"

#include <time.h>

#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <stdexcept>

#include "cupti_controller.h"
#include "cupti_records.h"

#ifdef ETS_HAVE_CUPTI
#include <cupti_runtime_cbid.h>
#endif

namespace ets::testing {

// ---------------------------------------------------------------- ring producers

namespace {
inline void write_sequence_record(Record* r, uint64_t i) noexcept {
  // Every byte written in place (a kernel record); no temporary Record.
  r->kind = static_cast<uint8_t>(RecordKind::kKernel);
  r->subkind = 0;
  r->device = static_cast<uint16_t>(i & 7);
  r->correlation_id = static_cast<uint32_t>(i);
  r->start_ns = static_cast<int64_t>(i);
  r->end_ns = static_cast<int64_t>(i + 1);
  r->name_id = static_cast<uint32_t>(i % 1000);
  r->stream = static_cast<uint32_t>(i & 15);
  r->context_id = 1;
  r->grid_x = static_cast<int32_t>(i & 1023);
  r->grid_yz[0] = 2;
  r->grid_yz[1] = 3;
  r->block_x = 256;
  r->block_y = 1;
  r->block_z = 1;
  r->reserved = 0;
}
}  // namespace

uint64_t push_sequence(RingBuffer& ring, uint64_t first, uint64_t count, uint32_t publish_every) {
  if (publish_every == 0) publish_every = 1;
  uint64_t pushed = 0;
  uint32_t since_publish = 0;
  for (uint64_t i = first; i < first + count; ++i) {
    Record* r = ring.try_claim();
    if (r == nullptr) continue;
    write_sequence_record(r, i);
    ++pushed;
    if (++since_publish == publish_every) {
      ring.publish();
      since_publish = 0;
    }
  }
  ring.publish();
  return pushed;
}

Producer::Producer(std::shared_ptr<RingBuffer> ring, uint64_t first, uint64_t count,
                   bool wait_when_full)
    : ring_(std::move(ring)) {
  thread_ = std::thread([this, first, count, wait_when_full] {
    RingBuffer& ring = *ring_;
    uint64_t pushed = 0;
    uint32_t since_publish = 0;
    for (uint64_t i = first; i < first + count; ++i) {
      Record* r = nullptr;
      if (wait_when_full) {
        // Producer-side back-pressure for the test only: wait for space rather than drop.
        while (ring.size() + since_publish >= ring.capacity()) {
          ring.publish();
          since_publish = 0;
          std::this_thread::yield();
        }
      }
      r = ring.try_claim();
      if (r == nullptr) continue;
      write_sequence_record(r, i);
      ++pushed;
      if (++since_publish == 64) {
        ring.publish();
        since_publish = 0;
      }
    }
    ring.publish();
    pushed_ = pushed;
    done_.store(true, std::memory_order_release);
  });
}

Producer::~Producer() {
  if (thread_.joinable()) thread_.join();
}

uint64_t Producer::join() {
  if (thread_.joinable()) thread_.join();
  return pushed_;
}

#ifdef ETS_HAVE_CUPTI

// ---------------------------------------------------------------- fake libcupti

namespace {

struct FakeState {
  std::mutex mutex;  // guards everything below
  FakeCuptiConfig config;
  CUpti_BuffersCallbackRequestFunc request = nullptr;
  CUpti_BuffersCallbackCompleteFunc complete = nullptr;
  std::set<int> enabled;
  int subscribers = 0;
  std::deque<std::string> pending;
  uint64_t dropped = 0;
  std::vector<uint64_t> external_stack;
};

FakeState& fake() {
  static FakeState* state = new FakeState();
  return *state;
}

// Kernel names must outlive decoding (records hold `const char*`): kept for the process.
std::deque<std::string>& name_storage() {
  static std::deque<std::string>* names = new std::deque<std::string>();
  return *names;
}
std::mutex& name_storage_mutex() {
  static std::mutex* m = new std::mutex();
  return *m;
}

std::size_t record_size_for_kind(CUpti_ActivityKind kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: return sizeof(KernelActivity);
    case CUPTI_ACTIVITY_KIND_MEMCPY: return sizeof(MemcpyActivity);
    case CUPTI_ACTIVITY_KIND_MEMSET: return sizeof(MemsetActivity);
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: return sizeof(ApiActivity);
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: return sizeof(ExternalCorrelationActivity);
    case CUPTI_ACTIVITY_KIND_NAME: return sizeof(CUpti_ActivityName);
    default: return 0;
  }
}

CUptiResult CUPTIAPI fake_get_version(uint32_t* v) {
  std::lock_guard<std::mutex> lock(fake().mutex);
  *v = fake().config.version != 0 ? fake().config.version : CUPTI_API_VERSION;
  return CUPTI_SUCCESS;
}
CUptiResult CUPTIAPI fake_result_string(CUptiResult r, const char** s) {
  switch (r) {
    case CUPTI_SUCCESS: *s = "CUPTI_SUCCESS"; break;
    case CUPTI_ERROR_INSUFFICIENT_PRIVILEGES: *s = "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES"; break;
    case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
      *s = "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED";
      break;
    case CUPTI_ERROR_NOT_INITIALIZED: *s = "CUPTI_ERROR_NOT_INITIALIZED"; break;
    default: *s = "CUPTI_ERROR_UNKNOWN"; break;
  }
  return CUPTI_SUCCESS;
}
CUptiResult CUPTIAPI fake_register(CUpti_BuffersCallbackRequestFunc req,
                                   CUpti_BuffersCallbackCompleteFunc done) {
  std::lock_guard<std::mutex> lock(fake().mutex);
  if (fake().config.register_result != 0) return static_cast<CUptiResult>(fake().config.register_result);
  fake().request = req;
  fake().complete = done;
  return CUPTI_SUCCESS;
}
CUptiResult CUPTIAPI fake_enable(CUpti_ActivityKind kind) {
  std::lock_guard<std::mutex> lock(fake().mutex);
  const auto& c = fake().config;
  if (c.enable_result != 0 && (c.enable_fail_kind < 0 || c.enable_fail_kind == static_cast<int>(kind))) {
    return static_cast<CUptiResult>(c.enable_result);
  }
  fake().enabled.insert(static_cast<int>(kind));
  return CUPTI_SUCCESS;
}
CUptiResult CUPTIAPI fake_disable(CUpti_ActivityKind kind) {
  std::lock_guard<std::mutex> lock(fake().mutex);
  fake().enabled.erase(static_cast<int>(kind));
  return CUPTI_SUCCESS;
}

// Records in a synthetic buffer: what CUPTI counts as dropped when it has no room for them.
uint64_t count_records(const std::string& bytes) {
  uint64_t n = 0;
  size_t offset = 0;
  while (offset + sizeof(CUpti_ActivityKind) <= bytes.size()) {
    CUpti_ActivityKind kind;  // the first member of every record; memcpy: no alignment assumed
    std::memcpy(&kind, bytes.data() + offset, sizeof(kind));
    const size_t size = record_size_for_kind(kind);
    if (size == 0) break;
    offset += size;
    ++n;
  }
  return n;
}

// Request a buffer and complete it with `bytes`, like CUPTI does. Called without fake().mutex,
// and the callbacks run without it: the completion callback reads the dropped count
// (fake_dropped takes fake().mutex), so calling it under the lock would self-deadlock.
bool deliver(CUpti_BuffersCallbackRequestFunc req, CUpti_BuffersCallbackCompleteFunc done,
             const std::string& bytes) {
  uint8_t* buffer = nullptr;
  size_t size = 0, max_records = 0;
  req(&buffer, &size, &max_records);
  if (buffer == nullptr || size < bytes.size()) {
    {
      std::lock_guard<std::mutex> lock(fake().mutex);
      fake().dropped += count_records(bytes);  // CUPTI drops the records it has no room for
    }
    if (buffer != nullptr) done(nullptr, 0, buffer, size, 0);  // handed back empty
    return false;
  }
  std::memcpy(buffer, bytes.data(), bytes.size());
  done(nullptr, 0, buffer, size, bytes.size());
  return true;
}

CUptiResult CUPTIAPI fake_flush_all(uint32_t) {
  CUpti_BuffersCallbackRequestFunc req;
  CUpti_BuffersCallbackCompleteFunc done;
  std::deque<std::string> pending;
  {
    std::lock_guard<std::mutex> lock(fake().mutex);
    if (fake().config.flush_result != 0) return static_cast<CUptiResult>(fake().config.flush_result);
    if (fake().request == nullptr) return CUPTI_ERROR_INVALID_OPERATION;
    req = fake().request;
    done = fake().complete;
    pending.swap(fake().pending);
  }
  for (const auto& bytes : pending) deliver(req, done, bytes);
  return CUPTI_SUCCESS;
}

// Walks a buffer the way build_activity_buffer lays it out (the real libcupti knows its own
// record sizes; this fake knows the compiled-in ones).
CUptiResult CUPTIAPI fake_next_record(uint8_t* buffer, size_t valid, CUpti_Activity** record) {
  size_t offset = 0;
  if (*record != nullptr) {
    offset = static_cast<size_t>(reinterpret_cast<uint8_t*>(*record) - buffer) +
             record_size_for_kind((*record)->kind);
  }
  if (offset >= valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
  auto* next = reinterpret_cast<CUpti_Activity*>(buffer + offset);
  const size_t size = record_size_for_kind(next->kind);
  if (size == 0 || offset + size > valid) return CUPTI_ERROR_INVALID_KIND;
  *record = next;
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI fake_dropped(CUcontext, uint32_t, size_t* dropped) {
  std::lock_guard<std::mutex> lock(fake().mutex);
  *dropped = static_cast<size_t>(fake().dropped + fake().config.dropped_records);
  fake().dropped = 0;
  fake().config.dropped_records = 0;  // CUPTI resets the count when it is read
  return CUPTI_SUCCESS;
}
CUptiResult CUPTIAPI fake_push(CUpti_ExternalCorrelationKind, uint64_t id) {
  std::lock_guard<std::mutex> lock(fake().mutex);
  fake().external_stack.push_back(id);
  return CUPTI_SUCCESS;
}
CUptiResult CUPTIAPI fake_pop(CUpti_ExternalCorrelationKind, uint64_t* last) {
  std::lock_guard<std::mutex> lock(fake().mutex);
  if (fake().external_stack.empty()) return CUPTI_ERROR_QUEUE_EMPTY;
  *last = fake().external_stack.back();
  fake().external_stack.pop_back();
  return CUPTI_SUCCESS;
}
CUptiResult CUPTIAPI fake_timestamp(uint64_t* ts) {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  std::lock_guard<std::mutex> lock(fake().mutex);
  *ts = static_cast<uint64_t>(now.tv_sec) * 1000000000ull + static_cast<uint64_t>(now.tv_nsec) +
        static_cast<uint64_t>(fake().config.timestamp_offset_ns);
  return CUPTI_SUCCESS;
}
CUptiResult CUPTIAPI fake_subscribe(CUpti_SubscriberHandle* handle, CUpti_CallbackFunc, void*) {
  std::lock_guard<std::mutex> lock(fake().mutex);
  if (fake().config.subscribe_result != 0) {
    return static_cast<CUptiResult>(fake().config.subscribe_result);
  }
  ++fake().subscribers;
  *handle = reinterpret_cast<CUpti_SubscriberHandle>(&fake());
  return CUPTI_SUCCESS;
}
CUptiResult CUPTIAPI fake_unsubscribe(CUpti_SubscriberHandle) {
  std::lock_guard<std::mutex> lock(fake().mutex);
  --fake().subscribers;
  return CUPTI_SUCCESS;
}
CUptiResult CUPTIAPI fake_callback_name(CUpti_CallbackDomain domain, uint32_t cbid, const char** name) {
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API && cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000) {
    *name = "cudaLaunchKernel";
    return CUPTI_SUCCESS;
  }
  *name = nullptr;
  return CUPTI_ERROR_INVALID_PARAMETER;
}
CUptiResult CUPTIAPI fake_thread_id_type(CUpti_ActivityThreadIdType) { return CUPTI_SUCCESS; }

}  // namespace

void install_fake_cupti(const FakeCuptiConfig& config) {
  CuptiController::instance().reset_for_tests();
  {
    std::lock_guard<std::mutex> lock(fake().mutex);
    FakeState& f = fake();
    f.config = config;
    f.request = nullptr;
    f.complete = nullptr;
    f.enabled.clear();
    f.subscribers = 0;
    f.pending.clear();
    f.dropped = 0;
    f.external_stack.clear();
  }
  CuptiApi api;
  api.getVersion = fake_get_version;
  api.getResultString = fake_result_string;
  api.activityRegisterCallbacks = fake_register;
  api.activityEnable = fake_enable;
  api.activityDisable = fake_disable;
  api.activityFlushAll = fake_flush_all;
  api.activityGetNextRecord = fake_next_record;
  api.activityGetNumDroppedRecords = fake_dropped;
  api.activityPushExternalCorrelationId = fake_push;
  api.activityPopExternalCorrelationId = fake_pop;
  api.getTimestamp = fake_timestamp;
  api.subscribe = fake_subscribe;
  api.unsubscribe = fake_unsubscribe;
  api.getCallbackName = fake_callback_name;
  api.setThreadIdType = fake_thread_id_type;
  api.library_path = "<fake libcupti>";
  fake_get_version(&api.runtime_version);
  CuptiController::instance().install_api_for_tests(api, config.driver_ok);
}

void reset_cupti() { CuptiController::instance().reset_for_tests(); }

std::vector<int> fake_enabled_kinds() {
  std::lock_guard<std::mutex> lock(fake().mutex);
  return {fake().enabled.begin(), fake().enabled.end()};
}

int fake_subscriber_count() {
  std::lock_guard<std::mutex> lock(fake().mutex);
  return fake().subscribers;
}

std::vector<uint64_t> fake_external_stack() {
  std::lock_guard<std::mutex> lock(fake().mutex);
  return fake().external_stack;
}

// ---------------------------------------------------------------- synthetic buffers

namespace {

struct FieldReader {
  const SyntheticActivity& a;
  std::set<std::string> used;
  int64_t get(const char* key) {
    used.insert(key);
    auto it = a.fields.find(key);
    return it == a.fields.end() ? 0 : it->second;
  }
  void check_all_used() const {
    for (const auto& kv : a.fields) {
      if (used.count(kv.first) == 0) {
        throw std::invalid_argument("unknown field '" + kv.first + "' for a " + a.kind + " record");
      }
    }
  }
};

template <typename T>
void append(std::string* out, const T& record) {
  static_assert(sizeof(T) % 8 == 0, "activity records are 8-byte aligned");
  out->append(reinterpret_cast<const char*>(&record), sizeof(T));
}

template <typename T>
void fill_copy(T* m, FieldReader& f) {
  m->start = static_cast<uint64_t>(f.get("start"));
  m->end = static_cast<uint64_t>(f.get("end"));
  m->deviceId = static_cast<uint32_t>(f.get("deviceId"));
  m->contextId = static_cast<uint32_t>(f.get("contextId"));
  m->streamId = static_cast<uint32_t>(f.get("streamId"));
  m->correlationId = static_cast<uint32_t>(f.get("correlationId"));
  m->bytes = static_cast<uint64_t>(f.get("bytes"));
}

}  // namespace

std::string build_activity_buffer(const std::vector<SyntheticActivity>& records) {
  std::string out;
  for (const auto& a : records) {
    FieldReader f{a, {}};
    if (a.kind == "concurrent_kernel" || a.kind == "kernel") {
      KernelActivity k;
      std::memset(&k, 0, sizeof(k));
      k.kind = a.kind == "kernel" ? CUPTI_ACTIVITY_KIND_KERNEL : CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
      k.start = static_cast<uint64_t>(f.get("start"));
      k.end = static_cast<uint64_t>(f.get("end"));
      k.deviceId = static_cast<uint32_t>(f.get("deviceId"));
      k.contextId = static_cast<uint32_t>(f.get("contextId"));
      k.streamId = static_cast<uint32_t>(f.get("streamId"));
      k.correlationId = static_cast<uint32_t>(f.get("correlationId"));
      k.gridX = static_cast<int32_t>(f.get("gridX"));
      k.gridY = static_cast<int32_t>(f.get("gridY"));
      k.gridZ = static_cast<int32_t>(f.get("gridZ"));
      k.blockX = static_cast<int32_t>(f.get("blockX"));
      k.blockY = static_cast<int32_t>(f.get("blockY"));
      k.blockZ = static_cast<int32_t>(f.get("blockZ"));
      {
        std::lock_guard<std::mutex> lock(name_storage_mutex());
        name_storage().push_back(a.name);
        k.name = a.name.empty() ? nullptr : name_storage().back().c_str();
      }
      f.check_all_used();
      append(&out, k);
    } else if (a.kind == "memcpy") {
      MemcpyActivity m;
      std::memset(&m, 0, sizeof(m));
      m.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
      fill_copy(&m, f);
      m.copyKind = static_cast<uint8_t>(f.get("copyKind"));
      f.check_all_used();
      append(&out, m);
    } else if (a.kind == "memset") {
      MemsetActivity m;
      std::memset(&m, 0, sizeof(m));
      m.kind = CUPTI_ACTIVITY_KIND_MEMSET;
      fill_copy(&m, f);
      m.value = static_cast<uint32_t>(f.get("value"));
      f.check_all_used();
      append(&out, m);
    } else if (a.kind == "runtime" || a.kind == "driver") {
      ApiActivity api;
      std::memset(&api, 0, sizeof(api));
      api.kind = a.kind == "runtime" ? CUPTI_ACTIVITY_KIND_RUNTIME : CUPTI_ACTIVITY_KIND_DRIVER;
      api.cbid = static_cast<CUpti_CallbackId>(f.get("cbid"));
      api.start = static_cast<uint64_t>(f.get("start"));
      api.end = static_cast<uint64_t>(f.get("end"));
      api.processId = static_cast<uint32_t>(f.get("processId"));
      api.threadId = static_cast<uint32_t>(f.get("threadId"));
      api.correlationId = static_cast<uint32_t>(f.get("correlationId"));
      api.returnValue = static_cast<uint32_t>(f.get("returnValue"));
      f.check_all_used();
      append(&out, api);
    } else if (a.kind == "external_correlation") {
      ExternalCorrelationActivity e;
      std::memset(&e, 0, sizeof(e));
      e.kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
      e.externalKind = static_cast<CUpti_ExternalCorrelationKind>(f.get("externalKind"));
      e.externalId = static_cast<uint64_t>(f.get("externalId"));
      e.correlationId = static_cast<uint32_t>(f.get("correlationId"));
      f.check_all_used();
      append(&out, e);
    } else if (a.kind == "name") {
      CUpti_ActivityName n;
      std::memset(&n, 0, sizeof(n));
      n.kind = CUPTI_ACTIVITY_KIND_NAME;
      f.check_all_used();
      append(&out, n);
    } else {
      throw std::invalid_argument("unknown synthetic activity kind '" + a.kind + "'");
    }
  }
  return out;
}

std::size_t activity_record_size(const std::string& kind) {
  if (kind == "concurrent_kernel" || kind == "kernel") return sizeof(KernelActivity);
  if (kind == "memcpy") return sizeof(MemcpyActivity);
  if (kind == "memset") return sizeof(MemsetActivity);
  if (kind == "runtime" || kind == "driver") return sizeof(ApiActivity);
  if (kind == "external_correlation") return sizeof(ExternalCorrelationActivity);
  if (kind == "name") return sizeof(CUpti_ActivityName);
  throw std::invalid_argument("unknown synthetic activity kind '" + kind + "'");
}

std::vector<std::string> activity_struct_names() {
  return {kKernelActivityName, kMemcpyActivityName, kMemsetActivityName, "CUpti_ActivityAPI",
          "CUpti_ActivityExternalCorrelation"};
}

void queue_activity_buffer(const std::string& bytes) {
  std::lock_guard<std::mutex> lock(fake().mutex);
  fake().pending.push_back(bytes);
}

bool deliver_activity_buffer(const std::string& bytes) {
  CUpti_BuffersCallbackRequestFunc req;
  CUpti_BuffersCallbackCompleteFunc done;
  {
    std::lock_guard<std::mutex> lock(fake().mutex);
    req = fake().request;
    done = fake().complete;
  }
  if (req == nullptr || done == nullptr) return false;
  return deliver(req, done, bytes);
}

void complete_foreign_buffer(const std::string& bytes) {
  // 8-byte aligned storage that is not from the pool.
  std::vector<uint64_t> storage((bytes.size() + 7) / 8 + 1);
  std::memcpy(storage.data(), bytes.data(), bytes.size());
  CuptiController::instance().collector().on_buffer_completed(
      reinterpret_cast<uint8_t*>(storage.data()), storage.size() * 8, bytes.size());
}

Deliverer::Deliverer(std::string bytes, uint64_t repetitions) : bytes_(std::move(bytes)) {
  thread_ = std::thread([this, repetitions] {
    uint64_t n = 0;
    for (uint64_t i = 0; i < repetitions; ++i) {
      if (deliver_activity_buffer(bytes_)) ++n;
    }
    delivered_ = n;
  });
}

Deliverer::~Deliverer() {
  if (thread_.joinable()) thread_.join();
}

uint64_t Deliverer::join() {
  if (thread_.joinable()) thread_.join();
  return delivered_;
}

#endif  // ETS_HAVE_CUPTI

}  // namespace ets::testing
