"""One-rank checks (in-process gloo group of one) of optimizer offload and the master-weights
recipes: offload is the same math as the device optimizer, master-weights runs keep 16-bit
parameters with fp32 masters and track the fp32 run within bf16 tolerance, and both resume
from a checkpoint exactly.  The 8-rank layout suite (test_runtime_multirank) adds ZeRO-1 +
offload and a master-weights ZeRO-2 + SP + tied-embedding layout."""
from __future__ import annotations

import pytest
import torch

from parallel_layers import precision as precision_module
from parallel_layers import train
from parallel_layers.data import TokenSource, replica_sample_indices
from parallel_layers.data_parallel import ShardedAdamW
from parallel_layers.precision import MasterAdamW, grad_of
from tests.runtime_helpers.plans import TINY_GPT, tiny_plan

CPU = torch.device("cpu")
# bf16 parameters round each update to 8 significant bits: over 3 steps the tiny model's losses stay
# within 1.3e-4 relative of the fp32 run's and its loss changes from step 1 within 1.8 % (measured, every
# recipe and ZeRO stage here).  Training moves the loss by under 1 % in 3 steps, so the losses alone
# cannot tell a run whose masters are never stepped: frozen parameters (lr 1e-9) read 5.4e-3 and 70 %.
BF16_TRACK_RTOL = 1e-3
BF16_CHANGE_RTOL = 0.1


def assert_tracks(got: list[float], ref: list[float]) -> None:
    """A 16-bit run follows the fp32 run: its losses, and how far each step moved them."""
    assert got == pytest.approx(ref, rel=BF16_TRACK_RTOL)
    assert [g - got[0] for g in got[1:]] == pytest.approx([r - ref[0] for r in ref[1:]], rel=BF16_CHANGE_RTOL)


pytestmark = pytest.mark.usefixtures("group_of_one")  # tests/conftest.py


def losses(plan, steps=3, **opts) -> list[float]:
    rep = train.run(plan, train.RunOptions(steps=steps, device="cpu", **opts))
    return [s["loss"] for s in rep["steps"]]


def one_step(plan):
    """A runtime after one training step (the gradients of that step still attached)."""
    rt = train.build_runtime(plan, train.RunOptions(steps=1), CPU)
    tr = plan.training
    data = TokenSource(plan.model.vocab, tr.seq_len, tr.seed)
    x, y = data.batch(1, replica_sample_indices(0, tr.micro_batch_size, tr.num_microbatches))
    rt.optimizer.zero_grad()
    train.forward_backward(rt, x, y)
    train.reduce_gradients(rt, train.RunOptions(steps=1))
    rt.optimizer.step()
    return rt


def inner(optimizer) -> MasterAdamW:
    return optimizer.optim if isinstance(optimizer, ShardedAdamW) else optimizer


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_offload_matches_the_device_optimizer_loss_by_loss(zero):
    ref = losses(tiny_plan(zero_stage=zero))
    got = losses(tiny_plan(zero_stage=zero, offload="optimizer"))
    assert got == pytest.approx(ref, rel=1e-6)


def test_offloaded_states_live_in_host_copies_that_the_step_writes_back():
    rt = one_step(tiny_plan(zero_stage=1, offload="optimizer"))
    opt = inner(rt.optimizer)
    assert isinstance(opt, MasterAdamW) and opt.offload and not opt.keep_master
    assert opt.master_device.type == "cpu"
    for p, m in zip(opt.params, opt.masters):
        assert m.data_ptr() != p.data_ptr() and m.dtype == torch.float32  # a copy, not the parameter
        st = opt.optim.state[m]
        assert st["exp_avg"].device.type == "cpu" and st["exp_avg_sq"].shape == p.shape
        assert torch.equal(p.detach(), m)  # the stepped host copy went back into the parameter
    assert all(p.grad is not None for p in opt.params)


@pytest.mark.parametrize("precision", ["master-weights", "master-weights-half-grads"])
@pytest.mark.parametrize("zero", [0, 1])
def test_master_weights_track_the_fp32_run(precision, zero):
    ref = losses(tiny_plan(zero_stage=zero))
    got = losses(tiny_plan(zero_stage=zero, precision=precision))
    assert_tracks(got, ref)
    assert got != ref  # bf16 parameters: not the fp32 computation


@pytest.mark.parametrize("precision, grad_dtype", [("master-weights", torch.float32),
                                                   ("master-weights-half-grads", torch.bfloat16)])
@pytest.mark.parametrize("offload", ["none", "optimizer"])
def test_master_weights_keep_bf16_parameters_and_fp32_masters(precision, grad_dtype, offload):
    rt = one_step(tiny_plan(zero_stage=1, precision=precision, offload=offload))
    opt = inner(rt.optimizer)
    assert isinstance(opt, MasterAdamW) and opt.keep_master and opt.offload == (offload == "optimizer")
    params = train._unique_params(rt.stage_modules)
    assert {p.dtype for p in params} == {torch.bfloat16}
    assert {m.dtype for m in opt.masters} == {torch.float32}
    assert {st["exp_avg"].dtype for st in opt.optim.state.values()} == {torch.float32}
    assert all(opt.optim.state[m]["exp_avg"].shape == m.shape for m in opt.masters)
    for p, m in zip(opt.params, opt.masters):
        assert torch.equal(p.detach(), m.to(torch.bfloat16))  # the parameter is the rounded master
    assert not torch.equal(torch.cat([m.flatten() for m in opt.masters]),
                           torch.cat([p.detach().float().flatten() for p in opt.params]))  # masters keep fp32 bits
    assert {grad_of(p).dtype for p in params} == {grad_dtype}
    if precision == "master-weights":
        assert all(p.grad is None for p in params)  # freed into main_grad by the hook


def test_fsdp2_master_weights_use_a_mixed_precision_policy_over_fp32_shards():
    plan = tiny_plan(zero_stage=3, precision="master-weights")
    rt = one_step(plan)
    assert isinstance(rt.optimizer, torch.optim.AdamW)
    assert {p.dtype for p in train._unique_params(rt.stage_modules)} == {torch.float32}
    assert rt.stage_modules[0]._get_fsdp_state()._mp_policy.param_dtype == torch.bfloat16
    assert_tracks(losses(plan), losses(tiny_plan(zero_stage=3)))


def test_fsdp2_offload_keeps_shards_and_states_on_the_host():
    """ZeRO-3 + offload is FSDP2's CPUOffloadPolicy: a plain AdamW over the fp32 sharded
    parameters, which (with their gradients and states) live on the host."""
    rt = one_step(tiny_plan(zero_stage=3, offload="optimizer", precision="master-weights"))
    assert isinstance(rt.optimizer, torch.optim.AdamW)
    state = rt.stage_modules[0]._get_fsdp_state()
    assert type(state._fsdp_param_group.offload_policy).__name__ == "CPUOffloadPolicy"
    assert state._mp_policy.param_dtype == torch.bfloat16
    for p in train._unique_params(rt.stage_modules):
        assert p.dtype == torch.float32 and p.grad is not None
        assert rt.optimizer.state[p]["exp_avg"].dtype == torch.float32


@pytest.mark.parametrize("kw", [dict(zero_stage=1, offload="optimizer"),
                                dict(zero_stage=3, offload="optimizer"),
                                dict(zero_stage=2, offload="optimizer", precision="master-weights"),
                                dict(zero_stage=0, precision="master-weights-half-grads")],
                         ids=["zero1-offload", "zero3-offload", "zero2-offload-master", "zero0-half-grads"])
def test_stop_and_resume_continues_exactly(tmp_path, kw):
    plan = tiny_plan(TINY_GPT, **kw)
    straight = losses(plan)
    ck = str(tmp_path / "ckpt")
    first = losses(plan, steps=2, checkpoint_dir=ck, checkpoint_every=2)
    rep = train.run(plan, train.RunOptions(steps=3, device="cpu", checkpoint_dir=ck, resume=True))
    assert [s["step"] for s in rep["steps"]] == [3]
    assert first == pytest.approx(straight[:2], rel=1e-7)
    assert rep["steps"][0]["loss"] == pytest.approx(straight[2], rel=1e-7)


@pytest.mark.parametrize("precision", ["master-weights", "master-weights-half-grads"])
def test_fp16_master_weights_train_with_a_loss_scale_and_track_fp32(precision):
    """fp16 parameters (fp32 masters) under the dynamic loss scale (parallel_layers.loss_scale): the run follows the
    fp32 run at the 16-bit tolerances and keeps torch's starting scale (nothing overflows in 3 steps)."""
    plan = tiny_plan(TINY_GPT, precision=precision, dtype="fp16", clip_grad=1.0)
    rep = train.run(plan, train.RunOptions(steps=3, device="cpu"))
    assert rep["loss_scaling"] == {"first": 65536.0, "last": 65536.0, "skipped_steps": []}
    assert all(p.dtype == torch.float16 for m in one_step(plan).stage_modules for p in m.parameters())
    assert_tracks([s["loss"] for s in rep["steps"]], losses(tiny_plan(TINY_GPT, clip_grad=1.0)))
    assert "fp16 parameters with fp32 masters" in rep["notes"][0] and "dynamic loss scaling" in rep["notes"][0]


def test_the_loss_scale_is_exact_where_nothing_overflows():
    """amp computes in fp32 on the CPU, so an fp16 amp run differs from the bf16 one by the scale alone: a power of
    two, multiplied into the loss and out of the gradients, changes no bit (a scale not divided out would move every
    update's size under clipping, and the losses with it)."""
    bf16 = [s["loss"] for s in train.run(tiny_plan(precision="amp", clip_grad=1.0),
                                         train.RunOptions(steps=3, device="cpu"))["steps"]]
    for start in (2.0 ** 16, 2.0 ** 40):
        rep = train.run(tiny_plan(precision="amp", dtype="fp16", clip_grad=1.0),
                        train.RunOptions(steps=3, device="cpu", initial_loss_scale=start))
        assert [s["loss"] for s in rep["steps"]] == bf16 and rep["loss_scaling"]["skipped_steps"] == []


def test_an_overflowed_step_changes_nothing_but_the_scale(tmp_path):
    """A step whose gradients hold an inf is skipped: the parameters and AdamW's states after it are those before it
    (the checkpoints after steps 1 and 2 hold the same tensors), the scale is halved, and the step's time is left out of
    the medians; a resume takes the halved scale from the checkpoint."""
    from torch.distributed.checkpoint import FileSystemReader, load
    from parallel_layers import checkpoint as ckpt
    plan = tiny_plan(precision="master-weights", dtype="fp16", clip_grad=1.0)
    ck = str(tmp_path / "ck")
    rep = train.run(plan, train.RunOptions(steps=3, device="cpu", checkpoint_dir=ck, checkpoint_every=1,
                                           debug_overflow_step=2, warmup_steps=0))
    assert [s["skipped"] for s in rep["steps"]] == [False, True, False]
    assert rep["steps"][1]["grad_norm"] is None and rep["loss_scaling"]["last"] == 32768.0
    assert rep["median"]["step_time_s"] == pytest.approx((rep["steps"][0]["step_time_s"] + rep["steps"][2]["step_time_s"]) / 2)
    assert any("skipped for inf/nan fp16 gradients" in n for n in rep["notes"])

    def saved(step):
        meta = FileSystemReader(ckpt.step_path(ck, step)).read_metadata().state_dict_metadata
        sd = {k: torch.empty(m.size, dtype=m.properties.dtype) if hasattr(m, "size") else None
              for k, m in meta.items() if hasattr(m, "size")}
        load(sd, checkpoint_id=ckpt.step_path(ck, step))
        return sd
    one, two, three = saved(1), saved(2), saved(3)
    weights = [k for k in one if k.startswith(("model.", "optim."))]
    assert weights and all(torch.equal(one[k], two[k]) for k in weights)
    assert not all(torch.equal(two[k], three[k]) for k in weights)
    assert (float(one["meta.loss_scale"]), float(two["meta.loss_scale"])) == (65536.0, 32768.0)
    resumed = train.run(plan, train.RunOptions(steps=3, device="cpu", checkpoint_dir=ck, resume=True, resume_step=2))
    assert resumed["loss_scaling"]["first"] == 32768.0
    assert resumed["steps"][0]["loss"] == rep["steps"][2]["loss"]


@pytest.mark.parametrize("first,then", [(3, 0), (0, 3), (3, 1)], ids=["fsdp2-to-zero0", "zero0-to-fsdp2", "fsdp2-to-zero1"])
def test_master_weights_checkpoint_resumes_across_fsdp2_and_zero(tmp_path, first, then):
    """FSDP2 keeps its fp32 masters as the parameters, ZeRO 0-2 beside 16-bit ones ({key}/master): each resumes the
    other's checkpoint from the fp32 values (it had failed on the missing master keys one way, and loaded the
    16-bit copies into the fp32 shards the other)."""
    kw = dict(precision="master-weights")
    a = tiny_plan(TINY_GPT, zero_stage=first, **kw)
    b = tiny_plan(TINY_GPT, zero_stage=then, **kw)
    ck = str(tmp_path / "ckpt")
    losses(a, steps=2, checkpoint_dir=ck, checkpoint_every=2)
    straight = losses(a, steps=3)
    rep = train.run(b, train.RunOptions(steps=3, device="cpu", checkpoint_dir=ck, resume=True))
    assert rep["steps"][0]["loss"] == pytest.approx(straight[2], rel=1e-4)
    if then == 3:  # FSDP2's fp32 parameters are the ZeRO-0 run's saved masters, bit for bit
        from parallel_layers import checkpoint
        path = checkpoint.latest(ck, 2)
        zero = train.build_runtime(a, train.RunOptions(steps=3), CPU)
        checkpoint.load(path, zero.stage_modules, zero.optimizer)
        fsdp = train.build_runtime(b, train.RunOptions(steps=3), CPU)
        checkpoint.load(path, fsdp.stage_modules, fsdp.optimizer)
        master_of = dict(zip(map(id, zero.optimizer.params), zero.optimizer.masters))
        want = {k: master_of[id(v)] for k, v in checkpoint.keyed_parameters(zero.stage_modules).items()}
        got = checkpoint.keyed_parameters(fsdp.stage_modules)
        for k, v in got.items():
            assert torch.equal(v.to_local() if hasattr(v, "to_local") else v, want[k]), k



def linear_weights(rt) -> set[int]:
    from parallel_layers.layers import ColumnParallelLinear, RowParallelLinear
    return {id(m.weight) for sm in rt.stage_modules for m in sm.modules()
            if isinstance(m, (ColumnParallelLinear, RowParallelLinear))}


def main_grads_after_backward(plan, mode: str, monkeypatch):
    """(runtime, {name: main_grad}, how many 16-bit gradients of linear weights the main_grad hook upcast)
    after one step's forward and backward with wgrad_fusion ``mode``."""
    upcast = []
    hook = precision_module.accumulate_main_grad

    def counting(p):
        upcast.append(id(p) if p.grad is not None else None)
        hook(p)
    monkeypatch.setattr(precision_module, "accumulate_main_grad", counting)
    rt = train.build_runtime(plan, train.RunOptions(steps=1, wgrad_fusion=mode), CPU)
    tr = plan.training
    data = TokenSource(plan.model.vocab, tr.seq_len, tr.seed)
    x, y = data.batch(1, replica_sample_indices(0, tr.micro_batch_size, tr.num_microbatches))
    rt.optimizer.zero_grad()
    train.forward_backward(rt, x, y)
    named = {n: p for m in rt.stage_modules for n, p in m.named_parameters()}
    linears = linear_weights(rt)
    return rt, {n: p.main_grad.clone() for n, p in named.items()}, sum(i in linears for i in upcast)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_fused_weight_gradient_accumulation_matches_the_upcast_pass(recompute, monkeypatch):
    """Gradient-accumulation fusion (precision.wgrad_fusion_kernel; Megatron's --gradient-accumulation-fusion):
    each linear's dW of the bf16 operands is added into the fp32 main_grad by the GEMM, over 8 micro-batches
    (the first makes main_grad, the others add), and the hook upcasts no 16-bit dW of a linear.  The reference
    kernel runs that arithmetic on the CPU.  Against the hook's upcast of a bf16 dW: equal within bf16
    rounding (measured 5.5e-3 of a tensor's max on the tiny llama); a kernel left uncalled (zero weight
    gradients) or a dW counted twice (kernel and hook) reads 1.0."""
    plan = tiny_plan(precision="master-weights", recompute=recompute)
    rt_off, off, upcast_off = main_grads_after_backward(plan, "off", monkeypatch)
    rt_on, on, upcast_on = main_grads_after_backward(plan, "reference", monkeypatch)
    assert rt_off.extra["wgrad_fusion"] is False and rt_on.extra["wgrad_fusion"] is True
    n_linear = len(linear_weights(rt_on))
    assert n_linear == 7 * plan.model.layers + 1  # q, k, v, o, gate, up, down per block and the head
    assert upcast_off == n_linear * plan.training.num_microbatches and upcast_on == 0
    for n, g in off.items():
        assert (on[n] - g).abs().max() <= 2e-2 * g.abs().max(), n


def test_fused_weight_gradients_train_like_the_upcast_pass_and_say_so():
    plan = tiny_plan(precision="master-weights")
    rep_on = train.run(plan, train.RunOptions(steps=3, device="cpu", wgrad_fusion="reference"))
    rep_off = train.run(plan, train.RunOptions(steps=3, device="cpu", wgrad_fusion="off"))
    assert rep_on["wgrad_fusion"] is True and rep_off["wgrad_fusion"] is False
    assert [s["loss"] for s in rep_on["steps"]] == pytest.approx([s["loss"] for s in rep_off["steps"]],
                                                                  rel=BF16_TRACK_RTOL)
    # this plan's prediction counted no fusion (Training's default; recommend's parplan default is on): the
    # fused run's report says it differs
    assert not plan.training.grad_accumulation_fusion
    assert any("did fuse" in n for n in rep_on["notes"]) and not any("fuse" in n for n in rep_off["notes"])


def test_wgrad_fusion_is_off_where_the_runtime_cannot_fuse():
    """auto on a CPU (no fp32-output GEMM of bf16 operands); any mode under torch's own zero-bubble weight pass
    (FSDP2 with a zero-bubble pipeline: it assigns autograd's dW to p.grad; the queued pass below ZeRO-3 fuses)
    or without a main_grad (fp32 recipe)."""
    assert precision_module.wgrad_fusion_kernel(CPU, "auto") is None
    zb = tiny_plan(precision="master-weights", tp=1, pp=2, dp=1, schedule="zbv", vpp=2)
    assert train.wgrad_fusion_mode(zb, train.RunOptions(steps=1, wgrad_fusion="reference")) == "reference"
    zb3 = tiny_plan(precision="master-weights", tp=1, pp=2, dp=2, schedule="zbv", vpp=2, zero_stage=3)
    assert train.wgrad_fusion_mode(zb3, train.RunOptions(steps=1, wgrad_fusion="reference")) == "off"
    rt = train.build_runtime(tiny_plan(), train.RunOptions(steps=1, wgrad_fusion="reference"), CPU)
    assert "wgrad_fusion" not in rt.extra
    assert not any(hasattr(p, "fused_wgrad") for p in train._unique_params(rt.stage_modules))
    # master-weights over fp32 parameters (dtype fp32): nothing 16-bit to fuse, and the report must not say it did
    fp32 = tiny_plan(precision="master-weights")
    fp32.training.dtype = "fp32"
    rt = train.build_runtime(fp32, train.RunOptions(steps=1, wgrad_fusion="reference"), CPU)
    assert rt.extra["wgrad_fusion"] is False
    assert not any(hasattr(p, "fused_wgrad") for p in train._unique_params(rt.stage_modules))


@pytest.mark.parametrize("kw", [dict(zero_stage=3, offload="optimizer"), dict(zero_stage=2, offload="optimizer"),
                                dict(zero_stage=1, precision="master-weights-half-grads")],
                         ids=["fsdp2-offload", "zero2-offload", "zero1-half-grads"])
def test_an_fp16_overflow_is_skipped_wherever_the_gradients_live(kw):
    """FSDP2's shards (on the host with offload), ZeRO-2's reduced pieces and 16-bit gradients are all checked and
    unscaled: the skipped step and the run after it follow the ZeRO-0 run with the same overflow."""
    opts = dict(steps=3, device="cpu", debug_overflow_step=2)
    ref = train.run(tiny_plan(TINY_GPT, precision="master-weights", dtype="fp16", clip_grad=1.0), train.RunOptions(**opts))
    kw = {"precision": "master-weights", **kw}
    rep = train.run(tiny_plan(TINY_GPT, dtype="fp16", clip_grad=1.0, **kw), train.RunOptions(**opts))
    assert rep["loss_scaling"] == ref["loss_scaling"] == {"first": 65536.0, "last": 32768.0, "skipped_steps": [2]}
    assert_tracks([s["loss"] for s in rep["steps"]], [s["loss"] for s in ref["steps"]])
