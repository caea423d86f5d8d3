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


# ---------------------------------------------------------------- train (chapter 06)
def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train a character-level GPT on Shakespeare (chapter 06)")
    p.add_argument("--preset", default="tiny", help="model/training preset (see transformer_course.model.PRESETS)")
    p.add_argument("--out", required=True, help="directory for checkpoints and the loss history")
    p.add_argument("--max-iters", type=_positive_int, default=None, help="stop after this many steps")
    p.add_argument("--max-seconds", type=float, default=None, help="stop after this much wall time")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--device", default=None, help="cpu, cuda or mps (default: best available)")
    p.add_argument("--bf16", action="store_true",
                   help="bf16 autocast on the CPU too (faster only on CPUs with AVX512-BF16 or AMX; "
                        "a CUDA GPU uses bf16 without this flag)")
    p.set_defaults(handler=_cmd_train)


def _cmd_train(args) -> int:
    from .training import run_train_command

    return run_train_command(args)


# ---------------------------------------------------------------- generate (chapter 07)
def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="generate text from a checkpoint (chapter 07)")
    p.add_argument("--checkpoint", required=True, help="checkpoint file written by `transformer-course train`")
    p.add_argument("--prompt", required=True, help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=1.0, help="0 means greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--device", default=None)
    p.set_defaults(handler=_cmd_generate)


def _cmd_generate(args) -> int:
    from .generation import run_generate_command

    return run_generate_command(args)


# ---------------------------------------------------------------- classroom (issue 12)
def _add_classroom(sub) -> None:
    p = sub.add_parser("student-edition", help="write the chapters with solutions removed, checks kept")
    p.add_argument("out_dir", help="directory to write the student notebooks into")
    p.add_argument("--chapters", default=None, help="source chapters directory (default: the course's)")
    p.set_defaults(handler=_cmd_student_edition)
    g = sub.add_parser("grade", help="run student notebooks and report exercises passed/failed/not done")
    g.add_argument("notebooks", nargs="+", help="student notebooks (.ipynb)")
    g.add_argument("--csv", default=None, help="also write the table as CSV to this file")
    g.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell")
    g.set_defaults(handler=_cmd_grade)


def _cmd_student_edition(args) -> int:
    from .classroom import run_student_edition_command

    return run_student_edition_command(args)


def _cmd_grade(args) -> int:
    from .classroom import run_grade_command

    return run_grade_command(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="transformer-course",
        description="Build, train and sample a GPT from the transformer-course package.",
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_train(sub)
    _add_generate(sub)
    _add_classroom(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 0
    try:
        return int(args.handler(args) or 0)
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        print(f"transformer-course {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
