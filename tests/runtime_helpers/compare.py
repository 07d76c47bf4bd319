"""Reassemble per-rank gradient dumps (written by ``train.dump_gradients``) into full logical
tensors and compare them with a one-rank reference."""
from __future__ import annotations

from pathlib import Path

import torch


def load_dumps(directory) -> list[dict]:
    files = sorted(Path(directory).glob("rank*.pt"), key=lambda p: int(p.stem[4:]))
    return [torch.load(f, weights_only=False) for f in files]


def assemble(dumps: list[dict], dp_rank: int | None = 0) -> dict[str, torch.Tensor]:
    """Full logical gradients from the ranks of one dp replica (dp_rank=None: any replica,
    for ZeRO-2 where only the owner keeps a reduced gradient).  TP shards are concatenated
    along their split dim; TP-replicated gradients must agree across TP ranks."""
    shards: dict[str, dict[int, dict]] = {}
    for d in dumps:
        for name, g in d["grads"].items():
            expert = g.get("ep_dim") is not None  # a mixture of experts' weights: the ep rank's experts, from any
            if not expert and dp_rank is not None and d["dp_rank"] != dp_rank:  # replica (ep spans dp)
                continue
            key = g["ep_rank"] if expert else g["tp_rank"]
            prev = shards.setdefault(name, {}).get(key)
            if prev is not None:
                torch.testing.assert_close(prev["grad"], g["grad"], rtol=1e-6, atol=1e-9,
                                           msg=lambda m: f"{name}: copies of the same shard disagree: {m}")
            shards[name][key] = g
    full = {}
    for name, by_rank in shards.items():
        first = next(iter(by_rank.values()))
        if first.get("ep_dim") is not None:
            assert sorted(by_rank) == list(range(first["ep_size"])), f"{name}: missing expert shards {sorted(by_rank)}"
            full[name] = torch.cat([by_rank[r]["grad"] for r in range(first["ep_size"])], dim=first["ep_dim"])
        elif first["tp_dim"] is None or first["tp_size"] == 1:
            for g in by_rank.values():
                torch.testing.assert_close(g["grad"], first["grad"], rtol=1e-5, atol=1e-9,
                                           msg=lambda m: f"{name}: TP-replicated gradient differs across TP ranks: {m}")
            full[name] = first["grad"]
        else:
            assert sorted(by_rank) == list(range(first["tp_size"])), f"{name}: missing TP shards {sorted(by_rank)}"
            full[name] = torch.cat([by_rank[r]["grad"] for r in range(first["tp_size"])], dim=first["tp_dim"])
            if "full_shape" in first:  # a padded vocabulary: the padding rows' gradients must be zero
                size = first["full_shape"][first["tp_dim"]]
                pad = full[name].narrow(first["tp_dim"], size, full[name].shape[first["tp_dim"]] - size)
                assert not pad.abs().sum(), f"{name}: the vocabulary padding has a gradient"
                full[name] = full[name].narrow(first["tp_dim"], 0, size)
    return full


FLOOR = 1e-3


def max_relative_error(got: dict, ref: dict) -> tuple[float, str]:
    """max over tensors of max|got - ref| / max|ref|, and the worst tensor's name.

    A tensor whose gradient is far below the others' is measured against FLOOR x the largest
    gradient instead of its own max: e.g. key biases have an exactly zero gradient in exact
    arithmetic (softmax is shift-invariant), so their own max is rounding noise."""
    assert set(got) == set(ref), f"parameter sets differ: {sorted(set(got) ^ set(ref))}"
    scale = max(r.abs().max().item() for r in ref.values())
    worst, worst_name = 0.0, ""
    for name, r in ref.items():
        assert got[name].shape == r.shape, f"{name}: shape {tuple(got[name].shape)} vs {tuple(r.shape)}"
        err = (got[name] - r).abs().max().item() / max(r.abs().max().item(), FLOOR * scale)
        if err > worst:
            worst, worst_name = err, name
    return worst, worst_name
