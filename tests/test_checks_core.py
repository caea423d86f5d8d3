"""The check machinery itself: one printed line, the right status, never an exception."""

from transformer_course.attention import causal_mask
from transformer_course.checks import RESULT_LINE, check, expect, expect_close, results


@check("0.1", "double")
def check_double(fn):
    expect(fn(2) == 4, "double(2) should be 4: multiply by two")
    expect_close(fn(0.5), 1.0, "double(0.5) should be 1.0")


def test_statuses_and_lines(capsys):
    good = check_double(lambda x: 2 * x)
    wrong = check_double(lambda x: x + 2)  # right at 2, wrong at 0.5

    def stub(x):
        raise NotImplementedError("Exercise 0.1: double")

    def crashes(x):
        return x / 0

    not_done = check_double(stub)
    crashed = check_double(crashes)
    assert [o.status for o in (good, wrong, not_done, crashed)] == [
        "passed",
        "failed",
        "not done",
        "failed",
    ]
    assert "double(0.5) should be 1.0" in wrong.message
    assert "ZeroDivisionError" in crashed.message and "return x / 0" in crashed.message
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4
    parsed = [RESULT_LINE.match(line) for line in lines]
    assert all(parsed) and [m["exercise"] for m in parsed] == ["0.1"] * 4
    assert results()[-4:] == [good, wrong, not_done, crashed]


def test_quiet_prints_nothing(capsys):
    assert check_double(lambda x: 2 * x, quiet=True).passed
    assert capsys.readouterr().out == ""


@check("0.2", "causal_mask", reference=causal_mask)
def check_mask_with_reference(fn):
    import torch

    expect(
        torch.equal(fn(3), torch.ones(3, 3, dtype=torch.bool).tril()),
        "position 0 can see position 1",
    )


def test_use_is_the_learners_code_when_it_passed_else_the_reference(capsys):
    import torch

    from transformer_course.attention import causal_mask

    def mine(T):
        return torch.ones(T, T, dtype=torch.bool).tril()

    def wrong(T):
        return torch.ones(T, T, dtype=torch.bool)

    def stub(T):
        raise NotImplementedError("Exercise 0.2")

    passed, failed, not_done = (check_mask_with_reference(f) for f in (mine, wrong, stub))
    assert passed.use is mine and failed.use is causal_mask and not_done.use is causal_mask
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].endswith("passed - the rest of the chapter uses yours")
    assert (
        "position 0 can see position 1 - the chapter carries on with the package's causal_mask"
        in lines[1]
    )
    assert lines[2].endswith("not done yet - the chapter carries on with the package's causal_mask")
    assert all(RESULT_LINE.match(line) for line in lines)
    assert check_double(lambda x: 2 * x, quiet=True).use is None  # no reference declared


def test_expect_tensor_and_seeded_randn():
    import pytest
    import torch

    from transformer_course.checks import CheckFailed
    from transformer_course.checks._core import expect_tensor, seeded_randn

    x = seeded_randn(2, 3, seed=4)
    assert torch.equal(x, seeded_randn(2, 3, seed=4)) and not torch.equal(
        x, seeded_randn(2, 3, seed=5)
    )
    assert seeded_randn(2, seed=0, dtype=torch.float64).dtype == torch.float64
    assert expect_tensor(x, (2, 3)) is x
    with pytest.raises(CheckFailed, match=r"return a tensor of logits, got list"):
        expect_tensor([1.0], what="a tensor of logits")
    with pytest.raises(CheckFailed, match=r"return a tensor of shape \(3, 2\), got \(2, 3\)"):
        expect_tensor(x, (3, 2))


def test_close_and_name_mistake():
    import torch

    from transformer_course.checks import close, name_mistake

    x = torch.tensor([1.0, 2.0])
    assert close(x + 1e-6, x) and not close(x + 1e-3, x) and not close(x[:1], x)
    assert not close([1.0, 2.0], x)  # the learner's answer must be a tensor
    assert close(x + 1e-5, x, atol=1e-4) and not close(x + 1e-5, x, atol=1e-7, rtol=0)
    mistakes = [("doubled", x * 2), ("negated", lambda: -x), ("a list", [1, 2])]
    assert name_mistake(x * 2, mistakes) == "doubled"
    assert name_mistake(-x, mistakes) == "negated"  # computed when it is needed
    assert name_mistake([1, 2], mistakes) == "a list" and name_mistake(x + 3, mistakes) is None
    # a mistake that gives the right answer on this input is no mistake here
    assert name_mistake(x, [("same as right", x.clone())], want=x) is None


def test_expect_close_names_the_mistake_and_expect_unchanged_and_runs():
    import pytest
    import torch

    from transformer_course.checks import CheckFailed, expect_close, expect_runs, expect_unchanged

    x = torch.tensor([1.0, 2.0])
    expect_close(x, x, "never", mistakes=[("unused", x)])
    with pytest.raises(CheckFailed, match=r"^halved$"):
        expect_close(x / 2, x, "wrong", mistakes=[("doubled", x * 2), ("halved", x / 2)])
    with pytest.raises(CheckFailed, match=r"^wrong \(largest difference 2\)$"):
        expect_close(x + 2, x, "wrong", mistakes=[("doubled", x * 2)])
    expect_unchanged([1, 2], [1, 2])
    with pytest.raises(CheckFailed, match="do not change x in place"):
        expect_unchanged(x.mul_(2), torch.tensor([1.0, 2.0]))
    assert expect_runs(lambda a, b=0: a + b, 1, b=2, hint="never") == 3
    with pytest.raises(CheckFailed, match=r"^read the size \(it raised ZeroDivisionError: "):
        expect_runs(lambda: 1 / 0, hint="read the size")
    with pytest.raises(NotImplementedError):  # a stub stays "not done"
        expect_runs(lambda: (_ for _ in ()).throw(NotImplementedError()), hint="never")


def test_fresh_rng_and_the_wrapper_leave_the_notebooks_random_numbers_alone():
    import torch

    from transformer_course.checks import fresh_rng

    torch.manual_seed(7)
    expected = torch.rand(2)
    torch.manual_seed(7)
    with fresh_rng(3):
        inside = torch.rand(2)
    with fresh_rng(3):
        assert torch.equal(torch.rand(2), inside)

    @check("0.3", "draws")
    def check_draws(fn):
        fn()
        torch.rand(5)

    assert check_draws(lambda: torch.randn(3), quiet=True).passed
    assert torch.equal(torch.rand(2), expected)


def test_a_reference_is_the_object_itself():
    from transformer_course.attention import causal_mask

    @check("0.4", "causal_mask", reference=causal_mask)
    def check_object_reference(fn):
        expect(fn(2)[0, 1].item() is False, "position 0 can see position 1")

    failed = check_object_reference(lambda T: causal_mask(T).logical_not(), quiet=True)
    assert failed.use is causal_mask and failed.message.endswith("package's causal_mask")


def test_the_tables_of_mistakes_expect_answer_number_and_mask():
    import pytest
    import torch

    from transformer_course.checks import CheckFailed, expect_answer, expect_mask, expect_number, planted

    def twice(x, *, off_by_one=False, negated=False):  # a reference with one switch per planted mistake
        return -2 * x if negated else 2 * x + off_by_one

    table = [("added one", dict(off_by_one=True)), ("negated", dict(negated=True))]
    expect_answer(6, twice(3), planted(table, twice, 3), "never")
    with pytest.raises(CheckFailed, match=r"^negated$"):
        expect_answer(-6, twice(3), planted(table, twice, 3), "never")
    with pytest.raises(CheckFailed, match=r"^not 5$"):
        expect_answer(5, twice(3), planted(table, twice, 3), "not 5")
    expect_answer(6.0005, 6.0, atol=1e-3)
    with pytest.raises(CheckFailed, match=r"^added one$"):  # numbers within atol of a mistake
        expect_answer(7.0004, 6.0, [("added one", 7.0)], "never", atol=1e-3)
    assert expect_number(3) == 3
    with pytest.raises(CheckFailed, match=r"^return a whole number, got 3.0$"):
        expect_number(3.0, "a whole number", int)
    with pytest.raises(CheckFailed, match=r"^return a number, got True$"):
        expect_number(True)
    causal = torch.ones(3, 3, dtype=torch.bool).tril()
    expect_mask(causal, causal, str, str)
    with pytest.raises(CheckFailed, match=r"^0 sees 1$"):
        expect_mask(torch.ones(3, 3, dtype=torch.bool), causal, lambda i, j: f"{i} sees {j}", str)
    with pytest.raises(CheckFailed, match=r"^0 misses 0$"):
        expect_mask(causal & ~torch.eye(3, dtype=torch.bool), causal, str, lambda i, j: f"{i} misses {j}")


def test_expect_items_numbers_match_and_known_crash():
    import re

    import pytest
    import torch

    from transformer_course.checks import (
        CheckFailed,
        expect_items,
        expect_known_crash,
        expect_match,
        expect_numbers,
    )

    assert expect_items((1, 2), 2, "a pair") == (1, 2)
    for wrong in ((1, 2, 3), [1, 2], None):
        with pytest.raises(CheckFailed, match=r"^a pair$"):
            expect_items(wrong, 2, "a pair")
    assert expect_items([1, 2], 2, "a pair", tuple | list) == [1, 2]
    assert expect_numbers(torch.tensor([[1, 2]]), 2, "two") == [1.0, 2.0]
    for answer, said in ((7, "as a list, got int"), ([1], "two of them, got 1"), (["a", 1], "two, got ['a', 1]")):
        with pytest.raises(CheckFailed, match=rf"^{re.escape(said)}$"):
            expect_numbers(answer, 2, "two", as_list="as a list", count="two of them")
    want = torch.zeros(2, 3)
    expect_match(want + 1e-7, want)
    wrong = want.clone()
    wrong[1, 2] = 1.0
    with pytest.raises(CheckFailed, match=r"^entry \(1, 2\)$"):
        expect_match(wrong, want, otherwise=lambda i, j: f"entry ({i}, {j})")
    for mistakes in ([("one is off", wrong)], lambda: [("one is off", wrong)]):  # a table, or made when needed
        with pytest.raises(CheckFailed, match=r"^one is off$"):
            expect_match(wrong, want, mistakes, otherwise=str)

    def crash(message):
        raise RuntimeError(message)

    known = [("view size", "use reshape"), ("", "anything else")]
    assert expect_known_crash(len, "abc", known=known) == 3
    with pytest.raises(CheckFailed, match=r"^use reshape$"):
        expect_known_crash(crash, "view size is not compatible", known=known)
    with pytest.raises(CheckFailed, match=r"^anything else$"):
        expect_known_crash(crash, "other", known=known)
    with pytest.raises(RuntimeError, match="other"):  # not a known crash: it goes on up
        expect_known_crash(crash, "other", known=known[:1])
    with pytest.raises(ValueError):  # not of the type asked for
        expect_known_crash(int, "x", known=known)
