"""What torchtitan 0.2.2's own MoE layer saves for its backward, against parplan's model of it (moe.titan_saved_bytes
and the experts' dense-MLP tensors memory.activation_bytes_per_layer counts), on CPU in bf16, one rank.

torchtitan's MoE module (torchtitan/models/moe/moe.py: TokenChoiceTopKRouter, TokenReorderer, GroupedExperts over
torch._grouped_mm, the bmm combine) runs forward on a normed block input under saved_tensors_hooks; every tensor
autograd saves is counted once by storage, parameters and buffers left out, as tests/test_activation_memory.py counts
parplan's runtime.  The MoE layer alone: its ops are the same on a GPU (index, grouped GEMM, bmm over an fp32 upcast),
where the block's RMSNorms are not (torch's CPU RMSNorm saves fp32 copies a GPU's fused kernel does not), so the whole
block is printed for context only.

Predicted, a micro-batch of T tokens: the router's input (T h, 16-bit: the norm's output, counted by
activation_bytes_per_layer's outside term), the experts' four k x expert_ffn tensors a token (its dense-MLP-of-width-k
f term with the silu output), and moe.titan_saved_bytes.

Stubs (CPU only, nothing saved changes): cpu_stubs.py.
Run:  PYTHONPATH=$W/tt-0.2.2 $W/venv/bin/python benchmarks/titan_moe_saved/measure.py   (the venv of
benchmarks/export_parse/tt_moe_run.sh)."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
from cost_models import moe as moe_model  # noqa: E402
from cost_models.layout import Layout  # noqa: E402
from planner.core import model_dims  # noqa: E402
from planner.schema import ModelSpec  # noqa: E402
import cpu_stubs  # noqa: E402,F401  (torchtitan's MoE on a CPU: cpu_stubs.py)
from torchtitan.models.moe import MoEArgs  # noqa: E402
from torchtitan.models.moe.moe import MoE  # noqa: E402



def measured(moe_args: MoEArgs, dim: int, inter: int, b: int, s: int) -> int:
    torch.manual_seed(0)
    layer = MoE(moe_args, dim, inter)
    with torch.no_grad():
        layer.init_weights(0.02, torch.device("cpu"))
    layer = layer.to(torch.bfloat16)
    own = {p.data_ptr() for p in layer.parameters()} | {t.data_ptr() for t in layer.buffers()}
    seen = {}

    def pack(t):
        if t.data_ptr() not in own:
            seen[t.data_ptr()] = max(seen.get(t.data_ptr(), 0), t.untyped_storage().nbytes())
        return t

    x = torch.randn(b, s, dim, dtype=torch.bfloat16, requires_grad=True)  # the ffn norm's output
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    return sum(seen.values())


def predicted(moe_args: MoEArgs, dim: int, inter: int, b: int, s: int) -> float:
    spec = ModelSpec(arch="llama", layers=1, hidden=dim, heads=4, kv_heads=4, ffn_hidden=inter, vocab=100,
                     experts=moe_args.num_experts, experts_per_token=moe_args.top_k)
    m = model_dims(spec, s, "torchtitan")
    lay = Layout(gpus=1, tp=1, pp=1, dp=1, cp=1, vpp=1, mbs=b, zero=0, recompute=0, sp=0, schedule=1, offload=0)
    T, act = b * s, 2
    layer = float(moe_model.titan_saved_bytes(m, lay, act, eager=True))
    megatron = T * moe_model.saved_bytes_per_token(m, act)  # what the model counted before: Megatron-Core's layer
    base = T * dim * act + T * 4 * m.ffn * act
    return base + layer, base + megatron


print("torch", torch.__version__)
for dim, inter, e, k, b, s, func, norm in ((256, 128, 8, 2, 2, 128, "softmax", True),
                                           (512, 256, 16, 4, 1, 256, "softmax", True),
                                           (256, 512, 4, 1, 2, 256, "softmax", False),
                                           (1024, 384, 64, 8, 1, 512, "sigmoid", True),
                                           (2048, 768, 128, 8, 1, 1024, "softmax", True)):
    args = MoEArgs(num_experts=e, num_shared_experts=0, top_k=k, score_func=func, route_norm=norm,
                   score_before_experts=False, load_balance_coeff=None)
    got, (want, before) = measured(args, dim, inter, b, s), predicted(args, dim, inter, b, s)
    print(f"hidden {dim} expert_ffn {inter} experts {e} top {k} {func} route_norm {norm} b {b} s {s}: "
          f"measured {got:,} B, predicted {want:,.0f} B ({100 * (want / got - 1):+.2f} %); as Megatron-Core's layer "
          f"{before:,.0f} B ({100 * (before / got - 1):+.1f} %)")

# The attention of torchtitan's MoE models (0.2.2's qwen3 here) passes SDPA enable_gqa: K and V are saved at the kv
# heads' width, not repeated to the query heads as 0.1's llama did (ModelDims.titan_moe drops the eager repeat_kv term)
from torchtitan.models.qwen3.model.args import Qwen3ModelArgs  # noqa: E402
from torchtitan.models.qwen3.model.model import Attention, precompute_rope_cache  # noqa: E402
args = Qwen3ModelArgs(dim=256, n_heads=8, n_kv_heads=2, head_dim=32, qk_norm=False, max_seq_len=128)
attn = Attention(args).to(torch.bfloat16)
shapes = []
with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t, lambda t: t):
    attn(torch.randn(1, 128, 256, dtype=torch.bfloat16, requires_grad=True),
         precompute_rope_cache(32, 128, args.rope_theta), None)
four = [s for s in shapes if len(s) == 4 and s[-2:] == (128, 32)]
print(f"qwen3 attention, 8 query / 2 kv heads: the (b, heads, s, head_dim) tensors saved: {four}")
