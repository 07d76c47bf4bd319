"""`parplan launch`: check a plan against this machine, run it as a torchrun job built from
parallel_layers, stream rank 0's progress, and report measured against predicted.

Pre-flight checks (each failure one stderr line with the fix): torch importable, the plan's
prediction made again from its layout (an edited plan is compared with its own), the device
(auto = cuda when a GPU is visible), world size (tp*pp*dp*cp) against GPUs here x nnodes,
what parallel_layers runs, the multi-node rendezvous, the plan's hardware profile against this
GPU (a warning), the NVLink-bridged GPUs a plan prices pairs of ranks on against `nvidia-smi topo -m` (a
warning, planner.topology), a job across nodes' inter-node rate a GPU against this node's NICs (a warning), the
predicted memory per GPU against free device memory (on cpu: the ranks'
state against the host's available memory), a --data token file, --resume against the
checkpoints saved, and the folders the run writes into.

The torchrun command is a Python list (never a shell string); plan fields never reach a
command line: the validated plan is written to a file in the run directory and its path is
passed.  stdout stays clean during a run (dry-run prints the command there); progress, the
summary table and errors go to stderr.  torch is imported only inside ``launch``.

Exit codes: 0 ok (and every dry run that could build a command, but with --strict one whose checks failed), 2
invalid plan or a failed
pre-flight check, 3 the plan does not fit in free device (or, on cpu, host) memory, 130 interrupted, else the
job's own exit code.
"""
from __future__ import annotations

import collections
import hashlib
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from cost_models.compute import plan_fuses_wgrad, plan_overlaps_param_gather
from cost_models.memory import runs_in_rounds
from parallel_layers.checkpoint_steps import saved_ep, saved_steps, saved_tp, step_path
from planner.core import CHUNK_FRAMEWORKS, default_stage_layers, own_stage_layers, trains_window
from planner.limits import can_make_folder_in, is_device

EXIT_OK = 0
EXIT_INVALID = 2
EXIT_DOES_NOT_FIT = 3
EXIT_INTERRUPTED = 130
REPO_ROOT = Path(__file__).resolve().parents[1]
STEP_LINE = re.compile(r"\[parplan\] step (\d+)/(\d+) loss=(\S+) step_time_s=(\S+) tokens_per_s=(\S+)")
FAIL_LINE = re.compile(r"\[parplan\] rank (\S+) failed: (.*)")
TAIL_LINES = 40


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    exit_code: int = EXIT_INVALID
    settled: bool = True  # False: this machine cannot make the check (a cuda plan where there is no GPU)

    def line(self) -> str:
        """`[ok  ]`, `[FAIL]`, `[warn]` for a passed check whose detail is a warning, `[--  ]` for one this machine
        could not settle."""
        mark = ("FAIL" if not self.ok else "warn" if self.detail.startswith("warning:")
                else "ok  " if self.settled else "--  ")
        detail = self.detail.removeprefix("warning: ") if mark == "warn" else self.detail
        return f"[{mark}] {self.name}: {detail}" + (f" -- fix: {self.fix}" if not self.ok and self.fix else "")


@dataclass
class MachineInfo:
    torch_version: Optional[str]
    gpus: int
    free_memory_bytes: Optional[int]  # smallest free memory over the visible GPUs
    gpu_name: Optional[str] = None
    cpu_cores: Optional[int] = None  # cores this process may run on
    host_available_bytes: Optional[int] = None  # host memory available (MemAvailable) on this node
    capability: Optional[tuple] = None  # the first GPU's CUDA compute capability (major, minor)


def host_memory_available() -> Optional[int]:
    """MemAvailable from /proc/meminfo (what the kernel can give without swapping), else free pages; None when
    neither is readable."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def cpu_cores() -> Optional[int]:
    from .topology import usable_cpus
    return usable_cpus() or os.cpu_count()


def _err(msg: str) -> None:
    sys.stderr.write(msg.rstrip("\n") + "\n")
    sys.stderr.flush()


def read_plan(source: str):
    """(Plan, None) or (None, one-line error); the same parsing and messages as every other command."""
    from planner.cli import UserError, read_plan as cli_read_plan
    try:
        return cli_read_plan(source), None
    except UserError as e:
        return None, str(e)


def probe_machine() -> MachineInfo:
    """torch version, visible GPUs and their smallest free memory (imports torch)."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    free = None
    if gpus:
        free = min(torch.cuda.mem_get_info(i)[0] for i in range(gpus))
    return MachineInfo(torch_version=torch.__version__, gpus=gpus, free_memory_bytes=free,
                       gpu_name=torch.cuda.get_device_name(0) if gpus else None, cpu_cores=cpu_cores(),
                       host_available_bytes=host_memory_available(),
                       capability=tuple(torch.cuda.get_device_capability(0)) if gpus else None)


def resolve_device(device: str, machine: MachineInfo, plan=None) -> tuple[str, Check]:
    if device == "auto":
        if machine.gpus:
            return "cuda", Check("device", True, f"auto -> cuda ({machine.gpus} x {machine.gpu_name})")
        return "cuda", Check("device", False, "auto -> cuda, but this machine has no CUDA GPU, so the plan cannot run on cuda here",
                             "add --device cpu to run the same layout on CPU processes (gloo), or run on a GPU machine")
    if device == "cuda" and not machine.gpus:
        return "cuda", Check("device", False, "cuda requested but no CUDA GPU is visible",
                             "use --device cpu (gloo), or check CUDA_VISIBLE_DEVICES and the driver")
    if device == "cpu":
        from parallel_layers.precision import cpu_math
        math = cpu_math(plan).replace(", no autocast", "") if plan is not None else "fp32 math"
        return "cpu", Check("device", True, f"cpu (gloo, {math}, OMP_NUM_THREADS=1 per rank)")
    return device, Check("device", True, f"cuda ({machine.gpus} x {machine.gpu_name})")


def check_world(plan, device: str, machine: MachineInfo, nnodes: int, nproc_per_node: Optional[int]) -> tuple[int, Check]:
    """Processes per node for the plan's world size, and whether this machine can host them."""
    p = plan.parallel
    world = p.world_size
    layout = f"tp({p.tp}) * pp({p.pp}) * dp({p.dp}) * cp({p.cp}) = {world}"
    if world % nnodes:
        return 0, Check("world size", False, f"{layout} ranks do not split evenly over {nnodes} nodes",
                        f"use --nnodes dividing {world}")
    nproc = nproc_per_node or world // nnodes
    if nproc * nnodes != world:
        return nproc, Check("world size", False, f"{layout} != nproc_per_node({nproc}) * nnodes({nnodes})",
                            f"use nproc_per_node {world // nnodes} or a plan with {nproc * nnodes} GPUs")
    if device == "cpu":
        cores = machine.cpu_cores
        shared = (f"; {nproc} ranks share this node's {cores} cores, so step times measure the host, "
                  "not the layout" if cores and nproc > cores else "")
        said = f"{layout} ranks as {nproc} CPU process{'es' if nproc > 1 else ''} x {nnodes} node(s){shared}"
        if cores and nproc > 4 * cores:
            # 64 ranks on 2 cores measured 25.8 s a step where the cpu-time check said 2.0 s (it counts FLOPs, not the
            # ranks' turns on the cores): a warning, the run is still the user's to make
            said = (f"warning: {said}; {nproc // cores} ranks a core: expect steps and start-up far slower than the cpu "
                    "time below, or run fewer ranks (a plan for fewer GPUs)")
        return nproc, Check("world size", True, said)
    if machine.gpus == 0:  # the device check already says so
        per_node = plan.hardware.gpus_per_node
        nodes = (f"; the plan's {per_node}-GPU nodes would run it with --nnodes {world // per_node}"
                 if nnodes == 1 and world > per_node and world % per_node == 0 else "")
        return nproc, Check("world size", True, f"{layout} needs {nproc} GPUs per node x {nnodes} node(s); this "
                            f"machine has none{nodes}", settled=False)
    if nproc > machine.gpus:
        return nproc, Check("world size", False,
                            f"{layout} needs {nproc} GPUs per node x {nnodes} node(s), this node has {machine.gpus}",
                            f"run with --nnodes {-(-world // max(machine.gpus, 1))} on nodes with {machine.gpus} GPUs, "
                            f"re-plan with `parplan recommend --gpus {machine.gpus * nnodes}`, or use --device cpu")
    return nproc, Check("world size", True, f"{layout} = {nproc} GPUs per node x {nnodes} node(s); {machine.gpus} visible")


def check_memory(plan, device: str, machine: MachineInfo, nproc: int = 1) -> Check:
    """Predicted bytes per GPU against the smallest GPU's free memory; on cpu, and for optimizer offload, what
    this node's ranks must hold against the host's available memory."""
    pred = plan.prediction
    if pred is None:
        return Check("memory", True, "skipped: the plan carries no prediction (run `parplan evaluate` to add one)")
    mem = pred.memory_bytes_per_gpu
    need = mem.total
    host = machine.host_available_bytes
    if nproc < 1:  # the world size check failed: no ranks per node to hold anything yet
        host = None
    if device == "cpu":
        # each CPU rank holds at least its weights, gradients, optimizer state and saved activations (the
        # prediction's "other" is CUDA context, NCCL buffers and fragmentation, which a gloo rank has not; its
        # fp32 math can need up to twice a 16-bit plan's activations)
        state = mem.weights + mem.grads + mem.optimizer + mem.activations + mem.offloaded
        if host is not None and state * nproc > host:
            return Check("memory", False, f"{nproc} CPU ranks hold at least {state * nproc / 1e9:.1f} GB (predicted "
                         f"weights, gradients, optimizer state and activations, {state / 1e9:.2f} GB each) > "
                         f"{host / 1e9:.1f} GB available on this host",
                         "run it on its GPUs, or try the layout on CPU with a smaller model (--layers/--hidden) or "
                         "seq_len", exit_code=EXIT_DOES_NOT_FIT)
        return Check("memory", True, f"skipped on cpu (predicted {need / 1e9:.2f} GB per GPU is for {plan.hardware.name})"
                     + (f"; {nproc} ranks' state {state * nproc / 1e9:.2f} GB <= {host / 1e9:.1f} GB available on "
                        "the host" if host is not None else ""))
    if mem.offloaded and host is not None and mem.offloaded * nproc > host:
        return Check("memory", False, f"{nproc} ranks offload {mem.offloaded * nproc / 1e9:.1f} GB of optimizer state "
                     f"to the host > {host / 1e9:.1f} GB available", "re-plan without --offload, or with more nodes",
                     exit_code=EXIT_DOES_NOT_FIT)
    if machine.free_memory_bytes is None:
        if not pred.fits and (pred.reason or "").split(":", 1)[0] in MACHINE_REASONS:
            # no GPU here to measure, but the plan's own prediction says its GPU cannot hold it
            return Check("memory", False, f"predicted {need / 1e9:.2f} GB per GPU does not fit {plan.hardware.name}: "
                         f"{pred.reason}", "re-plan with --zero 3, --recompute full or more pp/tp (parplan recommend)",
                         exit_code=EXIT_DOES_NOT_FIT)
        return Check("memory", True, f"predicted {need / 1e9:.2f} GB per GPU; free memory unknown (no GPU here)",
                     settled=False)
    free = machine.free_memory_bytes
    if need > free:
        return Check("memory", False, f"predicted {need / 1e9:.2f} GB per GPU > {free / 1e9:.2f} GB free on the smallest GPU",
                     "free the GPUs, or re-plan with --zero 3, --recompute full or more pp/tp (parplan recommend)",
                     exit_code=EXIT_DOES_NOT_FIT)
    return Check("memory", True, f"predicted {need / 1e9:.2f} GB per GPU <= {free / 1e9:.2f} GB free")


# GPU families as both torch.cuda.get_device_name and the profiles spell them; the H100's and A100's PCIe cards
# ("NVIDIA H100 PCIe", h100-pcie-80gb; "NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-40GB", a100-pcie-80gb) apart from
# their SXM parts: another node (and the H100's another peak); so the PCIe cards of the export-market H800 and A800
# ("NVIDIA H800 PCIe", "NVIDIA A800 80GB PCIe") from the SXM parts h800-sxm-80gb and a800-sxm-80gb describe.  The
# H100 NVL ("NVIDIA H100 NVL", h100-nvl-94gb: bridged pairs, 835.5 TFLOP/s) is a family of its own; the GH200
# ("NVIDIA GH200 480GB", gh200-96gb) too (the lookbehind keeps H200 from matching inside it), and the HBM3e parts
# apart from their 96 GB HBM3 siblings, each another memory system and its own profile: the H20-3e ("NVIDIA H20-3e",
# h20-3e-141gb) from the H20 ("NVIDIA H20", h20-96gb), the 144 GB GH200 ("NVIDIA GH200 144G HBM3e", gh200-144gb,
# whose profile name's "B" after 144G the pattern reads past) from the 96 GB one.
GPU_FAMILY = re.compile(r"(?i)(?<![a-z0-9])(GB300|B300|GB200|B200|B100|GH200[ -]144G|GH200|H200|H100[ -]PCIE|"
                        r"H100[ -]NVL|H100|H800[ -]PCIE|H800|H20[ -]3E|H20|A100(?:[ -]80GB)?[ -]PCIE|A100|"
                        r"A800(?:[ -][48]0GB)?[ -]PCIE|A800|A10G|L40S|L40|L4|V100|MI355X|MI325X|MI300X|MI250X|MI250)"
                        r"(?:(?<=144G)B)?(?![a-z0-9])")


def gpu_family(text: Optional[str]) -> Optional[str]:
    m = GPU_FAMILY.search(text or "")
    return re.sub(r" [48]0GB", "", m.group(1).upper().replace("-", " ")) if m else None


def profile_family(prof) -> Optional[str]:
    """The GPU family a hardware profile describes: the device it was calibrated on where its description says so
    (hardware_profiles.calibrated_on: an H100 PCIe calibrated from the SXM part's profile keeps that profile's name),
    else the one its name, else its description, names."""
    from hardware_profiles import calibrated_on
    return gpu_family(calibrated_on(prof)) or gpu_family(prof.name) or gpu_family(prof.description)


def cpu_matmul_rate(n: int = 512, repeats: int = 8, fp8: bool = False) -> float:
    """FLOP/s of one thread of this CPU on an fp32 n x n x n matmul (the best of `repeats` after one warm-up), as a
    rank of a cpu launch runs them (OMP_NUM_THREADS=1, fp32 math).  About 0.1 s.  fp8: torch._scaled_mm of E4M3
    operands instead (an FP8 plan's linears on a cpu launch: torch's reference kernel, about 0.1 GFLOP/s on this
    repository's machines; call it with a small n)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        if fp8:
            a, b, one = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t(), torch.ones(())
            mm = lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.float32)  # noqa: E731
        else:
            mm = lambda: torch.mm(a, b)  # noqa: E731
        mm()
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            mm()
            best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return 2 * n ** 3 / best


def fp8_linear_share(plan) -> float:
    """The share of a step's model FLOPs in the blocks' FP8 linears (qkv, projection, MLP), 0 for a 16-bit plan."""
    if not plan.training.fp8:
        return 0.0
    from cost_models.compute import layer_gemms
    from cost_models.layout import ModelDims
    from cost_models.params import spec_model_flops_per_token

    m = ModelDims.from_spec(plan.model, plan.training.seq_len)
    per_token = 3 * sum(flops for _, flops in layer_gemms(m, 1, 1)) * m.layers  # forward + the two backward GEMMs
    return min(1.0, per_token / spec_model_flops_per_token(plan.model, plan.training.seq_len))


CPU_RUN_WARN_S = 600  # a launch past ten minutes on a CPU is rarely the quick check it was meant to be


def check_cpu_time(plan, steps: int, nproc: int, machine: MachineInfo, rate: Optional[float] = None,
                   fp8_rate: Optional[float] = None) -> Check:
    """How long a cpu launch will take, at least: the step's matmul FLOPs (the model's FLOPs per token x the
    prediction's HFU/MFU for recomputation, x the step's tokens; on several nodes, this node's ranks' share) over
    this CPU's one-thread matmul rate, measured here, times the cores the ranks share; an FP8 plan's linears at the
    rate of torch's FP8 reference kernel, measured too.  A lower bound: the rest of a step (attention's softmax,
    elementwise work, gloo's collectives) comes on top.  A warning, never a failure, past CPU_RUN_WARN_S."""
    from cost_models.params import spec_model_flops_per_token

    tr = plan.training
    per_token = spec_model_flops_per_token(plan.model, tr.seq_len)
    pr = plan.prediction
    if pr is not None and pr.mfu > 0:
        per_token *= pr.hfu / pr.mfu  # recomputation repeats forward work
    # this node's ranks (nproc of the world's) do their share of the step
    flops = per_token * tr.seq_len * tr.global_batch_size * nproc / max(plan.parallel.world_size, 1)
    rate = cpu_matmul_rate() if rate is None else rate
    cores = max(1, min(nproc, machine.cpu_cores or 1))
    share = fp8_linear_share(plan)
    if share:
        fp8_rate = cpu_matmul_rate(128, 2, fp8=True) if fp8_rate is None else fp8_rate
    step_s = flops * ((1 - share) / rate + (share / fp8_rate if share else 0.0)) / cores
    total_s = step_s * steps
    fp8 = (f", the {share:.0%} in FP8 GEMMs at {fp8_rate / 1e9:.2g} GFLOP/s, torch's reference kernel" if share
           else "")
    detail = (f"at least {_duration(step_s)} a step here ({flops:.3g} FLOP a step on this node at "
              f"{rate / 1e9:.1f} GFLOP/s a core measured{fp8}, {cores} core(s)), {_duration(total_s)} for {steps} steps")
    if total_s > CPU_RUN_WARN_S:
        return Check("cpu time", True, f"warning: {detail}; for a quick check on a CPU plan a smaller step "
                     f"(`parplan recommend ... --seq-len 256 --global-batch-size {2 * plan.parallel.dp}`) or run "
                     "fewer --steps")
    return Check("cpu time", True, detail)


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.3g} s"
    if s < 7200:
        return f"{s / 60:.3g} min"
    return f"{s / 3600:.3g} h"


def check_hardware(plan, device: str, machine: MachineInfo) -> Check:
    """The plan's hardware profile: loadable here (the runtime takes the MFU's peak from it) and the GPU it
    describes the one this node has (else the report compares a run with another GPU's prediction)."""
    name = plan.hardware.name
    if device != "cuda":
        return Check("hardware", True, f"profile {name} (not used on {device})")
    if not machine.gpus:
        return Check("hardware", True, f"profile {name}; no GPU here to compare it with", settled=False)
    from .core import PlannerError, load_hardware
    try:
        prof = load_hardware(name)
    except PlannerError as e:
        return Check("hardware", True, f"warning: profile {name} does not load here ({e}), so the report's MFU will "
                     "be null; re-plan with --hardware NAME|PATH of a profile on this machine")
    want = profile_family(prof)
    have = gpu_family(machine.gpu_name)
    if want and have and want != have:
        return Check("hardware", True, f"warning: the plan was predicted for {prof.name} ({want}) and this node has "
                     f"{machine.gpu_name}, so the report compares the run with another GPU's prediction; re-plan with "
                     f"--hardware for a {have} profile (`parplan hardware list`, or `parplan calibrate`)")
    return Check("hardware", True, f"profile {prof.name}" + (f" ({want})" if want else "") + f" on {machine.gpu_name}")


DATA_SAMPLE_TOKENS = 1 << 20  # token ids read for the range check (the file's first MiB-count of tokens)


def check_data(path: str, plan, data_dtype: Optional[str] = None) -> Check:
    """A flat token file as the runtime reads it (parallel_layers.data.TokenSource: data_dtype, by default
    uint16 when the vocabulary fits 16 bits, else uint32): a whole number of tokens, at least seq_len + 2 of
    them, and ids below the vocabulary in its first DATA_SAMPLE_TOKENS (a file of the other width reads as ids
    out of range or as every other token 0)."""
    import numpy as np
    vocab, seq = plan.model.vocab, plan.training.seq_len
    if plan.training.document_length:  # (parallel_layers.window: fixed-length documents, not the file's own)
        return Check("data", False, f"training.document_length {plan.training.document_length} with --data: the "
                     "runtime masks fixed-length documents of synthetic tokens, not the file's own documents",
                     "drop --data (synthetic tokens), or document_length to train the file's sequences whole")
    dtype = np.dtype(data_dtype or ("uint16" if vocab <= 2**16 else "uint32"))
    size = Path(path).stat().st_size
    other = "uint32" if dtype.name == "uint16" else "uint16"
    fix = (f"pass --data-dtype {other} if the file holds {other} tokens, or write them as flat {dtype.name}"
           + ("" if data_dtype else f" (the runtime's width for vocab {vocab})"))
    if size % dtype.itemsize:
        return Check("data", False, f"{path} is {size} bytes, not a whole number of {dtype.name} tokens", fix)
    n = size // dtype.itemsize
    if n < seq + 2:
        return Check("data", False, f"{path} holds {n} {dtype.name} tokens, need at least seq_len + 2 = {seq + 2}",
                     "pass a longer token file, or a shorter seq_len")
    head = np.fromfile(path, dtype=dtype, count=min(n, DATA_SAMPLE_TOKENS))
    top = int(head.max())
    if top >= vocab:
        return Check("data", False, f"{path}: token id {top} in its first {len(head):,} {dtype.name} tokens is >= "
                     f"vocab {vocab}", fix + ", or plan with the tokenizer's vocabulary")
    return Check("data", True, f"{path}: {n:,} {dtype.name} tokens, ids in range in the first {len(head):,}")


def _checkpoint_shapes(path: str) -> Optional[dict[str, tuple[int, ...]]]:
    """{DCP key after "model.": size} of a checkpoint's parameters, from its metadata; None when it cannot be
    read.  Imports torch, as launch does already."""
    try:
        import torch.distributed.checkpoint as dcp
        md = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    except Exception:  # an unreadable or foreign folder: the run's own load says more
        return None
    return {k[len("model."):]: tuple(int(n) for n in getattr(v, "size", ()) or ())
            for k, v in md.items() if k.startswith("model.")}


def checkpoint_vocab(path: str) -> Optional[int]:
    """The logical vocabulary a checkpoint recorded (parallel_layers.checkpoint: "meta.vocab", since 2026-12-02), or
    None where it has none or cannot be read."""
    try:
        import warnings

        import torch
        import torch.distributed.checkpoint as dcp
        if "meta.vocab" not in dcp.FileSystemReader(path).read_metadata().state_dict_metadata:
            return None
        sd = {"meta": {"vocab": torch.tensor(0)}}
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(sd, checkpoint_id=path)
        return int(sd["meta"]["vocab"])
    except Exception:  # an unreadable or foreign folder: the run's own load says more
        return None


def checkpoint_model_shape(path: str) -> Optional[tuple[int, int]]:
    """(layers, hidden) of the model a checkpoint holds, from DCP's metadata (its keys "model.layers.<i>...." and
    the final norm's size); None when it cannot be read."""
    return _model_shape(_checkpoint_shapes(path))


def _model_shape(md: Optional[dict]) -> Optional[tuple[int, int]]:
    if md is None:
        return None
    idx = [int(m.group(1)) for k in md if (m := re.match(r"layers\.(\d+)\.", k))]
    norm = md.get("final_norm.weight")
    if not idx or not norm:
        return None
    return max(idx) + 1, int(norm[0])


def plan_parameter_shapes(plan) -> dict[str, tuple[tuple[int, ...], Optional[int]]]:
    """{logical name: (full shape, tensor-parallel dimension)} of the plan's model, as the runtime builds it
    (parallel_layers.model, on the meta device: no memory, whatever the size)."""
    import torch

    from parallel_layers.model import ModelConfig, StageModule, iter_shard_specs
    cfg = ModelConfig.from_plan(plan)
    with torch.device("meta"):
        whole = StageModule(cfg, list(range(cfg.layers)), first=True, last=True, tp_group=None)
    return {spec.logical_name: (spec.full_shape, spec.tp_dim) for _, _, spec in iter_shard_specs(whole)}


def checkpoint_model_mismatch(path: str, plan) -> Optional[str]:
    """What differs between the model a checkpoint holds and the plan's, parameter by parameter (names and
    sizes, a TP shard's size scaled back by its tp), or None when they agree or the checkpoint cannot be
    read.  Tied embeddings, kv heads, the MLP width, the vocabulary and learned positions show here: a
    plan differing in them had failed inside every rank, or (tied against untied) loaded without the head."""
    return _model_mismatch(_checkpoint_shapes(path), plan)


def _model_mismatch(md: Optional[dict], plan) -> Optional[str]:
    from parallel_layers.layers import padded_size
    if not md:
        return None
    want = plan_parameter_shapes(plan)
    have: dict[str, tuple[int, ...]] = {}
    per_expert: dict[str, set] = {}  # a mixture of experts' weights keyed one per expert ("@expert{g}"): stacked back
    for key, size in md.items():
        name, _, g = key.partition("@expert")
        if g.isdigit() and name in want:
            per_expert.setdefault(name, set()).add(int(g))
            have[name] = (len(per_expert[name]), *size)
            continue
        name, _, experts = key.partition("@ep")  # a mixture of experts' weights: an ep rank's E / ep experts
        m = re.fullmatch(r"\d+of(\d+)", experts)
        if m and name in want:
            size = (size[0] * int(m.group(1)), *size[1:])
            key = name
        name, _, shard = key.partition("@tp")
        if "/" in name:  # not a parameter (optimizer states live under "optim.")
            continue
        m = re.fullmatch(r"\d+of(\d+)", shard)
        if m and name in want and want[name][1] is not None and len(size) > want[name][1]:
            t, d = int(m.group(1)), want[name][1]
            full = list(want[name][0])
            if size[d] * t == padded_size(full[d], t):  # the padded vocabulary's rows count as the logical ones
                size = tuple(full[d] if i == d else n for i, n in enumerate(size))
            else:
                size = tuple(n * t if i == d else n for i, n in enumerate(size))
        have[name] = size
    tied = plan.model.tied_embeddings
    if "head.weight" in have and tied:
        return "the checkpoint has an output head of its own (untied embeddings) and the plan ties it to the embedding"
    if "head.weight" in want and "head.weight" not in have and "embedding.weight" in have:
        return "the checkpoint ties the output head to the embedding and the plan has a head of its own"
    for name in sorted(set(want) | set(have), key=lambda n: (n not in want, n)):
        if name not in have:
            return f"the checkpoint has no {name} and the plan's model does"
        if name not in want:
            return f"the checkpoint has {name} and the plan's model does not"
        if tuple(want[name][0]) != have[name]:
            return (f"{name} is {'x'.join(map(str, have[name]))} in the checkpoint and "
                    f"{'x'.join(map(str, want[name][0]))} in the plan")
    return None


def check_resume(checkpoint_dir: str, resume_step: Optional[int], steps: int, tp: Optional[int] = None,
                 plan=None) -> Check:
    """The step to resume from exists and leaves steps to run, and (with the plan) holds the plan's model.  A
    checkpoint resumes with another tp, dp, pp, cp or ZeRO stage (its TP shards saved as pieces of the logical
    tensors, parallel_layers.checkpoint); one written before that, its TP shards keyed by tp rank, only with the tp
    it was saved with (checkpoint_steps.saved_tp), which had failed on every rank with a missing key."""
    have = saved_steps(checkpoint_dir)
    if resume_step is not None and resume_step not in have:
        return Check("checkpoint", False, f"no complete checkpoint of step {resume_step} under {checkpoint_dir}",
                     f"pass --resume-step one of {have}" if have else "pass the --checkpoint-dir an earlier run wrote")
    if not have:
        return Check("checkpoint", True, f"no checkpoint under {checkpoint_dir} yet: the run starts from step 0")
    start = resume_step if resume_step is not None else have[-1]
    if start >= steps:
        return Check("checkpoint", False, f"the checkpoint is after step {start} and --steps is {steps}: nothing to run",
                     f"pass --steps greater than {start} (the step count to reach, not the steps to add)")
    was = saved_tp(step_path(checkpoint_dir, start)) if tp is not None else None
    if was is not None and was != tp:  # its TP shards keyed by tp rank (written before tp-independent keys)
        return Check("checkpoint", False, f"the checkpoint of step {start} was saved with tp={was} and the plan has "
                     f"tp={tp}: its tensor-parallel shards are keyed by tp rank (written before tp-independent keys) "
                     "and do not load into another tp",
                     f"resume with a tp={was} plan (dp, pp, cp and the ZeRO stage may differ), or start afresh "
                     "without --resume")
    ep = plan.parallel.ep if plan is not None and plan.model.is_moe else None
    was = saved_ep(step_path(checkpoint_dir, start)) if ep is not None else None
    if was is not None and was != ep:  # a mixture of experts' checkpoint keyed by ep rank (before per-expert keys)
        return Check("checkpoint", False, f"the checkpoint of step {start} was saved with ep={was} and the plan has "
                     f"ep={ep}: an expert-parallel rank's experts do not load into another ep",
                     f"resume with an ep={was} plan (tp as saved; dp, pp, cp and the ZeRO stage may differ), or start "
                     "afresh without --resume")
    if plan is not None:
        fix = "resume with a plan of the model it was saved with (any layout), or start afresh without --resume"
        model, md = plan.model, _checkpoint_shapes(step_path(checkpoint_dir, start))  # read once for both checks
        shape = _model_shape(md)
        if shape is not None and shape != (model.layers, model.hidden):
            # fewer layers in the plan had loaded the first ones silently; more failed on rank 0 with no cause
            return Check("checkpoint", False, f"the checkpoint of step {start} holds a model of {shape[0]} layers, "
                         f"hidden {shape[1]}, and the plan's has {model.layers} layers, hidden {model.hidden}", fix)
        other = _model_mismatch(md, plan)
        vocab = checkpoint_vocab(step_path(checkpoint_dir, start)) if not other else None
        if vocab is not None and vocab != model.vocab:
            # the padded rows agree, so the shapes cannot tell them apart (vocab 254 and 256 at tp 4)
            other = f"a vocabulary of {vocab} tokens, and the plan's has {model.vocab} (both pad to the same rows)"
        if other:
            return Check("checkpoint", False, f"the checkpoint of step {start} holds another model: {other}", fix)
    return Check("checkpoint", True, f"resumes after step {start} of {checkpoint_dir}, runs steps {start + 1}..{steps}")


def as_parplans(plan):
    """The plan as parplan's runtime, which launch runs, whatever framework the plan was predicted for."""
    return plan.model_copy(update={"training": plan.training.model_copy(update={"framework": "parplan"})})


def _unpredicted(e) -> Check:
    return Check("prediction", True, f"the plan's own (cannot re-predict it here: {e})", settled=False)


def repredict(plan):
    """The plan's prediction made again from the plan itself (planner.core.evaluate_plan: numpy, no torch), so
    a report never compares a run with the prediction of a layout the plan no longer has (a hand-edited
    micro-batch, say), nor has nothing to compare with.  Returns (plan to run, check)."""
    from .core import PlannerError, StructureError, evaluate_plan, prediction_differs
    try:
        fresh = evaluate_plan(plan)
    except StructureError as e:
        # launch runs parplan's runtime whatever framework the plan names (check_rules): a layout that framework
        # refuses (DeepSpeed's pipeline with ZeRO-3) but parplan's runtime runs is predicted as parplan's
        if plan.training.framework == "parplan":
            return plan, Check("plan", False, e.problem, e.fix)
        try:
            fresh = evaluate_plan(as_parplans(plan))
        except StructureError as e2:  # a layout parplan's runtime does not run either: nothing to launch
            return plan, Check("plan", False, e2.problem, e2.fix)
        except PlannerError as e2:
            return plan, _unpredicted(e2)
        return fresh, Check("prediction", True, f"warning: {e.problem}, but parplan's runtime, which launch runs, "
                            f"does: predicted as parplan's, {fresh.prediction.step_time_s:.4g} s a step, "
                            f"{fresh.prediction.memory_bytes_per_gpu.total / 1e9:.2f} GB per GPU")
    except PlannerError as e:  # a profile this machine lacks: the plan's own prediction stands, unchecked
        return plan, _unpredicted(e)
    new = fresh.prediction
    if plan.prediction is None:
        return fresh, Check("prediction", True, f"the plan carried none: predicted here, {new.step_time_s:.4g} s a "
                            f"step, {new.memory_bytes_per_gpu.total / 1e9:.2f} GB per GPU on {plan.hardware.name}")
    old = plan.prediction
    if prediction_differs(old, new):
        return fresh, Check("prediction", True, f"warning: the plan's prediction ({old.step_time_s:.4g} s, "
                            f"{old.memory_bytes_per_gpu.total / 1e9:.2f} GB per GPU) is not its layout's "
                            f"({new.step_time_s:.4g} s, {new.memory_bytes_per_gpu.total / 1e9:.2f} GB): edited after "
                            "it was predicted, or predicted by another parplan version; the run is compared with "
                            "the layout's (`parplan evaluate` prints it)")
    return plan, Check("prediction", True, f"{old.step_time_s:.4g} s a step, {old.memory_bytes_per_gpu.total / 1e9:.2f} "
                       "GB per GPU (re-predicted: the same)")


# reasons a plan does not fit that depend on the machine: check_memory tests them against the one that runs it
MACHINE_REASONS = ("memory", "host-memory")


def check_split(plan) -> Check | None:
    """A line where the plan's stage_layers, which the runtime trains (parallel_layers.pipeline), is not the default
    split: the prediction (planner.core.evaluate_plan, the memory check's included) is the plan's own split's."""
    own = own_stage_layers(plan)
    if own is None:
        return None
    from .render import compact_counts
    return Check("split", True, f"stage_layers {compact_counts(own)} (the default split is "
                 f"{compact_counts(default_stage_layers(plan))}): the run trains it, and the prediction, memory check "
                 "included, is its own")


def check_rules(plan) -> Check | None:
    """A failing check when the plan breaks a layout rule of the runtime that launch runs (parplan's, whatever
    framework the plan was predicted for; `Prediction.reason`'s code is not a memory one, which check_memory tests
    against this machine): a zero-bubble schedule whose weight pass would re-run an op-level checkpoint refuses its
    second backward on every rank.  None when it keeps them, or when it cannot be predicted here (repredict says so)."""
    from .core import PlannerError, evaluate_plan, reason_fix
    ours = as_parplans(plan)
    try:
        pred = evaluate_plan(ours).prediction
    except PlannerError:
        # the plan's profile does not load here (check_hardware warns): the rules do not depend on the GPU, so any
        # shipped profile tells them (a memory reason it gives is not acted on)
        try:
            pred = evaluate_plan(ours.model_copy(update={"hardware": ours.hardware.model_copy(
                update={"name": "h100-sxm-80gb"})})).prediction
        except PlannerError:
            return None
    if pred is None or pred.fits or not pred.reason:
        return None
    if pred.reason.split(":", 1)[0] in MACHINE_REASONS:
        return None
    return Check("plan", False, f"breaks a layout rule of parplan's runtime: {pred.reason}",
                 reason_fix(pred.reason) or "write the plan again with `parplan recommend ... --json`")


def nearest_existing(path: Path) -> Path | None:
    """The path itself or its nearest parent that exists: what mkdir would build on (one in a folder the user may not
    enter is taken as missing: that folder is the nearest, and the write checks find it closed)."""
    def exists(q: Path) -> bool:
        try:
            return q.exists()
        except PermissionError:
            return False
    return next((q for q in (path, *path.parents) if exists(q)), None)


def check_folder(option: str, path: str) -> Check | None:
    """A folder the run writes into (--checkpoint-dir, --memory-snapshot): it may exist as a folder or not
    yet exist, but neither it nor a parent on its path may be a file (the job would fail after training)."""
    nearest = nearest_existing(Path(path).absolute())
    if nearest is not None and not nearest.is_dir():
        return Check(option[2:], False, f"{option} {path}: {nearest} is a file, not a folder",
                     f"pass {option} a folder path (it is created if missing)")
    if nearest is not None and not can_make_folder_in(nearest):  # the job would train, then fail at its first save
        return Check(option[2:], False, f"{option} {path}: cannot write in {nearest}",
                     f"pass {option} a folder you can write (it is created if missing)")
    return None


def _torch_older_than(version: Optional[str], major_minor: tuple[int, int]) -> bool:
    """Whether a torch version string ("2.7.1+cu126") is older than (major, minor); False when unreadable."""
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return bool(m) and (int(m.group(1)), int(m.group(2))) < major_minor


def fp8_gemm_dims(plan) -> dict[str, int]:
    """The sizes an FP8 plan's GEMMs take on one tensor-parallel rank (parallel_layers.fp8.gemm_dims_problem)."""
    from cost_models.layout import ModelDims
    p, t = plan.parallel, plan.training
    m = ModelDims.from_spec(plan.model, t.seq_len)
    return {"hidden": m.hidden, "q width / tp": m.q_width // p.tp, "kv width / tp": m.kv_width // p.tp,
            "ffn_hidden / tp": m.ffn // p.tp, "tokens per micro-batch": t.micro_batch_size * t.seq_len // max(p.cp, 1)}


def check_fp8(plan, device: str, machine: MachineInfo) -> Check:
    """An FP8 plan (training.fp8): GPUs with FP8 tensor cores (compute capability 8.9 and up), sizes cuBLASLt's FP8
    GEMM takes, and the prediction's scheme (parplan's runtime runs torchao's tensor-wise recipe: a plan made for
    another framework is predicted with that framework's casts and memory)."""
    from parallel_layers.fp8 import gemm_dims_problem
    t = plan.training
    if device == "cuda" and machine.capability is not None and tuple(machine.capability) < (8, 9):
        cap = ".".join(map(str, machine.capability))
        return Check("fp8", False, f"the plan's linears are FP8 and {machine.gpu_name} (compute capability {cap}) has no "
                     "FP8 tensor cores", "launch it on an Ada, Hopper or Blackwell GPU (8.9 and up), or re-plan "
                     "without --fp8")
    problem = gemm_dims_problem(fp8_gemm_dims(plan)) if device == "cuda" else None
    if problem:
        what, fix = problem.split("; ", 1)
        return Check("fp8", False, what, fix)
    said = ("linears in FP8 (torch._scaled_mm, tensor-wise scales" +
            (": a slow reference kernel on cpu)" if device == "cpu" else ")"))
    if t.framework != "parplan":
        return Check("fp8", True, f"warning: {said}; the prediction counts {t.framework}'s FP8 casts and memory, not "
                     "the runtime's; re-plan with --framework parplan to compare like with like")
    if device == "cuda":
        from planner.accuracy import FP8_MEASURED
        return Check("fp8", True, f"warning: {said}; {FP8_MEASURED}: expect this run far slower than its prediction")
    return Check("fp8", True, said)


def check_moe_on_gpu(plan, device: str) -> Optional[Check]:
    """A warning for a mixture of experts planned for parplan's runtime on CUDA under a profile without the eager MoE
    block's dispatch (host_moe_block_s, which `parplan calibrate` measures since 2026-12-06): what its one GPU run
    measured, the dispatch such a prediction does not count; None otherwise."""
    if not (plan.model.is_moe and device == "cuda" and plan.training.framework == "parplan"):
        return None
    try:
        from hardware_profiles import load_profile
        if load_profile(plan.hardware.name).host_moe_block_s:
            return None
    except Exception:  # noqa: BLE001 -- a profile that does not load is launch's hardware check's to report
        pass
    from planner.accuracy import MOE_MEASURED
    return Check("moe", True, f"warning: {MOE_MEASURED}: expect this run slower than its prediction (a profile from "
                 "`parplan calibrate` on this machine counts it)")


def step_without_bridges(plan) -> Optional[float]:
    """core.step_without_bridges under the plan's own profile; None where it cannot be predicted here."""
    from .core import PlannerError, plan_hardware, step_without_bridges as without
    try:
        return without(plan, plan_hardware(plan))
    except PlannerError:
        return None


def check_bridges(plan, device: str, nproc: int, topo_reader=None, env: Optional[dict] = None) -> Optional[Check]:
    """Where the plan prices pairs of ranks (2i, 2i + 1) at its profile's NVLink bridges (step_without_bridges): are
    this node's GPUs of those ranks the NVLinked ones, by `nvidia-smi topo -m` (planner.topology)?  A warning with
    the step predicted without the bridges where a pair is not, and a device order that makes every pair a bridged
    one where the node has one; None where the plan does not rely on bridges.  topo_reader: () -> (Topology, why)."""
    if device != "cuda" or nproc < 2:
        return None
    bare = step_without_bridges(plan)
    if bare is None:
        return None
    from . import topology
    step = plan.prediction.step_time_s
    relies = (f"the plan prices each pair of ranks (2i, 2i + 1) at {plan.hardware.name}'s NVLink bridges "
              f"({step:.4g} s a step; {bare:.4g} s over PCIe alone)")
    job_env = os.environ if env is None else env
    if job_env.get("NCCL_P2P_DISABLE", "").strip() == "1" or job_env.get("NCCL_P2P_LEVEL", "").strip() in ("LOC", "0"):
        return Check("bridges", True, f"warning: {relies}, and this environment turns NCCL's peer-to-peer transport "
                     f"off (NCCL_P2P_DISABLE=1 or NCCL_P2P_LEVEL=LOC), so no collective uses the bridges: expect a "
                     f"step nearer {bare:.4g} s; fix: unset it, or {topology.no_bridges_fix(plan.hardware.name)}")
    topo, why = (topo_reader or topology.read_topology)()
    if topo is None:
        return Check("bridges", True, f"{relies}; which GPUs are bridged is unchecked here: {why}", settled=False)
    devices, why = topology.visible_gpus(topo, env)
    if devices is None or len(devices) < nproc:
        return Check("bridges", True, f"{relies}; which GPUs are bridged is unchecked here: "
                     f"{why or f'{len(devices or [])} GPUs visible for {nproc} ranks'}", settled=False)
    visible, devices = devices, devices[:nproc]
    missing = topology.unbridged_pairs(topo, devices)
    if not missing:
        return Check("bridges", True, "ranks (2i, 2i + 1) on NVLinked GPUs " + ", ".join(
            f"{a}-{b} ({topo.link(a, b)})" for a, b in zip(devices[::2], devices[1::2])) + ", as the plan prices them")
    said = ", ".join(f"GPU{a}-GPU{b} ({topo.link(a, b)})" for a, b in missing)
    # the visible GPUs first (CUDA_VISIBLE_DEVICES may keep others for other jobs), else any of the node's
    order = topology.bridged_order(topo, visible, nproc) or topology.bridged_order(topo, list(topo.gpus), nproc)
    fix = (f"run with CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={','.join(map(str, order))} (every pair of "
           "ranks on a bridged pair)" if order else
           f"{topology.no_bridges_fix(plan.hardware.name)}: this node's GPUs have no such pairs")
    return Check("bridges", True, f"warning: {relies}, and nvidia-smi topo -m shows {said} not NVLinked: expect a step "
                 f"nearer {bare:.4g} s; fix: {fix}")


def check_network(plan, device: str, nnodes: int, nproc: int, sys_root: str = "/sys") -> Optional[Check]:
    """A job across nodes: this node's NICs (planner.topology.node_network: the active RDMA ports, else the Ethernet
    interfaces NCCL's sockets would use) against the inter-node rate a GPU its plan was predicted at (the profile's, or
    --inter-node-bandwidth).  Fewer than the plan assumes: a warning with the step re-predicted at this node's line
    rate a rank and the flag that plans for it.  More (storage NICs count too) or none readable: a line.  None for
    one node."""
    if device != "cuda" or nnodes < 2:
        return None
    from . import topology
    from .core import PlannerError, evaluate_plan, plan_hardware
    try:
        prof = plan_hardware(plan)
    except PlannerError:
        return None
    rate = plan.hardware.inter_node_gbytes_per_s or prof.inter_node.gbytes_per_s
    ports = topology.node_network(sys_root)
    if not ports:
        return Check("network", True, f"the plan's {rate:g} GB/s a GPU across nodes is unchecked here: no active RDMA "
                     "port or Ethernet speed under /sys/class", settled=False)
    node_gbits, here = topology.nic_rate(ports, nproc)
    said = (f"{topology.describe_ports(ports)} active on this node, {node_gbits:g} Gb/s: {here:.3g} GB/s a GPU for "
            f"{nproc} ranks")
    if here >= topology.NIC_SHORTFALL * rate:
        return Check("network", True, f"{said}, the plan {rate:g}")
    step = plan.prediction.step_time_s if plan.prediction else None
    try:
        slower = evaluate_plan(plan.model_copy(update={"hardware": plan.hardware.model_copy(
            update={"inter_node_gbytes_per_s": here})}), prof).prediction.step_time_s
    except PlannerError:
        slower = None
    sockets = ports[0].kind == "TCP"
    expect = (f": expect a step nearer {slower:.4g} s than {step:.4g} s" if step and slower and slower > step * 1.001
              else "")
    return Check("network", True, f"warning: {said}, where the plan was predicted at {rate:g} GB/s a GPU across "
                 f"nodes{expect}" + ("; no RDMA device NCCL would use (/sys/class/infiniband, NCCL_IB_HCA, "
                                     "NCCL_IB_DISABLE), so it runs over TCP sockets unless a network plugin carries it, "
                                     "slower than this line rate" if sockets else "")
                 + f"; fix: re-plan with --inter-node-bandwidth {here:.3g}")


def check_runtime_support(plan, device: str, torch_version: Optional[str] = None) -> Check:
    """What parallel_layers does not run (yet), caught before any rank starts."""
    from .core import TORCH_PIPELINING
    p, t = plan.parallel, plan.training
    missing = []
    m = plan.model
    if m.is_moe:  # parallel_layers.moe: what the runtime's MoE layer does not run yet
        from .core import parplan_moe_problem
        problem = parplan_moe_problem(p.zero_stage, t.moe_dispatcher, t.moe_recompute, t.fp8, p.recompute, plan=True,
                                      dp_replicate=p.dp_replicate)
        if problem:
            missing.append(problem)
    if p.dp_replicate > 1 and p.zero_stage != 3:  # its hybrid sharding is FSDP2's (parallel_layers.mesh.fsdp_mesh)
        missing.append((f"dp_replicate {p.dp_replicate} with zero_stage {p.zero_stage} (Megatron-LM's distributed "
                        "optimizer in instances): the runtime shards ZeRO-1/2 over every dp rank",
                        "set dp_replicate 1 to launch it (the states sharded over all dp ranks), or zero_stage 3 "
                        "(FSDP2's hybrid sharding)"))
    if m.parallel_block:  # parallel_layers.model.Block._parallel_forward
        from .core import parplan_parallel_block_problem
        problem = parplan_parallel_block_problem(p.recompute, t.dropout, plan=True)
        if problem:
            missing.append(problem)
    if m.kv_lora_rank is not None:  # parallel_layers.model.MLAttention: what the runtime's MLA does not run yet
        from .core import parplan_mla_problem
        problem = parplan_mla_problem(p.cp, t.fp8, t.mla_recompute, plan=True,
                                      documents=bool(t.document_length and t.document_length < t.seq_len))
        if problem:
            missing.append(problem)
    # the runtime shards these evenly over the tensor-parallel group (parallel_layers.layers: a dimension
    # that does not divide raises on every rank); the vocabulary it pads to a multiple of tp, as Megatron does
    fixes = {"ffn_hidden": "use a ffn_hidden divisible by {tp} (e.g. {up}), or another tp",
             "heads": "use a tp that divides heads ({size})", "kv_heads": "use a tp that divides kv_heads ({size})"}
    for what, fix in fixes.items():
        size = getattr(m, what)
        if p.tp > 1 and size % p.tp:
            missing.append((f"{what} {size} split over tp={p.tp} (the runtime shards it evenly)",
                            fix.format(tp=p.tp, up=-(-size // p.tp) * p.tp, size=size)))
    if p.sp and p.tp > 1 and (t.seq_len // max(p.cp, 1)) % p.tp:
        missing.append((f"sequence parallelism with {t.seq_len // max(p.cp, 1)} tokens per rank over tp={p.tp}",
                        f"use a seq_len divisible by {p.tp * max(p.cp, 1)}"))
    if p.cp > 1 and t.seq_len % (2 * p.cp):
        missing.append((f"cp={p.cp} with seq_len {t.seq_len} (load-balanced context parallelism cuts the sequence "
                        f"into 2*cp = {2 * p.cp} chunks)", f"use a seq_len divisible by {2 * p.cp}, or another cp"))
    if p.pp > 1:
        # a pipeline rank with no block, embedding or head has nothing to train (its optimizer gets no parameters,
        # and the run fails on that rank); the search never makes one, a hand-edited pp or vpp can
        from cost_models.layout import stages_of_rank
        from .export import plan_stage_layers
        counts, last = plan_stage_layers(plan), p.pp * p.vpp - 1
        empty = [r for r in range(p.pp)
                 if not any(s in (0, last) or counts[s] for s in stages_of_rank(r, p.pp, p.vpp, p.schedule))]
        if empty:
            missing.append((f"pipeline rank(s) {empty} with no block, embedding or head ({m.layers} layers over "
                            f"pp={p.pp} x vpp={p.vpp} stages: {counts})", "use fewer pipeline stages than layers "
                            "(pp x vpp at most layers + 2, the ends holding the embedding and the head)"))
    rounds = max(1, t.num_microbatches // p.pp)
    if p.schedule in ("interleaved-1f1b", "interleaved-zb") and p.pp > 1 and not runs_in_rounds(p.pp, t.num_microbatches):
        fit = next(n for n in range(t.num_microbatches, 0, -1) if runs_in_rounds(p.pp, n))
        missing.append((f"{p.schedule} over pp={p.pp} with {t.num_microbatches} micro-batches (torch runs them in "
                        f"{rounds} rounds and needs a multiple of the rounds)",
                        f"use {fit} or {rounds * p.pp} micro-batches per replica, e.g. a multiple of pp"))
    if p.schedule == "1f1b" and p.pp > 1 and t.num_microbatches < p.pp:
        missing.append((f"1F1B over pp={p.pp} with {t.num_microbatches} micro-batch(es) (torch's Schedule1F1B needs at "
                        "least one per stage)", f"use a global batch of at least {p.pp} micro-batches per replica "
                        f"({p.pp * p.dp * t.micro_batch_size} sequences at this dp and micro-batch), a smaller "
                        "micro_batch_size, or schedule gpipe"))
    # FSDP2's CPUOffloadPolicy keeps the gradient shards on the host, and the runtime's SP, cp and tied-embedding
    # gradient sums would all-reduce those CPU tensors over NCCL, which has no CPU backend
    from .search import fsdp2_offload_blockers
    extra = fsdp2_offload_blockers(p.sp, p.tp, p.cp, m.tied_embeddings, p.pp)
    if device == "cuda" and p.zero_stage == 3 and p.offload == "optimizer" and extra:
        missing.append((f"FSDP2 optimizer offload with {' and '.join(extra)} on cuda (their gradient sums would "
                        "all-reduce host tensors over NCCL)", "drop offload, use ZeRO 1 or 2 with offload, or "
                        "launch without " + " and ".join(extra)))
    if m.has_learned_positions and m.max_seq_len is not None and m.max_seq_len < t.seq_len:
        missing.append((f"seq_len {t.seq_len} beyond the model's {m.max_seq_len} learned positions",
                        f"use a seq_len of at most {m.max_seq_len}, or a model with max_seq_len >= {t.seq_len}"))
    if not missing:
        warnings = []
        if p.zero_stage == 3 and p.pp > 1 and p.dp > 1 and t.framework not in TORCH_PIPELINING:
            warnings.append("with a pipeline, torch.distributed.pipelining keeps FSDP2 parameters and gradients "
                            "unsharded until the step ends, which this plan's prediction (for "
                            f"{t.framework}) does not count; re-plan with --framework parplan")
        if p.zero_stage == 3 and p.offload != "none":
            warnings.append("FSDP2's CPUOffloadPolicy also keeps the weight and gradient shards on the host; "
                            "predicted memory keeps them on the GPU")
        if p.zero_stage == 2 and p.dp > 1 and t.zero2_grad_reduce == "per-micro-batch":
            warnings.append("the runtime's ZeRO-2 holds full gradients through the backward and reduces them once per "
                            "step; the prediction assumes them sharded per micro-batch (zero2_grad_reduce per-step "
                            "models the runtime)")
        # where the prediction counts fused gradient accumulation (the runtime's rule too: not under FSDP2 nor the
        # zero-bubble schedules), the fp32-output GEMM of 16-bit operands it needs: torch >= 2.8 on CUDA
        if plan_fuses_wgrad(t, p):
            if device != "cuda" or _torch_older_than(torch_version, (2, 8)):
                where = "on this device" if device != "cuda" else f"with torch {torch_version}"
                warnings.append(f"the prediction assumes fused gradient accumulation, which the runtime does only on "
                                f"CUDA with torch >= 2.8 ({where} it upcasts per micro-batch); `parplan evaluate` the "
                                "plan with grad_accumulation_fusion off to compare")
        if t.zero1_grad_reduce == "reduce-scatter" and p.zero_stage == 1 and p.dp > 1:
            warnings.append("the prediction assumes ZeRO-1 reduce-scatters the gradients; the runtime all-reduces them "
                            "(twice the bytes); `parplan evaluate` the plan with zero1_grad_reduce all-reduce to compare")
        if t.p2p_scatter_gather and p.pp > 1 and p.tp > 1 and not p.sp:
            warnings.append("the prediction assumes Megatron's scatter/gather pipeline sends, which the runtime does not "
                            "do (it sends whole tensors); `parplan evaluate` the plan with it off to compare")
        if t.overlap_tp_comm and p.tp > 1:
            warnings.append("the prediction assumes tensor-parallel collectives overlapped with the GEMMs (Megatron's "
                            "--tp-comm-overlap, Transformer Engine's userbuffers); the runtime waits for them, as "
                            "Narayanan's model does; `parplan evaluate` the plan with overlap_tp_comm off to compare")
        if t.overlap_cp_comm and p.cp > 1:
            warnings.append("the prediction assumes context parallelism's K/V exchange overlapped with the attention "
                            "(ring attention); the runtime all-gathers before it; `parplan evaluate` the plan with "
                            "overlap_cp_comm off to compare")
        if t.fused_cross_entropy and not t.cross_entropy_16bit_grad:
            warnings.append("the prediction counts Megatron's fused cross-entropy's memory (an fp32 softmax written "
                            "over in place); the runtime runs the autograd cross-entropy over fp32 logits here (12 B a "
                            "logit at its backward), or with cross_entropy_16bit_grad flash-attn's (its logits' dtype); "
                            "`parplan evaluate` the plan with one of those to compare")
        if t.dropout and t.fused_elementwise:
            warnings.append("dropout: the runtime seeds the attention's dropout outside torch.compile's graphs (a "
                            "graph break a block) and hashes the hidden masks inside the compiled blocks (integer work "
                            "a fused kernel of Megatron's does not do; uncompiled, on the CPU, it draws them in passes "
                            "of their own); the prediction counts Megatron's fused bias-dropout-add (the 1-byte masks' "
                            "traffic only); `parplan evaluate` the plan with fused_elementwise off to compare")
        if not t.flash_attention:
            warnings.append("the prediction counts unfused attention (score-sized tensors, their memory and passes); "
                            "the runtime runs torch's fused scaled_dot_product_attention; `parplan evaluate` the "
                            "plan with flash_attention on to compare")
        if t.attention_kernel != "profile":
            warnings.append(f"the prediction times the attention as the {t.attention_kernel} kernel; the runtime runs "
                            "torch's scaled_dot_product_attention (the profile's measured curve); `parplan evaluate` "
                            "the plan with attention_kernel profile to compare")
        if m.parallel_block and t.framework != "parplan":
            warnings.append(f"the runtime trains the model's parallel blocks (attention and MLP side by side on one "
                            f"norm, one tensor-parallel collective a direction), where the prediction "
                            f"({t.framework}) counts sequential ones; `parplan evaluate` the plan with --framework "
                            "parplan to compare")
        if m.chunk_binds(t.seq_len) and t.framework not in CHUNK_FRAMEWORKS:
            warnings.append(f"the runtime trains the model's {m.chunked_layers} chunked layers within "
                            f"{m.attention_chunk}-token chunks, where the prediction ({t.framework}) counts full causal "
                            "attention; `parplan evaluate` the plan with --framework parplan to compare")
        if m.window_binds(t.seq_len) and not trains_window(m, t.framework):
            warnings.append(f"the runtime trains the model's {m.windowed_layers} sliding-window layers within "
                            f"{m.sliding_window} tokens, where the prediction ({t.framework}) counts full causal "
                            "attention; `parplan evaluate` the plan with --framework parplan to compare")
        if m.window_binds(t.seq_len) and t.dropout:
            warnings.append("attention dropout beside a sliding window: the windowed layers run torch's "
                            "scaled_dot_product_attention under the band as a mask (FlexAttention has no dropout), "
                            "whose kernel computes every tile of the scores and which holds one seq_len x seq_len mask "
                            "in the compute dtype (uncounted), where the prediction counts a kernel that skips the "
                            "tiles outside the band")
        if t.framework == "deepspeed" and ((p.zero_stage == 3 and p.dp > 1) or p.pp > 1):
            warnings.append("the prediction models DeepSpeed's engine (blocking pipeline transfers, ZeRO-3 gathers one "
                            "weight ahead), not this runtime; re-plan with --framework parplan to compare")
        if warnings:
            return Check("runtime support", True, "warning: " + "; warning: ".join(warnings))
        return Check("runtime support", True, "every setting of the plan is implemented in parallel_layers")
    return Check("runtime support", False, "not implemented in parallel_layers: " + ", ".join(m for m, _ in missing),
                 "; ".join(f for _, f in missing))


def check_rendezvous(nnodes: int, node_rank: int, rdzv_endpoint: Optional[str]) -> Check:
    if nnodes == 1:
        return Check("rendezvous", True, "single node (--standalone)" + (
            "" if not rdzv_endpoint else f"; --rdzv-endpoint {rdzv_endpoint} is not used (it names the rendezvous of "
            "a multi-node run: pass --nnodes too, or drop it)"))
    if not rdzv_endpoint:
        return Check("rendezvous", False, f"{nnodes} nodes need a rendezvous endpoint",
                     "pass --rdzv-endpoint HOST:PORT of node 0, the same on every node")
    if not 0 <= node_rank < nnodes:
        return Check("rendezvous", False, f"node_rank {node_rank} not in 0..{nnodes - 1}", "pass --node-rank in range")
    host, _, port = rdzv_endpoint.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return Check("rendezvous", False, f"--rdzv-endpoint {rdzv_endpoint} is not HOST:PORT",
                     "pass node 0's address and a free port, e.g. --rdzv-endpoint node0:29500")
    problem = _unresolved(host[1:-1] if host.startswith("[") and host.endswith("]") else host, int(port))
    if problem:  # torchrun's rendezvous would fail on it after its own timeout; said before the job starts
        return Check("rendezvous", False, f"--rdzv-endpoint host {host} does not resolve on this machine ({problem})",
                     "pass node 0's address as this node resolves it: an IP address, or a name in its DNS or "
                     "/etc/hosts")
    return Check("rendezvous", True, f"c10d at {rdzv_endpoint}, node {node_rank} of {nnodes}")


def _unresolved(host: str, port: int) -> str | None:
    """Why `host` does not resolve here (getaddrinfo's reason), or None where it does."""
    import socket
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:  # socket.gaierror is an OSError; an over-long label a UnicodeError
        return str(getattr(e, "strerror", None) or e) or type(e).__name__
    return None


def torchrun_argv(plan_path: str, *, nproc: int, steps: int, device: str, report: str, nnodes: int = 1,
                  node_rank: int = 0, rdzv_endpoint: Optional[str] = None, rdzv_id: str = "parplan",
                  checkpoint_dir: Optional[str] = None,
                  checkpoint_every: int = 0, resume: bool = False, resume_step: Optional[int] = None,
                  data: Optional[str] = None,
                  compile_blocks: bool = False, memory_snapshot: Optional[str] = None,
                  data_dtype: Optional[str] = None, wgrad_fusion: Optional[str] = None,
                  overlap_grad_reduce: Optional[str] = None, overlap_param_gather: Optional[str] = None,
                  moe_balanced_routing: bool = False, profile: Optional[str] = None) -> list[str]:
    """The job as an argv list: torchrun (as `python -m torch.distributed.run`) running
    `parallel_layers.train`.  wgrad_fusion, overlap_grad_reduce, overlap_param_gather: the runtime's
    --wgrad-fusion, --overlap-grad-reduce and --overlap-param-gather (launch passes "off" for a plan predicted
    without fused gradient accumulation, with the gradient reduction after the backward, or with ZeRO-1/2's
    parameter gather after the step, so the run does what was predicted)."""
    argv = [sys.executable, "-m", "torch.distributed.run"]
    if nnodes == 1:
        argv += ["--standalone"]
    else:
        argv += ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", str(rdzv_endpoint), "--rdzv-id", rdzv_id]
    argv += ["--nproc-per-node", str(nproc), "-m", "parallel_layers.train", "--plan", str(plan_path),
             "--steps", str(steps), "--report", str(report), "--device", device]
    if data:
        argv += ["--data", str(data)]
        if data_dtype:
            argv += ["--data-dtype", data_dtype]
    if checkpoint_dir:
        argv += ["--checkpoint-dir", str(checkpoint_dir), "--checkpoint-every", str(checkpoint_every)]
    if resume or resume_step is not None:
        argv += ["--resume"] + ([] if resume_step is None else ["--resume-step", str(resume_step)])
    if compile_blocks:
        argv += ["--compile"]
    if memory_snapshot:
        argv += ["--memory-snapshot", str(memory_snapshot)]
    if wgrad_fusion:
        argv += ["--wgrad-fusion", wgrad_fusion]
    if overlap_grad_reduce:
        argv += ["--overlap-grad-reduce", overlap_grad_reduce]
    if overlap_param_gather:
        argv += ["--overlap-param-gather", overlap_param_gather]
    if moe_balanced_routing:
        argv += ["--moe-balanced-routing"]
    if profile:
        argv += ["--profile", str(profile)]
    return argv


def _console():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def job_env(device: str) -> dict:
    """The runtime's environment: this checkout importable; one OpenMP thread per gloo rank on CPU;
    on CUDA expandable segments (freed blocks grow and shrink in place instead of fragmenting fixed
    segments, so reserved memory stays near allocated; torchtitan's launcher sets the same), unless
    the user set PYTORCH_CUDA_ALLOC_CONF."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if device == "cpu":
        env["OMP_NUM_THREADS"] = "1"
    else:
        env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    return env


def run_job(argv: list[str], env: dict, steps: int, log_path: Path) -> tuple[int, list[tuple[str, str]], list[str]]:
    """Run torchrun, stream rank 0's [parplan] lines to stderr behind a progress bar, keep every
    line in log_path.  Returns (exit code, [(rank, cause)] of failed ranks, last lines)."""
    import subprocess

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = _console()
    failures: list[tuple[str, str]] = []
    tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, bufsize=1)
    with open(log_path, "w") as log, Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                              TextColumn("{task.completed}/{task.total} {task.fields[status]}"),
                                              TimeElapsedColumn(), console=console, transient=False) as progress:
        task = progress.add_task("training", total=steps, status="starting torchrun")
        try:
            for line in proc.stdout:
                log.write(line)
                line = line.rstrip("\n")
                tail.append(line)
                if m := STEP_LINE.search(line):
                    step, _, loss, dt, tps = m.groups()
                    progress.update(task, completed=int(step),
                                    status=f"loss {float(loss):.4f}  {float(dt):.3f} s/step  {float(tps):,.0f} tok/s")
                elif m := FAIL_LINE.search(line):
                    failures.append(m.groups())
                elif line.startswith("[parplan]"):
                    progress.console.print(line, markup=False, soft_wrap=True)
            code = proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            return EXIT_INTERRUPTED, failures, list(tail)
    return code, failures, list(tail)


def _fmt(value, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "s":
        return f"{value:.4g} s"
    if kind == "tps":
        return f"{value:,.0f}"
    if kind == "mfu":
        return f"{100 * value:.1f}%"
    if kind == "bytes":  # MiB below a GB: a CPU plan's 24.3 vs 26.7 MB had read "0.02 GB / 0.03 GB (+9.6%)"
        return f"{value / 1e9:.2f} GB" if value >= 1e9 else f"{value / 2**20:.1f} MiB"
    if kind == "err":
        return f"{100 * value:+.1f}%"
    return str(value)


def summary_rows(report: dict) -> list[tuple[str, str, str, str]]:
    """(quantity, measured, predicted, relative error) from a run report."""
    med = report.get("median") or {}
    pred = report.get("prediction") or {}
    err = report.get("error") or {}
    reserved = [m.get("reserved") for m in report.get("peak_memory_bytes", {}).values() if m.get("reserved") is not None]
    tps_err = None
    if err.get("step_time_s") is not None and pred.get("tokens_per_s") and med.get("tokens_per_s"):
        tps_err = (pred["tokens_per_s"] - med["tokens_per_s"]) / med["tokens_per_s"]
    predicted_mem = (pred.get("memory_bytes_per_gpu") or {}).get("total")
    mem_row = ("peak memory / GPU", _fmt(max(reserved) if reserved else None, "bytes"), _fmt(predicted_mem, "bytes"),
               _fmt(err.get("peak_memory"), "err"))
    mfu_label = "MFU"
    if report.get("device") == "cpu":
        # a CPU run has no GPU memory or MFU to measure: its memory is the allocator's trace (--memory-snapshot),
        # and the MFU predicted is the plan's GPU's
        cm = report.get("cpu_memory") or {}
        mem_row = ("peak memory / rank (cpu allocator)", _fmt(cm.get("without_collective_buffers_max"), "bytes"),
                   _fmt(cm.get("predicted", predicted_mem), "bytes"), _fmt(cm.get("error"), "err"))
        mfu_label = "MFU (predicted for the plan's GPU)"
    return [
        ("step time", _fmt(med.get("step_time_s"), "s"), _fmt(pred.get("step_time_s"), "s"), _fmt(err.get("step_time_s"), "err")),
        ("tokens/s", _fmt(med.get("tokens_per_s"), "tps"), _fmt(pred.get("tokens_per_s"), "tps"), _fmt(tps_err, "err")),
        (mfu_label, _fmt(med.get("mfu"), "mfu"), _fmt(pred.get("mfu"), "mfu"), _fmt(err.get("mfu"), "err")),
        mem_row,
    ]


def phases_line(report: dict) -> str | None:
    """Where rank 0's median step went (the report's step phases), and whether it was launch-bound."""
    import statistics

    steps = report.get("steps") or []
    steps = steps[report.get("warmup_steps") or 0:] or steps
    steps = [s for s in steps if not s.get("skipped")] or steps  # fp16 steps skipped for overflow: no step taken

    def med(key):
        vals = [s.get(key) for s in steps]
        return statistics.median(vals) if vals and all(v is not None for v in vals) else None
    host, fb, after = med("host_dispatch_s"), med("fwd_bwd_s"), med("after_s")
    if host is None or fb is None or after is None:
        return None
    fwd = med("host_forward_s")
    if report.get("device") == "cpu":  # the host runs the work it dispatches: no device to finish after it
        return (f"phases (rank 0, median): the forward/backward done at {fb * 1e3:.1f} ms, then {after * 1e3:.1f} ms "
                "of gradient reduction and optimizer step")
    line = ("phases (rank 0, median): host done dispatching " +
            (f"the first forward at {fwd * 1e3:.1f} ms, " if fwd is not None else "") +
            f"the forward/backward at {host * 1e3:.1f} ms, the device "
            f"done with it at {fb * 1e3:.1f} ms, then {after * 1e3:.1f} ms of gradient reduction and optimizer step")
    predicted_bound = any("launch-bound" in w for w in (report.get("prediction") or {}).get("warnings") or [])
    if host >= 0.97 * fb and report.get("device") != "cpu":  # on CPU the host is the device
        line += ("; launch-bound: the device waited for the host (a larger micro-batch, or a faster host CPU, "
                 "shortens the step)")
        line += _host_block_note(report, host) or ""
    elif predicted_bound and report.get("device") != "cpu":
        line += "; not launch-bound, though the prediction was" + (_host_block_note(report, host) or "")
    return line


def telemetry_line(report: dict) -> str | None:
    """Rank 0's GPU clock, power and temperature over the timed steps (nvidia-smi; parallel_layers.telemetry): the
    first timed step's, the median, and the last's, so a run that slowed as the GPU settled shows it."""
    import statistics

    from parallel_layers.telemetry import FIELDS

    steps = report.get("steps") or []
    steps = [s for s in steps[report.get("warmup_steps") or 0:] or steps if s.get("sm_mhz") is not None]
    if not steps:
        return None
    med = {k: statistics.median(s[k] for s in steps) for k in FIELDS}
    first, last = steps[0], steps[-1]
    return (f"GPU (rank 0, nvidia-smi; first timed step / median / last): SM clock {first['sm_mhz']:.0f} / "
            f"{med['sm_mhz']:.0f} / {last['sm_mhz']:.0f} MHz, power {first['power_w']:.0f} / {med['power_w']:.0f} / "
            f"{last['power_w']:.0f} W, {first['temp_c']:.0f} / {med['temp_c']:.0f} / {last['temp_c']:.0f} C")


def _host_block_note(report: dict, host_s: float) -> str | None:
    """A launch-bound one-stage run's dispatch per block (the host phase over blocks x micro-batches: an upper
    bound, the embedding, head and loss included) beside the profile's host_block_s, which predicted it: the
    two differ when the profile was calibrated on another machine (1.9x per block between two H100 machines
    of one kind, benchmarks/results/2026-11-23-h100)."""
    plan = report.get("plan") or {}
    par, tr = plan.get("parallel") or {}, plan.get("training") or {}
    if par.get("pp", 1) != 1 or not par.get("stage_layers") or not tr.get("micro_batch_size"):
        return None
    micro = tr["global_batch_size"] // (tr["micro_batch_size"] * par.get("dp", 1))
    per_block = host_s / (par["stage_layers"][0] * max(micro, 1))
    try:
        from .core import load_hardware
        prof = load_hardware((plan.get("hardware") or {}).get("name"))
    except Exception:  # a profile path from another machine: nothing to compare with
        return None
    modelled = (prof.host_block_s or {}).get(par.get("recompute", "none"))
    if not modelled:
        return None
    note = (f"; the host dispatched a block in at most {per_block * 1e3:.2f} ms, the profile {prof.name} says "
            f"{modelled * 1e3:.2f} ms")
    if abs(per_block / modelled - 1) > 0.15:
        note += (f" (calibrated on another machine? `parplan calibrate --host-only --base {plan['hardware']['name']}` "
                 "on this one)")
    return note


def grad_norm_line(report: dict) -> str | None:
    """The global gradient norm before clipping, first and last step, and how many steps clipped."""
    steps = [s for s in report.get("steps") or [] if not s.get("skipped")]  # an overflowed fp16 step has no norm
    norms = [s.get("grad_norm") for s in steps]
    clip = ((report.get("plan") or {}).get("training") or {}).get("clip_grad")
    if not norms or None in norms or clip is None:
        return None
    clipped = sum(n > clip for n in norms)
    at = f"{norms[0]:.4g} at step {steps[0]['step']}" + (f", {norms[-1]:.4g} at step {steps[-1]['step']}"
                                                          if len(steps) > 1 else "")
    return (f"gradient norm before clipping at {clip:g}: {at}; {clipped} of {len(norms)} "
            f"step{'s' if len(norms) > 1 else ''} clipped")


def expert_load_line(report: dict) -> str | None:
    """A mixture of experts: how unevenly rank 0's router spread its tokens (parallel_layers.moe.MoEState.
    load_imbalance), first and last step, against the balance the prediction assumes; nothing for a dense run."""
    steps = [s for s in report.get("steps") or [] if s.get("expert_load_imbalance") is not None]
    if not steps:
        return None
    first, last = steps[0], steps[-1]
    at = f"{first['expert_load_imbalance']:.2f}x its share of rank 0's tokens at step {first['step']}" + (
        f", {last['expert_load_imbalance']:.2f}x at step {last['step']}" if len(steps) > 1 else "")
    note = ("" if max(s["expert_load_imbalance"] for s in steps) <= 1.0 + 1e-9 else
            "; the prediction assumes every expert its share (1.00x): --moe-balanced-routing measures that")
    return f"experts: a layer's busiest expert got {at} (median over layers){note}"


def dropout_line(report: dict) -> str | None:
    """The dropout the run applied (parallel_layers.dropout); nothing for a run without (null, or absent before
    2026-12-03)."""
    d = report.get("dropout")
    if not isinstance(d, dict):
        return None
    return (f"dropout {d.get('hidden', 0):g} on the embedding and residual branches, {d.get('attention', 0):g} on the "
            "attention probabilities")


def fp8_line(report: dict) -> str | None:
    """How an FP8 plan's linears ran (parallel_layers.fp8): the blocks' GEMMs in FP8 and how the casts were made
    (the prediction counts compiled casts); nothing for a 16-bit run (null, or absent before 2026-12-05)."""
    casts = report.get("fp8_casts")
    if not casts:
        return None
    return (f"FP8 linears (the blocks' GEMMs: E4M3 inputs and weights, E5M2 output gradients, per-tensor scales), "
            f"casts {casts}")


def host_line(report: dict) -> str | None:
    """Rank 0's host and its dispatch probes (parallel_layers.host_speed), which a launch-bound step follows;
    nothing for a report without them (before 2026-12-07)."""
    host = report.get("host")
    if not host:
        return None
    cpus = host.get("usable_cpus") or host.get("logical_cpus")
    launch = host.get("probe_cuda_launch_us")
    return (f"host: {host.get('cpu')}" + (f", {cpus} CPUs" if cpus else "") + f"; dispatch probes {host.get('probe_cpu_op_us')} "
            "us a CPU op" + (f", {launch} us a kernel launch" if launch is not None else ""))


def loss_scale_line(report: dict) -> str | None:
    """fp16's dynamic loss scale (parallel_layers.loss_scale): where it started and ended, and the steps skipped."""
    ls = report.get("loss_scaling")
    if not isinstance(ls, dict) or ls.get("first") is None:
        return None
    skipped = ls.get("skipped_steps") or []
    what = ("no step skipped" if not skipped else
            f"{len(skipped)} step{'s' if len(skipped) > 1 else ''} skipped for inf/nan gradients (step "
            + ", ".join(str(n) for n in skipped[:6]) + (", ..." if len(skipped) > 6 else "") + ")")
    return f"fp16 loss scale {ls['first']:g} at the first step, {ls['last']:g} at the last; {what}"


PROFILE_HINT_ERROR = 0.15  # a step time error past issue 4's bar: launch's summary points at --profile


def profile_line(report: dict) -> str | None:
    """The profiled step's line (--profile; rank 0's, parallel_layers.step_profile): its time, how much of it the GPU
    was busy and on which kernel most, and where the tables are; without one, where the step missed its prediction
    by more than PROFILE_HINT_ERROR, a pointer to --profile; else None."""
    p = report.get("profile")
    if not p:
        err = (report.get("error") or {}).get("step_time_s")
        if err is not None and abs(err) > PROFILE_HINT_ERROR:  # (null where the run is not comparable: cpu)
            return (f"the predicted step is {abs(err):.0%} {'under' if err < 0 else 'over'} the measured one: `parplan "
                    "launch --profile DIR` profiles a step more and lists the kernels and host operators it took")
        return None
    s = f"profiled step {p['step']} (rank 0, not in the medians): {p['wall_s'] * 1e3:.1f} ms"
    if p.get("error"):
        return s + f"; no tables: {p['error']}"
    if p.get("device_busy_s") is not None:
        s += f", GPU busy {p['device_busy_s'] * 1e3:.1f} ms ({p['device_busy_fraction']:.0%})"
        top = p.get("top_device_op")
        if top:
            name = top["name"] if len(top["name"]) <= 60 else top["name"][:57] + "..."
            s += f", most in {name} ({top['self_device_s'] * 1e3:.1f} ms, {top['calls']} calls)"
    else:
        s += f", host operators {p['host_self_s'] * 1e3:.1f} ms"
    return s + f"; tables and trace: {os.path.dirname(p['files'][0])}"


def cpu_memory_line(report: dict) -> str | None:
    """The CPU allocator's traced peak (``--memory-snapshot`` on cpu) against the plan's memory model."""
    cm = report.get("cpu_memory")
    if not cm:
        # a CPU run's measured memory is the allocator's trace, which only --memory-snapshot takes (the summary's "-")
        return ("measured memory on cpu: run with --memory-snapshot DIR to trace the allocator's peak per rank"
                if report.get("device") == "cpu" else None)
    line = (f"cpu allocator peak (max over ranks, --memory-snapshot): {_fmt(cm['allocated_max'], 'bytes')}, "
            f"{_fmt(cm['without_collective_buffers_max'], 'bytes')} without gloo's collective buffers")
    if cm.get("predicted") is not None:
        line += f"; the plan's memory model: {_fmt(cm['predicted'], 'bytes')} ({_fmt(cm['error'], 'err')})"
        if cm.get("note"):
            line += f" ({cm['note']})"
    elif cm.get("note"):
        line += f"; {cm['note']}"
    return line


def rank_kind_memory(report: dict) -> dict[str, dict] | None:
    """Each pipeline rank kind the prediction names (``memory_bytes_per_gpu.by_stage``: first, the fullest
    middle, last) against the peak of the pipeline rank the model means: 0, the fullest of the middle ranks as
    measured (1, or pp - 2 under the zero-bubble schedules, with the default split; another where a plan's own split
    or an uneven default one fills another more), pp - 1; the largest of that pipeline rank's
    data/tensor/context-parallel peers.  The peak is
    the CPU allocator's traced one without gloo's buffers where every rank was traced, else torch's reserved
    peak (what the summary's peak memory compares).  None without a pipeline or a comparable prediction."""
    by_stage = ((report.get("prediction") or {}).get("memory_bytes_per_gpu") or {}).get("by_stage")
    peaks = report.get("peak_memory_bytes") or {}
    comparable = ((report.get("cpu_memory") or {}).get("predicted") is not None
                  or (report.get("error") or {}).get("peak_memory") is not None)
    if not by_stage or not peaks or not comparable:
        return None
    from cost_models.layout import SCHEDULES
    from cost_models.memory import middle_rank
    par = report["plan"]["parallel"]
    pp, inner = par["pp"], par["cp"] * par["tp"]  # mesh (dp, pp, [cp,] tp): pp rank = rank // (cp tp) % pp
    which = {"first": 0, "middle": int(middle_rank(pp, SCHEDULES.index(par["schedule"]))), "last": pp - 1}
    key = ("allocated_without_collective_buffers"
           if all(m.get("allocated_without_collective_buffers") is not None for m in peaks.values()) else "reserved")
    measured: dict[int, float] = {}
    for rank, m in peaks.items():
        if m.get(key) is not None:
            r = int(rank) // inner % pp
            measured[r] = max(measured.get(r, 0.0), m[key])
    middle = [r for r in range(1, pp - 1) if measured.get(r)]
    if middle:  # the fullest middle rank measured (a plan's own split may fill another than the model's usual one)
        which["middle"] = max(middle, key=lambda r: (measured[r], r == which["middle"]))
    out = {}
    for kind, predicted in by_stage.items():
        got = measured.get(which[kind])
        if got:
            out[kind] = {"pipeline_rank": which[kind], "measured": got, "predicted": predicted,
                         "error": predicted / got - 1}
    return out or None


def rank_kind_line(report: dict) -> str | None:
    kinds = rank_kind_memory(report)
    if not kinds:
        return None
    parts = [f"rank {k['pipeline_rank']} ({name}) {_fmt(k['measured'], 'bytes')} / {_fmt(k['predicted'], 'bytes')} "
             f"({_fmt(k['error'], 'err')})" for name, k in kinds.items()]
    # a CPU run holds offloaded optimizer states in the same allocator, and by_stage has no per-rank offloaded share
    # (the summary's CPU line adds the worst stage's): say so rather than read the gap as the model's
    offload = (report.get("plan") or {}).get("parallel", {}).get("offload", "none") != "none"
    cpu = (report.get("cpu_memory") or {}).get("predicted") is not None
    return ("memory per pipeline rank, measured / predicted: " + ", ".join(parts)
            + ("; predicted without the offloaded optimizer states, which a CPU run holds beside them" if offload and cpu
               else ""))


def print_summary(report: dict, report_path: str) -> None:
    from rich.table import Table

    steps = report.get("steps", [])
    warm = report.get("warmup_steps")
    timed = (f"median after {warm} warm-up" if warm else
             "no warm-up: the time includes start-up" if len(steps) == 1 else "median, no warm-up")
    title = (f"{report.get('device')} x {report.get('world_size')}: {len(steps)} step{'s' if len(steps) > 1 else ''}, "
             f"{timed}; final loss {steps[-1]['loss']:.4f}" if steps else "no steps run")
    t = Table()
    for col in ("", "measured", "predicted", "rel. error"):
        t.add_column(col, justify="right" if col else "left")
    for row in summary_rows(report):
        t.add_row(*row)
    console = _console()
    console.print(title, markup=False, highlight=False)  # above the table, not its title: that wrapped at its width
    console.print(t)
    for note in report.get("notes", []):
        console.print(f"note: {note}", markup=False, soft_wrap=True)
    for line in (phases_line(report), telemetry_line(report), grad_norm_line(report), loss_scale_line(report),
                 dropout_line(report), fp8_line(report), expert_load_line(report), cpu_memory_line(report),
                 rank_kind_line(report), profile_line(report), host_line(report)):
        if line:
            console.print(line, markup=False, soft_wrap=True)
    console.print(f"report: {report_path}", markup=False)


def _placeholders(argv: list[str]) -> list[str]:
    """A dry run's command after failed checks: the values no check could settle shown as <...>, not as
    None or 0."""
    out = list(argv)
    for flag, bad, shown in (("--rdzv-endpoint", "None", "<HOST:PORT>"), ("--nproc-per-node", "0", "<RANKS_PER_NODE>")):
        if flag in out and out.index(flag) + 1 < len(out) and out[out.index(flag) + 1] == bad:
            out[out.index(flag) + 1] = shown
    return out


REPORT_MAX_BYTES = 256 * 2 ** 20


def _same_plan(path: Path, plan) -> bool:
    """True where `path` holds this plan's job (model, hardware, training, layout), however it is formatted and
    whatever prediction it carries: the run rewrites it, in its own layout, with the prediction launch made."""
    from planner.schema import Plan
    job = {"model", "hardware", "training", "parallel"}
    computed = {"model": {"num_params"}}  # filled in by the planner: absent from a hand-written plan
    try:
        return Plan.model_validate_json(path.read_text(encoding="utf-8-sig")).model_dump(include=job, exclude=computed) \
            == plan.model_dump(include=job, exclude=computed)
    except (OSError, ValueError):
        return False


def is_launch_report(path: Path) -> bool:
    """True where `path` holds a report `parplan launch` wrote (a JSON object with the plan and the measured steps)
    or is empty, which a run may replace; any other file it must not."""
    import json
    try:
        size = path.stat().st_size
        if size == 0:  # a file made for the report (mktemp): nothing of anyone's to lose
            return True
        if size > REPORT_MAX_BYTES:  # a launch report is a few hundred kB; never read a large file to find out
            return False
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError, RecursionError, MemoryError):
        return False
    return isinstance(data, dict) and "plan" in data and "steps" in data and "world_size" in data


def launch(plan_source: str, steps: int = 20, device: str = "auto", dry_run: bool = False, report: str | None = None,
           nnodes: int = 1, node_rank: int = 0, rdzv_endpoint: str | None = None, nproc_per_node: int | None = None,
           checkpoint_dir=None, checkpoint_every=0, resume=False, data=None, compile: bool | None = None,
           memory_snapshot: str | None = None, data_dtype: str | None = None, resume_step: int | None = None,
           moe_balanced_routing: bool = False, profile: str | None = None, strict: bool = False) -> int:
    """Check the plan against this machine and run it with torchrun; returns the exit code.
    strict: a dry run exits with its failed checks' code, not 0 (its command printed either way).
    compile: torch.compile each block (None = on for cuda when the plan models fused pointwise work,
    training.fused_elementwise, as it does by default; off for cpu)."""
    import importlib.util
    import json

    plan, error = read_plan(plan_source)
    if plan is None:
        _err(f"error: {error}")
        return EXIT_INVALID
    if device not in ("auto", "cuda", "cpu"):
        _err(f"error: --device must be auto, cuda or cpu, got {device!r}")
        return EXIT_INVALID
    if importlib.util.find_spec("torch") is None:
        _err("error: torch is not importable -- fix: pip install torch (launch runs parallel_layers on torch.distributed)")
        return EXIT_INVALID
    machine = probe_machine()
    checks = [Check("torch", True, f"torch {machine.torch_version}")]
    plan, pred_check = repredict(plan)
    checks.append(pred_check)
    device, dev_check = resolve_device(device, machine, plan)
    checks.append(dev_check)
    nproc, world_check = check_world(plan, device, machine, nnodes, nproc_per_node)
    support = check_runtime_support(plan, device, machine.torch_version)
    # a layout rule the runtime's own checks do not name (one failure line per problem)
    rules = check_rules(plan) if support.ok else None
    checks += [c for c in (rules, world_check, support, check_split(plan)) if c] + [
               check_rendezvous(nnodes, node_rank, rdzv_endpoint),
               check_hardware(plan, device, machine), check_memory(plan, device, machine, nproc)]
    if plan.training.fp8:
        checks.append(check_fp8(plan, device, machine))
    checks += [c for c in (check_moe_on_gpu(plan, device), check_bridges(plan, device, nproc) if world_check.ok
                           else None, check_network(plan, device, nnodes, nproc) if world_check.ok else None) if c]
    if device == "cpu" and world_check.ok:
        checks.append(check_cpu_time(plan, steps, nproc, machine))
    if data and not Path(data).is_file():
        checks.append(Check("data", False, f"{data} is not a file", "pass a flat uint16/uint32 token file"))
    elif data:
        checks.append(check_data(data, plan, data_dtype))
    if data_dtype and not data:
        checks.append(Check("data", False, f"--data-dtype {data_dtype} without --data (the synthetic tokens have no file)",
                            "pass --data FILE, or drop --data-dtype"))

    checks += [c for c in (check_folder("--checkpoint-dir", checkpoint_dir) if checkpoint_dir else None,
                           check_folder("--memory-snapshot", memory_snapshot) if memory_snapshot else None,
                           check_folder("--profile", profile) if profile else None) if c]
    if profile and memory_snapshot and device == "cpu":
        checks.append(Check("profile", False, "--profile and --memory-snapshot on cpu both run torch.profiler (the "
                            "CPU allocator's trace is the profiler's)", "launch them as two runs"))
    resume = resume or resume_step is not None
    if moe_balanced_routing and not plan.model.is_moe:
        checks.append(Check("moe", False, "--moe-balanced-routing routes a mixture of experts' tokens, and the plan's "
                            "model is dense", "drop --moe-balanced-routing"))
    have = saved_steps(checkpoint_dir) if checkpoint_dir else []  # read once: the checks below all ask it
    if resume and not checkpoint_dir:
        checks.append(Check("checkpoint", False, "--resume without --checkpoint-dir has nothing to resume from",
                            "pass --checkpoint-dir DIR (the folder --checkpoint-dir wrote)"))
    elif resume and not have:  # a misspelt folder had trained from step 0 without a word
        checks.append(Check("checkpoint", False, f"--resume: no checkpoint under {checkpoint_dir}",
                            "pass the --checkpoint-dir an earlier run wrote, or drop --resume to start from step 0"))
    elif resume:
        checks.append(check_resume(checkpoint_dir, resume_step, steps, plan.parallel.tp, plan))
    elif have:  # a fresh run would write its steps among another run's
        checks.append(Check("checkpoint", False, f"--checkpoint-dir {checkpoint_dir} holds checkpoints of an earlier "
                            f"run (steps {', '.join(map(str, have))}), which this run would mix "
                            "its own with", "pass --resume to continue that run, or a new --checkpoint-dir"))
    if checkpoint_every and not checkpoint_dir:  # the option had been dropped without a word
        checks.append(Check("checkpoint", False, f"--checkpoint-every {checkpoint_every} without --checkpoint-dir "
                            "has nowhere to save", "pass --checkpoint-dir DIR, or drop --checkpoint-every"))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(report).parent if report else Path("runs") / stamp
    report_path = report or str(run_dir / "report.json")
    plan_path = run_dir / "plan.json"
    blocked = False
    if report:
        try:
            Path(report).exists()
        except PermissionError:  # inside a folder the user may not enter: every check below would raise
            blocked = True
            checks.append(Check("report", False, f"--report {report}: permission denied on the way to it",
                                "pass --report in a folder you can write, e.g. runs/NAME/report.json"))
    if report and not blocked:
        # the run writes plan.json and torchrun.log beside the report: never over a file of someone else's,
        # nor through a file where a folder should be
        nearest = nearest_existing(run_dir)
        # a name ending in a separator is a folder too, made or not (the runtime writes report + ".tmp" from the string:
        # "DIR/" had run the job and failed at its last write, plan.json and the log in DIR's parent)
        if Path(report).is_dir() or report.endswith(("/", os.sep)) or (nearest is not None and not nearest.is_dir()):
            checks.append(Check("report", False, f"--report {report} is not a file path in a folder",
                                "pass --report FOLDER/report.json"))
        elif is_device(report):  # /dev/null: the run would write plan.json and torchrun.log into /dev beside it
            checks.append(Check("report", False, f"--report {report} is a device, and the run writes plan.json and "
                                "torchrun.log beside the report", "pass --report FOLDER/report.json"))
        elif plan_source != "-" and Path(report).resolve() == Path(plan_source).resolve():
            checks.append(Check("report", False, f"--report {report} is the plan file itself, which the report "
                                "would overwrite", "pass --report in a folder of its own, e.g. runs/NAME/report.json"))
        elif Path(report).name in ("plan.json", "torchrun.log"):
            checks.append(Check("report", False, f"--report {report}: the run writes its own {Path(report).name} "
                                "there", "name the report report.json, e.g. runs/NAME/report.json"))
        elif Path(report).is_file() and not is_launch_report(Path(report)):
            checks.append(Check("report", False, f"--report {report} exists and is not a launch report, which the "
                                "run would overwrite", "pass --report in a folder of its own, e.g. "
                                "runs/NAME/report.json (a launch report there is replaced)"))
        elif plan_path.exists() and not _same_plan(plan_path, plan):
            checks.append(Check("report", False, f"{plan_path} exists and holds another plan, which the run would "
                                f"overwrite (it writes plan.json and torchrun.log beside the report)",
                                "pass --report in a folder of its own, e.g. runs/NAME/report.json"))
        elif (run_dir / "torchrun.log").is_file() and not plan_path.exists() and not Path(report).is_file():
            # a log with neither a report nor a plan beside it is no earlier run of this plan's
            checks.append(Check("report", False, f"{run_dir / 'torchrun.log'} exists beside no launch report or plan, "
                                "and the run would overwrite it", "pass --report in a folder of its own, e.g. "
                                "runs/NAME/report.json"))
    if not any(c.name == "report" for c in checks):
        # where the run's folder would be made (the default runs/<time> included): a dry run says so too, where the
        # run itself would stop at its first write
        nearest = nearest_existing(run_dir.absolute())
        if nearest is not None and nearest.is_dir() and not can_make_folder_in(nearest):
            checks.append(Check("report", False, f"cannot write in {run_dir}: {nearest} is not writable",
                                "pass --report in a folder you can write, e.g. runs/NAME/report.json"))
    # every node derives the same rendezvous id from the same plan
    rdzv_id = "parplan-" + hashlib.sha1(plan.model_dump_json().encode()).hexdigest()[:12]
    argv = torchrun_argv(str(plan_path), nproc=nproc, steps=steps, device=device, report=report_path, nnodes=nnodes,
                         node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id, checkpoint_dir=checkpoint_dir,
                         checkpoint_every=checkpoint_every, resume=resume, resume_step=resume_step, data=data,
                         compile_blocks=(device == "cuda" and plan.training.fused_elementwise) if compile is None else compile,
                         memory_snapshot=memory_snapshot, data_dtype=data_dtype,
                         wgrad_fusion=None if plan.training.grad_accumulation_fusion else "off",
                         overlap_grad_reduce=None if plan.training.overlap_grad_reduce else "off",
                         overlap_param_gather=None if plan_overlaps_param_gather(plan.training) else "off",
                         moe_balanced_routing=moe_balanced_routing, profile=profile)
    failed = [c for c in checks if not c.ok]
    if dry_run:
        for c in checks:
            _err(c.line())
        _err(f"plan would be written to {plan_path}; report to {report_path}")
        if failed:
            shown = _placeholders(argv)
            _err(f"{len(failed)} check{'s' if len(failed) > 1 else ''} failed: the command on stdout runs once "
                 f"{'they are' if len(failed) > 1 else 'it is'} fixed"
                 + (" (values no check could settle in <>)" if shown != argv else ""))
            argv = shown
        _err("the command reads the plan that `parplan launch` writes there: to run it, repeat the launch without "
             "--dry-run")
        sys.stdout.write(shlex.join(argv) + "\n")
        # a dry run shows the command and every check, failed ones included (module docstring); with strict it exits
        # as the run would have stopped, so `--dry-run --strict && ...` or a CI step sees a failed check
        return max((c.exit_code for c in failed), default=EXIT_OK) if strict else EXIT_OK
    if failed:
        for c in failed:
            _err(f"error: {c.name}: {c.detail} -- fix: {c.fix}")
        return max(c.exit_code for c in failed)

    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        plan_path.write_text(plan.model_dump_json(indent=2))  # the validated plan, never the raw input
    except OSError as e:
        _err(f"error: report: cannot write in {run_dir}: {e.strerror or e} -- fix: pass --report in a folder you "
             "can write, e.g. runs/NAME/report.json")
        return EXIT_INVALID
    for c in checks:  # what passed with a warning (a dry run prints every check)
        if c.detail.startswith("warning: "):
            _err(f"{c.name}: {c.detail}")
    env = job_env(device)

    def report_state():  # what the report file is before the run, to tell this run's from an earlier one's
        try:
            st = os.stat(report_path)
            return st.st_ino, st.st_size, st.st_mtime_ns
        except OSError:
            return None
    before = report_state()
    # torchrun's agent makes a log folder per run (/tmp/torchelastic_*, left behind empty: it redirects no stream here,
    # the output is run_dir/torchrun.log): one of launch's own, removed when the job ends, whatever its end
    log_dir = tempfile.mkdtemp(prefix="parplan_torchrun_")
    at = argv.index("torch.distributed.run") + 1  # a torchrun option: before the -m of the script it runs
    argv = argv[:at] + ["--log-dir", log_dir] + argv[at:]
    _err(f"launching {plan.parallel.world_size} ranks ({nproc} per node): {shlex.join(argv)}")
    try:
        code, failures, tail = run_job(argv, env, steps, run_dir / "torchrun.log")
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    if code == EXIT_INTERRUPTED:  # the CLI's main says "error: interrupted"
        return code
    if code != 0:
        for rank, cause in failures:
            _err(f"error: rank {rank} failed: {cause}")
        if not failures:
            _err(f"error: torchrun exited with code {code}; last lines:")
            for line in tail[-15:]:
                _err(f"  {line}")
        _err(f"full log: {run_dir / 'torchrun.log'}")
        return code
    now = report_state()
    if nnodes > 1 and (now is None or now == before):
        # global rank 0 writes the report, on the node that ran it (c10d numbers the nodes as they join, so not
        # always --node-rank 0's); a file this run did not change is an earlier run's (compared by inode, size and
        # mtime as stored, not against this node's clock, which a shared file system's need not match)
        _err(f"node {node_rank}: its ranks finished; the report is written on the node that ran global rank 0, "
             f"at {report_path} there")
        return EXIT_OK
    try:
        with open(report_path) as f:
            rep = json.load(f)
    except (OSError, ValueError) as e:
        _err(f"error: the job succeeded but its report {report_path} is unreadable: {e}")
        return 1
    print_summary(rep, report_path)
    return EXIT_OK
