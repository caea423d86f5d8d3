"""Figures the chapters' prose cites from a stored benchmark are the stored figures.

A sentence such as "greedy accuracy falls from 55.5% to 37.0%" is typed into the chapter's markdown; the
benchmark that measured it (`benchmarks/results/*.json`) can be rerun. Each citation below rebuilds its
sentence from the stored results and looks for it in the chapter's edited form, so a rerun that moves a
figure fails here, naming the sentence to re-read, instead of leaving the prose to contradict its table."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def prose(chapter: str) -> str:
    """The markdown of a chapter's edited form, comment marks dropped and whitespace collapsed."""
    source = next((ROOT / "chapter_sources").glob(f"{chapter}_*.py")).read_text()
    lines = [line[2:] if line.startswith("# ") else line.lstrip("#") for line in source.splitlines()
             if line.startswith("#")]
    return re.sub(r"\s+", " ", " ".join(lines))


def pct(x: float, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f}%"


def preferences() -> dict:
    return json.loads((RESULTS / "preferences.json").read_text())


def dpo_row(beta: float, weight: float) -> dict:
    return next(r for r in preferences()["dpo"] if r["beta"] == beta and r["sft_weight"] == weight)


def grpo_row(kl: float) -> dict:
    return next(r for r in preferences()["grpo"] if r["kl_coef"] == kl)


def ladder() -> dict:
    return json.loads((RESULTS / "rl_ladder.json").read_text())


def spread(runs: list[dict], key: str, digits: int = 1) -> str:
    """'mean (low-high%' over the seeds, as the prose writes it (the bracket closes after any words)."""
    values = [r[key] for r in runs]
    return f"{pct(statistics.mean(values), digits)} ({pct(min(values), digits)[:-1]}-{pct(max(values), digits)}"


def arm(name: str) -> list[dict]:
    return ladder()["arms"][name]


def hack(name: str) -> list[dict]:
    return ladder()["hacking"][name]


def _kl_against_the_hole() -> str:
    return (f"greedy accuracy on the held-out words fell from {pct(ladder()['sft']['greedy'])} to "
            f"{spread(hack('hasty checker, KL 0'), 'greedy')} over the seeds); with 0.04 it stayed at "
            f"{spread(hack('hasty checker, KL 0.04'), 'greedy')}), with 0.2 at "
            f"{spread(hack('hasty checker, KL 0.2'), 'greedy')})")


def _kl_slows() -> str:
    return (f"greedy accuracy ended at {spread(arm('GRPO clipped, hasty checker, longer'), 'greedy')}) where the "
            f"strict checker's runs reached {spread(arm('GRPO clipped, KL 0.04, longer'), 'greedy')})")


def _kl_counting() -> str:
    return (f"ended at {spread(arm('GRPO clipped, KL 0.04, longer'), 'count', 0)}) and "
            f"{spread(arm('GRPO clipped, KL 0, longer'), 'count', 0)})")


def _raw_against_baseline() -> str:
    raw, base = arm("REINFORCE, raw reward"), arm("REINFORCE, group-mean baseline")
    return (f"({pct(min(r['pass_at_1'] for r in raw))[:-1]}-{pct(max(r['pass_at_1'] for r in raw))} against "
            f"{pct(min(r['pass_at_1'] for r in base))[:-1]}-{pct(max(r['pass_at_1'] for r in base))})")


def _the_hole_over_100_steps() -> str:
    hasty, honest = arm("GRPO clipped, hasty checker, longer"), arm("GRPO clipped, KL 0.04, longer")
    reward = [statistics.mean(r["reward_last"] for r in runs) for runs in (hasty, honest)]
    return (f"({reward[0]:.2f} over the last 5 steps, against {reward[1]:.2f}), but greedy accuracy by the strict "
            f"checker ended at {spread(hasty, 'greedy')}) instead of "
            f"{pct(statistics.mean(r['greedy'] for r in honest))}, "
            f"and {spread(hasty, 'hacked')}) of its greedy replies")


def _pure_dpo() -> str:
    sft, pure, guarded = preferences()["sft"], dpo_row(0.1, 0.0), dpo_row(0.1, 1.0)
    return (f"greedy accuracy on the strange words falls from {pct(sft['greedy'])} to {pct(pure['greedy'])} where "
            f"the guarded run rises to {pct(guarded['greedy'])}, and upper-casing and reversing real words fall "
            f"from {pct(sft['exact_match']['upper'], 0)} and {pct(sft['exact_match']['reverse'], 0)} to "
            f"{pct(pure['exact_match']['upper'], 0)} and {pct(pure['exact_match']['reverse'], 0)}")


def _sharpening() -> str:
    sft, rl = preferences()["sft"], grpo_row(0.04)
    return (f"pass@1 rose from {pct(sft['pass_at_1'])} to {pct(rl['pass_at_1'])} and pass@8 from "
            f"{pct(sft['pass_at_8'])} to {pct(rl['pass_at_8'])}. The failures fell from {pct(1 - sft['pass_at_1'], 0)} "
            f"to {pct(1 - rl['pass_at_1'], 0)} at k = 1, about {round((1 - sft['pass_at_1']) / (1 - rl['pass_at_1']))} "
            f"times fewer, and from {pct(1 - sft['pass_at_8'], 0)} to {pct(1 - rl['pass_at_8'])} at k = 8, about "
            f"{round((1 - sft['pass_at_8']) / (1 - rl['pass_at_8']))} times fewer")


def _distinct() -> str:
    return (f"distinct replies among 8: {preferences()['sft']['distinct']:.2f} for SFT, "
            f"{grpo_row(0.04)['distinct']:.2f} and {grpo_row(0.0)['distinct']:.2f} after GRPO")


def _summary_pass8() -> str:
    return f"pass@8 rose too ({pct(preferences()['sft']['pass_at_8'])} → {pct(grpo_row(0.04)['pass_at_8'])})"


def _rollout_share() -> str:
    shares = [r["rollout_share"] for name, runs in ladder()["arms"].items() if name != "expert iteration" for r in runs]
    return f"{round(100 * min(shares))}-{round(100 * max(shares))}% of the step"


CITATIONS = {  # name -> (chapter, the sentence rebuilt from the stored results)
    "pure DPO against the guarded run": ("12", _pure_dpo),
    "sharpening, by failure rates": ("12", _sharpening),
    "distinct replies": ("12", _distinct),
    "the summary's pass@8": ("12", _summary_pass8),
    "the KL term against the hole": ("12", _kl_against_the_hole),
    "the KL term slows the drift": ("12", _kl_slows),
    "the KL term and counting": ("12", _kl_counting),
    "raw rewards against the baseline": ("12", _raw_against_baseline),
    "the hole over 100 steps": ("12", _the_hole_over_100_steps),
    "the rollout's share of a GRPO step": ("12", _rollout_share),
}


@pytest.mark.parametrize("name", CITATIONS)
def test_the_prose_cites_the_stored_benchmark(name):
    chapter, sentence = CITATIONS[name]
    want = sentence()
    assert want in prose(chapter), (
        f"chapter {chapter}'s prose ({name}) no longer matches the stored benchmark: it should read {want!r}")
