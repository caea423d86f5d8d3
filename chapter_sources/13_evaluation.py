# %% [markdown]
# # 13 · How good is it? Held-out sets, bits per character, exact match with an interval, pass@k and calibration
#
# > Measure the course's models so that the numbers can be trusted: a held-out set and how it leaks,
# > bits per character on plays the model never read, exact match with a confidence interval and the
# > baselines it must beat, pass@k, and calibration; then re-judge chapters 11 and 12 with these tools.
#
# Chapters 06 to 12 trained a base model, made it an assistant and improved it with DPO and GRPO. Each
# time a number went up, and each time the chapter said "better". This chapter asks what such a number
# is worth: what it was measured on, how much of it is luck of the questions, what a model that knows
# nothing would score, and whether the model's own confidence means anything. The same measurements
# then go into a **report card**, one page per model, that `transformer-course report` writes for the
# shipped models or for your own checkpoint.
#
# **In this chapter you will** measure a contamination (a "held-out" set the model has read), score the
# base model on held-out plays in bits per character after fixing an evaluation loop whose answer
# depends on its batch size (Exercise 13.1), write a confidence interval for a share (13.2), predict how
# many questions a difference of two points needs (13.3), compare scores with chance and majority
# baselines, estimate pass@k, bin the model's confidence into a reliability diagram (13.4), judge which
# of chapter 11 and 12's comparisons the questions can support (13.5), and compare two models on the
# same questions with a paired bootstrap (13.6).
#
# **You need** chapter 06 (the loss, the train/validation split), chapter 11 (the instruction set,
# `answers`, exact match) and chapter 12 (strange words, `is_right`, the DPO and GRPO models, pass@k).

# %%
#| default_exp evaluation

# %%
import math

import matplotlib.pyplot as plt
import torch

from transformer_course.assistant import make_tasks
from transformer_course.course_model import load_chat_model, load_course_model
from transformer_course.data import load_shakespeare, train_val_split

torch.set_printoptions(precision=4, sci_mode=False)
torch.set_num_threads(1)  # the evaluations below are small; one thread is as fast under contention and repeatable
torch.manual_seed(0)
text = load_shakespeare()
train_text, held_text = train_val_split(text)  # chapter 06's split: the first 90% trained on, the last 10% not
base = load_course_model()  # chapter 06's shipped base model
chat = load_chat_model()  # chapter 11's shipped SFT model
tok, tasks = chat.tokenizer, make_tasks(text)  # chapter 11's instruction set: 100 held-out examples per kind
print(f"trained on {len(train_text):,} characters, held out {len(held_text):,}")

# %% [markdown]
# ## 1. A held-out set, and how it leaks
#
# A score means something only on examples the model was not trained on: a model that memorised its
# training set can score 100% there and know nothing. So every evaluation starts with a **held-out
# set**, kept apart before training. Chapter 06 held out the last 10% of the corpus, which is the end of
# the play list: parts of *Macbeth*, then *Othello*, *Romeo and Juliet* and *Timon of Athens*, whole.
# Chapter 11 held out 100 examples of each task kind from fine-tuning.
#
# Held out from *which* training, though? The base model read the first 90% of the plays before
# chapter 11 fine-tuned it. Chapter 11's held-out words are words of the plays (seen at least three
# times), and its held-out "who says" lines are first lines of speeches. The package's `seen_in`
# measures how many of them the base model's training text already holds.

# %%
#| export
"""Evaluation (chapter 13): held-out bits per character, exact match with a Wilson interval and its
baselines, pass@k, calibration (reliability bins), contamination and a paired bootstrap.

Shapes: N examples (or predicted characters), K bins. Shares are fractions in [0, 1]."""

from __future__ import annotations

import collections
import math
import re

import torch
import torch.nn.functional as F

from transformer_course.arguments import real_number, whole_number
from transformer_course.assistant import Example, answers, reply_ids
from transformer_course.preferences import conversation_batch, is_right, reply_logprobs


def seen_in(examples: list[Example], text: str) -> list[bool]:
    """For each example, whether what it asks about (the word after ``kind: ``, or the quoted line of a
    ``who says:`` prompt) occurs in `text`: a word as a whole word, a line anywhere."""
    words = set(re.findall(r"[a-z]+", text))
    subject = [e.prompt.split(": ", 1)[1] for e in examples]
    return [s in text if e.kind == "speaker" else s in words for e, s in zip(examples, subject, strict=True)]


def task_counts(model, tok, held: dict[str, list[Example]], max_new_tokens: int = 16) -> dict[str, tuple[int, int]]:
    """{kind: (right, asked)}: chapter 11's exact match (greedy answers, `is_right`), as counts."""
    out = {}
    for kind, examples in held.items():
        got = answers(model, tok, [e.prompt for e in examples], max_new_tokens)
        out[kind] = (sum(map(is_right, examples, got)), len(examples))
    return out


# %%
for kind in ("upper", "speaker"):
    seen = seen_in(tasks.held[kind], train_text)
    print(f"chapter 11's held-out {kind:8} examples whose subject the base model read: {sum(seen)} of {len(seen)}")

# %% [markdown]
# Every held-out word, and 85 of the 100 held-out lines, are in the text the base model trained on.
# That is **contamination**: the test asks about things the model has seen. Here it is mild (the model
# read the word in a play, never the answer "GENTLE" after "upper: gentle"), but it matters. Chapter 12
# met it already: the strange words, strings that no play holds, are harder. Measured on the same two
# skills, with the chat model's greedy answers (`task_counts`: right and asked, per kind):

# %%
from transformer_course.preferences import HELD_OUT_SEED, strange_words

strange = strange_words(400, seed=HELD_OUT_SEED)  # chapter 12's held-out strange words
for kind in ("upper", "reverse"):
    sets = {"words of the plays": tasks.held[kind], "strange words": [t for t in strange if t.kind == kind]}
    got = task_counts(chat.model, tok, sets)
    print(f"{kind:8}", "   ".join(f"{name}: {r}/{n}" for name, (r, n) in got.items()))

# %% [markdown]
# The same skill scores about 100% on words the model has read and about half as much on strings it has
# not. Chapter 11's "held-out exact match" was honest about fine-tuning (no held-out prompt was trained
# on) but not about the model: it measures the skill on familiar words. This is the shape of the
# field's contamination problem: benchmark questions that sit, word for word, in a web crawl the model
# was pretrained on. The defences are the ones used here: keep the test set out of *every* training
# stage, check the overlap (`seen_in`; real pipelines look for shared runs of 8-13 words), and keep a
# set built after the training data was collected (our strange words are drawn at random, so no text
# can hold them).
#
# ## 2. Bits per character on held-out plays
#
# A language model's own score is how well it predicts text it did not train on: the mean of
# −log₂ p(next character) over the held-out characters, **bits per character**. Its exponential,
# 2^bits, is the **perplexity**: the number of equally likely characters the model is as unsure as.
# A model that spread its probability evenly over the 76 characters would score log₂ 76 ≈ 6.25 bits
# (perplexity 76); English text compressed by a good general-purpose compressor takes about 2-2.5 bits.
#
# Here is an evaluation loop that cuts the held-out text into windows of the model's context, runs them
# in batches, and averages. It looks right, and its answer changes with the batch size:

# %%
import torch.nn.functional as F


@torch.no_grad()
def bits_with_a_bug(model, ids, batch=64, chars=None):
    B = model.cfg.block_size
    n = (len(ids) - 1) // B
    x, y = ids[: n * B].view(n, B), ids[1 : n * B + 1].view(n, B)
    means = []
    for i in range(0, n, batch):
        logits = model(x[i : i + batch])[0][..., :chars]
        means.append(F.cross_entropy(logits.flatten(0, 1), y[i : i + batch].flatten()).item())
    return sum(means) / len(means) / math.log(2)


held_ids = torch.tensor(base.tokenizer.encode(held_text[:32_001]))  # 32,000 predictions, 500 windows
for batch in (100, 64, 499):
    print(f"batch {batch:3}: {bits_with_a_bug(base.model, held_ids, batch=batch):.2f} bits")

# %% [markdown]
# **Your turn (debug).** Find why the batch size changes the answer (how many windows does each batch
# hold, and how much does each batch's mean count?), and write the fixed `heldout_bits`: the same
# windows, and every predicted character counted once, whatever `batch` is. `chars` keeps the first
# `chars` logits only (a chat model's turn tokens are not characters). It returns bits, not nats.

# %%
#| export
# Your turn - Exercise 13.1 (★★☆, debug): bits per character that do not depend on the batch size.
@torch.no_grad()
def heldout_bits(model, ids: torch.Tensor, batch: int = 64, chars: int | None = None) -> float:
    """Mean −log₂ p(next id) over ids [N] cut into windows of the model's context (the last partial
    window dropped), run `batch` windows at a time: bits per character of a character-level model.
    `chars`: only the first `chars` logits are kept (a chat model's turn tokens are not characters)."""
    B, batch = model.cfg.block_size, whole_number(batch, "batch")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or len(ids) < B + 1:
        raise ValueError(f"ids must be a 1-D tensor of at least block_size + 1 = {B + 1} ids")
    ### BEGIN SOLUTION
    n = (len(ids) - 1) // B
    x, y = ids[: n * B].view(n, B), ids[1 : n * B + 1].view(n, B)
    total = 0.0
    for i in range(0, n, batch):
        logits = model(x[i : i + batch])[0][..., :chars].float()
        total += F.cross_entropy(logits.flatten(0, 1), y[i : i + batch].flatten(), reduction="sum").item()
    return total / (n * B) / math.log(2)
    ### END SOLUTION


# %%
from transformer_course.checks.evaluation import check_heldout_bits

heldout_bits = check_heldout_bits(heldout_bits).use

# %%
bits = heldout_bits(base.model, held_ids)
print("batch size no longer matters:", abs(bits - heldout_bits(base.model, held_ids, batch=100)) < 1e-4)
print(f"base model on held-out plays: {bits:.2f} bits per character, perplexity {2 ** bits:.1f}")
train_ids = torch.tensor(base.tokenizer.encode(train_text[-32_001:]))  # the last stretch it trained on
print(f"on the last 32,000 characters it trained on: {heldout_bits(base.model, train_ids):.2f} bits")
print("the chat model, on the same held-out characters:",
      f"{heldout_bits(chat.model, held_ids, chars=base.tokenizer.vocab_size):.2f} bits")

# %% [markdown]
# About 2.7 bits per character: the model is as unsure as a choice among about 6.6 characters,
# against 76 for a uniform guess. Text it trained on scores only a little lower (2.67), so it has not
# memorised its training text; a large gap between the two would be the sign of overfitting. The chat
# model, on the same characters, scores worse than a uniform guess (chapter 11 saw it too): fine-tuning
# on nothing but short answers cost it the plays. A report card that shows only the chat tasks would
# hide that.
#
# Two cautions. Bits per *character* compare only models that cut text the same way; per *token*,
# a model whose tokens are longer gets a larger number for the same text, so compare per character
# or per byte. And the windows start cold: the first character of each window is predicted with no
# context, so a model with a longer context would look better on windows of its own length. The
# score is a property of model *and* protocol; a report card states both.
#
# ## 3. Exact match, and how sure we are of it
#
# Chapter 11's model answers "who says: ..." right 17 times in 100. Had chapter 11 drawn another 100
# lines, it would have scored a bit more or less: 17% is one draw of a noisy measurement. A **95%
# confidence interval** is a range built so that, over many such draws of questions, it holds the true
# rate 95% of the time.
#
# The interval the course uses is Wilson's (1927). The idea: call a true rate p *plausible* when the
# share we observed lies within z = 1.96 standard errors of it, with the standard error computed at p
# itself, √(p(1 − p)/n), not at the observed share. The plausible p form an interval; squaring the
# condition turns it into a quadratic inequality in p, and the interval's ends are the quadratic's two
# roots. (The textbook interval, observed share ± 1.96 standard errors taken at the observed share,
# collapses to a single point for 0 of 10 or 10 of 10, as if we were certain; the benchmark's
# simulation, shown in section 8, finds it holding a true rate of 2% only a third of the time with
# 20 questions.)
#
# **Your turn (build).** Write `wilson_interval(right, n, z)` returning (low, high) as fractions.
# Worked numbers to aim at: 18 of 100 gives (0.1170, 0.2667); 0 of 10 gives (0, 0.2775); 10 of 10 gives
# (0.7225, 1).

# %%
#| export
# Your turn - Exercise 13.2 (★★☆, build): the Wilson interval of a share.
def wilson_interval(right: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """(low, high): the Wilson score interval of the share right / n (z = 1.96: 95%)."""
    n = whole_number(n, "n", hint="the number of questions asked")
    right = whole_number(right, "right", low=0, high=n, hint="a count between 0 and n")
    z = real_number(z, "z", low=0.0, low_open=True)
    ### BEGIN SOLUTION
    p, z2 = right / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)
    ### END SOLUTION


# %%
from transformer_course.checks.evaluation import check_wilson_interval

wilson_interval = check_wilson_interval(wilson_interval).use

# %% [markdown]
# Check the promise by simulation: draw 2,000 sets of 100 questions from a model whose true rate is
# 19%, and count how often the interval of each set holds 19%.

# %%
g = torch.Generator().manual_seed(0)
draws = (torch.rand(2000, 100, generator=g) < 0.19).sum(1).tolist()  # right answers in each set of 100
covered = sum(lo <= 0.19 <= hi for lo, hi in map(lambda r: wilson_interval(r, 100), draws)) / len(draws)
print(f"share of the 2,000 intervals that hold the true 19%: {covered:.1%}")
print("18 of 100:", tuple(round(v, 3) for v in wilson_interval(18, 100)),
      "  20 of 100:", tuple(round(v, 3) for v in wilson_interval(20, 100)))

# %% [markdown]
# About 95%, as built. And the two intervals of 18 and 20 of 100 overlap over almost all their width:
# **100 questions cannot separate 18% from 20%.** The sampling noise of a share is √(p(1 − p)/n), 3.8
# points here, twice as large as the difference; two models that are equally good score 18 and 20 out
# of 100 all the time.
#
# **Predict (Exercise 13.3).** How many questions would a set need so that the 95% interval of a
# share near 19% is ±1 point wide (high − low ≈ 0.02)? Give a whole number; your `wilson_interval`
# can help you search. (Papers that compare models two points apart on a few hundred questions are
# worth reading with this number in mind.)

# %%
# Your turn - Exercise 13.3 (★☆☆, predict): questions needed for ±1 point.
def questions_needed() -> int:
    """How many questions make the 95% interval of a share near 19% about ±1 point wide?"""
    ### BEGIN SOLUTION
    return 5900
    ### END SOLUTION


from transformer_course.checks.evaluation import check_questions_needed

check_questions_needed(questions_needed)


def width(n: int) -> float:
    low, high = wilson_interval(round(0.19 * n), n)
    return high - low


print("the first multiple of 100 whose interval is at most 2 points wide:",
      next(n for n in range(100, 20_000, 100) if width(n) <= 0.02))

# %% [markdown]
# ## 4. What a model that knows nothing scores
#
# A score needs a floor to stand on. Two baselines cost nothing: **chance** (pick one of the possible
# answers uniformly) and **majority** (always give the answer most common in the *training* set, then
# score it on the held-out set). `baselines` computes both from the task set; chance counts the
# distinct training answers.

# %%
#| export
def baselines(train: list[Example], held: list[Example]) -> dict[str, float]:
    """{"chance": 1 / the number of distinct training answers, "majority": the held-out share whose answer
    is the training set's most common one}."""
    if not train or not held:
        raise ValueError("baselines need training and held-out examples")
    counts = collections.Counter(e.answer for e in train)
    top = counts.most_common(1)[0][0]
    return {"chance": 1 / len(counts), "majority": sum(e.answer == top for e in held) / len(held)}


# %%
counts = task_counts(chat.model, tok, tasks.held)
print(f"{'kind':8} {'exact match':>12} {'95% interval':>16} {'chance':>7} {'majority':>9}")
for kind, (right, n) in counts.items():
    lo, hi = wilson_interval(right, n)
    floor = baselines(tasks.train[kind], tasks.held[kind])
    print(f"{kind:8} {right / n:12.0%} {f'{lo:.0%} - {hi:.0%}':>16} {floor['chance']:7.1%} {floor['majority']:9.0%}")

# %% [markdown]
# The three string tasks are far above both floors. `count` shows that a floor need not be low: a
# model that always answers the commonest length of the training words scores 23%, and one that picks
# one of the five lengths at random 20%. And `speaker`, the task chapter 11 called "near chance": its
# interval holds both the chance rate (1 in 8 speakers) and the majority rate (always "Falstaff").
# These 100 lines cannot tell the fine-tuned model from one that guesses.
#
# ## 5. pass@k
#
# Chapter 12 estimated **pass@k**, the chance that at least one of k sampled replies is right, without
# bias from n ≥ k samples per question of which c are right. You wrote that estimator as Exercise 12.8;
# the package's copy is `pass_at_k` here (the same formula), and `pass_counts` samples the replies and
# counts the right ones.

# %%
#| export
def pass_at_k(n: int, c: int, k: int) -> float:
    """Chapter 12's unbiased pass@k (Exercise 12.8): the chance that k of the n samples, c of them right,
    drawn without replacement, hold a right one."""
    n = whole_number(n, "n")
    c, k = whole_number(c, "c", low=0, high=n), whole_number(k, "k", high=n)
    return 1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_counts(model, tok, tasks: list[Example], samples: int = 8, seed: int = 0, max_new_tokens: int = 12
                ) -> list[int]:
    """How many of `samples` replies (temperature 1, drawn with `seed`) to each task are right."""
    generator, prompts = torch.Generator().manual_seed(seed), [t.prompt for t in tasks]
    right = [0] * len(tasks)
    for _ in range(whole_number(samples, "samples")):
        for i, reply in enumerate(answers(model, tok, prompts, max_new_tokens, 1.0, generator)):
            right[i] += is_right(tasks[i], reply)
    return right


# %%
shipped = {name: load_chat_model(shipped=f"shakespeare_{name.lower()}") for name in ("DPO", "GRPO")}
models = {"SFT": chat.model, **{name: m.model for name, m in shipped.items()}}
right_of = {name: pass_counts(m, tok, strange) for name, m in models.items()}  # 8 samples per strange word
for name, right in right_of.items():
    at = {k: sum(pass_at_k(8, c, k) for c in right) / len(right) for k in (1, 4, 8)}
    print(f"{name:5} strange words: pass@1 {at[1]:.0%}  pass@4 {at[4]:.0%}  pass@8 {at[8]:.0%}")

# %% [markdown]
# pass@k rises with k for every model, and the gap between models narrows as k grows: sampling more
# often finds the right reply the weaker model *can* write. An interval for pass@k is harder than for
# a share (its terms are not independent coin flips); a bootstrap over questions, as in section 7,
# gives one.
#
# ## 6. Calibration: does the model know when it is right?
#
# A model's probability for its own answer is useful only if it means what it says: of the answers it
# gives with probability about 0.8, about 80% should be right. A model whose stated probabilities match
# its hit rates is **calibrated**. Checking it takes bins: sort the answers by the probability the model
# gave them, cut [0, 1] into K equal bins, and in each bin compare the mean probability with the share
# right. The plot of one against the other is a **reliability diagram**; a calibrated model's points lie
# on the diagonal.
#
# **Your turn (build).** Write `reliability_bins(confidence, correct, bins)`: confidence [N] (floats in
# [0, 1]) and correct [N] (bools) -> three tensors [K]: the mean confidence in each bin, the share
# right in it, and how many answers fell in it. Bin k holds confidences in [k/K, (k+1)/K); a
# confidence of exactly 1 belongs to the last bin. An empty bin has count 0 and 0 for both means. By
# hand, with K = 2: confidences (0.2, 0.4, 0.9, 1.0), correct (no, yes, yes, yes) give means
# (0.3, 0.95), shares (0.5, 1.0), counts (2, 2).

# %%
#| export
# Your turn - Exercise 13.4 (★★☆, build): a reliability diagram's bins.
def reliability_bins(confidence: torch.Tensor, correct: torch.Tensor, bins: int = 10
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """confidence [N] in [0, 1], correct [N] bool -> (mean confidence [K], share right [K], count [K])
    over K = `bins` equal bins of [0, 1] (1.0 in the last); an empty bin has 0, 0 and count 0."""
    bins = whole_number(bins, "bins")
    if confidence.shape != correct.shape or confidence.dim() != 1:
        raise ValueError(f"confidence and correct must both be [N], got {tuple(confidence.shape)} and "
                         f"{tuple(correct.shape)}")
    ### BEGIN SOLUTION
    which = (confidence.double() * bins).long().clamp(0, bins - 1)
    count = torch.bincount(which, minlength=bins)
    mean_conf = torch.bincount(which, confidence.double(), minlength=bins) / count.clamp(min=1)
    share = torch.bincount(which, correct.double(), minlength=bins) / count.clamp(min=1)
    return mean_conf, share, count
    ### END SOLUTION


# %%
from transformer_course.checks.evaluation import check_reliability_bins

reliability_bins = check_reliability_bins(reliability_bins).use

# %% [markdown]
# Two kinds of answers to bin. The base model answers a question at every character: its most likely
# next character, with its probability. The chat model answers a strange word with a whole reply, whose
# probability is the product of its tokens' (from the same teacher-forced log-probabilities as
# chapter 12's DPO). The single number under each diagram, the **expected calibration error**, is the
# gap between the two curves weighted by each bin's share of the answers.

# %%
#| export
@torch.no_grad()
def next_char_confidence(model, ids: torch.Tensor, chars: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [N] in windows of the model's context -> (the probability of the most likely next id [M],
    whether it is the id that follows [M]), M = the windows' predictions."""
    B = model.cfg.block_size
    n = (len(ids) - 1) // B
    if n < 1:
        raise ValueError(f"ids must hold at least block_size + 1 = {B + 1} ids")
    logits = model(ids[: n * B].view(n, B))[0][..., :chars].float()
    top, guess = logits.softmax(-1).max(-1)
    return top.flatten(), guess.flatten() == ids[1 : n * B + 1]


@torch.no_grad()
def reply_confidence(model, tok, tasks: list[Example], max_new_tokens: int = 12
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy replies to `tasks` -> (the probability the model gives each whole reply [N], whether it is
    right [N])."""
    ids = reply_ids(model, tok, [t.prompt for t in tasks], max_new_tokens)
    x, y = conversation_batch(tok, [t.prompt for t in tasks], ids)
    confidence = reply_logprobs(model, x, y).sum(-1).exp()
    texts = [tok.decode(r[:-1] if r[-1:] == [tok.end_id] else r) for r in ids]
    return confidence, torch.tensor([is_right(t, r) for t, r in zip(tasks, texts, strict=True)])


def calibration_error(mean_conf: torch.Tensor, share: torch.Tensor, count: torch.Tensor) -> float:
    """Expected calibration error: |share − mean confidence| of each bin, weighted by its count."""
    return float((count * (share - mean_conf).abs()).sum() / count.sum())


# %%
def reliability_plot(ax, confidence, correct, title):
    mean_conf, share, count = reliability_bins(confidence, correct, 10)
    used = count > 0
    ax.plot([0, 1], [0, 1], "--", color="grey", label="calibrated")
    spans = [wilson_interval(round(float(s * c)), int(c)) for s, c in zip(share[used], count[used], strict=True)]
    errors = [[float(s) - lo for s, (lo, _) in zip(share[used], spans, strict=True)],
              [hi - float(s) for s, (_, hi) in zip(share[used], spans, strict=True)]]
    ax.errorbar(mean_conf[used], share[used], yerr=errors, fmt="o-", capsize=3, label="the model (95% interval)")
    ax.bar((torch.arange(10) + 0.5) / 10, count / count.sum(), width=0.09, alpha=0.25, label="share of answers")
    ax.set(xlabel="the model's probability for its answer", ylabel="share of answers right", title=title)
    ax.legend(loc="upper left")
    return calibration_error(mean_conf, share, count)


fig, axes = plt.subplots(1, 2, figsize=(11, 4))
ece_base = reliability_plot(axes[0], *next_char_confidence(base.model, held_ids), "base model: next character")
ece_chat = reliability_plot(axes[1], *reply_confidence(chat.model, tok, strange), "SFT model: strange words")
plt.tight_layout()
plt.show()
print(f"expected calibration error: base model {ece_base:.2f}, SFT model on strange words {ece_chat:.2f}")

# %% [markdown]
# The base model sits on the diagonal: pretraining minimises cross-entropy, which rewards
# probabilities that match frequencies, and 32,000 predictions make every point precise. The SFT
# model's probabilities for whole replies are informative too: replies it gives under 0.1 are almost
# all wrong, those above 0.9 almost all right. In between it is right *more* often than it says
# (underconfident), but read the error bars: the middle bins hold 20 to 50 replies each, and their
# intervals are up to 37 points wide, so only the overall shape is safe to read. Calibration is not a
# given after fine-tuning (GPT-4's technical report found its pretrained model well calibrated on a
# multiple-choice benchmark and the post-trained one less so); it has to be measured. A calibrated probability is worth
# having: an assistant could say "I am not sure" below a threshold, and chapter 12's GRPO could have
# spent its samples on the words the model is unsure of.
#
# ## 7. Chapters 11 and 12, judged again
#
# Chapters 11 and 12 drew conclusions from single numbers. Here are five of them, with their counts
# (A from the shipped SFT model; E from chapter 11's benchmark; B to D from chapter 12's preference
# benchmark as it was measured from the SFT model shipped up to version 0.3.0, one seed a run, kept in
# `benchmarks/results/archive/`):
#
# | claim | first | second |
# |---|---:|---:|
# | A: SFT answers "who says" better than chance (1 in 8) | 17 / 100 | chance 12.5% |
# | B: DPO β = 0.1 beats DPO β = 0.5 (both with the SFT term), strange words | 310 / 400 | 297 / 400 |
# | C: GRPO beats DPO β = 0.1, strange words | 362 / 400 | 310 / 400 |
# | D: GRPO without its KL term forgot counting (seed 1) | 71 / 100 | 91 / 100 (with it) |
# | E: full SFT of 250 steps reverses better than 100 steps | 12 / 100 | 0 / 100 |
#
# **Interpret (Exercise 13.5).** For each claim, say whether the two 95% Wilson intervals are apart
# (no overlap; for A, whether the interval of 17/100 leaves out 12.5%). Return a dict {"A": bool, ...}.

# %%
# Your turn - Exercise 13.5 (★★☆, predict): which comparisons the questions can support.
def intervals_apart() -> dict[str, bool]:
    """{claim: whether the two 95% intervals are apart} for claims A to E of the table above."""
    ### BEGIN SOLUTION
    return {"A": False, "B": False, "C": True, "D": True, "E": True}
    ### END SOLUTION


from transformer_course.checks.evaluation import check_intervals_apart

check_intervals_apart(intervals_apart)

# %% [markdown]
# <details><summary>Claim D (open after you have answered)</summary>
#
# Claim D is the instructive one. Its intervals are apart, yet chapter 12 doubted it, rightly: over three
# seeds of 100 steps from the same SFT model (chapter 12's ladder benchmark, archived beside the preference
# one), the runs with and without the KL term both counted at 98-100%; from the SFT model shipped today,
# at 84-100% with it and 97-100% without. A Wilson interval measures one source of noise, which questions were drawn. It knows nothing of
# the other: which training run you got. Comparisons of *training recipes* need several seeds per arm;
# comparisons of two fixed *models* need only enough questions.
#
# </details>
#
# Separate intervals are also a blunt test. When two models answer the *same* questions, most of the
# noise is shared: a hard question is hard for both. The right interval is that of the difference,
# measured question by question. The **paired bootstrap** gets it by resampling: draw n questions with
# replacement from the n, compute both models' shares on the draw and their difference, repeat a few
# thousand times, and read the 2.5% and 97.5% percentiles of the differences.
#
# **Your turn (extend).** Write `paired_bootstrap(a, b, draws, seed)`: a and b are lists of bools (model
# A and model B right on question i), the result (low, high) of the 95% percentile interval of
# share(a) − share(b). Use your own `random.Random(seed)` so the result repeats.

# %%
import random


# Your turn - Exercise 13.6 (★★★, extend): a paired bootstrap interval for a difference.
def paired_bootstrap(a: list[bool], b: list[bool], draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    ### BEGIN SOLUTION
    rng, n = random.Random(seed), len(a)
    diffs = []
    for _ in range(draws):
        picks = [rng.randrange(n) for _ in range(n)]
        diffs.append(sum(a[i] - b[i] for i in picks) / n)
    diffs.sort()
    return diffs[int(0.025 * draws)], diffs[int(0.975 * draws) - 1]
    ### END SOLUTION


from transformer_course.checks.evaluation import check_paired_bootstrap

paired_bootstrap = check_paired_bootstrap(paired_bootstrap).use

# %% [markdown]
# The shipped DPO and GRPO models, measured here on the same 400 strange words (greedy):

# %%
right = {name: [is_right(t, r) for t, r in zip(strange, answers(m, tok, [t.prompt for t in strange], 12),
                                                strict=True)] for name, m in models.items()}
for first, second in [("GRPO", "DPO"), ("DPO", "SFT")]:
    lo, hi = paired_bootstrap(right[first], right[second])
    gap = (sum(right[first]) - sum(right[second])) / len(strange)
    print(f"{first} - {second}: {gap:+.1%}, paired 95% interval {lo:+.1%} to {hi:+.1%}, excludes 0: {lo > 0 or hi < 0}")
both = sum(x == y for x, y in zip(right["GRPO"], right["DPO"], strict=True))
print(f"GRPO and DPO agree (both right or both wrong) on {both} of {len(strange)} words")

# %% [markdown]
# Both improvements stand, each with an interval that leaves 0 out. The models agree on most words,
# which is why the paired interval is narrower than the two separate intervals suggest.
#
# ## 8. The report card
#
# Everything above, for any course model, is one command. `transformer-course report` measures the
# shipped base, SFT, DPO and GRPO models (or `--checkpoint PATH`: a chapter 06 checkpoint or a chat
# model you saved) and writes an HTML page with its plots embedded, and a Markdown twin: size and
# recipe, held-out bits per character, each task's exact match with its interval and baselines, pass@k,
# the reliability diagram, a few greedy replies and the decode speed on the machine it ran on. The
# stored card of the shipped models is in `benchmarks/results/report_card/`; the course's tests
# regenerate it and fail, naming the figure, when a number moves beyond its tolerance.
#
# **A second opinion.** A number computed by one's own code is worth checking with someone else's.
# `transformer-course report --harness-tasks DIR` writes the card's tasks as an offline task folder
# (a YAML and a JSONL per task) for EleutherAI's lm-evaluation-harness, the tool most open models
# are scored with; run it on chapter 11's Hugging Face export of a model (`transformer-course
# export`). On the shipped models it agrees with the card: the same exact match on every task, and
# the same bits per character to three decimals. One detail it needs: the harness puts a
# beginning-of-text token before every log-likelihood request, and a character model trained on
# plain plays has none, so for the base model the harness is told which to use (its model argument
# `prefix_token_id`, the id of a line break).

# %%
# NBVAL_IGNORE_OUTPUT
# the benchmark's table and the stored report card (make bench rewrites them, on whatever machine runs it)
from pathlib import Path

for stored, lines in [("../benchmarks/results/evaluation.md", 40), ("../benchmarks/results/report_card/report.md", 16)]:
    stored = Path(stored)
    print("\n".join(stored.read_text().splitlines()[:lines]) if stored.exists() else "run make bench", "\n")

# %% [markdown]
# ## Quick check

# %%
from transformer_course.quiz import Question, quiz

quiz([
    Question("Model A scores 18/100, model B 20/100 on the same kind of questions. What can you say?",
             ["B is better", "Nothing yet: the intervals overlap almost entirely", "A is better"],
             answer=1, explain="The sampling noise of a share of 100 is about 4 points, twice the gap."),
    Question("A score on a held-out set is suspiciously high. What do you check first?",
             ["The learning rate", "Whether the set's items occur in any training data (contamination)",
              "The batch size"],
             answer=1, explain="Held out from one stage is not held out from all: measure the overlap."),
    Question("Which number compares a character model with a BPE model fairly?",
             ["Perplexity per token", "Bits per character (or per byte)", "The loss"],
             answer=1, explain="Per token, longer tokens mean a larger number for the same text."),
    Question("A model says 0.9 for answers that are right 60% of the time. It is...",
             ["Overconfident", "Underconfident", "Calibrated"],
             answer=0, explain="Its points would sit below the diagonal of the reliability diagram."),
])

# %% [markdown]
# ## Summary
#
# - A **held-out set** must be held out from every stage of training. Chapter 11's held-out words were
#   all in the base model's training text (a mild **contamination**); on strange words no text holds,
#   the same skills score about half as much.
# - **Bits per character** on held-out plays: about 2.7 for the base model (perplexity about 6.6),
#   worse than a uniform guess for the chat model; every character counted once (you fixed a loop
#   whose answer depended on its batch size). Compare models per character, not per token, and state
#   the protocol.
# - **Exact match** is a share of a sample of questions: give its **Wilson interval** (you wrote it).
#   100 questions give about ±8 points near 20%, so they cannot separate 18% from 20%; ±1 point needs
#   thousands (you worked out how many). Compare a score with the **chance** and **majority** baselines
#   before calling it good.
# - **pass@k** from n samples per question, unbiased (chapter 12's estimator).
# - **Calibration**: the reliability diagram bins the model's own probabilities (you wrote the bins).
#   The base model is calibrated; the SFT model's reply probabilities are informative, and 20-60
#   replies per bin are too few to say more than that.
# - **Re-judged**: an interval covers the questions drawn, not the training seed; two models on the same
#   questions compare best with a **paired bootstrap** (you wrote it): GRPO beats DPO, which beats SFT.
#
# Exported to `transformer_course/evaluation.py`: `seen_in`, `heldout_bits`, `wilson_interval`,
# `baselines`, `task_counts`, `pass_at_k`, `pass_counts`, `reliability_bins`, `next_char_confidence`,
# `reply_confidence`, `calibration_error`.
