"""Dropout (Srivastava et al. 2014) where Megatron-LM's GPT applies it, with masks that are a function of where
they fall, not of a random stream's history.

Sites (Megatron-LM's GPT model, ``--hidden-dropout`` and ``--attention-dropout``, both 0.1 by default in
megatron/training/arguments.py): the embedding's output; the attention probabilities (inside the attention
kernel); the attention block's output and the MLP's output before each residual add (Megatron's
bias-dropout-add).  Hidden dropout keeps a 1-byte mask per element for the backward (the cost model's
``activation_bytes_per_layer``); a fused attention kernel regenerates its mask from the RNG state it saved.

Keys.  A hidden-dropout mask is drawn from a generator seeded by (run seed, step, global sample index, layer, site,
the first global position of a block of tokens), one sample and block at a time, so it does not depend on the
order of micro-batches, on which pipeline stage holds the layer, on the data-parallel rank, on the micro-batch
size, nor on recomputation: a checkpointed block re-run in the backward draws the same masks (the key is an
argument of the checkpointed function).  Without sequence or context parallelism every tensor-parallel rank holds
the whole sequence and draws the same mask (the replicated activations stay identical).  The blocks are the
runs of consecutive positions a rank holds (its context-parallel chunks, its sequence-parallel shard of them)
cut at the largest size that divides them all, so a rank makes one or two draws a sample and site; a run with
other splits cuts other blocks and draws other masks, unless ``block_tokens`` fixes the size for both (the
layout tests set it).
The attention dropout runs inside torch's scaled_dot_product_attention, which draws from the device's default
generator: it is re-seeded from (run seed, step, the micro-batch's sample indices, layer, tp rank, cp rank) for
the call and restored after, so each tensor-parallel rank's heads get their own masks and a recompute the same.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional

import torch

from parallel_layers.context_parallel import chunk_ids
from parallel_layers.data import stable_seed

# Megatron-LM's defaults for --hidden-dropout and --attention-dropout (megatron/training/arguments.py), the
# published GPT runs' setting that a plan's training.dropout stands for
MEGATRON_DROPOUT = 0.1


@dataclass
class DropoutState:
    """One rank's dropout settings and the key of the micro-batch whose forward runs now.

    ``current`` is the micro-batch's key, (seed, step, global sample indices) as a CPU int64 tensor, set before each
    micro-batch's forward (``begin``); the stage module reads it once per forward and hands it to its blocks as an
    argument.  A tensor, not a tuple of ints: torch.compile takes a tensor as an input, where it would specialise
    a compiled block on every step's ints and compile it again."""

    p_hidden: float
    p_attention: float
    seed: int
    tp_rank: int = 0
    cp_rank: int = 0
    sp: bool = False
    seq_len: int = 0  # the whole sequence (a cp rank holds seq_len / cp of it, an SP rank 1/tp of that)
    cp: int = 1
    tp: int = 1
    block_tokens: Optional[int] = None  # the blocks' size (None: the largest that divides the rank's runs)
    current: Optional[torch.Tensor] = None
    step: int = 0
    replica_indices: list = field(default_factory=list)
    micro_batch_size: int = 1

    def begin_step(self, step: int, replica_indices: list, micro_batch_size: int) -> None:
        self.step, self.replica_indices, self.micro_batch_size = step, list(replica_indices), micro_batch_size

    def begin(self, micro_batch: int) -> None:
        b = self.micro_batch_size
        self.current = torch.tensor([self.seed, self.step, *self.replica_indices[micro_batch * b:(micro_batch + 1) * b]],
                                    dtype=torch.int64)

    def __post_init__(self):
        sp_tp = self.tp if self.sp else 1
        self.blocks = token_blocks(self.seq_len, self.cp, self.cp_rank, sp_tp, self.tp_rank if sp_tp > 1 else 0,
                                   self.block_tokens) if self.seq_len else []


def token_runs(seq_len: int, cp: int, cp_rank: int, sp_tp: int, tp_rank: int) -> list[tuple[int, int, int]]:
    """(local offset, first global position, length) of each run of consecutive positions in the hidden state a
    rank holds: context parallelism's two chunks (cp > 1, parallel_layers.context_parallel), then sequence
    parallelism's shard of them (sp_tp > 1)."""
    if cp > 1:
        c = seq_len // (2 * cp)
        first, second = chunk_ids(cp_rank, cp)
        local = [(0, first * c, c), (c, second * c, c)]
    else:
        local = [(0, 0, seq_len)]
    n = sum(length for _, _, length in local) // sp_tp
    lo, hi = tp_rank * n, (tp_rank + 1) * n
    runs = []
    for off, start, length in local:
        a, b = max(off, lo), min(off + length, hi)
        if a < b:
            runs.append((a - lo, start + a - off, b - a))
    return runs


def token_blocks(seq_len: int, cp: int, cp_rank: int, sp_tp: int, tp_rank: int,
                 block_tokens: Optional[int] = None) -> list[tuple[int, int, int]]:
    """token_runs cut into blocks of block_tokens (default: the largest size dividing every run's start and length)."""
    runs = token_runs(seq_len, cp, cp_rank, sp_tp, tp_rank)
    size = block_tokens or math.gcd(*[v for _, start, length in runs for v in (start, length)])
    if any(start % size or length % size for _, start, length in runs):
        raise ValueError(f"dropout blocks of {size} tokens do not divide this rank's runs of positions {runs}")
    return [(off + i, start + i, size) for off, start, length in runs for i in range(0, length, size)]


_GENERATORS: dict = {}


def _generator(device: torch.device) -> torch.Generator:
    g = _GENERATORS.get(device)
    if g is None:
        g = _GENERATORS[device] = torch.Generator(device=device)
    return g


class _Dropout(torch.autograd.Function):
    """x * mask / (1 - p) with a given boolean mask, saving only the mask (1 byte an element): one pass each way
    (aten's native_dropout_backward is that product, the kernel torch's own dropout runs in its backward)."""

    @staticmethod
    def forward(ctx, x, mask, scale):
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return torch.ops.aten.native_dropout_backward(x, mask, scale)

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return torch.ops.aten.native_dropout_backward(grad, mask, ctx.scale), None, None


def keyed_mask(shape, p: float, device, keys) -> torch.Tensor:
    """A boolean keep-mask of shape (b, s, ...): keys[j] lists (local offset, length, seed) of sample j's blocks
    of tokens, each drawn from a generator seeded by its seed."""
    mask = torch.empty(shape, dtype=torch.bool, device=device)
    g = _generator(torch.device(device))
    for j, blocks in enumerate(keys):
        for off, length, seed in blocks:
            g.manual_seed(seed)
            mask[j, off:off + length].bernoulli_(1.0 - p, generator=g)
    return mask


def dropout_layer_key(layer: int) -> torch.Tensor:
    """A block's layer number as the dropout functions take it inside a compiled block: a CPU int64 tensor, not an
    int.  torch.compile guards an int attribute of a module on its value, so the code it resumes after each dropout's
    graph break (the dropouts run outside its graphs) compiled once per layer, and past torch._dynamo's
    recompile_limit (8) the later layers ran that code uncompiled: on 2026-12-04's H200, a 24-layer gpt with dropout
    dispatched 38.7 ms a step more than without (benchmarks/results/2026-12-04-h200).  A tensor is guarded on its
    dtype and shape alone; the functions below read its value on the host (a CPU tensor: no device sync)."""
    return torch.tensor(layer, dtype=torch.int64)


def _layer_number(layer) -> int:
    """dropout_layer_key's tensor (or an int) as an int, read without an aten op (tolist, as the key is read): no
    dispatch for the byte counts of tests/test_eager_pointwise.py to see."""
    return layer.tolist() if isinstance(layer, torch.Tensor) else int(layer)


def hidden_dropout(x: torch.Tensor, state: Optional[DropoutState], key: Optional[torch.Tensor], layer, site: str):
    """Dropout of a hidden state x (b, s_local, h) at (layer, site) of the micro-batch `key`; x itself without one.
    layer: an int, or dropout_layer_key's tensor."""
    if state is None or key is None or state.p_hidden <= 0.0:
        return x
    return _hidden_dropout(x, state, key, layer, site)


@torch.compiler.disable
def _hidden_dropout(x, state, key, layer, site):
    """Left out of torch.compile's graphs (a graph break): the generator's seeding is host work."""
    seed, step, *indices = key.tolist()
    layer = _layer_number(layer)
    if sum(length for _, _, length in state.blocks) != x.shape[1]:
        raise ValueError(f"hidden dropout over {x.shape[1]} tokens where the rank holds {state.blocks}")
    keys = [[(off, length, stable_seed("dropout", seed, step, i, layer, site, start)) for off, start, length in state.blocks]
            for i in indices]
    mask = keyed_mask(x.shape, state.p_hidden, x.device, keys)
    return _Dropout.apply(x, mask, 1.0 / (1.0 - state.p_hidden))


def attention_dropout_p(state: Optional[DropoutState], key: Optional[torch.Tensor]) -> float:
    return 0.0 if state is None or key is None else state.p_attention


@contextmanager
def attention_rng(state: DropoutState, key: torch.Tensor, layer: int, device: torch.device):
    """The default generator of `device` seeded for one attention call's dropout (its state restored after).
    layer: an int, or dropout_layer_key's tensor."""
    seed, step, *indices = key.tolist()
    layer = _layer_number(layer)
    g = (torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
         if device.type == "cuda" else torch.default_generator)
    saved = g.get_state()
    g.manual_seed(stable_seed("attention-dropout", seed, step, tuple(indices), layer, state.tp_rank, state.cp_rank))
    try:
        yield
    finally:
        g.set_state(saved)
