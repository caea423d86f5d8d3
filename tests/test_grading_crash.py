"""Kill `transformer-course grade` (SIGKILL, as a power cut or the OOM killer would) at chosen moments and
check that nothing is lost or half-presented: the CSV is whole or absent, a run that never finished never
says it did, the handed-in notebooks are untouched, and no process a notebook started survives.

The grader kills itself at each moment (TRANSFORMER_COURSE_FAULT, see tests/fault_injection): after
the first notebook's grade, after the second's, and halfway through writing the CSV. The moment is a
count of events, not a timer, so a fast or slow machine changes nothing."""

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import uuid

import pytest
from fault_injection.course_faults import environment
from test_grading import SANDBOX, _gone, _processes_with, course, handed_in, solve  # noqa: F401  (course: a fixture)


def _notebooks(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.ipynb"))}


@pytest.mark.system
def test_killing_the_grader_loses_nothing(course):  # noqa: F811
    chapters, subs = course
    marker = f"600.{uuid.uuid4().int % 10**6:06d}"  # ten minutes at most, should the sandbox fail
    for name in ("a", "b"):
        handed_in(subs, f"{name}_03_toy.ipynb", solve,
                  [f"import subprocess\nsubprocess.Popen(['sleep', '{marker}'], start_new_session=True)",
                   "open('scratch.txt', 'w').write('x')"])
    before = _notebooks(subs)
    command = [sys.executable, "-m", "transformer_course", "grade", "--chapters", str(chapters),
               *([] if SANDBOX else ["--no-sandbox"]), *[str(subs / f"{n}_03_toy.ipynb") for n in "ab"]]
    try:
        whole = subprocess.run([*command, "--csv", str(subs.parent / "whole.csv")], capture_output=True, text=True,
                               env=environment(), timeout=600)
        assert whole.returncode == 0, whole.stderr
        expected = (subs.parent / "whole.csv").read_text()
        assert expected.count("passed") == 4
        # (fault, the notebooks whose rows were printed before the kill)
        for fault, shown in [("kill:after_grade=1", "a"), ("kill:after_grade=2", "ab"), ("kill:mid_csv=1", "ab")]:
            out = subs.parent / f"killed_{fault.split(':')[1].replace('=', '')}.csv"
            grader = subprocess.run([*command, "--csv", str(out)], capture_output=True, text=True, timeout=600,
                                    env=environment(fault))
            assert grader.returncode == -signal.SIGKILL, (fault, grader.returncode, grader.stderr[-2000:])
            assert [n for n in "ab" if f"{n}_03_toy.ipynb" in grader.stdout] == list(shown), (fault, grader.stdout)
            assert not out.exists(), fault  # the CSV is written whole or not at all: here, not at all
            assert "graded 2 notebooks" not in grader.stderr  # never "done" without the table written
            left = [p for p in subs.parent.iterdir() if p.name.startswith(f".{out.name}.")]
            if fault.startswith("kill:mid_csv"):  # only its hidden temporary file, cut short, stays behind
                assert len(left) == 1 and left[0].name.endswith(".tmp"), left
                partial = left[0].read_text()
                assert partial and len(partial) < len(expected) and expected.startswith(partial)
            else:
                assert left == [], left
            if SANDBOX:
                assert _gone(f"sleep\x00{marker}") == [], f"{fault}: a process a notebook started survived"
            assert _notebooks(subs) == before
        if SANDBOX:
            assert not (subs / "scratch.txt").exists()  # writes in the folder are thrown away (an overlay)
    finally:
        for pid in _processes_with(f"sleep\x00{marker}"):  # only where the sandbox failed: what this test started
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
