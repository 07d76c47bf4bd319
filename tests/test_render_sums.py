"""The human tables add up: the step-time rows of `recommend` and `explain` sum to the step shown, the
memory rows of both sum to the total shown, and a plan ranked below #1 but faster than it gets the
near-tie note (planner/search.py sort_key) under the table, never on --json stdout."""
from __future__ import annotations

import json
from io import StringIO

import pytest
from rich.console import Console

from planner.cli import main
from planner.core import recommend
from planner.explain import explain, pick_runner_up
from planner.render import breakdown_table, explain_renderables, plans_table
from planner.schema import Plan
from planner.search import NEAR_TIE, Pins

UNITS = {"s": 1.0, "ms": 1e-3, "GB": 1.0}


def _text(renderable) -> str:
    con = Console(file=StringIO(), width=250, color_system=None)
    con.print(renderable)
    return con.file.getvalue()


def _rows(text: str) -> list[list[str]]:
    """The body rows of a rendered rich table, as stripped cells."""
    return [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]


def _num(cell: str) -> tuple[float, float]:
    """'394.5 ms' -> (0.3945, half the last shown digit, in the same unit)."""
    value, unit = cell.split()
    digits = len(value.split(".")[1]) if "." in value else 0
    return float(value) * UNITS[unit], 0.5 * 10 ** -digits * UNITS[unit]


def _sums_to(cells: list[str], total_cell: str):
    """The shown cells add up to the shown total, to display rounding."""
    vals = [_num(c) for c in cells]
    total, total_tol = _num(total_cell)
    got = sum(v for v, _ in vals)
    assert got == pytest.approx(total, abs=sum(t for _, t in vals) + total_tol + 1e-12), (cells, total_cell)


@pytest.fixture(scope="module")
def plans():
    """A pipeline plan (405B on 1024: tp8 pp16 vpp4), a pp=1 plan (8B on 4 with the autograd loss, whose near tie
    the ranking note explains), an amp plan."""
    return {"pipeline": recommend("llama3-405b", 1024),
            # (recompute none pinned: the near tie the note explains is between no-recompute plans)
            "pp1": recommend("llama3-8b", 4, fused_cross_entropy=False, pins=Pins(recompute="none")),
            # (no recompute pinned: the remainder holds a cast per micro-batch's forward; the search's pick recomputes
            # one block at a larger micro-batch, with fewer casts a step)
            "amp": recommend("llama3-8b", 16, precision="amp", pins=Pins(recompute="none"))}


def _time_cells(plan) -> tuple[list[str], str]:
    rows = _rows(_text(breakdown_table(plan)))
    cells = [(r[2], r[3]) for r in rows if r[2]]
    assert cells[-1][0] == "step"
    # the step less the named parts has its row (pp=1 too: the embedding lookup, 17.9 ms for 8B on 8)
    assert cells[-2][0].startswith(("other: ", "less: ")), cells[-2]
    return [v for _, v in cells[:-1]], cells[-1][1]


_PARTS = ("compute_s", "tp_comm_s", "pp_comm_s", "dp_comm_s", "cp_comm_s", "ep_comm_s", "bubble_s", "optimizer_s")


@pytest.mark.parametrize("kind", ["pipeline", "pp1", "amp"])
def test_recommend_time_rows_sum_to_the_step(plans, kind):
    plan = plans[kind]
    if kind == "pipeline":
        assert plan.parallel.pp > 1
    else:
        assert plan.parallel.pp == 1
    parts, step = _time_cells(plan)
    assert step == f"{plan.prediction.step_time_s:.2f} s"
    _sums_to(parts, step)
    # The rows sum by construction (the remainder row is the step less the rest), so bound the remainder:
    # a term dropped from its named row would land there.  It holds the embedding lookup, amp's casts and
    # what a slowest stage other than the critical one spends beyond it, 0.03-1.7 % of these steps.
    from planner.explain import step_remainder
    tb = plan.prediction.time_breakdown
    named = {k: getattr(tb, k) for k in _PARTS}
    assert abs(step_remainder(named, plan.prediction.step_time_s)) <= 0.03 * plan.prediction.step_time_s


def test_time_remainder_is_what_the_parts_leave(plans):
    """Before: 405B's rows summed to 23.85 s of a 24.14 s step, amp's to 29.04 of 29.53 s.  The remainder row
    is a real quantity: the step less the named parts, exactly.  405B's critical stage (a middle rank: the most
    compute) is its slowest and holds neither the embedding nor the head, so since the collectives rows are that
    stage's (2026-12-05; rank 0's before, 0.2-0.7 s short of it) nothing is left."""
    from planner.explain import step_remainder
    for kind, low in (("amp", 0.4),):
        plan = plans[kind]
        tb = plan.prediction.time_breakdown
        parts = {k: getattr(tb, k) for k in _PARTS}
        rest = step_remainder(parts, plan.prediction.step_time_s)
        assert low < rest < 0.03 * plan.prediction.step_time_s
    rows = dict((r[2], r[3]) for r in _rows(_text(breakdown_table(plans["amp"]))) if r[2])
    assert "other: embedding, amp weight casts" in rows
    rows = dict((r[2], r[3]) for r in _rows(_text(breakdown_table(plans["pipeline"]))) if r[2])
    assert rows["other: none"] == "0.0 ms"
    tb = plans["pipeline"].prediction.time_breakdown
    assert step_remainder({k: getattr(tb, k) for k in _PARTS}, plans["pipeline"].prediction.step_time_s) == 0.0


def test_remainder_label_names_a_credit_when_negative():
    from planner.explain import remainder_label, step_remainder
    assert step_remainder({"a": 1.0, "b": 2.0}, 3.0) == 0.0
    assert step_remainder({"a": 1.0}, 0.9) == pytest.approx(-0.1)
    assert remainder_label(-0.1, {"tp": 8, "pp": 4, "cp": 1}).startswith("less: ")
    assert remainder_label(0.1, {"tp": 1, "pp": 1, "cp": 1}, "bf16") == "other: embedding"
    assert remainder_label(0.1, {"tp": 2, "pp": 4, "cp": 1, "ep": 8}, "bf16") == \
        "other: embedding, a slower stage's extra TP/EP comm and head"


def _explain_tables(plan, runner):
    data = explain(plan, runner)
    items = explain_renderables(data)
    return data, _rows(_text(items[1])), _rows(_text(items[2]))


@pytest.mark.parametrize("kind", ["pipeline", "pp1", "amp"])
def test_explain_time_rows_sum_to_the_step(plans, kind):
    plan = plans[kind]
    data, _, trows = _explain_tables(plan, pick_runner_up(plan, plan.alternatives))
    body = [r for r in trows if not r[0].startswith("of which")]  # a part of compute, not a row of the sum
    assert body[-1][0] == "step" and body[-2][0].startswith(("other: ", "less: ")), body[-2]
    _sums_to([r[1] for r in body[:-1]], body[-1][1])
    shares = [float(r[2].rstrip("%")) for r in body[:-1]]
    assert sum(shares) == pytest.approx(100.0, abs=0.05 * len(shares) + 1e-9)
    # the rows are the plan's predicted parts (a sum that closes by construction proves nothing about them)
    tb = plan.prediction.time_breakdown
    for part, value in data["time"]["parts_s"].items():
        assert value == pytest.approx(getattr(tb, f"{part}_s"), rel=1e-9, abs=1e-12), part
    assert abs(data["time"]["remainder_s"]) <= 0.05 * plan.prediction.step_time_s
    # the JSON explanation: the eight named parts (expert parallelism's all-to-all since the twenty-fourth session,
    # 0 for a dense model), no remainder key
    assert set(data["time"]["parts_s"]) == {"compute", "tp_comm", "pp_comm", "dp_comm", "cp_comm", "ep_comm", "bubble",
                                            "optimizer"}


def _cli_plan(argv, capsys) -> Plan:
    assert main(argv + ["--json"]) == 0
    out, _ = capsys.readouterr()
    return Plan.model_validate_json(out)


@pytest.mark.parametrize("argv, total", [
    # before: parts 7.5 GB (shares 118 %) against a 6.3 GB total
    # (6.3 GB until the runtime's fused cross-entropy became parplan's default, 2026-11-24)
    (["recommend", "--layers", "4", "--hidden", "256", "--heads", "8", "--vocab", "1000", "--gpus", "2"], "5.8 GB"),
    # before: parts 54.7 GB against a 51.4 GB total (43.0 GB with the fused cross-entropy)
    # (--recompute none: unpinned, the search now recomputes one block at micro-batch 4, 81.7 GB)
    (["recommend", "-m", "llama3-8b", "--gpus", "8", "--dp", "8", "--zero", "3", "--offload", "optimizer", "--recompute",
      "none"], "43.0 GB"),
])
def test_explain_memory_rows_sum_to_the_total(argv, total, capsys):
    plan = _cli_plan(argv, capsys)
    data, mrows, _ = _explain_tables(plan, pick_runner_up(plan, plan.alternatives))
    labels = [r[0] for r in mrows]
    i = labels.index("total")
    assert mrows[i][1] == total
    assert any(lab.startswith("not live at once") for lab in labels[:i])
    assert not any("1 micro-batch" in lab for lab in labels)
    _sums_to([r[1] for r in mrows[:i]], mrows[i][1])
    shares = [float(r[2].rstrip("%")) for r in mrows[:i]]
    assert sum(shares) == pytest.approx(100.0, abs=0.5 * len(shares))
    # The not-live row closes the sum by construction, so check it against the physics instead: the rows above
    # it are the plan's own parts, and the total is no less than either moment every part of it is live at
    # (the optimizer step: weights, gradients, states; the loss's backward: weights, states, every saved
    # activation and the loss's peak), so the row takes back at most the smaller of activations and gradients
    # plus the working memory.
    parts = plan.prediction.memory_bytes_per_gpu
    shown = dict((r[0], r[1]) for r in mrows[:i])
    for name in ("weights", "grads", "optimizer", "activations"):
        label = next(lab for lab in shown if lab.lower().startswith(name[:5]))
        assert _num(shown[label])[0] == pytest.approx(getattr(parts, name) / 1e9, abs=_num(shown[label])[1]), name
    w, g, o, a = parts.weights, parts.grads, parts.optimizer, parts.activations
    assert parts.total >= max(w + g + o, w + o + a) * (1 - 1e-12)
    apart = data["memory"]["not_live_together_bytes"]
    assert 0 < apart <= min(a, g) + parts.other
    # the recommend table shows the same row, with the same label, and adds up the same way
    rows = _rows(_text(breakdown_table(plan)))
    mem = [(r[0], r[1]) for r in rows if r[0]]
    j = [m[0] for m in mem].index("total")
    assert mem[j - 1][0] == labels[i - 1] and mem[j - 1][1] == mrows[i - 1][1]
    _sums_to([v for _, v in mem[:j]], mem[j][1])


def test_ranking_note_when_a_lower_plan_is_faster(plans):
    from planner.render import ranking_note
    plan = plans["pp1"]  # llama3-8b on 4: #3 (tp1 dp4 ZeRO-2) is faster than #1 (tp2 dp2)
    ranked = [plan] + list(plan.alternatives)
    first = plan.prediction.step_time_s
    faster = [i for i, p in enumerate(ranked[1:], 2) if p.prediction.step_time_s < first]
    assert faster
    text = _text(plans_table(ranked, "t"))
    note = [line for line in text.splitlines() if line.startswith("note:")]
    assert len(note) == 1
    assert f"within {NEAR_TIE:.0%} of the fastest" in note[0] and "simplest first" in note[0]
    i = min(faster, key=lambda k: ranked[k - 1].prediction.step_time_s)
    assert note[0].startswith(f"note: #{i} is faster than #1")
    # none where the ranking is in step order, nor for another objective
    big = plans["pipeline"]
    assert ranking_note([big] + list(big.alternatives)) is None
    assert "note:" not in _text(plans_table([big] + list(big.alternatives), "t"))
    other = plan.model_copy(update={"search": plan.search.model_copy(update={"objective": "memory"})})
    assert ranking_note([other] + list(plan.alternatives)) is None


def test_ranking_note_in_the_table_output_not_in_json(capsys):
    assert main(["recommend", "-m", "llama3-8b", "--gpus", "4", "--no-fused-cross-entropy", "--recompute", "none"]) == 0
    out, err = capsys.readouterr()
    assert "note: #" in out + err
    assert main(["recommend", "-m", "llama3-8b", "--gpus", "4", "--no-fused-cross-entropy", "--recompute", "none",
                 "--json"]) == 0
    out, _ = capsys.readouterr()
    json.loads(out)
    assert "note:" not in out and "simplest first" not in out


def test_explain_names_amps_casts_from_the_plans_precision():
    from planner.core import recommend
    from planner.explain import explain
    from planner.models import load_preset
    from planner.render import explain_renderables
    from planner.search import Pins
    from rich.console import Console
    import io

    for precision, words in (("amp", "amp weight casts"), ("master-weights", "other: ")):
        plan = recommend(load_preset("llama3-8b"), 16, precision=precision, pins=Pins(pp=2), suggest=False)
        data = explain(plan, None)
        assert data["precision"] == precision
        buf = io.StringIO()
        console = Console(file=buf, width=200)
        for item in explain_renderables(data):
            console.print(item)
        assert words in buf.getvalue() and "if amp" not in buf.getvalue()
        if precision != "amp":
            assert "amp weight casts" not in buf.getvalue()


def test_a_narrow_terminal_gets_the_plans_in_one_layout_column():
    """At 80 columns the full table had cut every column to a character or two ("t…"); below COMPACT_WIDTH the
    policy columns fold into the layout's, which reads whole, and the step and memory still show."""
    plan = recommend("llama3-70b", 64, top_k=3)
    plans = [plan] + list(plan.alternatives)
    con = Console(file=StringIO(), width=80, color_system=None)
    con.print(plans_table(plans, "top", con.width))
    text = con.file.getvalue()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    p = plan.parallel
    assert f"tp{p.tp} pp{p.pp} dp{p.dp}" in text and f"{plan.prediction.mfu * 100:.1f}%" in text
    assert "bubble" not in text and "bubble" in _text(plans_table(plans, "top", 160))


def test_the_comm_rows_are_the_critical_stages():
    """The collectives rows are the stage's that sets the compute (the critical stage), not rank 0's: DeepSeek-V3 on
    256 GPUs at pp 32 puts one dense block alone on rank 0, whose all-to-alls are none, and had read "EP all-to-all
    0.0 ms" beside a step its MoE stages' all-to-alls are part of.  The rows then never exceed what the slowest
    stage spends (the remainder is not negative), across layouts whose critical stage is rank 0, a middle or the
    last rank."""
    from planner.explain import step_remainder
    ds = recommend("deepseek-v3", 256, framework="megatron", top_k=1, suggest=False,
                   pins=Pins(tp=2, pp=32, ep=8, vpp=1, recompute="selective", mbs=1))
    assert ds.parallel.stage_layers[0] == 1  # one dense block on rank 0
    tb = ds.prediction.time_breakdown
    assert tb.ep_comm_s > 0.05 * ds.prediction.step_time_s and ds.prediction.comm_bytes_per_step.ep > 0
    for plan in (ds, recommend("llama3-70b", 64, top_k=1, pins=Pins(pp=8, vpp=1)),
                 recommend("qwen3-30b-a3b", 32, framework="megatron", top_k=1, pins=Pins(pp=4, ep=8))):
        tb = plan.prediction.time_breakdown
        assert step_remainder({k: getattr(tb, k) for k in _PARTS}, plan.prediction.step_time_s) >= 0, plan.parallel
