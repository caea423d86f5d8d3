"""Every benchmark table names the machine its figures hold for (benchmarks/machine.py)."""

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import machine  # noqa: E402

BENCH_SCRIPTS = ("bench_attention.py", "bench_bpe.py", "bench_generation.py", "bench_decode.py",
                 "bench_training.py")
KEYS = {
    "cpu": str, "arch": str, "system": str, "isa_known": bool, "avx2": bool, "avx512f": bool,
    "avx512_bf16": bool, "amx_tile": bool, "cpu_capability": str, "native_bf16": bool,
    "threads": int, "torch": str, "python": str, "date": str,
}


def _cpuinfo(tmp_path: Path, name: str, flags: str) -> Path:
    """A /proc/cpuinfo of two logical CPUs with the given model name and flags."""
    block = f"processor\t: {{}}\nvendor_id\t: Test\nmodel name\t: {name}\nflags\t\t: {flags}\n\n"
    path = tmp_path / "cpuinfo"
    path.write_text(block.format(0) + block.format(1))
    return path


def test_describe_has_every_key_with_its_type():
    info = machine.describe()
    for key, kind in KEYS.items():
        assert isinstance(info[key], kind), (key, info[key])
    assert info["cpu"]
    assert info["threads"] == torch.get_num_threads()  # the count in force, not the machine's cores
    assert info["torch"] == torch.__version__
    assert info["cpu_count"] is None or isinstance(info["cpu_count"], int)
    assert info["load_1min"] is None or isinstance(info["load_1min"], float)
    assert info["date"].endswith(" UTC") and len(info["date"]) == len("2026-11-23 21:30 UTC")
    json.dumps(info)  # stored as the results' meta["machine_info"]


def test_markdown_line_names_the_machine():
    info = machine.describe()
    line = machine.markdown_line(info)
    assert line.startswith("Machine: ") and line.endswith(".") and "\n" not in line
    for word in (info["cpu"], "AVX-512", "AVX512-BF16", "AMX", "thread", "torch", info["torch"],
                 info["cpu_capability"], machine.isa_class(info)):
        assert word in line, word
    assert machine.markdown_line().startswith("Machine: ")  # given nothing: this machine


@pytest.mark.parametrize("flags, found, isa_class", [  # found: avx2, avx512f, avx512_bf16, amx_tile
    ("fpu sse4_2 avx avx2 fma bmi2", (True, False, False, False), "AVX2-class"),
    ("avx2 avx512fp16 avx512vl", (True, False, False, False), "AVX2-class"),  # not avx512f
    ("avx2 avx512f avx512_bf16 avx512_vnni", (True, True, True, False), "bf16-class"),
    ("avx2 avx512f amx_bf16 amx_tile amx_int8", (True, True, False, True), "bf16-class"),
])
def test_fake_cpuinfo(tmp_path, monkeypatch, flags, found, isa_class):
    expected = dict(zip(machine.ISA_FLAGS, found, strict=True))
    path = _cpuinfo(tmp_path, "Test CPU 9000 @ 3.00GHz", flags)
    info = machine.describe(path)
    assert info["cpu"] == "Test CPU 9000 @ 3.00GHz" and info["isa_known"]
    assert {flag: info[flag] for flag in expected} == expected
    assert machine.isa_class(info) == isa_class
    line = machine.markdown_line(info)
    assert line.startswith("Machine: Test CPU 9000 @ 3.00GHz (")
    for flag, label in machine.ISA_FLAGS.items():
        assert f"{label} {'yes' if expected[flag] else 'no'}" in line
    assert isa_class in line
    monkeypatch.setattr(machine, "CPUINFO", path)  # the module constant is the default
    assert machine.describe()["cpu"] == "Test CPU 9000 @ 3.00GHz"


def test_without_cpuinfo(tmp_path):
    """macOS, Windows: no /proc/cpuinfo. The flags read False and the line says they are unknown."""
    info = machine.describe(tmp_path / "missing")
    assert info["cpu"] and not info["isa_known"]
    assert not any(info[flag] for flag in machine.ISA_FLAGS)
    assert machine.isa_class(info) == "AVX2-class"
    assert "unknown" in machine.markdown_line(info)


TABLES = sorted((BENCHMARKS / "results").glob("*.md"))


@pytest.mark.parametrize("table", TABLES, ids=lambda p: p.name)
def test_every_results_table_names_its_machine(table):
    lines = table.read_text(encoding="utf-8").splitlines()
    assert any(line.startswith("Machine:") for line in lines), f"{table.name}: no 'Machine:' line"


def test_results_tables_exist():
    assert len(TABLES) >= len(BENCH_SCRIPTS)


def test_every_bench_script_writes_the_machine_line():
    scripts = sorted(p.name for p in BENCHMARKS.glob("bench_*.py"))
    assert set(BENCH_SCRIPTS) <= set(scripts)
    for name in scripts:
        source = (BENCHMARKS / name).read_text(encoding="utf-8")
        assert "import machine" in source and "machine.markdown_line(" in source, name
        if '"meta"' in source:  # a script that writes a .json stores the description there too
            assert '"machine_info"' in source and "machine.describe()" in source, name


def test_readme_measured_table_is_written_from_the_results_files():
    """No figure in the measured table (docs/maintainers.md, moved from the README) is typed by hand: it is
    what benchmarks/summary.py writes."""
    import summary

    text = summary.README.read_text(encoding="utf-8")
    assert summary.README == summary.ROOT / "docs" / "maintainers.md"
    assert summary.BEGIN not in (summary.ROOT / "README.md").read_text(encoding="utf-8"), "one table, one page"
    assert summary.updated_readme(text) == text, "docs/maintainers.md is stale: run python benchmarks/summary.py"
    table = text[text.index(summary.BEGIN): text.index(summary.END)]
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| What")]
    assert len(rows) >= 6
    for row in rows:  # every row names its machine (or says that it was not recorded, or needs none)
        machine_cell = row.split(" | ")[1]
        assert machine_cell in ("-", "not recorded") or "(" in machine_cell, row


def test_summary_reads_a_table_and_a_machine_line(tmp_path):
    import summary

    md = tmp_path / "t.md"
    md.write_text("Machine: Intel(R) Xeon(R) Processor @ 2.80GHz (2 CPUs; AVX2 yes, AVX-512 no, AVX512-BF16 no, "
                  "AMX no; native bf16 no, AVX2-class), 1 torch thread, torch 2.13\n\n"
                  "| a | b |\n|---|--:|\n| x | **2x** |\n")
    assert summary.tables(md) == [[{"a": "x", "b": "2x"}]]
    assert summary.machine(md) == "Intel Xeon @ 2.80GHz (AVX2, no native bf16, 1 thread)"
