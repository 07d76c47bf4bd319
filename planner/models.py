"""Build a ModelSpec from a preset name, an explicit set of flags, or a bare parameter count.

Presets and the llama shape family live in planner/data/models.toml (one source per entry).
Every spec leaves here with ``num_params`` filled by ``cost_models.params.param_counts``.
(Hugging Face config.json import is planner/hf_config.py.)
"""
from __future__ import annotations

import difflib
import math
import os
import re
from functools import lru_cache
from pathlib import Path

from cost_models.params import param_counts
from hardware_profiles import tomllib  # tomli on Python 3.10
from planner.schema import ModelSpec, error_message

MODELS_TOML = Path(__file__).resolve().parent / "data" / "models.toml"
# Keys of a preset table that document it but are not ModelSpec fields.
_PRESET_META = ("published_params", "aliases")


@lru_cache(maxsize=1)
def _data() -> dict:
    with open(MODELS_TOML, "rb") as f:
        return tomllib.load(f)


def with_param_count(spec: ModelSpec, seq_len: int | None = None) -> ModelSpec:
    """The spec with num_params filled in (a learned position table counted at seq_len rows where it has none)."""
    return spec.model_copy(update={"num_params": int(param_counts(spec, seq_len)["total"])})


def _spec(seq_len: int | None = None, **fields) -> ModelSpec:
    """ModelSpec(**fields) with num_params; a validation error becomes one ValueError line."""
    from pydantic import ValidationError

    try:
        spec = ModelSpec(**fields)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise ValueError(f"invalid model shape: {loc + ': ' if loc else ''}{error_message(err)}") from None
    return with_param_count(spec, seq_len)


def list_presets() -> list[str]:
    """Preset names in file order."""
    return list(_data()["presets"])


def preset_published_params(name: str) -> int | None:
    """The parameter count the preset's source publishes (None for test shapes)."""
    return _data()["presets"][name].get("published_params")


# Names of mixture-of-experts families as their makers write them (Mixtral 8x7B, DeepSeek-V2/V3/R1, Qwen's MoE and
# "-A3B" models, gpt-oss, Llama 4 Scout/Maverick, DBRX, OLMoE, Grok-1, Arctic, Jamba, Phi-3.5-MoE, Granite MoE, Kimi
# K2, GLM-4.5, MiniMax): such a name is no typo of a dense preset, so where no preset has it (the deepseek-v3, kimi-k2,
# ... presets and their aliases are looked up first) the error says which mixtures of experts plan (a distilled
# DeepSeek-R1, a dense llama or qwen, is not one)
_MOE_NAME = re.compile(r"mixtral|deepseek[-_]?(v2|v3|r1|moe)|qwen[\d.]*[-_]?moe|-a\d+(\.\d+)?[bm](\b|[-_])|gpt[-_]?oss|"
                       r"llama[-_]?4|\bscout\b|\bmaverick\b|dbrx|olmoe|grok|arctic|jamba|phi[-_]?3\.5[-_]?moe|"
                       r"granite.*moe|kimi[-_]?k2|glm[-_]?4\.5|minimax|(^|[-_/])moe([-_/]|$)|\d+x\d+b", re.I)


def mixture_of_experts_name(name: str) -> bool:
    """Whether a model name is one of a mixture-of-experts family's (_MOE_NAME), which parplan plans only from a preset
    or from the Hugging Face configs planner.hf_config reads (MOE_TYPES)."""
    return bool(_MOE_NAME.search(name)) and "distill" not in name.lower()


# the mixture-of-experts families planner.hf_config reads (its MOE_TYPES), as the refusals name them
READ_MOE_FAMILIES = ("Mixtral's", "Qwen2/3-MoE's", "GLM-4.5's", "dots.llm1's", "Llama 4's", "DeepSeek-V2/V3's",
                     "Kimi K2's", "ERNIE 4.5's", "gpt-oss's", "MiniMax-M2's", "OLMoE's", "Phi-3.5-MoE's", "Granite MoE's",
                     "Hunyuan-A13B's")


def read_moe_families() -> str:
    """READ_MOE_FAMILIES in words: "Mixtral's, ... and Hunyuan-A13B's"."""
    return ", ".join(READ_MOE_FAMILIES[:-1]) + " and " + READ_MOE_FAMILIES[-1]


def load_preset(name: str, seq_len: int | None = None) -> ModelSpec:
    """The preset's ModelSpec; unknown names raise ValueError listing the presets and the closest match."""
    presets = _data()["presets"]
    key = preset_key(name, presets)
    if key not in presets:
        # names it begins (gpt3 -> gpt3-175b) first, then the three closest spellings (llama3-7b -> llama3-70b,
        # llama3-8b, llama2-7b): one guess had offered llama3-70b alone for llama3-7b
        close = [p for p in presets if p.startswith(key)] if key else []
        close += [p for p in difflib.get_close_matches(key, list(presets), n=3, cutoff=0.5) if p not in close]
        close = [repr(p) for p in close[:3]]
        hint = f" Did you mean {' or '.join(close) if len(close) < 3 else ', '.join(close[:2]) + ' or ' + close[2]}?" \
            if close else ""
        if re.fullmatch(r"[\w.-]+/[\w.-]+", name) and not name.endswith(".json") and not os.path.exists(name):
            # a Hub id (meta-llama/Meta-Llama-3-8B): --model-config reads its config.json from the local cache
            hint += (f" A Hugging Face model's config is read by --model-config: `parplan recommend --model-config "
                     f"{name} --gpus 8` takes it from the local Hugging Face cache once it is there "
                     f"(`huggingface-cli download {name} config.json`).")
        elif name.endswith(".json") or "/" in name or "\\" in name:  # a config file: --model-config reads those
            hint += " A Hugging Face config file is read by --model-config (e.g. `parplan recommend --model-config " \
                    f"{name} --gpus 8`)."
        shown = name if len(name) <= 60 else name[:60] + "..."
        if mixture_of_experts_name(name):
            moe = [p for p, f in presets.items() if f.get("experts")]
            raise ValueError(f"{shown!r} is a mixture-of-experts model parplan has no preset for (its mixture-of-"
                             f"experts presets: {', '.join(moe)}; {read_moe_families()} Hugging Face configs are read "
                             "by --model-config, other families' (DBRX, ERNIE 4.5 VL, MiniMax-M1, ...) are not)")
        raise ValueError(f"unknown model preset {shown!r}.{hint} Available: {', '.join(presets)}")
    fields = {k: v for k, v in presets[key].items() if k not in _PRESET_META}
    return _spec(seq_len, name=key, **fields)


def preset_aliases(presets: dict | None = None) -> dict[str, str]:
    """Alias -> preset name (models.toml's `aliases`)."""
    presets = presets if presets is not None else _data()["presets"]
    return {a: p for p, fields in presets.items() for a in fields.get("aliases", ())}


def preset_key(name: str, presets: dict | None = None) -> str:
    """The preset a name means: its own (any case), an alias (llama3.1-70b), or the same written as a Hugging Face
    model is (Llama-3.1-70B, meta-llama/Llama-3.1-70B-Instruct, Llama-2-7b-chat-hf: a chat or instruct model has its
    base's shape); the name lowered where none matches."""
    presets = presets if presets is not None else _data()["presets"]
    key = name.strip().lower()
    bare = key.rsplit("/", 1)[-1] if key.count("/") == 1 else key  # owner/model: the model
    for suffix in ("-hf", "-instruct", "-chat", "-base"):  # Llama-2-7b-chat-hf, Llama-3.1-8B-Instruct: the same shape
        bare = bare[:-len(suffix)] if bare.endswith(suffix) else bare
    aliases = preset_aliases(presets)
    for k in (key, bare, re.sub(r"^([a-z]+)-(?=\d)", r"\1", bare)):  # llama-3.1-70b -> llama3.1-70b
        if k in presets:
            return k
        if k in aliases:
            return aliases[k]
    return key


def swiglu_ffn(hidden: int, multiple_of: int = 256) -> int:
    """Llama's SwiGLU width: int(8/3 * hidden) rounded up to `multiple_of` (Llama reference code,
    FeedForward: hidden_dim = int(2 * 4h / 3); multiple_of * ceil(hidden_dim / multiple_of))."""
    return multiple_of * math.ceil(int(8 * hidden / 3) / multiple_of)


def model_from_flags(arch: str, layers: int, hidden: int, heads: int, kv_heads: int | None = None,
                     ffn_hidden: int | None = None, vocab: int | None = 32000, *, head_dim: int | None = None,
                     tied_embeddings: bool | None = None, max_seq_len: int | None = None,
                     seq_len: int | None = None, name: str | None = None, sliding_window: int | None = None,
                     full_attention_every: int | None = None, experts: int | None = None,
                     experts_per_token: int | None = None, shared_expert_ffn: int | None = None,
                     first_dense_layers: int | None = None, moe_layer_step: int | None = None,
                     dense_ffn_hidden: int | None = None, kv_lora_rank: int | None = None,
                     q_lora_rank: int | None = None, qk_rope_head_dim: int | None = None,
                     v_head_dim: int | None = None, attention_chunk: int | None = None) -> ModelSpec:
    """An explicit shape. Defaults: kv_heads = heads; ffn_hidden = SwiGLU 8/3 h (llama) or 4 h (gpt);
    tied embeddings for gpt (GPT-2/3 style), untied for llama; vocab None -> 32000 (Llama 2 tokenizer).  experts /
    experts_per_token / shared_expert_ffn / first_dense_layers / moe_layer_step / dense_ffn_hidden: a mixture of experts
    (ModelSpec's, which says what they must be).  kv_lora_rank / q_lora_rank / qk_rope_head_dim / v_head_dim:
    multi-head latent attention (ModelSpec's: head_dim is then a query/key head's whole width, kv_heads its heads)."""
    if vocab is None:
        vocab = 32000
    if arch not in ("llama", "gpt"):
        raise ValueError(f"arch must be 'llama' or 'gpt', got {arch!r}")
    if kv_heads is None:
        kv_heads = heads
    if ffn_hidden is None:
        ffn_hidden = swiglu_ffn(hidden) if arch == "llama" else 4 * hidden
    if tied_embeddings is None:
        tied_embeddings = arch == "gpt"
    desc = f"{arch}: {layers} layers, hidden {hidden}, {heads} heads ({kv_heads} kv), ffn {ffn_hidden}, vocab {vocab}"
    if kv_lora_rank is not None:  # the heads' widths and the latents (the schema says what a half-given shape lacks)
        desc += (f", latent attention (kv_lora {kv_lora_rank}, q_lora {q_lora_rank or 'none'}, head_dim {head_dim}, "
                 f"rope {qk_rope_head_dim}, v {v_head_dim})")
    if sliding_window:
        desc += f", sliding window {sliding_window}" + (f" (full every {full_attention_every})"
                                                         if full_attention_every else "")
    if attention_chunk:
        desc += f", chunked attention {attention_chunk}" + (f" (full every {full_attention_every})"
                                                            if full_attention_every else "")
    if experts:
        desc += f", {experts} experts top {experts_per_token}" + (f", shared ffn {shared_expert_ffn}"
                                                                   if shared_expert_ffn else "")
        if first_dense_layers:
            desc += f", the first {first_dense_layers} blocks dense"
        if moe_layer_step:
            desc += f", every {moe_layer_step} blocks one MoE"
        if dense_ffn_hidden:
            desc += f" (dense ffn {dense_ffn_hidden})"
    return _spec(seq_len, name=name, arch=arch, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                 ffn_hidden=ffn_hidden, vocab=vocab, head_dim=head_dim, tied_embeddings=tied_embeddings,
                 max_seq_len=max_seq_len, sliding_window=sliding_window, full_attention_every=full_attention_every,
                 experts=experts, experts_per_token=experts_per_token, shared_expert_ffn=shared_expert_ffn,
                 first_dense_layers=first_dense_layers, moe_layer_step=moe_layer_step, dense_ffn_hidden=dense_ffn_hidden,
                 kv_lora_rank=kv_lora_rank, q_lora_rank=q_lora_rank, qk_rope_head_dim=qk_rope_head_dim,
                 v_head_dim=v_head_dim, attention_chunk=attention_chunk, source=f"explicit flags ({desc})")


def _interp_loglog(x: float, xs: list[float], ys: list[float]) -> float:
    """Piecewise-linear in (log x, log y); the end segments are extended past the table."""
    lx = math.log(x)
    lxs = [math.log(v) for v in xs]
    lys = [math.log(v) for v in ys]
    i = 0
    while i < len(lxs) - 2 and lx > lxs[i + 1]:
        i += 1
    t = (lx - lxs[i]) / (lxs[i + 1] - lxs[i])
    return math.exp(lys[i] + t * (lys[i + 1] - lys[i]))


def model_from_params(n_params: float, arch: str = "llama", vocab: int = 32000,
                      seq_len: int | None = None) -> tuple[ModelSpec, str]:
    """A standard decoder shape for a bare parameter count, and one line saying which.

    Width and depth follow the published llama family (models.toml [[llama_shape_family]]),
    interpolated in log-log by parameter count: hidden rounded to a multiple of 256 (an even head
    count; of 1024 once there are >= 32 heads, so that 8 kv heads divide the heads), heads = hidden/128, kv_heads = 8 when
    heads >= 32 else heads, ffn = SwiGLU 8/3 h rounded up to 256 (gpt: 4 h, tied, kv = heads); then the
    layer count is chosen so that the total is closest to the request.
    """
    if not n_params or n_params <= 0 or not math.isfinite(n_params):
        raise ValueError(f"parameter count must be a positive number, got {n_params!r}")
    if arch not in ("llama", "gpt"):
        raise ValueError(f"arch must be 'llama' or 'gpt', got {arch!r}")
    family = sorted(_data()["llama_shape_family"], key=lambda r: r["params"])
    ps = [r["params"] for r in family]
    hidden_f = _interp_loglog(n_params, ps, [r["hidden"] for r in family])
    step = 1024 if hidden_f >= 32 * 128 else 256  # 256: an even head count, so TP=2 is possible
    hidden = max(256, step * round(hidden_f / step))
    heads = hidden // 128
    if arch == "llama":
        kv_heads = 8 if heads >= 32 else heads
        ffn, tied = swiglu_ffn(hidden), False
    else:
        kv_heads, ffn, tied = heads, 4 * hidden, True

    def total(layers: int) -> int:
        return int(param_counts(ModelSpec(arch=arch, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                                          ffn_hidden=ffn, vocab=vocab, tied_embeddings=tied), seq_len)["total"])

    per_layer = total(2) - total(1)
    rest = total(1) - per_layer
    guess = max(1.0, (n_params - rest) / per_layer)
    layers = min({max(1, math.floor(guess)), max(1, math.ceil(guess))}, key=lambda n: abs(total(n) - n_params))
    lo = max((r for r in family if r["params"] <= n_params), key=lambda r: r["params"], default=family[0])
    hi = min((r for r in family if r["params"] >= n_params), key=lambda r: r["params"], default=family[-1])
    where = (f"between {lo['name']} and {hi['name']}" if lo is not hi else f"at {lo['name']}")
    if n_params < ps[0] or n_params > ps[-1]:
        where = f"extrapolated past {lo['name'] if n_params > ps[-1] else hi['name']}"
    spec = _spec(seq_len, name=None, arch=arch, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                 ffn_hidden=ffn, vocab=vocab, tied_embeddings=tied, source="")
    got = spec.num_params
    line = (f"derived from {n_params:.3g} parameters: llama-family aspect ratio {where} -> {arch} {layers} layers, "
            f"hidden {hidden}, {heads} heads ({kv_heads} kv), ffn {ffn}, vocab {vocab}: "
            f"{got / 1e9:.3f}B parameters ({got / n_params - 1:+.1%})")
    return spec.model_copy(update={"source": line}), line
