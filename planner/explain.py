"""Why a plan's layout: where its memory and step time go, the dominant cost, and what the runner-up
changes.  Pure functions over Plans (no printing); the CLI renders the dict (planner/render.py).
"""
from __future__ import annotations

from pydantic import ValidationError

from .schema import Parallel, Plan

MEMORY_PARTS = ("weights", "grads", "optimizer", "activations", "other")
TIME_PARTS = (("compute", "compute_s"), ("tp_comm", "tp_comm_s"), ("pp_comm", "pp_comm_s"),
              ("dp_comm", "dp_comm_s"), ("cp_comm", "cp_comm_s"), ("ep_comm", "ep_comm_s"), ("bubble", "bubble_s"),
              ("optimizer", "optimizer_s"))
TIME_LABELS = {"compute": "compute", "tp_comm": "exposed TP communication", "pp_comm": "exposed PP send/recv",
               "dp_comm": "exposed DP communication", "cp_comm": "exposed CP communication",
               "ep_comm": "expert-parallel all-to-all",
               "bubble": "pipeline bubble", "optimizer": "optimizer step + gradient passes"}


def recompute_label(p) -> str:
    """The recompute mode, with partial full recompute as blocks recomputed of each stage's ("full 30/40")."""
    if p.recompute == "full" and p.recompute_layers:
        return f"full {p.recompute_layers}/{max(p.stage_layers) if p.stage_layers else '?'}"
    return p.recompute


def time_label(key: str, plan: Plan) -> str:
    """TIME_LABELS[key], naming the host-link copies the DP part holds under some offloads (dp_host_copies) and what
    of the all-to-alls Megatron's combined 1F1B leaves (Training.moe_a2a_overlap)."""
    if key == "ep_comm" and plan.training.moe_a2a_overlap:
        return "exposed expert-parallel all-to-all (overlapped)"
    return TIME_LABELS[key] + (" and host-link copies" if key == "dp_comm" and dp_host_copies(plan) else "")


def dp_host_copies(plan: Plan) -> bool:
    """Whether the DP part times host-link copies besides the collectives: FSDP2's CPUOffloadPolicy (ZeRO-3 with
    optimizer offload where torch's FSDP runs it), whose gathers copy the rank's shard up and reduce-scatters its
    gradient down (cost_models.memory.fsdp2_offload), and DeepSpeed's offload, which accumulates the gradient
    partition in host memory through the GPU: every micro-batch at ZeRO-3, with gradient accumulation at ZeRO-1/2
    (TrainingConsts.offload_grads_via_host)."""
    from .core import TORCH_FSDP
    p, t = plan.parallel, plan.training
    if p.offload == "none" or p.zero_stage == 0:
        return False
    if t.framework == "deepspeed":
        return p.zero_stage >= 3 or t.num_microbatches > 1
    return p.zero_stage >= 3 and t.framework in TORCH_FSDP


LAYOUT_FIELDS = ("tp", "pp", "dp", "cp", "vpp", "sp", "zero_stage", "recompute", "recompute_layers", "schedule", "offload",
                 "dp_replicate", "ep")

# The memory parts are each part's own largest size over the step; the total is the worse of two moments
# (cost_models/memory.py stage_total: the loss's backward, or a block's backward), at which not every
# part is at its largest (the loss's logits peak and a block's backward working memory never coincide;
# with one micro-batch per step gradients appear as the activations are freed).  The tables show the
# difference as its own (negative) row so that the rows add up to the total.
NOT_LIVE_LABEL = "not live at once (parts peak at different moments)"
NOT_LIVE_MIN_BYTES = 1e6  # below this (0.001 GB) the row is left out: it rounds away


def not_live_rows(apart_bytes: float) -> list[tuple[str, float]]:
    """The tables' (negative) NOT_LIVE_LABEL row for `apart_bytes` not live at the worst moment, or none."""
    return [(NOT_LIVE_LABEL, -apart_bytes)] if apart_bytes > NOT_LIVE_MIN_BYTES else []


def step_remainder(parts_s: dict, step_s: float) -> float:
    """Step time not in the named parts (seconds; ~0 rounding noise is 0).

    The parts are per-stage terms (cost_models/total.py evaluate): compute and the blocks' TP/CP/EP
    communication (with the head's where it holds it) of the critical stage, the one with the most compute,
    while the step runs m micro-batches of the slowest stage, whose time also holds the embedding lookup
    (+ its TP collective), amp's weight casts and, where the slowest stage is another than the critical one,
    what it spends beyond it (its blocks' collectives, the head's).  Not negative since the rows are one
    stage's (before 2026-12-05 the collectives were rank 0's and could exceed it: "less: ...").
    step = parts + remainder, to within 1e-9 of the step (smaller is rounding, read as 0)."""
    r = step_s - sum(parts_s.values())
    return 0.0 if abs(r) <= 1e-9 * max(abs(step_s), 1.0) else r


def remainder_label(remainder_s: float, layout: dict, precision: str | None = None) -> str:
    """What step_remainder holds, for a table row.  layout: layout_dict's keys tp, pp, cp, ep.  precision None:
    not known (the casts are named as amp's, the only recipe that has them)."""
    if remainder_s == 0:  # the slowest stage is the critical one and holds no embedding or casts
        return "other: none"
    if remainder_s < 0:
        # (plans written before 2026-12-05, whose collectives rows were rank 0's and could count more than the
        # slowest stage spends on them)
        return "less: rows above count other stages' work"
    bits = ["embedding"]
    if precision is None:
        bits.append("casts (if amp)")
    elif precision == "amp":
        bits.append("amp weight casts")
    comm = "/".join(k.upper() for k in ("tp", "cp", "ep") if int(layout.get(k, 1) or 1) > 1)
    if int(layout.get("pp", 1)) > 1 and comm:
        # the rows are the critical stage's (the most compute): a slower stage's collectives beyond them are here
        head = " and head" if int(layout.get("tp", 1)) > 1 else ""
        bits.append(f"a slower stage's extra {comm} comm{head}")
    return "other: " + ", ".join(bits)


def layout_key(plan: Plan) -> tuple:
    p = plan.parallel
    return tuple(getattr(p, f) for f in LAYOUT_FIELDS) + (plan.training.micro_batch_size,)


def layout_dict(plan: Plan) -> dict:
    d = {f: getattr(plan.parallel, f) for f in LAYOUT_FIELDS}
    d["micro_batch_size"] = plan.training.micro_batch_size
    d["num_microbatches"] = plan.training.num_microbatches
    return d


def _rel(new: float, old: float) -> float | None:
    """(new - old) / old; 0 where both are 0 (no change: compare's rows of a term neither plan has, such as the
    bubble without a pipeline, had read null), None where only the old one is."""
    if not old:
        return 0.0 if not new else None
    return (new - old) / old


def memory_breakdown(plan: Plan) -> dict:
    pr = plan.prediction
    mem = pr.memory_bytes_per_gpu
    usable = pr.usable_memory_bytes or 0.0
    parts = {k: getattr(mem, k) for k in MEMORY_PARTS}
    biggest = max(parts, key=parts.get)
    return {"parts_bytes": parts, "total_bytes": mem.total,
            # the parts are each part's own largest size; the total is the worse moment (NOT_LIVE_LABEL)
            "not_live_together_bytes": max(0.0, sum(parts.values()) - mem.total), "usable_bytes": usable,
            "headroom_bytes": usable - mem.total, "fraction_of_usable": (mem.total / usable) if usable else None,
            "offloaded_bytes": mem.offloaded, "largest": biggest,
            # each pipeline rank kind's total (first, the fullest middle, last); None without a pipeline
            "by_stage_bytes": mem.by_stage,
            # when the worst rank peaks (None in plans written before it was recorded)
            "peak_moment": mem.peak_moment,
            "largest_fraction": (parts[biggest] / mem.total) if mem.total else None}


def time_breakdown(plan: Plan) -> dict:
    pr = plan.prediction
    tb = pr.time_breakdown
    parts = {k: (getattr(tb, attr) if tb is not None else 0.0) for k, attr in TIME_PARTS}
    step = pr.step_time_s
    dominant = max(parts, key=parts.get)
    overhead = {k: v for k, v in parts.items() if k != "compute"}
    top_overhead = max(overhead, key=overhead.get)
    attention = tb.attention_s if tb is not None else None
    return {"parts_s": parts, "step_time_s": step,
            # what the parts leave out (the embedding and its collective, amp's casts, what a slower stage than
            # the critical one spends beyond it: step_remainder), so that parts + remainder = step
            "remainder_s": step_remainder(parts, step),
            "fractions": {k: (v / step if step else None) for k, v in parts.items()},
            # of compute: the attention core, timed as training.attention_kernel says (None in older plans)
            "attention_s": attention, "attention_kernel": plan.training.attention_kernel,
            "attention_fraction_of_compute": (attention / parts["compute"]) if attention is not None and parts["compute"]
            else None,
            # of compute: an FP8 plan's quantization passes (None for a 16-bit plan, and in older plans)
            "fp8_cast_s": tb.fp8_cast_s if tb is not None else None,
            "dominant": dominant, "dominant_fraction": (parts[dominant] / step) if step else None,
            "largest_overhead": top_overhead,
            "largest_overhead_fraction": (overhead[top_overhead] / step) if step else None}


def compare_plans(a: Plan, b: Plan) -> dict:
    """What b changes relative to a: layout fields that differ, memory and step time (absolute and relative)."""
    la, lb = layout_dict(a), layout_dict(b)
    pa, pb = a.prediction, b.prediction
    changes = {k: {"from": la[k], "to": lb[k]} for k in la if la[k] != lb[k]}
    ma, mb = pa.memory_bytes_per_gpu.total, pb.memory_bytes_per_gpu.total
    time_a, time_b = time_breakdown(a)["parts_s"], time_breakdown(b)["parts_s"]
    mem_a, mem_b = memory_breakdown(a)["parts_bytes"], memory_breakdown(b)["parts_bytes"]
    return {
        "layout": lb, "changes": changes, "fits": pb.fits,
        "step_time_s": pb.step_time_s, "delta_step_time_s": pb.step_time_s - pa.step_time_s,
        "relative_step_time": _rel(pb.step_time_s, pa.step_time_s),
        "memory_total_bytes": mb, "delta_memory_bytes": mb - ma, "relative_memory": _rel(mb, ma),
        "tokens_per_s": pb.tokens_per_s, "relative_tokens_per_s": _rel(pb.tokens_per_s, pa.tokens_per_s),
        "delta_time_parts_s": {k: time_b[k] - time_a[k] for k in time_a},
        "delta_memory_parts_bytes": {k: mem_b[k] - mem_a[k] for k in mem_a},
    }


def _fmt_change(k: str, ch: dict) -> str:
    return f"{k} {ch['from']} -> {ch['to']}"


def runner_label(runner: dict, plan_fits: bool = True) -> str:
    """What the other layout is to this plan: a layout that fits where this plan does not; its runner-up; or, faster
    by more than the search's near tie (the plan within NEAR_TIE of the other's step, where the search ranks the
    simpler layout first), a faster layout (a hand-edited plan's, a memory objective's)."""
    from .search import NEAR_TIE
    if not plan_fits and runner.get("fits"):
        return "a layout that fits"
    # relative_step_time = other / plan - 1; the search's tie is plan <= (1 + NEAR_TIE) x other
    return "a faster layout" if (runner.get("relative_step_time") or 0) < -NEAR_TIE / (1 + NEAR_TIE) else "runner-up"


def after_backward_moment(moment: str | None) -> str | None:
    """A peak that comes after the backward (MemoryBreakdown.peak_moment), named short ("optimizer step",
    "gradient reduction"): its activations read 0 because none are live then.  None for a backward peak, or a plan
    that does not record it."""
    return None if moment in (None, "backward") else moment.removesuffix(" after the backward")


def peak_moment_words(moment: str | None) -> str:
    """The memory line's words for an after-the-backward peak (after_backward_moment), or nothing."""
    short = after_backward_moment(moment)
    return "" if short is None else f" at the {short} (after the backward: no activations are live)"


def split_against_default(plan: Plan) -> dict | None:
    """Where the plan's stage_layers is not the default split (recommend's balanced split, or a hand-edited one): both
    splits and the step the default one would take (evaluate_plan of the plan with it), or None."""
    from .core import PlannerError, default_stage_layers, evaluate_plan, own_stage_layers
    own = own_stage_layers(plan)
    if own is None:
        return None
    default = default_stage_layers(plan)
    other = plan.model_copy(update={"parallel": plan.parallel.model_copy(update={"stage_layers": default})})
    try:
        step = evaluate_plan(other).prediction.step_time_s
    except PlannerError:
        step = None
    return {"stage_layers": own, "default": default, "default_step_time_s": step}


# Switches a framework offers that shorten a step without changing the layout, each as recommend's option and the
# Training field it sets: (field, value, option, frameworks that have it, what turning it on changes beyond speed).
# The exports write each framework's own flag for it (Megatron-LM: --overlap-grad-reduce, --overlap-param-gather,
# --tp-comm-overlap, --moe-token-dispatcher-type flex with DeepEP, --overlap-moe-expert-parallel-comm, --fp8-format
# hybrid; torchtitan: expert_parallel_comm_backend deepep, float8 converters, training.compile; DeepSpeed:
# zero_optimization.overlap_comm).
SWITCHES = (
    ("overlap_grad_reduce", True, "--overlap-grad-reduce", ("parplan", "megatron", "deepspeed", "torchtitan", "fsdp"),
     None),
    ("overlap_param_gather", True, "--overlap-param-gather", ("parplan", "megatron"), None),
    ("overlap_tp_comm", True, "--overlap-tp-comm", ("megatron",), None),
    ("moe_dispatcher", "deepep", "--moe-dispatcher deepep", ("megatron", "torchtitan"), "needs DeepEP installed"),
    ("moe_a2a_overlap", True, "--moe-a2a-overlap", ("megatron",), None),
    # not parplan's runtime: its FP8 linears ran 4.6-5.4x their predicted time on an H100 (2026-12-06, docs/accuracy.md)
    ("fp8", True, "--fp8", ("megatron", "torchtitan"), "FP8 linears: changes the numerics"),
    ("fused_elementwise", True, "--fused-elementwise", ("torchtitan",), "torchtitan's torch.compile"),
)


def _switch_is_off(plan: Plan, field: str, value) -> bool:
    t = plan.training
    if field == "overlap_param_gather":  # absent: as overlap_grad_reduce
        return not (t.overlap_param_gather if t.overlap_param_gather is not None else t.overlap_grad_reduce)
    return getattr(t, field) != value


def switches_left_off(plan: Plan, least: float = 0.001) -> list[dict]:
    """The SWITCHES of the plan's framework it leaves off that would shorten its step by `least` or more (or make a
    plan that does not fit fit), each evaluate_plan of the same plan with that one switch on, its layout unchanged
    (but for Megatron-LM's optimizer instances, _switched_plans);
    a switch the plan's layout or model cannot take (the structure checks' PlannerError: the all-to-all overlap on a
    pipeline without interleaving, DeepEP without experts) is left out.  Fastest first."""
    from .core import PlannerError, evaluate_plan
    base = plan.prediction
    if base is None or not base.step_time_s:
        return []
    out = []
    for field, value, option, note, other in _switched_plans(plan):
        try:
            pred = evaluate_plan(other).prediction
        except PlannerError:
            continue
        rel = pred.step_time_s / base.step_time_s - 1
        if rel > -least and not (pred.fits and not base.fits):
            continue
        out.append({"option": option, "field": field, "value": value, "note": note, "fits": pred.fits,
                    "step_time_s": pred.step_time_s, "relative_step_time": rel,
                    "delta_memory_bytes": pred.memory_bytes_per_gpu.total - base.memory_bytes_per_gpu.total})
    return sorted(out, key=lambda d: d["relative_step_time"])


def _switched_plans(plan: Plan):
    """(field, value, option, note, the plan with it on) for each switch switches_left_off tries: the SWITCHES of the
    plan's framework it leaves off, and a plan's dp ranks across nodes sharding over one node's (--dp-replicate, the
    search's twins; a layout field, so a switch only where the plan's framework has it): under Megatron-LM a ZeRO-1
    plan's distributed optimizer in one instance a node (--num-distributed-optimizer-instances), under the FSDP
    frameworks a ZeRO-3 plan's hybrid sharding (HSDP)."""
    for field, value, option, frameworks, note in SWITCHES:
        if plan.training.framework not in frameworks or not _switch_is_off(plan, field, value):
            continue
        if field in ("moe_dispatcher", "moe_a2a_overlap") and not (plan.model.is_moe and plan.parallel.ep > 1):
            continue
        if field == "overlap_param_gather" and plan.training.framework == "megatron" \
                and not plan.training.overlap_grad_reduce:
            continue  # Megatron-LM takes --overlap-param-gather only with --overlap-grad-reduce (the export's note)
        if field == "overlap_tp_comm" and not plan.parallel.sp:
            continue  # --tp-comm-overlap needs --sequence-parallel (the export leaves it out without it)
        yield field, value, option, note, plan.model_copy(
            update={"training": plan.training.model_copy(update={field: value})})
    p, fw = plan.parallel, plan.training.framework
    if p.dp_replicate != 1:
        return
    from .core import HSDP_FRAMEWORKS
    from .search import node_replicas  # the search's hybrid twins' rule: one node's dp ranks a group
    r = int(node_replicas(p.tp, p.pp, p.dp, plan.hardware.gpus_per_node, p.cp))
    if not r:
        return
    try:  # (Parallel's rules: r must also divide a mixture of experts' data-parallel group)
        switched = plan.model_copy(update={"parallel": Parallel.model_validate({**p.model_dump(), "dp_replicate": r})})
    except ValidationError:
        return
    if fw == "megatron" and p.zero_stage == 1:
        yield "dp_replicate", r, f"--dp-replicate {r}", f"the distributed optimizer in {r} instances, a node's " \
            f"{p.dp // r} ranks each: optimizer states {r}x", switched
    elif fw in HSDP_FRAMEWORKS and p.zero_stage == 3:
        cp = " with their cp ranks" if p.cp > 1 and fw != "parplan" else ""
        yield "dp_replicate", r, f"--dp-replicate {r}", f"hybrid sharding: a node's {p.dp // r} dp ranks{cp} shard " \
            f"the states, {r} replicas: states {r}x", switched


def switches_line(switches: list[dict], plan_fits: bool = True) -> str | None:
    """explain's summary line for switches_left_off, or None; `plan_fits` False: the plan does not fit, and a switch
    under which it would is said to."""
    if not switches:
        return None
    gb = 1e9
    said = []
    for s in switches:
        dm = s["delta_memory_bytes"] / gb
        mem = "" if abs(dm) < 0.05 else f", memory {dm:+.1f} GB"
        fits = (", fits" if not plan_fits else "") if s["fits"] else ", does not fit"
        note = f" ({s['note']})" if s["note"] else ""
        said.append(f"{s['option']}{note} {s['relative_step_time']:+.1%} step{mem}{fits}")
    return "switches left off: " + "; ".join(said) + " (each alone, same layout otherwise: add it to recommend or " \
        "set it in the plan; `parplan export` writes the framework's own flag)"


def summary(plan: Plan, mem: dict, tim: dict, runner: dict | None, split: dict | None = None) -> list[str]:
    gb = 1e9
    lines = []
    if mem["usable_bytes"]:
        lines.append(f"memory: {mem['total_bytes'] / gb:.1f} GB of {mem['usable_bytes'] / gb:.1f} GB usable per GPU "
                     f"({mem['fraction_of_usable']:.0%}){peak_moment_words(mem.get('peak_moment'))}; largest part "
                     f"{mem['largest']} ({mem['largest_fraction']:.0%} of the total)")
    if tim["step_time_s"]:
        lines.append(f"time: {time_label(tim['dominant'], plan)} dominates the {tim['step_time_s']:.3g} s step "
                     f"({tim['dominant_fraction']:.0%}); largest overhead {time_label(tim['largest_overhead'], plan)} "
                     f"({tim['largest_overhead_fraction']:.1%})")
    if not plan.prediction.fits:
        lines.append(f"does not fit: {plan.prediction.reason}")
    if split is not None:
        from .render import compact_counts
        other = split["default_step_time_s"]
        lines.append(f"split: stage_layers {compact_counts(split['stage_layers'])}, not the default "
                     f"{compact_counts(split['default'])}"
                     + (f", which would take {other:.3g} s a step ({other / tim['step_time_s'] - 1:+.1%})"
                        if other and tim["step_time_s"] else ""))
    if runner is None:
        lines.append("runner-up: none (no other layout fits these GPUs)")
        return lines
    what = ", ".join(_fmt_change(k, v) for k, v in runner["changes"].items()) or "same layout"
    dt = runner["relative_step_time"]
    dm = runner["delta_memory_bytes"]
    moved = sorted(runner["delta_time_parts_s"].items(), key=lambda kv: -abs(kv[1]))[0]
    label = runner_label(runner, plan.prediction.fits)
    lines.append(f"{label} ({what}): step time {'+' if (dt or 0) >= 0 else ''}{(dt or 0):.1%}, "
                 f"memory {'+' if dm >= 0 else ''}{dm / gb:.1f} GB per GPU; biggest time change "
                 f"{time_label(moved[0], plan)} {'+' if moved[1] >= 0 else ''}{moved[1]:.3g} s")
    return lines


def explain(plan: Plan, runner_up: Plan | None) -> dict:
    """The explanation of an evaluated plan (prediction filled in) against an optional runner-up."""
    mem = memory_breakdown(plan)
    tim = time_breakdown(plan)
    runner = compare_plans(plan, runner_up) if runner_up is not None and runner_up.prediction is not None else None
    split = split_against_default(plan)
    switches = switches_left_off(plan)
    lines = summary(plan, mem, tim, runner, split)
    said = switches_line(switches, plan.prediction.fits)
    return {"layout": layout_dict(plan), "model": plan.model.name or plan.model.arch,
            "gpus": plan.hardware.gpus, "hardware": plan.hardware.name, "precision": plan.training.precision,
            "fits": plan.prediction.fits,
            "reason": plan.prediction.reason, "memory": mem, "time": tim,
            "tokens_per_s": plan.prediction.tokens_per_s, "mfu": plan.prediction.mfu,
            "warnings": list(plan.prediction.warnings),  # what `evaluate` prints beside the same plan
            "runner_up": runner, "split": split, "switches_left_off": switches,
            "summary": lines + ([said] if said else [])}


def pick_runner_up(plan: Plan, ranked: list[Plan]) -> Plan | None:
    """First plan in `ranked` whose layout differs from `plan`'s."""
    key = layout_key(plan)
    for cand in ranked:
        if cand.prediction is not None and layout_key(cand) != key:
            return cand
    return None


def _split_label(plan: Plan) -> str:
    """The plan's blocks per virtual stage, compact ("8, 9 x2, 6"), for compare's row."""
    from .render import compact_counts
    return compact_counts(plan.parallel.stage_layers) if plan.parallel.stage_layers else "-"


COMPARE_ROWS = (
    ("gpus", lambda p: p.hardware.gpus), ("tp", lambda p: p.parallel.tp), ("pp", lambda p: p.parallel.pp),
    ("dp", lambda p: p.parallel.dp), ("dp_replicate", lambda p: p.parallel.dp_replicate), ("cp", lambda p: p.parallel.cp),
    ("ep", lambda p: p.parallel.ep),
    ("vpp", lambda p: p.parallel.vpp),
    ("stage_layers", lambda p: _split_label(p)),
    ("micro_batch_size", lambda p: p.training.micro_batch_size),
    ("num_microbatches", lambda p: p.training.num_microbatches),
    ("zero_stage", lambda p: p.parallel.zero_stage), ("recompute", lambda p: recompute_label(p.parallel)),
    ("sp", lambda p: p.parallel.sp), ("schedule", lambda p: p.parallel.schedule),
    ("offload", lambda p: p.parallel.offload), ("fp8", lambda p: p.training.fp8),
    ("memory_total_bytes", lambda p: p.prediction.memory_bytes_per_gpu.total),
    ("memory_activations_bytes", lambda p: p.prediction.memory_bytes_per_gpu.activations),
    ("memory_optimizer_bytes", lambda p: p.prediction.memory_bytes_per_gpu.optimizer),
    ("step_time_s", lambda p: p.prediction.step_time_s),
    ("compute_s", lambda p: time_breakdown(p)["parts_s"]["compute"]),
    ("exposed_comm_s", lambda p: sum(v for k, v in time_breakdown(p)["parts_s"].items() if k.endswith("_comm"))),
    ("bubble_s", lambda p: time_breakdown(p)["parts_s"]["bubble"]),
    ("optimizer_s", lambda p: time_breakdown(p)["parts_s"]["optimizer"]),
    ("tokens_per_s", lambda p: p.prediction.tokens_per_s), ("mfu", lambda p: p.prediction.mfu),
    ("bubble_fraction", lambda p: p.prediction.bubble_fraction),
    ("comm_bytes_per_step", lambda p: sum(p.prediction.comm_bytes_per_step.model_dump().values())),
    ("fits", lambda p: p.prediction.fits),
)


def compare(a: Plan, b: Plan) -> list[dict]:
    """Side-by-side rows (the same for any two plans): name, a, b, relative difference of b against a."""
    rows = []
    for name, get in COMPARE_ROWS:
        va, vb = get(a), get(b)
        rel = None
        if isinstance(va, (int, float)) and not isinstance(va, bool) and isinstance(vb, (int, float)):
            rel = _rel(float(vb), float(va))
        rows.append({"name": name, "a": va, "b": vb, "relative": rel})
    return rows
