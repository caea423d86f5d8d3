"""Tests for transformer_course.decoding (chapter 07): weights laid out, packed or rounded for decoding.

References: nn.Linear / F.linear on the untouched weights (plain layouts must agree exactly, packed ones
to float rounding), a hand-rounded bf16 product, and the tokens of the untuned model. Timing is rigged
with a fake clock so each layout can be made to win.
"""

from __future__ import annotations

import copy
import io
import pickle
from pathlib import Path

import pytest
import torch

from transformer_course import decoding
from transformer_course.block import TransformerBlock
from transformer_course.decoding import (
    HUGE_PAGE,
    LAYOUTS,
    DecodeBlock,
    DecodeLinear,
    compiling_available,
    copy_in_huge_pages,
    huge_pages_available,
    packing_available,
    tune_for_decoding,
)
from transformer_course.generation import generate
from transformer_course.model import GPT, GPTConfig

needs_packing = pytest.mark.skipif(not packing_available(), reason="this PyTorch build cannot pack weights with oneDNN")
needs_compiling = pytest.mark.skipif(not compiling_available(), reason="torch.compile does not work here")


def _model(seed: int = 0, **overrides) -> GPT:
    kw = dict(vocab_size=64, block_size=20, n_layer=2, n_head=4, d_model=32)
    kw.update(overrides)
    torch.manual_seed(seed)
    return GPT(GPTConfig(**kw)).eval()


def _prompt(batch: int = 2, length: int = 5, vocab: int = 64) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(0))


def _kind(w: torch.Tensor) -> str:
    """The layout of a weight handed to F.linear or packed_linear."""
    if w.is_mkldnn:
        return "packed"
    return "[out, in]" if w.is_contiguous() else "[in, out]"


def _rig_clock(m, winner: str) -> list:
    """Every product takes 1 s on a fake clock, except those of ``winner``'s layout (1 ms)."""
    state, seen = {"t": 0.0}, []

    def timed(product, kind=None):
        def run(x, w, b=None):
            seen.append((kind or _kind(w), tuple(w.shape)))
            state["t"] += 0.001 if (kind or _kind(w)) == winner else 1.0
            return product(x, w, b)
        return run

    compiled = timed(decoding.compiled_product, "compiled")
    real_block_step = decoding.compiled_block_step

    def block_step(*key):  # a fused block: its four compiled products
        step = real_block_step(*key)

        def run(*args):
            seen.extend([("compiled", None)] * 4)
            state["t"] += 4 * (0.001 if winner == "compiled" else 1.0)
            return step(*args)
        return run

    m.setattr(decoding, "compiled_block_step", block_step)
    m.setattr("time.perf_counter", lambda: state["t"])
    m.setattr("time.thread_time", lambda: state["t"])  # the tuner's clock on one thread
    m.setattr(torch.nn.functional, "linear", timed(torch.nn.functional.linear))
    m.setattr(decoding, "packed_linear", timed(decoding.packed_linear))
    m.setattr(decoding, "compiled_product", compiled)
    return seen


def _offered() -> set:
    extra = {"packed"} if packing_available() else set()
    return {"[out, in]", "[in, out]"} | extra | ({"compiled"} if compiling_available() else set())


needs = {"packed": needs_packing, "compiled": needs_compiling}


@pytest.fixture(autouse=True)
def _fixed_turns(monkeypatch):
    """Tuning takes exactly ``repeats`` turns here (no time budget), so the tests stay quick;
    test_short_passes_get_more_turns checks the budget."""
    monkeypatch.setattr(decoding, "TUNING_SECONDS", 0.0)


def _linears(model) -> dict:
    return {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


@pytest.mark.parametrize("winner", [pytest.param(name, marks=needs[name]) if name in needs else name
                                    for name in LAYOUTS])
def test_each_layout_wins_when_it_is_fastest_and_changes_no_result(monkeypatch, winner):
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    want_logits, want_tokens = model(_prompt())[0], generate(model, _prompt(), 12, temperature=0)
    with monkeypatch.context() as m:
        seen = _rig_clock(m, winner)
        choice = tune_for_decoding(model, batch_size=2, repeats=3)
    shapes = {(96, 32), (32, 32), (128, 32), (32, 128), (64, 32)}
    assert set(choice) == shapes and set(choice.values()) == {winner}
    assert {kind for kind, _ in seen} == _offered() and {shape for _, shape in seen} - {None} == shapes  # all timed
    for name, layer in _linears(model).items():
        assert (type(layer) is DecodeLinear) == (winner in needs), name
        if winner not in needs:
            assert _kind(layer.weight) == winner, name
    assert model.lm_head.weight is model.embed.token.weight  # still tied
    assert model.state_dict().keys() == before.keys()
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    with torch.no_grad():
        got = model(_prompt())[0]
    if winner in needs:
        torch.testing.assert_close(got, want_logits, rtol=0, atol=1e-5)
    else:
        assert torch.equal(got, want_logits)
    assert torch.equal(generate(model, _prompt(), 12, temperature=0), want_tokens)


@needs_packing
def test_retuning_returns_packed_layers_to_plain_linear(monkeypatch):
    model = _model(1)
    for winner in ("packed", "[in, out]", "packed", "[out, in]"):
        with monkeypatch.context() as m:
            _rig_clock(m, winner)
            tune_for_decoding(model, repeats=2)
        for layer in _linears(model).values():
            assert (type(layer) is DecodeLinear) == (winner == "packed")
            assert ("decode_layout" in layer.__dict__) == (winner == "packed")
            if winner != "packed":
                assert _kind(layer.weight) == winner


@pytest.mark.parametrize("layout", [pytest.param(name, marks=mark) for name, mark in needs.items()])
def test_decode_layer_trains_like_linear_and_never_goes_stale(layout):
    torch.manual_seed(0)
    plain = torch.nn.Linear(24, 40)
    packed = copy.deepcopy(plain)
    tune_for_decoding(packed, batch_size=3, layouts=[layout])
    assert type(packed) is DecodeLinear and f"decode={layout}" in repr(packed)
    x = torch.randn(3, 5, 24)
    # with autograd: nn.Linear's own path, same values and gradients
    plain(x).square().sum().backward()
    packed(x).square().sum().backward()
    assert torch.equal(packed.weight.grad, plain.weight.grad) and torch.equal(packed.bias.grad, plain.bias.grad)
    # without: the decoding copy, rebuilt after every kind of change to the weight
    x = torch.randn(3, 1, 24)  # a decode step: three sequences, one position
    for change in ("optimizer step", "load_state_dict", "new tensor"):
        with torch.no_grad():
            if change == "optimizer step":
                torch.optim.SGD(packed.parameters(), lr=0.5).step()
            elif change == "load_state_dict":
                packed.load_state_dict({"weight": torch.randn(40, 24), "bias": torch.randn(40)})
            else:
                packed.weight.data = torch.randn(40, 24)
            got = packed(x)
        torch.testing.assert_close(got, torch.nn.functional.linear(x, packed.weight, packed.bias), rtol=0, atol=1e-5)
        assert packed.__dict__["_decode_cache"][1].is_mkldnn == (layout == "packed")


@pytest.mark.parametrize("layout", [pytest.param(name, marks=mark) for name, mark in needs.items()])
def test_decode_model_copies_pickles_and_moves(layout):
    model = _model(2)
    tune_for_decoding(model, layouts=[layout])
    want = model(_prompt())[0].detach()
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert all("_decode_cache" not in m.__dict__ for m in clone.modules())
        assert type(clone.lm_head) is DecodeLinear
        with torch.no_grad():
            torch.testing.assert_close(clone(_prompt())[0], want, rtol=0, atol=1e-5)
    head = model.lm_head.to("meta")  # a device oneDNN does not serve: plain F.linear, no error
    with torch.no_grad():
        assert head(torch.randn(2, 1, 32, device="meta")).shape == (2, 1, 64)


@pytest.mark.parametrize("layout", [pytest.param(name, marks=needs[name]) if name in needs else name
                                    for name in LAYOUTS])
def test_bf16_weights_round_the_products_only(layout):
    """In every layout, for decode steps (2 rows here) and prompts (the model's 5 positions) alike."""
    model = _model(3)
    fp32 = copy.deepcopy(model)
    tune_for_decoding(model, batch_size=2, weights_dtype=torch.bfloat16, layouts=[layout])
    layers = _linears(model)
    assert all(type(m) is DecodeLinear and m.decode_dtype == torch.bfloat16 for m in layers.values())
    assert all(p.dtype == torch.float32 for p in model.parameters())  # training and state_dict stay fp32
    for name, value in fp32.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
    # each layer computes the product of bf16-rounded inputs and weights, returned in fp32
    layer, x = layers["blocks.0.mlp.fc"], torch.randn(2, 1, 32)
    with torch.no_grad():
        got = layer(x)
    want = torch.nn.functional.linear(x.bfloat16().float(), layer.weight.bfloat16().float(),
                                      layer.bias.bfloat16().float())
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)
    assert not torch.equal(got, torch.nn.functional.linear(x, layer.weight, layer.bias))  # really rounded
    with torch.no_grad():
        got, want = model(_prompt())[0], fp32(_prompt())[0]
    torch.testing.assert_close(got, want, rtol=0, atol=0.05)
    assert not torch.equal(got, want)  # the prompt's products were rounded too
    # gradients still flow through the fp32 weights
    loss = model(_prompt(), _prompt())[1]
    loss.backward()
    assert layer.weight.grad is not None and layer.weight.grad.dtype == torch.float32


def test_real_clock_keeps_results():
    model = _model(4, vocab_size=300, d_model=48)
    want_logits = model(_prompt(vocab=300))[0].detach()
    want = generate(model, _prompt(vocab=300), 10, temperature=0)
    choice = tune_for_decoding(model, batch_size=2)
    assert set(choice.values()) <= set(LAYOUTS)
    with torch.no_grad():
        torch.testing.assert_close(model(_prompt(vocab=300))[0], want_logits, rtol=0, atol=1e-5)
    assert torch.equal(generate(model, _prompt(vocab=300), 10, temperature=0), want)


def test_bad_input_says_what_to_do(monkeypatch):
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        tune_for_decoding(_model(), batch_size=0)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="repeats must be a positive int"):
            tune_for_decoding(_model(), repeats=bad)
    with pytest.raises(ValueError, match="has no nn.Linear layers"):
        tune_for_decoding(torch.nn.LayerNorm(4))
    for bad in (torch.int8, "bf16"):
        with pytest.raises(ValueError, match="weights_dtype must be a floating torch.dtype"):
            tune_for_decoding(_model(), weights_dtype=bad)
    for bad in (["diagonal"], []):
        with pytest.raises(ValueError, match="layouts must be a non-empty list"):
            tune_for_decoding(_model(), layouts=bad)
    monkeypatch.setattr(decoding, "packing_available", lambda dtype=torch.float32: False)
    with pytest.raises(ValueError, match="packing_available"):
        tune_for_decoding(_model(), layouts=["packed"])


@needs_compiling
def test_compiled_serves_decode_steps_and_leaves_prompts_to_f_linear(monkeypatch):
    torch.manual_seed(5)
    layer = torch.nn.Linear(32, 48)
    reference = copy.deepcopy(layer)
    tune_for_decoding(layer, batch_size=2, layouts=["compiled"])
    calls = []
    real = decoding.compiled_product
    monkeypatch.setattr(decoding, "compiled_product", lambda *a: calls.append(a[0].shape) or real(*a))
    with torch.no_grad():
        for shape in [(2, 1, 32), (1, 1, 32), (2, 7, 32), (9, 32)]:  # decode steps, then prompts
            x = torch.randn(shape)
            torch.testing.assert_close(layer(x), reference(x), rtol=0, atol=1e-5)
    assert calls == [(2, 1, 32), (1, 1, 32)]


@needs_compiling
def test_compiled_bf16_weights_sum_in_fp32():
    torch.manual_seed(6)
    layer = torch.nn.Linear(64, 96)
    tune_for_decoding(layer, weights_dtype=torch.bfloat16, layouts=["compiled"])
    x = torch.randn(1, 1, 64)
    with torch.no_grad():
        got = layer(x)
    # bf16-rounded weights, everything else fp32: equal up to the order of the additions
    want = torch.nn.functional.linear(x, layer.weight.bfloat16().float(), layer.bias.bfloat16().float())
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@needs_compiling
def test_whole_steps_overrule_a_layout_that_slows_the_rest_of_the_step(monkeypatch):
    """Rigged: an "[in, out]" product is quick itself but makes the next product 1 s slower (as a kernel
    that leaves the caches cold would). Timing products alone picks it; the race over whole decode
    steps must pick "compiled" (10 ms everywhere) instead."""
    model = _model(7)
    want = generate(model, _prompt(), 12, temperature=0)
    state = {"t": 0.0, "penalty": 0.0}

    def timed(product, kind=None):
        def run(x, w, b=None):
            state["t"] += state["penalty"] + {"[in, out]": 0.001, "compiled": 0.01}.get(kind or _kind(w), 1.0)
            state["penalty"] = 1.0 if (kind or _kind(w)) == "[in, out]" else 0.0
            return product(x, w, b)
        return run

    monkeypatch.setattr("time.perf_counter", lambda: state["t"])
    monkeypatch.setattr("time.thread_time", lambda: state["t"])
    monkeypatch.setattr(torch.nn.functional, "linear", timed(torch.nn.functional.linear))
    monkeypatch.setattr(decoding, "packed_linear", timed(decoding.packed_linear))
    monkeypatch.setattr(decoding, "compiled_product", timed(decoding.compiled_product, "compiled"))
    choice = tune_for_decoding(model, repeats=3)
    monkeypatch.undo()
    assert set(choice.values()) == {"compiled"}
    assert all(type(m) is DecodeLinear and m.decode_layout == "compiled" for m in _linears(model).values())
    assert all("forward" not in m.__dict__ for m in _linears(model).values())  # the timing hooks are gone
    assert torch.equal(generate(model, _prompt(), 12, temperature=0), want)


# ---------------------------------------------------------------- 2 MB pages

def _mapping_flags(address: int) -> list[str]:
    """The VmFlags of the memory mapping holding ``address`` (Linux /proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0] if line.split() else ""
        if "-" in head and not head.endswith(":"):
            low, high = (int(part, 16) for part in head.split("-"))
            inside = low <= address < high
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def test_huge_page_copies_keep_values_strides_and_size():
    w = torch.randn(1024, 768)  # 3 MB: more than one huge page
    for t in (w, w.t(), torch.randn(10, 10)):
        h = copy_in_huge_pages(t)
        assert torch.equal(h, t) and h.stride() == t.stride() and h.dtype == t.dtype
        assert h.untyped_storage().nbytes() == t.numel() * t.element_size()  # nothing extra gets saved
        buffer = io.BytesIO()
        torch.save(h, buffer)
        assert torch.equal(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True), t)
        assert torch.equal(pickle.loads(pickle.dumps(h)), t) and torch.equal(copy.deepcopy(h), t)
    if huge_pages_available():
        h = copy_in_huge_pages(w)
        assert h.data_ptr() % HUGE_PAGE == 0
        assert "hg" in _mapping_flags(h.data_ptr())  # madvise(MADV_HUGEPAGE) reached the kernel
        h[5, 7] = 1.5  # ordinary, writable memory
        assert h[5, 7] == 1.5


def test_tuning_moves_the_weights_into_huge_pages_and_changes_nothing(monkeypatch):
    model = _model(8, vocab_size=4096, d_model=128)  # the tied [4096, 128] matrix is one huge page
    want_logits, want = model(_prompt())[0].detach(), generate(model, _prompt(), 8, temperature=0)
    before = model.lm_head.weight.data_ptr()
    with monkeypatch.context() as m:
        _rig_clock(m, "[out, in]")
        tune_for_decoding(model, repeats=2, huge_pages=False)
    assert model.lm_head.weight.data_ptr() == before  # False: the memory stays where it was
    with monkeypatch.context() as m:
        _rig_clock(m, "[out, in]")
        tune_for_decoding(model, repeats=2)
    head = model.lm_head.weight
    assert head is model.embed.token.weight and isinstance(head, torch.nn.Parameter) and head.requires_grad
    if huge_pages_available():
        assert head.data_ptr() % HUGE_PAGE == 0 and "hg" in _mapping_flags(head.data_ptr())
    with torch.no_grad():
        assert torch.equal(model(_prompt())[0], want_logits)
    assert torch.equal(generate(model, _prompt(), 8, temperature=0), want)
    model(_prompt(), _prompt())[1].backward()  # training still works on the moved weights
    assert head.grad is not None and head.grad.shape == head.shape


# ---------------------------------------------------------------- one compiled call per block


def _count_block_steps(monkeypatch) -> list:
    calls, real = [], decoding.compiled_block_step

    def counting(*key):
        step = real(*key)
        return lambda *args: calls.append(args[0].shape) or step(*args)

    monkeypatch.setattr(decoding, "compiled_block_step", counting)
    return calls


@needs_compiling
@pytest.mark.parametrize("activation, bias", [("gelu", True), ("relu", False), ("gelu_tanh", True)])
def test_fused_block_step_is_the_blocks_own_step(monkeypatch, activation, bias):
    model = _model(9, activation=activation, bias=bias)
    fused = copy.deepcopy(model)
    tune_for_decoding(fused, batch_size=2, layouts=["compiled"])
    assert all(type(b) is DecodeBlock for b in fused.blocks) and all(type(b) is TransformerBlock for b in model.blocks)
    calls = _count_block_steps(monkeypatch)
    with torch.no_grad():
        caches = model.new_cache(), fused.new_cache()
        for x in (_prompt(), *(_prompt(length=1) + i for i in range(3))):  # prompt, then three decode steps
            got, want = fused(x, cache=caches[1])[0], model(x, cache=caches[0])[0]
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert calls == [(2, 32)] * 3 * 2  # three steps, two blocks; the prompt took the blocks' forward
    for plain, mine in zip(*caches, strict=True):  # the fused step wrote the same keys and values
        assert plain.length == mine.length == 8
        torch.testing.assert_close(mine.k, plain.k, rtol=0, atol=1e-5)
        torch.testing.assert_close(mine.v, plain.v, rtol=0, atol=1e-5)
    assert torch.equal(generate(fused, _prompt(), 12, temperature=0), generate(model, _prompt(), 12, temperature=0))


@needs_compiling
def test_fused_block_leaves_everything_else_to_the_blocks_forward(monkeypatch):
    model = _model(10)
    tune_for_decoding(model, batch_size=2, layouts=["compiled"])
    block, reference = model.blocks[0], TransformerBlock(32, 4)
    reference.load_state_dict(block.state_dict())
    calls = _count_block_steps(monkeypatch)
    x = torch.randn(2, 1, 32)

    def same(**kw):
        cache, ref_cache = model.new_cache()[0], model.new_cache()[0]
        for c in (cache, ref_cache):
            c.update(torch.ones(2, 4, 3, 8), torch.ones(2, 4, 3, 8))
        torch.testing.assert_close(block(x, cache=cache, **kw), reference(x, cache=ref_cache, **kw), rtol=0, atol=1e-5)

    same(mask=torch.ones(1, 1, 1, 4, dtype=torch.bool))  # an extra mask
    with torch.no_grad():
        block.train()
        same()  # training mode (dropout)
        block.eval()
        big = torch.randn(3, 1, 32)  # more sequences than it was tuned for
        torch.testing.assert_close(block(big, cache=model.new_cache()[0]), reference(big, cache=model.new_cache()[0]),
                                   rtol=0, atol=1e-5)
        torch.testing.assert_close(block(x), reference(x), rtol=0, atol=1e-5)  # no cache
    assert calls == []
    same()  # autograd on: the parameters need gradients
    assert calls == []
    with torch.no_grad():
        same()
    assert calls == [(2, 32)]


@needs_compiling
def test_retuning_unfuses_and_fused_models_copy_and_pickle(monkeypatch):
    model = _model(11)
    want = generate(model, _prompt(), 10, temperature=0)
    tune_for_decoding(model, batch_size=2, layouts=["compiled"])
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert all(type(b) is DecodeBlock for b in clone.blocks)
        assert torch.equal(generate(clone, _prompt(), 10, temperature=0), want)
    with monkeypatch.context() as m:
        _rig_clock(m, "[in, out]")
        tune_for_decoding(model, batch_size=2, repeats=2)
    assert all(type(b) is TransformerBlock and "decode_batch" not in b.__dict__ for b in model.blocks)
    assert torch.equal(generate(model, _prompt(), 10, temperature=0), want)


@needs_compiling
def test_fused_block_multiplies_by_bf16_copies():
    model = _model(12)
    unfused = copy.deepcopy(model)
    tune_for_decoding(model, batch_size=2, layouts=["compiled"], weights_dtype=torch.bfloat16)
    tune_for_decoding(unfused, batch_size=2, layouts=["compiled"], weights_dtype=torch.bfloat16)
    for block in unfused.blocks:
        decoding._set_block(block, None)  # the same bf16 products, one layer at a time
    assert all(type(b) is DecodeBlock for b in model.blocks)
    with torch.no_grad():
        caches = model.new_cache(), unfused.new_cache()
        for x in (_prompt(), _prompt(length=1)):
            got, want = model(x, cache=caches[0])[0], unfused(x, cache=caches[1])[0]
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@needs_compiling
def test_whole_steps_choose_fused_blocks_when_they_win(monkeypatch):
    """Rigged: a product costs 10 ms in "[out, in]", 50 ms compiled, 1 s otherwise; a fused block step
    costs 1 ms. Per shape "[out, in]" wins (a step: 9 x 10 ms), but whole steps with fused blocks are
    quicker (2 x 1 ms + the LM head's 50 ms), so every layer must end up compiled and every block fused."""
    model = _model(13)
    want = generate(model, _prompt(), 12, temperature=0)
    state = {"t": 0.0}
    real_block_step = decoding.compiled_block_step

    def timed(product, kind=None):
        def run(x, w, b=None):
            state["t"] += {"[out, in]": 0.01, "compiled": 0.05}.get(kind or _kind(w), 1.0)
            return product(x, w, b)
        return run

    def block_step(*key):
        step = real_block_step(*key)
        return lambda *args: state.__setitem__("t", state["t"] + 0.001) or step(*args)

    with monkeypatch.context() as m:
        m.setattr("time.perf_counter", lambda: state["t"])
        m.setattr("time.thread_time", lambda: state["t"])
        m.setattr(torch.nn.functional, "linear", timed(torch.nn.functional.linear))
        m.setattr(decoding, "packed_linear", timed(decoding.packed_linear))
        m.setattr(decoding, "compiled_product", timed(decoding.compiled_product, "compiled"))
        m.setattr(decoding, "compiled_block_step", block_step)
        choice = tune_for_decoding(model, batch_size=2, repeats=3)
        assert set(choice.values()) == {"compiled"}
        assert all(type(b) is DecodeBlock for b in model.blocks)
        assert all("forward" not in layer.__dict__ for layer in _linears(model).values())  # no rerouting left
        with monkeypatch.context() as m2:  # without "compiled" on offer there is nothing to fuse
            m2.setattr(decoding, "compiling_available", lambda: False)
            choice = tune_for_decoding(model, batch_size=2, repeats=3)
        assert set(choice.values()) == {"[out, in]"} and all(type(b) is TransformerBlock for b in model.blocks)
    assert torch.equal(generate(model, _prompt(), 12, temperature=0), want)



def test_short_passes_get_more_turns(monkeypatch):
    """On a rigged clock every product costs 1 ms, so a pass of this model (9 products) takes 9 ms. With
    only the two plain layouts on offer, tuning makes 12 passes per turn (5 shapes x 2 layouts, then the
    race of the mix against "[in, out]"). Without a budget that is 1 + repeats turns; with 0.1 s per
    candidate, 13 turns (12 timed passes of 9 ms each reach 0.1 s); never over 1 + 20 x repeats."""
    def passes(budget: float, repeats: int) -> int:
        state, heads = {"t": 0.0}, []
        real = torch.nn.functional.linear

        def linear(x, w, b=None):
            state["t"] += 0.001
            heads.extend([1] if w.shape == (64, 32) else [])  # the LM head: once per pass
            return real(x, w, b)

        with monkeypatch.context() as m:
            m.setattr(decoding, "TUNING_SECONDS", budget)
            m.setattr(decoding, "compiling_available", lambda: False)
            m.setattr(decoding, "packing_available", lambda dtype=torch.float32: False)
            m.setattr("time.perf_counter", lambda: state["t"])
            m.setattr("time.thread_time", lambda: state["t"])
            m.setattr(torch.nn.functional, "linear", linear)
            tune_for_decoding(_model(14), repeats=repeats)
        return len(heads)

    assert passes(0.0, repeats=3) == 12 * (1 + 3)
    assert passes(0.1, repeats=3) == 12 * 13
    assert passes(10.0, repeats=1) == 12 * (1 + 20 * 1)
