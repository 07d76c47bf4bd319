"""Where the DeepSpeed pipeline runs (BLOOM-176B, MT-NLG 530B) are slower than the cost model.

For each published run: the published step time (the model's step time scaled by predicted / published
throughput: every metric here is FLOPs per second over the same FLOPs), the time the model is short, and
that shortfall per pipeline slot (m + p - 1 slots of one micro-batch's blocks on the slowest stage).

Then a diagnosis, not a model: the shortfall per slot fitted on BLOOM's three rows as
x (seconds per block and micro-batch, whatever the micro-batch size) + r x the slot's GPU time, and the
same two numbers applied to MT-NLG (held out).  BLOOM's training script sets CUDA_LAUNCH_BLOCKING=1
(bigscience-workshop/bigscience train/tr11-176B-ml/tr11-176B-ml.slurm: "do not remove or the training
will hang"), which makes the host wait for every kernel, so a block's host dispatch adds to its GPU time
instead of hiding behind it: a cost per block that does not grow with the micro-batch.  Last, MT-NLG's
published steps split into a cost per pipeline slot and one per iteration (its three rows differ only
in dp, at one global batch), first from the published iteration times alone for each micro-batch that
divides the batch (validate.pipeline_slot_fits: how the set's micro-batch, unpublished, is identified),
then at the identified one against the model's slot.  Nothing here changes a prediction.

    python benchmarks/deepspeed_gap.py
"""
from __future__ import annotations

import json

import numpy as np

from planner import validate as V


def rows(set_name: str):
    data = json.loads((V.reference_dir() / f"{set_name}.json").read_text(encoding="utf-8"))
    for q in getattr(V, set_name)(data):
        plan = V.run_query(q)
        pr, tb = plan.prediction, plan.prediction.time_breakdown
        m, pp = plan.training.num_microbatches, plan.parallel.pp
        published_s = pr.step_time_s * V.metric_value(plan, q) / q.published
        slot_s = (tb.compute_s + tb.tp_comm_s + tb.pp_comm_s) / m
        slots = m + pp - 1
        blocks = plan.model.layers / pp
        yield dict(label=q.label, m=m, slots=slots, blocks=blocks, slot_s=slot_s, predicted_s=pr.step_time_s,
                   step_fixed_s=tb.dp_comm_s + tb.optimizer_s,
                   published_s=published_s, short_per_slot_s=(published_s - pr.step_time_s) / slots,
                   metric=V.metric_value(plan, q), published=q.published)


def main() -> None:
    import argparse
    argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0]).parse_args()  # no options; --help says so
    bloom = list(rows("bloom_176b"))
    print("BLOOM-176B: published vs predicted step, and what the model is short per pipeline slot")
    for r in bloom:
        print(f"  {r['label']:14s} m {r['m']:4d}  slot {r['slot_s'] * 1e3:6.1f} ms  step {r['predicted_s']:6.2f} s "
              f"predicted, {r['published_s']:6.2f} s published: short {r['short_per_slot_s'] * 1e3:5.1f} ms a slot "
              f"({100 * r['short_per_slot_s'] / r['slot_s']:.1f} % of it)")
    a = np.array([[r["blocks"], r["slot_s"]] for r in bloom])
    b = np.array([r["short_per_slot_s"] for r in bloom])
    (x, k), *_ = np.linalg.lstsq(a, b, rcond=None)
    print(f"  fit on these 3 rows: {x * 1e3:.1f} ms per block and micro-batch + {100 * k:.1f} % of the GPU time")
    print("MT-NLG 530B (held out): the model's error, and with BLOOM's two numbers added per slot")
    errs = []
    for r in rows("mt_nlg_530b"):
        added = r["slots"] * (x * r["blocks"] + k * r["slot_s"])
        err0 = r["metric"] / r["published"] - 1
        err1 = r["metric"] * r["predicted_s"] / (r["predicted_s"] + added) / r["published"] - 1
        errs.append(abs(err1))
        print(f"  {r['label']:16s} short {r['short_per_slot_s'] * 1e3:5.1f} ms a slot, BLOOM's fit gives "
              f"{(x * r['blocks'] + k * r['slot_s']) * 1e3:5.1f} ms: error {100 * err0:+.1f} % -> {100 * err1:+.1f} %")
    print(f"  median |error| with BLOOM's fit: {100 * float(np.median(errs)):.1f} %")
    # MT-NLG's three rows differ only in dp (8, 10, 12) at one global batch: the published iteration times as
    # a x (m + p - 1) slots + C separate a cost per pipeline slot from one per iteration, for each micro-batch
    data = json.loads((V.reference_dir() / "mt_nlg_530b.json").read_text(encoding="utf-8"))
    print("MT-NLG published iteration times as slots x a + C (least squares), by micro-batch:")
    for b, (a_s, c_s) in V.pipeline_slot_fits(data).items():
        ms = [r["global_batch_size"] // (r["dp"] * b) for r in data["rows"]]
        print(f"  micro-batch {b:2d}: m {'/'.join(map(str, ms)):11s} a {a_s * 1e3:6.0f} ms a slot, C {c_s:+6.1f} s "
              "an iteration" + ("  <- the set's" if all(r["micro_batch_size"] == b for r in data["rows"]) else ""))
    mt = list(rows("mt_nlg_530b"))
    a = np.array([[r["slots"], 1.0] for r in mt])
    (per_slot, fixed), *_ = np.linalg.lstsq(a, np.array([r["published_s"] for r in mt]), rcond=None)
    print(f"MT-NLG at the set's micro-batch: published steps as slots x {per_slot * 1e3:.0f} ms + {fixed:.1f} s "
          f"(model: {1e3 * float(np.mean([r['slot_s'] for r in mt])):.0f} ms a slot, "
          f"{float(np.mean([r['step_fixed_s'] for r in mt])):.2f} s of data-parallel communication and "
          "optimizer/gradient passes)")

if __name__ == "__main__":
    main()
