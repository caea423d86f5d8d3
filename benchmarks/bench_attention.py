"""Multi-head attention three ways on the CPU: a loop of heads, batched heads, one fused call (chapter 04).

- loop: chapter 04's scaffold (it stays in the notebook; `Loop` below), nh chapter-03 `AttentionHead`s
  one after another, concatenated, then W_o;
- batched: `MultiHeadAttention(fast=False)`, one packed projection, all heads in one batched product,
  full [B, nh, T, T] scores and weights (chapter 03's function);
- fused: `MultiHeadAttention(fast=True)`, PyTorch's ``F.scaled_dot_product_attention`` with ``is_causal``.

All three hold the same weights (each loop head is a slice of the packed layer's) and are checked to
agree before timing. For each
sequence length T (64 to 1,024; d_model 256, 8 heads of 32, batch 1, float32, forward pass under
``torch.no_grad``, one thread) we record the median CPU time of repeated calls (the work done, which
other programs on a shared CPU do not inflate as they do wall time) and the peak memory the call allocates
on top of its inputs and parameters, measured with PyTorch's profiler (``profile_memory=True``): the
running sum of every allocation and free, in order.

Run: ``python benchmarks/bench_attention.py`` (about a minute). Writes ``benchmarks/results/attention.md``
(table and ratios) and ``benchmarks/results/attention.json`` (read by the chapter's plot). Timings are
noisy on a shared machine: compare the ratios within one run, never across machines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from pathlib import Path

import machine
import torch
from torch.profiler import ProfilerActivity, profile

from transformer_course.attention import AttentionHead
from transformer_course.multihead import MultiHeadAttention

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = ("loop", "batched", "fused")
D_MODEL, N_HEAD, BATCH = 256, 8, 1
LENGTHS = (64, 128, 256, 512, 1024)


def cpu_ms(fn, min_repeats: int = 5, min_seconds: float = 0.2) -> float:
    """Median CPU time of ``fn()`` in milliseconds (this thread only), after one warm-up call.

    With PyTorch limited to one thread, the calling thread's CPU time is the work the call does;
    unlike wall time it does not grow when other programs share the CPU.
    """
    fn()
    times: list[float] = []
    start = time.thread_time()
    while len(times) < min_repeats or time.thread_time() - start < min_seconds:
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    return 1000 * statistics.median(times)


def peak_bytes(fn) -> int:
    """Peak of the bytes ``fn()`` allocates (and has not yet freed) while it runs, from the profiler.

    Every op's own allocations minus its own frees (``self_cpu_memory_usage``) and the allocator's
    events outside ops, summed in the order they happened; the largest running total is the peak.
    """
    with warnings.catch_warnings(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        warnings.simplefilter("ignore")
        fn()
    running = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        running += event.self_cpu_memory_usage
        peak = max(peak, running)
    return peak


class Loop(torch.nn.Module):
    """Chapter 04's scaffold on ``mha``'s weights: head h is an `AttentionHead` holding rows
    h*hs .. (h+1)*hs - 1 of W_q, W_k and W_v; the heads run one after another, their outputs
    [B, T, hs] are concatenated to [B, T, C] and mixed by ``mha.proj`` (W_o). ``mha.qkv.bias`` must be zero."""

    def __init__(self, mha: MultiHeadAttention) -> None:
        super().__init__()
        C, hs = mha.d_model, mha.head_size
        self.heads = torch.nn.ModuleList(AttentionHead(C, hs) for _ in range(mha.n_head))
        with torch.no_grad():
            for h, head in enumerate(self.heads):
                for linear, w in zip((head.query, head.key, head.value), mha.qkv.weight.split(C), strict=True):
                    linear.weight.copy_(w[h * hs:(h + 1) * hs])  # (hs, C)
        self.proj = mha.proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.cat([head(x) for head in self.heads], dim=-1))  # (B, T, C)


def build(seed: int = 0) -> dict[str, torch.nn.Module]:
    torch.manual_seed(seed)
    batched = MultiHeadAttention(D_MODEL, N_HEAD, fast=False).eval()
    with torch.no_grad():
        batched.qkv.bias.zero_()  # chapter 03's heads have no bias
    fused = MultiHeadAttention(D_MODEL, N_HEAD, fast=True).eval()
    fused.load_state_dict(batched.state_dict())
    return {"loop": Loop(batched).eval(), "batched": batched, "fused": fused}


def measure(lengths=LENGTHS) -> list[dict]:
    modules = build()
    rows = []
    for T in lengths:
        x = torch.randn(BATCH, T, D_MODEL, generator=torch.Generator().manual_seed(T))
        with torch.no_grad():
            outs = {name: m(x) for name, m in modules.items()}
            for name in ("batched", "fused"):  # same function, or the timings mean nothing
                err = (outs[name] - outs["loop"]).abs().max().item()
                if err > 1e-5:
                    raise AssertionError(f"{name} differs from loop by {err:.2e} at T={T}")
            for name, m in modules.items():
                rows.append({
                    "T": T,
                    "variant": name,
                    "ms": cpu_ms(lambda m=m, x=x: m(x)),
                    "peak_mib": peak_bytes(lambda m=m, x=x: m(x)) / 2**20,
                })
        print(f"T={T:5d}  " + "  ".join(f"{r['variant']} {r['ms']:8.2f} ms {r['peak_mib']:7.1f} MiB"
                                        for r in rows[-3:]))
    return rows


def table(rows: list[dict], meta: dict) -> str:
    by = {(r["T"], r["variant"]): r for r in rows}
    lengths = sorted({r["T"] for r in rows})
    lines = [
        "# Multi-head attention on the CPU: loop vs batched vs fused",
        "",
        machine.markdown_line(meta["machine_info"]),
        "",
        f"Written by `benchmarks/bench_attention.py`. d_model {D_MODEL}, {N_HEAD} heads of "
        f"{D_MODEL // N_HEAD}, batch {BATCH}, float32, causal, forward under `torch.no_grad`. Time: median CPU "
        "time of repeated calls, PyTorch on one thread (the work done; wall time on this shared CPU swings with "
        "other programs). Memory: peak bytes allocated during the call (PyTorch profiler), beyond inputs and "
        "parameters. **This machine's figures, on a shared CPU: compare ratios within this table, not absolute "
        "numbers across machines.**",
        "",
        "| T | loop CPU ms | batched CPU ms | fused CPU ms | loop / fused | batched / fused | loop MiB | batched MiB | "
        "fused MiB | batched / fused memory |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for T in lengths:
        lo, ba, fu = (by[(T, v)] for v in VARIANTS)
        lines.append(
            f"| {T} | {lo['ms']:.2f} | {ba['ms']:.2f} | {fu['ms']:.2f} | {lo['ms'] / fu['ms']:.1f}x | "
            f"{ba['ms'] / fu['ms']:.1f}x | {lo['peak_mib']:.1f} | {ba['peak_mib']:.1f} | {fu['peak_mib']:.1f} | "
            f"{ba['peak_mib'] / fu['peak_mib']:.1f}x |"
        )
    lines += [
        "",
        "Reading it: the loop makes 3·nh small projections and nh small attentions per call; the batched",
        "version does the same arithmetic in a few large calls but materialises the full [B, nh, T, T] scores,",
        "masked scores and softmax at once, so its memory grows with T² and, once those tensors outgrow the CPU",
        "caches, its time can fall behind the loop's. The loop makes those temporaries one head at a time, but",
        "each chapter-03 head keeps its weights (`last_weights`), so it ends up holding all nh of them: a lower",
        "peak with the same T² growth. The fused kernel works through the keys in blocks and never stores the",
        "full weights, so its memory grows only with T.",
        "",
    ]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    info = machine.describe()  # after setting the threads: the count the timings use
    meta = {
        "machine": f"{info['cpu']} ({info['system']}, {info['cpu_count']} CPUs)",
        "threads": info["threads"],
        "torch": torch.__version__,
        "d_model": D_MODEL,
        "n_head": N_HEAD,
        "batch": BATCH,
        "machine_info": info,
    }
    rows = measure(args.lengths)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "attention.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    (args.out / "attention.md").write_text(table(rows, meta))
    print(f"wrote {args.out / 'attention.md'} and attention.json")


if __name__ == "__main__":
    main()
