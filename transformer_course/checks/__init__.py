"""Exercise checks: run a learner's code against the reference and say in words what is wrong.

Every chapter's "Your turn" cell defines a function (its body between ``### BEGIN SOLUTION`` and
``### END SOLUTION``) and then calls a check from ``transformer_course.checks.<chapter module>``.
A check prints exactly one line and returns a :class:`CheckOutcome`:

    ✅ Exercise 3.1 (causal_mask): passed
    ❌ Exercise 3.1 (causal_mask): position 2 can see position 3 - ...
    ⏳ Exercise 3.1 (causal_mask): not done yet - the chapter carries on with the package's version

Checks never raise: a learner who skips an exercise, or gets it wrong, can still run the rest of
the chapter, which always uses the package's reference implementation. The grader
(``transformer-course grade``) reads these lines back from executed notebooks.

Writing a check (see ``_core`` for details)::

    from transformer_course.checks import check, expect

    @check("3.1", "causal_mask")
    def check_causal_mask(fn):
        got = fn(4)
        expect(got.dtype == torch.bool, "return a bool tensor (True = may attend)")
        expect(not got[2, 3], "position 2 can see position 3: the mask must hide the future")
"""

from ._core import RESULT_LINE, CheckFailed, CheckOutcome, check, expect, expect_close, results

__all__ = ["RESULT_LINE", "CheckFailed", "CheckOutcome", "check", "expect", "expect_close", "results"]
