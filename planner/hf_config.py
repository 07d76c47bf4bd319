"""Hugging Face ``config.json`` -> ModelSpec, for the dense decoder families the runtime can build.

Families and how they map (field names differ per family; `_FIELDS` lists them):
  llama, mistral, qwen2  -> arch llama (RMSNorm, RoPE, GQA, SwiGLU). Qwen2's q/k/v biases are counted
                            (qkv_bias, since the fifty-second session: 0.002% of Qwen2.5-7B).
  qwen3                  -> arch llama with the config's head_dim (Qwen3-0.6B: 16 heads x 128 = 2048
                            over hidden 1024); its per-head q/k RMSNorms' weights (2 x head_dim a layer)
                            are not counted, their activations are (qk_norm, as every family's below).
  phi3                   -> arch llama: its fused qkv and gate_up projections hold the same matrices.
  internlm2              -> arch llama: its fused wqkv holds the same q, k and v matrices, with llama's key names
                            (InternLM2.5-7B: 7,737,708,544, every parameter); a `bias` true (InternLM2Config's
                            default; the released configs set false) would add biases not counted (a note says so).
  granite                -> arch llama: Granite's embedding, residual, attention and logit multipliers are
                            scalars (no parameters, no matmuls).
  olmo2                  -> arch llama: its two norms a layer sit after attention and MLP instead of
                            before (norms_after: the same count); its q and k RMSNorms, each over the whole q or k
                            width (qk_norm_whole), counted but for their weights (h + kv width a layer).
  gemma2                 -> as gemma, plus two norms a layer on the sublayers' outputs (post_norms, counted) and
                            attention
                            logit soft-capping (pointwise); every other layer attends within a sliding
                            window (4096), which the cost model counts as full attention: exact up to that
                            sequence length, an over-estimate of those layers' attention beyond it (said in
                            the spec's source).
  gemma3_text, gemma3    -> as gemma2 (q/k norms' weights not counted either), five of every six layers within a
                            512-1024-token window.
  gemma                  -> arch llama: GeGLU has the same three ffn x h matrices as SwiGLU; head_dim
                            from the config (256), tied embeddings by default.
  gpt2                   -> arch gpt (LayerNorm, GeLU, learned positions n_positions, biases, tied).
  gpt_neox               -> arch gpt: LayerNorm, GeLU, biases on every linear, untied embeddings,
                            rotary positions (learned_positions false: no table, so the count
                            matches the checkpoint exactly, the sequence is not capped, and the
                            runtime rotates q and k, over the whole head rather than NeoX's
                            rotary_pct share).  Its parallel residual (two norms) is planned as
                            sequential blocks (same matmuls, same FLOPs).
  ministral, smollm3, exaone4, hunyuan_v1_dense, seed_oss, olmo, olmo3, glm4, cohere, cohere2, stablelm
                         -> arch llama, with what their blocks hold beyond it said in the spec's source and left
                            out of the count (q/k norms' weights, q/k/v biases, LayerNorm biases; the q/k norms'
                            activations are counted, qk_norm, and GLM-4's post-norms whole, post_norms) or counted
                            where they have less (OLMo's non-parametric norms); Command R's attention and MLP side by
                            side on one norm (parallel_block, as StableLM's with use_parallel_residual);
                            SmolLM3's NoPE layers rotate like the rest (same cost).  OLMo 3's and EXAONE 4's two
                            norms sit after the sublayers (norms_after), OLMo 3's q/k norms span the whole widths
                            (qk_norm_whole).  OLMo 3, Command R7B (cohere2)
                            and EXAONE 4 window three of every four layers (layer_types, or the class's pattern:
                            EXAONE's "LLLG" string read as such).
  starcoder2, gpt_bigcode, nemotron, phi, gptj, falcon, mpt, bloom, opt
                         -> arch gpt (LayerNorm, a two-matrix MLP, biases): StarCoder2 (rotary, GQA, every layer
                            within its window) and GPT-BigCode (learned table, multi-query) exactly; Nemotron's
                            squared-ReLU MLP, Falcon's, MPT's and GPT-J's linears without biases, Phi's, GPT-J's and
                            Falcon-7B's attention and MLP side by side on one norm (parallel_block, exact; Falcon-40B's
                            two norms planned as sequential blocks), BLOOM's and MPT's ALiBi (costed as rotary positions, no
                            table either way), OPT's two offset position rows: each said in the source, the count
                            off by exactly that (tests/test_hf_config.py holds each against transformers' build).
  mixtral, qwen3_moe, qwen2_moe, glm4_moe, dots1, llama4_text (llama4's text_config)
                         -> arch llama with experts (ModelSpec.experts, experts_per_token; Qwen2-MoE's shared expert,
                            GLM-4.5's and dots.llm1's n_shared_experts x moe_intermediate_size and Llama 4's one of
                            intermediate_size: shared_expert_ffn).  Dense blocks between the MoE ones
                            (ModelSpec.first_dense_layers, moe_layer_step, dense_ffn_hidden of intermediate_size, Llama
                            4's intermediate_size_mlp): GLM-4.5's and dots.llm1's first_k_dense_replace, Qwen-MoE's
                            decoder_sparse_step and a leading run of mlp_only_layers, Llama 4's
                            interleave_moe_layer_step (other placements are refused).
                            GLM-4.5's q/k/v biases and multi-token-prediction layer, Llama 4's chunked attention
                            (counted as full) are said in a note.
  deepseek_v2, deepseek_v3, kimi_k2
                         -> as glm4_moe (DeepSeek-style experts: n_routed_experts of moe_intermediate_size,
                            n_shared_experts of the same width, the first first_k_dense_replace blocks dense of
                            intermediate_size; a moe_layer_freq other than 1 is refused) with multi-head latent
                            attention (ModelSpec.kv_lora_rank, q_lora_rank (null: a full query projection,
                            DeepSeek-V2-Lite), qk_rope_head_dim, v_head_dim; head_dim = qk_nope_head_dim +
                            qk_rope_head_dim, not the config's head_dim, which transformers sets to the rotary part).
                            Kimi K2's kimi_k2 is DeepSeek-V3's architecture (DeepseekV3ForCausalLM).  Said in notes,
                            not counted or costed as such: the multi-token-prediction module (num_nextn_predict_layers;
                            DeepSeek-V3's 14B), sigmoid routing with its correction bias (noaux_tc,
                            e_score_correction_bias) and group-limited routing (n_group, topk_group), costed as a
                            softmax top-k router.
  ernie4_5               -> arch llama (ERNIE-4.5-0.3B): Ernie4_5Config's head_dim 128 whatever hidden / heads (0.3B: 16
                            heads of 128 over hidden 1024), tied embeddings by default; its interleaved rotary halves
                            cost the same.
  ernie4_5_moe           -> arch llama with experts (ERNIE-4.5-21B-A3B, -300B-A47B): moe_num_experts of
                            moe_intermediate_size, top moe_k, one shared expert of moe_num_shared_experts x
                            moe_intermediate_size (Ernie4_5_MoeSparseMoeBlock's shared_experts); block i MoE where
                            moe_layer_start_index <= i <= moe_layer_end_index and (i + 1) % moe_layer_interval == 0
                            (Ernie4_5_MoeDecoderLayer), the others dense of intermediate_size: first_dense_layers the
                            start index, moe_layer_step the interval (an end index short of the last block, trailing
                            dense blocks, is refused).  Routed by softmax top-k, the k chosen on the scores plus a
                            correction bias (moe_statics.e_score_correction_bias, not counted): costed as softmax
                            top-k; its multi-token-prediction layers (num_nextn_predict_layers) are said in a note.
                            Its vision-language models (ERNIE-4.5-VL: text and vision experts of different widths)
                            are refused.
  gpt_oss                -> arch llama with experts (gpt-oss-20b, -120b): num_local_experts of intermediate_size, top
                            num_experts_per_tok, every block MoE, head_dim 64 (64 heads over hidden 2880); layer_types'
                            alternation (GptOssConfig's default: blocks 0, 2, ... within sliding_window) as
                            full_attention_every 2.  Not counted: the attention sinks (a logit a head) and the q/k/v/o,
                            router and experts' biases (0.03 % of the 120b); its clamped SwiGLU costed as SwiGLU, its
                            softmax over the top-k logits as softmax top-k, its MXFP4 checkpoint as 16-bit weights.
  minimax_m2             -> arch llama with experts (MiniMax-M2, M2.1, M2.5: MiniMaxM2ForCausalLM): num_local_experts
                            of intermediate_size, top num_experts_per_tok, every block MoE, no shared expert, head_dim
                            128 (48 heads over hidden 3072); its q/k RMSNorms over all heads' width (qk_norm_whole).
                            Not counted: those norms' weights ((heads + kv_heads) x head_dim a layer) and the router's
                            correction bias; its sigmoid
                            routing costed as softmax top-k, its partial rotary (rotary_dim 64 of 128) as the whole
                            head, its FP8 checkpoint as 16-bit weights, its multi-token-prediction modules
                            (num_mtp_modules) said in a note.  A layer of linear (lightning) attention in attn_type_list
                            (MiniMax-Text-01's and M1's, model_type minimax) or a shared expert is refused.
  olmoe                  -> arch llama with experts (OLMoE-1B-7B): num_experts of intermediate_size, top
                            num_experts_per_tok; its q and k RMSNorms over their whole widths (qk_norm_whole),
                            their weights (h + kv width a layer) not counted.
  phimoe                 -> arch llama with experts (Phi-3.5-MoE): num_local_experts of intermediate_size, top
                            num_experts_per_tok, every layer within sliding_window as Mistral's; its LayerNorms
                            counted as RMSNorms (their biases, 2 h a layer + h, not counted), its q/k/v/o biases
                            (attention_bias) and output bias (lm_head_bias) not counted, its SparseMixer router costed
                            as softmax top-k.
  granitemoe, granitemoeshared
                         -> arch llama with experts (Granite 3.0/3.1 MoE: 1b-a400m, 3b-a800m): num_local_experts of
                            intermediate_size, top num_experts_per_tok, GraniteMoeShared's shared MLP of
                            shared_intermediate_size as shared_expert_ffn; the multipliers are scalars (exact counts);
                            the softmax over the top-k logits costed as softmax top-k.
  hunyuan_v1_moe         -> arch llama with experts (Hunyuan-A13B): num_experts of intermediate_size, top moe_topk
                            (one value, or a per-layer list of one value), one shared MLP of intermediate_size
                            (HunYuanMoEV1Moe's shared_mlp); per-head q/k norms (2 x head_dim a layer) not counted.
                            Per-layer expert widths (moe_intermediate_size) or shared-expert counts (num_shared_expert)
                            other than that build, and cross-layer attention (use_cla), are refused.
Other mixture-of-experts configs are rejected (DBRX, ...; those in MOE_REFUSED with the reason).
Multimodal configs (gemma3, mistral3, llama4, llava, llava_next, internvl, qwen2_vl, qwen2_5_vl, and any other whose
text_config names one of the types above) are read through their text_config, filled with its config class's
defaults; the vision tower is left out (said in the source).
"""
from __future__ import annotations

import difflib
import json
import math
import os
import re
from pathlib import Path

from planner.limits import SHAPE_MAX
from planner.models import mixture_of_experts_name, read_moe_families, with_param_count
from planner.schema import ModelSpec, error_message, json_type_name

LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3", "phi3", "internlm2", "granite", "olmo2", "gemma", "gemma2",
              "gemma3_text", "ministral", "smollm3", "olmo", "olmo3", "exaone4", "hunyuan_v1_dense", "seed_oss", "glm4",
              "cohere", "cohere2", "stablelm", "mixtral", "qwen3_moe", "qwen2_moe", "glm4_moe", "llama4_text",
              "dots1", "deepseek_v2", "deepseek_v3", "kimi_k2", "ernie4_5", "ernie4_5_moe", "gpt_oss", "minimax_m2",
              "olmoe", "phimoe", "granitemoe", "granitemoeshared", "hunyuan_v1_moe")
GPT_LIKE = ("gpt2", "gpt_neox", "gpt_bigcode", "gptj", "starcoder2", "nemotron", "phi", "falcon", "mpt", "bloom", "opt")
# gpt-arch families with a learned position table (its rows: the context the checkpoint was trained to)
LEARNED_POSITIONS = {"gpt2": "n_positions", "gpt_bigcode": "n_positions", "opt": "max_position_embeddings"}
# gpt-arch families whose positions are rotary (the runtime's rope) or ALiBi (no table: costed as rotary, said)
ALIBI = ("bloom", "mpt")
SUPPORTED = LLAMA_LIKE + GPT_LIKE
# keys whose positive value makes a config mixture-of-experts (Mixtral's num_local_experts, Qwen-MoE's num_experts,
# DeepSeek's n_routed_experts, DBRX's ffn_config.moe_num_experts, the experts a token is routed to), wherever the
# config nests them (a multimodal config's text_config, DBRX's ffn_config)
MOE_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok")
# the mixtures of experts read (ModelSpec.experts; planned under --framework megatron): model_type -> (the experts'
# key, the expert width's key); the top-k is num_experts_per_tok in both.  Mixtral: every layer MoE, intermediate_size
# is one expert's; Qwen3-MoE: moe_intermediate_size is one expert's (intermediate_size the dense layers', which
# decoder_sparse_step / mlp_only_layers would make: refused, as ModelSpec has every layer MoE)
MOE_TYPES = {"mixtral": ("num_local_experts", "intermediate_size"), "qwen3_moe": ("num_experts", "moe_intermediate_size"),
             "qwen2_moe": ("num_experts", "moe_intermediate_size"),
             "glm4_moe": ("n_routed_experts", "moe_intermediate_size"),
             "llama4_text": ("num_local_experts", "intermediate_size"),
             "dots1": ("n_routed_experts", "moe_intermediate_size"),
             "deepseek_v2": ("n_routed_experts", "moe_intermediate_size"),
             "deepseek_v3": ("n_routed_experts", "moe_intermediate_size"),
             "kimi_k2": ("n_routed_experts", "moe_intermediate_size"),
             "ernie4_5_moe": ("moe_num_experts", "moe_intermediate_size"),
             "gpt_oss": ("num_local_experts", "intermediate_size"),
             "minimax_m2": ("num_local_experts", "intermediate_size"),
             "olmoe": ("num_experts", "intermediate_size"),
             "phimoe": ("num_local_experts", "intermediate_size"),
             "granitemoe": ("num_local_experts", "intermediate_size"),
             "granitemoeshared": ("num_local_experts", "intermediate_size"),
             "hunyuan_v1_moe": ("num_experts", "intermediate_size")}
# the top-k's key where it is not num_experts_per_tok (Ernie4_5_MoeConfig: moe_k, num_experts_per_tok its alias;
# HunYuanMoEV1Config: moe_topk, one value or one a layer)
MOE_TOP_K = {"ernie4_5_moe": "moe_k", "hunyuan_v1_moe": "moe_topk"}
# A family's config keys transformers' config class reads under another name (its attribute_map: Ernie4_5_MoeConfig's
# num_experts and num_experts_per_tok set moe_num_experts and moe_k): model_type -> {alias: the key}
_KEY_ALIASES = {"ernie4_5_moe": {"num_experts": "moe_num_experts", "num_experts_per_tok": "moe_k"},
                "minimax_m2": {"num_experts": "num_local_experts"},
                "hunyuan_v1_moe": {"num_experts_per_tok": "moe_topk", "num_local_experts": "num_experts"}}
# Families with norms on the queries and keys before rotary (ModelSpec.qk_norm): True where every config of the family
# has them (transformers' q_norm / k_norm built unconditionally: Qwen3 and Gemma 3 per head, OLMo 2 / 3 and OLMoE over
# the whole q and k widths), else the config key that switches them (Llama 4's use_qk_norm defaults to true, an L2 norm
# of its rotary layers, counted in every layer; GLM-4.5-Air sets use_qk_norm false)
QK_NORM = {"qwen3": True, "qwen3_moe": True, "gemma3_text": True, "olmo2": True, "olmo3": True, "olmoe": True,
           "exaone4": True, "dots1": True, "hunyuan_v1_moe": True, "minimax_m2": "use_qk_norm", "glm4_moe": "use_qk_norm",
           "cohere": "use_qk_norm", "hunyuan_v1_dense": "use_qk_norm", "llama4_text": "use_qk_norm",
           "stablelm": "qk_layernorm", "phi": "qk_layernorm"}
# Families with a norm on each sublayer's output before its residual add, beside the input norms (ModelSpec.post_norms):
# Gemma 2 / 3's post_attention_layernorm and post_feedforward_layernorm, GLM-4's post_self_attn_layernorm and
# post_mlp_layernorm (transformers builds them in every layer).  OLMo 2 / 3 and EXAONE 4 put their two norms after the
# sublayers instead of before them: two norms, not these
POST_NORMS = ("gemma2", "gemma3_text", "glm4")
# ...and the families whose two norms sit on the sublayers' outputs in place of their inputs (ModelSpec.norms_after:
# transformers' post_attention_layernorm and post_feedforward_layernorm applied to the sublayer's output, no input norm)
NORMS_AFTER = ("olmo2", "olmo3", "exaone4")
# ...and those whose llama blocks have biases on the q, k and v projections only (ModelSpec.qkv_bias): transformers'
# Qwen2Attention and Qwen2MoeAttention build them unconditionally; GLM-4's, GLM-4.5's and Seed-OSS's where
# attention_bias is set (their output projection has none: Seed-OSS's attention_out_bias says so apart)
QKV_BIAS = ("qwen2", "qwen2_moe")
QKV_BIAS_SWITCHED = ("glm4", "glm4_moe", "seed_oss")


def has_qkv_bias(cfg: dict, model_type: str) -> bool:
    """Whether a config's llama blocks have biases on their q, k and v projections and on nothing else (QKV_BIAS)."""
    if model_type in QKV_BIAS:
        return True
    return model_type in QKV_BIAS_SWITCHED and cfg.get("attention_bias") is True and not cfg.get("attention_out_bias")


def has_parallel_block(cfg: dict, model_type: str) -> bool:
    """Whether a config's blocks run attention and MLP side by side on one norm (ModelSpec.parallel_block): GPT-J's,
    Phi-1 / 2's and Command R's always, Falcon's with parallel_attn and one norm (Falcon-7B; the new decoder
    architecture's two norms, num_ln_in_parallel_attn 2, are not), StableLM's with use_parallel_residual.  GPT-NeoX's
    parallel residual has two norms: not this (planned as sequential blocks, said)."""
    if model_type in ("gptj", "phi", "cohere", "cohere2"):
        return True
    if model_type == "falcon":
        return bool(cfg.get("parallel_attn", True)) and (not cfg.get("new_decoder_architecture")
                                                        or cfg.get("num_ln_in_parallel_attn") == 1)
    return model_type == "stablelm" and cfg.get("use_parallel_residual") is True


QK_NORM_DEFAULT = {"llama4_text": True, "minimax_m2": True}  # the config classes' defaults where the key is absent
# ...of which these norm a token's whole query and key widths, not each head (ModelSpec.qk_norm_whole: transformers'
# q_norm of num_attention_heads x head_dim and k_norm of num_key_value_heads x head_dim)
QK_NORM_WHOLE = ("olmo2", "olmo3", "olmoe", "minimax_m2")


def has_qk_norm(cfg: dict, model_type: str) -> bool:
    """Whether a config's blocks norm their queries and keys (QK_NORM)."""
    rule = QK_NORM.get(model_type)
    if rule is None or rule is True:
        return bool(rule)
    value = cfg.get(rule, QK_NORM_DEFAULT.get(model_type, False))
    return value is True


# Mixture-of-experts families parplan cannot plan, and why (said in the refusal): their blocks hold what ModelSpec
# cannot say (linear attention, state-space layers); DBRX and any other family not read are refused without one
MOE_REFUSED = {"minimax": "MiniMax-Text-01's and MiniMax-M1's lightning (linear) attention in 7 of every 8 layers",
               "granitemoehybrid": "Granite 4.0's Mamba-2 layers between the attention ones",
               "jamba": "Jamba's Mamba layers between the attention ones",
               "qwen3_next": "Qwen3-Next's Gated DeltaNet (linear attention) layers"}
# ERNIE 4.5's vision-language models (ERNIE-4.5-VL-28B-A3B, -424B-A47B: model_type ernie4_5_moe_vl in Baidu's files,
# ernie4_5_vl_moe in transformers'): text and vision experts of different widths in one block (a heterogeneous mixture
# of experts), which ModelSpec cannot say
ERNIE_VL = re.compile(r"ernie[-_]?4[._]?5.*vl", re.I)
# DeepSeek-style MoE configs (GLM-4.5's glm4_moe, dots.llm1's dots1 with multi-head attention; DeepSeek-V2's, V3's and
# Kimi K2's with latent attention, MLA_TYPES): n_shared_experts shared experts of moe_intermediate_size, the first
# first_k_dense_replace layers dense of intermediate_size; what each family's config class defaults them to where a
# file leaves them out (Glm4MoeConfig: 1 and 1; Dots1Config: none, 0; DeepseekV2Config: 2, 0; DeepseekV3Config: 1, 3,
# also Kimi K2's, whose config.json maps to DeepSeek-V3's configuration_deepseek.py)
DEEPSEEK_STYLE = {"glm4_moe": {"n_shared_experts": 1, "first_k_dense_replace": 1},
                  "dots1": {"n_shared_experts": 0, "first_k_dense_replace": 0},
                  "deepseek_v2": {"n_shared_experts": 2, "first_k_dense_replace": 0},
                  "deepseek_v3": {"n_shared_experts": 1, "first_k_dense_replace": 3},
                  "kimi_k2": {"n_shared_experts": 1, "first_k_dense_replace": 3}}
# Families with multi-head latent attention (ModelSpec.kv_lora_rank): DeepSeek-V2 and V3, Kimi K2 (DeepSeek-V3's blocks)
MLA_TYPES = ("deepseek_v2", "deepseek_v3", "kimi_k2")
# the shared expert's width where the family has one (Qwen2-MoE / Qwen1.5-MoE: ModelSpec.shared_expert_ffn)
MOE_SHARED = {"qwen2_moe": "shared_expert_intermediate_size", "granitemoeshared": "shared_intermediate_size"}
# a LM head: what the architectures field's class names end with for a model trained on next-token prediction
LM_HEAD_CLASSES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")

# ModelSpec field -> config keys tried in order, per family group.
_FIELDS = {
    "llama": {"layers": ("num_hidden_layers",), "hidden": ("hidden_size",), "heads": ("num_attention_heads",),
              "kv_heads": ("num_key_value_heads",), "ffn_hidden": ("intermediate_size",), "vocab": ("vocab_size",)},
    "gpt2": {"layers": ("n_layer",), "hidden": ("n_embd",), "heads": ("n_head",), "kv_heads": (),
             "ffn_hidden": ("n_inner",), "vocab": ("vocab_size",)},
    "gpt_neox": {"layers": ("num_hidden_layers",), "hidden": ("hidden_size",), "heads": ("num_attention_heads",),
                 "kv_heads": (), "ffn_hidden": ("intermediate_size",), "vocab": ("vocab_size",)},
    # Falcon's older files name n_layer / n_head / n_head_kv (FalconConfig took both); its kv heads: _kv_heads
    "falcon": {"layers": ("num_hidden_layers", "n_layer"), "hidden": ("hidden_size", "n_embed"),
               "heads": ("num_attention_heads", "n_head"), "kv_heads": (), "ffn_hidden": ("ffn_hidden_size",),
               "vocab": ("vocab_size",)},
    "mpt": {"layers": ("n_layers",), "hidden": ("d_model",), "heads": ("n_heads",), "kv_heads": (), "ffn_hidden": (),
            "vocab": ("vocab_size",)},
    "bloom": {"layers": ("n_layer", "num_hidden_layers"), "hidden": ("hidden_size", "n_embed"),
              "heads": ("n_head", "num_attention_heads"), "kv_heads": (), "ffn_hidden": (), "vocab": ("vocab_size",)},
    "opt": {"layers": ("num_hidden_layers",), "hidden": ("hidden_size",), "heads": ("num_attention_heads",),
            "kv_heads": (), "ffn_hidden": ("ffn_dim",), "vocab": ("vocab_size",)},
}
_FIELDS["gpt_bigcode"] = _FIELDS["gptj"] = _FIELDS["gpt2"]  # GPTBigCodeConfig / GPTJConfig: GPT-2's names
for _t in ("starcoder2", "nemotron", "phi"):  # llama's names, GPT-style blocks
    _FIELDS[_t] = _FIELDS["llama"]
# What a family's transformers config class fills in for a key the file leaves out (configuration_<type>.py,
# __init__ defaults): official configs omit some (a multimodal Gemma 3's text_config lists only what differs
# from Gemma3TextConfig), and Qwen3's and Gemma's head_dim is not hidden / heads.  Llama, Phi-3, Granite and
# OLMo 2 default num_key_value_heads to num_attention_heads and head_dim to hidden / heads (the fallbacks below).
_CLASS_DEFAULTS = {
    "mistral": {"num_key_value_heads": 8},
    "qwen2": {"num_key_value_heads": 32, "vocab_size": 151936},
    "qwen3": {"num_key_value_heads": 32, "vocab_size": 151936, "head_dim": 128},
    "gemma": {"num_key_value_heads": 16, "vocab_size": 256000, "head_dim": 256, "max_position_embeddings": 8192},
    "gemma2": {"num_key_value_heads": 4, "vocab_size": 256000, "head_dim": 256, "max_position_embeddings": 8192,
               "sliding_window": 4096},
    "gemma3_text": {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                    "max_position_embeddings": 131072, "sliding_window": 4096},
    "gpt2": {"n_positions": 1024},
    "gpt_bigcode": {"n_positions": 1024},
    "gptj": {"n_positions": 2048},
    "opt": {"max_position_embeddings": 2048},
    # DeepseekV2Config's and DeepseekV3Config's latent attention (Kimi K2: DeepSeek-V3's class); q_lora_rank null in a
    # file (DeepSeek-V2-Lite) stays null, a full query projection
    "deepseek_v2": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                    "v_head_dim": 128},
    "deepseek_v3": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                    "v_head_dim": 128, "n_group": 8, "topk_group": 4},
    "kimi_k2": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                "v_head_dim": 128, "n_group": 8, "topk_group": 4},
    # Ernie4_5Config (ERNIE-4.5-0.3B's shape: head_dim 128 over hidden 1024 / 16 heads) and Ernie4_5_MoeConfig
    # (ERNIE-4.5-21B-A3B's: 64 experts of 1536, top 6, 2 shared, block 0 dense; moe_layer_end_index -1: the last
    # block); both default_theta 500000
    "ernie4_5": {"num_key_value_heads": 2, "vocab_size": 103424, "head_dim": 128, "max_position_embeddings": 131072,
                 "rope_theta": 500000.0},
    "ernie4_5_moe": {"num_key_value_heads": 4, "vocab_size": 103424, "max_position_embeddings": 131072,
                     "rope_theta": 500000.0, "moe_num_experts": 64, "moe_k": 6, "moe_intermediate_size": 1536,
                     "moe_num_shared_experts": 2, "moe_layer_start_index": 1, "moe_layer_end_index": -1,
                     "moe_layer_interval": 1},
    # MiniMaxM2Config (MiniMax-M2's shape: 256 experts of 1536, top 8, 8 kv heads of 128; default_theta 5e6),
    # OlmoeConfig (OLMoE's 64 experts, top 8), PhimoeConfig (Phi-3.5-MoE's: 16 experts, top 2, 8 kv heads; default_theta
    # 1e6), GraniteMoeConfig / GraniteMoeSharedConfig (8 experts, top 2), HunYuanMoEV1Config (moe_topk 1)
    "minimax_m2": {"num_key_value_heads": 8, "head_dim": 128, "vocab_size": 200064, "max_position_embeddings": 196608,
                   "rope_theta": 5000000.0, "num_local_experts": 256, "num_experts_per_tok": 8},
    "olmoe": {"vocab_size": 50304, "max_position_embeddings": 4096, "num_experts": 64, "num_experts_per_tok": 8},
    "phimoe": {"num_key_value_heads": 8, "vocab_size": 32064, "max_position_embeddings": 131072, "rope_theta": 1e6,
               "num_local_experts": 16, "num_experts_per_tok": 2},
    "granitemoe": {"vocab_size": 32000, "max_position_embeddings": 2048, "num_local_experts": 8,
                   "num_experts_per_tok": 2},
    "granitemoeshared": {"vocab_size": 32000, "max_position_embeddings": 2048, "num_local_experts": 8,
                         "num_experts_per_tok": 2},
    "hunyuan_v1_moe": {"vocab_size": 290943, "max_position_embeddings": 2048, "moe_topk": 1},
}
# Default of tie_word_embeddings when the file leaves it out (the family's transformers config class).
_TIED_DEFAULT = {"llama": False, "mistral": False, "qwen2": False, "qwen3": False, "phi3": False, "internlm2": False,
                 "granite": False, "olmo2": False, "gemma": True, "gemma2": True, "gemma3_text": True,
                 "gpt2": True, "gpt_neox": False, "ministral": False, "smollm3": True, "olmo": False, "olmo3": False,
                 "exaone4": False, "hunyuan_v1_dense": False, "seed_oss": False, "glm4": False, "cohere": True,
                 "cohere2": True, "stablelm": False, "gpt_bigcode": True, "gptj": False, "starcoder2": True,
                 "nemotron": False, "phi": False, "falcon": True, "mpt": True, "bloom": True, "opt": True,
                 "mixtral": False, "qwen3_moe": False, "qwen2_moe": False, "glm4_moe": False, "llama4_text": False,
                 "dots1": False, "deepseek_v2": False, "deepseek_v3": False, "kimi_k2": False, "ernie4_5": True,
                 "ernie4_5_moe": True, "gpt_oss": False, "minimax_m2": False, "olmoe": False, "phimoe": False,
                 "granitemoe": False, "granitemoeshared": False, "hunyuan_v1_moe": False}


# Multimodal configs read through their language model's text_config (the vision tower and projector left out):
# model_type -> (the text_config's model_type where it names none, the text_config where the file has none), as the
# wrapper's transformers config class sets them (configuration_<type>.py).  Any other config whose text_config
# names a supported model_type is read the same way.
_WRAPPERS = {
    "gemma3": ("gemma3_text", {}),
    "llava": ("llama", {}),
    "llava_next": ("llama", {}),
    "internvl": ("qwen2", {}),
    "qwen2_vl": ("qwen2", {}),  # Qwen2-VL / Qwen2.5-VL: the language model's keys at the top level (older files),
    "qwen2_5_vl": ("qwen2", {}),  # or a text_config of type qwen2(_5)_vl_text (newer), Qwen2's blocks either way
    "llama4": ("llama4_text", {}),  # Llama 4 Scout / Maverick: Llama4TextConfig's defaults (_TEXT_CLASS_DEFAULTS)
    "mistral3": ("mistral", {"hidden_size": 5120, "intermediate_size": 32768, "num_hidden_layers": 40,
                             "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                             "vocab_size": 131072, "max_position_embeddings": 131072, "rope_theta": 1e9,
                             "sliding_window": None}),
}
# A wrapper's language-model types that are a supported family's blocks under another name (their rotary
# variant, M-RoPE, costs the same)
_TEXT_ALIASES = {"qwen2_vl_text": "qwen2", "qwen2_5_vl_text": "qwen2"}
# A text_config inside a multimodal config lists only what differs from its class's defaults (LLaVA-1.5's names
# no hidden size), so there every shape key the class defaults is filled in (LlamaConfig, MistralConfig,
# Qwen2Config __init__); a stand-alone config of these types must name its shape (a truncated file is refused,
# not planned as the class's default model).
_TEXT_CLASS_DEFAULTS = {
    "llama": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
              "num_attention_heads": 32, "max_position_embeddings": 2048},
    "mistral": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072},
    "qwen2": {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 32768},
    # Llama4TextConfig (Scout's shape: 16 experts, every block MoE)
    "llama4_text": {"vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
                    "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
                    "max_position_embeddings": 131072, "num_local_experts": 16, "num_experts_per_tok": 1,
                    "interleave_moe_layer_step": 1, "rope_theta": 500000.0, "attention_chunk_size": 8192},
}


def read_hf_config(path_or_dict) -> tuple[dict, str]:
    """(the config, where it came from): read once, then pass this to model_from_hf_config and hf_config_context
    (a pipe, --model-config <(...), reads empty the second time)."""
    if isinstance(path_or_dict, tuple):  # read_hf_config's
        return path_or_dict
    if isinstance(path_or_dict, dict):
        return path_or_dict, "config dict"
    if str(path_or_dict) == "-":
        raise ValueError("--model-config reads a config.json file or a model's folder, not stdin (-); save the config "
                         "to a file and give its path")
    path = Path(path_or_dict)
    repo_id = None
    if not path.exists() and HUB_ID.fullmatch(str(path_or_dict)):  # a model's hub name: its config in the local cache
        repo_id, path = str(path_or_dict), cached_hub_config(str(path_or_dict))
    if path.is_dir():
        path = path / "config.json"
    from .limits import is_device
    if is_device(path):
        raise ValueError(f"Hugging Face config {path} is a device, not a file; give the model's config.json")
    try:
        with open(path, encoding="utf-8-sig") as f:  # utf-8-sig: an editor's byte order mark is still UTF-8
            cfg = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"Hugging Face config {path} does not exist") from None
    except PermissionError:
        raise ValueError(f"cannot read Hugging Face config {path}: permission denied; give a file you may read, or "
                         "change its permissions") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"Hugging Face config {path}: not valid JSON: {e}") from None
    except UnicodeDecodeError:
        raise ValueError(f"Hugging Face config {path}: not a text (UTF-8 JSON) file") from None
    except RecursionError:
        raise ValueError(f"Hugging Face config {path}: not a config: its JSON is nested too deeply") from None
    except ValueError:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise ValueError(f"Hugging Face config {path}: not a config: a number in it has more digits than can be "
                         "read") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"Hugging Face config {path}: expected a JSON object")
    if repo_id:  # named as transformers names a model loaded by its hub name
        cfg = {"_name_or_path": repo_id, **cfg}
    return cfg, str(path)


# a hub name, owner/model, as the Hugging Face hub spells them (no path of more parts, no file suffix of .json)
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9_-](?<!\.json)")


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache huggingface_hub writes: $HF_HUB_CACHE, else $HF_HOME/hub, else
    ~/.cache/huggingface/hub (its constants.py; $HUGGINGFACE_HUB_CACHE is the older name of the first)."""
    env = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if env:
        return Path(env).expanduser()
    home = os.environ.get("HF_HOME")
    return (Path(home).expanduser() if home else Path.home() / ".cache" / "huggingface") / "hub"


# the names of the mixture-of-experts families MOE_TYPES reads (a hub name's config is worth fetching): DeepSeek-V2,
# V2-Lite, V2.5, V3, V3.1 and R1 (not V3.2: its sparse attention, model_type deepseek_v32), Kimi K2; MiniMax-M2, M2.1
# and M2.5 (not MiniMax-M1 or Text-01: their lightning attention), OLMoE, Phi-3.5-MoE, Granite 3.x MoE, Hunyuan-A13B
READ_MOE_NAME = re.compile(r"mixtral|qwen[23][-_.\w]*-a\d+b|qwen1\.5-moe|glm-4\.5|llama-4|"
                           r"deepseek[-_]?(v2|v3(?!\.2)|r1)|kimi[-_]?k2(?!\.)|ernie-4\.5-\d+b-a\d+b|gpt[-_]?oss|"
                           r"minimax[-_]?m2|olmoe|phi-3\.5-moe|granite-3\.\d-\d+b-a\d+m|hunyuan-a13b", re.I)


def cached_hub_config(repo_id: str) -> Path:
    """config.json of a model in the local hub cache (models--owner--name/snapshots/<revision>/config.json): the
    revision refs/main names, else the newest snapshot holding one; a ValueError with the fix where none is there."""
    repo = hub_cache_dir() / ("models--" + repo_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    ref = repo / "refs" / "main"
    try:
        main = snapshots / ref.read_text().strip() / "config.json" if ref.is_file() else None
        if main is not None and main.is_file():
            return main
        found = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime) if snapshots.is_dir() else []
    except OSError as e:
        raise ValueError(f"Hugging Face config {repo_id}: cannot read the hub cache at {repo}: {e.strerror or e}") \
            from None
    if found:
        return found[-1]
    if mixture_of_experts_name(repo_id) and not READ_MOE_NAME.search(repo_id):
        # no use fetching a config whose plan would be refused (the families MOE_TYPES reads are fetched)
        raise ValueError(f"Hugging Face config {repo_id}: a mixture-of-experts model by its name; parplan plans "
                         f"{read_moe_families()} configs (model_type "
                         f"{', '.join(sorted(set(MOE_TYPES) - {'llama4_text'} | {'llama4'}))}) and dense models, so it "
                         "has no plan for it")
    raise ValueError(f"Hugging Face config {repo_id} is neither a file nor in the Hugging Face cache ({hub_cache_dir()}); "
                     f"fetch it with `huggingface-cli download {repo_id} config.json`, or give the config.json's path")


def _positive_int(cfg: dict, key: str, where: str, zero_is_none: bool = False):
    """cfg[key] where the file sets it: a positive integer (a JSON number without a fraction), else None (also for 0
    where zero_is_none); anything else is a one-line ValueError naming the key (these are compared with the
    sequence length, where a string would fail deep inside)."""
    v = cfg.get(key)
    if v is None or (zero_is_none and (v is False or (not isinstance(v, bool) and v == 0))):
        return None
    whole = isinstance(v, int) or (isinstance(v, float) and math.isfinite(v) and v.is_integer())
    if isinstance(v, bool) or not whole or v <= 0:  # floats checked before int() (an int of 400 digits is whole)
        shown = repr(v) if len(repr(v)) <= 40 else repr(v)[:40] + "..."
        raise ValueError(f"{where}: {key} must be a positive integer, got {shown}; correct it in the config")
    return int(v)


def _get(cfg: dict, keys: tuple[str, ...], field: str, where: str, required: bool = True, used: dict | None = None):
    for k in keys:
        if cfg.get(k) is not None:
            if used is not None:
                used[field] = k  # the config's key, for an error about the value
            return cfg[k]
    if required:
        raise ValueError(f"{where}: missing required field {' / '.join(keys)} (for {field})")
    return None


def _prepared(path_or_dict) -> tuple[dict, str, str, str | None]:
    """(config with its class's defaults, where it came from, model_type, the multimodal model_type whose text_config
    it is, whose vision tower was dropped, else None)."""
    cfg, where = read_hf_config(path_or_dict)
    inner = cfg.get("text_config")
    for kind in (cfg.get("model_type"), inner.get("model_type") if isinstance(inner, dict) else None):
        if isinstance(kind, str) and ERNIE_VL.search(kind):  # before its moe_num_experts (a list there) is looked at
            raise ValueError(f"{where}: model_type {kind!r} is ERNIE 4.5's vision-language model, whose blocks hold text "
                             "and vision experts of different widths (a heterogeneous mixture of experts), which "
                             "parplan does not plan; its text models (ernie4_5_moe, ERNIE-4.5-21B-A3B and "
                             "-300B-A47B) are read")
    moe = _moe_field(cfg)
    # Llama 4's wrapper holds a mixture of experts parplan reads (its text_config, llama4_text); any other wrapper's
    # mixture of experts is refused as one
    text = cfg.get("text_config")
    llama4 = cfg.get("model_type") == "llama4" and (not isinstance(text, dict) or text.get("model_type") in (None,
                                                                                                         "llama4_text"))
    model_type = cfg.get("model_type")
    # (a model_type that is no string, a list or object, is refused as such below, not looked up here)
    if moe and (model_type is None or isinstance(model_type, str)) and model_type not in MOE_TYPES and not llama4:
        why = f" (model_type {model_type}: {MOE_REFUSED[model_type]})" if model_type in MOE_REFUSED else ""
        raise ValueError(f"{where}: {moe[0]} = {moe[1]}: a mixture-of-experts model of a family parplan does not read"
                         f"{why} (its mixtures of experts: model_type {', '.join(MOE_TYPES)}), so it has no plan for "
                         "this config")
    if model_type is not None and not isinstance(model_type, str):  # a list or object would fail the lookups below
        raise ValueError(f"{where}: model_type must be a string naming the family (one of {', '.join(SUPPORTED)}), got "
                         f"{json_type_name(model_type)}; correct it in the config")
    wrapper = model_type if model_type in _WRAPPERS or (
        model_type not in SUPPORTED and isinstance(cfg.get("text_config"), dict)
        and cfg["text_config"].get("model_type") in SUPPORTED) else None
    if wrapper:  # a multimodal config: the language model's shape is its text_config, with the defaults its config
        # class gives it (a text_config lists what differs from them; none at all: the wrapper's own default model)
        text = cfg.get("text_config")
        if text is not None and not isinstance(text, dict):
            raise ValueError(f"{where}: text_config must be a JSON object (the language model's config), got "
                             f"{json_type_name(text)}")
        default_type, default_text = _WRAPPERS.get(wrapper, (None, {}))
        text = default_text if text is None else text
        model_type = text.get("model_type", default_type)
        model_type = _TEXT_ALIASES.get(model_type, model_type) if isinstance(model_type, str) else model_type
        if model_type not in SUPPORTED:
            raise ValueError(f"{where}: the language model of this {wrapper} config (its text_config) has model_type "
                             f"{model_type!r}, which is not supported (supported: {', '.join(SUPPORTED)}); give the "
                             f"shape instead: {_shape_flags({**cfg, **text})}")
        cfg = {**_TEXT_CLASS_DEFAULTS.get(model_type, {}), **{k: v for k, v in cfg.items() if k != "model_type"},
               **text, "model_type": model_type}
    if model_type is None and isinstance(cfg.get("parallel"), dict) and isinstance(cfg.get("model"), dict):
        raise ValueError(f"{where} is a parplan plan, not a Hugging Face config (what --model-config reads): "
                         f"re-predict it with `parplan evaluate {where}`")
    if model_type is None:
        raise ValueError(f"{where}: missing required field model_type (one of {', '.join(SUPPORTED)})")
    if model_type not in SUPPORTED:
        near = difflib.get_close_matches(str(model_type).lower().replace("-", "_"), SUPPORTED, n=1, cutoff=0.8)
        text = cfg.get("text_config")
        if near and not (isinstance(text, dict) and text.get("model_type")):
            # transformers matches model_type exactly too ("LLAMA" is no llama to AutoConfig); a multimodal config
            # naming its language model (qwen3_vl_moe's qwen3_vl_moe_text) is no typo of qwen3_moe: said below
            raise ValueError(f"{where}: model_type {model_type!r} is not supported; did you mean {near[0]!r}? "
                             "correct it in the config")
        if isinstance(text, dict) and text.get("model_type"):  # a multimodal config of a language model not read
            raise ValueError(f"{where}: model_type {model_type!r} is not supported, nor its language model's (its "
                             f"text_config's) {text['model_type']!r} (supported: {', '.join(SUPPORTED)}); give the "
                             f"shape instead: {_shape_flags({**cfg, **text})}")
        raise ValueError(f"{where}: model_type {model_type!r} is not supported (supported: {', '.join(SUPPORTED)}); "
                         f"give the shape instead: {_shape_flags(cfg)}")
    for alias, key in _KEY_ALIASES.get(model_type, {}).items():  # the class's attribute_map: the alias sets the key
        if cfg.get(alias) is not None and key not in cfg:
            cfg = {**cfg, key: cfg[alias]}
    cfg = {**_CLASS_DEFAULTS.get(model_type, {}), **cfg}  # keys the file has win, explicit nulls included
    return cfg, where, model_type, wrapper


def _moe_field(cfg: dict, prefix: str = "", depth: int = 0):
    """(key path, value) of the first MOE_FIELDS key with a positive value in cfg or the configs it nests (a vision or
    audio tower's aside: a multimodal model drops those), else None."""
    for k in MOE_FIELDS:
        v = cfg.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            return prefix + k, v
    for k, v in cfg.items():
        if isinstance(v, dict) and depth < 4 and not any(t in k for t in ("vision", "audio")):
            found = _moe_field(v, f"{prefix}{k}.", depth + 1)
            if found:
                return found
    return None


# the explicit-shape flags an unsupported config's keys fill: the names the families in SUPPORTED use, and those of
# OPT (ffn_dim), GPT-J (n_embd, n_layer, n_head, n_inner) and Falcon (num_kv_heads)
_SHAPE_KEYS = (("--layers", ("num_hidden_layers", "n_layer", "num_layers", "n_layers")),
               ("--hidden", ("hidden_size", "n_embd", "d_model")),
               ("--heads", ("num_attention_heads", "n_head", "num_heads", "n_heads")),
               ("--kv-heads", ("num_key_value_heads", "num_kv_heads", "n_head_kv")),
               ("--ffn-hidden", ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size")),
               ("--vocab", ("vocab_size", "padded_vocab_size")),
               ("--head-dim", ("head_dim",)))


def _shape_flags(cfg: dict) -> str:
    """The explicit-shape flags of an unsupported config, from its keys: --arch llama where its activation is SiLU
    (a gated MLP), gpt where it names another, and where it names none llama if its MLP width is given and not
    4 x hidden; Falcon's multi-query attention (multi_query without new_decoder_architecture) one
    key/value head; a shape field the config has under no known key left as <N>."""
    def value(keys):
        for k in keys:
            v = cfg.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
        return None
    act = str(cfg.get("hidden_act") or cfg.get("activation_function") or "").lower()
    hidden, ffn = value(_SHAPE_KEYS[1][1]), value(_SHAPE_KEYS[4][1])
    # no activation named: a gated MLP's width is seldom 4 x hidden (Llama 3's 3.5, Qwen2's 5.3), a GeLU MLP's is
    # (OPT; Falcon and GPT-J leave it implicit): a llama-shaped config without hidden_act had been sent to --arch gpt
    gated = act in ("silu", "swiglu", "swish") if act else bool(ffn and hidden and ffn != 4 * hidden)
    flags = ["--arch", "llama" if gated else "gpt"]
    for flag, keys in _SHAPE_KEYS:
        v = 1 if flag == "--kv-heads" and cfg.get("multi_query") and not cfg.get("new_decoder_architecture") \
            else value(keys)
        if v is not None or flag in ("--layers", "--hidden", "--heads", "--vocab"):
            flags += [flag, str(v) if v is not None else "<N>"]
    if isinstance(cfg.get("tie_word_embeddings"), bool):
        flags.append("--tied-embeddings" if cfg["tie_word_embeddings"] else "--untied-embeddings")
    return (" ".join(flags) + " (from this config's keys, as parplan's llama or gpt blocks: check the parameter count "
            "it prints against the model's)")


def _context(cfg: dict, where: str):
    return (_positive_int(cfg, "max_position_embeddings", where, zero_is_none=True)
            or _positive_int(cfg, "n_positions", where, zero_is_none=True)
            or (_positive_int(cfg, "max_seq_len", where, zero_is_none=True) if cfg.get("model_type") == "mpt" else None))


def _falcon_kv(cfg: dict, heads, used: dict):
    """FalconConfig: the new decoder architecture (40B, 180B) or multi_query false has num_kv_heads (older files:
    n_head_kv; default: the heads) key/value heads, else one (Falcon-7B's multi-query attention)."""
    if cfg.get("new_decoder_architecture") or cfg.get("multi_query", True) is False:
        for k in ("num_kv_heads", "n_head_kv"):
            if cfg.get(k) is not None:
                used["kv_heads"] = k
                return cfg[k]
        return heads
    return 1


def _mpt_kv(cfg: dict, heads, used: dict):
    """MPT's attn_config: multi-query attention one key/value head, llm-foundry's grouped-query its kv_n_heads."""
    attn = cfg.get("attn_config") if isinstance(cfg.get("attn_config"), dict) else {}
    kind = str(attn.get("attn_type") or "multihead_attention")
    if kind.startswith("multiquery"):
        return 1
    if kind.startswith("grouped_query") and attn.get("kv_n_heads") is not None:
        used["kv_heads"] = "attn_config.kv_n_heads"
        return attn["kv_n_heads"]
    return heads


# families whose key/value heads no single key gives: (config, heads, used) -> kv heads
_KV_HEADS = {"falcon": _falcon_kv, "mpt": _mpt_kv,
             "gpt_bigcode": lambda cfg, heads, used: 1 if cfg.get("multi_query", True) else heads}


def hf_config_context(path_or_dict) -> int | None:
    """The checkpoint's context (max_position_embeddings, or gpt2's n_positions), where the config gives one."""
    cfg, where, _, _ = _prepared(path_or_dict)
    return _context(cfg, where)


def _dense_between(cfg: dict, model_type: str, where: str, layers) -> tuple[int | None, int | None]:
    """(first_dense_layers, moe_layer_step) of a mixture of experts' dense blocks between its MoE ones, None each where
    there are none: GLM-4.5's first_k_dense_replace (Glm4MoeDecoderLayer: layer i MoE where i >= it); Qwen-MoE's
    decoder_sparse_step (layer i MoE where (i + 1) % step == 0) and mlp_only_layers (dense whatever the step), read
    where they are a leading run 0 .. k-1 (a list ModelSpec cannot say is refused)."""
    if model_type in MLA_TYPES and cfg.get("moe_layer_freq") not in (None, 1):
        # DeepSeek's own modelling code: layer i MoE where i >= first_k_dense_replace and i % moe_layer_freq == 0;
        # transformers' ignores the key (every layer past the dense ones MoE): no placement both would build
        raise ValueError(f"{where}: moe_layer_freq {cfg['moe_layer_freq']!r}: MoE layers other than every one past "
                         "first_k_dense_replace, which parplan does not plan (the released DeepSeek and Kimi configs "
                         "have 1)")
    if model_type in DEEPSEEK_STYLE:
        k = cfg.get("first_k_dense_replace", DEEPSEEK_STYLE[model_type]["first_k_dense_replace"])
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise ValueError(f"{where}: first_k_dense_replace must be a whole number of layers, got {k!r}; correct it "
                             "in the config")
        return (k or None), None
    if model_type == "llama4_text":
        # Llama4TextConfig: moe_layers as given, else every interleave_moe_layer_step-th layer (from 1)
        step = cfg.get("interleave_moe_layer_step", 1)
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise ValueError(f"{where}: interleave_moe_layer_step must be a positive integer, got {step!r}; correct it "
                             "in the config")
        listed = cfg.get("moe_layers")
        if listed is not None and isinstance(layers, int) and layers <= SHAPE_MAX:
            if sorted(set(listed) if isinstance(listed, list) else [-1]) != list(range(step - 1, layers, step)):
                raise ValueError(f"{where}: moe_layers {listed!r}: MoE layers other than every "
                                 f"interleave_moe_layer_step-th ({step}), which parplan does not plan")
        return None, (step if step > 1 else None)
    if model_type == "ernie4_5_moe":
        return _ernie_moe_blocks(cfg, where, layers)
    if model_type not in ("qwen2_moe", "qwen3_moe"):
        return None, None
    step = cfg.get("decoder_sparse_step", 1)
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 1):
        raise ValueError(f"{where}: decoder_sparse_step must be a positive integer, got {step!r}; correct it in the config")
    dense = cfg.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in dense):
        raise ValueError(f"{where}: mlp_only_layers must be a list of layer numbers, got {dense!r}; correct it in the "
                         "config")
    lead = sorted(set(dense))
    if lead != list(range(len(lead))):
        raise ValueError(f"{where}: mlp_only_layers {dense!r}: dense layers other than a leading run (0, 1, ...), which "
                         "parplan does not plan (first_dense_layers and moe_layer_step place them)")
    return (len(lead) or None), (step if step and step > 1 else None)


def _ernie_moe_blocks(cfg: dict, where: str, layers) -> tuple[int | None, int | None]:
    """(first_dense_layers, moe_layer_step) of an ERNIE 4.5 MoE config: Ernie4_5_MoeDecoderLayer makes block i MoE where
    (i + 1) % moe_layer_interval == 0 and moe_layer_start_index <= i <= moe_layer_end_index (-1: the last block,
    Ernie4_5_MoeConfig; null read the same), which is ModelSpec's rule with first_dense_layers the start index and
    moe_layer_step the interval wherever no MoE block would fall past the end index; an end index that leaves dense
    blocks after the MoE ones, or no MoE block at all, is refused in one line."""
    def whole(key, least):
        v = cfg.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < least:
            raise ValueError(f"{where}: {key} must be a whole number{' of 1 or more' if least else ''}, got {v!r}; "
                             "correct it in the config")
        return v
    start, step = whole("moe_layer_start_index", 0), whole("moe_layer_interval", 1)
    end = cfg.get("moe_layer_end_index")
    end = -1 if end is None else end
    if isinstance(end, bool) or not isinstance(end, int) or end < -1:
        raise ValueError(f"{where}: moe_layer_end_index must be a layer number or -1 (the last layer), got {end!r}; "
                         "correct it in the config")
    if isinstance(layers, int) and not isinstance(layers, bool) and 0 < layers <= SHAPE_MAX:
        last = layers - 1 if end == -1 else end
        moe = [i for i in range(start, min(last, layers - 1) + 1) if (i + 1) % step == 0]
        if not moe:
            raise ValueError(f"{where}: moe_layer_start_index {start}, moe_layer_end_index {end} and moe_layer_interval "
                             f"{step} leave none of the {layers} layers MoE: a dense model; give it as model_type "
                             "ernie4_5 (or the shape flags)")
        beyond = [i for i in range(last + 1, layers) if (i + 1) % step == 0]
        if beyond:
            which = f"layer {beyond[0]}" if beyond[0] == layers - 1 else f"layers {beyond[0]}..{layers - 1}"
            raise ValueError(f"{where}: moe_layer_end_index {end}: {which} dense after the MoE ones, which parplan does "
                             f"not plan (only dense layers before and between MoE ones); set it to -1 to plan layers "
                             f"through {layers - 1} as MoE (more experts than the checkpoint)")
    return (start or None), (step if step > 1 else None)


def _short(v, width: int = 60) -> str:
    """repr(v), cut to `width` characters with "..." (a value quoted in a one-line refusal)."""
    r = repr(v)
    return r if len(r) <= width else r[:width] + "..."


def _one_per_layer(cfg: dict, key: str, where: str) -> dict:
    """cfg with cfg[key] one value where the file gives it a layer (Hunyuan's moe_topk, [8] * 32): a list of one value
    is that value; a list of several is refused in one line (ModelSpec has one top-k for every MoE block)."""
    v = cfg.get(key)
    if not isinstance(v, list):
        return cfg
    if not v or len({repr(x) for x in v}) > 1:
        raise ValueError(f"{where}: {key} {_short(v)}: a different value a layer, which parplan does not plan (one top-k "
                         "for every MoE block); give one number")
    return {**cfg, key: v[0]}


def _unplanned_moe_blocks(cfg: dict, model_type: str, where: str, ffn) -> None:
    """One-line refusals of what a MiniMax-M2 or Hunyuan MoE config can ask that ModelSpec cannot say (and transformers'
    class would not build as the checkpoint's own code does): MiniMax's linear-attention layers (attn_type_list 0, as
    MiniMax-Text-01 and M1 have) or a shared expert (shared_intermediate_size); Hunyuan's per-layer expert widths
    (moe_intermediate_size) or shared-expert counts (num_shared_expert) other than HunYuanMoEV1Moe's (experts and one
    shared MLP of intermediate_size), and its cross-layer attention (use_cla: adjacent layers share keys and
    values)."""
    if model_type == "minimax_m2":
        kinds = cfg.get("attn_type_list")
        if isinstance(kinds, list) and any(k == 0 for k in kinds):
            raise ValueError(f"{where}: attn_type_list marks {sum(k == 0 for k in kinds)} of {len(kinds)} layers 0, "
                             "linear (lightning) attention, which parplan does not plan (MiniMax-M2's layers are all "
                             "1, softmax attention)")
        extra = cfg.get("shared_intermediate_size")
        if isinstance(extra, (int, float)) and not isinstance(extra, bool) and extra > 0:
            raise ValueError(f"{where}: shared_intermediate_size {extra}: a shared expert, which transformers' "
                             "MiniMaxM2 does not build and parplan does not plan for this family (MiniMax-M2's is 0)")
    if model_type == "hunyuan_v1_moe":
        if cfg.get("use_cla"):
            raise ValueError(f"{where}: use_cla true: cross-layer attention (adjacent layers share their keys and "
                             "values), which parplan does not plan (Hunyuan-A13B's is false)")
        for key, want in (("moe_intermediate_size", ffn), ("num_shared_expert", 1)):
            v = cfg.get(key)
            values = v if isinstance(v, list) else [v] if v is not None else []
            if any(x != want for x in values):
                raise ValueError(f"{where}: {key} {_short(v)}: other than every layer's {want} (transformers' HunYuanMoEV1 "
                                 "builds each expert and one shared MLP of intermediate_size), which parplan does not "
                                 "plan")


def _ernie_notes(cfg: dict) -> list[str]:
    """What an ERNIE 4.5 MoE checkpoint holds or runs beyond the blocks planned: its router's correction bias (the top-k
    chosen on softmax scores plus moe_statics.e_score_correction_bias, the weights the softmax scores' own) and its
    multi-token-prediction layers (num_nextn_predict_layers; transformers drops their mtp weights on load)."""
    notes = ["routed by softmax top-k with a correction bias on the choice (e_score_correction_bias, not counted), "
             "costed as softmax top-k"]
    mtp = cfg.get("num_nextn_predict_layers")
    if isinstance(mtp, int) and not isinstance(mtp, bool) and mtp > 0:
        notes.append(f"the multi-token-prediction layers (num_nextn_predict_layers {mtp}) not counted nor planned "
                     f"unless asked: --mtp-layers {mtp} (--framework megatron)")
    return notes


def _latent_attention(cfg: dict, where: str, used: dict) -> dict:
    """ModelSpec's multi-head latent attention fields of a DeepSeek-V2/V3 or Kimi K2 config (MLA_TYPES): kv_lora_rank,
    q_lora_rank (null: a full query projection, DeepSeek-V2-Lite), qk_rope_head_dim, v_head_dim and head_dim, a
    query/key head's whole width qk_nope_head_dim + qk_rope_head_dim (a head_dim key, which transformers' DeepSeek
    configs set to the rotary part, is not read)."""
    widths = {}
    for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        widths[key] = _positive_int(cfg, key, where)
        if widths[key] is None:
            raise ValueError(f"{where}: missing required field {key} (a width of its multi-head latent attention)")
    used.update(kv_lora_rank="kv_lora_rank", q_lora_rank="q_lora_rank", qk_rope_head_dim="qk_rope_head_dim",
                v_head_dim="v_head_dim", head_dim="qk_nope_head_dim + qk_rope_head_dim")
    return {"kv_lora_rank": widths["kv_lora_rank"], "q_lora_rank": _positive_int(cfg, "q_lora_rank", where),
            "qk_rope_head_dim": widths["qk_rope_head_dim"], "v_head_dim": widths["v_head_dim"],
            "head_dim": widths["qk_nope_head_dim"] + widths["qk_rope_head_dim"]}


def _deepseek_notes(cfg: dict, model_type: str) -> list[str]:
    """What a DeepSeek-V2/V3 or Kimi K2 checkpoint holds or runs beyond the blocks planned: its multi-token-prediction
    module, its router's sigmoid scores with their correction bias (transformers' DeepSeek-V3 router always;
    DeepSeek-V2's where scoring_func says so) and its group-limited top-k (DeepSeek-V3's n_group / topk_group;
    DeepSeek-V2's under topk_method group_limited_greedy)."""
    notes = []
    mtp = cfg.get("num_nextn_predict_layers")
    if isinstance(mtp, int) and not isinstance(mtp, bool) and mtp > 0:
        notes.append(f"the multi-token-prediction module (num_nextn_predict_layers {mtp}: a block, its projection and "
                     f"norms each, DeepSeek-V3's 14B) not counted nor planned unless asked: --mtp-layers {mtp} "
                     "(--framework megatron)")
    if model_type != "deepseek_v2" or cfg.get("scoring_func") == "sigmoid" or cfg.get("topk_method") == "noaux_tc":
        notes.append("routed by sigmoid scores with a correction bias (e_score_correction_bias, not counted), "
                     "costed as softmax top-k")
    groups, chosen = cfg.get("n_group"), cfg.get("topk_group")
    if isinstance(groups, int) and isinstance(chosen, int) and 0 < chosen < groups \
            and (model_type != "deepseek_v2" or cfg.get("topk_method") == "group_limited_greedy"):
        notes.append(f"group-limited routing (top {chosen} of n_group {groups} groups) costed as a plain top-k router")
    return notes


def _biasless(cfg: dict, model_type: str) -> str | None:
    """The key that says a gpt-arch family's linears have no biases (parplan's gpt blocks count them), else None."""
    if model_type == "nemotron" and not cfg.get("attention_bias") and not cfg.get("mlp_bias"):
        return "attention_bias and mlp_bias false"
    if model_type == "starcoder2" and cfg.get("use_bias") is False:
        return "use_bias false"
    if model_type == "falcon" and not cfg.get("bias"):
        return "bias false"
    if model_type == "mpt" and cfg.get("no_bias", True):
        return "no_bias true"
    if model_type == "opt" and cfg.get("enable_bias") is False:
        return "enable_bias false"
    return None


# Every note model_from_hf_config writes about what a checkpoint's blocks hold otherwise than parplan's llama or gpt
# blocks holds one of these phrases; checkpoint_differences reads them back out of a plan's model source (planner.export)
BLOCK_DIFFERENCE = ("not counted", "counted as", "counted with", "count them", "costed as", "as gpt's", "as LayerNorm",
                    "counted, 2 h", "NoPE")


def checkpoint_differences(source: str | None) -> tuple[str | None, list[str]]:
    """(the config's model_type, the notes on what its checkpoint's blocks hold otherwise than the plan's: norms,
    biases, ALiBi, ...) from the source model_from_hf_config wrote, else (None, []) for a model not read from one."""
    found = re.match(r"Hugging Face config .* \(model_type ([\w.-]+)[,;)](.*)\)$", source or "")
    if not found:
        return None, []
    parts = [s.strip() for s in found.group(2).split(";")]
    return found.group(1), [s for s in parts if any(k in s for k in BLOCK_DIFFERENCE)]


def model_from_hf_config(path_or_dict, seq_len: int | None = None) -> ModelSpec:
    """ModelSpec (with num_params) from a config.json path, a model directory, or a loaded dict."""
    cfg, where, model_type, wrapper = _prepared(path_or_dict)

    names = _FIELDS["llama" if model_type in LLAMA_LIKE else model_type]
    used = {"head_dim": "head_dim", "tied_embeddings": "tie_word_embeddings"}  # parplan's field -> the config's key
    table = LEARNED_POSITIONS.get(model_type)
    if table:
        used["max_seq_len"] = table
    layers = _get(cfg, names["layers"], "layers", where, used=used)
    hidden = _get(cfg, names["hidden"], "hidden", where, used=used)
    heads = _get(cfg, names["heads"], "heads", where, used=used)
    vocab = _get(cfg, names["vocab"], "vocab", where, used=used)
    kv_heads = _get(cfg, names["kv_heads"], "kv_heads", where, required=False, used=used) if names["kv_heads"] else None
    if model_type in _KV_HEADS:
        kv_heads = _KV_HEADS[model_type](cfg, heads, used)
    if kv_heads is None:
        kv_heads = heads  # multi-head attention when the config has no GQA field
    if model_type in ("gpt2", "gpt_bigcode", "gptj", "falcon"):
        ffn = _get(cfg, names["ffn_hidden"], "ffn_hidden", where, required=False, used=used)
        if ffn is None:  # GPT2Config: n_inner None -> 4*n_embd (an n_inner of 0 is a zero-wide MLP there: refused below)
            ffn = 4 * hidden if isinstance(hidden, int) else hidden
    elif model_type == "bloom":  # BloomMLP: 4 x hidden, no key
        ffn = 4 * hidden if isinstance(hidden, int) else hidden
    elif model_type == "mpt":  # MptMLP: expansion_ratio x d_model
        ratio = cfg.get("expansion_ratio", 4)
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not isinstance(hidden, int):
            raise ValueError(f"{where}: expansion_ratio must be a number (the MLP is expansion_ratio x d_model), got "
                             f"{ratio!r}; correct it in the config")
        ffn, used["ffn_hidden"] = int(ratio * hidden), "expansion_ratio"
    elif model_type in MOE_TYPES:  # one expert's width
        ffn = _get(cfg, (MOE_TYPES[model_type][1],), "ffn_hidden", where, used=used)
    else:
        ffn = _get(cfg, names["ffn_hidden"], "ffn_hidden", where, used=used)
    experts = top_k = shared = first_dense = moe_step = dense_ffn = None
    if model_type in MOE_TYPES:
        top_key = MOE_TOP_K.get(model_type, "num_experts_per_tok")
        _unplanned_moe_blocks(cfg, model_type, where, ffn)
        experts = _positive_int(cfg, MOE_TYPES[model_type][0], where)
        top_k = _positive_int(_one_per_layer(cfg, top_key, where) if model_type == "hunyuan_v1_moe" else cfg, top_key,
                              where)
        if experts is None or top_k is None:
            missing = MOE_TYPES[model_type][0] if experts is None else top_key
            raise ValueError(f"{where}: missing required field {missing} (a mixture of experts' experts and top-k)")
        used.update(experts=MOE_TYPES[model_type][0], experts_per_token=top_key)
        if model_type in MOE_SHARED:
            shared = _positive_int(cfg, MOE_SHARED[model_type], where, zero_is_none=True)
            used["shared_expert_ffn"] = MOE_SHARED[model_type]
        elif model_type in ("llama4_text", "hunyuan_v1_moe"):  # Llama4TextMoe's shared expert of the experts' width,
            shared = ffn  # HunYuanMoEV1Moe's shared_mlp of intermediate_size, always
            used["shared_expert_ffn"] = "intermediate_size"
        elif model_type in DEEPSEEK_STYLE:  # n_shared_experts experts of moe_intermediate_size (their shared_experts)
            n_shared = _positive_int({**DEEPSEEK_STYLE[model_type], **cfg}, "n_shared_experts", where,
                                     zero_is_none=True)
            shared = n_shared * ffn if n_shared else None
            used["shared_expert_ffn"] = "n_shared_experts"
        elif model_type == "ernie4_5_moe":  # one MLP of moe_num_shared_experts x moe_intermediate_size (shared_experts)
            n_shared = _positive_int(cfg, "moe_num_shared_experts", where, zero_is_none=True)
            shared = n_shared * ffn if n_shared and isinstance(ffn, int) else None
            used["shared_expert_ffn"] = "moe_num_shared_experts"
        first_dense, moe_step = _dense_between(cfg, model_type, where, layers)
        if first_dense or moe_step:  # the dense blocks' MLP: intermediate_size (Qwen-MoE's, GLM-4.5's), Llama 4's _mlp
            dense_key = "intermediate_size_mlp" if model_type == "llama4_text" else "intermediate_size"
            dense_ffn = _get(cfg, (dense_key,), "dense_ffn_hidden", where, used=used)
            used.update(first_dense_layers="first_k_dense_replace" if model_type in DEEPSEEK_STYLE else "mlp_only_layers",
                        moe_layer_step="decoder_sparse_step")
            if model_type == "ernie4_5_moe":
                used.update(first_dense_layers="moe_layer_start_index", moe_layer_step="moe_layer_interval")
    tied = cfg.get("tie_word_embeddings")
    if tied is None:
        tied = _TIED_DEFAULT[model_type]
    elif not isinstance(tied, bool):  # "false" would read as tied
        raise ValueError(f"{where}: tie_word_embeddings must be true or false, got {tied!r}")
    head_dim = cfg.get("head_dim")
    if isinstance(head_dim, int) and isinstance(heads, int) and heads and head_dim * heads == hidden:
        head_dim = None  # the default; keep the spec minimal
    mla = _latent_attention(cfg, where, used) if model_type in MLA_TYPES else {}
    if mla:  # a query/key head's whole width, whatever hidden / heads is
        head_dim = mla.pop("head_dim")

    arch = "llama" if model_type in LLAMA_LIKE else "gpt"
    max_seq_len = cfg.get(table) if table else None  # GPT-2's, GPT-BigCode's (StarCoder 1) and OPT's learned tables
    # RoPE base (the model, not its cost): the config's, else transformers' default for the type (10000;
    # Gemma3TextConfig: 1000000 for its global layers)
    rope_theta = None
    alibi = model_type in ALIBI or (model_type == "falcon" and cfg.get("alibi") is True)
    if arch == "llama" or (model_type not in LEARNED_POSITIONS and not alibi):
        rope_theta = cfg.get("rotary_emb_base" if model_type == "gpt_neox" else "rope_theta")  # GPTNeoXConfig's name
        params = cfg.get("rope_parameters")  # the newer layout: {"rope_type": ..., "rope_theta": ...}
        if isinstance(params, dict) and isinstance(params.get("full_attention"), dict):
            params = params["full_attention"]  # per layer type (OLMo 3): the full-attention layers' base
        if rope_theta is None and isinstance(params, dict) and isinstance(params.get("rope_theta"), (int, float)):
            rope_theta = params["rope_theta"]
        if rope_theta is None and model_type == "gemma3_text":
            rope_theta = 1e6
    context = _context(cfg, where)
    if cfg.get("_name_or_path"):
        name = cfg["_name_or_path"]
    elif where == "config dict":
        name = model_type
    else:  # .../Llama-3-8B/config.json -> Llama-3-8B; .../gpt2.json -> gpt2
        name = Path(where).parent.name if Path(where).name == "config.json" else Path(where).stem
    base_note = {
        "qwen3": "per-head q/k norms' weights not counted",
        "qwen3_moe": "per-head q/k norms' weights not counted",
        "qwen2_moe": "the shared expert's sigmoid gate not counted",
        "llama4_text": "its NoPE layers as rotary ones (parplan's runtime rotates them: the cost is the same), and its "
                       "q/k L2 norms (no weights) in every layer, not its rotary ones only",
        "dots1": "q/k norms' weights not counted; routed by sigmoid scores with a bias, costed as softmax top-k",
        "glm4_moe": "q/k norms' weights (where use_qk_norm) and the multi-token-prediction layers "
                    "(num_nextn_predict_layers) not counted; routed by sigmoid scores with a bias, costed as softmax "
                    "top-k",
        "olmo2": "q/k norms' weights not counted",
        "phi3": "fused qkv and gate_up counted as separate matrices",
        "internlm2": "fused wqkv counted as separate matrices",
        "gemma": "GeGLU counted as 3 matrices like SwiGLU",
        "gemma2": "GeGLU counted as 3 matrices like SwiGLU",
        "gemma3_text": "GeGLU counted as 3 matrices like SwiGLU; q/k norms' weights not counted",
        "gpt_neox": "gpt blocks with rotary positions (over the whole head, not rotary_pct of it); parallel "
                    "attention + MLP run one after the other",
        "olmo": "its non-parametric LayerNorms counted as RMSNorm weights (2 h a layer + h)",
        "olmo3": "q/k norms' weights not counted",
        "exaone4": "q/k norms' weights not counted",
        "glm4": "fused gate_up counted as separate "
                "matrices",
        "cohere": "attention and MLP side by side on one LayerNorm (parallel_block)",
        "cohere2": "attention and MLP side by side on one LayerNorm (parallel_block)",
        "stablelm": "LayerNorm biases not counted (h a norm)",
        "nemotron": "gpt blocks with rotary positions; its squared-ReLU MLP as gpt's two matrices; LayerNorm1p "
                    "as LayerNorm",
        "phi": "gpt blocks with rotary positions; attention and MLP side by side on one LayerNorm (parallel_block); "
               "the output layer's bias not counted (vocab)",
        "gptj": "gpt blocks with rotary positions; attention and MLP side by side on one LayerNorm (parallel_block); "
                "q/k/v and output projections without biases counted with them; the output layer's bias not counted "
                "(vocab)",
        "starcoder2": "gpt blocks with rotary positions",
        "gpt_bigcode": "gpt blocks (multi-query attention where multi_query is set)",
        "bloom": "gpt blocks; ALiBi costed as rotary positions (no table either way); the embedding's LayerNorm "
                 "not counted (2 h)",
        "mpt": "gpt blocks; ALiBi costed as rotary positions (no table either way)",
        "opt": "gpt blocks (ReLU MLP as GeLU's); the position table's 2 offset rows not counted",
        "gpt_oss": "attention sinks (a learned logit a head) and the q/k/v/o, router and experts' biases not counted "
                   "(2 ffn + h a layer and expert for the experts': 0.03 % of gpt-oss-120b); its clamped SwiGLU "
                   "(swiglu_limit) costed as SwiGLU; routed by a softmax over the top-k logits, costed as softmax top-k",
        "minimax_m2": "q/k norms' weights over all heads' width ((heads + kv_heads) x head_dim a layer) not counted; routed by "
                      "sigmoid scores with a correction bias (e_score_correction_bias, not counted), costed as softmax "
                      "top-k",
        "olmoe": "q/k norms' weights (h + kv width a layer) not counted",
        "phimoe": "LayerNorms counted as RMSNorms, their biases not counted (2 h a layer + h); its SparseMixer router "
                  "costed as softmax top-k",
        "granitemoe": "routed by a softmax over the top-k logits, costed as softmax top-k",
        "granitemoeshared": "routed by a softmax over the top-k logits, costed as softmax top-k",
        "hunyuan_v1_moe": "per-head q/k norms' weights (2 x head_dim a layer) not counted",
    }.get(model_type)
    notes = [base_note] if base_note else []
    classes = cfg.get("architectures")
    if isinstance(classes, list) and classes and all(isinstance(c, str) and not c.endswith(LM_HEAD_CLASSES)
                                                     for c in classes):
        # a headless checkpoint (Qwen3Model as a text encoder) or another head (ForSequenceClassification): parplan
        # trains next-token prediction, so its count and plan hold a vocab head and its loss (+26 % of a 0.6B
        # headless untied Qwen3's parameters)
        notes.append(f"architectures {', '.join(classes)}: no language-model head in the checkpoint; planned with "
                     "one (parplan trains next-token prediction: a vocab head and its loss)")
    if model_type in MLA_TYPES:
        notes += _deepseek_notes(cfg, model_type)
    if model_type == "ernie4_5_moe":
        notes += _ernie_notes(cfg)
    mtp = cfg.get("num_mtp_modules")
    if model_type == "minimax_m2" and cfg.get("use_mtp", True) and isinstance(mtp, int) and not isinstance(mtp, bool) \
            and mtp > 0:  # MiniMax-M2's three multi-token-prediction modules (not in transformers' MiniMaxM2)
        notes.append(f"the multi-token-prediction modules (num_mtp_modules {mtp}) not counted nor planned unless "
                     f"asked: --mtp-layers {mtp} (--framework megatron)")
    if model_type == "olmoe" and cfg.get("clip_qkv"):
        notes.append(f"clip_qkv {cfg['clip_qkv']}: q, k and v clamped (pointwise; the cost is the same)")
    if model_type == "phimoe" and cfg.get("lm_head_bias"):
        notes.append("lm_head_bias: the output layer's bias not counted (vocab)")
    if wrapper:
        notes.append(f"the language model of a {wrapper} config (its text_config): the vision tower is not counted")
    no_bias = _biasless(cfg, model_type)
    if no_bias:  # parplan's gpt blocks hold biases on every linear and both LayerNorms
        notes.append(f"{no_bias}: the checkpoint has no linear biases, gpt blocks count them (about 4 h + ffn a layer)")
    if model_type == "falcon":
        if cfg.get("alibi") is True:
            notes.append("ALiBi costed as rotary positions (no table either way)")
        if has_parallel_block(cfg, model_type):
            notes.append("attention and MLP side by side on one LayerNorm (parallel_block)")
        elif cfg.get("parallel_attn", True):
            notes.append("attention and MLP side by side on two LayerNorms (the new decoder architecture), planned as "
                         "sequential blocks (the same count)")
    if model_type == "stablelm" and has_parallel_block(cfg, model_type):
        notes.append("use_parallel_residual: attention and MLP side by side on one LayerNorm (parallel_block)")
    if model_type == "mpt":
        notes.append("its LayerNorms without biases counted with them (2 h a layer + h)")
    if model_type == "opt" and cfg.get("do_layer_norm_before") is False:
        notes.append("do_layer_norm_before false: LayerNorms after each sublayer and no final one (counted, 2 h)")
    if model_type == "opt" and cfg.get("word_embed_proj_dim") not in (None, hidden):
        notes.append(f"word_embed_proj_dim {cfg['word_embed_proj_dim']}: the embedding's projections in and out "
                     "not counted (the embedding counted at the hidden width)")
    if model_type == "smollm3" and isinstance(cfg.get("no_rope_layers"), list):
        nope = sum(1 for x in cfg["no_rope_layers"] if x == 0)
        if nope:
            notes.append(f"{nope} layers without rotary positions (NoPE); parplan's runtime rotates every layer "
                         "(the cost is the same)")
    if model_type in ("cohere", "hunyuan_v1_dense") and (cfg.get("use_qk_norm") or cfg.get("qk_layernorm")):
        notes.append("q/k norms' weights not counted")
    if model_type in ("stablelm", "phi") and cfg.get("qk_layernorm"):
        notes.append("q/k LayerNorms' weights not counted")
    bias_keys = ("attention_bias", "mlp_bias", "bias", "use_qkv_bias", "use_bias")  # use_bias: ERNIE 4.5's
    counted = ("attention_bias",) if has_qkv_bias(cfg, model_type) else ()  # (ModelSpec.qkv_bias: counted)
    if arch == "llama" and model_type not in ("qwen2", "qwen2_moe", "gpt_oss") and any(
            cfg.get(k) for k in bias_keys if k not in counted):
        which = " and ".join(k for k in bias_keys if cfg.get(k) and k not in counted)
        bias_note = f"{which} not counted (llama blocks have no biases)"
        notes.append(bias_note)
    quant = cfg.get("quantization_config")
    if model_type in ("gpt_oss", "minimax_m2") and isinstance(quant, dict) and quant.get("quant_method"):
        # the released gpt-oss checkpoints hold the experts' weights in MXFP4, MiniMax-M2's its linears in FP8 blocks;
        # training runs them in 16 bits
        notes.append(f"quantization_config ({quant['quant_method']}): the checkpoint's quantized weights planned as "
                     "16-bit training weights")
    if model_type in ("qwen2", "qwen3") and cfg.get("use_sliding_window"):
        # Qwen's layers from max_window_layers on attend within sliding_window (Qwen2Config / Qwen3Config defaults:
        # 28 and 4096): not a pattern ModelSpec can say
        first = cfg.get("max_window_layers", 28)
        if isinstance(first, int) and isinstance(layers, int) and 0 <= first < layers:
            notes.append(f"use_sliding_window: layers {first + 1}..{layers} attend within "
                         f"{cfg.get('sliding_window') or 4096} tokens in transformers; counted as full attention")
    if model_type == "gemma2" and cfg.get("attn_logit_softcapping"):
        # the soft-cap is pointwise on the scores: a fused kernel must implement it, and where it does not (torch's
        # SDPA) transformers runs eager attention, which keeps the s x s scores
        cap_note = ("attn_logit_softcapping: planned with a fused attention kernel that applies it; eager attention "
                    "would keep s x s scores per head (plan with --no-flash-attention for that)")
        notes.append(cap_note)
    partial = cfg.get("partial_rotary_factor")
    if partial is None and isinstance(cfg.get("rope_parameters"), dict):
        partial = cfg["rope_parameters"].get("partial_rotary_factor")
    if model_type == "gptj" and isinstance(cfg.get("rotary_dim"), int) and isinstance(hidden, int) \
            and isinstance(heads, int) and 0 < heads <= hidden:  # GPT-J rotates rotary_dim channels of each head
        partial = cfg["rotary_dim"] / (hidden // heads)
    if model_type == "minimax_m2" and partial is None and isinstance(cfg.get("rotary_dim"), int) \
            and isinstance(cfg.get("head_dim"), int) and cfg["head_dim"] > 0:  # MiniMaxM2Config: rotary_dim / head_dim
        partial = cfg["rotary_dim"] / cfg["head_dim"]
    if (arch == "llama" or model_type in ("gptj", "phi", "nemotron")) and isinstance(partial, (int, float)) \
            and 0 < partial < 1:
        part_note = f"partial_rotary_factor {partial:g}: parplan's runtime rotates the whole head (the cost is the same)"
        notes.append(part_note)
    scaling = cfg.get("rope_scaling")
    params = cfg.get("rope_parameters")
    if not (isinstance(scaling, dict) and scaling) and isinstance(params, dict) \
            and params.get("rope_type") not in (None, "default"):
        scaling = params
    if arch == "llama" and isinstance(scaling, dict) and scaling:
        kind = scaling.get("rope_type") or scaling.get("type") or "?"
        scaling_note = f"rope_scaling ({kind}) not applied by parplan's runtime (the cost is the same)"
        notes.append(scaling_note)
    # MistralConfig's default window is 4096 where the file has no key (an explicit null: none); Phi-3 builds its
    # attention on Mistral's (transformers' modular_phi3.py), every layer within its window
    window = None
    if model_type in ("mistral", "phi3", "gemma2", "gemma3_text", "starcoder2", "ministral", "olmo3", "cohere2",
                      "exaone4", "gpt_oss", "phimoe"):
        window = _positive_int(cfg, "sliding_window", where, zero_is_none=True) if "sliding_window" in cfg \
            else 4096 if model_type == "mistral" else None
    # the window as ModelSpec carries it: every full_every-th layer (from 1) attends in full, the others within the
    # window (Megatron-LM's --window-attn-skip-freq); None with a window: every layer within it
    full_every, irregular, local = None, False, ""
    kinds = cfg.get("layer_types")
    pattern = cfg.get("sliding_window_pattern")
    if not (isinstance(kinds, list) and kinds) and isinstance(pattern, str) and pattern and set(pattern) <= {"L", "G"} \
            and isinstance(layers, int) and layers <= SHAPE_MAX:  # EXAONE 4's "LLLG": local, local, local, global
        kinds = ["sliding_attention" if pattern[i % len(pattern)] == "L" else "full_attention" for i in range(layers)]
    if not (isinstance(kinds, list) and kinds) and model_type == "gpt_oss" and isinstance(layers, int) \
            and layers <= SHAPE_MAX:  # GptOssConfig's default layer_types: blocks 0, 2, 4, ... within the window
        kinds = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    if not window or window >= SHAPE_MAX:  # none, or one no sequence the planner takes reaches (1e30 had been carried
        window = None  # into the plan as a 31-digit integer): full attention either way
    elif model_type in ("mistral", "phi3", "starcoder2", "phimoe") or (model_type == "ministral" and not kinds):
        local = "all layers"  # Mistral 7B v0.1, Phi-3 4k, StarCoder2, Phi-3.5-MoE: every layer within the window
    elif isinstance(kinds, list) and kinds:
        local = f"{sum(k == 'sliding_attention' for k in kinds)} of {len(kinds)} layers"
        full_at = [i + 1 for i, k in enumerate(kinds) if k != "sliding_attention"]
        if full_at:
            full_every = full_at[0]
            irregular = any(((i + 1) % full_every == 0) != (k != "sliding_attention") for i, k in enumerate(kinds))
    elif model_type == "gemma2":  # even layers (from 0) local, odd global
        local, full_every = "half the layers", 2
    else:
        # Gemma 3's default 6; OLMo 3's, Command R7B's (cohere2) and EXAONE 4's classes: every 4th layer in full
        pattern = _positive_int(cfg, "sliding_window_pattern", where) or (4 if model_type in ("olmo3", "cohere2",
                                                                                                "exaone4") else 6)
        local, full_every = f"{pattern - 1} of every {pattern} layers", pattern
    if window and seq_len and seq_len > window:
        if irregular:
            how = "counted as full attention by every framework (a pattern ModelSpec cannot say)"
        else:
            how = (f"counted as full attention at seq_len {seq_len} under --framework torchtitan (but its gpt_oss "
                   "model), deepspeed and fsdp, which attend over the whole prefix (parplan's runtime and Megatron-LM "
                   "train the window)")
        window_note = f"{local} attend within a {window}-token window, {how}"
        notes.append(window_note)
    if irregular:
        window, full_every = None, None
    chunk = None
    if model_type == "llama4_text" and cfg.get("attention_chunk_size", 8192) is not None:
        # Llama4TextConfig: attention_chunk_size (default 8192) in the rotary layers, no_rope_layers[i] 1 (default:
        # every nope_layer_interval-th layer from 1, 4, a NoPE layer of full attention, 0)
        chunk = _positive_int(cfg, "attention_chunk_size", where) if "attention_chunk_size" in cfg else 8192
        rope = cfg.get("no_rope_layers")
        if isinstance(rope, list) and rope:
            full_at = [i + 1 for i, r in enumerate(rope) if not r]
            full_every = full_at[0] if full_at else None
            if full_every and any(((i + 1) % full_every == 0) != (not r) for i, r in enumerate(rope)):
                notes.append("no_rope_layers: chunked attention in a pattern ModelSpec cannot say, counted as full "
                             "attention")
                chunk, full_every = None, None
        else:
            full_every = _positive_int(cfg, "nope_layer_interval", where) if "nope_layer_interval" in cfg else 4
        if chunk and chunk >= SHAPE_MAX:
            chunk, full_every = None, None
        if chunk and seq_len and seq_len > chunk:
            notes.append(f"its rotary layers attend within {chunk}-token chunks (attention_chunk), counted under "
                         "--framework parplan, whose runtime trains them, and as full attention elsewhere")
    if context and seq_len and seq_len > context and not table:  # a learned table caps it (the CLI)
        beyond = f"seq_len {seq_len} beyond the checkpoint's context {context} (a context extension)"
        notes.append(beyond)
    source = f"Hugging Face config {where} (model_type {model_type}" + (f", context {context}" if context else "") + \
             ("; " + "; ".join(notes) if notes else "") + ")"

    from pydantic import ValidationError

    try:
        spec = ModelSpec(name=name, arch=arch, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                         ffn_hidden=ffn, vocab=vocab, head_dim=head_dim, tied_embeddings=bool(tied),
                         max_seq_len=max_seq_len, rope_theta=rope_theta, source=source,
                         learned_positions=None if arch == "llama" or table else False,
                         sliding_window=window, full_attention_every=full_every, attention_chunk=chunk,
                         experts=experts,
                         experts_per_token=top_k, shared_expert_ffn=shared, first_dense_layers=first_dense,
                         moe_layer_step=moe_step, dense_ffn_hidden=dense_ffn,
                         qk_norm=True if not mla and has_qk_norm(cfg, model_type) else None,
                         qk_norm_whole=True if not mla and has_qk_norm(cfg, model_type)
                         and model_type in QK_NORM_WHOLE else None,
                         post_norms=True if model_type in POST_NORMS else None,
                         norms_after=True if model_type in NORMS_AFTER else None,
                         qkv_bias=True if has_qkv_bias(cfg, model_type) else None,
                         parallel_block=True if has_parallel_block(cfg, model_type) else None, **mla)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        if loc in used:  # name the key to fix in the file, and parplan's field it fills
            loc = f"{used[loc]} (parplan's {loc})"
        raise ValueError(f"{where}: {loc + ': ' if loc else ''}{error_message(err)}; correct it in the config") from None
    return with_param_count(spec, seq_len)
