"""Rebuild the trained models the course ships, in transformer_course/assets/: chapter 06's GPT
(shakespeare_char.pt) and chapter 09's encoder-decoder (dates_iso.pt), each with a manifest (recipe,
seeds, losses, machine, SHA-256). About three minutes on a 2-core CPU.

    .venv/bin/python tools/build_course_model.py            # both
    .venv/bin/python tools/build_course_model.py dates_iso  # one of them

The recipes are the chapters' own; see `transformer_course/course_model.py`.
"""

import sys

from transformer_course.course_model import build_course_model, build_dates_model, manifest

BUILDERS = {"shakespeare_char": build_course_model, "dates_iso": build_dates_model}

if __name__ == "__main__":
    names = sys.argv[1:] or list(BUILDERS)
    unknown = sorted(set(names) - set(BUILDERS))
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; choose from {sorted(BUILDERS)}")
    for name in names:
        path = BUILDERS[name]()
        info = manifest(name)
        print(f"wrote {path} ({info['bytes']:,} bytes, {info['parameters']:,} parameters) in "
              f"{info['built']['wall_seconds']} s on {info['built']['cpu']}")
