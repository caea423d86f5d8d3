"""Reproducibility, device selection and hardware facts shared by every chapter (hand-written, not exported)."""

from __future__ import annotations

import contextlib
import errno
import functools
import glob
import os
import random
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

DEVICE_ENV = "TRANSFORMER_COURSE_DEVICE"
_DEVICES = ("cpu", "cuda", "mps")


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python's ``random``, NumPy and PyTorch (CPU and every CUDA device).

    Returns a CPU ``torch.Generator`` seeded with the same value, for code that prefers an explicit
    generator over the global one (data batches, sampling).
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device
    return torch.Generator().manual_seed(seed)


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def pick_device(preferred: str | None = None) -> torch.device:
    """The best device here: CUDA, then Apple's MPS, then the CPU.

    ``preferred`` (or the environment variable ``TRANSFORMER_COURSE_DEVICE``) overrides the choice,
    e.g. ``TRANSFORMER_COURSE_DEVICE=cpu`` to keep a GPU free. Asking for a device that is not
    available raises a ``RuntimeError`` that says what is.
    """
    choice = preferred or os.environ.get(DEVICE_ENV, "").strip().lower() or None
    if choice is None:
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    kind = choice.split(":")[0]
    if kind not in _DEVICES:
        raise ValueError(
            f"unknown device {choice!r} (from {'argument' if preferred else DEVICE_ENV}); "
            f"choose one of {', '.join(_DEVICES)}"
        )
    if kind == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {choice!r} was asked for but CUDA is not available here; use 'cpu'")
    if kind == "mps" and not _mps_available():
        raise RuntimeError(f"device {choice!r} was asked for but MPS is not available here; use 'cpu'")
    try:
        device = torch.device(choice)
    except RuntimeError:  # "cuda:x", "cpu:-1"
        raise ValueError(f"{choice!r} is not a device name: write cpu, cuda, cuda:N or mps") from None
    # an index past the last device would fail later and elsewhere (torch.load calls it a damaged file)
    if device.index is not None and device.index >= (torch.cuda.device_count() if kind == "cuda" else 1):
        raise RuntimeError(f"device {choice!r} does not exist; this machine has {', '.join(available_devices())}")
    return torch.device("cpu") if kind == "cpu" else device  # the CPU is one device: "cpu:0" is "cpu"


def available_devices() -> list[str]:
    """The devices here, as ``pick_device`` takes them: cpu, then cuda:0 ... cuda:N-1, then mps."""
    cuda = [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return ["cpu", *cuda, *(["mps"] if _mps_available() else [])]


def idle_cores(sample_s: float = 0.2) -> int | None:
    """How many of this machine's cores were idle (under half busy) over ``sample_s`` seconds, from two
    readings of /proc/stat (Linux); None where there is no /proc/stat."""
    import time

    def busy_and_total() -> list[tuple[int, int]]:
        rows = [line.split() for line in Path("/proc/stat").read_text().splitlines()]
        cpus = [list(map(int, r[1:9])) for r in rows if r and r[0].startswith("cpu") and r[0] != "cpu"]
        return [(sum(c) - c[3] - c[4], sum(c)) for c in cpus]  # all but idle and iowait

    try:
        before = busy_and_total()
        time.sleep(sample_s)
        after = busy_and_total()
    except (OSError, ValueError, IndexError):
        return None
    return sum((b1 - b0) <= 0.5 * max(t1 - t0, 1) for (b0, t0), (b1, t1) in zip(before, after, strict=False))


def set_threads(requested: int | None = None) -> int:
    """Set PyTorch's CPU threads for a command and return how many: ``requested``, else one per core that
    is idle now (at least 1, at most PyTorch's own default).

    Why not PyTorch's default (one per core): its OpenMP threads wait for each other at every operation,
    spinning, so when another process holds one core the thread on it is descheduled for whole time
    slices and everything waits: with a busy loop on one of two cores, two threads trained at about half the
    speed of one, and this default at 0.89x of one (benchmarks/results/threads.md).
    """
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
            raise ValueError(f"threads must be a whole number >= 1, got {requested!r}")
        torch.set_num_threads(requested)
        return requested
    ceiling = torch.get_num_threads()
    idle = idle_cores()
    chosen = ceiling if idle is None else max(1, min(ceiling, idle))
    torch.set_num_threads(chosen)
    return chosen


def file_sha256(path) -> str:
    """The SHA-256 of a file's bytes, read a MiB at a time (shipped models, exported folders)."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


FAST_BF16_ENV = "TRANSFORMER_COURSE_FAST_BF16"


@functools.cache
def cpu_has_fast_bf16() -> bool:
    """True when this CPU multiplies bfloat16 matrices natively (AVX512-BF16 or Intel AMX).

    Where it does, a bf16 matrix product can run about twice as fast as an fp32 one; elsewhere bf16 is
    emulated and slower than fp32. Nothing in the course switches to bf16 on this answer by itself:
    training and decoding compute in float32 on the CPU unless asked (``TrainConfig(bf16=True)``), so
    every chapter prints the same numbers on every CPU. Benchmarks and labelled experiments use it to
    say which case a machine is in.

    Asks PyTorch's own CPU probe (``torch.cpu``), and answers False where a PyTorch build has none.
    The environment variable ``TRANSFORMER_COURSE_FAST_BF16=0`` or ``=1`` overrides the answer (CI runs
    the chapters a second time with the answer flipped, to prove that no stored output depends on it).
    """
    forced = os.environ.get(FAST_BF16_ENV, "").strip()
    if forced:
        if forced not in ("0", "1"):
            raise ValueError(f"{FAST_BF16_ENV} must be 0 or 1 (or unset to ask the CPU), got {forced!r}")
        return forced == "1"
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    cpu = getattr(torch, "cpu", None)
    return any(bool(getattr(cpu, name, lambda: False)()) for name in probes)


def _umask() -> int:
    """The process's file-creation mask (reading it means setting it: put back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write(obj, f) -> None:
    """``torch.save(obj)`` into the open binary file `f`, flushed to the operating system (not yet to the disk)."""
    torch.save(obj, f)
    f.flush()


def atomic_save(obj, path) -> Path:
    """``torch.save(obj)`` to `path` atomically: written to a hidden temporary file in the same folder,
    flushed to disk, then renamed over `path`, so a reader sees the old file or the new one, never half
    of one. A failed write (a full disk) leaves `path` as it was and raises an ``OSError`` that says how
    much room is left; a temporary file of `path` left by a save that was killed mid-write is removed
    (with a warning) by the next save. One process at a time may save to a given `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    stale = sorted(path.parent.glob(f".{glob.escape(path.name)}.*.tmp"))
    for old in stale:
        old.unlink(missing_ok=True)
    if stale:
        warnings.warn(f"removed {len(stale)} unfinished temporary file(s) of {path} left by an interrupted save: "
                      f"{', '.join(p.name for p in stale)}", stacklevel=2)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            _write(obj, f)
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 would hide the file from other users (a grader's)
        os.replace(tmp, path)
    except BaseException as error:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(error, OSError | RuntimeError):  # torch's writer words a full disk as "enforce fail at ..."
            free = shutil.disk_usage(path.parent).free
            reason = getattr(error, "strerror", None) or str(error).splitlines()[0][:100]
            raise OSError(getattr(error, "errno", None) or errno.EIO,
                          f"could not write {path} ({reason}); {free / 1e6:,.0f} MB free on its disk: if it is full, "
                          "free some space or write elsewhere. The previous file, if any, is unchanged") from error
        raise
    return path


LOCK_NAME = ".lock"  # beside the checkpoints of a `transformer-course train --out` folder


@contextlib.contextmanager
def folder_lock(folder, what: str = "folder"):
    """Hold an exclusive lock on `folder` (``fcntl.flock`` on its file ``.lock``, which then holds this
    process's id) until the block ends, or until the process dies: the system releases it then, so a killed
    run leaves no stale lock. A second holder is refused at once with a ``RuntimeError`` naming the first
    one's PID. Where ``fcntl`` is missing (Windows) nothing is locked."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    fd = os.open(Path(folder) / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise RuntimeError(f"{what} is in use by another run (PID {holder}), and two runs writing one "
                               "folder destroy each other's checkpoints: wait for that run to end (or stop it), "
                               "or choose another folder") from None
        os.pwrite(fd, f"{os.getpid():<20}\n".encode(), 0)  # one width: no truncation, no half-written id
        yield
    finally:
        os.close(fd)  # releases the lock
