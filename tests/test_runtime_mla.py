"""Multi-head latent attention in parplan's runtime (parallel_layers.model.MLAttention), on gloo: 8-rank layouts
against one-rank runs of the same plan (dp folded into gradient accumulation), as test_runtime_moe does for a mixture
of experts.

The down projections and the latents' norms are replicated and run on each rank's own tokens, the latents enter the
tensor-parallel region once (gathered along the sequence under SP) and the up and output projections are split by
heads: a latent summed or gathered over the wrong ranks, a replicated weight's partial gradient not summed over tp, a
head split that mixed one head's key part with another's value, or rotary on the wrong part would change the losses
or the gradients.  All 8-rank jobs share one torchrun invocation, the one-rank references another."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.runtime_helpers import suite
from tests.runtime_helpers.compare import assemble, load_dumps, max_relative_error
from tests.runtime_helpers.plans import TINY_LLAMA, tiny_plan

pytestmark = pytest.mark.multirank

# heads 4 of head_dim 24 (16 no-rope + 8 rotary), values 16 wide (narrower than the query/key head, as DeepSeek's)
TINY_MLA = {**TINY_LLAMA, "kv_heads": 4, "head_dim": 24, "kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 8,
            "v_head_dim": 16}
TINY_MLA_NO_Q_LORA = {**TINY_MLA, "q_lora_rank": None}  # a full query projection (DeepSeek-V2-Lite)
# DeepSeek-V3's layout: a leading dense block, then MoE blocks with a shared expert
TINY_MLA_MOE = {**TINY_MLA, "experts": 4, "experts_per_token": 2, "ffn_hidden": 64, "shared_expert_ffn": 64,
                "first_dense_layers": 1, "dense_ffn_hidden": 128}
LOSS_RTOL = 1e-4
GRAD_RTOL = 1e-5
REFERENCES = {"mla": TINY_MLA, "mla-no-q-lora": TINY_MLA_NO_Q_LORA, "mla-moe": TINY_MLA_MOE}
# the cases below trained with these Training fields (their one-rank references without): the up projections
# recomputed (training.mla_recompute; parallel_layers.rebuild.RebuiltForBackward, or inside the selective checkpoint)
CASE_TRAINING = {"tp2-pp2-dp2-sp-1f1b-full1-mla-recompute": {"mla_recompute": True},
                 "no-q-lora-pp2-dp4-zbv-selective-mla-recompute": {"mla_recompute": True}}
# name -> (reference, parallel layout); 8 ranks each
CASES = {
    # the latents replicated over tp (identity forward, all-reduce backward), then gathered along the sequence (SP)
    "tp2-dp4": ("mla", dict(tp=2, pp=1, dp=4)),
    "tp2-dp4-sp": ("mla", dict(tp=2, pp=1, dp=4, sp=True)),
    # the full query projection reads h: its own SP gather beside the latents'
    "no-q-lora-tp2-dp4-sp": ("mla-no-q-lora", dict(tp=2, pp=1, dp=4, sp=True)),
    # a pipeline: 1F1B with the core checkpointed (selective), and ZB-V, whose queued weight pass makes wq's and wo's
    # weight gradients while the replicated and up projections' come from autograd's own pass
    "pp2-dp4-1f1b-selective": ("mla", dict(tp=1, pp=2, dp=4, schedule="1f1b", recompute="selective")),
    "no-q-lora-tp2-pp2-dp2-sp-zbv": ("mla-no-q-lora", dict(tp=2, pp=2, dp=2, sp=True, schedule="zbv", vpp=2)),
    # whole blocks recomputed (the latents' gather runs again inside the checkpoint); ZeRO-1 over dp
    "tp2-pp2-dp2-sp-1f1b-full-zero1": ("mla", dict(tp=2, pp=2, dp=2, sp=True, schedule="1f1b", recompute="full",
                                                     zero_stage=1)),
    # torchtitan's op-level selective checkpointing over the latent path
    "tp2-dp4-sp-selective-op": ("mla", dict(tp=2, pp=1, dp=4, sp=True, recompute="selective-op")),
    # a mixture of experts behind the latent attention: experts over tp x dp, and in a pipeline whose first stage
    # holds the dense block
    "moe-tp2-dp4-sp-ep4": ("mla-moe", dict(tp=2, pp=1, dp=4, sp=True, ep=4)),
    "moe-tp2-pp2-dp2-sp-ep2-1f1b-selective": ("mla-moe", dict(tp=2, pp=2, dp=2, sp=True, ep=2, schedule="1f1b",
                                                             recompute="selective")),
    # the up projections recomputed (CASE_TRAINING): each stage's first block checkpointed whole (where it does
    # nothing), its second rebuilding the kernel's q, k, v from the SP-gathered latents; and under selective inside
    # the core's checkpoint, beside the full query projection, under ZB-V's split backward
    "tp2-pp2-dp2-sp-1f1b-full1-mla-recompute": ("mla", dict(tp=2, pp=2, dp=2, sp=True, schedule="1f1b",
                                                            recompute="full", recompute_layers=1)),
    "no-q-lora-pp2-dp4-zbv-selective-mla-recompute": ("mla-no-q-lora", dict(tp=1, pp=2, dp=4, schedule="zbv", vpp=2,
                                                                            recompute="selective")),
    # context parallelism (the fifty-second session): each cp rank's two chunks, the rope parts rotated at their global
    # positions, the padded keys and values gathered over cp; beside tp with SP, under selective recompute (the gather
    # checkpointed with the core), at cp 4 without a query latent, and behind a mixture of experts
    "cp2-tp2-dp2-sp": ("mla", dict(tp=2, pp=1, dp=2, cp=2, sp=True)),
    "cp2-dp4-selective": ("mla", dict(tp=1, pp=1, dp=4, cp=2, recompute="selective")),
    "no-q-lora-cp4-tp2": ("mla-no-q-lora", dict(tp=2, pp=1, dp=1, cp=4)),
    "moe-cp2-tp2-dp2-sp-ep2": ("mla-moe", dict(tp=2, pp=1, dp=2, cp=2, sp=True, ep=2)),
}
# the tp2-dp4-sp run's step-2 checkpoint (the replicated down projections and norms one key each, the split up and
# output projections as pieces of the logical tensors) resumed in its own layout and in another of the same tp: pp 2 x
# dp 2 under ZeRO-1 without SP (another tp: tests/test_runtime_multirank.py's tp-resume-mla-moe-tp4, tp 2 -> 4)
CKPT_FROM = "tp2-dp4-sp"
CKPT_RESHARD = dict(tp=2, pp=2, dp=2, schedule="1f1b", zero_stage=1)


def _with_training(plan, training=None):
    return plan.model_copy(update={"training": plan.training.model_copy(update=training)}) if training else plan


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mla")
    ref = [suite._job(tmp, f"ref-{n}", tiny_plan(m, clip_grad=suite.CLIP_GRAD), {}) for n, m in REFERENCES.items()]
    par = [suite._job(tmp, n, _with_training(tiny_plan(REFERENCES[r], clip_grad=suite.CLIP_GRAD, **layout),
                                             CASE_TRAINING.get(n)), {})
           for n, (r, layout) in CASES.items()]
    ck = str(tmp / "ckpt")
    next(j for j in par if j["report"] == str(tmp / CKPT_FROM / "report.json"))["opts"].update(
        checkpoint_dir=ck, checkpoint_every=2)
    for name, layout in (("ckpt-resume", CASES[CKPT_FROM][1]), ("ckpt-reshard", CKPT_RESHARD)):
        plan = tiny_plan(TINY_MLA, clip_grad=suite.CLIP_GRAD, **layout)
        par.append(suite._job(tmp, name, plan, {"checkpoint_dir": ck, "resume": True, "resume_step": 2}))
    return suite.run_phases(tmp, (("ref", ref, 1), ("par", par, 8)))


_report, _losses = suite.report, suite.losses


@pytest.mark.parametrize("case", list(CASES))
def test_losses_match_one_rank(runs, case):
    ref = _losses(runs, f"ref-{CASES[case][0]}")
    got = _losses(runs, case)
    assert len(got) == suite.STEPS and got == pytest.approx(ref, rel=LOSS_RTOL), (case, got, ref)


@pytest.mark.parametrize("case", list(CASES))
def test_gradients_match_one_rank(runs, case):
    """Step 1's reduced gradients: the replicated down projections and latent norms equal on every tp rank (their SP
    partial sums summed over tp), the split ones assembled from the tp ranks' heads."""
    ref = assemble(load_dumps(runs / f"ref-{CASES[case][0]}" / "grads"))
    got = assemble(load_dumps(runs / case / "grads"))
    err, name = max_relative_error(got, ref)
    assert err <= GRAD_RTOL, f"{case}: {name} off by {err:.2e}"


@pytest.mark.parametrize("name", list(REFERENCES))
def test_the_runtime_holds_the_parameters_the_planner_counts(runs, name):
    """The one-rank run's parameters are cost_models.params.param_counts' total (the latents' norms included), and a
    tp 2 rank holds the replicated down projections and norms whole and half of every split projection."""
    from cost_models.params import mla_projections, param_counts
    from planner.schema import ModelSpec
    spec = ModelSpec(**REFERENCES[name])
    assert _report(runs, f"ref-{name}")["params_per_rank"] == [param_counts(spec)["total"]]
    grads = load_dumps(runs / ("tp2-dp4-sp" if name == "mla" else "no-q-lora-tp2-dp4-sp" if name == "mla-no-q-lora"
                               else "moe-tp2-dp4-sp-ep4") / "grads")[0]["grads"]
    attn = {n.split(".attn.")[1]: g for n, g in grads.items() if n.startswith("layers.0.attn.")}
    widths = {n: (i, o, whole) for n, i, o, whole in mla_projections(spec.hidden, spec.heads, spec.head_dim, spec.mla)}
    names = {"q_down": "wq_down", "q_up": "wq_up", "q": "wq", "kv_down": "wkv_down", "kv_up": "wkv_up", "proj": "wo"}
    for proj, (i, o, whole) in widths.items():
        g = attn[f"{names[proj]}.weight"]
        assert g["grad"].numel() == i * o // (1 if whole else 2), (proj, tuple(g["grad"].shape))
        assert (g["tp_dim"] is None) == whole, proj
    norms = sum(g["grad"].numel() for n, g in attn.items() if "norm" in n)
    assert norms == spec.mla.latent_norms()


def test_a_checkpoint_resumes_the_loss_curve_in_its_layout_and_another(runs):
    """Step 3 after resuming from the step-2 checkpoint continues the uninterrupted run: exactly in the same layout,
    within the layouts' tolerance in pp 2 x dp 2 under ZeRO-1 without SP; launch's model check reads the MLA
    parameters' names and shapes back (a plan with another kv_lora_rank is named)."""
    from planner.launch import check_resume, checkpoint_model_mismatch
    straight = _losses(runs, CKPT_FROM)
    same, other = _report(runs, "ckpt-resume"), _report(runs, "ckpt-reshard")
    assert [s["step"] for s in same["steps"]] == [3] and [s["step"] for s in other["steps"]] == [3]
    assert same["steps"][0]["loss"] == pytest.approx(straight[2], rel=1e-7)
    assert other["steps"][0]["loss"] == pytest.approx(straight[2], rel=LOSS_RTOL)
    ck = str(runs / "ckpt")
    plan = tiny_plan(TINY_MLA, **CKPT_RESHARD)
    assert check_resume(ck, 2, 3, plan.parallel.tp, plan).ok
    assert checkpoint_model_mismatch(ck + "/step_00000002", plan) is None
    bad = checkpoint_model_mismatch(ck + "/step_00000002", tiny_plan({**TINY_MLA, "kv_lora_rank": 16}, **CKPT_RESHARD))
    assert bad and "kv" in bad, bad
    noq = checkpoint_model_mismatch(ck + "/step_00000002", tiny_plan(TINY_MLA_NO_Q_LORA, **CKPT_RESHARD))
    assert noq and "wq" in noq, noq


def test_what_the_runtime_does_not_run_is_refused_in_one_line():
    """fp8 with MLA, and context parallelism beside the up-projection recompute: refused by launch's runtime check (and
    planner.core.mla_problem for framework parplan), naming the fix; Megatron's up-projection recompute
    (mla_recompute) it runs, and context parallelism without it."""
    from planner.core import mla_problem
    from planner.launch import check_runtime_support
    from planner.schema import ModelSpec
    spec = ModelSpec(**TINY_MLA)
    assert mla_problem(spec, "parplan", plan=True) is None
    assert check_runtime_support(tiny_plan(TINY_MLA, tp=1, pp=1, dp=2, cp=2), "cpu").ok
    assert mla_problem(spec, "parplan", plan=True, cp=2) is None
    for layout, training, word in ((dict(tp=1, pp=1, dp=2, cp=2), {"mla_recompute": True}, "cp 2"),
                                   (dict(tp=1, pp=1, dp=2), {"fp8": True}, "fp8")):
        plan = _with_training(tiny_plan(TINY_MLA, **layout), training)
        check = check_runtime_support(plan, "cpu")
        assert not check.ok and word in check.line() and "multi-head latent attention" in check.line(), check.line()
        problem = mla_problem(spec, "parplan", plan=True, mla_recompute=plan.training.mla_recompute,
                              cp=plan.parallel.cp, fp8=plan.training.fp8)
        assert problem is not None and word in problem[0]
    plan = _with_training(tiny_plan(TINY_MLA, tp=1, pp=1, dp=2), {"mla_recompute": True})
    assert check_runtime_support(plan, "cpu").ok
    assert mla_problem(spec, "parplan", plan=True, mla_recompute=True) is None


def _held_after_forward(attn, x):
    """The bytes the CPU allocator holds after attn's forward beyond its output (what autograd keeps for the
    backward: the module's rotary tables are made by a first forward, outside the count), the output, and the
    gradients of its parameters and x after a backward."""
    from tests.runtime_helpers.held import traced_cpu_memory
    attn(x)
    with traced_cpu_memory() as traced:
        out = attn(x)
    held = traced() - out.numel() * out.element_size()
    out.square().sum().backward()
    return held, out.detach(), [p.grad for p in attn.parameters()] + [x.grad]


@pytest.mark.parametrize("model", ["mla", "mla-no-q-lora"])
@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_the_up_projections_recompute_frees_what_the_cost_model_counts(model, recompute):
    """mla_recompute in one MLAttention (no process group): the allocator holds, after the forward, exactly
    cost_models.memory.parplan_mla_up_saved_bytes less (the kernel's padded q, k and v, or under selective the
    checkpoint's q and kv; without a query latent q is kept), the output and every gradient are the same to the bit,
    and the blocks full recompute checkpoints whole (and op-level selective's) leave it off."""
    import torch

    from cost_models.layout import REC_NONE, REC_SELECTIVE, Layout
    from cost_models.memory import parplan_mla_up_saved_bytes
    from parallel_layers.model import MLAttention, ModelConfig, StageModule
    from planner.core import model_dims
    plan = tiny_plan(REFERENCES[model])
    cfg = ModelConfig.from_plan(plan)
    b, s = 2, plan.training.seq_len
    runs = {}
    for mla_recompute in (False, True):
        torch.manual_seed(0)
        attn = MLAttention(cfg, 0, None, False, recompute, mla_recompute=mla_recompute)
        with torch.no_grad():
            for p in attn.parameters():
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if p.dim() == 1 else 0.0))  # the norms' weights near 1
        x = torch.randn(b, s, cfg.hidden, generator=torch.Generator().manual_seed(1), requires_grad=True)
        runs[mla_recompute] = _held_after_forward(attn, x)
    lay = Layout(gpus=1, tp=1, pp=1, dp=1, cp=1, vpp=1, mbs=b, zero=0, recompute=REC_SELECTIVE if recompute ==
                 "selective" else REC_NONE, sp=0, schedule=1, offload=0)
    want = parplan_mla_up_saved_bytes(model_dims(plan.model, s, "parplan"), lay, 4)
    assert want > 0 and runs[False][0] - runs[True][0] == want, (runs[False][0], runs[True][0], want)
    assert torch.equal(runs[False][1], runs[True][1])
    assert all(torch.equal(g, h) for g, h in zip(runs[False][2], runs[True][2]))
    stage = StageModule(cfg, [0, 1], first=False, last=False, tp_group=None, recompute="full", recompute_layers=1,
                        mla_recompute=True)
    assert [blk.attn.up_recompute for blk in stage.blocks] == [False, True]
    stage = StageModule(cfg, [0, 1], first=False, last=False, tp_group=None, recompute="selective-op",
                        mla_recompute=True)
    assert not any(blk.attn.up_recompute for blk in stage.blocks)


# DeepSeek-V3's layout in small: a query latent, a leading dense block, a shared expert; and DeepSeek-V2-Lite's, a
# full query projection
DEEPSEEK_V3_STYLE = {"model_type": "deepseek_v3", "hidden_size": 64, "intermediate_size": 128,
                     "moe_intermediate_size": 32, "num_attention_heads": 4, "num_key_value_heads": 4,
                     "num_hidden_layers": 4, "vocab_size": 256, "n_routed_experts": 4, "n_shared_experts": 1,
                     "num_experts_per_tok": 2, "first_k_dense_replace": 1, "kv_lora_rank": 32, "q_lora_rank": 48,
                     "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "max_position_embeddings": 256,
                     "tie_word_embeddings": False}
DEEPSEEK_V2_LITE_STYLE = {**DEEPSEEK_V3_STYLE, "model_type": "deepseek_v2", "q_lora_rank": None}


@pytest.mark.parametrize("config", [DEEPSEEK_V3_STYLE, DEEPSEEK_V2_LITE_STYLE], ids=["deepseek_v3", "deepseek_v2_lite"])
def test_recommend_piped_into_launch_trains_latent_attention(tmp_path, config):
    """The product's path: `parplan recommend --framework parplan --json | parplan launch -` on a DeepSeek-style
    config, 4 CPU ranks, every step reported."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(config))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(suite.REPO)}
    rec = subprocess.run([sys.executable, "-m", "planner.cli", "recommend", "--model-config", str(cfg), "--gpus", "4",
                          "--seq-len", "64", "--global-batch-size", "8", "--framework", "parplan", "--tp", "2",
                          "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert rec.returncode == 0, rec.stderr
    plan = json.loads(rec.stdout)
    assert plan["model"]["kv_lora_rank"] == 32 and plan["parallel"]["tp"] == 2
    report = tmp_path / "report.json"
    run = subprocess.run([sys.executable, "-m", "planner.cli", "launch", "-", "--device", "cpu", "--steps", "3",
                          "--report", str(report), "--moe-balanced-routing"], input=rec.stdout, capture_output=True,
                         text=True, env=env, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    rep = json.loads(report.read_text())
    assert [s["step"] for s in rep["steps"]] == [1, 2, 3] and all(s["loss"] > 0 for s in rep["steps"])
