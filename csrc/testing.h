// Test and benchmark entry points (exposed as ets_hook._C._testing). Not used in production paths.
//
// - push_sequence / Producer: C++ producers writing records in place, for ring tests and the
//   throughput benchmark.
// - A fake libcupti function table: installed into the CuptiController in place of the real
//   library, so start/flush/stop and every failure status can be driven on a CPU. Its
//   cuptiActivityFlushAll delivers queued synthetic buffers through the registered buffer
//   callbacks, i.e. the static trampolines and the very decode path CUPTI's worker thread uses.
// - Synthetic activity buffers built from the real header structs (the versions compiled in).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ring_buffer.h"

namespace ets::testing {

// Writes records i = first .. first+count-1 in place (kind kernel, correlation_id = i mod 2^32,
// start_ns = i, end_ns = i + 1, name_id = i mod 1000, grid_x = i mod 1024, ...), publishing every `publish_every` records.
// Returns how many were pushed (the rest were dropped and counted by the ring).
uint64_t push_sequence(RingBuffer& ring, uint64_t first, uint64_t count, uint32_t publish_every);

// The same sequence from a separate thread. wait_when_full=true retries (yielding) instead of
// dropping, so a consumer that keeps up loses nothing.
class Producer {
 public:
  Producer(std::shared_ptr<RingBuffer> ring, uint64_t first, uint64_t count, bool wait_when_full);
  ~Producer();
  uint64_t join();  // records pushed
  bool done() const noexcept { return done_.load(std::memory_order_acquire); }

 private:
  std::shared_ptr<RingBuffer> ring_;
  std::atomic<bool> done_{false};
  uint64_t pushed_ = 0;
  std::thread thread_;
};

#ifdef ETS_HAVE_CUPTI

struct FakeCuptiConfig {
  uint32_t version = 0;  // 0: the compiled-in CUPTI_API_VERSION
  int subscribe_result = 0;
  int register_result = 0;
  int enable_result = 0;
  int enable_fail_kind = -1;  // CUPTI activity kind that fails with enable_result; -1: all
  int flush_result = 0;
  bool driver_ok = true;  // false: keep the real driver check
  uint64_t dropped_records = 0;  // reported once by cuptiActivityGetNumDroppedRecords
  int64_t timestamp_offset_ns = 0;  // fake CUPTI clock = CLOCK_REALTIME + offset
};

void install_fake_cupti(const FakeCuptiConfig& config);
void reset_cupti();  // stops collection, forgets fake/real library and loader options
std::vector<int> fake_enabled_kinds();
int fake_subscriber_count();
std::vector<uint64_t> fake_external_stack();

struct SyntheticActivity {
  std::string kind;  // concurrent_kernel, kernel, memcpy, memset, runtime, driver,
                     // external_correlation, name (a kind the decoder skips)
  std::string name;  // kernels only
  std::map<std::string, int64_t> fields;  // CUPTI struct field names, e.g. gridX, copyKind
};

// Concatenated activity records (8-byte aligned), as CUPTI lays them out in a buffer.
// Throws std::invalid_argument for an unknown kind or field.
std::string build_activity_buffer(const std::vector<SyntheticActivity>& records);
std::size_t activity_record_size(const std::string& kind);
std::vector<std::string> activity_struct_names();

// Delivered through the registered callbacks at the next fake cuptiActivityFlushAll.
void queue_activity_buffer(const std::string& bytes);
// Request + complete now, through the registered callbacks (what CUPTI's worker thread does).
// Returns false when no callbacks are registered or the pool refused a buffer.
bool deliver_activity_buffer(const std::string& bytes);
// Completes a buffer the pool never handed out (another client's).
void complete_foreign_buffer(const std::string& bytes);

// A thread delivering `bytes` `repetitions` times (concurrent producer for the collector).
class Deliverer {
 public:
  Deliverer(std::string bytes, uint64_t repetitions);
  ~Deliverer();
  uint64_t join();  // buffers delivered

 private:
  std::string bytes_;
  uint64_t delivered_ = 0;
  std::thread thread_;
};

#endif  // ETS_HAVE_CUPTI

}  // namespace ets::testing
