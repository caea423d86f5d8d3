"""transformer_course.model (chapter 06): GPTConfig, GPT, count_parameters, PRESETS."""

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_course.model import GPT, PRESETS, GPTConfig, count_parameters, init_gpt_weights


def small(**overrides) -> GPTConfig:
    return replace(GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=4, d_model=32), **overrides)


# ---------------------------------------------------------------- config
@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"vocab_size": 0}, "GPTConfig.vocab_size must be a whole number >= 1, got 0"),
        ({"n_layer": 2.0}, "n_layer must be a whole number"),
        ({"n_layer": True}, "n_layer must be a whole number"),
        ({"n_head": 5}, r"d_model=32 is not divisible by n_head=5"),
        ({"dropout": 1.0}, r"dropout must be a finite number >= 0.0 and < 1.0"),
        ({"positional": "rotary"}, "positional must be one of"),
        ({"norm": "sandwich"}, "norm must be one of"),
        ({"activation": "swish"}, "activation must be one of"),
        ({"eps": 0.0}, "eps must be a finite number > 0.0"),
        ({"eps": float("inf")}, "eps must be a finite number > 0.0, got inf"),
        ({"eps": float("nan")}, "eps must be a finite number"),
        ({"bias": "no"}, "GPTConfig.bias must be True or False, got 'no'"),
        ({"tie_weights": "False"}, "GPTConfig.tie_weights must be True or False, got 'False'"),
        ({"fast": 1}, "GPTConfig.fast must be True or False"),
        ({"positional": "sinusoidal", "d_model": 33, "n_head": 3}, "sinusoidal position code needs an even d_model"),
    ],
)
def test_config_rejects_bad_values(overrides, match):
    with pytest.raises(ValueError, match=match):
        small(**overrides)


def test_config_dict_round_trip_and_unknown_fields():
    cfg = small(positional="sinusoidal", tie_weights=False)
    assert GPTConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match=r"unknown GPTConfig field\(s\) \['n_embd'\]"):
        GPTConfig.from_dict({**cfg.to_dict(), "n_embd": 32})
    with pytest.raises(ValueError, match="GPTConfig is stored as a dict of its fields, got list"):
        GPTConfig.from_dict([1, 2])
    with pytest.raises(ValueError, match="GPTConfig: .*missing 1 required"):
        GPTConfig.from_dict({k: v for k, v in cfg.to_dict().items() if k != "d_model"})


def test_gpt_needs_a_config():
    with pytest.raises(TypeError, match="GPT needs a GPTConfig"):
        GPT({"vocab_size": 3})


# ---------------------------------------------------------------- parameters
@settings(max_examples=25, deadline=None)
@given(
    n_layer=st.integers(1, 3),
    n_head=st.sampled_from([1, 2, 4]),
    head_size=st.integers(1, 6),
    vocab=st.integers(2, 40),
    block=st.integers(1, 20),
    bias=st.booleans(),
    tie=st.booleans(),
    positional=st.sampled_from(["learned", "sinusoidal"]),
    norm=st.sampled_from(["pre", "post"]),
)
def test_count_parameters_matches_the_module(n_layer, n_head, head_size, vocab, block, bias, tie, positional, norm):
    d_model = n_head * head_size * (2 if positional == "sinusoidal" else 1)  # the sine/cosine code needs an even width
    cfg = GPTConfig(vocab, block, n_layer, n_head, d_model, bias=bias, tie_weights=tie,
                    positional=positional, norm=norm)
    assert GPT(cfg).num_parameters() == count_parameters(cfg)


def test_gpt2_small_has_the_published_parameter_count():
    # 124,439,808: the size of the released GPT-2 small checkpoint (Hugging Face "gpt2")
    assert count_parameters(PRESETS["gpt2"]) == 124_439_808
    with torch.device("meta"):
        assert GPT(PRESETS["gpt2-xl"]).num_parameters() == count_parameters(PRESETS["gpt2-xl"]) == 1_557_611_200


def test_weight_tying_shares_one_tensor():
    tied, untied = GPT(small()), GPT(small(tie_weights=False))
    assert tied.lm_head.weight is tied.embed.token.weight
    assert untied.lm_head.weight is not untied.embed.token.weight
    assert untied.num_parameters() - tied.num_parameters() == 50 * 32


def test_initialisation_follows_gpt2():
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=512, block_size=64, n_layer=8, n_head=4, d_model=256)
    model = GPT(cfg)
    residual_std = 0.02 / math.sqrt(2 * cfg.n_layer)
    for name, p in model.named_parameters():
        if name.endswith(("attn.proj.weight", "mlp.proj.weight")):
            assert p.std().item() == pytest.approx(residual_std, rel=0.05), name
        elif p.dim() == 2:
            assert p.std().item() == pytest.approx(0.02, rel=0.05), name
        elif name.endswith("bias"):
            assert torch.all(p == 0), name
        else:  # LayerNorm gains
            assert torch.all(p == 1), name


def test_init_gpt_weights_accepts_another_std():
    model = GPT(small())
    init_gpt_weights(model, 2, std=1.0)
    assert model.blocks[0].mlp.fc.weight.std().item() == pytest.approx(1.0, rel=0.1)


def test_loss_at_initialisation_is_close_to_ln_vocab():
    torch.manual_seed(0)
    model = GPT(replace(PRESETS["tiny"], vocab_size=65))
    x, y = torch.randint(0, 65, (2, 8, 64)).unbind(0)
    _, loss = model(x, y)
    assert abs(loss.item() - math.log(65)) < 0.1


# ---------------------------------------------------------------- forward
def test_forward_shapes_and_loss_is_cross_entropy_of_the_logits():
    torch.manual_seed(0)
    model = GPT(small())
    idx = torch.randint(0, 50, (3, 16))
    targets = torch.randint(0, 50, (3, 16))
    targets[0, :5] = -1  # ignored
    logits, loss = model(idx, targets)
    assert logits.shape == (3, 16, 50)
    keep = targets != -1
    expected = F.cross_entropy(logits[keep], targets[keep])
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-6)
    logits2, none = model(idx)
    assert none is None and torch.equal(logits, logits2)


def _hf_twin(cfg: GPTConfig):
    """A Hugging Face GPT-2 with the same shapes, and our GPT holding its weights."""
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=cfg.d_model,
                                     n_layer=cfg.n_layer, n_head=cfg.n_head, activation_function="gelu_new",
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=cfg.eps)
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(hf_cfg).eval()
    with torch.no_grad():  # random LayerNorm parameters, so the test also covers them
        for name, p in hf.named_parameters():
            if ".ln_" in name or name.startswith("transformer.ln_f"):
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.1)
    ours = GPT(cfg).eval()
    sd = hf.state_dict()
    mapped = {"embed.token.weight": sd["transformer.wte.weight"], "embed.position.weight": sd["transformer.wpe.weight"],
              "ln_f.weight": sd["transformer.ln_f.weight"], "ln_f.bias": sd["transformer.ln_f.bias"],
              "lm_head.weight": sd["lm_head.weight"]}
    for i in range(cfg.n_layer):
        h = f"transformer.h.{i}."
        mapped |= {f"blocks.{i}.ln1.weight": sd[h + "ln_1.weight"], f"blocks.{i}.ln1.bias": sd[h + "ln_1.bias"],
                   f"blocks.{i}.ln2.weight": sd[h + "ln_2.weight"], f"blocks.{i}.ln2.bias": sd[h + "ln_2.bias"],
                   f"blocks.{i}.attn.qkv.weight": sd[h + "attn.c_attn.weight"].T,
                   f"blocks.{i}.attn.qkv.bias": sd[h + "attn.c_attn.bias"],
                   f"blocks.{i}.attn.proj.weight": sd[h + "attn.c_proj.weight"].T,
                   f"blocks.{i}.attn.proj.bias": sd[h + "attn.c_proj.bias"],
                   f"blocks.{i}.mlp.fc.weight": sd[h + "mlp.c_fc.weight"].T,
                   f"blocks.{i}.mlp.fc.bias": sd[h + "mlp.c_fc.bias"],
                   f"blocks.{i}.mlp.proj.weight": sd[h + "mlp.c_proj.weight"].T,
                   f"blocks.{i}.mlp.proj.bias": sd[h + "mlp.c_proj.bias"]}
    ours.load_state_dict(mapped)
    return hf, ours


@pytest.mark.parametrize("fast", [True, False])
def test_matches_hugging_face_gpt2(fast):
    cfg = small(activation="gelu_tanh", fast=fast)
    hf, ours = _hf_twin(cfg)
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.block_size), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(idx, labels=idx)
        targets = torch.cat([idx[:, 1:], torch.full((2, 1), -1)], dim=1)  # HF shifts labels inside
        logits, loss = ours(idx, targets)
    torch.testing.assert_close(logits, expected.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss, expected.loss, rtol=1e-6, atol=1e-6)


def test_kv_cache_gives_the_same_logits_as_the_full_forward():
    torch.manual_seed(0)
    model = GPT(small()).eval()
    idx = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        full, _ = model(idx)
        cache = model.new_cache()
        first, _ = model(idx[:, :7], cache=cache)
        steps = [model(idx[:, t : t + 1], cache=cache)[0] for t in range(7, 12)]
    assert len(cache) == 2 and cache[0].length == 12
    torch.testing.assert_close(torch.cat([first, *steps], dim=1), full, rtol=1e-5, atol=1e-5)


def test_last_only_gives_the_last_rows_of_the_full_logits_with_and_without_cache():
    torch.manual_seed(1)
    model = GPT(small()).eval()
    idx = torch.randint(0, 50, (3, 10))
    with torch.no_grad():
        full, _ = model(idx)
        last, loss = model(idx, last_only=True)
        cache = model.new_cache()
        prefill, _ = model(idx[:, :6], cache=cache, last_only=True)
        rest, _ = model(idx[:, 6:], cache=cache, last_only=True)
    assert last.shape == (3, 1, 50) and loss is None
    torch.testing.assert_close(last, full[:, -1:], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(prefill, full[:, 5:6], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rest, full[:, -1:], rtol=1e-5, atol=1e-5)
    assert cache[0].length == 10


def test_last_only_with_targets_is_refused():
    model = GPT(small())
    idx = torch.randint(0, 50, (1, 5))
    with pytest.raises(ValueError, match="last_only=True .* no loss over targets"):
        model(idx, idx, last_only=True)


def test_fast_flag_reaches_every_layer_norm():
    for fast in (False, True):
        model = GPT(small(fast=fast))
        norms = [m for m in model.modules() if type(m).__name__ == "LayerNorm"]
        assert len(norms) == 2 * 2 + 1 and all(m.fast is fast for m in norms)


@pytest.mark.parametrize("overrides", [{"norm": "post"}, {"positional": "sinusoidal"},
                                       {"activation": "relu", "bias": False}])
def test_variants_run_and_train(overrides):
    torch.manual_seed(0)
    model = GPT(small(**overrides))
    idx = torch.randint(0, 50, (2, 16))
    _, loss = model(idx, idx)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_from_preset():
    model = GPT.from_preset("tiny", vocab_size=70)
    assert model.cfg.vocab_size == 70 and model.cfg.n_layer == 4
    with pytest.raises(ValueError, match="unknown preset 'huge'; choose one of"):
        GPT.from_preset("huge")


# ---------------------------------------------------------------- bad input
def test_sequence_longer_than_block_size_names_both_numbers():
    model = GPT(small())
    with pytest.raises(ValueError, match="sequence of length 17 is longer than block_size 16"):
        model(torch.zeros(1, 17, dtype=torch.long))
    cache = model.new_cache()
    model(torch.zeros(1, 10, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match=r"length 18 \(10 cached \+ 8 new\) is longer than block_size 16"):
        model(torch.zeros(1, 8, dtype=torch.long), cache=cache)


def test_token_ids_outside_the_vocabulary():
    model = GPT(small())
    with pytest.raises(ValueError, match="token id 50 is outside the vocabulary"):
        model(torch.tensor([[1, 50]]))
    with pytest.raises(ValueError, match="token id -1 is outside the vocabulary"):
        model(torch.tensor([[-1, 2]]))


def test_bad_targets_and_cache():
    model = GPT(small())
    idx = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"targets must have the shape of idx \(2, 4\), got \(2, 3\)"):
        model(idx, idx[:, :3])
    with pytest.raises(ValueError, match="cache has 1 layers, the model 2"):
        model(idx, cache=model.new_cache()[:1])


def test_targets_that_are_all_ignored_are_refused_not_a_silent_nan():
    """F.cross_entropy averages over the targets that count; with none it returns NaN (0 / 0), and a NaN
    loss turns every gradient into NaN. The model refuses such a batch instead."""
    model = GPT(small())
    idx = torch.zeros(2, 4, dtype=torch.long)
    ignored = torch.full((2, 4), -1)
    assert F.cross_entropy(model(idx)[0].flatten(0, 1), ignored.flatten(), ignore_index=-1).isnan()  # the silent case
    with pytest.raises(ValueError, match=r"every target is -1 \(ignored\), so there is no loss to average"):
        model(idx, ignored)
    one = ignored.clone()
    one[1, 2] = 3
    logits, loss = model(idx, one)
    assert torch.isfinite(loss) and torch.allclose(loss, F.cross_entropy(logits[1, 2][None], torch.tensor([3])))


