"""When a GPU's memory peaks (MemoryBreakdown.peak_moment): in the backward, with the saved activations, or after
it, at DeepSpeed's gradient reduction or at the optimizer step's fp32 gradient copies, with none.  `explain` says
which, so a table that reads "activations 0" is not taken for a model that forgot them."""
from dataclasses import replace
from typing import get_args

import numpy as np
import pytest

from cost_models.layout import RECOMPUTE, ModelDims
from cost_models.memory import MOMENT_BACKWARD, PEAK_MOMENTS, memory_breakdown
from planner.core import FRAMEWORK_DEFAULTS, recommend, training_consts
from planner.explain import explain
from planner.models import load_preset
from planner.render import explain_memory_rows, memory_rows
from planner.schema import PeakMoment, Training
from planner.search import Pins, build_layouts


def test_the_schema_names_the_models_moments_in_its_order():
    assert get_args(PeakMoment) == PEAK_MOMENTS


@pytest.mark.parametrize("framework", ["parplan", "megatron", "deepspeed", "fsdp"])
@pytest.mark.parametrize("precision", ["master-weights", "master-weights-half-grads"])
def test_a_peak_after_the_backward_is_the_one_without_activations(framework, precision):
    """Over every candidate of a search (16 GPUs, llama 8B, partial recompute among them): the moment is the backward
    exactly where the named activations are not 0, and an after-backward peak is the model states plus `other`."""
    m = ModelDims.from_spec(load_preset("llama3-8b", 2048), 2048)
    tr = training_consts(Training(global_batch_size=64, seq_len=2048, micro_batch_size=1, num_microbatches=1,
                                  precision=precision, framework=framework, **FRAMEWORK_DEFAULTS[framework]))
    lay = build_layouts(m, 16, 64, Pins())
    lay = lay.take(np.flatnonzero(64 % (lay.dp * lay.mbs) == 0))  # the batch splits (the search's "batch" rule)
    full = np.flatnonzero(np.asarray(lay.recompute) == RECOMPUTE.index("full"))
    some = replace(lay.take(full), recompute_layers=np.ones(len(full), dtype=np.int64))  # one block of each stage
    moments = set()
    for layout in (lay, some):
        mem = memory_breakdown(m, layout, tr, 64 // (layout.dp * layout.mbs))
        moment = np.broadcast_to(mem["moment"], np.shape(mem["total"]))
        after = moment != MOMENT_BACKWARD
        moments |= set(np.unique(moment).tolist())
        assert np.array_equal(after, np.asarray(mem["activations"]) == 0)
        states = mem["weights"] + mem["grads"] + mem["optimizer"] + mem["other"]
        np.testing.assert_allclose(np.asarray(mem["total"])[after], np.broadcast_to(states, after.shape)[after])
    # the optimizer step's fp32 gradient copies lead somewhere with 16-bit gradients (DeepSpeed's flat copy of fp32
    # ones at the step, step_grad_copy_bytes, is outweighed by its backward's reduce copies of a bucket here);
    # DeepSpeed's flat copies at its reduction after the backward (deepspeed_grad_buckets) lead somewhere, and are
    # DeepSpeed's alone
    assert (PEAK_MOMENTS.index("optimizer step") in moments) == (precision == "master-weights-half-grads")
    assert (PEAK_MOMENTS.index("gradient reduction after the backward") in moments) == (framework == "deepspeed")


def test_explain_says_the_peak_is_the_optimizer_step():
    """llama3.2-3b on 8 GPUs, ZeRO-0, full recompute, 16-bit gradients: the fp32 copies of every gradient at the step
    (12.9 GB) outweigh what the backward holds beside the model states; explain's memory line says so, and a backward
    peak (the same plan without recompute) says nothing more."""
    plans = {rec: recommend("llama3.2-3b", 8, seq_len=2048, global_batch_size=64, precision="master-weights-half-grads",
                            pins=Pins(tp=1, pp=1, zero=0, recompute=rec), top_k=1)
             for rec in ("full", "none")}
    step = plans["full"].prediction.memory_bytes_per_gpu
    assert step.peak_moment == "optimizer step" and step.activations == 0
    assert step.other == pytest.approx(2 * step.grads)  # the fp32 copies: 4 bytes a parameter, the gradient 2
    line = next(s for s in explain(plans["full"], None)["summary"] if s.startswith("memory:"))
    assert "at the optimizer step (after the backward: no activations are live)" in line
    # the tables' activations row says it too (recommend's best-plan table, explain's memory table)
    label = "activations (none live at the optimizer step)"
    assert (label, 0.0) in memory_rows(plans["full"])
    assert (label, 0.0) in explain_memory_rows(explain(plans["full"], None))
    assert ("activations", plans["none"].prediction.memory_bytes_per_gpu.activations) in memory_rows(plans["none"])
    back = plans["none"].prediction.memory_bytes_per_gpu
    assert back.peak_moment == "backward" and back.activations > 0
    assert "after the backward" not in next(s for s in explain(plans["none"], None)["summary"]
                                            if s.startswith("memory:"))


def _last_rank(framework: str, pp: int, fused: bool, keeps: str | None = None, vocab_rows=None):
    """The last pipeline rank's total of llama3-8b's candidates at pp (16 GPUs, micro-batch 1, no recompute) under a
    framework's defaults, the loss fused (16-bit gradient) or not, its TrainingConsts.pipeline_keeps_logits replaced
    where `keeps` is given."""
    m = ModelDims.from_spec(load_preset("llama3-8b", 2048), 2048)
    tr = training_consts(Training(global_batch_size=64, seq_len=2048, micro_batch_size=1, num_microbatches=1,
                                  framework=framework, **{**FRAMEWORK_DEFAULTS[framework],
                                                          "fused_cross_entropy": fused,
                                                          "cross_entropy_16bit_grad": fused}))
    if keeps is not None:
        tr = replace(tr, pipeline_keeps_logits=keeps)
    lay = build_layouts(m, 16, 64, Pins(pp=pp, tp=1, cp=1, mbs=1, recompute="none", zero=1, schedule="1f1b" if pp > 1 else None))
    mem = memory_breakdown(m, lay, tr, 64 // (lay.dp * lay.mbs))
    return np.asarray(mem["last_total"] if pp > 1 else mem["total"], dtype=float), m


@pytest.mark.parametrize("framework", ["parplan", "torchtitan"])
def test_a_pipeline_keeps_the_last_stage_s_logits_beside_an_unfused_loss(framework):
    """torch.distributed.pipelining keeps the last stage's output, the 16-bit logits, from the forward to that
    micro-batch's backward (memory.cached_logits_bytes): one micro-batch's T x V x 2 bytes more on the last rank where
    the loss does not save them itself, at the loss's peak (parplan's runtime frees them once their gradient is made)
    and under torchtitan through the stage's blocks too; nothing without a pipeline, nothing with the fused loss,
    nothing under Megatron (its stage output is the loss)."""
    with_cache, m = _last_rank(framework, 4, fused=False)
    without, _ = _last_rank(framework, 4, fused=False, keeps="")
    logits = 2048 * m.vocab * 2
    np.testing.assert_allclose(with_cache - without, logits)
    for pp, fused in ((1, False), (4, True)):
        a, _ = _last_rank(framework, pp, fused)
        b, _ = _last_rank(framework, pp, fused, keeps="")
        np.testing.assert_array_equal(a, b)
    mega, _ = _last_rank("megatron", 4, fused=False)
    mega_without, _ = _last_rank("megatron", 4, fused=False, keeps="")
    np.testing.assert_array_equal(mega, mega_without)


def test_torchtitan_keeps_the_logits_through_the_last_stage_s_blocks():
    """Where the last rank peaks in its blocks' backward rather than at the loss, torchtitan's last rank still holds
    the logits (the stage output is a local of the stage's backward_one_chunk) and parplan's does not (freed at the
    loss's end): compare the blocks' moment alone by giving both a loss without logits to speak of."""
    m = ModelDims.from_spec(load_preset("llama3-8b", 2048), 2048)
    m = replace(m, vocab=64)
    out = {}
    for keeps in ("to-grad", "to-stage-end", ""):
        tr = training_consts(Training(global_batch_size=64, seq_len=2048, micro_batch_size=1, num_microbatches=1,
                                      framework="torchtitan", **FRAMEWORK_DEFAULTS["torchtitan"]))
        tr = replace(tr, pipeline_keeps_logits=keeps)
        lay = build_layouts(m, 16, 64, Pins(pp=4, tp=1, cp=1, mbs=1, recompute="none", zero=1, schedule="1f1b"))
        out[keeps] = np.asarray(memory_breakdown(m, lay, tr, 64 // (lay.dp * lay.mbs))["last_total"], dtype=float)
    np.testing.assert_array_equal(out["to-grad"], out[""])  # a tiny loss: the blocks' moment leads, no logits there
    np.testing.assert_allclose(out["to-stage-end"] - out[""], 2048 * 64 * 2)
