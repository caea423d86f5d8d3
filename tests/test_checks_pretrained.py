"""The chapter 08 checks accept the reference and reject realistic mistakes with the right hint
(tests/test_checks_all.py runs every check on a stub and on its reference)."""

import importlib.util

import pytest
import torch
from check_helpers import assert_rejected, run

from transformer_course.checks.pretrained import (
    _split_qkv,
    _to_hf_state_dict,
    check_hf_key_map,
    check_predict_silent_transpose,
    check_split_qkv,
    check_to_hf_state_dict,
)
from transformer_course.pretrained import hf_key_map

# ---------------------------------------------------------------- 8.1 predict


@pytest.mark.parametrize(
    "answer",
    [{"attn.c_proj.weight"}, ["h.0.attn.c_proj.weight"], ("transformer.h.0.attn.c_proj.weight",)],
)
def test_predict_right_answers_pass(answer):
    assert run(check_predict_silent_transpose, lambda: answer).passed


@pytest.mark.parametrize("answer, hint", [
    ({"attn.c_proj.weight", "mlp.c_proj.weight"}, "mlp.c_proj.weight is [4C, C]"),
    ({"attn.c_attn.weight"}, "attn.c_attn.weight is [C, 3C]"),
    (set(), "Which one is square?"),
    ({"ln_1.weight"}, "not one of the four Conv1D weights"),
    ("attn.c_proj.weight", "return a set of names"),
])
def test_predict_wrong_answers_are_named(answer, hint):
    assert_rejected(check_predict_silent_transpose, lambda: answer, hint)


# ---------------------------------------------------------------- 8.2 build: the name map


def test_key_map_reference_passes():
    outcome = run(check_hf_key_map, hf_key_map)
    assert outcome.passed and outcome.use is hf_key_map


def edited(
    n_layer,
    rename=None,
    flip=(),
    prefix="",
    drop_blocks=False,
    offset=0,
    fixed_layers=None,
    extra=None,
):
    """The reference map with one realistic mistake planted."""
    table = {}
    for hf, (ours, t) in hf_key_map(fixed_layers if fixed_layers is not None else n_layer).items():
        if drop_blocks and hf.startswith("h.") and not hf.startswith("h.0."):
            continue
        if offset and hf.startswith("h."):
            i, rest = hf[2:].split(".", 1)
            hf, ours = (
                f"h.{int(i) + offset}.{rest}",
                f"blocks.{int(i) + offset}.{ours.split('.', 2)[2]}",
            )
        for a, b in (rename or {}).items():
            ours = ours.replace(a, b)
        if any(hf.endswith(f) for f in flip):
            t = not t
        table[prefix + hf] = (ours, t)
    table.update(extra or {})
    return table


SWAP_LN = {"ln1": "lnX", "ln2": "ln1"}


@pytest.mark.parametrize(
    "candidate, hint",
    [
        (
            lambda n: {
                k: (v[0].replace("lnX", "ln2"), v[1]) for k, v in edited(n, rename=SWAP_LN).items()
            },
            "ln_1 and ln_2 are swapped",
        ),
        (lambda n: edited(n, flip=("attn.c_proj.weight",)), "it is square, [C, C]"),
        (
            lambda n: edited(n, flip=("mlp.c_fc.weight",)),
            "is a Conv1D weight, [in, out] in the file",
        ),
        (lambda n: edited(n, flip=("attn.c_attn.bias",)), "there is nothing to transpose"),
        (lambda n: edited(n, flip=("wte.weight",)), "lookup table"),
        (lambda n: edited(n, prefix="transformer."), 'leave out the "transformer." prefix'),
        (lambda n: edited(n, extra={"lm_head.weight": ("lm_head.weight", False)}), "tied to wte"),
        (lambda n: edited(n, offset=1), "numbered from 0"),
        (lambda n: edited(n, drop_blocks=True), "only block 0 is mapped"),
        (lambda n: edited(n, fixed_layers=2), "use n_layer"),
        (
            lambda n: (
                edited(n, rename={"attn.proj": "attn.TMP", "mlp.proj": "attn.proj"})
                | {
                    k: (v[0].replace("attn.TMP", "mlp.proj"), v[1])
                    for k, v in edited(n, rename={"attn.proj": "attn.TMP"}).items()
                    if "attn.TMP" in v[0]
                }
            ),
            "the two c_proj are swapped",
        ),
        (lambda n: edited(n, rename={"qkv": "c_attn"}), "not a parameter of our GPT"),
        (
            lambda n: {k: list(v)[:1] for k, v in hf_key_map(n).items()},
            "should be a pair (our name, transpose?)",
        ),
    ],
)
def test_key_map_mistakes_are_named(candidate, hint):
    assert_rejected(check_hf_key_map, candidate, hint)


# ---------------------------------------------------------------- 8.3 debug: the packed q | k | v


def split_qkv_neox(packed, n_head):  # the chapter's buggy reader, as shown in the notebook
    B, T, three_c = packed.shape
    per_head = packed.view(B, T, n_head, 3, three_c // (3 * n_head))
    q, k, v = per_head.permute(3, 0, 2, 1, 4)
    return q, k, v


def test_split_reference_passes():
    assert run(check_split_qkv, _split_qkv).passed


def _no_transpose(p, nh):
    return tuple(t.view(p.shape[0], p.shape[1], nh, -1) for t in p.split(p.shape[-1] // 3, -1))


def _reshaped(p, nh):
    return tuple(t.reshape(p.shape[0], nh, p.shape[1], -1) for t in p.split(p.shape[-1] // 3, -1))


@pytest.mark.parametrize("candidate, hint", [
    (split_qkv_neox, "GPT-NeoX's layout"),
    (_no_transpose, "add .transpose(1, 2)"),
    (_reshaped, "view as [B, T, nh, hs], then transpose(1, 2)"),
    (lambda p, nh: (lambda q, k, v: (k, q, v))(*_split_qkv(p, nh)), "q holds the keys"),
    (lambda p, nh: (_split_qkv(p, nh)[0],) * 3, "k equals q"),
    (lambda p, nh: _split_qkv(p, nh)[:2], "return three tensors"),
])
def test_split_mistakes_are_named(candidate, hint):
    assert_rejected(check_split_qkv, candidate, hint)


# ---------------------------------------------------------------- 8.4 extend: GPT-2's layout

needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="the check's last stage runs transformers' GPT2LMHeadModel",
)


def test_export_reference_passes():
    assert run(check_to_hf_state_dict, _to_hf_state_dict).passed


def export(model, transpose=lambda name, t: True, prefix="transformer.", head=True, rename=None):
    out = {}
    ours = model.state_dict()
    for hf, (name, t) in hf_key_map(len(model.blocks)).items():
        w = ours[(rename or {}).get(name, name)]
        out[prefix + hf] = w.T.contiguous() if t and transpose(hf, w) else w
    if head:
        out["lm_head.weight"] = ours["lm_head.weight"]
    return out


SWAP = {"blocks.0.ln1.weight": "blocks.0.ln2.weight", "blocks.0.ln2.weight": "blocks.0.ln1.weight"}


@pytest.mark.parametrize(
    "candidate, hint",
    [
        (lambda m: export(m, transpose=lambda hf, w: False), "has our nn.Linear layout [out, in]"),
        (
            lambda m: export(m, transpose=lambda hf, w: w.shape[0] != w.shape[1]),
            "is square, so it fits either way",
        ),
        (lambda m: export(m, prefix=""), '"transformer." in front'),
        (lambda m: export(m, head=False), "also lists lm_head.weight"),
        (
            lambda m: export(m, rename=SWAP),
            "holds the tensor that belongs to transformer.h.0.ln_2.weight",
        ),
    ],
)
def test_export_mistakes_are_named(candidate, hint):
    assert_rejected(check_to_hf_state_dict, candidate, hint)


@needs_transformers
def test_export_runs_in_transformers(monkeypatch):
    """The last stage is what makes the exercise real: a dict with the right names and values but
    stored under the wrong keys for transformers would fail there."""
    import transformer_course.checks.pretrained as checks

    loaded = []
    real = checks._stand_in

    def spy(n_layer):
        model = real(n_layer)
        loaded.append(model)
        return model

    monkeypatch.setattr(checks, "_stand_in", spy)
    assert run(check_to_hf_state_dict, _to_hf_state_dict).passed
    assert len(loaded) == 2 and all(m is not None for m in loaded)


def test_export_without_transformers_still_checks_names_and_values(monkeypatch):
    import transformer_course.checks.pretrained as checks

    monkeypatch.setattr(checks, "_stand_in", lambda n_layer: None)
    assert run(check_to_hf_state_dict, _to_hf_state_dict).passed
    assert_rejected(
        check_to_hf_state_dict, lambda m: export(m, head=False), "also lists lm_head.weight"
    )


def test_checks_leave_the_global_random_state_alone():
    torch.manual_seed(0)
    run(check_to_hf_state_dict, _to_hf_state_dict)
    after = torch.rand(1)
    torch.manual_seed(0)
    assert torch.equal(torch.rand(1), after)
