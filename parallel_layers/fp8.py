"""FP8 linear layers: the GEMMs of the blocks' column- and row-parallel linears in FP8 (a plan's training.fp8).

The recipe is torchao's float8 "tensorwise" one (dynamic per-tensor scaling, as torchtitan's
``converters = ["float8"]`` runs it): each GEMM operand is cast just before the GEMM with a scale made from
its own absolute maximum, E4M3 for inputs and weights, E5M2 for output gradients (the "hybrid" format);
the layer saves its 16-bit input and weight for the backward and casts them again there (torchao's
Float8Linear saves the high-precision tensors, not the FP8 ones, so activation memory is a 16-bit plan's).
The GEMMs are ``torch._scaled_mm``: cuBLASLt's FP8 GEMM on GPUs with FP8 tensor cores (compute capability
8.9 and up), a slow reference kernel on CPU.  On Hopper that GEMM takes its second operand column-major and
its first row-major, with the inner and output dimensions multiples of 16 (``gemm_dims_problem``); the casts
write each operand in the layout its GEMM reads (the weight transposed for the input gradient, the output
gradient transposed and the input column-major for the weight gradient).

Per linear and micro-batch, what ``cost_models.compute.fp8_cast_time`` counts for framework parplan: forward,
an amax and a cast of the input (once for linears that share it: q/k/v, gate/up) and of each weight;
backward, the saved input and each weight again, and each output gradient once (its transposed copy for the
weight gradient is an FP8 transpose).  The attention, the norms, the embedding and the output layer stay in
16 bits.  The amax reductions are not all-reduced over tensor-parallel ranks: each rank scales its own shard.
"""
from __future__ import annotations

import os
import warnings
from typing import NamedTuple

import torch

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2


def _cast_eager(t: torch.Tensor, dtype: torch.dtype):
    """(t in FP8 at scale s, 1/s): s = the format's largest value over t's absolute maximum (fp32)."""
    scale = _scale_of(t.detach().abs().amax().float(), dtype)
    return _scale_cast(t, scale, dtype), scale.reciprocal()


def _scale_of(amax: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.finfo(dtype).max / torch.clamp(amax, min=1e-12)


def _scale_cast(t: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    fmax = torch.finfo(dtype).max
    return (t.detach().float() * scale).clamp_(-fmax, fmax).to(dtype)


def _cast_hybrid(t: torch.Tensor, dtype: torch.dtype, pointwise):
    """_cast_eager with the amax by ATen's own reduction and the scaling and cast one compiled pointwise pass."""
    scale = _scale_of(torch.linalg.vector_norm(t.detach(), float("inf")).float(), dtype)
    return pointwise(t, scale, dtype), scale.reciprocal()


# How a GPU run makes its casts (the environment's PARPLAN_FP8_CAST, read once a process; every rank of a torchrun
# job inherits it): "dynamic" (the default) one torch.compile'd _cast_eager with dynamic shapes for every operand;
# "static" the same with a graph per shape (the recompile limit raised to hold a model's dozen or so shapes);
# "hybrid" the amax by ATen's reduction, the scaling and cast compiled (dynamic); "eager" no compiler.  The GPU runs
# of 2026-12-06 stepped 4.6-5.4x their prediction with "dynamic"; the others are there to tell on the next GPU which
# part of the cast is slow (benchmarks/gpu_h100.sh runs the 1.3B FP8 entry under each), not yet measured.
CAST_MODES = ("dynamic", "static", "hybrid", "eager")
CAST_ENV = "PARPLAN_FP8_CAST"
STATIC_RECOMPILE_LIMIT = 64  # "static": graphs a process may make of the cast (torch's default limit is 8)


def cast_mode() -> str:
    mode = os.environ.get(CAST_ENV, "dynamic").strip().lower() or "dynamic"
    if mode not in CAST_MODES:
        raise ValueError(f"{CAST_ENV}={mode!r}: expected one of {', '.join(CAST_MODES)}")
    return mode


_cast_compiled = None  # the compiled cast of cast_mode() once made; False once it failed
_cast_failure: str | None = None  # why it failed (the run report says so: the prediction counts compiled casts)


def cast(t: torch.Tensor, dtype: torch.dtype):
    """_cast_eager, fused by torch.compile on a GPU (one amax pass and one cast pass, as the cost model counts;
    eager it is four elementwise passes more); eager where the compiler is unavailable or fails, or where
    PARPLAN_FP8_CAST says so (cast_mode)."""
    if t.device.type == "cuda":
        out = _compiled_cast(t, dtype)
        if out is not None:
            return out
    return _cast_eager(t, dtype)


def _make_compiled(mode: str):
    """The cast function of a compiling mode (cast_mode), or None for "eager"."""
    if mode == "eager":
        return None
    if mode == "hybrid":
        pointwise = torch.compile(_scale_cast, dynamic=True)
        return lambda t, dtype: _cast_hybrid(t, dtype, pointwise)
    if mode == "static":
        cfg = torch._dynamo.config
        for name in ("recompile_limit", "cache_size_limit"):  # (the older torch's name)
            if hasattr(cfg, name):
                setattr(cfg, name, max(getattr(cfg, name), STATIC_RECOMPILE_LIMIT))
                break
    return torch.compile(_cast_eager, dynamic=mode == "dynamic")


def _compiled_cast(t: torch.Tensor, dtype: torch.dtype):
    """The compiled cast, or None once torch.compile has failed on it (said once, as a warning in the rank's log) or
    where cast_mode() is "eager"."""
    global _cast_compiled, _cast_failure
    if _cast_compiled is False:
        return None
    try:
        if _cast_compiled is None:
            _cast_compiled = _make_compiled(cast_mode())
            if _cast_compiled is None:
                _cast_compiled = False
                return None
        return _cast_compiled(t, dtype)
    except Exception as e:  # noqa: BLE001 -- any compiler failure: the eager passes, the same numbers
        _cast_compiled = False
        _cast_failure = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}".rstrip(": ")
        warnings.warn(f"parplan FP8: torch.compile of the casts failed ({_cast_failure}); casting eagerly, four "
                      "elementwise passes a cast more than the prediction counts", RuntimeWarning, stacklevel=2)
        return None


def cast_failure() -> str | None:
    """Why this process's casts fell back to eager on a GPU (None: compiled, or never tried)."""
    return _cast_failure


def _col_major(t8: torch.Tensor) -> torch.Tensor:
    """The same matrix laid out column-major (an FP8 transpose copy: 1 byte read and written an element)."""
    return t8.t().contiguous().t()


def _mm(a8, sa, b8, sb, out_dtype):
    return torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sb, out_dtype=out_dtype)


def forward(x: torch.Tensor, weights, biases):
    """Outputs x W_i^T + b_i of linears that read the same input x (..., in): x cast once, each weight once."""
    flat = x.reshape(-1, x.shape[-1])
    x8, sx = cast(flat, E4M3)
    outs = []
    for w, b in zip(weights, biases):
        w8, sw = cast(w, E4M3)  # (out, in) row-major: its transpose is the column-major (in, out) operand
        y = _mm(x8, sx, w8.t(), sw, x.dtype)
        if b is not None:
            y = y + b.to(y.dtype)  # (autocast's rule for F.linear's bias: an fp32 bias under amp stays out of y)
        outs.append(y.reshape(*x.shape[:-1], w.shape[0]))
    return outs


class GradFP8(NamedTuple):
    """An output gradient cast once for both backward GEMMs: (tokens, out) in E5M2, its 1/scale, and the 16-bit
    gradient's dtype and leading shape (what the input gradient is made in)."""
    data: torch.Tensor
    scale_inv: torch.Tensor
    dtype: torch.dtype
    lead: tuple


def cast_grads(grads) -> list[GradFP8]:
    return [GradFP8(*cast(g.reshape(-1, g.shape[-1]), E5M2), g.dtype, tuple(g.shape[:-1])) for g in grads]


def input_grad(grads: list[GradFP8], weights):
    """sum_i dY_i W_i (the input gradient of linears that read one input), each dY_i in E5M2 and W_i in E4M3."""
    gx = None
    for g, w in zip(grads, weights):
        w8, sw = cast(w, E4M3)
        part = _mm(g.data, g.scale_inv, _col_major(w8), sw, g.dtype).reshape(*g.lead, w.shape[1])
        gx = part if gx is None else gx + part
    return gx


def wgrad_input(x: torch.Tensor):
    """X (tokens, in) for the weight gradients: in E4M3, column-major, and its 1/scale; made once for every linear
    that reads X (q/k/v, the MLP's first layers), as the forward casts it once and the cost model counts it."""
    x8, sx = cast(x.reshape(-1, x.shape[-1]), E4M3)
    return _col_major(x8), sx


def weight_grad(g: GradFP8, xq, out_dtype: torch.dtype) -> torch.Tensor:
    """dW = dY^T X over all leading dimensions (out, in): dY (tokens, out) in E5M2, X as wgrad_input made it."""
    x8_col, sx = xq
    return _mm(g.data.t().contiguous(), g.scale_inv, x8_col, sx, out_dtype)


def gemm_dims_problem(dims: dict[str, int]) -> str | None:
    """Why cuBLASLt's FP8 GEMM cannot take these linears (named sizes: each linear's input and output features on
    one tensor-parallel rank, the tokens of a micro-batch), in one line, or None: every one must be a multiple
    of 16 (the inner dimension of each of the three GEMMs, and the output's)."""
    bad = [f"{name} {n}" for name, n in dims.items() if n % 16]
    if not bad:
        return None
    return ("FP8 GEMMs need every linear's sizes and a micro-batch's tokens in multiples of 16 (torch._scaled_mm on "
            f"the GPU), and this plan has {', '.join(bad)}; change the shape or tp, or re-plan without --fp8")
