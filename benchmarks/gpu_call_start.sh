# Sourced by the one-call device scripts (gpu_next.sh, gpu_h200.sh) after they set R (the results folder) and
# KIND (the GPU the call is prepared for, as nvidia-smi names it): installs the carried wheels (.whl/), makes
# $R/host, defines pack (everything under $R into $OUT/results.tgz), and stops the call at once (exit 3) on
# any other GPU kind rather than spend device minutes on a mismatched profile.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >/dev/null 2>&1 || { echo "pip failed: put the pydantic wheels in .whl/"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
mkdir -p "$R/host"
pack() { tar czf "${OUT:-/tmp}/results.tgz" --exclude='*.pickle' "$R" 2>/dev/null; }

nvidia-smi -L > "$R/host/gpu.txt" 2>&1
if ! grep -q "$KIND" "$R/host/gpu.txt"; then
  echo "this call is prepared for an $KIND and this GPU is: $(head -1 "$R/host/gpu.txt")"
  echo "on an H100: bash benchmarks/gpu_h100.sh (or gpu_next.sh); on an H200: bash benchmarks/gpu_h200.sh; elsewhere:"
  echo "python3 -m planner.cli calibrate --out $R/calibrated.toml, then"
  echo "python3 benchmarks/gpu_grid.py --out $R/grid --hardware $R/calibrated.toml"
  pack; exit 3
fi
lscpu > "$R/host/lscpu.txt" 2>&1

# long_run PROFILE [STEPS] [LIMIT_S]: one GPU-bound grid entry (llama-3b-mbs4-none) for STEPS steps (default 200,
# about a minute) with nvidia-smi reading the SM clock, power and temperature every second: does a run slow down as
# the GPU settles under its power and thermal limits, as calibrate --sustained measures on one GEMM?
# (benchmarks/sustained_drift.py reads $R/long on the CPU afterwards)
long_run() {
  mkdir -p "$R/long"
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,nounits -lms 1000 \
    > "$R/long/nvidia-smi.csv" 2>&1 &
  local smi=$!
  timeout "${3:-240}" python3 benchmarks/gpu_grid.py --out "$R/long" --hardware "$1" --steps "${2:-200}" \
    --only llama-3b-mbs4-none 2>&1 | cut -c1-250
  kill "$smi" 2>/dev/null; pack
}
