"""The three strict descriptions (model, hardware, training/parallel layout) and the Plan that joins them.

pydantic v2 models with ``extra="forbid"``: a plan file with an unknown or misspelt key is
rejected with a readable message.  Every field carries a description: it becomes the JSON Schema
text printed by ``parplan schema``.  Units live in field names (``_bytes``, ``_s``,
``_gbytes_per_s`` = gigabytes per second per GPU per direction).

The same axis names (tp pp dp cp vpp sp zero_stage recompute schedule offload micro_batch_size)
are used in JSON, in cost breakdowns and in the runtime's DeviceMesh.
"""
from __future__ import annotations

from typing import Literal, Optional, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cost_models.params import Mla, attention_matmul_params, is_moe_block, moe_block_count

from .limits import BATCH_MAX, BOUNDS, GPUS_MAX, PARAMS_MAX, SHAPE_MAX, big_number

SCHEMA_VERSION = 1

Arch = Literal["llama", "gpt"]
Dtype = Literal["bf16", "fp16", "fp32"]
Recompute = Literal["none", "selective", "full", "selective-op"]
Schedule = Literal["gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb", "zbv"]
Offload = Literal["none", "optimizer"]
# Mixed-precision recipes; bytes per parameter live in cost_models/memory.py (PRECISION_RECIPES).
Precision = Literal["amp", "master-weights", "master-weights-half-grads", "fp32"]
Objective = Literal["throughput", "min-gpus", "memory"]
# when a GPU's memory peaks (cost_models.memory.PEAK_MOMENTS, in its order)
PeakMoment = Literal["backward", "gradient reduction after the backward", "optimizer step"]


def _numeric(annotation) -> bool:
    """int or float, or an Optional/Union of them without bool."""
    args = get_args(annotation) or (annotation,)
    return bool({int, float} & set(args)) and bool not in args


def json_type_name(value) -> str:
    """What a parsed JSON value is, in JSON's words (null, not NoneType), for 'must be a JSON object, got ...'."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    return {dict: "object", list: "list", str: "string", int: "number", float: "number"}.get(type(value),
                                                                                           type(value).__name__)


def error_message(err: dict) -> str:
    """A pydantic error's message; a validator's own sentence as it wrote it, without pydantic's "Value error, "; a
    value past a bound the planner models said as the flags say it (planner.limits)."""
    bound = (err.get("ctx") or {}).get("le")
    if err.get("type") == "less_than_equal" and bound in BOUNDS and isinstance(err.get("input"), (int, float)):
        value = err["input"]
        return f"{big_number(value) if abs(value) >= 1e6 else value} is beyond what the planner models (max {bound:g})"
    return str(err.get("msg")).removeprefix("Value error, ")


def validation_summary(e, limit: int = 3) -> str:
    """A pydantic ValidationError in one line: its first `limit` fields' errors ("loc: message; ..."), then how many
    more there are."""
    parts = []
    for err in e.errors()[:limit]:
        loc = ".".join(str(x) for x in err.get("loc", ()))
        msg = error_message(err)
        parts.append(f"{loc}: {msg}" if loc else msg)
    more = f" (+{e.error_count() - limit} more)" if e.error_count() > limit else ""
    return "; ".join(parts) + more


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=False)

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, data):
        # pydantic's lax mode reads true as 1: a plan with "tp": true would run as tp 1
        if isinstance(data, dict):
            for key, value in data.items():
                field = cls.model_fields.get(key)
                if isinstance(value, bool) and field is not None and _numeric(field.annotation):
                    raise ValueError(f"{key}: expected a number, got {str(value).lower()}")
        return data


def _printable_name(value):
    # a name lands in exported scripts' and TOML files' comment lines: a newline there would end the comment
    if isinstance(value, str) and any(ord(c) < 0x20 or ord(c) == 0x7f for c in value):
        raise ValueError("control characters (newlines, tabs, ...) are not allowed in a name")
    return value


class ModelSpec(Strict):
    """A dense decoder-only transformer, as the cost model and the runtime both build it."""

    @field_validator("name")
    @classmethod
    def _name_printable(cls, v):
        return _printable_name(v)

    name: Optional[str] = Field(None, description="Preset or config name, if any.")
    arch: Arch = Field(description="llama: RMSNorm, RoPE, GQA, SwiGLU, no biases; gpt: LayerNorm, GeLU, learned positions, biases.")
    layers: int = Field(gt=0, le=SHAPE_MAX, description="Number of transformer blocks.")
    hidden: int = Field(gt=0, le=SHAPE_MAX, description="Model (residual stream) width.")
    heads: int = Field(gt=0, le=SHAPE_MAX, description="Query attention heads.")
    kv_heads: int = Field(gt=0, le=SHAPE_MAX, description="Key/value heads (GQA); equal to heads for multi-head attention.")
    ffn_hidden: int = Field(gt=0, le=SHAPE_MAX, description="Inner width of the MLP (per matrix for SwiGLU).")
    vocab: int = Field(gt=0, le=SHAPE_MAX, description="Vocabulary size.")
    head_dim: Optional[int] = Field(None, gt=0, le=SHAPE_MAX, description="Per-head width; defaults to hidden/heads.")
    tied_embeddings: bool = Field(False, description="Output projection shares the input embedding matrix.")
    max_seq_len: Optional[int] = Field(None, gt=0, le=SHAPE_MAX, description="Learned position table size (gpt); defaults to the training seq_len.")
    learned_positions: Optional[bool] = Field(
        None, description="A learned position table (gpt's default) or rotary positions (llama's; GPT-NeoX and Pythia "
        "are gpt-arch blocks with rotary positions: false).  None = the arch's default.")
    rope_theta: Optional[float] = Field(
        None, gt=0, allow_inf_nan=False, description="RoPE base of a llama-arch model (Llama 3: 500000, Qwen2.5/3: "
        "1000000); None = 10000, the Llama 2 and Megatron-LM default.  Sets the model, not its cost.")
    sliding_window: Optional[int] = Field(
        None, gt=0, description="Sliding-window attention: a windowed layer's query attends to at most this many keys, "
        "itself included (Hugging Face's sliding_window: Mistral 7B v0.1 4096, Gemma 2 4096, Gemma 3 1024).  None = "
        "every layer attends to the whole causal prefix.  Counted where the framework trains the window (Megatron-LM's "
        "--window-size, parplan's runtime, torchtitan's gpt_oss model); torchtitan's llama and DeepSpeed run full causal "
        "attention, and are predicted so.")
    full_attention_every: Optional[int] = Field(
        None, gt=0, description="With sliding_window: every k-th layer (numbered from 1) attends to the whole prefix and "
        "the others within the window (Megatron-LM's --window-attn-skip-freq; Gemma 2: 2, Gemma 3: its "
        "sliding_window_pattern, 6).  None = every layer within the window (Mistral 7B v0.1, Phi-3).  With "
        "attention_chunk the same for the chunks (Llama 4: 4, its NoPE layers attending in full).")
    attention_chunk: Optional[int] = Field(
        None, gt=0, description="Chunked attention (Llama 4's attention_chunk_size, 8192): the layers but every "
        "full_attention_every-th attend within fixed chunks of this many tokens, each query the keys of its own chunk "
        "up to itself (positions p // chunk alike).  Counted where the framework trains it (parplan's runtime: "
        "parallel_layers.window's segment masks, FlexAttention on a GPU); Megatron-LM, torchtitan's llama4 flavors "
        "without _irope and DeepSpeed run full causal attention, and are predicted so.  Not with sliding_window.  "
        "None = none.")
    experts: Optional[int] = Field(
        None, gt=1, le=SHAPE_MAX, description="Mixture of experts: routed experts in every block's MLP (Mixtral 8, "
        "Qwen3-30B-A3B 128), each a SwiGLU MLP of ffn_hidden, a token going to experts_per_token of them by a linear "
        "router (Megatron-Core's MoE layer: --num-experts).  None = a dense MLP.  Every block is an MoE block (a shared "
        "expert beside the routed ones: shared_expert_ffn) but those first_dense_layers and moe_layer_step make dense.")
    experts_per_token: Optional[int] = Field(
        None, gt=0, le=SHAPE_MAX, description="With experts: the router's top-k, the experts each token is sent to "
        "(Mixtral 2, Qwen3 MoE 8; Megatron-Core's --moe-router-topk).")
    shared_expert_ffn: Optional[int] = Field(
        None, gt=0, le=SHAPE_MAX, description="With experts: the width of the shared expert(s), a SwiGLU MLP every token "
        "runs beside its routed experts, tensor-parallel as a dense MLP (Megatron-Core's --moe-shared-expert-"
        "intermediate-size: all shared experts' widths together; Qwen2-MoE's shared_expert_intermediate_size, Llama 4's "
        "shared expert).  None = no shared expert.")
    first_dense_layers: Optional[int] = Field(
        None, gt=0, le=SHAPE_MAX, description="With experts: how many leading blocks have a dense SwiGLU MLP of "
        "dense_ffn_hidden in place of the experts (DeepSeek-V3 and GLM-4.5: 3, GLM-4.5-Air: 1; Hugging Face's "
        "first_k_dense_replace, Megatron-Core's --moe-layer-freq pattern [0]*k+[1]*(layers-k)).  None = none.")
    moe_layer_step: Optional[int] = Field(
        None, gt=0, le=SHAPE_MAX, description="With experts: every step-th block (numbered from 1) past the leading "
        "dense ones is an MoE block, the others dense (Llama 4 Maverick: 2, Hugging Face's interleave_moe_layer_step; "
        "Qwen-MoE's decoder_sparse_step).  None = 1, every block past them.")
    dense_ffn_hidden: Optional[int] = Field(
        None, gt=0, le=SHAPE_MAX, description="With first_dense_layers or moe_layer_step: the inner width of the dense "
        "blocks' SwiGLU MLP (Hugging Face's intermediate_size beside moe_intermediate_size; Megatron-Core's "
        "--ffn-hidden-size beside --moe-ffn-hidden-size).")
    kv_lora_rank: Optional[int] = Field(
        None, gt=0, le=SHAPE_MAX, description="Multi-head latent attention (MLA; DeepSeek-V2/V3, Kimi K2): the width "
        "of the compressed key/value latent, hidden -> kv_lora_rank + qk_rope_head_dim by a down projection, then up to "
        "every head's keys (no-rope part) and values (DeepSeek-V3: 512; Megatron-Core's --kv-lora-rank).  With it "
        "head_dim is a query/key head's whole width (no-rope + rope parts: DeepSeek-V3 128 + 64 = 192), kv_heads "
        "equals heads and v_head_dim is a value head's.  None = ordinary (grouped-query) attention.")
    q_lora_rank: Optional[int] = Field(
        None, gt=0, le=SHAPE_MAX, description="With kv_lora_rank: the compressed query latent's width (DeepSeek-V3: "
        "1536; --q-lora-rank).  None = a full hidden -> heads x head_dim query projection (DeepSeek-V2-Lite).")
    qk_rope_head_dim: Optional[int] = Field(
        None, gt=0, le=SHAPE_MAX, description="With kv_lora_rank: the rotary part of a query/key head (DeepSeek-V3: "
        "64; --qk-pos-emb-head-dim), one key part shared by the heads, taken straight from the down projection.")
    v_head_dim: Optional[int] = Field(
        None, gt=0, le=SHAPE_MAX, description="With kv_lora_rank: a value head's width (DeepSeek-V3: 128; "
        "--v-head-dim); the output projection is heads x v_head_dim -> hidden.")
    mtp_layers: Optional[int] = Field(
        None, gt=0, le=16, description="Multi-token prediction (DeepSeek-V3's MTP module, Megatron-LM's "
        "--mtp-num-layers): this many extra depths on the last pipeline stage, each a projection of [the block "
        "output; the next token's embedding] (2 hidden -> hidden), one more transformer block (an MoE block in a "
        "mixture of experts) and the shared output layer with its own loss.  Not counted in num_params (DeepSeek-V3's "
        "671B leaves out its 14B MTP module).  None = none (Hugging Face's num_nextn_predict_layers is read as a "
        "note).")
    qk_norm: Optional[bool] = Field(
        None, description="RMSNorms on the queries and keys between their projections and rotary (Qwen3, Qwen3-MoE, "
        "Gemma 3, OLMo 2 / 3, OLMoE, MiniMax-M2, Hunyuan, dots.llm1: Hugging Face's q_norm / k_norm, Megatron-LM's "
        "--qk-layernorm, torchtitan's qk_norm): each norm saves its input, the projection's output, and its fp32 "
        "statistics for the backward, and makes one memory-bound pass more (cost_models.memory.activation_bytes_per_"
        "layer, compute.layer_elementwise_time); counted for every framework, parplan's runtime included (it builds them "
        "per head, or over the whole widths with qk_norm_whole, inside the attention's checkpoint under selective "
        "recompute, where they save nothing more).  Their weights (2 x head_dim a layer, or the q and k widths) are not "
        "counted in num_params.  None = none.")
    qk_norm_whole: Optional[bool] = Field(
        None, description="With qk_norm: each norm normalises a token's whole query (heads x head_dim) or key width "
        "at once, one statistic a token, with a weight of that width (OLMo 2 / 3, OLMoE, MiniMax-M2: Hugging Face's "
        "q_norm of num_heads x head_dim), instead of each head on its own with one head_dim weight (Qwen3, Gemma 3).  "
        "Under tensor parallelism the width is split over the ranks, so each norm's statistics are all-reduced over "
        "them, forward and backward (counted as tensor-parallel communication; parplan's runtime does one all-reduce "
        "for q and k together each way).  None = per head.")
    post_norms: Optional[bool] = Field(
        None, description="A second norm on each sublayer's output before its residual add, beside the usual input "
        "norms: four norms a block (Gemma 2 / 3's post_attention_layernorm and post_feedforward_layernorm, GLM-4's "
        "post_self_attn_layernorm and post_mlp_layernorm; 'sandwich' norms).  Each saves its input, the attention "
        "output projection's or the MLP's output, which nothing else keeps, and its fp32 statistics for the backward, "
        "and makes one memory-bound pass more (cost_models.memory.activation_bytes_per_layer, compute.layer_"
        "elementwise_time); counted for every framework (parplan's runtime builds them too; in blocks torch.compile "
        "compiles, the residual between them is rebuilt in the backward: one hidden a token fewer).  Their weights (2 "
        "x hidden a layer) are counted in num_params.  Models with their two "
        "norms after the sublayers instead of before (OLMo 2) have two norms: not this (norms_after).  None = none.")
    qkv_bias: Optional[bool] = Field(
        None, description="Biases on the query, key and value projections of llama-arch blocks (Qwen2 / 2.5, Qwen1.5 / 2 "
        "MoE: Hugging Face's q_proj / k_proj / v_proj bias, Megatron-LM's --add-qkv-bias): q width + 2 kv width "
        "parameters a layer, counted in num_params and split over tp with their projections; added inside the GEMM "
        "(addmm) and their gradients a sum over the tokens in the backward, counted there.  parplan's runtime builds "
        "them.  gpt-arch blocks have biases on every linear already; not with multi-head latent attention.  None = "
        "none.")
    norms_after: Optional[bool] = Field(
        None, description="The block's two norms on the sublayers' outputs before their residual adds instead of on "
        "their inputs: x + norm(attention(x)), then x + norm(mlp(x)) (OLMo 2 / 3, EXAONE 4: Hugging Face's "
        "post_attention_layernorm and post_feedforward_layernorm, no input norms).  The same count as the usual "
        "pre-norms: each norm saves the sublayer's output where a pre-norm saves the residual, which the sublayer's "
        "first linears save in turn in place of the norm's output; parplan's runtime builds it (the memory test reads "
        "the same saved bytes as pre-norms).  Not with post_norms (four norms) nor, as no such model is known, with "
        "experts or multi-head latent attention.  None = pre-norms.")
    parallel_block: Optional[bool] = Field(
        None, description="Attention and MLP side by side on one norm of the block input, their outputs added to the "
        "residual together: x + attention(norm(x)) + mlp(norm(x)) (GPT-J, Falcon-7B, Phi-1 / 2, Cohere's Command R / "
        "R7B / A, StableLM with use_parallel_residual; PaLM's 'parallel layers').  One norm a layer (counted in "
        "num_params), its input and output saved once; under tensor parallelism one collective a direction where "
        "the sequential block has two (its five input projections read the one gathered input, its two output "
        "projections' partial sums are reduced together).  Trained so by parplan's runtime, and predicted so under "
        "--framework parplan; Megatron-LM, torchtitan and DeepSpeed build sequential blocks, which their plans "
        "count.  GPT-NeoX's and Falcon-40B's parallel blocks have two norms: not this.  Not with post_norms, "
        "norms_after, experts or multi-head latent attention.  None = sequential.")
    num_params: Optional[int] = Field(None, description="Total parameters (computed; filled in by the planner).")
    source: Optional[str] = Field(None, description="Where the shape came from (preset citation, config file, derived from a count).")

    @model_validator(mode="after")
    def _check_shape(self) -> "ModelSpec":
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.head_dim is None and self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads}), or give head_dim")
        if self.arch == "llama" and self.learned_positions:
            raise ValueError("learned_positions: arch llama has rotary positions; use arch gpt for a learned table")
        if self.full_attention_every is not None and self.sliding_window is None and self.attention_chunk is None:
            raise ValueError("full_attention_every needs sliding_window (the window the other layers attend within) or "
                             "attention_chunk")
        if self.attention_chunk is not None and (self.sliding_window is not None or self.kv_lora_rank is not None):
            raise ValueError("attention_chunk with sliding_window or multi-head latent attention is not planned (no such "
                             "model); give one of them")
        if not self.has_learned_positions and self.head_size % 2:
            raise ValueError(f"rotary positions rotate pairs of a head's channels, so head_dim must be even (it is "
                             f"{self.head_size}" + (f" = hidden {self.hidden} / heads {self.heads}" if self.head_dim is None
                                                    else "") + "); change hidden, heads or head_dim")
        if (self.experts is None) != (self.experts_per_token is None):
            raise ValueError("experts and experts_per_token come together (a mixture of experts needs both; a dense "
                             "model neither)")
        if self.shared_expert_ffn is not None and self.experts is None:
            raise ValueError("shared_expert_ffn is a mixture of experts' shared expert: it needs experts")
        if self.experts is not None:
            if self.experts_per_token > self.experts:
                raise ValueError(f"experts_per_token ({self.experts_per_token}) is more than experts ({self.experts})")
            if self.arch != "llama":
                raise ValueError("experts: mixture-of-experts blocks are planned with llama-arch blocks (SwiGLU experts, "
                                 "as Mixtral's and Qwen3's); use arch llama")
        mixed = self.first_dense_layers is not None or (self.moe_layer_step or 1) > 1
        if (self.first_dense_layers is not None or self.moe_layer_step is not None) and self.experts is None:
            raise ValueError("first_dense_layers and moe_layer_step place a mixture of experts' dense blocks: they need "
                             "experts")
        if mixed and self.dense_ffn_hidden is None:
            raise ValueError("dense blocks between the MoE ones (first_dense_layers, moe_layer_step) need their MLP's "
                             "width: give dense_ffn_hidden")
        if self.dense_ffn_hidden is not None and not mixed:
            raise ValueError("dense_ffn_hidden is the width of the dense blocks first_dense_layers or moe_layer_step "
                             "place; give one of them, or leave dense_ffn_hidden out")
        if self.experts is not None and self.moe_block_count == 0:
            raise ValueError(f"first_dense_layers {self.first_dense_layers} and moe_layer_step {self.moe_layer_step} "
                             f"leave none of the {self.layers} blocks an MoE block; give fewer dense layers, or drop "
                             "experts for a dense model")
        if self.qkv_bias and (self.arch != "llama" or self.kv_lora_rank is not None):
            raise ValueError("qkv_bias adds q/k/v biases to llama-arch blocks with ordinary attention (gpt blocks have "
                             "every bias already; latent attention has none): leave qkv_bias out")
        if self.norms_after and self.post_norms:
            raise ValueError("norms_after moves the block's two norms onto the sublayers' outputs, and post_norms adds "
                             "two there beside the input norms: give one of them")
        if self.norms_after and (self.experts is not None or self.kv_lora_rank is not None):
            raise ValueError("norms_after with experts or multi-head latent attention is not planned (no such model); "
                             "leave norms_after out")
        if self.parallel_block and (self.post_norms or self.norms_after or self.experts is not None
                                    or self.kv_lora_rank is not None):
            raise ValueError("parallel_block with post_norms, norms_after, experts or multi-head latent attention is not "
                             "planned (no such model); leave parallel_block out")
        if self.qk_norm_whole and not self.qk_norm:
            raise ValueError("qk_norm_whole says how the q/k norms normalise: it needs qk_norm true (or leave "
                             "qk_norm_whole out)")
        mla = (self.q_lora_rank, self.qk_rope_head_dim, self.v_head_dim)
        if self.kv_lora_rank is None and any(x is not None for x in mla):
            raise ValueError("q_lora_rank, qk_rope_head_dim and v_head_dim shape multi-head latent attention: they need "
                             "kv_lora_rank (or leave them out for ordinary attention)")
        if self.kv_lora_rank is not None:
            if self.arch != "llama":
                raise ValueError("kv_lora_rank: multi-head latent attention is planned in llama-arch blocks (RMSNorm, "
                                 "rotary positions, no biases, as DeepSeek's); use arch llama")
            if self.qk_rope_head_dim is None or self.v_head_dim is None or self.head_dim is None:
                raise ValueError("multi-head latent attention (kv_lora_rank) needs head_dim (a query/key head's whole "
                                 "width), qk_rope_head_dim (its rotary part) and v_head_dim (DeepSeek-V3: 192, 64, 128)")
            if self.kv_heads != self.heads:
                raise ValueError(f"multi-head latent attention gives every head its own keys and values: kv_heads "
                                 f"({self.kv_heads}) must equal heads ({self.heads})")
            if self.qk_rope_head_dim >= self.head_dim or self.qk_rope_head_dim % 2:
                raise ValueError(f"qk_rope_head_dim ({self.qk_rope_head_dim}) is the rotary part of head_dim "
                                 f"({self.head_dim}): it must be even and smaller than head_dim")
            if self.sliding_window is not None:
                raise ValueError("sliding_window with multi-head latent attention is not planned (no such model); "
                                 "leave one of them out")
            if self.qk_norm:
                raise ValueError("qk_norm with multi-head latent attention: its latents have their own RMSNorms "
                                 "(counted with kv_lora_rank); leave qk_norm out")
        # the blocks' matrices and the embedding (norms and biases aside): the bound the flags hold a count to
        h = self.hidden
        attn = attention_matmul_params(self.arch, h, self.heads, self.kv_heads, self.head_size, self.mla)
        moe = self.moe_block_count if self.experts is not None else self.layers
        weights = moe * 3 * h * (self.ffn_hidden * (self.experts or 1) + (self.shared_expert_ffn or 0)) \
            + (self.layers - moe) * 3 * h * (self.dense_ffn_hidden or 0) + self.layers * attn + self.vocab * h
        if weights > PARAMS_MAX:
            raise ValueError(f"{big_number(weights)} parameters is beyond what the planner models (max {PARAMS_MAX:g})")
        return self

    @property
    def windowed_layers(self) -> int:
        """How many layers attend within sliding_window (Megatron-LM's rule: layer i, from 1, attends in full where
        i is a multiple of full_attention_every)."""
        return 0 if self.sliding_window is None else self._local_layers()

    @property
    def chunked_layers(self) -> int:
        """How many layers attend within their chunk (attention_chunk; windowed_layers' rule)."""
        return 0 if self.attention_chunk is None else self._local_layers()

    def _local_layers(self) -> int:
        k = self.full_attention_every
        return self.layers - (self.layers // k if k else 0)

    def chunk_binds(self, seq_len: int) -> bool:
        """Whether some layers' chunk is shorter than the sequence (otherwise it changes nothing)."""
        return bool(self.chunked_layers) and self.attention_chunk < seq_len

    def window_binds(self, seq_len: int) -> bool:
        """Whether some layers' window is shorter than the sequence (otherwise it changes nothing)."""
        return bool(self.windowed_layers) and self.sliding_window < seq_len

    @property
    def is_moe(self) -> bool:
        """A mixture of experts (experts set): its MLP is experts x ffn_hidden wide, a token runs
        experts_per_token x ffn_hidden of it."""
        return self.experts is not None

    def is_moe_block(self, i: int) -> bool:
        """Whether block i (from 0) is an MoE block: past the first_dense_layers, every moe_layer_step-th (Hugging
        Face's Qwen2-MoE / Llama 4 rule, (i + 1) % step == 0).  Every block of a dense model is dense."""
        return self.experts is not None and is_moe_block(i, self.first_dense_layers or 0, self.moe_layer_step or 1)

    @property
    def moe_block_count(self) -> int:
        """MoE blocks (is_moe_block); all of them where no dense blocks are placed between, none for a dense model."""
        if self.experts is None:
            return 0
        return moe_block_count(self.layers, self.first_dense_layers or 0, self.moe_layer_step or 1)

    @property
    def mla(self):
        """Multi-head latent attention's widths (params.Mla), or None for ordinary attention."""
        if self.kv_lora_rank is None:
            return None
        return Mla(q_lora=self.q_lora_rank or 0, kv_lora=self.kv_lora_rank, rope=self.qk_rope_head_dim,
                   v_dim=self.v_head_dim)

    @property
    def attention_width(self) -> int:
        """The width the attention core's FLOPs scale with, heads x head_dim (QK^T and the values' product each
        2 s x that a token): with multi-head latent attention QK^T runs at head_dim and the values' at v_head_dim,
        so their mean."""
        if self.kv_lora_rank is None:
            return self.heads * self.head_size
        return self.heads * (self.head_size + self.v_head_dim) // 2

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def rope_base(self) -> float:
        """The RoPE base the model rotates with (rope_theta, or the Llama 2 / Megatron-LM default)."""
        return self.rope_theta or 10000.0

    @property
    def has_learned_positions(self) -> bool:
        """A learned position table (it caps the sequence at max_seq_len); otherwise rotary positions."""
        return self.arch == "gpt" and self.learned_positions is not False


class HardwareRef(Strict):
    name: str = Field(description="Hardware profile name (see `parplan hardware list`) or the path it was loaded from.")
    @field_validator("name")
    @classmethod
    def _name_printable(cls, v):
        return _printable_name(v)
    gpus: int = Field(gt=0, le=GPUS_MAX, description="Total GPUs in the job.")
    gpus_per_node: int = Field(gt=0, le=GPUS_MAX, description="GPUs per node (NVLink domain).")
    inter_node_gbytes_per_s: Optional[float] = Field(None, ge=0.001, allow_inf_nan=False, description="Override of the profile's inter-node bandwidth, GB/s per GPU per direction (at least 0.001, as --inter-node-bandwidth).")
    aggregate_nics: Optional[bool] = Field(None, description="Override of the profile's inter_node.aggregate_nics: a collective's ranks on a node pool their NICs (None: the profile's).")


class Training(Strict):
    seq_len: int = Field(gt=0, le=SHAPE_MAX, description="Tokens per sequence.")
    document_length: Optional[int] = Field(
        None, gt=0, le=SHAPE_MAX, description="Packed documents: each sequence holds documents of this many tokens "
        "(the last one shorter where it does not divide seq_len), each attending only within itself (an intra-document "
        "causal mask: Llama 3's, torchtitan's block_causal).  Counted where the framework skips the attention across "
        "documents (planner.core.DOCUMENT_FRAMEWORKS: parplan's runtime, FlexAttention under the documents' block mask "
        "on a GPU; torchtitan's FlexAttention): a document of L tokens attends L^2 / 2 pairs, not its share of s^2 / 2.  "
        "For documents of varying lengths, the length whose square is their mean square over their mean (sum L^2 / "
        "sum L) gives the same pairs.  parplan's runtime masks fixed-length documents of synthetic tokens (not a token "
        "file's own).  None = one document a sequence.")
    global_batch_size: int = Field(gt=0, le=BATCH_MAX, description="Sequences per optimizer step (= dp x micro_batch_size x num_microbatches).")
    micro_batch_size: int = Field(gt=0, description="Sequences per micro-batch per data-parallel replica.")
    num_microbatches: int = Field(gt=0, description="Micro-batches per optimizer step per replica (gradient accumulation / pipeline depth).")
    dtype: Dtype = Field("bf16", description="Compute dtype of matrix multiplies. fp16 (with a 16-bit recipe) scales "
                         "the loss dynamically: parplan's runtime (parallel_layers.loss_scale), and the step counts the "
                         "unscale pass (cost_models.compute.loss_scale_time).")
    precision: Precision = Field("amp", description="Mixed-precision recipe: amp = fp32 params/grads/Adam under autocast (16 B/param + 16-bit cast copies); master-weights = 16-bit params + fp32 grads + fp32 master + Adam (18 B/param, Megatron); master-weights-half-grads = 16-bit params and grads + fp32 master + Adam (16 B/param, the ZeRO paper / DeepSpeed fp16); fp32 = everything fp32 (16 B/param).")
    framework: Literal["parplan", "megatron", "deepspeed", "torchtitan", "fsdp"] = Field(
        "parplan", description="Framework the prediction models; it set the defaults of zero1_grad_reduce, "
        "zero2_grad_reduce, grad_accumulation_fusion and p2p_scatter_gather, the schedules searched, and how ZeRO-3 "
        "behaves inside a pipeline (parplan = its own runtime, what `parplan launch` runs; fsdp = PyTorch FSDP over "
        "an eager model with Megatron-style tensor parallelism and no pipeline, context or sequence parallelism, "
        "as metaseq and llm-foundry run it).")
    dropout: bool = Field(False, description="Hidden and attention dropout as in published GPT runs (Megatron default 0.1); adds masks and memory-bound passes. parplan's runtime applies it at Megatron's sites and rates (0.1 each; python -m parallel_layers.train --hidden-dropout/--attention-dropout).")
    flash_attention: bool = Field(True, description="Fused attention kernel (no s^2 score tensors stored).")
    overlap_grad_reduce: bool = Field(True, description="Data-parallel gradient reduction (ZeRO 0-2) overlapped with the backward pass (parplan's runtime since 2026-11-24, under the zero-bubble schedules with a pipeline since 2026-11-25: not where torch's own weight pass runs, FSDP2).")
    overlap_param_gather: Optional[bool] = Field(
        None, description="ZeRO-1/2's gather of the stepped parameters overlapped with the next forward (Megatron-LM's "
        "--overlap-param-gather; parplan's runtime since 2026-11-24: each part of a stage waits for its parameters "
        "before it runs). Absent = as overlap_grad_reduce.")
    overlap_tp_comm: bool = Field(False, description="Tensor-parallel collectives overlapped with GEMMs (Megatron --tp-comm-overlap).")
    zero1_grad_reduce: Literal["all-reduce", "reduce-scatter"] = Field(
        "all-reduce", description="How ZeRO-1 reduces gradients: all-reduce, then each rank steps its shard (parplan's runtime, "
        "DeepSpeed's BF16 optimizer), or reduce-scatter (Megatron's distributed optimizer, DeepSpeed ZeRO-1).")
    zero2_grad_reduce: Literal["per-step", "per-micro-batch"] = Field(
        "per-step", description="When ZeRO-2 reduce-scatters gradients: once per step after the last micro-batch, so "
        "each rank holds full gradients through the backward (parplan's runtime; torch pipelining with FSDP's "
        "no_sync), or after every micro-batch's backward as they are produced, so gradients stay sharded (DeepSpeed "
        "stage 2, FSDP without no_sync) at m times the reduce-scatter traffic.")
    grad_accumulation_fusion: bool = Field(
        False, description="Weight-gradient GEMMs accumulate straight into the gradient buffer (Megatron-LM's "
        "gradient_accumulation_fusion, on by default there; parplan's runtime on CUDA with torch >= 2.8, its default "
        "since 2026-11-24). Applies to the master-weights recipe (an fp32 buffer), and under Megatron-LM to "
        "master-weights-half-grads too (its 16-bit main_grad: wgrad_gemm_accum_fp16; counted since 2026-12-06), "
        "outside FSDP2 (and torch's own zero-bubble weight "
        "pass, which parplan's runtime replaces below ZeRO-3 since 2026-11-25). "
        "Off = a separate memory-bound pass per micro-batch upcasts or adds each gradient into the buffer, as "
        "DeepSpeed and FSDP do. Absent (plans written before 2026-11-24) = off.")
    p2p_scatter_gather: bool = Field(
        False, description="Without sequence parallelism, each tensor-parallel rank sends only its 1/tp slice of the "
        "activation to the next pipeline stage, which all-gathers it over the tensor-parallel group (Megatron-LM's "
        "scatter_gather_tensors_in_pipeline, on by default there; Narayanan 2021 sec. 4.1; DeepSpeed's pipeline engine "
        "partitions its buffers the same way). Off = every rank sends the whole tensor, as parplan's runtime "
        "(torch.distributed.pipelining) does.")
    fused_cross_entropy: bool = Field(
        False, description="The loss keeps one fp32 softmax of the logits and writes its gradient into it in place "
        "(Megatron-LM's vocab-parallel cross-entropy: 16-bit logits + 4 B per logit at the loss's backward). Off = an "
        "autograd cross-entropy over an fp32 upcast (torchtitan; parplan's runtime for plans that say so): the saved "
        "fp32 log-softmax plus two fp32 logit-sized tensors in its backward, 12 B per logit (measured: an H100 "
        "allocator snapshot, benchmarks/results/2026-11-22-h100/snapshots).")
    cross_entropy_16bit_grad: bool = Field(
        False, description="With fused_cross_entropy: the loss writes the logits' gradient in their 16-bit dtype and "
        "saves only the 16-bit logits (flash-attn's cross-entropy, llm-foundry's default loss_fn; parplan's runtime, its "
        "default since 2026-11-24), 2 x 2 B per logit at its backward, where Megatron's keeps an fp32 softmax (2 + 4 B).")
    async_tp_grad_comm: bool = Field(
        True, description="The column-parallel layers' input-gradient collective (an all-reduce; a reduce-scatter "
        "with sequence parallelism) runs asynchronously beside their weight-gradient GEMM (Megatron-LM's "
        "async_tensor_model_parallel_allreduce, LinearWithGradAccumulationAndAsyncCommunication, on by default there "
        "since 2022; parplan's runtime, parallel_layers.layers._TPLinears / _SPGatherLinears). Off = the backward "
        "waits for it (Megatron-DeepSpeed, which disables it by default; torchtitan's DTensor tensor parallelism; "
        "Megatron-LM of 2021).")
    overlap_cp_comm: bool = Field(
        False, description="Context parallelism's key/value exchange runs beside the attention (Megatron's ring "
        "attention passes K/V chunks while the previous chunk is computed; torch's, under torchtitan, gathers them "
        "asynchronously behind the rank's own chunk). Off = one all-gather of K and V before "
        "the attention, on the critical path (parplan's runtime; Llama 3's all-gather CP, whose paper says the "
        "all-gather latency is exposed: Dubey et al. 2024 sec. 3.3.2).")
    fp8: bool = Field(
        False, description="The blocks' linear layers (qkv, attention projection, MLP) multiply in FP8 with per-tensor "
        "scaling, E4M3 forward and E5M2 gradients: Transformer Engine's hybrid format with delayed scaling and FP8 "
        "weights under framework megatron (--fp8-format hybrid --fp8-param-gather, NeMo's H100 recipe), torchao's "
        "float8 (tensor-wise, dynamic) under torchtitan, and the same torchao recipe under parplan (parallel_layers.fp8: "
        "parplan launch runs it, torch._scaled_mm). Attention, norms, embedding, output layer and the optimizer "
        "stay as dtype and precision say. Time: those GEMMs at the profile's fp8 peak (cost_models.compute."
        "linear_gemm_time) plus their quantization passes (fp8_cast_time); memory: the inputs the linears save in "
        "FP8 (cost_models.memory.activation_bytes_per_layer; Transformer Engine only).")
    moe_dispatcher: Literal["alltoall", "deepep"] = Field(
        "alltoall", description="How a mixture of experts' tokens reach their experts (cost_models/moe.py): alltoall = "
        "NCCL's all-to-all (Megatron-LM's --moe-token-dispatcher-type alltoall), a token sent once per expert of "
        "another rank; deepep = DeepEP's dispatch and combine (--moe-token-dispatcher-type flex "
        "--moe-flex-dispatcher-backend deepep), a token crossing the network once per remote node holding one of its "
        "experts and forwarded over NVLink there.  Inside a node the two are timed alike.  A dense model: no effect.")
    moe_recompute: Literal["none", "act", "norm-act"] = Field(
        "none", description="A mixture of experts' recompute modules beside the plan's recompute (Megatron-LM's "
        "--recompute-granularity selective --recompute-modules: act = moe_act, the experts' activation recomputed in "
        "the backward, its output not saved; norm-act = layernorm and moe_act, the pre-MLP norm's output not saved "
        "either): less activation memory for a memory-bound pass in the backward (cost_models/moe.py).  No effect "
        "where the blocks are recomputed whole.  parplan's runtime runs both in its MoE blocks (parallel_layers.model."
        "Block: the routed experts' activation output, and the pre-MLP norm's output the router and the shared expert "
        "read, rebuilt for the backward from what the block keeps anyway; the shared expert's activation and the dense "
        "blocks between are left as they are, as Megatron-LM leaves them).  A dense model: none.")
    moe_a2a_overlap: bool = Field(
        False, description="A mixture of experts' token all-to-alls hidden behind another micro-batch's compute "
        "(Megatron-Core's --overlap-moe-expert-parallel-comm, from release 0.14: its combined 1F1B runs one "
        "micro-batch's block forward beside another's block backward on two streams, so each pass's dispatch and "
        "combine overlap the other's compute; cost_models.moe.overlapped_all_to_alls).  The warm-up forwards and "
        "cool-down backwards still run alone.  Memory as without it: Megatron's one more warm-up forward is the "
        "forward 1F1B runs before its first backward, and a merged pair frees the backward's blocks as the forward "
        "saves its own (one block more at most, not counted).  Megatron runs it without a pipeline or under interleaved 1F1B "
        "(vpp >= 2), not with full recompute: the search keeps to those layouts.  Framework megatron only (parplan's "
        "runtime does not overlap its all-to-alls); a dense model: off.")
    mla_recompute: bool = Field(
        False, description="Multi-head latent attention's up projections recomputed in the backward (Megatron-LM's "
        "--recompute-granularity selective --recompute-modules mla_up_proj, DeepSeek-V3's recipes): the attention "
        "core's q, k and v are not kept, the two up projections' GEMMs run again (cost_models.compute."
        "mla_up_recompute_time; parplan's runtime rebuilds the attention kernel's q, k and v from the kept latents, "
        "parallel_layers.model.MLAttention).  No effect where the blocks are recomputed whole, nor under parplan's "
        "selective-op (its op policy saves what it saves); needs a model with kv_lora_rank.")
    attention_kernel: Literal["profile", "triton-2022"] = Field(
        "profile", description="The fused attention kernel's speed: profile = the hardware profile's measured "
        "attention curve (the kernel torch's scaled_dot_product_attention picks on that GPU, as parplan's runtime "
        "and torchtitan run it: cuDNN's fused attention on the H200 and H100 with torch 2.11, "
        "benchmarks/results/2026-12-04-h200/attention_backends.md); triton-2022 = the Triton FlashAttention of 2022 (flash_attn_triton on triton 2.0.0.dev20221202, "
        "llm-foundry's attn_impl triton), which FlashAttention-2 outruns 1.3-1.5x forward and 2x backward (Dao 2023, "
        "sec. 4.1, A100), capped at FlashAttention-2's published best on the GPU (flash_attention_2_tflops: 335 "
        "TFLOP/s on H100, which a kernel without Hopper instructions does not pass).")
    fused_elementwise: bool = Field(
        True, description="The blocks' pointwise work (norms, rotary, SwiGLU) runs as fused kernels: Megatron's and "
        "apex's, or torch.compile's (parplan launch compiles each block on cuda; torchtitan with training.compile). "
        "Off = eager PyTorch ops, each a pass over memory (RMSNorm in fp32, complex rotary, the GQA key/value copy: "
        "about 3.3x the bytes of a llama block's fused pointwise work, cost_models.compute.layer_elementwise_time).")
    clip_grad: Optional[float] = Field(
        None, gt=0, allow_inf_nan=False, description="Clip the gradient to this global 2-norm before each optimizer step (Megatron-LM "
        "--clip-grad, DeepSpeed gradient_clipping, torchtitan max_norm; 1.0 in all three, and what `parplan recommend` "
        "writes); costs a read of every gradient for the norm and, except in Megatron-LM (which scales only when "
        "clipping), a scaling pass. None = no clipping (plans written before the field existed).")
    tokens: Optional[float] = Field(None, gt=0, le=1e18, allow_inf_nan=False,
                                    description="Total training tokens, for time-to-train (at most 1e18).")
    seed: int = Field(1234, description="Seed of the logical weights and synthetic data.")
    lr: float = Field(3e-4, gt=0, allow_inf_nan=False, description="AdamW learning rate used by `parplan launch`.")


class Parallel(Strict):
    tp: int = Field(1, gt=0, description="Tensor-parallel degree (innermost mesh dim).")
    pp: int = Field(1, gt=0, description="Pipeline-parallel degree.")
    dp: int = Field(1, gt=0, description="Data-parallel degree.")
    cp: int = Field(1, gt=0, description="Context-parallel degree (sequence split for attention).")
    vpp: int = Field(1, gt=0, description="Model chunks per pipeline rank (virtual stages); layers per chunk = layers/(pp*vpp).")
    sp: bool = Field(False, description="Sequence parallelism inside the TP group (Korthikanti 2022).")
    zero_stage: int = Field(0, ge=0, le=3, description="0 replicated optimizer, 1 sharded optimizer states, 2 +sharded grads, 3 +sharded params (FSDP).")
    recompute: Recompute = Field("none", description="Activation recomputation: none, selective (core attention + MLP activation), full (whole block), selective-op (torchtitan's op-level selective checkpointing: keeps every second matmul's and the attention kernel's outputs, recomputes the rest).")
    recompute_layers: Optional[int] = Field(
        None, gt=0, description="With recompute full: how many blocks of each virtual stage are recomputed, from its "
        "first; the others keep their activations (Megatron-LM's --recompute-method block --recompute-num-layers). "
        "None: every block.")
    schedule: Schedule = Field("1f1b", description="Pipeline schedule.")
    offload: Offload = Field("none", description="optimizer: Adam states and fp32 master on host memory, step on the CPU.")
    dp_replicate: int = Field(
        1, gt=0, description="ZeRO-3's hybrid sharding (HSDP): the dp ranks form this many groups of dp / dp_replicate "
        "consecutive ranks, each sharding the parameters, gradients and optimizer states (with their cp ranks where "
        "the framework shards over cp too: torchtitan's dp_shard x cp), the groups replicas of each other that "
        "all-reduce their gradient shards (torch FSDP2's 2D mesh: torchtitan's data_parallel_replicate_"
        "degree; FSDP1's HYBRID_SHARD).  With zero_stage 1 (Megatron-LM only): its distributed optimizer in this many "
        "instances (--num-distributed-optimizer-instances), each sharding the optimizer states over dp / dp_replicate "
        "ranks, the gradients reduce-scattered inside an instance and all-reduced across them.  1: the states "
        "sharded over all dp ranks.")
    ep: int = Field(
        1, gt=0, description="Expert parallelism (a mixture-of-experts model's): each MoE layer's experts split over ep "
        "ranks, which exchange tokens by all-to-all (Megatron-Core's --expert-model-parallel-size, with "
        "--expert-tensor-parallel-size 1: the ep ranks are taken from the stage's tp x cp x dp ranks, and the "
        "experts' states are data-parallel over the tp x cp x dp / ep ranks that hold the same experts).  1: every "
        "rank holds every expert.")
    stage_layers: Optional[list[int]] = Field(None, description="Transformer blocks held by each pipeline stage (pp*vpp entries, in virtual-stage order); first/last are lighter to carry the embedding and the head.")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @model_validator(mode="after")
    def _check(self) -> "Parallel":
        if self.stage_layers is not None:
            if len(self.stage_layers) != self.pp * self.vpp:
                raise ValueError(f"stage_layers has {len(self.stage_layers)} entries, expected pp*vpp = {self.pp * self.vpp}")
            if any(n < 0 for n in self.stage_layers):
                raise ValueError("stage_layers entries must be >= 0")
        if self.schedule in ("gpipe", "1f1b") and self.vpp != 1:
            raise ValueError(f"schedule {self.schedule} takes vpp=1, got vpp={self.vpp}; use interleaved-1f1b for vpp>1")
        if self.schedule in ("interleaved-1f1b", "interleaved-zb") and self.vpp < 2 and self.pp > 1:
            raise ValueError(f"schedule {self.schedule} needs vpp>=2, got vpp={self.vpp}")
        if self.schedule == "zbv" and self.vpp != 2:
            raise ValueError(f"schedule zbv uses exactly two chunks per rank (vpp=2), got vpp={self.vpp}")
        if self.sp and self.tp == 1:
            raise ValueError("sp (sequence parallel) needs tp > 1")
        if self.dp_replicate > 1:
            if self.zero_stage not in (1, 3):
                raise ValueError(f"dp_replicate {self.dp_replicate} is ZeRO-3's hybrid sharding (or, under "
                                 "Megatron-LM, ZeRO-1's optimizer instances): it needs zero_stage 3 or 1, got "
                                 f"{self.zero_stage}")
            if self.dp % self.dp_replicate or self.dp == self.dp_replicate:
                raise ValueError(f"dp_replicate {self.dp_replicate} must divide dp {self.dp} into groups of two or more "
                                 "ranks")
        if self.ep > 1 and (self.tp * self.cp * self.dp) % self.ep:
            raise ValueError(f"ep {self.ep} must divide tp x cp x dp = {self.tp * self.cp * self.dp} (the expert-parallel "
                             "ranks are taken from them)")
        if self.ep > 1 and self.dp_replicate > 1 and (self.tp * self.cp * self.dp // self.ep) % self.dp_replicate:
            raise ValueError(f"dp_replicate {self.dp_replicate} must divide the experts' data-parallel group, tp x cp x "
                             f"dp / ep = {self.tp * self.cp * self.dp // self.ep} (its replica groups, or Megatron-LM's "
                             "optimizer instances, split that group too)")
        if self.recompute_layers is not None and self.recompute != "full":
            raise ValueError(f"recompute_layers needs recompute full (the blocks it recomputes whole), got recompute "
                             f"{self.recompute}")
        if self.recompute_layers is not None and self.stage_layers and self.recompute_layers >= max(self.stage_layers):
            raise ValueError(f"recompute_layers {self.recompute_layers} recomputes every block of each stage (at most "
                             f"{max(self.stage_layers)}); drop it for recompute full")
        return self


class MemoryBreakdown(Strict):
    weights: float = Field(description="Parameter bytes resident on the worst stage's GPU.")
    grads: float = Field(description="Gradient bytes.")
    optimizer: float = Field(description="Optimizer state (+fp32 master) bytes on the GPU.")
    activations: float = Field(description="Saved activations of all in-flight micro-batches plus embedding/logits.")
    other: float = Field(description="Framework overhead: CUDA context, communication buffers, temporaries, allocator fragmentation; at the optimizer step (where that is the peak, with activations 0) the step's fp32 copies of 16-bit gradients (under DeepSpeed's ZeRO optimizer, a group's flat gradient copy and its fp32 cast).")
    total: float = Field(description="Sum of the above, bytes per GPU.")
    peak_moment: Optional[PeakMoment] = Field(
        None, description="When the worst rank's memory peaks: in the backward (with the saved activations), or after "
                          "it, at the gradient reduction (DeepSpeed's flat gradient copies and buckets) or at the "
                          "optimizer step (the fp32 copies of 16-bit gradients, or DeepSpeed's flat gradient copy of a group), where no activations are left "
                          "(activations 0).  None in plans written before 2026-12-03.")
    offloaded: float = Field(0.0, description="Bytes kept in host memory per GPU (optimizer offload).")
    by_stage: dict[str, float] | None = Field(
        None, description="Total bytes per GPU of each pipeline rank kind: 'first' (rank 0, with the embedding), "
                          "'middle' (the fullest middle rank, rank 1), 'last' (rank pp-1, with the head); "
                          "only the kinds the pipeline has.  `total` is the largest.")


class CommBytes(Strict):
    tp: float = 0.0
    pp: float = 0.0
    dp: float = 0.0
    cp: float = 0.0
    ep: float = 0.0


class TimeBreakdown(Strict):
    compute_s: float = Field(description="Matmul + attention + memory-bound kernels on the critical stage, all micro-batches.")
    tp_comm_s: float = Field(description="Exposed tensor-parallel communication.")
    pp_comm_s: float = Field(description="Exposed pipeline point-to-point time.")
    dp_comm_s: float = Field(description="Exposed data-parallel gradient/parameter communication.")
    cp_comm_s: float = Field(description="Exposed context-parallel K/V exchange.")
    ep_comm_s: float = Field(0.0, description="Exposed expert-parallel token all-to-all (a mixture of experts': dispatch "
                             "and combine, forward and backward).")
    bubble_s: float = Field(description="Pipeline fill/drain idle time.")
    attention_s: Optional[float] = Field(
        None, description="Of compute_s: the attention core (the fused kernel, or unfused attention's batched matmuls "
        "and softmax) forward, backward and recomputed, on the critical stage (training.attention_kernel times it). "
        "Absent in plans written before it was reported.")
    fp8_cast_s: Optional[float] = Field(
        None, description="Of compute_s, an FP8 plan's (training.fp8): the linears' quantization passes (amax and cast "
        "of inputs, weights and output gradients, cost_models.compute.fp8_cast_time) forward, backward and "
        "recomputed, on the critical stage. None for a 16-bit plan.")
    optimizer_s: float = Field(description="Optimizer step (memory-bound, or host for offload) plus the memory-bound gradient upcast/accumulation passes unless grad_accumulation_fusion, and with training.clip_grad the gradient-norm read and scaling pass.")


class Amdahl(Strict):
    parallel_fraction: float = Field(description="alpha such that the predicted step time = T1*((1-alpha)+alpha/n); "
                                     "0 where the layout is slower than one GPU's compute (speedup < 1).")
    speedup: float = Field(description="n x one GPU's compute time / the predicted step time for n GPUs: "
                           "1/((1-alpha)+alpha/n) where that is at least 1.")


class Accuracy(Strict):
    basis: str = Field(description="What the error was measured on: published runs (parplan validate) or launches.")
    runs: int
    median_abs_error: float = Field(description="Median |predicted/measured - 1| over those runs.")
    max_abs_error: Optional[float] = None


class Prediction(Strict):
    memory_bytes_per_gpu: MemoryBreakdown
    time_breakdown: Optional[TimeBreakdown] = None
    step_time_s: float
    tokens_per_s: float = Field(description="Whole-job tokens per second.")
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    hfu: float
    bubble_fraction: float
    comm_bytes_per_step: CommBytes = Field(description="Bytes sent per GPU per optimizer step, by axis.")
    amdahl: Amdahl
    fits: bool
    reason: Optional[str] = Field(None, description="Why it does not fit, when fits is false.")
    usable_memory_bytes: Optional[float] = Field(None, description="HBM capacity minus the profile's reserve.")
    days_to_train: Optional[float] = None
    gpu_hours_to_train: Optional[float] = None
    warnings: list[str] = Field(default_factory=list)
    accuracy: list[Accuracy] = Field(
        default_factory=list, description="How close predictions for this framework came to measured runs "
        "(planner/data/accuracy.json: published runs by framework; for parplan's runtime, single-H100 launches).")


class SearchInfo(Strict):
    candidates: int
    feasible: int
    seconds: float
    infeasible_by_reason: dict[str, int] = Field(default_factory=dict)
    unpriced: int = Field(0, description="Candidates a throughput search neither priced nor timed: their step-time "
                          "floor, a lower bound of their step, is past every contender's step, so none could rank "
                          "whether it fits or not (counted neither feasible nor infeasible).")
    objective: Objective = "throughput"


class Plan(Strict):
    schema_version: int = SCHEMA_VERSION
    model: ModelSpec
    hardware: HardwareRef
    training: Training
    parallel: Parallel
    prediction: Optional[Prediction] = None
    search: Optional[SearchInfo] = None
    alternatives: list["Plan"] = Field(default_factory=list)
    suggestions: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> "Plan":
        p, t, m = self.parallel, self.training, self.model
        if self.schema_version != SCHEMA_VERSION:
            raise ValueError(f"schema_version {self.schema_version}: this parplan reads plans of schema_version "
                             f"{SCHEMA_VERSION}; re-create the plan with this parplan (`parplan recommend ... --json`)")
        if p.world_size != self.hardware.gpus:
            raise ValueError(f"tp({p.tp}) * pp({p.pp}) * dp({p.dp}) * cp({p.cp}) = {p.world_size} != gpus({self.hardware.gpus})")
        if t.global_batch_size != p.dp * t.micro_batch_size * t.num_microbatches:
            raise ValueError(
                f"global_batch_size({t.global_batch_size}) != dp({p.dp}) * micro_batch_size({t.micro_batch_size}) * num_microbatches({t.num_microbatches})")
        if m.heads % p.tp or m.kv_heads % p.tp:
            raise ValueError(f"tp({p.tp}) must divide heads({m.heads}) and kv_heads({m.kv_heads})")
        if p.stage_layers is not None and sum(p.stage_layers) != m.layers:
            raise ValueError(f"stage_layers sum to {sum(p.stage_layers)}, the model has {m.layers} layers")
        problem = job_problem(m, t.seq_len, t.dtype, t.precision, "the model") or fp8_problem(t.fp8, t.framework,
                                                                                               t.precision)
        if problem:
            raise ValueError(problem)
        return self


def job_problem(model: ModelSpec, seq_len: int, dtype: str, precision: str, who: str | None = None) -> str | None:
    """What no layout of this model and job can train, in one line with the fix, or None: every plan reader refuses
    it (Plan) and `recommend` before its search.  A 16-bit recipe at dtype fp32 (--dtype takes bf16 or fp16; fp32
    training is the fp32 recipe: such a plan had been timed at the fp32 peak with its weights counted at 2 bytes); a
    sequence past a learned position table of max_seq_len rows.  `who`: the model as the message names it."""
    if dtype == "fp32" and precision != "fp32":
        return (f"dtype fp32 with precision {precision}: the 16-bit recipes compute in bf16 or fp16; use precision fp32 "
                "for fp32 training (dtype is then unused), or dtype bf16")
    if model.has_learned_positions and model.max_seq_len and seq_len > model.max_seq_len:
        return (f"seq_len({seq_len}) is beyond {who or model.name or 'the model'}'s {model.max_seq_len} learned "
                f"positions (max_seq_len); use seq_len {model.max_seq_len} or less, or a model.max_seq_len that "
                "extends the table")
    return None


# frameworks whose FP8 linears the cost model knows (TrainingConsts.fp8): Transformer Engine's, torchao's
FP8_FRAMEWORKS = {"megatron": "te", "torchtitan": "torchao", "parplan": "parplan"}


def fp8_problem(fp8: bool, framework: str, precision: str) -> str | None:
    """Why an FP8 plan cannot be made, in one line with the fix, or None."""
    if not fp8:
        return None
    if framework not in FP8_FRAMEWORKS:
        return (f"fp8 under framework {framework}: the {framework} framework's FP8 is not modelled; plan it for one "
                "that runs FP8 linears (--framework parplan: parplan launch runs them, megatron: Transformer Engine, or "
                "torchtitan: torchao's float8) and export it, or drop --fp8")
    if precision == "fp32":
        return "fp8 with precision fp32: FP8 linears belong to a 16-bit recipe; use precision master-weights, or drop --fp8"
    return None


def _bool_in(value):
    """true/false where a number belongs (pydantic's lax mode reads true as 1.0), in a table or a curve's points."""
    if isinstance(value, dict):
        for key, v in value.items():
            if isinstance(v, bool):
                raise ValueError(f"{key} = {str(v).lower()}: expected a number")
    elif isinstance(value, (list, tuple)):
        for i, point in enumerate(value):
            flags = [v for v in point if isinstance(v, bool)] if isinstance(point, (list, tuple)) else []
            if flags:
                raise ValueError(f"point {i + 1} of {len(value)} holds {str(flags[0]).lower()}: expected a number")
    return value


def _check_curve(curve: list[tuple[float, float]], field: str) -> list[tuple[float, float]]:
    """A profile's efficiency curve: at least one point, x > 0 strictly increasing, efficiency in (0, 1]."""
    x_name = "GEMM size (GFLOP)" if field == "matmul_efficiency_curve" else "sequence length"
    if not curve:
        example = "[[1.0, 0.3], [1000.0, 0.7]]" if field == "matmul_efficiency_curve" else "[[2048, 0.35], [8192, 0.5]]"
        raise ValueError(f"is empty; give at least one [{x_name}, efficiency] point, e.g. {field} = {example}")
    for i, (x, e) in enumerate(curve):
        point = f"point {i + 1} of {len(curve)} [{x:g}, {e:g}]"
        if x <= 0:
            raise ValueError(f"{point}: the {x_name} must be > 0 (the curve is interpolated in its log)"
                             if field == "matmul_efficiency_curve" else f"{point}: the {x_name} must be > 0")
        if not 0 < e <= 1:
            raise ValueError(f"{point}: the efficiency must be in (0, 1], a fraction of the peak")
        if i and x <= curve[i - 1][0]:
            raise ValueError(f"{point}: the points must be in strictly increasing {x_name} ({x:g} follows "
                             f"{curve[i - 1][0]:g}); sort them and drop repeated ones")
    return curve


# No number in a hardware profile comes near this in its field's unit (GB, GB/s, TFLOP/s, s, GFLOP, tokens): one that
# does is a unit slip, and 1e300 GB would overflow to inf bytes and print as Infinity in --json.
_PROFILE_NUMBER_MAX = 1e12


def _not_astronomical(value):
    """A profile field's value with every number in it at most _PROFILE_NUMBER_MAX."""
    if isinstance(value, dict):
        named = [(f"{k} = ", v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        named = [(f"point {i + 1} of {len(value)}: ", v) for i, point in enumerate(value)
                 for v in (point if isinstance(point, (list, tuple)) else [point])]
    else:
        named = [("", value)]
    for name, v in named:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) > _PROFILE_NUMBER_MAX:
            raise ValueError(f"{name}{v:g} is out of range (at most {_PROFILE_NUMBER_MAX:g} in the field's unit); "
                             "check the unit in the field's name")
    return value


class NetworkTier(Strict):
    model_config = ConfigDict(allow_inf_nan=False)  # inf/nan in a profile is a typo, never a bandwidth

    @field_validator("*")
    @classmethod
    def _in_range(cls, v):
        return _not_astronomical(v)

    gbytes_per_s: float = Field(gt=0, description="Unidirectional bandwidth per GPU, gigabytes per second.")
    latency_s: float = Field(ge=0, description="Per-message latency (alpha of the alpha-beta model), seconds.")
    efficiency: float = Field(gt=0, le=1, description="Achievable fraction of gbytes_per_s for large collectives (bus bandwidth / link bandwidth).")
    mesh_links: Optional[int] = Field(
        None, gt=0, description="A full mesh of this many equal links per GPU (AMD's xGMI) instead of a switch: a group "
        "of k ranks inside a node drives k - 1 of them, a point-to-point transfer one (gbytes_per_s is the sum over "
        "all).  None = a switch (NVSwitch): every group gets the full bandwidth.")
    aggregate_nics: Optional[bool] = Field(
        None, description="Inter-node tier only: a collective across nodes runs over the NICs of all its ranks on a "
        "node (NCCL's rings each leave the node through a different NIC, NVIDIA/nccl#412), so a group with k ranks "
        "a node moves at k x gbytes_per_s, up to the node's fabric.  False or unset = one NIC's bandwidth per rank, which "
        "fits the published Megatron (Selene, EOS) and DeepSpeed runs the profiles are fitted and checked on better "
        "(benchmarks/nic_aggregation.py scores both).  Not for the nvlink tier.")
    efficiency_by_group_size: Optional[list[tuple[int, float]]] = Field(
        None, description="nvlink tier only: the achievable fraction of gbytes_per_s by the size of a group inside "
        "the node, as [[k, efficiency], ...] with k >= 2 increasing: a group of n ranks takes the entry of the largest "
        "k at or below n (the first entry below it), a point-to-point transfer k = 2's.  For a node whose fabric "
        "does not give every group one rate: a PCIe tree, where 2-4 GPUs under one switch run faster than 8 across "
        "the host (the L40S profile).  None = `efficiency` for every group.")
    bridge_gbytes_per_s: Optional[float] = Field(
        None, gt=0, description="nvlink tier only: NVLink bridges join the node's GPUs in pairs (ranks 2i and 2i + 1) "
        "over a fabric without NVLink between the pairs (PCIe: the H100 PCIe profile), each bridge this many GB/s a "
        "direction: a group of exactly two consecutive ranks (tp 2; cp 2 or dp 2 where nothing lies inside them; pp "
        "2's sends where tp x cp is 1) runs at bridge_efficiency of it, every other group and pipeline send at the "
        "tier's own rate.  None = no bridges.")
    bridge_efficiency: Optional[float] = Field(
        None, gt=0, le=1, description="nvlink tier only, with bridge_gbytes_per_s: the achievable fraction of a "
        "bridge's bandwidth (a bridged pair's all-reduce bus bandwidth over it).")

    @field_validator("efficiency_by_group_size", mode="before")
    @classmethod
    def _group_points_numbers(cls, v):
        return _bool_in(v)

    @field_validator("efficiency_by_group_size")
    @classmethod
    def _group_sizes(cls, v):
        if v is None:
            return v
        if not v:
            raise ValueError("is empty; give [[group size, efficiency], ...] or leave it out")
        sizes = [k for k, _ in v]
        if sizes[0] < 2 or sizes != sorted(set(sizes)):
            raise ValueError(f"group sizes {sizes}: each at least 2, increasing, none twice")
        bad = [e for _, e in v if not 0 < e <= 1]
        if bad:
            raise ValueError(f"efficiency {bad[0]:g} is not in (0, 1]: a fraction of gbytes_per_s")
        return v


# a host field by recompute mode (host_block_s and its kin): seconds, or the forward's share
ByRecompute = dict[Literal["none", "selective", "full", "selective-op"], float]


class HardwareProfile(Strict):
    """One GPU system. Units are in field names; the cost model converts them once (HardwareConstants)."""

    model_config = ConfigDict(allow_inf_nan=False)  # inf/nan would reach the JSON output as Infinity/NaN

    @field_validator("peak_dense_tflops", "host_block_s", "host_block_fp8_s", "host_block_eager_s", "host_moe_block_s",
                     "host_moe_expert_s", "host_forward_share",
                     "matmul_efficiency_curve", "attention_efficiency_curve", mode="before")
    @classmethod
    def _no_booleans_inside(cls, v):
        return _bool_in(v)

    @field_validator("nvlink")
    @classmethod
    def _nvlink_pools_nothing(cls, v):
        if v.aggregate_nics is not None:
            raise ValueError("aggregate_nics is set under [nvlink]; it belongs under [inter_node] (whether a "
                             "collective across nodes pools the NICs of its ranks on a node)")
        if v.efficiency_by_group_size is not None and v.mesh_links is not None:
            raise ValueError("efficiency_by_group_size and mesh_links are both set under [nvlink]: a mesh's rate by "
                             "group size is its links'; give one of the two")
        if (v.bridge_gbytes_per_s is None) != (v.bridge_efficiency is None):
            raise ValueError("bridge_gbytes_per_s and bridge_efficiency go together under [nvlink] (a bridge's "
                             "bandwidth and the fraction of it a bridged pair reaches); give both or neither")
        return v

    @field_validator("inter_node")
    @classmethod
    def _inter_node_by_size(cls, v):
        if v.efficiency_by_group_size is not None:
            raise ValueError("efficiency_by_group_size is set under [inter_node]; it belongs under [nvlink] (the rate "
                             "of a group inside a node by its size)")
        if v.bridge_gbytes_per_s is not None or v.bridge_efficiency is not None:
            raise ValueError("bridge_gbytes_per_s is set under [inter_node]; it belongs under [nvlink] (NVLink bridges "
                             "between pairs of a node's GPUs)")
        return v

    @field_validator("peak_dense_tflops")
    @classmethod
    def _peaks_positive(cls, v):
        if not v:
            raise ValueError("is empty; give the peak dense TFLOP/s of at least the dtype you train in, "
                             "e.g. peak_dense_tflops = { bf16 = 989.4 }")
        for dtype, tflops in v.items():
            if tflops <= 0:
                raise ValueError(f"{dtype} = {tflops:g}: a peak TFLOP/s must be > 0 (the datasheet's dense figure)")
        return v

    @field_validator("*")
    @classmethod
    def _in_range(cls, v):
        return _not_astronomical(v)

    @field_validator("matmul_efficiency_curve", "attention_efficiency_curve")
    @classmethod
    def _curve_valid(cls, v, info):
        return _check_curve(v, info.field_name)

    @field_validator("host_block_s", "host_block_fp8_s", "host_block_eager_s", "host_moe_block_s", "host_moe_expert_s")
    @classmethod
    def _host_seconds_not_negative(cls, v):
        for mode, s in v.items():
            if s < 0:
                raise ValueError(f"{mode} = {s:g}: host seconds per block must be >= 0 (0 or absent = not measured)")
        return v

    @field_validator("host_forward_share")
    @classmethod
    def _share_in_unit_interval(cls, v):
        for mode, s in v.items():
            if not 0 <= s < 1:
                raise ValueError(f"{mode} = {s:g}: the forward's share of a block's host dispatch must be in [0, 1) "
                                 "(0 or absent = not measured)")
        return v

    name: str = Field(description="Profile name, e.g. h100-sxm-80gb.")
    description: str = Field("", description="Human-readable system description.")
    sources: list[str] = Field(default_factory=list, description="Datasheets, papers and measurements behind the numbers.")
    measured: Optional[str] = Field(None, description="For measured profiles: date, device and tool that measured it.")
    peak_dense_tflops: dict[str, float] = Field(description="Peak dense matmul TFLOP/s by dtype (bf16, fp16, fp32, tf32).")
    matmul_efficiency_curve: list[tuple[float, float]] = Field(
        description="(GEMM size in GFLOP, achieved fraction of peak) points, interpolated in log(GFLOP); clamped at the ends.")
    attention_efficiency_curve: list[tuple[float, float]] = Field(
        description="(sequence length, achieved fraction of peak) of fused causal attention fwd+bwd, causal FLOPs counted as half.")
    flash_attention_2_tflops: Optional[float] = Field(
        None, gt=0, description="FlashAttention-2's published best forward + backward TFLOP/s on this GPU (Dao 2023, "
        "sec. 4.1: 335 on H100 without Hopper's TMA and wgmma instructions; on A100 204.6, from its 73 % forward and 63 % "
        "backward bests): the ceiling of an attention "
        "kernel of that generation, used by training.attention_kernel triton-2022; absent = not published.")
    fp8_matmul_scale: float = Field(
        1.0, gt=0, le=2, description="An FP8 (E4M3) GEMM's best fraction of the fp8 peak over a 16-bit GEMM's best "
        "fraction of its peak on this GPU, measured (stas00/ml-engineering's maximum achievable matmul FLOPS table: "
        "H100 SXM 70.9 % against 80.3 %): multiplies the matmul curve's efficiency for the FP8 linears of a "
        "training.fp8 plan (cost_models.compute.linear_gemm_time); 1.0 = not measured.")
    sustained_matmul_fraction: float = Field(
        1.0, gt=0, le=1, description="Fraction of the isolated-kernel matmul/attention throughput (the curves) sustained over a long "
        "multi-GPU training run (clocks under the power cap, launch gaps). The one parameter a profile may fit to published "
        "training runs; 1.0 = not fitted.")
    host_block_s: ByRecompute = Field(
        default_factory=dict, description="Host (CPU) seconds to dispatch one transformer block's forward + backward of parplan's "
        "runtime, by recompute mode (selective-op, if absent, takes full's); a block takes max(GPU time, host time), so small blocks are launch-bound. Measured by "
        "`parplan calibrate` on the machine (it depends on the CPU, torch and the runtime, not the GPU); empty = not measured, "
        "no host bound.")
    host_block_fp8_s: ByRecompute = Field(
        default_factory=dict, description="host_block_s for a block whose linears run in FP8 (a training.fp8 plan under "
        "framework parplan: parallel_layers.fp8's casts and GEMMs dispatch more kernels, outside the compiled block "
        "graphs), by recompute mode (selective-op, if absent, takes full's). Measured by `parplan calibrate` on GPUs with "
        "FP8 tensor cores (none and full); empty = not measured: such a plan takes host_block_s.")
    host_block_eager_s: ByRecompute = Field(
        default_factory=dict, description="host_block_s for a dense block that parplan's runtime runs uncompiled: the "
        "dense blocks of a mixture of experts (whose model runs eagerly) and every block of a plan with "
        "fused_elementwise false (launch compiles nothing then).  By recompute mode (selective, if absent, takes "
        "none's; selective-op full's).  Measured by `parplan calibrate` (the probe with compilation off, none and "
        "full); empty = not measured: such blocks take host_block_s.")
    host_moe_block_s: ByRecompute = Field(
        default_factory=dict, description="Host seconds to dispatch one block of a mixture of experts in parplan's runtime "
        "(which runs such a model's blocks eagerly: their token counts are data-dependent), forward + backward, less "
        "its experts' part (host_moe_expert_s a local expert): a block's dispatch is host_moe_block_s + local experts x "
        "host_moe_expert_s (a dense block of such a model takes host_block_eager_s).  By recompute mode (selective, if "
        "absent, takes none's; selective-op full's).  Measured by `parplan calibrate` on a GPU (the probe as a "
        "mixture of experts of 4 and of 16 experts, top 2, balanced routing: the line through the two); empty = not "
        "measured: such a plan's blocks take host_block_s (the compiled dense block's).")
    host_moe_expert_s: ByRecompute = Field(
        default_factory=dict, description="Host seconds a local expert adds to an MoE block's dispatch in parplan's "
        "runtime (its GEMMs and their gathers, forward + backward): host_moe_block_s's slope; measured with it.")
    host_forward_share: ByRecompute = Field(
        default_factory=dict, description="The forward's share of host_block_s, by recompute mode (selective-op, if absent, "
        "takes full's): the GPU cannot run a micro-batch's backward before the host has dispatched its forward, so a "
        "step whose forward is launch-bound and backward GPU-bound takes longer than max(GPU, host) (a two-stage flow "
        "shop). Measured by `parplan calibrate` (its host-dispatch probe) and `--from-run` (launch reports that carry the "
        "forward's dispatch time); empty = not measured, no such bound.")
    optimizer_bandwidth_fraction: float = Field(
        1.0, gt=0, le=1, description="Fraction of the streaming bandwidth (hbm_gbytes_per_s x hbm_efficiency) the optimizer "
        "step's passes reach (fused AdamW, master copy-back). Fitted by `parplan calibrate --from-run` from the reports' "
        "after-backward phase; 1.0 = not fitted.")
    optimizer_host_per_tensor_s: float = Field(
        0.0, ge=0, description="Host seconds per parameter tensor that the optimizer step of parplan's runtime spends "
        "beside its kernels (per-tensor Python loops, the fused AdamW's tensor grouping), added to the step. Fitted with "
        "optimizer_bandwidth_fraction from the reports' after-backward phase; 0 = not fitted.")
    overlap_compute_slowdown: float = Field(
        0.0, ge=0.0, le=1.0, description="Fractional slowdown of compute kernels while a collective runs beside them "
        "(NCCL kernels take SMs and HBM bandwidth): overlapped communication C beside compute X costs max(C, X + C k/(1+k)) "
        "instead of max(C, X). 0 = perfect overlap.")
    hbm_gbytes: float = Field(gt=0, description="HBM capacity per GPU, GB (1e9 bytes).")
    hbm_gbytes_per_s: float = Field(gt=0, description="HBM bandwidth per GPU, datasheet, GB/s.")
    hbm_efficiency: float = Field(gt=0, le=1, description="Achievable fraction of HBM bandwidth for streaming kernels.")
    memory_reserve_gbytes: float = Field(ge=0, description="HBM not available to tensors: CUDA context, communicator buffers, allocator slack.")
    memory_slack_gbytes: Optional[float] = Field(
        None, allow_inf_nan=False, description="The part of memory_reserve_gbytes that `calibrate --from-run` fitted: the "
        "median reserved-minus-predicted gap of the launches (negative where the model over-predicted them). A later "
        "refit replaces it rather than adding to it. None = not fitted (a refit before 2026-11-29 folded its gap into "
        "the reserve without recording it).")
    gpus_per_node: int = Field(gt=0, description="GPUs per node (NVLink/xGMI domain).")
    nvlink: NetworkTier = Field(description="Intra-node tier.")
    inter_node: NetworkTier = Field(description="Inter-node tier (InfiniBand / RoCE), per GPU.")
    host_memory_gbytes_per_node: float = Field(gt=0, description="CPU DRAM per node, GB.")
    host_link_gbytes_per_s: float = Field(gt=0, description="Host<->device bandwidth per GPU per direction (PCIe/C2C), GB/s.")
    host_memory_gbytes_per_s_per_node: float = Field(gt=0, description="CPU DRAM bandwidth per node, GB/s (bounds a host-side optimizer step).")

    @model_validator(mode="after")
    def _reserve_leaves_memory(self):
        if self.memory_reserve_gbytes >= self.hbm_gbytes:
            raise ValueError(f"memory_reserve_gbytes ({self.memory_reserve_gbytes:g}) must be below hbm_gbytes "
                             f"({self.hbm_gbytes:g}): it is the part of the HBM tensors cannot use")
        if self.memory_slack_gbytes is not None and self.memory_slack_gbytes > self.memory_reserve_gbytes:
            raise ValueError(f"memory_slack_gbytes ({self.memory_slack_gbytes:g}) must not exceed memory_reserve_gbytes "
                             f"({self.memory_reserve_gbytes:g}): it is the fitted part of that reserve")
        return self
