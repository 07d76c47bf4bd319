"""Multi-head latent attention's front end (ModelSpec.kv_lora_rank, q_lora_rank, qk_rope_head_dim, v_head_dim): the
DeepSeek-V2/V3 and Kimi K2 presets against their published totals and a count done here by hand, their Hugging Face
configs (deepseek_v2, deepseek_v3, kimi_k2) read into the presets' shapes, the explicit-shape flags, and the
Megatron-LM export's MLA flags (megatron/training/arguments.py: --multi-latent-attention, _add_mla_args)."""
from __future__ import annotations

import contextlib
import io
import json

import pytest

from cost_models.params import param_counts
from planner.cli import main
from planner.export import export_notes, export_plan
from planner.hf_config import checkpoint_differences, model_from_hf_config
from planner.models import load_preset, model_from_flags, preset_published_params
from planner.schema import HardwareRef, ModelSpec, Parallel, Plan, Training
from tests.test_export import megatron_args

MLA_FIELDS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim")
SHAPE = ("arch", "layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden", "vocab", "tied_embeddings",
         "experts", "experts_per_token", "shared_expert_ffn", "first_dense_layers", "moe_layer_step",
         "dense_ffn_hidden", "rope_theta") + MLA_FIELDS


def _by_hand(s: ModelSpec) -> int:
    """Every parameter of a DeepSeek-style model with latent attention, counted from the architecture (DeepSeek-V2
    sec. 2.1.2): q down h x q_lora and up q_lora x H*d (or one h x H*d), kv down h x (kv_lora + rope) and up
    kv_lora x H*(d - rope + v), out H*v x h; two RMSNorms a block and the latents' (q_lora + kv_lora); MoE blocks E
    SwiGLU experts of f, the shared expert and the h x E router, dense blocks a SwiGLU of dense_ffn_hidden; untied
    embedding and head, the final norm."""
    h, H, d, r, v, kl, ql = s.hidden, s.heads, s.head_dim, s.qk_rope_head_dim, s.v_head_dim, s.kv_lora_rank, \
        s.q_lora_rank or 0
    q = h * ql + ql * H * d if ql else h * H * d
    attn = q + h * (kl + r) + kl * H * (d - r + v) + H * v * h + 2 * h + ql + kl
    moe = s.layers - (s.first_dense_layers or 0)
    mlp = moe * (3 * h * s.ffn_hidden * s.experts + 3 * h * (s.shared_expert_ffn or 0) + h * s.experts) \
        + (s.first_dense_layers or 0) * 3 * h * s.dense_ffn_hidden
    return s.layers * attn + mlp + 2 * s.vocab * h + h


# (preset, published total, counted total B, active B with the embedding and head)
PRESETS = [("deepseek-v3", 671e9, 671.0, 37.6), ("deepseek-v2", 236e9, 235.7, 21.4),
           ("deepseek-v2-lite", 15.7e9, 15.7, 2.7), ("kimi-k2", 1.04e12, 1026.4, 32.9)]


@pytest.mark.parametrize("name,published,total,active", PRESETS)
def test_presets_count_what_was_published(name, published, total, active):
    """The DeepSeek reports' 671B / 37B, 236B / 21B and 15.7B / 2.4B, the Kimi K2 report's 1.04T / 32.6B: DeepSeek's
    within 0.5 % (published_params, tests/test_models.py's bar), Kimi K2's 1.3 % under (no published_params)."""
    s = load_preset(name)
    c = param_counts(s)
    assert c["total"] == s.num_params == _by_hand(s)
    assert round(c["total"] / 1e9, 1) == total and round(c["active"] / 1e9, 1) == active
    assert s.kv_heads == s.heads and s.mla is not None and s.head_dim == 192 and s.qk_rope_head_dim == 64
    if name == "kimi-k2":
        assert preset_published_params(name) is None and abs(c["total"] / published - 1) < 0.015
    else:
        assert preset_published_params(name) == published and abs(c["total"] / published - 1) < 0.005
    assert "arXiv:" in s.source and f"{total:.1f}B counted" in s.source


def test_deepseek_v3_excludes_its_multi_token_prediction_module_as_the_report_does():
    """The checkpoint's 685B is the report's 671B and its 14B multi-token-prediction module: one more MoE block
    (11.5B), its 2h x h projection and the copies of the embedding and head it is stored with (13.5B); neither the
    preset nor the report counts it."""
    s = load_preset("deepseek-v3")
    c = param_counts(s)
    mtp = c["per_layer"] + 2 * s.hidden ** 2 + c["embedding"] + c["head"]
    assert 13.4e9 < mtp < 13.6e9 and round((c["total"] + mtp) / 1e9) == 684  # "685B" on the model card
    assert "14B" in s.source and "not counted" in s.source


def test_hub_names_of_the_family_are_the_presets():
    """DeepSeek-R1 and V3.1 are DeepSeek-V3's shape, the chat and instruct models their base's; Kimi K2's
    instruct and thinking models K2's."""
    for name, preset in (("deepseek-ai/DeepSeek-V3", "deepseek-v3"), ("deepseek-ai/DeepSeek-R1", "deepseek-v3"),
                         ("deepseek-ai/DeepSeek-V3.1-Base", "deepseek-v3"),
                         ("deepseek-ai/DeepSeek-V2-Chat", "deepseek-v2"),
                         ("deepseek-ai/DeepSeek-V2-Lite-Chat", "deepseek-v2-lite"),
                         ("moonshotai/Kimi-K2-Instruct", "kimi-k2"), ("moonshotai/Kimi-K2-Instruct-0905", "kimi-k2"),
                         ("moonshotai/Kimi-K2-Thinking", "kimi-k2")):
        assert load_preset(name).name == preset, name
    assert load_preset("deepseek-v2-lite").q_lora_rank is None


# The released config.json files' keys that shape the model (deepseek-ai/DeepSeek-V3, DeepSeek-V2, DeepSeek-V2-Lite,
# moonshotai/Kimi-K2-Instruct), with their routing keys
V3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
      "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
      "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256, "routed_scaling_factor": 2.5,
      "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
      "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8, "moe_layer_freq": 1,
      "first_k_dense_replace": 3, "norm_topk_prob": True, "scoring_func": "sigmoid", "num_nextn_predict_layers": 1,
      "vocab_size": 129280, "max_position_embeddings": 163840, "rope_theta": 10000, "tie_word_embeddings": False}
V2 = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 5120,
      "intermediate_size": 12288, "moe_intermediate_size": 1536, "num_hidden_layers": 60, "num_attention_heads": 128,
      "num_key_value_heads": 128, "n_shared_experts": 2, "n_routed_experts": 160, "kv_lora_rank": 512,
      "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
      "topk_method": "group_limited_greedy", "n_group": 8, "topk_group": 3, "num_experts_per_tok": 6,
      "moe_layer_freq": 1, "first_k_dense_replace": 1, "scoring_func": "softmax", "vocab_size": 102400,
      "max_position_embeddings": 163840, "rope_theta": 10000, "tie_word_embeddings": False}
V2_LITE = {**V2, "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408,
           "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16, "n_routed_experts": 64,
           "q_lora_rank": None, "topk_method": "greedy", "n_group": 1, "topk_group": 1}
K2 = {**V3, "model_type": "kimi_k2", "num_attention_heads": 64, "num_key_value_heads": 64, "n_routed_experts": 384,
      "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "num_nextn_predict_layers": 0,
      "routed_scaling_factor": 2.827, "vocab_size": 163840, "max_position_embeddings": 131072, "rope_theta": 50000.0}


@pytest.mark.parametrize("cfg,preset", [(V3, "deepseek-v3"), (V2, "deepseek-v2"), (V2_LITE, "deepseek-v2-lite"),
                                        (K2, "kimi-k2")], ids=["deepseek_v3", "deepseek_v2", "v2-lite", "kimi_k2"])
def test_configs_read_into_the_presets_shapes(cfg, preset):
    spec, want = model_from_hf_config(cfg), load_preset(preset)
    assert {k: getattr(spec, k) for k in SHAPE} == {k: getattr(want, k) for k in SHAPE}
    assert spec.num_params == want.num_params
    # transformers' DeepSeek configs save head_dim as the rotary part: a query/key head is nope + rope wide all the same
    assert model_from_hf_config({**cfg, "head_dim": 64}).head_dim == 192


def test_what_the_checkpoints_hold_beyond_the_plan_is_said():
    """DeepSeek-V3: its multi-token-prediction module, sigmoid routing with a correction bias, group-limited routing;
    DeepSeek-V2: group-limited routing only (softmax scores); V2-Lite and Kimi K2 (n_group 1, no MTP module): no
    group note, and K2 routes by sigmoid.  Each is one of the differences the exports repeat."""
    def notes(cfg):
        kind, found = checkpoint_differences(model_from_hf_config(cfg).source)
        assert kind == cfg["model_type"]
        return " | ".join(found)
    v3 = notes(V3)
    assert "num_nextn_predict_layers 1" in v3 and "sigmoid" in v3 and "top 4 of n_group 8" in v3
    v2 = notes(V2)
    assert "sigmoid" not in v2 and "top 3 of n_group 8" in v2 and "nextn" not in v2
    assert notes(V2_LITE) == ""
    k2 = notes(K2)
    assert "sigmoid" in k2 and "n_group" not in k2 and "nextn" not in k2


def test_a_config_leaving_out_the_latent_widths_takes_its_class_defaults():
    """DeepseekV3Config / DeepseekV2Config defaults (q 1536, kv 512, 128 + 64, v 128), and Kimi K2 DeepSeek-V3's; an
    explicit null q_lora_rank is a full query projection; shared experts and dense blocks as the classes default."""
    widths = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim")
    for cfg in (V3, V2, K2):
        bare = model_from_hf_config({k: v for k, v in cfg.items() if k not in widths})
        assert (bare.q_lora_rank, bare.kv_lora_rank, bare.head_dim, bare.qk_rope_head_dim, bare.v_head_dim) == \
            (1536, 512, 192, 64, 128)
    assert model_from_hf_config({**V3, "q_lora_rank": None}).q_lora_rank is None
    dflt = model_from_hf_config({k: v for k, v in V3.items() if k not in ("n_shared_experts", "first_k_dense_replace")})
    assert (dflt.shared_expert_ffn, dflt.first_dense_layers) == (2048, 3)  # DeepseekV3Config: 1 shared, 3 dense
    dflt = model_from_hf_config({k: v for k, v in V2.items() if k not in ("n_shared_experts", "first_k_dense_replace")})
    assert (dflt.shared_expert_ffn, dflt.first_dense_layers) == (3072, None)  # DeepseekV2Config: 2 shared, none dense


@pytest.mark.parametrize("edit,match", [
    ({"moe_layer_freq": 2}, r"moe_layer_freq 2: MoE layers other than every one past first_k_dense_replace"),
    ({"kv_lora_rank": None}, r"missing required field kv_lora_rank"),
    ({"v_head_dim": 0}, r"v_head_dim must be a positive integer"),
    ({"q_lora_rank": "1536"}, r"q_lora_rank must be a positive integer"),
    ({"num_key_value_heads": 8}, r"kv_heads \(8\) must equal heads \(128\)"),
    ({"qk_nope_head_dim": 0}, r"qk_nope_head_dim must be a positive integer"),
])
def test_a_config_parplan_cannot_plan_is_refused_in_one_line(edit, match):
    with pytest.raises(ValueError, match=match) as e:
        model_from_hf_config({**V3, **edit})
    assert "\n" not in str(e.value) and str(e.value).startswith("config dict: ")


def test_hub_names_of_configs_read_are_fetched_and_others_refused(tmp_path, monkeypatch):
    """A DeepSeek-V3, Kimi K2 or gpt-oss hub name missing from the cache is told how to fetch its config (read now);
    DBRX's and DeepSeek-V3.2's (sparse attention, model_type deepseek_v32) are told there is no plan for them."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    for name in ("deepseek-ai/DeepSeek-V3-0324", "moonshotai/Kimi-K2-Base", "deepseek-ai/DeepSeek-V2-Lite",
                 "openai/gpt-oss-20b"):
        with pytest.raises(ValueError, match="is neither a file nor in the Hugging Face cache"):
            model_from_hf_config(name)
    for name in ("databricks/dbrx-instruct", "deepseek-ai/DeepSeek-V3.2-Exp"):
        with pytest.raises(ValueError, match="a mixture-of-experts model by its name; parplan plans .*DeepSeek-V2/"):
            model_from_hf_config(name)


def test_a_config_file_plans_under_megatron(tmp_path, capsys):
    """--model-config with a DeepSeek-V2-Lite config.json: the spec in the plan is the preset's.  (Planning needs the
    cost model's latent attention, cost_models/*.)"""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(V2_LITE))
    rc = main(["recommend", "--model-config", str(path), "--gpus", "16", "--framework", "megatron", "--json",
               "--top", "1"])
    out, err = capsys.readouterr()
    assert rc in (0, 3), err
    model = json.loads(out)["model"]
    want = load_preset("deepseek-v2-lite")
    assert {k: model[k] for k in SHAPE} == {k: getattr(want, k) for k in SHAPE}


# --- the explicit-shape flags

FLAGS = ["--layers", "27", "--hidden", "2048", "--heads", "16", "--head-dim", "192", "--ffn-hidden", "1408",
         "--vocab", "102400", "--experts", "64", "--experts-per-token", "6", "--shared-expert-ffn", "2816",
         "--first-dense-layers", "1", "--dense-ffn", "10944", "--kv-lora-rank", "512", "--qk-rope-dim", "64",
         "--v-head-dim", "128"]


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def test_flags_build_the_presets_shape():
    """DeepSeek-V2-Lite by flags (no --q-lora-rank: a full query projection), and DeepSeek-V3's latents with
    --q-lora-rank: the presets' specs, what --framework megatron plans."""
    from planner.cli import _resolve_model
    kw = dict(kv_heads=None, ffn_hidden=1408, vocab=102400, head_dim=192, experts=64, experts_per_token=6,
              shared_expert_ffn=2816, first_dense_layers=1, dense_ffn=10944, kv_lora_rank=512, qk_rope_dim=64,
              v_head_dim=128)
    spec, why, _ = _resolve_model(None, None, None, "llama", 27, 2048, 16, seq_len=4096,
                                  **{k: v for k, v in kw.items() if k not in ("ffn_hidden", "vocab", "kv_heads")},
                                  kv_heads=None, ffn_hidden=1408, vocab=102400)
    want = load_preset("deepseek-v2-lite")
    assert why is None and {k: getattr(spec, k) for k in SHAPE if k != "rope_theta"} == \
        {k: getattr(want, k) for k in SHAPE if k != "rope_theta"}
    assert spec.num_params == want.num_params and "latent attention (kv_lora 512, q_lora none" in spec.source
    v3 = model_from_flags("llama", 61, 7168, 128, head_dim=192, ffn_hidden=2048, vocab=129280, experts=256,
                          experts_per_token=8, shared_expert_ffn=2048, first_dense_layers=3, dense_ffn_hidden=18432,
                          kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128)
    assert v3.num_params == load_preset("deepseek-v3").num_params and v3.kv_heads == 128


@pytest.mark.parametrize("drop,add,words", [
    (("--qk-rope-dim", "--v-head-dim"), (), "needs head_dim (a query/key head's whole width), qk_rope_head_dim"),
    (("--kv-lora-rank",), (), "they need kv_lora_rank"),
    ((), ("--kv-heads", "8"), "kv_heads (8) must equal heads (16)"),
    ((), ("--qk-rope-dim", "192"), "it must be even and smaller than head_dim"),
    (("--experts", "--experts-per-token", "--shared-expert-ffn", "--first-dense-layers", "--dense-ffn"),
     ("--arch", "gpt"), "multi-head latent attention is planned in llama-arch blocks"),
    ((), ("--q-lora-rank", "0"), "--q-lora-rank must be a positive number"),
    ((), ("--sliding-window", "4096"), "sliding_window with multi-head latent attention is not planned"),
])
def test_a_half_given_latent_shape_is_one_line(drop, add, words):
    argv, i = [], 0
    while i < len(FLAGS):
        if FLAGS[i] in drop or FLAGS[i] in add[::2]:
            i += 2
            continue
        argv += FLAGS[i:i + 2]
        i += 2
    rc, out, err = _run(["recommend", *argv, *add, "--gpus", "16", "--framework", "megatron", "--json"])
    assert rc == 2 and out == "", (rc, err)
    assert err.count("\n") == 1 and err.startswith("error: ") and words in err and "Traceback" not in err, err


def test_latent_flags_belong_to_an_explicit_shape():
    rc, out, err = _run(["recommend", "--model", "deepseek-v3", "--kv-lora-rank", "256", "--gpus", "64"])
    assert rc == 2 and err.count("\n") == 1 and "--kv-lora-rank only applies to an explicit shape" in err


def test_flags_plan_under_megatron():
    """The flags' model planned and written to the plan (needs the cost model's latent attention, cost_models/*)."""
    rc, out, err = _run(["recommend", *FLAGS, "--gpus", "16", "--framework", "megatron", "--json", "--top", "1"])
    assert rc in (0, 3), err
    model = json.loads(out)["model"]
    assert (model["kv_lora_rank"], model["q_lora_rank"], model["head_dim"], model["v_head_dim"]) == \
        (512, None, 192, 128)


# --- the Megatron-LM export

def mla_plan(name="deepseek-v3", **parallel) -> Plan:
    spec = load_preset(name)
    par = dict(tp=2, pp=4, dp=8, ep=8, sp=True, zero_stage=1, recompute="full")
    par.update(parallel)
    return Plan(model=spec, hardware=HardwareRef(name="h100-sxm-80gb", gpus=par["tp"] * par["pp"] * par["dp"],
                                                 gpus_per_node=8),
                training=Training(seq_len=4096, global_batch_size=512, micro_batch_size=1, num_microbatches=64,
                                  dtype="bf16", precision="master-weights", framework="megatron", tokens=1e9),
                parallel=Parallel(**par))


@pytest.mark.parametrize("name", ["deepseek-v3", "deepseek-v2-lite", "kimi-k2"])
def test_megatron_export_writes_latent_attention(name):
    """--multi-latent-attention with every width (Megatron's defaults are DeepSeek-V2's: kv 32, qk 128 + 64, v 128),
    --qk-head-dim the no-rope part, no --q-lora-rank for a full query projection, the latents' norms
    (--qk-layernorm), and none of grouped-query attention's flags; Megatron's own query/key head is its sum."""
    plan = mla_plan(name, **({"pp": 3} if name == "deepseek-v2-lite" else {}))
    m = plan.model
    a = megatron_args(export_plan(plan, "megatron"))
    assert a["--multi-latent-attention"] is True and a["--qk-layernorm"] is True
    assert a["--kv-lora-rank"] == str(m.kv_lora_rank) and a["--v-head-dim"] == str(m.v_head_dim)
    assert int(a["--qk-head-dim"]) + int(a["--qk-pos-emb-head-dim"]) == m.head_dim == 192
    assert a["--qk-pos-emb-head-dim"] == "64"
    assert a.get("--q-lora-rank") == (str(m.q_lora_rank) if m.q_lora_rank else None)
    assert not {"--group-query-attention", "--num-query-groups", "--kv-channels"} & set(a)
    assert a["--num-attention-heads"] == str(m.heads) and a["--num-experts"] == str(m.experts)
    assert a["--moe-layer-freq"] == f"([0]*{m.first_dense_layers}+[1]*{m.layers - m.first_dense_layers})"
    assert a["--moe-shared-expert-intermediate-size"] == str(m.shared_expert_ffn)
    assert a["--ffn-hidden-size"] == str(m.dense_ffn_hidden) and a["--moe-ffn-hidden-size"] == str(m.ffn_hidden)
    # cuDNN's fused attention: TE's FlashAttention 2 has no kernel for 192-wide q/k heads against 128-wide values
    assert a["--attention-backend"] == "fused"
    assert any("--attention-backend fused" in n for n in export_notes(plan, "megatron"))
    assert megatron_args(export_plan(mla_plan(name="llama3-70b", ep=1), "megatron"))["--attention-backend"] == "flash"


def test_megatron_export_of_a_latent_shape_whose_heads_do_not_divide_hidden():
    """Megatron divides hidden by the heads for a --kv-channels not given: an explicit shape where they do not
    gets one (MLA's projections take their widths from the latent flags, not from it)."""
    spec = model_from_flags("llama", 4, 1000, 6, head_dim=96, ffn_hidden=512, vocab=1000, kv_lora_rank=64,
                            qk_rope_head_dim=32, v_head_dim=64)
    plan = mla_plan().model_copy(update={"model": spec})
    plan.parallel.ep = 1
    a = megatron_args(export_plan(plan, "megatron"))
    assert a["--kv-channels"] == "64" and a["--qk-head-dim"] == "64" and "--num-experts" not in a


@pytest.mark.parametrize("to", ["deepspeed", "llm-foundry"])
def test_other_exports_refuse_latent_attention_in_one_line(to, tmp_path):
    """Every other builder writes ordinary attention: an MLA plan, MoE or dense, is refused with the fix."""
    for plan in (mla_plan(), mla_plan().model_copy(update={"model": model_from_flags(
            "llama", 4, 1024, 8, head_dim=192, kv_lora_rank=256, qk_rope_head_dim=64, v_head_dim=128)})):
        with pytest.raises(ValueError, match=r"has multi-head latent attention \(kv_lora_rank \d+\), planned and "
                                             r"exported for Megatron-LM \(--multi-latent-attention\) and torchtitan "
                                             r"\(its deepseek_v3\) only; use --to megatron"):
            export_plan(plan, to)
    path = tmp_path / "plan.json"
    path.write_text(mla_plan().model_dump_json())
    rc, out, err = _run(["export", str(path), "--to", to])
    assert rc == 2 and out == "" and err.count("\n") == 1 and "multi-head latent attention" in err


def test_torchtitan_exports_latent_attention_with_experts_only():
    """torchtitan builds latent attention into its deepseek_v3 mixture of experts (--to torchtitan-0.2); a dense MLA
    model and torchtitan 0.1's keys (no expert parallelism) are refused with the fix."""
    dense = mla_plan().model_copy(update={"model": model_from_flags(
        "llama", 4, 1024, 8, head_dim=192, kv_lora_rank=256, qk_rope_head_dim=64, v_head_dim=128)})
    for to in ("torchtitan", "torchtitan-0.2"):
        with pytest.raises(ValueError, match="without experts: torchtitan's deepseek_v3 builds it as a mixture of "
                                             "experts only; use --to megatron"):
            export_plan(dense, to)
    with pytest.raises(ValueError, match="use --to torchtitan-0.2"):
        export_plan(mla_plan(), "torchtitan")
    assert 'name = "deepseek_v3"' in export_plan(mla_plan(), "torchtitan-0.2")


def test_a_recommended_mla_plan_exports_and_round_trips(tmp_path):
    """recommend --framework megatron on DeepSeek-V2-Lite, then export (needs the cost model's latent attention)."""
    rc, out, err = _run(["recommend", "--model", "deepseek-v2-lite", "--gpus", "16", "--framework", "megatron",
                         "--json", "--top", "1"])
    assert rc == 0, err
    path = tmp_path / "plan.json"
    path.write_text(out)
    rc, text, err = _run(["export", str(path), "--to", "megatron"])
    assert rc == 0, err
    a = megatron_args(text)
    assert a["--multi-latent-attention"] is True and "--q-lora-rank" not in a and a["--kv-lora-rank"] == "512"


def test_megatron_export_recomputes_the_up_projections_where_the_plan_does():
    """training.mla_recompute: Megatron-LM's --recompute-modules mla_up_proj (TransformerConfig.recompute_modules),
    beside a mixture of experts' modules and core attention where selective asks for it; nothing where the blocks are
    recomputed whole."""
    plan = mla_plan(recompute="none")
    plan.training.mla_recompute = True
    text = export_plan(plan, "megatron")
    assert "--recompute-granularity selective" in text and "--recompute-modules mla_up_proj \\" in text
    plan.training.moe_recompute = "act"
    plan.parallel.recompute = "selective"
    assert "--recompute-modules core_attn mla_up_proj moe_act \\" in export_plan(plan, "megatron")
    plan.parallel.recompute = "full"
    assert "mla_up_proj" not in export_plan(plan, "megatron")
    plan = mla_plan(recompute="none")
    assert "--recompute-modules" not in export_plan(plan, "megatron")
