# %% [markdown]
# # Chapter 07: Generation, sampling and the KV cache
#
# A trained GPT does not write text by itself. Given a sequence of token ids it returns one vector of
# **logits** per position: a score for every token of the vocabulary, saying how likely it is to come
# next. Writing text means turning those scores into a choice, appending the choice to the sequence,
# and asking again, one token at a time. This chapter builds that loop and the knobs that steer it.
#
# **You will build**
# - the path from logits to probabilities, greedy decoding, and sampling with a seeded `torch.Generator`;
# - three ways to reshape the distribution before sampling: **temperature** (you fix a version that
#   quietly does nothing), and **top-k** and **top-p** (nucleus) filtering, which you write yourself;
# - the autoregressive loop: feed each sample back, crop the context when it outgrows `block_size`, stop
#   at an end token, run several prompts as one batch;
# - the **cached generation loop**, yours: the prompt goes through the model once, then one token per
#   step, with a **KV cache** that stops the loop from recomputing the past, proven to change no output;
# - streaming text as it is made (whole characters, even when a token holds half of one), a fourth knob
#   of your own (**min-p**) and a playground widget.
#
# Your top-k, top-p and cached loop are exported cells: once their checks pass, every text this chapter
# writes from then on goes through them. **You will be able to** sample text from chapter 06's model (the
# course ships it, trained with chapter 06's recipe) with any of these settings, explain what each one
# does to the distribution, and say what the cache saves and what it costs.
#
# **It needs** the tokenizers (chapter 01), `GPT` and `load_checkpoint` (chapter 06) and the `KVCache`
# that chapter 04 built into the attention path. It exports to `transformer_course/generation.py`. How
# fast decoding can go (time per token, bf16 weights, the memory-bandwidth bound, the race against
# Hugging Face) is the subject of the optional appendix, `90_appendix_performance`.

# %%
#| default_exp generation

# %%
#| export
"""Generation: turn a GPT's logits into text, one token at a time (exported from chapter 07).

Sampling knobs (applied in this order to the last position's logits [B, V]): temperature, top-k,
top-p. ``temperature=0`` means greedy decoding (always the most likely token). ``generate`` and
``stream`` run the autoregressive loop with an optional KV cache (on by default); the cache never
changes a result, only the time it takes. ``decode_stream`` turns the tokens into text, whole
characters at a time. Randomness comes only from the ``torch.Generator`` passed in (``generate``
and ``stream`` make a fresh one seeded with 0 when none is given): PyTorch's global random state is
neither read nor changed. Shapes: B batch, T time, V vocabulary size.
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
# Chapter 06's model ends with a final LayerNorm (`ln_f`) and a linear layer, the language-modelling
# head, that maps each position's `d_model` numbers to `V` logits: for a batch of `B` sequences of length
# `T` the output is `[B, T, V]`. One of the seeds works this through with a vocabulary of 3,771 tokens,
# `d_model = 64`, a batch of 4 and a context of 16. We build an (untrained) model of that size and look.
# Every position gets a distribution, because training scores all of them at once; at inference only
# what comes *after* the sequence matters, so we keep the last position, `[B, V]`.

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
# Softmax turns one row of logits into probabilities, $p_i = e^{z_i} / \sum_j e^{z_j}$: every $p_i$ is
# positive and each row sums to 1. **A correction to one seed.** Seed 002 applies "one final softmax"
# after the transformer blocks, then the language-modelling head, then "softmax again". There is only one
# softmax, after the head; between the last block and the head sits a LayerNorm (`ln_f`, listed above).
# Seed 003 stores the result of that softmax in a variable called `logits`: keep the names apart.
# **Logits** are unnormalised scores (any real number); **probabilities** are what softmax makes of them,
# and every knob below acts on the logits.
#
# The simplest rule for choosing, the one seed 003 describes, takes the most likely token every time:
# **greedy decoding**. Softmax preserves the order of its inputs, so the largest logit is also the
# largest probability and greedy needs no softmax at all:

# %%
probs = torch.softmax(last, dim=-1)
print("rows sum to 1:", torch.allclose(probs.sum(-1), torch.ones(4)), "| all positive:", bool((probs > 0).all()))
print("greedy:", last.argmax(dim=-1), "| the same from the probabilities:", torch.equal(last.argmax(-1), probs.argmax(-1)))

# %% [markdown]
# Greedy is deterministic, which is handy for tests, but it never takes the second-best word; section 7
# shows what that does to a trained model's text. What real systems do instead is *sample*.
#
# ## 2. Sampling from the distribution
#
# Sampling picks a token at random, weighted by its probability; seed 002's example is a token of
# probability 0.9 chosen 90% of the time. `torch.multinomial` does the draw. Every draw in this course
# takes an explicit, seeded `torch.Generator`: the same seed gives the same draws, and PyTorch's global
# random state (which any other code may also use) is never touched. The 90% claim, with 100,000 draws:

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
    real_number(temperature, "temperature", low=0,
                hint="0 means greedy decoding (always the most likely token), below 1 sharper, above 1 flatter")
    whole_number(top_k, "top_k", low=1, none_ok=True, hint="the number of most likely tokens to keep")
    real_number(top_p, "top_p", low=0, low_open=True, high=1, none_ok=True, hint="1 or None keeps every token")


def _check_logits(logits: torch.Tensor) -> None:
    """Refuse logits [B, V] that give no distribution: NaN, +inf, or a row with no finite value."""
    if bool(logits.isnan().any() | (logits == float("inf")).any() | ~torch.isfinite(logits).any(-1).all()):
        raise ValueError("the logits contain NaN or +inf, or a row that is all -inf, so they give no distribution "
                         "(and no most likely token): check the model's output")

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
    """Keep the ``k`` largest logits of each row [..., V]; set the rest to -inf.

    Exactly ``k`` survive, even when several logits tie with the k-th largest. ``k`` larger than V
    keeps everything.
    """
    whole_number(k, "k", hint="the number of most likely tokens to keep")
    ### BEGIN SOLUTION
    k = min(k, logits.size(-1))
    values, indices = torch.topk(logits, k, dim=-1)
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
    """Keep, in each row [..., V], the smallest set of most likely tokens whose probability reaches ``p``.

    The other logits become -inf. The most likely token always survives; ``p = 1`` keeps every token
    that has a non-zero probability.
    """
    real_number(p, "p", low=0, low_open=True, high=1, hint="the probability mass to keep; 1 keeps every token")
    ### BEGIN SOLUTION
    if p >= 1.0:  # the whole distribution: nothing to drop (and no rounding to drop it by accident)
        return logits.clone()
    probs = torch.softmax(logits.double(), dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # exclusive running total
    drop_sorted = mass_before >= p
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
    """The distribution the next token is drawn from: logits [B, V] -> probabilities [B, V].

    ``temperature=0`` gives a one-hot row at the argmax (greedy decoding).
    """
    check_sampling(temperature, top_k, top_p)
    _check_logits(logits)
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.size(-1)).to(logits.dtype)
    logits = logits.float() / temperature
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None and top_p < 1.0:
        logits = top_p_filter(logits, top_p)
    probs = torch.softmax(logits, dim=-1)
    if not bool(torch.isfinite(probs).all()):  # only a temperature so small that logits / it overflows
        raise ValueError(f"temperature {temperature} is too small for these logits (they overflow): use 0 for greedy")
    return probs


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Pick the next token of every row: logits [B, V] -> LongTensor [B].

    Greedy (argmax) when ``temperature=0``; otherwise one draw from ``next_token_probs`` with
    ``generator``, which sampling requires (PyTorch's global random state is never used).
    """
    if temperature == 0:
        check_sampling(temperature, top_k, top_p)
        _check_logits(logits)
        return logits.argmax(dim=-1)
    probs = next_token_probs(logits, temperature, top_k, top_p)
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"sampling needs a generator, got {generator!r}: pass generator=torch.Generator()"
                         ".manual_seed(seed) (on the logits' device), or temperature=0 for greedy decoding")
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)

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
# Sampling needs a trained model. The course ships one inside the package: chapter 06's character-level
# GPT, trained once with chapter 06's recipe by the course's own `train`. `load_course_model` checks the
# file against the SHA-256 in its manifest and loads it with chapter 06's `load_checkpoint`: the model,
# its tokenizer and the history of its run. Loading a file, unlike training again, gives the same model on
# every machine. (A checkpoint that `transformer-course train` writes works just as well: see section 12.)

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
# Seed 004 describes generation as a loop: run the model, use only the distribution for the next token,
# sample from it, append the sample, and run again. Text goes in through the tokenizer: `encode_prompt`
# turns a string into ids `[1, T]`, and refuses what the model could not read (an empty prompt, characters
# outside the vocabulary) with a message that names the problem, instead of failing inside the embedding.

# %%
#| export
def encode_prompt(tokenizer, text: str, device=None) -> torch.Tensor:
    """Encode a text prompt as LongTensor [1, T] with the model's tokenizer.

    Raises a ValueError for an empty prompt and, for a character tokenizer (one with ``.chars``), for
    characters outside its vocabulary.
    """
    if not isinstance(text, str):
        raise ValueError(f"the prompt must be a str, got {type(text).__name__}")
    if not text:
        raise ValueError("the prompt is empty: give at least one character to continue from (a newline works)")
    known = getattr(tokenizer, "chars", None)
    if known is not None and (unknown := sorted(set(text) - set(known))):
        raise ValueError(f"the prompt has characters the tokenizer does not know: {''.join(unknown)!r}; remove or "
                         f"replace them (it knows {len(known)} characters: {''.join(known)!r})")
    return torch.tensor([tokenizer.encode(text)], dtype=torch.long, device=device)

# %% [markdown]
# A first loop is a few lines. With learned positions the model has embeddings for positions
# `0 .. block_size - 1` only (a longer input is an error, not a silent wrap-around), so the loop keeps
# the last `block_size` tokens as context: the window slides along and the text can grow without limit.

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
# Greedy decoding soon repeats itself: once a phrase is the most likely continuation of itself, nothing
# breaks the cycle. Sampling, with a seeded generator: at temperature 1, and at 0.8 with your top-k and
# top-p filters (`sample_next` calls them, through `next_token_probs`):

# %%
for knobs in (dict(temperature=1.0), dict(temperature=0.8, top_k=20, top_p=0.9)):
    with torch.no_grad():
        out = naive_generate(model, prompt, 120, generator=torch.Generator().manual_seed(1), **knobs)
    print(f"--- {', '.join(f'{k} {v}' for k, v in knobs.items())}\n{tok.decode(out[0].tolist())}")

# %% [markdown]
# Seed 004 adds a worry: it would like $P(\text{next} \mid \text{the cat sat on})$ to be the same whether
# "on" was part of the prompt or was sampled by the model, and says that in a transformer the two are
# different. That is true of the encoder-decoder transformer it describes, where the prompt goes through
# one stack and the output through another (chapter 09). In a **decoder-only** GPT the prompt and the
# generated tokens go through the very same stack; the model cannot tell them apart. So continuing a
# prompt that already contains generated text must give exactly the same continuation:

# %%
with torch.no_grad():
    full = naive_generate(model, prompt, 30, temperature=0)  # prompt + 30 greedy tokens
    half = naive_generate(model, full[:, : prompt.size(1) + 15], 15, temperature=0)  # 15 of them typed in
print(repr(tok.decode(full[0].tolist())), "| same continuation:", torch.equal(full, half))
assert torch.equal(full, half)

# %% [markdown]
# ## 8. The KV cache
#
# Look at what the loop recomputes. At step $t$ it runs the whole window through every layer, although
# only the last position's output is used, and although every other position was already computed at
# step $t-1$. With a causal mask a position's keys and values depend only on the tokens up to it, so
# they cannot change when a token is appended. (Seed 004 notes that an encoder-decoder runs its input
# stack only once at inference; the KV cache is the decoder-only version of the same saving.) A forward
# pre-hook that counts the positions fed to the model makes the waste concrete:

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
# That is quadratic in the length of the text (until the window is full). A **KV cache** keeps, for each
# layer, the keys and values of the positions already processed (chapter 04 built it into the attention:
# `MultiHeadAttention(x, cache=...)` appends the new keys and values and attends over all of them). The
# loop then becomes:
#
# 1. **prefill**: run the whole prompt once with an empty cache; the cache now holds its keys and values,
#    and the last position's logits give the first new token;
# 2. **decode**: feed only the newest token; its query attends to the cached keys, its own key and value
#    are appended, and its logits give the next token.
#
# The model offers (chapter 06) `model.new_cache()`, an empty cache (one `KVCache` per layer;
# `cache[0].length` positions held), and `model(x, cache=cache, last_only=True)`: new tokens `x`
# `[B, T_new]` are numbered from position `cache[0].length` on, their keys and values are appended to
# every layer's cache, and the logits come back for the last new position only, `[B, 1, V]`.
#
# ### Your turn: predict the work
#
# Before you write the loop: with the cache, how many forward passes does it take to generate 40 new
# tokens after our 7-token prompt `"ROMEO:\n"`, and how many token positions do those passes feed the
# model in all? (Without the cache, the count above was 40 passes and over a thousand positions.)

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
# Now write the loop. `decode_with_cache(model, window, n, choose)` generates `n` tokens after `window`
# `[B, T]` and **yields** each step's tokens, a LongTensor `[B]`, as soon as they are chosen (it is a
# generator: `yield` inside the loop; `stream` below passes each token on to you while the next one is
# being computed). `choose` decides which token comes next: it takes the last position's logits `[B, V]`
# and returns the tokens `[B]`, by argmax, by sampling, or by whatever rule the caller wants; the loop
# neither samples nor looks at the logits itself. What `choose` returns is what you yield and what you
# feed to the model next.
#
# - Start from a fresh `model.new_cache()`; the first pass feeds the whole window (the prefill);
# - every later pass feeds only the token chosen last, shaped `[B, 1]`, with the same cache;
# - one pass per new token, `choose` called once per pass (a sampling rule draws a random number at each
#   call), and no pass after the last token: nothing needs its key and value;
# - `T + n - 1 <= block_size`: the window and the new tokens fit in the context (the caller sees to
#   that, and to `torch.no_grad()`).
#
# The check runs your loop on a small random model against the plain loop (the whole text every step),
# with a greedy `choose` and with one that picks the second most likely token, and counts the positions
# it feeds. Once it passes, `generate` and `stream` run your loop for every cached text in the rest of
# the chapter.

# %%
#| export
# Your turn - Exercise 7.5 (★★★, build): the cached generation loop.
def decode_with_cache(model, window: torch.Tensor, n: int, choose) -> Iterator[torch.Tensor]:
    """Generate ``n`` tokens after ``window`` [B, T] with a KV cache; yields each step's tokens, LongTensor [B].

    The first pass runs the whole window through the model with a fresh ``model.new_cache()`` (prefill);
    each later pass feeds only the token chosen last, [B, 1]. ``choose(logits [B, V]) -> LongTensor [B]``
    picks the next tokens from the last position's logits; what it returns is yielded and fed back.
    Needs T + n - 1 <= block_size. The caller decides about ``torch.no_grad()``.
    """
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
# The keys are `[B, n_head, L, head_size]` per layer, and the values the same. The cache's memory is
# therefore $2 \times n_\text{layer} \times B \times L \times d_\text{model} \times 4$ bytes in float32
# (keys and values, $n_\text{head} \cdot \text{head\_size} = d_\text{model}$). It grows linearly with the
# text, and for big models and long contexts it becomes the dominant cost of serving them.

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
# Once the text is longer than `block_size`, the window slides by one token per step. It is tempting to
# drop the oldest entry from the cache and carry on. With learned (or any absolute) positions that is
# wrong: after the slide every token sits one position earlier in the window, so its input embedding
# (token + position) changes, and with it its keys and values in the first layer. In deeper layers there
# is a second reason: each key there was computed while the dropped token was still visible. Compare the
# keys of the same tokens, computed in two overlapping windows:

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
# Every shared key moved, so rolling the cache would feed the model stale numbers. The exact fix is to
# **rebuild** the cache (one prefill of the cropped window) whenever the window moves: with a window that
# slides one token per step the cache then saves nothing past `block_size`. `generate` therefore takes a
# keyword `crop_to`: when the context outgrows `block_size`, keep only its last `crop_to` tokens (default
# `block_size`); a smaller value rebuilds once every `block_size - crop_to + 1` steps, at the price of a
# shorter context right after each crop. Cached and uncached paths apply the same rule, so they agree.
# (Models with *relative* positions, such as rotary embeddings, drop old cache entries cheaply, but the
# deeper layers' keys still remember the dropped tokens: an approximation such models accept.)
#
# Here is the package's loop, built around yours. A request is checked before any work starts, so a
# mistake gets a message that names it rather than an error from deep inside the model:

# %%
#| export
def _check_request(model, idx, max_new_tokens, use_cache, generator, eos_id, crop_to) -> int:
    """Validate a generation request; return the window kept when the context outgrows block_size."""
    if not isinstance(idx, torch.Tensor) or idx.dtype != torch.long:
        raise ValueError(f"idx must be a LongTensor of token ids [B, T], got {type(idx).__name__} "
                         f"{getattr(idx, 'dtype', '')}: build it with torch.tensor(ids, dtype=torch.long)")
    if idx.dim() != 2:
        raise ValueError(f"idx must be 2-D [B, T], got shape {tuple(idx.shape)}: for one prompt use idx[None]")
    if idx.numel() == 0:
        raise ValueError(f"the prompt is empty (idx has shape {tuple(idx.shape)}): give at least one token to "
                         "start from, e.g. the encoding of a newline for a character-level model")
    vocab, block = model.cfg.vocab_size, model.cfg.block_size
    low, high = int(idx.min()), int(idx.max())
    if low < 0 or high >= vocab:
        raise ValueError(f"token id {low if low < 0 else high} is outside the model's vocabulary 0..{vocab - 1}: "
                         "encode the prompt with the tokenizer the model was trained with")
    whole_number(max_new_tokens, "max_new_tokens", low=0)
    flag(use_cache, "use_cache")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator (or None), got {generator!r}: "
                         "pass torch.Generator().manual_seed(seed)")
    whole_number(eos_id, "eos_id", low=0, high=vocab - 1, none_ok=True, hint="a token id of the model's vocabulary")
    return whole_number(block if crop_to is None else crop_to, "crop_to", low=1, high=block,
                        hint=f"the tokens kept when the context outgrows block_size={block} (None: all of them)")

# %% [markdown]
# Then the loop itself. It crops the window when the context outgrows `block_size`, and hands each window
# to your `decode_with_cache`: one prefill, then one token per pass until the window is full
# (`block_size - T_w + 1` tokens from a window of `T_w`), then a crop and a fresh cache for the next
# window. Without the cache (`use_cache=False`) every step runs the whole window again. The `choose` it
# passes samples with the knobs and handles the end token: a row that has produced `eos_id` is finished,
# and from then on gets `eos_id` again. The model is put in eval mode (dropout off), and
# `@torch.no_grad()` on a generator turns autograd off only while a step runs, not while your code
# between two tokens does.

# %%
#| export
@torch.no_grad()
def _steps(model, idx, max_new_tokens, knobs, use_cache, generator, eos_id, crop_to) -> Iterator[torch.Tensor]:
    """The loop behind ``stream``: yields LongTensor [B] once per new token."""
    block = model.cfg.block_size
    finished = torch.zeros(idx.size(0), dtype=torch.bool, device=idx.device)

    def choose(logits: torch.Tensor) -> torch.Tensor:
        """The last position's logits [B, V] -> the next token of every row [B]."""
        nonlocal finished
        nxt = sample_next(logits, *knobs, generator=generator)  # [B]
        if eos_id is not None:
            nxt = nxt.masked_fill(finished, eos_id)  # finished rows are padded with eos
            finished = finished | (nxt == eos_id)
        return nxt

    seq, start = idx, 0  # seq [B, L]: prompt and tokens so far; the model sees seq[:, start:]
    was_training = model.training
    model.eval()  # dropout off: the same settings and seed must give the same text
    try:
        while (made := seq.size(1) - idx.size(1)) < max_new_tokens:
            if seq.size(1) - start > block:  # the context outgrew block_size: crop it
                start = seq.size(1) - crop_to
            window = seq[:, start:]  # [B, T_w], T_w <= block_size
            if use_cache:  # a crop shifts every position, so each window gets its own cache and prefill
                steps = decode_with_cache(model, window, min(max_new_tokens - made, block - window.size(1) + 1), choose)
            else:  # one step: every position of the window again
                steps = [choose(model(window, last_only=True)[0][:, -1, :])]
            for nxt in steps:
                seq = torch.cat([seq, nxt[:, None]], dim=1)
                yield nxt
                if eos_id is not None and bool(finished.all()):
                    return
            if seq.size(1) - idx.size(1) == made:
                raise RuntimeError("decode_with_cache yielded no token: it must yield one tensor [B] per step")
    finally:
        model.train(was_training)

# %% [markdown]
# Finally the two public entry points: `stream` yields one token per row and step, and `generate`
# collects them into one tensor. Without a `generator`, both make a fresh one seeded with 0, so a call
# gives the same text every time and never touches PyTorch's global random state; pass your own seeded
# generator for other samples.

# %%
#| export
def stream(model, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
           top_p: float | None = None, use_cache: bool = True, generator: torch.Generator | None = None,
           eos_id: int | None = None, *, crop_to: int | None = None) -> Iterator[torch.Tensor]:
    """Generate token by token: yields a LongTensor [B] (the next token of every row) per step.

    idx: prompts [B, T] (same length; at least one token). Stops after ``max_new_tokens`` steps, or
    once every row has produced ``eos_id`` (rows that finished earlier are padded with ``eos_id``).
    When the context outgrows ``block_size`` only its last ``crop_to`` tokens (default block_size)
    are kept. ``use_cache`` changes the cost, never the tokens. ``generator=None`` means a fresh
    ``torch.Generator`` seeded with 0. Arguments are checked at the call, not at the first ``next()``.
    """
    check_sampling(temperature, top_k, top_p)
    crop_to = _check_request(model, idx, max_new_tokens, use_cache, generator, eos_id, crop_to)
    if generator is None:
        generator = torch.Generator(idx.device).manual_seed(0)
    return _steps(model, idx, max_new_tokens, (temperature, top_k, top_p), use_cache, generator, eos_id, crop_to)


def generate(model, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, use_cache: bool = True, generator: torch.Generator | None = None,
             eos_id: int | None = None, *, crop_to: int | None = None) -> torch.Tensor:
    """Continue the prompts idx [B, T]: returns LongTensor [B, T + new] with new <= max_new_tokens.

    ``temperature=0`` is greedy decoding; ``top_k`` / ``top_p`` restrict sampling to the k most
    likely tokens / the nucleus of mass p; ``generator`` makes the draws (None: a fresh one seeded
    with 0); with ``eos_id`` generation stops once every row has produced it (finished rows are
    padded with it). See ``stream``.
    """
    steps = list(stream(model, idx, max_new_tokens, temperature, top_k, top_p, use_cache, generator, eos_id,
                        crop_to=crop_to))
    return torch.cat([idx, *(step[:, None] for step in steps)], dim=1)

# %% [markdown]
# ### The cache changes nothing
#
# The claim to prove: with and without the cache, greedy and seeded sampling give identical tokens, also
# far past `block_size`, and with `crop_to` too. Each run gets a fresh generator with the same seed, so
# both paths draw the same random numbers; any difference in the logits large enough to matter would show
# up as a different token.

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
# For a model this small the cache saves far more work than time: a step costs mostly fixed overhead
# (Python and the launch of a few dozen small operations), not arithmetic. How much time it saves, and
# how fast a decode step can be at all, is measured in the optional appendix, `90_appendix_performance`
# (and by `benchmarks/bench_generation.py`, which writes `benchmarks/results/generation.md`).

# %% [markdown]
# ## 9. Several prompts at once, end tokens, streaming
#
# `generate` takes a batch `[B, T]`: B prompts of the same length run side by side, one forward pass per
# step for all of them (prompts of different lengths would need padding and a padding mask; with learned
# positions a left-padded prompt would also sit at the wrong positions). Seed 004 mentions how generation
# usually ends: a special **end token**, which stops the text and is not shown to the reader. Our
# character-level model has none, but a newline can play the part. With `eos_id`, a row is finished once
# it produces the end token, later positions of that row are padded with it, and generation stops when
# every row is finished. Three prompts, one line of verse each; and greedy rows equal single runs:

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
# `stream` is the same loop as an iterator: it yields each step's tokens as soon as they exist, which is
# how chat interfaces print a reply while it is being written. Turning those tokens into text one at a
# time needs one more idea. Our character tokenizer maps every id to a whole character, but a byte-level
# BPE tokenizer (chapter 01) can split one character's UTF-8 bytes across two tokens, and each half
# decoded alone is not text. A BPE tokenizer without merges shows it: every byte is a token, and "é" is
# two bytes.
#
# `decode_stream(tokenizer, ids)` decodes the stream of ids as it comes and emits only whole characters:
# the bytes of an unfinished character wait for the token that completes it (Python's incremental UTF-8
# decoder keeps them), so the pieces join to exactly what `decode` gives for all the ids at once.

# %%
#| export
def decode_stream(tokenizer, ids: Iterable[int]) -> Iterator[str]:
    """Decode a stream of token ids into text pieces that join to ``tokenizer.decode(all ids)``.

    Yields one str per id (empty while a character is unfinished), then one more piece if the text
    ends inside a character. A byte-level tokenizer (one with ``decode_bytes``, such as ``BPETokenizer``)
    can split a character's UTF-8 bytes across tokens: they wait until the character is complete;
    bytes that can never be UTF-8 become U+FFFD at once, as in ``decode``. A tokenizer without
    ``decode_bytes`` (``CharTokenizer``) decodes each id to whole characters.
    """
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
# Type a prompt, set the knobs, press **Generate**. Below the text, the bars show the most likely next
# tokens after the prompt *under the current settings* (temperature, top-k and top-p reshape them
# exactly as they reshape the sampling). Top-k 0 means "off".

# %%
import ipywidgets as widgets


def show_generation(prompt_text, temperature=0.8, top_k=None, top_p=1.0, length=150, seed=0, k_bars=10):
    """Print a continuation of prompt_text and draw the top next-token probabilities after the prompt,
    under the same settings. Returns (text, [(token, probability), ...])."""
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    try:
        idx = encode_prompt(tok, prompt_text)
        ids = generate(model, idx, length, generator=torch.Generator().manual_seed(seed), **kw)
    except ValueError as e:
        print(e)
        return str(e), []
    text = tok.decode(ids[0].tolist())
    print(text)
    with torch.no_grad():
        top = next_token_probs(model(idx[:, -model.cfg.block_size:])[0][:, -1], **kw)[0].topk(k_bars)
    labels = [{"\n": "\\n", " ": "space"}.get(c, c) for c in map(tok.decode, ([i] for i in top.indices.tolist()))]
    fig, ax = plt.subplots(figsize=(7, 2.4))
    ax.bar(labels, top.values.numpy())
    ax.set(ylabel="probability", title="most likely next characters after the prompt")
    plt.show()
    return text, list(zip(labels, [round(v, 4) for v in top.values.tolist()], strict=True))


def playground():
    """Prompt box, sliders and a Generate button; each click redraws into the widget's Output."""
    prompt_box = widgets.Textarea(value="ROMEO:\n", description="prompt", layout=widgets.Layout(width="60%"))
    temperature = widgets.FloatSlider(value=0.8, min=0.0, max=2.0, step=0.05, description="temperature")
    top_k = widgets.IntSlider(value=0, min=0, max=tok.vocab_size, description="top-k (0=off)")
    top_p = widgets.FloatSlider(value=1.0, min=0.05, max=1.0, step=0.05, description="top-p")
    length = widgets.IntSlider(value=150, min=10, max=500, step=10, description="new tokens")
    seed = widgets.IntText(value=0, description="seed")
    button = widgets.Button(description="Generate", button_style="primary")
    out = widgets.Output()

    def on_click(_):
        with out:
            out.clear_output(wait=True)
            show_generation(prompt_box.value, temperature.value, top_k.value or None, top_p.value, length.value, seed.value)

    button.on_click(on_click)
    rows = [prompt_box, widgets.HBox([temperature, top_k]), widgets.HBox([top_p, length]), widgets.HBox([seed, button])]
    return widgets.VBox(rows + [out])

# %%
display(playground())
text, top = show_generation("ROMEO:\n")  # the playground's starting settings, stored with the notebook
print(top)

# %% [markdown]
# ## 12. Bad input, and the command line
#
# Every bad setting gets a message that says what is wrong and what to do:

# %%
bad_calls = {
    "negative temperature": lambda: generate(model, prompt, 5, temperature=-1),
    "top_k = 0": lambda: generate(model, prompt, 5, top_k=0),
    "top_p = 1.2": lambda: generate(model, prompt, 5, top_p=1.2),
    "empty prompt (text)": lambda: encode_prompt(tok, ""),
    "empty prompt (ids)": lambda: generate(model, torch.zeros(1, 0, dtype=torch.long), 5),
    "max_new_tokens < 0": lambda: generate(model, prompt, -3),
    "unknown characters": lambda: encode_prompt(tok, "Romeo, wherefore art thou? \u2764 #1"),
    "ids outside the vocabulary": lambda: generate(model, torch.tensor([[0, 999]]), 5),
    "eos_id = True": lambda: generate(model, prompt, 5, eos_id=True),
    "a seed for a generator": lambda: generate(model, prompt, 5, generator=7),
    "sampling without a generator": lambda: sample_next(last, temperature=1.0),
    "greedy on NaN logits": lambda: sample_next(torch.full((1, 5), float("nan")), temperature=0),
}
for name, call in bad_calls.items():
    try:
        call()
        print(f"{name}: accepted?!")
    except ValueError as e:
        print(f"{name}: {e}")

# %% [markdown]
# The same loop runs from a terminal: `transformer-course generate --checkpoint PATH --prompt TEXT`
# (with `--max-new-tokens`, `--temperature`, `--top-k`, `--top-p`, `--seed`) loads a checkpoint written
# by `transformer-course train` or `save_checkpoint` and streams the text through `decode_stream`. A
# checkpoint whose tokenizer knows fewer tokens than the model can sample is refused before anything is
# generated. The command lives in `transformer_course/cli.py` (`_run_generate`): it checks the sampling
# settings with `check_sampling` before the load, loads the checkpoint, and prints the pieces of
# `decode_stream(tok, ...)` as `stream` yields tokens, nothing more than the cells above.

# %% [markdown]
# We save our model and call the command's entry point directly:

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
    Question(
        "You set temperature to 0.5. What happens to the distribution the next token is drawn from?",
        options=["It gets flatter: rare tokens become more likely",
                 "It gets sharper: the likely tokens take more of the mass",
                 "The most likely token changes",
                 "Nothing: temperature only matters for training"],
        answer=1,
        explain="Dividing the logits by 0.5 doubles the gaps between them, so softmax favours the top tokens "
                "more; the order of the tokens never changes.",
    ),
    Question(
        "Sorted probabilities are 0.5, 0.3, 0.15, 0.05. Which tokens does top-p with p = 0.7 keep?",
        options=["Only the first", "The first two", "The first three", "All four"],
        answer=1,
        explain="0.5 alone is below 0.7; adding 0.3 reaches 0.8 >= 0.7, so the nucleus is the first two tokens.",
    ),
    Question(
        "Why does a KV cache not change the generated tokens?",
        options=["It stores the sampled tokens, not activations",
                 "With a causal mask, earlier positions' keys and values do not depend on later tokens",
                 "It only works with greedy decoding",
                 "It lowers the precision so results round the same way"],
        answer=1,
        explain="A position only attends to itself and earlier positions, so appending a token cannot change "
                "the keys and values already computed; the cache reuses them instead of recomputing them.",
    ),
    Question(
        "The text is now longer than block_size and the model uses learned positions. What must a cached loop do?",
        options=["Drop the oldest cache entry and carry on",
                 "Keep appending: the cache has no length limit",
                 "Rebuild the cache from the cropped window, because every token's position changed",
                 "Switch to greedy decoding"],
        answer=2,
        explain="Cropping shifts every token to an earlier position, which changes its embedding and so all "
                "of its keys and values; the stale cache has to be recomputed from the new window.",
    ),
])

# %% [markdown]
# ## Summary
#
# - The model gives logits `[B, T, V]`; generation uses the last position's `[B, V]`. One softmax turns
#   them into probabilities (seed 002's "softmax before the head" is a LayerNorm).
# - **Greedy** takes the argmax: deterministic, and prone to loops. **Sampling** draws in proportion to the
#   probabilities, from an explicit seeded `torch.Generator` (never PyTorch's global random state).
# - **Temperature** divides the logits (not the probabilities: dividing those and normalising cancels
#   out): below 1 sharper, above 1 flatter, 0 means greedy. **Top-k** keeps exactly the k most likely
#   tokens; **top-p** keeps the smallest set whose mass reaches p. They apply in that order. **Min-p**
#   keeps the tokens within a factor min_p of the favourite.
# - The **autoregressive loop** appends each sample and runs again, stops at an end token (`eos_id`), and
#   crops the context to `block_size` (learned positions end there). A decoder-only model cannot tell
#   typed tokens from generated ones.
# - The **KV cache** stores every layer's keys and values, so each step processes one new position instead
#   of the whole window: N new tokens take N passes and T + N - 1 positions (`decode_with_cache`: one
#   prefill, then the token chosen last). It costs $2 \cdot n_\text{layer} \cdot B \cdot L \cdot d_\text{model}$
#   floats, changes no output, and must be rebuilt whenever the window is cropped.
# - **Streaming** yields tokens as they are made; `decode_stream` turns them into whole characters, even
#   when a byte-level token holds half of one.
#
# **Exported to `transformer_course.generation`:** `top_k_filter`, `top_p_filter`, `next_token_probs`,
# `sample_next`, `encode_prompt`, `decode_with_cache`, `stream`, `generate`, `decode_stream`,
# `check_sampling` (the loop's internals are private).
