"""Validation at the boundaries only (issue 50): a call counter around every argument check.

Every function of `transformer_course.arguments` (also where one calls another, as `check_heads` calls
`whole_number`) and every check helper of the model's modules (`check_*`, `_check_*`) is wrapped, where
the package calls it, by one that counts. A forward pass of a 4-layer GPT checks its input at the
model's boundary only, not again in every block, attention and head split; a generation checks its
settings once (`stream`), so 20 new tokens cost the same checks as one.
"""

from __future__ import annotations

import collections
import functools
import types

import pytest
import torch

from transformer_course import arguments, attention, block, config, generation, model, modern, multihead, positional
from transformer_course.config import GPTConfig
from transformer_course.generation import generate
from transformer_course.model import GPT

MODULES = (arguments, attention, multihead, block, positional, config, model, generation, modern)
NAMES = {module.__name__ for module in MODULES}


def _is_check(name: str, value, module) -> bool:
    if not isinstance(value, types.FunctionType):
        return False
    if value.__module__ == arguments.__name__:
        return True
    return value.__module__ in NAMES and name.lstrip("_").startswith("check")  # where it is used, too


@pytest.fixture
def calls(monkeypatch) -> collections.Counter:
    """A Counter of validator calls by name, counting from the moment it is reset."""
    counter: collections.Counter = collections.Counter()
    wrapped: dict = {}

    def counting(fn):
        if fn not in wrapped:
            @functools.wraps(fn)
            def wrapper(*args, **kwargs):
                counter[fn.__qualname__] += 1
                return fn(*args, **kwargs)
            wrapped[fn] = wrapper
        return wrapped[fn]

    for module in MODULES:
        for name, value in list(vars(module).items()):
            if _is_check(name, value, module):
                monkeypatch.setattr(module, name, counting(value))
    monkeypatch.setattr(positional.InputEmbedding, "_check_ids", counting(positional.InputEmbedding._check_ids))
    return counter


def _gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, d_model=32)).eval()


def test_the_counter_sees_the_checks(calls):
    with pytest.raises(ValueError, match="n_head"):
        arguments.check_heads(10, 4)
    assert calls["check_heads"] == 1 and calls["whole_number"] == 2  # nested calls count too


def test_a_forward_pass_checks_at_the_model_boundary_only(calls):
    gpt, idx = _gpt(), torch.randint(0, 65, (2, 16), generator=torch.Generator().manual_seed(0))
    calls.clear()
    with torch.no_grad():
        gpt(idx)
    assert sum(calls.values()) <= 6, calls
    assert not calls["check_input"] and not calls["check_heads"], calls  # no block re-checks its input


@pytest.mark.parametrize("knobs", [dict(temperature=0), dict(temperature=1.0), dict(temperature=0.8, eos_id=3)])
@pytest.mark.parametrize("use_cache", [True, False])
def test_a_generated_token_costs_no_checks_after_the_first(calls, knobs, use_cache):
    gpt, idx = _gpt(), torch.tensor([[1, 2, 3]])
    counts = []
    for n in (1, 20):
        calls.clear()
        generate(gpt, idx, n, use_cache=use_cache, **knobs)
        counts.append(dict(calls))
    assert counts[0] == counts[1], counts


def test_nan_logits_are_still_refused_in_a_generation():
    gpt = _gpt()
    with torch.no_grad():
        gpt.lm_head.weight[5] = float("nan")
    for temperature in (0, 1.0):
        with pytest.raises(ValueError, match=r"NaN or \+inf, or a row that is all -inf"):
            generate(gpt, torch.tensor([[1, 2]]), 5, temperature=temperature)


def test_nan_logits_at_a_later_step_are_refused_at_the_end():
    gpt, seen = _gpt(), []

    def poison(_module, _args, out):  # the third token's logits (and every later one's) are NaN
        seen.append(1)
        return out.masked_fill(torch.tensor(len(seen) >= 3), float("nan"))

    gpt.lm_head.register_forward_hook(poison)
    for temperature in (0, 1.0):
        seen.clear()
        with pytest.raises(ValueError, match=r"NaN or \+inf, or a row that is all -inf"):
            generate(gpt, torch.tensor([[1, 2]]), 5, temperature=temperature)
