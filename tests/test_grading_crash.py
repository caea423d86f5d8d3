"""Kill `transformer-course grade` at random moments (SIGKILL, as a power cut or the OOM killer would) and
check that nothing is lost or half-presented: the CSV is whole or absent, a run that never finished
never says it did, the handed-in notebooks are untouched, and no process a notebook started survives."""

import hashlib
import random
import signal
import subprocess
import sys
import time
import uuid

import pytest
from test_grading import SANDBOX, _processes_with, course, handed_in, solve  # noqa: F401  (course: a fixture)


def _notebooks(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.ipynb"))}


@pytest.mark.slow
def test_killing_the_grader_loses_nothing(course):  # noqa: F811
    chapters, subs = course
    marker = f"60.{uuid.uuid4().int % 10**6:06d}"  # a minute at most, should the sandbox fail
    for name in ("a", "b"):
        handed_in(subs, f"{name}_03_toy.ipynb", solve,
                  [f"import subprocess\nsubprocess.Popen(['sleep', '{marker}'], start_new_session=True)",
                   "open('scratch.txt', 'w').write('x')"])
    before = _notebooks(subs)
    command = [sys.executable, "-m", "transformer_course", "grade", "--chapters", str(chapters),
               *([] if SANDBOX else ["--no-sandbox"]), *[str(subs / f"{n}_03_toy.ipynb") for n in "ab"]]
    start = time.monotonic()
    whole = subprocess.run([*command, "--csv", str(subs.parent / "whole.csv")], capture_output=True, text=True)
    took = time.monotonic() - start
    assert whole.returncode == 0, whole.stderr
    expected = (subs.parent / "whole.csv").read_text()
    assert expected.count("passed") == 4
    rng = random.Random(24)
    for attempt in range(3):
        out = subs.parent / f"killed{attempt}.csv"
        grader = subprocess.Popen([*command, "--csv", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(rng.uniform(0.2, took))
        grader.send_signal(signal.SIGKILL)
        stdout, stderr = grader.communicate()
        if out.exists():  # whole, or not there at all
            assert out.read_text() == expected
        assert out.exists() or "graded 2 notebooks" not in stderr  # never "done" without the table written
        assert not [p for p in subs.parent.iterdir() if p.name.startswith(out.name) and p != out]  # no half file
        if SANDBOX:
            deadline = time.monotonic() + 5
            while _processes_with(f"sleep\x00{marker}") and time.monotonic() < deadline:
                time.sleep(0.1)
        assert _notebooks(subs) == before
    if SANDBOX:  # every process the notebooks started ended with the sandbox (kill -9 of the grader included)
        assert _processes_with(f"sleep\x00{marker}") == []
        assert not (subs / "scratch.txt").exists()  # writes in the folder are thrown away (an overlay)
