#!/usr/bin/env bash
# The native core under sanitizers. From the repository root, in the project's venv:
#
#     bash benchmarks/sanitize.sh                 # the native tests (see TESTS below)
#     bash benchmarks/sanitize.sh tests/capture   # other pytest arguments instead
#     bash benchmarks/sanitize.sh tests -m "not slow"   # the whole fast suite (~3.5 min on 2 cores)
#
# 1. ASan + UBSan: copies the package, csrc/, tests/ and benchmarks/ to a scratch folder
#    ($SANITIZE_DIR, else a new temp folder; the checkout and its installed ets_hook/_C*.so are
#    not touched) and builds ets_hook._C there with setup.py (same sources, macros and CUPTI
#    headers as a normal build) and CC/CXX set to a wrapper that appends
#        -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
#    to every compile and link. The wrapper stays in CXX for the tests, so the op observer
#    (ets_hook._ops, compiled by tests/conftest.py through ets_hook/capture/native_ops.py, which
#    honours $CXX) is instrumented the same way. The tests then run from the copy (python -m
#    puts it first on sys.path, ahead of the editable install) with
#        LD_PRELOAD="libasan.so libstdc++.so.6"   the interpreter is not instrumented: the ASan
#                                     runtime must come first, and libstdc++ must be loaded when it
#                                     starts (else its __cxa_throw interceptor finds no real
#                                     __cxa_throw: "CHECK failed ... real___cxa_throw", on the
#                                     first C++ exception)
#        ASAN_OPTIONS=detect_leaks=0  CPython and libtorch keep their allocations until exit
#    ASan reports go to $SANITIZE_DIR/logs/asan.<pid> (log_path), so one from a child process (the
#    tests start interpreters) counts too. UBSan reports go to stderr: its runtime (libubsan, a
#    separate library next to libasan with GCC) ignores log_path. So pytest runs with
#    --capture=sys (native writes to fd 2 pass through), its output is kept in logs/pytest.log
#    and searched for reports; UBSan halts on the first error (-fno-sanitize-recover), so a child
#    that hits one exits 1 and fails its test. Any report, or any failing test, fails the script.
#    libtorch, numpy and CPython are not instrumented: only ets_hook's own code is checked (the
#    interceptors still see its calls into them). No suppressions are needed today; should
#    libtorch ever need one, add it to SUPPRESSIONS below with the reason.
# 2. TSan: builds csrc/tests/ring_buffer_stress.cpp (ring_buffer.h and the string table, no Python:
#    TSan inside an uninstrumented interpreter reports mostly noise) with -fsanitize=thread and
#    runs it; then the same stress under ASan + UBSan with leak detection on.
#
# Needs g++ with libasan, libubsan and libtsan (GCC 12 here), and the venv's pybind11 and torch.
# Exit status 0 only when every step passed with no sanitizer report. The scratch folder is kept
# (logs/: build_C.log, pytest.log, asan.<pid>, tsan.out, compiler-commands.txt) when a step failed
# or SANITIZE_DIR was given. STRESS_RECORDS (default 300000) scales the stress.

set -u -o pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python}"
CXX_REAL="${CXX_REAL:-g++}"
WORK="${SANITIZE_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/ets-sanitize.XXXXXX")}"
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"
SRC="$WORK/src"
LOGS="$WORK/logs"
STRESS_RECORDS="${STRESS_RECORDS:-300000}"
TESTS=(
  tests/capture/test_cupti.py tests/capture/test_cupti_ring.py tests/capture/test_cupti_strings.py
  tests/capture/test_gpu_records.py tests/capture/test_native_ops.py tests/test_hook_kernels.py
  tests/test_hook.py
)
[ "$#" -gt 0 ] && TESTS=("$@")
SAN="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined"
# Narrow ASan suppressions for uninstrumented third-party code (interceptor reports only), e.g.
#   interceptor_via_lib:libtorch_cpu.so   # reason
SUPPRESSIONS=""
FAILED=0
STARTED=$(date +%s)

step() {  # step NAME: prints a header and remembers the start time
  STEP_NAME="$1"
  STEP_START=$(date +%s)
  echo "== [$STEP_NAME]"
}
done_step() {  # done_step RC
  local rc="$1"
  local took=$(( $(date +%s) - STEP_START ))
  if [ "$rc" -eq 0 ]; then
    echo "== [$STEP_NAME] ok (${took} s)"
  else
    echo "== [$STEP_NAME] FAILED, exit $rc (${took} s)"
    FAILED=1
  fi
}
reports() {  # reports PREFIX: prints and counts the sanitizer logs written so far
  local found=0 f
  for f in "$LOGS"/"$1".*; do
    [ -e "$f" ] || continue
    found=$((found + 1))
    echo "---- $f"
    head -n 60 "$f"
  done
  [ "$found" -eq 0 ]
}

echo "scratch folder: $WORK"
rm -rf "$SRC" "$LOGS"
mkdir -p "$SRC" "$LOGS" "$WORK/bin"
LIBASAN="$("$CXX_REAL" -print-file-name=libasan.so)"
if [ ! -e "$LIBASAN" ]; then
  echo "no libasan.so for $CXX_REAL ($LIBASAN)"
  exit 2
fi
PRELOAD="$LIBASAN $("$CXX_REAL" -print-file-name=libstdc++.so.6)"
# The compiler wrapper: the sanitizer flags go last, so they win over setup.py's -O3.
# The compiler itself runs without the preloaded runtime the tests inherit.
cat >"$WORK/bin/c++-sanitize" <<EOF
#!/bin/sh
unset LD_PRELOAD
echo "\$*" >>"$LOGS/compiler-commands.txt"
exec $CXX_REAL "\$@" $SAN
EOF
chmod +x "$WORK/bin/c++-sanitize"
printf '%s\n' "$SUPPRESSIONS" >"$WORK/asan.supp"

# ---------------------------------------------------------------- 1. ASan + UBSan, Python tests

step "build _C with ASan+UBSan"
for part in csrc ets_hook tests benchmarks setup.py pyproject.toml MANIFEST.in README.md; do
  [ -e "$part" ] && cp -a "$part" "$SRC"/
done
rm -f "$SRC"/ets_hook/_C*.so
find "$SRC" -name __pycache__ -prune -exec rm -rf {} +
(
  cd "$SRC" &&
    CC="$WORK/bin/c++-sanitize" CXX="$WORK/bin/c++-sanitize" MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
      "$PYTHON" setup.py -q build_ext --inplace >"$LOGS/build_C.log" 2>&1
)
rc=$?
tail -n 3 "$LOGS/build_C.log"
if [ "$rc" -eq 0 ] && ! readelf -d "$SRC"/ets_hook/_C*.so | grep -q 'libasan'; then
  echo "the _C built is not linked against libasan"
  rc=1
fi
done_step "$rc"

export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=0:log_path=$LOGS/asan:suppressions=$WORK/asan.supp"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
if [ "$rc" -eq 0 ]; then
  step "import check"
  (
    cd "$SRC" && LD_PRELOAD="$PRELOAD" "$PYTHON" -c '
import sys, ets_hook, ets_hook._C as C
src = sys.argv[1]
assert ets_hook.__file__.startswith(src), ets_hook.__file__
assert C.__file__.startswith(src), C.__file__
print("ets_hook._C from", C.__file__, "CUPTI compiled:", C._testing.CUPTI_COMPILED)
' "$SRC"
  )
  done_step $?

  step "native tests under ASan+UBSan"
  (
    cd "$SRC" && CC="$WORK/bin/c++-sanitize" CXX="$WORK/bin/c++-sanitize" LD_PRELOAD="$PRELOAD" \
      "$PYTHON" -m pytest -q -p no:cacheprovider --capture=sys "${TESTS[@]}"
  ) 2>&1 | tee "$LOGS/pytest.log"
  rc=$?
  if grep -E -q 'runtime error:|ERROR: AddressSanitizer|Sanitizer: CHECK failed' "$LOGS/pytest.log"; then
    echo "sanitizer report in the test output (logs/pytest.log)"
    rc=1
  fi
  if ! grep -q 'ops_observer.cpp' "$LOGS/compiler-commands.txt"; then
    echo "the op observer was not compiled with the sanitizers"
    rc=1
  fi
  reports asan || rc=1
  done_step "$rc"
fi

# ---------------------------------------------------------------- 2. TSan stress (no Python)

STRESS_SRC=(csrc/tests/ring_buffer_stress.cpp csrc/string_table.cpp)
run_tsan() {
  # GCC 12's TSan cannot map its shadow under a 6.x kernel's 32-bit mmap randomisation: retry
  # with address-space randomisation off for this process only.
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1" "$@" >"$LOGS/tsan.out" 2>&1
  local rc=$?
  if grep -q 'unexpected memory mapping' "$LOGS/tsan.out" && command -v setarch >/dev/null; then
    echo "(TSan could not map its shadow memory; rerunning with setarch -R)"
    TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1" setarch "$(uname -m)" -R "$@" \
      >"$LOGS/tsan.out" 2>&1
    rc=$?
  fi
  cat "$LOGS/tsan.out"
  return "$rc"
}

step "ring buffer + string table stress under TSan"
# -fno-builtin: GCC inlines constant-size memcpy/memset (clear_slot) as plain moves TSan never
# sees; as calls they go through TSan's interceptors.
"$CXX_REAL" -std=c++17 -O1 -g -fno-builtin -Wall -Wextra -fsanitize=thread -pthread -Icsrc \
  "${STRESS_SRC[@]}" -o "$WORK/ring_buffer_stress_tsan" &&
  run_tsan "$WORK/ring_buffer_stress_tsan" "$STRESS_RECORDS"
done_step $?

step "ring buffer + string table stress under ASan+UBSan (leaks on)"
"$CXX_REAL" -std=c++17 $SAN -Wall -Wextra -pthread -Icsrc "${STRESS_SRC[@]}" \
  -o "$WORK/ring_buffer_stress_asan" &&
  ASAN_OPTIONS="detect_leaks=1:halt_on_error=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    "$WORK/ring_buffer_stress_asan" "$STRESS_RECORDS"
done_step $?

echo "== total $(( $(date +%s) - STARTED )) s"
if [ "$FAILED" -ne 0 ]; then
  echo "== sanitize: FAILED (logs in $LOGS)"
  exit 1
fi
echo "== sanitize: every step passed, no sanitizer report"
[ -z "${SANITIZE_DIR:-}" ] && rm -rf "$WORK"  # a temp folder of our own: nothing to look at
exit 0
