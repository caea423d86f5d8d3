"""The course on a GPU: nanoGPT's shakespeare-char recipe, and decoding against Hugging Face's `generate`.

    python benchmarks/bench_gpu.py            # on a CUDA GPU: writes benchmarks/results/gpu.md and gpu.json
    python benchmarks/bench_gpu.py --smoke --device cpu --out build/bench_gpu_smoke   # a dry run, any machine

(a) Training at nanoGPT's shakespeare-char config (6 layers, 6 heads, d 384, block 256, batch 64, dropout
0.2, no biases; AdamW lr 1e-3 with 100 warm-up steps, cosine to 1e-4 at 5,000, beta2 0.99; bf16 autocast
and torch.compile) on the course's Shakespeare. Two loops time the same compiled model in turns:

- the course's trainer: each step as `training.train` takes it (`get_batch` onto the device, `train_step`,
  whose `loss.item()` waits for the GPU every step);
- nanoGPT's operations, the in-run stand-in for nanoGPT's `train.py` (chapter 06's benchmark,
  `bench_training.py`, builds its CPU stand-in the same way: our model running the kernels nanoGPT runs):
  fused attention and LayerNorm, fused AdamW, bf16 autocast, compile, and nanoGPT's GPU loop: the next
  batch copied from pinned memory without blocking while the step runs, the loss read back every 10th
  step only.

Model FLOPs utilisation (MFU) uses nanoGPT's count (`estimate_mfu`, from the PaLM paper's appendix B):
6N + 12·L·T·d FLOPs per token for forward and backward, N the parameters without the position table, L
layers, T the context, d the width (attention over the full T x T, as nanoGPT counts it), against the
GPU's dense bf16 peak from its datasheet (`PEAKS`) and against a bf16 matrix product measured in the
same run. Then one whole run of `train` (evaluations and compilation included): final val loss and
the time to val loss 1.47.

(b) Greedy decoding with the KV cache (`generation.generate`, chapter 07) against Hugging Face's
`generate(do_sample=False)` on the same random weights at GPT-2 124M's shapes (`pretrained.make_hf_stand_in`,
loaded with `pretrained.from_pretrained`, as `bench_decode.py` does), batch 1 and 16, float32 and bf16.

`--smoke`: tiny sizes and a few steps, so the whole script runs on a CPU in seconds (tests/test_gpu.py
runs it); its numbers mean nothing. Without a CUDA GPU and without `--smoke` it says so and exits 0, so
`make bench` on a CPU machine passes over it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import machine
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from transformer_course.config import PRESETS, TRAIN_PRESETS, GPTConfig, TrainConfig  # noqa: E402
from transformer_course.data import get_batch, load_shakespeare, train_val_split  # noqa: E402
from transformer_course.generation import generate  # noqa: E402
from transformer_course.model import GPT, count_parameters  # noqa: E402
from transformer_course.tokenization import CharTokenizer  # noqa: E402
from transformer_course.training import (  # noqa: E402
    autocast_for,
    encode_corpus,
    make_optimizer,
    train,
    train_step,
)

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_LOSS = 1.47  # nanoGPT's README: val 1.4697 after 5,000 iterations, about 3 minutes on one A100
BF16_GREEDY_NOTE = ("Greedy decoding is exact in float32 (every token equal to Hugging Face's). In bf16 the two impl"
                    'ementations add in other orders, so a logit pair that is nearly tied can flip; from the first f'
                    'lipped token on, the two continuations differ, which is what the lower agreement measures: not '
                    'a bug, the reason the course compares greedy tokens in float32.')
LOG_INTERVAL = 10  # nanoGPT's train.py reads the loss back every log_interval steps

# dense bf16 tensor-core peaks from NVIDIA's datasheets, TFLOP/s; the first name found in the device's wins
PEAKS = [
    ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0),  # "NVIDIA H100 80GB HBM3" is the SXM part
    ("H200 NVL", 835.0), ("H200", 989.0), ("GH200", 989.0),
    ("A100", 312.0), ("L40S", 362.0), ("L40", 181.0), ("L4", 121.0), ("A10G", 70.0), ("A10", 125.0),
]


@dataclass(frozen=True)
class Sizes:
    """Everything that differs between the real run and the smoke run."""

    model: dict  # GPTConfig overrides of PRESETS["small"]
    train: dict  # TrainConfig overrides of TRAIN_PRESETS["small"]
    warmup_steps: int  # untimed steps of each loop before timing (compilation happens here)
    timed_steps: int  # steps per timed round
    rounds: int  # rounds of the two loops, in turns; the median round is kept
    matmul: int  # size of the square bf16 matrix product that measures the GPU's rate
    decode: dict  # make_hf_stand_in arguments
    prompt: int
    new_tokens: int
    batches: tuple[int, ...]
    repeats: int  # timed runs of each decode, after one warm-up; the median is kept


FULL = Sizes(model={"bias": False}, train={"compile": True}, warmup_steps=30, timed_steps=150, rounds=2,
             matmul=8192, decode=dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12),
             prompt=16, new_tokens=256, batches=(1, 16), repeats=2)
SMOKE = Sizes(model={"bias": False, "n_layer": 2, "n_head": 2, "d_model": 32, "block_size": 32},
              train={"max_iters": 6, "batch_size": 4, "eval_interval": 3, "eval_iters": 2, "warmup_iters": 2,
                     "compile": False},
              warmup_steps=2, timed_steps=3, rounds=1, matmul=256,
              decode=dict(vocab_size=512, n_positions=64, n_embd=64, n_layer=2, n_head=4),
              prompt=8, new_tokens=8, batches=(1, 2), repeats=1)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gpu_info(device: torch.device, peak_override: float | None) -> dict:
    """The GPU (or, in a smoke run, the CPU) and the bf16 peak MFU is taken against."""
    if device.type != "cuda":
        return {"name": f"none ({device.type})", "peak_tflops": peak_override,
                "peak_source": "given" if peak_override else None}
    props = torch.cuda.get_device_properties(device)
    found = next(((label, peak) for label, peak in PEAKS if label in props.name), (None, None))
    peak, source = (peak_override, "given with --peak-tflops") if peak_override else (
        found[1], f"datasheet, {found[0]}, dense" if found[0] else None)
    return {"name": props.name, "sms": props.multi_processor_count, "memory_gib": props.total_memory / 2**30,
            "capability": f"{props.major}.{props.minor}", "cuda": torch.version.cuda, "peak_tflops": peak,
            "peak_source": source}


def matmul_tflops(device: torch.device, n: int, repeats: int = 10) -> float:
    """TFLOP/s of an n x n x n bf16 matrix product on random data (mean of `repeats` after 3 warm-ups)."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=g).to(device, torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    synchronize(device)
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12


def flops_per_token(cfg: GPTConfig) -> float:
    """nanoGPT's estimate: 6N + 12·L·T·d, N the parameters without the position table."""
    n = count_parameters(cfg) - (cfg.block_size * cfg.d_model if cfg.positional == "learned" else 0)
    return 6 * n + 12 * cfg.n_layer * cfg.block_size * cfg.d_model


def shakespeare() -> tuple[torch.Tensor, torch.Tensor, int]:
    text = load_shakespeare()
    tokenizer = CharTokenizer.from_text(text)
    train_data, val_data = train_val_split(encode_corpus(tokenizer, text))
    return train_data, val_data, tokenizer.vocab_size


# ---------------------------------------------------------------- (a) training

def course_steps(model, forward, optimizer, data, cfg: TrainConfig, device: torch.device, n: int, g) -> None:
    """`n` steps as `train` takes them: the batch copied onto the device, `train_step` (loss read every step)."""
    for _ in range(n):
        x, y = get_batch(data, model.cfg.block_size, cfg.batch_size, generator=g, device=device)
        train_step(forward, optimizer, x, y, cfg.grad_clip, autocast_for(device, cfg))


def nanogpt_steps(model, forward, optimizer, data, cfg: TrainConfig, device: torch.device, n: int, g) -> None:
    """`n` steps as nanoGPT's train.py takes them on a GPU: the next batch fetched from pinned memory
    without blocking while this step runs, the loss read back every LOG_INTERVAL steps only."""
    def batch():
        x, y = get_batch(data, model.cfg.block_size, cfg.batch_size, generator=g)
        if device.type == "cuda":
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x.to(device), y.to(device)

    optimizer.zero_grad(set_to_none=True)  # nanoGPT clears gradients after each step; `train_step`, before
    x, y = batch()
    for i in range(n):
        with autocast_for(device, cfg):
            _, loss = forward(x, y)
        x, y = batch()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if i % LOG_INTERVAL == 0:
            loss.item()


LOOPS = {
    "course_trainer": ("the course's trainer: each step as `train` takes it (batch copied in step, loss read "
                       "every step)", course_steps),
    "nanogpt_ops": ("nanoGPT's operations (stand-in): the same model and kernels, nanoGPT's GPU loop (pinned, "
                    f"non-blocking batch prefetch, loss read every {LOG_INTERVAL}th step)", nanogpt_steps),
}


def time_loops(cfg: GPTConfig, tcfg: TrainConfig, data: torch.Tensor, sizes: Sizes, device: torch.device) -> dict:
    """Both LOOPS on one compiled model and optimizer, `sizes.rounds` rounds in turns, after warm-up."""
    torch.manual_seed(1337)
    model = GPT(cfg).to(device).train()
    optimizer = make_optimizer(model, tcfg)
    for group in optimizer.param_groups:
        group["lr"] = tcfg.learning_rate
    forward = torch.compile(model) if tcfg.compile else model
    g = torch.Generator().manual_seed(0)
    out = {name: {"label": label, "seconds": []} for name, (label, _) in LOOPS.items()}
    for name, (_, loop) in LOOPS.items():
        synchronize(device)
        start = time.perf_counter()
        loop(model, forward, optimizer, data, tcfg, device, sizes.warmup_steps, g)
        synchronize(device)
        out[name]["warmup_s"] = time.perf_counter() - start  # the first loop's includes compilation
    for _ in range(sizes.rounds):
        for name, (_, loop) in LOOPS.items():
            synchronize(device)
            start = time.perf_counter()
            loop(model, forward, optimizer, data, tcfg, device, sizes.timed_steps, g)
            synchronize(device)
            out[name]["seconds"].append(time.perf_counter() - start)
    tokens = tcfg.batch_size * cfg.block_size * sizes.timed_steps
    for r in out.values():
        r["tokens_per_s"] = tokens / statistics.median(r["seconds"])
        r["ms_per_step"] = 1000 * statistics.median(r["seconds"]) / sizes.timed_steps
    return out


def full_run(cfg: GPTConfig, tcfg: TrainConfig, data: tuple, stop_at: int | None = None) -> dict:
    """One `train` run from a fresh model (evaluations and compilation included in its wall time).

    `stop_at`: the recipe's first `stop_at` steps only (the schedule still decays to `tcfg.max_iters`);
    the whole run's wall time is then extrapolated from the steps and evaluations measured, and says so."""
    torch.manual_seed(1337)
    recipe_steps = tcfg.max_iters
    if stop_at is not None and stop_at < recipe_steps:
        tcfg = replace(tcfg, max_iters=stop_at, lr_decay_iters=tcfg.lr_decay_iters or recipe_steps)
    history = train(GPT(cfg), data[0], data[1], tcfg)
    steps, evals = len(history.step), len(history.eval_step)
    eval_s = history.wall_seconds - history.train_seconds  # evaluations and set-up
    whole_evals = recipe_steps // tcfg.eval_interval + 1
    extrapolated = (None if steps >= recipe_steps else
                    history.train_seconds / steps * recipe_steps + eval_s / max(evals, 1) * whole_evals)
    return {"final_val_loss": history.val_loss[-1], "time_to_target_s": history.time_to(TARGET_LOSS),
            "wall_s": history.wall_seconds, "train_s": history.train_seconds, "steps": steps,
            "recipe_steps": recipe_steps, "extrapolated_recipe_wall_s": extrapolated,
            "tokens_per_s": history.tokens_per_second,
            "val_curve": list(zip(history.eval_step, history.val_loss, strict=True))}


def bench_training(sizes: Sizes, device: torch.device, gpu: dict, measured_tflops: float,
                   stop_at: int | None = None) -> dict:
    train_data, val_data, vocab = shakespeare()
    cfg = replace(PRESETS["small"], vocab_size=vocab, **sizes.model)
    tcfg = replace(TRAIN_PRESETS["small"], device=str(device), progress=False, **sizes.train)
    fpt = flops_per_token(cfg)
    loops = time_loops(cfg, tcfg, train_data, sizes, device)
    run = full_run(cfg, tcfg, (train_data, val_data), stop_at)
    for r in (*loops.values(), run):
        r["mfu_datasheet"] = r["tokens_per_s"] * fpt / (gpu["peak_tflops"] * 1e12) if gpu["peak_tflops"] else None
        r["mfu_measured"] = r["tokens_per_s"] * fpt / (measured_tflops * 1e12)
    return {"model_config": cfg.to_dict(), "train_config": tcfg.to_dict(), "parameters": count_parameters(cfg),
            "flops_per_token": fpt, "tokens_per_step": tcfg.batch_size * cfg.block_size,
            "bf16_autocast": isinstance(autocast_for(device, tcfg), torch.autocast), **loops, "full_run": run}


# ---------------------------------------------------------------- (b) decoding

def median_seconds(run, device: torch.device, repeats: int) -> float:
    """Median wall time of `repeats` runs; the caller has run it once already (the warm-up)."""
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        run()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_decoding(sizes: Sizes, device: torch.device) -> list[dict]:
    import transformers

    from transformer_course import pretrained
    from transformer_course.pretrained import make_hf_stand_in

    transformers.logging.set_verbosity_error()
    hf = make_hf_stand_in(**sizes.decode, std=0.02, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        ours = pretrained.from_pretrained(tmp)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        hf, ours = hf.to(device, dtype).eval(), ours.to(device, dtype).eval()
        for batch in sizes.batches:
            prompt = torch.randint(0, sizes.decode["vocab_size"], (batch, sizes.prompt),
                                   generator=torch.Generator().manual_seed(batch)).to(device)

            def run_ours(prompt=prompt, ours=ours):
                return generate(ours, prompt, sizes.new_tokens, temperature=0)

            def run_hf(prompt=prompt, hf=hf):
                return hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=sizes.new_tokens,
                                   do_sample=False, pad_token_id=0, eos_token_id=None)

            with torch.no_grad():
                ours_tokens, hf_tokens = run_ours(), run_hf()  # also the warm-up of each
                ours_s, hf_s = (median_seconds(run_ours, device, sizes.repeats),
                                median_seconds(run_hf, device, sizes.repeats))
            new = batch * sizes.new_tokens
            agree = (ours_tokens[:, sizes.prompt:] == hf_tokens[:, sizes.prompt:]).float().mean().item()
            rows.append({"dtype": str(dtype).removeprefix("torch."), "batch": batch, "prompt": sizes.prompt,
                         "new_tokens": sizes.new_tokens,
                         "ours_tokens_per_s": new / ours_s, "hf_tokens_per_s": new / hf_s, "vs_hf": hf_s / ours_s,
                         "same_tokens": torch.equal(ours_tokens, hf_tokens), "agreement": agree})
            print("decode", rows[-1], flush=True)
    return rows


# ---------------------------------------------------------------- report

def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def write_report(out_dir: Path, smoke: bool, info: dict, gpu: dict, measured: float, training: dict | None,
                 decoding: list[dict] | None, command: str) -> str:
    written = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    peak = (f"{gpu['peak_tflops']:.0f} TFLOP/s ({gpu['peak_source']})" if gpu["peak_tflops"]
            else "unknown for this device (give it with --peak-tflops)")
    gpu_line = (f"GPU: {gpu['name']} ({gpu['sms']} SMs, {gpu['memory_gib']:.1f} GiB, compute capability "
                f"{gpu['capability']}, CUDA {gpu['cuda']})" if "sms" in gpu else f"GPU: {gpu['name']}")
    lines = ["# The course on a GPU: nanoGPT's shakespeare-char recipe, decoding against Hugging Face", "",
             f"Written by `{command}` on {written}." + (" **Smoke run: tiny sizes, a few steps; the numbers mean "
                                                       "nothing.**" if smoke else ""), "",
             machine.markdown_line(info), "",
             f"{gpu_line}; bf16 peak for MFU: {peak}; a bf16 matrix product measured **{measured:.3g} TFLOP/s** "
             "here in the same run.", ""]
    if training:
        m, t, run = training["model_config"], training["train_config"], training["full_run"]
        lines += ["## Training at nanoGPT's shakespeare-char config", "",
                  f"{m['n_layer']} layers, {m['n_head']} heads, d {m['d_model']}, block {m['block_size']}, "
                  f"vocabulary {m['vocab_size']}, dropout {m['dropout']}, biases {'on' if m['bias'] else 'off'} "
                  f"({training['parameters'] / 1e6:.2f} M parameters); batch {t['batch_size']} x {m['block_size']} = "
                  f"{training['tokens_per_step']:,} tokens per step; "
                  f"bf16 autocast {'on' if training['bf16_autocast'] else 'off'}, "
                  f"torch.compile {'on' if t['compile'] else 'off'}. FLOPs per token: 6N + 12·L·T·d = "
                  f"{training['flops_per_token'] / 1e6:.1f} M (N without the position table; nanoGPT's count).", "",
                  "| loop | tokens / s | ms / step | MFU (datasheet peak) | MFU (measured matmul) | "
                  "vs nanoGPT's operations |",
                  "|---|---:|---:|---:|---:|---:|"]
        base = training["nanogpt_ops"]["tokens_per_s"]
        for name in LOOPS:
            r = training[name]
            lines.append(f"| {r['label']} | {r['tokens_per_s']:,.0f} | {r['ms_per_step']:.2f} | "
                         f"{_pct(r['mfu_datasheet'])} | {_pct(r['mfu_measured'])} | {r['tokens_per_s'] / base:.2f}x |")
        rounds = len(training["course_trainer"]["seconds"])
        ttl = "not reached" if run["time_to_target_s"] is None else f"{run['time_to_target_s']:.0f}"
        cut = run.get("extrapolated_recipe_wall_s")
        curve = ", ".join(f"{s}: {v:.3f}" for s, v in run["val_curve"])
        lines += ["", f"Both loops time one compiled model in turns, {rounds} round(s) each of the timed steps after "
                  "a warm-up; the row is the median round. TF32 stays off in both: under bf16 autocast every matrix "
                  "product is bf16 already.", "",
                  f"### One whole run: `train(model, ..., replace(TRAIN_PRESETS['small'], device=..., "
                  f"compile={t['compile']}))`", "",
                  f"| final val loss | time to val {TARGET_LOSS} (s) | wall (s) | steps | tokens / s (whole run) | "
                  "MFU (datasheet) |",
                  "|---:|---:|---:|---:|---:|---:|",
                  f"| {run['final_val_loss']:.4f} | {ttl} | {run['wall_s']:.0f} | {run['steps']:,} | "
                  f"{run['tokens_per_s']:,.0f} | {_pct(run['mfu_datasheet'])} |", "",
                  *([f"**Cut short**: the recipe's first {run['steps']:,} of its {run['recipe_steps']:,} steps (the "
                     f"learning rate follows the {run['recipe_steps']:,}-step schedule). **Extrapolation**, not a "
                     f"measurement: the whole {run['recipe_steps']:,}-step run would take about {cut:.0f} s "
                     "(this run's seconds per step and per evaluation, times the recipe's counts).", ""]
                    if cut else []),
                  "Wall time and the time to the target include compilation and every evaluation "
                  f"({t['eval_iters']} batches of train and of val every {t['eval_interval']} steps); tokens/s counts "
                  "step time only, the first (compiling) steps included. nanoGPT's README reports val 1.4697 after "
                  "5,000 iterations in about 3 minutes on one A100, on its 1.1 MB tiny-shakespeare (65 symbols); the "
                  "course's Shakespeare is all 38 plays (4.8 M characters, 76 symbols), so the two losses are not "
                  "the same measure.", "", f"Val loss by step: {curve}", ""]
    if decoding:
        d = decoding[0]
        lines += ["## Greedy decoding with the KV cache against Hugging Face `generate`", "",
                  "Random weights in GPT-2's layout (`make_hf_stand_in`, std 0.02), loaded into our GPT with "
                  f"`pretrained.from_pretrained`; a {d['prompt']}-token prompt, "
                  f"{d['new_tokens']} new tokens per sequence, median of the timed runs after a warm-up.", "",
                  "| weights | batch | ours, tokens/s | HF, tokens/s | ours / HF | same tokens as HF | "
                  "greedy choices equal |",
                  "|---|---:|---:|---:|---:|:---:|---:|"]
        for r in decoding:
            lines.append(f"| {r['dtype']} | {r['batch']} | {r['ours_tokens_per_s']:,.0f} | "
                         f"{r['hf_tokens_per_s']:,.0f} | {r['vs_hf']:.2f}x | {'yes' if r['same_tokens'] else 'no'} | "
                         f"{r['agreement']:.1%} |")
        lines += ["", BF16_GREEDY_NOTE, ""]
    text = "\n".join(lines)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gpu.md").write_text(text, encoding="utf-8")
    meta = {"written": written, "command": command, "gpu": gpu, "measured_bf16_tflops": measured,
            "machine_info": info}
    report = {"smoke": smoke, "meta": meta, "target_loss": TARGET_LOSS, "training": training, "decoding": decoding}
    (out_dir / "gpu.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes and a few steps (a dry run, any device)")
    parser.add_argument("--device", default=None, help="default: cuda (with --smoke: the course's pick_device())")
    parser.add_argument("--out", type=Path, default=None, help="folder for gpu.md and gpu.json "
                        "(default: benchmarks/results; with --smoke: build/bench_gpu_smoke)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak, if not in PEAKS")
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument("--skip-decoding", action="store_true")
    parser.add_argument("--stop-at", type=int, default=None, help="the whole training run: only the recipe's first "
                        "N steps (its time to the end extrapolated and labelled so)")
    args = parser.parse_args(argv)
    from transformer_course.runtime import pick_device

    if not args.smoke and not torch.cuda.is_available():
        print("bench_gpu.py measures a CUDA GPU and there is none here: nothing measured, nothing written "
              "(`--smoke --device cpu` is a dry run on a CPU)", file=sys.stderr)
        return 0
    device = pick_device(args.device or (None if args.smoke else "cuda"))
    if not args.smoke and device.type != "cuda":
        parser.error(f"the full benchmark runs on a CUDA GPU, not {device}: use --smoke for a dry run")
    sizes = SMOKE if args.smoke else FULL
    out_dir = args.out or (Path(__file__).resolve().parents[1] / "build" / "bench_gpu_smoke" if args.smoke else RESULTS)
    command = "python benchmarks/bench_gpu.py" + "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    torch.manual_seed(0)
    gpu = gpu_info(device, args.peak_tflops)
    measured = matmul_tflops(device, sizes.matmul)
    print(f"{gpu['name']}: bf16 matrix product {measured:.1f} TFLOP/s", flush=True)
    training = None if args.skip_training else bench_training(sizes, device, gpu, measured, args.stop_at)
    if training:  # written now too: a run stopped during decoding keeps its training results
        write_report(out_dir, args.smoke, machine.describe(), gpu, measured, training, None, command)
    decoding = None if args.skip_decoding else bench_decoding(sizes, device)
    print(write_report(out_dir, args.smoke, machine.describe(), gpu, measured, training, decoding, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
