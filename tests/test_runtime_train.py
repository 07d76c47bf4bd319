"""The train entry on one rank: --data from a token file, and the report's error arithmetic."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from parallel_layers import train
from planner.schema import Prediction
from tests.runtime_helpers.plans import counting_token_losses, tiny_plan, write_plan

REPO = Path(__file__).resolve().parents[1]


def test_one_rank_training_on_a_token_file_learns(tmp_path):
    """A file of counting tokens (next = current + 1 mod V) is learnable; synthetic uniform
    tokens are not, so a falling loss shows the file is what is read."""
    losses = counting_token_losses(tiny_plan(), tmp_path, timeout=120)
    assert losses[0] == pytest.approx(np.log(256), abs=0.1)
    assert min(losses[1:]) < losses[0] - 0.3, losses


def test_report_errors_are_relative_to_the_measured_median():
    plan = tiny_plan(tp=2)
    mem = dict(weights=0, grads=0, optimizer=0, activations=0, other=0, total=3e9)
    plan.prediction = Prediction.model_validate(dict(
        memory_bytes_per_gpu=mem, step_time_s=0.5, tokens_per_s=512.0, model_tflops_per_gpu=1.0,
        hardware_tflops_per_gpu=1.0, mfu=0.3, hfu=0.3, bubble_fraction=0.0, comm_bytes_per_step={},
        amdahl=dict(parallel_fraction=1, speedup=2), fits=True))
    steps = [{"step": i, "loss": 1.0, "step_time_s": t, "tokens_per_s": 256 / t, "mfu": 0.2}
             for i, t in enumerate([9.0, 0.9, 1.0, 1.1], 1)]
    memories = [{"allocated": 1e9, "reserved": 2e9}, {"allocated": 1e9, "reserved": 1.5e9}]
    rep = train.build_report(plan, train.RunOptions(steps=4, warmup_steps=1), torch.device("cpu"), steps, memories, [1, 1],
                             comparable=True)
    assert rep["warmup_steps"] == 1 and rep["median"]["step_time_s"] == 1.0  # the 9 s warm-up step is excluded
    assert rep["error"]["step_time_s"] == pytest.approx((0.5 - 1.0) / 1.0)
    assert rep["error"]["peak_memory"] == pytest.approx((3e9 - 2e9) / 2e9)  # against the largest reserved
    assert rep["error"]["mfu"] == pytest.approx((0.3 - 0.2) / 0.2)
    assert rep["prediction"]["step_time_s"] == 0.5
    cpu = train.build_report(plan, train.RunOptions(steps=4, warmup_steps=1), torch.device("cpu"), steps, memories, [1, 1])
    assert cpu["error"] == {"step_time_s": None, "peak_memory": None, "mfu": None}  # CPU is no measurement of an H100
    assert cpu["prediction"]["step_time_s"] == 0.5


def test_report_without_prediction_has_null_errors():
    steps = [{"step": 1, "loss": 1.0, "step_time_s": 1.0, "tokens_per_s": 1.0, "mfu": None}]
    rep = train.build_report(tiny_plan(), train.RunOptions(steps=1), torch.device("cpu"), steps,
                             [{"allocated": None, "reserved": None}], [1])
    assert rep["prediction"] is None and rep["error"] == {"step_time_s": None, "peak_memory": None, "mfu": None}


def test_compiled_blocks_train_the_same_as_eager(tmp_path):
    """--compile (torch.compile per block, the GPU default for MFU) must not change the math."""
    plan = write_plan(tiny_plan(), tmp_path / "plan.json")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    losses = []
    for extra in ([], ["--compile"]):
        rep = tmp_path / f"report{len(extra)}.json"
        # the limit catches a run that hangs, not a slow compile: with a cold inductor cache the compiled run took
        # 26 s on a quiet 2-core machine, 146 s beside 9 busy processes (an 8-rank torchrun on CI's other worker)
        # and ran past the 300 s it had at 18 (2026-12-03); faulthandler_timeout (1,500 s) stays above it
        subprocess.run([sys.executable, "-m", "parallel_layers.train", "--plan", plan, "--steps", "3",
                        "--report", str(rep), *extra], cwd=REPO, env=env, check=True, capture_output=True, timeout=900)
        losses.append([s["loss"] for s in json.loads(rep.read_text())["steps"]])
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
