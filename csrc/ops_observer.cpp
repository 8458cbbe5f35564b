// ets_hook._ops: an operator observer registered through PyTorch's RecordFunction API.
//
// What it does: while a session is open, a global RecordFunction callback writes one fixed-size
// record when an op (ATen op, autograd node, user annotation, ...) starts and one when it ends,
// on whatever thread it runs, into that thread's own buffer; for the steps that ask for them it
// also writes the op's input shapes and dtypes into a side buffer keyed by the op's handle.
// Python drains the buffers after the window (ets_hook/capture/ops.py interprets them).
//
// Built against the installed torch (libtorch headers and ABI) by ets_hook/capture/native_ops.py,
// with -DNDEBUG (RecordFunction::inputs() asserts outside a start callback without it). It uses
// the CPython C API only (no pybind11), so it never has to exchange objects with ets_hook._C.
//
// Contracts:
// - Hot path (the callbacks): no allocation per event (a thread's first event allocates its
//   buffer, and every kChunkRecords-th event a new chunk, up to the per-thread byte budget; past
//   it records are dropped and counted), no lock but the string table's on a name seen for the
//   first time on this thread, no Python, no exceptions escape (a failing start is caught; its
//   end record still comes and is ignored when unpaired).
// - Buffers: one per recording thread, single producer (that thread), read by drain() from any
//   thread up to the count the producer published (release/acquire). Records are appended only
//   while a session is open; an end callback of an op that started inside the window and ends
//   after stop() (the window ends inside Optimizer.step#...) is still recorded, as its start was.
// - Memory: buffers live for the process (a late end callback may write to them); reset() trims
//   them to one chunk, after waiting for any callback in flight on each of them (busy flag).
// - Scopes: ATen ops, autograd nodes, TorchScript functions and user annotations (what the decode
//   reads); listening to a scope costs PyTorch work each time a thread's RecordFunction state is
//   set (per autograd node), so the others (mobile, static runtime, build features) are left out.
// - Times: CLOCK_REALTIME ns, the clock CUPTI timestamps use on Linux and time.time_ns().
// - Correlation: when the Python side hands in a push/pop pair (a capsule from ets_hook._C), each
//   op start pushes its handle as CUPTI external correlation id and the matching end pops it, so
//   kernels link to the op that launched them.

#include <Python.h>

#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <c10/core/ScalarType.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "string_table.h"

#ifndef ETS_TORCH_VERSION
#define ETS_TORCH_VERSION "unknown"
#endif

namespace {

// ---------------------------------------------------------------------------------------------
// Records

enum : uint8_t { kStart = 1, kEnd = 2 };
enum : uint16_t { kHasInputs = 1, kAsync = 2 };

// 48 bytes. Start records fill every field; end records kind, handle, time_ns, os_tid.
struct OpRecord {
  uint8_t kind;
  uint8_t scope;        // at::RecordScope
  uint16_t flags;       // kHasInputs, kAsync
  uint32_t name_id;     // interned name (start)
  uint64_t handle;      // RecordFunction handle: pairs start and end, keys the inputs
  int64_t time_ns;      // CLOCK_REALTIME
  int64_t seq_nr;       // autograd sequence number (start; -1 when none)
  uint64_t fwd_thread;  // RecordFunction thread id of the forward op (backward nodes; else 0)
  uint32_t rf_thread;   // RecordFunction thread id of this op's thread
  uint32_t os_tid;      // gettid() of the recording thread
};
static_assert(sizeof(OpRecord) == 48, "OpRecord layout is part of the Python contract");

struct Field {
  const char* name;
  const char* format;
  std::size_t offset;
};
#define ETS_OP_FIELD(f, fmt) Field{#f, fmt, offsetof(OpRecord, f)}
const Field kFields[] = {
    ETS_OP_FIELD(kind, "u1"),        ETS_OP_FIELD(scope, "u1"),      ETS_OP_FIELD(flags, "<u2"),
    ETS_OP_FIELD(name_id, "<u4"),    ETS_OP_FIELD(handle, "<u8"),    ETS_OP_FIELD(time_ns, "<i8"),
    ETS_OP_FIELD(seq_nr, "<i8"),     ETS_OP_FIELD(fwd_thread, "<u8"), ETS_OP_FIELD(rf_thread, "<u4"),
    ETS_OP_FIELD(os_tid, "<u4"),
};
#undef ETS_OP_FIELD

// Input codes in the side buffer: a ScalarType (>= 0) for a defined tensor, else one of these.
enum : int64_t { kScalar = -1, kTensorList = -2, kScalarList = -3, kOther = -4 };
// Fills the tail of an inputs chunk that the next op's inputs did not fit in (never a handle).
constexpr int64_t kPadWord = INT64_MIN;

// ---------------------------------------------------------------------------------------------
// Per-thread buffers

// Append-only chunked log of T with one producer; readers see the first `published` items.
template <typename T, std::size_t kChunkItems>
class ChunkedLog {
 public:
  static constexpr std::size_t kMaxChunks = 4096;
  static constexpr std::size_t chunk_items_ = kChunkItems;
  static_assert((kChunkItems & (kChunkItems - 1)) == 0, "a power of two: / and % are shifts");

  // `pad` fills the unused tail of a chunk when a multi-item slot does not fit in it.
  explicit ChunkedLog(T pad) : pad_(pad) {
    for (auto& c : chunks_) c.store(nullptr, std::memory_order_relaxed);
  }
  ~ChunkedLog() {
    for (auto& c : chunks_) delete[] c.load(std::memory_order_relaxed);
  }

  // Producer: a slot for `n` contiguous items, or nullptr (chunk limit, budget or allocation).
  // The caller fills it and then calls publish(n).
  T* reserve(std::size_t n, std::size_t* bytes_budget) noexcept {
    if (n > chunk_items_) return nullptr;
    std::size_t chunk = written_ / chunk_items_;
    std::size_t offset = written_ % chunk_items_;
    if (offset + n > chunk_items_) {  // does not fit: pad this chunk's tail, go to the next
      T* tail = chunks_[chunk].load(std::memory_order_relaxed);
      if (tail != nullptr) std::fill(tail + offset, tail + chunk_items_, pad_);
      ++chunk;
      offset = 0;
    }
    if (chunk >= kMaxChunks) return nullptr;
    T* base = chunks_[chunk].load(std::memory_order_relaxed);
    if (base == nullptr) {
      const std::size_t bytes = chunk_items_ * sizeof(T);
      if (*bytes_budget < bytes) return nullptr;
      base = new (std::nothrow) T[chunk_items_];
      if (base == nullptr) return nullptr;
      *bytes_budget -= bytes;
      chunks_[chunk].store(base, std::memory_order_release);
    }
    pending_ = chunk * chunk_items_ + offset + n;
    return base + offset;
  }
  void publish() noexcept {
    written_ = pending_;
    published_.store(written_, std::memory_order_release);
  }

  // Reader: copy the published items (pad items included: readers skip them).
  std::size_t published() const noexcept { return published_.load(std::memory_order_acquire); }
  void copy_to(T* out, std::size_t count) const noexcept {
    std::size_t done = 0;
    for (std::size_t c = 0; done < count; ++c) {
      const T* base = chunks_[c].load(std::memory_order_acquire);
      const std::size_t take = std::min(chunk_items_, count - done);
      std::memcpy(out + done, base, take * sizeof(T));
      done += take;
    }
  }

  // Only with no producer running: forget everything, keep the first chunk.
  std::size_t reset() noexcept {
    std::size_t freed = 0;
    for (std::size_t c = 1; c < kMaxChunks; ++c) {
      T* base = chunks_[c].exchange(nullptr, std::memory_order_acq_rel);
      if (base != nullptr) {
        delete[] base;
        freed += chunk_items_ * sizeof(T);
      }
    }
    written_ = pending_ = 0;
    published_.store(0, std::memory_order_release);
    return freed;
  }
  std::size_t allocated_bytes() const noexcept {
    std::size_t n = 0;
    for (const auto& c : chunks_) n += c.load(std::memory_order_relaxed) ? chunk_items_ * sizeof(T) : 0;
    return n;
  }

 private:
  const T pad_;
  std::atomic<T*> chunks_[kMaxChunks];
  std::size_t written_ = 0;  // producer only
  std::size_t pending_ = 0;  // producer only
  std::atomic<std::size_t> published_{0};
};

constexpr std::size_t kChunkRecords = 8192;       // 384 KiB of events per chunk
constexpr std::size_t kChunkInputWords = 32768;   // 256 KiB of input words per chunk
constexpr std::size_t kMaxInputWords = 4096;      // one op's inputs (longer: recorded as none)
constexpr int kCorrelationDepth = 256;

struct CorrelationApi;

// Handles this thread pushed as external correlation ids, innermost last, with the API each was
// pushed through: the end of an op that outlives stop() still pops what its start pushed.
struct Pushed {
  uint64_t handle;
  const CorrelationApi* api;
};

// Interned name ids cached per thread: by the name's pointer (checked against the interned
// bytes: RecordFunction names are not stable pointers), then by the name's bytes (autograd
// nodes' names live in a fresh string each time), before the shared table and its lock.
struct NameCacheEntry {
  const char* key = nullptr;
  const char* interned = nullptr;
  uint32_t id = 0;
};
constexpr std::size_t kNameCache = 1024;

struct ThreadBuffer {
  explicit ThreadBuffer(uint32_t tid) : os_tid(tid), events(OpRecord{}), inputs(kPadWord) {}
  const uint32_t os_tid;
  ChunkedLog<OpRecord, kChunkRecords> events;
  ChunkedLog<int64_t, kChunkInputWords> inputs;
  NameCacheEntry names_by_pointer[kNameCache];
  NameCacheEntry names_by_bytes[kNameCache];
  Pushed pushed[kCorrelationDepth];
  int pushed_depth = 0;
  std::size_t budget_bytes = 0;                  // producer (and reset, with no producer)
  std::atomic<uint64_t> dropped{0};
  std::atomic<int> busy{0};                      // a callback of this thread is running
};

std::mutex g_threads_mutex;                      // guards g_threads (registration, drain, reset)
std::vector<std::unique_ptr<ThreadBuffer>> g_threads;
std::atomic<bool> g_accepting{false};
std::atomic<std::size_t> g_thread_budget{std::size_t{256} << 20};
at::CallbackHandle g_handle = at::INVALID_CALLBACK_HANDLE;
bool g_with_inputs = false;

// CUPTI external correlation, handed in by Python as a capsule of ets_hook._C (may be null).
struct CorrelationApi {
  bool (*push)(uint64_t);
  bool (*pop)();
};
std::atomic<const CorrelationApi*> g_correlation{nullptr};

// The callbacks' one thread-local access (each one costs a __tls_get_addr call in a dlopen'ed
// module): everything else per thread hangs off this buffer.
thread_local ThreadBuffer* t_buffer = nullptr;

ets::StringTable& names() {
  static ets::StringTable* table = new ets::StringTable();  // never destroyed: callbacks may run late
  return *table;
}

ThreadBuffer* new_thread_buffer() noexcept {
  try {
    auto buffer = std::make_unique<ThreadBuffer>(static_cast<uint32_t>(syscall(SYS_gettid)));
    std::lock_guard<std::mutex> lock(g_threads_mutex);
    buffer->budget_bytes = g_thread_budget.load(std::memory_order_relaxed);
    t_buffer = buffer.get();
    g_threads.push_back(std::move(buffer));
  } catch (...) {
    return nullptr;
  }
  return t_buffer;
}

inline ThreadBuffer* thread_buffer() noexcept {
  ThreadBuffer* b = t_buffer;
  return b != nullptr ? b : new_thread_buffer();
}

inline int64_t now_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Interned name id (see NameCacheEntry): pointer cache, then bytes cache, then the shared table.
uint32_t intern(ThreadBuffer* b, const char* name) noexcept {
  if (name == nullptr) return 0;
  NameCacheEntry& by_pointer = b->names_by_pointer[(reinterpret_cast<uintptr_t>(name) >> 3) % kNameCache];
  if (by_pointer.key == name && std::strcmp(by_pointer.interned, name) == 0) return by_pointer.id;
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over the bytes
  for (const char* c = name; *c != 0; ++c) hash = (hash ^ static_cast<unsigned char>(*c)) * 1099511628211ull;
  NameCacheEntry& by_bytes = b->names_by_bytes[hash % kNameCache];
  if (by_bytes.interned != nullptr && std::strcmp(by_bytes.interned, name) == 0) {
    by_pointer = NameCacheEntry{name, by_bytes.interned, by_bytes.id};
    return by_bytes.id;
  }
  const uint32_t id = names().intern(std::string_view(name));
  std::string_view stored;
  if (id != 0 && names().lookup(id, &stored)) {
    // The table stores a NUL after each name and never moves or frees it.
    by_bytes = NameCacheEntry{nullptr, stored.data(), id};
    by_pointer = NameCacheEntry{name, stored.data(), id};
  }
  return id;
}

// Appends the op's inputs as [handle, n_words, (code, ndim, dims...)...] to the side buffer.
bool record_inputs(ThreadBuffer* b, const at::RecordFunction& fn, uint64_t handle) {
  int64_t scratch[kMaxInputWords];
  std::size_t n = 2;
  for (const c10::IValue& value : fn.inputs()) {
    if (n + 2 > kMaxInputWords) return false;
    if (value.isTensor()) {
      const at::Tensor& t = value.toTensor();
      if (!t.defined() || t.is_nested() ||
          t.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
        scratch[n++] = kOther;
        scratch[n++] = 0;
        continue;
      }
      const auto sizes = t.sizes();
      if (n + 2 + sizes.size() > kMaxInputWords) return false;
      scratch[n++] = static_cast<int64_t>(t.scalar_type());
      scratch[n++] = static_cast<int64_t>(sizes.size());
      for (int64_t d : sizes) scratch[n++] = d;
    } else {
      scratch[n++] = value.isScalar()      ? kScalar
                     : value.isTensorList() ? kTensorList
                     : (value.isIntList() || value.isDoubleList() || value.isBoolList()) ? kScalarList
                                                                                       : kOther;
      scratch[n++] = 0;
    }
  }
  scratch[0] = static_cast<int64_t>(handle);
  scratch[1] = static_cast<int64_t>(n);
  int64_t* slot = b->inputs.reserve(n, &b->budget_bytes);
  if (slot == nullptr) return false;
  std::memcpy(slot, scratch, n * sizeof(int64_t));
  b->inputs.publish();
  return true;
}

// Marks the thread's buffer busy for the callback's duration and checks the session is open;
// the seq_cst pair makes reset()'s "not accepting, then not busy" wait sound (Dekker).
struct BusyScope {
  explicit BusyScope(ThreadBuffer* b) : buffer(b) {
    buffer->busy.store(1, std::memory_order_seq_cst);
    open = g_accepting.load(std::memory_order_seq_cst);
  }
  ~BusyScope() { buffer->busy.store(0, std::memory_order_release); }
  ThreadBuffer* buffer;
  bool open;
};

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  ThreadBuffer* b = thread_buffer();
  if (b == nullptr) return nullptr;
  BusyScope scope(b);
  if (!scope.open) return nullptr;
  try {
    const uint64_t handle = fn.handle();
    uint16_t flags = fn.isAsync() ? kAsync : 0;
    if (fn.needsInputs()) {
      if (record_inputs(b, fn, handle)) {
        flags |= kHasInputs;
      } else {
        b->dropped.fetch_add(1, std::memory_order_relaxed);
      }
    }
    OpRecord* r = b->events.reserve(1, &b->budget_bytes);
    if (r == nullptr) {
      b->dropped.fetch_add(1, std::memory_order_relaxed);
      return nullptr;
    }
    r->kind = kStart;
    r->scope = static_cast<uint8_t>(fn.scope());
    r->flags = flags;
    r->name_id = intern(b, fn.name());
    r->handle = handle;
    r->seq_nr = fn.seqNr();
    r->fwd_thread = fn.forwardThreadId();
    r->rf_thread = static_cast<uint32_t>(fn.threadId());
    r->os_tid = b->os_tid;
    const CorrelationApi* api = g_correlation.load(std::memory_order_acquire);
    if (api != nullptr && b->pushed_depth < kCorrelationDepth && api->push(handle)) {
      b->pushed[b->pushed_depth++] = Pushed{handle, api};
    }
    r->time_ns = now_ns();  // last: the op's own time starts after our bookkeeping
    b->events.publish();
  } catch (...) {
    b->dropped.fetch_add(1, std::memory_order_relaxed);
  }
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  const int64_t t = now_ns();  // first: our bookkeeping is not the op's time
  ThreadBuffer* b = thread_buffer();
  if (b == nullptr) return;
  const uint64_t handle = fn.handle();
  if (b->pushed_depth > 0 && b->pushed[b->pushed_depth - 1].handle == handle) {
    --b->pushed_depth;
    b->pushed[b->pushed_depth].api->pop();
  }
  BusyScope scope(b);
  if (!scope.open) return;
  OpRecord* r = b->events.reserve(1, &b->budget_bytes);
  if (r == nullptr) {
    b->dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  std::memset(r, 0, sizeof(OpRecord));
  r->kind = kEnd;
  r->handle = handle;
  r->time_ns = t;
  r->os_tid = b->os_tid;
  b->events.publish();
}

bool register_callback(bool with_inputs) {
  // Only the scopes the decode reads: every scope a callback listens to costs PyTorch work each
  // time a thread's RecordFunction state is set (the autograd engine does it per node).
  g_handle = at::addGlobalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                                       .needsInputs(with_inputs)
                                       .needsIds(true)
                                       .scopes({at::RecordScope::FUNCTION,
                                                at::RecordScope::BACKWARD_FUNCTION,
                                                at::RecordScope::TORCHSCRIPT_FUNCTION,
                                                at::RecordScope::USER_SCOPE}));
  g_with_inputs = with_inputs;
  return g_handle != at::INVALID_CALLBACK_HANDLE;
}

void unregister_callback() {
  if (g_handle != at::INVALID_CALLBACK_HANDLE) {
    at::removeCallback(g_handle);
    g_handle = at::INVALID_CALLBACK_HANDLE;
  }
}

// ---------------------------------------------------------------------------------------------
// Python module

PyObject* set_error(const char* what) {
  PyErr_SetString(PyExc_RuntimeError, what);
  return nullptr;
}

// Stops accepting late callbacks, waits for those in flight, forgets all records and trims every
// buffer to one chunk. Only with no callback registered. Returns the bytes freed.
std::size_t forget_records() {
  g_accepting.store(false, std::memory_order_seq_cst);
  std::size_t freed = 0;
  Py_BEGIN_ALLOW_THREADS;
  {
    std::lock_guard<std::mutex> lock(g_threads_mutex);
    for (auto& b : g_threads) {
      while (b->busy.load(std::memory_order_seq_cst) != 0) {
      }
      freed += b->events.reset() + b->inputs.reset();
      b->dropped.store(0, std::memory_order_relaxed);
    }
  }
  Py_END_ALLOW_THREADS;
  return freed;
}

// start(with_inputs, thread_budget_bytes, correlation=None): forgets earlier records, registers.
PyObject* py_start(PyObject*, PyObject* args) {
  int with_inputs = 0;
  unsigned long long budget = 0;
  PyObject* capsule = Py_None;
  if (!PyArg_ParseTuple(args, "pK|O", &with_inputs, &budget, &capsule)) return nullptr;
  if (g_handle != at::INVALID_CALLBACK_HANDLE) return set_error("an op capture session is already open");
  if (budget < kChunkRecords * sizeof(OpRecord) + kChunkInputWords * sizeof(int64_t)) {
    PyErr_Format(PyExc_ValueError, "thread_budget_bytes must be >= %zu, got %llu",
                 kChunkRecords * sizeof(OpRecord) + kChunkInputWords * sizeof(int64_t), budget);
    return nullptr;
  }
  const CorrelationApi* api = nullptr;
  if (capsule != Py_None) {
    api = static_cast<const CorrelationApi*>(PyCapsule_GetPointer(capsule, "ets_hook._C.correlation_api"));
    if (api == nullptr) return nullptr;
  }
  forget_records();
  g_thread_budget.store(budget, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(g_threads_mutex);
    for (auto& b : g_threads) {  // each holds at most its first chunk now
      b->budget_bytes = budget - std::min(budget, static_cast<unsigned long long>(
                                                      b->events.allocated_bytes() + b->inputs.allocated_bytes()));
    }
  }
  g_correlation.store(api, std::memory_order_release);
  g_accepting.store(true, std::memory_order_seq_cst);
  try {
    if (!register_callback(with_inputs != 0)) {
      g_accepting.store(false, std::memory_order_seq_cst);
      return set_error("at::addGlobalCallback returned no handle");
    }
  } catch (const std::exception& e) {
    g_accepting.store(false, std::memory_order_seq_cst);
    return set_error(e.what());
  }
  Py_RETURN_NONE;
}

// set_inputs(with_inputs): swap the callback for one that does (not) ask for inputs.
PyObject* py_set_inputs(PyObject*, PyObject* args) {
  int with_inputs = 0;
  if (!PyArg_ParseTuple(args, "p", &with_inputs)) return nullptr;
  if (g_handle == at::INVALID_CALLBACK_HANDLE) return set_error("no op capture session is open");
  if ((with_inputs != 0) == g_with_inputs) Py_RETURN_NONE;
  try {
    unregister_callback();
    if (!register_callback(with_inputs != 0)) return set_error("at::addGlobalCallback returned no handle");
  } catch (const std::exception& e) {
    return set_error(e.what());
  }
  Py_RETURN_NONE;
}

// stop(): remove the callback. Records of ops still open keep arriving until drained.
PyObject* py_stop(PyObject*, PyObject*) {
  try {
    unregister_callback();
  } catch (const std::exception& e) {
    return set_error(e.what());
  }
  g_correlation.store(nullptr, std::memory_order_release);
  Py_RETURN_NONE;
}

PyObject* py_registered(PyObject*, PyObject*) {
  return PyBool_FromLong(g_handle != at::INVALID_CALLBACK_HANDLE);
}

PyObject* py_has_global_callbacks(PyObject*, PyObject*) { return PyBool_FromLong(at::hasGlobalCallbacks()); }

// drain() -> list of (os_tid, events: bytes, inputs: bytes); copies what was published.
PyObject* py_drain(PyObject*, PyObject*) {
  PyObject* out = PyList_New(0);
  if (out == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(g_threads_mutex);
  for (auto& b : g_threads) {
    const std::size_t n_events = b->events.published();
    const std::size_t n_words = b->inputs.published();
    if (n_events == 0 && n_words == 0) continue;
    PyObject* events = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(n_events * sizeof(OpRecord)));
    PyObject* inputs = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(n_words * sizeof(int64_t)));
    if (events == nullptr || inputs == nullptr) {
      Py_XDECREF(events);
      Py_XDECREF(inputs);
      Py_DECREF(out);
      return nullptr;
    }
    b->events.copy_to(reinterpret_cast<OpRecord*>(PyBytes_AS_STRING(events)), n_events);
    b->inputs.copy_to(reinterpret_cast<int64_t*>(PyBytes_AS_STRING(inputs)), n_words);
    PyObject* item = Py_BuildValue("(INN)", b->os_tid, events, inputs);
    if (item == nullptr || PyList_Append(out, item) != 0) {
      Py_XDECREF(item);
      Py_DECREF(out);
      return nullptr;
    }
    Py_DECREF(item);
  }
  return out;
}

PyObject* py_dropped(PyObject*, PyObject*) {
  uint64_t total = 0;
  std::lock_guard<std::mutex> lock(g_threads_mutex);
  for (auto& b : g_threads) total += b->dropped.load(std::memory_order_relaxed);
  return PyLong_FromUnsignedLongLong(total);
}

// reset(): close the session for late callbacks, wait for those in flight, forget all records.
PyObject* py_reset(PyObject*, PyObject*) {
  if (g_handle != at::INVALID_CALLBACK_HANDLE) return set_error("stop() the session before reset()");
  return PyLong_FromSize_t(forget_records());
}

// record_count(): start + end records published so far, every thread (a live count: the hook
// reads it at each window step boundary to learn the job's ops per step).
PyObject* py_record_count(PyObject*, PyObject*) {
  std::size_t total = 0;
  std::lock_guard<std::mutex> lock(g_threads_mutex);
  for (auto& b : g_threads) total += b->events.published();
  return PyLong_FromSize_t(total);
}

PyObject* py_allocated_bytes(PyObject*, PyObject*) {
  std::size_t total = 0;
  std::lock_guard<std::mutex> lock(g_threads_mutex);
  for (auto& b : g_threads) total += b->events.allocated_bytes() + b->inputs.allocated_bytes();
  return PyLong_FromSize_t(total);
}

// names(start=0) -> the interned names from id `start` on (id 0 is "").
PyObject* py_names(PyObject*, PyObject* args) {
  unsigned int start = 0;
  if (!PyArg_ParseTuple(args, "|I", &start)) return nullptr;
  const uint32_t size = names().size();
  PyObject* out = PyList_New(0);
  if (out == nullptr) return nullptr;
  for (uint32_t id = start; id < size; ++id) {
    std::string_view s;
    if (!names().lookup(id, &s)) s = std::string_view();
    PyObject* name = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
    if (name == nullptr || PyList_Append(out, name) != 0) {
      Py_XDECREF(name);
      Py_DECREF(out);
      return nullptr;
    }
    Py_DECREF(name);
  }
  return out;
}

// dtype_names() -> for each ScalarType code, the dtype name torch's profiler reports.
PyObject* py_dtype_names(PyObject*, PyObject*) {
  const int n = static_cast<int>(c10::ScalarType::NumOptions);
  PyObject* out = PyList_New(n);
  if (out == nullptr) return nullptr;
  for (int i = 0; i < n; ++i) {
    std::string name;
    try {
      name = std::string(c10::scalarTypeToTypeMeta(static_cast<c10::ScalarType>(i)).name());
    } catch (...) {
      name = "";
    }
    PyList_SET_ITEM(out, i, PyUnicode_FromStringAndSize(name.data(), static_cast<Py_ssize_t>(name.size())));
  }
  return out;
}

PyObject* py_record_fields(PyObject*, PyObject*) {
  PyObject* out = PyList_New(0);
  for (const Field& f : kFields) {
    PyObject* item = Py_BuildValue("(ssn)", f.name, f.format, static_cast<Py_ssize_t>(f.offset));
    PyList_Append(out, item);
    Py_XDECREF(item);
  }
  return out;
}

PyMethodDef kMethods[] = {
    {"start", py_start, METH_VARARGS, "start(with_inputs, thread_budget_bytes, correlation=None)"},
    {"set_inputs", py_set_inputs, METH_VARARGS, "set_inputs(with_inputs)"},
    {"stop", py_stop, METH_NOARGS, "stop(): remove the callback"},
    {"registered", py_registered, METH_NOARGS, "registered() -> bool: our callback is registered"},
    {"has_global_callbacks", py_has_global_callbacks, METH_NOARGS,
     "has_global_callbacks() -> bool: any global RecordFunction callback is registered"},
    {"drain", py_drain, METH_NOARGS, "drain() -> [(os_tid, events, inputs)]"},
    {"dropped", py_dropped, METH_NOARGS, "dropped() -> records dropped since reset()"},
    {"reset", py_reset, METH_NOARGS, "reset() -> bytes freed"},
    {"allocated_bytes", py_allocated_bytes, METH_NOARGS, "allocated_bytes() -> buffer bytes held"},
    {"record_count", py_record_count, METH_NOARGS, "record_count() -> records published so far"},
    {"names", py_names, METH_VARARGS, "names(start=0) -> interned names from id start"},
    {"dtype_names", py_dtype_names, METH_NOARGS, "dtype_names() -> name per ScalarType code"},
    {"record_fields", py_record_fields, METH_NOARGS, "record_fields() -> [(name, format, offset)]"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_ops",
                       "ets-hook operator observer (RecordFunction callbacks into per-thread buffers).",
                       -1, kMethods};

}  // namespace

PyMODINIT_FUNC PyInit__ops() {
  PyObject* m = PyModule_Create(&kModule);
  if (m == nullptr) return nullptr;
  PyModule_AddStringConstant(m, "TORCH_VERSION", ETS_TORCH_VERSION);
  PyModule_AddIntConstant(m, "RECORD_ITEMSIZE", sizeof(OpRecord));
  PyModule_AddIntConstant(m, "CHUNK_BYTES", kChunkRecords * sizeof(OpRecord) + kChunkInputWords * sizeof(int64_t));
  PyModule_AddIntConstant(m, "INPUT_SCALAR", kScalar);
  PyModule_AddIntConstant(m, "INPUT_TENSOR_LIST", kTensorList);
  PyModule_AddIntConstant(m, "INPUT_SCALAR_LIST", kScalarList);
  PyModule_AddIntConstant(m, "INPUT_OTHER", kOther);
  return m;
}
