"""parplan's runtime FP8 linears (parallel_layers.fp8; a plan's training.fp8 under --framework parplan): the GEMMs
are FP8 (quantization error of E4M3/E5M2 size, not bf16's), every one obeys cuBLASLt's operand rules on Hopper
(checked here on the CPU kernel, which is lenient), the output layer stays 16-bit, the zero-bubble queue and the
fused main_grad accumulation make the same gradients, a tp 2 x SP pair of ranks matches one rank, a one-rank run
learns, and launch's checks and the cost model's cast term say what the runtime does."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import parallel_layers.fp8 as F8
import parallel_layers.layers as L
from parallel_layers.model import ModelConfig, StageModule, init_parameters, iter_shard_specs
from tests.runtime_helpers.plans import TINY_GPT, TINY_LLAMA, counting_token_losses, tiny_plan, write_plan



def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_fp8_gemms_carry_fp8_rounding_error():
    """Each of the three GEMMs against fp32: within E4M3/E5M2's error (a few %), and well above bf16's (0.3 %
    at most here): a path that silently multiplied in 16 bits fails the lower bound."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, 48, generator=g), torch.randn(32, 48, generator=g)
    dy = torch.randn(64, 32, generator=g)
    (y,) = F8.forward(x, [w], [None])
    q = F8.cast_grads([dy])  # cast once, for both backward GEMMs
    checks = [(y, x @ w.t()), (F8.input_grad(q, [w]), dy @ w), (F8.weight_grad(q[0], F8.wgrad_input(x), torch.float32), dy.t() @ x)]
    for got, want in checks:
        assert 0.01 < _rel(got, want) < 0.1
    bf = (x.bfloat16() @ w.bfloat16().t()).float()
    assert _rel(bf, x @ w.t()) < 0.004


def _cuda_rules_mm(calls):
    real = torch._scaled_mm

    def checked(a, b, *, scale_a, scale_b, out_dtype=None, **kw):
        assert a.dim() == b.dim() == 2
        assert a.stride(1) == 1, "first operand row-major"
        assert b.stride(0) == 1, "second operand column-major"
        assert a.shape[1] % 16 == 0 and b.shape[1] % 16 == 0, (a.shape, b.shape)
        assert a.dtype in (F8.E4M3, F8.E5M2) and b.dtype == F8.E4M3, (a.dtype, b.dtype)  # no E5M2 x E5M2
        assert scale_a.dtype == scale_b.dtype == torch.float32 and scale_a.numel() == scale_b.numel() == 1
        calls.append((tuple(a.shape), tuple(b.shape), a.dtype))
        return real(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype, **kw)
    return checked


def _stage(model, fp8: bool, seed=3, recompute="none") -> StageModule:
    plan = tiny_plan(model)
    m = StageModule(ModelConfig.from_plan(plan), list(range(plan.model.layers)), first=True, last=True, tp_group=None,
                    recompute=recompute)
    init_parameters(m, seed)
    if fp8:
        assert L.use_fp8_linears(m.blocks) == sum(
            isinstance(s, (L.ColumnParallelLinear, L.RowParallelLinear)) for b in m.blocks for s in b.modules())
    return m


def _ids(seed=0):
    return torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("model,recompute", [(TINY_LLAMA, "none"), (TINY_GPT, "none"), (TINY_LLAMA, "full")],
                         ids=["llama", "gpt", "llama-full-recompute"])
def test_every_block_gemm_is_fp8_and_takes_hoppers_layouts(model, recompute, monkeypatch):
    """Forward, input gradient and weight gradient of every block linear go through torch._scaled_mm with the
    operands Hopper's FP8 GEMM takes (full recomputation runs each forward GEMM once more); the output layer (and
    the embedding) does not."""
    calls = []
    monkeypatch.setattr(torch, "_scaled_mm", _cuda_rules_mm(calls))
    m = _stage(model, fp8=True, recompute=recompute)
    ids = _ids()
    L.vocab_parallel_cross_entropy(m(ids[:, :-1]), ids[:, 1:], None).backward()
    linears = sum(isinstance(s, (L.ColumnParallelLinear, L.RowParallelLinear)) for b in m.blocks for s in b.modules())
    assert len(calls) == (4 if recompute == "full" else 3) * linears  # forward (again), input and weight gradients
    assert sum(dt == F8.E5M2 for *_, dt in calls) == 2 * linears  # the output gradient in both backward GEMMs
    assert not getattr(m.head, "fp8", False)


@pytest.mark.parametrize("model", [TINY_LLAMA, TINY_GPT], ids=["llama", "gpt"])
def test_fp8_gradients_follow_the_16bit_ones(model):
    """Same weights, same batch: the loss within 1 % and every parameter's gradient within FP8's error of the
    full-precision run's, none of the blocks' weights' identical (they went through FP8 GEMMs)."""
    runs = []
    for fp8 in (False, True):
        m = _stage(model, fp8)
        ids = _ids()
        loss = L.vocab_parallel_cross_entropy(m(ids[:, :-1]), ids[:, 1:], None)
        loss.backward()
        runs.append((loss.item(), {n: p.grad.clone() for n, p, _ in iter_shard_specs(m)}))
    (l0, g0), (l1, g1) = runs
    assert l1 == pytest.approx(l0, rel=0.01)
    scale = max(float(g.norm()) for g in g0.values())
    for n, g in g0.items():
        if g.norm() < 1e-4 * scale:  # gpt's key bias: softmax does not see it, its gradient is rounding noise
            assert g1[n].norm() < 1e-3 * scale, n
            continue
        cos = F.cosine_similarity(g1[n].flatten(), g.flatten(), dim=0)
        assert cos > 0.98, (n, float(cos))
    moved = [n for n in g0 if n.startswith("blocks.") and n.endswith("weight") and g0[n].dim() == 2]
    assert moved and all(not torch.equal(g0[n], g1[n]) for n in moved)


def _fp8_backward(queued: bool) -> StageModule:
    """The tiny llama with FP8 linears after one micro-batch's backward, its weight gradients made in it or queued
    for the zero-bubble weight pass and made there."""
    m = _stage(TINY_LLAMA, fp8=True)
    store = L.WeightGradStore()
    if queued:
        L.defer_weight_grads(list(m.blocks), store)
    ids = _ids()
    L.vocab_parallel_cross_entropy(m(ids[:, :-1]), ids[:, 1:], None).backward()
    store.take()()
    return m


def test_fp8_weight_grads_queued_for_the_zero_bubble_pass_are_the_same():
    grads = []
    for queued in (False, True):
        m = _fp8_backward(queued)
        grads.append({n: p.grad.clone() for n, p, _ in iter_shard_specs(m)})
    for n, g in grads[0].items():
        torch.testing.assert_close(grads[1][n], g, rtol=1e-6, atol=0)


def test_fp8_weight_grads_accumulate_into_main_grad_with_the_fused_kernel():
    """master-weights with the fused accumulation (the reference kernel on CPU): the FP8 GEMM's fp32 dW is main_grad
    after one micro-batch and adds into it on the next; the linears' weights get no 16-bit p.grad."""
    from parallel_layers.precision import attach_main_grads, wgrad_fusion_kernel
    mains = []
    for fused in (False, True):
        m = _stage(TINY_LLAMA, fp8=True).to(torch.bfloat16)
        params = [p for _, p, _ in iter_shard_specs(m)]
        attach_main_grads(params, wgrad_fusion_kernel(torch.device("cpu"), "reference") if fused else None)
        for seed in (0, 1):
            ids = _ids(seed)
            L.vocab_parallel_cross_entropy(m(ids[:, :-1]), ids[:, 1:], None).backward()
        w = m.blocks[0].attn.wq.weight
        assert w.grad is None and w.main_grad.dtype == torch.float32
        mains.append({n: p.main_grad.clone() for n, p, _ in iter_shard_specs(m)})
    for n, g in mains[0].items():
        # unfused: each micro-batch's dW rounded to bf16 before the fp32 sum; fused: summed in fp32
        assert _rel(mains[1][n], g) < 0.01, n


def _tp_worker(rank, port, fp8, out):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    plan = tiny_plan(TINY_LLAMA, tp=2, sp=True)
    m = StageModule(ModelConfig.from_plan(plan), list(range(4)), first=True, last=True, tp_group=dist.group.WORLD,
                    sp=True)
    init_parameters(m, 3)
    if fp8:
        L.use_fp8_linears(m.blocks)
    ids = _ids()
    loss = L.vocab_parallel_cross_entropy(m(ids[:, :-1]), ids[:, 1:], dist.group.WORLD)
    loss.backward()
    res = {"loss": loss.item(), "wq": m.blocks[0].attn.wq.weight.grad.tolist(),
           "down": m.blocks[1].mlp.down.weight.grad.tolist()}
    Path(f"{out}.{rank}").write_text(json.dumps(res))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.multirank
def test_tp2_sequence_parallel_fp8_matches_one_rank(tmp_path):
    """tp 2 with SP (the gathered input cast once per rank, each rank scaling its own weight shard): its loss and
    weight-gradient shards are as close to the full-precision one-rank run's as one rank's FP8 run is (both
    carry FP8's error, scaled differently), and the loss within 0.5 % of it."""
    from tests.runtime_helpers.two_ranks import run_two
    ranks = run_two(_tp_worker, tmp_path / "tp", True)
    ref = {}
    for fp8 in (False, True):
        one = _stage(TINY_LLAMA, fp8=fp8)
        ids = _ids()
        loss = L.vocab_parallel_cross_entropy(one(ids[:, :-1]), ids[:, 1:], None)
        loss.backward()
        ref[fp8] = (loss.item(), one.blocks[0].attn.wq.weight.grad, one.blocks[1].mlp.down.weight.grad)
    (l32, wq32, down32), (l8, wq8, down8) = ref[False], ref[True]
    assert ranks[0]["loss"] == ranks[1]["loss"] == pytest.approx(l8, rel=0.005)
    assert ranks[0]["loss"] == pytest.approx(l32, rel=0.01)
    for name, exact, one8, dim in (("wq", wq32, wq8, 0), ("down", down32, down8, 1)):
        one_err = _rel(one8, exact)
        for r in (0, 1):
            err = _rel(torch.tensor(ranks[r][name]), exact.chunk(2, dim)[r])
            assert 0.005 < err < max(2 * one_err, 0.03), (name, r, err, one_err)


def test_one_rank_fp8_training_learns(tmp_path):
    """parallel_layers.train with an FP8 plan (the plan's training.fp8 reaches the blocks): counting tokens are
    learnt, the loss falling as a 16-bit run's does."""
    plan = tiny_plan(precision="amp")
    plan.training.fp8 = True
    losses = counting_token_losses(type(plan).model_validate(json.loads(plan.model_dump_json())), tmp_path)
    assert losses[0] == pytest.approx(np.log(256), abs=0.1)
    assert min(losses[1:]) < losses[0] - 0.3, losses


def test_launch_checks_an_fp8_plan():
    from planner import launch as Lc
    plan = tiny_plan(precision="master-weights")
    plan.training.fp8 = True
    cpu = Lc.MachineInfo(torch_version="x", gpus=0, free_memory_bytes=None)
    assert Lc.check_fp8(plan, "cpu", cpu).ok and "slow reference" in Lc.check_fp8(plan, "cpu", cpu).detail
    a100 = Lc.MachineInfo(torch_version="x", gpus=1, free_memory_bytes=1, gpu_name="A100", capability=(8, 0))
    c = Lc.check_fp8(plan, "cuda", a100)
    assert not c.ok and "no FP8 tensor cores" in c.detail and "8.9" in c.fix
    h100 = Lc.MachineInfo(torch_version="x", gpus=1, free_memory_bytes=1, gpu_name="H100", capability=(9, 0))
    c = Lc.check_fp8(plan, "cuda", h100)  # runs, with what its GPU runs measured (2026-12-06)
    assert c.ok and c.detail.startswith("warning:") and "4.6-5.4x slower than predicted" in c.detail
    odd = tiny_plan(dict(TINY_LLAMA, ffn_hidden=120), precision="master-weights", tp=2)
    odd.training.fp8 = True
    c = Lc.check_fp8(odd, "cuda", h100)
    assert not c.ok and "ffn_hidden / tp 60" in c.detail and "re-plan without --fp8" in c.fix
    assert Lc.check_fp8(odd, "cpu", cpu).ok  # the CPU kernel takes any size
    titan = tiny_plan(precision="master-weights")
    titan.training.framework, titan.training.fp8 = "torchtitan", True
    assert Lc.check_fp8(titan, "cuda", h100).detail.startswith("warning:")


def test_the_cost_model_counts_the_runtimes_casts():
    """fp8_cast_time's parplan scheme, by hand for a llama block: forward, two shared inputs (h each) and the two
    row-parallel ones, and the weights, each (2 act + 1) bytes; backward, those again plus FP8 transposes (2 bytes)
    and the output gradients."""
    from cost_models.compute import fp8_cast_time
    from cost_models.layout import ModelDims
    from planner.models import load_preset
    from tests.test_cost_model import _lay
    m = ModelDims.from_spec(load_preset("llama3-8b"), 4096)
    lay = _lay(gpus=2, tp=2, dp=1, sp=1, mbs=1)
    hw = type("HW", (), {"hbm_bytes_per_s": 1.0})()
    f, b = fp8_cast_time(m, lay, hw, "parplan", 2)
    T, h, tp = 4096, m.hidden, 2
    inputs = 2 * h + (m.q_width + m.ffn) / tp
    weights = (h * (m.q_width + 2 * m.kv_width) + m.q_width * h + 3 * h * m.ffn) / tp
    grads = (m.q_width + 2 * m.kv_width + 2 * m.ffn) / tp + 2 * h
    assert f == pytest.approx(5 * (T * inputs + weights))
    assert b == pytest.approx(7 * (T * (inputs + grads) + weights))


def test_cpu_time_check_counts_the_fp8_reference_kernel():
    """A cpu launch of an FP8 plan: the blocks' linears at torch's FP8 reference kernel's rate (about 0.1 GFLOP/s
    here, 1,000 times slower than fp32 matmul), the rest at the matmul rate."""
    from planner import launch as Lc
    from planner.core import evaluate_plan
    plan = evaluate_plan(tiny_plan(precision="master-weights"))
    machine = Lc.MachineInfo(torch_version="x", gpus=0, free_memory_bytes=None, cpu_cores=1)
    base = Lc.check_cpu_time(plan, 10, 1, machine, rate=1e11)
    assert Lc.fp8_linear_share(plan) == 0.0
    plan.training.fp8 = True
    share = Lc.fp8_linear_share(plan)
    assert 0.3 < share < 0.9  # the tiny llama: the output layer and attention are the rest
    slow = Lc.check_cpu_time(plan, 10, 1, machine, rate=1e11, fp8_rate=1e8)
    assert "in FP8 GEMMs at 0.1 GFLOP/s" in slow.detail

    def seconds(c):
        return float(c.detail.split("at least ")[1].split(" s a step")[0])
    assert seconds(slow) == pytest.approx(seconds(base) * ((1 - share) + share * 1e3), rel=0.01)
    assert 1e-3 < Lc.cpu_matmul_rate(n=32, repeats=1, fp8=True) / 1e9 < 1e3  # measured, finite


def test_the_compiled_cast_is_the_eager_cast():
    """On a GPU the casts run through torch.compile (one amax and one cast kernel, as the cost model counts);
    compiled here on the CPU backend, the same FP8 bytes and scale as the eager passes, for both formats and a
    shape the compiler saw (dynamic) and one it did not.  Off a GPU, cast is the eager function."""
    compiled = torch.compile(F8._cast_eager, dynamic=True)
    g = torch.Generator().manual_seed(0)
    for shape in ((64, 48), (32, 80)):
        t = torch.randn(*shape, generator=g) * 30
        for fmt in (F8.E4M3, F8.E5M2):
            (a8, sa), (b8, sb) = F8._cast_eager(t, fmt), compiled(t, fmt)
            assert torch.equal(a8.view(torch.uint8), b8.view(torch.uint8)) and torch.equal(sa, sb)
            assert float(a8.float().abs().max()) == torch.finfo(fmt).max  # the amax lands on the format's top
    t8, s = F8.cast(torch.ones(16, 16), F8.E4M3)
    assert F8._cast_compiled is None and float(s) == pytest.approx(1 / 448)


def test_an_fp8_plans_accuracy_line_says_what_its_gpu_runs_measured():
    """The FP8 runs of 2026-12-06 (benchmarks/results/2026-12-06-h100) stepped 4.6-5.4x slower than predicted: a plan
    with FP8 linears on parplan's runtime says so under its accuracy line, a 16-bit plan does not."""
    import json
    from planner.accuracy import FP8_MEASURED, entries, line
    root = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "2026-12-06-h100" / "grid"
    slow = [json.loads((root / n / "report.json").read_text()) for n in ("llama-1.3b-mbs4-none-fp8", "llama-3b-mbs4-none-fp8")]
    ratios = sorted(r["median"]["step_time_s"] / r["prediction"]["step_time_s"] for r in slow)
    assert f"{ratios[0]:.1f}-{ratios[1]:.1f}x slower" in FP8_MEASURED
    assert FP8_MEASURED in line("parplan", "h100-sxm-80gb", fp8=True)
    assert FP8_MEASURED not in line("parplan", "h100-sxm-80gb")
    assert all(FP8_MEASURED in e["basis"] for e in entries("parplan", "h100-sxm-80gb", fp8=True))


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_explain_shows_the_fp8_casts_of_compute(recompute, capsys, tmp_path):
    """The time breakdown's FP8 casts (TimeBreakdown.fp8_cast_s): every micro-batch's blocks' quantization passes,
    forward, backward and, under full recompute, the forward's again; shown under compute by `explain`; None for a
    16-bit plan."""
    from cost_models.compute import fp8_cast_time
    from cost_models.layout import ModelDims
    from planner.cli import main
    from planner.core import recommend
    from planner.models import load_preset
    from planner.search import Pins
    from tests.test_cost_model import _lay
    from tests.test_fp8 import _hw
    pins = Pins(tp=1, pp=1, dp=8, cp=1, mbs=1, vpp=1, zero=1, recompute=recompute, offload="none")
    kw = dict(pins=pins, global_batch_size=16, seq_len=4096, suggest=False)
    f8 = recommend("llama3-8b", 8, fp8=True, **kw)
    assert recommend("llama3-8b", 8, **kw).prediction.time_breakdown.fp8_cast_s is None
    m = ModelDims.from_spec(load_preset("llama3-8b"), 4096)
    q_f, q_b = fp8_cast_time(m, _lay(mbs=1), _hw(fp8=True), "parplan", 2)
    want = 2 * 32 * (q_f + q_b + (q_f if recompute == "full" else 0.0))  # 2 micro-batches of 32 blocks
    got = f8.prediction.time_breakdown.fp8_cast_s
    assert got == pytest.approx(float(want), rel=1e-9)
    assert 0 < got < f8.prediction.time_breakdown.compute_s
    path = tmp_path / "plan.json"
    path.write_text(f8.model_dump_json())
    assert main(["explain", str(path)]) == 0
    assert "of which FP8 casts" in capsys.readouterr().out


def test_the_host_probe_has_an_fp8_mode():
    """calibrate's host-dispatch probe with FP8 linears: the same tiny llama, its sizes what the FP8 GEMM takes."""
    from parallel_layers.fp8 import gemm_dims_problem
    from planner import calibrate as cal
    from planner.launch import fp8_gemm_dims
    for device, precision in (("cuda", "master-weights"), ("cpu", "amp")):
        plan = cal._host_probe_plan(2, "full", device, fp8=True)
        assert plan.training.fp8 and plan.training.framework == "parplan" and plan.training.precision == precision
        assert gemm_dims_problem(fp8_gemm_dims(plan)) is None
    assert not cal._host_probe_plan(2, "none", "cuda").training.fp8


def _host_only(cal, base, tmp_path, name):
    import io
    from rich.console import Console
    return cal.calibrate_host(out=str(tmp_path / name), base=base, device="cpu", console=Console(file=io.StringIO()))


def test_calibrate_writes_the_fp8_host_dispatch_and_drops_another_hosts(tmp_path, monkeypatch):
    """Where FP8 is measurable, --host-only probes FP8 blocks too (host_block_fp8_s, none and full); a base's value
    from another host is dropped, with a note, where it is not measured again; a failing FP8 probe is a note."""
    import planner.calibrate as cal
    calls = []

    def fake(device_type, steps=12, advance=None, modes=cal.HOST_MODES, fp8=False, **kw):
        calls.append((tuple(modes), fp8))
        return {m: (3e-3 if fp8 else 1e-3) for m in modes}
    monkeypatch.setattr(cal, "measure_host_block", fake)
    monkeypatch.setattr(cal, "fp8_measurable", lambda *a: True)
    path, prof, _ = _host_only(cal, "h100-sxm-80gb", tmp_path, "a.toml")
    assert (cal.HOST_FP8_MODES, True) in calls and prof.host_block_fp8_s == {"none": 3e-3, "full": 3e-3}
    assert any("with FP8 linears: none 3.00 ms, full 3.00 ms" in s for s in prof.sources)
    monkeypatch.setattr(cal, "fp8_measurable", lambda *a: False)
    _, again, _ = _host_only(cal, str(path), tmp_path, "b.toml")
    assert again.host_block_fp8_s == {} and any("host_block_fp8_s dropped" in s for s in again.sources)

    def failing(device_type, steps=12, advance=None, modes=cal.HOST_MODES, fp8=False, **kw):
        if fp8:
            raise cal.CalibrationError("host-dispatch probe (none, 2 blocks) failed: no FP8 GEMM")
        return {m: 1e-3 for m in modes}
    monkeypatch.setattr(cal, "measure_host_block", failing)
    monkeypatch.setattr(cal, "fp8_measurable", lambda *a: True)
    _, failed, _ = _host_only(cal, "h100-sxm-80gb", tmp_path, "c.toml")
    assert failed.host_block_fp8_s == {} and any("FP8 linears not measured" in s for s in failed.sources)


def test_only_parplans_fp8_blocks_take_the_fp8_host_dispatch():
    from cost_models.compute import block_time
    from cost_models.hardware import constants_from_profile
    from cost_models.layout import ModelDims
    from planner.models import load_preset
    from tests.test_cost_model import _lay
    import hardware_profiles
    prof = hardware_profiles.load_profile("h100-sxm-80gb").model_copy(
        update={"host_block_s": {"none": 1.0, "full": 2.0}, "host_block_fp8_s": {"none": 3.0}})
    hw = constants_from_profile(prof, "bf16", fp8=True)
    m = ModelDims.from_spec(load_preset("tiny-llama-test"), 128)
    host = {fp8: float(block_time(m, _lay(mbs=1), hw, 2, True, fp8=fp8)["host"]) for fp8 in ("", "torchao", "te", "parplan")}
    assert host == {"": 1.0, "torchao": 1.0, "te": 1.0, "parplan": 3.0}
    full = _lay(mbs=1, recompute=2)  # full recompute: not measured with FP8 here, so host_block_s's
    assert float(block_time(m, full, hw, 2, True, fp8="parplan")["host"]) == 2.0


@pytest.mark.multirank
def test_a_pipelined_zero_bubble_fp8_launch_trains_as_its_16bit_twin(tmp_path):
    """`parplan launch` of an FP8 plan on 4 gloo ranks, tp 2 with SP x pp 2 under ZB-V (the weight queue): every
    step's loss within 0.2 % of the same plan's in 16 bits (the 16-bit parameters and fp32 masters the same)."""
    from planner import launch as Lc
    losses = {}
    for fp8 in (False, True):
        plan = tiny_plan(precision="master-weights", tp=2, pp=2, dp=1, sp=True, schedule="zbv", vpp=2)
        plan.training.fp8 = fp8
        path = write_plan(type(plan).model_validate(json.loads(plan.model_dump_json())), tmp_path / f"plan{fp8}.json")
        report = tmp_path / f"run{fp8}" / "report.json"
        assert Lc.launch(path, steps=3, device="cpu", report=str(report)) == 0
        rep = json.loads(report.read_text())
        assert rep["plan"]["training"]["fp8"] is fp8
        losses[fp8] = [s["loss"] for s in rep["steps"]]
    assert losses[True] == pytest.approx(losses[False], rel=2e-3) and losses[True] != losses[False]


def test_the_fp8_output_keeps_the_inputs_dtype_with_an_fp32_bias():
    """Under amp a bias stays fp32 while the input is 16-bit (autocast casts it inside F.linear): the FP8 path adds it
    in the output's dtype, as F.linear's output would be."""
    x = torch.randn(32, 16).bfloat16()
    (y,) = F8.forward(x, [torch.randn(16, 16)], [torch.randn(16)])
    assert y.dtype == torch.bfloat16


def test_a_failed_cast_compile_says_so_once_and_casts_eagerly(monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("no compiler here")
    monkeypatch.setattr(F8, "_cast_compiled", None)
    monkeypatch.setattr(F8, "_cast_failure", None)
    monkeypatch.setattr(torch, "compile", broken)
    t = torch.randn(16, 16)
    assert F8.cast_failure() is None
    with pytest.warns(RuntimeWarning, match="casting eagerly"):
        assert F8._compiled_cast(t, F8.E4M3) is None
    assert F8._cast_compiled is False and F8._compiled_cast(t, F8.E4M3) is None  # not tried again
    assert F8.cast_failure() == "RuntimeError: no compiler here"  # what the run report carries


@pytest.mark.parametrize("mode", ["dynamic", "static", "hybrid"])
def test_each_compiled_cast_mode_makes_the_eager_casts_bytes(mode, monkeypatch):
    """PARPLAN_FP8_CAST's compiling modes (fp8.cast_mode: the next GPU call runs the 1.3B FP8 entry under each, to
    tell which part of the cast is slow there) make the eager cast's FP8 values and scale, here compiled for the
    CPU; a second shape and the other format go through the same compiled function."""
    monkeypatch.setenv(F8.CAST_ENV, mode)
    cfg = torch._dynamo.config
    name = next(n for n in ("recompile_limit", "cache_size_limit") if hasattr(cfg, n))
    before = getattr(cfg, name)
    with cfg.patch({name: before}):  # "static" raises torch's limit (a graph per shape): for this test alone
        fn = F8._make_compiled(F8.cast_mode())
        assert (getattr(cfg, name) >= F8.STATIC_RECOMPILE_LIMIT) == (mode == "static" or before >= F8.STATIC_RECOMPILE_LIMIT)
        _check_cast(fn)
    assert getattr(cfg, name) == before


def _check_cast(fn):
    g = torch.Generator().manual_seed(0)
    for shape, dtype in (((48, 32), F8.E4M3), ((64, 96), F8.E5M2), ((48, 32), F8.E5M2)):
        t = (torch.randn(*shape, generator=g) * 3).bfloat16()
        t8, inv = fn(t, dtype)
        e8, einv = F8._cast_eager(t, dtype)
        assert t8.dtype == dtype and inv.dtype == torch.float32
        torch.testing.assert_close(inv, einv, rtol=1e-6, atol=0)
        torch.testing.assert_close(t8.float(), e8.float(), rtol=0.07, atol=0)  # at most one FP8 step apart
        assert (t8.float() == e8.float()).float().mean() > 0.99


def test_the_cast_mode_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv(F8.CAST_ENV, raising=False)
    assert F8.cast_mode() == "dynamic"
    monkeypatch.setenv(F8.CAST_ENV, " Eager ")
    assert F8.cast_mode() == "eager" and F8._make_compiled("eager") is None
    monkeypatch.setattr(F8, "_cast_compiled", None)
    monkeypatch.setattr(F8, "_cast_failure", None)
    assert F8._compiled_cast(torch.randn(4, 4), F8.E4M3) is None and F8.cast_failure() is None  # chosen, not failed
    monkeypatch.setenv(F8.CAST_ENV, "fast")
    with pytest.raises(ValueError, match="PARPLAN_FP8_CAST='fast': expected one of dynamic, static, hybrid, eager"):
        F8.cast_mode()


def test_the_run_report_says_how_the_fp8_casts_ran(monkeypatch):
    """The report's fp8_casts (null for a 16-bit plan), and on a GPU whose compile failed a note in the report,
    which `parplan launch` prints, not only a warning in the rank's log."""
    from parallel_layers import train
    steps = [{"step": 1, "loss": 1.0, "step_time_s": 1.0, "tokens_per_s": 1.0, "mfu": None}]
    mem = [{"allocated": None, "reserved": None}]
    plan = tiny_plan(precision="amp")
    report = lambda p, dev, why=None: train.build_report(  # noqa: E731
        p, train.RunOptions(steps=1), torch.device(dev), steps, mem, [1], comparable=False, fp8_cast_failure=why)
    assert report(plan, "cpu")["fp8_casts"] is None
    plan.training.fp8 = True
    assert report(plan, "cpu")["fp8_casts"] == "eager (cpu)"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H200")
    ok = report(plan, "cuda")
    assert ok["fp8_casts"] == "compiled" and not any("FP8" in n for n in ok["notes"])
    bad = report(plan, "cuda", "RuntimeError: no compiler here")
    assert bad["fp8_casts"] == "eager (torch.compile failed: RuntimeError: no compiler here)"
    assert any(n.startswith("the FP8 casts ran eagerly on rank 0") and "no compiler here" in n for n in bad["notes"])
    from planner.launch import fp8_line
    assert fp8_line(ok).endswith("casts compiled") and fp8_line(report(plan, "cpu")).endswith("casts eager (cpu)")
    assert fp8_line({"fp8_casts": None}) is None and fp8_line({}) is None
    monkeypatch.setenv(F8.CAST_ENV, "static")
    assert report(plan, "cuda")["fp8_casts"] == "compiled with static shapes (PARPLAN_FP8_CAST=static)"


@pytest.mark.parametrize("queued", [False, True], ids=["backward", "zero-bubble-queue"])
def test_each_output_gradient_is_cast_once(queued, monkeypatch):
    """The backward casts a linear's output gradient to E5M2 once for its two GEMMs (as fp8_cast_time's parplan
    scheme counts), also where the weight gradient waits in the zero-bubble queue (which then holds the FP8 copy)."""
    casts = []
    real = F8.cast

    def counting(t, dtype):
        casts.append(dtype)
        return real(t, dtype)
    monkeypatch.setattr(F8, "cast", counting)
    m = _fp8_backward(queued)
    linears = sum(isinstance(s, (L.ColumnParallelLinear, L.RowParallelLinear)) for b in m.blocks for s in b.modules())
    assert casts.count(F8.E5M2) == linears
    # E4M3: every weight twice (forward, input gradient) and each block's four linear inputs (attention's, shared by
    # q/k/v; the projection's; the MLP's, shared by gate/up; down's) twice (forward, weight gradient): the review of
    # 2026-12-05 found the backward casting a shared input once per weight (3 + 2 casts where the model counts 2)
    assert casts.count(F8.E4M3) == 2 * linears + 2 * 4 * len(m.blocks), (casts.count(F8.E4M3), linears)


def test_the_queue_holds_fp8_output_gradients_in_the_memory_model():
    """The zero-bubble queue's held bytes a block: the linears' 16-bit inputs and, under parplan's FP8 linears, their
    output gradients' 1-byte copies (the runtime's cast_grads), half what a 16-bit plan holds for them."""
    from cost_models.layout import ModelDims
    from cost_models.memory import queued_w_bytes_per_layer
    from planner.models import load_preset
    from tests.test_cost_model import _lay
    m = ModelDims.from_spec(load_preset("llama3-8b"), 4096)
    lay = _lay(gpus=2, tp=2, dp=1, mbs=1)
    grads = 4096 * ((m.q_width + 2 * m.kv_width + 2 * m.ffn) / 2 + 2 * m.hidden)
    assert queued_w_bytes_per_layer(m, lay, 2) - queued_w_bytes_per_layer(m, lay, 2, "parplan") == grads
    assert queued_w_bytes_per_layer(m, lay, 2, "torchao") == queued_w_bytes_per_layer(m, lay, 2)


def test_the_fp8_operations_benchmark_runs_each_operation(tmp_path):
    """benchmarks/fp8_ops.py (for the next GPU call: why the FP8 runs of 2026-12-06 were slow) at its CPU shapes: a
    row for every operation, in order, timed, each cast's row with its operand's read rate."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("fp8_ops", Path(__file__).resolve().parents[1] / "benchmarks" / "fp8_ops.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    seen = []
    rows = mod.measure("cpu", mod.CPU_SHAPES, repeats=1, warmup=1, on_row=lambda r: seen.append(len(r)))
    assert seen == list(range(1, len(rows) + 1)) and len(rows) == 4 * 3 + 9 + 5 * 4
    assert all(r["gpu_ms"] > 0 and r["host_ms"] > 0 for r in rows)
    assert all("read_gbytes_per_s" in r for r in rows if r["op"].startswith(("amax", "cast")))
    assert "| cast parplan (fp8.cast): x (tokens, hidden) |" in mod.markdown(rows, "cpu", mod.CPU_SHAPES)
