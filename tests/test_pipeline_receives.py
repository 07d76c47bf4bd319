"""parallel_layers.pipeline.just_in_time_receives on two gloo ranks: torch.distributed.pipelining's
receive buffers made when a receive is posted and dropped after that micro-batch's backward, instead
of one per micro-batch for the stage's life.  Gradients are unchanged, at most a 1F1B window of buffers
is alive at once, and none is left between steps."""
from __future__ import annotations

import json
import os
import weakref
from pathlib import Path

import torch
from runtime_helpers.two_ranks import run_two

MICROBATCHES = 16


def _worker(rank: int, port: int, jit: bool, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import Schedule1F1B

    from parallel_layers import pipeline

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.manual_seed(rank)
        mod = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh())
        stage = PipelineStage(mod, rank, 2, torch.device("cpu"))
        live: list[weakref.ref] = []
        most = [0]
        if jit:
            pipeline.just_in_time_receives(stage)
            allocate = pipeline._allocate

            def counting(infos):  # every buffer made, tracked weakly: alive until nothing holds it
                allocate(infos)
                for info in infos or ():
                    buf = getattr(info, "buffer", None)
                    if isinstance(buf, torch.Tensor) and buf.numel():
                        live.append(weakref.ref(buf))
                most[0] = max(most[0], sum(r() is not None for r in live))
            pipeline._allocate = counting
        sched = Schedule1F1B(stage, n_microbatches=MICROBATCHES, loss_fn=lambda y, t: ((y - t) ** 2).mean())
        x = torch.randn(MICROBATCHES * 2, 32, generator=torch.Generator().manual_seed(0))
        for _ in range(2):  # the second step reuses the descriptors: buffers made again
            mod.zero_grad()
            if rank == 0:
                sched.step(x)
            else:
                sched.step(target=torch.zeros(MICROBATCHES * 2, 32))
        infos = list(stage.args_recv_info.values()) + list(stage.grad_recv_info.values())
        held = sum(i.buffer.numel() for group in infos for i in group if isinstance(getattr(i, "buffer", None), torch.Tensor))
        Path(f"{out}.{rank}").write_text(json.dumps({
            "grads": [p.grad.sum().item() for p in mod.parameters()], "held_after_step": held,
            "most_live": most[0], "placeholders": sum(getattr(i, "_jit_meta", None) is not None for g in infos for i in g)}))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _run(tmp_path, jit: bool) -> list[dict]:
    return run_two(_worker, tmp_path / ("jit" if jit else "torch"), jit)


def test_just_in_time_receive_buffers(tmp_path):
    base, jit = _run(tmp_path, False), _run(tmp_path, True)
    for r in (0, 1):
        assert jit[r]["grads"] == base[r]["grads"]  # the same arithmetic, bit for bit
    # torch's own: a buffer per micro-batch kept between steps (rank 1's inputs, rank 0's output gradients)
    assert base[0]["held_after_step"] == base[1]["held_after_step"] == MICROBATCHES * 2 * 32
    # just in time: none kept, and on each rank at most two alive at once (the one being consumed and the
    # next receive posted), where torch keeps all sixteen
    assert jit[0]["held_after_step"] == jit[1]["held_after_step"] == 0
    assert jit[0]["placeholders"] == jit[1]["placeholders"] == MICROBATCHES  # every receive descriptor
    for r in (0, 1):
        assert 1 <= jit[r]["most_live"] <= 2, jit[r]


def test_a_torch_without_the_wrapped_methods_keeps_its_own_buffers():
    """A torch whose PipelineStage lacks a wrapped method gets the stage back untouched, with a warning,
    rather than a launch that fails."""
    import pytest

    from parallel_layers.pipeline import just_in_time_receives

    class Stage:  # no _prepare_backward_infra, no recv infos
        def _prepare_forward_infra(self):
            return None

    st = Stage()
    with pytest.warns(UserWarning, match="stay per micro-batch"):
        assert just_in_time_receives(st) is st
    assert st._prepare_forward_infra.__func__ is Stage._prepare_forward_infra
