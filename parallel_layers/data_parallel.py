"""Data parallelism by ``parallel.zero_stage``, plus the gradient fix-ups TP and PP need.

0: replicated AdamW, gradients all-reduced and averaged over the dp x cp group (flattened into buckets
   of at most ``BUCKET_BYTES`` to cut per-message latency; a gradient of that size or more is reduced
   in place, alone).
1: ``ShardedAdamW``: gradients all-reduced and averaged over dp, each dp rank keeps AdamW states for
   its 1/dp of the parameters (``partition_rows``: a tensor is cut by rows where a rank's share
   ends) and steps only those, then broadcasts them (ZeRO-1).
2: as 1, but each gradient (or row slice) is only *reduced* to its owner, so non-owners drop it
   after the reduction (ZeRO-2; during the backward full gradients still exist).  A mixture of experts'
   expert weights have a ShardedAdamW of their own over their expert-data-parallel group (parallel_layers.train
   build_optimizer), which reduces them so (to their owner in that group) under ZeRO-2.
For 0-2 ``GradReduction`` starts these reductions during the last backward of the step, bucket by
bucket as the gradients become final (PyTorch DDP's bucketed all-reduce, Megatron-LM's
--overlap-grad-reduce), or runs them all after it.  ZeRO-1/2 then average the cp replicas apart.
3: FSDP2 ``fully_shard(mesh=mesh["dp"])`` per block and per stage.  On gloo FSDP2 has summed
   instead of averaged (pytorch/pytorch#162338): ``fsdp_grad_correction`` measures what this
   torch does with a probe and the trainer divides by the measured factor.  A mixture of experts' expert weights
   are a unit of their own per MoE layer over their expert-data-parallel mesh (``shard_experts``: torchtitan's
   layout), reduce-scattered there as sums and divided by the trainer.

Before any of that: tied embedding/head copies on different pipeline ranks get their
gradients summed over the pp group, and parameters replicated over TP but fed a sequence
shard (SP) get theirs summed over the tp group.
"""
from __future__ import annotations

import math
import weakref
from collections import deque
from typing import Callable, NamedTuple, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from parallel_layers.mappings import _gloo_staging
from parallel_layers.model import iter_shard_specs
from parallel_layers.precision import clear_grads, grad_of, register_weight_pass_hook, set_grad

BUCKET_BYTES = 25 * 2**20


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The rank's local data of a DTensor (FSDP2) or the tensor itself."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def _group_size(group) -> int:
    return 1 if group is None else dist.get_world_size(group)


def _start_on_copy(t: torch.Tensor, group, what: str, collective) -> tuple:
    """(work, the tensor reduced): `collective(tensor)` started on a staging copy of `t` named as gloo's on gloo
    (_gloo_staging), on `t` itself elsewhere.  gloo may drop its reference to the tensor it was handed on its own
    worker thread after the wait returns, a free the CPU memory trace misses until the address comes back (a 13 MB
    bucket then "lived" into the next step: one CI run read -15.7 %; 31 MiB of ZeRO-2's step-1 gradients at step 2's
    peak, 2026-12-03), so gloo is never handed a tensor of ours.  The caller copies the result back where it was a copy."""
    with _gloo_staging(group, what):
        sent = t.clone() if dist.get_backend(group) == "gloo" else t
        return collective(sent), sent


def _all_reduce_start(flat: torch.Tensor, group, divide: float) -> Callable[[], None]:
    """Start an in-place sum of `flat` over `group`; the returned function waits and divides by `divide`."""
    work, reduced = _start_on_copy(flat, group, "all_reduce_bucket",
                                   lambda t: dist.all_reduce(t, group=group, async_op=True))

    def finish() -> None:
        nonlocal reduced
        work.wait()
        if reduced is not flat:
            flat.copy_(reduced)
        reduced = None
        if divide != 1:
            flat.div_(divide)
    return finish


def bucket_all_reduce_start(tensors: list[torch.Tensor], group, divide: float) -> Callable[[], None]:
    """Start the sum over `group` of one bucket: a lone contiguous tensor in place, else a flat copy of them
    all; the returned function waits, divides by `divide` and copies the result back."""
    if not tensors:
        return lambda: None
    if len(tensors) == 1 and tensors[0].is_contiguous():
        return _all_reduce_start(tensors[0], group, divide)
    flat = torch.cat([t.reshape(-1) for t in tensors])
    finish_flat = _all_reduce_start(flat, group, divide)

    def finish() -> None:
        nonlocal flat
        finish_flat()
        off = 0
        for t in tensors:
            t.copy_(flat[off:off + t.numel()].view_as(t))
            off += t.numel()
        flat = None
    return finish


def make_buckets(tensors: list[torch.Tensor], bucket_bytes: Optional[int] = None) -> list[list[int]]:
    """Indices of `tensors` grouped in order into buckets of at most `bucket_bytes` (``BUCKET_BYTES``); a
    contiguous tensor of that size or more is a bucket of its own (reduced in place, no copy)."""
    bucket_bytes = BUCKET_BYTES if bucket_bytes is None else bucket_bytes
    buckets, cur, size = [], [], 0
    for i, t in enumerate(tensors):
        nbytes = t.numel() * t.element_size()
        if nbytes >= bucket_bytes and t.is_contiguous():
            if cur:
                buckets.append(cur)
            buckets.append([i])
            cur, size = [], 0
            continue
        if cur and size + nbytes > bucket_bytes:
            buckets.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += nbytes
    if cur:
        buckets.append(cur)
    return buckets


def all_reduce_bucketed(tensors: list[torch.Tensor], group, average: bool) -> None:
    """In-place all-reduce (sum, or mean) of tensors, packed into flat buckets (``make_buckets``), one
    bucket at a time.  So the flat copy never exceeds ``BUCKET_BYTES`` (the memory model counts two of
    them, cost_models.memory._other_bytes), where packing the largest gradient would copy it whole
    (2.1 GB for llama3-8b's fp32 embedding gradient at tp 1)."""
    n = _group_size(group)
    if n == 1 or not tensors:
        return
    for idx in make_buckets(tensors):
        bucket_all_reduce_start([tensors[i] for i in idx], group, n if average else 1)()


def sync_tp_partial_grads(stage_modules: list[nn.Module], tp_group) -> None:
    """Sum over TP the gradients of TP-replicated parameters each TP rank holds a part of (ShardSpec.sp_partial_grad:
    those that saw only a sequence shard under SP, and the q/k norms, which see the rank's own heads)."""
    grads = [local_tensor(grad_of(p)) for m in stage_modules for _, p, s in iter_shard_specs(m)
             if s.sp_partial_grad and grad_of(p) is not None]
    all_reduce_bucketed(grads, tp_group, average=False)


def sync_tied_embedding_grads(stage_modules: list[nn.Module], group) -> None:
    """Sum the gradients of the embedding and of its copy used by the head: over `group`, the two pipeline
    ends that hold them (mesh.embedding_group: Megatron's embedding group), or on this rank alone where it
    holds both (ZB-V puts the first and last stage on pp rank 0: group None).  Ranks holding neither
    take no part."""
    emb = head = None
    for m in stage_modules:
        if getattr(m, "first", False):
            emb = m.embed.weight
        if getattr(m, "separate_tied_head", False):
            head = m.head.weight
    held = [p for p in (emb, head) if p is not None]
    if not held:
        return
    if any(grad_of(p) is None for p in held):
        raise RuntimeError("tied embedding has no gradient after backward")
    # summed in the gradient's own storage: a sum buffer would be an embedding-sized copy after the
    # backward (2.1 GB for a 128K x 4096 fp32 gradient), which the memory model does not count
    buf = local_tensor(grad_of(held[0]))
    if len(held) == 2:
        buf.add_(local_tensor(grad_of(held[1])))
    if group is not None and _group_size(group) > 1:
        dist.all_reduce(buf, group=group)
    for p in held[1:]:
        local_tensor(grad_of(p)).copy_(buf)


def partition_rows(shapes: list[tuple[int, ...]], n: int) -> list[list[tuple[int, int, int]]]:
    """Split parameters evenly over n ranks, as the flat buffer of Megatron's distributed optimizer or
    DeepSpeed's ZeRO is split, but at row (dim 0) boundaries: the parameters laid end to end in order are
    cut at every multiple of total / n elements, each cut moved to the nearest row of the tensor it falls
    in.  Returns, per parameter, its pieces as (rank, first row, end row); a rank holds total / n elements
    within one row of each of its cuts.  A 0-d tensor is one row."""
    sizes = [(s[0] if s else 1, math.prod(s[1:]) if s else 1) for s in shapes]
    total = sum(r * w for r, w in sizes)
    cuts = [round(k * total / n) for k in range(n + 1)]
    out, off = [], 0
    for rows, width in sizes:
        pieces, start = [], 0
        for rank in range(n):
            if cuts[rank + 1] <= off or cuts[rank] >= off + rows * width:
                continue
            end = rows if cuts[rank + 1] >= off + rows * width else round((cuts[rank + 1] - off) / width)
            if end > start:
                pieces.append((rank, start, end))
                start = end
        assert start == rows or rows * width == 0, (rows, width, pieces)
        out.append(pieces)
        off += rows * width
    return out


class Piece(NamedTuple):
    """Rows [start, end) of a parameter, stepped by dp rank ``rank`` (``global_rank`` in the world); ``leaf`` is
    what this rank's optimizer steps (the parameter itself when whole, a row-slice view when split), None on
    the other ranks."""
    param: nn.Parameter
    rank: int
    global_rank: int
    start: int
    end: int
    leaf: Optional[nn.Parameter]


class ShardedAdamW:
    """ZeRO-1/2: the parameters' optimizer states split evenly over the dp ranks (``partition_rows``: a
    parameter that crosses a rank boundary is split by rows, so the rank given the embedding does not hold
    its states whole).  Each rank runs AdamW on its pieces -- a parameter it owns whole, or a row-slice
    view of one (``pieces``) -- and broadcasts them after the step.  make_optim (default
    ``torch.optim.AdamW``) builds the rank's optimizer over its pieces: a ``MasterAdamW`` for the
    master-weights recipes or optimizer offload, so fp32 masters and host states exist only for those."""

    def __init__(self, params: list[nn.Parameter], dp_group, stage: int, make_optim=None, overlap_gather: bool = False,
                 **adamw_kwargs):
        self.params = params
        # broadcast the stepped pieces asynchronously; the next forward waits for each part's (wait_for)
        self.overlap_gather = overlap_gather
        self._gathers: dict[int, list] = {}
        self.dp_group, self.stage = dp_group, stage
        n = _group_size(dp_group)
        self.dp_rank = 0 if n == 1 else dist.get_rank(dp_group)
        world = [dist.get_global_rank(dp_group, r) for r in range(n)] if n > 1 else \
            [dist.get_rank() if dist.is_initialized() else 0]
        self.pieces: list[Piece] = []
        self.split: set[int] = set()  # id() of the parameters stepped in pieces
        for p, parts in zip(params, partition_rows([tuple(p.shape) for p in params], n)):
            if len(parts) > 1:
                self.split.add(id(p))
            for r, a, b in parts:
                leaf = None
                if r == self.dp_rank:
                    leaf = p if len(parts) == 1 else nn.Parameter(p.data[a:b], requires_grad=p.requires_grad)
                self.pieces.append(Piece(p, r, world[r], a, b, leaf))
        self.local = [pc for pc in self.pieces if pc.leaf is not None]
        self._pieces_of: dict[int, list[Piece]] = {}
        for pc in self.pieces:
            self._pieces_of.setdefault(id(pc.param), []).append(pc)
        self._piece_grads: dict[int, torch.Tensor] = {}  # ZeRO-2: id(leaf) -> its reduced rows
        make_optim = make_optim or (lambda ps: torch.optim.AdamW(ps, **adamw_kwargs))
        self.optim = make_optim([pc.leaf for pc in self.local]) if self.local else None

    def is_split(self, p) -> bool:
        return id(p) in self.split

    def reduce_gradients(self) -> None:
        """Average the gradients over dp after the backward: all-reduced (ZeRO-1), or each piece reduced to
        its owner and dropped by the others, parameter by parameter (ZeRO-2)."""
        n = _group_size(self.dp_group)
        if n == 1:
            return
        if self.stage == 1:
            all_reduce_bucketed([grad_of(p) for p in self.params if grad_of(p) is not None], self.dp_group, average=True)
            return
        for p in self.params:
            self.reduce_start([p], n)()

    def reduce_start(self, params: list[nn.Parameter], divide: float) -> Callable[[], None]:
        """Start the dp reduction of these parameters' gradients and return what finishes it (dividing by
        `divide`): ZeRO-1 one bucket all-reduced; ZeRO-2 each piece reduced to its owner, after which the
        owner keeps its rows and the other ranks drop the gradient."""
        grads = [grad_of(p) for p in params]
        if self.stage == 1:
            return bucket_all_reduce_start([g for g in grads if g is not None], self.dp_group, divide)
        works = []
        for p, grad in zip(params, grads):
            if grad is None:
                continue
            for pc in self._pieces_of[id(p)]:
                rows = grad[pc.start:pc.end] if self.is_split(p) else grad
                work, sent = _start_on_copy(rows, self.dp_group, "reduce_rows", lambda t, dst=pc.global_rank:
                                            dist.reduce(t, dst=dst, group=self.dp_group, async_op=True))
                works.append((work, pc, rows, sent))

        def finish() -> None:
            for work, pc, rows, sent in works:
                work.wait()
                if pc.rank == self.dp_rank:
                    if sent is not rows:
                        rows.copy_(sent)
                    rows /= divide
                    if pc.leaf is not pc.param:  # only these rows are this rank's: a copy outlives the gradient
                        self._piece_grads[id(pc.leaf)] = rows.clone()
            works.clear()
            for p, grad in zip(params, grads):
                if grad is not None and not any(pc.leaf is p for pc in self._pieces_of[id(p)]):
                    set_grad(p, None)  # ZeRO-2: only the owner keeps the reduced gradient
        return finish

    def held_piece_grads(self) -> list[tuple[torch.Tensor, nn.Parameter]]:
        """ZeRO-2: (reduced rows, their parameter) for the split parameters' rows this rank owns (gradient
        clipping counts them: the parameter itself no longer has a gradient here)."""
        return [(self._piece_grads[id(pc.leaf)], pc.param) for pc in self.local if id(pc.leaf) in self._piece_grads]

    def full_reduced_grads(self, whole: bool = False) -> dict[int, torch.Tensor]:
        """ZeRO-2, for tests: every split parameter's whole reduced gradient, assembled over the dp group
        (a collective: every dp rank calls it; each owner contributes its rows); whole: every parameter's, the ones
        a rank owns whole too (a mixture of experts' expert weights, dumped on every rank holding them)."""
        out = {}
        for p in self.params:
            if not self.is_split(p) and not whole:
                continue
            full = torch.zeros_like(p, dtype=torch.float32 if hasattr(p, "main_grad") else p.dtype)
            for pc in self.local:
                if pc.param is not p:
                    continue
                if pc.leaf is p:
                    if grad_of(p) is not None:
                        full.copy_(grad_of(p))
                elif id(pc.leaf) in self._piece_grads:
                    full[pc.start:pc.end] = self._piece_grads[id(pc.leaf)]
            if _group_size(self.dp_group) > 1:
                dist.all_reduce(full, group=self.dp_group)
            out[id(p)] = full
        return out

    def _bind_grads(self) -> None:
        for p, _, _, a, b, leaf in self.local:
            if leaf is p:
                continue
            if self.stage == 2:
                rows = self._piece_grads.pop(id(leaf), None)
            else:
                g = grad_of(p)
                rows = None if g is None else g[a:b]
            if hasattr(p, "main_grad"):
                leaf.main_grad = rows  # MasterAdamW reads it (precision.grad_of)
            else:
                leaf.grad = rows

    def step(self) -> None:
        self.wait_gathers()  # the last step's broadcasts must land before this step writes their sources
        if self.optim is not None:
            self._bind_grads()
            self.optim.step()
            for p, *_, leaf in self.local:  # the row views would keep the whole gradient alive
                if leaf is not p:
                    leaf.grad = None
                    if hasattr(p, "main_grad"):
                        leaf.main_grad = None
        if _group_size(self.dp_group) > 1:
            with torch.no_grad():
                for p, _, g, a, b, _ in self.pieces:
                    work = dist.broadcast(p.data[a:b] if self.is_split(p) else p.data, src=g, group=self.dp_group,
                                          async_op=self.overlap_gather)
                    if self.overlap_gather:
                        self._gathers.setdefault(id(p), []).append(work)

    def wait_for(self, module: nn.Module) -> None:
        """Wait for the gathers of the stepped parameters of `module` still in flight (overlap_gather: the next
        forward calls this with each part before it uses its parameters; on CUDA the wait is the stream's)."""
        if self._gathers:
            for p in module.parameters():
                for work in self._gathers.pop(id(p), ()):
                    work.wait()

    def wait_gathers(self) -> None:
        """Wait for every gather still in flight (before a checkpoint reads the parameters, and at the end)."""
        for works in self._gathers.values():
            for work in works:
                work.wait()
        self._gathers.clear()

    def zero_grad(self, set_to_none: bool = True) -> None:
        clear_grads(self.params)
        self._piece_grads.clear()


class GradReduction:
    """The data-parallel reduction of a step's gradients, started during the backward where ``overlap``.

    ``start(params, divide)`` starts the reduction of one bucket of parameters' gradients and returns what
    finishes it (``bucket_all_reduce_start`` for ZeRO-0, ``ShardedAdamW.reduce_start`` for ZeRO-1/2).  A
    post-accumulate-grad hook on every parameter counts its gradient's accumulations in the step (and a
    weight-pass hook, precision.register_weight_pass_hook, those of the zero-bubble schedules' queued weight
    pass, which accumulates outside autograd: layers.WeightGradStore); one whose count reaches the step's
    total is final, and a bucket whose parameters are all final starts at
    once, while the backward goes on (PyTorch DDP's Reducer; Megatron-LM's --overlap-grad-reduce).  At
    most ``max_pending`` buckets are in flight: before one more starts (and makes its flat copy) the oldest
    finishes, so at most two flat copies of ``BUCKET_BYTES`` live at once (what the memory model counts).  ``finish`` (after the
    backward) starts what is left and finishes everything.

    The counts and the order in which gradients become final are learned in the first step, whose
    reduction runs after its backward; the buckets follow that order (as DDP rebuilds its buckets after
    its first iteration), taken from the group's first rank so that every rank starts the same
    collectives in the same order.  A parameter used twice in a micro-batch (a tied embedding on one
    stage), a recompute, several micro-batches or pipeline chunks all just change the count.  The hooks
    run after the master-weights hook that folds ``p.grad`` into ``main_grad`` (registered first), and
    fire for a weight whose fused GEMM wrote ``main_grad`` itself (its ``p.grad`` stays None).  Not where torch's
    own zero-bubble weight pass runs (stage_backward_weight assigns the gradients outside autograd's
    accumulation and runs no hook: FSDP2, which reduces its own shards anyway)."""

    def __init__(self, params: list[nn.Parameter], start: Callable, divide: float, order_group,
                 overlap: bool = True, max_pending: int = 2, bucket_bytes: Optional[int] = None,
                 late: tuple = ()):
        self.params = list(params)
        self.late = list(late)  # reduced by the caller with reduce_now, after other sums complete them
        self.bucket_bytes = bucket_bytes
        self.start, self.divide, self.order_group = start, divide, order_group
        self.overlap, self.max_pending = overlap, max_pending
        self.expected: Optional[dict[int, int]] = None  # id(p) -> accumulations per step, once learned
        self.buckets: Optional[list[list[nn.Parameter]]] = None
        self._count: dict[int, int] = {}
        self._final_at: dict[int, int] = {}
        self._seq = 0
        self._ready: set[int] = set()
        self._next = 0
        self._pending: deque = deque()
        self._active = False
        # the last step's buckets, and how many of them started before finish() (during the backward)
        self.last_step: dict = {"buckets": 0, "started_in_backward": 0}
        # the hook holds this object weakly: a tensor's hooks are not traversed by the garbage collector, so a
        # bound method would keep the reduction and every parameter alive after the run (found: the CPU memory
        # benchmark's 30 jobs in one process grew to 6 GB a rank)
        me = weakref.ref(self)

        def hook(p, me=me):
            red = me()
            if red is not None:
                red._hook(p)
        for p in self.params:
            p.register_post_accumulate_grad_hook(hook)
            register_weight_pass_hook(p, hook)

    def begin_step(self) -> None:
        self._count.clear()
        self._final_at.clear()
        self._seq = 0
        self._ready.clear()
        self._next = 0
        self._pending.clear()
        self._active = self.overlap and self.buckets is not None

    def _hook(self, p) -> None:
        k = id(p)
        c = self._count.get(k, 0) + 1
        self._count[k] = c
        if not self._active:
            self._seq += 1
            self._final_at[k] = self._seq  # the place of its last accumulation so far
            return
        if c == self.expected.get(k):
            self._ready.add(k)
            self._start_ready()

    def _start_ready(self) -> None:
        while self._next < len(self.buckets) and all(id(p) in self._ready for p in self.buckets[self._next]):
            self._launch(self.buckets[self._next])

    def _launch(self, bucket) -> None:
        while len(self._pending) >= self.max_pending:  # before the new bucket's flat copy exists
            self._pending.popleft()()
        self._pending.append(self.start(bucket, self.divide))
        self._next += 1

    def _learn(self) -> None:
        with_grads = [p for p in self.params if grad_of(p) is not None]
        # gradients no hook saw (torch's zero-bubble weight pass assigns them) go last, in parameter order
        last = self._seq + 1
        order = sorted(range(len(with_grads)), key=lambda i: self._final_at.get(id(with_grads[i]), last))
        if _group_size(self.order_group) > 1:  # every rank buckets as the group's first rank does
            t = torch.tensor(order, dtype=torch.int64)
            if dist.get_backend(self.order_group) == "nccl":
                t = t.cuda()
            dist.broadcast(t, src=dist.get_global_rank(self.order_group, 0), group=self.order_group)
            order = t.tolist()
        ordered = [with_grads[i] for i in order]
        self.expected = {id(p): self._count.get(id(p), 0) for p in ordered}
        self.buckets = [[ordered[i] for i in idx]
                        for idx in make_buckets([grad_of(p) for p in ordered], self.bucket_bytes)]

    def reduce_now(self, params: list[nn.Parameter]) -> None:
        """Reduce these parameters' gradients (ones this object does not track) now, bucketed in order."""
        params = [p for p in params if grad_of(p) is not None]
        for idx in make_buckets([grad_of(p) for p in params], self.bucket_bytes):
            self.start([params[i] for i in idx], self.divide)()

    def finish(self) -> None:
        """Complete the step's reduction: the buckets not yet started, then every one in flight."""
        if self.buckets is None:
            self._learn()
        elif not self._active:  # after the backward: the gradients now are those the buckets were built from
            held = {id(p) for p in self.params if grad_of(p) is not None}
            if held != {id(p) for b in self.buckets for p in b}:
                raise RuntimeError("the parameters with gradients differ from the first step's; the data-parallel "
                                   "reduction's buckets were built from those")
        else:
            missing = [k for k, n in self.expected.items() if self._count.get(k, 0) != n]
            missing += [k for k in self._count if k not in self.expected]  # a gradient the first step did not have
            if missing:
                raise RuntimeError(f"{len(missing)} gradients accumulated a different number of times than in the "
                                   "first step; the overlapped reduction cannot tell when they are final "
                                   "(run with --overlap-grad-reduce off)")
        self.last_step = {"buckets": len(self.buckets), "started_in_backward": self._next if self._active else 0}
        while self._next < len(self.buckets):
            self._launch(self.buckets[self._next])
        while self._pending:
            self._pending.popleft()()
        self._active = False


def apply_fsdp(stage_modules: list[nn.Module], dp_mesh, per_block: bool = True, mp_policy=None,
               offload_policy=None, reshard_after_forward: bool = True, expert_mesh=None) -> None:
    """FSDP2 over the dp mesh: each block is its own unit (per_block), the stage (embedding, head)
    the root.  mp_policy: a ``MixedPrecisionPolicy`` (the master-weights recipes) or None.
    reshard_after_forward False (inside a pipeline): a unit gathered by its first forward stays gathered to the
    step's last backward, as torchtitan's default does whenever pp > 1 ("to avoid per-microbatch all-gathers");
    torch.distributed.pipelining already keeps it gathered after every backward but the last
    (set_reshard_after_backward), and a forward that resharded would make each micro-batch's backward gather
    again.  expert_mesh (a mixture of experts): each MoE block's experts (moe.GroupedExperts) a unit of their own
    over their expert-data-parallel mesh (mesh.expert_data_parallel_mesh), inside the block's, as torchtitan's
    apply_fsdp shards ``transformer_block.moe.experts`` over its edp_mesh (torchtitan/models/llama4/infra/
    parallelize.py); see shard_experts."""
    from torch.distributed.fsdp import fully_shard

    # left to FSDP2 otherwise: its default reshards every unit but the root, which stays gathered from the forward
    # to the backward (an explicit True would reshard the root too, and gather it again for the backward)
    kw = {} if reshard_after_forward else {"reshard_after_forward": False}
    if mp_policy is not None:
        kw["mp_policy"] = mp_policy
    if offload_policy is not None:
        kw["offload_policy"] = offload_policy
    for m in stage_modules:
        if expert_mesh is not None:
            for block in m.blocks:
                if hasattr(block.mlp, "grouped"):
                    shard_experts(block.mlp.grouped, expert_mesh, **kw)
        if per_block:
            for block in m.blocks:
                fully_shard(block, mesh=dp_mesh, **kw)
        fully_shard(m, mesh=dp_mesh, **kw)


def shard_experts(experts: nn.Module, expert_mesh, mp_policy=None, **kw) -> None:
    """One MoE layer's experts (E / ep of them on this rank) as an FSDP2 unit over their expert-data-parallel mesh,
    torchtitan's layout: sharded on dim 1 (ffn rows of gate / up, hidden rows of down), as torchtitan does where
    efsdp x ep exceeds the experts (its ``_experts_shard_placement_fn``), here always where the mesh divides that dim
    (so an expert is sliced, never split between ranks, and a checkpoint keys each whole; FSDP2's Shard(1) needs the
    even split) and on dim 0 elsewhere.  The reduce-scatter sums (set_force_sum_reduction_for_comms: no average,
    which gloo got wrong, pytorch/pytorch#162338; divide factor 1) and train.reduce_expert_gradients divides the
    summed shards as every expert gradient is divided (train.expert_divide: the dp x cp replicas), where torchtitan
    sets the same factor on the unit (set_gradient_divide_factor, "consistent with data").  The block's unit casts
    the tokens already, so the experts' unit casts no inputs (the routing probabilities stay fp32)."""
    from dataclasses import replace as _replace

    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    n = expert_mesh.size(expert_mesh.ndim - 1)  # the shard dim's ranks (a hybrid mesh's inner dim)

    def placement(p):
        return Shard(1) if p.dim() > 1 and p.shape[1] % n == 0 else Shard(0)
    if mp_policy is not None:
        kw["mp_policy"] = _replace(mp_policy, cast_forward_inputs=False)
    fully_shard(experts, mesh=expert_mesh, shard_placement_fn=placement, **kw)
    experts.set_force_sum_reduction_for_comms(True)
    experts.set_gradient_divide_factor(1.0)


def fsdp_grad_correction(dp_mesh, device, shard_mesh=None) -> float:
    """The factor by which FSDP2's reduced gradients exceed the dp average on this backend
    (1.0 when correct; dp when it sums, as gloo did in pytorch/pytorch#162338).  Measured with a
    probe: rank r's gradient is r+1 everywhere, so the average is (n+1)/2.  shard_mesh: the mesh FSDP2 shards over
    where it is not dp_mesh (hybrid sharding's 2D mesh: a sum on either of its dims gives that dim's size)."""
    from torch.distributed.fsdp import fully_shard

    n = dp_mesh.size()
    if n == 1:
        return 1.0
    probe = nn.Linear(1, 2 * n, bias=False, device=device)  # weight (2n, 1): two rows per rank
    fully_shard(probe, mesh=shard_mesh if shard_mesh is not None else dp_mesh)
    r = dp_mesh.get_local_rank()
    x = torch.full((1, 1), float(r + 1), device=device)
    probe(x).sum().backward()
    observed = local_tensor(probe.weight.grad).flatten()[0].item()
    factor = observed / ((n + 1) / 2)
    dims = [] if shard_mesh is None or shard_mesh.ndim < 2 else [float(shard_mesh.size(i)) for i in range(shard_mesh.ndim)]
    for candidate in (1.0, float(n), *dims):
        if abs(factor - candidate) < 1e-4 * candidate:
            return candidate
    raise RuntimeError(f"FSDP2 gradient reduction gave {observed}, expected the mean {(n + 1) / 2} or the sum")
