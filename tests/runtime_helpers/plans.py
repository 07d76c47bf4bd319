"""Tiny plans for runtime tests, built with planner.schema.Plan directly."""
from __future__ import annotations

from planner.schema import HardwareRef, ModelSpec, Parallel, Plan, Training

TINY_LLAMA = dict(arch="llama", layers=4, hidden=64, heads=4, kv_heads=2, ffn_hidden=128, vocab=256)
# a mixture of experts on TINY_LLAMA: 4 experts of ffn 64, top 2 (the runtime MoE tests')
TINY_MOE = {**TINY_LLAMA, "experts": 4, "experts_per_token": 2, "ffn_hidden": 64}
TINY_GPT = dict(arch="gpt", layers=4, hidden=64, heads=4, kv_heads=4, ffn_hidden=256, vocab=256, tied_embeddings=True)


def tiny_plan(model: dict | None = None, *, seq_len=32, global_batch_size=8, micro_batch_size=1, lr=1e-2,
              precision="fp32", seed=1234, clip_grad=None, fused_loss=False, dtype="bf16", dropout=False,
              document_length=None, **parallel) -> Plan:
    """A plan on `tp*pp*dp` "GPUs"; num_microbatches follows from the batch sizes.  fused_loss: predicted (and
    run) with the 16-bit-gradient fused cross-entropy.  dtype fp16: with the runtime's dynamic loss scaling.
    dropout: Megatron's GPT dropout (parallel_layers.dropout)."""
    par = Parallel(**parallel)
    nmb = global_batch_size // (par.dp * micro_batch_size)
    return Plan(
        model=ModelSpec(**(model or TINY_LLAMA)),
        hardware=HardwareRef(name="h100-sxm-80gb", gpus=par.world_size, gpus_per_node=8),
        training=Training(seq_len=seq_len, global_batch_size=global_batch_size, micro_batch_size=micro_batch_size,
                          num_microbatches=nmb, precision=precision, dtype=dtype, seed=seed, lr=lr, clip_grad=clip_grad,
                          fused_cross_entropy=fused_loss, cross_entropy_16bit_grad=fused_loss, dropout=dropout,
                          document_length=document_length),
        parallel=par,
    )


def check_card_warnings(profile: str, own: str, others: tuple[str, ...]) -> None:
    """launch's hardware check of a tp-2 plan on `profile`: no warning on a node of its own card (`own`, as
    nvidia-smi names it), a warning on each of `others`."""
    from planner import launch as L
    plan = tiny_plan(tp=2)
    plan.hardware.name = profile
    def node(gpu):
        return L.MachineInfo(torch_version="x", gpus=2, free_memory_bytes=80e9, gpu_name=gpu)
    assert "warning" not in L.check_hardware(plan, "cuda", node(own)).detail
    for other in others:
        assert "warning" in L.check_hardware(plan, "cuda", node(other)).detail, other


def write_plan(plan: Plan, path) -> str:
    with open(path, "w") as f:
        f.write(plan.model_dump_json(indent=1))
    return str(path)


def counting_token_losses(plan: Plan, tmp_path, steps: int = 6, timeout: float = 300) -> list[float]:
    """The step losses of `python -m parallel_layers.train` on one rank over a file of counting tokens (next =
    current + 1 mod 256): learnable, where synthetic uniform tokens are not, so a falling loss shows the model
    trains on what the file holds."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import numpy as np

    repo = Path(__file__).resolve().parents[2]
    tok = tmp_path / "tok.bin"
    (np.arange(100_000) % 256).astype(np.uint16).tofile(tok)
    path = write_plan(plan, tmp_path / "plan.json")
    rep = tmp_path / "report.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo)}
    subprocess.run([sys.executable, "-m", "parallel_layers.train", "--plan", path, "--steps", str(steps), "--data",
                    str(tok), "--report", str(rep)], cwd=repo, env=env, check=True, capture_output=True, timeout=timeout)
    return [s["loss"] for s in json.loads(rep.read_text())["steps"]]
