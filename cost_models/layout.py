"""The inputs of one evaluation: model dimensions (scalars) and layouts (scalars or numpy arrays).

Categorical axes are small integer codes so that a whole search space is a handful of numpy
arrays.  Every cost function takes a ``Layout`` whose fields are all scalars (one plan) or all
arrays of the same length (a search); the arithmetic is the same for both.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Optional

import numpy as np

from .params import Mla, is_moe_block, moe_block_count

RECOMPUTE = ("none", "selective", "full", "selective-op")
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb", "zbv")
OFFLOADS = ("none", "optimizer")
REC_NONE, REC_SELECTIVE, REC_FULL, REC_SELECTIVE_OP = 0, 1, 2, 3
SCH_GPIPE, SCH_1F1B, SCH_INTERLEAVED, SCH_INTERLEAVED_ZB, SCH_ZBV = 0, 1, 2, 3, 4

# Mixed-precision recipes: bytes per parameter of each model state (Rajbhandari et al. 2020,
# ZeRO, sec. 3.1: 2+2+12 = 16 B/param for fp16 Adam; Megatron keeps fp32 main grads: 18 B).
#   weight  : the parameter tensor the model holds
#   grad    : the gradient buffer (accumulated over micro-batches)
#   master  : fp32 copy of the weights kept by the optimizer (0 when weights are fp32)
#   adam    : Adam exp_avg + exp_avg_sq (fp32)
#   cast    : 16-bit copy of the weights made per forward by autocast (amp only)
PRECISION_RECIPES = {
    "amp": {"weight": 4, "grad": 4, "master": 0, "adam": 8, "cast": 2},
    "master-weights": {"weight": 2, "grad": 4, "master": 4, "adam": 8, "cast": 0},
    "master-weights-half-grads": {"weight": 2, "grad": 2, "master": 4, "adam": 8, "cast": 0},
    "fp32": {"weight": 4, "grad": 4, "master": 0, "adam": 8, "cast": 0},
}


@dataclass(frozen=True)
class ModelDims:
    arch: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied: bool
    seq_len: int
    positions: int  # learned position rows (gpt), 0 for rotary
    # sliding-window attention as the framework trains it (planner.core.model_dims): `windowed_layers` of the layers
    # attend to at most `window` keys; 0 = full causal attention everywhere (also where the window is not applied)
    window: int = 0
    windowed_layers: int = 0
    # packed documents as the framework trains them (Training.document_length; planner.core.model_dims): each
    # sequence holds documents of `document` tokens (the last one shorter where it does not divide), each attending
    # only within itself; 0 = one document a sequence
    document: int = 0
    # chunked attention as the framework trains it (ModelSpec.attention_chunk: Llama 4's): `chunked_layers` of the
    # layers attend within fixed chunks of `chunk` tokens; 0 = none (also where the chunks are not applied)
    chunk: int = 0
    chunked_layers: int = 0
    # a mixture of experts (ModelSpec.experts): `experts` routed SwiGLU experts of `expert_ffn` a block, `top_k` of them
    # a token; then `ffn` is the width a token runs, top_k x expert_ffn (its FLOPs and saved activations are a dense
    # MLP's of that width), and the parameters are experts x expert_ffn wide (moe_* below).  0: a dense MLP
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    # the shared expert's width (ModelSpec.shared_expert_ffn): a dense, tensor-parallel SwiGLU every token runs, part
    # of `ffn` (top_k x expert_ffn + shared_ffn); 0: none
    shared_ffn: int = 0
    # dense blocks between the MoE ones (ModelSpec.first_dense_layers, moe_layer_step, dense_ffn_hidden): the leading
    # `first_dense` blocks and, past them, all but every `moe_step`-th run a dense SwiGLU of `dense_ffn`; each field
    # above describes an MoE block, and dense_dims() a dense one.  0 / 1: every block is an MoE block
    first_dense: int = 0
    moe_step: int = 1
    dense_ffn: int = 0
    # multi-head latent attention (ModelSpec.kv_lora_rank; params.Mla): the latents' widths, the rotary part of
    # head_dim (a query/key head's whole width) and a value head's width.  kv_lora 0: ordinary attention
    q_lora: int = 0
    kv_lora: int = 0
    rope: int = 0
    v_dim: int = 0
    # multi-head latent attention as parplan's runtime runs it (planner.core.model_dims: framework parplan;
    # parallel_layers.model.MLAttention): the values zero-padded to head_dim for the fused kernel (its QK^T and values'
    # product both at head_dim: core_width) and its own saved tensors (memory.activation_bytes_per_layer)
    v_padded: bool = False
    # multi-head latent attention as torchtitan's deepseek_v3 runs it (planner.core.model_dims: framework torchtitan;
    # apply_non_moe_tp: the attention's input all-gathered over the sequence, Shard(1) -> Replicate, before wq_a /
    # wkv_a, which run replicated, NoParallel): the down projections on the whole sequence on every tensor-parallel
    # rank (compute.layer_gemms) and the block input's collective, h a token, in place of the latents'
    # (total.block_comm); the latents are whole there either way (memory.activation_bytes_per_layer)
    mla_input_gathered: bool = False
    # a mixture of experts' layer as torchtitan's runs it (planner.core.model_dims: framework torchtitan;
    # torchtitan/models/moe/moe.py, 0.2.2): its own saved tensors (moe.titan_saved_bytes) and memory-bound passes
    # (moe.titan_elementwise_time) in place of Megatron-Core's; and its models' attention, which from 0.2 (the first
    # torchtitan with expert parallelism) passes SDPA enable_gqa where 0.1's llama repeated K and V to the query heads
    # (the eager terms of memory.activation_bytes_per_layer and compute.layer_elementwise_time)
    titan_moe: bool = False
    # multi-token prediction (ModelSpec.mtp_layers): extra depths on the rank holding the head, each one more block
    # (an MoE block in a mixture of experts), a 2h -> h projection and the head again (model_rank_block_counts)
    mtp: int = 0
    # RMSNorms on the queries and keys before rotary (ModelSpec.qk_norm; every framework trains them, parplan's runtime
    # too: parallel_layers.model.Attention); their saved inputs and statistics
    # (memory.activation_bytes_per_layer) and their memory-bound pass (compute.layer_elementwise_time)
    qk_norm: bool = False
    # ...run inside selective recompute's attention checkpoint (parplan's runtime: parallel_layers.model.Attention), which
    # then keeps the projections' outputs as it does without them and re-runs the norms in the backward; Megatron-Core
    # runs them before its core-attention checkpoint, which keeps their outputs (planner.core.model_dims)
    qk_norm_recomputed: bool = False
    # ...each over a token's whole query / key width, one statistic a token, not each head (ModelSpec.qk_norm_whole: OLMo 2,
    # MiniMax-M2): statistics a token (memory) and, over tensor-parallel ranks, their all-reduces (total.block_comm)
    qk_norm_whole: bool = False
    # q/k/v projection biases of llama-arch blocks (ModelSpec.qkv_bias: Qwen2): their parameters, split over tp with the
    # projections (memory.layer_params_per_gpu), and their gradients' sum over the tokens (compute.layer_elementwise_time)
    qkv_bias: bool = False
    # attention and MLP side by side on one norm (ModelSpec.parallel_block: GPT-J, Command R), as the framework trains
    # them (planner.core.model_dims: parplan's runtime only): one norm's parameters, input and output saved
    # (memory), one norm's pass (compute), one tensor-parallel collective a direction (total.block_comm)
    parallel_block: bool = False
    # a norm on each sublayer's output before its residual add (ModelSpec.post_norms: Gemma 2 / 3, GLM-4; every
    # framework trains them, parplan's runtime too: parallel_layers.model.Block); their
    # saved inputs and statistics (memory.activation_bytes_per_layer) and their pass (compute.layer_elementwise_time)
    post_norms: bool = False
    # a plan's own pipeline split (Parallel.stage_layers: the blocks of each virtual stage, in virtual-stage order,
    # multi-token prediction's depths not among them): every per-rank count reads it (model_split_sizes); () = the
    # default split (model_stage_layers), which the search plans.  planner.core.evaluate_plan sets it for one plan
    split: tuple = ()

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def mixed(self) -> bool:
        """A mixture of experts with dense blocks between its MoE ones (dense_dims)."""
        return self.moe and (self.first_dense > 0 or self.moe_step > 1)

    def is_moe_block(self, i: int) -> bool:
        """Whether block i (from 0) is an MoE block (ModelSpec.is_moe_block's rule)."""
        return self.moe and is_moe_block(i, self.first_dense, self.moe_step)

    @property
    def moe_blocks(self) -> int:
        """MoE blocks of the model (ModelSpec.moe_block_count; every block of a model without dense ones between)."""
        if not self.mixed:
            return self.layers if self.moe else 0
        return moe_block_count(self.layers, self.first_dense, self.moe_step)

    def dense_dims(self) -> "ModelDims":
        """A dense block of a mixed model, as a model of such blocks: its attention, a dense SwiGLU of dense_ffn."""
        return replace(self, experts=0, top_k=0, expert_ffn=0, shared_ffn=0, ffn=self.dense_ffn, first_dense=0,
                       moe_step=1, dense_ffn=0)

    @property
    def routed_ffn(self) -> int:
        """Of ffn, the width of a token's routed experts (top_k x expert_ffn)."""
        return self.top_k * self.expert_ffn

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def mla(self) -> Optional[Mla]:
        """Multi-head latent attention's widths, or None for ordinary attention."""
        if not self.kv_lora:
            return None
        return Mla(q_lora=self.q_lora, kv_lora=self.kv_lora, rope=self.rope, v_dim=self.v_dim)

    @property
    def kv_width(self) -> int:
        """A token's key (or value) width on the attention core's input.  Multi-head latent attention's keys are
        heads x head_dim and its values heads x v_dim: the mean of the two, so that 2 kv_width is both (what the
        saved activations, context parallelism's exchange and the elementwise passes count)."""
        if self.kv_lora:
            return self.heads * (self.head_dim + self.v_dim) // 2
        return self.kv_heads * self.head_dim

    @property
    def o_width(self) -> int:
        """The attention core's output a token, the output projection's input: q_width, or heads x v_dim with
        multi-head latent attention."""
        return self.heads * self.v_dim if self.kv_lora else self.q_width

    @property
    def core_width(self) -> int:
        """The width the attention kernel's FLOPs scale with: attn_width, or q_width where the values are padded to
        head_dim (v_padded)."""
        return self.q_width if self.v_padded else self.attn_width

    @property
    def attn_width(self) -> int:
        """The width the attention core's FLOPs scale with (ModelSpec.attention_width): q_width, or the mean of the
        query/key and value widths with multi-head latent attention (QK^T at one, the values' product at the other)."""
        return (self.q_width + self.o_width) // 2

    def _segments(self, chunked: bool = False) -> list[tuple[int, int]]:
        """(length, count) of the stretches of a sequence whose tokens attend among themselves: its packed documents
        (ModelDims.document; the last one shorter where it does not divide), cut again at the chunks' edges in a
        chunked layer (ModelDims.chunk); the whole sequence where neither applies."""
        s = self.seq_len
        sizes = [d for d in (self.document, self.chunk if chunked else 0) if d and d < s]
        if not sizes:
            return [(s, 1)]
        if len(sizes) == 1 or max(sizes) % min(sizes) == 0:
            d = min(sizes)
            return [(d, s // d)] + ([(s % d, 1)] if s % d else [])
        edges = sorted({0, s} | {e for d in sizes for e in range(d, s, d)})
        counts: dict[int, int] = {}
        for a, b in zip(edges, edges[1:]):
            counts[b - a] = counts.get(b - a, 0) + 1
        return sorted(counts.items())

    def _layer_mean(self, full: float, local: float) -> float:
        """full layers' and local (windowed or chunked) layers' values, averaged over the layers."""
        n = self.windowed_layers or self.chunked_layers
        return ((self.layers - n) * full + n * local) / self.layers

    def attention_span(self) -> float:
        """Keys per query, averaged over the layers, in the MFU convention (no causal discount: a full layer counts
        seq_len, a windowed one min(seq_len, window); within packed documents, ModelDims.document, or chunks,
        ModelDims.chunk, each query its stretch's length, or the window where shorter): what 12 L h s's s becomes."""
        s = self.seq_len
        w = self.window if self.window and self.windowed_layers else s
        full = sum(n * L * L for L, n in self._segments()) / s
        local = sum(n * L * min(L, w) for L, n in self._segments(chunked=bool(self.chunked_layers))) / s
        return self._layer_mean(full, local)

    def causal_pairs_fraction(self) -> float:
        """Attended (query, key) pairs, averaged over the layers, as a fraction of full causal attention's s^2 / 2
        (a flash kernel skips the tiles outside the band): a windowed layer's s w - w^2 / 2 for s > w, the same
        continuous count that gives s^2 / 2 for the full one; within packed documents (ModelDims.document) or chunks
        (ModelDims.chunk) each stretch's own, L^2 / 2 or L w - w^2 / 2, summed."""
        s, w = self.seq_len, self.window if self.windowed_layers else 0
        chunked = bool(self.chunked_layers and self.chunk and self.chunk < s)
        if not (self.document and self.document < s) and not chunked and (not w or w >= s):
            return 1.0

        def pairs(L, w):
            return L * w - w * w / 2 if w and w < L else L * L / 2
        full = sum(n * pairs(L, 0) for L, n in self._segments()) / (s * s / 2)
        local = sum(n * pairs(L, w) for L, n in self._segments(chunked=chunked)) / (s * s / 2)
        return self._layer_mean(full, local)

    @classmethod
    def from_spec(cls, spec, seq_len: int) -> "ModelDims":
        k = spec.experts_per_token or 0
        shared = spec.shared_expert_ffn or 0
        return cls(arch=spec.arch, layers=spec.layers, hidden=spec.hidden, heads=spec.heads,
                   kv_heads=spec.kv_heads, head_dim=spec.head_dim or spec.hidden // spec.heads,
                   ffn=spec.ffn_hidden * (k or 1) + shared, vocab=spec.vocab, tied=spec.tied_embeddings, seq_len=seq_len,
                   positions=(spec.max_seq_len or seq_len) if spec.has_learned_positions else 0,
                   window=spec.sliding_window or 0, windowed_layers=spec.windowed_layers,
                   chunk=spec.attention_chunk or 0, chunked_layers=spec.chunked_layers,
                   experts=spec.experts or 0, top_k=k, expert_ffn=spec.ffn_hidden if k else 0, shared_ffn=shared,
                   first_dense=spec.first_dense_layers or 0, moe_step=spec.moe_layer_step or 1,
                   dense_ffn=spec.dense_ffn_hidden or 0, q_lora=spec.q_lora_rank or 0, kv_lora=spec.kv_lora_rank or 0,
                   rope=spec.qk_rope_head_dim or 0, v_dim=spec.v_head_dim or 0, mtp=spec.mtp_layers or 0,
                   qk_norm=bool(spec.qk_norm), qk_norm_whole=bool(spec.qk_norm and spec.qk_norm_whole),
                   qkv_bias=bool(spec.qkv_bias), parallel_block=bool(spec.parallel_block),
                   post_norms=bool(spec.post_norms))


@dataclass(frozen=True)
class TrainingConsts:
    global_batch_size: int
    dtype: str
    precision: str
    flash_attention: bool
    overlap_grad_reduce: bool
    overlap_tp_comm: bool
    # ZeRO-1/2's gather of the stepped parameters overlapped with the next forward (Megatron-LM's
    # --overlap-param-gather); None: as overlap_grad_reduce (compute.plan_overlaps_param_gather's rule)
    overlap_param_gather: Optional[bool] = None
    dropout: bool = False
    zero1_all_reduce: bool = True
    zero2_each_microbatch: bool = False  # ZeRO-2 gradients sharded as produced (reduce-scatter per micro-batch)
    # ZeRO-3 is PyTorch FSDP2 (parplan's runtime, torchtitan), not DeepSpeed's stage 3:
    #  - with a master-weights recipe the fp32 shard *is* the master (MixedPrecisionPolicy computes in
    #    16 bit from it): no separate 16-bit shard;
    #  - each stage module is an FSDP root, whose parameters (embedding, head) stay unsharded from the
    #    forward to the backward (fully_shard: reshard_after_forward defaults to False for the root);
    #  - gradients reach the reduce-scatter as one unit's unsharded buffer in the reduce dtype, not
    #    through DDP buckets;
    #  - inside torch.distributed.pipelining (PipelineStage.backward_maybe_with_nosync) parameters and
    #    gradients stay unsharded from a stage's first backward to the end of the step: ZeRO-3 with
    #    pp > 1 holds full weights and gradients, gathers once and reduce-scatters once per step.
    # Measured on CPU (tests/test_runtime_memory.py, the CPU allocator through the profiler).
    zero3_fsdp2: bool = True
    # FSDP2 copies each all-gather's output into the unsharded parameters on the compute stream
    # (FSDPParamGroup.wait_for_unshard -> foreach_all_gather_copy_out's split_with_sizes_copy); FSDP1 gathers
    # straight into its flat parameter's unsharded storage (the `fsdp` framework: no copy)
    zero3_gather_copy_out: bool = True
    # DeepSpeed's stage 3 gathers weight by weight and prefetches one weight ahead (cost_models/zero3.py):
    # its gathers hide behind one weight's compute, not a whole block's, and it holds two weights gathered
    zero3_one_weight_ahead: bool = False
    # torch's DDP without gradient_as_bucket_view (torchtitan's replicate(bucket_cap_mb=100), Composer's and
    # Accelerate's DistributedDataParallel) allocates its buckets once, for every gradient, and copies each gradient
    # into them: a second copy of the rank's gradients for the whole run (2 CPU gloo ranks, 2026-12-02: 8 fp32
    # 1024 x 1024 linears peaked at 100.7 MB, params + gradients + 33.5 MB, and at 71.5 MB with the view on).
    # Megatron's DDP and parplan's runtime keep no such copy (their gradients are the buffer, or a bucket's flat
    # copy is made and freed per bucket: memory._other_bytes)
    ddp_bucket_copy: bool = False
    # parplan's runtime packs the gradients of ZeRO-0/1's all-reduce into flat buckets of at most 25 MiB, a copy made
    # and freed per bucket (parallel_layers.data_parallel.all_reduce_bucketed; memory._other_bytes counts two).
    # Megatron's DDP keeps the gradients in its contiguous grad buffer, whose buckets are views reduced in place
    # (param_and_grad_buffer): no copy; torch DDP's and DeepSpeed's buckets are ddp_bucket_copy's and
    # ds_reduce_bucket_elements'
    flat_grad_buckets: bool = True
    # torchtitan's train_step runs each micro-batch's loss.backward() with no no_sync (torchtitan/train.py), so its DDP
    # all-reduces every micro-batch (Composer and Accelerate skip the sync until the last)
    ddp_reduces_each_microbatch: bool = False
    # DeepSpeed's ZeRO gradient buckets with contiguous_gradients (its default, and the export's), reduce_bucket_size
    # elements each in the model's 16-bit dtype whatever the model's size (0: not DeepSpeed; memory.
    # deepspeed_grad_buckets)
    ds_reduce_bucket_elements: float = 0.0
    # DeepSpeed's ZeRO optimizer steps its gradient partition one group at a time through a flat copy of the group
    # (memory.step_grad_copy_bytes); at ZeRO-3 a group is a sub-group of about sub_group_size elements: this (1e9,
    # DeepSpeed's default, and what planner.export writes).  0: not DeepSpeed
    ds_step_sub_group_elements: float = 0.0
    # DeepSpeed's optimizer offload accumulates the rank's gradient partition across micro-batches in a host
    # buffer of the parameters' dtype, through the GPU (up, add on the GPU, back down), and keeps the partition's
    # fp32 gradient on the host beside its Adam states: timed in cost_models.total (per-micro-batch copies), held
    # in memory.model_state_coefficients (offloaded).  Megatron's and parplan's offloaded optimizers take the
    # gradients off the GPU once a step; FSDP2's CPUOffloadPolicy is fsdp2_offload's.
    offload_grads_via_host: bool = False
    # torch.distributed.pipelining allocates, per stage and per micro-batch, a receive buffer for the
    # stage's input activation (all stages but the first) and one for its output gradient (all but
    # the last), once, and keeps them (PipelineStage's args_recv_info / grad_recv_info); counted
    # per micro-batch on the CPU allocator trace (tests/test_runtime_memory.py).  torchtitan runs it
    # so.  Megatron and DeepSpeed allocate per transfer, and so does parplan's runtime since
    # parallel_layers.pipeline.just_in_time_receives: a received activation is then the stage input
    # that the block's saved activations already count, for the micro-batches in flight only.
    p2p_buffers_per_microbatch: bool = True
    # torch.distributed.pipelining's action-list runtime (_PipelineScheduleRuntime: interleaved 1F1B and
    # the zero-bubble schedules) waits on its sends only when the step ends, so every tensor it sent (a
    # stage's output, the gradient of its input) stays allocated until then, after its backward would
    # have freed it (tests/test_runtime_memory.py's CPU trace: 7 held input gradients on rank 1 of pp 4 x
    # vpp 2 x 8 micro-batches, as counted in memory.rank_inflight's held()).  Megatron waits on each transfer.
    # Measured with gloo; NCCL stashes a sent tensor until wait() as well, but its watchdog may release
    # completed sends earlier (pytorch/pytorch#148590), so on CUDA this is an upper bound (unmeasured).
    p2p_sends_held_to_step_end: bool = False
    # ...except a stage output's send, which parplan's runtime waits on and lets go right after that
    # micro-batch's backward under the looped schedules (parallel_layers.pipeline.release_output_sends)
    p2p_output_sends_released: bool = False
    # torch.distributed.pipelining's Schedule1F1B (parplan's runtime, torchtitan) refuses fewer micro-batches
    # than pipeline stages ("Number of microbatches must be greater than or equal to the number of stages",
    # torch 2.11 and 2.13); Megatron's and DeepSpeed's 1F1B warm up with min(p - r - 1, m) and run any m
    torch_1f1b_needs_m_ge_p: bool = False
    # torch's ScheduleInterleaved1F1B runs m in max(1, m // p) rounds and needs m a multiple of them ("must be
    # a multiple of the number of rounds"): any m below 2p, and 9 of pp 4 not; Megatron-LM needs m a multiple
    # of p (memory.round_size)
    interleaved_torch_rounds: bool = False
    # sequence parallelism: the all-gathered input of the column-parallel matmuls is saved for their
    # backward (torch's DTensor SP: torchtitan), not gathered again in the backward (Megatron and
    # parplan's runtime, under the zero-bubble schedules in the weight-gradient pass)
    sp_saves_gathered_input: bool = False
    # all-gather context parallelism (parplan's runtime): the gathered keys and values are saved for the
    # attention's backward (memory.activation_bytes_per_layer); ring attention (Megatron, torch) passes
    # them again instead
    cp_saves_gathered_kv: bool = False
    grad_accumulation_fusion: bool = False
    # that fusion also into a 16-bit main_grad (master-weights-half-grads): Megatron-LM's linears add the weight
    # gradient into main_grad in its own dtype (fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp16 beside _fp32,
    # megatron/core/tensor_parallel/layers.py; the grad buffer is 16-bit under --grad-reduce-in-bf16, Megatron-Bridge's
    # grad_reduce_in_fp32 False); parplan's runtime fuses into an fp32 main_grad only (precision.wgrad_fusion_kernel)
    wgrad_fusion_16bit_grads: bool = False
    p2p_scatter_gather: bool = False
    # DeepSpeed's pipeline engine (TrainSchedule; deepspeed/runtime/pipe/engine.py) runs each send and
    # receive as its own blocking p2p.send / p2p.recv, two before every forward or backward step, so a
    # micro-batch waits for four transfers in turn; Megatron and torch.distributed.pipelining pair a
    # send with the opposite receive in one batched call (batch_isend_irecv): two
    p2p_blocking_transfers: bool = False
    attention_kernel: str = "profile"  # Training.attention_kernel: profile (measured curve) or triton-2022
    # a mixture of experts' token dispatcher (Training.moe_dispatcher): NCCL's all-to-all or DeepEP's (moe.all_to_all)
    moe_dispatcher: str = "alltoall"
    # under tensor parallelism the MoE layer's input is all-gathered over the sequence and its output reduce-scattered
    # back, as a dense MLP's (torchtitan's apply_moe_ep_tp: PrepareModuleInputOutput Shard(1) -> Replicate; the router
    # runs on the whole sequence and ReordererSequenceParallel hands each tensor-parallel rank 1 / tp of the tokens to
    # dispatch); Megatron-Core's and parplan's MoE layer takes the rank's sequence shard (total.block_comm).  The
    # gathered input it saves is sp_saves_gathered_input's (memory.activation_bytes_per_layer's second norm output)
    moe_input_gathered: bool = False
    # a mixture of experts' recompute modules (Training.moe_recompute; moe.recomputed_bytes): none, act, norm-act
    moe_recompute: str = "none"
    # a mixture of experts' token all-to-alls hidden behind another micro-batch's compute (Training.moe_a2a_overlap:
    # Megatron-Core's --overlap-moe-expert-parallel-comm, its combined 1F1B; moe.overlapped_all_to_alls)
    moe_a2a_overlap: bool = False
    # multi-head latent attention's up projections recomputed in the backward (Training.mla_recompute: Megatron-LM's
    # --recompute-modules mla_up_proj; compute.mla_up_recompute_time, memory.mla_up_saved_bytes)
    mla_recompute: bool = False
    fused_cross_entropy: bool = False  # loss softmax in place (Megatron): 16-bit logits + 4 B/logit, else 12 B/logit
    # torch.distributed.pipelining's last stage keeps its output, the 16-bit logits, from the forward to that
    # micro-batch's backward (its forward cache, then a local of the stage's backward_one_chunk) where the loss does
    # not save them itself: "to-grad" where the runtime lets their storage go once their gradient is made (parplan's
    # runtime: model.free_after_grad, past the loss's peak), "to-stage-end" where they stay through the stage's
    # blocks' backward too (torchtitan); "" where no such cache holds them (Megatron and DeepSpeed free the stage
    # output; no pipeline) (memory.cached_logits_bytes)
    pipeline_keeps_logits: str = ""
    cross_entropy_16bit_grad: bool = False  # with fused: the gradient in the logits' dtype (flash-attn), 2 x 16-bit
    # a block's pointwise work (norms, rotary, activation) runs as fused kernels (Megatron/apex, torch.compile:
    # parplan launch compiles its blocks on cuda) or as eager PyTorch ops (compute.layer_elementwise_time)
    fused_elementwise: bool = True
    # whose ops an eager (uncompiled) block runs, for its pointwise time (compute.layer_elementwise_time)
    # and what it saves (eager_saves_more): torchtitan's llama as written, or parplan's runtime (its own
    # RMSNorm, rotary and SwiGLU)
    eager_runtime: str = "torchtitan"
    # context parallelism's K/V exchange overlapped with the attention (ring attention: Megatron, torch) or an
    # all-gather before it on the critical path (parplan's runtime; Llama 3: "the all-gather communication
    # latency is exposed in the critical path", Dubey et al. 2024 sec. 3.3.2)
    overlap_cp_comm: bool = False
    # the column-parallel layers' input-gradient collective (all-reduce; reduce-scatter with SP) started
    # asynchronously and overlapped with their weight-gradient GEMM (Megatron-LM's
    # LinearWithGradAccumulationAndAsyncCommunication, async_tensor_model_parallel_allreduce; parplan's runtime)
    # or waited for before it (Megatron-DeepSpeed, which turns it off by default; torchtitan's DTensor TP)
    async_tp_grad_comm: bool = False
    # torch's context parallelism (torchtitan; its default all-gather rotation, _AllGatherRotater in
    # torch/distributed/tensor/experimental/_attention.py) gathers K/V once, asynchronously, before the
    # rank's own chunk of the attention and waits for it after: only that 1/cp of the attention hides it
    cp_overlap_local_chunk_only: bool = False
    # global gradient-norm clipping: a read of every gradient the rank holds for the norm, then (unless the
    # framework scales only when it clips: Megatron-LM's clip_grad_norm_fp32) a scaling pass over them
    clip_grad: bool = False
    clip_scales_always: bool = True
    # context-parallel ranks hold the same parameters, so their gradients are reduced over dp x cp in every
    # framework.  Megatron (its data-parallel group "with context parallel": DDP and the distributed
    # optimizer), torchtitan (FSDP2 over the dp_shard x cp mesh) and DeepSpeed (ZeRO over its sequence-data-
    # parallel group) also shard ZeRO's states over dp x cp; parplan's runtime shards over dp only and,
    # after the dp reduction, averages the cp replicas with an all-reduce of their own after the backward
    # (parallel_layers/train.py reduce_gradients)
    zero_over_cp: bool = False
    # the 16-bit-gradient fused cross-entropy (cross_entropy_16bit_grad) as parplan's runtime runs it: chunks of
    # eager kernels (layers._FusedVocabParallelCE), which save flash-attn's memory but not its traffic
    ce_eager_chunks: bool = False
    # the zero-bubble schedules' weight passes run from closures the linears' backward queued (parplan's runtime:
    # parallel_layers.layers.WeightGradStore, outside FSDP2), so a pending block keeps its linears' inputs and
    # output gradients and not its graph; torch's own weight pass (torchtitan) keeps the graph and re-runs a
    # checkpointed block once per parameter group, which no plan is offered (full or op-level selective recompute)
    zb_weight_grad_store: bool = False
    # FP8 linear layers (Training.fp8), as the framework runs them: "te" (Transformer Engine under Megatron-LM),
    # "torchao" (torchao's float8 under torchtitan), "" (16-bit GEMMs).  compute.fp8_cast_time, memory's saved bytes
    fp8: str = ""
    # hybrid sharding (HSDP) under ZeRO-3: the framework can shard the states over a group of the data-parallel ranks
    # and replicate that group (Layout.dp_replicate): torch FSDP2 over a 2D (replicate, shard) mesh (torchtitan's
    # data_parallel_replicate_degree, parplan's runtime), FSDP1's HYBRID_SHARD
    hsdp: bool = False
    # ZeRO-1's version of it: Megatron-LM's distributed optimizer in dp_replicate instances
    # (--num-distributed-optimizer-instances; megatron/core/distributed: a reduce-scatter over the instance's
    # dp / dp_replicate ranks, then an all-reduce of the shard across the instances, the parameter all-gather inside
    # the instance); searched (planner.search.hybrid_shard_candidates: one instance a node)
    partial_distopt: bool = False
    # FSDP2's hybrid sharding keeps each unit's all-reduce input (its reduce-dtype gradient shard) from its reduction
    # to the end of the backward (FSDPParamGroup._all_reduce_state, torch PR #140044): memory's hsdp_held
    hsdp_holds_reduce_input: bool = False

    @property
    def eager_saves_more(self) -> bool:
        """Eager blocks keep more for the backward (memory.activation_bytes_per_layer's eager term:
        torchtitan's llama without compile); parplan's runtime does not, compiled or not: its RMSNorm and
        SwiGLU are autograd functions that save what fused kernels do (parallel_layers.model._RMSNorm,
        _SwiGLU)."""
        return not self.fused_elementwise and self.eager_runtime == "torchtitan"

    @property
    def act_bytes(self) -> int:
        return 4 if self.dtype == "fp32" else 2


@dataclass
class Layout:
    """One plan (scalars) or many (equal-length arrays)."""
    gpus: Any
    tp: Any
    pp: Any
    dp: Any
    cp: Any
    vpp: Any
    mbs: Any
    zero: Any
    recompute: Any  # RECOMPUTE code
    sp: Any  # 0/1
    schedule: Any  # SCHEDULES code
    offload: Any  # OFFLOADS code
    # under full recompute, how many blocks of each virtual stage are recomputed, from its first (Megatron-LM's
    # --recompute-method block --recompute-num-layers N; recomputed_share); 0: every block
    recompute_layers: Any = 0
    # ZeRO-3's hybrid sharding (HSDP): the data-parallel ranks form dp_replicate groups of dp / dp_replicate
    # consecutive ranks; each group shards the states (zero_shards) and the groups hold the same shards, whose
    # gradients they all-reduce after each reduce-scatter (TrainingConsts.hsdp; under ZeRO-1, Megatron's optimizer
    # instances: TrainingConsts.partial_distopt).  1: one group, full sharding
    dp_replicate: Any = 1
    # expert parallelism (a mixture of experts'): each MoE layer's experts over ep of the stage's tp x cp x dp ranks
    # (Megatron-Core's expert-model-parallel group, expert tensor parallelism 1); 1 for a dense model
    ep: Any = 1

    def __post_init__(self):
        for k in ("recompute_layers", "dp_replicate", "ep"):
            if np.ndim(getattr(self, k)) == 0 and np.ndim(self.tp) > 0:  # arrays of candidates: one each
                setattr(self, k, np.full(np.shape(self.tp), int(getattr(self, k))))

    def __len__(self) -> int:
        return int(np.size(self.tp))

    def take(self, idx) -> "Layout":
        return Layout(**{k: np.asarray(v)[idx] for k, v in self.__dict__.items()})

    @staticmethod
    def concat(layouts) -> "Layout":
        """The candidates of several Layouts (arrays), in order."""
        return Layout(**{k: np.concatenate([np.asarray(getattr(l_, k)) for l_ in layouts]) for k in layouts[0].__dict__})

    def row(self, i: int) -> dict:
        return {k: np.asarray(v)[i].item() for k, v in self.__dict__.items()}

    def rows(self, start: int, stop: int) -> "Layout":
        """Candidates start..stop-1, as views of these arrays (no copy; a scalar field stays one)."""
        return Layout(**{k: np.asarray(v)[start:stop] if np.ndim(v) else v for k, v in self.__dict__.items()})


# Candidates a search's cost model sees at once (in_chunks).  Its terms are elementwise over candidates, so a large
# set priced in slices gives the same numbers, to the bit (tests/test_search.py); what changes is how much memory
# the intermediate arrays take at once: the memory model of GLM-4.5's 333,829 candidates on 1,024 GPUs held 385 MB
# of them at its peak (tracemalloc), touched afresh (page faults: 0.33 s of system time in a 1.2 s command, this
# 2-core machine, 2026-12-06), against about a fifth of that in slices of 65,536 (the command 1.0 s, 0.18 s system;
# 32,768 and 131,072 read the same).
CHUNK_ROWS = 1 << 16


def in_chunks(lay, fn, rows: int | None = None):
    """fn(layout) -> an array or a dict of arrays, one value per candidate (or a scalar for all), computed on
    slices of at most `rows` candidates (CHUNK_ROWS) and joined in order: fn(lay)'s values where fn is elementwise
    over the candidates, with the intermediate arrays of one slice at a time.  lay: a Layout, or anything with a
    length and rows(start, stop) -> Layout (candidates built a slice at a time: planner.search.Expanded)."""
    rows = CHUNK_ROWS if rows is None else rows
    n = len(lay)
    if n <= rows:
        return fn(lay if isinstance(lay, Layout) else lay.rows(0, n))
    starts = range(0, n, rows)
    parts = [(min(rows, n - a), fn(lay.rows(a, a + rows))) for a in starts]

    def join(values):
        return np.concatenate([np.broadcast_to(v, (k,)) for k, v in values])
    if isinstance(parts[0][1], dict):
        return {key: join((k, p[key]) for k, p in parts) for key in parts[0][1]}
    return join(parts)


def largest_virtual_stage(layers: int, lay):
    """Blocks of the largest virtual stage: ceil(layers / (pp x vpp)) (stage_layers' split)."""
    return -(-layers // (np.asarray(lay.pp) * np.asarray(lay.vpp)))


def titan_layer_sac_counts(chunk: int, vpp: int) -> list[int]:
    """The blocks of each virtual stage torchtitan's layer-level selective checkpointing can recompute (its
    activation_checkpoint mode "selective" with selective_ac_option a number f: every f-th transformer block a
    process builds wrapped whole, counted from 1 by a module-level counter across the rank's model parts; torchtitan/
    distributed/activation_checkpoint.py, _apply_layer_sac), where every virtual stage holds `chunk` blocks: N of 1 up
    to chunk - 1 (chunk itself is full recompute).  With one stage a rank, floor(chunk / f) for some f >= 2; with
    several (vpp > 1) the counter runs on from one chunk into the next, so only f dividing chunk recomputes the same
    N = chunk / f in each."""
    if chunk < 2:
        return []
    counts = {chunk // f for f in range(2, chunk + 1)} if vpp == 1 else {chunk // f for f in range(2, chunk + 1)
                                                                            if chunk % f == 0}
    return sorted(n for n in counts if 0 < n < chunk)


def titan_layer_sac_freq(chunk: int, vpp: int, n: int) -> int | None:
    """torchtitan's selective_ac_option (the frequency f) that recomputes n blocks of every virtual stage of `chunk`
    blocks (titan_layer_sac_counts), or None where none does."""
    if n not in titan_layer_sac_counts(chunk, vpp):
        return None
    f = chunk // n
    return f if chunk // f == n and (vpp == 1 or chunk % f == 0) else None


def recomputed_share(layers, lay):
    """Share of a pipeline rank's blocks that full recompute re-runs: 1, or under recompute_layers N (Megatron-LM's
    block method: the first N blocks of every virtual stage recomputed, the others keeping their activations)
    N over the largest virtual stage's blocks, at most 1.  With stages of one size that is every rank's share; where
    the split is uneven, the largest stages' (the critical ones in time: a smaller stage, which recomputes a larger
    share of its blocks, is charged up to one block's recompute less time; its memory reads its own share,
    rank_recomputed_shares).  1 wherever recompute is not full.  layers: the model's block count, or its ModelDims
    (whose own split, where it has one, gives the largest stage)."""
    n = np.asarray(lay.recompute_layers, dtype=float)
    if isinstance(layers, ModelDims):
        largest = max(layers.split) if layers.split else largest_virtual_stage(layers.layers, lay)
    else:
        largest = largest_virtual_stage(layers, lay)
    return np.where((np.asarray(lay.recompute) == REC_FULL) & (n > 0),
                    np.minimum(n / np.maximum(largest, 1), 1.0), 1.0)


def rank_recomputed_shares(m: ModelDims, lay) -> tuple:
    """(rank 0's, the middle rank's, rank pp-1's) share of its own blocks that full recompute re-runs under
    recompute_layers N: the sum over the rank's virtual stages of min(N, the stage's blocks), over the rank's blocks
    (the runtime's and Megatron-LM's block method; stages as model_rank_block_counts splits them, stages_of_rank places
    them).  recomputed_share is the largest stage's, every rank's where the stages are of one size; a rank of smaller
    stages recomputes a larger share of its blocks (llama3-405b's 126 blocks on pp 16 at N 4: the middle ranks' 8
    blocks 1/2, rank 0's and rank 15's 7 blocks 4/7).  The middle rank: of those holding model_rank_block_counts'
    middle count, the one recomputing the fewest (rank 0's with pp <= 2).  1 wherever recompute is not full or N is
    0, and on a rank without blocks."""
    return tuple(_recompute_table(m, lay)[:3])


def critical_recomputed_share(m: ModelDims, lay):
    """The share of its blocks that full recompute re-runs on the rank whose blocks take longest, under
    recompute_layers N: of the ranks holding the most blocks, the one recomputing the most (rank_recomputed_shares'
    sum).  Without interleaving that rank holds a largest stage, and the share is recomputed_share's N / c; under
    interleaving with stages of different sizes a rank of the most blocks may hold small stages, each recomputed
    whole (GLM-4.5's 92 blocks on pp 16 x vpp 5, most stages of 1 block, at N 1: ranks of 6 blocks recompute 5, not
    the 3 of N / c).  What partial recompute's time mixes (total.partial_recompute); 1 where rank_recomputed_shares
    are."""
    return _recompute_table(m, lay)[3]


def model_recomputed_share(m: ModelDims, lay):
    """The share of the model's blocks that full recompute re-runs under recompute_layers N, over every stage: the
    sum over the stages of min(N, the stage's blocks), over all blocks.  What the job's hardware FLOPs mix
    (total.partial_recompute: HFU is a job-wide average); above critical_recomputed_share where smaller stages
    recompute a larger share of theirs (llama3-405b's 126 blocks on pp 16 at N 4: 64 / 126, where a middle rank's
    is 4 / 8), below it where interleaving puts small stages on the rank of the most blocks.  1 where
    rank_recomputed_shares are."""
    return _recompute_table(m, lay)[4]


def _recompute_table(m: ModelDims, lay) -> np.ndarray:
    """rank_recomputed_shares' three, critical_recomputed_share and model_recomputed_share, as a (5, ...) array over
    the candidates."""
    n = np.asarray(lay.recompute_layers)
    full = (np.asarray(lay.recompute) == REC_FULL) & (n > 0)
    pp, vpp = np.asarray(lay.pp), np.asarray(lay.vpp)
    zbv = (np.asarray(lay.schedule) == SCH_ZBV) & (pp > 1)
    shape = np.broadcast_shapes(*(np.shape(x) for x in (n, full, pp, vpp, zbv)))
    out = np.ones((5,) + shape)
    sel = np.flatnonzero(np.broadcast_to(full, shape))
    if not sel.size:
        return out
    cols = [np.broadcast_to(x, shape).ravel()[sel].astype(np.int64) for x in (pp, vpp, zbv, n)]
    first, where = distinct_rows(*cols)
    table = np.array([_rank_recompute_row(m, *(int(c[row]) for c in cols)) for row in first])
    flat = out.reshape(5, -1)
    flat[:, sel] = table[where].T
    return out


@lru_cache(maxsize=4096)
def _rank_recompute_row(m: ModelDims, p: int, v: int, z: int, n: int) -> tuple:
    """_recompute_table's five of one (pp, vpp, ZB-V, N) of m."""
    stages = p * (2 if z else v)
    sizes = list(model_split_sizes(m)) if m.split else model_stage_layers(m.layers, m.mtp, stages)

    def share(chunks):  # of these stages' blocks, the ones recomputed (the first min(N, its blocks) of each)
        blocks = sum(chunks)
        return blocks, (sum(min(n, c) for c in chunks) / blocks if blocks else 1.0)

    def held(r):
        return share([sizes[s] for s in stages_of_rank(r, p, 2 if z else v, "zbv" if z else "1f1b")])
    critical = max(held(r) for r in range(p))  # the most blocks, then the most recomputed
    return (*_rank_kinds(held, p), critical[1], share(sizes)[1])


def _rank_kinds(held, p: int) -> tuple:
    """(rank 0's, the middle rank's, rank p-1's) value of held(rank) -> (blocks, value): the middle rank, of those
    holding the most blocks, the one of the least value (rank 0's with p <= 2)."""
    middle = [held(r) for r in range(1, p - 1)]
    first = held(0)[1]
    if middle:
        most = max(b for b, _ in middle)
        mid = min(x for b, x in middle if b == most)
    else:
        mid = first
    return first, mid, held(p - 1)[1]


def num_microbatches(tr, lay):
    return tr.global_batch_size / (np.asarray(lay.dp) * lay.mbs)


def recompute_ends(lay) -> tuple:
    """(no recompute, full recompute of every block): the two layouts partial recompute is mixed from."""
    whole = replace(lay, recompute_layers=np.zeros_like(np.asarray(lay.recompute_layers)))
    return replace(whole, recompute=np.zeros_like(np.asarray(lay.recompute)) + REC_NONE), whole


def split_by_share(share, lay, mem, whole, partial) -> dict:
    """whole(layout, mem) for candidates whose blocks all recompute alike, partial(layout, mem) for those that
    recompute a share of them (recomputed_share < 1; the partial models cost two evaluations each, see only such
    candidates and read each rank's own share: rank_recomputed_shares, critical_recomputed_share), scattered back
    into candidate order."""
    part = np.asarray(share) < 1
    if not np.any(part):
        return whole(lay, mem)
    if part.ndim == 0 or np.all(part):
        return partial(lay, mem)
    n = len(part)
    idx = (np.flatnonzero(~part), np.flatnonzero(part))

    def rows(d, i):
        return None if d is None else {k: np.broadcast_to(v, (n,))[i] if np.ndim(v) else v for k, v in d.items()}
    a, b = whole(lay.take(idx[0]), rows(mem, idx[0])), partial(lay.take(idx[1]), rows(mem, idx[1]))
    out = {}
    for k in a:
        va, vb = np.broadcast_to(a[k], (len(idx[0]),)), np.broadcast_to(b[k], (len(idx[1]),))
        v = np.empty(n, dtype=np.result_type(va, vb))
        v[idx[0]], v[idx[1]] = va, vb
        out[k] = v
    return out


# A column's value range up to which distinct_rows counts its values in a table (a few MB) rather than sorting them
DENSE_RANGE = 1 << 22


def _dense_codes(c: np.ndarray) -> tuple[np.ndarray, int]:
    """(each value's rank among the distinct values, how many there are) of a 1-d integer array: a table over the
    value range marks the values present and its running count ranks them (np.unique's sort where the range is
    wider than DENSE_RANGE)."""
    lo, hi = int(c.min()), int(c.max())
    if hi - lo >= DENSE_RANGE:
        values, codes = np.unique(c, return_inverse=True)
        return codes.reshape(-1), len(values)
    at = c - lo if lo else c  # (each value's place in the table, made once)
    present = np.zeros(hi - lo + 1, dtype=bool)
    present[at] = True
    rank = np.cumsum(present) - 1
    return rank[at], int(rank[-1]) + 1


def distinct_rows(*cols) -> tuple[np.ndarray, np.ndarray]:
    """(first, where) over the rows of integer columns (1-d, one length, not empty): `first` holds a row index for
    each distinct row, in the rows' order (first column first), and row i equals row first[where[i]] -- what
    np.unique(rows, return_index=True, return_inverse=True) gives, up to which of a repeated row's indices stands
    for it, without np.unique's sort of every row (a search's few hundred thousand candidates share a few hundred
    rows of the fields a term reads; the per-column tables take a fifth of the sort's time)."""
    n = len(cols[0])
    code, span = None, 1
    for c in cols:
        ranks, k = _dense_codes(np.asarray(c).astype(np.int64, copy=False))  # (no copy of an int64 column)
        code, span = ranks if code is None else code * k + ranks, span * k
        if span >= DENSE_RANGE:
            code, span = _dense_codes(code)
    where, k = _dense_codes(code)
    first = np.empty(k, dtype=np.int64)
    first[where] = np.arange(n)
    return first, where


def stage_layers(layers: int, stages: int) -> list[int]:
    """Blocks per (virtual) pipeline stage.  The first and last stages carry the embedding and
    the head, so the remainder of layers/stages goes to the middle stages first, then the
    first, then the last (llama3-405b: 126 layers over 16 stages -> 7, 8 x 14, 7)."""
    base, rem = divmod(layers, stages)
    sizes = [base] * stages
    order = list(range(1, stages - 1)) + ([0] if stages > 1 else []) + [stages - 1]
    for i in order[:rem]:
        sizes[i] += 1
    return sizes


def stages_of_rank(pp_rank: int, pp: int, vpp: int, schedule: str) -> list[int]:
    """Virtual stage indices a pipeline rank holds, in the order the schedule wants them: loop placement
    (r, r + pp, r + 2pp, ...), or ZB-V's V shape (r and 2pp - 1 - r, as ScheduleZBVZeroBubble expects).
    parplan's runtime places its stages by it (parallel_layers.pipeline); torch-free, so launch's preflight
    uses it too."""
    if pp == 1:
        return list(range(vpp))
    if schedule == "zbv":
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + k * pp for k in range(vpp)]


def virtual_stage_blocks(layers, pp, vpp, stage):
    """Vectorised stage_layers(layers, pp*vpp)[stage]: base blocks, one more for middle stages
    1..R (R = remainder, at most S - 2), then for stage 0, then for stage S - 1.  layers: a block count, or a
    plan's own split (every virtual stage's blocks, a tuple: model_split_sizes), read as it is; a stage past the
    last reads the last's (callers mask those)."""
    if isinstance(layers, tuple):
        sizes = np.asarray(layers)
        return sizes[np.clip(np.asarray(stage), 0, len(sizes) - 1)]
    S = np.asarray(pp) * np.asarray(vpp)
    stage = np.asarray(stage)
    base, rem = layers // S, layers % S
    R = np.minimum(rem, np.maximum(S - 2, 0))
    left = rem - R
    extra = ((stage >= 1) & (stage <= R)) | ((stage == 0) & (left >= 1)) | ((stage == S - 1) & (S > 1) & (left >= 2))
    return np.where(S == 1, layers, base + extra)


def model_stage_layers(layers: int, mtp: int, stages: int) -> list[int]:
    """The model's blocks per (virtual) pipeline stage, with multi-token prediction's depths (ModelSpec.mtp_layers)
    split as blocks of the last stage, which holds them (Megatron-Core's pipeline layout puts them there: DeepSeek-V3's
    "Et|(tt|)*30mL"; its 61 blocks and one MTP depth over 8 stages are DeepSeek's recipes' 7 / 8 x 6 / 6): stage_layers
    of layers + mtp, the last stage's count less mtp.  Where the last stage would hold fewer than mtp, the MTP depths
    go beside its share of the blocks (stage_layers of the blocks alone)."""
    if not mtp:
        return stage_layers(layers, stages)
    if (layers + mtp) // stages < mtp:
        return stage_layers(layers, stages)
    sizes = stage_layers(layers + mtp, stages)
    sizes[-1] -= mtp
    return sizes


def head_lightened_split(layers: int, mtp: int, stages: int, lighter: int) -> list[int] | None:
    """The blocks per virtual stage with the last stage (the head's: output layer and loss, and multi-token
    prediction's depths) `lighter` blocks short of the default split's share: the default split of layers + mtp +
    lighter blocks, the last stage's count less mtp + lighter (Megatron-LM's --account-for-loss-in-pipeline-split
    is lighter 1: the loss counted as a layer).  lighter 0 is model_stage_layers; None where the last stage would
    hold fewer than none."""
    if stages < 2:
        return None
    sizes = stage_layers(layers + mtp + lighter, stages)
    sizes[-1] -= mtp + lighter
    return sizes if sizes[-1] >= 0 else None


def model_split_sizes(m: ModelDims):
    """m's own split (ModelDims.split) with multi-token prediction's depths counted as blocks of the last virtual
    stage (model_stage_layers' placement), for the per-stage counts that take a tuple (virtual_stage_blocks,
    memory.rank_inflight); where m has no split of its own, its block count with the depths (layers + mtp, whose
    default split those counts compute)."""
    if not m.split:
        return m.layers + m.mtp
    sizes = list(m.split)
    sizes[-1] += m.mtp
    return tuple(sizes)


def split_rank_counts(sizes: tuple, pp, vpp, schedule=None):
    """rank_block_counts of an explicit split (a plan's stage_layers with multi-token prediction's depths:
    model_split_sizes): the blocks of rank 0, of the heaviest middle rank (rank 0's with pp <= 2) and of rank pp-1,
    each rank holding the virtual stages stages_of_rank gives it (the loop, or ZB-V's V).  One plan's layout: each
    row's pp x vpp must be the split's length."""
    shape = np.broadcast_shapes(np.shape(pp), np.shape(vpp), np.shape(schedule) if schedule is not None else ())
    pp_b, vpp_b = np.broadcast_to(pp, shape), np.broadcast_to(vpp, shape)
    sch_b = np.broadcast_to(-1 if schedule is None else schedule, shape)
    out = np.zeros((3,) + shape, dtype=np.int64)
    for idx in np.ndindex(*shape):
        p, v = int(pp_b[idx]), int(vpp_b[idx])
        zbv = int(sch_b[idx]) == SCH_ZBV and p > 1
        if len(sizes) != p * v:
            raise ValueError(f"a split of {len(sizes)} stages for pp {p} x vpp {v}")
        held = [sum(sizes[s] for s in stages_of_rank(r, p, v, "zbv" if zbv else "1f1b")) for r in range(p)]
        out[(slice(None),) + idx] = (held[0], max(held[1:-1]) if p > 2 else held[0], held[-1])
    return tuple(out)


def model_rank_block_counts(m: ModelDims, pp, vpp, schedule=None):
    """rank_block_counts of m's blocks and its multi-token-prediction depths (ModelDims.mtp), each priced as a block
    of the stage holding the head (model_stage_layers: the last virtual stage; rank pp-1's, rank 0's under ZB-V, the
    only rank's without a pipeline).  They count as MoE blocks in a mixture of experts (rank_dense_blocks counts none
    of them).  Where the last virtual stage's share is under mtp, the depths go beside the blocks' own split.  A plan's
    own split (ModelDims.split): split_rank_counts of it."""
    if m.split:
        return split_rank_counts(model_split_sizes(m), pp, vpp, schedule)
    if not m.mtp:
        return rank_block_counts(m.layers, pp, vpp, schedule)
    p = np.asarray(pp)
    zbv = (np.asarray(schedule) == SCH_ZBV) & (p > 1) if schedule is not None else np.zeros(np.shape(p), bool)
    v = np.asarray(vpp)
    if p.ndim == 1 and p.shape == v.shape == zbv.shape and p.size >= 4096:
        # a search's candidates share a few dozen (pp, vpp, zbv): count once per triple, then scatter
        first, where = distinct_rows(p, v, zbv)
        return tuple(np.asarray(x)[where] for x in model_rank_block_counts(m, p[first], v[first],
                                                                            np.where(zbv[first], SCH_ZBV, -1)))
    stages = p * np.where(zbv, 2, np.asarray(vpp))
    split = (m.layers + m.mtp) // stages >= m.mtp  # the last virtual stage holds at least base blocks
    together = rank_block_counts(m.layers + m.mtp, pp, vpp, schedule)
    apart = rank_block_counts(m.layers, pp, vpp, schedule)
    head_first = (p == 1) | zbv
    apart = (apart[0] + np.where(head_first, m.mtp, 0), apart[1] + np.where(p == 1, m.mtp, 0),
             apart[2] + np.where(head_first & (p > 1), 0, m.mtp))
    return tuple(np.where(split, t, a) for t, a in zip(together, apart))


def rank_block_counts(layers: int, pp, vpp, schedule=None):
    """Vectorised: blocks held by pipeline rank 0 (with the embedding), the heaviest middle rank, and
    rank pp-1, where the virtual stages' sizes follow stage_layers(layers, pp*vpp) (middle stages first get
    the remainder, so the first and last virtual stages are the light ones) and stages_of_rank places them:
    rank r holds r, r+pp, ..., r+(vpp-1)pp (llama3-405b, 126 layers on pp 16 x vpp 8 -> rank 0 and rank 15
    hold 7 blocks, the others 8), or under ZB-V (schedule SCH_ZBV, vpp 2) r and 2pp-1-r, the V that puts both
    light ends on rank 0 and the middle stages pp-1 and pp on rank pp-1 (qwen2.5-7b's 28 layers on pp 4 ->
    6, 7, 7, 8 blocks, where the loop's count is 7 on every rank)."""
    pp = np.asarray(pp)
    vpp = np.asarray(vpp)
    zbv = np.zeros(np.shape(pp), bool) if schedule is None else np.broadcast_to(np.asarray(schedule) == SCH_ZBV,
                                                                                 np.broadcast_shapes(np.shape(pp), np.shape(schedule)))
    if pp.ndim == 1 and pp.shape == vpp.shape and pp.size >= 4096:
        # a search's candidates share a few dozen (pp, vpp, zbv): count once per triple, then scatter
        first, where = distinct_rows(pp, vpp, zbv)
        return tuple(np.asarray(x)[where] for x in rank_block_counts(layers, pp[first], vpp[first],
                                                                      np.where(zbv[first], SCH_ZBV, -1)))
    S = pp * vpp
    base = layers // S
    rem = layers % S
    R = np.minimum(rem, np.maximum(S - 2, 0))  # stages 1..R get one extra block
    left = rem - R  # then stage 0, then stage S-1

    def extra_middle(r):
        # #{k in [0, vpp): 1 <= r + k pp <= R}
        hi = np.floor_divide(R - r, pp)  # largest k with r + k pp <= R
        lo = np.where(r >= 1, 0, 1)
        return np.clip(np.minimum(hi, vpp - 1) - lo + 1, 0, None) * (R >= np.maximum(r, 1))

    first = vpp * base + extra_middle(0) + (left >= 1)
    mid = vpp * base + extra_middle(np.minimum(1, pp - 1))
    last_r = pp - 1
    last = vpp * base + extra_middle(last_r) + (left >= 2) * (last_r >= 0)
    # ZB-V (S = 2pp): rank 0 holds stages 0 and S-1 (the remainder's last two blocks); rank r in 1..pp-2 holds
    # r and 2pp-1-r, at most one extra for the first and one for the second where R reaches pp+1 (r = pp-2);
    # rank pp-1 holds pp-1 and pp
    v_first = 2 * base + left
    v_mid = 2 * base + (R >= 1) + (R >= pp + 1)
    v_last = 2 * base + ((pp - 1 >= 1) & (R >= pp - 1)) + (R >= pp)
    first = np.where(zbv & (pp > 1), v_first, first)
    mid = np.where(zbv & (pp > 1), v_mid, mid)
    last = np.where(zbv & (pp > 1), v_last, last)
    single = S == 1
    first = np.where(single, layers, first)
    last = np.where(pp == 1, first, last)
    mid = np.where(pp > 2, mid, first)
    return first, mid, last


def rank_dense_blocks(m: ModelDims, pp, vpp, schedule=None):
    """Vectorised, beside rank_block_counts: how many of the blocks of rank 0, of the middle rank priced, and of rank
    pp-1 are dense (ModelDims.mixed: dense blocks between the MoE ones; zeros otherwise).  A rank's blocks are those of
    its virtual stages (stage_layers' sizes, stages_of_rank's placement), so leading dense blocks land in rank 0's
    first virtual stage.  The middle rank priced: of the middle ranks holding rank_block_counts' middle count, the one
    with the fewest dense blocks (the most experts: an MoE block holds more and, with its all-to-alls, takes longer);
    with pp <= 2, rank 0's, as rank_block_counts has it."""
    if not m.mixed:
        return 0, 0, 0
    pp, vpp = np.asarray(pp), np.asarray(vpp)
    zbv = np.zeros(np.shape(pp), bool) if schedule is None else np.asarray(schedule) == SCH_ZBV
    shape = np.broadcast_shapes(np.shape(pp), np.shape(vpp), np.shape(zbv))
    cols = [np.broadcast_to(x, shape).ravel() for x in (pp, vpp, zbv)]
    if not cols[0].size:
        return tuple(np.zeros(shape) for _ in range(3))
    first, where = distinct_rows(*cols)
    table = np.zeros((len(first), 3))
    for j, row in enumerate(first):
        p, v = int(cols[0][row]), int(cols[1][row])
        table[j] = _rank_dense_row(m, p, v, bool(cols[2][row]) and p > 1)
    return tuple(table[where, k].reshape(shape) for k in range(3))


@lru_cache(maxsize=4096)
def _rank_dense_row(m: ModelDims, p: int, v: int, z: bool) -> tuple:
    """rank_dense_blocks of one (pp, vpp, ZB-V) of m: (rank 0's, the middle rank's, rank pp-1's dense blocks), kept
    between calls (a search asks for the same few dozen rows in every memory term, each a walk over the ranks)."""
    dense = np.cumsum([0] + [not m.is_moe_block(i) for i in range(m.layers)])
    sizes = list(m.split) if m.split else model_stage_layers(m.layers, m.mtp, p * (2 if z else v))
    starts = np.cumsum([0] + sizes)

    def held(r):
        stages = stages_of_rank(r, p, 2 if z else v, "zbv" if z else "1f1b")
        return (sum(sizes[s] for s in stages), sum(dense[starts[s + 1]] - dense[starts[s]] for s in stages))
    return _rank_kinds(held, p)


def head_on_first_rank(lay):
    """Whether pipeline rank 0 holds the head (final norm, output layer, loss) beside the embedding: without a
    pipeline, and under ZB-V, whose V places the last virtual stage on rank 0 with the first."""
    return (np.asarray(lay.pp) == 1) | (np.asarray(lay.schedule) == SCH_ZBV)


def deepspeed_comm_casts(tr) -> bool:
    """Where DeepSpeed's ZeRO-2/3 reductions cast each gradient bucket to a communication dtype other than the model's
    (the recipe's gradient dtype is not its weights': the export's fp32 beside fp32 gradient shards) before reducing
    it; its copy is memory.deepspeed_grad_buckets' `reduce`, its time in total and zero3.block_comm."""
    rec = PRECISION_RECIPES[tr.precision]
    return rec["grad"] != rec["weight"]


def zero_shards(lay, tr):
    """Ranks that ZeRO shards states over and its reduce-scatters and all-gathers span: dp x cp, or dp
    where the cp replicas are averaged apart (TrainingConsts.zero_over_cp); under hybrid sharding (ZeRO-3 with
    dp_replicate > 1, or ZeRO-1's Megatron optimizer instances) one of the dp_replicate groups' share of those."""
    return (np.asarray(lay.dp) * np.where(tr.zero_over_cp, np.asarray(lay.cp), 1)
            // np.asarray(lay.dp_replicate))
