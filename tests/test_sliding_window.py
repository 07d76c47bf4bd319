"""Sliding-window attention (ModelSpec.sliding_window, full_attention_every): read from Hugging Face configs, counted
where the framework trains the window (Megatron-LM's --window-size: its flash kernels skip the tiles outside the
band; parplan's runtime, parallel_layers.window: FlexAttention under the band's block mask on a GPU), and as full
causal attention where it does not (torchtitan's llama, DeepSpeed), which is what those run."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cost_models.layout import ModelDims
from planner import evaluate_plan, recommend
from planner.core import model_dims
from planner.export import export_notes, export_plan
from planner.hf_config import model_from_hf_config
from planner.launch import check_runtime_support
from planner.models import load_preset, model_from_flags

GEMMA3_1B = {"model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912, "num_attention_heads": 4,
             "num_key_value_heads": 1, "head_dim": 256, "num_hidden_layers": 26, "vocab_size": 262144,
             "sliding_window": 512, "sliding_window_pattern": 6}


def test_windows_read_from_configs():
    """Gemma 3: every 6th layer global (4 of 26), Gemma 2 every 2nd, Mistral 7B v0.1 and Phi-3 every layer local;
    a layer_types list is read as its period, and one with no period is left full (said)."""
    g3 = model_from_hf_config(GEMMA3_1B)
    assert (g3.sliding_window, g3.full_attention_every, g3.windowed_layers) == (512, 6, 22)
    g2 = model_from_hf_config({**GEMMA3_1B, "model_type": "gemma2", "sliding_window": 4096})
    assert (g2.sliding_window, g2.full_attention_every, g2.windowed_layers) == (4096, 2, 13)
    mistral = load_preset("mistral-7b")
    assert (mistral.sliding_window, mistral.full_attention_every, mistral.windowed_layers) == (4096, None, 32)
    kinds = (["sliding_attention"] * 5 + ["full_attention"]) * 4 + ["sliding_attention"] * 2
    listed = model_from_hf_config({**GEMMA3_1B, "layer_types": kinds})
    assert (listed.full_attention_every, listed.windowed_layers) == (6, 22)
    odd = model_from_hf_config({**GEMMA3_1B, "layer_types": ["full_attention"] + ["sliding_attention"] * 25},
                               seq_len=4096)
    assert odd.sliding_window is None and odd.windowed_layers == 0
    assert "25 of 26 layers attend within a 512-token window" in odd.source
    assert "a pattern ModelSpec cannot say" in odd.source


def test_pairs_and_span():
    """At s = 4w a windowed layer attends 2w/s - (w/s)^2 = 7/16 of full causal attention's pairs, and in the MFU
    convention (no causal discount) w keys a query against s; at s <= w nothing changes."""
    m = ModelDims(arch="llama", layers=6, hidden=64, heads=4, kv_heads=4, head_dim=16, ffn=128, vocab=100,
                  tied=False, seq_len=4096, positions=0, window=1024, windowed_layers=5)
    assert m.causal_pairs_fraction() == pytest.approx((1 + 5 * 7 / 16) / 6)
    assert m.attention_span() == pytest.approx((4096 + 5 * 1024) / 6)
    short = ModelDims(**{**m.__dict__, "seq_len": 1024})
    assert short.causal_pairs_fraction() == 1.0 and short.attention_span() == 1024


def _pair(framework: str, seq_len: int):
    windowed = model_from_flags("llama", 16, 2048, 16, 8, 8192, 32000, sliding_window=1024, full_attention_every=4)
    full = model_from_flags("llama", 16, 2048, 16, 8, 8192, 32000)
    kw = dict(gpus=8, seq_len=seq_len, framework=framework, global_batch_size=64)
    a = recommend(windowed, **kw)
    b = evaluate_plan(a.model_copy(update={"model": full}))
    return a, b


@pytest.mark.parametrize("framework", ["megatron", "parplan"])
def test_megatron_and_parplan_count_the_window_and_torchtitan_does_not(framework):
    """Under --framework megatron or parplan the 12 windowed layers of 16 attend within 1024 of 16384 tokens: the
    attention kernel's time and the model FLOPs per token shrink by what the band leaves out; torchtitan's llama
    attends over the whole prefix, and its prediction is full attention's to the bit."""
    a, b = _pair(framework, 16384)
    q_width, s, w = 2048, 16384, 1024
    saved = 12 * 12 * q_width * (s - w)  # 12 L_w h (s - w): the MFU convention's attention term
    assert b.prediction.model_tflops_per_gpu / b.prediction.tokens_per_s - \
        a.prediction.model_tflops_per_gpu / a.prediction.tokens_per_s == pytest.approx(saved / 8 / 1e12, rel=1e-9)
    assert a.prediction.step_time_s < 0.9 * b.prediction.step_time_s
    assert model_dims(a.model, 16384, framework).window == 1024
    a, b = _pair("torchtitan", 16384)
    assert a.prediction == b.prediction
    m = model_dims(a.model, 16384, "torchtitan")
    assert m.window == 0 and m.causal_pairs_fraction() == 1.0


def test_a_window_as_long_as_the_sequence_changes_nothing():
    a, b = _pair("megatron", 1024)
    assert a.prediction == b.prediction


def test_exports_and_launch_say_it():
    plan = recommend(load_preset("mistral-7b"), gpus=8, seq_len=16384, framework="megatron", global_batch_size=64)
    assert "--window-size 4095,0" in export_plan(plan, "megatron")
    assert "--window-attn-skip-freq" not in export_plan(plan, "megatron")
    assert any("attends over the whole prefix" in n for n in export_notes(plan, "torchtitan"))
    g3 = recommend(model_from_hf_config(GEMMA3_1B), gpus=8, seq_len=8192, framework="megatron", global_batch_size=64)
    assert "--window-attn-skip-freq 6" in export_plan(g3, "megatron")
    # parplan's runtime trains the window: a Megatron plan's prediction counts it too, a torchtitan plan's does not
    assert "sliding-window" not in check_runtime_support(plan, "cpu").detail
    titan = recommend(load_preset("mistral-7b"), gpus=8, seq_len=16384, framework="torchtitan", global_batch_size=64)
    check = check_runtime_support(titan, "cpu")
    assert check.ok and "trains the model's 32 sliding-window layers within 4096" in check.detail
    assert "--framework parplan" in check.detail
    short = titan.model_copy(update={"training": titan.training.model_copy(update={"seq_len": 4096})})
    assert "sliding-window" not in check_runtime_support(short, "cpu").detail
    dropout = plan.model_copy(update={"training": plan.training.model_copy(update={"dropout": True})})
    assert "FlexAttention has no dropout" in check_runtime_support(dropout, "cpu").detail


@pytest.mark.parametrize("args, says", [
    (["--layers", "8", "--hidden", "512", "--heads", "8", "--full-attention-every", "2"], "needs sliding_window"),
    (["--model", "llama3-8b", "--sliding-window", "4096"], "only applies to an explicit shape"),
    (["--layers", "8", "--hidden", "512", "--heads", "8", "--sliding-window", "0"], "--sliding-window"),
])
def test_cli_refuses_with_one_line(args, says):
    r = subprocess.run([sys.executable, "-m", "planner.cli", "recommend", "--gpus", "8", "--json", *args],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == "" and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r


def test_cli_explicit_window_reaches_the_plan():
    r = subprocess.run([sys.executable, "-m", "planner.cli", "recommend", "--gpus", "8", "--json", "--layers", "8",
                        "--hidden", "512", "--heads", "8", "--sliding-window", "256", "--full-attention-every", "4",
                        "--seq-len", "2048", "--framework", "megatron"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    model = json.loads(r.stdout)["model"]
    assert (model["sliding_window"], model["full_attention_every"]) == (256, 4)


def test_causal_mfu_counts_the_bands_pairs():
    """validate's causal MFU counts each query's attended keys: s/2 for a full causal layer, (s w - w^2/2)/s for a
    windowed one (12 of 16 layers, w = 1024 of s = 16384); the matmul part (6 N) is what the plan's MFU counts beside
    the attention's 12 h (s L_full + w L_windowed)."""
    from planner.validate import mfu_causal
    a, b = _pair("megatron", 16384)
    q_width, s, w = 2048, 16384, 1024
    for plan, full_layers, windowed_layers in ((a, 4, 12), (b, 16, 0)):
        per_token = plan.prediction.model_tflops_per_gpu * 1e12 * plan.hardware.gpus / plan.prediction.tokens_per_s
        six_n = per_token - 12 * q_width * (s * full_layers + w * windowed_layers)
        causal = six_n + 12 * q_width * (full_layers * s / 2 + windowed_layers * (s * w - w * w / 2) / s)
        peak = plan.prediction.model_tflops_per_gpu * 1e12 / plan.prediction.mfu
        expected = plan.prediction.tokens_per_s / plan.hardware.gpus * causal / peak
        assert mfu_causal(plan, None) == pytest.approx(expected, rel=1e-9)


def test_torchtitan_trains_gpt_oss_windows_only():
    """torchtitan's gpt_oss model (the flavor its export picks for gpt-oss-20b's and -120b's shapes) attends its even
    blocks within the window (FlexAttention under a sliding-window mask): counted under --framework torchtitan there,
    and nowhere else under torchtitan (a windowed MoE of another shape is exported as the qwen3 model, full attention);
    the export says which."""
    from planner.core import trains_window
    oss = load_preset("gpt-oss-20b")
    assert trains_window(oss, "torchtitan") and trains_window(oss, "parplan") and not trains_window(oss, "deepspeed")
    other = oss.model_copy(update={"layers": oss.layers - 2, "name": "custom"})
    assert not trains_window(other, "torchtitan") and not trains_window(load_preset("mistral-7b"), "torchtitan")
    from planner.search import Pins
    kw = dict(gpus=8, seq_len=8192, framework="torchtitan", global_batch_size=64, pins=Pins(pp=1))
    a = recommend(oss, **kw)
    b = evaluate_plan(a.model_copy(update={"model": oss.model_copy(update={"sliding_window": None,
                                                                             "full_attention_every": None})}))
    assert a.prediction.step_time_s < b.prediction.step_time_s
    assert model_dims(a.model, 8192, "torchtitan").windowed_layers == 12
    notes = export_notes(a, "torchtitan-0.2")
    assert not any("attends over the whole prefix" in n for n in notes)
    assert any("llama blocks with the same windows" in n for n in notes)
    c = recommend(other, **kw)
    assert any("attends over the whole prefix" in n for n in export_notes(c, "torchtitan-0.2"))


def test_packed_documents_count_each_documents_pairs():
    """Training.document_length: documents of D tokens attend within themselves: D / s of full causal attention's pairs
    (and the MFU convention's span D), a shorter last document its own, a window inside them its band per document;
    counted under parplan and torchtitan (which skip the pairs across documents), full under Megatron-LM."""
    m = ModelDims(arch="llama", layers=4, hidden=64, heads=4, kv_heads=4, head_dim=16, ffn=128, vocab=100, tied=False,
                  seq_len=4096, positions=0, document=1024)
    assert m.causal_pairs_fraction() == pytest.approx(1024 / 4096) and m.attention_span() == 1024
    odd = ModelDims(**{**m.__dict__, "document": 1500})  # 1500, 1500 and 1096
    assert odd.causal_pairs_fraction() == pytest.approx((2 * 1500 ** 2 + 1096 ** 2) / 4096 ** 2)
    both = ModelDims(**{**m.__dict__, "window": 256, "windowed_layers": 2})
    band = 4 * (1024 * 256 - 256 ** 2 / 2) / (4096 ** 2 / 2)
    assert both.causal_pairs_fraction() == pytest.approx((2 * 0.25 + 2 * band) / 4)
    assert ModelDims(**{**m.__dict__, "document": 4096}).causal_pairs_fraction() == 1.0
    spec = load_preset("llama3-8b")
    kw = dict(gpus=8, seq_len=32768, global_batch_size=64)
    for framework, counted in (("parplan", True), ("torchtitan", True), ("megatron", False)):
        whole = recommend(spec, framework=framework, **kw)
        docs = evaluate_plan(whole.model_copy(update={"training": whole.training.model_copy(
            update={"document_length": 4096})}))
        if counted:
            assert docs.prediction.step_time_s < 0.9 * whole.prediction.step_time_s
            assert model_dims(docs.model, 32768, framework, 4096).document == 4096
        else:
            assert docs.prediction == whole.prediction
    r = subprocess.run([sys.executable, "-m", "planner.cli", "recommend", "--model", "llama3-8b", "--gpus", "8",
                        "--seq-len", "32768", "--document-length", "4096", "--json"], capture_output=True, text=True)
    assert r.returncode == 0 and json.loads(r.stdout)["training"]["document_length"] == 4096, r.stderr
    assert any("document_length 4096" in n for n in export_notes(docs, "megatron"))


def test_launch_refuses_packed_documents_over_a_token_file(tmp_path):
    """The runtime masks fixed-length documents of synthetic tokens: over a token file, whose documents are its own,
    launch's data check refuses with the fix."""
    import numpy as np

    from planner.launch import check_data
    plan = recommend(load_preset("llama3-8b"), gpus=8, seq_len=8192, document_length=2048)
    path = tmp_path / "tok.bin"
    (np.arange(20_000) % 1000).astype(np.uint32).tofile(path)
    check = check_data(str(path), plan)
    assert not check.ok and "document_length 2048 with --data" in check.detail and "drop --data" in check.fix
    whole = plan.model_copy(update={"training": plan.training.model_copy(update={"document_length": None})})
    assert check_data(str(path), whole).ok


def test_latent_attention_with_packed_documents_is_refused_under_parplan():
    """parplan's multi-head latent attention attends over the whole sequence (parallel_layers.window is not in it):
    packed documents beside it are refused with the fix, where torchtitan (FlexAttention's block_causal) plans them."""
    spec = load_preset("deepseek-v2-lite")
    from planner.core import PlannerError
    with pytest.raises(PlannerError, match="document-length with multi-head latent attention"):
        recommend(spec, gpus=8, seq_len=8192, document_length=2048)
    plan = recommend(spec, gpus=8, seq_len=8192, document_length=2048, framework="torchtitan")
    assert model_dims(plan.model, 8192, "torchtitan", 2048).document == 2048
    assert recommend(spec, gpus=8, seq_len=8192, document_length=8192).training.document_length == 8192


def test_llama4_chunks_are_counted_where_parplan_trains_them():
    """ModelSpec.attention_chunk (Llama 4's 8192 in its rotary layers, every 4th layer in full): 36 of Scout's 48
    layers attend within their chunk; at 32K tokens under parplan they count the chunks' pairs, under Megatron-LM and
    torchtitan (the flavors its export picks) full attention; launch and the exports say so; a config's no_rope_layers
    in another pattern is counted as full, said."""
    from planner.core import CHUNK_FRAMEWORKS
    scout = load_preset("llama4-scout")
    assert (scout.attention_chunk, scout.full_attention_every, scout.chunked_layers) == (8192, 4, 36)
    assert CHUNK_FRAMEWORKS == ("parplan",)
    m = model_dims(scout, 32768, "parplan")
    assert m.causal_pairs_fraction() == pytest.approx((12 + 36 * 8192 / 32768) / 48)
    assert m.attention_span() == pytest.approx((12 * 32768 + 36 * 8192) / 48)
    assert model_dims(scout, 32768, "megatron").chunk == 0 and model_dims(scout, 32768, "torchtitan").chunk == 0
    full = scout.model_copy(update={"attention_chunk": None, "full_attention_every": None})
    plan = recommend(scout, gpus=64, seq_len=32768)
    assert plan.prediction.step_time_s < evaluate_plan(plan.model_copy(update={"model": full})).prediction.step_time_s
    meg = recommend(scout, gpus=64, seq_len=32768, framework="megatron")
    assert meg.prediction == evaluate_plan(meg.model_copy(update={"model": full})).prediction
    assert "36 chunked layers within 8192-token chunks" in check_runtime_support(meg, "cpu").detail
    assert any("attention_chunk 8192" in n and "does not count" in n for n in export_notes(plan, "megatron"))
    rope = [1, 1, 0] * 16  # every 3rd layer NoPE: a pattern the default's 4 does not say, read as such
    def llama4(**text):
        return {"model_type": "llama4", "text_config": {"model_type": "llama4_text", **text}}
    assert model_from_hf_config(llama4(no_rope_layers=rope)).full_attention_every == 3
    odd = model_from_hf_config(llama4(no_rope_layers=[0] + [1] * 47), seq_len=16384)
    assert odd.attention_chunk is None and "a pattern ModelSpec cannot say" in odd.source


def test_cli_explicit_chunks_reach_the_plan():
    """--attention-chunk with an explicit shape (and --full-attention-every) reaches the plan; beside a window or a
    preset, one line."""
    base = [sys.executable, "-m", "planner.cli", "recommend", "--gpus", "8", "--json", "--layers", "8", "--hidden",
            "512", "--heads", "8", "--seq-len", "4096"]
    r = subprocess.run(base + ["--attention-chunk", "1024", "--full-attention-every", "4"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    model = json.loads(r.stdout)["model"]
    assert (model["attention_chunk"], model["full_attention_every"]) == (1024, 4)
    r = subprocess.run(base + ["--attention-chunk", "1024", "--sliding-window", "256"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == "" and "attention_chunk with sliding_window" in r.stderr
