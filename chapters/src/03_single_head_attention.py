# %% [markdown]
# # Chapter 03: one attention head, step by step
#
# > Scaled dot-product attention, the causal mask, and one attention head.
# > Shapes: B batch, T time, C = d_model channels, hs head size; T_q / T_k query / key positions,
# > d_k the width of queries and keys, d_v the width of values. Attention is softmax(q kᵀ / √d_k) v
# > (Vaswani et al. 2017, section 3.2.1); a bool mask (True = may attend) removes keys before the
# > softmax, and a query that may attend nothing gets zero weights and a zero output, never NaN.
#
# (Draft: the full chapter is being written around the exported code below.)

# %%
#| default_exp attention

# %%
import torch

torch.set_printoptions(precision=4)

# %%
#| export
import math
import operator

import torch
import torch.nn.functional as F
from torch import nn

_MASKED = float("-inf")  # the score a masked key gets: exp(-inf) = 0, so exactly zero weight, no magic -1e9

# %%
#| export
def causal_mask(T: int, device=None) -> torch.Tensor:
    """Bool [T, T]: True where query i may attend key j, that is j <= i (lower triangle and diagonal)."""
    try:
        T = operator.index(T)
    except TypeError:
        raise TypeError(f"causal_mask needs an int sequence length T, got {type(T).__name__} {T!r}") from None
    if T < 1:
        raise ValueError(f"causal_mask needs a sequence length T >= 1, got {T}")
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()

# %%
#| export
def _check_qkv(q, k, v) -> torch.Size:
    """Validate q [..., T_q, d_k], k [..., T_k, d_k], v [..., T_k, d_v]; return the broadcast batch shape."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim < 2:
            raise ValueError(f"{name} needs at least 2 dims [..., T, d], got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must hold floating-point numbers, got {t.dtype}; convert it with .float()")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same last dim d_k to be compared, got q {tuple(q.shape)} and "
            f"k {tuple(k.shape)}; project both to the same head size"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same number of positions T_k (dim -2), got k {tuple(k.shape)} and "
            f"v {tuple(v.shape)}; each key needs exactly one value"
        )
    try:
        return torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"the batch dims of q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} "
            "do not broadcast: everything before the last two dims must match (or be 1)"
        ) from None


def _check_mask(mask, scores_shape: tuple) -> None:
    """Validate a bool mask that must broadcast to the scores' shape [..., T_q, T_k]."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a bool torch.Tensor (True = may attend), got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"mask must be a bool tensor (True = may attend), got dtype {mask.dtype}: turn an additive "
            "mask of 0 and -inf into one with `mask == 0`, and a 0/1 mask with `mask.bool()`"
        )
    try:
        fits = torch.broadcast_shapes(mask.shape, scores_shape) == scores_shape
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to the scores' shape [..., T_q, T_k] = "
            f"{tuple(scores_shape)}; a key-padding mask [B, T_k] needs a query axis: mask[:, None, :]"
        )

# %%
#| export
def scaled_dot_product_attention(q, k, v, mask=None, *, scale: float | None = None, dropout_p: float = 0.0):
    """Attention of queries over keys: returns ``(out, weights)``.

    q [..., T_q, d_k], k [..., T_k, d_k], v [..., T_k, d_v]; the leading dims (batch, heads) broadcast.
    mask: optional bool tensor broadcastable to [..., T_q, T_k], True where a query may attend a key.
    scale: multiplies the scores; default 1/√d_k (the "scaled" in the name).
    dropout_p: drop attention weights with this probability (pass 0.0 outside training).

    out [..., T_q, d_v] is the weighted mean of the values; weights [..., T_q, T_k] are the softmax
    weights (before dropout): each row sums to 1, masked keys get 0, and a row whose every key is
    masked is all zeros, so its output is zeros, never NaN.
    """
    batch = _check_qkv(q, k, v)
    T_q, d_k, T_k = q.shape[-2], q.shape[-1], k.shape[-2]
    if mask is not None:
        _check_mask(mask, (*batch, T_q, T_k))
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    scale = 1.0 / math.sqrt(d_k) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., T_q, T_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, _MASKED)
    weights = torch.softmax(scores, dim=-1)  # (..., T_q, T_k), rows sum to 1
    if mask is not None:
        # a row with every key masked is softmax(-inf, ..., -inf) = 0/0 = NaN: make it all zeros
        weights = weights.masked_fill(~mask, 0.0)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    return dropped @ v, weights  # (..., T_q, d_v), (..., T_q, T_k)

# %%
#| export
class AttentionHead(nn.Module):
    """One head of self-attention: x [B, T, C] -> [B, T, hs].

    Three bias-free linear maps project every position's vector into a query, a key and a value of
    width ``head_size``; :func:`scaled_dot_product_attention` then mixes the values. With
    ``causal=True`` position t sees positions 0..t only. ``forward`` takes an optional extra bool
    mask broadcastable to [B, T, T] (True = may attend, e.g. padding), combined with the causal one.
    The weights of the last call are kept, detached, in ``last_weights`` [B, T, T] for plotting.
    """

    def __init__(self, d_model: int, head_size: int, causal: bool = True, dropout: float = 0.0):
        super().__init__()
        for name, value in (("d_model", d_model), ("head_size", head_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model, self.head_size, self.causal, self.dropout = d_model, head_size, causal, dropout
        self.query = nn.Linear(d_model, head_size, bias=False)
        self.key = nn.Linear(d_model, head_size, bias=False)
        self.value = nn.Linear(d_model, head_size, bias=False)
        self.last_weights: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.ndim != 3 or x.shape[-1] != self.d_model:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"AttentionHead expects x of shape [B, T, {self.d_model}] (d_model={self.d_model}), got {shape}")
        B, T, _ = x.shape
        q, k, v = self.query(x), self.key(x), self.value(x)  # (B, T, hs) each
        if mask is not None:
            _check_mask(mask, (B, T, T))
        if self.causal:
            causal = causal_mask(T, device=x.device)  # (T, T)
            mask = causal if mask is None else mask & causal
        out, weights = scaled_dot_product_attention(q, k, v, mask, dropout_p=self.dropout if self.training else 0.0)
        self.last_weights = weights.detach()  # (B, T, T)
        return out  # (B, T, hs)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, head_size={self.head_size}, causal={self.causal}, dropout={self.dropout}"

# %%
head = AttentionHead(4, 2)
print(head(torch.randn(2, 6, 4)).shape)
