"""Sliding-window attention (ModelConfig.sliding_window; Mistral 7B v0.1, Gemma 2 / 3, OLMo 3, gpt-oss's banded
layers): a query at position p attends the keys at positions p - window + 1 .. p, itself included (Hugging Face's
sliding_window counts the keys a query sees; Megatron-LM's --window-size is (window - 1, 0)).

Two kernels, one band:

- on a CUDA device, torch's FlexAttention (``torch.nn.attention.flex_attention``, compiled), with a block mask of
  the band: its kernel skips the tiles wholly outside the band, as the flash kernels Megatron-LM runs a window with
  do, and saves what a flash kernel saves (the output and a log-sum-exp a row); what the cost model counts
  (cost_models.layout.ModelDims.causal_pairs_fraction) -- torchtitan runs its windowed and chunked attention so;
- elsewhere (the CPU: FlexAttention has no backward there in torch 2.13), and beside attention dropout (FlexAttention
  has none), torch's scaled_dot_product_attention under the band as an additive mask (0 / -inf in the queries' dtype,
  one tensor shared by every layer and micro-batch of a shape, so the kernel's saved mask is counted once): the same
  result; on a GPU its kernel (the memory-efficient one) computes the whole rectangle, tiles of the band or not.

Packed documents (Training.document_length; ModelConfig.document_length) and Llama 4's chunks (ModelConfig.
attention_chunk, in its chunked layers) take the same two kernels: a query attends only the keys of its own document
or chunk, fixed-length stretches of D tokens (positions p // D alike), with or without a window.

Under context parallelism (parallel_layers.context_parallel) the rank's queries hold global positions (two chunks of
the sequence) and attend the gathered keys in global order; the band is built from those positions.
"""
from __future__ import annotations

import importlib.util
from typing import Optional

import torch
import torch.nn.functional as F

from parallel_layers.outside_graphs import outside_graphs

_BIASES: dict = {}
_BLOCK_MASKS: dict = {}
_FLEX = None  # torch.compile(flex_attention), made on first use on a CUDA device


def binding(length, seq: int):
    """A window's or a document's length where it is shorter than the sequence, else None (it changes nothing); a
    tuple of documents' and chunks' lengths, those shorter than the sequence."""
    if isinstance(length, tuple):
        kept = tuple(d for d in length if d < seq)
        return kept or None
    return length if length is not None and length < seq else None


def band(q_positions: torch.Tensor, seq: int, window: Optional[int], document: Optional[int] = None) -> torch.Tensor:
    """(s_q, seq) boolean, True where the query at q_positions[i] may attend key j: 0 <= q - j < window (no bound
    without a window), and both in the same packed document of `document` tokens where given (Training.document_length:
    positions 0 .. D - 1 the first, D .. 2 D - 1 the second, ...)."""
    keys = torch.arange(seq, device=q_positions.device).unsqueeze(0)
    return _keep(q_positions.unsqueeze(1), keys, window, document)


def _keep(q, k, window, document):
    """The band as an expression of query and key positions (band's, and FlexAttention's mask_mod).  document: a
    stretch's length, or a tuple of them (packed documents and Llama 4's chunks: both must hold the two alike)."""
    gap = q - k
    keep = gap >= 0
    if window:
        keep = keep & (gap < window)
    for d in (document if isinstance(document, tuple) else (document,)):
        if d:
            keep = keep & (q // d == k // d)
    return keep


def band_bias(q_positions: torch.Tensor, seq: int, window: Optional[int], dtype: torch.dtype, key=None,
              document: Optional[int] = None) -> torch.Tensor:
    """The band as SDPA's additive mask (0 inside, -inf outside) in the queries' dtype: SDPA keeps a boolean mask's
    float copy for its backward, a new one a call, where a float mask of its dtype is kept as it is; cached by `key`
    (a shape's, and a cp rank's) outside compiled code and inference mode, as the rotary tables are."""
    cache = key is not None and not torch.compiler.is_compiling() and not torch.is_inference_mode_enabled()
    if cache and key in _BIASES:
        return _BIASES[key]
    with torch.no_grad():
        keep = band(q_positions, seq, window, document)
        bias = torch.zeros(keep.shape, dtype=dtype, device=q_positions.device).masked_fill_(~keep, float("-inf"))
    if cache:
        _BIASES[key] = bias
    return bias


@outside_graphs
def _block_mask(q_positions: torch.Tensor, seq: int, window: Optional[int], key, document: Optional[int] = None):
    """FlexAttention's block mask of the band, built once a key (eagerly: a graph break on the first call only, then
    a dictionary hit that compiled code reads as it is)."""
    from torch.nn.attention.flex_attention import create_block_mask
    if key is None or key not in _BLOCK_MASKS:
        pos = q_positions

        def mask_mod(b, h, q_idx, kv_idx):
            return _keep(pos[q_idx], kv_idx, window, document)

        block = create_block_mask(mask_mod, None, None, q_positions.shape[0], seq, device=q_positions.device)
        if key is None:
            return block
        _BLOCK_MASKS[key] = block
    return _BLOCK_MASKS[key]


# whether this torch has FlexAttention (2.5 and later), found without importing it (the import pulls in torch.compile's
# machinery: parallel_layers.outside_graphs); a constant, so compiled code reads it as one
HAS_FLEX = importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


def use_flex(q: torch.Tensor, dropout_p: float) -> bool:
    """FlexAttention where it trains: a CUDA device, no attention dropout, a torch that has it."""
    return q.is_cuda and dropout_p == 0.0 and HAS_FLEX


def flex_band_attention(q, k, v, window: Optional[int], q_positions: torch.Tensor, key, scale: Optional[float] = None,
                        compiled: bool = True, document: Optional[int] = None):
    """FlexAttention over the band (grouped query heads as they are): inside a compiled block as that block's graph
    takes it (torch.compile lowers it to its fused kernel), outside one through a compiled FlexAttention of its own;
    `compiled` False: the unfused reference (forward only on the CPU)."""
    from torch.nn.attention.flex_attention import flex_attention
    block = _BLOCK_MASKS.get(key) if key is not None else None
    if block is None:
        block = _block_mask(q_positions, k.shape[2], window, key, document)
    fn = _compiled_flex() if compiled and not torch.compiler.is_compiling() else flex_attention
    return fn(q, k, v, block_mask=block, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


def _compiled_flex():
    global _FLEX
    if _FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention
        _FLEX = torch.compile(flex_attention)
    return _FLEX


def window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: Optional[int],
                     q_positions: Optional[torch.Tensor] = None, key=None, dropout_p: float = 0.0,
                     scale: Optional[float] = None, document: Optional[int] = None) -> torch.Tensor:
    """Queries (b, nh, s_q, d) against keys and values (b, nkv, S, d) within the sliding window (None: none) and,
    where `document` is given, within their packed document of that many tokens.  q_positions: the queries' global
    positions (default 0 .. S - 1, s_q = S); key: what names those positions for the masks' caches (default the plain
    sequence's)."""
    seq = k.shape[2]
    if q_positions is None:
        q_positions, key = torch.arange(q.shape[2], device=q.device), ("seq",)
    key = None if key is None else (key, q.shape[2], seq, window, document, str(q.device))  # unnamed: no cache
    if use_flex(q, dropout_p):
        return flex_band_attention(q, k, v, window, q_positions, key, scale, document=document)
    bias = band_bias(q_positions, seq, window, q.dtype, None if key is None else key + (q.dtype,), document)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True, dropout_p=dropout_p, scale=scale)
