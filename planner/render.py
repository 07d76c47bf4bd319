"""Human output: rich tables on stderr-or-terminal.  JSON never goes through rich."""
from __future__ import annotations

from .accuracy import group as accuracy_group
from .accuracy import line as accuracy_line
from .core import FORMAT_FRAMEWORK
from .explain import after_backward_moment, recompute_label
from .schema import Plan

GB = 1e9


# memory_bytes_per_gpu.by_stage's keys as the tables print them
STAGE_NAMES = {"first": "pipeline rank 0", "middle": "fullest middle rank", "last": "last pipeline rank"}



# a plan with Megatron-Core's combined 1F1B (Training.moe_a2a_overlap): no run in the sets used it
A2A_OVERLAP_UNCHECKED = ("the all-to-all overlap (moe_a2a_overlap) is modelled, and no published or measured run "
                         "here used it")
# a Megatron-LM plan with its distributed optimizer in instances (dp_replicate under ZeRO-1): none in the sets did
INSTANCES_UNCHECKED = ("the distributed optimizer in instances (dp_replicate) is modelled, and no published or measured "
                       "run here used it")

def _fmt_bytes(x: float) -> str:
    return f"{x / GB:.1f} GB"


def _fmt_s(x: float) -> str:
    if x >= 1:
        return f"{x:.2f} s"
    return f"{x * 1e3:.1f} ms"


def layout_label(p) -> str:
    bits = [f"tp{p.tp}", f"pp{p.pp}", f"dp{p.dp}"]
    if p.dp_replicate > 1:  # hybrid sharding: replica groups x ranks that shard (HSDP)
        bits[-1] += f"={p.dp_replicate}x{p.dp // p.dp_replicate}"
    if p.cp > 1:
        bits.append(f"cp{p.cp}")
    if p.ep > 1:  # a mixture of experts' expert parallelism (its ranks taken from tp x cp x dp)
        bits.append(f"ep{p.ep}")
    return " ".join(bits)


def full_layout_label(p) -> str:
    """layout_label with what else sets a plan apart where it is not the default: virtual stages, sequence
    parallelism, the ZeRO stage, recompute and offload (sweep's one column: "tp4 pp2 dp1 zero1 offload")."""
    bits = [layout_label(p)] + ([f"vpp{p.vpp}"] if p.vpp > 1 else []) + (["sp"] if p.sp else [])
    bits += ([f"zero{p.zero_stage}"] if p.zero_stage else []) + ([recompute_label(p)] if p.recompute != "none" else [])
    return " ".join(bits + (["offload"] if p.offload != "none" else []))


def _fmt_signed_s(x: float) -> str:
    return ("-" + _fmt_s(-x)) if x < 0 else _fmt_s(x)


def ranking_note(plans: list[Plan]) -> str | None:
    """One line for under the plans table when a lower-ranked plan is faster than #1: the throughput
    ranking's near-tie rule (planner/search.py sort_key) put it there.  None when nothing needs saying."""
    if not plans or plans[0].prediction is None:
        return None
    if plans[0].search is not None and plans[0].search.objective != "throughput":
        return None
    if not plans[0].prediction.fits:
        return None
    best = plans[0].prediction.step_time_s
    faster = [(i, pl.prediction.step_time_s) for i, pl in enumerate(plans[1:], 2)
              if pl.prediction is not None and pl.prediction.step_time_s < best]
    if not faster:
        return None
    from .search import NEAR_TIE
    i, t = min(faster, key=lambda it: it[1])
    return (f"note: #{i} is faster than #1 ({_fmt_s(t)} vs {_fmt_s(best)}): plans within {NEAR_TIE:.0%} of the fastest "
            "rank simplest first (avoiding offload, then CP, then ZeRO-3)")


# below this many columns the plans table folds its policy columns into the layout's one (at 80 every column of the
# full table had been cut to a character or two)
COMPACT_WIDTH = 140


def plans_table(plans: list[Plan], title: str, width: int | None = None):
    """The ranked plans, with ranking_note's line under them when there is one; narrower than COMPACT_WIDTH (a
    terminal's `width`), one layout column says what the vpp, mbs, ZeRO, recompute, SP, schedule and offload
    columns do (full_layout_label, the micro-batch, the schedule with a pipeline) and the bubble and
    communication columns are left out (`--json` and the breakdown below keep them)."""
    from rich.table import Table
    t = Table(title=title, title_justify="left", header_style="bold")
    compact = width is not None and width < COMPACT_WIDTH
    cols = (("#", "layout", "mem/GPU", "step", "tokens/s", "MFU") if compact else
            ("#", "layout", "vpp", "mbs", "zero", "recompute", "sp", "schedule", "offload",
             "mem/GPU", "step", "tokens/s", "MFU", "bubble", "comm/GPU"))
    for col in cols:
        t.add_column(col, justify="right" if col not in ("layout", "recompute", "schedule", "offload") else "left")
    for i, pl in enumerate(plans, 1):
        p, pr = pl.parallel, pl.prediction
        mem = pr.memory_bytes_per_gpu
        comm = pr.comm_bytes_per_step
        cap = pr.usable_memory_bytes or 0
        speed = [f"{mem.total / GB:.1f}/{cap / GB:.0f} GB", _fmt_s(pr.step_time_s), f"{pr.tokens_per_s:,.0f}",
                 f"{pr.mfu * 100:.1f}%"]
        if compact:
            label = " ".join([full_layout_label(p), f"mbs{pl.training.micro_batch_size}"]
                             + ([p.schedule] if p.pp > 1 else []))
            t.add_row(str(i), label, *speed)
            continue
        t.add_row(str(i), layout_label(p), str(p.vpp), str(pl.training.micro_batch_size), str(p.zero_stage),
                  recompute_label(p), "y" if p.sp else "n", p.schedule, p.offload, *speed,
                  f"{pr.bubble_fraction * 100:.1f}%", _fmt_bytes(comm.tp + comm.pp + comm.dp + comm.cp))
    note = ranking_note(plans)
    if note is None:
        return t
    # under the table, as wide as the console (a caption would wrap at the table's width)
    from rich.console import Group
    from rich.text import Text
    return Group(t, Text(note))


def activations_label(moment: str | None) -> str:
    """The activations row's label: where the peak comes after the backward (explain.after_backward_moment), it says
    that none are live then, so the 0 beside it is not read as activations left out."""
    short = after_backward_moment(moment)
    return "activations" if short is None else f"activations (none live at the {short})"


def memory_rows(plan: Plan) -> list[tuple[str, float]]:
    """(label, bytes) of the best plan's memory table: the parts, the part of them not live at the worst
    moment (negative), the total (the parts and that row add up to it), then capacity and per-stage rows."""
    from .explain import memory_breakdown, not_live_rows
    pr = plan.prediction
    mem = pr.memory_bytes_per_gpu
    rows = [("weights", mem.weights), ("grads", mem.grads), ("optimizer", mem.optimizer),
            (activations_label(mem.peak_moment), mem.activations), ("other (working, buffers, step copies)", mem.other)]
    rows += not_live_rows(memory_breakdown(plan)["not_live_together_bytes"])
    rows += [("total", mem.total), ("usable HBM", pr.usable_memory_bytes or 0)]
    if mem.offloaded:
        rows.append(("offloaded to host", mem.offloaded))
    for kind, v in (mem.by_stage or {}).items():
        rows.append((f"  {STAGE_NAMES[kind]}", v))
    return rows


def time_rows(plan: Plan) -> list[tuple[str, float]]:
    """(label, seconds) of the best plan's step-time table: the named parts, the remainder of the step they
    leave (explain.step_remainder: the slowest stage's embedding, casts, ...), and the step; the rows before
    the step add up to it."""
    from .explain import TIME_PARTS, dp_host_copies, layout_dict, remainder_label, step_remainder
    pr = plan.prediction
    tb = pr.time_breakdown
    labels = {"compute": "compute", "tp_comm": "TP comm (exposed)", "pp_comm": "PP send/recv",
              "dp_comm": "DP comm" + (" + host copies" if dp_host_copies(plan) else "") + " (exposed)",
              "cp_comm": "CP comm (exposed)",
              "ep_comm": "EP all-to-all" + (" (exposed)" if plan.training.moe_a2a_overlap else ""),
              "bubble": "pipeline bubble",
              "optimizer": "optimizer + grad passes"}
    parts = {k: (getattr(tb, attr) if tb is not None else 0.0) for k, attr in TIME_PARTS
             if k != "ep_comm" or plan.model.is_moe}  # a dense model has no expert-parallel row
    rest = step_remainder(parts, pr.step_time_s)
    label = remainder_label(rest, layout_dict(plan), plan.training.precision) if tb is not None else "not broken down"
    return [(labels[k], v) for k, v in parts.items()] + [(label, rest), ("step", pr.step_time_s)]


def breakdown_table(plan: Plan, which: str = "best plan"):
    from rich.table import Table
    t = Table(title=f"{which}: where memory and time go", title_justify="left", header_style="bold")
    t.add_column("memory per GPU (worst stage)")
    t.add_column("", justify="right")
    t.add_column("step time")
    t.add_column("", justify="right")
    mem_rows = memory_rows(plan)
    t_rows = time_rows(plan)
    for i in range(max(len(mem_rows), len(t_rows))):
        a = mem_rows[i] if i < len(mem_rows) else ("", None)
        b = t_rows[i] if i < len(t_rows) else ("", None)
        t.add_row(a[0], _fmt_bytes(a[1]) if a[1] is not None else "", b[0],
                  _fmt_signed_s(b[1]) if b[1] is not None else "")
    return t


def compact_counts(counts) -> str:
    """[0, 1, 1, 1, 0] -> "[0, 1 x3, 0]": runs of equal counts, so 128 virtual stages fit a line."""
    if not counts:
        return "[]"
    runs = []
    for c in counts:
        if runs and runs[-1][0] == c:
            runs[-1][1] += 1
        else:
            runs.append([c, 1])
    return "[" + ", ".join(f"{c}" if n == 1 else f"{c} x{n}" for c, n in runs) + "]"


def _window_text(plan: Plan) -> str:
    """The model line's sliding window and Llama 4's chunks (ModelSpec.attention_chunk), and whether this plan's
    framework trains them (planner.core.model_dims)."""
    from .core import CHUNK_FRAMEWORKS, trains_window
    m, t = plan.model, plan.training
    for n, what, binds, trained in (
            (m.windowed_layers, f"a {m.sliding_window}-token window", m.window_binds, trains_window(m, t.framework)),
            (m.chunked_layers, f"{m.attention_chunk}-token chunks", m.chunk_binds, t.framework in CHUNK_FRAMEWORKS)):
        if n:
            text = f", {n} of {m.layers} layers within {what}"
            if not binds(t.seq_len):
                return text
            return text + (" (counted)" if trained else f" (counted as full: {t.framework} attends over the whole "
                                                        "prefix)")
    return ""


def _documents_text(plan: Plan) -> str:
    """Packed documents (Training.document_length), and whether this plan's framework skips the attention across them
    (planner.core.DOCUMENT_FRAMEWORKS)."""
    from .core import DOCUMENT_FRAMEWORKS
    d, t = plan.training.document_length, plan.training
    if not d or d >= t.seq_len:
        return ""
    return f", packed documents of {d} tokens" + (" (counted)" if t.framework in DOCUMENT_FRAMEWORKS else
                                                 f" (counted as full: {t.framework} computes across them)")


def _norms_text(plan: Plan) -> str:
    """The model line's q/k norms, post-norms and norms after the sublayers (ModelSpec.qk_norm, post_norms,
    norms_after), which every framework's plan counts (parplan's runtime builds all three)."""
    m = plan.model
    qk = "q/k norms over the whole width" if m.qk_norm_whole else "q/k norms"  # (ModelSpec.qk_norm_whole)
    names = [n for n, on in ((qk, m.qk_norm), ("post-norms", m.post_norms),
                             ("norms after the sublayers", m.norms_after),
                             ("q/k/v biases", m.qkv_bias)) if on]  # (ModelSpec.norms_after, qkv_bias)
    text = f"; {' and '.join(names)} counted" if names else ""
    if m.parallel_block:  # (ModelSpec.parallel_block: counted where the framework builds it, parplan's runtime)
        built = "counted" if plan.training.framework == "parplan" else \
            f"counted as sequential: {plan.training.framework} builds those"
        text += f"; attention and MLP side by side ({built})"
    return text


def _speedup_text(plan: Plan) -> str:
    """The Amdahl line: none on one GPU (nothing is split, and below 1x there is offload or the optimizer, not
    communication); on more, the speedup or what outweighs the split work."""
    am, gpus = plan.prediction.amdahl, plan.hardware.gpus
    if gpus == 1:
        return "one GPU: no parallel speedup to report"
    if am.speedup >= 1:
        return f"Amdahl parallel fraction {am.parallel_fraction:.4f} -> speedup {am.speedup:.1f}x on {gpus} GPUs"
    return (f"no parallel speedup: {am.speedup:.2f}x one GPU's compute on {gpus} GPUs (communication, offload and the "
            "optimizer outweigh the split work)")


def nics_pooled(hw) -> bool | None:
    """Whether a plan's collectives across nodes pool a node's NICs: its --pool-nics, else its profile's setting
    (None where the profile cannot be loaded)."""
    if hw.aggregate_nics is not None:
        return hw.aggregate_nics
    import hardware_profiles
    try:
        return bool(hardware_profiles.load_profile(hw.name).inter_node.aggregate_nics)
    except (ValueError, OSError):
        return None


def _network_line(plan: Plan) -> str | None:
    """Where the data-parallel traffic crosses nodes with several of a group's ranks on each and is a visible share
    of the step, which network model the prediction took: one NIC per rank unless pooled (--pool-nics), and how to
    tell which a cluster does."""
    from types import SimpleNamespace

    from cost_models.comm import data_parallel_ranks_per_node
    hw, par, tb = plan.hardware, plan.parallel, plan.prediction.time_breakdown
    if tb is None or hw.gpus <= hw.gpus_per_node:
        return None
    # where pooling changes something: a data-parallel group (dp, or dp x cp) with several ranks on a node
    local = data_parallel_ranks_per_node(SimpleNamespace(gpus_per_node=hw.gpus_per_node), par.tp, par.cp, par.pp,
                                         par.dp)
    step = plan.prediction.step_time_s
    if max(int(x) for x in local) <= 1 or not step or tb.dp_comm_s < 0.05 * step:
        return None
    pooled = nics_pooled(hw)
    if pooled is None:
        return None
    share = f"data-parallel communication {tb.dp_comm_s / step:.0%} of the step"
    if pooled:
        return f"network: {share}, with a node's NICs pooled for its ranks (--pool-nics; --one-nic-per-rank if not)"
    return (f"network: {share} at one NIC per rank; if your NCCL pools a node's NICs (nccl-tests' all-reduce bus "
            "bandwidth across nodes near all the node's NICs together), --pool-nics predicts that")


def _experts_text(m) -> str:
    """A mixture of experts' experts, top-k and parameters a token runs (the MFU's count), for the model line."""
    from cost_models.params import param_counts
    active = param_counts(m)["active"]
    shared = f", a shared expert of ffn {m.shared_expert_ffn}" if m.shared_expert_ffn else ""
    dense = m.layers - m.moe_block_count
    between = ""
    if dense:
        where = f"the first {m.first_dense_layers}" if not (m.moe_layer_step or 1) > 1 else f"{dense}"
        between = f"; {where} of the {m.layers} blocks dense, ffn {m.dense_ffn_hidden}"
    return (f"{m.experts} experts of ffn {m.ffn_hidden}, top {m.experts_per_token}{shared}{between} "
            f"({active / 1e9:.2f} B active)")


def _heads_text(m) -> str:
    """The attention's heads for the model line: query / key-value heads, or multi-head latent attention's latents."""
    if m.kv_lora_rank is None:
        return f"heads {m.heads}/{m.kv_heads} kv, "
    q = f", q latent {m.q_lora_rank}" if m.q_lora_rank else ""
    return f"heads {m.heads} of {m.head_dim} (v {m.v_head_dim}), latent attention: kv latent {m.kv_lora_rank}{q}, "


def _latent_runs_text(group: str) -> str:
    """Of the published runs in a mixture of experts' accuracy line, those like a model with dense blocks between
    its MoE ones or with latent attention: DeepSeek-V3's (validate's latent_attention entry), or none."""
    from .accuracy import _pct, load
    lat = load().get("published", {}).get(group, {}).get("latent_attention")
    if not lat:
        return " (none of them a model with dense blocks between its MoE ones or latent attention)"
    return (f" ({lat['runs']} of them DeepSeek-V3's, with latent attention, dense blocks between its MoE ones and "
            f"multi-token prediction: |error| median {_pct(lat['median_abs_error'])}, "
            f"max {_pct(lat['max_abs_error'])})")


def _split_text(plan) -> str:
    """Where the plan's split is not the default one (the search's balanced split, a lighter head stage: core.
    lighten_head_stage; or a hand-edited one): the default split beside it."""
    from .core import default_stage_layers, own_stage_layers
    if own_stage_layers(plan) is None:
        return ""
    return f"; the default split is {compact_counts(default_stage_layers(plan))}"


def _dense_stages_text(plan: Plan) -> str:
    """Where a mixture of experts' dense blocks between the MoE ones sit: each virtual stage's count, those holding any
    (ModelSpec.is_moe_block over the stages' blocks in order); nothing for a model without them."""
    m = plan.model
    if not m.is_moe or m.moe_block_count == m.layers or not plan.parallel.stage_layers:
        return ""
    held, start = [], 0
    for stage, n in enumerate(plan.parallel.stage_layers):
        dense = sum(not m.is_moe_block(i) for i in range(start, start + n))
        start += n
        if dense:
            held.append(f"{dense} in stage {stage}" if len(plan.parallel.stage_layers) > 1 else str(dense))
    return f"; dense blocks {', '.join(held)}" if len(held) <= 4 else \
        f"; dense blocks in {len(held)} of the {len(plan.parallel.stage_layers)} stages"


def summary_lines(plan: Plan) -> list[str]:
    from cost_models.params import param_counts
    pr = plan.prediction
    m = plan.model
    fw = plan.training.framework
    lines = [
        f"model {m.name or m.arch}: {m.num_params / 1e9:.2f} B params, {m.layers} layers, hidden {m.hidden}, "
        + _heads_text(m) + (_experts_text(m) if m.is_moe else f"ffn {m.ffn_hidden}")
        + f", vocab {m.vocab}"
        + (f"; multi-token prediction {m.mtp_layers} deep ({param_counts(m)['mtp'] / 1e9:.2f} B more, on the "
           f"last stage)" if m.mtp_layers else "")
        + _window_text(plan) + _documents_text(plan) + _norms_text(plan),
        f"MFU {pr.mfu * 100:.1f}%  HFU {pr.hfu * 100:.1f}%  model {pr.model_tflops_per_gpu:.0f} TFLOP/s/GPU  "
        + _speedup_text(plan),
        *(["linears in FP8 (training.fp8; MFU and HFU against the 16-bit peak, as for a 16-bit plan)"]
          if plan.training.fp8 else []),
        f"stage_layers {compact_counts(plan.parallel.stage_layers)} (blocks per virtual stage; "
        f"{len(plan.parallel.stage_layers or [])} stage{'s' * (len(plan.parallel.stage_layers or []) != 1)})"
        + _split_text(plan) + _dense_stages_text(plan),
        f"framework {fw}" + (" (what `parplan launch` runs)" if fw == "parplan" else
                             "".join(f" (`parplan export --to {' | '.join(fs)}`)" for fs in
                                     [[f for f, w in FORMAT_FRAMEWORK.items() if w == fw]] if fs)),
    ]
    how = accuracy_line(accuracy_group(fw, plan.model.is_moe), plan.hardware.name, plan.training.fp8)
    if how and plan.model.is_moe and "published" in how and (plan.model.moe_block_count < plan.model.layers
                                                             or plan.model.kv_lora_rank is not None):
        how += _latent_runs_text(accuracy_group(fw, plan.model.is_moe))
    if how and plan.training.moe_a2a_overlap:
        how += f"; {A2A_OVERLAP_UNCHECKED}"
    if how and fw == "megatron" and plan.parallel.dp_replicate > 1:
        how += f"; {INSTANCES_UNCHECKED}"
    if how:
        lines.append(how)
    if pr.days_to_train is not None:
        lines.append(f"time to train {plan.training.tokens:.3g} tokens: {pr.days_to_train:.1f} days, "
                     f"{pr.gpu_hours_to_train:,.0f} GPU-hours")
    network = _network_line(plan)
    if network:
        lines.append(network)
    if plan.search:
        s = plan.search
        reasons = ", ".join(f"{k} {v}" for k, v in s.infeasible_by_reason.items()) or "none"
        unpriced = f", {s.unpriced:,} past the best on their step-time floor (not priced)" if s.unpriced else ""
        lines.append(f"searched {s.candidates:,} candidates in {s.seconds:.3f} s: {s.feasible:,} feasible{unpriced}; "
                     f"infeasible by reason: {reasons}")
    for w in pr.warnings:
        lines.append(f"warning: {w}")
    return lines


def _fmt_rel(x) -> str:
    return "" if x is None else f"{x:+.1%}"


def _fmt_value(name: str, v) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, str)):
        return f"{v:,}" if isinstance(v, int) else v
    if name == "tokens_per_s":
        return f"{v:,.0f}"
    if name.endswith("_bytes") or name == "comm_bytes_per_step":
        return _fmt_bytes(v)
    if name.endswith("_s"):
        return _fmt_s(v)
    if name in ("mfu", "bubble_fraction"):
        return f"{v * 100:.1f}%"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.4g}"


def explain_memory_rows(data: dict) -> list[tuple[str, float]]:
    """(part, bytes) rows of `explain`'s memory table above the total: the parts and, as in the recommend
    table, the part of them not live at the worst moment (negative); they add up to the total."""
    from .explain import not_live_rows
    mem = data["memory"]
    label = {"activations": activations_label(mem.get("peak_moment"))}
    return ([(label.get(k, k), v) for k, v in mem["parts_bytes"].items()]
            + not_live_rows(mem.get("not_live_together_bytes") or 0.0))


def explain_time_remainder(data: dict) -> float:
    """The step time `explain`'s named parts leave (explain.step_remainder)."""
    from .explain import step_remainder
    return step_remainder(data["time"]["parts_s"], data["time"]["step_time_s"])


def explain_renderables(data: dict) -> list:
    """Rich tables and plain lines for `parplan explain` (printed on stdout)."""
    from rich.table import Table
    from .explain import remainder_label, step_remainder
    lay = data["layout"]
    hybrid = lay.get("dp_replicate") or 1
    kind = "hybrid sharding" if lay["zero_stage"] == 3 else "optimizer instances"  # Megatron's, under ZeRO-1
    hsdp = "" if hybrid == 1 else f"={hybrid}x{lay['dp'] // hybrid} ({kind})"
    ep = "" if (lay.get("ep") or 1) == 1 else f" ep{lay['ep']}"
    head = (f"{data['model']} on {data['gpus']} x {data['hardware']}: tp{lay['tp']} pp{lay['pp']} dp{lay['dp']}{hsdp} "
            f"cp{lay['cp']}{ep} vpp{lay['vpp']} mbs{lay['micro_batch_size']} zero{lay['zero_stage']} "
            f"{lay['recompute']}{'' if not lay.get('recompute_layers') else ' ' + str(lay['recompute_layers']) + ' blocks/stage'} "
            f"{lay['schedule']} offload {lay['offload']}")
    mem, tim, run = data["memory"], data["time"], data["runner_up"]
    t = Table(title="memory per GPU vs capacity", title_justify="left", header_style="bold")
    for c in ("part", "bytes", "share"):
        t.add_column(c, justify="left" if c == "part" else "right")
    for k, v in explain_memory_rows(data):
        t.add_row(k, _fmt_bytes(v), f"{v / mem['total_bytes'] * 100:.0f}%" if mem["total_bytes"] else "")
    t.add_row("total", _fmt_bytes(mem["total_bytes"]),
              f"{mem['fraction_of_usable'] * 100:.0f}% of usable" if mem["fraction_of_usable"] is not None else "")
    t.add_row("usable HBM", _fmt_bytes(mem["usable_bytes"]), "")
    t.add_row("headroom", _fmt_bytes(mem["headroom_bytes"]), "")
    for k, v in (mem.get("by_stage_bytes") or {}).items():
        t.add_row(f"  {STAGE_NAMES[k]}", _fmt_bytes(v), f"{v / mem['usable_bytes'] * 100:.0f}% of usable"
                  if mem["usable_bytes"] else "")
    u = Table(title="step time", title_justify="left", header_style="bold")
    from .explain import runner_label
    label_of = {"a faster layout": "faster layout's", "a layout that fits": "fitting layout's"}
    cols = ["part", "time", "share"] + ([label_of.get(runner_label(run, data["fits"]), "runner-up") + " change"]
                                        if run else [])
    for c in cols:
        u.add_column(c, justify="left" if c == "part" else "right")
    rest = explain_time_remainder(data)
    for k, v in tim["parts_s"].items():
        frac = tim["fractions"][k]
        row = [k, _fmt_s(v), "" if frac is None else f"{frac * 100:.1f}%"]
        if run:
            d = run["delta_time_parts_s"][k]
            row.append(("+" if d >= 0 else "-") + _fmt_s(abs(d)))
        u.add_row(*row)
        if k == "compute" and tim.get("attention_s") is not None:
            kern = "" if tim["attention_kernel"] == "profile" else f", {tim['attention_kernel']} kernel"
            att = ["  of which attention" + kern, _fmt_s(tim["attention_s"]),
                   f"{tim['attention_fraction_of_compute'] * 100:.1f}% of compute"
                   if tim["attention_fraction_of_compute"] is not None else ""]
            u.add_row(*(att + ([""] if run else [])))
        if k == "compute" and tim.get("fp8_cast_s") is not None and v:
            u.add_row(*(["  of which FP8 casts", _fmt_s(tim["fp8_cast_s"]), f"{tim['fp8_cast_s'] / v * 100:.1f}% of compute"]
                        + ([""] if run else [])))
    # what the per-stage parts leave of the step (explain.step_remainder), so that the rows add up to it
    step = tim["step_time_s"]
    label = remainder_label(rest, lay, data.get("precision")) if any(tim["parts_s"].values()) else "not broken down"
    row = [label, _fmt_signed_s(rest), f"{rest / step * 100:.1f}%" if step else ""]
    if run:
        # the runner-up's remainder minus this plan's
        d = step_remainder(run["delta_time_parts_s"], run["delta_step_time_s"])
        row.append(("+" if d >= 0 else "-") + _fmt_s(abs(d)))
    u.add_row(*row)
    step_row = ["step", _fmt_s(tim["step_time_s"]), ""]
    if run:
        step_row.append(_fmt_rel(run["relative_step_time"]))
    u.add_row(*step_row)
    return [head, t, u] + list(data["summary"]) + [f"warning: {w}" for w in data.get("warnings") or []]


def compare_table(rows: list[dict], a_label: str, b_label: str):
    from rich.table import Table
    t = Table(title="plan comparison (B relative to A)", title_justify="left", header_style="bold")
    for c in ("", f"A: {a_label}", f"B: {b_label}", "B vs A"):
        t.add_column(c, justify="left" if c == "" else "right")
    for r in rows:
        t.add_row(r["name"], _fmt_value(r["name"], r["a"]), _fmt_value(r["name"], r["b"]), _fmt_rel(r["relative"]))
    return t


def _unplanned(row: dict) -> str:
    """A sweep row without a plan: a pin its count breaks (skipped) or memory (does not fit)."""
    return "skipped" if row.get("input_error") else "does not fit"


def sweep_table(rows: list[dict], title: str):
    from rich.table import Table
    t = Table(title=title, title_justify="left", header_style="bold")
    days = any(r.get("days_to_train") is not None for r in rows)  # --tokens given
    cols = ("GPUs", "best layout", "step", "tokens/s", "MFU", "mem/GPU") + (("days", "GPU-hours") if days else ())
    for c in cols:
        t.add_column(c, justify="left" if c == "best layout" else "right")
    for r in rows:
        if not r["fits"]:
            t.add_row(f"{r['gpus']:,}", f"{_unplanned(r)}: {r['reason']}", *[""] * (len(cols) - 2))
            continue
        t.add_row(f"{r['gpus']:,}", r["layout_label"], _fmt_s(r["step_time_s"]), f"{r['tokens_per_s']:,.0f}",
                  f"{r['mfu'] * 100:.1f}%", _fmt_bytes(r["memory_total_bytes"]),
                  *((f"{r['days_to_train']:.1f}", f"{r['gpu_hours_to_train']:,.0f}") if days else ()))
    return t


def bar_lines(rows: list[dict], key: str, label: str, fmt, width: int = 40) -> list[str]:
    """A plain-character horizontal bar chart ('#' bars), one line per row."""
    vals = [r[key] for r in rows if r["fits"]]
    top = max(vals) if vals else 0
    lines = [label]
    for r in rows:
        if not r["fits"]:
            lines.append(f"{r['gpus']:>6} | ({_unplanned(r)})")
            continue
        n = int(round(width * r[key] / top)) if top > 0 else 0
        lines.append(f"{r['gpus']:>6} | {'#' * n}{' ' * (width - n)} {fmt(r[key])}")
    return lines
