"""Sharded checkpoints with torch.distributed.checkpoint (DCP).

Keys are logical parameter names, and every tensor is saved in the logical (tp 1) layout: a TP shard is
saved as its rows (or columns) of the logical tensor, at their offsets in it (_LogicalPiece, _as_logical), the
vocabulary's padding left out, so DCP reshards it by offsets as it reshards FSDP2's DTensors over dp.  A
checkpoint therefore resumes with another tp, dp, pp, cp or ZeRO stage, layer keys using the global layer index
(tested: dp 2 -> 1, pp 2 -> 1 with ZeRO-1 -> FSDP2, cp 2 -> 4, tp 2 -> 1 and 2 -> 4, from and into FSDP2, with a
padded vocabulary, a mixture of experts and latent attention).  Every TP-split parameter of parplan's runtime is
its rank's contiguous slice of the logical tensor along ShardSpec.tp_dim (model.init_parameters draws it so: the
separate q/k/v, gate/up projections, heads or ffn rows; a latent attention's up projections by whole heads), so
the offset along that dimension is tp rank x the rank's share.  Checkpoints written before this keyed a TP
shard ``{name}@tp{rank}of{tp}`` and load only with the tp they were saved with (checkpoint_steps.saved_tp, which
`parplan launch` checks before any rank starts, and load too).

A mixture of experts' expert weights, and their optimizer states, are saved one key per expert,
``{name}@expert{global index}`` (_per_expert), so a checkpoint resumes with another ep too; checkpoints written
before that keyed an ep rank's experts ``@ep{rank}of{ep}`` and load only with the ep they were saved with
(checkpoint_steps.saved_ep).  Under ZeRO-3 an ep rank's experts are FSDP2 DTensors over their expert-data-parallel
group, sharded on dim 1 (data_parallel.shard_experts), so each expert's view is a DTensor of that group's chunks and
DCP reshards it as any other (tested: ZeRO-3 at ep 2 -> ep 4, tests/test_runtime_moe_zero3.py).  Data needs no state:
batches are a function of (seed, step, index).

Master-weights recipes (ZeRO 0-2) also save each fp32 master as ``{key}/master``; such a
checkpoint resumes only into a master-weights run and vice versa (FSDP2's fp32 shards are the
master and need no extra key; between FSDP2 and ZeRO 0-2 each side's fp32 values load into the
other's masters).  Optimizer offload changes nothing in the keys.
"""
from __future__ import annotations

import re

import torch

from .checkpoint_steps import saved, saved_tp, step_path


def _dcp():
    """torch.distributed.checkpoint, imported when a run saves or loads: with torch.distributed.tensor under it, 0.6 s
    of every rank's start (2026-12-06, this 2-core machine) that a run without checkpoints does not need."""
    import torch.distributed.checkpoint as dcp
    return dcp


def _key(mod, spec, legacy_tp: bool = False) -> str:
    """The parameter's DCP key: its logical name (a TP shard saved at its offsets in the logical tensor,
    _as_logical), an ep rank's experts suffixed for _per_expert to split; legacy_tp: a TP shard keyed by its tp
    rank, as checkpoints written before tp-independent keys have it."""
    if legacy_tp and _tp_split(mod, spec):
        return f"{spec.logical_name}@tp{mod.tp_rank}of{mod.tp_size}"
    if getattr(spec, "ep_dim", None) is not None:  # an ep rank's experts (_per_expert splits them), ep 1 too
        return f"{spec.logical_name}@ep{getattr(mod, 'ep_rank', 0)}of{getattr(mod, 'ep_size', 1)}"
    return spec.logical_name


def _tp_split(mod, spec) -> bool:
    return spec.tp_dim is not None and mod.tp_size > 1


class _LogicalPiece(torch.Tensor):
    """A rank's piece of a TP-split tensor as DCP sees it: a tensor of the logical (tp 1) shape of which this rank
    holds `local` at `offsets`, through DCP's _Checkpointable hooks (torch/distributed/_checkpointable.py: the
    ones DTensor implements).  Saving writes `local` as that chunk of the logical tensor; loading reads into
    `local` in place whatever the saved chunks hold of it, whichever tp (and dp sharding) wrote them.  An empty
    piece (all padding) writes and reads nothing.  No tensor operation runs on it."""

    @staticmethod
    def __new__(cls, local: torch.Tensor, shape, offsets):
        t = torch.Tensor._make_wrapper_subclass(cls, torch.Size(shape), dtype=local.dtype, device=local.device)
        t.local, t.offsets = local, torch.Size(offsets)
        return t

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"{func} on a checkpoint's logical piece: only DCP reads and writes it")

    def __repr__(self):
        return (f"_LogicalPiece(shape={tuple(self.shape)}, offsets={tuple(self.offsets)}, "
                f"local={tuple(self.local.shape)})")

    def _chunks(self):
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
        return [ChunkStorageMetadata(offsets=self.offsets, sizes=self.local.shape)] if self.local.numel() else []

    def __create_write_items__(self, fqn: str, obj) -> list:
        from torch.distributed.checkpoint.metadata import MetadataIndex, TensorProperties
        from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType
        properties = TensorProperties.create_from_tensor(self.local)
        return [WriteItem(index=MetadataIndex(fqn, c.offsets), type=WriteItemType.SHARD,
                          tensor_data=TensorWriteData(chunk=c, properties=properties, size=self.shape))
                for c in self._chunks()]

    def __create_chunk_list__(self) -> list:
        return self._chunks()

    def __get_tensor_shard__(self, index) -> torch.Tensor:
        return self.local


def _logical_piece(t: torch.Tensor, spec, tp_rank: int, tp_size: int) -> _LogicalPiece:
    """t (a TP rank's parameter or optimizer state: a plain tensor, or FSDP2's DTensor over dp of it) as its piece of
    the logical tensor.  The rank holds the slice tp_rank x share onwards along spec.tp_dim (model.init_parameters),
    share the padded size / tp; the padding past the logical size (the vocabulary's, on the last ranks) is left out."""
    from parallel_layers.layers import padded_size
    d, full = spec.tp_dim, spec.full_shape
    share = t.shape[d]
    if tuple(t.shape) != tuple(share if i == d else n for i, n in enumerate(full)) or \
            share * tp_size != (padded_size(full[d], tp_size) if spec.pad_tp_dim else full[d]):
        raise ValueError(f"{spec.logical_name}: a tp={tp_size} shard of shape {tuple(t.shape)} is not a slice of the "
                         f"logical {tuple(full)} along dim {d}")
    if hasattr(t, "__create_chunk_list__"):  # FSDP2's DTensor over dp: its rank's chunk of the TP shard
        offsets = list(t.__create_chunk_list__()[0].offsets)
        local = t.to_local()
    else:
        offsets, local = [0] * t.dim(), t
    offsets[d] += tp_rank * share
    keep = max(0, min(local.shape[d], full[d] - offsets[d]))
    return _LogicalPiece(local.narrow(d, 0, keep), full, offsets)


def _tp_layouts(stage_modules) -> dict[str, tuple]:
    """{key: (spec, tp rank, tp size)} of the TP-split parameters (tp > 1) under their tp-independent keys."""
    return {_key(mod, spec): (spec, mod.tp_rank, mod.tp_size)
            for m in stage_modules for mod in m.modules()
            for spec in getattr(mod, "param_specs", {}).values() if _tp_split(mod, spec)}


def _as_logical(sd: dict, stage_modules) -> None:
    """sd's TP-split parameters and their optimizer states ("{key}/{state}": AdamW's moments, an fp32 master, a
    whole split state's host copy) as _LogicalPiece, in place; a scalar state (AdamW's step) stays a replicated
    tensor.  Last before DCP: the rest of the code reads and copies the plain tensors."""
    layouts = _tp_layouts(stage_modules)
    for section in ("model", "optim"):
        for key, value in sd[section].items():
            layout = layouts.get(key.split("/", 1)[0])
            if layout is not None and isinstance(value, torch.Tensor) and value.dim():
                sd[section][key] = _logical_piece(value, *layout)


_EP_KEY = re.compile(r"(?P<name>.+)@ep(?P<rank>\d+)of(?P<ep>\d+)(?P<rest>/.*)?")


def _per_expert(sd: dict, loading: bool, legacy_ep: bool = False) -> None:
    """sd's "model" and "optim" entries of an ep rank's experts (``{name}@ep{rank}of{ep}``, the rank's E / ep experts
    stacked on the first dimension, experts rank x E / ep onwards) as one entry per expert, ``{name}@expert{g}``: views
    when loading (DCP writes into them in place), host copies when saving (a view would be saved with its whole
    stack).  A scalar state (AdamW's step) is the same for each of the rank's experts.  legacy_ep: the checkpoint keys
    experts by ep rank (before per-expert keys), kept as they are."""
    if legacy_ep:  # ep 1 had no suffix then
        for section in ("model", "optim"):
            sd[section] = {re.sub(r"@ep0of1(?=/|$)", "", k): v for k, v in sd[section].items()}
        return
    stacked = {}  # "{name}@ep{rank}of{ep}" -> experts the rank holds
    for key, value in sd["model"].items():
        if _EP_KEY.fullmatch(key):
            stacked[key] = value.shape[0]
    for section in ("model", "optim"):
        out = {}
        for key, value in sd[section].items():
            m = _EP_KEY.fullmatch(key)
            base = m and f"{m['name']}@ep{m['rank']}of{m['ep']}"
            if not m or base not in stacked:
                out[key] = value
                continue
            n, rest = stacked[base], m["rest"] or ""
            for j in range(n):
                piece = value if value.dim() == 0 else value[j]
                if not loading and value.dim():
                    piece = piece.detach().to("cpu", copy=True)
                out[f"{m['name']}@expert{int(m['rank']) * n + j}{rest}"] = piece
        sd[section] = out


def _keyed(stage_modules, legacy_tp: bool = False) -> tuple[dict[str, torch.nn.Parameter],
                                                             list[tuple[str, torch.nn.Parameter]]]:
    """({key: parameter}, [(key, copy)]): the first parameter of each key, and the other parameters that carry
    the same key -- a tied head's copy of the embedding on the rank that holds both ends (ZB-V's rank 0),
    which is saved once and restored from the same values.  legacy_tp: TP shards keyed by tp rank (_key)."""
    out, copies = {}, []
    for m in stage_modules:
        for mod in m.modules():
            for attr, spec in getattr(mod, "param_specs", {}).items():
                k, p = _key(mod, spec, legacy_tp), getattr(mod, attr)
                if k not in out:
                    out[k] = p
                elif out[k] is not p and all(c is not p for _, c in copies):
                    copies.append((k, p))
    return out, copies


def keyed_parameters(stage_modules) -> dict[str, torch.nn.Parameter]:
    return _keyed(stage_modules)[0]


def _ensure_adamw_state(optim: torch.optim.Optimizer) -> None:
    """Create zero AdamW states (as AdamW would on its first step) so DCP can load in place."""
    for group in optim.param_groups:
        for p in group["params"]:
            if p in optim.state and optim.state[p]:
                continue
            on_device = group.get("fused") or group.get("capturable")
            optim.state[p] = {
                "step": torch.zeros((), dtype=torch.float32, device=p.device if on_device else "cpu"),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
            }


def _unwrap(optim):
    """The torch optimizer inside ShardedAdamW / MasterAdamW wrappers (None for a dp rank that
    owns no parameter), with the MasterAdamW whose fp32 copies it steps (or None)."""
    master = None
    while optim is not None and not isinstance(optim, torch.optim.Optimizer):
        if hasattr(optim, "alias"):
            master = optim
        optim = optim.optim
    return optim, master


def state_dict(stage_modules, optim, step: int, create_optim_state: bool = False, after_load: list | None = None,
               legacy_ep: bool = False, legacy_tp: bool = False) -> dict:
    """optim: a torch optimizer or a ShardedAdamW / MasterAdamW.  A MasterAdamW's states are
    keyed by the parameter its fp32 copy belongs to; its fp32 master (master-weights recipes,
    not a mere host mirror of an fp32 parameter) is saved as ``{key}/master``.

    A parameter ZeRO-1/2 split by rows over the dp ranks (ShardedAdamW.split) is saved whole, as any
    other: saving assembles each of its states on the host of the rank holding its first rows (the other
    ranks holding rows send them, one slice at a time, so no rank holds a whole state on the device); loading (after_load given) reads each whole state into a
    host tensor and appends (source, target, first row, end row) to after_load for ``load`` to copy each
    rank's rows, so a rank holding a piece keeps whole host copies of its split states until the load
    returns (6.3 GB for llama3-8b's embedding with fp32 masters at tp 1).  A tied head's copy on the rank that holds both
    ends is saved once, under the embedding's key, and loads from it.  A mixture of experts' expert weights and states:
    one key per expert (_per_expert; legacy_ep: a checkpoint keyed by ep rank, loaded as it is).  The tensors are
    the rank's own, TP shards among them (save and load place those in the logical tensor: _as_logical); legacy_tp:
    a checkpoint whose TP shards are keyed by tp rank, loaded as it is."""
    params, copies = _keyed(stage_modules, legacy_tp)
    sd = {"model": dict(params), "optim": {}, "meta": {"step": torch.tensor(step)}}
    vocab = logical_vocab(stage_modules)
    if vocab is not None:  # the vocabulary before padding to a multiple of tp, which the shapes cannot tell apart
        sd["meta"]["vocab"] = torch.tensor(vocab)
    inner, master = _unwrap(optim)
    keep_master = master is not None and master.keep_master
    rows_of = {id(pc.leaf): (pc.param, pc.start, pc.end) for pc in getattr(optim, "local", ()) if pc.leaf is not pc.param}
    key_of = {id(p): k for k, p in params.items()}
    copy_key = {id(c): k for k, c in copies}
    loading = after_load is not None
    temps: dict[str, torch.Tensor] = {}
    held = []  # (parameter, first row or None when whole, end row, {state name: tensor})

    def load_into(key: str, target: torch.Tensor, a, b, shape) -> None:
        source = sd["optim"].get(key)
        if source is None:
            source = temps.setdefault(key, torch.zeros(shape if target.dim() else (), dtype=target.dtype))
            sd["optim"][key] = source
        after_load.append((source, target, a, b))

    if inner is not None:
        if create_optim_state or rows_of:
            _ensure_adamw_state(inner)
        alias = master.alias if master is not None else {}
        for t, st in inner.state.items():
            owner = alias.get(id(t), t)
            p, a, b = rows_of.get(id(owner), (owner, None, None))
            held.append((p, a, b, dict(st, **({"master": t} if keep_master else {}))))
        for p, a, b, named in held:
            if id(p) in copy_key:
                continue
            for name, value in named.items():
                if a is None:
                    sd["optim"][f"{key_of[id(p)]}/{name}"] = value
                elif loading:
                    load_into(f"{key_of[id(p)]}/{name}", value, a, b, p.shape)
        for p, a, b, named in held:  # a tied copy's states equal the first's (the same summed gradient)
            if loading and id(p) in copy_key:
                for name, value in named.items():
                    load_into(f"{copy_key[id(p)]}/{name}", value, a, b, p.shape)
    if not loading and rows_of:
        mine = {id(p): named for p, a, _, named in held if a is not None}
        _gather_split_states(optim, mine, key_of, copy_key, sd["optim"])
    _per_expert(sd, loading, legacy_ep)
    return sd


def _gather_split_states(sharded, mine: dict, key_of, copy_key, out: dict) -> None:
    """Each state of each split parameter assembled whole, on the host, by the dp rank holding its first rows:
    every other rank holding rows sends them to it (point to point, in the parameters' and the state names'
    order, the same on every rank); a rank holding none takes no part and allocates nothing.  mine: id(param)
    -> {state name: this rank's rows of it}."""
    import torch.distributed as dist

    group, me = sharded.dp_group, dist.get_rank()
    for p in sharded.params:
        if not sharded.is_split(p) or id(p) in copy_key or id(p) not in mine:
            continue
        pieces = [(pc.global_rank, pc.start, pc.end) for pc in sharded.pieces if pc.param is p]
        first, key = pieces[0][0], key_of[id(p)]
        for name in sorted(mine[id(p)]):  # the same names on every rank holding rows (one optimizer type)
            value = mine[id(p)][name]
            if name == "step":  # a count, the same on every piece
                if me == first:
                    out[f"{key}/step"] = value
                continue
            if me != first:  # collectives need device tensors under NCCL (offloaded states live on the host)
                dist.send(value.detach().to(p.device).contiguous(), dst=first, group=group)
                continue
            full = torch.empty(p.shape, dtype=value.dtype)
            full[pieces[0][1]:pieces[0][2]].copy_(value)
            for g, a, b in pieces[1:]:
                rows = torch.empty((b - a, *p.shape[1:]), dtype=value.dtype, device=p.device)
                dist.recv(rows, src=g, group=group)
                full[a:b].copy_(rows)
            out[f"{key}/{name}"] = full


def logical_vocab(stage_modules) -> int | None:
    """The model's vocabulary as the plan gives it (ModelConfig.vocab), before the TP padding (None without a config)."""
    for m in stage_modules:
        cfg = getattr(m, "cfg", None)
        if cfg is not None and getattr(cfg, "vocab", None):
            return int(cfg.vocab)
    return None


def _optimizers(optim) -> list:
    """optim, or a list of them: a mixture of experts under ZeRO-1/2 steps its experts with an optimizer of their own
    (split over the expert-data-parallel group), the first the rest's."""
    return list(optim) if isinstance(optim, (list, tuple)) else [optim]


def save(directory: str, step: int, stage_modules, optim, scaler=None) -> str:
    """scaler: an fp16 run's loss scaler (parallel_layers.loss_scale), whose scale and count of good steps are kept.
    optim: an optimizer or a list of them (_optimizers), each over its own parameters."""
    path = step_path(directory, step)
    first, *others = _optimizers(optim)
    sd = state_dict(stage_modules, first, step)
    for other in others:
        sd["optim"].update(state_dict(stage_modules, other, step)["optim"])
    if scaler is not None:
        sd["meta"].update(_scaler_tensors(scaler.state()))
    _as_logical(sd, stage_modules)
    _dcp().save(sd, checkpoint_id=path)
    return path


def _scaler_tensors(state: dict) -> dict:
    return {"loss_scale": torch.tensor(state["scale"], dtype=torch.float64),
            "loss_scale_good_steps": torch.tensor(state["good_steps"])}


def latest(directory: str, step: int | None = None) -> str | None:
    """The newest complete checkpoint under directory, or the one written after `step` (None when absent)."""
    have = saved(directory)
    if step is not None:
        return have.get(step)
    return have[max(have)] if have else None


def _restore_copies(stage_modules, optim) -> None:
    """A tied head's copy takes the loaded embedding's values, fp32 master and AdamW state."""
    params, copies = _keyed(stage_modules)
    if not copies:
        return
    inner, master = _unwrap(optim)
    alias = master.alias if master is not None else {}
    opt_of = {id(alias.get(id(p), p)): p for p in (inner.state if inner is not None else {})}
    with torch.no_grad():
        for k, c in copies:
            c.copy_(params[k])
            src, dst = opt_of.get(id(params[k])), opt_of.get(id(c))
            if src is None or dst is None:
                continue
            if src is not params[k]:  # an fp32 master stands for the parameter in the optimizer
                dst.copy_(src)
            for name, value in inner.state[src].items():
                inner.state[dst][name].copy_(value)


def _saved_keys(path: str) -> set[str]:
    """The flattened keys a checkpoint holds ("model.<key>", "optim.<key>/master", ...)."""
    return set(_dcp().FileSystemReader(path).read_metadata().state_dict_metadata)


def _cross_master_recipes(sd: dict, saved: set[str]) -> list:
    """A master-weights checkpoint resumes across FSDP2 and ZeRO 0-2, whose fp32 masters are saved differently:
    FSDP2's fp32 parameters are the masters (under "model"), ZeRO 0-2 save 16-bit parameters plus
    "{key}/master".  Redirects sd so each fp32 tensor loads from the fp32 values the checkpoint has; returns
    [(16-bit parameter, fp32 master)] to copy after the load."""
    after = []
    masters = {k[: -len("/master")]: v for k, v in sd["optim"].items() if k.endswith("/master")}
    params = sd["model"]
    if masters and not any(k.endswith("/master") for k in saved):
        # written by FSDP2 (no master keys): the masters load from its fp32 parameters
        for k, master in masters.items():
            del sd["optim"][f"{k}/master"]
            after.append((params[k], master))
            params[k] = master
    elif not masters and any(k.endswith("/master") for k in saved):
        # written by ZeRO 0-2 with masters, read by FSDP2 (fp32 parameters): take the fp32 masters, not the
        # 16-bit copies
        for k in list(params):
            if params[k].dtype == torch.float32 and f"optim.{k}/master" in saved:
                sd["optim"][f"{k}/master"] = params.pop(k)
    return after


def load(path: str, stage_modules, optim, scaler=None) -> int:
    """Load in place; returns the step the checkpoint was written after.  scaler: an fp16 run's loss scaler, which
    takes the checkpoint's scale where it has one (a bf16 or fp32 run's has none: the scaler keeps its start)."""
    rows = []
    first, *others = _optimizers(optim)
    saved = _saved_keys(path)
    # experts keyed by ep rank, or under their plain names at ep 1 (written before per-expert keys)
    legacy = not any("@expert" in k for k in saved)
    # TP shards keyed by tp rank (written before tp-independent keys): only that tp has those keys
    old_tp = saved_tp(path)
    tp = max((getattr(mod, "tp_size", 1) for m in stage_modules for mod in m.modules()), default=1)
    if old_tp is not None and old_tp != tp:
        raise RuntimeError(f"checkpoint {path} keys its tensor-parallel shards by tp rank (written before "
                           f"tp-independent keys) for tp={old_tp}, and this run has tp={tp}: resume it with "
                           f"tp={old_tp}")
    kw = dict(create_optim_state=True, after_load=rows, legacy_ep=legacy, legacy_tp=old_tp is not None)
    sd = state_dict(stage_modules, first, 0, **kw)
    for other in others:
        sd["optim"].update(state_dict(stage_modules, other, 0, **kw)["optim"])
    after = _cross_master_recipes(sd, saved)
    if old_tp is None:
        _as_logical(sd, stage_modules)
    want = logical_vocab(stage_modules) if "meta.vocab" in saved else None  # none recorded before 2026-12-02
    if want is None:
        sd["meta"].pop("vocab", None)
    scaled = scaler is not None and "meta.loss_scale" in saved
    if scaled:
        sd["meta"].update(_scaler_tensors(scaler.state()))
    dcp = _dcp()
    try:
        dcp.load(sd, checkpoint_id=path)
    except dcp.api.CheckpointException as e:  # its own text names only the failing ranks: say what failed
        causes = [f[0] if isinstance(f, tuple) else f for f in e.failures.values()] or [e]
        first = (str(causes[0]).strip().splitlines() or [repr(causes[0])])[0]
        raise RuntimeError(f"checkpoint {path} failed to load: {first} (a model other than the one it was saved "
                           "with is the usual cause)") from e
    if want is not None and int(sd["meta"]["vocab"]) != want:
        # the padded rows agree (the shapes loaded), the tokens do not: vocab 254 and 256 both pad to 256 at tp 4
        raise RuntimeError(f"checkpoint {path} holds a model of a {int(sd['meta']['vocab'])}-token vocabulary and this "
                           f"run's has {want} (both pad to the same rows)")
    with torch.no_grad():
        for param, master in after:
            param.copy_(master)
        for source, target, a, b in rows:  # split parameters' rows, and a tied copy's states
            target.copy_(source if a is None or source.dim() == 0 else source[a:b])
    if scaled:
        scaler.load({"scale": float(sd["meta"]["loss_scale"]), "good_steps": int(sd["meta"]["loss_scale_good_steps"])})
    _restore_copies(stage_modules, first)  # (a tied embedding's copies: never an expert)
    for each in (first, *others):
        _, master = _unwrap(each)
        if master is not None:
            master.sync_from_params()  # a host mirror of fp32 parameters follows the loaded values
    return int(sd["meta"]["step"].item())
