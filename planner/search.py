"""The candidate space and its vectorised evaluation.

One declarative space: structural axes (tp, pp, cp, micro-batch, schedule x vpp) enumerated as
a few thousand tuples, crossed with the policy axes (ZeRO stage, recompute, sequence
parallelism, offload) as numpy arrays; the candidates are then evaluated over arrays
(``cost_models.total.memory``, then ``evaluate`` on those that fit), a throughput search only those whose
step-time floor could still rank (run_search: the rest are counted unpriced).  Infeasible candidates are
counted by reason and the top-k are kept in a fixed order (objective, then a deterministic tie-break).
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, replace

import numpy as np

from cost_models.layout import (OFFLOADS, RECOMPUTE, SCHEDULES, Layout, ModelDims, TrainingConsts, distinct_rows,
                                in_chunks, largest_virtual_stage, rank_recomputed_shares, titan_layer_sac_counts)
from cost_models.memory import RANK_TOTALS, runs_in_rounds, states_floor, weight_pass_queued
from cost_models.total import evaluate, memory, step_floor

# The searched ranges: design limits, not physics (a pin goes past any of them).  Micro-batches in powers of
# two up to 32 (the published runs here use 1-40; llm-foundry's 40, 18, 14 and 10 are pinned by their
# adapter); up to 8 model chunks per pipeline rank (Llama 3 405B's 126 layers on pp 16 used v = 8, the most a
# published run here uses); context parallelism up to 16 (Llama 3's 128K-token stage used cp 16).
MICRO_BATCH_CHOICES = (1, 2, 4, 8, 16, 32)
MAX_VPP = 8
MAX_CP = 16

# Reasons a candidate is infeasible, in the order they are checked (first one wins).
REASONS = ("batch", "schedule", "layers", "seq", "offload", "memory", "host-memory", "recompute-layers")


@dataclass
class Pins:
    """Dimensions the user fixed; None = search."""
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    cp: int | None = None
    mbs: int | None = None
    vpp: int | None = None
    zero: int | None = None
    recompute: str | None = None
    recompute_layers: int | None = None  # with recompute full: blocks of each virtual stage recomputed
    # the framework recomputes some blocks of a stage (core.PARTIAL_RECOMPUTE_FRAMEWORKS): with recompute unpinned,
    # the search adds the fewest such blocks that fit beside full recompute (partial_recompute_candidates)
    partial_recompute: bool = False
    # ...as torchtitan's layer-level selective checkpointing (every f-th block: layout.titan_layer_sac_counts): only
    # stages of one size, and N among the counts a frequency gives
    titan_layer_sac: bool = False
    sp: bool | None = None
    schedule: str | None = None
    offload: str | None = None
    schedules: tuple[str, ...] | None = None  # what an unpinned schedule may be (None: every one)
    recomputes: tuple[str, ...] | None = None  # what an unpinned recompute may be (None: every one)
    zeros: tuple[int, ...] | None = None  # what an unpinned ZeRO stage may be (None: 0-3)
    zero_max_with_pp: int | None = None  # highest ZeRO stage the framework runs inside a pipeline
    # data parallelism is FSDP or plain DDP (torchtitan, fsdp): no optimizer offload over a single shard (FSDP
    # needs dp_shard > 1); ZeRO-3 is its default, no moving part
    fsdp_native: bool = False
    # torchtitan's DDP is one-dimensional: DDP (ZeRO 0 over dp > 1) only without tp, pp or cp; no ZeRO 0 with cp
    # (torchtitan shards over cp whenever cp > 1)
    ddp_one_dim: bool = False
    # tensor parallelism always comes with sequence parallelism (torchtitan's TP plan puts the norms under
    # SequenceParallel): no tp > 1 without SP
    sp_with_tp: bool = False
    # the framework has no pipeline (pp), context parallelism (cp) or sequence parallelism (sp): those stay 1 / off
    lacks: tuple[str, ...] = ()
    # no ZeRO 0 over more than one data-parallel shard inside a pipeline: DeepSpeed trains a bf16 pipeline without
    # ZeRO through its BF16_Optimizer, which shards the fp32 master weights and Adam states over dp (ZeRO-1, gradients
    # all-reduced)
    zero0_single_shard: bool = False
    # 16-bit training needs FSDP (or a single dimension) there: torchtitan's maybe_enable_amp leaves mixed
    # precision to FSDP's policy and autocasts only DDP/single-device runs, so tp/pp with dp = cp = 1 trains fp32
    sixteen_bit_needs_shards: bool = False
    # parplan's runtime on a GPU: FSDP2's CPU offload keeps gradient shards on the host, and SP's, cp's and tied
    # embeddings' gradient sums would all-reduce them over NCCL, so ZeRO 3 + offload only without those
    # (planner.launch.check_runtime_support refuses them)
    fsdp_offload_alone: bool = False
    # ZeRO-3's hybrid sharding (Layout.dp_replicate): None searches full sharding and, where the framework has it
    # (TrainingConsts.hsdp), states sharded within a node and replicated across nodes; a number pins it (1: none)
    dp_replicate: int | None = None
    # expert parallelism (a mixture of experts'): None searches every ep that divides the experts and tp x cp x dp
    ep: int | None = None
    # torchtitan's experts' mesh (core.titan_ep_problem, expert_tensor_parallel_degree 1): ep divides dp_shard x cp x
    # tp, ep > 1 only under FSDP (ZeRO-3), and tp > 1 only with ep > 1
    titan_expert_mesh: bool = False
    # no ep 1 (torchtitan's DeepEP: "DeepEP requires expert parallelism (ep_degree > 1)")
    ep_above_one: bool = False


def fsdp2_offload_blockers(sp: bool, tp: int, cp: int, tied: bool, pp: int, as_flags: bool = False) -> list[str]:
    """What keeps parplan's runtime from FSDP2 optimizer offload on a GPU (Pins.fsdp_offload_alone; launch's
    check_runtime_support): FSDP2's CPU offload keeps the gradient shards on the host, and these gradient sums
    would all-reduce them over NCCL.  Named as recommend's flags (as_flags) or as the plan's settings."""
    named = ((("--sp", "sequence parallelism"), sp and tp > 1), ((f"--cp {cp}", f"cp={cp}"), cp > 1),
             (("tied embeddings across --pp", "tied embeddings across the pipeline"), tied and pp > 1))
    return [names[0] if as_flags else names[1] for names, on in named if on]


@dataclass
class SearchResult:
    layout: Layout  # feasible candidates, sorted best first (top-k)
    metrics: dict  # arrays aligned with layout
    candidates: int
    feasible: int
    seconds: float
    infeasible_by_reason: dict = field(default_factory=dict)
    best_infeasible: tuple | None = None  # (layout, metrics) of the lowest-memory candidate when none fits
    unpriced: int = 0  # candidates whose step-time floor is past every contender's step: memory and time not modelled


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _choices(pin, default):
    return [pin] if pin is not None else list(default)


def structural_space(m: ModelDims, gpus: int, gbs: int, pins: Pins):
    """Tuples (tp, pp, cp, dp, mbs, schedule_code, vpp).  Only combinations that are *defined*
    are produced (degrees multiply to the GPU count, tp divides the heads and the MLP width, which
    Megatron's and parplan's column-parallel layers split evenly; a vocabulary both pad); ones that are defined
    but unusable (batch, layers, schedule) are kept so they can be counted by reason."""
    divs = divisors(gpus)
    tps = [t for t in _choices(pins.tp, divs)
           if m.heads % t == 0 and m.kv_heads % t == 0 and (m.moe or m.ffn % t == 0) and gpus % t == 0]
    pps = [p for p in _choices(pins.pp, divs) if p <= m.layers and gpus % p == 0]
    cps = [c for c in _choices(pins.cp, [d for d in divs if d <= MAX_CP]) if gpus % c == 0]
    out = []
    for tp, pp, cp in itertools.product(tps, pps, cps):
        if gpus % (tp * pp * cp):
            continue
        dp = gpus // (tp * pp * cp)
        if pins.dp is not None and dp != pins.dp:
            continue
        for sched_name in _choices(pins.schedule, pins.schedules or SCHEDULES):
            code = SCHEDULES.index(sched_name)
            if pp == 1 and sched_name != "1f1b":
                continue  # all schedules coincide without a pipeline: it is 1F1B (plain gradient accumulation)
            if sched_name in ("gpipe", "1f1b"):
                vpps = [1]
            elif sched_name == "zbv":
                vpps = [2]
            else:
                # interleaving needs 2 chunks or more: a pinned --vpp 1 leaves these schedules out
                vpps = [v for v in range(2, MAX_VPP + 1)] if pins.vpp is None else [pins.vpp] if pins.vpp >= 2 else []
            if pins.vpp is not None:
                vpps = [v for v in vpps if v == pins.vpp]
            for v in vpps:
                if v > 1 and pins.vpp is None and m.layers < pp * v - 2:
                    continue  # every middle virtual stage needs a block; only generate pinned misfits
                for mbs in _choices(pins.mbs, MICRO_BATCH_CHOICES):
                    out.append((tp, pp, cp, dp, mbs, code, v))
    return out


def policy_space(pins: Pins):
    zeros = _choices(pins.zero, pins.zeros or range(4))
    recs = [RECOMPUTE.index(r) for r in _choices(pins.recompute, pins.recomputes or RECOMPUTE)]
    sps = [int(s) for s in _choices(pins.sp, (False, True))]
    offs = [OFFLOADS.index(o) for o in _choices(pins.offload, OFFLOADS)]
    return list(itertools.product(zeros, recs, sps, offs))


def _grid(m: ModelDims, gpus: int, gbs: int, pins: Pins, zero_over_cp: bool = True):
    """(struct, policy, i_s, i_p): the structure and policy tables and the (structure, policy) pairs kept."""
    struct = np.array(structural_space(m, gpus, gbs, pins), dtype=np.int64).reshape(-1, 7)
    policy = np.array(policy_space(pins), dtype=np.int64).reshape(-1, 4)
    # every (structure, policy) pair, struct-major, less sequence parallelism without TP (there is nothing
    # to split it over: with --sp pinned the search keeps to tp > 1, as --sp --tp 1 is an error) and ZeRO
    # without replicas to shard over (the same plan as ZeRO 0: dp x cp = 1 where the framework shards over
    # dp x cp, dp = 1 where it shards over dp only, as parplan's runtime does, zero_over_cp), masked on the
    # (structure x policy) grid before any column is built: the product itself is hundreds of thousands of
    # rows at scale
    tp, pp, cp, dp = (struct[:, j, None] for j in (0, 1, 2, 3))
    zero, sp, off = policy[None, :, 0], policy[None, :, 2], policy[None, :, 3]
    keep = ~((sp == 1) & (tp == 1))
    shards = dp * cp if zero_over_cp else dp
    # ...except under optimizer offload, which the frameworks run under ZeRO only (DeepSpeed's ZeRO-Offload
    # on one GPU is ZeRO-1 over a single shard): there the stage is what moves the states to the host
    # on one shard ZeRO-2 is ZeRO-1's plan (the gradients it would shard are whole), so offload there is ZeRO-1 or
    # ZeRO-3 (whose parameters go to the host too)
    one_shard_offload = (off > 0) & (not pins.fsdp_native) & (zero != 2)
    keep = keep & (~((zero > 0) & (shards == 1) & ~one_shard_offload) | (pins.zero is not None))
    if pins.zero_max_with_pp is not None:
        keep = keep & ~((zero > pins.zero_max_with_pp) & (pp > 1))
    if pins.ddp_one_dim:
        # ...and FSDP is on whenever cp > 1 (ParallelDims.fsdp_enabled), so no ZeRO 0 beside cp either
        keep = keep & ~((zero == 0) & (((dp > 1) & ((tp > 1) | (pp > 1))) | (cp > 1)))
    if pins.zero0_single_shard:
        keep = keep & ~((zero == 0) & (shards > 1) & (pp > 1))
    if pins.sp_with_tp:
        keep = keep & ~((tp > 1) & (sp == 0))
    for axis, degree in (("pp", pp), ("cp", cp)):
        if axis in pins.lacks:
            keep = keep & (degree == 1)
    if "sp" in pins.lacks:
        keep = keep & (sp == 0)
    if pins.fsdp_offload_alone:
        keep = keep & ~((zero == 3) & (off > 0) & (((sp == 1) & (tp > 1)) | (cp > 1) | ((pp > 1) & m.tied)))
    if pins.sixteen_bit_needs_shards:
        keep = keep & ~(((tp > 1) | (pp > 1)) & (dp == 1) & (cp == 1))
    i_s, i_p = np.nonzero(np.broadcast_to(keep, (len(struct), len(policy))))
    return struct, policy, i_s, i_p


def _layout(gpus: int, struct, policy, i_s, i_p) -> Layout:
    S, P = struct[i_s], policy[i_p]
    return Layout(gpus=np.full(len(i_s), gpus), tp=S[:, 0], pp=S[:, 1], cp=S[:, 2], dp=S[:, 3], mbs=S[:, 4],
                  schedule=S[:, 5], vpp=S[:, 6], zero=P[:, 0], recompute=P[:, 1], sp=P[:, 2], offload=P[:, 3])


def build_layouts(m: ModelDims, gpus: int, gbs: int, pins: Pins, zero_over_cp: bool = True) -> Layout:
    """Every candidate for `gpus` GPUs (the (structure x policy) pairs _grid keeps)."""
    return _layout(gpus, *_grid(m, gpus, gbs, pins, zero_over_cp))


def screened_layouts(m: ModelDims, tr: TrainingConsts, gpus: int, pins: Pins) -> tuple[Layout, int, np.ndarray]:
    """(candidates passing structural_infeasibility, how many candidates there were, the failed ones' reason
    codes): the same as build_layouts then structural_infeasibility, with each check run on the table it
    reads (the structures', a few thousand rows, or the policies', a few dozen) and only its verdict spread
    over the pairs; the columns are built for the passing pairs alone (tests/test_search.py)."""
    struct, policy, i_s, i_p = _grid(m, gpus, tr.global_batch_size, pins, tr.zero_over_cp)
    S, P = struct.T, policy.T
    st = Layout(gpus=gpus, tp=S[0], pp=S[1], cp=S[2], dp=S[3], mbs=S[4], schedule=S[5], vpp=S[6],
                zero=0, recompute=0, sp=0, offload=0)
    early, late = _structure_checks(m, tr, st)
    zb_whole = _zero_bubble(st.schedule)[i_s] & (_whole_block(P[1]) & ~weight_pass_queued(tr, P[0]))[i_p]
    sp_split = (_sp_seq_misfit(m, st)[i_s]) & (P[2] > 0)[i_p]
    offload = ((P[3] > 0) & (P[0] == 0))[i_p]
    reason = _combine(early[i_s], zb_whole, late[i_s], sp_split, offload)
    ok = np.nonzero(reason < 0)[0]
    return _layout(gpus, struct, policy, i_s[ok], i_p[ok]), len(i_s), reason[reason >= 0]


def _mark(reason, mask, name):
    return np.where((reason < 0) & mask, REASONS.index(name), reason)


# A CPU allocator trace of parplan's runtime (torch 2.13, non-reentrant activation checkpointing,
# benchmarks/results/2026-11-23-cpu-memory) found torch's weight-gradient pass of a zero-bubble schedule
# re-running a fully recomputed block's forward once per weight matrix (7 for a llama block) and
# holding all of them: 7x the recompute FLOPs and 7 blocks' activations at once (pytorch/pytorch#136766).
# parplan's runtime queues its linears' weight gradients instead (parallel_layers.layers.WeightGradStore;
# TrainingConsts.zb_weight_grad_store), outside FSDP2; the search offers the combination only there.
# Selective recompute (checkpointed pieces without weights) is unaffected.
ZERO_BUBBLE = ("zbv", "interleaved-zb")
ZB_FULL_RECOMPUTE = ("zero-bubble schedules (zbv, interleaved-zb) with full (or op-level selective) recompute under "
                     "torch's own weight-gradient pass (torchtitan; parplan's runtime under ZeRO-3/FSDP2) re-run each "
                     "block's forward once per weight in it (op-level selective checkpointing refuses that second "
                     "backward outright)")


def _structure_checks(m: ModelDims, tr: TrainingConsts, lay: Layout):
    """The structural checks that read only (tp, pp, cp, dp, mbs, schedule, vpp): (those that come before
    the zero-bubble recompute check, those after), each an index into REASONS or -1."""
    gbs = tr.global_batch_size
    n = len(lay)
    early = np.full(n, -1)
    early = _mark(early, (gbs % (lay.dp * lay.mbs)) != 0, "batch")
    mb = gbs // np.maximum(lay.dp * lay.mbs, 1)
    interleaved = lay.vpp > 1
    # Megatron: m divisible by p; torch's interleaved schedules: by their max(1, m // p) rounds (TrainingConsts.
    # interleaved_torch_rounds), interleaved-zb from m = p on (below it the memory counts' held sends are not
    # torch's); torch's ZB-V runs any m (its order is built for max(2p - 1, m) and cut; rank_inflight walks it)
    torch = np.asarray(tr.interleaved_torch_rounds)
    off_rounds = ~runs_in_rounds(lay.pp, mb)
    izb = torch & (lay.schedule == SCHEDULES.index("interleaved-zb"))
    bad_m = np.where(torch & (lay.schedule == SCHEDULES.index("interleaved-1f1b")), off_rounds,
                     np.where(izb, off_rounds | (mb < lay.pp), (mb % lay.pp) != 0))
    bad_m = bad_m & (lay.schedule != SCHEDULES.index("zbv"))
    early = _mark(early, interleaved & bad_m, "schedule")
    # torch's Schedule1F1B needs a micro-batch per stage (TrainingConsts.torch_1f1b_needs_m_ge_p)
    one_f1b = (lay.schedule == SCHEDULES.index("1f1b")) & (lay.pp > 1) & (mb < lay.pp)
    early = _mark(early, one_f1b & np.asarray(tr.torch_1f1b_needs_m_ge_p), "schedule")
    # Megatron-Core's combined 1F1B (TrainingConsts.moe_a2a_overlap) runs without a pipeline or interleaved
    overlap_off = (lay.pp > 1) & (lay.schedule != SCHEDULES.index("interleaved-1f1b"))
    early = _mark(early, overlap_off & bool(tr.moe_a2a_overlap), "schedule")
    late = np.full(n, -1)
    late = _mark(late, (lay.vpp > 1) & (m.layers < lay.pp * lay.vpp - 2), "layers")  # empty middle stages
    late = _mark(late, (lay.cp > 1) & ((m.seq_len % (2 * lay.cp)) != 0), "seq")  # 2*cp equal chunks
    return early, late


def _zero_bubble(schedule):
    return np.isin(schedule, [SCHEDULES.index(s) for s in ZERO_BUBBLE])


def _whole_block(recompute):
    return (recompute == RECOMPUTE.index("full")) | (recompute == RECOMPUTE.index("selective-op"))


def _sp_seq_misfit(m: ModelDims, lay: Layout):
    """Sequence parallelism would not split each rank's sequence over the TP group (Megatron requires it too)."""
    return (lay.tp > 1) & (((m.seq_len // lay.cp) % lay.tp) != 0)


def _combine(early, zb_whole, late, sp_split, offload):
    """The first failed check, in REASONS' order of checking."""
    # zero-bubble + full recompute under torch's weight-gradient pass, which re-runs a checkpointed block's
    # forward once per weight and holds every re-run (ZB_FULL_RECOMPUTE)
    reason = _mark(early, zb_whole, "schedule")
    reason = np.where(reason < 0, late, reason)
    reason = _mark(reason, sp_split, "seq")
    return _mark(reason, offload, "offload")


def structural_infeasibility(m: ModelDims, tr: TrainingConsts, lay: Layout) -> np.ndarray:
    """The checks that need no cost model (batch split, schedule, layers, sequence, offload): index
    into REASONS of the first failed one, or -1.  The search evaluates only what passes them (it runs
    them per table: screened_layouts)."""
    early, late = _structure_checks(m, tr, lay)
    return _combine(early, _zero_bubble(lay.schedule) & _whole_block(lay.recompute) & ~weight_pass_queued(tr, lay.zero),
                    late,
                    (lay.sp > 0) & _sp_seq_misfit(m, lay), (lay.offload > 0) & (lay.zero == 0))


def infeasibility(m: ModelDims, tr: TrainingConsts, hw, lay: Layout, metrics: dict,
                  reason: np.ndarray | None = None) -> np.ndarray:
    """Index into REASONS of the first failed check, or -1 where feasible (`reason`: the structural
    checks already done)."""
    if reason is None:
        reason = structural_infeasibility(m, tr, lay)
    reason = _mark(reason, metrics["mem_total"] > hw.usable_bytes, "memory")
    per_node = np.minimum(lay.gpus, hw.gpus_per_node)
    return _mark(reason, metrics["mem_offloaded"] * per_node > hw.host_memory_bytes_per_node, "host-memory")


# Plans predicted within this fraction of the fastest are treated as equally fast: the cost model's
# median error against published runs is 2-11 % per set (README, "How accurate") and its host-offload
# term is a lower bound, so a smaller difference is no reason to take on host offload, context
# parallelism, ZeRO-3 or an interleaved or zero-bubble schedule.
NEAR_TIE = 0.05
# Candidates timed first in a throughput search, those with the lowest step-time floor: enough that the top_k
# fastest and the near-ties are usually among them, so the bound they give leaves out most of the rest
FLOOR_FIRST = 4096
# ...and then the others within their bound, in slices of this many in the order of their floor, each slice's step
# times narrowing the bound for the next (by_floor in run_search)
PRICE_SLICE = 16384


def complexity(lay: Layout, zero3_counts: bool = True):
    """Moving parts a plan adds (lower is simpler), each outweighing all after it: optimizer offload, then
    context parallelism, then ZeRO-3 parameter sharding (not where FSDP is the framework's own default:
    zero3_counts), then a pipeline schedule beyond 1F1B (interleaving or zero-bubble: more memory held for
    the same micro-batches, more sends, and for the zero-bubble ones deferred weight passes)."""
    looped = np.isin(np.asarray(lay.schedule), [SCHEDULES.index(s) for s in ("interleaved-1f1b",) + ZERO_BUBBLE])
    return (8 * (np.asarray(lay.offload) > 0) + 4 * (np.asarray(lay.cp) > 1)
            + 2 * ((np.asarray(lay.zero) >= 3) & zero3_counts) + (looped & (np.asarray(lay.pp) > 1)))


def sort_key(objective: str, lay: Layout, metrics: dict, zero3_counts: bool = True):
    """Indices best first.  np.lexsort sorts by the last key first.  Throughput: plans within
    NEAR_TIE of the fastest come first, simplest of them first; then by step time."""
    step = metrics["step_time_s"]
    mem = metrics["mem_total"]
    tie = (lay.tp * 1e6 + lay.pp * 1e3 + lay.cp)  # prefer smaller model parallelism on exact ties
    if objective == "memory":
        return np.lexsort((tie, step, mem))
    if objective == "min-gpus":
        return np.lexsort((tie, mem, step, lay.gpus))
    if len(step) == 0:
        return np.arange(0)
    near = step <= step.min() * (1 + NEAR_TIE)
    return np.lexsort((tie, mem, step, np.where(near, complexity(lay, zero3_counts), 0), ~near))


def contenders(objective: str, metrics: dict, top_k: int) -> np.ndarray:
    """Indices of the candidates that can be among sort_key's first top_k, ties included (everything where
    the objective's first key does not narrow it): for throughput the near-ties of the fastest, and if
    fewer than top_k, the others up to the top_k-th step time; for memory those up to the top_k-th footprint."""
    step, mem = metrics["step_time_s"], metrics["mem_total"]
    n = len(step)
    every = np.arange(n)
    if objective not in ("throughput", "memory") or n <= top_k:
        return every
    if objective == "memory":
        return np.nonzero(mem <= np.partition(mem, top_k - 1)[top_k - 1])[0]
    near = step <= step.min() * (1 + NEAR_TIE)
    short = top_k - int(np.count_nonzero(near))
    if short <= 0:
        return np.nonzero(near)[0]
    rest = step[~near]
    return np.nonzero(near | (step <= np.partition(rest, short - 1)[short - 1]))[0]


def contender_bound(steps, top_k: int) -> float:
    """A step time no throughput contender exceeds (contenders(): the near-ties of the fastest and the top_k fastest),
    from the step times of any subset of the candidates: over more candidates the fastest and the top_k-th fastest can
    only be faster, so the bound from a subset holds for the whole search; inf below top_k steps."""
    steps = np.asarray(steps, dtype=float)
    steps = steps[np.isfinite(steps)]  # a NaN step (none is known) would make the bound NaN and leave out everything
    if len(steps) < top_k:
        return np.inf
    return max(steps.min() * (1 + NEAR_TIE), np.partition(steps, top_k - 1)[top_k - 1])


def pin_recompute_layers(m: ModelDims, lay: Layout, pins: Pins) -> tuple[Layout, int, int]:
    """(candidates, how many were dropped for their schedule, how many for torchtitan's counts): a pinned
    recompute_layers on every full-recompute candidate (where it is every block of a stage: full recompute's plan,
    recompute_layers 0)."""
    if pins.recompute_layers is None:
        return lay, 0, 0
    full = np.asarray(lay.recompute) == RECOMPUTE.index("full")
    # partial recompute is predicted for gpipe, 1f1b and interleaved-1f1b only: a zero-bubble candidate would be a
    # plan every other command refuses (check_plan_structure), so none is offered
    zb = _zero_bubble(np.asarray(lay.schedule)) & (np.asarray(lay.pp) > 1)
    dropped = int(np.count_nonzero(full & zb))
    lay = lay.take(np.flatnonzero(~(full & zb)))
    full = np.asarray(lay.recompute) == RECOMPUTE.index("full")
    below = pins.recompute_layers < largest_virtual_stage(m.layers, lay)
    titan = 0
    if pins.titan_layer_sac:  # torchtitan recomputes only the counts a frequency gives, on stages of one size
        can = titan_layer_sac_rows(m, lay, np.full(len(lay), pins.recompute_layers))
        bad = full & below & ~can
        titan = int(np.count_nonzero(bad))
        lay = lay.take(np.flatnonzero(~bad))
        full, below = full[~bad], below[~bad]
    return replace(lay, recompute_layers=np.where(full & below, pins.recompute_layers, 0)), dropped, titan


def titan_layer_sac_rows(m: ModelDims, lay: Layout, n) -> np.ndarray:
    """Per candidate, whether torchtitan's layer-level selective checkpointing recomputes n blocks of each virtual
    stage: its stages all of one size (the default split of the blocks alone, no multi-token prediction, no plan's
    own split) and n among titan_layer_sac_counts of that size (its own least count at or above n)."""
    n = np.asarray(n)
    return (n < largest_virtual_stage(m.layers, lay)) & (titan_layer_sac_round_up(m, lay, n) == n)


def titan_layer_sac_round_up(m: ModelDims, lay: Layout, n) -> np.ndarray:
    """The least count at or above n that torchtitan's layer-level selective checkpointing recomputes on each
    candidate's stages (titan_layer_sac_rows), or the stage's size (every block: no partial plan) where none is."""
    pp, vpp = np.asarray(lay.pp), np.asarray(lay.vpp)
    stages = pp * vpp
    chunk = largest_virtual_stage(m.layers, lay)
    out = np.asarray(chunk, dtype=np.int64).copy()
    even = (m.layers % stages == 0) & (not m.mtp) & (not m.split)
    n = np.asarray(n)
    for st, v in {(int(a), int(b)) for a, b in zip(stages[even], vpp[even])}:
        counts = np.asarray(titan_layer_sac_counts(m.layers // st, v), dtype=np.int64)
        rows = np.flatnonzero(even & (stages == st) & (vpp == v))
        if len(counts) and len(rows):
            at = np.searchsorted(counts, n[rows])
            fits = at < len(counts)
            out[rows[fits]] = counts[at[fits]]
    return out


def node_replicas(tp, pp, dp, gpus_per_node, cp=1):
    """Replica groups when each node's dp ranks shard the states (gpus_per_node / (tp x cp x pp) of them): dp / that,
    or 0 where the dp ranks do not span more than a node in whole groups of two or more (elementwise)."""
    per_node = np.asarray(tp) * np.asarray(pp) * np.asarray(cp)
    shard = np.where(gpus_per_node % per_node == 0, gpus_per_node // np.maximum(per_node, 1), 0)
    dp = np.asarray(dp)
    whole = (shard > 1) & (dp > shard) & (dp % np.maximum(shard, 1) == 0)
    return np.where(whole, dp // np.maximum(shard, 1), 0)


def hybrid_shard_candidates(tr: TrainingConsts, hw, lay: Layout, pins: Pins) -> tuple[Layout, int]:
    """(candidates, how many more or fewer there are) with ZeRO-3's hybrid sharding (HSDP, Layout.dp_replicate): where the
    framework has it (TrainingConsts.hsdp) every ZeRO-3 candidate whose data-parallel ranks span more than a node gets
    a twin that shards its states over the dp ranks of one node (dp / (gpus_per_node / (tp x cp x pp)) replica
    groups, each sharding over its dp ranks, and where the framework shards over cp too (torchtitan's dp_shard x cp)
    over their cp ranks beside them; torchtitan's and FSDP's usual hybrid layout, whose gathers and reduce-scatters
    stay on the node's fabric and whose replicas all-reduce a 1/shard gradient across nodes).  A pinned dp_replicate
    r > 1 keeps only the ZeRO-3 candidates whose dp it divides, each with that r (the others are not layouts of
    the kind asked for: not counted as candidates); under Megatron-LM (TrainingConsts.partial_distopt: its distributed
    optimizer in r instances, --num-distributed-optimizer-instances) the ZeRO-1 ones, each ZeRO-1 candidate across
    nodes with a twin of one instance a node (a mixture of experts' twins keep the expert parallelisms whose expert-
    data-parallel group r divides: expert_parallel_rows); a pinned 1 adds none."""
    r_pin = pins.dp_replicate
    searched = tr.hsdp or tr.partial_distopt
    if r_pin == 1 or (r_pin is None and not searched) or len(lay) == 0:
        return lay, 0
    dp, zero, cp = np.asarray(lay.dp), np.asarray(lay.zero), np.asarray(lay.cp)
    able = np.where(tr.partial_distopt, zero == 1, zero >= 3)
    if r_pin is not None:
        keep = able & (dp % r_pin == 0) & (dp > r_pin)  # groups of two or more ranks that shard
        return replace(lay.take(np.flatnonzero(keep)), dp_replicate=r_pin), -int(np.count_nonzero(~keep))
    reps = node_replicas(lay.tp, lay.pp, dp, hw.gpus_per_node, cp)
    twin = able & (reps > 0)
    if not np.any(twin):
        return lay, 0
    idx = np.flatnonzero(twin)
    hybrid = replace(lay.take(idx), dp_replicate=reps[idx])
    return Layout.concat([lay, hybrid]), len(idx)


@dataclass
class Expanded:
    """Candidates not built yet: `base`'s rows `idx` in that order (None: all of them), each with the expert
    parallelism `ep` (None: its own).  A mixture of experts' search has several ep a layout (expert_parallel_rows),
    and most of those candidates fail the memory floor: pricing the floor slice by slice (in_chunks reads
    rows(start, stop)) and building only what passes (kept) spares building them all (GLM-4.5 on 1,024 GPUs: 686,505
    candidates of 15 int64 fields, 82 MB, of which 333,829 pass)."""
    base: Layout
    idx: np.ndarray | None = None
    ep: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.base) if self.idx is None else len(self.idx)

    def take(self, sel) -> Layout:
        """The candidates `sel` (indices, or a slice: rows) of these, built."""
        if self.idx is None:
            return self.base.take(sel)
        sub = self.base.take(self.idx[sel])
        return sub if self.ep is None else replace(sub, ep=self.ep[sel])

    def rows(self, start: int, stop: int) -> Layout:
        if self.idx is None:
            return self.base.rows(start, stop)
        return self.take(slice(start, stop))

    def kept(self, keep: np.ndarray) -> Layout:
        """The candidates where `keep` (a mask over these), built: `base` itself where that is all of it."""
        if self.idx is None and np.all(keep):
            return self.base
        return self.take(np.flatnonzero(keep))


def expert_parallel_rows(m: ModelDims, lay: Layout, pins: Pins) -> tuple[Expanded, int]:
    """(candidates, how many more or fewer there are) of a mixture of experts: each candidate once per expert-parallel
    size ep that divides the experts and its tp x cp x dp ranks (the ranks the ep group is taken from: cost_models/
    moe.py), or with a pinned ep only those it divides (the others are not layouts of the kind asked for: not
    counted).  Its MoE layer takes the sequence shard, so tp > 1 comes with sequence parallelism (Megatron-LM's rule
    for MoE): candidates without it are not MoE layouts either.  A dense model: every candidate as it is (ep 1).
    Not built (Expanded): expert_parallel_candidates builds them."""
    if not m.moe or len(lay) == 0:
        return Expanded(lay), 0
    ranks = np.asarray(lay.tp) * np.asarray(lay.cp) * np.asarray(lay.dp)
    able = ~((np.asarray(lay.tp) > 1) & (np.asarray(lay.sp) == 0))
    eps = [pins.ep] if pins.ep is not None else [e for e in divisors(m.experts) if e > 1 or not pins.ep_above_one]
    # the candidates of each ep in turn (the same rows as taking each ep's and joining them)
    rows, ep = [], []
    # dp_replicate r > 1 (hybrid sharding, Megatron's optimizer instances) splits the expert-data-parallel group too: r
    # must divide it (Parallel's rule; Megatron-Core asserts "Expert data parallel size should be divisible by partial
    # DistOpt shard factor")
    rep = np.asarray(lay.dp_replicate)
    if pins.titan_expert_mesh:  # torchtitan's experts' mesh: efsdp = dp_shard x cp x tp / ep, FSDP whenever ep > 1
        fsdp = np.asarray(lay.zero) >= 3
        tp_on = np.asarray(lay.tp) > 1
    for e in eps:
        ok = able & (ranks % e == 0) & ((ranks // e) % rep == 0)
        if pins.titan_expert_mesh:
            ok = ok & (fsdp if e > 1 else ~tp_on)
        keep = np.flatnonzero(ok)
        if len(keep):
            rows.append(keep)
            ep.append(np.full(len(keep), int(e)))
    if not rows:
        return Expanded(lay, np.array([], dtype=np.int64), np.array([], dtype=np.int64)), -len(lay)
    out = Expanded(lay, np.concatenate(rows), np.concatenate(ep))
    return out, len(out) - len(lay)


def expert_parallel_candidates(m: ModelDims, lay: Layout, pins: Pins) -> tuple[Layout, int]:
    """expert_parallel_rows' candidates, built (a dense model's: `lay` itself)."""
    out, more = expert_parallel_rows(m, lay, pins)
    return out.kept(np.ones(len(out), dtype=bool)), more


def partial_recompute_candidates(m: ModelDims, tr: TrainingConsts, hw, lay: Layout, mem: dict,
                                 pins: Pins) -> Layout | None:
    """Where the framework recomputes some blocks of a stage (pins.partial_recompute): beside each full-recompute
    candidate that fits whose no-recompute twin (the same layout, recompute none: among `lay`, whose memory `mem`
    is) does not, the one recomputing the fewest blocks of each virtual stage that fits, where that is fewer than
    every block.  memory.partial_recompute_memory is, rank by rank, the chord in the share f of blocks recomputed
    between the twin's and full recompute's, so each rank's least f under the usable memory is read off those two,
    and the least N that gives every rank its f (layout.rank_recomputed_shares: a rank of smaller stages recomputes
    a larger share of its blocks at the same N).  Not under the zero-bubble schedules, whose bubble is not linear in
    the blocks' mix.  None where there are none."""
    if not pins.partial_recompute or len(lay) == 0:
        return None
    rec = np.asarray(lay.recompute)
    full, none = rec == RECOMPUTE.index("full"), rec == RECOMPUTE.index("none")
    usable = hw.usable_bytes
    cand = full & ~_zero_bubble(np.asarray(lay.schedule)) & (np.asarray(mem["total"]) <= usable)
    if not np.any(cand):
        return None
    # each candidate's twin: the same fields but recompute, matched on one integer per row (the fields in mixed
    # radix; a search's columns are small integers, hundreds of thousands of rows)
    key = _row_keys(lay, exclude=("recompute", "recompute_layers"))
    none_rows = np.flatnonzero(none)
    if len(none_rows) == 0:
        return None
    order = np.argsort(key[none_rows], kind="stable")
    sorted_keys = key[none_rows][order]
    idx = np.flatnonzero(cand)
    at = np.minimum(np.searchsorted(sorted_keys, key[idx]), len(sorted_keys) - 1)
    found = sorted_keys[at] == key[idx]
    idx, twin = idx[found], none_rows[order[at[found]]]
    kept_total = np.asarray(mem["total"])[twin]
    idx, twin = idx[kept_total > usable], twin[kept_total > usable]
    if len(idx) == 0:
        return None
    sub = lay.take(idx)
    chunk = largest_virtual_stage(m.layers, sub)
    needs = []  # each rank kind's least share recomputed
    with np.errstate(divide="ignore", invalid="ignore"):
        for k in RANK_TOTALS:
            k0, k1 = np.asarray(mem[k])[twin], np.asarray(mem[k])[idx]
            needs.append(np.nan_to_num(np.where(k0 > usable, (k0 - usable) / (k0 - k1), 0.0)))
    # every rank at the largest stage's share N / chunk; a rank of smaller stages recomputes a larger share of its
    # blocks (rank_recomputed_shares), so where the stages differ a smaller N may already do: tried from 1 up
    n = np.maximum(np.ceil(np.max(needs, axis=0) * chunk - 1e-9), 1)
    one = np.ones(len(idx), dtype=np.int64)
    uneven = np.flatnonzero(np.any([np.abs(f - 1.0 / chunk) > 1e-12
                                    for f in rank_recomputed_shares(m, replace(sub, recompute_layers=one))], axis=0))
    for less in range(1, int(n[uneven].max(initial=1))):
        rows = uneven[n[uneven] > less]
        if not len(rows):
            break
        at = rank_recomputed_shares(m, replace(sub.take(rows), recompute_layers=np.full(len(rows), less)))
        fits = np.all([f >= need[rows] - 1e-9 for f, need in zip(at, needs)], axis=0)
        n[rows[fits]] = less
    if pins.titan_layer_sac:  # torchtitan: the least count a frequency gives, on stages of one size
        n = np.where(n < chunk, titan_layer_sac_round_up(m, sub, n), chunk)
    ok = np.flatnonzero(n < chunk)
    return replace(sub.take(ok), recompute_layers=n[ok].astype(np.int64)) if len(ok) else None


def _row_keys(lay: Layout, exclude=()) -> np.ndarray:
    """One int64 per candidate that equals another's where all fields but `exclude` do: the fields in mixed radix
    (each column less its minimum where that is below 0, over its range), or the rank of the row among the distinct
    ones where that would overflow."""
    cols = [np.broadcast_to(np.asarray(getattr(lay, k)).astype(np.int64, copy=False), (len(lay),))
            for k in lay.__dict__ if k not in exclude]
    lows = [int(c.min(initial=0)) for c in cols]
    cols = [c - low if low else c for c, low in zip(cols, lows)]  # (no pass where the minimum is 0 already)
    spans = [int(c.max(initial=0)) + 1 for c in cols]
    if np.prod([float(x) for x in spans]) < 2.0 ** 62:
        key = np.zeros(len(lay), dtype=np.int64)
        for c, span in zip(cols, spans):
            key = key * span + c
        return key
    return distinct_rows(*cols)[1]


def run_search(m: ModelDims, tr: TrainingConsts, hw, gpu_counts: list[int], pins: Pins, top_k: int,
               objective: str) -> SearchResult:
    t0 = time.perf_counter()
    layouts, metric_list = [], []
    candidates, skipped, floored = 0, [np.array([], dtype=int)], []  # floored: (layout, the rows set aside)
    misses = []  # per evaluated batch, its smallest-footprint candidate that did not fit: (footprint, layout)
    unranked = 0  # candidates that fit but were not timed: their step-time floor is past every contender
    unpriced = 0  # candidates neither priced nor timed: the same, whether they fit or not (by_floor)
    timed_steps = []  # step times of every timed candidate so far (throughput: the contender bound)

    def time_rows(sub, mem):
        """Time the candidates `sub` (in the search's candidate order, which breaks exact ties) with their memory."""
        met = evaluate(m, tr, hw, sub, mem=mem)
        met = {k: np.broadcast_to(v, (len(sub),)) for k, v in met.items()}
        timed_steps.append(met["step_time_s"])
        return met

    def priced(lay):
        """(memory, reasons) of candidates `lay`: the memory half of `evaluate` on every one, then the checks that
        read it (-1 where it fits)."""
        mem = in_chunks(lay, lambda sub: memory(m, tr, sub))
        mem = {k: np.broadcast_to(v, (len(lay),)) for k, v in mem.items()}
        return mem, infeasibility(m, tr, hw, lay, {"mem_total": mem["total"], "mem_offloaded": mem["offloaded"]},
                                  reason=np.full(len(lay), -1))

    def record(lay, mem, reason, timed, met, rows=None):
        """Record priced candidates, lay's (or its `rows`, ascending, where given: mem and reason are theirs): those
        that do not fit by reason, the closest miss, and the candidates `timed` (rows of lay, ascending) with their
        metrics for the ranking; whether any fits."""
        out = np.flatnonzero(reason >= 0)
        skipped.append(reason[out])
        if len(out):
            i = out[np.argmin(mem["total"][out])]
            misses.append((float(mem["total"][i]), lay.take(np.array([i if rows is None else rows[i]]))))
        if len(timed):
            layouts.append(lay.take(timed))
            metric_list.append(met)
        return bool(np.any(reason < 0))

    def cost(lay):
        """Memory for every candidate first, the time model only for those that fit (the memory half is about half
        of `evaluate`, and about a third of the candidates that reach it do not fit).  Partial-recompute
        candidates join after the memory half (partial_recompute_candidates).  A throughput search: by_floor."""
        nonlocal candidates
        if objective == "throughput":
            return by_floor(lay)
        with np.errstate(divide="ignore", invalid="ignore"):
            mem, reason = priced(lay)
            part = partial_recompute_candidates(m, tr, hw, lay, mem, pins)
            if part is not None:
                part_mem, part_reason = priced(part)
                lay = Layout.concat([lay, part])
                mem = {k: np.concatenate([v, part_mem[k]]) for k, v in mem.items()}
                reason = np.concatenate([reason, part_reason])
                candidates += len(part)
            fits = np.flatnonzero(reason < 0)
            met = time_rows(lay.take(fits), {k: v[fits] for k, v in mem.items()}) if len(fits) else None
            return record(lay, mem, reason, fits, met)

    def by_floor(lay):
        """A throughput search prices (memory, then fit) and times candidates in the order of their step-time floor
        (total.step_floor, under every step time evaluate gives): first the FLOOR_FIRST lowest (and as many more as
        it takes for top_k of them to fit), whose step times bound every contender's (contender_bound: over more
        candidates the fastest and the top_k-th fastest can only be faster); then every other candidate whose floor
        is within that bound.  A candidate whose floor is past it can be no contender whether it fits or not: it is
        neither priced nor timed (`unpriced`: its memory not known, it is counted neither feasible nor infeasible).
        A partial-recompute candidate's floor is its no-recompute twin's (step_floor), so one can rank only where
        that twin's floor is within the bound: the full-recompute twins of those that do not fit are priced too,
        whatever their own floor, so that every partial candidate that could rank is made.  The plans, their
        order and metrics are those of pricing and timing everything (tests/test_search.py)."""
        nonlocal candidates, unranked, unpriced
        n = len(lay)
        with np.errstate(divide="ignore", invalid="ignore"):
            floor = np.broadcast_to(np.asarray(in_chunks(lay, lambda sub: step_floor(m, tr, hw, sub)), dtype=float),
                                    (n,))
        order = np.argsort(floor, kind="stable")  # (a NaN floor sorts last: it bounds nothing, so it is priced and timed)
        rows, mems, reasons, timed, mets = [], [], [], [], []  # per priced batch

        def price(idx, time_fits=True):
            """Price the candidates idx (ascending), and time those that fit unless time_fits is False."""
            if not len(idx):
                return
            sub = lay.take(idx)
            with np.errstate(divide="ignore", invalid="ignore"):
                mem, reason = priced(sub)
                t = np.flatnonzero(reason < 0) if time_fits else np.array([], dtype=np.int64)
                met = time_rows(sub.take(t), {k: v[t] for k, v in mem.items()}) if len(t) else None
            rows.append(idx)
            mems.append(mem)
            reasons.append(reason)
            timed.append(idx[t])
            mets.append(met)

        start, size, bound = 0, FLOOR_FIRST, np.inf
        while start < n and not np.isfinite(bound):  # the first batch, and more until top_k fit
            price(np.sort(order[start:start + size]))
            start, size = start + size, 2 * size
            bound = contender_bound(np.concatenate([np.empty(0)] + timed_steps), top_k)
        while start < n and not floor[order[start]] > bound:  # the rest within the bound, which each slice narrows
            batch = order[start:start + PRICE_SLICE]
            price(np.sort(batch[~(floor[batch] > bound)]))
            start += PRICE_SLICE
            bound = contender_bound(np.concatenate(timed_steps), top_k)
        left = order[start:]
        price(np.sort(left[np.isnan(floor[left])]))
        done = np.zeros(n, dtype=bool)
        for idx in rows:
            done[idx] = True
        if pins.partial_recompute and not np.all(done):
            # the full-recompute twins, not priced yet, of priced no-recompute candidates that do not fit
            rec = np.broadcast_to(np.asarray(lay.recompute), (n,))
            over = np.concatenate([idx[(rec[idx] == RECOMPUTE.index("none")) & (mm["total"] > hw.usable_bytes)]
                                   for idx, mm in zip(rows, mems)])
            key = _row_keys(lay, exclude=("recompute", "recompute_layers"))
            twins = np.flatnonzero(~done & (rec == RECOMPUTE.index("full")) & np.isin(key, key[over]))
            price(twins, time_fits=False)  # (their floors are past the bound: ranked by no one)
            done[twins] = True
        unpriced += int(n - np.count_nonzero(done))
        # the priced candidates in candidate order, then the partial ones (as pricing everything would list them)
        idx = np.concatenate(rows)
        o = np.argsort(idx, kind="stable")
        idx = idx[o]
        mem = {k: np.concatenate([mm[k] for mm in mems])[o] for k in mems[0]}
        reason = np.concatenate(reasons)[o]
        t_all = np.concatenate(timed)
        t_order = np.argsort(t_all, kind="stable")
        met = None
        if len(t_all):
            got = [mt for mt in mets if mt is not None]
            met = {k: np.concatenate([mt[k] for mt in got])[t_order] for k in got[0]}
        unranked += int(np.count_nonzero(reason < 0)) - len(t_all)
        fits = record(lay, mem, reason, t_all[t_order], met, rows=idx)
        part = partial_recompute_candidates(m, tr, hw, lay.take(idx), mem, pins) if pins.partial_recompute else None
        if part is not None:
            candidates += len(part)
            with np.errstate(divide="ignore", invalid="ignore"):
                part_mem, part_reason = priced(part)
                part_floor = np.broadcast_to(np.asarray(step_floor(m, tr, hw, part), dtype=float), (len(part),))
                bound = contender_bound(np.concatenate([np.empty(0)] + timed_steps), top_k)
                t = np.flatnonzero((part_reason < 0) & ~(part_floor > bound))
                part_met = time_rows(part.take(t), {k: v[t] for k, v in part_mem.items()}) if len(t) else None
            unranked += int(np.count_nonzero(part_reason < 0)) - len(t)
            fits = record(part, part_mem, part_reason, t, part_met) or fits
        return fits

    for g in gpu_counts:
        lay, n, failed = screened_layouts(m, tr, g, pins)  # only what passes needs the cost model
        lay, dropped, titan = pin_recompute_layers(m, lay, pins)
        lay, more = hybrid_shard_candidates(tr, hw, lay, pins)
        cand, ep_more = expert_parallel_rows(m, lay, pins)
        candidates += n + more + ep_more
        skipped.append(failed)
        skipped.append(np.full(dropped, REASONS.index("schedule")))
        skipped.append(np.full(titan, REASONS.index("recompute-layers")))
        # what cannot fit on its weights, gradients and optimizer states alone is out of memory whatever
        # the rest: set aside unevaluated, and evaluated only if nothing fits (for the closest miss)
        over = in_chunks(cand, lambda sub: states_floor(m, sub, tr)) > hw.usable_bytes
        if np.any(over):
            floored.append((cand, np.flatnonzero(over)))  # (built only if they are evaluated)
        lay = cand.kept(~over)
        if len(lay) == 0:
            continue
        if cost(lay) and objective == "min-gpus":
            break  # counts ascend: the first that fits is the fewest; larger ones cannot rank higher
    if floored and not layouts:
        for lay, rows in floored:
            cost(lay.take(rows))
        floored = []
    every = np.concatenate(skipped + [np.full(sum(len(rows) for _, rows in floored), REASONS.index("memory"))])
    by_reason = {r: int(np.sum(every == i)) for i, r in enumerate(REASONS) if np.any(every == i)}
    if not layouts:
        best_infeasible = None
        if misses:
            # the closest miss: among candidates that fail only on memory, the smallest footprint
            _, near = min(misses, key=lambda x: x[0])
            with np.errstate(divide="ignore", invalid="ignore"):
                best_infeasible = (near, evaluate(m, tr, hw, near))
        return SearchResult(layout=None, metrics={}, candidates=candidates, feasible=0,
                            seconds=time.perf_counter() - t0, infeasible_by_reason=by_reason,
                            best_infeasible=best_infeasible, unpriced=unpriced)
    # (a batch may have been timed in two parts: every list below is in the order of `layouts`)
    lay = Layout.concat(layouts)
    met = {k: np.concatenate([np.broadcast_to(mm[k], (len(l_),)) for mm, l_ in zip(metric_list, layouts)])
           for k in metric_list[0]}
    keep = contenders(objective, met, top_k)  # sorting these alone gives the same top_k as sorting all
    sub, sub_met = lay.take(keep), {k: v[keep] for k, v in met.items()}
    order = keep[sort_key(objective, sub, sub_met, zero3_counts=not pins.fsdp_native)[:top_k]]
    top = lay.take(order)
    top_met = {k: v[order] for k, v in met.items()}
    return SearchResult(layout=top, metrics=top_met, candidates=candidates, feasible=len(lay) + unranked,
                        seconds=time.perf_counter() - t0, infeasible_by_reason=by_reason, unpriced=unpriced)
