"""torchtitan's llama TransformerBlock as of its 2024-12 versions (torchtitan/models/llama/model.py and
norms.py at 9dec370), eager, in plain torch: the block its published FSDP runs trained without
training.compile.  tests/test_activation_memory.py counts what it saves for its backward against
cost_models.memory.activation_bytes_per_layer(..., eager=True)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    """torchtitan's non-fused 'rmsnorm': normalise in fp32, cast back, scale."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float()).type_as(x)
        return output * self.weight


def precompute_freqs_cis(dim: int, end: int, theta: float = 500000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    return torch.polar(torch.ones(end, dim // 2), torch.outer(torch.arange(end), freqs).float())


def apply_rotary_emb(xq, xk, freqs_cis):
    """Rotary as a complex fp32 multiply."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    fc = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    return (torch.view_as_real(xq_ * fc).flatten(3).type_as(xq),
            torch.view_as_real(xk_ * fc).flatten(3).type_as(xk))


def repeat_kv(x, n_rep: int):
    """GQA: keys and values copied to the query heads before SDPA."""
    bs, slen, n_kv, hd = x.shape
    if n_rep == 1:
        return x
    return torch.unsqueeze(x, dim=3).expand(bs, slen, n_kv, n_rep, hd).reshape(bs, slen, n_kv * n_rep, hd)


class Block(nn.Module):
    def __init__(self, h: int, heads: int, kv_heads: int, ffn: int):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, h // heads
        self.wq = nn.Linear(h, heads * self.hd, bias=False)
        self.wk = nn.Linear(h, kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(h, kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(heads * self.hd, h, bias=False)
        self.w1 = nn.Linear(h, ffn, bias=False)
        self.w2 = nn.Linear(ffn, h, bias=False)
        self.w3 = nn.Linear(h, ffn, bias=False)
        self.attention_norm, self.ffn_norm = RMSNorm(h), RMSNorm(h)

    def attention(self, x, freqs_cis):
        bs, s, _ = x.shape
        xq = self.wq(x).view(bs, s, -1, self.hd)
        xk = self.wk(x).view(bs, s, -1, self.hd)
        xv = self.wv(x).view(bs, s, -1, self.hd)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        n_rep = self.heads // self.kv_heads
        keys, values = repeat_kv(xk, n_rep), repeat_kv(xv, n_rep)
        out = F.scaled_dot_product_attention(xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                             is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(bs, s, -1))

    def feed_forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def forward(self, x, freqs_cis):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


def saved_bytes(block: Block, x, freqs_cis) -> int:
    """Bytes autograd keeps for the block's backward (parameters and the rotary table excluded, each
    storage once)."""
    skip = {p.data_ptr() for p in block.parameters()} | {freqs_cis.data_ptr()}
    seen: dict[int, int] = {}

    def pack(t):
        if t.data_ptr() not in skip:
            seen[t.data_ptr()] = max(seen.get(t.data_ptr(), 0), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x, freqs_cis)
    return sum(seen.values())
