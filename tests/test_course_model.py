"""The trained model the course ships: its recipe is chapter 06's, its file is what its manifest says,
and a damaged file is refused, never used."""

import json
from dataclasses import replace

import pytest
import torch

from transformer_course import course_model
from transformer_course.config import TRAIN_PRESETS, TrainConfig
from transformer_course.course_model import (
    build_course_model,
    build_dates_model,
    greedy_sample,
    load_course_model,
    load_dates_model,
    manifest,
)
from transformer_course.model import PRESETS
from transformer_course.tokenization import CharTokenizer


@pytest.fixture(scope="module")
def shipped():
    return load_course_model()


@pytest.mark.parametrize("name", ["shakespeare_char", "dates_iso", "shakespeare_chat", "shakespeare_chat_lora"])
def test_the_shipped_models_are_small_and_match_their_manifests(name):
    info = manifest(name)
    path = course_model.ASSETS / f"{name}.pt"
    assert path.stat().st_size == info["bytes"] < 5_000_000
    assert course_model.file_sha256(path) == info["sha256"]
    assert info["built"]["command"] == course_model.REBUILD


def test_the_shipped_model_follows_chapter_06s_recipe(shipped):
    assert shipped.config == replace(PRESETS["tiny"], vocab_size=shipped.tokenizer.vocab_size)
    recipe = replace(TRAIN_PRESETS["tiny"], seed=course_model.SEED, device="cpu", bf16=False)
    assert shipped.train_config == replace(recipe, progress=shipped.train_config.progress)
    assert shipped.train_config.bf16 is False  # float32: no bf16 autocast on the machine that built it
    assert shipped.step == recipe.max_iters == len(shipped.history.step)
    assert shipped.optimizer_state is None  # weights only: a few MB
    assert isinstance(shipped.tokenizer, CharTokenizer)
    assert shipped.history.val_loss[-1] == pytest.approx(manifest()["final_val_loss"], abs=1e-4)
    assert shipped.history.val_loss[0] > 4.0 and shipped.history.val_loss[-1] < 1.95  # it learned


def test_the_shipped_model_writes_what_its_manifest_recorded(shipped):
    sample = manifest()["greedy_sample"]
    assert greedy_sample(shipped, sample["prompt"], sample["max_new_tokens"]) == sample["text"]
    assert not shipped.model.training


def test_its_tokenizer_is_the_one_chapter_06_builds(shipped):
    from transformer_course.data import load_shakespeare

    assert shipped.tokenizer.chars == CharTokenizer.from_text(load_shakespeare()).chars


@pytest.fixture
def scratch_assets(tmp_path, monkeypatch):
    for name in ("shakespeare_char", "dates_iso", "shakespeare_chat", "shakespeare_chat_lora"):
        for suffix in (".pt", ".json"):
            (tmp_path / (name + suffix)).write_bytes((course_model.ASSETS / (name + suffix)).read_bytes())
    monkeypatch.setattr(course_model, "ASSETS", tmp_path)
    return tmp_path


@pytest.mark.parametrize("name, load", [("shakespeare_char", load_course_model), ("dates_iso", load_dates_model),
                                        ("shakespeare_chat", course_model.load_chat_model),
                                        ("shakespeare_chat_lora", course_model.load_lora_adapter)])
def test_a_damaged_file_is_refused(scratch_assets, name, load):
    path = scratch_assets / f"{name}.pt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte inside the tensor data
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="does not match its manifest.*rebuild it with"):
        load()


def test_a_missing_file_or_manifest_says_how_to_get_it_back(scratch_assets):
    (scratch_assets / "shakespeare_char.pt").unlink()
    with pytest.raises(FileNotFoundError, match="reinstall the package or rebuild"):
        load_course_model()
    (scratch_assets / "shakespeare_char.json").unlink()
    with pytest.raises(FileNotFoundError, match="manifest .* is missing"):
        load_course_model()


def test_a_dates_file_of_another_format_is_refused(scratch_assets):
    from transformer_course.runtime import atomic_save

    path = atomic_save({"format": 99, "model": {}}, scratch_assets / "dates_iso.pt")
    info = manifest("dates_iso")
    info["sha256"] = course_model.file_sha256(path)
    (scratch_assets / "dates_iso.json").write_text(json.dumps(info))
    with pytest.raises(ValueError, match="has dates model format 99; this version reads format 1"):
        load_dates_model()


@pytest.mark.system
def test_the_builder_writes_a_loadable_model_and_manifest(tmp_path, monkeypatch):
    path = build_course_model(tmp_path, max_iters=3, progress=False)
    monkeypatch.setattr(course_model, "ASSETS", tmp_path)
    info = manifest()
    assert path == tmp_path / "shakespeare_char.pt"
    assert info["steps"] == 3 and info["train_config"]["max_iters"] == 3
    assert TrainConfig.from_dict(info["train_config"]).bf16 is False
    loaded = load_course_model()
    assert loaded.step == 3 and loaded.history.eval_step == [0, 3]
    assert info["greedy_sample"]["text"] == greedy_sample(loaded)
    x = torch.zeros(1, 4, dtype=torch.long)
    assert torch.isfinite(loaded.model(x)[0]).all()


@pytest.mark.system
def test_the_dates_builder_writes_a_loadable_model(tmp_path, monkeypatch):
    build_dates_model(tmp_path, steps=2, progress=False)
    monkeypatch.setattr(course_model, "ASSETS", tmp_path)
    info = manifest("dates_iso")
    assert info["recipe"]["steps"] == 2 and 0 <= info["held_out_exact_match"] <= 1
    loaded = load_dates_model()
    assert len(loaded.losses) == 2 and not loaded.model.training


def test_the_shipped_dates_model_converts_dates():
    from transformer_course.dates import (
        BOS,
        EOS,
        SOURCE_CHARS,
        TARGET_CHARS,
        decode_ids,
        encode_batch,
    )

    shipped = load_dates_model()
    assert manifest("dates_iso")["held_out_exact_match"] >= 0.99 and len(shipped.losses) == course_model.DATES_STEPS
    src = encode_batch(["the twenty-second of November 2026", "Mar 1st, 1999"], SOURCE_CHARS)
    out = shipped.model.greedy_decode(src, BOS, EOS)
    assert [decode_ids(row.tolist(), TARGET_CHARS) for row in out] == ["2026-11-22", "1999-03-01"]


def test_the_chat_models_follow_chapter_11s_recipe():
    chat, lora = manifest("shakespeare_chat"), manifest("shakespeare_chat_lora")
    assert chat["recipe"]["steps"] == course_model.CHAT_STEPS and chat["recipe"]["lr"] == course_model.CHAT_LR
    assert lora["recipe"]["steps"] == course_model.LORA_STEPS and lora["rank"] == course_model.LORA_RANK
    assert len(course_model.load_chat_model().losses) == course_model.CHAT_STEPS
    for info in (chat, lora):  # what fine-tuning did to Shakespeare (forgetting) is recorded
        assert info["bits_per_char"]["fine_tuned"] > info["bits_per_char"]["base"]


def test_the_shipped_chat_models_answer_a_second_and_third_question():
    """Issue 51: the SFT model, trained on conversations of 1-3 exchanges, answers each held-out word task
    asked second or third within 6 points of its first-question score (the goal was 5: turn 3 missed it by
    one point on reversing and counting); DPO and GRPO, trained from it on single questions, keep most of
    it (at least 70% where the 0.3.0 models scored 0-12%). The SFT model's recorded table is what it
    scores here."""
    from transformer_course.assistant import exact_match_by_turn, make_tasks
    from transformer_course.data import load_shakespeare

    chat = manifest("shakespeare_chat")
    assert chat["recipe"]["turns"] == course_model.CHAT_TURNS == 3
    sft = chat["held_out_exact_match_by_turn"]
    for kind in ("upper", "reverse", "count"):
        assert all(sft[t][kind] >= sft["1"][kind] - 0.06 for t in ("2", "3")), (kind, sft)
        for name in ("shakespeare_dpo", "shakespeare_grpo"):
            table = manifest(name)["exact_match_by_turn_after"]
            assert table["1"][kind] >= 0.95 and min(table["2"][kind], table["3"][kind]) >= 0.7, (name, table)
    loaded = course_model.load_chat_model()
    held = make_tasks(load_shakespeare()).held
    scores = exact_match_by_turn(loaded.model, loaded.tokenizer, held, kinds=["count", "reverse"])
    assert {str(t): s for t, s in scores.items()} == {t: {k: sft[t][k] for k in ("count", "reverse")}
                                                     for t in ("1", "2", "3")}
