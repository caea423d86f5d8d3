"""The grader's sandbox holds against a hostile notebook (issue 39): each probe of the issue is a cell that
tries the attack and records whether it got through. Every probe runs in one sandboxed kernel (one ~3 s
notebook); the last cell raises with the record, so the grade's error carries it back (nothing the
notebook prints is read). The probes only try to open what would be dangerous to write: nothing is ever
written to /proc/sys, /proc/sysrq-trigger or /dev/kmsg, so a broken sandbox harms nothing."""

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import nbformat
import pytest
from test_grading import SANDBOX, handed_in, solve, toy_chapter

from transformer_course.classroom import sandbox
from transformer_course.classroom.grading import format_table, grade_notebooks

ROOT = Path(__file__).resolve().parents[1]
# What a kernel may see of the clone: the package, and the interpreter where it lives inside the clone (a venv
# named .venv, or .venv-torch-2.7.0 in make test-torch-floor), bound read-only for the kernel to run at all.
BOUND_IN_CLONE = {"transformer_course"} | {
    Path(os.path.realpath(prefix)).relative_to(ROOT).parts[0]
    for prefix in {sys.prefix, sys.exec_prefix}
    if Path(os.path.realpath(prefix)).is_relative_to(ROOT) and Path(os.path.realpath(prefix)) != ROOT}
needs_sandbox = pytest.mark.skipif(not SANDBOX, reason=f"no sandbox here: {sandbox.sandbox_problem()}")

PROBE_SETUP = '''import json, os, socket
leaked = {}
def probe(name, attempt):
    """leaked[name]: what got through (``attempt()`` is true when it did), or "" when it was stopped."""
    try:
        got = attempt()
        leaked[name] = str(got) if got else ""
    except (OSError, MemoryError):
        leaked[name] = ""
def open_for_writing(path):  # opened, never written
    os.close(os.open(path, os.O_WRONLY))
    return "opened for writing"
'''


NESTED_USERNS = """import ctypes
def nested_user_namespace():
    pid = os.fork()  # in a child: the kernel itself stays as it is
    if pid == 0:
        os._exit(0 if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) == 0 else 1)  # CLONE_NEWUSER
    return os.waitpid(pid, 0)[1] == 0 and "made one"
probe('nested_userns', nested_user_namespace)"""
FORKS = """import signal, time
def forks():
    children = []
    try:
        for _ in range(300):
            pid = os.fork()
            if pid == 0:
                time.sleep(600)
                os._exit(0)
            children.append(pid)
        return len(children)
    finally:  # room again for the kernel's own threads
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
probe('processes', forks)"""


def probes(classmate: Path, secret: Path, unix_socket: Path) -> list[str]:
    """The issue's attacks, a cell for each kind (the limits last)."""
    return [
        PROBE_SETUP,
        f"probe('classmate', lambda: open({str(classmate)!r}).read(10))\n"
        f"probe('classmate_here', lambda: open({classmate.name!r}).read(10))",
        f"probe('answer_key', lambda: open({str(ROOT / 'chapters' / '03_single_head_attention.ipynb')!r}).read(10))\n"
        f"probe('clone', lambda: set(os.listdir({str(ROOT)!r})) - {BOUND_IN_CLONE!r})",
        f"probe('teacher_file', lambda: open({str(secret)!r}).read())",
        "probe('shadow', lambda: open('/etc/shadow').read(10))\n"
        "probe('etc', lambda: {'shadow', 'ssh', 'hostname', 'machine-id'} & set(os.listdir('/etc'))"
        " or 'root:' in open('/etc/passwd').read())\n"
        "assert socket.gethostbyname('localhost') == '127.0.0.1'  # the sandbox's own /etc/hosts (torchrun)",
        "probe('hostname', lambda: open_for_writing('/proc/sys/kernel/hostname'))\n"
        "probe('core_pattern', lambda: open_for_writing('/proc/sys/kernel/core_pattern'))\n"
        "probe('sysrq', lambda: open_for_writing('/proc/sysrq-trigger'))\n"
        "probe('kmsg', lambda: open_for_writing('/dev/kmsg'))\n"
        "probe('sys', lambda: open_for_writing('/sys/kernel/uevent_helper'))",
        "probe('devices', lambda: sorted(set(os.listdir('/dev')) - {'null', 'zero', 'full', 'random', 'urandom', "
        "'tty', 'ptmx', 'pts', 'shm', 'fd', 'stdin', 'stdout', 'stderr', 'core', 'mqueue'}))",
        f"probe('unix_socket', lambda: socket.socket(socket.AF_UNIX).connect({str(unix_socket)!r}) or 'connected')\n"
        "probe('run', lambda: os.listdir('/run'))\nprobe('tcp', lambda: socket.create_connection(('1.1.1.1', 53), 2))",
        "probe('root', lambda: os.getuid() == 0 or None)\n"
        "probe('capabilities', lambda: [l for l in open('/proc/self/status') if l.startswith('CapEff')"
        " and int(l.split()[1], 16)])\n"
        "probe('host_root', lambda: [l for l in open('/proc/self/uid_map') if l.split()[1] == '0'])\n"
        "probe('cwd', lambda: (os.getcwd(), sorted(os.listdir('.'))) != ('/course/chapters', ['me_03_toy.ipynb']) "
        "and (os.getcwd(), os.listdir('.')))",
        NESTED_USERNS,
        "probe('memory', lambda: len(bytearray(3 * 2**30)))",
        FORKS,
        "raise RuntimeError('PROBES ' + json.dumps({k: v[:12] for k, v in leaked.items() if v}))",
    ]


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """The record of every probe, as {probe: what got through} (empty: all stopped), and the grade."""
    tmp = tmp_path_factory.mktemp("probe")
    chapters, subs = tmp / "chapters", tmp / "submissions"
    chapters.mkdir()
    subs.mkdir()
    nbformat.write(toy_chapter(), chapters / "03_toy.ipynb")
    classmate = handed_in(subs, "bob_03_toy.ipynb", solve)
    secret = tmp / "teacher-secret.txt"
    secret.write_text("the teacher's")
    secret.chmod(0o600)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp / "agent.sock"))  # as a session bus or an agent socket the teacher can reach
    server.listen()
    me = handed_in(subs, "me_03_toy.ipynb", solve, probes(classmate, secret, tmp / "agent.sock"))
    (grade,) = grade_notebooks([me], timeout=120, chapters_dir=chapters, sandbox=True,
                               limits={"processes": 100, "memory": 2 * 2**30})
    server.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        server.accept()
        pytest.fail("a notebook reached the teacher's Unix socket")
    server.close()
    found = re.search(r"raised RuntimeError: PROBES (\{.*\})$", grade.error)
    assert found, format_table([grade])  # every probe cell ran
    return json.loads(found.group(1)), grade


@needs_sandbox
@pytest.mark.parametrize("case", [
    "classmate", "classmate_here", "answer_key", "clone", "teacher_file",  # 1: reads
    "shadow", "etc",
    "hostname", "core_pattern", "sysrq", "kmsg", "sys", "devices", "root", "capabilities", "host_root",  # 2: root
    "unix_socket", "run", "tcp",  # 3: sockets
    "nested_userns",  # root in a user namespace of its own: more of the kernel to attack
    "processes", "memory",  # 4: limits
    "cwd",  # 5: the kernel works in its own copy, not beside the answer key or the classmates
])
def test_the_sandbox_stops_the_probe(probed, case):
    leaked, grade = probed
    assert case not in leaked, f"{case}: {leaked[case]} ({format_table([grade])})"


@needs_sandbox
def test_the_probe_notebook_still_grades(probed):
    assert probed[1].exercises == {"3.1": "passed", "3.2": "passed"}


def test_the_command_keeps_nothing_of_the_host_but_what_a_kernel_needs(tmp_path):
    """The bwrap command line: no host socket folder, home or clone bound; the answer key covered where a
    bound folder holds it; as root, the sandbox becomes nobody before its user namespace."""
    command = sandbox.sandbox_command(9, "a_03_x.ipynb", ROOT / "benchmarks" / "results",
                                      hidden=[str(ROOT / "chapters")], features={"--size", "--perms", "--clearenv"})
    bound = {command[i + 1] for i, part in enumerate(command) if part in ("--ro-bind", "--bind", "--dev-bind")}
    assert not bound & {"/run", "/var/run", "/tmp", "/home", "/root", "/etc", str(ROOT), str(ROOT / "chapters")}
    # a clone (or its venv) may itself live under /tmp: its own files are bound from there, nothing else is
    ours = (str(ROOT), os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix))
    assert not any(path.startswith(("/run/", "/tmp/", "/var/run/"))
                   and not any(os.path.realpath(path) == o or os.path.realpath(path).startswith(o + os.sep)
                               for o in ours) for path in bound), bound
    assert {"--unshare-net", "--unshare-pid", "--die-with-parent", "--new-session", "--clearenv"} <= set(command)
    assert command[command.index("--file") + 1:command.index("--file") + 3] == ["9", "/course/chapters/a_03_x.ipynb"]
    if os.geteuid() == 0:
        drop = command.index("--reuid")
        assert command[drop + 1] == "65534" and "--bounding-set=-all" in command and "--no-new-privs" in command
        assert command.index("--unshare-user") > drop  # the user namespace is made by nobody, mapped to nobody
    else:
        assert "--unshare-user" in command and "setpriv" not in " ".join(command)
    assert command[command.index("--uid") + 1] == "65534"
    # an answer key inside a bound folder (a wheel ships the chapters in the package) is covered by a tmpfs
    inside = os.path.realpath(os.path.join(sys.prefix, "lib"))
    covered = sandbox.sandbox_command(9, "a.ipynb", None, hidden=[inside], features={"--perms"})
    assert covered[covered.index(inside) - 1] == "--tmpfs", covered


def test_a_hand_ins_name_never_becomes_a_path():
    assert sandbox.safe_name("../../etc/passwd") == "passwd"
    assert sandbox.safe_name("a b\n\x1b.ipynb") == "a_b__.ipynb"
    assert sandbox.safe_name("...") == "notebook.ipynb"


def test_without_bubblewrap_the_grader_names_the_package(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    problem = sandbox.sandbox_problem()
    assert "bubblewrap" in problem and "apt install bubblewrap" in problem, problem
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(sandbox, "_bwrap_features", lambda: {"--clearenv"})  # bubblewrap 0.4
    assert "older than 0.5" in sandbox.sandbox_problem()


def test_a_refused_user_namespace_names_the_kernel_setting(monkeypatch):
    monkeypatch.setattr(sandbox, "run_cells", lambda *a, **k: {
        "records": [], "cells_run": 0,
        "error": "the grading process ended without an answer (bwrap: No permissions to create new namespace)"})
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(sandbox, "_bwrap_features", lambda: {"--perms", "--size", "--clearenv"})
    problem = sandbox.sandbox_problem()
    assert "user.max_user_namespaces" in problem and "kernel.unprivileged_userns_clone" in problem, problem


# ------------------------------------------------------------------ the same, as an unprivileged user

UNPRIVILEGED_PROBE = '''import os, sys
sys.path.insert(0, ROOT)
# the grader itself: the teacher's uid, no capabilities, so no namespace it makes can map to host root
host = [line.split()[1:2] for line in open("/proc/self/status") if line.startswith(("Uid", "CapEff"))]
assert host == [["65534"], ["0000000000000000"]], host
from transformer_course.classroom.sandbox import run_cells
CELL = """import os
caps = [line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff")]
assert os.getuid() == 65534 and caps == ["0000000000000000"], (os.getuid(), caps)
for path in ("/proc/sys/kernel/hostname", "/proc/sys/kernel/core_pattern", "/etc/shadow"):
    try:
        os.close(os.open(path, os.O_WRONLY))
    except OSError:
        continue
    raise SystemExit(path + " opened for writing")"""
answer = run_cells([(0, CELL)], timeout=60)
assert answer["isolated"] and not answer["error"] and answer["cells_run"] == 1, answer
'''


def test_an_interpreter_under_tmp_is_bound_over_the_empty_tmp(monkeypatch):
    """A venv in /tmp must stay visible: its bind comes after the tmpfs that empties /tmp."""
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp, tempfile.TemporaryDirectory(dir="/var/tmp") as var:
        venvs = [os.path.join(tmp, "venv"), os.path.join(var, "venv")]
        for venv in venvs:
            os.mkdir(venv)
        monkeypatch.setattr(sandbox, "runtime_paths", lambda hidden=(): venvs)
        args = sandbox.sandbox_command(3, "me_03_toy.ipynb", None, features={"--perms", "--size", "--clearenv"})
    pairs = list(zip(args, args[1:], strict=False))
    for scratch, venv in zip(("/tmp", "/var/tmp"), venvs, strict=True):
        assert pairs.index(("--tmpfs", scratch)) < pairs.index(("--dir", os.path.dirname(venv))) \
            < pairs.index(("--ro-bind", venv)), args
    assert ("--dir", "/tmp") not in pairs and ("--dir", "/var/tmp") not in pairs, args


def _as_nobody(*command: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", *command],
                          capture_output=True, text=True, **kwargs)


def _runs_as_nobody(python: str) -> bool:
    real = os.path.realpath(python)
    check = f"import os, transformer_course, jupyter_client; assert os.path.exists({real!r})"
    return _as_nobody(python, "-c", check, timeout=120).returncode == 0


@contextlib.contextmanager
def _python_for_nobody():
    """An interpreter uid 65534 can run with this venv's packages: this one, or (when it lives where only
    root can read, such as /root/.pyenv) a venv of the system's Python of the same version, in /tmp (which
    the sandbox covers with an empty tmpfs, under the interpreter's bind), reading this venv's site-packages."""
    if _runs_as_nobody(sys.executable):
        yield sys.executable
        return
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if not system.exists():
        pytest.skip(f"uid 65534 cannot read this Python ({os.path.realpath(sys.executable)}) and there is no "
                    f"{system} to stand in: install Python where every user can read it to run this test")
    folder = Path(tempfile.mkdtemp(prefix="python-for-nobody-", dir="/tmp"))
    try:
        subprocess.run([str(system), "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
        packages = sysconfig.get_paths()["purelib"]
        site = subprocess.run([str(folder / "bin" / "python"), "-c", "import sysconfig; "
                               "print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True,
                              check=True).stdout.strip()
        Path(site, "course.pth").write_text(f"import site; site.addsitedir({packages!r})\n")
        for path in [folder, *(p for p in folder.rglob("*") if not p.is_symlink())]:  # not the system's python
            path.chmod(path.stat().st_mode | 0o444 | (0o111 if path.is_dir() else 0))
        python = str(folder / "bin" / "python")
        if not _runs_as_nobody(python):
            pytest.skip(f"uid 65534 cannot run {python} with this venv's packages (a folder above {ROOT} or "
                        f"{packages} it cannot enter?)")
        yield python
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@needs_sandbox
@pytest.mark.system
def test_the_sandbox_holds_for_an_unprivileged_grader():
    """A teacher without root: the sandbox is bwrap's user namespace mapped to the teacher; same probes."""
    if os.geteuid() != 0:
        pytest.skip("the tests already run as an unprivileged user")
    if shutil.which("setpriv") is None:
        pytest.skip("no setpriv (util-linux) to become uid 65534")
    folder = Path(tempfile.mkdtemp(prefix="grade-as-nobody-"))  # not under pytest's 0700 folder
    folder.chmod(0o755)
    script = folder / "probe.py"
    script.write_text(UNPRIVILEGED_PROBE.replace("ROOT", repr(str(ROOT)), 1))
    try:
        with _python_for_nobody() as python:
            result = _as_nobody(python, str(script), timeout=300, cwd=folder, env={**os.environ, "HOME": str(folder)})
    finally:
        shutil.rmtree(folder)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("sandboxed", [pytest.param(True, marks=needs_sandbox), False])
def test_the_kernel_works_in_a_copy_with_the_course_data_one_level_up(sandboxed):
    """Wherever the hand-in lies (one folder per learner works): its copy alone, ../benchmarks/results beside."""
    results = ROOT / "benchmarks" / "results"
    cell = ("import os\nraise RuntimeError(repr((os.listdir('.'), open('x_04_y.ipynb').read(), "
            f"sorted(os.listdir('../benchmarks/results')) == {sorted(os.listdir(results))!r})))")
    answer = sandbox.run_cells([(0, cell)], hand_in=b'{"mine": 1}', name="x_04_y.ipynb",
                               course_data=results, timeout=60, sandbox=sandboxed)
    assert answer["error"].endswith("""RuntimeError: (['x_04_y.ipynb'], '{"mine": 1}', True)"""), answer


def test_a_stricter_hard_limit_of_the_machine_is_kept_not_raised():
    """Under `ulimit -v 6000000` or `ulimit -u 200` (a shared server) the sandbox's worker keeps the lower
    limit instead of failing to raise it; where the machine allows more, the sandbox's own limit applies."""
    code = ("import resource, sys; from transformer_course.classroom.sandbox import confine; "
            "confine({'memory': 8 * 2**30, 'processes': 10**6}); "
            "print(resource.getrlimit(resource.RLIMIT_AS)[1], resource.getrlimit(resource.RLIMIT_NPROC)[1])")

    def strict():
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (6_000_000 * 1024,) * 2)
        resource.setrlimit(resource.RLIMIT_NPROC, (5000, 5000))

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=strict, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(6_000_000 * 1024), "5000"]
    free = subprocess.run([sys.executable, "-c", code.replace("10**6", "300")], capture_output=True, text=True,
                          timeout=60, check=True)
    assert free.stdout.split()[1] == "300"
