"""Python API behind the CLI: recommend (search) and evaluate (one plan, no search).

    from planner import recommend, evaluate_plan
    plan = recommend(model="llama3-70b", gpus=64)
    print(plan.parallel, plan.prediction.mfu)

Errors in the user's input raise ``PlannerError`` (one line naming the problem and the fix);
the CLI turns them into exit code 2.
"""
from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

import numpy as np

from cost_models import zero3
from cost_models.compute import plan_overlaps_param_gather
from cost_models.hardware import constants_from_profile
from cost_models.layout import (OFFLOADS, PRECISION_RECIPES, RECOMPUTE, SCHEDULES, Layout, ModelDims, TrainingConsts,
                                head_lightened_split, model_stage_layers, stages_of_rank)
from cost_models.memory import PEAK_MOMENTS, weight_pass_queued
from cost_models.total import evaluate

from . import DEFAULT_GLOBAL_BATCH, DEFAULT_SEQ_LEN
from .schema import (FP8_FRAMEWORKS, Amdahl, CommBytes, HardwareProfile, HardwareRef, MemoryBreakdown, ModelSpec,
                     Parallel, Plan, Prediction, SearchInfo, TimeBreakdown, Training, fp8_problem)
from .models import with_param_count
from .search import REASONS, ZB_FULL_RECOMPUTE, ZERO_BUBBLE, Pins, fsdp2_offload_blockers, run_search


class PlannerError(ValueError):
    """Invalid input; the message is one line with the fix: `problem`, then `fix` where the raiser gives it apart
    (a sweep over GPU counts says the problem of a count a pin rules out without its "pick a divisor" fix)."""

    def __init__(self, problem: str, fix: str | None = None):
        super().__init__(problem if fix is None else f"{problem}; {fix}")
        self.problem, self.fix = problem, fix


class StructureError(PlannerError):
    """A plan's layout that no framework runs (check_plan_structure): `problem`, then `fix`."""

    def __init__(self, problem: str, fix: str = "correct the plan, or write one with `parplan recommend ... --json`"):
        super().__init__(problem, fix)


# DeepSpeed's engine (_do_optimizer_sanity_check, 007cca6a and later) wraps a bf16 model without ZeRO inside a
# pipeline in its BF16_Optimizer, which shards the fp32 master weights and Adam states over the data-parallel group
# (fp32_groups_flat_partition) after all-reducing the gradients: validate's BLOOM rows model it so (ZeRO-1,
# zero1_grad_reduce all-reduce).  Outside a pipeline it is plain data parallelism (DDP_BFLOAT16: FP16_Optimizer in bf16)
DEEPSPEED_BF16_ZERO0 = ("DeepSpeed trains a bf16 pipeline without ZeRO through its BF16_Optimizer, which shards the "
                        "fp32 master weights and Adam states over the data-parallel ranks as ZeRO-1 does (gradients "
                        "all-reduced)")


def deepspeed_bf16_optimizer(dtype: str, precision: str) -> bool:
    """Whether DeepSpeed runs this recipe's model in bf16 (the ds_config bf16 section planner.export writes)."""
    return dtype == "bf16" and precision != "fp32"


def deepspeed_zero_in_pipeline(zero: int | None, pp: int | None) -> str | None:
    """DeepSpeed's PipelineEngine: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"."""
    if zero is not None and zero >= 2 and pp is not None and pp > 1:
        return f"DeepSpeed's pipeline engine refuses ZeRO-{zero} with pp {pp}"
    return None


class NothingFits(Exception):
    def __init__(self, plan: Plan, message: str):
        super().__init__(message)
        self.plan = plan


def load_hardware(name_or_path: str):
    import hardware_profiles
    try:
        return hardware_profiles.load_profile(name_or_path)
    except (ValueError, OSError) as e:
        raise PlannerError(str(e)) from None


def plan_hardware(plan):
    """The profile a plan names; where it cannot be loaded, the error names the plan's field and how to fix it (a
    plan has no --hardware flag to pass: `evaluate`, `explain`, `compare` and `export` read it from the file)."""
    import hardware_profiles
    name = plan.hardware.name
    try:
        return load_hardware(name)
    except PlannerError as e:
        from pathlib import Path
        if hardware_profiles.looks_like_path(name) and not Path(name).exists():
            raise PlannerError(f"the plan's hardware.name {name!r} is a profile file found neither from here nor "
                               "beside the plan file or above it; run from the folder the plan was made in, or edit "
                               "hardware.name to the file's path or to a profile name "
                               f"({', '.join(hardware_profiles.list_profiles())})") from None
        if not hardware_profiles.looks_like_path(name):
            raise PlannerError(f"the plan's hardware.name {name!r}: {e}; edit hardware.name in the plan file") from None
        raise PlannerError(f"the plan's hardware.name: {e}") from None


# Global gradient-norm clipping `recommend` plans with: the default of Megatron-LM (--clip-grad),
# torchtitan (max_norm) and the published DeepSpeed runs' gradient_clipping
DEFAULT_CLIP_GRAD = 1.0
DEFAULT_PRECISION = "master-weights"  # recommend's recipe (Megatron's 18 B/param), where Training's default is amp

# Training fields that describe the framework rather than the job: recommend() takes them as keywords,
# the CLI has one option each, and `validate` sets them per published set.
STACK_FLAGS = ("flash_attention", "overlap_grad_reduce", "overlap_param_gather", "overlap_tp_comm", "dropout", "fp8", "zero1_grad_reduce",
               "zero2_grad_reduce", "grad_accumulation_fusion", "p2p_scatter_gather", "fused_cross_entropy",
               "cross_entropy_16bit_grad", "fused_elementwise", "overlap_cp_comm", "async_tp_grad_comm",
               "attention_kernel", "moe_dispatcher", "moe_recompute", "mla_recompute", "moe_a2a_overlap")
# What each framework does by default where parplan's runtime differs (Training's defaults):
#   megatron   vocab_parallel_cross_entropy (fused: softmax in place; Megatron-DeepSpeed uses it too),
#              --no-gradient-accumulation-fusion (fusion is on unless disabled),
#              --no-scatter-gather-tensors-in-pipeline (scatter/gather on unless disabled; nothing
#              to scatter with sequence parallelism), --use-distributed-optimizer reduce-scatters,
#              --cp-comm-type p2p (ring attention: the K/V exchange overlaps the attention); like
#              parplan's runtime it starts the column-parallel layers' input-gradient all-reduce
#              (reduce-scatter with SP) beside their weight-gradient GEMM (async_tensor_model_parallel_allreduce),
#              which Megatron-DeepSpeed and torchtitan do not
#   deepspeed  zero_optimization.reduce_scatter (default true) for ZeRO-1/2; stage 2 reduces the
#              gradients of every micro-batch as the backward produces them (sharded); the pipeline
#              engine partitions what it sends over the tensor-parallel group (is_pipe_partitioned and
#              is_grad_partitioned = model parallel, deepspeed/runtime/pipe/engine.py: each rank sends
#              1/tp as a PartitionedTensor, the receiver all-gathers it); autograd accumulates gradients
#              (no fusion)
#   torchtitan FSDP2 and torch.distributed.pipelining, like parplan's runtime; eager unless
#              training.compile; torch's context parallelism (overlap_cp_comm, its default all-gather
#              rotation hiding behind the rank's own chunk of the attention only: cp_overlap_local_chunk_only);
#              tensor parallelism always with sequence parallelism (its TP plan runs the norms under
#              SequenceParallel: Pins.sp_with_tp)
#   fsdp       PyTorch FSDP (FULL_SHARD = ZeRO 3, or DDP) over an eager torch model, with Megatron-style tensor
#              parallelism and no sequence parallelism, pipeline or context parallelism: metaseq (OPT),
#              llm-foundry under Composer (MPT), Accelerate.  Modelled as torchtitan's FSDP2 otherwise
#              (zero3_fsdp2: FSDP1's flat parameters are gathered and freed per block alike)
# DeepSpeed also differs in what no flag names (TrainingConsts: zero3_one_weight_ahead,
# p2p_blocking_transfers, offload_grads_via_host); parplan's runtime keeps fused-kernel memory uncompiled (TrainingConsts.eager_saves_more).
# Pipeline schedules each framework runs (the search only offers these): Megatron-LM's 1F1B and
# interleaved 1F1B; DeepSpeed's pipeline engine (TrainSchedule, non-interleaved 1F1B);
# torch.distributed.pipelining (parplan's runtime, torchtitan) has all five.
# Frameworks built on torch.distributed.pipelining and FSDP2, whose memory differs from Megatron's and
# DeepSpeed's (TrainingConsts: zero3_fsdp2, p2p_buffers_per_microbatch); torchtitan's DTensor sequence
# parallelism also keeps the gathered matmul inputs (sp_saves_gathered_input).
TORCH_PIPELINING = ("parplan", "torchtitan")
# Frameworks whose ZeRO-3 is torch's FSDP (TrainingConsts.zero3_fsdp2)
TORCH_FSDP = TORCH_PIPELINING + ("fsdp",)
FRAMEWORK_SCHEDULES: dict[str, tuple[str, ...] | None] = {
    "parplan": None, "torchtitan": None, "megatron": ("1f1b", "interleaved-1f1b"), "deepspeed": ("1f1b",),
    "fsdp": ("1f1b",)}
# The framework each `parplan export --to` format's runs are predicted with (`recommend --framework`)
FORMAT_FRAMEWORK: dict[str, str] = {"megatron": "megatron", "megatron-bridge": "megatron", "torchtitan": "torchtitan",
                                    "torchtitan-0.2": "torchtitan", "deepspeed": "deepspeed", "llm-foundry": "fsdp"}
# Parallel dimensions a framework does not have (Pins.lacks): they stay 1 (sp: off)
FRAMEWORK_LACKS: dict[str, tuple[str, ...]] = {"fsdp": ("pp", "cp", "sp")}
# Recompute modes each framework runs: selective-op is torchtitan's op-level selective activation
# checkpointing (parplan's runtime runs the same policy); Megatron-LM and DeepSpeed have no such mode.
FRAMEWORK_RECOMPUTES: dict[str, tuple[str, ...] | None] = {
    "parplan": None, "torchtitan": None, "megatron": ("none", "selective", "full"), "deepspeed": ("none", "selective", "full"),
    "fsdp": ("none", "full")}  # FSDP's checkpoint wrapper around whole blocks (metaseq, llm-foundry)
# Frameworks that recompute some blocks of each stage whole and keep the others' activations (Layout.recompute_layers):
# Megatron-LM's --recompute-method block --recompute-num-layers N, and parplan's runtime (StageModule's
# recompute_layers); an unpinned recompute also searches the fewest such blocks that fit
# (search.partial_recompute_candidates); and torchtitan since 2026-12-07, its layer-level selective checkpointing
# (selective_ac_option a number f: every f-th block whole), on stages of one size and the counts a frequency gives
# (layout.titan_layer_sac_counts; search.Pins.titan_layer_sac)
PARTIAL_RECOMPUTE_FRAMEWORKS = ("megatron", "parplan", "torchtitan")
# ...and the schedules it is predicted under (the zero-bubble schedules' bubble is not linear in the blocks' mix)
PARTIAL_RECOMPUTE_SCHEDULES = "partial recompute is predicted for gpipe, 1f1b and interleaved-1f1b"
# ZeRO stages each framework runs: torchtitan replicates (DDP, data_parallel_replicate_degree) or shards
# everything (FSDP2, data_parallel_shard_degree); it has no optimizer-only or gradient sharding.  fsdp: NO_SHARD
# (DDP) or FULL_SHARD; FSDP's SHARD_GRAD_OP is not modelled.
FRAMEWORK_ZEROS: dict[str, tuple[int, ...] | None] = {"parplan": None, "torchtitan": (0, 3), "megatron": None,
                                                       "deepspeed": None, "fsdp": (0, 3)}
# Frameworks with ZeRO-3's hybrid sharding (Parallel.dp_replicate; TrainingConsts.hsdp): parplan's runtime and
# torchtitan, FSDP2 over a (replicate, shard) mesh (torchtitan's data_parallel_replicate_degree x
# data_parallel_shard_degree; parallel_layers.mesh.fsdp_mesh), and FSDP1's HYBRID_SHARD (llm-foundry's
# sharding_strategy).  Megatron-LM's version, its distributed optimizer (ZeRO-1) in instances, is planned and searched
# (dp_replicate_problem, TrainingConsts.partial_distopt); DeepSpeed's MiCS is not modelled
HSDP_FRAMEWORKS = ("parplan", "torchtitan", "fsdp")


def dp_replicate_problem(framework: str, r: int, zero: int | None, plan: bool = False) -> tuple[str, str] | None:
    """(message, fix) where dp_replicate r > 1 is not a layout `framework` runs, else None: ZeRO-3's hybrid sharding
    under HSDP_FRAMEWORKS; under Megatron-LM its distributed optimizer (ZeRO-1) in r instances
    (--num-distributed-optimizer-instances: TrainingConsts.partial_distopt): beside context parallelism an instance
    is dp x cp / r ranks (Megatron-Core's intra-partial data-parallel group "with CP"), and a mixture of experts'
    expert-data-parallel group is split the same way (its intra-partial group of edp / r ranks; the schema asks r to
    divide it).  zero None: not pinned."""
    name = "dp_replicate" if plan else "--dp-replicate"
    drop = "set dp_replicate 1" if plan else "drop --dp-replicate"
    if framework == "megatron":
        if zero not in (None, 1):
            return (f"{name} {r} under Megatron-LM is its distributed optimizer in {r} instances "
                    f"(--num-distributed-optimizer-instances), ZeRO-1, and {'zero_stage' if plan else '--zero'} is "
                    f"{zero}", f"use {'zero_stage' if plan else '--zero'} 1, or {name} 1")
    elif framework not in HSDP_FRAMEWORKS:
        return (f"{name} {r}: hybrid sharding is planned for {', '.join(HSDP_FRAMEWORKS)} (FSDP over a replicate x "
                f"shard mesh) and megatron (ZeRO-1's optimizer instances), not {framework}",
                f"use one of those, or {drop}")
    elif zero not in (None, 3):
        return (f"{name} {r} is ZeRO-3's hybrid sharding, and {'zero_stage' if plan else '--zero'} is {zero}",
                f"{'set zero_stage' if plan else 'pin --zero'} 3, or {drop}")
    return None


# Frameworks a mixture of experts (ModelSpec.experts) is planned for: Megatron-Core's MoE layer with the all-to-all
# dispatcher and expert tensor parallelism 1 (cost_models/moe.py), parplan's runtime, whose MoE layer
# (parallel_layers.moe) is built the same way (parplan_moe_problem: what it does not run yet), and torchtitan's with
# expert_tensor_parallel_degree 1 (titan_moe_problem: its ep takes every tp and cp rank and some of dp_shard; the
# experts FSDP2-sharded over the rest, the layout parplan's runtime runs).  DeepSpeed's and FSDP's MoE are not
# modelled.
MOE_FRAMEWORKS = ("megatron", "parplan", "torchtitan")


def titan_ep_problem(ep: int, tp: int | None, cp: int | None, dp: int | None, zero: int | None,
                     dp_replicate: int | None = 1, plan: bool = False) -> tuple[str, str] | None:
    """(problem, fix) where expert parallelism ep is not one torchtitan runs beside tp, cp and dp as parplan models it
    (None where it is), with expert_tensor_parallel_degree 1 (the experts unsplit): torchtitan's ParallelDims (0.2.2,
    torchtitan/distributed/parallel_dims.py) builds its experts' mesh (pp, dp_replicate, efsdp, ep, etp) with efsdp
    = dp_shard x cp x tp / (etp x ep), so ep divides dp_shard x cp x tp (dp_shard: dp / dp_replicate under FSDP,
    ZeRO-3); ep > 1 always FSDP-wraps the experts (parallelize_*: FSDP "if fsdp_enabled or ep_enabled"), so there is
    no DDP (ZeRO-0) beside it; and ep 1 under tp > 1 splits each expert by tensor parallelism (apply_moe_ep_tp's
    TensorParallel, what expert_tensor_parallel_degree = tp does), which parplan does not model.  (Mid-2025 torchtitan
    asked ep % (cp x tp) == 0 too; 0.2.2 does not.)  None (a degree recommend leaves to the search): each rule that
    needs it is not checked here (the search's Pins.titan_expert_mesh keeps only the layouts the rules allow)."""
    flag = (lambda f, p: p) if plan else (lambda f, p: f)
    name = flag("--ep", "ep")
    if ep == 1 and (tp or 1) > 1:
        return (f"{name} 1 with tp {tp} under torchtitan splits each expert by tensor parallelism (apply_moe_ep_tp's "
                "TensorParallel, expert_tensor_parallel_degree = tp), which parplan does not model",
                f"use an {name} above 1 (its expert parallelism then takes the tensor-parallel ranks' tokens), or tp 1")
    if ep > 1 and zero is not None and zero < 3:
        return (f"{name} {ep} with {flag('--zero', 'zero_stage')} {zero} under torchtitan: its experts are FSDP-wrapped "
                "whenever ep > 1 (no DDP beside expert parallelism)", f"use {flag('--zero', 'zero_stage')} 3, or "
                f"{name} 1")
    if None in (tp, cp, dp, zero):
        return None
    shard = dp // max(dp_replicate or 1, 1) if zero >= 3 else 1
    if (shard * cp * tp) % ep:
        return (f"{name} {ep} under torchtitan does not divide dp_shard {shard} x cp {cp} x tp {tp} (ParallelDims: the "
                "experts' mesh is (dp_replicate, efsdp, ep) over those ranks)",
                f"use an {name} that divides {shard * cp * tp}, or a dp_shard it divides")
    return None


def titan_op_sac_modelled(spec: ModelSpec) -> bool:
    """Whether torchtitan's op-level selective checkpointing over this mixture of experts is modelled
    (params.titan_op_sac_matmuls, checked against its own policy: benchmarks/titan_moe_saved/op_sac.py): its qwen3,
    llama4 and deepseek_v3 models' blocks, not gpt_oss's (its biased linears run as aten.addmm, which the list does
    not name, so its every-second-matmul rule runs over other ops)."""
    from .hf_config import checkpoint_differences
    gpt_oss = checkpoint_differences(spec.source)[0] == "gpt_oss" or (spec.name or "").lower().startswith("gpt-oss")
    return spec.is_moe and not gpt_oss


def titan_layer_sac_problem(sizes, vpp: int, n: int, mtp: bool = False) -> tuple[str, str] | None:
    """(what, fix) where torchtitan's layer-level selective checkpointing (selective_ac_option f: every f-th block
    of a rank whole) cannot recompute n blocks of each of these virtual stages (layout.titan_layer_sac_counts), or
    None."""
    from cost_models.layout import titan_layer_sac_counts
    if mtp or len(set(sizes)) > 1:
        return (f"recompute_layers {n} under torchtitan: its layer-level checkpointing (every f-th block) recomputes "
                "the same count in each stage only where the stages are of one size (these hold "
                f"{', '.join(map(str, sizes))} blocks)", "drop recompute_layers, or split the blocks evenly")
    counts = titan_layer_sac_counts(sizes[0], vpp)
    if n not in counts:
        return (f"recompute_layers {n} under torchtitan: its layer-level checkpointing (every f-th block) recomputes "
                f"{', '.join(map(str, counts)) or 'no share'} of a stage of {sizes[0]} blocks"
                + (f" at vpp {vpp}" if vpp > 1 else ""), "give one of those, or drop recompute_layers")
    return None


def titan_moe_problem(dispatcher: str, moe_recompute: str, fp8: bool, recompute: str | None,
                      plan: bool = False, ep: int | None = None, op_sac: bool = False) -> tuple[str, str] | None:
    """(problem, fix) where torchtitan's MoE is asked of what parplan does not model for it (None where it is
    modelled): Megatron-LM's MoE recompute modules (torchtitan has none), FP8 (torchtitan's float8 converter leaves
    its grouped experts in 16 bits but for a prototype grouped GEMM, which the cost model's FP8 linears do not
    describe) and its selective recompute, the op-level policy, where titan_op_sac_modelled is not (op_sac)."""
    flag = (lambda f, p: p) if plan else (lambda f, p: f)
    other = "or --framework megatron or parplan"
    if moe_recompute != "none":
        return (f"{flag('--moe-recompute', 'training.moe_recompute')} {moe_recompute} is Megatron-LM's "
                "--recompute-modules, which torchtitan does not have", f"drop it (none), {other}")
    if fp8:
        return ("fp8 with a mixture of experts under torchtitan: its float8 converter leaves the grouped experts in "
                "16 bits (but for a prototype FP8 grouped GEMM), which parplan does not model", f"drop fp8, {other}")
    if recompute == "selective" or (recompute == "selective-op" and not op_sac):
        # (selective is exported to torchtitan as its op-level policy too: export._torchtitan)
        return (f"recompute {recompute} with a mixture of experts under torchtitan: torchtitan's selective "
                "checkpointing is its op-level save list, modelled for its qwen3, llama4 and deepseek_v3 models' "
                "blocks (not gpt_oss's biased linears)",
                "use recompute full or none" + (", or selective-op" if op_sac else ""))
    # (both dispatchers are torchtitan's: expert_parallel_comm_backend "standard", torch's all-to-all, or "deepep")
    if dispatcher == "deepep" and ep == 1:  # parallelize_*: "DeepEP requires expert parallelism (ep_degree > 1)"
        return (f"{flag('--moe-dispatcher', 'training.moe_dispatcher')} deepep with {flag('--ep', 'ep')} 1: "
                "torchtitan's DeepEP needs expert parallelism (\"DeepEP requires expert parallelism (ep_degree > 1)\")",
                f"use an {flag('--ep', 'ep')} above 1, or alltoall")
    return None


def parplan_moe_problem(zero: int | None, dispatcher: str, moe_recompute: str, fp8: bool, recompute: str | None,
                        plan: bool = False, dp_replicate: int | None = None) -> tuple[str, str] | None:
    """(problem, fix) where parplan's runtime does not train a mixture of experts so (parallel_layers.moe: experts
    under ZeRO-0, 1, 2 or 3 -- ZeRO-3 the FSDP2 layout torchtitan uses, the experts sharded over their own
    expert-data-parallel group, under hybrid sharding (dp_replicate) each replica group's share of it --,
    torch.distributed's all-to-all, 16-bit or
    fp32 linears, no op-level selective recompute); None where it does.  Megatron-LM's MoE recompute modules
    (moe_recompute act and norm-act: moe_act, layernorm) it runs: the experts' activation output and the pre-MLP
    norm's output rebuilt for the backward (parallel_layers.model.Block); that argument, `zero` (every stage runs) and
    `dp_replicate` (hybrid sharding runs) stay so callers keep one signature.  Checked where parplan plans one
    (moe_problem), where launch runs one (launch.check_runtime_support) and in the runtime itself
    (train.moe_runtime_problem)."""
    flag = (lambda f, p: p) if plan else (lambda f, p: f)
    other = "or --framework megatron (planned, exported: `parplan export --to megatron`)"
    if dispatcher != "alltoall":
        return (f"{flag('--moe-dispatcher', 'training.moe_dispatcher')} {dispatcher}: parplan's runtime dispatches "
                "tokens with torch.distributed's all-to-all", f"use alltoall, {other}")
    if fp8:
        return ("fp8 with a mixture of experts: parplan's runtime runs its experts' GEMMs in 16 bits",
                f"drop fp8, {other}")
    if recompute == "selective-op":
        return ("recompute selective-op with a mixture of experts: torchtitan's op-level policy is not run over "
                "parplan's expert dispatch", "use recompute selective, full or none")
    return None


def moe_problem(spec: ModelSpec, framework: str, ep: int | None, zero: int | None, tp: int | None, sp: bool | None,
                plan: bool = False, dispatcher: str = "alltoall", recompute: str = "none", fp8: bool = False,
                recompute_mode: str | None = None, dp_replicate: int | None = None) -> tuple[str, str] | None:
    """(problem, fix) where a layout cannot be a planned mixture-of-experts one, or an expert parallelism is asked of a
    dense model; named as recommend's flags or (plan) as the plan's fields.  None where it can."""
    name = spec.name or "the model"
    flag = (lambda f, p: p) if plan else (lambda f, p: f)
    if not spec.is_moe:
        if (ep or 1) > 1:
            return (f"{flag('--ep', 'ep')} {ep} is expert parallelism, and {name} is dense (no experts)",
                    f"drop {flag('--ep', 'ep (set it 1)')}")
        if recompute != "none":
            return (f"{flag('--moe-recompute', 'training.moe_recompute')} {recompute} recomputes a mixture of experts' "
                    f"modules, and {name} is dense (no experts)",
                    f"drop {flag('--moe-recompute', 'it (set it none)')}")
        if dispatcher != "alltoall":
            return (f"{flag('--moe-dispatcher', 'training.moe_dispatcher')} {dispatcher} is a mixture of experts' "
                    f"token dispatcher, and {name} is dense (no experts)",
                    f"drop {flag('--moe-dispatcher', 'it (set it alltoall)')}")
        return None
    where = "training.framework" if plan else "--framework"
    if framework not in MOE_FRAMEWORKS:
        return (f"{name} is a mixture of experts ({spec.experts} experts, top {spec.experts_per_token}), planned for "
                f"{', '.join(MOE_FRAMEWORKS)} only (Megatron-Core's MoE layer, parplan's runtime's built as it is, "
                f"torchtitan's with expert_tensor_parallel_degree 1), not {framework}",
                f"set {where} megatron, parplan or torchtitan")
    if ep is not None and ep > 1 and spec.experts % ep:
        return (f"{flag('--ep', 'ep')} {ep} does not divide {name}'s {spec.experts} experts",
                f"pick a divisor of {spec.experts}")
    if zero is not None and zero >= 3 and framework == "megatron":
        return (f"{flag('--zero', 'zero_stage')} {zero} with a mixture of experts is not modelled for Megatron-LM (its "
                "distributed optimizer, ZeRO-1, shards the experts' states over their own data-parallel group)",
                f"use {flag('--zero', 'zero_stage')} 0 or 1, or set {where} parplan (whose runtime runs ZeRO-3 with "
                "experts: FSDP2 shards them over their own data-parallel group, torchtitan's layout)")
    if zero == 2 and framework == "megatron":
        return (f"{flag('--zero', 'zero_stage')} 2 with a mixture of experts: Megatron-LM has no ZeRO-2 (its "
                "distributed optimizer, ZeRO-1, shards the experts' states over their own data-parallel group)",
                f"use {flag('--zero', 'zero_stage')} 0 or 1, or set {where} parplan (whose runtime reduces each "
                "expert's gradient to its owner under ZeRO-2)")
    if framework == "parplan":
        problem = parplan_moe_problem(zero, dispatcher, recompute, fp8, recompute_mode, plan, dp_replicate)
        if problem:
            return problem
    if framework == "torchtitan":
        problem = titan_moe_problem(dispatcher, recompute, fp8, recompute_mode, plan, ep, titan_op_sac_modelled(spec))
        if problem:
            return problem
    if (tp or 1) > 1 and sp is False:
        return (f"{flag('--no-sp', 'sp false')} with tp {tp}: Megatron-LM runs a mixture of experts with tensor "
                "parallelism only beside sequence parallelism (the MoE layer takes each rank's sequence shard)",
                f"{flag('drop --no-sp', 'set sp true')}, or use tp 1")
    return None


def a2a_overlap_problem(spec: ModelSpec, framework: str, pp: int | None = None, vpp: int | None = None,
                        schedule: str | None = None, recompute: str | None = None,
                        plan: bool = False) -> tuple[str, str] | None:
    """(problem, fix) where Training.moe_a2a_overlap (Megatron-Core's --overlap-moe-expert-parallel-comm) is asked of
    what it does not run: a dense model, a framework other than megatron, or (where pinned or planned) a pipeline
    without interleaving or full recompute, which Megatron asserts against (the combined 1F1B schedule runs without a
    pipeline or under interleaved 1F1B, and recomputes no whole layer); None where it runs."""
    flag = (lambda f, p: p) if plan else (lambda f, p: f)
    name = flag("--moe-a2a-overlap", "training.moe_a2a_overlap")
    if not spec.is_moe:
        return (f"{name} overlaps a mixture of experts' all-to-alls, and {spec.name or 'the model'} is dense (no "
                "experts)", f"drop {name}")
    if framework != "megatron":
        return (f"{name} is Megatron-Core's combined 1F1B (--overlap-moe-expert-parallel-comm), not a {framework} "
                "schedule" + (" (parplan's runtime runs its all-to-alls on the critical path)"
                              if framework == "parplan" else ""),
                f"set {flag('--framework', 'training.framework')} megatron, or drop {name}")
    if recompute == "full":
        return (f"{name} with {flag('--recompute', 'recompute')} full: Megatron's combined 1F1B recomputes no whole "
                "layer", f"use {flag('--recompute', 'recompute')} selective or none, or drop {name}")
    if (pp or 1) > 1 and (schedule not in (None, "interleaved-1f1b") or vpp == 1):
        said = [f"{flag('--schedule', 'schedule')} {schedule}" if schedule else "",
                f"{flag('--vpp', 'vpp')} {vpp}" if vpp == 1 else ""]
        return (f"{name} with a pipeline of {pp} stages needs interleaved 1F1B (Megatron's combined 1F1B runs "
                f"without a pipeline or interleaved), not {' with '.join(x for x in said if x)}",
                f"use {flag('--schedule', 'schedule')} interleaved-1f1b with {flag('--vpp', 'vpp')} 2 or more, "
                f"or drop {name}")
    return None


# Frameworks multi-head latent attention (ModelSpec.kv_lora_rank) is planned for: Megatron-Core's MLASelfAttention
# (--multi-latent-attention), whose down projections run duplicated over the tensor-parallel ranks and whose
# latents sequence parallelism gathers (cost_models.compute.layer_gemms, total.block_comm), parplan's runtime
# (parallel_layers.model.MLAttention: the same projections, the latents gathered once; parplan_mla_problem says what
# it does not run), and torchtitan's deepseek_v3, whose TP plan gathers the block input and runs the down
# projections on the whole sequence (ModelDims.mla_input_gathered; titan_mla_problem says what is not modelled);
# DeepSpeed's is not modelled.
MLA_FRAMEWORKS = ("megatron", "parplan", "torchtitan")


def titan_mla_problem(cp: int | None = None, fp8: bool = False, mla_recompute: bool = False,
                      plan: bool = False) -> tuple[str, str] | None:
    """(problem, fix) where torchtitan's multi-head latent attention (its deepseek_v3 model) is asked of what parplan
    does not model or torchtitan 0.2.2 refuses: context parallelism (its deepseek_v3 flavors run FlexAttention, and
    its CP "only supports SDPA attention"), FP8 (its float8 tensor-wise TP "is not tested for deepseekv3", and its
    experts stay 16-bit) and Megatron-LM's mla_up_proj recompute module (torchtitan has none); None otherwise."""
    flag = (lambda f, p: p) if plan else (lambda f, p: f)
    other = "or --framework megatron"
    if (cp or 1) > 1:
        return (f"{flag('--cp', 'cp')} {cp} with multi-head latent attention under torchtitan: its deepseek_v3 flavors "
                "run FlexAttention, and its context parallelism \"only supports SDPA attention\"",
                f"use {flag('--cp', 'cp')} 1, {other}")
    if fp8:
        return ("fp8 with multi-head latent attention under torchtitan: its float8 tensor-wise TP \"is not tested for "
                "deepseekv3\" and parplan does not model its FP8 there", f"drop fp8, {other}")
    if mla_recompute:
        return (f"{flag('--mla-recompute', 'training.mla_recompute')} is Megatron-LM's mla_up_proj recompute module, "
                "which torchtitan does not have", f"drop it, {other}")
    return None


def parplan_mla_problem(cp: int | None = None, fp8: bool = False, mla_recompute: bool = False,
                        plan: bool = False, documents: bool = False) -> tuple[str, str] | None:
    """(problem, fix) where parplan's runtime does not train multi-head latent attention so (parallel_layers.model.
    MLAttention: 16-bit or fp32 linears; context parallelism, since the fifty-second session, but not beside
    mla_recompute); None where it does.  mla_recompute (Megatron-LM's --recompute-modules mla_up_proj) it runs without
    context parallelism: the attention kernel's q, k and v rebuilt from the latents for its backward, or under
    selective recompute the up projections inside the core's checkpoint (cost_models.memory.
    parplan_mla_up_saved_bytes).  Checked where parplan plans one
    (mla_problem), where launch runs one (launch.check_runtime_support) and in the runtime itself
    (train.mla_runtime_problem)."""
    flag = (lambda f, p: p) if plan else (lambda f, p: f)
    other = "or --framework megatron (planned, exported: `parplan export --to megatron`)"
    if (cp or 1) > 1 and mla_recompute:
        return (f"{flag('--cp', 'cp')} {cp} with {flag('--mla-recompute', 'training.mla_recompute')}: parplan's "
                "runtime rebuilds multi-head latent attention's up projections without context parallelism only",
                f"use {flag('--cp', 'cp')} 1, drop {flag('--mla-recompute', 'mla_recompute')}, {other}")
    if fp8:
        return ("fp8 with multi-head latent attention: parplan's runtime runs its projections in 16 bits",
                f"drop fp8, {other}")
    if documents:  # (its MLAttention attends causally over the whole sequence: parallel_layers.window is not in it)
        return (f"{flag('--document-length', 'training.document_length')} with multi-head latent attention: parplan's "
                "runtime attends across packed documents there", f"drop {flag('--document-length', 'it')}, {other}")
    return None


def parplan_parallel_block_problem(recompute: str | None, dropout: bool, plan: bool = False) -> tuple[str, str] | None:
    """(problem, fix) where parplan's runtime does not train attention and MLP side by side (ModelSpec.parallel_block;
    parallel_layers.model.Block._parallel_forward) so: not under torchtitan's op-level selective recompute (its policy
    is not modelled over the block's one reduction), nor with dropout (the block's one hidden mask, where the model
    counts two); None where it does.  Checked where parplan plans one (recommend, evaluate) and where launch runs one."""
    flag = (lambda f, p: p) if plan else (lambda f, p: f)
    if recompute == "selective-op":
        return (f"{flag('--recompute', 'recompute')} selective-op with parallel_block: torchtitan's op-level policy is "
                "not modelled over parplan's parallel block", "use recompute selective, full or none")
    if dropout:
        return (f"{flag('--dropout', 'training.dropout')} with parallel_block: parplan's runtime does not train a "
                "parallel block with dropout", f"drop {flag('--dropout', 'dropout')}")
    return None


def mla_problem(spec: ModelSpec, framework: str, plan: bool = False, mla_recompute: bool = False,
                cp: int | None = None, fp8: bool = False, documents: bool = False) -> tuple[str, str] | None:
    """(problem, fix) where multi-head latent attention is asked of a framework it is not planned for, or of parplan's
    runtime in a way it does not run (parplan_mla_problem: pass the plan's or the pins' cp and fp8); None where the
    model has none or the framework runs it."""
    if spec.kv_lora_rank is None and mla_recompute:
        where = "training.mla_recompute" if plan else "--mla-recompute"
        return (f"{where} recomputes multi-head latent attention's up projections, and {spec.name or 'the model'} has "
                "none (no kv_lora_rank)", f"drop {where}")
    if spec.kv_lora_rank is None:
        return None
    if framework == "parplan":
        return parplan_mla_problem(cp, fp8, mla_recompute, plan, documents)
    if framework == "torchtitan" and not spec.is_moe:
        where = "training.framework" if plan else "--framework"
        return (f"{spec.name or 'the model'} has multi-head latent attention without experts: torchtitan builds it "
                "in its deepseek_v3 mixture of experts only, planned so", f"set {where} megatron or parplan")
    if framework == "torchtitan":
        return titan_mla_problem(cp, fp8, mla_recompute, plan)
    if framework in MLA_FRAMEWORKS:
        return None
    where = "training.framework" if plan else "--framework"
    fix = f"set {where} megatron (then `parplan export --to megatron` writes its arguments), parplan or torchtitan"
    return (f"{spec.name or 'the model'} has multi-head latent attention (kv_lora_rank {spec.kv_lora_rank}), planned "
            f"for {', '.join(MLA_FRAMEWORKS)} only (Megatron-Core's MLASelfAttention, parplan's runtime, torchtitan's "
            f"deepseek_v3), not {framework}", fix)


# Frameworks multi-token prediction (ModelSpec.mtp_layers) is planned for: Megatron-Core's MultiTokenPredictionBlock
# (--mtp-num-layers) on the last pipeline stage (cost_models.layout.model_rank_block_counts)
MTP_FRAMEWORKS = ("megatron",)


def mtp_problem(spec: ModelSpec, framework: str, plan: bool = False) -> tuple[str, str] | None:
    """(problem, fix) where multi-token prediction is asked of a framework it is not planned for; None otherwise."""
    if not spec.mtp_layers or framework in MTP_FRAMEWORKS:
        return None
    where = "training.framework" if plan else "--framework"
    return (f"multi-token prediction ({'model.mtp_layers' if plan else '--mtp-layers'} {spec.mtp_layers}) is planned "
            f"for {' and '.join(MTP_FRAMEWORKS)} only (Megatron-Core's --mtp-num-layers), not {framework}",
            f"set {where} megatron, or drop {'model.mtp_layers' if plan else '--mtp-layers'}")


# What an unpinned search offers where a pin may still ask for more: Megatron-LM's distributed optimizer is ZeRO-1
# (gradients reduce-scattered into a full-size buffer), so its ZeRO-2 plan is the ZeRO-1 plan twice over, unless a
# caller pins a per-micro-batch ZeRO-2 (validate's Llama 3 rows, whose stack is Meta's own)
FRAMEWORK_SEARCHED_ZEROS: dict[str, tuple[int, ...]] = {"megatron": (0, 1, 3)}
FRAMEWORK_DEFAULTS: dict[str, dict] = {
    # parplan's runtime starts the data-parallel reduction of each bucket of gradients during the step's last
    # backward (ZeRO 0-2, data_parallel.GradReduction; since 2026-11-24, before which it all ran after the backward),
    # outside torch's own zero-bubble weight pass (compute.grad_reduce_overlaps; since 2026-11-25 the queued weight
    # pass tells the reduction when a weight's gradient is final), and ZeRO-1/2 broadcast the
    # stepped parameters asynchronously, each part's waited for before the next forward uses it
    # (data_parallel.ShardedAdamW.wait_for): overlap_param_gather as overlap_grad_reduce.  Its linears'
    # weight-gradient GEMMs add into the fp32 main_grad on CUDA (torch >= 2.8; precision.wgrad_fusion_kernel)
    # where the recipe is master-weights, outside FSDP2 (compute.wgrad_fusion_applies; under the zero-bubble schedules
    # in its queued weight pass, layers.WeightGradStore)
    # Its loss keeps the logits and their gradient in their own dtype (layers.fused_vocab_parallel_cross_entropy,
    # flash-attn's cross-entropy in torch) where the plan says so: its default since 2026-11-24.
    "parplan": {"overlap_grad_reduce": True, "grad_accumulation_fusion": True, "fused_cross_entropy": True,
                "cross_entropy_16bit_grad": True},
    "megatron": {"grad_accumulation_fusion": True, "p2p_scatter_gather": True, "zero1_grad_reduce": "reduce-scatter",
                 "fused_cross_entropy": True, "overlap_cp_comm": True},
    # Megatron-DeepSpeed turns the asynchronous input-gradient all-reduce off by default
    "deepspeed": {"zero1_grad_reduce": "reduce-scatter", "zero2_grad_reduce": "per-micro-batch",
                  "p2p_scatter_gather": True, "fused_cross_entropy": True, "overlap_cp_comm": True,
                  "async_tp_grad_comm": False},
    # torchtitan's training.compile defaults to false; its context parallelism is torch's (asynchronous gather);
    # its DTensor tensor parallelism reduces the input gradient where the layout changes, after the matmuls
    "torchtitan": {"fused_elementwise": False, "overlap_cp_comm": True, "async_tp_grad_comm": False},
    # FSDP over an eager model; fairscale's and metaseq's ColumnParallelLinear all-reduce the input gradient in
    # its backward, before the weight-gradient GEMM
    "fsdp": {"fused_elementwise": False, "async_tp_grad_comm": False},
}


def _framework_choices(pins: Pins, axis: str, offered: tuple[str, ...] | None, why: str, instead: str) -> Pins:
    """Limit an axis (schedule, recompute) to what the framework runs: a pin outside it is an error, an
    unpinned axis searches only those (Pins.schedules / Pins.recomputes)."""
    if not offered:
        return pins
    pinned = getattr(pins, axis)
    if pinned is None:
        return replace(pins, **{axis + "s": offered})
    if pinned not in offered:
        raise PlannerError(f"--{axis} {pinned} {why}; use one of {', '.join(map(str, offered))}, or {instead}")
    return pins


def _lack_names(lacks: tuple[str, ...]) -> str:
    words = {"pp": "pipeline parallelism", "cp": "context parallelism", "sp": "sequence parallelism"}
    named = [words[a] for a in lacks]
    return ", ".join(named[:-1]) + (" or " if len(named) > 1 else "") + named[-1]


def compute_dtype(dtype: str, precision: str) -> str:
    """What the matmuls run in and the saved activations are stored in: fp32 under the fp32 recipe (parplan's
    runtime autocasts nothing there, parallel_layers.train.autocast_dtype; Megatron-LM without --bf16/--fp16
    and DeepSpeed without a bf16/fp16 section alike), else the plan's 16-bit dtype.  The runtime's MFU takes
    the same peak (parallel_layers.train.peak_tflops_per_gpu)."""
    return "fp32" if precision == "fp32" else dtype


# Frameworks that train a model's sliding-window attention (ModelSpec.sliding_window): Megatron-LM's --window-size
# and --window-attn-skip-freq, run by Transformer Engine's flash kernels, which skip the tiles outside the band, and
# parplan's runtime (parallel_layers.window: FlexAttention under a block mask of the band on a GPU, which skips them
# too).  torchtitan's llama and Megatron-DeepSpeed attend over the whole causal prefix.
WINDOW_FRAMEWORKS = ("megatron", "parplan")
# torchtitan's gpt_oss model (torchtitan/models/gpt_oss: the flavors of gpt-oss-20b's and -120b's shapes, which its
# export picks for those shapes) attends its even blocks (layer_id % 2 == 0) within the window through FlexAttention
# under a sliding-window block mask; its llama and other MoE models over the whole prefix
TITAN_WINDOW_PRESETS = ("gpt-oss-20b", "gpt-oss-120b")
# the shape a torchtitan MoE flavor is matched by (planner.export._titan_moe_model)
MOE_SHAPE = ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden", "vocab", "experts", "experts_per_token",
             "shared_expert_ffn", "first_dense_layers", "moe_layer_step", "dense_ffn_hidden", "tied_embeddings",
             "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim")


@lru_cache(maxsize=None)
def preset_moe_shape(name: str) -> tuple:
    from .models import load_preset
    spec = load_preset(name)
    return tuple(getattr(spec, k) for k in MOE_SHAPE)


def trains_window(spec: ModelSpec, framework: str) -> bool:
    """Whether the framework trains the model's sliding window (WINDOW_FRAMEWORKS, and torchtitan for gpt-oss's shapes:
    TITAN_WINDOW_PRESETS); elsewhere it attends over the whole prefix and is predicted so."""
    if framework in WINDOW_FRAMEWORKS:
        return True
    if framework != "torchtitan" or not spec.experts or not spec.sliding_window:
        return False
    shape = tuple(getattr(spec, k) for k in MOE_SHAPE)
    return any(preset_moe_shape(name) == shape for name in TITAN_WINDOW_PRESETS)


# Frameworks that skip attention across packed documents (Training.document_length): parplan's runtime (FlexAttention
# under the documents' block mask on a GPU: parallel_layers.window) and torchtitan (FlexAttention with its
# block_causal mask).  Megatron-LM's --reset-attention-mask builds a dense mask its fused kernels compute whole, and
# DeepSpeed's GPT the same: full causal attention there.
DOCUMENT_FRAMEWORKS = ("parplan", "torchtitan")
# Frameworks that train chunked attention (ModelSpec.attention_chunk: Llama 4's): parplan's runtime (parallel_layers.
# window's segment masks).  torchtitan's llama4 flavors without _irope (the ones its export picks) and Megatron-LM
# attend over the whole prefix.
CHUNK_FRAMEWORKS = ("parplan",)


def model_dims(spec: ModelSpec, seq_len: int, framework: str, document_length: int | None = None) -> ModelDims:
    """The model as the framework trains it: its sliding window only where the framework applies one; packed
    documents (Training.document_length) only where it skips the attention across them."""
    m = ModelDims.from_spec(spec, seq_len)
    if document_length and framework in DOCUMENT_FRAMEWORKS:
        m = replace(m, document=document_length)
    if framework == "parplan" and m.kv_lora:  # its MLAttention pads the values to head_dim (ModelDims.v_padded)
        m = replace(m, v_padded=True)
    if framework == "parplan" and m.qk_norm:  # its selective checkpoint re-runs the q/k norms (ModelDims)
        m = replace(m, qk_norm_recomputed=True)
    if framework != "parplan" and m.parallel_block:  # the others build sequential blocks (ModelSpec.parallel_block)
        m = replace(m, parallel_block=False)
    if framework not in CHUNK_FRAMEWORKS and m.chunk:  # (ModelSpec.attention_chunk: full causal attention there)
        m = replace(m, chunk=0, chunked_layers=0)
    if framework == "torchtitan" and m.kv_lora:  # its deepseek_v3 gathers the block input (ModelDims.mla_input_gathered)
        m = replace(m, mla_input_gathered=True)
    if framework == "torchtitan" and m.moe:  # its MoE layer saves its own tensors (ModelDims.titan_moe)
        m = replace(m, titan_moe=True)
    return m if trains_window(spec, framework) else replace(m, window=0, windowed_layers=0)


def training_consts(tr: Training) -> TrainingConsts:
    return TrainingConsts(global_batch_size=tr.global_batch_size, dtype=compute_dtype(tr.dtype, tr.precision),
                          precision=tr.precision,
                          flash_attention=tr.flash_attention, overlap_grad_reduce=tr.overlap_grad_reduce,
                          overlap_param_gather=plan_overlaps_param_gather(tr),
                          overlap_tp_comm=tr.overlap_tp_comm, dropout=tr.dropout,
                          zero1_all_reduce=tr.zero1_grad_reduce == "all-reduce",
                          zero2_each_microbatch=tr.zero2_grad_reduce == "per-micro-batch",
                          zero3_fsdp2=tr.framework in TORCH_FSDP,
                          zero3_gather_copy_out=tr.framework in TORCH_PIPELINING,
                          ddp_bucket_copy=tr.framework in ("torchtitan", "fsdp"),
                          ddp_reduces_each_microbatch=tr.framework == "torchtitan",
                          flat_grad_buckets=tr.framework == "parplan",
                          zero3_one_weight_ahead=tr.framework == "deepspeed",
                          ds_reduce_bucket_elements=zero3.REDUCE_BUCKET_ELEMENTS if tr.framework == "deepspeed" else 0.0,
                          ds_step_sub_group_elements=zero3.SUB_GROUP_ELEMENTS if tr.framework == "deepspeed" else 0.0,
                          offload_grads_via_host=tr.framework == "deepspeed",
                          p2p_blocking_transfers=tr.framework == "deepspeed",
                          p2p_buffers_per_microbatch=tr.framework == "torchtitan",  # parplan: just_in_time_receives
                          p2p_sends_held_to_step_end=tr.framework in TORCH_PIPELINING,
                          p2p_output_sends_released=tr.framework == "parplan",
                          pipeline_keeps_logits={"parplan": "to-grad",
                                                 "torchtitan": "to-stage-end"}.get(tr.framework, ""),
                          torch_1f1b_needs_m_ge_p=tr.framework in TORCH_PIPELINING,
                          interleaved_torch_rounds=tr.framework in TORCH_PIPELINING,
                          sp_saves_gathered_input=tr.framework == "torchtitan",
                          moe_input_gathered=tr.framework == "torchtitan",
                          cp_saves_gathered_kv=tr.framework == "parplan",
                          grad_accumulation_fusion=tr.grad_accumulation_fusion,
                          wgrad_fusion_16bit_grads=tr.framework == "megatron",
                          p2p_scatter_gather=tr.p2p_scatter_gather, fused_cross_entropy=tr.fused_cross_entropy,
                          cross_entropy_16bit_grad=tr.cross_entropy_16bit_grad,
                          fused_elementwise=tr.fused_elementwise, overlap_cp_comm=tr.overlap_cp_comm,
                          async_tp_grad_comm=tr.async_tp_grad_comm, attention_kernel=tr.attention_kernel,
                          clip_grad=tr.clip_grad is not None, clip_scales_always=tr.framework != "megatron",
                          eager_runtime="parplan" if tr.framework == "parplan" else "torchtitan",
                          cp_overlap_local_chunk_only=tr.framework == "torchtitan",
                          zero_over_cp=tr.framework != "parplan", ce_eager_chunks=tr.framework == "parplan",
                          zb_weight_grad_store=tr.framework == "parplan",
                          fp8=FP8_FRAMEWORKS.get(tr.framework, "") if tr.fp8 else "",
                          moe_dispatcher=tr.moe_dispatcher, moe_recompute=tr.moe_recompute,
                          moe_a2a_overlap=tr.moe_a2a_overlap, mla_recompute=tr.mla_recompute, hsdp=tr.framework in HSDP_FRAMEWORKS,
                          partial_distopt=tr.framework == "megatron",
                          hsdp_holds_reduce_input=tr.framework in TORCH_PIPELINING)  # FSDP2 (fsdp: FSDP1)


def hardware_constants(profile, hw_ref: HardwareRef, dtype: str, fp8: bool = False):
    try:
        return constants_from_profile(profile, dtype, hw_ref.gpus_per_node, hw_ref.inter_node_gbytes_per_s,
                                      hw_ref.aggregate_nics, fp8)
    except ValueError as e:
        raise PlannerError(str(e)) from None


def layout_from_parallel(p: Parallel, micro_batch_size: int, gpus: int) -> Layout:
    return Layout(gpus=gpus, tp=p.tp, pp=p.pp, dp=p.dp, cp=p.cp, vpp=p.vpp, mbs=micro_batch_size,
                  zero=p.zero_stage, recompute=RECOMPUTE.index(p.recompute), sp=int(p.sp),
                  schedule=SCHEDULES.index(p.schedule), offload=OFFLOADS.index(p.offload),
                  recompute_layers=p.recompute_layers or 0, dp_replicate=p.dp_replicate, ep=p.ep)


def _f(x) -> float:
    return float(np.asarray(x).reshape(-1)[0])


def _by_stage(g) -> dict[str, float] | None:
    """The memory totals of the pipeline rank kinds the plan has (None without a pipeline)."""
    out = {name: g(key) for name, key in (("first", "mem_first"), ("middle", "mem_mid"), ("last", "mem_last"))
           if np.isfinite(g(key))}
    return out if len(out) > 1 else None


def prediction_from_metrics(met: dict, i: int, hw, reason: str | None, tokens: float | None,
                            gpus: int) -> Prediction:
    g = (lambda k: float(np.asarray(met[k]).reshape(-1)[i]))
    step = g("step_time_s")
    warnings = []
    if g("block_host_s") > g("block_gpu_s"):
        warnings.append(f"launch-bound: the host needs {g('block_host_s') * 1e3:.2f} ms to dispatch a block that runs "
                        f"{g('block_gpu_s') * 1e3:.2f} ms on the GPU (profile's host_block_s), so the step time "
                        "follows this host's CPU: on H100 machines of one kind, launch-bound runs of one plan varied up "
                        "to 1.30x and the dispatch per block up to 1.9x between machines (benchmarks/results/"
                        "2026-11-23-h100/accuracy.md); `parplan calibrate` on the machine that runs it measures its "
                        "host, and a larger micro-batch hides it")
    if float(hw.sustained) >= 1.0 and not hw.sustained_measured:  # a refit or a measured 1.0 is calibrated
        warnings.append(f"uncalibrated: {hw.name}'s matmul curve is isolated-kernel throughput with no sustained "
                        "fraction fitted to training runs (0.92 on A100 and 0.83 on H100, where published runs fit "
                        "them), so the step time is likely optimistic")
    if hw.test_only:
        warnings.append(f"test-only profile: {hw.name} holds a CPU self-calibration (`parplan calibrate` on a CPU), "
                        "made to test the tool: its numbers describe no GPU; plan real runs with a GPU's profile")
    days = gpu_hours = None
    if tokens:
        # Narayanan 2021 eq. 4 (time = 8 T P / (n X)) made exact: steps x predicted step time.
        seconds = tokens / g("tokens_per_s")
        days = seconds / 86400
        gpu_hours = seconds * gpus / 3600
    return Prediction(
        memory_bytes_per_gpu=MemoryBreakdown(
            weights=g("mem_weights"), grads=g("mem_grads"), optimizer=g("mem_optimizer"),
            activations=g("mem_activations"), other=g("mem_other"), total=g("mem_total"),
            offloaded=g("mem_offloaded"), by_stage=_by_stage(g), peak_moment=PEAK_MOMENTS[int(g("mem_moment"))]),
        time_breakdown=TimeBreakdown(compute_s=g("compute_s"), tp_comm_s=g("tp_comm_s"), pp_comm_s=g("pp_comm_s"),
                                     dp_comm_s=g("dp_comm_s"), cp_comm_s=g("cp_comm_s"), ep_comm_s=g("ep_comm_s"),
                                     bubble_s=g("bubble_s"),
                                     optimizer_s=g("optimizer_s"), attention_s=g("attention_s"),
                                     fp8_cast_s=g("fp8_cast_s") or None),  # 0 without FP8
        step_time_s=step, tokens_per_s=g("tokens_per_s"), model_tflops_per_gpu=g("model_tflops_per_gpu"),
        hardware_tflops_per_gpu=g("hardware_tflops_per_gpu"), mfu=g("mfu"), hfu=g("hfu"),
        bubble_fraction=g("bubble_fraction"),
        comm_bytes_per_step=CommBytes(tp=g("comm_tp_bytes"), pp=g("comm_pp_bytes"), dp=g("comm_dp_bytes"),
                                      cp=g("comm_cp_bytes"), ep=g("comm_ep_bytes")),
        amdahl=Amdahl(parallel_fraction=g("parallel_fraction"), speedup=g("speedup")),
        fits=reason is None, reason=reason, usable_memory_bytes=hw.usable_bytes,
        days_to_train=days, gpu_hours_to_train=gpu_hours, warnings=warnings)


def _offloaded_per_node(met: dict, i: int, hw, lay_row: dict) -> float:
    """Bytes of optimizer state a node's host memory must hold for candidate i (its GPUs' offload)."""
    return float(met["mem_offloaded"][i]) * min(lay_row["gpus"], hw.gpus_per_node)


def _reason_text(code: str, met: dict, i: int, hw, lay_row: dict, gbs: int, tr: TrainingConsts | None = None) -> str:
    gb = 1e9
    if code == "memory":
        return (f"memory: needs {float(met['mem_total'][i]) / gb:.1f} GB per GPU, "
                f"{hw.usable_bytes / gb:.1f} GB usable")
    if code == "host-memory":
        return (f"host-memory: offload needs {_offloaded_per_node(met, i, hw, lay_row) / gb:.0f} GB"
                f" per node, {hw.host_memory_bytes_per_node / gb:.0f} GB available")
    if code == "batch":
        return f"batch: global_batch_size {gbs} is not divisible by dp({lay_row['dp']}) x micro_batch_size({lay_row['mbs']})"
    if code == "schedule":
        if (SCHEDULES[lay_row["schedule"]] in ZERO_BUBBLE and RECOMPUTE[lay_row["recompute"]] in ("full", "selective-op")
                and not (tr is not None and weight_pass_queued(tr, lay_row["zero"]))):
            return f"schedule: {ZB_FULL_RECOMPUTE}"
        if lay_row["vpp"] == 1 and lay_row["pp"] > 1 and gbs // max(lay_row["dp"] * lay_row["mbs"], 1) < lay_row["pp"]:
            return f"schedule: torch's 1F1B needs num_microbatches >= pp({lay_row['pp']})"
        return (f"schedule: interleaving needs num_microbatches divisible by pp({lay_row['pp']}) (torch's interleaved "
                "schedules: by their max(1, num_microbatches // pp) rounds, interleaved-zb at least pp)")
    if code == "layers":
        return f"layers: pp x vpp = {lay_row['pp'] * lay_row['vpp']} virtual stages leave some without a block"
    if code == "seq":
        return (f"seq: seq_len is not divisible by 2 x cp({lay_row['cp']}), or with sequence parallelism "
                f"by cp x tp({lay_row['tp']})")
    if code == "offload":
        return "offload: optimizer offload needs zero_stage >= 1"
    return code


REASON_FIXES = {  # what to change in a plan whose layout breaks a rule (the code before a reason's colon)
    "memory": "more GPUs, a larger tp or pp, ZeRO, recomputation or optimizer offload (`parplan recommend` with the "
              "plan's pins finds one)",
    "host-memory": "more nodes (the offloaded states shard over more data-parallel ranks), or offload none on more "
                   "GPUs",
    "batch": "make global_batch_size a multiple of dp x micro_batch_size",
    "schedule": "more micro-batches (a larger global_batch_size or a smaller micro_batch_size), or schedule gpipe",
    "layers": "fewer virtual stages (a smaller pp or vpp), so every stage holds a block",
    "seq": "make seq_len a multiple of 2 x cp (of cp x tp with sequence parallelism), or a smaller cp or tp, or sp off",
    "offload": "zero_stage 1 or more, or offload none",
    "recompute-layers": "a count torchtitan's layer-level checkpointing gives on the plan's stages, or recompute full",
}
# the schedule rules _reason_text names, each with its own fix (a 1F1B plan is not told "schedule 1f1b")
SCHEDULE_FIXES = (
    ("zero-bubble", "recompute selective or none (on parplan's runtime also zero_stage 2 or less, whose queued weight "
                    "pass allows it), or schedule interleaved-1f1b"),
    ("interleaving needs", "num_microbatches a multiple of pp (global_batch_size / (dp x micro_batch_size)), or vpp 1 "
                           "with schedule 1f1b"),
)


def reason_fix(reason: str | None) -> str | None:
    """The fix for a prediction's reason (Prediction.reason: "code: ..."), or None."""
    code = (reason or "").split(":", 1)[0]
    if code == "schedule":
        return next((fix for key, fix in SCHEDULE_FIXES if key in reason), REASON_FIXES[code])
    return REASON_FIXES.get(code)


def build_plan(spec, hw_ref, training: Training, lay_row: dict, prediction: Prediction | None) -> Plan:
    stages = lay_row["pp"] * lay_row["vpp"]
    m_micro = training.global_batch_size // (lay_row["dp"] * lay_row["mbs"])
    tr = training.model_copy(update={"micro_batch_size": lay_row["mbs"], "num_microbatches": max(m_micro, 1)})
    par = Parallel(tp=lay_row["tp"], pp=lay_row["pp"], dp=lay_row["dp"], cp=lay_row["cp"], vpp=lay_row["vpp"],
                   sp=bool(lay_row["sp"]), zero_stage=lay_row["zero"], recompute=RECOMPUTE[lay_row["recompute"]],
                   schedule=SCHEDULES[lay_row["schedule"]], offload=OFFLOADS[lay_row["offload"]],
                   recompute_layers=lay_row.get("recompute_layers") or None,
                   dp_replicate=int(lay_row.get("dp_replicate") or 1), ep=int(lay_row.get("ep") or 1),
                   stage_layers=lay_row.get("stage_layers") or model_stage_layers(spec.layers, spec.mtp_layers or 0,
                                                                                   stages))
    hw = hw_ref.model_copy(update={"gpus": lay_row["gpus"]})
    if prediction is not None:
        prediction = _with_accuracy(prediction, training, hw_ref.name, spec.is_moe)
    return Plan.model_construct(model=spec, hardware=hw, training=tr, parallel=par, prediction=prediction,
                                search=None, alternatives=[], suggestions=[], schema_version=1)


def _with_accuracy(prediction: Prediction, training: Training, hardware: str | None = None,
                   moe: bool = False) -> Prediction:
    """A plan's prediction as it is shown: with the framework's accuracy lines (the launches on its GPU kind; a
    mixture of experts', the framework's MoE runs: accuracy.group)."""
    from .accuracy import entries, group
    from .schema import Accuracy
    return prediction.model_copy(update={"accuracy": [Accuracy(**e) for e in entries(group(training.framework, moe),
                                                                                   hardware, training.fp8)]})


def defaulted_fields(training: dict, framework: str) -> dict:
    """{field: the value a plan file's training section read by default} for the fields it leaves out whose schema
    default (what a plan written before the field existed meant) is not what `recommend` writes for its framework:
    the recipe, clipping, and the framework's stack (FRAMEWORK_DEFAULTS)."""
    from .schema import Training
    wrote = {"precision": DEFAULT_PRECISION, "clip_grad": DEFAULT_CLIP_GRAD, **FRAMEWORK_DEFAULTS.get(framework, {})}
    schema = Training.model_fields
    return {k: schema[k].default for k, v in wrote.items() if k not in training and schema[k].default != v}


def prediction_differs(old: Prediction, new: Prediction) -> bool:
    """Whether a plan's own prediction is not its layout's (edited after it was predicted, or by another parplan
    version): step time or memory apart by more than rounding."""
    def apart(a, b):
        return abs(a - b) > 1e-6 * max(abs(a), abs(b), 1e-12)
    return (apart(old.step_time_s, new.step_time_s)
            or apart(old.memory_bytes_per_gpu.total, new.memory_bytes_per_gpu.total))


def recommend(model: ModelSpec | str, gpus: int, hardware: str = "h100-sxm-80gb", seq_len: int | None = None,
              global_batch_size: int = DEFAULT_GLOBAL_BATCH, dtype: str = "bf16", precision: str = DEFAULT_PRECISION,
              gpus_per_node: int | None = None, inter_node_gbytes_per_s: float | None = None,
              aggregate_nics: bool | None = None, tokens: float | None = None, objective: str = "throughput", top_k: int = 5,
              pins: Pins | None = None, suggest: bool = True, framework: str = "parplan",
              clip_grad: float | None = DEFAULT_CLIP_GRAD, balance_head: bool = False,
              document_length: int | None = None, **stack) -> Plan:
    """Search the layout space and return the best Plan (alternatives attached).
    `model` is a ModelSpec or a preset name ("llama3-70b").  `stack`: any of STACK_FLAGS, the
    Training fields that describe how the training framework behaves; those not given (or None)
    take the framework's defaults (FRAMEWORK_DEFAULTS), then Training's (parplan's runtime).
    `seq_len` None: 4096, or a learned position table's length where shorter (the CLI's default).
    `balance_head`: the top plans with a pipeline try a lighter head stage (lighten_head_stage; the CLI's default,
    not the published runs' validation, which plans the default split those runs used)
    Raises NothingFits (carrying a Plan with fits=false and suggestions) when no layout fits, PlannerError for input
    that no layout could take (the CLI's exit 2)."""
    if isinstance(model, str):
        from .models import load_preset
        try:
            model = load_preset(model)
        except ValueError as e:
            raise PlannerError(str(e)) from None
    from typing import get_args
    from .schema import Dtype, Objective, job_problem
    for what, value, choices in (("dtype", dtype, get_args(Dtype)), ("precision", precision, tuple(PRECISION_RECIPES)),
                                 ("objective", objective, get_args(Objective))):
        if value not in choices:
            raise PlannerError(f"{what} {value!r} is not one of {', '.join(choices)}")
    # the CLI's default sequence: a learned position table caps it
    limit = model.max_seq_len if model.has_learned_positions else None
    if seq_len is None:
        seq_len = min(DEFAULT_SEQ_LEN, limit) if limit else DEFAULT_SEQ_LEN
    problem = job_problem(model, seq_len, dtype, precision) or fp8_problem(bool(stack.get("fp8")), framework, precision)
    if problem:  # what every plan reader refuses (schema.Plan), said before the search
        raise PlannerError(problem)
    if problem := gpu_count_problem(gpus):
        raise PlannerError(problem)
    pins = pins or Pins()
    _check_pin_types(pins)
    import hardware_profiles
    hardware = hardware_profiles.canonical_name(hardware)  # the plan records the name as shipped
    profile = load_hardware(hardware)
    hw_ref = HardwareRef(name=hardware, gpus=gpus, gpus_per_node=gpus_per_node or profile.gpus_per_node,
                         inter_node_gbytes_per_s=inter_node_gbytes_per_s, aggregate_nics=aggregate_nics)
    spec = with_param_count(model, seq_len)
    unknown = set(stack) - set(STACK_FLAGS)
    if unknown:
        raise TypeError(f"recommend() got unexpected keyword arguments {sorted(unknown)}; stack flags: {STACK_FLAGS}")
    if framework not in FRAMEWORK_DEFAULTS:
        raise PlannerError(f"unknown framework {framework!r}; choose one of: {', '.join(FRAMEWORK_DEFAULTS)}")
    stack = {**FRAMEWORK_DEFAULTS[framework], **{k: v for k, v in stack.items() if v is not None}}
    if spec.is_moe and framework == "parplan":  # the runtime runs MoE blocks eager (parallel_layers.moe: their token
        stack.setdefault("fused_elementwise", False)  # counts are data-dependent shapes), so launch compiles none
    if framework in FRAMEWORK_LACKS:
        lacks = FRAMEWORK_LACKS[framework]
        # pipeline pins (--vpp, a schedule other than plain 1F1B) name the pipeline the framework lacks
        pinned = [(axis, f"--{a} {getattr(pins, a)}") for a, axis in (("pp", "pp"), ("cp", "cp"), ("vpp", "pp"))
                  if axis in lacks and (getattr(pins, a) or 1) > 1]
        pinned += [("pp", f"--schedule {pins.schedule}")] if "pp" in lacks and pins.schedule not in (None, "1f1b") else []
        pinned += [("sp", "--sp")] if "sp" in lacks and pins.sp else []
        if pinned:
            raise PlannerError(f"{' '.join(f for _, f in pinned)}: {framework} has no "
                               f"{_lack_names(tuple(dict.fromkeys(a for a, _ in pinned)))}; drop "
                               f"{' and '.join(f.split()[0] for _, f in pinned)}, or use another --framework "
                               "(torchtitan or megatron)")
        pins = replace(pins, fsdp_native=True, lacks=lacks)
    pins = _framework_choices(pins, "schedule", FRAMEWORK_SCHEDULES[framework],
                              f"is not a {framework} schedule", "another --framework")
    offered = FRAMEWORK_SCHEDULES[framework]
    if (pins.vpp or 1) > 1 and offered is not None and not set(offered) - {"gpipe", "1f1b"}:
        # the search had found no candidate and blamed the model's shape
        raise PlannerError(f"--vpp {pins.vpp}: {framework} runs one model chunk per pipeline rank "
                           f"({', '.join(offered)}); drop --vpp, or use --framework megatron or parplan")
    pins = _framework_choices(pins, "recompute", FRAMEWORK_RECOMPUTES[framework],
                              f"is torchtitan's op-level selective checkpointing, which {framework} does not have"
                              if pins.recompute == "selective-op" else
                              f"is not a {framework} recompute mode (it checkpoints whole blocks or nothing)",
                              "--framework torchtitan or parplan" if pins.recompute == "selective-op" else
                              "--framework megatron, torchtitan or parplan")
    pins = _framework_choices(pins, "zero", FRAMEWORK_ZEROS[framework],
                              f"is not a {framework} data-parallel mode (DDP replicates, FSDP shards everything)",
                              "another --framework")
    if (pins.dp_replicate or 1) > 1:
        problem = dp_replicate_problem(framework, pins.dp_replicate, pins.zero)
        if problem:
            raise PlannerError(*problem)
        # what hybrid sharding is: ZeRO-3 over a replicate x shard mesh, or Megatron's ZeRO-1 optimizer instances
        pins = replace(pins, zero=1 if framework == "megatron" else 3)
    problem = moe_problem(spec, framework, pins.ep, pins.zero, pins.tp, pins.sp,
                          dispatcher=stack.get("moe_dispatcher") or "alltoall",
                          recompute=stack.get("moe_recompute") or "none", fp8=bool(stack.get("fp8")),
                          recompute_mode=pins.recompute, dp_replicate=pins.dp_replicate) \
        or mla_problem(spec, framework, mla_recompute=bool(stack.get("mla_recompute")), cp=pins.cp,
                       fp8=bool(stack.get("fp8")), documents=bool(document_length and seq_len
                                                                 and document_length < seq_len)) \
        or mtp_problem(spec, framework) \
        or (a2a_overlap_problem(spec, framework, pins.pp, pins.vpp, pins.schedule,
                                "full" if pins.recompute_layers else pins.recompute)
            if stack.get("moe_a2a_overlap") else None)
    if problem:
        raise PlannerError(*problem)
    if pins.zero is None and framework in FRAMEWORK_SEARCHED_ZEROS:
        pins = replace(pins, zeros=FRAMEWORK_SEARCHED_ZEROS[framework])
    if spec.is_moe and pins.zero is None:  # moe_problem: ZeRO 0 or 1 under Megatron-LM (the others: their own)
        top = 1 if framework == "megatron" else 3
        pins = replace(pins, zeros=tuple(z for z in (pins.zeros or range(4)) if z <= top))
    if spec.kv_lora_rank is not None and pins.cp is None and (
            framework == "torchtitan" or (framework == "parplan" and stack.get("mla_recompute"))):
        # titan_mla_problem: no cp; parplan_mla_problem: no cp beside mla_recompute
        pins = replace(pins, cp=1)
    if stack.get("moe_a2a_overlap") and pins.recompute is None:  # a2a_overlap_problem: no whole layer recomputed
        pins = replace(pins, recomputes=tuple(r for r in (pins.recomputes or RECOMPUTE) if r != "full"))
    if spec.parallel_block and framework == "parplan":  # parplan_parallel_block_problem: no selective-op, no dropout
        problem = parplan_parallel_block_problem(pins.recompute, bool(stack.get("dropout")))
        if problem:
            raise PlannerError(*problem)
        if pins.recompute is None:
            pins = replace(pins, recomputes=tuple(r for r in (pins.recomputes or RECOMPUTE) if r != "selective-op"))
    if spec.is_moe and framework in ("parplan", "torchtitan") and pins.recompute is None:
        # parplan_moe_problem: no selective-op; titan_moe_problem: no selective, nor selective-op but where modelled
        left_out = (("selective",) + (() if titan_op_sac_modelled(spec) else ("selective-op",))
                    if framework == "torchtitan" else ("selective-op",))
        pins = replace(pins, recomputes=tuple(r for r in (pins.recomputes or RECOMPUTE) if r not in left_out))
    if framework == "torchtitan":  # parallelize_llama: "DDP has not supported > 1D parallelism"
        if pins.zero == 0 and (pins.dp or 1) > 1 and any((getattr(pins, a) or 1) > 1 for a in ("tp", "pp", "cp")):
            raise PlannerError("torchtitan runs DDP (--zero 0 over dp > 1) only without tp, pp or cp (\"DDP has not "
                               "supported > 1D parallelism\"); use --zero 3 (FSDP), or --tp/--pp/--cp 1")
        if pins.zero == 0 and (pins.cp or 1) > 1:  # ParallelDims.fsdp_enabled: dp_shard > 1 or cp > 1
            raise PlannerError("torchtitan shards parameters over cp whenever cp > 1 (FSDP is on), so it has no "
                               "--zero 0 with --cp; use --zero 3")
        if pins.sp is False and (pins.tp or 1) > 1:
            # torchtitan/models/llama3/infra/parallelize.py apply_tp: the norms run under SequenceParallel and the
            # block inputs are Shard(1) whenever tp > 1; there is no switch to turn it off
            raise PlannerError("torchtitan always runs sequence parallelism with tensor parallelism (its TP plan "
                               "shards the norms over the sequence); drop --no-sp, or use --tp 1, or --framework "
                               "megatron or fsdp for tensor parallelism without it")
        pins = replace(pins, fsdp_native=True, ddp_one_dim=True, sp_with_tp=True, titan_expert_mesh=spec.is_moe,
                       ep_above_one=spec.is_moe and stack.get("moe_dispatcher") == "deepep")
        if spec.is_moe and pins.ep is not None:
            # titan_ep_problem's rules the pins alone decide (the search keeps only the layouts they allow)
            problem = titan_ep_problem(pins.ep, pins.tp, pins.cp, pins.dp, pins.zero, pins.dp_replicate)
            if problem:
                raise PlannerError(*problem)
        if precision != "fp32" and dtype != "fp32":
            # torchtitan/distributed/utils.py maybe_enable_amp: mixed precision is FSDP's policy (dp_shard or cp
            # > 1) or autocast for DDP/single-device runs; tp/pp alone train in fp32 ("Mixed precision training
            # with TP or PP is only supported when FSDP/HSDP/CP is enabled")
            split = (pins.tp or 1) * (pins.pp or 1)
            if split > 1 and (split == gpus or (pins.dp == 1 and pins.cp == 1)):
                raise PlannerError(f"torchtitan trains tp/pp without FSDP (dp = cp = 1) in fp32, not {dtype}: its mixed "
                                   "precision is FSDP's; leave GPUs for --dp (with --zero 3) or --cp")
            pins = replace(pins, sixteen_bit_needs_shards=True)
    if pins.schedule in ZERO_BUBBLE and pins.recompute in ("full", "selective-op"):
        # parplan's runtime queues the linears' weight gradients (parallel_layers.layers.WeightGradStore) outside
        # FSDP2; torch's own weight pass re-runs the checkpointed blocks (search.ZB_FULL_RECOMPUTE)
        if framework != "parplan":
            raise PlannerError(f"--schedule {pins.schedule} with --recompute {pins.recompute}: {ZB_FULL_RECOMPUTE}; use "
                               "--recompute selective or none, --schedule interleaved-1f1b, or --framework parplan")
        if pins.zero == 3:
            raise PlannerError(f"--schedule {pins.schedule} with --recompute {pins.recompute} and --zero 3: "
                               f"{ZB_FULL_RECOMPUTE}; use --zero 2 or less, --recompute selective or none, or "
                               "--schedule interleaved-1f1b")
    if pins.recompute_layers is not None:
        if framework not in PARTIAL_RECOMPUTE_FRAMEWORKS:
            raise PlannerError(f"--recompute-layers: {framework} recomputes every block of a stage or none; drop "
                               "--recompute-layers, or use --framework megatron, parplan or torchtitan")
        if pins.recompute not in (None, "full"):
            raise PlannerError(f"--recompute-layers {pins.recompute_layers} recomputes that many blocks of each stage "
                               f"whole, which is full recompute, not --recompute {pins.recompute}; drop one of them")
        if pins.schedule in ZERO_BUBBLE:
            raise PlannerError(f"--recompute-layers with --schedule {pins.schedule}: {PARTIAL_RECOMPUTE_SCHEDULES}; "
                               "drop one of them")
        if framework == "torchtitan" and pins.pp is not None and (pins.vpp is not None or pins.pp == 1):
            vpp = pins.vpp or 1  # the stages are known: name the counts torchtitan gives on them
            problem = titan_layer_sac_problem(model_stage_layers(spec.layers, spec.mtp_layers or 0, pins.pp * vpp), vpp,
                                              pins.recompute_layers, bool(spec.mtp_layers))
            if problem:
                raise PlannerError(f"--{problem[0].replace('recompute_layers', 'recompute-layers', 1)}; "
                                   + problem[1].replace("recompute_layers", "--recompute-layers"))
        pins = replace(pins, recomputes=("full",))  # (recompute itself stays the user's: the suggestions drop N alone)
    elif framework in PARTIAL_RECOMPUTE_FRAMEWORKS and pins.recompute is None and not stack.get("moe_a2a_overlap"):
        pins = replace(pins, partial_recompute=True)
    if framework == "torchtitan":  # its layer-level checkpointing's counts, on stages of one size
        pins = replace(pins, titan_layer_sac=True)
    if framework == "parplan":  # launch's check_runtime_support: FSDP2 offload with SP/cp/tied pp on cuda
        extra = fsdp2_offload_blockers(bool(pins.sp), pins.tp or 1, pins.cp or 1, spec.tied_embeddings, pins.pp or 1,
                                       as_flags=True)
        if pins.zero == 3 and pins.offload == "optimizer" and extra:
            raise PlannerError(f"parplan's runtime has no FSDP2 optimizer offload with {' and '.join(extra)} on a GPU "
                               "(their gradient sums would all-reduce host tensors over NCCL); use --zero 1 or 2 "
                               "with the offload, or drop " + " and ".join(extra))
        pins = replace(pins, fsdp_offload_alone=True)
    if framework == "deepspeed":
        refused = deepspeed_zero_in_pipeline(pins.zero, pins.pp)
        if refused:
            raise PlannerError(f"{refused.replace(' pp ', ' --pp ')}; use --zero 0 or 1, or --pp 1")
        pins = replace(pins, zero_max_with_pp=1)
        if deepspeed_bf16_optimizer(dtype, precision):
            if pins.zero == 0 and (pins.pp or 1) > 1 and ((pins.dp or 1) > 1 or (pins.cp or 1) > 1):
                over = " x ".join(f"{a} {getattr(pins, a)}" for a in ("dp", "cp") if (getattr(pins, a) or 1) > 1)
                raise PlannerError(f"--zero 0 with --pp {pins.pp} over {over} under deepspeed: {DEEPSPEED_BF16_ZERO0}; "
                                   "use --zero 1 --zero1-grad-reduce all-reduce to predict that, --pp 1, or --dtype fp16")
            pins = replace(pins, zero0_single_shard=True)
    training = Training(seq_len=seq_len, global_batch_size=global_batch_size, micro_batch_size=1,
                        num_microbatches=1, dtype=dtype, precision=precision, tokens=tokens, framework=framework,
                        clip_grad=clip_grad, document_length=document_length, **stack)
    hw = hardware_constants(profile, hw_ref, compute_dtype(dtype, precision), training.fp8)
    _check_attention_kernel(profile, training)
    m = model_dims(spec, seq_len, framework, training.document_length)
    tr = training_consts(training)
    _check_pins(spec, gpus, pins, seq_len, up_to=objective == "min-gpus")
    gpu_counts = [gpus] if objective != "min-gpus" else _gpu_counts_up_to(gpus, hw.gpus_per_node, pinned_product(pins))
    balancing = balance_head and framework in HEAD_SPLIT_FRAMEWORKS and objective != "memory"
    # balancing re-ranks a pool of HEAD_SPLIT_POOL plans whatever --top asks for, so the best plan does not depend on it
    pool = max(top_k, HEAD_SPLIT_POOL) if balancing else top_k
    res = run_search(m, tr, hw, gpu_counts, pins, pool, objective)
    if objective == "min-gpus":
        res = _partly_used_last_node(res, m, tr, hw, pins, pool, hw.gpus_per_node)
    info = SearchInfo(candidates=res.candidates, feasible=res.feasible, seconds=round(res.seconds, 4),
                      infeasible_by_reason=res.infeasible_by_reason, unpriced=res.unpriced, objective=objective)
    if res.candidates == 0:
        raise PlannerError(_framework_rule_message(m, tr, gpus, pins, framework)
                           or _no_candidates_message(spec, gpus, pins))
    if res.feasible == 0:
        return _nothing_fits(spec, hw_ref, training, hw, res, info, m, tr, pins, gpus, suggest, tokens)
    splits = [None] * len(res.layout)
    if balancing:
        res, splits = lighten_head_stage(res, m, tr, hw, objective, zero3_counts=not pins.fsdp_native,
                                         empty_stages=framework != "torchtitan", top_k=top_k,
                                         even_partial=pins.titan_layer_sac)
    plans = []
    for i in range(len(res.layout)):
        row = res.layout.row(i)
        pred = prediction_from_metrics(res.metrics, i, hw, None, tokens, row["gpus"])
        plans.append(build_plan(spec, hw_ref, training, {**row, "stage_layers": splits[i]}, pred))
    if profile.nvlink.bridge_gbytes_per_s:
        plans = [with_bridges_said(p, profile) for p in plans]
    best = plans[0]
    best.search = info
    best.alternatives = plans[1:]
    return best


# frameworks that train a split other than the default one as given: parplan's runtime (Parallel.stage_layers),
# Megatron-LM (--decoder-first/last-pipeline-num-layers, --pipeline-model-parallel-layout) and torchtitan (its split
# points); DeepSpeed's PipelineModule partitions by its own rule (partition_method), and fsdp has no pipeline
HEAD_SPLIT_FRAMEWORKS = ("parplan", "megatron", "torchtitan")
# the most blocks lighten_head_stage moves off the head's stage (a 128K-vocabulary output layer and its loss cost
# about two of llama3-8b's blocks, four of a 1B's)
HEAD_SPLIT_MAX = 8
# the search's plans a balanced split is tried on (the top ones, at least --top of them), then ranked again
HEAD_SPLIT_POOL = 20
# a lighter head stage is taken where it predicts at least this much less step time (below it the default split,
# which every framework writes without a flag, stays)
HEAD_SPLIT_GAIN = 0.005


def lighten_head_stage(res, m: ModelDims, tr, hw, objective: str, zero3_counts: bool = True,
                       empty_stages: bool = True, top_k: int | None = None, even_partial: bool = False) -> tuple:
    """The search prices the default split (model_stage_layers: the remainder to the middle stages); the stage holding
    the head (output layer, loss) then runs its blocks and the head.  For each of the search's top plans with a
    pipeline, the splits that count the head as 1 .. HEAD_SPLIT_MAX more blocks of its stage (head_lightened_split)
    are evaluated (ModelDims.split; one evaluation per split for every top plan of the same pp x vpp), each plan
    taking the fastest that fits where it gains HEAD_SPLIT_GAIN; then the plans are ranked again.  empty_stages
    False: no split with a stage of no block (torchtitan's split points cannot express one).  even_partial: a plan
    recomputing some blocks of each stage keeps the default split (torchtitan's layer-level checkpointing gives its
    count only on stages of one size: search.titan_layer_sac_rows).  Returns (res with
    those rows' metrics and the new order, its first top_k rows (all by default), and each kept row's split or
    None)."""
    from .search import SearchResult, infeasibility, sort_key
    n = len(res.layout)
    met = {k: np.array(np.broadcast_to(v, (n,)), copy=True) for k, v in res.metrics.items()}
    splits: list = [None] * n
    pp, vpp = np.asarray(res.layout.pp), np.asarray(res.layout.vpp)
    movable = ~((np.asarray(res.layout.recompute_layers) > 0) & even_partial)
    for stages in sorted({int(p * v) for p, v in zip(pp, vpp) if p > 1}):
        rows = np.flatnonzero((pp > 1) & (pp * vpp == stages) & movable)
        if not len(rows):
            continue
        sub = res.layout.take(rows)
        best = met["step_time_s"][rows].copy()
        last, previous = None, best.copy()
        for lighter in range(1, HEAD_SPLIT_MAX + 1):
            sizes = head_lightened_split(m.layers, m.mtp, stages, lighter)
            if sizes is None or (not empty_stages and min(sizes) == 0):
                break
            if sizes == last:
                continue
            last = sizes
            own = replace(m, split=tuple(sizes))
            with np.errstate(divide="ignore", invalid="ignore"):
                got = evaluate(own, tr, hw, sub)
            got = {k: np.broadcast_to(v, (len(rows),)) for k, v in got.items()}
            step = got["step_time_s"]
            take = (infeasibility(own, tr, hw, sub, got) < 0) & (step < best * (1 - HEAD_SPLIT_GAIN))
            for j in np.flatnonzero(take):
                i = rows[j]
                best[j] = step[j]
                splits[i] = sizes
                for k in met:
                    if k in got:
                        met[k][i] = got[k][j]
            if not np.any(step < previous):  # no plan gained on the split before: the head is light enough
                break
            previous = step
    order = sort_key(objective, res.layout, met, zero3_counts) if any(splits) else np.arange(n)
    order = order[:top_k]
    res = SearchResult(**{**res.__dict__, "layout": res.layout.take(order),
                          "metrics": {k: v[order] for k, v in met.items()}})
    return res, [splits[i] for i in order]


def _partly_used_last_node(res, m, tr, hw, pins, top_k, per_node: int):
    """--objective min-gpus past one node tries whole nodes (_gpu_counts_up_to): where N of them fit (or --gpus, past
    N - 1 of them) and N - 1 did not, the counts between, N - 1 nodes and part of one more, ascending; the first of
    them that fits is the answer (gpt3-175b under DeepSpeed: 15 GPUs, where whole nodes had said 16).  A count below
    N - 1 whole nodes is not tried (one that fits where more GPUs on whole nodes do not is left unfound)."""
    if not res.feasible:
        return res
    best = int(np.asarray(res.layout.gpus)[0])
    if best <= per_node:
        return res
    more = run_search(m, tr, hw, list(range((best - 1) // per_node * per_node + 1, best)), pins, top_k, "min-gpus")
    reasons = {k: res.infeasible_by_reason.get(k, 0) + more.infeasible_by_reason.get(k, 0)
               for k in {**res.infeasible_by_reason, **more.infeasible_by_reason}}
    both = dict(candidates=res.candidates + more.candidates, seconds=res.seconds + more.seconds,
                infeasible_by_reason=reasons, unpriced=res.unpriced + more.unpriced)
    return replace(more, feasible=more.feasible + res.feasible, **both) if more.feasible else replace(res, **both)


def _gpu_counts_up_to(gpus: int, per_node: int, pinned: int = 1) -> list[int]:
    """Ascending GPU counts for --objective min-gpus: every count within a node, every whole node, and --gpus
    itself (the suggestions' scan tries whole nodes too: it had named --gpus 96 for a model this objective put at
    128, when only doubling node counts were tried past 8 nodes).  With pinned degrees that multiply to `pinned`,
    the counts they divide: those of that list, and where `pinned` does not divide a node, every multiple of it
    (--tp 8 --pp 3 takes 24, 48, ...; --gpus is the most, not a count the pins must divide)."""
    counts = set(range(1, per_node + 1)) | {per_node * k for k in range(1, gpus // per_node + 1)} | {gpus}
    if per_node % pinned:
        counts |= {pinned * k for k in range(1, gpus // pinned + 1)}
    return sorted(g for g in counts if g <= gpus and g % pinned == 0)


def gpu_counts_said(gpus: int, per_node: int, pinned: int = 1) -> str:
    """What _gpu_counts_up_to and _partly_used_last_node search, in words (min-gpus' stderr line)."""
    if per_node % pinned:
        return f"every multiple of {pinned}, the pinned degrees' product, up to --gpus {gpus}"
    tried = (f"every count up to a node of {per_node}, then whole nodes up to --gpus {gpus}, and every count of a "
             "last node partly used")
    return tried if pinned == 1 else f"{tried}, where the pinned degrees' product {pinned} divides it"


def pinned_product(pins: Pins) -> int:
    """The product of the pinned tp, pp, dp and cp (1 where none is pinned)."""
    prod = 1
    for name in ("tp", "pp", "dp", "cp"):
        prod *= getattr(pins, name) or 1
    return prod


def gpu_count_problem(gpus) -> str | None:
    """What is wrong with a GPU count given in Python (the CLI's is typed), or None."""
    if isinstance(gpus, bool) or not isinstance(gpus, (int, np.integer)) or gpus < 1:
        return f"gpus must be a positive integer, got {gpus!r}"
    return None


def _check_pin_types(pins: Pins) -> None:
    """A Python caller's Pins of the wrong kind (the CLI's options are typed): one line naming the pin and what it
    takes, where a bad name had surfaced as "tuple.index(x): x not in tuple" from inside the search."""
    for name in ("tp", "pp", "dp", "cp", "mbs", "vpp", "zero", "recompute_layers"):
        v = getattr(pins, name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
            raise PlannerError(f"Pins {name} must be an integer or None, got {v!r}")
    for name, choices in (("recompute", RECOMPUTE), ("schedule", SCHEDULES), ("offload", OFFLOADS)):
        v = getattr(pins, name)
        if v is not None and v not in choices:
            raise PlannerError(f"Pins {name} must be one of {', '.join(choices)} or None, got {v!r}")
    if pins.sp is not None and not isinstance(pins.sp, (bool, np.bool_)):
        raise PlannerError(f"Pins sp must be True, False or None, got {pins.sp!r}")


def _check_pins(spec: ModelSpec, gpus: int, pins: Pins, seq_len: int, up_to: bool = False) -> None:
    """Refuse pins no layout can meet, with the fix.  `up_to` (--objective min-gpus): --gpus is the most GPUs to
    use, so the pins must fit under it, not divide it."""
    def need(ok, msg, fix=None):
        if not ok:
            raise PlannerError(msg, fix)
    for name in ("tp", "pp", "dp", "cp"):
        v = getattr(pins, name)
        if v is not None:
            need(v >= 1, f"--{name} must be a positive integer, got {v}")
            if up_to:
                need(v <= gpus, f"--{name} {v} is more than --gpus {gpus}, the most --objective min-gpus may use",
                     f"raise --gpus to {v} or more")
            else:
                need(gpus % v == 0, f"--{name} {v} does not divide --gpus {gpus}", f"pick a divisor of {gpus}")
    if pins.tp is not None:
        need(spec.heads % pins.tp == 0 and spec.kv_heads % pins.tp == 0,
             f"--tp {pins.tp} must divide heads ({spec.heads}) and kv_heads ({spec.kv_heads})")
        need(spec.ffn_hidden % pins.tp == 0,
             f"--tp {pins.tp} must divide ffn_hidden ({spec.ffn_hidden}): tensor parallelism splits the MLP "
             f"evenly; use --ffn-hidden {-(-spec.ffn_hidden // pins.tp) * pins.tp} or another --tp")
    if pins.pp is not None:
        need(pins.pp <= spec.layers, f"--pp {pins.pp} exceeds the model's {spec.layers} layers")
        need(pins.pp > 1 or pins.schedule in (None, "1f1b"),
             f"--schedule {pins.schedule} with --pp 1: without a pipeline there is nothing to schedule (every "
             "schedule is plain gradient accumulation); drop --schedule, or pin --pp > 1")
    prod = pinned_product(pins)
    need(prod <= gpus, f"pinned degrees multiply to {prod}, more than --gpus {gpus}" + ("" if not up_to else
         ", the most --objective min-gpus may use"), f"raise --gpus to {prod} or " + ("more" if up_to else "lower a pin"))
    need(up_to or gpus % prod == 0, f"pinned degrees multiply to {prod}, which does not divide --gpus {gpus}")
    if pins.mbs is not None:
        need(pins.mbs >= 1, f"--mbs must be >= 1, got {pins.mbs}")
    if pins.vpp is not None:
        need(pins.vpp >= 1, f"--vpp must be >= 1, got {pins.vpp}")
        need(pins.vpp == 1 or pins.pp != 1, f"--vpp {pins.vpp} with --pp 1: virtual stages split each pipeline rank's "
                                            "blocks into chunks, and there is no pipeline; pin --pp > 1, or drop --vpp")
        need(pins.vpp >= 2 or pins.schedule not in ("interleaved-1f1b", "interleaved-zb"),
             f"--schedule {pins.schedule} with --vpp 1: interleaving needs 2 or more model chunks per pipeline rank; "
             "pin --vpp 2 or more, or --schedule 1f1b")
        need(pins.vpp == 2 or pins.schedule != "zbv",
             f"--schedule zbv with --vpp {pins.vpp}: the V-shaped schedule runs exactly 2 chunks per rank; pin --vpp 2 "
             "or drop --vpp")
        need(pins.vpp == 1 or pins.schedule not in ("gpipe", "1f1b"),
             f"--schedule {pins.schedule} with --vpp {pins.vpp}: that schedule runs one chunk per rank; pin --vpp 1, "
             "or --schedule interleaved-1f1b")
    if pins.zero is not None:
        need(0 <= pins.zero <= 3, f"--zero must be 0, 1, 2 or 3, got {pins.zero}")
    if pins.recompute_layers is not None:
        need(1 <= pins.recompute_layers < spec.layers,
             f"--recompute-layers {pins.recompute_layers}: give 1 to {spec.layers - 1} blocks of each stage (the model "
             f"has {spec.layers}; every block is --recompute full)")
    if pins.sp and pins.tp == 1:
        raise PlannerError("--sp needs --tp > 1 (sequence parallelism splits activations over the TP group)")
    if (pins.ep or 1) > 1:  # the expert-parallel ranks are taken from each stage's tp x cp x dp
        e = pins.ep
        need(up_to or gpus % e == 0, f"--ep {e} does not divide --gpus {gpus}", f"pick a divisor of {gpus}")
        if pins.pp is not None and not up_to and gpus % pins.pp == 0:
            need((gpus // pins.pp) % e == 0, f"--ep {e} does not divide the {gpus // pins.pp} GPUs of a pipeline stage "
                 f"(--gpus {gpus} / --pp {pins.pp}), the ranks it is taken from", "pick a divisor of that, or a smaller --pp")
        stage = [getattr(pins, a) for a in ("tp", "cp", "dp")]
        if all(x is not None for x in stage) and (stage[0] * stage[1] * stage[2]) % e:
            need(False, f"--ep {e} does not divide --tp x --cp x --dp = {stage[0] * stage[1] * stage[2]}, the ranks "
                 "it is taken from", "pick a divisor of that")
    if (pins.dp_replicate or 1) > 1:
        r = pins.dp_replicate
        need(up_to or gpus % r == 0, f"--dp-replicate {r} does not divide --gpus {gpus}", f"pick a divisor of {gpus}")
        need(pins.dp is None or (pins.dp % r == 0 and pins.dp > r),
             f"--dp-replicate {r} must split --dp {pins.dp} into replica groups of two or more ranks",
             "pin a --dp that is a multiple of it, at least twice it")
        most = gpus // ((pins.tp or 1) * (pins.pp or 1) * (pins.cp or 1))
        need(most >= 2 * r, f"--dp-replicate {r} needs dp {2 * r} or more (replica groups of two or more ranks), and "
             f"these pins leave at most dp {most}", "lower --dp-replicate or a pinned degree, or use more GPUs")
        group = gpus // (pins.pp or 1) // r  # a replica group's ranks of a stage (tp x cp x dp / r), at the most
        need(up_to or (pins.ep or 1) == 1 or gpus % ((pins.pp or 1) * r) or group % pins.ep == 0,
             f"--ep {pins.ep} does not divide the {group} ranks of a replica group of a pipeline stage (--gpus {gpus}"
             + (f" / --pp {pins.pp}" if pins.pp else "") + f" / --dp-replicate {r}), the ranks the experts' group is "
             "taken from under hybrid sharding", "pick a smaller --ep or --dp-replicate")


# The layout rules a framework adds to the search (Pins fields set by recommend), as a user reads them, with the fix
_FRAMEWORK_RULES = {
    "ddp_one_dim": ("runs DDP (--zero 0 over dp > 1) only without tp, pp or cp, and no --zero 0 beside cp (\"DDP has "
                    "not supported > 1D parallelism\")", "use --zero 3 (FSDP), or unpin --tp/--pp/--cp"),
    "sixteen_bit_needs_shards": ("trains tp/pp in 16 bits only beside FSDP over dp or cp > 1 (its mixed precision is "
                                 "FSDP's)", "leave GPUs for --dp with --zero 3, or use --precision fp32"),
    "sp_with_tp": ("runs tensor parallelism only with sequence parallelism", "drop --no-sp, or use --tp 1"),
    "zero_max_with_pp": ("runs ZeRO-2 and 3 only without a pipeline", "use --zero 0 or 1, or --pp 1"),
    "zero0_single_shard": ("runs a bf16 pipeline without ZeRO through its BF16_Optimizer, which shards the optimizer "
                           "over dp (ZeRO-1)", "use --zero 1 --zero1-grad-reduce all-reduce, --pp 1, --dp 1 --cp 1, or "
                           "--dtype fp16"),
    "lacks": ("has no pipeline or context parallelism: its layouts are tp x dp", "pin --tp and --dp to multiply to "
              "--gpus, or leave one of them free"),
    "fsdp_offload_alone": ("has no FSDP2 optimizer offload with SP, cp or tied embeddings across the pipeline on a "
                           "GPU", "use --zero 1 or 2 with the offload, or drop --sp/--cp"),
}


def _framework_rule_message(m, tr, gpus: int, pins: Pins, framework: str) -> str | None:
    """Where the pins leave layouts but the framework's own rules (Pins.ddp_one_dim, ...) rule out every one: which
    rule, and its fix (the generic message had blamed the model's shape for torchtitan's --zero 0 --tp 2)."""
    from .search import build_layouts
    def count(p):
        return len(build_layouts(m, gpus, tr.global_batch_size, p, tr.zero_over_cp).tp)
    off = {k: Pins.__dataclass_fields__[k].default for k in _FRAMEWORK_RULES}  # each rule's field as unset
    free = replace(pins, **off)
    if count(free) == 0:
        return None
    on = [k for k in _FRAMEWORK_RULES if getattr(pins, k) != off[k]]
    blocking = [k for k in on if count(replace(pins, **{k: off[k]})) > 0]
    if not blocking:  # only the rules together rule everything out
        blocking = on
    what = "; and ".join(_FRAMEWORK_RULES[k][0] for k in blocking)
    fix = "; or ".join(_FRAMEWORK_RULES[k][1] for k in blocking)
    return f"no layout of {gpus} GPUs with these pins runs under {framework}: it {what}; {fix}"


def _no_candidates_message(spec, gpus, pins) -> str:
    sp = " (--sp needs a tp > 1 that divides them)" if pins.sp else ""
    return (f"no layout of {gpus} GPUs matches the pinned dimensions for this model "
            f"(heads {spec.heads}, kv_heads {spec.kv_heads}, layers {spec.layers}){sp}; relax a pin such as "
            f"--tp/--pp/--schedule/--vpp{'/--sp' if pins.sp else ''}")


# what each structural rejection (search.REASONS) means, for the "every candidate breaks a rule" error
REJECTED_BECAUSE = {
    "batch": "do not split the global batch evenly (it must be a multiple of dp x micro-batch)",
    "schedule": "need a schedule they cannot run (interleaving: micro-batches a multiple of pp, or for torch's "
                "interleaved schedules of their max(1, micro-batches // pp) rounds, interleaved-zb at least pp; "
                "torch's 1F1B: at "
                "least pp micro-batches; zero-bubble schedules: no full or op-level recompute under torch's own "
                "weight pass)",
    "layers": "leave a virtual stage without a block (pp x vpp > layers + 2)",
    "seq": "do not split the sequence evenly (it must be a multiple of 2 x cp, and with sequence parallelism "
           "each rank's part a multiple of tp)",
    "offload": "offload the optimizer without ZeRO (it needs --zero 1 or more; torchtitan's FSDP offload --zero 3)",
    "recompute-layers": "recompute a number of blocks a stage torchtitan's layer-level checkpointing does not give "
                        "there (every f-th block whole: floor(blocks / f) a stage, the same in each only where the "
                        "stages are of one size and, with vpp > 1, f divides them)",
}


def _batch_fix(gbs: int, seq_len: int, gpus: int, pins: Pins) -> str | None:
    """The nearest global batch (the larger on a tie) that the largest data-parallel size these pins allow
    divides (with tp, pp and cp all pinned the rest is fixed; with only cp free it takes the rest and must
    split the sequence)."""
    fixed = 1
    for name in ("tp", "pp", "cp"):
        fixed *= getattr(pins, name) or 1
    mbs = pins.mbs or 1
    if mbs > gbs:  # no batch near the given one splits: the micro-batch is the pin to change (a batch of mbs
        # sequences or more on dp 1 had been offered, which then found nothing that fits)
        return (f"--mbs {mbs} is more sequences than the whole global batch ({gbs}), of which a micro-batch is a "
                "share of one data-parallel rank's part: give a smaller --mbs, or drop it for the search to pick one")

    def allowed(d):
        if gpus % d or (gpus // d) % fixed or (pins.dp is not None and d != pins.dp):
            return False
        rest = gpus // d // fixed
        if pins.tp is not None and pins.pp is not None:
            cp = rest * (pins.cp or 1)
            return (pins.cp is not None and rest == 1) or (pins.cp is None and (cp == 1 or seq_len % (2 * cp) == 0))
        return True

    def nearest(d):
        step = d * mbs
        up, down = -(-gbs // step) * step, gbs // step * step
        return down if down and gbs - down < up - gbs else up

    # the largest data-parallel size allowed (the least model parallelism) whose nearest batch is within a factor 2 of
    # the given one, else the size whose batch is nearest: the largest alone had sent --mbs 600 to a batch of 4800
    # over dp 8, where dp 2 takes 1200
    ds = [d for d in range(gpus, 0, -1) if allowed(d)]
    if not ds or gbs % (ds[0] * mbs) == 0:
        return None
    # a size the batch already splits over is held back by another rule (heads, layers: a prime GPU count leaves
    # dp 1 only with tp x pp the whole count), so it is no fix: naming the batch it has sent the same command back
    ds = [d for d in ds if gbs % (d * mbs)]
    d = next((d for d in ds if gbs / 2 <= nearest(d) <= 2 * gbs), None) or min(ds, key=lambda d: abs(nearest(d) - gbs))
    few = gpus > 3 and all(gpus % k for k in range(2, math.isqrt(gpus) + 1))  # a prime count: dp 1 or all of it
    return (f"use --global-batch-size {nearest(d)}, which splits over dp {d}"
            + (f" x micro-batch {mbs}" if mbs > 1 else "")
            + (f", or a GPU count with divisors ({gpus} is prime; --objective min-gpus searches the counts up to it)"
               if few else ""))


def _nothing_fits(spec, hw_ref, training, hw, res, info, m, tr, pins, gpus, suggest, tokens) -> Plan:
    gb = 1e9
    if res.best_infeasible is not None:
        lay1, met1 = res.best_infeasible
        row = lay1.row(0)
        code = "memory" if float(met1["mem_total"][0]) > hw.usable_bytes else "host-memory"
        reason = _reason_text(code, met1, 0, hw, row, training.global_batch_size)
        pred = prediction_from_metrics(met1, 0, hw, reason, tokens, row["gpus"])
        plan = build_plan(spec, hw_ref, training, row, pred)
        needed = float(met1["mem_total"][0])
        if code == "memory":
            msg = (f"nothing fits: the smallest layout needs {needed / gb:.1f} GB per GPU "
                   f"({row['gpus']} x {hw.usable_bytes / gb:.1f} GB usable on {hw_ref.name})")
        else:  # fits the GPUs only by offloading more optimizer state than a node's host memory holds
            per_node = _offloaded_per_node(met1, 0, hw, row)
            msg = (f"nothing fits: the closest layout fits the GPUs ({needed / gb:.1f} GB per GPU) only by offloading "
                   f"{per_node / gb:.0f} GB of optimizer state per node to host memory, which holds "
                   f"{hw.host_memory_bytes_per_node / gb:.0f} GB on {hw_ref.name}")
    else:
        why = "; ".join(f"{v} {REJECTED_BECAUSE.get(k, k)}" for k, v in res.infeasible_by_reason.items())
        msg = f"no layout can run this job: every candidate breaks a rule: {why}"
        fix = _batch_fix(training.global_batch_size, training.seq_len, gpus, pins) \
            if "batch" in res.infeasible_by_reason else None
        if fix is None and "seq" in res.infeasible_by_reason and pins.cp and pins.cp > 1:
            step = 2 * pins.cp * (pins.tp if pins.sp and pins.tp else 1)
            near = max(step, round(training.seq_len / step) * step)
            fix = (f"use --seq-len {near}, which splits into 2 x cp {pins.cp} chunks"
                   + (f" and over tp {pins.tp}" if step > 2 * pins.cp else ""))
        # no layout was even costed: more GPUs or offload (memory fixes) are no answer; say what is
        raise PlannerError(msg + "; " + (fix or "relax the pinned dimensions"))
    suggestions = []
    if suggest:
        suggestions = _suggestions(spec, hw_ref, training, pins, gpus, hw,
                                   batch_rejected="batch" in res.infeasible_by_reason)
    plan.search = info
    plan.suggestions = suggestions
    if suggestions:
        msg += "; " + suggestions[0]
    raise NothingFits(plan, msg)


def stack_flags(training: Training) -> dict:
    """The plan's framework, STACK_FLAGS and gradient clipping, as keyword arguments for recommend()."""
    return {"framework": training.framework, "clip_grad": training.clip_grad,
            **{k: getattr(training, k) for k in STACK_FLAGS}}


def _nearby_batches(gbs: int, gpus: int, pins: Pins, limit: int = 6) -> list[int]:
    """Global batch sizes nearest gbs (either side) that a data-parallel size the pins allow, other
    than those gbs already splits over, divides: the layouts the batch ruled out."""
    fixed = 1
    for name in ("tp", "pp", "cp"):
        fixed *= getattr(pins, name) or 1
    step = pins.mbs or 1
    out = set()
    for d in range(2, gpus + 1):
        if gpus % d or (gpus // d) % fixed or (pins.dp is not None and d != pins.dp) or gbs % (d * step) == 0:
            continue
        unit = d * step
        out.add(-(-gbs // unit) * unit)
        if gbs // unit:
            out.add(gbs // unit * unit)
    return sorted(out, key=lambda b: (abs(b - gbs), b))[:limit]


POLICY_PINS = ("zero", "recompute", "recompute_layers", "mbs", "sp", "schedule")


def _policy_value(plan: Plan, k: str):
    p = plan.parallel
    return {"zero": p.zero_stage, "recompute": p.recompute, "recompute_layers": p.recompute_layers,
            "mbs": plan.training.micro_batch_size, "sp": p.sp, "schedule": p.schedule}[k]


def _policy_flag(k: str, v, plan: Plan | None = None) -> str:
    if k == "sp":
        return "--sp" if v else "--no-sp"
    if k == "recompute_layers" and v is None and plan is not None:  # the plan recomputes every block or none
        return f"--recompute {plan.parallel.recompute}"
    return f"--{k.replace('_', '-')} {v}"


def _without(pins: Pins, k: str) -> Pins:
    """pins less the policy pin k (recompute_layers: with the search's recompute choices it had narrowed)."""
    return replace(pins, recompute_layers=None, recomputes=None) if k == "recompute_layers" else replace(pins, **{k: None})


def states_cannot_fit(n_params: float, gpus: int, hw) -> bool:
    """No layout on `gpus` GPUs holds the model: every recipe keeps Adam's two fp32 moments and the fp32 values it
    steps (the master, or fp32 weights), 12 B a parameter, on the GPUs' HBM and the hosts' memory together even
    when all is sharded and offloaded.  A count the suggestions need not search (an absurd model on a few GPUs had
    searched some 130 layouts spaces, up to a minute)."""
    nodes = -(-gpus // hw.gpus_per_node)
    return 12 * n_params > gpus * hw.hbm_bytes + nodes * hw.host_memory_bytes_per_node


def _fitting_layout(rec: Plan, pins: Pins) -> str:
    """A suggestion's layout as its text says it: the degrees, the optimizer offload where the search chose it and
    the user had not pinned it (a suggestion that left it out named a layout that does not fit as said), the
    memory."""
    r = rec.parallel
    offload = f", --offload {r.offload}" if r.offload != "none" and pins.offload is None else ""
    return (f"tp {r.tp}, pp {r.pp}, dp {r.dp}, cp {r.cp}{offload}, "
            f"{rec.prediction.memory_bytes_per_gpu.total / 1e9:.1f} GB per GPU")


def _suggestions(spec, hw_ref, training, pins, gpus, hw, batch_rejected: bool = False) -> list[str]:
    """A nearby global batch that lets a ruled-out data-parallel size fit (when the batch rejected
    some layouts), the fewest GPUs that fit (same pins minus the degree pins), and offload when it helps."""
    out = []
    hopeless = states_cannot_fit(spec.num_params, gpus, hw)  # no pin dropped on these GPUs can fit it
    common = dict(hardware=hw_ref.name, seq_len=training.seq_len, dtype=training.dtype, precision=training.precision,
                  gpus_per_node=hw_ref.gpus_per_node, inter_node_gbytes_per_s=hw_ref.inter_node_gbytes_per_s,
                  aggregate_nics=hw_ref.aggregate_nics, **stack_flags(training), top_k=1, suggest=False)
    for b in (_nearby_batches(training.global_batch_size, gpus, pins) if batch_rejected and not hopeless else []):
        try:
            rec = recommend(spec, gpus, global_batch_size=b, pins=pins, **common)
        except (NothingFits, PlannerError):
            continue
        out.append(f"--global-batch-size {b} fits on {gpus} GPUs ({_fitting_layout(rec, pins)}; "
                   f"{training.global_batch_size} does not split over dp {rec.parallel.dp})")
        break
    # multi-head latent attention's up projections recomputed (Megatron's mla_up_proj: DeepSeek-V3's recipes; parplan's
    # runtime runs it too), every pin kept: q, k and v no longer saved
    if (spec.kv_lora_rank is not None and training.framework in MLA_FRAMEWORKS and not training.mla_recompute
            and not hopeless):
        try:
            rec = recommend(spec, gpus, global_batch_size=training.global_batch_size, pins=pins,
                            **{**common, "mla_recompute": True})
            out.append(f"--mla-recompute (Megatron's --recompute-modules mla_up_proj) fits on {gpus} GPUs "
                       f"({_fitting_layout(rec, pins)})")
        except (NothingFits, PlannerError):
            pass
    free = Pins(mbs=pins.mbs, recompute=pins.recompute, zero=pins.zero, sp=pins.sp, offload=pins.offload,
                schedule=pins.schedule)
    degrees = [k for k in ("tp", "pp", "dp", "cp", "vpp") if getattr(pins, k) is not None]
    # one degree pin dropped, the others kept, on the same GPUs (the pin that rules everything out)
    for k in ([] if hopeless else degrees):
        try:
            rec = recommend(spec, gpus, global_batch_size=training.global_batch_size,
                            pins=replace(pins, **{k: None}), **common)
        except (NothingFits, PlannerError):
            continue
        out.append(f"without --{k} {getattr(pins, k)} it fits on {gpus} GPUs ({_fitting_layout(rec, pins)})")
        break
    # one policy pin dropped (--zero, --recompute, --recompute-layers, --mbs, --sp, --schedule), the degrees kept, on
    # the same GPUs: the fastest of those that fit (a ZeRO stage the framework cannot run inside the pipeline that
    # fits had no suggestion: only degrees and GPU counts were relaxed)
    fits = []
    for k in POLICY_PINS:
        if getattr(pins, k) is None or hopeless:
            continue
        try:
            rec = recommend(spec, gpus, global_batch_size=training.global_batch_size, pins=_without(pins, k), **common)
        except (NothingFits, PlannerError):
            continue
        fits.append((rec.prediction.step_time_s, k, rec))
    if fits:
        _, k, rec = min(fits, key=lambda f: f[0])
        chosen = _policy_value(rec, k)
        out.append(f"without {_policy_flag(k, getattr(pins, k))} it fits on {gpus} GPUs with {_policy_flag(k, chosen, rec)} "
                   f"({_fitting_layout(rec, pins)})")
    per_node = hw.gpus_per_node
    candidates = [g for g in (2 ** k for k in range(0, 17)) if g > gpus]
    candidates = sorted(set(candidates + [per_node * k for k in range(1, 4097) if per_node * k > gpus]))
    if (pins.offload is None or pins.offload == "none") and not hopeless:
        # with every pin kept first (--tp 1 --pp 1 plus offload can fit), then with the degrees free
        for offload_pins in (replace(pins, offload="optimizer"), Pins(**{**free.__dict__, "offload": "optimizer"})):
            try:
                rec = recommend(spec, gpus, global_batch_size=training.global_batch_size, pins=offload_pins, **common)
            except (NothingFits, PlannerError):
                continue
            r = rec.parallel
            dropped = [f"--{k} {getattr(pins, k)}" for k in ("tp", "pp", "dp", "cp", "vpp")
                       if getattr(pins, k) not in (None, getattr(r, k))]
            out.append(f"--offload optimizer fits on {gpus} GPUs (tp {r.tp}, pp {r.pp}, dp {r.dp}, ZeRO-{r.zero_stage}, "
                       f"{rec.prediction.memory_bytes_per_gpu.total / 1e9:.1f} GB per GPU"
                       + (f"; without {' '.join(dropped)}" if dropped else "") + ")")
            break
    # scan growing GPU counts (powers of two and whole nodes), capped to keep suggestions fast: with every degree
    # pin kept, then without dp's (which the count would change), then without any (each drop said so)
    scans = []
    for scan in (pins, replace(pins, dp=None), free):
        if scan not in scans:
            scans.append(scan)
    for scan_pins in scans:
        found = False
        for g in candidates[:64]:
            if training.global_batch_size < 1:
                break
            if states_cannot_fit(spec.num_params, g, hw):
                continue
            try:
                rec = recommend(spec, g, global_batch_size=max(training.global_batch_size, 1), pins=scan_pins, **common)
            except (NothingFits, PlannerError):
                continue
            dropped = [f"--{k} {getattr(pins, k)}" for k in ("tp", "pp", "dp", "cp", "vpp")
                       if getattr(pins, k) is not None and getattr(scan_pins, k) is None]
            out.append(f"--gpus {g} fits ({_fitting_layout(rec, pins)}"
                       + (f"; without {' '.join(dropped)}" if dropped else "") + ")")
            found = True
            break
        if found:
            break
    if training.precision == "amp":
        out.append("--precision master-weights stores 16-bit weights (18 B/param with fp32 master) instead of fp32 + casts")
    return out


def _check_attention_kernel(profile, training: Training) -> None:
    if training.attention_kernel == "triton-2022" and not profile.flash_attention_2_tflops:
        have = ", ".join(_profiles_with_fa2())
        raise PlannerError(f"attention kernel triton-2022 is modelled from FlashAttention-2's published speed on the GPU, "
                           f"which profile {profile.name} does not have (flash_attention_2_tflops); use --attention-kernel "
                           f"profile, or a profile that has it ({have})")


@lru_cache(maxsize=1)
def _profiles_with_fa2() -> tuple[str, ...]:
    """The shipped profiles with FlashAttention-2's published speed (flash_attention_2_tflops), read once."""
    from hardware_profiles import list_profiles, load_profile
    return tuple(n for n in list_profiles() if load_profile(n).flash_attention_2_tflops)


def check_plan_structure(spec: ModelSpec, plan: Plan) -> None:
    """What the search never generates and no framework runs, for a hand-edited plan: more pipeline stages than
    blocks, virtual stages without the schedule that runs them, a pipeline rank without a block, a schedule,
    recompute or ZeRO stage outside the plan's framework (recommend refuses the same as pins).  Raises
    StructureError."""
    p, t = plan.parallel, plan.training
    if p.pp > spec.layers:
        raise StructureError(f"pp {p.pp} exceeds the model's {spec.layers} layers")
    want = {"gpipe": "1", "1f1b": "1", "zbv": "2", "interleaved-1f1b": "2 or more", "interleaved-zb": "2 or more"}
    if p.pp > 1 and ((p.vpp == 1) != (p.schedule in ("gpipe", "1f1b")) or (p.schedule == "zbv" and p.vpp != 2)):
        raise StructureError(f"schedule {p.schedule} runs vpp {want[p.schedule]}, not {p.vpp}")
    if p.pp == 1 and p.vpp > 1:
        raise StructureError(f"vpp {p.vpp} without a pipeline (pp 1): virtual stages are pipeline chunks")
    if p.stage_layers is not None and p.pp > 1:
        # a rank that holds the embedding or the head (the first and last virtual stages: rank 0 and, under ZB-V's
        # V, rank 0 again) trains without a block, as the search places them (pp x vpp up to layers + 2) and the
        # runtime runs them (launch.check_runtime_support); a rank with neither has nothing to train
        last = p.pp * p.vpp - 1
        empty = [r for r in range(p.pp)
                 if not any(s in (0, last) or (s < len(p.stage_layers) and p.stage_layers[s])
                            for s in stages_of_rank(r, p.pp, p.vpp, p.schedule))]
        if empty:
            raise StructureError(f"stage_layers {list(p.stage_layers)} leave pipeline rank(s) {empty} without a block, "
                                 "embedding or head")
    fw = t.framework
    problem = moe_problem(spec, fw, p.ep, p.zero_stage, p.tp, p.sp, plan=True,
                          dispatcher=t.moe_dispatcher, recompute=t.moe_recompute, fp8=t.fp8,
                          recompute_mode=p.recompute, dp_replicate=p.dp_replicate) \
        or mla_problem(spec, fw, plan=True, mla_recompute=t.mla_recompute, cp=p.cp, fp8=t.fp8,
                       documents=bool(t.document_length and t.document_length < t.seq_len)) \
        or mtp_problem(spec, fw, plan=True) \
        or (a2a_overlap_problem(spec, fw, p.pp, p.vpp, p.schedule, p.recompute, plan=True)
            if t.moe_a2a_overlap else None) \
        or (parplan_parallel_block_problem(p.recompute, t.dropout, plan=True)
            if spec.parallel_block and fw == "parplan" else None)
    if problem:
        raise StructureError(*problem)
    if p.dp_replicate > 1:
        problem = dp_replicate_problem(fw, p.dp_replicate, p.zero_stage, plan=True)
        if problem:
            raise StructureError(*problem)
    for axis, value, offered in (("schedule", p.schedule if p.pp > 1 else None, FRAMEWORK_SCHEDULES.get(fw)),
                                 ("recompute", p.recompute, FRAMEWORK_RECOMPUTES.get(fw)),
                                 ("zero_stage", p.zero_stage, FRAMEWORK_ZEROS.get(fw))):
        if value is not None and offered and value not in offered:
            raise StructureError(f"{axis} {value} is not one {fw} runs (it runs {', '.join(map(str, offered))})",
                                 "change it, or the plan's training.framework")
    if p.recompute_layers is not None:
        if fw not in PARTIAL_RECOMPUTE_FRAMEWORKS:
            raise StructureError(f"recompute_layers {p.recompute_layers}: {fw} recomputes every block of a stage or "
                                 "none", "drop recompute_layers, or set training.framework megatron, parplan or "
                                 "torchtitan")
        sizes = p.stage_layers or model_stage_layers(spec.layers, spec.mtp_layers or 0, p.pp * p.vpp)
        largest = max(sizes)
        if p.recompute_layers >= largest:
            raise StructureError(f"recompute_layers {p.recompute_layers} recomputes every block of each stage (at most "
                                 f"{largest})", "drop it for recompute full, or give fewer")
        if fw == "torchtitan":
            problem = titan_layer_sac_problem(sizes, p.vpp, p.recompute_layers, bool(spec.mtp_layers))
            if problem:
                raise StructureError(*problem)
        if p.pp > 1 and p.schedule in ZERO_BUBBLE:
            raise StructureError(f"recompute_layers with schedule {p.schedule}: {PARTIAL_RECOMPUTE_SCHEDULES}",
                                 "drop recompute_layers, or change the schedule")
    refused = deepspeed_zero_in_pipeline(p.zero_stage, p.pp) if fw == "deepspeed" else None
    if refused:
        raise StructureError(refused, "use zero_stage 0 or 1, or pp 1")
    if (fw == "deepspeed" and p.zero_stage == 0 and p.pp > 1 and p.dp * p.cp > 1
            and deepspeed_bf16_optimizer(t.dtype, t.precision)):
        raise StructureError(f"zero_stage 0 with pp {p.pp} over dp {p.dp} x cp {p.cp} in bf16: {DEEPSPEED_BF16_ZERO0}",
                             "use zero_stage 1 with zero1_grad_reduce all-reduce, pp 1, or dtype fp16")
    if fw == "torchtitan" and p.zero_stage == 0 and ((p.dp > 1 and (p.tp > 1 or p.pp > 1)) or p.cp > 1):
        # the search's Pins.ddp_one_dim (parallelize_llama: "DDP has not supported > 1D parallelism"; FSDP whenever cp > 1)
        raise StructureError(f"zero_stage 0 with tp {p.tp}, pp {p.pp}, cp {p.cp} over dp {p.dp}: torchtitan runs DDP only "
                             "without tp, pp or cp, and shards over cp whenever cp > 1", "set zero_stage 3 (FSDP)")
    if (fw == "torchtitan" and t.precision != "fp32" and t.dtype != "fp32" and (p.tp > 1 or p.pp > 1)
            and p.dp == 1 and p.cp == 1):
        # the search's Pins.sixteen_bit_needs_shards (maybe_enable_amp)
        raise StructureError(f"tp {p.tp} x pp {p.pp} without FSDP (dp = cp = 1) in {t.dtype}: torchtitan's mixed "
                             "precision is FSDP's, and tp/pp alone train in fp32", "set precision fp32, or spread the "
                             "GPUs over dp with zero_stage 3")
    if fw == "torchtitan" and spec.is_moe:  # the search's Pins.titan_expert_mesh
        problem = titan_ep_problem(p.ep, p.tp, p.cp, p.dp, p.zero_stage, p.dp_replicate, plan=True)
        if problem:
            raise StructureError(*problem)
    if fw == "torchtitan" and p.tp > 1 and not p.sp:
        raise StructureError(f"sp false with tp {p.tp}: torchtitan always runs sequence parallelism with tensor "
                             "parallelism", "set sp true, or the plan's training.framework to fsdp or megatron")
    lacks = FRAMEWORK_LACKS.get(fw, ())
    has = [f"{a} {getattr(p, a)}" for a in ("pp", "cp") if a in lacks and getattr(p, a) > 1]
    has += ["sp true"] if "sp" in lacks and p.sp else []
    if has:
        raise StructureError(f"{', '.join(has)}: {fw} has no {_lack_names(tuple(h.split()[0] for h in has))}",
                             "set them to 1 (sp false), or change the plan's training.framework")


def default_stage_layers(plan: Plan) -> list[int]:
    """The default split of the plan's model over its pp x vpp virtual stages (model_stage_layers)."""
    p, m = plan.parallel, plan.model
    return model_stage_layers(m.layers, m.mtp_layers or 0, p.pp * p.vpp)


def own_stage_layers(plan: Plan) -> list[int] | None:
    """The plan's stage_layers where it is not the default split (recommend's balanced split: lighten_head_stage, or a
    hand-edited one), else None."""
    own = plan.parallel.stage_layers
    return None if own is None or list(own) == default_stage_layers(plan) else [int(n) for n in own]


def plan_inputs(plan: Plan, profile: HardwareProfile | None = None) -> tuple:
    """(spec, m, tr, hw, arr): what evaluate_plan hands the cost model for one plan -- its model (with its parameter
    count), ModelDims (with the plan's own split where it is not the default one), TrainingConsts, hardware
    constants and a one-row Layout."""
    check_plan_structure(plan.model, plan)
    profile = plan_hardware(plan) if profile is None else profile
    hw = hardware_constants(profile, plan.hardware, compute_dtype(plan.training.dtype, plan.training.precision),
                            plan.training.fp8)
    _check_attention_kernel(profile, plan.training)
    spec = with_param_count(plan.model, plan.training.seq_len)
    m = model_dims(spec, plan.training.seq_len, plan.training.framework, plan.training.document_length)
    tr = training_consts(plan.training)
    own = own_stage_layers(plan)
    if own is not None:
        # the plan's own split, which the runtime trains and the exports write: every per-rank count reads it
        m = replace(m, split=tuple(own))
    lay = layout_from_parallel(plan.parallel, plan.training.micro_batch_size, plan.hardware.gpus)
    arr = Layout(**{k: np.array([v]) for k, v in lay.__dict__.items()})
    return spec, m, tr, hw, arr


def evaluate_plan(plan: Plan, profile: HardwareProfile | None = None) -> Plan:
    """Re-predict a given (possibly hand-edited) plan; never searches.  profile: a validated
    HardwareProfile to predict with instead of the one plan.hardware.name names (calibrate's fits try
    hundreds of candidate profiles, which need no file each).  The plan's own stage_layers is what it predicts
    (ModelDims.split)."""
    if profile is None:
        check_plan_structure(plan.model, plan)  # a layout's error before its profile's, as plan_inputs gives them
        profile = plan_hardware(plan)
    spec, m, tr, hw, arr = plan_inputs(plan, profile)
    with np.errstate(divide="ignore", invalid="ignore"):
        met = evaluate(m, tr, hw, arr)
    from .search import infeasibility
    r = int(infeasibility(m, tr, hw, arr, met)[0])
    reason = None if r < 0 else _reason_text(REASONS[r], met, 0, hw, arr.row(0), tr.global_batch_size, tr)
    pred = _with_accuracy(prediction_from_metrics(met, 0, hw, reason, plan.training.tokens, plan.hardware.gpus),
                          plan.training, plan.hardware.name, spec.is_moe)
    out = plan.model_copy(update={"model": spec, "prediction": pred, "search": None, "alternatives": [],
                                  "suggestions": []})
    return with_bridges_said(out, profile) if profile.nvlink.bridge_gbytes_per_s else out


def without_bridges(profile: HardwareProfile) -> HardwareProfile:
    """The profile with its NVLink bridges taken out: every group inside a node over its PCIe rate."""
    return profile.model_copy(update={"nvlink": profile.nvlink.model_copy(
        update={"bridge_gbytes_per_s": None, "bridge_efficiency": None})})


def step_without_bridges(plan: Plan, profile: HardwareProfile) -> float | None:
    """The plan's step re-predicted without its profile's NVLink bridges, where that differs from its own: the plan
    prices a group of two consecutive ranks at the bridge's rate (cost_models.comm.one_pair); else None."""
    if not profile.nvlink.bridge_gbytes_per_s or plan.prediction is None:
        return None
    step = evaluate_plan(plan, without_bridges(profile)).prediction.step_time_s
    return step if step and abs(step - plan.prediction.step_time_s) > 1e-9 * step else None


def with_bridges_said(plan: Plan, profile: HardwareProfile) -> Plan:
    """A plan that relies on its profile's NVLink bridges (step_without_bridges) with a warning that says so: which
    ranks must sit on bridged cards, and the step without them."""
    bare = step_without_bridges(plan, profile)
    if bare is None:
        return plan
    pred = plan.prediction
    rate = profile.nvlink.bridge_gbytes_per_s * (profile.nvlink.bridge_efficiency or 0)
    said = (f"NVLink bridges: the plan prices its groups of two consecutive ranks at {profile.name}'s bridged pairs "
            f"({rate:.0f} GB/s), {bare:.4g} s a step over PCIe alone (+{(bare / pred.step_time_s - 1) * 100:.1f} %): "
            "ranks 2i and 2i + 1 of a node must run on bridged cards (`parplan hardware detect` reads a node's "
            "bridges; `parplan launch` checks them)")
    return plan.model_copy(update={"prediction": pred.model_copy(update={"warnings": [*pred.warnings, said]})})
