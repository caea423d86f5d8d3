"""The GPU tier (issue 26): what must hold on a real CUDA GPU, proven against the CPU.

Every test that needs a GPU is marked ``cuda`` and skipped, with one reason (``SKIP_REASON``), where no
CUDA GPU is available or ``TRANSFORMER_COURSE_DEVICE`` pins another device, as ``make test`` does: there
they count as skips, and on a machine with a GPU ``make test`` does not run them a second time.
``make test-gpu`` runs them (``pytest -m cuda tests/test_gpu.py``, the device left to PyTorch) and
stores the outcome in ``benchmarks/results/gpu_tests.json``.

What they prove, in float32 with TF32 switched off for every comparison (``full_fp32``):
- forward and backward of every module (attention head, multi-head attention on both paths, block,
  GPT, the modern decoder, the encoder-decoder) on CUDA equal the CPU's within ``FP32_TOL``;
- the fused attention kernels (flash, memory-efficient, cuDNN; each forced with the public
  ``torch.nn.attention.sdpa_kernel``, skipped where the GPU has none) equal the teaching path;
- bf16 autocast training (``train`` with ``TrainConfig(device="cuda")``) lowers the loss, eager and compiled;
- the KV cache equals recomputing on CUDA; greedy decoding of the shipped course model gives the same
  tokens on the CPU and on CUDA; ``torch.compile`` of the model equals eager;
- a checkpoint saved on CUDA loads on the CPU and back, and training resumes from it on CUDA.

Errors are relative norms, ‖a − b‖ / ‖b‖, over each whole tensor. The helpers take the device as an
argument; the CPU self-checks at the end run them with "cpu" against "cpu" (and a CPU smoke run of
``benchmarks/bench_gpu.py``), so ``make test`` catches a mistake in them on any machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from transformer_course.attention import AttentionHead
from transformer_course.block import TransformerBlock
from transformer_course.checkpoint import load_checkpoint
from transformer_course.config import GPTConfig, TrainConfig
from transformer_course.course_model import SAMPLE_PROMPT, load_course_model
from transformer_course.encoder_decoder import EncoderDecoder, Seq2SeqConfig
from transformer_course.generation import encode_prompt, generate
from transformer_course.model import GPT
from transformer_course.modern import build_gpt
from transformer_course.multihead import MultiHeadAttention
from transformer_course.runtime import DEVICE_ENV
from transformer_course.training import autocast_for, train

ROOT = Path(__file__).resolve().parents[1]

_PINNED = os.environ.get(DEVICE_ENV, "").strip().lower()
CUDA_READY = torch.cuda.is_available() and (_PINNED in ("", "cuda") or _PINNED.startswith("cuda:"))
SKIP_REASON = (f"needs a CUDA GPU: none here, or {DEVICE_ENV} pins another device (make test pins the CPU); "
               "run `make test-gpu` on a machine with one")


def on_cuda(test: Callable) -> Callable:
    """Mark a test as the GPU tier's: selected by `-m cuda`, skipped without a CUDA GPU."""
    return pytest.mark.cuda(pytest.mark.skipif(not CUDA_READY, reason=SKIP_REASON)(test))


FP32_TOL = 1e-5  # float32 on two devices: the same function, summed in another order
BF16_TOL = 1e-2  # a bf16 kernel against float32 on the same (bf16-valued) inputs: 8-bit mantissas
LLAMA = dict(bias=False, positional="rope", normalization="rmsnorm", mlp="swiglu", n_kv_head=2, eps=1e-6)


@contextlib.contextmanager
def full_fp32():
    """float32 matrix products and convolutions in full float32 (TF32 off) inside, as they were after."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ in float64 on the CPU (‖a − b‖ itself when b is all zeros)."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    scale = b.norm().item()
    return (a - b).norm().item() / (scale if scale > 0 else 1.0)


def worst(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> tuple[float, str]:
    """The largest `relative_error` over the entries of two results with the same keys, and its key."""
    if first.keys() != second.keys():
        raise ValueError(f"the results hold different entries: {sorted(first.keys() ^ second.keys())}")
    return max((relative_error(first[key], second[key]), key) for key in first)


# ---------------------------------------------------------------- every module, forward and backward

def _gpt(**change) -> GPT:
    return build_gpt(GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=4, d_model=64, **change))


def _ids(generator: torch.Generator, high: int, *shape: int) -> torch.Tensor:
    return torch.randint(1, high, shape, generator=generator)


def _padded(ids: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """`ids` with everything after each row's length set to 0, the padding id."""
    keep = torch.arange(ids.shape[1])[None, :] < torch.tensor(lengths)[:, None]
    return ids.masked_fill(~keep, 0)


def _keys_kept(lengths: list[int], T: int) -> torch.Tensor:
    """Bool [B, 1, 1, T]: True for the first lengths[b] keys of row b (the rest are padding)."""
    return torch.arange(T)[None, None, None, :] < torch.tensor(lengths)[:, None, None, None]


def _seq2seq() -> EncoderDecoder:
    return EncoderDecoder(Seq2SeqConfig(src_vocab_size=40, tgt_vocab_size=30, max_src_len=16, max_tgt_len=12,
                                        d_model=64, n_head=4))


# name -> (build the module, make its inputs from a CPU generator); the first input is what gradients reach
CASES: dict[str, tuple[Callable[[], torch.nn.Module], Callable[[torch.Generator], tuple]]] = {
    "attention head (03)": (lambda: AttentionHead(64, 16), lambda g: (torch.randn(2, 24, 64, generator=g),)),
    "multi-head attention, teaching path (04)": (lambda: MultiHeadAttention(64, 4, fast=False),
                                                 lambda g: (torch.randn(2, 24, 64, generator=g),)),
    "multi-head attention, fused path (04)": (lambda: MultiHeadAttention(64, 4, fast=True),
                                              lambda g: (torch.randn(2, 24, 64, generator=g),)),
    "multi-head attention, fused, padding mask (04)": (
        lambda: MultiHeadAttention(64, 4, fast=True),
        lambda g: (torch.randn(2, 24, 64, generator=g), _keys_kept([24, 17], 24))),
    "transformer block (05)": (lambda: TransformerBlock(64, 4), lambda g: (torch.randn(2, 24, 64, generator=g),)),
    "GPT (06)": (_gpt, lambda g: (_ids(g, 65, 2, 32), _ids(g, 65, 2, 32))),
    "GPT, teaching paths (06)": (lambda: _gpt(fast=False), lambda g: (_ids(g, 65, 2, 32), _ids(g, 65, 2, 32))),
    "modern decoder: RMSNorm, SwiGLU, RoPE, GQA (10)": (lambda: _gpt(**LLAMA),
                                                        lambda g: (_ids(g, 65, 2, 32), _ids(g, 65, 2, 32))),
    "encoder-decoder (09)": (_seq2seq, lambda g: (_padded(_ids(g, 40, 2, 16), [16, 11]), _ids(g, 30, 2, 12),
                                                  _padded(_ids(g, 30, 2, 12), [12, 7]))),
}


def forward_backward(name: str, device: str, *, compile_backend: str | None = None) -> dict[str, torch.Tensor]:
    """Run CASES[name] on `device`: the module built on the CPU from seed 0 and moved there, in train mode
    (no dropout: every case has none). Returns its output, the loss, and the gradient of every parameter
    (and of a float input), all on the CPU. `compile_backend`: run it through `torch.compile` with it."""
    build, make_inputs = CASES[name]
    torch.manual_seed(0)
    module = build().to(device).train()
    inputs = [t.to(device) for t in make_inputs(torch.Generator().manual_seed(1))]
    if inputs[0].is_floating_point():
        inputs[0].requires_grad_(True)
    run = torch.compile(module, backend=compile_backend) if compile_backend else module
    out = run(*inputs)
    if isinstance(out, tuple):  # (logits, loss): the models
        out, loss = out
    else:  # a layer: a fixed random weighting of its output
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(device)
        loss = (out * weights).sum()
    loss.backward()
    result = {"output": out, "loss": loss}
    if inputs[0].requires_grad:
        result["grad of the input"] = inputs[0].grad
    for param_name, param in module.named_parameters():
        if param.grad is None:
            raise AssertionError(f"{name}: no gradient reached {param_name}")
        result[f"grad of {param_name}"] = param.grad
    return {key: value.detach().cpu() for key, value in result.items()}


@on_cuda
@pytest.mark.parametrize("name", CASES)
def test_forward_and_backward_on_cuda_equal_the_cpu(name, record_property):
    with full_fp32():
        error, key = worst(forward_backward(name, "cuda"), forward_backward(name, "cpu"))
    record_property("max_relative_error", error)
    assert error <= FP32_TOL, f"{name}: {key} differs between CUDA and the CPU by {error:.2e} (relative) > {FP32_TOL}"


@on_cuda
@pytest.mark.parametrize("name", ["GPT (06)", "modern decoder: RMSNorm, SwiGLU, RoPE, GQA (10)"])
def test_torch_compile_equals_eager_on_cuda(name, record_property):
    with full_fp32():
        error, key = worst(forward_backward(name, "cuda", compile_backend="inductor"), forward_backward(name, "cuda"))
    record_property("max_relative_error", error)
    assert error <= FP32_TOL, f"{name}: compiled {key} differs from eager by {error:.2e} (relative) > {FP32_TOL}"


# ---------------------------------------------------------------- fused attention kernels

# backend -> the dtypes it is tried in, and whether it takes an arbitrary mask (flash and cuDNN do not)
BACKENDS = {
    "flash": (SDPBackend.FLASH_ATTENTION, (torch.bfloat16,), False),
    "memory-efficient": (SDPBackend.EFFICIENT_ATTENTION, (torch.float32, torch.bfloat16), True),
    "cuDNN": (SDPBackend.CUDNN_ATTENTION, (torch.bfloat16,), False),
}
MASKS = ("causal", "one new query over a cache", "padding mask")
KERNEL_CASES = [pytest.param(backend, dtype, mask, id=f"{backend}-{str(dtype).removeprefix('torch.')}-{mask}")
                for backend, (_, dtypes, any_mask) in BACKENDS.items() for dtype in dtypes for mask in MASKS
                if any_mask or mask != "padding mask"]


def attend_both_ways(device: str, dtype: torch.dtype, mask_kind: str, backend: SDPBackend) -> tuple[float, float]:
    """`MultiHeadAttention.attend` on the fused path in `dtype`, forced onto `backend`, against the
    teaching path in float32 on the same (dtype-rounded) inputs: relative errors of the output and of
    the gradients of q, k and v (the worst of the three). Batch 2, 4 heads of 64 channels, 48 keys (a
    multiple of 16, as the memory-efficient kernel wants a mask's last dimension)."""
    g = torch.Generator().manual_seed(3)
    T_total = 48
    T = 1 if mask_kind == "one new query over a cache" else T_total
    q = torch.randn(2, 4, T, 64, generator=g).to(dtype)
    k, v = (torch.randn(2, 4, T_total, 64, generator=g).to(dtype) for _ in range(2))
    weights = torch.randn(2, 4, T, 64, generator=g)
    mask = None
    if mask_kind == "padding mask":  # the second sequence's last 9 keys are padding
        mask = _keys_kept([T_total, T_total - 9], T_total).to(device)
    results = []
    for fast, use_dtype in ((True, dtype), (False, torch.float32)):
        attention = MultiHeadAttention(256, 4, fast=fast)
        leaves = [t.detach().to(device=device, dtype=use_dtype).requires_grad_(True) for t in (q, k, v)]
        with sdpa_kernel([backend]) if fast else contextlib.nullcontext():
            out = attention.attend(*leaves, mask)
            (out.float() * weights.to(device)).sum().backward()
        results.append((out, [leaf.grad for leaf in leaves]))
    (fused, fused_grads), (teaching, teaching_grads) = results
    grad_error = max(relative_error(a.float(), b) for a, b in zip(fused_grads, teaching_grads, strict=True))
    return relative_error(fused.float(), teaching), grad_error


@on_cuda
@pytest.mark.parametrize("backend, dtype, mask_kind", KERNEL_CASES)
def test_fused_attention_kernels_equal_the_teaching_path_on_cuda(backend, dtype, mask_kind, record_property):
    tol = FP32_TOL if dtype == torch.float32 else BF16_TOL
    try:
        with full_fp32():
            out_error, grad_error = attend_both_ways("cuda", dtype, mask_kind, BACKENDS[backend][0])
    except RuntimeError as error:
        if "No available kernel" in str(error):
            pytest.skip(f"this GPU has no {backend} kernel for this case: {str(error).splitlines()[0]}")
        raise
    record_property("max_relative_error", max(out_error, grad_error))
    assert out_error <= tol, f"{backend} output differs from the teaching path by {out_error:.2e} > {tol}"
    assert grad_error <= tol, f"{backend} gradients differ from the teaching path by {grad_error:.2e} > {tol}"


# ---------------------------------------------------------------- training with bf16 autocast

def shakespeare_tensors() -> tuple[torch.Tensor, torch.Tensor, int]:
    """The course's Shakespeare, encoded: train and val token ids and the vocabulary size."""
    from transformer_course.data import load_shakespeare, train_val_split
    from transformer_course.tokenization import CharTokenizer
    from transformer_course.training import encode_corpus

    text = load_shakespeare()
    tokenizer = CharTokenizer.from_text(text)
    train_data, val_data = train_val_split(encode_corpus(tokenizer, text))
    return train_data, val_data, tokenizer.vocab_size


def short_run(device: str, train_data: torch.Tensor, val_data: torch.Tensor, vocab_size: int, steps: int, *,
              compile: bool = False, checkpoint_path=None, resume=None, model: GPT | None = None):
    """`train` on `device` for `steps` steps of chapter 06's tiny model, bf16 left to the trainer (on a CUDA
    GPU: autocast): evaluated before and after. Returns (model, history)."""
    torch.manual_seed(0)
    model = model or GPT.from_preset("tiny", vocab_size=vocab_size)
    cfg = TrainConfig(max_iters=steps, batch_size=16, learning_rate=2e-3, min_lr=2e-4, warmup_iters=10,
                      eval_interval=max(steps, 1), eval_iters=4, device=device, compile=compile, progress=False)
    history = train(model, train_data, val_data, cfg, checkpoint_path=checkpoint_path, resume=resume)
    return model, history


@pytest.fixture(scope="module")
def shakespeare():
    return shakespeare_tensors()


@on_cuda
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_bf16_autocast_training_lowers_the_loss_on_cuda(shakespeare, compile, record_property):
    context = autocast_for(torch.device("cuda"), TrainConfig(device="cuda"))
    assert isinstance(context, torch.autocast) and context.fast_dtype == torch.bfloat16, "no bf16 autocast on this GPU"
    _, history = short_run("cuda", *shakespeare, steps=200, compile=compile)
    before, after = history.val_loss[0], history.val_loss[-1]
    record_property("val_loss_before", before)
    record_property("val_loss_after", after)
    assert all(torch.isfinite(torch.tensor(history.loss))), "a training loss was not finite"
    assert after < before - 1.5, f"200 bf16 steps took val loss from {before:.3f} to {after:.3f} only"


# ---------------------------------------------------------------- KV cache, greedy decoding

def cache_error(model: GPT, device: str) -> float:
    """Logits of 2 x 24 tokens computed at once, against a prefill of 10 then one token at a time with
    the KV cache, on `device` (eval mode, no gradients): relative error."""
    model = model.to(device).eval()
    idx = _ids(torch.Generator().manual_seed(4), model.cfg.vocab_size, 2, 24).to(device)
    with torch.no_grad():
        whole = model(idx)[0]
        cache = model.new_cache()
        parts = [model(idx[:, :10], cache=cache)[0]]
        parts += [model(idx[:, t : t + 1], cache=cache)[0] for t in range(10, 24)]
    return relative_error(torch.cat(parts, dim=1), whole)


def greedy_with_and_without_cache(model: GPT, device: str) -> tuple[list, list]:
    model = model.to(device).eval()
    idx = _ids(torch.Generator().manual_seed(5), model.cfg.vocab_size, 3, 5).to(device)
    return [generate(model, idx, 40, temperature=0, use_cache=use).tolist() for use in (True, False)]


CACHE_MODELS = {"GPT, fused": lambda: _gpt(), "GPT, teaching paths": lambda: _gpt(fast=False),
                "modern decoder": lambda: _gpt(**LLAMA)}


@on_cuda
@pytest.mark.parametrize("name", CACHE_MODELS)
def test_kv_cache_equals_recompute_on_cuda(name, record_property):
    torch.manual_seed(0)
    with full_fp32():
        error = cache_error(CACHE_MODELS[name](), "cuda")
        cached, recomputed = greedy_with_and_without_cache(CACHE_MODELS[name](), "cuda")
    record_property("max_relative_error", error)
    assert error <= FP32_TOL, f"{name}: cached logits differ from recomputed ones by {error:.2e} > {FP32_TOL}"
    assert cached == recomputed, f"{name}: greedy tokens with the cache differ from those without"


def course_model_greedy(device: str, n: int = 200) -> list[int]:
    """The shipped course model's greedy continuation of its sample prompt, computed on `device`."""
    checkpoint = load_course_model()
    idx = encode_prompt(checkpoint.tokenizer, SAMPLE_PROMPT, device=device)
    return generate(checkpoint.model.to(device), idx, n, temperature=0)[0].tolist()


@on_cuda
def test_greedy_tokens_of_the_course_model_equal_on_cpu_and_cuda():
    with full_fp32():
        gpu, cpu = course_model_greedy("cuda"), course_model_greedy("cpu")
    first = next((i for i, (a, b) in enumerate(zip(gpu, cpu, strict=True)) if a != b), None)
    assert first is None, (f"greedy tokens differ from position {first} on: CUDA {gpu[first:first + 5]}, "
                           f"CPU {cpu[first:first + 5]}")


@on_cuda
def test_generate_names_the_fix_for_a_prompt_or_generator_on_the_cpu():
    model = _gpt().to("cuda")
    with pytest.raises(ValueError, match=r"the prompt is on cpu but the model on cuda:0: .*idx\.to\('cuda:0'\)"):
        generate(model, torch.tensor([[1, 2]]), 3)
    with pytest.raises(ValueError, match=r"the generator draws on cpu but the prompt is on cuda:0: "
                                         r".*torch\.Generator\('cuda'\)"):
        generate(model, torch.tensor([[1, 2]], device="cuda"), 3, generator=torch.Generator().manual_seed(0))
    assert generate(model, torch.tensor([[1, 2]], device="cuda"), 3,
                    generator=torch.Generator("cuda").manual_seed(0)).shape == (1, 5)


@on_cuda
def test_evaluation_of_a_model_on_cuda_needs_no_device_argument(shakespeare):
    from transformer_course.training import estimate_loss

    model = GPT(GPTConfig(vocab_size=shakespeare[2], block_size=32, n_layer=2, n_head=4, d_model=64)).to("cuda")
    plain = estimate_loss(model, shakespeare[1], 32, 4, 3)
    assert plain == estimate_loss(model, shakespeare[1], 32, 4, 3, device="cuda")


# ---------------------------------------------------------------- checkpoints across devices

def checkpoint_across(device: str, other: str, data, tmp_path: Path) -> tuple[float, list[str]]:
    """Train 5 steps on `device` writing a checkpoint (`train` saves it); load it with
    `map_location=other`, move its model there, then load it back onto `device`. Returns the relative
    error of the logits of the model on `other` against the trained one, and the problems found
    (weights not equal bit for bit, optimizer tensors not on the device asked for)."""
    train_data, val_data, vocab = data
    path = tmp_path / "checkpoint.pt"
    model, _ = short_run(device, train_data, val_data, vocab, steps=5, checkpoint_path=path)
    problems, moved = [], {}
    for where in (other, device):
        loaded = load_checkpoint(path, map_location=where)
        moved[where] = loaded.model.to(where)
        for (name, saved), (_, back) in zip(model.state_dict().items(), moved[where].state_dict().items(), strict=True):
            if not torch.equal(back.cpu(), saved.cpu()):
                problems.append(f"{name} changed on its way to {where}")
        states = [t for s in loaded.optimizer_state["state"].values() for t in s.values()
                  if torch.is_tensor(t) and t.dim()]
        problems += [f"an optimizer tensor loaded onto {t.device}, not {where}" for t in states
                     if t.device.type != torch.device(where).type]
    idx = _ids(torch.Generator().manual_seed(6), vocab, 2, 32)
    with torch.no_grad():
        there, here = moved[other](idx.to(other))[0], model.eval()(idx.to(device))[0]
    return relative_error(there, here), problems


@on_cuda
def test_checkpoint_saved_on_cuda_loads_on_the_cpu_and_back(shakespeare, tmp_path, record_property):
    with full_fp32():
        error, problems = checkpoint_across("cuda", "cpu", shakespeare, tmp_path)
    record_property("max_relative_error", error)
    assert not problems, problems
    assert error <= FP32_TOL, f"the checkpoint's model on the CPU differs from the trained one on CUDA by {error:.2e}"


@on_cuda
@pytest.mark.parametrize("where", ["cpu", "cuda"])
def test_training_resumes_on_cuda_from_a_checkpoint_loaded_onto(where, shakespeare, tmp_path):
    path = tmp_path / "checkpoint.pt"
    short_run("cuda", *shakespeare, steps=5, checkpoint_path=path)
    resumed = load_checkpoint(path, map_location=where)
    _, history = short_run("cuda", *shakespeare, steps=8, resume=resumed, model=resumed.model)
    assert history.step[-1] == 7 and history.eval_step[-1] == 8


@on_cuda
def test_data_parallel_training_runs_on_nccl(tmp_path):
    """torchrun with as many processes as GPUs (NCCL, one GPU each): the job trains and rank 0 checkpoints."""
    processes = torch.cuda.device_count()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes), "-m",
               "transformer_course", "train", "--preset", "tiny", "--out", str(tmp_path / "run"), "--device", "cuda",
               "--max-iters", "40", "--eval-interval", "20"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ,
                               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    assert done.returncode == 0, done.stderr[-3000:]
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert history["eval_step"] == [0, 20, 40] and history["val_loss"][-1] < history["val_loss"][0]
    assert history["tokens_per_step"] == 12 * processes * 64
    assert load_checkpoint(tmp_path / "run" / "checkpoint.pt").step == 40


# ---------------------------------------------------------------- the same helpers on the CPU, today

@pytest.mark.parametrize("name", CASES)
def test_self_check_forward_backward_cpu_against_cpu(name):
    first, second = forward_backward(name, "cpu"), forward_backward(name, "cpu")
    assert worst(first, second)[0] == 0.0  # deterministic: every entry equal, bit for bit
    assert len(first) >= 4 and any(key.startswith("grad of") for key in first)


def test_self_check_compile_cpu_against_cpu():  # Dynamo without Inductor: seconds, not a minute, on a CPU
    name = "attention head (03)"
    error, key = worst(forward_backward(name, "cpu", compile_backend="eager"), forward_backward(name, "cpu"))
    assert error <= FP32_TOL, key


@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_self_check_fused_attention_on_the_cpu(dtype, mask_kind):
    out_error, grad_error = attend_both_ways("cpu", dtype, mask_kind, SDPBackend.MATH)
    tol = FP32_TOL if dtype == torch.float32 else BF16_TOL
    assert out_error <= tol and grad_error <= tol, (out_error, grad_error)
    assert KERNEL_CASES and all(len(case.values) == 3 for case in KERNEL_CASES)


def test_self_check_training_cache_and_checkpoint_on_the_cpu(tmp_path):
    corpus = torch.arange(30_000) % 17  # a sequence that context predicts exactly: the loss falls fast
    data = corpus[:27_000], corpus[27_000:], 17
    _, history = short_run("cpu", *data, steps=30)
    assert history.val_loss[-1] < history.val_loss[0] - 0.5, history.val_loss
    torch.manual_seed(0)
    assert cache_error(_gpt(**LLAMA), "cpu") <= FP32_TOL
    cached, recomputed = greedy_with_and_without_cache(_gpt(), "cpu")
    assert cached == recomputed
    error, problems = checkpoint_across("cpu", "cpu", data, tmp_path)
    assert error == 0.0 and not problems, problems


def test_self_check_course_model_greedy_on_the_cpu():
    tokens = course_model_greedy("cpu", n=20)
    assert len(tokens) == len(SAMPLE_PROMPT) + 20 and tokens == course_model_greedy("cpu", n=20)


def test_every_gpu_test_is_marked_and_skips_with_the_reason():
    """Each test of this file either needs CUDA (marked `cuda`, skipped with SKIP_REASON without it) or is
    a CPU self-check (unmarked): nothing in between, so `make test` on a CPU counts the tier as skips."""
    tests = {name: test for name, test in globals().items() if name.startswith("test_") and callable(test)}
    for name, test in tests.items():
        marks = {mark.name: mark for mark in getattr(test, "pytestmark", [])}
        if name.startswith("test_self_check") or name == "test_every_gpu_test_is_marked_and_skips_with_the_reason":
            assert "cuda" not in marks, name
        else:
            assert "cuda" in marks and marks["skipif"].kwargs["reason"] == SKIP_REASON, name
            assert marks["skipif"].args == (not CUDA_READY,), name


def test_self_check_bench_gpu_smoke(tmp_path):
    """`benchmarks/bench_gpu.py --smoke` on the CPU: tiny sizes, a few steps, its tables written."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop(DEVICE_ENV, None)
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), "--smoke", "--device", "cpu",
                           "--out", str(tmp_path)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "gpu.json").read_text())
    assert report["smoke"] and report["meta"]["machine_info"]["cpu"]
    assert {"course_trainer", "nanogpt_ops", "full_run"} <= set(report["training"])
    assert [(row["dtype"], row["batch"]) for row in report["decoding"]] == [
        ("float32", 1), ("float32", 2), ("bfloat16", 1), ("bfloat16", 2)]
    assert all(row["same_tokens"] for row in report["decoding"] if row["dtype"] == "float32")
    text = (tmp_path / "gpu.md").read_text()
    assert text.count("Machine:") == 1 and "6N + 12" in text
