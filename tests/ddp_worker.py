"""Run under `torchrun --nproc-per-node 2` by tests/test_distributed.py: several data-parallel runs of
`parallel.train` in one process group (one launch costs seconds), each writing its history to OUT.

    torchrun --nproc-per-node 2 tests/ddp_worker.py OUT

Runs (a 1-layer character model on the first 40,000 characters of Shakespeare, 4 windows per process):
- fixed.json: 8 steps, dropout 0, global batch 8 (4 per process), evaluated at 0, 4, 8;
- straight.json: 12 steps with dropout 0.1, evaluated every 3;
- resumed.json: the same 12 steps stopped at 6 (checkpoint) and resumed from the checkpoint;
- half.pt: the checkpoint of a dropout-0 run stopped at step 6, for a resume with another world size;
- timed.json: a run stopped by max_seconds (both ranks must agree on the step).
"""

import json
import sys
from pathlib import Path

import torch

from transformer_course import parallel
from transformer_course.checkpoint import load_checkpoint
from transformer_course.config import GPTConfig, TrainConfig
from transformer_course.data import load_shakespeare
from transformer_course.model import GPT
from transformer_course.parallel import train
from transformer_course.tokenization import CharTokenizer
from transformer_course.training import encode_corpus

TEXT = load_shakespeare()[:40_000]
TOKENIZER = CharTokenizer.from_text(load_shakespeare())
DATA = encode_corpus(TOKENIZER, TEXT)
TRAIN, VAL = DATA[:36_000], DATA[36_000:]


def model(dropout: float) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=TOKENIZER.vocab_size, block_size=32, n_layer=1, n_head=2, d_model=32,
                         dropout=dropout))


def config(**changes) -> TrainConfig:
    settings = dict(max_iters=8, batch_size=4, learning_rate=3e-3, min_lr=3e-4, warmup_iters=2, lr_decay_iters=12,
                    eval_interval=4, eval_iters=5, progress=False, device="cpu")
    return TrainConfig(**{**settings, **changes})


def main(out: Path) -> None:
    world, _ = parallel.start_from_environment("cpu")
    try:
        def save(name: str, history) -> None:
            if world.is_main:
                (out / name).write_text(json.dumps(history.to_dict()))

        save("fixed.json", train(model(0.0), TRAIN, VAL, config()))
        save("straight.json", train(model(0.1), TRAIN, VAL, config(max_iters=12, eval_interval=3)))
        train(model(0.1), TRAIN, VAL, config(max_iters=6, eval_interval=3), checkpoint_path=out / "part.pt")
        net = model(0.1)
        save("resumed.json", train(net, TRAIN, VAL, config(max_iters=12, eval_interval=3),
                                   resume=load_checkpoint(out / "part.pt", net), checkpoint_path=out / "part.pt"))
        train(model(0.0), TRAIN, VAL, config(max_iters=6, eval_interval=3), checkpoint_path=out / "half.pt")
        # a wall-time limit: the ranks' clocks differ, yet they must stop at the same step (or one would wait forever)
        save("timed.json", train(model(0.0), TRAIN, VAL, config(max_iters=100_000, eval_interval=50, max_seconds=1.5)))
    finally:
        parallel.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
