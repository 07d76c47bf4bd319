"""Conjugate autograd pairs for tensor and sequence parallelism (after Megatron-LM's mappings.py).

Each function moves a tensor into or out of a tensor-parallel region; its backward is the
conjugate collective.  The process group is always passed in (no module globals) and a
group of one returns the input unchanged.

| function                              | forward               | backward              |
|---------------------------------------|-----------------------|-----------------------|
| copy_to_tp_region                     | identity              | all-reduce            |
| reduce_from_tp_region                 | all-reduce            | identity              |
| scatter_to_tp_region (last dim)       | keep own chunk        | all-gather            |
| gather_from_tp_region (last dim)      | all-gather            | keep own chunk        |
| scatter_to_sequence_parallel_region   | keep own seq chunk    | all-gather (seq)      |
| gather_from_sequence_parallel_region  | all-gather (seq)      | reduce-scatter (seq)  |
| reduce_scatter_to_sequence_parallel_region | reduce-scatter (seq) | all-gather (seq)   |
| gather_from_context_parallel_region (dim)  | all-gather (dim)     | reduce-scatter (dim) |

The sequence dimension is dim 1 of (batch, seq, hidden) activations; the context-parallel
gather takes its dimension (2 for the (batch, heads, seq, head_dim) keys and values).
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.profiler import record_function

SEQ_DIM = 1


def _size(group) -> int:
    return 1 if group is None else dist.get_world_size(group)


def _all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    if _size(group) == 1:
        return x
    x = x.contiguous().clone()
    dist.all_reduce(x, group=group)
    return x


def _all_reduce_start(x: torch.Tensor, group, owned: bool = False):
    """Start an all-reduce of x; returns a function that waits and returns the sum (the caller computes
    something else meanwhile).  owned: x is the caller's own fresh tensor, reduced in place (NCCL); otherwise,
    and always on gloo, a copy is."""
    if _size(group) == 1:
        return lambda: x
    gloo = dist.get_backend(group) == "gloo"
    # gloo may drop its reference on its own thread, a free the CPU memory trace misses: it gets a copy,
    # so the caller's tensor is freed where the trace sees it
    x = x.contiguous() if owned and not gloo else x.contiguous().clone()
    work = dist.all_reduce(x, group=group, async_op=True)
    if gloo:
        # gloo runs an asynchronous collective on its own threads, whose copies and frees the CPU memory
        # trace cannot place; on CPU there is no overlap worth having, so finish it here
        work.wait()

    def finish():
        work.wait()
        return x
    return finish


def _reduce_scatter_start(x: torch.Tensor, dim: int, group, owned: bool = False):
    """Start a reduce-scatter of x along dim; returns a function that waits and returns this rank's
    chunk of the sum (gloo, which has no reduce-scatter: an all-reduce of a copy named as gloo's staging,
    then the chunk)."""
    n = _size(group)
    if n == 1:
        return lambda: x
    if x.shape[dim] % n:
        raise ValueError(f"dim {dim} of size {x.shape[dim]} is not divisible by the group size {n}")
    if dist.get_backend(group) == "gloo":
        with _gloo_staging(group, "reduce_scatter_as_all_reduce"):
            finish_all = _all_reduce_start(x, group, owned)
        return lambda: _split(finish_all(), dim, group)
    parts = [p.contiguous() for p in x.chunk(n, dim=dim)]
    out = torch.empty_like(parts[0])
    work = dist.reduce_scatter(out, parts, group=group, async_op=True)

    def finish():
        work.wait()
        return out
    return finish


def _split(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    n = _size(group)
    if n == 1:
        return x
    if x.shape[dim] % n:
        raise ValueError(f"dim {dim} of size {x.shape[dim]} is not divisible by the group size {n}")
    return x.chunk(n, dim=dim)[dist.get_rank(group)].contiguous()


@contextlib.contextmanager
def _gloo_staging(group, what: str):
    """Name the transient per-rank pieces of a gloo collective as gloo's own for the CPU memory
    trace: they are freed when the collective returns, but gloo drops its references on its own
    threads, where the trace (torch.profiler) does not see the free (parallel_layers/host_memory.py
    leaves gloo's buffers out).  Python dispatch modes (op-level selective checkpointing's) are set
    aside meanwhile: under one the trace files these allocations under the mode, not under this
    range, and the pieces are never kept for the backward anyway."""
    if dist.get_backend(group) != "gloo":
        yield
        return
    from torch.utils._python_dispatch import _disable_current_modes
    with _disable_current_modes(), record_function(f"gloo:{what}"):
        yield


def _gather(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    return _gather_start(x, dim, group)()


def _gather_start(x: torch.Tensor, dim: int, group):
    """Start an all-gather along dim; returns a function that waits and returns the result
    (the caller computes something else meanwhile)."""
    if _size(group) == 1:
        return lambda: x
    x = x.contiguous()
    with _gloo_staging(group, "all_gather_parts"):
        parts = [torch.empty_like(x) for _ in range(_size(group))]
        work = dist.all_gather(parts, x, group=group, async_op=True)

    def finish():
        work.wait()
        return torch.cat(parts, dim=dim)
    return finish


def _reduce_scatter(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    # gloo has no reduce_scatter: all-reduce a copy, then keep our chunk (same result, more bytes).
    # The full-size copy is this emulation's staging (NCCL's reduce-scatter has none), named as
    # gloo's own for the CPU memory trace (parallel_layers/host_memory.py leaves those out).
    return _reduce_scatter_start(x, dim, group)()


class _CopyToTP(torch.autograd.Function):
    """forward: identity; backward: all-reduce."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        return _all_reduce(g, ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    """forward: all-reduce; backward: identity."""

    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, g):
        return g, None


class _ScatterToTP(torch.autograd.Function):
    """forward: keep own last-dim chunk; backward: all-gather last dim."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split(x, -1, group)

    @staticmethod
    def backward(ctx, g):
        return _gather(g, -1, ctx.group), None


class _GatherFromTP(torch.autograd.Function):
    """forward: all-gather last dim; backward: keep own chunk."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather(x, -1, group)

    @staticmethod
    def backward(ctx, g):
        return _split(g, -1, ctx.group), None


class _ScatterToSP(torch.autograd.Function):
    """forward: keep own sequence chunk; backward: all-gather sequence."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split(x, SEQ_DIM, group)

    @staticmethod
    def backward(ctx, g):
        return _gather(g, SEQ_DIM, ctx.group), None


class _GatherFromSP(torch.autograd.Function):
    """forward: all-gather sequence; backward: reduce-scatter sequence."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather(x, SEQ_DIM, group)

    @staticmethod
    def backward(ctx, g):
        return _reduce_scatter(g, SEQ_DIM, ctx.group), None


class _ReduceScatterToSP(torch.autograd.Function):
    """forward: reduce-scatter sequence; backward: all-gather sequence."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter(x, SEQ_DIM, group)

    @staticmethod
    def backward(ctx, g):
        return _gather(g, SEQ_DIM, ctx.group), None


class _GatherFromCP(torch.autograd.Function):
    """forward: all-gather along dim (rank order); backward: reduce-scatter along dim.  The
    keys/values of context parallelism: every cp rank's queries read every rank's K/V, so the
    gradient of a rank's K/V shard is the sum of all ranks' contributions to it."""

    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return _gather(x, dim, group)

    @staticmethod
    def backward(ctx, g):
        return _reduce_scatter(g, ctx.dim, ctx.group), None, None


def copy_to_tp_region(x, group):
    return x if _size(group) == 1 else _CopyToTP.apply(x, group)


def reduce_from_tp_region(x, group):
    return x if _size(group) == 1 else _ReduceFromTP.apply(x, group)


def scatter_to_tp_region(x, group):
    return x if _size(group) == 1 else _ScatterToTP.apply(x, group)


def gather_from_tp_region(x, group):
    return x if _size(group) == 1 else _GatherFromTP.apply(x, group)


def scatter_to_sequence_parallel_region(x, group):
    return x if _size(group) == 1 else _ScatterToSP.apply(x, group)


def gather_from_sequence_parallel_region(x, group):
    return x if _size(group) == 1 else _GatherFromSP.apply(x, group)


def reduce_scatter_to_sequence_parallel_region(x, group):
    return x if _size(group) == 1 else _ReduceScatterToSP.apply(x, group)


def gather_from_context_parallel_region(x, group, dim):
    return x if _size(group) == 1 else _GatherFromCP.apply(x, group, dim)
