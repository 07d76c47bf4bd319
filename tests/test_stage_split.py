"""A plan's own pipeline split (Parallel.stage_layers, ModelDims.split): the cost model's per-rank counts read it,
and written out as the default split it predicts exactly what the default split's closed forms do."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from cost_models.layout import (SCH_INTERLEAVED, SCH_1F1B, SCH_ZBV, critical_recomputed_share, model_rank_block_counts,
                                model_recomputed_share, model_stage_layers, num_microbatches, rank_block_counts,
                                rank_dense_blocks, rank_recomputed_shares, recompute_ends, recomputed_share,
                                split_rank_counts, stage_layers)
from cost_models.memory import memory_breakdown
from cost_models.total import evaluate
from planner.core import evaluate_plan, plan_inputs, recommend
from planner.search import Pins


def test_the_split_counts_of_the_default_split_are_its_closed_forms():
    """split_rank_counts walks the ranks' virtual stages; rank_block_counts counts them in closed form: on the
    default split they agree for every layer count, pp, vpp and ZB-V up to 39 layers and pp 8."""
    for layers in range(1, 40):
        for p in range(1, 9):
            for v in (1, 2, 3, 4):
                for zbv in (False, True):
                    if (zbv and (v != 2 or p == 1)) or p * v > layers + 2:
                        continue
                    sch = np.array([SCH_ZBV if zbv else (SCH_INTERLEAVED if v > 1 else SCH_1F1B)])
                    closed = rank_block_counts(layers, np.array([p]), np.array([v]), sch)
                    walked = split_rank_counts(tuple(stage_layers(layers, p * v)), np.array([p]), np.array([v]), sch)
                    assert [int(x[0]) for x in walked] == [int(x[0]) for x in closed], (layers, p, v, zbv)


def test_a_split_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError):
        split_rank_counts((4, 4, 4), np.array([2]), np.array([1]))


def _dims(plan):
    spec, m, tr, hw, arr = plan_inputs(plan)
    assert not m.split  # the search's plans carry the default split
    return m, tr, hw, arr


CASES = [
    # (model, gpus, pins, framework): the default split's paths each case takes
    ("llama3-8b", 8, Pins(pp=4, tp=2), "parplan"),  # 1F1B, even
    ("llama3-405b", 1024, Pins(pp=16, vpp=3, tp=8), "megatron"),  # interleaved, uneven (126 layers: 2, 3 x 30, 2 x 17)
    ("llama3-8b", 8, Pins(pp=4, schedule="zbv", tp=2), "parplan"),  # ZB-V's V (even chunks: the closed forms)
    ("qwen2.5-7b", 8, Pins(pp=4, schedule="zbv", tp=2), "parplan"),  # ZB-V, chunks 3 + 3, 4 + 3, 4 + 3, 4 + 4: walked
    ("llama3-70b", 64, Pins(pp=4, tp=4, recompute="full", recompute_layers=3), "megatron"),  # partial recompute
    ("llama3-405b", 1024, Pins(pp=16, vpp=1, tp=8, recompute="full", recompute_layers=4), "megatron"),  # 7, 8 x 14, 7
    ("deepseek-v3", 1024, Pins(pp=8, tp=2), "megatron"),  # MLA, leading dense blocks, interleaved (vpp 7)
    ("deepseek-v3", 1024, Pins(pp=16, vpp=1, tp=2), "megatron"),  # the same under 1F1B: 3 dense blocks on rank 0
]


@pytest.mark.parametrize("model,gpus,pins,framework", CASES, ids=[f"{c[0]}-pp{c[2].pp}" for c in CASES])
def test_the_default_split_written_out_predicts_what_the_default_split_does(model, gpus, pins, framework):
    """Every metric of evaluate is the same whether the model carries the default split as its own (the per-rank
    walks: split_rank_counts, the dense blocks' row, virtual_stage_blocks of a tuple, the largest stage of the
    split) or none (the closed forms the search uses)."""
    plan = recommend(model, gpus, pins=pins, framework=framework, top_k=1)
    m, tr, hw, arr = _dims(plan)
    p = plan.parallel
    own = replace(m, split=tuple(model_stage_layers(m.layers, m.mtp, p.pp * p.vpp)))
    a, b = evaluate(m, tr, hw, arr), evaluate(own, tr, hw, arr)
    assert set(a) == set(b)
    for key in a:
        assert np.allclose(np.asarray(a[key], dtype=float), np.asarray(b[key], dtype=float), equal_nan=True), key
    counts = model_rank_block_counts(own, arr.pp, arr.vpp, arr.schedule)
    assert [int(x[0]) for x in counts] == [int(x[0]) for x in model_rank_block_counts(m, arr.pp, arr.vpp, arr.schedule)]


def test_partial_recompute_charges_each_rank_its_own_share():
    """Under recompute_layers N each rank recomputes min(N, a stage's blocks) of each of its stages: llama3-405b's
    126 blocks on pp 16 at N 4 give rank 0 and rank 15 (7 blocks) 4/7, the middle ranks (8) 4/8, which the search's
    uniform share (the largest stage's) is.  Each rank kind's memory is the chord between no recompute and full
    recompute at its own share; the smaller ranks read less than at the uniform share, the middle rank the same."""
    plan = recommend("llama3-405b", 1024, pins=Pins(pp=16, vpp=1, tp=8, recompute="full", recompute_layers=4),
                     framework="megatron", top_k=1)
    m, tr, hw, arr = _dims(plan)
    shares = [float(f[0]) for f in rank_recomputed_shares(m, arr)]
    assert shares == pytest.approx([4 / 7, 4 / 8, 4 / 7])
    assert float(recomputed_share(m, arr)[0]) == pytest.approx(4 / 8)
    assert float(model_recomputed_share(m, arr)[0]) == pytest.approx(16 * 4 / 126)  # the job's: every stage's 4
    mem = memory_breakdown(m, arr, tr, num_microbatches(tr, arr))
    none, full = (memory_breakdown(m, lay, tr, num_microbatches(tr, arr)) for lay in recompute_ends(arr))
    for key, f in zip(("first_total", "mid_total", "last_total"), shares):
        assert float(mem[key][0]) == pytest.approx((1 - f) * float(none[key][0]) + f * float(full[key][0]))
        uniform = 0.5 * float(none[key][0]) + 0.5 * float(full[key][0])
        assert float(mem[key][0]) <= uniform * (1 + 1e-12)
    half = 0.5 * float(none["first_total"][0]) + 0.5 * float(full["first_total"][0])
    assert float(mem["first_total"][0]) < 0.97 * half
    # a plan's own split: [2, 3, 3, 0] at N 1 -> rank 0 1/2, the middle rank (3 blocks) 1/3, the blockless rank 1
    own = replace(m, layers=8, split=(2, 3, 3, 0))
    lay = replace(arr, pp=np.array([4]), recompute_layers=np.array([1]))
    assert [float(f[0]) for f in rank_recomputed_shares(own, lay)] == pytest.approx([1 / 2, 1 / 3, 1.0])


def test_partial_recompute_times_the_rank_of_the_most_blocks_at_its_own_share():
    """Interleaved stages of 1, 2, 2, 1, 1, 1, 1, 0 blocks on pp 4 x vpp 2 at N 1: ranks 1 and 2 hold the most blocks
    (2 + 1) and recompute 2 of them, not the largest stage's half; the step's block-linear terms are the mix of no
    recompute and full recompute at 2/3 (3 blocks' forward, backward and 2 recomputes), each rank's memory at its own
    share (rank 0: 1 + 1 blocks, both recomputed)."""
    plan = recommend("llama3-8b", 8, pins=Pins(pp=4, vpp=2, schedule="interleaved-1f1b", tp=2), framework="megatron",
                     top_k=1)
    m, tr, hw, arr = _dims(plan)
    own = replace(m, layers=9, split=(1, 2, 2, 1, 1, 1, 1, 0))
    lay = replace(arr, recompute=np.array([2]), recompute_layers=np.array([1]))
    assert float(recomputed_share(own, lay)[0]) == pytest.approx(1 / 2)
    assert float(critical_recomputed_share(own, lay)[0]) == pytest.approx(2 / 3)
    assert [float(f[0]) for f in rank_recomputed_shares(own, lay)] == pytest.approx([1.0, 2 / 3, 1.0])
    got = evaluate(own, tr, hw, lay)
    none, full = (evaluate(own, tr, hw, end) for end in recompute_ends(lay))
    for key in ("compute_s", "step_time_s", "bubble_s"):
        assert float(got[key][0]) == pytest.approx(float(none[key][0]) / 3 + 2 * float(full[key][0]) / 3), key
    assert float(got["step_time_s"][0]) > float(none["step_time_s"][0]) / 2 + float(full["step_time_s"][0]) / 2
    # the job's hardware FLOPs at the share of all blocks recomputed: 7 of 9 (every stage but the empty one, one each)
    assert float(model_recomputed_share(own, lay)[0]) == pytest.approx(7 / 9)

    def per_token(r):
        return float(r["hardware_tflops_per_gpu"][0]) / float(r["tokens_per_s"][0])
    assert per_token(got) == pytest.approx(2 * per_token(none) / 9 + 7 * per_token(full) / 9)


def test_the_search_recomputes_the_fewest_blocks_each_rank_needs():
    """A 30-block llama on pp 4 splits 7, 8, 8, 7, and rank 0 (7 blocks, 4 micro-batches in flight) holds the peak: at
    the same N it recomputes a larger share of its blocks than the middle ranks, so the search's N is the least that
    fits every rank at its own share (5 at micro-batch 8 and ZeRO-1 while every rank was charged the largest
    stage's share; 4 since, 2.4 % faster), and one fewer would not fit."""
    from planner.models import load_preset
    spec = load_preset("llama3-8b").model_copy(update={"layers": 30, "name": "llama-30-layers"})
    plan = recommend(spec, 4, pins=Pins(pp=4, tp=1, vpp=1), framework="megatron", top_k=30, global_batch_size=64)
    partial = [p for p in [plan, *plan.alternatives] if p.parallel.recompute_layers]
    assert any(p.parallel.recompute_layers == 4 and p.training.micro_batch_size == 8 and p.parallel.zero_stage == 1
               for p in partial)
    for p in partial:
        usable = p.prediction.usable_memory_bytes
        assert p.prediction.memory_bytes_per_gpu.total <= usable
        if p.parallel.recompute_layers > 1:
            fewer = p.model_copy(update={"parallel": p.parallel.model_copy(
                update={"recompute_layers": p.parallel.recompute_layers - 1})})
            assert evaluate_plan(fewer).prediction.memory_bytes_per_gpu.total > usable, p.parallel


def test_a_lighter_head_stage_is_predicted_faster_and_heavier_where_the_blocks_went():
    """llama3-8b on pp 4: the last stage's output layer (128,256 x 4,096) and loss cost about two blocks' work, so
    moving two blocks off it (8, 9, 9, 6) shortens the slowest stage, and the middle ranks, holding nine blocks,
    predict more memory while the last predicts less (before the thirty-eighth session every split read as 8 x 4)."""
    plan = recommend("llama3-8b", 8, pins=Pins(pp=4, tp=2), top_k=1)
    base = evaluate_plan(plan).prediction
    plan.parallel.stage_layers = [8, 9, 9, 6]
    own = evaluate_plan(plan).prediction
    assert own.step_time_s < 0.95 * base.step_time_s
    assert own.memory_bytes_per_gpu.by_stage["middle"] > base.memory_bytes_per_gpu.by_stage["middle"]
    assert own.memory_bytes_per_gpu.by_stage["last"] < base.memory_bytes_per_gpu.by_stage["last"]
    assert own.memory_bytes_per_gpu.by_stage["first"] == base.memory_bytes_per_gpu.by_stage["first"]
    plan.parallel.stage_layers = [14, 6, 6, 6]  # the blocks piled on rank 0 instead: slower than the default
    assert evaluate_plan(plan).prediction.step_time_s > base.step_time_s


def test_a_split_places_the_leading_dense_blocks_where_its_stages_put_them():
    """DeepSeek-V3's three leading dense blocks under a split of 1, 5, 4 x 13, 3 on pp 16: rank 0 holds one block
    (dense), rank 1 five (two dense), the last three (none); the middle rank priced is the fullest, rank 1."""
    plan = recommend("deepseek-v3", 1024, pins=Pins(pp=16, vpp=1, tp=2), framework="megatron", top_k=1)
    m, tr, hw, arr = _dims(plan)
    own = replace(m, split=(1, 5) + (4,) * 13 + (3,))
    assert [int(x[0]) for x in model_rank_block_counts(own, arr.pp, arr.vpp, arr.schedule)] == [1, 5, 3]
    assert [int(np.ravel(x)[0]) for x in rank_dense_blocks(own, arr.pp, arr.vpp, arr.schedule)] == [1, 2, 0]
    assert [int(np.ravel(x)[0]) for x in rank_dense_blocks(m, arr.pp, arr.vpp, arr.schedule)] == [3, 0, 0]


def _default_split_step(plan):
    """The plan's step time at the default split (evaluate_plan of it with stage_layers reset)."""
    q = plan.model_copy(deep=True)
    q.parallel.stage_layers = model_stage_layers(plan.model.layers, plan.model.mtp_layers or 0,
                                                 plan.parallel.pp * plan.parallel.vpp)
    return evaluate_plan(q).prediction.step_time_s


def test_the_search_lightens_the_head_stage_where_it_gains_and_the_plan_predicts_the_same_again():
    """llama3-8b on 8 GPUs at pp 4 (the CLI's --split balanced): every top plan takes the split that counts its
    head as blocks of the last stage where that is HEAD_SPLIT_GAIN faster and fits, and evaluate_plan of the plan it
    writes predicts what the search said (the split travels in stage_layers).  The library's default (validate's
    published runs, which used the default split) keeps the default split."""
    from planner.core import HEAD_SPLIT_GAIN
    plan = recommend("llama3-8b", 8, pins=Pins(pp=4), top_k=5, balance_head=True)
    default = model_stage_layers(32, 0, 4)
    for p in [plan] + plan.alternatives:
        assert sum(p.parallel.stage_layers) == 32 and p.parallel.stage_layers != default
        assert p.parallel.stage_layers[-1] < 8 and p.prediction.fits
        again = evaluate_plan(p).prediction
        assert again.step_time_s == pytest.approx(p.prediction.step_time_s, rel=1e-9)
        assert again.memory_bytes_per_gpu.total == pytest.approx(p.prediction.memory_bytes_per_gpu.total, rel=1e-9)
        assert p.prediction.step_time_s < _default_split_step(p) * (1 - HEAD_SPLIT_GAIN)
    steps = [p.prediction.step_time_s for p in [plan] + plan.alternatives]
    assert steps == sorted(steps)  # ranked again on the new times
    plain = recommend("llama3-8b", 8, pins=Pins(pp=4), top_k=5)
    assert all(p.parallel.stage_layers == default for p in [plain] + plain.alternatives)
    assert plan.prediction.step_time_s < plain.prediction.step_time_s


def test_no_lighter_head_without_a_pipeline_or_a_framework_that_trains_one():
    """Plans without a pipeline keep their one stage; DeepSpeed's PipelineModule partitions by its own rule, so its
    plans keep the default split even when asked."""
    flat = recommend("llama3-8b", 8, pins=Pins(pp=1), top_k=3, balance_head=True)
    assert all(p.parallel.stage_layers == [32] for p in [flat] + flat.alternatives)
    ds = recommend("llama3-8b", 8, pins=Pins(pp=4, zero=1), framework="deepspeed", top_k=3, balance_head=True)
    assert all(p.parallel.stage_layers == model_stage_layers(32, 0, 4) for p in [ds] + ds.alternatives)


def test_a_lighter_head_stage_exports_as_the_frameworks_own_split_flags():
    """Megatron-LM takes the balanced split as --decoder-first/last-pipeline-num-layers (equal middle stages);
    torchtitan as its split points."""
    from planner.export import export_plan
    meg = recommend("llama3-8b", 8, pins=Pins(pp=4, tp=2), framework="megatron", top_k=1, balance_head=True)
    first, *middle, last = meg.parallel.stage_layers
    assert last < first and len(set(middle)) == 1
    text = export_plan(meg, "megatron")
    assert f"--decoder-first-pipeline-num-layers {first}" in text
    assert f"--decoder-last-pipeline-num-layers {last}" in text
    tt = recommend("llama3-8b", 16, pins=Pins(pp=4, tp=2), framework="torchtitan", top_k=1, balance_head=True)
    counts = tt.parallel.stage_layers
    assert counts[-1] < counts[0]
    cuts = [f"layers.{sum(counts[:i + 1])}" for i in range(3)]
    assert all(c in export_plan(tt, "torchtitan") for c in cuts)


def test_a_head_stage_may_be_left_without_blocks_but_not_under_torchtitan():
    """Llama 3.2 1B's 128K-vocabulary head costs about four of its blocks: on pp 4 the search empties the last stage
    of blocks (parplan's runtime and Megatron-LM's pipeline layout train a stage holding the head alone); torchtitan's
    split points cannot express an empty stage, so its plans keep a block there."""
    plan = recommend("llama3.2-1b", 8, pins=Pins(pp=4, vpp=1), top_k=1, balance_head=True)
    assert plan.parallel.stage_layers[-1] == 0 and plan.prediction.step_time_s < 0.8 * _default_split_step(plan)
    tt = recommend("llama3.2-1b", 16, pins=Pins(pp=4, vpp=1), framework="torchtitan", top_k=3, balance_head=True)
    assert all(min(p.parallel.stage_layers) >= 1 for p in [tt] + tt.alternatives)
    assert any(p.parallel.stage_layers != model_stage_layers(16, 0, 4) for p in [tt] + tt.alternatives)


def test_the_cli_balances_by_default_and_takes_split_default(capsys):
    """`recommend` plans the balanced split unless told --split default; a bad value is a one-line error."""
    import json

    from planner.cli import main
    args = ["recommend", "--model", "llama3-8b", "--gpus", "16", "--pp", "4", "--json", "--top", "1"]
    assert main(args) == 0
    balanced = json.loads(capsys.readouterr().out)["parallel"]["stage_layers"]
    assert main(args + ["--split", "default"]) == 0
    assert json.loads(capsys.readouterr().out)["parallel"]["stage_layers"] == [8, 8, 8, 8] != balanced
    assert main(args + ["--split", "even"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "split" in err and "balanced" in err and "Traceback" not in err


def test_explain_says_what_the_default_split_would_take(tmp_path, capsys):
    """`explain` of a plan with its own split names the default one and the step it would take (evaluate_plan of
    the plan with it); a plan on the default split has no such line."""
    import json

    from planner.cli import main
    plan = recommend("llama3-8b", 16, pins=Pins(pp=4), top_k=1, balance_head=True)
    path = tmp_path / "p.json"
    path.write_text(plan.model_dump_json())
    assert main(["explain", str(path), "--json"]) == 0
    split = json.loads(capsys.readouterr().out)["split"]
    assert split["stage_layers"] == plan.parallel.stage_layers and split["default"] == [8, 8, 8, 8]
    assert split["default_step_time_s"] == pytest.approx(_default_split_step(plan))
    assert split["default_step_time_s"] > plan.prediction.step_time_s
    assert main(["explain", str(path)]) == 0
    assert "split: stage_layers" in capsys.readouterr().out
    even = recommend("llama3-8b", 16, pins=Pins(pp=4), top_k=1)
    path.write_text(even.model_dump_json())
    assert main(["explain", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["split"] is None


def test_the_balanced_best_plan_does_not_depend_on_how_many_are_shown():
    """Balancing re-ranks a pool of HEAD_SPLIT_POOL plans whatever --top asks for: llama3-8b on 64 GPUs under
    torchtitan leads with pp 2 at a balanced split (pp 1 led on the default split), at --top 1 as at --top 20."""
    plans = {k: recommend("llama3-8b", 64, framework="torchtitan", top_k=k, balance_head=True) for k in (1, 5, 20)}
    assert len(plans[1].alternatives) == 0 and len(plans[5].alternatives) == 4
    lead = [(p.parallel, p.training.micro_batch_size) for p in plans.values()]
    assert lead[0] == lead[1] == lead[2]
    assert plans[1].parallel.pp == 2 and plans[1].parallel.stage_layers != [16, 16]
    assert recommend("llama3-8b", 64, framework="torchtitan", top_k=1).parallel.pp == 1


@pytest.mark.parametrize("model, gpus, framework, pp", [("llama3-8b", 64, "torchtitan", None),
                                                        ("llama3-8b", 16, "parplan", 4),
                                                        ("qwen2.5-72b", 24, "parplan", None)])
def test_a_pool_of_500_balances_to_the_same_best_plan_as_the_pool_of_20(model, gpus, framework, pp, monkeypatch):
    """The balanced split is tried on the search's HEAD_SPLIT_POOL best plans only: a plan further down that a lighter
    head stage would make the fastest is not found.  On these cases (and 8 more measured in the forty-first session,
    each at a pool of 1,000) no such plan exists: a pool 25x larger picks the same plan at the same step time."""
    import planner.core as core

    def best(pool):
        monkeypatch.setattr(core, "HEAD_SPLIT_POOL", pool)
        p = recommend(model, gpus, pins=Pins(pp=pp), framework=framework, top_k=1, balance_head=True)
        return p.parallel, p.training.micro_batch_size, p.prediction.step_time_s
    assert best(500) == best(core.HEAD_SPLIT_POOL)


def test_compare_shows_the_two_splits(tmp_path, capsys):
    """`compare` of a plan on the default split and the same layout balanced names both splits in a row."""
    import json

    from planner.cli import main
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(recommend("llama3-8b", 16, pins=Pins(pp=4), top_k=1).model_dump_json())
    balanced = recommend("llama3-8b", 16, pins=Pins(pp=4), top_k=1, balance_head=True)
    b.write_text(balanced.model_dump_json())
    assert main(["compare", str(a), str(b), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    rows = rows["rows"] if isinstance(rows, dict) else rows
    split = next(r for r in rows if r["name"] == "stage_layers")
    assert split["a"] == "[8 x4]" and split["b"] != split["a"] and split["relative"] is None


def test_zbv_counts_extend_two_short_walks_as_the_full_walk_counts():
    """From 2p + 1 micro-batches on, ZB-V's held and pending chunks stay and its held sends grow by the same number a
    micro-batch: zbv_counts' two short walks, extended, are the full walk of torch's order (the largest middle rank's
    with unequal chunks), on default and hand-made splits."""
    from cost_models.memory import zbv_chunk_sizes, zbv_counts, zbv_order_moments
    cases = [(4, (1, 1, 1, 2, 1, 1, 1, 0)), (4, tuple(stage_layers(10, 8))), (4, tuple(stage_layers(28, 8))),
             (3, tuple(stage_layers(7, 6))), (6, tuple(stage_layers(29, 12))), (4, None)]
    for p, sizes in cases:
        for m in range(1, 6 * p):
            for kind, ranks in (("first", [0]), ("last", [p - 1]),
                                ("mid", list(range(1, p - 1)) if sizes is not None else [max(p - 2, 1)])):
                full = np.max([np.array(zbv_order_moments(p, m, r, sizes)) for r in ranks], axis=0)
                assert np.allclose(zbv_counts(p, m, kind, sizes), full), (p, sizes, m, kind)
    assert zbv_chunk_sizes(32, 4) is None and zbv_chunk_sizes(None, 4) is None  # 4 blocks a chunk: the closed forms
    assert zbv_chunk_sizes(10, 4) == (1, 2, 2, 1, 1, 1, 1, 1)


def test_the_interleaved_zero_bubble_walk_of_equal_chunks_is_the_closed_forms():
    """izb_order_moments walks torch's ScheduleInterleavedZeroBubble order; with every chunk of a rank alike it gives
    rank_inflight's closed forms ((v-1) g + p chunks held, r + 1 pending, the sends held at the last steady input
    pass), on every rank kind, p 2-6, v 2-4, every m torch runs from p to 4p + 2, the stage outputs' sends held or
    released."""
    from cost_models.layout import SCHEDULES, Layout
    from cost_models.memory import izb_order_moments, rank_inflight
    for released in (False, True):
        for p in range(2, 7):
            for v in (2, 3, 4):
                for m in range(p, 4 * p + 3):
                    if m % max(1, m // p):
                        continue
                    lay = Layout(gpus=p, tp=1, pp=p, dp=1, cp=1, vpp=v, mbs=1, zero=0, recompute=0, sp=0, offload=0,
                                 schedule=SCHEDULES.index("interleaved-zb"))
                    closed = rank_inflight(lay, m, None, released)
                    for kind, r in (("first", 0), ("mid", max(p - 2, 1)), ("last", p - 1)):
                        walked = izb_order_moments(p, v, m, r, None, released)[0]
                        assert np.allclose(walked, [float(np.asarray(x)) for x in closed[kind][0]]), (p, v, m, kind)


def test_interleaved_zero_bubble_weighs_uneven_chunks_by_their_blocks():
    """A rank whose chunks differ (a plan's own split, or the default split of a block count not a multiple of p v)
    is walked with each chunk's micro-batches weighed by its blocks: rank 0 of 2, 1, 1, 1, 1, 1, 1, 0 on pp 4 x vpp 2
    holds more blocks x micro-batches than its mean chunk's count (its two-block chunk runs first, with the most in
    flight: a CPU allocator trace read the largest rank -17.3 % before, +0.2 % after); an even split is not walked."""
    from cost_models.layout import SCHEDULES, Layout
    from cost_models.memory import izb_chunk_sizes, rank_inflight
    lay = Layout(gpus=4, tp=1, pp=4, dp=1, cp=1, vpp=2, mbs=1, zero=0, recompute=0, sp=0, offload=0,
                 schedule=SCHEDULES.index("interleaved-zb"))
    even = rank_inflight(lay, 8, 8)
    own = rank_inflight(lay, 8, (2, 1, 1, 1, 1, 1, 1, 0))
    assert float(np.asarray(own["first"][0][0])) > float(np.asarray(even["first"][0][0]))
    assert izb_chunk_sizes(8, 4, 2) is None and izb_chunk_sizes(10, 4, 2) is not None
    assert izb_chunk_sizes((2, 1, 1, 1, 1, 1, 1, 0), 4, 2) is not None
    assert rank_inflight(lay, 8, 8) == rank_inflight(lay, 8, (1,) * 8)  # equal chunks: the closed forms


def test_izb_counts_extend_two_walks_as_the_full_walk_counts():
    """From 5 rounds of p micro-batches on, izb_counts extends the walks of 3 and 4 rounds (held and pending chunks
    alike, the sends held growing by a round's): the full walk of torch's order agrees on every multiple of p up to
    9 rounds, p 2-6, v 2-3, default and hand-made uneven splits, each rank kind."""
    from cost_models.memory import izb_counts, izb_ranks_moments
    for p in range(2, 7):
        for v in (2, 3):
            splits = [tuple(stage_layers(n, p * v)) for n in (p * v + 1, 2 * p * v - 1)]
            splits.append(tuple((3 * s) % 4 for s in range(p * v)))
            for sizes in splits:
                for rounds in (5, 6, 9):
                    m = rounds * p
                    for kind, ranks in (("first", (0,)), ("last", (p - 1,)),
                                        ("mid", tuple(range(1, p - 1)) if p > 2 else (1,))):
                        full = izb_ranks_moments(p, v, m, ranks, sizes).max(axis=0)
                        assert np.allclose(izb_counts(p, v, m, kind, sizes), full), (p, v, sizes, m, kind)
