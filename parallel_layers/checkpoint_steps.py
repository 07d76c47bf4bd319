"""Which steps a checkpoint folder holds, without torch: `parplan launch` checks `--resume` against them
before any rank starts, and the runtime (parallel_layers.checkpoint) resumes from them."""
from __future__ import annotations

import os
import re


def step_path(directory: str, step: int) -> str:
    """Where the checkpoint written after `step` goes."""
    return os.path.join(directory, f"step_{step:08d}")


def saved(directory: str) -> dict[int, str]:
    """{step: path} of every complete checkpoint under directory (step_N/.metadata, the file DCP writes
    last); empty when the folder does not exist."""
    if not directory or not os.path.isdir(directory):
        return {}
    return {int(d[5:]): os.path.join(directory, d) for d in os.listdir(directory)
            if re.fullmatch(r"step_\d+", d) and os.path.exists(os.path.join(directory, d, ".metadata"))}


def saved_steps(directory: str) -> list[int]:
    """The steps of saved(directory), oldest first."""
    return sorted(saved(directory))
