"""Chapter 11's checks accept right answers and name the mistake in planted bugs
(tests/test_checks_all.py runs every check on a stub and on its reference)."""

import pytest
import torch
from check_helpers import assert_rejected, run

from transformer_course.assistant import grow_rows, sft_targets
from transformer_course.checks.assistant import (
    _chatml,
    check_chatml,
    check_grow_rows,
    check_lora_forward,
    check_merged_weight,
    check_predict_lora_parameters,
    check_sft_targets,
)
from transformer_course.lora import LoRALinear, merged_weight


@pytest.mark.parametrize("check_fn, reference", [
    (check_grow_rows, grow_rows), (check_sft_targets, sft_targets), (check_predict_lora_parameters, lambda: 4096),
    (check_lora_forward, LoRALinear), (check_merged_weight, merged_weight), (check_chatml, _chatml),
])
def test_reference_passes(check_fn, reference):
    outcome = run(check_fn, reference)
    assert outcome.passed, outcome.message


def _noise(n, c, g):
    return torch.randn(n, c, generator=g) * 0.02


def _grow_in_place(w, n, g):
    w[0] += 1.0
    return torch.cat([w, w.mean(0, keepdim=True) + _noise(n, w.shape[1], g)])


@pytest.mark.parametrize("fn, hint", [
    (lambda w, n, g: torch.cat([w, torch.zeros(n, w.shape[1])]), "the new rows are zeros"),
    (lambda w, n, g: torch.cat([w, _noise(n, w.shape[1], g)]), "not centred on the mean"),
    (lambda w, n, g: torch.cat([w, w.mean(0, keepdim=True).repeat(n, 1)]), "all the same"),
    (lambda w, n, g: torch.cat([w, w.mean(0, keepdim=True) + torch.randn(n, w.shape[1], generator=g)]),
     "far from the mean"),
    (lambda w, n, g: torch.cat([w, w.mean(0, keepdim=True) + torch.randn(n, w.shape[1]) * 0.02]),
     "generator=generator"),
    (_grow_in_place, "changed in place"),
    (lambda w, n, g: torch.cat([w * 1.0001, w.mean(0, keepdim=True) + _noise(n, w.shape[1], g)]),
     "first V rows"),
])
def test_grow_rows_mistakes_are_named(fn, hint):
    assert_rejected(check_grow_rows, fn, hint)


@pytest.mark.parametrize("fn, hint", [
    (lambda ids, a: [i if f else -1 for i, f in zip(ids, a, strict=True)], "the *next* id"),
    (lambda ids, a: [n if f else -1 for n, f in zip(ids[1:], a[:-1], strict=True)] + [-1], "the mask must follow"),
    (lambda ids, a: ids[1:] + [-1], "every next token is kept"),
    (lambda ids, a: [n if f else -1 for n, f in zip(ids[1:], a[1:], strict=True)], "one target per position"),
])
def test_sft_target_mistakes_are_named(fn, hint):
    assert_rejected(check_sft_targets, fn, hint)


@pytest.mark.parametrize("guess, hint", [(384 * 128, "the full matrix"), (8 * 128, "count both"),
                                         (4000, "is not it"), ("4096", "whole number")])
def test_predicting_the_adapter_size_names_the_mistake(guess, hint):
    assert_rejected(check_predict_lora_parameters, lambda: guess, hint)


def _lora_variant(body):
    class Variant(LoRALinear):
        def forward(self, x):
            return body(self, x)
    return Variant


@pytest.mark.parametrize("body, hint", [
    (lambda self, x: self.base(x) + x @ self.A.T @ self.B.T, "scaled by self.scale"),
    (lambda self, x: x @ self.A.T @ self.B.T * self.scale, "self.base(x) is missing"),
    (lambda self, x: x @ self.base.weight.T + x @ self.A.T @ self.B.T * self.scale, "bias is missing"),
    (lambda self, x: self.base(x) + (x @ self.A.T @ self.B.T * self.scale).detach(), "no gradient"),
])
def test_lora_forward_mistakes_are_named(body, hint):
    assert_rejected(check_lora_forward, _lora_variant(body), hint)


@pytest.mark.parametrize("fn, hint", [
    (lambda lora: (lora.base.weight + lora.B @ lora.A).detach(), "scale alpha / r"),
    (lambda lora: (lora.base.weight - lora.scale * lora.B @ lora.A).detach(), "not subtracted"),
    (lambda lora: lora.base.weight + lora.scale * lora.B @ lora.A, "detached"),
    (lambda lora: (lora.A.T @ lora.B.T).detach(), "the merged weight [out, in]"),
])
def test_merge_mistakes_are_named(fn, hint):
    assert_rejected(check_merged_weight, fn, hint)


def test_the_buggy_merge_of_the_chapter_is_rejected():
    assert_rejected(check_merged_weight, lambda lora: lora.base.weight + lora.B @ lora.A, "detached")


@pytest.mark.parametrize("fn, hint", [
    (lambda m, generation_prompt=False: _chatml(m, generation_prompt).replace("<|im_end|>\n", "<|im_end|>"),
     "ends with <|im_end|> and a newline"),
    (lambda m, generation_prompt=False: _chatml(m, False), "'<|im_start|>assistant\\n'"),
    (lambda m, generation_prompt=False: _chatml(m, True), "only when generation_prompt=True"),
    (lambda m, generation_prompt=False: "".join(x["content"] for x in m), "expected"),
])
def test_chatml_mistakes_are_named(fn, hint):
    assert_rejected(check_chatml, fn, hint)
