"""The tests pass wherever the clone is: under /tmp, and in a folder whose name has a space.

A copy of the tree is made in such a place and the tests that look at paths (what the grader's sandbox
binds, the student edition, the notebooks' hygiene, the export drift check) run from there, importing
the copy's package."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATH_TESTS = ["tests/test_sandbox.py", "tests/test_student_nbval.py", "tests/test_notebook_hygiene.py",
              "tests/test_export.py"]


@pytest.mark.system
def test_the_path_sensitive_tests_pass_from_a_clone_under_tmp_with_a_space():
    with tempfile.TemporaryDirectory(prefix="tc clone ", dir="/tmp") as scratch:
        copy = Path(scratch) / "transformer course"
        shutil.copytree(ROOT, copy, symlinks=True,
                        ignore=shutil.ignore_patterns(".git", ".venv*", "build", "student", "__pycache__"))
        env = {**os.environ, "PYTHONPATH": str(copy), "TC_DURATIONS_RUN": "clone-location"}
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *PATH_TESTS],
                              cwd=copy, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        assert " passed" in done.stdout.splitlines()[-1]
        imported = subprocess.run([sys.executable, "-c", "import transformer_course as t; print(t.__file__)"],
                                  cwd=copy, env=env, capture_output=True, text=True, check=True).stdout
        assert imported.startswith(str(copy)), imported
