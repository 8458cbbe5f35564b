// Standalone stress of ring_buffer.h and string_table.cpp, for ThreadSanitizer (and ASan/UBSan).
// No Python: TSan inside an uninstrumented interpreter reports mostly noise, so the lock-free
// hand-offs are checked here on their own. Built and run by benchmarks/sanitize.sh:
//
//   g++ -std=c++17 -O1 -g -fno-builtin -fsanitize=thread -pthread -Icsrc
//       csrc/tests/ring_buffer_stress.cpp csrc/string_table.cpp -o ring_buffer_stress
//   ./ring_buffer_stress [records per case, default 300000]
//
// Ring: producers (serialised by a producer mutex, as the CUPTI collector does) write records
// whose every byte is a function of a sequence number; consumers (serialised by
// consumer_mutex()) drain them in random batches while an observer thread reads the counters.
// Checked: every record arrives intact (no torn or stale slot), in order, exactly once, or is
// counted as dropped (the ring's counter equals the producers' own list of refused sequence
// numbers); size() stays within [0, capacity]. String table: writers intern overlapping names
// while readers resolve every published id; ids are dense and every name round-trips.
// Exit status 0 when every check passed; a sanitizer report exits non-zero on its own.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ring_buffer.h"
#include "string_table.h"

namespace {

using ets::Record;
using ets::RingBuffer;

std::atomic<int> g_failures{0};

#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      if (g_failures.fetch_add(1) < 20) {                                      \
        std::fprintf(stderr, "FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond); \
        std::fprintf(stderr, __VA_ARGS__);                                     \
        std::fprintf(stderr, "\n");                                            \
      }                                                                        \
    }                                                                          \
  } while (0)

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Rng {
  uint64_t s;
  uint64_t below(uint64_t n) { return (s = mix(s)) % n; }
};

// Record `seq`: every byte is a function of seq, so a torn or stale slot shows. Written field by
// field in place, as the collectors do (one 64-byte memcpy would be inlined by GCC as plain moves
// TSan does not see).
void fill(Record* r, uint64_t seq) {
  const uint64_t a = mix(seq), b = mix(a), c = mix(b), d = mix(c), e = mix(d);
  r->kind = static_cast<uint8_t>(a);
  r->subkind = static_cast<uint8_t>(a >> 8);
  r->device = static_cast<uint16_t>(a >> 16);
  r->correlation_id = static_cast<uint32_t>(a >> 32);
  r->start_ns = static_cast<int64_t>(seq);
  r->end_ns = static_cast<int64_t>(b);
  r->name_id = static_cast<uint32_t>(c);
  r->stream = static_cast<uint32_t>(c >> 32);
  r->context_id = static_cast<uint32_t>(d);
  r->grid_x = static_cast<int32_t>(d >> 32);
  r->bytes = static_cast<int64_t>(e);
  r->block_x = static_cast<int32_t>(e >> 7);
  r->block_y = static_cast<int32_t>(e >> 19);
  r->block_z = static_cast<int32_t>(e >> 31);
  r->reserved = static_cast<uint32_t>(seq >> 32);
}

bool intact(const Record& got, uint64_t* seq) {
  *seq = static_cast<uint64_t>(got.start_ns);
  Record want;
  fill(&want, *seq);
  return std::memcmp(&want, &got, sizeof(Record)) == 0;  // Record has no padding
}

struct RingCase {
  const char* name;
  std::size_t capacity;
  int producers;
  int consumers;
  uint64_t max_batch;    // records a producer claims before one publish (1..max_batch)
  std::size_t max_read;  // records a consumer takes at once (1..max_read)
  int consumer_pause;    // yields between two reads: slower consumers force a full ring
};

void run_ring_case(const RingCase& c, uint64_t total) {
  RingBuffer ring(c.capacity);
  std::mutex producer_mutex;        // guards next_seq, refused and the ring's producer side
  uint64_t next_seq = 0;
  std::vector<uint64_t> refused;    // sequence numbers try_claim() refused, in order
  std::vector<uint64_t> received;   // guarded by ring.consumer_mutex(): the global read order
  received.reserve(total);
  std::atomic<int> producers_left{c.producers};

  std::vector<std::thread> threads;
  for (int p = 0; p < c.producers; ++p) {
    threads.emplace_back([&, p] {
      Rng rng{static_cast<uint64_t>(p) + 1};
      for (;;) {
        {
          std::lock_guard<std::mutex> lock(producer_mutex);
          if (next_seq >= total) break;
          const uint64_t batch = std::min<uint64_t>(1 + rng.below(c.max_batch), total - next_seq);
          for (uint64_t i = 0; i < batch; ++i) {
            const uint64_t seq = next_seq++;
            if (Record* slot = ring.try_claim()) {
              fill(slot, seq);
            } else {
              refused.push_back(seq);
            }
          }
          ring.publish();
        }
        if (rng.below(4) == 0) std::this_thread::yield();
      }
      producers_left.fetch_sub(1, std::memory_order_release);
    });
  }
  for (int q = 0; q < c.consumers; ++q) {
    threads.emplace_back([&, q] {
      Rng rng{static_cast<uint64_t>(q) + 101};
      std::vector<Record> out(c.max_read);
      for (;;) {
        const bool finished = producers_left.load(std::memory_order_acquire) == 0;
        std::size_t n = 0;
        {
          std::lock_guard<std::mutex> lock(ring.consumer_mutex());
          n = ring.readable(1 + rng.below(c.max_read));
          ring.consume(out.data(), n);
          for (std::size_t i = 0; i < n; ++i) {
            uint64_t seq = 0;
            CHECK(intact(out[i], &seq), "record after seq %llu is torn",
                  static_cast<unsigned long long>(received.empty() ? 0 : received.back()));
            received.push_back(seq);
          }
        }
        if (finished && n == 0) break;  // every producer published its last record before
        for (int i = 0; i < c.consumer_pause; ++i) std::this_thread::yield();
      }
    });
  }
  threads.emplace_back([&] {  // observer: the counters anyone may read at any time
    while (producers_left.load(std::memory_order_acquire) != 0) {
      const std::size_t size = ring.size();
      CHECK(size <= ring.capacity(), "size() %zu > capacity %zu", size, ring.capacity());
      const uint64_t consumed = ring.consumed();
      const uint64_t published = ring.published();
      (void)consumed;
      (void)published;
      (void)ring.dropped();
      std::this_thread::yield();
    }
  });
  for (auto& t : threads) t.join();

  // Every sequence number arrived exactly once and in order, or was refused (and counted).
  CHECK(std::is_sorted(refused.begin(), refused.end()), "refused out of order");
  CHECK(std::adjacent_find(received.begin(), received.end(),
                           [](uint64_t a, uint64_t b) { return a >= b; }) == received.end(),
        "records out of order or duplicated");
  std::vector<uint64_t> all;
  all.reserve(total);
  std::merge(received.begin(), received.end(), refused.begin(), refused.end(), std::back_inserter(all));
  bool complete = all.size() == total;
  for (uint64_t i = 0; complete && i < total; ++i) complete = all[i] == i;
  CHECK(complete, "received (%zu) + refused (%zu) is not every sequence number 0..%llu once",
        received.size(), refused.size(), static_cast<unsigned long long>(total - 1));
  CHECK(ring.dropped() == refused.size(), "dropped() %llu != refused %zu",
        static_cast<unsigned long long>(ring.dropped()), refused.size());
  CHECK(ring.published() == received.size() && ring.consumed() == received.size() && ring.size() == 0,
        "published %llu consumed %llu size %zu received %zu",
        static_cast<unsigned long long>(ring.published()),
        static_cast<unsigned long long>(ring.consumed()), ring.size(), received.size());
  std::printf("ring %-28s capacity %5zu: %8zu received, %8zu dropped\n", c.name, ring.capacity(),
              received.size(), refused.size());
}

void run_string_table(uint32_t names) {
  ets::StringTable table;
  const int writers = 2, readers = 2;
  std::vector<std::vector<uint32_t>> ids(writers, std::vector<uint32_t>(names));
  std::atomic<int> writers_left{writers};
  std::vector<std::thread> threads;
  for (int w = 0; w < writers; ++w) {
    threads.emplace_back([&, w] {
      for (uint32_t k = 0; k < names; ++k) {
        const uint32_t n = w == 0 ? k : names - 1 - k;  // overlapping names, opposite orders
        ids[w][n] = table.intern("kernel_" + std::to_string(n) + std::string(n % 97, 'x'));
      }
      writers_left.fetch_sub(1, std::memory_order_release);
    });
  }
  for (int r = 0; r < readers; ++r) {
    threads.emplace_back([&] {
      while (writers_left.load(std::memory_order_acquire) != 0) {
        const uint32_t size = table.size();
        for (uint32_t id = size > 64 ? size - 64 : 1; id < size; ++id) {  // the newest entries
          std::string_view s;
          CHECK(table.lookup(id, &s), "published id %u not found", id);
          CHECK(s.size() > 7 && s.substr(0, 7) == "kernel_", "id %u resolves to a bad name", id);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(table.size() == names + 1, "%u ids for %u names", table.size(), names);
  for (uint32_t n = 0; n < names; ++n) {
    CHECK(ids[0][n] == ids[1][n] && ids[0][n] != 0, "name %u: ids %u and %u", n, ids[0][n], ids[1][n]);
    std::string_view s;
    const std::string expected = "kernel_" + std::to_string(n) + std::string(n % 97, 'x');
    CHECK(table.lookup(ids[0][n], &s) && s == expected, "name %u does not round-trip", n);
  }
  std::printf("string table: %u names interned by %d writers while %d readers resolved\n", names,
              writers, readers);
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t total = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 300000;
  const RingCase cases[] = {
      {"1 producer, 1 consumer", 1024, 1, 1, 64, 256, 0},
      {"slow consumer (drops)", 64, 1, 1, 16, 64, 4},
      {"capacity 1", 1, 1, 1, 3, 2, 0},
      {"2 producers, 2 consumers", 256, 2, 2, 32, 128, 1},
  };
  for (const RingCase& c : cases) run_ring_case(c, total);
  run_string_table(static_cast<uint32_t>(std::min<uint64_t>(total / 10, 50000)));
  if (g_failures.load() != 0) {
    std::fprintf(stderr, "%d check(s) failed\n", g_failures.load());
    return 1;
  }
  std::printf("all checks passed\n");
  return 0;
}
