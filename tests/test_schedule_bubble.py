"""The pipeline bubble of torch's own schedule orders (benchmarks/schedule_bubble.py: each rank's
order from torch, timed as a dependency graph with zero communication) against
cost_models.total.bubble_factor.  Results: benchmarks/results/2026-11-24-schedule-bubble/."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EVEN, SKEWED = (1.0, 1.0, 1.0), (1.0, 1.2, 0.8)  # per-chunk (f, b, w)


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("schedule_bubble_t", ROOT / "benchmarks" / "schedule_bubble.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("schedule,p,v,m", [
    ("gpipe", 4, 1, 2), ("gpipe", 4, 1, 6), ("1f1b", 2, 1, 3), ("1f1b", 4, 1, 4), ("1f1b", 4, 1, 10),
    ("interleaved-1f1b", 4, 2, 8), ("interleaved-1f1b", 2, 4, 4),
    # M not a multiple of p, which torch runs and the search's M % p == 0 rule leaves out
    ("interleaved-1f1b", 4, 2, 6), ("interleaved-1f1b", 4, 4, 10), ("interleaved-1f1b", 8, 2, 12),
])
def test_bubble_factor_matches_torch_order(bench, schedule, p, v, m):
    """GPipe and 1F1B: p - 1 for every M torch accepts; interleaved 1F1B: (p - 1)/v for every accepted
    M >= p.  Only b + w enters a full backward, so the split does not matter."""
    order = bench.torch_order(schedule, p, v, m)
    for f, b, w in (EVEN, SKEWED):
        assert bench.sim_bubble(order, v, m, f, b, w) == pytest.approx(bench.model_bubble(schedule, p, v, m))


def test_interleaved_acceptance_is_torchs_rounds_rule(bench):
    """torch 2.13 (ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble): rounds = max(1, M // p),
    ValueError unless M % rounds == 0; 1F1B refuses M < p; GPipe and ZB-V take any M."""
    p = 4
    for m in range(1, 4 * p + 1):
        ok = m % max(1, m // p) == 0
        for schedule in ("interleaved-1f1b", "interleaved-zb"):
            if ok:
                bench.torch_order(schedule, p, 2, m)
            else:
                with pytest.raises(ValueError, match="multiple of the number of rounds"):
                    bench.torch_order(schedule, p, 2, m)
    with pytest.raises(ValueError, match="greater than"):
        bench.torch_order("1f1b", p, 1, p - 1)
    for m in (1, p + 1, 2 * p + 1):
        bench.torch_order("gpipe", p, 1, m)
        bench.torch_order("zbv", p, 2, m)


@pytest.mark.parametrize("p,v,m", [(3, 3, 2), (4, 2, 1), (8, 4, 5)])
def test_interleaved_1f1b_below_p_micro_batches(bench, p, v, m):
    """With M < p a round is M micro-batches, and micro-batch 0 needs p forwards to come back to rank 0
    for its next chunk while rank 0 has only M to do: (p - M) idle at each of the v - 1 chunk changes,
    forward and backward alike: (p - 1)/v + (v - 1)(p - M)/v."""
    order = bench.torch_order("interleaved-1f1b", p, v, m)
    for f, b, w in (EVEN, SKEWED, (1.0, 3.0, 1.0)):
        assert bench.sim_bubble(order, v, m, f, b, w) == pytest.approx((p - 1) / v + (v - 1) * (p - m) / v)


@pytest.mark.parametrize("schedule,p,v,m", [("interleaved-zb", 4, 2, 4), ("interleaved-zb", 4, 2, 6),
                                            ("interleaved-zb", 8, 4, 16), ("zbv", 4, 2, 7), ("zbv", 8, 2, 16)])
def test_zero_bubble_orders_reach_the_fill_bound(bench, schedule, p, v, m):
    """No order can do better than (p - 1) f: the last rank's first forward waits for micro-batch 0
    through p - 1 chunks.  With f = b = w torch's zero-bubble orders reach exactly that (interleaved-zb
    for M >= p, zbv for M >= 2p - 1): bubble factor (p - 1) f / (v (f + b + w)) = (p - 1)/(3 v)."""
    order = bench.torch_order(schedule, p, v, m)
    assert bench.sim_bubble(order, v, m, *EVEN) == pytest.approx((p - 1) / (3 * v))


@pytest.mark.parametrize("schedule,p,v,m", [
    ("interleaved-zb", 4, 2, 8), ("interleaved-zb", 8, 4, 16), ("interleaved-zb", 8, 2, 3), ("interleaved-zb", 4, 3, 6),
    ("zbv", 4, 2, 4), ("zbv", 8, 2, 10), ("zbv", 8, 2, 16), ("zbv", 3, 2, 1),
    ("interleaved-1f1b", 4, 2, 2), ("interleaved-1f1b", 8, 4, 5),
])
def test_bubble_factor_matches_torch_order_where_it_used_to_disagree(bench, schedule, p, v, m):
    """The zero-bubble schedules at f = b = w, and interleaved 1F1B below p micro-batches (any costs): the
    model had (p-1)/v max(0, 1 - M/p) and (p-1)/v there, below torch's orders."""
    order = bench.torch_order(schedule, p, v, m)
    for f, b, w in ((EVEN,) if schedule != "interleaved-1f1b" else (EVEN, SKEWED)):
        assert bench.sim_bubble(order, v, m, f, b, w) == pytest.approx(bench.model_bubble(schedule, p, v, m))


def test_simulator_refuses_a_deadlocking_order(bench):
    """An order that waits for a backward before the forward it needs is reported, not timed."""
    order = [[("F", 0, 0), ("B", 0, 0)], [("B", 1, 0), ("F", 1, 0)]]
    with pytest.raises(RuntimeError, match="deadlocks"):
        bench.simulate(order, *EVEN)


BLOCK_COSTS = [  # (f, b, w): the cost model's llama3-8b block at 8K and 32K tokens (the benchmark's
    (1.0, 1.29, 0.78), (1.0, 1.68, 0.53), SKEWED, (1.0, 3.0, 1.0), EVEN]  # "llama-8k", "llama-32k"), and others with b >= f, w <= b


@pytest.mark.parametrize("p,v,m", [(4, 2, 4), (8, 2, 12), (4, 4, 16), (6, 3, 9), (2, 2, 6)])
def test_interleaved_zb_idles_the_larger_of_f_b_and_f_plus_b_minus_w(bench, p, v, m):
    """From M = p torch's interleaved zero-bubble order idles (p - 1) max(f, b, f + b - w) on the critical
    rank: a backward heavier than the weight pass (the attention's backward is in b) makes the bubble
    larger than (p - 1)/(3v), by 27 % for the 8K block and 66 % at 32K.  evaluate passes the block's costs."""
    order = bench.torch_order("interleaved-zb", p, v, m)
    for costs in BLOCK_COSTS:
        f, b, w = costs
        assert bench.sim_bubble(order, v, m, *costs) == pytest.approx(
            (p - 1) / v * max(f, b, f + b - w) / (f + b + w))
        assert bench.model_bubble("interleaved-zb", p, v, m, costs) == pytest.approx(bench.sim_bubble(order, v, m, *costs))


@pytest.mark.parametrize("p", [3, 4, 8])
def test_zbv_form_follows_torchs_order_for_a_blocks_costs(bench, p):
    """ZB-V for every M from 1 to 3p and each cost set: the model's fitted form equals torch's order but for
    a few M just above the floor, where it is under by at most 0.083 of a micro-batch's time (3 points at p 8,
    none at p 3 and 4)."""
    worst = 0.0
    exact = total = 0
    for m in range(1, 3 * p + 1):
        order = bench.torch_order("zbv", p, 2, m)
        for costs in BLOCK_COSTS:
            miss = bench.model_bubble("zbv", p, 2, m, costs) - bench.sim_bubble(order, 2, m, *costs)
            assert miss <= 1e-9, (m, costs)
            worst = max(worst, -miss)
            exact += abs(miss) < 1e-9
            total += 1
    assert worst <= 0.085 and total - exact <= {3: 0, 4: 0, 8: 3}[p], (worst, exact, total)


@pytest.mark.parametrize("p,v,m", [(4, 2, 1), (8, 2, 4), (8, 2, 7), (8, 4, 6), (6, 3, 5), (4, 4, 3)])
def test_interleaved_zb_below_p_micro_batches_for_a_blocks_costs(bench, p, v, m):
    """Below p micro-batches (torch runs one round of m) the order's makespan is the larger of the fill,
    (vp + m - 1)(f + b) + w, and the tail, vm(f + b + w) + (p - 1) max(f, b, f + b - w) + (p - m)((v - 1) f + w):
    at f = b = w the fit the model had, max(2vp + 2m - 1, 2vm + vp + p - 1)."""
    order = bench.torch_order("interleaved-zb", p, v, m)
    for costs in BLOCK_COSTS:
        assert bench.model_bubble("interleaved-zb", p, v, m, costs) == pytest.approx(bench.sim_bubble(order, v, m, *costs))


def test_dualpipev_without_an_overlap_callback_is_no_better_than_zbv():
    """Why DualPipeV is not a schedule parplan plans (benchmarks/dualpipev_order.py, docs/cost-model.md): run as
    torch runs it without an OVERLAP_F_B callback, its order idles as ZB-V's at f = b = w and more with the input
    pass heavier than the weight pass, and holds one chunk-micro-batch more (2p + 1 against 2p)."""
    spec = importlib.util.spec_from_file_location("dualpipev_t", ROOT / "benchmarks" / "dualpipev_order.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for r in mod.rows(ps=(2, 4)):
        p = r["p"]
        assert (r["dualpipev held"], r["zbv held"]) == (2 * p + 1, 2 * p)
        assert r["dualpipev even"] == pytest.approx(r["zbv even"])
        assert r["dualpipev b1.2-w0.8"] > r["zbv b1.2-w0.8"] and r["dualpipev llama-8k"] > r["zbv llama-8k"]
