"""Checks for chapter 11's exercises (the assistant: chat tokens, the SFT mask, LoRA). Hand-written.

Each check computes what it expects its own way; the planted mistakes are tables of (hint, what the mistake gives).
11.6's reference (``_chatml``) lives here: it is not part of the package's API."""

import torch

from .. import assistant as _assistant
from .. import lora as _lora
from ._core import check, expect, expect_answer, expect_close, expect_number, expect_tensor, fresh_rng, planted

_ADAPTER = "compute the adapter from self.A and self.B (no .detach(), no torch.no_grad())"

# ---------------------------------------------------------------- 11.1 build: grow_rows
@check("11.1", "grow_rows", reference=_assistant.grow_rows)
def check_grow_rows(fn):
    """``fn(weight [V, C], n_new, generator) -> [V + n_new, C]``."""
    weight = torch.randn(10, 256, generator=torch.Generator().manual_seed(11)) * 0.3 + 0.5  # mean far from 0
    before = weight.clone()
    got = expect_tensor(fn(weight, 3, torch.Generator().manual_seed(1)), what="a tensor")
    expect(torch.equal(weight, before), "weight was changed in place: build a new tensor (torch.cat) and leave the "
                                        "model's rows as they were")
    expect(tuple(got.shape) == (13, 256), f"10 rows and 3 new ones make shape (13, 256), got {tuple(got.shape)}")
    expect(torch.equal(got[:10], weight), "the first V rows must be the old rows, unchanged (copied as they are)")
    new, mean = got[10:], weight.mean(dim=0)
    expect(not torch.equal(new, torch.zeros_like(new)), "the new rows are zeros: a zero row gives the new token "
           "logit 0 everywhere, far above a trained model's usual logits; start from the mean of the old rows")
    offset = (new - mean).pow(2).mean().sqrt().item()  # how far the new rows are from the mean, on average
    if offset >= 0.2:
        shifted = abs((new - mean).mean().item()) > 0.3  # the old rows' mean is about 0.5 in every channel
        expect(False, "the new rows are not centred on the mean of the old rows: add weight.mean(dim=0) (the "
                      "mean over the V rows, one number per channel)" if shifted else
                      f"the new rows are far from the mean of the old rows (spread {offset:.2f}); the noise "
                      "is NEW_ROW_NOISE (0.02) times a standard normal")
    expect(offset > 0.005, "the new rows are all the same (the mean with no noise): add NEW_ROW_NOISE times "
                           "torch.randn(n_new, C, generator=generator) so the model can tell them apart")
    expect(0.01 < offset < 0.04, f"the noise should have a spread of NEW_ROW_NOISE = 0.02, got {offset:.3f}")
    expect(torch.equal(fn(weight, 3, torch.Generator().manual_seed(1)), got),
           "two calls with generators of the same seed differ: draw the noise with generator=generator")
    expect(tuple(fn(weight, 0, None).shape) == (10, 256), "n_new=0 should give the V old rows only")


# ---------------------------------------------------------------- 11.2 build: sft_targets
def _targets(ids, is_answer, *, shift=True, mask_at_next=True, masked=True, keep_last=True):
    """sft_targets written out, with one mistake switched on at will."""
    out = []
    for t in range(len(ids)):
        if shift and t == len(ids) - 1:
            if keep_last:
                out.append(-1)
            continue
        value = ids[t + 1] if shift else ids[t]
        flag = is_answer[t + 1] if (mask_at_next and shift) else is_answer[t]
        out.append(value if (flag or not masked) else -1)
    return out


_TARGET_MISTAKES = [  # (hint, the switch of _targets that plants it)
    ("target t is the *next* id, ids[t + 1]: the model at position t predicts what follows it", dict(shift=False)),
    ("the mask must follow the target: keep ids[t + 1] where is_answer[t + 1] (the *next* token is an answer), not "
     "where is_answer[t]", dict(mask_at_next=False)),
    ("every next token is kept: the ones that are not answers must be -1 (IGNORE)", dict(masked=False)),
    ("one target per position: T targets, the last -1 (nothing follows it)", dict(keep_last=False)),
]


@check("11.2", "sft_targets", reference=_assistant.sft_targets)
def check_sft_targets(fn):
    """``fn(ids [T], is_answer [T]) -> targets [T]``."""
    ids = [76, 20, 21, 78, 77, 30, 31, 78]
    is_answer = [False, False, False, False, False, True, True, True]
    cases = [(ids, is_answer), (ids + [76, 40, 78, 77, 41, 78], is_answer + [False] * 4 + [True] * 2),
             ([5, 6, 7], [False] * 3)]
    for case_ids, case_answer in cases:
        got = fn(list(case_ids), list(case_answer))
        expect(isinstance(got, list | tuple) or isinstance(got, torch.Tensor),
               f"return a list of targets, got {type(got).__name__}")
        got, want = [int(x) for x in got], _targets(case_ids, case_answer)
        expect_answer(got, want, planted(_TARGET_MISTAKES, _targets, case_ids, case_answer),
                      f"for ids {case_ids} and is_answer {case_answer} expected {want}, got {got}")
    expect([int(x) for x in fn([9], [True])] == [-1], "a single token has nothing after it: its target is -1")


# ---------------------------------------------------------------- 11.3 predict: the adapter's size
@check("11.3", "my_prediction")
def check_predict_lora_parameters(fn):
    """``fn() -> int``: numbers a rank-8 adapter trains on a 128 -> 384 linear layer."""
    got = expect_number(fn(), "a whole number", int)
    right = 8 * 128 + 384 * 8
    expect_answer(got, right, [
        ("that is the full matrix (384 x 128): the adapter trains A [r, in] and B [out, r] only", 384 * 128),
        ("A is [8, 128] and B is [384, 8]: count both", 8 * 128),
        ("A is [8, 128] and B is [384, 8]: count both", 384 * 8),
        ("the change B A is [384, 128], but it is never stored: only A and B are", 384 * 128 + right),
    ], f"{got} is not it: A is [r, in] and B is [out, r]")


# ---------------------------------------------------------------- 11.4 build: LoRALinear.forward
@check("11.4", "LoRALinear", reference=_lora.LoRALinear)
def check_lora_forward(cls):
    """``cls(base: nn.Linear, rank, alpha, generator)``; ``forward(x [..., in]) -> [..., out]``."""
    with fresh_rng(14):
        base = torch.nn.Linear(12, 10)
    layer = cls(base, rank=3, alpha=6.0, generator=torch.Generator().manual_seed(2))
    x = torch.randn(2, 5, 12, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        layer.B.copy_(torch.randn(10, 3, generator=torch.Generator().manual_seed(4)))  # as if trained
        got = expect_tensor(layer(x), (2, 5, 10), "a tensor from forward")
        change = x @ (layer.B @ layer.A).T  # (2, 5, 10), unscaled
        expect_close(got, base(x) + 2.0 * change, "the output differs from base(x) + scale · x Aᵀ Bᵀ", mistakes=[
            ("the adapter's output must be scaled by self.scale (alpha / rank)", base(x) + change),
            ("the frozen layer's output self.base(x) is missing: the adapter adds to it", 2.0 * change),
            ("the base layer's bias is missing: call self.base(x), not x @ W.T", x @ base.weight.T + 2.0 * change),
        ])
    out = layer(x)
    expect(out.requires_grad, f"the output has no gradient: {_ADAPTER}")
    out.sum().backward()
    expect(layer.A.grad is not None and layer.B.grad is not None, f"A and B get no gradient: {_ADAPTER}")
    expect(base.weight.grad is None, "the base weight got a gradient: it must stay frozen")
    with torch.no_grad():
        layer.B.zero_()
        expect_close(layer(x), base(x), "with B = 0 the adapted layer must give the base layer's output", atol=1e-6)


# ---------------------------------------------------------------- 11.5 debug: merged_weight
@check("11.5", "merged_weight", reference=_lora.merged_weight)
def check_merged_weight(fn):
    """``fn(lora) -> [out, in]``, the one weight that computes what the adapter computes."""
    with fresh_rng(15):
        lora = _lora.LoRALinear(torch.nn.Linear(8, 6), rank=2, alpha=5.0)
    with torch.no_grad():
        lora.B.normal_(generator=torch.Generator().manual_seed(5))
    got = expect_tensor(fn(lora), (6, 8), "the merged weight [out, in]")
    expect(not got.requires_grad, "return the merged weight detached: a merge is done after training")
    w, ba = lora.base.weight.detach(), (lora.B @ lora.A).detach()
    expect_close(got, w + 2.5 * ba, "the merged weight differs from W + (alpha / r) · B A", atol=1e-6, mistakes=[
        ("the adapter's scale alpha / r (lora.scale) is missing from the merge", w + ba),
        ("the adapter's change is added to W, not subtracted", (lora.base.weight - 2.5 * lora.B @ lora.A).detach()),
    ])


# ---------------------------------------------------------------- 11.6 extend: ChatML
def _chatml(messages, generation_prompt=False):
    """The reference: ChatML as Qwen's chat template writes it."""
    text = "".join("<|im_start|>" + m["role"] + "\n" + m["content"] + "<|im_end|>\n" for m in messages)
    return text + "<|im_start|>assistant\n" * bool(generation_prompt)


@check("11.6", "chatml", reference=_chatml)
def check_chatml(fn):
    """``fn(messages, generation_prompt=False) -> str``."""
    talk = [{"role": "user", "content": "upper: kind"}, {"role": "assistant", "content": "KIND"},
            {"role": "user", "content": "reverse: dog"}]
    for messages, prompt in ((talk[:1], True), (talk[:2], False), (talk, True)):
        got = fn(messages, generation_prompt=prompt)
        expect(isinstance(got, str), f"return the conversation as one str, got {type(got).__name__}")
        want = _chatml(messages, prompt)
        expect_answer(got, want, [
            ("each message ends with <|im_end|> and a newline", want.replace("<|im_end|>\n", "<|im_end|>")),
            ("the role is followed by a newline, then the content",
             want.replace("user\n", "user").replace("assistant\n", "assistant")),
            ("with generation_prompt=True the text ends with '<|im_start|>assistant\\n', the turn the model "
             "writes", _chatml(messages, False)),
            ("the generation prompt is added only when generation_prompt=True", _chatml(messages, True)),
        ], f"expected {want!r}, got {got!r}")
