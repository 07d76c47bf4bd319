"""Megatron-LM's distributed optimizer in instances (--num-distributed-optimizer-instances; Parallel.dp_replicate with
zero_stage 1 under the megatron framework, TrainingConsts.partial_distopt): the optimizer states sharded over one
instance's dp / r ranks, the gradients reduce-scattered inside it and the shard all-reduced across the r instances,
the parameters gathered inside it.  Checked against arithmetic done here by hand; searched (a ZeRO-1 candidate across
nodes gets a twin with one instance a node) for a dense model, pinned otherwise."""
from __future__ import annotations

import pytest

from planner.core import PlannerError, StructureError, evaluate_plan, recommend
from planner.export import export_notes, export_plan
from planner.launch import check_runtime_support
from planner.schema import Parallel
from planner.search import Pins

KW = dict(framework="megatron", global_batch_size=512, top_k=1, suggest=False)
PINS = dict(tp=1, pp=1, dp=64, mbs=1, recompute="none")


def _pair(r=8):
    full = recommend("llama3-8b", 64, pins=Pins(zero=1, dp_replicate=1, **PINS), **KW)
    inst = recommend("llama3-8b", 64, pins=Pins(dp_replicate=r, **PINS), **KW)
    return full, inst


def test_instances_shard_the_optimizer_over_one_and_all_reduce_the_shard_across_them():
    full, inst = _pair()
    assert (inst.parallel.zero_stage, inst.parallel.dp_replicate) == (1, 8)  # --dp-replicate under megatron: ZeRO-1
    p = full.model.num_params
    # Adam's two fp32 moments and the fp32 master, 12 B a parameter: over 64 ranks, then over one instance's 8
    assert full.prediction.memory_bytes_per_gpu.optimizer == pytest.approx(12 * p / 64, rel=1e-12)
    assert inst.prediction.memory_bytes_per_gpu.optimizer == pytest.approx(12 * p / 8, rel=1e-12)
    # the full-size fp32 gradient buffer either way (Megatron's distributed optimizer reduce-scatters into it)
    assert inst.prediction.memory_bytes_per_gpu.grads == full.prediction.memory_bytes_per_gpu.grads == 4 * p
    # bytes a rank sends a step: a ring reduce-scatter of the 4-byte gradients and an all-gather of the 2-byte
    # weights over the group, (n - 1)/n of each; the instances add an all-reduce of the 1/8 shard over 8, 2 (r - 1)/r
    assert full.prediction.comm_bytes_per_step.dp == pytest.approx(63 / 64 * (4 + 2) * p, rel=1e-12)
    assert inst.prediction.comm_bytes_per_step.dp == pytest.approx(7 / 8 * (4 + 2) * p + 2 * 7 / 8 * 4 * p / 8,
                                                                   rel=1e-12)
    # an instance is a node here: its reduce-scatter and gather on NVLink, only the shard's all-reduce on the NICs
    assert inst.prediction.time_breakdown.dp_comm_s < full.prediction.time_breakdown.dp_comm_s


def test_one_instance_is_the_plain_distributed_optimizer():
    full, inst = _pair()
    one = evaluate_plan(inst.model_copy(update={"parallel": inst.parallel.model_copy(update={"dp_replicate": 1})}))
    assert one.prediction == full.prediction and one.prediction != inst.prediction


def _searched(model, gpus, **kw):
    """The layouts of every ranked plan of a Megatron-LM search left free to pick its instances."""
    best = recommend(model, gpus, **{**KW, "top_k": 200, **kw})
    return [p.parallel for p in [best] + best.alternatives]


def test_the_search_twins_each_zero1_layout_across_nodes_with_one_instance_a_node():
    top = _searched("llama3-8b", 64, pins=Pins(zero=1, pp=1, recompute="none"))
    twins = {(p.tp, p.dp): p.dp_replicate for p in top if p.dp_replicate > 1}
    # 8 GPUs a node: tp 1 shards over a node's 8 dp ranks (64 / 8 = 8 instances), tp 2 over its 4 (32 / 4 = 8)
    assert twins.get((1, 64)) == 8 and twins.get((2, 32)) == 8, twins
    assert any(p.dp_replicate == 1 and p.dp > 8 for p in top)  # the plain layouts stay
    # the instances hold 8x the optimizer states and move less across nodes: at 64 GPUs they lead here
    assert top[0].dp_replicate > 1


@pytest.mark.parametrize("model,gpus,pins", [
    ("llama3-8b", 8, dict(zero=1)),  # one node: no rank of another node to replicate with
    ("mixtral-8x7b", 64, dict(zero=1, ep=8)),  # a mixture of experts: how the instances split experts unmodelled
    ("llama3-8b", 64, dict(zero=1, dp_replicate=1)),  # pinned to one instance
])
def test_no_instances_where_a_node_holds_the_group_for_a_mixture_of_experts_or_pinned_out(model, gpus, pins):
    assert all(p.dp_replicate == 1 for p in _searched(model, gpus, pins=Pins(**pins)))


@pytest.mark.parametrize("model,pins,msg", [
    ("llama3-8b", dict(zero=3), "is its distributed optimizer in 8 instances .* ZeRO-1, and --zero is 3"),
])
def test_what_megatron_does_not_run_or_parplan_does_not_model_is_refused(model, pins, msg):
    with pytest.raises(PlannerError, match=msg):
        recommend(model, 64, pins=Pins(**{**PINS, "dp_replicate": 8, **pins}), **KW)


def test_a_plan_file_says_it_and_other_frameworks_refuse_it():
    Parallel(dp=16, zero_stage=1, dp_replicate=2)  # a layout a plan file may state
    _, inst = _pair()
    under = inst.model_copy(update={"training": inst.training.model_copy(update={"framework": "parplan"})})
    with pytest.raises(StructureError, match="ZeRO-3's hybrid sharding, and zero_stage is 1"):
        evaluate_plan(under)
    assert evaluate_plan(inst).prediction == inst.prediction


def test_the_exports_write_or_name_it_and_launch_refuses_it():
    _, inst = _pair()
    assert "--num-distributed-optimizer-instances 8" in export_plan(inst, "megatron")
    assert "ddp.num_distributed_optimizer_instances=8" in export_plan(inst, "megatron-bridge")
    for target in ("torchtitan", "deepspeed", "llm-foundry"):
        notes = [n for n in export_notes(inst, target) if n.startswith("dp_replicate 8 (hybrid sharding")]
        assert len(notes) == 1 and "not written" in notes[0] and "--num-distributed-optimizer-instances" in notes[0], \
            target
    assert "HYBRID_SHARD" not in export_plan(inst, "llm-foundry")
    check = check_runtime_support(inst, "cpu")
    assert not check.ok and "dp_replicate 8 with zero_stage 1" in check.detail and "set dp_replicate 1" in check.fix


def test_docs_cost_model_quotes_these_numbers():
    from pathlib import Path
    full, inst = _pair()
    a, b = full.prediction, inst.prediction
    said = (f"the optimizer states 8× ({b.memory_bytes_per_gpu.optimizer / 1e9:.1f} against "
            f"{a.memory_bytes_per_gpu.optimizer / 1e9:.1f} GB), the bytes a rank sends "
            f"{b.comm_bytes_per_step.dp / full.model.num_params:.3f} against "
            f"{a.comm_bytes_per_step.dp / full.model.num_params:.2f} B a parameter, the exposed data-parallel time "
            f"{b.time_breakdown.dp_comm_s * 1e3:.0f} against {a.time_breakdown.dp_comm_s * 1e3:.0f} ms, the step "
            f"{b.step_time_s:.2f} against {a.step_time_s:.2f} s")
    text = " ".join((Path(__file__).resolve().parents[1] / "docs" / "cost-model.md").read_text().split())
    assert said in text


def test_explain_names_the_instances():
    from planner.explain import explain
    from planner.render import explain_renderables
    _, inst = _pair()
    head = explain_renderables(explain(inst, None))[0]
    assert "dp64=8x8 (optimizer instances)" in head


def test_the_accuracy_line_says_no_run_checked_the_instances():
    from planner.render import INSTANCES_UNCHECKED, summary_lines
    full, inst = _pair()
    assert any(INSTANCES_UNCHECKED in line for line in summary_lines(inst))
    assert not any(INSTANCES_UNCHECKED in line for line in summary_lines(full))


def test_beside_cp_an_instance_is_dp_x_cp_over_r_ranks():
    """Megatron-Core's intra-partial data-parallel group "with CP": dp 32 x cp 2 in 8 instances shards the optimizer
    over 8 ranks (a node) where one instance shards it over all 64; the bytes by hand as above, over 64 and 8."""
    pins = dict(PINS, dp=32, cp=2)
    full = recommend("llama3-8b", 64, pins=Pins(zero=1, dp_replicate=1, **pins), **KW)
    inst = recommend("llama3-8b", 64, pins=Pins(dp_replicate=8, **pins), **KW)
    assert (inst.parallel.cp, inst.parallel.dp_replicate, inst.parallel.zero_stage) == (2, 8, 1)
    p = full.model.num_params
    assert full.prediction.memory_bytes_per_gpu.optimizer == pytest.approx(12 * p / 64, rel=1e-12)
    assert inst.prediction.memory_bytes_per_gpu.optimizer == pytest.approx(12 * p / 8, rel=1e-12)
    assert full.prediction.comm_bytes_per_step.dp == pytest.approx(63 / 64 * (4 + 2) * p, rel=1e-12)
    assert inst.prediction.comm_bytes_per_step.dp == pytest.approx(7 / 8 * (4 + 2) * p + 2 * 7 / 8 * 4 * p / 8,
                                                                   rel=1e-12)
    assert inst.prediction.time_breakdown.dp_comm_s < full.prediction.time_breakdown.dp_comm_s


def test_with_experts_the_instances_split_the_expert_data_parallel_group_too():
    """Megatron-Core splits the expert-data-parallel group into intra-partial groups of edp / r consecutive ranks and
    inter-partial groups of r (parallel_state: "Expert data parallel size should be divisible by partial DistOpt shard
    factor").  mixtral-8x7b on 64, ep 8 (edp 8), in 2 instances: the dense states over 32 ranks (64 before), the
    experts' over 4 (8 before), so the optimizer states double; the bytes by hand: each reduce-scatter and gather over
    the halved groups, and each shard all-reduced over the 2 instances."""
    kw = dict(KW, model="mixtral-8x7b", gpus=64)
    pins = dict(PINS, recompute="full", ep=8)
    full = recommend(pins=Pins(zero=1, dp_replicate=1, **pins), **kw)
    inst = recommend(pins=Pins(dp_replicate=2, **pins), **kw)
    m = full.model
    experts = m.layers * m.experts * 3 * m.hidden * m.ffn_hidden  # every block's routed experts (SwiGLU)
    dense, local = m.num_params - experts, experts / 8  # a rank's: every dense weight, 1/ep of the experts
    assert inst.prediction.memory_bytes_per_gpu.optimizer == pytest.approx(2 * full.prediction.memory_bytes_per_gpu.optimizer,
                                                                            rel=1e-12)
    assert full.prediction.comm_bytes_per_step.dp == pytest.approx(63 / 64 * 6 * dense + 7 / 8 * 6 * local, rel=1e-9)
    assert inst.prediction.comm_bytes_per_step.dp == pytest.approx(
        31 / 32 * 6 * dense + 2 * 1 / 2 * 4 * dense / 32 + 3 / 4 * 6 * local + 2 * 1 / 2 * 4 * local / 4, rel=1e-9)
    # and the search offers such twins, only where r divides the expert-data-parallel group
    best = recommend(pins=Pins(zero=1, pp=1, recompute="full"), **{**kw, "top_k": 200})
    for p in [best] + best.alternatives:
        assert (p.parallel.tp * p.parallel.cp * p.parallel.dp // p.parallel.ep) % p.parallel.dp_replicate == 0
    # (here none ranks: one instance a node leaves each instance one rank of an expert's group, whose states no
    # longer fit; they are searched, as the candidate count shows)
    one = recommend(pins=Pins(zero=1, pp=1, recompute="full", dp_replicate=1), **kw)
    assert best.search.candidates > one.search.candidates
    with pytest.raises(ValueError, match="must divide the experts' data-parallel group"):
        Parallel(dp=64, ep=64, zero_stage=1, dp_replicate=2)
