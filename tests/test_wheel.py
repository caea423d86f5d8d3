"""The course as `pip install` gives it: a wheel built from this tree, installed into a new virtual
environment that holds nothing but PyTorch, runs every command of `transformer-course`.

PyTorch is not installed again (a multi-GB download on some machines): the new environment sees the torch of
the environment running the tests, and only it and what it requires, through a .pth file pointing at a folder
of links. Everything else comes from the wheel's declared dependencies (pip, from the package index or its
cache), so a dependency missing from pyproject.toml fails here. Run from a scratch folder, so nothing of the
clone (chapters/, the source package) can be picked up by accident.
"""

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.system  # about 1-2 minutes: a build, two installs, a training run and the commands


def _torch_and_its_requirements() -> list[importlib.metadata.Distribution]:
    """The torch distribution of this environment and, recursively, what it requires (on this platform)."""
    found, todo = {}, ["torch"]
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in found:
            continue
        found[key] = dist = importlib.metadata.distribution(name)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(found.values())


def _link_torch(site_packages: Path, folder: Path) -> None:
    """Make torch (and only it, with its requirements) importable in another environment: links to their
    files and metadata in `folder`, which a .pth file in `site_packages` puts on the path."""
    folder.mkdir()
    for dist in _torch_and_its_requirements():
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            source = Path(dist.locate_file(top))
            if source.exists() and not (folder / top).exists() and top != "__pycache__":
                (folder / top).symlink_to(source)
    (site_packages / "_torch_only.pth").write_text(f"{folder}\n")


def _copy_source(target: Path) -> Path:
    """What the wheel is built from: the project's files, without caches, builds or local checkpoints."""
    junk = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "checkpoints", ".ipynb_checkpoints")
    target.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, target / name)
    for name in ("transformer_course", "chapters", "benchmarks/results"):
        shutil.copytree(ROOT / name, target / name, ignore=junk)
    return target


def _assert_build_requirements_installed() -> None:
    """The wheel is built without build isolation (no download), so this environment must already hold what
    pyproject.toml's build-system asks for: the dev extra names it, and `make install-dev` installs it."""
    for line in tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]:
        need = Requirement(line)
        try:
            have = importlib.metadata.version(need.name)
        except importlib.metadata.PackageNotFoundError:
            have = None
        assert have is not None and need.specifier.contains(have, prereleases=True), (
            f"building the wheel needs {need} (pyproject.toml's build-system); this environment has "
            f"{need.name} {have}: run `make install-dev` (the dev extra installs it)")


def _install(work: Path):
    """Build the wheel and install it into a new environment beside torch alone: (run, wheel, pip, work, python),
    run a function running `transformer-course` there, pip one installing into it."""
    source = _copy_source(work / "source")
    _assert_build_requirements_installed()
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                            "-w", str(work / "dist"), "-q"], capture_output=True, text=True, cwd=work)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = (work / "dist").glob("transformer_course-*.whl")
    env = work / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    _link_torch(purelib, work / "torch_only")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "TRANSFORMER_COURSE"))}
    clean |= {"OMP_NUM_THREADS": "1", "TRANSFORMER_COURSE_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}

    def pip(*args):
        # this environment's pip, installing into the new one (which has none of its own)
        done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", *args],
                              capture_output=True, text=True, cwd=work, env=clean)
        assert done.returncode == 0, done.stderr[-3000:]

    def run(*args, stdin="", timeout=300):
        command = [str(env / "bin" / "transformer-course"), *args]
        return subprocess.run(command, input=stdin, capture_output=True, text=True, cwd=work, env=clean,
                              timeout=timeout)

    pip(str(wheel))
    return run, wheel, pip, work, python


def _the_wheel_holds_every_module_and_the_chapters(installed):
    _, wheel, *_ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "transformer_course").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert modules - names == set(), "pyproject.toml's packages miss these"
    assets = {p.relative_to(ROOT).as_posix() for p in (ROOT / "transformer_course/assets").glob("*.*")}
    assert assets - names == set()
    chapters = {f"transformer_course/_course/chapters/{p.name}" for p in (ROOT / "chapters").glob("[0-9][0-9]_*.ipynb")}
    assert len(chapters) >= 12 and chapters - names == set()
    assert "transformer_course/_course/benchmarks/results/attention.json" in names


def _only_torch_was_beside_it_and_the_declared_dependencies_came_from_the_wheel(installed):
    *_, python = installed
    code = ("import importlib.util as u, torch, transformer_course as t; "
            "print(torch.__version__, t.__file__, [m for m in ('nbformat', 'jupyter_client', 'pytest') "
            "if u.find_spec(m)])")
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True,
                         cwd=installed[3]).stdout
    assert "site-packages" in out and str(ROOT) not in out, out  # the installed package, not the clone
    assert out.rstrip().endswith("[]"), out  # the teacher extra is not installed yet, nor the test tools


def _help_and_version(installed):
    run, wheel, *_ = installed
    out = run("--help")
    assert out.returncode == 0, out.stderr
    assert "Examples:" in out.stdout and re.search(r"tiny\s+4 layers x 4 heads", out.stdout), out.stdout
    version = wheel.name.split("-")[1]
    out = run("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"transformer-course {version}"
    for command in ("train", "generate", "chat", "student-edition", "grade"):
        out = run(command, "--help")
        assert out.returncode == 0 and "usage: transformer-course" in out.stdout, (command, out.stderr)


def _train_generate_and_chat(installed):
    run, _, _, work, _ = installed
    out = run("train", "--preset", "tiny", "--out", "run", "--max-iters", "2", "--eval-iters", "1", "--device", "cpu")
    assert out.returncode == 0, out.stderr[-3000:]
    assert (work / "run" / "checkpoint.pt").is_file()
    assert "step 2/2: running loss" in out.stdout  # not a terminal: plain lines, not a bar
    out = run("generate", "--checkpoint", "run/checkpoint.pt", "--prompt", "ROMEO:", "--max-new-tokens", "20")
    assert out.returncode == 0 and out.stdout.startswith("ROMEO:"), out.stderr[-3000:]
    out = run("generate", "--prompt", "ROMEO:", "--max-new-tokens", "20")  # the shipped model
    assert out.returncode == 0 and out.stdout.startswith("ROMEO:"), out.stderr[-3000:]
    out = run("chat", stdin="upper: stars\n")
    assert out.returncode == 0 and out.stdout.startswith("assistant: "), out.stderr[-3000:]


def _teacher_commands_name_the_extra_then_work_with_it(installed):
    run, wheel, pip, work, _ = installed
    out = run("student-edition", "edition")
    assert out.returncode == 2, out.stderr
    assert "nbformat is not installed" in out.stderr and "`teacher` extra" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and not (work / "edition").exists()
    out = run("grade", "missing.ipynb")
    assert out.returncode == 2 and "`teacher` extra" in out.stderr and "Traceback" not in out.stderr, out.stderr

    pip(f"{wheel}[teacher]")
    out = run("student-edition", "edition")
    assert out.returncode == 0, out.stderr[-3000:]
    notebooks = sorted(p.name for p in (work / "edition" / "chapters").glob("*.ipynb"))
    assert notebooks == sorted(p.name for p in (ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
    assert (work / "edition" / "benchmarks" / "results" / "attention.json").is_file()  # chapter 04 reads it
    out = run("grade", "--help")
    assert out.returncode == 0 and "teacher" in out.stdout


def test_the_installed_wheel_runs_every_command(tmp_path):
    """One test, not five sharing a fixture: under pytest-xdist a module's tests may go to both workers, and
    each would build and install its own wheel."""
    installed = _install(tmp_path)
    _the_wheel_holds_every_module_and_the_chapters(installed)
    _only_torch_was_beside_it_and_the_declared_dependencies_came_from_the_wheel(installed)
    _help_and_version(installed)
    _train_generate_and_chat(installed)
    _teacher_commands_name_the_extra_then_work_with_it(installed)
