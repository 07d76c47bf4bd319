#!/bin/bash
# 2026-11-23 device call 2: CUDA allocation trace of the blocks' backward, then the llama grid on this host's calibrated profile
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1 || { echo pip failed; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
R=benchmarks/results/2026-11-23-h100
pack() { tar czf $OUT/results.tgz --exclude='*.pickle' $R/grid $R/host $R/block_backward_trace.* 2>/dev/null; }
{ date -u; lscpu | head -20; } > $R/host/machine-call2.txt 2>&1; grep -i "model name" $R/host/machine-call2.txt
t0=$SECONDS
timeout 120 python3 benchmarks/block_backward_memory.py --device cuda --trace --json $R/block_backward_trace.json 2>&1 | grep -v USDT > $R/block_backward_trace.md
echo "trace rc=$? took $(( SECONDS - t0 ))s"; cut -c1-400 $R/block_backward_trace.md; pack
timeout $(( 588 - SECONDS )) python3 benchmarks/gpu_grid.py --out $R/grid --hardware $R/h100-calibrated.toml --only \
  llama-1.3b-mbs1-full llama-0.5b-mbs1-none llama-1.3b-mbs1-none llama-0.5b-mbs1-full llama-1.3b-mbs4-full llama-1.3b-mbs4-none \
  llama-1.3b-mbs4-selective llama-3b-mbs4-none llama-3b-mbs4-full llama-0.5b-mbs4-none llama-0.5b-mbs4-full llama-3b-mbs1-none llama-3b-mbs1-full 2>&1 | cut -c1-300
pack; echo "all done at ${SECONDS}s"
