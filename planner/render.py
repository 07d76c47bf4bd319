"""Human output: rich tables on stderr-or-terminal.  JSON never goes through rich."""
from __future__ import annotations

from .schema import Plan

GB = 1e9


def _fmt_bytes(x: float) -> str:
    return f"{x / GB:.1f} GB"


def _fmt_s(x: float) -> str:
    if x >= 1:
        return f"{x:.2f} s"
    return f"{x * 1e3:.1f} ms"


def layout_label(p) -> str:
    bits = [f"tp{p.tp}", f"pp{p.pp}", f"dp{p.dp}"]
    if p.cp > 1:
        bits.append(f"cp{p.cp}")
    return " ".join(bits)


def plans_table(plans: list[Plan], title: str):
    from rich.table import Table
    t = Table(title=title, title_justify="left", header_style="bold")
    for col in ("#", "layout", "vpp", "mbs", "zero", "recompute", "sp", "schedule", "offload",
                "mem/GPU", "step", "tokens/s", "MFU", "bubble", "comm/GPU"):
        t.add_column(col, justify="right" if col not in ("layout", "recompute", "schedule", "offload") else "left")
    for i, pl in enumerate(plans, 1):
        p, pr = pl.parallel, pl.prediction
        mem = pr.memory_bytes_per_gpu
        comm = pr.comm_bytes_per_step
        cap = pr.usable_memory_bytes or 0
        t.add_row(str(i), layout_label(p), str(p.vpp), str(pl.training.micro_batch_size), str(p.zero_stage),
                  p.recompute, "y" if p.sp else "n", p.schedule, p.offload,
                  f"{mem.total / GB:.1f}/{cap / GB:.0f} GB", _fmt_s(pr.step_time_s), f"{pr.tokens_per_s:,.0f}",
                  f"{pr.mfu * 100:.1f}%", f"{pr.bubble_fraction * 100:.1f}%",
                  _fmt_bytes(comm.tp + comm.pp + comm.dp + comm.cp))
    return t


def breakdown_table(plan: Plan):
    from rich.table import Table
    pr = plan.prediction
    mem = pr.memory_bytes_per_gpu
    t = Table(title="best plan: where memory and time go", title_justify="left", header_style="bold")
    t.add_column("memory per GPU (worst stage)")
    t.add_column("", justify="right")
    t.add_column("step time")
    t.add_column("", justify="right")
    tb = pr.time_breakdown
    mem_rows = [("weights", mem.weights), ("grads", mem.grads), ("optimizer", mem.optimizer),
                ("activations", mem.activations), ("other (working, buffers)", mem.other),
                ("total", mem.total), ("usable HBM", pr.usable_memory_bytes or 0)]
    if mem.offloaded:
        mem_rows.append(("offloaded to host", mem.offloaded))
    time_rows = [("compute", tb.compute_s), ("TP comm (exposed)", tb.tp_comm_s), ("PP send/recv", tb.pp_comm_s),
                 ("DP comm (exposed)", tb.dp_comm_s), ("CP comm (exposed)", tb.cp_comm_s),
                 ("pipeline bubble", tb.bubble_s), ("optimizer step", tb.optimizer_s), ("step", pr.step_time_s)]
    for i in range(max(len(mem_rows), len(time_rows))):
        a = mem_rows[i] if i < len(mem_rows) else ("", None)
        b = time_rows[i] if i < len(time_rows) else ("", None)
        t.add_row(a[0], _fmt_bytes(a[1]) if a[1] is not None else "", b[0], _fmt_s(b[1]) if b[1] is not None else "")
    return t


def summary_lines(plan: Plan) -> list[str]:
    pr = plan.prediction
    m = plan.model
    lines = [
        f"model {m.name or m.arch}: {m.num_params / 1e9:.2f} B params, {m.layers} layers, hidden {m.hidden}, "
        f"heads {m.heads}/{m.kv_heads} kv, ffn {m.ffn_hidden}, vocab {m.vocab}",
        f"MFU {pr.mfu * 100:.1f}%  HFU {pr.hfu * 100:.1f}%  model {pr.model_tflops_per_gpu:.0f} TFLOP/s/GPU  "
        f"Amdahl parallel fraction {pr.amdahl.parallel_fraction:.4f} -> speedup {pr.amdahl.speedup:.1f}x on {plan.hardware.gpus} GPUs",
        f"stage_layers {plan.parallel.stage_layers}",
    ]
    if pr.days_to_train is not None:
        lines.append(f"time to train {plan.training.tokens:.3g} tokens: {pr.days_to_train:.1f} days, "
                     f"{pr.gpu_hours_to_train:,.0f} GPU-hours")
    if plan.search:
        s = plan.search
        reasons = ", ".join(f"{k} {v}" for k, v in s.infeasible_by_reason.items()) or "none"
        lines.append(f"searched {s.candidates:,} candidates in {s.seconds:.3f} s: {s.feasible:,} feasible; "
                     f"infeasible by reason: {reasons}")
    for w in pr.warnings:
        lines.append(f"warning: {w}")
    return lines
