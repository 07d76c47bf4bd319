"""The runtime's dropout (parallel_layers.dropout) on one rank: the masked product and what it saves, the keyed
masks' rate and keys, the blocks of positions each rank draws, the compiled runs' hash masks (rate, independence,
the same bits for every split of the sequence and micro-batch, compiled without a graph break and saving only the
mask), and whole runs: a recompute draws the masks its
forward drew (every recompute mode gives the same losses to the bit), the micro-batch size does not change them,
each of the two dropouts is really applied, and a compiled block compiles once however the keys change.  The
layouts (tp, pp, dp, cp, SP, the schedules) against one-rank runs are in the 8-rank suite
(tests/runtime_helpers/suite.py, the dropout cases)."""
from __future__ import annotations

import pytest
import torch

from parallel_layers import train
from parallel_layers.context_parallel import local_positions
from parallel_layers.outside_graphs import before_compiling
from parallel_layers.dropout import (DropoutState, _Dropout, hash_keep_mask, hidden_dropout, keyed_mask,
                                     sample_prefix, token_blocks, token_runs)
from tests.runtime_helpers.plans import TINY_GPT, TINY_LLAMA, tiny_plan


pytestmark = pytest.mark.usefixtures("group_of_one")  # tests/conftest.py


def test_the_masked_product_scales_the_kept_and_saves_only_the_mask():
    p = 0.5  # a scale of 2: the product is exact in bf16 whichever way it is rounded
    x = torch.randn(3, 16, 8, dtype=torch.bfloat16, requires_grad=True)
    mask = keyed_mask(x.shape, p, "cpu", [[(0, 16, 7)], [(0, 16, 8)], [(0, 8, 9), (8, 8, 10)]])
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = _Dropout.apply(x, mask, 1 / (1 - p))
    assert len(saved) == 1 and saved[0].dtype == torch.bool and saved[0].shape == x.shape  # 1 byte an element
    assert torch.equal(y, torch.where(mask, x / (1 - p), 0).to(torch.bfloat16))
    g = torch.randn_like(x)
    y.backward(g)
    assert torch.equal(x.grad, torch.where(mask, g / (1 - p), 0).to(torch.bfloat16))


def test_keyed_masks_keep_one_minus_p_and_follow_their_keys():
    shape = (2, 512, 1024)
    a = keyed_mask(shape, 0.1, "cpu", [[(0, 512, 1)], [(0, 512, 2)]])
    assert a.float().mean().item() == pytest.approx(0.9, abs=0.002)  # 1M draws: 3 standard deviations are 0.0009
    assert torch.equal(a, keyed_mask(shape, 0.1, "cpu", [[(0, 512, 1)], [(0, 512, 2)]]))
    assert not torch.equal(a[0], a[1])
    # a sample's mask is its key's, wherever it sits in the micro-batch
    assert torch.equal(keyed_mask((1, 512, 1024), 0.1, "cpu", [[(0, 512, 2)]])[0], a[1])


@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.parametrize("sp_tp", [1, 2, 4])
def test_each_rank_draws_the_blocks_of_the_positions_it_holds(cp, sp_tp):
    """The runs of positions against context_parallel.local_positions then SP's shard of them; over the ranks every
    position once."""
    seq = 64
    seen = []
    for cp_rank in range(cp):
        held = local_positions(seq // cp, cp_rank, cp).tolist()
        n = len(held) // sp_tp
        for tp_rank in range(sp_tp):
            mine = held[tp_rank * n:(tp_rank + 1) * n]
            for size in (None, 4):
                blocks = token_blocks(seq, cp, cp_rank, sp_tp, tp_rank, size)
                assert [start + i for _, start, length in blocks for i in range(length)] == mine
                assert [off for off, _, _ in blocks] == list(range(0, n, blocks[0][2]))
            assert len(token_runs(seq, cp, cp_rank, sp_tp, tp_rank)) <= 2
            seen += mine
    assert sorted(seen) == list(range(seq))


def test_blocks_that_do_not_divide_a_ranks_runs_are_refused():
    with pytest.raises(ValueError, match="do not divide"):
        token_blocks(32, 2, 0, 1, 0, 3)


def _rows(seed, step, samples):
    return torch.tensor([sample_prefix(seed, step, i) for i in samples])


def test_hash_masks_keep_one_minus_p_independently_of_their_neighbours():
    """1M elements keep 0.9 of them; neighbouring channels, positions and samples, and other layers, sites, steps and
    seeds, are kept independently (both kept: 0.81)."""
    b, s, h = 2, 512, 1024
    st = DropoutState(p_hidden=0.1, p_attention=0.0, seed=3, seq_len=s, hidden=h)
    mask = lambda rows, layer=5, site="mlp": hash_keep_mask((b, s, h), 0.1, rows, layer, site, st.positions, st.channels)
    a = mask(_rows(3, 7, [10, 11]))
    assert a.float().mean().item() == pytest.approx(0.9, abs=0.002)  # 3 standard deviations: 0.0009
    both = lambda x, y: (x & y).float().mean().item()
    for x, y in ((a[..., 1:], a[..., :-1]), (a[:, 1:], a[:, :-1]), (a[0], a[1]),
                 (a, mask(_rows(3, 7, [10, 11]), layer=6)), (a, mask(_rows(3, 7, [10, 11]), site="attention")),
                 (a, mask(_rows(3, 8, [10, 11]))), (a, mask(_rows(4, 7, [10, 11]))),
                 (a[1], mask(_rows(3, 7, [10, 11 + 2 ** 32]))[1])):  # a sample index past 32 bits is folded whole
        assert both(x, y) == pytest.approx(0.81, abs=0.003), (x.shape, y.shape)
    assert torch.equal(a, mask(_rows(3, 7, [10, 11])))
    assert torch.equal(a[1], mask(_rows(3, 7, [12, 11]))[1])  # a sample's mask, wherever it sits in the micro-batch


@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.parametrize("sp_tp", [1, 2, 4])
def test_hash_masks_are_the_one_rank_masks_at_the_positions_a_rank_holds(cp, sp_tp):
    """No blocks of tokens to agree on: a cp and SP rank's mask is the one-rank run's at its own positions, for any
    split, and a micro-batch's sample is that sample's mask alone."""
    seq, h, samples = 64, 16, [4, 9]
    one = DropoutState(p_hidden=0.1, p_attention=0.0, seed=1, seq_len=seq, hidden=h)
    whole = hash_keep_mask((2, seq, h), 0.1, _rows(1, 2, samples), 3, "attention", one.positions, one.channels)
    for cp_rank in range(cp):
        for tp_rank in range(sp_tp):
            st = DropoutState(p_hidden=0.1, p_attention=0.0, seed=1, seq_len=seq, cp=cp, cp_rank=cp_rank,
                              sp=sp_tp > 1, tp=sp_tp, tp_rank=tp_rank, hidden=h)
            held = st.positions
            assert len(held) == seq // cp // sp_tp
            for j, sample in enumerate(samples):
                mine = hash_keep_mask((1, len(held), h), 0.1, _rows(1, 2, [sample]), 3, "attention", held, st.channels)
                assert torch.equal(mine[0], whole[j, held])


def test_hash_dropout_compiles_without_a_graph_break_and_saves_only_the_mask():
    """In a compiled function the hash and the masked product are one graph (no break: the keyed generator's is
    host work, outside the graph) whose only saved tensor is the 1-byte mask, what Megatron's fused bias-dropout-add
    keeps and the memory model counts; the same bits as eager."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    b, s, h = 2, 32, 64
    st = DropoutState(p_hidden=0.1, p_attention=0.0, seed=0, seq_len=s, hidden=h, masks="hash")
    st.begin_step(1, [0, 1], 2)
    st.begin(0)
    x = torch.randn(b, s, h, requires_grad=True)
    layer = torch.tensor(3)
    f = lambda x: hidden_dropout(x, st, st.current, 3, "mlp", layer) * 2
    eager = f(x)
    torch._dynamo.reset()
    counters.clear()
    before_compiling()  # as the runtime's compile_module does
    compiled = torch.compile(f)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = compiled(x)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert [(t.dtype, tuple(t.shape)) for t in saved] == [(torch.bool, (b, s, h))]
    assert torch.equal(y, eager)
    y.sum().backward()
    assert torch.equal(x.grad, torch.where(eager != 0, 2 / 0.9, 0.0).to(x.grad.dtype))
    st.masks = "keyed"
    torch._dynamo.reset()
    counters.clear()
    torch.compile(f)(x)
    assert counters["graph_break"]  # the keyed draws break the graph


def run(plan, steps=2, **opts):
    rep = train.run(plan, train.RunOptions(steps=steps, device="cpu", **opts))
    return rep, [s["loss"] for s in rep["steps"]]


@pytest.mark.parametrize("model", [TINY_LLAMA, TINY_GPT], ids=["llama", "gpt"])
def test_every_recompute_mode_draws_the_forwards_masks(model):
    """Full, selective (the attention core and its dropout re-run) and op-level selective recompute re-run the
    dropouts in the backward; the keys are the checkpointed functions' arguments, so the losses and gradient norms
    are those of no recompute, to the bit."""
    base, ref = run(tiny_plan(model, dropout=True))
    assert base["dropout"] == {"hidden": 0.1, "attention": 0.1}
    for recompute in ("selective", "full", "selective-op"):
        rep, got = run(tiny_plan(model, dropout=True, recompute=recompute))
        assert got == ref, recompute
    _, plain = run(tiny_plan(model))
    assert all(abs(a - b) > 1e-4 for a, b in zip(ref, plain)), (ref, plain)


def test_both_dropouts_are_applied():
    _, both = run(tiny_plan(dropout=True))
    _, hidden = run(tiny_plan(dropout=True), attention_dropout=0.0)
    _, attention = run(tiny_plan(dropout=True), hidden_dropout=0.0)
    _, neither = run(tiny_plan(dropout=True), hidden_dropout=0.0, attention_dropout=0.0)
    _, plain = run(tiny_plan())
    assert neither == plain  # rates of 0 draw nothing
    for a, b in ((both, hidden), (both, attention), (hidden, plain), (attention, plain)):
        assert abs(a[0] - b[0]) > 1e-5, (a, b)


def test_the_hidden_masks_do_not_depend_on_the_micro_batch_size():
    """Keyed by sample, not by micro-batch (the attention's are keyed by the micro-batch's samples together)."""
    _, one = run(tiny_plan(dropout=True), attention_dropout=0.0)
    _, four = run(tiny_plan(dropout=True, micro_batch_size=4), attention_dropout=0.0)
    assert four == pytest.approx(one, rel=1e-6)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_a_compiled_block_compiles_once_and_matches_eager(recompute):
    """The key is a tensor, so torch.compile does not specialise a block on each step's ints; the hidden masks are
    hashed inside its graphs (the same bits as eager blocks hashing them), the attention's dropout runs outside them
    (a graph break), inside selective recompute's checkpoint too; full recompute re-runs the compiled block with the
    same key, so its hashed masks are the forward's."""
    from torch._dynamo.utils import counters
    plan = tiny_plan(dropout=True, recompute=recompute)
    _, eager = run(plan, steps=3, dropout_masks="hash")
    run(plan, steps=1, compile=True)
    graphs = counters["stats"]["unique_graphs"]
    _, compiled = run(plan, steps=3, compile=True)
    assert counters["stats"]["unique_graphs"] == graphs
    assert compiled == pytest.approx(eager, rel=1e-5)


def test_compiled_recompute_hashes_the_forwards_masks():
    """Compiled blocks with the hidden dropout's hash masks (the attention's off): full recompute re-runs them in the
    backward with the same key, so the losses are no recompute's."""
    none, full = (run(tiny_plan(dropout=True, recompute=rec), steps=3, compile=True, attention_dropout=0.0)[1]
                  for rec in ("none", "full"))
    assert full == pytest.approx(none, rel=1e-6)


def test_compiled_blocks_share_their_graphs_across_layers():
    """The dropouts take the layer number as a tensor (dropout_layer_key): torch.compile guarded an int on its value,
    so the code after each dropout's graph break compiled once per layer, and past its recompile limit (8) the later
    layers ran it uncompiled (a 24-layer gpt with dropout on the H200, 2026-12-04).  Twelve layers compile no graph
    that two did not."""
    from torch._dynamo.utils import counters
    run(tiny_plan(dict(TINY_GPT, layers=2), dropout=True), steps=1, compile=True)
    graphs = counters["stats"]["unique_graphs"]
    _, losses = run(tiny_plan(dict(TINY_GPT, layers=12), dropout=True), steps=2, compile=True)
    assert counters["stats"]["unique_graphs"] == graphs
    _, eager = run(tiny_plan(dict(TINY_GPT, layers=12), dropout=True), steps=2, dropout_masks="hash")
    assert losses == pytest.approx(eager, rel=1e-5)


@pytest.mark.multirank
def test_a_rotary_model_drops_attention_under_context_parallelism(tmp_path):
    """Llama at cp 2 with both dropouts (its attention's masks each cp rank's own): the rotary tables' cache key under
    context parallelism once took the dropout key's name, so the attention dropout was handed a tuple and the run
    stopped.  Two gloo ranks, selective recompute (the attention and its dropout re-run in the backward)."""
    import json

    from tests.runtime_helpers import suite
    jobs = [suite._job(tmp_path, name, tiny_plan(TINY_LLAMA, tp=1, pp=1, dp=1, cp=2, recompute="selective",
                                                 dropout=drop), {}, steps=2)
            for name, drop in (("dropout", True), ("plain", False))]
    r = suite.run_jobs(jobs, 2, tmp_path, "cp-dropout", timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    losses = {name: [s["loss"] for s in json.loads((tmp_path / name / "report.json").read_text())["steps"]]
              for name in ("dropout", "plain")}
    assert json.loads((tmp_path / "dropout" / "report.json").read_text())["dropout"] == {"hidden": 0.1, "attention": 0.1}
    assert all(abs(a - b) > 1e-5 for a, b in zip(losses["dropout"], losses["plain"])), losses


def test_a_run_past_the_recompile_limit_says_so(monkeypatch):
    """The report notes when torch.compile hit its recompile limit (the code past it ran uncompiled): the layer as an
    int, as the dropouts took it before 2026-12-04, under a limit of 2 with four layers; with the tensor, no note."""
    import torch._dynamo
    from parallel_layers import model
    plan = tiny_plan(TINY_GPT, dropout=True)
    torch._dynamo.reset()
    # torch's own patch: monkeypatch's undo deletes the config entry (the later compiles then fail to read it)
    with torch._dynamo.config.patch(recompile_limit=2):
        with monkeypatch.context() as m:
            m.setattr(model, "dropout_layer_key", lambda i: i)
            rep, _ = run(plan, steps=1, compile=True)
        assert any("recompile limit" in n for n in rep["notes"]), rep["notes"]
        torch._dynamo.reset()
        rep, _ = run(plan, steps=1, compile=True)
        assert not any("recompile limit" in n for n in rep["notes"]), rep["notes"]
    torch._dynamo.reset()
    assert torch._dynamo.config.recompile_limit > 2  # readable again, and back to torch's own


def test_the_dropout_host_script_measures_each_case():
    """benchmarks/dropout_host.py (the hash masks' host cost against the keyed draws, compiled blocks as the calibrate
    probe runs them) on the CPU at a few steps: a reading for every case, the extra over no dropout, the summary."""
    import importlib.util
    import math
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(
        "dropout_host", Path(__file__).resolve().parents[1] / "benchmarks" / "dropout_host.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cases = mod.CASES[:3]  # none, the hidden dropout keyed and hashed (the committed run has both dropouts too)
    rows = mod.measure("cpu", steps=3, repeats=1, modes=("none",), cases=cases)
    assert [r["case"] for r in rows] == ["no dropout", "hidden, keyed", "hidden, hash"]
    # readings, not bars: three steps on a busy CI machine can read a difference of runs below zero
    assert all(math.isfinite(r["block_s"]) and r["extra_s"] == r["block_s"] - rows[0]["block_s"] for r in rows)
    text = mod.render(rows, "cpu", 1, "today")
    assert text.count("| none |") == 3 and "Hash against keyed, the extra a block (none): hidden " in text
    committed = (Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "2026-12-04-cpu-dropout-hash" /
                 "dropout_host.md").read_text()
    assert committed.count("| none |") == committed.count("| full |") == len(mod.CASES)
