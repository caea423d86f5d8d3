"""The ladder up to GRPO, climbed on chapter 12's strange words, each rung over three seeds (chapter 12).

Every arm starts from the shipped SFT model and trains on fresh strange words with the same budget of
sampled replies: expert iteration (keep the accepted replies, fine-tune on them), REINFORCE with raw rewards,
with a group-mean baseline, with group-normalised advantages, the same with Dr. GRPO's sum over a constant,
and GRPO's clipped objective with and without its KL term; then GRPO against chapter 12's `hasty_check` (a
checker with a hole) for longer, to show reward hacking. Each arm is measured on the held-out strange words
(greedy accuracy and pass@1), on chapter 11's counting task (a skill RL never practises) and by the entropy
of its sampled tokens, and reported as the mean and the range over the seeds.

    python benchmarks/bench_rl_ladder.py [--steps 30] [--seeds 1 2 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
from pathlib import Path

import machine
import torch

from transformer_course import rewards
from transformer_course.assistant import answers, exact_match, make_tasks
from transformer_course.course_model import GRPO_KL, GRPO_LR, load_chat_model
from transformer_course.data import load_shakespeare
from transformer_course.preferences import HELD_OUT_SEED, MAX_REPLY, accuracy, is_right, pass_at_1, strange_words
from transformer_course.rewards import expert_iteration, grpo, hasty_check

RESULTS = Path(__file__).resolve().parent / "results" / "rl_ladder.md"
RESULTS_JSON = RESULTS.with_suffix(".json")
WORDS, GROUP = 16, 8  # per step, as the shipped GRPO run


ARMS = {  # name -> (trainer, its options); every arm samples WORDS x GROUP replies a step
    "expert iteration": ("ei", {}),
    "REINFORCE, raw reward": ("grpo", {"loss": "pg", "advantage": "raw"}),
    "REINFORCE, group-mean baseline": ("grpo", {"loss": "pg", "advantage": "baseline"}),
    "REINFORCE, group-normalised": ("grpo", {"loss": "pg", "advantage": "group"}),
    "REINFORCE, group-normalised, sum / constant": ("grpo", {"loss": "pg", "advantage": "group",
                                                             "length": "constant"}),
    f"GRPO clipped, KL {GRPO_KL:g}": ("grpo", {}),
    "GRPO clipped, KL 0": ("grpo", {"kl_coef": 0.0}),
    f"GRPO clipped, KL {GRPO_KL:g}, longer": ("grpo", {}),
    "GRPO clipped, KL 0, longer": ("grpo", {"kl_coef": 0.0}),
    "GRPO clipped, hasty checker, longer": ("grpo", {"check": hasty_check}),
}


def train(arm: str, sft, tok, steps: int, seed: int, avoid) -> tuple[torch.nn.Module, dict]:
    kind, options = ARMS[arm]
    torch.manual_seed(seed)
    policy = copy.deepcopy(sft)
    common = {"tasks_per_step": WORDS, "group": GROUP, "lr": GRPO_LR, "seed": seed, "avoid": avoid}
    if kind == "ei":
        return policy, expert_iteration(policy, tok, steps, **common)
    return policy, grpo(policy, sft, tok, steps, kl_coef=options.get("kl_coef", GRPO_KL),
                        **{k: v for k, v in options.items() if k != "kl_coef"}, **common)


class TimedRollout:
    """Stands in for `rewards.rollout` (which `grpo` calls) and adds up the seconds spent sampling."""

    def __init__(self):
        self.inner, self.seconds = rewards.rollout, 0.0

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.inner(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


def measure(policy, tok, held, tasks, history: dict) -> dict:
    policy.eval()
    greedy = answers(policy, tok, [t.prompt for t in held], MAX_REPLY)
    return {"greedy": accuracy(policy, tok, held), "pass_at_1": pass_at_1(policy, tok, held, samples=4),
            "count": exact_match(policy, tok, {"count": tasks.held["count"]})["count"],
            "empty": sum(r == "" for r in greedy) / len(held),
            "hacked": sum(hasty_check(t, r) and not is_right(t, r)
                          for t, r in zip(held, greedy, strict=True)) / len(held),
            "entropy": statistics.mean(history["entropy"][-5:]) if "entropy" in history else None,
            "reward_last": statistics.mean(history["reward"][-5:])}


def spread(values: list[float], fmt: str) -> str:
    return f"{fmt.format(statistics.mean(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def table(rows: dict, sft_row: dict) -> list[str]:
    out = ["| arm | steps | greedy | pass@1 | count (ch. 11) | hole used | empty | entropy (nats) | reward, last 5 |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
           f"| SFT (the start) | 0 | {sft_row['greedy']:.1%} | {sft_row['pass_at_1']:.1%} | {sft_row['count']:.0%} "
           f"| {sft_row['hacked']:.1%} | {sft_row['empty']:.1%} | | |"]
    for arm, runs in rows.items():
        col = {k: [r[k] for r in runs] for k in runs[0] if k not in ("seed", "steps", "seconds", "rollout_share")}
        entropy = spread(col["entropy"], "{:.2f}") if col["entropy"][0] is not None else ""
        out.append(f"| {arm} | {runs[0]['steps']} | {spread(col['greedy'], '{:.1%}')} | "
                   f"{spread(col['pass_at_1'], '{:.1%}')} | {spread(col['count'], '{:.0%}')} | "
                   f"{spread(col['hacked'], '{:.1%}')} | {spread(col['empty'], '{:.1%}')} | "
                   f"{entropy} | {spread(col['reward_last'], '{:.2f}')} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--long-steps", type=int, default=100, help="steps of the arms named 'longer'")
    parser.add_argument("--keep", action="store_true",
                        help="keep the runs the stored JSON already holds (same arm, steps and seed); run the rest")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    info, load0, began = machine.describe(), os.getloadavg()[0], time.perf_counter()
    chat = load_chat_model()
    sft, tok = chat.model.eval(), chat.tokenizer
    tasks = make_tasks(load_shakespeare())
    held = strange_words(400, seed=HELD_OUT_SEED)
    avoid = frozenset(t.prompt.split(": ", 1)[1] for t in held)
    sft_row = measure(sft, tok, held, tasks, {"reward": [0.0]})
    stored = json.loads(RESULTS_JSON.read_text())["arms"] if args.keep and RESULTS_JSON.exists() else {}
    rows: dict[str, list[dict]] = {}
    reused = 0
    for arm in ARMS:
        steps = args.long_steps if arm.endswith("longer") else args.steps
        for seed in args.seeds:
            kept = [r for r in stored.get(arm, []) if r["seed"] == seed and r["steps"] == steps]
            if kept:
                rows.setdefault(arm, []).append(kept[0])
                reused += 1
                continue
            rewards.rollout = timed = TimedRollout()
            start = time.perf_counter()
            try:
                policy, history = train(arm, sft, tok, steps, seed, avoid)
            finally:
                rewards.rollout = timed.inner
            seconds = time.perf_counter() - start
            row = {"seed": seed, "steps": steps, "seconds": seconds, "rollout_share": timed.seconds / seconds,
                   **measure(policy, tok, held, tasks, history)}
            rows.setdefault(arm, []).append(row)
            print(arm, row, flush=True)
    lines = ["# The ladder up to GRPO, over three seeds (chapter 12)", "",
             f"{machine.markdown_line(info)} Load average at start / end: {load0:.1f} / {os.getloadavg()[0]:.1f}. "
             f"This invocation: {time.perf_counter() - began:.0f} s"
             + (f", {reused} runs kept from the stored results of an earlier one (`--keep`; same machine)." if reused
                else "."), "",
             f"Command: `python benchmarks/bench_rl_ladder.py --steps {args.steps} --long-steps {args.long_steps} "
             f"--seeds {' '.join(map(str, args.seeds))}`", "",
             f"Every arm starts from the shipped SFT model (`shakespeare_chat.pt`, SHA-256 "
             f"{chat.manifest['sha256'][:12]}"
             f"…, fine-tuned on conversations of up to {chat.manifest['recipe'].get('turns', 1)} exchanges) and "
             f"samples {WORDS} fresh strange words x {GROUP} replies "
             f"a step (learning rate {GRPO_LR:g}; GRPO and REINFORCE: 2 inner steps, KL {GRPO_KL:g} unless named). "
             "Each cell: the mean over the seeds, and in brackets the lowest and highest seed. Greedy and pass@1 "
             "(4 samples at temperature 1): the 400 held-out strange words, with the strict checker. count: "
             "chapter 11's held-out counting task, never practised here. Hole used: greedy replies the hasty checker "
             "accepts that are wrong (a part of the answer); empty: greedy replies with no text. Entropy: the sampled "
             "tokens' mean −log π over the last 5 steps (an estimate of the policy's "
             "entropy per token). Reward: the rollout's mean reward over the last 5 steps, by the arm's own "
             "checker (the hasty arm's is the hasty checker).", ""]
    lines += table(rows, sft_row) + [""]
    lines += ["Where a step's time goes (the sampling of the rollout, timed around `rewards.rollout`, against the "
              "whole step: rollout, log-probabilities, the updates): " + "; ".join(
                  f"{arm}: rollout {spread([r['rollout_share'] for r in runs], '{:.0%}')} of "
                  f"{spread([r['seconds'] / r['steps'] for r in runs], '{:.2f}')} s a step"
                  for arm, runs in rows.items()) + ".", ""]
    RESULTS.write_text("\n".join(lines))
    RESULTS_JSON.write_text(json.dumps({"meta": {"machine_info": info, "steps": args.steps,
                                                 "long_steps": args.long_steps, "seeds": args.seeds},
                                        "sft": sft_row, "arms": rows}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
