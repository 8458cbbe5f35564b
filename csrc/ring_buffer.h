// Single-producer / single-consumer lock-free ring of fixed-size `Record`s.
//
// SPSC invariant: at any moment at most one thread runs producer methods (try_claim, publish) and
// at most one thread runs consumer methods (readable, consume). Callers that may have several
// producers (the CUPTI collector: the CUPTI worker thread and a thread calling flush()) serialise
// them with their own producer lock; consumers are serialised by `consumer_mutex()`. Producers
// never take the consumer mutex and consumers never take any producer lock, so a producer never
// waits for Python and never blocks: when the ring is full the record is dropped and counted.
//
// Positions are monotonically increasing 64-bit counters (they never wrap in practice); the slot
// of position p is p & mask_. Memory orderings:
// - head_ (published write position): stored by the producer with release after the slot bytes
//   are written; loaded by the consumer with acquire before it reads those slots.
// - tail_ (read position): stored by the consumer with release after it finished copying slots
//   out; loaded by the producer with acquire before it reuses those slots.
// - dropped_ / published_: written by the producer only, read anywhere, relaxed (statistics).
// The producer keeps private copies (claim_, cached_tail_) and refreshes cached_tail_ only when
// the ring looks full, so the steady-state push touches no shared cache line but its own slot
// and, at publish time, head_.
//
// The capacity is fixed at construction (rounded up to a power of two) and never grows.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>

#include "record.h"

namespace ets {

class RingBuffer {
 public:
  static constexpr std::size_t kMaxCapacity = std::size_t{1} << 28;  // 23.6 GB of records

  // Throws std::invalid_argument for 0 or > kMaxCapacity, std::bad_alloc if memory is short.
  explicit RingBuffer(std::size_t min_capacity) {
    if (min_capacity == 0 || min_capacity > kMaxCapacity) {
      throw std::invalid_argument("ring capacity must be in [1, " + std::to_string(kMaxCapacity) +
                                  "], got " + std::to_string(min_capacity));
    }
    std::size_t cap = 1;
    while (cap < min_capacity) cap <<= 1;
    capacity_ = cap;
    mask_ = cap - 1;
    void* mem = std::aligned_alloc(64, ((cap * sizeof(Record) + 63) / 64) * 64);
    if (mem == nullptr) throw std::bad_alloc();
    slots_ = static_cast<Record*>(mem);
  }
  ~RingBuffer() { std::free(slots_); }
  RingBuffer(const RingBuffer&) = delete;
  RingBuffer& operator=(const RingBuffer&) = delete;

  std::size_t capacity() const noexcept { return capacity_; }

  // ---- producer side (one thread at a time) ----

  // Returns the next free slot, to be filled in place, or nullptr when the ring is full (the drop
  // is counted). The slot becomes visible to the consumer at the next publish(). All fields the
  // caller does not set keep stale bytes: use clear_slot() when not writing every field.
  Record* try_claim() noexcept {
    if (claim_ - cached_tail_ >= capacity_) {
      cached_tail_ = tail_.load(std::memory_order_acquire);
      if (claim_ - cached_tail_ >= capacity_) {
        dropped_.store(dropped_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
        return nullptr;
      }
    }
    return &slots_[claim_++ & mask_];
  }

  static void clear_slot(Record* r) noexcept { std::memset(static_cast<void*>(r), 0, sizeof(Record)); }

  // Makes every claimed slot visible to the consumer.
  void publish() noexcept {
    published_.store(claim_, std::memory_order_relaxed);
    head_.store(claim_, std::memory_order_release);
  }

  // ---- consumer side (hold consumer_mutex() if more than one thread may consume) ----

  // Number of records the consumer can read now, at most `max_records`.
  std::size_t readable(std::size_t max_records = SIZE_MAX) const noexcept {
    const uint64_t head = head_.load(std::memory_order_acquire);
    const uint64_t tail = tail_.load(std::memory_order_relaxed);  // consumer-owned
    return static_cast<std::size_t>(std::min<uint64_t>(head - tail, max_records));
  }

  // Copies the next `n` records (n <= readable()) to `out` (one memcpy per contiguous segment)
  // and frees their slots.
  void consume(Record* out, std::size_t n) noexcept {
    if (n == 0) return;
    const uint64_t tail = tail_.load(std::memory_order_relaxed);
    const std::size_t first = static_cast<std::size_t>(tail & mask_);
    const std::size_t n1 = std::min(n, capacity_ - first);
    std::memcpy(static_cast<void*>(out), &slots_[first], n1 * sizeof(Record));
    if (n > n1) std::memcpy(static_cast<void*>(out + n1), &slots_[0], (n - n1) * sizeof(Record));
    tail_.store(tail + n, std::memory_order_release);
  }

  // Readable now (approximate when called off the consumer thread), in [0, capacity()]. tail_ is
  // loaded first: head_ only grows and never trails tail_, so head - tail cannot underflow even
  // while a consumer advances tail_ between the two loads (head first could read an older head
  // than a newer tail: ~2^64); what was consumed in between may overstate it, hence the clamp.
  std::size_t size() const noexcept {
    const uint64_t tail = tail_.load(std::memory_order_acquire);
    const uint64_t head = head_.load(std::memory_order_acquire);
    return static_cast<std::size_t>(std::min<uint64_t>(head - tail, capacity_));
  }
  uint64_t dropped() const noexcept { return dropped_.load(std::memory_order_relaxed); }
  uint64_t published() const noexcept { return published_.load(std::memory_order_relaxed); }
  uint64_t consumed() const noexcept { return tail_.load(std::memory_order_relaxed); }

  std::mutex& consumer_mutex() noexcept { return consumer_mutex_; }

 private:
  Record* slots_ = nullptr;
  std::size_t capacity_ = 0;
  std::size_t mask_ = 0;

  alignas(64) std::atomic<uint64_t> head_{0};  // producer -> consumer (release/acquire)
  alignas(64) std::atomic<uint64_t> tail_{0};  // consumer -> producer (release/acquire)
  alignas(64) uint64_t claim_ = 0;             // producer-private: next position to claim
  uint64_t cached_tail_ = 0;                   // producer-private: last tail_ seen
  std::atomic<uint64_t> dropped_{0};           // producer writes, anyone reads
  std::atomic<uint64_t> published_{0};         // producer writes, anyone reads
  alignas(64) std::mutex consumer_mutex_;      // serialises consumers; producers never take it
};

}  // namespace ets
