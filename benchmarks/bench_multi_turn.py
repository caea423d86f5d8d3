"""Chapter 11's second message: held-out exact match by turn, for SFT on single questions against SFT on
conversations of 1-3 exchanges (the shipped recipe), three seeds each, and for the three shipped chat models.

    python benchmarks/bench_multi_turn.py                 # 1,000 steps, seeds 1 2 3 (about 20 minutes, 2 cores)
    python benchmarks/bench_multi_turn.py --steps 100 --seeds 1   # a smoke run

Writes benchmarks/results/multi_turn.md (the table chapter 11 shows) and multi_turn.json. A turn-t score is
`assistant.exact_match_by_turn`: each held-out example asked as the t-th question, after t - 1 exchanges of
held-out word tasks with their right answers (greedy decoding; a speaker's line fits the 64-position
context only as a first or, after a short exchange, a second question).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import machine
import torch

from transformer_course.assistant import (
    KINDS,
    ChatTokenizer,
    add_chat_tokens,
    exact_match_by_turn,
    finetune,
    make_tasks,
    turn_conversations,
)
from transformer_course.course_model import CHAT_LR, CHAT_STEPS, CHAT_TURNS, load_chat_model, load_course_model
from transformer_course.data import load_shakespeare

RESULTS = Path(__file__).resolve().parent / "results" / "multi_turn.md"
SHIPPED = (("SFT", "shakespeare_chat"), ("DPO", "shakespeare_dpo"), ("GRPO", "shakespeare_grpo"))


def _cell(values: list) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    mean = sum(values) / len(values)
    return f"{mean:.0%}" if len(values) == 1 else f"{mean:.0%} ({min(values):.0%}-{max(values):.0%})"


def _rows(label: str, runs: list[dict]) -> list[str]:
    """One table row per turn: each kind's mean over the runs (lowest-highest seed)."""
    return [f"| {label} | {turn} | " + " | ".join(_cell([r[str(turn)][k] for r in runs]) for k in KINDS) + " |"
            for turn in (1, 2, 3)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=CHAT_STEPS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--keep", action="store_true",
                        help="keep the trained runs of the stored JSON (same steps, seeds); measure the shipped ones")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    info, load0, began = machine.describe(), os.getloadavg()[0], time.perf_counter()
    base = load_course_model()
    tok, tasks = ChatTokenizer(base.tokenizer), make_tasks(load_shakespeare())
    sizes = {t: {k: len(v) for k, v in turn_conversations(tasks.held, tok, t, 64).items()} for t in (1, 2, 3)}
    trained: dict[str, list[dict]] = {"1": [], str(CHAT_TURNS): []}
    stored = json.loads(RESULTS.with_suffix(".json").read_text()) if args.keep else {}
    kept = bool(stored) and stored["meta"]["steps"] == args.steps and stored["meta"]["seeds"] == args.seeds
    if kept:
        trained = stored["trained"]
    for turns in (1, CHAT_TURNS) if not any(trained.values()) else ():
        for seed in args.seeds:
            model = add_chat_tokens(base.model)
            finetune(model, tasks, tok, args.steps, lr=CHAT_LR, seed=seed, turns=turns)
            scores = {str(t): s for t, s in exact_match_by_turn(model.eval(), tok, tasks.held).items()}
            trained[str(turns)].append({"seed": seed, **scores})
            print(turns, seed, scores, flush=True)
    shipped = {}
    for label, name in SHIPPED:
        chat = load_chat_model(shipped=name)
        shipped[label] = {str(t): s for t, s in exact_match_by_turn(chat.model, chat.tokenizer, tasks.held).items()}
    seeds = " ".join(map(str, args.seeds))
    lines = ["# The second message: exact match by turn (chapter 11)", "",
             f"{machine.markdown_line(info)} Load average at start / end: {load0:.1f} / {os.getloadavg()[0]:.1f}. "
             f"This invocation: {time.perf_counter() - began:.0f} s"
             + (", the trained runs kept from the stored results of an earlier one (`--keep`; same machine, "
                f"which took {stored['meta'].get('seconds', 0):.0f} s)." if kept else "."), "",
             f"Command: `python benchmarks/bench_multi_turn.py --steps {args.steps} --seeds {seeds}`", "",
             f"Full SFT from chapter 06's shipped base model, {args.steps:,} steps of 32 conversations, peak learning "
             f"rate {CHAT_LR:g}, seeds {seeds}: on single questions (the recipe the course shipped until 0.3.0) "
             f"and on conversations of 1 to {CHAT_TURNS} exchanges, every answer trained (the shipped recipe). "
             "Turn t: each of the 100 held-out examples of a kind asked as the t-th question, after t - 1 "
             "held-out word-task exchanges with their right answers, greedy. Each cell: the mean over the seeds "
             "(lowest-highest); n/a: no conversation of that length fits the 64-position context. Examples "
             "that fit, by turn (upper, reverse, count, speaker): "
             + "; ".join(f"{t}: " + ", ".join(str(sizes[t][k]) for k in KINDS) for t in (1, 2, 3)) + ".", "",
             "| trained on | turn | upper | reverse | count | speaker |", "|---|---:|---:|---:|---:|---:|"]
    lines += _rows("single questions", trained["1"]) + _rows(f"1-{CHAT_TURNS} exchanges", trained[str(CHAT_TURNS)])
    lines += ["", "The shipped chat models (`load_chat_model(shipped=...)`; DPO and GRPO start from the shipped "
              "SFT model and train on single questions):", "",
              "| model | turn | upper | reverse | count | speaker |", "|---|---:|---:|---:|---:|---:|"]
    for label, scores in shipped.items():
        lines += _rows(label, [scores])
    lines += ["", f"Read the speaker column across turns with care: at turn 2 only the {sizes[2]['speaker']} shortest "
              "lines fit after an exchange, another set than turn 1's 100, so its share is not comparable with "
              "turn 1's.", ""]
    RESULTS.write_text("\n".join(lines))
    RESULTS.with_suffix(".json").write_text(json.dumps(
        {"meta": {"machine_info": info, "steps": args.steps, "seeds": args.seeds, "fits": sizes,
                  "seconds": stored["meta"].get("seconds", 0) if kept else round(time.perf_counter() - began)},
         "trained": trained, "shipped": shipped}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
