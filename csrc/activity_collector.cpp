#include "activity_collector.h"

#include <algorithm>
#include <cstdlib>

#include "cupti_records.h"

namespace ets {

// ---------------------------------------------------------------- BufferPool

BufferPool::~BufferPool() {
  if (outstanding() != 0) return;  // CUPTI may still write into them: leak rather than corrupt
  for (uint8_t* b : all_) std::free(b);
}

bool BufferPool::reset(std::size_t size, std::size_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (free_.size() != all_.size()) return false;  // some buffer is outstanding
  if (size == size_ && count == all_.size()) return true;
  for (uint8_t* b : all_) std::free(b);
  all_.clear();
  free_.clear();
  size_ = 0;
  try {
    all_.reserve(count);
    free_.reserve(count);
    const std::size_t rounded = (size + 63) / 64 * 64;
    for (std::size_t i = 0; i < count; ++i) {
      void* p = std::aligned_alloc(64, rounded);
      if (p == nullptr) throw std::bad_alloc();
      all_.push_back(static_cast<uint8_t*>(p));
    }
  } catch (...) {
    for (uint8_t* b : all_) std::free(b);
    all_.clear();
    return false;
  }
  size_ = size;
  free_ = all_;
  return true;
}

uint8_t* BufferPool::acquire() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (free_.empty()) return nullptr;
  uint8_t* b = free_.back();
  free_.pop_back();
  return b;
}

bool BufferPool::owns(const uint8_t* b) const noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::find(all_.begin(), all_.end(), b) != all_.end();
}

bool BufferPool::release(uint8_t* b) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (std::find(all_.begin(), all_.end(), b) == all_.end()) return false;  // not ours
  if (std::find(free_.begin(), free_.end(), b) != free_.end()) return false;  // double release
  free_.push_back(b);  // never reallocates: capacity == all_.size()
  return true;
}

std::size_t BufferPool::outstanding() const noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  return all_.size() - free_.size();
}

#ifdef ETS_HAVE_CUPTI

// ---------------------------------------------------------------- ActivityCollector

void ActivityCollector::attach(std::shared_ptr<RingBuffer> ring) {
  std::shared_ptr<RingBuffer> old;
  {
    std::lock_guard<std::mutex> lock(producer_mutex_);
    old.swap(ring_);
    ring_ = std::move(ring);
    for (auto* c : {&buffers_requested_, &buffers_completed_, &buffers_starved_, &foreign_buffers_,
                    &records_decoded_, &records_skipped_, &buffers_discarded_, &cupti_dropped_,
                    &decode_errors_}) {
      c->store(0, std::memory_order_relaxed);
    }
    last_error_.store("", std::memory_order_relaxed);
  }
  // `old` is released here, outside the lock.
}

std::shared_ptr<RingBuffer> ActivityCollector::ring() const {
  std::lock_guard<std::mutex> lock(producer_mutex_);
  return ring_;
}

void ActivityCollector::on_buffer_requested(uint8_t** buffer, std::size_t* size,
                                            std::size_t* max_records) noexcept {
  buffers_requested_.fetch_add(1, std::memory_order_relaxed);
  uint8_t* b = pool_.acquire();
  if (b == nullptr) {
    buffers_starved_.fetch_add(1, std::memory_order_relaxed);
    last_error_.store("activity buffer pool exhausted (CUPTI drops records)",
                      std::memory_order_relaxed);
    *buffer = nullptr;
    *size = 0;
  } else {
    *buffer = b;
    *size = pool_.buffer_size();
  }
  *max_records = 0;  // fill the buffer
}

void ActivityCollector::on_buffer_completed(uint8_t* buffer, std::size_t /*size*/,
                                            std::size_t valid_size) noexcept {
  if (buffer == nullptr) return;
  buffers_completed_.fetch_add(1, std::memory_order_relaxed);
  if (!pool_.owns(buffer)) {
    foreign_buffers_.fetch_add(1, std::memory_order_relaxed);
    last_error_.store("received an activity buffer another CUPTI client requested",
                      std::memory_order_relaxed);
  } else {
    {
      std::lock_guard<std::mutex> lock(producer_mutex_);
      if (ring_ != nullptr) {
        decode_buffer_locked(*ring_, buffer, valid_size);
      } else if (valid_size > 0) {
        buffers_discarded_.fetch_add(1, std::memory_order_relaxed);
      }
    }
    pool_.release(buffer);
  }
  collect_cupti_dropped();
}

void ActivityCollector::collect_cupti_dropped() noexcept {
  const CuptiApi* api = api_.load(std::memory_order_acquire);
  if (api == nullptr || api->activityGetNumDroppedRecords == nullptr) return;
  std::size_t dropped = 0;
  if (api->activityGetNumDroppedRecords(nullptr, 0, &dropped) == CUPTI_SUCCESS && dropped > 0) {
    cupti_dropped_.fetch_add(dropped, std::memory_order_relaxed);
  }
}

void ActivityCollector::decode_buffer_locked(RingBuffer& ring, uint8_t* buffer,
                                             std::size_t valid_size) noexcept {
  const CuptiApi* api = api_.load(std::memory_order_acquire);
  if (api == nullptr || api->activityGetNextRecord == nullptr || valid_size == 0) return;
  CUpti_Activity* record = nullptr;
  std::size_t n = 0;
  for (;;) {
    const CUptiResult r = api->activityGetNextRecord(buffer, valid_size, &record);
    if (r == CUPTI_ERROR_MAX_LIMIT_REACHED) break;
    if (r != CUPTI_SUCCESS) {  // incomplete or invalid record: the rest of the buffer is unusable
      decode_errors_.fetch_add(1, std::memory_order_relaxed);
      last_error_.store("cuptiActivityGetNextRecord failed inside a buffer",
                        std::memory_order_relaxed);
      break;
    }
    decode_record(ring, record);
    if ((++n & 255) == 0) ring.publish();  // let the consumer see long buffers progressively
  }
  ring.publish();
}

namespace {
inline uint16_t device_id(uint32_t id) noexcept {
  return id >= kNoDevice ? kNoDevice : static_cast<uint16_t>(id);
}
}  // namespace

void ActivityCollector::decode_record(RingBuffer& ring, const CUpti_Activity* a) noexcept {
  switch (a->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* k = reinterpret_cast<const KernelActivity*>(a);
      Record* r = ring.try_claim();
      if (r == nullptr) return;  // counted by the ring
      RingBuffer::clear_slot(r);
      r->kind = static_cast<uint8_t>(RecordKind::kKernel);
      r->device = device_id(k->deviceId);
      r->correlation_id = k->correlationId;
      r->start_ns = static_cast<int64_t>(k->start);
      r->end_ns = static_cast<int64_t>(k->end);
      r->stream = k->streamId;
      r->context_id = k->contextId;
      r->grid_x = k->gridX;
      r->grid_yz[0] = k->gridY;
      r->grid_yz[1] = k->gridZ;
      r->block_x = k->blockX;
      r->block_y = k->blockY;
      r->block_z = k->blockZ;
      r->name_id = k->name != nullptr ? names_.intern(k->name) : StringTable::kEmptyId;
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* m = reinterpret_cast<const MemcpyActivity*>(a);
      Record* r = ring.try_claim();
      if (r == nullptr) return;
      RingBuffer::clear_slot(r);
      r->kind = static_cast<uint8_t>(RecordKind::kMemcpy);
      r->subkind = m->copyKind;
      r->device = device_id(m->deviceId);
      r->correlation_id = m->correlationId;
      r->start_ns = static_cast<int64_t>(m->start);
      r->end_ns = static_cast<int64_t>(m->end);
      r->bytes = static_cast<int64_t>(m->bytes);
      r->stream = m->streamId;
      r->context_id = m->contextId;
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* m = reinterpret_cast<const MemsetActivity*>(a);
      Record* r = ring.try_claim();
      if (r == nullptr) return;
      RingBuffer::clear_slot(r);
      r->kind = static_cast<uint8_t>(RecordKind::kMemset);
      r->device = device_id(m->deviceId);
      r->correlation_id = m->correlationId;
      r->start_ns = static_cast<int64_t>(m->start);
      r->end_ns = static_cast<int64_t>(m->end);
      r->bytes = static_cast<int64_t>(m->bytes);
      r->stream = m->streamId;
      r->context_id = m->contextId;
      break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: {
      const auto* api = reinterpret_cast<const ApiActivity*>(a);
      Record* r = ring.try_claim();
      if (r == nullptr) return;
      RingBuffer::clear_slot(r);
      r->kind = static_cast<uint8_t>(a->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? RecordKind::kRuntime
                                                                             : RecordKind::kDriver);
      r->device = kNoDevice;
      r->cbid = api->cbid;
      r->correlation_id = api->correlationId;
      r->start_ns = static_cast<int64_t>(api->start);
      r->end_ns = static_cast<int64_t>(api->end);
      r->thread_id = api->threadId;
      break;
    }
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
      const auto* e = reinterpret_cast<const ExternalCorrelationActivity*>(a);
      Record* r = ring.try_claim();
      if (r == nullptr) return;
      RingBuffer::clear_slot(r);
      r->kind = static_cast<uint8_t>(RecordKind::kExternalCorrelation);
      r->subkind = static_cast<uint8_t>(e->externalKind);
      r->device = kNoDevice;
      r->correlation_id = e->correlationId;
      r->external_id = e->externalId;
      break;
    }
    default:
      records_skipped_.fetch_add(1, std::memory_order_relaxed);
      return;
  }
  records_decoded_.fetch_add(1, std::memory_order_relaxed);
}

CollectorStats ActivityCollector::stats() const {
  CollectorStats s;
  s.buffers_requested = buffers_requested_.load(std::memory_order_relaxed);
  s.buffers_completed = buffers_completed_.load(std::memory_order_relaxed);
  s.buffers_starved = buffers_starved_.load(std::memory_order_relaxed);
  s.foreign_buffers = foreign_buffers_.load(std::memory_order_relaxed);
  s.records_decoded = records_decoded_.load(std::memory_order_relaxed);
  s.records_skipped = records_skipped_.load(std::memory_order_relaxed);
  s.buffers_discarded = buffers_discarded_.load(std::memory_order_relaxed);
  s.cupti_dropped = cupti_dropped_.load(std::memory_order_relaxed);
  s.decode_errors = decode_errors_.load(std::memory_order_relaxed);
  s.buffers_outstanding = pool_.outstanding();
  if (auto ring = this->ring()) s.ring_dropped = ring->dropped();
  return s;
}

#endif  // ETS_HAVE_CUPTI

}  // namespace ets
