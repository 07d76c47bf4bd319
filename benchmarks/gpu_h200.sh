#!/bin/bash
# One device call on an H200 (the kind this workplace lends since 2026-11-26; 15 device minutes a session):
# issue 4's calibrate and a part of its grid, on the same machine, in under 10 minutes.  Run from the
# repository root on the device machine, with the wheels the device's python lacks (pydantic and its
# dependencies) in .whl/ (benchmarks/README.md, "GPU checks"):
#
#     bash benchmarks/gpu_h200.sh benchmarks/results/YYYY-MM-DD-h200
#
# 1. the host: nvidia-smi, lscpu; stops at once (exit 3) on any other GPU kind;
# 2. `parplan calibrate --sustained 60` from the shipped H200 profile (timed: the issue's bar is under 5 minutes;
#    --sustained runs the best GEMM back to back for a minute and writes what it sustains as the profile's
#    sustained_matmul_fraction, instead of keeping the value fitted to Megatron's multi-GPU table; since
#    2026-12-04 it also times its GEMM rows in FP8, torch._scaled_mm, and writes fp8_matmul_scale, the H200's own
#    FP8-over-BF16 GEMM ratio against the shipped 0.914 from the MAMF table; since the twenty-first session also
#    the host-dispatch probe with FP8 linears, host_block_fp8_s, 12 short runs more; its last line gives each
#    phase's seconds);
# 3. the two FP8 grid entries (benchmarks/gpu_grid.py, predicted with step 2's profile): parplan's FP8 linears have
#    never run on a GPU, so they come before any diagnostic (at most 180 s);
# 4. the calibrate's host probe at the grid's 1.3B width as well as its own, and at the launches' block count
#    (benchmarks/host_probe_width.py: why the probe under-reads full recompute; at most 240 s, rows kept as they
#    finish);
# 5. FP8 GEMMs shape by shape against the cost model's FP8 rule (benchmarks/fp8_gemm_shapes.py; at most 90 s);
# 6. the other grid entries, in the order of the open questions, until the call's time is spent;
# 7. grids.json (written after step 2), so that `python3 benchmarks/gpu_accuracy.py RESULTS` (CPU) re-predicts every
#    report under the datasheet H200 profile, this calibrate, and this calibrate refit over the call's other reports.
# Each step is capped by what is left of LIMIT, so a slow calibrate costs the last steps, not the FP8 runs.
# Everything lands under the results folder and is packed into $OUT/results.tgz after each step.
# Resumable: a step whose output is already under the results folder is skipped (the calibrated profile, the two
# studies' JSON, each grid entry's report.json), so after unpacking a call's results.tgz into the checkout the same
# command with LIMIT set to what the session has left (LIMIT=200 ...) continues on the machine still held.
set -u
R=${1:?give the results folder, e.g. benchmarks/results/2026-12-01-h200}
LIMIT=${LIMIT:-560}  # seconds this script may take in all (the device tool stops a command at 600)
KIND=H200
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

if [ -f "$R/h200-calibrated.toml" ]; then
  echo "calibrate: $R/h200-calibrated.toml is there already (a resumed call), kept"
else
  t0=$SECONDS
  COLUMNS=160 timeout "$(cap 300 20)" python3 -m planner.cli calibrate --base h200-sxm-141gb --sustained 60 \
    --out "$R/h200-calibrated.toml" > "$R/calibrate.log" 2>&1
  echo "calibrate rc=$? took $(( SECONDS - t0 )) s" | tee -a "$R/calibrate.log"; tail -12 "$R/calibrate.log" | cut -c1-200; pack
fi
[ -f "$R/h200-calibrated.toml" ] || { echo "no calibrated profile; skipping the grid"; exit 0; }

python3 - "$R" <<'EOF'
import json, sys
torch_line = open(sys.argv[1] + "/host/torch.txt").readline().strip()
gpu = open(sys.argv[1] + "/host/gpu.txt").readline().strip()
json.dump({"about": f"benchmarks/gpu_h200.sh on {gpu} ({torch_line}): the calibrate and every run of "
                    "grid/ on the same machine, the runs predicted at launch with h200-calibrated.toml.",
           "gpu": "H200", "datasheet": "h200-sxm-141gb",
           "grids": {"grid": {"calibrated": "h200-calibrated.toml", "same_machine": True}}},
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
  timeout "$t" python3 benchmarks/gpu_grid.py --out "$R/grid" --hardware "$R/h200-calibrated.toml" --only $todo \
    2>&1 | cut -c1-250
  pack
}

# 3. parplan's FP8 linears (written in the twenty-first session, never run on a GPU): does the runtime's FP8 path
# run, and how close is the prediction (their 16-bit twin llama-3b-mbs4-none ran 2026-12-04)
grid "$(cap 180 20)" llama-3b-mbs4-none-fp8 llama-1.3b-mbs4-none-fp8

# 4. the probe at the launches' width (benchmarks/host_probe_width.py): 2026-11-28's and 2026-12-04's calibrates read
# full recompute 1.2-1.5x under the launches on their machines, no recompute within about 10 %: is it the probe's
# 256-wide block, or its 10 blocks where the launches have 24 (the last row)?  Rows are written as they finish.
# (The 200-step long run and the SDPA kernels, which the 2026-12-04 call ran here, are answered:
# results/2026-12-04-h200, README; gpu_next.sh still runs the long run on an H100.)
t=$(cap 240 20)
if [ -f "$R/host_probe_width.json" ]; then echo "probe width: done already"
elif [ "$t" -ge 60 ]; then
  t0=$SECONDS
  timeout "$t" python3 benchmarks/host_probe_width.py --device cuda --out "$R/host_probe_width.md" \
    --json "$R/host_probe_width.json" 2>&1 | tail -12
  echo "probe width took $(( SECONDS - t0 )) s"; pack
else echo "probe width: ${t} s left, not started"; fi

# 5. FP8 GEMMs shape by shape against the cost model's rule (the 16-bit curve at the same ideal duration, times the
# measured fp8_matmul_scale; benchmarks/fp8_gemm_shapes.py): no FP8 GEMM has run on a GPU here before
t=$(cap 90 20)
if [ -f "$R/fp8_gemm_shapes.json" ]; then echo "fp8 shapes: done already"
elif [ "$t" -ge 30 ]; then
  t0=$SECONDS
  timeout "$t" python3 benchmarks/fp8_gemm_shapes.py --device cuda --base h200-sxm-141gb --out "$R/fp8_gemm_shapes.md" \
    --json "$R/fp8_gemm_shapes.json" 2>&1 | sed -n 1,8p | cut -c1-220
  echo "fp8 shapes took $(( SECONDS - t0 )) s"; pack
else echo "fp8 shapes: ${t} s left, not started"; fi

# 6. parplan's mixture of experts (the twenty-fifth session, checked on CPU only: does it run on a GPU, and how far is
# its eager block with one GEMM per expert from the prediction), then its multi-head latent attention (the
# twenty-seventh session, CPU only: compiled, the values padded to head_dim for the fused kernel), then the dropout run (2026-12-04 ran it 24 % slower than its twin, torch.compile past its recompile limit; the
# runtime fixed since on CPU, and its hidden masks hashed inside the compiled blocks: the same entry again says what
# the two give on a GPU), then the entries no H200 call has reached (eight micro-batches; the 3B at micro-batch 1),
# then launch-bound runs of both recompute modes on this call's host (the calibrate probe read full recompute
# 1.2-1.5x under the launches, no recompute within ~10 %), then the rest
echo "grid: $(( LIMIT - SECONDS )) s left"
grid "$(cap 600 10)" moe-2.5b-e16-mbs2 moe-2.4b-e8-mbs2 moe-mixed-2.4b-e16-mbs2 mla-1.3b-mbs4 mla-1.3b-mbs4-uprecompute mla-moe-mixed-2.4b-e16-mbs2 gpt-1.3b-mbs4-none-dropout llama-1.3b-mbs1-accum8 llama-3b-mbs1-none llama-1.3b-mbs1-none \
  llama-1.3b-mbs1-full gpt-1.3b-mbs4-none llama-0.5b-mbs1-none llama-0.5b-mbs4-full llama-1.3b-mbs4-selective \
  llama-3b-mbs4-full
pack; echo "all done at ${SECONDS} s (on CPU afterwards: gpu_grid.py --summarize, gpu_accuracy.py $R)"
