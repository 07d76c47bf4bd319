"""Model presets, explicit flags and shapes derived from a bare parameter count."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from planner.models import (list_presets, load_preset, model_from_flags, model_from_params,
                            preset_published_params, swiglu_ffn)

ROOT = Path(__file__).resolve().parent.parent

# Published totals, written here independently of planner/data/models.toml:
#   Llama 2 paper / HF checkpoints: 7B 6.74B, 13B 13.0B, 70B 68.98B
#   Llama 3.1 model cards: 8.03B, 70.55B, 405.85B (Llama 3 Herd of Models, Table 3 shapes)
#   Mistral 7B 7.24B, Qwen2.5-7B 7.61B, Qwen2.5-72B 72.7B (Qwen2.5 report Table 1)
#   Qwen3 model cards: 8B 8.2B (6.95B without embeddings), 14B 14.8B (13.2B), 32B 32.8B (31.2B)
#   GPT-3 175B (Brown et al. 2020, Table 2.1), GPT-2 124M (released checkpoint)
PUBLISHED = {
    "llama2-7b": 6.74e9, "llama2-13b": 13.0e9, "llama2-70b": 68.98e9,
    "llama3-8b": 8.03e9, "llama3-70b": 70.55e9, "llama3-405b": 405.85e9,
    "mistral-7b": 7.24e9, "qwen2.5-7b": 7.61e9, "qwen2.5-72b": 72.7e9,
    "qwen3-8b": 8.2e9, "qwen3-14b": 14.8e9, "qwen3-32b": 32.8e9,
    "gpt3-175b": 175e9, "gpt2": 124.4e6,
}


@pytest.mark.parametrize("name,published", sorted(PUBLISHED.items()))
def test_preset_count_matches_published(name, published):
    spec = load_preset(name)
    assert spec.num_params == pytest.approx(published, rel=0.005)


@pytest.mark.parametrize("name", [n for n in list_presets() if preset_published_params(n)])
def test_every_preset_with_a_published_count_matches_it(name):
    spec = load_preset(name)
    assert spec.num_params == pytest.approx(preset_published_params(name), rel=0.005)
    assert spec.source, "every preset names its source"


def test_qwen_counts_its_bias():
    """Qwen2's q/k/v biases are in the preset (ModelSpec.qkv_bias): the checkpoint's 7,615,616,512, of which 28 layers x
    (3584 + 512 + 512) are bias entries, is the count to the parameter."""
    spec = load_preset("qwen2.5-7b")
    assert spec.qkv_bias and spec.num_params == 7_615_616_512


def test_gpt3_reproduces_narayanan_eq2():
    """GPT-3 175B: Narayanan 2021 eq. 2 with l=96, h=12288, V=50257, s=2048 (+ final LayerNorm 2h)."""
    from cost_models.params import narayanan_eq2
    spec = load_preset("gpt3-175b")
    assert spec.num_params == pytest.approx(narayanan_eq2(96, 12288, 50257, 2048) + 2 * 12288, rel=1e-9)


def test_llama3_70b_by_hand():
    # per layer: q,o 2*8192^2 + k,v 2*8192*1024 + SwiGLU 3*8192*28672 + 2 norms 2*8192
    per_layer = 2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192
    total = 80 * per_layer + 2 * 128256 * 8192 + 8192
    assert load_preset("llama3-70b").num_params == total == 70_553_706_496


def test_unknown_preset_lists_names_and_suggests():
    with pytest.raises(ValueError) as e:
        load_preset("llama3-7b")
    msg = str(e.value)
    assert "Did you mean 'llama3-70b', 'llama3-8b' or 'llama2-7b'?" in msg
    assert "mistral-7b" in msg and "gpt3-175b" in msg
    with pytest.raises(ValueError, match="Did you mean 'gpt3-175b'"):  # a name the preset's begins with, first
        load_preset("gpt3")
    with pytest.raises(ValueError) as e:
        load_preset("xyz")
    assert "Did you mean" not in str(e.value)


def test_a_mixture_of_experts_name_is_told_why_it_has_no_plan():
    """An MoE model's name (a preset name or a Hub id) is no typo of a dense preset: the error says parplan plans
    dense models only, where it had offered mistral-7b for Mixtral and --model-config for a config it would refuse."""
    from planner.models import mixture_of_experts_name
    moe = ["mixtral-8x7b", "mistralai/Mixtral-8x22B-Instruct-v0.1", "deepseek-v3", "deepseek-ai/DeepSeek-R1",
           "DeepSeek-V2-Lite", "Qwen/Qwen3-30B-A3B", "Qwen3-235B-A22B-Instruct-2507", "Qwen1.5-MoE-A2.7B",
           "Qwen2-57B-A14B", "openai/gpt-oss-120b", "meta-llama/Llama-4-Scout-17B-16E", "llama4-maverick",
           "databricks/dbrx-base", "allenai/OLMoE-1B-7B-0924", "xai-org/grok-1", "Snowflake/snowflake-arctic-base",
           "ai21labs/Jamba-v0.1", "microsoft/Phi-3.5-MoE-instruct", "ibm-granite/granite-3.0-3b-a800m-base",
           "moonshotai/Kimi-K2-Instruct", "zai-org/GLM-4.5", "MiniMaxAI/MiniMax-M1-80k", "tencent/Hunyuan-A13B-Instruct"]
    dense = ["llama3-70b", "meta-llama/Llama-3.1-8B", "deepseek-ai/DeepSeek-R1-Distill-Llama-70B",
             "deepseek-ai/deepseek-llm-67b-base", "Qwen/Qwen3-8B", "qwen2.5-72b", "mistral-7b", "gpt3-175b",
             "THUDM/glm-4-9b", "google/gemma-2-9b", "microsoft/Phi-3-mini-4k-instruct", "tiiuae/falcon-40b",
             "allenai/OLMo-2-1124-13B", "llama3-7b", "ibm-granite/granite-3.1-8b-base", "mosaicml/mpt-30b", "LLM360/K2",
             "nvidia/Nemotron-4-340B-Base", "Qwen/Qwen2.5-VL-7B-Instruct", "mt-nlg-530b"]
    assert [n for n in moe if not mixture_of_experts_name(n)] == [] and [n for n in dense if mixture_of_experts_name(n)] == []
    with pytest.raises(ValueError) as e:
        load_preset("databricks/dbrx-base")  # (DeepSeek-V3's and gpt-oss's names are presets since they are planned)
    msg = str(e.value)
    # told which mixtures of experts it plans (since the twenty-fourth session: Mixtral and Qwen3-MoE), not a dense
    # preset's name or a config download it would refuse
    assert msg.startswith("'databricks/dbrx-base' is a mixture-of-experts model parplan has no preset for")
    assert "Did you mean" not in msg and "huggingface-cli" not in msg and "llama3-70b" not in msg
    assert "mixtral-8x7b" in msg and "qwen3-235b-a22b" in msg
    # ...and the ones it plans load, by their Hugging Face names too
    assert load_preset("mistralai/Mixtral-8x7B-v0.1").experts == 8
    assert load_preset("Qwen/Qwen3-30B-A3B").experts_per_token == 8
    assert load_preset("openai/gpt-oss-120b").experts == 128


def test_a_hub_id_is_told_where_its_config_is_read():
    """meta-llama/Meta-Llama-3-8B is no preset: --model-config reads a hub name's config.json from the local Hugging
    Face cache (hf_config.cached_hub_config), so the hint names that command and how to fill the cache (it had said
    to download the file and pass its path, before --model-config read the cache)."""
    with pytest.raises(ValueError) as e:
        load_preset("meta-llama/Meta-Llama-3-8B")
    msg = str(e.value)
    assert "`parplan recommend --model-config meta-llama/Meta-Llama-3-8B --gpus 8` takes it from the local Hugging " \
           "Face cache" in msg and "huggingface-cli download meta-llama/Meta-Llama-3-8B config.json" in msg
    with pytest.raises(ValueError, match="--model-config cfg/config.json --gpus 8"):  # a path keeps its own hint
        load_preset("cfg/config.json")


def test_a_preset_is_found_by_its_aliases_and_hub_names():
    """Llama 3.1's shapes are the llama3-* presets (llama3.1-70b, and Llama 3.3 70B's config is 3.1's); a model's hub
    name, any case, with its owner, an -hf suffix or an instruct / chat / base variant (the same shape), finds it.
    A name that only resembles one is still refused (Mistral-7B-v0.3 has another vocabulary than mistral-7b's)."""
    for name, preset in (("llama3.1-70b", "llama3-70b"), ("llama3.3-70b", "llama3-70b"), ("llama3.1-8b", "llama3-8b"),
                         ("Llama-3.1-405B", "llama3-405b"), ("meta-llama/Llama-3.1-8B-Instruct", "llama3-8b"),
                         ("meta-llama/Llama-2-7b-chat-hf", "llama2-7b"), ("Qwen/Qwen2.5-72B-Instruct", "qwen2.5-72b"),
                         ("Qwen/Qwen3-8B-Base", "qwen3-8b"), ("mistral-7b", "mistral-7b"), ("GPT2-Medium", "gpt2-medium")):
        assert load_preset(name).name == preset, name
    for name in ("mistralai/Mistral-7B-v0.3", "meta-llama/Llama-3.1-8B/extra", "llama3.1-7b"):
        with pytest.raises(ValueError, match="unknown model preset"):
            load_preset(name)


def test_preset_lookup_is_case_insensitive():
    assert load_preset("Llama3-8B").name == "llama3-8b"


def test_tiny_test_shape_is_valid_for_tp():
    spec = load_preset("tiny-llama-test")
    assert spec.heads % 2 == 0 and spec.kv_heads % 2 == 0 and spec.heads % spec.kv_heads == 0
    assert spec.num_params < 5e6


def test_swiglu_ffn_matches_llama():
    assert swiglu_ffn(4096) == 11008   # LLaMA-7B / Llama-2-7B
    assert swiglu_ffn(5120) == 13824   # Llama-2-13B


@pytest.mark.parametrize("n", [70e9, 7e9, 13e9, 175e9, 405e9, 1e9])
def test_model_from_params_hits_the_count(n):
    spec, line = model_from_params(n)
    assert spec.num_params == pytest.approx(n, rel=0.05)
    assert spec.hidden % 256 == 0 and spec.heads * 128 == spec.hidden
    assert spec.heads % spec.kv_heads == 0
    assert spec.ffn_hidden == swiglu_ffn(spec.hidden)
    assert spec.source == line and "\n" not in line and f"{spec.layers} layers" in line


def test_model_from_params_70b_is_sensible():
    spec, line = model_from_params(70e9)
    assert spec.hidden == 8192 and spec.heads == 64 and spec.kv_heads == 8
    assert 70 <= spec.layers <= 110  # Llama-2-70B has 80 with a wider ffn (28672 vs 8/3 h = 22016)
    assert "LLaMA-65B" in line


def test_model_from_params_monotone():
    sizes = [1e9, 3e9, 7e9, 13e9, 30e9, 70e9, 175e9, 405e9]
    specs = [model_from_params(n)[0] for n in sizes]
    hidden = [s.hidden for s in specs]
    assert hidden == sorted(hidden)
    assert [s.num_params for s in specs] == sorted(s.num_params for s in specs)


def test_model_from_params_gpt():
    spec, _ = model_from_params(175e9, arch="gpt", vocab=50257)
    assert spec.arch == "gpt" and spec.ffn_hidden == 4 * spec.hidden and spec.tied_embeddings
    assert spec.num_params == pytest.approx(175e9, rel=0.05)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf")])
def test_model_from_params_rejects_bad_counts(bad):
    with pytest.raises(ValueError):
        model_from_params(bad)


def test_model_from_flags_defaults_and_count():
    spec = model_from_flags("llama", 32, 4096, 32, 8, 14336, 128256)
    assert spec.num_params == 8_030_261_248
    g = model_from_flags("gpt", 12, 768, 12, vocab=50257, max_seq_len=1024)
    assert g.kv_heads == 12 and g.ffn_hidden == 3072 and g.tied_embeddings
    assert g.num_params == load_preset("gpt2").num_params
    ll = model_from_flags("llama", 2, 4096, 32)
    assert ll.ffn_hidden == 11008 and ll.kv_heads == 32 and not ll.tied_embeddings
    assert model_from_flags("llama", 2, 256, 2, None, None, None).vocab == 32000  # CLI passes None for unset flags


def test_model_from_flags_bad_shape_is_one_line():
    with pytest.raises(ValueError) as e:
        model_from_flags("llama", 2, 4096, 32, kv_heads=5)
    assert "kv_heads" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="arch"):
        model_from_flags("mamba", 2, 64, 2)


def test_models_module_imports_fast_without_torch():
    code = "import sys, planner.models as m; m.load_preset('llama3-8b'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("name,non_embedding", [("qwen3-8b", 6.95e9), ("qwen3-14b", 13.2e9), ("qwen3-32b", 31.2e9)])
def test_qwen3_head_dim_is_not_hidden_over_heads(name, non_embedding):
    """Qwen3's head_dim is 128 whatever the width (32B: 64 heads x 128 = 8192 > hidden 5120), so the
    attention projections are hidden x 8192: the model cards' counts without embeddings check it."""
    spec = load_preset(name)
    assert spec.head_dim == 128
    embeddings = spec.vocab * spec.hidden * (1 if spec.tied_embeddings else 2)
    assert spec.num_params - embeddings == pytest.approx(non_embedding, rel=0.005)
