"""Issue 55: every loader of the package's own files (chapter 06's checkpoints, chapter 11's chat models,
chapter 12's preference models, chapter 11's LoRA adapters, chapter 09's dates model) goes through the
same checks, `checkpoint.read_state`, and refuses what it cannot use with a `CheckpointError` naming the
file and the fix; `lora.load_adapter` refuses what is not an adapter; and chapter 06's `train` never
writes weights that are NaN over the last good checkpoint."""

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from transformer_course import checkpoint, course_model, training
from transformer_course.assistant import ChatTokenizer, add_chat_tokens, answers, save_chat_model
from transformer_course.checkpoint import CheckpointError, load_checkpoint, save_checkpoint, state_sha256
from transformer_course.config import PRESETS, GPTConfig, TrainConfig
from transformer_course.course_model import load_chat_model
from transformer_course.lora import adapter_state, add_lora, load_adapter
from transformer_course.model import GPT
from transformer_course.tokenization import CharTokenizer

CHARS = CharTokenizer.from_text("abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ:0123456789,'\n")


def _chat() -> tuple[GPT, ChatTokenizer]:
    torch.manual_seed(0)
    base = GPT(replace(PRESETS["tiny"], vocab_size=CHARS.vocab_size, n_layer=1, d_model=32, n_head=2))
    return add_chat_tokens(base).eval(), ChatTokenizer(CHARS)


@pytest.fixture
def chat_file(tmp_path) -> Path:
    model, tok = _chat()
    return save_chat_model(tmp_path / "mine.pt", model, tok, [2.5, 1.0])


def _edited(path: Path, edit, sha: str = "recompute") -> Path:
    """The file edited by hand, its SHA-256 recomputed (as a hostile file would carry it), kept as it was
    (as damage on disk leaves it), or dropped (as files saved before checksums have none)."""
    state = torch.load(path, weights_only=True)
    stored = state.pop("sha256")
    edit(state)
    if sha != "drop":
        state["sha256"] = state_sha256(state) if sha == "recompute" else stored
    out = path.with_name("edited.pt")
    torch.save(state, out)
    return out


class _System:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


# ---------------------------------------------------------------- chat and preference models
def test_a_saved_chat_model_carries_a_checksum_and_loads_back(chat_file):
    state = torch.load(chat_file, weights_only=True)
    stored = state.pop("sha256")
    assert stored == state_sha256(state)
    loaded = load_chat_model(chat_file)
    assert loaded.losses == [2.5, 1.0] and loaded.manifest is None
    older = _edited(chat_file, lambda s: None, sha="drop")  # a file saved before checksums: still read
    assert load_chat_model(older).tokenizer.vocab_size == CHARS.vocab_size + 3


def test_a_chat_model_whose_vocabulary_was_reversed_is_refused_not_answered(chat_file):
    def reverse(state):
        state["tokenizer"]["base"]["chars"] = state["tokenizer"]["base"]["chars"][::-1]

    damaged = _edited(chat_file, reverse, sha="keep")
    with pytest.raises(CheckpointError, match=f"chat model {damaged} is corrupted: its contents do not match the "
                                              "SHA-256 saved with them .*save the model again with save_chat_model"):
        load_chat_model(damaged)
    good = load_chat_model(chat_file)
    assert answers(good.model, good.tokenizer, ["upper: ab"], max_new_tokens=2)  # the good file still answers


CHAT_EDITS = [  # (edit, what the error says), each file re-hashed: only the loader's own checks can refuse it
    (lambda s: s["model"]["ln_f.weight"].fill_(float("nan")),
     r"its entry model\['ln_f.weight'\] holds NaN or infinite numbers, which save_chat_model never writes"),
    (lambda s: s["model"].update({"ln_f.weight": torch.zeros(()).expand(32)}),
     r"its entry model\['ln_f.weight'\] is a strided view"),
    (lambda s: s["model"].update({"ln_f.weight": s["model"]["ln_f.weight"].long()}),
     r"its entry model\['ln_f.weight'\] is a torch.int64 tensor, not a floating-point one"),
    (lambda s: s.update(losses=None), "its entry losses must be a list of numbers, got None"),
    (lambda s: s.update(losses="abc"), "its entry losses must be a list of numbers, got 'abc'"),
    (lambda s: s["config"].update(n_layer=10**6), r"its config asks for a model of [\d,]+ parameters, more than"),
    (lambda s: s["model"].update(extra=torch.zeros(1)),
     r"cannot be used: .*Unexpected key\(s\) in state_dict: \"extra\""),
    (lambda s: s["model"].pop("ln_f.weight"),
     r"cannot be used: its config asks for [\d,]+ parameters but the file holds"),
    (lambda s: s.update(model=[1.0]), "stores its weights in another layout than save_chat_model writes"),
]


@pytest.mark.parametrize(("edit", "match"), CHAT_EDITS, ids=["nan", "stride-0", "int64", "losses-None",
                                                             "losses-str", "huge-config", "extra-weight",
                                                             "missing-weight", "layout"])
def test_a_chat_model_with_a_bad_entry_is_refused_naming_the_file(chat_file, edit, match):
    bad = _edited(chat_file, edit)
    with pytest.raises(CheckpointError, match=match) as refused:
        load_chat_model(bad)
    assert str(bad) in str(refused.value)


def test_a_chat_model_of_another_format_is_not_told_to_be_fine_tuned(chat_file):
    newer = _edited(chat_file, lambda s: s.update(format=2))
    with pytest.raises(CheckpointError, match=f"{newer} has chat model format 2; this version reads format 1: load "
                                              "it with the version of transformer-course that wrote it") as refused:
        load_chat_model(newer)
    assert "fine-tune" not in str(refused.value)


def test_a_checkpoint_given_as_a_chat_model_is_named_as_one(tmp_path):
    model, _ = _chat()
    plain = save_checkpoint(tmp_path / "plain.pt", model, tokenizer=CHARS)
    with pytest.raises(CheckpointError, match=r"is not a chat model \(missing \['config'\]\): it is a "
                                              "checkpoint of a text model .*load_checkpoint, or fine-tune it"):
        load_chat_model(plain)


def test_random_bytes_and_code_are_refused_as_checkpoints_are(tmp_path):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(bytes(range(256)) * 12)
    marker, evil = tmp_path / "it-ran", tmp_path / "evil.pt"
    torch.save({"format": 1, "config": {}, "model": _System(marker)}, evil)
    for load in (load_chat_model, load_checkpoint):
        with pytest.raises(CheckpointError, match=f"{junk} is truncated or corrupted and cannot be read") as refused:
            load(junk)
        assert "weights_only=False" not in str(refused.value) and "will likely succeed" not in str(refused.value)
        with pytest.raises(CheckpointError, match=rf"{evil} asks to run code when opened \(it calls the Python object "
                                                  r"(posix|os)\.system\); refused, nothing was run"):
            load(evil)
    assert not marker.exists()
    with pytest.raises(FileNotFoundError, match="no chat model at .*save_chat_model"):
        load_chat_model(tmp_path / "missing.pt")


def test_a_diverged_model_is_not_saved_as_a_chat_model(tmp_path):
    model, tok = _chat()
    with torch.no_grad():
        model.ln_f.weight[0] = float("inf")
    with pytest.raises(FloatingPointError, match=r"was not written: the model's 'ln_f.weight' holds NaN or infinite"):
        save_chat_model(tmp_path / "x.pt", model, tok)
    assert not (tmp_path / "x.pt").exists()


# ---------------------------------------------------------------- one place for the checks
def test_every_loader_reads_its_file_through_read_state(tmp_path, monkeypatch):
    """Checkpoints, chat models (chapter 11's and chapter 12's preference models), the shipped adapter and
    the dates model: all go through `checkpoint.read_state`, the one place of the checks."""
    model, tok = _chat()
    files = {"checkpoint": save_checkpoint(tmp_path / "c.pt", model),
             "chat model": save_chat_model(tmp_path / "m.pt", model, tok)}
    seen, real = [], checkpoint.read_state

    def spy(path, kind=checkpoint.CHECKPOINT_FILE, *args, **kwargs):
        seen.append((Path(path).name, kind.name))
        return real(path, kind, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "read_state", spy)
    load_checkpoint(files["checkpoint"])
    load_chat_model(files["chat model"])
    load_chat_model(shipped="shakespeare_dpo")
    course_model.load_lora_adapter()
    course_model.load_dates_model()
    assert seen == [("c.pt", "checkpoint"), ("m.pt", "chat model"), ("shakespeare_dpo.pt", "chat model"),
                    ("shakespeare_chat_lora.pt", "LoRA adapter"), ("dates_iso.pt", "dates model")]


@pytest.fixture
def scratch_assets(tmp_path, monkeypatch):
    for name in ("shakespeare_chat_lora", "dates_iso", "shakespeare_grpo"):
        for suffix in (".pt", ".json"):
            (tmp_path / (name + suffix)).write_bytes((course_model.ASSETS / (name + suffix)).read_bytes())
    monkeypatch.setattr(course_model, "ASSETS", tmp_path)
    return tmp_path


def _replace_shipped(folder: Path, name: str, contents) -> Path:
    """Shipped file `name` replaced by `contents`, its manifest's SHA-256 updated to match."""
    path = folder / f"{name}.pt"
    torch.save(contents, path)
    info = course_model.manifest(name)
    info["sha256"] = course_model.file_sha256(path)
    (folder / f"{name}.json").write_text(json.dumps(info))
    return path


def test_shipped_files_that_pass_their_manifest_are_still_checked(scratch_assets):
    marker = scratch_assets / "it-ran"
    _replace_shipped(scratch_assets, "shakespeare_chat_lora", {"blocks.0.attn.qkv.A": _System(marker)})
    with pytest.raises(CheckpointError, match="asks to run code when opened .*refused, nothing was run"):
        course_model.load_lora_adapter()
    assert not marker.exists()
    _replace_shipped(scratch_assets, "shakespeare_chat_lora", {"blocks.0.attn.qkv.A": torch.full((2, 2), float("nan"))})
    with pytest.raises(CheckpointError, match=r"LoRA adapter .* its entry 'blocks.0.attn.qkv.A' holds NaN or infinite "
                                              "numbers.*rebuild it with"):
        course_model.load_lora_adapter()
    _replace_shipped(scratch_assets, "shakespeare_chat_lora", [torch.zeros(2)])
    with pytest.raises(CheckpointError, match="LoRA adapter .* stores its weights in another layout"):
        course_model.load_lora_adapter()
    state = torch.load(course_model.ASSETS / "shakespeare_grpo.pt", weights_only=True)
    unsigned = {k: v for k, v in state.items() if k != "sha256"}  # its own checksum would catch the edit first
    _replace_shipped(scratch_assets, "shakespeare_grpo", {**unsigned, "losses": None})
    with pytest.raises(CheckpointError, match="its entry losses must be a list of numbers.*rebuild it with"):
        load_chat_model(shipped="shakespeare_grpo")
    _replace_shipped(scratch_assets, "dates_iso", {"format": 1, "config": {}, "model": {}, "losses": None})
    with pytest.raises(CheckpointError, match="dates model .* cannot be used: .*rebuild it with"):
        course_model.load_dates_model()


# ---------------------------------------------------------------- LoRA adapters
def _adapted(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return add_lora(GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=2, d_model=8)), rank=2)


@pytest.mark.parametrize(("state", "match"), [
    (None, "not an adapter: the state is None, not a dict of tensors"),
    ([1.0], "not an adapter: the state is a list, not a dict of tensors"),
    ("A", "not an adapter: the state is a str, not a dict of tensors"),
])
def test_load_adapter_refuses_what_is_not_a_dict_of_tensors(state, match):
    with pytest.raises(ValueError, match=match + "; load_adapter takes what adapter_state returns"):
        load_adapter(_adapted(), state)


def test_load_adapter_refuses_values_that_are_not_finite_floating_point_tensors():
    good = adapter_state(_adapted(seed=1))
    key = next(k for k in good if k.endswith(".A"))
    for value, match in ((1.0, f"'{key}' is a float, not a tensor"),
                         (None, f"'{key}' is None, not a tensor"),
                         ((good[key] * 100).long(), f"'{key}' is a torch.int64 tensor, not a floating-point one"),
                         (torch.full_like(good[key], float("nan")), f"'{key}' holds NaN or infinite numbers")):
        model = _adapted()
        before = {k: v.clone() for k, v in adapter_state(model).items()}
        with pytest.raises(ValueError, match="not an adapter: " + match):
            load_adapter(model, {**good, key: value})
        assert all(torch.equal(before[k], v) for k, v in adapter_state(model).items())  # left as it was
    assert torch.equal(adapter_state(load_adapter(_adapted(), good))[key], good[key])


# ---------------------------------------------------------------- chapter 06's train, its checkpoints
CFG = GPTConfig(vocab_size=12, block_size=16, n_layer=2, n_head=2, d_model=16)
QUICK = TrainConfig(batch_size=4, max_iters=3, eval_interval=3, eval_iters=1, warmup_iters=1, progress=False,
                    device="cpu")


@pytest.fixture
def trained(tmp_path):
    torch.manual_seed(0)
    model = GPT(CFG)
    data = torch.randint(0, 12, (500,), generator=torch.Generator().manual_seed(0))
    path = tmp_path / "checkpoint.pt"
    training.train(model, data[:400], data[400:], QUICK, checkpoint_path=path)
    return model, data, path


def test_train_with_nan_weights_keeps_the_last_good_checkpoint_and_says_so(trained):
    model, data, path = trained
    before = path.read_bytes()
    with torch.no_grad():
        model.ln_f.weight.fill_(float("nan"))  # as a run that diverged between two evaluations
    with pytest.raises(FloatingPointError, match=rf"{path} was not written: the model's 'ln_f.weight' holds NaN or "
                                                 "infinite numbers; a file already there is left as it was"):
        training.train(model, data[:400], data[400:], QUICK, checkpoint_path=path)
    assert path.read_bytes() == before and load_checkpoint(path).step == 3


def test_train_stops_at_the_first_loss_that_is_not_finite(trained, monkeypatch):
    model, data, path = trained
    before, steps = path.read_bytes(), []
    real = training.train_step

    def diverging(*args, **kwargs):
        steps.append(real(*args, **kwargs))
        return float("nan") if len(steps) == 2 else steps[-1]

    monkeypatch.setattr(training, "train_step", diverging)
    resume = load_checkpoint(path, GPT(CFG))
    with pytest.raises(FloatingPointError, match="training diverged at step 4: the loss is nan; the last checkpoint "
                                                 "written, if any, is kept as it was. Lower the learning rate"):
        training.train(GPT(CFG), data[:400], data[400:], replace(QUICK, max_iters=9), resume=resume,
                       checkpoint_path=path)
    assert len(steps) == 2 and path.read_bytes() == before


def test_a_checkpoint_with_nan_weights_is_refused_at_the_weights(tmp_path):
    torch.manual_seed(0)
    path = save_checkpoint(tmp_path / "m.pt", GPT(CFG))

    def poison(state):
        state["model"]["ln_f.weight"] = torch.full_like(state["model"]["ln_f.weight"], float("nan"))

    with pytest.raises(CheckpointError, match=r"its entry model\['ln_f.weight'\] holds NaN or infinite numbers, "
                                              "which save_checkpoint never writes; delete it and train again"):
        load_checkpoint(_edited(path, poison))
