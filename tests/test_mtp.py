"""Multi-token prediction (DeepSeek-V3's MTP module; ModelSpec.mtp_layers, Megatron-LM's --mtp-num-layers): its blocks
on the rank holding the head, its projection, embedding copy and second loss, its FLOPs."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from cost_models.layout import SCH_1F1B, SCH_ZBV, Layout, ModelDims, model_rank_block_counts, rank_block_counts
from cost_models.memory import head_params_per_gpu, layer_params_per_gpu, rank_params
from cost_models.params import param_counts
from planner.core import PlannerError, recommend
from planner.models import load_preset
from planner.search import Pins


def _lay(pp, vpp=1, schedule=SCH_1F1B, tp=1, gpus=None):
    return Layout(gpus=gpus or tp * pp, tp=tp, pp=pp, dp=1, cp=1, vpp=vpp, mbs=1, zero=0, recompute=0, sp=0,
                  schedule=schedule, offload=0)


@pytest.mark.parametrize("pp,vpp,schedule", [(1, 1, SCH_1F1B), (2, 1, SCH_1F1B), (4, 1, SCH_1F1B), (4, 2, 2),
                                             (4, 2, SCH_ZBV), (2, 2, SCH_ZBV), (8, 4, 2)])
def test_the_mtp_depths_are_blocks_of_the_last_stage(pp, vpp, schedule):
    """Each rank holds its virtual stages' blocks (model_stage_layers: the split of layers + mtp, the last stage's
    count less mtp) and the rank with the last stage the MTP depths too: rank pp-1, rank 0 under ZB-V or without a
    pipeline; rank_dense_blocks' split is the same."""
    from cost_models.layout import model_stage_layers, stages_of_rank
    m = replace(ModelDims.from_spec(load_preset("deepseek-v2-lite"), 4096), mtp=2)
    z = schedule == SCH_ZBV and pp > 1
    v = 2 if z else vpp
    sizes = model_stage_layers(m.layers, m.mtp, pp * v)
    assert sum(sizes) == m.layers
    held = [sum(sizes[s] for s in stages_of_rank(r, pp, v, "zbv" if z else "1f1b"))
            + (m.mtp if pp * v - 1 in stages_of_rank(r, pp, v, "zbv" if z else "1f1b") else 0) for r in range(pp)]
    first, mid, last = (int(x) for x in model_rank_block_counts(m, pp, vpp, schedule))
    assert (first, last) == (held[0], held[-1])
    assert mid == (max(held[1:-1]) if pp > 2 else held[0])  # (rank_block_counts' middle is rank 0's below pp 3)
    assert model_rank_block_counts(replace(m, mtp=0), pp, vpp, schedule) == rank_block_counts(m.layers, pp, vpp,
                                                                                              schedule)


def test_deepseek_v3s_split_is_its_recipes():
    """DeepSeek-V3's 61 blocks and one MTP depth: 7 / 8 x 6 / 6 over 8 stages, 3 / 4 x 14 / 2 over 16 (the DGX Cloud
    launches' --decoder-first/last-pipeline-num-layers); a last stage too small for the depths keeps the plain split."""
    from cost_models.layout import model_stage_layers, stage_layers
    assert model_stage_layers(61, 1, 8) == [7] + [8] * 6 + [6]
    assert model_stage_layers(61, 1, 16) == [3] + [4] * 14 + [2]
    assert model_stage_layers(61, 0, 16) == stage_layers(61, 16)
    assert model_stage_layers(5, 2, 4) == stage_layers(5, 4)


def test_the_head_rank_holds_the_mtp_block_projection_and_an_embedding_copy():
    """With a pipeline the last rank gains, per depth, one MoE block, the 2h x h projection (split over tp) and three
    norms, and once the input embedding's copy (V x h / tp, the model being untied); rank 0 is unchanged."""
    spec = load_preset("deepseek-v2-lite")
    m = ModelDims.from_spec(spec, 4096)
    mm = replace(m, mtp=1)
    tp, h, V = 2, m.hidden, m.vocab
    lay = _lay(4, tp=tp)
    (f0, _, l0), (f1, _, l1) = rank_params(m, lay), rank_params(mm, lay)
    assert f1 == f0
    assert l1 - l0 == pytest.approx(layer_params_per_gpu(m, tp) + 2 * h * h / tp + 3 * h + V * h / tp)
    assert head_params_per_gpu(mm, tp, 1) - head_params_per_gpu(m, tp, 1) == pytest.approx(2 * h * h / tp + 3 * h)
    assert param_counts(spec.model_copy(update={"mtp_layers": 1}))["mtp"] == \
        param_counts(spec)["per_layer"] + 2 * h * h + 3 * h
    assert param_counts(spec.model_copy(update={"mtp_layers": 1}))["total"] == param_counts(spec)["total"]


def test_mtp_adds_its_flops_and_time_on_the_last_stage():
    """Model FLOPs a token gain 6 x (an MoE block's active matmuls + 2h^2 + V h) + 12 s attn_width per depth; the step
    is longer and the memory of the head's rank higher, at the same layout."""
    spec = load_preset("deepseek-v2-lite")
    s, gpus = 4096, 16
    pins = Pins(tp=2, pp=4, dp=2, mbs=1, recompute="none", ep=2, vpp=1)
    a, b = (recommend(sp, gpus, framework="megatron", global_batch_size=64, seq_len=s, top_k=1, suggest=False,
                      pins=pins) for sp in (spec, spec.model_copy(update={"mtp_layers": 1})))
    fa = a.prediction.model_tflops_per_gpu * 1e12 * gpus / a.prediction.tokens_per_s
    fb = b.prediction.model_tflops_per_gpu * 1e12 * gpus / b.prediction.tokens_per_s
    m = ModelDims.from_spec(spec, s)
    h, V = m.hidden, m.vocab
    block = param_counts(spec)["per_layer_matmul"] - (m.experts - m.top_k) * 3 * h * m.expert_ffn
    assert fb - fa == pytest.approx(6 * (block + 2 * h * h + V * h) + 12 * s * m.attn_width, rel=1e-9)
    assert b.prediction.step_time_s > a.prediction.step_time_s
    assert b.prediction.memory_bytes_per_gpu.total >= a.prediction.memory_bytes_per_gpu.total


def test_mtp_is_planned_for_megatron_and_exported_there():
    dense = load_preset("llama3-8b").model_copy(update={"mtp_layers": 1})
    for framework in ("deepspeed", "torchtitan", "parplan"):
        with pytest.raises(PlannerError, match="multi-token prediction"):
            recommend(dense, 16, framework=framework, top_k=1)
    assert recommend(dense, 16, framework="megatron", top_k=1, suggest=False).model.mtp_layers == 1
    out = subprocess.run([sys.executable, "-m", "planner.cli", "recommend", "--model", "deepseek-v2-lite",
                          "--gpus", "16",
                          "--framework", "megatron", "--mtp-layers", "1", "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert '"mtp_layers": 1' in out.stdout
    exp = subprocess.run([sys.executable, "-m", "planner.cli", "export", "-", "--to", "megatron"], input=out.stdout,
                         capture_output=True, text=True)
    assert exp.returncode == 0 and "--mtp-num-layers 1" in exp.stdout, exp.stderr
    bad = subprocess.run([sys.executable, "-m", "planner.cli", "recommend", "--model", "llama3-8b", "--gpus", "8",
                          "--mtp-layers", "1"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--framework megatron" in bad.stderr

