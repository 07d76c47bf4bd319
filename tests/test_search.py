"""The vectorised search: array path = scalar path, plan properties, presets x profiles, speed."""
from dataclasses import replace
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import hardware_profiles
from cost_models.hardware import constants_from_profile
from cost_models.layout import Layout, ModelDims, TrainingConsts
from cost_models.params import param_counts
from cost_models.total import evaluate
from planner.core import NothingFits, PlannerError, evaluate_plan, recommend
from planner.models import list_presets, load_preset
from planner.schema import ModelSpec, Plan
from planner.search import Pins, build_layouts


def _setup(name="llama3-70b", gpus=64, seq=4096, gbs=512):
    spec = load_preset(name)
    m = ModelDims.from_spec(spec, seq)
    tr = TrainingConsts(global_batch_size=gbs, dtype="bf16", precision="master-weights", flash_attention=True,
                        overlap_grad_reduce=True, overlap_tp_comm=False)
    hw = constants_from_profile(hardware_profiles.load_profile("h100-sxm-80gb"), "bf16")
    return spec, m, tr, hw, build_layouts(m, gpus, gbs, Pins(), tr.zero_over_cp)


def test_array_path_matches_scalar_path_on_1000_random_candidates():
    """The search evaluates all candidates as arrays in one call; a plain per-candidate call
    with Python scalars must give the same numbers (catches broadcasting/branch bugs)."""
    _, m, tr, hw, lay = _setup()
    assert len(lay) > 5000
    # a share of the full-recompute candidates recompute some blocks of each stage (evaluate splits them off)
    rng = np.random.default_rng(0)
    full = np.asarray(lay.recompute) == 2
    chunk = m.layers // (np.asarray(lay.pp) * np.asarray(lay.vpp))
    some = full & (chunk >= 2) & (rng.random(len(lay)) < 0.5)
    lay = replace(lay, recompute_layers=np.where(some, rng.integers(1, np.maximum(chunk, 2)), 0))
    assert 100 < np.count_nonzero(lay.recompute_layers) < np.count_nonzero(full)
    with np.errstate(divide="ignore", invalid="ignore"):
        arrays = evaluate(m, tr, hw, lay)
    idx = rng.choice(len(lay), size=1000, replace=False)
    keys = ["step_time_s", "mfu", "hfu", "mem_total", "mem_activations", "mem_weights", "comm_dp_bytes",
            "comm_tp_bytes", "comm_pp_bytes", "bubble_fraction", "parallel_fraction"]
    for i in idx:
        row = lay.row(int(i))
        scalar_layout = Layout(**{k: int(v) for k, v in row.items()})
        with np.errstate(divide="ignore", invalid="ignore"):
            one = evaluate(m, tr, hw, scalar_layout)
        for k in keys:
            a, b = float(arrays[k][i]), float(one[k])
            assert a == pytest.approx(b, rel=1e-9, abs=1e-12), (k, row)


def test_search_counts_candidates_and_reasons():
    plan = recommend(load_preset("llama3-70b"), 64)
    s = plan.search
    assert s.candidates > 10_000
    assert 0 < s.feasible < s.candidates
    # unpriced: past every contender on their step-time floor (search.run_search's by_floor)
    assert s.unpriced > 0 and s.feasible + s.unpriced + sum(s.infeasible_by_reason.values()) == s.candidates
    assert "memory" in s.infeasible_by_reason
    for objective in ("memory", "min-gpus"):  # searches that price every candidate
        s = recommend(load_preset("llama3-70b"), 64, objective=objective).search
        assert s.unpriced == 0 and s.feasible + sum(s.infeasible_by_reason.values()) == s.candidates


@pytest.mark.parametrize("objective", ["throughput", "memory", "min-gpus"])
def test_recommended_plans_are_valid(objective):
    spec = load_preset("llama3-8b")
    best = recommend(spec, 32, objective=objective, top_k=5)
    plans = [best] + best.alternatives
    for p in plans:
        par = p.parallel
        assert par.tp * par.pp * par.dp * par.cp == p.hardware.gpus
        assert spec.heads % par.tp == 0 and spec.kv_heads % par.tp == 0
        assert p.training.global_batch_size == par.dp * p.training.micro_batch_size * p.training.num_microbatches
        assert sum(par.stage_layers) == spec.layers and len(par.stage_layers) == par.pp * par.vpp
        pr = p.prediction
        assert pr.fits and pr.memory_bytes_per_gpu.total <= pr.usable_memory_bytes
        Plan.model_validate(p.model_dump(mode="json"))  # strict schema round-trip
    key = {"throughput": lambda p: p.prediction.step_time_s,
           "memory": lambda p: p.prediction.memory_bytes_per_gpu.total,
           # the fewest GPUs, then the fastest at that count (all the top plans share the count)
           "min-gpus": lambda p: (p.hardware.gpus, p.prediction.step_time_s)}[objective]
    if objective == "throughput":
        # plans within NEAR_TIE of the fastest come first, the simplest of them first
        from planner.search import NEAR_TIE
        fastest = min(key(p) for p in plans)
        near = [key(p) <= fastest * (1 + NEAR_TIE) for p in plans]
        assert near == sorted(near, reverse=True)
        rest = [key(p) for p, n in zip(plans, near) if not n]
        assert rest == sorted(rest)
    else:
        assert [key(p) for p in plans] == sorted(key(p) for p in plans)


def test_pins_fully_pinned_evaluates_exactly_one_layout():
    spec = load_preset("llama3-8b")
    pins = Pins(tp=2, pp=2, dp=2, cp=1, mbs=1, vpp=1, zero=1, recompute="selective", sp=True, schedule="1f1b",
                offload="none")
    plan = recommend(spec, 8, pins=pins, global_batch_size=64)
    assert plan.search.candidates == 1
    assert (plan.parallel.tp, plan.parallel.pp, plan.parallel.dp) == (2, 2, 2)


def test_evaluate_reproduces_the_search_prediction():
    plan = recommend(load_preset("llama3-70b"), 64, top_k=3)
    for p in [plan] + plan.alternatives:
        again = evaluate_plan(Plan.model_validate(p.model_dump(mode="json")))
        assert again.prediction.step_time_s == pytest.approx(p.prediction.step_time_s, rel=1e-9)
        assert again.prediction.memory_bytes_per_gpu.total == pytest.approx(p.prediction.memory_bytes_per_gpu.total)


def test_70b_on_8_gpus_fits_only_with_offload():
    spec = load_preset("llama2-70b")
    plan = recommend(spec, 8, global_batch_size=64)
    assert plan.parallel.offload == "optimizer"
    with pytest.raises(NothingFits) as e:
        recommend(spec, 8, global_batch_size=64, pins=Pins(offload="none"))
    assert not e.value.plan.prediction.fits
    assert "memory" in e.value.plan.prediction.reason
    assert any("--gpus" in s for s in e.value.plan.suggestions)


def test_a_batch_that_rules_out_dp_gets_a_nearby_batch_suggestion():
    """7B on 3 GPUs with batch 1024 as torchtitan runs it: dp 3 is ruled out by the batch, tp 3 by the
    heads, and pp 3 (in fp32, where torchtitan runs a pipeline without FSDP) does not fit (torch.distributed.
    pipelining keeps a receive buffer per micro-batch).  The first suggestion is the nearest batch that dp 3
    splits, and it does fit; more GPUs come after.  In bf16 torchtitan has no pp 3 either (no FSDP under it),
    so nothing is costed and the error names the nearest batch.  parplan's own runtime, which allocates
    receive buffers just in time, fits pp 3 at batch 1024."""
    from planner.models import model_from_params
    spec, _ = model_from_params(7e9)
    with pytest.raises(PlannerError, match="every candidate breaks a rule.*use --global-batch-size 1023, which splits over dp 3"):
        recommend(spec, 3, global_batch_size=1024, framework="torchtitan")
    with pytest.raises(NothingFits) as e:
        recommend(spec, 3, global_batch_size=1024, framework="torchtitan", precision="fp32")
    first = e.value.plan.suggestions[0]
    assert first.startswith("--global-batch-size 1023 fits on 3 GPUs"), first
    assert "1024 does not split over dp 3" in first
    assert any(s.startswith("--gpus 4 fits") for s in e.value.plan.suggestions[1:])
    assert recommend(spec, 3, global_batch_size=1023, framework="torchtitan").parallel.dp == 3
    assert recommend(spec, 3, global_batch_size=1024).parallel.pp == 3


def test_a_prime_gpu_count_is_not_sent_back_its_own_batch():
    """On 10,007 GPUs (prime) an 8B model's only layouts put dp at 10,007: the fix had named the batch the command
    already had ("use --global-batch-size 1024, which splits over dp 1", dp 1 being held back by the heads and
    layers), so the same command failed again.  It names a batch dp 10,007 splits, and says the count is prime."""
    spec = load_preset("llama3-8b")
    with pytest.raises(PlannerError) as e:
        recommend(spec, 10007, global_batch_size=1024)
    msg = str(e.value)
    assert "use --global-batch-size 10007, which splits over dp 10007" in msg and "10007 is prime" in msg, msg
    assert "--global-batch-size 1024" not in msg


def test_nothing_fits_for_host_memory_says_host_memory():
    """405B on 8 H100s fits the GPUs only with optimizer offload, and the offload needs more host memory
    than a node has: the error says so instead of quoting a GPU need below the usable HBM."""
    with pytest.raises(NothingFits) as e:
        recommend(load_preset("llama3-405b"), 8, global_batch_size=64)
    msg = str(e.value)
    assert "host memory" in msg and "offloading" in msg, msg
    assert "smallest layout needs" not in msg
    assert e.value.plan.prediction.reason.startswith("host-memory")


@pytest.mark.parametrize("hardware", hardware_profiles.list_profiles())
def test_smoke_every_profile_and_preset(hardware):
    for name in list_presets():
        spec = load_preset(name)
        gpus = 8 if spec.layers * spec.hidden < 40 * 8192 else 64
        try:
            plan = recommend(spec, gpus, hardware=hardware, global_batch_size=256, top_k=1, suggest=False,
                             seq_len=min(2048, spec.max_seq_len) if spec.has_learned_positions else 2048,
                             framework="megatron" if spec.is_moe else "parplan")  # MoE: planned for megatron
        except NothingFits as e:
            plan = e.plan
            assert not plan.prediction.fits and plan.prediction.reason
        pr = plan.prediction
        assert np.isfinite(pr.step_time_s) and pr.step_time_s > 0
        assert 0 < pr.mfu < 1 and pr.hfu >= pr.mfu
        assert 0 <= pr.bubble_fraction < 1
        assert 0 < pr.amdahl.parallel_fraction <= 1.0 + 1e-9


def _timed(cmd):
    """Best of three runs of cmd: (wall seconds, CPU seconds of the child, the last run's result).  The bars
    are asserted on the CPU time (user + system of the child process, from getrusage): a loaded CI machine
    stretches the wall time (4.2 s for the 405B search once, at load 8, against 0.9 s quiet) but barely
    the CPU time the search itself spends."""
    import resource
    best_wall = best_cpu = None
    out = None
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        best_wall = wall if best_wall is None else min(best_wall, wall)
        best_cpu = cpu if best_cpu is None else min(best_cpu, cpu)
    return best_wall, best_cpu, out


def test_speed_bars():
    """Bars: 70e9 on 8 GPUs <= 1 s (torch never imported), llama3-405b on 16384 GPUs <= 3 s with >= 10,000
    candidates.  Best of three runs, asserted on the child's CPU time at 1.5 s and 4 s (slack for a slower
    machine; the wall time, which load stretches, is only reported).  benchmarks/speed.py measures the bars
    themselves in wall time (speed.md: 0.39 s and 0.61 s best of 7 at the end of 2026-11-24)."""
    wall, cpu, out = _timed([sys.executable, "-m", "planner.cli", "recommend", "--params", "70e9", "--gpus", "8",
                             "--json"])
    assert out.returncode == 0, out.stderr
    json.loads(out.stdout)
    assert cpu <= 1.5, (cpu, wall)
    wall, cpu, out = _timed([sys.executable, "-m", "planner.cli", "recommend", "--model", "llama3-405b", "--gpus",
                             "16384", "--json"])
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["search"]["candidates"] >= 10_000
    assert cpu <= 4.0, (cpu, wall)
    probe = subprocess.run([sys.executable, "-c", "import sys, planner.cli, planner.core, planner.search; "
                            "from planner.core import recommend; from planner.models import load_preset; "
                            "recommend(load_preset('llama3-8b'), 8); print('torch' in sys.modules)"],
                           capture_output=True, text=True)
    assert probe.stdout.strip() == "False", probe.stderr


def test_gpu_grid_entries_plan_on_one_h100(capsys):
    """benchmarks/gpu_grid.py (run on a GPU by a later session) must get a fitting plan for every entry,
    and the 'needs-recompute' entry must need more recomputation than selective (full, or op-level
    selective, which keeps more and now wins)."""
    import importlib.util
    from pathlib import Path

    from planner.cli import main
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_grid.py"
    spec = importlib.util.spec_from_file_location("gpu_grid", path)
    grid = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(grid)
    for name, args in grid.grid():
        assert main(["recommend", *args, "--gpus", "1", "--zero", "0", "--json"]) == 0, name
        plan = json.loads(capsys.readouterr().out)
        assert plan["prediction"]["fits"], name
        if name == "needs-recompute":
            assert plan["parallel"]["recompute"] in ("full", "selective-op")
            assert main(["recommend", *args, "--gpus", "1", "--recompute", "selective", "--offload", "none", "--json"]) == 3
            capsys.readouterr()


def test_single_token_sequences_without_cp_are_not_rejected_for_seq():
    plan = recommend(load_preset("tiny-llama-test"), 1, seq_len=1, global_batch_size=1)
    assert plan.search.infeasible_by_reason.get("seq", 0) == 0


def test_near_ties_prefer_the_simpler_plan():
    """llama3-70b on 64 H100: the fastest plan offloads the optimizer, the best plan without offload is
    a few percent slower; inside NEAR_TIE the planner recommends the one without offload."""
    from planner.search import NEAR_TIE
    best = recommend(load_preset("llama3-70b"), 64)
    with_offload = recommend(load_preset("llama3-70b"), 64, pins=Pins(offload="optimizer"))
    assert best.parallel.offload == "none"
    assert with_offload.prediction.step_time_s < best.prediction.step_time_s <= \
        with_offload.prediction.step_time_s * (1 + NEAR_TIE)


def test_near_ties_prefer_1f1b_over_a_looped_schedule():
    """llama3-70b on 64 H100: interleaved 1F1B (v 2) is predicted a little faster than 1F1B but holds more
    memory; inside NEAR_TIE the planner recommends 1F1B and lists the interleaved plan among the others."""
    from planner.search import NEAR_TIE
    best = recommend(load_preset("llama3-70b"), 64)
    looped = recommend(load_preset("llama3-70b"), 64, pins=Pins(schedule="interleaved-1f1b"))
    assert best.parallel.schedule == "1f1b"
    assert looped.prediction.step_time_s < best.prediction.step_time_s <= looped.prediction.step_time_s * (1 + NEAR_TIE)
    assert looped.prediction.memory_bytes_per_gpu.total > best.prediction.memory_bytes_per_gpu.total


def test_min_gpus_stops_at_the_fewest_count_that_fits():
    # DeepSpeed keeps the 16-bit parameters and gradients on the GPUs and offloads only the optimizer: 70B's
    # 4 B a parameter (282 GB) needs 6 GPUs (47 GB each beside the activations: tp 2 x pp 3), not 5
    plan = recommend(load_preset("llama3-70b"), 1024, objective="min-gpus", framework="deepspeed")
    assert plan.hardware.gpus == 6 and plan.parallel.zero_stage >= 1 and plan.parallel.offload == "optimizer"
    assert plan.search.seconds < 5 and plan.search.candidates < 100_000
    assert all(a.hardware.gpus == 6 for a in plan.alternatives)
    with pytest.raises(NothingFits):
        recommend(load_preset("llama3-70b"), 4, objective="min-gpus", suggest=False, framework="deepspeed")
    # FSDP2's CPUOffloadPolicy (parplan's runtime) moves the parameter and gradient shards to the host
    # too: one GPU (a single shard, as ZeRO-Infinity runs) holds a gathered block and the activations; the
    # host holds 16 B/param
    fsdp = recommend(load_preset("llama3-70b"), 1024, objective="min-gpus")
    assert fsdp.hardware.gpus == 1 and fsdp.parallel.zero_stage == 3 and fsdp.parallel.offload == "optimizer"
    mem = fsdp.prediction.memory_bytes_per_gpu
    assert mem.grads == 0 and mem.optimizer == 0
    assert mem.offloaded == pytest.approx(fsdp.model.num_params * 16, rel=1e-3)


def test_recommend_takes_every_stack_flag_and_rejects_others():
    """recommend()'s framework keywords are exactly the Training fields in STACK_FLAGS, stored in the plan."""
    from planner.core import STACK_FLAGS, stack_flags
    from planner.schema import Training
    assert set(STACK_FLAGS) <= set(Training.model_fields)
    spec = load_preset("tiny-llama-test")
    flags = dict(flash_attention=False, overlap_grad_reduce=False, overlap_param_gather=True, overlap_tp_comm=True,
                 dropout=True, fp8=True,
                 zero1_grad_reduce="reduce-scatter", zero2_grad_reduce="per-micro-batch", grad_accumulation_fusion=True,
                 p2p_scatter_gather=True, fused_cross_entropy=True, fused_elementwise=False, overlap_cp_comm=True,
                 async_tp_grad_comm=True, attention_kernel="triton-2022", cross_entropy_16bit_grad=True,
                 moe_dispatcher="alltoall", moe_recompute="none", moe_a2a_overlap=False,
                 mla_recompute=False)  # a dense model refuses others (tests/test_moe.py, test_mla.py)
    assert set(flags) == set(STACK_FLAGS)
    plan = recommend(spec, 2, seq_len=64, global_batch_size=4, suggest=False, clip_grad=0.5, **flags)
    assert stack_flags(plan.training) == {"framework": "parplan", "clip_grad": 0.5, **flags}
    assert recommend(spec, 2, seq_len=64, global_batch_size=4, suggest=False).training.clip_grad == 1.0
    with pytest.raises(TypeError, match="flash_atention"):
        recommend(spec, 2, seq_len=64, global_batch_size=4, flash_atention=False)


def test_framework_sets_the_stack_defaults_and_explicit_flags_win():
    from planner.core import FRAMEWORK_DEFAULTS
    spec = load_preset("tiny-llama-test")
    kw = dict(seq_len=64, global_batch_size=4, suggest=False)
    parplan = recommend(spec, 2, **kw).training
    assert (parplan.framework, parplan.grad_accumulation_fusion, parplan.p2p_scatter_gather,
            parplan.zero1_grad_reduce) == ("parplan", True, False, "all-reduce")
    # parplan's runtime fuses the gradient accumulation (on CUDA); DeepSpeed and torchtitan do not
    for fw in ("deepspeed", "torchtitan"):
        assert recommend(spec, 2, framework=fw, **kw).training.grad_accumulation_fusion is False
    meg = recommend(spec, 2, framework="megatron", **kw).training
    assert meg.framework == "megatron"
    for k, v in FRAMEWORK_DEFAULTS["megatron"].items():
        assert getattr(meg, k) == v
    own = recommend(spec, 2, framework="megatron", grad_accumulation_fusion=False, **kw).training
    assert own.grad_accumulation_fusion is False and own.p2p_scatter_gather is True
    with pytest.raises(PlannerError, match="unknown framework"):
        recommend(spec, 2, framework="jax", **kw)


def test_structural_prefilter_changes_nothing_but_the_work():
    """run_search evaluates only candidates passing the checks that need no cost model; evaluating
    every candidate and applying all checks gives the same reason counts and the same best plan."""
    from planner.search import infeasibility, run_search, sort_key
    import planner.search as search
    spec, m, tr, hw, lay = _setup()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(search, "FLOOR_FIRST", 10**9)  # every candidate priced (none left out on its step-time floor)
        res = run_search(m, tr, hw, [int(lay.gpus[0])], Pins(), top_k=1, objective="throughput")
    with np.errstate(divide="ignore", invalid="ignore"):
        met = evaluate(m, tr, hw, lay)
    reason = infeasibility(m, tr, hw, lay, met)
    from planner.search import REASONS
    full = {r: int(np.sum(reason == i)) for i, r in enumerate(REASONS) if np.any(reason == i)}
    assert res.infeasible_by_reason == full
    assert res.candidates == len(lay) and res.feasible == int(np.sum(reason < 0))
    ok = np.nonzero(reason < 0)[0]
    best = ok[sort_key("throughput", lay.take(ok), {k: v[ok] for k, v in met.items()})[0]]
    assert lay.row(int(best)) == res.layout.row(0)


SCREEN_CASES = [  # (preset, gpus, seq, gbs, TrainingConsts overrides, pins)
    ("llama3-70b", 64, 4096, 512, {}, {}),
    ("gpt3-175b", 512, 2048, 1536, {"interleaved_torch_rounds": False, "torch_1f1b_needs_m_ge_p": False}, {}),
    ("llama3-405b", 1024, 131072, 64, {}, {}),
    ("llama3-8b", 24, 8192, 96, {}, {"vpp": 3}),  # pinned misfits: too few layers for some pp x vpp
    ("llama3-8b", 12, 6002, 36, {}, {"sp": True}),  # sequences SP (or cp's 2 chunks) cannot split
]


@pytest.mark.parametrize("case", SCREEN_CASES, ids=[f"{c[0]}-{c[1]}gpu-s{c[2]}" for c in SCREEN_CASES])
def test_screened_layouts_equal_building_everything_then_checking(case):
    """The search runs the structural checks per table (structures, policies) and builds columns only for
    the pairs that pass (search.screened_layouts): the same candidates in the same order, the same count
    and the same failed reasons as build_layouts then structural_infeasibility."""
    from planner.search import screened_layouts, structural_infeasibility
    name, gpus, seq, gbs, over, pins = case
    _, m, tr, hw, _ = _setup(name, gpus, seq, gbs)
    tr = replace(tr, **over)
    pins = Pins(**pins)
    every = build_layouts(m, gpus, gbs, pins, tr.zero_over_cp)
    reason = structural_infeasibility(m, tr, every)
    assert np.any(reason >= 0) and np.any(reason < 0)
    lay, n, failed = screened_layouts(m, tr, gpus, pins)
    assert n == len(every)
    assert np.array_equal(failed, reason[reason >= 0])
    kept = every.take(np.nonzero(reason < 0)[0])
    for k in kept.__dict__:
        assert np.array_equal(np.broadcast_to(getattr(lay, k), (len(lay),)), getattr(kept, k)), k


FLOOR_CASES = [  # (preset, gpus, seq, gbs, TrainingConsts overrides)
    ("llama3-70b", 64, 4096, 512, {}),
    ("llama3-405b", 1024, 131072, 64, {}),
    ("llama3-405b", 256, 8192, 512, {"precision": "master-weights-half-grads", "zero3_fsdp2": False,
                                     "zero3_one_weight_ahead": True, "zero2_each_microbatch": True}),
    ("llama3-8b", 8, 8192, 64, {"precision": "amp"}),
    ("llama3-405b", 8, 4096, 64, {}),  # nothing fits: the closest miss comes from the floored ones too
]


@pytest.mark.parametrize("case", FLOOR_CASES, ids=[f"{c[0]}-{c[1]}gpu-s{c[2]}" for c in FLOOR_CASES])
def test_memory_floor_is_under_every_total_and_changes_no_answer(case):
    """run_search sets aside, unevaluated, what cannot fit on its weights, gradients and optimizer
    states alone (memory.states_floor).  The floor must lie under the full model's total for every
    candidate (offload, ZeRO 0-3, FSDP2 or DeepSpeed stage 3, every schedule), and the search must give
    the same reason counts, best plan and closest miss as evaluating everything."""
    from dataclasses import replace

    from cost_models.memory import states_floor
    from planner.search import REASONS, infeasibility, run_search, sort_key, structural_infeasibility
    name, gpus, seq, gbs, over = case
    spec, m, tr, hw, lay = _setup(name, gpus, seq, gbs)
    tr = replace(tr, **over)
    lay = lay.take(np.nonzero(structural_infeasibility(m, tr, lay) < 0)[0])
    with np.errstate(divide="ignore", invalid="ignore"):
        met = evaluate(m, tr, hw, lay)
    floor = states_floor(m, lay, tr)
    assert np.all(floor <= met["mem_total"] * (1 + 1e-12)), "floor above a total"
    assert np.any(floor > hw.usable_bytes), "the case should exercise the floor"
    import planner.search as search
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(search, "FLOOR_FIRST", 10**9)  # every candidate priced (none left out on its step-time floor)
        res = run_search(m, tr, hw, [gpus], Pins(), top_k=3, objective="throughput")
    _, m, tr0, hw, every = _setup(name, gpus, seq, gbs)
    reason = structural_infeasibility(m, tr, every)
    ok = np.nonzero(reason < 0)[0]
    reason[ok] = infeasibility(m, tr, hw, lay, met, reason=np.full(len(lay), -1))
    assert res.infeasible_by_reason == {r: int(np.sum(reason == i)) for i, r in enumerate(REASONS)
                                        if np.any(reason == i)}
    fits = np.nonzero(reason[ok] < 0)[0]
    if len(fits):
        order = fits[sort_key("throughput", lay.take(fits), {k: v[fits] for k, v in met.items()})[:3]]
        assert [lay.row(int(i)) for i in order] == [res.layout.row(j) for j in range(len(res.layout))]
    else:
        miss = np.nonzero(np.isin(reason[ok], [REASONS.index("memory"), REASONS.index("host-memory")]))[0]
        closest = miss[np.argmin(met["mem_total"][miss])]
        assert res.best_infeasible[0].row(0) == lay.row(int(closest))
        got = res.best_infeasible[1]
        assert set(got) == set(met)
        for k, v in met.items():
            assert np.array_equal(got[k], np.broadcast_to(v, (len(lay),))[[closest]], equal_nan=True), k


def test_memory_first_then_time_gives_evaluate_to_the_bit():
    """The search computes memory for every candidate and times only those that fit
    (cost_models.total.memory, then evaluate(..., mem=)): every metric equals evaluate's alone, bit for
    bit, on every candidate and on any subset (pp 1 plans included, which evaluate runs as 1F1B)."""
    from cost_models.total import memory
    _, m, tr, hw, lay = _setup()
    assert np.any(np.asarray(lay.pp) == 1) and np.any(np.asarray(lay.schedule) != 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        whole = evaluate(m, tr, hw, lay)
        mem = memory(m, tr, lay)
        sub = np.random.default_rng(1).choice(len(lay), size=len(lay) // 3, replace=False)
        part = evaluate(m, tr, hw, lay.take(sub), mem={k: np.asarray(v)[sub] for k, v in mem.items()})
    for k, v in whole.items():
        assert np.array_equal(np.broadcast_to(v, (len(lay),))[sub], np.broadcast_to(part[k], (len(sub),)),
                              equal_nan=True), k


def test_framework_limits_the_schedules_searched():
    from planner.core import FRAMEWORK_SCHEDULES
    spec = load_preset("llama3-70b")
    for fw in ("deepspeed", "megatron"):
        plan = recommend(spec, 64, framework=fw, top_k=10)
        assert {p.parallel.schedule for p in [plan] + plan.alternatives} <= set(FRAMEWORK_SCHEDULES[fw])
    # torch.distributed.pipelining (parplan) offers the zero-bubble schedules
    for schedule in ("zbv", "interleaved-zb"):
        assert recommend(spec, 64, pins=Pins(schedule=schedule)).parallel.schedule == schedule
    with pytest.raises(PlannerError, match="not a megatron schedule"):
        recommend(spec, 64, framework="megatron", pins=Pins(schedule="zbv"))


def test_deepspeed_runs_no_zero2_or_3_inside_a_pipeline():
    spec = load_preset("llama3-70b")
    plan = recommend(spec, 64, framework="deepspeed", top_k=20)
    assert all(p.parallel.zero_stage <= 1 for p in [plan] + plan.alternatives if p.parallel.pp > 1)
    with pytest.raises(PlannerError, match="refuses ZeRO-3"):
        recommend(spec, 64, framework="deepspeed", pins=Pins(zero=3, pp=2))


def test_zero_bubble_with_full_recompute_only_where_the_weight_pass_is_queued():
    """torch's weight-gradient pass re-runs a fully recomputed block once per weight (CPU allocator trace,
    benchmarks/results/2026-11-23-cpu-memory); parplan's runtime queues its linears' weight gradients instead
    (layers.WeightGradStore), outside FSDP2.  So parplan offers the combination below ZeRO-3, and torchtitan (torch's
    pass) and ZeRO-3 never get it, a pin says why."""
    spec = load_preset("llama3-70b")
    plan = recommend(spec, 64, pins=Pins(schedule="interleaved-zb", recompute="full"), top_k=20)
    assert all(p.parallel.schedule == "interleaved-zb" and p.parallel.recompute == "full" and p.parallel.zero_stage < 3
               for p in [plan] + plan.alternatives)
    assert recommend(spec, 64, pins=Pins(schedule="zbv", recompute="selective-op")).parallel.recompute == "selective-op"
    with pytest.raises(PlannerError, match="once per weight"):
        recommend(spec, 64, pins=Pins(schedule="interleaved-zb", recompute="full", zero=3))
    with pytest.raises(PlannerError, match="once per weight"):
        recommend(spec, 64, framework="torchtitan", pins=Pins(schedule="zbv", recompute="full"))
    plan = recommend(spec, 64, framework="torchtitan", pins=Pins(recompute="full"), top_k=20)
    assert all(not (p.parallel.schedule in ("zbv", "interleaved-zb") and p.parallel.recompute == "full")
               for p in [plan] + plan.alternatives)


def test_op_level_selective_recompute_is_offered_where_the_framework_has_it():
    """selective-op is torchtitan's op-level selective checkpointing (parplan's runtime runs the same
    policy): Megatron-LM and DeepSpeed plans never get it, a pin says why; like full recompute it is
    not combined with the zero-bubble schedules under torch's own weight pass (it re-runs the block per weight)."""
    spec = load_preset("llama3-8b")
    for fw in ("megatron", "deepspeed"):
        plan = recommend(spec, 8, framework=fw, top_k=50, seq_len=8192, global_batch_size=16)
        assert all(p.parallel.recompute != "selective-op" for p in [plan] + plan.alternatives), fw
        with pytest.raises(PlannerError, match="does not have"):
            recommend(spec, 8, framework=fw, pins=Pins(recompute="selective-op"))
    plan = recommend(spec, 8, framework="torchtitan", pins=Pins(recompute="selective-op", zero=3, tp=1, pp=1),
                     seq_len=8192, global_batch_size=16)
    assert plan.parallel.recompute == "selective-op"
    with pytest.raises(PlannerError, match="once per weight"):
        recommend(spec, 8, framework="torchtitan", pins=Pins(schedule="zbv", recompute="selective-op"))


def test_op_level_selective_sits_between_none_and_full():
    """Memory and recompute FLOPs of torchtitan's op-level policy fall between no and full recompute."""
    spec = load_preset("llama3-8b")
    got = {rc: recommend(spec, 8, pins=Pins(recompute=rc, zero=3, tp=1, pp=1, dp=8, mbs=1, offload="none"),
                         seq_len=4096, global_batch_size=8, framework="torchtitan").prediction
           for rc in ("none", "selective-op", "full")}
    mem = {rc: p.memory_bytes_per_gpu.activations for rc, p in got.items()}
    hfu_over_mfu = {rc: p.hfu / p.mfu for rc, p in got.items()}
    assert mem["full"] < mem["selective-op"] < mem["none"]
    assert 1.0 == hfu_over_mfu["none"] < hfu_over_mfu["selective-op"] < hfu_over_mfu["full"]


def test_eager_pointwise_work_is_slower_than_fused():
    """torchtitan without training.compile runs a llama block's norms, rotary and SwiGLU as eager ops
    (compute.layer_elementwise_time: 3.3x the fused bytes for Llama 3 8B); the framework's default is
    eager and --fused-elementwise puts it back."""
    from cost_models.compute import layer_elementwise_time
    from cost_models.layout import Layout, ModelDims
    m = ModelDims.from_spec(load_preset("llama3-8b"), 8192)
    lay = Layout(gpus=8, tp=1, pp=1, dp=8, cp=1, vpp=1, mbs=2, zero=3, recompute=0, sp=0, schedule=1, offload=0)
    hw = type("HW", (), {"hbm_bytes_per_s": 1.0})()
    fused, eager = (layer_elementwise_time(m, lay, hw, 2, False, f)[0] for f in (True, False))
    assert eager / fused == pytest.approx(626688 / 188416)  # bytes per token, from the docstring's table
    pins = Pins(tp=1, pp=1, dp=8, mbs=2, zero=3, recompute="selective-op", offload="none")
    spec = load_preset("llama3-8b")
    tt = recommend(spec, 8, framework="torchtitan", pins=pins, seq_len=8192, global_batch_size=16)
    compiled = recommend(spec, 8, framework="torchtitan", pins=pins, seq_len=8192, global_batch_size=16,
                         fused_elementwise=True)
    assert tt.training.fused_elementwise is False and compiled.training.fused_elementwise is True
    assert compiled.prediction.step_time_s < 0.9 * tt.prediction.step_time_s


def test_torchtitan_plans_replicate_or_shard_everything():
    """torchtitan has DDP (ZeRO 0) and FSDP2 (ZeRO 3), no optimizer-only or gradient sharding: its
    plans never use ZeRO 1 or 2, and a pin says so."""
    spec = load_preset("llama3-8b")
    plan = recommend(spec, 8, framework="torchtitan", seq_len=8192, global_batch_size=16, top_k=50)
    assert {p.parallel.zero_stage for p in [plan] + plan.alternatives} <= {0, 3}
    with pytest.raises(PlannerError, match="use one of 0, 3"):
        recommend(spec, 8, framework="torchtitan", pins=Pins(zero=2))


def test_eager_memory_is_torchtitans_not_parplans_runtime():
    """fused_elementwise off makes torchtitan's eager block keep more for the backward (fp32 norm upcasts,
    silu output, GQA copies); parplan's runtime keeps the same uncompiled (its RMSNorm and SwiGLU are
    autograd functions that save what fused kernels do), so only its time changes."""
    from planner.core import Pins
    spec = load_preset("tiny-llama-test")
    kw = dict(seq_len=256, global_batch_size=4, suggest=False,
              pins=Pins(tp=1, pp=1, dp=2, cp=1, mbs=2, zero=0, recompute="none", sp=False, schedule="1f1b"))
    mem = {}
    for fw in ("parplan", "torchtitan"):
        for fused in (True, False):
            p = recommend(spec, 2, framework=fw, fused_elementwise=fused, **kw)
            mem[fw, fused] = p.prediction.memory_bytes_per_gpu.activations
    assert mem["parplan", False] == mem["parplan", True]
    assert mem["torchtitan", False] > mem["torchtitan", True]


def test_sequence_parallelism_needs_the_sequence_to_split_over_tp():
    """Megatron and parplan's runtime split each rank's sequence over the TP group under SP: a sequence
    tp does not divide is no SP candidate (counted as 'seq')."""
    from planner.core import Pins
    spec = load_preset("tiny-llama-test")
    plan = recommend(spec, 2, seq_len=63, global_batch_size=4, suggest=False,
                     pins=Pins(tp=2, pp=1, cp=1, sp=None))
    assert plan.parallel.sp is False
    with pytest.raises(PlannerError, match="multiple of tp"):
        recommend(spec, 2, seq_len=63, global_batch_size=4, suggest=False, pins=Pins(tp=2, pp=1, cp=1, sp=True))


def test_tp_divides_the_mlp_width():
    """Megatron's and parplan's column-parallel layers split the MLP evenly (Megatron's divide() asserts it):
    the search offers only a tp that divides ffn_hidden, and a pinned one that does not is a one-line
    error with the fix (the vocabulary, which both pad, is not a constraint)."""
    spec = ModelSpec(arch="llama", layers=8, hidden=1024, heads=16, kv_heads=16, ffn_hidden=2817, vocab=32001, name="odd")
    plans = recommend(spec, 8, seq_len=2048, global_batch_size=64, top_k=50, suggest=False)
    assert {p.parallel.tp for p in [plans, *plans.alternatives]} == {1}
    with pytest.raises(PlannerError, match=r"--tp 2 must divide ffn_hidden \(2817\).*--ffn-hidden 2818"):
        recommend(spec, 8, seq_len=2048, global_batch_size=64, pins=Pins(tp=2))
    even = spec.model_copy(update={"ffn_hidden": 2816})
    assert recommend(even, 8, seq_len=2048, global_batch_size=64, pins=Pins(tp=2), suggest=False).parallel.tp == 2


def test_torch_1f1b_gets_at_least_a_micro_batch_per_stage():
    """torch's Schedule1F1B refuses fewer micro-batches than stages (a CPU launch of a tiny 4-stage plan the
    search had given one micro-batch of 32 failed on every rank); Megatron's 1F1B runs any count."""
    spec = load_preset("tiny-llama-test")
    plan = recommend(spec, 4, seq_len=128, global_batch_size=32, pins=Pins(tp=1, pp=4, schedule="1f1b"))
    assert plan.training.num_microbatches >= 4
    mega = recommend(spec, 4, seq_len=128, global_batch_size=32, framework="megatron",
                     pins=Pins(tp=1, pp=4, schedule="1f1b", mbs=32))
    assert mega.training.num_microbatches == 1


def test_launch_preflight_refuses_1f1b_with_fewer_micro_batches_than_stages():
    from planner.launch import check_runtime_support
    spec = load_preset("tiny-llama-test")
    plan = recommend(spec, 4, seq_len=128, global_batch_size=32, framework="megatron",
                     pins=Pins(tp=1, pp=4, schedule="1f1b", mbs=32))
    check = check_runtime_support(plan, "cpu")
    assert not check.ok and "needs at least one per stage" in check.detail, check


def test_evaluate_names_the_schedule_rule_a_plan_breaks():
    """A hand-edited plan that breaks a schedule rule gets that rule as its reason, not interleaving's."""
    spec = load_preset("tiny-llama-test")
    plan = recommend(spec, 4, seq_len=128, global_batch_size=32, pins=Pins(tp=1, pp=4, schedule="1f1b"))
    few = plan.model_copy(update={"training": plan.training.model_copy(
        update={"global_batch_size": 2, "micro_batch_size": 2, "num_microbatches": 1})})
    assert evaluate_plan(few).prediction.reason == "schedule: torch's 1F1B needs num_microbatches >= pp(4)"
    zb = plan.model_copy(update={
        "parallel": plan.parallel.model_copy(update={"schedule": "zbv", "vpp": 2, "pp": 2, "dp": 2, "recompute": "full",
                                                     "zero_stage": 3, "stage_layers": None}),
        "training": plan.training.model_copy(update={"num_microbatches": 2})})
    assert evaluate_plan(zb).prediction.reason.startswith("schedule: zero-bubble schedules")
    # parplan's runtime queues the weight gradients outside FSDP2 (WeightGradStore): the same plan at ZeRO-2 runs
    zb2 = zb.model_copy(update={"parallel": zb.parallel.model_copy(update={"zero_stage": 2})})
    assert not (evaluate_plan(zb2).prediction.reason or "").startswith("schedule")
    # ...so a queued zero-bubble plan that breaks another schedule rule is told that rule
    izb = plan.model_copy(update={
        "parallel": plan.parallel.model_copy(update={"schedule": "interleaved-zb", "vpp": 2, "recompute": "full",
                                                     "zero_stage": 1, "stage_layers": None}),
        "training": plan.training.model_copy(update={"global_batch_size": 4, "micro_batch_size": 2,
                                                     "num_microbatches": 2})})
    assert evaluate_plan(izb).prediction.reason.startswith("schedule: interleaving needs")


def test_every_reason_a_plan_can_break_has_its_fix(tmp_path, capsys):
    """`evaluate` of a hand-edited plan that breaks a rule says which and what to change (exit 3, as nothing fits)."""
    from planner.cli import main
    from planner.core import REASON_FIXES
    from planner.search import REASONS
    assert set(REASONS) == set(REASON_FIXES)
    spec = load_preset("tiny-llama-test")
    plan = recommend(spec, 4, seq_len=128, global_batch_size=32, pins=Pins(tp=1, pp=4, schedule="1f1b"))
    few = plan.model_copy(update={"training": plan.training.model_copy(
        update={"global_batch_size": 2, "micro_batch_size": 2, "num_microbatches": 1})})
    path = tmp_path / "few.json"
    path.write_text(few.model_dump_json())
    assert main(["evaluate", str(path), "--json"]) == 3
    out, err = capsys.readouterr()
    assert json.loads(out)["prediction"]["fits"] is False
    assert err.strip() == ("error: plan does not fit: schedule: torch's 1F1B needs num_microbatches >= pp(4) -- fix: "
                           + REASON_FIXES["schedule"])
    from planner.core import reason_fix
    assert "gpipe" in reason_fix(evaluate_plan(few).prediction.reason)  # not "schedule 1f1b" to a 1f1b plan
    zb = plan.model_copy(update={
        "parallel": plan.parallel.model_copy(update={"schedule": "zbv", "vpp": 2, "pp": 2, "dp": 2, "recompute": "full",
                                                     "zero_stage": 3, "stage_layers": None}),
        "training": plan.training.model_copy(update={"num_microbatches": 2})})
    assert reason_fix(evaluate_plan(zb).prediction.reason).startswith("recompute selective or none")
    inter = plan.model_copy(update={
        "parallel": plan.parallel.model_copy(update={"schedule": "interleaved-zb", "vpp": 2, "recompute": "full",
                                                     "zero_stage": 1, "stage_layers": None}),
        "training": plan.training.model_copy(update={"global_batch_size": 4, "micro_batch_size": 2,
                                                     "num_microbatches": 2})})
    assert reason_fix(evaluate_plan(inter).prediction.reason).startswith("num_microbatches a multiple of pp")


def test_a_profile_without_a_fitted_sustained_fraction_says_so(tmp_path):
    """B200, B300, MI300X and MI355X carry isolated-kernel matmul curves only; A100 and H100 have a sustained fraction fitted
    on a published table (README, "Fitted parameters"), and their export-market twins (A800, H800: the same silicon)
    and the GH200 (the H100's GPU, as the H200) carry it, so only the former warn that the time is optimistic (the H100
    NVL and the H20, whose power or compute the H100's fraction was not fitted at, among them)."""
    spec = load_preset("llama3-8b")
    for hw, warned in (("b200", True), ("mi300x", True), ("b300", True), ("mi355x", True), ("l40s", True),
                       ("h100-pcie-80gb", True), ("a100-pcie-80gb", True), ("h100-sxm-80gb", False),
                       ("a100-sxm-80gb", False), ("h800-sxm-80gb", False), ("a800-sxm-80gb", False),
                       ("h100-nvl-94gb", True), ("h20-96gb", True), ("gh200-96gb", False)):
        plan = recommend(spec, 8, hardware=hw, suggest=False)
        assert any(w.startswith("uncalibrated") for w in plan.prediction.warnings) is warned, hw
    # a profile whose fraction a refit (`calibrate --from-run`) or `--sustained` set, 1.0 included, is calibrated
    refit = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "2026-11-22-h100" / "h100-refit.toml"
    from planner.calibrate import profile_toml
    prof = hardware_profiles.load_profile(str(refit))
    assert "sustained_matmul_fraction" in prof.measured
    for measured, warned in ((prof.measured, False), ("2026-11-22: matmul_efficiency_curve", True)):
        path = tmp_path / f"one-{warned}.toml"
        path.write_text(profile_toml(prof.model_copy(update={"sustained_matmul_fraction": 1.0, "measured": measured})))
        plan = recommend(spec, 8, hardware=str(path), suggest=False)
        assert any(w.startswith("uncalibrated") for w in plan.prediction.warnings) is warned, measured


def test_pinned_sp_searches_only_tensor_parallel_layouts():
    """--sp with tp free: sequence parallelism needs a TP group, so only tp > 1 is searched (a tp-1 layout
    kept under the pin used to win on 8 GPUs and fail the plan's own validation as an internal error)."""
    plan = recommend(load_preset("llama3-8b"), 8, pins=Pins(sp=True), top_k=5, suggest=False)
    for p in [plan] + plan.alternatives:
        assert p.parallel.sp and p.parallel.tp > 1
        Plan.model_validate(p.model_dump(mode="json"))
    free = recommend(load_preset("llama3-8b"), 8, pins=Pins(sp=False), top_k=1, suggest=False)
    assert not free.parallel.sp


def test_zero_without_shards_is_not_searched():
    """ZeRO with one shard is ZeRO 0 again: where the framework shards over dp x cp (zero_over_cp), ZeRO > 0
    needs dp x cp > 1; parplan's runtime shards over dp only, so there it needs dp > 1 (cp ranks alone
    would only add its cp all-reduce)."""
    _, m, _, _, _ = _setup("llama3-8b", gpus=8, seq=32768, gbs=64)
    over = build_layouts(m, 8, 64, Pins(), zero_over_cp=True)
    apart = build_layouts(m, 8, 64, Pins(), zero_over_cp=False)
    z, dp, cp, off = (np.asarray(getattr(over, k)) for k in ("zero", "dp", "cp", "offload"))
    assert not np.any((z > 0) & (dp * cp == 1) & (off == 0))
    assert np.any((z > 0) & (dp * cp == 1) & (off > 0))  # optimizer offload is a ZeRO mode, even over one shard
    # ...where ZeRO-2 is ZeRO-1 again (its gradients whole): one of the two is searched, not the same plan twice
    assert np.any((z == 1) & (dp * cp == 1) & (off > 0)) and not np.any((z == 2) & (dp * cp == 1) & (off > 0))
    assert np.any((z > 0) & (dp == 1) & (cp > 1))  # cp ranks are ZeRO's shards here
    z, dp, cp, off = (np.asarray(getattr(apart, k)) for k in ("zero", "dp", "cp", "offload"))
    assert not np.any((z > 0) & (dp == 1) & (off == 0)) and np.any((z > 0) & (cp > 1))
    assert len(apart) < len(over)
    pinned = build_layouts(m, 8, 64, Pins(zero=1, dp=1), zero_over_cp=False)  # a pin is kept as asked
    assert len(pinned) and np.all(np.asarray(pinned.zero) == 1)
    pinned = build_layouts(m, 8, 64, Pins(zero=2, dp=1, offload="optimizer"), zero_over_cp=False)
    assert len(pinned) and np.all(np.asarray(pinned.zero) == 2)


def test_nothing_fits_suggestions_keep_or_name_the_pins():
    """A suggestion is followed as written: the --gpus one keeps the degree pins (dp included) or says which it
    drops, and dropping a single pin that rules everything out is suggested on the same GPUs."""
    from planner.core import NothingFits
    spec = load_preset("llama3-8b")
    with pytest.raises(NothingFits) as e:
        recommend(spec, 8, seq_len=16, global_batch_size=64, pins=Pins(cp=8, offload="none"))
    sugg = e.value.plan.suggestions
    assert any(s.startswith("without --cp 8 it fits on 8 GPUs") for s in sugg), sugg
    for s in sugg:
        if s.startswith("--gpus "):
            assert "cp 8" in s or "without --cp" in s, s
    # GPipe holding all 16 micro-batches' activations, and the autograd loss's fp32 logits (with the fused loss,
    # parplan's default since 2026-11-24, this fits)
    loss = dict(fused_cross_entropy=False, cross_entropy_16bit_grad=False)
    with pytest.raises(NothingFits) as e:
        recommend(spec, 32, global_batch_size=512, pins=Pins(pp=2, schedule="gpipe"), **loss)
    gpus = [s for s in e.value.plan.suggestions if s.startswith("--gpus ")]
    assert gpus and ("pp 2" in gpus[0] or "without --pp" in gpus[0]), gpus
    g = int(gpus[0].split()[1])
    if "without" not in gpus[0]:  # following it works
        assert recommend(spec, g, global_batch_size=512, pins=Pins(pp=2, schedule="gpipe"), suggest=False,
                         **loss).parallel.pp == 2
    # a pinned dp is kept by the --gpus suggestion (it had been dropped without a word, so following it failed)
    with pytest.raises(NothingFits) as e:
        recommend(load_preset("llama2-70b"), 8, pins=Pins(dp=2, zero=0))
    gpus = [s for s in e.value.plan.suggestions if s.startswith("--gpus ")]
    assert gpus and ("dp 2," in gpus[0] or "without --dp 2" in gpus[0]), gpus
    if "without" not in gpus[0]:
        g = int(gpus[0].split()[1])
        assert recommend(load_preset("llama2-70b"), g, pins=Pins(dp=2, zero=0), suggest=False).parallel.dp == 2


def test_search_audit_pins_and_framework_modes():
    """--vpp 1 leaves the interleaved schedules out (it had ranked interleaved rows with one chunk, then
    crashed building the plan); schedule/vpp misfits are one line; one GPU can offload the optimizer without a
    --zero pin (ZeRO-Offload over one shard); torchtitan offers DDP only without tp/pp/cp; Megatron's searched
    ZeRO stages have no ZeRO-2 twin of its distributed optimizer."""
    spec = load_preset("llama3-8b")
    from planner.search import Pins
    plan = recommend(spec, 8, pins=Pins(pp=2, vpp=1), top_k=40)
    assert all(a.parallel.vpp == 1 for a in [plan, *plan.alternatives])
    for pins, msg in ((Pins(pp=2, vpp=1, schedule="interleaved-1f1b"), "interleaving needs 2"),
                      (Pins(pp=2, vpp=3, schedule="zbv"), "exactly 2 chunks"),
                      (Pins(pp=2, vpp=2, schedule="1f1b"), "one chunk per rank")):
        with pytest.raises(PlannerError, match=msg):
            recommend(spec, 8, pins=pins)
    one = recommend(spec, 1)
    assert one.prediction.fits and one.parallel.offload == "optimizer" and one.parallel.zero_stage >= 1
    titan = recommend(spec, 16, framework="torchtitan", top_k=20)
    for a in [titan, *titan.alternatives]:
        p = a.parallel
        assert p.zero_stage == 3 or p.dp == 1 or (p.tp == p.pp == p.cp == 1), p
    # FSDP is torchtitan's default, not a moving part: the near-tie rule does not avoid it there
    from planner.search import complexity
    z3 = titan.alternatives[0].parallel if titan.parallel.zero_stage != 3 else titan.parallel
    assert z3.zero_stage == 3
    lay = Layout(tp=np.array([1]), pp=np.array([1]), dp=np.array([8]), cp=np.array([1]), vpp=np.array([1]),
                 mbs=np.array([1]), zero=np.array([3]), recompute=np.array([0]), sp=np.array([0]),
                 schedule=np.array([0]), offload=np.array([0]), gpus=np.array([8]))
    assert int(complexity(lay)[0]) > 0 and int(complexity(lay, zero3_counts=False)[0]) == 0
    # tp 8 alone on 8 GPUs (in fp32: 16-bit needs FSDP, test_torchtitan_mixed_precision_needs_fsdp): no data
    # parallelism at all (no DDP to refuse), and no FSDP or its CPU offload without a dp_shard to shard over
    tp8 = recommend(spec, 8, framework="torchtitan", pins=Pins(tp=8), top_k=20, precision="fp32")
    assert all(a.parallel.zero_stage == 0 and a.parallel.offload == "none" for a in [tp8, *tp8.alternatives])
    with pytest.raises(PlannerError, match="DDP has not supported"):
        recommend(spec, 16, framework="torchtitan", pins=Pins(zero=0, tp=2, dp=8))
    mega = recommend(load_preset("llama3-70b"), 64, framework="megatron", top_k=20)
    assert all(a.parallel.zero_stage != 2 for a in [mega, *mega.alternatives])


def test_torchtitan_mixed_precision_needs_fsdp():
    """torchtitan's mixed precision is FSDP's policy, and FSDP is on when dp_shard > 1 or cp > 1
    (ParallelDims.fsdp_enabled); without it only DDP/single-device runs autocast (maybe_enable_amp), so tp
    or pp with dp = cp = 1 trains in fp32 and cp never runs beside ZeRO 0.  A 16-bit search offers neither,
    and pins that force one are one line."""
    spec = load_preset("llama3-8b")
    from planner.search import Pins
    for pins in (Pins(tp=4), Pins(pp=2), Pins(cp=2), Pins()):
        plan = recommend(spec, 8, framework="torchtitan", pins=pins, top_k=30)
        for a in [plan, *plan.alternatives]:
            p = a.parallel
            fsdp = p.zero_stage == 3 and p.dp * p.cp > 1
            assert fsdp or (p.tp == p.pp == p.cp == 1), p
    plan = recommend(spec, 8, framework="torchtitan", pins=Pins(tp=4, dp=1), top_k=30)
    assert {(a.parallel.cp, a.parallel.zero_stage) for a in [plan, *plan.alternatives]} == {(2, 3)}
    for pins in (Pins(tp=8), Pins(tp=4, pp=2), Pins(tp=2, dp=1, cp=1)):
        with pytest.raises(PlannerError, match="in fp32, not bf16"):
            recommend(spec, 8, framework="torchtitan", pins=pins)
    with pytest.raises(PlannerError, match="no --zero 0 with --cp"):
        recommend(spec, 8, framework="torchtitan", pins=Pins(zero=0, cp=2))
    # parplan's runtime autocasts any layout: the same pins plan there
    assert recommend(spec, 8, pins=Pins(tp=8)).parallel.tp == 8


def test_torch_interleaved_runs_micro_batches_in_rounds():
    """torch's ScheduleInterleaved1F1B splits m into max(1, m // p) rounds and needs m a multiple of them, not of
    p (Megatron-LM's rule): 3 micro-batches over pp 2 run there, with the bubble and memory of torch's order
    (tests/test_schedule_bubble.py, test_cost_model's order walks); 5 do not, and launch says so."""
    from planner.launch import check_runtime_support
    spec = load_preset("tiny-llama-test")
    pins = Pins(tp=1, pp=2, vpp=2, dp=1, mbs=1, schedule="interleaved-1f1b")
    plan = recommend(spec, 2, seq_len=128, global_batch_size=3, pins=pins)
    assert plan.training.num_microbatches == 3 and plan.parallel.schedule == "interleaved-1f1b"
    assert check_runtime_support(plan, "cpu").ok
    with pytest.raises(PlannerError, match="every candidate breaks a rule"):
        recommend(spec, 2, seq_len=128, global_batch_size=3, pins=pins, framework="megatron")
    with pytest.raises(PlannerError, match="every candidate breaks a rule"):
        recommend(spec, 2, seq_len=128, global_batch_size=5, pins=pins)
    # below p micro-batches the chunk change waits for micro-batch 0: (p-1)/v + (v-1)(p-m)/v = 1, not 0.5
    few = recommend(spec, 2, seq_len=128, global_batch_size=1, pins=pins)
    assert few.prediction.bubble_fraction > plan.prediction.bubble_fraction
    # interleaved-zb from pp micro-batches on (3 over pp 2: rounds of 3), ZB-V any m (memory counts walked on
    # torch's orders: test_cost_model)
    izb = recommend(spec, 2, seq_len=128, global_batch_size=3, pins=replace(pins, schedule="interleaved-zb"))
    assert izb.training.num_microbatches == 3
    with pytest.raises(PlannerError, match="every candidate breaks a rule"):
        recommend(spec, 2, seq_len=128, global_batch_size=1, pins=replace(pins, schedule="interleaved-zb"))
    zbv = recommend(spec, 2, seq_len=128, global_batch_size=3, pins=replace(pins, schedule="zbv"))
    assert zbv.training.num_microbatches == 3 and zbv.parallel.schedule == "zbv"
    edited = plan.model_copy(deep=True)
    edited.training.num_microbatches, edited.training.global_batch_size = 5, 5
    check = check_runtime_support(edited, "cpu")
    assert not check.ok and "multiple of the rounds" in check.detail, check


def test_fp32_recipe_computes_in_fp32():
    """--precision fp32 autocasts nothing (parplan's runtime; Megatron-LM and DeepSpeed without a 16-bit mode):
    its activations are 4 bytes, not the 16-bit dtype's 2, and its matmuls run at the profile's fp32 peak.  A
    CPU launch had measured an fp32 plan 43 % over the prediction that stored them in 2 bytes."""
    spec = load_preset("llama3-8b")
    pins = Pins(tp=1, pp=1, dp=8, mbs=1, zero=3, recompute="none", sp=False, offload="none")
    amp = recommend(spec, 8, seq_len=2048, global_batch_size=8, pins=pins, precision="amp").prediction
    fp32 = recommend(spec, 8, seq_len=2048, global_batch_size=8, pins=pins, precision="fp32").prediction
    # (the loss's fp32 logits are the same in both: the blocks' part doubles)
    assert fp32.memory_bytes_per_gpu.activations > 1.6 * amp.memory_bytes_per_gpu.activations
    # H100: 66.9 TFLOP/s fp32 against 989.4 bf16 dense
    assert fp32.step_time_s > 5 * amp.step_time_s


def test_search_offers_no_plan_its_runtime_refuses_on_a_gpu():
    """parplan's runtime refuses FSDP2 optimizer offload with SP, cp or tied embeddings across a pipeline on cuda
    (launch.check_runtime_support); the memory objective's top plans had been exactly those.  A pin that forces
    one is one line; other frameworks keep them."""
    from planner.launch import check_runtime_support
    spec = load_preset("tiny-llama-test")
    plan = recommend(spec, 8, seq_len=128, global_batch_size=16, objective="memory", top_k=20)
    for a in [plan, *plan.alternatives]:
        assert check_runtime_support(a, "cuda").ok, a.parallel
    with pytest.raises(PlannerError, match="no FSDP2 optimizer offload with --cp 2"):
        recommend(spec, 8, seq_len=128, global_batch_size=16, pins=Pins(zero=3, offload="optimizer", cp=2))
    tt = recommend(spec, 8, seq_len=128, global_batch_size=16, framework="torchtitan", top_k=5,
                   pins=Pins(zero=3, offload="optimizer", cp=2))
    assert tt.parallel.cp == 2 and tt.parallel.offload == "optimizer"


@pytest.mark.parametrize("objective", ["throughput", "memory", "min-gpus"])
@pytest.mark.parametrize("top_k", [1, 5, 40])
def test_sorting_the_contenders_gives_the_full_sorts_top_k(objective, top_k):
    """run_search sorts only the candidates that can reach the first top_k (search.contenders: the
    near-ties of the fastest and the next step times, or the smallest footprints): the same plans, in the
    same order, as sorting every feasible candidate."""
    from planner.search import contenders, infeasibility, sort_key
    _, m, tr, hw, lay = _setup()
    with np.errstate(divide="ignore", invalid="ignore"):
        met = evaluate(m, tr, hw, lay)
    ok = np.nonzero(infeasibility(m, tr, hw, lay, met) < 0)[0]
    lay, met = lay.take(ok), {k: np.broadcast_to(v, (len(lay),))[ok] for k, v in met.items()}
    full = sort_key(objective, lay, met)[:top_k]
    keep = contenders(objective, met, top_k)
    assert len(keep) < len(lay) or objective == "min-gpus"
    part = keep[sort_key(objective, lay.take(keep), {k: v[keep] for k, v in met.items()})[:top_k]]
    assert list(part) == list(full)


def test_selective_recompute_under_parplans_cp_saves_the_ranks_own_kv_and_gathers_again():
    """parplan's all-gather CP saves the gathered K/V (cp x the rank's) and each causal chunk's output for the
    attention's backward; under selective recompute the runtime checkpoints the gather with the attention
    (parallel_layers.model.Attention._context_parallel), so a block saves (cp - 1) x 2 kv_width + q_width
    elements a token fewer (over tp), and the backward gathers K/V once more: three all-gathers' time
    where no recompute has two.  Megatron's ring attention saves neither with or without it, passes K/V again in
    the backward either way, and under selective (its core-attention checkpoint holds the ring) runs the forward's
    exchange once more: four exchanges where no recompute has three."""
    spec = load_preset("llama3-8b")
    pins = dict(tp=2, pp=1, dp=1, cp=8, mbs=1, sp=True, zero=3, offload="none")
    seq, tp, cp, bf16 = 131072, 2, 8, 2

    def plan(framework, rc):
        try:
            return recommend(spec, 16, seq_len=seq, global_batch_size=16, framework=framework,
                             pins=Pins(recompute=rc, **pins))
        except NothingFits as e:  # 114 GB: the numbers hold all the same
            return e.plan

    kv_w, q_w = 8 * 128, 32 * 128
    per_block = seq / cp * ((cp - 1) * 2 * kv_w + q_w) / tp * bf16
    none, sel = plan("parplan", "none"), plan("parplan", "selective")
    saved = none.prediction.memory_bytes_per_gpu.activations - sel.prediction.memory_bytes_per_gpu.activations
    assert saved == pytest.approx(32 * per_block)
    assert sel.prediction.time_breakdown.cp_comm_s == pytest.approx(1.5 * none.prediction.time_breakdown.cp_comm_s)
    mnone, msel = plan("megatron", "none"), plan("megatron", "selective")
    assert mnone.prediction.memory_bytes_per_gpu.activations == msel.prediction.memory_bytes_per_gpu.activations
    assert msel.prediction.comm_bytes_per_step.cp == pytest.approx(4 / 3 * mnone.prediction.comm_bytes_per_step.cp)
    assert none.prediction.comm_bytes_per_step.cp == pytest.approx(2 / 3 * mnone.prediction.comm_bytes_per_step.cp)


def test_parplans_runtime_overlaps_the_gradient_reduction_and_the_parameter_gather():
    """parplan's runtime starts each bucket's gradient reduction (ZeRO 0-2) during the last backward
    (data_parallel.GradReduction) and gathers ZeRO-1/2's stepped parameters beside the next forward
    (ShardedAdamW.wait_for): the framework's default is overlap_grad_reduce on, and overlap_param_gather unset,
    which follows it.  Under a zero-bubble schedule with a pipeline too (its queued weight pass runs the reduction's
    hooks, since 2026-11-25), behind the last micro-batch's weight passes only: the same layout under the interleaved
    1F1B hides it behind whole backwards.  Same bytes either way: only what is exposed changes."""
    spec = load_preset("llama3.2-1b")
    pins = Pins(tp=1, pp=1, dp=16, cp=1, zero=0, mbs=1, recompute="none", offload="none")
    own = recommend(spec, 16, global_batch_size=64, pins=pins)
    after = recommend(spec, 16, global_batch_size=64, pins=pins, overlap_grad_reduce=False)
    assert own.training.overlap_grad_reduce is True and own.training.overlap_param_gather is None
    hidden, exposed = own.prediction.time_breakdown.dp_comm_s, after.prediction.time_breakdown.dp_comm_s
    assert exposed > hidden > 0
    assert own.prediction.comm_bytes_per_step.dp == after.prediction.comm_bytes_per_step.dp
    # ZeRO-1: the parameter gather after the step is exposed where the flag says so (--no-overlap-param-gather)
    z1 = replace(pins, zero=1)
    own1 = recommend(spec, 16, global_batch_size=64, pins=z1)
    serial = recommend(spec, 16, global_batch_size=64, pins=z1, overlap_param_gather=False)
    assert serial.prediction.time_breakdown.dp_comm_s > own1.prediction.time_breakdown.dp_comm_s
    assert own1.prediction.comm_bytes_per_step.dp == serial.prediction.comm_bytes_per_step.dp
    for zero in (0, 1, 2):
        zb = Pins(tp=1, pp=2, dp=8, cp=1, vpp=2, zero=zero, mbs=1, recompute="none", offload="none",
                  schedule="interleaved-zb")
        on = recommend(spec, 16, global_batch_size=64, pins=zb)
        off = recommend(spec, 16, global_batch_size=64, pins=zb, overlap_grad_reduce=False)
        i1f1b = recommend(spec, 16, global_batch_size=64, pins=replace(zb, schedule="interleaved-1f1b"))
        assert on.training.overlap_grad_reduce is True
        assert off.prediction.time_breakdown.dp_comm_s > on.prediction.time_breakdown.dp_comm_s \
            > i1f1b.prediction.time_breakdown.dp_comm_s > 0, zero
        assert on.prediction.comm_bytes_per_step.dp == off.prediction.comm_bytes_per_step.dp, zero


def test_zero1_with_cp_on_parplans_runtime_all_reduces_over_dp_only():
    """ZeRO-1 over dp with cp replicas averaged apart (parplan's runtime, zero_over_cp off): the gradient
    all-reduce runs over dp (2(dp-1)/dp), after an all-reduce over cp (2(cp-1)/cp); it was counted over dp x cp
    as well as over cp.  Bytes against ZeRO-0's single all-reduce over dp x cp, G = gradient bytes per GPU
    (fp32), parameters bf16 (G / 2) gathered back over dp."""
    spec = load_preset("llama3.2-1b")
    base = dict(tp=2, pp=1, dp=4, cp=2, mbs=1, recompute="none", offload="none", sp=True)
    by_zero = {z: recommend(spec, 16, seq_len=8192, global_batch_size=64, pins=Pins(zero=z, **base))
               for z in (0, 1)}
    dp, cp = 4, 2
    G = by_zero[0].prediction.comm_bytes_per_step.dp / (2 * (dp * cp - 1) / (dp * cp))
    want = G * (2 * (dp - 1) / dp + 2 * (cp - 1) / cp) + G / 2 * (dp - 1) / dp
    assert by_zero[1].prediction.comm_bytes_per_step.dp == pytest.approx(want, rel=1e-9)


def test_parplans_zero12_split_the_optimizer_states_evenly():
    """parplan's ZeRO-1/2 split every rank's share evenly, cutting a tensor by rows where a share ends
    (parallel_layers.data_parallel.partition_rows), as Megatron's and DeepSpeed's flat buffers do: at tp 2 x
    dp 32 the rank holding llama3-8b's embedding (128,256 x 4,096 / 2, more than 1/32 of the rank's 4.0 B)
    holds 1/32 of the 12 B/param of fp32 master and Adam states, 1.51 GB (3.15 GB when whole tensors were
    handed out).  ZeRO-3 (FSDP2) shards every tensor."""
    spec = load_preset("llama3-8b")
    pins = dict(tp=2, pp=1, dp=32, cp=1, mbs=1, sp=True, recompute="none", offload="none", dp_replicate=1)

    def opt(framework, zero):
        return recommend(spec, 64, global_batch_size=128, framework=framework,
                         pins=Pins(zero=zero, **pins)).prediction.memory_bytes_per_gpu.optimizer

    per_gpu = param_counts(spec, 4096)["total"] / 2  # tp 2 splits every tensor but the norms
    for zero in (1, 2, 3):
        assert opt("parplan", zero) == pytest.approx(per_gpu * 12 / 32, rel=1e-3), zero
    assert opt("megatron", 1) == pytest.approx(per_gpu * 12 / 32, rel=1e-3)

FLOOR_TIME_CASES = [  # (preset, gpus, seq, gbs, TrainingConsts overrides): pipelines, cp, zero-bubble, no pipeline
    ("llama3-70b", 64, 4096, 512, {}),
    ("llama3-405b", 1024, 131072, 64, {}),
    ("gpt3-175b", 512, 2048, 1536, {"zb_weight_grad_store": True}),
    ("llama3-8b", 16, 8192, 256, {"precision": "amp", "overlap_tp_comm": True}),
]


@pytest.mark.parametrize("case", FLOOR_TIME_CASES, ids=[f"{c[0]}-{c[1]}gpu-s{c[2]}" for c in FLOOR_TIME_CASES])
def test_step_floor_is_under_every_step_and_the_timed_subset_changes_no_answer(case):
    """A throughput search times first the candidates with the lowest step-time floor (total.step_floor), then
    only those whose floor is within the step time that bounds every contender.  The floor must lie under
    evaluate's step for every candidate, and the search must give the same plans, in the same order, with the same
    metrics, as pricing and timing everything (FLOOR_FIRST past the candidate count), for any top_k and over two GPU
    counts, while pricing and timing fewer candidates (those past the bound are counted unpriced); also with only 64
    priced first, where the bound is looser and a wrong bound would drop contenders the default's 4,096 happen to
    hold."""
    import planner.search as search
    from cost_models.total import step_floor
    name, gpus, seq, gbs, over = case
    spec, m, tr, hw, lay = _setup(name, gpus, seq, gbs)
    tr = replace(tr, **over)
    lay = lay.take(np.nonzero(search.structural_infeasibility(m, tr, lay) < 0)[0])
    with np.errstate(divide="ignore", invalid="ignore"):
        step = np.broadcast_to(evaluate(m, tr, hw, lay)["step_time_s"], (len(lay),))
        floor = np.broadcast_to(step_floor(m, tr, hw, lay), (len(lay),))
    assert np.all(floor <= step * (1 + 1e-12)), "floor above a step time"
    assert np.any(floor < 0.5 * step) and np.any(floor > 0.9 * step)  # neither trivial nor the step itself
    # the bound from any subset of the fitting candidates' step times is at or above every contender's step
    with np.errstate(divide="ignore", invalid="ignore"):
        met = evaluate(m, tr, hw, lay)
    fits = np.nonzero(search.infeasibility(m, tr, hw, lay, met) < 0)[0]
    rng = np.random.default_rng(0)
    for top_k in (1, 5, 40):
        worst = step[fits][search.contenders("throughput", {"step_time_s": step[fits],
                                                            "mem_total": met["mem_total"][fits]}, top_k)].max()
        for size in (top_k, 64, len(fits) // 2):
            picks = [rng.choice(fits, size=size, replace=False), fits[np.argsort(step[fits])[:size]]]
            for pick in picks:  # a random subset, and the fastest (where a wrong bound is tightest)
                assert worst <= search.contender_bound(step[pick], top_k), (top_k, size)

    assert search.contender_bound([1.0, np.nan, 2.0, 3.0], 2) == 2.0  # a NaN step would otherwise bound at NaN
    assert search.contender_bound([1.0, 2.0], 5) == np.inf

    timed, priced = [], []
    real_evaluate, real_memory = search.evaluate, search.memory

    def counting(*a, **k):
        timed.append(len(a[3]))
        return real_evaluate(*a, **k)

    def pricing(m_, tr_, sub):
        priced.append(len(sub))
        return real_memory(m_, tr_, sub)

    # with partial recompute (parplan's and Megatron's default: pins.partial_recompute), whose candidates are made
    # from pairs of priced ones; they rank among the top 40 of three of these cases
    pins = Pins(partial_recompute=True)
    partial_ranked = False
    for top_k in (1, 5, 40):
        runs = {}
        # (-64, at top_k 5: 64 first and the rest in slices of 512, each narrowing the bound for the next)
        for first in (64, -64, search.FLOOR_FIRST, 10**9) if top_k == 5 else (64, search.FLOOR_FIRST, 10**9):
            timed.clear()
            priced.clear()
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(search, "FLOOR_FIRST", abs(first))
                if first < 0:
                    mp.setattr(search, "PRICE_SLICE", 512)
                mp.setattr(search, "evaluate", counting)
                mp.setattr(search, "memory", pricing)
                res = search.run_search(m, tr, hw, [gpus // 2, gpus], pins, top_k=top_k, objective="throughput")
            runs[first] = (res, sum(timed), sum(priced))
        every, n_every, p_every = runs.pop(10**9)  # every candidate priced, every one that fits timed
        assert every.unpriced == 0
        partial_ranked |= bool(np.any(np.asarray(every.layout.recompute_layers) > 0))
        for first, (pruned, n_pruned, p_pruned) in runs.items():
            assert [pruned.layout.row(j) for j in range(len(pruned.layout))] == \
                   [every.layout.row(j) for j in range(len(every.layout))], (first, top_k)
            for k, v in every.metrics.items():
                assert np.array_equal(pruned.metrics[k], v, equal_nan=True), (first, top_k, k)
            # what was not priced is counted as such, and only what pricing everything also counts: fewer partial
            # candidates (made only from priced pairs), fewer known to fit or not
            assert pruned.feasible + pruned.unpriced + sum(pruned.infeasible_by_reason.values()) == pruned.candidates
            assert pruned.candidates <= every.candidates and pruned.feasible <= every.feasible
            assert all(v <= every.infeasible_by_reason[k] for k, v in pruned.infeasible_by_reason.items())
            if every.feasible > 2 * abs(first):  # both the shipped first batch and a smaller one prune
                assert n_pruned < n_every and p_pruned < p_every and pruned.unpriced > 0
    assert partial_ranked or name == "gpt3-175b"


def test_a_zbv_plan_whose_rank_0_holds_only_the_embedding_and_head_evaluates():
    """6 blocks over pp 4 x vpp 2 under ZB-V: the search leaves the first and last virtual stages empty (pp x vpp up
    to layers + 2), and both sit on rank 0, which then holds the embedding and the head and no block.  The runtime
    trains it (a CPU run matched the one-rank losses); evaluate and launch's pre-flight had refused it."""
    from planner.core import evaluate_plan
    from planner.schema import ModelSpec
    spec = ModelSpec(arch="llama", layers=6, hidden=128, heads=8, kv_heads=4, ffn_hidden=344, vocab=512)
    plan = recommend(spec, 4, seq_len=128, global_batch_size=8, precision="fp32",
                     pins=Pins(tp=1, pp=4, dp=1, vpp=2, schedule="zbv", mbs=1))
    assert list(plan.parallel.stage_layers) == [0, 1, 1, 1, 1, 1, 1, 0]
    again = evaluate_plan(plan)
    assert again.prediction.step_time_s == pytest.approx(plan.prediction.step_time_s)


def test_an_fp16_plan_counts_the_loss_scales_unscale_pass():
    """fp16 scales the loss (parplan's runtime, parallel_layers.loss_scale; Megatron-LM; torch's GradScaler): the
    step's optimizer phase counts one read and one write of every gradient a rank holds after the reduction
    (cost_models.compute.loss_scale_time: the fp32 main grads under master-weights, the ZeRO shard where the
    reduction shards them); bf16 scales nothing.  recommend had warned that launch refuses such a plan, which it
    no longer does."""
    from cost_models.compute import loss_scale_time
    from cost_models.hardware import constants_from_profile
    from hardware_profiles import load_profile
    from planner.core import evaluate_plan
    spec = load_preset("tiny-llama-test")
    hw = constants_from_profile(load_profile("h100-sxm-80gb"))
    params = spec.num_params
    for zero, held in ((0, params), (2, params / 2)):
        fp16 = recommend(spec, 2, seq_len=128, global_batch_size=8, dtype="fp16",
                         pins=Pins(tp=1, pp=1, dp=2, zero=zero, offload="none"))
        assert not any("loss scaling" in w for w in fp16.prediction.warnings)
        bf16 = evaluate_plan(fp16.model_copy(update={"training": fp16.training.model_copy(update={"dtype": "bf16"})}))
        extra = fp16.prediction.time_breakdown.optimizer_s - bf16.prediction.time_breakdown.optimizer_s
        assert extra == pytest.approx(float(loss_scale_time(held, "master-weights", hw)), rel=1e-9)
        assert extra == pytest.approx(held * 4 * 2 / (hw.hbm_bytes_per_s * hw.optimizer_bw_fraction), rel=1e-9)


def test_min_gpus_tries_every_count_in_a_node_and_every_whole_node():
    """--objective min-gpus tries every count up to a node and then every whole node (it had tried 1, 2, 4 and
    doubling node counts past 8 nodes: llama3-405b without offload came back at 128 GPUs, where the suggestions'
    own scan named 96, and llama2-70b under Megatron at 8 where 6 fit)."""
    plan = recommend(load_preset("llama3-405b"), 1000, objective="min-gpus", pins=Pins(offload="none"))
    assert plan.hardware.gpus == 96
    with pytest.raises(NothingFits):
        recommend(load_preset("llama3-405b"), 88, pins=Pins(offload="none"), suggest=False)
    six = recommend(load_preset("llama2-70b"), 64, objective="min-gpus", framework="megatron")
    assert six.hardware.gpus == 6


def test_min_gpus_fills_a_partly_used_last_node():
    """Past one node min-gpus tries whole nodes, then the counts between the last that did not fit and the first
    that did: gpt3-175b under DeepSpeed fits 15 GPUs (a node and 7 of the next), not 14, and whole nodes had said
    16.  Its tp 3 groups do not tile the 8-GPU nodes, so their collectives are charged the inter-node tier."""
    spec = load_preset("gpt3-175b")
    plan = recommend(spec, 64, objective="min-gpus", framework="deepspeed", seq_len=2048)
    assert plan.hardware.gpus == 15 and plan.prediction.fits
    assert all(a.hardware.gpus == 15 for a in plan.alternatives)
    with pytest.raises(NothingFits):
        recommend(spec, 14, framework="deepspeed", seq_len=2048, suggest=False)
    assert recommend(spec, 16, framework="deepspeed", seq_len=2048, suggest=False).prediction.fits
    # the same under a --gpus that is not whole nodes
    assert recommend(spec, 20, objective="min-gpus", framework="deepspeed", seq_len=2048).hardware.gpus == 15


def test_min_gpus_takes_the_counts_the_pins_divide():
    """--gpus is min-gpus' most, not a count the pins must divide: --tp 8 --pp 3 under --gpus 64 had been refused
    ("--pp 3 does not divide --gpus 64") where --gpus 48 answered 24; it tries the multiples of 24 now.  Pins that
    divide a node keep the node-wise counts, filtered to those they divide; pins past --gpus are refused."""
    from planner.core import PlannerError, _gpu_counts_up_to
    spec = load_preset("llama3-70b")
    for most in (64, 48, 30):
        plan = recommend(spec, most, objective="min-gpus", pins=Pins(tp=8, pp=3))
        assert (plan.hardware.gpus, plan.parallel.tp, plan.parallel.pp) == (24, 8, 3)
    assert recommend(spec, 10, objective="min-gpus", pins=Pins(tp=4)).hardware.gpus % 4 == 0
    assert _gpu_counts_up_to(64, 8, 24) == [24, 48]
    assert _gpu_counts_up_to(20, 8, 4) == [4, 8, 16, 20]
    assert _gpu_counts_up_to(20, 8) == [1, 2, 3, 4, 5, 6, 7, 8, 16, 20]
    with pytest.raises(PlannerError, match="multiply to 24, more than --gpus 16"):
        recommend(spec, 16, objective="min-gpus", pins=Pins(tp=8, pp=3))
    with pytest.raises(PlannerError, match="--tp 8 is more than --gpus 4"):
        recommend(spec, 4, objective="min-gpus", pins=Pins(tp=8))
    # the throughput objective still asks the pins to divide --gpus
    with pytest.raises(PlannerError, match="--pp 3 does not divide --gpus 64"):
        recommend(spec, 64, pins=Pins(tp=8, pp=3))


def test_the_offload_suggestion_keeps_the_pins_where_they_fit():
    """Nothing fits llama3-70b on 8 GPUs at --tp 1 --pp 1 without offload; with it the same pins fit, and the
    suggestion says so (it had dropped every degree pin first and answered tp 4 pp 2 "without --tp --pp")."""
    with pytest.raises(NothingFits) as e:
        recommend(load_preset("llama3-70b"), 8, pins=Pins(tp=1, pp=1, offload="none"))
    said = [s for s in e.value.plan.suggestions if s.startswith("--offload optimizer")]
    assert said and "(tp 1, pp 1," in said[0] and "without" not in said[0]


def test_a_suggestion_names_the_offload_its_layout_needs():
    """Where the layout a suggestion found offloads the optimizer and the user had not pinned --offload, the text
    says so: "without --zero 0 it fits ... with --zero 1 (tp 8, pp 8, ...)" had named a layout that fits only with
    the offload."""
    with pytest.raises(NothingFits) as e:
        recommend(load_preset("llama3-405b"), 64, pins=Pins(zero=0))
    said = [s for s in e.value.plan.suggestions if s.startswith("without --zero 0")]
    assert said and "--offload optimizer" in said[0]
    with pytest.raises(NothingFits):
        recommend(load_preset("llama3-405b"), 64, pins=Pins(zero=1, tp=8, pp=8, offload="none"), suggest=False)


def test_vpp_under_a_framework_without_interleaving_is_refused_by_name():
    """DeepSpeed runs 1F1B, one chunk per rank: --vpp 2 had found no candidate and blamed the model's shape."""
    with pytest.raises(PlannerError, match="--vpp 2: deepspeed runs one model chunk per pipeline rank"):
        recommend(load_preset("llama3-8b"), 8, framework="deepspeed", pins=Pins(vpp=2))
    assert recommend(load_preset("llama3-8b"), 8, framework="megatron", pins=Pins(vpp=2)).parallel.vpp == 2


def test_torchtitan_tensor_parallelism_always_comes_with_sequence_parallelism():
    """torchtitan's TP plan runs the norms under SequenceParallel whenever tp > 1 (apply_tp): its search never
    ranks a tp > 1 plan without SP, a --no-sp pin beside --tp > 1 is one line, and --no-sp alone keeps tp 1.  A
    hand-edited plan that says otherwise is refused by evaluate."""
    from planner.core import StructureError
    spec = load_preset("llama3-70b")
    plan = recommend(spec, 16, framework="torchtitan", top_k=200)
    layouts = [a.parallel for a in [plan, *plan.alternatives]]
    assert any(p.tp > 1 for p in layouts)
    assert all(p.sp for p in layouts if p.tp > 1)
    with pytest.raises(PlannerError, match="always runs sequence parallelism"):
        recommend(spec, 16, framework="torchtitan", pins=Pins(tp=2, sp=False))
    alone = recommend(spec, 16, framework="torchtitan", pins=Pins(sp=False), top_k=30)
    assert {a.parallel.tp for a in [alone, *alone.alternatives]} == {1}
    edited = plan.model_copy(deep=True)
    edited.parallel.tp, edited.parallel.sp = max(2, edited.parallel.tp), False
    with pytest.raises(StructureError, match="always runs sequence parallelism"):
        evaluate_plan(edited)


def test_fsdp_framework_has_no_pipeline_context_or_sequence_parallelism():
    """--framework fsdp (PyTorch FSDP over an eager model with Megatron-style TP: metaseq, llm-foundry) searches
    tp x dp only, without SP, over DDP or FULL_SHARD and whole-block checkpointing; pins of what it lacks are one
    line naming them, and its plans otherwise predict as torchtitan's FSDP2 at the same layout."""
    from planner.core import StructureError
    spec = load_preset("llama3-70b")
    plan = recommend(spec, 16, framework="fsdp", top_k=100)
    layouts = [a.parallel for a in [plan, *plan.alternatives]]
    assert any(p.tp > 1 for p in layouts)
    assert all(p.pp == 1 and p.cp == 1 and not p.sp and p.zero_stage in (0, 3) and p.recompute in ("none", "full")
               for p in layouts)
    for pins, named in ((Pins(pp=2), "--pp 2: fsdp has no pipeline parallelism;"),
                        (Pins(cp=2, pp=2), "--pp 2 --cp 2: fsdp has no pipeline parallelism or context parallelism;"),
                        (Pins(tp=2, sp=True), "--sp: fsdp has no sequence parallelism;")):
        with pytest.raises(PlannerError, match=named):
            recommend(spec, 16, framework="fsdp", pins=pins)
    for pins, named in ((Pins(schedule="interleaved-1f1b"), "--schedule interleaved-1f1b: fsdp has no pipeline"),
                        (Pins(vpp=2), "--vpp 2: fsdp has no pipeline parallelism;"),
                        (Pins(recompute="selective"), "--recompute selective is not a fsdp recompute mode .*use one of "
                                                      "none, full"),
                        (Pins(recompute="selective-op"), "torchtitan's op-level selective checkpointing, which fsdp")):
        with pytest.raises(PlannerError, match=named):
            recommend(spec, 16, framework="fsdp", pins=pins)
    # pins that leave fsdp's tp x dp no layout say so (they had blamed the model's shape and offered --pp)
    with pytest.raises(PlannerError, match="runs under fsdp: it has no pipeline or context parallelism: its layouts "
                                           "are tp x dp") as e:
        recommend(spec, 16, framework="fsdp", pins=Pins(tp=2, dp=2))
    assert "heads" not in str(e.value)
    # DDP beside tp, which torchtitan refuses, is plain PyTorch here (llama3-8b no longer fits so on 16 GPUs: DDP's
    # buckets hold a second copy of its gradients, 92.6 GB per GPU)
    assert recommend(load_preset("llama3.2-3b"), 16, framework="fsdp", pins=Pins(zero=0, tp=2, dp=8)).parallel.tp == 2
    edited = plan.model_copy(deep=True)
    edited.parallel.tp, edited.parallel.sp = max(2, edited.parallel.tp), True
    with pytest.raises(StructureError, match="sp true: fsdp has no sequence parallelism"):
        evaluate_plan(edited)
    same = Pins(tp=1, pp=1, cp=1, dp=16, mbs=1, zero=3, recompute="full", sp=False, schedule="1f1b", offload="none")
    fsdp, titan = (recommend(load_preset("llama3-8b"), 16, framework=fw, pins=same, fused_elementwise=False, async_tp_grad_comm=False)
                   for fw in ("fsdp", "torchtitan"))
    assert fsdp.prediction.memory_bytes_per_gpu.total == titan.prediction.memory_bytes_per_gpu.total
    # the steps differ only by FSDP2's copy-out of each gather into the unsharded parameters (read + write of the
    # 16-bit weights on the compute stream; FSDP1 gathers into its flat parameter): the blocks gathered for the
    # forward and again the backward, the root (embedding, final norm, head) once, every micro-batch
    c = param_counts(titan.model)
    root = c["embedding"] + c["final_norm"] + c["head"]
    micro = titan.training.num_microbatches
    hbm = constants_from_profile(hardware_profiles.load_profile(titan.hardware.name)).hbm_bytes_per_s
    copy_out = micro * (2 * (c["total"] - root) + root) * 2 * 2 / hbm
    assert titan.prediction.step_time_s - fsdp.prediction.step_time_s == pytest.approx(copy_out, rel=1e-9)


def test_a_policy_pin_that_never_fits_gets_a_suggestion_without_it():
    """llama3-405b on 64 GPUs under DeepSpeed at --zero 2: ZeRO-2 forces pp 1 there, and nothing fits; dropping the
    pin fits at ZeRO-1 inside a pipeline, and the suggestions say so (they had relaxed only degrees and GPU counts,
    and said nothing).  With two policy pins the fastest relaxation is named, with the value it takes."""
    with pytest.raises(NothingFits) as e:
        recommend(load_preset("llama3-405b"), 64, framework="deepspeed", pins=Pins(zero=2))
    said = [s for s in e.value.plan.suggestions if s.startswith("without --zero 2")]
    assert said and ("it fits on 64 GPUs with --zero 1 " in said[0] or "with --zero 0 " in said[0]), \
        e.value.plan.suggestions
    with pytest.raises(NothingFits) as e:
        recommend(load_preset("llama3-70b"), 8, pins=Pins(recompute="none", mbs=4))
    said = [s for s in e.value.plan.suggestions if s.startswith("without --")]
    assert said == [s for s in said if s.startswith(("without --mbs 4 it fits on 8 GPUs with --mbs ",
                                                     "without --recompute none it fits on 8 GPUs with --recompute "))]
    assert len(said) == 1


def test_framework_rules_that_rule_out_every_layout_are_named():
    """torchtitan's DDP is one-dimensional and its 16-bit tp needs FSDP: --zero 0 --tp 2 leaves no layout on 8
    GPUs, and the error names those rules and their fixes (it had blamed the model's heads and layers)."""
    for pins in (Pins(zero=0, tp=2), Pins(zero=0, pp=2)):
        with pytest.raises(PlannerError, match="runs under torchtitan: it runs DDP .* only without tp, pp or cp") as e:
            recommend(load_preset("llama3-8b"), 8, framework="torchtitan", pins=pins)
        assert "heads" not in str(e.value) and "use --zero 3" in str(e.value)
    with pytest.raises(PlannerError, match="matches the pinned dimensions for this model"):
        one_head = load_preset("llama3-8b").model_copy(update={"heads": 1, "kv_heads": 1, "head_dim": None})
        recommend(one_head, 8, framework="torchtitan", pins=Pins(sp=True))  # the shape, not a rule


def test_deepspeed_has_no_bf16_zero0_over_replicas_inside_a_pipeline():
    """DeepSpeed trains a bf16 pipeline without ZeRO through its BF16_Optimizer, which shards the fp32 master weights
    and Adam states over dp (ZeRO-1, gradients all-reduced: validate's BLOOM rows); outside a pipeline it is plain
    data parallelism (DDP_BFLOAT16).  Its bf16 search never offers ZeRO 0 over dp x cp > 1 with pp > 1, a pin that
    asks for it is one line, and evaluate refuses such a plan; ZeRO 0 without a pipeline and fp16 pipelines stay."""
    from planner.core import StructureError
    spec = load_preset("llama3-70b")
    plan = recommend(spec, 32, framework="deepspeed", top_k=300)
    layouts = [a.parallel for a in [plan, *plan.alternatives]]
    assert not any(p.zero_stage == 0 and p.pp > 1 and p.dp * p.cp > 1 for p in layouts)
    with pytest.raises(PlannerError, match="--zero 0 with --pp 2 over dp 2 under deepspeed: DeepSpeed trains a bf16"):
        recommend(spec, 32, framework="deepspeed", pins=Pins(zero=0, pp=2, dp=2))
    small = load_preset("llama3-8b")
    flat = recommend(small, 8, framework="deepspeed", pins=Pins(zero=0, pp=1, dp=2))
    assert flat.parallel.zero_stage == 0 and flat.parallel.dp == 2
    fp16 = recommend(spec, 32, framework="deepspeed", dtype="fp16", pins=Pins(zero=0, pp=2, dp=2))
    assert fp16.parallel.zero_stage == 0 and fp16.parallel.dp == 2
    edited = fp16.model_copy(deep=True)
    edited.training.dtype = "bf16"
    with pytest.raises(StructureError, match="zero_stage 0 with pp 2 over dp 2 x cp 1 in bf16"):
        evaluate_plan(edited)

def test_evaluate_refuses_torchtitan_layouts_its_search_never_offers():
    """The search's torchtitan rules hold for a hand-edited plan too: DDP beside tp (ddp_one_dim) and 16-bit tp
    without FSDP (sixteen_bit_needs_shards) are refused by evaluate as by recommend (evaluate had accepted them)."""
    from planner.core import StructureError
    plan = recommend(load_preset("llama3-8b"), 8, framework="torchtitan", pins=Pins(tp=2, dp=4, zero=3))
    ddp = plan.model_copy(deep=True)
    ddp.parallel.zero_stage = 0
    with pytest.raises(StructureError, match="torchtitan runs DDP only without tp, pp or cp"):
        evaluate_plan(ddp)
    alone = plan.model_copy(deep=True)
    alone.parallel.tp, alone.parallel.dp = 8, 1
    alone.training.global_batch_size = alone.training.micro_batch_size * alone.training.num_microbatches
    with pytest.raises(StructureError, match="torchtitan's mixed precision is FSDP's"):
        evaluate_plan(alone)
    assert evaluate_plan(plan).prediction.step_time_s == pytest.approx(plan.prediction.step_time_s, rel=1e-12)


def test_suggestions_skip_counts_no_layout_can_hold():
    """A GPU count whose HBM and hosts together cannot hold 12 B a parameter (Adam's fp32 moments and the fp32
    values, under every recipe) is not searched for a suggestion: a 99-trillion-parameter model on 8 GPUs had run
    some 130 searches (up to a minute).  The floor never rules out a count where a layout fits: the smallest fits of
    llama3-405b, with and without offload, pass it."""
    import planner.core as core
    from planner.core import NothingFits, recommend, states_cannot_fit
    from planner.models import model_from_params
    hw = constants_from_profile(hardware_profiles.load_profile("h100-sxm-80gb"), "bf16")
    spec, _ = model_from_params(99e12)
    assert all(states_cannot_fit(spec.num_params, g, hw) for g in (8, 64, 1024))
    calls = []
    real = core.recommend

    def counting(*a, **k):
        calls.append(a[1] if len(a) > 1 else k.get("gpus"))
        return real(*a, **k)
    core.recommend = counting
    try:
        with pytest.raises(NothingFits):
            real(spec, 8)
    finally:
        core.recommend = real
    assert calls == []
    big, fitted = load_preset("llama3-405b"), []
    for pins in (Pins(offload="none"), Pins(offload="optimizer", zero=3)):
        for g in (8, 16, 32, 64):
            try:
                plan = recommend(big, g, pins=pins, suggest=False, top_k=1)
            except NothingFits:
                continue
            fitted.append((pins.offload, g))
            assert not states_cannot_fit(plan.model.num_params, g, hw), (pins, g)
    assert ("optimizer", 32) in fitted, fitted  # the smallest of these counts where a layout fits


@pytest.mark.parametrize("tp, cp, sp, seq, ok", [
    (1, 2, False, 4098, False),  # 2 x cp = 4 equal chunks: 4098 is even, not a multiple of 4
    (1, 2, False, 4100, True),
    (4, 2, True, 4100, False),   # SP splits each cp rank's 2050 tokens over tp 4: not evenly
    (4, 2, True, 4104, True),    # 2052 over tp 4
    (4, 2, False, 4100, True),   # without SP nothing is split over tp
])
def test_sequence_splits_rule_out_what_cannot_divide(tp, cp, sp, seq, ok):
    """Context parallelism cuts the sequence into 2 x cp equal chunks (load-balanced causal attention), and
    sequence parallelism splits each cp rank's share over tp; a length neither divides is refused with the reason
    `seq`, whatever else the layout does."""
    from planner.core import PlannerError, recommend
    pins = Pins(tp=tp, cp=cp, sp=sp, pp=1, mbs=1, zero=1, recompute="full")
    spec = load_preset("llama3-8b")
    if ok:
        plan = recommend(spec, 8, seq_len=seq, global_batch_size=64, pins=pins, top_k=1)
        assert plan.parallel.cp == cp and plan.training.seq_len == seq
    else:
        with pytest.raises(PlannerError, match=r"every candidate breaks a rule: \d+ .*seq"):
            recommend(spec, 8, seq_len=seq, global_batch_size=64, pins=pins, top_k=1)


def test_the_search_recomputes_the_fewest_blocks_of_each_stage_that_fit():
    """Where the framework recomputes some blocks of a stage (Megatron-LM's --recompute-method block, parplan's
    runtime), a layout that fits only with full recompute is also offered with the fewest blocks of each virtual
    stage recomputed that fit: llama3-70b on 16 H100s (no offload) takes such a plan, faster than the same layout
    recomputing every block; one block fewer does not fit.  torchtitan recomputes every block or none, and a
    pinned --recompute full stays every block.  The plan round-trips: evaluate_plan gives its numbers again."""
    spec = load_preset("llama3-70b")
    best = recommend(spec, 16, framework="megatron", pins=Pins(offload="none"))
    p = best.parallel
    assert p.recompute == "full" and p.recompute_layers and p.recompute_layers < max(p.stage_layers)
    hw = constants_from_profile(hardware_profiles.load_profile("h100-sxm-80gb"), "bf16")
    pred = best.prediction
    assert pred.memory_bytes_per_gpu.total <= hw.usable_bytes
    again = evaluate_plan(best)
    assert again.prediction.step_time_s == pytest.approx(pred.step_time_s, rel=1e-12)
    assert again.prediction.memory_bytes_per_gpu.total == pytest.approx(pred.memory_bytes_per_gpu.total, rel=1e-12)
    fewer = evaluate_plan(best.model_copy(update={"parallel": p.model_copy(update={"recompute_layers": p.recompute_layers - 1})})) \
        if p.recompute_layers > 1 else None
    assert fewer is None or fewer.prediction.memory_bytes_per_gpu.total > hw.usable_bytes
    every = evaluate_plan(best.model_copy(update={"parallel": p.model_copy(update={"recompute_layers": None})}))
    assert every.prediction.step_time_s > pred.step_time_s
    for plan in [best] + best.alternatives:  # no other framework's plan carries it
        assert (plan.parallel.recompute_layers is None) or plan.parallel.recompute == "full"
    titan = recommend(spec, 16, framework="torchtitan", pins=Pins(offload="none"))  # only counts torchtitan gives
    from planner.export import titan_layer_sac_frequency
    assert all(titan_layer_sac_frequency(q) for q in [titan] + titan.alternatives if q.parallel.recompute_layers)
    pinned = recommend(spec, 16, framework="megatron", pins=Pins(offload="none", recompute="full"))
    assert all(q.parallel.recompute_layers is None for q in [pinned] + pinned.alternatives)


def test_torchtitan_recomputes_the_counts_its_layer_checkpointing_gives():
    """torchtitan's layer-level selective checkpointing (selective_ac_option f: every f-th block of a rank whole, by a
    counter that runs on across the rank's model parts) is its partial recompute: the search offers the least count
    it gives that fits, the export writes its f, and a count it cannot give is refused with the ones it can."""
    from cost_models.layout import titan_layer_sac_counts, titan_layer_sac_freq
    from planner.core import StructureError
    from planner.export import export_plan, titan_layer_sac_frequency

    def wrapped(chunks: list[int], f: int) -> list[int]:  # torchtitan's _apply_layer_sac over a rank's model parts
        count, out = 0, []
        for c in chunks:
            n = 0
            for _ in range(c):
                count += 1
                n += count % f == 0
            out.append(n)
        return out
    for chunk in range(2, 41):
        for vpp in (1, 2, 4):
            for n in titan_layer_sac_counts(chunk, vpp):
                assert wrapped([chunk] * vpp, titan_layer_sac_freq(chunk, vpp, n)) == [n] * vpp
            others = {wrapped([chunk] * vpp, f)[0] for f in range(2, chunk + 1)
                      if len(set(wrapped([chunk] * vpp, f))) == 1} - {0}
            assert set(titan_layer_sac_counts(chunk, vpp)) <= others
    assert titan_layer_sac_counts(32, 1) == [1, 2, 3, 4, 5, 6, 8, 10, 16] and titan_layer_sac_counts(8, 2) == [1, 2, 4]
    spec = load_preset("llama3-8b")
    best = recommend(spec, 8, framework="torchtitan", seq_len=8192)
    p = best.parallel
    assert p.recompute == "full" and p.recompute_layers == 3 and p.pp == 1  # floor(32 / 10)
    hw = constants_from_profile(hardware_profiles.load_profile("h100-sxm-80gb"), "bf16")
    assert best.prediction.memory_bytes_per_gpu.total <= hw.usable_bytes
    fewer = evaluate_plan(best.model_copy(update={"parallel": p.model_copy(update={"recompute_layers": 2})}))
    assert fewer.prediction.memory_bytes_per_gpu.total > hw.usable_bytes  # the count below it does not fit
    assert titan_layer_sac_frequency(best) == 10
    toml = export_plan(best, "torchtitan-0.2")
    assert 'mode = "selective"\nselective_ac_option = "10"' in toml
    with pytest.raises(PlannerError, match=r"recomputes 1, 2, 3, 4, 5, 6, 8, 10, 16 of a stage of 32 blocks"):
        recommend(spec, 8, framework="torchtitan", seq_len=8192, pins=Pins(pp=1, recompute_layers=7))
    seven = best.model_copy(update={"parallel": p.model_copy(update={"recompute_layers": 7})})
    with pytest.raises(StructureError, match="recompute_layers 7 under torchtitan"):
        evaluate_plan(seven)
    # a pipeline keeps the default split (the lighter head stage the search tries would make the stages' counts
    # differ, which torchtitan's counter cannot give: benchmarks/export_parse/tt_layer_sac_check.py ran such a plan)
    piped = recommend(spec, 8, framework="torchtitan", seq_len=8192, pins=Pins(pp=2, recompute_layers=4))
    assert piped.parallel.recompute_layers == 4 and len(set(piped.parallel.stage_layers)) == 1
    assert titan_layer_sac_frequency(piped) == 4 and 'selective_ac_option = "4"' in export_plan(piped, "torchtitan-0.2")
    megatron = seven.model_copy(update={"training": best.training.model_copy(update={"framework": "megatron"})})
    toml = export_plan(megatron, "torchtitan-0.2")  # another framework's count torchtitan cannot give: every block
    assert 'mode = "full"' in toml


def test_partial_recompute_pins_and_suggestions():
    """A pinned --recompute-layers never comes back on a zero-bubble schedule (partial recompute is predicted for
    gpipe, 1f1b and interleaved-1f1b; such a plan had been returned, which every other command then refused), and
    where it is too few blocks to fit, the suggestions name the fewest that do."""
    from planner.core import NothingFits
    spec = load_preset("llama3-8b")
    plan = recommend(spec, 8, framework="parplan", global_batch_size=16,
                     pins=Pins(pp=4, vpp=2, recompute_layers=1))
    for q in [plan] + plan.alternatives:
        assert q.parallel.schedule not in ("interleaved-zb", "zbv")
        assert q.parallel.recompute == "full" and q.parallel.recompute_layers == 1
        evaluate_plan(q)  # accepted by the structure check
    with pytest.raises(NothingFits) as e:
        recommend(load_preset("llama3-70b"), 16, framework="megatron",
                  pins=Pins(offload="none", tp=8, pp=2, vpp=1, recompute_layers=5))
    said = " ".join(e.value.plan.suggestions)
    assert "without --recompute-layers 5 it fits on 16 GPUs with --recompute-layers 30" in said, said


def _plan_without_seconds(plan) -> dict:
    out = plan.model_dump(mode="json")
    out["search"].pop("seconds")
    return out


SLICE_CASES = [  # (preset, gpus, framework): dense; a mixture of experts with a dense block; Megatron's partial
    ("llama3-70b", 64, "parplan"),  # recompute candidates (priced after the memory half); nothing fits (the closest
    ("glm-4.5-air", 64, "parplan"),  # miss comes from the floored candidates)
    ("llama3-70b", 64, "megatron"),
    ("llama3-405b", 8, "parplan"),
]


@pytest.mark.parametrize("case", SLICE_CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in SLICE_CASES])
def test_pricing_the_candidates_in_slices_changes_no_bit(case, monkeypatch):
    """The search prices its candidates in slices (layout.in_chunks: the memory floor, the memory model, the
    step-time floor): slices of 997 candidates give the same plans, every number to the bit, the same counts and
    the same closest miss as one slice of all of them."""
    import cost_models.layout as layout
    name, gpus, framework = case
    dumps, sliced = [], []
    for rows in (1 << 40, 997):
        monkeypatch.setattr(layout, "CHUNK_ROWS", rows)
        calls = []
        real = layout.in_chunks

        def counted(lay, fn, rows=None):
            calls.append(len(lay))
            return real(lay, fn, rows)
        monkeypatch.setattr("planner.search.in_chunks", counted)
        try:
            plan = recommend(name, gpus, framework=framework, top_k=5, suggest=False)
        except NothingFits as e:
            plan = e.plan
        dumps.append(_plan_without_seconds(plan))
        sliced.append(max(calls) > rows)
    assert sliced == [False, True], "the second run should price in several slices"
    assert dumps[0] == dumps[1]


def test_in_chunks_joins_arrays_dicts_and_scalars_in_order():
    from cost_models.layout import in_chunks
    _, _, _, _, lay = _setup()
    n = len(lay)
    assert n > 3000
    whole = np.asarray(lay.tp) * 10 + np.asarray(lay.pp)
    assert np.array_equal(in_chunks(lay, lambda sub: np.asarray(sub.tp) * 10 + np.asarray(sub.pp), rows=1000), whole)
    got = in_chunks(lay, lambda sub: {"a": np.asarray(sub.dp), "b": 2.5}, rows=1000)
    assert np.array_equal(got["a"], np.asarray(lay.dp)) and np.array_equal(got["b"], np.full(n, 2.5))
    assert np.shares_memory(lay.rows(5, 9).tp, lay.tp) and lay.rows(5, 9).row(0) == lay.row(5)


@pytest.mark.parametrize("wide", [False, True])
def test_distinct_rows_is_np_uniques_answer_without_its_sort(wide):
    """distinct_rows (the per-shape and per-pipeline-shape dedupe of memory, rank counts and in-flight counts): the
    distinct rows in np.unique's order, every row mapped onto its own, negative values and a column wider than the
    dense table (np.unique's path) alike."""
    from cost_models.layout import DENSE_RANGE, distinct_rows
    rng = np.random.default_rng(7)
    n = 20_000
    cols = [rng.choice([1, 2, 4, 8, 64, 4096], n), rng.integers(-3, 4, n), rng.integers(0, 2, n),
            rng.choice([1.0, 3.0, 96.0], n)]
    if wide:
        cols.append(rng.choice([0, 5, DENSE_RANGE * 3], n))
    first, where = distinct_rows(*cols)
    rows = np.stack([np.asarray(c).astype(np.int64) for c in cols], axis=1)
    uniq, inverse = np.unique(rows, axis=0, return_inverse=True)
    assert np.array_equal(rows[first], uniq)  # one row each, in np.unique's order
    assert np.array_equal(where, inverse.reshape(-1))
    assert np.array_equal(rows[first][where], rows)
    first, where = distinct_rows(np.array([5]))
    assert first.tolist() == [0] and where.tolist() == [0]


@pytest.mark.parametrize("preset,mtp", [("deepseek-v3", 1), ("glm-4.5", 0), ("qwen3-235b-a22b", 0)])
def test_rank_blocks_is_the_counts_each_term_made_alone(preset, mtp):
    """memory.rank_blocks (one dedupe over a search's (pp, vpp, schedule) for the block counts and the dense blocks,
    whose per-row walk layout.rank_dense_blocks keeps between calls): the same arrays, to the value and dtype, as
    model_rank_block_counts and rank_dense_blocks each over every candidate, and again when asked twice."""
    from types import SimpleNamespace
    from cost_models.layout import SCHEDULES, model_rank_block_counts, rank_dense_blocks
    from cost_models.memory import rank_blocks
    m = replace(ModelDims.from_spec(load_preset(preset), 4096), mtp=mtp)
    rng = np.random.default_rng(3)
    n = 6000
    pp = rng.choice([1, 2, 4, 8, 16], n)
    vpp = rng.choice([1, 2, 3, 4], n)
    sch = rng.integers(0, len(SCHEDULES), n)
    lay = SimpleNamespace(pp=pp, vpp=vpp, schedule=sch)
    want = (model_rank_block_counts(m, pp, vpp, sch), rank_dense_blocks(m, pp, vpp, sch))
    for _ in range(2):
        got = rank_blocks(m, lay)
        for a, b in zip(got[0] + got[1], want[0] + want[1]):
            a, b = np.asarray(a), np.asarray(b)
            assert a.dtype == b.dtype and np.array_equal(np.broadcast_to(a, b.shape), b)


def test_the_python_recommend_refuses_what_every_plan_reader_refuses():
    """recommend() had returned plans every command then refused (gpt2 at 4096 tokens past its 1,024 learned
    positions; dtype fp32 under a 16-bit recipe) and ran a whole search before refusing an unknown objective: a
    sequence defaults to the table where shorter, as the CLI's --seq-len, and those are one-line PlannerErrors."""
    assert recommend("gpt2", 8).training.seq_len == 1024
    assert recommend("llama3.2-1b", 8).training.seq_len == 4096
    for kw, said in (({"model": "gpt2", "seq_len": 4096}, "beyond gpt2's 1024 learned positions"),
                     ({"dtype": "fp32"}, "use precision fp32"),
                     ({"objective": "fastest"}, "objective 'fastest' is not one of"),
                     ({"precision": "fp8"}, "precision 'fp8' is not one of")):
        args = {"model": "llama3.2-1b", "gpus": 8, **kw}
        with pytest.raises(PlannerError, match=said):
            recommend(**args)


@pytest.mark.parametrize("gpus, pins, said", [
    (0, {}, "gpus must be a positive integer, got 0"),  # had been pydantic's four-line HardwareRef error
    (8.0, {}, "gpus must be a positive integer, got 8.0"),
    (8, {"recompute": "bogus"}, "Pins recompute must be one of none, selective, full, selective-op or None, got 'bogus'"),
    (8, {"schedule": "1F1B"}, "Pins schedule must be one of gpipe, 1f1b"),  # these three had been "tuple.index(x)"
    (8, {"offload": "cpu"}, "Pins offload must be one of none, optimizer or None"),
    (8, {"tp": "2"}, "Pins tp must be an integer or None, got '2'"),  # a TypeError from a comparison
    (8, {"zero": True}, "Pins zero must be an integer or None, got True"),
    (8, {"sp": "no"}, "Pins sp must be True, False or None, got 'no'"),
])
def test_the_python_recommend_names_a_bad_gpu_count_or_pin(gpus, pins, said):
    """The CLI's options are typed; a Python caller's are not: a wrong kind or name is one PlannerError naming it."""
    with pytest.raises(PlannerError) as e:
        recommend("llama3.2-1b", gpus, pins=Pins(**pins), framework="torchtitan")
    assert str(e.value).startswith(said) and "\n" not in str(e.value)
    assert recommend("llama3.2-1b", np.int64(8), pins=Pins(tp=np.int64(2))).parallel.tp == 2  # numpy integers are integers


def test_torchtitans_own_apply_ac_wrapped_the_planned_counts():
    """benchmarks/results/2026-12-07-export-parse-layer-sac: five `--framework torchtitan` partial-recompute plans
    (the search's own 3 of 32, pinned counts on one stage a rank, under interleaving and on 70B's 20-block stages)
    exported `--to torchtitan-0.2` and run through torchtitan 0.2.2's ConfigManager and apply_ac on each pipeline rank's
    meta-device model parts: every part wrapped the plan's count of blocks whole."""
    from pathlib import Path
    text = (Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "2026-12-07-export-parse-layer-sac"
            / "torchtitan-0.2.2-layer-sac.txt").read_text()
    assert text.startswith("torchtitan 0.2.2 ") and text.count("\n   MATCH") == 5
    assert "MISMATCH" not in text and "FAIL" not in text
    assert "blocks wrapped whole [2, 2] (plan: 2 a stage of [8, 8])" in text  # interleaved: the counter runs on
