"""Feed each parplan DeepSpeed export to deepspeed.runtime.config.DeepSpeedConfig (no training, no GPU).
Run: DS_ACCELERATOR=cpu $W/venv/bin/python benchmarks/export_parse/ds_check.py
Stubs: deepspeed.comm's get_rank/get_world_size inside runtime.config (no process group on CPU) -> 0 / plan's GPUs;
an mpu whose get_data_parallel_world_size() is the plan's dp (what Megatron-DeepSpeed's mpu / PipelineModule gives)."""
import os as _os
W = _os.environ.get("EXPORT_PARSE_DIR", "/tmp/parplan-export-parse")  # run_all.sh's work folder
import glob, json, logging, os, sys, traceback, warnings
import deepspeed
from deepspeed.runtime import config as dsc

class Cap(logging.Handler):
    def __init__(s): super().__init__(logging.WARNING); s.msgs = []
    def emit(s, r): s.msgs.append(f"{r.levelname}: {r.getMessage()}")
cap = Cap()
logging.getLogger("DeepSpeed").addHandler(cap)

class MPU:
    def __init__(s, dp, tp, pp): s.dp, s.tp, s.pp = dp, tp, pp
    def get_data_parallel_world_size(s): return s.dp
    def get_data_parallel_rank(s): return 0
    def get_model_parallel_world_size(s): return s.tp
    def get_model_parallel_rank(s): return 0
    def get_pipeline_model_parallel_world_size(s): return s.pp

print("deepspeed", deepspeed.__version__)
for f in sorted(glob.glob(f"{W}/exports/*.deepspeed.json")):
    name = os.path.basename(f).split(".")[0]
    plan = json.load(open(f"{W}/plans/{name}.json"))
    p = plan["parallel"]
    dsc.dist.get_rank = lambda *a, **k: 0
    dsc.dist.get_world_size = lambda *a, _g=plan["hardware"]["gpus"], **k: _g
    cap.msgs.clear()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        try:
            c = dsc.DeepSpeedConfig(f, mpu=MPU(p["dp"], p["tp"], p["pp"]))  # the file path: DeepSpeed's own hjson load
            z = c.zero_config
            res = (f"OK world_size={c.world_size} tbs={c.train_batch_size} mbs={c.train_micro_batch_size_per_gpu} "
                   f"gas={c.gradient_accumulation_steps} zero={c.zero_optimization_stage} bf16={c.bfloat16_config.enabled} "
                   f"offload_opt={getattr(z.offload_optimizer,'device',None)} overlap_comm={z.overlap_comm} "
                   f"grad_accum_dtype={c.grad_accum_dtype} comm_dtype={c.communication_data_type} "
                   f"pipeline={c.pipeline}")
        except Exception as e:
            res = f"FAIL {type(e).__name__}: {e}"
    print(f"{name}: {res}")
    for m in cap.msgs: print("   ds-log", m)
    for x in w: print("   py-warning", x.category.__name__, x.message)
