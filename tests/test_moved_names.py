"""Public names that moved say where they went (transformer_course/_moved.py, CHANGELOG.md)."""

import importlib
import re
from pathlib import Path

import pytest

from transformer_course import __version__
from transformer_course._moved import MOVED, MovedError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("module", "name"), [(m, n) for m, names in MOVED.items() for n in names])
def test_a_removed_name_names_its_replacement_on_import_and_on_access(module, name):
    release, instead = MOVED[module][name]
    with pytest.raises(MovedError, match=rf"{re.escape(module)}\.{name} was removed in {re.escape(release)}: use "):
        exec(f"from {module} import {name}", {})
    with pytest.raises(ImportError, match=re.escape(instead)):
        getattr(importlib.import_module(module), name)


def test_other_missing_names_stay_plain_attribute_errors():
    modern = importlib.import_module("transformer_course.modern")
    assert not hasattr(modern, "no_such_name")


def test_every_removal_is_in_the_changelog_and_the_version_is_past_it():
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    for module, names in MOVED.items():
        for name, (release, _) in names.items():
            assert f"`{module.removeprefix('transformer_course.')}.{name}`" in changelog, name
            assert tuple(map(int, __version__.split(".")[:3])) >= tuple(map(int, release.split("."))), __version__
    assert re.search(rf"^## {re.escape(__version__)}\b", changelog, re.M), "CHANGELOG.md: no section for this version"
