"""The ladder up to GRPO, climbed on chapter 12's strange words, each rung over three seeds (chapter 12).

Every arm starts from the shipped SFT model and trains on fresh strange words with the same budget of
sampled replies: expert iteration (keep the accepted replies, fine-tune on them), REINFORCE with raw rewards,
with a group-mean baseline, with group-normalised advantages, the same with Dr. GRPO's sum over a constant,
and GRPO's clipped objective with and without its KL term; then GRPO against chapter 12's `hasty_check` (a
checker with a hole) for longer, to show reward hacking. Each arm is measured on the held-out strange words
(greedy accuracy and pass@1), on chapter 11's counting task (a skill RL never practises) and by the entropy
of its sampled tokens, and reported as the mean and the range over the seeds.

A second table pushes harder (three times the learning rate, 20 steps): GRPO against the hasty checker with
KL coefficients 0, 0.04 and 0.2, and against the strict checker, each step's rollout scored by both
checkers, so that what the policy is paid for and what is right can be read side by side.

    python benchmarks/bench_rl_ladder.py [--steps 30] [--hack-steps 20] [--seeds 1 2 3] [--threads 1]
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
HACK_LR = 3 * GRPO_LR  # the hacking table's learning rate (chapter 12's short run uses the same)
HACK_ARMS = {  # name -> grpo options, at HACK_LR
    "hasty checker, KL 0": {"check": hasty_check, "kl_coef": 0.0},
    f"hasty checker, KL {GRPO_KL:g}": {"check": hasty_check, "kl_coef": GRPO_KL},
    "hasty checker, KL 0.2": {"check": hasty_check, "kl_coef": 0.2},
    "strict checker, KL 0": {"check": is_right, "kl_coef": 0.0},
}


class BothCheckers:
    """A checker for `grpo` that pays by `check` and records, per step, the rollout's share of right
    (strict checker), accepted (by `check`) and empty replies."""

    def __init__(self, check, replies_per_step: int):
        self.check, self.n, self.seen, self.curve = check, replies_per_step, [], []

    def __call__(self, task, reply: str) -> bool:
        accepted = self.check(task, reply)
        self.seen.append((is_right(task, reply), accepted, reply == ""))
        if len(self.seen) == self.n:  # a step's rollout is complete
            self.curve.append([sum(col) / self.n for col in zip(*self.seen, strict=True)])
            self.seen = []
        return accepted


def hack_run(arm: str, sft, tok, steps: int, seed: int, avoid) -> tuple[torch.nn.Module, dict, list]:
    options = dict(HACK_ARMS[arm])
    watch = BothCheckers(options.pop("check"), WORDS * GROUP)
    torch.manual_seed(seed)
    policy = copy.deepcopy(sft)
    history = grpo(policy, sft, tok, steps, tasks_per_step=WORDS, group=GROUP, lr=HACK_LR, seed=seed,
                   avoid=avoid, check=watch, **options)
    return policy, history, watch.curve


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


def hack_table(hacks: dict, sft_row: dict, steps: int) -> list[str]:
    """The hacking table: the rollout's right, accepted and empty shares over the last 5 steps (sampled at
    temperature 1, both checkers on the same replies), then the held-out greedy measures."""
    out = [f"## Reward hacking, pushed harder: learning rate {HACK_LR:g}, {steps} steps", "",
           "The same GRPO (clipped, 2 inner steps, 16 words x 8 replies a step) at three times the learning rate. "
           "Rollout columns: the share of the last 5 steps' sampled replies that are right (strict checker), "
           "that the arm's checker accepted (what the policy is paid for) and that are empty; then greedy on the "
           "400 held-out words (strict), the share of greedy replies that are empty, and chapter 11's count. "
           "Mean over the seeds, lowest and highest seed in brackets.", "",
           "| arm | rollout right | rollout accepted | rollout empty | greedy (held out) | greedy empty | count "
           "(ch. 11) |", "|---|---:|---:|---:|---:|---:|---:|",
           f"| SFT (the start) | | | | {sft_row['greedy']:.1%} | {sft_row['empty']:.1%} | {sft_row['count']:.0%} |"]
    for arm, runs in hacks.items():
        last = [[statistics.mean(step[i] for step in r["curve"][-5:]) for r in runs] for i in range(3)]
        out.append(f"| {arm} | {spread(last[0], '{:.0%}')} | {spread(last[1], '{:.0%}')} | "
                   f"{spread(last[2], '{:.0%}')} | {spread([r['greedy'] for r in runs], '{:.1%}')} | "
                   f"{spread([r['empty'] for r in runs], '{:.1%}')} | {spread([r['count'] for r in runs], '{:.0%}')} |")
    first_empty = {arm: [next((i + 1 for i, step in enumerate(r["curve"]) if step[2] >= 0.5), None) for r in runs]
                   for arm, runs in hacks.items()}
    out += ["", "First step at which half the rollout's replies were empty, per seed (— : never): " + "; ".join(
        f"{arm}: {', '.join('—' if s is None else str(s) for s in steps_)}" for arm, steps_ in first_empty.items())
        + "."]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--long-steps", type=int, default=100, help="steps of the arms named 'longer'")
    parser.add_argument("--hack-steps", type=int, default=20, help="steps of the hacking table's arms")
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
    old = json.loads(RESULTS_JSON.read_text()) if args.keep and RESULTS_JSON.exists() else {}
    same_start = old.get("meta", {}).get("start_sha256") == chat.manifest["sha256"]
    stored = old["arms"] if same_start else {}
    stored_hacks = old.get("hacking", {}) if same_start else {}
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
    hacks: dict[str, list[dict]] = {}
    for arm in HACK_ARMS:
        for seed in args.seeds:
            kept = [r for r in stored_hacks.get(arm, []) if r["seed"] == seed and r["steps"] == args.hack_steps]
            if kept:
                hacks.setdefault(arm, []).append(kept[0])
                reused += 1
                continue
            start = time.perf_counter()
            policy, history, curve = hack_run(arm, sft, tok, args.hack_steps, seed, avoid)
            row = {"seed": seed, "steps": args.hack_steps, "seconds": time.perf_counter() - start,
                   "curve": curve, **measure(policy, tok, held, tasks, history)}
            hacks.setdefault(arm, []).append(row)
            print(arm, {k: v for k, v in row.items() if k != "curve"}, flush=True)
    lines = ["# The ladder up to GRPO, over three seeds (chapter 12)", "",
             f"{machine.markdown_line(info)} Load average at start / end: {load0:.1f} / {os.getloadavg()[0]:.1f}. "
             f"This invocation: {time.perf_counter() - began:.0f} s"
             + (f", {reused} runs kept from the stored results of an earlier one (`--keep`; same machine)." if reused
                else "."), "",
             f"Command: `python benchmarks/bench_rl_ladder.py --steps {args.steps} --long-steps {args.long_steps} "
             f"--hack-steps {args.hack_steps} --seeds {' '.join(map(str, args.seeds))}`", "",
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
    lines += hack_table(hacks, sft_row, args.hack_steps) + [""]
    RESULTS.write_text("\n".join(lines))
    RESULTS_JSON.write_text(json.dumps({"meta": {"machine_info": info, "steps": args.steps,
                                                 "long_steps": args.long_steps, "hack_steps": args.hack_steps,
                                                 "seeds": args.seeds, "start_sha256": chat.manifest["sha256"]},
                                        "sft": sft_row, "arms": rows, "hacking": hacks}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
