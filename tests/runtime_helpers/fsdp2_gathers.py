"""Run under torchrun (2 ranks, gloo): FSDP2 all-gathers per block and step, for each recompute mode.

Three parplan llama blocks under a root, sharded as the runtime shards a stage (data_parallel.apply_fsdp); the
blocks run plain, under full recompute (non-reentrant checkpoint around each) and under op-level selective
checkpointing (inside each block's forward, as the runtime builds it).  Prints one JSON line
on rank 0: {mode: {block or "root": all-gathers in the second step}} from FSDP2's own profiler ranges (the root
holds the head: FSDP2 keeps it gathered from the forward to the backward, one gather a step)."""
import collections
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.utils.checkpoint import checkpoint

from parallel_layers.data_parallel import apply_fsdp
from parallel_layers.model import Block, ModelConfig, init_parameters

MODES = ("none", "full", "selective-op")


class Root(torch.nn.Module):
    def __init__(self, cfg, mode):
        super().__init__()
        self.mode = mode
        # op-level selective checkpointing is inside Block.forward, as in parplan's runtime
        self.blocks = torch.nn.ModuleList([Block(cfg, i, None, False, "selective-op" if mode == "selective-op" else "none")
                                           for i in range(cfg.layers)])
        self.head = torch.nn.Linear(cfg.hidden, cfg.hidden)

    def forward(self, h):
        for b in self.blocks:
            h = checkpoint(b, h, use_reentrant=False) if self.mode == "full" else b(h)
        return self.head(h)


def main() -> int:
    dist.init_process_group("gloo")
    cfg = ModelConfig(arch="llama", layers=3, hidden=64, heads=4, kv_heads=2, ffn_hidden=128, vocab=64, head_dim=16,
                      tied_embeddings=False, max_seq_len=16)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    out = {}
    for mode in MODES:
        root = Root(cfg, mode)
        init_parameters(root.blocks, 0)
        apply_fsdp([root], mesh)  # as the runtime shards a stage (parallel_layers.data_parallel)
        x = torch.randn(2, 16, cfg.hidden, requires_grad=True)
        for _ in range(2):  # the second step is counted
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                root(x).sum().backward()
        names = collections.Counter(e.name for e in prof.events())
        out[mode] = {f"blocks.{i}": names.get(f"FSDP::all_gather (blocks.{i})", 0) for i in range(cfg.layers)}
        out[mode]["root"] = names.get("FSDP::all_gather", 0)  # the root unit's range has no module name
    return finish("FSDP2_GATHERS", out)


def finish(tag: str, out) -> int:
    """Print `tag` and the counts as one JSON line on rank 0 (what the test reads), then leave the group."""
    if dist.get_rank() == 0:
        print(f"{tag} " + json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
