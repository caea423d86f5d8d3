"""The "Measured" table of docs/maintainers.md, written from the results files (no figure is typed by hand).

    python benchmarks/summary.py          # rewrite the table between the page's markers
    python benchmarks/summary.py --check  # exit 1 when the page's table is not what the files say

Every row names the machine its figures were measured on: the `Machine:` line of the table it
comes from (`benchmarks/results/*.md`, rewritten by `make bench` on the machine it runs on), and
the tables kept from other machines in `benchmarks/results/archive/`. `make bench` runs this last;
`tests/test_benchmarks.py` fails when the page and the files disagree. (The table was in README.md until
issue 51 moved maintainer material to docs/maintainers.md.)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
ARCHIVE = RESULTS / "archive"
README = ROOT / "docs" / "maintainers.md"  # the page that holds the table (the name is kept for callers)
BEGIN = "<!-- measured: begin (written by benchmarks/summary.py from benchmarks/results; do not edit) -->"
END = "<!-- measured: end -->"
AMD_TRAINING = "2026-11-22-amd-epyc-bf16-training.md"
AMD_DECODE = "2026-11-22-amd-epyc-bf16-pretrained.md"


def tables(path: Path) -> list[list[dict[str, str]]]:
    """Every markdown table in a file, as rows of {header: cell} (bold marks removed)."""
    found, current, header = [], None, None
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            current = header = None
            continue
        cells = [c.strip().replace("**", "") for c in line.strip().strip("|").split("|")]
        if header is None:
            header, current = cells, []
            found.append(current)
        elif not set("".join(cells)) <= set("-: "):
            current.append(dict(zip(header, cells, strict=False)))
    return found


def machine(path: Path) -> str:
    """A short name for the machine a results file was measured on, from its `Machine:` line."""
    text = path.read_text(encoding="utf-8")
    line = next((ln for ln in text.splitlines() if ln.startswith("Machine:")), "Machine: not recorded")
    body = line.removeprefix("Machine:").strip()
    if body.startswith("not recorded"):
        return "not recorded"
    body = re.sub(r"\((R|TM)\)", "", body)
    name = re.sub(r"\s+Processor", "", body.split(" (")[0].split(",")[0]).strip()
    avx512 = re.search(r"AVX-512 (yes|no)", body)
    bf16 = re.search(r"native bf16(?: matrix instructions)?:? (yes|no|True|False)", body)
    threads = re.search(r"(\d+) (?:torch )?threads?\b", body)
    facts = []
    if avx512:
        facts.append("AVX-512" if avx512.group(1) == "yes" else "AVX2")
    if bf16:
        facts.append("native bf16" if bf16.group(1) in ("yes", "True") else "no native bf16")
    if threads:
        facts.append(f"{threads.group(1)} thread{'' if threads.group(1) == '1' else 's'}")
    return f"{name} ({', '.join(facts)})" if facts else name


def _row(rows: list[dict[str, str]], column: str, starts: str) -> dict[str, str]:
    for row in rows:
        if row[column].startswith(starts):
            return row
    raise LookupError(f"no row starting with {starts!r} in column {column!r}")


def training_rows(path: Path, archived: bool) -> list[str]:
    steps = tables(path)[0]
    ops = _row(steps, "variant", "nanoGPT's operations")
    fused = _row(steps, "variant", "fused attention, LayerNorm and AdamW, fp32")
    bf16 = _row(steps, "variant", "the same + bf16 autocast")
    where = f"`{path.relative_to(RESULTS).as_posix()}`"
    vs = "vs nanoGPT's operations"
    result = (f"fused fp32 step {fused['tokens / s']} tokens/s = {fused[vs]} nanoGPT's operations "
              f"({ops['tokens / s']}); bf16 autocast (opt-in) {bf16[vs]}")
    return [f"| Training step, nanoGPT's CPU shapes (4 x 4 x 128, block 64, batch 12) | {machine(path)}"
            f"{' (archived)' if archived else ''} | {result} | {where} |"]


def recipe_row() -> str:
    manifest = json.loads((ROOT / "transformer_course" / "assets" / "shakespeare_char.json").read_text())
    dates = json.loads((ROOT / "transformer_course" / "assets" / "dates_iso.json").read_text())
    chat = json.loads((ROOT / "transformer_course" / "assets" / "shakespeare_chat.json").read_text())
    lora = json.loads((ROOT / "transformer_course" / "assets" / "shakespeare_chat_lora.json").read_text())
    dpo = json.loads((ROOT / "transformer_course" / "assets" / "shakespeare_dpo.json").read_text())
    rl = json.loads((ROOT / "transformer_course" / "assets" / "shakespeare_grpo.json").read_text())

    def scores(info: dict) -> str:
        return ", ".join(f"{kind} {share:.0%}" for kind, share in info["held_out_exact_match"].items())

    return (f"| Shipped models (any machine: float32, fixed seeds) | - | chapter 06's `--preset tiny`: val loss "
            f"{manifest['final_val_loss']} after {manifest['steps']:,} steps; chapter 09's dates model: "
            f"{dates['held_out_exact_match']:.0%} exact match on held-out dates; chapter 11's held-out exact match "
            f"(from 0% before), full SFT: {scores(chat)}; LoRA rank {lora['rank']} ({lora['parameters']:,} trained): "
            f"{scores(lora)}; chapter 12 on 400 held-out strange words, DPO greedy {dpo['before']['greedy']:.1%} -> "
            f"{dpo['after']['greedy']:.1%}, GRPO pass@1 {rl['before']['pass_at_1']:.1%} -> "
            f"{rl['after']['pass_at_1']:.1%} ({rl['steps']} steps) | `transformer_course/assets/*.json` |")


def decode_rows(path: Path, archived: bool) -> list[str]:
    rows = tables(path)[0]
    out = []
    for start in ("tiny", "gpt2-124M"):
        picked = [r for r in rows if r["model (layers x d_model)"].startswith(start) and r["batch"] == "1"]
        if not picked:
            continue
        r = picked[0]
        bf16 = r.get("ours bf16 weights / HF", "n/a")
        agree = r.get("bf16 greedy choices equal to HF's", "")
        extra = "" if bf16 == "n/a" else f"; bf16 weights {bf16} ({agree} same greedy choices)"
        out.append(
            f"| Greedy decoding vs Hugging Face `generate`, {r['model (layers x d_model)']}, one sequence "
            f"(CPU time; with the run-time layout tuner the course has since removed) | {machine(path)}"
            f"{' (archived)' if archived else ''} | fp32 {r['ours fp32 / HF']} HF, same "
            f"tokens: {r['same tokens as HF']}; fp32 read bound "
            f"{r['bound: fp32 weights read once per token / HF']}{extra} | `{path.relative_to(RESULTS).as_posix()}` |"
        )
    return out


def roofline_rows(path: Path) -> list[str]:
    """`bench_decode.py`'s table: decode tokens/s at batch 1 as a fraction of the memory-read bound, and vs HF."""
    rows = tables(path)[0]
    found = re.search(r"read bandwidth measured in the same run: \*{0,2}([\d.]+ GB/s)",
                      path.read_text(encoding="utf-8"))
    bandwidth = found.group(1) if found else "not recorded"
    out = []
    for start in ("tiny", "gpt2-124M"):
        r = next((r for r in rows if r["model (layers x d_model)"].startswith(start)), None)
        if r is None:
            continue
        agree = r["bf16 greedy choices equal to fp32's"]
        out.append(
            f"| Greedy decoding at batch 1 vs the memory-read bound and Hugging Face `generate`, "
            f"{r['model (layers x d_model)']} (CPU time) | {machine(path)} | {r['fraction of the bound']} of the "
            f"bound ({r['ours fp32, tokens/s']} of {r['bound, tokens/s']} tokens/s at {bandwidth}); "
            f"{r['ours / HF']} HF, same tokens: {r['same tokens as HF']}; bf16 weights: "
            f"{agree} same greedy choices | `{path.relative_to(RESULTS).as_posix()}` |"
        )
    return out


def other_rows() -> list[str]:
    """BPE training, attention paths and the KV cache: one row each, from their tables."""
    rows = []

    def where(name: str) -> str:
        return f"{machine(RESULTS / name)} | "

    path = RESULTS / "bpe.md"
    if path.exists():
        trainers = tables(path)[0]
        naive = _row(trainers, "trainer", "recount every pair")
        fast = _row(trainers, "trainer", "incremental pair counts")
        rows.append(f"| BPE training, incremental pair counts vs recounting every pair | {where('bpe.md')}"
                    f"{fast['time (s)']} s vs {naive['time (s)']} s: {fast['speed-up']} | `bpe.md` |")
    path = RESULTS / "attention.md"
    if path.exists():
        longest = tables(path)[0][-1]
        rows.append(f"| Multi-head attention at T = {longest['T']}: fused vs loop of heads vs batched teaching path | "
                    f"{where('attention.md')}fused {longest['loop / fused']} faster than the loop, "
                    f"{longest['batched / fused']} faster and {longest['batched / fused memory']} leaner than the "
                    f"batched path | `attention.md` |")
    path = RESULTS / "generation.md"
    if path.exists():
        found = tables(path)
        window, past = found[-1][-1], found[0][-1]
        rows.append(f"| Generation with the KV cache, {window['model']} | {where('generation.md')}"
                    f"{window['speed-up']} the uncached loop within one window, {past['speed-up']} past it with "
                    f"`crop_to`; {window['KV cache at a full window (batch 1, float32)'].split(' (')[0]} of cache "
                    f"at a full window | `generation.md` |")
    path = RESULTS / "modern.md"
    if path.exists():
        models = tables(path)[0]
        gpt2, llama = _row(models, "model", "GPT-2 style"), _row(models, "model", "Llama style")
        parts = ", ".join(f"{r['model']} {r['vs GPT-2 style']}" for r in models if r["model"].startswith("+ "))
        found = re.search(r"Each model: ([\d.]+ s) of wall time", path.read_text(encoding="utf-8"))
        budget = found.group(1) if found else "equal"
        rows.append(f"| GPT-2 vs Llama-style decoder, 0.8 M parameters each, {budget} of training each on Shakespeare "
                    f"(mean over seeds) | {where('modern.md')}val loss {llama['mean']} vs {gpt2['mean']} "
                    f"({llama['vs GPT-2 style']}); one part at a time: {parts} | `modern.md` |")
    path = RESULTS / "ddp.md"
    if path.exists():
        runs = tables(path)[0]
        two = _row(runs, "run", "2 processes (gloo)")
        nodes = _row(runs, "run", "2 nodes")
        threads = _row(runs, "run", "1 process, 2 threads")
        rows.append("| Data-parallel training under torchrun, chapter 06's shapes, tokens/s vs 1 process on 1 thread "
                    f"| {where('ddp.md')}2 gloo processes {two['vs 1 process, 1 thread']} (scaling efficiency "
                    f"{two['scaling efficiency']}); 2 loopback nodes {nodes['vs 1 process, 1 thread']}; 1 process on "
                    f"2 threads {threads['vs 1 process, 1 thread']} | `ddp.md` |")
    # a figure whose machine is unknown says only where to look
    return [row if "| not recorded |" not in row else
            "| ".join(row.split("| ")[:3]) + "| rerun `make bench` to measure it with its machine named | "
            + row.split("| ")[-1] for row in rows]


def table() -> str:
    lines = [
        BEGIN,
        "| What | Machine | Result | Table |",
        "|---|---|---|---|",
        *training_rows(RESULTS / "training.md", archived=False),
        *training_rows(ARCHIVE / AMD_TRAINING, archived=True),
        *roofline_rows(RESULTS / "decode.md"),
        *decode_rows(ARCHIVE / AMD_DECODE, archived=True),
        recipe_row(),
        *other_rows(),
        END,
    ]
    return "\n".join(lines)


def updated_readme(text: str) -> str:
    if BEGIN not in text or END not in text:
        raise ValueError(f"{README.relative_to(ROOT)} lacks the markers {BEGIN!r} ... {END!r}")
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return head + table() + tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when the table is stale")
    args = parser.parse_args(argv)
    text = README.read_text(encoding="utf-8")
    new = updated_readme(text)
    if args.check:
        if new != text:
            print(f"{README.relative_to(ROOT)}'s measured table differs from benchmarks/results: "
                  "run python benchmarks/summary.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(new, encoding="utf-8")
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
