"""Column-parallel linears on two gloo ranks: the input gradient's collective (all-reduce; reduce-scatter
with SP) is started before the weight-gradient matmuls and waited for after them (Megatron-LM's
asynchronous one, which `async_tp_grad_comm` models), and the gradients are those of the plain
autograd pair (copy to the TP region, then F.linear; or gather the sequence, then F.linear).  The order
is the calls'; gloo itself finishes the collective at its start (parallel_layers.mappings._all_reduce_start),
NCCL runs it beside the matmuls."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from runtime_helpers.two_ranks import run_two


def _worker(rank: int, port: int, sp: bool, out: str) -> None:
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode

    from parallel_layers import layers, mappings

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        group = dist.new_group([0, 1])
        gen = torch.Generator().manual_seed(0)
        x_full = torch.randn(2, 8, 16, generator=gen)  # (b, s, h), the same on both ranks
        w_full = [torch.randn(12, 16, generator=gen), torch.randn(12, 16, generator=gen)]
        b_full = [torch.randn(12, generator=gen), None]
        dy_full = [torch.randn(2, 8, 12, generator=gen), torch.randn(2, 8, 12, generator=gen)]
        half = slice(rank * 6, rank * 6 + 6)  # this rank's output columns

        class Linear:
            def __init__(self, w, b):
                self.weight = w.clone().requires_grad_()
                self.bias = None if b is None else b.clone().requires_grad_()

        def grads(fn):
            lins = [Linear(w[half], None if b is None else b[half]) for w, b in zip(w_full, b_full)]
            x = (x_full.chunk(2, dim=1)[rank] if sp else x_full).clone().requires_grad_()
            ys = fn(x, lins)
            torch.autograd.backward(ys, [d[..., half] for d in dy_full])
            return [x.grad] + [t.grad for lin in lins for t in (lin.weight, lin.bias) if t is not None]

        def plain(x, lins):
            x = mappings.gather_from_sequence_parallel_region(x, group) if sp else mappings.copy_to_tp_region(x, group)
            return [F.linear(x, lin.weight, lin.bias) for lin in lins]

        log: list[str] = []

        class Matmuls(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func in (torch.ops.aten.mm.default, torch.ops.aten.bmm.default):
                    log.append("mm")
                return func(*args, **(kwargs or {}))

        def logged(start):
            def wrapper(*a, **k):
                log.append("start")
                finish = start(*a, **k)

                def wait():
                    log.append("wait")
                    return finish()
                return wait
            return wrapper
        layers._all_reduce_start = logged(layers._all_reduce_start)
        layers._reduce_scatter_start = logged(layers._reduce_scatter_start)

        def fused(x, lins):
            return layers.column_parallel_linears(x, lins, group, sequence_parallel=sp)

        ref = grads(plain)
        with Matmuls():
            got = grads(fused)
        Path(f"{out}.{rank}").write_text(json.dumps({
            "max_diff": max(float((a - b).abs().max()) for a, b in zip(ref, got)), "log": log}))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _run(tmp_path, sp: bool) -> list[dict]:
    return run_two(_worker, tmp_path / ("sp" if sp else "tp"), sp)


def test_input_gradient_collective_runs_beside_the_weight_gradients(tmp_path):
    for sp in (False, True):
        for r in _run(tmp_path, sp):
            assert r["max_diff"] < 1e-5, (sp, r)
            log = r["log"]  # the forward's two matmuls, then the backward's
            assert log.count("start") == 1, (sp, log)
            # the backward: both input-gradient matmuls, the collective started, both weight gradients, the wait
            assert log[log.index("start") - 2:] == ["mm", "mm", "start", "mm", "mm", "wait"], (sp, log)
