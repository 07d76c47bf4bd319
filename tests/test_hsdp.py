"""ZeRO-3's hybrid sharding (HSDP, Parallel.dp_replicate): the states sharded over a group of the data-parallel
ranks that the other groups replicate, the replicas all-reducing each reduce-scatter's shard."""
import json
import subprocess
import sys

import numpy as np
import pytest
from pydantic import ValidationError

from cost_models.layout import Layout, zero_shards
from planner.core import PlannerError, evaluate_plan, recommend
from planner.schema import Parallel
from planner.search import Pins

LLAMA8 = dict(model="llama3-8b", gpus=64, framework="torchtitan", suggest=False)
FIXED = dict(tp=1, pp=1, mbs=4, recompute="selective-op")  # the search's best llama3-8b layout on 64 H100s


def _plan(r: int):
    return recommend(pins=Pins(**FIXED, dp_replicate=r), **LLAMA8)


def test_zero_shards_is_one_replica_group():
    lay = Layout(gpus=64, tp=1, pp=1, dp=np.array([64, 64, 32]), cp=1, vpp=1, mbs=1, zero=3, recompute=0, sp=0,
                 schedule=0, offload=0, dp_replicate=np.array([1, 8, 4]))
    tr = type("T", (), {"zero_over_cp": True})()
    assert zero_shards(lay, tr).tolist() == [64, 8, 8]


def test_hybrid_sharding_holds_a_shard_of_one_group_and_all_reduces_it_across_the_replicas():
    """Memory: the gradient and optimizer shards of 8 x 8 are 8x those of full sharding over 64 (sharded over 8
    ranks, not 64).  Traffic, by hand: every collective of full sharding runs within a replica group of 8, each moving
    (8 - 1) / 8 of its bytes where it had moved (64 - 1) / 64, and each micro-batch's reduce-scatter is followed by a
    ring all-reduce of the fp32 gradient shard (params x 4 B / 8) over the 8 replicas: 2 (8 - 1) / 8 of it."""
    full, hybrid = _plan(1), _plan(8)
    assert (full.parallel.dp_replicate, hybrid.parallel.dp_replicate) == (1, 8)
    mf, mh = full.prediction.memory_bytes_per_gpu, hybrid.prediction.memory_bytes_per_gpu
    assert mh.grads == pytest.approx(8 * mf.grads) and mh.optimizer == pytest.approx(8 * mf.optimizer)
    micro = hybrid.training.num_microbatches
    assert micro == 4
    shard_ar = micro * 2 * 7 / 8 * hybrid.model.num_params * 4 / 8
    cf, ch = full.prediction.comm_bytes_per_step, hybrid.prediction.comm_bytes_per_step
    assert ch.dp == pytest.approx(cf.dp * (7 / 8) / (63 / 64) + shard_ar, rel=1e-9)
    # the shard group's collectives stay on the node's NVLink: less exposed data-parallel time, the same compute
    assert hybrid.prediction.step_time_s < full.prediction.step_time_s
    assert evaluate_plan(hybrid).prediction.step_time_s == pytest.approx(hybrid.prediction.step_time_s)


def test_the_search_offers_one_node_of_shards_where_the_framework_has_it():
    best = recommend(**LLAMA8)
    assert best.parallel.dp_replicate > 1 and best.parallel.zero_stage == 3
    per_node = best.parallel.tp * best.parallel.pp
    assert best.parallel.dp // best.parallel.dp_replicate * per_node == 8  # a node's ranks shard
    flat = recommend(pins=Pins(dp_replicate=1), **LLAMA8)
    assert flat.parallel.dp_replicate == 1 and best.prediction.step_time_s < flat.prediction.step_time_s
    assert recommend(**{**LLAMA8, "framework": "fsdp"}).parallel.dp_replicate > 1
    # parplan's runtime: its ZeRO-2 plan is faster here; among its ZeRO-3 plans the hybrid one is
    assert recommend(**{**LLAMA8, "framework": "parplan"}, pins=Pins(zero=3)).parallel.dp_replicate > 1
    plan = recommend(**{**LLAMA8, "framework": "deepspeed"})  # no hybrid sharding searched (MiCS not modelled)
    assert {a.parallel.dp_replicate for a in [plan] + plan.alternatives} == {1}
    plan = recommend(**{**LLAMA8, "framework": "megatron"})  # its version: ZeRO-1 in instances (test_partial_distopt)
    assert {a.parallel.zero_stage for a in [plan] + plan.alternatives if a.parallel.dp_replicate > 1} <= {1}
    # one node or less: nothing to replicate across
    assert recommend(**{**LLAMA8, "gpus": 8}).parallel.dp_replicate == 1


@pytest.mark.parametrize("kw,msg", [
    (dict(framework="deepspeed"), "hybrid sharding is planned for parplan, torchtitan, fsdp .* and megatron"),
    (dict(zero=0), "is ZeRO-3's hybrid sharding, and --zero is 0"),
    (dict(dp=8), "must split --dp 8 into replica groups of two or more ranks"),
    (dict(dp_replicate=3), "--dp-replicate 3 does not divide --gpus 64"),
])
def test_pins_a_hybrid_plan_cannot_meet_are_refused(kw, msg):
    pins = {"dp_replicate": 8, **{k: v for k, v in kw.items() if k != "framework"}}
    with pytest.raises(PlannerError, match=msg):
        recommend(pins=Pins(**pins), **{**LLAMA8, **{k: v for k, v in kw.items() if k == "framework"}})


def test_a_pinned_replica_count_never_makes_a_shard_group_of_one():
    """--dp-replicate 8 --tp 8 on 64 GPUs leaves dp 8: replicas of one rank each are no hybrid sharding, so no such
    candidate is made (one had reached the plan's validation as an internal error); dp 8 is the only dp there."""
    with pytest.raises(PlannerError, match="--dp-replicate 8 needs dp 16 or more .* these pins leave at most dp 8"):
        recommend(pins=Pins(dp_replicate=8, tp=8), **LLAMA8)
    plan = recommend(pins=Pins(dp_replicate=4, tp=2), **LLAMA8)
    assert (plan.parallel.dp, plan.parallel.dp_replicate) == (32, 4)


def test_a_plan_file_states_hybrid_sharding_only_where_it_is_one():
    ok = Parallel(dp=16, zero_stage=3, dp_replicate=2)
    assert ok.dp_replicate == 2 and Parallel(dp=16, cp=2, zero_stage=3, dp_replicate=2).cp == 2  # beside cp too
    for bad, msg in ((dict(dp=16, zero_stage=2, dp_replicate=2), "needs zero_stage 3 or 1"),
                     (dict(dp=16, zero_stage=3, dp_replicate=3), "must divide dp 16"),
                     (dict(dp=4, zero_stage=3, dp_replicate=4), "groups of two or more")):
        with pytest.raises(ValidationError, match=msg):
            Parallel(**bad)


def test_exports_launch_and_tables_say_it(tmp_path):
    from planner.export import export_notes, export_plan
    from planner.launch import check_runtime_support
    from planner.render import layout_label
    plan = _plan(8)
    assert layout_label(plan.parallel) == "tp1 pp1 dp64=8x8"
    text = export_plan(plan, "torchtitan")
    assert "data_parallel_replicate_degree = 8" in text and "data_parallel_shard_degree = 8" in text
    text = export_plan(plan, "llm-foundry")
    assert ("sharding_strategy: HYBRID_SHARD" in text and "data_parallel_shard_degree: 8" in text
            and "data_parallel_replicate_degree: 8" in text)
    for target in ("megatron", "deepspeed"):
        notes = export_notes(plan, target)
        assert any(n.startswith("dp_replicate 8 (hybrid sharding") and "not written" in n for n in notes), target
    assert check_runtime_support(plan, "cpu").ok  # parplan's runtime runs it (FSDP2 over a 2D mesh)
    # the CLI: pinned, shown in the table's layout and explain's title
    path = tmp_path / "plan.json"
    path.write_text(plan.model_dump_json())
    out = subprocess.run([sys.executable, "-m", "planner.cli", "explain", str(path)], capture_output=True, text=True,
                         env={"COLUMNS": "160", "PATH": ""}, check=True).stdout
    assert "tp1 pp1 dp64=8x8 (hybrid sharding)" in out
    cli = subprocess.run([sys.executable, "-m", "planner.cli", "recommend", "--model", "llama3-8b", "--gpus", "64",
                          "--framework", "torchtitan", "--dp-replicate", "8", "--json"], capture_output=True, text=True,
                         check=True)
    assert json.loads(cli.stdout)["parallel"]["dp_replicate"] == 8


def test_a_hand_edited_plan_of_a_framework_without_it_is_refused(tmp_path):
    plan = recommend(**{**LLAMA8, "framework": "deepspeed"}, pins=Pins(zero=3, tp=1, pp=1, dp_replicate=1))
    edited = plan.model_copy(update={"parallel": plan.parallel.model_copy(update={"dp_replicate": 8})})
    path = tmp_path / "plan.json"
    path.write_text(edited.model_dump_json())
    run = subprocess.run([sys.executable, "-m", "planner.cli", "evaluate", str(path)], capture_output=True, text=True)
    assert run.returncode == 2 and "dp_replicate 8: hybrid sharding is planned for" in run.stderr \
        and "not deepspeed" in run.stderr


def test_hybrid_sharding_beside_context_parallelism_shards_over_a_groups_dp_and_cp_ranks():
    """torchtitan's HSDP with cp: FSDP2 over (dp_replicate, dp_shard x cp).  dp 32 in 8 replicas of 4, cp 2: each
    shard group is 4 dp x 2 cp = 8 ranks, one node, against 64 under full sharding over dp x cp.  By hand as above:
    the states' shards 8x, every collective over 8 ranks where it was over 64, and the replicas' all-reduce of the
    fp32 gradient shard (params x 4 B / 8) over 8, each micro-batch."""
    pins = dict(FIXED, cp=2, dp=32)
    full, hybrid = (recommend(pins=Pins(**pins, dp_replicate=r), **LLAMA8) for r in (1, 8))
    assert (hybrid.parallel.cp, hybrid.parallel.dp, hybrid.parallel.dp_replicate) == (2, 32, 8)
    mf, mh = full.prediction.memory_bytes_per_gpu, hybrid.prediction.memory_bytes_per_gpu
    assert mh.grads == pytest.approx(8 * mf.grads) and mh.optimizer == pytest.approx(8 * mf.optimizer)
    shard_ar = hybrid.training.num_microbatches * 2 * 7 / 8 * hybrid.model.num_params * 4 / 8
    cf, ch = full.prediction.comm_bytes_per_step, hybrid.prediction.comm_bytes_per_step
    assert ch.dp == pytest.approx(cf.dp * (7 / 8) / (63 / 64) + shard_ar, rel=1e-9)
    assert hybrid.prediction.time_breakdown.dp_comm_s < full.prediction.time_breakdown.dp_comm_s
    assert evaluate_plan(hybrid).prediction == hybrid.prediction


def test_parplans_hybrid_sharding_beside_cp_shards_over_dp_and_averages_the_cp_replicas():
    """parplan's runtime shards over dp only and averages the cp replicas' gradient shards after (an all-reduce over
    cp): under hybrid sharding of dp 32 in 8 replicas the shards are of 4 ranks (8x full sharding's over 32), and the
    cp average moves the 1/4 shard where it moved the 1/32 one."""
    kw = {**LLAMA8, "framework": "parplan"}
    pins = dict(tp=1, pp=1, mbs=1, recompute="full", cp=2, dp=32, zero=3)
    full, hybrid = (recommend(pins=Pins(**pins, dp_replicate=r), **kw) for r in (1, 8))
    mf, mh = full.prediction.memory_bytes_per_gpu, hybrid.prediction.memory_bytes_per_gpu
    assert mh.optimizer == pytest.approx(8 * mf.optimizer)
    assert hybrid.prediction.time_breakdown.dp_comm_s < full.prediction.time_breakdown.dp_comm_s


def test_the_search_twins_cp_layouts_across_nodes():
    best = recommend(pins=Pins(cp=2, zero=3), **LLAMA8, top_k=200)
    twins = {(p.parallel.tp, p.parallel.dp, p.parallel.dp_replicate) for p in [best] + best.alternatives
             if p.parallel.dp_replicate > 1}
    # 8 GPUs a node: tp 1 cp 2 leaves a node 4 dp ranks (dp 32 in 8 replicas), tp 2 cp 2 leaves it 2 (dp 16 in 8)
    assert (1, 32, 8) in twins and (2, 16, 8) in twins, twins
    assert all(p.parallel.cp == 2 for p in [best] + best.alternatives)
