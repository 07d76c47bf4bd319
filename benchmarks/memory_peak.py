"""What is live at the allocator's peak: replays a CUDA memory snapshot written by
`parplan launch --memory-snapshot DIR` (torch.cuda.memory._dump_snapshot) and groups the blocks
live at the largest allocated total by the innermost frame in this repository's code.

    python benchmarks/memory_peak.py DIR/rank0.pickle [--top 20] [--json OUT]

Needs no GPU (the pickle holds plain dicts).  Blocks count from their `alloc` to their
`free_requested` (the moment torch's allocated-bytes statistic drops)."""
from __future__ import annotations

import argparse
import json
import pickle
from collections import defaultdict
from pathlib import Path

OURS = ("parallel_layers/", "planner/", "cost_models/")


def site(frames: list[dict]) -> str:
    """Innermost frame in this repository (else the innermost Python frame): file:line function."""
    for f in frames:
        name = f.get("filename", "")
        for key in OURS:
            if key in name:
                return f"{key}{name.split(key, 1)[1]}:{f.get('line')} {f.get('name')}"
    for f in frames:
        if f.get("filename", "").endswith(".py"):
            return f"{Path(f['filename']).name}:{f.get('line')} {f.get('name')}"
    return "(no python frame)"


def replay(trace: list[dict]) -> dict:
    live: dict[int, tuple[int, str]] = {}
    total = peak = 0
    peak_live: dict[int, tuple[int, str]] = {}
    for e in trace:
        act = e.get("action")
        if act == "alloc":
            live[e["addr"]] = (e["size"], site(e.get("frames", [])))
            total += e["size"]
            if total > peak:
                peak, peak_live = total, dict(live)
        elif act == "free_requested" and e["addr"] in live:
            total -= live.pop(e["addr"])[0]
    groups: dict[str, list] = defaultdict(lambda: [0, 0])
    for size, where in peak_live.values():
        groups[where][0] += size
        groups[where][1] += 1
    rows = sorted(({"site": k, "bytes": v[0], "blocks": v[1]} for k, v in groups.items()), key=lambda r: -r["bytes"])
    return {"peak_bytes": peak, "groups": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("snapshot")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--json", help="also write the grouped peak here")
    a = ap.parse_args()
    try:
        with open(a.snapshot, "rb") as f:
            snap = pickle.load(f)
    except (pickle.UnpicklingError, EOFError, ValueError) as e:
        # a CPU launch's --memory-snapshot writes rank<N>.json (what was live at its traced peak), which launch
        # itself prints and compares; only CUDA's allocator history is a pickle this script replays
        cpu = a.snapshot.endswith(".json")
        raise SystemExit(f"{a.snapshot}: not a CUDA allocator snapshot ({e.__class__.__name__})"
                         + ("; a --device cpu launch's snapshot is a JSON of what was live at each rank's peak, which "
                            "the launch report already compares" if cpu else "; give the rank<N>.pickle a CUDA launch "
                            "wrote with --memory-snapshot")) from None
    except OSError as e:
        raise SystemExit(f"{a.snapshot}: {e.strerror or e}") from None
    traces = [t for t in snap.get("device_traces", []) if t]
    if not traces:
        raise SystemExit(f"{a.snapshot}: no allocation trace (was it recorded with --memory-snapshot?)")
    out = replay(traces[0])
    seg = sum(s["total_size"] for s in snap.get("segments", []))
    print(f"peak allocated (replayed): {out['peak_bytes'] / 1e9:.3f} GB; reserved at dump: {seg / 1e9:.3f} GB")
    print(f"{'GB':>8} {'blocks':>7}  site")
    for r in out["groups"][:a.top]:
        print(f"{r['bytes'] / 1e9:8.3f} {r['blocks']:7d}  {r['site']}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
