"""The README's examples work: its Python blocks run here, each command its shell blocks show is one that a
named test (or CI's own run) carries out, every extra it lists is pyproject.toml's, and its links lead to
files that exist."""

import contextlib
import io
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")

# Each command the README's shell blocks show, and where it runs: (file, the text there that runs it). A new
# command in the README needs a line here, and so a test that runs it. The tests run the commands' shape
# (test_wheel trains for 2 steps, not a whole run).
RUN_BY = {
    "make lab": ("tests/test_lab.py", '"make", "-s", "lab"'),
    "make test": (".ci/run", "make test\n"),  # CI's first step (tests/test_packaging.py checks it is there)
    "transformer-course train --preset tiny --out ": ("tests/test_wheel.py", 'run("train", "--preset", "tiny"'),
    "transformer-course generate --checkpoint ": ("tests/test_wheel.py", 'run("generate", "--checkpoint"'),
    "transformer-course chat": ("tests/test_wheel.py", 'run("chat"'),
    "transformer-course student-edition ": ("tests/test_wheel.py", 'run("student-edition", "edition")'),
    "transformer-course grade ": ("tests/test_grading.py", 'cli("grade", "--csv"'),
}


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README, re.S | re.M)


def _commands() -> list[str]:
    lines = (line.split("#")[0].strip() for block in _blocks("bash") for line in block.splitlines())
    return [line for line in lines if line]


def test_every_command_the_readme_shows_is_run_by_a_test():
    commands = _commands()
    assert "make lab" in commands and "make test" in commands
    for command in commands:
        # a key ending in a space takes arguments after it; any other key is the whole command
        matches = [key for key in RUN_BY if command == key or (key.endswith(" ") and command.startswith(key))]
        assert matches, f"the README shows {command!r}, which no test runs: add the test, then a line to RUN_BY"
        path, evidence = RUN_BY[max(matches, key=len)]
        assert evidence in (ROOT / path).read_text(encoding="utf-8"), f"{path} no longer runs {command!r}"


@pytest.mark.parametrize("index", range(len(_blocks("python"))))
def test_the_readmes_python_blocks_run(index):
    code = _blocks("python")[index]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, f"README.md, python block {index + 1}", "exec"), {"__name__": "readme"})
    out = printed.getvalue()
    assert out.strip(), "each block prints what it shows"
    for promise in re.findall(r"# (\w+)$", code, re.M):  # a comment of one word is the output it promises
        assert promise in out, (promise, out)
    if "ROMEO:" in code:
        assert out.startswith("ROMEO:"), out


def test_the_readme_lists_every_extra():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    listed = re.findall(r"^- `(\w+)`: ", README, re.M)
    assert sorted(listed) == sorted(extras), f"the README lists {listed}; pyproject.toml has {sorted(extras)}"


def _anchor(heading: str) -> str:
    """GitHub's id for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readmes_links_lead_to_files_that_exist():
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert local, "the README links to the docs"
    for link in local:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.is_file(), f"the README links to {link}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text(encoding="utf-8"), re.M)
            assert anchor in {_anchor(h) for h in headings}, f"{path} has no heading #{anchor}"


def _run_all(seconds: float) -> str:
    """How the README's chapter table writes a chapter's run time: whole seconds under a minute, else
    minutes to the half."""
    return f"{int(seconds + 0.5)} s" if seconds < 59.5 else f"{round(seconds / 30) / 2:g} min"


def test_the_chapter_tables_run_times_are_the_recorded_ones():
    """The "Run all" column is tests/durations.json's figures (python tools/ci_budget.py record), not typed."""
    import durations

    recorded = durations.read(durations.SNAPSHOT)["chapters"]
    rows = {m[1]: m[2].strip() for m in re.finditer(r"^\| (\d\d) [^|]*\|[^|]*\| ([^|]*)\|", README, re.M)}
    assert set(rows) == {stem[:2] for stem in recorded}, sorted(rows)
    for stem, seconds in recorded.items():
        assert rows[stem[:2]] == _run_all(seconds), f"{stem}: README says {rows[stem[:2]]}, recorded {seconds} s"
