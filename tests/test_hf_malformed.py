"""Issue 40: malformed Hugging Face folders (GPT-2 for from_pretrained, Llama for load_hf_llama) are refused
with an error that names the file and the key or field, before a config's sizes are allocated (was: raw
KeyError, RuntimeError, RecursionError, MemoryError, or messages naming no file)."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

pytest.importorskip("transformers")

from transformer_course import pretrained as P  # noqa: E402
from transformer_course.llama import load_hf_llama, make_llama_stand_in  # noqa: E402


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("hf")
    P.make_hf_stand_in(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=4).save_pretrained(base / "gpt2")
    make_llama_stand_in(vocab_size=96, hidden_size=32, n_layer=2, n_head=4, n_kv_head=2, intermediate_size=64,
                        max_positions=32).save_pretrained(base / "llama")
    return base


def edit_config(**changes):
    def edit(folder):
        cfg = json.loads((folder / "config.json").read_text())
        for k, v in changes.items():
            if v is None:
                cfg.pop(k)
            else:
                cfg[k] = v
        (folder / "config.json").write_text(json.dumps(cfg))
    return edit


def write_config(text):
    return lambda folder: (folder / "config.json").write_text(text)


def edit_weights(change):
    def edit(folder):
        tensors = load_file(folder / "model.safetensors")
        change(tensors)
        (folder / "model.safetensors").unlink()
        save_file(tensors, folder / "model.safetensors")
    return edit


def first(tensors, part):
    return next(k for k in tensors if part in k)


def _nan(t):
    t[first(t, "attn")].view(-1)[0] = float("nan")


def _reshape(t):
    k = first(t, "mlp")
    t[k] = torch.zeros(t[k].shape[0] + 1, *t[k].shape[1:])


def _drop(t):
    del t[first(t, "ln_f" if any("ln_f" in k for k in t) else "model.norm")]


def _extra(t):
    t["transformer.h.9.surprise.weight" if any("transformer" in k or k.startswith("h.") for k in t)
      else "model.layers.0.surprise.weight"] = torch.zeros(2)


def _pickled_list(folder):
    (folder / "model.safetensors").unlink()
    torch.save([torch.zeros(2)], folder / "pytorch_model.bin")


def _index(weight_map):
    def edit(folder):
        (folder / "model.safetensors").rename(folder / "shard.safetensors")
        (folder / "model.safetensors.index.json").write_text(json.dumps(weight_map))
    return edit


HF = P.HFCheckpointError
CASES = [  # (id, model, edit, error, what the message must name)
    ("no config", "gpt2", lambda f: (f / "config.json").unlink(), FileNotFoundError, "no config.json in"),
    ("config not JSON", "gpt2", write_config("{oops"), HF, r"config\.json is not a Hugging Face config \(invalid JSON"),
    ("config a list", "gpt2", write_config("[1, 2]"), HF, r"config\.json holds a JSON list"),
    ("config nested", "gpt2", write_config('{"a": ' + "[" * 3000 + "]" * 3000 + "}"), HF,
     r"config\.json is not a Hugging Face config: its JSON nests 3001 levels deep, and at most 16"),
    ("n_embd a string", "gpt2", edit_config(n_embd="32"), HF,
     r"config\.json: n_embd must be a whole number in 1\.\.16,777,216, got '32'"),
    ("n_layer huge", "gpt2", edit_config(n_layer=10**12), HF, r"config\.json: n_layer must be a whole number"),
    ("model bigger than its file", "gpt2", edit_config(vocab_size=4_000_000), HF,
     r"config\.json describes a model of [\d,]+ parameters .* model\.safetensors hold [\d,]+ bytes"),
    ("n_head missing", "gpt2", edit_config(n_head=None), HF, r"config\.json: config\.json lacks n_head"),
    ("heads do not divide", "gpt2", edit_config(n_head=5), HF, r"config\.json: .*n_head"),
    ("no weights", "gpt2", lambda f: (f / "model.safetensors").unlink(), FileNotFoundError, "no weights in"),
    ("weights garbage", "gpt2", lambda f: (f / "model.safetensors").write_bytes(b"\x00" * 64), HF,
     r"model\.safetensors cannot be read as weights"),
    ("NaN weight", "gpt2", edit_weights(_nan), HF, r"model\.safetensors: tensor '\S*attn\S*' holds NaN"),
    ("wrong shape", "gpt2", edit_weights(_reshape), HF, r"model\.safetensors: \S*mlp\S* has shape"),
    ("missing key", "gpt2", edit_weights(_drop), HF, r"model\.safetensors: missing keys .*ln_f"),
    ("extra key", "gpt2", edit_weights(_extra), HF, r"model\.safetensors: unknown keys .*surprise"),
    ("pickle of a list", "gpt2", _pickled_list, HF, r"pytorch_model\.bin does not hold a dict of named tensors"),
    ("index without weight_map", "gpt2", _index({"x": 1}), HF, r"index\.json is not a safetensors index"),
    ("index outside the folder", "gpt2", _index({"weight_map": {"a": "../shard.safetensors"}}), HF,
     r"index\.json: weight_map may only name files beside it"),
    ("llama hidden_size missing", "llama", edit_config(hidden_size=None), HF,
     r"config\.json: lacks the field 'hidden_size'"),
    ("llama zero heads", "llama", edit_config(num_attention_heads=0), HF,
     r"config\.json: num_attention_heads must be a whole number"),
    ("llama eps not a number", "llama", edit_config(rms_norm_eps="tiny"), HF, r"config\.json: "),
    ("llama config a string", "llama", write_config('"llama"'), HF, r"config\.json holds a JSON str"),
    ("llama wrong shape", "llama", edit_weights(_reshape), HF, r"model\.safetensors: blocks\.\d\.mlp\.\S+ has shape"),
    ("llama extra key", "llama", edit_weights(_extra), HF, r"model\.safetensors: unexpected tensor .*surprise"),
    ("llama NaN", "llama", edit_weights(_nan), HF, r"model\.safetensors: tensor '\S*attn\S*' holds NaN"),
    ("llama bigger than its file", "llama", edit_config(intermediate_size=1_000_000), HF,
     r"config\.json describes a model of [\d,]+ parameters"),
]


@pytest.mark.parametrize("model, edit, error, match", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_malformed_folder_is_refused_naming_the_file(folders, tmp_path, model, edit, error, match):
    folder = tmp_path / model
    shutil.copytree(folders / model, folder)
    edit(folder)
    load = P.from_pretrained if model == "gpt2" else load_hf_llama
    with pytest.raises(error, match=match):
        load(folder)
    assert issubclass(P.HFCheckpointError, ValueError)


def test_the_untouched_folders_load(folders):
    assert P.from_pretrained(folders / "gpt2").cfg.n_layer == 2
    assert load_hf_llama(folders / "llama").cfg.n_layer == 2
