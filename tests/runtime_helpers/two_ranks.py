"""Run a worker on two gloo ranks in spawned processes and read back what each rank wrote.

The worker is called as worker(rank, port, *args, out) and writes its JSON results to f"{out}.{rank}"."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import torch.multiprocessing as mp

PORT_TRIES = 3
# The ranks fork from a server process that imported torch and the runtime once (multiprocessing's forkserver,
# started at the first spawn and kept for the process's life), instead of each starting Python and importing them
# (~3 s a rank on this 2-core machine, 2026-12-06)
mp.set_forkserver_preload(["torch", "torch.distributed", "parallel_layers.train"])


def free_port() -> int:
    """A port the OS hands out as free now (released again: rank 0's TCPStore binds it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_on_a_free_port(worker, args_for_port, nprocs: int) -> None:
    """mp.spawn(worker, args=args_for_port(port), nprocs) on a free port.  The port is free when it is chosen, not
    when rank 0 binds it seconds later (the ranks start Python and import torch first): under pytest-xdist the other
    worker's gloo ranks open connections all the while, and one whose ephemeral port is this one makes rank 0's
    TCPStore fail with EADDRINUSE.  Such a start, and only such a start, is tried again on a fresh port."""
    for attempt in range(PORT_TRIES):
        try:
            mp.start_processes(worker, args=args_for_port(free_port()), nprocs=nprocs, join=True,
                               start_method="forkserver")
            return
        except mp.ProcessRaisedException as e:
            if attempt == PORT_TRIES - 1 or "EADDRINUSE" not in str(e):
                raise


def run_two(worker, out: Path, *args) -> list[dict]:
    spawn_on_a_free_port(worker, lambda port: (port, *args, str(out)), 2)
    return [json.loads(Path(f"{out}.{r}").read_text()) for r in (0, 1)]
