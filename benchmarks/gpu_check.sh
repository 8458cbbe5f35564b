#!/usr/bin/env bash
# GPU check for ets-hook, for a machine with an NVIDIA GPU, nvcc, a CUDA build of PyTorch and
# pybind11 already installed, and no network. From the repository root:
#
#     bash benchmarks/gpu_check.sh            # results in $OUT if set, else ./gpu_check_out
#
# Every step runs under `timeout`; the budgets add up to about 11 minutes (most steps take far
# less). A failing step is
# recorded and the script goes on, so one run yields as much as it can. Output:
#   <out>/summary.json     per-step status, duration and results (the file to read first)
#   <out>/<step>.log       full output of each step
#   <out>/*.json|*.xml     step results (ring benchmark JSON, pytest JUnit XML, CUPTI status)
#
# To add a step (overhead, accuracy benchmarks, ...): write `run_step NAME SECONDS COMMAND...` in
# the STEPS section, and if it writes a JSON file, name it "$OUT_DIR/NAME.json": the summary picks
# it up. The exit code is 0 only if every step passed.

set -u -o pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT_DIR="${OUT:-./gpu_check_out}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
export PYTHON="${PYTHON:-python}"
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"   # parallel compilation of csrc/
export PYTHONUNBUFFERED=1
: > "$OUT_DIR/steps.tsv"
FAILED=0

# run_step NAME SECONDS COMMAND...  -> log in $OUT_DIR/NAME.log, a line in steps.tsv
run_step() {
  local name="$1" seconds="$2"
  shift 2
  local log="$OUT_DIR/$name.log" start end rc
  echo "== [$name] (timeout ${seconds}s): $*"
  start=$(date +%s%N)
  timeout --kill-after=10 "$seconds" "$@" >"$log" 2>&1
  rc=$?
  end=$(date +%s%N)
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(( (end - start) / 1000000 ))" >>"$OUT_DIR/steps.tsv"
  tail -n 15 "$log"
  if [ "$rc" -ne 0 ]; then
    FAILED=1
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      echo "== [$name] TIMED OUT after ${seconds}s"
    else
      echo "== [$name] FAILED (exit $rc)"
    fi
  fi
  return "$rc"
}

# ------------------------------------------------------------------------------------- STEPS

run_step environment 60 bash -c "
  nvidia-smi || true
  nvcc --version || true
  echo CUDA_HOME=\${CUDA_HOME:-unset}
  '$PYTHON' - <<'EOF'
import json, platform, torch
info = {
    'python': platform.python_version(),
    'torch': torch.__version__,
    'torch_cuda': torch.version.cuda,
    'cuda_available': torch.cuda.is_available(),
    'device': torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    'device_count': torch.cuda.device_count(),
}
print(json.dumps(info, indent=2))
json.dump(info, open('$OUT_DIR/environment.json', 'w'), indent=2)
EOF
"

# Editable install builds ets_hook._C in place; fall back to a plain in-place build.
run_step build 200 bash -c '
  "$PYTHON" -m pip install --no-build-isolation --no-deps --no-index -e . \
    || "$PYTHON" setup.py build_ext --inplace'


# The native op observer, compiled against the CUDA build of torch there (ets-hook build-ops).
run_step build_ops 120 "$PYTHON" -m ets_hook.cli.main build-ops

run_step cupti_status 60 "$PYTHON" - <<EOF
import json
from ets_hook import _C
from ets_hook.capture import cupti
status = cupti.cupti_status()
result = {
    "status": {"available": status.available, "code": status.code, "reason": status.reason},
    "info": _C._testing.cupti_info(),
    "clock_offset_ns": cupti.measure_clock_offset_ns(),
    "loaded_libcupti": _C.loaded_libraries("libcupti"),
}
print(json.dumps(result, indent=2, default=str))
json.dump(result, open("$OUT_DIR/cupti_status.json", "w"), indent=2, default=str)
raise SystemExit(0 if status.available else 1)
EOF

run_step gpu_tests 320 "$PYTHON" -m pytest -m requires_cuda tests/gpu -v -rs \
  -p no:cacheprovider --junitxml="$OUT_DIR/gpu_tests.xml"

# Native ops on CUDA: external correlation ids pushed per op, kernels linked through them.
run_step native_ops_gpu 120 "$PYTHON" -m pytest tests/capture/test_native_ops.py tests/gpu/test_hook_gpu.py tests/gpu/test_cupti_gpu.py -v -rs \
  -p no:cacheprovider --junitxml="$OUT_DIR/native_ops_gpu.xml"

run_step ring_throughput 90 "$PYTHON" benchmarks/ring_throughput.py --runs 5 \
  --json "$OUT_DIR/ring_throughput.json"

# Native observer vs torch.profiler on CUDA (fewer variants and rounds than on CPU: time box).
run_step overhead 180 "$PYTHON" benchmarks/overhead.py --device cuda --repeats 3 \
  --variants none,none_aa,native_shapes,native,torch_profiler_shapes,torch_profiler \
  --no-hook-cost --workloads resnet-w16-x2-b32-s32,transformer-d128-l4-b16-t64 \
  --json "$OUT_DIR/overhead.json"

# Exit paths on CUDA: the hook closes before torch tears down CUDA/CUPTI (no native crash).
run_step lifecycle_gpu 120 "$PYTHON" -m pytest tests/test_hook_lifecycle.py -q -rs \
  -p no:cacheprovider --junitxml="$OUT_DIR/lifecycle_gpu.xml"

run_step accuracy 150 "$PYTHON" benchmarks/accuracy.py --device cuda --steps 120 \
  --jobs resnet-medium+ckpt,transformer-medium,gpt-medium+eval,mlp-large+eval \
  --out "$OUT_DIR/accuracy"

# (append further steps here)

# ------------------------------------------------------------------------------------- SUMMARY

"$PYTHON" - "$OUT_DIR" <<'EOF'
import glob, json, os, sys, time
import xml.etree.ElementTree as ET

out = sys.argv[1]
steps = []
with open(os.path.join(out, "steps.tsv")) as f:
    for line in f:
        name, rc, millis = line.rstrip("\n").split("\t")
        rc = int(rc)
        steps.append({
            "name": name,
            "exit_code": rc,
            "status": "ok" if rc == 0 else ("timeout" if rc in (124, 137) else "failed"),
            "seconds": round(int(millis or 0) / 1000, 1),
        })
results = {}
for path in sorted(glob.glob(os.path.join(out, "*.json"))):
    if os.path.basename(path) == "summary.json":
        continue
    try:
        with open(path) as f:
            results[os.path.splitext(os.path.basename(path))[0]] = json.load(f)
    except (OSError, ValueError) as exc:
        results[os.path.basename(path)] = f"unreadable: {exc}"
junit = os.path.join(out, "gpu_tests.xml")
if os.path.exists(junit):
    root = ET.parse(junit).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    cases = []
    for case in suite.iter("testcase"):
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                cases.append({"test": case.get("name"), "outcome": outcome,
                              "message": (node.get("message") or "")[:500]})
                break
        else:
            cases.append({"test": case.get("name"), "outcome": outcome})
    results["gpu_tests"] = {
        k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")
    } | {"cases": cases}
summary = {
    "check": "ets-hook gpu_check",
    "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    "ok": all(s["status"] == "ok" for s in steps),
    "steps": steps,
    "results": results,
}
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2, default=str)
print(json.dumps({"ok": summary["ok"], "steps": steps}, indent=2))
EOF

exit "$FAILED"
