# %% [markdown]
# # Appendix: performance
#
# An optional chapter for the curious: how fast can decoding go at all, and why? Nothing in the main
# chapters needs it. Chapter 07 made decoding cheap in *work* (the KV cache: one new position per step);
# this appendix looks at the *time* a step takes on a CPU, for one sequence.
#
# **You will see**
# - what the KV cache saves in time, not only in work;
# - the **read-bandwidth roofline**: at batch 1 a decode step reads every weight once per token, so
#   tokens/s can never exceed the memory bandwidth divided by the bytes of weights (and cache) per token;
# - how a weight matrix sits in memory, `[out, in]` or `[in, out]`, gives the same numbers;
# - **bf16 weights**, half the bytes, with their agreement with fp32 measured;
# - the race against Hugging Face's `generate`, as `benchmarks/bench_decode.py` measured it;
# - **training on several processes** with `torchrun`: what is averaged, what grows, and a two-process
#   run whose losses equal the one-process run's.
#
# **It needs** chapter 06's model (the course ships it trained) and training steps, and chapter 07's
# `generate`. It exports one opt-in function, `bf16_weights`, to `transformer_course/performance.py`,
# and the data-parallel trainer that `transformer-course train` runs to `transformer_course/parallel.py`.
#
# Timings vary from machine to machine and from run to run, so the cells that time things print
# nothing; one cell in section 4 prints everything your machine measured.

# %%
#| default_exp performance

# %%
#| export
"""Performance helpers (the appendix): how fast this machine reads memory, and a bf16-weights copy of a
model for decoding.

Opt-in only: nothing in the course calls them for you.
"""

from __future__ import annotations

import copy
import time

import torch

from transformer_course.arguments import whole_number

# %%
import time

import torch

from transformer_course.course_model import load_course_model
from transformer_course.generation import generate
from transformer_course.config import PRESETS, GPTConfig
from transformer_course.model import GPT, count_parameters

torch.set_printoptions(precision=4, sci_mode=False)
torch.set_num_threads(1)  # decoding one sequence: one thread, as the benchmark measures it
_ = torch.manual_seed(0)
course = load_course_model()
model, tok, cfg = course.model, course.tokenizer, course.config
prompt = torch.tensor([tok.encode("ROMEO:\n")])
print(f"the course model: {model.num_parameters():,} parameters, {cfg.n_layer} layers x {cfg.d_model}")

# %% [markdown]
# ## 1. The roofline: every weight, once per token
#
# With the cache, a decode step for one sequence feeds one position through the model: a `[1, C]` row
# times every weight matrix. A matrix-vector product does two floating-point operations per weight it
# reads, far too little arithmetic to keep a CPU busy; the time goes into bringing the weights in from
# memory. So a step must read every weight at least once (the tied LM head and the token embedding are one
# matrix), plus the cache's keys and values, and
#
# $$\text{tokens/s} \;\le\; \frac{\text{read bandwidth (bytes/s)}}{\text{bytes of weights} + \text{bytes of KV cache read per token}}.$$
#
# The bytes per token are arithmetic. For GPT-2's 124M shape in fp32:

# %%
def weight_bytes(cfg: GPTConfig, bytes_per_weight: int = 4) -> int:
    """Bytes of the weights a decode step reads: all parameters but the position table (one row read)."""
    positions = cfg.block_size * cfg.d_model if cfg.positional == "learned" else 0
    return (count_parameters(cfg) - positions) * bytes_per_weight


def cache_bytes(cfg: GPTConfig, length: int) -> int:
    """Bytes of keys and values of one sequence of `length` positions, fp32."""
    return 2 * cfg.n_layer * length * cfg.d_model * 4


gpt2 = PRESETS["gpt2"]
for name, c in (("course model", cfg), ("GPT-2 124M", gpt2)):
    print(f"{name:13s} weights {weight_bytes(c) / 1e6:7.1f} MB fp32, {weight_bytes(c, 2) / 1e6:6.1f} MB bf16; "
          f"cache at 512 positions {cache_bytes(c, min(512, c.block_size)) / 1e6:5.1f} MB")

# %% [markdown]
# At 124M the weights dominate: about half a gigabyte per token. How fast does one thread of this machine
# read memory? Summing a large fp32 tensor reads every byte once with next to no arithmetic: the best of a
# few sums is the bandwidth (this cell and the next only measure; section 4 prints the numbers).

# %%
#| export
def read_bandwidth(n_bytes: int = 128 * 2**20, repeats: int = 5) -> float:
    """Bytes/s one thread reads: the best of `repeats` sums of an fp32 tensor of `n_bytes`
    (`benchmarks/bench_decode.py` uses it too)."""
    whole_number(n_bytes, "n_bytes", low=2**20, hint="a tensor smaller than 1 MiB measures the call, not memory")
    whole_number(repeats, "repeats")
    x = torch.ones(n_bytes // 4)
    x.sum()  # touch every page first
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - start)
    return n_bytes / best

# %%
bandwidth = read_bandwidth()

# %% [markdown]
# Then decode with a model big enough for memory to matter (6 layers x 384, vocabulary 5,000, random
# weights: the speed does not depend on their values), one sequence, 64 tokens, with the plain
# `generate` of chapter 07:

# %%
mid_cfg = GPTConfig(vocab_size=5000, block_size=256, n_layer=6, n_head=6, d_model=384)
mid = GPT(mid_cfg).eval()
mid_prompt = torch.randint(0, 5000, (1, 16), generator=torch.Generator().manual_seed(0))


def decode_speed(m, idx, n=64, repeats=3, use_cache=True):
    """Greedy tokens per second, best of `repeats` after a warm-up."""
    generate(m, idx, 8, temperature=0, use_cache=use_cache)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        generate(m, idx, n, temperature=0, use_cache=use_cache)
        best = min(best, time.perf_counter() - start)
    return n / best


mid_speed = decode_speed(mid, mid_prompt)
mid_uncached = decode_speed(mid, mid_prompt, repeats=1, use_cache=False)  # chapter 07's loop without the cache
mid_bytes = weight_bytes(mid_cfg) + cache_bytes(mid_cfg, 16 + 32)  # the cache at its mean length
assert mid_bytes > 20e6  # tens of MB per token: much more than the CPU's caches hold

# %% [markdown]
# Chapter 07 counted the work the KV cache saves. Section 4 prints what it is worth in time here, for 64
# tokens after a 16-token prompt: less than the ratio of the work, because every step reads every weight
# once, however few positions it feeds.
#
# The fraction of the bound that the measured speed reaches is how close the plain PyTorch decoder comes to
# the physics; the rest is per-step overhead (Python, the launch of a few dozen operations) and kernels
# that stream a matrix-vector product a little slower than a plain sum. At 124M in fp32 one thread of a
# CPU that reads 10 to 12 GB/s cannot decode more than about 20 to 24 tokens/s, and both the course's loop
# and Hugging Face's `generate` come close to that (section 4 prints the benchmark's table). No trick of
# kernels or layouts beats the bound; only fewer bytes per token can (section 3), or more sequences per
# step (a batch of B reads the weights once for B tokens).
#
# ## 2. How a weight sits in memory: `[out, in]` or `[in, out]`
#
# `nn.Linear` stores its weight `[out, in]`: one row per output, so the product for one output reads
# one contiguous row. The same numbers can be stored transposed, `[in, out]`, and shown to the layer as the
# transposed *view*: the layer still sees an `[out, in]` tensor, but the CPU library streams memory in
# another order. The values and the results are the same (up to the order of additions):

# %%
layer = mid.blocks[0].mlp.fc  # [4C, C] = [1536, 384]
w_out_in = layer.weight.detach()
w_in_out = w_out_in.t().contiguous().t()  # the same values, stored transposed
x = torch.randn(1, 384, generator=torch.Generator().manual_seed(1))
print("same shape:", w_out_in.shape == w_in_out.shape, "| strides", w_out_in.stride(), "vs", w_in_out.stride())
print("same product within 1e-5:", bool((x @ w_out_in.t() - x @ w_in_out.t()).abs().max() < 1e-5))

# %%
def matvec_seconds(w, repeats=200):
    """Best time of one [1, in] x [in, out] product with weight w [out, in], over `repeats` runs."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        x @ w.t()
        best = min(best, time.perf_counter() - start)
    return best


layout_times = {"[out, in]": matvec_seconds(w_out_in), "[in, out]": matvec_seconds(w_in_out)}

# %% [markdown]
# Which is faster depends on the CPU, the library's kernels and the shape; section 4 prints what your
# machine measured for this one product. Either way the product reads the same bytes, so a layout cannot
# move the bound of section 1, which is why the course keeps `nn.Linear`'s own layout.

# %% [markdown]
# ## 3. Fewer bytes: bf16 weights
#
# **bf16** keeps fp32's 8 exponent bits and 7 of its 23 mantissa bits: the same range, two to three
# significant digits, half the bytes, so the bound of section 1 doubles. `bf16_weights(model)` returns a
# copy for decoding whose `nn.Linear` layers hold bf16 weights: each casts its input to bf16 and its output
# back to fp32, so everything else (LayerNorm, softmax, the residual stream) stays fp32. It uses only
# public PyTorch (forward hooks); the original model is untouched. Whether it is *faster* depends on the
# CPU: with native bf16 instructions (AVX512-BF16, AMX) products run at full speed; without them PyTorch
# converts and may be slower. It is an opt-in trade, never chosen for you.

# %%
#| export
def _input_to_bf16(module: torch.nn.Module, args: tuple) -> tuple:
    return (args[0].to(torch.bfloat16),) + tuple(args[1:])


def _output_to_fp32(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    return output.float()


def bf16_weights(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` in eval mode whose ``nn.Linear`` weights and biases are bf16, for decoding.

    Each Linear casts its input [..., in] to bf16 and its output [..., out] back to float32, so the
    activations between layers stay float32. A tied LM head shares its matrix with the token embedding,
    which becomes bf16 too (its rows are added to float32 positions, so the sum is float32). The weights
    read per token halve; the results change by bf16 rounding (2 to 3 significant digits). ``model``
    itself is not changed. For inference, not training.
    """
    bf16 = copy.deepcopy(model).eval()
    for module in bf16.modules():
        if isinstance(module, torch.nn.Linear):
            module.to(torch.bfloat16)
            module.register_forward_pre_hook(_input_to_bf16)
            module.register_forward_hook(_output_to_fp32)
    return bf16

# %% [markdown]
# It is a different, rounded model, so "the same tokens" cannot be the test; whether it is as good a model
# can. The validation loss on 32 windows of Shakespeare, fp32 against bf16 weights:

# %%
from transformer_course import load_shakespeare, train_val_split
from transformer_course.training import encode_corpus

small_bf16 = bf16_weights(model)
_, val_data = train_val_split(encode_corpus(tok, load_shakespeare()).long())
n = 32 * cfg.block_size
x_val, y_val = val_data[:n].view(32, -1), val_data[1 : n + 1].view(32, -1)
with torch.no_grad():
    loss_fp32, loss_bf16 = float(model(x_val, y_val)[1]), float(small_bf16(x_val, y_val)[1])
print("weights are bf16:", small_bf16.blocks[0].attn.qkv.weight.dtype, "| the original keeps", model.blocks[0].attn.qkv.weight.dtype)
print("validation loss changed by less than 0.01:", abs(loss_bf16 - loss_fp32) < 0.01)

# %% [markdown]
# And the greedy choices: given fp32's own greedy text as the prefix, how often does the bf16 copy pick
# the same next token? (Each position is counted alone: one flip would otherwise make every later token
# of a free-running text differ.) Wherever the two most likely tokens are nearly tied, rounding can flip
# the choice; how often depends on the CPU's bf16 kernels, so section 4 prints the share unchecked, with
# the 6 x 384 model's and the speed of its bf16 copy:

# %%
def greedy_agreement(m, m_bf16, idx, n):
    text = generate(m, idx, n, temperature=0)
    with torch.no_grad():
        picks = m_bf16(text[:, :-1])[0][:, idx.size(1) - 1 :].argmax(-1)
    return float((picks == text[:, idx.size(1) :]).float().mean())


mid_bf16 = bf16_weights(mid)
n_fit = cfg.block_size - prompt.size(1)  # the whole text must fit in the context: 57 new tokens
agreement = {f"course model, {n_fit} tokens": greedy_agreement(model, small_bf16, prompt, n_fit),
             "6 x 384, 64 tokens": greedy_agreement(mid, mid_bf16, mid_prompt, 64)}
mid_bf16_speed = decode_speed(mid_bf16, mid_prompt)
assert all(0 <= a <= 1 for a in agreement.values())

# %% [markdown]
# ## 4. What your machine measured, and the race against Hugging Face's `generate`
#
# `benchmarks/bench_decode.py` runs the measurements above properly, for three sizes up to GPT-2's, in one
# run: the read bandwidth, the plain decoder's tokens/s and its fraction of the bound, Hugging Face's
# `generate` on the same random weights (asserting the same greedy tokens), and the bf16 agreement. It
# writes `benchmarks/results/decode.md` and `.json` (in the course's repository; `make bench` rewrites them
# on the machine it runs on).
# The cell below prints this notebook's own measurements first, then the benchmark's stored table (none
# of it is checked: every machine differs).

# %%
# NBVAL_IGNORE_OUTPUT
# (timings of this run, then a file that `make bench` rewrites on the machine it runs on)
import json
from pathlib import Path

bound = bandwidth / mid_bytes
print(f"this machine: one-thread read bandwidth {bandwidth / 1e9:.1f} GB/s")
print(f"  6 x 384 fp32: {mid_bytes / 1e6:.1f} MB per token -> bound {bound:,.0f} tokens/s; measured "
      f"{mid_speed:,.0f} = {mid_speed / bound:.2f} of the bound; bf16 weights {mid_bf16_speed:,.0f} tokens/s")
work_ratio = sum(16 + i for i in range(64)) / (16 + 63)  # positions fed without / with the cache
print(f"  6 x 384, the KV cache: {mid_uncached:,.0f} tokens/s without it, {mid_speed:,.0f} with it "
      f"({mid_speed / mid_uncached:.1f}x the speed for {work_ratio:.1f}x less work)")
print(f"  GPT-2 124M fp32: bound {bandwidth / weight_bytes(gpt2):.1f} tokens/s")
for name, t in layout_times.items():
    print(f"  layout {name}: {t * 1e6:6.1f} µs per [1, 384] x [384, 1536] product")
for name, a in agreement.items():
    print(f"  bf16 weights, {name}: {a:.0%} of greedy choices equal to fp32's")
results = Path("../benchmarks/results/decode.json")  # absent outside the course's repository
race = json.loads(results.read_text()) if results.is_file() else {"meta": None, "rows": []}
if race["meta"] is None:
    print(f"no stored benchmark at {results}: `python benchmarks/bench_decode.py` writes one")
else:
    print(f"{race['meta']['cpu']}, 1 thread, read bandwidth {race['meta']['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, "
          f"written {race['meta']['written']}{' (quick run)' if race['meta']['quick'] else ''}\n")
for r in race["rows"]:
    print(f"{r['model']:34s} bound {r['bound_tps']:7,.0f}  ours {r['ours_tps']:7,.0f} tokens/s "
          f"({r['fraction_of_bound']:.2f} of it)  HF {r['hf_tps']:7,.0f} ({r['vs_hf']:.2f}x)  "
          f"bf16 agreement {r['bf16_agree']:.0%}")

# %% [markdown]
# For the small models a step is mostly fixed overhead, and a decoder that does one thing beats a general
# tool; at 124M both sides stream weights from memory, close to the bound, and neither can pull away.
#
# ## 5. Training on several processes: data parallelism
#
# One process trains on one CPU (all its cores) or one GPU. To use several GPUs, or several machines,
# the usual first step is **data parallelism**: every process holds a full copy of the model and works
# on its own rows of each batch.
#
# - Each process (a **rank**, numbered 0 to N-1) runs forward and backward on its rows, which gives the
#   gradient of *its* mean loss.
# - An **all-reduce** then adds each gradient tensor over the N ranks and hands every rank the sum; divided
#   by N, that is the gradient of the mean loss over all the rows of all ranks, exactly what one process
#   would compute on the whole batch (up to the order of the additions). PyTorch's
#   `DistributedDataParallel` (DDP) starts these all-reduces during backward, bucket by bucket, so the
#   talking overlaps the computing.
# - Every rank then takes the same optimizer step from the same weights, so the copies never drift
#   apart, and no weights need sending: only gradients.
#
# **The batch grows.** With N ranks of B windows each, one step sees N·B windows. A larger batch gives
# a less noisy gradient, so each step can be longer: for SGD, Goyal et al. (2017) scaled the learning
# rate in proportion to the batch (with a warm-up); for Adam-type optimizers a square-root rule is the
# common starting point (Malladi et al. 2022). Either way it is a new recipe to tune. The other choice
# keeps the recipe: hold the global batch fixed and let each rank **accumulate** gradients over fewer
# micro-batches as N grows (chapter 06's `accumulated_step`); the run then computes the same steps, just
# split differently. `transformer-course train` offers both: by default (`TRAIN_PRESETS` use one
# micro-batch) the global batch is N times the preset's batch; `--global-batch G` fixes it at G windows.
#
# **The engine.** `torchrun` starts N copies of a command and tells each its rank, the world size and
# where to meet (environment variables `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, ...); the
# processes then form a *process group* through a **backend**: **gloo** (collective operations over TCP,
# for CPU tensors) or **NCCL** (NVIDIA's library, GPU to GPU over NVLink, PCIe or InfiniBand; one GPU per
# rank). The course's trainer picks NCCL for CUDA and gloo for the CPU. Only rank 0 writes checkpoints
# and prints; evaluations are split over the ranks and averaged; if a rank dies, `torchrun` stops the
# others, and with `--max-restarts` starts them again, and they resume from the last checkpoint.
#
# ```
# torchrun --standalone --nproc-per-node 2 -m transformer_course train --preset tiny --out runs/dp
# torchrun --standalone --nproc-per-node 2 -m transformer_course train --preset tiny --out runs/dp --global-batch 12
# # two machines: the same command on each, naming one rendezvous endpoint
# torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint host0:29400 --rdzv-id run1 \
#     -m transformer_course train --preset tiny --out runs/dp
# ```
#
# **The code.** Those commands run `transformer_course/parallel.py`, which the next four cells
# export: chapter 06's training loop with what several processes change, around chapter 06's own
# `train_step`, `accumulated_step`, `lr_at` and `estimate_loss`. First its imports, and why it has
# a loop of its own.

# %%
#| export parallel
# Data-parallel training (parallel.py): chapter 06's training on the N processes `torchrun` starts.
# Design: a short loop of its own, built from chapter 06's step functions, schedule, evaluation and
# `_restore`, rather than a hook object passed to chapter 06's `train`. A hook would leave its calls
# (wrap, shard, mean, sum, any, gather, barrier) and the per-rank random states in chapter 06's
# one-process loop, where they mean nothing; the copy costs the loop's skeleton (about 30 lines),
# and here every line that differs shows what data parallelism changes. With one process it draws
# the same random numbers as chapter 06's `train`, and gives the same losses.
import math
import os
from dataclasses import dataclass, field, replace
from datetime import timedelta
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from transformer_course.checkpoint import Checkpoint, save_checkpoint
from transformer_course.config import History, TrainConfig
from transformer_course.data import get_batch
from transformer_course.model import GPT
from transformer_course.runtime import pick_device
from transformer_course.training import (
    EVAL_SEED_OFFSET,
    _now,
    _restore,
    _running_loss,
    accumulated_step,
    autocast_for,
    estimate_loss,
    lr_at,
    make_optimizer,
    train_step,
)

# a rank that waits longer than this for the others (a peer that hangs, not dies) ends the job
COLLECTIVE_TIMEOUT = timedelta(minutes=10)

# %% [markdown]
# A `World` is all the loop needs to know about the job: this process's rank, the number of ranks,
# and the few collective operations it uses. Outside `torchrun` it is a world of one, where every
# method is the identity.

# %%
#| export parallel
@dataclass(frozen=True)
class World:
    """This process's place in the job: `rank` of `size` processes; `device` holds the tensors of
    collective operations."""

    rank: int = 0
    size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        """Rank 0 writes checkpoints, logs and the progress bar; the others only compute."""
        return self.rank == 0

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """`model` as DistributedDataParallel (gradients averaged over ranks in backward), or itself
        alone. DDP copies rank 0's weights to every rank here, so all ranks start equal."""
        if self.size == 1:
            return model
        ids = [self.device.index] if self.device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)

    def shard(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """This rank's rows of each global batch [size * n, ...] -> [n, ...] (rank r takes rows r*n
        to r*n+n-1)."""
        if self.size == 1:
            return tensors
        out = []
        for t in tensors:
            if len(t) % self.size:
                raise ValueError(f"a global batch of {len(t)} rows does not split over {self.size} "
                                 "processes")
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
    """The job this process belongs to: a `World` of one unless a process group is running."""
    if not (dist.is_available() and dist.is_initialized()):
        return World()
    nccl = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    return World(dist.get_rank(), dist.get_world_size(), device)

# %% [markdown]
# Joining the job: `torchrun` sets `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE` and where
# to meet; each process checks that the machine has a core (or a GPU) for every local rank, picks
# its backend and starts the process group.

# %%
#| export parallel
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                      "TORCHELASTIC_RUN_ID")


def launched_by_torchrun() -> bool:
    """Whether `torchrun` started this process (all of its variables are set; none: a job of one). Some
    of them without the others, say left in a shell, raise a ValueError naming them: joining a job that
    does not exist would wait for peers until the collective timeout."""
    found = [name for name in TORCHRUN_VARIABLES if name in os.environ]
    if found and len(found) < len(TORCHRUN_VARIABLES):
        missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
        raise ValueError(f"{', '.join(found)} set but {', '.join(missing)} not: this process was not started "
                         f"by torchrun; start it with torchrun, or unset the rest (unset {' '.join(found)})")
    return bool(found)


def usable_cpus() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one, else all)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def start_from_environment(device: str | None) -> tuple[World, str]:
    """Join the job `torchrun` started: check the per-node process count against this machine,
    choose the backend by device (NCCL for CUDA, one GPU per local rank; gloo for the CPU), start
    the process group. Returns the World and the device string for this rank ("cuda:1", "cpu")."""
    local_rank, per_node = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    kind = device.split(":")[0]
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("--device cuda, but this machine has no CUDA GPU (NCCL, the GPU backend, needs one): "
                             "pass --device cpu to train on CPU processes (the gloo backend)")
        if per_node > (gpus := torch.cuda.device_count()):
            raise ValueError(f"--nproc-per-node {per_node} asks for one GPU per process but this "
                             f"machine has {gpus}; use --nproc-per-node {gpus} or fewer")
        device, backend = f"cuda:{local_rank}", "nccl"
        torch.cuda.set_device(local_rank)
    elif kind == "cpu":
        if per_node > (cores := usable_cpus()):
            raise ValueError(f"--nproc-per-node {per_node} asks for one CPU core per process but "
                             f"this machine has {cores}; use --nproc-per-node {cores} or fewer "
                             "(more processes than cores only wait for each other)")
        backend = "gloo"
    else:
        raise ValueError(f"data-parallel training runs on CUDA GPUs (NCCL) or CPUs (gloo), not on "
                         f"{kind!r}; pass --device cpu or --device cuda")
    dist.init_process_group(backend, store=_store_for_this_round(), rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]), timeout=COLLECTIVE_TIMEOUT)
    return current_world(), device


def _store_for_this_round() -> dist.Store:
    """The job's key-value store (where ranks publish their addresses), with keys of this restart
    round only. torchrun keeps one store across `--max-restarts` rounds; without a prefix per round,
    a restarted rank could read an address a dead rank of the last round published, and its
    connection is refused."""
    agent_hosts_it = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          int(os.environ["WORLD_SIZE"]), timeout=COLLECTIVE_TIMEOUT,
                          is_master=not agent_hosts_it and os.environ["RANK"] == "0")
    round_ = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"transformer_course/round_{round_}", store)


def stop() -> None:
    """Leave the process group (a no-op outside one)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()

# %% [markdown]
# The loop is chapter 06's, with what several ranks change marked: one global batch per step from
# the sampler every rank shares, each rank taking its rows; the model wrapped in DDP; the step's
# loss and the evaluations averaged over the ranks; a time limit the ranks agree on; rank 0 alone
# writing the checkpoint, which holds every rank's random state, so that dropout resumes exactly
# with as many ranks (and with fresh, distinct seeds with another number). Two ways a long run ends
# early are said plainly: a loss that is no longer finite stops it before a checkpoint takes the
# broken weights, and Ctrl-C says at which step it stopped (the last checkpoint is whole either way).

# %%
#| export parallel
def _restore_rank(resume: Checkpoint, model: GPT, optimizer, batches: torch.Generator, world: World,
                  seed: int) -> None:
    """Chapter 06's `_restore`; with several ranks, each then takes its own dropout state: the one
    it saved when the job had as many ranks, else a fresh seed distinct per rank and resume."""
    if world.size == 1:
        return _restore(resume, model, optimizer, batches)  # exactly chapter 06's resume
    # the saved CPU and CUDA states are rank 0's, not every rank's: keep only the batch sampler's
    batch_only = {key: state for key, state in resume.rng.items() if key == "batch"}
    _restore(replace(resume, rng=batch_only), model, optimizer, batches)
    if len(resume.rng.get("ranks", ())) == world.size:
        torch.set_rng_state(resume.rng["ranks"][world.rank].cpu())
    else:  # another number of processes
        torch.manual_seed(seed + world.rank + 1000 * resume.step)


def _evaluate(world: World, model, splits, block_size: int, cfg: TrainConfig, device) -> list:
    """`estimate_loss` of each split, every rank scoring its share of the batches; the shares of all
    ranks add up to the mean."""
    with autocast_for(device, cfg):
        return [world.sum(estimate_loss(model, data, block_size, cfg.batch_size, cfg.eval_iters,
                                        seed=cfg.seed + EVAL_SEED_OFFSET, device=device,
                                        shard=(world.rank, world.size)))
                for data in splits]


def _step(world: World, stepper, optimizer, batch, cfg: TrainConfig, device) -> float:
    """Chapter 06's `train_step` (or `accumulated_step`) on this rank's rows of the global `batch`
    (x, y); returns the loss over all ranks' rows."""
    x, y = world.shard(*batch)
    autocast = autocast_for(device, cfg)
    if cfg.grad_accum == 1:
        loss = train_step(stepper, optimizer, x, y, cfg.grad_clip, autocast)
    else:
        loss = accumulated_step(stepper, optimizer, x, y, cfg.grad_accum, cfg.grad_clip, autocast)
    return world.mean(loss)


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite: training stopped before a checkpoint took the broken weights."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during `train`, at `step` (the steps done); the last checkpoint written is whole."""

    def __init__(self, step: int):
        super().__init__(f"stopped at step {step}")
        self.step = step


def _check_finite(loss: float, step: int, what: str, path) -> None:
    """Raise `TrainingDiverged` if `loss` is NaN or infinite (every rank sees the same mean)."""
    if not math.isfinite(loss):
        kept = f"the last checkpoint, {path}, is kept as it was" if path and Path(path).exists() else "no checkpoint"
        raise TrainingDiverged(f"training diverged at step {step}: the {what} is {loss}; {kept}. Try a lower learning "
                               "rate (TrainConfig.learning_rate, --learning-rate), resuming from that checkpoint")


def _save(world: World, path, model: GPT, optimizer, batches: torch.Generator, **fields) -> None:
    """Rank 0 writes the checkpoint (if `path`), with every rank's CPU random state; every rank
    takes part in the gather, and none goes on (or returns) before the file is on disk."""
    rank_rng = world.gather(torch.get_rng_state()) if world.size > 1 else None
    if path is not None and world.is_main:
        save_checkpoint(path, model, optimizer, batch_generator=batches, rank_rng=rank_rng,
                        **fields)
    world.barrier()


def _prepare(model: GPT, cfg: TrainConfig, world: World, resume: Checkpoint | None):
    """The run's device, AdamW, batch sampler, history and first step (`resume`'s, if given); the
    model on the device in training mode."""
    device = pick_device(cfg.device)
    model.to(device).train()
    optimizer, batches = make_optimizer(model, cfg), torch.Generator().manual_seed(cfg.seed)
    history, step = History(), 0
    if world.size > 1:  # distinct dropout draws per rank
        torch.manual_seed(cfg.seed + world.rank)
    if resume is not None:
        _restore_rank(resume, model, optimizer, batches, world, cfg.seed)
        history, step = resume.history or history, resume.step
    return device, optimizer, batches, history, step


def _timed_step(world: World, stepper, optimizer, batch, step: int, cfg: TrainConfig, device,
                history: History, checkpoint_path) -> None:
    """Step `step` at the schedule's learning rate on `batch()` (drawn once the clock runs, as
    chapter 06 does); its loss, checked finite, its rate and its time go into `history`."""
    tick, lr = _now(device), lr_at(step, cfg)
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss = _step(world, stepper, optimizer, batch(), cfg, device)
    _check_finite(loss, step, "training loss", checkpoint_path)
    history.loss.append(loss)
    history.step.append(step)
    history.lr.append(lr)
    history.train_seconds += _now(device) - tick


def _evaluation_line(step: int, max_iters: int, shown: dict, history: History) -> str:
    """The plain log line of the evaluation just recorded in `history`."""
    running = f"running loss {shown['loss']}, " if "loss" in shown else ""
    return (f"step {step}/{max_iters}: {running}train loss {history.train_loss[-1]:.4f}, "
            f"val loss {history.val_loss[-1]:.4f}, {history.eval_seconds[-1]:.0f} s")


def train(model: GPT, train_data: torch.Tensor, val_data: torch.Tensor,
          cfg: TrainConfig | None = None, *, resume: Checkpoint | None = None, checkpoint_path=None,
          tokenizer=None, log=None) -> History:
    """Chapter 06's `train` on every rank of the job (outside torchrun a job of one, with chapter
    06's numbers): each rank steps on its rows of every global batch; gradients (DDP), losses and
    evaluations are averaged over the ranks; rank 0 alone writes and shows the progress bar
    (`log`, a function such as `print`: one plain line per evaluation on rank 0 instead, for logs).
    Raises `TrainingDiverged` at a loss that is not finite, `TrainingInterrupted` at Ctrl-C."""
    from tqdm.auto import tqdm

    cfg, world = cfg or TrainConfig(), current_world()
    device, optimizer, batches, history, step = _prepare(model, cfg, world, resume)
    global_rows = cfg.batch_size * cfg.grad_accum * world.size  # windows per step, all ranks
    history.tokens_per_step = global_rows * model.cfg.block_size  # ranks may differ from last run's
    forward = torch.compile(model) if cfg.compile else model
    stepper = world.wrap(forward)  # DDP: backward averages the gradients over the ranks
    began, base = _now(device), history.wall_seconds
    # one global batch from the sampler every rank shares; each rank steps on its rows
    draw = partial(get_batch, train_data, model.cfg.block_size, global_rows, generator=batches, device=device)

    def evaluate() -> None:
        splits = (train_data, val_data)
        train_loss, val_loss = _evaluate(world, forward, splits, model.cfg.block_size, cfg, device)
        _check_finite(train_loss + val_loss, step, "evaluated loss", checkpoint_path)
        history.train_loss.append(train_loss)
        history.val_loss.append(val_loss)
        history.eval_step.append(step)
        history.eval_seconds.append(base + _now(device) - began)
        shown = _running_loss(history.loss, history.train_loss, history.val_loss)
        bar.set_postfix(shown)
        if log is not None and world.is_main:
            log(_evaluation_line(step, cfg.max_iters, shown, history))
        _save(world, checkpoint_path, model, optimizer, batches, step=step, train_config=cfg,
              tokenizer=tokenizer, history=history)

    bar = tqdm(total=cfg.max_iters, initial=step, desc="training", unit="step", mininterval=1.0,
               disable=not (cfg.progress and log is None and world.is_main))
    try:
        while step < cfg.max_iters:
            if step % cfg.eval_interval == 0 and step not in history.eval_step:
                evaluate()
            # the ranks' clocks differ: all stop at one step, or one would wait for the others forever
            if cfg.max_seconds is not None and world.any(_now(device) - began > cfg.max_seconds):
                break
            _timed_step(world, stepper, optimizer, draw, step, cfg, device, history, checkpoint_path)
            step += 1
            bar.set_postfix(_running_loss(history.loss, history.train_loss, history.val_loss), refresh=False)
            bar.update(1)
        if step not in history.eval_step:
            evaluate()
    except KeyboardInterrupt:
        raise TrainingInterrupted(step) from None
    finally:
        bar.close()  # its last line before any message
    history.wall_seconds = base + _now(device) - began
    model.eval()
    return history

# %% [markdown]
# The cell below runs a two-process job through the command line (about half a minute), and the same
# 60 steps in one process with gradient accumulation over the same global batch of 24 windows.

# %%
import os
import subprocess
import sys
import tempfile

import matplotlib.pyplot as plt

from transformer_course.config import History


def run_train(out: str, processes: int, *flags: str) -> History:
    """`transformer-course train --preset tiny` for 60 steps in `out`, under torchrun when processes > 1."""
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"] if processes > 1 else []
    command = [sys.executable, *launcher, "-m", "transformer_course", "train", "--preset", "tiny", "--out", out,
               "--max-iters", "60", "--eval-interval", "30", "--device", "cpu", *flags]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return History.from_dict(json.loads(Path(out, "history.json").read_text()))


with tempfile.TemporaryDirectory() as scratch:
    two = run_train(f"{scratch}/two", 2)  # 12 windows per rank: a global batch of 24
    one = run_train(f"{scratch}/one", 1, "--global-batch", "24")  # 2 micro-batches of 12
print("windows per step:", two.tokens_per_step // 64, "(two processes)", one.tokens_per_step // 64, "(one process)")
gap = max(abs(a - b) for a, b in zip(two.loss + two.val_loss, one.loss + one.val_loss))
print(f"every step's loss and every evaluation equal within 1e-5: {gap < 1e-5}")
fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(one.step, one.loss, lw=3, color="0.75", label="1 process, 2 micro-batches")
ax.plot(two.step, two.loss, lw=1, color="C0", label="2 processes (gloo)")
ax.set(xlabel="step", ylabel="loss", title="The same steps, split differently")
ax.legend()
plt.show()

# %% [markdown]
# The two curves are one. On a machine with two cores the two processes are not twice as fast: they
# share the cores the single process used, and they spend time in the all-reduce.
# `benchmarks/bench_ddp.py` measures tokens/s with one and two processes, and with two "nodes" on the
# loopback interface, against the limit of N independent processes; its table is
# `benchmarks/results/ddp.md` (the README's measured table quotes it).

# %% [markdown]
# ## Summary
#
# - At batch 1 a decode step reads every weight once per token: tokens/s <= bandwidth / (bytes of weights
#   + cache read per token). At GPT-2 124M in fp32 that is about half a gigabyte per token.
# - A weight's layout changes how memory is streamed, not the results nor the bytes read: it cannot move the bound.
# - bf16 weights halve the bytes and double the bound, at the price of some flipped greedy choices (the
#   validation loss barely moves); `bf16_weights` is opt-in.
# - Hugging Face's `generate` and the course's loop give the same greedy tokens; `benchmarks/bench_decode.py`
#   measures both against the bound.
# - Data parallelism: every rank computes the gradient of its rows, an all-reduce averages them, every rank
#   takes the same step. The global batch is N times the per-rank batch unless gradient accumulation holds
#   it fixed (`--global-batch`); then N processes compute the same run as one.
#
# **Exported to `transformer_course.performance`:** `bf16_weights`. **To
# `transformer_course.parallel`:** `World`, `current_world`, `launched_by_torchrun`,
# `start_from_environment`, `stop` and `train`.
