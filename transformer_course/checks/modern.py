"""Checks for chapter 10's exercises (the modern decoder: RMSNorm, RoPE, grouped-query attention). Hand-written.

10.1 and 10.3 compute the expected result their own way (a float32 computation, complex numbers), 10.5 compares
parameter names, shapes and logits with the package's assembly. The references of the extend exercises 10.6
(``_sliding_window_mask``) and 10.7 (``_RollingKVCache``) live here: they are not part of the package's API."""

import torch

from .. import modern as _lib
from ._core import check, expect, expect_answer, expect_close, expect_tensor, fresh_rng, name_mistake, planted


# ---------------------------------------------------------------- 10.1 build: RMSNorm
def _rms_norm(x, weight, eps, *, centre=False, eps_outside=False, total=False, gain=True):
    """RMSNorm written out, with one mistake switched on at will."""
    x = x - x.mean(-1, keepdim=True) if centre else x
    squares = x.pow(2).sum(-1, keepdim=True) if total else x.pow(2).mean(-1, keepdim=True)
    rms = squares.sqrt() + eps if eps_outside else (squares + eps).sqrt()
    y = x / rms
    return y * weight if gain else y


_RMS_MISTAKES = [  # (hint, the switch that makes _rms_norm commit it)
    ("the mean is subtracted: that is LayerNorm; RMSNorm divides x itself by its root mean square", dict(centre=True)),
    ("eps must go inside the square root: sqrt(mean(x²) + eps)", dict(eps_outside=True)),
    ("divide by the root of the *mean* of the squares (over the last dimension), not of their sum", dict(total=True)),
    ("the normalised row must be multiplied by the learned gain self.weight", dict(gain=False)),
]


@check("10.1", "RMSNorm", reference=_lib.RMSNorm)
def check_rms_norm(cls):
    """``cls(d_model, eps)`` with ``forward(x [..., C]) -> [..., C]``."""
    g = torch.Generator().manual_seed(10)
    for eps in (1e-6, 0.5):  # a large eps shows where it sits
        with fresh_rng():
            norm = cls(16, eps=eps)
        with torch.no_grad():
            norm.weight.copy_(1 + 0.3 * torch.randn(16, generator=g))
        x = 2 * torch.randn(2, 3, 16, generator=g) + 0.7  # a non-zero mean shows centring
        with torch.no_grad():
            got = expect_tensor(norm(x), what="a tensor from forward")
        expect(tuple(got.shape) == (2, 3, 16), f"the output keeps the input's shape (2, 3, 16), got {tuple(got.shape)}")
        weight = norm.weight.detach()
        expect_close(got, _rms_norm(x, weight, eps), f"the output differs from x / sqrt(mean(x²) + eps) * weight "
                     f"(eps={eps})", mistakes=planted(_RMS_MISTAKES, _rms_norm, x, weight, eps))
        torch_norm = torch.nn.RMSNorm(16, eps=eps)  # PyTorch's own, an independent reference
        with torch.no_grad():
            torch_norm.weight.copy_(weight)
            expect_close(got, torch_norm(x), f"the output differs from torch.nn.RMSNorm's (eps={eps})")
    with torch.no_grad():
        one = norm(torch.tensor([1.0, 7.0, 1.0, 7.0] * 4))
    expect_close(one, _rms_norm(torch.tensor([1.0, 7.0, 1.0, 7.0] * 4), norm.weight.detach(), 0.5),
                 "a single row [C] (no batch dimension) gives another result")
    _expect_float32_inside(cls)


def _expect_float32_inside(cls):
    """bf16 rows in, bf16 out, computed in float32: with the gain at 1, any float32 computation
    rounds to the same bf16 numbers (measured: 100%), one done in bf16 does not (60-75% agree)."""
    with fresh_rng():
        norm = cls(256, eps=1e-6).to(torch.bfloat16)
    g = torch.Generator().manual_seed(11)
    scales = torch.logspace(-1, 1, 8)[:, None]  # rows of small and of large numbers
    x = (torch.randn(8, 256, generator=g) * scales + 0.3).to(torch.bfloat16)
    with torch.no_grad():
        got = expect_tensor(norm(x), what="a tensor from forward")
    expect(got.dtype == torch.bfloat16, f"bf16 in must give bf16 out (return x's dtype), got {got.dtype}")
    x32 = x.float()
    want = (x32 / (x32.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()).to(torch.bfloat16)
    agree = (got == want).float().mean().item()
    expect(agree >= 0.97, f"with bf16 input only {agree:.0%} of the outputs equal the float32 computation's: the mean "
           "of squares and the division ran in bf16; compute them on x.float() and convert the result back with "
           ".to(x.dtype) before the gain")


# ---------------------------------------------------------------- 10.2 debug: rope_frequencies
@check("10.2", "rope_frequencies", reference=_lib.rope_frequencies)
def check_rope_frequencies(fn):
    """``fn(head_size, base) -> [head_size // 2]`` float32, entry i = base^(-2i/hs)."""
    for hs, base in ((64, 10000.0), (8, 10000.0), (16, 500000.0)):
        got = expect_tensor(fn(hs, base))
        expect(got.shape[-1] != hs, "one speed per *pair* of channels: hs // 2 numbers, not hs")
        expect(tuple(got.shape) == (hs // 2,), f"expected shape ({hs // 2},) for hs={hs}, got {tuple(got.shape)}")
        expect(got.dtype == torch.float32, f"return float32 speeds, got {got.dtype}")
        i = torch.arange(hs // 2, dtype=torch.float64)
        expect_close(got, base ** (-2 * i / hs), f"the speeds differ from base^(-2i/hs) (hs={hs}, base={base})",
                     atol=0, rtol=1e-5, mistakes=[
            ("the exponent is i/hs: it must be 2i/hs (pair i holds channels 2i and 2i+1), so the "
             "slowest pair turns about base times slower than the fastest, not sqrt(base)", base ** (-i / hs)),
            ("the speeds grow with i: pair i turns by base^(-2i/hs), pair 0 fastest (1 radian per "
             "position)", base ** (2 * i / hs)),
        ])


# ---------------------------------------------------------------- 10.3 build: rotate_halves
def _turn_halves(x, cos, sin, *, backwards=False, swapped=False, neighbours=False):
    """The split-halves rotation by complex multiplication, with one mistake switched on at will."""
    if neighbours:
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x.chunk(2, dim=-1)
    turn = torch.complex(cos, -sin if backwards else sin)
    z = torch.complex(a, b) * turn
    if neighbours:
        return torch.stack([z.real, z.imag], dim=-1).flatten(-2)
    first, second = (z.imag, z.real) if swapped else (z.real, z.imag)
    return torch.cat([first, second], dim=-1)


_ROTATE_MISTAKES = [  # (hint, the switch that makes _turn_halves commit it)
    ("neighbouring channels (2i, 2i+1) were paired: that is the paper's interleaved convention; "
     "split halves pairs channel i with channel i + hs/2", dict(neighbours=True)),
    ("the pairs turn backwards: (a, b) becomes (a cos - b sin, a sin + b cos)", dict(backwards=True)),
    ("the halves are swapped: the first components (a cos - b sin) go in the first half", dict(swapped=True)),
]


@check("10.3", "rotate_halves", reference=_lib.rotate_halves)
def check_rotate_halves(fn):
    """``fn(x [..., T, hs], cos [T, hs/2], sin [T, hs/2]) -> [..., T, hs]``."""
    g = torch.Generator().manual_seed(11)
    for shape in ((5, 8), (2, 3, 5, 8), (1, 1, 4, 2)):
        T, hs = shape[-2:]
        x = torch.randn(shape, generator=g)
        angles = 3 * torch.rand(T, hs // 2, generator=g)
        cos, sin = angles.cos(), angles.sin()
        got = expect_tensor(fn(x, cos, sin))
        expect(tuple(got.shape) == shape, f"the output keeps x's shape {shape}, got {tuple(got.shape)}")
        # each known mistake keeps the lengths too, and gets its own hint below
        expect_close(got.norm(dim=-1), x.norm(dim=-1),
                     "a rotation keeps every vector's length; yours changes it", atol=1e-4)
        expect_close(got, _turn_halves(x, cos, sin), f"the turned vectors differ from the reference (x of shape "
                     f"{shape})", mistakes=planted(_ROTATE_MISTAKES, _turn_halves, x, cos, sin))


# ---------------------------------------------------------------- 10.4 predict: the cache's bytes
@check("10.4", "my_prediction")
def check_predict_kv_bytes(fn):
    """``fn() -> int``: bytes of the KV cache, 2 layers, 2 key/value heads of 16, 10 positions, float32."""
    got = fn()
    expect(isinstance(got, int) and not isinstance(got, bool), f"return a whole number of bytes, got {got!r}")
    right = 2 * 2 * 1 * 2 * 10 * 16 * 4
    expect_answer(got, right, [
        ("the cache holds key/value heads (2), not query heads (8)", right * 4),
        ("half of it: keys *and* values are cached (a factor of 2), and a float32 takes 4 bytes, not 2 (bf16's)",
         right // 2),
        ("a float32 takes 4 bytes, not 8 (float64's)", right * 2),
        ("that counts numbers: each float32 takes 4 bytes", right // 4),
        ("keys and values (2), of each of the 2 layers (2)", right // 2 // 2),
        ("one byte per number is int8's: a float32 takes 4, and keys *and* values are cached", right // 4 // 2),
    ], f"{got} is not it: multiply keys and values, layers, batch, key/value heads, positions, head size and bytes "
       "per number")


# ---------------------------------------------------------------- 10.5 build: the modern parts
_PARTS_CONFIGS = (  # (what, GPTConfig fields): each of the four choices on and off
    ("a Llama-style config (RMSNorm, SwiGLU, RoPE, 2 key/value heads for 4)",
     dict(bias=False, positional="rope", normalization="rmsnorm", mlp="swiglu", n_kv_head=2,
          tie_weights=False, eps=1e-5)),
    ("GPT-2's config (LayerNorm, a GELU MLP, learned positions)", dict()),
    ("a mixed config (RMSNorm, a plain MLP, sinusoidal positions, 1 key/value head)",
     dict(positional="sinusoidal", normalization="rmsnorm", n_kv_head=1, eps=1e-6)),
    ("a config with RoPE and LayerNorm (4 key/value heads, biases)", dict(positional="rope", mlp="swiglu", d_ff=40)),
)


def _parts_hint(cfg, got, want) -> str | None:
    """What a mismatch of parameter names or shapes says about the parts, in words (the first row that applies)."""
    extra, missing = set(got) - set(want), set(want) - set(got)
    for mismatch, hint in (  # (the mismatch, what it says)
        (any(k.startswith("embed.pos") for k in extra), "with positional='rope' the embedding has no position table: "
         "give InputEmbedding None as its positional code (the rotation in attention does the job)"),
        (any(k.startswith("embed.pos") for k in missing), f"with positional={cfg.positional!r} the embedding needs its "
         "position code: pass cfg.positional to InputEmbedding"),
        (any(".mlp.gate" in k for k in missing),
         "with mlp='swiglu' each block's MLP is a SwiGLU(d_model, cfg.d_ff, cfg.bias, cfg.dropout)"),
        (any(".mlp.gate" in k for k in extra), "with mlp='plain' the block builds its own MLP: give it no mlp"),
        (any(k.endswith(("ln1.bias", "ln2.bias", "ln_f.bias")) for k in extra | missing), "the norms are not the ones "
         "the config asks for: make_norm(cfg.normalization, C, cfg.eps, cfg.bias, cfg.fast) for ln1, ln2 and ln_f"),
        (extra or missing, f"the parameters differ: missing {sorted(missing)[:3]}, unexpected {sorted(extra)[:3]}"),
    ):
        if mismatch:
            return hint
    qkv = next(k for k in want if k.endswith("attn.qkv.weight"))
    if got[qkv].shape != want[qkv].shape:
        return (f"{qkv} is {tuple(got[qkv].shape)}, not {tuple(want[qkv].shape)}: pass cfg.n_kv_head to every block, "
                "whose attention then has fewer key/value heads")
    for key in want:
        if got[key].shape != want[key].shape:
            return f"{key} is {tuple(got[key].shape)}, not {tuple(want[key].shape)}"
    return None


@check("10.5", "modern_parts", reference=_lib.modern_parts)
def check_modern_parts(fn):
    """``fn(cfg) -> (embedding, blocks, final norm)`` for chapter 06's ``GPT(cfg, parts=...)``: the
    same parameters as the package's and, given the same values, the same logits."""
    from ..config import GPTConfig
    from ..model import GPT

    idx = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(10))
    for what, fields in _PARTS_CONFIGS:
        cfg = GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=4, d_model=32, **fields)
        with fresh_rng():
            parts = fn(cfg)
            expect(isinstance(parts, tuple) and len(parts) == 3,
                   "return three things: (embedding, blocks as an nn.ModuleList, final norm)")
            got = GPT(cfg, parts=parts).eval()
            want = GPT(cfg, parts=_lib.modern_parts(cfg)).eval()
        hint = _parts_hint(cfg, got.state_dict(), want.state_dict())
        expect(hint is None, f"{what}: {hint}")
        got.load_state_dict(want.state_dict())
        for name, module in (("ln1", got.blocks[0].ln1), ("ln_f", got.ln_f)):
            # by name: the notebook's RMSNorm (the learner's 10.1) is not the package's class
            wanted, got_name = type(want.ln_f).__name__, type(module).__name__
            expect(got_name == wanted, f"{what}: {name} is {got_name}, the config asks for "
                   f"{wanted}: use make_norm(cfg.normalization, ...)")
            expect(getattr(module, "eps", cfg.eps) == cfg.eps,
                   f"{what}: {name} has eps {module.eps}, the config says {cfg.eps}: pass cfg.eps")
        if cfg.positional == "rope":
            ropes = {id(block.attn.rope) for block in got.blocks}
            expect(None not in {block.attn.rope for block in got.blocks}, f"{what}: the blocks' "
                   "attention has no rotary embedding: pass rope= to every block")
            expect(len(ropes) == 1, f"{what}: each block has its own RotaryEmbedding: build one "
                   "and give it to every block (its cos and sin tables exist once per model)")
        with torch.no_grad():
            expect_close(got(idx)[0], want(idx)[0], f"{what}: with the same parameter values the logits differ from "
                         "the package's: check the block's options (norm placement, activation, eps, the rotary "
                         "embedding's base and size)", atol=1e-5)


# ---------------------------------------------------------------- 10.6 extend: a sliding window
def _sliding_window_mask(T: int, window: int, past: int = 0) -> torch.Tensor:
    position = past + torch.arange(T)[:, None]  # (T, 1)
    distance = position - torch.arange(past + T)[None, :]  # (T, past + T)
    return (distance >= 0) & (distance < window)


@check("10.6", "sliding_window_mask")
def check_sliding_window_mask(fn):
    """``fn(T, window, past=0) -> bool [T, past + T]``."""
    for T, window, past in ((6, 3, 0), (1, 4, 9), (3, 2, 5), (5, 10, 0), (4, 1, 2)):
        got = fn(T, window, past)
        expect(isinstance(got, torch.Tensor) and got.dtype == torch.bool, "return a bool tensor (True = may attend)")
        expect(tuple(got.shape) == (T, past + T), "one row per new query and one column per key, cached ones included: "
               f"({T}, {past + T}) for T={T}, past={past}, got {tuple(got.shape)}")
        expect(not got.triu(past + 1).any(), "a query sees a later key: the mask must stay causal")
        want = _sliding_window_mask(T, window, past)
        expect(torch.equal(got, want), name_mistake(got, [
            ("one key too many: the window counts the query itself, so distances 0 .. window-1",
             _sliding_window_mask(T, window + 1, past)),
            ("one key too few: a query sees itself and the window - 1 keys before it",
             _sliding_window_mask(T, window - 1, past)),
            ("the new queries sit at positions past .. past + T - 1, after the cached keys: shift the query positions "
             "by past", _sliding_window_mask(past + T, window, 0)[:T]),
        ], want=want, atol=0, rtol=0) or f"the mask differs from the reference for T={T}, window={window}, past={past}")


# ---------------------------------------------------------------- 10.7 extend: a rolling KV cache
class _RollingKVCache:
    """Mistral's rolling buffer: keys and values [B, nkv, window, hs] of the last ``window`` positions.

    ``update(k, v)`` (one new position, [B, nkv, 1, hs]) writes it over the oldest slot and returns the filled slots [B,
    nkv, min(length, window), hs], in slot order: one query needs no key order, since its softmax sums over the keys.
    ``length`` counts every position seen (the next position).
    """

    def __init__(self, window: int) -> None:
        self.window, self.length = window, 0
        self.k: torch.Tensor | None = None  # (B, nkv, window, hs)
        self.v: torch.Tensor | None = None  # (B, nkv, window, hs)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if k.shape[2] != 1:
            raise ValueError("RollingKVCache takes one position per update: feed a prompt one token at a time")
        if self.k is None:
            self.k = k.new_zeros(*k.shape[:2], self.window, k.shape[3])  # (B, nkv, window, hs)
            self.v = v.new_zeros(self.k.shape)
        slot = self.length % self.window  # the oldest position's slot, once the buffer is full
        self.k[:, :, slot], self.v[:, :, slot] = k[:, :, 0], v[:, :, 0]
        self.length += 1
        held = min(self.length, self.window)
        return self.k[:, :, :held], self.v[:, :, :held]


def _held_bytes(cache) -> int:
    """Bytes of the distinct tensor storages a cache object keeps in its attributes (one level
    deep, and inside lists, tuples and dicts): what it holds on to between updates."""
    found, stack = {}, list(vars(cache).values())
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            found[storage.data_ptr()] = storage.nbytes()
        elif isinstance(item, (list, tuple)):
            stack += list(item)
        elif isinstance(item, dict):
            stack += list(item.values())
    return sum(found.values())


def _key_at(p: int, B: int = 2, nkv: int = 2, hs: int = 3) -> torch.Tensor:
    """The probe's key of position p, [B, nkv, 1, hs]: p plus a fraction for each row and head."""
    offset = torch.arange(B * nkv, dtype=torch.float32).view(B, nkv, 1, 1) / 100
    return (p + offset).expand(B, nkv, 1, hs).clone()


def _expect_window_kept(cache, window: int, steps: int = 13) -> None:
    """Feed keys that name their position; after each update, the positions handed back must be the last ``window`` (any
    order), each value beside its key, and ``length`` the positions seen."""
    for p in range(steps):
        key = _key_at(p)
        got = cache.update(key, -key)
        expect(isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got),
               "update(k, v) returns two tensors: the keys and the values the new query may attend")
        keys, values = got
        expect(keys.ndim == 4 and keys.shape[:2] == key.shape[:2] and keys.shape[3] == key.shape[3]
               and values.shape == keys.shape, "update returns keys and values [B, nkv, S, hs] = [2, 2, S, 3], time in "
               f"dim 2; got {tuple(keys.shape)} and {tuple(values.shape)}")
        length = getattr(cache, "length", None)
        expect(length == p + 1, f"after {p + 1} positions, length is {length!r}: length counts every position seen "
               "(the attention reads it as the position of the next token, for the rotation), not the positions kept")
        held = sorted(round(x) for x in keys[0, 0, :, 0].tolist())
        want = list(range(max(0, p - window + 1), p + 1))
        where = f"after position {p} (window {window}) update handed back positions {held}"
        if held == list(range(p + 1)) and len(held) == window + 1 and p + 1 < steps:
            continue  # one too many, or all of them? the next position tells
        expect(p in held, f"{where}: the new position itself is missing; a query attends to its own key")
        expect(len(held) <= window or held != list(range(p + 1)),
               f"{where}: every position so far; a sliding window keeps only the last {window}")
        expect(len(held) != window + 1, f"{where}: one too many; the window counts the query's "
                                        f"own position, so {want[0]} .. {p}")
        expect(len(held) != window - 1 or p < window - 1,
               f"{where}: one too few; the query's own position and the {window - 1} before it")
        expect(held == want, f"{where}; the last {window} are {want}: keep the newest, drop the oldest")
        positions = [round(x) for x in keys[0, 0, :, 0].tolist()]
        expect(torch.equal(keys, torch.cat([_key_at(q) for q in positions], dim=2)), "each batch row and each "
               "key/value head keeps its own keys: store the whole [B, nkv, 1, hs] slice of every position")
        expect(torch.equal(values, -keys), "the values must come back in the same order as their keys")


@check("10.7", "RollingKVCache")
def check_rolling_kv_cache(cls):
    """``cls(window)``: ``update(k, v)`` with one new position [B, nkv, 1, hs] returns the keys and values [B, nkv, S,
    hs] of the last min(length, window) positions; ``length``: positions seen."""
    from transformer_course.multihead import MultiHeadAttention

    for window in (4, 1, 20):
        _expect_window_kept(cls(window), window)
    cache, sizes = cls(4), []
    for p in range(24):
        cache.update(_key_at(p), -_key_at(p))
        if p in (11, 23):
            sizes.append(_held_bytes(cache))
    need = 2 * _key_at(0).numel() * 4 * 4  # keys and values of 4 positions, float32
    expect(sizes[0] == sizes[1] and sizes[1] <= need * 5 // 4,  # room for one more position
           f"the cache keeps {sizes[0]:,} bytes after 12 positions and {sizes[1]:,} after 24: it must not grow with "
           f"the sequence; a window of 4 needs the keys and values of 4 positions, {need:,} bytes here")
    with fresh_rng(107), torch.no_grad():  # in chapter 04's attention: rotary, 2 key/value heads
        rope = _lib.RotaryEmbedding(4, 32)
        attn = MultiHeadAttention(16, 4, n_kv_head=2, bias=False, rope=rope).eval()
        x = torch.randn(2, 12, 16)
        for window in (5, 12):
            cache = cls(window)
            steps = [attn(x[:, t:t + 1], cache=cache) for t in range(12)]  # 12 x (2, 1, 16)
            want = attn(x, mask=_sliding_window_mask(12, window))
            expect_close(torch.cat(steps, dim=1), want,
                         f"one token at a time through MultiHeadAttention with your cache (window {window}), the "
                         "outputs differ from the whole sequence with the sliding-window mask")
