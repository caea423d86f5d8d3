"""Exercise checks: run a learner's code against the reference and say in words what is wrong.

Every chapter's "Your turn" cell defines a function (its body between ``### BEGIN SOLUTION`` and ``### END SOLUTION``)
and then calls a check from ``transformer_course.checks.<chapter module>``. A check prints exactly one line and returns
a :class:`CheckOutcome`:

    ✅ Exercise 3.2 (causal_mask): passed - the rest of the chapter uses yours
    ❌ Exercise 3.2 (causal_mask): position 2 can see position 3, which comes after it: ... - ...
    ⏳ Exercise 3.2 (causal_mask): not done yet - ...

(the last two end with "- the chapter carries on with the package's causal_mask"). Checks never raise, so a learner who
skips an exercise, or gets it wrong, can still run the rest of the chapter. A check declared with a ``reference`` (the
package's implementation, or for most debug and extend exercises one kept in the checks module) returns in ``use`` what
the chapter runs next: the learner's code when it passed, the reference otherwise. Every outcome is also recorded
(:func:`results`); the grader (``transformer-course grade``) reads those records through the kernel, never the printed
lines.

Writing a check (the vocabulary is described in ``_core``)::

import torch

    from transformer_course.attention import causal_mask
    from transformer_course.checks import check, expect, expect_tensor

    @check("3.2", "causal_mask", reference=causal_mask)
    def check_causal_mask(fn):
        got = expect_tensor(fn(4))
        expect(got.dtype == torch.bool, "return a bool tensor (True = may attend)")
        expect(not got[2, 3], "position 2 can see position 3: the mask must hide the future")
"""

from ._core import (
    RESULT_LINE,
    CheckFailed,
    CheckOutcome,
    check,
    close,
    expect,
    expect_answer,
    expect_close,
    expect_items,
    expect_known_crash,
    expect_mask,
    expect_match,
    expect_number,
    expect_numbers,
    expect_runs,
    expect_tensor,
    expect_unchanged,
    fresh_rng,
    name_mistake,
    planted,
    results,
    seeded_randn,
)

__all__ = ["RESULT_LINE", "CheckFailed", "CheckOutcome", "check", "close", "expect", "expect_answer", "expect_close",
           "expect_items", "expect_known_crash", "expect_mask", "expect_match", "expect_number", "expect_numbers",
           "expect_runs", "expect_tensor", "expect_unchanged", "fresh_rng", "name_mistake", "planted", "results",
           "seeded_randn"]
