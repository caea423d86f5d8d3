"""Test-only fault injection: course_faults.py (the faults and where they strike) and the sitecustomize
that arms it in the child processes a test starts with ``course_faults.environment(fault)``."""
