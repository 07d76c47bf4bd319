"""Baidu's ERNIE 4.5 from its Hugging Face configs (model_type ernie4_5_moe: ERNIE-4.5-21B-A3B and -300B-A47B;
ernie4_5: ERNIE-4.5-0.3B) and as presets: which blocks are MoE, the shared expert's width, the class defaults a file
leaves out, the counts against the model cards', and the vision-language models refused."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cost_models.params import param_counts
from planner.hf_config import cached_hub_config, model_from_hf_config
from planner.models import load_preset

# The released configs' shape keys (baidu/ERNIE-4.5-21B-A3B-PT and -300B-A47B-PT config.json, model_type ernie4_5_moe;
# the 21B's are transformers' Ernie4_5_MoeConfig defaults too, src/transformers/models/ernie4_5_moe/
# configuration_ernie4_5_moe.py; the 300B's MoE keys as in PaddlePaddle/ERNIE's examples/pre-training/model_configs/
# ERNIE-4p5-300B-A47B/model_config.json: 64 experts of 3584, top 8, no shared expert, MoE from layer 3)
A3B = {"architectures": ["Ernie4_5_MoeForCausalLM"], "model_type": "ernie4_5_moe", "hidden_size": 2560,
       "intermediate_size": 12288, "num_hidden_layers": 28, "num_attention_heads": 20, "num_key_value_heads": 4,
       "max_position_embeddings": 131072, "vocab_size": 103424, "rope_theta": 500000, "use_bias": False,
       "tie_word_embeddings": True, "moe_num_experts": 64, "moe_k": 6, "moe_intermediate_size": 1536,
       "moe_num_shared_experts": 2, "moe_layer_start_index": 1, "moe_layer_end_index": 27, "moe_layer_interval": 1}
A47B = {"architectures": ["Ernie4_5_MoeForCausalLM"], "model_type": "ernie4_5_moe", "hidden_size": 8192,
        "intermediate_size": 28672, "num_hidden_layers": 54, "num_attention_heads": 64, "num_key_value_heads": 8,
        "max_position_embeddings": 131072, "vocab_size": 103424, "rope_theta": 500000, "use_bias": False,
        "tie_word_embeddings": False, "moe_num_experts": 64, "moe_k": 8, "moe_intermediate_size": 3584,
        "moe_num_shared_experts": 0, "moe_layer_start_index": 3, "moe_layer_end_index": 53, "moe_layer_interval": 1}
# baidu/ERNIE-4.5-0.3B-PT config.json (model_type ernie4_5; transformers' Ernie4_5Config defaults, head_dim 128)
DENSE = {"architectures": ["Ernie4_5ForCausalLM"], "model_type": "ernie4_5", "hidden_size": 1024,
         "intermediate_size": 3072, "num_hidden_layers": 18, "num_attention_heads": 16, "num_key_value_heads": 2,
         "head_dim": 128, "max_position_embeddings": 131072, "vocab_size": 103424, "rope_theta": 500000,
         "use_bias": False, "tie_word_embeddings": True}
FIELDS = ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden", "experts", "experts_per_token",
          "shared_expert_ffn", "first_dense_layers", "moe_layer_step", "dense_ffn_hidden", "vocab", "tied_embeddings",
          "rope_theta", "num_params")


@pytest.mark.parametrize("cfg,preset", [(A3B, "ernie-4.5-21b-a3b"), (A47B, "ernie-4.5-300b-a47b"),
                                        (DENSE, "ernie-4.5-0.3b")], ids=["21b-a3b", "300b-a47b", "0.3b"])
def test_configs_read_as_the_presets(cfg, preset):
    spec, want = model_from_hf_config(cfg), load_preset(preset)
    for field in FIELDS:
        assert getattr(spec, field) == getattr(want, field), field
    assert "context 131072" in spec.source


@pytest.mark.parametrize("name,total,active,published", [
    # the cards: 21B total / 3B activated (a rounded figure: 21.8B counted), 300B / 47B, 0.36B; active a token's
    # parameters less the input embedding (a lookup), as the cards count it
    ("ernie-4.5-21b-a3b", 21.8, 3, 21e9), ("ernie-4.5-300b-a47b", 299.5, 47, 300e9), ("ernie-4.5-0.3b", 0.4, None, 0.36e9)])
def test_counts_against_the_model_cards(name, total, active, published):
    spec = load_preset(name)
    c = param_counts(spec)
    assert round(c["total"] / 1e9, 1) == total and c["total"] == spec.num_params
    assert active is None or round((c["active"] - c["embedding"]) / 1e9) == active
    if name != "ernie-4.5-21b-a3b":  # the others within the presets' 0.5 %
        assert spec.num_params == pytest.approx(published, rel=0.005)
    else:
        assert abs(spec.num_params / published - 1) < 0.04


def test_the_21b_count_by_hand():
    """Block 0 dense (intermediate_size 12288), blocks 1..27 64 experts of 1536, one shared MLP of 2 x 1536 and a
    router each; attention 20 heads of 128, 4 kv; tied embedding: every weight Ernie4_5_MoeForCausalLM holds but the
    routers' correction biases (64 a block).  The 0.3B: 16 heads of 128 over hidden 1024, 2 kv heads, tied."""
    h, v = 2560, 103424
    attn = 2 * h * h + 2 * h * 512
    moe = 64 * 3 * h * 1536 + 3 * h * 3072 + h * 64
    total = 28 * (attn + 2 * h) + 27 * moe + 3 * h * 12288 + v * h + h
    assert load_preset("ernie-4.5-21b-a3b").num_params == model_from_hf_config(A3B).num_params == total
    dense = 18 * (2 * 1024 * 2048 + 2 * 1024 * 256 + 3 * 1024 * 3072 + 2 * 1024) + 103424 * 1024 + 1024
    assert model_from_hf_config(DENSE).num_params == dense == 360_748_032


@pytest.mark.parametrize("start,step,layers", [(0, 1, 6), (1, 1, 6), (3, 1, 8), (0, 2, 7), (1, 2, 8), (2, 3, 11)])
def test_which_blocks_are_moe(start, step, layers):
    """Ernie4_5_MoeDecoderLayer: block i MoE where (i + 1) % moe_layer_interval == 0 and moe_layer_start_index <= i <=
    moe_layer_end_index (-1 or null: the last block)."""
    base = {**A3B, "num_hidden_layers": layers, "moe_layer_start_index": start, "moe_layer_interval": step}
    rule = [(i + 1) % step == 0 and start <= i <= layers - 1 for i in range(layers)]
    for end in (-1, layers - 1, None, layers + 5):
        spec = model_from_hf_config({**base, "moe_layer_end_index": end})
        assert [spec.is_moe_block(i) for i in range(layers)] == rule, end
        assert spec.moe_block_count == sum(rule)
        assert spec.dense_ffn_hidden == (12288 if not all(rule) else None)


def test_placements_parplan_cannot_say_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"moe_layer_end_index 20: layers 21\.\.27 dense after the MoE ones") as e:
        model_from_hf_config({**A3B, "moe_layer_end_index": 20})
    assert "\n" not in str(e.value) and "set it to -1" in str(e.value)
    with pytest.raises(ValueError, match=r"moe_layer_end_index 26: layer 27 dense after"):
        model_from_hf_config({**A3B, "moe_layer_end_index": 26, "moe_layer_interval": 2})  # block 27: (27 + 1) % 2 == 0
    # an end short of the last block that leaves no MoE block behind it is the same model
    spec = model_from_hf_config({**A3B, "moe_layer_end_index": 26, "moe_layer_interval": 3})
    assert spec.moe_block_count == 9 and [i for i in range(28) if spec.is_moe_block(i)] == list(range(2, 27, 3))
    with pytest.raises(ValueError, match="leave none of the 28 layers MoE"):
        model_from_hf_config({**A3B, "moe_layer_start_index": 28})
    for key, bad in (("moe_layer_start_index", -1), ("moe_layer_interval", 0), ("moe_layer_start_index", [1, 1]),
                     ("moe_layer_end_index", "27")):
        with pytest.raises(ValueError, match=key):
            model_from_hf_config({**A3B, key: bad})


def test_class_defaults_and_aliases_fill_what_a_file_leaves_out():
    """Ernie4_5_MoeConfig's defaults (64 experts of 1536, top 6, 2 shared, block 0 dense, tied, 4 kv heads, vocab
    103424) make a file of the shape keys alone the 21B; its attribute_map's num_experts / num_experts_per_tok set
    moe_num_experts / moe_k.  Ernie4_5Config's head_dim is 128 whatever hidden / heads."""
    shape = {k: A3B[k] for k in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                                 "num_attention_heads")}
    spec = model_from_hf_config(shape)
    for field in FIELDS:
        assert getattr(spec, field) == getattr(load_preset("ernie-4.5-21b-a3b"), field), field
    aliased = model_from_hf_config({**shape, "num_experts": 32, "num_experts_per_tok": 4})
    assert (aliased.experts, aliased.experts_per_token) == (32, 4)
    assert model_from_hf_config({**shape, "num_experts": 32, "moe_num_experts": 16}).experts == 16
    dense = model_from_hf_config({k: v for k, v in DENSE.items() if k not in ("head_dim", "num_key_value_heads",
                                                                              "tie_word_embeddings")})
    assert (dense.head_dim, dense.kv_heads, dense.tied_embeddings) == (128, 2, True)


def test_shared_experts_are_one_mlp_of_their_summed_width():
    """Ernie4_5_MoeSparseMoeBlock: shared_experts = one MLP of moe_intermediate_size x moe_num_shared_experts."""
    assert model_from_hf_config({**A3B, "moe_num_shared_experts": 3}).shared_expert_ffn == 3 * 1536
    assert model_from_hf_config({**A3B, "moe_num_shared_experts": 0}).shared_expert_ffn is None
    assert model_from_hf_config(A47B).shared_expert_ffn is None


def test_notes_say_what_is_not_counted():
    spec = model_from_hf_config({**A47B, "num_nextn_predict_layers": 1, "use_bias": True})
    assert "correction bias" in spec.source and "costed as softmax top-k" in spec.source
    assert "num_nextn_predict_layers 1" in spec.source and "--mtp-layers 1" in spec.source
    assert "use_bias not counted" in spec.source
    assert "num_nextn_predict_layers" not in model_from_hf_config(A47B).source


@pytest.mark.parametrize("cfg", [
    # Baidu's ERNIE-4.5-VL files (model_type ernie4_5_moe_vl; their moe_num_experts a list: text and vision pools)
    {"model_type": "ernie4_5_moe_vl", "hidden_size": 2560, "num_hidden_layers": 28, "num_attention_heads": 20,
     "moe_num_experts": [64, 64], "moe_intermediate_size": [1536, 512], "moe_k": 6, "vocab_size": 103424},
    # transformers' Ernie4_5_VLMoeConfig (ernie4_5_vl_moe, a text_config of its own type)
    {"model_type": "ernie4_5_vl_moe", "text_config": {"model_type": "ernie4_5_vl_moe_text", "hidden_size": 2560}},
], ids=["baidu", "transformers"])
def test_the_vision_language_models_are_refused(cfg):
    with pytest.raises(ValueError, match=r"vision-language model.*heterogeneous mixture of experts") as e:
        model_from_hf_config(cfg)
    assert "\n" not in str(e.value) and "did you mean" not in str(e.value)


def test_hub_names_and_presets(tmp_path, monkeypatch):
    """A hub name reads as the preset (its -PT / -Base-PT variants the same shape); an empty hub cache asks for the
    text models' configs and refuses the vision-language ones without a fetch."""
    for name in ("baidu/ERNIE-4.5-300B-A47B-PT", "ERNIE-4.5-300B-A47B-Base-PT", "baidu/ERNIE-4.5-21B-A3B-PT",
                 "baidu/ERNIE-4.5-0.3B-PT"):
        assert load_preset(name).name.startswith("ernie-4.5-"), name
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ValueError, match="huggingface-cli download baidu/ERNIE-4.5-21B-A3B-PT config.json"):
        cached_hub_config("baidu/ERNIE-4.5-21B-A3B-PT")
    with pytest.raises(ValueError, match="so it has no plan for it"):
        cached_hub_config("baidu/ERNIE-4.5-VL-28B-A3B-PT")


def test_cli_plans_and_exports_the_21b(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(A3B))
    out = subprocess.run([sys.executable, "-m", "planner.cli", "recommend", "--model-config", str(cfg), "--gpus", "64",
                          "--framework", "megatron", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout)["model"]
    assert (m["experts"], m["first_dense_layers"], m["shared_expert_ffn"]) == (64, 1, 3072)
    exp = subprocess.run([sys.executable, "-m", "planner.cli", "export", "-", "--to", "megatron"], input=out.stdout,
                         capture_output=True, text=True, timeout=120)
    assert exp.returncode == 0, exp.stderr
    assert "--moe-layer-freq '([0]*1+[1]*27)'" in exp.stdout and "--moe-ffn-hidden-size 1536" in exp.stdout
    assert "--moe-shared-expert-intermediate-size 3072" in exp.stdout and "--ffn-hidden-size 12288" in exp.stdout
