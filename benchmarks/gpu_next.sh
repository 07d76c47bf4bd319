#!/bin/bash
# The next single-GPU device call: what benchmarks/README.md lists under "Next on a GPU" that one GPU
# can answer, in one call of under 10 minutes.  Run from the repository root on the device machine,
# with the wheels the device's python lacks (pydantic and its dependencies) in .whl/:
#
#     bash benchmarks/gpu_next.sh benchmarks/results/YYYY-MM-DD-h100
#
# 1. the host: lscpu, which SDPA kernel torch picks for the grid's GQA attention, the allocator's capacity;
# 2. `parplan calibrate --host-only` on the 2026-11-22 refit profile, timed as its own command;
# 3. the GQA block's saved bytes and backward peak on CUDA (none / selective / full, with the trace);
# 4. gradient-accumulation fusion: eight micro-batches with and without it (the report's wgrad_fusion says
#    whether the CUDA GEMM ran), then one FP8 entry (parplan's FP8 linears, never run on a GPU; predicted with the
#    shipped fp8_matmul_scale, as --host-only measures no GEMM), then the four launch-bound grid entries with step 2's profile, on the same
#    machine, then two near the host bound (the flow-shop wait, predicted from step 2's measured forward share of
#    the dispatch since 2026-11-28), then one entry with and without gradient clipping (its passes in the
#    after-backward phase).
# Everything lands under the results folder and is packed into $OUT/results.tgz after each step.
set -u
R=${1:?give the results folder, e.g. benchmarks/results/2026-12-01-h100}
# every step below builds on the H100 runs (the 2026-11-22 refit profile, grid entries sized for 80 GB)
KIND=H100
. benchmarks/gpu_call_start.sh
python3 - > "$R/host/sdpa_choice.txt" 2>&1 <<'EOF'
import torch
from torch.nn.attention import SDPBackend
# the grid's llama-1.3b attention at tp 1: 16 query heads, 8 key/value heads, head dim 128, seq 2048, mbs 4
q = torch.randn(4, 16, 2048, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
kv = torch.randn(4, 8, 2048, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
for gqa, k in (("enable_gqa", kv), ("no GQA (16 kv heads)", torch.randn_like(q))):
    choice = torch._fused_sdp_choice(q, k, k, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])
    print(f"{gqa}: {SDPBackend(choice).name}")
# what SDPA saves for its backward with grouped K/V: the unexpanded inputs (q 32 MiB, k and v 16 MiB each),
# out 32 MiB and the fp32 log-sum-exp 0.5 MiB = 96.5 MiB (what the CPU kernel saves), or 32 MiB more with
# K and V expanded to the query heads
saved = []
with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel() * t.element_size()) or t, lambda t: t):
    out = torch.nn.functional.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
print(f"SDPA with enable_gqa saves {sum(saved) / 2**20:.1f} MiB in {len(saved)} tensors: "
      + ", ".join(f"{b / 2**20:.1f}" for b in saved))
print("torch", torch.__version__)
# the capacity the CUDA allocator sees (calibrate now writes it as hbm_gbytes; the shipped profile has nvidia-smi's)
print("total_memory", torch.cuda.get_device_properties(0).total_memory, "free/total", torch.cuda.mem_get_info())
EOF
cat "$R/host/sdpa_choice.txt"; pack

t0=$SECONDS
COLUMNS=160 timeout 120 python3 -m planner.cli calibrate --host-only \
  --base benchmarks/results/2026-11-22-h100/h100-refit.toml --out "$R/h100-host.toml" > "$R/host-only.log" 2>&1
echo "calibrate --host-only rc=$? took $(( SECONDS - t0 )) s"; tail -8 "$R/host-only.log" | cut -c1-200; pack

t0=$SECONDS
timeout 120 python3 benchmarks/block_backward_memory.py --device cuda --trace --only parplan-llama-gqa \
  --json "$R/block_backward_gqa.json" 2>&1 | grep -v "^USDT" > "$R/block_backward_gqa.md"
echo "GQA block trace took $(( SECONDS - t0 )) s"; cat "$R/block_backward_gqa.md" | cut -c1-250; pack

[ -f "$R/h100-host.toml" ] || { echo "no host-only profile; skipping the grid"; exit 0; }
t0=$SECONDS
long_run "$R/h100-host.toml" 200 200  # a minute of one GPU-bound run with clocks sampled (sustained_drift.py)
echo "long run took $(( SECONDS - t0 )) s"
timeout $(( 570 - SECONDS )) python3 benchmarks/gpu_grid.py --out "$R/grid" --hardware "$R/h100-host.toml" --only \
  llama-1.3b-mbs1-accum8 llama-1.3b-mbs1-accum8-unfused llama-1.3b-mbs4-none-fp8 \
  llama-1.3b-mbs1-none llama-0.5b-mbs1-none llama-1.3b-mbs1-full llama-0.5b-mbs1-full \
  llama-0.5b-mbs4-full llama-3b-mbs1-none llama-1.3b-mbs4-none llama-1.3b-mbs4-none-noclip 2>&1 | cut -c1-250
pack; echo "all done at ${SECONDS} s"
