"""Public names that moved or were removed, and where they went (hand-written; CHANGELOG.md lists them).

A module named here ends with a ``__getattr__`` that ``tools/nb.py export`` writes: code written against
an older release then fails with an ImportError that names the replacement, instead of a bare "has no
attribute". Keep an entry for at least one minor version after the change.
"""

from __future__ import annotations

# module -> {old name: (release that removed it, what to use instead)}
MOVED: dict[str, dict[str, tuple[str, str]]] = {
    "transformer_course.modern": {
        "GroupedQueryAttention": ("0.2.0", "transformer_course.multihead.MultiHeadAttention(d_model, n_head, "
                                  "n_kv_head=..., rope=...): n_kv_head is keyword-only there (the third "
                                  "positional argument is dropout)"),
        "ModernBlock": ("0.2.0", "transformer_course.block.TransformerBlock(d_model, n_head, ..., make_norm=..., "
                        "mlp=...), or transformer_course.modern.build_gpt(GPTConfig(...)) for a whole model"),
    },
}


class MovedError(ImportError):
    """A public name that was removed: the message names what to use instead. An ImportError, so that
    ``from module import name`` shows the message (Python replaces an AttributeError there by its own)."""


def moved(module: str, name: str) -> Exception:
    """The error for ``module.name``: where it went when it moved, else Python's usual AttributeError."""
    entry = MOVED.get(module, {}).get(name)
    if entry is None:
        return AttributeError(f"module {module!r} has no attribute {name!r}")
    release, instead = entry
    return MovedError(f"{module}.{name} was removed in {release}: use {instead} (see CHANGELOG.md)",
                      name=module)
