#!/bin/bash
# 2026-11-23 device call 1: calibrate (8 host-probe runs), a block's backward on CUDA, the two new grid entries
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1 || { echo pip failed; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
R=benchmarks/results/2026-11-23-h100
mkdir -p $R/host
pack() { tar czf $OUT/results.tgz --exclude='*.pickle' $R 2>/dev/null; }
{ date -u; lscpu | head -20; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; python3 -c "import torch;print('torch',torch.__version__, torch.version.cuda)"; } > $R/host/machine.txt 2>&1
grep -i "model name\|^CPU(s)\|H100\|torch" $R/host/machine.txt
t0=$SECONDS
COLUMNS=160 timeout 330 python3 -m planner.cli calibrate --out $R/h100-calibrated.toml > $R/calibrate.log 2>&1
echo "calibrate rc=$? took $(( SECONDS - t0 ))s"; tail -24 $R/calibrate.log | cut -c1-200; pack
t0=$SECONDS
timeout 100 python3 benchmarks/block_backward_memory.py --device cuda --json $R/block_backward.json > $R/block_backward.md 2>&1
echo "block backward rc=$? took $(( SECONDS - t0 ))s"; cat $R/block_backward.md | cut -c1-250; pack
HW=$R/h100-calibrated.toml; [ -f $HW ] || HW=h100-sxm-80gb
timeout $(( 585 - SECONDS )) python3 benchmarks/gpu_grid.py --out $R/grid --hardware $HW --only llama-1.3b-mbs4-selective-op llama-1.3b-mbs4-none-eager 2>&1 | cut -c1-400
pack; echo "all done at ${SECONDS}s"
