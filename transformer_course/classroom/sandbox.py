"""Run one handed-in notebook for the grader, in a fresh kernel and a sandbox (hand-written).

The whole notebook has one time limit; the sandbox is made where Linux allows it. The grader
(``grading.py``) starts ``python -m transformer_course.classroom.sandbox run`` once per notebook,
sends the notebook's code cells on stdin and reads one JSON answer on a pipe of its own (the kernel
never holds that pipe, so nothing a notebook prints can stand in for it)::

    {"records": [[12, "3.2", "passed"], ...], "error": "", "cells_run": 14, "isolated": true}

``records`` are the verdicts the checks recorded inside the kernel (``transformer_course.checks.results()``),
each with the notebook index of the cell that ran the check, read after every cell through the kernel's
reply, not from printed text. ``error`` says why the
notebook stopped early: a cell raised, the kernel died (``os._exit``, out of memory) or the time ran out.

The sandbox (``unshare`` from util-linux, no root needed) wraps that command in new user, mount,
network and PID namespaces: every mount is read-only except the notebook's folder (an overlay whose
writes are thrown away, or the folder itself where overlays are not allowed) and fresh, empty
``/tmp``, ``/var/tmp`` and ``/dev/shm`` (where the folder lies under one, its tree stays, read-only);
the only network is an empty loopback; the kernel runs as ``nobody`` without capabilities; and when the
run ends every process it started is killed with it.
"""

from __future__ import annotations

import ast
import ctypes
import json
import os
import platform
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

KERNEL_START_SECONDS = 120  # a kernel that is not ready by then counts as an error, not as the notebook's time
STATUSES = ("passed", "failed", "not done")
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_PROXY": "127.0.0.1,localhost",
               **{k: "http://127.0.0.1:9" for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}}
# evaluated in the kernel after each cell and returned in the kernel's reply (never printed)
_RECORDS = ("(lambda r: __import__('json').dumps([len(r), [(o.exercise, o.status) for o in r[{start}:] "
            "if o.exercise in {wanted!r}]]))(__import__('transformer_course.checks', fromlist=['results']).results())")
PIPE_ANSWER = os.name == "posix"  # the answer comes on a pipe the kernel never holds; on Windows, in a file
_NOBODY = 65534
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_NOATIME, _MS_NODIRATIME, _MS_REMOUNT, _MS_BIND = 1024, 2048, 32, 4096
_MS_REC, _MS_PRIVATE, _MS_RELATIME, _MS_STRICTATIME = 16384, 1 << 18, 1 << 21, 1 << 24
_KEEP = {"nosuid": _MS_NOSUID, "nodev": _MS_NODEV, "noexec": _MS_NOEXEC, "noatime": _MS_NOATIME,
         "nodiratime": _MS_NODIRATIME, "relatime": _MS_RELATIME, "strictatime": _MS_STRICTATIME}
_CLONE_NEWUSER = 0x10000000
WORKER_MODULE = "transformer_course.classroom.sandbox"  # this module, as `python -m` runs it


# ------------------------------------------------------------------ the grader's side

def outer_command() -> list[str]:
    """The ``unshare`` prefix that opens the sandbox's namespaces (the command's path resolved)."""
    return [shutil.which("unshare") or "unshare", "--user", "--map-root-user", "--net", "--mount", "--pid",
            "--fork", "--kill-child", "--mount-proc"]


def worker_command(folder, sandbox: bool) -> list[str]:
    """The command line that runs one notebook in ``folder``, inside the sandbox or not."""
    mode = ["setup", str(folder)] if sandbox else ["run"]
    return [*(outer_command() if sandbox else []), sys.executable, "-m", WORKER_MODULE, *mode]


_PRCTL = ctypes.CDLL(None).prctl if platform.system() == "Linux" else None  # looked up before any fork


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the grader dies (so a killed grader leaves no sandbox behind)."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def run_cells(cells: list[tuple[int, str]], folder, timeout: float, sandbox: bool, expected=()) -> dict:
    """Run ``cells`` ([(notebook index, source), ...]) in a fresh kernel working in ``folder``; the answer
    described in the module docstring. ``timeout`` bounds all the cells together (kernel start aside)."""
    import subprocess

    with tempfile.TemporaryDirectory() as private, tempfile.TemporaryFile() as errors:
        if PIPE_ANSWER:
            read_end, write_end = os.pipe()
            channel = {"result_fd": write_end}
        else:  # Windows (no sandbox there): a file in a folder of the grader's own
            channel = {"result_file": os.path.join(private, "answer.json")}
        payload = json.dumps({"cells": cells, "folder": str(folder), "timeout": timeout, "expected": list(expected),
                              **channel}).encode()
        process = subprocess.Popen(worker_command(folder, sandbox), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                   stderr=errors, pass_fds=tuple(channel.values()) if PIPE_ANSWER else (),
                                   start_new_session=os.name == "posix",
                                   preexec_fn=_die_with_parent if os.name == "posix" else None)
        if PIPE_ANSWER:
            os.close(write_end)
        try:
            process.communicate(payload, timeout=timeout + KERNEL_START_SECONDS + 30)
        except subprocess.TimeoutExpired:
            pass
        finally:
            try:  # whatever the run left in its process group
                if os.name == "posix":
                    os.killpg(process.pid, signal.SIGKILL)
                else:
                    process.kill()
            except ProcessLookupError:
                pass
            process.wait()
        if PIPE_ANSWER:
            with os.fdopen(read_end, "rb") as pipe:
                answer = pipe.read()
        else:
            answer = Path(channel["result_file"]).read_bytes() if os.path.exists(channel["result_file"]) else b""
        errors.seek(0)
        tail = errors.read()[-2000:].decode(errors="replace").strip().splitlines()
    try:
        return json.loads(answer)
    except ValueError:
        why = tail[-1] if tail else f"exit status {process.returncode}"
        return {"records": [], "error": f"the grading process ended without an answer ({why})", "cells_run": 0}


def sandbox_problem() -> str:
    """"" when this machine can run a notebook in the sandbox, else why not (tried, not guessed)."""
    import importlib.util

    if missing := [name for name in ("jupyter_client", "ipykernel") if importlib.util.find_spec(name) is None]:
        return (f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed (the course's `teacher` "
                "extra): the grader runs notebooks in a Jupyter kernel")
    if platform.system() != "Linux":
        return f"the sandbox needs Linux namespaces (this is {platform.system()})"
    if shutil.which("unshare") is None:
        return "the sandbox needs the `unshare` command (util-linux), which is not on PATH"
    with tempfile.TemporaryDirectory() as folder:
        answer = run_cells([], folder, timeout=30, sandbox=True)
    if answer.get("isolated"):
        return ""
    return answer.get("error") or "the sandbox could not be set up (no read-only root, or a network left)"


# ------------------------------------------------------------------ inside the sandbox, as the namespaces' root

def _mount(source, target, fstype, flags: int, data: str | None = None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    args = [None if v is None else os.fsencode(v) for v in (source, target, fstype)]
    if libc.mount(*args, flags, None if data is None else data.encode()) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"mount {target}: {os.strerror(error)}")


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, per-mount options, file system type) of every mount this process sees."""
    found = []
    for line in Path("/proc/self/mountinfo").read_bytes().decode(errors="surrogateescape").splitlines():
        fields = line.split()
        rest = fields[fields.index("-") + 1:]
        point = fields[4].encode(errors="surrogateescape")
        for code in (b"\\040", b"\\011", b"\\012", b"\\134"):  # mountinfo escapes space, tab, newline, backslash
            point = point.replace(code, bytes([int(code[1:], 8)]))
        found.append((os.fsdecode(point), fields[5], rest[0]))
    return found


def _loopback_up() -> None:
    """Bring up ``lo`` in the new, empty network namespace (the kernel talks to us over 127.0.0.1)."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH", b"lo", 0)))[1]  # SIOCGIFFLAGS
        fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 1))  # SIOCSIFFLAGS, IFF_UP


def _enter_sandbox(folder: str) -> None:
    """Make every mount read-only, give fresh temporary folders, make ``folder`` writable, drop to nobody."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing done here reaches the grader's mounts
    handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)  # the folder, before a tmpfs may hide its path
    for point, options, fstype in _mounts():
        if fstype == "proc":
            continue  # this PID namespace's own /proc (the uid map below is written through it)
        flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY
        for option in options.split(","):
            flags |= _KEEP.get(option, 0)
        try:
            _mount(None, point, None, flags)
        except OSError as error:
            if os.path.exists(point) and not os.statvfs(point).f_flag & os.ST_RDONLY:
                raise RuntimeError(f"could not make {point} read-only: {error}") from error
    # what must stay visible even where it lies under a temporary folder (a clone in /tmp, say): the
    # graded folder's tree (../benchmarks/...), the Python that runs the kernel and this package
    needed = {folder, sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)),
              str(Path(__file__).resolve().parents[2])}
    for temp in ("/tmp", "/var/tmp", "/dev/shm"):
        if not os.path.isdir(temp) or folder == temp:
            continue
        tops = {os.path.relpath(path, temp).split(os.sep)[0] for path in needed}
        keep = {top: os.open(os.path.join(temp, top), os.O_RDONLY | os.O_DIRECTORY)
                for top in sorted(tops) if top not in ("..", ".") and os.path.isdir(os.path.join(temp, top))}
        _mount("tmpfs", temp, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777,size=1g")
        for top, handle_top in keep.items():  # their trees stay visible, read-only
            os.mkdir(os.path.join(temp, top))
            _mount(f"/proc/self/fd/{handle_top}", os.path.join(temp, top), None, _MS_BIND | _MS_REC)
            _mount(None, os.path.join(temp, top), None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY)
            os.close(handle_top)
    scratch = tempfile.mkdtemp(prefix="overlay-", dir="/tmp")
    os.makedirs(f"{scratch}/upper")
    os.makedirs(f"{scratch}/work")
    try:  # writes land in the throw-away upper layer: submissions side by side stay untouched
        _mount("overlay", folder, "overlay", 0,
               f"lowerdir=/proc/self/fd/{handle},upperdir={scratch}/upper,workdir={scratch}/work")
    except OSError:  # kernels before 5.11 refuse overlays in a user namespace: the folder itself, writable
        _mount(f"/proc/self/fd/{handle}", folder, None, _MS_BIND)
        _mount(None, folder, None, _MS_REMOUNT | _MS_BIND)
    os.close(handle)
    _loopback_up()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWUSER) != 0:  # a user namespace inside: root here becomes nobody there
        raise RuntimeError(f"could not drop root: {os.strerror(ctypes.get_errno())}")
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{_NOBODY} 0 1")
    Path("/proc/self/gid_map").write_text(f"{_NOBODY} 0 1")


# ------------------------------------------------------------------ the worker (in the sandbox or not)

def _isolated() -> bool:
    """Read-only root, a network of loopback only, not root: what the sandbox promises."""
    if not hasattr(os, "statvfs"):
        return False
    return bool(os.statvfs("/").f_flag & os.ST_RDONLY) and [n for _, n in socket.if_nameindex()] == ["lo"] \
        and os.getuid() != 0


def _new_records(reply, seen: int) -> tuple[int, list[tuple[str, str]]]:
    """(outcomes recorded in all, the new (exercise, status) pairs) from a cell's reply; nothing new when unreadable."""
    found = (reply or {}).get("content", {}).get("user_expressions", {}).get("records", {})
    try:
        total, verdicts = json.loads(ast.literal_eval(found["data"]["text/plain"]))
        return int(total), [(e, v) for e, v in verdicts if isinstance(e, str) and v in STATUSES]
    except (KeyError, TypeError, ValueError, SyntaxError):
        return seen, []


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


def execute(cells, folder: str, timeout: float, expected) -> dict:
    """Run the cells one after another in a new python3 kernel; stop at the first error."""
    from subprocess import DEVNULL

    from jupyter_client import KernelManager

    answer = {"records": [], "error": "", "cells_run": 0, "isolated": _isolated()}
    if not cells:
        return answer
    scratch = tempfile.mkdtemp(prefix="grade-kernel-")
    env = {**os.environ, **OFFLINE_ENV, "JUPYTER_RUNTIME_DIR": f"{scratch}/runtime", "IPYTHONDIR": f"{scratch}/ipython",
           "MPLCONFIGDIR": f"{scratch}/matplotlib"}
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=folder, env=env, stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL)
    kc = km.client()
    kc.start_channels()
    where = ""
    try:
        kc.wait_for_ready(timeout=KERNEL_START_SECONDS)
        deadline = time.monotonic() + timeout
        seen = 0  # outcomes recorded so far: each cell's reply brings only the new ones
        for index, source in cells:
            first = next((line.strip() for line in source.splitlines() if line.strip()), "")
            where = f"cell {index + 1} ({first[:40]!r})"
            records = {"records": _RECORDS.format(start=seen, wanted=tuple(expected))}
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
            seen, new = _new_records(reply, seen)
            answer["records"] += [[index, e, v] for e, v in new]
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
    """``setup FOLDER`` (as the namespaces' root: build the sandbox, then become the worker) or ``run``."""
    if argv[:1] == ["setup"]:
        _enter_sandbox(argv[1])
        os.execv(sys.executable, [sys.executable, "-m", WORKER_MODULE, "run"])
    request = json.loads(sys.stdin.buffer.read())
    if "result_fd" in request:
        os.set_inheritable(request["result_fd"], False)  # the kernel never holds the answer's pipe
    try:
        answer = execute([tuple(c) for c in request["cells"]], request["folder"], request["timeout"],
                         request["expected"])
    except Exception as error:  # report, do not crash the batch
        answer = {"records": [], "error": f"grading failed: {type(error).__name__}: {error}", "cells_run": 0}
    with os.fdopen(request["result_fd"], "wb") if "result_fd" in request else open(request["result_file"], "wb") as out:
        out.write(json.dumps(answer).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
