"""What torchtitan 0.2.2's MoE layer needs to run forward on a CPU, installed on import (nothing it saves for the
backward changes): torch.histc over the expert indices (CPU's takes floating point only; the same counts, in the
indices' dtype, as CUDA's kernel returns), and torchtitan's own CPU implementation of its permutation-index kernel
(Triton's on CUDA: the same indices)."""
import torch
import torchtitan.models.moe.utils as _moe_utils

_histc = torch.histc
torch.histc = lambda t, *a, **k: (_histc(t.float(), *a, **k).to(t.dtype) if not t.is_floating_point()
                                  else _histc(t, *a, **k))
_gpi = _moe_utils.generate_permute_indices
_moe_utils.generate_permute_indices = lambda *a, **k: _gpi(*a, **{**k, "use_cpu": True})
