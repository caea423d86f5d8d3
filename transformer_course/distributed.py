"""Data-parallel training under ``torchrun`` (hand-written; taught in the appendix chapter 90).

`torchrun --nproc-per-node N -m transformer_course train ...` starts N copies of the `train` command.
Each copy is a *rank*: it holds the whole model, computes the gradients of its share of every global
batch, and PyTorch's DistributedDataParallel averages the gradients over the ranks (an all-reduce)
before each optimizer step, so every rank applies the same update to the same weights.

`World` is what the training loop needs to know about the job (one rank of one outside ``torchrun``,
where every method is the identity); `start_from_environment` joins the job ``torchrun`` started.
Backends: gloo on CPUs, NCCL on CUDA GPUs (one GPU per rank).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from . import faults

# a rank that waits longer than this for the others (a peer that hangs rather than dies) ends the job
COLLECTIVE_TIMEOUT = timedelta(minutes=10)


@dataclass(frozen=True)
class World:
    """This process's place in the job: `rank` of `size` processes; `device` holds collective tensors."""

    rank: int = 0
    size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        """Rank 0 writes checkpoints, logs and the progress bar; the others only compute."""
        return self.rank == 0

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """`model` as DistributedDataParallel (gradients averaged over ranks in backward), or itself alone.
        DDP copies rank 0's weights to every rank here, so all ranks start equal."""
        if self.size == 1:
            return model
        ids = [self.device.index] if self.device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)

    def shard(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """This rank's rows of each global batch [size * n, ...] -> [n, ...] (rank r takes rows r*n to r*n+n-1)."""
        if self.size == 1:
            return tensors
        out = []
        for t in tensors:
            if len(t) % self.size:
                raise ValueError(f"a global batch of {len(t)} rows does not split over {self.size} processes")
            n = len(t) // self.size
            out.append(t[self.rank * n : (self.rank + 1) * n])
        return tuple(out)

    def _reduce(self, value: float, op) -> float:
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=op)
        return t.item()

    def mean(self, value: float) -> float:
        """The mean of `value` over the ranks (every rank gets it)."""
        return self._reduce(value, dist.ReduceOp.SUM) / self.size

    def sum(self, value: float) -> float:
        """The sum of `value` over the ranks (every rank gets it)."""
        return self._reduce(value, dist.ReduceOp.SUM)

    def any(self, flag: bool) -> bool:
        """True on every rank when it is True on one: ranks must agree to stop at the same step."""
        return self._reduce(float(flag), dist.ReduceOp.MAX) > 0

    def barrier(self) -> None:
        """Wait until every rank gets here (e.g. until rank 0's checkpoint is on disk)."""
        if self.size > 1:
            dist.barrier()

    def gather(self, obj) -> list:
        """`obj` of every rank, in rank order (every rank gets the list)."""
        if self.size == 1:
            return [obj]
        out = [None] * self.size
        dist.all_gather_object(out, obj)
        return out


def current_world() -> World:
    """The job this process belongs to: a `World` of one unless a process group is running. (Tests that
    set TRANSFORMER_COURSE_FAULT get one that also counts steps: `faults.watch`.)"""
    if not (dist.is_available() and dist.is_initialized()):
        return faults.watch(World())
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    return faults.watch(World(dist.get_rank(), dist.get_world_size(), device))


def launched_by_torchrun() -> bool:
    """Whether `torchrun` (or another launcher that sets the same variables) started this process."""
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"))


def usable_cpus() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one, else all)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def start_from_environment(device: str | None) -> tuple[World, str]:
    """Join the job `torchrun` started: check the per-node process count against this machine, choose
    the backend by device (NCCL for CUDA, one GPU per local rank; gloo for the CPU), start the process
    group. Returns the World and the device string for this rank ("cuda:1", "cpu")."""
    local_rank, per_node = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    kind = device.split(":")[0]
    if kind == "cuda":
        if per_node > (gpus := torch.cuda.device_count()):
            raise ValueError(f"--nproc-per-node {per_node} asks for one GPU per process but this machine has {gpus}; "
                             f"use --nproc-per-node {gpus} or fewer")
        device, backend = f"cuda:{local_rank}", "nccl"
        torch.cuda.set_device(local_rank)
    elif kind == "cpu":
        if per_node > (cores := usable_cpus()):
            raise ValueError(f"--nproc-per-node {per_node} asks for one CPU core per process but this machine has "
                             f"{cores}; use --nproc-per-node {cores} or fewer (more processes than cores only wait "
                             "for each other)")
        backend = "gloo"
    else:
        raise ValueError(f"data-parallel training runs on CUDA GPUs (NCCL) or CPUs (gloo), not on {kind!r}; "
                         "pass --device cpu or --device cuda")
    dist.init_process_group(backend, store=_store_for_this_round(), rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]), timeout=COLLECTIVE_TIMEOUT)
    return current_world(), device


def _store_for_this_round() -> dist.Store:
    """The job's key-value store (where ranks publish their addresses), with keys of this restart round
    only. torchrun keeps one store across `--max-restarts` rounds; without a prefix per round, a restarted
    rank could read an address a dead rank of the last round published, and its connection is refused."""
    agent_hosts_it = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["WORLD_SIZE"]),
                          is_master=not agent_hosts_it and os.environ["RANK"] == "0", timeout=COLLECTIVE_TIMEOUT)
    return dist.PrefixStore(f"transformer_course/round_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def stop() -> None:
    """Leave the process group (a no-op outside one)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
