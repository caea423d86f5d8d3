"""The course's trained model: a character-level GPT trained once on Shakespeare by the course's own
code, shipped inside the package (hand-written, not exported).

Chapters after 06 start from this model instead of training one again, so a learner meets a model that
already writes Shakespeare-like text, the chapters run faster, and their stored outputs do not depend
on how a training run rounds on one CPU or another (training repeats millions of float32 operations
whose last bits depend on the instruction set; loading a file does not).

The recipe is chapter 06's, exactly: ``PRESETS["tiny"]`` (4 blocks, 4 heads, C = 128, context 64, no
biases; about 0.8 M parameters) trained with ``TRAIN_PRESETS["tiny"]`` (1,500 AdamW steps of 12 x 64
characters, peak learning rate 2e-3) in float32 on the CPU, model seed and batch seed ``SEED``.
Rebuild it (about two minutes on a 2-core CPU) with::

    .venv/bin/python tools/build_course_model.py

which rewrites ``assets/shakespeare_char.pt`` and its manifest ``assets/shakespeare_char.json`` (the
file's SHA-256, the recipe, the losses, the machine and a greedy sample). A rebuild on another CPU
gives a model of the same quality, not the same bits; the manifest says where the shipped one was made.
"""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import torch

ASSETS = Path(__file__).resolve().parent / "assets"
CHECKPOINT = ASSETS / "shakespeare_char.pt"
MANIFEST = ASSETS / "shakespeare_char.json"
PRESET = "tiny"
SEED = 1337
SAMPLE_PROMPT = "ROMEO:\n"
SAMPLE_TOKENS = 120
REBUILD = ".venv/bin/python tools/build_course_model.py"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest() -> dict:
    """The shipped model's manifest: recipe, seed, losses, machine, SHA-256 and a greedy sample."""
    if not MANIFEST.is_file():
        raise FileNotFoundError(f"the course model's manifest {MANIFEST} is missing: reinstall the package "
                                f"or rebuild the model with `{REBUILD}`")
    return json.loads(MANIFEST.read_text())


def load_course_model(map_location="cpu"):
    """The trained model the course ships, as a `training.Checkpoint`: ``.model`` (eval mode),
    ``.tokenizer`` (a CharTokenizer), ``.config``, ``.train_config`` and ``.history`` of its run.

    The file is checked against the SHA-256 in its manifest before it is read (with weights_only=True,
    like every checkpoint), so a damaged or replaced file is refused with a message, never used.
    """
    from .training import load_checkpoint

    expected = manifest()["sha256"]
    if not CHECKPOINT.is_file():
        raise FileNotFoundError(f"the course model {CHECKPOINT} is missing: reinstall the package or rebuild "
                                f"it with `{REBUILD}`")
    if (actual := _sha256(CHECKPOINT)) != expected:
        raise ValueError(f"the course model {CHECKPOINT} does not match its manifest (SHA-256 {actual[:12]}..., "
                         f"expected {expected[:12]}...): the file is damaged or was replaced; reinstall the "
                         f"package or rebuild it with `{REBUILD}`")
    return load_checkpoint(CHECKPOINT, map_location=map_location)


def greedy_sample(checkpoint, prompt: str = SAMPLE_PROMPT, max_new_tokens: int = SAMPLE_TOKENS) -> str:
    """The model's greedy continuation of `prompt` (no randomness: the same text on every machine)."""
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


def build_course_model(out_dir: Path = ASSETS, *, max_iters: int | None = None, progress: bool = True) -> Path:
    """Train the course model with its recorded recipe and write ``shakespeare_char.pt`` and its
    manifest into `out_dir` (the package's assets by default). `max_iters` shortens the run (tests)."""
    from .data import load_shakespeare, train_val_split
    from .model import GPT, PRESETS
    from .runtime import seed_everything
    from .tokenization import CharTokenizer
    from .training import TRAIN_PRESETS, encode_corpus, save_checkpoint, train

    out_dir = Path(out_dir)
    text = load_shakespeare()
    tokenizer = CharTokenizer.from_text(text)
    train_data, val_data = train_val_split(encode_corpus(tokenizer, text))
    cfg = replace(TRAIN_PRESETS[PRESET], seed=SEED, device="cpu", bf16=False, progress=progress,
                  **({"max_iters": max_iters} if max_iters else {}))
    seed_everything(SEED)
    model = GPT(replace(PRESETS[PRESET], vocab_size=tokenizer.vocab_size))
    history = train(model, train_data, val_data, cfg)
    path = save_checkpoint(out_dir / CHECKPOINT.name, model, step=history.step[-1] + 1, train_config=cfg,
                           tokenizer=tokenizer, history=history)
    from .training import load_checkpoint

    sample = greedy_sample(load_checkpoint(path))
    info = {
        "file": CHECKPOINT.name,
        "sha256": _sha256(path),
        "bytes": path.stat().st_size,
        "parameters": model.num_parameters(),
        "preset": PRESET,
        "seed": SEED,
        "train_config": cfg.to_dict(),
        "steps": history.step[-1] + 1,
        "final_train_loss": round(history.train_loss[-1], 4),
        "final_val_loss": round(history.val_loss[-1], 4),
        "greedy_sample": {"prompt": SAMPLE_PROMPT, "max_new_tokens": SAMPLE_TOKENS, "text": sample},
        "built": {"command": REBUILD, "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                  "cpu": _cpu_name(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                  "python": platform.python_version(), "wall_seconds": round(history.wall_seconds, 1)},
    }
    (out_dir / MANIFEST.name).write_text(json.dumps(info, indent=2) + "\n")
    return path
