# %% [markdown]
# # 11 · From a text completer to an assistant: chat format, supervised fine-tuning and LoRA
#
# > Turn chapter 06's Shakespeare completer into a model that answers: special tokens for the turns of a
# > conversation, a loss on the assistant's tokens only, supervised fine-tuning on tasks with checkable
# > answers, and LoRA, a low-rank adapter that fine-tunes under 5% of the weights.
#
# The model chapter 06 trained continues text. Ask it "reverse: gentle" and it writes more
# Shakespeare-shaped characters, because continuing text is the only thing its loss ever rewarded. The
# assistants you may have used (ChatGPT, Llama-Instruct, Qwen-Chat) each started as such a base model;
# the first step that turned it into an assistant was a second, much smaller training run on
# conversations, **supervised fine-tuning (SFT)**, with a format that tells the model whose turn it is.
# (Most of them then went through a stage of learning from preferences as well: chapter 12.)
#
# **In this chapter you will** grow the model's vocabulary by three turn tokens without changing what it
# already computes (Exercise 11.1), write the loss mask that trains only the assistant's answers (11.2),
# fine-tune the whole model on an instruction set built from the plays, predict the size of a low-rank
# adapter (11.3), write LoRA's forward pass (11.4), fix a merge that looks right and is not (11.5),
# and render a conversation in ChatML, the text format many open models use (11.6). At the end you see
# why a model fine-tuned on single questions fails at a chat's second message, and talk to one that
# does not, here and in a terminal (`transformer-course chat`).
#
# **You need** chapter 01 (the character tokenizer), chapter 06 (`GPT`, `train_step`, the learning-rate
# schedule, `estimate_loss`) and chapter 07 (`generate` and `stream`, which stop at an end token).

# %%
#| default_exp assistant

# %%
import math
import random
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from torch import nn

from transformer_course.course_model import load_chat_model, load_course_model, load_lora_adapter
from transformer_course.data import load_shakespeare, train_val_split

torch.set_printoptions(precision=4, sci_mode=False)
torch.manual_seed(0)
base = load_course_model()  # chapter 06's trained character-level GPT (0.8 M parameters, context 64)
print(base.model.cfg.vocab_size, "characters,", base.model.cfg.block_size, "positions")

# %% [markdown]
# ## 1. What a base model does with a question
#
# Greedy decoding (chapter 07) gives the same text on every machine. The base model has seen "reverse"
# in the plays, but never a question followed by its answer, so it does what it was trained to do.

# %%
from transformer_course.generation import generate

prompt = "reverse: gentle\n"
ids = torch.tensor([base.tokenizer.encode(prompt)])
print(repr(base.tokenizer.decode(generate(base.model, ids, 24, temperature=0.0)[0].tolist())))

# %% [markdown]
# ## 2. Three new tokens, and nothing else changes
#
# A conversation needs markers no text can contain: where the user's turn starts, where the assistant's
# starts, and where a turn ends. Written as ordinary characters ("User:"), they could also appear inside
# a message, and the model could not tell a quoted "User:" from a real turn. So they become **special
# tokens**: ids after the last character, `<|user|>` = 76, `<|assistant|>` = 77, `<|end|>` = 78, which
# no character encodes to. The `<|end|>` token is also what generation stops at.
#
# `ChatTokenizer` wraps the course's character tokenizer: `encode` reads the three markers as their ids
# and every other character as before; `decode` writes them back.

# %%
#| export
"""From a text completer to an assistant (chapter 11): the chat format, masked supervised fine-tuning
(SFT) on an instruction set built from the plays, held-out exact match, and a streamed chat.

Chapter 11 also writes `lora.py` (low-rank adapters). Shapes: B batch, T positions, C = d_model
channels, V vocabulary size (the characters plus the three turn tokens).
"""

from __future__ import annotations

import collections
import math
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from transformer_course.arguments import whole_number
from transformer_course.config import TrainConfig
from transformer_course.data import get_batch
from transformer_course.generation import generate, stream
from transformer_course.model import GPT
from transformer_course.tokenization import tokenizer_from_dict
from transformer_course.training import lr_at, train_step

SPECIALS = ("<|user|>", "<|assistant|>", "<|end|>")  # ids V, V+1, V+2 after a base vocabulary of V
ROLES = ("user", "assistant")


class ChatTokenizer:
    """A base tokenizer (chapter 01's CharTokenizer) plus the three turn tokens, whose ids follow its
    vocabulary. ``encode`` reads the markers in a text as their ids; ``decode`` writes them back."""

    def __init__(self, base):
        self.base = base
        n = base.vocab_size
        self.user_id, self.assistant_id, self.end_id = n, n + 1, n + 2
        self.special = {s: n + i for i, s in enumerate(SPECIALS)}
        self._split = re.compile("(" + "|".join(map(re.escape, SPECIALS)) + ")")

    @property
    def vocab_size(self) -> int:
        return self.base.vocab_size + len(SPECIALS)

    def encode(self, text: str) -> list[int]:
        """str -> ids; the three markers become their ids, every other character its base id."""
        ids: list[int] = []
        for piece in self._split.split(text):
            ids += [self.special[piece]] if piece in self.special else self.base.encode(piece) if piece else []
        return ids

    def decode(self, ids) -> str:
        """ids -> str, the turn tokens written as their markers."""
        names = {i: s for s, i in self.special.items()}
        out, run = [], []
        for i in (int(i) for i in ids):
            if i in names:
                out += [self.base.decode(run), names[i]]
                run = []
            else:
                run.append(i)
        return "".join(out) + self.base.decode(run)

    def to_dict(self) -> dict:
        return {"type": "chat", "base": self.base.to_dict(), "specials": list(SPECIALS)}

    @classmethod
    def from_dict(cls, d: dict) -> ChatTokenizer:
        if not isinstance(d, dict) or d.get("type") != "chat" or d.get("specials") != list(SPECIALS):
            raise ValueError(f"not a ChatTokenizer dict (expected type 'chat' and the specials {list(SPECIALS)})")
        return cls(tokenizer_from_dict(d["base"]))

    def __repr__(self) -> str:
        return f"ChatTokenizer(vocab_size={self.vocab_size}, base={self.base!r})"

# %%
tok = ChatTokenizer(base.tokenizer)
print(tok, tok.encode("<|user|>hi<|end|>"), repr(tok.decode(tok.encode("<|assistant|>ok<|end|>"))))

# %% [markdown]
# The model must grow too: its embedding has one row per id, 76 of them, and with tied weights (chapter
# 06) the same matrix gives one logit per id. Three rows must be added, and **every existing row kept as
# it is**, so the model still computes exactly what it computed before for every text without the new
# tokens. What should the new rows hold? A row of zeros gives a new token the logit 0 at every
# position. In a large trained model most logits are strongly negative, so 0 would be far above them
# and the untrained `<|end|>` would suddenly be likely everywhere. Hewitt (2021) asks for something
# safer: a new token should start with **the average of the existing tokens' logits**, at every
# position, whatever the hidden state there, so that it is neither favoured nor impossible. Our model is
# small and its logits are milder; the cell after the exercise measures what each choice gives here.
#
# **Your turn.** Write `grow_rows(weight, n_new, generator)`: weight [V, C] to a new tensor [V + n_new, C]
# whose first V rows equal `weight` (leave `weight` itself unchanged), and whose new rows meet Hewitt's
# requirement, plus noise drawn with `torch.randn(..., generator=generator)` times `NEW_ROW_NOISE`, which
# keeps the three new rows apart so the model can tell them from each other. No recipe: a logit is the
# dot product of the hidden state h [C] with a token's row, so ask which row w makes h · w equal the
# average of h · wᵢ over the V existing rows, for every h.

# %%
#| export
NEW_ROW_NOISE = 0.02  # the spread of the noise added to the new rows (GPT-2's initial weights are N(0, 0.02))


# Your turn - Exercise 11.1 (★☆☆, build): grow an embedding by new rows.
def grow_rows(weight: torch.Tensor, n_new: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """weight [V, C] -> [V + n_new, C]: the V rows unchanged; each new row gives its token the average of the
    V tokens' logits at every position, plus N(0, NEW_ROW_NOISE²) noise drawn from `generator` (a new
    tensor; `weight` is left as it was)."""
    n_new = whole_number(n_new, "n_new", low=0)
    ### BEGIN SOLUTION
    mean = weight.mean(dim=0, keepdim=True)  # (1, C)
    noise = torch.randn(n_new, weight.shape[1], generator=generator, dtype=weight.dtype) * NEW_ROW_NOISE
    return torch.cat([weight, mean + noise.to(weight.device)], dim=0)  # (V + n_new, C)
    ### END SOLUTION

# %%
from transformer_course.checks.assistant import (
    check_chatml,
    check_grow_rows,
    check_lora_forward,
    check_merged_weight,
    check_predict_lora_parameters,
    check_sft_targets,
)

grow_rows = check_grow_rows(grow_rows).use

# %% [markdown]
# `add_chat_tokens` builds a new GPT of the larger vocabulary and copies every weight into it, the
# embedding through `grow_rows`. (A model that does not tie its head gets the head grown the same way.)

# %%
#| export
def add_chat_tokens(model: GPT, seed: int = 0) -> GPT:
    """A copy of `model` whose vocabulary has the three turn tokens after its own V ids: embedding (and
    an untied head) grown by `grow_rows`, every other weight copied. For the old ids and any text
    without the new tokens, the copy's logits [..., :V] equal the model's."""
    generator = torch.Generator().manual_seed(seed)
    cfg = replace(model.cfg, vocab_size=model.cfg.vocab_size + len(SPECIALS))
    if cfg.needs_modern_parts:
        from transformer_course.modern import build_gpt

        grown = build_gpt(cfg)
    else:
        grown = GPT(cfg)
    state = dict(model.state_dict())
    for key in ("embed.token.weight", "lm_head.weight"):
        if key == "lm_head.weight" and model.cfg.tie_weights:
            state[key] = state["embed.token.weight"]  # tied: the grown embedding, used twice
        else:
            state[key] = grow_rows(state[key], len(SPECIALS), generator)
    grown.load_state_dict(state)
    return grown.train(model.training)

# %%
chat_model = add_chat_tokens(base.model).eval()
text_ids = torch.tensor([base.tokenizer.encode("ROMEO:\nBut soft, what light through yonder")])
with torch.no_grad():
    before, _ = base.model(text_ids)
    after, _ = chat_model(text_ids)
print("vocabulary", base.model.cfg.vocab_size, "->", chat_model.cfg.vocab_size)
print("old logits unchanged (within 1e-6):", bool((after[..., :76] - before).abs().max() < 1e-6))
print("the new <|end|> starts far less likely than an average character (under a tenth of 1/76):",
      bool(after[0, -1].softmax(-1)[tok.end_id] < 1 / 760))

# %% [markdown]
# How much would the choice matter here? Over 1,024 characters of the plays, the probability a new token
# would get at each position: with a zero row (logit 0) and with the mean row (the average logit), beside
# an average character's share, 1/76.

# %%
probe = torch.tensor(base.tokenizer.encode(load_shakespeare()[100_000:101_024])).view(16, 64)
with torch.no_grad():
    logits, _ = base.model(probe)  # (16, 64, 76)
total = logits.exp().sum(-1)  # Σ over the 76 characters of e^logit, at each position
p_zero = 1 / (total + 1)  # a zero row: e^0 = 1 beside them
p_mean = logits.mean(-1).exp() / (total + logits.mean(-1).exp())  # the mean row: e^(average logit)
print(f"the logits' mean: {logits.mean():.1f}; a new token's probability over {probe.numel()} positions, "
      "median (largest):")
print(f"  zero row {p_zero.median():.1%} ({p_zero.max():.1%}); mean row {p_mean.median():.2%} "
      f"({p_mean.max():.2%}); an average character {1 / 76:.1%}")

# %% [markdown]
# So at this scale a zero row would not have made `<|end|>` likely everywhere: about a tenth of a percent,
# because the logits here are only mildly negative. Hewitt's argument is about large models, whose logits
# sit much lower. The mean row is still the safer start, about ten times less likely again, and it
# is low at any scale: e to the average logit is never more than the average of e to the logits.

# %% [markdown]
# ## 3. The template, and the loss on the answers only
#
# A conversation is a list of messages, `{"role": "user" | "assistant", "content": "..."}` (the same
# shape the OpenAI API and Hugging Face's chat templates use). The **template** turns it into ids: each
# message is its role token, its content, and `<|end|>`:
#
# `<|user|>reverse: gentle<|end|><|assistant|>eltneg<|end|>`
#
# To ask the model, the template ends with `<|assistant|>` (the *generation prompt*) and generation runs
# until the model writes `<|end|>`. `render_chat` also says, for every id, whether it belongs to an
# answer: the assistant's content and its `<|end|>`, the tokens the model will have to write itself.

# %%
#| export
def render_chat(messages: list[dict], tok: ChatTokenizer,
                generation_prompt: bool = False) -> tuple[list[int], list[bool]]:
    """Messages [{"role", "content"}] -> (ids [T], is_answer [T]): each message as its role token, its
    content, <|end|>; is_answer is True on an assistant's content and its <|end|>.
    `generation_prompt=True` appends <|assistant|> (not an answer): what the model continues."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    ids: list[int] = []
    is_answer: list[bool] = []
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise ValueError(f"each message needs a role in {ROLES} and a str content, got {m!r}")
        if any(s in m["content"] for s in SPECIALS):
            raise ValueError(f"a message may not contain the turn markers {SPECIALS}: {m['content']!r}")
        body = tok.encode(m["content"]) + [tok.end_id]
        ids += [tok.user_id if m["role"] == "user" else tok.assistant_id, *body]
        is_answer += [False] + [m["role"] == "assistant"] * len(body)
    if generation_prompt:
        ids.append(tok.assistant_id)
        is_answer.append(False)
    return ids, is_answer

# %%
ids, is_answer = render_chat([{"role": "user", "content": "upper: kind"},
                              {"role": "assistant", "content": "KIND"}], tok)
print(tok.decode(ids))
print("".join("^" if a else "." for a in is_answer))

# %% [markdown]
# Training is chapter 06's next-token loss: at position t the model predicts id t + 1, and a target of
# -1 is ignored (`GPT.forward` passes `ignore_index=-1` to the cross-entropy). **Supervised fine-tuning
# trains the answers only**: the target at position t is the next id *when that next id is part of an
# answer*, and -1 otherwise. The question is given; the model is not graded on predicting it.
#
# **Your turn.** Write `sft_targets(ids, is_answer)`: from a conversation's ids and its answer marks
# (two lists of length T, as printed above) to the T targets that chapter 06's loss needs so that the
# model is graded on every answer token, `<|end|>` included, and on nothing else. No recipe: think about
# which position predicts a given token, and what the last position can predict. The check tries the
# usual slips on short conversations and names the one it finds.

# %%
#| export
IGNORE = -1  # the target GPT.forward leaves out of the loss


# Your turn - Exercise 11.2 (★★☆, build): the loss mask of supervised fine-tuning.
def sft_targets(ids: list[int], is_answer: list[bool]) -> list[int]:
    """ids [T], is_answer [T] -> targets [T] for chapter 06's loss: the model is graded on predicting
    each answer token (is_answer True) and on nothing else, IGNORE (-1) everywhere it is not."""
    if len(ids) != len(is_answer):
        raise ValueError(f"ids and is_answer must have one entry per token, got {len(ids)} and {len(is_answer)}")
    ### BEGIN SOLUTION
    targets = [nxt if trained else IGNORE for nxt, trained in zip(ids[1:], is_answer[1:], strict=True)]
    return targets + [IGNORE] * min(1, len(ids))
    ### END SOLUTION

# %%
sft_targets = check_sft_targets(sft_targets).use
print(sft_targets(ids, is_answer))

# %% [markdown]
# ## 4. An instruction set from the plays, built offline
#
# SFT needs conversations with right answers. Big assistants are tuned on conversations written or
# checked by people (InstructGPT's SFT set held about 13,000 prompts with written answers; LIMA showed
# that 1,000 carefully chosen ones can go a long way); this course builds its own from what it ships,
# deterministically, with answers a program can check, so "did fine-tuning work?" has a number:
#
# | kind | prompt | answer |
# |---|---|---|
# | `upper` | `upper: gentle` | `GENTLE` |
# | `reverse` | `reverse: gentle` | `eltneg` |
# | `count` | `count: gentle` | `6` |
# | `speaker` | `who says: To be, or not to be, that is the qu` | `Hamlet` |
#
# The words are the plays' words of 3 to 7 letters; the speaker task takes the first 30 characters of a
# speech by one of the eight most frequent speakers. The **held-out** words and lines are set aside
# before anything is trained: no held-out prompt appears in training (for the word tasks, no held-out
# word does), so a score on them measures a skill, not a memory.

# %%
#| export
KINDS = ("upper", "reverse", "count", "speaker")


@dataclass(frozen=True)
class Example:
    """One task: a prompt, its one right answer, and its kind (one of KINDS)."""

    kind: str
    prompt: str
    answer: str

    def messages(self, with_answer: bool = True) -> list[dict]:
        user = [{"role": "user", "content": self.prompt}]
        return user + [{"role": "assistant", "content": self.answer}] if with_answer else user


@dataclass
class TaskSet:
    """Training and held-out examples of each kind: ``train[kind]``, ``held[kind]`` (lists of Example)."""

    train: dict[str, list[Example]]
    held: dict[str, list[Example]]


def word_task(kind: str, word: str) -> Example:
    """The task of `kind` (upper, reverse or count) on `word`, with its one right answer."""
    answer = {"upper": word.upper(), "reverse": word[::-1], "count": str(len(word))}[kind]
    return Example(kind, f"{kind}: {word}", answer)


def make_tasks(text: str, n_held: int = 100, seed: int = 0, speakers: int = 8) -> TaskSet:
    """The course's instruction set from the plays' `text` (deterministic for a text and seed): word tasks
    on the words of 3-7 letters seen 3+ times, the speaker task on the first line (30 characters) of the
    speeches of the `speakers` most frequent speakers. `n_held` words and lines per kind are held out,
    and no held-out prompt (or word) is trained on."""
    rng = random.Random(seed)
    counts = collections.Counter(re.findall(r"[a-z]+", text))
    words = sorted(w for w, n in counts.items() if 3 <= len(w) <= 7 and n >= 3)
    rng.shuffle(words)
    speeches = re.findall(r"^([A-Z][A-Z ]+):\n(.{20,})$", text, re.M)
    top = {s for s, _ in collections.Counter(s for s, _ in speeches).most_common(speakers)}
    lines = sorted({(line[:30], s.title()) for s, line in speeches if s in top})
    by_prompt = collections.Counter(line for line, _ in lines)  # a line two speakers begin alike has no one answer
    lines = [(line, who) for line, who in lines if by_prompt[line] == 1]
    rng.shuffle(lines)
    if min(len(words), len(lines)) <= 2 * n_held:
        raise ValueError(f"the text is too small for {n_held} held-out examples per kind")
    held = {k: [word_task(k, w) for w in words[:n_held]] for k in KINDS[:3]}
    train = {k: [word_task(k, w) for w in words[n_held:]] for k in KINDS[:3]}
    held["speaker"] = [Example("speaker", f"who says: {line}", who) for line, who in lines[:n_held]]
    train["speaker"] = [Example("speaker", f"who says: {line}", who) for line, who in lines[n_held:]]
    return TaskSet(train=train, held=held)

# %%
text = load_shakespeare()
tasks = make_tasks(text)
for kind in KINDS:
    print(f"{kind:8} train {len(tasks.train[kind]):5}  held out {len(tasks.held[kind])}  e.g. {tasks.held[kind][0]}")
shared = {e.prompt for k in KINDS for e in tasks.held[k]} & {e.prompt for k in KINDS for e in tasks.train[k]}
longest = max(len(render_chat(e.messages(), tok)[0]) for k in KINDS for e in tasks.train[k] + tasks.held[k])
print("held-out prompts also in training:", len(shared), "| longest conversation:", longest, "tokens of 64")

# %% [markdown]
# A batch is B conversations, one per row, drawn with the kinds in equal shares; rows shorter than the
# context are padded with `<|end|>` whose targets are -1, so padding costs compute but never enters the
# loss. A conversation can hold several exchanges (`turns`, used from section 8 on), each answer
# trained; `conversation` strings examples together.

# %%
#| export
def conversation(examples: list[Example]) -> list[dict]:
    """Examples -> the messages of one conversation: each example's question and its right answer, in turn."""
    return [m for e in examples for m in e.messages()]


def sft_batch(tasks: TaskSet, tok: ChatTokenizer, batch_size: int, block_size: int, generator: random.Random,
              masked: bool = True, turns: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(x [B, T], y [B, T]) with T = block_size: B conversations, each kind equally likely, padded with
    <|end|> (target -1). `turns` > 1: a conversation has 1 to `turns` exchanges (equally likely); each
    earlier exchange is the first of up to 10 draws that still fits the context, and every answer is
    trained. `masked=False` trains every next token, the prompt's too (to show why not)."""
    turns = whole_number(turns, "turns")
    x = torch.full((batch_size, block_size), tok.end_id, dtype=torch.long)
    y = torch.full((batch_size, block_size), IGNORE, dtype=torch.long)

    def draw() -> Example:
        return generator.choice(tasks.train[generator.choice(sorted(tasks.train))])

    for row in range(batch_size):
        examples = [draw()]
        for _ in range(generator.randint(1, turns) - 1 if turns > 1 else 0):
            earlier = next((e for e in (draw() for _ in range(10))
                            if len(render_chat(conversation([e, *examples]), tok)[0]) <= block_size), None)
            examples = [earlier, *examples] if earlier else examples
        ids, is_answer = render_chat(conversation(examples), tok)
        if len(ids) > block_size:
            raise ValueError(f"{examples[-1]} takes {len(ids)} tokens, more than block_size={block_size}")
        targets = sft_targets(ids, is_answer if masked else [True] * len(ids))
        x[row, : len(ids)] = torch.tensor(ids)
        y[row, : len(ids)] = torch.tensor(targets)
    return x, y

# %% [markdown]
# ## 5. Supervised fine-tuning
#
# Fine-tuning is chapter 06's training loop, shorter and gentler: `train_step` on SFT batches, AdamW,
# a learning rate that warms up and falls along a cosine (`lr_at`), no weight decay (the aim is to move
# a good model a little, not to shrink it). `finetune` trains the parameters that require a gradient, so
# the same function will train LoRA's adapters in section 7.

# %%
#| export
def finetune(model: GPT, tasks: TaskSet, tok: ChatTokenizer, steps: int, lr: float = 1e-3, batch_size: int = 32,
             seed: int = 0, masked: bool = True, progress: bool = False, turns: int = 1) -> list[float]:
    """SFT: `steps` AdamW steps (warm-up, then a cosine to lr/10) on `sft_batch`es of conversations of
    1 to `turns` exchanges, over the parameters with requires_grad; returns the loss of every step.
    Batches come from `seed` (the global random state is untouched)."""
    from tqdm.auto import tqdm

    steps = whole_number(steps, "steps")
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("no parameter requires a gradient: nothing to fine-tune")
    schedule = TrainConfig(max_iters=steps, learning_rate=lr, min_lr=lr / 10, warmup_iters=min(50, steps - 1))
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.99))
    generator, losses = random.Random(seed), []
    model.train()
    for step in tqdm(range(steps), disable=not progress, desc="fine-tuning"):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, schedule)
        x, y = sft_batch(tasks, tok, batch_size, model.cfg.block_size, generator, masked, turns)
        losses.append(train_step(model, optimizer, x, y))
        if not math.isfinite(losses[-1]):
            raise FloatingPointError(f"the loss is {losses[-1]} at step {step}: lower the learning rate")
    return losses

# %% [markdown]
# **Why the mask?** Two copies of the grown model, 150 steps each, identical but for the mask. The
# unmasked run spends most of its loss on the questions (they are most of the tokens), and it learns to
# *write* them: given only the user's turn token, it writes a question of the instruction set. In a chat
# application that model would, as soon as its answer's end token was missed or ignored, carry on as
# the user. The masked run was never asked to predict a question, so it has no reason to write one.

# %%
masked_model, unmasked_model = add_chat_tokens(base.model), add_chat_tokens(base.model)
masked_losses = finetune(masked_model, tasks, tok, steps=150, seed=1)
unmasked_losses = finetune(unmasked_model, tasks, tok, steps=150, seed=1, masked=False)
n_targets = {m: int((sft_batch(tasks, tok, 256, 64, random.Random(0), masked=m)[1] != -1).sum()) for m in (True, False)}
print(f"targets that are answers: {n_targets[True] / n_targets[False]:.0%} of what the unmasked loss trains")
print("masked loss fell below half its start:", masked_losses[-1] < masked_losses[0] / 2)

# %%
TASK_STARTS = ("upper: ", "reverse: ", "count: ", "who says: ")
written = {name: tok.decode(generate(m, torch.tensor([[tok.user_id]]), 16, temperature=0.0)[0, 1:].tolist())
           for name, m in (("unmasked", unmasked_model), ("masked", masked_model))}
for name, text_written in written.items():
    print(f"{name:9} given <|user|>, writes a question of the instruction set: {text_written.startswith(TASK_STARTS)}")

# %%
# NBVAL_IGNORE_OUTPUT
# what each wrote (its exact characters depend on how this CPU rounded the 150 training steps)
for name, text_written in written.items():
    print(f"{name:9} {text_written!r}")

# %% [markdown]
# The masked run fine-tuned for longer is the model the course ships: 1,000 steps of 32 conversations at
# a peak learning rate of 1e-3 (conversations of one to three questions: section 8 shows why), built by `tools/build_course_model.py` with this chapter's `finetune` and
# loaded, checked against its SHA-256, by `load_chat_model()`. (Its manifest says the machine and time: a
# few minutes on two CPU cores.) To score it, `answer` decodes greedily until `<|end|>`, and
# `exact_match` counts the answers that equal the right one exactly, per kind; a batch of prompts of the
# same length is decoded at once.

# %%
#| export
@torch.no_grad()
def reply_ids(model: GPT, tok: ChatTokenizer, prompts: list, max_new_tokens: int = 16,
              temperature: float = 0.0, generator: torch.Generator | None = None) -> list[list[int]]:
    """The ids the model writes after each prompt, up to and with its <|end|> (a reply cut at
    `max_new_tokens` has none). A prompt is a user's message (str) or a conversation so far (a list of
    messages ending with the user's). Greedy by default; `temperature` > 0 samples with `generator`.
    Prompts of one rendered length share a batch."""
    rendered = [render_chat([{"role": "user", "content": p}] if isinstance(p, str) else p, tok, True)[0]
                for p in prompts]
    out: dict[int, list[int]] = {}
    by_length = collections.defaultdict(list)
    for i, ids in enumerate(rendered):
        by_length[len(ids)].append(i)
    for rows in by_length.values():
        ids = torch.tensor([rendered[i] for i in rows])
        new = generate(model, ids, max_new_tokens, temperature=temperature, eos_id=tok.end_id,
                       generator=generator)[:, ids.shape[1]:]
        for i, row in zip(rows, new.tolist(), strict=True):
            out[i] = row[: row.index(tok.end_id) + 1] if tok.end_id in row else row
    return [out[i] for i in range(len(prompts))]


def answers(model: GPT, tok: ChatTokenizer, prompts: list, max_new_tokens: int = 16,
            temperature: float = 0.0, generator: torch.Generator | None = None) -> list[str]:
    """The text of `reply_ids` without its <|end|>: greedy answers by default. An answer that writes a
    turn marker keeps it, so it matches no right answer."""
    return [tok.decode(row[:-1] if row[-1:] == [tok.end_id] else row)
            for row in reply_ids(model, tok, prompts, max_new_tokens, temperature, generator)]


def exact_match(model: GPT, tok: ChatTokenizer, held: dict[str, list[Example]]) -> dict[str, float]:
    """The share of each kind's examples whose greedy answer equals the right one exactly."""
    scores = {}
    for kind, examples in held.items():
        got = answers(model, tok, [e.prompt for e in examples])
        scores[kind] = sum(g == e.answer for g, e in zip(got, examples, strict=True)) / len(examples)
    return scores


def turn_conversations(held: dict[str, list[Example]], tok: ChatTokenizer, turn: int, block_size: int,
                       seed: int = 0, kinds=None) -> dict[str, list[tuple[list[dict], Example]]]:
    """For each of `kinds` (default: all of `held`), [(conversation so far, example)]: each held-out example
    asked as the `turn`-th question, after `turn` - 1 exchanges drawn from all of `held`'s word tasks with
    their right answers, the draw seeded by the example (the same whichever kinds are scored). An example
    for which no such conversation (its answer included) fits `block_size` in 50 draws is left out (with a
    context of 64, a speaker's line fits only as a first question, or a second after a short one)."""
    turn = whole_number(turn, "turn")
    earlier = [e for k in KINDS[:3] for e in held.get(k, [])]
    out: dict[str, list[tuple[list[dict], Example]]] = {}
    for kind in kinds or held:
        out[kind] = []
        for e in held[kind]:
            rng = random.Random(f"{seed}-{turn}-{e.prompt}")
            for _ in range(50):
                before = conversation(rng.sample([o for o in earlier if o != e], turn - 1))
                if len(render_chat(before + e.messages(), tok)[0]) <= block_size:
                    out[kind].append((before + e.messages(with_answer=False), e))
                    break
    return out


def exact_match_by_turn(model: GPT, tok: ChatTokenizer, held: dict[str, list[Example]], turns: int = 3,
                        seed: int = 0, kinds=None) -> dict[int, dict[str, float | None]]:
    """{turn: {kind: share right}}: `exact_match` with each held-out example of `kinds` (default: all)
    asked as the 1st, 2nd, ... question of a conversation (`turn_conversations`); None where no
    conversation of that length fits."""
    scores: dict[int, dict[str, float | None]] = {}
    for turn in range(1, whole_number(turns, "turns") + 1):
        scores[turn] = {}
        for kind, pairs in turn_conversations(held, tok, turn, model.cfg.block_size, seed, kinds).items():
            got = answers(model, tok, [talk for talk, _ in pairs])
            scores[turn][kind] = sum(g == e.answer for g, (_, e) in zip(got, pairs, strict=True)) / len(pairs) \
                if pairs else None
    return scores


@torch.no_grad()
def bits_per_char(model: GPT, data: torch.Tensor, chars: int | None = None, batches: int = 20, seed: int = 0) -> float:
    """The model's cross-entropy on text `data` (ids [N]) in bits per character, over `batches` batches of
    16 windows drawn with `seed`. `chars`: score over the first `chars` ids only (the characters), so the
    probability a chat model gives its turn tokens is not counted against it."""
    was_training = model.training
    model.eval()
    generator, total = torch.Generator().manual_seed(seed), 0.0
    for _ in range(batches):
        x, y = get_batch(data, model.cfg.block_size, 16, generator=generator)
        logits = model(x)[0][..., :chars]  # (16, T, chars or V)
        total += F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()).item()
    model.train(was_training)
    return total / batches / math.log(2)

# %%
chat = load_chat_model()  # .model, .tokenizer (a ChatTokenizer), .losses, .manifest
grown = add_chat_tokens(base.model).eval()
before, after = exact_match(grown, tok, tasks.held), exact_match(chat.model, chat.tokenizer, tasks.held)
print("held-out exact match (100 per kind)")
for kind in KINDS:
    print(f"  {kind:8} before {before[kind]:4.0%}   after {after[kind]:4.0%}")
print("the shipped model's recorded scores hold here:", chat.manifest["held_out_exact_match"] == after)

# %% [markdown]
# Three kinds went from nothing to (nearly) always right, on words the model never saw in fine-tuning:
# it learned the *skills*. Not all at the same pace: the benchmark's stored table in section 7 (a fresh
# full fine-tune for each length) has counting first, 68% after 100 steps and 96% after 250, and
# upper-casing and reversing later and together: 2% and 12% after 250 steps, 73% and 78% after 500,
# 100% and 99% after 1,000. Upper-casing, which looks like the easier of the two (a fixed map from one
# character to another), was learned no faster than reversing. A likely reason: both answers copy the
# word one character at a time, each from a place in the prompt that attention must find (counted from
# the word's start, or from its end), while a count is a single character.
# `speaker` stays near guessing among eight names (1 in 8 is 12.5%): who says a line is knowledge about
# the plays, and a 0.8 M-parameter model that reaches 1.87 nats per character on them has little of it.
#
# Compare the "superficial alignment hypothesis" of the LIMA paper, which fine-tuned a
# 65-billion-parameter LLaMA on 1,000 examples: a model's knowledge and capabilities come almost
# entirely from pretraining, and fine-tuning mostly teaches the format of its answers. Half of what
# happened here fits it: fine-tuning added little knowledge (`speaker`). The other half does not. After
# 100 steps the model already answered in the format (counting was 68% right), yet upper-casing and
# reversing were still at 0%; they took 500 to 1,000 steps of 32 conversations. Here SFT taught those
# skills, on top of the format. A 0.8 M-parameter model trained only to continue Shakespeare has
# little capability for fine-tuning to bring out.
#
# ## 6. The price: forgetting
#
# The fine-tuned model was never trained on plain Shakespeare again. How well does it still predict it?

# %%
train_ids, val_ids = train_val_split(torch.tensor(base.tokenizer.encode(text[-200_000:])))
bits_before, bits_after = bits_per_char(base.model, val_ids, chars=76), bits_per_char(chat.model, val_ids, chars=76)
print("Shakespeare, bits per character (over the 76 characters): worse after fine-tuning:", bits_after > bits_before)
print("worse than guessing every character equally likely (log2 76 = 6.25 bits):", bits_after > math.log2(76))
fig, ax = plt.subplots(figsize=(6, 2.8))
ax.plot(chat.losses, lw=0.8, label="SFT loss (answers only)")
ax.set(xlabel="fine-tuning step", ylabel="cross-entropy (nats)", yscale="log", title="the shipped model's SFT run")
ax.legend()
plt.show()

# %% [markdown]
# The model predicts Shakespeare far worse than before (the shipped model's manifest has the numbers:
# from about 2.7 bits per character to over 8), worse than a uniform guess: 1,000 steps at a learning
# rate of 1e-3 moved every weight towards four tiny tasks, and nothing held the old skill in place.
# This is **catastrophic forgetting**, and it is one reason fine-tuning recipes may mix some
# pretraining text into their batches, train briefly at a low learning rate, or leave the weights alone
# altogether and train a small add-on: LoRA.
#
# ## 7. LoRA: fine-tune a low-rank change, not the weights
#
# A full fine-tune writes a new copy of every weight matrix. Hu et al. (2021) hypothesised, after
# earlier work had found that fine-tuning needs few degrees of freedom (a low "intrinsic dimension"),
# that the *change* a fine-tune needs, ΔW = W_tuned − W, has a low rank, so that a product of two thin
# matrices can stand in for it; on the tasks they tried, LoRA matched full fine-tuning. **LoRA** freezes
# W [out, in] and trains only A [r, in] and B [out, r], with r small (4, 8, 16), so the layer computes
#
# `y = x Wᵀ + b + (α / r) · x Aᵀ Bᵀ`
#
# B starts at zero, so the adapted model starts exactly at the base model; A starts random (as a Linear's
# weight does), so the gradient of B is not zero. The paper scales the adapter by α / r with α held
# fixed while r varies (set to the first r tried, then left alone), so that a change of r needs less
# retuning of the learning rate: that is its reason for the scale. `LoRALinear` below defaults instead to
# α = 2r, a scale of 2 at every rank, and the rank sweep at the end of this section uses that default:
# it does not use the paper's scaling.
#
# **Your turn (predict).** Chapter 04's packed projection `attn.qkv` of this model maps C = 128 to 3·128
# = 384. How many numbers does a rank-8 adapter on it train?

# %%
# Your turn - Exercise 11.3 (★☆☆, predict): the size of a LoRA adapter.
def my_prediction() -> int:
    """The trainable parameters of a rank-8 adapter on a 128 -> 384 linear layer."""
    ### BEGIN SOLUTION
    return 8 * 128 + 384 * 8
    ### END SOLUTION


lora_prediction = check_predict_lora_parameters(my_prediction)  # the layer after the next exercise counts it

# %% [markdown]
# **Your turn.** Write `LoRALinear.forward`: x [..., in] to [..., out], the equation above, with the
# frozen layer as `self.base` and α / r as `self.scale`. The equation does not say in which order to
# multiply, and the order is the point of a low rank: before you write it, count the multiply-adds per
# position of each order for in = 128, out = 384, r = 8, and keep the cheaper one.

# %%
#| export lora
"""LoRA (chapter 11): a low-rank adapter around a frozen linear layer, merged back into one matrix
when training is done; which layers of a GPT get one; and the adapter's own small file.
Shapes: in, out the wrapped layer's widths, r the adapter's rank."""

import torch
from torch import nn

from transformer_course.arguments import real_number, whole_number
from transformer_course.checkpoint import weights_problem

LORA_TARGETS = ("attn.qkv", "mlp.fc")  # the layers `add_lora` adapts in every block


# Your turn - Exercise 11.4 (★★☆, build): LoRA's forward pass.
class LoRALinear(nn.Module):
    """A frozen `base` nn.Linear [out, in] plus a trainable low-rank change: A [r, in] (random, like a
    Linear's weight) and B [out, r] (zeros, so the adapted layer starts equal to the base), scaled by
    alpha / r. forward: x [..., in] -> base(x) + scale · (x Aᵀ) Bᵀ  [..., out]."""

    def __init__(self, base: nn.Linear, rank: int = 8, alpha: float | None = None,
                 generator: torch.Generator | None = None):
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"LoRALinear wraps an nn.Linear, got {type(base).__name__}")
        self.rank = whole_number(rank, "rank", high=min(base.in_features, base.out_features))
        self.alpha = real_number(2.0 * rank if alpha is None else alpha, "alpha", low=0, low_open=True)
        self.scale = self.alpha / self.rank
        self.base = base.requires_grad_(False)
        bound = 1 / base.in_features ** 0.5  # nn.Linear's own initial range
        a = torch.rand(self.rank, base.in_features, generator=generator) * 2 * bound - bound
        self.A = nn.Parameter(a.to(base.weight))  # (r, in)
        self.B = nn.Parameter(base.weight.new_zeros(base.out_features, self.rank))  # (out, r)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        return self.base(x) + (x @ self.A.T) @ self.B.T * self.scale  # (..., out)
        ### END SOLUTION

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha}"

# %%
LoRALinear = check_lora_forward(LoRALinear).use
layer = LoRALinear(nn.Linear(128, 384, bias=False), rank=8, generator=torch.Generator().manual_seed(0))
x = torch.randn(2, 5, 128)
print("starts as the base layer:", torch.equal(layer(x), layer.base(x)),
      "| trainable:", sum(p.numel() for p in layer.parameters() if p.requires_grad),
      "| your prediction (11.3):", "right" if lora_prediction.passed else lora_prediction.status)  # right if 11.3 passed

# %% [markdown]
# After training, the adapter can be folded into the weight: the frozen W and the adapter's change
# together make one ordinary [out, in] matrix, so the merged model runs at exactly the base model's
# speed, with no trace of LoRA.
# Below is a merge found in the wild: it looks right, and the merged model is wrong.

# %%
def merged_weight_buggy(lora: LoRALinear) -> torch.Tensor:
    return lora.base.weight + lora.B @ lora.A


trained = LoRALinear(nn.Linear(8, 6), rank=2, generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    trained.B.normal_(generator=torch.Generator().manual_seed(2))  # as if trained
x8 = torch.randn(3, 8)
print("buggy merge equals the adapter's forward:",
      torch.allclose(x8 @ merged_weight_buggy(trained).T + trained.base.bias, trained(x8), atol=1e-6))

# %% [markdown]
# **Your turn (debug).** Find the bug and write the fixed `merged_weight(lora)`: the merged [out, in]
# matrix, detached (a merge is done after training). The test above should then say True.

# %%
#| export lora
# Your turn - Exercise 11.5 (★★☆, debug): merge an adapter into its layer.
def merged_weight(lora: LoRALinear) -> torch.Tensor:
    """The [out, in] weight of one linear layer that computes what `lora` computes (bias aside)."""
    ### BEGIN SOLUTION
    return (lora.base.weight + lora.scale * lora.B @ lora.A).detach()
    ### END SOLUTION

# %%
merged_weight = check_merged_weight(merged_weight).use
print("fixed merge equals the adapter's forward:",
      torch.allclose(x8 @ merged_weight(trained).T + trained.base.bias, trained(x8), atol=1e-6))

# %% [markdown]
# `add_lora` wraps the chosen layers of every block (here the attention's packed `qkv` and the MLP's
# widening `fc`), freezes every other weight, and leaves only the **new token rows** of the embedding
# trainable: the base model has no idea what `<|end|>` means, and a frozen random row would have to be
# worked around. `merge_lora` folds every adapter back; `adapter_state` is what an adapter file holds.

# %%
#| export lora
def _module(model: nn.Module, dotted: str) -> tuple[nn.Module, str]:
    *path, name = dotted.split(".")
    parent = model
    for part in path:
        parent = getattr(parent, part)
    return parent, name


def add_lora(model: nn.Module, rank: int = 8, alpha: float | None = None, targets=LORA_TARGETS,
             train_rows_from: int | None = None, seed: int = 0) -> nn.Module:
    """Freeze `model` and wrap the `targets` layers of every block in a `LoRALinear` (in place; returns
    the model). `train_rows_from`: the embedding rows from this id on stay trainable (new tokens); their
    gradient is kept, the other rows' set to zero."""
    generator = torch.Generator().manual_seed(seed)
    model.requires_grad_(False)
    for block in model.blocks:
        for target in targets:
            parent, name = _module(block, target)
            setattr(parent, name, LoRALinear(getattr(parent, name), rank, alpha, generator))
    if train_rows_from is not None:
        weight = model.embed.token.weight.requires_grad_(True)
        keep = torch.zeros_like(weight[:, :1])  # (V, 1)
        keep[train_rows_from:] = 1.0
        weight.register_hook(lambda grad: grad * keep)
        model.embed.trainable_from = train_rows_from
    return model


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """What an adapter file holds: every LoRA A and B, and the trainable new embedding rows."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items() if k.endswith((".A", ".B"))}
    first = getattr(model.embed, "trainable_from", None)
    if first is not None:
        state["embed.token.new_rows"] = model.embed.token.weight[first:].detach().clone()
    return state


def trainable_parameters(model: nn.Module) -> int:
    """The numbers fine-tuning changes: LoRA's A and B and the new embedding rows."""
    return sum(v.numel() for v in adapter_state(model).values())


def load_adapter(model: nn.Module, state: dict[str, torch.Tensor]) -> nn.Module:
    """Copy an `adapter_state` into a model prepared by `add_lora` the same way (in place). Anything but
    a dict of finite floating-point tensors that fits the model raises a ValueError saying why."""
    if problem := weights_problem(state):  # whole numbers would be copied in silently, rounded
        raise ValueError(f"not an adapter: {problem}; load_adapter takes what adapter_state returns, a dict of "
                         "finite floating-point tensors")
    own = adapter_state(model)
    if own.keys() != state.keys() or any(own[k].shape != state[k].shape for k in own):
        raise ValueError("the adapter does not fit this model: prepare it with add_lora(model, rank, ...) "
                         "as the adapter was trained (same rank, targets and vocabulary)")
    with torch.no_grad():
        for key, value in state.items():
            if key == "embed.token.new_rows":
                model.embed.token.weight[model.embed.trainable_from:] = value
            else:
                parent, name = _module(model, key)
                getattr(parent, name).copy_(value)
    return model


def merge_lora(model: nn.Module) -> nn.Module:
    """Replace every LoRALinear in `model` by one nn.Linear of its merged weight (in place)."""
    for name, module in list(model.named_modules()):
        if isinstance(module, LoRALinear):
            merged = nn.Linear(module.base.in_features, module.base.out_features, bias=module.base.bias is not None)
            with torch.no_grad():
                merged.weight.copy_(merged_weight(module))
                if module.base.bias is not None:
                    merged.bias.copy_(module.base.bias)
            parent, attr = _module(model, name)
            setattr(parent, attr, merged.to(module.base.weight.device))
    return model

# %% [markdown]
# A short LoRA run on the grown model, to see that only the adapters and the three rows move:

# %%
lora_model = add_lora(add_chat_tokens(base.model), rank=8, train_rows_from=76)
frozen_before = {k: v.clone() for k, v in lora_model.state_dict().items() if k.endswith("base.weight")}
lora_losses = finetune(lora_model, tasks, tok, steps=100, lr=5e-3, seed=1)
moved = [k for k, v in lora_model.state_dict().items() if k in frozen_before and not torch.equal(v, frozen_before[k])]
print("frozen weights that moved:", len(moved), "| loss fell:", lora_losses[-1] < lora_losses[0])
print(f"trainable: {trainable_parameters(lora_model):,} of {grown.num_parameters():,}",
      f"({trainable_parameters(lora_model) / grown.num_parameters():.1%})")

# %% [markdown]
# The course ships an adapter trained the same way for 2,500 steps (a learning rate of 5e-3, five times
# the full fine-tune's: with so few numbers to move, the adapter needed bigger steps here).
# `load_lora_adapter()` returns the base model with the adapter loaded. Compare it with the full
# fine-tune: the score, what is trained, and what is saved.

# %%
import io

shipped = load_lora_adapter()  # .state (the adapter file's tensors), .rank, .manifest
adapted = load_adapter(add_lora(add_chat_tokens(base.model), rank=shipped.rank, train_rows_from=76), shipped.state)
lora_scores = exact_match(adapted, tok, tasks.held)


def saved_bytes(obj) -> int:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getbuffer().nbytes


full_bytes, lora_bytes = saved_bytes(chat.model.state_dict()), saved_bytes(adapter_state(adapted))
print(f"{'':9}{'full SFT':>10}{'LoRA r=8':>10}")
for kind in KINDS:
    print(f"{kind:9}{after[kind]:10.0%}{lora_scores[kind]:10.0%}")
print(f"{'trained':9}{chat.model.num_parameters():10,}{trainable_parameters(adapted):10,}")
print(f"{'file':9}{full_bytes // 1024:8,} KB{lora_bytes // 1024:8,} KB")

# %% [markdown]
# And merged, the adapter leaves no trace: the merged model is a plain GPT of chapter 06's classes whose
# logits equal the adapted model's to 1e-5 (checked below). It forgets less than the full fine-tune,
# because the characters' embeddings and most weights are frozen; but here it still forgets a lot: a
# small model, a high learning rate and four narrow tasks pull hard on what little it has.

# %%
probe = torch.tensor([render_chat(tasks.held["reverse"][0].messages(), tok)[0]])
with torch.no_grad():
    adapted_logits = adapted(probe)[0]
    merged_model = merge_lora(adapted)
    merged_logits = merged_model(probe)[0]
print("merged equals adapted (within 1e-5):", bool((merged_logits - adapted_logits).abs().max() < 1e-5),
      "| LoRA layers left:", sum(isinstance(m, LoRALinear) for m in merged_model.modules()))
print("forgets less than the full fine-tune:", bits_per_char(merged_model, val_ids, chars=76) < bits_after)

# %% [markdown]
# **The rank.** What does r buy? The number of trained parameters and the file grow linearly with r.
# The score, for a fixed budget of steps, is measured by `benchmarks/bench_assistant.py`, which trains
# every rank for the same 1,000 steps; its stored table (its machine named) is shown below, after the
# sizes, which need no training. On the authors' CPU the small ranks had barely started at 1,000 steps:
# an adapter this small learns more slowly than the whole model, which is why the shipped rank-8 adapter
# trained 2,500 steps where the full fine-tune trained 1,000. Every rank there has α = 2r, so the scale
# is 2 at every rank, not the paper's fixed α over r. The adapter's change (α / r)·B A is a sum of r
# rank-one terms, and at one scale and one learning rate a smaller rank tends to change the layer less
# per step; with the paper's fixed α the scale would grow as r shrinks, working against that. So the
# table does not separate what a small rank can hold from the smaller steps it takes.

# %%
for r in (1, 2, 4, 8, 16, 32):
    m = add_lora(add_chat_tokens(base.model), rank=r, train_rows_from=76)
    print(f"rank {r:2}: {trainable_parameters(m):7,} trained ({trainable_parameters(m) / grown.num_parameters():5.1%}),"
          f" adapter file {saved_bytes(adapter_state(m)) // 1024:4} KB")

# %%
# NBVAL_IGNORE_OUTPUT
# the benchmark's stored table (make bench rewrites it, on whatever machine runs it)
results = Path("../benchmarks/results/assistant.md")
print(results.read_text() if results.exists() else "run `make bench` to measure accuracy by rank")

# %% [markdown]
# ## 8. Talk to it
#
# A chat keeps the conversation so far, renders it with the generation prompt, and streams the
# assistant's answer until `<|end|>`. With a context of 64 positions the history must be cut: `fit_history`
# drops the oldest exchanges until the conversation and room for the answer fit. Only characters and
# `<|end|>` may be sampled, never a turn marker (`stream`'s `allowed`).

# %%
#| export
def fit_history(messages: list[dict], tok: ChatTokenizer, block_size: int, room: int) -> list[dict]:
    """The latest messages whose rendering (with the generation prompt) leaves `room` positions of
    `block_size` for the answer, starting at a user's message (or at the last message): the oldest
    exchanges are dropped first; a ValueError if the last message alone does not fit. It walks back from
    the newest message, rendering each once, and stops where the context is full, so a history of any
    length costs about one context of work (the older messages are dropped unread)."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    need, start = 1, None  # the generation prompt's <|assistant|>
    for i in range(len(messages) - 1, -1, -1):
        need += len(render_chat([messages[i]], tok)[0])  # its role token, content and <|end|>
        if need + room > block_size:
            break
        if messages[i]["role"] == "user" or i == len(messages) - 1:
            start = i
    if start is None:
        last = len(render_chat(messages[-1:], tok, generation_prompt=True)[0])
        raise ValueError(f"the last message is too long: its {last} positions and {room} for the answer do not "
                         f"fit a context of {block_size}; shorten it, or ask for fewer new tokens (at most "
                         f"{max(block_size - last, 0)} here)")
    return messages[start:]


def reply_stream(model: GPT, tok: ChatTokenizer, messages: list[dict], max_new_tokens: int = 24,
                 temperature: float = 0.0, top_k: int | None = None,
                 generator: torch.Generator | None = None) -> Iterator[str]:
    """Stream the assistant's reply to `messages` (history cut by `fit_history`), one piece of text per
    token, until <|end|> or `max_new_tokens`. Greedy by default (temperature 0)."""
    kept = fit_history(messages, tok, model.cfg.block_size, max_new_tokens)
    ids = torch.tensor([render_chat(kept, tok, generation_prompt=True)[0]])
    allowed = [*range(tok.base.vocab_size), tok.end_id]
    for nxt in stream(model, ids, max_new_tokens, temperature, top_k, generator=generator, eos_id=tok.end_id,
                      allowed=allowed):
        if int(nxt[0]) == tok.end_id:
            return
        yield tok.decode([int(nxt[0])])

# %%
history = [{"role": "user", "content": "reverse: stars"}]
print("".join(reply_stream(chat.model, chat.tokenizer, history)))

# %% [markdown]
# ### The second message
#
# A chat sends the whole conversation, so every answer after the first is written after earlier
# exchanges: `<|user|>count: rose<|end|><|assistant|>4<|end|><|user|>reverse: stars<|end|><|assistant|>`.
# Every conversation the masked run of section 5 was fine-tuned on held one question.
# `exact_match_by_turn` asks each held-out question as the first, second or third of a conversation
# whose earlier exchanges are other held-out word tasks with their right answers (a speaker's line is
# long: with 64 positions it fits only as a first question, or a second after a short one). Here is
# the 150-step masked model on counting, the one skill it had learned by then:

# %%
single_turn = exact_match_by_turn(masked_model.eval(), tok, tasks.held, kinds=["count"])
for turn, scores in single_turn.items():
    print(f"turn {turn}: count {scores['count']:4.0%}")
print("after one exchange it mostly fails:", single_turn[2]["count"] < single_turn[1]["count"] / 2)

# %% [markdown]
# The skill is still in the weights; what the model never saw is a question that follows an answer, at
# positions beyond the first exchange. (The model this course shipped up to version 0.3.0 was trained on
# single questions too, for 1,000 steps, and failed the same way; the benchmark below repeats that
# recipe.) The cure is in the data:
# `sft_batch(..., turns=3)` builds conversations of one to three exchanges, each earlier exchange
# drawn so that the whole still fits the context, and trains every answer in them. The shipped model
# was fine-tuned that way (`CHAT_TURNS` in `course_model`); the same measurement on it:

# %%
shipped_by_turn = exact_match_by_turn(chat.model, chat.tokenizer, tasks.held, kinds=["reverse", "count"])
for turn, scores in shipped_by_turn.items():
    print(f"turn {turn}: " + "   ".join(f"{kind} {score:4.0%}" for kind, score in scores.items()))
recorded = chat.manifest["held_out_exact_match_by_turn"]
print("as its manifest records:", all(shipped_by_turn[t][k] == recorded[str(t)][k] for t in (1, 2, 3)
                                      for k in ("reverse", "count")))

# %% [markdown]
# The benchmark below repeats both recipes at the shipped length (1,000 steps) over three seeds, and
# measures the three shipped chat models (chapter 12's DPO and GRPO models start from this one and
# train on single questions). Read it for two things: how the single-question recipe does at turns 2
# and 3, and whether preference training on single questions kept what this model learned.

# %%
# NBVAL_IGNORE_OUTPUT
# the benchmark's stored table (python benchmarks/bench_multi_turn.py rewrites it, on whatever machine runs it)
results = Path("../benchmarks/results/multi_turn.md")
print(results.read_text() if results.exists() else "run benchmarks/bench_multi_turn.py to measure exact match by turn")

# %% [markdown]
# The chat box below streams each character into the page as it is written. Type a task in the same
# form (`upper: ...`, `reverse: ...`, `count: ...`, `who says: ...`); the model knows nothing else, and
# answers anything else with its best guess at one of them.

# %%
import ipywidgets as widgets

box, send, shown = widgets.Text(placeholder="reverse: flower", description="You:"), widgets.Button(description="Send"), widgets.Output()
talk: list[dict] = []


def on_send(_=None):
    if not box.value.strip():
        return
    talk.append({"role": "user", "content": box.value.strip()})
    box.value = ""
    with shown:
        print("you:      ", talk[-1]["content"], "\nassistant: ", end="", flush=True)
        reply = "".join(print(piece, end="", flush=True) or piece for piece in reply_stream(chat.model, chat.tokenizer, talk))
        print()
    talk.append({"role": "assistant", "content": reply})


box.continuous_update = False  # the value changes on Enter (or leaving the box), not on every key
send.on_click(on_send)
box.observe(on_send, names="value")
widgets.VBox([widgets.HBox([box, send]), shown])

# %% [markdown]
# In a terminal, the same model answers through `transformer-course chat` (`--checkpoint` takes another
# chat model saved with `save_chat_model`).
#
# ## 9. Your turn: ChatML
#
# Every model family writes its turns its own way; a tokenizer's *chat template* says how. Many open
# models (Qwen among them) use **ChatML**. Here is one conversation in it, a system message, a question
# and an answer, followed by the generation prompt that asks the model for the next reply (shown with
# Python's `repr`, so every newline is visible as `\n`):
#
# `'<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nupper: kind<|im_end|>\n<|im_start|>assistant\nKIND<|im_end|>\n<|im_start|>assistant\n'`
#
# **Your turn (extend).** Write `chatml(messages, generation_prompt)` so that it writes any conversation
# (a list of `{"role": ..., "content": ...}` messages, any roles) the way this one is written, with the
# generation prompt at the end only when `generation_prompt` is True. Work the template out from the
# example: which parts repeat for every message, which belong to the role, and what the generation prompt
# is.

# %%
# Your turn - Exercise 11.6 (★★☆, extend): the ChatML template.
def chatml(messages: list[dict], generation_prompt: bool = False) -> str:
    """Messages [{"role", "content"}] -> the conversation in ChatML text."""
    ### BEGIN SOLUTION
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if generation_prompt else "")
    ### END SOLUTION


chatml = check_chatml(chatml).use

# %% [markdown]
# The chat box of section 8 sends the conversation so far, cut by `fit_history`, with the generation
# prompt. Here is what it sends (before you type anything, section 8's first question) as a ChatML model
# would read it, written by your `chatml`:

# %%
sent = fit_history(talk or history, chat.tokenizer, chat.model.cfg.block_size, room=24)  # what reply_stream renders
print(chatml(sent, generation_prompt=True), end="")

# %% [markdown]
# ## 10. Saving a chat model, and what goes wrong
#
# A chat model is a GPT and its `ChatTokenizer`; `save_chat_model` writes both (atomically, with a
# SHA-256 of the contents), and `load_chat_model(path)` (in `course_model`, which also loads the
# shipped one) reads them back through chapter 06's checks (`read_state`: `weights_only=True`, the
# checksum, finite weights).

# %%
#| export
CHAT_FORMAT = 1


def save_chat_model(path, model: GPT, tok: ChatTokenizer, losses: list[float] | None = None):
    """Write a chat model (config, weights, tokenizer, the SFT losses) to `path` atomically, with their
    SHA-256 (chapter 06's `state_sha256`, checked by the loader); returns the path."""
    from transformer_course.checkpoint import state_sha256, weights_problem
    from transformer_course.runtime import atomic_save

    if model.cfg.vocab_size != tok.vocab_size:
        raise ValueError(f"the model has {model.cfg.vocab_size} ids, the tokenizer {tok.vocab_size}: "
                         "grow the model with add_chat_tokens first")
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    if problem := weights_problem(state):  # a run that diverged: a file already there stays
        raise FloatingPointError(f"{path} was not written: the model's {problem}")
    saved = {"format": CHAT_FORMAT, "config": model.cfg.to_dict(), "model": state, "tokenizer": tok.to_dict(),
             "losses": [float(x) for x in losses or []]}
    saved["sha256"] = state_sha256(saved)
    return atomic_save(saved, path)

# %%
bad_calls = {
    "a turn marker inside a message": lambda: render_chat([{"role": "user", "content": "hi<|end|>"}], tok),
    "an unknown role": lambda: render_chat([{"role": "system", "content": "be brief"}], tok),
    "a question longer than the context": lambda: fit_history([{"role": "user", "content": "x" * 80}], tok, 64, 8),
    "the base model with the chat tokenizer": lambda: save_chat_model("unused.pt", base.model, tok),
}
for name, call in bad_calls.items():
    try:
        call()
    except ValueError as e:
        print(f"{name}: {e}")

# %% [markdown]
# ## 11. Use your model elsewhere: Hugging Face `transformers`
#
# The model is ours, but nothing about it is private to this course: it is a GPT-2 (learned positions,
# pre-norm LayerNorm blocks, a GELU MLP; trained without biases, which GPT-2 stores as zeros) and a
# tokenizer of 76 characters plus three turn tokens. `hf_export.export` writes it as a folder that
# Hugging Face `transformers` loads offline: `config.json` and `model.safetensors` for a
# `GPT2LMHeadModel` (chapter 08's key map read backwards), the tokenizer as a `tokenizers` file whose
# **chat template** renders exactly what `render_chat` renders, a generation config that stops at
# `<|end|>`, and a model card. In a terminal: `transformer-course export --model sft --to DIR` (or
# `--checkpoint` for a model of your own). The cell below exports the chat model, loads it back with
# `AutoModelForCausalLM` and `AutoTokenizer`, and compares.

# %%
import os
import tempfile
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only: nothing is downloaded
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
warnings.filterwarnings("ignore", module="transformers")

import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from transformer_course.hf_export import export  # noqa: E402

transformers.logging.set_verbosity_error()  # no version-dependent warnings in the stored outputs
transformers.utils.logging.disable_progress_bar()
question = [{"role": "user", "content": "reverse: stars"}]
ours_ids = render_chat(question, chat.tokenizer, generation_prompt=True)[0]
x = torch.tensor([ours_ids])
with tempfile.TemporaryDirectory() as tmp:
    folder = export(chat.model, chat.tokenizer, Path(tmp) / "shakespeare_chat", losses=chat.losses, facts=chat.manifest)
    print(sorted(p.name for p in folder.iterdir()))
    hf_model = AutoModelForCausalLM.from_pretrained(folder).eval()
    hf_tok = AutoTokenizer.from_pretrained(folder)
text = hf_tok.apply_chat_template(question, add_generation_prompt=True, tokenize=False)
print(type(hf_model).__name__, "and its chat template:", repr(text))
print("the template's ids are render_chat's:", hf_tok(text, add_special_tokens=False)["input_ids"] == ours_ids)
with torch.no_grad():
    print("logits agree within 1e-5:", torch.allclose(hf_model(x).logits, chat.model(x)[0], atol=1e-5, rtol=0))
ours = generate(chat.model, x, 24, temperature=0.0, eos_id=chat.tokenizer.end_id)[0, len(ours_ids):]
theirs = hf_model.generate(x, max_new_tokens=24, do_sample=False)[0, len(ours_ids):]
print("the same greedy reply:", ours.tolist() == theirs.tolist(), repr(hf_tok.decode(theirs, skip_special_tokens=True)))

# %% [markdown]
# From here the model works with everything built on `transformers`: `pipeline("text-generation",
# model=folder)` answers a list of messages, and the folder can be shared (its `README.md` says what the
# model is, its data, recipe and losses). What `transformers` has no equivalent for is refused by name:
# chapter 05's post-norm blocks, say, or a mix of GPT-2's and Llama's parts (chapter 10's Llama-style
# models are exported as `LlamaForCausalLM`).

# %% [markdown]
# ## Quick check

# %%
from transformer_course.quiz import Question, quiz

quiz([
    Question("Why are the new rows of the embedding set to the mean of the old ones rather than to zeros?",
             ["Zeros cannot be trained",
              "The mean gives the average logit, low at any scale; a zero row's logit 0 can sit far above a "
              "large model's usual logits", "The mean makes the model faster"],
             answer=1, explain="Here (logits around -2) a zero row would give about 0.1% and the mean row about "
                               "0.01%, as measured in section 2; in a large model most logits are far below 0, "
                               "so a zero row would make the new token likely everywhere."),
    Question("What does the SFT loss mask leave out?",
             ["The assistant's answers", "The user's questions and the turn tokens before an answer",
              "Nothing: every token is trained"],
             answer=1, explain="Only the answers (and their end token) are targets; the rest is -1."),
    Question("Why does LoRA start B at zero?",
             ["So the adapted model starts exactly as the base model", "To save memory", "So A gets no gradient"],
             answer=0, explain="B = 0 makes the adapter's output 0, so step 0 is the base model."),
    Question("Full fine-tuning made `speaker` barely better than guessing. Why?",
             ["The mask is wrong", "Who says a line is knowledge the small model does not hold; SFT teaches format and skills",
              "The learning rate was too low"],
             answer=1, explain="SFT adds little knowledge; upper-casing or reversing is computable from the prompt."),
    Question("A model fine-tuned on single questions counts right as a first message and wrong as a second. Why?",
             ["The chat cut the history too short", "It never saw a question that follows an answer, at "
              "positions past the first exchange: its training data held none", "Counting needs more layers"],
             answer=1, explain="The skill is in the weights; training on conversations of 1-3 exchanges (every "
                               "answer trained) brings the second and third messages within a few points."),
])

# %% [markdown]
# ## Summary
#
# - A **chat format** adds turn tokens after the vocabulary; the embedding grows by rows set to the mean
#   of the old ones (you wrote `grow_rows`), and for any text without them the model's logits are
#   unchanged, checked to 1e-6.
# - The **template** renders a conversation as role token, content, `<|end|>`; generation starts after
#   `<|assistant|>` and stops at `<|end|>`.
# - **SFT trains the answers only** (you wrote the mask): trained on every token, the model learns to
#   write the questions too.
# - An **instruction set** built from the plays, deterministic, with a held-out split that shares no
#   prompt with training. Fine-tuning takes upper-casing, reversing and counting from 0% to about 100%
#   held-out exact match; who says a line stays near chance: here SFT taught skills, not knowledge. The
#   price is forgetting: the model predicts Shakespeare worse.
# - **LoRA** trains A [r, in] and B [out, r] beside frozen weights (you predicted their size, wrote the
#   forward and fixed a merge that looked right): under 5% of the numbers (4.6%), a file about 20
#   times smaller, scores near the full fine-tune, less forgetting, and a merge that leaves one plain
#   matrix.
# - A **chat** sends the whole conversation: a model fine-tuned on single questions failed at the
#   second message, so the shipped model trains on conversations of one to three exchanges
#   (`sft_batch(..., turns=3)`) and is scored by turn (`exact_match_by_turn`). It streams answers here
#   and in `transformer-course chat`; you wrote ChatML, the template of many open models.
#
# Exported to `transformer_course/assistant.py`: `SPECIALS`, `ROLES`, `ChatTokenizer`, `NEW_ROW_NOISE`,
# `grow_rows`, `add_chat_tokens`, `render_chat`, `IGNORE`, `sft_targets`, `KINDS`, `Example`, `TaskSet`,
# `word_task`, `make_tasks`, `conversation`, `sft_batch`, `finetune`, `reply_ids`, `answers`,
# `exact_match`, `turn_conversations`, `exact_match_by_turn`, `bits_per_char`, `fit_history`,
# `reply_stream`, `CHAT_FORMAT`, `save_chat_model`; and to `transformer_course/lora.py`: `LORA_TARGETS`,
# `LoRALinear`, `merged_weight`, `add_lora`, `adapter_state`, `trainable_parameters`, `load_adapter`,
# `merge_lora`.
