"""Greedy generation speed: our GPT with its KV cache against Hugging Face `generate`, same weights.

For each model size a random GPT-2 is built with `transformers` (no download), saved with
`save_pretrained`, and loaded into our GPT with `load_hf_gpt2`. Both then continue the same prompt
greedily: ours with `generate(..., temperature=0, use_cache=True)`, Hugging Face's with
`generate(do_sample=False)` and its own cache. Ours runs after `tune_for_decoding` (chapter 07), and
before timing the two outputs are checked to be identical token for token, so the race is between two
implementations of the same computation. Where the CPU has native bf16, a third runner is ours with
`tune_for_decoding(..., weights_dtype=torch.bfloat16)`: reported with the share of its greedy choices
that equal HF's. Each row also times the fp32 memory bound (every weight read once per token).

The machine this was written on is shared by many jobs, so wall-clock time mostly measures the
queue. Each side therefore runs on one thread and is timed twice: by CPU time (the work done, which
descheduling does not inflate) and by wall-clock time. Runs alternate between the two sides, one
warm-up each, and each figure is the best of several runs.

    python benchmarks/bench_pretrained.py            # writes benchmarks/results/pretrained.md
    python benchmarks/bench_pretrained.py --quick    # smaller sizes, fewer tokens, prints only
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import machine  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from transformer_course import generate  # noqa: E402
from transformer_course.decoding import tune_for_decoding  # noqa: E402
from transformer_course.model import PRESETS  # noqa: E402
from transformer_course.pretrained import load_hf_gpt2, make_hf_stand_in  # noqa: E402
from transformer_course.runtime import cpu_has_fast_bf16  # noqa: E402

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

RESULTS = Path(__file__).resolve().parent / "results" / "pretrained.md"
# name -> (n_layer, n_head, d_model, vocab_size, new tokens)
SIZES = {
    "tiny (2 x 64)": (2, 4, 64, 512, 128),
    "small (4 x 256)": (4, 4, 256, 8192, 128),
    "medium (6 x 384)": (6, 6, 384, 50257, 64),
    "gpt2-124M shape (12 x 768)": (12, 12, 768, 50257, 32),
}
QUICK = {"tiny (2 x 64)": (2, 4, 64, 512, 32), "small (4 x 256)": (4, 4, 256, 8192, 32)}
PROMPT_LEN = 16
GOAL = 1.5  # the issue's target: ours at least 1.5x Hugging Face's tokens per CPU second


def _race(runs: dict, repeats: int) -> dict[str, tuple[float, float]]:
    """Best (CPU seconds, wall seconds) of each run, alternating between them after one warm-up each."""
    for run in runs.values():
        run()  # warm-up: first-call allocations, lazy initialisation
    best = {name: (float("inf"), float("inf")) for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            cpu, wall = time.process_time(), time.perf_counter()
            run()
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            best[name] = (min(best[name][0], cpu), min(best[name][1], wall))
    return best


def bench_size(n_layer: int, n_head: int, d_model: int, vocab: int, new: int, batch: int, repeats: int) -> dict:
    # std 0.02 as in GPT-2's own initialisation: realistic logits, and the output matters not, only time
    hf = make_hf_stand_in(vocab_size=vocab, n_positions=1024, n_embd=d_model, n_layer=n_layer, n_head=n_head,
                          std=0.02, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        ours = load_hf_gpt2(tmp)
    ours_bf16 = copy.deepcopy(ours) if cpu_has_fast_bf16() else None
    layouts = tune_for_decoding(ours, batch_size=batch)  # fastest layout per weight shape (chapter 07)
    ours_small_pages = copy.deepcopy(ours)  # the same choices; a deep copy's weights sit in ordinary 4 KB pages
    for layer in ours_small_pages.modules():
        layer.decode_huge_pages = False  # and so will any decoding copy made later
    if ours_bf16 is not None:
        tune_for_decoding(ours_bf16, batch_size=batch, weights_dtype=torch.bfloat16)
    prompt = torch.randint(0, vocab, (batch, PROMPT_LEN), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(prompt)

    def run_ours():
        return generate(ours, prompt, max_new_tokens=new, temperature=0, use_cache=True)

    def run_bf16():
        return generate(ours_bf16, prompt, max_new_tokens=new, temperature=0, use_cache=True)

    def run_small_pages():
        return generate(ours_small_pages, prompt, max_new_tokens=new, temperature=0, use_cache=True)

    def run_hf():
        return hf.generate(prompt, attention_mask=mask, max_new_tokens=new, do_sample=False,
                           pad_token_id=0, eos_token_id=None)

    runs = {"ours": run_ours, "hf": run_hf, "small_pages": run_small_pages, "read": _read_floor(ours, new)}
    if ours_bf16 is not None:
        runs["bf16"] = run_bf16
    with torch.no_grad():
        reference = run_hf()
        same = torch.equal(run_ours(), reference) and torch.equal(run_small_pages(), reference)
        agree = free = None
        if ours_bf16 is not None:
            agree = _choices_agreeing(ours_bf16, reference)
            free = (run_bf16()[:, PROMPT_LEN:] == reference[:, PROMPT_LEN:]).float().mean().item()
        best = _race(runs, repeats)
    params = sum(p.numel() for p in ours.parameters())
    tokens = batch * new
    counts = Counter(layouts.values())
    fused = sum(type(m).__name__ == "DecodeBlock" for m in ours.modules())
    return {"params": params, "same": same, "fused_blocks": fused, "bf16_agree": agree, "bf16_free_running_agree": free,
            "layouts": ", ".join(f"{name} x{n}" for name, n in counts.most_common()),
            **{f"{side}_{kind}": tokens / best[side][i]
               for side in runs for i, kind in enumerate(("cpu", "wall"))}}


def _choices_agreeing(model, sequence: torch.Tensor) -> float:
    """Share of the generated positions of ``sequence`` [B, PROMPT_LEN + new] where ``model``, given the
    sequence's own prefix, greedily picks the token that is there (one forward pass over the sequence).

    This counts the decisions that rounding flips; comparing two free-running continuations instead
    counts everything after the first flip as different too.
    """
    logits = model(sequence[:, :-1])[0]
    return (logits[:, PROMPT_LEN - 1:].argmax(-1) == sequence[:, PROMPT_LEN:]).float().mean().item()


def _read_floor(model, new: int):
    """Read every fp32 weight matrix of the model once per new token (a sum over it), and nothing else.

    Decoding one step with a KV cache multiplies by every weight matrix, so it must read each of them
    at least once (the tied LM head and embedding are one matrix). A plain sum streams the same bytes
    with almost no arithmetic, so no fp32 implementation's step can be quicker than this read: it is
    the memory bound of the step. (Prompt pass, attention and everything else come on top.)
    """
    weights = {id(m.weight): m.weight.detach() for m in model.modules() if isinstance(m, torch.nn.Linear)}
    weights = [w if w.is_contiguous() else w.t() for w in weights.values()]  # walk each in memory order

    @torch.no_grad()
    def run():
        for _ in range(new):
            for w in weights:
                w.sum()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two small sizes, 32 tokens, no results file")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4], help="batch sizes to run")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: see the docstring)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sizes = QUICK if args.quick else SIZES
    rows, records, verdicts = [], [], {"fp32": ([], []), "bf16": ([], [])}
    for name, (n_layer, n_head, d_model, vocab, new) in sizes.items():
        for batch in args.batch:
            r = bench_size(n_layer, n_head, d_model, vocab, new, batch, args.repeats)
            records.append({"model": name, "batch": batch, "new_tokens": new, **r})
            fp32 = r["ours_cpu"] / r["hf_cpu"]
            bf16 = "n/a | n/a" if r["bf16_agree"] is None else \
                f"**{r['bf16_cpu'] / r['hf_cpu']:.2f}x** | {r['bf16_agree']:.0%}"
            rows.append(f"| {name} | {r['params'] / 1e6:.2f}M | {batch} | {new} | {r['hf_cpu']:,.0f} | "
                        f"{r['ours_cpu']:,.0f} | **{fp32:.2f}x** | {'yes' if r['same'] else 'NO'} | "
                        f"{r['small_pages_cpu'] / r['hf_cpu']:.2f}x | {bf16} | "
                        f"{r['read_cpu'] / r['hf_cpu']:.2f}x | {r['layouts']}{'; blocks fused' if r['fused_blocks'] else ''} |")
            print(rows[-1], flush=True)
            where = f"{name}, batch {batch}"
            verdicts["fp32"][fp32 < GOAL].append(where)
            if r["bf16_agree"] is not None:
                verdicts["bf16"][r["bf16_cpu"] / r["hf_cpu"] < GOAL].append(where)
    table = "\n".join([
        "| model (layers x d_model) | parameters | batch | new tokens | HF, tokens per CPU s | ours fp32, tokens "
        "per CPU s | ours fp32 / HF | same tokens as HF | ours fp32 in 4 KB pages / HF | ours bf16 weights / HF "
        "| bf16 greedy choices equal to HF's | bound: fp32 weights read once per token / HF | layouts chosen (fp32) |",
        "|---|---:|---:|---:|---:|---:|---:|:---:|---:|---:|---:|---:|---|",
        *rows,
    ])
    if args.quick:
        return
    gpt2 = PRESETS["gpt2"]
    head = gpt2.vocab_size * gpt2.d_model
    per_position = gpt2.n_layer * 12 * gpt2.d_model**2 + head

    below = [f"{r['model']}, batch {r['batch']}" for r in records if r["read_cpu"] / r["hf_cpu"] < GOAL]
    bound_note = (f"Where it is below the goal ({'; '.join(below)}), only fewer bytes per weight can meet it."
                  if below else f"It is above the goal in every row: {GOAL}x is within reach of fp32 everywhere.")

    def verdict(kind: str) -> str:
        met, missed = verdicts[kind]
        return f"met for {'; '.join(met) or 'none'}; not met for {'; '.join(missed) or 'none'}"

    info = machine.describe()  # threads as set above, for every timed run
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        "# Greedy generation: our GPT (KV cache) vs Hugging Face `generate`, same GPT-2 weights\n\n"
        f"Written by `python benchmarks/bench_pretrained.py` on {info['date']}.\n"
        f"{machine.markdown_line(info)} Hugging Face transformers {transformers.__version__}.\n"
        f"Prompt {PROMPT_LEN} tokens per sequence, greedy decoding, best of {args.repeats} runs after a "
        "warm-up, the sides alternating. Random weights in GPT-2's layout (no download). Speeds are tokens\n"
        "per CPU second: the machine is shared, and CPU time measures the work each side does (wall-clock\n"
        "figures are in the .json).\n\n"
        f"{table}\n\n"
        f"Goal, ours >= {GOAL}x HF: in fp32, with HF's tokens exactly: {verdict('fp32')}.\n"
        f"With bf16 weights (not HF's exact numbers; token agreement in the table): {verdict('bf16')}.\n\n"
        "**ours fp32** is the course's GPT after `tune_for_decoding(model, batch_size)` (chapter 07): every\n"
        "weight shape gets the fastest of four layouts, timed on this machine inside real decode steps:\n"
        "`[out, in]`, `[in, out]`, packed ahead of time into oneDNN's blocked layout, or a\n"
        "multiply-and-sum compiled by torch.compile for the decode shapes. The choice is only as good as\n"
        "the timing: on a busy machine near-equal layouts swap between runs. A block whose four products\n"
        "are all compiled runs its whole decode step as one compiled call (\"blocks fused\"), and the\n"
        "weights sit in 2 MB pages (Linux transparent huge pages) instead of 4 KB ones; **4 KB pages** is\n"
        "a deep copy of the tuned model (same choices, ordinary pages), to show what the page size is worth. Its tokens\n"
        "are checked equal to HF's before timing (both fp32 runners). **ours bf16 weights** adds `weights_dtype=torch.bfloat16`: decoding multiplies by bf16\n"
        "copies of the weights (half the bytes), so its choice can differ from HF's fp32 one where two tokens\n"
        "are nearly tied. \"Greedy choices equal\" feeds HF's tokens to the bf16 model and counts the\n"
        "positions where it picks the same next token (a free-running comparison would count everything\n"
        "after the first flip as different; the .json has it too). Random weights give flat distributions\n"
        "with many near-ties, so a trained model agrees more: chapter 07 measures the change in validation\n"
        "loss on a trained model.\n\n"
        "**bound** is the fp32 memory bound: reading every weight matrix once per token (a sum over it), with\n"
        "no arithmetic, no prompt pass, no attention and no Python around it, divided by HF's time. Every fp32\n"
        "implementation must read each weight once per decode step, so none can beat HF by more than this.\n"
        f"{bound_note}\n\n"
        "Hugging Face's `generate` serves every model on the Hub (logits processors, stopping criteria, cache\n"
        "objects, input checks at every step): that per-token overhead dominates for small models. For large\n"
        "ones the products dominate, and there packing wins most for several sequences at once: the CPU\n"
        "library otherwise rearranges each weight on every call, reading it twice.\n\n"
        "Both sides compute the LM head at the last prompt position only (Hugging Face: `logits_to_keep=1`;\n"
        f"ours: `GPT.forward(..., last_only=True)`, chapters 06/07). For GPT-2 the head is {head / 1e6:.1f}M of\n"
        f"the {per_position / 1e6:.1f}M weight multiply-adds per position.\n"
    )
    meta = {"cpu": info["cpu"], "threads": info["threads"], "torch": info["torch"],
            "transformers": transformers.__version__, "prompt": PROMPT_LEN, "repeats": args.repeats,
            "written": info["date"], "goal": GOAL, "native_bf16": info["native_bf16"], "machine_info": info}
    RESULTS.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": records}, indent=1))
    print(f"wrote {RESULTS} and its .json")


if __name__ == "__main__":
    main()
