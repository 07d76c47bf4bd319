"""Run a worker on two gloo ranks in spawned processes and read back what each rank wrote.

The worker is called as worker(rank, port, *args, out) and writes its JSON results to f"{out}.{rank}"."""
from __future__ import annotations

import json
from pathlib import Path

import torch.multiprocessing as mp

from planner.calibrate import PORT_TRIES, free_port, spawn_on_a_free_port as _spawn  # noqa: F401 (re-exported)
# The ranks fork from a server process that imported torch and the runtime once (multiprocessing's forkserver,
# started at the first spawn and kept for the process's life), instead of each starting Python and importing them
# (~3 s a rank on this 2-core machine, 2026-12-06)
mp.set_forkserver_preload(["torch", "torch.distributed", "parallel_layers.train"])


def spawn_on_a_free_port(worker, args_for_port, nprocs: int) -> None:
    """planner.calibrate's spawner (a port taken before rank 0 binds it: a fresh one), forked from the forkserver."""
    _spawn(worker, args_for_port, nprocs, start_method="forkserver")


def run_two(worker, out: Path, *args) -> list[dict]:
    spawn_on_a_free_port(worker, lambda port: (port, *args, str(out)), 2)
    return [json.loads(Path(f"{out}.{r}").read_text()) for r in (0, 1)]
