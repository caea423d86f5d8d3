"""Imported by Python at the start of a process whose PYTHONPATH holds this folder (a child process a test
starts with ``course_faults.environment(fault)``): with ``TRANSFORMER_COURSE_FAULT`` set, it installs the
fault injection (course_faults.py says how); then it runs the ``sitecustomize`` this one hides, if any."""

import importlib.machinery
import importlib.util
import os
import sys


def _main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    if os.environ.get("TRANSFORMER_COURSE_FAULT", "").strip():
        import course_faults

        course_faults.install()
    rest = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    hidden = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if hidden is not None and hidden.loader is not None:
        hidden.loader.exec_module(importlib.util.module_from_spec(hidden))


_main()
