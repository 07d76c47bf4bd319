"""A mixture of experts' recompute modules in parplan's runtime (training.moe_recompute act / norm-act, Megatron-LM's
--recompute-modules moe_act and layernorm moe_act): the experts' activation output, and the pre-MLP norm's, not kept
for the backward but rebuilt from what the block keeps anyway (parallel_layers.model.Block, parallel_layers.moe.MoEMLP,
parallel_layers.rebuild).

One block in one process: the CPU allocator holds exactly cost_models.moe.recomputed_bytes less after its forward (so
a hook that freed nothing, or kept a copy, fails), and its output and every gradient are those of the run without, to
the bit.  Then 4 gloo ranks with expert parallelism against the one-rank run without the recompute (one torchrun for
the references, one for the layouts)."""
from __future__ import annotations

import pytest

from tests.runtime_helpers import suite
from tests.runtime_helpers.compare import assemble, load_dumps, max_relative_error
from tests.runtime_helpers.plans import TINY_MOE, tiny_plan

TINY_MOE_SHARED = {**TINY_MOE, "shared_expert_ffn": 96}
# a dense block before the MoE ones, then every second block MoE (1 and 3), with a shared expert
TINY_MOE_MIXED = {**TINY_MOE_SHARED, "first_dense_layers": 1, "moe_layer_step": 2, "dense_ffn_hidden": 160}
MODELS = {"moe": TINY_MOE, "moe-shared": TINY_MOE_SHARED, "moe-mixed": TINY_MOE_MIXED}


def _held_after_forward(block, x, autocast):
    """The bytes the CPU allocator holds after block's forward beyond its output (what autograd keeps for the
    backward), the output, and the gradients of its parameters and x after a backward."""
    import contextlib
    import gc

    import torch
    from tests.runtime_helpers.held import traced_cpu_memory

    def forward():
        with torch.autocast("cpu", dtype=autocast) if autocast else contextlib.nullcontext():
            return block(x)
    forward()  # the rotary tables' cache, outside the count
    gc.collect()  # (no earlier run's garbage freed inside the count)
    with traced_cpu_memory() as traced:
        out = forward()
    held = traced() - out.numel() * out.element_size()
    out.float().square().sum().backward()
    return held, out.detach(), [p.grad for p in block.parameters()] + [x.grad]


@pytest.mark.parametrize("mode,model,dtype", [("act", "moe", "fp32"), ("norm-act", "moe", "fp32"),
                                              ("norm-act", "moe-shared", "fp32"), ("act", "moe-shared", "bf16"),
                                              ("norm-act", "moe-shared", "bf16")])
def test_the_recompute_modules_free_what_the_cost_model_counts(mode, model, dtype):
    """moe_recompute in one MoE block (no process group; bf16: 16-bit parameters under autocast, the master-weights
    recipe's): the allocator holds, after the forward, exactly cost_models.moe.recomputed_bytes less (the activation's
    output, k x expert_ffn a token; with the norm its output too, h a token, which the router and the shared expert
    both read: one tensor), and the output and every gradient are the same to the bit."""
    import torch

    from cost_models import moe
    from cost_models.layout import REC_NONE, Layout
    from parallel_layers.model import Block, ModelConfig
    from planner.core import model_dims
    plan = tiny_plan(MODELS[model])
    cfg = ModelConfig.from_plan(plan)
    b, s = 2, plan.training.seq_len
    dt, act_bytes = (torch.float32, 4) if dtype == "fp32" else (torch.bfloat16, 2)
    runs = {}
    for rec in ("none", mode):
        block = Block(cfg, 0, None, False, "none", moe_recompute=rec).to(dt)
        with torch.no_grad():
            g = torch.Generator().manual_seed(0)
            for p in block.parameters():  # the norms' weights near 1
                p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if p.dim() == 1 else 0.0))
        x = torch.randn(b, s, cfg.hidden, generator=torch.Generator().manual_seed(1)).to(dt).requires_grad_()
        runs[rec] = _held_after_forward(block, x, dt if dtype == "bf16" else None)
    lay = Layout(gpus=1, tp=1, pp=1, dp=1, cp=1, vpp=1, mbs=b, zero=0, recompute=REC_NONE, sp=0, schedule=1, offload=0)
    want = moe.recomputed_bytes(model_dims(plan.model, s, "parplan"), lay, act_bytes, mode)
    assert want > 0 and runs["none"][0] - runs[mode][0] == want, (runs["none"][0], runs[mode][0], want)
    assert torch.equal(runs["none"][1], runs[mode][1])
    assert all(torch.equal(a, b) for a, b in zip(runs["none"][2], runs[mode][2]))


def test_which_blocks_recompute_what():
    """Full recompute's checkpointed blocks (recompute_layers: the stage's first) leave it off, the others keep it;
    a dense block between the MoE ones has no experts' activation nor MoE norm to rebuild (Megatron's moe_act and its
    pre-MLP layernorm are an MoE block's); op-level selective (refused for experts) leaves it off; and a backward
    through a retained graph rebuilds again, the same gradients."""
    import torch

    from parallel_layers.model import Block, ModelConfig, StageModule, init_parameters
    from parallel_layers.moe import MoEMLP
    cfg = ModelConfig.from_plan(tiny_plan(TINY_MOE_MIXED))
    stage = StageModule(cfg, [0, 1, 2, 3], first=False, last=False, tp_group=None, recompute="full",
                        recompute_layers=2, moe_recompute="norm-act")

    def modes(blocks):
        return [(blk.norm_recompute, isinstance(blk.mlp, MoEMLP) and blk.mlp.act_recompute) for blk in blocks]
    assert modes(stage.blocks) == [(False, False), (False, False), (False, False), (True, True)]
    stage = StageModule(cfg, [0, 1], first=False, last=False, tp_group=None, recompute="selective",
                        moe_recompute="act")
    assert modes(stage.blocks) == [(False, False), (False, True)]
    assert modes([Block(cfg, 1, None, False, "selective-op", moe_recompute="norm-act")]) == [(False, False)]
    block = Block(cfg, 1, None, False, "selective", moe_recompute="norm-act")
    init_parameters(block, 0)
    x = torch.randn(2, 16, cfg.hidden, generator=torch.Generator().manual_seed(1), requires_grad=True)
    out = block(x)
    first = torch.autograd.grad(out.square().sum(), [x, *block.parameters()], retain_graph=True)
    again = torch.autograd.grad(out.square().sum(), [x, *block.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_parplan_plans_them_and_launch_runs_them():
    """The refusal is lifted: planned for framework parplan (planner.core.parplan_moe_problem, launch's runtime
    check); fp8 with experts still refused (ZeRO-2, ZeRO-3 and hybrid sharding no longer:
    tests/test_runtime_moe_zero2.py, tests/test_runtime_moe_zero3.py)."""
    from planner.core import parplan_moe_problem
    from planner.launch import check_runtime_support
    for mode in ("act", "norm-act"):
        assert parplan_moe_problem(1, "alltoall", mode, False, "selective", plan=True) is None
        plan = tiny_plan(TINY_MOE, tp=1, pp=1, dp=2, ep=2)
        plan.training.moe_recompute = mode
        assert check_runtime_support(plan, "cpu").ok
    assert check_runtime_support(tiny_plan(TINY_MOE, tp=1, pp=1, dp=4, ep=2, zero_stage=3), "cpu").ok
    assert check_runtime_support(tiny_plan(TINY_MOE, tp=1, pp=1, dp=8, ep=2, zero_stage=3, dp_replicate=2), "cpu").ok
    assert parplan_moe_problem(3, "alltoall", "act", False, "none", dp_replicate=2) is None
    assert parplan_moe_problem(3, "alltoall", "act", False, "none") is None
    assert parplan_moe_problem(2, "alltoall", "act", False, "none") is None
    assert parplan_moe_problem(1, "alltoall", "act", True, "none") is not None


LOSS_RTOL = 1e-4
GRAD_RTOL = 1e-5
# name -> (model, parallel layout, moe_recompute); 4 ranks each, against the model's one-rank run without it
CASES = {
    # ep over tp x dp with SP: the norm's output a sequence shard, saved by the router and by the shared expert's
    # SP-gathering linears (a view); a dense block before the MoE ones
    "mixed-tp2-dp2-sp-ep4-norm-act": ("moe-mixed", dict(tp=2, pp=1, dp=2, sp=True, ep=4), "norm-act"),
    # ZB-V's split backward with its queued weight passes, the activation under selective recompute's checkpoint
    "pp2-dp2-ep2-zbv-selective-act": ("moe", dict(tp=1, pp=2, dp=2, ep=2, schedule="zbv", vpp=2,
                                                  recompute="selective"), "act"),
    # each stage's first block checkpointed whole (where it does nothing), its second rebuilding both
    "shared-pp2-dp2-ep2-1f1b-full1-norm-act": ("moe-shared", dict(tp=1, pp=2, dp=2, ep=2, schedule="1f1b",
                                                                  recompute="full", recompute_layers=1), "norm-act"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("moe-recompute")
    refs = sorted({model for model, _, _ in CASES.values()})
    ref = [suite._job(tmp, f"ref-{n}", tiny_plan(MODELS[n], clip_grad=suite.CLIP_GRAD), {}) for n in refs]
    par = []
    for name, (model, layout, mode) in CASES.items():
        plan = tiny_plan(MODELS[model], clip_grad=suite.CLIP_GRAD, **layout)
        plan.training.moe_recompute = mode
        par.append(suite._job(tmp, name, plan, {}))
    return suite.run_phases(tmp, (("ref", ref, 1), ("par", par, 4)))


@pytest.mark.multirank
@pytest.mark.parametrize("case", list(CASES))
def test_losses_and_gradients_match_the_one_rank_run_without(runs, case):
    """Every step's loss within 1e-4 of the one-rank run without the recompute modules, and step 1's reduced
    gradients within 1e-5 (the experts' assembled from the ranks holding them)."""
    ref = suite.losses(runs, f"ref-{CASES[case][0]}")
    got = suite.losses(runs, case)
    assert suite.report(runs, case)["plan"]["training"]["moe_recompute"] == CASES[case][2]
    assert got == pytest.approx(ref, rel=LOSS_RTOL), (case, got, ref)
    err, name = max_relative_error(assemble(load_dumps(runs / case / "grads")),
                                   assemble(load_dumps(runs / f"ref-{CASES[case][0]}" / "grads")))
    assert err <= GRAD_RTOL, f"{case}: {name} off by {err:.2e}"
