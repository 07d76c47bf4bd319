"""A mixture of experts under ZeRO-3 (FSDP2) in parplan's runtime, torchtitan's layout: the dense weights fully sharded
over dp as the dense ZeRO-3 does, each MoE layer's experts (parallel_layers.moe.GroupedExperts) an FSDP2 unit of their
own over their expert-data-parallel group, the tp x cp x dp / ep ranks holding the same experts
(parallel_layers.data_parallel.shard_experts over mesh.expert_data_parallel_mesh; torchtitan's
``fully_shard(transformer_block.moe.experts, mesh=edp_mesh)``, torchtitan/models/llama4/infra/parallelize.py).

One torchrun for the one-rank reference, one of 8 ranks for the layouts (ep 2, tp 2 with SP, a pipeline of 2 with ep 4,
cp 2, the optimizer offloaded, hybrid sharding, and ep 4 resumed; the 4-rank layouts are benchmarks/moe_memory.py's zero3 plans): every step's loss, step 1's gradient
norm (clip.copies: an expert's shard counted once) and step 1's reduced gradients (each gathered whole for the dump)
match the reference, each rank holds 1 / (its expert-data-parallel group) of its experts' gradient elements, and a
checkpoint saved at step 2 under ZeRO-3 with experts resumes in another ep to the uninterrupted run's step-3 loss."""
from __future__ import annotations

import pytest

from tests.runtime_helpers import suite
from tests.runtime_helpers.compare import assemble, load_dumps, max_relative_error
from tests.runtime_helpers.plans import TINY_MOE, tiny_plan

pytestmark = pytest.mark.multirank

LOSS_RTOL = 1e-4
GRAD_RTOL = 1e-5
# name -> parallel layout, all 8 ranks, ZeRO-3; (edp: the ranks holding the same experts)
CASES = {
    # ep 2 over dp 8: each expert's weights sharded over 4 ranks, the dense ones over 8
    "zero3-dp8-ep2": dict(tp=1, pp=1, dp=8, ep=2, zero_stage=3),
    # ep 2 inside the tp group with SP: the experts' group is the 4 dp ranks, the dense weights over dp 4 of tp shards
    "zero3-tp2-dp4-sp-ep2": dict(tp=2, pp=1, dp=4, sp=True, ep=2, zero_stage=3),
    # a pipeline of 2 (FSDP2 + 1F1B, the dense ZeRO-3's) with tp 2 and SP, ep 4 over a stage's 4 ranks: no other rank
    # holds a rank's experts (a unit over a group of one)
    "zero3-tp2-pp2-dp2-sp-ep4": dict(tp=2, pp=2, dp=2, sp=True, ep=4, zero_stage=3, schedule="1f1b"),
    # context parallelism: the experts' group takes the cp ranks too (tp x cp x dp / ep = 4), the dense weights are
    # sharded over dp x cp (FSDP2 over the dp x cp mesh, as the dense ZeRO-3 under cp does)
    "zero3-cp2-dp4-ep2": dict(tp=1, pp=1, dp=4, cp=2, ep=2, zero_stage=3),
    # the optimizer offloaded to the host (FSDP2's CPUOffloadPolicy): the experts' shards, parameters and gradients,
    # on the host as the dense ones are
    "zero3-offload-dp8-ep4": dict(tp=1, pp=1, dp=8, ep=4, zero_stage=3, offload="optimizer"),
    # hybrid sharding (torchtitan's HSDP with experts): dp 8 as 2 replica groups of 4, the dense weights over a group's
    # 4, each expert's over a group's share of its 4 holders (2, the (edp_replicate, edp_shard) mesh), the shards
    # all-reduced across the groups
    "hsdp2-dp8-ep2": dict(tp=1, pp=1, dp=8, ep=2, zero_stage=3, dp_replicate=2),
}
RESUME_FROM = "zero3-dp8-ep2"
# resumed at step 2 in another ep: one expert a rank, sharded over its 2 holders
RESUME_LAYOUT = dict(tp=1, pp=1, dp=8, ep=4, zero_stage=3)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("moe-zero3")
    ref = [suite._job(tmp, "ref", tiny_plan(TINY_MOE, clip_grad=suite.CLIP_GRAD), {})]
    ck = str(tmp / "ckpt")
    par = []
    for name, layout in CASES.items():
        opts = {"checkpoint_dir": ck, "checkpoint_every": 2} if name == RESUME_FROM else {}
        par.append(suite._job(tmp, name, tiny_plan(TINY_MOE, clip_grad=suite.CLIP_GRAD, **layout), opts))
    # resumed from step 2 in another ep (the checkpoint keys each expert: parallel_layers.checkpoint)
    par.append(suite._job(tmp, "resume", tiny_plan(TINY_MOE, clip_grad=suite.CLIP_GRAD, **RESUME_LAYOUT),
                          {"checkpoint_dir": ck, "resume": True, "resume_step": 2}))
    return suite.run_phases(tmp, (("ref", ref, 1), ("par", par, 8)))


@pytest.mark.parametrize("case", list(CASES))
def test_losses_norms_and_gradients_match_the_one_rank_run(runs, case):
    ref, got = suite.report(runs, "ref"), suite.report(runs, case)
    ran = got["plan"]["parallel"]
    assert all(ran[k] == v for k, v in CASES[case].items()), (case, ran)  # (ZeRO-3, and the cp or offload asked)
    assert suite.losses(runs, case) == pytest.approx(suite.losses(runs, "ref"), rel=LOSS_RTOL)
    assert got["steps"][0]["grad_norm"] == pytest.approx(ref["steps"][0]["grad_norm"], rel=LOSS_RTOL)
    err, name = max_relative_error(assemble(load_dumps(runs / case / "grads")),
                                   assemble(load_dumps(runs / "ref" / "grads")))
    assert err <= GRAD_RTOL, f"{case}: {name} off by {err:.2e}"


@pytest.mark.parametrize("case", list(CASES))
def test_each_rank_holds_its_share_of_the_experts(runs, case):
    """What each rank holds of its experts' reduced gradients is 1 / (tp x dp / ep) of them (the dump gathers them
    whole): sharding them over dp, or not at all, fails."""
    layout = CASES[case]
    edp = layout["tp"] * layout.get("cp", 1) * layout["dp"] // layout["ep"] // layout.get("dp_replicate", 1)
    dumps = load_dumps(runs / case / "grads")
    for d in dumps:
        whole = sum(g["grad"].numel() for n, g in d["grads"].items() if ".experts." in n)
        assert whole and d["held_expert_grad_elements"] * edp == whole, (case, d["rank"], whole, edp)


def test_a_checkpoint_resumes_in_another_ep(runs):
    """Saved at step 2 by dp 8 x ep 2 (experts sharded over 4 ranks), resumed by dp 8 x ep 4 (over 2): step 3's loss
    is the uninterrupted run's."""
    got = suite.report(runs, "resume")
    assert [s["step"] for s in got["steps"]] == [3]
    assert got["steps"][0]["loss"] == pytest.approx(suite.losses(runs, RESUME_FROM)[2], rel=LOSS_RTOL)
