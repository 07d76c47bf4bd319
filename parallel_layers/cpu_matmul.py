"""16-bit matmuls on a CPU without native 16-bit GEMMs, computed in fp32 and rounded once.

A CPU with neither AVX512 (oneDNN's bf16 path) nor AMX runs torch's bf16 ``mm`` through a reference kernel:
on this project's 2-core AMD EPYC (AVX2 only, 2026-12-02, torch 2.13) a 1,024 x 256 x 704 linear's forward and
backward took 745 ms in bf16 against 20 ms in fp32, so a 4-rank CPU run of a narrow 8-block model spent 70 s
a step in its matmuls, and 147 ms in each bf16 attention backward (6x fp32's).  ``fp32_matmuls`` computes
``aten::mm``, ``addmm``, ``bmm``, ``baddbmm`` and the CPU flash attention (forward and backward) of 16-bit CPU
tensors in fp32 and rounds what they return to the inputs' dtype, as a GPU's tensor cores accumulate in fp32:
autograd, which runs above it, still saves the 16-bit tensors, so what a run holds is what it held before;
the fp32 copies live only inside the op (profiler scope ``SCOPE``), which ``host_memory`` leaves out of the
GPU-like peak as it does a matmul's own scratch.  On by default where oneDNN has no 16-bit path (``PARPLAN_CPU_FP32_MATMULS=0`` or ``1``
forces it); never on a GPU.
"""
from __future__ import annotations

import os
from contextlib import contextmanager, nullcontext

import torch
from torch.autograd.profiler import record_function
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

_aten = torch.ops.aten
# op -> which of its outputs have the inputs' dtype (a 16-bit attention's log-sum-exp is fp32 either way)
OPS = {_aten.mm.default: None, _aten.addmm.default: None, _aten.bmm.default: None, _aten.baddbmm.default: None,
       _aten._scaled_dot_product_flash_attention_for_cpu.default: (0,),
       _aten._scaled_dot_product_flash_attention_for_cpu_backward.default: (0, 1, 2)}
HALF = (torch.bfloat16, torch.float16)
# the profiler scope each such op runs in: host_memory leaves what is allocated and freed inside it out of the
# GPU-like peak, as it does a matmul's own scratch
SCOPE = "parplan::fp32_math"


def native_16bit_gemm(dtype: torch.dtype) -> bool:
    """Whether oneDNN multiplies this 16-bit dtype natively on this CPU."""
    check = {torch.bfloat16: "_is_mkldnn_bf16_supported", torch.float16: "_is_mkldnn_fp16_supported"}[dtype]
    try:
        return bool(getattr(torch.ops.mkldnn, check)())
    except (AttributeError, RuntimeError):
        return False


def wanted(device: torch.device, dtype: torch.dtype | None) -> bool:
    """Whether a run on `device` whose parameters are `dtype` should compute its matmuls in fp32."""
    if device.type != "cpu" or dtype not in HALF:
        return False
    forced = os.environ.get("PARPLAN_CPU_FP32_MATMULS")
    if forced in ("0", "1"):
        return forced == "1"
    return not native_16bit_gemm(dtype)


class _Fp32Matmuls(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in OPS:
            tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
            half = {t.dtype for t in tensors} & set(HALF)
            if len(half) == 1 and all(type(t) is torch.Tensor and t.device.type == "cpu" for t in tensors):
                dtype = half.pop()
                with record_function(SCOPE):
                    up = tree_map(lambda a: a.float() if isinstance(a, torch.Tensor) and a.dtype == dtype else a,
                                  (args, kwargs))
                    out = func(*up[0], **up[1])
                    del up
                    back = OPS[func]
                    result = out.to(dtype) if back is None else \
                        type(out)(o.to(dtype) if i in back else o for i, o in enumerate(out))
                    del out  # the fp32 results, freed inside the scope
                return result
        return func(*args, **kwargs)


@contextmanager
def fp32_matmuls(device: torch.device, dtype: torch.dtype | None):
    """Inside: 16-bit CPU matmuls in fp32 (see the module), where `wanted`; else nothing changes."""
    with (_Fp32Matmuls() if wanted(device, dtype) else nullcontext()):
        yield
