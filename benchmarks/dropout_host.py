"""What dropout adds to a compiled block's host dispatch, with the hidden masks hashed in the graph or keyed outside it.

parplan's runtime (parallel_layers.dropout) draws a hidden-dropout mask either from a generator seeded on the host
("keyed": a graph break each in a compiled block, one seeding and one draw a sample) or from a counter-based hash
computed inside the compiled block's graph ("hash", the default of a run that compiles since 2026-12-04).  The
attention's dropout seeds the device's generator on the host either way (a graph break).  This measures, as
`parplan calibrate`'s host probe does (planner.calibrate.measure_host_block: tiny llama blocks, the step-time
difference of 10- and 2-block runs over 8, median of `--repeats` pairs, every run compiled, in one process), the
per-block cost of: no dropout; the hidden dropout alone, keyed and hashed; both dropouts, keyed and hashed; with no
recompute and with full recompute.  The extra a block over no dropout is host work where the blocks are this small.

    python3 benchmarks/dropout_host.py --device cpu --out R/dropout_host.md --json R/dropout_host.json

On a GPU (`--device cuda`) it runs the calibrate probe's own 256-wide block; on the CPU a 32-wide one at 16 tokens
(the CPU's compute stays well under its dispatch there).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.calibrate import HOST_BLOCKS, PROBE_SHAPE, _host_probe_plan  # noqa: E402

CPU_SHAPE = {"hidden": 32, "heads": 2, "kv_heads": 1, "ffn_hidden": 64, "seq_len": 16}
# (name, plan's training.dropout, hidden rate, attention rate, masks)
CASES = [("no dropout", False, 0.1, 0.1, "auto"),
         ("hidden, keyed", True, 0.1, 0.0, "keyed"), ("hidden, hash", True, 0.1, 0.0, "hash"),
         ("both, keyed", True, 0.1, 0.1, "keyed"), ("both, hash", True, 0.1, 0.1, "hash")]
MODES = ("none", "full")


def _worker(spec_path: str) -> None:
    """Under torchrun: every run of the spec in one process (one compile per graph, as the calibrate probe)."""
    from parallel_layers.train import RunOptions, run_plans
    spec = json.loads(Path(spec_path).read_text())
    jobs = [(r["plan"], RunOptions(steps=spec["steps"], device=spec["device"], compile=True, telemetry=False,
                                   hidden_dropout=r["hidden"], attention_dropout=r["attention"],
                                   dropout_masks=r["masks"]), r["report"]) for r in spec["runs"]]
    run_plans(spec["device"], jobs)


def measure(device: str, steps: int = 30, repeats: int = 3, modes=MODES, cases=CASES) -> list[dict]:
    shape = dict(PROBE_SHAPE) if device == "cuda" else CPU_SHAPE
    with tempfile.TemporaryDirectory(prefix="parplan-dropout-host-") as tmp:
        runs = []
        for rep in range(repeats):
            for mode in modes:
                for name, drop, ph, pa, masks in cases:
                    for blocks in HOST_BLOCKS:
                        plan = _host_probe_plan(blocks, mode, device, shape)
                        plan.training.dropout = drop
                        base = Path(tmp) / f"{len(runs)}"
                        base.with_suffix(".plan.json").write_text(plan.model_dump_json())
                        runs.append({"case": name, "mode": mode, "rep": rep, "blocks": blocks, "hidden": ph,
                                     "attention": pa, "masks": masks, "plan": str(base.with_suffix(".plan.json")),
                                     "report": str(base.with_suffix(".report.json"))})
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        # a process a case: the cases' blocks differ in what torch.compile guards on (the masks, the rates), and
        # all of them in one process would pass its recompile limit (8) and run the later cases uncompiled
        for name, *_ in cases:
            spec = Path(tmp) / "spec.json"
            spec.write_text(json.dumps({"device": device, "steps": steps,
                                        "runs": [r for r in runs if r["case"] == name]}))
            job = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                  "1", __file__, "--worker", str(spec)], env=env, capture_output=True, text=True,
                                 cwd=Path(__file__).resolve().parents[1])
            if job.returncode != 0:
                raise SystemExit(f"dropout_host: the runs of {name} failed: {job.stderr.strip()[-2000:]}")
        reports = {(r["case"], r["mode"], r["rep"], r["blocks"]): json.loads(Path(r["report"]).read_text())
                   for r in runs}
        hit = [k for k, rep in reports.items() if any("recompile limit" in n for n in rep.get("notes", []))]
        if hit:
            raise SystemExit(f"dropout_host: torch.compile hit its recompile limit in {hit[0]}: not a compiled reading")
        step = {k: rep["median"]["step_time_s"] for k, rep in reports.items()}
    lo, hi = HOST_BLOCKS
    rows = []
    for mode in modes:
        for name, *_ in cases:
            ests = [(step[(name, mode, rep, hi)] - step[(name, mode, rep, lo)]) / (hi - lo) for rep in range(repeats)]
            rows.append({"case": name, "recompute": mode, "block_s": statistics.median(ests), "pairs_s": ests,
                         **{k: shape[k] for k in ("hidden", "seq_len")}})
    for r in rows:
        off = next(x["block_s"] for x in rows if x["recompute"] == r["recompute"] and x["case"] == "no dropout")
        r["extra_s"] = r["block_s"] - off
    return rows


def render(rows: list[dict], device: str, repeats: int, when: str) -> str:
    r0 = rows[0]
    out = [f"# Dropout's host cost a compiled block ({device}, {when})", "",
           "Generated by `python3 benchmarks/dropout_host.py`: tiny llama blocks (hidden "
           f"{r0['hidden']} at {r0['seq_len']} tokens), every run compiled, the step-time difference of "
           f"{HOST_BLOCKS[1]}- and {HOST_BLOCKS[0]}-block runs over {HOST_BLOCKS[1] - HOST_BLOCKS[0]}, median of "
           f"{repeats} pairs (the calibrate probe's estimate). keyed: the hidden masks drawn from seeded generators "
           "outside the graphs; hash: computed inside them. The attention's dropout is seeded on the host either way.",
           "", "| recompute | dropout | ms a block | extra over none, ms | pairs, ms |", "|---|---|---|---|---|"]
    for r in rows:
        pairs = " / ".join(f"{p * 1e3:.3f}" for p in r["pairs_s"])
        out.append(f"| {r['recompute']} | {r['case']} | {r['block_s'] * 1e3:.3f} | {r['extra_s'] * 1e3:+.3f} | "
                   f"{pairs} |")
    by = {(r["recompute"], r["case"]): r["extra_s"] for r in rows}
    modes = list(dict.fromkeys(r["recompute"] for r in rows))
    out.append("")
    for mode in modes:
        pairs = [f"{what} {by[(mode, what + ', hash')] * 1e3:.2f} against {by[(mode, what + ', keyed')] * 1e3:.2f} ms"
                 for what in ("hidden", "both") if (mode, what + ", hash") in by and (mode, what + ", keyed") in by]
        if pairs:
            out.append(f"Hash against keyed, the extra a block ({mode}): " + ", ".join(pairs) + ".")
    return "\n".join(out) + "\n"


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        _worker(sys.argv[2])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cpu")
    ap.add_argument("--out")
    ap.add_argument("--json")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    rows = measure(a.device, steps=a.steps, repeats=a.repeats)
    text = render(rows, a.device, a.repeats, time.strftime("%Y-%m-%d"))
    print(text, end="")
    if a.out:
        Path(a.out).write_text(text)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
