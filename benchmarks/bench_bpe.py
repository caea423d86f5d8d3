"""Benchmark chapter 01's BPE: training (incremental pair counts against a full recount before every
merge, with GPT-4's pre-split pattern and without one), encoding throughput (the pure-Python teaching
encoder against its tiktoken form), streaming encoding of a file (its memory peak) and one long word
(the chapter's plain apply_merges loop against apply_merges_heap, which BPETokenizer uses for long chunks).

    .venv/bin/python benchmarks/bench_bpe.py            # writes benchmarks/results/bpe.md
    .venv/bin/python benchmarks/bench_bpe.py --quick    # smaller sizes, prints only
    .venv/bin/python benchmarks/bench_bpe.py --long-word    # only the long-word table, rewritten in bpe.md

Timings on a shared machine are noisy: read the ratios, which are measured within one run. Both
trainers must learn the same merges (checked here too); the tests check it on more inputs.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
import tracemalloc
from pathlib import Path

import machine

from transformer_course.bpe import apply_merges
from transformer_course.data import load_shakespeare
from transformer_course.presplit import GPT4_SPLIT_PATTERN
from transformer_course.tokenization import BPETokenizer, get_encoding

RESULTS = Path(__file__).resolve().parent / "results" / "bpe.md"


def best_of(fn, repeats: int) -> tuple[float, object]:
    """The fastest of ``repeats`` runs (least disturbed by other work on the machine) and the result."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def bench_training(text: str, vocab_size: int, pattern: str | None = GPT4_SPLIT_PATTERN) -> dict:
    fast_s, fast = best_of(lambda: BPETokenizer.train(text, vocab_size, pattern, incremental=True), repeats=3)
    naive_s, naive = best_of(lambda: BPETokenizer.train(text, vocab_size, pattern, incremental=False), repeats=1)
    if fast.merges != naive.merges:
        raise AssertionError("the incremental and the recount trainers learned different merges")
    return {"fast_s": fast_s, "naive_s": naive_s, "merges": len(fast.merges), "tokenizer": fast}


def bench_encoding(name: str, teaching: BPETokenizer, text: str) -> dict:
    fast = teaching.to_tiktoken() if name != "cl100k_base" else get_encoding("cl100k_base")
    megabytes = len(text.encode("utf-8")) / 1e6

    def python_cold():  # a fresh copy: its chunk cache starts empty
        return BPETokenizer.from_dict(teaching.to_dict()).encode_ordinary(text)

    python_s, ids_python = best_of(python_cold, repeats=2)
    rust_s, ids_rust = best_of(lambda: fast.encode_ordinary(text), repeats=3)
    if ids_python != ids_rust:
        raise AssertionError(f"{name}: the teaching encoder and tiktoken disagree")
    return {"name": name, "mb": megabytes, "python_mbs": megabytes / python_s, "rust_mbs": megabytes / rust_s,
            "tokens": len(ids_rust)}


def bench_stream(tokenizer: BPETokenizer, text: str, folder: Path) -> dict:
    """Encode ``text`` from a file, line by line, with ``encode_stream``: time and tracemalloc's peak,
    against ``encode`` of the whole text read from the same file (same ids, checked as they come, so
    the check holds no second list)."""
    path = folder / "stream.txt"
    path.write_text(text, encoding="utf-8")
    tokenizer.encode(text)  # a warm chunk cache for both (it is the tokenizer's, bounded, not the stream's)
    tracemalloc.start()
    start = time.perf_counter()
    whole = tokenizer.encode(path.read_text(encoding="utf-8"))
    whole_s, whole_peak = time.perf_counter() - start, tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    same, done = True, 0
    with open(path, encoding="utf-8") as f:
        tracemalloc.start()
        start = time.perf_counter()
        for part in tokenizer.encode_stream(f):
            same, done = same and whole[done:done + len(part)] == part, done + len(part)
        stream_s, stream_peak = time.perf_counter() - start, tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    if not same or done != len(whole):
        raise AssertionError("encode_stream and encode disagree")
    return {"mb": len(text.encode("utf-8")) / 1e6, "stream_s": stream_s, "stream_peak": stream_peak,
            "whole_s": whole_s, "whole_peak": whole_peak}


LONG_WORD_TITLE = "## One long word: random lower-case letters, one pre-split chunk (cl100k_base's merges)"
PLAIN_LIMIT = 40_000  # the plain loop is quadratic: 1M letters would take hours, so it runs on the short word only


def bench_long_word(sizes=(32_000, 1_000_000)) -> list[dict]:
    """``encode`` of one word of n random letters: the plain loop (what encode ran before issue 40), the heap
    (``BPETokenizer.encode`` now, a fresh cache) and tiktoken; all three must give the same ids."""
    ours, enc = BPETokenizer.from_tiktoken("cl100k_base"), get_encoding("cl100k_base")
    rows = []
    for n in sizes:
        word = "".join(random.Random(n).choices("abcdefghijklmnopqrstuvwxyz", k=n))
        start = time.perf_counter()
        heap = ours.encode(word)
        heap_s = time.perf_counter() - start
        ours._cache.clear()
        rust_s, rust = best_of(lambda word=word: enc.encode(word), repeats=3)
        plain_s = None
        if n <= PLAIN_LIMIT:
            start = time.perf_counter()
            plain = apply_merges([ours.byte_ids[b] for b in word.encode()], ours.merges)
            plain_s = time.perf_counter() - start
            assert plain == heap
        assert heap == rust, f"heap and tiktoken differ on {n:,} letters"
        rows.append({"n": n, "tokens": len(heap), "plain_s": plain_s, "heap_s": heap_s, "rust_s": rust_s})
        print(f"long word {n:,}: plain {plain_s if plain_s is None else round(plain_s, 2)} s, "
              f"heap {heap_s:.3f} s, tiktoken {rust_s:.4f} s")
    return rows


def long_word_lines(rows: list[dict]) -> list[str]:
    lines = [LONG_WORD_TITLE, "", f"{machine.markdown_line()}", "",
             "| letters | tokens | plain `apply_merges` loop, before issue 40 (s) "
             "| `encode` with `apply_merges_heap` (s) | tiktoken (s) |", "|---:|---:|---:|---:|---:|"]
    for r in rows:
        plain = f"{r['plain_s']:.1f}" if r["plain_s"] is not None else "not run (quadratic: hours)"
        lines.append(f"| {r['n']:,} | {r['tokens']:,} | {plain} | {r['heap_s']:.2f} | {r['rust_s']:.3f} |")
    lines += ["", "Identical ids from all encoders that ran (checked by the benchmark). One run each for the Python "
              "encoders, best of 3 for tiktoken; the `encode` time includes pre-splitting.", ""]
    return lines


def write_long_word_only() -> None:
    """Replace (or append) the long-word section of bpe.md, keeping the rest of the file."""
    lines = long_word_lines(bench_long_word())
    text = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else ""
    head = text.split(LONG_WORD_TITLE)[0].rstrip("\n")
    RESULTS.write_text(head + "\n\n" + "\n".join(lines), encoding="utf-8")
    print(f"wrote the long-word section of {RESULTS}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 KB and vocabulary 512; print, do not write")
    parser.add_argument("--long-word", action="store_true", help="only the long-word table (rewritten in bpe.md)")
    args = parser.parse_args()
    if args.long_word:
        write_long_word_only()
        return
    corpus = load_shakespeare()
    size, vocab = (100_000, 512) if args.quick else (1_000_000, 1024)
    text = corpus[:size]
    train = bench_training(text, vocab)
    print(f"training V={vocab} on {size:,} chars: incremental {train['fast_s']:.2f} s, "
          f"recount {train['naive_s']:.1f} s, {train['naive_s'] / train['fast_s']:.0f}x")
    one_size = size // 10  # without a pattern the recount passes over the whole text once per merge
    one = bench_training(corpus[:one_size], vocab, pattern=None)
    print(f"training V={vocab} on {one_size:,} chars, no pattern: incremental {one['fast_s']:.2f} s, "
          f"recount {one['naive_s']:.1f} s, {one['naive_s'] / one['fast_s']:.0f}x")
    encode_text = corpus[size: size + size]
    rows = [bench_encoding(f"Shakespeare BPE (V={vocab})", train["tokenizer"], encode_text)]
    rows.append(bench_encoding("cl100k_base", BPETokenizer.from_tiktoken("cl100k_base"), encode_text))
    for r in rows:
        print(f"encode {r['name']}: Python {r['python_mbs']:.2f} MB/s, tiktoken {r['rust_mbs']:.2f} MB/s")
    with tempfile.TemporaryDirectory() as folder:
        stream = bench_stream(train["tokenizer"], corpus[size:], Path(folder))
    print(f"stream {stream['mb']:.1f} MB: peak {stream['stream_peak'] / 1e6:.2f} MB in {stream['stream_s']:.1f} s; "
          f"whole: peak {stream['whole_peak'] / 1e6:.1f} MB in {stream['whole_s']:.1f} s")
    if args.quick:
        return

    lines = [
        "# BPE benchmark (chapter 01)",
        "",
        f"{machine.markdown_line()} The load average is at the end of the run "
        "(the CPU is shared, so compare ratios within this table, not times across runs).",
        "Written by `benchmarks/bench_bpe.py`.",
        "",
        f"## Training: vocabulary {vocab:,} ({train['merges']} merges) on the first {size:,} characters of Shakespeare",
        "",
        "| trainer | time (s) | speed-up |",
        "|---|---:|---:|",
        f"| recount every pair before each merge (`incremental=False`) | {train['naive_s']:.1f} | 1x |",
        f"| incremental pair counts + heap (`incremental=True`, best of 3) | {train['fast_s']:.2f} | "
        f"{train['naive_s'] / train['fast_s']:.0f}x |",
        "",
        f"## Training without a pre-split pattern: vocabulary {vocab:,} ({one['merges']} merges) on the first "
        f"{one_size:,} characters, the whole text one chunk",
        "",
        "| trainer | time (s) | speed-up |",
        "|---|---:|---:|",
        f"| recount every pair before each merge (`incremental=False`) | {one['naive_s']:.1f} | 1x |",
        f"| incremental, positions of the merged pair only (`incremental=True`, best of 3) | {one['fast_s']:.2f} | "
        f"{one['naive_s'] / one['fast_s']:.0f}x |",
        "",
        "Both learn identical merges in each table (checked by the benchmark).",
        "",
        f"## Encoding throughput: the next {len(encode_text):,} characters (held out from training)",
        "",
        "| tokenizer | tokens | pure-Python `BPETokenizer` (MB/s) | tiktoken (MB/s) | tiktoken / Python |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['name']} | {r['tokens']:,} | {r['python_mbs']:.2f} | {r['rust_mbs']:.2f} | "
                     f"{r['rust_mbs'] / r['python_mbs']:.1f}x |")
    lines += ["", "Identical ids from both encoders in every row (checked by the benchmark). The Python encoder "
              "starts with an empty chunk cache; tiktoken is `to_tiktoken()` of the same tokenizer (cl100k: "
              "`get_encoding`). Best of 2 (Python) and 3 (tiktoken) runs.", "",
              f"## Streaming: the rest of the corpus ({stream['mb']:.1f} MB) from a file, line by line", "",
              "| encoder | peak memory (tracemalloc, MB) | time (s) |", "|---|---:|---:|",
              f"| `encode(text)` of the whole text | {stream['whole_peak'] / 1e6:.1f} | {stream['whole_s']:.1f} |",
              f"| `encode_stream(file)` | {stream['stream_peak'] / 1e6:.2f} | {stream['stream_s']:.1f} |", "",
              "Identical ids (checked by the benchmark). The chunk cache was filled first; tracemalloc slows both.",
              ""]
    lines += long_word_lines(bench_long_word())
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
