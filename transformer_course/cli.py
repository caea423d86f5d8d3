"""The ``transformer-course`` command (hand-written, not exported).

Each subcommand parses its arguments here and calls the library; the heavy imports happen inside
the handler, so ``transformer-course --help`` is instant. Sections are owned by the chapter that
provides the library code they call.
"""

from __future__ import annotations

import argparse
import sys


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and examples as written (line breaks kept); every option's default shown after its help,
    unless the help already says it or there is none to show (None, a flag that is off)."""

    def _get_help_string(self, action) -> str:
        text = action.help or ""
        if (not action.option_strings or "default" in text or action.default is None or action.default is False
                or action.default is argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)"


def _parser(sub, name: str, **kwargs) -> argparse.ArgumentParser:
    return sub.add_parser(name, formatter_class=_HelpFormatter, **kwargs)


def preset_lines() -> list[str]:
    """One line per training preset: the model's shape (config.PRESETS) and the recipe (TRAIN_PRESETS).
    config.py is plain dataclasses: `--help` stays instant (no torch)."""
    from .config import PRESETS, TRAIN_PRESETS

    lines = []
    for name, recipe in TRAIN_PRESETS.items():
        m = PRESETS[name]
        lines.append(f"  {name:<6} {m.n_layer} layers x {m.n_head} heads, width {m.d_model}, context {m.block_size} "
                     f"characters; {recipe.max_iters:,} steps of {recipe.batch_size} windows, peak learning rate "
                     f"{recipe.learning_rate:g}")
    return lines


_TRAIN_DESCRIPTION = """Train a character-level GPT on Shakespeare (chapter 06), checkpointing into --out.

Resumes from --out: when --out already holds a checkpoint (checkpoint.pt) of the same preset, training
continues from its step, so running the same command again after Ctrl-C or a crash goes on where it stopped.
--out also gets history.json (the losses); one run at a time may use a folder.

Presets (--preset):
{presets}"""

_EXAMPLES = """Examples:
  transformer-course train --preset tiny --out runs/tiny           # about two minutes on a laptop CPU
  transformer-course train --preset tiny --out runs/tiny           # again (after Ctrl-C): resumes
  transformer-course train --preset tiny --out runs/t2 --max-iters 200 --no-progress > t2.log
  transformer-course generate --checkpoint runs/tiny/checkpoint.pt --prompt "ROMEO:" --temperature 0.8
  transformer-course generate --prompt "JULIET:"                   # the model the course ships
  transformer-course chat --model grpo                             # chapter 12's assistant (Ctrl-D ends)
  transformer-course serve                                         # an OpenAI-compatible API, a chat page at /
  transformer-course student-edition student                       # teachers (the `teacher` extra)
  transformer-course grade student/chapters/*.ipynb --csv class.csv

Training presets (train --preset):
{presets}

Each command has its own --help (transformer-course train --help)."""


# ---------------------------------------------------------------- train (chapter 06)
def _add_train(sub) -> None:
    p = _parser(sub, "train", help="train a character-level GPT on Shakespeare (chapter 06); resumes from --out",
                description=_TRAIN_DESCRIPTION.format(presets="\n".join(preset_lines())))
    p.add_argument("--preset", default="tiny",
                   help="model and training recipe, one of the presets above (transformer_course.config.PRESETS "
                        "and TRAIN_PRESETS)")
    p.add_argument("--out", required=True,
                   help="folder for checkpoint.pt and history.json; a checkpoint already there is resumed")
    p.add_argument("--max-iters", type=_positive_int, default=None,
                   help="stop at this step, counted from the start of the run a resume continues (default: the "
                        "preset's)")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="stop after this many seconds of wall time (default: no limit)")
    p.add_argument("--eval-interval", type=_positive_int, default=None,
                   help="evaluate and checkpoint every this many steps (default: the preset's)")
    p.add_argument("--eval-iters", type=_positive_int, default=None,
                   help="batches of the train and of the val split per evaluation, fewer: faster, noisier "
                        "(default: the preset's)")
    batch = p.add_mutually_exclusive_group()
    batch.add_argument("--grad-accum", type=_positive_int, default=None,
                       help="micro-batches per process per step (default 1: under torchrun the global batch grows "
                            "with the number of processes)")
    batch.add_argument("--global-batch", type=_positive_int, default=None,
                       help="windows per optimizer step over all processes, kept fixed whatever the number of "
                            "processes (gradient accumulation makes up the rest); a multiple of the preset's batch "
                            "size times the number of processes")
    p.add_argument("--learning-rate", type=_positive_number("a learning rate", " such as 3e-4"), default=None,
                   help="peak learning rate (default: the preset's); the floor of its cosine keeps its ratio to it")
    p.add_argument("--seed", type=int, default=1337, help="seed of the batches and the initial weights")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N or mps (default: best available)")
    p.add_argument("--bf16", action="store_true",
                   help="bf16 autocast on the CPU too (faster only on CPUs with AVX512-BF16 or AMX; "
                        "a CUDA GPU uses bf16 without this flag)")
    p.add_argument("--no-progress", action="store_true",
                   help="plain lines, one per evaluation, instead of a progress bar (the default when the output "
                        "is not a terminal: a log file, a pipe)")
    p.set_defaults(handler=_cmd_train)


def _positive_number(what: str, hint: str = ""):
    """An argparse type: a finite number > 0, refused in words naming `what` (and `hint`) otherwise."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}{hint}, got {text!r}") from None
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"must be {what} > 0{hint}, got {text}")
        return value

    return parse


def _bounded_number(what: str, low: float, high: float, hint: str = ""):
    """An argparse type: a finite number from `low` to `high`, refused in words naming `what` otherwise."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}{hint}, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {what} from {low:g} to {high:g}{hint}, got {text}")
        return value

    return parse


def _whole_number(what: str, low: int, high: int):
    """An argparse type: a whole number from `low` to `high`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, a whole number from {low} to {high}, got {text!r}") \
                from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {what}, from {low} to {high}, got {text}")
        return value

    return parse


def _check_threads(threads: int | None) -> None:
    """--threads at most 4 per CPU of this machine: more only wait for each other, and 100,000 crashed OpenMP
    (a segmentation fault). Below 1: `runtime.set_threads` says so."""
    import os

    cpus = os.cpu_count() or 1
    if threads is not None and threads > 4 * cpus:
        raise ValueError(f"--threads {threads}: this machine has {cpus} CPUs, and more than 4 threads per CPU only "
                         f"wait for each other: give at most {4 * cpus}")


def _check_out_folder(out, needed_bytes: int) -> None:
    """Fail now, before any data is loaded, if checkpoints cannot be written into folder `out`."""
    import os
    import shutil
    import tempfile

    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a folder (it will hold checkpoint.pt and history.json)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out) as probe:  # a real write: permissions, read-only or full disks
            probe.write(bytes(1 << 16))
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as error:
        raise OSError(f"cannot write into --out {out} ({error.strerror or error}); choose a folder you can "
                      "write to, on a disk with free space") from None
    if (free := shutil.disk_usage(out).free) < needed_bytes:
        raise OSError(f"--out {out}: its disk has {free / 1e6:,.0f} MB free, and a checkpoint of this run needs about "
                      f"{needed_bytes / 1e6:,.0f} MB (twice, while the new one replaces the old); free some space "
                      "or choose another folder")


def _cmd_train(args) -> int:
    """`transformer-course train`: train a preset on Shakespeare, checkpointing into args.out; resume if
    a checkpoint is there. Under `torchrun` every process runs this: they join one process group and
    train data-parallel (transformer_course.parallel, appendix 90), rank 0 alone writing and printing.
    Without torchrun it is a job of one: `parallel.train` then computes chapter 06's `train`.
    Ctrl-C ends it with one line (where it stopped, the checkpoint kept) and exit status 130 (128 + SIGINT)."""
    from pathlib import Path

    from . import parallel

    try:
        if not parallel.launched_by_torchrun():
            return _train(args, parallel.World())
        return _train_under_torchrun(args)
    except KeyboardInterrupt as stop:
        checkpoint = Path(args.out) / "checkpoint.pt"
        where = f"stopped at step {stop.step}" if isinstance(stop, parallel.TrainingInterrupted) else "stopped"
        kept = f"checkpoint at {checkpoint}" if checkpoint.exists() else "no checkpoint written yet"
        print(f"transformer-course train: {where}; {kept}; run the same command to resume", file=sys.stderr)
        return 130


def _train_under_torchrun(args) -> int:
    from torch.distributed.elastic.multiprocessing.errors import (
        record,  # the failing rank's traceback in torchrun's report
    )

    from . import parallel

    world, args.device = parallel.start_from_environment(args.device)
    try:
        return record(_train)(args, world)
    finally:
        parallel.stop()


def _train(args, world) -> int:
    """The train command in one process of `world` (one process of one outside torchrun).
    The device and the out folder are checked before the data is loaded; rank 0 holds the folder's lock
    for the whole run, so a second run with the same --out is refused at once."""
    from contextlib import nullcontext
    from pathlib import Path

    from .config import PRESETS, TRAIN_PRESETS
    from .model import count_parameters
    from .runtime import folder_lock, pick_device

    if args.preset not in TRAIN_PRESETS:
        raise ValueError(f"unknown preset {args.preset!r}; choose one of {', '.join(sorted(TRAIN_PRESETS))}")
    pick_device(args.device)  # one that does not exist is said now, not as a damaged checkpoint later
    out = Path(args.out)
    # weights and AdamW's two running averages, in float32, for the old and the new file
    _check_out_folder(out, 2 * 3 * 4 * count_parameters(PRESETS[args.preset]))
    with folder_lock(out, f"--out {out}") if world.is_main else nullcontext():
        return _train_in(args, world, out)


def _train_in(args, world, out) -> int:
    """The train command's run, its checks passed."""
    import json
    from dataclasses import replace

    from .checkpoint import load_checkpoint, read_state
    from .config import PRESETS
    from .data import load_shakespeare, train_val_split
    from .model import GPT
    from .parallel import train  # chapter 06's loop on every process of `world` (appendix 90)
    from .runtime import pick_device, seed_everything
    from .tokenization import CharTokenizer
    from .training import encode_corpus

    checkpoint = out / "checkpoint.pt"
    text = load_shakespeare()
    tokenizer = CharTokenizer.from_text(text)
    train_data, val_data = train_val_split(encode_corpus(tokenizer, text))
    del text
    cfg = _train_config(args, world)
    say = print if world.is_main else (lambda *_, **__: None)  # logs from rank 0 only
    seed_everything(args.seed)
    model = GPT(replace(PRESETS[args.preset], vocab_size=tokenizer.vocab_size))
    resume = None
    if checkpoint.exists():
        read_state(checkpoint)  # a damaged or unsafe file: its own error, which says what to do
        try:
            resume = load_checkpoint(checkpoint, model)
        except ValueError as error:  # a sound checkpoint of another model
            raise ValueError(f"{error}; --out {out} holds another run: resume it with the same --preset, or choose "
                             "another --out") from None
        say(f"resuming from step {resume.step} ({checkpoint})")
    processes = f" x {world.size} processes" if world.size > 1 else ""
    say(f"training {args.preset!r}: {model.num_parameters():,} parameters, {cfg.max_iters} steps of "
        f"{cfg.batch_size * cfg.grad_accum}{processes} x {model.cfg.block_size} tokens on {pick_device(cfg.device)}")
    # a bar (running loss, last evaluation) in a terminal; plain lines in a log, a pipe, or with --no-progress
    plain = args.no_progress or not (sys.stdout.isatty() and sys.stderr.isatty())
    history = train(model, train_data, val_data, cfg, resume=resume, checkpoint_path=checkpoint, tokenizer=tokenizer,
                    log=(lambda line: print(line, flush=True)) if plain else None)
    if world.is_main:
        written = out / ".history.json.tmp"  # then renamed: a run killed while writing leaves the old file whole
        written.write_text(json.dumps(history.to_dict()))
        written.replace(out / "history.json")
    say(f"step {history.eval_step[-1]}: train loss {history.train_loss[-1]:.4f}, val loss {history.val_loss[-1]:.4f}, "
        f"{history.tokens_per_second:,.0f} tokens/s; checkpoint {checkpoint}")
    return 0


def _train_config(args, world):
    """The run's TrainConfig: the preset's, with the command line's settings over it (--learning-rate keeps
    the floor's ratio to the peak; --global-batch sets grad_accum for the `world.size` processes)."""
    from dataclasses import replace

    from .config import TRAIN_PRESETS

    overrides = {"seed": args.seed, "device": args.device, "max_seconds": args.max_seconds}
    if args.bf16:
        overrides["bf16"] = True  # opt-in: bf16 autocast on the CPU too
    for name in ("max_iters", "eval_interval", "eval_iters", "grad_accum"):
        if getattr(args, name):
            overrides[name] = getattr(args, name)
    preset = TRAIN_PRESETS[args.preset]
    if args.learning_rate:  # the cosine's floor keeps its ratio to the peak
        overrides |= {"learning_rate": args.learning_rate,
                      "min_lr": preset.min_lr * args.learning_rate / preset.learning_rate}
    cfg = replace(preset, **overrides)
    if args.global_batch:
        per_step = cfg.batch_size * world.size  # one micro-batch on every process
        if args.global_batch % per_step:
            raise ValueError(f"--global-batch {args.global_batch} does not split over {world.size} process(es) of "
                             f"batch {cfg.batch_size}: choose a multiple of {per_step}, or another number of processes")
        cfg = replace(cfg, grad_accum=args.global_batch // per_step)
    return cfg


# ---------------------------------------------------------------- generate (chapter 07)
def _add_faster(p) -> None:
    """--quantize and --draft (chapter 14), for generate and chat."""
    p.add_argument("--quantize", choices=["int8"], default=None,
                   help="int8 weights through PyTorch's FBGEMM kernel (chapter 14; CPU only; default: float32)")
    p.add_argument("--draft", default=None, metavar="PATH|prompt-lookup",
                   help="speculative decoding (chapter 14; CPU only): prompt-lookup, or a smaller model's file with "
                        "the same tokenizer; the text keeps the model's own distribution (with --quantize int8, "
                        "whose logits shift slightly with the number of positions in a pass, a near tie can go "
                        "the other way) (default: none)")


def _add_generate(sub) -> None:
    p = _parser(sub, "generate", help="generate text from a checkpoint or the shipped model (chapter 07)",
                description="Continue --prompt with text sampled from a model, streamed to stdout as it is drawn.")
    p.add_argument("--checkpoint", default=None, help="checkpoint file written by `transformer-course train` "
                                                     "(default: the course's shipped model, chapter 06's recipe)")
    p.add_argument("--prompt", required=True, help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=200, help="how many tokens (characters) to add")
    p.add_argument("--temperature", type=float, default=1.0, help="divides the logits; 0 means greedy")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k likeliest tokens only (default: all)")
    p.add_argument("--top-p", type=float, default=None,
                   help="sample among the likeliest tokens whose probabilities add up to p (nucleus; default: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random draws: the same seed, the same text")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N or mps (default: best available)")
    _add_faster(p)
    p.set_defaults(handler=_cmd_generate)


def _cmd_generate(args) -> int:
    """Stream the text to stdout; a reader that stops early (`... | head`) ends it quietly, as Unix tools
    end: no traceback, exit status 141 (128 + SIGPIPE), what a shell reports for `yes | head`; Ctrl-C too
    (status 130)."""
    import os

    try:
        return _run_generate(args)
    except KeyboardInterrupt:  # Ctrl-C: one line, status 130 (128 + SIGINT), as chat, train and serve
        print("\ntransformer-course generate: stopped (Ctrl-C)", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # stdout's buffer still holds text for the closed pipe: point stdout at /dev/null so that the
        # interpreter's final flush does not fail again (the recipe of Python's `signal` documentation)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141


def _run_generate(args) -> int:
    import torch

    from .checkpoint import load_checkpoint
    from .generation import check_sampling, decode_stream, encode_prompt, stream
    from .runtime import pick_device

    check_sampling(args.temperature, args.top_k, args.top_p)  # before the (slow) load
    if (args.quantize or args.draft) and args.device not in (None, "cpu"):
        raise ValueError(f"--quantize and --draft run on the CPU, not {args.device}: add --device cpu or drop them")
    device = pick_device("cpu" if args.quantize or args.draft else args.device)
    if args.checkpoint is None:  # the model the course ships (checked against its manifest's SHA-256)
        from .course_model import load_course_model

        ckpt, args.checkpoint = load_course_model(map_location=device), "the course's shipped model"
    else:
        from .modern import build_gpt

        ckpt = load_checkpoint(args.checkpoint, build_gpt, map_location=device)  # chapter 06's GPT or chapter 10's
    tok, vocab = ckpt.tokenizer, ckpt.model.cfg.vocab_size
    if tok is None:
        raise ValueError(f"checkpoint {args.checkpoint} has no tokenizer: "
                         "save it with save_checkpoint(..., tokenizer=tok)")
    if tok.vocab_size < vocab:
        raise ValueError(f"checkpoint {args.checkpoint}: its tokenizer knows {tok.vocab_size} tokens but the model "
                         f"samples from {vocab}, so it could pick ids the tokenizer cannot decode: save the checkpoint "
                         "with the tokenizer the model was trained with")
    idx = encode_prompt(tok, args.prompt, device=device)
    generator = None if args.seed is None else torch.Generator(device).manual_seed(args.seed)
    from .speculative import decoding_setup, speculative_stream

    model, draft = decoding_setup(ckpt.model.to(device), args.quantize, args.draft, device=device)
    if draft is None:
        steps = stream(model, idx, args.max_new_tokens, args.temperature, args.top_k, args.top_p,
                       generator=generator, allowed=tok)
    else:
        steps = ([t] for t in speculative_stream(model, draft, idx, args.max_new_tokens, 4, args.temperature,
                                                 args.top_k, args.top_p, generator, allowed=tok))
    print(args.prompt, end="", flush=True)
    for piece in decode_stream(tok, (int(step[0]) for step in steps)):
        print(piece, end="", flush=True)
    print()
    return 0


# ---------------------------------------------------------------- chat (chapters 11 and 12)
CHAT_MODELS = {"sft": "shakespeare_chat", "dpo": "shakespeare_dpo", "grpo": "shakespeare_grpo"}


def _add_chat(sub) -> None:
    p = _parser(
        sub, "chat", help="talk to a chat model (chapters 11-12): a shipped model (--model) or your own (--checkpoint)",
        description="Type a message, then Enter; the answer is streamed. Ctrl-D (or /exit) ends. The course's model "
                    "knows the tasks it was fine-tuned on: 'upper: WORD', 'reverse: WORD', 'count: WORD', "
                    "'who says: LINE'. The history is kept as far as the model's context allows.")
    p.add_argument("--checkpoint", default=None,
                   help="a chat model written by assistant.save_chat_model (chapters 11 and 12 write them)")
    p.add_argument("--model", choices=sorted(CHAT_MODELS), default=None,
                   help="a model the course ships: sft (chapter 11, the default), dpo or grpo (chapter 12)")
    p.add_argument("--max-new-tokens", type=_positive_int, default=24, help="longest answer, in tokens (default 24)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (the default) means greedy")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k likeliest tokens only (default: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random draws (temperature > 0)")
    _add_faster(p)
    p.set_defaults(handler=_cmd_chat)


def _cmd_chat(args) -> int:
    import torch

    from .course_model import load_chat_model
    from .generation import check_sampling

    check_sampling(args.temperature, args.top_k, None)
    if args.checkpoint and args.model:
        raise SystemExit("transformer-course chat: give --checkpoint (your file) or --model (a shipped one), not both")
    chat = load_chat_model(args.checkpoint, shipped=CHAT_MODELS[args.model or "sft"])
    most = chat.model.cfg.block_size - 3  # <|user|>, <|end|> and <|assistant|> around the shortest message
    if args.max_new_tokens > most:
        raise ValueError(f"--max-new-tokens {args.max_new_tokens} leaves no room for a message in this model's "
                         f"context of {chat.model.cfg.block_size} tokens: give at most {most} (fewer leaves room "
                         "for longer messages)")
    from .speculative import decoding_setup

    chat.model, args.draft = decoding_setup(chat.model, args.quantize, args.draft,
                                            load=lambda path: load_chat_model(path).model)
    generator = torch.Generator().manual_seed(args.seed)
    print("chat: /reset starts a new conversation; /exit or Ctrl-D ends", file=sys.stderr, flush=True)
    try:
        _chat_loop(chat, args, generator, interactive=sys.stdin.isatty())
    except KeyboardInterrupt:  # Ctrl-C: one line, status 130 (128 + SIGINT), as train and serve
        print("\nchat: stopped (Ctrl-C)", file=sys.stderr)
        return 130
    return 0


def _chat_loop(chat, args, generator, interactive: bool) -> None:
    """Read a message a line; stream each reply; keep the conversation until /reset, /exit or end of input."""
    from .assistant import reply_stream
    from .speculative import speculative_reply_stream

    def replies(turn):  # chapter 11's stream, or chapter 14's speculative one with --draft
        if args.draft is None:
            return reply_stream(chat.model, chat.tokenizer, turn, args.max_new_tokens, args.temperature, args.top_k,
                                generator)
        return speculative_reply_stream(chat.model, chat.tokenizer, turn, args.draft, args.max_new_tokens,
                                        args.temperature, args.top_k, generator=generator)

    history: list[dict] = []
    while True:
        try:
            line = input("you: " if interactive else "")
        except EOFError:
            return
        line = line.strip()
        if line == "/exit":
            return
        if line == "/reset":
            history = []
            print("(a new conversation)", flush=True)
            continue
        if not line:
            continue
        turn = [*history, {"role": "user", "content": line}]
        print("assistant: ", end="", flush=True)
        try:
            reply = "".join(print(piece, end="", flush=True) or piece for piece in replies(turn))
        except ValueError as error:  # a message the model cannot read: say why, keep the conversation going
            print(f"(not sent: {error})")
            continue
        print()
        history = [*turn, {"role": "assistant", "content": reply}]


# ---------------------------------------------------------------- serve (issue 37)
def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 0..65535 (0: a free one), got {value}")
    return value


def _number(text: str, fits, what: str) -> float:
    """``text`` as a float for which ``fits(value)`` holds, else argparse's error "must be ``what``"."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not fits(value):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
    return value


def _seconds(text: str) -> float:
    """--token-delay: 0 to 60 seconds (serve.TOKEN_DELAY_LIMIT); inf or nan would fail every request."""
    return _number(text, lambda v: 0 <= v <= 60, "a number of seconds from 0 to 60")


def _megabytes(text: str) -> int:
    """--max-body-mb: a positive number of MiB (up to 1024), as bytes."""
    value = _number(text, lambda v: 0 < v <= 1024 and v * 2**20 >= 1, "a number of megabytes above 0, at most 1024")
    return int(value * 2**20)


def _add_serve(sub) -> None:
    p = _parser(
        sub, "serve", help="serve a model over an OpenAI-compatible HTTP API, with a chat page (the `serve` extra)",
        description="Serve a chat model (chapters 11-12; default: the shipped SFT model) or a text checkpoint\n"
                    "(completions only) at http://HOST:PORT/v1 (/v1/models, /v1/completions, /v1/chat/completions,\n"
                    "streamed with stream=true), a chat page at http://HOST:PORT/ and Prometheus metrics at\n"
                    "/metrics. Requests are decoded together (chapter 15: continuous batching over a paged KV\n"
                    "cache with a prefix cache); Ctrl-C stops. Needs the course's `serve` extra (fastapi, uvicorn).")
    p.add_argument("--checkpoint", default=None,
                   help="a chat model (assistant.save_chat_model) or a text checkpoint (transformer-course train)")
    p.add_argument("--model", choices=sorted(CHAT_MODELS), default=None,
                   help="a chat model the course ships: sft (chapter 11, the default), dpo or grpo (chapter 12)")
    p.add_argument("--name", default=None,
                   help="the model's id in the API (default: the shipped model's name, or the file's name)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=_port, default=8000, help="port to listen on; 0 picks a free one (default 8000)")
    p.add_argument("--token-delay", type=_seconds, default=0.0,
                   help="seconds to wait after each token, to watch the tokens arrive (default 0: none; at most 60)")
    p.add_argument("--max-body-mb", dest="max_body", type=_megabytes, default=4 * 2**20, metavar="MB",
                   help="largest request body read, in megabytes (MiB); a larger one is refused with 413 (default 4)")
    p.add_argument("--kv-cache-mb", type=_positive_number("a number of megabytes"), default=32.0, metavar="MB",
                   help="memory of the paged KV cache (chapter 15), in MiB: new requests wait while it is full")
    p.add_argument("--max-batch", type=_whole_number("a number of requests", 1, 4096), default=64, metavar="N",
                   help="the most requests decoded together (continuous batching); 1: one at a time")
    p.add_argument("--max-waiting", type=_whole_number("a number of requests", 1, 10**6), default=256, metavar="N",
                   help="the most requests waiting their turn; one more is refused with 429 and Retry-After")
    p.set_defaults(handler=_cmd_serve)


class _Terminated(Exception):
    """SIGTERM reached `serve` (raised by `_on_sigterm` once uvicorn has stopped and passes the signal on)."""


def _on_sigterm(signum, frame) -> None:
    raise _Terminated


def _cmd_serve(args) -> int:
    """Ctrl-C stops the server with one line and exit status 130 (128 + SIGINT); 0 where SIGINT was ignored.
    SIGTERM (a service manager, `docker stop`) says the same line, with status 143 (128 + SIGTERM)."""
    import signal
    import threading

    if args.checkpoint and args.model:
        raise SystemExit("transformer-course serve: give --checkpoint (your file) or --model (a shipped one), not both")
    from . import serve

    if missing := serve.missing_extra():
        raise RuntimeError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed: serve "
                           "needs the course's `serve` extra: pip install \"transformer-course[serve]\" (from a "
                           f"clone: pip install \".[serve]\"), or pip install {' '.join(serve.SERVE_EXTRA)}")
    served = serve.load_served(args.checkpoint, CHAT_MODELS[args.model or "sft"], args.name)
    status, main = 0, threading.current_thread() is threading.main_thread()
    # uvicorn stops on SIGTERM, then raises it again with the handler it found: make that one ours, so that the
    # default action (killed, no word said) does not end the process before the line below
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if main else None
    try:
        serve.run(served, args.host, args.port, say=lambda line: print(line, flush=True),
                  token_delay=args.token_delay, max_body=args.max_body, kv_cache_mb=args.kv_cache_mb,
                  max_batch=args.max_batch, max_waiting=args.max_waiting)
    except KeyboardInterrupt:
        status = 130
    except _Terminated:
        status = 143
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
    print("transformer-course serve: stopped", flush=True)
    return status


# ---------------------------------------------------------------- export (issue 37)
_EXPORT_DESCRIPTION = """Write a folder that Hugging Face transformers loads offline: config.json, model.safetensors,
generation_config.json, tokenizer.json and tokenizer_config.json (with chapter 11's chat template for a chat
model) and a model card (README.md). GPT-2-style models become GPT2LMHeadModel, chapter 10's Llama-style
ones LlamaForCausalLM; an option transformers has no equivalent for (post-norm blocks, say) is refused.
Needs the course's `pretrained` extra (transformers, safetensors, tokenizers).

  from transformers import pipeline
  print(pipeline("text-generation", model="DIR")("ROMEO:", max_new_tokens=50)[0]["generated_text"])"""


def _add_export(sub) -> None:
    p = _parser(sub, "export", help="write a model as a Hugging Face transformers folder (config, safetensors, "
                                    "tokenizer, model card)", description=_EXPORT_DESCRIPTION)
    p.add_argument("--checkpoint", default=None,
                   help="a checkpoint of `transformer-course train` or a chat model (assistant.save_chat_model) "
                        "(default: the course's shipped model, chapter 06's recipe)")
    p.add_argument("--model", choices=sorted(CHAT_MODELS), default=None,
                   help="a chat model the course ships instead: sft (chapter 11), dpo or grpo (chapter 12)")
    p.add_argument("--to", required=True, help="the folder to write: new, empty or an earlier export (whose own "
                                                "files alone are replaced; any other folder is refused)")
    p.add_argument("--data", default=None, help="what the model was trained on, for the model card (default: "
                                                "what the checkpoint tells)")
    p.set_defaults(handler=_cmd_export)


def _cmd_export(args) -> int:
    if args.checkpoint and args.model:
        raise SystemExit("transformer-course export: give --checkpoint (your file) or --model (a shipped one), "
                         "not both")
    from .course_model import ASSETS
    from .hf_export import export_checkpoint

    shipped = ASSETS / f"{CHAT_MODELS[args.model] if args.model else 'shakespeare_char'}.pt"
    folder = export_checkpoint(args.checkpoint or shipped, args.to, data=args.data)
    print(f"wrote {folder}: load it with transformers.AutoModelForCausalLM.from_pretrained({str(folder)!r})")
    return 0


# ---------------------------------------------------------------- report card (chapter 13, issue 52)
def _add_report(sub) -> None:
    p = _parser(sub, "report", help="measure a model and write its report card (HTML and Markdown)",
                description="Measure the shipped base, SFT, DPO and GRPO models, or the model in --checkpoint (a "
                            "chapter 06 checkpoint or a chat model from chapters 11-12), and write OUT/report.html "
                            "(one self-contained page), its Markdown twin report.md and report.json: size and "
                            "recipe, held-out bits per character, each task's exact match with its 95% interval and "
                            "baselines, pass@k, calibration, greedy replies and decode speed on this machine.")
    p.add_argument("--checkpoint", default=None,
                   help="a checkpoint.pt of `transformer-course train` or a file of save_chat_model (default: the "
                        "shipped models)")
    p.add_argument("--out", default="report_card", help="folder to write the report into")
    p.add_argument("--harness-tasks", default=None, metavar="DIR",
                   help="write the card's tasks as an offline lm-evaluation-harness task folder (YAML and JSONL) "
                        "into DIR instead, and measure nothing")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="PyTorch CPU threads (default: one per core idle at start; runtime.set_threads)")
    p.set_defaults(handler=_cmd_report)


def _cmd_report(args) -> int:
    """Ctrl-C stops it with one line and exit status 130; nothing is written (the files are written last)."""
    from .report_card import harness_tasks, run_report

    for flag, folder in (("--out", args.out), ("--harness-tasks", args.harness_tasks)):
        if folder is not None and not folder.strip():  # "$DIR" with DIR unset: not the current folder
            raise ValueError(f"{flag} is empty: give a folder")
    try:
        if args.harness_tasks:
            names = harness_tasks(args.harness_tasks)
            print(f"wrote {len(names)} tasks into {args.harness_tasks}: lm_eval run --model hf --model_args "
                  f"pretrained=EXPORT,dtype=float32 --include_path {args.harness_tasks} --tasks {' '.join(names)}")
            return 0
        page, twin = run_report(args.checkpoint, args.out)
    except KeyboardInterrupt:
        print("\ntransformer-course report: stopped (Ctrl-C); nothing was written", file=sys.stderr)
        return 130
    print(f"wrote {page} and {twin}")
    return 0


# ---------------------------------------------------------------- classroom (issue 12)
def _add_classroom(sub) -> None:
    p = _parser(sub, "student-edition", help="write the chapters with solutions removed, checks kept (teachers)",
                description="Write every chapter to OUT_DIR/chapters with each solution replaced by a stub and the "
                            "checks kept. Needs the course's `teacher` extra (nbformat).")
    p.add_argument("out_dir", help="directory to write the student notebooks into")
    p.add_argument("--chapters", default=None,
                   help="source chapters directory (default: the course's, from the clone or shipped in the package)")
    p.add_argument("--force", action="store_true",
                   help="overwrite files of the edition that changed since it wrote them (learners' edits are lost)")
    p.add_argument("--remove", action="store_true",
                   help="remove the edition's own unchanged files from OUT_DIR; keep everything learners wrote")
    p.set_defaults(handler=_cmd_student_edition)
    g = _parser(sub, "grade", help="run student notebooks and report exercises passed/failed/not done (teachers)",
                description="Run each notebook in a sandbox (bubblewrap: its own copy, no network, no root, limits) "
                            "and tabulate its exercises. "
                            "Needs the course's `teacher` extra (jupyter_client, ipykernel). Exit status: 0 every "
                            "notebook graded to its end, 1 some notebook could not be (its row says why: not a "
                            "notebook, a cell raised, the kernel died, timed out), 2 a usage error or no sandbox "
                            "(nothing was run).")
    g.add_argument("notebooks", nargs="+",
                   help="student notebooks (.ipynb), named ..._NN_chapter.ipynb, or folders of them")
    g.add_argument("--csv", default=None, help="also write the table as CSV to this file (written when all are graded; "
                                               "never a .ipynb or one of the notebooks)")
    g.add_argument("--timeout", type=_bounded_number("a number of seconds", 1, 86400, " (at most 86400, a day; there "
                                                     "is no 'no limit')"), default=1800,
                   help="seconds allowed for each whole notebook, every cell together (default 1800, at most 86400)")
    g.add_argument("--jobs", type=_whole_number("a number of notebooks graded at once", 1, 64), default=1,
                   help="grade this many notebooks at once, each in its own sandbox (default 1)")
    g.add_argument("--chapters", default=None,
                   help="the original chapters to grade against (default: the course's, from the clone or shipped in "
                        "the package)")
    g.add_argument("--no-sandbox", action="store_true",
                   help="run the notebooks without a sandbox, as you, where none can be made (know what you run)")
    g.set_defaults(handler=_cmd_grade)


# what the teacher's commands need beyond the runtime: pyproject.toml's `teacher` extra
TEACHER_EXTRA = {"student-edition": ("nbformat",), "grade": ("jupyter_client", "ipykernel")}


class MissingExtra(RuntimeError):
    """A command whose packages (an extra of the course) are not installed."""


def need_teacher_extra(command: str) -> None:
    """Refuse `command` at once, saying what to install, when a package it needs is missing (instead of a
    ModuleNotFoundError, or a grader that blames the sandbox)."""
    import importlib.util

    if missing := [name for name in TEACHER_EXTRA[command] if importlib.util.find_spec(name) is None]:
        everything = " ".join(name.replace("_", "-") for names in TEACHER_EXTRA.values() for name in names)
        raise MissingExtra(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed: "
                           f"{command} needs the course's `teacher` extra. Install the course with it (from a "
                           "clone: pip install \".[teacher]\"; from the repository: pip install "
                           f"\"transformer-course[teacher] @ git+URL\"), or add its packages: pip install {everything}")


def _cmd_student_edition(args) -> int:
    if not args.remove:  # removing reads the edition's manifest only
        need_teacher_extra("student-edition")
    from .classroom.edition import run_student_edition_command

    return run_student_edition_command(args)


def _cmd_grade(args) -> int:
    need_teacher_extra("grade")
    from .classroom.grading import run_grade_command

    return run_grade_command(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="transformer-course", formatter_class=_HelpFormatter,
        description="Build, train and sample a GPT from the transformer-course package.",
        epilog=_EXAMPLES.format(presets="\n".join(preset_lines())),
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                        help="print the version of the course's package and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_train(sub)
    _add_generate(sub)
    _add_chat(sub)
    _add_serve(sub)
    _add_export(sub)
    _add_report(sub)
    _add_classroom(sub)
    for name in ("train", "generate", "chat", "serve"):  # the commands that compute with PyTorch on the CPU
        sub.choices[name].add_argument(
            "--threads", type=int, default=None, metavar="N",
            help="PyTorch CPU threads (default: one per core idle at start, so a busy machine does not slow "
                 "every step down; runtime.set_threads)")
    return parser


def _interruptible() -> None:
    """A command started in the background by a shell script inherits SIGINT ignored, and Python then never
    raises KeyboardInterrupt: `kill -INT` (or a test's Ctrl-C) would be lost. Restore Python's handler, so
    every command stops on SIGINT with its one line and status 130, however it was started."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 0
    _interruptible()
    try:
        if "threads" in args:
            from .runtime import set_threads

            _check_threads(args.threads)
            set_threads(args.threads)
        return int(args.handler(args) or 0)
    except (ValueError, OSError, RuntimeError) as error:  # OSError: unreadable or unwritable files, full disks
        import os

        many = "RANK" in os.environ and os.environ.get("WORLD_SIZE", "1") != "1"
        rank = f" (rank {os.environ['RANK']})" if many else ""
        print(f"transformer-course {args.command}{rank}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
