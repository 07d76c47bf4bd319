"""Feed parplan's torchtitan exports to torchtitan's own ConfigManager, then to the checks its Trainer makes before
training that need no GPU/process group: ParallelDims validation, the batch-size asserts (train.py), the model args
(train spec flavor + update_from_config), a meta-device model, pipeline split points/schedule class/microbatch
count (distributed/pipeline.py), parallelize_llama's async-TP / DDP / AC-mode checks and maybe_enable_amp's warning.
Run:  PYTHONPATH=$W/tt-0.1.0 $W/venv/bin/python benchmarks/export_parse/tt_check.py            (torchtitan 0.1.0)
      PYTHONPATH=$W/tt-0.2.2 $W/venv/bin/python benchmarks/export_parse/tt_check.py [--adapt | --adapt-keep-split]  (0.2.2; --adapt applies the
      renames the export's own header asks for: training.compile->[compile] enable, training.seed->[debug] seed,
      pipeline_parallel_split_points->module_fqns_per_model_part from the export's note)
Stubs: a tokenizer object (n_words = plan vocab, eos_id 0) for 0.1.0's update_from_config; a custom flavor is registered
from the export's own 'register ... in llama3_configs' note; world_size = plan GPUs; nothing else."""
import os as _os
W = _os.environ.get("EXPORT_PARSE_DIR", "/tmp/parplan-export-parse")  # run_all.sh's work folder
import ast, glob, json, logging, os, re, sys, tempfile, traceback, warnings
import tomllib
import torch
import torchtitan
from importlib.metadata import version as _v

ADAPT = "--adapt" in sys.argv or "--adapt-keep-split" in sys.argv
KEEP_SPLIT = "--adapt-keep-split" in sys.argv
NEW = os.path.exists(os.path.join(os.path.dirname(torchtitan.__file__), "config", "manager.py"))
if NEW:
    from torchtitan.config import ConfigManager
else:
    from torchtitan.config_manager import ConfigManager
from torchtitan.distributed import ParallelDims
from torchtitan.distributed import utils as dist_utils
from torchtitan.protocols.train_spec import get_train_spec
from torch.distributed.pipelining.schedules import get_schedule_class, PipelineScheduleMulti
try:
    from torchtitan.models.llama3 import TransformerModelArgs
except ImportError:
    from torchtitan.models.llama3.model.args import TransformerModelArgs

class Cap(logging.Handler):
    def __init__(s): super().__init__(logging.WARNING); s.msgs = []
    def emit(s, r): s.msgs.append(f"{r.levelname}: {r.getMessage()}")
cap = Cap()
for name in ("torchtitan", ""):
    logging.getLogger(name).addHandler(cap)
from torchtitan.tools.logging import logger as ttlog
ttlog.addHandler(cap)

def toml_text_adapted(text, notes):
    """0.2.x renames from the export's header: training.compile -> [compile] enable, training.seed -> [debug] seed,
    split points -> module_fqns_per_model_part (the list the export's note gives)."""
    d = tomllib.loads(text)
    tr, par = d["training"], d["parallelism"]
    comp = tr.pop("compile", None); seed = tr.pop("seed", None)
    out = [text]
    out = re.sub(r"(?m)^compile = .*\n", "", text)
    out = re.sub(r"(?m)^seed = .*\n", "", out)
    if "pipeline_parallel_split_points" in par and not KEEP_SPLIT:
        out = re.sub(r"(?m)^pipeline_parallel_split_points = .*\n", "", out)
        m = [n for n in notes if "module_fqns_per_model_part = " in n][0]
        fqns = m.split("module_fqns_per_model_part = ", 1)[1].strip()
        out = out.replace("[parallelism]\n", f"[parallelism]\nmodule_fqns_per_model_part = {fqns}\n")
    out += f"\n[compile]\nenable = {'true' if comp else 'false'}\n\n[debug]\nseed = {seed}\n"
    return out

def register_flavor(spec_cfg, notes):
    n = [x for x in notes if "register '" in x]
    if not n:
        return None
    s = n[0]
    flavor = re.search(r"register '([^']+)'", s).group(1)
    kv = dict(re.findall(r"(\w+)=([^,\s()]+)", s.split("with", 1)[1]))
    args = dict(dim=int(kv["dim"]), n_layers=int(kv["n_layers"]), n_heads=int(kv["n_heads"]),
                n_kv_heads=int(kv["n_kv_heads"]), multiple_of=int(kv["multiple_of"]),
                ffn_dim_multiplier=None if kv["ffn_dim_multiplier"] == "None" else float(kv["ffn_dim_multiplier"]),
                rope_theta=float(kv["rope_theta"].rstrip(".")), vocab_size=int(kv["vocab_size"]))
    spec_cfg[flavor] = TransformerModelArgs(**args)
    return flavor, args

def check(path):
    name = os.path.basename(path).split(".")[0]
    plan = json.load(open(f"{W}/plans/{name}.json"))
    notes = [l[len("note: "):] for l in open(path.replace(".toml", ".err")).read().splitlines() if l.startswith("note: ")]
    text = open(path).read()
    if ADAPT:
        text = toml_text_adapted(text, notes)
        tmp = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False); tmp.write(text); tmp.close(); path = tmp.name
    out = []
    try:
        jc = ConfigManager().parse_args(["--job.config_file", path])
    except BaseException as e:
        return [f"PARSE FAIL {type(e).__name__}: {str(e)[:900]}"]
    out.append("parsed")
    pc, tr = jc.parallelism, jc.training
    gpus = plan["hardware"]["gpus"]
    try:
        kw = dict(dp_shard=pc.data_parallel_shard_degree, dp_replicate=pc.data_parallel_replicate_degree,
                  cp=pc.context_parallel_degree, tp=pc.tensor_parallel_degree, pp=pc.pipeline_parallel_degree,
                  world_size=gpus)
        if NEW:
            kw.update(ep=pc.expert_parallel_degree, etp=pc.expert_tensor_parallel_degree)
        else:
            kw.update(enable_loss_parallel=not pc.disable_loss_parallel)
        pd = ParallelDims(**kw)
        out.append(f"ParallelDims ok (dp_replicate={pd.dp_replicate} dp_shard={pd.dp_shard} cp={pd.cp} tp={pd.tp} pp={pd.pp}; fsdp_enabled={pd.fsdp_enabled})")
    except BaseException as e:
        out.append(f"ParallelDims FAIL {type(e).__name__}: {e}"); return out
    # train.py batch checks (dp_degree = the 'dp' mesh: dp_replicate * dp_shard)
    dp = pd.dp_replicate * pd.dp_shard
    g = tr.global_batch_size if tr.global_batch_size > 0 else tr.local_batch_size * dp
    if g % (tr.local_batch_size * dp):
        out.append(f"BATCH FAIL: global batch size must be multiple of local batch size times data-parallel degree ({g} % ({tr.local_batch_size} * {dp}) != 0)")
    else:
        out.append(f"batch ok: grad accumulation steps {g // (tr.local_batch_size * dp)}")
    if (tr.local_batch_size * dp) * (g // (tr.local_batch_size * dp)) != plan["training"]["global_batch_size"]:
        out.append("BATCH MISMATCH vs plan")
    # model args
    spec = get_train_spec(jc.model.name)
    cfgs = spec.config if hasattr(spec, "config") else spec.model_args
    flavor = jc.model.flavor
    if flavor not in cfgs:
        r = register_flavor(cfgs, notes)
        out.append(f"flavor {flavor!r} not built in; registered from the export's note: {r[1] if r else None}")
    margs = cfgs[flavor]
    try:
        if NEW:
            margs.update_from_config(jc)
        else:
            tok = type("Tok", (), {"n_words": plan["model"]["vocab"], "eos_id": 0})()
            margs.update_from_config(jc, tok)
    except BaseException as e:
        out.append(f"update_from_config FAIL {type(e).__name__}: {e}")
    with torch.device("meta"):
        model = spec.cls(margs) if hasattr(spec, "cls") else spec.model_cls(margs)
    m = plan["model"]
    nparam = sum(p.numel() for p in model.parameters())
    w1 = model.layers["0"].feed_forward.w1.out_features
    out.append(f"model (meta) ok: {len(model.layers)} layers, dim {margs.dim}, ffn width {w1} (plan {m['ffn_hidden']}), "
               f"vocab {margs.vocab_size} (plan {m['vocab']}), max_seq_len {margs.max_seq_len}, params {nparam/1e9:.3f} B")
    # parallelize_llama checks
    compile_on = jc.compile.enable if NEW and hasattr(jc, "compile") and hasattr(jc.compile, "enable") else getattr(tr, "compile", False)
    if pd.tp_enabled and pc.enable_async_tensor_parallel and not compile_on:
        out.append("parallelize FAIL RuntimeError: Async TP requires --training.compile")
    world_ndim = sum(d > 1 for d in (pd.pp, pd.dp_replicate, pd.dp_shard, pd.cp, pd.tp))
    if not pd.fsdp_enabled and pd.dp_replicate_enabled and world_ndim > 1:
        out.append("parallelize FAIL RuntimeError: DDP has not supported > 1D parallelism")
    ac = jc.activation_checkpoint
    if ac.mode not in ("none", "full", "selective") + (("memory_budget",) if NEW else ()):
        out.append(f"AC FAIL: Invalid AC mode: {ac.mode}")
    if ac.mode == "selective" and not (ac.selective_ac_option == "op" or ac.selective_ac_option.isdigit()):
        out.append(f"AC FAIL: Invalid selective AC option: {ac.selective_ac_option}")
    cap.msgs.clear()
    dist_utils.maybe_enable_amp(pd, tr.mixed_precision_param, "cuda") if not NEW else None
    # pipeline
    if pd.pp_enabled:
        try:
            cls = get_schedule_class(pc.pipeline_parallel_schedule)
        except BaseException as e:
            out.append(f"schedule FAIL {type(e).__name__}: {e}"); cls = None
        if NEW:
            parts = pc.module_fqns_per_model_part
            nstages = len(parts) if parts else None
            if parts:
                names = set(n for n, _ in model.named_children()) | {f"layers.{k}" for k in model.layers.keys()}
                bad = [x for p in parts for x in p if x not in names]
                flat = [x for p in parts for x in p if x.startswith("layers.")]
                out.append(f"module_fqns_per_model_part: {nstages} parts, unknown names {bad}, layers covered {len(flat)}/{len(model.layers)}")
            else:
                out.append(f"module_fqns_per_model_part not set (split points key: {getattr(pc, 'pipeline_parallel_split_points', 'absent')})")
        else:
            sp = pc.pipeline_parallel_split_points
            nstages = len(sp) + 1
            bad = [s for s in sp if s.split(".", 1)[1] not in model.layers.keys()]
            out.append(f"split points {len(sp)} -> {nstages} stages; unknown {bad}")
        if cls is not None and nstages:
            looped = issubclass(cls, PipelineScheduleMulti)
            per_rank = nstages / pd.pp
            if (looped and nstages % pd.pp) or (not looped and nstages != pd.pp):
                out.append(f"PIPELINE FAIL: {nstages} stages over pp {pd.pp} with {cls.__name__} (looped={looped})")
            if tr.local_batch_size % pc.pipeline_parallel_microbatch_size:
                out.append("PIPELINE FAIL: Batch size must be divisible by number of microbatches")
            nmb = tr.local_batch_size // pc.pipeline_parallel_microbatch_size
            out.append(f"pipeline ok: {cls.__name__}, {nstages} stages ({per_rank:g}/rank), {nmb} microbatches (plan {plan['training']['num_microbatches']})")
            if nmb < nstages:
                out.append(f"  WARNING: Number of microbatches ({nmb}) is less than the total number of stages ({nstages})")
    for w in cap.msgs:
        out.append(f"  framework log {w}")
    return out

print("torchtitan", _v("torchtitan"), "torch", torch.__version__, ("adapt-keep-split" if KEEP_SPLIT else "adapt") if ADAPT else "raw")
for f in sorted(glob.glob(f"{W}/exports/*.torchtitan.toml")):
    cap.msgs.clear()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        try:
            res = check(f)
        except BaseException as e:
            res = [f"SCRIPT ERROR {type(e).__name__}: {e}", traceback.format_exc()[-800:]]
    print(os.path.basename(f).split(".")[0] + ":")
    for r in res: print("   " + r)
    for x in w:
        if x.category not in (ResourceWarning, DeprecationWarning): print(f"   py-warning {x.category.__name__}: {x.message}")
