#!/bin/bash
# 2026-11-23 device call 4: calibrate with the revised host probe (fastest step, compile in-process), the probe twice more, launch-bound repeats
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1 || { echo pip failed; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
R=benchmarks/results/2026-11-23-h100
mkdir -p $R/host
pack() { tar czf $OUT/results.tgz --exclude='*.pickle' $R/grid-2 $R/host $R/h100-calibrated-2.toml $R/calibrate-2.log 2>/dev/null; }
t0=$SECONDS
COLUMNS=160 timeout 300 python3 -m planner.cli calibrate --out $R/h100-calibrated-2.toml > $R/calibrate-2.log 2>&1
echo "calibrate rc=$? took $(( SECONDS - t0 ))s"; grep -i "host ms\|took" $R/calibrate-2.log | cut -c1-200; pack
for i in 1 2; do
  timeout 90 python3 -c "from planner.calibrate import measure_host_block; import json; print(json.dumps(measure_host_block('cuda')))" | tee -a $R/host/host_block_repeats.jsonl
done
echo "repeats done at ${SECONDS}s"; pack
timeout $(( 540 - SECONDS )) python3 benchmarks/gpu_grid.py --out $R/grid-2 --hardware $R/h100-calibrated-2.toml --only \
  llama-1.3b-mbs1-none llama-0.5b-mbs1-none llama-1.3b-mbs1-full llama-0.5b-mbs1-full 2>&1 | cut -c1-250
pack; echo "all done at ${SECONDS}s"
