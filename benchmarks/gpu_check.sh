#!/usr/bin/env bash
# The one prepared GPU check, for a session that is lent an NVIDIA H200 (the device tool).
# From the repository root, on the device machine:
#
#     bash benchmarks/gpu_check.sh
#
# It copies extension/ to a scratch folder, builds opforge_ops there for sm_90 (TORCH_CUDA_ARCH_LIST=9.0, FORCE_CUDA=1) against the torch
# of that machine's python3, runs extension/tests/test_cuda.py and then the other extension
# tests with the CUDA build, and runs benchmarks/bench_cuda.py beside torchvision. Everything
# lands in $OUT (eight files, the device tool's limit):
#   summary.txt   what ran, how long each step took, exit codes, the benchmark table
#   env.txt       nvidia-smi, nvcc, python, torch, torchvision
#   build.log     the full build log, -Xptxas -v register and spill lines included
#   test_cuda.log pytest -rA of tests/test_cuda.py
#   tests_other.log pytest of the other extension tests
#   bench.txt bench.json   the benchmark table
#   opforge_bench.txt      `opforge bench` (the recipes' workloads vs torchvision) and smoke's
#                          speed check (speed:<op>:cuda lines)
# Budget: about 8 minutes on 16 cores (build ~3, tests ~4, benchmarks ~1). Each step has its
# own timeout so that a hang still leaves the logs of the steps before it (BUILD_TIMEOUT,
# default 300 s, and MAX_JOBS, default nproc, can be set for slower machines).
#
# torch: the build pins the torch it is built against. The issue asks for torch 2.14.1; the
# device image ships its own torch and cannot reach a registry, so if python3's torch is not
# 2.14.1 and OPFORGE_TORCH_WHEELS names a folder of wheels (torch, torchvision), they are
# installed from it with --no-index; otherwise the installed torch is used and summary.txt
# says so.
set -uo pipefail

OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
WANT_TORCH=2.14.1
export PYTHONUNBUFFERED=1
START=$(date +%s)
ROOT=$(cd "$(dirname "$0")/.." && pwd)

note() { echo "[gpu_check +$(($(date +%s) - START))s] $*" | tee -a "$OUT/summary.txt"; }

step() {  # step NAME TIMEOUT LOG COMMAND...: runs COMMAND with a timeout, logs, records rc
  local name=$1 limit=$2 log=$3
  shift 3
  local t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  local rc=$?
  note "$name: exit $rc in $(($(date +%s) - t0))s$([ $rc -eq 124 ] && echo " (timed out after ${limit}s)")"
  return $rc
}

: >"$OUT/summary.txt"
note "repository: $ROOT"

# --- torch ---------------------------------------------------------------------------
have_torch=$($PY -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)
if [[ "$have_torch" != "$WANT_TORCH"* && -n "${OPFORGE_TORCH_WHEELS:-}" ]]; then
  note "python3 has torch $have_torch; installing torch==$WANT_TORCH from $OPFORGE_TORCH_WHEELS"
  $PY -m pip install -q --no-index --find-links "$OPFORGE_TORCH_WHEELS" "torch==$WANT_TORCH" torchvision \
    >>"$OUT/summary.txt" 2>&1
  have_torch=$($PY -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)
fi
if [[ "$have_torch" == none ]]; then
  note "FAILED: $PY cannot import torch; set PYTHON to an interpreter that has a CUDA torch"
  exit 1
fi
[[ "$have_torch" == "$WANT_TORCH"* ]] || note "NOTE: building against torch $have_torch, not $WANT_TORCH (none installable here)"

# --- toolchain -----------------------------------------------------------------------
if [[ -z "${CUDA_HOME:-}" ]]; then
  for candidate in /usr/local/cuda-13.0 /usr/local/cuda; do
    [[ -x "$candidate/bin/nvcc" ]] && CUDA_HOME=$candidate && break
  done
  if [[ -z "${CUDA_HOME:-}" ]] && command -v nvcc >/dev/null; then
    CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
  fi
fi
if [[ -z "${CUDA_HOME:-}" ]]; then
  note "FAILED: no nvcc found; set CUDA_HOME to the CUDA toolkit"
  exit 1
fi
export CUDA_HOME PATH="$CUDA_HOME/bin:$PATH"

{
  echo "## nvidia-smi"; nvidia-smi 2>&1
  echo "## nvcc"; nvcc --version 2>&1
  echo "## python"; $PY --version 2>&1
  $PY - <<'EOF' 2>&1
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "git", torch.version.git_version)
print("device", torch.cuda.get_device_name() if torch.cuda.is_available() else "none")
try:
    import torchvision
    print("torchvision", torchvision.__version__)
except ImportError as error:
    print("torchvision missing:", error)
EOF
} >"$OUT/env.txt"
note "CUDA_HOME=$CUDA_HOME; $(grep -m1 '^torch ' "$OUT/env.txt"); $(grep -m1 '^device' "$OUT/env.txt")"

# --- build ---------------------------------------------------------------------------
# In a scratch copy, so that the source tree (and any build in it) is left as it was.
EXT=$(mktemp -d)/extension
mkdir -p "$EXT"
(cd "$ROOT/extension" && tar cf - --exclude=./build --exclude='*.so' --exclude=_build_info.json \
  --exclude=__pycache__ --exclude='*.egg-info' .) | (cd "$EXT" && tar xf -) || exit 1
note "building in $EXT"
cd "$EXT" || exit 1
if ! step build "${BUILD_TIMEOUT:-300}" "$OUT/build.log" env FORCE_CUDA=1 OPFORGE_VARIANT=cu130 OPFORGE_LOCAL_VERSION=cu130 \
  TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS="${MAX_JOBS:-$(nproc)}" "$PY" setup.py build_ext --inplace; then
  note "FAILED: build; the last lines of build.log:"
  tail -n 30 "$OUT/build.log" >>"$OUT/summary.txt"
  exit 1
fi
grep -E "Used [0-9]+ registers|spill" "$OUT/build.log" | sort | uniq -c | sort -rn | head -n 20 >>"$OUT/summary.txt"
note "built: $($PY -c 'import opforge_ops, json; print(json.dumps(opforge_ops.build_info()))' 2>&1)"

# --- tests ---------------------------------------------------------------------------
timeout_flag=()
$PY -c 'import pytest_timeout' 2>/dev/null && timeout_flag=(--timeout=120)
step test_cuda 240 "$OUT/test_cuda.log" "$PY" -m pytest tests/test_cuda.py -rA -q -p no:cacheprovider "${timeout_flag[@]}"
tail -n 3 "$OUT/test_cuda.log" >>"$OUT/summary.txt"
# The MPS tests (device and Metal emulation) have nothing to check on this machine.
others=$(ls tests/test_*.py 2>/dev/null | grep -Ev 'tests/test_(cuda|mps|metal_emu)\.py' | tr '\n' ' ')
if [[ -n "$others" ]]; then
  # shellcheck disable=SC2086
  step tests_other 150 "$OUT/tests_other.log" "$PY" -m pytest $others -q -rfEs -p no:cacheprovider "${timeout_flag[@]}"
  tail -n 3 "$OUT/tests_other.log" >>"$OUT/summary.txt"
fi

# --- benchmarks ----------------------------------------------------------------------
cd "$ROOT" || exit 1
step bench 150 "$OUT/bench.txt" env PYTHONPATH="$EXT" "$PY" benchmarks/bench_cuda.py --json "$OUT/bench.json"
cat "$OUT/bench.txt" >>"$OUT/summary.txt"
# The recipes' workloads through `opforge bench` (cuda and cpu rows, torchvision's kernels as
# the references) and smoke's speed check (each CUDA kernel against the CPU's): opforge from
# this checkout, the CUDA build from $EXT, this interpreter (nothing installed). Needs opforge's
# own dependencies (pyyaml, rich, packaging, platformdirs) in $PY; the log says so otherwise.
step opforge_bench 240 "$OUT/opforge_bench.txt" env PYTHONPATH="$ROOT/src:$EXT" COLUMNS=200 \
  "$PY" -m opforge bench --python "$PY" --file "$ROOT/matrix.yaml" --budget 0.2
step opforge_smoke 240 "$OUT/opforge_bench.txt.smoke" env PYTHONPATH="$ROOT/src:$EXT" \
  "$PY" -m opforge smoke --python "$PY" --file "$ROOT/matrix.yaml" --variant cu130
grep -E "speed:|PASS|FAIL" "$OUT/opforge_bench.txt.smoke" >>"$OUT/opforge_bench.txt"
rm -f "$OUT/opforge_bench.txt.smoke"
tail -n 60 "$OUT/opforge_bench.txt" >>"$OUT/summary.txt"
note "done"
