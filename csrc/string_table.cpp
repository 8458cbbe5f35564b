#include "string_table.h"

#include <cstring>
#include <new>

namespace ets {

namespace {
constexpr std::size_t kArenaBlock = 64 * 1024;
}

StringTable::StringTable() : chunks_(new std::atomic<Entry*>[kMaxChunks]) {
  for (uint32_t i = 0; i < kMaxChunks; ++i) chunks_[i].store(nullptr, std::memory_order_relaxed);
  // Id 0 = "" so that a zero-initialised record means "no name".
  Entry* first = new Entry[std::size_t{1} << kChunkBits];
  first[0] = Entry{"", 0};
  chunks_[0].store(first, std::memory_order_relaxed);
  index_.emplace(std::string_view("", 0), kEmptyId);
  published_.store(1, std::memory_order_release);
}

StringTable::~StringTable() {
  for (uint32_t i = 0; i < kMaxChunks; ++i) delete[] chunks_[i].load(std::memory_order_relaxed);
}

const char* StringTable::store_bytes(std::string_view s) {
  if (s.size() + 1 > kArenaBlock / 4) {  // long names get their own block
    arena_.emplace_back(new char[s.size() + 1]);
    char* p = arena_.back().get();
    std::memcpy(p, s.data(), s.size());
    p[s.size()] = '\0';
    return p;
  }
  if (arena_left_ < s.size() + 1) {
    arena_.emplace_back(new char[kArenaBlock]);
    arena_cursor_ = arena_.back().get();
    arena_left_ = kArenaBlock;
  }
  char* p = arena_cursor_;
  std::memcpy(p, s.data(), s.size());
  p[s.size()] = '\0';
  arena_cursor_ += s.size() + 1;
  arena_left_ -= s.size() + 1;
  return p;
}

uint32_t StringTable::intern(std::string_view name) noexcept {
  if (name.empty()) return kEmptyId;
  try {
    std::lock_guard<std::mutex> lock(write_mutex_);
    auto it = index_.find(name);
    if (it != index_.end()) return it->second;
    const uint32_t id = published_.load(std::memory_order_relaxed);  // only writers change it
    if (id >= kMaxEntries) {
      failures_.fetch_add(1, std::memory_order_relaxed);
      return kEmptyId;
    }
    const uint32_t chunk = id >> kChunkBits;
    Entry* entries = chunks_[chunk].load(std::memory_order_relaxed);
    if (entries == nullptr) {
      entries = new Entry[std::size_t{1} << kChunkBits];
      chunks_[chunk].store(entries, std::memory_order_relaxed);  // published by published_ below
    }
    const char* bytes = store_bytes(name);
    index_.emplace(std::string_view(bytes, name.size()), id);
    entries[id & ((1u << kChunkBits) - 1)] = Entry{bytes, static_cast<uint32_t>(name.size())};
    published_.store(id + 1, std::memory_order_release);
    return id;
  } catch (...) {  // bad_alloc (or a mutex error): never propagate into a callback
    failures_.fetch_add(1, std::memory_order_relaxed);
    return kEmptyId;
  }
}

bool StringTable::lookup(uint32_t id, std::string_view* out) const noexcept {
  if (id >= published_.load(std::memory_order_acquire)) return false;
  const Entry* entries = chunks_[id >> kChunkBits].load(std::memory_order_relaxed);
  const Entry& e = entries[id & ((1u << kChunkBits) - 1)];
  *out = std::string_view(e.data, e.size);
  return true;
}

StringTable& StringTable::global() noexcept {
  // Leaked on purpose: CUPTI may call back during interpreter shutdown.
  static StringTable* table = new StringTable();
  return *table;
}

}  // namespace ets
