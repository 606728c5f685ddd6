#!/usr/bin/env bash
# The GPU check: on a machine with a CUDA device, in one go (< 8 minutes on an H100/H200):
#   1. the CUDA tests (`pytest -m cuda`: kernels, the layer, every producer in the model, the runner);
#   2. the Triton kernels against the float64 reference at real size, timed against PyG
#      (eager and torch.compile'd) — benchmarks/bench_attention_cuda.py;
#   3. one training step of every model on CUDA — benchmarks/bench_training.py --device cuda.
# Without a GPU it runs the CPU parts: the Triton kernels through Triton's interpreter and the
# fused CPU kernel's smoke benchmark, and says that the CUDA parts were skipped.
#
#   bash benchmarks/gpu_check.sh [LOG_DIR]        (default LOG_DIR: runs/gpu_check)
#
# Peptides batches: GPU machines often lack RDKit; freeze them first on a machine that has the data
# (`python benchmarks/bench_training.py --suite peptides --save-batches .devdata/peptides_batches.pt`)
# and set PEPTIDES_BATCHES to that file. Every step writes its log under LOG_DIR; a failing step
# does not stop the others, and the script exits non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG="${1:-runs/gpu_check}"
mkdir -p "$LOG"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 OUTDATED_IGNORE=1
status=0
step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to $LOG/NAME.log
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "=== $name (limit ${limit}s): $*"
  timeout --signal=INT --kill-after=10 "$limit" "$@" >"$LOG/$name.log" 2>&1
  local rc=$?
  tail -n "${TAIL:-25}" "$LOG/$name.log"
  echo "=== $name: exit $rc in $((SECONDS - t0)) s"
  [ "$rc" -eq 0 ] || status=1
}
# graphattn must be importable as installed (`kernels/` is installed as `graphattn.kernels`): on a
# machine where it is not, install it in place, without touching the dependencies
if ! "$PY" -c "import graphattn.kernels" 2>/dev/null; then
  echo "graphattn is not installed in $PY's environment: pip install --no-deps -e ."
  "$PY" -m pip install -q --no-deps --no-build-isolation -e . || exit 1
fi
"$PY" - <<'PY' 2>&1 | tee "$LOG/env.log"
import platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "| cuda", torch.version.cuda)
try:
    import triton; print("triton", triton.__version__)
except ImportError:
    print("triton: not installed")
import torch_geometric; print("torch_geometric", torch_geometric.__version__)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, f"{p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs, cc {p.major}.{p.minor}")
PY
# The fused CPU kernel is built once per environment (tens of seconds); build it here so that no
# timed step pays for it.
step cpu_extension 120 "$PY" -c "from kernels.cpu_extension import cpu_ops; assert cpu_ops() is not None"
if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  # pytest-xdist, where installed, spreads the tests (and Triton's compilations) over processes
  XDIST=()
  "$PY" -c "import xdist" 2>/dev/null && XDIST=(-n "${GPU_CHECK_WORKERS:-6}")
  step cuda_tests 140 "$PY" -m pytest -q -p no:cacheprovider -m cuda -o addopts="" --timeout 60 \
    "${XDIST[@]}" tests/
  step bench_attention_cuda 130 "$PY" benchmarks/bench_attention_cuda.py --suite roofline features shapes \
    --out "$LOG/bench_attention_cuda.jsonl"
  BATCHES=()
  [ -n "${PEPTIDES_BATCHES:-}" ] && BATCHES=(--load-batches "$PEPTIDES_BATCHES")
  step bench_training_cuda 210 "$PY" benchmarks/bench_training.py --device cuda --suite peptides cora listops \
    --warmup 3 --steps 11 --model-budget 8 "${BATCHES[@]}" --out "$LOG/bench_training_cuda.jsonl"
else
  echo "no CUDA device: the CUDA tests and benchmarks are skipped; running the CPU parts"
  step triton_interpreter 900 "$PY" -m pytest -q -p no:cacheprovider tests/kernels/test_triton.py
  step bench_attention_smoke 300 "$PY" benchmarks/bench_attention.py --suite smoke --threads 1 \
    --out "$LOG/bench_attention_smoke.jsonl"
fi
exit $status
