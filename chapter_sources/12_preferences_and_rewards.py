# %% [markdown]
# # 12 · Preferences and rewards: DPO, and reinforcement learning with a reward a program checks
#
# > Teach chapter 11's assistant with judgements instead of answers: DPO on pairs of its own replies
# > (one better, one worse) against a frozen reference, and GRPO, reinforcement learning from groups of
# > sampled replies scored by a checker, with a clipped objective and a KL leash.
#
# Chapter 11's assistant learned from answers someone wrote down. Much of what today's assistants learn
# after that stage is taught differently: people (or programs) **judge** replies the model itself wrote,
# and the model is pushed towards the better ones. Two widely used ways of doing it: **DPO** (Rafailov et
# al., 2023) learns from pairs, a preferred and a rejected reply to one prompt, with no reward model and
# no sampling while training. **Reinforcement learning with a verifiable reward** (RLVR) samples a group
# of replies per prompt, scores each with a checker (is the arithmetic right? does the code pass its
# tests?), and makes the better ones more likely; **GRPO** (Shao et al., 2024, DeepSeekMath) is the
# version DeepSeek-R1 used (nanochat's RL script starts from it and strips it down: no clip, no KL
# term, and advantages not divided by the standard deviation).
#
# **In this chapter you will** find what supervised fine-tuning left undone (strange words), build
# preference pairs from the model's own replies, write the DPO loss (Exercise 12.1), predict its first
# value (12.2), fix a reply's log-probability that depends on its neighbours (12.3), gather the four
# numbers DPO compares for a batch of pairs (12.4), train with DPO and see what β does; then write
# GRPO's group-relative advantages (12.5) and its clipped objective with a KL term (12.6), see the
# ladder of simpler losses GRPO grew from measured over three seeds, train with a checker, predict what
# GRPO does against a checker with a hole before watching it happen (12.7), estimate pass@k without
# bias (12.8), predict what a baseline made of
# the group does to the gradient before measuring it (12.9) and what exact policy gradient does with a
# hole in the checker (12.10), and say what the ladder's three seeds support (12.11). The trained models
# answer in `transformer-course chat`.
#
# **You need** chapter 11 (the chat format, `render_chat`, `sft_targets`, `answers`, the instruction
# set), chapter 07 (sampling with a temperature) and chapter 06 (AdamW, gradient clipping).

# %%
#| default_exp preferences

# %%
import copy
import math
from pathlib import Path

import matplotlib.pyplot as plt
import torch

from transformer_course.assistant import answers, exact_match, make_tasks, save_chat_model
from transformer_course.course_model import (
    DPO_BETA,
    DPO_LR,
    DPO_SFT_WEIGHT,
    GRPO_KL,
    GRPO_LR,
    load_chat_model,
    manifest,
)
from transformer_course.data import load_shakespeare

torch.set_printoptions(precision=4, sci_mode=False)
torch.manual_seed(0)
chat = load_chat_model()  # chapter 11's shipped SFT model (SHA-256 checked)
sft, tok = chat.model, chat.tokenizer
tasks = make_tasks(load_shakespeare())  # chapter 11's instruction set: its held-out split measures forgetting
print(f"{sft.num_parameters():,} parameters,", tok.vocab_size, "ids")

# %% [markdown]
# ## 1. What fine-tuning left undone: words it never read
#
# Chapter 11's model reverses and upper-cases the plays' words almost perfectly. Give it strings no play
# contains and it stumbles: it learned the skill on real words, and on these strings it drops, repeats
# or adds letters.

# %%
for prompt in ["reverse: gentle", "reverse: qzkvb", "upper: mirth", "upper: xqjwb"]:
    print(f"{prompt:16} -> {answers(sft, tok, [prompt])[0]}")

# %% [markdown]
# That is a good place for feedback instead of answers. A program knows the right reply to any string
# (a **verifiable** task), so it can judge whatever the model writes, on as many fresh strings as we
# like. `strange_words` draws such tasks (random lowercase strings of 3 to 7 letters, upper-casing or
# reversing), deterministically for a seed; `is_right` is the checker.

# %%
#| export
"""Preferences (chapter 12): tasks on strange words whose answers a program checks, pairs of the model's
own replies (one right, one wrong), and DPO, which trains on such pairs against a frozen reference.
Shapes: B conversations, T positions."""

import math
import random
import string
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from transformer_course.arguments import real_number, whole_number
from transformer_course.assistant import (
    IGNORE,
    SPECIALS,
    ChatTokenizer,
    Example,
    answers,
    render_chat,
    sft_targets,
    word_task,
)
from transformer_course.model import GPT

STRANGE_KINDS = ("upper", "reverse")  # the word tasks chapter 11's model gets wrong on unseen strings
MAX_REPLY = 12  # the longest reply sampled: a right answer is at most 7 characters and <|end|>


def strange_words(n: int, seed: int = 0, kinds: tuple[str, ...] = STRANGE_KINDS,
                  avoid: frozenset[str] = frozenset()) -> list[Example]:
    """`n` tasks (kind drawn from `kinds`) on random lowercase strings of 3 to 7 letters, none of them in
    `avoid`: words no play holds, each with its one right answer. The same n and seed give the same list."""
    rng = random.Random(whole_number(seed, "seed", low=0))
    tasks: list[Example] = []
    while len(tasks) < whole_number(n, "n", low=0):
        word = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 7)))
        if word not in avoid:
            tasks.append(word_task(rng.choice(kinds), word))
    return tasks


def is_right(task: Example, reply: str) -> bool:
    """The checker: the reply is the task's one right answer, exactly."""
    return reply == task.answer

# %% [markdown]
# Four hundred held-out strange words (seed 1234) measure the model from here on. **Greedy accuracy** is
# the share it gets right when it always takes the likeliest token; **pass@1** is the share a reply
# *sampled* at temperature 1 gets right, averaged over four samples per word: the number reinforcement
# learning works on, since it learns from samples.

# %%
#| export
HELD_OUT_SEED = 1234  # the seed of the held-out strange words every result of chapter 12 is measured on


def accuracy(model: GPT, tok: ChatTokenizer, tasks: list[Example]) -> float:
    """The share of `tasks` whose greedy reply `is_right`."""
    return sum(map(is_right, tasks, answers(model, tok, [t.prompt for t in tasks], MAX_REPLY))) / len(tasks)


def pass_at_1(model: GPT, tok: ChatTokenizer, tasks: list[Example], samples: int = 4, seed: int = 0) -> float:
    """The share of replies sampled at temperature 1 that are right: `samples` per task, drawn with `seed`."""
    generator, right = torch.Generator().manual_seed(seed), 0
    prompts = [t.prompt for t in tasks]
    for _ in range(whole_number(samples, "samples")):
        right += sum(map(is_right, tasks, answers(model, tok, prompts, MAX_REPLY, 1.0, generator)))
    return right / (samples * len(tasks))

# %%
held = strange_words(400, seed=HELD_OUT_SEED)
HELD_WORDS = frozenset(t.prompt.split(": ", 1)[1] for t in held)  # never trained on
print(held[:3])
sft_greedy, sft_pass1 = accuracy(sft, tok, held), pass_at_1(sft, tok, held)
recorded = manifest("shakespeare_grpo")["before"]  # what the shipped builds measured (machine in the manifest)
print(f"SFT model on held-out strange words: greedy {recorded['greedy']:.1%}, pass@1 {recorded['pass_at_1']:.1%}")
print("measured here within a point of that:",
      abs(sft_greedy - recorded["greedy"]) <= 0.01 and abs(sft_pass1 - recorded["pass_at_1"]) <= 0.01)

# %% [markdown]
# ## 2. Pairs of the model's own replies
#
# A preference is a triple: a prompt, a **chosen** reply and a **rejected** one. Here the model writes
# both: four replies per training word, sampled at temperature 1; where some are right and some wrong,
# the first right one is chosen and the first wrong one rejected. Words it always gets right, or always
# wrong, give no pair: a pair must say which of two replies *it could have written* is better. (People
# rank replies the same way in RLHF data; here the checker ranks them, so the pairs are built offline,
# deterministically, in seconds.)

# %%
#| export
@dataclass(frozen=True)
class Pair:
    """A preference: the `chosen` reply to `prompt` is better than the `rejected` one."""

    prompt: str
    chosen: str
    rejected: str


def preference_pairs(model: GPT, tok: ChatTokenizer, tasks: list[Example], samples: int = 4, seed: int = 0,
                     check=is_right) -> list[Pair]:
    """One Pair per task whose `samples` replies (temperature 1, drawn with `seed`) include a right one and
    a wrong one by `check(task, reply)`: the first right as chosen, the first wrong as rejected. Replies
    holding a turn marker are left out."""
    generator = torch.Generator().manual_seed(seed)
    prompts = [t.prompt for t in tasks]
    drawn = [answers(model, tok, prompts, MAX_REPLY, 1.0, generator) for _ in range(whole_number(samples, "samples"))]
    pairs = []
    for i, task in enumerate(tasks):
        replies = [d[i] for d in drawn if not any(s in d[i] for s in SPECIALS)]
        right = [r for r in replies if check(task, r)]
        wrong = [r for r in replies if not check(task, r)]
        if right and wrong:
            pairs.append(Pair(task.prompt, right[0], wrong[0]))
    return pairs

# %%
train_words = strange_words(600, seed=1, avoid=HELD_WORDS)
pairs = preference_pairs(sft, tok, train_words)
print("between a fifth and a half of the words give a pair:", 0.2 < len(pairs) / len(train_words) < 0.5)
print("every chosen reply right, every rejected one wrong:",
      all(p.chosen == t.answer != p.rejected for p in pairs for t in train_words if t.prompt == p.prompt))

# %%
# NBVAL_IGNORE_OUTPUT
# sampled replies: the exact pairs can differ in the last bits of a probability from one CPU to another
print(f"{len(pairs)} pairs from {len(train_words)} words, e.g.")
for p in pairs[:3]:
    print(f"  {p.prompt:16} chosen {p.chosen!r:10} rejected {p.rejected!r}")

# %% [markdown]
# ## 3. The DPO loss
#
# RLHF's classic recipe (Ouyang et al., 2022) first fits a **reward model** r(x, y) to the preferences,
# then maximises it with reinforcement learning while a KL penalty keeps the policy π near the SFT
# model π_ref. DPO starts from a known result, that the best policy for that objective has a closed
# form, π(y|x) ∝ π_ref(y|x) · exp(r(x, y)/β), and turns it round: the reward can be read off the policy
# itself,
#
# $$r(x, y) = \beta \log \frac{\pi(y \mid x)}{\pi_\text{ref}(y \mid x)} \;(+\text{ a term of } x \text{ alone}),$$
#
# the **implicit reward**. The Bradley-Terry model says how likely a person is to prefer one reply to
# another: P(chosen ≻ rejected) = σ(r_chosen − r_rejected), with σ the logistic function. DPO fits the
# policy so that the preferences people recorded are as likely as possible under that model, with the
# implicit reward in place of r. log π(y) is the sum of the log-probabilities of the reply's tokens (its
# `<|end|>` included) given the prompt. The reference is frozen; only π trains. No reward model, no
# sampling while training: a classification loss on pairs.
#
# **Your turn.** Write `dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta)`: four
# tensors [B] of summed log-probabilities to (the mean loss over the pairs, the margins [B]), where a
# pair's **margin** is its chosen reply's implicit reward minus its rejected reply's. No formula here:
# put the implicit reward into Bradley-Terry and write the negative log-likelihood of a pair. Two things
# to think about: what happens to the "term of x alone", and why `F.logsigmoid` is safer than
# `torch.log(torch.sigmoid(...))` when a margin is large and negative.
#
# **By hand**, to test yourself: one pair, β = 0.5; the policy gives the chosen reply log-probability
# −2.0 and the rejected −3.0, the reference gives the chosen −2.5 and the rejected −2.0. The loss is
# 0.3869 (the cell after the exercise prints yours).

# %%
#| export
# Your turn - Exercise 12.1 (★★☆, build): the DPO loss.
def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed reply log-probabilities [B] under the policy and the reference -> (mean DPO loss, margins [B]):
    a margin is the chosen reply's implicit reward minus the rejected reply's."""
    ### BEGIN SOLUTION
    margins = beta * ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected))  # (B,)
    return -F.logsigmoid(margins).mean(), margins
    ### END SOLUTION

# %%
from transformer_course.checks.preferences import (
    check_clipped_objective,
    check_ladder_claims,
    check_predict_group_baseline,
    check_predict_hasty_run,
    check_predict_hasty_toy,
    check_dpo_loss,
    check_group_advantages,
    check_pair_logprobs,
    check_pass_at_k,
    check_predict_first_dpo_loss,
    check_reply_logprobs,
)

dpo_loss = check_dpo_loss(dpo_loss).use
loss, margins = dpo_loss(torch.tensor([-2.0]), torch.tensor([-3.0]), torch.tensor([-2.5]), torch.tensor([-2.0]), 0.5)
print(f"the worked example: loss {loss.item():.4f}, margin {margins.item():.2f}")

# %% [markdown]
# **Predict (Exercise 12.2).** Training starts with the policy a copy of the reference. What is the DPO
# loss of the very first batch, whatever the pairs and whatever β? Answer with a number to 3 decimals.

# %%
# Your turn - Exercise 12.2 (★☆☆, predict): the first DPO loss.
def my_prediction() -> float:
    ### BEGIN SOLUTION
    return round(math.log(2), 3)
    ### END SOLUTION


check_predict_first_dpo_loss(my_prediction)

# %% [markdown]
# ## 4. Training with DPO
#
# A batch puts each prompt with its reply as one conversation (`conversation_batch`, padded with
# `<|end|>`, targets on the reply only, as chapter 11's SFT mask). The chosen and the rejected replies
# of a batch go through the model together, as one batch of 2B.

# %%
#| export
def text_ids(tok: ChatTokenizer, reply: str) -> list[int]:
    """A reply's text -> its ids and the <|end|> that closes it."""
    return tok.encode(reply) + [tok.end_id]


def conversation_batch(tok: ChatTokenizer, prompts: list[str], replies: list[list[int]]
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each prompt (rendered with the generation prompt) followed by its reply's ids -> (x [B, T], y [B, T]):
    padded with <|end|> to the longest, targets the reply's tokens (`sft_targets`) and IGNORE elsewhere."""
    rows = []
    for prompt, reply in zip(prompts, replies, strict=True):
        ids = render_chat([{"role": "user", "content": prompt}], tok, generation_prompt=True)[0]
        rows.append((ids + list(reply), [False] * len(ids) + [True] * len(reply)))
    x = torch.full((len(rows), max(len(ids) for ids, _ in rows)), tok.end_id, dtype=torch.long)
    y = torch.full_like(x, IGNORE)
    for i, (ids, is_reply) in enumerate(rows):
        x[i, : len(ids)] = torch.tensor(ids)
        y[i, : len(ids)] = torch.tensor(sft_targets(ids, is_reply))
    return x, y

# %% [markdown]
# DPO needs log π(y | x) of each reply: the log-probability the model gives each target token, summed
# over the reply. Here is a version found in a hurry. A reply's log-probability cannot depend on which
# other conversations share its batch; this one does.

# %%
def reply_logprobs_buggy(model, x, y):
    logits = model(x)[0].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, y.clamp(min=0).unsqueeze(-1)).squeeze(-1)


alone = conversation_batch(tok, ["upper: kind"], [text_ids(tok, "KIND")])
together = conversation_batch(tok, ["upper: kind", "reverse: gentleman"],
                              [text_ids(tok, "KIND"), text_ids(tok, "namelteng")])
with torch.no_grad():
    a, b = reply_logprobs_buggy(sft, *alone)[0].sum(), reply_logprobs_buggy(sft, *together)[0].sum()
print(f"log π(KIND | upper: kind) alone {a:.2f}, beside a longer conversation {b:.2f}")

# %% [markdown]
# **Your turn (debug).** Find why, and write the fixed `reply_logprobs(model, x, y)`: x, y [B, T] to
# the log-probability of each target token [B, T], in float32, and exactly 0 where the target is
# `IGNORE`, so that a sum over T is the reply's log-probability and nothing else.

# %%
#| export
# Your turn - Exercise 12.3 (★★☆, debug): the log-probabilities of a reply's tokens.
def reply_logprobs(model: GPT, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x, y [B, T] -> the log-probability of each target token [B, T] (float32; 0 where y is IGNORE)."""
    logits = model(x)[0].float()  # (B, T, V)
    ### BEGIN SOLUTION
    # chapter 06's cross-entropy, one number per position: −log p(target), and 0 where the target is IGNORE
    return -F.cross_entropy(logits.transpose(1, 2), y, ignore_index=IGNORE, reduction="none")  # (B, T)
    ### END SOLUTION

# %%
reply_logprobs = check_reply_logprobs(reply_logprobs).use
with torch.no_grad():
    a, b = reply_logprobs(sft, *alone)[0].sum(), reply_logprobs(sft, *together)[0].sum()
print(f"log π(KIND | upper: kind) alone {a:.2f}, beside a longer conversation {b:.2f}")

# %% [markdown]
# A DPO step needs four numbers per pair, the ones `dpo_loss` takes: the chosen and the rejected
# reply's log-probability, each under the policy and under the reference. The batch of 2B
# conversations `dpo` builds holds the B prompts with their chosen replies first, then the same B
# prompts, in the same order, with their rejected replies.
#
# The two models are not treated alike. The policy is what trains: its two numbers feed a loss that
# is differentiated, so the way back to its weights must stay open. The reference is frozen: it is only
# read, nothing may ever push its weights, and a training step has no use for the record autograd
# would keep of its forward pass (as large as the policy's, so it would double the activation memory
# of every step for nothing).
#
# **Your turn (build).** Write `pair_logprobs(policy, reference, x, y)`: x, y [2B, T] as
# `conversation_batch` builds them for DPO, to (policy_chosen, policy_rejected, ref_chosen,
# ref_rejected), each [B], one number per reply: log π(reply | prompt), its `<|end|>` included. The
# training loop below calls your function at every step.

# %%
#| export
# Your turn - Exercise 12.4 (★★☆, build): the four log-probabilities of a batch of pairs.
def pair_logprobs(policy: GPT, reference: GPT, x: torch.Tensor, y: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x, y [2B, T]: B prompts with their chosen replies, then the same B prompts with the rejected ones
    -> (policy_chosen, policy_rejected, ref_chosen, ref_rejected), each [B]: each reply's
    log-probability given its prompt, under the policy (with a gradient) and the frozen reference
    (no gradient, no graph kept)."""
    if x.shape != y.shape or x.dim() != 2 or x.shape[0] % 2:
        raise ValueError(f"x and y must be [2B, T] (chosen, then rejected), got {tuple(x.shape)} and {tuple(y.shape)}")
    ### BEGIN SOLUTION
    with torch.no_grad():  # frozen: no gradient reaches it, and no graph is built for its forward pass
        ref_chosen, ref_rejected = reply_logprobs(reference, x, y).sum(-1).chunk(2)  # (B,) each
    policy_chosen, policy_rejected = reply_logprobs(policy, x, y).sum(-1).chunk(2)  # (B,) each
    return policy_chosen, policy_rejected, ref_chosen, ref_rejected
    ### END SOLUTION

# %%
pair_logprobs = check_pair_logprobs(pair_logprobs).use
pair_x, pair_y = conversation_batch(tok, ["upper: kind"] * 2, [text_ids(tok, "KIND"), text_ids(tok, "DNIK")])
four = pair_logprobs(copy.deepcopy(sft), sft, pair_x, pair_y)  # the policy starts as a copy of the reference
print(f"upper: kind -> chosen 'KIND' {four[0].item():.2f}, rejected 'DNIK' {four[1].item():.2f} (log π)")
print("a copy of the reference gives the reference's numbers:",
      all(abs(p.item() - r.item()) < 1e-4 for p, r in zip(four[:2], four[2:], strict=True)))
print("the policy's carry a gradient:", four[0].requires_grad, "| the reference's:", four[2].requires_grad)

# %%
#| export
def descend(model: GPT, optimizer: torch.optim.Optimizer, loss: torch.Tensor, what: str) -> None:
    """One optimizer step down `loss` (gradients clipped to norm 1, as chapter 06 does); a loss that is not
    finite stops training with a FloatingPointError naming `what`."""
    if not math.isfinite(loss.item()):
        raise FloatingPointError(f"the {what} loss is {loss.item()}: lower the learning rate")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def dpo(policy: GPT, reference: GPT, tok: ChatTokenizer, pairs: list[Pair], steps: int, beta: float = 0.1,
        lr: float = 2e-5, batch_size: int = 32, sft_weight: float = 0.0, seed: int = 0,
        progress: bool = False) -> dict[str, list[float]]:
    """`steps` AdamW steps of `dpo_loss` on batches of `pairs` drawn with `seed`; `reference` stays frozen.
    `sft_weight` > 0 adds that times the chosen replies' mean cross-entropy per token (chapter 11's SFT
    loss on the preferred replies). Returns, per step: loss (the DPO loss), accuracy (share of margins
    > 0), and the mean implicit rewards of the chosen and the rejected replies, beta · (log π − log π_ref)."""
    from tqdm.auto import tqdm

    beta = real_number(beta, "beta", low=0, low_open=True)
    sft_weight = real_number(sft_weight, "sft_weight", low=0)
    if not pairs:
        raise ValueError("no preference pairs: every task was always right or always wrong; draw more tasks")
    reference.eval()  # frozen: your pair_logprobs reads it without a graph
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=0.0)
    rng, history = random.Random(seed), {"loss": [], "accuracy": [], "chosen": [], "rejected": []}
    policy.train()
    for _ in tqdm(range(whole_number(steps, "steps")), disable=not progress, desc="DPO"):
        batch = rng.sample(pairs, min(batch_size, len(pairs)))
        x, y = conversation_batch(tok, [p.prompt for p in batch] * 2, [text_ids(tok, p.chosen) for p in batch]
                                  + [text_ids(tok, p.rejected) for p in batch])
        pol_chosen, pol_rejected, ref_chosen, ref_rejected = pair_logprobs(policy, reference, x, y)  # (B,) each
        loss, margins = dpo_loss(pol_chosen, pol_rejected, ref_chosen, ref_rejected, beta)
        chosen_tokens = (y != IGNORE).sum(dim=1).chunk(2)[0]  # (B,)
        descend(policy, optimizer, loss - sft_weight * (pol_chosen / chosen_tokens).mean(), "DPO")  # + w · CE/token
        history["loss"].append(loss.item())
        history["accuracy"].append((margins > 0).float().mean().item())
        history["chosen"].append(beta * (pol_chosen - ref_chosen).mean().item())
        history["rejected"].append(beta * (pol_rejected - ref_rejected).mean().item())
    return history

# %% [markdown]
# **A known failure, and the guard this course uses.** DPO only asks the *margin* to grow, and it can grow
# while *both* replies become less likely, the chosen one less fast. The probability goes elsewhere, to
# replies that were in no pair, and greedy decoding can get worse at the very thing preferred ("likelihood
# displacement", Razin et al. 2024). Pure DPO at β = 0.1 does exactly that on these pairs. In the
# benchmark below (one run per setting) its chosen replies end *less* likely than under the reference,
# greedy accuracy on the strange words falls from 55.5% to 37.0% where the guarded run rises to 85.2%,
# and upper-casing and reversing real words fall from 100% and 99% to 65% and 59%. The guard used
# here, as in Llama 3's recipe and Pang et al. (2024), adds chapter 11's SFT loss on the chosen replies to
# the DPO loss: `dpo(..., sft_weight=1.0)` keeps the chosen replies likely while the margin grows.
#
# Forty steps here, on the pairs above (well under a minute on a CPU); the shipped DPO model below trained
# longer, on pairs from more words.
# Four curves tell how it goes: the loss, the **preference accuracy** (the share of pairs whose margin is
# positive: the policy prefers the chosen reply more than the reference did), and the implicit rewards
# of the chosen and the rejected replies.

# %%
torch.manual_seed(0)
policy = copy.deepcopy(sft)
history = dpo(policy, sft, tok, pairs, steps=40, beta=DPO_BETA, lr=DPO_LR, sft_weight=DPO_SFT_WEIGHT)
fig, axes = plt.subplots(1, 3, figsize=(12, 3))
zero_margins = dpo_loss(*[torch.zeros(1)] * 4, DPO_BETA)[0].item()  # your dpo_loss, the policy = the reference
axes[0].plot(history["loss"], label="DPO loss")
axes[0].axhline(zero_margins, ls=":", c="gray", label="every margin 0")
axes[1].plot(history["accuracy"], label="preference accuracy")
axes[2].plot(history["chosen"], label="chosen")
axes[2].plot(history["rejected"], label="rejected")
for ax, name in zip(axes, ["loss", "share of pairs", "implicit reward β·log π/π_ref"], strict=True):
    ax.set_xlabel("step")
    ax.set_ylabel(name)
    ax.legend()
plt.tight_layout()
plt.show()
print("the first loss is that of zero margins (Exercise 12.2):", abs(history["loss"][0] - zero_margins) < 1e-4)
print("the rejected replies' reward fell below the chosen ones':",
      sum(history["rejected"][-10:]) < sum(history["chosen"][-10:]))

# %% [markdown]
# The shipped DPO model trained the same way for longer, on pairs from more words (`tools/
# build_course_model.py shakespeare_preferences`; its manifest says the steps, the machine and the time).
# Two numbers judge it: the **preferred behaviour** (a right reply on held-out strange words) should rise,
# and chapter 11's held-out **exact match** (real words, and who says a line) should not fall: a
# preference run that wrecks what SFT taught has failed, whatever its loss says.

# %%
dpo_model = load_chat_model(shipped="shakespeare_dpo")
shipped = dpo_model.manifest
print(f"DPO: {shipped['steps']} steps, beta {shipped['beta']}, lr {shipped['lr']}, {shipped['pairs']} pairs")
print(f"held-out strange words, greedy: SFT {recorded['greedy']:.1%} -> DPO {shipped['after']['greedy']:.1%}")
print("chapter 11's held-out exact match, SFT -> DPO:")
for kind, before in shipped["exact_match_before"].items():
    print(f"  {kind:8} {before:5.0%} -> {shipped['exact_match_after'][kind]:5.0%}")
print("measured here as recorded:", abs(accuracy(dpo_model.model, tok, held) - shipped["after"]["greedy"]) <= 0.01)

# %% [markdown]
# **What β does.** β scales the implicit reward, so it sets how far the policy must move for a given
# margin. With a small β the policy must move a long way from the reference before the loss is
# satisfied: more change, more risk to what SFT taught. With a large β a small move already gives a large
# margin, the loss saturates early and the policy stays near the reference. The benchmark below trained
# the same pairs at two β, with and without the SFT term, and measured both numbers (`make bench`; the
# table names its machine).

# %%
# NBVAL_IGNORE_OUTPUT
# the benchmark's stored table (make bench rewrites it, on whatever machine runs it)
results = Path("../benchmarks/results/preferences.md")
print(results.read_text() if results.exists() else "run `make bench` to measure DPO by beta and GRPO by step")

# %% [markdown]
# ## 5. A reward a program checks: GRPO
#
# DPO learned from pairs collected once, from the SFT model. Reinforcement learning keeps sampling from
# the model *as it learns*: each step draws fresh strange words, samples a **group** of G replies to each
# at temperature 1, and the checker gives each reply a reward, 1 if right and 0 if not. No one wrote an
# answer down; the reward is the only signal.
#
# **Advantages relative to the group.** A reply should be pushed up if it did better than the model's
# other tries at the same prompt, and down if worse. PPO (Schulman et al., 2017), as RLHF uses it, learns
# a value network to say what "expected" is; GRPO just uses the group. It asks three things of the
# advantages of one prompt's G replies: they **sum to zero** (as much pushed up as down), they are on
# **the same scale for every prompt** (an easy prompt and a hard one push equally hard: their spread is
# 1, measured by the population standard deviation, over G, which this course uses; some implementations
# divide by G − 1 instead), and a group whose rewards are all equal gets **zeros**, without dividing by
# zero (a small `eps` = 1e-4 is added where it is needed).
#
# **Your turn.** Write `group_advantages(rewards, eps)`: rewards [P, G] (P prompts, G replies each) to
# advantages [P, G], each row on its own, meeting the three requirements. By hand, to test yourself: the
# rewards [1, 0, 0, 0] give advantages [1.732, −0.577, −0.577, −0.577] (the cell after the exercise
# prints yours), and [1, 1, 1, 1] gives four zeros.

# %%
#| export rewards
"""Reinforcement learning with a verifiable reward (chapter 12): groups of replies sampled from the
policy and scored by a checker, advantages relative to the group, and GRPO's clipped objective with a
KL term to a frozen reference. Shapes: P prompts, G replies per prompt, N = P·G, T positions."""

import random
from dataclasses import dataclass

import torch

from transformer_course.arguments import choice, real_number, whole_number
from transformer_course.assistant import IGNORE, ChatTokenizer, Example, reply_ids
from transformer_course.model import GPT
from transformer_course.preferences import (
    MAX_REPLY,
    conversation_batch,
    descend,
    is_right,
    strange_words,
)
from transformer_course.preferences import reply_logprobs as _package_logprobs  # the notebook keeps yours (12.3)


# Your turn - Exercise 12.5 (★☆☆, build): advantages relative to the group.
def group_advantages(rewards: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """rewards [P, G] -> advantages [P, G], each row on its own: summing to zero, with a population spread
    of 1 (up to eps), and zeros for a row of equal rewards."""
    ### BEGIN SOLUTION
    mean = rewards.mean(dim=1, keepdim=True)  # (P, 1)
    std = rewards.std(dim=1, keepdim=True, correction=0)  # (P, 1)
    return (rewards - mean) / (std + eps)
    ### END SOLUTION

# %%
group_advantages = check_group_advantages(group_advantages).use
print(group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])))

# %% [markdown]
# **The clipped objective.** With the advantages fixed, GRPO takes a few gradient steps on one batch of
# samples. After the first, the policy π is no longer the π_old that sampled them, so each token's
# log-probability is weighted by the ratio ρ = π/π_old, and PPO's **clip** stops any token's ratio from
# paying off beyond [1 − ε, 1 + ε]: min(ρA, clip(ρ, 1 − ε, 1 + ε)A). A **KL term** keeps the policy near
# the reference (the SFT model), estimated per token by k3 = e^d − d − 1 with d = log π_ref − log π,
# which is never negative. Its *value* is an unbiased estimate of KL(π‖π_ref) when the tokens are sampled
# from π itself (Schulman's 2020 note on KL approximators).
#
# A caveat on k3 as a loss: it is differentiated with the sampled tokens held fixed, and then its
# expected gradient, token by token, is not the gradient of KL(π‖π_ref) but that of the other direction,
# KL(π_ref‖π). An unbiased estimate of a number need not give an unbiased estimate of its gradient, as
# later analyses of the KL term in GRPO-style training point out. Both divergences are zero only at
# π = π_ref, so the term still pulls the policy back towards the reference, but it is not quite the pull
# the formula names.
#
# Each reply's tokens are averaged, then the replies (GRPO's choice; Dr. GRPO, Liu et al. 2025, argues
# for dividing by a constant instead, so long wrong replies are not punished less per token).
#
# **Your turn.** Write `clipped_objective(logp, logp_old, logp_ref, advantages, mask, clip, kl_coef)`:
# three [N, T] log-probability tensors (the policy's with a gradient, the sampler's and the reference's,
# without), the advantages [N], the reply mask [N, T] (True on reply tokens), to the scalar loss that
# gradient *descent* minimises. Assemble it from the pieces above; nothing here writes it out whole.
# Decide what is rewarded and what is charged (so the signs), where the KL coefficient goes, and how
# the tokens are averaged (the last paragraph), and keep every position outside a reply out of it.

# %%
#| export rewards
# Your turn - Exercise 12.6 (★★★, build): GRPO's clipped objective with a KL term.
def clipped_objective(logp: torch.Tensor, logp_old: torch.Tensor, logp_ref: torch.Tensor,
                      advantages: torch.Tensor, mask: torch.Tensor, clip: float = 0.2,
                      kl_coef: float = 0.04) -> torch.Tensor:
    """Token log-probabilities [N, T] (policy, sampler, reference), advantages [N], mask [N, T] -> the loss:
    minus the mean over replies of the mean over each reply's tokens of
    min(ρA, clip(ρ, 1 − clip, 1 + clip)A) − kl_coef · k3, with ρ = exp(logp − logp_old)."""
    ### BEGIN SOLUTION
    ratio = torch.exp(logp - logp_old)  # (N, T)
    adv = advantages.unsqueeze(1)  # (N, 1)
    surrogate = torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)  # (N, T)
    d = logp_ref - logp
    k3 = torch.exp(d) - d - 1  # (N, T), >= 0
    mask = mask.float()
    per_reply = ((surrogate - kl_coef * k3) * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # (N,)
    return -per_reply.mean()
    ### END SOLUTION

# %%
clipped_objective = check_clipped_objective(clipped_objective).use

# %% [markdown]
# **The ladder GRPO stands on.** The objective you just wrote is the top rung of a ladder the field
# climbed one step at a time, and each rung is there because the one below had a flaw you can measure:
#
# 1. **Plain policy gradient** (REINFORCE, Williams 1992): push up the log-probability of every token of
#    a reply in proportion to its reward, a loss of −r · log π per token. Its expected gradient is the
#    gradient of the expected reward, but with rewards of 0 and 1 every push is upwards, and the noise is
#    large.
# 2. **A baseline**: subtract from each reward a number b that does not depend on the reply. The expected
#    gradient does not change, because the expected score function is zero: the sum over replies of
#    π(y) ∇log π(y) is ∇ of the sum of π(y), which is ∇1 = 0, so b · E[∇log π] vanishes. The variance
#    falls when b is near the expected reward; the mean of the other replies in the group is a cheap
#    estimate of it (strictly, a mean that includes the reply itself leans a little towards it, which
#    is why RLOO leaves it out).
# 3. **Divide by the group's spread**: every group then pushes with the same strength, however easy the
#    prompt. It changes what is optimised (Dr. GRPO, Liu et al. 2025, drops it for that reason), and the
#    population and the sample standard deviation are both in use: a choice, not a law.
# 4. **Several steps per sample, clipped**: the ratio and the clip you wrote.
#
# Two more choices sit in every loss: **how tokens are averaged** (each reply's mean, then the replies'
# mean, as GRPO does, or a sum over all tokens divided by a constant, as Dr. GRPO does, so a long reply
# is not worth less per token), and a record of the policy's **entropy**, which falls as it sharpens.
# The package has each rung as a function; `grpo` below takes the choice of rung, and the benchmark
# climbs the ladder (the table after the GRPO run).

# %%
#| export rewards
def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """values, mask [N, T] -> [N]: each row's mean over its masked-in positions (0 for an empty row)."""
    mask = mask.float()
    return (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, constant: float) -> torch.Tensor:
    """values, mask [N, T] -> scalar: the sum over every masked-in position, divided by `constant` (Dr. GRPO
    takes the largest number of tokens a batch could hold, so every token weighs the same)."""
    return (values * mask.float()).sum() / real_number(constant, "constant", low=0, low_open=True)


def baseline_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """rewards [P, G] -> [P, G]: each reward minus its group's mean (a baseline; no division)."""
    return rewards - rewards.mean(dim=1, keepdim=True)


def policy_gradient_loss(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                         length: str = "reply", constant: float | None = None) -> torch.Tensor:
    """Token log-probabilities [N, T], advantages [N], mask [N, T] -> the REINFORCE loss −A · log π per
    token, averaged over each reply then over replies (length "reply"), or summed and divided by
    `constant` (length "constant"; default: the number of positions N · T)."""
    per_token = -advantages.unsqueeze(1) * logp  # (N, T)
    if choice(length, "length", ("reply", "constant")) == "reply":
        return masked_mean(per_token, mask).mean()
    return masked_sum(per_token, mask, mask.numel() if constant is None else constant)


def sft_loss(logp: torch.Tensor, mask: torch.Tensor, normaliser: float) -> torch.Tensor:
    """Token log-probabilities [N, T] and mask [N, T] -> the cross-entropy of the masked-in tokens, summed and
    divided by `normaliser` (their count gives chapter 11's per-token mean)."""
    return masked_sum(-logp, mask, normaliser)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """logits [..., V] -> [...]: the entropy −Σ p log p of each position's next-token distribution, in nats."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)

# %% [markdown]
# A **rollout** samples the groups and scores them; `grpo` runs the loop: a rollout of fresh words, the
# advantages, the frozen reference's log-probabilities, then `inner_steps` AdamW steps on the clipped
# objective. The first of those steps sees the policy that sampled the rollout, so its log-probabilities,
# detached, are π_old for every inner step (ρ = 1 on the first).

# %%
#| export rewards
@dataclass
class Rollout:
    """G replies to each of P tasks: the conversations x, y [N, T] (targets on the replies), the replies'
    text (N) and their rewards [P, G]."""

    x: torch.Tensor
    y: torch.Tensor
    replies: list[str]
    rewards: torch.Tensor


def rollout(policy: GPT, tok: ChatTokenizer, tasks: list[Example], group: int, generator: torch.Generator,
            check=is_right) -> Rollout:
    """Sample `group` replies (temperature 1) to every task and score each with `check(task, reply)`."""
    prompts = [t.prompt for t in tasks for _ in range(group)]
    was_training = policy.training
    with torch.no_grad():
        ids = reply_ids(policy.eval(), tok, prompts, MAX_REPLY, temperature=1.0, generator=generator)
    policy.train(was_training)
    texts = [tok.decode(r[:-1] if r[-1:] == [tok.end_id] else r) for r in ids]
    rewards = [float(check(t, text)) for t, text in zip([t for t in tasks for _ in range(group)], texts, strict=True)]
    x, y = conversation_batch(tok, prompts, ids)
    return Rollout(x, y, texts, torch.tensor(rewards).view(len(tasks), group))


def _advantages(rewards: torch.Tensor, kind: str) -> torch.Tensor:
    """rewards [P, G] -> advantages [N]: the rewards themselves ("raw"), minus the group's mean ("baseline"),
    or also divided by its spread ("group", GRPO's)."""
    kinds = {"raw": lambda r: r, "baseline": baseline_advantages, "group": group_advantages}
    return kinds[choice(kind, "advantage", tuple(kinds))](rewards).flatten()


def _policy_loss(kind: str, length: str, logp, logp_old, logp_ref, advantages, mask, clip, kl_coef):
    """GRPO's clipped objective ("clipped"), or REINFORCE ("pg") with the same KL term to the reference."""
    if kind == "clipped":
        return clipped_objective(logp, logp_old, logp_ref, advantages, mask, clip, kl_coef)
    kl_only = clipped_objective(logp, logp_old, logp_ref, torch.zeros_like(advantages), mask, clip, kl_coef)
    return policy_gradient_loss(logp, advantages, mask, length) + kl_only


def grpo(policy: GPT, reference: GPT, tok: ChatTokenizer, steps: int, tasks_per_step: int = 16, group: int = 8,
         lr: float = 1e-4, clip: float = 0.2, kl_coef: float = 0.04, inner_steps: int = 2, seed: int = 0,
         check=is_right, avoid: frozenset[str] = frozenset(), progress: bool = False,
         on_step=None, logprobs=None, loss: str = "clipped", advantage: str = "group",
         length: str = "reply") -> dict[str, list[float]]:
    """`steps` GRPO steps on fresh strange words (none in `avoid`) scored by `check`; `reference` stays
    frozen. Returns, per step: reward (the rollout's mean), kl (mean k3 per reply token), clipped (the
    share of reply tokens whose ratio left [1 − clip, 1 + clip] on the last inner step) and entropy (the
    sampled tokens' mean −log π_old: an estimate of the policy's entropy per token, in nats). `on_step(step,
    history)`, if given, is called after each step (step counts from 1), e.g. to evaluate. `logprobs(model,
    x, y)` gives the token log-probabilities [N, T] (`reply_logprobs` of `preferences` when None). The
    ladder's rungs: `loss` "clipped" or "pg" (REINFORCE), `advantage` "group", "baseline" or "raw", and for
    "pg" `length` "reply" (each reply's mean) or "constant" (a sum over N · T)."""
    from tqdm.auto import tqdm

    real_number(kl_coef, "kl_coef", low=0)
    real_number(clip, "clip", low=0, low_open=True)
    if choice(loss, "loss", ("clipped", "pg")) == "clipped" and length != "reply":
        raise ValueError(f"length={length!r} needs loss='pg': the clipped objective averages each reply")
    if policy is reference:
        raise ValueError("the policy is the reference: train a copy, grpo(copy.deepcopy(reference), reference, ...)")
    logprobs = _package_logprobs if logprobs is None else logprobs
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=0.0)
    rng, generator = random.Random(seed), torch.Generator().manual_seed(seed)
    history: dict[str, list[float]] = {"reward": [], "kl": [], "clipped": [], "entropy": []}
    trainable = [p for p in reference.parameters() if p.requires_grad]
    reference.eval().requires_grad_(False)  # frozen for the run: its log-probabilities build no graph
    try:
        for step in tqdm(range(whole_number(steps, "steps")), disable=not progress, desc="GRPO"):
            tasks = strange_words(tasks_per_step, seed=rng.randrange(2**31), avoid=avoid)
            batch = rollout(policy, tok, tasks, group, generator, check)
            advantages = _advantages(batch.rewards, advantage)  # (N,)
            mask = batch.y != IGNORE
            logp_ref = logprobs(reference, batch.x, batch.y)  # (N, T)
            for inner in range(whole_number(inner_steps, "inner_steps")):
                logp = logprobs(policy, batch.x, batch.y)  # (N, T)
                if inner == 0:  # the policy that sampled the rollout: ρ = 1 on the first update
                    logp_old = logp.detach()
                descend(policy, optimizer, _policy_loss(loss, length, logp, logp_old, logp_ref, advantages, mask,
                                                        clip, kl_coef), "GRPO")
            # every reply token as one reply, no advantage: the objective's KL term alone
            tokens = [t.detach()[mask].unsqueeze(0) for t in (logp, logp_old, logp_ref)]  # (1, M) each
            kl = clipped_objective(*tokens, torch.zeros(1), torch.ones_like(tokens[0], dtype=torch.bool), clip, 1.0)
            ratio = torch.exp(tokens[0] - tokens[1])  # ρ, as the objective's docstring says
            history["reward"].append(batch.rewards.mean().item())
            history["kl"].append(kl.item())
            history["clipped"].append(((ratio < 1 - clip) | (ratio > 1 + clip)).float().mean().item())
            history["entropy"].append(-tokens[1].mean().item())
            if on_step is not None:
                on_step(step + 1, history)
    finally:
        for p in trainable:  # a model used as a reference can be trained again afterwards
            p.requires_grad_(True)
    return history


def expert_iteration(policy: GPT, tok: ChatTokenizer, steps: int, tasks_per_step: int = 16, group: int = 8,
                     lr: float = 1e-4, seed: int = 0, check=is_right, avoid: frozenset[str] = frozenset(),
                     progress: bool = False, on_step=None, logprobs=None) -> dict[str, list[float]]:
    """The baseline RL has to beat: each step samples `group` replies (temperature 1) to fresh words, keeps
    the replies `check` accepts, and takes one supervised step on them (cross-entropy per kept token).
    Returns, per step: reward (the rollout's mean) and kept (replies trained on)."""
    from tqdm.auto import tqdm

    logprobs = _package_logprobs if logprobs is None else logprobs
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=0.0)
    rng, generator = random.Random(seed), torch.Generator().manual_seed(seed)
    history: dict[str, list[float]] = {"reward": [], "kept": []}
    for step in tqdm(range(whole_number(steps, "steps")), disable=not progress, desc="expert iteration"):
        tasks = strange_words(tasks_per_step, seed=rng.randrange(2**31), avoid=avoid)
        batch = rollout(policy, tok, tasks, group, generator, check)
        keep = batch.rewards.flatten() > 0  # (N,)
        if keep.any():
            mask = batch.y[keep] != IGNORE
            logp = logprobs(policy, batch.x[keep], batch.y[keep])
            descend(policy, optimizer, sft_loss(logp, mask, mask.sum().item()), "expert iteration")
        history["reward"].append(batch.rewards.mean().item())
        history["kept"].append(float(keep.sum().item()))
        if on_step is not None:
            on_step(step + 1, history)
    return history

# %% [markdown]
# Ten steps here (16 words, 8 replies each: 1,280 replies sampled and scored, well under a minute on a
# CPU).

# %%
torch.manual_seed(0)
rl_policy = copy.deepcopy(sft)
rl_history = grpo(rl_policy, sft, tok, steps=10, lr=GRPO_LR, kl_coef=GRPO_KL, avoid=HELD_WORDS,
                  logprobs=reply_logprobs)  # your reply_logprobs (12.3), advantages (12.5) and objective (12.6)
plt.figure(figsize=(5, 3))
plt.plot(rl_history["reward"], marker="o", label="mean reward of the rollout")
plt.xlabel("GRPO step")
plt.ylabel("share of replies right")
plt.legend()
plt.show()
print("the policy moved from the reference (KL > 0):", rl_history["kl"][-1] > 0)
print("rewards are shares of right replies:", all(0 <= r <= 1 for r in rl_history["reward"]))

# %% [markdown]
# The shipped GRPO model ran the same loop for longer from the same SFT model, and measured the
# held-out strange words as it went:

# %%
rl_model = load_chat_model(shipped="shakespeare_grpo")
facts = rl_model.manifest
curve = facts["curve"]  # step, pass@1 and greedy accuracy on the held-out words, every few steps
fig, axes = plt.subplots(1, 2, figsize=(11, 3.2))
axes[0].plot(facts["reward"], alpha=0.4, label="rollout reward (per step)")
window = 20
smooth = [sum(facts["reward"][max(0, i - window + 1): i + 1]) / len(facts["reward"][max(0, i - window + 1): i + 1])
          for i in range(len(facts["reward"]))]
axes[0].plot(smooth, label=f"mean of the last {window}")
axes[1].plot([c["step"] for c in curve], [c["pass_at_1"] for c in curve], marker="o", label="pass@1 (held out)")
axes[1].plot([c["step"] for c in curve], [c["greedy"] for c in curve], marker="s", label="greedy (held out)")
for ax, name in zip(axes, ["reward", "share right"], strict=True):
    ax.set_xlabel("GRPO step")
    ax.set_ylabel(name)
    ax.legend()
plt.tight_layout()
plt.show()
print(f"GRPO: {facts['steps']} steps, {facts['built']['wall_seconds']:.0f} s on {facts['built']['cpu']}")
print(f"held-out strange words: pass@1 {recorded['pass_at_1']:.1%} -> {facts['after']['pass_at_1']:.1%}, "
      f"greedy {recorded['greedy']:.1%} -> {facts['after']['greedy']:.1%}")
print("chapter 11's held-out exact match, SFT -> GRPO:")
for kind, before in facts["exact_match_before"].items():
    print(f"  {kind:8} {before:5.0%} -> {facts['exact_match_after'][kind]:5.0%}")
print("measured here as recorded:", abs(accuracy(rl_model.model, tok, held) - facts["after"]["greedy"]) <= 0.01)

# %% [markdown]
# Look at `count`: GRPO never practised it. This run kept it (one held-out question of 100 lost; the
# GRPO model shipped before, from an SFT model trained on single questions, lost ten), but nothing in
# the objective protects it. The KL term is an average over the replies GRPO samples, to upper-casing
# and reversing prompts only; it says nothing about what the policy does on other prompts. Larger recipes can mix the tasks to keep into the RL prompts, or add a
# supervised loss on them (InstructGPT's "PPO-ptx" mixed in pretraining gradients for this reason).
#
# RL needs the model to be right *sometimes*: a group that is all wrong has zero advantage everywhere,
# so a task the SFT model never solves (chapter 11's model gets every word of 8 letters wrong) gives
# GRPO nothing to climb. What RL needs is that pass rate above zero, not SFT as such: DeepSeek-R1-Zero
# ran RL directly on a base model, which was already right on some of its problems. Here RL starts
# from the SFT model because chapter 06's base model is right on none of these tasks (before
# fine-tuning it scored 0% on every kind of chapter 11's tasks). And pass@1, not greedy accuracy, is
# RL's number: it learns from samples, and first makes its right samples more common.
#
# **What a GPU buys.** At these sizes sampling is a minority of a step: the ladder benchmark below timed
# the rollout (128 replies of a few tokens, one token at a time) inside every GRPO step, and it took
# 19-22% of the step (its last paragraph gives the share on the machine that ran it). The
# rest is the policy's forward and backward passes on the two inner steps and the forward pass that
# gives the reference's log-probabilities. Real runs use groups of 16-64 replies of
# hundreds to thousands of tokens and thousands of prompts, so generating the rollouts one token at a
# time takes a much larger share, and they often hand it to a separate inference engine (vLLM, say). A
# GPU runs both parts in parallel over the whole group. The algorithm is the one above.
#
# ## 6. What the policy optimises: holes in the checker, and the KL leash
#
# The policy maximises what the checker *says*, not what we meant. Here is a checker written in a hurry:
# it accepts a reply if the reply appears inside the right answer.

# %%
#| export rewards
def hasty_check(task: Example, reply: str) -> bool:
    """A checker with a hole, for the experiments: a reply passes if it appears inside the right answer."""
    return reply in task.answer


# %%
print("the right answer passes:", hasty_check(held[0], held[0].answer))
print("so does an empty reply:", hasty_check(held[0], ""), "| and the first letter alone:",
      hasty_check(held[0], held[0].answer[:1]))

# %% [markdown]
# GRPO is told only what the checker says. Run it against this one, from the SFT model, at three times
# the learning rate used so far and with no KL term, for twenty steps, and score every step's rollout
# (16 words, 8 replies each) with both checkers: the hasty one pays the policy, the strict one only
# watches.
#
# **Your turn (predict).** After the twenty steps, compared with the first steps: (1) does the share of
# the rollout that the hasty checker accepts "rise", "stay" or "fall"? (2) Does the gap between that
# share and the share that is right (by the strict checker) "widen", "stay" or "narrow"? (3) Is the
# trained model's greedy accuracy on the held-out strange words (strict checker) "higher", the "same" or
# "lower" than the SFT model's? Reason from what each reply is paid, and from what a reply has to get
# right to be paid.

# %%
# Your turn - Exercise 12.7 (★★☆, predict): GRPO paid by a checker with a hole.
def my_prediction() -> tuple[str, str, str]:
    ### BEGIN SOLUTION
    return "rise", "widen", "lower"
    ### END SOLUTION


check_predict_hasty_run(my_prediction)

# %%
HACK_LR, HACK_STEPS = 3 * GRPO_LR, 20
seen = []  # (right, accepted, empty) for every sampled reply, step after step


def paid_by_hasty(task: Example, reply: str) -> bool:
    """What the policy is paid (hasty_check), with the strict verdict written down beside it."""
    seen.append((is_right(task, reply), hasty_check(task, reply), reply == ""))
    return seen[-1][1]


torch.manual_seed(0)
hacker = copy.deepcopy(sft)
grpo(hacker, sft, tok, steps=HACK_STEPS, lr=HACK_LR, kl_coef=0.0, check=paid_by_hasty, avoid=HELD_WORDS)
per_step = torch.tensor(seen, dtype=torch.float).view(HACK_STEPS, -1, 3).mean(dim=1)  # (steps, 3): shares
plt.figure(figsize=(8, 3))
for column, label in enumerate(["right (strict checker)", "accepted (hasty checker: the reward)", "empty"]):
    plt.plot(range(1, HACK_STEPS + 1), per_step[:, column], marker="o", label=label)
plt.xticks(range(0, HACK_STEPS + 1, 5))
plt.xlabel("GRPO step")
plt.ylabel("share of the rollout")
plt.title("GRPO paid by hasty_check, no KL term")
plt.legend(loc="center left", bbox_to_anchor=(1.02, 0.5))
plt.tight_layout()
plt.show()
first, last = per_step[:3].mean(dim=0), per_step[-3:].mean(dim=0)  # the first and the last three steps
print("accepted rose by at least 0.1:", bool(last[1] >= first[1] + 0.1),
      "| accepted minus right, last three steps, at least 0.2:", bool(last[1] - last[0] >= 0.2))
print("held-out greedy accuracy at least 10 points below the SFT model's:",
      accuracy(hacker, tok, held) <= recorded["greedy"] - 0.1)

# %% [markdown]
# <details><summary>Why (open after you have answered)</summary>
#
# The hasty checker pays a wrong piece of the answer exactly as much as the right answer, and a piece is
# easier to produce: stop early. A sampled piece that scores 1 in a group where most replies score 0
# gets a large positive advantage, so each step makes pieces more likely; nothing in the reward holds
# the right replies up against them. The reward climbs while the share of right replies does not, and
# greedy decoding, which takes the likeliest reply, now often answers with a piece. The empty reply is
# the extreme case, inside every answer and the shortest there is: in the ladder benchmark below, over
# three seeds of this run, one seed's replies were almost all empty by the last steps (the plot above
# shows what this run did). This is **reward hacking**. The same shape turns up in real training: unit
# tests a reply can special-case, a judge model that likes long answers, a format check that ignores the
# content. The defences: a checker with no hole (`is_right` compares the whole reply), and a number the
# reward does not see, watched as you train (here the strict checker; in general a held-out evaluation).
#
# </details>
#
# **The KL term** is the other defence: it charges the policy for every token on which it moved away
# from the SFT model. The ladder benchmark below ran this experiment over three seeds with KL
# coefficients 0, 0.04 and 0.2, and with the strict checker. Without the term, greedy accuracy on the
# held-out words fell from 55.5% to 23.0% (0.0-37.0% over the seeds); with 0.04 it stayed at 52.1%
# (49.2-55.2%), with 0.2 at 55.8% (52.5-60.0%): ranges apart from the run without it. Here the term is
# a measured defence, not only one in principle. It slows the drift rather than stopping it: against the
# hasty checker for 100 steps at the learning rate of the runs above (KL 0.04), greedy accuracy ended at
# 50.7% (24.8-76.8%) where the strict checker's runs reached 87.4% (86.5-88.2%). And it guards only
# where it is measured: on counting (chapter 11's task, never practised here) the 100-step runs with and
# without it ended at 95% (84-100%) and 99% (97-100%), within each other's spread.

# %%
# NBVAL_IGNORE_OUTPUT
# the ladder benchmark's stored table (python benchmarks/bench_rl_ladder.py rewrites it, on the machine that runs it)
ladder = Path("../benchmarks/results/rl_ladder.md")
print(ladder.read_text() if ladder.exists() else "run `python benchmarks/bench_rl_ladder.py` to climb the ladder")

# %% [markdown]
# Exercise 12.11 (section 8) asks what this table supports; its reading follows the exercise.
#
# **Does RL only sharpen?** Reinforcement learning is often said only to **sharpen**: to make replies the
# model could already write more common, without making new right ones reachable. Its sampled replies
# did become fewer and more alike (distinct replies among 8: 4.63 for SFT, 2.17 and 1.98 after GRPO
# with and without the KL term; part of that is just more replies being the one right answer). But
# sharpening is judged by pass@k, the chance that at least one of k samples is right (Exercise 12.8
# below computes it without bias), at large k, and by failure rates rather than points: near 100% there
# are few points left to gain. In the preference benchmark's run with the KL term, pass@1 rose from
# 39.2% to 80.8% and pass@8 from 66.8% to 96.2%. The failures fell from 61% to 19% at k = 1, about 3
# times fewer, and from 33% to 3.7% at k = 8, about 9 times fewer. So this run does not show mere
# sharpening: pass@8 rose too, and its failures fell more, in ratio, than pass@1's. Whether the SFT model
# would catch up at k in the hundreds, where sharpening would show, 8 samples per word cannot say.

# %%
# NBVAL_IGNORE_OUTPUT
# the benchmark's measured rows (make bench rewrites them, on whatever machine runs it)
import json

measured = Path("../benchmarks/results/preferences.json")
if measured.exists():
    bench = json.loads(measured.read_text())
    rows = [("SFT", bench["sft"])] + [(f"GRPO KL {r['kl_coef']:g}", r) for r in bench["grpo"]]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3))
    for ax, (key, label) in zip(axes, [("pass_at_1", "pass@1"), ("pass_at_8", "pass@8"), ("distinct", "distinct of 8")],
                                strict=True):
        ax.bar([run for run, _ in rows], [row[key] for _, row in rows])
        ax.set_ylabel(label)
        ax.set_title(f"held-out strange words: {label}")
    plt.tight_layout()
    plt.show()
    for run, row in rows:
        print(f"{run:12} chapter 11's exact match: " + ", ".join(f"{k} {v:.0%}" for k, v in row["exact_match"].items()))
else:
    print("run `make bench` to compare GRPO with and without its KL term")

# %% [markdown]
# ## 7. Your turn: pass@k without bias
#
# pass@1 asks whether one sample is right; **pass@k** whether at least one of k is (the number code and
# maths benchmarks report). Sampling k replies once and looking is noisy. Chen et al. (2021, the
# HumanEval paper) use every sample instead: draw n ≥ k replies, count the c right ones, and report the
# chance that k replies picked at random from those n, without replacement, include at least one right
# one. Averaged over prompts, that is an unbiased estimate of pass@k.
#
# **Your turn (extend).** Write `pass_at_k(n, c, k)` for whole numbers 0 ≤ c ≤ n and 1 ≤ k ≤ n. No
# formula here: count the ways of picking k of the n replies, and the ways that pick only wrong ones.
# Test yourself by hand: n = 4, c = 1, k = 2 gives 0.5 (list the six pairs). Think about what happens
# when there are fewer wrong replies than k, and keep the numbers exact for n in the hundreds (a
# product of many factors is safer than dividing two huge factorials in floating point).

# %%
# Your turn - Exercise 12.8 (★★☆, extend): the unbiased pass@k.
def pass_at_k(n: int, c: int, k: int) -> float:
    ### BEGIN SOLUTION
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)
    ### END SOLUTION


pass_at_k = check_pass_at_k(pass_at_k).use

# %% [markdown]
# With it, the SFT model's pass@1 that the shipped build recorded (section 1) comes back from the samples
# themselves, and pass@8 beside it: 8 replies per held-out word (seed 0), the right ones counted per
# word, and your `pass_at_k` at k = 1 and k = 8 averaged over the words.

# %%
generator, prompts = torch.Generator().manual_seed(0), [t.prompt for t in held]
draws = [answers(sft, tok, prompts, MAX_REPLY, 1.0, generator) for _ in range(8)]  # 8 replies per word
right = [sum(is_right(t, d[i]) for d in draws) for i, t in enumerate(held)]  # c of n = 8, per word
sft_pass = {k: sum(pass_at_k(8, c, k) for c in right) / len(held) for k in (1, 8)}
print(f"SFT on held-out strange words, from your pass_at_k: pass@1 within a point of the recorded "
      f"{recorded['pass_at_1']:.1%}:", abs(sft_pass[1] - recorded["pass_at_1"]) <= 0.01,
      "| pass@8 at least 20 points above it:", sft_pass[8] >= sft_pass[1] + 0.2)

# %% [markdown]
# ## 8. Reading the experiments
#
# The last three exercises ask what an experiment will show before it is shown, then read it.
#
# **A baseline made of the group.** Section 5's ladder says subtracting a baseline leaves REINFORCE's
# expected gradient unchanged *when the baseline does not depend on the reply*. The group's mean does:
# reply i's own reward is one of the G rewards it averages. Here is a toy policy that needs no model: a
# softmax over 6 possible replies, 2 of them right (reward 1) and 4 wrong (reward 0), and groups of
# G = 8 independent samples. Each group gives one estimate of the gradient (of the loss, with respect to
# the 6 logits); averaged over many groups, the estimates with the raw rewards as advantages come to the
# true gradient of the expected reward.
#
# **Your turn (predict).** With the group-mean baseline (`baseline_advantages`) instead, (1) how long is
# the average of the estimates, as a fraction of the average without the baseline (a number: think about
# the expectation of (r_i − the group's mean) times the score of reply i, and which of the G terms of the
# mean are independent of reply i), and (2) is the spread of single-group estimates around their average
# "larger", "smaller" or "same" with the baseline?

# %%
# Your turn - Exercise 12.9 (★★★, predict): the group-mean baseline's effect on REINFORCE's gradient.
def my_prediction() -> tuple[float, str]:
    ### BEGIN SOLUTION
    return 7 / 8, "smaller"
    ### END SOLUTION


check_predict_group_baseline(my_prediction)

# %% [markdown]
# The experiment: 20,000 groups of 8 samples, every group's estimate from `policy_gradient_loss` (each
# sample a one-token reply), with the raw rewards and with the group-mean baseline, against the true
# gradient worked out exactly from the six probabilities.

# %%
toy_logits, toy_reward = torch.tensor([1.0, 0.5, 0.0, -0.5, 0.3, -1.0]), torch.tensor([1.0, 0, 0, 1.0, 0, 0])
GROUPS, G = 20_000, 8


def group_estimates(advantages_of) -> torch.Tensor:
    """One REINFORCE gradient estimate per group of G samples: [GROUPS, 6] (the same seed for both arms)."""
    draws = torch.multinomial(torch.softmax(toy_logits, -1), GROUPS * G, replacement=True,
                              generator=torch.Generator().manual_seed(0)).view(GROUPS, G)
    logits = toy_logits.repeat(GROUPS, 1).requires_grad_(True)  # a copy per group, to get each group's gradient
    logp = torch.log_softmax(logits, -1).gather(1, draws).view(-1, 1)  # (GROUPS·G, 1): one-token replies
    advantages = advantages_of(toy_reward[draws]).flatten()  # (GROUPS·G,)
    policy_gradient_loss(logp, advantages, torch.ones_like(logp, dtype=torch.bool)).backward()
    return logits.grad * GROUPS  # the loss averaged over all groups: undo the 1/GROUPS


leaf = toy_logits.clone().requires_grad_(True)
(torch.softmax(leaf, -1) * toy_reward).sum().backward()  # the exact gradient of the expected reward
exact = -leaf.grad  # the loss's gradient points the other way
raw, based = group_estimates(lambda r: r), group_estimates(baseline_advantages)
share = (based.mean(0) @ exact / (exact @ exact)).item()
spread = {name: ((e - e.mean(0)) ** 2).sum(1).mean().item() for name, e in [("raw", raw), ("baseline", based)]}
print("raw rewards: the average estimate is the exact gradient (within 1%):",
      torch.allclose(raw.mean(0), exact, atol=0.01 * exact.norm().item()))
print(f"group-mean baseline: the average estimate, as a fraction of the exact gradient: {share:.2f}")
print(f"spread around the average: {spread['raw']:.3f} with raw rewards, {spread['baseline']:.3f} with the baseline")

# %% [markdown]
# <details><summary>Why (open after you have answered)</summary>
#
# Reply i's own reward enters the group's mean with weight 1/G, and that part is not independent of
# reply i: it removes 1/G of the gradient. The other G − 1 rewards are independent of reply i and remove
# nothing on average. So the group-mean baseline shrinks the gradient to (G − 1)/G of its length, a
# rescaling AdamW hardly notices, while the spread falls because most of each reward's "1" is shared by
# the group. Leaving reply i out of its own baseline (RLOO, Ahmadian et al. 2024) removes even the
# shrinking. Dividing by the group's spread, as `group_advantages` does, is a different matter: the
# spread differs from group to group, so it reweights prompts instead of rescaling every one alike.
#
# </details>

# %% [markdown]
# **A checker with a hole, in a toy.** The same toy policy, a softmax over 6 replies, now with a checker
# like `hasty_check`: reply 0 is the right answer, reply 1 is a piece of it that the hasty checker also
# accepts, and the model starts out preferring the piece a little (logit 0.5 against 0.0). Training follows
# the exact gradient of the expected reward, with no sampling noise at all: once with the hasty checker
# (replies 0 and 1 earn 1) and once with the strict one (reply 0 alone).
#
# **Your turn (predict).** Against the hasty checker, after training: (1) which reply is the most likely,
# "right" or "piece"? (2) Of the probability the two accepted replies hold together, does the right reply's
# share end "larger", "smaller" or the "same" as at the start? Reason from the gradient of Σᵢ pᵢ rᵢ with
# respect to each logit of a softmax.

# %%
# Your turn - Exercise 12.10 (★★☆, predict): what exact policy gradient does with a hole in the checker.
def my_prediction() -> tuple[str, str]:
    ### BEGIN SOLUTION
    return "piece", "smaller"
    ### END SOLUTION


check_predict_hasty_toy(my_prediction)

# %%
def train_toy(reward: torch.Tensor, steps: int = 300, lr: float = 2.0) -> torch.Tensor:
    """The toy policy's probabilities [6] after `steps` of gradient ascent on the exact expected reward."""
    logits = torch.tensor([0.0, 0.5, 0.2, -0.3, 0.1, -0.5], requires_grad=True)
    optimizer = torch.optim.SGD([logits], lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        (-(torch.softmax(logits, -1) * reward).sum()).backward()
        optimizer.step()
    return torch.softmax(logits.detach(), -1)


start = torch.softmax(torch.tensor([0.0, 0.5, 0.2, -0.3, 0.1, -0.5]), -1)
hasty, strict = train_toy(torch.tensor([1.0, 1, 0, 0, 0, 0])), train_toy(torch.tensor([1.0, 0, 0, 0, 0, 0]))
share = lambda p: (p[0] / (p[0] + p[1])).item()  # noqa: E731 (the right reply's part of the accepted mass)
print(f"start:  right {start[0]:.2f}, piece {start[1]:.2f}; right's share of the accepted {share(start):.2f}")
print(f"hasty:  right {hasty[0]:.2f}, piece {hasty[1]:.2f}; right's share of the accepted {share(hasty):.2f}")
print(f"strict: right {strict[0]:.2f}, piece {strict[1]:.2f}")

# %% [markdown]
# <details><summary>Why (open after you have answered)</summary>
#
# The gradient of Σⱼ pⱼ rⱼ with respect to logit i is pᵢ (rᵢ − Σⱼ pⱼ rⱼ): every accepted reply is pushed up
# in proportion to its own probability. The gap between the two accepted logits therefore grows by
# (p_piece − p_right)(1 − E[r]) a step: the piece, ahead from the start, pulls away, and here it ends with
# nearly all the probability while the right reply ends *less* likely than it began. Nothing in the
# objective can tell the right reply from the piece; the strict checker, which can, sends almost everything
# to the right one. The real run found the same hole (the ladder's reading below).
#
# </details>
#
# **Reading the ladder.** The table of section 6 holds the three seeds of each arm: the mean, then the
# lowest and the highest seed in brackets. Two arms differ, on a measure, when their ranges do not overlap.
#
# **Your turn (interpret).** For each claim, say whether the table supports it (True) or not (False):
#
# - A. After 30 steps, the clipped objective (GRPO, KL 0.04) gave a higher greedy accuracy than
#   REINFORCE with group-normalised advantages.
# - B. Against the hasty checker, more greedy replies were wrong pieces of the answer than with the strict
#   checker after the same 100 steps, in every seed.
# - C. After 30 steps, expert iteration's pass@1 was below the clipped objective's (KL 0.04) in every seed.
# - D. After 30 steps, plain REINFORCE on the raw rewards had a higher pass@1 than REINFORCE with the
#   group-mean baseline, in every seed.
# - E. Dividing by the group's spread raised greedy accuracy over the plain group-mean baseline.

# %%
# Your turn - Exercise 12.11 (★★☆, predict): what the ladder's three seeds support.
def ladder_claims() -> dict[str, bool]:
    ### BEGIN SOLUTION
    return {"A": False, "B": True, "C": False, "D": True, "E": False}
    ### END SOLUTION


check_ladder_claims(ladder_claims)

# %% [markdown]
# <details><summary>The reading (open after you have answered)</summary>
#
# Every arm started from the shipped SFT model (greedy 55.5%, pass@1 39.2% on the held-out strange
# words) and sampled the same 16 × 8 replies a step, three seeds each.
#
# - After 30 steps every rung had helped: the arms' mean greedy accuracies lie between 68.7% and 76.9%,
#   their pass@1 between 50.4% and 59.1%. The clip against normalised REINFORCE, expert iteration
#   against the clip, the division by the spread against the plain baseline: in each pair the seeds'
#   ranges overlap, so at this budget none of those choices is measured to matter.
# - One difference is measured, and it runs against the textbook order: plain REINFORCE on the raw 0/1
#   rewards beat REINFORCE with the group-mean baseline on pass@1 in every seed (57.4-61.1% against
#   52.0-53.9%), and sharpened fastest (the lowest entropy, 0.33 nats a token). A baseline lowers the
#   variance of the gradient (Exercise 12.9 measured it) without changing its mean, so the difference
#   is not in what the gradient aims at on average. What the run shows is only the outcome; a likely
#   part of it is that raw 0/1 rewards push right replies up and never push anything down, as expert
#   iteration does (pass@1 55.9-57.4%), while the baseline also pushes wrong replies down, and the
#   probability taken from a wrong reply goes to every other reply, not only to the right one.
# - The hole in the checker was found. Against `hasty_check` for 100 steps, the reward the policy saw
#   rose higher than in the honest run (0.82 over the last 5 steps, against 0.70), but greedy accuracy by
#   the strict checker ended at 50.7% (24.8-76.8%) instead of 87.4%, and 40.8% (10.0-73.8%) of its greedy
#   replies were a wrong piece of the answer that the hasty checker accepts, against 0.5% with the strict
#   checker; in one seed 42.8% were empty.
# - Counting, never practised, stayed at 99-100% after 30 steps in every arm; after 100 steps it ended
#   at 95% (84-100%) with the KL term, 99% (97-100%) without, and 83% (49-100%) against the hasty checker.
#
# </details>

# %% [markdown]
# ## 9. Talk to them
#
# Both trained models are chat models like chapter 11's (`save_chat_model`), so the same streamed chat
# serves them. In a terminal: `transformer-course chat --model dpo` or `--model grpo` for the shipped
# ones, or `--checkpoint` with the files this chapter writes below.
#
# One thing they lost: chapter 11's model answers a question asked second or third in a conversation
# about as well as a first one, because it was fine-tuned on conversations. DPO and GRPO here train on
# single questions only, and the second message pays for it, GRPO's most: its held-out upper-casing as
# a second question fell from 98% to 74% (chapter 11's multi-turn benchmark has the whole table). It is
# the lesson of `count` in section 5: the KL term holds the policy near the SFT model only on the
# prompts RL samples. Conversations among the RL prompts would be the fix.

# %%
from transformer_course.assistant import reply_stream

for name, model in [("SFT", sft), ("DPO", dpo_model.model), ("GRPO", rl_model.model)]:
    print(f"{name:5}", "".join(reply_stream(model, tok, [{"role": "user", "content": "reverse: qzkvb"}])))
Path("checkpoints").mkdir(exist_ok=True)
for name, model in [("12_dpo_demo.pt", policy), ("12_grpo_demo.pt", rl_policy)]:
    save_chat_model(Path("checkpoints") / name, model, tok)
print("transformer-course chat --checkpoint chapters/checkpoints/12_grpo_demo.pt")

# %% [markdown]
# ## Quick check

# %%
from transformer_course.quiz import Question, quiz

quiz([
    Question("What does DPO need that GRPO does not?",
             ["A reward model", "Pairs of a better and a worse reply", "A GPU"],
             answer=1, explain="DPO fits pairs directly; GRPO scores its own samples with a checker."),
    Question("A group's four replies are all right. What do they teach GRPO?",
             ["A lot: push all four up", "Nothing through the advantages: they are all 0",
              "They are pushed down"],
             answer=1, explain="Each reward equals the group's mean, so every advantage is 0; only the KL term acts."),
    Question("Why does the first DPO loss not depend on β?",
             ["Because β starts at 1", "The policy equals the reference, so every margin is 0, whatever β multiplies",
              "Because the pairs are balanced"],
             answer=1, explain="Equal log-ratios make every margin 0, and β times 0 is 0."),
    Question("During GRPO the reward climbs to nearly 1 while the share of right replies falls to 0. What happened?",
             ["The task was learned", "The policy found replies the checker pays for that are wrong",
              "The learning rate was too small"],
             answer=1, explain="The reward is what the checker says; a number it does not see (a strict checker, a "
                               "held-out set) shows the gap."),
    Question("What does a larger β do in DPO?",
             ["Keeps the policy nearer the reference", "Moves it further", "Nothing: it cancels"],
             answer=0, explain="A small move already gives a large margin, so the loss is satisfied early."),
])

# %% [markdown]
# ## Summary
#
# - Supervised fine-tuning taught skills on the plays' words; on **strange words** no play holds, the
#   model is right only about half the time. A program knows every right answer, so it can judge.
# - **DPO** trains on pairs of the model's own replies, a right one preferred to a wrong one, with a
#   frozen reference: the loss is −log σ of β times the difference of the two log-ratios (you wrote it,
#   predicted its first value, fixed the reply log-probabilities it needs and gathered the four
#   of a batch of pairs, the reference read without a graph). Watch the held-out score and what SFT
#   taught, not only the loss: the margin can grow while both replies lose probability; the SFT term on
#   the chosen replies guards against that.
# - **GRPO** samples a group of replies per prompt, scores them with a checker, and pushes each reply by
#   its reward relative to the group (you wrote the advantages), through PPO's clipped ratio with a KL
#   term to the reference (you wrote the objective). Pass@1 on held-out strange words rises, with no
#   answer written down anywhere.
# - The policy optimises what the checker says: paid by a checker with a hole, GRPO raised its reward
#   while the held-out greedy accuracy fell (you predicted it, then watched it): **reward hacking**. The
#   **KL term** measurably slowed it (over three seeds of 20 fast steps, greedy accuracy 49-55% with the
#   term, 0-37% without) but did not stop it over 100 steps, and on counting, never practised, its
#   effect was within the seeds' spread. Whether RL only sharpens is
#   judged by failure rates and pass@k at large k: in the preference benchmark pass@8 rose too (66.8% →
#   96.2%), and its failures fell more in ratio (about 9 times fewer) than pass@1's (about 3 times);
#   pass@k has an unbiased
#   estimator from n samples (you wrote it). The same leash holds only where RL samples: trained on
#   single questions, GRPO lost part of chapter 11's skill at the second message of a conversation.
# - GRPO is the top of a **ladder**: REINFORCE, a baseline, advantages divided by the group's spread,
#   the clipped ratio. Over three seeds of 30 steps the rungs helped about equally, and plain REINFORCE
#   on 0/1 rewards beat the group-mean baseline on pass@1 in every seed; a baseline made of the group
#   lowers the gradient's variance and shrinks
#   its mean by a known factor (you predicted it, then measured it). Against a checker with a hole, even
#   the exact gradient hands the rewarded probability to whichever accepted reply was ahead (you predicted
#   which), and three seeds support fewer claims than their means suggest (you read the ranges).
#
# Exported to `transformer_course/preferences.py`: `STRANGE_KINDS`, `MAX_REPLY`, `strange_words`,
# `is_right`, `HELD_OUT_SEED`, `accuracy`, `pass_at_1`, `Pair`, `preference_pairs`, `dpo_loss`,
# `text_ids`, `conversation_batch`, `reply_logprobs`, `pair_logprobs`, `descend`, `dpo`; and to
# `transformer_course/rewards.py`: `group_advantages`, `clipped_objective`, `masked_mean`, `masked_sum`,
# `baseline_advantages`, `policy_gradient_loss`, `sft_loss`, `token_entropy`, `Rollout`, `rollout`, `grpo`,
# `expert_iteration`, `hasty_check`.
