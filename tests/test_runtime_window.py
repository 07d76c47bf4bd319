"""Sliding-window attention in parplan's runtime (parallel_layers.window; ModelConfig.sliding_window,
full_attention_every): the band against attention written out by hand, forward and backward, at plain and at a context-
parallel rank's global positions; FlexAttention's block mask (what a GPU runs; forward only here, its backward has no
CPU kernel) against the SDPA mask the CPU runs; which layers attend within the window; and on 4 gloo ranks, windowed
models under tp / cp / pp / ZeRO layouts against one-rank runs of the same plan (dp folded into gradient
accumulation): a rank that banded the wrong positions (a cp rank's two chunks, the gathered keys' order) or a layer
that took another's window would change the losses."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from parallel_layers.context_parallel import cp_attention, local_positions, shard_sequence
from parallel_layers.model import ModelConfig, StageModule, init_parameters
from parallel_layers.window import band, band_bias, flex_band_attention, window_attention
from planner.schema import ModelSpec
from tests.runtime_helpers import suite
from tests.runtime_helpers.plans import TINY_GPT, TINY_LLAMA, TINY_MOE, tiny_plan


def _by_hand(q, k, v, keep):
    """Attention under a boolean (s_q, S) mask, every product written out (grouped keys repeated)."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return scores.masked_fill(~keep, float("-inf")).softmax(-1) @ v


def _qkv(s=96, heads=4, kv=2, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, n, s, d, generator=g, dtype=torch.float64, requires_grad=True) for n in (heads, kv, kv)]


@pytest.mark.parametrize("window", [1, 7, 32, 95])
def test_the_band_is_attention_within_the_window_forward_and_backward(window):
    """A query at p attends the keys p - window + 1 .. p (Hugging Face's sliding_window: the keys a query sees, itself
    included): the SDPA path equals attention under that mask written out, values and gradients."""
    q, k, v = _qkv()
    i = torch.arange(96)
    keep = (i[:, None] >= i[None]) & (i[:, None] - i[None] < window)
    assert torch.equal(band(i, 96, window), keep)
    got, ref = window_attention(q, k, v, window), _by_hand(q, k, v, keep)
    torch.testing.assert_close(got, ref)
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(got, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("cp_rank", [0, 1, 2])
def test_a_context_parallel_rank_bands_its_global_positions(cp_rank):
    """cp 3: the rank's two chunks (load-balanced, parallel_layers.context_parallel) attend the gathered keys within
    the window by their global positions: its rows of the one-rank band, through cp_attention as the runtime calls it."""
    q, k, v = _qkv()
    full = window_attention(q, k, v, 20)
    pos = local_positions(96 // 3, cp_rank, 3)
    got = cp_attention(shard_sequence(q, cp_rank, 3, dim=2), k, v, pos, (0, 0), window=20, cp_key=("cp", cp_rank, 3))
    torch.testing.assert_close(got, shard_sequence(full, cp_rank, 3, dim=2))
    # a window as long as the sequence is no window: the causal path, untouched
    torch.testing.assert_close(cp_attention(q, k, v, torch.arange(96), None, window=96),
                               F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("positions", ["plain", "cp"])
def test_flex_attentions_block_mask_is_the_same_band(positions):
    """What a GPU runs (FlexAttention under the band's block mask, mask_mod over the queries' global positions)
    against the SDPA mask, forward (FlexAttention has no CPU backward; its unfused form checks the mask), with grouped
    query heads; block masks and biases cached by key, one tensor a key."""
    q, k, v = (t.detach().float() for t in _qkv(s=256))
    if positions == "plain":
        pos, qs, key = torch.arange(256), q, None
    else:
        pos, qs, key = local_positions(128, 1, 2), shard_sequence(q, 1, 2, dim=2), ("cp", 1, 2)
    want = window_attention(qs, k, v, 40, None if positions == "plain" else pos, key)
    got = flex_band_attention(qs, k, v, 40, pos, None, compiled=False)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    a, b = (band_bias(pos, 256, 40, torch.float32, ("test", positions)) for _ in range(2))
    assert a is b and a.dtype == torch.float32 and torch.equal(a == 0, band(pos, 256, 40))


def test_the_mask_is_one_tensor_saved_by_every_call():
    """SDPA keeps a boolean mask's float copy for its backward, a new one a call; the runtime passes one cached float
    mask, which every layer's call saves as it is (one tensor, not one a layer)."""
    q, k, v = (t.float() for t in _qkv())
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        window_attention(q, k, v, 16)
        window_attention(q, k, v, 16)
    masks = [t for t in saved if t.shape == (96, 96)]
    assert len(masks) == 2 and masks[0].data_ptr() == masks[1].data_ptr()


@pytest.mark.parametrize("every", [None, 2, 3])
def test_which_layers_attend_within_the_window(every):
    """ModelConfig.window_of takes ModelSpec.windowed_layers' rule (layer i from 1 in full where i is a multiple of
    full_attention_every: Megatron-LM's --window-attn-skip-freq, Gemma's pattern), layer by layer."""
    spec = ModelSpec(**{**TINY_LLAMA, "layers": 7, "sliding_window": 8, "full_attention_every": every})
    cfg = ModelConfig.from_plan(tiny_plan(spec.model_dump(exclude_none=True)))
    windows = [cfg.window_of(i) for i in range(7)]
    assert sum(w is not None for w in windows) == spec.windowed_layers
    assert all((w is None) == bool(every and (i + 1) % every == 0) for i, w in enumerate(windows))
    m = StageModule(cfg, list(range(7)), first=True, last=True, tp_group=None)
    assert [b.attn.window for b in m.blocks] == windows


@pytest.mark.parametrize("model", [TINY_LLAMA, TINY_GPT], ids=["llama", "gpt"])
def test_a_window_of_one_attends_each_token_to_itself(model):
    """Through the block as the runtime builds it: a window of 1 leaves each query its own key, so the attention's
    output is its value projection's (heads repeated over the groups) through the output projection, rotary or not;
    a window as long as the sequence changes nothing."""
    plan = tiny_plan({**model, "sliding_window": 1})
    m = StageModule(ModelConfig.from_plan(plan), [0], first=True, last=True, tp_group=None)
    init_parameters(m, 0)
    attn = m.blocks[0].attn
    x = torch.randn(2, 16, model["hidden"], generator=torch.Generator().manual_seed(1))
    b, s, nh, nkv, d = 2, 16, attn.local_heads, attn.local_kv_heads, attn.head_dim
    v = attn.wv(x).view(b, s, nkv, d).repeat_interleave(nh // nkv, 2).reshape(b, s, nh * d)
    torch.testing.assert_close(attn(x), attn.wo(v))
    long = StageModule(ModelConfig.from_plan(tiny_plan({**model, "sliding_window": 16})), [0], first=True, last=True,
                       tp_group=None)
    full = StageModule(ModelConfig.from_plan(tiny_plan(model)), [0], first=True, last=True, tp_group=None)
    init_parameters(long, 0)
    init_parameters(full, 0)
    torch.testing.assert_close(long.blocks[0].attn(x), full.blocks[0].attn(x))


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("cp_rank", [None, 1])
def test_packed_documents_attend_within_themselves(window, cp_rank):
    """Packed documents of 24 tokens in a 96-token sequence (Training.document_length; the last 24 too): a query
    attends the keys of its own document up to itself (and within the window where there is one), values and
    gradients against the mask written out; at a cp rank's global positions (cp 2) its rows of the one-rank result;
    FlexAttention's block mask selects the same (unfused, forward)."""
    q, k, v = _qkv()
    i = torch.arange(96)
    keep = (i[:, None] >= i[None]) & (i[:, None] // 24 == i[None] // 24)
    if window:
        keep = keep & (i[:, None] - i[None] < window)
    assert torch.equal(band(i, 96, window, 24), keep)
    full = window_attention(q, k, v, window, document=24)
    ref = _by_hand(q, k, v, keep)
    torch.testing.assert_close(full, ref)
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(full, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a, b)
    if cp_rank is not None:
        pos = local_positions(48, cp_rank, 2)
        got = cp_attention(shard_sequence(q, cp_rank, 2, dim=2), k, v, pos, (0, 0), window=window,
                           cp_key=("cp", cp_rank, 2), document=24)
        torch.testing.assert_close(got, shard_sequence(full, cp_rank, 2, dim=2))
    with torch.no_grad():
        flex = flex_band_attention(*(t.detach().float() for t in (q, k, v)), window, i, None, compiled=False,
                                   document=24)
    torch.testing.assert_close(flex, full.detach().float(), atol=1e-5, rtol=1e-5)


def test_chunks_and_documents_cut_the_sequence_together():
    """Llama 4's chunks (ModelConfig.attention_chunk, its chunked layers: every full_attention_every-th in full) beside
    packed documents: a query attends the keys of its own document and chunk up to itself (documents of 24 and chunks
    of 40 in 96 tokens), by hand; the runtime's layers take the chunks by ModelSpec.chunked_layers' rule, their
    stretches (documents, chunks) as one tuple."""
    q, k, v = _qkv()
    i = torch.arange(96)
    keep = (i[:, None] >= i[None]) & (i[:, None] // 24 == i[None] // 24) & (i[:, None] // 40 == i[None] // 40)
    assert torch.equal(band(i, 96, None, (24, 40)), keep)
    torch.testing.assert_close(window_attention(q, k, v, None, document=(24, 40)), _by_hand(q, k, v, keep))
    spec = ModelSpec(**{**TINY_MOE, "layers": 8, "attention_chunk": 40, "full_attention_every": 4})
    cfg = ModelConfig.from_plan(tiny_plan(spec.model_dump(exclude_none=True), document_length=24))
    assert sum(cfg.chunk_of(i) is not None for i in range(8)) == spec.chunked_layers == 6
    m = StageModule(cfg, list(range(8)), first=True, last=True, tp_group=None)
    assert [b.attn.document for b in m.blocks] == [(24, 40), (24, 40), (24, 40), 24] * 2


# on 4 gloo ranks, against one-rank runs (test_runtime_qk_norms' harness); 32-token sequences
REFERENCES = {"mistral": {**TINY_LLAMA, "sliding_window": 6},  # every layer within 6 keys (Mistral 7B v0.1's kind)
              # every other layer in full (Gemma 2's pattern), with its post-norms; gpt blocks with learned positions
              "gemma2": {**TINY_LLAMA, "sliding_window": 12, "full_attention_every": 2, "post_norms": True},
              "gpt": {**TINY_GPT, "sliding_window": 10, "full_attention_every": 4},
              # packed documents of 12 tokens (two whole and one of 8 a sequence: Training.document_length), and with
              # a window inside them
              "docs": {**TINY_LLAMA, "training": {"document_length": 12}},
              "docs-window": {**TINY_LLAMA, "sliding_window": 5, "training": {"document_length": 12}},
              # Llama 4's chunks: every other layer within 8-token chunks, experts; and chunks beside documents
              "llama4": {**TINY_MOE, "attention_chunk": 8, "full_attention_every": 2},
              "chunks-docs": {**TINY_LLAMA, "attention_chunk": 10, "training": {"document_length": 12}}}
CASES = {
    "tp2-dp2": ("mistral", dict(tp=2, pp=1, dp=2)),
    # cp 2: four chunks of 8 tokens, the window crossing their edges; selective recompute re-gathers and re-bands
    "cp2-tp2-selective": ("mistral", dict(tp=2, pp=1, dp=1, cp=2, recompute="selective")),
    "gemma2-tp2-pp2-sp-1f1b": ("gemma2", dict(tp=2, pp=2, dp=1, sp=True, schedule="1f1b")),
    "gemma2-cp2-dp2-fsdp2": ("gemma2", dict(tp=1, pp=1, dp=2, cp=2, zero_stage=3)),
    "gpt-pp2-dp2-interleaved-full": ("gpt", dict(tp=1, pp=2, dp=2, vpp=2, schedule="interleaved-1f1b", recompute="full")),
    "docs-cp2-tp2-sp": ("docs", dict(tp=2, pp=1, dp=1, cp=2, sp=True)),
    "docs-window-tp2-pp2-selective": ("docs-window", dict(tp=2, pp=2, dp=1, schedule="1f1b", recompute="selective")),
    "llama4-tp2-dp2-sp-ep2": ("llama4", dict(tp=2, pp=1, dp=2, sp=True, ep=2)),
    "chunks-docs-cp2-dp2": ("chunks-docs", dict(tp=1, pp=1, dp=2, cp=2)),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return suite.run_against_one_rank(tmp_path_factory.mktemp("window"), REFERENCES, CASES)


@pytest.mark.multirank
@pytest.mark.parametrize("case", list(CASES))
def test_windowed_layouts_match_one_rank(runs, case):
    reference, layout = CASES[case]
    suite.check_against_one_rank(runs, case, reference, layout, (".wq.",), 1e-4, 1e-5)



@pytest.mark.filterwarnings("ignore::UserWarning")
def test_flex_attention_inside_compiled_blocks(monkeypatch):
    """What a GPU launch runs, forward, on the CPU: blocks compiled as launch compiles them, their windowed layers
    through FlexAttention (forced here: it trains on a CUDA device only) under the block mask built outside the graphs
    on the first call and read from the cache after; the same logits as the eager SDPA band."""
    from parallel_layers import window
    from parallel_layers.outside_graphs import compile_module
    cfg = ModelConfig.from_plan(tiny_plan({**TINY_LLAMA, "sliding_window": 8, "full_attention_every": 2}))
    ref, flex = (StageModule(cfg, list(range(4)), first=True, last=True, tp_group=None) for _ in range(2))
    init_parameters(ref, 0)
    init_parameters(flex, 0)
    for block in flex.blocks:
        compile_module(block)
    x = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = ref(x)
        monkeypatch.setattr(window, "use_flex", lambda q, p: True)
        monkeypatch.setattr(window, "_BLOCK_MASKS", {})
        first, again = flex(x), flex(x)
    assert list(window._BLOCK_MASKS) == [(("seq",), 32, 32, 8, None, "cpu")]
    torch.testing.assert_close(first, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(again, want, atol=1e-5, rtol=1e-5)
