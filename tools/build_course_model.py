"""Rebuild the trained models the course ships, in transformer_course/assets/: chapter 06's GPT
(shakespeare_char.pt), chapter 09's encoder-decoder (dates_iso.pt), chapter 11's chat model (trained on
conversations of 1-3 exchanges) and LoRA adapter (shakespeare_chat.pt, shakespeare_chat_lora.pt), chapter
12's DPO and GRPO models, each with a manifest (recipe, seeds, losses, machine, SHA-256). About half an
hour on a 2-core CPU.

    .venv/bin/python tools/build_course_model.py            # all, in order
    .venv/bin/python tools/build_course_model.py dates_iso  # one of them

The recipes are the chapters' own; see `transformer_course/course_model.py`.
"""

import sys

from transformer_course.course_model import (
    build_chat_models,
    build_course_model,
    build_dates_model,
    build_lora_adapter,
    build_preference_models,
    manifest,
)

# shakespeare_chat and its LoRA adapter start from shakespeare_char, and chapter 12's DPO and GRPO models
# (shakespeare_preferences) from shakespeare_chat: rebuild in this order
BUILDERS = {"shakespeare_char": build_course_model, "dates_iso": build_dates_model,
            "shakespeare_chat": build_chat_models, "shakespeare_chat_lora": build_lora_adapter,
            "shakespeare_preferences": build_preference_models}

if __name__ == "__main__":
    names = sys.argv[1:] or list(BUILDERS)
    unknown = sorted(set(names) - set(BUILDERS))
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; choose from {sorted(BUILDERS)}")
    for name in names:
        path = BUILDERS[name]()
        info = manifest("shakespeare_dpo" if name == "shakespeare_preferences" else name)
        print(f"wrote {path} ({info['bytes']:,} bytes, {info['parameters']:,} parameters) in "
              f"{info['built']['wall_seconds']} s on {info['built']['cpu']}")
