"""Tensors rebuilt for the backward instead of kept from the forward (Megatron-LM's CheckpointWithoutOutput, by other
means): a ``torch.autograd.graph.saved_tensors_hooks`` pair around the ops that would save them.

    handle = RebuiltForBackward([t], lambda: (make_t(),), t.device.type)
    with handle.hooks():
        y = op_that_saves(t)

The pack hook saves, in place of a target tensor (recognised by identity, and with ``views`` also a view of a
contiguous target: the same storage, inside the target's elements, the same dtype), a small _Rebuilt handle; every
other tensor is saved as it is.  The unpack hook, when a backward first asks for one of them, runs ``rebuild`` under
no_grad and the forward's autocast state (from tensors the graph keeps anyway, and the current weights), once for all
targets, and hands each op its tensor (its view of the rebuilt one); the rebuilt tensors are held only until every
handle packed has been unpacked, so they live through that part of the backward alone.  Unpacked again (a backward
through a retained graph, torch's own zero-bubble weight pass) they are rebuilt again.

The targets are held by weak reference (the handle keeps none of them alive), and only while the context is open: an
op that saved a copy of one (a cast, a padded head) keeps its copy, which the allocator counts in the tests
(tests/test_runtime_mla.py, tests/test_runtime_moe_recompute.py).  Used by multi-head latent attention's up
projections (parallel_layers.model.MLAttention, training.mla_recompute) and a mixture of experts' recompute modules
(training.moe_recompute: the experts' activation, parallel_layers.moe.MoEMLP; the pre-MLP norm,
parallel_layers.model.Block)."""
from __future__ import annotations

import contextlib
import weakref
from typing import Callable, Optional

import torch


class _Rebuilt:
    """What the pack hook saves in place of a target: its handle, the target's index, the slot of this save, and for a
    view of the target its (size, stride, offset from the target's first element)."""
    __slots__ = ("handle", "index", "slot", "view")

    def __init__(self, handle: "RebuiltForBackward", index: int, slot: int, view: Optional[tuple]):
        self.handle, self.index, self.slot, self.view = handle, index, slot, view


class RebuiltForBackward:
    """See the module docstring.  targets: the tensors to rebuild; rebuild(): a tuple of them again, the same values,
    in order (and, with ``views``, the same strides); device_type: whose autocast state the forward ran under."""

    def __init__(self, targets, rebuild: Callable[[], tuple], device_type: str, *, views: bool = False):
        self.targets = [weakref.ref(t) for t in targets]
        # with views: (storage pointer, first element, elements, element size) of each contiguous target
        self.extents = [(t.untyped_storage().data_ptr(), t.storage_offset(), t.numel(), t.dtype)
                        if views and t.is_contiguous() and t.numel() else None for t in targets]
        self.rebuild, self.device_type = rebuild, device_type
        self.autocast = (torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type))
        self.cache: Optional[tuple] = None
        self.slots = 0  # saves packed so far
        self.pending: set[int] = set()  # the slots the backward has not yet asked for since the last rebuild

    def _view_of(self, t, extent) -> Optional[tuple]:
        """(size, stride, offset) of t inside a contiguous target of that extent, or None where t is not in it."""
        ptr, first, n, dtype = extent
        if t.dtype != dtype or not t.numel() or t.untyped_storage().data_ptr() != ptr:
            return None
        lo = t.storage_offset()
        hi = lo + sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if st > 0)
        lo += sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if st < 0)
        return (tuple(t.shape), t.stride(), t.storage_offset() - first) if first <= lo and hi < first + n else None

    def pack(self, t):
        for i, ref in enumerate(self.targets):
            view = None
            if ref() is not t:
                if self.extents[i] is None or ref() is None:
                    continue
                view = self._view_of(t, self.extents[i])
                if view is None:
                    continue
            self.slots += 1
            return _Rebuilt(self, i, self.slots - 1, view)
        return t

    @staticmethod
    def unpack(saved):
        if not isinstance(saved, _Rebuilt):
            return saved
        self = saved.handle
        if self.cache is None or saved.slot not in self.pending:
            enabled, dtype = self.autocast
            with torch.no_grad(), torch.autocast(self.device_type, dtype=dtype, enabled=enabled):
                self.cache = tuple(self.rebuild())
            self.pending = set(range(self.slots))
        out = self.cache[saved.index]
        if saved.view is not None:
            out = out if out.is_contiguous() else out.contiguous()
            size, stride, offset = saved.view
            out = out.as_strided(size, stride, out.storage_offset() + offset)
        self.pending.discard(saved.slot)
        if not self.pending:  # each rebuilt tensor handed to its op's backward: hold them no longer
            self.cache = None
        return out

    @contextlib.contextmanager
    def hooks(self):
        with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
            yield
        self.targets = []  # the ops have saved what they save: no later tensor is one of them
