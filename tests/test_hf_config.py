"""Hugging Face config.json import: field mapping per family and counts against published totals.

The configs under tests/data/hf_configs/ are copies of the published config.json files
(meta-llama/Meta-Llama-3-8B, mistralai/Mistral-7B-v0.1, Qwen/Qwen2.5-7B, openai-community/gpt2,
EleutherAI/pythia-1.4b, EleutherAI/gpt-neox-20b, google/gemma-2b, mistralai/Mixtral-8x7B-v0.1), and the published keys
of five mixtures of experts' (MiniMax-M2.5, OLMoE-1B-7B-0924, Phi-3.5-MoE-instruct, granite-3.1-3b-a800m-instruct,
Hunyuan-A13B-Instruct) as tests/data/hf_configs/SOURCES.md says where each came from.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.hf_config import model_from_hf_config
from planner.models import load_preset

DATA = Path(__file__).resolve().parent / "data" / "hf_configs"

# Published totals (sum of numel over the released checkpoint, as reported by the model cards /
# `model.num_parameters()`): Llama-3-8B 8,030,261,248; Mistral-7B 7,241,732,096; Qwen2.5-7B
# 7,615,616,512 (card: 7.61B); GPT-2 124,439,808; Pythia-1.4B 1,414,647,808 (Pythia README table);
# GPT-NeoX-20B 20,554,567,680; Gemma-2B 2,506,172,416.
PUBLISHED = {
    "Meta-Llama-3-8B": 8_030_261_248,
    "Mistral-7B-v0.1": 7_241_732_096,
    "Qwen2.5-7B": 7_615_616_512,
    "gpt2": 124_439_808,
    "pythia-1.4b": 1_414_647_808,
    "gpt-neox-20b": 20_554_567_680,
    "gemma-2b": 2_506_172_416,
}


def _cfg(name):
    return json.loads((DATA / f"{name}.json").read_text())


@pytest.mark.parametrize("name,published", sorted(PUBLISHED.items()))
def test_count_matches_published(name, published):
    spec = model_from_hf_config(DATA / f"{name}.json")
    assert spec.num_params == pytest.approx(published, rel=0.005)
    assert spec.name == name and str(DATA / f"{name}.json") in spec.source


def test_qwen2_counts_its_qkv_bias():
    """Qwen2's q/k/v biases (ModelSpec.qkv_bias, since the fifty-second session): the count is the checkpoint's to the
    parameter, 28 x (3584 + 2 x 512) = 129,024 of them biases; without them it is short by exactly those."""
    spec = model_from_hf_config(DATA / "Qwen2.5-7B.json")
    assert spec.qkv_bias and PUBLISHED["Qwen2.5-7B"] == spec.num_params
    plain = spec.model_copy(update={"qkv_bias": None, "num_params": None})
    from cost_models.params import param_counts
    assert spec.num_params - param_counts(plain)["total"] == 28 * (3584 + 2 * 512)
    assert "bias" not in spec.source


def test_exact_where_the_family_maps_exactly():
    for name in ("Meta-Llama-3-8B", "Mistral-7B-v0.1", "gpt2", "pythia-1.4b", "gpt-neox-20b", "gemma-2b"):
        assert model_from_hf_config(DATA / f"{name}.json").num_params == PUBLISHED[name], name


def test_llama_mapping_equals_preset():
    spec = model_from_hf_config(DATA / "Meta-Llama-3-8B.json")
    preset = load_preset("llama3-8b")
    for f in ("arch", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "tied_embeddings", "rope_theta"):
        assert getattr(spec, f) == getattr(preset, f), f


def test_rope_base_is_read_with_the_types_default():
    """The RoPE base sets the model (the runtime's rotary tables, Megatron's --rotary-base), not its cost."""
    assert model_from_hf_config(DATA / "Meta-Llama-3-8B.json").rope_theta == 500000.0
    assert model_from_hf_config(DATA / "Qwen2.5-7B.json").rope_theta == 1000000.0
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "intermediate_size": 128, "vocab_size": 100}
    assert model_from_hf_config(cfg).rope_theta is None  # LlamaConfig's default, 10000
    assert model_from_hf_config({**cfg, "model_type": "gemma3_text", "head_dim": 16}).rope_theta == 1e6
    assert model_from_hf_config(_cfg("gpt2")).rope_theta is None  # learned positions
    scaled = model_from_hf_config({**cfg, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
    assert "rope_scaling (llama3) not applied" in scaled.source


def test_gpt2_fields_and_defaults():
    spec = model_from_hf_config(DATA / "gpt2.json")
    assert (spec.arch, spec.layers, spec.hidden, spec.heads, spec.kv_heads) == ("gpt", 12, 768, 12, 12)
    assert spec.ffn_hidden == 4 * 768          # n_inner absent -> 4 * n_embd (GPT2Config)
    assert spec.tied_embeddings and spec.max_seq_len == 1024
    cfg = _cfg("gpt2") | {"n_inner": 1000}
    assert model_from_hf_config(cfg).ffn_hidden == 1000
    assert model_from_hf_config(_cfg("gpt2") | {"n_inner": None}).ffn_hidden == 4 * 768
    # GPT2Config builds a zero-wide MLP from n_inner 0 (only None means 4 x n_embd): refused, not read as 4 x n_embd
    with pytest.raises(ValueError, match=r"n_inner \(parplan's ffn_hidden\): Input should be greater than 0"):
        model_from_hf_config(_cfg("gpt2") | {"n_inner": 0})


def test_gpt_neox_untied_no_position_table():
    spec = model_from_hf_config(DATA / "pythia-1.4b.json")
    assert spec.arch == "gpt" and not spec.tied_embeddings and spec.max_seq_len is None
    assert spec.learned_positions is False and not spec.has_learned_positions
    # a training seq_len does not add a position table to the count (rotary), nor does `recommend`'s recount
    assert model_from_hf_config(DATA / "pythia-1.4b.json", seq_len=2048).num_params == PUBLISHED["pythia-1.4b"]
    from planner.core import with_param_count
    for name in ("pythia-1.4b", "gpt-neox-20b"):
        spec = model_from_hf_config(DATA / f"{name}.json", seq_len=4096)
        assert with_param_count(spec, 4096).num_params == PUBLISHED[name]
        assert "beyond the checkpoint's context 2048" in spec.source


def test_rope_base_under_rope_parameters():
    """transformers' newer layout keeps the base (and the scaling) under rope_parameters."""
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "intermediate_size": 128, "vocab_size": 100,
           "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0}}
    spec = model_from_hf_config(cfg)
    assert spec.rope_theta == 500000.0 and "rope_scaling (llama3) not applied" in spec.source
    spec = model_from_hf_config({**cfg, "rope_theta": None, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})
    assert spec.rope_theta == 1e6 and "rope_scaling" not in spec.source


def test_sliding_windows_of_phi3_and_mistrals_default_are_noted():
    phi3 = {"model_type": "phi3", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
            "intermediate_size": 128, "vocab_size": 100, "sliding_window": 2047}
    assert "all layers attend within a 2047-token window" in model_from_hf_config(phi3, seq_len=4096).source
    mistral = {**_cfg("Mistral-7B-v0.1"), "model_type": "mistral"}
    mistral.pop("sliding_window", None)  # MistralConfig's default: 4096
    assert "4096-token window" in model_from_hf_config(mistral, seq_len=8192).source
    assert "window" not in model_from_hf_config({**mistral, "sliding_window": None}, seq_len=8192).source


def test_binary_file_and_gemma3_without_text_config(tmp_path):
    bad = tmp_path / "bin.json"
    bad.write_bytes(b"\xff\xfe\x00junk")
    with pytest.raises(ValueError, match="bin.json: not a text"):
        model_from_hf_config(bad)
    spec = model_from_hf_config({"model_type": "gemma3", "vision_config": {}})  # Gemma3TextConfig's defaults
    assert spec.arch == "llama" and "vision tower is not counted" in spec.source


def test_gemma_head_dim_and_tied_default():
    spec = model_from_hf_config(DATA / "gemma-2b.json")
    assert spec.head_size == 256 and spec.heads == 8 and spec.kv_heads == 1
    gemma7b = _cfg("gemma-2b") | {"hidden_size": 3072, "num_attention_heads": 16, "num_key_value_heads": 16}
    assert model_from_hf_config(gemma7b).head_dim == 256  # 16 x 256 != 3072: kept explicitly
    assert spec.tied_embeddings  # not in the file; GemmaConfig default is tied
    assert spec.arch == "llama" and spec.ffn_hidden == 16384


def test_head_dim_equal_to_default_is_dropped():
    cfg = _cfg("Meta-Llama-3-8B") | {"head_dim": 128}
    assert model_from_hf_config(cfg).head_dim is None


def test_missing_kv_heads_means_multi_head():
    cfg = _cfg("Meta-Llama-3-8B")
    del cfg["num_key_value_heads"]
    assert model_from_hf_config(cfg).kv_heads == 32


@pytest.mark.parametrize("field", ["num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts",
                                   "num_experts_per_tok"])
def test_moe_rejected(field):
    cfg = _cfg("Meta-Llama-3-8B") | {field: 8}
    with pytest.raises(ValueError, match=f"config dict: {field} = 8: a mixture-of-experts model of a family parplan "
                                         "does not read"):
        model_from_hf_config(cfg)
    assert model_from_hf_config(_cfg("Meta-Llama-3-8B") | {field: 0}).layers == 32  # a dense config's 0 experts


def test_moe_fields_nested_in_a_text_or_ffn_config_are_found():
    """A multimodal config's text_config (merged after the check had run) and DBRX's ffn_config.moe_num_experts had
    been counted as dense; a vision tower's fields are not the language model's."""
    gemma = {"model_type": "gemma3", "text_config": {"num_experts": 8}, "vision_config": {}}
    with pytest.raises(ValueError, match=r"text_config\.num_experts = 8: a mixture-of-experts model"):
        model_from_hf_config(gemma)
    with pytest.raises(ValueError, match=r"ffn_config\.moe_num_experts = 16"):
        model_from_hf_config(_cfg("Meta-Llama-3-8B") | {"ffn_config": {"moe_num_experts": 16}})
    assert model_from_hf_config({**gemma, "text_config": {}, "vision_config": {"num_experts": 4}}).layers == 26


def test_mixtral_and_qwen3_moe_configs_are_read_as_mixtures_of_experts():
    """Mixtral's config (intermediate_size is one expert's) and Qwen3-MoE's (moe_intermediate_size) give the model
    cards' counts: 46.7B total and 12.9B a token; 30.5B and 3.3B.  Qwen3-MoE with a leading run of dense layers is
    read, any other refused."""
    from cost_models.params import param_counts
    spec = model_from_hf_config(DATA / "Mixtral-8x7B-v0.1.json")
    assert (spec.experts, spec.experts_per_token, spec.ffn_hidden, spec.arch) == (8, 2, 14336, "llama")
    counts = param_counts(spec)
    assert round(counts["total"] / 1e9, 1) == 46.7 and round(counts["active"] / 1e9, 1) == 12.9
    qwen = {"model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048, "num_attention_heads": 32,
            "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
            "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "tie_word_embeddings": False,
            "decoder_sparse_step": 1, "mlp_only_layers": []}
    spec = model_from_hf_config(qwen)
    assert (spec.experts, spec.experts_per_token, spec.ffn_hidden) == (128, 8, 768)
    counts = param_counts(spec)
    assert round(counts["total"] / 1e9, 1) == 30.5 and round(counts["active"] / 1e9, 1) == 3.4  # 3.3B with q/k norms
    # a leading run of dense layers is read (ModelSpec.first_dense_layers, of intermediate_size), any other refused
    lead = model_from_hf_config(qwen | {"mlp_only_layers": [0]})
    assert (lead.first_dense_layers, lead.dense_ffn_hidden) == (1, 6144)
    with pytest.raises(ValueError, match=r"mlp_only_layers \[3\]: dense layers other than a leading run"):
        model_from_hf_config(qwen | {"mlp_only_layers": [3]})
    with pytest.raises(ValueError, match="missing required field num_experts_per_tok"):
        model_from_hf_config({k: v for k, v in qwen.items() if k != "num_experts_per_tok"})


def test_an_unsupported_family_gets_the_explicit_shape_flags_its_keys_fill():
    """The error named the supported types and no way on: it gives the explicit-shape flags from the config's own keys
    (a multi-query config of Falcon's keys one key/value head, whatever num_kv_heads says; Falcon and OPT themselves
    are read since 2026-12-04)."""
    falcon = {"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71, "num_hidden_layers": 32,
              "num_kv_heads": 71, "multi_query": True, "new_decoder_architecture": False, "vocab_size": 65024}
    assert model_from_hf_config(falcon).kv_heads == 1
    with pytest.raises(ValueError) as e:
        model_from_hf_config({**falcon, "model_type": "falcon_mamba"})
    msg = str(e.value)
    assert "model_type 'falcon_mamba' is not supported" in msg and "\n" not in msg
    assert "give the shape instead: --arch gpt --layers 32 --hidden 4544 --heads 71 --kv-heads 1 --vocab 65024 (" in msg
    codegen = {"model_type": "codegen", "n_embd": 4096, "n_layer": 33, "n_head": 16, "n_inner": 16384,
               "vocab_size": 51200, "activation_function": "gelu_new", "tie_word_embeddings": False}
    with pytest.raises(ValueError, match="--arch gpt --layers 33 --hidden 4096 --heads 16 --ffn-hidden 16384 --vocab "
                                         "51200 --untied-embeddings"):
        model_from_hf_config(codegen)
    with pytest.raises(ValueError, match="--arch llama --layers <N> --hidden 64 --heads <N> --vocab <N>"):
        model_from_hf_config({"model_type": "newthing", "hidden_size": 64, "hidden_act": "silu"})


def test_internlm2_reads_as_a_llama_block():
    """InternLM2's fused wqkv holds llama's q, k, v under llama's key names: InternLM2.5-7B's config counts its
    checkpoint's 7,737,708,544 parameters (32 layers x (4096 x (4096 + 2 x 1024 + 4096) + 3 x 4096 x 14336 + 2 x
    4096) + 2 x 92544 x 4096 + 4096)."""
    cfg = {"model_type": "internlm2", "architectures": ["InternLM2ForCausalLM"], "bias": False, "hidden_size": 4096,
           "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
           "vocab_size": 92544, "tie_word_embeddings": False, "max_position_embeddings": 32768}
    spec = model_from_hf_config(cfg)
    assert spec.arch == "llama" and spec.num_params == 7_737_708_544
    assert "bias" not in spec.source
    assert "bias not counted" in model_from_hf_config({**cfg, "bias": True}).source


def test_a_checkpoint_without_a_language_model_head_is_said_to_be_planned_with_one():
    """architectures Qwen3Model (a headless text encoder): parplan trains next-token prediction, so the count holds a
    vocab head the checkpoint does not have, and the note says so (+26 % of an untied 0.6B Qwen3)."""
    base = {"model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16,
            "num_hidden_layers": 28, "num_key_value_heads": 8, "vocab_size": 151936, "tie_word_embeddings": False}
    said = "no language-model head in the checkpoint; planned with one"
    assert said in model_from_hf_config({**base, "architectures": ["Qwen3Model"]}).source
    for lm in ("Qwen3ForCausalLM", "GPT2LMHeadModel", "Gemma3ForConditionalGeneration"):
        assert said not in model_from_hf_config({**base, "architectures": [lm]}).source
    assert said not in model_from_hf_config(base).source


@pytest.mark.parametrize("name,field", [("Meta-Llama-3-8B", "intermediate_size"), ("Meta-Llama-3-8B", "num_hidden_layers"),
                                        ("gpt2", "n_embd"), ("pythia-1.4b", "vocab_size"), ("gemma-2b", "num_attention_heads")])
def test_missing_required_field_named(tmp_path, name, field):
    cfg = _cfg(name)
    del cfg[field]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError) as e:
        model_from_hf_config(tmp_path)  # a model directory works too
    assert field in str(e.value) and str(path) in str(e.value)


def test_unsupported_family_lists_supported():
    with pytest.raises(ValueError) as e:
        model_from_hf_config({"model_type": "t5", "num_layers": 6})
    assert "t5" in str(e.value) and "gpt_neox" in str(e.value)


def test_bad_json(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        model_from_hf_config(p)


def test_qwen3_and_phi3_map_to_llama():
    """Families added without a stored copy of their config: the fields are the llama family's, so these
    dicts hold the shapes their model cards state, and the counts are checked against the cards' rounded
    totals (Qwen3-0.6B: 0.6B, 0.44B without embeddings; Phi-3-mini: 3.8B)."""
    qwen3 = {"model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 28, "vocab_size": 151936,
             "tie_word_embeddings": True, "max_position_embeddings": 40960}
    spec = model_from_hf_config(qwen3)
    assert spec.arch == "llama" and spec.head_dim == 128 and spec.tied_embeddings  # 16 x 128 = 2048 != 1024
    assert round(spec.num_params / 1e9, 1) == 0.6
    assert round((spec.num_params - 151936 * 1024) / 1e9, 2) == 0.44
    assert "q/k norms' weights not counted" in spec.source and spec.qk_norm
    phi3 = {"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_attention_heads": 32,
            "num_key_value_heads": 32, "num_hidden_layers": 32, "vocab_size": 32064}
    spec = model_from_hf_config(phi3)
    assert spec.arch == "llama" and not spec.tied_embeddings and round(spec.num_params / 1e9, 1) == 3.8


def test_gemma2_maps_to_llama_and_says_when_its_sliding_window_is_counted_full():
    """Gemma-2-2B's shape as its model card states it (2.61B): exact, its post-norms counted; at a
    sequence longer than its 4096-token window the source says the local layers' attention is over-counted."""
    gemma2 = {"model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216, "num_attention_heads": 8,
              "num_key_value_heads": 4, "head_dim": 256, "num_hidden_layers": 26, "vocab_size": 256000,
              "sliding_window": 4096}
    spec = model_from_hf_config(gemma2, seq_len=4096)
    assert spec.tied_embeddings and spec.head_dim == 256
    assert spec.num_params == 2_614_341_888  # its two post-norms a layer counted (post_norms)
    assert "window" not in spec.source
    assert "counted as full attention at seq_len 8192" in model_from_hf_config(gemma2, seq_len=8192).source


def test_gemma3_text_and_a_multimodal_gemma3_config():
    """Gemma-3-1B (999,885,952 parameters): exact but for its two q/k norms' weights a layer;
    five of every six layers attend within 512 tokens, said in the source beyond that length.  A
    multimodal gemma3 config is read through its text_config, the vision tower left out (said)."""
    text = {"model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912, "num_attention_heads": 4,
            "num_key_value_heads": 1, "head_dim": 256, "num_hidden_layers": 26, "vocab_size": 262144,
            "sliding_window": 512, "sliding_window_pattern": 6}
    spec = model_from_hf_config(text, seq_len=4096)
    assert 999_885_952 - spec.num_params == 26 * 2 * 256  # the q/k norms' weights (its post-norms counted)
    assert "5 of every 6 layers attend within a 512-token window" in spec.source
    wrapped = model_from_hf_config({"model_type": "gemma3", "text_config": text, "vision_config": {"hidden_size": 1152}})
    assert wrapped.num_params == model_from_hf_config(text).num_params and wrapped.tied_embeddings
    assert "vision tower is not counted" in wrapped.source


def test_granite_and_olmo2_map_to_llama():
    """Granite's multipliers are scalars, so a granite config counts as llama exactly; OLMo 2's q/k norms
    (h + kv width weights a layer) are the one difference, said in the source.  Shapes of
    ibm-granite/granite-3.1-8b-base and allenai/OLMo-2-1124-7B as their configs give them; the counts
    are the llama formula's by hand: L (2 h^2 + 2 h kv + 3 h ffn + 2 h) + (1 or 2) V h + h (granite tied; OLMo 2
    untied, its 32 x 2 x 4096 q/k norm weights left out); 8.17B and 7.30B as the model cards give them."""
    from cost_models.params import param_counts
    by_hand = {"granite": 40 * (2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 12800 + 2 * 4096) + 49155 * 4096 + 4096,
               "olmo2": 32 * (4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096) + 2 * 100352 * 4096 + 4096}
    assert by_hand == {"granite": 8_170_848_256, "olmo2": 7_298_355_200}
    granite = {"model_type": "granite", "hidden_size": 4096, "intermediate_size": 12800, "num_attention_heads": 32,
               "num_key_value_heads": 8, "num_hidden_layers": 40, "vocab_size": 49155, "tie_word_embeddings": True,
               "embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 0.0078125,
               "logits_scaling": 16.0}
    olmo2 = {"model_type": "olmo2", "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
             "num_key_value_heads": 32, "num_hidden_layers": 32, "vocab_size": 100352}
    for cfg, tied, note in ((granite, True, None), (olmo2, False, "q/k norms' weights not counted")):
        spec = model_from_hf_config(cfg)
        assert spec.arch == "llama" and spec.tied_embeddings is tied
        assert spec.num_params == param_counts(spec)["total"] == by_hand[cfg["model_type"]]
        assert (note in spec.source) if note else "not counted" not in spec.source
        assert spec.qk_norm is (True if note else None)  # OLMo 2's q/k norms' activations are counted


def test_keys_a_config_leaves_out_take_the_transformers_class_defaults():
    """A key missing from config.json is what the family's transformers config class fills in
    (configuration_<type>.py): an official multimodal Gemma 3 text_config lists only what differs from
    Gemma3TextConfig (vocab 262,208, 8 heads, 4 kv heads, head_dim 256), Qwen3's head_dim is 128 and Mistral's
    kv heads 8 whatever the width, GPT-2's position table 1,024.  Counts by hand."""
    g4b = model_from_hf_config({"model_type": "gemma3", "vision_config": {"hidden_size": 1152},
                                "text_config": {"model_type": "gemma3_text", "hidden_size": 2560,
                                                "intermediate_size": 10240, "num_hidden_layers": 34,
                                                "sliding_window": 1024}})
    h, q, kv, f, V = 2560, 8 * 256, 4 * 256, 10240, 262208
    assert (g4b.heads, g4b.kv_heads, g4b.head_dim, g4b.vocab, g4b.tied_embeddings) == (8, 4, 256, V, True)
    assert g4b.num_params == 34 * (2 * h * q + 2 * h * kv + 3 * h * f + 4 * h) + V * h + h == 3_880_245_760  # 4 norms
    qwen3 = model_from_hf_config({"model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
                                  "num_attention_heads": 16, "num_key_value_heads": 8, "num_hidden_layers": 28,
                                  "tie_word_embeddings": True})  # Qwen3-0.6B's shape, head_dim left out
    assert qwen3.head_dim == 128
    assert qwen3.num_params == 28 * (2 * 1024 * 2048 + 2 * 1024 * 1024 + 3 * 1024 * 3072 + 2 * 1024) \
        + 151936 * 1024 + 1024
    mistral = model_from_hf_config({"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
                                    "num_attention_heads": 32, "num_hidden_layers": 32, "vocab_size": 32000,
                                    "sliding_window": 4096}, seq_len=32768)
    assert mistral.kv_heads == 8 and mistral.num_params == 7_241_732_096  # Mistral-7B's 7.24B
    assert "all layers attend within a 4096-token window" in mistral.source
    gpt2 = model_from_hf_config({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257})
    assert gpt2.max_seq_len == 1024 and gpt2.num_params == 124_439_808  # GPT-2's released 124M


def test_gemma_window_and_context_defaults_and_qwens_window_note():
    """Gemma2Config and Gemma3TextConfig default sliding_window to 4096 and max_position_embeddings to 8,192 and
    131,072 (transformers' configuration_gemma2.py / configuration_gemma3.py): a config leaving them out had planned
    no window and no context.  Qwen's use_sliding_window (layers from max_window_layers on) is said, not modelled."""
    g2 = model_from_hf_config({"model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216,
                               "num_attention_heads": 8, "num_hidden_layers": 26}, seq_len=8192)
    assert (g2.sliding_window, g2.full_attention_every) == (4096, 2) and "context 8192" in g2.source
    g1 = _cfg("gemma-2b")
    g1.pop("max_position_embeddings", None)
    assert "context 8192" in model_from_hf_config(g1).source  # GemmaConfig's
    g3 = model_from_hf_config({"model_type": "gemma3", "text_config": {"hidden_size": 2560,
                               "intermediate_size": 10240, "num_hidden_layers": 34}})
    assert (g3.sliding_window, g3.full_attention_every) == (4096, 6) and "context 131072" in g3.source
    qwen = _cfg("Qwen2.5-7B")
    assert "use_sliding_window" not in model_from_hf_config(qwen).source
    qwen.update(use_sliding_window=True, max_window_layers=28, sliding_window=4096)  # 28 layers: none slides
    assert "use_sliding_window" not in model_from_hf_config(qwen).source
    qwen.update(max_window_layers=20)
    del qwen["sliding_window"]  # Qwen2Config's 4096
    assert "layers 21..28 attend within 4096 tokens" in model_from_hf_config(qwen).source


def test_wrong_types_and_dropped_biases_are_said():
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "intermediate_size": 128, "vocab_size": 100}
    with pytest.raises(ValueError, match="tie_word_embeddings must be true or false"):
        model_from_hf_config({**cfg, "tie_word_embeddings": "false"})
    with pytest.raises(ValueError, match="kv_heads"):
        model_from_hf_config({**cfg, "num_key_value_heads": 0})
    assert "attention_bias not counted" in model_from_hf_config({**cfg, "attention_bias": True}).source
    assert "partial_rotary_factor 0.75" in model_from_hf_config({**cfg, "partial_rotary_factor": 0.75}).source
    gemma2 = {**cfg, "model_type": "gemma2", "head_dim": 16, "attn_logit_softcapping": 50.0}
    assert "attn_logit_softcapping" in model_from_hf_config(gemma2).source


@pytest.mark.parametrize("cfg, key, field", [
    ({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 0, "vocab_size": 100,
      "intermediate_size": 128}, "num_attention_heads", "heads"),
    ({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
      "num_key_value_heads": 0, "vocab_size": 100, "intermediate_size": 128}, "num_key_value_heads", "kv_heads"),
    ({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 100, "n_positions": 0},
     "n_positions", "max_seq_len"),
])
def test_a_bad_value_names_the_configs_key(cfg, key, field):
    """The error names the key to fix in the file (it had named parplan's field only: 'heads: ...')."""
    with pytest.raises(ValueError) as e:
        model_from_hf_config(cfg)
    assert f"{key} (parplan's {field})" in str(e.value) and "correct it in the config" in str(e.value)


def test_a_config_that_names_no_activation_gets_the_block_its_mlp_width_reads_as():
    """No hidden_act: a gated MLP's width is seldom 4 x hidden, so a llama-shaped config reads as --arch llama (it had
    been sent to --arch gpt); a 4 x hidden or implicit width stays gpt (Falcon, above)."""
    llama_like = {"model_type": "newthing", "hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
                  "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}
    with pytest.raises(ValueError, match="--arch llama --layers 32 --hidden 4096 --heads 32 --kv-heads 8 --ffn-hidden "
                                         "14336 --vocab 128256"):
        model_from_hf_config(llama_like)
    with pytest.raises(ValueError, match="--arch gpt --layers 32"):
        model_from_hf_config({**llama_like, "intermediate_size": 16384})


def test_a_model_type_in_another_case_is_named_and_a_plan_is_told_apart():
    """'LLAMA' is no model_type transformers knows either: the error names 'llama' (it had offered the explicit
    shape flags); a parplan plan given as a config is named as one, with the command that reads it."""
    with pytest.raises(ValueError, match="model_type 'LLAMA' is not supported; did you mean 'llama'\\?"):
        model_from_hf_config({"model_type": "LLAMA", "hidden_size": 64})
    plan = {"model": {"arch": "llama"}, "parallel": {"tp": 1}, "training": {}}
    with pytest.raises(ValueError, match="config dict is a parplan plan, not a Hugging Face config .*parplan evaluate"):
        model_from_hf_config(plan)


def test_a_window_no_sequence_reaches_is_full_attention():
    """sliding_window 1e30 (a float JSON number) had been carried into the plan as a 31-digit integer; a window at or
    past the longest sequence the planner takes never binds: full attention, as a null window."""
    base = {"model_type": "mistral", "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_hidden_layers": 2,
            "intermediate_size": 512, "vocab_size": 1000}
    assert model_from_hf_config({**base, "sliding_window": 1e30}).sliding_window is None
    assert model_from_hf_config({**base, "sliding_window": 4096}).sliding_window == 4096


def test_multimodal_configs_read_through_their_text_config():
    """A vision-language config is planned as its language model (its text_config), the vision tower left out (said).
    The text_config lists only what differs from its class's defaults, as transformers fills them in: LLaVA-1.5-7B's
    names no hidden size (LlamaConfig's 4096 x 32 layers, ffn 11008) and its language model is Llama-2-7B with a
    vocabulary of 32,064 (6,738,415,616 + 2 x 64 x 4096 parameters); a mistral3 config without one is Mistral Small
    3.1's 24B language model (23,572,403,200, Mistral3Config's default text_config)."""
    llava = {"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"], "vocab_size": 32064,
             "text_config": {"model_type": "llama", "max_position_embeddings": 4096, "vocab_size": 32064},
             "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024, "num_hidden_layers": 24}}
    spec = model_from_hf_config(llava)
    assert (spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.ffn_hidden, spec.vocab) == \
        (32, 4096, 32, 32, 11008, 32064)
    assert spec.num_params == 6_738_415_616 + 2 * 64 * 4096
    assert "llava config (its text_config): the vision tower is not counted" in spec.source
    small = model_from_hf_config({"model_type": "mistral3", "vision_config": {"hidden_size": 1024}})
    assert small.num_params == 23_572_403_200 and small.sliding_window is None  # Mistral3Config: sliding_window None
    text = {"model_type": "mistral", "hidden_size": 5120, "intermediate_size": 32768, "num_hidden_layers": 40,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 131072,
            "sliding_window": None}
    assert model_from_hf_config({"model_type": "mistral3", "text_config": text}).num_params == \
        model_from_hf_config(text).num_params == 23_572_403_200
    # a stand-alone config still names its shape (a truncated file is refused, not planned as the class's default)
    with pytest.raises(ValueError, match="hidden_size"):
        model_from_hf_config({"model_type": "llama", "num_hidden_layers": 32})
    # any other wrapper whose text_config names a supported type is read the same way
    other = model_from_hf_config({"model_type": "idefics3", "text_config": {**text, "model_type": "llama"}})
    assert other.num_params == 23_572_403_200 and "idefics3 config" in other.source
    # Qwen2.5-VL-7B: Qwen2's blocks (Qwen2.5-7B's 7,615,616,512 parameters with their q/k/v biases), the language
    # model's keys at the top level (the released file) or in a text_config of type qwen2_5_vl_text (newer saves)
    qwen = {"hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28, "num_hidden_layers": 28,
            "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False,
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}
    top = model_from_hf_config({"model_type": "qwen2_5_vl", **qwen, "vision_config": {"depth": 32}})
    assert top.num_params == 7_615_616_512 and top.qkv_bias  # (its q/k/v biases counted: ModelSpec.qkv_bias)
    assert "q/k/v biases not counted" not in top.source and "mrope" in top.source
    nested = model_from_hf_config({"model_type": "qwen2_5_vl", "text_config": {**qwen, "model_type": "qwen2_5_vl_text"}})
    assert nested.num_params == top.num_params
    # a language model parplan does not read: named, with the shape flags from the text_config's keys
    with pytest.raises(ValueError, match=r"its text_config's\) 'qwen3_vl_moe_text'.*--hidden 2048"):
        model_from_hf_config({"model_type": "qwen3_vl_moe", "text_config": {"model_type": "qwen3_vl_moe_text",
                                                                            "hidden_size": 2048}})
    with pytest.raises(ValueError, match="mistral3 config \\(its text_config\\) has model_type 'pixtral'"):
        model_from_hf_config({"model_type": "mistral3", "text_config": {"model_type": "pixtral"}})
    # a mixture-of-experts language model inside a wrapper is still refused as one
    with pytest.raises(ValueError, match="text_config.num_local_experts = 8: a mixture-of-experts"):
        model_from_hf_config({"model_type": "llava", "text_config": {"model_type": "mixtral", "num_local_experts": 8}})


def test_a_hub_name_reads_the_config_from_the_local_hub_cache(tmp_path, monkeypatch):
    """--model-config meta-llama/Llama-3.1-8B: where no such file is, the model's config.json in the Hugging Face
    cache (models--owner--name/snapshots/<refs/main>/config.json, else the newest snapshot), named by the hub name;
    not there: one line with the fix. A local folder of that name wins, as it does for transformers."""
    import os
    import time
    cfg = json.loads((DATA / "Meta-Llama-3-8B.json").read_text())
    cfg.pop("_name_or_path", None)
    repo = tmp_path / "hub" / "models--meta-llama--Llama-3.1-8B"
    for rev, layers in (("old", 16), ("abc123", 32), ("older", 8)):
        (repo / "snapshots" / rev).mkdir(parents=True)
        (repo / "snapshots" / rev / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": layers}))
        os.utime(repo / "snapshots" / rev / "config.json", (time.time() + layers, time.time() + layers))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    spec = model_from_hf_config("meta-llama/Llama-3.1-8B")
    assert spec.layers == 32 and spec.name == "meta-llama/Llama-3.1-8B"  # refs/main's revision
    (repo / "refs" / "main").unlink()
    assert model_from_hf_config("meta-llama/Llama-3.1-8B").layers == 32  # the newest snapshot (mtime)
    with pytest.raises(ValueError, match=r"Qwen/Qwen3-8B is neither a file nor in the Hugging Face cache .*"
                                         r"huggingface-cli download Qwen/Qwen3-8B config.json"):
        model_from_hf_config("Qwen/Qwen3-8B")
    # a mixture-of-experts model missing from the cache: told it has no plan, not to fetch a config it would refuse
    with pytest.raises(ValueError, match=r"^Hugging Face config databricks/dbrx-base: a mixture-of-experts model by "
                                         r"its name; parplan plans Mixtral's, Qwen2/3-MoE's, GLM-4.5's, dots.llm1's, Llama 4's"):
        model_from_hf_config("databricks/dbrx-base")
    # a mixture of experts it reads is told where to fetch its config
    with pytest.raises(ValueError, match=r"Qwen/Qwen3-30B-A3B is neither a file nor in the Hugging Face cache"):
        model_from_hf_config("Qwen/Qwen3-30B-A3B")
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # $HF_HOME/hub
    assert model_from_hf_config("meta-llama/Llama-3.1-8B").layers == 32
    local = tmp_path / "meta-llama" / "Llama-3.1-8B"
    local.mkdir(parents=True)
    (local / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 4}))
    assert model_from_hf_config("meta-llama/Llama-3.1-8B").layers == 4


# More families, counted against what transformers builds: transformers 5.25.0, AutoConfig.for_model(**config) then
# AutoModelForCausalLM.from_config on the meta device, the sum of numel over model.parameters() (tied weights once;
# 2026-12-04).  The configs are the config classes' defaults, themselves published shapes (StarCoder2-3B, Nemotron-4
# 15B with 8 kv heads, SmolLM3-3B, phi-1.5, Command R, StableLM-3B-4E1T, Falcon-7B, MPT-1B, OPT-125m, GPT-J-6B,
# GLM-4-9B, ...; only the keys that set the shape kept), and five more: Falcon-40B, MPT-7B (6,649,286,656, its model
# card's count), OPT-350m, GPT-BigCode with multi-head attention (GPT-2's 124,439,808) and BLOOM-176B
# (176,247,271,424, as published).  Where parplan's llama or gpt blocks hold other norms or biases than the checkpoint,
# the difference is exactly what the spec's source says is not counted (or counted where the checkpoint has none).
TRANSFORMERS_BUILT = [
    ({'vocab_size': 49152, 'hidden_size': 3072, 'intermediate_size': 12288, 'num_hidden_layers': 30, 'num_attention_heads': 24, 'num_key_value_heads': 2, 'max_position_embeddings': 4096, 'rope_parameters': {'rope_theta': 10000.0, 'rope_type': 'default'}, 'use_bias': True, 'tie_word_embeddings': True, 'model_type': 'starcoder2'},
     3_030_371_328, 0, 'exact'),
    ({'vocab_size': 50257, 'n_positions': 1024, 'n_embd': 768, 'n_layer': 12, 'n_head': 12, 'multi_query': True, 'tie_word_embeddings': True, 'model_type': 'gpt_bigcode'},
     111_446_784, 0, 'exact'),
    ({'vocab_size': 256000, 'hidden_size': 6144, 'intermediate_size': 24576, 'num_hidden_layers': 32, 'num_attention_heads': 48, 'head_dim': 128, 'num_key_value_heads': 8, 'max_position_embeddings': 4096, 'tie_word_embeddings': False, 'rope_parameters': {'rope_theta': 10000.0, 'partial_rotary_factor': 0.5, 'rope_type': 'default'}, 'attention_bias': False, 'mlp_bias': False, 'model_type': 'nemotron'},
     15_628_775_424, 32 * ((48 + 2 * 8) * 128 + 6144 + 24576 + 6144), 'no linear biases'),
    ({'vocab_size': 128256, 'hidden_size': 2048, 'intermediate_size': 11008, 'num_hidden_layers': 36, 'num_attention_heads': 16, 'num_key_value_heads': 4, 'max_position_embeddings': 32768, 'rope_parameters': {'rope_theta': 2000000.0, 'rope_type': 'default'}, 'no_rope_layers': [1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0], 'attention_bias': False, 'mlp_bias': False, 'tie_word_embeddings': True, 'model_type': 'smollm3'},
     3_075_098_624, 0, 'NoPE'),
    ({'vocab_size': 50304, 'hidden_size': 4096, 'intermediate_size': 11008, 'num_hidden_layers': 32, 'num_attention_heads': 32, 'num_key_value_heads': 32, 'max_position_embeddings': 2048, 'tie_word_embeddings': False, 'rope_parameters': {'sliding_attention': {'rope_type': 'default', 'rope_theta': 500000.0}, 'full_attention': {'rope_type': 'default', 'rope_theta': 500000.0}}, 'attention_bias': False, 'sliding_window': 4096, 'model_type': 'olmo3'},
     6_888_624_128, -32 * (32 * 128 + 32 * 128), "q/k norms' weights not counted"),
    ({'vocab_size': 51200, 'hidden_size': 2048, 'intermediate_size': 8192, 'num_hidden_layers': 24, 'num_attention_heads': 32, 'num_key_value_heads': 32, 'max_position_embeddings': 2048, 'tie_word_embeddings': False, 'rope_parameters': {'rope_theta': 10000.0, 'partial_rotary_factor': 0.5, 'rope_type': 'default'}, 'model_type': 'phi'},
     1_418_270_720, -51200, 'side by side on one LayerNorm'),  # (parallel_block: one norm, counted)
    ({'vocab_size': 256000, 'hidden_size': 8192, 'intermediate_size': 22528, 'num_hidden_layers': 40, 'num_attention_heads': 64, 'num_key_value_heads': 64, 'max_position_embeddings': 8192, 'tie_word_embeddings': True, 'rope_parameters': {'rope_theta': 500000.0, 'rope_type': 'default'}, 'attention_bias': False, 'model_type': 'cohere'},
     34_980_831_232, 0, 'side by side on one LayerNorm'),
    ({'vocab_size': 256000, 'hidden_size': 8192, 'intermediate_size': 22528, 'num_hidden_layers': 40, 'num_attention_heads': 64, 'num_key_value_heads': 64, 'max_position_embeddings': 8192, 'tie_word_embeddings': True, 'rope_parameters': {'rope_theta': 10000.0, 'rope_type': 'default'}, 'attention_bias': False, 'sliding_window': 4096, 'head_dim': 128, 'model_type': 'cohere2'},
     34_980_831_232, 0, 'side by side on one LayerNorm'),
    ({'vocab_size': 50304, 'intermediate_size': 6912, 'hidden_size': 2560, 'num_hidden_layers': 32, 'num_attention_heads': 32, 'num_key_value_heads': 32, 'max_position_embeddings': 4096, 'tie_word_embeddings': False, 'rope_parameters': {'rope_theta': 10000.0, 'partial_rotary_factor': 0.25, 'rope_type': 'default'}, 'use_qkv_bias': False, 'model_type': 'stablelm'},
     2_795_443_200, -(32 * 2 * 2560 + 2560), 'LayerNorm biases not counted'),
    ({'vocab_size': 65024, 'hidden_size': 4544, 'num_hidden_layers': 32, 'num_attention_heads': 71, 'num_kv_heads': 71, 'alibi': False, 'new_decoder_architecture': False, 'multi_query': True, 'parallel_attn': True, 'bias': False, 'max_position_embeddings': 2048, 'rope_parameters': {'rope_theta': 10000.0, 'rope_type': 'default'}, 'ffn_hidden_size': 18176, 'tie_word_embeddings': True, 'model_type': 'falcon'},
     6_921_720_704, 32 * ((71 + 2) * 64 + 4544 + 18176 + 4544), 'no linear biases'),
    ({'d_model': 2048, 'n_heads': 16, 'n_layers': 24, 'expansion_ratio': 4, 'max_seq_len': 2048, 'vocab_size': 50368, 'attn_config': {'attn_type': 'multihead_attention', 'alibi': True}, 'no_bias': True, 'tie_word_embeddings': True, 'model_type': 'mpt'},
     1_311_213_568, 24 * (3 * 2048 + 2048 + 8192 + 2048 + 2 * 2048) + 2048, 'no linear biases'),
    ({'vocab_size': 250880, 'hidden_size': 64, 'n_layer': 2, 'n_head': 8, 'tie_word_embeddings': True, 'model_type': 'bloom'},
     16_156_544, -2 * 64, "embedding's LayerNorm not counted"),
    ({'vocab_size': 50272, 'hidden_size': 768, 'num_hidden_layers': 12, 'ffn_dim': 3072, 'max_position_embeddings': 2048, 'word_embed_proj_dim': 768, 'num_attention_heads': 12, 'enable_bias': True, 'tie_word_embeddings': True, 'model_type': 'opt'},
     125_239_296, -2 * 768, '2 offset rows not counted'),
    ({'vocab_size': 50400, 'n_positions': 2048, 'n_embd': 4096, 'n_layer': 28, 'n_head': 16, 'rotary_dim': 64, 'tie_word_embeddings': False, 'model_type': 'gptj'},
     6_050_882_784, 28 * (3 * 4096 + 4096) - 50400, 'without biases counted'),
    ({'vocab_size': 151552, 'hidden_size': 4096, 'intermediate_size': 13696, 'num_hidden_layers': 40, 'num_attention_heads': 32, 'num_key_value_heads': 2, 'head_dim': 128, 'max_position_embeddings': 131072, 'tie_word_embeddings': False, 'rope_parameters': {'rope_theta': 10000.0, 'partial_rotary_factor': 0.5, 'rope_type': 'default'}, 'attention_bias': True, 'model_type': 'glm4'},
     9_400_279_040, 0, "fused gate_up counted as separate matrices"),  # (its q/k/v biases counted: qkv_bias)
    ({'vocab_size': 102400, 'hidden_size': 4096, 'intermediate_size': 16384, 'num_hidden_layers': 32, 'num_attention_heads': 32, 'num_key_value_heads': 32, 'max_position_embeddings': 2048, 'tie_word_embeddings': False, 'rope_parameters': {'rope_theta': 10000.0, 'rope_type': 'default'}, 'sliding_window': 4096, 'sliding_window_pattern': 4, 'model_type': 'exaone4'},
     9_429_069_824, -32 * 2 * 128, "q/k norms' weights not counted"),
    ({'vocab_size': 155136, 'hidden_size': 4096, 'intermediate_size': 27648, 'num_hidden_layers': 64, 'num_attention_heads': 80, 'num_key_value_heads': 8, 'max_position_embeddings': 524288, 'tie_word_embeddings': False, 'rope_parameters': {'rope_theta': 10000.0, 'rope_type': 'default'}, 'attention_bias': True, 'attention_out_bias': False, 'mlp_bias': False, 'head_dim': 128, 'model_type': 'seed_oss'},
     28_921_040_896, 0, 'exact'),  # (its attention_bias, q/k/v only: counted as qkv_bias)
    ({'vocab_size': 50304, 'hidden_size': 4096, 'intermediate_size': 11008, 'num_hidden_layers': 32, 'num_attention_heads': 32, 'num_key_value_heads': 32, 'max_position_embeddings': 2048, 'tie_word_embeddings': False, 'rope_parameters': {'rope_theta': 10000.0, 'rope_type': 'default'}, 'attention_bias': False, 'model_type': 'olmo'},
     6_888_095_744, 32 * 2 * 4096 + 4096, 'non-parametric LayerNorms'),
    ({'model_type': 'falcon', 'vocab_size': 65024, 'hidden_size': 8192, 'num_hidden_layers': 60, 'num_attention_heads': 128, 'num_kv_heads': 8, 'new_decoder_architecture': True, 'parallel_attn': True, 'bias': False, 'alibi': False, 'tie_word_embeddings': True},
     41_303_293_952, 60 * ((128 + 2 * 8) * 64 + 8192 + 32768 + 8192), 'no linear biases'),
    ({'model_type': 'mpt', 'd_model': 4096, 'n_heads': 32, 'n_layers': 32, 'expansion_ratio': 4, 'max_seq_len': 2048, 'vocab_size': 50432, 'no_bias': True, 'attn_config': {'alibi': True}},
     6_649_286_656, 32 * (3 * 4096 + 4096 + 16384 + 4096 + 2 * 4096) + 4096, 'ALiBi costed as rotary'),
    ({'model_type': 'opt', 'vocab_size': 50272, 'hidden_size': 1024, 'num_hidden_layers': 24, 'ffn_dim': 4096, 'max_position_embeddings': 2048, 'word_embed_proj_dim': 512, 'num_attention_heads': 16, 'do_layer_norm_before': False, 'tie_word_embeddings': True},
     331_196_416, (1024 - 512) * 50272 - 2 * 512 * 1024 - 2 * 1024 + 2 * 1024, 'projections in and out not counted'),
    ({'model_type': 'gpt_bigcode', 'vocab_size': 50257, 'n_positions': 1024, 'n_embd': 768, 'n_layer': 12, 'n_head': 12, 'multi_query': False},
     124_439_808, 0, 'exact'),
    ({'model_type': 'bloom', 'vocab_size': 250880, 'hidden_size': 14336, 'n_layer': 70, 'n_head': 112},
     176_247_271_424, -2 * 14336, 'ALiBi costed as rotary'),
]


@pytest.mark.parametrize("cfg,built,parplan_more,said", TRANSFORMERS_BUILT,
                         ids=[f"{c['model_type']}-{n}" for c, n, _, _ in TRANSFORMERS_BUILT])
def test_more_families_count_what_transformers_builds_but_what_they_say(cfg, built, parplan_more, said):
    spec = model_from_hf_config(cfg)
    assert spec.num_params - built == parplan_more
    assert said in spec.source or said == "exact"
    gpt = cfg["model_type"] in ("starcoder2", "gpt_bigcode", "nemotron", "phi", "falcon", "mpt", "bloom", "opt", "gptj")
    assert spec.arch == ("gpt" if gpt else "llama")


def test_more_families_positions_and_attention():
    """A learned table where the family has one (GPT-BigCode, OPT: the plan's sequence capped at it), rotary
    positions elsewhere (ALiBi costed as rotary, said); Falcon's and GPT-BigCode's multi-query attention one kv head,
    Falcon-40B's num_kv_heads; windows as layer_types or the class's pattern give them."""
    by_type = {c["model_type"] + ("-" + str(n) if c["model_type"] in ("falcon", "mpt", "opt", "gpt_bigcode", "bloom")
                                  else ""): model_from_hf_config(c) for c, n, _, _ in TRANSFORMERS_BUILT}
    assert by_type["gpt_bigcode-111446784"].has_learned_positions
    assert by_type["gpt_bigcode-111446784"].max_seq_len == 1024 and by_type["gpt_bigcode-111446784"].kv_heads == 1
    assert by_type["gpt_bigcode-124439808"].kv_heads == 12
    assert by_type["opt-125239296"].max_seq_len == 2048 and by_type["opt-125239296"].has_learned_positions
    for key in ("starcoder2", "nemotron", "phi", "gptj", "falcon-6921720704", "mpt-6649286656", "bloom-176247271424"):
        assert not by_type[key].has_learned_positions, key
    assert "ALiBi" in by_type["mpt-6649286656"].source and "ALiBi" in by_type["bloom-176247271424"].source
    assert by_type["falcon-6921720704"].kv_heads == 1 and by_type["falcon-41303293952"].kv_heads == 8
    assert (by_type["nemotron"].kv_heads, by_type["starcoder2"].kv_heads) == (8, 2)
    assert by_type["olmo3"].rope_theta == 500000.0  # rope_parameters per layer type: the full-attention layers'
    for key in ("olmo3", "cohere2", "exaone4"):  # every 4th layer in full (their classes' pattern), the rest windowed
        assert (by_type[key].sliding_window, by_type[key].full_attention_every) == (4096, 4), key
    exaone = {c["model_type"]: c for c, _, _, _ in TRANSFORMERS_BUILT}["exaone4"]
    lettered = model_from_hf_config({**exaone, "sliding_window_pattern": "LLLG"})  # EXAONE 4.0's released files
    assert (lettered.sliding_window, lettered.full_attention_every) == (4096, 4)
    starcoder = {c["model_type"]: c for c, _, _, _ in TRANSFORMERS_BUILT}["starcoder2"]
    windowed = model_from_hf_config({**starcoder, "sliding_window": 4096}, seq_len=16384)
    assert (windowed.sliding_window, windowed.full_attention_every) == (4096, None)  # every layer, as Mistral 7B
    assert "all layers attend within a 4096-token window" in windowed.source


def test_more_families_plan_and_launch_shapes():
    """A new family's spec is a plan: recommend takes it and its blocks are the runtime's (gpt with GQA and rotary
    positions for StarCoder2)."""
    from planner.core import recommend
    from parallel_layers.model import ModelConfig
    starcoder = {c["model_type"]: c for c, _, _, _ in TRANSFORMERS_BUILT}["starcoder2"]
    spec = model_from_hf_config(starcoder)
    plan = recommend(spec, 8, suggest=False)
    assert plan.prediction is not None and plan.model.kv_heads == 2
    cfg = ModelConfig.from_plan(plan)
    assert cfg.arch == "gpt" and cfg.rope and cfg.kv_heads == 2


def test_fuzz_findings_are_one_line_errors():
    """A fuzz of 2,400 mutated configs (2026-12-04) found three inputs that raised inside the reader instead of naming
    the key: a model_type that is a list or object, a head_dim of the wrong type beside a fractional head count, and
    GPT-J's rotary_dim over a head width of zero (more heads than hidden)."""
    base = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
            "intermediate_size": 128, "vocab_size": 100}
    for bad in ([], {}, 3):
        with pytest.raises(ValueError, match="model_type must be a string naming the family"):
            model_from_hf_config({**base, "model_type": bad})
    with pytest.raises(ValueError, match="heads"):
        model_from_hf_config({**base, "head_dim": {}, "num_attention_heads": 3.5})
    gptj = {"model_type": "gptj", "n_embd": 4, "n_layer": 2, "n_head": 8, "rotary_dim": 64, "vocab_size": 100}
    with pytest.raises(ValueError) as e:
        model_from_hf_config(gptj)
    assert "\n" not in str(e.value)


# Mixtures of experts added 2026-12-06, each counted against what transformers 5.25.0 builds from the stored config (as
# TRANSFORMERS_BUILT above: AutoConfig.for_model, AutoModelForCausalLM.from_config on the meta device, the sum of numel
# over model.parameters()).  parplan's count is short by exactly what the spec's source says is not counted:
# MiniMax-M2's q/k norms over all heads' width (48 + 8 heads of 128 a layer; its router's correction bias is a buffer,
# in neither count), OLMoE's q/k norms (2048 + 16 x 128 a layer), Phi-3.5-MoE's LayerNorm biases (2 h a layer + h),
# q/k/v/o biases and output bias, Hunyuan's per-head q/k norms (2 x 128 a layer); Granite's MoE is exact (its
# multipliers are scalars).
# Columns: the config file, transformers' count, parplan's count less it, a phrase of the source, then experts, top-k,
# shared_expert_ffn, first_dense_layers.
MOE_BUILT = [
    ("MiniMax-M2.5", 228_689_748_992, -62 * (48 + 8) * 128, "q/k norms' weights over all heads' width", 256, 8, None, None),
    ("OLMoE-1B-7B-0924", 6_919_161_856, -16 * (2048 + 16 * 128), "q/k norms' weights (h + kv width a layer) not counted", 64, 8,
     None, None),
    ("Phi-3.5-MoE-instruct", 41_873_153_344, -(32 * 2 * 4096 + 4096) - 32 * (4096 + 1024 + 1024 + 4096) - 32064,
     "their biases not counted (2 h a layer + h)", 16, 2, None, None),
    ("granite-3.1-3b-a800m-instruct", 3_298_793_472, 0, "exact", 40, 8, None, None),
    ("Hunyuan-A13B-Instruct", 80_393_183_232, -32 * 2 * 128, "per-head q/k norms' weights (2 x head_dim a layer) not counted",
     64, 8, 3072, None),
]


@pytest.mark.parametrize("name,built,parplan_more,said,experts,top_k,shared,dense", MOE_BUILT,
                         ids=[row[0] for row in MOE_BUILT])
def test_moe_families_count_what_transformers_builds_but_what_they_say(name, built, parplan_more, said, experts, top_k,
                                                                         shared, dense):
    from cost_models.params import param_counts
    spec = model_from_hf_config(DATA / f"{name}.json")
    assert spec.num_params - built == parplan_more
    assert said in spec.source or said == "exact"
    assert (spec.arch, spec.experts, spec.experts_per_token, spec.shared_expert_ffn, spec.first_dense_layers,
            spec.moe_layer_step) == ("llama", experts, top_k, shared, dense, None)
    assert param_counts(spec)["total"] == spec.num_params and spec.name == name


def test_moe_families_shapes_and_what_their_sources_say():
    """The shapes as their configs give them (MiniMax-M2's head_dim 128 over 48 heads of hidden 3072, its rotary_dim 64
    of 128 and three MTP modules said; Phi-3.5-MoE's window over every layer, said past it), and a token's parameters
    as the cards count them: Phi-3.5-MoE 6.6B active, OLMoE 1.3B, Hunyuan-A13B 13B (12.75B)."""
    from cost_models.params import param_counts
    m2 = model_from_hf_config(DATA / "MiniMax-M2.5.json")
    assert (m2.layers, m2.hidden, m2.heads, m2.kv_heads, m2.head_dim, m2.ffn_hidden, m2.vocab) == \
        (62, 3072, 48, 8, 128, 1536, 200064)
    assert m2.rope_theta == 5000000 and not m2.tied_embeddings and "context 196608" in m2.source
    for phrase in ("costed as softmax top-k", "partial_rotary_factor 0.5", "num_mtp_modules 3) not counted",
                   "--mtp-layers 3"):
        assert phrase in m2.source, phrase
    assert "quantization_config (fp8)" in model_from_hf_config(
        {**_cfg("MiniMax-M2.5"), "quantization_config": {"quant_method": "fp8"}}).source
    phi = model_from_hf_config(DATA / "Phi-3.5-MoE-instruct.json", seq_len=262144)
    assert (phi.sliding_window, phi.full_attention_every) == (131072, None)
    assert "all layers attend within a 131072-token window" in phi.source
    assert "lm_head_bias" in phi.source and "attention_bias not counted" in phi.source
    active = {name: param_counts(model_from_hf_config(DATA / f"{name}.json")) for name in
              ("Phi-3.5-MoE-instruct", "OLMoE-1B-7B-0924", "Hunyuan-A13B-Instruct")}
    assert round(active["Phi-3.5-MoE-instruct"]["active"] / 1e9, 1) == 6.6
    assert round(active["OLMoE-1B-7B-0924"]["active"] / 1e9, 1) == 1.3
    assert round(active["Hunyuan-A13B-Instruct"]["active"] / 1e9) == 13
    hunyuan = model_from_hf_config(DATA / "Hunyuan-A13B-Instruct.json")
    assert hunyuan.tied_embeddings and "rope_scaling (dynamic)" in hunyuan.source
    clipped = model_from_hf_config({**_cfg("OLMoE-1B-7B-0924"), "clip_qkv": 8.0})
    assert "clip_qkv 8.0: q, k and v clamped" in clipped.source


def test_granitemoeshared_reads_its_shared_mlp():
    """GraniteMoeShared's shared MLP (shared_intermediate_size, 0: none) is ModelSpec's shared expert.  No released
    granitemoeshared config was found, so Granite 3.1 3B-A800M's shape with a 1024-wide shared MLP: 3,449,788,416 as
    transformers 5.25.0 builds it, parplan's count exactly."""
    cfg = {**_cfg("granite-3.1-3b-a800m-instruct"), "model_type": "granitemoeshared", "shared_intermediate_size": 1024}
    spec = model_from_hf_config(cfg)
    assert spec.shared_expert_ffn == 1024 and spec.num_params == 3_449_788_416
    assert model_from_hf_config({**cfg, "shared_intermediate_size": 0}).num_params == 3_298_793_472


@pytest.mark.parametrize("name", [row[0] for row in MOE_BUILT])
def test_moe_families_are_recommended_under_megatron(name, capsys):
    """recommend --model-config plans each under --framework megatron (a mixture of experts' framework), with expert
    parallelism."""
    from planner.cli import main
    rc = main(["recommend", "--model-config", str(DATA / f"{name}.json"), "--gpus", "64", "--framework", "megatron",
               "--seq-len", "4096", "--json", "--top", "1"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    plan = json.loads(out)
    assert plan["model"]["experts"] == dict((r[0], r[4]) for r in MOE_BUILT)[name] and plan["parallel"]["ep"] > 1
    assert plan["prediction"]["step_time_s"] > 0


@pytest.mark.parametrize("edit,match", [
    ({"model_type": "minimax_m2", "attn_type_list": [0] + [1] * 61},
     r"attn_type_list marks 1 of 62 layers 0, linear \(lightning\) attention, which parplan does not plan"),
    ({"model_type": "minimax_m2", "shared_intermediate_size": 1536},
     r"shared_intermediate_size 1536: a shared expert, which transformers' MiniMaxM2 does not build"),
    ({"model_type": "hunyuan_v1_moe", "moe_topk": [8] * 31 + [4]}, r"moe_topk \[8, 8, .*: a different value a layer"),
    ({"model_type": "hunyuan_v1_moe", "moe_intermediate_size": [1536] * 32},
     r"moe_intermediate_size \[1536, .*: other than every layer's 3072"),
    ({"model_type": "hunyuan_v1_moe", "num_shared_expert": 2}, r"num_shared_expert 2: other than every layer's 1"),
    ({"model_type": "hunyuan_v1_moe", "use_cla": True}, r"use_cla true: cross-layer attention"),
    ({"model_type": "minimax", "num_local_experts": 32},
     r"does not read \(model_type minimax: MiniMax-Text-01's and MiniMax-M1's lightning \(linear\) attention"),
    ({"model_type": "granitemoehybrid", "num_local_experts": 64},
     r"\(model_type granitemoehybrid: Granite 4.0's Mamba-2"),
])
def test_what_the_new_moe_families_cannot_plan_is_refused_in_one_line(edit, match):
    """What ModelSpec cannot say is refused in one line naming the key: MiniMax's lightning-attention layers (M1's,
    Text-01's) and a shared expert transformers' MiniMaxM2 does not build; Hunyuan's per-layer top-k, expert widths or
    shared experts other than HunYuanMoEV1's, and its cross-layer attention; the families MOE_REFUSED names, with the
    reason."""
    base = _cfg("MiniMax-M2.5" if edit["model_type"] != "hunyuan_v1_moe" else "Hunyuan-A13B-Instruct")
    with pytest.raises(ValueError, match=match) as e:
        model_from_hf_config({**base, **edit})
    assert "\n" not in str(e.value)


def test_hub_names_of_the_new_moe_families_are_fetched_and_minimax_m1_refused(tmp_path, monkeypatch):
    """A MiniMax-M2, OLMoE, Phi-3.5-MoE, Granite MoE or Hunyuan-A13B hub name missing from the cache is told how to
    fetch its config (read now); MiniMax-M1's (lightning attention) is told there is no plan for it."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    for name in ("MiniMaxAI/MiniMax-M2", "MiniMaxAI/MiniMax-M2.1", "allenai/OLMoE-1B-7B-0924",
                 "microsoft/Phi-3.5-MoE-instruct", "ibm-granite/granite-3.1-3b-a800m-instruct",
                 "tencent/Hunyuan-A13B-Instruct"):
        with pytest.raises(ValueError, match="is neither a file nor in the Hugging Face cache"):
            model_from_hf_config(name)
    with pytest.raises(ValueError, match="a mixture-of-experts model by its name; parplan plans .*MiniMax-M2's"):
        model_from_hf_config("MiniMaxAI/MiniMax-M1-80k")


def test_q_k_norms_are_read_from_the_family_or_its_switch():
    """ModelSpec.qk_norm: set where the family always norms q and k (Qwen3, Gemma 3, OLMo 2 / 3, OLMoE, ...) or its
    config switches them on (GLM-4.5's use_qk_norm, which GLM-4.5-Air sets false; Llama 4's, true by default;
    StableLM's qk_layernorm); a family without them, or the switch off, leaves it None.  A model with them plans
    more activation memory than the same shape without, under every framework (parplan's runtime builds them too; under
    its selective recompute they save nothing more)."""
    from planner.hf_config import QK_NORM, has_qk_norm
    assert has_qk_norm({}, "qwen3") and has_qk_norm({}, "gemma3_text") and has_qk_norm({}, "olmoe")
    assert has_qk_norm({"use_qk_norm": True}, "glm4_moe") and not has_qk_norm({"use_qk_norm": False}, "glm4_moe")
    assert not has_qk_norm({}, "glm4_moe") and has_qk_norm({}, "llama4_text")
    assert not has_qk_norm({"use_qk_norm": "true"}, "cohere")  # only a JSON true switches them on
    assert has_qk_norm({"qk_layernorm": True}, "stablelm") and not has_qk_norm({}, "llama") and "llama" not in QK_NORM
    base = {"model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16,
            "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 28, "vocab_size": 151936}
    qwen3, llama = model_from_hf_config(base), model_from_hf_config({**base, "model_type": "llama"})
    assert qwen3.qk_norm is True and llama.qk_norm is None and qwen3.num_params == llama.num_params
    from cost_models.layout import Layout
    from cost_models.memory import activation_bytes_per_layer
    from planner.core import model_dims
    lay = Layout(gpus=1, tp=1, pp=1, dp=1, cp=1, vpp=1, mbs=1, zero=0, recompute=0, sp=0, schedule=1, offload=0)

    def act(spec, framework):
        return float(activation_bytes_per_layer(model_dims(spec, 4096, framework), lay, 2, True))
    # 28 layers aside: per block and token, the q (2048) and k (1024) widths in bf16 and 24 heads' fp32 rstd
    assert act(qwen3, "torchtitan") - act(llama, "torchtitan") == 4096 * (2 * (2048 + 1024) + 4 * 24)
    assert act(qwen3, "megatron") - act(llama, "megatron") == 4096 * (2 * (2048 + 1024) + 4 * 24)
    assert act(qwen3, "parplan") - act(llama, "parplan") == 4096 * (2 * (2048 + 1024) + 4 * 24)
    lay = Layout(gpus=1, tp=1, pp=1, dp=1, cp=1, vpp=1, mbs=1, zero=0, recompute=1, sp=0, schedule=1, offload=0)
    assert act(qwen3, "parplan") == act(llama, "parplan") < act(qwen3, "megatron")


def test_qk_norm_flags_switch_the_norms_beside_any_model():
    """`--qk-norm` adds q/k norms to a model without them (its plan saves more under torchtitan) and is written to the
    plan and Megatron's export; `--no-qk-norm` takes a Qwen3 preset's away; with latent attention it is one line's
    error."""
    import json
    import subprocess
    import sys

    def run(*args, stdin=None):
        return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True, input=stdin)
    pin = ["--gpus", "8", "--framework", "megatron", "--tp", "1", "--pp", "1", "--cp", "1", "--mbs", "1", "--zero", "3",
           "--recompute", "none",
           "--seq-len", "4096", "--global-batch-size", "64", "--json"]
    acts = {}
    for model, flag in (("llama3-8b", None), ("llama3-8b", "--qk-norm"), ("qwen3-8b", None), ("qwen3-8b", "--no-qk-norm")):
        out = run("recommend", "--model", model, *pin, *([flag] if flag else []))
        assert out.returncode == 0, out.stderr
        plan = json.loads(out.stdout)
        assert plan["model"]["qk_norm"] is ((flag == "--qk-norm") or (model == "qwen3-8b" and flag is None) or None)
        acts[model, flag] = plan["prediction"]["memory_bytes_per_gpu"]["activations"]
        exported = run("export", "-", "--to", "megatron", stdin=out.stdout)
        written = any(line.strip().startswith("--qk-layernorm") for line in exported.stdout.splitlines())
        assert exported.returncode == 0 and written is bool(plan["model"]["qk_norm"])
    assert acts["llama3-8b", "--qk-norm"] > acts["llama3-8b", None]
    assert acts["qwen3-8b", "--no-qk-norm"] < acts["qwen3-8b", None]
    bad = run("recommend", "--model", "deepseek-v2-lite", "--gpus", "16", "--qk-norm")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "latent" in bad.stderr


def test_post_norms_are_read_from_the_family_and_switched_by_flags():
    """ModelSpec.post_norms: Gemma 2 / 3 and GLM-4 norm each sublayer's output before its residual add (four norms a
    block); OLMo 2, whose two norms sit after the sublayers instead, and GLM-4.5 (two norms) do not.  Their weights
    are in num_params, their activations counted under every framework (parplan's runtime builds them too).  The
    flags switch them beside any model, the plan carries the field, and every export says its model has none."""
    import json
    import subprocess
    import sys
    from planner.hf_config import POST_NORMS
    base = {"hidden_size": 2304, "intermediate_size": 9216, "num_attention_heads": 8, "num_key_value_heads": 4,
            "head_dim": 256, "num_hidden_layers": 26, "vocab_size": 256000}
    specs = {t: model_from_hf_config({**base, "model_type": t}) for t in ("gemma2", "gemma3_text", "glm4", "olmo2",
                                                                          "gemma", "llama")}
    assert [t for t, sp in specs.items() if sp.post_norms] == ["gemma2", "gemma3_text", "glm4"] == list(POST_NORMS)
    assert specs["gemma2"].num_params - specs["gemma"].num_params == 26 * 2 * 2304  # their weights
    from cost_models.layout import Layout
    from cost_models.memory import activation_bytes_per_layer
    from planner.core import model_dims
    lay = Layout(gpus=1, tp=1, pp=1, dp=1, cp=1, vpp=1, mbs=1, zero=0, recompute=0, sp=0, schedule=1, offload=0)

    def act(spec, framework):
        return float(activation_bytes_per_layer(model_dims(spec, 4096, framework), lay, 2, True))
    # per block and token: the two sublayers' outputs in bf16 and two fp32 rstd
    assert act(specs["gemma2"], "megatron") - act(specs["gemma"], "megatron") == 4096 * (2 * 2 * 2304 + 2 * 4)
    # parplan's runtime builds them too: the same count
    assert act(specs["gemma2"], "parplan") - act(specs["gemma"], "parplan") == 4096 * (2 * 2 * 2304 + 2 * 4)

    def run(*args, stdin=None):
        return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True, input=stdin)
    pin = ["--gpus", "8", "--framework", "megatron", "--tp", "1", "--pp", "1", "--cp", "1", "--mbs", "1", "--zero", "3",
           "--recompute", "none", "--seq-len", "4096", "--global-batch-size", "64", "--json"]
    plans = {}
    for flag in (None, "--post-norms", "--no-post-norms"):
        out = run("recommend", "--model", "llama3-8b", *pin, *([flag] if flag else []))
        assert out.returncode == 0, out.stderr
        plans[flag] = json.loads(out.stdout)
        assert plans[flag]["model"]["post_norms"] is (True if flag == "--post-norms" else None)
    mem = {f: p["prediction"]["memory_bytes_per_gpu"]["activations"] for f, p in plans.items()}
    assert mem["--post-norms"] > mem[None] == mem["--no-post-norms"]
    for to in ("megatron", "torchtitan"):
        noted = run("export", "-", "--to", to, stdin=json.dumps(plans["--post-norms"]))
        assert noted.returncode == 0 and "post_norms:" in noted.stderr, noted.stderr
        plain = run("export", "-", "--to", to, stdin=json.dumps(plans[None]))
        assert plain.returncode == 0 and "post_norms:" not in plain.stderr


@pytest.mark.parametrize("preset,config,published_extra", [
    ("gemma-2-9b", {"model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336, "num_attention_heads": 16,
                    "num_key_value_heads": 8, "head_dim": 256, "num_hidden_layers": 42, "vocab_size": 256000,
                    "sliding_window": 4096}, 0),
    ("gemma-2-27b", {"model_type": "gemma2", "hidden_size": 4608, "intermediate_size": 36864, "num_attention_heads": 32,
                     "num_key_value_heads": 16, "head_dim": 128, "num_hidden_layers": 46, "vocab_size": 256000,
                     "sliding_window": 4096}, 0),
    ("gemma-3-27b", {"model_type": "gemma3_text", "hidden_size": 5376, "intermediate_size": 21504,
                     "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128, "num_hidden_layers": 62,
                     "vocab_size": 262208, "sliding_window": 1024, "sliding_window_pattern": 6,
                     "rope_theta": 1000000.0}, None),
    ("glm-4-9b", TRANSFORMERS_BUILT[[c["model_type"] for c, *_ in TRANSFORMERS_BUILT].index("glm4")][0],
     0),  # (its q/k/v biases counted: qkv_bias)
])
def test_gemma_and_glm4_presets_are_their_configs(preset, config, published_extra):
    """The Gemma 2 / 3 and GLM-4 presets hold what their configs read to (shape, windows, q/k norms and post-norms,
    the count); Gemma 2's published totals (its report's Table 2) are the count exactly, and GLM-4's (transformers'
    build) too, its q/k/v biases counted (qkv_bias)."""
    from planner.models import load_preset, preset_published_params
    spec, read = load_preset(preset), model_from_hf_config(config)
    keys = ("arch", "layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden", "vocab", "tied_embeddings",
            "sliding_window", "full_attention_every", "qk_norm", "post_norms", "qkv_bias", "num_params")
    assert {k: getattr(spec, k) for k in keys} == {k: getattr(read, k) for k in keys}
    assert spec.post_norms is True
    if published_extra is not None:
        assert preset_published_params(preset) - spec.num_params == published_extra


def test_the_model_line_says_whether_the_extra_norms_are_counted():
    """A plan of a model with q/k norms and post-norms says on its model line that it counts them, under parplan's
    runtime (which builds both) as under another framework; a model without them says nothing."""
    from planner.core import recommend
    from planner.render import summary_lines

    def model_line(name, framework):
        plan = recommend(name, 16, framework=framework, global_batch_size=64, seq_len=4096, top_k=1, suggest=False)
        return next(s for s in summary_lines(plan) if s.startswith("model "))
    assert model_line("gemma-3-27b", "parplan").endswith("; q/k norms and post-norms counted")
    assert model_line("gemma-2-9b", "parplan").endswith("; post-norms counted")
    assert model_line("gemma-3-27b", "megatron").endswith("; q/k norms and post-norms counted")
    assert model_line("qwen3-8b", "torchtitan").endswith("; q/k norms counted")
    assert "norms" not in model_line("llama3-8b", "megatron")


def test_whole_width_q_k_norms_are_read_from_the_family_and_counted():
    """ModelSpec.qk_norm_whole: OLMo 2 / 3, OLMoE and MiniMax-M2 norm a token's whole query and key widths (transformers'
    q_norm of heads x head_dim), Qwen3 each head.  Over tensor-parallel ranks such a norm keeps one set of statistics a
    token (not a head's), and all-reduces them over tp once forward and once backward (parplan's _WholeWidthNorms: q's
    and k's together), once more where the forward re-runs: full recompute, and parplan's selective recompute, whose
    checkpoint holds the norms (Megatron's does not).  On one rank nothing is reduced."""
    from planner.core import recommend
    from planner.hf_config import QK_NORM, QK_NORM_WHOLE
    from planner.search import Pins
    assert all(QK_NORM.get(family) for family in QK_NORM_WHOLE)
    base = {"hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16, "num_key_value_heads": 8,
            "head_dim": 64, "num_hidden_layers": 8, "vocab_size": 32000}
    olmo2, qwen3 = (model_from_hf_config({**base, "model_type": t}) for t in ("olmo2", "qwen3"))
    assert olmo2.qk_norm and olmo2.qk_norm_whole and qwen3.qk_norm and qwen3.qk_norm_whole is None
    # (OLMo 2's two norms sit on the sublayers' outputs: norms_after, the same count)
    assert olmo2.norms_after and qwen3.norms_after is None and olmo2.num_params == qwen3.num_params
    per_head = olmo2.model_copy(update={"qk_norm_whole": None})

    def plan(spec, tp, recompute, framework="parplan"):
        return recommend(spec, gpus=tp, seq_len=2048, global_batch_size=8, framework=framework, suggest=False,
                         pins=Pins(tp=tp, pp=1, dp=1, cp=1, mbs=1, zero=0, recompute=recompute, offload="none",
                                   sp=False)).prediction

    def added_tp_comm(tp, recompute, framework="parplan"):
        return (plan(olmo2, tp, recompute, framework).time_breakdown.tp_comm_s
                - plan(per_head, tp, recompute, framework).time_breakdown.tp_comm_s)
    assert added_tp_comm(1, "none") == 0
    forward_and_backward = added_tp_comm(2, "none")
    assert forward_and_backward > 0
    assert added_tp_comm(2, "full") == pytest.approx(1.5 * forward_and_backward)
    assert added_tp_comm(2, "selective") == pytest.approx(1.5 * forward_and_backward)
    assert added_tp_comm(2, "selective", "megatron") == pytest.approx(forward_and_backward)
    # statistics a token and block: 2 fp32 (one a norm) against one a head on the rank, (16 + 8) / 2
    saved = {s.qk_norm_whole: plan(s, 2, "none").memory_bytes_per_gpu.activations for s in (olmo2, per_head)}
    assert saved[None] - saved[True] == 8 * 2048 * 4 * (24 / 2 - 2)


def test_qk_norm_whole_flags_and_their_errors():
    """`--qk-norm-whole` turns on q/k norms over the whole widths (the model line says so), `--qk-norm-per-head` per
    head; either beside `--no-qk-norm`, or a model with latent attention, is one line's error, as `--norms-after` beside
    post-norms or experts is, and the schema refuses qk_norm_whole without qk_norm."""
    import json
    import subprocess
    import sys

    from planner.schema import ModelSpec

    def run(*args):
        return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True)
    pins = ["--gpus", "8", "--tp", "2", "--pp", "1", "--mbs", "1", "--zero", "1", "--recompute", "none"]
    whole = run("recommend", "--model", "llama3-8b", *pins, "--qk-norm-whole", "--json")
    per_head = run("recommend", "--model", "llama3-8b", *pins, "--qk-norm-per-head", "--json")
    assert whole.returncode == per_head.returncode == 0, whole.stderr + per_head.stderr
    w, p = json.loads(whole.stdout)["model"], json.loads(per_head.stdout)["model"]
    assert (w["qk_norm"], w["qk_norm_whole"], p["qk_norm"], p["qk_norm_whole"]) == (True, True, True, None)
    table = run("recommend", "--model", "llama3-8b", *pins, "--qk-norm-whole", "--top", "1")
    assert table.returncode == 0 and "q/k norms over the whole width counted" in table.stdout
    for bad in (["--model", "llama3-8b", "--qk-norm-whole", "--no-qk-norm"],
                ["--model", "deepseek-v2-lite", "--gpus", "16", "--qk-norm-whole"],
                ["--model", "gemma-2-9b", "--norms-after"], ["--model", "mixtral-8x7b", "--norms-after"]):
        out = run("recommend", *(["--gpus", "8"] if "--gpus" not in bad else []), *bad)
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    with pytest.raises(ValueError, match="needs qk_norm"):
        ModelSpec(arch="llama", layers=2, hidden=64, heads=4, kv_heads=2, ffn_hidden=128, vocab=256, qk_norm_whole=True)
    shape = dict(arch="llama", layers=2, hidden=64, heads=4, kv_heads=2, ffn_hidden=128, vocab=256, norms_after=True)
    with pytest.raises(ValueError, match="give one of them"):
        ModelSpec(**shape, post_norms=True)
    with pytest.raises(ValueError, match="not planned"):
        ModelSpec(**shape, experts=4, experts_per_token=2)


def test_exports_say_what_they_build_of_olmo2s_norms():
    """An OLMo 2 plan (whole-width q/k norms, norms after the sublayers) exported: Megatron-LM writes --qk-layernorm,
    per head, and says so; torchtitan's model has per-head norms or none, and says so; every export says its model puts
    the two norms on the sublayers' inputs."""
    from planner.core import recommend
    from planner.export import export_notes, export_plan
    from planner.search import Pins
    olmo2 = model_from_hf_config({"model_type": "olmo2", "hidden_size": 1024, "intermediate_size": 2816,
                                  "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 8,
                                  "vocab_size": 32000})
    plan = recommend(olmo2, gpus=8, seq_len=2048, global_batch_size=64, suggest=False,
                     pins=Pins(tp=2, pp=1, cp=1, mbs=1, zero=1, recompute="none", offload="none"))
    for to, says in (("megatron", "--qk-layernorm normalises each head"), ("torchtitan", "qwen3 normalises each head")):
        notes = export_notes(plan, to)
        assert any(says in n for n in notes) and any(n.startswith("norms_after:") for n in notes), (to, notes)
    assert "--qk-layernorm" in export_plan(plan, "megatron")
