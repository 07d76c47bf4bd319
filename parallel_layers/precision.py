"""Master-weights recipes and optimizer offload: an AdamW over fp32 copies of the parameters.

``master-weights`` (Megatron): the model's parameters are 16-bit (``training.dtype``), every
parameter carries an fp32 ``main_grad`` buffer that a post-accumulate-grad hook fills with
``p.grad.float()`` (freeing ``p.grad``), the data-parallel reduction averages the fp32
buffers, and ``MasterAdamW`` steps an fp32 master copy and copies it back into the 16-bit
parameter.  ``master-weights-half-grads`` (ZeRO paper / DeepSpeed fp16): the same without the
hook: gradients stay 16-bit in ``p.grad`` through the reduction and are upcast for the step.
With ZeRO-1/2 the master copies exist only for the parameters (or row slices) a dp rank owns
(``ShardedAdamW`` builds one ``MasterAdamW`` over its own pieces).  FSDP2 (ZeRO-3) instead keeps fp32
sharded parameters and computes in 16 bit through ``MixedPrecisionPolicy`` (see
``fsdp_mixed_precision``).

``offload == "optimizer"``: the same class with the fp32 copies, AdamW states and the step on
the host (pinned when the device is cuda): gradients are copied to the host after the
reduction, the step runs on the CPU (fused CPU AdamW), the updated values go back to the
device.  With fp32 parameters (recipes amp and fp32) the host copy is a mirror of the
parameter; with a master-weights recipe it is the master.  On a CPU device the "host" is the
device, so the path is the same copies.
"""
from __future__ import annotations

from typing import Optional

import torch

from parallel_layers.cpu_matmul import wanted as fp32_matmuls_wanted

MASTER_RECIPES = ("master-weights", "master-weights-half-grads")


def uses_master_weights(plan) -> bool:
    return plan.training.precision in MASTER_RECIPES


def cpu_math(plan) -> str:
    """What a CPU run of the plan computes in (the run report's and launch's device line)."""
    dtype = plan.training.dtype
    if uses_master_weights(plan) and dtype in ("bf16", "fp16"):
        fp32 = f", matmuls and attention in fp32 (no native {dtype} GEMM on this CPU)" if fp32_matmuls_wanted(
            torch.device("cpu"), param_dtype(plan)) else ""
        scaled = ", dynamic loss scaling" if dtype == "fp16" else ""
        return f"{dtype} parameters with fp32 masters ({plan.training.precision}){scaled}, no autocast{fp32}"
    return "fp32 math, no autocast"


def param_dtype(plan) -> torch.dtype:
    """Dtype of the model's parameters (outside FSDP2): 16-bit for the master-weights recipes."""
    if not uses_master_weights(plan):
        return torch.float32
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(plan.training.dtype, torch.float32)


def fsdp_mixed_precision(plan):
    """FSDP2's equivalent of the master-weights recipes: fp32 sharded parameters (the master),
    16-bit all-gathered compute copies, gradients reduced in fp32 (or 16 bit for -half-grads)."""
    if not uses_master_weights(plan):
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    compute = param_dtype(plan)
    reduce = torch.float32 if plan.training.precision == "master-weights" else compute
    return MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=reduce)


def grad_of(p: torch.Tensor) -> Optional[torch.Tensor]:
    """The gradient the reductions and the optimizer use: the fp32 main_grad when the parameter
    has one (recipe master-weights), else ``p.grad``."""
    return p.main_grad if hasattr(p, "main_grad") else p.grad


def set_grad(p: torch.Tensor, g: Optional[torch.Tensor]) -> None:
    if hasattr(p, "main_grad"):
        p.main_grad = g
    else:
        p.grad = g


def clear_grads(params) -> None:
    for p in params:
        p.grad = None
        if hasattr(p, "main_grad"):
            p.main_grad = None


def register_weight_pass_hook(p: torch.Tensor, fn) -> None:
    """fn(p) runs after a queued zero-bubble weight pass (layers.WeightGradStore) has added p's gradient, as a
    post-accumulate-grad hook runs after autograd's accumulation: that pass accumulates outside autograd, so
    autograd's hooks do not run there."""
    if "weight_pass_hooks" not in p.__dict__:
        p.weight_pass_hooks = []
    p.weight_pass_hooks.append(fn)


def run_weight_pass_hooks(p: torch.Tensor) -> None:
    for fn in p.__dict__.get("weight_pass_hooks", ()):
        fn(p)


def accumulate_main_grad(p: torch.Tensor) -> None:
    if p.grad is None:  # a fused weight-gradient GEMM added into main_grad; autograd ran the hook with nothing
        return
    if p.main_grad is None:
        p.main_grad = p.grad.float() if p.grad.dtype != torch.float32 else p.grad
    else:
        p.main_grad.add_(p.grad)  # upcasts the 16-bit gradient into the fp32 buffer
    p.grad = None


def attach_main_grads(params, wgrad_kernel=None) -> bool:
    """Recipe master-weights: accumulate each backward's gradient into an fp32 ``main_grad``.

    wgrad_kernel (``wgrad_fusion_kernel``): the linear layers' weight-gradient GEMMs accumulate into
    ``main_grad`` themselves (``fused_wgrad``, read by ``parallel_layers.layers``), so those weights get no
    16-bit ``p.grad`` and no upcast pass; the hook still serves every other gradient (embedding lookups,
    norms, biases).  Only 16-bit parameters take the kernel.  Returns whether any did."""
    fused = False
    for p in params:
        p.main_grad = None
        p.register_post_accumulate_grad_hook(accumulate_main_grad)
        register_weight_pass_hook(p, accumulate_main_grad)  # the queued weight pass runs it as autograd would
        if wgrad_kernel is not None and p.dtype != torch.float32:
            p.fused_wgrad = wgrad_kernel
            fused = True
    return fused


# Gradient-accumulation fusion (Megatron-LM's --gradient-accumulation-fusion, its
# fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32): the weight gradient dW = dY^T X of 16-bit operands
# is made by one GEMM that adds into the fp32 main_grad (beta = 1), instead of a 16-bit dW that a second pass
# upcasts and adds (read 2 + 4, write 4 bytes per parameter and micro-batch: cost_models.compute.
# grad_accumulation_time).  torch >= 2.8 has that GEMM on CUDA: mm/addmm with out_dtype=float32 for
# bf16/fp16 inputs (pytorch/pytorch#150812).

def _wgrad_accumulate_cuda(p, dy: torch.Tensor, x: torch.Tensor) -> None:
    """main_grad (+)= dy^T x, fp32 accumulation and output from 16-bit operands, in one cuBLAS GEMM."""
    if p.main_grad is None:
        p.main_grad = torch.mm(dy.t(), x, out_dtype=torch.float32)
    else:
        torch.addmm(p.main_grad, dy.t(), x, out_dtype=torch.float32, out=p.main_grad)


def _wgrad_accumulate_reference(p, dy: torch.Tensor, x: torch.Tensor) -> None:
    """The same arithmetic for devices without the mixed-dtype GEMM (tests on CPU): the fp32 product of the
    16-bit operands, added into main_grad.  It upcasts both operands, so it saves no memory traffic."""
    prod = dy.t().float() @ x.float()
    if p.main_grad is None:
        p.main_grad = prod
    else:
        p.main_grad.add_(prod)


def _cuda_kernel_works(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether this torch and GPU run ``_wgrad_accumulate_cuda`` right on operands of the parameters' dtype: twice
    over a small product, compared with the fp32 reference (an older torch raises on out_dtype, and fp16 operands
    are probed apart from bf16 ones; any failure means no fusion)."""
    try:
        g = torch.Generator(device=device).manual_seed(0)
        dy = torch.randn(64, 48, device=device, generator=g).to(dtype)
        x = torch.randn(64, 32, device=device, generator=g).to(dtype)

        class _P:
            main_grad = None
        p = _P()
        _wgrad_accumulate_cuda(p, dy, x)
        _wgrad_accumulate_cuda(p, dy, x)
        want = 2 * (dy.t().float() @ x.float())
        return (p.main_grad.dtype == torch.float32 and p.main_grad.shape == want.shape
                and bool(torch.allclose(p.main_grad, want, rtol=1e-3, atol=1e-3)))
    except (RuntimeError, TypeError):
        return False


WGRAD_FUSION_MODES = ("auto", "off", "reference")


def wgrad_fusion_kernel(device: torch.device, mode: str = "auto", dtype: torch.dtype = torch.bfloat16):
    """The weight-gradient accumulation kernel the linears use, or None (the hook's separate upcast pass).
    auto: the CUDA GEMM where this torch and GPU run it right on `dtype` operands (the parameters'), else None;
    reference: the upcasting reference on any device (tests of the plumbing on CPU); off: None."""
    if mode not in WGRAD_FUSION_MODES:
        raise ValueError(f"wgrad fusion mode {mode!r}; one of {', '.join(WGRAD_FUSION_MODES)}")
    if mode == "reference":
        return _wgrad_accumulate_reference
    if mode == "auto" and device.type == "cuda" and _cuda_kernel_works(device, dtype):
        return _wgrad_accumulate_cuda
    return None


def fold_pending_grads(params, divide: float = 1.0) -> None:
    """Gradients written to ``p.grad`` without the hook (the zero-bubble schedules' weight pass assigns
    them directly: pipeline.just_in_time_receives folds them after every micro-batch's pass, so they add
    up in fp32) join ``main_grad``; then, after the step's backward, all of them are divided by
    ``divide`` (the pipeline's micro-batch count, which the schedule's own ``scale_grads`` would have
    applied to ``p.grad``)."""
    for p in params:
        if not hasattr(p, "main_grad"):
            continue
        if p.grad is not None:
            accumulate_main_grad(p)
        if divide != 1.0 and p.main_grad is not None:
            p.main_grad.div_(divide)


def _host_adamw(params, **kwargs) -> torch.optim.Optimizer:
    kwargs.pop("fused", None)
    try:
        return torch.optim.AdamW(params, fused=True, **kwargs)  # fused CPU AdamW (torch >= 2.4)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, foreach=True, **kwargs)


class MasterAdamW:
    """AdamW over fp32 copies of ``params`` kept on ``master_device``: the fp32 master of 16-bit
    parameters, and/or the host copy of an offloaded optimizer.  ``step`` copies the gradients
    (``grad_of``) to the copies, steps them and copies the values back into the parameters."""

    def __init__(self, params: list, *, offload: bool, keep_master: bool, **adamw_kwargs):
        self.params = list(params)
        self.offload, self.keep_master = offload, keep_master
        device = self.params[0].device if self.params else torch.device("cpu")
        self.master_device = torch.device("cpu") if offload else device
        pin = offload and device.type == "cuda"
        self.masters = []
        for p in self.params:
            t = torch.empty(p.shape, dtype=torch.float32, device=self.master_device, pin_memory=pin)
            t.copy_(p.detach())
            self.masters.append(t)
        # checkpoint.state_dict keys the inner optimizer's states by these parameters' names
        self.alias = {id(m): p for m, p in zip(self.masters, self.params)}
        if offload:
            self.optim = _host_adamw(self.masters, **adamw_kwargs)
        else:
            self.optim = torch.optim.AdamW(self.masters, **adamw_kwargs)

    def master_of(self, p) -> torch.Tensor:
        return self.masters[next(i for i, q in enumerate(self.params) if q is p)]

    @torch.no_grad()
    def step(self) -> None:
        for p, m in zip(self.params, self.masters):
            g = grad_of(p)
            m.grad = None if g is None else g.detach().to(m.device, torch.float32)
        self.optim.step()
        for p, m in zip(self.params, self.masters):
            if m.grad is not None:
                p.copy_(m)  # to the device, rounded to the parameter's dtype
            m.grad = None

    @torch.no_grad()
    def sync_from_params(self) -> None:
        """After a checkpoint load that restored the parameters but no master (host mirror)."""
        if not self.keep_master:
            for p, m in zip(self.params, self.masters):
                m.copy_(p.detach())

    def zero_grad(self, set_to_none: bool = True) -> None:
        clear_grads(self.params)
        for m in self.masters:
            m.grad = None
