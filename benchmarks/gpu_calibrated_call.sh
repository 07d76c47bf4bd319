# Sourced by the calibrate-then-grid device scripts (gpu_h100.sh, gpu_h200.sh), whose first argument is the results
# folder (R), after they set LIMIT (the call's seconds), KIND (the GPU, as nvidia-smi names it), BASE (the shipped profile calibrate starts
# from), CAL (the calibrated profile's file name under $R) and CALIBRATE_ARGS (calibrate's other arguments):
# gpu_call_start.sh, the host's nvidia-smi and torch lines, `cap`, `missing`, `grid`, `study` and `fp8_diagnosis`, then calibrate from BASE
# into $R/$CAL (skipped when it is there: a resumed call; the call ends if none is written) and grids.json naming it.
set -u
R=${1:?give the results folder, e.g. benchmarks/results/YYYY-MM-DD-h100}
. benchmarks/gpu_call_start.sh
nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.sm --format=csv > "$R/host/nvidia-smi.csv" 2>&1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda); \
print('total_memory', torch.cuda.get_device_properties(0).total_memory)" > "$R/host/torch.txt" 2>&1
# the node's links as planner/topology.py reads them (since 2026-12-07: checked only on matrices and sysfs trees built
# here until a device call runs these): the matrix, the NICs, and `parplan hardware detect` on both
nvidia-smi topo -m > "$R/host/topo.txt" 2>&1
grep -s . /sys/class/infiniband/*/ports/*/{rate,state,link_layer} /sys/class/net/*/{speed,operstate} > "$R/host/nics.txt"
python3 -m planner.cli hardware detect --json > "$R/host/detect.json" 2>> "$R/host/nics.txt"  # (its nvidia-smi calls stop at 15 s)
cat "$R/host/gpu.txt" "$R/host/nvidia-smi.csv" "$R/host/torch.txt" "$R/host/detect.json"; pack

# cap SECONDS [RESERVE]: SECONDS, or what is left of LIMIT less RESERVE where that is less
cap() { local l=$(( LIMIT - SECONDS - ${2:-0} )); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
# missing NAME...: the grid entries among NAME... not yet run under $R/grid: no report.json, and no launch.log or
# recommend.json either (an entry that failed is not run again; one stopped at the call's limit left neither)
missing() {
  for n in "$@"; do
    [ -f "$R/grid/$n/report.json" ] || [ -f "$R/grid/$n/launch.log" ] || [ -f "$R/grid/$n/recommend.json" ] || printf '%s ' "$n"
  done
}
# grid GRID_TIMEOUT NAME...: the named entries not yet run, in that order, into $R/grid with the calibrated profile
grid() {
  local t=$1; shift
  local todo; todo=$(missing "$@")
  [ -n "$todo" ] || { echo "grid: every entry named has run"; return; }
  # `timeout 0` would mean no limit at all: with under a minute there is no grid entry to finish anyway
  [ "$t" -ge 60 ] || { echo "grid: ${t} s left, not started: $todo"; return; }
  # shellcheck disable=SC2086
  timeout "$t" python3 benchmarks/gpu_grid.py --out "$R/grid" --hardware "$R/$CAL" --only $todo 2>&1 | cut -c1-250
  pack
}
# study LABEL JSON SECONDS RESERVE MINIMUM CMD...: CMD under a timeout of `cap SECONDS RESERVE`, unless $R/JSON is there
# already (a resumed call) or fewer than MINIMUM seconds are left; the tail of its output shown, its time said, packed
study() {
  local label=$1 json=$2 t min=$5 t0; t=$(cap "$3" "$4"); shift 5
  if [ -f "$R/$json" ]; then echo "$label: done already"
  elif [ "$t" -ge "$min" ]; then
    t0=$SECONDS
    timeout "$t" "$@" 2>&1 | tail -20 | cut -c1-220
    echo "$label took $(( SECONDS - t0 )) s"; pack
  else echo "$label: ${t} s left, not started"; fi
}

# fp8_diagnosis: why parplan's FP8 linears ran 4.6-5.4x their prediction on 2026-12-06's H100 (the thirty-sixth
# session's steps, shared by gpu_h100.sh and gpu_h200.sh): the 1.3B FP8 entry and its 16-bit twin, 6 steps each and
# one more under torch.profiler (`launch --profile`) into profiled/, with profile_diff.py's table of the two printed
# (at most 150 s); each FP8 operation alone (fp8_ops.py, at most 120 s); the FP8 entry again under the cast modes
# static and hybrid (PARPLAN_FP8_CAST) into fp8cast-MODE/ (at most 75 s each)
fp8_diagnosis() {
  local t t0 a b mode
  t=$(cap 150 20)
  if [ -f "$R/profiled/llama-1.3b-mbs4-none-fp8/report.json" ]; then echo "profiled: done already"
  elif [ "$t" -ge 60 ]; then
    t0=$SECONDS
    timeout "$t" python3 benchmarks/gpu_grid.py --out "$R/profiled" --hardware "$R/$CAL" --steps 6 --profile \
      --only llama-1.3b-mbs4-none-fp8 llama-1.3b-mbs4-none 2>&1 | cut -c1-250
    for f in "$R"/profiled/*/profile/rank0.ops.md; do [ -f "$f" ] && head -5 "$f" | cut -c1-250; done
    a="$R/profiled/llama-1.3b-mbs4-none/profile/rank0.ops.json" b="$R/profiled/llama-1.3b-mbs4-none-fp8/profile/rank0.ops.json"
    [ -f "$a" ] && [ -f "$b" ] && python3 benchmarks/profile_diff.py "$a" "$b" --top 15 --out "$R/profiled/fp8_vs_16bit.md" \
      | head -45 | cut -c1-200
    echo "profiled took $(( SECONDS - t0 )) s"; pack
  else echo "profiled: ${t} s left, not started"; fi
  study "fp8 ops" fp8_ops.json 120 20 30 python3 benchmarks/fp8_ops.py --device cuda --out "$R/fp8_ops.md" \
    --json "$R/fp8_ops.json"
  for mode in static hybrid; do
    t=$(cap 75 20)
    if [ -f "$R/fp8cast-$mode/llama-1.3b-mbs4-none-fp8/report.json" ]; then echo "fp8 cast $mode: done already"
    elif [ "$t" -ge 45 ]; then
      PARPLAN_FP8_CAST=$mode timeout "$t" python3 benchmarks/gpu_grid.py --out "$R/fp8cast-$mode" --hardware "$R/$CAL" \
        --steps 6 --only llama-1.3b-mbs4-none-fp8 2>&1 | cut -c1-250; pack
    else echo "fp8 cast $mode: ${t} s left, not started"; fi
  done
}

if [ -f "$R/$CAL" ]; then
  echo "calibrate: $R/$CAL is there already (a resumed call), kept"
else
  t0=$SECONDS
  # shellcheck disable=SC2086
  COLUMNS=160 timeout "$(cap 300 20)" python3 -m planner.cli calibrate --base "$BASE" $CALIBRATE_ARGS \
    --out "$R/$CAL" > "$R/calibrate.log" 2>&1
  echo "calibrate rc=$? took $(( SECONDS - t0 )) s" | tee -a "$R/calibrate.log"; tail -12 "$R/calibrate.log" | cut -c1-200; pack
fi
[ -f "$R/$CAL" ] || { echo "no calibrated profile; skipping the grid"; exit 0; }

python3 - "$R" "$0" "$KIND" "$BASE" "$CAL" <<'PY'
import json, sys
root, script, kind, base, cal = sys.argv[1:]
torch_line = open(root + "/host/torch.txt").readline().strip()
gpu = open(root + "/host/gpu.txt").readline().strip()
json.dump({"about": f"{script} on {gpu} ({torch_line}): the calibrate and every run of "
                    f"grid/ on the same machine, the runs predicted at launch with {cal}.",
           "gpu": kind, "datasheet": base,
           "grids": {"grid": {"calibrated": cal, "same_machine": True}}},
          open(root + "/grids.json", "w"), indent=1)
PY
