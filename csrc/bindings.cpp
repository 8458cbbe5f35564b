// ets_hook._C: the only file that knows about Python. Everything here converts arguments and
// results; the logic lives in ring_buffer.h, string_table.*, cupti_*.* and testing.*.
#include <cxxabi.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdlib>
#include <memory>

#include "cupti_controller.h"
#include "record.h"
#include "ring_buffer.h"
#include "string_table.h"
#include "testing.h"

namespace py = pybind11;
using namespace pybind11::literals;
using ets::RingBuffer;
using ets::StringTable;

namespace {

py::dtype record_dtype() {
  static py::dtype* dtype = [] {  // built once from the field table; leaked on purpose
    py::list names, formats, offsets;
    for (const auto& f : ets::kRecordFields) {
      names.append(f.name);
      formats.append(f.format);
      offsets.append(f.offset);
    }
    return new py::dtype(names, formats, offsets, sizeof(ets::Record));
  }();
  return *dtype;
}

// A C-contiguous array of records with exactly the record dtype, or ValueError.
ets::Record* record_data(py::array& a, bool writable) {
  if (!a.dtype().attr("__eq__")(record_dtype()).cast<bool>()) {
    throw py::value_error("expected an array with the record dtype (ets_hook.capture.cupti.RECORD_DTYPE), got " +
                          py::str(a.dtype()).cast<std::string>());
  }
  if (a.ndim() != 1 || !(a.flags() & py::array::c_style)) {
    throw py::value_error("expected a 1-d C-contiguous record array");
  }
  if (writable && !a.writeable()) throw py::value_error("the output array is read-only");
  return static_cast<ets::Record*>(writable ? a.mutable_data() : const_cast<void*>(a.data()));
}

py::array drain(RingBuffer& ring, long long max_records) {
  std::unique_lock<std::mutex> lock(ring.consumer_mutex(), std::defer_lock);
  {
    py::gil_scoped_release nogil;  // never wait for the consumer lock while holding the GIL
    lock.lock();
  }
  const std::size_t n = ring.readable(max_records < 0 ? SIZE_MAX : static_cast<std::size_t>(max_records));
  py::array out(record_dtype(), std::vector<py::ssize_t>{static_cast<py::ssize_t>(n)});
  auto* dst = static_cast<ets::Record*>(out.mutable_data());
  {
    py::gil_scoped_release nogil;
    ring.consume(dst, n);  // the one copy: ring slots -> numpy memory
  }
  return out;
}

std::size_t drain_into(RingBuffer& ring, py::array out) {
  ets::Record* dst = record_data(out, /*writable=*/true);
  std::unique_lock<std::mutex> lock(ring.consumer_mutex(), std::defer_lock);
  py::gil_scoped_release nogil;
  lock.lock();
  const std::size_t n = ring.readable(static_cast<std::size_t>(out.shape(0)));
  ring.consume(dst, n);
  return n;
}

std::size_t push(RingBuffer& ring, py::array records) {
  const ets::Record* src = record_data(records, /*writable=*/false);
  std::size_t pushed = 0;
  for (py::ssize_t i = 0; i < records.shape(0); ++i) {  // GIL held: Python is this ring's producer
    if (ets::Record* slot = ring.try_claim()) {
      *slot = src[i];
      ++pushed;
    }
  }
  ring.publish();
  return pushed;
}

py::str decode_name(std::string_view s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

py::list resolve_many(const StringTable& table, py::array_t<int64_t, py::array::c_style | py::array::forcecast> ids) {
  const int64_t* p = ids.data();
  const auto n = ids.size();
  const int64_t size = table.size();
  py::list out(n);
  for (py::ssize_t i = 0; i < n; ++i) {
    std::string_view s;
    if (p[i] < 0 || p[i] >= size || !table.lookup(static_cast<uint32_t>(p[i]), &s)) {
      throw py::value_error("unknown name id " + std::to_string(p[i]) + " (table holds " +
                            std::to_string(size) + " names)");
    }
    out[i] = decode_name(s);
  }
  return out;
}

py::tuple status(const ets::Status& s) { return py::make_tuple(ets::status_code_name(s.code), s.reason); }

// Runs a controller call without the GIL (CUPTI calls our callbacks, which never need it).
template <typename F>
py::tuple status_nogil(F&& f) {
  ets::Status s;
  {
    py::gil_scoped_release nogil;
    s = f();
  }
  return status(s);
}

std::string demangle(const std::string& name) {
  int rc = 0;
  char* out = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &rc);
  if (rc != 0 || out == nullptr) return name;
  std::string s(out);
  std::free(out);
  return s;
}

// The external-correlation push/pop as plain C function pointers, for the operator observer
// (ets_hook._ops, a separate module built against torch) to call on every op start and end.
struct CorrelationApi {
  bool (*push)(uint64_t);
  bool (*pop)();
};
bool correlation_push(uint64_t id) { return ets::CuptiController::instance().push_external_id(id); }
bool correlation_pop() { return ets::CuptiController::instance().pop_external_id().has_value(); }
const CorrelationApi kCorrelationApi{&correlation_push, &correlation_pop};

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "ets-hook native capture core: ring buffer, string table, CUPTI activity collector.";

  m.attr("RECORD_ITEMSIZE") = sizeof(ets::Record);
  m.def("record_fields", [] {
    py::list out;
    for (const auto& f : ets::kRecordFields) out.append(py::make_tuple(f.name, f.format, f.offset));
    return out;
  });

  py::class_<RingBuffer, std::shared_ptr<RingBuffer>>(m, "RingBuffer")
      .def(py::init([](long long capacity) {
             if (capacity <= 0 || static_cast<unsigned long long>(capacity) > RingBuffer::kMaxCapacity) {
               throw py::value_error("ring capacity must be in [1, " + std::to_string(RingBuffer::kMaxCapacity) +
                                     "], got " + std::to_string(capacity));
             }
             return std::make_shared<RingBuffer>(static_cast<std::size_t>(capacity));
           }),
           "capacity"_a)
      .def_property_readonly("capacity", &RingBuffer::capacity)
      .def_property_readonly("dropped", &RingBuffer::dropped)
      .def("__len__", &RingBuffer::size)
      .def("drain", &drain, "max_records"_a = -1);

  py::class_<StringTable>(m, "StringTable")
      .def(py::init<>())
      .def("intern", [](StringTable& t, std::string_view s) { return t.intern(s); }, "name"_a)
      .def("resolve_many", &resolve_many, "name_ids"_a)
      .def("__len__", &StringTable::size);
  m.def("names", &StringTable::global, py::return_value_policy::reference,
        "The process-wide table the CUPTI collector interns kernel names into.");
  m.def("demangle", [](const std::vector<std::string>& names) {
    std::vector<std::string> out;
    out.reserve(names.size());
    for (const auto& n : names) out.push_back(demangle(n));
    return out;
  }, "names"_a);

  // ---- CUPTI ----
  auto& ctl = ets::CuptiController::instance();
#ifdef ETS_HAVE_CUPTI
  m.attr("EXTERNAL_CORRELATION_KIND") = static_cast<int>(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2);
#else
  m.attr("EXTERNAL_CORRELATION_KIND") = -1;
#endif
  m.def("activity_names", &ets::activity_names);
  m.def("memcpy_kind_names", [] {
    py::dict d;
    for (const auto& [kind, name] : ets::memcpy_kind_names()) d[py::int_(kind)] = name;
    return d;
  });
  m.def("cupti_probe", [&ctl](const std::vector<std::string>& extra_dirs) {
    return status_nogil([&] { return ctl.probe(extra_dirs); });
  }, "extra_dirs"_a = std::vector<std::string>{});
  m.def("cupti_start", [&ctl](std::shared_ptr<RingBuffer> ring, std::size_t buffer_size_bytes,
                              std::size_t buffer_count, const std::vector<std::string>& activities,
                              bool probe_subscriber, std::vector<std::string> extra_dirs) {
    const auto o = ets::StartOptions::make(buffer_size_bytes, buffer_count, activities, probe_subscriber,
                                           std::move(extra_dirs));  // ValueError if invalid
    return status_nogil([&] { return ctl.start(std::move(ring), o); });
  }, "ring"_a, "buffer_size_bytes"_a, "buffer_count"_a, "activities"_a, "probe_subscriber"_a = true,
     "extra_dirs"_a = std::vector<std::string>{});
  m.def("cupti_flush", [&ctl](bool forced) { return status_nogil([&] { return ctl.flush(forced); }); },
        "forced"_a = true);
  m.def("cupti_stop", [&ctl](bool flush) { return status_nogil([&] { return ctl.stop(flush); }); },
        "flush"_a = true);
  m.def("cupti_detach", [&ctl](const RingBuffer& ring) { ctl.detach(&ring); }, "ring"_a);
  m.def("cupti_stats", [&ctl] {
    const ets::CollectorStats s = ctl.stats();
    return py::dict("buffers_requested"_a = s.buffers_requested, "buffers_completed"_a = s.buffers_completed,
                    "buffers_starved"_a = s.buffers_starved, "foreign_buffers"_a = s.foreign_buffers,
                    "records_decoded"_a = s.records_decoded, "records_skipped"_a = s.records_skipped,
                    "buffers_discarded"_a = s.buffers_discarded, "ring_dropped"_a = s.ring_dropped,
                    "cupti_dropped"_a = s.cupti_dropped, "decode_errors"_a = s.decode_errors,
                    "buffers_outstanding"_a = s.buffers_outstanding);
  });
  m.def("push_external_id", [&ctl](uint64_t id) { return ctl.push_external_id(id); }, "external_id"_a);
  m.def("pop_external_id", [&ctl] { return ctl.pop_external_id(); });
  m.def("correlation_api", [] {
    return py::capsule(static_cast<const void*>(&kCorrelationApi), "ets_hook._C.correlation_api");
  }, "The push/pop pair as a capsule for ets_hook._ops (C function pointers).");
  m.def("cupti_timestamp_ns", [&ctl] { return ctl.timestamp_ns(); });
  m.def("loaded_libraries", &ets::loaded_library_paths, "needle"_a);

  // ---- test and benchmark entry points ----
  namespace t = ets::testing;
  auto tm = m.def_submodule("_testing", "Test/benchmark entry points; not a public API.");
  // Introspection the product never needs: build facts, record layout, controller state.
#ifdef ETS_HAVE_CUPTI
  tm.attr("CUPTI_COMPILED") = true;
  tm.attr("COMPILED_CUPTI_VERSION") = ets::kCompiledCuptiVersion;
#else
  tm.attr("CUPTI_COMPILED") = false;
  tm.attr("COMPILED_CUPTI_VERSION") = 0;
#endif
  tm.attr("NO_DEVICE") = ets::kNoDevice;
  tm.def("record_dtype", &record_dtype);
  tm.def("record_kinds", [] {
    py::dict d;
    for (const auto& k : ets::kRecordKindNames) d[k.name] = static_cast<int>(k.kind);
    return d;
  });
  tm.def("cupti_active", [&ctl] { return ctl.active(); });
  tm.def("cupti_last_error", [&ctl] { return ctl.last_error(); });
  tm.def("cupti_info", [&ctl] {
    const ets::CuptiInfo i = ctl.info();
    return py::dict("compiled"_a = i.compiled, "compiled_version"_a = i.compiled_version,
                    "runtime_version"_a = i.runtime_version, "library_path"_a = i.library_path,
                    "kernel_struct"_a = i.kernel_struct, "memcpy_struct"_a = i.memcpy_struct,
                    "memset_struct"_a = i.memset_struct, "fake"_a = i.fake);
  });
  tm.def("cupti_callback_name", [&ctl](uint32_t cbid, bool driver) { return ctl.callback_name(driver, cbid); },
         "cbid"_a, "driver"_a = false);
  tm.def("cupti_version_check", [](uint32_t compiled, uint32_t runtime) {
    auto s = ets::check_cupti_version(compiled, runtime);
    return py::make_tuple(s.ok(), s.reason);
  }, "compiled"_a, "runtime"_a);
  // Ring and string-table operations only tests and benchmarks drive.
  tm.def("ring_push", [](RingBuffer& ring, const py::array& records) { return push(ring, records); },
         "ring"_a, "records"_a);
  tm.def("ring_drain_into", [](RingBuffer& ring, py::array& out) { return drain_into(ring, out); },
         "ring"_a, "out"_a);
  tm.def("ring_counters", [](const RingBuffer& ring) {
    return py::make_tuple(ring.published(), ring.consumed());
  }, "ring"_a);
  tm.def("intern_many", [](StringTable& t, const std::vector<std::string>& names) {
    py::array_t<uint32_t> ids(static_cast<py::ssize_t>(names.size()));
    auto* p = ids.mutable_data();
    for (std::size_t i = 0; i < names.size(); ++i) p[i] = t.intern(names[i]);
    return ids;
  }, "table"_a, "names"_a);
  tm.def("push_sequence", [](RingBuffer& ring, uint64_t first, uint64_t count, uint32_t publish_every) {
    py::gil_scoped_release nogil;
    return t::push_sequence(ring, first, count, publish_every);
  }, "ring"_a, "first"_a, "count"_a, "publish_every"_a = 64);
  py::class_<t::Producer>(tm, "Producer")
      .def(py::init<std::shared_ptr<RingBuffer>, uint64_t, uint64_t, bool>(), "ring"_a, "first"_a,
           "count"_a, "wait_when_full"_a)
      .def("join", &t::Producer::join, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("done", &t::Producer::done);
  tm.def("set_loader_options", [&ctl](const std::string& driver_library, bool check_driver, bool use_env_override,
                                      bool use_loaded, bool use_sonames, bool use_cuda_home,
                                      const std::vector<std::string>& extra_dirs) {
    ctl.set_loader_options({driver_library, check_driver, use_env_override, use_loaded, use_sonames,
                            use_cuda_home, extra_dirs});
  }, "driver_library"_a = "libcuda.so.1", "check_driver"_a = true, "use_env_override"_a = true,
     "use_loaded"_a = true, "use_sonames"_a = true, "use_cuda_home"_a = true,
     "extra_dirs"_a = std::vector<std::string>{});
  tm.def("reset_cupti", [&ctl] { ctl.reset_for_tests(); });
#ifdef ETS_HAVE_CUPTI
  tm.def("install_fake_cupti", [](uint32_t version, int subscribe_result, int register_result, int enable_result,
                                  int enable_fail_kind, int flush_result, bool driver_ok, uint64_t dropped_records,
                                  int64_t timestamp_offset_ns) {
    t::install_fake_cupti({version, subscribe_result, register_result, enable_result, enable_fail_kind,
                           flush_result, driver_ok, dropped_records, timestamp_offset_ns});
  }, "version"_a = 0, "subscribe_result"_a = 0, "register_result"_a = 0, "enable_result"_a = 0,
     "enable_fail_kind"_a = -1, "flush_result"_a = 0, "driver_ok"_a = true, "dropped_records"_a = 0,
     "timestamp_offset_ns"_a = 0);
  tm.def("fake_enabled_kinds", &t::fake_enabled_kinds);
  tm.def("fake_subscriber_count", &t::fake_subscriber_count);
  tm.def("fake_external_stack", &t::fake_external_stack);
  tm.def("build_activity_buffer", [](const std::vector<py::dict>& records) {
    std::vector<t::SyntheticActivity> acts;
    for (const auto& d : records) {
      t::SyntheticActivity a;
      for (auto [k, v] : d) {
        const auto key = k.cast<std::string>();
        if (key == "kind") a.kind = v.cast<std::string>();
        else if (key == "name") a.name = v.cast<std::string>();
        else a.fields[key] = v.cast<int64_t>();
      }
      acts.push_back(std::move(a));
    }
    return py::bytes(t::build_activity_buffer(acts));
  }, "records"_a);
  tm.def("activity_record_size", &t::activity_record_size, "kind"_a);
  tm.def("activity_struct_names", &t::activity_struct_names);
  tm.def("queue_activity_buffer", [](const py::bytes& b) { t::queue_activity_buffer(std::string(b)); }, "data"_a);
  tm.def("deliver_activity_buffer", [](const py::bytes& b) {
    std::string s(b);
    py::gil_scoped_release nogil;
    return t::deliver_activity_buffer(s);
  }, "data"_a);
  tm.def("complete_foreign_buffer", [](const py::bytes& b) { t::complete_foreign_buffer(std::string(b)); },
         "data"_a);
  py::class_<t::Deliverer>(tm, "Deliverer")
      .def(py::init([](const py::bytes& b, uint64_t n) { return new t::Deliverer(std::string(b), n); }),
           "data"_a, "repetitions"_a)
      .def("join", &t::Deliverer::join, py::call_guard<py::gil_scoped_release>());
#endif
}
