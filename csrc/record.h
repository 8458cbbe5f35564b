// The ring-buffer record: the one flat hand-off format between the C++ collectors and Python.
//
// Contract:
// - `Record` is a 64-byte POD (one cache line; the ring's storage is 64-byte aligned). Producers
//   fill it field by field *in place* in the ring slot; nothing builds a Record on the stack and
//   copies it in (that was measured 6x slower).
// - `kRecordFields` is the single source of truth for the Python twin of this layout: the binding
//   exports it and `ets_hook.capture.cupti.RECORD_DTYPE` is generated from it (names, numpy formats,
//   offsets, itemsize). Add a field here and it appears in Python.
// - A common header is followed by a small per-kind payload whose fields share bytes (a tagged
//   union): a field is meaningful only for the kinds listed below and reads as garbage for the
//   others. Python code selects rows by `kind` before reading payload fields.
// - Times are int nanoseconds on the producer's clock (CUPTI records: CUPTI's timestamp, which is
//   CLOCK_REALTIME / Unix-epoch ns on Linux unless a tool registered its own timestamp source;
//   ets_hook.capture.cupti.measure_clock_offset_ns() measures the offset to time.time_ns()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace ets {

// What a record describes. Values are part of the Python contract (exported by record_kinds()).
enum class RecordKind : uint8_t {
  kInvalid = 0,
  kKernel = 1,               // GPU kernel (CUPTI CONCURRENT_KERNEL or KERNEL)
  kMemcpy = 2,               // GPU memcpy; subkind = CUpti_ActivityMemcpyKind
  kMemset = 3,               // GPU memset
  kRuntime = 4,              // CUDA runtime API call on a CPU thread (launches, copies, ...)
  kDriver = 5,               // CUDA driver API call on a CPU thread
  kExternalCorrelation = 6,  // correlation_id <-> external_id; subkind = external kind
};

struct RecordKindName {
  const char* name;
  RecordKind kind;
};
inline constexpr RecordKindName kRecordKindNames[] = {
    {"KERNEL", RecordKind::kKernel},   {"MEMCPY", RecordKind::kMemcpy},
    {"MEMSET", RecordKind::kMemset},   {"RUNTIME", RecordKind::kRuntime},
    {"DRIVER", RecordKind::kDriver},   {"EXTERNAL_CORRELATION", RecordKind::kExternalCorrelation},
};

constexpr uint16_t kNoDevice = 0xFFFF;  // `device` of host-side records

//  offset field            kinds (0 where a field does not apply)
//   0     kind             all
//   1     subkind          memcpy: copy kind; external correlation: external kind
//   2     device           kernel, memcpy, memset (CUDA device id); kNoDevice otherwise
//   4     correlation_id   all: ties a GPU record to the API call that launched it
//   8     start_ns         all but external correlation
//  16     end_ns           all but external correlation
//  24     name_id          kernel: interned name (StringTable id)
//  28     stream           kernel, memcpy, memset: CUDA stream id
//  32     context_id       kernel, memcpy, memset: CUDA context id
//  36     grid_x           kernel      | thread_id   runtime, driver: OS thread id (gettid)
//  40     grid_y, grid_z   kernel      | bytes       memcpy, memset
//                                      | external_id external correlation
//  48     block_x          kernel      | cbid        runtime, driver: CUPTI callback id
//  52     block_y, block_z kernel
//  60     (reserved, 0)
struct alignas(8) Record {
  uint8_t kind;
  uint8_t subkind;
  uint16_t device;
  uint32_t correlation_id;
  int64_t start_ns;
  int64_t end_ns;
  uint32_t name_id;
  uint32_t stream;
  uint32_t context_id;
  union {
    int32_t grid_x;
    uint32_t thread_id;
  };
  union {
    int32_t grid_yz[2];  // grid_y, grid_z
    int64_t bytes;
    uint64_t external_id;
  };
  union {
    int32_t block_x;
    uint32_t cbid;
  };
  int32_t block_y;
  int32_t block_z;
  uint32_t reserved;
};

static_assert(std::is_trivially_copyable<Record>::value, "Record must be POD");
static_assert(std::is_standard_layout<Record>::value, "Record must be standard layout");
static_assert(sizeof(Record) == 64, "Record must stay one cache line");

struct FieldInfo {
  const char* name;
  const char* format;  // numpy type string with explicit byte order, e.g. "<u4"
  std::size_t offset;
  std::size_t size;
};

namespace detail {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define ETS_BO ">"
#else
#define ETS_BO "<"
#endif
template <typename T>
constexpr const char* numpy_format() {
  static_assert(std::is_integral<T>::value, "only integer fields");
  if (std::is_signed<T>::value) {
    return sizeof(T) == 1 ? "i1" : sizeof(T) == 2 ? ETS_BO "i2" : sizeof(T) == 4 ? ETS_BO "i4" : ETS_BO "i8";
  }
  return sizeof(T) == 1 ? "u1" : sizeof(T) == 2 ? ETS_BO "u2" : sizeof(T) == 4 ? ETS_BO "u4" : ETS_BO "u8";
}
#undef ETS_BO
}  // namespace detail

#define ETS_FIELD(f) \
  FieldInfo{#f, detail::numpy_format<decltype(Record::f)>(), offsetof(Record, f), sizeof(Record::f)}
#define ETS_FIELD_AT(name, type, offset) \
  FieldInfo{name, detail::numpy_format<type>(), offset, sizeof(type)}

// Exported fields: the header, then the kernel payload, then the views that share its bytes.
inline constexpr FieldInfo kRecordFields[] = {
    ETS_FIELD(kind),
    ETS_FIELD(subkind),
    ETS_FIELD(device),
    ETS_FIELD(correlation_id),
    ETS_FIELD(start_ns),
    ETS_FIELD(end_ns),
    ETS_FIELD(name_id),
    ETS_FIELD(stream),
    ETS_FIELD(context_id),
    ETS_FIELD(grid_x),
    ETS_FIELD_AT("grid_y", int32_t, offsetof(Record, grid_yz)),
    ETS_FIELD_AT("grid_z", int32_t, offsetof(Record, grid_yz) + sizeof(int32_t)),
    ETS_FIELD(block_x),
    ETS_FIELD(block_y),
    ETS_FIELD(block_z),
    ETS_FIELD(thread_id),
    ETS_FIELD(bytes),
    ETS_FIELD(external_id),
    ETS_FIELD(cbid),
};
#undef ETS_FIELD
#undef ETS_FIELD_AT

inline constexpr std::size_t kRecordFieldCount = sizeof(kRecordFields) / sizeof(kRecordFields[0]);

// Every byte but `reserved` belongs to at least one exported field, and none sticks out.
constexpr bool fields_cover_record() {
  for (std::size_t byte = 0; byte < sizeof(Record); ++byte) {
    bool covered = byte >= offsetof(Record, reserved);
    for (const FieldInfo& f : kRecordFields) {
      if (f.offset + f.size > offsetof(Record, reserved)) return false;
      covered = covered || (byte >= f.offset && byte < f.offset + f.size);
    }
    if (!covered) return false;
  }
  return true;
}
static_assert(fields_cover_record(), "a Record byte is missing from kRecordFields");

}  // namespace ets
