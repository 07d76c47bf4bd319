"""Wall time of `parplan recommend` (start-up included), best of N, written to benchmarks/results/speed.md.

    python benchmarks/speed.py [--repeats 5]

Each case runs once untimed first, and every run may read and write compiled bytecode (in a cache folder of its
own, PYTHONPYCACHEPREFIX): what an installed parplan does.  A shell that sets PYTHONDONTWRITEBYTECODE (this
project's development machines do) would otherwise recompile the planner's modules on every run, about 0.1 s.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = [
    ("recommend --params 70e9 --gpus 8 --json", 1.0),
    ("recommend --model llama3-405b --gpus 16384 --json", 3.0),
    ("recommend --model llama3-70b --gpus 64 --json", 1.0),
    ("recommend --model llama3-405b --gpus 1024 --seq-len 131072 --json", 1.0),
    ("recommend --model gpt3-175b --gpus 4096 --json", 2.0),  # the largest candidate set a CLI audit timed
    # a mixture of experts (since 2026-12-05): every expert parallelism that divides the experts and the ranks
    ("recommend --model qwen3-235b-a22b --gpus 1024 --framework megatron --json", 1.0),
    # dense blocks between the MoE ones (since 2026-12-05): each rank's blocks priced by kind
    ("recommend --model glm-4.5 --gpus 1024 --framework megatron --json", 1.0),
    # multi-head latent attention and multi-token prediction (since 2026-12-05): DeepSeek-V3 as it was pretrained
    ("recommend --model deepseek-v3 --gpus 1024 --framework megatron --mtp-layers 1 --json", 1.0),
    # a mixture of experts under the default framework, parplan (since 2026-12-05): its runtime's ZeRO 0-3 and
    # schedules give four times Megatron's candidates
    ("recommend --model glm-4.5 --gpus 1024 --json", 1.0),
]


def main() -> None:
    ap = argparse.ArgumentParser(description="Time `parplan recommend` on the planner's speed cases.")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "speed.md"),
                    help="markdown written here (default: benchmarks/results/speed.md)")
    args = ap.parse_args()
    rows = []
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="parplan-speed-pycache-")
    for cmd, bar in CASES:
        times, searches = [], []
        out = None
        for i in range(args.repeats + 1):  # the first untimed: it writes the bytecode, as an install's first run
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-m", "planner.cli", *cmd.split()], capture_output=True, text=True,
                                 env=env)
            if out.returncode != 0:
                sys.exit(f"parplan {cmd} exited {out.returncode}: {out.stderr.strip()[-500:]}")
            if i:
                times.append(time.perf_counter() - t0)
                searches.append(json.loads(out.stdout)["search"]["seconds"])
        data = json.loads(out.stdout)
        rows.append((cmd, min(times), sorted(times)[len(times) // 2], bar, data["search"]["candidates"],
                     min(searches)))
        print(f"parplan {cmd}: best {min(times):.3f} s, median {rows[-1][2]:.3f} s (bar {bar} s), "
              f"{data['search']['candidates']:,} candidates, search {min(searches):.3f} s best")
    lines = [f"# recommend speed ({datetime.date.today()}, {platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} cores, Python {platform.python_version()})", "",
             f"`python benchmarks/speed.py --repeats {args.repeats}`: wall time of the whole command "
             "(interpreter start-up included), best and median of the repeats, after one untimed run of each that "
             "writes the modules' compiled bytecode, as an installed parplan has it; the search's own seconds (the "
             "plan's `search.seconds`), best of the repeats.", "",
             "| command | best s | median s | bar s | candidates | search s |", "|---|---|---|---|---|---|"]
    for cmd, best, med, bar, cand, sec in rows:
        lines.append(f"| `parplan {cmd}` | {best:.3f} | {med:.3f} | {bar} | {cand:,} | {sec:.3f} |")
    out_path = Path(args.out)
    out_path.write_text("\n".join(lines) + "\n")
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
