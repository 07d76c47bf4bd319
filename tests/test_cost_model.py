"""Cost-model formulas against hand-derived and published numbers."""
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cost_models import comm
from cost_models.hardware import constants_from_profile
from cost_models.layout import (Layout, ModelDims, TrainingConsts, rank_block_counts, stage_layers,
                                virtual_stage_blocks)
from cost_models.memory import (PEAK_POINTS_PER_BATCH, activation_bytes_per_layer, in_flight_microbatches,
                                 interleaved_block_peak, layer_params_per_gpu, memory_breakdown, rank_inflight)
from cost_models.params import narayanan_eq2, param_counts
from cost_models.total import bubble_factor, evaluate
from hardware_profiles import load_profile
from planner.schema import ModelSpec

REF = Path(__file__).resolve().parent.parent / "benchmarks" / "reference"


def gpt(layers, hidden, heads, vocab=51200, tied=True):
    return ModelSpec(arch="gpt", layers=layers, hidden=hidden, heads=heads, kv_heads=heads, ffn_hidden=4 * hidden,
                     vocab=vocab, tied_embeddings=tied)


def test_eq2_reproduces_every_table1_parameter_count():
    rows = json.loads((REF / "megatron_sc21_table1.json").read_text())["rows"]
    for r in rows:
        eq2 = narayanan_eq2(r["layers"], r["hidden"], 51200, 2048)
        assert round(eq2 / 1e9, 1) == pytest.approx(r["params_billion"], abs=0.051)
        # our per-tensor count equals eq. 2 plus the final LayerNorm (2h), which eq. 2 leaves out
        ours = param_counts(gpt(r["layers"], r["hidden"], r["heads"]), 2048)["total"]
        assert ours - eq2 == pytest.approx(2 * r["hidden"], abs=1e-3 * r["hidden"])


def test_llama3_8b_count_by_hand():
    spec = ModelSpec(arch="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256)
    # per layer: q,o 2*4096^2; k,v 2*4096*1024; mlp 3*4096*14336; norms 2*4096
    per_layer = 2 * 4096 ** 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    total = 32 * per_layer + 2 * 128256 * 4096 + 4096
    assert param_counts(spec, 8192)["total"] == total == 8_030_261_248


def test_ring_collective_volumes():
    # all-reduce moves 2(n-1)/n of the buffer, all-gather (n-1)/n; a group of one moves nothing
    t, moved = comm.all_reduce(8e9, 8, 100e9, 0.0)
    assert moved == pytest.approx(2 * 7 / 8 * 8e9)
    assert t == pytest.approx(moved / 100e9)
    t, moved = comm.all_gather(8e9, 4, 100e9, 1e-6)
    assert moved == pytest.approx(3 / 4 * 8e9)
    assert t == pytest.approx(moved / 100e9 + 3e-6)
    assert comm.all_reduce(8e9, 1, 100e9, 1e-6) == (0.0, 0.0)


def _lay(**kw):
    base = dict(gpus=8, tp=1, pp=1, dp=8, cp=1, vpp=1, mbs=1, zero=0, recompute=0, sp=0, schedule=1, offload=0)
    base.update(kw)
    return Layout(**base)


def test_bubble_factors():
    # Narayanan 2021: (p-1)/m of the ideal time for 1F1B, (p-1)/(v m) interleaved
    assert bubble_factor(_lay(pp=4, schedule=1), 16) == pytest.approx(3)
    assert bubble_factor(_lay(pp=4, vpp=2, schedule=2), 16) == pytest.approx(1.5)
    # zero-bubble schedules: the fill's (p - 1) forwards stay, (p-1)/(3v) from enough micro-batches on
    # (tests/test_schedule_bubble.py holds these to torch's orders)
    assert bubble_factor(_lay(pp=4, vpp=2, schedule=4), 16) == pytest.approx(3 / 6)
    assert bubble_factor(_lay(pp=4, vpp=2, schedule=4), 2) == pytest.approx((7 - 2) / 3)
    assert bubble_factor(_lay(pp=4, vpp=2, schedule=3), 8) == pytest.approx(3 / 6)
    # interleaved 1F1B below p micro-batches: p - m idle at each chunk change
    assert bubble_factor(_lay(pp=4, vpp=2, schedule=2), 2) == pytest.approx(1.5 + 0.5 * 2)


def test_in_flight_microbatches():
    assert in_flight_microbatches(_lay(pp=4, schedule=1), 16) == 4       # 1F1B: p
    assert in_flight_microbatches(_lay(pp=4, schedule=0), 16) == 16      # GPipe: m
    # interleaved: (v p + p - 1) chunks of L/(p v) layers = (1 + (p-1)/(p v)) full stages (Korthikanti 4.2.3)
    assert in_flight_microbatches(_lay(pp=4, vpp=2, schedule=2), 16) == pytest.approx(4 * (1 + 3 / 8))


def test_stage_layers_uneven():
    assert stage_layers(126, 16) == [7] + [8] * 14 + [7]
    assert sum(stage_layers(126, 16)) == 126
    assert stage_layers(10, 1) == [10]
    assert stage_layers(5, 2) == [3, 2]
    for L in (1, 7, 32, 95, 126):
        for s in (1, 2, 3, 4, 8, 16):
            if s > L:
                continue
            sizes = stage_layers(L, s)
            f, mid, last = rank_block_counts(L, np.array([s]), np.array([1]))
            assert (f[0], last[0]) == (sizes[0], sizes[-1])
            assert mid[0] == (max(sizes[1:-1]) if s > 2 else sizes[0])


def test_rank_block_counts_follow_each_schedules_placement():
    """Blocks per pipeline rank (rank 0, the heaviest middle rank, rank pp-1) as the runtime places the virtual
    stages (stages_of_rank) over stage_layers' sizes, by brute force: the loop, and ZB-V's V (r and 2pp-1-r),
    which the model had counted as the loop (qwen2.5-7b's 28 layers on pp 4: 6, 7, 8 blocks, not 7 on every
    rank: a plan one rank's 2 GB short of fitting was called fitting)."""
    from cost_models.layout import SCH_ZBV, stages_of_rank
    for layers in range(1, 70):
        for pp in range(1, 17):
            for vpp, schedule, name in ((1, 1, "1f1b"), (2, 2, "interleaved"), (3, 2, "interleaved"), (2, SCH_ZBV, "zbv")):
                if layers < pp * vpp:
                    continue
                sizes = stage_layers(layers, pp * vpp)
                per = [sum(sizes[s] for s in stages_of_rank(r, pp, vpp, name)) for r in range(pp)]
                want = (per[0], max(per[1:-1]) if pp > 2 else per[0], per[-1])
                assert tuple(int(x) for x in rank_block_counts(layers, pp, vpp, schedule)) == want, (layers, pp, vpp, name)
    assert [int(x) for x in rank_block_counts(28, 4, 2, SCH_ZBV)] == [6, 7, 8]


def _torch_interleaved_orders(p, v, m):
    """Every rank's action list from torch.distributed.pipelining's ScheduleInterleaved1F1B (its order
    builder, without process groups)."""
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B
    s = ScheduleInterleaved1F1B.__new__(ScheduleInterleaved1F1B)
    s.pp_group_size, s.n_local_stages, s._n_microbatches = p, v, m
    s.number_of_rounds = max(1, m // p)
    s.microbatches_per_round = m // s.number_of_rounds
    return {r: [a for a in s._calculate_single_rank_operations(r) if a is not None] for r in range(p)}


def _torch_orders(schedule: str, p: int, v: int, m: int):
    """Every rank's action list from torch.distributed.pipelining's interleaved-1f1b, interleaved-zb or ZB-V
    order builder (without process groups), and the rank each stage runs on."""
    from torch.distributed.pipelining import schedules as S
    if schedule == "interleaved-1f1b":
        return _torch_interleaved_orders(p, v, m), (lambda st: st % p)
    if schedule == "interleaved-zb":
        s = S.ScheduleInterleavedZeroBubble.__new__(S.ScheduleInterleavedZeroBubble)
        s.pp_group_size, s.n_local_stages, s._n_microbatches = p, v, m
        s.number_of_rounds = max(1, m // p)
        s.microbatches_per_round = m // s.number_of_rounds
        rank_of = lambda st: st % p  # noqa: E731
    else:
        s = S.ScheduleZBVZeroBubble.__new__(S.ScheduleZBVZeroBubble)
        s.pp_group_size, s.n_local_stages, s._n_microbatches, s.num_stages = p, 2, m, 2 * p
        s.stage_index_to_group_rank = S.generate_stage_to_rank_mapping(p, 2 * p, style="v")
        rank_of = s.stage_index_to_group_rank.__getitem__
    return {r: [a for a in s._calculate_single_rank_operations(r) if a is not None] for r in range(p)}, rank_of


@pytest.mark.parametrize("released", [False, True], ids=["torch", "parplan"])
def test_held_sends_and_in_flight_counts_follow_torchs_orders(released):
    """Per rank, the peak over torch's action order of A x chunks whose activations are held + P x chunks
    waiting for their weight-gradient pass + H x sent tensors held to the step's end (the runtime waits on its
    sends when the step ends; a send goes to another rank only), against the model's moments.  ZB-V with as
    many micro-batches as ranks (its order is cut from the one for 2p - 1) is walked (zbv_order_moments).
    released (parplan's runtime under the looped schedules, pipeline.release_output_sends): a stage output's
    send is let go at that micro-batch's backward, so only the input gradients sent are held."""
    from torch.distributed.pipelining.schedules import _ComputationType as C
    A, P, H = 8.0, 5.0, 0.5
    codes = {"interleaved-1f1b": 2, "interleaved-zb": 3, "zbv": 4}
    checked = 0
    for schedule, vs in (("interleaved-1f1b", (2, 3)), ("interleaved-zb", (2, 3)), ("zbv", (2,))):
        for v in vs:
            for p in (2, 3, 4, 8):
                # torch's interleaved schedules also run m that are not multiples of p (m % max(1, m // p) ==
                # 0; the search offers interleaved-zb those from p on), and ZB-V any m
                extra = (tuple(x for x in (p + 1, 3 * p // 2 + 1, 2 * p + 2) if x % max(1, x // p) == 0)
                         if schedule == "interleaved-1f1b" else
                         (1, p + 1, 2 * p - 1, 2 * p + 1, 3 * p - 1) if schedule == "zbv" else
                         tuple(x for x in (p + 1, 2 * p - 1, 2 * p + 2) if x % max(1, x // p) == 0))
                for m in (p, 2 * p, 4 * p) + extra:
                    orders, rank_of = _torch_orders(schedule, p, v, m)
                    last_stage = p * v - 1
                    model = rank_inflight(_lay(gpus=p, pp=p, dp=1, vpp=v, schedule=codes[schedule]), m, p * v,
                                          output_sends_released=released)
                    looped_released = released and schedule != "zbv"
                    mid = 1 if schedule == "interleaved-1f1b" else max(p - 2, 1)
                    for kind, r in (("first", 0), ("mid", mid), ("last", p - 1)):
                        if kind == "mid" and p <= 2:
                            continue
                        act = pend = held = 0
                        peak = 0.0
                        for a in orders[r]:
                            t, st = a.computation_type, a.stage_index
                            act += t == C.FORWARD
                            pend += (t == C.BACKWARD_INPUT) - (t == C.BACKWARD_WEIGHT)
                            act -= t in (C.BACKWARD_WEIGHT, C.FULL_BACKWARD)
                            if t in (C.BACKWARD_INPUT, C.FULL_BACKWARD):
                                held += (st != 0 and rank_of(st - 1) != r) + \
                                    (st != last_stage and rank_of(st + 1) != r and not looped_released)
                            peak = max(peak, act * A + pend * P + held * H)
                        # the model's counts are in stage units (v chunks each)
                        got = max(float(n) * v * A + float(w) * v * P + float(h) * H for n, w, h in model[kind])
                        assert got == pytest.approx(peak), (schedule, p, v, m, kind)
                        checked += 1
    assert checked > 100


def _torch_single_stage_order(schedule_cls, p, m, r):
    """Rank r's events under torch.distributed.pipelining's own Schedule1F1B or ScheduleGPipe
    (`_step_microbatches`, which builds no action list): the schedule runs over a stand-in stage that records its
    forwards and backwards, and its p2p batches and waits are recorded instead of sent."""
    from unittest import mock
    from torch.distributed.pipelining import schedules as S
    log = []

    class Stage:
        stage_index, is_first, is_last = r, r == 0, r == p - 1

        def get_fwd_recv_ops(self, i):
            return []

        get_bwd_recv_ops = get_fwd_recv_ops

        def get_fwd_send_ops(self, i):
            return [] if self.is_last else [("output", i)]

        def get_bwd_send_ops(self, i):
            return [] if self.is_first else [("input_grad", i)]

        def forward_one_chunk(self, i, *args, **kwargs):
            log.append(("F", i))

        def backward_one_chunk(self, i, **kwargs):
            log.append(("B", i))

        def perform_reduce_grad(self, *args):
            pass

    s = schedule_cls.__new__(schedule_cls)
    s._stage, s._n_microbatches, s._num_stages, s.scale_grads = Stage(), m, p, True
    s._check_inputs = lambda *a: ([None] * m, [{}] * m)
    s._initialize_stage = s._maybe_compute_loss = s._maybe_get_loss = s._update_losses = lambda *a: None

    def batch(ops, desc=None):
        log.extend(("send", o) for o in ops)
        return list(ops)

    def wait(work):
        for w in (work.values() if isinstance(work, dict) else work):
            log.extend(("wait", o) for o in (w if isinstance(w, list) else [w]))

    with mock.patch.object(S, "_batch_p2p", batch), mock.patch.object(S, "_wait_batch_p2p", wait), \
            mock.patch.object(S, "_sorted_batch_p2p", lambda ops, desc=None: {0: batch(ops)}):
        s._step_microbatches(None, None, None, None)
    return log


def test_1f1b_and_gpipe_in_flight_counts_follow_torchs_own_runs():
    """The model's moments for 1F1B (p - r micro-batches held) and GPipe (all m) against torch's own
    Schedule1F1B and ScheduleGPipe run over a stand-in stage: the peak over the run of A x micro-batches whose
    activations are held + H x sent tensors not yet waited for that would otherwise be freed (an input gradient
    from its send on; a stage output only once its micro-batch's backward ran).  torch waits on each send within
    a step or two under 1F1B; GPipe holds its input gradients to the end, but while the activations drain."""
    from torch.distributed.pipelining import schedules as S
    A, H = 8.0, 0.5
    checked = 0
    for cls, code in ((S.Schedule1F1B, 1), (S.ScheduleGPipe, 0)):
        for p in (2, 3, 4, 8):
            for m in (p, p + 1, 2 * p, 4 * p) + ((1, p - 1) if code == 0 else ()):
                model = rank_inflight(_lay(gpus=p, pp=p, dp=1, schedule=code), m, p)
                for kind, r in (("first", 0), ("mid", 1), ("last", p - 1)):
                    if kind == "mid" and p <= 2:
                        continue
                    act, out, peak = 0, set(), 0.0
                    done = set()
                    for ev, x in _torch_single_stage_order(cls, p, m, r):
                        if ev == "F":
                            act += 1
                        elif ev == "B":
                            act -= 1
                            done.add(x)
                        elif ev == "send":
                            out.add(x)
                        else:
                            out.discard(x)
                        held = sum(1 for kind_, i in out if kind_ == "input_grad" or i in done)
                        peak = max(peak, act * A + held * H)
                    got = max(float(n) * A + float(w) * 0 + float(h) * H for n, w, h in model[kind])
                    assert got == pytest.approx(peak), (cls.__name__, p, m, kind)
                    checked += 1
    assert checked > 50


def test_virtual_stage_blocks_is_stage_layers():
    for L in (1, 5, 7, 13, 30, 126):
        for p in (1, 2, 3, 4, 16):
            for v in (1, 2, 3, 8):
                if p * v > L + 2:
                    continue
                got = [int(virtual_stage_blocks(L, np.array(p), np.array(v), s)) for s in range(p * v)]
                assert got == stage_layers(L, p * v), (L, p, v)


def test_interleaved_peak_follows_torchs_action_order():
    """The held blocks x micro-batches under interleaved 1F1B, action by action through torch's order,
    with every stage's own block count: the model's peak is the simulated one on every rank, also
    where the stages are uneven and the peak comes after the warm-up."""
    from torch.distributed.pipelining.schedules import _ComputationType
    after_warmup = cases = 0
    by_layers: dict[int, list[tuple[int, int, int, int, int]]] = {}
    for L, p, v, m in [(L, p, v, m) for L in (5, 6, 10, 13, 30, 126) for p in (2, 3, 4, 16) for v in (2, 3, 8)
                       for m in (p, 2 * p, 4 * p, p + 1, 2 * p - 1, 2 * p + 2) if p * v <= L + 2
                       and m % max(1, m // p) == 0]:  # torch's rule: m a multiple of its rounds
        sizes = stage_layers(L, p * v)
        for r, ops in _torch_interleaved_orders(p, v, m).items():
            held = peak = 0
            warm = None
            for a in ops:
                if a.computation_type == _ComputationType.FORWARD:
                    held += sizes[a.stage_index]
                    peak = max(peak, held)
                else:
                    warm = held if warm is None else warm
                    held -= sizes[a.stage_index]
            assert held == 0
            assert interleaved_block_peak(L, p, v, m, r) == peak, (L, p, v, m, r)
            by_layers.setdefault(L, []).append((p, v, m, r, peak))
            after_warmup += peak > warm
            cases += 1
    assert cases == 1032  # the README's count
    assert after_warmup > 50  # the steady state matters, not only the warm-up's end
    # every case of a layer count in one call, three times over: more candidates than one batch of points takes
    for L, rows in by_layers.items():
        p, v, m, r, peak = (np.tile(np.array(c), 3) for c in zip(*rows))
        assert list(interleaved_block_peak(L, p, v, m, r)) == list(peak), L
    assert max(3 * len(rows) for rows in by_layers.values()) * (8 + 2) > PEAK_POINTS_PER_BATCH  # v up to 8
    # vectorised over candidates: the same answers in one call
    p = np.array([2, 4, 16, 16]); v = np.array([2, 2, 8, 8]); m = np.array([4, 8, 32, 16])
    got = interleaved_block_peak(126, p, v, m, np.array([1, 0, 0, 1]))
    assert list(got) == [interleaved_block_peak(126, *a) for a in zip(p, v, m, (1, 0, 0, 1))]


def test_uneven_interleaved_counts_the_light_chunk_once():
    # even stages: Megatron's warm-up count, (v p + p - 1 - 2r) / v per block
    lay = _lay(pp=4, vpp=2, schedule=2)
    even = rank_inflight(lay, 16, layers=16)
    assert even["first"][0][0] == pytest.approx((8 + 3) / 2) and even["last"][0][0] == pytest.approx((8 - 3) / 2)
    # llama3-405b's 126 layers on pp 16 x vpp 8 with 32 micro-batches: rank 0's first chunk (stage 0) has no
    # block, and it is the chunk with 31 micro-batches in flight: its 7 blocks hold 16 each, 112 in all, not
    # 7 x 143 / 8 = 125.1
    lay = _lay(gpus=128, pp=16, vpp=8, schedule=2)
    first = rank_inflight(lay, 32, layers=126)["first"][0][0]
    assert first * 7 == pytest.approx(112)
    assert rank_inflight(lay, 32)["first"][0][0] * 7 == pytest.approx(7 * 143 / 8)


def test_activation_memory_by_hand():
    # llama block, flash attention, no recompute, no SP, tp=1: per token bytes =
    # 2 * (4h + 2*qw + 2*kvw + 3*ffn) + 8 (norm stats) + 4*heads (lse)
    spec = ModelSpec(arch="llama", layers=2, hidden=1024, heads=8, kv_heads=4, ffn_hidden=2816, vocab=1000)
    m = ModelDims.from_spec(spec, 2048)
    per_tok = 2 * (4 * 1024 + 2 * 1024 + 2 * 512 + 3 * 2816) + 8 + 4 * 8
    got = activation_bytes_per_layer(m, _lay(mbs=2), 2, True)
    assert got == pytest.approx(2 * 2048 * per_tok)
    # full recompute keeps only the block input: 2 bytes x h per token
    assert activation_bytes_per_layer(m, _lay(mbs=2, recompute=2), 2, True) == pytest.approx(2 * 2048 * 2 * 1024)
    # tensor + sequence parallel divides everything by tp (Korthikanti's 34/t), the norms' statistics too:
    # with SP the norms run on the rank's s/tp tokens
    a1 = activation_bytes_per_layer(m, _lay(mbs=2, tp=4, sp=1), 2, True)
    assert a1 == pytest.approx(2 * 2048 * per_tok / 4, rel=1e-9)


def test_model_states_by_recipe_and_zero():
    spec = gpt(4, 1024, 16)
    m = ModelDims.from_spec(spec, 1024)
    counts = param_counts(spec, 1024)
    for precision, per_param in (("master-weights", (2, 4, 12)), ("amp", (4, 4, 8))):
        tr = TrainingConsts(global_batch_size=8, dtype="bf16", precision=precision, flash_attention=True,
                            overlap_grad_reduce=True, overlap_tp_comm=False)
        mem = memory_breakdown(m, _lay(dp=8, zero=0), tr, 1)
        # one stage holds every parameter (tied head shares the embedding)
        assert mem["weights"] == pytest.approx(counts["total"] * per_param[0])
        assert mem["grads"] == pytest.approx(counts["total"] * per_param[1])
        assert mem["optimizer"] == pytest.approx(counts["total"] * per_param[2])
        z1 = memory_breakdown(m, _lay(dp=8, zero=1), tr, 1)
        assert z1["optimizer"] == pytest.approx(counts["total"] * per_param[2] / 8)
        # DeepSpeed stage 3: 16-bit (or fp32) weight shards beside the fp32 master shards
        ds = replace(tr, zero3_fsdp2=False)
        z3 = memory_breakdown(m, _lay(dp=8, zero=3), ds, 1)
        assert z3["weights"] == pytest.approx(counts["total"] * per_param[0] / 8)
        assert z3["grads"] == pytest.approx(counts["total"] * per_param[1] / 8)
        # FSDP2: with a master recipe the fp32 shard is the master (no 16-bit shard); the root's
        # parameters (embedding, final norm: everything outside the blocks) stay gathered
        z3 = memory_breakdown(m, _lay(dp=8, zero=3), tr, 1)
        root = counts["total"] - 4 * layer_params_per_gpu(m, 1)
        shard = 0 if precision == "master-weights" else per_param[0]
        assert z3["weights"] == pytest.approx(root * per_param[0] + counts["total"] * shard / 8)
        assert z3["grads"] == pytest.approx(counts["total"] * per_param[1] / 8)
        assert z3["optimizer"] == pytest.approx(counts["total"] * per_param[2] / 8)
        off = memory_breakdown(m, _lay(dp=8, zero=1, offload=1), tr, 1)
        # amp's host optimizer keeps an fp32 copy of its share of the weights beside Adam's states (MasterAdamW);
        # every recipe's takes its share's gradients there in fp32 before the step
        host = per_param[2] + 4 + (4 if precision == "amp" else 0)
        assert off["optimizer"] == 0 and off["offloaded"] == pytest.approx(counts["total"] * host / 8)


def test_mfu_definition():
    """MFU = tokens/s x (6 x matmul params + 12 L h s) / (GPUs x peak)."""
    spec = ModelSpec(arch="llama", layers=24, hidden=2048, heads=16, kv_heads=8, ffn_hidden=5632, vocab=32000)
    m = ModelDims.from_spec(spec, 2048)
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    tr = TrainingConsts(global_batch_size=4, dtype="bf16", precision="amp", flash_attention=True,
                        overlap_grad_reduce=True, overlap_tp_comm=False)
    out = evaluate(m, tr, hw, _lay(gpus=1, dp=1, mbs=4))
    counts = param_counts(spec, 2048)
    flops_tok = 6 * (counts["total"] - counts["embedding"] - 24 * 2 * 2048 - 2048) + 12 * 24 * 2048 * 2048
    assert float(out["model_flops_per_token"]) == pytest.approx(flops_tok)
    mfu = float(out["tokens_per_s"]) * flops_tok / (1 * 989.4e12)
    assert float(out["mfu"]) == pytest.approx(mfu)
    # one GPU: Amdahl speedup 1, no communication
    assert float(out["comm_dp_bytes"]) == 0 and float(out["comm_tp_bytes"]) == 0


@pytest.mark.parametrize("schedule", [1, 4])  # 1F1B, ZB-V (layout.SCH_1F1B, SCH_ZBV)
def test_sp_keeps_the_shard_and_gathers_again_in_the_backward(schedule):
    """Sequence parallelism: Megatron and parplan's runtime keep the shard of the column-parallel
    matmuls' input (h/tp per token, twice a block) and all-gather it again in the backward (parplan's
    under a zero-bubble pipeline in the weight-gradient pass); torch's DTensor SP (torchtitan) keeps
    the gathered input (h per token) and gathers nothing in the backward."""
    from planner.core import training_consts
    from planner.schema import Training
    spec = ModelSpec(arch="llama", layers=8, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=32000)
    m = ModelDims.from_spec(spec, 4096)
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    lay = _lay(gpus=8, tp=4, pp=2, dp=1, vpp=2 if schedule == 4 else 1, sp=1, schedule=schedule)
    tr = dict(seq_len=4096, global_batch_size=8, micro_batch_size=1, num_microbatches=8, precision="master-weights")
    out = {fw: evaluate(m, training_consts(Training(**tr, framework=fw)), hw, lay)
           for fw in ("parplan", "megatron", "torchtitan")}
    per_block = 2 * m.hidden * (1 - 1 / 4) * 2 * 4096  # two inputs, (1 - 1/tp) of h per token more, bf16
    shard = activation_bytes_per_layer(m, lay, 2, True)
    gathered = activation_bytes_per_layer(m, lay, 2, True, sp_saves_gathered=True)
    assert float(gathered - shard) == pytest.approx(per_block)
    act = {k: float(o["mem_activations"]) for k, o in out.items()}
    tp_s = {k: float(o["tp_comm_s"]) for k, o in out.items()}
    tp_b = {k: float(o["comm_tp_bytes"]) for k, o in out.items()}
    assert act["torchtitan"] > act["parplan"] and tp_s["torchtitan"] < tp_s["parplan"]
    # gathering again moves two all-gathers of the block input per block and micro-batch, and one of the head's
    # input on the critical stage's rank, which holds the head here (the last rank under 1F1B, rank 0 under ZB-V's V;
    # the bytes are the critical stage's since 2026-12-05, rank 0's before)
    blocks, micro = 4, 8
    gathers = blocks * 2 + 1
    assert tp_b["parplan"] - tp_b["torchtitan"] == pytest.approx(micro * gathers * 3 / 4 * 4096 * 4096 * 2)
    assert tp_b["megatron"] == tp_b["parplan"]


def test_tp_across_nodes_pays_inter_node_tier():
    spec = gpt(8, 8192, 64)
    m = ModelDims.from_spec(spec, 2048)
    tr = TrainingConsts(global_batch_size=16, dtype="bf16", precision="master-weights", flash_attention=True,
                        overlap_grad_reduce=True, overlap_tp_comm=False)
    prof = load_profile("h100-sxm-80gb")
    inside = evaluate(m, tr, constants_from_profile(prof, "bf16", gpus_per_node=16), _lay(gpus=16, tp=16, dp=1))
    across = evaluate(m, tr, constants_from_profile(prof, "bf16", gpus_per_node=8), _lay(gpus=16, tp=16, dp=1))
    # by hand: 16 micro-batches x (8 blocks x 4 all-reduces + the head's input gradient) of 2048 x 8192 x 2 bytes,
    # and the loss's three all-reduces of 2048 fp32 values, ring over 16 ranks
    msg = 2048 * 8192 * 2

    def ring(nbytes, tier):
        return 2 * 15 / 16 * nbytes / (tier.gbytes_per_s * 1e9 * tier.efficiency) + 2 * 15 * tier.latency_s
    for out, tier in ((inside, prof.nvlink), (across, prof.inter_node)):
        want = 16 * ((8 * 4 + 1) * ring(msg, tier) + 3 * ring(2048 * 4, tier))
        assert float(out["tp_comm_s"]) == pytest.approx(want, rel=1e-6)
    assert float(across["tp_comm_s"]) > 5 * float(inside["tp_comm_s"])


@pytest.mark.parametrize("tp,sp", [(1, 0), (8, 0), (8, 1), (4, 1)])
def test_gpt_with_dropout_reproduces_korthikanti_activation_formula(tp, sp):
    """Korthikanti 2022 eq. 2-5: per layer s*b*h*(34 + 5as/h) bytes without parallelism,
    s*b*h*(10 + 24/t + 5as/(h t)) with TP, s*b*h*(34/t + 5as/(h t)) with TP + SP (16-bit
    activations, dropout, unfused attention).  Ours adds only the LayerNorms' fp32 statistics (a mean and an rstd
    each, 16 bytes a token the two norms see: all s tokens, or s/t with SP)."""
    a, h, s, b = 32, 4096, 2048, 2
    spec = gpt(2, h, a)
    m = ModelDims.from_spec(spec, s)
    got = activation_bytes_per_layer(m, _lay(tp=tp, sp=sp, mbs=b, dp=1, gpus=tp), 2, False, dropout=True)
    if sp:
        k = s * b * h * (34 / tp + 5 * a * s / (h * tp))
    else:
        k = s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp))
    assert got == pytest.approx(k + 16 * s * b / (tp if sp else 1), rel=1e-12)
    # selective recompute drops exactly the 5as/(ht) attention term (Korthikanti sec. 5)
    sel = activation_bytes_per_layer(m, _lay(tp=tp, sp=sp, mbs=b, dp=1, gpus=tp, recompute=1), 2, False, dropout=True)
    assert got - sel == pytest.approx(s * b * h * 5 * a * s / (h * tp), rel=1e-12)


def test_tied_embedding_gradient_sync_across_pipeline_stages():
    """With tied embeddings and pp > 1 the first and last stages all-reduce the V x h / tp embedding
    gradient (2 ranks: the whole buffer moves once) after the backward; untied models skip it."""
    tr = TrainingConsts(global_batch_size=8, dtype="bf16", precision="master-weights", flash_attention=True,
                        overlap_grad_reduce=True, overlap_tp_comm=False)
    prof = load_profile("a100-sxm-80gb")
    hw = constants_from_profile(prof, "bf16")
    lay = _lay(gpus=16, tp=4, pp=4, dp=1, mbs=1)
    tied = evaluate(ModelDims.from_spec(gpt(8, 2048, 16, vocab=250880, tied=True), 2048), tr, hw, lay)
    untied = evaluate(ModelDims.from_spec(gpt(8, 2048, 16, vocab=250880, tied=False), 2048), tr, hw, lay)
    grad_bytes = 250880 * 2048 / 4 * 4  # fp32 grads of the vocab-parallel shard
    tier = prof.inter_node  # tp 4 x (pp - 1) = 12 ranks apart: another node
    expected = grad_bytes / (tier.gbytes_per_s * 1e9 * tier.efficiency) + 2 * tier.latency_s
    assert float(tied["dp_comm_s"]) - float(untied["dp_comm_s"]) == pytest.approx(expected, rel=1e-6)
    assert float(tied["comm_dp_bytes"]) - float(untied["comm_dp_bytes"]) == pytest.approx(grad_bytes)


def test_zbv_runs_the_head_on_rank_0():
    """ZB-V's V puts the last virtual stage on rank 0 beside the first: the head's parameters (memory), its
    gradients (the data-parallel reduce), its time (the critical stage) and a tied embedding's gradient sum
    (local, where the framework's group is the two end stages) all belong to rank 0 there."""
    from cost_models.memory import rank_params
    spec = ModelSpec(arch="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256)
    m = ModelDims.from_spec(spec, 8192)
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    tr = TrainingConsts(global_batch_size=64, dtype="bf16", precision="master-weights", flash_attention=True,
                        overlap_grad_reduce=False, overlap_tp_comm=False)
    got = {}
    for name, sch, v in (("1f1b", 1, 1), ("interleaved", 2, 2), ("zbv", 4, 2)):
        lay = _lay(gpus=16, tp=1, pp=4, dp=4, vpp=v, schedule=sch)
        got[name] = (evaluate(m, tr, hw, lay), [float(x) for x in rank_params(m, lay)])
    for name, (met, (first, mid, last)) in got.items():
        # ZeRO-0 all-reduces the heaviest rank's fp32 gradients over dp 4: 2 x 3/4 of them
        assert float(met["comm_dp_bytes"]) == pytest.approx(1.5 * 4 * max(first, mid, last), rel=1e-9), name
    (zbv, (first, _, last)), (onef1b, (first_1, _, last_1)) = got["zbv"], got["1f1b"]
    head = 128256 * 4096 + 4096
    assert first == pytest.approx(first_1 + head) and last == pytest.approx(last_1 - head)
    assert float(zbv["comm_dp_bytes"]) / float(onef1b["comm_dp_bytes"]) == pytest.approx(first / max(first_1, last_1))
    assert float(zbv["optimizer_s"]) > float(onef1b["optimizer_s"])


def test_zbv_tied_embedding_sum_is_local():
    """ZB-V's rank 0 holds the embedding and the head's copy: their gradients are summed on it, no collective
    (parplan's runtime: sync_tied_embedding_grads with no group; Megatron's two-rank group otherwise)."""
    spec = gpt(8, 2048, 16, vocab=250880, tied=True)
    m = ModelDims.from_spec(spec, 2048)
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    tr = TrainingConsts(global_batch_size=8, dtype="bf16", precision="master-weights", flash_attention=True,
                        overlap_grad_reduce=True, overlap_tp_comm=False)
    untied = ModelDims.from_spec(gpt(8, 2048, 16, vocab=250880, tied=False), 2048)

    def tie_bytes(lay):
        return float(evaluate(m, tr, hw, lay)["comm_dp_bytes"]) - float(evaluate(untied, tr, hw, lay)["comm_dp_bytes"])
    assert tie_bytes(_lay(gpus=4, tp=1, pp=4, dp=1, vpp=2, schedule=4)) == 0.0
    assert tie_bytes(_lay(gpus=4, tp=1, pp=4, dp=1, vpp=2, schedule=2)) == pytest.approx(250880 * 2048 * 4)


def test_amp_recasts_the_weights_in_a_recomputed_forward(monkeypatch):
    """autocast casts each weight (read fp32, write 16 bit: 6 B) once a forward; a recomputed forward (full, or
    op-level selective, which re-runs the ops it does not save) casts again; the head's V x h matmul weight
    is cast whether tied or not.  Checked as the step time with and without the cast passes."""
    import cost_models.total as total
    spec = ModelSpec(arch="llama", layers=4, hidden=2048, heads=16, kv_heads=16, ffn_hidden=5632, vocab=32000)
    m = ModelDims.from_spec(spec, 2048)
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    tr = TrainingConsts(global_batch_size=8, dtype="bf16", precision="amp", flash_attention=True,
                        overlap_grad_reduce=False, overlap_tp_comm=False)
    per_layer = float(layer_params_per_gpu(m, 1))
    cast = lambda n: 8 * n * 6 / hw.hbm_bytes_per_s  # noqa: E731  (8 micro-batches, one stage)
    for rec, casts in ((0, 1), (1, 1), (2, 2), (3, 2)):  # none, selective, full, selective-op
        lay = _lay(gpus=1, dp=1, recompute=rec)
        with_casts = float(evaluate(m, tr, hw, lay)["step_time_s"])
        with monkeypatch.context() as mp:
            mp.setattr(total, "cast_time", lambda params, precision, hw: 0.0 * params)
            without = float(evaluate(m, tr, hw, lay)["step_time_s"])
        assert with_casts - without == pytest.approx(cast(casts * 4 * per_layer + 32000 * 2048), rel=1e-9), rec


def test_search_sized_arrays_take_the_shared_key_paths_and_get_the_same_counts():
    """rank_block_counts and rank_inflight are computed once per distinct (pp, vpp[, schedule, micro-batches])
    for a search's arrays (>= 4096 candidates) and scattered back: the same numbers as element by element."""
    from types import SimpleNamespace

    from cost_models.memory import rank_inflight_by_key
    rng = np.random.default_rng(0)
    n = 6000
    pp = rng.choice([1, 2, 3, 4, 8, 16], n)
    vpp = rng.choice([1, 2, 3, 4], n)
    sch = rng.integers(0, 5, n)
    vpp = np.where(sch == 4, 2, np.where(sch >= 2, vpp, 1))
    m = pp * rng.integers(1, 6, n)
    for layers in (126, 32, 7):
        big = rank_block_counts(layers, pp, vpp, sch)
        for i in range(0, n, 97):
            assert [int(x[i]) for x in big] == [int(x) for x in rank_block_counts(layers, pp[i], vpp[i], sch[i])]
        keyed = rank_inflight_by_key(SimpleNamespace(pp=pp, vpp=vpp, schedule=sch), m.astype(float), layers)
        direct = rank_inflight(SimpleNamespace(pp=pp, vpp=vpp, schedule=sch), m.astype(float), layers)
        for kind in ("first", "mid", "last"):
            for a, b in zip(keyed[kind], direct[kind]):
                for x, y in zip(a, b):
                    np.testing.assert_array_equal(np.broadcast_to(x, (n,)), np.broadcast_to(y, (n,)))


def test_xgmi_mesh_gives_a_group_the_links_to_its_peers():
    """MI300X's xGMI is a full mesh of 7 links per GPU, not a switch: tp 2 (and a pipeline send) drives one
    link, tp 4 three, tp 8 all seven; an NVSwitch node gives every group the whole bandwidth."""
    import numpy as np
    from cost_models import comm
    from cost_models.hardware import constants_from_profile
    from planner.core import load_hardware
    mi = constants_from_profile(load_hardware("mi300x"))
    link = 64e9 * 0.75
    for size, links in ((2, 1), (4, 3), (8, 7)):
        bw, _ = comm.tier_params(mi, True, size)
        assert float(bw) == pytest.approx(links * link)
    assert float(comm.tier_params(mi, True)[0]) == pytest.approx(7 * link)  # no size: the whole mesh
    h100 = constants_from_profile(load_hardware("h100-sxm-80gb"))
    assert np.allclose(comm.tier_params(h100, True, np.array([2, 4, 8]))[0], h100.nvlink.bytes_per_s)
    # the planner sees it: a ring all-reduce moves 2 (n-1)/n of the bytes, over one link at tp 2 and seven at
    # tp 8, so tp 2 takes (1 / 1) / ((7/4) / 7) = 4x as long for the same bytes (latency aside: 1 GB)
    t2 = comm.all_reduce(1e9, 2, *comm.tier_params(mi, True, 2))[0]
    t8 = comm.all_reduce(1e9, 8, *comm.tier_params(mi, True, 8))[0]
    assert float(t2 / t8) == pytest.approx(4.0, rel=0.01)


@pytest.mark.parametrize("name,seq,gpus", [("llama3-70b", 4096, 64), ("llama3-8b", 131072, 64), ("gpt3-175b", 2048, 512)])
def test_a_blocks_costs_lie_where_the_zero_bubble_forms_were_checked(name, seq, gpus):
    """bubble_factor's ZB-V form was fitted to torch's order where b >= f and w <= b (the input-gradient
    pass holds the twins of the weight pass's GEMMs, and the attention's backward, heavier than its
    forward): every candidate's block, flash or not, fused or eager, has that split."""
    from cost_models.compute import block_time
    from planner.models import load_preset
    from planner.search import Pins, build_layouts
    m = ModelDims.from_spec(load_preset(name), seq)
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    lay = build_layouts(m, gpus, 512, Pins())
    for flash in (True, False):
        for fused in (True, False):
            bt = block_time(m, lay, hw, 2, flash, False, fused)
            f, w = bt["fwd"], bt["wgrad"]
            b = bt["bwd"] - w
            assert np.all(b >= f) and np.all(w <= b)


@pytest.mark.parametrize("dropout", [False, True])
def test_unfused_backward_temporaries_split_over_cp_like_the_tokens(dropout):
    """Under cp a rank holds seq/cp query tokens, each attending the whole sequence: the unfused backward's
    score-sized temporaries, like every other term, scale with the rank's tokens (1/cp), not 1/cp^2 (they had
    been divided by cp twice).  Saved activations agree."""
    from cost_models.memory import backward_temporaries_per_layer
    from planner.models import load_preset
    spec = load_preset("llama3-8b")
    m = ModelDims.from_spec(spec, 8192)
    one, two = (_lay(gpus=8, tp=2, dp=4 // cp, cp=cp, sp=1) for cp in (1, 2))
    for f in (backward_temporaries_per_layer, activation_bytes_per_layer):
        assert float(f(m, two, 2, False, dropout)) == pytest.approx(float(f(m, one, 2, False, dropout)) / 2)


def test_fsdp2_gradient_passes_counted_from_its_reduce_path():
    """FSDP2's gradient bytes per parameter, by hand from torch's _fully_shard code, for 1e9 parameters, 4
    micro-batches, 8 shards at 1 TB/s.  master-weights (bf16 gradients reduced in fp32), no pipeline: each
    micro-batch's reduce-scatter copies its gradients in (read 2 + write 4) and from the second on adds the
    fp32 output to the shard (12 / 8): 4 x 6 + 3 x 1.5 = 28.5 B, where parplan's main_grad hook is
    6 + 3 x 10 = 36 B.  In a pipeline the gradients stay unsharded to the last backward: cast (6), three
    adds (10 each) and one copy-in (8): 44 B.  master-weights-half-grads (reduced in bf16): copy-in 2 + 2 and
    the output's cast to the fp32 shard (2 + 4) / 8 every micro-batch, the adds 4.5: 23.5 B."""
    from types import SimpleNamespace

    from cost_models.compute import grad_accumulation_time

    hw = SimpleNamespace(hbm_bytes_per_s=1e12)
    t = lambda precision, **kw: float(grad_accumulation_time(1e9, 4, precision, hw, shards=8, **kw))  # noqa: E731
    assert t("master-weights", fsdp2=True) == pytest.approx(28.5e-3)
    assert t("master-weights", fsdp2=False) == pytest.approx(36e-3)
    assert t("master-weights", fsdp2=True, pp=2) == pytest.approx(44e-3)
    assert t("master-weights-half-grads", fsdp2=True) == pytest.approx(23.5e-3)
    assert t("fp32", fsdp2=True) == pytest.approx((4 * 8 + 3 * 1.5) * 1e-3)  # fp32 copy-in 4 + 4, no cast


@pytest.mark.parametrize("rec, exchanges", [(0, {"parplan": 2, "megatron": 3, "torchtitan": 3}),
                                            (1, {"parplan": 3, "megatron": 4}),
                                            (2, {"parplan": 3, "megatron": 4, "torchtitan": 4}),
                                            (3, {"parplan": 3, "torchtitan": 3})])
def test_cp_exchanges_per_block_follow_what_the_backward_has(rec, exchanges):
    """Context parallelism's K/V traffic, in exchanges of (cp-1)/cp of the full-sequence K/V a block and micro-batch:
    the forward's, the backward's dK/dV, and K/V again in the backward where the gathered K/V is not saved (Megatron's
    and torch's rings; parplan's runtime saves it); +1 where a recompute runs the forward's exchange again (full;
    selective, which checkpoints the attention with it; op-level where the gather sits outside the attention op:
    parplan's runtime, not torchtitan's SDPA, which the policy saves)."""
    from planner.core import training_consts
    from planner.schema import Training
    spec = ModelSpec(arch="llama", layers=8, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=32000)
    seq, cp, tp, micro = 32768, 4, 2, 4
    m = ModelDims.from_spec(spec, seq)
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    lay = _lay(gpus=8, tp=tp, dp=1, cp=cp, sp=1, recompute=rec)
    tr = dict(seq_len=seq, global_batch_size=micro, micro_batch_size=1, num_microbatches=micro,
              precision="master-weights")
    kv_full = seq * 2 * 8 * 128 / tp * 2  # the full sequence's K and V of the rank's kv heads, bf16
    one = kv_full * (cp - 1) / cp
    for fw, n in exchanges.items():
        out = evaluate(m, training_consts(Training(**tr, framework=fw)), hw, lay)
        assert float(out["comm_cp_bytes"]) == pytest.approx(micro * 8 * n * one), fw


@pytest.mark.parametrize("sp", [0, 1])
def test_the_vocab_parallel_head_reduces_its_input_gradient_and_the_losss_three_values(sp):
    """tp 2, one stage: a block's four all-reduces (Narayanan sec. 3.3; with SP as gathers and reduce-scatters
    of the same volume, and two gathers again in the backward), the embedding's (half with SP: a reduce-scatter),
    and the head's: its input gradient (Megatron's and parplan's column-parallel output layer; with SP a gather
    forward, again backward, and a reduce-scatter) and the vocab-parallel cross-entropy's three fp32 values a
    token (max, sum of exponentials, target logit; parallel_layers.layers).  Communication, not compute: the head's
    collectives are in tp_comm_s, and compute_s holds the blocks' and the head's own time only."""
    from planner.core import training_consts
    from planner.schema import Training
    from cost_models.compute import block_time, head_time
    spec = ModelSpec(arch="llama", layers=4, hidden=2048, heads=16, kv_heads=8, ffn_hidden=5632, vocab=32000)
    seq, tp, micro = 4096, 2, 4
    m = ModelDims.from_spec(spec, seq)
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    lay = _lay(gpus=2, tp=tp, dp=1, sp=sp)
    tr = training_consts(Training(seq_len=seq, global_batch_size=micro, micro_batch_size=1, num_microbatches=micro,
                                  precision="master-weights"))
    out = evaluate(m, tr, hw, lay)
    ar = 2 * (tp - 1) / tp  # of the all-reduced bytes, sent per rank
    blocks = 4 * 4 + (4 * 2 * 0.5 if sp else 0)  # + SP's two backward re-gathers a block, half an all-reduce each
    emb = 0.5 if sp else 1.0
    head = 1.5 if sp else 1.0  # SP: gather, gather again, reduce-scatter
    hidden_bytes = seq * 2048 * 2
    want = micro * ((blocks + emb + head) * ar * hidden_bytes + 3 * ar * seq * 4)
    assert float(out["comm_tp_bytes"]) == pytest.approx(want)
    # compute_s is the blocks' and the head's own time (a faster network changes tp_comm_s, never compute_s)
    fast = replace(hw, nvlink=replace(hw.nvlink, bytes_per_s=hw.nvlink.bytes_per_s * 1e3))
    quick = evaluate(m, tr, fast, lay)
    assert float(quick["compute_s"]) == pytest.approx(float(out["compute_s"]), rel=1e-12)
    assert float(quick["tp_comm_s"]) < 0.1 * float(out["tp_comm_s"])
    bt = block_time(m, lay, hw, 2, True, tr.dropout, tr.fused_elementwise, tr.eager_runtime, tr.attention_kernel)
    head = float(out["compute_s"]) / micro - 4 * float(bt["total"])
    h_f, h_b = head_time(m, lay, hw)  # the default loss bytes: the head's GEMMs at least
    assert 0.9 * (h_f + h_b) < head < 1.5 * (h_f + h_b)
    one = evaluate(m, tr, hw, _lay(gpus=1, tp=1, dp=1))
    assert float(out["tp_comm_s"]) > 0 and float(one["tp_comm_s"]) == 0


def test_fsdp2_gathers_its_root_once_a_micro_batch():
    """FSDP2 keeps its root unit gathered from the forward to the backward (torch's FSDPState._lazy_init); the
    blocks are gathered for the forward and again for the backward.  dp 8, ZeRO-3, one stage, 4 micro-batches:
    the FSDP2 frameworks send (d-1)/d of the root's bf16 bytes once a micro-batch fewer than a stage-3 that
    gathers everything twice."""
    from planner.core import training_consts
    from planner.schema import Training
    from cost_models.memory import embedding_params_per_gpu, head_params_per_gpu
    spec = ModelSpec(arch="llama", layers=4, hidden=2048, heads=16, kv_heads=8, ffn_hidden=5632, vocab=32000)
    seq, dp, micro = 4096, 8, 4
    m = ModelDims.from_spec(spec, seq)
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    lay = _lay(gpus=dp, dp=dp, zero=3)
    tr = training_consts(Training(seq_len=seq, global_batch_size=micro * dp, micro_batch_size=1,
                                  num_microbatches=micro, precision="master-weights"))
    assert tr.zero3_fsdp2
    fsdp2, twice = (float(evaluate(m, replace(tr, zero3_fsdp2=f), hw, lay)["comm_dp_bytes"]) for f in (True, False))
    root = float(embedding_params_per_gpu(m, 1) + head_params_per_gpu(m, 1, 1))
    assert root > 0.0
    assert twice - fsdp2 == pytest.approx(micro * root * 2 * (dp - 1) / dp, rel=1e-9)


def test_fsdp2_in_a_pipeline_gathers_the_heaviest_stages_own_root():
    """Under a pipeline the data-parallel traffic is the heaviest stage's (FSDP2 keeps the weights gathered from a
    stage's first forward to its last backward: one gather of a block and its reduce-scatter a step; it had been
    counted twice, a forward's and a backward's, where the runtime gathered m + 1 times).  A middle stage holds no
    root: all its parameters are blocks'; it had been charged rank 0's embedding as its root when it outweighed
    rank 0."""
    from planner.core import training_consts
    from planner.schema import Training
    from cost_models.memory import layer_params_per_gpu
    spec = ModelSpec(arch="llama", layers=22, hidden=1024, heads=8, kv_heads=8, ffn_hidden=2816, vocab=1024)
    seq, dp, micro = 1024, 4, 4
    m = ModelDims.from_spec(spec, seq)
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    lay = _lay(gpus=3 * dp, pp=3, dp=dp, zero=3)
    assert [int(x) for x in rank_block_counts(22, 3, 1)] == [7, 8, 7]
    tr = training_consts(Training(seq_len=seq, global_batch_size=micro * dp, micro_batch_size=1,
                                  num_microbatches=micro, precision="master-weights"))
    mid = 8 * float(layer_params_per_gpu(m, 1))
    got = float(evaluate(m, tr, hw, lay)["comm_dp_bytes"])
    assert got == pytest.approx((2 + 4) * mid * (dp - 1) / dp, rel=1e-9)


def test_the_heads_input_gradient_collective_hides_behind_its_weight_gradient_gemm_where_the_blocks_do():
    """The head's input-gradient all-reduce is T x h whatever the vocabulary, so without the asynchronous start the
    head's TP time does not depend on the vocabulary; started beside the head's weight-gradient GEMM (Megatron's and
    parplan's async_tp_grad_comm, as the blocks' column-parallel layers) it hides behind that GEMM, which grows with
    the vocabulary."""
    from planner.core import training_consts
    from planner.schema import Training
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    lay = _lay(gpus=8, tp=8, dp=1)
    tr = training_consts(Training(seq_len=4096, global_batch_size=4, micro_batch_size=1, num_microbatches=4,
                                  precision="master-weights"))

    def tp_s(vocab, async_on):
        spec = ModelSpec(arch="llama", layers=2, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, vocab=vocab)
        return float(evaluate(ModelDims.from_spec(spec, 4096), replace(tr, async_tp_grad_comm=async_on), hw,
                              lay)["tp_comm_s"])
    assert tp_s(256, False) == pytest.approx(tp_s(128256, False), rel=1e-12)
    assert tp_s(128256, True) < tp_s(256, True) < tp_s(256, False)



def _consts(precision="master-weights", batch=64):
    return TrainingConsts(global_batch_size=batch, dtype="bf16", precision=precision, flash_attention=True,
                          overlap_grad_reduce=False, overlap_tp_comm=False)


def test_zbv_ranks_memory_and_times_follow_the_v():
    """Memory and time take each rank's blocks from the V (rank_block_counts with the schedule): 28 layers on pp 4
    under ZB-V hold 6 blocks on rank 0 (beside the embedding and the head) and 8 on rank 3 -- as 32 layers' rank 3
    does -- where the loop's counting had read 7 and 7; and rank 3 is then the critical stage."""
    from cost_models.layout import SCH_ZBV
    from cost_models.memory import embedding_params_per_gpu, head_params_per_gpu, layer_params_per_gpu, rank_params
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    lay = _lay(pp=4, vpp=2, dp=2, schedule=SCH_ZBV)

    def dims(layers):
        return ModelDims.from_spec(ModelSpec(arch="llama", layers=layers, hidden=1024, heads=8, kv_heads=4,
                                             ffn_hidden=2816, vocab=4096), 2048)
    m = dims(28)
    per = layer_params_per_gpu(m, 1)
    first, _, last = rank_params(m, lay)
    assert float(last) == pytest.approx(8 * per)
    assert float(first) == pytest.approx(6 * per + embedding_params_per_gpu(m, 1) + head_params_per_gpu(m, 1, 4))
    got, even = evaluate(m, _consts(), hw, lay), evaluate(dims(32), _consts(), hw, lay)
    assert float(got["mem_last"]) == pytest.approx(float(even["mem_last"]), rel=1e-12)
    # the critical stage is rank 3's 8 blocks, not the loop's 7 (interleaved 1F1B places 28 layers 7 a rank)
    loop = evaluate(m, _consts(), hw, _lay(pp=4, vpp=2, dp=2, schedule=2))
    assert float(got["compute_s"]) > 1.1 * float(loop["compute_s"])


def test_a_recomputed_block_never_takes_memory_off_and_buckets_never_exceed_the_gradients():
    """Op-level selective recompute under SP at tp 16 saves more than the whole no-recompute set (full-width
    row-parallel outputs): what the recompute rebuilds is then nothing, not a negative amount.  The data-parallel
    bucket copies hold at most the rank's gradients (a 3.4 MB model had been charged 52 MB).  And a host optimizer
    over fp32 weights keeps a host copy of them (4 B a parameter, sharded as its states), beside the gradients."""
    from cost_models.memory import activation_bytes_working_layer, memory_breakdown, rebuilt_bytes
    m = ModelDims.from_spec(ModelSpec(arch="llama", layers=8, hidden=4096, heads=32, kv_heads=16, ffn_hidden=11008,
                                      vocab=32000), 4096)
    op = _lay(gpus=16, tp=16, sp=1, recompute=3, dp=1)
    saved = activation_bytes_per_layer(m, op, 2, True)
    assert saved > activation_bytes_working_layer(m, op, 2, True)  # the case itself
    assert rebuilt_bytes(activation_bytes_working_layer(m, op, 2, True), saved) == 0
    none = _lay(gpus=16, tp=16, sp=1, recompute=0, dp=1)
    # what the block being back-propagated adds: its temporaries alone, as without recompute
    assert float(memory_breakdown(m, op, _consts(batch=16), 16)["other"]) == pytest.approx(
        float(memory_breakdown(m, none, _consts(batch=16), 16)["other"]), rel=1e-9)
    tiny = ModelDims.from_spec(ModelSpec(arch="llama", layers=2, hidden=64, heads=4, kv_heads=2, ffn_hidden=128,
                                         vocab=256), 64)
    two = memory_breakdown(tiny, _lay(gpus=2, dp=2), _consts("fp32", 4), 1)
    one = memory_breakdown(tiny, _lay(gpus=1, dp=1), _consts("fp32", 4), 2)
    added = float(two["other"]) - float(one["other"])
    assert 0 < added <= float(two["grads"]) * (1 + 1e-9)
    off = memory_breakdown(tiny, _lay(gpus=2, dp=2, zero=1, offload=1), _consts("fp32", 4), 1)
    kept = memory_breakdown(tiny, _lay(gpus=2, dp=2, zero=1), _consts("fp32", 4), 1)
    # Adam's 8 B + the 4 B copy of the weights + the 4 B fp32 gradients taken to the host for the step
    assert float(off["offloaded"]) == pytest.approx(float(kept["optimizer"]) * 16 / 8)


def test_fsdp2_offload_copies_each_gathered_shard_over_the_host_link():
    """FSDP2's CPUOffloadPolicy keeps the shards on the host: every gather copies the rank's fp32 master shard up the
    host link and every reduce-scatter its fp32 gradient down, per micro-batch (pp 1: a block gathered for its
    forward and its backward, the root once); the optimizer steps the host shards in place, with no copy a step.
    Halving the link adds exactly those copies' time once they outlast the compute beside them; ZeRO-1 offload
    (parplan's host Adam) crosses the link once a step in the optimizer instead."""
    from planner.core import training_consts
    from planner.schema import Training
    from cost_models.memory import embedding_params_per_gpu, head_params_per_gpu, layer_params_per_gpu
    spec = ModelSpec(arch="llama", layers=4, hidden=1024, heads=8, kv_heads=8, ffn_hidden=2816, vocab=1024)
    seq, micro = 1024, 6
    m = ModelDims.from_spec(spec, seq)
    tr = training_consts(Training(seq_len=seq, global_batch_size=micro, micro_batch_size=1, num_microbatches=micro,
                                  precision="master-weights"))
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    slow = replace(hw, host_link_bytes_per_s=1e9)
    slower = replace(hw, host_link_bytes_per_s=0.5e9)
    z3 = _lay(gpus=1, dp=1, zero=3, offload=1)
    blocks = 4 * float(layer_params_per_gpu(m, 1))
    root = float(embedding_params_per_gpu(m, 1) + head_params_per_gpu(m, 1, 1))
    per_micro = (2 * blocks + root) * 4 + (blocks + root) * 4  # up: two gathers of a block, one of the root; down
    a, b = (evaluate(m, tr, h, z3) for h in (slow, slower))
    assert float(b["dp_comm_s"] - a["dp_comm_s"]) == pytest.approx(micro * per_micro / 1e9, rel=1e-9)
    assert float(b["optimizer_s"]) == pytest.approx(float(a["optimizer_s"]), rel=1e-12)
    z1 = _lay(gpus=1, dp=1, zero=1, offload=1)
    a, b = (evaluate(m, tr, h, z1) for h in (slow, slower))
    assert float(a["dp_comm_s"]) == float(b["dp_comm_s"]) == 0.0
    # the gradients down (4 B) and the 16-bit weights back (2 B), once a step
    assert float(b["optimizer_s"] - a["optimizer_s"]) == pytest.approx((blocks + root) * 6 / 1e9, rel=1e-9)


def test_deepspeed_offload_accumulates_gradients_through_the_host_link():
    """DeepSpeed's optimizer offload accumulates the rank's gradient partition in a host buffer of the parameters'
    dtype through the GPU (stage_1_and_2.py async_accumulate_grad_in_cpu_via_gpu, stage3.py partition_grads): ZeRO-2
    copies down with each of m reductions and up with all but the first, ZeRO-3 down and up with all m, ZeRO-1
    (which reduces at the boundary only) once; with one micro-batch ZeRO-1/2 copy nothing.  Halving the link adds
    exactly those copies' time once they outlast the compute beside them, each rank's for its 1/dp partition
    (dp 1 and 2).  Its host holds the buffer, the partition's fp32 gradient (4 B) and at ZeRO-1/2 a 16-bit copy of
    the partition's parameters beside the Adam states; parplan's offload only the fp32 gradient, once a step."""
    from planner.core import training_consts
    from planner.schema import Training
    from cost_models.memory import embedding_params_per_gpu, head_params_per_gpu, layer_params_per_gpu
    spec = ModelSpec(arch="llama", layers=4, hidden=1024, heads=8, kv_heads=8, ffn_hidden=2816, vocab=1024)
    seq = 1024
    m = ModelDims.from_spec(spec, seq)
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    slow, slower = replace(hw, host_link_bytes_per_s=1e9), replace(hw, host_link_bytes_per_s=0.5e9)
    params = 4 * float(layer_params_per_gpu(m, 1)) + float(embedding_params_per_gpu(m, 1) + head_params_per_gpu(m, 1, 1))
    copy = params * 2 / 1e9  # one 16-bit copy of the partition at 1e9 B/s: halving the link adds this much again

    def consts(framework, micro, dp=1):
        return training_consts(Training(seq_len=seq, global_batch_size=micro * dp, micro_batch_size=1,
                                        num_microbatches=micro, precision="master-weights", framework=framework,
                                        zero2_grad_reduce="per-micro-batch"))

    for micro, dp in ((6, 1), (1, 1), (6, 2), (1, 2)):
        ds, own = consts("deepspeed", micro, dp), consts("parplan", micro, dp)
        # ZeRO-2 copies down with every reduction and up for all but the first (DeepSpeed since PR #7967)
        for zero, copies in ((1, 1 if micro > 1 else 0), (2, 2 * micro - 1 if micro > 1 else 0), (3, 2 * micro)):
            lay = _lay(gpus=dp, dp=dp, zero=zero, offload=1)
            a, b = (evaluate(m, ds, h, lay) for h in (slow, slower))
            # each rank copies its 1/dp partition (the reductions themselves are NVLink's: unchanged)
            assert float(b["dp_comm_s"] - a["dp_comm_s"]) == pytest.approx(copies * copy / dp, rel=1e-9, abs=1e-12)
            # the optimizer's step a step: gradients down in fp32 (4 B), 16-bit weights back (2 B)
            assert float(b["optimizer_s"] - a["optimizer_s"]) == pytest.approx(params / dp * 6 / 1e9, rel=1e-9)
            # beyond the master and Adam's m, v and the fp32 gradient (16 B): the accumulation buffer, and at
            # ZeRO-1/2 the 16-bit parameters the CPU Adam writes (2 B each), all of the rank's 1/dp
            held = float(a["mem_offloaded"]) - params / dp * 16
            extra = (2 if zero == 3 or micro > 1 else 0) + (2 if zero < 3 else 0)
            assert held == pytest.approx(params / dp * extra, abs=1e-3 * params)
            if zero < 3:  # parplan's runtime (FSDP2 at ZeRO-3, its own copies): no copies timed; the states and
                # the fp32 gradients its MasterAdamW takes to the host before the step (4 B), once
                a, b = (evaluate(m, own, h, lay) for h in (slow, slower))
                assert float(b["dp_comm_s"] - a["dp_comm_s"]) == 0.0
                assert float(a["mem_offloaded"]) == pytest.approx(params / dp * (12 + 4), rel=1e-9)
    # weights above DeepSpeed's prefetch bucket (zero3.block_comm, one weight ahead): the copies go with each
    # weight's reduce-scatter, and on a link slow enough to leave the compute no part they are all of the difference
    from cost_models import zero3
    big = ModelDims.from_spec(gpt(2, 12288, 96), 2048)
    lay, kept = _lay(gpus=8, dp=8, zero=3, offload=1), _lay(gpus=8, dp=8, zero=3)
    assert bool(zero3.one_weight_ahead(big, 1))
    crawl = replace(hw, host_link_bytes_per_s=1e6)
    ds = consts("deepspeed", 2, dp=8)
    added = float(evaluate(big, ds, crawl, lay)["dp_comm_s"] - evaluate(big, ds, crawl, kept)["dp_comm_s"])
    stage = 2 * float(layer_params_per_gpu(big, 1)) + float(embedding_params_per_gpu(big, 1))
    assert added == pytest.approx(2 * 2 * stage / 8 * 2 / 1e6, rel=0.01)


def test_partial_recompute_mixes_each_blocks_own_costs():
    """Full recompute of the first N blocks of each virtual stage (Layout.recompute_layers, Megatron-LM's block
    method): a rank's compute, TP collectives, bytes and 1F1B bubble are sums over its blocks, so they are
    N/c of full recompute's plus the rest of no recompute's, exactly (c blocks a stage); so are a single rank's
    saved activations.  Memory is no more than that chord and falls as N grows; N = 0 or N >= c is full recompute;
    the search's step floor stays under the step."""
    from cost_models.total import step_floor
    m = ModelDims.from_spec(ModelSpec(arch="llama", layers=16, hidden=2048, heads=16, kv_heads=4, ffn_hidden=5632,
                                      vocab=32000), 4096)
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    tr = _consts(batch=32)
    for base in (dict(gpus=8, tp=2, pp=4, dp=1, sp=1), dict(gpus=2, tp=2, pp=1, dp=1, sp=1)):
        c = 16 // base["pp"]
        none, full = (evaluate(m, tr, hw, _lay(**base, recompute=r)) for r in (0, 2))
        assert all(float(evaluate(m, tr, hw, _lay(**base, recompute=2, recompute_layers=n))[k]) == float(full[k])
                   for n in (0, c, c + 3) for k in ("step_time_s", "mem_total"))
        last = None
        for n in range(1, c):
            f = n / c
            part = evaluate(m, tr, hw, _lay(**base, recompute=2, recompute_layers=n))
            for k in ("compute_s", "tp_comm_s", "bubble_s", "comm_tp_bytes", "mem_activations"):
                if base["pp"] > 1 and k == "mem_activations":
                    continue  # the worst rank's part; a single rank's is exact
                assert float(part[k]) == pytest.approx(float((1 - f) * none[k] + f * full[k]), rel=1e-12), (n, k)
            total = float(part["mem_total"])
            assert float(full["mem_total"]) <= total <= float((1 - f) * none["mem_total"] + f * full["mem_total"]) * (1 + 1e-12)
            assert last is None or total <= last
            last = total
            floor = float(step_floor(m, tr, hw, _lay(**base, recompute=2, recompute_layers=n)))
            assert floor <= float(part["step_time_s"])
            # the hardware FLOPs a step: the recompute's share of full recompute's extra
            hw_flops = float(part["hardware_tflops_per_gpu"] * part["step_time_s"])
            assert hw_flops == pytest.approx(float((1 - f) * none["hardware_tflops_per_gpu"] * none["step_time_s"]
                                                   + f * full["hardware_tflops_per_gpu"] * full["step_time_s"]), rel=1e-9)


def test_partial_recompute_on_uneven_stages_takes_the_largest_stages_share():
    """16 blocks over pp 3 are stages of 5, 6 and 5: N = 5 recomputes 5 of the critical stage's 6, so its time is
    1/6 no recompute's and 5/6 full recompute's (the mean stage, 5.33 blocks, had read 15/16 recomputed), and the
    smaller stages, which recompute all 5, are charged for 1/6 kept: memory an upper bound on every rank."""
    from cost_models.layout import largest_virtual_stage, recomputed_share
    m = ModelDims.from_spec(ModelSpec(arch="llama", layers=16, hidden=2048, heads=16, kv_heads=4, ffn_hidden=5632,
                                      vocab=32000), 4096)
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    tr = _consts(batch=32)
    base = dict(gpus=6, tp=2, pp=3, dp=1, sp=1)
    assert stage_layers(16, 3) == [5, 6, 5] and int(largest_virtual_stage(16, _lay(**base))) == 6
    part = _lay(**base, recompute=2, recompute_layers=5)
    assert float(recomputed_share(16, part)) == pytest.approx(5 / 6)
    none, full, got = (evaluate(m, tr, hw, x) for x in (_lay(**base, recompute=0), _lay(**base, recompute=2), part))
    for k in ("compute_s", "step_time_s"):
        assert float(got[k]) == pytest.approx(float(none[k] / 6 + full[k] * 5 / 6), rel=1e-12), k


def test_the_runtime_checkpoints_the_first_blocks_of_a_stage():
    """parplan's runtime under recompute_layers N checkpoints a stage module's first N blocks (Megatron-LM's block
    method) and runs the rest as they are: the tensors autograd saves inside each block (the parameters aside), a
    one-process stage without tensor parallelism.  A checkpointed block saves none of its own."""
    import torch
    from parallel_layers.model import ModelConfig, StageModule, init_parameters
    cfg = ModelConfig(arch="llama", layers=4, hidden=64, heads=4, kv_heads=2, ffn_hidden=128, vocab=100, head_dim=16,
                      tied_embeddings=False, max_seq_len=16)

    def saved_per_block(recompute, n):
        st = StageModule(cfg, [0, 1, 2, 3], first=False, last=False, tp_group=None, recompute=recompute,
                         recompute_layers=n)
        init_parameters(st, 0)
        params = {p.data_ptr() for p in st.parameters()}
        now, seen = [None], {}
        for i, b in enumerate(st.blocks):
            b.register_forward_pre_hook(lambda mod, a, i=i: now.__setitem__(0, i))

        def pack(t):
            if t.data_ptr() not in params:
                seen.setdefault(now[0], set()).add(t.data_ptr())
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):  # what the forward saves
            y = st(torch.randn(2, 16, 64, requires_grad=True))
        y.sum().backward()  # (and the stage still trains)
        return st.recomputed_blocks, [len(seen.get(i, ())) for i in range(4)]
    n_none, kept = saved_per_block("none", None)
    assert n_none == 0 and all(k > 0 for k in kept)
    for n, want in ((1, 1), (3, 3), (None, 4), (9, 4)):
        blocks, saved = saved_per_block("full", n)
        assert blocks == want
        assert saved[want:] == kept[want:] and all(s <= 1 < k for s, k in zip(saved[:want], kept[:want])), (n, saved)


def test_amdahl_fraction_is_the_law_solved_for_the_speedup():
    """The parallel fraction a plan reports is Amdahl's law, 1/S = (1 - a) + a/n, solved for a at the plan's own
    speedup S on n GPUs (a speedup below one, communication slower than a GPU's compute, reads 0)."""
    from planner.core import recommend
    from planner.models import load_preset
    for name, gpus in (("llama3-8b", 8), ("llama3-70b", 64), ("gpt3-175b", 1024)):
        am = recommend(load_preset(name), gpus).prediction.amdahl
        s, a = am.speedup, am.parallel_fraction
        assert 1 < s <= gpus and 0 < a <= 1
        assert 1 / s == pytest.approx((1 - a) + a / gpus, rel=1e-9)


def test_pipeline_bytes_are_two_activations_per_micro_batch_and_virtual_stage():
    """Each micro-batch crosses each of a rank's v virtual-stage boundaries twice (the forward's activation, the
    backward's gradient), mbs x seq x hidden 16-bit values each without TP: pp bytes per GPU and step
    = m x 2 x v x that; interleaving (v 2) doubles it."""
    from planner.core import recommend
    from planner.models import load_preset
    from planner.search import Pins
    spec = load_preset("llama3-8b")
    got = {}
    for sched, vpp in (("1f1b", 1), ("interleaved-1f1b", 2)):
        plan = recommend(spec, 8, seq_len=4096, global_batch_size=64,
                         pins=Pins(tp=1, pp=4, dp=2, cp=1, mbs=2, vpp=vpp, schedule=sched, sp=False, zero=1))
        m = plan.training.num_microbatches
        assert m == 64 // (2 * 2)
        got[vpp] = plan.prediction.comm_bytes_per_step.pp
        assert got[vpp] == pytest.approx(m * 2 * vpp * (2 * 4096 * 4096 * 2), rel=1e-12)
    assert got[2] == pytest.approx(2 * got[1])


def test_a_tied_head_still_costs_its_matmul():
    """Model FLOPs count the output projection whether or not it shares the embedding's matrix (PaLM's 6N over
    the matmul parameters); the parameter total counts the shared matrix once."""
    from planner.models import load_preset
    for name in ("gpt2", "llama3-8b"):
        spec = load_preset(name)
        c = param_counts(spec)
        assert c["matmul"] == spec.layers * c["per_layer_matmul"] + spec.vocab * spec.hidden
        assert (c["head"] == 0) == bool(spec.tied_embeddings)


def test_a_group_is_inside_a_node_only_where_its_span_tiles_the_node():
    """Ranks of a group `stride` apart span stride x size ranks; on 8-GPU nodes a span that does not divide 8
    (6, 12) straddles two nodes for some group once the job has more than one node; a single-node job, or a
    group of one, is always inside."""
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    inside = lambda stride, size, gpus: bool(comm.group_inside_node(hw, stride, size, gpus))
    assert inside(1, 4, 16) and inside(2, 4, 16) and inside(1, 8, 64)
    assert not inside(1, 6, 12) and not inside(3, 4, 24) and not inside(1, 16, 32)
    assert inside(1, 6, 6) and inside(5, 1, 40)


def test_the_simplest_of_near_ties_is_ranked_by_moving_parts_in_order():
    """complexity: optimizer offload outweighs context parallelism, which outweighs ZeRO-3, which outweighs an
    interleaved or zero-bubble pipeline, each more than all after it together; a schedule without a pipeline adds
    nothing, and ZeRO-3 nothing where FSDP is the framework's default."""
    from planner.search import complexity
    lay = lambda **kw: _lay(**{"gpus": 16, "dp": 16, **kw})
    c = lambda l, z3=True: int(complexity(l, z3))
    everything_else = c(lay(cp=2, dp=8, zero=3, pp=2, vpp=2, schedule=2))
    assert c(lay(offload=1, zero=1)) > everything_else
    assert c(lay(cp=2, dp=8)) > c(lay(zero=3, pp=2, vpp=2, schedule=2)) > c(lay(pp=2, vpp=2, schedule=2)) > 0
    assert c(lay(zero=3)) > 0 and c(lay(zero=3), False) == 0 and c(lay(schedule=2)) == 0


def test_the_optimizer_step_holds_fp32_copies_of_16_bit_gradients(monkeypatch):
    """With 16-bit gradients and fp32 masters the optimizer step makes an fp32 copy of its share's gradients before
    it steps (parplan's MasterAdamW, Megatron's main_grad.float(), DeepSpeed's fp32 partition gradient): a moment
    of weights + gradients + optimizer states + 4 B a parameter of the share (sharded by ZeRO-1/2), which is the
    peak where the activations are small.  None with fp32 gradients, under FSDP2, or with the optimizer offloaded,
    whose copies are on the host: 4 B a parameter of the share there for every host optimizer but DeepSpeed's
    (counted with its own buffers) and FSDP2's (its host gradient shards)."""
    from planner.core import training_consts
    from planner.schema import Training
    from cost_models.memory import model_state_coefficients, step_grad_copy_coefficient
    spec = ModelSpec(arch="llama", layers=4, hidden=1024, heads=8, kv_heads=8, ffn_hidden=2816, vocab=4096)
    m = ModelDims.from_spec(spec, 32)
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")

    def consts(precision, framework="parplan"):
        return training_consts(Training(seq_len=32, global_batch_size=8, micro_batch_size=1, num_microbatches=1,
                                        precision=precision, framework=framework))

    half, full = consts("master-weights-half-grads"), consts("master-weights")
    import cost_models.memory as memory
    coefficient = memory.step_grad_copy_coefficient
    for zero, dp in ((0, 8), (1, 8), (2, 8), (0, 1)):
        lay = _lay(gpus=dp, dp=dp, zero=zero)
        shard = dp if zero else 1
        assert float(step_grad_copy_coefficient(lay, half)) == 4.0 / shard
        assert float(step_grad_copy_coefficient(lay, full)) == 0.0
        a, b = evaluate(m, half, hw, lay), evaluate(m, full, hw, lay)
        assert float(b["mem_activations"]) > 0  # fp32 gradients: the backward's moment, as before
        monkeypatch.setattr(memory, "step_grad_copy_coefficient", lambda lay, tr: 0.0 * coefficient(lay, tr))
        backward = float(evaluate(m, half, hw, lay)["mem_total"])
        monkeypatch.setattr(memory, "step_grad_copy_coefficient", coefficient)
        w, g, o = (float(a[k]) for k in ("mem_weights", "mem_grads", "mem_optimizer"))
        params = w / 2  # bf16 weights, none sharded below ZeRO-3
        step = w + g + o + params * 4 / shard
        assert float(a["mem_total"]) == pytest.approx(max(backward, step), rel=1e-12)
        if step > backward:  # the step is the peak (zero 0 here: 32 tokens, no data-parallel buckets at dp 1)
            assert float(a["mem_activations"]) == 0.0
            assert float(a["mem_other"]) == pytest.approx(params * 4 / shard, rel=1e-9)
    assert float(evaluate(m, half, hw, _lay(gpus=1, dp=1))["mem_activations"]) == 0.0  # the case above, once
    # FSDP2 (its reduce-scatter writes the fp32 shard's gradient) and an offloaded optimizer: none on the device
    assert float(step_grad_copy_coefficient(_lay(gpus=8, dp=8, zero=3), half)) == 0.0
    assert float(step_grad_copy_coefficient(_lay(gpus=8, dp=8, zero=1, offload=1), half)) == 0.0
    # on the host: 4 B a parameter of the share beside master + Adam (12 B) for parplan and Megatron, once
    for framework in ("parplan", "megatron"):
        for precision in ("master-weights", "master-weights-half-grads"):
            offl = model_state_coefficients(_lay(gpus=8, dp=8, zero=1, offload=1), consts(precision, framework))[3]
            assert float(offl) == pytest.approx((12 + 4) / 8, rel=1e-12), (framework, precision)
    # FSDP2 casts each reduce-scatter's output to the fp32 shard's dtype: 16-bit reductions, fp32 gradient shards
    assert float(model_state_coefficients(_lay(gpus=8, dp=8, zero=3), half)[1]) == pytest.approx(4 / 8)
    assert float(model_state_coefficients(_lay(gpus=8, dp=8, zero=2), half)[1]) == pytest.approx(2)
    # FSDP2's host shards: parameters (fp32 master) and gradients, with no further copy
    fsdp = model_state_coefficients(_lay(gpus=8, dp=8, zero=3, offload=1), consts("master-weights", "torchtitan"))[3]
    assert float(fsdp) == pytest.approx((12 + 4) / 8, rel=1e-12)
