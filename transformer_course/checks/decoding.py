"""Checks for chapter 14's exercises (faster decoding: quantization, speculative decoding).
Hand-written.

Each check runs the learner's code and the package's on the same inputs; when they differ, a
table of (planted mistake, hint) rows names the mistake whose output the learner's equals. The
builds 14.1 ``quantize_int8``, 14.2 ``quantize_int4``, 14.4 ``verify`` and the debug 14.5
``prompt_lookup`` have the package as their reference; the reference of the extend exercise 14.7
(``_pack_int4``) lives here. So do
the two planted mistakes of ``verify`` the chapter runs through ``speculative.distribution_test``.
"""

import math

import torch

from .. import quantization as _quantization
from .. import speculative as _speculative
from ._core import check, expect, expect_tensor, fresh_rng, name_mistake


def _flat(pair):
    """(q, scale) as one float64 vector, so that a mistake in either part is told apart."""
    return torch.cat([t.double().flatten() for t in pair]) if all(t is not None for t in pair) else None


def _pair_hint(got, rows, *args):
    """The hint of the first (mistake function, hint) row whose (q, scale) on ``args`` is ``got``."""
    return name_mistake(_flat(got), [(h, lambda f=f: _flat(f(*args))) for f, h in rows], atol=1e-7, rtol=1e-5)


def _quantized_pair(out, shape: tuple, scale_shape: tuple, what: str):
    """The learner's (q, scale), checked for type, shape and dtype."""
    expect(
        isinstance(out, tuple) and len(out) == 2,
        f"return two things: (q, scale), got {type(out).__name__}",
    )
    q, scale = out
    expect_tensor(q, shape=shape, what="q")
    expect(q.dtype == torch.int8, f"q holds small integers: return it as torch.int8, got {q.dtype}")
    expect_tensor(scale, shape=scale_shape, what=f"the scales {what}")
    return q, scale


# ---------------------------------------------------------------- 14.1 build: quantize_int8


def _int8_rows(w, *, top=127, rounder=torch.round, clamp=True, axis=1, zero_scale=1.0):
    """quantize_int8 with one mistake switched on at will."""
    peak = w.abs().amax(dim=axis, keepdim=True)
    scale = torch.where(peak > 0, peak / top, torch.full_like(peak, zero_scale))
    q = rounder(w / scale)
    q = q.clamp(-127, 127) if clamp else q
    return q.to(torch.int8), scale.reshape(-1)


_INT8_MISTAKES = [
    (
        lambda w: _int8_rows(w, top=128),
        "the largest |w| maps to 127 (scale = max|w| / 127): 128 overflows int8",
    ),
    (
        lambda w: _int8_rows(w, top=255),
        "symmetric int8 uses -127..127: divide the largest |w| by 127, not 255",
    ),
    (
        lambda w: _int8_rows(w, rounder=torch.trunc),
        "round to the nearest integer (torch.round); .to(int8) truncates",
    ),
    (
        lambda w: _int8_rows(w, rounder=torch.floor),
        "round to the nearest integer (torch.round), not down",
    ),
    (
        lambda w: _int8_rows(w, axis=0),
        "one scale per output channel: the largest |w| of each row (dim=1), not column",
    ),
]


@check("14.1", "quantize_int8", reference=_quantization.quantize_int8)
def check_quantize_int8(fn):
    """``fn(w [N, K]) -> (q int8 [N, K], scale [N])``."""
    with fresh_rng(14):
        w = torch.randn(6, 10) * torch.tensor([0.01, 0.1, 1.0, 3.0, 0.5, 0.2])[:, None]
    for x, what in [
        (torch.tensor([[0.50, -1.27, 0.02]]), "by hand, [0.50, -1.27, 0.02] gives scale 0.01 and q [50, -127, 2]"),
        (w, "scale[n] = the largest |w| of row n / 127, q = round(w / scale) inside -127..127"),
    ]:
        got = _quantized_pair(fn(x), tuple(x.shape), (x.shape[0],), "[N], one per row")
        want = _quantization.quantize_int8(x)
        same = torch.equal(got[0], want[0]) and torch.allclose(got[1], want[1], rtol=1e-5, atol=1e-9)
        expect(same, _pair_hint(got, _INT8_MISTAKES, x) or f"{what}; got q {got[0].tolist()[0][:5]}...")
    q, scale = fn(torch.zeros(2, 4))
    expect(
        torch.equal(scale.float(), torch.ones(2)) and bool((q == 0).all()),
        "a row of zeros has largest |w| 0: give it scale 1 (not 0, which divides by zero)",
    )


# ---------------------------------------------------------------- 14.2 build: quantize_int4


def _int4_groups(w, group, *, top=7, per_row=False, strided=False):
    """quantize_int4 with one mistake switched on at will; scale [N, K // group] in every case."""
    N, K = w.shape
    if strided:  # groups of every (K // group)-th input: reshape(N, group, K // group) read the wrong way
        blocks = w.reshape(N, group, K // group).transpose(1, 2)
    else:
        blocks = w.reshape(N, 1, K) if per_row else w.reshape(N, K // group, group)
    peak = blocks.abs().amax(dim=2, keepdim=True)
    scale = torch.where(peak > 0, peak / top, torch.ones_like(peak))
    q = torch.round(blocks / scale).clamp(-7, 7).to(torch.int8)
    q = q.transpose(1, 2).reshape(N, K) if strided else q.reshape(N, K)
    return q, scale[..., 0].expand(N, K // group)


_INT4_MISTAKES = [
    (lambda w, g: _int4_groups(w, g, top=8), "symmetric int4 uses -7..7: the largest |w| of a group maps to 7"),
    (lambda w, g: _int4_groups(w, g, top=15), "4 bits give -7..7 around 0: divide by 7, not 15"),
    (lambda w, g: _int4_groups(w, g, top=127), "that is int8's 127: int4's largest level is 7"),
    (lambda w, g: _int4_groups(w, g, per_row=True), "one scale per group of `group` inputs, not per row"),
    (
        lambda w, g: _int4_groups(w, g, strided=True),
        "a group is `group` consecutive inputs of a row: reshape to [N, K // group, group], not [N, group, K // group]",
    ),
]


@check("14.2", "quantize_int4", reference=_quantization.quantize_int4)
def check_quantize_int4(fn):
    """``fn(w [N, K], group) -> (q int8 [N, K] in -7..7, scale [N, K // group])``."""
    with fresh_rng(41):
        w = torch.randn(8, 64) * torch.linspace(0.02, 2.0, 64)
    cases = [
        (
            torch.tensor([[0.7, -0.14, 3.5, 0.5]]),
            2,
            "by hand, [0.7, -0.14, 3.5, 0.5] in groups of 2 gives scales [0.1, 0.5] and q [7, -1, 7, 1]",
        ),
        (w, 8, None),
        (w, 32, None),
    ]
    for x, group, what in cases:
        N, K = x.shape
        got = _quantized_pair(fn(x, group), (N, K), (N, K // group), f"[N, K // group] = [{N}, {K // group}]")
        want = _quantization.quantize_int4(x, group)
        same = torch.equal(got[0], want[0]) and torch.allclose(got[1], want[1], rtol=1e-5, atol=1e-9)
        expect(
            same,
            _pair_hint(got, _INT4_MISTAKES, x, group)
            or what
            or f"groups of {group}: q = round(w / its group's scale) in -7..7, scale = the group's largest |w| / 7",
        )


# ---------------------------------------------------------------- 14.3 predict: bits per weight


@check("14.3", "my_bits_per_weight")
def check_predict_bits_per_weight(fn):
    """``fn() -> (bits a weight with int8 per row of 768, with int4 in groups of 32)``."""
    got = fn()
    expect(
        isinstance(got, tuple | list) and len(got) == 2 and all(isinstance(v, int | float) for v in got),
        f"return two numbers (int8, int4), got {got!r}",
    )
    int8, int4 = got
    for value, want, rows in [
        (
            int8,
            8 + 32 / 768,
            [
                (8, "the scales cost bits too: 32 bits shared by a row of 768"),
                (8 + 32 / 32, "int8 has one scale per row of 768, not per 32"),
                (8 + 16 / 768, "the scales are float32: 32 bits, not 16"),
            ],
        ),
        (
            int4,
            5.0,
            [
                (4, "the scales cost bits too: 32 bits shared by a group of 32"),
                (4.5, "a float32 scale is 32 bits; 32 shared by 32 weights is 1 bit each"),
                (4 + 32 / 768, "int4 here has one scale per group of 32, not per row"),
            ],
        ),
    ]:
        named = next((hint for wrong, hint in rows if abs(value - wrong) < 1e-3), None)
        expect(
            abs(value - want) < 2e-3,
            named
            or f"{value} is not it: count 8 (or 4) bits plus the scale's 32 bits divided by the weights that share it",
        )


# ---------------------------------------------------------------- 14.4 build: verify


def accept_if_p_above_q(p, q, drafted, generator):
    """A planted mistake: keep a guess only when p > q (never with probability p/q)."""
    for i, t in enumerate(drafted.tolist()):
        if p[i, t] <= q[i, t]:
            residual = (p[i] - q[i]).clamp(min=0)
            residual = residual if residual.sum() > 0 else p[i]
            return torch.cat([drafted[:i], torch.multinomial(residual / residual.sum(), 1, generator=generator)])
    return torch.cat([drafted, torch.multinomial(p[len(drafted)], 1, generator=generator)])


def resample_from_p(p, q, drafted, generator):
    """A planted mistake: keep with probability min(1, p/q), but draw the replacement from p."""
    for i, t in enumerate(drafted.tolist()):
        if torch.rand((), generator=generator) * q[i, t] >= p[i, t]:
            return torch.cat([drafted[:i], torch.multinomial(p[i], 1, generator=generator)])
    return torch.cat([drafted, torch.multinomial(p[len(drafted)], 1, generator=generator)])


def _first_tokens(fn, p, q, drafted, draws=2000, seed=3):
    """The frequencies of (the first token out, the number out) over `draws` calls of fn."""
    g = torch.Generator().manual_seed(seed)
    first, lengths = torch.zeros(p.shape[1]), torch.zeros(len(drafted) + 2)
    for _ in range(draws):
        out = fn(p, q, drafted, g)
        expect(
            isinstance(out, torch.Tensor) and out.dim() == 1 and 1 <= len(out) <= len(drafted) + 1,
            f"return a LongTensor of 1 to k + 1 = {len(drafted) + 1} tokens, got {out!r}",
        )
        first[int(out[0])] += 1
        lengths[len(out)] += 1
    return first / draws, lengths / draws


_FROM_P = "after a rejection draw from the residual max(0, p - q), normalised, not from p"


@check("14.4", "verify", reference=_speculative.verify)
def check_verify(fn):
    """``fn(p [k + 1, V], q [k, V], drafted [k], generator) -> LongTensor [n + 1]``."""
    p = torch.tensor([[0.2, 0.8], [0.6, 0.4]])
    out = fn(p, torch.tensor([[0.1, 0.9]]), torch.tensor([0]), torch.Generator().manual_seed(0))
    expect(
        isinstance(out, torch.Tensor) and len(out) == 2 and int(out[0]) == 0,
        "p(guess) = 0.2 >= q(guess) = 0.1: min(1, p/q) = 1, so the guess is always kept, and one "
        "more "
        "token follows from p[k]",
    )
    # (p, q, drafted, the right chance that the first token out is 0, the hints when it is not)
    cases = [
        (
            torch.tensor([[0.5, 0.5], [1.0, 0.0]]),
            torch.tensor([[1.0, 0.0]]),
            torch.tensor([0]),
            0.5,
            {
                0.0: "keep a guess with probability min(1, p/q), not only when p > q",
                0.75: _FROM_P,
                1.0: "keep the guess with probability min(1, p/q) (here 0.5), not always",
            },
        ),
        (
            torch.tensor([[0.3, 0.7], [0.5, 0.5]]),
            torch.tensor([[0.6, 0.4]]),
            torch.tensor([0]),
            0.5,
            {
                0.0: "keep a guess with probability min(1, p/q), not only when p > q",
                1.0: "keep the guess with probability min(1, p/q) (here 0.5), not always",
                0.65: _FROM_P,
            },
        ),
    ]
    for p, q, drafted, want, hints in cases:
        first, _ = _first_tokens(fn, p, q, drafted)
        got = float(first[0])
        named = next((h for wrong, h in hints.items() if abs(got - wrong) < 0.04), None)
        expect(
            abs(got - want) < 0.04,
            named
            or f"p = {p[0].tolist()}, q = {q[0].tolist()}, guess 0: the first "
            f"token out must be 0 with probability {want} (the target's), got {got:.2f} over 2,000 "
            "calls",
        )
    same = torch.tensor([[0.3, 0.7], [0.5, 0.5], [0.9, 0.1]])
    _, lengths = _first_tokens(fn, same, same[:2], torch.tensor([1, 0]), draws=50)
    expect(
        float(lengths[3]) == 1.0,
        "when p equals q every guess is kept: return the k guesses and one more token drawn from p[k] (k + 1 tokens)",
    )


# ---------------------------------------------------------------- 14.5 debug: prompt_lookup


def _lookup(ctx, k, max_ngram, *, own_tail=False, earliest=False, shortest=False, gram=False):
    """prompt_lookup with one mistake switched on at will."""
    sizes = range(min(max_ngram, len(ctx) - 1), 0, -1)
    for n in reversed(sizes) if shortest else sizes:
        last = len(ctx) - n - (0 if own_tail else 1)
        for start in range(0, last + 1) if earliest else range(last, -1, -1):
            if ctx[start : start + n] == ctx[-n:]:
                return ctx[start : start + k] if gram else ctx[start + n : start + n + k]
    return []


_LOOKUP_MISTAKES = [
    (dict(own_tail=True), "the tail matches itself: look for it before the last position (start at len(ctx) - n - 1)"),
    (dict(earliest=True), "take the latest earlier occurrence: search from the end backwards"),
    (dict(shortest=True), "try the longest n-gram first, then shorter ones, down to 1"),
    (dict(gram=True), "propose what FOLLOWED the earlier n-gram (from start + n), not the n-gram itself"),
]
_LOOKUP_CASES = [
    ([1, 2, 3, 4, 5, 1, 2, 3], 2, 3),
    ([7, 1, 2, 3, 4, 5, 1, 2, 3], 9, 3),
    ([1, 2, 9, 5, 2, 8, 1, 2], 3, 3),
    ([5, 6, 1, 9, 9, 1, 6, 1], 1, 1),
    ([1, 2, 3, 4], 3, 3),
    ([4], 3, 3),
    ([3, 3, 3, 3], 2, 2),
]


@check("14.5", "prompt_lookup", reference=_speculative.prompt_lookup)
def check_prompt_lookup(fn):
    """``fn(ctx list[int], k, max_ngram=3) -> list[int]``."""
    got = [fn(list(ctx), k, n) for ctx, k, n in _LOOKUP_CASES]
    expect(all(isinstance(g, list) for g in got), f"return a list of ids, got {type(got[0]).__name__}")
    got = [[int(t) for t in g] for g in got]
    for (ctx, k, n), mine in zip(_LOOKUP_CASES, got, strict=True):
        want = _lookup(ctx, k, n)
        if mine != want:
            named = next(
                (h for kw, h in _LOOKUP_MISTAKES if got == [_lookup(c, kk, nn, **kw) for c, kk, nn in _LOOKUP_CASES]),
                None,
            )
            expect(
                False,
                named
                or f"ctx {ctx}, k = {k}, max_ngram {n} -> {want} (up to k ids; [] when no n-gram recurs), got {mine}",
            )


# ---------------------------------------------------------------- 14.6 predict: break-even


def _break_even(cost: float, k: int = 4, terms: int | None = None) -> float:
    """The a in [0, 1] where 1 + a + ... + a^(terms - 1) equals cost (terms: k + 1)."""
    terms = k + 1 if terms is None else terms
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if sum(mid**i for i in range(terms)) < cost else (low, mid)
    return high


@check("14.6", "my_break_even")
def check_predict_break_even(fn):
    """``fn() -> float``: the acceptance rate at which k = 4, c = 2.0 and d = 0.3 break even."""
    got = fn()
    expect(isinstance(got, int | float) and not isinstance(got, bool), f"return a number, got {got!r}")
    rows = [
        (_break_even(2.0), "the round costs the draft's 4 steps too: c + k·d = 2.0 + 4 · 0.3"),
        (_break_even(1.0 + 1.2), "the target's pass over 5 positions costs c = 2.0 steps, not 1"),
        (_break_even(3.2, terms=4), "a round yields up to k + 1 = 5 tokens: 1 + a + a² + a³ + a⁴"),
        (_break_even(2.0 + 5 * 0.3), "the draft makes k = 4 guesses a round, so 4 draft steps, not 5"),
    ]
    named = next((hint for wrong, hint in rows if abs(got - wrong) < 0.005), None)
    expect(
        abs(got - _break_even(3.2)) < 0.005,
        named or f"{got} is not it: find a where 1 + a + a² + a³ + a⁴ = 2.0 + 4 · 0.3",
    )


# ---------------------------------------------------------------- 14.7 extend: pack_int4


def _pack_int4(q: torch.Tensor) -> torch.Tensor:
    """q int8 [N, K] in -7..7 -> uint8 [N, K // 2]: column 2j low nibble, 2j + 1 high, two's
    complement."""
    low, high = q[:, 0::2].tolist(), q[:, 1::2].tolist()
    return torch.tensor(
        [[(a % 16) + 16 * (b % 16) for a, b in zip(r, s, strict=True)] for r, s in zip(low, high, strict=True)],
        dtype=torch.uint8,
    )


def _unpack(packed: torch.Tensor) -> list[list[int]]:
    """The check's own unpacking: signed values from each byte, low nibble first."""
    signed = lambda v: v - 16 if v >= 8 else v  # noqa: E731
    return [[signed(x) for b in row for x in (b % 16, b // 16)] for row in packed.tolist()]


@check("14.7", "pack_int4", reference=_pack_int4)
def check_pack_int4(fn):
    """``fn(q int8 [N, K]) -> uint8 [N, K // 2]``."""
    out = expect_tensor(
        fn(torch.tensor([[-1, 7, 2, -7]], dtype=torch.int8)),
        shape=(1, 2),
        what="the bytes [N, K // 2]",
    )
    expect(out.dtype == torch.uint8, f"return torch.uint8 bytes, got {out.dtype}")
    got = out.tolist()[0]
    named = {
        (0xF7, 0x29): "column 2j goes in the LOW nibble, 2j + 1 in the high one: swap them",
        (
            0xFF,
            0x92,
        ): "mask each value to its 4 bits (& 0xF) before combining: -1 as a byte is 0xFF",
    }
    expect(
        got == [0x7F, 0x92],
        named.get(tuple(got))
        or f"by hand, [-1, 7, 2, -7] packs to [0x7F, 0x92] "
        f"(-1 is 0b1111 in the low nibble, 7 is 0b0111 in the high one), got "
        f"{[hex(v) for v in got]}",
    )
    with fresh_rng(6):
        q = torch.randint(-7, 8, (5, 12), dtype=torch.int8)
    out = expect_tensor(fn(q), shape=(5, 6), what="the bytes [N, K // 2]")
    expect(
        _unpack(out) == q.tolist(),
        "each byte holds two values: unpacking gives back q exactly (mask each "
        "value to 4 bits, & 0xF, before shifting)",
    )
    expect(math.isclose(out.numel() * out.element_size(), q.numel() / 2), "one byte for two values")
