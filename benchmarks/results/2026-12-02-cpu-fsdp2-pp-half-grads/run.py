import sys, time, json
sys.path.insert(0, sys.argv[1])  # usage: python run.py REPO OUT fsdp2-pp2-half-grads,fsdp2-pp2
from pathlib import Path
from tests.runtime_helpers import suite
from tests.test_runtime_memory import LAYOUTS, memory_jobs
import tests.test_runtime_memory as trm
out = Path(sys.argv[2]); out.mkdir(parents=True, exist_ok=True)
extra = {
 "fsdp2-pp2-half-grads": (8, dict(tp=1, pp=2, dp=2, zero_stage=3, precision="master-weights-half-grads")),
 "fsdp2-pp2": (8, dict(tp=1, pp=2, dp=2, zero_stage=3)),
}
names = sys.argv[3].split(",")
trm.LAYOUTS.clear(); trm.LAYOUTS.update({k: v for k, v in extra.items() if k in names})
jobs = memory_jobs(out, schedules={})
t = time.time()
r = suite.run_jobs(jobs, 4, out, "memory", timeout=1500)
print("rc", r.returncode, f"{time.time()-t:.1f}s")
if r.returncode: print(r.stderr[-3000:])
from planner.launch import rank_kind_memory
for j in jobs:
    p = Path(j["report"])
    rep = json.loads(p.read_text()); plan = json.loads(Path(j["plan"]).read_text())
    cm = rep["cpu_memory"]
    print(p.parent.name, cm["without_collective_buffers_max"]/2**20, cm["predicted"]/2**20, cm["error"])
    print({k: (v["error"]) for k, v in (rank_kind_memory({**rep, "plan": plan}) or {}).items()})
    for r_, m in rep["peak_memory_bytes"].items(): print(r_, m.get("peak_phase"), m["allocated_without_collective_buffers"]/2**20)
