"""Checks for chapter 08's exercises (loading GPT-2 weights). Hand-written; the references of 8.3 and 8.4 live here
(``_split_qkv``, ``_to_hf_state_dict``), and 8.4 also runs the exported tensors in Hugging Face's own GPT-2 when
``transformers`` is installed."""

from collections.abc import Mapping

import torch

from ..multihead import split_heads
from ..pretrained import convert_hf_state_dict, hf_key_map
from ._core import CheckFailed, check, close, expect, expect_close, expect_tensor, fresh_rng, name_mistake, seeded_randn

__all__ = ["check_hf_key_map", "check_predict_silent_transpose", "check_split_qkv", "check_to_hf_state_dict"]


# ---------------------------------------------------------------- 8.1 a silent missing transpose
_CONV1D = {  # a GPT-2 block's Conv1D weights and their shapes in the file ([in, out]), C = 64
    "attn.c_attn.weight": "[C, 3C] = [64, 192] in the file and [192, 64] in ours",
    "attn.c_proj.weight": "[C, C] = [64, 64] on both sides",
    "mlp.c_fc.weight": "[C, 4C] = [64, 256] in the file and [256, 64] in ours",
    "mlp.c_proj.weight": "[4C, C] = [256, 64] in the file and [64, 256] in ours",
}


@check("8.1", "my_prediction")
def check_predict_silent_transpose(fn):
    """``fn() -> set`` of the Conv1D weight names that load untransposed without an error."""
    got = fn()
    expect(isinstance(got, set | frozenset | list | tuple),
           'return a set of names such as {"mlp.c_fc.weight"} (an empty set if none), got ' f"{type(got).__name__}")
    names = {str(n).removeprefix("transformer.").removeprefix("h.0.") for n in got}
    unknown = sorted(names - set(_CONV1D))
    expect(not unknown, f"{', '.join(unknown)}: not one of the four Conv1D weights; choose among {', '.join(_CONV1D)}")
    for name in names:
        expect(name == "attn.c_proj.weight", f"{name} is {_CONV1D[name]}: the shapes differ, so "
                                             "load_state_dict refuses it untransposed")
    expect(names, "one of the four fits untransposed: a weight fits both ways when [in, out] "
                  "equals [out, in], that is when it is square. Which one is square?")


# ---------------------------------------------------------------- 8.2 the name map
def _block_part(name: str) -> tuple[str, str]:
    """"h.3.ln_1.weight" -> ("3", "ln_1.weight"); "wte.weight" -> ("", "wte.weight")."""
    name = str(name)
    if name.startswith(("h.", "blocks.")):
        _, i, rest = name.split(".", 2)
        return i, rest
    return "", name


@check("8.2", "hf_key_map", reference=hf_key_map)
def check_hf_key_map(fn):
    """``fn(n_layer) -> {hf_name: (our_name, transpose)}`` for every tensor of a GPT-2 file."""
    for n_layer in (2, 1, 3, 0):
        got, want = fn(n_layer), hf_key_map(n_layer)
        expect(isinstance(got, Mapping), f"return a dict {{hf_name: (our_name, transpose)}}, got {type(got).__name__}")
        keys = {str(k) for k in got}
        expect(not any(k.startswith("transformer.") for k in keys), 'leave out the "transformer." '
               "prefix: some files have it, some do not, and the loader strips it")
        expect("lm_head.weight" not in keys,
               "lm_head.weight is not in the file (it is tied to wte): the map has no entry for it")
        for k, v in got.items():
            expect(isinstance(v, tuple | list) and len(v) == 2 and isinstance(v[0], str),
                   f"the value for {k!r} should be a pair (our name, transpose?), got {v!r}")
        _expect_blocks(keys, n_layer)
        missing, extra = sorted(set(want) - keys), sorted(keys - set(want))
        expect(not missing, f"no entry for {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''} "
                            f"(n_layer={n_layer}: 4 + 12 x {n_layer} = {len(want)} entries)")
        expect(not extra, f"{', '.join(extra[:3])}: not the name of a tensor in the GPT-2 file")
        ours = {name for name, _ in want.values()}
        for k, (want_name, want_t) in want.items():
            got_name, got_t = got[k][0], bool(got[k][1])
            if got_name != want_name:
                raise CheckFailed(_wrong_name(k, got_name, ours))
            if got_t != want_t:
                raise CheckFailed(_wrong_transpose(k, want_t))


def _expect_blocks(keys: set, n_layer: int) -> None:
    """8.2: the map's entries cover blocks h.0 ... h.<n_layer - 1>."""
    blocks = {_block_part(k)[0] for k in keys} - {""}
    wanted_blocks = {str(i) for i in range(n_layer)}
    expect(not (n_layer > 0 and blocks == {str(i + 1) for i in range(n_layer)}),
           "blocks are numbered from 0 in the file and in our GPT: h.0 ... h.<n_layer - 1>")
    expect(not (n_layer > 1 and blocks == {"0"}), f"with n_layer={n_layer} only block 0 is "
           f"mapped: add the twelve entries of every block h.0 ... h.{n_layer - 1}")
    expect(blocks <= wanted_blocks, f"with n_layer={n_layer} the file has blocks h.0 ... h.{n_layer - 1} only, but the "
           f"map has {sorted(blocks - wanted_blocks)[:3]}: use n_layer")


def _wrong_name(k: str, got_name: str, ours: set) -> str:
    """The hint for 8.2's entry ``k`` mapped to ``got_name``, not to the right tensor of ours."""
    i, part = _block_part(k)
    j, got_part = _block_part(got_name)
    pair = {part.split(".")[0], got_part.split(".")[0]}
    if got_name not in ours:
        return (f"{k} goes to {got_name!r}, which is not a parameter of our GPT: compare with the "
                "listing of our state_dict above")
    if j and not i:
        return f"{k} sits outside the blocks, in the file and in our GPT"
    if i != j:
        return (f"{k} belongs to block {i} of our GPT, not to {'block ' + j if j else 'the top level'}")
    if pair in ({"ln_1", "ln2"}, {"ln_2", "ln1"}):
        return ("ln_1 and ln_2 are swapped: ln_1 normalises before the attention (our ln1), "
                "ln_2 before the MLP (our ln2)")
    if ".c_proj." in part and pair == {"attn", "mlp"} and ".proj." in got_part:
        return ("the two c_proj are swapped: attn.c_proj is the attention's output projection "
                "(our attn.proj), mlp.c_proj the MLP's (our mlp.proj)")
    if part.endswith(".weight") != got_part.endswith(".weight"):
        return f"{k} goes to {got_name}: a weight must go to a weight and a bias to a bias"
    return (f"{k} goes to {got_name!r}, which holds another tensor of ours: compare the names and "
            "the shapes in the two listings above")


def _wrong_transpose(k: str, want_t: bool) -> str:
    """The hint for 8.2's entry ``k`` whose transpose flag is not ``want_t``."""
    if want_t and k.endswith("attn.c_proj.weight"):
        return (f"{k} is a Conv1D weight too: it is square, [C, C], so a missing transpose raises "
                "no error and silently gives wrong outputs (Exercise 8.1)")
    if want_t:
        return (f"{k} is a Conv1D weight, [in, out] in the file: it must be transposed for nn.Linear's [out, in]")
    if k.endswith(("wte.weight", "wpe.weight")):
        return (f"{k} is a lookup table (one row per token or position), stored the same way on "
                "both sides: do not transpose it")
    return f"{k} is a vector (a bias or a LayerNorm parameter): there is nothing to transpose"


# ---------------------------------------------------------------- 8.3 the packed q | k | v (debug)
def _split_qkv(packed: torch.Tensor, n_head: int) -> tuple[torch.Tensor, ...]:
    """GPT-2's packed c_attn output [B, T, 3C] = [q | k | v] -> (q, k, v), each [B, nh, T, hs]."""
    C = packed.shape[-1] // 3
    q, k, v = (split_heads(t, n_head) for t in packed.split(C, dim=-1))
    return q, k, v


@check("8.3", "my_split_qkv", reference=_split_qkv)
def check_split_qkv(fn):
    """``fn(packed [B, T, 3C], n_head) -> (q, k, v)``, each [B, nh, T, hs], from GPT-2's [q | k | v]."""
    # several heads, then a single one
    for B, T, C, nh, seed in ((2, 5, 12, 3, 0), (1, 4, 8, 1, 1)):
        hs = C // nh
        packed = seeded_randn(B, T, 3 * C, seed=seed)
        got = fn(packed, nh)
        expect(isinstance(got, tuple | list) and len(got) == 3, "return three tensors: (q, k, v)")
        for name, g in zip("qkv", got, strict=True):
            expect_tensor(g, what=f"{name} as a tensor")
            expect(tuple(g.shape) != (B, T, nh, hs), f"{name} is [B, T, nh, hs]: the heads must "
                   "come before time, [B, nh, T, hs]; add .transpose(1, 2)")
            expect(tuple(g.shape) == (B, nh, T, hs),
                   f"{name} should be [B, nh, T, hs] = {(B, nh, T, hs)}, got {tuple(g.shape)}")
        want = _split_qkv(packed, nh)
        mistakes = [("q holds the keys: the first C columns are the queries, [q | k | v]", want[1])]
        if nh > 1:
            per_head = packed.view(B, T, nh, 3, hs).permute(3, 0, 2, 1, 4)  # GPT-NeoX's layout
            regrouped = packed.split(C, dim=-1)[0].reshape(B, nh, T, hs)
            mistakes[:0] = [
                ("this still reads each head's q, k and v side by side (GPT-NeoX's layout); GPT-2 "
                 "packs [q | k | v]: the first C columns are every head's query, so split into "
                 "three C-wide parts first, then each part into heads", per_head[0]),
                ("view/reshape straight to [B, nh, T, hs] mixes positions and heads: view as "
                 "[B, T, nh, hs], then transpose(1, 2)", regrouped),
            ]
        expect_close(got[0], want[0], "q differs from GPT-2's split", mistakes=mistakes)
        for name, g, w in zip("kv", got[1:], want[1:], strict=True):
            expect_close(g, w, f"{name} differs from GPT-2's split", mistakes=[
                (f"{name} equals q: take the second C columns for k, the third for v", want[0])])


# ---------------------------------------------------------------- 8.4 GPT-2's layout (extend)
_PREFIX = "transformer."


def _to_hf_state_dict(model) -> dict[str, torch.Tensor]:
    """Our GPT (GPT-2's shape) -> the tensors of a `GPT2LMHeadModel` state_dict, names and layouts included."""
    ours = model.state_dict()
    out = {}
    for hf_name, (name, transpose) in hf_key_map(len(model.blocks)).items():
        t = ours[name].detach()
        out[_PREFIX + hf_name] = (t.T if transpose else t).contiguous()
    out["lm_head.weight"] = ours["lm_head.weight"].detach()
    return out


def _random_gpt(n_layer: int, seed: int):
    """A small GPT shaped like GPT-2 whose every tensor is random (so no two can be mixed up unseen)."""
    from ..model import GPT, GPTConfig

    with fresh_rng(seed):
        model = GPT(GPTConfig(vocab_size=40, block_size=12, n_layer=n_layer, n_head=2, d_model=16,
                              activation="gelu_tanh")).eval()
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.add_(0.1 * seeded_randn(*p.shape, seed=100 * seed + i))
    return model


def _stand_in(n_layer: int):
    """Hugging Face's GPT2LMHeadModel of the same sizes as `_random_gpt`, or None without transformers."""
    try:
        from ..pretrained import make_hf_stand_in

        with fresh_rng():  # transformers initialises from the global random state
            return make_hf_stand_in(vocab_size=40, n_positions=12, n_embd=16, n_layer=n_layer, n_head=2)
    except ImportError:
        return None


@check("8.4", "my_to_hf_state_dict", reference=_to_hf_state_dict)
def check_to_hf_state_dict(fn):
    """``fn(model: GPT) -> {name: tensor}`` that ``GPT2LMHeadModel.load_state_dict`` accepts."""
    for n_layer, seed in ((2, 0), (1, 1)):
        model = _random_gpt(n_layer, seed)
        got, want = fn(model), _to_hf_state_dict(model)
        expect(isinstance(got, Mapping), f"return a dict from names to tensors, got {type(got).__name__}")
        keys = set(got)
        expect(not (keys and not any(str(k).startswith(_PREFIX) for k in keys)),
               "GPT2LMHeadModel names the body's tensors with \"transformer.\" in front: "
               '"transformer.h.0.ln_1.weight"')
        expect("transformer.lm_head.weight" not in keys, "lm_head sits outside the transformer "
               'body: its name is "lm_head.weight", without the prefix')
        expect("lm_head.weight" in keys, "GPT2LMHeadModel's state_dict also lists lm_head.weight "
                                         "(the same tensor as transformer.wte.weight): include it")
        missing, extra = sorted(set(want) - keys), sorted(keys - set(want))
        expect(not missing, f"no tensor for {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''} (a GPT with "
                            f"{n_layer} block(s) has {len(want)})")
        expect(not extra, f"{', '.join(extra[:3])}: not a name in GPT2LMHeadModel's state_dict")
        for name, w in want.items():
            _expect_hf_tensor(got[name], name, w, want)
        back = convert_hf_state_dict(got, model)  # the package's loader reads it back unchanged
        for name, t in model.state_dict().items():
            expect_close(back[name], t, f"loading your tensors back gives another {name}")
        hf = _stand_in(n_layer)
        if hf is not None:  # the real test: Hugging Face's GPT-2 runs on them
            hf.load_state_dict({k: v.clone() for k, v in got.items()})
            idx = torch.randint(0, 40, (2, 7), generator=torch.Generator().manual_seed(seed))
            with torch.no_grad():
                expect_close(hf(idx).logits, model(idx)[0], "GPT2LMHeadModel computes other "
                             "logits than our GPT from your tensors")


def _expect_hf_tensor(g, name: str, w: torch.Tensor, want: dict) -> None:
    """8.4's tensor ``name``: ``w``, in GPT-2's layout."""
    expect_tensor(g, what=f"{name} as a tensor")
    if g.ndim == 2 and g.shape != w.shape and g.shape == w.T.shape:
        raise CheckFailed(f"{name} has our nn.Linear layout [out, in] = {tuple(g.shape)}; Conv1D "
                          f"keeps [in, out] = {tuple(w.shape)}: transpose it")
    expect(g.shape == w.shape, f"{name} should have shape {tuple(w.shape)}, got {tuple(g.shape)}")
    if close(g, w, atol=1e-6):
        return
    square = w.ndim == 2 and w.shape[0] == w.shape[1]
    raise CheckFailed(name_mistake(g, [
        *([(f"{name} is square, so it fits either way, but it is still a Conv1D weight: "
            "transpose it", w.T)] if square else []),
        *((f"{name} holds the tensor that belongs to {other}: check the name map", t)
          for other, t in want.items() if other != name),
    ], atol=1e-6) or f"{name} differs from our model's tensor")
