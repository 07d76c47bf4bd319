"""Deterministic batches: every sample is a function of (seed, step, global sample index) only,
so any layout -- and a resumed run -- sees the same tokens.

Global sample index of dp rank d, local sample j: d * (micro_batch_size * num_microbatches) + j;
a one-rank run of the same plan (dp folded into gradient accumulation) covers the same indices.
"""
from __future__ import annotations

import hashlib
from typing import Optional

import numpy as np
import torch


def stable_seed(*parts) -> int:
    """A 63-bit seed for a tuple of parts, the same in every process (not Python's salted hash)."""
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:8], "little") & ((1 << 63) - 1)


class TokenSource:
    """Synthetic uniform tokens, or windows of a flat token file read through np.memmap."""

    def __init__(self, vocab: int, seq_len: int, seed: int, path: Optional[str] = None, dtype: Optional[str] = None):
        self.vocab, self.seq_len, self.seed = vocab, seq_len, seed
        self.tokens = None
        if path is not None:
            dtype = dtype or ("uint16" if vocab <= 2**16 else "uint32")
            self.tokens = np.memmap(path, dtype=np.dtype(dtype), mode="r")
            if len(self.tokens) < seq_len + 2:
                raise ValueError(f"{path} holds {len(self.tokens)} {dtype} tokens, need at least seq_len + 2 = {seq_len + 2}")

    def sample(self, step: int, index: int) -> torch.Tensor:
        """seq_len + 1 token ids (input and shifted target) of one sample."""
        n = self.seq_len + 1
        if self.tokens is None:
            g = torch.Generator().manual_seed(stable_seed("data", self.seed, step, index))
            return torch.randint(0, self.vocab, (n,), generator=g)
        start = stable_seed("offset", self.seed, step, index) % (len(self.tokens) - n)
        window = np.asarray(self.tokens[start:start + n]).astype(np.int64)
        if window.max() >= self.vocab:
            raise ValueError(f"token id {int(window.max())} in the data file >= vocab ({self.vocab}); wrong --data dtype or vocab?")
        return torch.from_numpy(window)

    def batch(self, step: int, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each (len(indices), seq_len)."""
        rows = torch.stack([self.sample(step, i) for i in indices])
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def replica_sample_indices(dp_rank: int, micro_batch_size: int, num_microbatches: int) -> list[int]:
    per_replica = micro_batch_size * num_microbatches
    return list(range(dp_rank * per_replica, (dp_rank + 1) * per_replica))
