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


def saved_tp(path: str) -> int | None:
    """The tensor-parallel size a checkpoint binds a resume to, from its key names and without torch: None where any
    tp loads it (its TP shards saved as pieces of the logical tensor under their logical names,
    parallel_layers.checkpoint._as_logical; a tp-1 checkpoint, whose tensors are the logical ones; or the file cannot
    be read); else, written before tp-independent keys, the tp its TP shards' keys name ("@tp{rank}of{tp}"), DCP's
    .metadata pickle holding the keys as plain strings."""
    return _saved_split(path, rb"@tp\d+of(\d+)", none_found=None)


def saved_ep(path: str) -> int | None:
    """The expert-parallel size a mixture of experts' checkpoint binds a resume to: None where any ep loads it (its
    experts keyed one by one, "@expert{g}", parallel_layers.checkpoint._per_expert; or the file cannot be read);
    else, written before per-expert keys, the ep its keys name ("@ep{rank}of{ep}"), 1 where none does (a dense model,
    or ep 1)."""
    try:
        with open(os.path.join(path, ".metadata"), "rb") as f:
            if re.search(rb"@expert\d+", f.read()):
                return None
    except OSError:
        return None
    return _saved_split(path, rb"@ep\d+of(\d+)")


def _saved_split(path: str, pattern: bytes, none_found: int | None = 1) -> int | None:
    try:
        with open(os.path.join(path, ".metadata"), "rb") as f:
            data = f.read()
    except OSError:
        return None
    sizes = {int(t) for t in re.findall(pattern, data)}
    return max(sizes) if sizes else none_found
