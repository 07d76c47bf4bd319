"""Context parallelism: all-gather based, with load balancing under the causal mask (Llama 3,
Dubey et al. 2024 sec. 3.3.2).

The sequence of each micro-batch (length S) is cut into 2*cp chunks of S/(2*cp) tokens; cp rank
i holds chunks i and 2*cp-1-i, so every rank has the same amount of causal-attention work.
Token ids and targets are sliced the same way (``shard_sequence``); the held tokens' global
positions (``local_positions``) feed rotary (llama) and the learned positions (gpt).

Attention: each rank projects its own queries, keys and values; K and V (after rotary, before
the GQA expansion) are all-gathered over the cp group (``gather_from_context_parallel_region``:
backward reduce-scatters dK/dV), put back in global order (``gathered_to_global``) and the
local queries attend to all S keys under a causal mask built from global positions.  With
sequence parallelism inside TP, CP splits the sequence first and SP splits the local sequence
again; TP/SP logic is unchanged.

Loss and gradients: each cp rank's loss is the mean over its own tokens (equal counts on every
rank), so the mean over the cp group is the full micro-batch loss; its backward gives per-rank
parameter gradients whose cp-mean is the full gradient, and the trainer averages over dp x cp.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from parallel_layers.mappings import _size, gather_from_context_parallel_region
from parallel_layers.window import binding, window_attention


def chunk_ids(cp_rank: int, cp: int) -> tuple[int, int]:
    """The two global chunk indices (of 2*cp) held by a cp rank, in local order."""
    return cp_rank, 2 * cp - 1 - cp_rank


def _check(seq: int, cp: int) -> int:
    if seq % (2 * cp):
        raise ValueError(f"sequence length {seq} is not divisible by 2*cp = {2 * cp} (load-balanced context parallelism)")
    return seq // (2 * cp)


def shard_sequence(x: torch.Tensor, cp_rank: int, cp: int, dim: int = 1) -> torch.Tensor:
    """This rank's tokens of a full-sequence tensor: chunks cp_rank and 2*cp-1-cp_rank, concatenated."""
    if cp == 1:
        return x
    _check(x.shape[dim], cp)
    chunks = x.chunk(2 * cp, dim=dim)
    a, b = chunk_ids(cp_rank, cp)
    return torch.cat([chunks[a], chunks[b]], dim=dim).contiguous()


def local_positions(s_local: int, cp_rank: int, cp: int, device=None) -> torch.Tensor:
    """Global positions (int64) of the s_local tokens a cp rank holds."""
    if cp == 1:
        return torch.arange(s_local, device=device)
    if s_local % 2:
        raise ValueError(f"a cp rank's sequence ({s_local}) must be two equal chunks")
    c = s_local // 2
    a, b = chunk_ids(cp_rank, cp)
    return torch.cat([torch.arange(a * c, (a + 1) * c, device=device), torch.arange(b * c, (b + 1) * c, device=device)])


def gathered_to_global(cp: int) -> list[int]:
    """Chunk permutation: the all-gather stacks rank 0's two chunks, then rank 1's, ...;
    entry j is the gathered-order index of global chunk j."""
    gathered = [c for r in range(cp) for c in chunk_ids(r, cp)]
    return [gathered.index(j) for j in range(2 * cp)]


def causal_mask(q_positions: torch.Tensor, seq: int) -> torch.Tensor:
    """(s_local, seq) boolean, True where a query may attend a key (key position <= query position)."""
    return q_positions.unsqueeze(1) >= torch.arange(seq, device=q_positions.device).unsqueeze(0)


def gather_kv(k: torch.Tensor, v: torch.Tensor, cp_group) -> tuple[torch.Tensor, torch.Tensor]:
    """(b, h, s_local, d) keys and values of each cp rank -> (b, h, S, d) each, in global order.
    One all-gather (and one dK/dV reduce-scatter) for both: K and V are stacked on the head dim."""
    cp = _size(cp_group)
    if cp == 1:
        return k, v
    full = gather_from_context_parallel_region(torch.cat([k, v], dim=1), cp_group, 2)
    chunks = full.chunk(2 * cp, dim=2)
    full = torch.cat([chunks[i] for i in gathered_to_global(cp)], dim=2)
    return full.split([k.shape[1], v.shape[1]], dim=1)


def cp_attention(q: torch.Tensor, k_full: torch.Tensor, v_full: torch.Tensor, q_positions: torch.Tensor,
                 chunk_starts: tuple[int, int] | None = None, dropout_p: float = 0.0,
                 scale: float | None = None, window: int | None = None, cp_key=None,
                 document: int | None = None) -> torch.Tensor:
    """Local queries (b, nh, s_local, d) against all keys/values (b, nkv, S, d) in global order.

    With chunk_starts (the global position of each of the rank's two chunks) every chunk attends only
    the keys up to its end, under a lower-right-aligned causal mask (torch's CausalBias), which the
    fused (flash / memory-efficient) kernels take; without it, one call with an explicit boolean
    mask from global positions (the reference, and what the unit tests compare against).  dropout_p: the attention
    dropout, drawn from the device's default generator (parallel_layers.dropout.attention_rng seeds it).  scale: the
    scores' scale where it is not 1/sqrt(d) (multi-head latent attention's padded heads: parallel_layers.model).
    window: a sliding window shorter than the sequence (parallel_layers.window: the band from the global positions;
    cp_key names them for its masks' caches; document: packed documents of that many tokens, each attending only
    within itself, the same way)."""
    seq = k_full.shape[2]
    window, document = binding(window, seq), binding(document, seq)
    if window is not None or document is not None:
        return window_attention(q, k_full, v_full, window, q_positions, cp_key, dropout_p, scale, document)
    if chunk_starts is None:
        mask = causal_mask(q_positions, k_full.shape[2])
        return F.scaled_dot_product_attention(q, k_full, v_full, attn_mask=mask, enable_gqa=True, dropout_p=dropout_p,
                                              scale=scale)
    from torch.nn.attention.bias import causal_lower_right
    from torch.utils._python_dispatch import _disable_current_modes
    c = q.shape[2] // 2
    outs = []
    for i, start in enumerate(chunk_starts):
        end = start + c
        qi = q[:, :, i * c:(i + 1) * c]
        # the CausalBias tensor subclass cannot be made under a dispatch mode (op-level selective
        # checkpointing runs the block under one): it holds no data, so make it outside any
        with _disable_current_modes():
            bias = causal_lower_right(c, end)
        outs.append(F.scaled_dot_product_attention(qi, k_full[:, :, :end], v_full[:, :, :end],
                                                   attn_mask=bias, enable_gqa=True, dropout_p=dropout_p, scale=scale))
    return torch.cat(outs, dim=2)


def chunk_starts(s_local: int, cp_rank: int, cp: int) -> tuple[int, int]:
    """Global start positions of the two chunks a cp rank holds (s_local = 2 chunks)."""
    c = s_local // 2
    a, b = chunk_ids(cp_rank, cp)
    return a * c, b * c
