"""A worker for tests/test_runtime_units.py: the fused cross-entropy over a TP group of gloo ranks against
F.cross_entropy on the whole logits, written to f"{out}.{rank}" as JSON."""
from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F


def worker(rank: int, port: int, world: int, vocab: int, out: str) -> None:
    from parallel_layers import layers
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    layers.CE_CHUNK_BYTES = 3 * 64 * 4  # several chunks of rows
    padded = -(-vocab // world) * world
    v_local = padded // world
    g = torch.Generator().manual_seed(0)
    full = 3 * torch.randn(4, 8, padded, generator=g)
    full[..., vocab:] = 1e4  # the padding's logits are garbage and must not count
    t = torch.randint(0, vocab, (4, 8), generator=g)
    res = {}
    for dtype in (torch.float32, torch.bfloat16):
        x = full.to(dtype)[..., rank * v_local:(rank + 1) * v_local].clone().requires_grad_()
        loss = layers.fused_vocab_parallel_cross_entropy(x, t, dist.group.WORLD, vocab)
        (2.5 * loss).backward()
        ref_x = full.to(dtype).float()[..., :vocab].requires_grad_()
        ref = F.cross_entropy(ref_x.reshape(-1, vocab), t.reshape(-1))
        (2.5 * ref).backward()
        ref_g = torch.zeros(4, 8, padded)
        ref_g[..., :vocab] = ref_x.grad
        mine = ref_g[..., rank * v_local:(rank + 1) * v_local]
        res[str(dtype)] = {"loss": float(loss.detach()), "ref": float(ref.detach()),
                           "grad_err": float((x.grad.float() - mine).abs().max()),
                           "grad_max": float(ref_g.abs().max()), "grad_dtype": str(x.grad.dtype)}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()
