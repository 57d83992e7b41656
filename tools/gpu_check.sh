#!/usr/bin/env bash
# What every CUDA change goes through on the GPU machine (the device tool), from the repo root:
# build with pip, self-check, the whole test suite, compute-sanitizer memcheck + racecheck, and
# optionally the benchmark. Logs go to $OUT (the device tool brings that folder back).
#   bash tools/gpu_check.sh [--bench "BENCHMARK ARGS"]
# Knobs (environment): PYTEST_WORKERS (xdist), PYTEST_ARGS (replaces the test selection, e.g.
# "tests/test_op_paths.py -x"; paths under tests/ are taken from the checkout), SANITIZER_TOOLS
# (default "memcheck racecheck"; "" skips), RACECHECK_ARGS (tools/sanitizer_case.py's arguments under
# racecheck only, e.g. "--dtypes float32 bfloat16": the whole case takes minutes there), PROFILE=1 (ncu of tools/profile_case.py, whose
# arguments PROFILE_ARGS gives, e.g. "float32 --case feat --channels-last"), BENCH_MODES (extra
# benchmark runs with the same arguments, e.g. "--deterministic --channels-last"), AB_ARGS (a kernel A/B,
# tools/policy_ab.py's arguments, e.g. "--cases feat feat64 --channels-last --a channel_lanes=true"), SKIP_BUILD=1
# (a warm machine that already has this checkout installed), WHEEL=path (install that wheel, built elsewhere,
# instead of building, the checkout's Python modules over its own; refused, exit 2, where it was built from other
# sources than the checkout's). Each step prints its wall time.
# PYTEST_MARKS replaces the marker expression of the parallel run ("not multi_gpu"), e.g.
# PYTEST_MARKS="cuda and not multi_gpu" for the tests that need a GPU (CI runs the rest): on the
# H200 machine those (334 on 2026-11-30) take about 30 s with -n 12, and the whole suite about 72 s,
# since each xdist worker stopped starting one CPU thread per core (tests/conftest.py); before, the
# GPU tests alone did not finish in 250 s.
set -uo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-/tmp/edsc_ext_gpu_check}"
mkdir -p "$OUT"
BENCH_ARGS=""
[ "${1:-}" = "--bench" ] && BENCH_ARGS="${2:-}"
export PYTHONUNBUFFERED=1 EDSC_EXT_FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
# The device image's default g++ (/opt/gcc) links libstdc++ statically into the extension, and a
# TORCH_CHECK message that formats an integer then crashes inside that copy; the system compiler
# links it dynamically, as torch's own build does (EDSC_EXT_KEEP_CXX=1 keeps $CXX).
if [ -z "${EDSC_EXT_KEEP_CXX:-}" ] && [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++ CC=/usr/bin/gcc; fi
status=0
step() { echo "=== $* (at ${SECONDS}s)"; }

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"

# What the machine lacks travels with the tree, ignored by git: Python packages as wheels in .whl/ (PyAV for
# the video tests; the device tool's README says how to fetch them), installed into /tmp/site; the shared test
# data as .data/ (a copy of ../shared/data, which does not travel).
if ls "$REPO"/.whl/*.whl > /dev/null 2>&1; then
  step "carried wheels: $(cd "$REPO/.whl" && echo *.whl)"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$REPO"/.whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
[ -d "$REPO/.data" ] && export EDSC_EXT_TEST_DATA="$REPO/.data"

cd "$REPO"
if [ -n "${WHEEL:-}" ]; then
  # A wheel built elsewhere (another torch, another machine): installed as it is, never rebuilt here.
  step "install the carried wheel $WHEEL"
  rm -rf build edsc_ext/_C*.so
  python3 -m pip install --no-deps --no-index --force-reinstall "$WHEEL" > "$OUT/build.log" 2>&1 \
    || { tail -30 "$OUT/build.log"; exit 1; }
  # The tests that start Python in the checkout load the installed build only where it was built from the
  # checkout's sources (edsc_ext/_loader.py): a wheel built before an edit under src/ fails every one of them
  # (19 in one run), so refuse it here, in one line.
  (cd /tmp && python3 - "$REPO" "$WHEEL" <<'PY'
import importlib.util
import sys

import edsc_ext

spec = importlib.util.spec_from_file_location("edsc_build_support", sys.argv[1] + "/edsc_ext/_build_support.py")
support = importlib.util.module_from_spec(spec)
spec.loader.exec_module(support)
built, checkout = edsc_ext._BUILD_META.get("sources_digest"), support.sources_digest(sys.argv[1])
if built != checkout:
    sys.exit(f"gpu_check.sh: {sys.argv[2]} was built from sources {built}, this checkout's are {checkout}: "
             "build the wheel again from this checkout")
PY
  ) || exit 2
  # Its binary is the checkout's (checked above), but a wheel built before a Python-only edit carries the
  # older modules, and the checkout's tests would import names they lack: the checkout's Python goes over it.
  site_package="$(cd /tmp && python3 -c 'import edsc_ext, os; print(os.path.dirname(edsc_ext.__file__))')"
  (cd "$REPO/edsc_ext" && find . -name '*.py' ! -name _build_meta.py -exec cp --parents {} "$site_package/" \;) \
    || exit 1
elif [ -z "${SKIP_BUILD:-}" ]; then
  step "build: pip install --no-build-isolation ."
  rm -rf build edsc_ext/_C*.so
  if ! EDSC_EXT_PTXAS_VERBOSE=1 python3 -m pip install -v --no-build-isolation --no-deps --no-index . > "$OUT/build.log" 2>&1; then
    tail -60 "$OUT/build.log"; exit 1
  fi
  echo "ptxas: $(grep -c "bytes spill stores" "$OUT/build.log") kernels, spills in" \
    "$(grep "bytes spill stores" "$OUT/build.log" | grep -vc " 0 bytes spill stores")"
fi
# Test paths relative to the checkout (pytest runs from /tmp, below).
pytest_args=()
for arg in ${PYTEST_ARGS:-}; do
  case "$arg" in tests/*) pytest_args+=("$REPO/$arg") ;; *) pytest_args+=("$arg") ;; esac
done
[ ${#pytest_args[@]} -gt 0 ] || pytest_args=("$REPO/tests")

# Run from outside the checkout so that the installed package, not the source folder, is imported.
cd /tmp
step "python -m edsc_ext"
python3 -m edsc_ext 2>&1 | tee "$OUT/selfcheck.txt" || status=1

# PYTEST_WORKERS defaults to 12 where pytest-xdist is installed (the H200 machine: 16 cores); "" runs serially.
if [ -z "${PYTEST_WORKERS+set}" ] && python3 -c "import xdist" 2>/dev/null; then PYTEST_WORKERS=12; fi
# Single-device tests in parallel (PYTEST_WORKERS, pytest-xdist), then the multi-GPU ones alone:
# they measure memory and launches on the card the others would be using.
step "pytest"
# worksteal: xdist's default hands each worker a contiguous quarter of the suite up front, which put every
# export and AOTInductor test on one worker and made it the whole run's tail.
python3 -X faulthandler -m pytest -v -rs -p no:cacheprovider -m "${PYTEST_MARKS:-not multi_gpu}" --durations=10 \
  ${PYTEST_WORKERS:+-n "$PYTEST_WORKERS" --dist worksteal} "${pytest_args[@]}" > "$OUT/pytest.log" 2>&1 || status=1
grep -E "FAILED|ERROR|passed|failed" "$OUT/pytest.log" | tail -25
step "pytest (multi-GPU)"
python3 -X faulthandler -m pytest -v -rs -p no:cacheprovider -m multi_gpu "$REPO/tests" >> "$OUT/pytest.log" 2>&1 \
  || status=1
grep -E "FAILED|ERROR|passed|failed|SKIPPED" "$OUT/pytest.log" | tail -25

for tool in ${SANITIZER_TOOLS-memcheck racecheck}; do
  step "compute-sanitizer --tool $tool"
  case_args=""
  [ "$tool" = racecheck ] && case_args="${RACECHECK_ARGS:-}"
  # shellcheck disable=SC2086
  compute-sanitizer --tool $tool --error-exitcode 9 python3 "$REPO/tools/sanitizer_case.py" $case_args \
    > "$OUT/$tool.tmp" 2>&1 || status=1
  tail -3 "$OUT/$tool.tmp"
  { echo "=== $tool"; cat "$OUT/$tool.tmp"; } >> "$OUT/sanitizer.log"; rm -f "$OUT/$tool.tmp"
done

if [ -n "${PROFILE:-}" ]; then
  step "ncu (tools/profile_case.py ${PROFILE_ARGS:-float32 --case train})"
  ncu --clock-control none --launch-skip 2 --launch-count 2 -k regex:deform_sepconv \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section InstructionStats --section SchedulerStats \
    --metrics smsp__average_warp_latency_issue_stalled_long_scoreboard,smsp__average_warp_latency_issue_stalled_mio_throttle,smsp__average_warp_latency_issue_stalled_lg_throttle,smsp__average_warp_latency_issue_stalled_short_scoreboard,smsp__average_warp_latency_issue_stalled_barrier,smsp__average_warp_latency_issue_stalled_wait,smsp__average_warp_latency_issue_stalled_math_pipe_throttle \
    python3 "$REPO/tools/profile_case.py" ${PROFILE_ARGS:-} > "$OUT/ncu.txt" 2>&1 || status=1
  grep -E "deform_sepconv|Duration|Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Executed Instructions  |Issue Slots Busy|stalled|No Eligible" \
    "$OUT/ncu.txt" | sed 's/  */ /g' | cut -c1-150 | head -70
fi

if [ -n "${AB_ARGS:-}" ]; then
  step "policy A/B (tools/policy_ab.py $AB_ARGS)"
  # shellcheck disable=SC2086
  python3 "$REPO/tools/policy_ab.py" $AB_ARGS --json "$OUT/ab.json" 2>&1 | tee "$OUT/ab.txt" || status=1
fi

if [ -n "$BENCH_ARGS" ]; then
  step "benchmark $BENCH_ARGS"
  # shellcheck disable=SC2086
  python3 -m edsc_ext.benchmarks.op --no-progress --json "$OUT/bench.json" $BENCH_ARGS 2>"$OUT/bench.err" \
    | tee "$OUT/bench.md" || status=1
  tail -5 "$OUT/bench.err"; [ -s "$OUT/bench.err" ] || rm -f "$OUT/bench.err"
  for mode in ${BENCH_MODES:-}; do
    step "benchmark $BENCH_ARGS $mode"
    # shellcheck disable=SC2086
    python3 -m edsc_ext.benchmarks.op --no-progress $BENCH_ARGS $mode --no-baseline 2>&1 \
      | tee "$OUT/bench${mode//-/_}.md" | grep "edsc_ext |" || status=1
  done
fi
step "gpu_check exit status $status"
exit $status
