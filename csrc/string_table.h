// Interned names (kernel names, op names) <-> dense uint32 ids.
//
// Locking contract:
// - intern() takes `write_mutex_` for one hash lookup and, for a new name, one insert plus a copy
//   of the bytes. Nothing else ever runs under that mutex (no Python, no I/O, no CUDA), so a CUPTI
//   callback that interns waits at most for another intern() call.
// - Reads (size, lookup) take no lock: entries are append-only and immutable once published;
//   `published_` is stored with release after the entry is complete and loaded with acquire by
//   readers, and entry storage (chunks, string bytes) never moves or is freed before destruction.
//   Python resolving millions of ids therefore never blocks a callback.
// - Id 0 is reserved for "" (no name). intern() never throws; on allocation failure or when the
//   table is full it returns 0 and counts the failure.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ets {

class StringTable {
 public:
  static constexpr uint32_t kEmptyId = 0;
  static constexpr uint32_t kChunkBits = 12;  // 4096 entries per chunk
  static constexpr uint32_t kMaxChunks = 4096;
  static constexpr uint32_t kMaxEntries = kMaxChunks << kChunkBits;  // 16.7 M names

  StringTable();
  ~StringTable();
  StringTable(const StringTable&) = delete;
  StringTable& operator=(const StringTable&) = delete;

  // Thread-safe. Returns the id of `name`, adding it if new. Never throws.
  uint32_t intern(std::string_view name) noexcept;

  // Lock-free. Number of published ids (ids are 0 .. size()-1).
  uint32_t size() const noexcept { return published_.load(std::memory_order_acquire); }

  // Lock-free. False if `id` is not (yet) published.
  bool lookup(uint32_t id, std::string_view* out) const noexcept;

  uint64_t failures() const noexcept { return failures_.load(std::memory_order_relaxed); }

  // The table the CUPTI collector interns into; lives for the whole process.
  static StringTable& global() noexcept;

 private:
  struct Entry {
    const char* data;
    uint32_t size;
  };
  const char* store_bytes(std::string_view s);  // under write_mutex_; may throw bad_alloc

  std::mutex write_mutex_;                                // guards index_, arena_, arena_left_
  std::unordered_map<std::string_view, uint32_t> index_;  // views into arena storage
  std::vector<std::unique_ptr<char[]>> arena_;
  char* arena_cursor_ = nullptr;
  std::size_t arena_left_ = 0;

  std::unique_ptr<std::atomic<Entry*>[]> chunks_;  // chunk directory, fixed size kMaxChunks
  std::atomic<uint32_t> published_{0};
  std::atomic<uint64_t> failures_{0};
};

}  // namespace ets
