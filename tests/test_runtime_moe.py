"""A mixture of experts in parplan's runtime (parallel_layers.moe), on gloo: expert-parallel layouts against one-rank
runs of the same plan (dp folded into gradient accumulation), as test_runtime_multirank does for dense models.

ep splits the experts over a stage's tp x cp x dp ranks (tp innermost), so each case sends tokens to experts on other
ranks: a dispatch or combine that lost, duplicated or misplaced a token, a probability applied to the wrong copy, an
expert gradient summed over the wrong ranks or divided wrongly, or an auxiliary loss counted over one rank's
sequence shard only would change the losses or the gradients.  All 8-rank jobs share one torchrun invocation, the
one-rank references another."""
from __future__ import annotations

import json

import pytest

from tests.runtime_helpers import suite
from tests.runtime_helpers.compare import assemble, load_dumps, max_relative_error
from tests.runtime_helpers.plans import TINY_MOE, tiny_plan

pytestmark = pytest.mark.multirank

TINY_MOE_SHARED = {**TINY_MOE, "shared_expert_ffn": 96}
# dense blocks between the MoE ones: block 0 dense (first_dense_layers), then every second block MoE (1 and 3), the
# dense ones a SwiGLU of their own width
TINY_MOE_MIXED = {**TINY_MOE_SHARED, "first_dense_layers": 1, "moe_layer_step": 2, "dense_ffn_hidden": 160}
LOSS_RTOL = 1e-4
GRAD_RTOL = 1e-5
NO_AUX = {"moe_aux_loss_coeff": 0.0}
# one-rank references: name -> (model, options)
REFERENCES = {"moe": (TINY_MOE, {}), "moe-shared": (TINY_MOE_SHARED, {}), "moe-no-aux": (TINY_MOE, NO_AUX),
              "moe-mixed": (TINY_MOE_MIXED, {})}
# name -> (reference, parallel layout); 8 ranks each
CASES = {
    # ep over tp and dp: each tp rank routes its own sequence shard (SP) to experts two dp replicas hold
    "tp2-dp4-sp-ep4": ("moe", dict(tp=2, pp=1, dp=4, sp=True, ep=4)),
    # ep 2 inside the tp group only: the experts' gradients summed over the tp x dp / ep = 4 ranks holding them
    "tp2-dp4-sp-ep2": ("moe", dict(tp=2, pp=1, dp=4, sp=True, ep=2)),
    # a pipeline, whose stages' ranks dispatch among themselves, under 1F1B and under full recompute (the
    # all-to-alls run again inside the checkpoint, in the backward)
    "pp2-tp2-dp2-sp-ep4-1f1b": ("moe", dict(tp=2, pp=2, dp=2, sp=True, ep=4, schedule="1f1b")),
    "pp2-dp4-ep2-interleaved-full": ("moe", dict(tp=1, pp=2, dp=4, ep=2, schedule="interleaved-1f1b", vpp=2,
                                                 recompute="full")),
    # the split input / weight backward of ZB-V, the activation checkpointed by selective recompute
    "pp2-dp4-ep4-zbv-selective": ("moe", dict(tp=1, pp=2, dp=4, ep=4, schedule="zbv", vpp=2,
                                              recompute="selective")),
    # context parallelism: the auxiliary loss's token counts summed over tp and cp, its gradient x cp
    "cp2-tp2-dp2-sp-ep4": ("moe", dict(tp=2, pp=1, dp=2, cp=2, sp=True, ep=4)),
    # a shared expert (tensor-parallel, beside the routed ones) in a pipeline
    "shared-pp2-tp2-dp2-sp-ep2": ("moe-shared", dict(tp=2, pp=2, dp=2, sp=True, ep=2, schedule="1f1b")),
    # ZeRO-1: the experts' states split over their own group (an expert-data-parallel group of 2 here), the rest over
    # dp; with cp, whose replicas ZeRO-1 averages after the dp reduction (not the experts', summed over cp already);
    # and with the optimizer offloaded to the host, in a pipeline
    "zero1-tp2-dp4-sp-ep4": ("moe", dict(tp=2, pp=1, dp=4, sp=True, ep=4, zero_stage=1)),
    "zero1-cp2-tp2-dp2-sp-ep2": ("moe", dict(tp=2, pp=1, dp=2, cp=2, sp=True, ep=2, zero_stage=1)),
    "zero1-offload-pp2-dp4-ep2": ("moe", dict(tp=1, pp=2, dp=4, ep=2, zero_stage=1, offload="optimizer",
                                              schedule="1f1b")),
    # the experts' reduction after the backward instead of during it (as the dense one: --overlap-grad-reduce off),
    # 4 KiB buckets so that they start at different points of the backward: the same buckets, the same values
    "tp2-dp4-sp-ep2-small-buckets": ("moe", dict(tp=2, pp=1, dp=4, sp=True, ep=2)),
    # no auxiliary loss, data parallelism alone: ep 4 over 8 dp ranks, two copies of each expert
    "dp8-ep4-no-aux": ("moe-no-aux", dict(tp=1, pp=1, dp=8, ep=4)),
    # dense blocks between the MoE ones: each stage a dense and an MoE block under 1F1B; and interleaved, where pipeline
    # rank 0's two virtual stages (blocks 0 and 2) are both dense, so its ranks hold no experts (no expert reduction, no
    # experts' ZeRO-1 optimizer) while rank 1's hold all of them
    "mixed-pp2-tp2-dp2-sp-ep4-1f1b": ("moe-mixed", dict(tp=2, pp=2, dp=2, sp=True, ep=4, schedule="1f1b")),
    "mixed-zero1-pp2-dp4-ep4-interleaved": ("moe-mixed", dict(tp=1, pp=2, dp=4, ep=4, schedule="interleaved-1f1b",
                                                              vpp=2, zero_stage=1)),
}


# checkpoints: the ZeRO-1 case's checkpoint after step 2 (its experts one key each, both optimizers' states) resumed in
# the same layout, and in others of the same tp and another ep: pp 2 x dp 2 with ep 2 under ZeRO-0, and ep 1 under
# ZeRO-1 (the experts' states split over 8 ranks where they were over 2); and its checkpoint after step 1 (TP shards
# as pieces of the logical tensors) at tp 1, pp 2 x dp 4 with ep 2, for steps 2 and 3 (step 3 reads the AdamW states)
CKPT_FROM = "zero1-tp2-dp4-sp-ep4"
CKPT_RESHARD = dict(tp=2, pp=2, dp=2, sp=True, ep=2, schedule="1f1b")
CKPT_RESHARD_EP1 = dict(tp=2, pp=1, dp=4, sp=True, ep=1, zero_stage=1)
CKPT_RESHARD_TP1 = dict(tp=1, pp=2, dp=4, ep=2, schedule="1f1b")


# cases run with options of their own beside their reference's
CASE_OPTS = {"tp2-dp4-sp-ep2-small-buckets": {"grad_bucket_bytes": 4096}}
AFTER_BACKWARD = "tp2-dp4-sp-ep2-small-buckets"


def _opts(reference: str, case: str | None = None) -> dict:
    return {**REFERENCES[reference][1], **CASE_OPTS.get(case, {})}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("moe")
    ref = [suite._job(tmp, f"ref-{n}", tiny_plan(m, clip_grad=suite.CLIP_GRAD), o) for n, (m, o) in REFERENCES.items()]
    par = [suite._job(tmp, n, tiny_plan(REFERENCES[r][0], clip_grad=suite.CLIP_GRAD, **layout), _opts(r, n))
           for n, (r, layout) in CASES.items()]
    r, layout = CASES[AFTER_BACKWARD]
    par.append(suite._job(tmp, AFTER_BACKWARD + "-after-backward", tiny_plan(REFERENCES[r][0], clip_grad=suite.CLIP_GRAD,
                                                                             **layout),
                          {**_opts(r, AFTER_BACKWARD), "overlap_grad_reduce": False}))
    ck = str(tmp / "ckpt")
    next(j for j in par if j["report"] == str(tmp / CKPT_FROM / "report.json"))["opts"].update(
        checkpoint_dir=ck, checkpoint_every=1)
    same = tiny_plan(TINY_MOE, clip_grad=suite.CLIP_GRAD, **CASES[CKPT_FROM][1])
    par.append(suite._job(tmp, "ckpt-resume", same, {"checkpoint_dir": ck, "resume": True, "resume_step": 2}))
    for name, layout, step in (("ckpt-reshard", CKPT_RESHARD, 2), ("ckpt-reshard-ep1", CKPT_RESHARD_EP1, 2),
                               ("ckpt-reshard-tp1", CKPT_RESHARD_TP1, 1)):
        other = tiny_plan(TINY_MOE, clip_grad=suite.CLIP_GRAD, **layout)
        par.append(suite._job(tmp, name, other, {"checkpoint_dir": ck, "resume": True, "resume_step": step}))
    return suite.run_phases(tmp, (("ref", ref, 1), ("par", par, 8)))


_report, _losses = suite.report, suite.losses


@pytest.mark.parametrize("case", list(CASES))
def test_losses_match_one_rank(runs, case):
    ref = _losses(runs, f"ref-{CASES[case][0]}")
    got = _losses(runs, case)
    assert got == pytest.approx(ref, rel=LOSS_RTOL), (case, got, ref)


@pytest.mark.parametrize("case", list(CASES))
def test_gradients_match_one_rank(runs, case):
    """Step 1's reduced gradients, the experts' assembled from the ranks holding them (every copy equal)."""
    ref = assemble(load_dumps(runs / f"ref-{CASES[case][0]}" / "grads"))
    got = assemble(load_dumps(runs / case / "grads"))
    err, name = max_relative_error(got, ref)
    assert err <= GRAD_RTOL, f"{case}: {name} off by {err:.2e}"


@pytest.mark.parametrize("case", list(CASES))
def test_each_rank_holds_its_experts(runs, case):
    """E / ep experts a rank (their gradients' first dimension), each expert on tp x cp x dp / ep ranks."""
    layout = CASES[case][1]
    experts, ep = REFERENCES[CASES[case][0]][0]["experts"], layout["ep"]
    held: dict[tuple, int] = {}
    for d in load_dumps(runs / case / "grads"):
        for name, g in d["grads"].items():
            if ".experts." in name:
                assert g["ep_size"] == ep and g["grad"].shape[0] == experts // ep, (name, g["grad"].shape)
                held[(name, g["ep_rank"])] = held.get((name, g["ep_rank"]), 0) + 1
    copies = layout.get("tp", 1) * layout.get("cp", 1) * layout["dp"] // ep
    assert held and set(held.values()) == {copies}, held


def test_dense_blocks_between_hold_their_own_mlp(runs):
    """The mixed model's one-rank run holds the parameters the planner counts (its dense blocks' MLPs of
    dense_ffn_hidden, no router or experts there), fewer than with every block MoE; in the interleaved case the ranks of
    pipeline rank 0 (blocks 0 and 2, both dense) hold no experts, and the others E / ep of each of blocks 1 and 3."""
    from cost_models.params import param_counts
    from planner.schema import ModelSpec
    counted = param_counts(ModelSpec(**TINY_MOE_MIXED))["total"]
    assert _report(runs, "ref-moe-mixed")["params_per_rank"] == [counted]
    assert counted < param_counts(ModelSpec(**TINY_MOE_SHARED))["total"]
    by_stage: dict[int, set] = {}
    for d in load_dumps(runs / "mixed-zero1-pp2-dp4-ep4-interleaved" / "grads"):
        layers = {int(n.split(".")[1]) for n in d["grads"] if ".experts." in n}
        by_stage.setdefault(min(int(n.split(".")[1]) for n in d["grads"] if n.startswith("layers.")) % 2, set()).update(
            layers)
    assert by_stage == {0: set(), 1: {1, 3}}, by_stage


def test_the_auxiliary_loss_moves_the_routers_not_the_experts(runs):
    """At step 1 the auxiliary loss is not in the reported loss and adds to the routers' gradients (and, through each
    router's input, to everything before it), not to the last block's experts, the final norm or the head, whose
    gradients come from the language-model loss alone."""
    with_aux = assemble(load_dumps(runs / "ref-moe" / "grads"))
    without = assemble(load_dumps(runs / "ref-moe-no-aux" / "grads"))
    assert _losses(runs, "ref-moe")[0] == _losses(runs, "ref-moe-no-aux")[0]
    routers = [n for n in with_aux if n.endswith("router.weight")]
    last = f"layers.{TINY_MOE['layers'] - 1}.mlp.experts."
    unmoved = [n for n in with_aux if n.startswith((last, "final_norm", "head"))]
    assert len(routers) == TINY_MOE["layers"] and len(unmoved) == 3 + 2
    for name in routers:
        assert (with_aux[name] - without[name]).abs().max() > 1e-3 * with_aux[name].abs().max(), name
    for name in unmoved:
        assert (with_aux[name] - without[name]).abs().max() == 0, name


# benchmarks/moe_memory.py's plans (4 ranks, balanced routing) whose peak the memory model is held to here: expert
# parallelism over dp, over tp with SP, and inside a pipeline (2026-12-05's run of all ten: |error| median 0.7 %,
# max 2.6 %, benchmarks/results/2026-12-05-cpu-memory-moe; -17.1 % at dp4-ep4 before the combine stopped saving the
# experts' outputs, the weighted SwiGLU's backward stopped upcasting and the expert weights' gradients were grouped),
# and one with a dense block beside an MoE one on pipeline rank 0 (the four mixed plans: median 0.8 %, max 1.2 %,
# benchmarks/results/2026-12-05-cpu-memory-moe-mixed)
MEMORY_CASES = ("dp4-ep4", "tp2-sp-dp2-ep4", "pp2-dp2-ep2-1f1b", "wide-mixed-pp2-dp2-ep2")
MEMORY_BAR = 0.10  # the memory bar for GPU runs, as test_runtime_memory's


@pytest.fixture(scope="module")
def memory_runs(tmp_path_factory):
    from benchmarks import moe_memory
    tmp = tmp_path_factory.mktemp("moe-memory")
    jobs = [j for j in moe_memory.jobs(tmp) if j["report"].split("/")[-2] in MEMORY_CASES]
    assert len(jobs) == len(MEMORY_CASES)
    r = suite.run_jobs(jobs, 4, tmp, "memory", timeout=900)
    assert r.returncode == 0, f"torchrun failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return tmp


@pytest.mark.parametrize("name", MEMORY_CASES)
def test_memory_model_matches_the_cpu_allocator_peak(memory_runs, name):
    rep = _report(memory_runs, name)
    cm = rep["cpu_memory"]
    assert cm["predicted"] == rep["prediction"]["memory_bytes_per_gpu"]["total"]
    assert abs(cm["error"]) <= MEMORY_BAR, (name, cm)


MIXTRAL_STYLE = {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "num_hidden_layers": 4, "vocab_size": 256, "num_local_experts": 4,
                 "num_experts_per_tok": 2, "max_position_embeddings": 256, "tie_word_embeddings": False}
# GLM-4.5's layout: a leading dense block of intermediate_size, a shared expert of moe_intermediate_size
GLM_STYLE = {"model_type": "glm4_moe", "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 64,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 4,
             "vocab_size": 256, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
             "first_k_dense_replace": 1, "max_position_embeddings": 256, "tie_word_embeddings": False}


@pytest.mark.parametrize("config", [MIXTRAL_STYLE, GLM_STYLE], ids=["mixtral", "glm4_moe"])
def test_recommend_piped_into_launch_trains_a_mixture_of_experts(tmp_path, config):
    """The product's path: `parplan recommend --json | parplan launch -` on a Mixtral-style config and on a GLM-4.5-style
    one (a dense block before the MoE ones), 4 CPU ranks with expert parallelism, every step reported."""
    import os
    import subprocess
    import sys
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(config))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(suite.REPO)}
    rec = subprocess.run([sys.executable, "-m", "planner.cli", "recommend", "--model-config", str(cfg), "--gpus", "4",
                          "--seq-len", "64", "--global-batch-size", "8", "--ep", "2", "--json"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert rec.returncode == 0, rec.stderr
    assert json.loads(rec.stdout)["parallel"]["ep"] == 2
    report = tmp_path / "report.json"
    run = subprocess.run([sys.executable, "-m", "planner.cli", "launch", "-", "--device", "cpu", "--steps", "3",
                          "--report", str(report), "--moe-balanced-routing"], input=rec.stdout, capture_output=True,
                         text=True, env=env, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    steps = json.loads(report.read_text())["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3] and all(s["loss"] > 0 for s in steps)
    # balanced routing: every expert of every layer got its share of rank 0's tokens, and the summary says so
    assert all(s["expert_load_imbalance"] == 1.0 for s in steps)
    assert "experts: a layer's busiest expert got 1.00x its share" in run.stderr + run.stdout


def test_the_report_gives_the_routers_imbalance(runs):
    """Without balanced routing the tiny model's routers send some experts more than their share: the report's
    expert_load_imbalance (the median over rank 0's layers of the busiest expert's tokens over the mean) says how much,
    every step."""
    steps = _report(runs, "tp2-dp4-sp-ep4")["steps"]
    assert all(s["expert_load_imbalance"] > 1.0 for s in steps), steps


def test_a_checkpoint_resumes_the_loss_curve_in_its_layout_and_another_ep_or_tp(runs):
    """Step 3 after resuming from the step-2 checkpoint (experts one key each, the experts' own ZeRO-1 optimizer
    saved beside the rest's) continues the uninterrupted run: exactly in the same layout, within the layouts'
    tolerance with ep 2 (pp 2 x dp 2, ZeRO-0) and with ep 1 (ZeRO-1, the experts' states over 8 ranks); and steps 2
    and 3 after resuming from the step-1 one at tp 1 (ep 2, pp 2 x dp 4)."""
    from parallel_layers.checkpoint_steps import saved_ep, saved_tp
    straight = _losses(runs, CKPT_FROM)
    same = _report(runs, "ckpt-resume")
    others = [_report(runs, n) for n in ("ckpt-reshard", "ckpt-reshard-ep1")]
    assert [s["step"] for s in same["steps"]] == [3] and all([s["step"] for s in o["steps"]] == [3] for o in others)
    assert same["steps"][0]["loss"] == pytest.approx(straight[2], rel=1e-7)
    for o in others:
        assert o["steps"][0]["loss"] == pytest.approx(straight[2], rel=LOSS_RTOL)
    tp1 = _report(runs, "ckpt-reshard-tp1")
    assert tp1["plan"]["parallel"]["tp"] == 1 and [s["step"] for s in tp1["steps"]] == [2, 3]
    assert [s["loss"] for s in tp1["steps"]] == pytest.approx(straight[1:], rel=LOSS_RTOL)
    path = str(runs / "ckpt" / "step_00000002")
    assert (saved_tp(path), saved_ep(path)) == (None, None)  # experts one key each, TP shards logical: any ep or tp


def test_launch_checks_a_resume_against_the_saved_model_not_its_ep_or_tp(runs):
    """parplan launch's resume check passes another ep (the experts are keys of their own, one each) and another tp
    (TP shards saved as pieces of the logical tensors), and its model check stacks the experts back: the plan's model
    passes, one of 8 experts is named."""
    from planner.launch import check_resume, checkpoint_model_mismatch
    ck = str(runs / "ckpt")
    for layout in [{**CASES[CKPT_FROM][1], "ep": ep} for ep in (4, 2, 1)] + [CKPT_RESHARD_TP1]:
        plan = tiny_plan(TINY_MOE, clip_grad=suite.CLIP_GRAD, **layout)
        check = check_resume(ck, 2, 3, plan.parallel.tp, plan)
        assert check.ok, check.line()
    assert checkpoint_model_mismatch(ck + "/step_00000002", tiny_plan(TINY_MOE, **CASES[CKPT_FROM][1])) is None
    assert "experts" in (checkpoint_model_mismatch(ck + "/step_00000002",
                                                   tiny_plan({**TINY_MOE, "experts": 8}, **CASES[CKPT_FROM][1])) or "")


def test_reducing_the_experts_during_the_backward_changes_no_value(runs):
    """The experts' gradients reduced over their group during the backward (bucket by bucket as they become final,
    beside the dense reduction) and after it: the same buckets, so the same values to the bit; and the report says
    the experts' buckets did start during the backward."""
    during, after = AFTER_BACKWARD, AFTER_BACKWARD + "-after-backward"
    assert _losses(runs, during) == _losses(runs, after)
    a, b = assemble(load_dumps(runs / during / "grads")), assemble(load_dumps(runs / after / "grads"))
    assert all(bool((a[n] == b[n]).all()) for n in a)
    started = _report(runs, during)["expert_grad_reduce_buckets"]
    assert started["buckets"] > 1 and 0 < started["started_in_backward"], started
    assert _report(runs, after)["expert_grad_reduce_buckets"]["started_in_backward"] == 0
