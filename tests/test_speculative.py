"""Chapter 14's speculative decoding: the acceptance rule keeps the target's distribution (a seeded
chi-square and total-variation test that fails for the two usual mistakes), greedy text identical to
`generate`'s with both drafts and across the context's end, and bad input refused."""

import pytest
import torch

from transformer_course.checks.decoding import accept_if_p_above_q, resample_from_p
from transformer_course.course_model import load_chat_model, load_course_model
from transformer_course.generation import generate
from transformer_course.speculative import (
    ModelDraft,
    PromptLookupDraft,
    distribution_test,
    early_exit,
    prompt_lookup,
    speculative_generate,
    verify,
)


@pytest.fixture(scope="module")
def course():
    return load_course_model()


def test_the_packages_verify_keeps_the_target_distribution():
    for seed in (0, 1, 2):
        result = distribution_test(verify, draws=8000, seed=seed)
        assert result["passed"], result


@pytest.mark.parametrize("mistake", [accept_if_p_above_q, resample_from_p], ids=["accept-if-p>q", "resample-from-p"])
def test_the_usual_mistakes_fail_the_distribution_test(mistake):
    result = distribution_test(mistake, draws=8000, seed=0)
    assert not result["passed"] and result["p_value"] < 1e-6 and result["tv"] > 0.05, result


def test_verify_by_hand():
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.0, 1.0], [0.5, 0.5]])  # the target never says 0: the guess 0 is always replaced by 1
    assert verify(p, torch.tensor([[1.0, 0.0]]), torch.tensor([0]), g).tolist() == [1]
    p = torch.tensor([[0.2, 0.8], [0.3, 0.7], [1.0, 0.0]])  # p >= q at both guesses: kept, then p[2]'s token 0
    assert verify(p, torch.tensor([[0.1, 0.9], [0.3, 0.7]]), torch.tensor([0, 1]), g).tolist() == [0, 1, 0]
    with pytest.raises(ValueError, match=r"p \[k \+ 1, V\]"):
        verify(torch.ones(2, 3) / 3, torch.ones(2, 3) / 3, torch.tensor([0]), g)


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_text_equals_generate_with_both_drafts_past_the_context(course, k):
    model, tok = course.model, course.tokenizer
    idx = torch.tensor([tok.encode("JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n")])
    want = generate(model, idx, 60, temperature=0)  # 49 + 60 tokens: past block_size 64
    for draft in (ModelDraft(early_exit(model, 2)), ModelDraft(early_exit(model, 1)), PromptLookupDraft(2)):
        stats = {}
        got = speculative_generate(model, draft, idx, 60, k=k, temperature=0, stats=stats)
        assert torch.equal(got, want), type(draft).__name__
        assert 0 <= stats["kept"] <= stats["drafted"]


def test_a_perfect_draft_is_always_kept(course):
    """The target as its own draft: every greedy guess is right, so every round yields k + 1 tokens."""
    model, tok = course.model, course.tokenizer
    idx = torch.tensor([tok.encode("ROMEO:\n")])
    stats = {}
    got = speculative_generate(model, ModelDraft(model), idx, 20, k=4, temperature=0, stats=stats)
    assert torch.equal(got, generate(model, idx, 20, temperature=0))
    assert stats["kept"] == stats["drafted"] and stats["rounds"] == 4


def test_sampling_runs_and_stops_at_eos():
    chat = load_chat_model()
    model, tok = chat.model, chat.tokenizer
    from transformer_course.assistant import render_chat

    ids = torch.tensor([render_chat([{"role": "user", "content": "upper: night"}], tok, generation_prompt=True)[0]])
    out = speculative_generate(model, ModelDraft(early_exit(model, 2)), ids, 12, k=3, temperature=0.8, top_k=5,
                               eos_id=tok.end_id, generator=torch.Generator().manual_seed(0), allowed=tok)
    reply = out[0, ids.shape[1]:].tolist()
    assert tok.end_id not in reply[:-1] and len(reply) <= 12


def test_prompt_lookup_by_hand():
    assert prompt_lookup([1, 2, 3, 4, 5, 1, 2, 3], 2) == [4, 5]
    assert prompt_lookup([1, 2, 3, 4], 3) == [] and prompt_lookup([4], 3) == []


@pytest.mark.parametrize("kwargs, match", [
    ({"idx": torch.zeros(2, 3, dtype=torch.long)}, "one prompt"),
    ({"k": 0}, "k"),
    ({"draft": "model"}, "no reset/propose/kept"),
    ({"temperature": -1.0}, "temperature"),
])
def test_bad_input_is_refused(course, kwargs, match):
    args = {"target": course.model, "draft": PromptLookupDraft(), "idx": torch.zeros(1, 3, dtype=torch.long),
            "max_new_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        speculative_generate(**args)


def test_a_bare_model_or_another_vocabulary_is_refused(course):
    idx = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="not a bare model"):
        speculative_generate(course.model, course.model, idx, 4)
    other = load_chat_model().model  # 3 more ids than the text model
    with pytest.raises(ValueError, match="vocabulary"):
        speculative_generate(course.model, ModelDraft(other), idx, 4)
    with pytest.raises(ValueError, match="fewer than the target"):
        early_exit(course.model, 4)


def test_cli_generate_with_a_draft_writes_the_same_greedy_text(capsys):
    from transformer_course import cli

    base = ["generate", "--prompt", "ROMEO:\n", "--max-new-tokens", "30", "--temperature", "0", "--threads", "1"]
    assert cli.main(base) == 0
    plain = capsys.readouterr().out
    assert cli.main([*base, "--draft", "prompt-lookup"]) == 0
    assert capsys.readouterr().out == plain
    assert cli.main([*base, "--quantize", "int8"]) == 0
    assert capsys.readouterr().out.startswith("ROMEO:\n")


@pytest.mark.parametrize("extra, message", [
    (["--draft", "no/such/draft.pt"], "no such file"),
    (["--draft", "prompt-lookup", "--device", "meta"], "run on the CPU"),
])
def test_cli_refuses_bad_combinations_in_one_line(capsys, extra, message):
    from transformer_course import cli

    assert cli.main(["generate", "--prompt", "a", "--max-new-tokens", "3", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_cli_quantize_accepts_int8_only(capsys):
    from transformer_course import cli

    with pytest.raises(SystemExit) as done:
        cli.main(["generate", "--prompt", "a", "--quantize", "int4"])
    assert done.value.code == 2 and "invalid choice: 'int4'" in capsys.readouterr().err
