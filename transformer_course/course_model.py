"""The course's trained models: trained once by the course's own code and shipped inside the package
(hand-written, not exported).

Chapters after 06 start from these instead of training again, so a learner meets models that already
work, the chapters run faster, and their stored outputs do not depend on how a training run rounds on
one CPU or another (training repeats millions of float32 operations whose last bits depend on the
instruction set; loading a file does not).

- ``shakespeare_char``: chapter 06's character-level GPT, exactly its recipe: ``PRESETS["tiny"]``
  (4 blocks, 4 heads, C = 128, context 64, no biases; about 0.8 M parameters) trained with
  ``TRAIN_PRESETS["tiny"]`` (1,500 AdamW steps of 12 x 64 characters, peak learning rate 2e-3) in
  float32 on the CPU, model and batch seed ``SEED``. Chapter 07 onwards: `load_course_model`.
- ``dates_iso``: chapter 09's encoder-decoder (`dates.new_dates_model`), trained by `dates.train_dates`
  for 1,200 steps on 60,000 dates. Chapter 09: `load_dates_model`.

Each file sits in ``assets/`` beside a manifest (``NAME.json``: SHA-256, recipe, losses, the machine
it was trained on), and is checked against that SHA-256 before it is read (weights_only=True). Rebuild
both (about three minutes on a 2-core CPU) with::

    .venv/bin/python tools/build_course_model.py

A rebuild on another CPU gives models of the same quality, not the same bits.
"""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import torch

ASSETS = Path(__file__).resolve().parent / "assets"
PRESET = "tiny"
SEED = 1337
SAMPLE_PROMPT = "ROMEO:\n"
SAMPLE_TOKENS = 120
DATES_STEPS = 1200
DATES_FORMAT = 1
REBUILD = ".venv/bin/python tools/build_course_model.py"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest(name: str = "shakespeare_char") -> dict:
    """A shipped model's manifest: SHA-256, recipe, losses and the machine it was trained on."""
    path = ASSETS / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"the course model's manifest {path} is missing: reinstall the package "
                                f"or rebuild the models with `{REBUILD}`")
    return json.loads(path.read_text())


def _verified(name: str) -> Path:
    """The path of shipped model `name`, after checking it against its manifest's SHA-256."""
    expected = manifest(name)["sha256"]
    path = ASSETS / f"{name}.pt"
    if not path.is_file():
        raise FileNotFoundError(f"the course model {path} is missing: reinstall the package or rebuild it "
                                f"with `{REBUILD}`")
    if (actual := _sha256(path)) != expected:
        raise ValueError(f"the course model {path} does not match its manifest (SHA-256 {actual[:12]}..., "
                         f"expected {expected[:12]}...): the file is damaged or was replaced; reinstall the "
                         f"package or rebuild it with `{REBUILD}`")
    return path


def load_course_model(map_location="cpu"):
    """Chapter 06's trained GPT, as a `checkpoint.Checkpoint`: ``.model`` (eval mode), ``.tokenizer`` (a
    CharTokenizer), ``.config``, ``.train_config`` and ``.history`` of its run."""
    from .checkpoint import load_checkpoint

    return load_checkpoint(_verified("shakespeare_char"), map_location=map_location)


@dataclass
class DatesModel:
    """Chapter 09's trained encoder-decoder: the model (eval mode) and the loss of every training step."""

    model: torch.nn.Module
    losses: list[float]


def load_dates_model() -> DatesModel:
    """Chapter 09's encoder-decoder, trained by `dates.train_dates` for 1,200 steps."""
    from .encoder_decoder import EncoderDecoder, Seq2SeqConfig

    path = _verified("dates_iso")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("format") != DATES_FORMAT:
        raise ValueError(f"{path} is not a dates model of format {DATES_FORMAT}; rebuild it with `{REBUILD}`")
    model = EncoderDecoder(Seq2SeqConfig(**state["config"]))
    model.load_state_dict(state["model"])
    return DatesModel(model=model.eval(), losses=list(state["losses"]))


def greedy_sample(checkpoint, prompt: str = SAMPLE_PROMPT, max_new_tokens: int = SAMPLE_TOKENS) -> str:
    """The GPT's greedy continuation of `prompt` (no randomness: the same text on every machine)."""
    from .generation import generate

    tok = checkpoint.tokenizer
    idx = torch.tensor([tok.encode(prompt)], dtype=torch.long)
    return tok.decode(generate(checkpoint.model, idx, max_new_tokens, temperature=0.0)[0].tolist())


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _write_manifest(out_dir: Path, name: str, path: Path, wall_seconds: float, **facts) -> None:
    info = {"file": path.name, "sha256": _sha256(path), "bytes": path.stat().st_size, **facts,
            "built": {"command": REBUILD, "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                      "cpu": _cpu_name(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "python": platform.python_version(), "wall_seconds": round(wall_seconds, 1)}}
    (out_dir / f"{name}.json").write_text(json.dumps(info, indent=2) + "\n")


def build_course_model(out_dir: Path = ASSETS, *, max_iters: int | None = None, progress: bool = True) -> Path:
    """Train chapter 06's GPT with its recorded recipe; write ``shakespeare_char.pt`` and its manifest
    into `out_dir` (the package's assets by default). `max_iters` shortens the run (tests)."""
    from .checkpoint import load_checkpoint, save_checkpoint
    from .config import PRESETS, TRAIN_PRESETS
    from .data import load_shakespeare, train_val_split
    from .model import GPT
    from .runtime import seed_everything
    from .tokenization import CharTokenizer
    from .training import encode_corpus, train

    out_dir = Path(out_dir)
    text = load_shakespeare()
    tokenizer = CharTokenizer.from_text(text)
    train_data, val_data = train_val_split(encode_corpus(tokenizer, text))
    cfg = replace(TRAIN_PRESETS[PRESET], seed=SEED, device="cpu", bf16=False, progress=progress,
                  **({"max_iters": max_iters} if max_iters else {}))
    seed_everything(SEED)
    model = GPT(replace(PRESETS[PRESET], vocab_size=tokenizer.vocab_size))
    history = train(model, train_data, val_data, cfg)
    path = save_checkpoint(out_dir / "shakespeare_char.pt", model, step=history.step[-1] + 1, train_config=cfg,
                           tokenizer=tokenizer, history=history)
    sample = greedy_sample(load_checkpoint(path))
    _write_manifest(out_dir, "shakespeare_char", path, history.wall_seconds, parameters=model.num_parameters(),
                    preset=PRESET, seed=SEED, train_config=cfg.to_dict(), steps=history.step[-1] + 1,
                    final_train_loss=round(history.train_loss[-1], 4), final_val_loss=round(history.val_loss[-1], 4),
                    greedy_sample={"prompt": SAMPLE_PROMPT, "max_new_tokens": SAMPLE_TOKENS, "text": sample})
    return path


def build_dates_model(out_dir: Path = ASSETS, *, steps: int = DATES_STEPS, progress: bool = True) -> Path:
    """Train chapter 09's encoder-decoder with `dates.train_dates` (chapter 09's data: 60,000 dates,
    2,000 held out) and write ``dates_iso.pt`` and its manifest, with the held-out exact-match rate."""
    import time

    from .dates import (
        BOS,
        EOS,
        SOURCE_CHARS,
        TARGET_CHARS,
        decode_ids,
        encode_batch,
        make_examples,
        new_dates_model,
        train_dates,
    )
    from .runtime import atomic_save

    out_dir = Path(out_dir)
    test_pairs = make_examples(2000, seed=1)
    train_pairs = make_examples(60_000, seed=2, exclude={s for s, _ in test_pairs})
    began = time.perf_counter()
    model = new_dates_model(seed=0)
    losses = train_dates(model, train_pairs, steps=steps, progress=progress)
    wall = time.perf_counter() - began
    path = atomic_save({"format": DATES_FORMAT, "config": model.cfg.to_dict(), "model": model.state_dict(),
                        "losses": losses}, out_dir / "dates_iso.pt")
    with torch.no_grad():
        out = model.greedy_decode(encode_batch([s for s, _ in test_pairs], SOURCE_CHARS), BOS, EOS)
    correct = sum(decode_ids(row.tolist(), TARGET_CHARS) == t for row, (_, t) in zip(out, test_pairs, strict=True))
    _write_manifest(out_dir, "dates_iso", path, wall, parameters=sum(p.numel() for p in model.parameters()),
                    recipe={"function": "transformer_course.dates.train_dates", "steps": steps, "batch_size": 64,
                            "lr": 3e-3, "model_seed": 0, "batch_seed": 3, "train_examples": 60_000},
                    final_loss=round(sum(losses[-100:]) / 100, 5), held_out_exact_match=correct / len(test_pairs))
    return path
