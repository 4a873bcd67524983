#!/usr/bin/env bash
# One lease on a GPU machine: every step of dev/README.md, most
# important first, each under its own time limit, the whole run under BUDGET
# seconds, so that a short lease still brings back the first results.
#
#   OUT=results BUDGET=540 bash dev/gpu_session.sh
#   STEPS="measure peers" bash dev/gpu_session.sh   # only these steps
#
# OUT defaults to gpu-session, BUDGET to 540 (less than the limits below add
# up to: the last steps are skipped first). Steps, in order: env measure tests
# memcheck peers ncu (every ncu_* profile) long racecheck synccheck initcheck.
# Runs python3 as found, with PYTHONPATH=.: it needs NumPy, Numba, CuPy,
# pytest, Hypothesis, PyTorch and Triton (the env step prints their versions),
# and compute-sanitizer and ncu on PATH.
#
# Writes to $OUT: m.json (python -m lnorm.gpu.measure, with the peers merged
# in), long.json (v4 and v5 at the shapes the model finds hardest) and
# session.log (every step's output: tests, sanitizers, ncu's CSV).
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-gpu-session}
BUDGET=${BUDGET:-540}
mkdir -p "$OUT"
LOG=$OUT/session.log
start=$SECONDS

step() {  # step NAME LIMIT COMMAND...: run, log, report; skip when time is short
  local name=$1 limit=$2 left
  shift 2
  if [[ -n ${STEPS:-} && " $STEPS " != *" ${name%%_*} "* ]]; then
    return
  fi
  left=$((BUDGET - (SECONDS - start)))
  if ((left < 25)); then
    echo "== $name: skipped, $left s of the budget left" | tee -a "$LOG"
    return
  fi
  ((limit > left)) && limit=$left
  echo "== $name (limit $limit s): $*" >>"$LOG"
  local t0=$SECONDS
  timeout "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "== $name: rc $rc in $((SECONDS - t0)) s" | tee -a "$LOG"
}

step env 30 bash -c 'nvidia-smi; g++ --version | head -1; python3 -c "
import cupy, numpy, torch, triton; print(cupy.__version__, numpy.__version__, torch.__version__, triton.__version__)"'
step measure 200 python3 -m lnorm.gpu.measure --repeat 30 --out "$OUT/m.json"
step tests 150 python3 -m pytest tests/test_gpu.py -m "not slow" -q -rs -p no:cacheprovider
step memcheck 90 compute-sanitizer --tool memcheck python3 -m lnorm.gpu.measure --launch-only
step peers 150 python3 dev/peers.py --repeat 30 --merge-into "$OUT/m.json"
METRICS=dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size,launch__block_size
for profile in "8192 8192 float32 v5" "8192 8192 float16 v5" "8192 4096 float32 v5" \
  "8192 768 float32 v5" "8192 768 float32 v4" "8192 768 float16 v5" "8192 768 float16 v4"; do
  set -- $profile
  step "ncu_$1x$2_$3_$4" 60 ncu --csv --metrics "$METRICS" -k regex:ln_ \
    python3 -m lnorm.gpu.measure --profile "$1" "$2" "$3" --rung "$4"
done
step long 90 python3 - "$OUT/long.json" <<'EOF'
import json, sys
import cupy as cp
from lnorm.gpu import measure
from lnorm.gpu.run import FusedLayerNorm
shapes = ((8192, 16384), (2048, 65536), (512, 65536), (32768, 1536), (1048576, 64))
result = measure.time_shapes(cp, FusedLayerNorm(), measure._Timer(cp, 20), shapes,
                             rungs=("v4", "v5"))
for t in result["timings"]:
    print(t["rung"], t["direction"], t["rows"], t["D"], t["dtype"],
          f"{t['copy_share']:.2f}")
json.dump(result, open(sys.argv[1], "w"), indent=1)
EOF
step racecheck 90 compute-sanitizer --tool racecheck python3 -m lnorm.gpu.measure --launch-only
step synccheck 60 compute-sanitizer --tool synccheck python3 -m lnorm.gpu.measure --launch-only
step initcheck 60 compute-sanitizer --tool initcheck python3 -m lnorm.gpu.measure --launch-only
echo "== done in $((SECONDS - start)) s" | tee -a "$LOG"
grep -E "SUMMARY|passed|failed|skipped|error" "$LOG" | tail -20
