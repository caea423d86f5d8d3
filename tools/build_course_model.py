"""Rebuild the trained model the course ships: transformer_course/assets/shakespeare_char.pt and its
manifest (recipe, seed, losses, machine, SHA-256). About two minutes on a 2-core CPU.

    .venv/bin/python tools/build_course_model.py

The recipe is chapter 06's (`PRESETS["tiny"]`, `TRAIN_PRESETS["tiny"]`, float32, seed 1337); see
`transformer_course/course_model.py`.
"""

from transformer_course.course_model import build_course_model, manifest

if __name__ == "__main__":
    path = build_course_model()
    info = manifest()
    print(f"wrote {path} ({info['bytes']:,} bytes, {info['parameters']:,} parameters): val loss "
          f"{info['final_val_loss']} after {info['steps']} steps in {info['built']['wall_seconds']} s on "
          f"{info['built']['cpu']}")
