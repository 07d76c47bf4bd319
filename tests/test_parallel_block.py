"""Attention and MLP side by side on one norm (ModelSpec.parallel_block: GPT-J, Falcon-7B, Phi-1 / 2, Command R,
StableLM with use_parallel_residual): read from Hugging Face configs, counted (one norm a layer), planned as parplan's
runtime builds it (one tensor-parallel collective a direction, one norm's saved input and output) and as sequential
blocks under the frameworks that build those, refused where the runtime does not train it, and said by the exports and
launch."""
from __future__ import annotations

import subprocess
import sys

import pytest

from planner import evaluate_plan
from planner.core import PlannerError, model_dims, recommend
from planner.export import export_notes
from planner.hf_config import model_from_hf_config
from planner.launch import check_runtime_support
from planner.models import model_from_flags
from planner.search import Pins

GPTJ = {"vocab_size": 50400, "n_positions": 2048, "n_embd": 4096, "n_layer": 28, "n_head": 16, "rotary_dim": 64,
        "tie_word_embeddings": False, "model_type": "gptj"}
FALCON = {"vocab_size": 65024, "hidden_size": 8192, "num_hidden_layers": 60, "num_attention_heads": 128,
          "num_kv_heads": 8, "new_decoder_architecture": True, "parallel_attn": True, "bias": False, "alibi": False,
          "tie_word_embeddings": True, "model_type": "falcon"}


def test_configs_say_which_blocks_run_side_by_side():
    """GPT-J, Phi and Command R always; Falcon with parallel_attn on one norm (Falcon-7B), not its new decoder
    architecture's two (Falcon-40B / 180B: sequential, said); StableLM with use_parallel_residual; GPT-NeoX's parallel
    residual has two norms (sequential, said)."""
    assert model_from_hf_config(GPTJ).parallel_block
    assert not model_from_hf_config(FALCON).parallel_block
    assert "two LayerNorms" in model_from_hf_config(FALCON).source
    assert model_from_hf_config({**FALCON, "num_ln_in_parallel_attn": 1}).parallel_block
    seven = {**FALCON, "new_decoder_architecture": False, "num_kv_heads": 128, "multi_query": False}
    assert model_from_hf_config(seven).parallel_block
    assert not model_from_hf_config({**seven, "parallel_attn": False}).parallel_block
    stablelm = {"vocab_size": 50304, "intermediate_size": 6912, "hidden_size": 2560, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 32, "model_type": "stablelm"}
    assert not model_from_hf_config(stablelm).parallel_block
    assert model_from_hf_config({**stablelm, "use_parallel_residual": True}).parallel_block
    neox = {"vocab_size": 50432, "hidden_size": 6144, "num_hidden_layers": 44, "num_attention_heads": 64,
            "intermediate_size": 24576, "use_parallel_residual": True, "model_type": "gpt_neox"}
    assert not model_from_hf_config(neox).parallel_block


def _pair(framework: str, **kw):
    spec = model_from_flags("llama", 16, 4096, 32, 8, 14336, 32000)
    side = spec.model_copy(update={"parallel_block": True})
    plan = recommend(side, gpus=8, seq_len=4096, framework=framework, global_batch_size=64,
                     pins=Pins(tp=4, pp=1, recompute="none", **kw))
    seq = evaluate_plan(plan.model_copy(update={"model": spec}))
    return plan, seq


@pytest.mark.parametrize("sp", [True, False])
def test_one_collective_a_direction_under_parplan(sp):
    """Under --framework parplan the block's tensor-parallel bytes are half the sequential block's (one collective a
    direction where there are two) and it saves 2 h a token fewer (one norm's input and output); under Megatron-LM,
    which builds sequential blocks, the same plan is predicted as the sequential one."""
    plan, seq = _pair("parplan", sp=sp)

    def per_block(p):  # a block's share of the step's tensor-parallel bytes (the embedding's and head's taken out)
        half = evaluate_plan(p.model_copy(update={"model": p.model.model_copy(update={"layers": 8})}))
        return (p.prediction.comm_bytes_per_step.tp - half.prediction.comm_bytes_per_step.tp) / 8
    assert per_block(plan) == pytest.approx(per_block(seq) / 2)
    assert plan.prediction.memory_bytes_per_gpu.activations < seq.prediction.memory_bytes_per_gpu.activations
    assert plan.prediction.step_time_s < seq.prediction.step_time_s
    assert model_dims(plan.model, 4096, "parplan").parallel_block
    meg, meg_seq = _pair("megatron", sp=sp)
    assert not model_dims(meg.model, 4096, "megatron").parallel_block
    assert meg.prediction.comm_bytes_per_step == meg_seq.prediction.comm_bytes_per_step
    assert meg.prediction.step_time_s == pytest.approx(meg_seq.prediction.step_time_s, rel=1e-9)


def test_what_the_runtime_does_not_train_is_refused_or_left_out():
    """parplan's runtime trains a parallel block without torchtitan's op-level policy and without dropout: a pin of
    either is refused with the fix, the search leaves selective-op out; launch says so, and warns where another
    framework's plan counts sequential blocks; the exports note what they build."""
    spec = model_from_flags("gpt", 8, 1024, 16, 16, 4096, 32000).model_copy(update={"parallel_block": True})
    with pytest.raises(PlannerError, match="selective-op with parallel_block"):
        recommend(spec, gpus=8, pins=Pins(recompute="selective-op"))
    with pytest.raises(PlannerError, match="dropout with parallel_block"):
        recommend(spec, gpus=8, dropout=True)
    plan = recommend(spec, gpus=8, top_k=50)
    assert all(a.parallel.recompute != "selective-op" for a in [plan, *plan.alternatives])
    op = plan.model_copy(update={"parallel": plan.parallel.model_copy(update={"recompute": "selective-op"})})
    check = check_runtime_support(op, "cpu")
    assert not check.ok and "selective-op with parallel_block" in check.detail
    meg = recommend(spec, gpus=8, framework="megatron")
    assert "trains the model's parallel blocks" in check_runtime_support(meg, "cpu").detail
    assert any("parallel_block" in n and "does not count" in n for n in export_notes(plan, "megatron"))
    assert any("parallel_block" in n and "as the prediction counts it" in n for n in export_notes(meg, "torchtitan"))


def test_the_cli_flag_and_its_one_line_refusal():
    args = [sys.executable, "-m", "planner.cli", "recommend", "--gpus", "8", "--layers", "8", "--hidden", "1024",
            "--heads", "16", "--json"]
    r = subprocess.run(args + ["--parallel-block"], capture_output=True, text=True)
    assert r.returncode == 0 and '"parallel_block": true' in r.stdout, r.stderr
    r = subprocess.run(args + ["--parallel-block", "--post-norms"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    assert "--parallel-block" in r.stderr and "post_norms" in r.stderr
