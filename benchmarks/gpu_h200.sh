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
# 3. the FP8 diagnosis (gpu_calibrated_call.sh's fp8_diagnosis, since the thirty-sixth session: parplan's FP8 linears
#    ran 4.6-5.4x their prediction on 2026-12-06's H100): the 1.3B FP8 entry and its 16-bit twin with a profiled step
#    each, each FP8 operation alone, the FP8 entry under two other cast modes (at most 150 + 120 + 2 x 75 s);
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
# the GPU, the profile calibrate starts from and the one it writes, its other arguments, the call's seconds (LIMIT=
# to change them: the device tool stops a command at 600), then the shared steps (the host's lines, cap/missing/grid,
# calibrate and grids.json)
KIND=H200 BASE=h200-sxm-141gb CAL=h200-calibrated.toml CALIBRATE_ARGS="--sustained 60" LIMIT=${LIMIT:-560}
. benchmarks/gpu_calibrated_call.sh  # (its results folder: the first argument, e.g. benchmarks/results/2026-12-01-h200)

# 3. why parplan's FP8 linears are slow on a GPU (2026-12-06's H100: 4.6-5.4x their prediction)
fp8_diagnosis

# 4. the probe at the launches' width (benchmarks/host_probe_width.py): 2026-11-28's and 2026-12-04's calibrates read
# full recompute 1.2-1.5x under the launches on their machines, no recompute within about 10 %: is it the probe's
# 256-wide block, or its 10 blocks where the launches have 24 (the last row)?  Rows are written as they finish.
# (The 200-step long run and the SDPA kernels, which the 2026-12-04 call ran here, are answered:
# results/2026-12-04-h200, README; gpu_next.sh still runs the long run on an H100.)
study "probe width" host_probe_width.json 240 20 60 python3 benchmarks/host_probe_width.py --device cuda --out "$R/host_probe_width.md" \
  --json "$R/host_probe_width.json"

# 5. FP8 GEMMs shape by shape against the cost model's rule (the 16-bit curve at the same ideal duration, times the
# measured fp8_matmul_scale; benchmarks/fp8_gemm_shapes.py): no FP8 GEMM has run on a GPU here before
study "fp8 shapes" fp8_gemm_shapes.json 90 20 30 python3 benchmarks/fp8_gemm_shapes.py --device cuda --base h200-sxm-141gb \
  --out "$R/fp8_gemm_shapes.md" --json "$R/fp8_gemm_shapes.json"

# 6. parplan's mixture of experts (the twenty-fifth session, checked on CPU only: does it run on a GPU, and how far is
# its eager block with one GEMM per expert from the prediction), then its multi-head latent attention (the
# twenty-seventh session, CPU only: compiled, the values padded to head_dim for the fused kernel), then the dropout run (2026-12-04 ran it 24 % slower than its twin, torch.compile past its recompile limit; the
# runtime fixed since on CPU, and its hidden masks hashed inside the compiled blocks: the same entry again says what
# the two give on a GPU), then the entries no H200 call has reached (eight micro-batches; the 3B at micro-batch 1),
# then launch-bound runs of both recompute modes on this call's host (the calibrate probe read full recompute
# 1.2-1.5x under the launches, no recompute within ~10 %), then the rest, the 3B FP8 entry last (2026-12-06's H100 ran
# it 4.4x its twin: the diagnosis above first)
echo "grid: $(( LIMIT - SECONDS )) s left"
grid "$(cap 600 10)" moe-2.5b-e16-mbs2 moe-2.4b-e8-mbs2 moe-mixed-2.4b-e16-mbs2 mla-1.3b-mbs4 mla-1.3b-mbs4-uprecompute mla-moe-mixed-2.4b-e16-mbs2 gpt-1.3b-mbs4-none-dropout llama-1.3b-mbs1-accum8 llama-3b-mbs1-none llama-1.3b-mbs1-none \
  llama-1.3b-mbs1-full gpt-1.3b-mbs4-none llama-0.5b-mbs1-none llama-0.5b-mbs4-full llama-1.3b-mbs4-selective \
  llama-3b-mbs4-full llama-3b-mbs4-none-fp8
pack; echo "all done at ${SECONDS} s (on CPU afterwards: gpu_grid.py --summarize, gpu_accuracy.py $R)"
