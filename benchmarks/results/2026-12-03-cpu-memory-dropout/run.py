import json, sys
from pathlib import Path
from tests.test_runtime_memory import memory_jobs, rank_kind_errors
from tests.runtime_helpers import suite
tmp = Path(sys.argv[1]); tmp.mkdir(parents=True, exist_ok=True)
sch = {"1f1b": dict(schedule="1f1b"), "1f1b-dropout": dict(schedule="1f1b", dropout=True),
       "tp2-sp-pp2-dropout": dict(tp=2, pp=2, schedule="1f1b", sp=True, dropout=True),
       "interleaved-1f1b-dropout": dict(schedule="interleaved-1f1b", vpp=2, dropout=True)}
jobs = [j for j in memory_jobs(tmp, schedules=sch) if Path(j["report"]).parent.name in sch]
for j in jobs:
    if "dropout" in j["report"]:
        j["opts"]["attention_dropout"] = 0.0
r = suite.run_jobs(jobs, 4, tmp, "memory", timeout=1500)
print("rc", r.returncode, r.stderr[-3000:] if r.returncode else "")
for name in sch:
    rep = json.loads((tmp / name / "report.json").read_text()); cm = rep["cpu_memory"]
    plan = json.loads((tmp / name / "plan.json").read_text())
    print(name, f"measured {cm['without_collective_buffers_max']/2**20:.2f} MiB predicted {cm['predicted']/2**20:.2f} error {cm['error']*100:+.2f} %",
          {k: round(v*100, 2) for k, v in rank_kind_errors(plan, rep).items()}, rep["dropout"])
