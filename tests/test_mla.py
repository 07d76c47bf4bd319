"""Multi-head latent attention (MLA; DeepSeek-V2/V3, Kimi K2) in the cost model: its parameters, GEMMs, attention
core, saved activations and tensor-parallel collectives (ModelSpec.kv_lora_rank; cost_models.params.Mla)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from cost_models import comm
from cost_models.compute import layer_gemms
from cost_models.layout import Layout, ModelDims
from cost_models.memory import activation_bytes_per_layer, layer_params_per_gpu
from cost_models.params import param_counts
from planner.core import PlannerError, recommend, training_consts
from planner.schema import ModelSpec

# DeepSeek-V3's shape (its config.json): 61 blocks, the first 3 dense
DSV3 = dict(name="dsv3-shape", arch="llama", layers=61, hidden=7168, heads=128, kv_heads=128, head_dim=192,
            ffn_hidden=2048, vocab=129280, experts=256, experts_per_token=8, shared_expert_ffn=2048,
            first_dense_layers=3, dense_ffn_hidden=18432, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
            v_head_dim=128)
# DeepSeek-V2-Lite's: no query latent
DSV2_LITE = dict(name="dsv2-lite-shape", arch="llama", layers=27, hidden=2048, heads=16, kv_heads=16, head_dim=192,
                 ffn_hidden=1408, vocab=102400, experts=64, experts_per_token=6, shared_expert_ffn=2816,
                 first_dense_layers=1, dense_ffn_hidden=10944, kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128)
# a small dense model with MLA, for hand counts
SMALL = dict(name="small-mla", arch="llama", layers=4, hidden=512, heads=8, kv_heads=8, head_dim=48, ffn_hidden=1024,
             vocab=1000, kv_lora_rank=64, q_lora_rank=96, qk_rope_head_dim=16, v_head_dim=32)


def _lay(tp=1, sp=0, recompute=0, mbs=1, cp=1, ep=1):
    return Layout(gpus=tp * cp, tp=tp, pp=1, dp=1, cp=cp, vpp=1, mbs=mbs, sp=sp, zero=0, recompute=recompute, schedule=1,
                  offload=0, ep=ep)


def test_deepseek_shapes_count_their_published_totals():
    """DeepSeek-V3: 671B total, 37B activated a token (its card; the multi-token-prediction module's 14B apart);
    DeepSeek-V2-Lite: 15.7B and 2.4B (its card).  The activated counts match without the input embedding (a lookup,
    no matmul: 0.93B and 0.21B)."""
    v3 = param_counts(ModelSpec(**DSV3))
    assert abs(v3["total"] / 671e9 - 1) < 0.002 and abs((v3["active"] - v3["embedding"]) / 37e9 - 1) < 0.02
    lite = param_counts(ModelSpec(**DSV2_LITE))
    assert abs(lite["total"] / 15.7e9 - 1) < 0.01 and abs((lite["active"] - lite["embedding"]) / 2.4e9 - 1) < 0.03


def test_attention_weights_are_the_five_projections_and_the_down_ones_are_whole_on_every_rank():
    spec = ModelSpec(**SMALL)
    h, n, d, r, v, ql, kvl = 512, 8, 48, 16, 32, 96, 64
    by_hand = h * ql + ql * n * d + h * (kvl + r) + kvl * n * (d - r + v) + n * v * h
    mlp = 3 * h * 1024
    assert param_counts(spec)["per_layer_matmul"] == by_hand + mlp
    assert param_counts(spec)["per_layer_other"] == 2 * h + ql + kvl  # the latents' RMSNorms
    m = ModelDims.from_spec(spec, 128)
    whole = h * ql + h * (kvl + r) + ql + kvl
    for tp in (1, 2, 4, 8):
        assert layer_params_per_gpu(m, tp) == pytest.approx((by_hand + mlp - h * ql - h * (kvl + r)) / tp + whole
                                                            + 2 * h)
    # without a query latent the query is one split projection, h x heads * head_dim
    no_q = replace(m, q_lora=0)
    assert layer_params_per_gpu(no_q, 2) == pytest.approx(
        (h * n * d + kvl * n * (d - r + v) + n * v * h + mlp) / 2 + h * (kvl + r) + kvl + 2 * h)


def test_the_down_projections_run_on_the_sequence_shard_with_sp_and_whole_without():
    m = ModelDims.from_spec(ModelSpec(**SMALL), 128)
    T, tp = 1000.0, 4
    no_sp = dict(layer_gemms(m, T, tp))
    sp = dict(layer_gemms(m, T, tp, seq_split=tp))
    assert no_sp["q_down"] == 2 * T * 512 * 96 and sp["q_down"] == no_sp["q_down"] / tp
    assert no_sp["kv_down"] == 2 * T * 512 * 80 and sp["kv_down"] == no_sp["kv_down"] / tp
    for name in ("q_up", "kv_up", "proj", "gate", "up", "fc2"):
        assert sp[name] == no_sp[name]
    assert no_sp["proj"] == 2 * T * 8 * 32 * 512 / tp  # heads x v_dim in
    # one token's GEMMs at tp 1 are its matmul parameters
    assert sum(f for _, f in layer_gemms(m, 1.0, 1)) / 2 == param_counts(ModelSpec(**SMALL))["per_layer_matmul"]


def test_saved_activations_add_the_latents_whole_and_count_values_at_their_width():
    """No recompute, flash: per token 4 h (norm inputs and outputs) + q and k (heads x head_dim) + v and the output
    (heads x v_dim) + the SwiGLU's 3 ffn, all / tp, + both latents twice (norm input, up projection input) whole on
    every rank, + fp32 statistics: the two norms' and the latents' 4 B each, the log-sum-exp 4 B a head."""
    m = ModelDims.from_spec(ModelSpec(**SMALL), 128)
    a = 2
    for tp in (1, 2, 4):
        lay = _lay(tp=tp)
        got = activation_bytes_per_layer(m, lay, a, flash=True) / 128
        want = (4 * 512 + (8 * 48 * 2 + 8 * 32 * 2 + 3 * 1024) / tp + 2 * (96 + 64)) * a + 8 + 8 + 4 * 8 / tp
        assert got == pytest.approx(want)


def test_tensor_parallel_collectives_move_the_latents_before_the_attention():
    """Without SP a dense MLA block's collectives are the MLP's two all-reduces of h, the attention output's of h and
    the latents' gradient all-reduce (q_lora + kv_lora + rope a token) in place of the attention input's h; with SP
    an all-gather and a reduce-scatter of each, the same bytes."""
    from cost_models.total import block_comm, block_time
    import hardware_profiles
    from cost_models.hardware import constants_from_profile
    spec = ModelSpec(**SMALL)
    m = ModelDims.from_spec(spec, 256)
    plan = recommend(spec, 8, framework="megatron", global_batch_size=16, seq_len=256, top_k=1, suggest=False)
    tr = training_consts(plan.training)
    hw = constants_from_profile(hardware_profiles.load_profile("h100-sxm-80gb"), "bf16")
    for sp in (0, 1):
        lay = _lay(tp=2, sp=sp, mbs=2)
        bt = block_time(m, lay, hw, tr.act_bytes, True)
        bc = block_comm(m, replace(tr, sp_saves_gathered_input=False), hw, lay, bt)
        bw, lat = bc.tp_bw, bc.tp_lat
        tokens = 2 * 256
        _, moved_h = comm.all_reduce(tokens * 512 * tr.act_bytes, 2, bw, lat)
        _, moved_l = comm.all_reduce(tokens * (96 + 64 + 16) * tr.act_bytes, 2, bw, lat)
        _, moved_ag = comm.all_gather(tokens * 512 * tr.act_bytes, 2, bw, lat)
        # SP: the MLP's input gathered again in the backward; the attention keeps its gathered latents
        want = 3 * moved_h + moved_l + (moved_ag if sp else 0.0)
        assert float(bc.tp_moved) == pytest.approx(want)
        # without a query latent the query projection reads h: its input comes into the region beside the latents
        # (and under SP is gathered again in the backward, as a column-parallel layer's)
        no_q = replace(m, q_lora=0)
        bc = block_comm(no_q, replace(tr, sp_saves_gathered_input=False), hw, lay, block_time(no_q, lay, hw, 2, True))
        _, moved_lh = comm.all_reduce(tokens * (64 + 16 + 512) * tr.act_bytes, 2, bw, lat)
        assert float(bc.tp_moved) == pytest.approx(3 * moved_h + moved_lh + (2 * moved_ag if sp else 0.0))


def test_model_flops_count_mla_projections_and_both_head_widths():
    """MFU's model FLOPs a token: 6 x a token's matmul parameters (the output layer's too) + 6 L s heads x
    (head_dim + v_dim): QK^T at 192, the values' product at 128 (Megatron-LM's num_floating_point_operations for
    MLA, without its causal halving, as parplan counts every model)."""
    spec = ModelSpec(**DSV2_LITE)
    s = 4096
    plan = recommend(spec, 16, framework="megatron", global_batch_size=64, seq_len=s, top_k=1, suggest=False)
    pr = plan.prediction
    flops_tok = pr.model_tflops_per_gpu * 1e12 * 16 / pr.tokens_per_s
    pc = param_counts(spec)
    want = 6 * pc["matmul"] + 6 * 27 * s * 16 * (192 + 128)
    assert flops_tok == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("framework", ["torchtitan", "deepspeed", "fsdp"])
def test_mla_is_planned_for_megatron_and_parplan_only_and_says_so_in_one_line(framework):
    with pytest.raises(PlannerError) as e:
        recommend(ModelSpec(**SMALL), 8, framework=framework, global_batch_size=16, seq_len=256, top_k=1)
    assert "multi-head latent attention" in str(e.value) and "megatron" in str(e.value)


def test_parplan_plans_mla_with_context_parallelism_not_fp8_and_with_its_padded_values():
    """parplan's runtime (parallel_layers.model.MLAttention): a pinned cp plans (since the fifty-second session), fp8
    and cp beside mla_recompute are refused in one line (mla_recompute it runs at cp 1:
    test_parplan_plans_the_up_projections_recompute_as_its_runtime_frees them); its kernel runs the values' product at
    head_dim (the values padded) and saves q, k, v and the output at head_dim, the output projection's input at v_dim,
    the latents before their norms on the rank's tokens and after them gathered whole; under context parallelism the
    gathered keys and values (the values padded) and each chunk's padded output."""
    from planner.core import model_dims
    from planner.search import Pins
    spec = ModelSpec(**SMALL)
    plan = recommend(spec, 8, framework="parplan", global_batch_size=16, seq_len=1024, top_k=1, suggest=False,
                     pins=Pins(cp=2))
    assert plan.parallel.cp == 2 and plan.prediction.fits
    for kw, words in ((dict(fp8=True), "latent attention"), (dict(pins=Pins(cp=2), mla_recompute=True),
                                                              "context parallelism")):
        with pytest.raises(PlannerError, match=words):
            recommend(spec, 8, framework="parplan", global_batch_size=16, seq_len=1024, top_k=1, **kw)
    # cp 2 against cp 1 a token (tp 1, no recompute; the runtime's all-gather scheme keeps what it gathers): the values'
    # padding and each chunk's output at head_dim (48, the values 32) on top of the generic count's gathered K / V and
    # second output: (2 - 1) x 8 x (48 + 32) + 8 x 32 + 8 x ((1 + 2)(48 - 32) - (2 x 48 - 32)) elements, bf16
    mp0 = model_dims(spec, 1024, "parplan")
    per_token = {cp: activation_bytes_per_layer(mp0, _lay(cp=cp), 2, flash=True, cp_saves_gathered_kv=True)
                 / (1024 / cp) for cp in (1, 2)}
    assert per_token[2] - per_token[1] == pytest.approx(2 * (8 * 80 + 8 * 32 + 8 * (3 * 16 - 64)))
    m, mp = model_dims(spec, 1024, "megatron"), model_dims(spec, 1024, "parplan")
    assert (m.core_width, mp.core_width) == (8 * (48 + 32) // 2, 8 * 48) and m.attn_width == mp.attn_width
    a = 2
    for tp, sp in ((1, 0), (2, 1)):
        lay = _lay(tp=tp, sp=sp)
        split = tp if sp else 1
        mega = activation_bytes_per_layer(m, lay, a, flash=True) / 1024
        ours = activation_bytes_per_layer(mp, lay, a, flash=True) / 1024
        down = 96 + 64 + 16
        want = ((down / split + down) - 2 * (96 + 64)) * a + 8 / split - 8 + 8 * (2 * 48 - 32) / tp * a
        assert ours - mega == pytest.approx(want)


def test_half_an_mla_shape_is_refused():
    for drop in ("qk_rope_head_dim", "v_head_dim", "head_dim"):
        with pytest.raises(ValueError, match="multi-head latent attention"):
            ModelSpec(**{k: v for k, v in SMALL.items() if k != drop})
    with pytest.raises(ValueError, match="kv_lora_rank"):
        ModelSpec(**{k: v for k, v in SMALL.items() if k != "kv_lora_rank"})
    with pytest.raises(ValueError, match="kv_heads"):
        ModelSpec(**{**SMALL, "kv_heads": 4})
    with pytest.raises(ValueError, match="rotary part"):
        ModelSpec(**{**SMALL, "qk_rope_head_dim": 48})


def test_recomputing_the_up_projections_frees_q_k_v_for_their_gemms():
    """training.mla_recompute (Megatron-LM's --recompute-modules mla_up_proj): each block saves (q_width + 2 kv_width)
    / tp fewer elements a token and its backward re-runs the two up projections' GEMMs; a model without latent
    attention is refused in one line."""
    from cost_models.compute import block_time, layer_gemms, linear_gemm_time
    import hardware_profiles
    from cost_models.hardware import constants_from_profile
    from cost_models.memory import mla_up_saved_bytes
    m = ModelDims.from_spec(ModelSpec(**SMALL), 256)
    hw = constants_from_profile(hardware_profiles.load_profile("h100-sxm-80gb"), "bf16")
    lay = _lay(tp=2, sp=1, mbs=2)
    assert mla_up_saved_bytes(m, lay, 2) == 2 * 256 * (8 * 48 + 8 * (48 + 32)) / 2 * 2
    plain, again = (block_time(m, lay, hw, 2, True, mla_recompute=r) for r in (False, True))
    up = dict(layer_gemms(m, 2 * 256, 2))
    extra = linear_gemm_time(up["q_up"], hw) + linear_gemm_time(up["kv_up"], hw)
    assert float(again["gpu"] - plain["gpu"]) == pytest.approx(extra) and extra > 0
    from planner.search import Pins
    pins = Pins(tp=2, pp=2, dp=4, mbs=1, recompute="none", ep=8)
    a, b = (recommend(ModelSpec(**DSV2_LITE), 16, framework="megatron", global_batch_size=64, seq_len=4096, top_k=1,
                      suggest=False, pins=pins, mla_recompute=r) for r in (False, True))
    assert b.prediction.memory_bytes_per_gpu.total < a.prediction.memory_bytes_per_gpu.total
    assert b.prediction.step_time_s > a.prediction.step_time_s
    with pytest.raises(PlannerError, match="latent attention"):
        recommend("llama3-8b", 8, framework="megatron", top_k=1, mla_recompute=True)


def test_parplan_plans_the_up_projections_recompute_as_its_runtime_frees_them():
    """Framework parplan with mla_recompute (parallel_layers.model.MLAttention, measured: tests/test_runtime_mla.py,
    benchmarks/results/2026-12-05-cpu-memory-mla-recompute): a plan's saved activations drop by what the runtime
    stops holding, a block's memory.parplan_mla_up_saved_bytes, not Megatron's q_width + 2 kv_width: the kernel's q,
    k and v padded to head_dim (3 heads x head_dim a token over tp; without a query latent q is kept: 2), under
    selective the checkpoint's q and kv, nothing under full; its backward re-runs the GEMMs from the latents only."""
    from cost_models.compute import block_time, layer_gemms, linear_gemm_time
    from cost_models.hardware import constants_from_profile
    from cost_models.layout import REC_FULL, REC_NONE, REC_SELECTIVE
    from cost_models.memory import mla_up_saved_bytes, parplan_mla_up_saved_bytes
    from planner.core import model_dims
    from planner.search import Pins
    import hardware_profiles
    spec = ModelSpec(**SMALL)
    mp, seq, a = model_dims(spec, 1024, "parplan"), 1024, 2
    noq = model_dims(ModelSpec(**{**SMALL, "q_lora_rank": None}), seq, "parplan")
    per_token = {REC_NONE: 3 * 8 * 48, REC_SELECTIVE: 8 * (48 + 32 + 32), REC_FULL: 0}
    for code, width in per_token.items():
        assert parplan_mla_up_saved_bytes(mp, _lay(tp=2, sp=1, recompute=code), a) == seq * width / 2 * a
    assert parplan_mla_up_saved_bytes(noq, _lay(tp=2, sp=1), a) == seq * 2 * 8 * 48 / 2 * a
    assert parplan_mla_up_saved_bytes(noq, _lay(tp=2, sp=1, recompute=REC_SELECTIVE), a) == seq * 8 * (32 + 32) / 2 * a
    assert per_token[REC_NONE] != 8 * 48 + 8 * (48 + 32)  # Megatron's (mla_up_saved_bytes): v is not padded there
    assert mla_up_saved_bytes(mp, _lay(tp=2, sp=1), a) == seq * (8 * 48 + 8 * (48 + 32)) / 2 * a
    for recompute, code in (("none", REC_NONE), ("selective", REC_SELECTIVE), ("full", REC_FULL)):
        pins = Pins(tp=2, pp=1, dp=4, mbs=1, sp=True, zero=0, recompute=recompute)
        plain, again = (recommend(spec, 8, framework="parplan", global_batch_size=16, seq_len=seq, top_k=1,
                                  suggest=False, pins=pins, mla_recompute=r).prediction for r in (False, True))
        drop = plain.memory_bytes_per_gpu.activations - again.memory_bytes_per_gpu.activations
        assert drop == pytest.approx(spec.layers * float(parplan_mla_up_saved_bytes(mp, _lay(tp=2, sp=1,
                                                                                              recompute=code), a)))
        assert again.step_time_s >= plain.step_time_s  # (a block this small is host-bound: the same)
    hw = constants_from_profile(hardware_profiles.load_profile("h100-sxm-80gb"), "bf16")
    lay = _lay(tp=2, sp=1)
    for m, names in ((mp, ("q_up", "kv_up")), (noq, ("kv_up",))):  # not the full query projection ("q"): kept
        plain, again = (block_time(m, lay, hw, 2, True, mla_recompute=r) for r in (False, True))
        up = dict(layer_gemms(m, seq, 2))
        assert float(again["gpu"] - plain["gpu"]) == pytest.approx(sum(linear_gemm_time(up[n], hw) for n in names))


def test_published_deepseek_v3_runs_are_held_out():
    """megatron_deepseek_h100: DeepSeek-V3 on 512 and 1,024 H100 (NVIDIA's DGX Cloud benchmarking, BF16), nothing
    fitted: +10.7 % and +11.8 % when this was written (+11.0 and +12.4 % since 2026-12-06, with the launches' bf16
    gradient reduction), on the launches' own pipeline splits (7 / 8 x 6 / 6 and 3 / 4 x 14 / 2, the MTP depth a
    last-stage block); without the launch's mla_up_proj recompute the 512-GPU layout would need more than the
    launch's memory: it does not fit with fp32 gradients, and with its bf16 ones only within 2.5 %."""
    import json
    from planner.validate import reference_dir, run_query, validate_set, megatron_deepseek_h100
    data = json.loads((reference_dir() / "megatron_deepseek_h100.json").read_text())
    cases = validate_set("megatron_deepseek_h100", data)
    assert len(cases) == 2 and all(c.predicted is not None for c in cases)
    assert all(abs(c.error) < 0.15 for c in cases), [c.error for c in cases]
    assert all(c.plan.training.mla_recompute and c.plan.parallel.ep == 64 and c.plan.model.mtp_layers == 1
               for c in cases)
    assert sorted(list(c.plan.parallel.stage_layers) for c in cases) == [[3] + [4] * 14 + [2], [7] + [8] * 6 + [6]]
    q = next(iter(megatron_deepseek_h100(data)))
    assert q.gpus == 512 and q.precision == "master-weights-half-grads"
    assert run_query(replace(q, mla_recompute=False, precision="master-weights")) is None
    plain = run_query(replace(q, mla_recompute=False))
    assert plain.prediction.memory_bytes_per_gpu.total > 0.975 * plain.prediction.usable_memory_bytes \
        > cases[0].plan.prediction.memory_bytes_per_gpu.total


def test_deepseek_v3s_published_flops_are_parplans_with_causal_attention_halved():
    """The DeepSeek-V3 rows' printed TFLOP/s over their tokens/s (259.95 and 259.98 GFLOP a token) is NeMo's count for
    DeepSeek-V3 with one MTP layer; parplan's model FLOPs of the same model (latent attention, 3 dense blocks, 58 MoE
    ones, the MTP depth with its projection and second head) less half its attention term (NeMo halves causal
    attention, parplan does not) come to the same within 0.1 %: the MLA projections, the mixed blocks and the MTP
    depth are counted as the publisher counts them."""
    import json
    from planner.validate import reference_dir, validate_set
    data = json.loads((reference_dir() / "megatron_deepseek_h100.json").read_text())
    for c, row in zip(validate_set("megatron_deepseek_h100", data), data["rows"]):
        pr = c.plan.prediction
        ours = pr.model_tflops_per_gpu * 1e12 * c.plan.hardware.gpus / pr.tokens_per_s
        m = ModelDims.from_spec(c.plan.model, row["seq_len"])
        causal = ours - 0.5 * 12 * (m.layers + m.mtp) * row["seq_len"] * m.attn_width
        published = row["model_tflops_per_gpu_as_printed"] * 1e12 / row["tokens_per_s_per_gpu"]
        assert causal == pytest.approx(published, rel=1e-3), (causal, published)


def test_nothing_fits_suggests_the_up_projections_recompute_first():
    """DeepSeek-V3 on 512 H100 with the DGX Cloud launch's layout, its optimizer on the GPU and without mla_up_proj:
    nothing fits (86.1 GB the least when this was written), and the first suggestion, every pin kept, is
    --mla-recompute, which fits (71.3 GB); a model without latent attention is never told to."""
    import subprocess
    import sys
    layout = ["--framework", "megatron", "--tp", "2", "--pp", "8", "--ep", "64", "--vpp", "1", "--mbs", "1", "--dp",
              "32", "--zero", "1", "--recompute", "none", "--sp", "--offload", "none", "--global-batch-size", "4096",
              "--seq-len", "4096"]
    out = subprocess.run([sys.executable, "-m", "planner.cli", "recommend", "--model", "deepseek-v3", "--gpus", "512",
                          "--mtp-layers", "1", *layout], capture_output=True, text=True)
    assert out.returncode == 3, out.stderr  # nothing fits
    error = out.stderr.strip().splitlines()[-1]
    assert error.startswith("error: nothing fits") and "; --mla-recompute (Megatron's --recompute-modules mla_up_proj) " \
        "fits on 512 GPUs (tp 2, pp 8, dp 32, cp 1," in error, error
    from planner.core import NothingFits
    from planner.search import Pins
    with pytest.raises(NothingFits) as e:
        recommend("llama3-70b", 8, framework="megatron", pins=Pins(tp=1, pp=1, offload="none"), top_k=1)
    assert "--mla-recompute" not in str(e.value) and "--offload optimizer fits" in str(e.value)


def test_torchtitan_plans_deepseek_as_its_deepseek_v3_runs_it():
    """torchtitan's deepseek_v3 TP plan (apply_non_moe_tp; its placements read in benchmarks/results/
    2026-12-07-export-parse-moe: wkv_a and wq_a Replicate over tp, wkv_b, wq_b and wq Shard(0), wo Shard(1)) gathers
    the block input and runs the down projections on the whole sequence (ModelDims.mla_input_gathered): under tp 2 with
    SP their FLOPs are twice Megatron-Core's (which runs them on the rank's sequence shard and gathers the latents), the
    split projections' the same; the collective before the attention moves h a token, as a dense block's."""
    from cost_models.compute import layer_gemms
    from planner.core import model_dims
    from planner.models import load_preset
    from planner.search import Pins
    spec = load_preset("deepseek-v2-lite")
    mt, mm = model_dims(spec, 4096, "torchtitan"), model_dims(spec, 4096, "megatron")
    assert mt.mla_input_gathered and not mm.mla_input_gathered
    gt, gm = dict(layer_gemms(mt, 4096, 2, 2)), dict(layer_gemms(mm, 4096, 2, 2))
    assert gt["kv_down"] == pytest.approx(2 * gm["kv_down"]) and gt["kv_up"] == gm["kv_up"] and gt["q"] == gm["q"]
    plan = recommend("deepseek-v2-lite", 16, framework="torchtitan", pins=Pins(tp=2, pp=1), top_k=1, suggest=False)
    assert plan.prediction.fits and plan.parallel.ep > 1 and plan.parallel.cp == 1
    for kw, match in ((dict(pins=Pins(cp=2)), "only supports SDPA attention"), (dict(mla_recompute=True),
                      "mla_up_proj recompute module"), (dict(fp8=True), "fp8")):
        with pytest.raises(PlannerError, match=match):
            recommend("deepseek-v2-lite", 16, framework="torchtitan", top_k=1, suggest=False, **kw)


def test_torchtitan_exports_deepseek_flavors_and_registers_others():
    import tomllib
    from planner.export import export_notes, export_plan
    from planner.search import Pins
    plan = recommend("deepseek-v2-lite", 16, framework="torchtitan", pins=Pins(pp=1), top_k=1, suggest=False)
    cfg = tomllib.loads(export_plan(plan, "torchtitan-0.2"))
    assert cfg["model"] == {"name": "deepseek_v3", "flavor": "16B"}
    assert any("FlexAttention" in n for n in export_notes(plan, "torchtitan-0.2"))
    kimi = recommend("kimi-k2", 1024, framework="torchtitan", pins=Pins(pp=1), top_k=1, suggest=False)
    note = next(n for n in export_notes(kimi, "torchtitan-0.2") if "register 'kimi-k2'" in n)
    assert "DeepSeekV3ModelArgs(" in note and "num_experts=384" in note and "n_dense_layers=1" in note
    assert "q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64" in note
