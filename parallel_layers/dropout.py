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

Compiled runs.  A run that compiles its blocks (``--compile``, launch's default on a GPU; ``masks="hash"``) takes each
hidden-dropout mask instead from a counter-based hash of (run seed, step, global sample index, layer, site, global
position, channel), computed inside the block's graph (hash_keep_mask): no graph break, no host seeding, one fused
kernel with the residual add, as Megatron's fused bias-dropout-add runs (the embedding's, outside the blocks,
through a compiled function of its own).  These masks differ from the keyed generator's but are a function of the
same coordinates, to the element: the same under any tensor, sequence, context or pipeline split, micro-batch size
or recompute, with no blocks of tokens to agree on; an eager run with ``masks="hash"`` draws the same bits (the
tests compare compiled and eager runs with it).

The attention dropout runs inside torch's scaled_dot_product_attention, which draws from the device's default
generator: it is re-seeded from (run seed, step, the micro-batch's sample indices, layer, tp rank, cp rank) for
the call and restored after, so each tensor-parallel rank's heads get their own masks and a recompute the same.
That seeding is host work outside torch.compile's graphs: in a compiled block the attention's dropout is still a
graph break (the hidden ones no longer are).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

import torch

from parallel_layers.context_parallel import chunk_ids
from parallel_layers.data import stable_seed
from parallel_layers.outside_graphs import before_compiling, outside_graphs

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
    current: Optional["DropoutKey"] = None
    step: int = 0
    replica_indices: list = field(default_factory=list)
    micro_batch_size: int = 1
    # the hidden masks: "keyed" (the generator: a graph break each in a compiled block) or "hash" (hash_keep_mask);
    # fused: hash masks outside a compiled graph (the embedding's) run through a compiled function of their own
    masks: str = "keyed"
    fused: bool = False
    device: str = "cpu"  # where the runtime's tensors live: the hash's per-micro-batch rows are put there
    hidden: int = 0  # the model's width: the hash's channel keys are made once for it (0: made at each use)

    def begin_step(self, step: int, replica_indices: list, micro_batch_size: int) -> None:
        self.step, self.replica_indices, self.micro_batch_size = step, list(replica_indices), micro_batch_size

    def begin(self, micro_batch: int) -> None:
        b = self.micro_batch_size
        samples = self.replica_indices[micro_batch * b:(micro_batch + 1) * b]
        host = torch.tensor([self.seed, self.step, *samples], dtype=torch.int64)
        # each sample's 32-bit prefix of the hash, made on the host and copied without a stream sync (non_blocking:
        # a pageable source is staged at once, and nothing here writes the host tensor again)
        rows = torch.tensor([sample_prefix(self.seed, self.step, i) for i in samples], dtype=torch.int64)
        self.current = DropoutKey(host, rows.to(self.device, non_blocking=True))

    def __post_init__(self):
        if self.masks not in ("hash", "keyed"):
            raise ValueError(f"dropout masks must be hash or keyed, got {self.masks!r}")
        sp_tp = self.tp if self.sp else 1
        self.blocks = token_blocks(self.seq_len, self.cp, self.cp_rank, sp_tp, self.tp_rank if sp_tp > 1 else 0,
                                   self.block_tokens) if self.seq_len else []
        # the global position of each token the rank holds (the hash's), on the run's device
        runs = token_runs(self.seq_len, self.cp, self.cp_rank, sp_tp, self.tp_rank if sp_tp > 1 else 0) \
            if self.seq_len else []
        self.positions = torch.tensor([start + i for _, start, length in runs for i in range(length)],
                                      dtype=torch.int64, device=self.device)
        self.channels = None
        self.channels = self.channel_keys(self.hidden) if self.hidden else None

    def channel_keys(self, hidden: int) -> torch.Tensor:
        """(hidden,) mixed channel numbers on the run's device: the ones made once for the model's width, a tensor
        the compiled graphs read (their kernels then do not mix the channel per element), or made here for another."""
        if self.channels is not None and self.channels.shape[0] == hidden:
            return self.channels
        return mix32(torch.arange(hidden, dtype=torch.int64, device=self.device) ^ _CHANNEL_SALT)


class DropoutKey(NamedTuple):
    """A micro-batch's dropout key, handed to its blocks as an argument (a recompute gets it again): ``host``, (seed,
    step, global sample indices) as a CPU int64 tensor, seeds the keyed generators on the host; ``rows``, each
    sample's 32-bit hash prefix (sample_prefix) on the run's device, is what hash_keep_mask reads inside a graph.
    Tensors, not ints: torch.compile takes a tensor as an input, where it would specialise a compiled block on every
    step's ints and compile it again."""

    host: torch.Tensor
    rows: torch.Tensor


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


_M32 = 0xFFFFFFFF
_CHANNEL_SALT = 0x2545F491  # any odd constant: channel 0 does not hash as a zero
_SITES = {"embedding": 1, "attention": 2, "mlp": 3}


def mix32(x):
    """A 32-bit integer hash of the low 32 bits of an int64 tensor or a Python int (the host's share, sample_prefix):
    two xorshift-multiply rounds by 0x45d9f3b and a final xorshift (Thomas Mueller's integer hash, full avalanche),
    in int64 lanes masked to 32 bits after each product.  The constant is under 2^27, so a product stays under 2^59:
    no step overflows int64 on any device or in any compiled kernel, and eager, compiled and host code give the same
    bits."""
    x = x & _M32
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & _M32
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & _M32
    return x ^ (x >> 16)


def sample_prefix(seed: int, step: int, sample: int) -> int:
    """The hash's 32-bit prefix for one sample of one step: the run seed, the step and the global sample index, each
    folded whole (64 bits) into the chain."""
    h = 0
    for v in (seed, step, sample):
        h = mix32(h ^ mix32(v & _M32) ^ mix32((v >> 32) + 0x9E3779B9))
    return h


def hash_keep_mask(shape, p: float, rows: torch.Tensor, layer, site: str, positions: torch.Tensor,
                   channels: torch.Tensor) -> torch.Tensor:
    """A boolean keep-mask of shape (b, s, h) with P(keep) = 1 - p (to 2^-32): element (j, t, c) keeps when
    mix32(mix32(rows[j] ^ mix32(4 layer + site) ^ positions[t]) ^ channels[c]) >= p * 2^32.  rows: the micro-batch's
    sample prefixes (DropoutKey.rows); layer: an int or a 0-d int64 tensor on the rows' device; positions: the global
    position of each of the s tokens; channels: DropoutState.channel_keys.  Pointwise integer work that torch.compile
    fuses into the kernel that applies the mask; eager, a few (b, s, h) int64 temporaries."""
    b, s, h = shape
    if rows.shape[0] != b or positions.shape[0] != s or channels.shape[0] != h:
        raise ValueError(f"hash mask of {tuple(shape)} from {rows.shape[0]} rows, {positions.shape[0]} positions "
                         f"and {channels.shape[0]} channels")
    where = mix32(torch.as_tensor(layer, dtype=torch.int64, device=rows.device) * 4 + _SITES[site])  # 0-d
    token = mix32((rows ^ where)[:, None] ^ positions[None, :])  # (b, s)
    v = mix32(token[:, :, None] ^ channels)  # (b, s, h)
    return v >= int(round(p * 2 ** 32))


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


def hidden_dropout(x: torch.Tensor, state: Optional[DropoutState], key: Optional[DropoutKey], layer, site: str,
                   layer_rows: Optional[torch.Tensor] = None):
    """Dropout of a hidden state x (b, s_local, h) at (layer, site) of the micro-batch `key`; x itself without one.
    layer: an int, or dropout_layer_key's tensor; layer_rows: the same on the run's device (the hash's, where given).
    Masks "hash": hash_keep_mask (in the graph of a compiled block; through _fused_hash_dropout outside one where the
    state is fused); "keyed": the keyed generator, outside any graph."""
    if state is None or key is None or state.p_hidden <= 0.0:
        return x
    if state.masks == "keyed":
        return _hidden_dropout(x, state, key.host, layer, site)
    if state.positions.shape[0] != x.shape[1]:
        raise ValueError(f"hidden dropout over {x.shape[1]} tokens where the rank holds {state.positions.shape[0]}")
    fn = _fused_hash_dropout if state.fused and not torch.compiler.is_compiling() else _hash_dropout
    return fn(x, state.p_hidden, key.rows, layer if layer_rows is None else layer_rows, site, state.positions,
              state.channel_keys(x.shape[2]))


def _hash_dropout(x, p: float, rows, layer, site: str, positions, channels):
    mask = hash_keep_mask(x.shape, p, rows, layer, site, positions, channels)
    return _Dropout.apply(x, mask, 1.0 / (1.0 - p))


# the hash dropout compiled on its own (one fused kernel, no (b, s, h) int64 temporaries): the embedding's, which runs
# outside the compiled blocks; compiled at its first call, not at import (torch._inductor's import: parallel_layers.
# outside_graphs), and called only where nothing is being compiled
_fused_hash = None


def _fused_hash_dropout(*args):
    global _fused_hash
    if _fused_hash is None:
        before_compiling()
        _fused_hash = torch.compile(_hash_dropout)
    return _fused_hash(*args)


@outside_graphs
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


def attention_dropout_p(state: Optional[DropoutState], key: Optional[DropoutKey]) -> float:
    return 0.0 if state is None or key is None else state.p_attention


@contextmanager
def attention_rng(state: DropoutState, key: DropoutKey, layer: int, device: torch.device):
    """The default generator of `device` seeded for one attention call's dropout (its state restored after).
    layer: an int, or dropout_layer_key's tensor."""
    seed, step, *indices = key.host.tolist()
    layer = _layer_number(layer)
    g = (torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
         if device.type == "cuda" else torch.default_generator)
    saved = g.get_state()
    g.manual_seed(stable_seed("attention-dropout", seed, step, tuple(indices), layer, state.tp_rank, state.cp_rank))
    try:
        yield
    finally:
        g.set_state(saved)
