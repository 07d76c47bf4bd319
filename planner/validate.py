"""Predicted against published: every reference set under benchmarks/reference/.

Each set has an adapter that turns a published row into a planner query: the model shape, the
GPU count, every setting the publication states pinned, and for settings it does not state a
search restricted to what that framework version offered (e.g. Megatron-LM 2024 had no
zero-bubble schedule and no offload).  The metric compared is the one the publication reports
(hardware TFLOP/s per GPU, MFU, ...), computed with the publication's FLOP convention.

    from planner.validate import validate_all
    for case in validate_all(): print(case.set_name, case.label, case.published, case.predicted)
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from .schema import ModelSpec
from .search import Pins


@dataclass
class Query:
    label: str
    spec: ModelSpec
    gpus: int
    hardware: str
    seq_len: int
    global_batch_size: int
    metric: str  # a Prediction attribute, or a callable name in METRICS
    published: float
    dtype: str = "bf16"
    precision: str = "master-weights"
    flash_attention: bool = True
    overlap_grad_reduce: bool = True
    overlap_tp_comm: bool = False
    inter_node_gbytes_per_s: float | None = None
    gpus_per_node: int | None = None
    pin_variants: list[Pins] = field(default_factory=lambda: [Pins()])


@dataclass
class Case:
    set_name: str
    label: str
    metric: str
    published: float
    predicted: float | None
    plan: object | None
    note: str = ""

    @property
    def error(self) -> float | None:
        if self.predicted is None:
            return None
        return (self.predicted - self.published) / self.published


def reference_dir() -> Path:
    env = os.environ.get("PARPLAN_REFERENCE_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "benchmarks" / "reference"


def _gpt(r: dict, vocab: int, tied: bool, ffn=None) -> ModelSpec:
    return ModelSpec(name=r.get("model") or f"gpt-{r['layers']}x{r['hidden']}", arch="gpt", layers=r["layers"],
                     hidden=r["hidden"], heads=r["heads"], kv_heads=r.get("kv_heads") or r["heads"],
                     ffn_hidden=ffn or r.get("ffn_hidden") or 4 * r["hidden"], vocab=vocab, tied_embeddings=tied)


def megatron_sc21_table1(d: dict) -> Iterable[Query]:
    """Narayanan 2021 Table 1: every setting is stated (tp, pp, dp, mbs, vpp from the authors'
    script, full recompute, fp16, no SP, no ZeRO); Megatron 2021 all-reduced gradients after the
    backward (no overlap) and used unfused softmax attention.  Metric: hardware TFLOP/s per GPU
    (eq. 3: includes the recompute forward)."""
    c = d["common"]
    for r in d["rows"]:
        lpv = r.get("layers_per_virtual_stage")
        vpp = r["layers"] // (r["pp"] * lpv) if lpv else 1
        pins = Pins(tp=r["tp"], pp=r["pp"], dp=r["dp"], cp=1, mbs=r["micro_batch_size"], vpp=vpp, zero=0,
                    recompute="full", sp=False, schedule="interleaved-1f1b" if vpp > 1 else "1f1b", offload="none")
        yield Query(label=f"{r['params_billion']}B", spec=_gpt(r, c["vocab"], True), gpus=r["gpus"],
                    hardware="a100-sxm-80gb", seq_len=c["seq_len"], global_batch_size=r["global_batch_size"],
                    metric="hardware_tflops_per_gpu", published=r["tflops_per_gpu"], dtype="fp16",
                    flash_attention=False, overlap_grad_reduce=False, pin_variants=[pins])


def megatron_h100_2024(d: dict) -> Iterable[Query]:
    """Megatron-Core r0.8 H100 weak scaling: tp, pp, dp and the overlap flags are stated; micro-batch,
    virtual stages and recompute are not, so they are searched within what Megatron-Core r0.8
    offers: 1F1B or interleaved 1F1B, distributed optimizer (ZeRO-1) or none, no offload,
    sequence parallelism with TP (required by --tp-comm-overlap).  Metric: MFU."""
    c = d["common"]
    for r in d["rows"]:
        scheds = ["1f1b", "interleaved-1f1b"] if r["pp"] > 1 else ["1f1b"]
        variants = [Pins(tp=r["tp"], pp=r["pp"], dp=r["dp"], cp=1, schedule=s, zero=z, offload="none",
                         sp=r["tp"] > 1) for s in scheds for z in (0, 1)]
        yield Query(label=r["model"], spec=_gpt(r, c["vocab"], not c.get("untied_embeddings", False)),
                    gpus=r["gpus"], hardware="h100-sxm-80gb", seq_len=c["seq_len"],
                    global_batch_size=r["global_batch_size"], metric="mfu", published=r["mfu_percent"] / 100,
                    overlap_grad_reduce=True, overlap_tp_comm=True, pin_variants=variants)


ADAPTERS: dict[str, Callable[[dict], Iterable[Query]]] = {
    "megatron_sc21_table1": megatron_sc21_table1,
    "megatron_h100_2024": megatron_h100_2024,
}
# Sets whose profile parameter was fitted to them (at most one parameter per profile).
FITTED_ON = {"megatron_h100_2024": "h100-sxm-80gb sustained_matmul_fraction"}


def run_query(q: Query, hardware_override: str | None = None):
    """Best plan over the query's pin variants (the publication's framework picks the best it can)."""
    from .core import NothingFits, PlannerError, recommend
    best = None
    for pins in q.pin_variants:
        try:
            plan = recommend(q.spec, q.gpus, hardware=hardware_override or q.hardware, seq_len=q.seq_len,
                             global_batch_size=q.global_batch_size, dtype=q.dtype, precision=q.precision,
                             gpus_per_node=q.gpus_per_node, inter_node_gbytes_per_s=q.inter_node_gbytes_per_s,
                             pins=pins, top_k=1, flash_attention=q.flash_attention,
                             overlap_grad_reduce=q.overlap_grad_reduce, overlap_tp_comm=q.overlap_tp_comm,
                             suggest=False)
        except (NothingFits, PlannerError):
            continue
        if best is None or plan.prediction.step_time_s < best.prediction.step_time_s:
            best = plan
    return best


def validate_set(name: str, data: dict, hardware_override: str | None = None) -> list[Case]:
    cases = []
    for q in ADAPTERS[name](data):
        plan = run_query(q, hardware_override)
        pred = None if plan is None else float(getattr(plan.prediction, q.metric))
        cases.append(Case(set_name=name, label=q.label, metric=q.metric, published=q.published, predicted=pred,
                          plan=plan, note="" if plan else "no feasible plan"))
    return cases


def available_sets(directory: Path | None = None) -> list[str]:
    directory = directory or reference_dir()
    return [n for n in ADAPTERS if (directory / f"{n}.json").exists()]


def validate_all(names: list[str] | None = None, directory: Path | None = None) -> list[Case]:
    directory = directory or reference_dir()
    out = []
    for name in names or available_sets(directory):
        with open(directory / f"{name}.json", encoding="utf-8") as f:
            out.extend(validate_set(name, json.load(f)))
    return out


def summarize(cases: list[Case]) -> dict:
    """Per set: median and max absolute relative error, and Spearman rank correlation."""
    out = {}
    for name in dict.fromkeys(c.set_name for c in cases):
        cs = [c for c in cases if c.set_name == name and c.predicted is not None]
        errs = np.array([abs(c.error) for c in cs])
        pub = np.array([c.published for c in cs])
        pred = np.array([c.predicted for c in cs])
        out[name] = {"runs": len(cs), "missing": sum(1 for c in cases if c.set_name == name and c.predicted is None),
                     "median_abs_error": float(np.median(errs)) if len(errs) else None,
                     "max_abs_error": float(errs.max()) if len(errs) else None,
                     "spearman": spearman(pred, pub) if len(cs) > 2 else None,
                     "fitted": FITTED_ON.get(name)}
    return out


def spearman(a, b) -> float:
    """Spearman rank correlation with average ranks for ties (no scipy needed)."""
    def ranks(x):
        x = np.asarray(x, dtype=float)
        order = np.argsort(x, kind="mergesort")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=float)
        for v in np.unique(x):
            idx = x == v
            r[idx] = r[idx].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    ra -= ra.mean()
    rb -= rb.mean()
    denom = np.sqrt((ra ** 2).sum() * (rb ** 2).sum())
    return float((ra * rb).sum() / denom) if denom else 0.0
