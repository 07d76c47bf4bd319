"""FSDP2 gathers a block's weights twice per step (forward, and the pre-backward unshard) whether or not
the block is recomputed: the recompute runs inside the backward on the weights already gathered.  Its root
unit (parplan's and torchtitan's embedding and head) it gathers once: it does not reshard the root after the
forward.  The cost model counts exactly that for the FSDP2 frameworks (cost_models/total.py, z3_regather and
root_params), and a third gather for DeepSpeed's stage 3, which fetches again for the recompute forward."""
import json
import os
import subprocess
import sys

import pytest

from cost_models.params import param_counts
from planner.core import recommend
from planner.models import load_preset
from planner.search import Pins
from tests.runtime_helpers.suite import REPO

pytestmark = pytest.mark.multirank


def _counted(helper: str, ranks: int, tag: str) -> dict:
    """The JSON line `tag` that tests.runtime_helpers.<helper> prints on rank 0, run under torchrun on gloo."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
                        "-m", f"tests.runtime_helpers.{helper}"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    line = next(l for l in r.stdout.splitlines() if l.startswith(tag + " "))
    return json.loads(line.split(" ", 1)[1])


@pytest.fixture(scope="module")
def gathers():
    return _counted("fsdp2_gathers", 2, "FSDP2_GATHERS")


def _dp_bytes(framework: str, recompute: str) -> float:
    plan = recommend(load_preset("llama3-8b"), 8, framework=framework, seq_len=4096, global_batch_size=8,
                     pins=Pins(tp=1, pp=1, dp=8, mbs=1, zero=3, recompute=recompute, offload="none"))
    return plan.prediction.comm_bytes_per_step.dp


@pytest.mark.parametrize("mode", ["none", "full", "selective-op"])
def test_fsdp2_gathers_each_block_twice_per_step(gathers, mode):
    blocks = {k: v for k, v in gathers[mode].items() if k != "root"}
    assert set(blocks.values()) == {2} and gathers[mode]["root"] == 1, gathers[mode]
    # the cost model moves, per GPU and step, what those gathers of the bf16 weights (two of a block's, one of
    # the root's) and the one fp32 reduce-scatter of the gradients move over a ring of 8: (2 x 2 + 4) B x 7/8 of
    # every block parameter and (2 + 4) B x 7/8 of the others, whatever the recompute (one micro-batch a step
    # here); DeepSpeed's stage 3 one more gather's worth when the forward is recomputed
    c = param_counts(load_preset("llama3-8b"))
    root = c["total"] - 32 * c["per_layer"]
    assert root == c["embedding"] + c["head"] + c["final_norm"]
    want = ((2 * 2 + 4) * (c["total"] - root) + (2 + 4) * root) * 7 / 8
    assert _dp_bytes("torchtitan", mode) == pytest.approx(want, rel=1e-9)
    assert _dp_bytes("parplan", mode) == pytest.approx(want, rel=1e-9)
    if mode == "full":
        assert _dp_bytes("deepspeed", mode) > 1.2 * _dp_bytes("deepspeed", "none")


@pytest.fixture(scope="module")
def pipeline_gathers():
    return _counted("fsdp2_pipeline_gathers", 4, "FSDP2_PIPELINE_GATHERS")


@pytest.mark.parametrize("schedule, chunks", [("1f1b", 1), ("interleaved-1f1b", 2)])
def test_fsdp2_inside_a_pipeline_gathers_each_unit_once_per_step(pipeline_gathers, schedule, chunks):
    """pp 2 x dp 2, ZeRO-3, 4 micro-batches: the runtime gathers each FSDP unit once a step (its first forward),
    and the cost model counts one gather and one reduce-scatter of the stage a step; resharding after each
    forward, the runtime had gathered every unit again for each micro-batch's backward, 5 times a step (and the
    model had counted a block twice).  Interleaved, each rank's two chunks hold a block each (both named
    blocks.0), and one of them the embedding or head: the rank's one root unit with parameters."""
    expected = ({"FSDP::all_gather": 1, "FSDP::all_gather (blocks.0)": 1, "FSDP::all_gather (blocks.1)": 1}
                if chunks == 1 else {"FSDP::all_gather": 1, "FSDP::all_gather (blocks.0)": 2})
    ranks = [{k: v for k, v in counts.items() if "copy_out" not in k} for counts in pipeline_gathers[schedule]]
    assert ranks == [expected] * 4
    plan = recommend(load_preset("llama3-8b"), 16, framework="parplan", seq_len=4096, global_batch_size=64,
                     pins=Pins(tp=1, pp=2, dp=8, mbs=1, zero=3, recompute="none", offload="none", schedule="1f1b",
                               dp_replicate=1))
    c = param_counts(load_preset("llama3-8b"))
    # one gather (bf16) and one reduce-scatter (fp32) of the fullest stage's parameters a step, over a ring of 8
    stage = 16 * c["per_layer"] + max(c["embedding"], c["head"] + c["final_norm"])
    assert plan.prediction.comm_bytes_per_step.dp == pytest.approx((2 + 4) * stage * 7 / 8, rel=0.02)
