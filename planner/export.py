"""Export a Plan as a launch configuration for Megatron-LM, Megatron-Bridge, torchtitan or DeepSpeed.

``export_plan(plan, to)`` returns text in the target tool's own names; ``export_notes(plan, to)``
lists what could not be expressed exactly (the same notes appear as ``# note:`` lines in the
Megatron, Megatron-Bridge and torchtitan outputs; JSON has no comments, so for DeepSpeed the caller should print
them to stderr).  Nothing the plan asks for is dropped silently: either it maps onto a flag/key or
it produces a note.

Flag and key names were matched against these sources (read through the project's code index;
the index gives commit hashes, not dates):

* Megatron-LM -- ``NVIDIA/Megatron-LM``, ``megatron/training/arguments.py`` at commit
  ``000c4ac24f61159c138b0975def722c65245983c`` (a 2025 tree after Megatron-Core v0.14: it already
  has ``--dist-ckpt-save-pre-mcore-014``, ``--attention-backend``, ``--use-megatron-fsdp``,
  ``--pipeline-model-parallel-layout``, ``--decoder-first/last-pipeline-num-layers``,
  ``--num-virtual-stages-per-pipeline-rank``, ``--optimizer-cpu-offload``; multi-head latent attention's
  ``--multi-latent-attention`` and ``_add_mla_args``: ``--q-lora-rank``, ``--kv-lora-rank``, ``--qk-head-dim`` (the
  no-rope part), ``--qk-pos-emb-head-dim``, ``--v-head-dim``).  The layout grammar
  (``E``/``t``/``L``, ``|`` between stages, ``x*n`` repetition, flat list in virtual-stage order
  ``vpp_rank * pp + pp_rank``) is from ``megatron/core/transformer/pipeline_parallel_layer_layout.py``
  at commit ``00caa53af30912914981c86f39db123961678bbd``.
* Megatron-Bridge -- ``NVIDIA-NeMo/Megatron-Bridge``: the Megatron-LM flags above mapped onto its ConfigContainer's
  fields as KEY=VALUE overrides for ``scripts/training/run_recipe.py`` (commit ``10feab50``), field names from
  ``src/megatron/bridge/training/config.py`` (commit ``4feb11f8``), ``models/gpt_provider.py`` (``0254ddd4``),
  ``training/mixed_precision.py`` (``05097809``) and the other files listed at ``_BRIDGE_KEYS``, with the recipes'
  names from their families' ``__init__.py``; checked against the sources, not run.
* torchtitan -- ``pytorch/torchtitan``, ``torchtitan/config/job_config.py`` at commit
  ``000204a4a8bf3d0f31adc44fc29855fbb6ea13d8`` (the TOML ``JobConfig`` with ``[training]
  local_batch_size/global_batch_size/seq_len/steps/mixed_precision_param``, ``[parallelism]
  data_parallel_{replicate,shard}_degree, fsdp_reshard_after_forward, tensor_parallel_degree,
  enable_async_tensor_parallel, pipeline_parallel_{degree,split_points,schedule,microbatch_size},
  context_parallel_degree`` and ``[activation_checkpoint] mode/selective_ac_option``), the section
  layout of ``torchtitan/models/llama3/train_configs/llama3_70b.toml`` (commit ``038d5fd1``) and the
  flavor table in ``torchtitan/models/llama3/__init__.py`` (commit ``00f555e1``).  torchtitan 0.3.0 (its release
  notes: "typed Python configuration") and main describe runs with Python ``Trainer.Config`` functions (``torchtitan/config/README.md``,
  commit ``1b4a5caf``), renames the micro-batch knob to ``num_pp_microbatches``
  (``torchtitan/config/parallelism.py``, commit ``15e24313``) and counts the batch in tokens
  (``num_tokens_per_microbatch_per_dp_rank``, ``num_tokens_per_train_step``, ``max_context_length``:
  ``torchtitan/config/training.py``, commit ``f204eb63``); the TOML below targets the
  TOML-configured releases.  Schedule names are ``torch.distributed.pipelining`` class names
  (``GPipe``, ``1F1B``, ``Interleaved1F1B``, ``InterleavedZeroBubble``, ``ZBVZeroBubble``).
* DeepSpeed -- the configuration reference page https://www.deepspeed.ai/docs/config-json/
  (``train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps * data-parallel
  GPUs``, ``zero_optimization.stage``, ``zero_optimization.offload_optimizer.device``,
  ``bf16.enabled``, ``fp16.enabled``, ``gradient_clipping``); the page carries no version stamp.
"""
from __future__ import annotations

import json
import math
import re
import shlex
from typing import Any, NamedTuple, Optional

from cost_models import zero3
from cost_models.compute import plan_overlaps_param_gather
from cost_models.layout import ModelDims, model_stage_layers, titan_layer_sac_freq
from cost_models.memory import deepspeed_bf16_optimizer_steps
from planner import ADAMW_BETAS, ADAMW_WEIGHT_DECAY
from planner.hf_config import checkpoint_differences
from planner.core import (CHUNK_FRAMEWORKS, DOCUMENT_FRAMEWORKS, FORMAT_FRAMEWORK as _CORE_FORMAT_FRAMEWORK, MOE_SHAPE, default_stage_layers,
                          deepspeed_bf16_optimizer, preset_moe_shape, trains_window)
from planner.schema import Plan
from planner.toml_text import toml_value

# every export target and the framework whose prediction it runs (Megatron-Bridge runs Megatron-Core, so a plan made
# with --framework megatron is its own)
FORMAT_FRAMEWORK: dict[str, str] = dict(_CORE_FORMAT_FRAMEWORK)
FORMATS: tuple[str, ...] = tuple(FORMAT_FRAMEWORK)

__all__ = ["FORMATS", "export_plan", "export_notes", "export_problem", "framework_note"]


def export_plan(plan: Plan, to: str) -> str:
    """The plan as a Megatron-LM argument list, Megatron-Bridge KEY=VALUE overrides, a torchtitan TOML file, a
    DeepSpeed ds_config JSON or an llm-foundry training YAML."""
    text, _ = _build(plan, to)
    return text


def export_notes(plan: Plan, to: str) -> list[str]:
    """What the export to ``to`` had to approximate or leave to the user, one sentence each."""
    _, notes = _build(plan, to)
    return notes


def _build(plan: Plan, to: str) -> tuple[str, list[str]]:
    key = (to or "").strip().lower()
    builders = {"megatron": _megatron, "megatron-bridge": _megatron_bridge, "torchtitan": _torchtitan,
                "torchtitan-0.2": lambda plan: _torchtitan(plan, "0.2"), "deepspeed": _deepspeed,
                "llm-foundry": _llm_foundry}
    if key not in builders:
        raise ValueError(f"unknown export format {to!r}; choose one of: {', '.join(FORMATS)}")
    problem = export_problem(plan, key)
    if problem:
        raise ValueError(problem)
    text, notes = builders[key](plan)
    return text, (notes + _post_norms_note(plan.model) + _parallel_block_note(plan) + _documents_note(plan, to)
                  + _chunks_note(plan, to))


def _chunks_note(plan: Plan, to: str) -> list[str]:
    """Chunked attention (ModelSpec.attention_chunk: Llama 4's), which no exported model here builds (torchtitan's
    llama4 has it in its _irope flavors only, not the ones its export picks)."""
    m, t = plan.model, plan.training
    if not m.chunk_binds(t.seq_len):
        return []
    counted = ("which this plan's prediction (for parplan, whose runtime trains the chunks) does not count"
               if t.framework in CHUNK_FRAMEWORKS else "as the prediction counts it")
    where = (" (torchtitan's llama4 _irope flavors train them: every_n_layers_nope, FlexAttention)"
             if to.startswith("torchtitan") else "")
    return [f"attention_chunk {m.attention_chunk}: the exported model attends over the whole prefix in its "
            f"{m.chunked_layers} chunked layers, {counted}{where}."]


# what each export target does with packed documents (Training.document_length)
_DOCUMENT_WAYS = {
    "torchtitan": "torchtitan skips the attention across them with FlexAttention under its block_causal mask, built "
                  "from the data's end-of-document tokens: register a flavor with use_flex_attn (attn_type \"flex\" "
                  "in later releases) and attn_mask_type \"block_causal\"",
    "megatron": "Megatron-LM's --reset-attention-mask (with --reset-position-ids) masks them with a dense (b, 1, s, "
                "s) attention mask, planned as full causal attention (the mask's sparsity not timed); packed THD "
                "sequences (Megatron-Core's packed_seq_params, cu_seqlens: Megatron-Bridge's packed datasets) skip "
                "them, which the plan does not count under --framework megatron",
    "deepspeed": "Megatron-DeepSpeed's --reset-attention-mask masks them with a dense attention mask, planned as full "
                 "causal attention",
    "llm-foundry": "llm-foundry masks them only with its sequence-id attention (attn_uses_sequence_id), computed "
                   "whole by its kernels"}


def _documents_note(plan: Plan, to: str) -> list[str]:
    """Packed documents (Training.document_length): what the target does with them, against what the plan counts
    (planner.core.DOCUMENT_FRAMEWORKS)."""
    d, t = plan.training.document_length, plan.training
    if not d or d >= t.seq_len:
        return []
    counted = ("the plan counts each document's own attention (skipped across them)" if t.framework in
               DOCUMENT_FRAMEWORKS else "the plan counts full causal attention (the cross-document pairs computed)")
    way = _DOCUMENT_WAYS.get(to.split("-")[0], "")
    return [f"document_length {d}: packed documents of {d} tokens, {counted}" + (f"; {way}" if way else "") + "."]


def _parallel_block_note(plan: Plan) -> list[str]:
    """A model whose attention and MLP run side by side on one norm (ModelSpec.parallel_block), which no exported
    framework builds: Megatron-LM's, torchtitan's, DeepSpeed's and llm-foundry's blocks are sequential."""
    if not plan.model.parallel_block:
        return []
    counted = ("which this plan's prediction (for parplan, whose runtime builds the parallel block) does not count: "
               "one norm, its saved input and output and one tensor-parallel collective a direction more"
               if plan.training.framework == "parplan" else "as the prediction counts it")
    return ["parallel_block: the model runs attention and MLP side by side on one norm (GPT-J, Command R), which the "
            f"exported model builds one after the other on two norms, {counted}; another model's numbers "
            "(`parplan launch` trains the parallel block)."]


def _post_norms_note(m) -> list[str]:
    """A plan that counts post-norms (ModelSpec.post_norms), which no exported model builds: Megatron-LM's GPT layer
    spec has none and no flag adds them (NeMo's Gemma 2 spec puts one in a custom row-parallel linear), torchtitan's
    llama3, DeepSpeed's and llm-foundry's exported models neither; nor the norms after the sublayers in place of the
    input norms (ModelSpec.norms_after)."""
    if m.norms_after:  # (ModelSpec.norms_after: OLMo 2 / 3, EXAONE 4)
        return ["norms_after: the model's two norms sit on the sublayers' outputs (OLMo 2's order), which the exported "
                "model builds on their inputs: the same count (and the same saved bytes in parplan's runtime), another "
                "model's numbers."]
    if not m.post_norms:
        return []
    return ["post_norms: the plan counts a norm on each sublayer's output (Gemma 2 / 3, GLM-4), which the exported "
            "model does not build: it saves 2 x hidden values and two fp32 statistics a token and layer fewer than "
            "planned, and makes two memory-bound passes fewer (`--no-post-norms` plans that model)."]


def export_problem(plan: Plan, to: str) -> str | None:
    """Why the plan cannot be exported to `to` (one line with the fix), or None: a mixture of experts and multi-head
    latent attention go to Megatron-LM (and Megatron-Bridge, which runs the same Megatron-Core) only, as every other
    builder would write a model of the plan's blocks with the experts dropped or ordinary attention in place of the
    latent one."""
    megatron_core = ("megatron", "megatron-bridge")
    if plan.model.kv_lora_rank is not None and to not in megatron_core + ("torchtitan", "torchtitan-0.2"):
        return (f"{plan.model.name or 'the model'} has multi-head latent attention (kv_lora_rank "
                f"{plan.model.kv_lora_rank}), planned and exported for Megatron-LM (--multi-latent-attention) and "
                "torchtitan (its deepseek_v3) only; use --to megatron (or megatron-bridge), or torchtitan-0.2")
    if plan.model.kv_lora_rank is not None and not plan.model.is_moe and to.startswith("torchtitan"):
        return (f"{plan.model.name or 'the model'} has multi-head latent attention without experts: torchtitan's "
                "deepseek_v3 builds it as a mixture of experts only; use --to megatron")
    if plan.model.is_moe and to == "torchtitan":
        return (f"{plan.model.name or 'the model'} is a mixture of experts, and torchtitan's TOML at commit 000204a4 "
                "(torchtitan 0.1) has no expert parallelism in its job config (its MoE models were experiments then); "
                "use --to torchtitan-0.2 (expert_parallel_degree, its qwen3 / llama4 / gpt_oss models), or --to "
                "megatron")
    if plan.model.is_moe and to not in megatron_core + ("torchtitan-0.2",):
        return (f"{plan.model.name or 'the model'} is a mixture of experts, planned and exported for Megatron-LM and "
                "torchtitan only (cost_models/moe.py); use --to megatron (or megatron-bridge), or torchtitan-0.2")
    return None


# How the cost model's framework-decided behaviours (TrainingConsts fields no flag sets) read to a user
_BEHAVIOURS = {
    "zero3_fsdp2": "ZeRO-3 as FSDP2",
    "zero3_gather_copy_out": "FSDP2's copy of each gather into the unsharded weights",
    "ddp_bucket_copy": "DDP's buckets as a second copy of the gradients",
    "ddp_reduces_each_microbatch": "DDP all-reducing every micro-batch",
    "zero3_one_weight_ahead": "ZeRO-3 gathering one weight ahead",
    "p2p_blocking_transfers": "four blocking pipeline transfers a micro-batch",
    "p2p_buffers_per_microbatch": "a pipeline receive buffer per micro-batch",
    "p2p_sends_held_to_step_end": "pipeline sends held to the step's end",
    "sp_saves_gathered_input": "sequence parallelism saving gathered matmul inputs",
    "cp_saves_gathered_kv": "context parallelism saving the gathered K/V",
    "cp_overlap_local_chunk_only": "ring attention overlapping the local chunk only",
    "ce_eager_chunks": "16-bit-gradient cross-entropy in chunks of eager kernels",
    "moe_input_gathered": "the MoE layer's input gathered over the tensor-parallel ranks",
}


def framework_differences(plan: Plan, to: str) -> list[str]:
    """What the cost model does differently for framework ``to`` than for the plan's: the stack flags whose
    defaults differ ("name a -> b") and the behaviours the framework itself decides."""
    from planner.core import FRAMEWORK_DEFAULTS, STACK_FLAGS, training_consts
    from planner.schema import Training
    tr = plan.training
    flags = {k: getattr(tr, k) for k in STACK_FLAGS}
    flags.update({k: Training.model_fields[k].default for k in FRAMEWORK_DEFAULTS.get(tr.framework, {})})
    flags.update(FRAMEWORK_DEFAULTS[to])
    target = tr.model_copy(update={"framework": to, **flags})
    out = [f"{k} {getattr(tr, k)} -> {flags[k]}" for k in STACK_FLAGS if flags[k] != getattr(tr, k)]
    a, b = training_consts(tr), training_consts(target)
    out += [f"{'no ' if not getattr(b, k) else ''}{name}" for k, name in _BEHAVIOURS.items()
            if getattr(a, k) != getattr(b, k)]
    if a.fp8 != b.fp8:  # whose FP8 linears the model times and counts (TrainingConsts.fp8)
        out.append({"te": "FP8 linears as Transformer Engine runs them", "torchao": "FP8 linears as torchao's float8",
                    "": "no FP8 linears (none in that framework's model)"}[b.fp8])
    if not flags["fused_elementwise"] and a.eager_runtime != b.eager_runtime:  # which eager op table counts
        out.append(f"{b.eager_runtime}'s eager pointwise ops")
    return out


def framework_note(plan: Plan, to: str) -> Optional[str]:
    """A sentence when the plan was predicted for another framework than the export target: what the cost
    model would do differently there, and the command that predicts with it."""
    planned_for = plan.training.framework
    fw = FORMAT_FRAMEWORK.get(to, to)
    if planned_for == fw:
        return None
    diff = framework_differences(plan, fw)
    return (f"the plan's prediction models {planned_for}, not {fw}"
            + (f" ({fw}: {'; '.join(diff)})" if diff else "")
            + f"; `parplan recommend ... --framework {fw}` predicts with {fw}'s defaults")


# --------------------------------------------------------------------------------------------
# shared helpers

def plan_stage_layers(plan: Plan) -> list[int]:
    """Transformer blocks per virtual stage, in virtual-stage order (pp*vpp entries): the plan's, or the split
    the cost model predicted (cost_models.layout.stage_layers)."""
    own = plan.parallel.stage_layers
    return list(own) if own is not None else default_stage_layers(plan)


# megatron/core/datasets/gpt_dataset.py MockGPTLowLevelDataset: arange(length - 1) + 1 for lengths below
# max_sequence_length = 4096, so ids reach 4094
MOCK_DATA_MAX_TOKEN = 4094


def _train_steps(plan: Plan) -> Optional[int]:
    t = plan.training
    if t.tokens is None:
        return None
    return max(1, math.ceil(t.tokens / (t.global_batch_size * t.seq_len)))


def _nodes(plan: Plan) -> tuple[int, int]:
    """(nodes, ranks per node) for torchrun, which starts the same number on every node: the most that fit
    a node and divide the job (12 GPUs on 8-GPU nodes: 2 x 6)."""
    h = plan.hardware
    per_node = next(d for d in range(min(h.gpus, h.gpus_per_node), 0, -1) if h.gpus % d == 0)
    return h.gpus // per_node, per_node



def _comment_lines(lines: list[str], prefix: str = "# ") -> list[str]:
    return [prefix + line if line else prefix.rstrip() for line in lines]


# --------------------------------------------------------------------------------------------
# Megatron-LM

_MEGATRON_SCHEDULE_NOTES = {
    "gpipe": "schedule gpipe: Megatron-LM has no GPipe schedule; its non-interleaved 1F1B is used "
             "(same bubble, fewer micro-batches in flight, so less activation memory than predicted).",
    "interleaved-zb": "schedule interleaved-zb: Megatron-LM has no interleaved zero-bubble schedule; exported as "
                      "interleaved 1F1B over the same virtual stages, whose bubble is larger than the prediction.",
    "zbv": "schedule zbv: Megatron-LM has no V-shaped zero-bubble schedule; exported as interleaved 1F1B with "
           "2 chunks per rank (chunks placed round-robin, not V-shaped, and weight gradients are not deferred), "
           "so the bubble is larger than the prediction.",
}


def megatron_moe_layer_freq(m) -> str:
    """Megatron-LM's --moe-layer-freq as a pattern (1 an MoE layer, 0 dense; its Python-list-expression form) of a
    mixture of experts with dense blocks between (ModelSpec.is_moe_block): "([0]*3+[1]*58)" for DeepSeek-V3's three
    leading dense blocks, "([0]*1+[1]*1)*24"-style repeats for an interleaved one, else the whole list."""
    flags = [int(m.is_moe_block(i)) for i in range(m.layers)]
    k = m.first_dense_layers or 0
    step = m.moe_layer_step or 1
    if step == 1:
        return f"([0]*{k}+[1]*{m.layers - k})"
    tail = m.layers - k
    if tail % step == 0 and flags[k:] == ([0] * (step - 1) + [1]) * (tail // step):
        return (f"[0]*{k}+" if k else "") + f"([0]*{step - 1}+[1])*{tail // step}"
    return "[" + ",".join(map(str, flags)) + "]"


def _megatron_layout(counts: list[int], mtp: int = 0) -> str:
    """Megatron-LM's --pipeline-model-parallel-layout: E the embedding, t a block, m a multi-token-prediction depth
    (on the last stage, before the loss), L the loss; stages split by '|' in virtual-stage order (every rank's first
    virtual stage, then every rank's second, ...), a stage's symbols repeated with '*' (Megatron-LM's
    docs/api-guide/pipeline_parallel_layout.md: DeepSeek-V3 at pp 16 vpp 2, "Et*3|(tt|)*29,m|L"; its argument's help
    text names E, L, t and m the same way)."""
    stages = []
    last = len(counts) - 1
    for i, n in enumerate(counts):
        body = "t" if n == 1 else (f"t*{n}" if n > 1 else "")
        stages.append(("E" if i == 0 else "") + body + ("m" * mtp + "L" if i == last else ""))
    return "|".join(stages)


# stack flags a Megatron-LM run cannot be told (its asynchronous input-gradient all-reduce:
# --no-async-tensor-model-parallel-allreduce is "DEPRECATED. This flag is ignored"; no flag turns its pipeline
# scatter/gather, its pointwise fusions as a whole or its in-place vocab-parallel cross-entropy off)
_MEGATRON_FIXED = ("p2p_scatter_gather", "async_tp_grad_comm", "fused_elementwise", "fused_cross_entropy")


def _unflagged_megatron(plan: Plan) -> list[str]:
    """Notes where a plan predicted for Megatron-LM sets a stack flag its run cannot follow (a plan for another
    framework gets framework_note instead)."""
    from planner.core import FRAMEWORK_DEFAULTS
    from planner.schema import Training
    t, par = plan.training, plan.parallel
    if t.framework != "megatron":
        return []
    out = []
    for k in _MEGATRON_FIXED:
        default = True if k == "async_tp_grad_comm" else FRAMEWORK_DEFAULTS["megatron"].get(
            k, Training.model_fields[k].default)
        applies = {"p2p_scatter_gather": par.pp > 1 and par.tp > 1 and not par.sp,  # cost_models/total.py: sg
                   "async_tp_grad_comm": par.tp > 1}.get(k, True)
        if getattr(t, k) != default and applies:
            out.append(f"{k} {getattr(t, k)}: Megatron-LM has no flag for it and runs as {k} {default}, so its step "
                       f"differs from the prediction there (`--{k.replace('_', '-')}` predicts that).")
    return out


def _qwen_family(m) -> Optional[str]:
    """Qwen2 (q/k/v biases) or Qwen3 (q/k norms) by the preset's or config's name or source, else None."""
    text = f"{m.name or ''} {m.source or ''}".lower()
    if "qwen3" in text:
        return "Qwen3"
    if "qwen2" in text:
        return "Qwen2"
    return None


_FAMILY_EXTRAS = {"Qwen2": "q/k/v biases", "Qwen3": "per-head q/k RMSNorms",
                  "Gemma": "tanh-GeLU gate (GeGLU), (1 + weight) RMSNorms, embedding scaled by sqrt(hidden) and, "
                           "Gemma 2/3, post-norms",
                  "gpt-oss": "attention sinks, q/k/v/o, router and expert biases, clamped SwiGLU or banded windows"}


def _model_family(m) -> Optional[str]:
    """gpt-oss (a config of model_type gpt_oss, or its presets), else _qwen_family, or Gemma (by the config's or
    preset's name or source), else None."""
    model_type, _ = checkpoint_differences(m.source)
    if model_type == "gpt_oss" or (model_type is None and (m.name or "").lower().startswith("gpt-oss")):
        return "gpt-oss"
    return _qwen_family(m) or ("Gemma" if "gemma" in f"{m.name or ''} {m.source or ''}".lower() else None)


# gpt-oss's blocks beyond the llama ones the plan counts, as Megatron-LM trains them (arguments.py: --softmax-type
# learnable, the attention sinks; --quick-geglu with --glu-linear-offset 1.0 and --activation-func-clamp-value 7.0,
# its clamped SwiGLU, (up + 1) x gate x sigmoid(1.702 gate); add_bias_linear, Megatron's default, with the q/k/v
# biases it implies and the router's bias; NVIDIA's own examples/post_training/modelopt/conf/openai/gpt-oss-120b.sh)
GPT_OSS_MEGATRON = ("gpt-oss: the plan counts llama blocks (SwiGLU, no biases, ordinary softmax attention); "
                    "Megatron-LM trains the real model with --softmax-type learnable (its attention sinks), "
                    "--quick-geglu --glu-linear-offset 1.0 --activation-func-clamp-value 7.0 in place of --swiglu "
                    "(its clamped SwiGLU) and its biases (leave out --disable-bias-linear, with --no-bias-dropout-fusion "
                    "for the experts' grouped GEMM), which the export leaves out: add them for that model (the sinks "
                    "and biases are 0.03 % more parameters than predicted; Megatron-LM's pretrain_gpt.py has no flag "
                    "for its YaRN rope scaling, which costs the same as RoPE).")


def _checkpoint_note(m) -> list[str]:
    """For a model read from a Hugging Face config of a family not noted by name (_family_note, Megatron's Qwen note):
    what its checkpoint's blocks hold otherwise than the plan's, which every export builds."""
    model_type, differences = checkpoint_differences(m.source)
    if not differences or _model_family(m):
        return []
    return [f"{model_type}: the plan counts {m.arch} blocks and the export builds those; the checkpoint's own differ "
            f"({'; '.join(differences)}), so it trains a model of the plan's shape, not that checkpoint's "
            "architecture."]


def _family_note(m, exported: str, instead: str) -> list[str]:
    """What a Qwen or Gemma checkpoint has beyond the llama blocks the plan counts and `exported` builds."""
    family = _model_family(m)
    if not family:
        return []
    return [f"{family}: the plan counts llama blocks and {exported} has no {_FAMILY_EXTRAS[family]}; so it trains a "
            f"llama-style model of the plan's shape, not that checkpoint's architecture ({instead})."]


_MEGATRON_MOCK_NOTE = ("--mock-data and the NullTokenizer make a smoke test; replace them with --data-path, "
                       "--tokenizer-type and --tokenizer-model for real data.")


# Megatron-Core's --qk-layernorm norms each head over head_dim (its q_layernorm / k_layernorm of kv_channels); a model
# whose q/k norms span the whole query and key widths (ModelSpec.qk_norm_whole) trains differently there
QK_NORM_WHOLE_MEGATRON = ("the model's q/k norms normalise a token's whole query and key widths (OLMo 2's), and "
                          "Megatron-Core's --qk-layernorm normalises each head: it trains a per-head variant (head_dim "
                          "weights) at the same passes, without the statistics' all-reduce over tp the plan counts "
                          "for the real one.")


def _megatron_family_notes(m) -> list[str]:
    """What a gpt-oss or Qwen checkpoint holds beyond the llama blocks the plan counts, as Megatron-LM flags the
    export leaves out (Megatron-Bridge's recipe of that family builds them: `_megatron_bridge` replaces these)."""
    notes = []
    if _model_family(m) == "gpt-oss":
        notes.append(GPT_OSS_MEGATRON)
    if m.qk_norm and m.qk_norm_whole:  # (ModelSpec.qk_norm_whole: OLMo 2's, MiniMax-M2's)
        notes.append(QK_NORM_WHOLE_MEGATRON)
    family = _qwen_family(m)
    if family:  # llama blocks in the plan; the checkpoint's extras are Megatron flags the plan does not count
        extra = ((None if m.qkv_bias else "--add-qkv-bias (its q/k/v biases)") if family == "Qwen2" else
                 None if m.qk_norm else "--qk-layernorm (its per-head q/k RMSNorms)")
        written = (" with q/k norms (--qk-layernorm, written)" if m.qk_norm else
                   " with q/k/v biases (--add-qkv-bias, written)" if m.qkv_bias else "")
        notes.append(f"{family}: the plan counts llama blocks{written}"
                     f"; Megatron-LM trains the real model with {extra + ' and ' if extra else ''}--norm-epsilon 1e-6 "
                     "(Qwen's RMSNorm; Megatron-LM's default is 1e-5), which the export leaves out: add "
                     f"{'them' if extra else 'it'} for that model" + (" (a few parameters more than predicted)."
                                                                      if extra else "."))
    return notes


def _megatron_args(plan: Plan) -> tuple[list[tuple[str, Any]], list[str]]:
    """Megatron-LM's pretrain_gpt.py arguments for the plan, in order (name, value: None for a switch, a list for
    nargs), and the notes on what they approximate; `_megatron` renders them, `_megatron_bridge` maps them."""
    m, t, p = plan.model, plan.training, plan.parallel
    notes: list[str] = []
    args: list[tuple[str, Any]] = []

    def flag(name: str, value: Any = None) -> None:
        args.append((name, value))

    # --- parallel layout
    flag("--tensor-model-parallel-size", p.tp)
    flag("--pipeline-model-parallel-size", p.pp)
    flag("--context-parallel-size", p.cp)
    if p.cp > 1 and t.seq_len % (2 * p.cp):
        notes.append(f"seq_len {t.seq_len} is not a multiple of 2*cp = {2 * p.cp}, which Megatron-LM requires "
                     "for context parallelism.")
    window_binds = m.window_binds(t.seq_len)  # --window-size is written only then (below)
    if p.cp > 1 and (not t.overlap_cp_comm or window_binds):
        # the prediction's K/V exchange: one all-gather before the attention (Megatron's default, p2p, is the
        # overlapped ring).  Transformer Engine spells it all_gather (its attn_forward_func_with_cp raises on any
        # other name, arguments.py's help text "allgather" included), and its p2p ring refuses a sliding window.
        flag("--cp-comm-type", "all_gather")
        if t.overlap_cp_comm:
            notes.append("overlap_cp_comm with a sliding window: Transformer Engine's p2p ring (Megatron's default) "
                         "does not run sliding-window attention, so the export asks for all_gather, whose K/V "
                         "exchange is exposed; plan with --no-overlap-cp-comm to predict that (some TE versions run "
                         "a window under all_gather only with their fused attention backend, or ask for a2a).")
    if p.sp:
        flag("--sequence-parallel")
    if m.is_moe:
        # Megatron-Core's MoE layer as cost_models/moe.py predicts it: expert parallelism over ep ranks with expert
        # tensor parallelism 1 (Megatron's default is the tp, which the prediction is not), the all-to-all dispatcher
        # (its default is allgather) and the grouped GEMM (off by default)
        flag("--expert-model-parallel-size", p.ep)
        flag("--expert-tensor-parallel-size", 1)
        if t.moe_dispatcher == "deepep":  # DeepEP through the flex dispatcher (older releases: --moe-enable-deepep)
            flag("--moe-token-dispatcher-type", "flex")
            flag("--moe-flex-dispatcher-backend", "deepep")
            notes.append("moe_dispatcher deepep: --moe-token-dispatcher-type flex with --moe-flex-dispatcher-backend "
                         "deepep (Megatron-LM releases before that flag spell it --moe-enable-deepep); DeepEP must be "
                         "installed.")
        else:
            flag("--moe-token-dispatcher-type", "alltoall")
        flag("--moe-grouped-gemm")
        if t.moe_a2a_overlap:  # Megatron-Core 0.14's combined 1F1B (cost_models.moe.overlapped_all_to_alls)
            flag("--overlap-moe-expert-parallel-comm")
            notes.append("moe_a2a_overlap: --overlap-moe-expert-parallel-comm (Megatron-Core 0.14 or later; it "
                         "needs interleaved 1F1B where there is a pipeline and no full recompute). Its companion "
                         "--delay-wgrad-compute is not modelled and not set: add it to hide more of the backward's "
                         "combine.")
    if p.pp > 1:
        counts = plan_stage_layers(plan)
        uniform = len(set(counts)) == 1
        # Megatron's first/last-stage flags need at least one block on each end (TransformerConfig raises
        # otherwise) and equal middle stages; any other split goes as an explicit layout
        ends = not uniform and p.vpp == 1 and len(set(counts[1:-1])) <= 1 and min(counts[0], counts[-1]) > 0
        if p.stage_layers is None and not uniform:
            notes.append(f"layers ({m.layers}) do not divide evenly over pp*vpp = {p.pp * p.vpp} stages; exported "
                         f"the predicted split {counts} as "
                         + ("--decoder-first/last-pipeline-num-layers." if ends
                            else "an explicit --pipeline-model-parallel-layout."))
        if uniform and p.vpp > 1:
            flag("--num-layers-per-virtual-pipeline-stage", counts[0])
        elif ends:
            flag("--decoder-first-pipeline-num-layers", counts[0])
            flag("--decoder-last-pipeline-num-layers", counts[-1])
        elif not uniform:
            flag("--pipeline-model-parallel-layout", _megatron_layout(counts, m.mtp_layers or 0))
        if p.schedule in _MEGATRON_SCHEDULE_NOTES:
            notes.append(_MEGATRON_SCHEDULE_NOTES[p.schedule])
        if p.vpp > 1 and t.num_microbatches % p.pp:
            # torch's interleaved schedules run m in max(1, m // pp) rounds; Megatron-LM's needs whole rounds of pp
            notes.append(f"{t.num_microbatches} micro-batches over pp={p.pp}: Megatron-LM's interleaved schedule needs "
                         "a multiple of pp (torch's, which the plan was predicted for, runs them in rounds); plan with "
                         "--framework megatron for a batch it runs.")
    elif p.vpp > 1:
        notes.append(f"vpp={p.vpp} with pp=1 has no meaning in Megatron-LM; virtual stages were not exported.")

    # --- batch
    flag("--micro-batch-size", t.micro_batch_size)
    flag("--global-batch-size", t.global_batch_size)
    flag("--seq-length", t.seq_len)

    # --- model shape
    flag("--num-layers", m.layers)
    flag("--hidden-size", m.hidden)
    # a mixture of experts' dense blocks (ModelSpec.first_dense_layers / moe_layer_step) take --ffn-hidden-size, the
    # experts --moe-ffn-hidden-size; without dense blocks every layer is MoE (Megatron's --moe-layer-freq default, 1)
    flag("--ffn-hidden-size", m.dense_ffn_hidden or m.ffn_hidden)
    if m.is_moe:
        flag("--num-experts", m.experts)
        flag("--moe-ffn-hidden-size", m.ffn_hidden)
        if m.moe_block_count < m.layers:
            flag("--moe-layer-freq", megatron_moe_layer_freq(m))
        flag("--moe-router-topk", m.experts_per_token)
        if m.shared_expert_ffn:
            flag("--moe-shared-expert-intermediate-size", m.shared_expert_ffn)
        flag("--moe-router-load-balancing-type", "aux_loss")
        flag("--moe-aux-loss-coeff", 0.01)
    if m.mtp_layers:  # multi-token prediction (Megatron-Core's MultiTokenPredictionBlock on the last stage; its loss
        flag("--mtp-num-layers", m.mtp_layers)  # scaled by --mtp-loss-scaling-factor, 0.1 by default)
    flag("--num-attention-heads", m.heads)
    if m.kv_lora_rank is not None:
        # multi-head latent attention (Megatron-Core's MLASelfAttention; arguments.py's _add_mla_args): every width
        # written, as its defaults are DeepSeek-V2's (kv 32, 128 + 64, v 128).  --qk-head-dim is the no-rope part of a
        # query/key head (q_head_dim = qk_head_dim + qk_pos_emb_head_dim); no --q-lora-rank is a full query projection
        # (DeepSeek-V2-Lite); --qk-layernorm builds the latents' RMSNorms (fused into the up projections), which the
        # plan counts.  No grouped-query flags: every head has its keys and values.  Its rotary positions: MLA's yarn
        # at --rotary-scaling-factor 1 (the default), the plain rotation.
        flag("--multi-latent-attention")
        if m.q_lora_rank:
            flag("--q-lora-rank", m.q_lora_rank)
        flag("--kv-lora-rank", m.kv_lora_rank)
        flag("--qk-head-dim", m.head_dim - m.qk_rope_head_dim)
        flag("--qk-pos-emb-head-dim", m.qk_rope_head_dim)
        flag("--v-head-dim", m.v_head_dim)
        flag("--qk-layernorm")
        if m.hidden % m.heads:  # validate_args divides hidden by the heads for a --kv-channels not given, which MLA's
            flag("--kv-channels", m.v_head_dim)  # projections do not read (their widths are the flags above)
    else:
        if m.kv_heads < m.heads:
            flag("--group-query-attention")
            flag("--num-query-groups", m.kv_heads)
        if m.head_dim is not None and m.head_dim * m.heads != m.hidden:
            flag("--kv-channels", m.head_dim)
        if m.qk_norm:  # Megatron-Core's per-head q/k norms (Transformer Engine's, of --normalization), which the plan
            flag("--qk-layernorm")  # counts (ModelSpec.qk_norm)
        if m.qkv_bias:  # Qwen2's q/k/v biases (ModelSpec.qkv_bias), which the plan counts
            flag("--add-qkv-bias")
    if m.arch == "llama":
        flag("--max-position-embeddings", t.seq_len)
        flag("--position-embedding-type", "rope")
        flag("--normalization", "RMSNorm")
        flag("--swiglu")
        flag("--disable-bias-linear")
    elif m.has_learned_positions:
        flag("--max-position-embeddings", max(m.max_seq_len or t.seq_len, t.seq_len))
        flag("--position-embedding-type", "learned_absolute")
        flag("--normalization", "LayerNorm")
    else:  # gpt blocks with rotary positions (GPT-NeoX, Pythia)
        flag("--max-position-embeddings", t.seq_len)
        flag("--position-embedding-type", "rope")
        flag("--normalization", "LayerNorm")
    if not m.has_learned_positions and m.rope_theta is not None:
        flag("--rotary-base", round(m.rope_base))  # arguments.py: type=int
        if not m.rope_base.is_integer():
            notes.append(f"rope_theta {m.rope_base:g}: Megatron-LM's --rotary-base takes an integer; rounded to "
                         f"{round(m.rope_base)}.")
    if not m.tied_embeddings:
        flag("--untie-embeddings-and-output-weights")
    if window_binds:  # a window the sequence never exceeds changes nothing, and TE would still call it sliding
        # Transformer Engine's (left, right) window: query i attends keys i - left .. i + right, so the left extent is
        # the window less the query itself (Hugging Face's sliding_window counts the keys a query sees)
        flag("--window-size", f"{m.sliding_window - 1},0")
        if m.full_attention_every:
            flag("--window-attn-skip-freq", m.full_attention_every)
    padded = math.ceil(m.vocab / p.tp) * p.tp
    flag("--padded-vocab-size", padded)
    flag("--make-vocab-size-divisible-by", 1)
    if padded != m.vocab:
        notes.append(f"vocab {m.vocab} padded to {padded} (a multiple of tp={p.tp}) as Megatron-LM requires.")

    # --- memory savers
    moe_modules = {"act": ["moe_act"], "norm-act": ["layernorm", "moe_act"]}.get(t.moe_recompute, []) \
        if m.is_moe and p.recompute in ("none", "selective") else []
    # multi-head latent attention's up projections (Training.mla_recompute; TransformerConfig.recompute_modules
    # "mla_up_proj"), which whole-block recompute covers already
    if t.mla_recompute and m.kv_lora_rank is not None and p.recompute in ("none", "selective"):
        moe_modules = ["mla_up_proj"] + moe_modules
    if moe_modules:  # a mixture of experts' (and latent attention's) recompute modules, beside core attention where
        # selective asks for it
        flag("--recompute-granularity", "selective")
        flag("--recompute-modules", (["core_attn"] if p.recompute == "selective" else []) + moe_modules)
    elif p.recompute == "selective":
        flag("--recompute-granularity", "selective")
        notes.append("recompute selective: Megatron-LM's default selective recompute covers core attention "
                     "(--recompute-modules core_attn); it has no switch for the MLP activation alone, so that "
                     "activation stays stored and activation memory is somewhat above the prediction.")
    elif p.recompute == "full" and p.recompute_layers:
        # the first N blocks of each pipeline stage (each model chunk) recomputed whole, the rest not at all
        flag("--recompute-granularity", "full")
        flag("--recompute-method", "block")
        flag("--recompute-num-layers", p.recompute_layers)
    elif p.recompute == "full":
        flag("--recompute-granularity", "full")
        flag("--recompute-method", "uniform")
        flag("--recompute-num-layers", 1)
    elif p.recompute == "selective-op":
        flag("--recompute-granularity", "full")
        flag("--recompute-method", "uniform")
        flag("--recompute-num-layers", 1)
        notes.append("recompute selective-op: torchtitan's op-level selective checkpointing has no Megatron-LM "
                     "equivalent; exported as full recompute (less activation memory, more recompute than predicted).")

    fsdp = p.zero_stage == 3
    if p.zero_stage in (1, 2):
        flag("--use-distributed-optimizer")
        if p.dp_replicate > 1:  # its optimizer in instances of dp / dp_replicate ranks (DistributedDataParallelConfig)
            flag("--num-distributed-optimizer-instances", p.dp_replicate)
        if p.zero_stage == 2 and t.zero2_grad_reduce == "per-micro-batch":
            # a per-step ZeRO-2 (parplan's runtime) was predicted with full gradients through the backward: as run
            notes.append("zero_stage 2: Megatron-LM's distributed optimizer reduce-scatters gradients (ZeRO-2 "
                         "traffic) but keeps a full-size gradient buffer, so gradient memory is not sharded as "
                         "predicted (per micro-batch); --use-megatron-fsdp --data-parallel-sharding-strategy "
                         "optim_grads is the sharded alternative.")
    elif fsdp:
        flag("--use-megatron-fsdp")
        flag("--data-parallel-sharding-strategy", "optim_grads_params")
        flag("--ckpt-format", "fsdp_dtensor")
        # the Megatron-FSDP user guide's required configuration
        # (docs/discussions/megatron-fsdp-user-guide/megatron-fsdp-user-guide.md)
        flag("--use-distributed-optimizer")
        flag("--no-gradient-accumulation-fusion")
        notes.append("zero_stage 3: mapped to Megatron-FSDP (--use-megatron-fsdp with sharding strategy "
                     "optim_grads_params), Megatron's equivalent of ZeRO-3 rather than DeepSpeed ZeRO-3; it needs "
                     "the fsdp_dtensor checkpoint format and CUDA_DEVICE_MAX_CONNECTIONS not set to 1"
                     + ("; check that your Megatron-LM version supports it together with pipeline parallelism."
                        if p.pp > 1 else "."))
        if p.dp_replicate > 1:
            notes.append(_hybrid_not_written(p, "Megatron-FSDP"))
        if m.is_moe:  # planned for parplan's runtime only (core.moe_problem refuses it for Megatron-LM)
            notes.append("zero_stage 3 with a mixture of experts: planned for parplan's runtime (torchtitan's FSDP2 "
                         "layout: each expert sharded over the ranks holding it), not for Megatron-LM, whose "
                         "Megatron-FSDP sharding of expert weights parplan has not modelled; `parplan recommend "
                         "--framework megatron` plans ZeRO-0 or 1 (the distributed optimizer) for it.")
    if not t.grad_accumulation_fusion and not fsdp:  # Megatron-FSDP's required flag is written above
        flag("--no-gradient-accumulation-fusion")
    if t.overlap_grad_reduce and p.dp > 1:
        flag("--overlap-grad-reduce")
    if plan_overlaps_param_gather(t) and p.dp > 1 and p.zero_stage >= 1:
        if t.overlap_grad_reduce:
            flag("--overlap-param-gather")
        else:  # megatron/training/arguments.py: "Must use --overlap-param-gather with --overlap-grad-reduce"
            notes.append("overlap_param_gather without overlap_grad_reduce: Megatron-LM accepts --overlap-param-gather "
                         "only with --overlap-grad-reduce, so the export leaves it out (the parameter gather runs "
                         "after the step, slower than predicted).")
    if p.offload == "optimizer":
        if p.zero_stage == 0:  # OptimizerConfig asserts the distributed optimizer under the precision-aware one
            flag("--use-distributed-optimizer")
            notes.append("offload optimizer with zero_stage 0: Megatron-LM offloads only the distributed "
                         "optimizer's states (--use-precision-aware-optimizer needs --use-distributed-optimizer), "
                         "so the export shards them over dp (ZeRO-1).")
        flag("--optimizer-cpu-offload")
        flag("--use-precision-aware-optimizer")
        flag("--optimizer-offload-fraction", 1.0)

    # --- precision and kernels
    if t.precision == "fp32" or t.dtype == "fp32":
        if t.dtype != "fp32":
            notes.append(f"precision fp32 with dtype {t.dtype}: Megatron-LM has no fp32-params-with-16-bit-compute "
                         "mode; exported as plain fp32 (no --bf16/--fp16).")
    else:
        flag("--bf16" if t.dtype == "bf16" else "--fp16")
        # the gradients' dtype of the recipe: validate_args reduces in fp32 under --bf16 unless told
        # otherwise, and in 16 bit under --fp16 unless told otherwise
        if t.precision == "master-weights" and t.dtype == "fp16":
            flag("--accumulate-allreduce-grads-in-fp32")
        elif t.precision == "master-weights-half-grads" and t.dtype == "bf16":
            flag("--grad-reduce-in-bf16")
        if t.precision == "amp":
            notes.append(f"precision amp: Megatron-LM's --{t.dtype} keeps 16-bit parameters with fp32 main "
                         "weights (the master-weights recipe), so per-parameter memory differs from the prediction.")
        if t.fp8:
            # NeMo's H100 FP8 recipe (bf16_with_fp8_mixed: nemo/collections/llm/recipes/precision/mixed_precision.py),
            # what the cost model's "te" scheme follows: Transformer Engine's delayed scaling in the hybrid format
            # (E4M3 forward, E5M2 gradients), 1024 steps of amax history reduced by max (Megatron-LM's own defaults
            # are 1 and most_recent), FP8 weights gathered in FP8
            flag("--fp8-format", "hybrid")
            flag("--fp8-recipe", "delayed")
            flag("--fp8-amax-history-len", 1024)
            flag("--fp8-amax-compute-algo", "max")
            flag("--fp8-param-gather")
            notes.append("fp8: Transformer Engine's FP8 linears (--transformer-impl transformer_engine, Megatron-LM's "
                         "default); the prediction counts the stepped parameters' all-gather at 16 bits, which "
                         "--fp8-param-gather halves for the blocks' linears.")
    sixteen_bit = not (t.precision == "fp32" or t.dtype == "fp32")
    if t.flash_attention and not sixteen_bit:
        # Transformer Engine's flash and fused kernels take 16-bit q/k/v only: with Megatron's flash backend an
        # fp32 run finds no attention kernel at its first forward
        notes.append("flash_attention with fp32: flash attention needs 16-bit inputs; exported with "
                     "--attention-backend unfused (attention time and memory above the prediction).")
    # multi-head latent attention's query/key heads are wider than its value heads (DeepSeek-V3: 192 against 128),
    # which Transformer Engine's FlashAttention 2 refuses (FlashAttention 3 only): the flash backend, which leaves TE
    # no other kernel, would find none; cuDNN's fused attention runs them
    backend = "fused" if m.kv_lora_rank is not None and m.head_dim != m.v_head_dim else "flash"
    flag("--attention-backend", backend if t.flash_attention and sixteen_bit else "unfused")
    if backend == "fused" and t.flash_attention and sixteen_bit:
        notes.append(f"multi-head latent attention (query/key heads of {m.head_dim}, value heads of {m.v_head_dim}): "
                     "--attention-backend fused (cuDNN), as Transformer Engine's FlashAttention 2 does not run unequal "
                     "head widths; with FlashAttention 3 installed (Hopper), --attention-backend flash runs them too.")
    if t.overlap_tp_comm:
        if p.sp:
            flag("--tp-comm-overlap")
        else:
            notes.append("overlap_tp_comm: Megatron-LM's --tp-comm-overlap needs --sequence-parallel, which the "
                         "plan does not use; not exported.")

    # what a Megatron plan set against Megatron-LM's own behaviour where Megatron-LM has no flag for it
    notes += _unflagged_megatron(plan) + _checkpoint_note(m)
    if any("no linear biases" in d for d in checkpoint_differences(m.source)[1]):
        notes.append("--disable-bias-linear trains the checkpoint's bias-free linears (fewer parameters than "
                     "predicted: the plan's gpt blocks count biases); the export keeps Megatron-LM's default, as planned.")
    notes += _megatron_family_notes(m)

    # --- run
    if not t.dropout:  # Megatron-LM's defaults are 0.1 each; the plan was predicted without dropout
        flag("--hidden-dropout", 0.0)
        flag("--attention-dropout", 0.0)
    flag("--lr", t.lr)
    # the constant learning rate parplan's runtime trains with (Megatron-LM's default --lr-decay-style is linear, to
    # --min-lr 0 over --train-iters)
    flag("--lr-decay-style", "constant")
    flag("--adam-beta1", ADAMW_BETAS[0])  # parplan's runtime's AdamW; Megatron-LM's defaults are 0.9, 0.999, 0.01
    flag("--adam-beta2", ADAMW_BETAS[1])
    flag("--weight-decay", ADAMW_WEIGHT_DECAY)
    flag("--clip-grad", float(t.clip_grad or 0.0))  # 0: none
    flag("--seed", t.seed)
    if t.tokens is not None:
        # whole steps, as torchtitan's steps: Megatron trains train_samples // global_batch_size iterations
        flag("--train-samples", _train_steps(plan) * t.global_batch_size)
    else:  # Megatron needs one of them (it multiplies train_iters by the batch), as torchtitan needs steps
        flag("--train-iters", 1000)
        notes.append("training.tokens is not set: --train-iters 1000 is a placeholder (or plan with --tokens for "
                     "--train-samples).")
    flag("--mock-data")
    flag("--tokenizer-type", "NullTokenizer")
    # the NullTokenizer adds an end-of-document id after --vocab-size ids (its vocab_size is that + 1, its eod
    # that number), which the mock data appends to every sample: V - 1 keeps it inside the V-row embedding
    flag("--vocab-size", m.vocab - 1)
    notes.append(_MEGATRON_MOCK_NOTE)
    if m.vocab < MOCK_DATA_MAX_TOKEN + 1:
        notes.append(f"vocab {m.vocab}: Megatron-LM's mock samples count token ids 1, 2, ... up to "
                     f"{MOCK_DATA_MAX_TOKEN} whatever the vocabulary (MockGPTLowLevelDataset, max_sequence_length "
                     "4096, in the versions that keep no vocab_size), past this embedding: use --data-path here.")

    return args, notes


def _megatron(plan: Plan) -> tuple[str, list[str]]:
    m, p = plan.model, plan.parallel
    args, notes = _megatron_args(plan)
    fsdp = p.zero_stage == 3
    nnodes, nproc = _nodes(plan)
    if nproc != min(plan.hardware.gpus, plan.hardware.gpus_per_node):  # nodes not filled
        notes.append(f"{plan.hardware.gpus} GPUs do not fill {plan.hardware.gpus_per_node}-GPU nodes: launched as "
                     f"{nnodes} nodes x {nproc} (torchrun starts the same number of ranks on every node).")
    header = [f"parplan export --to megatron: {m.name or m.arch} on {plan.hardware.gpus} x {plan.hardware.name}",
              f"tp={p.tp} pp={p.pp} vpp={p.vpp} dp={p.dp} cp={p.cp} sp={p.sp} zero={p.zero_stage} "
              f"recompute={p.recompute}{f' ({p.recompute_layers} blocks/stage)' if p.recompute_layers else ''} "
              f"schedule={p.schedule} offload={p.offload}",
              "Flags follow NVIDIA/Megatron-LM megatron/training/arguments.py (commit 000c4ac2).",
              # docs/megatron-lm-to-megatron-bridge.md in NVIDIA-NeMo/Megatron-Bridge (read 2026-12-05)
              "Megatron-Bridge (NeMo's Megatron successor): its scripts/translate_mlm_to_bridge.py --args '<these flags>' "
              "turns them into Hydra overrides for scripts/training/run_recipe.py (configuration only; it lists the "
              "flags it does not map)."]
    lines = _comment_lines(header)
    lines += [f"# note: {n}" for n in notes]
    if (p.tp > 1 or p.cp > 1) and not fsdp:
        lines.append("export CUDA_DEVICE_MAX_CONNECTIONS=1")
    lines.append(f"torchrun --nnodes {nnodes} --nproc-per-node {nproc} "
                 '--node-rank "${NODE_RANK:-0}" --master-addr "${MASTER_ADDR:-localhost}" '
                 '--master-port "${MASTER_PORT:-6000}" pretrain_gpt.py \\')
    rendered = []
    for name, value in args:
        # a list value is one argument each (argparse's nargs: --recompute-modules layernorm moe_act)
        values = value if isinstance(value, list) else [] if value is None else [value]
        rendered.append(" ".join([f"    {name}"] + [shlex.quote(str(v)) for v in values]))
    lines += [r + " \\" for r in rendered[:-1]] + rendered[-1:]
    return "\n".join(lines) + "\n", notes


# --------------------------------------------------------------------------------------------
# Megatron-Bridge
#
# Megatron-Bridge (NVIDIA-NeMo/Megatron-Bridge, the successor of NeMo 2's LLM training) runs Megatron-Core from a
# ConfigContainer that a model recipe function builds and Hydra-style KEY=VALUE arguments override
# (scripts/training/run_recipe.py, commit 10feab50: `torchrun --nproc_per_node=8 run_recipe.py --recipe
# llama32_1b_pretrain_config train.train_iters=5000 optimizer.lr=0.0003`).  training/utils/omegaconf_utils.py (commit
# 158aa4e2) turns the container into an OmegaConf dict in struct mode, callables (activation_func, init methods) left
# out, so a key must be a field the recipe's container has and the block's form stays the recipe's.  Where the keys
# below were read:
#   training/config.py (commit 4feb11f8): ConfigContainer's train (TrainingConfig: micro_batch_size, global_batch_size,
#     train_iters, exclusive with train_samples), scheduler (SchedulerConfig: lr_decay_style, lr_warmup_iters,
#     start/end_weight_decay), rng.seed, checkpoint.ckpt_format, dataset (GPTDatasetConfig: Megatron-Core's
#     sequence_length, which validate() asserts equal to model.seq_length; random_seed; blend), ddp and optimizer
#     (Megatron-Core's DistributedDataParallelConfig and OptimizerConfig, use_distributed_optimizer synced between
#     them), mixed_precision (a recipe's name), comm_overlap, tokenizer;
#   training/mixed_precision.py (commit 05097809): bf16_mixed, fp16_mixed and bf16_/fp16_with_fp8_delayed_scaling_mixed
#     (fp8 hybrid, recipe delayed, amax history 1024, algo max, fp8_param_gather), copied onto model, optimizer and
#     ddp at setup, grad_reduce_in_fp32 (true for bf16, false for fp16) included;
#   training/comm_overlap.py (commit 0685ff5d): a CommOverlapConfig's setup sets model.tp_comm_overlap and, with the
#     distributed optimizer and dp > 1, ddp.overlap_grad_reduce / overlap_param_gather from its own fields;
#   models/gpt_provider.py (commit 0254ddd4): GPTModelProvider's seq_length (its position table too), vocab_size with
#     should_pad_vocab, make_vocab_size_divisible_by, share_embeddings_and_output_weights, rotary_base;
#     models/transformer_config.py (commit 48fe5c6c): an attention_backend name turned into AttnBackend by
#     TransformerConfig.finalize, not by MLATransformerConfig's;
#   Megatron-Core's ModelParallelConfig (NVIDIA/Megatron-LM megatron/core/model_parallel_config.py, commit 0486ed92)
#     and TransformerConfig / MLATransformerConfig (megatron/core/transformer/transformer_config.py, a 2025 copy in
#     the code index, with AttnBackend and cp_comm_type) fields (parallel sizes,
#     sequence_parallel, tp_comm_overlap, recompute_*, moe_*, cp_comm_type, window_size, window_attn_skip_freq,
#     pipeline_model_parallel_layout, num_layers_in_first/last_pipeline_stage, mtp_num_layers, q_lora_rank,
#     kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim, v_head_dim); training/flex_dispatcher_backend.py (commit
#     183c5c02): model.moe_token_dispatcher_type and moe_flex_dispatcher_backend;
#   recipes/common.py (commit 0eca073e): _pretrain_common's defaults that the absent-flag values below reset
#     (distributed optimizer and grad/param overlap on, lr warmup 500 iterations, weight decay 0.033 in the scheduler,
#     mock data as dataset.blend null, comm_overlap null, tokenizer.use_tokenizer_vocab_size true);
#     recipes/utils/optimizer_utils.py (commit 355cef45): OptimizerConfig's lr, weight_decay, adam_beta1/2, clip_grad,
#     and the scheduler's start/end_weight_decay (0.033) beside them;
#   the recipes' names: their families' __init__.py (_BRIDGE_RECIPES).
# Bridge's own scripts/translate_mlm_to_bridge.py (commit fcb73acf) maps most of these flags onto the same fields.

_SAME = object()  # a key's value: the flag's own (True for a switch)
_KEEP = object()  # a flag the plan leaves out: the recipe's value stays


class _Key(NamedTuple):
    """A ConfigContainer field a Megatron-LM flag sets.  `value`: the flag's own (_SAME), a constant, or
    f(flag value, plan, args) -> value, or an _Unmapped where none fits.  `absent`: the field's value where the plan's
    arguments leave the flag out (Megatron-LM's default, where the recipes set another), a constant or f(plan, args),
    _KEEP for the recipe's; written only with `absent_with` among the arguments, where given."""
    path: str
    value: Any = _SAME
    absent: Any = _KEEP
    absent_with: Optional[str] = None


class _Unmapped(str):
    """Why a flag's value has no key (what a _Key's value function returns in that case)."""


# the FP8 flags _megatron_args writes, as Bridge's bf16_/fp16_with_fp8_delayed_scaling_mixed set them (None: a switch)
_BRIDGE_FP8 = {"--fp8-format": "hybrid", "--fp8-recipe": "delayed", "--fp8-amax-history-len": 1024,
               "--fp8-amax-compute-algo": "max", "--fp8-param-gather": None}


def _bridge_precision(_value, plan: Plan, args: dict) -> str:
    """The mixed-precision recipe of the 16-bit flag (with the FP8 one where every FP8 flag is its setting)."""
    base = "bf16" if "--bf16" in args else "fp16"
    fp8 = all(k in args and args[k] == v for k, v in _BRIDGE_FP8.items())
    return f"{base}_with_fp8_delayed_scaling_mixed" if fp8 else f"{base}_mixed"


def _bridge_fp8(value, plan: Plan, args: dict) -> Any:
    if all(k in args and args[k] == v for k, v in _BRIDGE_FP8.items()) and ("--bf16" in args or "--fp16" in args):
        return _bridge_precision(value, plan, args)
    return _Unmapped("no mixed-precision recipe of Megatron-Bridge holds these FP8 settings")


def _bridge_attention_backend(value, plan: Plan, args: dict) -> Any:
    if plan.model.kv_lora_rank is not None:
        return _Unmapped("the recipe's: MLATransformerConfig.finalize does not turn a backend's name into "
                         "AttnBackend, models/transformer_config.py at commit 48fe5c6c")
    return value


def _k(path: str, value: Any = _SAME, absent: Any = _KEEP, absent_with: Optional[str] = None) -> tuple[_Key]:
    return (_Key(path, value, absent, absent_with),)


# Every flag `_megatron_args` writes, and the fields it sets (the table the README's export section describes)
_BRIDGE_KEYS: dict[str, tuple[_Key, ...]] = {
    # parallel layout (Megatron-Core's ModelParallelConfig / TransformerConfig)
    "--tensor-model-parallel-size": _k("model.tensor_model_parallel_size"),
    "--pipeline-model-parallel-size": _k("model.pipeline_model_parallel_size"),
    "--context-parallel-size": _k("model.context_parallel_size"),
    "--cp-comm-type": _k("model.cp_comm_type", absent=None),  # Megatron-Core's None: its p2p ring
    "--sequence-parallel": _k("model.sequence_parallel", True, absent=False),
    "--expert-model-parallel-size": _k("model.expert_model_parallel_size"),
    "--expert-tensor-parallel-size": _k("model.expert_tensor_parallel_size"),
    "--moe-token-dispatcher-type": _k("model.moe_token_dispatcher_type"),
    "--moe-flex-dispatcher-backend": _k("model.moe_flex_dispatcher_backend"),
    "--moe-grouped-gemm": _k("model.moe_grouped_gemm", True),
    # Megatron-Core's ModelParallelConfig field (megatron/core/model_parallel_config.py, 0.14 on), which the model
    # provider inherits
    "--overlap-moe-expert-parallel-comm": _k("model.overlap_moe_expert_parallel_comm", True),
    # the model chunks per pipeline rank (Megatron-LM's flag counts the blocks of one)
    "--num-layers-per-virtual-pipeline-stage": _k("model.virtual_pipeline_model_parallel_size",
                                                  lambda n, plan, args: plan.parallel.vpp, absent=None),
    "--decoder-first-pipeline-num-layers": _k("model.num_layers_in_first_pipeline_stage", absent=None),
    "--decoder-last-pipeline-num-layers": _k("model.num_layers_in_last_pipeline_stage", absent=None),
    "--pipeline-model-parallel-layout": (
        _Key("model.pipeline_model_parallel_layout", absent=None),
        _Key("model.virtual_pipeline_model_parallel_size",
             lambda layout, plan, args: plan.parallel.vpp if plan.parallel.vpp > 1 else None)),
    # batch
    "--micro-batch-size": _k("train.micro_batch_size"),
    "--global-batch-size": _k("train.global_batch_size"),
    "--seq-length": (_Key("model.seq_length"), _Key("dataset.sequence_length")),
    # model shape: plain values of the recipe's model provider
    "--num-layers": _k("model.num_layers"),
    "--hidden-size": _k("model.hidden_size"),
    "--ffn-hidden-size": _k("model.ffn_hidden_size"),
    "--num-experts": _k("model.num_moe_experts"),
    "--moe-ffn-hidden-size": _k("model.moe_ffn_hidden_size"),
    "--moe-layer-freq": _k("model.moe_layer_freq",  # Megatron-LM's flag is a Python expression: the list it means
                           lambda _, plan, args: [int(plan.model.is_moe_block(i)) for i in range(plan.model.layers)],
                           absent=1, absent_with="--num-experts"),
    "--moe-router-topk": _k("model.moe_router_topk"),
    "--moe-shared-expert-intermediate-size": _k("model.moe_shared_expert_intermediate_size", absent=None,
                                                absent_with="--num-experts"),
    "--moe-router-load-balancing-type": _k("model.moe_router_load_balancing_type"),
    "--moe-aux-loss-coeff": _k("model.moe_aux_loss_coeff"),
    "--mtp-num-layers": _k("model.mtp_num_layers", absent=None, absent_with="--num-experts"),
    "--num-attention-heads": _k("model.num_attention_heads"),
    "--q-lora-rank": _k("model.q_lora_rank", absent=None, absent_with="--multi-latent-attention"),  # None: full query
    "--kv-lora-rank": _k("model.kv_lora_rank"),
    "--qk-head-dim": _k("model.qk_head_dim"),
    "--qk-pos-emb-head-dim": _k("model.qk_pos_emb_head_dim"),
    "--v-head-dim": _k("model.v_head_dim"),
    "--num-query-groups": _k("model.num_query_groups", absent=None),  # None: one group a head
    "--kv-channels": _k("model.kv_channels",  # Megatron-LM's default: hidden / heads
                        absent=lambda plan, args: _KEEP if plan.model.kv_lora_rank is not None
                        else plan.model.hidden // plan.model.heads),
    "--rotary-base": _k("model.rotary_base"),
    "--untie-embeddings-and-output-weights": _k("model.share_embeddings_and_output_weights", False, absent=True),
    "--window-size": _k("model.window_size", lambda v, plan, args: [int(x) for x in v.split(",")]),
    "--window-attn-skip-freq": _k("model.window_attn_skip_freq"),
    # the plan's padded vocabulary as the model's, padded no further
    "--padded-vocab-size": (_Key("model.vocab_size"), _Key("model.should_pad_vocab", False)),
    "--make-vocab-size-divisible-by": _k("model.make_vocab_size_divisible_by"),
    # memory savers
    "--recompute-granularity": _k("model.recompute_granularity", absent=None),
    "--recompute-modules": _k("model.recompute_modules", absent=None),  # None: Megatron-Core's core_attn
    "--recompute-method": _k("model.recompute_method", absent=None),
    "--recompute-num-layers": _k("model.recompute_num_layers", absent=None),
    "--use-distributed-optimizer": (_Key("ddp.use_distributed_optimizer", True, absent=False),
                                    _Key("optimizer.use_distributed_optimizer", True, absent=False)),
    "--num-distributed-optimizer-instances": _k("ddp.num_distributed_optimizer_instances"),
    "--use-megatron-fsdp": _k("ddp.use_megatron_fsdp", True, absent=False),
    "--data-parallel-sharding-strategy": _k("ddp.data_parallel_sharding_strategy"),
    "--ckpt-format": _k("checkpoint.ckpt_format"),
    "--no-gradient-accumulation-fusion": _k("model.gradient_accumulation_fusion", False),
    "--overlap-grad-reduce": _k("ddp.overlap_grad_reduce", True, absent=False),
    "--overlap-param-gather": _k("ddp.overlap_param_gather", True, absent=False),
    "--optimizer-cpu-offload": _k("optimizer.optimizer_cpu_offload", True),
    "--use-precision-aware-optimizer": _k("optimizer.use_precision_aware_optimizer", True),
    "--optimizer-offload-fraction": _k("optimizer.optimizer_offload_fraction"),
    # precision and kernels: the 16-bit flag and the FP8 ones are one mixed-precision recipe
    "--bf16": _k("mixed_precision", _bridge_precision,
                 absent=lambda plan, args: _KEEP if "--fp16" in args else None),  # neither: fp32, none
    "--fp16": _k("mixed_precision", _bridge_precision),
    **{flag: _k("mixed_precision", _bridge_fp8) for flag in _BRIDGE_FP8},
    "--attention-backend": _k("model.attention_backend", _bridge_attention_backend),
    "--tp-comm-overlap": _k("model.tp_comm_overlap", True, absent=False),
    # run
    "--hidden-dropout": _k("model.hidden_dropout", absent=0.1),  # Megatron-LM's default, with dropout planned
    "--attention-dropout": _k("model.attention_dropout", absent=0.1),
    "--lr": _k("optimizer.lr"),
    # Megatron-LM's constant rate has no warmup (--lr-warmup-iters 0); the recipes warm up
    "--lr-decay-style": (_Key("scheduler.lr_decay_style"), _Key("scheduler.lr_warmup_iters", 0)),
    "--adam-beta1": _k("optimizer.adam_beta1"),
    "--adam-beta2": _k("optimizer.adam_beta2"),
    # Megatron-LM's --weight-decay is its start and end weight decay too; the recipes' scheduler holds its own
    "--weight-decay": (_Key("optimizer.weight_decay"), _Key("scheduler.start_weight_decay"),
                       _Key("scheduler.end_weight_decay")),
    "--clip-grad": _k("optimizer.clip_grad"),
    "--seed": (_Key("rng.seed"), _Key("dataset.random_seed")),  # Megatron-LM seeds its datasets with --seed
    # the same whole steps as iterations: the recipes set train_iters, which train_samples may not join
    "--train-samples": _k("train.train_iters", lambda n, plan, args: n // plan.training.global_batch_size),
    "--train-iters": _k("train.train_iters"),
    "--mock-data": _k("dataset.blend", None),  # no blend: the pretrain recipes' mock data
    "--tokenizer-type": _k("tokenizer.tokenizer_type"),
    "--vocab-size": _k("tokenizer.vocab_size"),
}

# Flags with no key, and why: the block's form is the recipe's model provider's (its activation_func a callable the
# overrides cannot carry), and two settings Bridge takes from elsewhere
_BRIDGE_UNMAPPED: dict[str, str] = {
    "--swiglu": "the recipe's activation_func, a callable, and gated_linear_unit",
    "--normalization": "the recipe's",
    "--position-embedding-type": "the recipe's",
    "--disable-bias-linear": "the recipe's add_bias_linear",
    "--group-query-attention": "implied by model.num_query_groups",
    "--max-position-embeddings": "model.seq_length sizes the position table, in GPTModelProvider.provide",
    "--multi-latent-attention": "the recipe's model provider, an MLA one in the DeepSeek and Kimi recipes",
    "--qk-layernorm": "the recipe's",
    "--accumulate-allreduce-grads-in-fp32": "the mixed-precision recipe's grad_reduce_in_fp32 (fp16_mixed: false) "
                                            "replaces ddp.grad_reduce_in_fp32 at setup",
    "--grad-reduce-in-bf16": "the mixed-precision recipe's grad_reduce_in_fp32 (bf16_mixed: true) replaces "
                             "ddp.grad_reduce_in_fp32 at setup",
}

# the ConfigContainer's sections in the order the file lists them
_BRIDGE_SECTIONS = ("model", "train", "dataset", "optimizer", "scheduler", "ddp", "mixed_precision", "rng",
                    "tokenizer", "checkpoint")
_BRIDGE_KEY_ORDER = {key.path: i for i, key in enumerate(k for keys in _BRIDGE_KEYS.values() for k in keys)}

# parplan's presets with a Megatron-Bridge recipe of their own: (recipe function, what it builds).  Names from the
# families' __init__.py in src/megatron/bridge/recipes: llama (commit 1b5eb804), qwen (3d76f6f4), deepseek (5f315187),
# kimi (1af029b0), gpt_oss (40791148), glm (371ef5cd), gpt (3b44b5ca)
_BRIDGE_RECIPES: dict[str, tuple[str, str]] = {
    "llama2-7b": ("llama2_7b_pretrain_config", "Llama 2 7B"),
    "llama3-8b": ("llama3_8b_pretrain_config", "Llama 3 8B; llama31_8b_pretrain_config for Llama 3.1"),
    "llama3-70b": ("llama3_70b_pretrain_config", "Llama 3 70B; llama31_70b_pretrain_config for Llama 3.1"),
    "llama3-405b": ("llama31_405b_pretrain_config", "Llama 3.1 405B"),
    "llama3.2-1b": ("llama32_1b_pretrain_config", "Llama 3.2 1B"),
    "llama3.2-3b": ("llama32_3b_pretrain_config", "Llama 3.2 3B"),
    "qwen2.5-7b": ("qwen25_7b_pretrain_config", "Qwen2.5 7B"),
    "qwen2.5-72b": ("qwen25_72b_pretrain_config", "Qwen2.5 72B"),
    "qwen3-8b": ("qwen3_8b_pretrain_config", "Qwen3 8B"),
    "qwen3-14b": ("qwen3_14b_pretrain_config", "Qwen3 14B"),
    "qwen3-32b": ("qwen3_32b_pretrain_config", "Qwen3 32B"),
    "qwen3-30b-a3b": ("qwen3_30b_a3b_pretrain_config", "Qwen3-30B-A3B"),
    "qwen3-235b-a22b": ("qwen3_235b_a22b_pretrain_config", "Qwen3-235B-A22B"),
    "deepseek-v2": ("deepseek_v2_pretrain_config", "DeepSeek-V2"),
    "deepseek-v2-lite": ("deepseek_v2_lite_pretrain_config", "DeepSeek-V2-Lite"),
    "deepseek-v3": ("deepseek_v3_pretrain_config", "DeepSeek-V3"),
    "kimi-k2": ("kimi_k2_pretrain_config", "Kimi K2"),
    "gpt-oss-20b": ("gpt_oss_20b_pretrain_config", "gpt-oss-20b"),
    "gpt-oss-120b": ("gpt_oss_120b_pretrain_config", "gpt-oss-120b"),
    "glm-4.5": ("glm45_355b_pretrain_config", "GLM-4.5"),
    "glm-4.5-air": ("glm45_air_106b_pretrain_config", "GLM-4.5-Air"),
    "gpt3-175b": ("gpt3_175b_pretrain_config", "GPT-3 175B"),
}


def bridge_recipe(m) -> tuple[str, str, bool]:
    """The Megatron-Bridge recipe to start from: (function, what it builds, whether it is this model's own) -- the
    preset's, else one of the closest family (latent attention, gpt-oss, Qwen, a mixture of experts, gpt or llama
    blocks)."""
    if (m.name or "") in _BRIDGE_RECIPES:
        return (*_BRIDGE_RECIPES[m.name], True)
    family = _model_family(m)
    if m.kv_lora_rank is not None:
        name = "deepseek-v3"
    elif family == "gpt-oss":
        name = "gpt-oss-20b"
    elif family == "Qwen3" or m.is_moe:
        name = "qwen3-30b-a3b" if m.is_moe else "qwen3-8b"
    elif family == "Qwen2":
        name = "qwen2.5-7b"
    elif m.arch == "gpt":
        return "vanilla_gpt_pretrain_config", "GPT blocks", False
    else:
        name = "llama3-8b"
    return (*_BRIDGE_RECIPES[name], False)


def _hydra_value(v: Any) -> str:
    """A value as Hydra's override grammar reads it: true/false, null, numbers, [lists], names bare, any other
    string in double quotes."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_hydra_value(x) for x in v) + "]"
    s = str(v)
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_\-]*", s) and s.lower() not in ("true", "false", "null", "nan", "inf"):
        return s
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def bridge_overrides(plan: Plan, args: list[tuple[str, Any]]) -> tuple[dict[str, Any], dict[str, str]]:
    """The ConfigContainer fields Megatron-LM's arguments `args` set (path -> value, in the file's order), and the
    flags with none (flag -> why).  A flag not in _BRIDGE_KEYS nor _BRIDGE_UNMAPPED is reported, never dropped."""
    given = dict(args)
    keys: dict[str, Any] = {}
    unmapped: dict[str, str] = {}

    def put(path: str, value: Any) -> None:
        if path in keys and keys[path] != value:
            raise AssertionError(f"Megatron-Bridge key {path} set twice: {keys[path]!r} and {value!r}")
        keys[path] = value

    for flag, value in args:
        if flag in _BRIDGE_UNMAPPED or flag not in _BRIDGE_KEYS:
            unmapped[flag] = _BRIDGE_UNMAPPED.get(flag, "no Megatron-Bridge key in parplan's table")
            continue
        values = []
        for key in _BRIDGE_KEYS[flag]:
            v = (True if value is None else value) if key.value is _SAME \
                else key.value(value, plan, given) if callable(key.value) else key.value
            values.append(v)
        why = next((v for v in values if isinstance(v, _Unmapped)), None)
        if why is not None:
            unmapped[flag] = str(why)
            continue
        for key, v in zip(_BRIDGE_KEYS[flag], values):
            put(key.path, v)
    for flag, flag_keys in _BRIDGE_KEYS.items():  # Megatron-LM's defaults where the recipes set another
        if flag in given:
            continue
        for key in flag_keys:
            if key.absent is _KEEP or key.path in keys or (key.absent_with and key.absent_with not in given):
                continue
            v = key.absent(plan, given) if callable(key.absent) else key.absent
            if v is not _KEEP:
                keys[key.path] = v
    order = sorted(keys, key=lambda path: (_BRIDGE_SECTIONS.index(path.split(".")[0]), _BRIDGE_KEY_ORDER[path]))
    return {path: keys[path] for path in order}, unmapped


_BRIDGE_MOCK_NOTE = ("dataset.blend=null and the NullTokenizer are mock data, a smoke test: for real data set "
                     "dataset.blend (or run_recipe.py's --dataset) and tokenizer.tokenizer_type / tokenizer_model.")


def _megatron_bridge(plan: Plan) -> tuple[str, list[str]]:
    m, p = plan.model, plan.parallel
    args, megatron_notes = _megatron_args(plan)
    keys, unmapped = bridge_overrides(plan, args)
    recipe, what, own = bridge_recipe(m)
    family = _model_family(m)
    # Megatron-LM's notes hold for the same settings; the family's extras and mock data read otherwise here
    replaced = set(_megatron_family_notes(m)) if family in ("gpt-oss", "Qwen2", "Qwen3") else set()
    notes = ["notes naming Megatron-LM flags speak of the keys those flags map to (`parplan export --to megatron` "
             "writes the flags)."]
    notes += [_BRIDGE_MOCK_NOTE if n == _MEGATRON_MOCK_NOTE else n for n in megatron_notes if n not in replaced]
    if replaced:
        notes.append(f"{family}: the plan counts llama blocks; {recipe}'s model provider builds the real model "
                     f"({_FAMILY_EXTRAS[family]}), which these keys leave to it (parameters the plan does not count).")
    if not own:
        notes.append(f"{m.name or m.arch}: no Megatron-Bridge recipe of this model; {recipe} ({what}) is of the "
                     "closest family: check that its model provider's block form (activation, norms, positions, "
                     "biases) is the plan's, as the keys set only the shape.")
    if unmapped:
        notes.append("not mapped (set by hand or taken from the recipe): "
                     + "; ".join(f"{flag} ({why})" for flag, why in unmapped.items()) + ".")
    if "mixed_precision" in keys and keys["mixed_precision"] is None:
        notes.append("precision fp32: mixed_precision=null leaves the model provider's own bf16 / params_dtype as the "
                     "recipe builds them; check that they are fp32.")
    on = {k: _hydra_value(keys.get(f"{s}.{k}", False)) for s, k in (("model", "tp_comm_overlap"),
                                                                      ("ddp", "overlap_grad_reduce"),
                                                                      ("ddp", "overlap_param_gather"))}
    notes.append("where the recipe builds a comm_overlap section (a CommOverlapConfig; recipes/common.py's "
                 "_pretrain_common leaves it null), its setup sets model.tp_comm_overlap and, with the distributed "
                 "optimizer and dp > 1, ddp.overlap_grad_reduce / overlap_param_gather from its own fields "
                 "(training/comm_overlap.py): add " + " ".join(f"comm_overlap.{k}={v}" for k, v in on.items())
                 + " there (Hydra refuses them where the section is null).")
    notes.append("model.vocab_size is the plan's padded vocabulary (model.should_pad_vocab=false); a recipe whose "
                 "tokenizer.use_tokenizer_vocab_size is true (_pretrain_common's, recipes/common.py commit 0eca073e) "
                 "takes the tokenizer's size instead: add tokenizer.use_tokenizer_vocab_size=false where your "
                 "Megatron-Bridge has that field.")
    nnodes, nproc = _nodes(plan)
    if nproc != min(plan.hardware.gpus, plan.hardware.gpus_per_node):  # nodes not filled
        notes.append(f"{plan.hardware.gpus} GPUs do not fill {plan.hardware.gpus_per_node}-GPU nodes: launched as "
                     f"{nnodes} nodes x {nproc} (torchrun starts the same number of ranks on every node).")
    env = "CUDA_DEVICE_MAX_CONNECTIONS=1 " if (p.tp > 1 or p.cp > 1) and p.zero_stage != 3 else ""
    header = [f"parplan export --to megatron-bridge: {m.name or m.arch} on {plan.hardware.gpus} x {plan.hardware.name}",
              f"tp={p.tp} pp={p.pp} vpp={p.vpp} dp={p.dp} cp={p.cp} sp={p.sp} zero={p.zero_stage} "
              f"recompute={p.recompute}{f' ({p.recompute_layers} blocks/stage)' if p.recompute_layers else ''} "
              f"schedule={p.schedule} offload={p.offload}",
              "Megatron-Bridge ConfigContainer overrides, one KEY=VALUE a line in Hydra's syntax (shell-quoted where "
              "needed): the Megatron-LM flags of `parplan export --to megatron` on the fields of "
              "NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/training/config.py (commit 4feb11f8), "
              "models/gpt_provider.py (commit 0254ddd4) and Megatron-Core's TransformerConfig; checked against the "
              "sources, not run.",
              f"Recipe: {recipe} ({what}){'' if own else ', the closest family'}. It builds the model provider (the "
              "block's form: activation, norms, positions, biases; the recipes read build it from the model's Hugging "
              "Face config) and every field these keys leave alone.",
              "Run from a Megatron-Bridge checkout, this file saved as bridge-overrides.txt "
              "(scripts/training/run_recipe.py, commit 10feab50, reads trailing KEY=VALUE overrides):",
              f"  grep -v '^#' bridge-overrides.txt | {env}xargs torchrun --nnodes {nnodes} --nproc-per-node {nproc} "
              '--node-rank "${NODE_RANK:-0}" --master-addr "${MASTER_ADDR:-localhost}" '
              f'--master-port "${{MASTER_PORT:-6000}}" scripts/training/run_recipe.py --recipe {recipe}']
    lines = _comment_lines(header)
    lines += [f"# note: {n}" for n in notes]
    lines += [shlex.quote(f"{path}={_hydra_value(v)}") for path, v in keys.items()]
    return "\n".join(lines) + "\n", notes


# --------------------------------------------------------------------------------------------
# torchtitan

_TITAN_SCHEDULES = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved-1f1b": "Interleaved1F1B",
    "interleaved-zb": "InterleavedZeroBubble",
    "zbv": "ZBVZeroBubble",
}

# torchtitan/models/llama3/__init__.py flavors (each with rope_theta 500000): (hidden, layers, heads, kv_heads,
# ffn_hidden, vocab)
_TITAN_LLAMA3_ROPE_THETA = 500000.0
_TITAN_LLAMA3_FLAVORS = {
    (4096, 32, 32, 8, 14336, 128256): "8B",
    (8192, 80, 64, 8, 28672, 128256): "70B",
    (16384, 126, 128, 8, 53248, 128256): "405B",
}


def _full_attention_note(plan: Plan, to: str, trains: str = "Megatron-LM trains the window (--window-size)") -> list[str]:
    """A model with a sliding window exported to a framework that attends over the whole prefix; `trains`: what
    would train the window instead."""
    m, t = plan.model, plan.training
    if not m.window_binds(t.seq_len):
        return []
    counted = "as the prediction counts it" if not trains_window(m, t.framework) else \
        f"which this plan's prediction (for {t.framework}) does not count"
    return [f"sliding window {m.sliding_window}: {to} attends over the whole prefix in every layer, {counted}; {trains}"]


def titan_layer_sac_frequency(plan: Plan) -> int | None:
    """torchtitan's selective_ac_option for a plan's partial full recompute (Parallel.recompute_layers N a stage):
    the frequency f whose every-f-th-block checkpointing recomputes N blocks of each of the plan's stages
    (layout.titan_layer_sac_freq: stages of one size, no multi-token prediction), or None."""
    p, m = plan.parallel, plan.model
    if p.recompute != "full" or not p.recompute_layers or m.mtp_layers:
        return None
    sizes = _stage_sizes(plan)
    return titan_layer_sac_freq(sizes[0], p.vpp, p.recompute_layers) if len(set(sizes)) == 1 else None


def _stage_sizes(plan: Plan) -> list[int]:
    """The blocks of each virtual stage: the plan's own split, else the default split of its blocks."""
    p = plan.parallel
    return p.stage_layers or model_stage_layers(plan.model.layers, 0, p.pp * p.vpp)


def _titan_whole_blocks_note(plan: Plan) -> list[str]:
    """A partial full recompute torchtitan's layer-level checkpointing cannot give (titan_layer_sac_frequency None),
    exported as every block."""
    p, m = plan.parallel, plan.model
    if p.recompute != "full" or not p.recompute_layers:
        return []
    sizes = _stage_sizes(plan)
    return [f"recompute full of {p.recompute_layers} blocks per stage: torchtitan's layer-level checkpointing (every "
            "f-th block, selective_ac_option f) gives " + ("the same count in every stage only where the stages are of "
                                                          "one size" if len(set(sizes)) > 1 or m.mtp_layers else
                                                          f"other counts on stages of {sizes[0]} blocks")
            + ", so it is exported as every block (more recompute, less activation memory than predicted); plan it "
            "with --framework torchtitan for a count it gives."]


def _whole_blocks_note(plan: Plan, to: str) -> list[str]:
    """Partial full recompute (Parallel.recompute_layers) exported to a framework that recomputes every block or none."""
    p = plan.parallel
    if p.recompute != "full" or not p.recompute_layers:
        return []
    return [f"recompute full of {p.recompute_layers} blocks per stage: {to} recomputes every block or none, so it is "
            "exported as every block (more recompute, less activation memory than predicted); Megatron-LM runs it "
            "(--recompute-method block)."]


def titan_ffn_width(dim: int, multiplier: float | None, multiple_of: int) -> int:
    """torchtitan's llama3 FeedForward width: 2/3 of 4 x dim, scaled by ffn_dim_multiplier, rounded up to a
    multiple of multiple_of (torchtitan/models/llama3/model: FeedForward.__init__)."""
    hidden = int(2 * 4 * dim / 3)
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def _titan_ffn_args(dim: int, ffn: int) -> str:
    """ffn_dim_multiplier and multiple_of that give torchtitan's llama3 an MLP `ffn` wide (it has no width field):
    the largest power-of-two multiple_of up to 1024 dividing ffn, and the shortest decimal multiplier near
    ffn / (8 dim / 3) that FeedForward's truncation and rounding turn into exactly ffn (checked, printed in full)."""
    multiple_of = max(m for m in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) if ffn % m == 0)
    base = int(2 * 4 * dim / 3)
    if titan_ffn_width(dim, None, multiple_of) == ffn:
        return f"ffn_dim_multiplier=None, multiple_of={multiple_of}"
    for digits in range(1, 13):  # the shortest decimal whose product truncates into the width's rounding step
        scale = 10 ** digits
        for mult in (math.floor(ffn / base * scale) / scale, math.ceil(ffn / base * scale) / scale):
            if mult > 0 and titan_ffn_width(dim, mult, multiple_of) == ffn:
                return f"ffn_dim_multiplier={mult!r}, multiple_of={multiple_of}"
    return f"an MLP width of {ffn} (no ffn_dim_multiplier/multiple_of pair gives it: change FeedForward)"


# torchtitan 0.2.2's mixture-of-experts flavors (torchtitan/models/{qwen3,llama4,gpt_oss}/__init__.py), as the parplan
# presets of the same shapes: (model name, flavor) by the preset whose shape the plan's model has
_TITAN_MOE_FLAVORS = {"qwen3-30b-a3b": ("qwen3", "30B-A3B"), "qwen3-235b-a22b": ("qwen3", "235B-A22B"),
                      "llama4-scout": ("llama4", "17bx16e"), "llama4-maverick": ("llama4", "17bx128e"),
                      "gpt-oss-20b": ("gpt_oss", "20b"), "gpt-oss-120b": ("gpt_oss", "120b"),
                      "deepseek-v2-lite": ("deepseek_v3", "16B"), "deepseek-v2": ("deepseek_v3", "236B"),
                      "deepseek-v3": ("deepseek_v3", "671B")}
# torchtitan 0.2.2's train specs without a pipelining_fn (Trainer: "Pipeline Parallel is enabled but ... does not
# support pipelining")
_TITAN_NO_PIPELINE = ("qwen3", "gpt_oss")
# what torchtitan's deepseek_v3 flavors run beside the plan's blocks
_TITAN_DEEPSEEK_NOTE = ("deepseek_v3: torchtitan's flavors run FlexAttention with a block-causal mask (attn_type "
                        "\"flex\"), which the plan times as the profile's fused causal attention, and its router's "
                        "node-limited groups (num_expert_groups), which the plan's balanced routing does not "
                        "restrict; its TP plan gathers the block input before the replicated down projections, as "
                        "planned (--framework torchtitan)")


def _titan_moe_model(m) -> tuple[str, str, list[str]]:
    """(torchtitan model name, flavor, notes) for a mixture of experts: a built-in flavor of its shape
    (_TITAN_MOE_FLAVORS), else a flavor to register in torchtitan's qwen3 model (routed SwiGLU experts, softmax top-k
    router, every block an MoE one), whose arguments the note gives."""
    shape = tuple(getattr(m, k) for k in MOE_SHAPE)
    for preset, (name, flavor) in _TITAN_MOE_FLAVORS.items():
        if preset_moe_shape(preset) == shape:
            notes = []
            if name == "deepseek_v3":
                notes.append(_TITAN_DEEPSEEK_NOTE)
            elif name == "gpt_oss":
                notes.append("gpt_oss: torchtitan's model is the real one (attention sinks, biases, clamped SwiGLU, "
                             "banded-window layers), which the plan counts as llama blocks with the same windows "
                             "(--framework torchtitan: FlexAttention under its sliding-window mask in the even "
                             "blocks): 0.03 % more parameters than predicted, the sinks' rescaling uncounted")
            elif name == "qwen3":
                notes.append("qwen3: torchtitan's model adds per-head q/k RMSNorms, which the plan does not count: "
                             "their passes and what they save for the backward (at least their inputs, the q and k "
                             "widths a token a block; more in eager torch's composite RMSNorm)")
            else:
                notes.append("llama4: torchtitan's model runs Llama 4's sigmoid top-1 router with its own "
                             "auto-scaled expert widths (the same as the plan's here); its chunked/iRoPE attention is "
                             "the _irope flavors, the plan's attention is full")
            return name, flavor, notes
    flavor = (m.name or "parplan_custom_moe").replace(" ", "_")
    head_dim = m.head_dim or m.hidden // m.heads
    shared = m.shared_expert_ffn or 0
    n_shared = shared // m.ffn_hidden if shared % m.ffn_hidden == 0 else None
    if m.kv_lora_rank is not None:  # torchtitan's deepseek_v3 (DeepSeekV3ModelArgs): leading dense blocks only
        rope = m.qk_rope_head_dim
        notes = [f"torchtitan picks the model by name and flavor and has no built-in flavor of this shape: register "
                 f"{flavor!r} in deepseekv3_args (torchtitan/models/deepseek_v3/__init__.py) as DeepSeekV3ModelArgs("
                 f"vocab_size={m.vocab}, dim={m.hidden}, inter_dim={m.dense_ffn_hidden or m.ffn_hidden}, "
                 f"moe_inter_dim={m.ffn_hidden}, n_layers={m.layers}, n_dense_layers={m.first_dense_layers or 0}, "
                 f"n_heads={m.heads}, moe_args=MoEArgs(num_experts={m.experts}, num_shared_experts={n_shared or 0}, "
                 f"top_k={m.experts_per_token}, score_func=\"softmax\", route_norm=False, score_before_experts=False), "
                 f"q_lora_rank={m.q_lora_rank or 0}, kv_lora_rank={m.kv_lora_rank}, qk_nope_head_dim={head_dim - rope}, "
                 f"qk_rope_head_dim={rope}, v_head_dim={m.v_head_dim})", _TITAN_DEEPSEEK_NOTE]
        if shared and n_shared is None:
            notes.append(f"shared_expert_ffn {shared}: torchtitan's shared experts are num_shared_experts x "
                         f"moe_inter_dim ({m.ffn_hidden}) wide, and {shared} is not a multiple of it; the model differs "
                         "from the plan's")
        if m.moe_layer_step:
            notes.append("moe_layer_step: torchtitan's deepseek_v3 has leading dense blocks only (n_dense_layers), "
                         "not dense blocks between the MoE ones: the model differs from the plan's")
        return "deepseek_v3", flavor, notes
    qwen3 = bool(m.qk_norm) or _qwen_family(m) == "Qwen3"  # (ModelSpec.qk_norm: Qwen3Attention's q_norm / k_norm)
    notes = [f"torchtitan picks the model by name and flavor and has no built-in flavor of this shape: register "
             f"{flavor!r} in qwen3_args (torchtitan/models/qwen3/__init__.py) as Qwen3ModelArgs(dim={m.hidden}, "
             f"n_layers={m.layers}, n_heads={m.heads}, n_kv_heads={m.kv_heads}, head_dim={head_dim}, "
             f"vocab_size={m.vocab}, rope_theta={m.rope_base:g}, qk_norm={qwen3}, "
             f"enable_weight_tying={m.tied_embeddings}, moe_enabled=True, moe_inter_dim={m.ffn_hidden}, "
             f"moe_args=MoEArgs(num_experts={m.experts}, top_k={m.experts_per_token}, "
             f"num_shared_experts={n_shared or 0}, score_func=\"softmax\", route_norm=True, "
             f"score_before_experts=False))" + ("; its per-head q/k RMSNorms are not in the plan's count" if qwen3
                                                and not m.qk_norm else "")]
    if shared and n_shared is None:
        notes.append(f"shared_expert_ffn {shared}: torchtitan's shared experts are num_shared_experts x moe_inter_dim "
                     f"({m.ffn_hidden}) wide, and {shared} is not a multiple of it; the model differs from the plan's")
    if m.first_dense_layers or m.moe_layer_step:
        notes.append("dense blocks between the MoE ones (first_dense_layers / moe_layer_step): torchtitan's qwen3 makes "
                     "every block an MoE one (its llama4 interleaves with interleave_moe_layer_step, its deepseek_v3 "
                     "leads with n_dense_layers): the model differs from the plan's")
    return "qwen3", flavor, notes


def _torchtitan(plan: Plan, release: str | None = None) -> tuple[str, list[str]]:
    """torchtitan's TOML: keys of commit 000204a4 (release None; torchtitan 0.1.0 reads them), or of its 0.2 releases
    (release "0.2": [compile] enable, [debug] seed and module_fqns_per_model_part, which 0.2's config manager asks for
    where it refuses the older keys)."""
    m, t, p = plan.model, plan.training, plan.parallel
    new = release == "0.2"
    sac_freq = titan_layer_sac_frequency(plan)
    moe_model = _titan_moe_model(m) if m.is_moe else None
    windowed = moe_model is not None and moe_model[0] == "gpt_oss"  # (its model trains the window: trains_window)
    notes: list[str] = ([] if windowed else _full_attention_note(plan, "torchtitan's llama3")) + (
        [] if sac_freq else _titan_whole_blocks_note(plan))
    if moe_model:
        notes += _checkpoint_note(m) + moe_model[2]
    else:
        notes += _checkpoint_note(m) + _family_note(m, "torchtitan's llama3 model", "torchtitan's own model for the "
                                                    "family, where the release has one, trains it: a few parameters "
                                                    "more than predicted")

    if m.qk_norm and m.qk_norm_whole:  # (ModelSpec.qk_norm_whole)
        notes.append("the model's q/k norms normalise a token's whole query and key widths (OLMo 2's); torchtitan's "
                     "qwen3 normalises each head (qk_norm) and its llama3 has none: the model trained differs from "
                     "the plan's there (the passes alike; the statistics' all-reduce over tp, counted, is not run)")
    # [model]
    if m.arch != "llama":
        notes.append("arch gpt: torchtitan has no GPT-2-style model (LayerNorm, GeLU, learned positions, "
                     "biases); exported as the llama3 model, so parameter count and FLOPs differ.")
    shape = (m.hidden, m.layers, m.heads, m.kv_heads, m.ffn_hidden, m.vocab)
    flavor = _TITAN_LLAMA3_FLAVORS.get(shape) if m.arch == "llama" and m.head_dim in (None, m.hidden // m.heads) \
        and not m.tied_embeddings else None
    model_name = "llama3"
    if moe_model:
        model_name, flavor = moe_model[0], moe_model[1]
        if p.pp > 1 and model_name in _TITAN_NO_PIPELINE:
            notes.append(f"pp {p.pp}: torchtitan 0.2.2's {model_name} train spec has no pipelining_fn, and its Trainer "
                         f"refuses pipeline parallelism for it (\"does not support pipelining\"); plan with --pp 1, "
                         "or use a release whose model pipelines.")
    elif flavor is None:
        flavor = (m.name or "parplan_custom").replace(" ", "_")
        notes.append(f"torchtitan picks the model shape by flavor and has no built-in llama3 flavor with this "
                     f"shape; register {flavor!r} in llama3_configs (torchtitan/models/llama3/__init__.py) with "
                     f"dim={m.hidden}, n_layers={m.layers}, n_heads={m.heads}, n_kv_heads={m.kv_heads}, "
                     f"{_titan_ffn_args(m.hidden, m.ffn_hidden)} (an MLP width of {m.ffn_hidden}), "
                     f"vocab_size={m.vocab}, rope_theta={m.rope_base:g}.")
    elif m.rope_base != _TITAN_LLAMA3_ROPE_THETA and not moe_model:
        notes.append(f"rope_theta: torchtitan's {flavor} flavor uses {_TITAN_LLAMA3_ROPE_THETA:g}, the plan's model "
                     f"{m.rope_base:g}; change the flavor's rope_theta to match.")
    if m.head_dim is not None and m.head_dim * m.heads != m.hidden and not moe_model:
        notes.append(f"head_dim {m.head_dim}: torchtitan's llama3 derives the head size as dim / n_heads "
                     f"({m.hidden // m.heads} here) and has no head_dim setting, so its attention is smaller than the "
                     "plan's unless the model code is changed.")
    if t.dropout:
        notes.append("dropout: torchtitan's llama3 has no dropout; the plan's is not exported.")
    float8: list[tuple[str, Any]] = []
    if t.fp8:
        # torchao's float8 linears (tensor-wise dynamic scaling, the cost model's "torchao" scheme), the output
        # layer left in 16 bits as torchtitan's llama3 configs filter it
        float8 = [("enable_fsdp_float8_all_gather", False), ("precompute_float8_dynamic_scale_for_fsdp", False),
                  ("filter_fqns", ["output"])]
        notes.append("fp8: [model] converters = [\"float8\"] (torchao's float8 linears, tensor-wise scales; newer "
                     "torchtitan's Python configs default to row-wise, which the prediction does not model). "
                     "enable_fsdp_float8_all_gather stays false, as the prediction counts FSDP's gathers at 16 bits; "
                     "turning it on (with precompute_float8_dynamic_scale_for_fsdp) halves the linears' gathers.")
    if m.arch == "llama" and m.tied_embeddings and not moe_model:
        notes.append("tied_embeddings: torchtitan's llama3 has its own output layer, one vocab x hidden matrix "
                     "(embedding-sized) more than the plan counts in parameters, gradients and optimizer states.")

    # [training]
    pp_on = p.pp > 1
    local_batch = t.micro_batch_size * t.num_microbatches if pp_on else t.micro_batch_size
    steps = _train_steps(plan)
    if steps is None:
        steps = 1000
        notes.append("training.tokens is not set: steps = 1000 is a placeholder.")
    if t.precision == "fp32" or t.dtype == "fp32":
        mp_param = "float32"
    else:
        mp_param = "bfloat16"
        if t.dtype == "fp16":
            notes.append("dtype fp16: torchtitan's mixed_precision_param accepts bfloat16 or float32 only; "
                         "exported as bfloat16.")

    # [parallelism]
    if p.zero_stage == 0:
        replicate, shard, reshard = p.dp, 1, None
        if p.dp > 1 and max(p.tp, p.pp, p.cp) > 1:
            notes.append("zero_stage 0 with tp/pp/cp > 1: torchtitan's DDP (data_parallel_replicate_degree) refuses "
                         "more than one parallel dimension (parallelize_llama: \"DDP has not supported > 1D "
                         "parallelism\"); plan with --zero 3 to export FSDP (data_parallel_shard_degree) instead.")
        elif p.dp > 1:
            notes.append("zero_stage 0: mapped to data_parallel_replicate_degree = dp (DDP, no sharding).")
        if p.cp > 1:  # ParallelDims.fsdp_enabled: dp_shard > 1 or cp > 1
            notes.append("zero_stage 0 with cp > 1: torchtitan turns FSDP on whenever cp > 1 and shards parameters, "
                         "gradients and optimizer states over the cp ranks: less memory and more traffic than the "
                         "prediction; plan with --framework torchtitan for its ZeRO-3 over dp x cp.")
    elif p.zero_stage == 3:
        # torchtitan's "default" is reshard_after_forward = not pp_enabled: inside a pipeline the parameters stay
        # gathered from a stage's first forward to its last backward ("to avoid per-microbatch all-gathers"), which
        # is what the prediction counts (gathered weights in full, one gather and one reduce-scatter a step) and
        # what parplan's runtime runs (apply_fsdp); "always" would gather again for every micro-batch's backward
        # hybrid sharding: torchtitan's 2D (replicate, shard) mesh, FSDP2's HSDP (ParallelDims: dp_replicate x
        # dp_shard = dp), the shard dimension inside each replica
        replicate, shard, reshard = p.dp_replicate, p.dp // p.dp_replicate, "default"
    else:
        replicate, shard, reshard = 1, p.dp, "never"
        if p.dp_replicate > 1:  # Megatron's ZeRO-1 optimizer instances
            notes.append(_hybrid_not_written(p, "torchtitan's FSDP"))
        if p.dp > 1:
            notes.append(f"zero_stage {p.zero_stage}: torchtitan only has FSDP; exported as FSDP with "
                         "fsdp_reshard_after_forward = \"never\" (parameters stay gathered between forward and "
                         "backward, ZeRO-2-like)" + (", which also shards gradients, unlike ZeRO-1." if
                                                     p.zero_stage == 1 else "."))
    if shard == 1 and p.cp == 1 and (p.tp > 1 or p.pp > 1) and mp_param != "float32":
        # torchtitan/distributed/utils.py maybe_enable_amp: mixed precision lives in FSDP's policy, and without
        # FSDP it is on for DDP/single-device only
        notes.append("no FSDP (data_parallel_shard_degree 1) with tp/pp > 1: torchtitan turns mixed precision off "
                     "(\"Mixed precision training with TP or PP is only supported when FSDP/HSDP/CP is enabled\") "
                     "and trains in fp32: slower and larger than the prediction; plan with --zero 3 to export FSDP.")
    if t.precision == "master-weights-half-grads" and mp_param != "float32":
        notes.append("precision master-weights-half-grads: torchtitan's mixed_precision_reduce accepts float32 "
                     "only in the TOML-configured versions (commit 000204a4), so gradients are reduced and kept in "
                     "fp32, not the plan's 16-bit ones; newer main also takes bfloat16 there.")
    if p.tp > 1 and not p.sp:
        notes.append("sp false: torchtitan always applies sequence parallelism with tensor parallelism in the "
                     "TOML-configured versions, so activation memory is below the prediction.")
    if p.offload == "optimizer":
        notes.append("offload optimizer: torchtitan's training.enable_cpu_offload is FSDP CPU offload of "
                     "parameters, gradients and optimizer states together (more than optimizer offload)"
                     + ("; it needs data_parallel_shard_degree > 1." if shard <= 1 else "."))
    async_tp = bool(t.overlap_tp_comm and p.tp > 1)
    if async_tp and not t.fused_elementwise:
        async_tp = False
        # parallelize_llama: "Async TP requires --training.compile" (a RuntimeError at start-up)
        notes.append("overlap_tp_comm: torchtitan's enable_async_tensor_parallel needs torch.compile, and this plan "
                     "exports compile = false (eager pointwise work), so async TP is left off and the TP "
                     "collectives are exposed; plan with --fused-elementwise to export both.")
    if p.recompute == "selective":
        notes.append("recompute selective: torchtitan's op-level selective activation checkpointing "
                     "(selective_ac_option = \"op\") uses its own save policy, not Korthikanti's attention+MLP-"
                     "activation recompute; activation memory will differ (plan with --recompute selective-op "
                     "for torchtitan's policy).")
    if p.cp > 1 and not t.flash_attention:
        notes.append("flash_attention false: torchtitan's context parallelism runs on SDPA flash/efficient kernels.")
    if pp_on and p.schedule in ("zbv", "interleaved-zb") and p.recompute != "none":
        # every recompute mode exports as an activation-checkpoint mode (selective as torchtitan's op-level one)
        notes.append(f"schedule {p.schedule} with recompute {p.recompute}: torchtitan runs torch's own weight-gradient "
                     "pass, which re-runs each checkpointed block's forward once per weight and holds every re-run "
                     "(pytorch/pytorch#136766): far more memory and recompute than the prediction, which has "
                     "parplan's queued weight gradients; use recompute none or a 1F1B schedule there.")

    par: list[tuple[str, Any]] = [
        ("data_parallel_replicate_degree", replicate),
        ("data_parallel_shard_degree", shard),
    ]
    if reshard is not None:
        par.append(("fsdp_reshard_after_forward", reshard))
    par += [
        ("tensor_parallel_degree", p.tp),
        ("enable_async_tensor_parallel", async_tp),
        ("pipeline_parallel_degree", p.pp),
    ]
    if pp_on:
        counts = plan_stage_layers(plan)
        bounds, acc = [], 0
        for n in counts[:-1]:
            acc += n
            bounds.append(f"layers.{acc}")
        if any(n == 0 for n in counts):
            key = "module_fqns_per_model_part" if new else "pipeline_parallel_split_points"
            notes.append("a pipeline stage holds no transformer block; torchtitan's split points cannot express "
                         f"an empty stage, check {key}.")
        par += [
            ("pipeline_parallel_schedule", _TITAN_SCHEDULES[p.schedule]),
            ("pipeline_parallel_microbatch_size", t.micro_batch_size),
        ]
        # later TOML-configured torchtitan refuses the split points ("deprecated. Please use
        # module_fqns_per_model_part instead", torchtitan/models/llama3/infra/pipeline.py) or ignores them and splits
        # by its own rule (first and last stage one layer less): the same split in that key's form
        parts, start = [], 0
        for i, n in enumerate(counts):
            mods = [f"layers.{j}" for j in range(start, start + n)]
            start += n
            parts.append((["tok_embeddings"] if i == 0 else []) + mods + (["norm", "output"] if i == len(counts) - 1 else []))
        if new:
            par.append(("module_fqns_per_model_part", parts))
        else:
            par.append(("pipeline_parallel_split_points", bounds))
            notes.append("torchtitan releases after this file's commit replace pipeline_parallel_split_points with "
                         "parallelism.module_fqns_per_model_part (they refuse the split points, or split by their own "
                         "rule; `--to torchtitan-0.2` writes it); this plan's stages there: "
                         f"module_fqns_per_model_part = {toml_value(parts)}")
    par.append(("context_parallel_degree", p.cp))
    if m.is_moe:
        # torchtitan's experts' mesh (pp, dp_replicate, efsdp, ep, etp): the experts whole (etp 1), as planned
        # (core.titan_ep_problem); its dispatch: torch's all-to-all ("standard") or DeepEP's kernels
        par += [("expert_parallel_degree", p.ep), ("expert_tensor_parallel_degree", 1),
                ("expert_parallel_comm_backend", "deepep" if t.moe_dispatcher == "deepep" else "standard")]
        if t.moe_dispatcher == "deepep" and p.ep == 1:
            notes.append("moe_dispatcher deepep with ep 1: torchtitan's DeepEP needs expert parallelism (\"DeepEP "
                         "requires expert parallelism (ep_degree > 1)\"); set ep > 1 or the standard backend.")
    if p.cp > 1 and not t.overlap_cp_comm:
        notes.append("overlap_cp_comm off: the prediction's context parallelism all-gathers K/V before the attention; "
                     "torchtitan's (torch's) gathers them behind the rank's own chunk, so its run may be faster.")

    sections: list[tuple[str, list[tuple[str, Any]]]] = [
        ("job", [("description", f"parplan plan: {m.name or m.arch} on {plan.hardware.gpus} x {plan.hardware.name}")]),
        ("model", [("name", model_name), ("flavor", flavor)] + ([("converters", ["float8"])] if t.fp8 else [])),
        ("optimizer", [("name", "AdamW"), ("lr", float(t.lr))]),
        # the constant learning rate parplan's runtime trains with: torchtitan's default is a 200-step warm-up, then a
        # linear decay to 0 over the steps (LRScheduler; decay_ratio 0 leaves no decay steps)
        ("lr_scheduler", [("warmup_steps", 0), ("decay_ratio", 0.0)]),
        ("training", [
            ("local_batch_size", local_batch),
            ("global_batch_size", t.global_batch_size),
            ("seq_len", t.seq_len),
            ("max_norm", float(t.clip_grad) if t.clip_grad is not None else math.inf),  # inf: no clipping
            ("steps", steps),
            ("mixed_precision_param", mp_param),
            ("mixed_precision_reduce", "float32"),
            *([] if new else [("compile", bool(t.fused_elementwise))]),
            ("enable_cpu_offload", p.offload == "optimizer"),
            *([] if new else [("seed", t.seed)]),
        ]),
        ("parallelism", par),
        ("activation_checkpoint",
         # partial full recompute as its layer-level selective checkpointing: every sac_freq-th block whole
         [("mode", "selective"), ("selective_ac_option", str(sac_freq))] if sac_freq else
         [("mode", "selective" if p.recompute == "selective-op" else p.recompute)] +
         ([("selective_ac_option", "op")] if p.recompute in ("selective", "selective-op") else [])),
    ]
    if float8:
        sections.append(("float8", float8))
    if new:
        sections += [("compile", [("enable", bool(t.fused_elementwise))]), ("debug", [("seed", t.seed)])]

    nnodes, nproc = _nodes(plan)
    if nnodes > 1:
        notes.append(f"{nnodes} nodes: run_train.sh starts one node's ranks (torchrun --nproc_per_node=$NGPU on "
                     f"localhost); start {nproc} ranks on each of the {nnodes} nodes with a multi-node torchrun "
                     "(--nnodes, --rdzv-endpoint) or torchtitan's multinode_trainer.slurm.")
    notes.append("[model] names no tokenizer: set the tokenizer path (model.tokenizer_path, or hf_assets_path in newer "
                 "torchtitan) to your tokenizer before training.")
    header = [f"parplan export --to torchtitan: {m.name or m.arch}, {plan.hardware.gpus} GPUs "
              f"({plan.hardware.name}); launch with NGPU={nproc} CONFIG_FILE=<this file> ./run_train.sh"
              + (" on each node" if nnodes > 1 else ""),
              ("Keys of torchtitan's 0.2 TOML releases (0.2.2's ConfigManager read them, 2026-12-03). torchtitan 0.3"
               if new else "Keys follow pytorch/torchtitan torchtitan/config/job_config.py (commit 000204a4). torchtitan "
               "0.3"),
              "and main read no TOML: they configure runs in Python (Trainer.Config); main counts the batch in tokens (torchtitan/config/",
              f"training.py, commit f204eb63): training.num_tokens_per_microbatch_per_dp_rank = {t.micro_batch_size * t.seq_len}"
              f" (micro-batch {t.micro_batch_size} x seq_len {t.seq_len}),",
              f"num_tokens_per_train_step = {t.global_batch_size * t.seq_len}, max_context_length = {t.seq_len}"
              + (f", and parallelism.num_pp_microbatches = {t.num_microbatches} in place of "
                 "pipeline_parallel_microbatch_size" if p.pp > 1 else "") + "; other sections moved too: check its",
              "config/ folder." + ("" if new else " Later TOML releases moved training.compile to [compile] enable and "
                                   "training.seed to [debug] seed (their config manager refuses unknown keys): "
                                   "`--to torchtitan-0.2` writes them so."),
              f"shape: layers={m.layers} hidden={m.hidden} heads={m.heads} kv_heads={m.kv_heads} "
              f"ffn_hidden={m.ffn_hidden} vocab={m.vocab}" + (f" experts={m.experts} top_k={m.experts_per_token} "
                                                              f"ep={p.ep}" if m.is_moe else ""),
              f"batch: {t.global_batch_size} = dp {p.dp} x micro {t.micro_batch_size} x {t.num_microbatches} "
              f"micro-batches" + (" (pipeline micro-batches from local_batch_size / "
                                  "pipeline_parallel_microbatch_size)" if pp_on else
                                  " (gradient accumulation from global_batch_size / (local_batch_size x dp))")]
    lines = _comment_lines(header) + [f"# note: {n}" for n in notes]
    for name, items in sections:
        lines.append("")
        lines.append(f"[{name}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in items]
    return "\n".join(lines) + "\n", notes


# --------------------------------------------------------------------------------------------
# DeepSpeed

def _hybrid_not_written(p, target: str) -> str:
    """The note of an export that writes a hybrid-sharded plan (dp_replicate > 1) as full sharding."""
    return (f"dp_replicate {p.dp_replicate} (hybrid sharding: {p.dp_replicate} replicas of {p.dp // p.dp_replicate} "
            f"ranks that shard): not written; {target} shards over all dp {p.dp} ranks here, with less memory and more "
            "cross-node traffic than the prediction (" + ("the torchtitan and llm-foundry exports write it"
                                                           if p.zero_stage == 3 else
                                                           "the Megatron-LM exports write it: "
                                                           "--num-distributed-optimizer-instances") + ").")


def _deepspeed(plan: Plan) -> tuple[str, list[str]]:
    t, p = plan.training, plan.parallel
    notes: list[str] = (_full_attention_note(plan, "Megatron-DeepSpeed's GPT model")
                        + _whole_blocks_note(plan, "this DeepSpeed export"))
    if p.dp_replicate > 1:
        notes.append(_hybrid_not_written(p, f"DeepSpeed's ZeRO-{p.zero_stage}"))
    if t.fp8:
        notes.append("fp8: not written; DeepSpeed's configuration has no FP8 switch (FP8 comes from Transformer "
                     "Engine modules in the model's own code), so this run multiplies in 16 bits, slower than the "
                     "plan's FP8 prediction.")
    cfg: dict[str, Any] = {
        "train_batch_size": t.global_batch_size,
        "train_micro_batch_size_per_gpu": t.micro_batch_size,
        "gradient_accumulation_steps": t.num_microbatches,
        "gradient_clipping": float(t.clip_grad or 0.0),  # 0: none
        # the optimizer the plan counts (AdamW: two fp32 states a parameter) at the plan's learning rate
        "optimizer": {"type": "AdamW", "params": {"lr": t.lr, "betas": list(ADAMW_BETAS),
                                                  "weight_decay": ADAMW_WEIGHT_DECAY}},
    }
    if deepspeed_bf16_optimizer(t.dtype, t.precision):
        cfg["bf16"] = {"enabled": True}
    elif t.precision != "fp32" and t.dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0}
    # DeepSpeed's PipelineEngine asserts ZeRO stage < 2 ("ZeRO-2 and ZeRO-3 are incompatible with pipeline
    # parallelism"): a config it would refuse is no export
    stage = min(p.zero_stage, 1) if p.pp > 1 else p.zero_stage
    if stage != p.zero_stage:
        # the prediction held full gradients too where its ZeRO-2 reduced once a step (parplan's runtime)
        more = p.zero_stage == 3 or t.zero2_grad_reduce == "per-micro-batch"
        notes.append(f"zero_stage {p.zero_stage} with pipeline parallelism: DeepSpeed's pipeline engine refuses ZeRO "
                     "stages 2 and 3, so zero_optimization.stage is 1 (gradients unsharded"
                     + (": more memory than the prediction" if more else ", as predicted") +
                     f"; `parplan recommend ... --pp {p.pp} --zero 1` predicts that layout).")
    # a bf16 model without ZeRO (engine._do_optimizer_sanity_check, DeepSpeed 007cca6a and later): outside a pipeline
    # DDP_BFLOAT16, plain data parallelism (FP16_Optimizer in bf16: fp32 master weights and Adam states on every rank,
    # bf16 gradients); inside one its BF16_Optimizer, which shards the fp32 master weights and Adam states over the
    # data-parallel ranks (planner.core.DEEPSPEED_BF16_ZERO0).  fp32 gradient accumulation there is refused ("unsupported
    # mix of model_dtype ... and grad_accum_dtype"), so no data_types at stage 0
    shards = p.dp * p.cp
    if stage == 0 and "bf16" in cfg and p.pp > 1:
        notes.append("zero_stage 0 in bf16 inside a pipeline: DeepSpeed runs its BF16_Optimizer, "
                     + ("over one data-parallel rank: what the plan holds" if shards == 1 else
                        f"which shards the optimizer over the {shards} data-parallel ranks: less memory than this "
                        "ZeRO-0 plan; `--framework deepspeed` plans it as ZeRO-1")
                     + "; its gradients accumulate in bf16.")
    zero: dict[str, Any] = {"stage": stage}
    bf16_optimizer = False
    if t.precision == "master-weights" and t.dtype == "bf16":
        # the plan's fp32 gradients: DeepSpeed accumulates in the model's dtype unless told (engine.get_data_types).
        # fp32 accumulation selects its BF16_Optimizer at stage 1 (fp32 gradients all-reduced:
        # buffered_allreduce_fallback), which is the plan only where it all-reduces; stage 0 refuses it (above);
        # stages 2-3 accumulate their gradient shards in fp32 (stage_1_and_2 averaged_gradients, stage3
        # grad_partitions_flat_buffer) and reduce in communication_data_type, fp32 as the plan reduces
        if stage == 1 and t.zero1_grad_reduce == "all-reduce":
            cfg["data_types"] = {"grad_accum_dtype": "fp32"}
            # the engine's all-reduce casts each flat bucket to communication_data_type, the model's bf16 unless told
            # (engine.communication_data_type; allreduce_bucket's tensor.to(...)): fp32, as the plan reduces
            cfg["communication_data_type"] = "fp32"
            # DeepSpeed picks its BF16_Optimizer only without CPU offload (the memory model asks the same question)
            bf16_optimizer = bool(deepspeed_bf16_optimizer_steps(stage, True, t.precision, t.dtype,
                                                                 p.offload == "optimizer"))
        elif stage == 1:
            notes.append("precision master-weights at zero_stage 1 with a reduce-scatter: DeepSpeed's fp32 gradient "
                         "accumulation would select its BF16_Optimizer, which all-reduces; exported without it, so "
                         "DeepSpeed's ZeRO-1 keeps and reduce-scatters bf16 gradients, not the plan's fp32 ones (less "
                         "gradient memory and traffic); plan with --zero1-grad-reduce all-reduce for the BF16 optimizer.")
        elif stage == 0:
            notes.append("precision master-weights at zero_stage 0: DeepSpeed refuses fp32 gradient accumulation with "
                         "a bf16 model without ZeRO, so its gradients are bf16, not the plan's fp32 ones (less gradient "
                         "memory and traffic).")
        else:
            cfg["data_types"] = {"grad_accum_dtype": "fp32"}
            cfg["communication_data_type"] = "fp32"
            notes.append(f"precision master-weights at zero_stage {stage}: data_types.grad_accum_dtype fp32 keeps "
                         f"DeepSpeed's ZeRO-{stage} gradient shards in fp32 and communication_data_type fp32 reduces "
                         "them in fp32, as the plan does; each micro-batch's backward still writes bf16 gradients "
                         "before the reduction.")
    if t.precision == "master-weights" and t.dtype == "fp16":
        notes.append("precision master-weights with fp16: DeepSpeed's fp16 mode keeps 16-bit gradients, not the "
                     "plan's fp32 ones.")
    if stage >= 1:
        # DeepSpeed's pipeline engine turns overlap_comm off ("Pipeline parallelism does not support overlapped
        # communication, will be disabled"), and the BF16_Optimizer never reads it
        honoured = p.pp == 1 and not bf16_optimizer
        zero["overlap_comm"] = bool(t.overlap_grad_reduce) and honoured
        if t.overlap_grad_reduce and not honoured and p.dp > 1:
            notes.append("overlap_grad_reduce: DeepSpeed does not overlap the gradient reduction "
                         + ("under its pipeline engine" if p.pp > 1 else "in its BF16_Optimizer")
                         + ", so it runs after the backward, slower than predicted (plan with --no-overlap-grad-reduce "
                           "to predict that).")
        zero["contiguous_gradients"] = True
        # the gradient buckets the prediction holds (memory.deepspeed_grad_buckets): DeepSpeed's default size, written
        # out, since each is allocated whole (a smaller one saves memory; the prediction would not know)
        zero["reduce_bucket_size"] = int(zero3.REDUCE_BUCKET_ELEMENTS)
    if stage >= 3:
        # the stage-3 schedule the prediction assumed (cost_models/zero3.py): DeepSpeed's default prefetch
        # bucket and reuse distance, and a live-parameter cap that lets it prefetch the next weight
        # (where a weight pair exceeds the 1e9 default, DeepSpeed would stop prefetching)
        pair = float(zero3.largest_adjacent_pair(zero3.weight_elements(ModelDims.from_spec(plan.model, t.seq_len), p.tp)))
        zero["stage3_prefetch_bucket_size"] = int(zero3.PREFETCH_BUCKET_ELEMENTS)
        zero["stage3_max_reuse_distance"] = int(zero3.MAX_REUSE_DISTANCE_ELEMENTS)
        zero["stage3_max_live_parameters"] = int(max(zero3.MAX_LIVE_ELEMENTS, pair))
        # the optimizer step's group: its flat gradient copy is what the prediction holds at the step
        # (memory.step_grad_copy_bytes)
        zero["sub_group_size"] = int(zero3.SUB_GROUP_ELEMENTS)
    if p.offload == "optimizer":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if p.zero_stage == 0:
            notes.append("offload optimizer with zero_stage 0: DeepSpeed offloads optimizer states only under ZeRO "
                         "(stage >= 1); set zero_optimization.stage accordingly.")
    cfg["zero_optimization"] = zero
    if p.pp > 1 and p.tp > 1:
        # what the prediction's pipeline transfers assumed: DeepSpeed's engine partitions activations and
        # gradients over the tensor-parallel group by default (1/tp per rank, all-gathered by the receiver);
        # a plan predicted with whole tensors (parplan's runtime) turns that off, so the run matches it.  Under
        # sequence parallelism the TP ranks hold different sequence chunks, which a partition would mix up:
        # Megatron-DeepSpeed's scripts turn it off there (PARTITIONED_MODE=false with SEQ_PARALLEL)
        partitioned = bool(t.p2p_scatter_gather) and not p.sp
        cfg["pipeline"] = {"pipe_partitioned": partitioned, "grad_partitioned": partitioned}

    if plan.hardware.gpus != p.dp:
        notes.append(f"train_batch_size = micro {t.micro_batch_size} x accumulation {t.num_microbatches} x "
                     f"data-parallel {p.dp}: DeepSpeed divides by the data-parallel size it gets from the "
                     f"model-parallel unit (Megatron-DeepSpeed mpu or PipelineModule), not by all {plan.hardware.gpus} GPUs.")
    if p.tp > 1:
        notes.append(f"tensor parallelism tp={p.tp}" + (" with sequence parallelism" if p.sp else "") +
                     " is not a ds_config key: set it in the model code/launcher (e.g. Megatron-DeepSpeed "
                     f"--tensor-model-parallel-size {p.tp}" + (" --sequence-parallel" if p.sp else "") + ").")
    if p.pp > 1:
        notes.append(f"pipeline parallelism pp={p.pp} is not a ds_config key: build PipelineModule(num_stages={p.pp}) "
                     f"or pass --pipeline-model-parallel-size {p.pp}; gradient_accumulation_steps is the number of "
                     "pipeline micro-batches.")
        if p.schedule != "1f1b" or p.vpp > 1:
            notes.append(f"schedule {p.schedule} (vpp={p.vpp}): DeepSpeed's pipeline engine runs a single-chunk "
                         "1F1B schedule; interleaving and zero-bubble schedules are not available.")
        if p.stage_layers is not None and len(set(p.stage_layers)) > 1:
            notes.append(f"uneven stages {p.stage_layers}: pass them to PipelineModule via partition_method "
                         "(e.g. 'type:transformer' balances blocks; explicit per-stage counts need a custom split).")
    if p.cp > 1:
        notes.append(f"context parallelism cp={p.cp}: DeepSpeed's counterpart is Ulysses sequence parallelism "
                     f"(all-to-all over heads; Megatron-DeepSpeed --ds-sequence-parallel-size {p.cp}), set outside "
                     "ds_config; its communication differs from the predicted K/V exchange ("
                     + ("overlapped with the attention" if plan.training.overlap_cp_comm
                        else "an all-gather before the attention") + ")"
                     + ("; Megatron-DeepSpeed refuses it beside --sequence-parallel, which this plan uses" if p.sp
                        else "") + ".")
    if p.recompute != "none":
        notes.append(f"recompute {p.recompute}: activation recomputation is switched on in the model code "
                     "(deepspeed.checkpointing / Megatron-DeepSpeed --recompute-granularity); ds_config's "
                     "activation_checkpointing section only tunes it.")
    if t.precision == "amp" and t.dtype != "fp32":
        notes.append(f"precision amp: DeepSpeed's {t.dtype} mode keeps 16-bit parameters with fp32 master weights "
                     "in the optimizer, so per-parameter memory differs from the prediction.")
    if t.precision == "fp32" and t.dtype != "fp32":
        notes.append(f"precision fp32 with dtype {t.dtype}: exported without bf16/fp16 sections (plain fp32).")
    if t.overlap_tp_comm:
        notes.append("overlap_tp_comm has no ds_config key.")
    notes.append(f"seed {t.seed}: ds_config has no seed; set it in the training script (e.g. Megatron-DeepSpeed --seed).")
    if t.dropout:
        notes.append("dropout: set in the model code (e.g. Megatron-DeepSpeed --hidden-dropout/--attention-dropout 0.1).")
    return json.dumps(cfg, indent=2) + "\n", notes


# --------------------------------------------------------------------------------------------
# llm-foundry (Composer + PyTorch FSDP): what --framework fsdp predicts

def _yaml_scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"cannot write {v} to YAML")
        # repr's shortest round-trip digits, with a dot in the mantissa: YAML 1.1 loaders (PyYAML) read 1e-08 as a
        # string, 1.0e-08 as a float
        mantissa, e, exp = repr(v).partition("e")
        return (mantissa if "." in mantissa else mantissa + ".0") + (e + exp if e else "")
    if isinstance(v, str):
        # plain where YAML reads it back as the same string (a name, a ${...} reference: a letter, _ or $ first), else
        # JSON-quoted (JSON strings are YAML)
        plain = (v and (v[0].isalpha() or v[0] in "_$") and all(c.isalnum() or c in "_-.${}/" for c in v)
                 and v.lower() not in ("true", "false", "null", "yes", "no", "on", "off", "y", "n"))
        return v if plain else json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_yaml_scalar(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to YAML")


def _yaml_lines(d: dict, indent: int = 0) -> list[str]:
    out = []
    for k, v in d.items():
        if isinstance(v, dict):
            out.append(" " * indent + f"{k}:")
            out += _yaml_lines(v, indent + 2)
        else:
            out.append(" " * indent + f"{k}: {_yaml_scalar(v)}")
    return out


# Composer's FSDP mixed precision (composer/distributed/mosaic_parallelism.py get_mixed_precision): DEFAULT keeps fp32
# sharded parameters, computes in the autocast dtype and reduces in fp32; PURE reduces in it too; FULL is fp32 throughout
# (compute under Composer's autocast precision).  parplan's recipes, as validate's MPT rows map them.  DEFAULT's fp32
# reduction is Composer's since its PR #2628 (2023-10-10, "Fixes default precision to use fp32 reduce dtype"; PR #2047
# of 2023-03 had set it first): older releases may reduce in the 16-bit dtype (_FOUNDRY_OLD_DEFAULT, a note).
_FOUNDRY_OLD_DEFAULT = ("mixed_precision DEFAULT reduces gradients in fp32, as the plan does, in Composer releases "
                        "since its PR #2628 (2023-10); older ones may reduce them in the 16-bit dtype.")
_FOUNDRY_MIXED = {"master-weights": "DEFAULT", "master-weights-half-grads": "PURE", "amp": "FULL", "fp32": "FULL"}
_FOUNDRY_SHARDING = {0: "NO_SHARD", 1: "SHARD_GRAD_OP", 2: "SHARD_GRAD_OP", 3: "FULL_SHARD"}


def _llm_foundry(plan: Plan) -> tuple[str, list[str]]:
    """An llm-foundry training YAML (scripts/train/train.py): the model as an MPT (mpt_causal_lm, whose options cover
    both of parplan's archs: llmfoundry/models/mpt/configuration_mpt.py), the batch, Composer's precision and
    fsdp_config, following scripts/train/yamls/pretrain/mpt-7b.yaml."""
    m, t, p = plan.model, plan.training, plan.parallel
    notes: list[str] = _full_attention_note(plan, "the exported MPT", "MPT's attn_config.sliding_window_size would "
                                            "train one window in every layer, which --framework fsdp does not count")
    notes += _whole_blocks_note(plan, "llm-foundry")
    if plan.training.fp8:
        notes.append("fp8: written as amp_bf16; Composer's precision amp_fp8 runs Transformer Engine's linears, "
                     "which the exported MPT does not build by default, and which the prediction did not model for "
                     "llm-foundry: this run multiplies in 16 bits, slower than the plan's FP8 prediction.")
    notes += _checkpoint_note(m) + _family_note(m, "the exported MPT", "llm-foundry's hf_causal_lm with the "
                                                "checkpoint's name trains the checkpoint's own: a few parameters more "
                                                "than predicted")
    llama = m.arch == "llama"
    expansion = m.ffn_hidden / m.hidden
    ffn: dict[str, Any] = {"ffn_type": "mptglu", "ffn_act_fn": {"name": "silu"}} if llama else {}
    if not expansion.is_integer():
        # MPT's width from a ratio is int(d_model x expansion_ratio), refused where not whole (ffn.py
        # resolve_ffn_hidden_size); ffn_hidden_size gives it exactly and the ratio is then ignored
        ffn["ffn_hidden_size"] = m.ffn_hidden
    if m.head_dim is not None and m.head_dim * m.heads != m.hidden:
        notes.append(f"head_dim {m.head_dim}: MPT's heads are d_model / n_heads = {m.hidden // m.heads} wide; the "
                     "exported model differs from the plan's there.")
    # llm-foundry removed its Triton attention in v0.7.0 (PR #1063, 2024-03): MPTConfig takes torch or flash
    attn: dict[str, Any] = {"attn_impl": "flash" if t.flash_attention or t.attention_kernel == "triton-2022" else "torch"}
    if t.attention_kernel == "triton-2022":
        notes.append("attention_kernel triton-2022 (the plan's, as MPT's published runs had it): llm-foundry has had no "
                     "Triton attention since v0.7.0 (PR #1063), so it is exported as attn_impl flash, which the plan's "
                     "attention time over-states.")
    if m.kv_heads != m.heads:
        attn.update(attn_type="grouped_query_attention", kv_n_heads=m.kv_heads)
    if not m.has_learned_positions:
        theta = float(m.rope_base)
        attn.update(rope=True, rope_theta=int(theta) if theta.is_integer() else theta)
        if attn["attn_impl"] == "torch":  # MPT's default rope_impl, dail, imports flash-attn; HF's rotary does not
            attn["rope_impl"] = "hf"
    model: dict[str, Any] = {"name": "mpt_causal_lm", "init_device": "meta", "d_model": m.hidden, "n_heads": m.heads,
                             "n_layers": m.layers, "expansion_ratio": int(expansion) if expansion.is_integer() else
                             round(expansion, 4),
                             # MPT's learned position table has max_seq_len rows: the model's, as the plan counts it
                             "max_seq_len": m.max_seq_len if m.has_learned_positions and m.max_seq_len
                             else "${max_seq_len}", "vocab_size": m.vocab,
                             "learned_pos_emb": m.has_learned_positions, "no_bias": llama,
                             "norm_type": "rmsnorm" if llama else "low_precision_layernorm",
                             "tie_word_embeddings": bool(m.tied_embeddings), "attn_config": attn}
    if ffn:
        model["ffn_config"] = ffn
    # ComposerMPTCausalLM's default loss is flash-attn's fused cross-entropy (16-bit logit gradients); the plan's loss
    # is the one it predicted (parplan's --fused-cross-entropy / --cross-entropy-16bit-grad)
    model["loss_fn"] = "fused_crossentropy" if t.fused_cross_entropy and t.cross_entropy_16bit_grad \
        else "torch_crossentropy"
    if t.dropout:
        model.update(resid_pdrop=0.1, emb_pdrop=0.1)
        attn["attn_pdrop"] = 0.1
    dtype = "fp32" if t.precision == "fp32" else t.dtype
    fsdp: dict[str, Any] = {"sharding_strategy": _FOUNDRY_SHARDING[p.zero_stage],
                            "mixed_precision": _FOUNDRY_MIXED[t.precision],
                            "activation_checkpointing": p.recompute != "none",
                            "activation_checkpointing_reentrant": False, "activation_cpu_offload": False,
                            "limit_all_gathers": True}
    if p.dp_replicate > 1 and p.zero_stage != 3:  # Megatron's ZeRO-1 optimizer instances
        notes.append(_hybrid_not_written(p, "llm-foundry's FSDP"))
    elif p.dp_replicate > 1:  # Composer's FSDPConfig: HYBRID_SHARD over a (replicate, shard) mesh of these degrees
        fsdp.update(sharding_strategy="HYBRID_SHARD", data_parallel_shard_degree=p.dp // p.dp_replicate,
                    data_parallel_replicate_degree=p.dp_replicate)
    # ZeRO 0 without recompute: no fsdp_config, so Composer wraps the model in DDP, as the plan predicts (a NO_SHARD
    # fsdp_config runs FSDP); with recompute FSDP's NO_SHARD, whose fsdp_config is where Composer checkpoints
    ddp = p.zero_stage == 0 and p.recompute == "none"
    if fsdp["mixed_precision"] == "DEFAULT" and not ddp:
        notes.append(_FOUNDRY_OLD_DEFAULT)
    if p.offload == "optimizer":
        # Composer refuses fsdp_config.cpu_offload (get_cpu_offload: "FSDP CPU Offload not supported yet"; its FSDP2
        # path drops the key with a warning), so the export cannot carry the plan's offload
        held = "" if plan.prediction is None else f" ({plan.prediction.memory_bytes_per_gpu.offloaded / 1e9:.1f} GB)"
        notes.append(f"offload optimizer: Composer has no FSDP CPU offload (\"FSDP CPU Offload not supported yet\", "
                     f"composer/distributed/mosaic_parallelism.py), so the exported run keeps on each GPU what the plan "
                     f"puts on the host{held}: plan with --offload none for llm-foundry.")
    cfg: dict[str, Any] = {"max_seq_len": t.seq_len, "seed": t.seed, "model": model,
                           "global_train_batch_size": t.global_batch_size,
                           "device_train_microbatch_size": t.micro_batch_size,
                           "precision": {"bf16": "amp_bf16", "fp16": "amp_fp16", "fp32": "fp32"}[dtype],
                           # the AdamW the plan counts; Composer's decoupled weight decay is not scaled by the lr
                           "optimizer": {"name": "decoupled_adamw", "lr": t.lr, "betas": list(ADAMW_BETAS),
                                         "eps": 1.0e-8, "weight_decay": float(f"{ADAMW_WEIGHT_DECAY * t.lr:.6g}")},
                           # the constant learning rate parplan's runtime trains with
                           "scheduler": {"name": "constant_with_warmup", "t_warmup": "0ba"}}
    if t.clip_grad:
        cfg["algorithms"] = {"gradient_clipping": {"clipping_type": "norm", "clipping_threshold": float(t.clip_grad)}}
    steps = _train_steps(plan)
    cfg["max_duration"] = f"{steps if steps else 1000}ba"
    cfg["eval_interval"] = cfg["max_duration"]  # TrainConfig requires it; no eval_loader is written
    if not steps:
        notes.append("training.tokens is not set: max_duration 1000ba is a placeholder.")
    if ddp:
        notes.append("zero_stage 0: no fsdp_config, so Composer trains with DDP, as predicted.")
    else:
        cfg["fsdp_config"] = fsdp
        if p.zero_stage == 0:
            notes.append("zero_stage 0 with recompute: FSDP's NO_SHARD (Composer checkpoints activations only through "
                         "its fsdp_config), which keeps no DDP bucket copy of the gradients: less memory than predicted.")
    notes.append(f"weight_decay {ADAMW_WEIGHT_DECAY * t.lr:.3g}: Composer's decoupled_adamw does not scale weight decay "
                 f"by the learning rate; this is torch AdamW's {ADAMW_WEIGHT_DECAY} x lr {t.lr:g}.")
    if p.zero_stage in (1, 2):
        notes.append(f"zero_stage {p.zero_stage}: FSDP's nearest is SHARD_GRAD_OP, which shards gradients and optimizer "
                     "states and gathers the parameters for each forward and backward (ZeRO-2 plus those gathers)"
                     + ("; ZeRO-1's gradients were whole: less memory, more traffic than the prediction." if p.zero_stage == 1
                        else "; `--framework fsdp` does not model it."))
    if p.recompute in ("selective", "selective-op"):
        notes.append(f"recompute {p.recompute}: llm-foundry checkpoints whole blocks (activation_checkpointing) or the "
                     "modules activation_checkpointing_target names; exported as whole blocks, which recompute more than "
                     "the prediction.")
    dp_world = p.dp * p.tp * p.pp * p.cp
    if p.tp > 1:
        notes.append(f"tensor parallelism tp={p.tp}: llm-foundry's tp_config (recent versions) shards only the MLP "
                     f"(strategy ffn: up_proj and down_proj, not a GLU's gate_proj, llmfoundry/tp/ffn_tp_strategy.py, "
                     f"so an MPT with mptglu may not build), and Composer's batch arithmetic divides "
                     f"global_train_batch_size by all "
                     f"{dp_world} ranks; the plan shards attention too over tp and data-parallel ranks only: set it up "
                     "by hand, or plan with --tp 1.")
    if p.pp > 1:
        notes.append(f"pipeline parallelism pp={p.pp}: llm-foundry has no pipeline; plan with --framework fsdp.")
    if p.cp > 1:
        notes.append(f"context parallelism cp={p.cp}: llm-foundry has none; plan with --framework fsdp.")
    if p.sp and p.tp > 1:
        notes.append("sequence parallelism: llm-foundry has none; its activations are larger than the prediction.")
    if t.fused_elementwise:
        notes.append("fused_elementwise true: Composer runs the blocks eagerly unless compiled (llm-foundry's "
                     "compile_config); the prediction counted fused kernels.")
    notes.append("train_loader and tokenizer are not set: add your dataset (train_loader) and tokenizer before training; "
                 "eval_interval is max_duration (no eval_loader), the scheduler a constant learning rate.")
    nnodes, nproc = _nodes(plan)
    header = [f"parplan export --to llm-foundry: {m.name or m.arch}, {plan.hardware.gpus} GPUs ({plan.hardware.name}); "
              f"launch with composer -n {nproc} scripts/train/train.py <this file>" + (
                  f" on each of {nnodes} nodes (composer --world_size {plan.hardware.gpus} --node_rank N "
                  "--master_addr HOST --master_port PORT)" if nnodes > 1 else ""),
              "Keys follow llm-foundry's scripts/train/yamls/pretrain/mpt-7b.yaml and llmfoundry/models/mpt/"
              "configuration_mpt.py (MPTConfig): llm-foundry v0.7.0 or later (mptglu and ffn_act_fn since v0.5, "
              "no Triton attention since v0.7.0), fsdp_config in Composer's FSDP1 keys (its FSDP2 path ignores "
              "sharding_strategy and limit_all_gathers, with a warning).",
              f"shape: layers={m.layers} hidden={m.hidden} heads={m.heads} kv_heads={m.kv_heads} "
              f"ffn_hidden={m.ffn_hidden} vocab={m.vocab}",
              f"batch: {t.global_batch_size} = dp {p.dp} x micro {t.micro_batch_size} x {t.num_microbatches} "
              "micro-batches (Composer's gradient accumulation)"]
    lines = _comment_lines(header) + [f"# note: {n}" for n in notes] + _yaml_lines(cfg)
    return "\n".join(lines) + "\n", notes
