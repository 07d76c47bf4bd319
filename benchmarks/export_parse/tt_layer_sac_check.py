"""Feed parplan's torchtitan exports of partial recompute (`--to torchtitan-0.2`: [activation_checkpoint] mode
"selective", selective_ac_option f) to torchtitan 0.2.2's own code on CPU, no training: its ConfigManager, the train
spec's model on the meta device, split into the export's model parts (module_fqns_per_model_part: each part keeps its
blocks, as torchtitan's pipeline split does), and torchtitan's own apply_ac (torchtitan.distributed.
activation_checkpoint) on each pipeline rank's parts in its order (rank r holds stages r, r + pp, ...), its layer
counter fresh for each rank as in a process of its own.  Counts the blocks it wraps whole in each part against the
plan's recompute_layers.
Run:  PYTHONPATH=... python benchmarks/export_parse/tt_layer_sac_check.py EXPORTS...  (each a TOML with its plan JSON
beside it, NAME.json for NAME.toml; tt_layer_sac_run.sh makes them)."""
import json
import sys
import warnings
from importlib.metadata import version as _v

import torch
import torchtitan.distributed.activation_checkpoint as ac
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torchtitan.config import ConfigManager
from torchtitan.protocols.train_spec import get_train_spec


def check(toml: str) -> list[str]:
    plan = json.load(open(toml[: -len(".toml")] + ".json"))
    jc = ConfigManager().parse_args(["--job.config_file", toml])
    a, pc = jc.activation_checkpoint, jc.parallelism
    out = [f"parsed: mode {a.mode!r}, selective_ac_option {a.selective_ac_option!r}, pp {pc.pipeline_parallel_degree}"]
    spec = get_train_spec(jc.model.name)
    margs = spec.model_args[jc.model.flavor]
    margs.update_from_config(jc)
    parts = pc.module_fqns_per_model_part or [["layers." + k for k in map(str, range(margs.n_layers))]]
    pp, want = pc.pipeline_parallel_degree, plan["parallel"]["recompute_layers"]
    ok = True
    for rank in range(pp):
        ac._layer_sac_count = 0  # a process of its own
        counts = []
        for stage in range(rank, len(parts), pp):
            keep = {f.split(".", 1)[1] for f in parts[stage] if f.startswith("layers.")}
            with torch.device("meta"):
                model = spec.model_cls(margs)
            for name in list(model.layers.keys()):
                if name not in keep:
                    del model.layers[name]  # torchtitan's pipeline split deletes the other stages' blocks
            ac.apply_ac(model, a)
            counts.append(sum(isinstance(b, CheckpointWrapper) for b in model.layers.values()))
        ok &= all(c == want for c in counts)
        out.append(f"rank {rank}: stages {list(range(rank, len(parts), pp))}, blocks wrapped whole {counts} "
                   f"(plan: {want} a stage of {[sum(f.startswith('layers.') for f in parts[s]) for s in range(rank, len(parts), pp)]})")
    out.append("MATCH" if ok else "MISMATCH")
    return out


print("torchtitan", _v("torchtitan"), "torch", torch.__version__)
for path in sys.argv[1:]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            res = check(path)
        except BaseException as e:  # noqa: BLE001 (a check script: say what failed and go on)
            res = [f"FAIL {type(e).__name__}: {str(e)[:600]}"]
    print(path.rsplit("/", 1)[-1] + ":")
    for r in res:
        print("   " + r)
