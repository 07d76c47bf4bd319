"""What torchtitan 0.2.2's op-level selective activation checkpointing keeps of its own MoE block, on CPU in bf16:
torchtitan's qwen3 TransformerBlock (attention, RMSNorms, MoE) wrapped by its own _apply_op_sac with qwen3's save list
(torchtitan/models/qwen3/infra/parallelize.py _op_sac_save_list) and its default forced-recompute fqns (the router
gate), forward once, then forward again under the CPU allocator's trace (tests/runtime_helpers/held.py): the bytes
still held at the end beyond the block's output, plus its input (the caller's), are what the block keeps for its
backward.  One stand-in: CPU's SDPA runs aten._scaled_dot_product_flash_attention_for_cpu, which the list (CUDA's
kernels) does not name; it is added, so the attention output and log-sum-exp are kept as a GPU's flash kernel's are.
Run:  PYTHONPATH=$W/tt-0.2.2 $W/venv/bin/python benchmarks/titan_moe_saved/op_sac.py"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
from tests.runtime_helpers.held import traced_cpu_memory  # noqa: E402
import cpu_stubs  # noqa: E402,F401  (torchtitan's MoE on a CPU: cpu_stubs.py)
from torchtitan.config.job_config import ActivationCheckpoint  # noqa: E402
from torchtitan.distributed.activation_checkpoint import _apply_op_sac  # noqa: E402
from torchtitan.models.moe import MoEArgs  # noqa: E402
from torchtitan.models.qwen3.infra.parallelize import _op_sac_save_list  # noqa: E402
from torchtitan.models.qwen3.model.args import Qwen3ModelArgs  # noqa: E402
from torchtitan.models.qwen3.model.model import TransformerBlock, precompute_rope_cache  # noqa: E402

SAVE = set(_op_sac_save_list) | {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}


def kept(args: Qwen3ModelArgs, b: int, s: int, mode: str) -> int:
    torch.manual_seed(0)
    block = TransformerBlock(0, args)
    with torch.no_grad():
        block.init_weights(torch.device("cpu"))
    block = block.to(torch.bfloat16)
    if mode == "op":
        block = _apply_op_sac(block, ActivationCheckpoint(mode="selective", selective_ac_option="op"),
                              base_fqn="layers.0", op_sac_save_list=SAVE)
    rope = precompute_rope_cache(args.head_dim, s, args.rope_theta)
    x = torch.randn(b, s, args.dim, dtype=torch.bfloat16, requires_grad=True)
    block(x, rope, None)  # untraced once (per-shape caches)
    with traced_cpu_memory() as held:
        y = block(x, rope, None)
    return held() - y.untyped_storage().nbytes() + x.untyped_storage().nbytes()


if __name__ == "__main__":
    print("torch", torch.__version__)
    for dim, heads, kv, hd, inter, e, k, b, s in ((256, 8, 2, 32, 128, 8, 2, 2, 128),
                                                  (512, 8, 4, 64, 256, 16, 4, 1, 256)):
        args = Qwen3ModelArgs(dim=dim, n_layers=1, n_heads=heads, n_kv_heads=kv, head_dim=hd, hidden_dim=4 * dim,
                              qk_norm=False, max_seq_len=s, moe_enabled=True, moe_inter_dim=inter,
                              moe_args=MoEArgs(num_experts=e, num_shared_experts=0, top_k=k, score_func="softmax",
                                               route_norm=True, score_before_experts=False, load_balance_coeff=None))
        T = b * s
        got = kept(args, b, s, "op")
        print(f"hidden {dim} heads {heads}/{kv} head_dim {hd} expert_ffn {inter} experts {e} top {k} b {b} s {s}: "
              f"op-level kept {got:,} B ({got / T:,.1f} a token; input h x 2 = {2 * dim}, wq {2 * heads * hd}, "
              f"wv {2 * kv * hd}, attention out {2 * heads * hd} + lse {4 * heads})")

    # llama4 (a shared expert: w1, w3, w2 counted after the attention's four) and deepseek_v3 (latent attention, shared
    # experts) under their own save lists; deepseek's attention (values narrower than queries and keys) takes CPU's
    # composite SDPA, which no list names: its output is not kept here, where a GPU's efficient / cuDNN / flex kernel
    # keeps it (printed apart)
    from torchtitan.models.deepseek_v3.infra.parallelize import _op_sac_save_list as ds_list
    from torchtitan.models.deepseek_v3.model.args import DeepSeekV3ModelArgs
    from torchtitan.models.deepseek_v3.model.model import TransformerBlock as DsBlock, precompute_freqs_cis
    from torchtitan.models.llama4.infra.parallelize import _op_sac_save_list as l4_list
    from torchtitan.models.llama4.model.args import TransformerModelArgs as L4Args
    from torchtitan.models.llama4.model.model import TransformerBlock as L4Block, precompute_freqs_cis as l4_freqs

    def kept_other(block, x, rope, save):
        torch.manual_seed(0)
        with torch.no_grad():
            block.init_weights(torch.device("cpu"))
        block = _apply_op_sac(block.to(torch.bfloat16), ActivationCheckpoint(mode="selective",
                              selective_ac_option="op"), base_fqn="layers.0", op_sac_save_list=save)
        block(x, rope, None)
        with traced_cpu_memory() as held:
            y = block(x, rope, None)
        return held() - y.untyped_storage().nbytes() + x.untyped_storage().nbytes()

    b, s = 2, 128
    for ql in (0, 96):
        args = DeepSeekV3ModelArgs(vocab_size=100, dim=256, inter_dim=512, moe_inter_dim=128, n_layers=1,
                                   n_dense_layers=0, n_heads=8, q_lora_rank=ql, kv_lora_rank=64, qk_nope_head_dim=32,
                                   qk_rope_head_dim=16, v_head_dim=32, max_seq_len=s, attn_type="sdpa",
                                   moe_args=MoEArgs(num_experts=8, num_shared_experts=2, top_k=2,
                                                    score_func="softmax", route_norm=False,
                                                    score_before_experts=False, load_balance_coeff=None))
        args.moe_impl = "standard"
        x = torch.randn(b, s, 256, dtype=torch.bfloat16, requires_grad=True)
        got = kept_other(DsBlock(0, args), x, precompute_freqs_cis(args), set(ds_list) | {
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default})
        print(f"deepseek_v3 hidden 256 heads 8 q_lora {ql} kv_lora 64 rope 16 nope 32 v 32 shared 2x128 experts 8 "
              f"top 2 b {b} s {s}: op-level kept {got:,} B (attention output not kept on CPU)")
    args = L4Args(dim=256, n_layers=1, n_heads=8, n_kv_heads=2, vocab_size=100, max_seq_len=s, multiple_of=128,
                  moe_args=MoEArgs(num_experts=4, num_shared_experts=1, top_k=1, load_balance_coeff=None),
                  interleave_moe_layer_step=1)
    blk = L4Block(0, args)
    x = torch.randn(b, s, 256, dtype=torch.bfloat16, requires_grad=True)
    got = kept_other(blk, x, l4_freqs(args.dim // args.n_heads, s, args.rope_theta),
                     set(l4_list) | {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default})
    print(f"llama4 hidden 256 heads 8/2 head_dim 32 shared_ffn {blk.moe.shared_experts.w1.weight.shape[0]} experts 4 "
          f"top 1 b {b} s {s}: op-level kept {got:,} B")
