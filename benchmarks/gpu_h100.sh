#!/bin/bash
# One device call on an H100 (the kind lent again on 2026-12-06, after sixteen sessions without a machine; 15 device
# minutes a session, so one call): the calibrate with --sustained and, on the same machine, the grid entries that
# answer issue 4's open questions on an H100, in under 10 minutes.  Run from the repository root on the device
# machine, with the wheels the device's python lacks (pydantic and its dependencies) in .whl/ (benchmarks/README.md,
# "GPU checks"):
#
#     bash benchmarks/gpu_h100.sh benchmarks/results/YYYY-MM-DD-h100
#
# gpu_h200.sh's steps with an H100's profile and another order.  Its first call (2026-12-06, at fcb1528:
# benchmarks/results/2026-12-06-h100/calls.md) ran the calibrate, then the FP8 entries and their 16-bit twin, the
# launch-bound 1.3B in both recompute modes, the first MoE, the 1.3B GPU-bound, the 1.3B FP8 and the MLA entries:
# the FP8 linears stepped 4.6-5.4x their predicted step and the MoE 1.58x.  The next call, as written now:
# 1. the host: nvidia-smi, lscpu; stops at once (exit 3) on any other GPU kind;
# 2. `parplan calibrate --sustained 30` from the shipped H100 profile (133 s on 2026-12-06; its sustained fraction
#    0.891 there), its FP8 GEMM rows and FP8 host probe included, and since that session the probe as a mixture of
#    experts (host_moe_block_s / host_moe_expert_s, 24 short eager runs more), which the MoE entries below check;
# 3. each FP8 operation alone at the 3B launch's shapes (benchmarks/fp8_ops.py: which of them is slow; at most 120 s);
# 4. the host probe at the launches' width (benchmarks/host_probe_width.py: 2026-12-06's launch-bound 1.3B runs
#    dispatched 1.19x the probe's per block, none and full alike; at most 150 s, rows kept as they finish);
# 5. the grid, with step 2's profile: the second MoE (8 experts: the dispatch per expert, with 2026-12-06's 16), the
#    16-expert one again on this host, the dropout entry no H100 call has reached, the launch-bound 0.5B in both
#    recompute modes, then the rest until the call's time is spent;
# 6. grids.json (written after step 2), so that `python3 benchmarks/gpu_accuracy.py RESULTS` (CPU) re-predicts every
#    report under the datasheet H100 profile, this calibrate, and this calibrate refit over the call's other reports.
set -u
R=${1:?give the results folder, e.g. benchmarks/results/2026-12-06-h100}
LIMIT=${LIMIT:-570}  # seconds this script may take in all (the device tool stops a command at 600)
KIND=H100
. benchmarks/gpu_call_start.sh
nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.sm --format=csv > "$R/host/nvidia-smi.csv" 2>&1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda); \
print('total_memory', torch.cuda.get_device_properties(0).total_memory)" > "$R/host/torch.txt" 2>&1
cat "$R/host/gpu.txt" "$R/host/nvidia-smi.csv" "$R/host/torch.txt"; pack

# cap SECONDS [RESERVE]: SECONDS, or what is left of LIMIT less RESERVE where that is less
cap() { local l=$(( LIMIT - SECONDS - ${2:-0} )); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
# missing NAME...: the grid entries among NAME... not yet run under $R/grid: no report.json, and no launch.log or
# recommend.json either (an entry that failed is not run again; one stopped at the call's limit left neither)
missing() {
  for n in "$@"; do
    [ -f "$R/grid/$n/report.json" ] || [ -f "$R/grid/$n/launch.log" ] || [ -f "$R/grid/$n/recommend.json" ] || printf '%s ' "$n"
  done
}

if [ -f "$R/h100-calibrated.toml" ]; then
  echo "calibrate: $R/h100-calibrated.toml is there already (a resumed call), kept"
else
  t0=$SECONDS
  COLUMNS=160 timeout "$(cap 300 20)" python3 -m planner.cli calibrate --base h100-sxm-80gb --sustained 30 \
    --out "$R/h100-calibrated.toml" > "$R/calibrate.log" 2>&1
  echo "calibrate rc=$? took $(( SECONDS - t0 )) s" | tee -a "$R/calibrate.log"; tail -12 "$R/calibrate.log" | cut -c1-200; pack
fi
[ -f "$R/h100-calibrated.toml" ] || { echo "no calibrated profile; skipping the grid"; exit 0; }

python3 - "$R" <<'EOF'
import json, sys
torch_line = open(sys.argv[1] + "/host/torch.txt").readline().strip()
gpu = open(sys.argv[1] + "/host/gpu.txt").readline().strip()
json.dump({"about": f"benchmarks/gpu_h100.sh on {gpu} ({torch_line}): the calibrate and every run of "
                    "grid/ on the same machine, the runs predicted at launch with h100-calibrated.toml.",
           "gpu": "H100", "datasheet": "h100-sxm-80gb",
           "grids": {"grid": {"calibrated": "h100-calibrated.toml", "same_machine": True}}},
          open(sys.argv[1] + "/grids.json", "w"), indent=1)
EOF

# grid GRID_TIMEOUT NAME...: the named entries not yet run, in that order, into $R/grid with step 2's profile
grid() {
  local t=$1; shift
  local todo; todo=$(missing "$@")
  [ -n "$todo" ] || { echo "grid: every entry named has run"; return; }
  # `timeout 0` would mean no limit at all: with under a minute there is no grid entry to finish anyway
  [ "$t" -ge 60 ] || { echo "grid: ${t} s left, not started: $todo"; return; }
  # shellcheck disable=SC2086
  timeout "$t" python3 benchmarks/gpu_grid.py --out "$R/grid" --hardware "$R/h100-calibrated.toml" --only $todo \
    2>&1 | cut -c1-250
  pack
}

# 3. the FP8 operations one by one (benchmarks/fp8_ops.py)
t=$(cap 120 20)
if [ -f "$R/fp8_ops.json" ]; then echo "fp8 ops: done already"
elif [ "$t" -ge 30 ]; then
  t0=$SECONDS
  timeout "$t" python3 benchmarks/fp8_ops.py --device cuda --out "$R/fp8_ops.md" --json "$R/fp8_ops.json" 2>&1 \
    | tail -45 | cut -c1-200
  echo "fp8 ops took $(( SECONDS - t0 )) s"; pack
else echo "fp8 ops: ${t} s left, not started"; fi

# 4. the probe at the launches' width
t=$(cap 150 20)
if [ -f "$R/host_probe_width.json" ]; then echo "probe width: done already"
elif [ "$t" -ge 60 ]; then
  t0=$SECONDS
  timeout "$t" python3 benchmarks/host_probe_width.py --device cuda --out "$R/host_probe_width.md" \
    --json "$R/host_probe_width.json" 2>&1 | tail -12
  echo "probe width took $(( SECONDS - t0 )) s"; pack
else echo "probe width: ${t} s left, not started"; fi

# 5. the grid
echo "grid: $(( LIMIT - SECONDS )) s left"
grid "$(cap 600 10)" moe-2.4b-e8-mbs2 moe-2.5b-e16-mbs2 gpt-1.3b-mbs4-none-dropout llama-0.5b-mbs1-none \
  llama-0.5b-mbs1-full llama-1.3b-mbs1-none llama-1.3b-mbs1-full llama-3b-mbs4-none mla-1.3b-mbs4-uprecompute \
  moe-mixed-2.4b-e16-mbs2 llama-0.5b-mbs4-full llama-1.3b-mbs4-full llama-3b-mbs4-full
pack; echo "all done at ${SECONDS} s (on CPU afterwards: gpu_grid.py --summarize, gpu_accuracy.py $R)"
