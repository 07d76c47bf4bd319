"""`parplan` command line: one thin function per command.

stdout carries the result: JSON alone with --json (written with sys.stdout.write, never through rich),
else the tables and a plan's own warnings; progress, notes and errors go to stderr, and so does all of
`launch`'s output but its report file.  Exit codes: 0 a plan, 2 invalid input
(stdout empty), 3 nothing fits (the JSON result is still on stdout with --json), 1 an internal error or
output that could not be written (a full disk, a closed stdout), 130 interrupted, otherwise the launched
job's own code (the README's list).
"""
from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Optional, get_args

# pydantic's plugin hook reads every installed distribution's metadata at the first model it builds (its
# plugin._loader, importlib.metadata), 12-20 ms of every command on this project's 2-core machine (2026-12-06; the
# environment's package count decides it); parplan uses no plugin.  A user's own setting wins.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

import typer  # noqa: E402

from . import DEFAULT_GLOBAL_BATCH, DEFAULT_SEQ_LEN  # noqa: E402

app = typer.Typer(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None,
                  help="Auto-parallel planner: how to split a model over your GPUs, why, and a launcher that checks it.")
models_app = typer.Typer(no_args_is_help=True, help="Model presets.")
hardware_app = typer.Typer(no_args_is_help=True, help="Hardware profiles.")
app.add_typer(models_app, name="models")
app.add_typer(hardware_app, name="hardware")

EXIT_INVALID = 2
EXIT_NOTHING_FITS = 3
EXIT_INTERRUPTED = 130  # as launch.EXIT_INTERRUPTED


class UserError(Exception):
    pass


def _err(msg: str) -> None:
    sys.stderr.write(msg.rstrip("\n") + "\n")


def _plain(text) -> str:
    """A name or path as it reads in a rich table or title, where [...] would be taken for markup (a file under
    `[old]/` had lost its folder, one with `[/x]` had crashed the command)."""
    from rich.markup import escape
    return escape(str(text))


def _console(stderr: bool = True):
    """Rich console on stderr (progress, notes); when it is not a terminal (logs, CI), COLUMNS wide where that is set,
    else 160 columns so tables don't fold.  A reader that goes away (`| head`) ends the command quietly with exit 0
    (main's BrokenPipeError), where rich's own handler exits 1."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError

    console = _Console(stderr=stderr)
    if not console.is_terminal:
        columns = os.environ.get("COLUMNS", "")
        console = _Console(stderr=stderr, width=int(columns) if columns.isdigit() and int(columns) > 0 else 160)
    return console


def _out():
    """Rich console on stdout: a command's answer for people (tables, explanations), so that
    `parplan validate | less` and `parplan recommend ... > plan.txt` hold it. Notes, warnings, errors
    and progress stay on stderr; with --json stdout holds only the JSON.  With stdout closed (`>&-`) Python has
    none and rich would print nowhere and exit 0: main reports it, as for the JSON."""
    if sys.stdout is None:
        raise _StdoutClosed
    return _console(stderr=False)


class _StdoutClosed(Exception):
    """No stdout to write a command's answer to (`parplan ... >&-`)."""


def parse_count(text: str, what: str) -> float:
    """'70e9', '70B', '7b', '1.5T', '405000000' -> float; anything else is a UserError."""
    s = str(text).strip().replace("_", "").replace(",", "")
    mult = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
    match = re.fullmatch(r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)([kKmMbBgGtT]?)", s)
    if not match and re.fullmatch(r"-[0-9.]+(?:[eE][+-]?[0-9]+)?[kKmMbBgGtT]?", s):
        raise UserError(f"{what} must be a positive number, got {text!r}")
    if not match:
        raise UserError(f"{what} must be a number like 70e9 or 70B, got {text!r}")
    if match.group(2) and re.search(r"[eE]", match.group(1)):  # 70e9B: 7e19, surely not what was meant
        raise UserError(f"{what} {text!r} has both an exponent and a unit; give one, e.g. 70e9 or 70B")
    value = float(match.group(1)) * (mult[match.group(2).lower()] if match.group(2) else 1)
    if not math.isfinite(value) or value <= 0:
        raise UserError(f"{what} must be a positive number, got {text!r}")
    return value


# what the planner models (plan files and configs are held to the same bounds: planner.schema)
from .limits import BATCH_MAX, GPUS_MAX, PARAMS_MAX, SHAPE_MAX, big_number  # noqa: E402


def _positive(name: str, v, allow_none=True, upper=None):
    if v is None and allow_none:
        return
    if v is None or v <= 0 or (isinstance(v, float) and not math.isfinite(v)):
        raise UserError(f"--{name} must be a positive number, got {v}")
    if upper is not None and v > upper:
        raise UserError(f"--{name} {v} is beyond what the planner models (max {upper:g})")


def _resolve_model(model, model_config, params, arch, layers, hidden, heads, kv_heads, ffn_hidden, vocab,
                   seq_len, head_dim=None, tied_embeddings=None, sliding_window=None, full_attention_every=None,
                   default_seq: bool = False, experts=None, experts_per_token=None, shared_expert_ffn=None,
                   first_dense_layers=None, moe_layer_step=None, dense_ffn=None, kv_lora_rank=None, q_lora_rank=None,
                   qk_rope_dim=None, v_head_dim=None, attention_chunk=None):
    """(spec, what its mapping approximates or None, seq_len).  default_seq: seq_len is the default, which a
    config's shorter context replaces."""
    given = [x is not None for x in (model, model_config, params)] + [layers is not None or hidden is not None
                                                                      or heads is not None]
    # --arch chooses --params' shape family; a preset or config sets every one of these itself
    shape_only = [f for f, v in (("--arch", None if params is not None else arch), ("--kv-heads", kv_heads),
                                 ("--ffn-hidden", ffn_hidden), ("--vocab", vocab), ("--head-dim", head_dim),
                                 ("--tied-embeddings/--untied-embeddings", tied_embeddings),
                                 ("--sliding-window", sliding_window), ("--full-attention-every", full_attention_every),
                                 ("--experts", experts), ("--experts-per-token", experts_per_token),
                                 ("--shared-expert-ffn", shared_expert_ffn),
                                 ("--first-dense-layers", first_dense_layers), ("--moe-layer-step", moe_layer_step),
                                 ("--dense-ffn", dense_ffn), ("--kv-lora-rank", kv_lora_rank),
                                 ("--q-lora-rank", q_lora_rank), ("--qk-rope-dim", qk_rope_dim),
                                 ("--v-head-dim", v_head_dim), ("--attention-chunk", attention_chunk))
                  if v is not None]
    if shape_only and layers is None and hidden is None and heads is None:
        raise UserError(f"{' and '.join(shape_only)} only appl{'y' if len(shape_only) > 1 else 'ies'} to an explicit shape (--layers/--hidden/--heads); "
                        "a preset, --model-config or --params sets them itself (for another shape, give it whole)")
    if sum(given) == 0:
        raise UserError("say which model: --model NAME (see `parplan models list`), --params 70e9, "
                        "--model-config config.json, or --layers/--hidden/--heads")
    if sum(given) > 1:
        raise UserError("give only one of --model, --model-config, --params or explicit --layers/--hidden/--heads")
    try:
        if model is not None:
            from .models import load_preset
            return load_preset(model), None, seq_len
        if model_config is not None:
            if not model_config.strip():
                raise UserError("--model-config is empty: give a Hugging Face config.json (or the folder holding it)")
            from .hf_config import hf_config_context, model_from_hf_config, read_hf_config
            loaded = read_hf_config(model_config)  # once: a pipe reads empty the second time
            spec = model_from_hf_config(loaded, seq_len=seq_len)  # ModelSpec holds it to the flags' bounds
            context = hf_config_context(loaded) if default_seq and not spec.has_learned_positions else None
            if context and context < seq_len:
                # a rotary checkpoint's context below the default (Pythia, GPT-NeoX-20B: 2048) is its length, as a
                # learned table's is (it had been planned at 4096, past the checkpoint's context, with a note)
                _err(f"note: --seq-len defaults to {spec.name or 'the model'}'s context, {context} tokens")
                seq_len = context
                spec = model_from_hf_config(loaded, seq_len=seq_len)
            if spec.num_params > PARAMS_MAX:
                raise UserError(f"{model_config}: {big_number(spec.num_params)} parameters is beyond what the planner "
                                f"models (max {PARAMS_MAX:g})")
            # what the mapping approximates (biases or norms not counted, sliding windows counted full)
            return spec, (spec.source if "; " in (spec.source or "") else None), seq_len
        if params is not None:
            from .models import model_from_params
            n = parse_count(params, "--params")
            if n > PARAMS_MAX:
                raise UserError(f"--params {params} is beyond what the planner models (max {PARAMS_MAX:g})")
            if n < 1e6:
                raise UserError(f"--params {params} is too small for a transformer (give the count, e.g. 7e9)")
            try:
                spec, why = model_from_params(n, arch=arch or "llama")
            except ValueError:  # the shape it derives rounds past the bound the flag itself passed
                raise UserError(f"--params {params}: the nearest standard shape is beyond what the planner models "
                                f"(max {PARAMS_MAX:g} parameters); give a smaller --params") from None
            from cost_models.params import param_counts
            got = param_counts(spec, seq_len)["total"]
            if abs(got - n) > 0.25 * n:
                raise UserError(f"--params {params}: the nearest standard shape has {got / 1e9:.3g}B parameters "
                                f"({got / n - 1:+.0%}); give the shape with --layers/--hidden/--heads/--vocab instead")
            return spec, why, seq_len
        missing = [n for n, v in (("layers", layers), ("hidden", hidden), ("heads", heads)) if v is None]
        if missing:
            raise UserError("explicit shape needs " + ", ".join("--" + m for m in missing))
        from .models import model_from_flags
        spec = model_from_flags(arch or "llama", layers, hidden, heads, kv_heads, ffn_hidden, vocab, head_dim=head_dim,
                                tied_embeddings=tied_embeddings, sliding_window=sliding_window,
                                full_attention_every=full_attention_every, experts=experts,
                                experts_per_token=experts_per_token, shared_expert_ffn=shared_expert_ffn,
                                first_dense_layers=first_dense_layers, moe_layer_step=moe_layer_step,
                                dense_ffn_hidden=dense_ffn, kv_lora_rank=kv_lora_rank, q_lora_rank=q_lora_rank,
                                qk_rope_head_dim=qk_rope_dim, v_head_dim=v_head_dim, attention_chunk=attention_chunk)
        if full_attention_every is not None and full_attention_every > layers:
            local = "--sliding-window" if sliding_window else "its --attention-chunk"
            _err(f"note: --full-attention-every {full_attention_every} is past the model's {layers} layers, so no layer "
                 f"attends in full: every one attends within {local}")
        n = spec.num_params
        if n > PARAMS_MAX:  # as --params and --model-config: a shape this large is a typo, not a job that does not fit
            raise UserError(f"--layers {layers} --hidden {hidden}: {big_number(n)} parameters is beyond what the "
                            f"planner models (max {PARAMS_MAX:g})")
        return spec, None, seq_len
    except UserError:
        raise
    except (ValueError, OSError) as e:
        raise UserError(_one_line(e)) from None


def _with_block_options(spec, o):
    """spec with the flags that say how its blocks are built beside any model: how the q/k norms normalise
    (ModelSpec.qk_norm_whole, which turns them on), the norms' order (norms_after), q/k/v biases (qkv_bias) and
    attention and MLP side by side (parallel_block), each
    validated by ModelSpec's own checks (latent attention, post-norms, experts, gpt blocks), one line naming the flag."""
    updates = []
    if o.qk_norm_whole is not None:
        flag = f"--qk-norm-{'whole' if o.qk_norm_whole else 'per-head'}"
        if o.qk_norm is False:
            raise UserError(f"{flag} says how the q/k norms normalise, and --no-qk-norm drops them; give one of the two")
        updates.append((flag, {"qk_norm": True, "qk_norm_whole": True if o.qk_norm_whole else None}))
    for field, flag, on in (("norms_after", "--norms-after", o.norms_after), ("qkv_bias", "--qkv-bias", o.qkv_bias),
                            ("parallel_block", "--parallel-block", o.parallel_block)):
        if on is not None:
            updates.append((flag, {field: True if on else None}))
    if not updates:
        return spec
    from pydantic import ValidationError

    from .schema import validation_summary
    for flag, update in updates:
        try:
            spec = type(spec)(**{**spec.model_dump(), **update})
        except ValidationError as e:
            hint = " (--no-post-norms drops post-norms)" if spec.post_norms and "norms_after" in update else ""
            raise UserError(f"{flag}: {validation_summary(e)}{hint}") from None
    return spec


def _one_line(e: Exception) -> str:
    from pydantic import ValidationError

    from .schema import validation_summary
    if isinstance(e, ValidationError):
        text = validation_summary(e)
        said = "parplan recommend" in text  # a validator that names its own fix
        return ("invalid plan: " + text + ("" if said else "; correct those fields, or write the "
                                           "plan again with `parplan recommend ... --json`"))
    return " ".join(str(e).split())


def _write_json(obj) -> None:
    # NaN or Infinity is not JSON (jq and browsers refuse it): one would be a bug, not an answer to print
    sys.stdout.write(json.dumps(obj, indent=2, allow_nan=False) + "\n")
    sys.stdout.flush()


def _plan_json(plan) -> dict:
    return plan.model_dump(mode="json", exclude_none=False)


# A defaulted batch beyond this many tokens a step gets a note (Llama 3 405B's largest batch was 16M
# tokens, Table 4 of its paper, benchmarks/reference/llama3_405b_table4.json)
LONG_STEP_TOKENS = 16 * 2 ** 20

# Options shared by recommend and sweep (model, hardware, training, pins): declared once and spliced into
# each command's signature by @_model_options, which hands them to the command as one `opts` namespace.
_MODEL_OPTIONS = [
    ("params", Optional[str], None, ("--params",), "Parameter count (70e9, 70B): derive a standard llama-style shape."),
    ("model", Optional[str], None, ("--model", "-m"), "Preset name (parplan models list)."),
    ("model_config", Optional[str], None, ("--model-config",),
     "Hugging Face config.json, a model's folder, or its hub name (owner/model) in the local Hugging Face cache."),
    ("arch", Optional[str], None, ("--arch",), "llama or gpt (explicit shape or --params)."),
    ("layers", Optional[int], None, ("--layers",), "Transformer blocks (explicit shape)."),
    ("hidden", Optional[int], None, ("--hidden",), "Hidden size (explicit shape)."),
    ("heads", Optional[int], None, ("--heads",), "Attention heads (explicit shape)."),
    ("kv_heads", Optional[int], None, ("--kv-heads",), "Key/value heads, GQA (default: --heads)."),
    ("ffn_hidden", Optional[int], None, ("--ffn-hidden",), "MLP width (default: the arch's usual for --hidden)."),
    ("vocab", Optional[int], None, ("--vocab",), "Vocabulary size (explicit shape; default 32000, Llama 2's)."),
    ("head_dim", Optional[int], None, ("--head-dim",), "Per-head width (default hidden / heads; Qwen3, Gemma: 128 or 256 whatever the width)."),
    ("tied_embeddings", Optional[bool], None, ("--tied-embeddings/--untied-embeddings",), "Output layer shares the embedding (default: tied for gpt, untied for llama)."),
    ("sliding_window", Optional[int], None, ("--sliding-window",), "Sliding-window attention over this many tokens (explicit shape; counted under --framework parplan and megatron, which train it)."),
    ("full_attention_every", Optional[int], None, ("--full-attention-every",), "With --sliding-window (or --attention-chunk): every k-th layer attends in full (Gemma 2: 2, Gemma 3: 6, Llama 4: 4; default: none does)."),
    ("attention_chunk", Optional[int], None, ("--attention-chunk",), "Chunked attention over this many tokens (explicit shape; Llama 4's 8192, its presets and configs set it): counted under --framework parplan, whose runtime trains it."),
    ("experts", Optional[int], None, ("--experts",), "A mixture of experts (explicit shape): every block's MLP is this many SwiGLU experts of --ffn-hidden (with --experts-per-token)."),
    ("experts_per_token", Optional[int], None, ("--experts-per-token",), "With --experts: the router's top-k."),
    ("shared_expert_ffn", Optional[int], None, ("--shared-expert-ffn",), "With --experts: a shared expert's width, a dense MLP every token runs (default: none)."),
    ("first_dense_layers", Optional[int], None, ("--first-dense-layers",), "With --experts: this many leading blocks have a dense MLP of --dense-ffn (DeepSeek-V3, GLM-4.5: 3; default: none)."),
    ("moe_layer_step", Optional[int], None, ("--moe-layer-step",), "With --experts: every k-th block is an MoE block, the others dense (Llama 4 Maverick: 2; default: 1, every block)."),
    ("dense_ffn", Optional[int], None, ("--dense-ffn",), "With --first-dense-layers or --moe-layer-step: the dense blocks' MLP width."),
    ("kv_lora_rank", Optional[int], None, ("--kv-lora-rank",), "Multi-head latent attention (explicit shape; "
     "DeepSeek-V2/V3, Kimi K2: 512): the compressed key/value latent's width, with --head-dim a query/key head's whole "
     "width (DeepSeek-V3: 192), --qk-rope-dim and --v-head-dim; planned under --framework megatron."),
    ("q_lora_rank", Optional[int], None, ("--q-lora-rank",), "With --kv-lora-rank: the compressed query latent's "
     "width (DeepSeek-V3: 1536; default: none, a full query projection as DeepSeek-V2-Lite's)."),
    ("qk_rope_dim", Optional[int], None, ("--qk-rope-dim",), "With --kv-lora-rank: the rotary part of --head-dim "
     "(DeepSeek-V3: 64; Megatron-LM's --qk-pos-emb-head-dim)."),
    ("mtp_layers", Optional[int], None, ("--mtp-layers",), "Multi-token prediction depths on the last pipeline "
     "stage (DeepSeek-V3's MTP module: 1; Megatron-LM's --mtp-num-layers), each one more block, a 2h -> h projection "
     "and the output layer again; planned under --framework megatron.  Also with a preset or a config."),
    ("v_head_dim", Optional[int], None, ("--v-head-dim",), "With --kv-lora-rank: a value head's width "
     "(DeepSeek-V3: 128)."),
    ("qk_norm", Optional[bool], None, ("--qk-norm/--no-qk-norm",), "Norms on the queries and keys before rotary "
     "(Qwen3, Gemma 3, OLMo 2: their presets and configs set it): their saved inputs and pass counted under every "
     "framework (parplan's runtime builds them).  Also with a preset or a config."),
    ("qk_norm_whole", Optional[bool], None, ("--qk-norm-whole/--qk-norm-per-head",), "Whether the q/k norms normalise "
     "a token's whole query and key widths at once (OLMo 2 / 3, OLMoE, MiniMax-M2: their configs set it) or each head "
     "(Qwen3, Gemma 3): over tensor-parallel ranks the whole-width norms all-reduce their statistics, counted.  Either "
     "turns the q/k norms on.  Also with a preset or a config."),
    ("post_norms", Optional[bool], None, ("--post-norms/--no-post-norms",), "A norm on each sublayer's output before "
     "its residual add, four norms a block (Gemma 2 / 3, GLM-4: their presets and configs set it): their weights, saved "
     "inputs and passes counted under every framework (parplan's runtime builds them).  Also with a preset or a config."),
    ("norms_after", Optional[bool], None, ("--norms-after/--pre-norms",), "The block's two norms on the sublayers' "
     "outputs instead of their inputs (OLMo 2 / 3, EXAONE 4: their configs set it): the same count, and parplan's "
     "runtime builds that order.  Also with a preset or a config."),
    ("qkv_bias", Optional[bool], None, ("--qkv-bias/--no-qkv-bias",), "Biases on the q, k and v projections of "
     "llama-arch blocks (Qwen2 / 2.5: their presets and configs set it): counted, and built by parplan's runtime.  Also "
     "with a preset or a config."),
    ("parallel_block", Optional[bool], None, ("--parallel-block/--sequential-block",), "Attention and MLP side by "
     "side on one norm, their outputs added to the residual together (GPT-J, Falcon-7B, Phi-2, Command R: their "
     "configs set it): one norm, one tensor-parallel collective a direction, counted under --framework parplan, whose "
     "runtime builds it (the others build sequential blocks).  Also with a preset or a config."),
    ("hardware", str, "h100-sxm-80gb", ("--hardware",), "Profile name or path (parplan hardware list)."),
    ("gpus_per_node", Optional[int], None, ("--gpus-per-node",), "GPUs per node (NVLink domain; default: the profile's)."),
    ("inter_node_bandwidth", Optional[float], None, ("--inter-node-bandwidth",), "GB/s per GPU per direction."),
    ("pool_nics", Optional[bool], None, ("--pool-nics/--one-nic-per-rank",), "Collectives across nodes run over all "
     "the NICs their ranks on a node own (NCCL's multi-NIC rings: FSDP over nodes at up to the node's fabric) or one NIC per "
     "rank [default: the profile's inter_node.aggregate_nics; off in the shipped profiles]."),
    ("seq_len", Optional[int], None, ("--seq-len",), f"Tokens per sequence [default: {DEFAULT_SEQ_LEN}, or the "
     "model's learned positions or a config's context where fewer]."),
    ("document_length", Optional[int], None, ("--document-length",), "Packed documents of this many tokens, each "
     "attending only within itself (an intra-document causal mask): counted under --framework parplan and torchtitan, "
     "which skip the attention across documents [default: one document a sequence]."),
    ("global_batch_size", Optional[int], None, ("--global-batch-size",), f"Sequences per optimizer step [default: {DEFAULT_GLOBAL_BATCH}]."),
    ("dtype", str, "bf16", ("--dtype",), "bf16 or fp16 (fp16 scales the loss dynamically: parplan's runtime, "
     "Megatron-LM and DeepSpeed; the step counts the unscale pass)."),
    ("precision", str, "master-weights", ("--precision",), "master-weights (16-bit weights + fp32 grads and master + Adam, 18 B/param, as Megatron), master-weights-half-grads (16-bit grads, 16 B/param, as DeepSpeed fp16), amp (fp32 weights under autocast) or fp32."),
    ("clip_grad", float, 1.0, ("--clip-grad",), "Global gradient-norm clipping threshold, as Megatron-LM's --clip-grad, torchtitan's max_norm (0: none); `parplan launch` clips, and the prediction counts its passes."),
    ("tokens", Optional[str], None, ("--tokens",), "Total training tokens (reports days and GPU-hours)."),
    ("tp", Optional[int], None, ("--tp",), "Pin the tensor-parallel degree."),
    ("pp", Optional[int], None, ("--pp",), "Pin the pipeline-parallel degree."),
    ("dp", Optional[int], None, ("--dp",), "Pin the data-parallel degree."),
    ("cp", Optional[int], None, ("--cp",), "Pin the context-parallel degree."),
    ("mbs", Optional[int], None, ("--mbs",), "Micro-batch size (micro_batch_size)."),
    ("vpp", Optional[int], None, ("--vpp",), "Model chunks per pipeline rank."),
    ("zero", Optional[int], None, ("--zero",), "ZeRO stage 0-3 (zero_stage)."),
    ("dp_replicate", Optional[int], None, ("--dp-replicate",), "ZeRO-3's hybrid sharding (HSDP): the dp ranks as this many replicas of a group that shards the states (torchtitan's data_parallel_replicate_degree; 1: full sharding); under megatron, its distributed optimizer (ZeRO-1) in this many instances (--num-distributed-optimizer-instances). Default: parplan, torchtitan and fsdp search full sharding and one node's shards; megatron and deepspeed shard fully."),
    ("ep", Optional[int], None, ("--ep",), "Expert parallelism of a mixture of experts (Megatron-LM's --expert-model-parallel-size, expert tensor parallelism 1: its ranks taken from tp x cp x dp). Default: every ep that divides the experts and those ranks."),
    ("recompute", Optional[str], None, ("--recompute",), "none, selective, full or selective-op (torchtitan's op-level SAC)."),
    ("recompute_layers", Optional[int], None, ("--recompute-layers",), "Full recompute of the first N blocks of each (virtual) stage only, the others keeping their activations (Megatron-LM's --recompute-method block --recompute-num-layers N); megatron, parplan and torchtitan (every f-th block: the counts that gives), which otherwise search the fewest that fit."),
    ("sp", Optional[bool], None, ("--sp/--no-sp",), "Sequence parallelism."),
    ("schedule", Optional[str], None, ("--schedule",), "gpipe, 1f1b, interleaved-1f1b, interleaved-zb, zbv."),
    ("offload", Optional[str], None, ("--offload",), "none or optimizer."),
    ("split", str, "balanced", ("--split",), "Pipeline split: balanced (each top plan with a pipeline also tries the "
     "head's stage lighter by 1-8 blocks, the output layer and loss counted as blocks, as Megatron-LM's "
     "--account-for-loss-in-pipeline-split; taken where it predicts 0.5 % or more faster; parplan, megatron and "
     "torchtitan, which train any split) or default (the remainder of layers / stages to the middle stages)."),
    ("flash_attention", bool, True, ("--flash-attention/--no-flash-attention",), "Fused attention (no score-sized tensors), as flash-attn / SDPA."),
    ("overlap_grad_reduce", Optional[bool], None, ("--overlap-grad-reduce/--no-overlap-grad-reduce",), "Data-parallel gradient reduction (ZeRO 0-2) overlapped with the backward (parplan's runtime: bucket by bucket during the last backward, under the zero-bubble schedules during the last weight passes, except where torch's own weight pass runs (FSDP2); off: after the backward). Default: the framework's (on)."),
    ("overlap_param_gather", Optional[bool], None, ("--overlap-param-gather/--no-overlap-param-gather",), "ZeRO-1/2's gather of the stepped parameters overlapped with the next forward (Megatron's --overlap-param-gather; parplan's runtime: each part waits for its parameters before it runs; off: after the step). Default: as --overlap-grad-reduce."),
    ("overlap_tp_comm", bool, False, ("--overlap-tp-comm/--no-overlap-tp-comm",), "Tensor-parallel collectives overlapped with the matmuls (Megatron's --tp-comm-overlap)."),
    ("fp8", Optional[bool], None, ("--fp8/--no-fp8",), "FP8 linear layers (qkv, projection, MLP: E4M3 forward, E5M2 gradients, per-tensor scales): their GEMMs at the profile's fp8 peak plus the quantization passes; attention, norms, embedding and output layer stay 16-bit. Under --framework parplan (its runtime: torchao's tensor-wise recipe, which parplan launch runs), megatron (Transformer Engine, delayed scaling, FP8 weights) or torchtitan (torchao's float8). Default: off."),
    ("dropout", bool, False, ("--dropout/--no-dropout",), "Model hidden/attention dropout (Megatron GPT default, 0.1 each); parplan launch runs it."),
    ("framework", str, "parplan", ("--framework",), "Framework the prediction models: parplan (its own runtime, what `parplan launch` runs), megatron, deepspeed, torchtitan (tensor parallelism always with --sp), or fsdp (PyTorch FSDP or DDP over an eager model with tensor parallelism but no pipeline, context or sequence parallelism: metaseq, llm-foundry). Sets the defaults of the options below that say 'Default: the framework's', and limits the schedules, recompute, ZeRO stages and parallel dimensions searched."),
    ("zero1_grad_reduce", Optional[str], None, ("--zero1-grad-reduce",), "ZeRO-1 gradient reduction: all-reduce (parplan's runtime, DeepSpeed BF16 optimizer) or reduce-scatter (Megatron distributed optimizer, DeepSpeed ZeRO). Default: the framework's."),
    ("zero2_grad_reduce", Optional[str], None, ("--zero2-grad-reduce",), "When ZeRO-2 reduces gradients: per-step (once, full gradients held through the backward: parplan's runtime) or per-micro-batch (as produced, sharded: DeepSpeed stage 2). Default: the framework's."),
    ("grad_accumulation_fusion", Optional[bool], None, ("--grad-accumulation-fusion/--no-grad-accumulation-fusion",), "Model Megatron's fused fp32 gradient accumulation, which parplan's runtime also runs on CUDA (off: a separate upcast/add pass per micro-batch, as its runtime on CPU or under FSDP2). Default: the framework's (on for parplan and megatron)."),
    ("p2p_scatter_gather", Optional[bool], None, ("--p2p-scatter-gather/--no-p2p-scatter-gather",), "Model Megatron's scatter/gather of pipeline sends without SP (each TP rank sends 1/tp, then all-gathers; DeepSpeed partitions alike); off: full tensors, as parplan's runtime. Default: the framework's."),
    ("overlap_cp_comm", Optional[bool], None, ("--overlap-cp-comm/--no-overlap-cp-comm",), "Model context parallelism's K/V exchange as overlapped with the attention (Megatron's ring; torchtitan's asynchronous gather, behind the rank's own chunk only); off: an all-gather before it, on the critical path (parplan's runtime, Llama 3). Default: the framework's."),
    ("async_tp_grad_comm", Optional[bool], None, ("--async-tp-grad-comm/--no-async-tp-grad-comm",), "Model Megatron's asynchronous input-gradient all-reduce (reduce-scatter with SP) of the column-parallel layers, beside their weight-gradient GEMM; off: the backward waits for it (Megatron-DeepSpeed, torchtitan). Default: the framework's (on for parplan and megatron)."),
    ("fused_elementwise", Optional[bool], None, ("--fused-elementwise/--no-fused-elementwise",), "Model the blocks' pointwise work (norms, rotary, SwiGLU) as fused kernels (Megatron, torch.compile; parplan launch on cuda); off: eager PyTorch ops (torchtitan without training.compile). Default: the framework's."),
    ("moe_dispatcher", Optional[str], None, ("--moe-dispatcher",), "A mixture of experts' token dispatcher: alltoall (NCCL's all-to-all, Megatron-LM's --moe-token-dispatcher-type alltoall) or deepep (DeepEP through Megatron's flex dispatcher: a token crosses the network once per remote node holding one of its experts). Default: alltoall."),
    ("moe_recompute", Optional[str], None, ("--moe-recompute",), "A mixture of experts' recompute modules beside --recompute: none, act (Megatron-LM's --recompute-modules moe_act) or norm-act (layernorm moe_act). Default: none."),
    ("moe_a2a_overlap", Optional[bool], None, ("--moe-a2a-overlap/--no-moe-a2a-overlap",), "A mixture of experts' token all-to-alls hidden behind another micro-batch's compute (Megatron-Core's --overlap-moe-expert-parallel-comm, combined 1F1B: --framework megatron; plans without a pipeline or interleaved, no full recompute). Default: off."),
    ("mla_recompute", Optional[bool], None, ("--mla-recompute/--no-mla-recompute",), "Multi-head latent attention's up projections recomputed in the backward (Megatron-LM's --recompute-modules mla_up_proj, DeepSeek-V3's recipes): its q, k and v not kept. Default: off."),
    ("attention_kernel", Optional[str], None, ("--attention-kernel",), "Fused attention kernel the prediction times: profile (the hardware profile's measured curve: torch's flash SDPA, what parplan launch and torchtitan run) or triton-2022 (the Triton FlashAttention of 2022, llm-foundry's attn_impl triton: FlashAttention-2's published speed on the GPU, 1.4x slower forward and 2x backward). Default: profile."),
    ("cross_entropy_16bit_grad", Optional[bool], None, ("--cross-entropy-16bit-grad/--no-cross-entropy-16bit-grad",), "With --fused-cross-entropy: the loss writes the logits' gradient in 16 bits and keeps only the 16-bit logits (flash-attn's cross-entropy, llm-foundry's default), 4 B per logit at its backward instead of Megatron's 6 (parplan's runtime runs it too). Default: the framework's (on for parplan)."),
    ("fused_cross_entropy", Optional[bool], None, ("--fused-cross-entropy/--no-fused-cross-entropy",), "Model Megatron's in-place vocab-parallel cross-entropy (16-bit logits + 4 B per logit); off: an autograd cross-entropy over fp32 logits, 12 B per logit at its backward (torchtitan). Default: the framework's (on for parplan, megatron and deepspeed)."),
]


def _model_options(func):
    """Add the shared model/hardware/training/pin options to a command whose last parameter is `opts`."""
    import functools
    import inspect
    from types import SimpleNamespace

    names = [o[0] for o in _MODEL_OPTIONS]
    own = [p for p in inspect.signature(func).parameters.values() if p.name != "opts"]
    shared = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=typ,
                                default=typer.Option(default, *flags, help=help_))
              for name, typ, default, flags, help_ in _MODEL_OPTIONS]

    @functools.wraps(func)
    def wrapper(**kwargs):
        opts = SimpleNamespace(**{n: kwargs.pop(n) for n in names})
        return func(**kwargs, opts=opts)

    wrapper.__signature__ = inspect.Signature([p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + shared)
    hints = {k: v for k, v in func.__annotations__.items() if k not in ("opts", "return")}
    wrapper.__annotations__ = {**hints, **{name: typ for name, typ, *_ in _MODEL_OPTIONS}}
    del wrapper.__wrapped__  # typer must see the new signature, not the original one
    return wrapper


def _prepare(opts, gpus: int | None = None):
    """Validate the shared options; returns (model spec, keyword arguments for core.recommend)."""
    from .search import Pins
    o = opts
    if str(o.dtype).strip().lower() == "fp32":  # fp32 training is a recipe, not a compute dtype of the 16-bit ones
        raise UserError("--dtype must be one of bf16, fp16; got 'fp32': for fp32 training use --precision fp32")
    o.dtype = _check_choice("dtype", o.dtype, ("bf16", "fp16"))
    o.precision = _check_choice("precision", o.precision, ("amp", "master-weights", "master-weights-half-grads", "fp32"))
    if o.cross_entropy_16bit_grad and o.fused_cross_entropy is False:
        _err("note: --cross-entropy-16bit-grad is a mode of the fused cross-entropy; with --no-fused-cross-entropy it "
             "changes nothing")
    if o.precision == "fp32" and o.dtype == "fp16":
        _err("note: --precision fp32 trains in fp32 throughout; --dtype fp16 applies only to the 16-bit recipes "
             "(amp, master-weights, master-weights-half-grads), so it changes nothing here")
    for name, choices in (("recompute", ("none", "selective", "full", "selective-op")),
                          ("schedule", ("gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb", "zbv")),
                          ("offload", ("none", "optimizer")), ("arch", ("llama", "gpt")),
                          ("split", ("balanced", "default"))):
        if getattr(o, name) is not None:
            setattr(o, name, _check_choice(name, getattr(o, name), choices))
    if gpus is not None:
        _positive("gpus", gpus, allow_none=False, upper=GPUS_MAX)
    explicit_seq = o.seq_len is not None
    o.seq_len = o.seq_len if explicit_seq else DEFAULT_SEQ_LEN
    _positive("seq-len", o.seq_len, allow_none=False, upper=SHAPE_MAX)
    if not (o.clip_grad >= 0 and math.isfinite(o.clip_grad)):
        raise UserError(f"--clip-grad must be a positive norm, or 0 for no clipping; got {o.clip_grad}")
    _positive("gpus-per-node", o.gpus_per_node, upper=GPUS_MAX)
    if gpus is not None and o.gpus_per_node and gpus > o.gpus_per_node and gpus % o.gpus_per_node:
        _err(f"note: {gpus} GPUs on nodes of {o.gpus_per_node}: {gpus // o.gpus_per_node} full node(s) and one with "
             f"{gpus % o.gpus_per_node} of its {o.gpus_per_node}")
    _positive("inter-node-bandwidth", o.inter_node_bandwidth, upper=1e6)
    if o.inter_node_bandwidth is not None and o.inter_node_bandwidth < 1e-3:
        raise UserError(f"--inter-node-bandwidth is in GB/s per GPU (1 GbE is 0.125); {o.inter_node_bandwidth:g} is "
                        "below what the planner models (min 0.001)")
    for name in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "head_dim", "sliding_window",
                 "attention_chunk", "full_attention_every", "experts", "experts_per_token", "shared_expert_ffn", "first_dense_layers",
                 "moe_layer_step", "dense_ffn", "kv_lora_rank", "q_lora_rank", "qk_rope_dim", "v_head_dim", "tp", "pp",
                 "dp", "cp", "mbs", "vpp", "recompute_layers", "dp_replicate", "ep"):
        _positive(name.replace("_", "-"), getattr(o, name), upper=SHAPE_MAX)
    spec, why, o.seq_len = _resolve_model(o.model, o.model_config, o.params, o.arch, o.layers, o.hidden, o.heads,
                                          o.kv_heads, o.ffn_hidden, o.vocab, o.seq_len, o.head_dim, o.tied_embeddings,
                                          o.sliding_window, o.full_attention_every, default_seq=not explicit_seq,
                                          experts=o.experts, experts_per_token=o.experts_per_token,
                                          shared_expert_ffn=o.shared_expert_ffn,
                                          first_dense_layers=o.first_dense_layers, moe_layer_step=o.moe_layer_step,
                                          dense_ffn=o.dense_ffn, kv_lora_rank=o.kv_lora_rank,
                                          q_lora_rank=o.q_lora_rank, qk_rope_dim=o.qk_rope_dim,
                                          v_head_dim=o.v_head_dim, attention_chunk=o.attention_chunk)
    _positive("mtp-layers", o.mtp_layers, upper=16)
    if o.mtp_layers:  # multi-token prediction beside any model (a preset's, a config's or the flags')
        spec = spec.model_copy(update={"mtp_layers": o.mtp_layers})
    if o.qk_norm is not None:  # q/k norms on or off beside any model (ModelSpec.qk_norm)
        if o.qk_norm and spec.kv_lora_rank is not None:
            raise UserError("--qk-norm with multi-head latent attention: its latents have their own RMSNorms "
                            "(counted); drop --qk-norm")
        spec = spec.model_copy(update={"qk_norm": True if o.qk_norm else None})
    if o.post_norms is not None:  # post-norms on or off beside any model (ModelSpec.post_norms)
        spec = spec.model_copy(update={"post_norms": True if o.post_norms else None})
    spec = _with_block_options(spec, o)
    limit = spec.max_seq_len if spec.has_learned_positions else None  # a learned position table caps the sequence
    if limit is not None and o.seq_len > limit:
        name = spec.name or "the model"
        if explicit_seq:
            raise UserError(f"--seq-len {o.seq_len} is beyond {name}'s {limit} learned positions; use --seq-len "
                            f"{limit} or less, or a config with a longer table (n_positions)")
        _err(f"note: --seq-len defaults to {name}'s {limit} learned positions")
        o.seq_len = limit
    if o.global_batch_size is None:
        o.global_batch_size = DEFAULT_GLOBAL_BATCH
        if o.seq_len * DEFAULT_GLOBAL_BATCH > LONG_STEP_TOKENS:
            _err(f"note: the global batch defaults to {DEFAULT_GLOBAL_BATCH} sequences, "
                 f"{o.seq_len * DEFAULT_GLOBAL_BATCH / 1e6:,.0f}M tokens a step at --seq-len {o.seq_len}; "
                 "set --global-batch-size to your run's")
    _positive("global-batch-size", o.global_batch_size, allow_none=False, upper=BATCH_MAX)
    if o.zero is not None and o.zero not in (0, 1, 2, 3):
        raise UserError(f"--zero must be 0, 1, 2 or 3, got {o.zero}")
    from .schema import Training
    for name in ("zero1_grad_reduce", "zero2_grad_reduce", "attention_kernel", "moe_dispatcher", "moe_recompute"):
        if getattr(o, name) is not None:
            setattr(o, name, _check_choice(name.replace("_", "-"), getattr(o, name),
                                           get_args(Training.model_fields[name].annotation)))
    from .core import FRAMEWORK_DEFAULTS
    o.framework = _check_choice("framework", o.framework, tuple(FRAMEWORK_DEFAULTS))
    if o.fp8 and o.framework == "torchtitan" and not o.fused_elementwise:
        _err("note: torchao's float8 casts are timed as torch.compile fuses them (an amax read, then one cast pass); "
             "eager, they take several passes more, and torchtitan runs Float8 compiled: add --fused-elementwise "
             "(training.compile) to predict that")
    n_tokens = parse_count(o.tokens, "--tokens") if o.tokens is not None else None
    if n_tokens is not None and n_tokens > 1e18:
        raise UserError(f"--tokens {o.tokens} is beyond what the planner models (max 1e18)")
    if n_tokens is not None and n_tokens < 1:
        raise UserError(f"--tokens {o.tokens} is less than one token; give the run's training tokens, e.g. 15T")
    if why:
        _err(f"note: {why}")
    pins = Pins(tp=o.tp, pp=o.pp, dp=o.dp, cp=o.cp, mbs=o.mbs, vpp=o.vpp, zero=o.zero, recompute=o.recompute,
                recompute_layers=o.recompute_layers, sp=o.sp, schedule=o.schedule, offload=o.offload,
                dp_replicate=o.dp_replicate, ep=o.ep)
    from .core import STACK_FLAGS
    kwargs = dict(hardware=o.hardware, seq_len=o.seq_len, global_batch_size=o.global_batch_size, dtype=o.dtype,
                  clip_grad=o.clip_grad or None,
                  precision=o.precision, gpus_per_node=o.gpus_per_node,
                  inter_node_gbytes_per_s=o.inter_node_bandwidth, aggregate_nics=o.pool_nics, tokens=n_tokens, pins=pins, framework=o.framework,
                  balance_head=o.split == "balanced", document_length=o.document_length,
                  **{k: getattr(o, k) for k in STACK_FLAGS if getattr(o, k) is not None})
    return spec, kwargs


@app.command()
@_model_options
def recommend(
    gpus: int = typer.Option(8, "--gpus", help="GPUs in the job (the maximum for --objective min-gpus)."),
    objective: str = typer.Option("throughput", "--objective", help="throughput, min-gpus or memory."),
    top: int = typer.Option(5, "--top", help="Plans to show."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON on stdout (only JSON)."),
    opts=None,
):
    """Search TP x PP x DP (x CP, vpp, micro-batch, ZeRO, recompute, schedule) layouts and rank them."""
    from .core import NothingFits, PlannerError, recommend as do_recommend
    objective = _check_choice("objective", objective, ("throughput", "min-gpus", "memory"))
    _positive("top", top, allow_none=False, upper=10_000)
    spec, kwargs = _prepare(opts, gpus)
    try:
        plan = do_recommend(spec, gpus, objective=objective, top_k=top, **kwargs)
    except PlannerError as e:
        raise UserError(str(e)) from None
    except NothingFits as e:
        if as_json:
            _write_json(_plan_json(e.plan))
        else:
            _show_plans(e.plan, title="closest layout (does not fit)", which="closest layout")
            for s in e.plan.suggestions:
                if s not in str(e):  # the error line below carries the first
                    _err(f"suggestion: {s}")
        _err(f"error: {e}")
        raise typer.Exit(EXIT_NOTHING_FITS)
    if objective == "min-gpus":  # the answer itself, said where the table's title alone had carried it
        from .core import gpu_counts_said, pinned_product
        _err(f"fewest GPUs that fit: {plan.hardware.gpus} "
             f"(tried {gpu_counts_said(gpus, plan.hardware.gpus_per_node, pinned_product(kwargs['pins']))})")
    if as_json:
        _write_json(_plan_json(plan))
        return
    _show_plans(plan, title=f"top {_count(1 + len(plan.alternatives), 'layout')} for {plan.hardware.gpus} x "
                            f"{_plain(plan.hardware.name)}")


def _count(n: int, what: str) -> str:
    """'1 run', '9 runs'."""
    return f"{n} {what}{'' if n == 1 else 's'}"


def _with_fix(reason: str | None) -> str | None:
    """A prediction's reason with what to change in the plan (planner.core.REASON_FIXES)."""
    from .core import reason_fix
    fix = reason_fix(reason)
    return f"{reason} -- fix: {fix}" if fix else reason


def _show_plans(plan, title: str, which: str = "best plan") -> None:
    from .render import breakdown_table, plans_table, summary_lines
    console = _out()
    console.print(plans_table([plan] + list(plan.alternatives), title, console.width))
    console.print(breakdown_table(plan, which))
    for line in summary_lines(plan):
        console.print(line, highlight=False, markup=False)
    from .explain import switches_left_off, switches_line
    said = switches_line(switches_left_off(plan), plan.prediction.fits)  # the framework's switches it leaves off
    if said:
        console.print(said, highlight=False, markup=False)


def _check_choice(name, value, choices):
    """The choice `value` names, in any case (as --to, --hardware and --model names are read: --dtype BF16 is bf16),
    else a UserError listing them."""
    if value in choices:
        return value
    folded = str(value).strip().lower()
    match = next((c for c in choices if c.lower() == folded), None)
    if match is None:
        raise UserError(f"--{name} must be one of {', '.join(choices)}; got {value!r}")
    return match


def read_text_file(path: str, what: str, fix: str) -> str:
    """A UTF-8 text file's contents, or a UserError naming the file, why it cannot be read and `fix`."""
    from .limits import is_device
    if is_device(path):
        raise UserError(f"{what} {path} is a device, not a file; give the file itself")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise UserError(f"{what} {path} not found; {fix}") from None
    except IsADirectoryError:
        raise UserError(f"{what} {path} is a folder; give the file in it") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{what} {path} is not UTF-8 text (byte {e.start}: {e.reason}); {fix}") from None
    except OSError as e:
        raise UserError(f"cannot read {what} {path}: {e.strerror or e}") from None


def read_plan(source: str, notes: bool = True):
    """A Plan from a path or '-' (stdin), validated strictly; `notes`: say on stderr what the file leaves out or
    names otherwise (off where the same file is read again)."""
    from pydantic import ValidationError

    from .schema import Plan, json_type_name
    if not source.strip():
        raise UserError("the plan file name is empty; give a plan JSON file (`parplan recommend ... --json > "
                        "plan.json`), or - for stdin")
    if source == "-":
        if sys.stdin is None:  # `parplan evaluate - <&-`
            raise UserError("stdin is closed: pipe `parplan recommend ... --json` into this, or give a plan file")
        if sys.stdin.isatty():
            _err("note: reading the plan from stdin (pipe `parplan recommend ... --json` into this; Ctrl-D ends it)")
        raw = getattr(sys.stdin, "buffer", None)  # bytes: a UTF-8 locale's strict stdin would raise on a stray byte
        try:
            text = raw.read().decode("utf-8") if raw is not None else sys.stdin.read()
        except UnicodeDecodeError as e:
            raise UserError(f"plan from stdin is not UTF-8 text (byte {e.start}: {e.reason}); pipe "
                            "`parplan recommend ... --json` into it") from None
        where = "stdin"
    else:
        text = read_text_file(source, "plan file", f"write one with `parplan recommend ... --json > {source}`")
        where = source
    text = text.removeprefix("\ufeff")  # a byte-order mark, as some Windows editors save
    if not text.strip():
        raise UserError(f"plan from {where} is empty; pipe `parplan recommend ... --json` into it")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        if not text.lstrip().startswith(("{", "[")):
            hint = ("; a .toml file is a hardware profile (--hardware), not a plan" if where.endswith(".toml") else
                    "; plans are JSON: add --json to `parplan recommend`")
        elif e.msg == "Extra data":
            hint = "; it holds more than one JSON value (a second plan appended with >>?): keep one"
        elif e.msg.startswith("Unterminated") or e.pos >= len(text.rstrip()) - 1:
            hint = "; it ends early (cut off?): write it again with `parplan recommend ... --json > plan.json`"
        else:
            hint = ""
        raise UserError(f"plan from {where} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}){hint}") from None
    except RecursionError:
        raise UserError(f"plan from {where} is not a plan: its JSON is nested too deeply; "
                        "write one with `parplan recommend ... --json`") from None
    except ValueError:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise UserError(f"plan from {where} is not a plan: a number in it has more digits than can be read; "
                        "write one with `parplan recommend ... --json`") from None
    if not isinstance(data, dict):
        raise UserError(f"plan from {where} must be a JSON object, got {json_type_name(data)}")
    if "model" not in data and ("model_type" in data or "architectures" in data):
        raise UserError(f"{where} is a Hugging Face config.json, not a plan: plan it with `parplan recommend "
                        f"--model-config {where} --gpus N --json > plan.json`")
    if "plan" in data and "steps" in data and "model" not in data:
        raise UserError(f"{where} is a `parplan launch` report, not a plan; its plan is the report's \"plan\" key "
                        "(and plan.json beside it)")
    try:
        plan = Plan.model_validate(data)
    except ValidationError as e:
        raise UserError(_one_line(e)) from None
    except (ValueError, TypeError) as e:
        raise UserError(f"invalid plan: {_one_line(e)}") from None
    training = data.get("training")
    if notes and isinstance(training, dict) and set(type(plan.training).model_fields) - set(training):
        from .core import defaulted_fields
        read = defaulted_fields(training, plan.training.framework)
        if read:
            _err(f"note: the plan from {where} has no training.{', training.'.join(read)}: read as "
                 f"{', '.join(f'{k} {v}' for k, v in read.items())} (the schema's defaults, what plans from before those "
                 "fields meant), not what `parplan recommend` writes; set them in the plan to predict otherwise")
    if notes:
        _note_a_preset_name_on_another_shape(plan, where)
    return _with_profile_found(plan, None if source == "-" else Path(source).parent)


def _note_a_preset_name_on_another_shape(plan, where: str) -> None:
    """A plan's model.name is a label: a name edited to another preset's keeps the plan's own shape, said here (it had
    printed "llama3-70b: 8.03 B params" with nothing said)."""
    from .models import list_presets, load_preset
    m = plan.model
    if not m.name or m.name.lower() not in list_presets():
        return
    preset = load_preset(m.name.lower())
    shape = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab")
    if any(getattr(m, k) != getattr(preset, k) for k in shape):
        _err(f"note: the plan from {where} names the model {m.name}, a preset of another shape; the plan's own shape is "
             f"predicted (layers {m.layers}, hidden {m.hidden}): model.name is a label")


def _with_profile_found(plan, folder):
    """A plan whose hardware is a relative profile path (as typed to `recommend --hardware`, relative to where it
    ran) read from elsewhere: the path is looked for beside the plan file and in the folders above it, and the
    plan names the file it found (from here).  Unchanged where the path resolves from here, or nowhere."""
    from hardware_profiles import find_upward
    name = plan.hardware.name
    if folder is None or Path(name).exists():
        return plan
    found = find_upward(name, folder)
    if found is None:
        return plan
    return plan.model_copy(update={"hardware": plan.hardware.model_copy(update={"name": str(found)})})


@app.command()
def evaluate(
    plan_file: str = typer.Argument(..., metavar="PLAN_FILE", help="Plan JSON file, or - for stdin."),
    as_json: bool = typer.Option(False, "--json", help="Print the re-predicted plan as JSON on stdout."),
):
    """Re-predict a given (possibly hand-edited) plan; never searches."""
    from .core import PlannerError, evaluate_plan
    plan = read_plan(plan_file)
    try:
        out = evaluate_plan(plan)
    except PlannerError as e:
        raise UserError(str(e)) from None
    if as_json:
        _write_json(_plan_json(out))
    else:
        _show_plans(out, title="evaluated plan", which="the plan")
    if not out.prediction.fits:
        _err(f"error: plan does not fit: {_with_fix(out.prediction.reason)}")
        raise typer.Exit(EXIT_NOTHING_FITS)


@app.command()
def launch(
    plan_file: str = typer.Argument(..., metavar="PLAN_FILE", help="Plan JSON file, or - for stdin."),
    steps: int = typer.Option(20, "--steps", help="Training steps to run (the first two are warm-up, "
                              "left out of the measured step time, with 4 or more); with --resume, the step count to "
                              "reach, not the steps to add."),
    device: str = typer.Option("auto", "--device", help="auto, cuda or cpu (gloo)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the torchrun command and pre-flight checks; run nothing."),
    strict: bool = typer.Option(False, "--strict", help="With --dry-run: exit as the run would have stopped, with "
                                "the failed checks' code (2, or 3 for memory), not 0; the command is printed either "
                                "way (for a script or CI step: `parplan launch plan.json --dry-run --strict`)."),
    report: Optional[str] = typer.Option(None, "--report", help="Run report path (default runs/<time>/report.json)."),
    nnodes: int = typer.Option(1, "--nnodes", help="Nodes the job spans (run the same command on each)."),
    node_rank: int = typer.Option(0, "--node-rank", help="This node's rank, 0 to --nnodes - 1."),
    rdzv_endpoint: Optional[str] = typer.Option(None, "--rdzv-endpoint", help="HOST:PORT for multi-node."),
    data: Optional[str] = typer.Option(None, "--data", help="Flat token file; synthetic tokens if omitted."),
    data_dtype: Optional[str] = typer.Option(None, "--data-dtype", help="uint16 or uint32: the width of --data's "
                                             "tokens (default uint16 when the vocabulary fits 16 bits, else uint32)."),
    checkpoint_dir: Optional[str] = typer.Option(None, "--checkpoint-dir", help="Save a distributed checkpoint "
                                                 "here after the last step (and every --checkpoint-every steps)."),
    checkpoint_every: int = typer.Option(0, "--checkpoint-every", help="Also save every N steps (0: the last only)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint in --checkpoint-dir "
                                "(in any layout with the same model)."),
    resume_step: Optional[int] = typer.Option(None, "--resume-step", help="Continue from the checkpoint written "
                                              "after this step (implies --resume)."),
    compile_blocks: Optional[bool] = typer.Option(None, "--compile/--no-compile",
                                                  help="torch.compile each block (default: on for cuda unless the plan models eager pointwise work, --no-fused-elementwise; off for cpu)."),
    memory_snapshot: Optional[str] = typer.Option(None, "--memory-snapshot", help="Directory: record the CUDA "
                                                  "allocator's history (slows the run) and dump it per rank, for "
                                                  "pytorch.org/memory_viz or benchmarks/memory_peak.py; on cpu, "
                                                  "trace the CPU allocator (profiler) for its peak and what was live "
                                                  "then, per rank as JSON, compared with the plan's memory model."),
    profile: Optional[str] = typer.Option(None, "--profile", help="Directory: after the measured steps, run one "
                                          "more under torch.profiler and write each rank's top operators and "
                                          "kernels (rankN.ops.md, .ops.json) and timeline (rankN.trace.json.gz) "
                                          "there: whether the GPU or the host held the step up, and on what."),
    moe_balanced_routing: bool = typer.Option(False, "--moe-balanced-routing", help="A mixture of experts: send every "
                                              "expert the same share of each rank's tokens (the balance the "
                                              "prediction assumes), for measuring; Megatron-LM's "
                                              "--moe-router-force-load-balancing does it with random logits."),
):
    """Run a plan as a real torchrun job and report measured against predicted."""
    device = _check_choice("device", device, ("auto", "cuda", "cpu"))
    _positive("steps", steps, allow_none=False, upper=10_000_000)
    _positive("nnodes", nnodes, allow_none=False, upper=100_000)
    if node_rank < 0 or node_rank >= nnodes:
        raise UserError(f"--node-rank must be in 0..{nnodes - 1}, got {node_rank}")
    if checkpoint_every < 0:
        raise UserError(f"--checkpoint-every must be >= 0, got {checkpoint_every}")
    if strict and not dry_run:
        raise UserError("--strict sets a dry run's exit code; a run stops at a failed check anyway: add --dry-run, "
                        "or drop --strict")
    if data_dtype is not None:
        data_dtype = _check_choice("data-dtype", data_dtype, ("uint16", "uint32"))
    _positive("resume-step", resume_step, upper=10_000_000)
    for flag, value, unset in (("--report", report, "runs/<time>/report.json"), ("--data", data, "synthetic tokens"),
                               ("--checkpoint-dir", checkpoint_dir, "no checkpoints"),
                               ("--memory-snapshot", memory_snapshot, "no snapshot"),
                               ("--profile", profile, "no profiled step")):
        if value is not None and not value.strip():  # `--data "$DATA"` with DATA unset: not the same as no --data
            raise UserError(f"{flag} is empty: give a path, or leave {flag} out ({unset})")
    if plan_file != "-":
        read_plan(plan_file, notes=False)  # same one-line errors as evaluate/export before anything starts (launch
        # reads it again, and says its notes then)
    try:
        from .launch import launch as do_launch
    except ImportError as e:
        raise UserError(f"parplan launch is not available in this installation ({_one_line(e)}); "
                        "use `parplan export` to run the plan with another framework") from None
    from .core import PlannerError
    try:
        code = do_launch(plan_file, steps=steps, device=device, dry_run=dry_run, report=report, nnodes=nnodes,
                     node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, checkpoint_dir=checkpoint_dir,
                     checkpoint_every=checkpoint_every, resume=resume, data=data, compile=compile_blocks,
                     memory_snapshot=memory_snapshot, data_dtype=data_dtype, resume_step=resume_step,
                     moe_balanced_routing=moe_balanced_routing, profile=profile, strict=strict)
    except PlannerError as e:
        raise UserError(str(e)) from None
    raise typer.Exit(int(code or 0))


@app.command()
def export(
    plan_file: str = typer.Argument(..., metavar="PLAN_FILE", help="Plan JSON file, or - for stdin."),
    to: str = typer.Option(..., "--to", help="megatron, megatron-bridge (Megatron-Bridge KEY=VALUE overrides for scripts/training/run_recipe.py over a model recipe), torchtitan (keys of commit 000204a4, torchtitan 0.1), torchtitan-0.2 (its 0.2 TOML releases), deepspeed or llm-foundry (Composer + FSDP: what --framework fsdp predicts)."),
):
    """Hand the plan to another framework (Megatron-LM args, Megatron-Bridge overrides, torchtitan TOML, DeepSpeed ds_config, llm-foundry YAML)."""
    from .export import FORMATS, export_notes, export_plan, export_problem, framework_note
    to = _check_choice("to", to, FORMATS)
    plan = read_plan(plan_file)
    problem = export_problem(plan, to)
    if problem:
        raise UserError(problem)
    fits = _fits_as_given(plan)
    sys.stdout.write(export_plan(plan, to).rstrip("\n") + "\n")
    if fits is False:
        _err(f"warning: this plan does not fit ({plan.prediction.reason}); exported as given")
    if framework_note(plan, to):
        _err(f"note: {framework_note(plan, to)}")
    for note in export_notes(plan, to):  # also in the file's comments, where the format has them: said here too, so
        _err(f"note: {note}")            # that what the framework cannot carry (a dropped pipeline) is not only there
    if fits is False:
        raise typer.Exit(EXIT_NOTHING_FITS)


def _fits_as_given(plan):
    """Re-predict a plan to export: False where it does not fit (plan.prediction then says why), None where it
    cannot be re-predicted here (a profile this machine does not have: export takes the name as given)."""
    from .core import PlannerError, StructureError, evaluate_plan
    try:
        fresh = evaluate_plan(plan)
    except StructureError as e:  # a layout no framework runs is an error here too
        raise UserError(str(e)) from None
    except (PlannerError, ValueError) as e:
        _err(f"note: not re-predicted here ({_one_line(e)}); exported as given")
        return None
    plan.prediction = fresh.prediction
    return fresh.prediction.fits


def _evaluated(plan_file: str):
    """Read a plan and re-predict it (the prediction in the file is not trusted)."""
    from .core import PlannerError, evaluate_plan
    plan = read_plan(plan_file)
    try:
        return plan, evaluate_plan(plan)
    except PlannerError as e:
        raise UserError(str(e)) from None


def _runner_up(source, plan):
    """First alternative in the file whose layout differs, else #2 of a fresh search for the same job."""
    from .core import NothingFits, PlannerError, evaluate_plan, prediction_differs, stack_flags
    from .core import recommend as do_recommend
    from .explain import pick_runner_up
    if source.alternatives:
        try:
            ranked = [evaluate_plan(a) for a in source.alternatives]
        except PlannerError:
            ranked = []
        found = pick_runner_up(plan, ranked)
        # a plan edited after its search (its own prediction no longer its layout's) is ranked against none of the
        # file's alternatives, which came with the layout it was edited from: a fresh search ranks it
        edited = source.prediction is None or prediction_differs(source.prediction, plan.prediction)
        if found is not None and not edited:
            return found
    tr, hw = plan.training, plan.hardware
    try:
        best = do_recommend(plan.model, hw.gpus, hardware=hw.name, seq_len=tr.seq_len,
                            global_batch_size=tr.global_batch_size, dtype=tr.dtype, precision=tr.precision,
                            gpus_per_node=hw.gpus_per_node, inter_node_gbytes_per_s=hw.inter_node_gbytes_per_s,
                            aggregate_nics=hw.aggregate_nics,
                            **stack_flags(tr), top_k=3, suggest=False, balance_head=True)
    except (NothingFits, PlannerError):
        return None
    return pick_runner_up(plan, [best] + list(best.alternatives))


@app.command()
def explain(
    plan_file: str = typer.Argument(..., metavar="PLAN_FILE", help="Plan JSON file, or - for stdin."),
    as_json: bool = typer.Option(False, "--json", help="Print the explanation as JSON on stdout."),
):
    """Why this layout: memory vs capacity, where the step time goes, and what the runner-up changes."""
    from .explain import explain as do_explain
    from .render import explain_renderables
    source, plan = _evaluated(plan_file)
    data = do_explain(plan, _runner_up(source, plan))
    if as_json:
        _write_json(data)
    else:
        console = _out()
        for item in explain_renderables(data):
            if isinstance(item, str):
                console.print(item, highlight=False, markup=False)
            else:
                console.print(item)
    if not plan.prediction.fits:
        _err(f"note: the plan does not fit: {_with_fix(plan.prediction.reason) or 'see the memory rows'} "
             f"(exit {EXIT_NOTHING_FITS})")
        raise typer.Exit(EXIT_NOTHING_FITS)


def _profile_or_fail(name: str):
    """The hardware profile `name` (a name or a path), or its one-line error."""
    from .core import PlannerError, load_hardware
    try:
        return load_hardware(name)
    except PlannerError as e:
        raise UserError(str(e)) from None


def _evaluated_as(which: str, path: str):
    """_evaluated's plan, its errors naming which of compare's two plans they are about."""
    try:
        return _evaluated(path)[1]
    except UserError as e:
        raise UserError(f"plan {which} ({path}): {e}") from None


@app.command()
def compare(
    plan_a: str = typer.Argument(..., metavar="PLAN_A", help="First plan JSON file (A), or - for stdin."),
    plan_b: str = typer.Argument(..., metavar="PLAN_B", help="Second plan JSON file (B), or - for stdin (one of the two)."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON on stdout."),
):
    """Two plans side by side: the same rows for both, and B's relative difference against A."""
    from .explain import compare as do_compare
    from .render import compare_table, layout_label
    if plan_a == "-" and plan_b == "-":
        raise UserError("only one of the two plans can come from stdin (-)")
    a, b = (_evaluated_as(which, path) for which, path in (("A", plan_a), ("B", plan_b)))
    from .render import nics_pooled
    shape = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "head_dim", "tied_embeddings", "arch")
    ha, hb = a.hardware, b.hardware
    pooled = {None: "unknown", True: "on", False: "off"}
    differ = [f"{what} ({x} vs {y})" for what, x, y in (
        ("model", a.model.name or a.model.arch, b.model.name or b.model.arch),
        *((k, getattr(a.model, k), getattr(b.model, k)) for k in shape),
        ("seq_len", a.training.seq_len, b.training.seq_len),
        ("global batch", a.training.global_batch_size, b.training.global_batch_size),
        ("dtype", a.training.dtype, b.training.dtype),
        ("hardware", ha.name, hb.name),
        ("GPUs per node", ha.gpus_per_node, hb.gpus_per_node),
        ("inter-node GB/s", ha.inter_node_gbytes_per_s or "profile's", hb.inter_node_gbytes_per_s or "profile's"),
        ("NIC pooling", pooled[nics_pooled(ha)], pooled[nics_pooled(hb)])) if x != y]
    if differ:
        _err(f"note: the plans differ in {', '.join(differ)}: their rows compare different jobs or machines")
    rows = do_compare(a, b)
    if as_json:
        _write_json({"a": plan_a, "b": plan_b, "rows": rows})
        return
    _out().print(compare_table(rows, f"{_plain(plan_a)} ({layout_label(a.parallel)})",
                               f"{_plain(plan_b)} ({layout_label(b.parallel)})"))


def _gpus_list(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not re.fullmatch(r"[0-9]+", part) or int(part) <= 0:
            raise UserError(f"--gpus-list takes positive GPU counts separated by commas (8,16,64), got {part!r}")
        if int(part) > 1_000_000:
            raise UserError(f"--gpus-list {part} is beyond what the planner models (max 1e+06 GPUs)")
        out.append(int(part))
    if not out:
        raise UserError("--gpus-list is empty; give counts like 8,16,64")
    return sorted(set(out))


def _sweep_row(spec, g: int, objective: str, kwargs: dict) -> dict:
    """One GPU count's best plan for `sweep`, or why nothing fits."""
    from .core import NothingFits, PlannerError, recommend as do_recommend
    from .render import full_layout_label
    row = {"gpus": g, "fits": False, "reason": None, "layout": None, "layout_label": None,
           "step_time_s": None, "tokens_per_s": None, "mfu": None, "memory_total_bytes": None,
           "days_to_train": None, "gpu_hours_to_train": None, "input_error": False}
    try:
        plan = do_recommend(spec, g, objective=objective, top_k=1, suggest=False, **kwargs)
    except NothingFits as e:
        row["reason"] = e.plan.prediction.reason if e.plan.prediction else str(e)
    except PlannerError as e:  # the input (a pin, the profile) rules this count out, not memory
        # the problem without its fix ("pick a divisor of 12": a count of the sweep's list is not the user's to change
        # there), and the count as sweep names it ("12 GPUs": --gpus is recommend's flag)
        row.update(reason=(e.problem if e.fix else _one_line(e)).replace(f"--gpus {g}", f"{g} GPUs"), input_error=True)
    else:
        from .explain import layout_dict
        pr = plan.prediction
        row.update(fits=True, layout=layout_dict(plan), layout_label=full_layout_label(plan.parallel),
                   step_time_s=pr.step_time_s, tokens_per_s=pr.tokens_per_s, mfu=pr.mfu,
                   memory_total_bytes=pr.memory_bytes_per_gpu.total, days_to_train=pr.days_to_train,
                   gpu_hours_to_train=pr.gpu_hours_to_train)
    return row


@app.command()
@_model_options
def sweep(
    gpus_list: str = typer.Option(",".join(str(2 ** k) for k in range(3, 13)), "--gpus-list",
                                  help="GPU counts to plan for, comma separated."),
    objective: str = typer.Option("throughput", "--objective", help="throughput or memory."),
    as_json: bool = typer.Option(False, "--json", help="Print the list as JSON on stdout."),
    opts=None,
):
    """Best layout for each GPU count: step time, tokens/s, MFU and memory, with bar charts."""
    from rich.progress import Progress

    from .render import bar_lines, sweep_table
    objective = _check_choice("objective", objective, ("throughput", "memory"))
    counts = _gpus_list(gpus_list)
    spec, kwargs = _prepare(opts)
    _profile_or_fail(opts.hardware)  # a bad profile is the input's fault at every count
    rows = []
    err = _console()  # a transient bar on a terminal's stderr: stdout keeps the table or the JSON
    with Progress(console=err, transient=True, disable=not err.is_terminal) as progress:
        for g in progress.track(counts, description="planning each GPU count"):
            rows.append(_sweep_row(spec, g, objective, kwargs))
    if rows and all(r["input_error"] for r in rows):  # no count could be planned at all: bad input, not memory
        # each count's own reason (they differ by the count: "--tp 8 does not divide --gpus 4", "... 12"), once each
        reasons = list(dict.fromkeys(r["reason"] for r in rows))
        raise UserError(f"no GPU count in --gpus-list can be planned: {'; '.join(reasons[:4])}"
                        + (f"; and {len(reasons) - 4} more" if len(reasons) > 4 else ""))
    if as_json:
        _write_json(rows)
    else:
        console = _out()
        fp8 = ", linears in FP8" if opts.fp8 else ""  # (MFU stays against the 16-bit peak, as recommend says)
        console.print(sweep_table(rows, f"sweep: {_plain(spec.name or spec.arch)} on {_plain(opts.hardware)}{fp8}"))
        mfu = "MFU (against the 16-bit peak; the linears run in FP8)" if opts.fp8 else "MFU"
        for line in (bar_lines(rows, "tokens_per_s", "tokens/s", lambda v: f"{v:,.0f}") + [""]
                     + bar_lines(rows, "mfu", mfu, lambda v: f"{v * 100:.1f}%")):
            console.print(line, highlight=False, markup=False)
    if not any(r["fits"] for r in rows):
        # an unpinned search already tries optimizer offload; only a pinned --offload none leaves it untried
        short = [str(r["gpus"]) for r in rows if str(r.get("reason") or "").startswith(("memory", "host-memory"))]
        rules = [str(r["gpus"]) for r in rows if str(r["gpus"]) not in short]
        _err("error: nothing fits at any of the GPU counts"
             + (f"; at {', '.join(short)} memory runs out: try larger counts"
                + (" or --offload optimizer" if opts.offload == "none" else "") if short else "")
             + (f"; at {', '.join(rules)} every layout breaks a rule (--json's reason says which: a batch or sequence "
                "that does not split, a schedule or pipeline rule)" if rules else ""))
        raise typer.Exit(EXIT_NOTHING_FITS)


@app.command()
def validate(
    sets: Optional[list[str]] = typer.Option(None, "--set", help="Reference set name (repeatable); default all."),
    reference_dir: Optional[str] = typer.Option(None, "--reference-dir", help="Folder of reference JSON files."),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="Predict every run on this profile (name or "
                                           "path) instead of its set's: e.g. the other bound of an unknown peak."),
    as_json: bool = typer.Option(False, "--json", help="Print the runs, per-set and per-framework errors as JSON."),
):
    """Predicted against published for every reference set (per run, median and max error)."""
    from pathlib import Path

    from .validate import ReferenceFileError, available_sets, framework_summary, summarize, validate_all
    if reference_dir is not None and not reference_dir.strip():
        raise UserError("--reference-dir is empty: give the folder of reference JSON files, or leave it out for "
                        "benchmarks/reference")
    directory = Path(reference_dir) if reference_dir else None
    if directory is not None and not directory.is_dir():
        raise UserError(f"--reference-dir {reference_dir} is not a folder; give the folder of reference JSON files "
                        "(benchmarks/reference in a parplan checkout)")
    names = available_sets(directory)
    if not names and directory is not None:
        from .validate import ADAPTERS
        raise UserError(f"--reference-dir {reference_dir} holds no known set file (the sets are named by their "
                        f"adapter, e.g. {next(iter(ADAPTERS))}.json; known: {', '.join(ADAPTERS)})")
    if not names:
        raise UserError("no reference sets found; run from a parplan checkout or pass --reference-dir benchmarks/reference")
    if sets:
        unknown = [s for s in sets if s not in names]
        if unknown:
            raise UserError(f"unknown reference set {unknown[0]!r}; available: {', '.join(names)}")
        names = list(dict.fromkeys(sets))  # a set named twice is validated once
    if hardware is not None:
        _profile_or_fail(hardware)
    from rich.progress import Progress
    err = _console()  # a transient bar on a terminal's stderr (the sets take seconds): stdout keeps the tables
    cases = []
    try:
        with Progress(console=err, transient=True, disable=not err.is_terminal) as progress:
            for name in progress.track(names, description="predicting the published runs"):
                cases += validate_all([name], directory, hardware)
    except ReferenceFileError as e:
        raise UserError(str(e)) from None
    summary = summarize(cases)
    # a set none of whose runs could be predicted for one reason (a profile without its dtype's peak or its
    # kernel's speed): said once, up front, grouped by reason, and on the set's summary line
    missing = {name: {c.note for c in cases if c.set_name == name and c.predicted is None and c.note} for name in names}
    unpredicted: dict[str, list[str]] = {}
    for name in names:
        if summary[name]["runs"] == 0 and len(missing[name]) == 1:
            unpredicted.setdefault(next(iter(missing[name])), []).append(name)
    for why, missed in unpredicted.items():
        _err(f"note: {len(missed)} set{'s' if len(missed) > 1 else ''} not predicted ({', '.join(missed)}): {why}")
    if hardware is not None:  # a profile fitted to a set is not what predicted it here
        for s in summary.values():
            s["fitted"] = None
    by_framework = framework_summary(cases)
    if as_json:
        _write_json({"cases": [{"set": c.set_name, "run": c.label, "metric": c.metric, "published": c.published,
                                "predicted": c.predicted, "error": c.error, "note": c.note} for c in cases],
                     "summary": summary, "by_framework": by_framework,
                     "hardware": hardware or "each set's own profile"})
        return
    from rich.table import Table
    console = _out()
    for name in names:
        t = Table(title=f"{name}", title_justify="left", header_style="bold")
        for col in ("run", "metric", "published", "predicted", "error", "layout"):
            t.add_column(col, justify="left" if col in ("run", "metric", "layout") else "right")
        for c in (c for c in cases if c.set_name == name):
            lay = ""
            if c.plan is not None:
                p = c.plan.parallel
                ep = f" ep{p.ep}" if p.ep > 1 else ""  # a mixture of experts' expert parallelism
                lay = f"tp{p.tp} pp{p.pp} dp{p.dp} cp{p.cp}{ep} v{p.vpp} mbs{c.plan.training.micro_batch_size} {p.recompute}"
            t.add_row(c.label, c.metric, f"{c.published:.4g}", "-" if c.predicted is None else f"{c.predicted:.4g}",
                      "-" if c.error is None else f"{c.error:+.1%}", lay or c.note)
        console.print(t)
        s = summary[name]
        fitted = f"; fitted on this set: {s['fitted']}" if s["fitted"] else ""
        sp = f", Spearman {s['spearman']:.2f}" if s["spearman"] is not None else ""
        errors = (f"median |error| {s['median_abs_error']:.1%}, max {s['max_abs_error']:.1%}"
                  if s["median_abs_error"] is not None
                  else "no prediction" + (f" ({next(iter(missing[name]))})" if len(missing[name]) == 1 else ""))
        unpredicted = f" ({s['missing']} of {s['runs'] + s['missing']} not predicted: see the table)" \
            if s["missing"] and s["runs"] else ""
        console.print(f"{name}: {_count(s['runs'], 'run')}, {errors}{sp}{fitted}{unpredicted}", highlight=False, markup=False)
    # the same runs by the framework each prediction modelled (what `recommend` prints under a plan)
    for fw, f in by_framework.items():
        parts = []
        if f["runs"]:
            parts.append(f"{_count(f['runs'], 'run')}, median |error| {f['median_abs_error']:.1%}, max {f['max_abs_error']:.1%}")
        if f["plausibility_runs"]:
            parts.append(f"{_count(f['plausibility_runs'], 'plausibility-only run')}, "
                         f"median {f['plausibility_median_abs_error']:.1%}")
        console.print(f"by framework, {fw}: " + "; ".join(parts), highlight=False, markup=False)


@app.command()
def schema(as_json: bool = typer.Option(False, "--json", help="Accepted for symmetry: the output is JSON.")):
    """Print the JSON Schema of a plan."""
    from .schema import Plan
    _write_json(Plan.model_json_schema())


@models_app.command("list")
def models_list(as_json: bool = typer.Option(False, "--json", help="Print the presets as JSON on stdout.")):
    """List model presets."""
    from .core import with_param_count
    from .models import list_presets, load_preset, preset_aliases
    rows = []
    for name in list_presets():
        spec = with_param_count(load_preset(name), 4096)
        rows.append(spec)
    if as_json:
        _write_json([r.model_dump(mode="json") for r in rows])
        return
    from rich import box
    from rich.table import Table
    aliases = ", ".join(f"{a} = {p}" for a, p in preset_aliases().items())
    t = Table(title="model presets", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False,
              collapse_padding=True,  # fits 80 columns uncut (no edge: ernie-4.5-300b-a47b's 19-character name)
              caption=f"also: {aliases}; and a Hugging Face name of one (meta-llama/Llama-3.1-8B-Instruct)",
              caption_justify="left")
    for c in ("name", "arch", "params", "layers", "hidden", "heads", "kv", "ffn", "vocab"):
        # the name is what --model takes: never cut (two presets had read "llama3.2…" at 80 columns)
        t.add_column(c, justify="left" if c in ("name", "arch") else "right", no_wrap=True,
                     min_width=max(len(s.name) for s in rows) if c == "name" and rows else None)
    for s in rows:
        t.add_row(s.name, s.arch, f"{s.num_params / 1e9:.2f} B" if s.num_params >= 1e8 else f"{s.num_params / 1e6:.2f} M", str(s.layers), str(s.hidden), str(s.heads),
                  str(s.kv_heads), str(s.ffn_hidden), str(s.vocab))
    _out().print(t)


@models_app.command("show")
def models_show(name: str, as_json: bool = typer.Option(False, "--json", help="Accepted for symmetry: the output is JSON.")):
    """Show one preset as JSON."""
    from .core import with_param_count
    from .models import load_preset
    try:
        spec = load_preset(name)
    except ValueError as e:
        raise UserError(_one_line(e)) from None
    _write_json(with_param_count(spec, 4096).model_dump(mode="json"))


@hardware_app.command("list")
def hardware_list(as_json: bool = typer.Option(False, "--json", help="Print the profiles as JSON on stdout.")):
    """List hardware profiles."""
    import hardware_profiles
    if as_json:
        _write_json([hardware_profiles.load_profile(n).model_dump(mode="json") for n in hardware_profiles.list_profiles()])
        return
    from rich.table import Table
    t = Table(title="hardware profiles", title_justify="left",
              caption="sustained: the share of the isolated-kernel matmul curve a long training run keeps, fitted on "
                      "a published table (A100: SC21 Table 1; H100, and H200 reusing it: Megatron-Core 2024); "
                      "1 = not calibrated to training runs, so likely optimistic; in-node GB/s is the node's fabric (NVLink, xGMI, "
                      "or PCIe where a GPU has neither) per direction ('by size': a group reaches a share of it that "
                      "its size sets, nvlink.efficiency_by_group_size, as a PCIe tree does; 'pairs': NVLink bridges "
                      "join pairs of cards at that rate, nvlink.bridge_gbytes_per_s); "
                      "inter-node GB/s is per GPU ('pooled': a group's ranks on a node share their NICs, "
                      "inter_node.aggregate_nics)", caption_justify="left")
    names = hardware_profiles.list_profiles()
    for c in ("name", "bf16 TFLOP/s", "fp8 TFLOP/s", "HBM", "HBM GB/s", "GPUs/node", "in-node GB/s", "inter-node GB/s",
              "sustained"):
        t.add_column(c, justify="left" if c == "name" else "right", no_wrap=c == "name",  # what --hardware takes; the
                     # numbers fold within their cell (at 80 columns every header and value does not fit one line)
                     min_width=max(map(len, names)) if c == "name" and names else None)
    for name in names:
        p = hardware_profiles.load_profile(name)
        fp8 = p.peak_dense_tflops.get("fp8")
        t.add_row(name, f"{p.peak_dense_tflops.get('bf16', 0):g}", f"{fp8:g}" if fp8 else "-", f"{p.hbm_gbytes:g} GB",
                  f"{p.hbm_gbytes_per_s:g}",
                  str(p.gpus_per_node),
                  f"{p.nvlink.gbytes_per_s:g}" + (" by size" if p.nvlink.efficiency_by_group_size else "")
                  + (f", pairs {p.nvlink.bridge_gbytes_per_s:g}" if p.nvlink.bridge_gbytes_per_s else ""),
                  f"{p.inter_node.gbytes_per_s:g}" + (" pooled" if p.inter_node.aggregate_nics else ""),
                  f"{p.sustained_matmul_fraction:g}")
    _out().print(t)


@hardware_app.command("detect")
def hardware_detect(as_json: bool = typer.Option(False, "--json", help="Print what was found as JSON on stdout.")):
    """This node's GPUs (nvidia-smi), how NVLink joins them (nvidia-smi topo -m) and its NICs (sysfs), against the
    profile its GPU matches: what differs and the recommend flags that plan for this node.  Reads, never measures
    (`parplan calibrate` measures); no torch."""
    from . import topology
    gpus, why = topology.read_smi_gpus()
    if not gpus:
        raise UserError(f"no NVIDIA GPU found here ({why}); run it on the GPU node, or pick a profile from `parplan "
                        "hardware list` (AMD GPUs: --hardware mi300x, mi325x or mi355x)")
    topo, _ = topology.read_topology()
    found = topology.detect_node(gpus, topo, topology.node_network())
    if as_json:
        _write_json(found)
        return
    out = _out()
    out.print(f"this node: {found['gpus']} x {found['gpu_name']} ({found['memory_mib']:,} MiB); {found['links_said']}; "
              f"NICs: {found['nics'] or 'none read'}" + (f" ({found['inter_node_gbytes_per_gpu']:.3g} GB/s a GPU)"
                                                        if found["nics"] else ""), markup=False, highlight=False, soft_wrap=True)
    out.print(f"profile: {found['profile']}" + ("" if found["profile_matched"] else " (no match: the default)"),
              markup=False, highlight=False, soft_wrap=True)
    for note in found["notes"]:
        out.print(f"  - {note}", markup=False, highlight=False, soft_wrap=True)
    out.print("plan for this node: parplan recommend --model MODEL --gpus N " + " ".join(found["recommend_flags"]),
              markup=False, highlight=False, soft_wrap=True)


@hardware_app.command("show")
def hardware_show(name: str, as_json: bool = typer.Option(False, "--json", help="Accepted for symmetry: the output is JSON.")):
    """Show one profile as JSON."""
    _write_json(_profile_or_fail(name).model_dump(mode="json"))


@app.command()
def calibrate(
    reports: Optional[list[str]] = typer.Argument(None, metavar="REPORT", show_default=False,
                                                  help="More launch reports for --from-run, e.g. from a shell glob "
                                                  "(--from-run runs/*/report.json)."),
    out: Optional[str] = typer.Option(None, "--out", help="Profile to write (.toml, or .json); default <base>-calibrated.toml, "
                                      "with --host-only <base>-host.toml; never the --base file itself (a default that "
                                      "would be it gets -recalibrated/-refit/-remeasured added; such an --out is refused)."),
    base: Optional[str] = typer.Option(None, "--base", help="Profile to start from (name or path); default the one matching "
                                       "the GPU (else h100-sxm-80gb), or with --from-run the reports' hardware."),
    device: str = typer.Option("auto", "--device", help="auto (a CUDA GPU, refused without one), cuda, or cpu (a "
                               "self-calibration of this CPU for testing only)."),
    quick: bool = typer.Option(False, "--quick", help="Fewer shapes and samples."),
    from_run: Optional[list[str]] = typer.Option(None, "--from-run", help="Launch report JSON (repeatable, or followed by "
                                                 "more report paths): refit "
                                                 "instead of measuring: the optimizer step from one-rank reports' "
                                                 "after-backward phase, sustained_matmul_fraction from compute-bound "
                                                 "runs, host_forward_share and host_block_s from launch-bound runs "
                                                 "(telling them apart needs a base with host_block_s: measure it with "
                                                 "--host-only), memory_reserve_gbytes. Reports need a step after the "
                                                 "warm-up (launch --steps 2 or more)."),
    host_only: bool = typer.Option(False, "--host-only", help="Measure only this machine's host dispatch per block "
                                   "(24 short runs; 8 of them took 36-46 s on an H100 host) into a copy of --base: run it on the machine you launch on, "
                                   "since a launch-bound step follows that host's CPU."),
    sustained: float = typer.Option(0.0, "--sustained", metavar="SECONDS", help="Also run the best GEMM back to back "
                                    "for SECONDS (e.g. 90) and measure sustained_matmul_fraction: what a long run keeps "
                                    "once clocks settle under the power and thermal limits; 0 (default) keeps the base's."),
):
    """Measure this machine (GEMM, attention, HBM, host link, collectives) into a hardware profile, or refit one from run reports."""
    device = _check_choice("device", device, ("auto", "cuda", "cpu"))
    if out is not None and not out.strip():
        raise UserError("--out is empty: give the profile file to write (.toml or .json), or leave --out out for "
                        "<base>-calibrated.toml")
    if reports and not from_run:
        raise UserError(f"unexpected argument {reports[0]}: give launch reports with --from-run (repeat --from-run for "
                        "each report, or --from-run runs/*/report.json)")
    if reports:
        from_run = [*from_run, *reports]  # `--from-run a.json b.json`: the shell's glob, all of them reports
    flag = next((r for r in from_run or [] if r.startswith("--")), None)
    if flag:  # `--from-run --out x.toml`: the option took the next flag as its report
        raise UserError(f"--from-run needs a launch report's path, and got the option {flag} -- fix: "
                        "--from-run runs/NAME/report.json, then the other options")
    if from_run and (quick or device != "auto"):
        raise UserError("--from-run refits from reports and measures nothing: drop --device/--quick")
    if sustained and (from_run or host_only):
        raise UserError("--sustained measures the GPU: drop --from-run/--host-only")
    if host_only and (from_run or quick):
        raise UserError("--host-only measures the host dispatch alone: drop --from-run/--quick (refit first, then "
                        "--host-only --base THE-REFIT on the launch machine)")
    from .calibrate import CalibrationError, _load_base, calibrate_device, calibrate_from_runs, calibrate_host
    try:
        if base is not None:
            _load_base(base)  # a misspelt --base is the first thing to say, before "no CUDA GPU here"
        if host_only:
            path, _, _ = calibrate_host(out=out, base=base, device=device, console=_console())
        elif from_run:
            path, _, _ = calibrate_from_runs(from_run, base=base, out=out, console=_console())
        else:
            path, _, _ = calibrate_device(out=out, base=base, device=device, quick=quick, console=_console(),
                                          sustained_s=sustained)
    except CalibrationError as e:
        raise UserError(str(e)) from None
    if device == "cpu":
        _err(f"wrote {path}: a CPU self-calibration FOR TESTING THE TOOL ONLY, not a GPU profile; do not plan real "
             "runs with it")
    else:
        _err(f"wrote {path}; use it with `parplan recommend --hardware {path} ...`")
    sys.stdout.write(f"{path}\n")


def _version_callback(value: bool):
    if value:
        from importlib.metadata import PackageNotFoundError, version
        try:
            v = version("parplan")
        except PackageNotFoundError:
            v = "0+unknown"
        sys.stdout.write(f"parplan {v}\n")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True,
                                       help="Print the version and exit.")):
    pass


def _usage_exceptions():
    """The UsageError/ClickException/NoArgsIsHelpError classes of whichever click typer runs on (recent typer
    vendors its own copy as typer._click; older ones use click), both when both are importable."""
    mods = []
    for name in ("typer._click.exceptions", "click.exceptions"):
        try:
            mods.append(__import__(name, fromlist=["UsageError"]))
        except ImportError:
            pass
    def pick(attr):
        return tuple(getattr(m, attr) for m in mods if hasattr(m, attr))
    return pick("NoArgsIsHelpError"), pick("UsageError"), pick("ClickException"), pick("Exit"), pick("Abort")


def _usage_line(e, argv: list[str] | None = None) -> str:
    sub = _subcommand(sys.argv[1:] if argv is None else argv)
    hint = f" (see `parplan {sub} --help`)" if sub else " (see `parplan --help`)"
    return f"error: {_one_line(Exception(e.format_message()))}{hint}"


def _subcommand(argv: list[str]) -> str | None:
    """The (sub)command an argument list names, walked down parplan's command tree (`models show`), for the help
    hint of a usage error; click raises some before the command's own context exists (`recommend --gpus` with no
    value).  An option before any command is the top level's (None); words after a leaf command are its own."""
    import typer.main
    group, path = typer.main.get_command(app), []
    for word in argv:
        if word.startswith("-"):
            if not path:
                return None
            continue
        commands = getattr(group, "commands", None)
        if not commands or word not in commands:
            break
        path.append(word)
        group = commands[word]
        if not getattr(group, "commands", None):
            break  # a leaf: what follows is its arguments, whatever they spell
    return " ".join(path) or None


def _profile_notes_on_stderr() -> None:
    """A profile file's implausible values (hardware_profiles.ProfileNote) as "note: ..." lines on stderr, each time;
    other warnings as Python shows them."""
    import warnings

    from hardware_profiles import ProfileNote
    shown = warnings.showwarning
    if getattr(shown, "_parplan", False):
        return

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, ProfileNote):
            _err(f"note: {message}")
        else:
            shown(message, category, filename, lineno, file, line)
    show._parplan = True
    warnings.showwarning = show
    warnings.simplefilter("always", ProfileNote)


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs typer without its standalone handler so every error is one stderr line.

    Exit codes: 0 success, 2 invalid input or usage, 3 nothing fits, 1 an internal error (one line;
    PARPLAN_DEBUG=1 shows the traceback), 130 interrupted, else the launched job's code."""
    no_args_help, usage, click_exc, click_exit, click_abort = _usage_exceptions()
    _profile_notes_on_stderr()
    try:
        rv = app(args=argv, standalone_mode=False, prog_name="parplan")
        code = int(rv or 0) if isinstance(rv, int) or rv is None else 0
        if code == EXIT_INTERRUPTED:  # typer's silent Exit(130) for a KeyboardInterrupt (Ctrl-C's, or raised by
            _err("error: interrupted")  # code: typer.core), or launch's interrupted job
        return code
    except UserError as e:
        _err(f"error: {e}")
        return EXIT_INVALID
    except no_args_help as e:
        ctx = getattr(e, "ctx", None)
        if ctx is not None:
            sys.stdout.write(ctx.get_help().rstrip("\n") + "\n")
        return 0
    except usage as e:
        _err(_usage_line(e, argv))
        return EXIT_INVALID
    except click_exc as e:
        _err(f"error: {_one_line(Exception(e.format_message()))}")
        return EXIT_INVALID
    except (typer.Exit, *click_exit) as e:
        return int(getattr(e, "exit_code", 0) or 0)
    except (typer.Abort, *click_abort):
        _err("error: aborted")
        return 130
    except BrokenPipeError:
        try:  # stdout's reader went away (`| head`): silence the flush at interpreter exit
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 0
    except KeyboardInterrupt:  # outside typer's own handling
        _err("error: interrupted")
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - last resort: one line instead of a traceback
        if os.environ.get("PARPLAN_DEBUG"):
            raise
        import errno
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO):
            # writing the answer failed (`> file` on a full disk): the machine's condition, not a bug in parplan
            try:
                _err(f"error: cannot write the output: {e.strerror or e}; free space where it goes, or write it "
                     "elsewhere")
            except OSError:
                pass
            return 1
        fixes = {errno.ENAMETOOLONG: "give a shorter path", errno.ELOOP: "give a path without the link loop",
                 errno.EACCES: "give a path you may read (and write, for an output) or change its permissions",
                 errno.EPERM: "give a path you may read (and write, for an output) or change its permissions",
                 errno.EROFS: "give an output path on a writable file system"}
        if isinstance(e, OSError) and e.errno in fixes:
            # a path the system refuses (a file name over 255 bytes, a symlink loop, a folder or file the user may
            # not enter, read or write, a read-only mount): the input's fault, wherever the command opened it
            name = f"{str(e.filename)[:60]}{'...' if len(str(e.filename)) > 60 else ''}: " if e.filename else ""
            _err(f"error: {name}{e.strerror or e}; {fixes[e.errno]}")
            return EXIT_INVALID
        if isinstance(e, _StdoutClosed) or (sys.stdout is None and isinstance(e, AttributeError)):  # `>&-`
            _err("error: stdout is closed; give the command somewhere to write (a file, a pipe)")
            return 1
        where = ""
        tb = e.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if tb is not None:
            where = f" at {os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
        _err(f"error: internal error {e.__class__.__name__}{where}: {_one_line(e)[:300]} "
             "(a bug in parplan; rerun with PARPLAN_DEBUG=1 for the traceback and report it)")
        return 1


def console_main() -> None:
    sys.exit(main())


if __name__ == "__main__":
    console_main()
