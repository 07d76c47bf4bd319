"""Parameter counts and FLOPs per token for the two architectures the runtime builds.

GPT (Narayanan et al. 2021, eq. 2): P = 12 l h^2 (1 + 13/(12 h) + (V + s)/(12 l h)) for
ffn = 4h, tied embeddings, learned positions and biases; the functions below reproduce it
exactly when given that shape (plus the final LayerNorm, 2h, which eq. 2 leaves out).
Llama: no biases, RMSNorm (h weights), SwiGLU (three ffn x h matrices), GQA (k/v projections
are h x kv_heads*head_dim), rotary positions (no table), untied output head.

All functions take plain ints or numpy arrays (elementwise).
"""
from __future__ import annotations

from typing import NamedTuple


def is_moe_block(i: int, first_dense: int, step: int) -> bool:
    """Whether block i (from 0) of a mixture of experts is an MoE block: past its first `first_dense` blocks (DeepSeek's
    and GLM-4.5's first_k_dense_replace), every step-th, numbered from 1 (Hugging Face's Qwen2-MoE and Llama 4 rule,
    (i + 1) % step == 0).  The others are dense (ModelSpec.first_dense_layers, moe_layer_step)."""
    return i >= first_dense and (i + 1) % step == 0


def moe_block_count(layers: int, first_dense: int, step: int) -> int:
    """is_moe_block's count over `layers` blocks, in closed form: the multiples of step among first_dense + 1 ..
    layers."""
    return layers // step - min(first_dense, layers) // step


class Mla(NamedTuple):
    """Multi-head latent attention's widths (DeepSeek-V2, 2024, sec. 2.1.2; ModelSpec.kv_lora_rank): the query
    latent (0: a full query projection, DeepSeek-V2-Lite), the key/value latent, the rotary part of a query/key head
    (head_dim is the whole: no-rope + rope) and a value head.  A block's attention weights, as Megatron-Core's
    MLASelfAttention holds them:
      q down   h x q_lora         (with q_lora; then its RMSNorm, q_lora weights)
      q up     q_lora x heads * head_dim       (without q_lora: q, h x heads * head_dim)
      kv down  h x (kv_lora + rope)            (the rope part is the one key part every head shares)
      kv up    kv_lora x heads * (head_dim - rope + v_dim)   (after the latent's RMSNorm, kv_lora weights)
      out      heads * v_dim x h"""
    q_lora: int
    kv_lora: int
    rope: int
    v_dim: int

    def down_width(self) -> int:
        """The down projections' output width a token: what sequence parallelism gathers in place of h."""
        return self.q_lora + self.kv_lora + self.rope

    def tp_input_width(self, hidden: int) -> int:
        """What a token brings into the tensor-parallel region before the attention: the latents (down_width), and
        without a query latent the block input too, which the column-parallel query projection reads (sequence
        parallelism gathers both; without it the backward all-reduces both input gradients)."""
        return self.down_width() + (0 if self.q_lora else hidden)

    def latent_norms(self) -> int:
        """The latents' RMSNorm weights."""
        return self.q_lora + self.kv_lora


def mla_projections(hidden, heads, head_dim, mla: Mla):
    """[(name, in, out, replicated)] of one block's MLA projections (Mla's table): replicated = the down projections,
    which Megatron-Core runs duplicated on every tensor-parallel rank (its up and output projections split by heads)."""
    q = ([("q_down", hidden, mla.q_lora, True), ("q_up", mla.q_lora, heads * head_dim, False)] if mla.q_lora
         else [("q", hidden, heads * head_dim, False)])
    return q + [("kv_down", hidden, mla.kv_lora + mla.rope, True),
                ("kv_up", mla.kv_lora, heads * (head_dim - mla.rope + mla.v_dim), False),
                ("proj", heads * mla.v_dim, hidden, False)]


def attention_matmul_params(arch, hidden, heads, kv_heads, head_dim, mla: Mla | None = None):
    """q, k, v and output projection weights of one block (no biases); multi-head latent attention's projections
    (mla_projections) where mla is given."""
    if mla is not None:
        return sum(i * o for _, i, o, _ in mla_projections(hidden, heads, head_dim, mla))
    q = hidden * heads * head_dim
    kv = 2 * hidden * kv_heads * head_dim
    out = heads * head_dim * hidden
    return q + kv + out


def mlp_matmul_params(arch, hidden, ffn_hidden):
    """SwiGLU has gate, up and down matrices; GeLU MLP has two."""
    n_mats = 3 if arch == "llama" else 2
    return n_mats * hidden * ffn_hidden


def layer_matmul_params(arch, hidden, heads, kv_heads, head_dim, ffn_hidden, mla: Mla | None = None):
    return attention_matmul_params(arch, hidden, heads, kv_heads, head_dim, mla) + mlp_matmul_params(arch, hidden,
                                                                                                    ffn_hidden)


def block_norms(post_norms: bool = False, parallel_block: bool = False) -> int:
    """Norms of one block: two (the sublayers' input norms), four with post-norms (ModelSpec.post_norms), one where
    attention and MLP share it (ModelSpec.parallel_block)."""
    return 1 if parallel_block else 4 if post_norms else 2


def layer_other_params(arch, hidden, heads, kv_heads, head_dim, ffn_hidden, mla: Mla | None = None,
                       post_norms: bool = False, qkv_bias: bool = False, parallel_block: bool = False):
    """Norm weights and biases of one block (multi-head latent attention: its latents' two RMSNorms too; post-norms,
    ModelSpec.post_norms: two norms more; qkv_bias, ModelSpec.qkv_bias: llama's q/k/v projection biases;
    parallel_block, ModelSpec.parallel_block: one norm)."""
    norms = block_norms(post_norms, parallel_block)
    if arch == "llama":  # RMSNorm weight vectors, and Qwen2's q/k/v biases
        return (norms * hidden + (mla.latent_norms() if mla is not None else 0)
                + ((heads + 2 * kv_heads) * head_dim if qkv_bias else 0))
    # gpt: qkv bias + out bias + fc1 bias + fc2 bias + the LayerNorms (weight+bias)
    return (heads + 2 * kv_heads) * head_dim + hidden + ffn_hidden + hidden + 2 * norms * hidden


def spec_dims(spec):
    """(arch, layers, hidden, heads, kv_heads, head_dim, ffn, vocab, tied) of a ModelSpec."""
    return (spec.arch, spec.layers, spec.hidden, spec.heads, spec.kv_heads,
            spec.head_dim or spec.hidden // spec.heads, spec.ffn_hidden, spec.vocab, spec.tied_embeddings)


def param_counts(spec, seq_len: int | None = None) -> dict:
    """Named parameter counts of a ModelSpec.  gpt's learned position table has
    max_seq_len (or seq_len) rows, as in Narayanan eq. 2 (none where the gpt-arch model has rotary
    positions: learned_positions false)."""
    arch, L, h, a, kv, d, f, V, tied = spec_dims(spec)
    mla = spec.mla
    per_layer_matmul = layer_matmul_params(arch, h, a, kv, d, f, mla)
    per_layer_other = layer_other_params(arch, h, a, kv, d, f, mla, bool(spec.post_norms), bool(spec.qkv_bias),
                                         bool(spec.parallel_block))
    # a mixture of experts (ModelSpec.experts): E experts of f each and the router (h x E, counted with the norms);
    # a token's matmuls (what its FLOPs count) are the attention's and k experts'
    E, k = spec.experts or 0, spec.experts_per_token or 0
    active_matmul = per_layer_matmul
    if E:
        attn = attention_matmul_params(arch, h, a, kv, d, mla)
        shared = mlp_matmul_params(arch, h, spec.shared_expert_ffn) if spec.shared_expert_ffn else 0
        per_layer_matmul = attn + E * mlp_matmul_params(arch, h, f) + shared
        active_matmul = attn + k * mlp_matmul_params(arch, h, f) + shared
        per_layer_other = per_layer_other + h * E
    # dense blocks between the MoE ones (ModelSpec.first_dense_layers / moe_layer_step): a dense SwiGLU of
    # dense_ffn_hidden in place of the experts and the router; `per_layer*` stay an MoE block's
    moe_blocks = spec.moe_block_count if E else L
    dense_blocks = L - moe_blocks
    dense_matmul = layer_matmul_params(arch, h, a, kv, d, spec.dense_ffn_hidden, mla) if dense_blocks else 0
    dense_other = (layer_other_params(arch, h, a, kv, d, spec.dense_ffn_hidden, mla, bool(spec.post_norms),
                                      bool(spec.qkv_bias))
                   if dense_blocks else 0)
    embedding = V * h
    positions = 0
    if spec.has_learned_positions:
        positions = (spec.max_seq_len or seq_len or 0) * h
    final_norm = h if arch == "llama" else 2 * h
    head = 0 if tied else V * h
    total = (moe_blocks * (per_layer_matmul + per_layer_other) + dense_blocks * (dense_matmul + dense_other)
             + embedding + positions + final_norm + head)
    # a token's parameters: the model less the experts it is not sent to (the total for a dense model)
    active = total - moe_blocks * (per_layer_matmul - active_matmul)
    # multi-token prediction's module (ModelSpec.mtp_layers), apart from the total as DeepSeek-V3's 671B counts it:
    # per depth one block (an MoE block in a mixture of experts, as DeepSeek-V3's), the 2h x h projection and three
    # RMSNorms (it shares the embedding and the output layer)
    mtp = (spec.mtp_layers or 0) * (per_layer_matmul + per_layer_other + 2 * h * h + 3 * h)
    return {
        "per_layer_matmul": per_layer_matmul,
        "per_layer_other": per_layer_other,
        "per_layer": per_layer_matmul + per_layer_other,
        "embedding": embedding,
        "positions": positions,
        "final_norm": final_norm,
        "head": head,
        # Output projection FLOPs are paid whether or not the matrix is tied.  A mixture of experts: a token's
        "matmul": moe_blocks * active_matmul + dense_blocks * dense_matmul + V * h,
        "total": total,
        "active": active,
        "mtp": mtp,
    }


def narayanan_eq2(layers, hidden, vocab, seq_len):
    """Narayanan 2021 eq. 2: P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h))."""
    l, h = layers, hidden
    return 12 * l * h * h * (1 + 13 / (12 * h) + (vocab + seq_len) / (12 * l * h))


def model_flops_per_token(matmul_params, layers, hidden_attn, seq_len):
    """Model FLOPs per token, no recompute (PaLM App. B; Korthikanti 2022 eq. 7 generalised):
    6 x matmul parameters (fwd 2 + bwd 4; output projection included, input embedding lookup
    excluded) + 12 x layers x (heads*head_dim) x seq_len for attention scores and values
    (fwd 2*2*s*h per token per layer, bwd twice that; no causal discount).  hidden_attn: heads*head_dim, or with
    multi-head latent attention heads x the mean of the query/key and value head widths (ModelSpec.attention_width:
    QK^T runs at one, the values' product at the other; Megatron-LM's num_floating_point_operations counts them so)."""
    return 6 * matmul_params + 12 * layers * hidden_attn * seq_len


def spec_model_flops_per_token(spec, seq_len: int) -> float:
    """model_flops_per_token of a ModelSpec at seq_len: what MFU counts (the runtime's reports, a cpu launch's
    time bound)."""
    return float(model_flops_per_token(param_counts(spec, seq_len)["matmul"], spec.layers,
                                       spec.attention_width, seq_len))


def op_sac_recomputed_matmuls(arch: str, hidden: int, q_width: int, kv_width: int, ffn: int,
                              qkv_bias: bool = False) -> list[int]:
    """Parameters of each matmul of one block whose forward torchtitan's op-level selective
    checkpointing (recompute "selective-op") re-runs: every second aten.mm of the block.  A llama
    block's matmuls run wq, wk, wv, wo, gate (w1), up (w3), down (w2): wk, wo and up are recomputed.
    In a gpt block the column-parallel linears (qkv, fc1) carry their bias into aten.addmm, which the
    policy does not keep, and the row-parallel ones (wo, fc2) are mm's (bias added after the
    reduction): wo is kept, fc2 (the second mm) and the addmm's are recomputed.  A llama block with q/k/v biases
    (qkv_bias: Qwen2) runs wq, wk and wv as addmm's too: its mm's are wo, gate, up and down, of which gate and down
    are recomputed with the three addmm's (wo and up kept)."""
    if arch == "llama" and qkv_bias:
        return [hidden * (q_width + 2 * kv_width), hidden * ffn, ffn * hidden]
    if arch == "llama":
        return [hidden * kv_width, q_width * hidden, hidden * ffn]
    return [hidden * (q_width + 2 * kv_width), hidden * ffn, ffn * hidden]


def titan_op_sac_matmuls(m) -> list[tuple[int, int, str]]:
    """(in, out, kind) of each aten.mm of one block of a torchtitan mixture-of-experts model, in the order its forward
    runs them, as its op-level selective checkpointing counts them (every second one re-run: the 2nd, 4th, ...; kept:
    the 1st, 3rd, ...): the attention's (qwen3 / llama4: wq, wk, wv, wo; deepseek_v3's latent attention: wq or wq_a
    and wq_b, then wkv_a, wkv_b, wo), then the shared experts' (w1, w3, w2; llama4, deepseek_v3) or, in a dense block
    of the model, its FFN's.  The router gate is forced to recompute uncounted (per_op_sac_force_recompute_mm_shapes_
    by_fqns) and the routed experts run aten._grouped_mm, which the list does not name.  kind: "col" split by tp,
    "rep" whole on every tp rank (the latent down projections), "row" a row-parallel output, whole before its
    reduce-scatter.  Checked against its own policy's decisions and kept bytes: benchmarks/titan_moe_saved/op_sac.py."""
    h = m.hidden
    if m.kv_lora:
        mla = m.mla
        q = ([(h, mla.q_lora, "rep"), (mla.q_lora, m.heads * m.head_dim, "col")] if mla.q_lora
             else [(h, m.heads * m.head_dim, "col")])
        attn = q + [(h, mla.kv_lora + mla.rope, "rep"),
                    (mla.kv_lora, m.heads * (m.head_dim - mla.rope + mla.v_dim), "col"), (m.o_width, h, "row")]
    else:
        attn = [(h, m.q_width, "col"), (h, m.kv_width, "col"), (h, m.kv_width, "col"), (m.q_width, h, "row")]
    ffn = m.shared_ffn if m.moe else m.ffn
    mlp = [(h, ffn, "col"), (h, ffn, "col"), (ffn, h, "row")] if ffn else []
    return attn + mlp


def titan_op_sac_kept_width(m, tp):
    """Elements a token of the micro-batch the kept matmuls of titan_op_sac_matmuls leave (col / tp)."""
    return sum(o / (tp if kind == "col" else 1) for i, (_, o, kind) in enumerate(titan_op_sac_matmuls(m)) if i % 2 == 0)


def titan_op_sac_recomputed_params(m) -> list[int]:
    """Weights of the matmuls titan_op_sac_matmuls re-runs (the 2nd, 4th, ...), and the routed experts' three at the
    routed width (their grouped GEMMs all re-run) where the block has experts."""
    rerun = [i * o for j, (i, o, _) in enumerate(titan_op_sac_matmuls(m)) if j % 2 == 1]
    return rerun + ([3 * m.hidden * m.routed_ffn] if m.moe else [])


def recompute_flops_per_token(recompute, layer_matmul_params_total, layers, hidden_attn, seq_len,
                              op_recomputed_params_total=0.0, flash: bool = True):
    """Extra forward FLOPs per token paid by recomputation, elementwise over recompute codes
    (0 none, 1 selective, 2 full, 3 selective-op; or the names).  Narayanan 2021 eq. 3: full recompute
    adds one forward of every block, 2 x block matmul params + 4 l h s; Korthikanti 2022 sec. 5:
    selective recompute replays only the attention core, 4 l h s; selective-op (torchtitan) replays
    the matmuls op_sac_recomputed_matmuls names (op_recomputed_params_total: over all blocks)
    and keeps the attention kernel's output (unfused attention's batched matmuls are not on its list:
    replayed, 4 l h s)."""
    import numpy as np
    from .layout import REC_FULL, REC_SELECTIVE, REC_SELECTIVE_OP, RECOMPUTE
    code = RECOMPUTE.index(recompute) if isinstance(recompute, str) else recompute
    attn = 4 * layers * hidden_attn * seq_len
    code = np.asarray(code)
    return np.where(code == REC_FULL, 2 * layer_matmul_params_total + attn,
                    np.where(code == REC_SELECTIVE, attn,
                             np.where(code == REC_SELECTIVE_OP, 2 * op_recomputed_params_total + (0.0 if flash else attn),
                                      0.0)))
