"""Host-probe experiment: per-run median step times of the calibrate probe, in a given mode order."""
import json, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, os.getcwd())
from planner.calibrate import _host_probe_plan, HOST_BLOCKS
from planner.launch import job_env
DEV = os.environ.get("DEV", "cuda")
label, modes, steps = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
blocks = [int(b) for b in (sys.argv[4].split(",") if len(sys.argv) > 4 else HOST_BLOCKS)]
with tempfile.TemporaryDirectory() as tmp:
    runs = [(m, b, Path(tmp) / f"r-{i}-{m}-{b}.json") for i, (m, b) in enumerate((m, b) for m in modes for b in blocks)]
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "-m",
            "parallel_layers.probe", "--steps", str(steps), "--device", DEV] + (["--compile"] if DEV == "cuda" else [])
    for m, b, r in runs:
        p = r.with_suffix(".plan.json"); p.write_text(_host_probe_plan(b, m, DEV).model_dump_json())
        argv += ["--plan", str(p), "--report", str(r)]
    t0 = time.time()
    job = subprocess.run(argv, env={**job_env(DEV), **os.environ}, capture_output=True, text=True)
    out = {"label": label, "wall_s": round(time.time() - t0, 1), "rc": job.returncode, "runs": []}
    for m, b, r in runs:
        if not r.exists():
            out["runs"].append([m, b, None]); continue
        rep = json.loads(r.read_text()); st = rep["steps"][rep["warmup_steps"]:]
        ts = [s["step_time_s"] * 1e3 for s in st]
        hd = [s.get("host_dispatch_s", 0) * 1e3 for s in st]
        out["runs"].append([m, b, round(statistics.median(ts), 3), round(min(ts), 3), round(statistics.median(hd), 3)])
    if job.returncode:
        out["err"] = job.stdout[-800:] + job.stderr[-800:]
    print(json.dumps(out))
