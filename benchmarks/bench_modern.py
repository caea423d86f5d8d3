"""Does it matter? GPT-2 style against Llama style, and one modern part at a time (chapter 10).

    python benchmarks/bench_modern.py            # every model, 2 seeds, 30 s each: about 8 minutes
    python benchmarks/bench_modern.py --quick    # 4 s per model, one seed (a smoke test)

Every model trains for the same wall time (evaluation included) on one thread, in its own Python
process, with chapter 06's tiny recipe (TRAIN_PRESETS["tiny"]: batch 12, block 64, peak learning
rate 2e-3, 100 warm-up steps, cosine down to 2e-4) on the course's character-level Shakespeare. The
cosine ends at --decay-steps (500: roughly the steps a GPT-2 style model makes in 30 s on one idle
core; the preset's 1,500 would leave every run early in the cosine), then the rate stays at 2e-4
until the time is up. On a busy machine the models make fewer steps and every cosine is cut short
alike: the report gives each model's steps.
Each seed fixes the initial weights and the order of the batches, the same for every model.

The models differ from the GPT-2 style one (PRESETS["tiny"]: 4 layers, 4 heads, C = 128, no biases)
in the parts named, and each gets the MLP width d_ff that brings its parameter count nearest to the
GPT-2 style model's: rotary positions drop the learned position table and two key/value heads
instead of four drop a quarter of the attention weights, so those models get a wider MLP instead.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import machine

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "modern.md"
RESULTS_JSON = RESULTS.with_suffix(".json")
SEEDS = (1337, 1338)

# name: (label, GPTConfig changes from PRESETS["tiny"]); the first is the baseline
MODELS = {
    "gpt2": ("GPT-2 style (PRESETS['tiny'])", {}),
    "rmsnorm": ("+ RMSNorm", {"normalization": "rmsnorm"}),
    "swiglu": ("+ SwiGLU", {"mlp": "swiglu"}),
    "rope": ("+ RoPE", {"positional": "rope"}),
    "gqa": ("+ GQA (2 key/value heads)", {"n_kv_head": 2}),
    "llama": ("Llama style (all four)", {"normalization": "rmsnorm", "mlp": "swiglu", "positional": "rope",
                                         "n_kv_head": 2}),
}


def model_config(name: str, vocab_size: int):
    """The GPTConfig of MODELS[name]: its changes, and the d_ff that matches the baseline's parameters."""
    from transformer_course.config import PRESETS
    from transformer_course.model import count_parameters

    base = replace(PRESETS["tiny"], vocab_size=vocab_size)
    changes = MODELS[name][1]
    if not changes:
        return base
    target = count_parameters(base)
    # every count is linear in d_ff, so the nearest of all widths up to 8C is the nearest there is
    widths = range(1, 8 * base.d_model + 1)
    d_ff = min(widths, key=lambda h: abs(count_parameters(replace(base, **changes, d_ff=h)) - target))
    return replace(base, **changes, d_ff=d_ff)


def run(name: str, seed: int, seconds: float, decay_steps: int) -> dict:
    """Train MODELS[name] from `seed` for `seconds` of wall time on one thread; what it did."""
    import torch

    from transformer_course.config import TRAIN_PRESETS
    from transformer_course.data import load_shakespeare, train_val_split
    from transformer_course.model import count_parameters
    from transformer_course.modern import build_gpt
    from transformer_course.tokenization import CharTokenizer
    from transformer_course.training import encode_corpus, train

    torch.set_num_threads(1)
    text = load_shakespeare()
    tokenizer = CharTokenizer.from_text(text)
    train_data, val_data = train_val_split(encode_corpus(tokenizer, text))
    del text
    cfg = model_config(name, tokenizer.vocab_size)
    torch.manual_seed(seed)
    model = build_gpt(cfg)
    recipe = TRAIN_PRESETS["tiny"]
    train_cfg = replace(recipe, max_iters=10**9, lr_decay_iters=decay_steps, max_seconds=seconds, seed=seed,
                        device="cpu", progress=False)
    history = train(model, train_data, val_data, train_cfg)
    return {"model": name, "seed": seed, "parameters": count_parameters(cfg),
            "parameters_counted": sum(p.numel() for p in model.parameters()), "d_ff": cfg.d_ff,
            "steps": len(history.step), "tokens_per_s": history.tokens_per_second, "wall_s": history.wall_seconds,
            "val_loss": history.val_loss[-1], "eval_step": history.eval_step, "eval_seconds": history.eval_seconds,
            "val_curve": history.val_loss, "train_curve": history.train_loss}


def _child(name: str, seed: int, seconds: float, decay_steps: int) -> dict:
    cmd = [sys.executable, __file__, "--child", name, str(seed), "--seconds", str(seconds),
           "--decay-steps", str(decay_steps)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    return json.loads(out.strip().splitlines()[-1])


def _at_step(r: dict, step: int) -> float:
    return r["val_curve"][r["eval_step"].index(step)]


def write_report(runs: list[dict], args, load: tuple[float, float]) -> str:
    import torch

    torch.set_num_threads(1)  # the count every run trained with
    info = machine.describe()
    seeds = sorted({r["seed"] for r in runs})
    by = {(r["model"], r["seed"]): r for r in runs}
    # the last evaluation every run reached: losses there compare equal numbers of steps
    common = max(set.intersection(*(set(r["eval_step"]) for r in runs)))
    mean = {m: sum(by[m, s]["val_loss"] for s in seeds) / len(seeds) for m in MODELS}
    spread = {m: max(by[m, s]["val_loss"] for s in seeds) - min(by[m, s]["val_loss"] for s in seeds) for m in MODELS}
    seed_cols = " | ".join(f"val loss, seed {s}" for s in seeds)
    lines = ["# Does it matter? GPT-2 style vs modern parts at equal wall time (chapter 10)", "",
             f"{machine.markdown_line(info)} Load average at start / end: {load[0]:.1f} / {load[1]:.1f} "
             "(other jobs were running when this was above ~1: it slows every model, not always alike).", "",
             "Command: `python benchmarks/bench_modern.py" + (" --quick" if args.quick else "")
             + (f" --seconds {args.seconds:g}" if args.seconds != _default_seconds(args.quick) else "")
             + (f" --seeds {len(seeds)}" if len(seeds) != _default_seeds(args.quick) else "") + "`", "",
             f"Each model: {args.seconds:g} s of wall time (evaluation included) on one thread, chapter 06's tiny "
             f"recipe with the cosine ending at step {args.decay_steps}, the same batches for every model "
             f"(seeds {', '.join(map(str, seeds))}). `d_ff` is each model's MLP width, chosen to match the GPT-2 "
             "style model's parameter count; `vs GPT-2 style` compares the mean over the seeds.", "",
             f"| model | d_ff | parameters | steps | tokens / s | {seed_cols} | mean | vs GPT-2 style | "
             f"val loss at step {common} (mean) |",
             "|---|---:|---:|---:|---:|" + "---:|" * len(seeds) + "---:|---:|---:|"]
    for m, (label, _) in MODELS.items():
        rs = [by[m, s] for s in seeds]
        d_ff = rs[0]["d_ff"] or "4C = 512"
        steps = " / ".join(f"{r['steps']:,}" for r in rs)
        tps = sum(r["tokens_per_s"] for r in rs) / len(rs)
        at_common = sum(_at_step(r, common) for r in rs) / len(rs)
        vs = "-" if m == "gpt2" else f"{mean[m] - mean['gpt2']:+.3f}"
        lines.append(f"| {label} | {d_ff} | {rs[0]['parameters']:,} | {steps} | {tps:,.0f} | "
                     + " | ".join(f"{r['val_loss']:.3f}" for r in rs) + f" | {mean[m]:.3f} | {vs} | {at_common:.3f} |")
    lines += ["", "How far to trust it: "
              + (f"the two seeds of one model end {min(spread.values()):.3f} to {max(spread.values()):.3f} apart, "
                 "so a difference smaller than that is not evidence. " if len(seeds) > 1 else
                 "one seed, so the spread between seeds is unknown: small differences are not evidence. ")
              + f"These are {_fmt(runs[0]['parameters'])}-parameter models trained for under a minute on a shared CPU; "
              "the papers that introduced these parts measured them on far larger models trained far longer. "
              "Steps differ between models because some are slower per step on this CPU: the last column compares "
              "them at equal steps instead.", "",
              "Validation loss by step (wall seconds), first seed:", ""]
    for m, (label, _) in MODELS.items():
        r = by[m, seeds[0]]
        curve = ", ".join(f"{s}: {v:.3f} ({t:.0f} s)" for s, v, t in zip(r["eval_step"], r["val_curve"],
                                                                          r["eval_seconds"], strict=True))
        lines.append(f"- {label}: {curve}")
    lines.append("")
    text = "\n".join(lines)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    meta = {"machine": f"{info['cpu']} ({info['system']}, {info['cpu_count']} CPUs)", "torch": info["torch"],
            "threads": info["threads"], "load": list(load), "quick": args.quick, "seconds": args.seconds,
            "decay_steps": args.decay_steps, "seeds": seeds, "machine_info": info}
    RESULTS_JSON.write_text(json.dumps({"meta": meta, "labels": {m: v[0] for m, v in MODELS.items()},
                                        "changes": {m: v[1] for m, v in MODELS.items()}, "runs": runs}, indent=1))
    return text


def _fmt(n: int) -> str:
    return f"{n / 1e6:.1f} M"


def _default_seconds(quick: bool) -> float:
    return 4.0 if quick else 30.0


def _default_seeds(quick: bool) -> int:
    return 1 if quick else len(SEEDS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 s per model and one seed (a smoke test)")
    parser.add_argument("--seconds", type=float, default=None, help="wall time of each run (default 30)")
    parser.add_argument("--seeds", type=int, default=None, choices=range(1, len(SEEDS) + 1),
                        help=f"how many of the seeds {SEEDS} to run (default all)")
    parser.add_argument("--decay-steps", type=int, default=500, help="step at which the cosine reaches min_lr")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "SEED"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.seconds = args.seconds or _default_seconds(args.quick)
    if args.child:
        name, seed = args.child
        print(json.dumps(run(name, int(seed), args.seconds, args.decay_steps)))
        return
    seeds = SEEDS[: args.seeds or _default_seeds(args.quick)]
    load_start = os.getloadavg()[0]
    runs = []
    for seed in seeds:  # every model once per seed, in turn, so a busy minute is shared out
        for name in MODELS:
            runs.append(_child(name, seed, args.seconds, args.decay_steps))
            r = runs[-1]
            print(f"seed {seed} {name}: {r['parameters']:,} parameters (d_ff {r['d_ff']}), {r['steps']} steps, "
                  f"{r['tokens_per_s']:,.0f} tokens/s, val loss {r['val_loss']:.3f}", flush=True)
    print(write_report(runs, args, (load_start, os.getloadavg()[0])))


if __name__ == "__main__":
    main()
