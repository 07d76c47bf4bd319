"""The data-parallel reduction started during the backward (parallel_layers.data_parallel.GradReduction) on two
gloo ranks: for ZeRO 0, 1 and 2 it gives the gradients the reduction after the backward gives, starts most of its
buckets before the step's last backward returns (none in the first step, which learns when each gradient is final),
and refuses a step whose gradients accumulated a different number of times."""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import torch

from runtime_helpers.two_ranks import run_two

STEPS, MICRO = 3, 2
STAGES = (0, 1, 2)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(6)], torch.nn.Linear(16, 4))


def _worker(rank, port, out):
    import torch.distributed as dist

    from parallel_layers import data_parallel as dp

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    world = dist.group.WORLD
    result = {}
    for stage in STAGES:
        model, ref = _model(), _model()
        params, ref_params = list(model.parameters()), list(ref.parameters())
        if stage == 0:
            start = functools.partial(lambda ps, divide: dp.bucket_all_reduce_start(
                [p.grad for p in ps if p.grad is not None], world, divide))
            ref_reduce = lambda: dp.all_reduce_bucketed([p.grad for p in ref_params], world, average=True)  # noqa: E731
            opt = ref_opt = None
        else:
            opt = dp.ShardedAdamW(params, world, stage, lr=1e-3)
            ref_opt = dp.ShardedAdamW(ref_params, world, stage, lr=1e-3)
            start, ref_reduce = opt.reduce_start, ref_opt.reduce_gradients
        in_backward = {"now": False, "during": 0, "after": 0}

        def counted(ps, divide, start=start):
            in_backward["during" if in_backward["now"] else "after"] += 1
            return start(ps, divide)
        # 16 x 16 fp32 weights are 1 KiB: buckets of 2 KiB hold a weight and its bias or two biases
        red = dp.GradReduction(params, counted, 2, world, bucket_bytes=2048)
        worst, started = 0.0, []
        for step in range(STEPS):
            g = torch.Generator().manual_seed(100 * step + rank)
            xs = [torch.randn(8, 16, generator=g) for _ in range(MICRO)]
            red.begin_step()
            in_backward.update(during=0, after=0)
            for m in (model, ref):
                for p in m.parameters():
                    p.grad = None
            for i, x in enumerate(xs):
                in_backward["now"] = i == MICRO - 1
                (model(x).square().mean() / MICRO).backward()
                in_backward["now"] = False
                (ref(x).square().mean() / MICRO).backward()
            red.finish()
            ref_reduce()
            started.append([in_backward["during"], in_backward["after"]])
            for p, q in zip(params, ref_params):
                got, want = p.grad, q.grad
                if stage == 2:  # a non-owner dropped its copy; an owner of a split piece holds it in the optimizer
                    assert (got is None) == (want is None)
                    if got is None:
                        continue
                worst = max(worst, (got - want).abs().max().item())
            if opt is not None:
                for (g1, _), (g2, _) in zip(opt.held_piece_grads(), ref_opt.held_piece_grads()):
                    worst = max(worst, (g1 - g2).abs().max().item())
                opt.zero_grad()
                ref_opt.zero_grad()
        # a step where one gradient accumulates once more than in the steps before
        red.begin_step()
        for p in params:
            p.grad = None
        x = torch.randn(8, 16)
        for _ in range(MICRO):
            (model(x).sum()).backward()
        model[0](x).sum().backward()  # the first layer only: its weight and bias accumulate a third time
        try:
            red.finish()
            refused = False
        except RuntimeError:
            refused = True
        result[stage] = {"worst": worst, "started": started, "buckets": len(red.buckets), "refused": refused}
        dist.barrier()
    Path(f"{out}.{rank}").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def test_reduction_during_the_backward_matches_the_one_after_it(tmp_path):
    by_rank = run_two(_worker, tmp_path / "out")
    for stage in ("0", "1", "2"):
        for r in by_rank:
            res = r[stage]
            assert res["worst"] < 1e-6, (stage, res)
            assert res["buckets"] >= 5, res  # 14 tensors in buckets of at most 2 KiB
            first, *later = res["started"]
            assert first == [0, res["buckets"]], res  # the first step learns, then reduces after the backward
            for during, after in later:  # every gradient is final inside the last backward() call
                assert [during, after] == [res["buckets"], 0], res
            assert res["refused"], res


def test_the_forward_waits_for_each_parts_parameters_before_using_them():
    """ZeRO-1/2's gather of the stepped parameters runs beside the next forward (ShardedAdamW.overlap_gather):
    StageModule asks param_wait for each part (embedding, positions, block, final norm, head) just before it
    runs, so every parameter of the stage is waited for, and each before the first operation that reads it."""
    from parallel_layers.model import ModelConfig, StageModule, init_parameters
    from tests.runtime_helpers.plans import TINY_GPT, TINY_LLAMA, tiny_plan

    for model in (TINY_LLAMA, TINY_GPT):
        plan = tiny_plan(model)
        cfg = ModelConfig.from_plan(plan)
        for recompute in ("none", "full"):
            m = StageModule(cfg, list(range(cfg.layers)), first=True, last=True, tp_group=None, recompute=recompute)
            init_parameters(m, plan.training.seed)
            waited, early = set(), []

            def wait(module):
                waited.update(id(p) for p in module.parameters())

            def reads(module, args):
                if not all(id(p) in waited for p in module.parameters(recurse=False)):
                    early.append(type(module).__name__)
            hooks = [sub.register_forward_pre_hook(reads) for sub in m.modules()]
            m.param_wait = wait
            x = torch.randint(0, cfg.vocab, (2, plan.training.seq_len))
            m(x).float().sum().backward()
            for h in hooks:
                h.remove()
            assert waited == {id(p) for p in m.parameters()}, (model["arch"], recompute)
            assert not early, early


def test_the_reduction_does_not_keep_the_model_alive():
    """A tensor's hooks are not traversed by the garbage collector: a hook that held the reduction (and through it
    every parameter) kept each finished run's model alive, and the CPU memory benchmark's 30 runs in one process
    grew to 6 GB a rank.  The hook holds the reduction weakly."""
    import gc
    import weakref

    from parallel_layers.data_parallel import GradReduction

    model = _model()
    alive = [weakref.ref(p) for p in model.parameters()]
    red = GradReduction(list(model.parameters()), lambda ps, divide: (lambda: None), 1, None)
    model(torch.randn(2, 16)).sum().backward()  # the hooks run while it lives
    assert red._count
    del model, red
    gc.collect()
    assert not any(r() is not None for r in alive)
