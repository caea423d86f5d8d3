# %% [markdown]
# # Chapter 07: Generation, sampling and the KV cache
#
# A trained GPT does not write text by itself. Given a sequence of token ids it returns one vector of
# **logits** per position: a score for every token of the vocabulary, saying how likely it is to come
# next. Writing text means turning those scores into a choice, appending the choice to the sequence,
# and asking again, one token at a time. This chapter builds that loop and the knobs that steer it.
#
# **You will build** greedy decoding and seeded sampling; three knobs that reshape the distribution,
# **temperature** (you fix a version that quietly does nothing), **top-k** and **top-p**; the
# autoregressive loop (cropping at `block_size`, end tokens, batches); the **cached generation loop**,
# which feeds the prompt once and then one token per step through a **KV cache**, proven to change no
# output; streaming text in whole characters; a knob of your own (**min-p**) and a playground. Your
# top-k, top-p and cached loop are exported cells: once their checks pass, every later text goes
# through them.
#
# **You will be able to** sample from chapter 06's model (the course ships it) with any of these
# settings, say what each does to the distribution, and what the cache saves and costs. **It needs** the
# tokenizers (01), `GPT` and `load_checkpoint` (06) and chapter 04's `KVCache`; it exports
# `transformer_course/generation.py`. How fast decoding can go is the optional appendix 90's subject.

# %%
#| default_exp generation

# %%
#| export
"""Generation: turn a GPT's logits into text, one token at a time (exported from chapter 07).

Temperature (0 = greedy), top-k and top-p act in this order on the last position's logits [B, V].
Draws come only from the ``torch.Generator`` given, never from PyTorch's global random state.
Shapes: B batch, T time, V vocabulary size.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Iterator

import torch

from transformer_course.arguments import flag, real_number, whole_number

# %%
import math

import matplotlib.pyplot as plt
import torch

torch.set_printoptions(precision=4, sci_mode=False)
torch.set_num_threads(1)  # tiny models: one thread is as fast as several and does not fight for the cores
_ = torch.manual_seed(0)

# %% [markdown]
# ## 1. From logits to probabilities, and greedy decoding
#
# Chapter 06's model ends with a final LayerNorm (`ln_f`) and the language-modelling head, a linear layer
# from `d_model` numbers to `V` logits per position: `[B, T, V]` for B sequences of length T. One source
# works this through with 3,771 tokens, `d_model = 64`, a batch of 4 and a context of 16; here is an
# untrained model of that size. Training scores every position; generation needs only what comes
# *after* the sequence, the last position, `[B, V]`.

# %%
from transformer_course import GPT, GPTConfig

untrained = GPT(GPTConfig(vocab_size=3771, block_size=16, n_layer=2, n_head=4, d_model=64)).eval()
batch = torch.randint(0, 3771, (4, 16), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    logits, _ = untrained(batch)
last = logits[:, -1, :]  # only the last position predicts the token that comes next
print("logits:", tuple(logits.shape), "| last position:", tuple(last.shape))
print("top-level pieces:", [name for name, _ in untrained.named_children()])

# %% [markdown]
# Softmax turns a row of logits into probabilities, $p_i = e^{z_i} / \sum_j e^{z_j}$, all positive, summing
# to 1. **A correction to one source.** Source 2 applies "one final softmax" after the blocks, then the head,
# then "softmax again". There is one softmax, after the head; between the last block and the head sits a
# LayerNorm (`ln_f`, listed above). Source 3 calls that softmax's result `logits`: keep the names apart.
# **Logits** are unnormalised scores; **probabilities** are what softmax makes of them; every knob below
# acts on the logits.
#
# The simplest rule takes the most likely token every time: **greedy decoding** (source 3). Softmax keeps
# the order of its inputs, so greedy needs no softmax at all:

# %%
probs = torch.softmax(last, dim=-1)
print("rows sum to 1:", torch.allclose(probs.sum(-1), torch.ones(4)), "| all positive:", bool((probs > 0).all()))
print("greedy:", last.argmax(dim=-1), "| the same from the probabilities:", torch.equal(last.argmax(-1), probs.argmax(-1)))

# %% [markdown]
# Greedy is deterministic, handy for tests, but it never takes the second-best word (section 7 shows
# what that does to a trained model's text). Real systems *sample*.
#
# ## 2. Sampling from the distribution
#
# Sampling picks a token at random, weighted by its probability: source 2's token of probability 0.9 is
# chosen 90% of the time. `torch.multinomial` draws; every draw in this course takes an explicit, seeded
# `torch.Generator`, so the same seed gives the same draws and PyTorch's global random state is never
# touched. The 90% claim, with 100,000 draws:

# %%
p = torch.tensor([0.1, 0.9])
draws = [torch.multinomial(p, 100_000, replacement=True, generator=torch.Generator().manual_seed(s)) for s in (42, 42, 43)]
freq = torch.bincount(draws[0], minlength=2) / draws[0].numel()
print("frequencies:", freq, "| same seed, same draws:", torch.equal(draws[0], draws[1]),
      "| another seed, other draws:", not torch.equal(draws[0], draws[2]))
# the standard error of a frequency is sqrt(p(1-p)/n) ~ 0.00095; 4 of them is a generous bound
assert (freq - p).abs().max() < 4 * math.sqrt(0.9 * 0.1 / 100_000)

# %% [markdown]
# ## 3. Temperature
#
# Before the softmax we may divide the logits by a **temperature** $\tau > 0$:
#
# $$p_i(\tau) = \frac{e^{z_i/\tau}}{\sum_j e^{z_j/\tau}}.$$
#
# $\tau = 1$ leaves the distribution alone. $\tau < 1$ stretches the gaps between logits, so the
# favourite takes more of the mass (sharper, safer, more repetitive); $\tau > 1$ shrinks the gaps, so the
# distribution flattens towards uniform (more varied, more mistakes). As $\tau \to 0$ all mass goes to the
# largest logit: that limit is greedy decoding, which is why this chapter's functions read
# `temperature=0` as "greedy". Dividing by zero itself would give `inf - inf = nan`, so the code never
# does it.
#
# ### Your turn: a temperature that changes nothing
#
# Here is a first attempt at the formula. It runs, every row sums to 1, and it looks reasonable: take
# the probabilities, divide them by the temperature, and normalise again. Try it on five made-up logits
# at a low and a high temperature.

# %%
from transformer_course.checks.generation import (
    check_decode_with_cache,
    check_min_p_filter,
    check_predict_cached_work,
    check_probs_at_temperature,
    check_top_k_filter,
    check_top_p_filter,
)


def probs_at_temperature_with_a_bug(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Logits [..., V] -> probabilities [..., V] at a temperature (meant to follow the formula above)."""
    probs = torch.softmax(logits, dim=-1)
    scaled = probs / temperature
    return scaled / scaled.sum(dim=-1, keepdim=True)  # a distribution again


z = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
cold, hot = probs_at_temperature_with_a_bug(z, 0.25), probs_at_temperature_with_a_bug(z, 2.0)
print("rows sum to 1:", bool(torch.isclose(cold.sum(), torch.tensor(1.0))), bool(torch.isclose(hot.sum(), torch.tensor(1.0))))
print("the same distribution at temperature 0.25 and 2:", torch.allclose(cold, hot))

# %% [markdown]
# At a quarter and at twice the temperature it gives the same distribution: the knob is connected to
# nothing. Find why (compare with the formula: where does $\tau$ act?) and write the fixed version.
# It takes one row of logits `[V]` or a batch `[B, V]` and returns probabilities of the same shape.

# %%
# Your turn - Exercise 7.1 (★☆☆, debug): a temperature that changes nothing.
def probs_at_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Logits [..., V] and a temperature > 0 -> probabilities [..., V]: sharper below 1, flatter above."""
    ### BEGIN SOLUTION
    return torch.softmax(logits / temperature, dim=-1)
    ### END SOLUTION

# %%
probs_at_temperature = check_probs_at_temperature(probs_at_temperature).use

# %% [markdown]
# Dividing every probability by the same number changes none of their ratios, so normalising undoes it.
# The temperature has to act where it changes the *gaps*: on the logits, before the exponential. (Raising
# the probabilities to the power $1/\tau$ and normalising would have been right, since
# $(e^{z_i})^{1/\tau} = e^{z_i/\tau}$.) Here is one distribution over five tokens under four temperatures,
# through your `probs_at_temperature`:

# %%
temps = [0.25, 0.5, 1.0, 2.0]
fig, axes = plt.subplots(1, len(temps), figsize=(12, 2.6), sharey=True)
for ax, t in zip(axes, temps):
    ax.bar(range(5), probs_at_temperature(z, t).numpy(), color="tab:blue")
    ax.set_title(f"temperature {t}")
    ax.set_xticks(range(5), [f"tok{i}" for i in range(5)])
axes[0].set_ylabel("probability")
fig.suptitle("Temperature reshapes one distribution: low = sharp, high = flat", y=1.04)
plt.show()
print("top probability:", [round(float(probs_at_temperature(z, t).max()), 3) for t in temps])
assert all(probs_at_temperature(z, t).argmax() == z.argmax() for t in temps)

# %% [markdown]
# The order of the tokens never changes, only how far apart their probabilities are: temperature changes
# *which* sample you are likely to get, never which token greedy picks.
#
# The package checks every sampling setting before it uses it, with a message that names the fix (the
# shared checks of `transformer_course.arguments`):

# %%
#| export
def check_sampling(temperature, top_k, top_p) -> None:
    """Raise a ValueError naming the fix for a bad temperature, top_k or top_p."""
    real_number(temperature, "temperature", low=0, hint="0 means greedy decoding, below 1 sharper, above 1 flatter")
    whole_number(top_k, "top_k", none_ok=True, hint="the number of most likely tokens to keep")
    real_number(top_p, "top_p", low=0, low_open=True, high=1, none_ok=True, hint="1 or None keeps every token")


def _no_distribution(logits: torch.Tensor) -> torch.Tensor:
    """A bool scalar on the logits' device (no host sync): True when logits [B, V] hold no distribution, that
    is NaN, +inf, or a row with no finite value."""
    return (logits.isnan() | logits.isposinf()).any() | ~logits.isfinite().any(-1).all()


def _check_logits(logits: torch.Tensor | None = None, *, seen: torch.Tensor | None = None) -> None:
    """Refuse logits [B, V] that hold no distribution (or ``seen``, `_no_distribution` gathered over steps)."""
    if bool(_no_distribution(logits) if seen is None else seen):
        raise ValueError("the logits contain NaN or +inf, or a row that is all -inf: no distribution to draw "
                         "from; check the model's output")

# %% [markdown]
# ## 4. Top-k: keep only the k most likely tokens
#
# Even a well-trained model leaves a little probability on thousands of absurd tokens. One draw rarely
# hits them, but a long text makes many draws, and a single absurd token derails everything after it.
# **Top-k sampling** keeps the `k` largest logits, sets the others to $-\infty$ (so softmax gives them
# exactly 0) and samples from what is left.
#
# ### Your turn: top-k
#
# Write `top_k_filter(logits, k)`. It takes logits of any leading shape, one row `[V]` or a batch
# `[B, V]`, and returns a tensor of the same shape and dtype: in each row the `k` largest logits keep
# their values, every other entry becomes `-inf`. Worked numbers, for the five logits above:
#
# | logits | `[2.0, 1.0, 0.5, 0.0, -1.0]` |
# |---|---|
# | k = 2 | `[2.0, 1.0, -inf, -inf, -inf]` |
# | k = 4 | `[2.0, 1.0, 0.5, 0.0, -inf]` |
# | k = 9 (more than V) | all five, unchanged |
#
# Two traps. **Ties**: for `[1, 3, 2, 2, 2]` and k = 2, "keep every logit at least as large as the 2nd
# largest" keeps four tokens. Exactly `k` must survive (which of the tied 2s does not matter). So work
# with the *positions* of the k largest, which `torch.topk` returns, rather than with a threshold value.
# **-inf, not 0**: a removed token's logit must be minus infinity, so that softmax gives it probability
# exactly 0; a logit of 0 can still be a likely token. The first line of the function checks `k` (a whole
# number >= 1) and is not part of the exercise.

# %%
#| export
# Your turn - Exercise 7.2 (★★☆, build): top-k filtering.
def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the ``k`` largest logits of each row [..., V] (exactly k, even with ties; all when k > V); the rest
    become -inf."""
    whole_number(k, "k")
    ### BEGIN SOLUTION
    values, indices = torch.topk(logits, min(k, logits.size(-1)), dim=-1)
    return torch.full_like(logits, float("-inf")).scatter(-1, indices, values)
    ### END SOLUTION

# %%
top_k_filter = check_top_k_filter(top_k_filter).use

# %%
print(top_k_filter(z, 2), torch.softmax(top_k_filter(z, 2), -1))
kept = torch.isfinite(top_k_filter(torch.tensor([[1.0, 3.0, 2.0, 2.0, 2.0]]), 2)).sum().item()
print("with ties at the 2nd place, tokens kept:", kept)
assert kept == 2

# %% [markdown]
# ## 5. Top-p (nucleus): keep the smallest set that holds mass p
#
# A fixed `k` suits some distributions and not others. When the model is sure (one token holds 95%),
# `k = 40` still lets 39 poor choices in; when it is unsure (the mass spread over 200 plausible words),
# `k = 40` cuts good ones. **Top-p** (Holtzman et al., 2019, "The Curious Case of Neural Text
# Degeneration") adapts: sort the tokens by probability and keep the smallest prefix whose total
# probability reaches `p`.
#
# The rule, in words: a token stays when the probability mass *before* it (in sorted order) is still
# below `p`. That always keeps the most likely token (nothing comes before it), and it keeps the token
# that carries the running total across `p`, so the kept mass is at least `p`. A worked row, already
# sorted, with p = 0.6:
#
# | sorted probabilities | 0.40 | 0.30 | 0.20 | 0.10 |
# |---|---|---|---|---|
# | mass before the token | 0.00 | 0.40 | 0.70 | 0.90 |
# | kept (mass before < 0.6)? | yes | yes | no | no |
#
# The two kept tokens hold 0.7 >= 0.6, and the first alone (0.4) would not be enough. Comparing the
# running total *including* each token with `p` instead looks almost the same, but it drops the token
# that crosses `p`; when the top token alone holds more than `p`, nothing at all is left to sample.
#
# ### Your turn: top-p
#
# Write `top_p_filter(logits, p)`: logits `[V]` or `[B, V]` in, the same shape out, every token outside
# its row's nucleus at `-inf`, the others unchanged. The logits arrive in vocabulary order, not sorted:
# sort each row's probabilities largest first, decide there, and put the decision back in vocabulary
# order (`torch.sort` returns the permutation it applied). Two details keep it close to exact: sum the
# running total in float64, which makes it unlikely (not impossible) that rounding reaches `p` a token too
# early; and treat `p = 1` as the whole distribution, nothing to drop (a long tail of tiny probabilities
# can make even a float64 running total round to 1 before the tail ends). The first line checks `p` and
# is not part of the exercise.

# %%
#| export
# Your turn - Exercise 7.3 (★★☆, build): top-p (nucleus) filtering.
def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep, in each row [..., V], the fewest most likely tokens whose probability reaches ``p``; the rest become
    -inf. The most likely token always survives; ``p = 1`` keeps every token."""
    real_number(p, "p", low=0, low_open=True, high=1, hint="the probability mass to keep")
    ### BEGIN SOLUTION
    if p >= 1.0:  # nothing to drop (and no rounding to drop a tail by accident)
        return logits.clone()
    sorted_probs, order = torch.softmax(logits.double(), dim=-1).sort(dim=-1, descending=True)
    drop_sorted = sorted_probs.cumsum(dim=-1) - sorted_probs >= p  # the mass BEFORE each token reaches p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))
    ### END SOLUTION

# %%
top_p_filter = check_top_p_filter(top_p_filter).use

# %%
p5 = torch.softmax(z, -1)
print("probabilities, sorted:", p5.sort(descending=True).values)
for top_p in (0.3, 0.6, 0.8, 0.95, 1.0):
    keep = torch.isfinite(top_p_filter(z, top_p))
    print(f"p={top_p:<4}: keeps {int(keep.sum())} tokens holding {float(p5[keep].sum()):.4f}")
    assert p5[keep].sum() >= top_p - 1e-6 > p5[keep].sum() - p5[keep].min()  # reaches p; one token fewer would not

# %% [markdown]
# ## 6. One sampling step
#
# The three knobs combine in a fixed order, the one Hugging Face's `generate` uses too: divide by the
# temperature, keep the top k, then keep the nucleus of what remains, then softmax and draw. Greedy
# (`temperature=0`) skips all of it: the argmax is always inside the top k and inside the nucleus. Both
# refuse logits that hold no distribution (NaN, say, from a model that diverged) instead of returning
# some token, and a draw needs a generator: none is taken from PyTorch's global state.

# %%
#| export
def next_token_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                     top_p: float | None = None) -> torch.Tensor:
    """The distribution of the next token: logits [B, V] -> probabilities [B, V] (one-hot at the argmax when
    ``temperature=0``)."""
    check_sampling(temperature, top_k, top_p)
    _check_logits(logits)
    return _probs(logits, temperature, top_k, top_p, check=True)


def _probs(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None,
           check: bool = False) -> torch.Tensor:
    """`next_token_probs` for settings and logits the caller has checked; ``check``: refuse an overflow."""
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.size(-1)).to(logits.dtype)
    logits = logits.float() / temperature
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    probs = torch.softmax(logits, dim=-1)
    if check and not bool(probs.isfinite().all()):  # logits / temperature overflowed
        raise ValueError(f"temperature {temperature} is too small for these logits: use 0 for greedy")
    return probs


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Logits [B, V] -> the next token of every row, LongTensor [B]: the argmax when ``temperature=0``, else a
    draw from ``next_token_probs`` with ``generator`` (required)."""
    probs = next_token_probs(logits, temperature, top_k, top_p)
    if temperature == 0:
        return probs.argmax(dim=-1)  # the one-hot's 1 sits at the logits' argmax
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"sampling needs a generator, got {generator!r}: pass generator=torch.Generator()"
                         ".manual_seed(seed), or temperature=0 for greedy decoding")
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _draw(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None,
          generator: torch.Generator, *, first: bool = False) -> torch.Tensor:
    """`sample_next` for settings the caller has checked, and logits it checks itself; ``first``: check the
    probabilities too (a host sync), as the first token of a generation does."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = _probs(logits, temperature, top_k, top_p, check=first)
    try:
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    except RuntimeError:  # NaN or inf reached the draw (on the CPU): say why in the package's words
        _check_logits(logits)
        _probs(logits, temperature, top_k, top_p, check=True)
        raise

# %% [markdown]
# Does `sample_next` draw each token as often as its probability says? 200,000 draws from one row with
# top-k and top-p switched on; the expected frequency of each token is its filtered probability, and the
# largest gap should stay within about four standard errors, $4\sqrt{p(1-p)/n} \le 0.0045$.

# %%
row = torch.tensor([[1.5, 0.2, 1.0, -0.5, 0.8, -2.0, 0.0, 0.3]])
settings = dict(temperature=0.8, top_k=6, top_p=0.9)
target = next_token_probs(row, **settings)[0]
n = 200_000
counts = torch.bincount(sample_next(row.expand(n, -1), **settings, generator=torch.Generator().manual_seed(123)), minlength=8)
freq, tolerance = counts / n, 4 * math.sqrt(0.25 / n)
print("target   :", target)
print("observed :", freq)
print(f"largest gap below {tolerance:.4f}: {bool((freq - target).abs().max() < tolerance)}; "
      f"filtered-out tokens drawn: {int(counts[target == 0].sum())}")
assert (freq - target).abs().max() < tolerance and counts[target == 0].sum() == 0

# %% [markdown]
# ## 7. A model and the autoregressive loop
#
# Sampling needs a trained model. The package ships chapter 06's character-level GPT, trained once with
# chapter 06's recipe; `load_course_model` checks the file against the SHA-256 in its manifest and loads
# it with `load_checkpoint` (model, tokenizer, history). A file, unlike a new training run, is the same
# model on every machine; a checkpoint of your own works as well (section 12).

# %%
from transformer_course import load_shakespeare
from transformer_course.course_model import load_course_model, manifest

course = load_course_model()
model, tok, cfg = course.model, course.tokenizer, course.config
text_sample = load_shakespeare(["tragedies/romeo-and-juliet"])  # the cache demo takes text from here
print(f"{model.num_parameters():,} parameters: {cfg.n_layer} blocks, {cfg.n_head} heads, C = {cfg.d_model}, "
      f"context {cfg.block_size}, vocabulary of {tok.vocab_size} characters")
print(f"trained {course.step:,} steps on {manifest()['built']['cpu']}: "
      f"validation loss {course.history.val_loss[0]:.2f} -> {course.history.val_loss[-1]:.2f}")

# %% [markdown]
# Source 4 describes generation as a loop: run the model, take the next token's distribution, sample,
# append, run again. Text goes in through `encode_prompt`, a string to ids `[1, T]`, which refuses what
# the model could not read (an empty prompt, unknown characters) with a message that names the problem.

# %%
#| export
def encode_prompt(tokenizer, text: str, device=None) -> torch.Tensor:
    """A text prompt -> LongTensor [1, T]; refused when empty or, for a character tokenizer, with unknown characters."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"the prompt is empty or not a str ({text!r}): give at least one character (a newline works)")
    known = getattr(tokenizer, "chars", None)
    if known is not None and (unknown := sorted(set(text) - set(known))):
        raise ValueError(f"the prompt has characters the tokenizer does not know: {''.join(unknown)!r}; remove or "
                         f"replace them (it knows {''.join(known)!r})")
    return torch.tensor([tokenizer.encode(text)], dtype=torch.long, device=device)

# %% [markdown]
# A first loop is a few lines. Learned positions stop at `block_size - 1` (a longer input is an error),
# so the loop keeps the last `block_size` tokens: the window slides and the text can grow without limit.

# %%
def naive_generate(model, idx, max_new_tokens, generator=None, **knobs):
    """Scaffold: idx [B, T] -> [B, T + max_new_tokens], recomputing everything at every step.

    knobs: temperature, top_k, top_p, as sample_next takes them."""
    for _ in range(max_new_tokens):
        logits, _ = model(idx[:, -model.cfg.block_size:])  # [B, T, V], T <= block_size
        nxt = sample_next(logits[:, -1, :], generator=generator, **knobs)  # [B]
        idx = torch.cat([idx, nxt[:, None]], dim=1)  # feed the sample back
    return idx


prompt = encode_prompt(tok, "ROMEO:\n")  # [1, 7]
with torch.no_grad():
    print(tok.decode(naive_generate(model, prompt, 120, temperature=0)[0].tolist()))

# %% [markdown]
# Greedy soon repeats itself: once a phrase is its own most likely continuation, nothing breaks the
# cycle. Sampling at temperature 1, and at 0.8 with your top-k and top-p filters (through `sample_next`):

# %%
for knobs in (dict(temperature=1.0), dict(temperature=0.8, top_k=20, top_p=0.9)):
    with torch.no_grad():
        out = naive_generate(model, prompt, 120, generator=torch.Generator().manual_seed(1), **knobs)
    print(f"--- {', '.join(f'{k} {v}' for k, v in knobs.items())}\n{tok.decode(out[0].tolist())}")

# %% [markdown]
# Source 4 worries that $P(\text{next} \mid \text{the cat sat on})$ differs depending on whether "on" was
# typed or sampled. That holds for the encoder-decoder it describes, where prompt and output go through
# different stacks (chapter 09). In a **decoder-only** GPT both go through the same stack, so the model
# cannot tell them apart, and typing in generated text must give exactly the same continuation:

# %%
with torch.no_grad():
    full = naive_generate(model, prompt, 30, temperature=0)  # prompt + 30 greedy tokens
    half = naive_generate(model, full[:, : prompt.size(1) + 15], 15, temperature=0)  # 15 of them typed in
print(repr(tok.decode(full[0].tolist())), "| same continuation:", torch.equal(full, half))
assert torch.equal(full, half)

# %% [markdown]
# ## 8. The KV cache
#
# At step $t$ the loop runs the whole window through every layer, although it uses only the last
# position's output and every other position was already computed at step $t-1$. With a causal mask a
# position's keys and values depend only on the tokens up to it, so appending a token cannot change them.
# A forward pre-hook that counts the positions fed to the model shows the waste:

# %%
def positions_fed(fn) -> list[int]:
    """Run fn() and list the number of token positions fed to `model` in each forward pass."""
    seen = []
    handle = model.register_forward_pre_hook(lambda mod, args: seen.append(args[0].shape[1]))
    try:
        fn()
    finally:
        handle.remove()
    return seen

T0, n_new = prompt.size(1), 40
with torch.no_grad():
    work_naive = positions_fed(lambda: naive_generate(model, prompt, n_new, temperature=0))
print(f"prompt of {T0}, {n_new} new tokens: {sum(work_naive)} positions in {len(work_naive)} forward passes")
assert work_naive == [min(T0 + i, cfg.block_size) for i in range(n_new)]  # the whole window, every pass

# %% [markdown]
# That is quadratic in the length of the text (until the window is full). A **KV cache** keeps each
# layer's keys and values of the positions already processed (chapter 04 built it into
# `MultiHeadAttention(x, cache=...)`). The loop becomes: **prefill**, the whole prompt once with an empty
# cache, whose last logits give the first new token; then **decode**, feeding only the newest token, whose
# query attends to the cached keys and whose key and value are appended.
#
# The model offers `model.new_cache()` (one empty `KVCache` per layer; `cache[0].length` positions held)
# and `model(x, cache=cache, last_only=True)`: new tokens `x` `[B, T_new]` take positions from
# `cache[0].length` on, their keys and values join every layer's cache, and the logits come back for the
# last new position only, `[B, 1, V]`.
#
# ### Your turn: predict the work
#
# With the cache, how many forward passes generate 40 new tokens after our 7-token prompt `"ROMEO:\n"`,
# and how many positions do they feed the model in all? (Without it, over a thousand positions.)

# %%
# Your turn - Exercise 7.4 (★☆☆, predict): the work of a cached generation.
def my_prediction() -> tuple[int, int]:
    """A 7-token prompt, 40 new tokens, with a KV cache: (forward passes, positions fed in all)."""
    ### BEGIN SOLUTION
    return (40, 46)
    ### END SOLUTION


check_predict_cached_work(my_prediction)

# %% [markdown]
# ### Your turn: the cached generation loop
#
# `decode_with_cache(model, window, n, choose)` generates `n` tokens after `window` `[B, T]` and
# **yields** each step's tokens, a LongTensor `[B]`, as soon as they are chosen (`yield` inside the loop,
# so `stream` can pass each token on before the next is computed). `choose` takes the last position's
# logits `[B, V]` and returns the tokens `[B]` (argmax, a draw, any rule); what it returns is what you
# yield and feed back.
#
# - a fresh `model.new_cache()`; the first pass feeds the whole window (the prefill);
# - every later pass feeds only the token chosen last, `[B, 1]`, with the same cache;
# - one pass and one `choose` per new token (a sampling rule draws at each call), no pass after the last;
# - `T + n - 1 <= block_size` and `torch.no_grad()` are the caller's business.
#
# The check compares your loop with the plain one on a small random model, with a greedy `choose` and one
# that picks the second most likely token, and counts the positions fed. Once it passes, `generate` and
# `stream` run your loop for the rest of the chapter.

# %%
#| export
# Your turn - Exercise 7.5 (★★★, build): the cached generation loop.
def decode_with_cache(model, window: torch.Tensor, n: int, choose) -> Iterator[torch.Tensor]:
    """Yield ``n`` tokens after ``window`` [B, T], a LongTensor [B] per step, with a KV cache: the first pass feeds
    the window (prefill), each later pass the token chosen last [B, 1]. ``choose(logits [B, V]) -> [B]`` picks
    from the last position's logits. Needs T + n - 1 <= block_size."""
    ### BEGIN SOLUTION
    cache = model.new_cache()
    new = window  # what the cache has not seen yet: the whole window at first
    for _ in range(n):
        logits, _ = model(new, cache=cache, last_only=True)  # [B, 1, V]
        nxt = choose(logits[:, -1, :])  # [B]
        yield nxt
        new = nxt[:, None]  # [B, 1]: the next pass feeds only this token
    ### END SOLUTION

# %%
decode_with_cache = check_decode_with_cache(decode_with_cache).use

# %% [markdown]
# The work of 40 tokens, the numbers of your prediction: the prefill, then one position per pass.

# %%
def greedy(logits):
    """choose by argmax: logits [B, V] -> [B]."""
    return logits.argmax(-1)


with torch.no_grad():
    work_cached = positions_fed(lambda: list(decode_with_cache(model, prompt, n_new, greedy)))
print(f"{n_new} new tokens with the cache: {sum(work_cached)} positions in {len(work_cached)} forward passes "
      f"(without it: {sum(work_naive)} positions); per pass: {work_cached[:5]} ...")
assert work_cached == [T0] + [1] * (n_new - 1)

# %% [markdown]
# Keys and values are `[B, n_head, L, head_size]` per layer, so the cache holds
# $2 \times n_\text{layer} \times B \times L \times d_\text{model} \times 4$ bytes in float32. It grows
# with the text; for big models and long contexts it dominates the memory of serving them.

# %%
cache = model.new_cache()
with torch.no_grad():
    model(prompt, cache=cache)  # a prefill of the prompt fills the cache
L = cache[0].length
formula, measured = 2 * cfg.n_layer * 1 * L * cfg.d_model * 4, sum(layer.nbytes for layer in cache)
print(f"{L} positions: formula {formula} bytes, measured {measured} bytes")
assert formula == measured
print(f"a full window of {cfg.block_size} positions: {2 * cfg.n_layer * cfg.block_size * cfg.d_model * 4 / 1024:.0f} KiB per sequence")

# %% [markdown]
# ### Why the cache cannot simply roll past `block_size`
#
# Past `block_size` the window slides a token per step. Dropping the oldest cache entry is tempting and
# wrong with absolute positions: every token moves one position earlier, so its embedding, and its keys
# and values, change; deeper layers' keys also saw the dropped token. The same tokens' keys in two
# overlapping windows:

# %%
text_ids = encode_prompt(tok, text_sample[: cfg.block_size + 1])  # block_size + 1 real characters
caches = {}
with torch.no_grad():
    for name, window in (("first", text_ids[:, :-1]), ("slid", text_ids[:, 1:])):
        caches[name] = model.new_cache()
        model(window, cache=caches[name])
for layer in (0, cfg.n_layer - 1):
    moved = (caches["first"][layer].k[:, :, 1:] - caches["slid"][layer].k[:, :, :-1]).abs().max()  # same tokens
    print(f"layer {layer}: the shared tokens' keys moved by more than 0.1: {bool(moved > 0.1)}")

# %% [markdown]
# Every shared key moved: a rolled cache would feed the model stale numbers. The exact fix is to
# **rebuild** the cache (one prefill of the cropped window) whenever the window moves, which saves nothing
# if it slides every step. So `generate` takes a keyword `crop_to`: when the context outgrows
# `block_size`, keep its last `crop_to` tokens (default `block_size`); a smaller value rebuilds once every
# `block_size - crop_to + 1` steps, at the price of a shorter context after each crop. Cached and uncached
# paths crop alike, so they agree. (With *relative* positions, such as rotary ones, models drop old entries
# cheaply and accept that deeper keys still remember the dropped tokens.)
#
# Now the package's loop, around yours. It crops the window when it outgrows `block_size` and hands each
# window to your `decode_with_cache` until it is full (`block_size - T_w + 1` tokens from `T_w`);
# `use_cache=False` runs the whole window every step. Its `choose` samples with the knobs and pads a row
# that has produced `eos_id` with `eos_id`. It trusts the knobs, which `stream` checked once: logits with
# no distribution (NaN from a diverged model) are refused at the first token, and at later tokens noted
# on the device and refused once at the end, so no step waits for the GPU to answer a check. Dropout is off (eval mode), and `@torch.no_grad()` on a
# generator turns autograd off only while a step runs, not while your code between two tokens does.

# %%
#| export
@torch.no_grad()
def _steps(model, window, max_new_tokens, knobs, use_cache, generator, eos_id, crop_to,
           never=None) -> Iterator[torch.Tensor]:
    """The loop behind ``stream``: yields LongTensor [B] once per new token; ids where ``never`` [V] is True
    are never sampled. ``window`` [B, T_w], what the model sees, starts as the prompt."""
    block, made, bad = model.cfg.block_size, 0, None  # bad: some step's logits held no distribution
    finished = torch.zeros(window.size(0), dtype=torch.bool, device=window.device)

    def choose(logits: torch.Tensor) -> torch.Tensor:
        nonlocal finished, bad  # logits [B, V] -> tokens [B]; finished rows get eos_id
        if never is not None:
            logits = logits.masked_fill(never, float("-inf"))
        first = bad is None
        if first:  # the first token: refuse logits without a distribution now (one host sync)
            _check_logits(logits)
            bad = torch.zeros((), dtype=torch.bool, device=logits.device)
        else:  # later tokens: remembered on the device, refused once at the end
            bad = bad | _no_distribution(logits)
        nxt = _draw(logits, *knobs, generator, first=first)
        if eos_id is not None:
            nxt = nxt.masked_fill(finished, eos_id)
            finished = finished | (nxt == eos_id)
        return nxt

    was_training, embed = model.training, getattr(model, "embed", None)
    checked = getattr(embed, "checks_input", None)
    model.eval()  # dropout off: the same settings and seed must give the same text
    if checked is not None:  # stream checked the prompt, and every id drawn is in the vocabulary
        embed.checks_input = False
    try:
        while made < max_new_tokens:
            if window.size(1) > block:  # crop: every position shifts
                window = window[:, -crop_to:]
            if use_cache:  # a fresh cache per window, then one token per pass until it is full
                steps = decode_with_cache(model, window, min(max_new_tokens - made, block - window.size(1) + 1), choose)
            else:  # the whole window again
                steps = [choose(model(window, last_only=True)[0][:, -1, :])]
            for nxt in steps:
                window, made = torch.cat([window, nxt[:, None]], dim=1), made + 1
                yield nxt
                if eos_id is not None and bool(finished.all()):
                    made = max_new_tokens  # every row has ended
                    break
        if bad is not None:
            _check_logits(seen=bad)
    finally:
        model.train(was_training)
        if checked is not None:
            embed.checks_input = checked

# %% [markdown]
# The two entry points: `stream` yields one token per row and step, `generate` collects them. `stream`
# checks the request before any work starts, so a mistake gets a message that names it rather than an
# error from deep inside the model. Without a `generator` it makes a fresh one seeded with 0: the same
# text every call; pass your own for others. `allowed=tokenizer` keeps the draw to ids the tokenizer can
# decode: a model's vocabulary can be larger than its tokenizer's, and a BPE's special tokens can leave ids
# unused (`cl100k_base` leaves 16), rows the model was never trained to avoid.

# %%
#| export
def _never_sampled(allowed, vocab: int, device) -> torch.Tensor | None:
    """``stream``'s ``allowed`` (a tokenizer, the ids it can decode, or None) -> bool [V], True where an id
    must never be sampled: ids past the tokenizer, and ids a BPE's special tokens leave unused."""
    if allowed is None:
        return None
    if hasattr(allowed, "vocab_size"):  # a tokenizer: a BPETokenizer decodes its vocab and its specials
        table, specials = getattr(allowed, "vocab", None), getattr(allowed, "special_tokens", None)
        ok = isinstance(table, dict) and isinstance(specials, dict)
        allowed = [*table, *specials.values()] if ok else range(allowed.vocab_size)
    ids = [whole_number(i, "an allowed token id", low=0) for i in allowed]
    never = torch.ones(vocab, dtype=torch.bool)
    never[[i for i in ids if i < vocab]] = False
    if bool(never.all()):
        raise ValueError(f"none of the allowed ids is in the model's vocabulary 0..{vocab - 1}: "
                         "is this the model's tokenizer?")
    return never.to(device)


def stream(model, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
           top_p: float | None = None, use_cache: bool = True, generator: torch.Generator | None = None,
           eos_id: int | None = None, *, crop_to: int | None = None, allowed=None) -> Iterator[torch.Tensor]:
    """Yield the next token of every prompt in idx [B, T], a LongTensor [B] per step, until ``max_new_tokens``
    or until every row has produced ``eos_id`` (finished rows are padded with it). A context longer than
    block_size is cropped to its last ``crop_to`` tokens. ``use_cache`` changes the cost, never the tokens;
    ``generator=None`` means a fresh one seeded with 0. ``allowed`` (the tokenizer, or the ids it can decode):
    no other id is ever sampled (its logit is -inf), so every token decodes."""
    check_sampling(temperature, top_k, top_p)
    if not isinstance(idx, torch.Tensor) or idx.dtype != torch.long or idx.dim() != 2:
        raise ValueError(f"idx must be a LongTensor of token ids, 2-D [B, T], got {type(idx).__name__} "
                         f"{tuple(getattr(idx, 'shape', ()))}: use torch.tensor([ids]), or idx[None] for one prompt")
    if idx.numel() == 0:
        raise ValueError(f"the prompt is empty (idx has shape {tuple(idx.shape)}): give at least one token")
    vocab, block = model.cfg.vocab_size, model.cfg.block_size
    if (bad := idx[(idx < 0) | (idx >= vocab)]).numel():
        raise ValueError(f"token id {int(bad[0])} is outside the model's vocabulary 0..{vocab - 1}: encode the "
                         "prompt with the model's tokenizer")
    weights = next(model.parameters(), None)
    if weights is not None and weights.device != idx.device:  # e.g. a model `train` left on a GPU
        raise ValueError(f"the prompt is on {idx.device} but the model on {weights.device}: move the prompt "
                         f"there, idx.to({str(weights.device)!r})")
    whole_number(max_new_tokens, "max_new_tokens", low=0)
    flag(use_cache, "use_cache")
    if generator is None:
        generator = torch.Generator(idx.device).manual_seed(0)
    elif not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {generator!r}: pass "
                         "torch.Generator().manual_seed(seed)")
    elif generator.device.type != idx.device.type:
        raise ValueError(f"the generator draws on {generator.device.type} but the prompt is on {idx.device}: "
                         f"make it there, torch.Generator({idx.device.type!r}).manual_seed(seed)")
    whole_number(eos_id, "eos_id", low=0, high=vocab - 1, none_ok=True)
    crop_to = whole_number(block if crop_to is None else crop_to, "crop_to", high=block,
                           hint=f"the tokens kept when the context outgrows block_size={block}")
    return _steps(model, idx, max_new_tokens, (temperature, top_k, top_p), use_cache, generator, eos_id, crop_to,
                  _never_sampled(allowed, vocab, idx.device))

# %%
#| export
def generate(model, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, use_cache: bool = True, generator: torch.Generator | None = None,
             eos_id: int | None = None, *, crop_to: int | None = None, allowed=None) -> torch.Tensor:
    """Continue the prompts idx [B, T]: LongTensor [B, T + new], new <= max_new_tokens (``stream``'s tokens;
    ``allowed``: the tokenizer, so that only ids it can decode are sampled)."""
    steps = stream(model, idx, max_new_tokens, temperature, top_k, top_p, use_cache, generator, eos_id,
                   crop_to=crop_to, allowed=allowed)
    return torch.cat([idx, *(step[:, None] for step in steps)], dim=1)

# %% [markdown]
# ### The cache changes nothing
#
# With and without the cache, greedy and seeded sampling must give identical tokens, far past
# `block_size` and with `crop_to` too. Each run gets a generator with the same seed, so both paths draw
# the same random numbers, and a difference in the logits that mattered would show as another token.

# %%
n_long = 3 * cfg.block_size  # well past block_size
runs = {
    "greedy": dict(temperature=0),
    "T=1.0": dict(temperature=1.0),
    "T=0.8, top-k 10": dict(temperature=0.8, top_k=10),
    "T=1.0, top-p 0.9, crop_to 48": dict(temperature=1.0, top_p=0.9, crop_to=48),
}
for name, kw in runs.items():
    outs = [generate(model, prompt, n_long, use_cache=c, generator=torch.Generator().manual_seed(5), **kw)
            for c in (True, False)]
    print(f"{name:<30} {outs[0].shape[1]} tokens, identical: {torch.equal(*outs)}")
    assert torch.equal(*outs)
assert positions_fed(lambda: generate(model, prompt, n_new, temperature=0)) == work_cached  # generate runs your loop

# %% [markdown]
# For a model this small the cache saves more work than time: a step costs mostly fixed overhead (Python,
# a few dozen small operations), not arithmetic. The time is measured in the optional appendix 90 and by
# `benchmarks/bench_generation.py`.

# %% [markdown]
# ## 9. Several prompts at once, end tokens, streaming
#
# `generate` takes a batch `[B, T]`: B prompts of the same length, one forward pass per step for all
# (different lengths would need padding and a padding mask). Source 4 mentions the usual ending, a special
# **end token**; our characters have none, but a newline can play the part. With `eos_id` a row is
# finished once it produces it, is padded with it from then on, and generation stops when every row is
# finished. Three prompts, one line of verse each; and greedy rows equal single runs:

# %%
prompts = ["ROMEO:\n", "NURSE:\n", "PETER:\n"]  # one batch: prompts of the same length
batch_ids = torch.tensor([tok.encode(p) for p in prompts])  # [3, 7]
newline = tok.encode("\n")[0]
lines = generate(model, batch_ids, 200, temperature=0.9, eos_id=newline, generator=torch.Generator().manual_seed(3))
print(f"shape {tuple(lines.shape)}: stopped after {lines.shape[1] - T0} of at most 200 new tokens")
for row in lines[:, T0:].tolist():
    print(repr(tok.decode(row[: row.index(newline)] if newline in row else row)))
together = generate(model, batch_ids, 60, temperature=0)
alone = [generate(model, batch_ids[i : i + 1], 60, temperature=0) for i in range(len(prompts))]
print("greedy batch rows equal single runs:", all(torch.equal(together[i : i + 1], a) for i, a in enumerate(alone)))

# %% [markdown]
# `stream` yields each step's tokens as soon as they exist, which is how chat interfaces print a reply
# while it is written. Decoding them one at a time needs one more idea: a byte-level BPE tokenizer
# (chapter 01) can split a character's UTF-8 bytes across two tokens, and half a character is not text.
# A BPE tokenizer without merges shows it: every byte is a token, and "é" is two bytes.
#
# `decode_stream(tokenizer, ids)` emits only whole characters: an unfinished character's bytes wait for
# the token that completes it (Python's incremental UTF-8 decoder keeps them), so the pieces join to
# exactly what `decode` gives for all the ids at once.

# %%
#| export
def decode_stream(tokenizer, ids: Iterable[int]) -> Iterator[str]:
    """Token ids, as they come -> one str per id (and a last one if the text ends inside a character), of whole
    characters, joining to ``tokenizer.decode(ids)``: a byte-level token's bytes wait for the rest of theirs."""
    to_bytes = getattr(tokenizer, "decode_bytes", None)
    if to_bytes is None:
        yield from (tokenizer.decode([int(i)]) for i in ids)
        return
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")  # holds an unfinished character's bytes
    for i in ids:
        yield utf8.decode(to_bytes([int(i)]))
    if tail := utf8.decode(b"", final=True):
        yield tail

# %%
from transformer_course.tokenization import BPETokenizer

bytes_tok = BPETokenizer.train("café crème", 256)  # no merges: one token per byte
ids = bytes_tok.encode("café crème")
print(f"{len('café crème')} characters, {len(ids)} tokens")
print("each token decoded alone:", repr("".join(bytes_tok.decode([i]) for i in ids)))
print("decode_stream's pieces  :", list(decode_stream(bytes_tok, ids)))
assert "".join(decode_stream(bytes_tok, ids)) == bytes_tok.decode(ids) == "café crème"

# %% [markdown]
# The same with the model, printed piece by piece as `stream` yields each token (its arguments are
# checked when you call it, not at the first token):

# %%
steps = stream(model, prompt, 80, temperature=0.8, generator=torch.Generator().manual_seed(11))
pieces = []
for piece in decode_stream(tok, (int(step[0]) for step in steps)):
    pieces.append(piece)
    print(piece, end="", flush=True)
print()
same = generate(model, prompt, 80, temperature=0.8, generator=torch.Generator().manual_seed(11))
assert "".join(pieces) == tok.decode(same[0, prompt.size(1):].tolist())

# %% [markdown]
# ## 10. A knob of your own: min-p
#
# Top-k keeps a fixed number of tokens and top-p a fixed share of the mass. **Min-p** sampling (Nguyen
# et al., 2024, "Turning Up the Heat: Min-p Sampling for Creative and Coherent LLM Outputs") sets the bar
# relative to the favourite instead: keep every token whose probability is at least `min_p` times the
# most likely token's probability. When the model is sure, the bar is high and few tokens pass; when it
# hesitates, the bar drops and many do. Its authors' point is that this holds up at high temperatures,
# where a flattened distribution lets top-p's nucleus fill with poor tokens.
#
# Worked numbers, with `min_p = 0.2`:
#
# | probabilities | top probability | bar (0.2 x top) | kept |
# |---|---|---|---|
# | `[0.60, 0.25, 0.10, 0.05]` | 0.60 | 0.12 | the first two |
# | `[0.30, 0.25, 0.20, 0.15, 0.10]` | 0.30 | 0.06 | all five |
#
# ### Your turn: min-p
#
# Write `min_p_filter(logits, min_p)`: logits `[V]` or `[B, V]` in, the same shape out; in each row,
# every token whose probability is below `min_p` times that row's top probability becomes `-inf`, the
# others keep their logits. A token exactly at the bar stays, so `min_p = 1` keeps the tokens tied for the
# top, and `min_p = 0` keeps everything. The package has no min-p: the check compares yours with a
# reference of its own.

# %%
# Your turn - Exercise 7.6 (★★☆, extend): min-p filtering.
def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Logits [..., V] -> the same logits, with every token whose probability is below ``min_p`` times its
    row's top probability set to -inf (0 <= min_p <= 1)."""
    ### BEGIN SOLUTION
    probs = torch.softmax(logits.float(), dim=-1)
    bar = min_p * probs.amax(dim=-1, keepdim=True)  # [..., 1]: one bar per row
    return logits.masked_fill(probs < bar, float("-inf"))
    ### END SOLUTION

# %%
min_p_filter = check_min_p_filter(min_p_filter).use

# %% [markdown]
# On a confident and a hesitant row of made-up logits, against top-p 0.9: top-p keeps a second token
# where the model is sure, and drops a plausible one where it is not; min-p 0.1 does the opposite.

# %%
rows = {"confident": torch.tensor([5.0, 2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0]),
        "hesitant": torch.tensor([1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3])}
for name, row in rows.items():
    by_p, by_min_p = torch.isfinite(top_p_filter(row, 0.9)).sum(), torch.isfinite(min_p_filter(row, 0.1)).sum()
    print(f"{name:<9}: top-p 0.9 keeps {int(by_p)} of 8, min-p 0.1 keeps {int(by_min_p)} of 8")

# %% [markdown]
# ## 11. Playground
#
# Type a prompt, set the knobs, press **Generate**. Below the text, the bars show the likeliest next
# characters after the prompt *under the same knobs* (they reshape the bars as they reshape the
# sampling). Top-k 0 means "off".

# %%
import ipywidgets as widgets


def show_generation(prompt_text, temperature=0.8, top_k=0, top_p=1.0, seed=0, length=150):
    """Print a continuation of prompt_text and draw the 10 likeliest next characters under the same knobs;
    returns them as [(character, probability), ...]."""
    knobs = dict(temperature=temperature, top_k=top_k or None, top_p=top_p)
    try:
        idx = encode_prompt(tok, prompt_text)
        print(tok.decode(generate(model, idx, length, generator=torch.Generator().manual_seed(seed), **knobs)[0].tolist()))
    except ValueError as e:
        return print(e)
    with torch.no_grad():
        top = next_token_probs(model(idx[:, -cfg.block_size:], last_only=True)[0][:, -1], **knobs)[0].topk(10)
    labels = [{"\n": "\\n", " ": "space"}.get(c, c) for c in map(tok.decode, ([i] for i in top.indices.tolist()))]
    ax = plt.figure(figsize=(7, 2.2)).gca()
    ax.bar(labels, top.values.numpy())
    ax.set(title="the likeliest next characters after the prompt", xlabel="next character", ylabel="probability")
    plt.show()
    return list(zip(labels, [round(v, 4) for v in top.values.tolist()], strict=True))

# %%
controls = dict(prompt_text=widgets.Textarea("ROMEO:\n", description="prompt"),
                temperature=widgets.FloatSlider(0.8, min=0, max=2, step=0.05, description="temperature"),
                top_k=widgets.IntSlider(0, min=0, max=tok.vocab_size, description="top-k (0=off)"),
                top_p=widgets.FloatSlider(1.0, min=0.05, max=1, step=0.05, description="top-p"),
                seed=widgets.IntText(0, description="seed"))
button, shown = widgets.Button(description="Generate", button_style="primary"), widgets.Output()


def on_click(_):
    """Redraw into the widget's Output (only here, never while the cell runs)."""
    with shown:
        shown.clear_output(wait=True)
        show_generation(**{name: control.value for name, control in controls.items()})


button.on_click(on_click)
display(widgets.VBox([*controls.values(), button, shown]))
print(show_generation("ROMEO:\n"))  # the starting settings, stored with the notebook

# %% [markdown]
# ## 12. Bad input, and the command line
#
# A bad setting gets a message that says what is wrong and what to do (`tests/test_generation.py` tries
# every argument); a few of them:

# %%
bad_calls = [lambda: generate(model, prompt, 5, top_p=1.2),
             lambda: encode_prompt(tok, "Romeo, wherefore art thou? \u2764 #1"),
             lambda: generate(model, torch.tensor([[0, 999]]), 5),
             lambda: generate(model, prompt, 5, generator=7),
             lambda: sample_next(last, temperature=1.0),
             lambda: sample_next(torch.full((1, 5), float("nan")), temperature=0)]
for call in bad_calls:
    try:
        call()
        raise AssertionError("a bad call was accepted")
    except ValueError as e:
        print(e)

# %% [markdown]
# The same loop runs from a terminal: `transformer-course generate --checkpoint PATH --prompt TEXT` (with
# `--max-new-tokens`, `--temperature`, `--top-k`, `--top-p`, `--seed`) loads a checkpoint written by
# `transformer-course train` or `save_checkpoint`, checks the settings with `check_sampling` first, and
# prints the pieces of `decode_stream` as `stream` yields tokens. We save our model and call the
# command's entry point (the second prompt has a character the tokenizer does not know):

# %%
import tempfile
from pathlib import Path

from transformer_course.cli import main as cli_main
from transformer_course.checkpoint import save_checkpoint

with tempfile.TemporaryDirectory() as tmp:
    checkpoint = save_checkpoint(Path(tmp) / "ch07.pt", model, tokenizer=tok)
    for argv in (["--prompt", "JULIET:\n", "--max-new-tokens", "120", "--temperature", "0.8", "--top-k", "20", "--seed", "7"],
                 ["--prompt", "Juliet \u2764"]):
        print("exit status:", cli_main(["generate", "--checkpoint", str(checkpoint), *argv]))

# %% [markdown]
# ## Quick check

# %%
from transformer_course.quiz import Question, quiz

quiz([
    Question("You set temperature to 0.5. What happens to the distribution the next token is drawn from?",
             ["It gets flatter: rare tokens become more likely", "It gets sharper: the likely tokens take more of the mass",
              "The most likely token changes", "Nothing: temperature only matters for training"], answer=1,
             explain="Dividing the logits by 0.5 doubles the gaps between them, so softmax favours the top tokens "
                     "more; the order of the tokens never changes."),
    Question("Sorted probabilities are 0.5, 0.3, 0.15, 0.05. Which tokens does top-p with p = 0.7 keep?",
             ["Only the first", "The first two", "The first three", "All four"], answer=1,
             explain="0.5 alone is below 0.7; adding 0.3 reaches 0.8 >= 0.7, so the nucleus is the first two tokens."),
    Question("Why does a KV cache not change the generated tokens?",
             ["It stores the sampled tokens, not activations",
              "With a causal mask, earlier positions' keys and values do not depend on later tokens",
              "It only works with greedy decoding", "It lowers the precision so results round the same way"], answer=1,
             explain="A position only attends to itself and earlier positions, so appending a token cannot change the "
                     "keys and values already computed; the cache reuses them instead of recomputing them."),
    Question("The text is now longer than block_size and the model uses learned positions. What must a cached loop do?",
             ["Drop the oldest cache entry and carry on", "Keep appending: the cache has no length limit",
              "Rebuild the cache from the cropped window, because every token's position changed",
              "Switch to greedy decoding"], answer=2,
             explain="Cropping shifts every token to an earlier position, which changes its embedding and so all of "
                     "its keys and values; the stale cache has to be recomputed from the new window."),
])

# %% [markdown]
# ## Summary
#
# - The model gives logits `[B, T, V]`; generation uses the last position's `[B, V]`. One softmax turns
#   them into probabilities (source 2's "softmax before the head" is a LayerNorm).
# - **Greedy** takes the argmax: deterministic, prone to loops. **Sampling** draws in proportion to the
#   probabilities, from an explicit seeded `torch.Generator`.
# - **Temperature** divides the logits (dividing the probabilities cancels out): below 1 sharper, above 1
#   flatter, 0 greedy. **Top-k** keeps exactly k tokens, **top-p** the smallest set whose mass reaches p,
#   in that order; **min-p** keeps the tokens within a factor min_p of the favourite.
# - The **loop** appends each sample and runs again, stops at `eos_id`, and crops the context to
#   `block_size`. A decoder-only model cannot tell typed tokens from generated ones.
# - The **KV cache** keeps every layer's keys and values: N new tokens take N passes and T + N - 1
#   positions (one prefill, then the token chosen last). It costs $2 \cdot n_\text{layer} \cdot B \cdot L
#   \cdot d_\text{model}$ floats, changes no output, and is rebuilt whenever the window is cropped.
# - **Streaming** yields tokens as they are made; `decode_stream` turns them into whole characters.
#
# **Exported to `transformer_course.generation`:** `top_k_filter`, `top_p_filter`, `next_token_probs`,
# `sample_next`, `encode_prompt`, `decode_with_cache`, `stream`, `generate`, `decode_stream`,
# `check_sampling` (the loop's internals are private).
