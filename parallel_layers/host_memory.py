"""Peak memory of a CPU (gloo) run, the analogue of ``torch.cuda.max_memory_allocated``.

The CPU allocator keeps no statistics, but with ``torch.profiler.profile(profile_memory=True)``
every allocation and free it makes on a profiled thread is an event with its address and size
(``ProfiledCPUMemoryReporter`` in c10).  Profiling starts before the model is built, so model
states, optimizer states, gradients, activations and temporaries all come and go inside the
trace; replaying the trace's own allocations and frees gives the live bytes at every moment, and
the largest inside the training steps is the step's peak.  Allocations made before the trace
began (the interpreter, torch, the process group) are not in it, as on cuda.

Phases are marked with ``record_function`` ranges, so the report says in which step and phase
(forward/backward, or the reduction and optimizer step after it) the peak fell.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from typing import Optional

from torch.profiler import ProfilerActivity, profile, record_function

PHASE_PREFIX = "parplan.memory."


class CpuMemoryTrace:
    def __init__(self) -> None:
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self.result: Optional[dict] = None

    def __enter__(self) -> "CpuMemoryTrace":
        self._prof.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._prof.__exit__(*exc)
        if exc[0] is None:
            self.result = self._peak()
        self._prof = None  # its event tree (every allocation of the run) is read; let it go

    @staticmethod
    @contextmanager
    def phase(name: str):
        """Mark a phase (e.g. ``step3.fwd_bwd``); cheap when no trace is running."""
        with record_function(PHASE_PREFIX + name):
            yield

    def _peak(self) -> dict:
        from torch._C._profiler import _EventType

        phases, allocs = [], []
        # (node, not what the job holds on a GPU: inside a c10d/gloo collective, or a CPU matmul's or in-place op's
        # scratch): the flag is passed down the tree rather than looked up per allocation, and an allocation's owner
        # is named only where it is live at the peak (_live)
        # (scratch: the (time, address) of allocations the outermost matmul or promoting in-place op above
        # (_SCRATCH_OPS) made and freed again inside itself, which holds those of every such op nested in it; None
        # outside any)
        stack = [(n, False, None) for n in self._prof.profiler.kineto_results.experimental_event_tree()]
        allocation = _EventType.Allocation
        while stack:
            node, in_coll, scratch = stack.pop()
            if node.tag == allocation:
                ex = node.extra_fields
                if ex.device.type == "cpu":
                    allocs.append((node.start_time_ns, ex.alloc_size, ex.ptr, node,
                                   in_coll or (scratch is not None and (node.start_time_ns, ex.ptr) in scratch)))
                continue
            name = node.name
            if name.startswith(PHASE_PREFIX):
                phases.append((node.start_time_ns, node.end_time_ns, name[len(PHASE_PREFIX):]))
            inner = in_coll or name.startswith(_COLLECTIVE_PREFIXES)
            if scratch is None and name in _SCRATCH_OPS:
                scratch = _op_scratch(node, allocation)
            stack.extend((c, inner, scratch) for c in node.children)
        allocs.sort(key=lambda a: a[0])  # stable: events of one timestamp keep the walk's order
        phases.sort()
        if not allocs or not phases:
            empty = {"allocated": None, "phase": None, "at_start": None, "live_at_peak": []}
            return {**empty, "without_collective_buffers": empty}
        out = _replay(allocs, phases, skip_collectives=False)
        gpu_like = _replay(allocs, phases, skip_collectives=True)
        out["without_collective_buffers"] = {k: gpu_like[k] for k in ("allocated", "phase", "live_at_peak")}
        return out

    def write(self, directory: str, rank: int) -> str:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"rank{rank}.json")
        with open(path, "w") as f:
            json.dump(self.result, f, indent=1)
        return path


def trace_if(enabled: bool):
    """A CpuMemoryTrace when enabled, else a no-op context with ``result`` None."""
    if enabled:
        return CpuMemoryTrace()
    return _NoTrace()


class _NoTrace:
    result = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


GENERIC = ("aten::empty", "aten::empty_strided", "aten::empty_like", "aten::zeros", "aten::zeros_like",
           "aten::new_empty", "aten::new_zeros", "aten::to", "aten::_to_copy", "aten::copy_", "aten::clone",
           "aten::contiguous", "aten::detach", "aten::view", "aten::reshape", "aten::resize_")


def _owner(node, depth: int = 3) -> str:
    """The allocating op and up to ``depth`` callers above it that are not generic allocation/copy ops
    (e.g. ``FSDP::post_backward_reduce < aten::empty``)."""
    names, n = [], node.parent
    while n is not None and len(names) < depth:
        if not names or n.name not in GENERIC:
            names.append(n.name)
        n = n.parent
    return " < ".join(reversed(names)) or "?"


def _replay(allocs, phases, skip_collectives: bool) -> dict:
    """Live bytes over the trace, from its allocations and frees; the peak inside the phases.
    skip_collectives: leave out what c10d's collectives allocate inside themselves (gloo's staging
    buffers for reduce-scatter and all-gather; NCCL writes into the caller's tensors), a CPU matmul's
    fp32 scratch (_MATMUL_OPS) and an in-place op's dtype-promotion copies (_PROMOTING_INPLACE_OPS), i.e. what the
    same job holds on a GPU.  allocs: (time, size, address, op name or profiler node, in a
    collective), frees with size <= 0."""
    first = phases[0][0]
    total = at_start = peak = 0
    peak_i, peak_t = -1, first
    for i, total, t in _live_totals(allocs, skip_collectives):
        if t < first:
            at_start = total
        elif total > peak:
            peak, peak_i, peak_t = total, i, t
    peak = max(peak, at_start)
    peak_live = {}
    if peak_i >= 0:  # the blocks live at the peak: the same replay, stopped there
        live = {}
        for i, _, _ in _live_totals(allocs, skip_collectives, live):
            if i == peak_i:
                peak_live = live
                break
    where = [name for s, e, name in phases if s <= peak_t <= e]
    return {"allocated": int(peak), "phase": where[-1] if where else None, "at_start": int(at_start),
            "live_at_peak": _live(peak_live.values())}


def _live_totals(allocs, skip_collectives: bool, live: Optional[dict] = None):
    """(index, live bytes after it, time) for each allocation or free; `live` (address -> (size, op)) is
    kept up to date as the generator runs."""
    live = {} if live is None else live
    total = 0
    for i, (t, size, ptr, op, collective) in enumerate(allocs):
        if size > 0:
            # The reporter only sees frees on profiled threads; a block released on another
            # thread (gloo drops a collective's tensors on its own) shows up when its address is
            # handed out again, and no two live blocks share an address.
            total -= live.pop(ptr, (0, None))[0]
            if skip_collectives and collective:
                continue
            live[ptr] = (size, op)
            total += size
        elif ptr in live:
            total -= live.pop(ptr)[0]
        yield i, total, t


_COLLECTIVE_PREFIXES = ("c10d::", "gloo:")

# A 16-bit matmul on a CPU allocates scratch inside aten::mm and frees it there: without native bf16 instructions
# (no AVX512-BF16 or AMX) an fp32 buffer of the output's size, 134 MB beside the 67 MB bf16 logits of a 1,024-token,
# 32,768-vocabulary head on one of this project's 2-core Xeons; with AMX 0.5-1.0 MiB beside an 8 MiB output on
# another (both 2026-11-28); where oneDNN has no 16-bit path (AVX2 only) cpu_matmul's fp32 copies of the operands and
# the product, made by the ops the matmul calls; none on a GPU, whose matmuls write their output directly.  The
# GPU-like replay leaves them out.
_MATMUL_OPS = frozenset({"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addbmm",
                         "parplan::fp32_math"})  # cpu_matmul.SCOPE

# An in-place elementwise op whose operands differ in dtype (master-weights' main_grad.add_(the 16-bit gradient),
# precision.accumulate_main_grad) promotes them on a CPU through a temporary copy in the common dtype, made and freed
# inside the op: TensorIterator's compute_types creates such temporaries "for CPU operations" only (`if (common_device
# == kCPU)`, aten/src/ATen/TensorIterator.cpp); a CUDA kernel casts each element as it reads it.  One of them (the
# fp32 copy of an 11-16 MiB weight's gradient) sat at the peak of every data-parallel master-weights plan of the CPU
# memory suite (2026-11-25).  The GPU-like replay leaves them out, as a matmul's scratch.
_PROMOTING_INPLACE_OPS = frozenset({"aten::add_", "aten::sub_", "aten::mul_", "aten::div_", "aten::addcmul_",
                                    "aten::addcdiv_", "aten::lerp_"})
_SCRATCH_OPS = _MATMUL_OPS | _PROMOTING_INPLACE_OPS


def _op_scratch(node, allocation) -> frozenset:
    """(time, address) of each allocation anywhere below a scratch op (_SCRATCH_OPS) that is freed again below it."""
    events = []
    stack = list(node.children)
    while stack:
        c = stack.pop()
        if c.tag == allocation:
            events.append((c.start_time_ns, c.extra_fields.alloc_size, c.extra_fields.ptr))
        else:
            stack.extend(c.children)
    events.sort(key=lambda e: (e[0], e[1] <= 0))  # an allocation before a free of the same instant
    open_at: dict = {}  # address -> time of its allocation not yet freed
    scratch = set()
    for t, size, ptr in events:
        if size > 0:
            open_at[ptr] = t
        elif ptr in open_at:
            scratch.add((open_at.pop(ptr), ptr))
    return frozenset(scratch)


def _live(blocks, top: int = 16) -> list[dict]:
    """Live blocks (size, allocating op: its name, or its profiler node, named by _owner) summed per (op,
    block size), largest first."""
    groups: dict = {}
    for size, op in blocks:
        if not isinstance(op, str):
            op = _owner(op)
        g = groups.setdefault((op, size), [0, 0])
        g[0] += size
        g[1] += 1
    rows = sorted(groups.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"op": op, "block_bytes": size, "count": n, "bytes": total} for (op, size), (total, n) in rows]
