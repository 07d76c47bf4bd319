"""parallel_layers.cpu_matmul: 16-bit CPU matmuls and attention computed in fp32 where oneDNN has no 16-bit path,
with the 16-bit run's saved tensors and GPU-like memory peak."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from parallel_layers.cpu_matmul import SCOPE, _Fp32Matmuls, fp32_matmuls, wanted
from parallel_layers.host_memory import CpuMemoryTrace

CPU = torch.device("cpu")


def test_it_is_wanted_only_for_16_bit_cpu_runs(monkeypatch):
    monkeypatch.setenv("PARPLAN_CPU_FP32_MATMULS", "1")
    assert wanted(CPU, torch.bfloat16) and wanted(CPU, torch.float16)
    assert not wanted(CPU, torch.float32) and not wanted(CPU, None)
    assert not wanted(torch.device("cuda"), torch.bfloat16)
    monkeypatch.setenv("PARPLAN_CPU_FP32_MATMULS", "0")
    assert not wanted(CPU, torch.bfloat16)


def _saved_dtypes(fn):
    dtypes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: dtypes.append(t.dtype) or t, lambda t: t):
        out = fn()
    return out, dtypes


def test_a_16_bit_linear_is_the_fp32_product_rounded_and_saves_16_bit_tensors():
    torch.manual_seed(0)
    x = torch.randn(64, 48, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(40, 48, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(40, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(64, 40, dtype=torch.bfloat16)
    with _Fp32Matmuls():
        y, saved = _saved_dtypes(lambda: F.linear(x, w, b))
        y.backward(g)
    assert y.dtype == torch.bfloat16 and saved and all(d == torch.bfloat16 for d in saved)
    # the fp32 product of the same 16-bit values, rounded once
    assert torch.equal(y, F.linear(x.float(), w.float(), b.float()).to(torch.bfloat16))
    assert torch.equal(x.grad, (g.float() @ w.float()).to(torch.bfloat16))
    assert torch.equal(w.grad, (g.float().t() @ x.float()).to(torch.bfloat16))
    # fp32 tensors pass through untouched
    with _Fp32Matmuls():
        assert F.linear(x.float(), w.float()).dtype == torch.float32


def test_16_bit_attention_returns_16_bit_outputs_and_fp32_log_sum_exp():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 32, 16, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    with _Fp32Matmuls():
        out, saved = _saved_dtypes(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        out.float().sum().backward()
    ref = [t.detach().float().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*ref, is_causal=True).sum().backward()
    assert out.dtype == torch.bfloat16 and all(t.grad.dtype == torch.bfloat16 for t in (q, k, v))
    # saved: q, k, v and the output in 16 bit, the log-sum-exp in fp32 (as the native 16-bit kernel saves them)
    assert sorted(map(str, saved)) == sorted(["torch.bfloat16"] * 4 + ["torch.float32"])
    for t, r in zip((q, k, v), ref):
        assert torch.allclose(t.grad.float(), r.grad, atol=2e-2, rtol=2e-2)


def test_the_fp32_copies_are_left_out_of_the_gpu_like_peak():
    """Under the mode a 16-bit matmul's fp32 copies of its operands and product are made and freed inside the op:
    the GPU-like peak is the 16-bit output alone, as on a GPU; the raw peak keeps them."""
    a = torch.randn(512, 64, dtype=torch.bfloat16)
    w = torch.randn(8192, 64, dtype=torch.bfloat16)
    with CpuMemoryTrace() as t:
        with CpuMemoryTrace.phase("step1.fwd_bwd"), _Fp32Matmuls():
            y = F.linear(a, w)
    out = y.numel() * y.element_size()
    assert t.result["without_collective_buffers"]["allocated"] == out
    assert t.result["allocated"] >= out + y.numel() * 4  # the fp32 product, at least
    q = torch.randn(1, 2, 256, 16, dtype=torch.bfloat16)
    with CpuMemoryTrace() as t:
        with CpuMemoryTrace.phase("step1.fwd_bwd"), _Fp32Matmuls():
            o = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert t.result["without_collective_buffers"]["allocated"] <= o.numel() * o.element_size() + 256 * 2 * 4
    assert SCOPE == "parplan::fp32_math"


def test_fp32_matmuls_changes_nothing_where_it_is_not_wanted(monkeypatch):
    monkeypatch.setenv("PARPLAN_CPU_FP32_MATMULS", "0")
    from torch.utils._python_dispatch import _get_current_dispatch_mode
    with fp32_matmuls(CPU, torch.bfloat16):
        assert _get_current_dispatch_mode() is None
    monkeypatch.setenv("PARPLAN_CPU_FP32_MATMULS", "1")
    with fp32_matmuls(CPU, torch.bfloat16):
        assert isinstance(_get_current_dispatch_mode(), _Fp32Matmuls)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_batched_matmuls_too(dtype):
    a = torch.randn(3, 8, 5, dtype=dtype)
    b = torch.randn(3, 5, 7, dtype=dtype)
    c = torch.randn(3, 8, 7, dtype=dtype)
    with _Fp32Matmuls():
        assert torch.equal(torch.bmm(a, b), torch.bmm(a.float(), b.float()).to(dtype))
        assert torch.equal(torch.baddbmm(c, a, b), torch.baddbmm(c.float(), a.float(), b.float()).to(dtype))
