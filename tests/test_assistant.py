"""Chapter 11: the chat format, the SFT mask, the instruction set, fine-tuning, LoRA, the shipped chat
model and `transformer-course chat`."""

import io
import random
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from torch import nn

from transformer_course.assistant import (
    IGNORE,
    KINDS,
    ChatTokenizer,
    add_chat_tokens,
    answers,
    exact_match,
    finetune,
    fit_history,
    make_tasks,
    render_chat,
    reply_stream,
    save_chat_model,
    sft_batch,
    sft_targets,
)
from transformer_course.config import PRESETS
from transformer_course.course_model import load_chat_model, load_course_model, load_lora_adapter
from transformer_course.data import load_shakespeare
from transformer_course.lora import (
    LoRALinear,
    adapter_state,
    add_lora,
    load_adapter,
    merge_lora,
    merged_weight,
    trainable_parameters,
)
from transformer_course.model import GPT
from transformer_course.tokenization import CharTokenizer

CHARS = CharTokenizer.from_text("abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ:0123456789,'\n")


@pytest.fixture(scope="module")
def tasks():
    return make_tasks(load_shakespeare())


def _tiny(vocab: int, tie: bool = True, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(replace(PRESETS["tiny"], vocab_size=vocab, n_layer=2, d_model=32, n_head=2, tie_weights=tie)).eval()


def test_the_chat_tokenizer_puts_the_turn_tokens_after_the_vocabulary_and_round_trips():
    tok = ChatTokenizer(CHARS)
    v = CHARS.vocab_size
    assert (tok.user_id, tok.assistant_id, tok.end_id, tok.vocab_size) == (v, v + 1, v + 2, v + 3)
    text = "<|user|>upper: kind<|end|><|assistant|>KIND<|end|>"
    ids = tok.encode(text)
    assert ids[0] == v and ids[-1] == v + 2 and ids.count(v + 2) == 2 and len(ids) == 2 + 11 + 2 + 4
    assert tok.decode(ids) == text
    assert ChatTokenizer.from_dict(tok.to_dict()).encode(text) == ids
    with pytest.raises(ValueError, match="not a ChatTokenizer"):
        ChatTokenizer.from_dict({"type": "char", "chars": "ab"})


@pytest.mark.parametrize("tie", [True, False])
def test_new_tokens_leave_every_old_logit_and_weight_as_it_was(tie):
    model = _tiny(CHARS.vocab_size, tie)
    grown = add_chat_tokens(model).eval()
    assert grown.cfg.vocab_size == model.cfg.vocab_size + 3
    idx = torch.randint(0, CHARS.vocab_size, (3, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (grown(idx)[0][..., : CHARS.vocab_size] - model(idx)[0]).abs().max() < 1e-6
    old, new = model.state_dict(), grown.state_dict()
    for key, value in old.items():
        if key in ("embed.token.weight", "lm_head.weight"):
            assert torch.equal(new[key][: CHARS.vocab_size], value)
            rows = new[key][CHARS.vocab_size:]
            assert (rows - value.mean(0)).abs().max() < 0.2 and not torch.equal(rows[0], rows[1])
        else:
            assert torch.equal(new[key], value), key
    assert (grown.lm_head.weight is grown.embed.token.weight) == tie


def test_the_template_marks_the_answers_and_the_mask_keeps_only_them():
    tok = ChatTokenizer(CHARS)
    ids, is_answer = render_chat([{"role": "user", "content": "ab"}, {"role": "assistant", "content": "c"}], tok)
    a, b, c = CHARS.encode("abc")
    u, s, e = tok.user_id, tok.assistant_id, tok.end_id
    assert ids == [u, a, b, e, s, c, e]
    assert is_answer == [False, False, False, False, False, True, True]
    assert sft_targets(ids, is_answer) == [IGNORE, IGNORE, IGNORE, IGNORE, c, e, IGNORE]  # worked by hand
    prompt, _ = render_chat([{"role": "user", "content": "ab"}], tok, generation_prompt=True)
    assert prompt == [u, a, b, e, s]
    for bad, match in (([{"role": "user", "content": "a<|end|>"}], "turn markers"),
                       ([{"role": "system", "content": "a"}], "role"), ([], "non-empty")):
        with pytest.raises(ValueError, match=match):
            render_chat(bad, tok)


def test_the_instruction_set_is_deterministic_right_and_its_held_out_split_shares_no_prompt(tasks):
    again = make_tasks(load_shakespeare())
    assert again.train == tasks.train and again.held == tasks.held
    assert set(tasks.held) == set(tasks.train) == set(KINDS)
    held = {e.prompt for k in KINDS for e in tasks.held[k]}
    trained = {e.prompt for k in KINDS for e in tasks.train[k]}
    assert not held & trained
    held_words = {e.prompt.split(": ")[1] for k in KINDS[:3] for e in tasks.held[k]}
    train_words = {e.prompt.split(": ")[1] for k in KINDS[:3] for e in tasks.train[k]}
    assert not held_words & train_words
    for kind in KINDS:
        assert len(tasks.held[kind]) == 100 and len(tasks.train[kind]) > 400
    for e in tasks.train["upper"][:50] + tasks.held["reverse"][:50] + tasks.held["count"][:50]:
        word = e.prompt.split(": ")[1]
        assert e.answer == {"upper": word.upper(), "reverse": word[::-1], "count": str(len(word))}[e.kind]
    tok = ChatTokenizer(load_course_model().tokenizer)
    assert max(len(render_chat(e.messages(), tok)[0]) for k in KINDS for e in tasks.train[k] + tasks.held[k]) <= 64


def test_a_batch_trains_answers_only_and_pads_with_ignored_end_tokens(tasks):
    tok = ChatTokenizer(load_course_model().tokenizer)
    x, y = sft_batch(tasks, tok, 8, 64, random.Random(0))
    assert x.shape == y.shape == (8, 64)
    for row_x, row_y in zip(x.tolist(), y.tolist(), strict=True):
        start = row_x.index(tok.assistant_id)  # the answer follows the assistant token
        end = row_x.index(tok.end_id, start)
        assert all(t == IGNORE for t in row_y[:start]) and all(t == IGNORE for t in row_y[end:])
        assert row_y[start:end] == row_x[start + 1: end + 1]
    x2, y2 = sft_batch(tasks, tok, 8, 64, random.Random(0), masked=False)
    assert torch.equal(x, x2) and int((y2 != IGNORE).sum()) > 2 * int((y != IGNORE).sum())


def test_finetuning_lowers_the_loss_and_lora_moves_only_the_adapters_and_the_new_rows(tasks):
    base = load_course_model()
    tok = ChatTokenizer(base.tokenizer)
    full = add_chat_tokens(base.model)
    losses = finetune(full, tasks, tok, steps=15, seed=3)  # the last 5 losses sum to 16.3, the first 5 to 25.8
    assert len(losses) == 15 and sum(losses[-5:]) < sum(losses[:5])
    adapted = add_lora(add_chat_tokens(base.model), rank=4, train_rows_from=base.tokenizer.vocab_size)
    before = {k: v.clone() for k, v in adapted.state_dict().items()}
    finetune(adapted, tasks, tok, steps=5, lr=5e-3, seed=3)
    after = adapted.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(k.endswith((".A", ".B")) or k in ("embed.token.weight", "lm_head.weight") for k in moved)
    rows = after["embed.token.weight"]
    assert torch.equal(rows[: base.tokenizer.vocab_size], before["embed.token.weight"][: base.tokenizer.vocab_size])
    with pytest.raises(ValueError, match="nothing to fine-tune"):
        finetune(base.model.requires_grad_(False), tasks, tok, steps=1)


def test_lora_starts_at_the_base_and_merges_into_one_matrix_within_1e_6():
    torch.manual_seed(0)
    base = nn.Linear(16, 24)
    layer = LoRALinear(base, rank=4, generator=torch.Generator().manual_seed(1))
    x = torch.randn(3, 7, 16)
    assert torch.equal(layer(x), base(x))
    assert layer.scale == 2.0 and sum(p.numel() for p in layer.parameters() if p.requires_grad) == 4 * (16 + 24)
    with torch.no_grad():
        layer.B.normal_()
    merged = x @ merged_weight(layer).T + base.bias
    assert torch.allclose(merged, layer(x), atol=1e-6, rtol=1e-6)  # float32: to its rounding
    wide = layer.double()  # in float64 the merge is exact to far below 1e-6
    assert (x.double() @ merged_weight(wide).T + wide.base.bias - wide(x.double())).abs().max() < 1e-6
    with pytest.raises(TypeError, match="nn.Linear"):
        LoRALinear(nn.Conv1d(2, 2, 1))
    with pytest.raises(ValueError, match="rank"):
        LoRALinear(base, rank=17)


def test_a_merged_model_computes_what_the_adapted_one_did_and_adapters_load_back():
    model = add_chat_tokens(_tiny(CHARS.vocab_size))
    adapted = add_lora(model, rank=4, train_rows_from=CHARS.vocab_size, seed=2)
    with torch.no_grad():
        for name, p in adapted.named_parameters():
            if name.endswith(".B"):
                p.normal_(std=0.1)
    state = adapter_state(adapted)
    assert trainable_parameters(adapted) == sum(v.numel() for v in state.values()) == 2 * (
        4 * (32 + 96) + 4 * (32 + 128)) + 3 * 32
    idx = torch.randint(0, CHARS.vocab_size + 3, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = adapted(idx)[0]
    fresh = add_lora(add_chat_tokens(_tiny(CHARS.vocab_size)), rank=4, train_rows_from=CHARS.vocab_size)
    with torch.no_grad():
        assert (load_adapter(fresh, state)(idx)[0] - want).abs().max() < 1e-6
        merged = merge_lora(adapted)
        assert not any(isinstance(m, LoRALinear) for m in merged.modules())
        assert (merged(idx)[0] - want).abs().max() < 1e-5
    with pytest.raises(ValueError, match="does not fit"):
        load_adapter(add_lora(add_chat_tokens(_tiny(CHARS.vocab_size)), rank=2, train_rows_from=CHARS.vocab_size),
                     state)


def test_the_shipped_chat_model_answers_held_out_questions_as_its_manifest_says(tasks):
    chat = load_chat_model()
    scores = exact_match(chat.model, chat.tokenizer, tasks.held)
    assert scores == chat.manifest["held_out_exact_match"]
    assert sum(score >= 0.6 for score in scores.values()) >= 2
    base = load_course_model()
    before = exact_match(add_chat_tokens(base.model).eval(), chat.tokenizer, tasks.held)
    assert all(score < 0.05 for score in before.values())
    word = tasks.held["reverse"][3]
    assert answers(chat.model, chat.tokenizer, [word.prompt]) == [word.answer]


def test_the_shipped_adapter_is_small_and_near_the_full_fine_tune(tasks):
    base, chat, shipped = load_course_model(), load_chat_model(), load_lora_adapter()
    adapted = load_adapter(add_lora(add_chat_tokens(base.model), rank=shipped.rank,
                                    train_rows_from=base.tokenizer.vocab_size), shipped.state)
    assert shipped.rank == 8 and trainable_parameters(adapted) <= 0.05 * chat.model.num_parameters()

    def size(obj) -> int:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        return buffer.getbuffer().nbytes

    assert size(chat.model.state_dict()) >= 10 * size(shipped.state)
    scores = shipped.manifest["held_out_exact_match"]
    full = chat.manifest["held_out_exact_match"]
    assert all(scores[k] >= full[k] - 0.05 for k in ("upper", "reverse", "count"))
    assert exact_match(adapted.eval(), chat.tokenizer, {"reverse": tasks.held["reverse"]}) == {
        "reverse": scores["reverse"]}


def test_a_chat_reply_streams_until_the_end_token_and_the_history_is_cut_to_the_context():
    chat = load_chat_model()
    tok = chat.tokenizer
    pieces = list(reply_stream(chat.model, tok, [{"role": "user", "content": "upper: gentle"}]))
    assert "".join(pieces) == "GENTLE" and all(len(p) == 1 for p in pieces)
    talk = [{"role": "user", "content": "upper: gentle"}, {"role": "assistant", "content": "GENTLE"},
            {"role": "user", "content": "reverse: gentle"}, {"role": "assistant", "content": "eltneg"},
            {"role": "user", "content": "count: gentle"}]
    # rendered: 15 + 8 + 17 + 8 + 15 tokens and the generation prompt, 64 in all; from message 2 on, 41
    assert fit_history(talk, tok, 72, 8) == talk and fit_history(talk, tok, 71, 8) == talk[2:]
    assert fit_history(talk, tok, 64, 24) == talk[4:] and fit_history(talk, tok, 30, 8) == talk[4:]
    with pytest.raises(ValueError, match="too long"):
        fit_history([{"role": "user", "content": "x" * 70}], tok, 64, 8)
    sampled = list(reply_stream(chat.model, tok, [{"role": "user", "content": "who says: ay"}], max_new_tokens=20,
                                temperature=2.0, generator=torch.Generator().manual_seed(0)))
    assert all("<|" not in piece for piece in sampled)  # never a turn marker, even when sampling hot


def test_a_saved_chat_model_loads_back_and_other_files_are_refused_clearly(tmp_path):
    chat = load_chat_model()
    path = save_chat_model(tmp_path / "mine.pt", chat.model, chat.tokenizer, chat.losses[:3])
    again = load_chat_model(path)
    assert again.manifest is None and again.losses == chat.losses[:3]
    assert all(torch.equal(a, b) for a, b in zip(again.model.state_dict().values(),
                                                 chat.model.state_dict().values(), strict=True))
    from transformer_course.checkpoint import save_checkpoint

    base = load_course_model()
    plain = save_checkpoint(tmp_path / "plain.pt", base.model, tokenizer=base.tokenizer)
    with pytest.raises(ValueError, match="not a chat model"):
        load_chat_model(plain)
    (tmp_path / "cut.pt").write_bytes(path.read_bytes()[:1000])
    with pytest.raises(ValueError, match="is truncated or corrupted and cannot be read"):
        load_chat_model(tmp_path / "cut.pt")
    with pytest.raises(FileNotFoundError, match="no chat model"):
        load_chat_model(tmp_path / "missing.pt")
    with pytest.raises(ValueError, match="grow the model"):
        save_chat_model(tmp_path / "x.pt", base.model, chat.tokenizer)


def test_the_chat_command_answers_a_held_out_question_and_survives_a_bad_one(tasks):
    word = tasks.held["reverse"][5]
    lines = "upper: caf\u00e9\n" + "x" * 90 + "\n" + word.prompt + "\n"
    done = subprocess.run([sys.executable, "-m", "transformer_course", "chat"], input=lines, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert "not sent" in out[0] and "not in the vocabulary" in out[0]
    assert "not sent" in out[1] and "too long" in out[1]
    assert out[2] == f"assistant: {word.answer}"


def test_the_chat_command_answers_the_second_and_third_messages_of_a_conversation(tasks):
    """Issue 51: the shipped model, trained on conversations of 1-3 exchanges, answers held-out questions
    asked second and third in one `chat` session as it answers them first (the model shipped before was
    right on the first message and wrong on the second)."""
    upper, count = tasks.held["upper"][3], tasks.held["count"][7]
    lines = "".join(f"{e.prompt}\n" for e in (count, upper, count))
    done = subprocess.run([sys.executable, "-m", "transformer_course", "chat"], input=lines, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"assistant: {e.answer}" for e in (count, upper, count)], done.stdout


@pytest.mark.parametrize("started_in_the_background", [False, True])
def test_reset_starts_a_new_conversation_and_ctrl_c_ends_chat_with_one_line(started_in_the_background):
    """/reset forgets the history; Ctrl-C, sent while chat waits for a line (its start line on stderr is
    read first, so the signal never races the code), ends it with one line and status 130, also when chat
    was started with SIGINT ignored, as a shell script's `cmd &` starts it."""
    import signal

    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if started_in_the_background else None
    process = subprocess.Popen([sys.executable, "-m", "transformer_course", "chat"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ignore)
    try:
        assert "/reset" in process.stderr.readline()
        process.stdin.write("/reset\n")
        process.stdin.flush()
        assert process.stdout.readline() == "(a new conversation)\n"  # read: chat is back at input()
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, err
    assert err.strip() == "chat: stopped (Ctrl-C)" and "Traceback" not in err


def test_chat_refuses_a_max_new_tokens_that_leaves_no_room_for_a_message(capsys):
    from transformer_course import cli

    assert cli.main(["chat", "--max-new-tokens", "64"]) == 2
    err = capsys.readouterr().err
    assert "--max-new-tokens 64 leaves no room for a message" in err and "give at most 61" in err


def test_a_long_history_is_fitted_from_the_newest_message_in_one_pass():
    """fit_history walks back from the newest message: 20,000 messages cost about one context of work."""
    chat = load_chat_model()
    calls = []
    real = chat.tokenizer.encode
    chat.tokenizer.encode = lambda text: calls.append(text) or real(text)
    talk = [{"role": ("user", "assistant")[i % 2], "content": f"line {i}"} for i in range(20_000)]
    kept = fit_history(talk, chat.tokenizer, chat.model.cfg.block_size, 8)
    assert kept == talk[-len(kept):] and kept[0]["role"] == "user" and len(calls) <= chat.model.cfg.block_size
    with pytest.raises(ValueError, match=r"the last message is too long: .* or ask for fewer new tokens \(at most"):
        fit_history([{"role": "user", "content": "x" * 30}], chat.tokenizer, chat.model.cfg.block_size, 40)
