"""How long each chapter takes to run, relative to the others (one unit: about 15 s of one core of a
2-core CPU, one PyTorch thread; measured with `pytest --durations` on the student-edition runs).

Used only for scheduling, never asserted: `make test` starts the longest chapter runs first so its two
workers finish together (conftest.py), and the browser test splits the chapters into parallel jobs of
equal cost (tests/browser/lab_e2e.py). A chapter not listed counts as 1.
"""

from pathlib import Path

COSTS = {  # re-measured for chapter 11 (AMD EPYC, one thread, student-edition runs: 06 178 s, 11 122 s, 90 64 s)
    "01_tokenization": 1.5,
    "05_transformer_block": 2,
    "06_gpt_and_training": 12,
    "07_generation": 2.5,
    "08_pretrained_gpt2": 1.5,
    "09_encoder_decoder": 2.5,
    "10_modern_decoder": 2,
    "11_assistant": 8,
    "12_preferences_and_rewards": 6,  # estimated from its 178 s build on a loaded machine; re-measure
    "90_appendix_performance": 4.5,
}


def cost(name: str) -> float:
    """Relative run time of chapter `name` (a notebook name or path, with or without .ipynb)."""
    return COSTS.get(Path(name).stem, 1)
