#!/bin/bash
# 2026-11-23 device call 3: host-probe order/compile-pool experiment, then the grid's remaining three entries
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1 || { echo pip failed; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
R=benchmarks/results/2026-11-23-h100
mkdir -p $R/host
pack() { tar czf $OUT/results.tgz --exclude='*.pickle' $R/grid $R/host 2>/dev/null; }
P=$R/host/probe_experiment.jsonl
timeout 100 python3 .whl/probe_exp.py A-calibrate-order none,selective,full,selective-op 12 | tee -a $P
timeout 100 python3 .whl/probe_exp.py B-reversed selective-op,full,selective,none 12 | tee -a $P
timeout 80 python3 .whl/probe_exp.py C-none-twice-30steps none,none 30 | tee -a $P
TORCHINDUCTOR_COMPILE_THREADS=1 timeout 80 python3 .whl/probe_exp.py D-compile-threads-1 none,full 12 | tee -a $P
echo "probes done at ${SECONDS}s"; pack
timeout $(( 560 - SECONDS )) python3 benchmarks/gpu_grid.py --out $R/grid --hardware $R/h100-calibrated.toml --only \
  gpt-1.3b-mbs4-none issue3-mfu needs-recompute 2>&1 | cut -c1-250
pack; echo "all done at ${SECONDS}s"
