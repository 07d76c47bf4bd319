"""Single-process checks of the runtime pieces: mapping identities on a group of one, TP layers
against torch.nn on one rank, logical-seeded init slicing, stage splits, data determinism,
recompute equivalence, and parameter counts against cost_models.params."""
from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from cost_models.layout import stage_layers as split_layers  # the runtime's default split is the cost model's
from cost_models.layout import stages_of_rank
from cost_models.params import param_counts
from parallel_layers import context_parallel as CP
from parallel_layers import mappings as M
from parallel_layers.data import TokenSource, replica_sample_indices
from parallel_layers.layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, vocab_parallel_cross_entropy
from parallel_layers.model import ModelConfig, StageModule, full_logical_init, init_parameters, iter_shard_specs
from parallel_layers.pipeline import virtual_stage_layers
from tests.runtime_helpers.plans import TINY_GPT, TINY_LLAMA, tiny_plan


PAIRS = [M._CopyToTP, M._ReduceFromTP, M._ScatterToTP, M._GatherFromTP, M._ScatterToSP, M._GatherFromSP,
         M._ReduceScatterToSP]


@pytest.mark.parametrize("fn", PAIRS, ids=lambda f: f.__name__)
def test_mapping_pairs_are_identities_on_one_rank(group_of_one, fn):
    x = torch.randn(2, 4, 6, requires_grad=True)
    y = fn.apply(x, group_of_one)
    assert torch.equal(y, x)
    g = torch.randn_like(y)
    y.backward(g)
    assert torch.equal(x.grad, g)


@pytest.mark.parametrize("fn", [M.copy_to_tp_region, M.reduce_from_tp_region, M.scatter_to_tp_region,
                                M.gather_from_tp_region, M.scatter_to_sequence_parallel_region,
                                M.gather_from_sequence_parallel_region, M.reduce_scatter_to_sequence_parallel_region])
def test_group_of_one_returns_early(group_of_one, fn):
    x = torch.randn(2, 4, 6)
    assert fn(x, group_of_one) is x and fn(x, None) is x


def _copy_linear(layer, ref: nn.Linear):
    with torch.no_grad():
        layer.weight.copy_(ref.weight)
        if ref.bias is not None:
            layer.bias.copy_(ref.bias)


@pytest.mark.parametrize("cls", [ColumnParallelLinear, RowParallelLinear])
@pytest.mark.parametrize("bias", [False, True])
def test_parallel_linear_matches_nn_linear_on_one_rank(cls, bias):
    torch.manual_seed(0)
    ref = nn.Linear(16, 24, bias=bias)
    layer = cls(16, 24, None, name="x", bias=bias)
    _copy_linear(layer, ref)
    x1 = torch.randn(2, 5, 16, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_()
    torch.testing.assert_close(layer(x1), ref(x2))
    layer(x1).square().sum().backward()
    ref(x2).square().sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad)
    torch.testing.assert_close(layer.weight.grad, ref.weight.grad)


def test_vocab_embedding_and_cross_entropy_match_torch_on_one_rank():
    torch.manual_seed(0)
    emb = VocabParallelEmbedding(50, 8, None, name="e")
    nn.init.normal_(emb.weight)
    ids = torch.randint(0, 50, (3, 7))
    torch.testing.assert_close(emb(ids), F.embedding(ids, emb.weight))
    logits, target = torch.randn(3, 7, 50), torch.randint(0, 50, (3, 7))
    torch.testing.assert_close(vocab_parallel_cross_entropy(logits, target, None),
                               F.cross_entropy(logits.reshape(-1, 50), target.reshape(-1)))


def test_tp_shards_are_slices_of_the_logical_parameter():
    """Column shards split dim 0, row shards dim 1; rank r holds chunk r of the full tensor."""
    full = None
    for rank in range(2):
        col = ColumnParallelLinear(8, 6, None, name="layers.0.attn.wq")
        row = RowParallelLinear(6, 8, None, name="layers.0.attn.wo")
        for m in (col, row):  # pretend to be TP rank `rank` of 2, without a process group
            m.tp_size, m.tp_rank = 2, rank
            spec = m.param_specs["weight"]
            shape = list(spec.full_shape)
            shape[spec.tp_dim] //= 2
            m.weight = nn.Parameter(torch.empty(shape))
        init_parameters(col, seed=7)
        init_parameters(row, seed=7)
        full_col = full_logical_init(col.param_specs["weight"], 7)
        full_row = full_logical_init(row.param_specs["weight"], 7)
        assert torch.equal(col.weight, full_col.chunk(2, 0)[rank])
        assert torch.equal(row.weight, full_row.chunk(2, 1)[rank])
        full = full_col
    assert not torch.equal(full, full_logical_init(ColumnParallelLinear(8, 6, None, name="layers.1.attn.wq").param_specs["weight"], 7))
    # 48 values cannot pin the scale (sampling error ~10 %); 131,072 of the same init can (~0.2 %)
    big = full_logical_init(ColumnParallelLinear(512, 256, None, name="layers.0.attn.wq").param_specs["weight"], 7)
    assert big.std().item() == pytest.approx(0.02, rel=0.02) and abs(big.mean().item()) < 1e-3


def test_split_layers_gives_remainder_to_middle_stages():
    assert split_layers(8, 4) == [2, 2, 2, 2]
    assert split_layers(10, 4) == [2, 3, 3, 2]
    assert split_layers(5, 3) == [2, 2, 1]  # middle first, then the first stage
    assert sum(split_layers(7, 3)) == 7 and split_layers(7, 3)[1] == 3
    assert virtual_stage_layers(4, 2, 1, [1, 3]) == [[0], [1, 2, 3]]
    # a plan without stage_layers trains the split it was predicted with (7 blocks on 6 stages: the runtime had
    # given the extra block to stage 2, the model to stage 1)
    assert [len(s) for s in virtual_stage_layers(7, 6, 1, None)] == split_layers(7, 6) == [1, 2, 1, 1, 1, 1]


def test_virtual_stage_placement():
    assert stages_of_rank(1, pp=4, vpp=2, schedule="interleaved-1f1b") == [1, 5]
    assert stages_of_rank(1, pp=4, vpp=2, schedule="zbv") == [1, 6]  # V shape
    assert stages_of_rank(0, pp=2, vpp=2, schedule="zbv") == [0, 3]


def test_synthetic_batches_are_a_function_of_seed_step_index():
    src = TokenSource(vocab=100, seq_len=16, seed=3)
    x, y = src.batch(5, [0, 1])
    x2, _ = src.batch(5, [1])
    assert torch.equal(x[1], x2[0]) and torch.equal(x[0, 1:], y[0, :-1])
    assert not torch.equal(src.batch(6, [0])[0], x[:1])
    assert replica_sample_indices(1, 2, 3) == [6, 7, 8, 9, 10, 11]


def test_memmap_data(tmp_path):
    import numpy as np
    path = tmp_path / "tok.bin"
    np.arange(1000, dtype=np.uint16).__mod__(50).astype(np.uint16).tofile(path)
    src = TokenSource(vocab=50, seq_len=8, seed=1, path=str(path))
    x, y = src.batch(1, [0, 1])
    assert x.shape == (2, 8) and torch.equal(x[:, 1:], y[:, :-1])
    assert ((y - x) % 50 == 1).all()  # consecutive tokens of the file
    with pytest.raises(ValueError, match="vocab"):
        TokenSource(vocab=10, seq_len=8, seed=1, path=str(path)).batch(1, list(range(20)))


def _stage(model, recompute):
    plan = tiny_plan(model)
    cfg = ModelConfig.from_plan(plan)
    m = StageModule(cfg, list(range(cfg.layers)), first=True, last=True, tp_group=None, recompute=recompute)
    init_parameters(m, plan.training.seed)
    return m


TINY_NEOX = {**TINY_GPT, "tied_embeddings": False, "learned_positions": False}  # gpt blocks, rotary positions


@pytest.mark.parametrize("model", [TINY_LLAMA, TINY_GPT, TINY_NEOX], ids=["llama", "gpt", "gpt-rotary"])
@pytest.mark.parametrize("recompute", ["selective", "full", "selective-op"])
def test_recompute_gives_the_same_loss_and_gradients(model, recompute):
    ids = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(0))
    results = []
    for mode in ("none", recompute):
        m = _stage(model, mode)
        loss = vocab_parallel_cross_entropy(m(ids[:, :-1]), ids[:, 1:], None)
        loss.backward()
        results.append((loss.item(), {n: p.grad.clone() for n, p, _ in iter_shard_specs(m)}))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-6)
    for n, g in results[0][1].items():
        torch.testing.assert_close(results[1][1][n], g, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("model", [TINY_LLAMA, TINY_GPT, {**TINY_GPT, "tied_embeddings": False}, TINY_NEOX,
                                   {**TINY_LLAMA, "qkv_bias": True}],
                         ids=["llama", "gpt-tied", "gpt-untied", "gpt-rotary", "llama-qkv-bias"])
def test_parameter_count_matches_cost_model(model):
    plan = tiny_plan(model)
    m = _stage(model, "none")
    assert sum(p.numel() for p in m.parameters()) == param_counts(plan.model, plan.training.seq_len)["total"]


def test_untrained_loss_is_near_log_vocab():
    m = _stage(TINY_LLAMA, "none")
    ids = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(1))
    loss = vocab_parallel_cross_entropy(m(ids[:, :-1]), ids[:, 1:], None).item()
    assert loss == pytest.approx(torch.log(torch.tensor(256.0)).item(), abs=0.1)


def test_swiglu_function_matches_autograd_and_saves_two_tensors():
    from parallel_layers.model import _SwiGLU
    g = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    u = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_SwiGLU.apply, (g, u))
    ref_g, ref_u = torch.autograd.grad((torch.nn.functional.silu(g) * u).sum(), (g, u))
    got_g, got_u = torch.autograd.grad(_SwiGLU.apply(g, u).sum(), (g, u))
    assert torch.allclose(got_g, ref_g) and torch.allclose(got_u, ref_u)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        _SwiGLU.apply(g, u)
    assert len(saved) == 2  # gate and up only: the cost model's 3 x ffn counts these + the product


def test_rmsnorm_function_matches_autograd():
    from parallel_layers.model import NORM_EPS, _RMSNorm
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_RMSNorm.apply, (x, w))
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS) * w
    assert torch.allclose(_RMSNorm.apply(x, w), ref)


# ---- context parallelism (parallel_layers.context_parallel)

def test_cp_chunk_order_is_load_balanced():
    """cp rank i holds chunks i and 2cp-1-i: every rank gets the same causal work."""
    assert [CP.chunk_ids(r, 4) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    seq, cp = 32, 4
    held = torch.cat([CP.local_positions(seq // cp, r, cp) for r in range(cp)])
    assert sorted(held.tolist()) == list(range(seq))  # every position exactly once
    work = [int((CP.local_positions(seq // cp, r, cp) + 1).sum()) for r in range(cp)]  # keys seen per rank
    assert len(set(work)) == 1
    x = torch.arange(seq).view(1, seq)
    for r in range(cp):
        assert torch.equal(CP.shard_sequence(x, r, cp)[0], CP.local_positions(seq // cp, r, cp))
    assert CP.local_positions(8, 0, 2).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert CP.local_positions(8, 1, 2).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    with pytest.raises(ValueError, match="2\\*cp"):
        CP.shard_sequence(torch.zeros(1, 30), 0, 4)


def test_cp_gathered_chunks_go_back_to_global_order():
    for cp in (1, 2, 3, 4):
        seq = 2 * cp * 3
        gathered = torch.cat([CP.shard_sequence(torch.arange(seq).view(1, seq), r, cp) for r in range(cp)], dim=1)
        chunks = gathered.chunk(2 * cp, dim=1)
        assert torch.cat([chunks[i] for i in CP.gathered_to_global(cp)], dim=1)[0].tolist() == list(range(seq))


def test_cp_causal_mask_from_global_positions():
    pos = CP.local_positions(4, 1, 2)  # seq 8: chunks 1 and 2 -> positions 2, 3, 4, 5
    mask = CP.causal_mask(pos, 8)
    assert mask.shape == (4, 8)
    assert mask.sum(1).tolist() == [3, 4, 5, 6]
    full = torch.ones(8, 8, dtype=torch.bool).tril()
    assert torch.equal(mask, full[pos])


@pytest.mark.parametrize("cp", [2, 4])
def test_cp_attention_of_each_rank_is_its_rows_of_full_causal_attention(cp):
    """Local queries (GQA: 4 query heads, 2 kv heads) against all keys under the global-position
    mask give exactly this rank's rows of full-sequence causal attention, rotary included."""
    from parallel_layers.model import rotary

    g = torch.Generator().manual_seed(0)
    b, s, d = 2, 16, 8
    q, k, v = (torch.randn(b, h, s, d, generator=g) for h in (4, 2, 2))
    full = F.scaled_dot_product_attention(rotary(q), rotary(k), v, is_causal=True, enable_gqa=True)
    k_rot = rotary(k)
    for r in range(cp):
        pos = CP.local_positions(s // cp, r, cp)
        q_local = rotary(CP.shard_sequence(q, r, cp, dim=2), pos)
        torch.testing.assert_close(rotary(CP.shard_sequence(k, r, cp, dim=2), pos), CP.shard_sequence(k_rot, r, cp, dim=2))
        out = CP.cp_attention(q_local, k_rot, v, pos)
        torch.testing.assert_close(out, CP.shard_sequence(full, r, cp, dim=2), rtol=1e-5, atol=1e-6)
        # the per-chunk lower-right causal path (fused-kernel friendly) gives the same rows
        chunked = CP.cp_attention(q_local, k_rot, v, pos, CP.chunk_starts(s // cp, r, cp))
        torch.testing.assert_close(chunked, out, rtol=1e-5, atol=1e-6)


def test_cp_gather_is_identity_on_one_rank(group_of_one):
    x = torch.randn(2, 3, 4, 5, requires_grad=True)
    assert M.gather_from_context_parallel_region(x, group_of_one, 2) is x
    y = M._GatherFromCP.apply(x, group_of_one, 2)
    assert torch.equal(y, x)
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))



@pytest.mark.parametrize("model", [TINY_LLAMA, TINY_GPT, {**TINY_GPT, "tied_embeddings": False}, TINY_NEOX],
                         ids=["llama", "gpt-tied", "gpt-untied", "gpt-rotary"])
@pytest.mark.parametrize("first,last", [(True, True), (True, False), (False, True), (False, False)],
                         ids=["single", "first", "last", "middle"])
def test_cost_model_counts_the_runtimes_parameter_tensors(model, first, last):
    """The optimizer's per-tensor host cost needs the number of parameter tensors a rank steps: the
    cost model's count equals the runtime's own for every kind of stage (the other stages of the
    call hold no blocks, so the largest count is this stage's)."""
    import numpy as np

    from cost_models.layout import ModelDims
    from cost_models.total import param_tensors_per_rank
    plan = tiny_plan(model)
    cfg = ModelConfig.from_plan(plan)
    stage = StageModule(cfg, [0, 1], first=first, last=last, tp_group=None)
    m = ModelDims.from_spec(plan.model, plan.training.seq_len)
    pp = 1 if first and last else (2 if first or last else 3)
    blocks = [2 if first else 0, 0 if first or last else 2, 2 if last and not first else 0]
    count = param_tensors_per_rank(m, np.array(pp), *(np.array(b) for b in blocks))
    assert int(count) == len({id(p) for p in stage.parameters()})


@pytest.mark.parametrize("max_norm", [1e-3, 1e9], ids=["clips", "does-not-clip"])
def test_clip_grad_norm_matches_torch_on_one_rank(max_norm):
    """parallel_layers.clip on one rank is torch.nn.utils.clip_grad_norm_: the same norm and the same
    clipped gradients (tied gpt: the shared embedding counted once)."""
    from parallel_layers.clip import clip_grad_norm
    cfg = ModelConfig.from_plan(tiny_plan(TINY_GPT))
    model = StageModule(cfg, list(range(cfg.layers)), first=True, last=True, tp_group=None)
    init_parameters(model, 1234)
    x = torch.randint(0, cfg.vocab, (2, 16))
    F.cross_entropy(model(x).reshape(-1, cfg.vocab), x.reshape(-1)).backward()
    twin = {n: p.grad.clone() for n, p in model.named_parameters()}
    params = [p for _, p in model.named_parameters()]
    norm = clip_grad_norm([model], max_norm, tp=1, dp=1, cp=1, pp=1, zero_stage=0, tied=True, device=torch.device("cpu"))
    ref_params = [nn.Parameter(p.detach().clone()) for p in params]
    for rp, (n, _) in zip(ref_params, model.named_parameters()):
        rp.grad = twin[n]
    ref = torch.nn.utils.clip_grad_norm_(ref_params, max_norm)
    torch.testing.assert_close(norm, ref)
    for p, rp in zip(params, ref_params):
        torch.testing.assert_close(p.grad, rp.grad)
    assert (norm > max_norm) == (max_norm == 1e-3)


@pytest.mark.parametrize("model", [TINY_LLAMA, {**TINY_LLAMA, "tied_embeddings": True}, TINY_GPT],
                         ids=["llama", "llama-tied", "gpt-tied"])
def test_one_rank_model_has_the_planned_parameter_count(model):
    """The runtime builds the model the plan costs: a tied llama (Llama 3.2 1B, Gemma) shares the head
    with the embedding, as gpt does, so its parameters are the cost model's count, not one vocab x
    hidden matrix more."""
    plan = tiny_plan(model)
    cfg = ModelConfig.from_plan(plan)
    m = StageModule(cfg, list(range(cfg.layers)), first=True, last=True, tp_group=None)
    assert (m.head.weight is m.embed.weight) == bool(model.get("tied_embeddings"))
    assert sum(p.numel() for p in m.parameters()) == param_counts(plan.model, plan.training.seq_len)["total"]


def test_rotary_uses_the_models_base():
    """A Llama 3 plan (rope_theta 500000) rotates with its own base: the tables differ from the default's, and
    the attention module passes the plan's base."""
    from parallel_layers.model import ModelConfig, rotary
    x = torch.randn(1, 2, 8, 16)
    base = rotary(x)
    assert torch.equal(rotary(x, theta=10000.0), base)
    assert not torch.allclose(rotary(x, theta=500000.0), base)
    d = torch.arange(0, 16, 2, dtype=torch.float32) / 16
    pos = torch.arange(8, dtype=torch.float32)
    ang = torch.outer(pos, 1.0 / 500000.0 ** d)
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    x1, x2 = x[..., :8], x[..., 8:]
    assert torch.allclose(rotary(x, theta=500000.0), x * cos + torch.cat([-x2, x1], -1) * sin, atol=1e-6)

    plan = tiny_plan(TINY_LLAMA)
    plan.model = plan.model.model_copy(update={"rope_theta": 500000.0})
    assert ModelConfig.from_plan(plan).rope_theta == 500000.0
    plan.model = plan.model.model_copy(update={"rope_theta": None})
    assert ModelConfig.from_plan(plan).rope_theta == 10000.0

    # a block built with the plan's base runs it: the same weights give other outputs than at 10000, and
    # the selective-recompute path (its core attention checkpointed) the same as the plain one
    from parallel_layers.model import Block, init_parameters
    outs = {}
    for theta, rec in ((10000.0, "none"), (500000.0, "none"), (500000.0, "selective")):
        cfg = ModelConfig(arch="llama", layers=1, hidden=64, heads=4, kv_heads=4, ffn_hidden=128, vocab=100,
                          head_dim=16, tied_embeddings=False, max_seq_len=8, rope_theta=theta)
        blk = Block(cfg, 0, None, False, rec)
        init_parameters(blk, 0)
        torch.manual_seed(0)
        outs[theta, rec] = blk(torch.randn(1, 8, 64))
    assert not torch.allclose(outs[10000.0, "none"], outs[500000.0, "none"])
    assert torch.allclose(outs[500000.0, "none"], outs[500000.0, "selective"])


def test_gpt_blocks_with_rotary_positions_have_no_table_and_rotate():
    """GPT-NeoX/Pythia (learned_positions false): no position table on the first stage, q and k rotated, and a
    sequence past any table length runs."""
    plan = tiny_plan(TINY_NEOX)
    cfg = ModelConfig.from_plan(plan)
    assert cfg.rope and cfg.arch == "gpt"
    m = StageModule(cfg, list(range(cfg.layers)), first=True, last=True, tp_group=None)
    assert m.positions is None and all(b.attn.rope for b in m.blocks)
    assert not ModelConfig.from_plan(tiny_plan(TINY_GPT)).rope


def test_zero_bubble_weight_pass_folds_each_micro_batch_into_fp32():
    """torch's weight pass (stage_backward_weight) writes dW to p.grad past the master-weights hook; the wrapped
    pass folds it into the fp32 main_grad at once, so micro-batches add up in fp32 rather than in bf16."""
    from parallel_layers.pipeline import just_in_time_receives
    from parallel_layers.precision import attach_main_grads

    lin = nn.Linear(4, 4, bias=False).to(torch.bfloat16)
    attach_main_grads(lin.parameters())

    class FakeStage:
        submod = lin
        args_recv_info, grad_recv_info = {}, {}

        def _prepare_forward_infra(self, *a, **k): pass
        def _prepare_backward_infra(self, *a, **k): pass
        def get_fwd_recv_ops(self, chunk): return []
        def get_bwd_recv_ops(self, chunk): return []
        def backward_one_chunk(self, chunk, *a, **k): pass

        def backward_weight_one_chunk(self, chunk, *a, **k):  # as torch does: p.grad = dW or p.grad += dW
            g = torch.full((4, 4), 256.0 if chunk == 0 else 1.0, dtype=torch.bfloat16)
            lin.weight.grad = g if lin.weight.grad is None else lin.weight.grad + g

    stage = just_in_time_receives(FakeStage())
    for chunk in range(4):
        stage.backward_weight_one_chunk(chunk)
    w = lin.weight
    # 256 + 1 + 1 + 1 in fp32; summed in bf16 (8 significant bits: steps of 2 above 256) it would read 256
    assert w.grad is None and w.main_grad.dtype == torch.float32
    assert torch.equal(w.main_grad, torch.full((4, 4), 259.0))


def test_checkpoint_of_a_rank_holding_both_tied_ends(tmp_path):
    """ZB-V puts the first and the last stage on pipeline rank 0: the embedding and the head's copy of it carry
    one key.  The checkpoint saves it once (it had lost the embedding and then failed on its optimizer state)
    and a load gives both the saved values and AdamW state."""
    from parallel_layers import checkpoint
    from parallel_layers.model import StageModule, init_parameters
    plan = tiny_plan(TINY_GPT)  # tied
    cfg = ModelConfig.from_plan(plan)
    first = StageModule(cfg, [0], first=True, last=False, tp_group=None)
    last = StageModule(cfg, [1], first=False, last=True, tp_group=None)
    assert last.separate_tied_head
    stages = [first, last]
    for m in stages:
        init_parameters(m, 0)
    params = list({id(p): p for m in stages for p in m.parameters()}.values())
    opt = torch.optim.AdamW(params, lr=1e-2)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    saved = {k: v.detach().clone() for k, v in checkpoint.keyed_parameters(stages).items()}
    checkpoint.save(str(tmp_path), 1, stages, opt)
    with torch.no_grad():
        for p in params:
            p.add_(1.0)
    for st in opt.state.values():
        st["exp_avg"].zero_()
    assert checkpoint.load(checkpoint.latest(str(tmp_path)), stages, opt) == 1
    emb, head = first.embed.weight, last.head.weight
    assert torch.equal(emb, saved["embedding.weight"]) and torch.equal(head, emb)
    assert torch.equal(opt.state[head]["exp_avg"], opt.state[emb]["exp_avg"]) and opt.state[emb]["exp_avg"].abs().sum() > 0


def test_a_checkpoint_of_another_model_is_named_before_and_at_the_load(tmp_path):
    """A checkpoint resumes in any layout of the model it was saved with, and no other: launch's pre-flight reads
    its layers and hidden size from DCP's metadata (a plan with fewer layers had loaded the first ones silently),
    and a load that fails anyway says why (DCP's own exception named only the failing ranks)."""
    from parallel_layers import checkpoint
    from planner.launch import check_resume, checkpoint_model_shape
    plan = tiny_plan(TINY_LLAMA)
    cfg = ModelConfig.from_plan(plan)

    def stage(layers):
        m = StageModule(cfg, list(range(layers)), first=True, last=True, tp_group=None)
        init_parameters(m, 0)
        return [m], torch.optim.AdamW(m.parameters(), lr=1e-2)

    two, opt = stage(2)
    checkpoint.save(str(tmp_path), 1, two, opt)
    path = checkpoint.latest(str(tmp_path))
    assert checkpoint_model_shape(path) == (2, cfg.hidden)
    model = plan.model

    def other(**update):
        return plan.model_copy(update={"model": model.model_copy(update=update)})

    c = check_resume(str(tmp_path), None, 5, tp=1, plan=other(layers=3))
    assert not c.ok and "2 layers" in c.detail and "3 layers" in c.detail
    assert check_resume(str(tmp_path), None, 5, tp=1, plan=other(layers=2)).ok
    # the rest of the shape, which the layers and hidden size miss (each had failed inside every rank, and a
    # tied plan had loaded an untied checkpoint without its head)
    for update, words in (({"tied_embeddings": True}, "untied"), ({"kv_heads": 4}, "layers.0."),
                          ({"ffn_hidden": 96}, "96"), ({"vocab": 300}, "embedding.weight is 256x64")):
        c = check_resume(str(tmp_path), None, 5, tp=1, plan=other(layers=2, **update))
        assert not c.ok and "another model" in c.detail and words in c.detail, (update, c.detail)
    three, opt3 = stage(3)
    with pytest.raises(RuntimeError, match="failed to load: .*layers.2"):
        checkpoint.load(path, three, opt3)


def test_a_checkpoint_records_its_vocabulary_which_padding_hides_from_the_shapes(tmp_path):
    """Vocabularies 254 and 256 pad to the same 256 rows at tp 4, so a checkpoint's shapes cannot tell them apart
    (the resume check had passed such a pair).  The checkpoint records the logical vocabulary ("meta.vocab"):
    launch's pre-flight names the difference, and a load that gets past it refuses too.  Simulated at tp 1 by a
    256-row model whose config says 254, as a tp-4 checkpoint of a 254-token model would hold."""
    import dataclasses

    from parallel_layers import checkpoint
    from planner.launch import check_resume, checkpoint_vocab
    plan = tiny_plan(TINY_LLAMA)
    cfg = ModelConfig.from_plan(plan)
    m = StageModule(cfg, list(range(cfg.layers)), first=True, last=True, tp_group=None)
    init_parameters(m, 0)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    for p in m.parameters():
        p.grad = torch.ones_like(p)
    opt.step()  # the optimizer's states, which a load reads too
    checkpoint.save(str(tmp_path / "same"), 1, [m], opt)
    assert checkpoint_vocab(checkpoint.latest(str(tmp_path / "same"))) == cfg.vocab == 256
    assert check_resume(str(tmp_path / "same"), None, 5, tp=1, plan=plan).ok
    m.cfg = dataclasses.replace(cfg, vocab=254)
    checkpoint.save(str(tmp_path / "near"), 1, [m], opt)
    c = check_resume(str(tmp_path / "near"), None, 5, tp=1, plan=plan)
    assert not c.ok and "a vocabulary of 254 tokens, and the plan's has 256" in c.detail, c.detail
    m.cfg = cfg
    with pytest.raises(RuntimeError, match="254-token vocabulary and this run's has 256"):
        checkpoint.load(checkpoint.latest(str(tmp_path / "near")), [m], opt)
    # a checkpoint written before the vocabulary was recorded still resumes (nothing to compare)
    import torch.distributed.checkpoint as dcp
    old = checkpoint.state_dict([m], opt, 1)
    old["meta"].pop("vocab")
    dcp.save(old, checkpoint_id=checkpoint.step_path(str(tmp_path / "old"), 1))
    assert checkpoint_vocab(checkpoint.latest(str(tmp_path / "old"))) is None
    assert check_resume(str(tmp_path / "old"), None, 5, tp=1, plan=plan).ok
    assert checkpoint.load(checkpoint.latest(str(tmp_path / "old")), [m], opt) == 1


def test_a_checkpoints_tp_shards_are_scaled_back_to_the_logical_shape(monkeypatch):
    """checkpoint_model_mismatch reads a TP shard's key ("@tp{r}of{t}") at t times its size along the split
    dimension, and the padded vocabulary's rows as the logical vocabulary: a tp=4 checkpoint of the plan's own
    model agrees, one of a wider MLP does not."""
    import planner.launch as L
    plan = tiny_plan(TINY_LLAMA)
    full = L.plan_parameter_shapes(plan)

    def saved(t, change=None):
        out = {}
        for name, (shape, d) in full.items():
            shape = list(change.get(name, shape) if change else shape)
            if d is None:
                out[name] = tuple(shape)
                continue
            shape[d] = -(-shape[d] // t)  # padded, then split
            for r in range(t):
                out[f"{name}@tp{r}of{t}"] = tuple(shape)
        return out

    vocab = TINY_LLAMA["vocab"]
    plan = plan.model_copy(update={"model": plan.model.model_copy(update={"vocab": vocab - 2})})  # pads at tp 4
    full = L.plan_parameter_shapes(plan)
    assert full["embedding.weight"][0][0] == vocab - 2
    monkeypatch.setattr(L, "_checkpoint_shapes", lambda path: saved(4))
    assert L.checkpoint_model_mismatch("x", plan) is None
    wide = {n: (s[0] * 2,) + tuple(s[1:]) for n, (s, d) in full.items() if ".mlp." in n and d == 0}
    assert wide
    monkeypatch.setattr(L, "_checkpoint_shapes", lambda path: saved(4, wide))
    said = L.checkpoint_model_mismatch("x", plan)
    name = min(wide)  # the first differing parameter, at its logical size (its shards' rows x 4), not a shard's
    assert said.startswith(f"{name} is {'x'.join(map(str, wide[name]))} in the checkpoint"), said


def test_a_stage_outputs_send_is_waited_on_and_dropped_at_its_backward(monkeypatch):
    """release_output_sends: torch's runtime gets a handle for each forward send (the runtime keeps it to the
    step's end); the work itself, which holds the sent tensor, is waited on right after that micro-batch's
    backward and dropped; the handle's own wait is then a no-op.  Sends without the stage's mark (gradient
    sends, other schedules) pass through untouched."""
    import gc
    import weakref

    import torch.distributed.pipelining.schedules as S
    from parallel_layers import pipeline as PL

    class Work:
        def __init__(self):
            self.waits = 0

        def wait(self):
            self.waits += 1
            return True

        def is_completed(self):
            return self.waits > 0

    made = []

    def fake_batch_p2p(ops, desc=None):
        made.extend(Work() for _ in ops)
        return made[-len(ops):]

    monkeypatch.setattr(S, "_batch_p2p", fake_batch_p2p)
    monkeypatch.setattr(PL, "_SEND_REGISTRY", {})

    class Stage:
        def get_fwd_send_ops(self, chunk):
            return [object(), object()]  # two sends (to two peers)

        def backward_one_chunk(self, chunk, *a, **k):
            return chunk

    stage = PL.release_output_sends(Stage())
    handles = S._batch_p2p(stage.get_fwd_send_ops(3))  # what torch's runtime does for SEND_F
    assert all(isinstance(h, PL._HeldSend) for h in handles) and len(handles) == 2
    plain = S._batch_p2p([object()])  # an unmarked batch: the real works
    assert plain == [made[-1]]
    first = weakref.ref(made[0])
    assert stage.backward_one_chunk(3) == 3
    assert [w.waits for w in made[:2]] == [1, 1] and PL._SEND_REGISTRY == {}
    del made[:2]
    gc.collect()
    assert first() is None  # nothing but the registry held the work: gone with it
    assert all(h.wait() and h.is_completed() for h in handles)  # the runtime's drain: nothing left to wait on


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
@pytest.mark.parametrize("average", [True, False])
def test_bucketed_all_reduce_reduces_a_large_gradient_in_place_and_bounds_the_flat_copy(monkeypatch, backend, average):
    """all_reduce_bucketed on a (faked) group of two: every tensor comes back summed or averaged; a tensor of
    BUCKET_BYTES or more is reduced alone and, on NCCL, in its own storage (no flat copy of it); every flat
    bucket stays within BUCKET_BYTES (the memory model counts two of them in flight,
    cost_models.memory._other_bytes)."""
    from parallel_layers import data_parallel as DP

    calls = []

    class Done:
        def wait(self):
            pass

    def fake_all_reduce(t, group=None, async_op=False):
        calls.append((t.data_ptr(), t.numel() * t.element_size()))
        t.mul_(2)  # two ranks holding the same values
        return Done() if async_op else None

    monkeypatch.setattr(DP, "BUCKET_BYTES", 4096)
    monkeypatch.setattr(DP, "_group_size", lambda group: 2)
    monkeypatch.setattr(dist, "all_reduce", fake_all_reduce)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: backend)
    sizes = [100, 300, 1500, 200, 5000, 700, 900, 40, 1024, 3]  # fp32 elements: 1500, 5000 and 1024 are >= 4096 B
    tensors = [torch.randn(n) for n in sizes]
    before = [t.clone() for t in tensors]
    large = {t.data_ptr(): t.numel() * 4 for t in tensors if t.numel() * 4 >= 4096}
    assert len(large) == 3
    DP.all_reduce_bucketed(tensors, group=object(), average=average)
    for t, b in zip(tensors, before):
        torch.testing.assert_close(t, b if average else 2 * b)
    assert sum(nbytes for _, nbytes in calls) == sum(sizes) * 4  # each element reduced once
    assert all(nbytes <= 4096 for ptr, nbytes in calls if nbytes not in large.values())
    alone = [(ptr, nbytes) for ptr, nbytes in calls if nbytes in large.values()]
    assert sorted(nbytes for _, nbytes in alone) == sorted(large.values())  # each large one reduced alone
    if backend == "nccl":
        assert {ptr for ptr, _ in alone} == set(large)  # in its own storage


@pytest.mark.parametrize("vocab", [None, 45])
def test_fused_cross_entropy_is_the_autograd_loss_in_chunks(vocab, monkeypatch):
    """layers.fused_vocab_parallel_cross_entropy (flash-attn's cross-entropy in torch): the value and the gradient
    of F.cross_entropy over the fp32 logits, with the rows upcast a chunk at a time (here 3 rows of 50) and the
    padding columns past the vocabulary masked out of the softmax with a zero gradient."""
    from parallel_layers import layers
    monkeypatch.setattr(layers, "CE_CHUNK_BYTES", 3 * 50 * 4)
    g = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(4, 5, 50, generator=g)).requires_grad_()
    t = torch.randint(0, vocab or 50, (4, 5), generator=g)
    x0 = x.detach().clone()
    loss = layers.fused_vocab_parallel_cross_entropy(x, t, None, vocab)
    (2.0 * loss).backward()
    assert torch.equal(x.detach(), x0)  # the logits are read, never written
    got = x.grad.clone()
    x.grad = None
    v = vocab or 50
    ref = torch.nn.functional.cross_entropy(x[..., :v].reshape(-1, v), t.reshape(-1))
    (2.0 * ref).backward()
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=1e-6)
    assert torch.allclose(got, x.grad, atol=1e-7)
    assert torch.count_nonzero(got[..., v:]) == 0


def test_fused_cross_entropy_keeps_16_bit_logits_and_gradient():
    """It saves the 16-bit logits and per-row fp32 statistics only (the memory model's 2 B per logit saved, and
    2 x 2 at the backward: cost_models.memory.logits_bytes), and its gradient is bf16, within bf16 rounding of
    the fp32 loss's."""
    from parallel_layers import layers
    g = torch.Generator().manual_seed(1)
    x = (3 * torch.randn(2, 64, 512, generator=g)).to(torch.bfloat16).requires_grad_()
    t = torch.randint(0, 512, (2, 64), generator=g)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda s: saved.append(s.numel() * s.element_size()) or s,
                                                  lambda s: s):
        loss = layers.fused_vocab_parallel_cross_entropy(x, t, None)
    rows = 2 * 64
    assert sum(saved) == x.numel() * 2 + rows * (4 + 4 + 8 + 1)  # logits; both log-sum-exps, target column, mask
    loss.backward()
    assert x.grad.dtype == torch.bfloat16
    xf = x.detach().float().requires_grad_()
    torch.nn.functional.cross_entropy(xf.reshape(-1, 512), t.reshape(-1)).backward()
    assert (x.grad.float() - xf.grad).abs().max() <= 2 ** -8 * xf.grad.abs().max()


@pytest.mark.parametrize("vocab", [50, 9])
def test_fused_cross_entropy_over_four_tp_ranks(tmp_path, vocab):
    """Over tp 4 (gloo), the vocabulary padded to a multiple of 4 (50 -> 52; 9 -> 12, where the last rank holds
    padding only), in several chunks of rows, with an incoming gradient of 2.5: each rank's loss and its slice
    of the gradient are F.cross_entropy's over the whole unpadded logits (fp32 to 1e-6, bf16 within its
    rounding, the gradient in bf16)."""
    from tests.runtime_helpers.ce_ranks import worker
    from tests.runtime_helpers.two_ranks import spawn_on_a_free_port
    out = str(tmp_path / "ce")
    spawn_on_a_free_port(worker, lambda port: (port, 4, vocab, out), 4)
    for r in range(4):
        res = json.loads(open(f"{out}.{r}").read())
        f32, b16 = res["torch.float32"], res["torch.bfloat16"]
        assert f32["loss"] == pytest.approx(f32["ref"], rel=1e-6)
        assert f32["grad_err"] <= 1e-6 * f32["grad_max"]
        assert b16["loss"] == pytest.approx(b16["ref"], rel=1e-3)
        assert b16["grad_err"] <= 2 ** -7 * b16["grad_max"] and b16["grad_dtype"] == "torch.bfloat16"


def test_fused_cross_entropy_takes_strided_logits_and_needs_no_pivot_column():
    """Dense but transposed logits (the gradient is made contiguous), and a row whose first logit is -inf or far
    below the others (the log-sum-exp is read at the row's largest logit)."""
    from parallel_layers import layers
    g = torch.Generator().manual_seed(2)
    base = torch.randn(6, 2, 40, generator=g, requires_grad=True)
    z = base.transpose(0, 1)
    t = torch.randint(0, 40, (2, 6), generator=g)
    layers.fused_vocab_parallel_cross_entropy(z, t, None).backward()
    ref = base.detach().clone().requires_grad_()
    F.cross_entropy(ref.transpose(0, 1).reshape(-1, 40), t.reshape(-1)).backward()
    assert torch.allclose(base.grad, ref.grad, atol=1e-7)
    x = torch.randn(3, 40, generator=g)
    x[0, 0], x[1, 0] = float("-inf"), -1e6
    t = torch.tensor([5, 7, 9])
    got = layers.fused_vocab_parallel_cross_entropy(x.unsqueeze(0), t.unsqueeze(0), None)
    assert float(got) == pytest.approx(float(F.cross_entropy(x, t)), rel=1e-6)


def test_loss_scaler_follows_torch_gradscalers_rule(group_of_one):
    """parallel_layers.loss_scale: halve on an overflow (and restart the count), double after growth_interval good
    steps in a row; the check unscales in place and finds an inf or NaN in any dtype; a bad setting is refused."""
    from parallel_layers.loss_scale import DynamicLossScaler
    s = DynamicLossScaler(init_scale=8.0, growth_interval=3)
    for found, want in [(False, 8), (False, 8), (True, 4), (False, 4), (False, 4), (False, 8), (False, 8)]:
        s.update(found)
        assert s.scale == want
    assert s.skipped == 1 and s.state() == {"scale": 8.0, "good_steps": 1}
    t = DynamicLossScaler()
    t.load(s.state())
    assert (t.scale, t.good_steps) == (8.0, 1)
    g32, g16 = torch.full((3,), 8.0), torch.full((2,), 8.0, dtype=torch.float16)
    assert s.unscale_([g32, g16], torch.device("cpu")) is False
    assert g32.tolist() == [1.0] * 3 and g16.tolist() == [1.0] * 2
    for bad in (float("inf"), float("nan")):
        assert s.unscale_([torch.ones(2), torch.tensor([1.0, bad], dtype=torch.float16)], torch.device("cpu")) is True
    with pytest.raises(ValueError, match="growth_interval"):
        DynamicLossScaler(growth_interval=0)


def test_train_cli_takes_an_initial_loss_scale():
    from parallel_layers import train
    a = train.parse_args(["--plan", "p.json", "--initial-loss-scale", "4294967296"])
    assert train.options_from_args(a).initial_loss_scale == 2.0 ** 32
    assert train.options_from_args(train.parse_args(["--plan", "p.json"])).initial_loss_scale is None
    for bad in ("0", "-1", "inf", "nan"):
        with pytest.raises(SystemExit):
            train.parse_args(["--plan", "p.json", "--initial-loss-scale", bad])


@pytest.mark.parametrize("fused", [False, True], ids=["autograd-loss", "fused-loss"])
def test_the_logits_are_freed_once_their_gradient_is_made_and_nothing_changes(fused):
    """model.free_after_grad: the last stage's logits lose their storage when the loss's backward has made their
    gradient (a pipeline schedule's references would otherwise keep them through the blocks' backward); the fused
    loss, which saves them for its backward, has read them by then.  The gradients are those of a run that keeps
    them."""
    from parallel_layers.layers import fused_vocab_parallel_cross_entropy
    ce = fused_vocab_parallel_cross_entropy if fused else vocab_parallel_cross_entropy
    ids = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(0))
    grads, storages = [], []
    for free in (False, True):
        m = _stage(TINY_LLAMA, "none")
        m.free_logits_after_grad = free
        logits = m(ids[:, :-1])
        ce(logits, ids[:, 1:], None, None).backward()
        storages.append(logits.untyped_storage().nbytes())
        grads.append([p.grad.clone() for p in m.parameters()])
    assert storages[0] == 2 * 32 * 256 * 4 and storages[1] == 0
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_expert_checkpoints_key_each_expert_and_read_the_older_keys(tmp_path, monkeypatch):
    """A mixture of experts' expert weights and AdamW states are saved one key per expert ("@expert{g}", so any ep
    loads them: launch no longer binds the resume to the saved ep), and load back exactly; a checkpoint written with
    the older keys (an ep rank's stack, at ep 1 the plain name) still loads."""
    from parallel_layers import checkpoint
    from parallel_layers.checkpoint_steps import saved_ep
    plan = tiny_plan({**TINY_LLAMA, "experts": 4, "experts_per_token": 2, "ffn_hidden": 64})
    cfg = ModelConfig.from_plan(plan)
    m = StageModule(cfg, [0, 1], first=True, last=True, tp_group=None)
    init_parameters(m, 0)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    for p in m.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    keys = checkpoint.state_dict([m], opt, 1)
    experts = [k for k in keys["model"] if "@expert" in k]
    assert len(experts) == 2 * 3 * 4 and not any("@ep" in k for k in keys["model"])  # 2 blocks x gate/up/down x 4
    assert sum(k.endswith("/exp_avg") and "@expert" in k for k in keys["optim"]) == 2 * 3 * 4
    saved = {k: v.detach().clone() for k, v in m.named_parameters()}
    moments = {k: opt.state[p]["exp_avg"].clone() for k, p in m.named_parameters()}
    original = checkpoint._per_expert

    def perturb():
        with torch.no_grad():
            for p in m.parameters():
                p.add_(1.0)
                opt.state[p]["exp_avg"].zero_()

    for legacy in (False, True):
        d = tmp_path / ("legacy" if legacy else "per-expert")
        if legacy:  # the keys before per-expert ones
            monkeypatch.setattr(checkpoint, "_per_expert", lambda sd, loading, legacy_ep=False: original(sd, loading, True))
        path = checkpoint.save(str(d), 1, [m], opt)
        monkeypatch.setattr(checkpoint, "_per_expert", original)
        assert saved_ep(path) == (1 if legacy else None)
        perturb()
        assert checkpoint.load(path, [m], opt) == 1
        for k, p in m.named_parameters():
            assert torch.equal(p, saved[k]), (legacy, k)
            assert torch.equal(opt.state[p]["exp_avg"], moments[k]), (legacy, k)


@pytest.mark.parametrize("rms", [True, False], ids=["rmsnorm", "layernorm"])
def test_whole_width_norms_match_torch_norms_on_one_rank(rms):
    """_WholeWidthNorms (ModelConfig.qk_norm_whole) on a group of one: each of q and k normed over its whole last
    dimension, as torch's rms_norm / layer_norm of that width (OLMo 2's q_norm of heads x head_dim), forward and, by
    gradcheck in float64, backward."""
    from parallel_layers.model import NORM_EPS, _WholeWidthNorms
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 3, n, dtype=torch.float64, generator=g, requires_grad=True) for n in (8, 4))
    wq, wk = (torch.randn(n, dtype=torch.float64, generator=g, requires_grad=True) for n in (8, 4))
    bq, bk = (None, None) if rms else (torch.randn(n, dtype=torch.float64, generator=g, requires_grad=True)
                                       for n in (8, 4))

    def norms(*a):
        return _WholeWidthNorms.apply(a[0], a[1], a[2], a[3], bq if rms else a[4], bk if rms else a[5], None, (8, 4),
                                      rms)
    inputs = (q, k, wq, wk) + (() if rms else (bq, bk))
    assert torch.autograd.gradcheck(norms, inputs)
    yq, yk = norms(*inputs)
    for y, x, w, b in ((yq, q, wq, bq), (yk, k, wk, bk)):
        ref = F.rms_norm(x, (x.shape[-1],), w, NORM_EPS) if rms else F.layer_norm(x, (x.shape[-1],), w, b, NORM_EPS)
        torch.testing.assert_close(y, ref)


def test_norms_after_put_the_two_norms_on_the_sublayers_outputs():
    """ModelConfig.norms_after (OLMo 2 / 3, EXAONE 4): no input norms, a norm on each sublayer's output before its
    residual add: block(x) = x1 + post_norm2(mlp(x1)), x1 = x + post_norm1(attention(x))."""
    m = _stage({**TINY_LLAMA, "norms_after": True}, "none")
    blk = m.blocks[0]
    assert blk.norm1 is None and blk.norm2 is None and blk.post_norm1 is not None and blk.post_norm2 is not None
    x = torch.randn(2, 16, TINY_LLAMA["hidden"], generator=torch.Generator().manual_seed(3))
    x1 = x + blk.post_norm1(blk.attn(x))
    torch.testing.assert_close(blk(x), x1 + blk.post_norm2(blk.mlp(x1)))
