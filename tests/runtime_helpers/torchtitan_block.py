"""torchtitan's llama TransformerBlock as of its 2024-12 versions (torchtitan/models/llama/model.py and
norms.py at 9dec370), eager, in plain torch: the block its published FSDP runs trained without
training.compile.  tests/test_activation_memory.py counts what it saves for its backward against
cost_models.memory.activation_bytes_per_layer(..., eager=True).  qk_norm: the per-head q/k RMSNorms of
torchtitan's qwen3 attention (torchtitan/models/qwen3/model/model.py), as a GPU runs them.  post_norms: a norm on
each sublayer's output before its residual add (Gemma 2 / 3's post_attention_layernorm and post_feedforward_layernorm,
GLM-4's), "eager" as the block's own RMSNorm, "fused" as a GPU's nn.RMSNorm runs it."""
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


class _FusedRMSNorm(torch.autograd.Function):
    """What aten._fused_rms_norm saves on a GPU, where torch's nn.RMSNorm runs it (its backward's schema takes the
    input and rstd; on a CPU rms_norm decomposes into fp32 ops instead): the 16-bit input and an fp32 rstd a row."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd, weight)
        return (x.float() * rstd).type_as(x) * weight

    @staticmethod
    def backward(ctx, grad):
        x, rstd, weight = ctx.saved_tensors
        xhat = x.float() * rstd
        g = grad.float() * weight.float()
        dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        return dx.type_as(x), (grad.float() * xhat).sum(tuple(range(x.dim() - 1))).type_as(weight), None


class HeadNorm(RMSNorm):
    """nn.RMSNorm as a GPU runs it (_FusedRMSNorm): torchtitan's qwen3 q_norm / k_norm (over head_dim), and the
    post-norms' fused variant (over h)."""

    def forward(self, x):
        return _FusedRMSNorm.apply(x, self.weight, self.eps)


class Block(nn.Module):
    def __init__(self, h: int, heads: int, kv_heads: int, ffn: int, qk_norm: bool = False,
                 post_norms: str | None = None):
        super().__init__()
        norm = {None: None, "eager": RMSNorm, "fused": HeadNorm}[post_norms]
        self.post_attention_norm, self.post_ffn_norm = (norm(h), norm(h)) if norm else (nn.Identity(), nn.Identity())
        self.heads, self.kv_heads, self.hd = heads, kv_heads, h // heads
        # torchtitan's qwen3 Attention: per-head RMSNorms on xq and xk between the projections and rotary
        self.q_norm, self.k_norm = (HeadNorm(self.hd), HeadNorm(self.hd)) if qk_norm else (None, None)
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
        if self.q_norm is not None:
            xq, xk = self.q_norm(xq), self.k_norm(xk)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        n_rep = self.heads // self.kv_heads
        keys, values = repeat_kv(xk, n_rep), repeat_kv(xv, n_rep)
        out = F.scaled_dot_product_attention(xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                             is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(bs, s, -1))

    def feed_forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def forward(self, x, freqs_cis):
        h = x + self.post_attention_norm(self.attention(self.attention_norm(x), freqs_cis))
        return h + self.post_ffn_norm(self.feed_forward(self.ffn_norm(h)))


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
