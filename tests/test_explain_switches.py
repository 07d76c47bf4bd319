"""explain's switches left off (planner.explain.switches_left_off): the framework's own speed switches a plan does
not use, each re-predicted alone on the same layout, listed where it shortens the step; checked against
evaluate_plan of the switched plan, and for what a framework, a GPU or a layout cannot take."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.core import evaluate_plan, recommend
from planner.explain import SWITCHES, explain, switches_left_off, switches_line
from planner.search import Pins

MOE = dict(framework="megatron", global_batch_size=256, seq_len=4096, top_k=1, suggest=False)


def _moe_plan(pp=1, **stack):
    pins = Pins(tp=2, pp=pp, dp=32 // pp, cp=1, mbs=1, zero=1, recompute="none", sp=True, schedule="1f1b",
                offload="none", ep=8)
    return recommend("mixtral-8x7b", 64, pins=pins, **MOE, **stack)


def _switched(plan, field, value):
    return evaluate_plan(plan.model_copy(update={"training": plan.training.model_copy(update={field: value})}))


def test_each_switch_is_the_plan_re_predicted_with_it_alone():
    plan = _moe_plan()
    got = switches_left_off(plan)
    options = [s["option"] for s in got]
    assert "--moe-a2a-overlap" in options and "--fp8" in options
    for s in got:
        other = _switched(plan, s["field"], s["value"]).prediction
        assert s["step_time_s"] == pytest.approx(other.step_time_s)
        assert s["relative_step_time"] == pytest.approx(other.step_time_s / plan.prediction.step_time_s - 1)
        assert s["relative_step_time"] <= -0.001
        assert s["delta_memory_bytes"] == pytest.approx(other.memory_bytes_per_gpu.total
                                                        - plan.prediction.memory_bytes_per_gpu.total)
    assert [s["relative_step_time"] for s in got] == sorted(s["relative_step_time"] for s in got)


def test_a_switch_already_on_or_not_the_frameworks_is_not_offered():
    on = _moe_plan(moe_a2a_overlap=True, fp8=True)
    options = [s["option"] for s in switches_left_off(on)]
    assert "--moe-a2a-overlap" not in options and "--fp8" not in options
    # every option a framework offers is one of its own (DeepSpeed has no FP8, expert or TP-overlap switch here)
    assert {fw for *_, fws, _note in SWITCHES for fw in fws} <= {"parplan", "megatron", "deepspeed", "torchtitan",
                                                                   "fsdp"}
    assert [s[2] for s in SWITCHES if "deepspeed" in s[3]] == ["--overlap-grad-reduce"]


def test_a_switch_the_layout_cannot_take_is_left_out():
    # Megatron runs the all-to-all overlap on no pipeline without interleaving: refused there, so not offered
    plan = _moe_plan(pp=2)
    assert "--moe-a2a-overlap" not in [s["option"] for s in switches_left_off(plan)]
    # ... as a dense model offers no expert switch
    dense = recommend("llama3-8b", 16, framework="megatron", global_batch_size=64, top_k=1, suggest=False)
    assert not {"--moe-a2a-overlap", "--moe-dispatcher deepep"} & {s["option"] for s in switches_left_off(dense)}


def test_fp8_is_offered_where_the_gpu_has_it_and_not_for_parplans_runtime():
    h100 = recommend("llama3-8b", 16, framework="megatron", global_batch_size=64, top_k=1, suggest=False)
    a100 = recommend("llama3-8b", 16, framework="megatron", hardware="a100-sxm-80gb", global_batch_size=64,
                     top_k=1, suggest=False)
    assert "--fp8" in [s["option"] for s in switches_left_off(h100)]
    assert "--fp8" not in [s["option"] for s in switches_left_off(a100)]
    mine = recommend("llama3-8b", 16, global_batch_size=64, top_k=1, suggest=False)  # parplan's runtime
    assert "--fp8" not in [s["option"] for s in switches_left_off(mine)]
    # its gradient reduction overlapped, where a plan turned it off
    off = recommend("llama3-8b", 16, global_batch_size=64, top_k=1, suggest=False, overlap_grad_reduce=False,
                    pins=Pins(tp=1, pp=1, dp=16, zero=1))
    got = {s["option"]: s for s in switches_left_off(off)}
    assert "--overlap-grad-reduce" in got and got["--overlap-grad-reduce"]["relative_step_time"] < 0


def test_explain_says_them_in_its_summary_and_json(tmp_path):
    plan = _moe_plan()
    data = explain(plan, None)
    assert data["switches_left_off"] == switches_left_off(plan)
    line = switches_line(data["switches_left_off"])
    assert line in data["summary"] and line.startswith("switches left off: --fp8 (FP8 linears: changes the numerics) ")
    f = tmp_path / "plan.json"
    f.write_text(plan.model_dump_json())
    r = CliRunner().invoke(app, ["explain", str(f), "--json"])
    assert r.exit_code == 0, r.output
    assert [s["option"] for s in json.loads(r.stdout)["switches_left_off"]] == \
        [s["option"] for s in data["switches_left_off"]]
    r = CliRunner().invoke(app, ["explain", str(f)])
    assert "switches left off: --fp8 (FP8 linears: changes the numerics)" in " ".join(r.stdout.split())
    assert switches_line([]) is None


def test_recommend_prints_the_best_plans_switches_under_its_tables():
    args = ["recommend", "--model", "mixtral-8x7b", "--gpus", "64", "--framework", "megatron", "--tp", "2", "--pp",
            "1", "--ep", "8", "--mbs", "1", "--zero", "1", "--recompute", "none", "--global-batch-size", "256",
            "--top", "1"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    plan = _moe_plan()
    assert switches_line(switches_left_off(plan)) in text
    # --json holds the plan alone
    r = CliRunner().invoke(app, args + ["--json"])
    assert "switches left off" not in r.stdout and json.loads(r.stdout)["parallel"]["ep"] == 8


def test_megatrons_parameter_gather_overlap_is_offered_only_beside_the_gradient_overlap():
    pins = Pins(tp=1, pp=1, dp=16, zero=1)
    off = recommend("llama3-8b", 16, framework="megatron", global_batch_size=64, top_k=1, suggest=False, pins=pins,
                    overlap_grad_reduce=False, overlap_param_gather=False)
    options = [s["option"] for s in switches_left_off(off)]
    assert "--overlap-grad-reduce" in options and "--overlap-param-gather" not in options
    grads_on = recommend("llama3-8b", 16, framework="megatron", global_batch_size=64, top_k=1, suggest=False,
                         pins=pins, overlap_param_gather=False)
    assert "--overlap-param-gather" in [s["option"] for s in switches_left_off(grads_on)]


def test_evaluate_prints_them_too_and_a_switch_that_makes_a_plan_fit(tmp_path):
    plan = _moe_plan()
    f = tmp_path / "plan.json"
    f.write_text(plan.model_dump_json())
    r = CliRunner().invoke(app, ["evaluate", str(f)])
    assert r.exit_code == 0, r.output
    assert switches_line(switches_left_off(plan)) in " ".join(r.stdout.split())
    # a plan just past its memory (llama3-8b at 4,480 tokens without recompute: 83.7 GB of 83.0) that FP8's smaller
    # activations bring under it: offered, as fitting; evaluate prints it under the plan that does not fit
    base = recommend("llama3-8b", 8, framework="megatron", global_batch_size=64, top_k=1, suggest=False,
                     pins=Pins(tp=1, pp=1, dp=8, mbs=1, zero=1, recompute="none"))
    big = evaluate_plan(base.model_copy(update={"training": base.training.model_copy(update={"seq_len": 4480})}))
    assert not big.prediction.fits
    got = {s["option"]: s for s in switches_left_off(big)}
    assert got["--fp8"]["fits"] and got["--fp8"]["delta_memory_bytes"] < 0
    f.write_text(big.model_dump_json())
    r = CliRunner().invoke(app, ["evaluate", str(f)])
    said = switches_line(switches_left_off(big), plan_fits=False)
    assert r.exit_code == 3 and said in " ".join(r.stdout.split()) and "memory -" in said and ", fits" in said


def test_megatrons_tp_overlap_is_offered_only_with_sequence_parallelism():
    kw = dict(framework="megatron", global_batch_size=64, top_k=1, suggest=False)
    sp = recommend("llama3-70b", 16, pins=Pins(tp=8, pp=2, dp=1, sp=True), **kw)
    no_sp = recommend("llama3-70b", 16, pins=Pins(tp=8, pp=2, dp=1, sp=False), **kw)
    assert "--overlap-tp-comm" in [s["option"] for s in switches_left_off(sp)]
    assert "--overlap-tp-comm" not in [s["option"] for s in switches_left_off(no_sp)]


def test_megatrons_optimizer_instances_are_offered_for_zero1_across_nodes():
    kw = dict(framework="megatron", global_batch_size=512, top_k=1, suggest=False)
    pins = dict(tp=1, pp=1, dp=64, mbs=1, recompute="none")
    plan = recommend("llama3-8b", 64, pins=Pins(zero=1, dp_replicate=1, **pins), **kw)
    got = {s["option"]: s for s in switches_left_off(plan)}
    inst = recommend("llama3-8b", 64, pins=Pins(dp_replicate=8, **pins), **kw)  # the same layout in 8 instances
    s = got["--dp-replicate 8"]
    assert (s["field"], s["value"]) == ("dp_replicate", 8) and "optimizer states 8x" in s["note"]
    assert s["step_time_s"] == pytest.approx(inst.prediction.step_time_s)
    assert s["delta_memory_bytes"] == pytest.approx(inst.prediction.memory_bytes_per_gpu.total
                                                    - plan.prediction.memory_bytes_per_gpu.total)
    # not inside one node; with experts offered where it shortens the step (here one instance a node leaves each
    # expert's states unsharded: 125 GB, and slower)
    one_node = recommend("llama3-8b", 8, pins=Pins(zero=1, tp=1, pp=1, dp=8), framework="megatron",
                         global_batch_size=64, top_k=1, suggest=False)
    assert not any(s["field"] == "dp_replicate" for s in switches_left_off(one_node))
    assert not any(s["field"] == "dp_replicate" for s in switches_left_off(_moe_plan()))


def test_hybrid_sharding_is_offered_for_a_zero3_plan_across_nodes_under_the_fsdp_frameworks():
    kw = dict(framework="torchtitan", top_k=1, suggest=False)
    pins = dict(tp=1, pp=1, dp=64, mbs=4, recompute="selective-op", zero=3)
    plan = recommend("llama3-8b", 64, pins=Pins(dp_replicate=1, **pins), **kw)
    hsdp = recommend("llama3-8b", 64, pins=Pins(dp_replicate=8, **pins), **kw)
    s = {x["option"]: x for x in switches_left_off(plan)}["--dp-replicate 8"]
    assert "hybrid sharding: a node's 8 dp ranks shard the states, 8 replicas" in s["note"]
    assert s["step_time_s"] == pytest.approx(hsdp.prediction.step_time_s)
    assert s["step_time_s"] < plan.prediction.step_time_s
    # already hybrid, or ZeRO-2 (no HSDP): nothing offered
    assert not any(x["field"] == "dp_replicate" for x in switches_left_off(hsdp))
    z2 = recommend("llama3-8b", 64, pins=Pins(**{**pins, "zero": 2, "mbs": 1, "recompute": "full"}),
                   framework="parplan", top_k=1, suggest=False)
    assert not any(x["field"] == "dp_replicate" for x in switches_left_off(z2))
