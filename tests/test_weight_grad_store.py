"""Zero-bubble weight passes from queued closures (parallel_layers.layers.WeightGradStore), on one process
(recomputation off, full and op-level selective): the input-gradient pass makes no linear weight gradient, the weight pass makes
exactly autograd's, a checkpointed block's forward runs again once (torch's own weight pass re-ran it once per
parameter group, pytorch/pytorch#136766), and what the queue held is freed once the weight pass has run.  The
pipelined runs (8 gloo ranks, with SP and master weights) are in tests/test_runtime_multirank.py, their memory
in tests/test_runtime_memory.py."""
from __future__ import annotations

import gc
import itertools
import weakref

import numpy as np
import pytest
import torch

import parallel_layers.layers as L
import parallel_layers.model as M
from cost_models.layout import RECOMPUTE, SCHEDULES, Layout
from cost_models.memory import queued_weight_pass
from parallel_layers.model import ModelConfig, StageModule, init_parameters, iter_shard_specs
from cost_models.compute import queued_weight_pass_plan
from parallel_layers.pipeline import weight_pass_builder
from planner.core import training_consts
from tests.runtime_helpers.plans import TINY_GPT, TINY_LLAMA, tiny_plan


def _stage(model: dict, recompute: str) -> StageModule:
    plan = tiny_plan(model)
    m = StageModule(ModelConfig.from_plan(plan), list(range(plan.model.layers)), first=True, last=True,
                    tp_group=None, recompute=recompute)
    init_parameters(m, plan.training.seed)
    return m


def _linear_weights(m) -> list[str]:
    return [n for n, mod in m.named_modules() if isinstance(mod, (L.ColumnParallelLinear, L.RowParallelLinear))
            and n.startswith("blocks.")]


@pytest.mark.parametrize("model", [TINY_LLAMA, TINY_GPT], ids=["llama", "gpt"])
@pytest.mark.parametrize("recompute", ["none", "full", "selective-op"])
def test_the_queued_weight_pass_makes_autograds_gradients(model, recompute):
    ids = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(0))
    grads = []
    for queued in (False, True):
        m = _stage(model, recompute)
        store = L.WeightGradStore()
        if queued:
            per_block = 7 if model["arch"] == "llama" else len(_linear_weights(m)) // len(m.blocks)
            assert L.defer_weight_grads(list(m.blocks), store) == len(_linear_weights(m)) == per_block * len(m.blocks)
        L.vocab_parallel_cross_entropy(m(ids[:, :-1]), ids[:, 1:], None).backward()
        weight_pass = store.take()
        if queued:  # the input-gradient pass made every gradient but the blocks' linear weights'
            made = {n for n, p, _ in iter_shard_specs(m) if p.grad is not None}
            held = {f"{n}.weight" for n in _linear_weights(m)}
            assert not made & held and made | held == {n for n, _, _ in iter_shard_specs(m)}
        weight_pass()
        assert not store.take().__closure__[0].cell_contents  # nothing left queued
        grads.append({n: p.grad.clone() for n, p, _ in iter_shard_specs(m)})
    for n, g in grads[0].items():
        torch.testing.assert_close(grads[1][n], g, rtol=1e-5, atol=1e-7)


def _middle_stage(recompute: str) -> StageModule:
    plan = tiny_plan(TINY_LLAMA)
    m = StageModule(ModelConfig.from_plan(plan), [1, 2], first=False, last=False, tp_group=None, recompute=recompute)
    init_parameters(m, plan.training.seed)
    return m


def _split_backward(m, queued: bool, runs: list):
    """One micro-batch of a middle stage through the zero-bubble split: the input-gradient pass, then the weight
    pass, as torch.distributed.pipelining runs them (stage_backward_input / stage_backward_weight) or as a stage
    with a queue runs them (an ordinary backward, then the queue's take()).  Returns the input gradient, the
    parameters' gradients, and weak references to the stage input after the input-gradient pass and to what the
    queue held."""
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 32, 64, generator=gen).requires_grad_(True)
    dy = torch.randn(2, 32, 64, generator=gen)
    forward = M.Block._forward

    def counted(block, h, key=None):
        runs.append(block.layer_id)
        return forward(block, h, key)
    M.Block._forward = counted
    try:
        store = L.WeightGradStore()
        if queued:
            L.defer_weight_grads(list(m.blocks), store)
        y = m(x)
        if queued:
            y.backward(dy)
            gx, weight_pass = x.grad, store.take()
            held = [weakref.ref(t) for fn in weight_pass.__closure__[0].cell_contents
                    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__) if name in ("grads", "x")
                    for t in (cell.cell_contents if name == "grads" else (cell.cell_contents,))]
        else:
            (gx,), groups = stage_backward_input([y], [dy], [x], m.parameters())
            held = []
            weight_pass = lambda: stage_backward_weight(m.parameters(), groups)  # noqa: E731
        del y
        x_alive = weakref.ref(x)
        del x
        gc.collect()
        input_freed = x_alive() is None  # the pipeline lets go of its received input after the I pass
        weight_pass()
        del weight_pass
    finally:
        M.Block._forward = forward
    gc.collect()
    return gx, {n: p.grad.clone() for n, p in m.named_parameters()}, input_freed, held


def test_the_queue_reruns_a_checkpointed_block_once_where_torchs_weight_pass_reruns_it_per_weight():
    """torch's weight pass re-runs each checkpointed block once per parameter group (pytorch/pytorch#136766): a llama
    block's forward runs 10 times or more for one micro-batch.  The queued pass runs it twice (the forward and the
    input-gradient pass's re-run, as 1F1B does) and makes the same gradients; after its input-gradient pass the
    stage's input is no longer referenced (the closures keep detached inputs, not the graph), and after its weight
    pass nothing it held is (in grad mode dW recorded a graph that kept every dY alive)."""
    torch_runs, queued_runs = [], []
    gx_t, g_t, _, _ = _split_backward(_middle_stage("full"), False, torch_runs)
    gx_q, g_q, input_freed, held = _split_backward(_middle_stage("full"), True, queued_runs)
    assert sorted(queued_runs) == [1, 1, 2, 2]
    assert all(torch_runs.count(i) > 4 for i in (1, 2)), torch_runs
    torch.testing.assert_close(gx_q, gx_t, rtol=1e-5, atol=1e-7)
    for n, g in g_t.items():
        torch.testing.assert_close(g_q[n], g, rtol=1e-5, atol=1e-7)
    assert input_freed
    assert len(held) > 7 * 2 and all(r() is None for r in held)


def test_op_level_selective_recompute_runs_under_the_queue_and_not_under_torchs_weight_pass():
    """Under op-level selective checkpointing torch's weight pass cannot run at all: its second backward through the
    checkpointed region is refused ("You are only allowed to backward once on any region computed under selective
    activation checkpoint").  The queued pass needs one backward."""
    with pytest.raises(RuntimeError, match="backward once"):
        _split_backward(_middle_stage("selective-op"), False, [])
    runs = []
    _, _, input_freed, held = _split_backward(_middle_stage("selective-op"), True, runs)
    assert sorted(runs) == [1, 1, 2, 2] and input_freed and all(r() is None for r in held)


def test_the_runtime_and_the_model_queue_the_same_plans():
    """cost_models.compute.queued_weight_pass_plan (which stages get a dw_builder) is cost_models.memory.
    queued_weight_pass for parplan's runtime: a zero-bubble schedule over a pipeline, ZeRO below 3; torchtitan
    (torch's own pass) never."""
    tr = training_consts(tiny_plan().training)
    titan = training_consts(tiny_plan().training.model_copy(update={"framework": "torchtitan"}))
    assert tr.zb_weight_grad_store and not titan.zb_weight_grad_store
    for schedule, recompute, pp, zero in itertools.product(SCHEDULES, RECOMPUTE, (1, 2), range(4)):
        vpp = 2 if schedule in ("zbv", "interleaved-zb", "interleaved-1f1b") else 1
        plan = tiny_plan(pp=pp, dp=2, tp=1, schedule=schedule if pp > 1 else "1f1b", vpp=vpp if pp > 1 else 1,
                         recompute=recompute, zero_stage=zero)
        par = plan.parallel
        lay = Layout(gpus=4, tp=1, pp=pp, dp=2, cp=1, vpp=par.vpp, mbs=1, zero=zero,
                     recompute=RECOMPUTE.index(recompute), sp=0, schedule=SCHEDULES.index(par.schedule), offload=0)
        want = queued_weight_pass_plan(par)
        assert want == (pp > 1 and par.schedule in ("interleaved-zb", "zbv") and zero < 3)  # the rule, by hand
        assert bool(queued_weight_pass(lay, tr)) == want, (schedule, recompute, pp, zero)
        assert not np.any(queued_weight_pass(lay, titan))
        assert (weight_pass_builder(plan, _stage(TINY_LLAMA, recompute)) is not None) == want


@pytest.mark.parametrize("recipe", ["fp32", "master-weights-fused"])
def test_the_overlapped_reduction_starts_each_bucket_in_the_pass_that_makes_its_gradients_final(recipe):
    """The data-parallel reduction (data_parallel.GradReduction, overlap on) under a queued weight pass, one stage
    of two micro-batches per step with every gradient its own bucket, its collectives recorded: in the second step
    (the first learns the order) the buckets of the parameters autograd accumulates (norms, embedding, head)
    start in the last micro-batch's input-gradient pass and those of the blocks' linear weights in its weight
    pass, whose closures run the weight-pass hooks (the weights' gradients never pass autograd's accumulation;
    without those hooks they would wait for finish()).  Under master weights with the fused GEMM the closures
    add into main_grad and leave p.grad None, and still count."""
    from parallel_layers.data_parallel import GradReduction
    from parallel_layers.precision import attach_main_grads, wgrad_fusion_kernel

    m = _stage(TINY_LLAMA, "none")
    if recipe != "fp32":
        m = m.to(torch.bfloat16)
        assert attach_main_grads(list(m.parameters()), wgrad_fusion_kernel(torch.device("cpu"), "reference"))
    names = {id(p): n for n, p in m.named_parameters()}
    linear = {f"{n}.weight" for n in _linear_weights(m)}
    phase, started = ["?"], []

    def start(bucket, divide):
        started.append((phase[0], [names[id(p)] for p in bucket]))
        return lambda: None

    red = GradReduction(list(m.parameters()), start, 2.0, None, overlap=True, bucket_bytes=1)
    store = L.WeightGradStore()
    L.defer_weight_grads(list(m.blocks), store)
    ids = torch.randint(0, 256, (2, 2, 17), generator=torch.Generator().manual_seed(0))
    for step in range(2):
        red.begin_step()
        started.clear()
        for mb in range(2):
            phase[0] = f"I{mb}"
            L.vocab_parallel_cross_entropy(m(ids[mb, :, :-1]), ids[mb, :, 1:], None).backward()
            phase[0] = f"W{mb}"
            store.take()()
        phase[0] = "finish"
        if step == 1:
            # per micro-batch: autograd runs the post-accumulate-grad hook with nothing in the input-gradient pass
            # (the Function returns no weight gradient) and the weight pass runs the weight-pass hook; the count
            # reaches the step's total in the last weight pass, which follows every input-gradient pass
            assert red.expected[id(m.blocks[0].mlp.down.weight)] == 4
        red.finish()
        for p in m.parameters():
            p.grad = None
            if hasattr(p, "main_grad"):
                p.main_grad = None
    where = {n: ph for ph, bucket in started for n in bucket}
    assert set(where) == set(names.values())
    assert {n for n, ph in where.items() if ph == "W1"} == linear
    assert {n for n, ph in where.items() if ph == "I1"} == set(names.values()) - linear
