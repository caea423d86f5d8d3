"""Export a course model to a folder Hugging Face `transformers` loads offline (issue 37; hand-written,
not exported).

``export(model, tokenizer, folder)`` writes config.json, model.safetensors and generation_config.json
(GPT-2-style models as `GPT2LMHeadModel`, chapter 10's Llama-style ones as `LlamaForCausalLM`), the
tokenizer as a `tokenizers` file that `AutoTokenizer` loads (tokenizer.json, tokenizer_config.json;
chapter 11's chat format as its chat_template) and a model card (README.md). It is the inverse of
chapter 08's loader (`pretrained.hf_key_map`) and chapter 10's (`llama`'s tables): the same tables, read
the other way. Exactly what our model computes is written, or the export is refused naming the option
that `transformers` has no equivalent for (post-norm blocks, a mix of GPT-2's and Llama's parts).
``export_checkpoint(path, folder)`` reads a checkpoint of `transformer-course train` or a chat model
(chapters 11-12) first; ``transformer-course export`` calls it.

The folder is written safely (issue 55): an empty ``--to``, a link to a missing target or a non-empty folder
that is not an earlier export is refused; the files are written into a hidden folder inside it and moved
in, with the permissions of a normal file write (the umask); ``MANIFEST`` lists them with their SHA-256,
and a later export replaces or removes only those, unchanged; nothing else in the folder is touched. A
model with NaN or infinite weights, or with LoRA adapters not merged, is refused naming the tensor or the
layers.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

import torch

from .config import GPTConfig
from .pretrained import HF_ACTIVATIONS, hf_key_map
from .runtime import file_sha256

__all__ = [
    "ExportError", "hf_architecture", "gpt2_config", "llama_config", "gpt2_state_dict", "llama_state_dict",
    "hf_model", "chat_template", "hf_tokenizer", "hf_tokenizer_fast", "model_card", "export",
    "read_for_export", "export_checkpoint", "MANIFEST", "check_folder",
]


class ExportError(ValueError):
    """A model or tokenizer that `transformers` cannot reproduce exactly (the message names the option),
    weights that are not finite or not merged, or a folder the export may not write into."""


_LLAMA_PARTS = {"positional": "rope", "normalization": "rmsnorm", "mlp": "swiglu"}
_GPT2_PARTS = {"positional": ("learned", "sinusoidal"), "normalization": ("layernorm",), "mlp": ("plain",)}
# our activation -> GPT-2's activation_function with the very same kernel ("gelu_pytorch_tanh" is
# F.gelu(approximate="tanh"), as ours; "gelu_new" writes the formula out and rounds differently)
_ACTIVATION_NAMES = {ours: hf for hf, ours in HF_ACTIVATIONS.items()}


def hf_architecture(cfg: GPTConfig) -> str:
    """"gpt2" or "llama": the `transformers` model that computes what `cfg`'s model computes, or an
    `ExportError` naming the option that neither has."""
    if cfg.norm != "pre":
        raise ExportError(f"norm={cfg.norm!r} (post-norm blocks, the 2017 paper's) has no equivalent in transformers' "
                          "GPT-2 or Llama, which normalise before each sub-layer: only norm='pre' models can be "
                          "exported")
    if not cfg.needs_modern_parts:
        return "gpt2"
    other = [f"{name}={getattr(cfg, name)!r}" for name, want in _LLAMA_PARTS.items() if getattr(cfg, name) != want]
    if other:
        raise ExportError(f"{', '.join(other)} with chapter 10's other parts has no equivalent in transformers: "
                          "LlamaForCausalLM needs positional='rope', normalization='rmsnorm' and mlp='swiglu' "
                          "together, GPT2LMHeadModel learned or sinusoidal positions, LayerNorm and the plain MLP")
    return "llama"


def _token_ids(eos_id: int | None) -> dict:
    # GPT2Config's defaults name id 50256 (GPT-2's <|endoftext|>): our vocabularies are others
    return {"bos_token_id": None, "eos_token_id": eos_id, "pad_token_id": eos_id}


def gpt2_config(cfg: GPTConfig, eos_id: int | None = None) -> dict:
    """`GPT2Config` fields for `cfg` (inverse of chapter 08's `config_from_hf`). Biases off are written
    as zeros, sinusoidal positions as the wpe table they fill, n_kv_head < n_head as copied key/value heads."""
    hf_architecture(cfg)
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": cfg.vocab_size,
            "n_positions": cfg.block_size, "n_embd": cfg.d_model, "n_layer": cfg.n_layer, "n_head": cfg.n_head,
            "n_inner": cfg.hidden_width, "activation_function": _ACTIVATION_NAMES[cfg.activation],
            "layer_norm_epsilon": cfg.eps, "tie_word_embeddings": cfg.tie_weights, "resid_pdrop": cfg.dropout,
            "embd_pdrop": cfg.dropout, "attn_pdrop": cfg.dropout, **_token_ids(eos_id)}


def llama_config(cfg: GPTConfig, eos_id: int | None = None) -> dict:
    """`LlamaConfig` fields for a Llama-style `cfg` (inverse of chapter 10's `llama.config_from_llama`);
    biases on become attention_bias and mlp_bias."""
    if hf_architecture(cfg) != "llama":
        raise ExportError("llama_config needs chapter 10's parts (positional='rope', normalization='rmsnorm', "
                          "mlp='swiglu'); a GPT-2-style config is exported by gpt2_config")
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.d_model, "intermediate_size": cfg.hidden_width, "num_hidden_layers": cfg.n_layer,
            "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.n_kv_head or cfg.n_head,
            "head_dim": cfg.head_size, "max_position_embeddings": cfg.block_size, "rms_norm_eps": cfg.eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_base}, "hidden_act": "silu",
            "attention_bias": cfg.bias, "mlp_bias": cfg.bias, "tie_word_embeddings": cfg.tie_weights,
            "attention_dropout": cfg.dropout, **_token_ids(eos_id)}


def _state(model) -> dict[str, torch.Tensor]:
    """The model's tensors (float32, CPU), refused (`ExportError`) when LoRA adapters are not merged or
    a tensor holds NaN or infinite values: `transformers` would load them without a word."""
    from .lora import LoRALinear

    if adapted := [name for name, module in model.named_modules() if isinstance(module, LoRALinear)]:
        raise ExportError(f"the model has {len(adapted)} LoRA adapters not merged ({', '.join(adapted[:4])}"
                          f"{', ...' if len(adapted) > 4 else ''}): call transformer_course.lora.merge_lora(model) "
                          "first and export the merged model")
    state = {k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items()}
    for name, t in state.items():
        if not torch.isfinite(t).all():
            nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
            what = " and ".join(f"{n:,} {kind} value{'s' if n > 1 else ''}"
                                for n, kind in ((nan, "NaN"), (inf, "infinite")) if n)
            raise ExportError(f"tensor {name!r} holds {what} (of {t.numel():,}): a model with non-finite weights "
                              "is not exported (a diverged training run? export an earlier checkpoint)")
    return state


def _full_heads(model, state: dict[str, torch.Tensor], i: int, suffix: str) -> torch.Tensor | None:
    """Block i's packed qkv weight (or bias) with every key/value head copied for its group of query
    heads (chapter 10's `share_kv_heads`, done once on the weights): GPT-2 has one k and v per head."""
    t = state.get(f"blocks.{i}.attn.qkv.{suffix}")
    cfg = model.cfg
    nh, nkv, hs = cfg.n_head, cfg.n_kv_head or cfg.n_head, cfg.head_size
    if t is None or nkv == nh:
        return t
    q, k, v = t.split([nh * hs, nkv * hs, nkv * hs])
    k, v = (x.unflatten(0, (nkv, hs)).repeat_interleave(nh // nkv, dim=0).flatten(0, 1) for x in (k, v))
    return torch.cat([q, k, v])


def gpt2_state_dict(model) -> dict[str, torch.Tensor]:
    """Our GPT-2-style `GPT`'s weights under `GPT2LMHeadModel`'s names (chapter 08's `hf_key_map`, read
    backwards: `Conv1D` weights transposed to [in, out]); absent biases as zeros."""
    cfg, state = model.cfg, _state(model)
    for i in range(cfg.n_layer):
        for suffix in ("weight", "bias"):
            if (full := _full_heads(model, state, i, suffix)) is not None:
                state[f"blocks.{i}.attn.qkv.{suffix}"] = full
    if cfg.positional == "sinusoidal":  # the fixed table (a buffer, not saved) becomes GPT-2's wpe
        state["embed.position.weight"] = model.embed.pe.detach().to("cpu", torch.float32)
    out = {}
    for hf, (ours, transpose) in hf_key_map(cfg.n_layer).items():
        if ours not in state:  # bias=False: LayerNorm and Linear without a shift are the same with a zero one
            weight = state[ours.removesuffix("bias") + "weight"]
            state[ours] = weight.new_zeros(weight.shape[0])  # [C] for a LayerNorm, [out] for a Linear
        out[f"transformer.{hf}"] = (state[ours].T if transpose else state[ours]).contiguous()
    if not cfg.tie_weights:
        out["lm_head.weight"] = state["lm_head.weight"]
    return out


def llama_state_dict(model) -> dict[str, torch.Tensor]:
    """Our Llama-style `GPT`'s weights under `LlamaForCausalLM`'s names (chapter 10's `llama` tables read
    backwards: the packed qkv cut into q_proj, k_proj, v_proj); biases as *_proj.bias."""
    from .llama import _LAYER, _OUTSIDE

    cfg, state = model.cfg, _state(model)
    nh, nkv, hs = cfg.n_head, cfg.n_kv_head or cfg.n_head, cfg.head_size
    out = {hf: state[ours] for hf, ours in _OUTSIDE.items() if not (cfg.tie_weights and hf == "lm_head.weight")}
    for i in range(cfg.n_layer):
        for suffix in ("weight", "bias") if cfg.bias else ("weight",):
            packed = state[f"blocks.{i}.attn.qkv.{suffix}"]
            state.update({f"blocks.{i}.attn.{p}.{suffix}": t
                          for p, t in zip("qkv", packed.split([nh * hs, nkv * hs, nkv * hs]), strict=True)})
        for hf, ours in _LAYER.items():
            ours = ours if ours.endswith(".weight") else ours + ".weight"  # attn.q, attn.k, attn.v: cut above
            out[f"model.layers.{i}.{hf}"] = state[f"blocks.{i}.{ours}"]
            if cfg.bias and hf.endswith("_proj.weight"):
                out[f"model.layers.{i}.{hf.removesuffix('weight')}bias"] = state[f"blocks.{i}.{ours[:-6]}bias"]
    return {k: v.contiguous() for k, v in out.items()}


def _transformers():
    try:
        import transformers
    except ImportError as e:  # a RuntimeError: the command line says it in one line
        raise RuntimeError("exporting needs transformers, safetensors and tokenizers: pip install "
                           "'transformer-course[pretrained]' (from a clone: pip install '.[pretrained]')") from e
    return transformers


def hf_model(model, eos_id: int | None = None):
    """The `transformers` model (eval mode, float32) that computes what our `GPT` computes, its weights
    loaded strictly: `GPT2LMHeadModel` or `LlamaForCausalLM` (`hf_architecture`)."""
    tf = _transformers()
    if hf_architecture(model.cfg) == "gpt2":
        fields, state, kind = gpt2_config(model.cfg, eos_id), gpt2_state_dict(model), "GPT2"
    else:
        fields, state, kind = llama_config(model.cfg, eos_id), llama_state_dict(model), "Llama"
    fields = {k: v for k, v in fields.items() if k not in ("model_type", "architectures")}
    config = getattr(tf, f"{kind}Config")(**fields)
    hf = getattr(tf, f"{kind}ForCausalLM" if kind == "Llama" else "GPT2LMHeadModel")(config)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    if unexpected or set(missing) - ({"lm_head.weight"} if model.cfg.tie_weights else set()):
        raise ExportError(f"the {kind} model's weights do not match ours: missing {missing}, unexpected {unexpected}")
    return hf.eval()


# ---------------------------------------------------------------- the tokenizer
def _byte_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character table that byte-level BPE files (and `tokenizers`' ByteLevel)
    write tokens in: printable bytes stand for themselves, the others for code points from 256 on."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + n) for n, b in enumerate(others)}}


def chat_template() -> str:
    """A Jinja chat template that renders what chapter 11's `assistant.render_chat` renders: each message
    as its role token, its content, <|end|>; `add_generation_prompt` appends <|assistant|>."""
    from .assistant import ROLES, SPECIALS

    user, assistant, end = SPECIALS
    return ("{% for message in messages %}"
            f"{{% if message['role'] not in {list(ROLES)!r} %}}"
            f"{{{{ raise_exception('each message needs the role {' or '.join(ROLES)}') }}}}{{% endif %}}"
            f"{{{{ '{user}' if message['role'] == 'user' else '{assistant}' }}}}"
            f"{{{{ message['content'] }}}}{end}"
            "{% endfor %}"
            f"{{% if add_generation_prompt %}}{assistant}{{% endif %}}")


def hf_tokenizer(tokenizer):
    """A `tokenizers.Tokenizer` that gives the ids of ours: chapter 01's CharTokenizer (one id per
    character: a WordLevel vocabulary over single characters), its byte-level BPETokenizer (BPE with
    our merges in rank order, our pre-split regex, GPT-2's byte alphabet) or chapter 11's ChatTokenizer
    (its base with the three turn tokens as special tokens)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    from .assistant import ChatTokenizer
    from .tokenization import BPETokenizer, CharTokenizer

    base = tokenizer.base if isinstance(tokenizer, ChatTokenizer) else tokenizer
    specials = dict(tokenizer.special) if isinstance(tokenizer, ChatTokenizer) else {}
    if isinstance(base, CharTokenizer):
        vocab = {**base.stoi, **specials}
        tok = Tokenizer(models.WordLevel(vocab, unk_token="<|unk|>"))  # no such token: an unknown character fails
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character alone
        tok.decoder = decoders.Fuse()  # characters joined with nothing between them
    elif isinstance(base, BPETokenizer):
        specials = {**base.special_tokens, **specials}
        chars = _byte_chars()
        text = {i: "".join(chars[b] for b in data) for i, data in base.vocab.items()}
        merges = [(text[a], text[b]) for (a, b), _ in sorted(base.merges.items(), key=lambda m: m[1])]
        # ignore_merges: a chunk that is one token is that token, as `BPETokenizer._encode_chunk` (and tiktoken) do
        tok = Tokenizer(models.BPE({t: i for i, t in text.items()} | specials, merges, ignore_merges=True))
        split = ([pre_tokenizers.Split(Regex(base.pattern), behavior="isolated")] if base.pattern else [])
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [*split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
    else:
        raise ExportError(f"a {type(base).__name__} cannot be exported: the course exports CharTokenizer, "
                          "BPETokenizer and ChatTokenizer")
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s, _ in
                            sorted(specials.items(), key=lambda s: s[1])])
    if wrong := {s: tok.token_to_id(s) for s, i in specials.items() if tok.token_to_id(s) != i}:
        raise ExportError(f"special tokens would get other ids in transformers: {wrong}")
    return tok


def hf_tokenizer_fast(tokenizer, block_size: int | None = None):
    """`hf_tokenizer` wrapped as the `transformers` tokenizer `AutoTokenizer` loads back: no spaces
    cleaned up on decoding, chapter 11's chat_template and <|end|> as eos for a ChatTokenizer."""
    tf = _transformers()
    from .assistant import ChatTokenizer

    chat = isinstance(tokenizer, ChatTokenizer)
    extra = {"chat_template": chat_template(), "eos_token": "<|end|>", "pad_token": "<|end|>"} if chat else {}
    return tf.PreTrainedTokenizerFast(tokenizer_object=hf_tokenizer(tokenizer), clean_up_tokenization_spaces=False,
                                      model_max_length=block_size or int(1e30), **extra)


# ---------------------------------------------------------------- the model card
def _losses_lines(history: dict | None, losses: list[float] | None) -> list[str]:
    lines = []
    if history and history.get("eval_step"):
        lines += ["| step | train loss | val loss |", "| ---: | ---: | ---: |"]
        evals = list(zip(history["eval_step"], history["train_loss"], history["val_loss"], strict=False))
        shown = evals if len(evals) <= 8 else [evals[0], *evals[1:-1][:: math.ceil(len(evals) / 6)], evals[-1]]
        lines += [f"| {s} | {t:.4f} | {v:.4f} |" for s, t, v in shown]
        lines += ["", "Losses are mean cross-entropy per token (nats), from the checkpoint's history."]
    elif losses:
        k = max(1, min(50, len(losses) // 10))
        first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
        lines += [f"Fine-tuning loss (mean cross-entropy of the answer tokens, nats): {first:.4f} over the first "
                  f"{k} steps, {last:.4f} over the last {k} of {len(losses)}."]
    else:
        lines += ["No losses are recorded with this model."]
    return lines


def _one_token_text(tokenizer) -> str | None:
    """The first printable text that `tokenizer` encodes as one id of its own: the shortest prompt."""
    for i in range(tokenizer.vocab_size):
        try:
            text = tokenizer.decode([i])
            if text.strip() and text.isprintable() and tokenizer.encode(text) == [i]:
                return text
        except (ValueError, KeyError, IndexError, TypeError):
            continue
    return None


def _use_example(tokenizer, block_size: int) -> str:
    """The card's line that generates: a prompt this tokenizer encodes and as many new tokens (at most 100,
    16 for a chat) as keep the prompt and them within the model's `block_size` tokens (at least one)."""
    from .assistant import ChatTokenizer, render_chat

    chat = isinstance(tokenizer, ChatTokenizer)
    short = _one_token_text(tokenizer.base if chat else tokenizer)
    fits = []
    for text in ("upper: hello" if chat else "ROMEO:", short):
        if text is None:
            continue
        try:
            n = (len(render_chat([{"role": "user", "content": text}], tokenizer, generation_prompt=True)[0]) if chat
                 else len(tokenizer.encode(text)))
        except (ValueError, KeyError):  # a character the vocabulary lacks
            continue
        fits.append((n >= block_size, n, text))
        if n < block_size:
            break
    _, n, text = min(fits) if fits else (True, 1, short or "")
    new = max(1, min(16 if chat else 100, block_size - n))
    if chat:
        return f"print(generate([{{'role': 'user', 'content': {text!r}}}], max_new_tokens={new}))"
    return f'print(generate({text!r}, max_new_tokens={new}, do_sample=False)[0]["generated_text"])'


def model_card(model, tokenizer, *, architecture: str, source: str | None = None, data: str | None = None,
               train_config: dict | None = None, history: dict | None = None, losses: list[float] | None = None,
               facts: dict | None = None) -> str:
    """README.md for the exported folder: what the model is, its data, recipe and losses."""
    cfg = model.cfg
    kind = {"gpt2": "GPT2LMHeadModel (GPT-2 style: learned positions, LayerNorm, GELU MLP)",
            "llama": "LlamaForCausalLM (Llama style: rotary positions, RMSNorm, SwiGLU)"}[architecture]
    notes = []
    if architecture == "gpt2" and cfg.positional == "sinusoidal":
        notes.append("its fixed sinusoidal position code is stored as GPT-2's position table (wpe)")
    if architecture == "gpt2" and not cfg.bias:
        notes.append("it was trained without biases; GPT-2's biases are stored as zeros")
    if architecture == "gpt2" and cfg.n_kv_head not in (None, cfg.n_head):
        notes.append(f"its {cfg.n_kv_head} key/value heads are copied for each of the {cfg.n_head} query heads")
    recipe = facts.get("recipe") if facts else None
    lines = [
        "---", "library_name: transformers", "pipeline_tag: text-generation", "tags:", "- transformer-course", "---",
        "", f"# {Path(source).stem if source else 'A transformer-course model'}", "",
        f"A decoder-only transformer of {model.num_parameters():,} parameters trained with the transformer-course "
        "package, exported by `transformer-course export` for Hugging Face `transformers` as "
        f"{kind}{': ' + '; '.join(notes) if notes else ''}.", "",
        f"- Shape: {cfg.n_layer} layers, {cfg.n_head} heads"
        + (f" ({cfg.n_kv_head} key/value heads)" if cfg.n_kv_head not in (None, cfg.n_head) else "")
        + f", width {cfg.d_model}, MLP width {cfg.hidden_width}, context {cfg.block_size} tokens, "
        f"vocabulary {cfg.vocab_size}, {'tied' if cfg.tie_weights else 'separate'} input and output embeddings.",
        f"- Tokenizer: {tokenizer!r}.",
        f"- Source: `{Path(source).name}`." if source else "- Source: a model object.",
        "", "## Data", "", data or "Not recorded with the model.", "", "## Recipe", "",
    ]
    if recipe or train_config:
        lines += ["```json", json.dumps(recipe or train_config, indent=2), "```"]
    else:
        lines += ["Not recorded with the model."]
    results = {k: v for k, v in (facts or {}).items()
               if k not in ("recipe", "train_config", "built", "file", "sha256", "bytes")}
    if results:
        lines += ["", "Recorded results:", "", "```json", json.dumps(results, indent=2)[:4000], "```"]
    lines += ["", "## Losses", "", *_losses_lines(history, losses), "", "## Use", "",
              f"The model reads at most {cfg.block_size} tokens: keep the prompt and the new tokens within that.", "",
              "```python",
              "from transformers import pipeline", "",
              'generate = pipeline("text-generation", model="PATH/TO/THIS/FOLDER")',
              _use_example(tokenizer, cfg.block_size),
              "```", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- the folder
MANIFEST = ".transformer-course-export.json"  # {"files": {name: SHA-256}}: what the last export wrote
_NAME = re.compile(r"[\w.-]+")  # a plain file name: no folder, no link out of the folder
_DIGEST = re.compile(r"[0-9a-f]{64}")


def _read_manifest(folder: Path) -> dict[str, set[str]] | None:
    """{file name: the SHA-256s it may have} of the export that wrote `folder`, or None when `folder` has
    no such manifest or one that is not (a link, bad JSON, a name that is not a plain file name)."""
    try:
        handle = os.open(folder / MANIFEST, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(handle, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                return None
            files = json.loads(file.read(1 << 20).decode("utf-8"))["files"]
        manifest = {name: {digest} if isinstance(digest, str) else set(digest) for name, digest in files.items()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    ok = all(isinstance(name, str) and _NAME.fullmatch(name) and name not in (".", "..", MANIFEST) and digests
             and all(isinstance(d, str) and _DIGEST.fullmatch(d) for d in digests)
             for name, digests in manifest.items())
    return manifest if ok else None


def _write_manifest(folder: Path, staging: Path, files: dict, mode: int) -> None:
    tmp = staging / MANIFEST
    tmp.write_text(json.dumps({"written_by": "transformer-course export: it replaces or removes only these files, "
                                             "unchanged", "files": files}, indent=1, sort_keys=True) + "\n",
                   encoding="utf-8")
    tmp.chmod(mode)
    os.replace(tmp, folder / MANIFEST)


def check_folder(folder) -> Path:
    """`folder` as a Path when an export may write there: missing, empty, or an earlier export (its
    `MANIFEST`); else an `ExportError` in one line: an empty path (an unset shell variable would mean the
    current folder), a link to a missing target, a file, a folder holding other things."""
    if isinstance(folder, str) and not folder:
        raise ExportError("--to is empty (an unset shell variable?): give the folder to write, e.g. --to hf/my-model")
    folder = Path(folder)
    if folder.is_symlink() and not folder.exists():
        raise ExportError(f"--to {folder} is a symbolic link to a missing target ({os.readlink(folder)}): remove the "
                          "link or give another folder")
    if folder.exists() and not folder.is_dir():
        raise ExportError(f"--to {folder} is a file; give a folder")
    _check_replaceable(folder, _earlier_export(folder), ())  # its files are all replaced or removed
    return folder


def _earlier_export(folder: Path, ignore: Path | None = None) -> dict[str, set[str]]:
    """The manifest of the earlier export in `folder` ({} for a missing or empty folder); `ExportError`
    for a non-empty folder without one."""
    held = sorted(p.name for p in folder.iterdir() if p != ignore) if folder.is_dir() else []
    if not held:
        return {}
    manifest = _read_manifest(folder)
    if manifest is None:
        shown = ", ".join(held[:4]) + (f" and {len(held) - 4} more" if len(held) > 4 else "")
        raise ExportError(f"--to {folder} is not empty and not an earlier export of transformer-course (it holds "
                          f"{shown}; no {MANIFEST}): give a new or empty folder, nothing in it is replaced")
    return manifest


def _check_replaceable(folder: Path, manifest: dict[str, set[str]], names) -> None:
    """`ExportError` unless each of `names` (to be written) and of the earlier export's files (to be
    replaced or removed) is missing, or a regular file the export wrote, unchanged since."""
    for name in sorted(set(manifest) | set(names)):
        path = folder / name
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(info.st_mode):
            raise ExportError(f"{path} is not a regular file the export wrote (a link or a folder): move it away or "
                              "export to another folder")
        if name not in manifest:
            raise ExportError(f"{path} was not written by transformer-course export: move it away or export to "
                              "another folder")
        if file_sha256(path) not in manifest[name]:
            raise ExportError(f"{path} changed since transformer-course export wrote it (your edits?): move it away "
                              "or export to another folder")


def _file_mode() -> int:
    """The permissions a normal file write gets: 0o666 less the umask (safetensors writes 0o600)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def _write_folder(folder: Path, write) -> None:
    """Call `write(staging)` to write the export's files into a new folder inside `folder`, then move them
    in: each file of the earlier export replaced or, if not written again, removed; nothing else touched."""
    created, done = not folder.exists(), False
    folder.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".transformer-course-export-", dir=folder))
    try:
        manifest = _earlier_export(folder, ignore=staging)
        write(staging)
        mode = _file_mode()
        files = {}
        for path in sorted(staging.iterdir()):
            if not path.is_file() or path.is_symlink() or not _NAME.fullmatch(path.name) or path.name == MANIFEST:
                raise RuntimeError(f"the export wrote {path.name!r}, which is not a plain file it can list")
            path.chmod(mode)
            files[path.name] = file_sha256(path)
        _check_replaceable(folder, manifest, files)
        # while files move, the manifest allows each its old and its new content: an interrupted export is redone
        _write_manifest(folder, staging, {name: sorted(manifest.get(name, set()) | ({files[name]} if name in files
                                                                                     else set()))
                                          for name in set(manifest) | set(files)}, mode)
        for name in files:
            os.replace(staging / name, folder / name)
        for name in set(manifest) - set(files):  # the earlier export's, unchanged (checked above)
            (folder / name).unlink(missing_ok=True)
        _write_manifest(folder, staging, files, mode)
        done = True
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # made by this export, holding only what it wrote
        if created and not done:
            with contextlib.suppress(OSError):  # the folder this export made, if still empty
                folder.rmdir()


def export(model, tokenizer, folder, *, source: str | None = None, data: str | None = None,
           train_config: dict | None = None, history: dict | None = None, losses: list[float] | None = None,
           facts: dict | None = None) -> Path:
    """Write `folder` (created): config.json, model.safetensors, generation_config.json, tokenizer.json,
    tokenizer_config.json (chat_template.jinja for a ChatTokenizer), README.md and `MANIFEST`, the files
    with their SHA-256. Returns the folder. Refuses (`ExportError`, naming the option) what `transformers`
    cannot compute exactly, a tokenizer whose vocabulary is larger than the model's, non-finite or unmerged
    LoRA weights, and a folder that is not missing, empty or an earlier export (`check_folder`); in an
    earlier export only its own files, unchanged since, are replaced (or removed if not written again)."""
    folder = check_folder(folder)
    if tokenizer is None:
        raise ExportError("the model has no tokenizer: save the checkpoint with save_checkpoint(..., tokenizer=tok)")
    if tokenizer.vocab_size > model.cfg.vocab_size:
        raise ExportError(f"the tokenizer has {tokenizer.vocab_size} ids, the model only {model.cfg.vocab_size}")
    eos_id = getattr(tokenizer, "end_id", None)  # chapter 11's <|end|> ends a reply
    architecture = hf_architecture(model.cfg)
    hf = hf_model(model, eos_id)
    hf_tok = hf_tokenizer_fast(tokenizer, model.cfg.block_size)
    card = model_card(model, tokenizer, architecture=architecture, source=source, data=data,
                      train_config=train_config, history=history, losses=losses, facts=facts)

    def write(staging: Path) -> None:
        hf.save_pretrained(staging)
        hf_tok.save_pretrained(staging)
        (staging / "README.md").write_text(card, encoding="utf-8")

    _write_folder(folder, write)
    return folder


def _manifest_beside(path: Path) -> dict | None:
    """The manifest NAME.json beside a shipped NAME.pt (course_model's), when its SHA-256 is this file's."""
    info = path.with_suffix(".json")
    try:
        facts = json.loads(info.read_text())
    except (OSError, ValueError):
        return None
    return facts if isinstance(facts, dict) and facts.get("sha256") == file_sha256(path) else None


_PLAYS = "Shakespeare's plays (`transformer_course.data.load_shakespeare()`, about 4.8 million characters)"
_SHAKESPEARE = f"{_PLAYS}, the text `transformer-course train` and chapter 06 train on: 90% trained on, 10% held out."
_CHAT_DATA = (f"Chapter 11's instruction set built from the plays (`assistant.make_tasks(load_shakespeare())`: upper, "
              f"reverse, count, who says), fine-tuning a character-level model trained on {_PLAYS}.")


def read_for_export(path) -> tuple:
    """(model, tokenizer, card facts) of a checkpoint written by `save_checkpoint` (`transformer-course
    train`, chapter 06) or a chat model written by `assistant.save_chat_model` (chapters 11 and 12)."""
    from .checkpoint import CheckpointError, load_checkpoint
    from .course_model import load_chat_model
    from .modern import build_gpt

    path = Path(path)
    try:
        ckpt = load_checkpoint(path, build_gpt)
    except CheckpointError as error:
        if "not a transformer-course checkpoint" not in str(error):
            raise
        chat = load_chat_model(path)
        facts = _manifest_beside(path)
        return chat.model, chat.tokenizer, {"losses": chat.losses, "facts": facts, "data": _CHAT_DATA}
    from .tokenization import CharTokenizer

    history = ckpt.history.to_dict() if ckpt.history else None
    facts = _manifest_beside(path)
    return ckpt.model, ckpt.tokenizer, {
        "history": history, "facts": facts, "train_config": ckpt.train_config.to_dict() if ckpt.train_config else None,
        "data": _SHAKESPEARE if isinstance(ckpt.tokenizer, CharTokenizer) else None}


def export_checkpoint(path, folder, *, data: str | None = None) -> Path:
    """`export` the model in checkpoint file `path` (`read_for_export`) to `folder`, its card filled from
    what the file records (history, recipe, losses; the manifest beside a shipped model). The folder is
    checked (`check_folder`) before the file is read."""
    check_folder(folder)
    model, tokenizer, info = read_for_export(path)
    if data:
        info["data"] = data
    return export(model, tokenizer, folder, source=os.fspath(path), **info)
