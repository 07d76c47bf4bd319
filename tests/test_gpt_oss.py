"""OpenAI's gpt-oss (gpt-oss-20b, gpt-oss-120b) from its Hugging Face configs (model_type gpt_oss) and as presets: the
shape read, the windowed layers, what is left out of the count (and said), and the counts against the model card's."""
from __future__ import annotations

import json

import pytest

from cost_models.params import param_counts
from planner.cli import main
from planner.hf_config import model_from_hf_config
from planner.models import load_preset

# openai/gpt-oss-120b's config.json (model_type gpt_oss), its shape keys; the 20b's differs in num_hidden_layers 24 and
# num_local_experts 32.  layer_types alternates sliding_attention, full_attention from block 0 (GptOssConfig's default
# where a file leaves it out, src/transformers/models/gpt_oss/configuration_gpt_oss.py)
KINDS = ["sliding_attention", "full_attention"]
OSS_120B = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True,
            "experts_per_token": 4, "num_experts_per_tok": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
            "initial_context_length": 4096, "intermediate_size": 2880, "layer_types": KINDS * 18,
            "max_position_embeddings": 131072, "num_attention_heads": 64, "num_hidden_layers": 36,
            "num_key_value_heads": 8, "num_local_experts": 128, "quantization_config": {"quant_method": "mxfp4"},
            "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                             "rope_type": "yarn", "truncate": False},
            "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0, "tie_word_embeddings": False,
            "vocab_size": 201088}
OSS_20B = {**{k: v for k, v in OSS_120B.items() if k != "layer_types"}, "num_hidden_layers": 24, "num_local_experts": 32}
FIELDS = ("arch", "layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden", "experts", "experts_per_token",
          "shared_expert_ffn", "first_dense_layers", "moe_layer_step", "vocab", "tied_embeddings", "rope_theta",
          "sliding_window", "full_attention_every", "num_params")


@pytest.mark.parametrize("cfg,preset", [(OSS_120B, "gpt-oss-120b"), (OSS_20B, "gpt-oss-20b")], ids=["120b", "20b"])
def test_configs_read_as_the_presets(cfg, preset):
    """The 20b's config here leaves layer_types out: the class's alternation, as the 120b's file spells it."""
    spec, want = model_from_hf_config(cfg), load_preset(preset)
    for field in FIELDS:
        assert getattr(spec, field) == getattr(want, field), field
    assert spec.windowed_layers == spec.layers // 2
    # what the checkpoint holds otherwise than the plan's blocks, said in the source
    for said in ("attention sinks", "router and experts' biases not counted", "clamped SwiGLU", "mxfp4",
                 "rope_scaling (yarn)", "context 131072"):
        assert said in spec.source, said
    assert "attention_bias not counted" not in spec.source  # (said once, in the family's own note)


def test_the_counts_by_hand_and_against_the_model_card():
    """Every weight GptOssForCausalLM holds but the biases and sinks: attention 64 query heads of 64 and 8 key/value
    heads over hidden 2880, a router (2880 x experts), the experts' fused gate_up (2880 x 2 x 2880) and down
    (2880 x 2880), two RMSNorms a block, the untied embedding and head, the final norm.  The card's 116.83B and 20.91B
    are that plus the biases and sinks (a block: q/k/v/o 4096 + 512 + 512 + 2880, sinks 64, router 1 an expert, each
    expert's 2 x 2880 + 2880), its 5.13B and 3.61B active the same less the input embedding and the unrouted experts."""
    h, v, ffn = 2880, 201088, 2880
    attn = 2 * h * 4096 + 2 * h * 512
    extra_attn, extra_expert = 4096 + 512 + 512 + h + 64, 2 * ffn + h + 1
    for name, layers, experts, total_card, active_card in (("gpt-oss-120b", 36, 128, 116.83, 5.13),
                                                            ("gpt-oss-20b", 24, 32, 20.91, 3.61)):
        spec = load_preset(name)
        block = attn + h * experts + experts * 3 * h * ffn + 2 * h
        counted = layers * block + 2 * v * h + h
        assert spec.num_params == counted == param_counts(spec)["total"]
        left_out = layers * (extra_attn + experts * extra_expert)
        assert round((counted + left_out) / 1e9, 2) == total_card
        c = param_counts(spec)
        active = c["active"] - c["embedding"] + layers * (extra_attn + 4 * (extra_expert - 1) + experts)
        assert round(active / 1e9, 2) == active_card
    # the 120b's left out: 40.1M of 116.8B (the preset's source says so)
    assert 36 * (extra_attn + 128 * extra_expert) == 40_108_032


def test_a_hub_name_and_the_windows_under_megatron(capsys, tmp_path):
    """openai/gpt-oss-120b names the preset; under Megatron-LM the banded layers train their window (--window-size
    with --window-attn-skip-freq 2, counted), elsewhere they attend over the whole prefix (counted so)."""
    assert load_preset("openai/gpt-oss-120b").num_params == load_preset("gpt-oss-120b").num_params
    runs = {}
    for framework in ("megatron", "parplan"):
        rc = main(["recommend", "--model", "openai/gpt-oss-120b", "--gpus", "64", "--framework", framework,
                   "--seq-len", "8192", "--json", "--top", "1"])
        out, err = capsys.readouterr()
        assert rc == 0, err
        runs[framework] = json.loads(out)
    meg, own = runs["megatron"], runs["parplan"]
    assert meg["model"]["sliding_window"] == 128 and meg["model"]["full_attention_every"] == 2
    assert meg["parallel"]["ep"] > 1 and own["parallel"]["ep"] > 1
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(meg))
    assert main(["export", str(path), "--to", "megatron"]) == 0
    script = capsys.readouterr().out
    assert "--window-size 127,0" in script and "--window-attn-skip-freq 2" in script and "--num-experts 128" in script
    # the flags of the real model, which the plan does not count, said in a note (not written as flags)
    note = next(line for line in script.splitlines() if line.startswith("# note: gpt-oss"))
    for flag in ("--softmax-type learnable", "--quick-geglu", "--glu-linear-offset 1.0",
                 "--activation-func-clamp-value 7.0", "--disable-bias-linear"):
        assert flag in note, flag
    assert "--softmax-type" not in script.replace(note, "")


def test_the_published_megatron_bridge_runs_are_predicted_within_ten_percent():
    """megatron_gpt_oss_h100: Megatron-Bridge's DGX-H100 gpt-oss-120b row of four releases, one layout (tp 1, pp 4,
    ep 8, micro-batch 1, GBS 1280), held out: +5.0 .. +8.3 % when this was written; every printed setting and the
    recipe's (layernorm and moe_act recompute, bf16 gradient reduction) as planned; the windowed blocks counted (with
    full attention everywhere the same plan is slower)."""
    import dataclasses

    from planner.validate import ADAPTERS, reference_dir, run_query, validate_set
    data = json.loads((reference_dir() / "megatron_gpt_oss_h100.json").read_text())
    cases = validate_set("megatron_gpt_oss_h100", data)
    assert len(cases) == 4 and all(c.predicted is not None for c in cases)
    assert all(0 < c.error < 0.10 for c in cases)
    for c in cases:
        p = c.plan
        assert (p.parallel.tp, p.parallel.pp, p.parallel.ep, p.parallel.dp, p.parallel.vpp) == (1, 4, 8, 16, 1)
        assert p.training.moe_recompute == "norm-act" and p.training.precision == "master-weights-half-grads"
        assert p.model.sliding_window == 128 and p.model.full_attention_every == 2
    q = next(iter(ADAPTERS["megatron_gpt_oss_h100"](data)))
    full = dataclasses.replace(q, spec=q.spec.model_copy(update={"sliding_window": None, "full_attention_every": None}))
    assert run_query(full).prediction.step_time_s > 1.02 * cases[0].plan.prediction.step_time_s


def test_the_export_note_is_gpt_oss_own():
    """The Megatron note with gpt-oss's own flags goes with a gpt_oss config or a gpt-oss preset, not with another
    model whose name merely mentions it (a dense llama fine-tune's config)."""
    from planner.export import export_notes
    from planner.core import recommend
    kw = dict(framework="megatron", top_k=1, suggest=False)
    for spec, says in ((load_preset("gpt-oss-20b"), True), (model_from_hf_config(OSS_20B), True),
                       (load_preset("llama3-8b").model_copy(update={"name": "someone/gpt-oss-distill-llama-8b"}), False)):
        notes = " ".join(export_notes(recommend(spec, 8, **kw), "megatron"))
        assert ("--softmax-type learnable" in notes) == says, spec.name
