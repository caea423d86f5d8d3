"""Install PyTorch into an environment only when it lacks a supported one; prefer the CPU build where no
NVIDIA GPU can use the CUDA one.

    python tools/install_torch.py                 # what `make lab` and `make test` run, with .venv's python
    python tools/install_torch.py --spec torch==2.6.0 --exact   # CI: exactly this release
    TORCH_SPEC="torch==2.13.0" TORCH_PIP_ARGS="--index-url URL" make lab   # your own choice, passed to pip

Rules, in order:
1. A torch already installed that `pyproject.toml` admits is kept (a learner keeps the torch they have),
   unless `--exact` asks for another release.
2. `TORCH_SPEC` / `--spec` (default: the release the course's stored outputs were made with, or on a
   Python too new for it the first release built for that Python) is installed
   with `TORCH_PIP_ARGS` / `--pip-args` added to pip's command line.
3. On Linux without an NVIDIA GPU, PyPI's default torch is the CUDA build (about 3.5 GB with its CUDA
   libraries) that such a machine cannot use: the CPU build is taken from PyTorch's CPU index first (about
   0.2 GB), and PyPI only if that index cannot be reached (then the download is large, and this says so).
   macOS and Windows get PyPI's build, which is the right one there (MPS / CPU).
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SPEC = "torch==2.13.0"  # the release the chapters' stored outputs were made with
# the first torch with wheels for a Python newer than DEFAULT_SPEC's (read off PyPI's wheels, 2026-11)
NEWER_PYTHONS = {(3, 15): "torch>=2.15"}


def default_spec(python: tuple[int, int] = sys.version_info[:2]) -> str:
    """DEFAULT_SPEC, or the first release built for a Python that DEFAULT_SPEC has no wheel for."""
    return next((spec for version, spec in sorted(NEWER_PYTHONS.items(), reverse=True) if python >= version),
                DEFAULT_SPEC)
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def supported_range() -> str:
    """The torch specifier of pyproject.toml, e.g. '>=2.6'."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    line = next(d for d in deps if d.replace(" ", "").startswith("torch") and d[5:6] in "<>=!~ ")
    return line.split("#")[0].strip()[len("torch"):].strip()


def installed_torch() -> str | None:
    """The version of torch in this interpreter's environment, or None (read without importing torch)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def has_nvidia_gpu() -> bool:
    return Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None


def reachable(url: str, seconds: float = 10) -> bool:
    """Whether `url` answers at all (a quick look before handing pip an index it would retry for minutes)."""
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=seconds):
            return True
    except OSError:
        return False


def pip_commands(spec: str, extra: list[str], system: str, nvidia: bool, cpu_index: bool) -> list[list[str]]:
    """The pip command lines to try in order (the first that succeeds wins). `cpu_index`: whether
    PyTorch's CPU index can be reached from here."""
    base = [sys.executable, "-m", "pip", "install", "--quiet", spec]
    if extra or system != "Linux" or nvidia or not cpu_index:
        return [base + extra]
    return [base + ["--index-url", CPU_INDEX, "--timeout", "20", "--retries", "1"], base]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=os.environ.get("TORCH_SPEC") or default_spec())
    parser.add_argument("--pip-args", default=os.environ.get("TORCH_PIP_ARGS", ""))
    parser.add_argument("--exact", action="store_true", help="install --spec even if a supported torch is there")
    args = parser.parse_args(argv)
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    supported = SpecifierSet(supported_range())
    have = installed_torch()
    wanted = Requirement(args.spec)
    if have and supported.contains(have, prereleases=True) and (not args.exact or wanted.specifier.contains(have)):
        print(f"PyTorch {have} is installed and supported (the course needs torch{supported}): kept")
        return 0
    if have:
        print(f"PyTorch {have} is installed but the course needs torch{supported}: installing {args.spec}")
    system, nvidia, extra = platform.system(), has_nvidia_gpu(), shlex.split(args.pip_args)
    cpu_index = system == "Linux" and not nvidia and not extra and reachable(CPU_INDEX + "/torch/")
    if cpu_index:
        where = "the CPU build, from PyTorch's CPU index"
    elif system == "Linux" and not nvidia and not extra:
        where = (f"PyTorch's CPU index ({CPU_INDEX}) cannot be reached from here, so from the default index; "
                 "on PyPI the Linux build bundles CUDA: several GB")
    else:
        where = "with your pip options" if extra else "from the default index"
    print(f"installing PyTorch {args.spec} ({where}); this takes a minute or more", flush=True)
    commands = pip_commands(args.spec, extra, system, nvidia, cpu_index)
    for number, command in enumerate(commands):
        if subprocess.run(command).returncode == 0:
            print(f"PyTorch {installed_torch()} installed")
            return 0
        if number + 1 < len(commands):
            print(f"the CPU build was not installed from {CPU_INDEX}: taking {args.spec} from the default index "
                  "instead (on PyPI the Linux build bundles CUDA: several GB)", flush=True)
    print(f"could not install {args.spec} for Python {platform.python_version()}. If PyTorch has no build for "
          "this Python yet, use a Python it supports (docs/maintainers.md: 'PyTorch and Python'), or choose a "
          "release with TORCH_SPEC and pip's options with TORCH_PIP_ARGS", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
