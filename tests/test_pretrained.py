"""Tests for transformer_course.pretrained (chapter 08): GPT-2 checkpoints in Hugging Face layout.

The reference is Hugging Face `transformers`' own GPT2LMHeadModel, built offline with random weights
(every tensor random, so no two can be confused unnoticed) and saved with `save_pretrained`.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from safetensors.torch import load_file, save_file  # noqa: E402

from transformer_course import GPT, GPTConfig, generate  # noqa: E402
from transformer_course import pretrained as P  # noqa: E402
from transformer_course.model import PRESETS  # noqa: E402
from transformer_course.pretrained import from_pretrained  # noqa: E402

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

TOL = 1e-5


def _save(model, folder, **kwargs):
    model.save_pretrained(folder, **kwargs)
    return folder


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    """(HF model, folder): 2 layers, d_model 64, 4 heads, vocabulary 512, 128 positions."""
    hf = P.make_hf_stand_in(vocab_size=512, n_positions=128, n_embd=64, n_layer=2, n_head=4, seed=0)
    return hf, _save(hf, tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def loaded(stand_in):
    return from_pretrained(stand_in[1])


@pytest.fixture(scope="module")
def idx():
    return torch.randint(0, 512, (3, 20), generator=torch.Generator().manual_seed(7))


def _logits(model, idx):
    with torch.no_grad():
        return model(idx)[0]


def test_logits_match_transformers(stand_in, loaded, idx):
    hf, _ = stand_in
    with torch.no_grad():
        expected = hf(idx).logits
    got = _logits(loaded, idx)
    assert got.shape == (3, 20, 512)
    torch.testing.assert_close(got, expected, atol=TOL, rtol=0)
    assert not loaded.training


def test_every_block_output_matches(stand_in, loaded, idx):
    hf, _ = stand_in
    ours = P.block_outputs(loaded, idx)
    with torch.no_grad():
        theirs = hf(idx, output_hidden_states=True).hidden_states
        ours[-1] = loaded.ln_f(ours[-1])  # HF's last hidden state is after ln_f
    assert len(ours) == len(theirs) == 3
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, atol=TOL, rtol=0)


def test_block_outputs_are_the_forward_pass(loaded, idx):
    """The hooks record the real stream: ln_f + lm_head of the last entry are the logits."""
    stream = P.block_outputs(loaded, idx)
    assert [tuple(s.shape) for s in stream] == [(3, 20, 64)] * 3
    assert not any(m._forward_hooks for m in loaded.modules())  # the hooks are gone afterwards
    with torch.no_grad():
        torch.testing.assert_close(loaded.lm_head(loaded.ln_f(stream[-1])), _logits(loaded, idx), atol=0, rtol=0)


def test_greedy_generation_with_cache_equals_hf_generate(stand_in, loaded, idx):
    hf, _ = stand_in
    prompt = idx[:2, :6]
    ours = generate(loaded, prompt, max_new_tokens=30, temperature=0, use_cache=True)
    theirs = hf.generate(prompt, max_new_tokens=30, do_sample=False, pad_token_id=0,
                         attention_mask=torch.ones_like(prompt))
    assert torch.equal(ours, theirs)
    assert len(set(ours[0, 6:].tolist())) > 5  # a meaningful comparison, not one token repeated


def test_from_pretrained_is_read_hf_gpt2_then_convert(stand_in, loaded, idx):
    config, tensors = P.read_hf_gpt2(stand_in[1])
    assert config == P.config_from_hf(stand_in[0].config.to_dict()) and set(tensors) >= {"transformer.wte.weight"}
    model = GPT(config)
    model.load_state_dict(P.convert_hf_state_dict(tensors, model))
    assert isinstance(loaded, GPT) and not loaded.training
    torch.testing.assert_close(_logits(model.eval(), idx), _logits(loaded, idx), atol=0, rtol=0)


def test_mapping_details(stand_in, loaded):
    hf, _ = stand_in
    assert loaded.lm_head.weight is loaded.embed.token.weight  # tied, not copied
    sd = hf.state_dict()
    block = loaded.blocks[1]
    assert torch.equal(block.attn.qkv.weight, sd["transformer.h.1.attn.c_attn.weight"].T)
    assert torch.equal(block.attn.proj.weight, sd["transformer.h.1.attn.c_proj.weight"].T)
    assert torch.equal(block.mlp.fc.weight, sd["transformer.h.1.mlp.c_fc.weight"].T)
    assert torch.equal(block.ln2.bias, sd["transformer.h.1.ln_2.bias"])
    assert torch.equal(loaded.embed.position.weight, sd["transformer.wpe.weight"])
    assert len(P.hf_key_map(2)) == 4 + 12 * 2


def test_config_mapping(stand_in):
    cfg = P.config_from_hf(stand_in[0].config.to_dict())
    assert (cfg.vocab_size, cfg.block_size, cfg.n_layer, cfg.n_head, cfg.d_model) == (512, 128, 2, 4, 64)
    assert (cfg.activation, cfg.eps, cfg.tie_weights, cfg.dropout) == ("gelu_tanh", 1e-5, True, 0.0)
    assert (cfg.norm, cfg.positional, cfg.bias) == ("pre", "learned", True)


@pytest.mark.parametrize("hf_act, ours", [("gelu_pytorch_tanh", "gelu_tanh"), ("gelu", "gelu"), ("relu", "relu")])
def test_other_activations_and_eps(tmp_path, idx, hf_act, ours):
    hf = P.make_hf_stand_in(activation_function=hf_act, layer_norm_epsilon=1e-3, seed=1)
    assert P.config_from_hf(hf.config.to_dict()).activation == ours
    model = from_pretrained(_save(hf, tmp_path))
    with torch.no_grad():
        torch.testing.assert_close(_logits(model, idx), hf(idx).logits, atol=TOL, rtol=0)


def test_untied_head_is_read_from_the_file(tmp_path, idx):
    hf = P.make_hf_stand_in(tie_word_embeddings=False, seed=2)
    assert hf.lm_head.weight is not hf.transformer.wte.weight
    model = from_pretrained(_save(hf, tmp_path))
    assert model.lm_head.weight is not model.embed.token.weight
    with torch.no_grad():
        torch.testing.assert_close(_logits(model, idx), hf(idx).logits, atol=TOL, rtol=0)


def test_sharded_safetensors(stand_in, tmp_path, idx):
    folder = _save(stand_in[0], tmp_path, max_shard_size="100KB")
    assert (folder / "model.safetensors.index.json").is_file()
    assert not (folder / "model.safetensors").exists()
    torch.testing.assert_close(_logits(from_pretrained(folder), idx), _logits(from_pretrained(stand_in[1]), idx))


def test_hub_layout_without_prefix_and_with_mask_buffers(stand_in, tmp_path, idx):
    """The Hub's "gpt2" file was saved by GPT2Model: no "transformer." prefix, plus old attn.bias buffers."""
    hf, folder = stand_in
    tensors = {k.removeprefix("transformer."): v for k, v in load_file(folder / "model.safetensors").items()}
    for i in range(2):
        tensors[f"h.{i}.attn.bias"] = torch.ones(1, 1, 128, 128).tril()
        tensors[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(tensors, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    with torch.no_grad():
        torch.testing.assert_close(_logits(from_pretrained(tmp_path), idx), hf(idx).logits, atol=TOL, rtol=0)


def test_pickled_bin_is_read_with_weights_only(stand_in, tmp_path, idx):
    hf, folder = stand_in
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    torch.save(dict(hf.state_dict()), tmp_path / "pytorch_model.bin")
    with torch.no_grad():
        torch.testing.assert_close(_logits(from_pretrained(tmp_path), idx), hf(idx).logits, atol=TOL, rtol=0)
    torch.save({"payload": _NotATensor()}, tmp_path / "pytorch_model.bin")  # arbitrary objects are refused
    with pytest.raises(Exception, match="(?i)weights.only"):
        from_pretrained(tmp_path)


class _NotATensor:
    pass


def test_safetensors_preferred_over_bin(stand_in, tmp_path):
    hf, folder = stand_in
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    (tmp_path / "pytorch_model.bin").write_bytes(b"not a pickle at all")  # never opened
    assert isinstance(from_pretrained(tmp_path), GPT)


@pytest.mark.parametrize("size", ["gpt2", "gpt2-medium", "gpt2-xl"])
def test_presets_are_the_released_gpt2_sizes(size):
    """config_from_hf of transformers' GPT-2 config is chapter 06's preset, with the same parameter count."""
    cfg = PRESETS[size]
    hf_cfg = transformers.GPT2Config(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.d_model)
    assert P.config_from_hf(hf_cfg.to_dict()) == cfg
    with torch.device("meta"):
        ours, theirs = GPT(cfg), transformers.GPT2LMHeadModel(hf_cfg)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())


# ---- bad inputs: every error names the problem --------------------------------------------------


@pytest.fixture()
def tensors(stand_in):
    return load_file(stand_in[1] / "model.safetensors")


def _model():
    return GPT(GPTConfig(vocab_size=512, block_size=128, n_layer=2, n_head=4, d_model=64, activation="gelu_tanh"))


def test_unknown_key_is_named(tensors):
    tensors["transformer.h.0.attn.rotary.weight"] = torch.zeros(3)
    with pytest.raises(ValueError, match=r"unknown keys.*h\.0\.attn\.rotary\.weight"):
        P.convert_hf_state_dict(tensors, _model())


def test_extra_layer_is_unknown(tensors):
    """A checkpoint deeper than its config: the surplus block's tensors are named."""
    tensors["transformer.h.2.ln_1.weight"] = torch.ones(64)
    with pytest.raises(ValueError, match=r"unknown keys.*n_layer=2.*h\.2\.ln_1\.weight"):
        P.convert_hf_state_dict(tensors, _model())


def test_missing_key_is_named(tensors):
    del tensors["transformer.h.1.mlp.c_proj.bias"]
    with pytest.raises(ValueError, match=r"missing keys.*h\.1\.mlp\.c_proj\.bias"):
        P.convert_hf_state_dict(tensors, _model())


def test_many_missing_keys_are_summarised(tensors):
    tensors = {k: v for k, v in tensors.items() if ".h.1." not in k}
    with pytest.raises(ValueError, match=r"missing keys.*\(6 more\)"):
        P.convert_hf_state_dict(tensors, _model())


def test_wrong_shape_is_named(tensors):
    tensors["transformer.h.0.mlp.c_fc.weight"] = torch.zeros(64, 128)
    with pytest.raises(ValueError,
                       match=r"h\.0\.mlp\.c_fc\.weight has shape \(64, 128\).*mlp\.fc\.weight needs \(256, 64\)"):
        P.convert_hf_state_dict(tensors, _model())


def test_tied_head_that_differs_is_refused(tensors):
    tensors["lm_head.weight"] = torch.zeros(512, 64)
    with pytest.raises(ValueError, match="lm_head.weight differs from wte.weight"):
        P.convert_hf_state_dict(tensors, _model())
    tensors["lm_head.weight"] = tensors["transformer.wte.weight"].clone()  # an equal copy is fine
    assert "lm_head.weight" in P.convert_hf_state_dict(tensors, _model())


def test_untied_model_needs_lm_head(tensors):
    model = GPT(GPTConfig(vocab_size=512, block_size=128, n_layer=2, n_head=4, d_model=64,
                          activation="gelu_tanh", tie_weights=False))
    with pytest.raises(ValueError, match="missing keys.*lm_head.weight"):
        P.convert_hf_state_dict(tensors, model)


@pytest.mark.parametrize("change, message", [
    ({"model_type": "llama"}, "'llama' model; from_pretrained reads GPT-2 only"),
    ({"n_inner": 100}, "n_inner=100 is not supported.*256"),
    ({"activation_function": "silu"}, "activation_function 'silu' is not supported"),
    ({"add_cross_attention": True}, "add_cross_attention=True is a GPT-2 variant"),
    ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx=True"),
    ({"scale_attn_weights": False}, "scale_attn_weights=False"),
])
def test_unsupported_config_is_refused(stand_in, change, message):
    with pytest.raises(ValueError, match=message):
        P.config_from_hf({**stand_in[0].config.to_dict(), **change})


def test_config_without_sizes_is_refused():
    with pytest.raises(ValueError, match="lacks n_positions, n_embd.*GPT-2 config"):
        P.config_from_hf({"vocab_size": 10, "n_layer": 1, "n_head": 1})


def test_folder_problems(stand_in, tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(stand_in[0].config.to_dict()))
    with pytest.raises(FileNotFoundError, match="no weights.*model.safetensors"):
        from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="neither a folder.*nor a Hub name"):
        from_pretrained(tmp_path / "config.json")
    with pytest.raises(FileNotFoundError, match="neither a folder"):
        from_pretrained("./no/such/folder")


def test_offline_hub_fails_clearly(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert not P.hub_reachable()
    with pytest.raises(P.HubUnavailableError, match="cannot download 'gpt2'.*not reachable.*local folder"):
        P.download_hf_gpt2("gpt2", cache_dir=tmp_path)  # an empty cache


def test_hub_names_go_to_the_download(monkeypatch, stand_in):
    asked = []
    monkeypatch.setattr(P, "download_hf_gpt2", lambda name: asked.append(name) or stand_in[1])
    assert isinstance(from_pretrained("openai-community/gpt2"), GPT)
    assert asked == ["openai-community/gpt2"]


def test_hub_probe_respects_offline_and_proxies(monkeypatch):
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    assert P.hub_reachable()  # no direct probe through a proxy: huggingface_hub decides
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert not P.hub_reachable()  # offline mode wins


def test_download_that_fails_on_the_way_is_reported_as_offline(monkeypatch, tmp_path):
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def no_files(*args, **kwargs):
        raise LocalEntryNotFoundError("connection dropped")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_files)
    monkeypatch.setattr(P, "hub_reachable", lambda timeout=2.0: True)
    with pytest.raises(P.HubUnavailableError, match="cannot download 'gpt2-medium'"):
        P.download_hf_gpt2("gpt2-medium", cache_dir=tmp_path)


def test_the_hub_gpt2_config_is_the_gpt2_preset():
    """config.json of the Hub's "gpt2" (older keys, no tie/scale fields: the defaults apply)."""
    hub_config = {
        "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
        "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
        "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": None,
        "summary_first_dropout": 0.1, "summary_proj_to_labels": True, "summary_type": "cls_index",
        "summary_use_proj": True, "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
        "vocab_size": 50257,
    }
    assert P.config_from_hf(hub_config) == PRESETS["gpt2"]


def test_stand_in_has_no_default_valued_tensor(stand_in):
    """Every tensor random: LayerNorm weights not all 1, biases not all 0, no two tensors alike."""
    hf, _ = stand_in
    named = dict(hf.named_parameters())
    for name, p in named.items():
        assert not torch.all(p == 1) and not torch.all(p == 0), name
    ln = named["transformer.h.0.ln_1.weight"]
    assert abs(ln.mean().item() - 1.0) < 0.1 and 0.05 < ln.std().item() < 0.2
    assert not torch.equal(named["transformer.h.0.ln_1.weight"], named["transformer.h.0.ln_2.weight"])
