"""Benchmark chapter 01's BPE: training (incremental pair counts against a full recount before every
merge) and encoding throughput (the pure-Python teaching encoder against its tiktoken form).

    .venv/bin/python benchmarks/bench_bpe.py            # writes benchmarks/results/bpe.md
    .venv/bin/python benchmarks/bench_bpe.py --quick    # smaller sizes, prints only

Timings on a shared machine are noisy: read the ratios, which are measured within one run. Both
trainers must learn the same merges (checked here too); the tests check it on more inputs.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import machine

from transformer_course.data import load_shakespeare
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


def bench_training(text: str, vocab_size: int) -> dict:
    fast_s, fast = best_of(lambda: BPETokenizer.train(text, vocab_size, incremental=True), repeats=3)
    naive_s, naive = best_of(lambda: BPETokenizer.train(text, vocab_size, incremental=False), repeats=1)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 KB and vocabulary 512; print, do not write")
    args = parser.parse_args()
    corpus = load_shakespeare()
    size, vocab = (100_000, 512) if args.quick else (1_000_000, 1024)
    text = corpus[:size]
    train = bench_training(text, vocab)
    print(f"training V={vocab} on {size:,} chars: incremental {train['fast_s']:.2f} s, "
          f"recount {train['naive_s']:.1f} s, {train['naive_s'] / train['fast_s']:.0f}x")
    encode_text = corpus[size: size + size]
    rows = [bench_encoding(f"Shakespeare BPE (V={vocab})", train["tokenizer"], encode_text)]
    rows.append(bench_encoding("cl100k_base", BPETokenizer.from_tiktoken("cl100k_base"), encode_text))
    for r in rows:
        print(f"encode {r['name']}: Python {r['python_mbs']:.2f} MB/s, tiktoken {r['rust_mbs']:.2f} MB/s")
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
        "Both learn identical merges (checked by the benchmark).",
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
              "`get_encoding`). Best of 2 (Python) and 3 (tiktoken) runs.", ""]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
