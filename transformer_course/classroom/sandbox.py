"""Run one handed-in notebook for the grader, in a fresh kernel inside a bubblewrap sandbox (hand-written).

The grader (``grading.py``) calls :func:`run_cells` once per notebook. It starts
``python -m transformer_course.classroom.sandbox run`` inside the sandbox, sends the notebook's code
cells on stdin and reads one JSON answer on a pipe of its own (the kernel never holds that pipe, and the
worker that writes it is not dumpable, so the kernel cannot reach it through ``/proc`` either)::

    {"records": [[12, "3.2", "passed"], ...], "error": "", "cells_run": 14, "isolated": true}

``records`` are the grader's own verdicts: after every cell the worker has the kernel re-run, quietly,
the genuine check of each exercise checked in that cell on the function the check was given
(``transformer_course.checks._core.regrade``), so an outcome appended to ``results()`` or a printed
"passed" counts for nothing. ``error`` says why the notebook stopped early: a cell raised, the kernel
died (``os._exit``, out of memory) or the time ran out.

The sandbox is bubblewrap (``bwrap``, Debian's ``bubblewrap``, what Flatpak uses), no hand-written
mount code. Each notebook runs

- in a file system of its own: the interpreter, its packages, this package and the course's data
  (``benchmarks/results``) read-only; a size-bounded, empty tmpfs for ``/tmp``, ``/var/tmp`` and the
  working directory ``/course/chapters``, which holds the only copy of the hand-in the notebook sees
  (the chapters of the answer key, the other hand-ins, ``/etc``, ``/home``, ``/run`` are not there); a
  fresh ``/proc``; ``/dev`` with null, zero, full, random, urandom and a tty only; no ``/sys`` but the
  read-only CPU list;
- without a network (a new network namespace: no interface but an empty loopback, and no host socket
  path is visible, so no Unix socket either), with its own PID, IPC and UTS namespaces;
- as uid 65534 in a new user namespace mapped to an unprivileged id outside, without capabilities: as
  the teacher's own uid when the grader is not root; when the grader is root, the sandbox is built by
  a privileged ``bwrap`` which then becomes ``nobody`` (``setpriv``) before the inner user namespace,
  so nothing inside is root on the host;
- under limits: :data:`PROCESS_LIMIT` tasks (``RLIMIT_NPROC``, counted in the sandbox's own user
  namespace), :data:`MEMORY_LIMIT` bytes of address space per process (``RLIMIT_AS``), no core dumps,
  and the wall-clock limit; when the run ends, or the grader dies, every process in it is killed.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import functools
import json
import os
import platform
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..checks._core import GRADING_ENV  # set in the kernel: the checks keep their calls for regrade()

KERNEL_START_SECONDS = 120  # a kernel that is not ready by then counts as an error, not as the notebook's time
STATUSES = ("passed", "failed", "not done")
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_PROXY": "127.0.0.1,localhost",
               **{k: "http://127.0.0.1:9" for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}}
# evaluated in the kernel after each cell and returned in the kernel's reply (never printed)
_REGRADE = "__import__('transformer_course.checks._core', fromlist=['regrade']).regrade()"
PIPE_ANSWER = os.name == "posix"  # the answer comes on a pipe the kernel never holds; on Windows, in a file
WORKER_MODULE = "transformer_course.classroom.sandbox"  # this module, as `python -m` runs it

SANDBOX_ID = 65534  # uid and gid inside the sandbox (nobody), and outside it too when the grader is root
PROCESS_LIMIT = 256 + 4 * (os.cpu_count() or 1)  # tasks (processes and threads: torch starts one per core)
MEMORY_LIMIT = 8 * 2**30  # bytes of address space per process
SCRATCH_BYTES = 2 * 2**30  # each tmpfs: the working directory, /tmp, /var/tmp
COURSE_DIR = "/course"  # inside the sandbox: the course's data in benchmarks/results, the hand-in in chapters/
WORK_DIR = f"{COURSE_DIR}/chapters"
DATA_DIR = "benchmarks/results"  # what chapters read by relative path (../benchmarks/results/...)
INSTALL_HINT = ("install bubblewrap: `sudo apt install bubblewrap` (Debian, Ubuntu), `sudo dnf install bubblewrap` "
                "(Fedora), `sudo pacman -S bubblewrap` (Arch)")
USERNS_HINT = ("the kernel must let users create user namespaces: `sudo sysctl -w user.max_user_namespaces=15000` "
               "and, on Debian 10 and older, `sudo sysctl -w kernel.unprivileged_userns_clone=1`; on Ubuntu 23.10 and "
               "newer, `sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (or an AppArmor profile that "
               "allows bwrap); in Docker, run the container with `--security-opt seccomp=unconfined` "
               "`--security-opt apparmor=unconfined` or grade outside it")
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives",
                 "/sys/devices/system/cpu")
# the sandbox's own /etc files: localhost resolves (torchrun's rendezvous), nobody has a name
ETC_FILES = {"hosts": "127.0.0.1 localhost sandbox\n::1 localhost sandbox\n",
             "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
             "passwd": f"nobody:x:{SANDBOX_ID}:{SANDBOX_ID}:nobody:/tmp:/usr/sbin/nologin\n",
             "group": f"nogroup:x:{SANDBOX_ID}:\n"}
_KEPT_ENV = ("LANG", "LC_ALL", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TZ")


# ------------------------------------------------------------------ the grader's side: the command line

@functools.lru_cache(maxsize=1)
def _bwrap_features() -> set[str]:
    """The options of the installed ``bwrap`` among those whose use depends on its version."""
    try:
        shown = subprocess.run(["bwrap", "--help"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    return {option for option in ("--size", "--perms", "--clearenv", "--disable-userns") if option in shown}


def _outermost(paths) -> list[str]:
    """``paths`` without those inside another of them, parents first."""
    kept: list[str] = []
    for path in sorted({os.path.normpath(p) for p in paths}):
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def runtime_paths(hidden=()) -> list[str]:
    """The folders a kernel needs, bound read-only: the interpreter (its prefixes: standard library and
    packages), this package, and the site-packages folders on ``sys.path`` except one holding one of
    ``hidden`` (the answer key's chapters, the hand-ins) or the course's clone."""
    package = Path(__file__).resolve().parents[1]
    wanted = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, str(package),
              str(Path(os.path.realpath(sys.executable)).parents[1])}
    never = [str(package.parent), *(os.path.realpath(h) for h in hidden)]
    for entry in sys.path:  # packages only (a user's site-packages): never the folder python was started in
        real = os.path.realpath(entry) if entry else ""
        if os.path.basename(real) in ("site-packages", "dist-packages") and os.path.isdir(real) \
                and not any(_inside(n, real) for n in never):
            wanted.add(real)
    return [p for p in _outermost(wanted) if p != "/" and not any(_inside(p, s) for s in _SYSTEM_DIRS)]


def _folder_args(path: str, made: set[str], perms: bool) -> list[str]:
    """``--dir`` for each missing parent of ``path``, traversable by everyone (bwrap would copy a host
    parent's mode: /root is 0700)."""
    args = []
    for parent in reversed(Path(path).parents):
        name = str(parent)
        if name == "/" or name in made or any(_inside(name, s) for s in _SYSTEM_DIRS):
            continue
        made.add(name)
        args += [*(["--perms", "0755"] if perms else []), "--dir", name]
    return args


def sandbox_command(hand_in_fd: int, name: str, course_data, hidden=(), features=None, data_fds=None) -> list[str]:
    """The ``bwrap`` command line that runs the worker on the hand-in read from ``hand_in_fd`` (copied to
    ``WORK_DIR/name``), with ``course_data`` (a ``benchmarks/results`` folder, or None) at
    ``COURSE_DIR/benchmarks/results``, ``hidden`` folders (the answer key) covered if they lie inside a
    bound one, and ``data_fds`` ({path in the sandbox: fd}: the sandbox's own ``ETC_FILES``, copies of the
    package's files nobody could read) as read-only files readable by all.
    When the grader is root, the outer ``bwrap`` is privileged and hands over to ``nobody``."""
    features = _bwrap_features() if features is None else features
    perms = "--perms" in features

    def tmpfs(path: str, mode: str) -> list[str]:
        return ([*(["--size", str(SCRATCH_BYTES)] if "--size" in features else []),
                 *(["--perms", mode] if perms else []), "--tmpfs", path])

    root = os.geteuid() == 0
    bwrap = shutil.which("bwrap") or "bwrap"
    no_more = ["--disable-userns"] if "--disable-userns" in features else []  # no user namespace inside
    args = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", *([] if root else ["--unshare-user", *no_more]), "--hostname", "sandbox",
            "--die-with-parent", "--new-session"]
    for system in _SYSTEM_DIRS:
        if os.path.islink(system):
            args += ["--symlink", os.readlink(system), system]
        elif os.path.isdir(system):
            args += ["--ro-bind", system, system]
    # the empty scratch folders first, so that an interpreter installed under /tmp is bound on top of them
    args += ["--proc", "/proc", "--dev", "/dev", *tmpfs("/tmp", "1777"), *tmpfs("/var/tmp", "1777")]
    made: set[str] = {"/tmp", "/var/tmp"}
    for path in [*runtime_paths(hidden), *_SYSTEM_FILES]:
        if os.path.exists(path):
            args += [*_folder_args(path, made, perms), "--ro-bind", path, path]
    for path in hidden:  # the answer key, where a bound folder holds it (a wheel's _course/chapters)
        real = os.path.realpath(path)
        if os.path.isdir(real) and any(_inside(real, p) for p in runtime_paths()):
            args += ["--tmpfs", real]
    args += [*(["--perms", "0755"] if perms else []), "--dir", COURSE_DIR]
    if course_data is not None and os.path.isdir(course_data):
        args += [*(["--perms", "0755"] if perms else []), "--dir", f"{COURSE_DIR}/benchmarks",
                 "--ro-bind", os.path.realpath(course_data), f"{COURSE_DIR}/{DATA_DIR}"]
    for path, fd in (data_fds or {}).items():
        args += [*(["--perms", "0644"] if perms else []), "--ro-bind-data", str(fd), path]
    args += [*tmpfs(WORK_DIR, "1777"), *(["--perms", "0666"] if perms else []),
             "--file", str(hand_in_fd), f"{WORK_DIR}/{name}", "--chdir", WORK_DIR]
    env = {"PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "USER": "nobody",
           "LOGNAME": "nobody", "PYTHONDONTWRITEBYTECODE": "1",
           **{k: os.environ[k] for k in _KEPT_ENV if k in os.environ}}
    if "--clearenv" in features:
        args.append("--clearenv")
    else:
        args += [part for key in os.environ if key not in env for part in ("--unsetenv", key)]
    args += [part for key, value in env.items() for part in ("--setenv", key, value)]
    if root:  # nothing inside is root on the host: the rest runs as nobody, without any capability
        args += ["--", shutil.which("setpriv") or "setpriv", "--reuid", str(SANDBOX_ID), "--regid", str(SANDBOX_ID),
                 "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", bwrap,
                 "--unshare-user", *no_more, "--dev-bind", "/", "/", "--die-with-parent", "--chdir", WORK_DIR]
    return [*args, "--uid", str(SANDBOX_ID), "--gid", str(SANDBOX_ID), "--", sys.executable, "-m", WORKER_MODULE,
            "run"]


def safe_name(name: str) -> str:
    """A file name for the hand-in's copy: letters, digits, ``._-`` only (never a path)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", Path(name).name)[:120].lstrip(".")
    return cleaned or "notebook.ipynb"


_PRCTL = ctypes.CDLL(None).prctl if platform.system() == "Linux" else None  # looked up before any fork


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the grader dies (so a killed grader leaves no sandbox behind)."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _sandbox_files(stack: contextlib.ExitStack, hidden) -> dict[str, int]:
    """The files the sandbox gets read-only, {path in the sandbox: fd} (open until ``stack`` closes): its own
    ``ETC_FILES``, and readable copies of this package's files nobody could read, never the answer key's."""
    data_fds: dict[str, int] = {}
    for file, text in ETC_FILES.items():
        handle = stack.enter_context(tempfile.TemporaryFile())
        handle.write(text.encode())
        handle.seek(0)
        data_fds[f"/etc/{file}"] = handle.fileno()
    covered = [os.path.realpath(h) for h in hidden]
    for path in unreadable_by_the_sandbox():  # a shipped model saved 0600: a readable copy over it
        if copied_in(path) and not any(_inside(path, h) for h in covered):  # never the answer key
            data_fds[path] = stack.enter_context(open(path, "rb")).fileno()
    return data_fds


def _unsandboxed_folder(private: str, name: str, hand_in: bytes, course_data) -> str:
    """Without the sandbox, its layout under ``private``: ``course/chapters/name`` holds the hand-in and
    ``course/benchmarks/results`` links to ``course_data``; returns the chapters folder."""
    folder = os.path.join(private, "course", "chapters")
    os.makedirs(folder)
    Path(folder, name).write_bytes(hand_in)
    if course_data is not None and os.path.isdir(course_data):
        os.makedirs(os.path.join(private, "course", "benchmarks"))
        os.symlink(os.path.realpath(course_data), os.path.join(private, "course", DATA_DIR))
    return folder


def _wait_then_kill(process: subprocess.Popen, payload: bytes, timeout: float) -> None:
    """Send the worker its request on stdin and wait (``timeout``, plus the kernel's start and the check
    imports), then kill whatever the run left in its process group."""
    try:
        process.communicate(payload, timeout=timeout + 2 * KERNEL_START_SECONDS + 30)  # start, check imports
    except subprocess.TimeoutExpired:
        pass
    except BrokenPipeError:  # the sandbox failed before reading its request: its stderr says why
        pass
    finally:
        try:  # whatever the run left in its process group (bwrap's PID namespace dies with it)
            if os.name == "posix":
                os.killpg(process.pid, signal.SIGKILL)
            else:
                process.kill()
        except ProcessLookupError:
            pass
        process.wait()


def _parsed_answer(answer: bytes, tail: list[str], returncode: int | None) -> dict:
    """The worker's JSON answer, or one with no records saying why there is none (the last line of its
    stderr ``tail``, else its exit status)."""
    try:
        result = json.loads(answer)
        if not isinstance(result, dict):
            raise ValueError
        return result
    except ValueError:
        why = tail[-1] if tail else f"exit status {returncode}"
        return {"records": [], "error": f"the grading process ended without an answer ({why})", "cells_run": 0}


def run_cells(cells: list[tuple[int, str]], *, hand_in: bytes = b"", name: str = "notebook.ipynb", course_data=None,
              timeout: float = 60, sandbox: bool = True, expected=(), hidden=(), memory: int = MEMORY_LIMIT,
              processes: int = PROCESS_LIMIT, check_modules=()) -> dict:
    """Run ``cells`` ([(notebook index, source), ...]) in a fresh kernel whose working directory holds a
    copy of ``hand_in`` (the notebook's bytes) named ``name``, with ``course_data`` at
    ``../benchmarks/results``; the answer described in the module docstring. ``timeout`` bounds all the
    cells together (kernel start aside); ``memory`` (bytes of address space) and ``processes`` bound each
    sandbox. ``check_modules`` (``["attention"]``: the modules of ``transformer_course.checks`` the chapter
    imports) are imported before the first cell, so their checks are the genuine ones (a check the notebook
    defines for the same exercise never is). Without ``sandbox``, the same layout in a temporary folder,
    run as the grader."""
    with tempfile.TemporaryDirectory() as private, tempfile.TemporaryFile() as errors, \
            tempfile.TemporaryFile() as copy, contextlib.ExitStack() as stack:
        copy.write(hand_in)
        copy.flush()
        copy.seek(0)
        name = safe_name(name)
        data_fds: dict[str, int] = {}
        if sandbox:
            data_fds = _sandbox_files(stack, hidden)
            command = sandbox_command(copy.fileno(), name, course_data, hidden, data_fds=data_fds)
            cwd, folder = None, WORK_DIR
        else:
            folder = _unsandboxed_folder(private, name, hand_in, course_data)
            command, cwd = [sys.executable, "-m", WORKER_MODULE, "run"], folder
        if PIPE_ANSWER:
            read_end, write_end = os.pipe()
            channel = {"result_fd": write_end}
        else:  # Windows (no sandbox there): a file in a folder of the grader's own
            channel = {"result_file": os.path.join(private, "answer.json")}
        payload = json.dumps({"cells": cells, "folder": folder, "timeout": timeout, "expected": list(expected),
                              "check_modules": [m for m in check_modules if re.fullmatch(r"\w+", m)],
                              "limits": {"memory": memory, "processes": processes} if sandbox else {},
                              **channel}).encode()
        passed = (*(channel.values() if PIPE_ANSWER else ()),
                  *((copy.fileno(), *data_fds.values()) if sandbox else ()))
        process = subprocess.Popen(command, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errors,
                                   pass_fds=passed, start_new_session=os.name == "posix",
                                   preexec_fn=_die_with_parent if os.name == "posix" else None)
        if PIPE_ANSWER:
            os.close(write_end)
        _wait_then_kill(process, payload, timeout)
        if PIPE_ANSWER:
            with os.fdopen(read_end, "rb") as pipe:
                answer = pipe.read(2**24)
        else:
            answer = Path(channel["result_file"]).read_bytes() if os.path.exists(channel["result_file"]) else b""
        errors.seek(0)
        tail = errors.read()[-2000:].decode(errors="replace").strip().splitlines()
    return _parsed_answer(answer, tail, process.returncode)


def unreadable_by_the_sandbox() -> list[str]:
    """Graded as root, the notebooks run as nobody: this package's files nobody can read (written under a
    umask of 077, say), which a notebook that loads them (a shipped model) could not open. [] otherwise."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return []
    found = []
    for path in sorted(Path(__file__).resolve().parents[1].rglob("*")):
        try:
            mode = os.stat(path).st_mode
        except OSError:
            continue
        need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
        if mode & need != need:
            found.append(str(path))
    return found


def copied_in(path: str) -> bool:
    """Whether the sandbox gets a readable copy of ``path``, one of :func:`unreadable_by_the_sandbox`: a
    file of at most an eighth of a scratch folder (a folder nobody can enter stays closed)."""
    return os.path.isfile(path) and os.path.getsize(path) <= SCRATCH_BYTES // 8


def sandbox_problem() -> str:
    """"" when this machine can run a notebook in the sandbox, else why not and the fix (tried, not guessed)."""
    import importlib.util

    if missing := [name for name in ("jupyter_client", "ipykernel") if importlib.util.find_spec(name) is None]:
        return (f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed (the course's `teacher` "
                "extra): the grader runs notebooks in a Jupyter kernel")
    if platform.system() != "Linux":
        return f"the sandbox is bubblewrap, which needs Linux (this is {platform.system()})"
    if shutil.which("bwrap") is None:
        return f"the sandbox needs bubblewrap (the `bwrap` command), which is not on PATH: {INSTALL_HINT}"
    if "--perms" not in _bwrap_features():
        return f"this bubblewrap is older than 0.5 (no --perms, which the sandbox needs): {INSTALL_HINT}, 0.5 or newer"
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "graded as root, the sandbox needs util-linux's `setpriv` to become nobody: `apt install util-linux`"
    answer = run_cells([(0, "pass")], timeout=60, sandbox=True)  # a kernel started and ran a cell in it
    if answer.get("isolated") and answer.get("cells_run") == 1 and not answer.get("error"):
        return ""
    error = answer.get("error") or "the sandbox started but is not isolated (root, capabilities or a network left)"
    if re.search(r"namespace|uid map|Operation not permitted|Permission denied", error):
        return f"bubblewrap could not make the sandbox ({error}): {USERNS_HINT}"
    return error


# ------------------------------------------------------------------ the worker (in the sandbox or not)

def _capabilities() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return -1


def _isolated() -> bool:
    """Not root, no capability, no network but loopback: what the sandbox promises (and the grader tests)."""
    if platform.system() != "Linux":
        return False
    return os.getuid() != 0 and _capabilities() == 0 and [n for _, n in socket.if_nameindex()] == ["lo"]


def confine(limits: dict) -> None:
    """In the sandbox's worker, before the kernel: not dumpable (the kernel, same uid, cannot open this
    process's answer pipe through /proc or trace it), and the limits every process started here inherits."""
    import resource  # POSIX only (this runs in the sandbox: Linux)

    if _PRCTL is not None:
        _PRCTL(4, 0)  # PR_SET_DUMPABLE
    if "processes" in limits:
        _at_most(resource.RLIMIT_NPROC, limits["processes"])
    if "memory" in limits:
        _at_most(resource.RLIMIT_AS, limits["memory"])
    if limits:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _at_most(kind: int, wanted: int) -> None:
    """Limit ``kind`` to ``wanted``, or to the machine's own hard limit where that is lower: a process may
    lower its limits, never raise them, so a stricter `ulimit -v` or `-u` (shared teaching servers, batch
    systems) stays in force instead of failing the sandbox."""
    import resource

    hard = resource.getrlimit(kind)[1]
    value = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    resource.setrlimit(kind, (value, value))


def _new_records(reply) -> list[tuple[str, str]]:
    """The (exercise, status) pairs of the grader's re-run in a cell's reply; none when unreadable."""
    found = (reply or {}).get("content", {}).get("user_expressions", {}).get("records", {})
    try:
        verdicts = json.loads(ast.literal_eval(found["data"]["text/plain"]))
        return [(e, v) for e, v in verdicts if isinstance(e, str) and v in STATUSES]
    except (KeyError, TypeError, ValueError, SyntaxError, MemoryError, RecursionError):
        return []


def _wait_reply(km, kc, msg_id: str, deadline: float):
    """The kernel's reply to ``msg_id``; None when the kernel died; TimeoutError past ``deadline``."""
    from queue import Empty

    while True:
        while True:  # outputs are not needed (verdicts come with the reply): drop them as they come
            try:
                kc.get_iopub_msg(timeout=0)
            except Empty:
                break
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        try:
            reply = kc.get_shell_msg(timeout=min(left, 0.25))
        except Empty:
            if not km.is_alive():
                return None
            continue
        if reply.get("parent_header", {}).get("msg_id") == msg_id:
            return reply


def _exit_note(km) -> str:
    process = getattr(km.provisioner, "process", None)
    code = process.poll() if process is not None else None
    if code is None:
        return ""
    if code < 0:
        return f" (killed by signal {-code}{': out of memory?' if -code == signal.SIGKILL else ''})"
    return f" (exit status {code})"


def execute(cells, folder: str, timeout: float, expected, check_modules=()) -> dict:
    """Run the cells one after another in a new python3 kernel (``check_modules`` imported first, quietly);
    stop at the first error."""
    from subprocess import DEVNULL

    from jupyter_client import KernelManager

    answer = {"records": [], "error": "", "cells_run": 0, "isolated": _isolated()}
    if not cells:
        return answer
    scratch = tempfile.mkdtemp(prefix="grade-kernel-")
    env = {**os.environ, **OFFLINE_ENV, GRADING_ENV: "1", "JUPYTER_RUNTIME_DIR": f"{scratch}/runtime",
           "IPYTHONDIR": f"{scratch}/ipython", "MPLCONFIGDIR": f"{scratch}/matplotlib"}
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=folder, env=env, stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL)
    kc = km.client()
    kc.start_channels()
    where = ""
    wanted = set(expected)
    try:
        kc.wait_for_ready(timeout=KERNEL_START_SECONDS)
        if check_modules:  # before any learner code: the package's checks are registered first
            setup = "".join(f"import transformer_course.checks.{m}\n" for m in check_modules)
            _wait_reply(km, kc, kc.execute(setup, silent=True, store_history=False),
                        time.monotonic() + KERNEL_START_SECONDS)
        deadline = time.monotonic() + timeout
        for index, source in cells:
            first = next((line.strip() for line in source.splitlines() if line.strip()), "")
            where = f"cell {index + 1} ({first[:40]!r})"
            records = {"records": _REGRADE}
            msg_id = kc.execute(source, store_history=True, allow_stdin=False, stop_on_error=False,
                                user_expressions=records)
            reply = _wait_reply(km, kc, msg_id, deadline)
            if reply is None:
                answer["error"] = f"the kernel died in {where}{_exit_note(km)}"
                break
            answer["cells_run"] += 1
            content = reply.get("content", {})
            if content.get("status") != "ok":  # a failed cell returns no expressions: ask again
                answer["error"] = (f"{where} raised {content.get('ename', 'an error')}: "
                                   f"{content.get('evalue', '')}")[:400]
                msg_id = kc.execute("", silent=True, store_history=False, user_expressions=records)
                try:
                    reply = _wait_reply(km, kc, msg_id, time.monotonic() + 30)
                except TimeoutError:  # a thread the notebook left running holds the kernel: keep the cell's error
                    break
            answer["records"] += [[index, e, v] for e, v in _new_records(reply) if e in wanted]
            if answer["error"]:
                break
    except TimeoutError:
        answer["error"] = f"timed out: still running {where} when the notebook's {timeout:g} s were up (--timeout)"
    except RuntimeError as error:  # wait_for_ready: the kernel never came up
        answer["error"] = f"the kernel did not start: {error}"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        shutil.rmtree(scratch, ignore_errors=True)
    return answer


def main(argv: list[str]) -> int:
    """``run``: read the request on stdin, run the notebook, write the answer to the grader's pipe."""
    request = json.loads(sys.stdin.buffer.read())
    if "result_fd" in request:
        os.set_inheritable(request["result_fd"], False)  # the kernel never holds the answer's pipe
    try:
        if request.get("limits"):
            confine(request["limits"])
        answer = execute([tuple(c) for c in request["cells"]], request["folder"], request["timeout"],
                         request["expected"], request.get("check_modules", ()))
    except Exception as error:  # report, do not crash the batch
        answer = {"records": [], "error": f"grading failed: {type(error).__name__}: {error}", "cells_run": 0}
    with os.fdopen(request["result_fd"], "wb") if "result_fd" in request else open(request["result_file"], "wb") as out:
        out.write(json.dumps(answer).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
