"""Run a worker on two gloo ranks in spawned processes and read back what each rank wrote.

The worker is called as worker(rank, port, *args, out) and writes its JSON results to f"{out}.{rank}"."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import torch.multiprocessing as mp


def run_two(worker, out: Path, *args) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(port, *args, str(out)), nprocs=2, join=True)
    return [json.loads(Path(f"{out}.{r}").read_text()) for r in (0, 1)]
