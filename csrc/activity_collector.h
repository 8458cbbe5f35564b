// ActivityCollector: the collector logic. Owns the preallocated activity buffers (BufferPool),
// serves CUPTI's buffer requests, and decodes completed buffers into ring records.
//
// Callback rules (they run on CUPTI's worker thread and on whichever thread calls flush):
// no exceptions, no allocation except interning a new kernel name (failure -> name id 0, counted),
// no CUDA calls, no exit(). Errors become counters and `last_error()` (a static string).
//
// Locks, in the only order they are ever taken:
//   producer_mutex_  (serialises the ring's producers: concurrent buffer-completed callbacks and
//                     attach/detach of the ring; held while one buffer is decoded)
//   -> StringTable write mutex (one intern)
//   BufferPool::mutex_ (O(1) free-list push/pop; taken alone)
// Python-side consumers never take any of them (the ring's consumer mutex is separate), so a
// callback never waits for Python. The CUPTI dropped-record count is read after producer_mutex_
// is released.
//
// Buffer ownership: every buffer in the pool is owned by the pool for the life of the process
// (or until reset() with none outstanding). A buffer handed to CUPTI is "outstanding" until CUPTI
// returns it in a completed callback. Buffers the pool does not own (handed to another client
// before we registered our callbacks) are neither decoded nor freed: they are counted and left
// alone.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "cupti_api.h"
#include "ring_buffer.h"
#include "string_table.h"

namespace ets {

class BufferPool {
 public:
  BufferPool() = default;
  ~BufferPool();  // frees only when nothing is outstanding, else leaks on purpose
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // (Re)allocates `count` buffers of `size` bytes, 64-byte aligned (CUPTI needs 8). Refuses (false)
  // while buffers are outstanding or when memory is short. Not for callbacks.
  bool reset(std::size_t size, std::size_t count);

  uint8_t* acquire() noexcept;        // nullptr when every buffer is outstanding
  bool release(uint8_t* b) noexcept;  // false (and no effect) if `b` is not ours
  bool owns(const uint8_t* b) const noexcept;

  std::size_t buffer_size() const noexcept { return size_; }
  std::size_t count() const noexcept { return all_.size(); }
  std::size_t outstanding() const noexcept;

 private:
  mutable std::mutex mutex_;   // guards all_, free_, size_; held for O(count) at most
  std::vector<uint8_t*> all_;  // owned
  std::vector<uint8_t*> free_;  // capacity == all_.size(), so push_back never allocates
  std::size_t size_ = 0;
};

struct CollectorStats {
  uint64_t buffers_requested = 0;
  uint64_t buffers_completed = 0;
  uint64_t buffers_starved = 0;    // requests refused: every pool buffer outstanding
  uint64_t foreign_buffers = 0;    // completed buffers we did not hand out (left alone)
  uint64_t records_decoded = 0;    // records written to the ring
  uint64_t records_skipped = 0;    // activity kinds we do not decode
  uint64_t buffers_discarded = 0;  // completed while no ring was attached
  uint64_t ring_dropped = 0;       // ring full (the attached ring's counter)
  uint64_t cupti_dropped = 0;      // CUPTI had no buffer space (cuptiActivityGetNumDroppedRecords)
  uint64_t decode_errors = 0;      // cuptiActivityGetNextRecord failed mid-buffer
  uint64_t buffers_outstanding = 0;
};

#ifdef ETS_HAVE_CUPTI

class ActivityCollector {
 public:
  explicit ActivityCollector(StringTable& names) : names_(names) {}

  // The CUPTI entry points used while decoding (next record, dropped count). Set before callbacks
  // can arrive; the table it points to must outlive the collector.
  void set_api(const CuptiApi* api) noexcept { api_.store(api, std::memory_order_release); }

  // Records go to `ring` from now on (nullptr: discard). Resets the per-session counters.
  void attach(std::shared_ptr<RingBuffer> ring);
  std::shared_ptr<RingBuffer> ring() const;

  BufferPool& pool() noexcept { return pool_; }

  // CUPTI buffer callbacks, forwarded by the static trampolines. Tests call them directly.
  void on_buffer_requested(uint8_t** buffer, std::size_t* size, std::size_t* max_records) noexcept;
  void on_buffer_completed(uint8_t* buffer, std::size_t size, std::size_t valid_size) noexcept;

  // Adds CUPTI's dropped-record count (call outside producer_mutex_).
  void collect_cupti_dropped() noexcept;

  CollectorStats stats() const;
  const char* last_error() const noexcept { return last_error_.load(std::memory_order_relaxed); }

 private:
  void decode_buffer_locked(RingBuffer& ring, uint8_t* buffer, std::size_t valid_size) noexcept;
  void decode_record(RingBuffer& ring, const CUpti_Activity* record) noexcept;

  StringTable& names_;
  std::atomic<const CuptiApi*> api_{nullptr};
  BufferPool pool_;

  mutable std::mutex producer_mutex_;  // guards ring_ and the ring's producer side
  std::shared_ptr<RingBuffer> ring_;

  std::atomic<uint64_t> buffers_requested_{0}, buffers_completed_{0}, buffers_starved_{0},
      foreign_buffers_{0}, records_decoded_{0}, records_skipped_{0}, buffers_discarded_{0},
      cupti_dropped_{0}, decode_errors_{0};
  std::atomic<const char*> last_error_{""};  // always a string literal
};

#endif  // ETS_HAVE_CUPTI

}  // namespace ets
