"""What the H100 launches of 2026-11-22 taught the cost model, and the accuracy claimed from them.

The GPU numbers are committed reports (benchmarks/results/2026-11-22-h100, each from
`parplan recommend ... --json | parplan launch -` on the device); these tests re-predict them with
this checkout's cost model, so a change that worsens the model against real runs fails here."""
from __future__ import annotations

import importlib.util
import json
import re
import statistics
import sys
from pathlib import Path

import pytest

from cost_models.memory import head_params_per_gpu, layer_params_per_gpu
from cost_models.layout import ModelDims
from planner.calibrate import measure_host_block, profile_toml
from planner.core import evaluate_plan, load_hardware, recommend
from planner.schema import HardwareProfile, ModelSpec
from planner.search import Pins

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "2026-11-22-h100"
RESULTS2 = ROOT / "benchmarks" / "results" / "2026-11-23-h100"  # the next device session (4 fresh machines)
SPEC = ModelSpec(arch="llama", layers=8, hidden=1024, heads=8, kv_heads=4, ffn_hidden=2816, vocab=32000, name="t")


def _plan(gbs: int, mbs: int = 8, recompute: str = "none", hardware: str = "h100-sxm-80gb", **stack):
    """The runtime's loss as the committed H100 runs ran it (the autograd cross-entropy over fp32 logits) unless
    the caller says otherwise."""
    stack = {"fused_cross_entropy": False, "cross_entropy_16bit_grad": False, **stack}
    return recommend(SPEC, gpus=1, seq_len=2048, global_batch_size=gbs, hardware=hardware, suggest=False,
                     pins=Pins(tp=1, pp=1, dp=1, cp=1, mbs=mbs, zero=0, recompute=recompute, offload="none"), **stack)


# ---------------------------------------------------------------------------------------------- memory

def _loss_peak(mbs: int, fused: bool) -> float:
    """The loss's backward over T x V logits: 12 B each unfused (parplan's runtime), 2 + 4 fused
    (Megatron), plus the final norm's input and output (2 x hidden x 2 B per token)."""
    T = mbs * 2048
    return T * SPEC.vocab * (6 if fused else 12) + T * 2 * SPEC.hidden * 2


def _parts(m):
    return m.weights + m.grads + m.optimizer + m.activations + m.other


def test_loss_backward_is_the_peak_when_activations_are_large():
    """Micro-batch 8, no recompute, one micro-batch: the peak is the loss's backward (the H100
    snapshot's moment): states + every saved activation + the loss's 12 B per logit, before any
    gradient or block working memory; two micro-batches add the whole gradient buffer to it."""
    one = _plan(gbs=8).prediction.memory_bytes_per_gpu
    two = _plan(gbs=16).prediction.memory_bytes_per_gpu
    # activations report the loss's peak inside; the total excludes grads and working memory
    assert one.total == pytest.approx(one.weights + one.optimizer + one.activations, rel=1e-9)
    assert two.total - one.total == pytest.approx(one.grads, rel=1e-9)
    fused = _plan(gbs=8, fused_cross_entropy=True)  # Megatron's: 16-bit logits + an fp32 softmax
    drop = one.total - fused.prediction.memory_bytes_per_gpu.total
    assert drop == pytest.approx(_loss_peak(8, False) - _loss_peak(8, True), rel=1e-9)


def test_one_microbatch_grads_dominate_when_activations_are_small():
    """Full recompute leaves little activation memory: with a small vocabulary (a small loss) the peak
    is all gradients, after the backward."""
    one = recommend(SPEC.model_copy(update={"vocab": 4096}), gpus=1, seq_len=2048, global_batch_size=1, suggest=False,
                    pins=Pins(tp=1, pp=1, dp=1, cp=1, mbs=1, zero=0, recompute="full", offload="none")
                    ).prediction.memory_bytes_per_gpu
    assert one.grads > one.activations
    assert one.total == pytest.approx(one.weights + one.optimizer + one.grads + one.other, rel=1e-9)


def test_one_microbatch_gradients_grow_as_activations_are_freed():
    """Between the two: when the blocks' backward is the peak with one micro-batch, only the first
    gradients made (head + one block) coexist with all activations."""
    m = ModelDims.from_spec(SPEC.model_copy(update={"num_params": None}), 2048)
    g_early = 4 * (float(layer_params_per_gpu(m, 1)) + float(head_params_per_gpu(m, 1, 1)))  # fp32 grads
    one = _plan(gbs=2, mbs=2, recompute="selective").prediction.memory_bytes_per_gpu
    # the states, counted by hand: 8 x (q, o 1024^2; k, v 1024 x 512; 3 MLP 1024 x 2816; 2 norms) + embedding
    # and untied head 32000 x 1024 + final norm = 159,925,248 parameters; bf16 weights, fp32 grads, fp32
    # master + Adam's two moments
    n = 8 * (2 * 1024 ** 2 + 2 * 1024 * 512 + 3 * 1024 * 2816 + 2 * 1024) + 2 * 32000 * 1024 + 1024
    assert (one.weights, one.grads, one.optimizer) == (2 * n, 4 * n, 12 * n)
    acts = one.activations - _loss_peak(2, False)  # the saved activations alone
    blocks_bwd = one.weights + one.optimizer + max(acts + g_early, one.grads) + one.other
    loss_bwd = one.weights + one.optimizer + one.activations
    assert one.total == pytest.approx(max(blocks_bwd, loss_bwd), rel=1e-9)



def test_blocks_backward_peak_holds_only_the_first_gradients():
    """With a small vocabulary (a small loss) and no recompute, the blocks' backward sets the one-micro-batch peak:
    every saved activation beside the first gradients made (the head's and one block's), not the whole buffer."""
    spec = SPEC.model_copy(update={"vocab": 1024})
    m = ModelDims.from_spec(spec, 2048)
    g_early = 4 * (float(layer_params_per_gpu(m, 1)) + float(head_params_per_gpu(m, 1, 1)))  # fp32 grads
    one = recommend(spec, gpus=1, seq_len=2048, global_batch_size=2, suggest=False, fused_cross_entropy=False,
                    cross_entropy_16bit_grad=False,
                    pins=Pins(tp=1, pp=1, dp=1, cp=1, mbs=2, zero=0, recompute="none", offload="none")
                    ).prediction.memory_bytes_per_gpu
    tokens = 2 * 2048
    acts = one.activations - (tokens * 1024 * 12 + tokens * 2 * spec.hidden * 2)  # less the loss's backward
    blocks_bwd = one.weights + one.optimizer + acts + g_early + one.other
    assert blocks_bwd > one.weights + one.optimizer + one.activations  # not the loss's moment
    assert g_early < one.grads
    assert one.total == pytest.approx(blocks_bwd, rel=1e-9)


# ---------------------------------------------------------------------------------------------- host bound

def _with_host(tmp_path, host: dict) -> str:
    prof = load_hardware("h100-sxm-80gb").model_copy(update={"host_block_s": host, "name": "h100-host-test"})
    path = tmp_path / f"h100-host-{len(host)}-{len(list(tmp_path.glob('*.toml')))}.toml"
    path.write_text(profile_toml(prof))
    return str(path)


def test_launch_bound_blocks_take_the_host_time(tmp_path):
    """A block takes max(GPU time, measured host time): a tiny model is host-bound, a large one not."""
    unmeasured = _with_host(tmp_path, {})
    path = _with_host(tmp_path, {"none": 0.01, "full": 0.02})
    tiny = ModelSpec(arch="llama", layers=4, hidden=256, heads=4, kv_heads=2, ffn_hidden=512, vocab=1024, name="tiny")
    base = recommend(tiny, gpus=1, seq_len=128, global_batch_size=1, suggest=False, hardware=unmeasured,
                     pins=Pins(tp=1, pp=1, dp=1, mbs=1, zero=0, recompute="none", offload="none"))
    hosted = evaluate_plan(base.model_copy(update={"hardware": base.hardware.model_copy(update={"name": path})}))
    assert base.prediction.step_time_s < 4 * 0.01  # the GPU alone would be far faster
    assert hosted.prediction.step_time_s >= 4 * 0.01
    assert hosted.prediction.step_time_s < 4 * 0.01 + base.prediction.step_time_s
    assert any(w.startswith("launch-bound") for w in hosted.prediction.warnings)
    assert not any(w.startswith("launch-bound") for w in base.prediction.warnings)
    path = _with_host(tmp_path, {"none": 0.0005})  # well under this block's GPU time
    big = _plan(gbs=8, hardware=unmeasured)
    big_hosted = evaluate_plan(big.model_copy(update={"hardware": big.hardware.model_copy(update={"name": path})}))
    assert big_hosted.prediction.step_time_s == pytest.approx(big.prediction.step_time_s, rel=1e-12)
    assert not any(w.startswith("launch-bound") for w in big_hosted.prediction.warnings)


def _with_share(tmp_path, host: dict, share: dict) -> str:
    prof = load_hardware("h100-sxm-80gb").model_copy(update={"host_block_s": host, "host_forward_share": share,
                                                             "name": "h100-share-test"})
    path = tmp_path / f"h100-share-{len(list(tmp_path.glob('*.toml')))}.toml"
    path.write_text(profile_toml(prof))
    return str(path)


def _step_on(plan, path) -> float:
    return evaluate_plan(plan.model_copy(update={"hardware": plan.hardware.model_copy(update={"name": path})})
                         ).prediction.step_time_s


def _makespan(jobs) -> float:
    """A two-machine flow shop run job by job: the GPU starts a kernel when the host has dispatched it and the
    GPU is free (host h, GPU g per job, in order)."""
    host = gpu = 0.0
    for h, g in jobs:
        host += h
        gpu = max(gpu, host) + g
    return gpu


def test_flow_shop_wait_is_the_simulated_makespan_within_one_block():
    """cost_models.compute.flow_shop_wait against the job-by-job simulation, over random host and GPU times per
    block, blocks and micro-batches: equal within the one block's time the closed form leaves out at each end."""
    import random
    from cost_models.compute import flow_shop_wait
    rng = random.Random(4)
    for _ in range(300):
        m, blocks = rng.randint(1, 8), rng.randint(1, 32)
        h_f, g_f, h_b, g_b = (rng.uniform(0.1, 2.0) for _ in range(4))
        jobs = [(h_f, g_f)] * blocks + [(h_b, g_b)] * blocks
        simulated = _makespan(jobs * m)
        model = max(m * blocks * (g_f + g_b), m * blocks * (h_f + h_b)) + float(flow_shop_wait(m, blocks, h_f, g_f, h_b, g_b))
        edge = max(h_f, g_f, h_b, g_b)
        assert model <= simulated + 1e-9 and simulated - model <= edge + 1e-9


def test_a_launch_bound_forward_delays_the_backward_once_a_step(tmp_path):
    """The two-machine flow shop (host dispatches, GPU runs): with the host's dispatch of a block about its GPU
    time, a forward whose dispatch takes most of it leaves the GPU waiting before the backward, so the step
    exceeds max(GPU, host) -- once a step, not once a micro-batch, and never by more than one micro-batch's
    dispatch.  Without a measured share the step is max(GPU, host) as before; far from the bound nothing moves."""
    unmeasured = _with_host(tmp_path, {})
    one, four = _plan(gbs=8, hardware=unmeasured), _plan(gbs=32, hardware=unmeasured)
    blocks = one.parallel.stage_layers[0]
    lo, hi = 0.0, one.prediction.time_breakdown.compute_s / blocks  # the block's GPU time: where the host starts to bind
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _step_on(one, _with_host(tmp_path, {"none": mid})) == one.prediction.step_time_s else (lo, mid)
    h = 0.9 * hi  # GPU-bound, barely: a forward with 0.6 of the dispatch is host-bound, the backward GPU-bound
    plain = _with_host(tmp_path, {"none": h})
    assert _step_on(one, plain) == one.prediction.step_time_s
    shared = _with_share(tmp_path, {"none": h}, {"none": 0.6})
    extra_one = _step_on(one, shared) - _step_on(one, plain)
    extra_four = _step_on(four, shared) - _step_on(four, plain)
    assert extra_one > 0.05 * _step_on(one, plain)
    assert extra_one <= blocks * h
    assert extra_four == pytest.approx(extra_one, rel=1e-6)
    assert _step_on(one, _with_share(tmp_path, {"none": h}, {})) == _step_on(one, plain)
    far = h / 20
    assert _step_on(one, _with_share(tmp_path, {"none": far}, {"none": 0.6})) == pytest.approx(
        _step_on(one, _with_host(tmp_path, {"none": far})), rel=1e-12)
    with pytest.raises(ValueError):
        HardwareProfile(**{**load_hardware("h100-sxm-80gb").model_dump(), "host_forward_share": {"none": 1.2}})


def test_host_block_round_trips_through_the_profile_writer(tmp_path):
    path = _with_host(tmp_path, {"none": 0.00185, "selective": 0.00234, "full": 0.00434})
    back = load_hardware(path)
    assert back.host_block_s == {"none": 0.00185, "selective": 0.00234, "full": 0.00434}
    assert "host_block_s" not in profile_toml(load_hardware("a100-sxm-80gb"))  # unmeasured: not written
    with pytest.raises(ValueError):
        HardwareProfile(**{**back.model_dump(), "host_block_s": {"sometimes": 0.1}})


@pytest.mark.multirank
def test_host_probe_runs_the_runtime_on_cpu():
    """The calibrate probe (pairs of short runtime launches); on a CPU it measures the CPU, not a GPU host."""
    shares: dict = {}
    spread: dict = {}
    out = measure_host_block("cpu", steps=3, modes=("none",), shares=shares, repeats=2, spread=spread)
    assert set(out) == {"none"} and out["none"] > 0
    # the runtime's reports carry the forward's dispatch: its share of the block (here the CPU's compute)
    assert set(shares) == {"none"} and 0 < shares["none"] < 1
    assert set(spread) == {"none"} and spread["none"] >= 0  # two pairs: their spread
    with pytest.raises(ValueError):
        measure_host_block("cpu", modes=("none",), repeats=0)


# ---------------------------------------------------------------------------------------------- the H100 runs

def _gpu_accuracy():
    """benchmarks/gpu_accuracy.py, a script beside the package."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_accuracy
    finally:
        sys.path.pop(0)
    return gpu_accuracy


@pytest.fixture(scope="module")
def accuracy_page():
    return _gpu_accuracy().build(RESULTS)  # (the page's lines, the numbers)


@pytest.fixture(scope="module")
def accuracy(accuracy_page):
    return accuracy_page[1]


def _page_body(path: Path) -> str:
    """A generated accuracy.md less its title and intro (which name the command and the session)."""
    return path.read_text().split("\n\n", 2)[2]


def test_committed_h100_accuracy_regenerates(accuracy_page):
    """The first session's committed accuracy.md is what this checkout's cost model gives for its reports."""
    assert _page_body(RESULTS / "accuracy.md") == "\n".join(accuracy_page[0]) + "\n"


def test_shipped_h100_accuracy_summary_matches_the_cost_model(accuracy, session2, h100_c):
    """planner/data/accuracy.json's H100 line (under every parplan plan) is the grid re-predicted today:
    rerun `python benchmarks/accuracy_report.py` after changing the cost model."""
    gpu_accuracy = _gpu_accuracy()
    from planner.accuracy import PATH
    shipped = json.loads(PATH.read_text(encoding="utf-8"))["h100_launches"]
    assert shipped == gpu_accuracy.summary([accuracy, session2, h100_c[1]], shipped["source"])
    assert shipped["source"] == ", ".join(p.relative_to(ROOT).as_posix() for p in (RESULTS, RESULTS2, RESULTS_H100_C))
    assert shipped["runs"] == 39 + 22 + 8


def test_committed_issue3_report_shows_45_percent_mfu_and_the_model_predicts_its_step(accuracy):
    """The committed H100 report (not re-measurable without a GPU) holds MFU >= 45 % from the piped
    recommend | launch; what CI re-checks is today's cost model against its measured step: the
    held-out profile (fitted without this run) predicts both of its runs within 5 %."""
    rep = json.loads((RESULTS / "grid" / "issue3-mfu" / "report.json").read_text())
    assert "H100" in rep["device"]
    mfus = [s["mfu"] for s in rep["steps"][rep["warmup_steps"]:]]
    assert statistics.median(mfus) >= 0.45
    cmd = (RESULTS / "grid" / "issue3-mfu" / "command.txt").read_text()
    assert "recommend" in cmd and "| " in cmd and "launch -" in cmd  # the number came from the pipe
    runs = [r for r in accuracy["runs"] if r["name"] == "issue3-mfu"]
    assert len(runs) == 2
    for r in runs:
        assert abs(r["pred"]["held-out"][0] - r["step_s"]) / r["step_s"] <= 0.05, r["pred"]


def test_calibrated_profiles_predict_the_runs_better_than_the_datasheet(accuracy):
    med = {k: statistics.median(abs(e) for e in v["step"]) for k, v in accuracy["stats"].items()}
    assert med["refit"] < med["calibrated"] < med["datasheet"]
    assert med["refit"] <= 0.05 and med["held-out"] <= 0.06  # README: 4.4 % and 5.2 %


def test_held_out_refit_within_15_percent_on_all_but_one_run(accuracy):
    """README: 38 of 39 within 15 % held out; the miss is the 1.3B micro-batch-1 full-recompute re-run on
    the second machine (launch-bound, +19 %), a configuration measured at 102 to 130 ms over four runs."""
    misses = [(r["grid"], r["name"]) for r in accuracy["runs"]
              if abs(r["pred"]["held-out"][0] - r["step_s"]) / r["step_s"] > 0.15]
    assert misses == [("grid-refit", "llama-1.3b-mbs1-full")], misses
    spread = [r["step_s"] for r in accuracy["runs"] if r["name"] == "llama-1.3b-mbs1-full"]
    assert len(spread) == 4 and max(spread) / min(spread) > 1.25


def test_new_runs_within_15_percent_with_profiles_fitted_before_them(accuracy):
    """The third device session's 17 runs came after every fit: refit and held-out predict all of them
    within 15 % (README: median 4.6 %, max 12.7 %)."""
    new = [r for r in accuracy["runs"] if r["grid"].startswith("grid-phases")]
    assert len(new) == 17
    for n in ("refit", "held-out"):
        errs = [abs(r["pred"][n][0] - r["step_s"]) / r["step_s"] for r in new]
        assert max(errs) <= 0.15 and statistics.median(errs) <= 0.06, (n, errs)


def test_peak_memory_within_10_percent_of_reserved_with_expandable_segments(accuracy):
    """Every run since launch sets expandable segments (all but the first grid): within 10 % of the
    reserved peak (README: the first grid's 0.5B micro-batch-4 full-recompute run, without them, is -14 %)."""
    errs = [(r["grid"], r["name"], (r["pred"]["refit"][1] - r["reserved"]) / r["reserved"])
            for r in accuracy["runs"] if r["grid"] != "grid"]
    assert len(errs) == 23 and max(abs(e) for *_, e in errs) <= 0.10, errs


def test_peak_memory_within_5_percent_of_allocated_on_every_run(accuracy):
    errs = [(r["name"], (r["pred"]["refit"][1] - r["allocated"]) / r["allocated"]) for r in accuracy["runs"]]
    assert len(errs) == 39
    assert max(abs(e) for _, e in errs) <= 0.05, errs  # README: max 3.2 %


def test_compute_bound_runs_within_15_percent_held_out(accuracy):
    """Every run with micro-batch 4 (GPU-bound), predicted with a profile refit without it."""
    checked = 0
    for r in accuracy["runs"]:
        if r["plan"].training.micro_batch_size >= 4:
            p = r["pred"]["held-out"][0]
            assert abs(p - r["step_s"]) / r["step_s"] <= 0.15, r["name"]
            checked += 1
    assert checked >= 10


def test_gradient_passes_cost_bytes_unless_fused():
    """Unfused (the main_grad hook; parplan's runtime where it cannot fuse, and every run measured before
    2026-11-24): 6 B/param for the first micro-batch's upcast, 10 for each later add, at HBM bandwidth; fused
    accumulation (Megatron's, parplan's runtime on CUDA): none for the linears' weights, whose GEMMs add into
    main_grad; the embedding's gradient (a lookup's) still takes the pass."""
    hw = load_hardware("h100-sxm-80gb")
    bw = hw.hbm_gbytes_per_s * 1e9 * hw.hbm_efficiency
    plain = _plan(gbs=32, grad_accumulation_fusion=False)  # 4 micro-batches of 8
    fused = _plan(gbs=32)
    assert fused.training.grad_accumulation_fusion  # parplan's default
    params = plain.model.num_params - SPEC.vocab * SPEC.hidden  # all but the (untied) embedding's
    extra = plain.prediction.time_breakdown.optimizer_s - fused.prediction.time_breakdown.optimizer_s
    assert extra == pytest.approx(params * (6 + 10 * 3) / bw, rel=0.02)  # num_params incl. norms: ~1 %
    assert plain.prediction.step_time_s - fused.prediction.step_time_s == pytest.approx(extra, rel=1e-9)


def test_optimizer_phase_fit_reproduces_each_runs_after_backward_phase():
    """The third session's reports carry the after-backward phase (optimizer step, synchronised).
    Fitted over them: the optimizer's passes at 0.89 of the copy bandwidth plus ~21 us of host time per
    parameter tensor (README); with those, the model's optimizer term is within 10 % of every run's phase,
    where bandwidth alone at the copy rate is 19-42 % short."""
    from planner.calibrate import _predict, fit_optimizer, read_report
    runs = [read_report(str(p)) for p in sorted(RESULTS.glob("grid-phases*/*/report.json"))]
    base = load_hardware(str(RESULTS / "h100-calibrated.toml"))
    f, h, n = fit_optimizer(runs, base, _predict)
    assert n == 17 and 0.85 <= f <= 0.95 and 15e-6 <= h <= 25e-6
    fitted = base.model_copy(update={"optimizer_bandwidth_fraction": f, "optimizer_host_per_tensor_s": h})
    plain = base.model_copy(update={"optimizer_bandwidth_fraction": 1.0, "optimizer_host_per_tensor_s": 0.0})
    for r in runs:
        t0 = _predict(r["plan"], plain).time_breakdown.optimizer_s
        passes = _predict(r["plan"], plain.model_copy(update={"optimizer_bandwidth_fraction": 0.5})
                         ).time_breakdown.optimizer_s - t0
        upcast = t0 - passes  # the gradient upcast is reported with the optimizer but runs in the backward
        after = _predict(r["plan"], fitted).time_breakdown.optimizer_s - upcast
        assert abs(after - r["after_s"]) / r["after_s"] <= 0.10, (r["path"], after, r["after_s"])
        assert (r["after_s"] - passes) / r["after_s"] >= 0.15, (r["path"], passes, r["after_s"])


def test_refit_from_the_third_session_predicts_the_earlier_runs(accuracy):
    """refit-s3 is fitted only on the third session's 17 reports (optimizer from the phases first):
    on the first two sessions' 22 runs it is within 15 % on 21 (the miss: the noisy launch-bound
    1.3B micro-batch-1 full-recompute re-run), median 2.4 % (README)."""
    old = [r for r in accuracy["runs"] if r["grid"] in ("grid", "grid-refit")]
    errs = {(r["grid"], r["name"]): abs(r["pred"]["refit-s3"][0] - r["step_s"]) / r["step_s"] for r in old}
    assert len(errs) == 22 and statistics.median(errs.values()) <= 0.03
    assert [k for k, e in errs.items() if e > 0.15] == [("grid-refit", "llama-1.3b-mbs1-full")]


def test_launch_summary_names_the_launch_bound_runs():
    """parplan launch prints the step's phases; a run whose host finished dispatching with the device
    (the 1.3B model at micro-batch 1, full recompute) is called launch-bound, a micro-batch-4 3B run is not."""
    from planner.launch import phases_line
    bound = phases_line(json.loads((RESULTS / "grid-phases" / "llama-1.3b-mbs1-full" / "report.json").read_text()))
    free = phases_line(json.loads((RESULTS / "grid-phases" / "llama-3b-mbs4-none" / "report.json").read_text()))
    assert "launch-bound" in bound and "phases" in free and "launch-bound" not in free
    assert phases_line(json.loads((RESULTS / "grid" / "issue3-mfu" / "report.json").read_text())) is None  # no phases yet
    assert "first forward" not in bound  # these reports predate host_forward_s
    rep = json.loads((RESULTS / "grid-phases" / "llama-1.3b-mbs1-full" / "report.json").read_text())
    for st in rep["steps"]:
        st["host_forward_s"] = 0.0412
    assert "host done dispatching the first forward at 41.2 ms, the forward/backward at" in phases_line(rep)


# ---------------------------------------------------------------------------------------------- 2026-11-23

@pytest.fixture(scope="module")
def session2_page():
    return _gpu_accuracy().build_session(RESULTS2)


@pytest.fixture(scope="module")
def session2(session2_page):
    return session2_page[1]


def test_committed_session2_accuracy_regenerates(session2_page):
    """The 2026-11-23 session's committed accuracy.md is what this checkout's cost model gives for its reports."""
    assert _page_body(RESULTS2 / "accuracy.md") == "\n".join(session2_page[0]) + "\n"


def _err(r, profile):
    return (r["pred"][profile][0] - r["step_s"]) / r["step_s"]


def test_committed_calibrate_logs_finished_in_under_five_minutes_on_the_h100():
    """Both calibrations of 2026-11-23 (8 host-probe runs each) took 61 and 79 s (their logs).  This reads the
    committed logs: the time can only be re-measured on a GPU (benchmarks/gpu_next.sh)."""
    import re
    took = [float(re.search(r"calibration took ([0-9.]+) s", (RESULTS2 / log).read_text()).group(1))
            for log in ("calibrate.log", "calibrate-2.log")]
    assert len(took) == 2 and max(took) < 300, took


def test_second_session_calibrated_beats_the_datasheet(session2):
    """22 runs on 2026-11-23's machines (README): |step error| median 16.7 % datasheet, 9.1 % with the
    session's calibrate, 3.8 % with that profile refit over the previous day's launches."""
    med = {k: statistics.median(abs(e) for e in v["step"]) for k, v in session2["stats"].items()}
    assert len(session2["runs"]) == 22
    assert med["calibrated+refit"] < med["calibrated"] < med["datasheet"]
    assert med["calibrated+refit"] <= 0.05


def test_launch_bound_runs_need_a_calibrate_on_their_own_machine(session2):
    """A launch-bound step is the host's dispatch time, which moved up to 1.9x per block between two machines
    of the same kind: calibrated on the machine that ran them, all four launch-bound runs are within 15 %
    (max 10.5 %); the misses beyond 15 % with the refit profile are launch-bound runs calibrated on another
    machine, and one 3B micro-batch-1 run that is close to launch-bound (+15.2 %)."""
    runs = session2["runs"]
    same = [r for r in runs if r["launch_bound"] and r["same_machine"]]
    assert len(same) == 4 and max(abs(_err(r, "calibrated")) for r in same) <= 0.11
    misses = [(r["name"], r["launch_bound"], r["same_machine"]) for r in runs if abs(_err(r, "calibrated+refit")) > 0.15]
    assert all(lb and not sm for _, lb, sm in misses if _ != "llama-3b-mbs1-full"), misses
    assert len(misses) == 5
    three = next(r for r in runs if r["name"] == "llama-3b-mbs1-full")
    assert abs(_err(three, "calibrated+refit")) < 0.16


def test_second_session_memory_within_5_percent_of_allocated_and_10_of_reserved(session2):
    """selective-op (torchtitan's op-level checkpointing) and the eager block included: their memory terms'
    first GPU runs (README: +2.8 % and -0.2 % of allocated)."""
    for r in session2["runs"]:
        mem = r["pred"]["datasheet"][1]
        assert abs(mem - r["allocated"]) / r["allocated"] <= 0.05, r["name"]
        assert abs(mem - r["reserved"]) / r["reserved"] <= 0.10, r["name"]
    names = {r["name"] for r in session2["runs"]}
    assert {"llama-1.3b-mbs4-selective-op", "llama-1.3b-mbs4-none-eager"} <= names


def test_one_block_backward_bound_holds_on_cuda_for_the_runtimes_blocks():
    """block_backward_memory.py --device cuda (bf16, seq 2048, micro-batch 4, hidden 2048): parplan's SDPA
    blocks' backward needs less than the model's one-more-block bound (llama +18 %, gpt 4x over), so the
    bound is safe there; Megatron-style unfused attention in plain torch needs more on CUDA than the
    op-by-op replay (three score-sized tensors live at once: README, 'noticed')."""
    rows = json.loads((RESULTS2 / "block_backward.json").read_text())
    # today's memory model, not the prediction stored beside the measurement (bf16 on CUDA: 2 bytes)
    spec = importlib.util.spec_from_file_location("block_backward_memory", ROOT / "benchmarks" / "block_backward_memory.py")
    bbm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bbm)
    bbm.ACT_BYTES = 2

    def over(r):
        return bbm.model_terms(r["block"], r["s"], r["b"], r["h"], r["a"], r["ffn"], r.get("kv_heads", r["a"]),
                               r["recompute"])["over"]
    assert len(rows) == 6
    for r in rows:
        if r["block"].startswith("parplan"):
            assert over(r) >= r["measured"]["over"], r
    llama = next(r for r in rows if r["block"] == "parplan-llama" and r["recompute"] == "none")
    assert over(llama) / llama["measured"]["over"] - 1 < 0.20


def test_launch_summary_compares_the_hosts_dispatch_with_the_profile():
    """A launch-bound (or predicted launch-bound) run's summary puts the host's dispatch per block beside the
    profile's, and names `calibrate --host-only` when they differ by more than 15 %: the 1.3B micro-batch-1
    run on 2026-11-23's second machine was predicted with the first machine's calibrate (2.42 ms per block;
    1.69 ms here); on the fourth machine, calibrated there, 2.34 against 2.44 ms."""
    from planner.launch import phases_line
    other = phases_line(json.loads((RESULTS2 / "grid" / "llama-1.3b-mbs1-none" / "report.json").read_text()))
    same = phases_line(json.loads((RESULTS2 / "grid-2" / "llama-1.3b-mbs1-none" / "report.json").read_text()))
    assert "though the prediction was" in other and "1.69 ms" in other and "2.42 ms" in other
    assert "calibrate --host-only" in other
    assert "launch-bound: the device waited" in same and "2.34 ms" in same and "2.44 ms" in same
    assert "--host-only" not in same


# ---------------------------------------------------------------------------------------------- other GPU kinds

def _gpu_grid():
    spec = importlib.util.spec_from_file_location("gpu_grid", ROOT / "benchmarks" / "gpu_grid.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_grid_runs_only_entries_in_the_order_given_and_refuses_unknown_names(tmp_path, monkeypatch, capsys):
    """benchmarks/gpu_h200.sh names the launch-bound entries first so a call short of time has run them."""
    grid = _gpu_grid()
    ran = []
    monkeypatch.setattr(grid, "run_entry", lambda name, *a, **k: ran.append(name) or {"name": name, "error": "stub"})
    monkeypatch.setattr(sys, "argv", ["gpu_grid.py", "--out", str(tmp_path), "--only", "llama-3b-mbs4-full",
                                      "llama-0.5b-mbs1-none"])
    grid.main()
    assert ran == ["llama-3b-mbs4-full", "llama-0.5b-mbs1-none"]
    monkeypatch.setattr(sys, "argv", ["gpu_grid.py", "--out", str(tmp_path), "--only", "llama-9b-mbs1-none"])
    with pytest.raises(SystemExit) as e:
        grid.main()
    assert e.value.code == 2 and "no grid entry llama-9b-mbs1-none" in capsys.readouterr().err


def test_a_session_on_another_gpu_kind_is_scored_against_its_own_datasheet(tmp_path):
    """A grids.json naming an H200 session: the datasheet column is the H200 profile, and there is no refit
    over the H100 sessions' reports (calibrate --from-run refuses H100 reports on an H200 base).  The runs are H100 reports copied in
    to exercise the path; the numbers mean nothing."""
    import shutil
    root = tmp_path / "2026-12-01-h200"
    shutil.copytree(RESULTS2 / "grid" / "llama-1.3b-mbs4-none", root / "grid" / "llama-1.3b-mbs4-none")
    shutil.copy(ROOT / "hardware_profiles" / "h200-sxm-141gb.toml", root / "h200-calibrated.toml")
    (root / "grids.json").write_text(json.dumps({"about": "test", "gpu": "H200", "datasheet": "h200-sxm-141gb",
                                                 "grids": {"grid": {"calibrated": "h200-calibrated.toml",
                                                                    "same_machine": True}}}))
    data = _gpu_accuracy().build_session(root)[1]
    (r,) = data["runs"]
    assert set(r["pred"]) == {"datasheet", "calibrated"}  # one report: nothing to hold it out against
    plan = r["plan"]
    expect = evaluate_plan(plan.model_copy(update={"hardware": plan.hardware.model_copy(
        update={"name": "h200-sxm-141gb"})})).prediction.step_time_s
    h100 = evaluate_plan(plan.model_copy(update={"hardware": plan.hardware.model_copy(
        update={"name": "h100-sxm-80gb"})})).prediction.step_time_s
    assert r["pred"]["datasheet"][0] == pytest.approx(expect) and expect != pytest.approx(h100)


def test_grid_leaves_plan_json_to_launch(tmp_path, monkeypatch):
    """launch writes <run>/plan.json itself and refuses a folder whose plan.json holds another plan; its own
    serialisation differs from recommend's stdout, so the grid writing recommend's output there first stopped
    every entry of the first 2026-11-28 H200 call.  recommend's output is kept (as recommend.json) only when
    recommend fails."""
    import subprocess
    grid = _gpu_grid()
    seen = []

    def fake_run(argv, input=None, **kw):
        d = tmp_path / "llama-0.5b-mbs1-none"
        if "recommend" in argv:
            return subprocess.CompletedProcess(argv, 0, stdout='{"plan": 1}', stderr="")
        seen.append((d / "plan.json").exists())
        (d / "report.json").write_text("{}")
        return subprocess.CompletedProcess(argv, 0, stdout="", stderr="")

    monkeypatch.setattr(grid.subprocess, "run", fake_run)
    monkeypatch.setattr(grid, "summarize", lambda name, rep, wall: {"name": name})
    assert grid.run_entry("llama-0.5b-mbs1-none", ["--model", "x"], tmp_path, 5) == {"name": "llama-0.5b-mbs1-none"}
    assert seen == [False]
    launches = []
    monkeypatch.setattr(grid.subprocess, "run", lambda argv, **kw: launches.append(argv) or fake_run(argv, **kw))
    grid.run_entry("llama-0.5b-mbs1-none", ["--model", "x"], tmp_path, 5, profile=True)
    assert launches[-1][-2:] == ["--profile", str(tmp_path / "llama-0.5b-mbs1-none" / "profile")]
    monkeypatch.setattr(grid.subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(argv, 2, "out", "bad"))
    out = grid.run_entry("llama-1.3b-mbs1-none", [], tmp_path, 5)
    assert out["error"].startswith("recommend exit 2")
    assert (tmp_path / "llama-1.3b-mbs1-none" / "recommend.json").read_text() == "out"


# ---------------------------------------------------------------------------------------------- the H200 session

RESULTS_H200 = ROOT / "benchmarks" / "results" / "2026-11-28-h200"  # benchmarks/gpu_h200.sh, one H200, 2026-11-28


@pytest.fixture(scope="module")
def h200():
    return _gpu_accuracy().build_session(RESULTS_H200)


RESULTS_H200_B = ROOT / "benchmarks" / "results" / "2026-12-04-h200"  # gpu_h200.sh and a second call, 2026-12-04


@pytest.fixture(scope="module")
def h200_b():
    return _gpu_accuracy().build_session(RESULTS_H200_B)


def test_committed_h200_accuracy_regenerates(h200):
    """The committed accuracy.md is what this checkout's cost model gives for the committed H200 reports."""
    assert _page_body(RESULTS_H200 / "accuracy.md") == "\n".join(h200[0]) + "\n"


def test_shipped_h200_accuracy_summary_matches_the_cost_model(h200, h200_b):
    """planner/data/accuracy.json's H200 line (under every parplan plan on an H200) is the H200 grid re-predicted
    today: rerun `python benchmarks/accuracy_report.py` after changing the cost model."""
    from planner.accuracy import PATH
    shipped = json.loads(PATH.read_text(encoding="utf-8"))["h200_launches"]
    assert shipped == _gpu_accuracy().summary([h200[1], h200_b[1]], shipped["source"])
    assert shipped["source"] == ", ".join(p.relative_to(ROOT).as_posix() for p in (RESULTS_H200, RESULTS_H200_B))
    assert shipped["runs"] == 16


def test_a_plan_says_how_accurate_on_its_own_gpu_kind():
    """The accuracy line under a parplan plan cites the launches measured on its GPU kind (H100, H200, a calibrated
    copy named after one), and on any other shipped profile says none were launched there before citing the
    H100's; a profile file of the user's own (no kind to tell) gets the H100's numbers without that claim."""
    from planner.accuracy import entries, line
    assert "16 H200 launches" in line("parplan", "h200-sxm-141gb")
    assert "69 H100 launches" in line("parplan", "benchmarks/results/2026-11-22-h100/h100-calibrated.toml")
    assert line("parplan", "a100-sxm-80gb").startswith("how accurate: none launched on a100-sxm-80gb; 69 H100")
    assert line("parplan", "my-node.toml") == line("parplan", "h100-sxm-80gb") == line("parplan")
    assert all("single-H200" in e["basis"] and e["runs"] == 16 for e in entries("parplan", "h200-sxm-141gb"))
    assert all("no launches measured on gb200-nvl72" in e["basis"] for e in entries("parplan", "gb200-nvl72"))
    assert "launches" not in line("megatron", "h200-sxm-141gb")  # other frameworks: published runs only


def test_a_profile_file_named_otherwise_is_read_for_its_gpu_kind(tmp_path):
    """`parplan calibrate --out my-node.toml` names the file as the user likes: its accuracy line reads the GPU kind
    from the profile's own name, else from its description's "calibrated on <device>"; a file that names no GPU
    anywhere (or cannot be read) keeps the H100's numbers without a claim about its GPU."""
    from planner.accuracy import line
    h200 = ROOT / "benchmarks" / "results" / "2026-11-28-h200" / "h200-calibrated.toml"
    h100 = ROOT / "benchmarks" / "results" / "2026-11-22-h100" / "h100-calibrated.toml"
    named_b, named_a = tmp_path / "node-b.toml", tmp_path / "my-node.toml"
    named_b.write_text(h200.read_text(encoding="utf-8"), encoding="utf-8")
    named_a.write_text(h100.read_text(encoding="utf-8"), encoding="utf-8")
    assert line("parplan", str(named_b)) == line("parplan", "h200-sxm-141gb")
    assert line("parplan", str(named_a)) == line("parplan", "h100-sxm-80gb")
    assert line("megatron", str(named_a)) == line("megatron", "h100-sxm-80gb")
    text = h200.read_text(encoding="utf-8").replace('name = "h200-sxm-141gb-calibrated"', 'name = "node7"', 1)
    described = tmp_path / "node7.toml"
    described.write_text(text, encoding="utf-8")
    assert 'name = "node7"' in text and "calibrated on NVIDIA H200" in text
    assert line("parplan", str(described)) == line("parplan", "h200-sxm-141gb")
    pcie = tmp_path / "node9.toml"  # calibrated on an H100 PCIe (the device's name as calibrate records it)
    pcie.write_text(text.replace("calibrated on NVIDIA H200", "calibrated on NVIDIA H100 PCIe"), encoding="utf-8")
    assert f"none launched on {pcie}; 69 H100 launches" in line("parplan", str(pcie))
    named = tmp_path / "named.toml"  # the SXM base's name kept, calibrated on a PCIe card: the card's kind
    named.write_text(h100.read_text(encoding="utf-8").replace("calibrated on NVIDIA H100 80GB HBM3",
                                                              "calibrated on NVIDIA H100 PCIe"), encoding="utf-8")
    assert 'name = "h100' in named.read_text(encoding="utf-8") and "none launched on" in line("parplan", str(named))
    bare = tmp_path / "node8.toml"
    bare.write_text(re.sub(r'(?m)^description = ".*"$', 'description = "the rack by the door"', text), encoding="utf-8")
    assert "H200" not in bare.read_text(encoding="utf-8").split("sources")[0]
    assert line("parplan", str(bare)) == line("parplan") == line("parplan", str(tmp_path / "missing.toml"))


def test_h200_memory_within_5_percent_of_allocated_and_10_of_reserved(h200):
    stats = h200[1]["stats"]["datasheet"]
    assert len(stats["mem"]) == 8
    assert max(abs(x) for x in stats["mem_alloc"]) <= 0.05
    assert max(abs(x) for x in stats["mem"]) <= 0.10


def test_h200_launch_bound_runs_held_out_refit_beats_the_probe(h200):
    """On the H200 machine the calibrate probe's host dispatch missed full recompute (6.06 ms a block against
    about 9.3 in the runs); a refit over the session's other launches, each run held out, brings the launch-bound
    runs to a median within 5 %, closer than the calibrated profile alone."""
    runs = [r for r in h200[1]["runs"] if r["launch_bound"]]
    err = {n: statistics.median(abs(r["pred"][n][0] / r["step_s"] - 1) for r in runs)
           for n in ("calibrated", "calibrated+refit held-out")}
    assert len(runs) == 5
    assert err["calibrated+refit held-out"] < 0.05 < err["calibrated"]


def test_committed_second_h200_accuracy_regenerates(h200_b):
    """2026-12-04's accuracy.md is what this checkout's cost model gives for that session's reports."""
    assert _page_body(RESULTS_H200_B / "accuracy.md") == "\n".join(h200_b[0]) + "\n"


def test_second_h200_session_step_and_memory(h200_b):
    """2026-12-04, one H200 (calibrate --sustained 60, then eight launches predicted with its profile on the same
    machine): every run that is not launch-bound within 15 % with the calibrated profile, the two full-recompute
    launch-bound runs under-predicted by more than that (the probe's host dispatch for full recompute, 8.96 ms a
    block, under the runs' 10.8-11.9), and every run within 15 % once refit over the session's other runs (held
    out); memory within 5 % of the allocator's peak."""
    runs = h200_b[1]["runs"]
    assert len(runs) == 8
    err = lambda r, n: r["pred"][n][0] / r["step_s"] - 1  # noqa: E731
    bound = [r for r in runs if r["launch_bound"]]
    assert sorted(r["name"] for r in bound) == ["llama-0.5b-mbs4-full", "llama-1.3b-mbs1-full"]
    assert all(abs(err(r, "calibrated")) <= 0.15 for r in runs if not r["launch_bound"])
    assert all(err(r, "calibrated") < -0.15 for r in bound)
    assert all(abs(err(r, "calibrated+refit held-out")) <= 0.15 for r in runs)
    stats = h200_b[1]["stats"]["datasheet"]
    assert max(abs(x) for x in stats["mem_alloc"]) <= 0.05 and max(abs(x) for x in stats["mem"]) <= 0.10


def test_second_h200_session_calibrate_fp16_and_dropout():
    """The calibrate ran in under the issue's 5 minutes and measured the sustained fraction; the first fp16 run on a
    GPU kept its loss scale (no step skipped); the first dropout run on a GPU ran 24 % slower than its twin without
    dropout, where the model (Megatron's fused bias-dropout-add) predicts under 1 %: most of it host dispatch
    (README, How accurate)."""
    took = re.search(r"calibration took ([0-9.]+) s", (RESULTS_H200_B / "calibrate.log").read_text(encoding="utf-8"))
    assert took and float(took.group(1)) < 300
    prof = (RESULTS_H200_B / "h200-calibrated.toml").read_text(encoding="utf-8")
    assert re.search(r"(?m)^sustained_matmul_fraction = 0\.84", prof)
    rep = lambda n: json.loads((RESULTS_H200_B / "grid" / n / "report.json").read_text(encoding="utf-8"))  # noqa: E731
    fp16 = rep("llama-1.3b-mbs4-none-fp16")
    assert fp16["loss_scaling"]["skipped_steps"] == [] and fp16["loss_scaling"]["last"] == 65536.0
    drop, twin = rep("gpt-1.3b-mbs4-none-dropout"), rep("gpt-1.3b-mbs4-none")
    assert drop["dropout"] == {"hidden": 0.1, "attention": 0.1} and twin["dropout"] is None
    slower = drop["median"]["step_time_s"] / twin["median"]["step_time_s"]
    predicted = drop["prediction"]["step_time_s"] / twin["prediction"]["step_time_s"]
    assert slower > 1.2 and predicted < 1.01
    assert drop["median"]["host_dispatch_s"] - twin["median"]["host_dispatch_s"] > 0.03


def test_refit_takes_the_forward_share_from_launch_bound_one_stage_phases(tmp_path):
    """`calibrate --from-run` reads the forward's share of the dispatch from reports that carry host_forward_s
    (the runtime writes it since 2026-11-28; the committed H200 reports predate it, so it is written into copies
    of them here): launch-bound one-stage runs only, the median per recompute mode, and a report without the
    phase changes nothing."""
    from planner.calibrate import calibrate_from_runs
    from rich.console import Console
    import io
    import shutil
    paths = []
    for name, share in (("llama-0.5b-mbs1-none", 0.5), ("llama-1.3b-mbs1-none", 0.6), ("llama-1.3b-mbs4-none", 0.9),
                        ("llama-1.3b-mbs1-full", None)):
        d = tmp_path / name
        shutil.copytree(RESULTS_H200 / "grid" / name, d)
        rep = json.loads((d / "report.json").read_text())
        if share is not None:
            for st in rep["steps"]:
                st["host_forward_s"] = share * st["host_dispatch_s"]
        (d / "report.json").write_text(json.dumps(rep))
        paths.append(str(d / "report.json"))
    _, prof, _ = calibrate_from_runs(paths, base=str(RESULTS_H200 / "h200-calibrated.toml"),
                                     out=str(tmp_path / "refit.toml"), console=Console(file=io.StringIO()))
    # the mbs-4 run is not launch-bound by its prediction: its 0.9 is left out
    assert prof.host_forward_share == {"none": pytest.approx(0.55, abs=1e-3)}
    assert any("host_forward_share.none 0 -> 0.55" in src for src in prof.sources)



def test_committed_flow_shop_whatif_regenerates(tmp_path, monkeypatch):
    """The README's what-if numbers for the flow-shop term are benchmarks/flow_shop_whatif.py's output for this
    checkout's cost model and the committed launches."""
    spec = importlib.util.spec_from_file_location("flow_shop_whatif", ROOT / "benchmarks" / "flow_shop_whatif.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "w.md"
    monkeypatch.setattr(sys, "argv", ["flow_shop_whatif.py", "--out", str(out)])
    mod.main()
    assert out.read_text() == (RESULTS_H200 / "flow_shop_whatif.md").read_text()



# ---------------------------------------------------------------------------------------------- 2026-12-06, an H100

RESULTS_H100_C = ROOT / "benchmarks" / "results" / "2026-12-06-h100"  # benchmarks/gpu_h100.sh, then a second call


@pytest.fixture(scope="module")
def h100_c():
    return _gpu_accuracy().build_session(RESULTS_H100_C)


def test_committed_third_h100_accuracy_regenerates(h100_c):
    """2026-12-06's accuracy.md is what this checkout's cost model gives for that session's reports."""
    assert _page_body(RESULTS_H100_C / "accuracy.md") == "\n".join(h100_c[0]) + "\n"


def test_third_h100_session_as_the_readme_states(h100_c):
    """2026-12-06, one H100 (calibrate --sustained 30, then eight launches predicted with its profile on the same
    machine; README, How accurate): the sustained fraction measured 0.89; the 16-bit GPU-bound runs (dense and latent
    attention) within 7 %; the two launch-bound 1.3B runs 15-16 % under (the host dispatched about 1.2x the probe's
    per block); the MoE run over 30 % under (its eager blocks' dispatch); the two FP8 runs 4.6-5.4x the prediction
    while their 16-bit twins ran as predicted; memory within 0.5 % of the allocator's peak on every run."""
    prof = (RESULTS_H100_C / "h100-calibrated.toml").read_text(encoding="utf-8")
    assert re.search(r"(?m)^sustained_matmul_fraction = 0\.891", prof)
    took = re.search(r"calibration took ([0-9.]+) s", (RESULTS_H100_C / "calibrate.log").read_text(encoding="utf-8"))
    assert took and float(took.group(1)) < 300
    runs = {r["name"]: r for r in h100_c[1]["runs"]}
    assert len(runs) == 8
    err = {n: r["pred"]["calibrated"][0] / r["step_s"] - 1 for n, r in runs.items()}
    assert all(abs(err[n]) <= 0.07 for n in ("llama-1.3b-mbs4-none", "llama-3b-mbs4-none", "mla-1.3b-mbs4"))
    assert all(-0.16 < err[n] < -0.15 for n in ("llama-1.3b-mbs1-none", "llama-1.3b-mbs1-full"))
    assert err["moe-2.5b-e16-mbs2"] < -0.30
    ratio = sorted(1 / (1 + err[n]) for n in ("llama-1.3b-mbs4-none-fp8", "llama-3b-mbs4-none-fp8"))
    assert f"{ratio[0]:.1f}-{ratio[1]:.1f}" == "4.6-5.4"
    stats = h100_c[1]["stats"]["calibrated"]
    assert max(abs(x) for x in stats["mem_alloc"]) <= 0.005
    assert sum(abs(x) <= 0.15 for x in stats["step"]) == 3
