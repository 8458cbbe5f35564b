#include "cupti_api.h"

#include <dirent.h>
#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace ets {

const char* status_code_name(StatusCode code) noexcept {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kNoHeaders: return "no_headers";
    case StatusCode::kNoDriver: return "no_driver";
    case StatusCode::kNoLibcupti: return "no_libcupti";
    case StatusCode::kVersionMismatch: return "version_mismatch";
    case StatusCode::kMultipleSubscribers: return "multiple_subscribers";
    case StatusCode::kInsufficientPrivileges: return "insufficient_privileges";
    case StatusCode::kOtherClient: return "other_client";
    case StatusCode::kCuptiError: return "cupti_error";
    case StatusCode::kAlreadyActive: return "already_active";
  }
  return "cupti_error";
}

std::vector<std::string> loaded_library_paths(const std::string& needle) {
  struct Ctx {
    const std::string* needle;
    std::vector<std::string> out;
  } ctx{&needle, {}};
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t, void* data) -> int {
        auto* c = static_cast<Ctx*>(data);
        if (info->dlpi_name == nullptr || info->dlpi_name[0] == '\0') return 0;
        const char* base = std::strrchr(info->dlpi_name, '/');
        base = base ? base + 1 : info->dlpi_name;
        if (std::strstr(base, c->needle->c_str()) != nullptr) c->out.emplace_back(info->dlpi_name);
        return 0;
      },
      &ctx);
  return ctx.out;
}

int cuda_major_of_cupti_version(uint32_t v) noexcept {
  if (v >= 10000) return static_cast<int>(v / 10000);  // xxyyzz scheme (CUDA 13.0 on)
  if (v >= 19) return 12;
  if (v >= 13) return 11;
  if (v >= 12) return 10;
  if (v >= 10) return 9;
  return 0;
}

Status check_cupti_version(uint32_t compiled, uint32_t runtime) {
  const int built = cuda_major_of_cupti_version(compiled);
  const int found = cuda_major_of_cupti_version(runtime);
  const std::string versions = "libcupti API version " + std::to_string(runtime) + " (CUDA " +
                               std::to_string(found) + "), headers API version " +
                               std::to_string(compiled) + " (CUDA " + std::to_string(built) + ")";
  if (runtime < kMinRuntimeCuptiVersion) {
    return {StatusCode::kVersionMismatch,
            versions + ": libcupti older than CUDA 11.0 is not supported"};
  }
  if (found > built) {
    return {StatusCode::kVersionMismatch,
            versions + ": the loaded libcupti is from a newer CUDA major whose activity record "
                       "layout this build cannot verify; rebuild ets_hook against CUDA " +
                std::to_string(found) + " headers (CUDA_HOME)"};
  }
  return {StatusCode::kOk, versions};
}

#ifdef ETS_HAVE_CUPTI

namespace {

std::string dl_error() {
  const char* e = dlerror();
  return e ? std::string(e) : std::string("unknown dlopen error");
}

// Where a dlopen()ed handle really lives on disk.
std::string handle_path(void* handle, const std::string& fallback) {
  struct link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      map->l_name[0] != '\0') {
    return map->l_name;
  }
  return fallback;
}

// "libcupti.so" first, then "libcupti.so.X[.Y...]" newest first.
std::vector<std::string> cupti_files_in(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (struct dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, "libcupti.so", 11) == 0) names.emplace_back(e->d_name);
  }
  closedir(d);
  auto version_of = [](const std::string& name) {
    std::vector<long> parts;
    const char* p = name.c_str() + 11;  // after "libcupti.so"
    while (*p == '.') {
      char* end = nullptr;
      parts.push_back(std::strtol(p + 1, &end, 10));
      if (end == p + 1) break;
      p = end;
    }
    return parts;
  };
  std::sort(names.begin(), names.end(), [&](const std::string& a, const std::string& b) {
    if (a == "libcupti.so" || b == "libcupti.so") return a == "libcupti.so" && b != a;
    return version_of(a) > version_of(b);
  });
  std::vector<std::string> paths;
  for (const auto& n : names) paths.push_back(dir + "/" + n);
  return paths;
}

constexpr int soname_major() {
  return CUPTI_API_VERSION >= 10000 ? CUPTI_API_VERSION / 10000 : CUDA_VERSION / 1000;
}

template <typename Fn>
bool bind(void* handle, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(handle, name));
  return *out != nullptr;
}

// Fills the table from `handle`; returns the first missing required symbol, or nullptr.
const char* bind_all(void* handle, CuptiApi* api) {
  if (!bind(handle, "cuptiGetVersion", &api->getVersion)) return "cuptiGetVersion";
  if (!bind(handle, "cuptiGetResultString", &api->getResultString)) return "cuptiGetResultString";
  if (!bind(handle, "cuptiActivityRegisterCallbacks", &api->activityRegisterCallbacks))
    return "cuptiActivityRegisterCallbacks";
  if (!bind(handle, "cuptiActivityEnable", &api->activityEnable)) return "cuptiActivityEnable";
  if (!bind(handle, "cuptiActivityDisable", &api->activityDisable)) return "cuptiActivityDisable";
  if (!bind(handle, "cuptiActivityFlushAll", &api->activityFlushAll)) return "cuptiActivityFlushAll";
  if (!bind(handle, "cuptiActivityGetNextRecord", &api->activityGetNextRecord))
    return "cuptiActivityGetNextRecord";
  if (!bind(handle, "cuptiActivityGetNumDroppedRecords", &api->activityGetNumDroppedRecords))
    return "cuptiActivityGetNumDroppedRecords";
  if (!bind(handle, "cuptiActivityPushExternalCorrelationId",
            &api->activityPushExternalCorrelationId))
    return "cuptiActivityPushExternalCorrelationId";
  if (!bind(handle, "cuptiActivityPopExternalCorrelationId", &api->activityPopExternalCorrelationId))
    return "cuptiActivityPopExternalCorrelationId";
  if (!bind(handle, "cuptiGetTimestamp", &api->getTimestamp)) return "cuptiGetTimestamp";
  bind(handle, "cuptiSubscribe", &api->subscribe);
  bind(handle, "cuptiUnsubscribe", &api->unsubscribe);
  bind(handle, "cuptiGetCallbackName", &api->getCallbackName);
  bind(handle, "cuptiSetThreadIdType", &api->setThreadIdType);
  return nullptr;
}

}  // namespace

bool CuptiApi::complete() const noexcept {
  return getVersion && getResultString && activityRegisterCallbacks && activityEnable &&
         activityDisable && activityFlushAll && activityGetNextRecord &&
         activityGetNumDroppedRecords && activityPushExternalCorrelationId &&
         activityPopExternalCorrelationId && getTimestamp;
}

std::string CuptiApi::describe(CUptiResult r) const {
  const char* s = nullptr;
  if (getResultString != nullptr && getResultString(r, &s) == CUPTI_SUCCESS && s != nullptr) {
    return s;
  }
  return "CUptiResult " + std::to_string(static_cast<int>(r));
}

Status check_driver(const LoaderOptions& options) {
  if (!options.check_driver) return {StatusCode::kOk, "driver check skipped"};
  void* h = dlopen(options.driver_library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    return {StatusCode::kNoDriver,
            "no NVIDIA driver: cannot load " + options.driver_library + " (" + dl_error() + ")"};
  }
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDeviceGetCount) count = nullptr;
  decltype(&::cuDriverGetVersion) version = nullptr;
  decltype(&::cuGetErrorName) error_name = nullptr;
  bind(h, "cuGetErrorName", &error_name);
  bind(h, "cuDriverGetVersion", &version);
  if (!bind(h, "cuInit", &init) || !bind(h, "cuDeviceGetCount", &count)) {
    return {StatusCode::kNoDriver, options.driver_library + " lacks cuInit/cuDeviceGetCount"};
  }
  auto name_of = [&](CUresult r) {
    const char* s = nullptr;
    if (error_name != nullptr && error_name(r, &s) == CUDA_SUCCESS && s != nullptr) return std::string(s);
    return "CUresult " + std::to_string(static_cast<int>(r));
  };
  CUresult r = init(0);
  if (r == CUDA_ERROR_NO_DEVICE) {
    return {StatusCode::kNoDriver,
            "the NVIDIA driver reports no usable GPU (cuInit: CUDA_ERROR_NO_DEVICE; check "
            "CUDA_VISIBLE_DEVICES)"};
  }
  if (r != CUDA_SUCCESS) return {StatusCode::kNoDriver, "cuInit failed: " + name_of(r)};
  int n = 0;
  r = count(&n);
  if (r != CUDA_SUCCESS) return {StatusCode::kNoDriver, "cuDeviceGetCount failed: " + name_of(r)};
  if (n <= 0) return {StatusCode::kNoDriver, "the NVIDIA driver sees no GPU (device count 0)"};
  int v = 0;
  if (version != nullptr) version(&v);
  return {StatusCode::kOk, "driver " + std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10) +
                               ", " + std::to_string(n) + " GPU(s)"};
}

Status load_cupti(const LoaderOptions& options, CuptiApi* api) {
  std::vector<std::string> tried;
  std::string first_error;
  auto accept = [&](void* handle, const std::string& label) -> bool {
    CuptiApi candidate;
    if (const char* missing = bind_all(handle, &candidate)) {
      if (first_error.empty()) first_error = label + " lacks " + missing;
      return false;
    }
    candidate.library_path = handle_path(handle, label);
    uint32_t v = 0;
    if (candidate.getVersion(&v) != CUPTI_SUCCESS) {
      if (first_error.empty()) first_error = label + ": cuptiGetVersion failed";
      return false;
    }
    candidate.runtime_version = v;
    *api = candidate;
    return true;
  };
  auto try_open = [&](const std::string& name) -> bool {
    tried.push_back(name);
    void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      if (first_error.empty() && name.find('/') != std::string::npos) first_error = dl_error();
      return false;
    }
    return accept(h, name);
  };

  if (options.use_env_override) {
    const char* explicit_path = std::getenv("ETS_HOOK_CUPTI_LIBRARY");
    if (explicit_path != nullptr && explicit_path[0] != '\0' && try_open(explicit_path)) return {};
  }
  if (options.use_loaded) {
    for (const auto& path : loaded_library_paths("libcupti.so")) {
      tried.push_back("loaded " + path);
      void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
      if (h != nullptr && accept(h, path)) return {};
    }
  }
  if (options.use_sonames) {
    if (try_open("libcupti.so." + std::to_string(soname_major()))) return {};
    if (try_open("libcupti.so")) return {};
  }
  std::vector<std::string> dirs;
  if (options.use_cuda_home) {
    const char* home = std::getenv("CUDA_HOME");
    if (home == nullptr || home[0] == '\0') home = std::getenv("CUDA_PATH");
    const std::string root = (home != nullptr && home[0] != '\0') ? home : "/usr/local/cuda";
    for (const char* sub : {"/extras/CUPTI/lib64", "/lib64", "/lib"}) dirs.push_back(root + sub);
  }
  dirs.insert(dirs.end(), options.extra_dirs.begin(), options.extra_dirs.end());
  for (const auto& dir : dirs) {
    const auto files = cupti_files_in(dir);
    if (files.empty()) tried.push_back(dir + "/libcupti.so*");
    for (const auto& f : files) {
      if (try_open(f)) return {};
    }
  }
  std::string where;
  for (size_t i = 0; i < tried.size() && i < 12; ++i) where += (i ? ", " : "") + tried[i];
  if (tried.size() > 12) where += ", ...";
  return {StatusCode::kNoLibcupti,
          "libcupti not found (tried: " + (where.empty() ? std::string("nothing") : where) + ")" +
              (first_error.empty() ? "" : "; " + first_error)};
}

Status status_from_cupti(const CuptiApi& api, CUptiResult r, const char* what) {
  const std::string detail = std::string(what) + " returned " + api.describe(r);
  switch (r) {
    case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
      return {StatusCode::kMultipleSubscribers,
              "another CUPTI subscriber is active in this process (Nsight Systems, a profiler, or "
              "a torch.profiler session that initialised CUPTI): " + detail};
    case CUPTI_ERROR_INSUFFICIENT_PRIVILEGES:
    case CUPTI_ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES:
      return {StatusCode::kInsufficientPrivileges,
              "insufficient privileges for CUPTI (GPU performance counters restricted to admin "
              "users, or a container without the needed capability): " + detail};
    default:
      return {StatusCode::kCuptiError, detail};
  }
}

#endif  // ETS_HAVE_CUPTI

}  // namespace ets
