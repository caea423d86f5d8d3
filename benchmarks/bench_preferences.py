"""Chapter 12's numbers: DPO by β and with or without the SFT term on the chosen replies, and GRPO with
and without its KL term, all from chapter 11's shipped SFT model, measured on the held-out strange words
and on chapter 11's held-out exact match (what SFT taught), on this CPU.

    python benchmarks/bench_preferences.py            # DPO: β 0.1 and 0.5, SFT term 0 and 1; GRPO: KL 0.04 and 0
    python benchmarks/bench_preferences.py --quick    # fewer steps (a smoke run)

Writes benchmarks/results/preferences.md (the table chapter 12 shows) and preferences.json. Greedy:
the share of the 400 held-out strange words answered exactly by greedy decoding; pass@1 and pass@8:
the unbiased estimates (Chen et al. 2021) from 8 replies sampled at temperature 1 per word; distinct:
how many different replies those 8 are, on average (diversity). Seconds are training only.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from pathlib import Path

import machine
import torch

from transformer_course.assistant import answers, exact_match, make_tasks
from transformer_course.course_model import (
    DPO_BETA,
    DPO_LR,
    DPO_SFT_WEIGHT,
    DPO_STEPS,
    DPO_WORDS,
    GRPO_KL,
    GRPO_LR,
    GRPO_STEPS,
    load_chat_model,
)
from transformer_course.data import load_shakespeare
from transformer_course.evaluation import pass_at_k
from transformer_course.preferences import (
    HELD_OUT_SEED,
    MAX_REPLY,
    accuracy,
    dpo,
    is_right,
    preference_pairs,
    strange_words,
)
from transformer_course.rewards import grpo

RESULTS = Path(__file__).resolve().parent / "results" / "preferences.md"
RESULTS_JSON = RESULTS.with_suffix(".json")
SAMPLES = 8


def sampled(model, tok, held) -> dict:
    """pass@1, pass@8 and distinct replies from SAMPLES replies per held-out word (temperature 1, seed 0)."""
    generator = torch.Generator().manual_seed(0)
    prompts = [t.prompt for t in held]
    draws = [answers(model, tok, prompts, MAX_REPLY, 1.0, generator) for _ in range(SAMPLES)]
    right = [sum(is_right(t, d[i]) for d in draws) for i, t in enumerate(held)]
    return {"pass_at_1": sum(pass_at_k(SAMPLES, c, 1) for c in right) / len(held),
            "pass_at_8": sum(pass_at_k(SAMPLES, c, SAMPLES) for c in right) / len(held),
            "distinct": sum(len({d[i] for d in draws}) for i in range(len(held))) / len(held)}


def measure(model, tok, held, tasks) -> dict:
    model.eval()
    return {"greedy": accuracy(model, tok, held), **sampled(model, tok, held),
            "exact_match": exact_match(model, tok, tasks.held)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1),
                        help="PyTorch threads (default 2; 1 when other work shares the cores)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    info = machine.describe()
    load0 = os.getloadavg()[0]
    chat = load_chat_model()
    sft, tok = chat.model, chat.tokenizer
    tasks = make_tasks(load_shakespeare())
    held = strange_words(400, seed=HELD_OUT_SEED)
    avoid = frozenset(t.prompt.split(": ", 1)[1] for t in held)
    dpo_steps, grpo_steps = (30, 10) if args.quick else (DPO_STEPS, GRPO_STEPS)
    base = measure(sft, tok, held, tasks)
    print("SFT", base, flush=True)
    pairs = preference_pairs(sft, tok, strange_words(DPO_WORDS, seed=1, avoid=avoid), seed=1)
    dpo_rows = []
    for beta in (DPO_BETA, 0.5):
        for weight in (0.0, DPO_SFT_WEIGHT):
            torch.manual_seed(0)
            policy = copy.deepcopy(sft)
            began = time.perf_counter()
            history = dpo(policy, sft, tok, pairs, dpo_steps, beta=beta, lr=DPO_LR, sft_weight=weight, seed=1)
            seconds = time.perf_counter() - began
            chosen_logp = sum(history["chosen"][-20:]) / len(history["chosen"][-20:]) / beta
            dpo_rows.append({"beta": beta, "sft_weight": weight, "seconds": seconds,
                             "chosen_log_ratio": chosen_logp, **measure(policy, tok, held, tasks)})
            print(dpo_rows[-1], flush=True)
    grpo_rows = []
    for kl in (GRPO_KL, 0.0):
        torch.manual_seed(0)
        policy, curve, evaluating = copy.deepcopy(sft), [], 0.0

        def every_50(step: int, _history: dict, policy=policy, curve=curve) -> None:
            nonlocal evaluating
            if step % 50 == 0:
                start = time.perf_counter()
                curve.append({"step": step, "greedy": accuracy(policy.eval(), tok, held)})
                policy.train()
                evaluating += time.perf_counter() - start

        began = time.perf_counter()
        history = grpo(policy, sft, tok, grpo_steps, lr=GRPO_LR, kl_coef=kl, seed=1, avoid=avoid, on_step=every_50)
        seconds = time.perf_counter() - began - evaluating
        grpo_rows.append({"kl_coef": kl, "steps": grpo_steps, "seconds": seconds, "curve": curve,
                          "final_kl": sum(history["kl"][-20:]) / len(history["kl"][-20:]),
                          **measure(policy, tok, held, tasks)})
        print(grpo_rows[-1], flush=True)

    def em(row: dict) -> str:
        return " | ".join(f"{row['exact_match'][k]:.0%}" for k in ("upper", "reverse", "count", "speaker"))

    def strange(row: dict) -> str:
        return f"{row['greedy']:.1%} | {row['pass_at_1']:.1%} | {row['pass_at_8']:.1%} | {row['distinct']:.2f}"

    head = ("| greedy | pass@1 | pass@8 | distinct of 8 | upper | reverse | count | speaker |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = ["# Preferences and rewards on the course's SFT model (chapter 12)", "",
             f"{machine.markdown_line(info)} Load average at start / end: {load0:.1f} / {os.getloadavg()[0]:.1f}.",
             "", "Command: `python benchmarks/bench_preferences.py" + (" --quick" if args.quick else "") + "`", "",
             f"Start: the shipped SFT model (`shakespeare_chat.pt`, SHA-256 {chat.manifest['sha256'][:12]}…, "
             f"fine-tuned on conversations of up to {chat.manifest['recipe'].get('turns', 1)} exchanges).", "",
             "Held-out strange words: 400 random strings of 3-7 letters (`preferences.strange_words(400, seed="
             f"{HELD_OUT_SEED})`, upper-casing or reversing), never trained on. Greedy: exact-match share with "
             f"greedy decoding; pass@1 and pass@8: unbiased estimates from {SAMPLES} replies sampled at "
             "temperature 1; distinct: different replies among those 8. The last four columns are chapter 11's "
             "held-out exact match (real words, and who says a line): what SFT taught, which preference "
             "training should not take away.", "",
             "| model | steps | seconds | " + head[0][2:], "|---|---:|---:" + head[1],
             f"| SFT (chapter 11, the start) | | | {strange(base)} | {em(base)} |"]
    lines += [f"| DPO β={r['beta']:g}, SFT term {r['sft_weight']:g} | {dpo_steps} | {r['seconds']:.0f} | "
              f"{strange(r)} | {em(r)} |" for r in dpo_rows]
    lines += [f"| GRPO KL {r['kl_coef']:g} | {r['steps']} | {r['seconds']:.0f} | {strange(r)} | {em(r)} |"
              for r in grpo_rows]
    lines += ["", f"DPO: {len(pairs):,} pairs (a right and a wrong reply of the SFT model to the same word, from "
              f"{DPO_WORDS:,} words), batches of 32, learning rate {DPO_LR:g}. The SFT term adds the chosen "
              "replies' cross-entropy per token (weight 1): without it the margin grows mostly by making the "
              "rejected replies unlikely, and probability leaks to replies in no pair. The mean log-ratio "
              "log π/π_ref of the chosen replies over the last 20 steps: "
              + ", ".join(f"β={r['beta']:g} SFT {r['sft_weight']:g}: {r['chosen_log_ratio']:+.2f}" for r in dpo_rows)
              + ".", "",
              f"GRPO: 16 fresh words per step, 8 replies each, 2 inner steps, clip 0.2, learning rate {GRPO_LR:g}. "
              "Greedy accuracy every 50 steps: "
              + "; ".join(f"KL {r['kl_coef']:g}: " + ", ".join(f"{c['greedy']:.0%}" for c in r["curve"])
                          for r in grpo_rows)
              + ". Mean k3 KL per reply token over the last 20 steps: "
              + ", ".join(f"KL {r['kl_coef']:g}: {r['final_kl']:.4f}" for r in grpo_rows) + ".", ""]
    RESULTS.write_text("\n".join(lines))
    RESULTS_JSON.write_text(json.dumps({"meta": {"machine_info": info, "quick": args.quick}, "sft": base,
                                        "pairs": len(pairs), "dpo": dpo_rows, "grpo": grpo_rows}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
