"""Decoding at batch 1 against the memory-read bound, and against Hugging Face's `generate`.

A decode step with a KV cache multiplies one new position by every weight matrix, so it reads every
weight once per token (plus the cache's keys and values). With one thread the machine reads memory at
some bandwidth B bytes/s, measured here in the same run (the best of several sums of a 256 MB fp32
tensor), so no implementation that keeps fp32 weights can decode faster than

    tokens/s <= B / (bytes of weights + bytes of KV cache read per token).

For three sizes (random weights in GPT-2's layout, no download) this measures the course's plain
`generate` (chapter 07) at batch 1, the bound, the fraction of the bound reached, Hugging Face's
`generate(do_sample=False)` on the same weights (the greedy tokens are asserted equal), and the share
of greedy choices that stay the same with bf16 weights (`transformer_course.performance.bf16_weights`,
the appendix). One thread, CPU time (the work done, which other programs on a busy machine inflate less
than wall time).

    python benchmarks/bench_decode.py            # writes benchmarks/results/decode.md and .json
    python benchmarks/bench_decode.py --quick    # fewer tokens and repeats (a busy machine)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import machine
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import transformers  # noqa: E402

from transformer_course import pretrained  # noqa: E402
from transformer_course.generation import generate  # noqa: E402
from transformer_course.performance import bf16_weights, read_bandwidth  # noqa: E402
from transformer_course.pretrained import make_hf_stand_in  # noqa: E402

transformers.logging.set_verbosity_error()

RESULTS = Path(__file__).resolve().parent / "results"
# name -> (n_layer, n_head, d_model, vocab_size)
SIZES = {
    "tiny (2 x 128, vocabulary 5,000)": (2, 4, 128, 5000),
    "small (6 x 384, vocabulary 5,000)": (6, 6, 384, 5000),
    "gpt2-124M shape (12 x 768)": (12, 12, 768, 50257),
}
PROMPT_LEN = 16


def bytes_per_token(model, n_layer: int, d_model: int, new: int) -> float:
    """Bytes read per decode step: every distinct weight, bias and LayerNorm parameter once (the tied
    LM head and embedding are one matrix; the position table is read one row at a time), plus the KV
    cache's mean length over the run (keys and values, fp32)."""
    params = {id(p): p for p in model.parameters()}.values()
    weights = sum(p.numel() * p.element_size() for p in params)
    positions = model.embed.position.weight
    weights -= positions.numel() * positions.element_size()
    mean_cache = PROMPT_LEN + new / 2
    return weights + 2 * n_layer * mean_cache * d_model * 4


def bench_size(n_layer: int, n_head: int, d_model: int, vocab: int, new: int, repeats: int, bandwidth: float) -> dict:
    hf = make_hf_stand_in(vocab_size=vocab, n_positions=1024, n_embd=d_model, n_layer=n_layer, n_head=n_head,
                          std=0.02, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        ours = pretrained.from_pretrained(tmp).eval()
    hf.eval()
    prompt = torch.randint(0, vocab, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(0))

    def run_ours():
        return generate(ours, prompt, new, temperature=0)

    def run_hf():
        return hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new, do_sample=False,
                           pad_token_id=0, eos_token_id=None)

    with torch.no_grad():
        ours_tokens, hf_tokens = run_ours(), run_hf()
        assert torch.equal(ours_tokens, hf_tokens), "our greedy tokens differ from Hugging Face's"
        # bf16: the share of fp32's greedy choices it makes too, each given fp32's own prefix
        logits = bf16_weights(ours)(ours_tokens[:, :-1])[0]
        agree = (logits[:, PROMPT_LEN - 1:].argmax(-1) == ours_tokens[:, PROMPT_LEN:]).float().mean().item()
        ours_s, hf_s = machine.best_cpu_seconds(run_ours, repeats), machine.best_cpu_seconds(run_hf, repeats)
    per_token = bytes_per_token(ours, n_layer, d_model, new)
    bound = bandwidth / per_token
    ours_tps = new / ours_s
    return {"params": sum(p.numel() for p in {id(p): p for p in ours.parameters()}.values()),
            "new_tokens": new, "bytes_per_token": per_token, "bound_tps": bound, "ours_tps": ours_tps,
            "fraction_of_bound": ours_tps / bound, "hf_tps": new / hf_s, "vs_hf": ours_tps / (new / hf_s),
            "same_tokens": True, "bf16_agree": agree}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer tokens and repeats (still writes the results)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    repeats = 2 if args.quick else args.repeats
    bandwidth = read_bandwidth(n_bytes=256 * 2**20, repeats=7)
    rows, records = [], []
    for name, (n_layer, n_head, d_model, vocab) in SIZES.items():
        new = (32 if n_layer == 12 else 64) if args.quick else (64 if n_layer == 12 else 128)
        r = bench_size(n_layer, n_head, d_model, vocab, new, repeats, bandwidth)
        records.append({"model": name, **r})
        rows.append(f"| {name} | {r['params'] / 1e6:.2f}M | {r['bytes_per_token'] / 1e6:.1f} MB | "
                    f"{r['bound_tps']:,.0f} | {r['ours_tps']:,.0f} | **{r['fraction_of_bound']:.2f}** | "
                    f"{r['hf_tps']:,.0f} | **{r['vs_hf']:.2f}x** | yes | {r['bf16_agree']:.0%} |")
        print(rows[-1], flush=True)
    info = machine.describe()
    written = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    md = "\n".join([
        "# Decoding at batch 1: the memory-read bound and Hugging Face's `generate`",
        "",
        f"Written by `python benchmarks/bench_decode.py{' --quick' if args.quick else ''}` on {written}.",
        "",
        machine.markdown_line(info),
        "",
        f"One thread, greedy decoding of one sequence after a {PROMPT_LEN}-token prompt, best of {repeats} runs "
        "after a warm-up, CPU time. Random weights in GPT-2's layout (no download). One-thread read bandwidth "
        f"measured in the same run: **{bandwidth / 1e9:.1f} GB/s** (best sum of a 256 MB fp32 tensor).",
        "",
        "| model (layers x d_model) | parameters | bytes read per token | bound, tokens/s | ours fp32, tokens/s | "
        "fraction of the bound | HF, tokens/s | ours / HF | same tokens as HF | bf16 greedy choices equal to fp32's |",
        "|---|---:|---:|---:|---:|---:|---:|---:|:---:|---:|",
        *rows,
        "",
        "**bound**: the read bandwidth divided by the bytes a decode step must read: every weight once (the tied "
        "LM head and token embedding are one matrix) and the KV cache at its mean length over the run. No fp32 "
        "decoder can be faster; a model whose weights fit in the CPU's caches (the tiny one) is read faster than "
        "from memory, so for it the bound is no limit and per-step overhead sets the time. **ours**: "
        "`transformer_course.generate(model, prompt, n, temperature=0)`, the plain model (chapter 07). **bf16**: "
        "`transformer_course.performance.bf16_weights(model)` (the appendix), each position given fp32's own "
        "prefix, so one flip does not count the rest of the text as different.",
        "",
    ])
    (RESULTS / "decode.md").write_text(md, encoding="utf-8")
    meta = {"written": written, "cpu": info["cpu"], "threads": 1, "bandwidth_bytes_per_s": bandwidth,
            "quick": args.quick, "machine_info": info}
    (RESULTS / "decode.json").write_text(json.dumps({"meta": meta, "rows": records}, indent=1) + "\n", encoding="utf-8")
    print(md)


if __name__ == "__main__":
    main()
