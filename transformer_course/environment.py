"""What the course needs installed, and whether this environment has it (hand-written, not exported).

Chapter 00 prints one verdict per package rather than the versions themselves, so its stored output is
the same on every supported PyTorch; the exact versions are shown in a cell nbval does not compare.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, requires, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

DISTRIBUTION = "transformer-course"
_PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


@dataclass(frozen=True)
class Installed:
    """One requirement of the course: the package, what the course needs, what is installed (None: absent)."""

    package: str
    needed: SpecifierSet
    version: str | None

    @property
    def ok(self) -> bool:
        return self.version is not None and self.needed.contains(self.version, prereleases=True)

    def verdict(self) -> str:
        """'✓ torch', or a line that says what is wrong and how to fix it."""
        if self.ok:
            return f"✓ {self.package}"
        found = "not installed" if self.version is None else f"{self.version} installed"
        return f"✗ {self.package}: {found}, the course needs {self.needed}; run `make lab` again to install it"


def course_requirements() -> list[Requirement]:
    """The course's own runtime requirements: from the installed package's metadata, or, in a source tree
    used without installing it (PYTHONPATH), from the pyproject.toml beside the package."""
    try:
        lines = requires(DISTRIBUTION) or []
    except PackageNotFoundError:
        if not _PYPROJECT.is_file():
            raise RuntimeError(f"{DISTRIBUTION} is neither installed nor a source tree with pyproject.toml: "
                               "install it with `make lab` or `pip install -e .`") from None
        lines = tomllib.loads(_PYPROJECT.read_text(encoding="utf-8"))["project"]["dependencies"]
    return [r for r in map(Requirement, lines) if r.marker is None]


def check_requirements() -> list[Installed]:
    """Every runtime requirement of the course with the version installed here."""
    rows = []
    for requirement in course_requirements():
        try:
            found = version(requirement.name)
        except PackageNotFoundError:
            found = None
        rows.append(Installed(requirement.name, requirement.specifier, found))
    return rows
