"""Feed parplan's torchtitan exports of mixtures of experts (`--to torchtitan-0.2`) to torchtitan 0.2.2's own code, on
CPU, no training: its ConfigManager; ParallelDims with the export's ep / etp, and its build_mesh on a fake process group
of the plan's GPUs (torch.testing's FakeStore: the experts' mesh (pp, dp_replicate, efsdp, ep, etp) must unflatten);
the train spec's flavor (a custom one registered from the export's own note) and its model on the meta device,
parameters counted against the plan's; the train spec's pipelining_fn where pp > 1; the Trainer's batch asserts;
the DeepEP backend's ep > 1 rule.
Run:  PYTHONPATH=$W/tt-0.2.2 $W/venv/bin/python benchmarks/export_parse/tt_moe_check.py   (W: EXPORT_PARSE_DIR, whose
plans/ and exports/ hold `recommend --json` plans and their `export --to torchtitan-0.2` TOML + stderr notes;
tt_moe_run.sh makes them).  Stubs: the fake process group (rank 0 of the plan's world size); nothing else."""
import os as _os
W = _os.environ.get("EXPORT_PARSE_DIR", "/tmp/parplan-export-parse-moe")
import glob, json, logging, os, re, sys, traceback, warnings
import torch
import torch.distributed as dist
from importlib.metadata import version as _v
from torch.testing._internal.distributed.fake_pg import FakeStore
from torchtitan.config import ConfigManager
from torchtitan.distributed import ParallelDims
import torchtitan.distributed.parallel_dims as _pdm
from torchtitan.models.moe import MoEArgs
from torchtitan.models.qwen3 import Qwen3ModelArgs
from torchtitan.models.deepseek_v3 import DeepSeekV3ModelArgs
from torchtitan.protocols.train_spec import get_train_spec

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from planner.models import with_param_count  # noqa: E402  (the plan's own parameter count)
from planner.schema import Plan  # noqa: E402

logging.disable(logging.WARNING)


def register_flavor(cfgs, notes):
    """A custom flavor from the export's note: "register 'NAME' in qwen3_args (...) as Qwen3ModelArgs(...)" (or
    deepseekv3_args ... DeepSeekV3ModelArgs(...))."""
    n = [x for x in notes if "register '" in x and ("Qwen3ModelArgs(" in x or "DeepSeekV3ModelArgs(" in x)]
    if not n:
        return None
    flavor = re.search(r"register '([^']+)'", n[0]).group(1)
    cls = "Qwen3ModelArgs(" if "Qwen3ModelArgs(" in n[0] else "DeepSeekV3ModelArgs("
    expr = n[0][n[0].index(cls):]
    depth, end = 0, 0
    for i, c in enumerate(expr):
        depth += c == "("
        depth -= c == ")"
        if depth == 0 and c == ")":
            end = i + 1
            break
    cfgs[flavor] = eval(expr[:end], {"Qwen3ModelArgs": Qwen3ModelArgs, "DeepSeekV3ModelArgs": DeepSeekV3ModelArgs,
                                     "MoEArgs": MoEArgs, "True": True, "False": False})
    return flavor


def check(path):
    name = os.path.basename(path).split(".")[0]
    plan = json.load(open(f"{W}/plans/{name}.json"))
    notes = [l[len("note: "):] for l in open(path.replace(".toml", ".err")).read().splitlines()
             if l.startswith("note: ")]
    out = []
    try:
        jc = ConfigManager().parse_args(["--job.config_file", path])
    except BaseException as e:
        return [f"PARSE FAIL {type(e).__name__}: {str(e)[:900]}"]
    out.append("parsed")
    pc, tr = jc.parallelism, jc.training
    gpus = plan["hardware"]["gpus"]
    try:
        pd = ParallelDims(dp_shard=pc.data_parallel_shard_degree, dp_replicate=pc.data_parallel_replicate_degree,
                          cp=pc.context_parallel_degree, tp=pc.tensor_parallel_degree, pp=pc.pipeline_parallel_degree,
                          ep=pc.expert_parallel_degree, etp=pc.expert_tensor_parallel_degree, world_size=gpus)
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=gpus)
        _pdm.device_type = "cpu"  # (its meshes on the CPU: FSDP2 asks the mesh's device, CUDA by default)
        pd.build_mesh()
        ep_mesh = pd.get_optional_mesh("ep")
        efsdp = pd.get_optional_mesh("efsdp")
        out.append(f"ParallelDims + build_mesh ok (dp_replicate={pd.dp_replicate} dp_shard={pd.dp_shard} cp={pd.cp} "
                   f"tp={pd.tp} pp={pd.pp} ep={pd.ep} etp={pd.etp}; ep mesh {ep_mesh.size() if ep_mesh else None}, "
                   f"efsdp mesh {efsdp.size() if efsdp else None}; fsdp_enabled={pd.fsdp_enabled})")
    except BaseException as e:
        out.append(f"ParallelDims/build_mesh FAIL {type(e).__name__}: {str(e)[:600]}")
        return out
    if pc.expert_parallel_comm_backend == "deepep" and not pd.ep_enabled:
        out.append("DEEPEP FAIL: DeepEP requires expert parallelism (ep_degree > 1)")
    elif pc.expert_parallel_comm_backend == "deepep":
        out.append("deepep: ep > 1, etp 1 (parallelize's DeepEP checks pass)")
    dp = pd.dp_replicate * pd.dp_shard
    g = tr.global_batch_size if tr.global_batch_size > 0 else tr.local_batch_size * dp
    if g % (tr.local_batch_size * dp):
        out.append(f"BATCH FAIL: {g} % ({tr.local_batch_size} * {dp}) != 0")
    elif (tr.local_batch_size * dp) * (g // (tr.local_batch_size * dp)) != plan["training"]["global_batch_size"]:
        out.append("BATCH MISMATCH vs plan")
    else:
        out.append(f"batch ok: grad accumulation steps {g // (tr.local_batch_size * dp)}")
    spec = get_train_spec(jc.model.name)
    cfgs = spec.model_args
    flavor = jc.model.flavor
    if flavor not in cfgs:
        out.append(f"flavor {flavor!r} not built in; registered from the export's note: {register_flavor(cfgs, notes)}")
    margs = cfgs[flavor]
    margs.update_from_config(jc)
    with torch.device("meta"):
        model = spec.model_cls(margs)
    nparam = sum(p.numel() for p in model.parameters())
    counted = with_param_count(Plan.model_validate(plan).model, plan["training"]["seq_len"]).num_params
    out.append(f"model {jc.model.name}/{flavor} (meta) ok: {len(model.layers)} layers, params {nparam / 1e9:.3f} B "
               f"(plan counts {counted / 1e9:.3f} B, {100 * (nparam / counted - 1):+.2f} %)")
    # the train spec's parallelize_fn on the meta model (TP, EP, activation checkpointing, FSDP2 over the experts'
    # efsdp mesh): every rank of an expert-parallel group holds experts / ep experts, FSDP-sharded over efsdp x
    # dp_replicate's shard dim, the expert_shards parplan counts (cost_models/moe.py); not under DeepEP (its kernels are
    # not installed here) nor with pp > 1 (the pipeline splits the model first)
    if pc.expert_parallel_comm_backend != "deepep" and not pd.pp_enabled:
        try:
            model = spec.parallelize_fn(model, pd, jc)
            block = next(b for b in model.layers.values() if getattr(b, "moe_enabled", False))
            weights = list(block.moe.experts.parameters())
            w1 = weights[0]
            local = sum(w.to_local().numel() for w in weights)
            m = plan["model"]
            ep, edp = plan["parallel"]["ep"], plan["parallel"]["tp"] * plan["parallel"]["cp"] * plan["parallel"]["dp"]
            shards = edp // ep // plan["parallel"]["dp_replicate"]
            want = m["experts"] * 3 * m["hidden"] * m["ffn_hidden"] / (ep * shards)
            out.append(f"parallelize_fn ok: the experts' weights {tuple(w1.placements)} over "
                       f"{w1.device_mesh.mesh_dim_names} {tuple(w1.device_mesh.shape)}, {local:,} elements a rank "
                       f"(plan: experts x 3 x hidden x ffn / ep {ep} / {shards} shards = {want:,.0f}, "
                       f"{100 * (local / want - 1):+.2f} %)")
            attn = block.attention
            if hasattr(attn, "wkv_a"):  # latent attention: the down projection's and the up projection's placements
                out.append("  latent attention's weights: " + ", ".join(
                    f"{n} {tuple(getattr(attn, n).weight.placements)} over {getattr(attn, n).weight.device_mesh.mesh_dim_names}"
                    for n in ("wkv_a", "wkv_b", "wo") + (("wq_a", "wq_b") if hasattr(attn, "wq_a") else ("wq",))))
        except BaseException as e:
            out.append(f"parallelize_fn FAIL {type(e).__name__}: {str(e)[:600]}")
    if pd.pp_enabled and spec.pipelining_fn is None:
        noted = any("no pipelining_fn" in n for n in notes)
        out.append(f"pp {pd.pp}: {jc.model.name} has no pipelining_fn (the Trainer refuses it); the export's note "
                   f"says so: {noted}")
    return out


print("torchtitan", _v("torchtitan"), "torch", torch.__version__)
for f in sorted(glob.glob(f"{W}/exports/*.torchtitan.toml")):
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("ignore")
        try:
            res = check(f)
        except BaseException as e:
            res = [f"SCRIPT ERROR {type(e).__name__}: {e}", traceback.format_exc()[-800:]]
    print(os.path.basename(f).split(".")[0] + ":")
    for r in res:
        print("   " + r)
if dist.is_initialized():
    dist.destroy_process_group()
