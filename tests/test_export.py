"""planner.export: each target carries the plan's numbers under that tool's own names."""
from __future__ import annotations

import copy
import json
import math
import re
import shlex
import shutil
import subprocess

import pytest

from planner.export import FORMATS, _megatron_args, export_notes, export_plan
from planner.schema import HardwareRef, ModelSpec, Parallel, Plan, Training

from hardware_profiles import tomllib  # tomli on Python 3.10


def llama_plan(**parallel_overrides) -> Plan:
    par = dict(tp=4, pp=2, vpp=2, dp=2, sp=True, zero_stage=1, recompute="selective",
               schedule="interleaved-1f1b")
    par.update(parallel_overrides)
    return Plan(
        model=ModelSpec(name="llama3-8b", arch="llama", layers=32, hidden=4096, heads=32, kv_heads=8,
                        ffn_hidden=14336, vocab=128256),
        hardware=HardwareRef(name="h100-sxm-80gb", gpus=par["tp"] * par["pp"] * par["dp"] * par.get("cp", 1),
                             gpus_per_node=8),
        training=Training(seq_len=4096, global_batch_size=par["dp"] * 32, micro_batch_size=1, num_microbatches=32,
                          dtype="bf16", precision="master-weights", tokens=1e9, clip_grad=1.0),
        parallel=Parallel(**par),
    )


def gpt_plan() -> Plan:
    return Plan(
        model=ModelSpec(name="gpt-1.3b", arch="gpt", layers=24, hidden=2048, heads=16, kv_heads=16,
                        ffn_hidden=8192, vocab=50257, tied_embeddings=True, max_seq_len=2048),
        hardware=HardwareRef(name="a100-sxm-80gb", gpus=8, gpus_per_node=8),
        training=Training(seq_len=2048, global_batch_size=32, micro_batch_size=2, num_microbatches=2,
                          dtype="fp16", precision="amp"),
        parallel=Parallel(tp=1, pp=1, dp=8, zero_stage=3, offload="optimizer", recompute="full"),
    )


def megatron_argv(text: str) -> list[str]:
    """Run the snippet under bash with a stub torchrun: pretrain_gpt.py's argv, in order."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash not available")
    stub = 'torchrun() { printf "%s\\0" "$@"; }\n'
    out = subprocess.run([bash, "-c", stub + text], check=True, capture_output=True, text=True).stdout
    argv = out.split("\0")[:-1]
    return argv[argv.index("pretrain_gpt.py") + 1:]


def megatron_args(text: str) -> dict[str, object]:
    """megatron_argv parsed into a dict."""
    argv = megatron_argv(text)
    args: dict[str, object] = {}
    i = 0
    while i < len(argv):
        name = argv[i]
        assert name.startswith("--"), argv[i]
        assert name not in args, f"duplicate {name}"
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            args[name] = argv[i + 1]
            i += 2
        else:
            args[name] = True
            i += 1
    return args


def test_formats_and_unknown():
    assert FORMATS == ("megatron", "megatron-bridge", "torchtitan", "torchtitan-0.2", "deepspeed", "llm-foundry")
    with pytest.raises(ValueError) as e:
        export_plan(llama_plan(), "nemo")
    for name in FORMATS:
        assert name in str(e.value)


def test_megatron_llama():
    plan = llama_plan()
    text = export_plan(plan, "megatron")
    body = [ln for ln in text.splitlines() if ln.startswith("    --")]
    assert all(ln.endswith(" \\") for ln in body[:-1]) and not body[-1].endswith("\\")
    # the header names Megatron-Bridge's own translator of these flags (a comment, before the command)
    head = text.split("torchrun", 1)[0]
    assert "# Megatron-Bridge (NeMo's Megatron successor): its scripts/translate_mlm_to_bridge.py" in head
    a = megatron_args(text)
    assert a["--tensor-model-parallel-size"] == "4"
    assert a["--pipeline-model-parallel-size"] == "2"
    assert a["--num-layers-per-virtual-pipeline-stage"] == "8"  # 32 / (2 * 2)
    assert a["--sequence-parallel"] is True
    assert a["--context-parallel-size"] == "1"
    assert a["--micro-batch-size"] == "1"
    assert a["--global-batch-size"] == "64"
    assert a["--num-layers"] == "32"
    assert a["--hidden-size"] == "4096"
    assert a["--num-attention-heads"] == "32"
    assert a["--group-query-attention"] is True
    assert a["--num-query-groups"] == "8"
    assert a["--ffn-hidden-size"] == "14336"
    assert a["--seq-length"] == "4096"
    assert a["--max-position-embeddings"] == "4096"
    assert a["--padded-vocab-size"] == "128256"
    assert a["--recompute-granularity"] == "selective"
    assert "--recompute-method" not in a  # Megatron rejects a method with selective
    assert a["--use-distributed-optimizer"] is True
    assert a["--bf16"] is True and "--fp16" not in a
    assert a["--swiglu"] is True
    assert a["--normalization"] == "RMSNorm"
    assert a["--position-embedding-type"] == "rope"
    assert a["--disable-bias-linear"] is True
    assert a["--untie-embeddings-and-output-weights"] is True
    assert a["--attention-backend"] == "flash"
    # whole steps, as torchtitan's: Megatron trains train_samples // global batch (64) iterations, here 3815
    steps = -(-10**9 // (64 * 4096))
    assert a["--train-samples"] == str(steps * 64) and int(a["--train-samples"]) // 64 == steps
    # the AdamW the plan counts and parplan's runtime trains, not Megatron-LM's defaults (0.999, 0.01)
    assert (a["--adam-beta1"], a["--adam-beta2"], a["--weight-decay"]) == ("0.9", "0.95", "0.1")
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text
    assert "torchrun --nnodes 2 --nproc-per-node 8" in text
    # mutually exclusive ways of giving virtual stages: exactly one
    assert sum(k in a for k in ("--num-layers-per-virtual-pipeline-stage",
                                "--num-virtual-stages-per-pipeline-rank",
                                "--pipeline-model-parallel-layout")) == 1
    notes = export_notes(plan, "megatron")
    assert any("selective" in n for n in notes)
    for n in notes:
        assert f"# note: {n}" in text


def test_megatron_uneven_stages():
    plan = llama_plan(tp=4, pp=4, vpp=1, dp=1, schedule="1f1b", stage_layers=[7, 9, 9, 7])
    a = megatron_args(export_plan(plan, "megatron"))
    assert a["--decoder-first-pipeline-num-layers"] == "7"
    assert a["--decoder-last-pipeline-num-layers"] == "7"
    assert "--num-layers-per-virtual-pipeline-stage" not in a

    plan = llama_plan(stage_layers=[7, 9, 9, 7])  # pp=2, vpp=2
    a = megatron_args(export_plan(plan, "megatron"))
    assert a["--pipeline-model-parallel-layout"] == "Et*7|t*9|t*9|t*7L"
    assert "--num-layers-per-virtual-pipeline-stage" not in a
    assert "--decoder-first-pipeline-num-layers" not in a


def test_megatron_layout_string_expands_like_megatron():
    """The layout unrolls (Megatron's x*n rule) to pp*vpp stages holding the plan's block counts."""
    import re
    plan = llama_plan(stage_layers=[6, 10, 10, 6])
    layout = megatron_args(export_plan(plan, "megatron"))["--pipeline-model-parallel-layout"]
    flat = re.sub(r"(.)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), layout)
    stages = flat.split("|")
    assert [s.count("t") for s in stages] == [6, 10, 10, 6]
    assert stages[0].startswith("E") and stages[-1].endswith("L")
    assert flat.count("E") == 1 and flat.count("L") == 1


def test_megatron_schedule_approximations_are_noted():
    text = export_plan(llama_plan(schedule="zbv"), "megatron")
    assert "# note: schedule zbv" in text
    assert megatron_args(text)["--num-layers-per-virtual-pipeline-stage"] == "8"
    text = export_plan(llama_plan(vpp=1, schedule="gpipe"), "megatron")
    assert "# note: schedule gpipe" in text
    assert "--num-layers-per-virtual-pipeline-stage" not in megatron_args(text)


def test_megatron_gpt_zero3_offload():
    plan = gpt_plan()
    text = export_plan(plan, "megatron")
    a = megatron_args(text)
    assert a["--tensor-model-parallel-size"] == "1"
    assert a["--pipeline-model-parallel-size"] == "1"
    assert a["--fp16"] is True and "--bf16" not in a
    assert a["--recompute-granularity"] == "full"
    assert a["--recompute-method"] == "uniform"
    assert a["--recompute-num-layers"] == "1"
    assert a["--position-embedding-type"] == "learned_absolute"
    assert a["--normalization"] == "LayerNorm"
    assert "--swiglu" not in a and "--disable-bias-linear" not in a
    assert "--untie-embeddings-and-output-weights" not in a  # tied
    assert "--group-query-attention" not in a
    assert a["--max-position-embeddings"] == "2048"
    assert a["--padded-vocab-size"] == "50257"
    assert a["--use-megatron-fsdp"] is True
    assert a["--data-parallel-sharding-strategy"] == "optim_grads_params"
    # the Megatron-FSDP user guide's required flags (docs/discussions/megatron-fsdp-user-guide)
    assert a["--use-distributed-optimizer"] is True and a["--no-gradient-accumulation-fusion"] is True
    assert a["--ckpt-format"] == "fsdp_dtensor"
    assert a["--optimizer-cpu-offload"] is True
    assert a["--use-precision-aware-optimizer"] is True
    assert "--sequence-parallel" not in a
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in text.split("# note:")[-1].split("\n", 1)[1]
    assert "# note: zero_stage 3" in text
    assert any("train-iters" in n for n in export_notes(plan, "megatron"))  # no tokens in this plan
    assert "--train-iters 1000 " in export_plan(plan, "megatron")  # a placeholder, as torchtitan's steps: it runs


def test_megatron_values_are_shell_quoted():
    plan = llama_plan(tp=4, pp=4, vpp=2, dp=1, stage_layers=[3, 4, 5, 4, 4, 4, 4, 4])
    text = export_plan(plan, "megatron")
    assert "'Et*3|" in text  # the | in the layout is quoted
    assert megatron_args(text)["--pipeline-model-parallel-layout"].startswith("Et*3|t*4|t*5|")


def test_torchtitan_llama():
    plan = llama_plan()
    cfg = tomllib.loads(export_plan(plan, "torchtitan"))
    assert cfg["model"] == {"name": "llama3", "flavor": "8B"}
    tr, par = cfg["training"], cfg["parallelism"]
    assert tr["seq_len"] == 4096
    assert tr["global_batch_size"] == 64
    assert tr["local_batch_size"] == 32  # mbs x num_microbatches with PP
    assert par["pipeline_parallel_microbatch_size"] == 1
    assert tr["local_batch_size"] // par["pipeline_parallel_microbatch_size"] == 32
    assert tr["global_batch_size"] == tr["local_batch_size"] * par["data_parallel_shard_degree"] \
        * par["data_parallel_replicate_degree"]
    assert tr["mixed_precision_param"] == "bfloat16"
    assert tr["steps"] == -(-10**9 // (64 * 4096))
    assert par["tensor_parallel_degree"] == 4
    assert par["pipeline_parallel_degree"] == 2
    assert par["context_parallel_degree"] == 1
    assert par["data_parallel_shard_degree"] == 2 and par["data_parallel_replicate_degree"] == 1
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert par["pipeline_parallel_split_points"] == ["layers.8", "layers.16", "layers.24"]
    assert len(par["pipeline_parallel_split_points"]) + 1 == 2 * 2  # pp * vpp stages
    assert par["enable_async_tensor_parallel"] is False
    assert cfg["activation_checkpoint"]["mode"] == "selective"
    notes = export_notes(plan, "torchtitan")
    assert any("zero_stage 1" in n for n in notes)
    # newer torchtitan main counts the batch in tokens (config/training.py): the header gives those counts
    header = " ".join(x[2:] for x in export_plan(plan, "torchtitan").splitlines() if x.startswith("# "))
    assert "num_tokens_per_microbatch_per_dp_rank = 4096 (micro-batch 1 x seq_len 4096)" in header
    assert "num_tokens_per_train_step = 262144" in header and "num_pp_microbatches = 32" in header


def test_torchtitan_02_writes_the_keys_its_config_manager_asks_for():
    """torchtitan 0.2.2's ConfigManager refuses training.compile, training.seed and pipeline_parallel_split_points
    (benchmarks/results/2026-12-03-export-parse: 0 of 12 exports parsed, 12 of 12 after these renames): --to
    torchtitan-0.2 writes [compile] enable, [debug] seed and module_fqns_per_model_part, the rest as --to torchtitan."""
    plan = llama_plan()
    old, new = (tomllib.loads(export_plan(plan, to)) for to in ("torchtitan", "torchtitan-0.2"))
    assert "compile" not in new["training"] and "seed" not in new["training"]
    assert new["compile"] == {"enable": old["training"]["compile"]} and new["debug"] == {"seed": old["training"]["seed"]}
    parts = new["parallelism"].pop("module_fqns_per_model_part")
    assert "pipeline_parallel_split_points" not in new["parallelism"]
    assert [p for p in parts if p[0].startswith("layers.")] == parts[1:]  # the embedding opens the first part
    assert parts[0][:2] == ["tok_embeddings", "layers.0"] and parts[-1][-2:] == ["norm", "output"]
    assert [int(p[0 if i else 1].split(".")[1]) for i, p in enumerate(parts)][1:] == [8, 16, 24]  # the split points
    assert sum(len([m for m in p if m.startswith("layers.")]) for p in parts) == plan.model.layers
    old["parallelism"].pop("pipeline_parallel_split_points")
    for key in ("compile", "seed"):
        old["training"].pop(key)
    assert {k: v for k, v in new.items() if k not in ("compile", "debug")} == old
    assert not any("module_fqns_per_model_part" in n for n in export_notes(plan, "torchtitan-0.2"))
    assert "0.2 TOML releases" in export_plan(plan, "torchtitan-0.2").splitlines()[1]


@pytest.mark.parametrize("schedule,vpp,name", [("gpipe", 1, "GPipe"), ("1f1b", 1, "1F1B"),
                                               ("interleaved-zb", 2, "InterleavedZeroBubble"),
                                               ("zbv", 2, "ZBVZeroBubble")])
def test_torchtitan_schedules(schedule, vpp, name):
    cfg = tomllib.loads(export_plan(llama_plan(schedule=schedule, vpp=vpp), "torchtitan"))
    assert cfg["parallelism"]["pipeline_parallel_schedule"] == name
    assert len(cfg["parallelism"]["pipeline_parallel_split_points"]) == 2 * vpp - 1


def test_torchtitan_warns_that_its_zero_bubble_weight_pass_reruns_checkpointed_blocks():
    # selective exports as torchtitan's op-level checkpointing too (the same TOML as selective-op): warned alike
    for recompute, warned in (("full", True), ("selective-op", True), ("selective", True), ("none", False)):
        notes = export_notes(llama_plan(schedule="zbv", vpp=2, recompute=recompute), "torchtitan")
        assert any("once per weight" in n for n in notes) == warned, recompute
    assert not any("once per weight" in n for n in export_notes(llama_plan(recompute="full"), "torchtitan"))


def test_torchtitan_zero0_replicates_and_uneven_split():
    plan = llama_plan(zero_stage=0, stage_layers=[7, 9, 9, 7])
    cfg = tomllib.loads(export_plan(plan, "torchtitan"))
    par = cfg["parallelism"]
    assert par["data_parallel_replicate_degree"] == 2 and par["data_parallel_shard_degree"] == 1
    assert par["pipeline_parallel_split_points"] == ["layers.7", "layers.16", "layers.25"]
    assert any("replicate" in n for n in export_notes(plan, "torchtitan"))
    # later torchtitan refuses the split points: the same stages in module_fqns_per_model_part's form, in a note
    said = [n for n in export_notes(plan, "torchtitan") if "module_fqns_per_model_part = " in n]
    stages = json.loads(said[0].split("module_fqns_per_model_part = ", 1)[1])
    assert [len([x for x in s if x.startswith("layers.")]) for s in stages] == [7, 9, 9, 7]
    assert stages[0][:2] == ["tok_embeddings", "layers.0"] and stages[-1][-3:] == ["layers.31", "norm", "output"]


def test_llm_foundry_default_mixed_precision_names_the_composer_it_needs():
    """Composer's DEFAULT reduces in fp32 since its PR #2628 (2023-10): the export says so where it writes DEFAULT."""
    plan = llama_plan(tp=1, pp=1, dp=8, sp=False, zero_stage=3, vpp=1, schedule="1f1b")
    assert "mixed_precision: DEFAULT" in export_plan(plan, "llm-foundry")
    assert any("PR #2628" in n for n in export_notes(plan, "llm-foundry"))


def test_exports_keep_the_constant_learning_rate_the_runtime_trains_with():
    """Megatron-LM decays linearly to 0 over --train-iters by default, torchtitan warms up 200 steps and decays
    linearly (its LRScheduler): both exports ask for a constant rate, as llm-foundry's does."""
    plan = llama_plan()
    assert "--lr-decay-style constant" in export_plan(plan, "megatron")
    text = export_plan(plan, "torchtitan")
    assert tomllib.loads(text)["lr_scheduler"] == {"warmup_steps": 0, "decay_ratio": 0.0}
    assert "[debug] seed" in text and "[compile] enable" in text  # later TOML releases' names, in the header


def test_torchtitan_gpt_zero3_offload():
    plan = gpt_plan()
    text = export_plan(plan, "torchtitan")
    cfg = tomllib.loads(text)
    par, tr = cfg["parallelism"], cfg["training"]
    assert par["data_parallel_shard_degree"] == 8 and par["data_parallel_replicate_degree"] == 1
    assert par["pipeline_parallel_degree"] == 1 and "pipeline_parallel_schedule" not in par
    assert tr["local_batch_size"] == 2 and tr["global_batch_size"] == 32  # 2 accumulation steps over dp 8
    assert tr["enable_cpu_offload"] is True
    assert cfg["activation_checkpoint"]["mode"] == "full"
    assert cfg["model"]["flavor"] == "gpt-1.3b"
    notes = export_notes(plan, "torchtitan")
    assert any("gpt" in n for n in notes) and any("fp16" in n for n in notes)
    assert any("flavor" in n for n in notes)
    for n in notes:
        assert f"# note: {n}" in text


def test_deepspeed_llama():
    plan = llama_plan()
    cfg = json.loads(export_plan(plan, "deepspeed"))
    t, p = plan.training, plan.parallel
    assert cfg["train_micro_batch_size_per_gpu"] == 1
    assert cfg["gradient_accumulation_steps"] == 32
    assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * p.dp
    assert cfg["train_batch_size"] == t.global_batch_size
    assert cfg["zero_optimization"]["stage"] == 1
    assert "offload_optimizer" not in cfg["zero_optimization"]
    assert cfg["bf16"] == {"enabled": True} and "fp16" not in cfg
    assert cfg["gradient_clipping"] == 1.0
    allowed = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
               "gradient_clipping", "bf16", "fp16", "zero_optimization", "pipeline", "optimizer", "data_types",
               "communication_data_type"}
    assert set(cfg) <= allowed
    # the plan's fp32 gradients (master-weights): DeepSpeed accumulates in bf16 unless told
    assert t.precision == "master-weights" and cfg["data_types"] == {"grad_accum_dtype": "fp32"}
    notes = export_notes(plan, "deepspeed")
    assert any("tp=4" in n for n in notes) and any("pp=2" in n for n in notes)
    assert any("Interleav" in n or "interleav" in n for n in notes)
    # the pipeline transfers the prediction assumed: DeepSpeed partitions them over TP unless told not to
    # (its config defaults pipe_partitioned and grad_partitioned to true); with SP there is nothing to partition
    # with SP the TP ranks hold different sequence chunks, which DeepSpeed's partitioning would mix up: off
    # (Megatron-DeepSpeed's scripts: PARTITIONED_MODE=false with SEQ_PARALLEL)
    assert cfg["pipeline"] == {"pipe_partitioned": False, "grad_partitioned": False}  # this plan has SP
    plan = llama_plan(sp=False)
    for sg in (True, False):
        plan.training.p2p_scatter_gather = sg
        cfg = json.loads(export_plan(plan, "deepspeed"))
        assert cfg["pipeline"] == {"pipe_partitioned": sg, "grad_partitioned": sg}
    assert "pipeline" not in json.loads(export_plan(llama_plan(sp=False, pp=1, vpp=1, dp=4,
                                                               schedule="1f1b"), "deepspeed"))


def test_deepspeed_gpt_zero3_offload():
    plan = gpt_plan()
    cfg = json.loads(export_plan(plan, "deepspeed"))
    assert cfg["train_batch_size"] == 2 * 2 * 8 == 32
    assert cfg["zero_optimization"]["stage"] == 3
    assert cfg["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert cfg["fp16"]["enabled"] is True and "bf16" not in cfg
    assert not any("tp=" in n for n in export_notes(plan, "deepspeed"))
    # the stage-3 schedule the prediction assumed (cost_models/zero3.py): DeepSpeed's defaults, with a
    # live-parameter cap at least the largest pair of adjacent weights so the next weight is prefetched
    z = cfg["zero_optimization"]
    assert z["stage3_prefetch_bucket_size"] == 50_000_000 and z["stage3_max_reuse_distance"] == 1_000_000_000
    assert z["stage3_max_live_parameters"] >= 1_000_000_000


def test_format_name_is_case_insensitive():
    assert export_plan(llama_plan(), "DeepSpeed") == export_plan(llama_plan(), "deepspeed")


def test_framework_note_only_when_predicted_for_another_framework():
    from planner.export import framework_note
    plan = llama_plan()
    assert plan.training.framework == "parplan"
    from planner.export import FORMAT_FRAMEWORK
    for to in FORMATS:
        note = framework_note(plan, to)
        assert note and f"--framework {FORMAT_FRAMEWORK[to]}" in note
    plan.training.framework = "megatron"
    assert framework_note(plan, "megatron") is None
    assert "models megatron, not deepspeed" in framework_note(plan, "deepspeed")


def test_framework_note_names_what_the_target_framework_changes():
    """The note lists the stack flags that `recommend --framework TO` would set differently (checked against
    what recommend does) and the behaviours the framework itself decides."""
    from planner.core import STACK_FLAGS, recommend
    from planner.export import framework_differences
    from planner.export import FORMAT_FRAMEWORK
    plan = llama_plan()
    for to in sorted(set(FORMAT_FRAMEWORK.values())):
        diff = framework_differences(plan, to)
        rec = recommend(plan.model, 16, seq_len=4096, global_batch_size=64, precision="master-weights", framework=to,
                        top_k=1, suggest=False)
        for k in STACK_FLAGS:
            listed = [d for d in diff if d.startswith(k + " ")]
            if getattr(rec.training, k) == getattr(plan.training, k):
                assert not listed, (to, k)
            else:
                assert listed == [f"{k} {getattr(plan.training, k)} -> {getattr(rec.training, k)}"], (to, k, listed)
    assert "a pipeline receive buffer per micro-batch" in framework_differences(plan, "torchtitan")
    assert "four blocking pipeline transfers a micro-batch" in framework_differences(plan, "deepspeed")
    plan.training.framework = "megatron"
    assert "fused_elementwise" not in " ".join(framework_differences(plan, "deepspeed"))


def test_op_level_selective_recompute_exports_as_torchtitans_own_mode():
    plan = llama_plan(recompute="selective-op")
    cfg = tomllib.loads(export_plan(plan, "torchtitan"))
    assert cfg["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert not any("recompute selective" in n for n in export_notes(plan, "torchtitan"))
    # Megatron-LM has no such mode: full recompute, said so
    args = megatron_args(export_plan(plan, "megatron"))
    assert args["--recompute-granularity"] == "full"
    assert any("selective-op" in n for n in export_notes(plan, "megatron"))


def test_torchtitan_compile_follows_fused_elementwise():
    """The prediction's pointwise model (fused kernels or eager ops) is what the exported job runs."""
    plan = llama_plan()
    for fused in (True, False):
        p = plan.model_copy(update={"training": plan.training.model_copy(update={"fused_elementwise": fused})})
        assert tomllib.loads(export_plan(p, "torchtitan"))["training"]["compile"] is fused
        # async TP without compile is torchtitan's RuntimeError at start-up ("Async TP requires --training.compile")
        p.training.overlap_tp_comm = True
        cfg = tomllib.loads(export_plan(p, "torchtitan"))
        assert cfg["parallelism"]["enable_async_tensor_parallel"] is fused is cfg["training"]["compile"]
        assert any("needs torch.compile" in n for n in export_notes(p, "torchtitan")) is not fused


def test_megatron_context_parallel_follows_the_predicted_exchange():
    """A plan predicted with all-gather CP (overlap_cp_comm off: parplan's runtime, Llama 3) asks Megatron for
    --cp-comm-type all_gather (Transformer Engine's name: attn_forward_func_with_cp raises "Unsupported communication
    type" on "allgather", which this export wrote until 2026-11-29, after arguments.py's help text); with the ring
    (overlap on, Megatron's own default p2p) nothing is added, unless a sliding window binds: TE's p2p refuses it."""
    plan = llama_plan(tp=4, pp=1, vpp=1, dp=2, cp=2, schedule="1f1b")
    plan.hardware.gpus = 16
    a = megatron_args(export_plan(plan, "megatron"))
    assert a["--context-parallel-size"] == "2" and a["--cp-comm-type"] == "all_gather"
    plan.training.overlap_cp_comm = True
    a = megatron_args(export_plan(plan, "megatron"))
    assert "--cp-comm-type" not in a
    plan.model.sliding_window = plan.training.seq_len // 2
    a = megatron_args(export_plan(plan, "megatron"))
    assert a["--cp-comm-type"] == "all_gather"
    assert any("sliding window" in n and "all_gather" in n for n in export_notes(plan, "megatron"))
    plan.model.sliding_window = plan.training.seq_len  # a window the sequence never exceeds changes nothing: no
    a = megatron_args(export_plan(plan, "megatron"))  # --window-size either (TE would call any window sliding)
    assert "--cp-comm-type" not in a and "--window-size" not in a
    assert any("overlap_cp_comm off" in n for n in export_notes(llama_plan(cp=2, tp=4, pp=1, vpp=1, schedule="1f1b"),
                                                                 "torchtitan"))


def test_gradient_clipping_is_exported_as_planned():
    """The plan's clip_grad (1.0 from recommend) becomes each framework's threshold; a plan without it
    (None: the prediction counts no clipping pass) exports clipping off: Megatron-LM and DeepSpeed take
    0, torchtitan an infinite max_norm."""
    for clip, mega, ds, titan in ((1.0, 1.0, 1.0, 1.0), (0.3, 0.3, 0.3, 0.3), (None, 0.0, 0.0, math.inf)):
        plan = llama_plan()
        plan = plan.model_copy(update={"training": plan.training.model_copy(update={"clip_grad": clip})})
        assert float(megatron_args(export_plan(plan, "megatron"))["--clip-grad"]) == mega
        assert json.loads(export_plan(plan, "deepspeed"))["gradient_clipping"] == ds
        assert tomllib.loads(export_plan(plan, "torchtitan"))["training"]["max_norm"] == titan


def test_a_tied_llama_exported_to_torchtitan_says_its_head_is_untied_there():
    plan = llama_plan()
    plan = plan.model_copy(update={"model": plan.model.model_copy(update={"tied_embeddings": True})})
    assert any("tied_embeddings" in n for n in export_notes(plan, "torchtitan"))
    assert not any("tied_embeddings" in n for n in export_notes(llama_plan(), "torchtitan"))


def _with(plan: Plan, section: str, **update) -> Plan:
    return plan.model_copy(update={section: getattr(plan, section).model_copy(update=update)})


def test_megatron_realises_what_the_plan_predicted_not_its_defaults():
    """Megatron-LM's defaults differ from a plan's: dropout 0.1 (plans run without), fp32 gradient reduction
    under --bf16 and 16-bit under --fp16 (each recipe says which), and the NullTokenizer's end-of-document id
    one past --vocab-size, which the mock data appends to every sample."""
    plan = llama_plan(tp=2, pp=1, vpp=1, dp=8, schedule="1f1b")
    a = megatron_args(export_plan(plan, "megatron"))
    assert a["--hidden-dropout"] == "0.0" and a["--attention-dropout"] == "0.0"
    assert int(a["--vocab-size"]) + 1 == int(a["--padded-vocab-size"]) == plan.model.vocab
    assert "--grad-reduce-in-bf16" not in a and "--accumulate-allreduce-grads-in-fp32" not in a  # bf16, fp32 grads
    half = _with(plan, "training", precision="master-weights-half-grads")
    assert megatron_args(export_plan(half, "megatron"))["--grad-reduce-in-bf16"] is True
    fp16 = _with(plan, "training", dtype="fp16")
    assert megatron_args(export_plan(fp16, "megatron"))["--accumulate-allreduce-grads-in-fp32"] is True


def test_megatron_uneven_split_is_the_predicted_one_and_never_an_empty_end():
    """Without stage_layers the export splits as the cost model did (cost_models.layout.stage_layers: the
    remainder to the middle stages first, 30 layers on 4 stages -> 7, 8, 8, 7); an empty first or last stage
    goes as an explicit layout, since Megatron's first/last-stage flags must be > 0."""
    plan = _with(llama_plan(tp=2, pp=4, vpp=1, dp=2, schedule="1f1b"), "model", layers=30)
    a = megatron_args(export_plan(plan, "megatron"))
    assert (a["--decoder-first-pipeline-num-layers"], a["--decoder-last-pipeline-num-layers"]) == ("7", "7")
    empty_end = _with(plan, "parallel", stage_layers=[0, 15, 15, 0])
    b = megatron_args(export_plan(empty_end, "megatron"))
    assert "--decoder-first-pipeline-num-layers" not in b and "--pipeline-model-parallel-layout" in b


def test_torchtitan_zero3_keeps_its_default_resharding():
    """torchtitan's fsdp_reshard_after_forward "default" is `not pp_enabled`: with a pipeline the parameters stay
    gathered through the step, as the prediction counts them (and parplan's runtime runs them); "always" would
    gather them again for every micro-batch.  DDP with tp > 1 is refused by torchtitan, which the notes say with
    the fix."""
    with_pp = tomllib.loads(export_plan(llama_plan(tp=2, pp=2, vpp=1, dp=4, zero_stage=3, schedule="1f1b"), "torchtitan"))
    without = tomllib.loads(export_plan(llama_plan(tp=2, pp=1, vpp=1, dp=8, zero_stage=3, schedule="1f1b"), "torchtitan"))
    assert with_pp["parallelism"]["fsdp_reshard_after_forward"] == "default"
    assert without["parallelism"]["fsdp_reshard_after_forward"] == "default"
    ddp = llama_plan(tp=2, pp=1, vpp=1, dp=8, zero_stage=0, schedule="1f1b")
    assert any("DDP" in n and "--zero 3" in n for n in export_notes(ddp, "torchtitan"))


def test_launch_line_fills_nodes_evenly():
    """torchrun starts the same number of ranks on every node: 12 GPUs on 8-GPU nodes are 2 x 6, not 2 x 8."""
    plan = llama_plan(sp=False, pp=3, vpp=1, dp=4, tp=1, schedule="1f1b")
    plan.model.layers = 24
    text = export_plan(plan, "megatron")
    assert "torchrun --nnodes 2 --nproc-per-node 6 " in text
    assert any("2 nodes x 6" in n for n in export_notes(plan, "megatron"))
    toml = export_plan(plan, "torchtitan")
    assert "NGPU=6 " in toml and any("multinode" in n for n in export_notes(plan, "torchtitan"))
    plan = llama_plan()
    assert f"--nnodes {plan.hardware.gpus // 8} --nproc-per-node 8 " in export_plan(plan, "megatron")


def test_megatron_fp32_gets_an_attention_kernel_it_has():
    plan = llama_plan()
    plan.training.precision = "fp32"
    plan.training.dtype = "fp32"
    text = export_plan(plan, "megatron")
    assert "--attention-backend unfused" in text and "--bf16" not in text
    assert any("16-bit inputs" in n for n in export_notes(plan, "megatron"))
    assert "--attention-backend flash" in export_plan(llama_plan(), "megatron")


def test_megatron_offload_without_zero_adds_the_distributed_optimizer():
    plan = llama_plan()
    plan.parallel.zero_stage = 0
    plan.parallel.offload = "optimizer"
    text = export_plan(plan, "megatron")
    assert "--use-precision-aware-optimizer" in text and "--use-distributed-optimizer" in text
    assert any("offload optimizer with zero_stage 0" in n for n in export_notes(plan, "megatron"))


def test_deepspeed_pipeline_caps_zero_at_stage_1():
    """DeepSpeed's PipelineEngine asserts ZeRO stage < 2: the default 70B plan (ZeRO-2, pp 4) exported as is
    would not start."""
    plan = llama_plan(sp=False)
    for z in (2, 3):
        plan.parallel.zero_stage = z
        cfg = json.loads(export_plan(plan, "deepspeed"))
        assert cfg["zero_optimization"]["stage"] == 1
        assert any(f"zero_stage {z} with pipeline" in n for n in export_notes(plan, "deepspeed"))
    plan = llama_plan(sp=False, pp=1, vpp=1, dp=4, schedule="1f1b")
    plan.parallel.zero_stage = 3
    assert json.loads(export_plan(plan, "deepspeed"))["zero_optimization"]["stage"] == 3


def test_torchtitan_notes_fp32_without_fsdp_and_16_bit_gradients():
    plan = llama_plan(sp=True, pp=2, dp=1)  # tp x pp, no FSDP: torchtitan turns mixed precision off
    plan.parallel.zero_stage = 0
    assert any("trains in fp32" in n for n in export_notes(plan, "torchtitan"))
    plan = llama_plan(sp=True, pp=1, vpp=1, schedule="1f1b", dp=1, cp=2)  # FSDP is on whenever cp > 1: ZeRO 0 is sharded there
    plan.parallel.zero_stage = 0
    assert any("turns FSDP on whenever cp > 1" in n for n in export_notes(plan, "torchtitan"))
    plan = llama_plan()
    plan.training.precision = "master-weights-half-grads"
    assert any("mixed_precision_reduce accepts float32" in n for n in export_notes(plan, "torchtitan"))


def test_names_with_control_characters_and_non_finite_numbers_are_refused():
    """A name lands in exported comment lines (a newline would start a shell command or a TOML table), and
    an infinite learning rate, clip or token count is no plan."""
    from pydantic import ValidationError
    doc = json.loads(llama_plan().model_dump_json())
    for path, value in ((("model", "name"), "llama\necho INJECTED"), (("hardware", "name"), "h100\n[training]"),
                        (("training", "lr"), float("inf")), (("training", "clip_grad"), float("inf")),
                        (("training", "tokens"), 1e300), (("training", "tokens"), float("nan"))):
        bad = copy.deepcopy(doc)
        bad[path[0]][path[1]] = value
        with pytest.raises(ValidationError):
            Plan.model_validate(bad)


def test_rope_base_reaches_megatron_and_is_checked_against_torchtitans_flavor():
    plan = llama_plan()
    plan.model.rope_theta = 500000.0  # Llama 3
    assert "--rotary-base 500000 " in export_plan(plan, "megatron")
    assert not any("rope_theta" in n for n in export_notes(plan, "torchtitan"))  # the 8B flavor's own
    plan.model.rope_theta = 12345.6  # arguments.py: --rotary-base type=int, so argparse would refuse 12345.6
    assert "--rotary-base 12346 " in export_plan(plan, "megatron")
    assert any("rounded to 12346" in n for n in export_notes(plan, "megatron"))
    plan.model.rope_theta = None  # 10000
    assert "--rotary-base" not in export_plan(plan, "megatron")  # Megatron-LM's default, 10000
    assert any("rope_theta" in n and "500000" in n for n in export_notes(plan, "torchtitan"))


def test_megatron_notes_micro_batches_torchs_interleaving_runs_and_its_does_not():
    """torch's interleaved schedules run m in max(1, m // pp) rounds (3 over pp 2); Megatron-LM needs a multiple."""
    plan = llama_plan()  # interleaved over pp 2 with 32 micro-batches
    assert not any("needs a multiple of pp" in n for n in export_notes(plan, "megatron"))
    plan.training.num_microbatches, plan.training.global_batch_size = 3, 6
    assert any("needs a multiple of pp" in n for n in export_notes(plan, "megatron"))


def test_megatron_overlap_flags_follow_the_plan_and_megatrons_rule():
    """--overlap-grad-reduce and, with the distributed optimizer, --overlap-param-gather as the plan predicted;
    Megatron-LM refuses the gather's overlap without the reduction's ("Must use --overlap-param-gather with
    --overlap-grad-reduce"), so that plan exports without it and says so."""
    plan = llama_plan(zero_stage=1)
    a = megatron_args(export_plan(plan, "megatron"))
    assert a.get("--overlap-grad-reduce") and a.get("--overlap-param-gather")
    plan.training.overlap_param_gather = False
    a = megatron_args(export_plan(plan, "megatron"))
    assert a.get("--overlap-grad-reduce") and "--overlap-param-gather" not in a
    plan.training.overlap_grad_reduce, plan.training.overlap_param_gather = False, True
    a = megatron_args(export_plan(plan, "megatron"))
    assert "--overlap-grad-reduce" not in a and "--overlap-param-gather" not in a
    assert any("overlap_param_gather without overlap_grad_reduce" in n for n in export_notes(plan, "megatron"))


def test_megatron_mock_data_warns_below_its_token_range():
    """Megatron's mock samples (older MockGPTLowLevelDataset) hold ids up to 4094 whatever the vocabulary: a smaller
    embedding would be indexed past its end, so such an export says to use real data."""
    plan = llama_plan()
    assert not any("mock samples" in n for n in export_notes(plan, "megatron"))
    plan.model.vocab = 1024
    assert any("mock samples" in n and "4094" in n for n in export_notes(plan, "megatron"))


def test_deepspeed_gradient_dtype_and_overlap_follow_what_deepspeed_accepts():
    """bf16 with the plan's fp32 gradients: DeepSpeed's fp32 accumulation selects its BF16_Optimizer at stage 1 (an
    all-reduce), is refused at stage 0 (engine._do_optimizer_sanity_check: "unsupported mix"), and keeps ZeRO-2/3's
    gradient shards in fp32, reduced in fp32 with communication_data_type (the BF16_Optimizer's all-reduce too, which
    the engine would otherwise cast to bf16); data_types is written for those; a bf16
    stage 0 inside a pipeline runs the BF16_Optimizer, which shards the optimizer over dp (said); overlap_comm only
    where DeepSpeed honours it (not under its pipeline engine, not in the BF16_Optimizer), each with a note."""
    def ds(**kw):
        reduce = kw.pop("reduce", "all-reduce")
        plan = llama_plan(**kw)
        plan.training.zero1_grad_reduce = reduce
        return json.loads(export_plan(plan, "deepspeed")), export_notes(plan, "deepspeed")

    flat = dict(pp=1, vpp=1, dp=4, schedule="1f1b")
    cfg, notes = ds(zero_stage=0, **flat)
    assert "data_types" not in cfg and cfg["zero_optimization"]["stage"] == 0
    assert any("refuses fp32 gradient accumulation with a bf16 model without ZeRO" in n for n in notes)
    cfg, notes = ds(zero_stage=0, pp=2, vpp=1, dp=4, schedule="1f1b")
    assert "data_types" not in cfg and any("BF16_Optimizer, which shards the optimizer over the 4 data-parallel"
                                           in n for n in notes)
    for stage in (2, 3):
        cfg, notes = ds(zero_stage=stage, **flat)
        assert cfg["data_types"] == {"grad_accum_dtype": "fp32"} and cfg["communication_data_type"] == "fp32"
    cfg, notes = ds(zero_stage=1, **flat)
    assert cfg["data_types"] == {"grad_accum_dtype": "fp32"} and cfg["zero_optimization"]["overlap_comm"] is False
    assert cfg["communication_data_type"] == "fp32"  # the engine's all-reduce would cast its buckets to bf16
    assert any("in its BF16_Optimizer" in n for n in notes)
    cfg, notes = ds(zero_stage=1, reduce="reduce-scatter", **flat)
    assert "data_types" not in cfg and cfg["zero_optimization"]["overlap_comm"] is True
    assert any("--zero1-grad-reduce all-reduce" in n for n in notes)
    cfg, notes = ds(zero_stage=1, reduce="reduce-scatter")  # pp 2
    assert cfg["zero_optimization"]["overlap_comm"] is False and any("under its pipeline engine" in n for n in notes)
    # the AdamW the plan counts, not DeepSpeed's defaults (0.999, 0)
    assert cfg["optimizer"]["params"]["betas"] == [0.9, 0.95] and cfg["optimizer"]["params"]["weight_decay"] == 0.1


def test_megatron_writes_the_plans_gradient_accumulation_and_notes_what_it_cannot_be_told():
    plan = llama_plan()
    plan.training.framework = "megatron"
    plan.training.grad_accumulation_fusion = False
    plan.training.async_tp_grad_comm = False
    a = megatron_args(export_plan(plan, "megatron"))
    assert a["--no-gradient-accumulation-fusion"] is True
    notes = export_notes(plan, "megatron")
    assert any(n.startswith("async_tp_grad_comm False: Megatron-LM has no flag for it") for n in notes)
    plan.training.grad_accumulation_fusion = True
    assert "--no-gradient-accumulation-fusion" not in megatron_args(export_plan(plan, "megatron"))


@pytest.mark.parametrize("dim, ffn", [(768, 3072), (4096, 14336), (5120, 13824), (1024, 2816), (8192, 28672),
                                      (4096, 11008)])
def test_torchtitan_custom_flavor_gets_its_mlp_width_from_multiplier_and_multiple_of(dim, ffn):
    """torchtitan's llama3 has no MLP-width field: the note's ffn_dim_multiplier and multiple_of give the plan's
    width through FeedForward's own arithmetic (its 8B: 1.3 and 1024 give 14336)."""
    import re
    from planner.export import _titan_ffn_args, titan_ffn_width
    assert titan_ffn_width(4096, 1.3, 1024) == 14336
    got = re.fullmatch(r"ffn_dim_multiplier=([0-9.]+|None), multiple_of=(\d+)", _titan_ffn_args(dim, ffn))
    assert got, _titan_ffn_args(dim, ffn)
    assert titan_ffn_width(dim, None if got[1] == "None" else float(got[1]), int(got[2])) == ffn


def test_torchtitan_mlp_width_args_hold_for_every_width():
    """Every width from dim to 5 dim on a few dims (odd ones included) gets a pair FeedForward turns into it exactly:
    the multiplier is printed in full (a 6-digit print had given 8192 for 8193)."""
    import re
    from planner.export import _titan_ffn_args, titan_ffn_width
    for dim in (256, 1000, 3072):
        for ffn in range(dim, 5 * dim, 13):
            got = re.fullmatch(r"ffn_dim_multiplier=([0-9.]+|None), multiple_of=(\d+)", _titan_ffn_args(dim, ffn))
            assert got and titan_ffn_width(dim, None if got[1] == "None" else float(got[1]), int(got[2])) == ffn, \
                (dim, ffn, _titan_ffn_args(dim, ffn))


def test_megatron_names_what_a_qwen_checkpoint_adds_to_llama_blocks():
    from planner.models import load_preset
    for name, flag in (("qwen2.5-7b", "--add-qkv-bias"), ("qwen3-8b", "--qk-layernorm"), ("llama3-8b", None)):
        plan = llama_plan(pp=1, vpp=1, schedule="1f1b")
        plan = plan.model_copy(update={"model": load_preset(name)})
        said = [n for n in export_notes(plan, "megatron") if "--norm-epsilon 1e-6" in n]
        assert (len(said) == 1 and flag in said[0]) if flag else not said, (name, said)
        # Qwen3's q/k norms are in the preset (ModelSpec.qk_norm), counted and written; without them, named in the note
        args = dict(_megatron_args(plan)[0])
        assert ("--qk-layernorm" in args) is (name == "qwen3-8b")
        if name == "qwen3-8b":
            bare = plan.model_copy(update={"model": load_preset(name).model_copy(update={"qk_norm": None})})
            assert "--qk-layernorm" not in dict(_megatron_args(bare)[0])
            assert any("--qk-layernorm (its per-head" in n for n in export_notes(bare, "megatron"))


def test_foundry_and_torchtitan_name_what_a_qwen_or_gemma_checkpoint_adds():
    """The MPT and torchtitan's llama3 model train llama-style blocks of the plan's shape: a Qwen or Gemma plan's export
    says what the checkpoint has beyond them (Qwen2's q/k/v biases, Qwen3's q/k norms, Gemma's GeGLU and norms)."""
    from planner.hf_config import model_from_hf_config
    from planner.models import load_preset
    from pathlib import Path
    gemma = model_from_hf_config(Path(__file__).resolve().parent / "data" / "hf_configs" / "gemma-2b.json")
    for model, extra in ((load_preset("qwen2.5-7b"), "q/k/v biases"), (load_preset("qwen3-8b"), "q/k RMSNorms"),
                         (gemma, "tanh-GeLU gate"), (load_preset("llama3-8b"), None)):
        plan = llama_plan(pp=1, vpp=1, schedule="1f1b")
        plan = plan.model_copy(update={"model": model})
        for to in ("llm-foundry", "torchtitan"):
            said = [n for n in export_notes(plan, to) if "not that checkpoint's architecture" in n]
            assert (len(said) == 1 and extra in said[0]) if extra else not said, (model.name, to, said)


def test_exports_say_what_another_familys_checkpoint_holds_otherwise():
    """A model read from a Hugging Face config of a family the exports do not name (Falcon, StarCoder2 with its biases
    off, Command R, OLMo 3, ...) is built as the plan's llama or gpt blocks: the Megatron, torchtitan and llm-foundry
    exports say what the checkpoint's own blocks hold otherwise, from the model's source; not where the blocks are
    the checkpoint's (a llama config, StarCoder2 with biases) nor for the families named already (Qwen, Gemma)."""
    from pathlib import Path
    from planner.hf_config import checkpoint_differences
    from planner.hf_config import model_from_hf_config
    data = Path(__file__).resolve().parent / "data" / "hf_configs"
    falcon = model_from_hf_config({"model_type": "falcon", "vocab_size": 65024, "hidden_size": 8192,
                                   "num_hidden_layers": 60, "num_attention_heads": 128, "num_kv_heads": 8,
                                   "new_decoder_architecture": True, "bias": False})
    starcoder = {"model_type": "starcoder2", "vocab_size": 49152, "hidden_size": 3072, "intermediate_size": 12288,
                 "num_hidden_layers": 30, "num_attention_heads": 24, "num_key_value_heads": 2}
    olmo3 = model_from_hf_config({"model_type": "olmo3", "vocab_size": 100278, "hidden_size": 4096,
                                  "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32})
    assert checkpoint_differences(falcon.source) == ("falcon", ["bias false: the checkpoint has no linear biases, gpt blocks "
                                                         "count them (about 4 h + ffn a layer)"])
    assert checkpoint_differences(olmo3.source) == ("olmo3", ["q/k norms' weights not counted"])
    assert checkpoint_differences(model_from_hf_config(starcoder).source) == ("starcoder2", [])
    cases = ((falcon, "falcon: the plan counts gpt blocks", "no linear biases"),
             (olmo3, "olmo3: the plan counts llama blocks", "q/k norms' weights not counted"),
             (model_from_hf_config({**starcoder, "use_bias": False}), "starcoder2: the plan counts gpt", "use_bias false"),
             (model_from_hf_config(starcoder), None, None),
             (model_from_hf_config(data / "Meta-Llama-3-8B.json"), None, None),
             (model_from_hf_config(data / "gemma-2b.json"), None, None), (model_from_hf_config(data / "Qwen2.5-7B.json"),
                                                                          None, None))
    for model, lead, difference in cases:
        plan = llama_plan(pp=1, vpp=1, schedule="1f1b").model_copy(update={"model": model})
        for to in ("megatron", "torchtitan", "llm-foundry"):
            said = [n for n in export_notes(plan, to) if "the checkpoint's own differ" in n]
            assert (len(said) == 1 and said[0].startswith(lead) and difference in said[0]) if lead else not said, \
                (model.name, to, said)
        hint = [n for n in export_notes(plan, "megatron") if n.startswith("--disable-bias-linear")]
        assert len(hint) == (1 if difference in ("no linear biases", "use_bias false") else 0), (model.name, hint)


def test_yaml_scalars_read_back_as_written():
    """The llm-foundry writer's scalars as a YAML 1.1 loader reads them: floats keep their digits and a dot, strings
    that would read as another type (a number, a bool, '-', '.5', '{x}') are quoted."""
    from planner.export import _yaml_scalar
    for v in (1e-8, 3e-05, 0.0003, 1.0, 3.5, 1.23456789e-4, 123456789.0, 1e20):
        assert _yaml(f"x: {_yaml_scalar(v)}")["x"] == v, v
    for v in ("mpt_causal_lm", "${max_seq_len}", "1000ba", "true", "no", "-", "-1", ".5", "{x}", "a b", ""):
        assert _yaml(f"x: {_yaml_scalar(v)}")["x"] == v, v
    assert _yaml_scalar("-1").startswith('"') and _yaml_scalar(".5").startswith('"') and _yaml_scalar("{x}")[0] == '"'


def _yaml(text: str) -> dict:
    """The export's YAML subset (block mappings by two-space indent, scalars, flow lists of scalars), read back."""
    root: dict = {}
    stack = [(-1, root)]
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        key, _, value = line.strip().partition(":")
        while stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        value = value.strip()
        if not value:
            parent[key] = {}
            stack.append((indent, parent[key]))
            continue

        def scalar(v):
            # YAML 1.1's resolvers (PyYAML's): a float needs a dot (1e-08 is a string there), quoted strings are JSON
            if v in ("true", "false"):
                return v == "true"
            if re.fullmatch(r"[-+]?[0-9]+", v):
                return int(v)
            if re.fullmatch(r"[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+][0-9]+)?", v):
                return float(v)
            return json.loads(v) if v.startswith('"') else v
        parent[key] = ([scalar(x.strip()) for x in value[1:-1].split(",")] if value.startswith("[")
                       else scalar(value))
    return root


def test_llm_foundry_yaml_carries_the_fsdp_plan():
    """--framework fsdp's plans export to llm-foundry's training YAML: the model as an MPT (GQA, rotary, SwiGLU,
    RMSNorm, no biases for llama), the batch, Composer's precision and FSDP sharding, mixed precision and
    checkpointing, under the keys of llm-foundry's mpt-7b.yaml and MPTConfig."""
    from planner.core import recommend
    from planner.models import load_preset
    plan = recommend(load_preset("llama3-8b"), 16, framework="fsdp", precision="master-weights",
                     pins=__import__("planner.search", fromlist=["Pins"]).Pins(tp=1, zero=3, recompute="full",
                                                                                dp_replicate=1))
    cfg = _yaml(export_plan(plan, "llm-foundry"))
    m, f = cfg["model"], cfg["fsdp_config"]
    assert m["name"] == "mpt_causal_lm" and (m["d_model"], m["n_heads"], m["n_layers"]) == (4096, 32, 32)
    assert m["expansion_ratio"] == 3.5 and m["vocab_size"] == 128256 and m["max_seq_len"] == "${max_seq_len}"
    assert m["no_bias"] is True and m["norm_type"] == "rmsnorm" and m["learned_pos_emb"] is False
    assert m["attn_config"] == {"attn_impl": "flash", "attn_type": "grouped_query_attention", "kv_n_heads": 8,
                                "rope": True, "rope_theta": 500000}
    # 3.5 is no whole ratio, which MPT refuses (int(d_model x ratio) must be exact): the width is given outright
    assert m["ffn_config"] == {"ffn_type": "mptglu", "ffn_act_fn": {"name": "silu"}, "ffn_hidden_size": 14336}
    t = plan.training
    assert cfg["seed"] == t.seed and cfg["scheduler"]["name"] == "constant_with_warmup"
    assert cfg["eval_interval"] == cfg["max_duration"]
    assert cfg["max_seq_len"] == t.seq_len and cfg["global_train_batch_size"] == t.global_batch_size
    assert cfg["device_train_microbatch_size"] == t.micro_batch_size and cfg["precision"] == "amp_bf16"
    assert f["sharding_strategy"] == "FULL_SHARD" and f["mixed_precision"] == "DEFAULT"
    assert f["activation_checkpointing"] is True and "cpu_offload" not in f
    assert cfg["optimizer"]["betas"] == [0.9, 0.95] and cfg["optimizer"]["eps"] == 1e-8
    assert cfg["algorithms"]["gradient_clipping"]["clipping_threshold"] == 1.0
    assert export_notes(plan, "llm-foundry") and not any("tp=" in n for n in export_notes(plan, "llm-foundry"))
    from planner.export import framework_note
    assert framework_note(plan, "llm-foundry") is None


def test_llm_foundry_gpt_is_mpt_and_says_what_it_cannot_carry():
    """A gpt plan is MPT itself (learned positions, biases, LayerNorm, tied head, GeLU MLP, the model's position table);
    the Triton kernel of validate's MPT rows, which llm-foundry removed in v0.7.0, is attn_impl flash with a note;
    half-precision gradients are FSDP's PURE; what llm-foundry has no counterpart for (pipeline, tensor parallelism,
    ZeRO-1, optimizer offload: Composer refuses fsdp_config.cpu_offload) is said in a note, never written."""
    plan = gpt_plan()  # tp 1, dp 8, ZeRO-3 with optimizer offload, fp16 amp, full recompute
    plan.training.attention_kernel = "triton-2022"
    cfg = _yaml(export_plan(plan, "llm-foundry"))
    m = cfg["model"]
    assert m["learned_pos_emb"] is True and m["no_bias"] is False and m["norm_type"] == "low_precision_layernorm"
    assert m["tie_word_embeddings"] is True and "ffn_config" not in m and m["expansion_ratio"] == 4
    assert m["max_seq_len"] == plan.model.max_seq_len  # the table the plan counts, not the training length's
    assert m["attn_config"] == {"attn_impl": "flash"}
    assert m["loss_fn"] == ("fused_crossentropy" if plan.training.fused_cross_entropy and
                            plan.training.cross_entropy_16bit_grad else "torch_crossentropy")
    assert cfg["precision"] == "amp_fp16" and cfg["fsdp_config"]["mixed_precision"] == "FULL"
    assert "cpu_offload" not in cfg["fsdp_config"]
    notes = export_notes(plan, "llm-foundry")
    assert any(n.startswith("offload optimizer: Composer has no FSDP CPU offload") for n in notes)
    assert any(n.startswith("attention_kernel triton-2022") for n in notes)
    plan = llama_plan(zero_stage=1)  # tp 4, pp 2, vpp 2, SP
    plan.training.precision = "master-weights-half-grads"
    cfg = _yaml(export_plan(plan, "llm-foundry"))
    assert cfg["fsdp_config"]["mixed_precision"] == "PURE" and cfg["fsdp_config"]["sharding_strategy"] == "SHARD_GRAD_OP"
    notes = " ".join(export_notes(plan, "llm-foundry"))
    for said in ("tensor parallelism tp=4", "pipeline parallelism pp=2", "zero_stage 1: FSDP's nearest",
                 "recompute selective", "sequence parallelism"):
        assert said in notes, said


def test_zero2_notes_say_more_gradient_memory_only_where_the_prediction_sharded_it():
    """A per-step ZeRO-2 (parplan's runtime) is predicted with full gradients through the backward, as Megatron's
    distributed optimizer and DeepSpeed's pipeline ZeRO-1 hold them; only a per-micro-batch ZeRO-2 (DeepSpeed's
    own) was predicted with sharded gradients, and only its exports say they take more memory."""
    per_step = llama_plan(zero_stage=2)
    per_micro = _with(per_step, "training", zero2_grad_reduce="per-micro-batch")
    for plan, says in ((per_step, False), (per_micro, True)):
        meg = " ".join(export_notes(plan, "megatron"))
        assert ("gradient memory is not sharded as predicted" in meg) == says
        ds = " ".join(export_notes(plan, "deepspeed"))
        assert "zero_optimization.stage is 1" in ds
        assert ("more memory than the prediction" in ds) == says and ("as predicted" in ds) != says


def test_megatron_fsdp_is_predicted_without_the_fusion_its_export_turns_off():
    """Megatron-FSDP (zero_stage 3) exports --no-gradient-accumulation-fusion, its guide's required configuration;
    its prediction is that run's (it had kept Megatron's default fusion: 1.2 % faster on llama3-70b at pp 16),
    while ZeRO-1 keeps the fusion Megatron turns on by default."""
    from planner.core import evaluate_plan
    for zero, fused_differs in ((3, False), (1, True)):
        plan = _with(_with(llama_plan(zero_stage=zero, pp=2, vpp=1, schedule="1f1b"), "training",
                           framework="megatron", grad_accumulation_fusion=True), "parallel", recompute="none")
        off = _with(plan, "training", grad_accumulation_fusion=False)
        a, b = evaluate_plan(plan).prediction, evaluate_plan(off).prediction
        assert (a.step_time_s != b.step_time_s) == fused_differs
        assert ("--no-gradient-accumulation-fusion" in export_plan(plan, "megatron")) == (zero == 3)


def test_megatron_fuses_into_a_16bit_main_grad_and_parplans_runtime_does_not():
    """Megatron-LM's gradient-accumulation fusion adds the weight gradient into main_grad in its own dtype
    (wgrad_gemm_accum_fp16 beside _fp32): with gradients reduced in bf16 (master-weights-half-grads, exported as
    --grad-reduce-in-bf16) a Megatron plan makes no per-micro-batch accumulation pass, so turning the fusion off
    slows it; parplan's runtime fuses into an fp32 main_grad only, so its half-grads plan is the same either way."""
    from planner.core import evaluate_plan
    for framework, fused_differs in (("megatron", True), ("parplan", False)):
        plan = _with(_with(llama_plan(zero_stage=1, pp=2, vpp=1, schedule="1f1b"), "training", framework=framework,
                           grad_accumulation_fusion=True, precision="master-weights-half-grads"),
                     "parallel", recompute="none")
        off = _with(plan, "training", grad_accumulation_fusion=False)
        a, b = evaluate_plan(plan).prediction, evaluate_plan(off).prediction
        assert (a.time_breakdown.optimizer_s < b.time_breakdown.optimizer_s) == fused_differs, framework
        assert (a.step_time_s < b.step_time_s) == fused_differs, framework
    assert "--grad-reduce-in-bf16" in export_plan(plan.model_copy(update={"training": plan.training.model_copy(
        update={"framework": "megatron"})}), "megatron")


def test_partial_recompute_exports_as_megatrons_block_method_and_is_noted_elsewhere():
    """recompute_layers N (full recompute of the first N blocks of each stage) is Megatron-LM's --recompute-method
    block --recompute-num-layers N; the frameworks that recompute every block or none export every block and say
    so.  The plan refuses N without full recompute, and N that covers every block of a stage."""
    plan = llama_plan(recompute="full", recompute_layers=5, stage_layers=[8, 8, 8, 8])
    a = megatron_args(export_plan(plan, "megatron"))
    assert a["--recompute-granularity"] == "full" and a["--recompute-method"] == "block"
    assert a["--recompute-num-layers"] == "5"
    assert not any("blocks per stage" in n for n in export_notes(plan, "megatron"))
    for to in ("torchtitan", "deepspeed", "llm-foundry"):
        assert any("recompute full of 5 blocks per stage" in n for n in export_notes(plan, to)), to
    with pytest.raises(ValueError, match="needs recompute full"):
        Parallel(tp=1, recompute="selective", recompute_layers=2)
    with pytest.raises(ValueError, match="every block of each stage"):
        Parallel(tp=1, pp=2, recompute="full", recompute_layers=8, stage_layers=[8, 8])


def test_llm_foundry_runs_what_the_plan_predicts_without_flash_attn_or_fsdp_where_it_did_not():
    """A helper's read of llm-foundry and Composer: ZeRO 0 without recompute is Composer's DDP (no fsdp_config; a
    NO_SHARD one runs FSDP, which the plan did not predict), with recompute FSDP's NO_SHARD (Composer checkpoints
    only through fsdp_config) and a note; torch attention with rotary positions takes HF's rotary (MPT's default
    rope_impl, dail, imports flash-attn); the loss is the one predicted (ComposerMPTCausalLM's default is flash-attn's
    fused loss); a multi-node launch line names the port Composer's launcher requires."""
    plan = llama_plan(tp=1, pp=1, vpp=1, dp=16, sp=False, zero_stage=0, recompute="none", schedule="1f1b")
    plan.training.flash_attention = False
    cfg = _yaml(export_plan(plan, "llm-foundry"))
    assert "fsdp_config" not in cfg
    assert any(n.startswith("zero_stage 0: no fsdp_config") for n in export_notes(plan, "llm-foundry"))
    assert cfg["model"]["attn_config"]["attn_impl"] == "torch" and cfg["model"]["attn_config"]["rope_impl"] == "hf"
    assert cfg["model"]["loss_fn"] == "torch_crossentropy"
    assert "--master_port PORT" in export_plan(plan, "llm-foundry").splitlines()[0]
    plan.parallel.recompute = "full"
    plan.training.fused_cross_entropy = plan.training.cross_entropy_16bit_grad = True
    cfg = _yaml(export_plan(plan, "llm-foundry"))
    assert cfg["fsdp_config"]["sharding_strategy"] == "NO_SHARD" and cfg["fsdp_config"]["activation_checkpointing"]
    assert cfg["model"]["loss_fn"] == "fused_crossentropy"
    assert any(n.startswith("zero_stage 0 with recompute: FSDP's NO_SHARD") for n in export_notes(plan, "llm-foundry"))


def test_megatron_export_of_a_zero3_mixture_of_experts_says_it_was_planned_for_parplan():
    """A parplan plan of a mixture of experts under ZeRO-3 (its runtime's FSDP2 layout) exports to Megatron-FSDP with
    a note that Megatron's sharding of expert weights is not what was planned; a ZeRO-3 dense plan carries no such
    note."""
    from planner.core import recommend
    from planner.models import load_preset
    from planner.search import Pins
    moe = recommend(load_preset("mixtral-8x7b"), 64, pins=Pins(zero=3), top_k=1)
    notes = export_notes(moe, "megatron")
    assert moe.parallel.zero_stage == 3 and moe.parallel.ep > 1
    assert any(n.startswith("zero_stage 3 with a mixture of experts") for n in notes)
    dense = recommend(load_preset("llama3-8b"), 16, pins=Pins(zero=3), top_k=1)
    assert dense.parallel.zero_stage == 3
    assert not any("mixture of experts" in n for n in export_notes(dense, "megatron"))


# --- Megatron-Bridge: the Megatron-LM flags as ConfigContainer overrides

BRIDGE_SECTIONS = ("model", "train", "dataset", "optimizer", "scheduler", "ddp", "mixed_precision", "rng", "tokenizer",
                   "checkpoint")


def _hydra(raw: str) -> object:
    """A value as the Bridge export writes it for Hydra's grammar: true/false, null, ints, floats, [lists] of those,
    "quoted" or bare strings (none of its lists nest or hold strings with commas)."""
    if raw in ("true", "false"):
        return raw == "true"
    if raw == "null":
        return None
    if raw.startswith("[") and raw.endswith("]"):
        return [_hydra(x) for x in raw[1:-1].split(",")] if raw != "[]" else []
    if raw.startswith('"') and raw.endswith('"'):
        return raw[1:-1]
    if re.fullmatch(r"-?\d+", raw):
        return int(raw)
    try:
        return float(raw)
    except ValueError:
        return raw


def bridge_overrides_of(text: str) -> dict[str, object]:
    """The KEY=VALUE lines of a Megatron-Bridge export: each one shell word (what xargs hands run_recipe.py), its key
    a dotted ConfigContainer path of a known section, written once."""
    out: dict[str, object] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        words = shlex.split(line)
        assert len(words) == 1, line
        key, raw = words[0].split("=", 1)
        assert re.fullmatch(r"[a-z_]+(\.[a-z0-9_]+)*", key) and key.split(".")[0] in BRIDGE_SECTIONS, key
        assert key not in out, f"duplicate {key}"
        out[key] = _hydra(raw)
    return out


def moe_plan(dispatcher: str = "alltoall") -> Plan:
    from planner.models import load_preset
    return Plan(model=load_preset("qwen3-30b-a3b"),
                hardware=HardwareRef(name="h100-sxm-80gb", gpus=32, gpus_per_node=8),
                training=Training(seq_len=4096, global_batch_size=256, micro_batch_size=1, num_microbatches=16,
                                  dtype="bf16", precision="master-weights", framework="megatron", tokens=1e9,
                                  moe_dispatcher=dispatcher, clip_grad=1.0),
                parallel=Parallel(tp=2, pp=1, dp=16, ep=8, sp=True, zero_stage=1, recompute="selective"))


def test_megatron_bridge_dense_plan_sets_the_layout_batch_and_policies():
    """tp/pp/vpp/cp/sp, the batch, recompute, the distributed optimizer and bf16 as ConfigContainer keys, the recipe
    named in the header and in the run line, and the notes as `# note:` lines (as the Megatron-LM export's)."""
    plan = llama_plan()  # tp 4, pp 2, vpp 2, dp 2, sp, ZeRO-1, selective recompute, bf16 master weights
    text = export_plan(plan, "megatron-bridge")
    o = bridge_overrides_of(text)
    assert (o["model.tensor_model_parallel_size"], o["model.pipeline_model_parallel_size"],
            o["model.context_parallel_size"]) == (4, 2, 1)
    assert o["model.virtual_pipeline_model_parallel_size"] == 2  # model chunks per rank: 32 / (2 * 8)
    assert o["model.sequence_parallel"] is True
    assert (o["train.micro_batch_size"], o["train.global_batch_size"]) == (1, 64)
    assert o["model.seq_length"] == o["dataset.sequence_length"] == 4096  # ConfigContainer.validate asserts them equal
    assert o["model.recompute_granularity"] == "selective" and o["model.recompute_method"] is None
    assert o["model.recompute_num_layers"] is None and o["model.recompute_modules"] is None  # core_attn, the default
    assert o["ddp.use_distributed_optimizer"] is True and o["optimizer.use_distributed_optimizer"] is True
    assert o["mixed_precision"] == "bf16_mixed"
    assert (o["model.num_layers"], o["model.hidden_size"], o["model.num_attention_heads"],
            o["model.num_query_groups"], o["model.ffn_hidden_size"]) == (32, 4096, 32, 8, 14336)
    assert o["train.train_iters"] == -(-10**9 // (64 * 4096))  # --train-samples' whole steps
    assert (o["optimizer.lr"], o["optimizer.clip_grad"], o["rng.seed"]) == (plan.training.lr, 1.0, plan.training.seed)
    assert o["scheduler.lr_decay_style"] == "constant" and o["scheduler.lr_warmup_iters"] == 0
    assert o["optimizer.weight_decay"] == o["scheduler.start_weight_decay"] == o["scheduler.end_weight_decay"] == 0.1
    assert o["model.vocab_size"] == 128256 and o["model.should_pad_vocab"] is False
    # sorted by section, in the ConfigContainer's order
    sections = [k.split(".")[0] for k in o]
    assert sections == sorted(sections, key=BRIDGE_SECTIONS.index)
    head = text.split("\nmodel.", 1)[0]
    assert "Recipe: llama3_8b_pretrain_config" in head and "checked against the sources, not run" in head
    assert ("xargs torchrun --nnodes 2 --nproc-per-node 8 " in head
            and "scripts/training/run_recipe.py --recipe llama3_8b_pretrain_config" in head)
    notes = export_notes(plan, "megatron-bridge")
    assert notes and all(f"# note: {n}" in head for n in notes)
    assert not any("--data-path" in n for n in notes)  # Megatron-LM's mock-data advice, given in Bridge's keys here

    # what the plan leaves off goes as Megatron-LM's default, not the recipe's (which turn these on)
    off = bridge_overrides_of(export_plan(llama_plan(tp=2, pp=1, vpp=1, dp=8, sp=False, zero_stage=0,
                                                     recompute="none", schedule="1f1b"), "megatron-bridge"))
    assert off["model.sequence_parallel"] is False and off["model.virtual_pipeline_model_parallel_size"] is None
    assert off["ddp.use_distributed_optimizer"] is False and off["optimizer.use_distributed_optimizer"] is False
    assert off["model.recompute_granularity"] is None and off["model.pipeline_model_parallel_layout"] is None
    full = bridge_overrides_of(export_plan(llama_plan(recompute="full", recompute_layers=3), "megatron-bridge"))
    assert (full["model.recompute_granularity"], full["model.recompute_method"],
            full["model.recompute_num_layers"]) == ("full", "block", 3)
    cp = bridge_overrides_of(export_plan(llama_plan(cp=2, tp=2, pp=1, vpp=1, dp=2, schedule="1f1b"), "megatron-bridge"))
    assert cp["model.context_parallel_size"] == 2 and cp["model.cp_comm_type"] == "all_gather"
    uneven = bridge_overrides_of(export_plan(llama_plan(stage_layers=[7, 9, 9, 7]), "megatron-bridge"))
    assert uneven["model.pipeline_model_parallel_layout"] == "Et*7|t*9|t*9|t*7L"
    assert uneven["model.virtual_pipeline_model_parallel_size"] == 2
    fp16 = bridge_overrides_of(export_plan(gpt_plan(), "megatron-bridge"))
    assert fp16["mixed_precision"] == "fp16_mixed" and fp16["ddp.use_megatron_fsdp"] is True
    assert fp16["checkpoint.ckpt_format"] == "fsdp_dtensor" and fp16["model.share_embeddings_and_output_weights"]


def test_megatron_bridge_moe_plan_sets_expert_parallelism_and_the_dispatcher():
    plan = moe_plan()
    text = export_plan(plan, "megatron-bridge")  # export_problem lets a mixture of experts through to Bridge
    o = bridge_overrides_of(text)
    assert o["model.expert_model_parallel_size"] == 8 and o["model.expert_tensor_parallel_size"] == 1
    assert o["model.moe_token_dispatcher_type"] == "alltoall" and o["model.moe_grouped_gemm"] is True
    assert (o["model.num_moe_experts"], o["model.moe_router_topk"], o["model.moe_ffn_hidden_size"]) == (128, 8, 768)
    assert o["model.moe_layer_freq"] == 1  # every block an MoE one (the flag left out)
    assert o["model.moe_shared_expert_intermediate_size"] is None and o["model.mtp_num_layers"] is None
    assert "--recipe qwen3_30b_a3b_pretrain_config" in text
    notes = export_notes(plan, "megatron-bridge")
    # the recipe builds Qwen3's q/k norms: no Megatron-LM flags to add by hand here
    assert any(n.startswith("Qwen3:") and "qwen3_30b_a3b_pretrain_config" in n for n in notes)
    assert not any("--qk-layernorm (its per-head" in n for n in notes)
    act = bridge_overrides_of(export_plan(_with(plan, "training", moe_recompute="act"), "megatron-bridge"))
    assert act["model.recompute_granularity"] == "selective"
    assert act["model.recompute_modules"] == ["core_attn", "moe_act"]
    deepep = bridge_overrides_of(export_plan(moe_plan("deepep"), "megatron-bridge"))
    assert deepep["model.moe_token_dispatcher_type"] == "flex"
    assert deepep["model.moe_flex_dispatcher_backend"] == "deepep"
    with pytest.raises(ValueError, match="use --to megatron"):
        export_plan(plan, "deepspeed")
    with pytest.raises(ValueError, match="use --to torchtitan-0.2"):
        export_plan(plan, "torchtitan")


def _bridge_plans() -> dict[str, Plan]:
    """Plans whose Megatron-LM arguments cover every flag `_megatron_args` writes for dense, MoE and MLA models."""
    from planner.models import load_preset
    from tests.test_mla_frontend import mla_plan
    fp8 = _with(llama_plan(), "training", fp8=True)
    offload = llama_plan(zero_stage=0, offload="optimizer")
    dsv3 = mla_plan("deepseek-v3")
    return {
        "dense": llama_plan(), "gpt zero3 offload": gpt_plan(), "fp8": fp8, "offload": offload,
        "fp32": _with(llama_plan(), "training", precision="fp32", dtype="fp32"),
        "fp16 master": _with(llama_plan(), "training", dtype="fp16"),
        "half grads": _with(llama_plan(), "training", precision="master-weights-half-grads"),
        "tp overlap, dropout": _with(llama_plan(), "training", overlap_tp_comm=True, dropout=True),
        "cp": llama_plan(cp=2, tp=2, pp=1, vpp=1, dp=2, schedule="1f1b"),
        "layout": llama_plan(stage_layers=[7, 9, 9, 7]),
        "ends": llama_plan(tp=4, pp=4, vpp=1, dp=1, schedule="1f1b", stage_layers=[7, 9, 9, 7]),
        "moe": moe_plan(), "moe deepep": moe_plan("deepep"),
        "moe act": _with(moe_plan(), "training", moe_recompute="act"),
        "moe a2a overlap": _with(moe_plan(), "training", moe_a2a_overlap=True),
        "optimizer instances": _with(llama_plan(dp=8, dp_replicate=2), "training", framework="megatron"),
        "deepseek-v3 mtp": dsv3.model_copy(update={"model": dsv3.model.model_copy(update={"mtp_layers": 1})}),
        "deepseek-v2-lite": mla_plan("deepseek-v2-lite", pp=3),
        "gpt-oss window": llama_plan().model_copy(update={"model": load_preset("gpt-oss-20b")}),
    }


def test_every_megatron_flag_is_mapped_or_named_as_unmapped():
    """Each flag of the Megatron-LM export has an entry in the Bridge table (keys, or a reason it has none): a flag
    added to `_megatron_args` without one fails here.  In the output, each is either written as its keys or named in
    the "not mapped" note, never dropped."""
    from planner.export import _BRIDGE_KEYS, _BRIDGE_UNMAPPED, _megatron_args
    seen: set[str] = set()
    for name, plan in _bridge_plans().items():
        args, _ = _megatron_args(plan)
        text = export_plan(plan, "megatron-bridge")
        o = bridge_overrides_of(text)
        unmapped = [n for n in export_notes(plan, "megatron-bridge") if n.startswith("not mapped")]
        for flag, _value in args:
            seen.add(flag)
            assert flag in _BRIDGE_KEYS or flag in _BRIDGE_UNMAPPED, f"{flag} ({name}): add it to _BRIDGE_KEYS"
            written = flag in _BRIDGE_KEYS and all(k.path in o for k in _BRIDGE_KEYS[flag])
            named = bool(unmapped) and f"{flag} (" in unmapped[0]
            assert written != named, (name, flag, written, named)
    # these plans reach every entry of the table (a stale entry would be an untested one)
    assert seen >= set(_BRIDGE_KEYS) | set(_BRIDGE_UNMAPPED), sorted((set(_BRIDGE_KEYS) | set(_BRIDGE_UNMAPPED)) - seen)
    for keys in _BRIDGE_KEYS.values():
        assert all(k.path.split(".")[0] in BRIDGE_SECTIONS for k in keys)


def test_megatron_bridge_maps_precision_fp8_and_latent_attention_as_verified():
    """FP8 as Bridge's bf16_with_fp8_delayed_scaling_mixed (hybrid, delayed, amax history 1024 by max, FP8 weight
    gathers: the Megatron-LM export's flags); fp32 as no mixed-precision recipe; latent attention's widths, no query
    compression as a null q_lora_rank, and its attention backend left to the recipe."""
    plans = _bridge_plans()
    assert bridge_overrides_of(export_plan(plans["fp8"], "megatron-bridge"))["mixed_precision"] == \
        "bf16_with_fp8_delayed_scaling_mixed"
    assert bridge_overrides_of(export_plan(plans["fp32"], "megatron-bridge"))["mixed_precision"] is None
    lite = plans["deepseek-v2-lite"]
    o = bridge_overrides_of(export_plan(lite, "megatron-bridge"))
    assert o["model.q_lora_rank"] is None and o["model.kv_lora_rank"] == lite.model.kv_lora_rank
    assert o["model.qk_head_dim"] + o["model.qk_pos_emb_head_dim"] == lite.model.head_dim
    assert "model.attention_backend" not in o
    assert o["model.moe_layer_freq"] == [int(lite.model.is_moe_block(i)) for i in range(lite.model.layers)]
    assert "--recipe deepseek_v2_lite_pretrain_config" in export_plan(lite, "megatron-bridge")
    v3 = bridge_overrides_of(export_plan(plans["deepseek-v3 mtp"], "megatron-bridge"))
    assert v3["model.mtp_num_layers"] == 1 and v3["model.q_lora_rank"] == 1536
    win = bridge_overrides_of(export_plan(plans["gpt-oss window"], "megatron-bridge"))
    assert win["model.window_size"] == [127, 0] and win["model.window_attn_skip_freq"] == 2
    tp = bridge_overrides_of(export_plan(plans["tp overlap, dropout"], "megatron-bridge"))
    assert tp["model.tp_comm_overlap"] is True and tp["model.hidden_dropout"] == tp["model.attention_dropout"] == 0.1


def test_megatron_bridge_recipe_is_the_presets_or_the_closest_familys():
    from planner.export import bridge_recipe
    from planner.models import load_preset
    assert bridge_recipe(load_preset("llama3.1-70b"))[:1] == ("llama3_70b_pretrain_config",)
    assert bridge_recipe(load_preset("llama3-405b"))[0] == "llama31_405b_pretrain_config"
    assert bridge_recipe(load_preset("gpt-oss-120b"))[0] == "gpt_oss_120b_pretrain_config"
    assert bridge_recipe(load_preset("deepseek-r1"))[0] == "deepseek_v3_pretrain_config"
    recipe, _, own = bridge_recipe(load_preset("mistral-7b"))
    assert (recipe, own) == ("llama3_8b_pretrain_config", False)
    assert bridge_recipe(gpt_plan().model)[0] == "vanilla_gpt_pretrain_config"
    plan = llama_plan().model_copy(update={"model": load_preset("mistral-7b")})
    assert any("no Megatron-Bridge recipe of this model" in n for n in export_notes(plan, "megatron-bridge"))


def test_megatron_bridge_values_are_hydras_and_shell_quoted():
    from planner.export import _hydra_value
    assert [_hydra_value(v) for v in (True, False, None, 4, 3e-4, 1e-05, [1, 0], "all_gather", "Et*3|t*4L", "true")] \
        == ["true", "false", "null", "4", "0.0003", "1e-05", "[1,0]", "all_gather", '"Et*3|t*4L"', '"true"']
    text = export_plan(llama_plan(tp=4, pp=4, vpp=2, dp=1, stage_layers=[3, 4, 5, 4, 4, 4, 4, 4]), "megatron-bridge")
    line = next(ln for ln in text.splitlines() if "pipeline_model_parallel_layout" in ln)
    assert line == """'model.pipeline_model_parallel_layout="Et*3|t*4|t*5|t*4|t*4|t*4|t*4|t*4L"'"""
    assert bridge_overrides_of(text)["model.recompute_granularity"] == "selective"


def test_megatron_export_is_its_argument_list_rendered():
    """`_megatron_args` is what `--to megatron` writes, word for word (the Bridge export maps the same list)."""
    from planner.export import _megatron_args
    for plan in _bridge_plans().values():
        argv = megatron_argv(export_plan(plan, "megatron"))
        args, notes = _megatron_args(plan)
        words = [w for flag, value in args
                 for w in [flag, *map(str, value if isinstance(value, list) else [] if value is None else [value])]]
        assert argv == words
        assert set(notes) <= set(export_notes(plan, "megatron"))


def test_megatron_bridge_framework_note_follows_megatron():
    from planner.export import framework_note
    plan = llama_plan()
    assert "--framework megatron" in framework_note(plan, "megatron-bridge")
    plan.training.framework = "megatron"
    assert framework_note(plan, "megatron-bridge") is None


def test_cli_exports_megatron_bridge_and_lists_the_targets(tmp_path):
    import contextlib
    import io
    from planner.cli import main

    def run(argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(argv)
        return rc, out.getvalue(), err.getvalue()

    plan = llama_plan()
    path = tmp_path / "plan.json"
    path.write_text(plan.model_dump_json())
    rc, out, err = run(["export", str(path), "--to", "megatron-bridge"])
    assert rc == 0, err
    assert out == export_plan(plan, "megatron-bridge")
    assert bridge_overrides_of(out)["model.tensor_model_parallel_size"] == 4
    assert "note: not mapped" in err  # the notes on stderr too, as for every target
    rc, out, err = run(["export", str(path), "--to", "megatron-bridgee"])
    assert rc == 2 and out == "" and all(name in err for name in FORMATS) and "megatron-bridge" in err
