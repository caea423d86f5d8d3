"""Decoding with quantized weights at GPT-2 124M's shapes, batch 1, one thread, against float32 and each
format's read bound (chapter 14).

Random weights in GPT-2's layout (`PRESETS["gpt2"]`, no download). For each way of storing the weights it
measures tokens/s of greedy decoding with the KV cache (chapter 07's `generate`), the bytes a decode step
reads (weights at their stored size, scales, the float parameters, the KV cache at its mean length), the
read bound (the one-thread read bandwidth, measured in the same run, divided by those bytes), and how
close the logits and greedy choices stay to float32's (each position given float32's own prefix):

- float32: chapter 07's decoder, the baseline;
- int8 kernel: `quantize_model(model, 8, kernel=True)`, FBGEMM's int8 linear (int8 weights, one scale a
  row; each input vector rounded to int8 on the fly);
- int8 `_weight_int8pack_mm`: PyTorch's weight-only int8 kernel (float inputs), in a Linear defined here;
- int8 plain and int4 plain: `quantize_model(..., kernel=False)`: the weights turned back into float32 at
  every call, the reference path (int4 stored one value a byte; its bound counts 4 bits a value).

    python benchmarks/bench_quantization.py            # writes benchmarks/results/quantization.md and .json
    python benchmarks/bench_quantization.py --quick    # fewer tokens and repeats
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import machine
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from transformer_course.generation import generate  # noqa: E402
from transformer_course.model import GPT  # noqa: E402
from transformer_course.performance import read_bandwidth  # noqa: E402
from transformer_course.quantization import QuantLinear, model_weight_bytes, quantize_model  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
PROMPT_LEN = 16
GOAL_SPEEDUP, GOAL_AGREE = 1.7, 0.95


class Int8PackLinear(nn.Module):
    """A Linear through `torch._weight_int8pack_mm` (float x [M, K], int8 q [N, K], scale [N])."""

    def __init__(self, quant: QuantLinear):
        super().__init__()
        self.q, self.scale, self.bias, self.n = quant.q, quant.scale, quant.bias, quant.out_features

    def forward(self, x):
        y = torch._weight_int8pack_mm(x.reshape(-1, x.shape[-1]), self.q, self.scale).reshape(*x.shape[:-1], self.n)
        return y if self.bias is None else y + self.bias


def int8pack_model(model):
    out = quantize_model(model, 8)
    for module in list(out.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, QuantLinear):
                setattr(module, name, Int8PackLinear(child))
    return out


def step_bytes(model, cfg, new: int, bits: int | None) -> float:
    """Weights as stored (int4: 4 bits a value), scales, float parameters and the mean KV cache."""
    if bits is None:
        params = {id(p): p for p in model.parameters()}.values()  # the tied embedding once: the head reads it
        weights = sum(p.numel() * p.element_size() for p in params) - model.embed.position.weight.nbytes
    else:
        parts = model_weight_bytes(model)
        weights = parts["values"] + parts["scales"] + parts["float"]
    return weights + 2 * cfg.n_layer * (PROMPT_LEN + new / 2) * cfg.d_model * 4


def agreement(reference, other, ids) -> tuple[float, float]:
    """(share of greedy choices equal, largest |logit difference| / logits' range), float32's prefix."""
    with torch.no_grad():
        a, b = reference(ids)[0][0, PROMPT_LEN - 1:], other(ids)[0][0, PROMPT_LEN - 1:]
    return (a.argmax(-1) == b.argmax(-1)).float().mean().item(), ((a - b).abs().max() / (a.max() - a.min())).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer tokens and repeats (still writes the results)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    new, slow_new, repeats = (16, 4, 1) if args.quick else (32, 8, 3)
    bandwidth = read_bandwidth(n_bytes=256 * 2**20, repeats=7)
    model = GPT.from_preset("gpt2").eval()
    cfg = model.cfg
    prompt = torch.randint(0, cfg.vocab_size, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref_ids = generate(model, prompt, 48, temperature=0)
    int8 = quantize_model(model, 8)
    variants = [("float32", model, None, new), ("int8 kernel (FBGEMM)", quantize_model(model, 8, kernel=True), 8, new),
                ("int8 `_weight_int8pack_mm`", int8pack_model(model), 8, slow_new), ("int8 plain", int8, 8, slow_new),
                ("int4 plain, groups of 32", quantize_model(model, 4, 32), 4, slow_new)]
    rows, records, base = [], [], None
    for name, m, bits, n in variants:
        stored = model if bits is None else int8 if "int8pack" in name else m  # whose bytes a step reads
        with torch.no_grad():
            seconds = machine.best_cpu_seconds(lambda m=m, n=n: generate(m, prompt, n, temperature=0), repeats)
        tps, per_token = n / seconds, step_bytes(stored, cfg, n, bits)
        base = base or tps
        agree, logit_diff = agreement(model, m, ref_ids)
        r = {"variant": name, "tokens_per_s": tps, "vs_float32": tps / base, "bytes_per_token": per_token,
             "bound_tps": bandwidth / per_token, "fraction_of_bound": tps * per_token / bandwidth,
             "greedy_agree": agree, "logit_diff_over_range": logit_diff, "new_tokens": n}
        records.append(r)
        rows.append(f"| {name} | {per_token / 1e6:.0f} MB | {r['bound_tps']:,.0f} | {tps:,.1f} | "
                    f"**{r['vs_float32']:.2f}x** | {r['fraction_of_bound']:.2f} | {agree:.0%} | {logit_diff:.3f} |")
        print(rows[-1], flush=True)
    write(records, rows, bandwidth, args.quick, new, slow_new, repeats)


def write(records, rows, bandwidth, quick, new, slow_new, repeats) -> None:
    info = machine.describe()
    written = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    kernel = records[1]
    met_speed = kernel["vs_float32"] >= GOAL_SPEEDUP
    met_agree = kernel["greedy_agree"] >= GOAL_AGREE
    verdict = (f"**Goal (int8 >= {GOAL_SPEEDUP}x float32's tokens/s, greedy choices equal on >= {GOAL_AGREE:.0%}): "
               f"speed {'met' if met_speed else 'missed'} ({kernel['vs_float32']:.2f}x, "
               f"{kernel['vs_float32'] / GOAL_SPEEDUP - 1:+.0%} against the goal), agreement "
               f"{'met' if met_agree else 'missed'} ({kernel['greedy_agree']:.0%}).**")
    md = "\n".join([
        "# Decoding with quantized weights at GPT-2 124M's shapes",
        "",
        f"Written by `python benchmarks/bench_quantization.py{' --quick' if quick else ''}` on {written}.",
        "",
        machine.markdown_line(info),
        "",
        f"One thread, batch 1, greedy decoding after a {PROMPT_LEN}-token prompt ({new} new tokens; {slow_new} for "
        f"the slow paths), best of {repeats} runs after a warm-up, CPU time. Random weights in GPT-2's layout. "
        f"One-thread read bandwidth measured in the same run: **{bandwidth / 1e9:.1f} GB/s**.",
        "",
        "| weights | bytes read per token | read bound, tokens/s | tokens/s | vs float32 | fraction of its bound | "
        "greedy choices equal to float32's | largest logit difference / logit range |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        verdict,
        "",
        "**bytes read**: the weights as stored (int4 counted at 4 bits a value, though the plain path keeps one a "
        "byte), their float32 scales, the float parameters (the tied embedding read whole by the LM head), and the "
        "KV cache at its mean length. **greedy choices**: each of 48 positions given float32's own prefix. The "
        "FBGEMM kernel also rounds every input vector to int8 (one scale a vector), which is where its logit "
        "difference comes from. The plain paths turn the weights back into float32 at every call: they are the "
        "reference, not a fast path. `_weight_int8pack_mm` is PyTorch's weight-only int8 kernel.",
        "",
    ])
    (RESULTS / "quantization.md").write_text(md, encoding="utf-8")
    meta = {"written": written, "cpu": info["cpu"], "threads": 1, "bandwidth_bytes_per_s": bandwidth, "quick": quick,
            "goal_speed_met": met_speed, "goal_agree_met": met_agree, "machine_info": info}
    (RESULTS / "quantization.json").write_text(json.dumps({"meta": meta, "rows": records}, indent=1) + "\n",
                                               encoding="utf-8")
    print(md)


if __name__ == "__main__":
    main()
