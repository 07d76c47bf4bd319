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
#    experts and uncompiled (host_moe_block_s / host_moe_expert_s, host_block_eager_s: 36 short runs more), which
#    the MoE entries below check;
# 3. the 1.3B FP8 entry and its 16-bit twin, 6 steps each and one more under torch.profiler (`launch --profile`, new
#    in the thirty-sixth session: <run>/profile/rank0.ops.md, the kernels and host operators the FP8 step spent its
#    time on; into profiled/, apart from the grid, and benchmarks/profile_diff.py's table of the two, printed;
#    at most 150 s);
# 3b. each FP8 operation alone at the 3B launch's shapes (benchmarks/fp8_ops.py: which of them is slow; at most 120 s);
# 3c. the 1.3B FP8 entry again under two other cast modes (PARPLAN_FP8_CAST, parallel_layers.fp8.cast_mode: the
#    cast compiled with static shapes; the amax by ATen and only the scaling and cast compiled), 6 steps each, into
#    fp8cast-static/ and fp8cast-hybrid/: whether the cast is what made the FP8 steps slow (at most 150 s for both);
# 4. the host probe at the launches' width (benchmarks/host_probe_width.py: 2026-12-06's launch-bound 1.3B runs
#    dispatched 1.19x the probe's per block, none and full alike; at most 150 s, rows kept as they finish);
# 5. the grid, with step 2's profile: the second MoE (8 experts: the dispatch per expert, with 2026-12-06's 16), the
#    16-expert one again on this host, the dropout entry no H100 call has reached, a sliding window (FlexAttention in
#    the compiled blocks, new in the fifty-third session), the launch-bound 0.5B in both
#    recompute modes, then the rest until the call's time is spent (last, OLMo 2's block: whole-width q/k norms and
#    the norms after the sublayers, new in the fifty-second session);
# 6. grids.json (written after step 2), so that `python3 benchmarks/gpu_accuracy.py RESULTS` (CPU) re-predicts every
#    report under the datasheet H100 profile, this calibrate, and this calibrate refit over the call's other reports.
# the GPU, the profile calibrate starts from and the one it writes, its other arguments, the call's seconds (LIMIT=
# to change them: the device tool stops a command at 600), then the shared steps (the host's lines, cap/missing/grid,
# calibrate and grids.json)
KIND=H100 BASE=h100-sxm-80gb CAL=h100-calibrated.toml CALIBRATE_ARGS="--sustained 30" LIMIT=${LIMIT:-570}
. benchmarks/gpu_calibrated_call.sh  # (its results folder: the first argument, e.g. benchmarks/results/2026-12-06-h100)

# 3. the FP8 diagnosis (gpu_calibrated_call.sh's fp8_diagnosis: the profiled pair, the op study, the cast modes)
fp8_diagnosis

# 4. the probe at the launches' width
study "probe width" host_probe_width.json 150 20 60 python3 benchmarks/host_probe_width.py --device cuda --out "$R/host_probe_width.md" \
  --json "$R/host_probe_width.json"

# 5. the grid
echo "grid: $(( LIMIT - SECONDS )) s left"
grid "$(cap 600 10)" moe-2.4b-e8-mbs2 moe-2.5b-e16-mbs2 gpt-1.3b-mbs4-none-dropout window-1.3b-8k llama-0.5b-mbs1-none \
  llama-0.5b-mbs1-full llama-1.3b-mbs1-none llama-1.3b-mbs1-full llama-3b-mbs4-none mla-1.3b-mbs4-uprecompute \
  moe-mixed-2.4b-e16-mbs2 llama-0.5b-mbs4-full llama-1.3b-mbs4-full llama-3b-mbs4-full olmo2-1.3b-mbs4
pack; echo "all done at ${SECONDS} s (on CPU afterwards: gpu_grid.py --summarize, gpu_accuracy.py $R)"
