"""Chapter 13's numbers: the report card of the shipped models (stored for the course's regression test),
the time each part of it takes on this CPU, and how often the Wald and Wilson 95% intervals hold the true
rate (simulated), the reason the course uses Wilson's.

    python benchmarks/bench_evaluation.py            # the shipped models' card; 20,000 simulated sets per cell
    python benchmarks/bench_evaluation.py --quick    # 2,000 simulated sets (a smoke run; the card is the same)

Writes benchmarks/results/report_card/ (report.html, report.md, report.json, PNGs: what
tests/test_report_card.py compares a regenerated card with), benchmarks/results/evaluation.md (the table
chapter 13 shows) and evaluation.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import machine
import torch

from transformer_course import report_card
from transformer_course.evaluation import wilson_interval

RESULTS = Path(__file__).resolve().parent / "results" / "evaluation.md"
RESULTS_JSON = RESULTS.with_suffix(".json")
CARD = RESULTS.parent / "report_card"


def _wald(right: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = right / n
    half = z * math.sqrt(p * (1 - p) / n)
    return p - half, p + half


def coverage(sets: int) -> list[dict]:
    """Share of `sets` simulated question sets whose interval holds the true rate, per (rate, n)."""
    rows, g = [], torch.Generator().manual_seed(0)
    for n in (20, 100, 400):
        for rate in (0.02, 0.19, 0.5, 0.95):
            hits = torch.binomial(torch.full((sets,), float(n)), torch.full((sets,), rate), generator=g).long().tolist()
            row = {"n": n, "rate": rate}
            for name, interval in (("wald", _wald), ("wilson", wilson_interval)):
                row[name] = sum(lo <= rate <= hi for lo, hi in (interval(h, n) for h in hits)) / sets
            rows.append(row)
    return rows


def timed_card() -> tuple[list[dict], dict]:
    """The shipped models' cards, and the seconds each model's measurement took."""
    data = report_card.load_data()
    cards, seconds = [], {}
    for subject in report_card.shipped_subjects():
        began = time.perf_counter()
        cards.append(report_card.measure(subject, data))
        seconds[subject.name] = time.perf_counter() - began
    return cards, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="PyTorch threads (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    info = machine.describe()
    load0 = os.getloadavg()[0]
    cards, seconds = timed_card()
    report_card.write_report(cards, CARD, where=machine.markdown_line(info))
    sim = coverage(2000 if args.quick else 20_000)
    lines = ["# Evaluation: the report card's cost, and intervals that keep their promise (chapter 13)", "",
             f"{machine.markdown_line(info)} Load average at start / end: {load0:.1f} / {os.getloadavg()[0]:.1f}.",
             "", "Command: `python benchmarks/bench_evaluation.py" + (" --quick" if args.quick else "") + "`", "",
             "Seconds to measure each shipped model for its report card (bits per character on 32,000 held-out "
             "characters, every task, pass@k from 8 samples of 400 strange words, calibration, replies, decode "
             "speed); the card itself is in `report_card/report.md`.", "",
             "| model | seconds | bits per char | decode tokens/s | ECE |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {c['name']} | {seconds[c['name']]:.1f} | {c['bits_per_char']:.3f} | {c['tokens_per_second']:,.0f} | "
              f"{c['calibration']['ece']:.3f} |" for c in cards]
    lines += ["", f"How often a 95% interval holds the true rate: {len(sim)} cells of "
              f"{2000 if args.quick else 20_000:,} simulated question sets each (binomial draws, seed 0).", "",
              "| questions | true rate | Wald | Wilson |", "|---:|---:|---:|---:|"]
    lines += [f"| {r['n']} | {r['rate']:.0%} | {r['wald']:.1%} | {r['wilson']:.1%} |" for r in sim]
    wald, wilson = [r["wald"] for r in sim], [r["wilson"] for r in sim]
    lines += ["", f"Wald's interval (the observed share ± 1.96 standard errors taken at that share) holds the true "
              f"rate as rarely as {min(wald):.1%} of the time (rates near 0% or 100%, few questions); Wilson's "
              f"between {min(wilson):.1%} and {max(wilson):.1%} in every cell.", ""]
    RESULTS.write_text("\n".join(lines))
    RESULTS_JSON.write_text(json.dumps({"meta": {"machine_info": info, "quick": args.quick}, "seconds": seconds,
                                        "coverage": sim, "figures": report_card.figures(cards)}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
