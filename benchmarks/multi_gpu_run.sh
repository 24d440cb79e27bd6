#!/usr/bin/env bash
# Issue 13 on a machine with 2 GPUs: smoke checks of split and tensor-parallel targets, and the cost
# table of an 8B-shaped target with a 1B-shaped draft. Results and logs go under $OUT.
#
#   bash benchmarks/multi_gpu_run.sh smoke   # ~3-5 min: device_map split, TP=2 (+ TP compile, reported)
#   bash benchmarks/multi_gpu_run.sh cost    # ~3-5 min: per-step costs on 1 GPU and TP=2, the speedup table
#   bash benchmarks/multi_gpu_run.sh all     # both (may exceed a 10-minute limit: prefer two calls)
#
# Each step has its own time limit, so a stuck step still leaves the others' results. Exit status 1
# if a required step failed (the TP compile step is reported only).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/runs/multi_gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 OMP_NUM_THREADS=4
what=${1:-all}
status=0
TORCHRUN=(python -m torch.distributed.run --standalone --nproc-per-node 2)

step() {  # step NAME LIMIT_S REQUIRED(1/0) CMD...
  local name=$1 limit=$2 required=$3
  shift 3
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc in $((SECONDS - start)) s (log $OUT/$name.log)"
  grep -E '^\{|^OK|^FAILED|Error|error' "$OUT/$name.log" | tail -n 40
  if [ "$rc" -ne 0 ] && [ "$required" = 1 ]; then status=1; fi
}

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
python -c "import torch, transformers, accelerate; print('torch', torch.__version__, 'transformers',
transformers.__version__, 'accelerate', accelerate.__version__)" | tee "$OUT/versions.txt"

if [ "$what" = smoke ] || [ "$what" = all ]; then
  step smoke_split 150 1 python benchmarks/multi_gpu_smoke.py --mode split --out "$OUT/smoke_split.json"
  step smoke_tp 240 1 "${TORCHRUN[@]}" benchmarks/multi_gpu_smoke.py --mode tp --out "$OUT/smoke_tp.json"
  step smoke_tp_compile 150 0 "${TORCHRUN[@]}" benchmarks/multi_gpu_smoke.py --mode tp --compile-only \
    --out "$OUT/smoke_tp_compile.json"
fi
if [ "$what" = cost ] || [ "$what" = all ]; then
  step cost_tp1 180 1 python benchmarks/tp_cost.py --out "$OUT/cost_tp1.json"
  step cost_tp2 270 1 "${TORCHRUN[@]}" benchmarks/tp_cost.py --out "$OUT/cost_tp2.json"
  python benchmarks/tp_cost.py --report "$OUT"/cost_tp*.json | tee "$OUT/cost_table.md"
fi
echo "multi_gpu_run $what: $([ $status = 0 ] && echo OK || echo FAILED)"
exit $status
