"""Run under torchrun (4 ranks, gloo): FSDP2's all-gathers per unit and step inside parplan's pipeline runtime.

pp 2 x dp 2, ZeRO-3, 4 micro-batches a step, under 1F1B and interleaved 1F1B (2 chunks a rank): the runtime is
built as `parplan launch` builds it (parallel_layers.train.build_runtime) and trained two steps; the second step's
forward-backward and gradient reduction run under the profiler.  Prints one JSON line on rank 0:
{schedule: [{unit name: all-gathers in that step} for each rank]} from FSDP2's own profiler ranges (a unit's range
is "FSDP::all_gather (<module>)", the stage root's has no module name)."""
import collections
import sys

import torch
import torch.distributed as dist

from parallel_layers import train
from tests.runtime_helpers.fsdp2_gathers import finish
from tests.runtime_helpers.plans import TINY_LLAMA, tiny_plan

SCHEDULES = {"1f1b": 1, "interleaved-1f1b": 2}


def _step(rt, plan, opts, data, indices, step):
    rt.optimizer.zero_grad(set_to_none=True)
    inputs, targets = data.batch(step, indices)
    train.forward_backward(rt, inputs, targets)
    train.reduce_gradients(rt, opts)
    rt.optimizer.step()


def main() -> int:
    dist.init_process_group("gloo")
    out = {}
    for schedule, vpp in SCHEDULES.items():
        plan = tiny_plan(TINY_LLAMA, tp=1, pp=2, dp=2, zero_stage=3, schedule=schedule, vpp=vpp)
        assert plan.training.num_microbatches == 4
        opts = train.RunOptions(steps=2, device="cpu")
        rt = train.build_runtime(plan, opts, torch.device("cpu"))
        data = train.TokenSource(plan.model.vocab, plan.training.seq_len, plan.training.seed, None, None)
        indices = train.replica_sample_indices(rt.coords.dp_rank, plan.training.micro_batch_size,
                                               plan.training.num_microbatches)
        _step(rt, plan, opts, data, indices, 1)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            _step(rt, plan, opts, data, indices, 2)
        counts = collections.Counter(e.name for e in prof.events() if e.name.startswith("FSDP::all_gather"))
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, dict(counts))
        out[schedule] = ranks
    return finish("FSDP2_PIPELINE_GATHERS", out)


if __name__ == "__main__":
    sys.exit(main())
