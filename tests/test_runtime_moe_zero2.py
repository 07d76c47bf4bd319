"""A mixture of experts under ZeRO-2 in parplan's runtime: the experts' gradients reduced to their owner within their
expert-data-parallel group (the experts' own data_parallel.ShardedAdamW, parallel_layers.train
build_expert_grad_reduction) and dropped by the other ranks of it, as the dense ZeRO-2 does over dp.

4 gloo ranks against the one-rank run of the same plan (one torchrun for the reference, one for the layouts): every
step's loss, step 1's gradient norm (clip.copies: an expert's gradient on its owner alone) and step 1's reduced
gradients (the experts' assembled over their group for the dump) match; and what each rank itself holds of the
experts' gradients after the reduction is its share (a reduction that all-reduced them, ZeRO-1's, holds them whole
on every rank and fails)."""
from __future__ import annotations

import pytest

from tests.runtime_helpers import suite
from tests.runtime_helpers.compare import assemble, load_dumps, max_relative_error
from tests.runtime_helpers.plans import TINY_MOE, tiny_plan

pytestmark = pytest.mark.multirank

LOSS_RTOL = 1e-4
GRAD_RTOL = 1e-5
# name -> parallel layout; 4 ranks each, ZeRO-2
CASES = {
    # ep 2 over dp 4: each expert on 2 ranks (its expert-data-parallel group), the dense weights over 4
    "zero2-dp4-ep2": dict(tp=1, pp=1, dp=4, ep=2, zero_stage=2),
    # ep 2 inside the tp group with SP: the experts' group is the 2 dp ranks ep apart, and the SP-partial router and
    # norms are summed over tp before their dp reduction (train.late_params)
    "zero2-tp2-dp2-sp-ep2": dict(tp=2, pp=1, dp=2, sp=True, ep=2, zero_stage=2),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("moe-zero2")
    ref = [suite._job(tmp, "ref", tiny_plan(TINY_MOE, clip_grad=suite.CLIP_GRAD), {})]
    par = [suite._job(tmp, name, tiny_plan(TINY_MOE, clip_grad=suite.CLIP_GRAD, **layout), {})
           for name, layout in CASES.items()]
    return suite.run_phases(tmp, (("ref", ref, 1), ("par", par, 4)))


@pytest.mark.parametrize("case", list(CASES))
def test_losses_norms_and_gradients_match_the_one_rank_run(runs, case):
    ref, got = suite.report(runs, "ref"), suite.report(runs, case)
    assert got["plan"]["parallel"]["zero_stage"] == 2
    assert suite.losses(runs, case) == pytest.approx(suite.losses(runs, "ref"), rel=LOSS_RTOL)
    assert got["steps"][0]["grad_norm"] == pytest.approx(ref["steps"][0]["grad_norm"], rel=LOSS_RTOL)
    # (dp_rank None: a dense gradient from whichever replica owns it, ZeRO-2's owner alone keeping it)
    err, name = max_relative_error(assemble(load_dumps(runs / case / "grads"), dp_rank=None),
                                   assemble(load_dumps(runs / "ref" / "grads")))
    assert err <= GRAD_RTOL, f"{case}: {name} off by {err:.2e}"


@pytest.mark.parametrize("case", list(CASES))
def test_each_rank_keeps_only_its_share_of_the_experts_gradients(runs, case):
    """Over the world the ranks hold each expert gradient element once per expert-data-parallel group (tp x dp / ep
    ranks hold the same experts): sum(held) = sum(experts' elements) / that group's size, each rank some but not all."""
    layout = CASES[case]
    edp = layout["tp"] * layout["dp"] // layout["ep"]
    dumps = load_dumps(runs / case / "grads")
    per_rank = [sum(g["grad"].numel() for n, g in d["grads"].items() if ".experts." in n) for d in dumps]
    held = [d["held_expert_grad_elements"] for d in dumps]
    assert edp == 2 and all(per_rank) and sum(held) * edp == sum(per_rank), (held, per_rank)
    assert all(0 < h < e for h, e in zip(held, per_rank)), (held, per_rank)
