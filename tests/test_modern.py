"""transformer_course.modern and .llama (chapter 10): RMSNorm, SwiGLU, RoPE, grouped-query attention,
the modern GPT built from GPTConfig, and the Hugging Face Llama loader."""

from pathlib import Path

import pytest
import torch
from torch import nn

from transformer_course.generation import generate
from transformer_course.model import GPT, GPTConfig, count_parameters
from transformer_course.modern import (
    RMSNorm,
    RotaryEmbedding,
    SwiGLU,
    build_gpt,
    kv_cache_bytes,
    rope_frequencies,
    rotate_halves,
    rotate_pairs,
    share_kv_heads,
    swiglu_hidden,
)
from transformer_course.multihead import KVCache, MultiHeadAttention, split_heads

LLAMA = dict(bias=False, positional="rope", normalization="rmsnorm", mlp="swiglu", eps=1e-6)


# ---------------------------------------------------------------- RMSNorm


def test_rms_norm_matches_torch():
    torch.manual_seed(0)
    ours, theirs = RMSNorm(48, eps=1e-6), nn.RMSNorm(48, eps=1e-6)
    with torch.no_grad():
        ours.weight.normal_(1.0, 0.2)
        theirs.weight.copy_(ours.weight)
    x = 5 * torch.randn(3, 7, 48) - 2
    assert (ours(x) - theirs(x)).abs().max() < 1e-6


def test_rms_norm_hand_worked():
    # mean of squares (1 + 49 + 1 + 49) / 4 = 25, rms 5
    got = RMSNorm(4)(torch.tensor([1.0, 7.0, 1.0, 7.0]))
    assert torch.allclose(got, torch.tensor([0.2, 1.4, 0.2, 1.4]), atol=1e-6)


def test_rms_norm_bf16_input_computes_in_float32():
    x = torch.randn(4, 64) * 100
    got = RMSNorm(64)(x.bfloat16())
    want = RMSNorm(64)(x.bfloat16().float()).bfloat16()
    assert torch.equal(got.bfloat16(), want)


# ---------------------------------------------------------------- SwiGLU


@pytest.mark.parametrize("C, H", [(96, 256), (128, 344), (768, 2048), (4096, 10928)])
def test_swiglu_hidden_rule(C, H):
    assert swiglu_hidden(C) == H
    assert H % 8 == 0 and H >= 8 * C // 3


def test_swiglu_hidden_with_llama_rounding():
    assert swiglu_hidden(4096, multiple_of=256) == 11008  # Llama 7B's intermediate_size


def test_swiglu_parameters_equal_a_4c_mlp_when_exact():
    C = 96
    assert sum(p.numel() for p in SwiGLU(C).parameters()) == 2 * C * 4 * C


def test_swiglu_against_written_formula():
    torch.manual_seed(1)
    mlp = SwiGLU(16, d_ff=40)
    x = torch.randn(2, 3, 16)
    z = x @ mlp.gate.weight.T
    want = (z / (1 + torch.exp(-z)) * (x @ mlp.up.weight.T)) @ mlp.proj.weight.T
    assert (mlp(x) - want).abs().max() < 1e-6


# ---------------------------------------------------------------- RoPE


def test_frequencies_hand_worked():
    # hs 4: pairs 0 and 1 turn by 10000^0 = 1 and 10000^(-2/4) = 0.01 rad per position
    assert torch.allclose(rope_frequencies(4), torch.tensor([1.0, 0.01]), rtol=1e-6)


def test_rotation_hand_worked():
    # hs 2, one pair (a, b) = (1, 0) turned by 90 degrees -> (0, 1)
    x = torch.tensor([[1.0, 0.0]])
    got = rotate_halves(x, torch.tensor([[0.0]]), torch.tensor([[1.0]]))
    assert torch.allclose(got, torch.tensor([[0.0, 1.0]]))


@pytest.mark.parametrize("hs", [2, 6, 16, 64])
@pytest.mark.parametrize("convention", ["halves", "pairs"])
def test_score_depends_only_on_distance(hs, convention):
    torch.manual_seed(hs)
    P = 40
    rope = RotaryEmbedding(hs, P, convention=convention)
    q, k = torch.randn(hs), torch.randn(hs)
    scores = rope(q.expand(P, -1)) @ rope(k.expand(P, -1)).T  # (P, P)
    for d in range(-P + 1, P):
        diag = scores.diagonal(d)
        assert (diag - diag[0]).abs().max() < 1e-4


@pytest.mark.parametrize("hs", [1, 3, 7, 63])
def test_odd_head_size_refused(hs):
    with pytest.raises(ValueError, match="head size must be even"):
        RotaryEmbedding(hs, 8)
    with pytest.raises(ValueError, match="d_model // n_head is even"):
        GPTConfig(65, 16, 1, n_head=2, d_model=2 * hs, positional="rope")


def test_pairs_convention_is_complex_multiplication():
    # the RoPE paper / Meta's Llama: x viewed as hs/2 complex numbers, times e^{i p θ}
    torch.manual_seed(2)
    hs, T = 8, 10
    rope = RotaryEmbedding(hs, T, convention="pairs")
    x = torch.randn(2, T, hs)
    angles = torch.outer(torch.arange(T).float(), rope_frequencies(hs))
    z = torch.view_as_complex(x.reshape(2, T, hs // 2, 2).contiguous()) * torch.polar(torch.ones_like(angles), angles)
    assert torch.allclose(rope(x), torch.view_as_real(z).flatten(-2), atol=1e-6)
    assert torch.allclose(rotate_pairs(x, rope.cos, rope.sin), rope(x))


def test_halves_match_hugging_face():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, rotate_half

    torch.manual_seed(3)
    rope = RotaryEmbedding(16, 12)
    q, k = torch.randn(1, 3, 12, 16), torch.randn(1, 3, 12, 16)
    cos, sin = rope.cos.repeat(1, 2)[None], rope.sin.repeat(1, 2)[None]
    hf_q, hf_k = apply_rotary_pos_emb(q, k, cos, sin)
    assert torch.allclose(rope(q), hf_q, atol=1e-6) and torch.allclose(rope(k), hf_k, atol=1e-6)
    assert torch.equal(rotate_half(q), torch.cat([-q[..., 8:], q[..., :8]], dim=-1))


def test_tables_are_buffers_made_once():
    model = build_gpt(GPTConfig(65, 32, 3, 4, 32, **LLAMA))
    ropes = {id(b.attn.rope) for b in model.blocks}
    assert len(ropes) == 1  # one table per model
    assert not any("cos" in k or "sin" in k for k in model.state_dict())  # not saved
    rope = model.blocks[0].attn.rope
    before = rope.cos.data_ptr()
    model(torch.zeros(1, 8, dtype=torch.long))
    assert rope.cos.data_ptr() == before


def test_rope_refuses_positions_past_its_table():
    with pytest.raises(ValueError, match="past the table"):
        RotaryEmbedding(8, 16)(torch.zeros(1, 3, 8), start=14)


# ---------------------------------------------------------------- grouped-query attention


def test_share_kv_heads_groups_consecutive_heads():
    kv = torch.arange(2.0).view(1, 2, 1, 1)
    assert share_kv_heads(kv, 6).flatten().tolist() == [0, 0, 0, 1, 1, 1]


def gqa(n_kv_head, **options):
    return MultiHeadAttention(32, 4, bias=False, n_kv_head=n_kv_head, **options)


def test_gqa_equals_mha_with_shared_weights_copied():
    # 2 key/value heads == 4 heads whose key/value heads are copies within each group
    torch.manual_seed(5)
    shared, full = gqa(2), gqa(None)
    hs = 8
    with torch.no_grad():
        q, k, v = shared.qkv.weight.split([32, 16, 16])

        def copies(w):
            return w.view(2, hs, 32).repeat_interleave(2, dim=0).reshape(32, 32)
        full.qkv.weight.copy_(torch.cat([q, copies(k), copies(v)]))
        full.proj.weight.copy_(shared.proj.weight)
    x = torch.randn(2, 6, 32)
    assert (shared(x) - full(x)).abs().max() < 1e-6


def test_packed_projection_keeps_gpt2_layout_at_full_heads():
    assert gqa(None).qkv.weight.shape == gqa(4).qkv.weight.shape == (96, 32)
    assert gqa(2).qkv.weight.shape == (64, 32) and gqa(1).qkv.weight.shape == (48, 32)


@pytest.mark.parametrize("n_kv", [1, 2, 4])
@pytest.mark.parametrize("rope", [False, True])
def test_fused_equals_teaching(n_kv, rope):
    torch.manual_seed(6)
    table = RotaryEmbedding(8, 16) if rope else None
    fast = gqa(n_kv, rope=table)
    slow = gqa(n_kv, rope=table, fast=False)
    slow.load_state_dict(fast.state_dict())
    x = torch.randn(2, 9, 32)
    assert (fast(x) - slow(x)).abs().max() < 1e-6
    caches = KVCache(), KVCache()
    fast(x[:, :4], cache=caches[0]), slow(x[:, :4], cache=caches[1])
    a, b = fast(x[:, 4:], cache=caches[0]), slow(x[:, 4:], cache=caches[1])  # T > 1 with a cached past
    assert (a - b).abs().max() < 1e-6
    assert slow.last_weights.shape == (2, 4, 5, 9)


def test_fused_path_makes_no_copy_per_head(monkeypatch):
    monkeypatch.setattr(torch.Tensor, "repeat_interleave",
                        lambda *a, **k: pytest.fail("the fused path copied key/value heads"))
    gqa(2)(torch.randn(1, 5, 32))


@pytest.mark.parametrize("fast", [True, False])
def test_cache_equals_recompute_and_holds_rotated_keys(fast):
    torch.manual_seed(7)
    rope = RotaryEmbedding(8, 16)
    attn = gqa(2, rope=rope, fast=fast)
    x = torch.randn(2, 10, 32)
    cache = KVCache()
    steps = torch.cat([attn(x[:, :3], cache=cache)] + [attn(x[:, t:t + 1], cache=cache) for t in range(3, 10)], dim=1)
    assert (steps - attn(x)).abs().max() < 1e-5
    keys = attn.qkv(x)[..., 32:48]  # the packed projection's key channels
    assert torch.allclose(cache.k, rope(split_heads(keys, 2)), atol=1e-6)


def test_kv_cache_bytes_formula_and_measured():
    assert kv_cache_bytes(2, 2, 16, 10) == 5120  # 2 (k, v) · 2 layers · 1 · 2 heads · 10 positions · 16 · 4 bytes
    for n_kv in (8, 2, 1):
        model = build_gpt(GPTConfig(65, 32, 3, 8, 64, n_kv_head=n_kv, **LLAMA)).eval()
        cache = model.new_cache()
        with torch.no_grad():
            model(torch.zeros(2, 20, dtype=torch.long), cache=cache)
        assert sum(c.nbytes for c in cache) == kv_cache_bytes(3, n_kv, 8, 20, batch=2)


# ---------------------------------------------------------------- the modern GPT


def test_defaults_keep_gpt2():
    cfg = GPTConfig(65, 16, 2, 2, 32)
    assert not cfg.modern
    assert type(GPT(cfg).blocks[0]).__name__ == "TransformerBlock"
    torch.manual_seed(0)
    a = GPT(cfg)
    torch.manual_seed(0)
    b = GPT(GPTConfig.from_dict({k: v for k, v in cfg.to_dict().items() if k in
                                 ("vocab_size", "block_size", "n_layer", "n_head", "d_model")}))
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


@pytest.mark.parametrize("change", [
    dict(normalization="rmsnorm"), dict(mlp="swiglu"), dict(positional="rope"), dict(n_kv_head=2),
    dict(n_kv_head=1, bias=True), dict(LLAMA, n_kv_head=2, d_ff=50, tie_weights=False),
    dict(mlp="swiglu", bias=True, positional="sinusoidal"),
])
def test_parameter_count_matches_module(change):
    cfg = GPTConfig(65, 16, 2, 4, 32, **change)
    assert cfg.modern
    assert build_gpt(cfg).num_parameters() == count_parameters(cfg)


@pytest.mark.parametrize("fast", [True, False])
def test_llama_style_generate_cache_equals_recompute(fast):
    torch.manual_seed(8)
    model = build_gpt(GPTConfig(65, 32, 2, 4, 32, n_kv_head=2, fast=fast, **LLAMA)).eval()
    prompt = torch.randint(0, 65, (2, 5))
    out = generate(model, prompt, 20, temperature=0)
    assert torch.equal(out, generate(model, prompt, 20, temperature=0, use_cache=False))
    cache = model.new_cache()
    with torch.no_grad():
        model(out[:, :10], cache=cache)
        step, _ = model(out[:, 10:], cache=cache)
        full, _ = model(out)
    assert (step - full[:, 10:]).abs().max() < 1e-5


def test_llama_style_trains():
    torch.manual_seed(9)
    model = build_gpt(GPTConfig(65, 16, 2, 4, 32, n_kv_head=2, **LLAMA))
    idx = torch.randint(0, 65, (4, 16))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):  # memorise one batch
        _, loss = model(idx, targets=idx)
        optimizer.zero_grad()
        loss.backward()
        assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters())
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("change, message", [
    (dict(n_head=6, d_model=48, n_kv_head=4), "not divisible by n_kv_head=4"),
    (dict(n_kv_head=0), "n_kv_head must be a whole number >= 1"),
    (dict(norm="post", normalization="rmsnorm"), "pre-norm"),
    (dict(rope_base=500.0), "only matters with positional='rope'"),
    (dict(normalization="rms"), "normalization must be one of"),
    (dict(mlp="geglu"), "mlp must be one of"),
    (dict(d_ff=0, mlp="swiglu"), "d_ff must be a whole number"),
])
def test_bad_configs(change, message):
    base = dict(vocab_size=65, block_size=16, n_layer=1, n_head=4, d_model=32)
    with pytest.raises(ValueError, match=message):
        GPTConfig(**{**base, **change})


def test_bad_inputs():
    with pytest.raises(ValueError, match="choose n_kv_head among"):
        gqa(3)
    with pytest.raises(ValueError, match="share_kv_heads needs"):
        share_kv_heads(torch.zeros(1, 3, 2, 4), 4)
    with pytest.raises(ValueError, match=r"uses chapter 10's parts .*modern\.build_gpt"):
        GPT(GPTConfig(65, 16, 1, 4, 32, **LLAMA))


# ---------------------------------------------------------------- the Hugging Face Llama loader


@pytest.fixture(scope="module")
def stand_in():
    from transformer_course.llama import make_llama_stand_in

    return make_llama_stand_in()


def test_llama_parity(stand_in):
    from transformer_course.llama import load_hf_llama
    from transformer_course.pretrained import block_outputs

    ours = load_hf_llama(stand_in)
    idx = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(10))
    with torch.no_grad():
        theirs = stand_in(idx, output_hidden_states=True)
        stream = block_outputs(ours, idx)
        stream[-1] = ours.ln_f(stream[-1])  # HF's last hidden state is after the final norm
        logits, _ = ours(idx)
    assert len(stream) == len(theirs.hidden_states) == 3
    for a, b in zip(stream, theirs.hidden_states, strict=True):
        assert (a - b).abs().max() < 1e-5
    assert (logits - theirs.logits).abs().max() < 1e-5
    prompt = idx[:, :4]
    with torch.no_grad():
        reference = stand_in.generate(prompt, max_new_tokens=16, do_sample=False,
                                      attention_mask=torch.ones_like(prompt))
    assert torch.equal(generate(ours, prompt, 16, temperature=0), reference)


def test_llama_from_folder_and_tied(tmp_path):
    from transformer_course.llama import load_hf_llama, make_llama_stand_in

    hf = make_llama_stand_in(n_kv_head=1, tie_word_embeddings=True, seed=1)
    assert hf.lm_head.weight is hf.model.embed_tokens.weight
    hf.save_pretrained(tmp_path)
    ours = load_hf_llama(tmp_path)
    assert ours.cfg.tie_weights and ours.cfg.n_kv_head == 1
    idx = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        assert (ours(idx)[0] - hf(idx).logits).abs().max() < 1e-5


@pytest.mark.parametrize("change, message", [
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0}}, "rope scaling 'llama3'"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope scaling 'linear'"),
    ({"attention_bias": True}, "attention_bias=True"),
    ({"mlp_bias": True}, "mlp_bias=True"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"head_dim": 32}, "head_dim=32"),
    ({"model_type": "mistral", "architectures": ["MistralForCausalLM"]}, "model_type='mistral'"),
    ({"architectures": ["LlamaForSequenceClassification"]}, "LlamaForSequenceClassification"),
])
def test_llama_config_refusals(stand_in, change, message):
    from transformer_course.llama import config_from_llama

    with pytest.raises(ValueError, match=message):
        config_from_llama({**stand_in.config.to_dict(), **change})


def test_llama_state_dict_errors(stand_in):
    from transformer_course.llama import config_from_llama, convert_llama_state_dict

    cfg = config_from_llama(stand_in.config.to_dict())
    state = dict(stand_in.state_dict())
    with pytest.raises(ValueError, match="unexpected tensor 'model.layers.0.self_attn.q_proj.bias'"):
        convert_llama_state_dict({**state, "model.layers.0.self_attn.q_proj.bias": torch.zeros(64)}, cfg)
    del state["lm_head.weight"]
    with pytest.raises(ValueError, match="tie_word_embeddings=False needs lm_head.weight"):
        convert_llama_state_dict(state, cfg)
    tied = config_from_llama({**stand_in.config.to_dict(), "tie_word_embeddings": True})
    with pytest.raises(ValueError, match="lm_head.weight differs from embed_tokens.weight"):
        convert_llama_state_dict(stand_in.state_dict(), tied)
    no_embedding = {k: v for k, v in stand_in.state_dict().items() if k != "model.embed_tokens.weight"}
    with pytest.raises(ValueError, match=r"missing tensors .*embed.token.weight.* \(tie_word_embeddings=True takes "
                                         r"the output layer from model.embed_tokens.weight\)"):
        convert_llama_state_dict(no_embedding, tied)  # was a raw TypeError (torch.equal with None)


def test_the_configs_swiglu_width_is_chapter_10s_rule():
    """GPTConfig.hidden_width (chapter 06, which may not import chapter 10) restates swiglu_hidden's rule."""
    for C in (8, 30, 64, 96, 100, 128, 768, 4096):
        cfg = GPTConfig(65, 16, 1, 2, C, mlp="swiglu")
        assert cfg.hidden_width == swiglu_hidden(C) == SwiGLU(C).d_ff
    assert GPTConfig(65, 16, 1, 2, 32, mlp="swiglu", d_ff=50).hidden_width == 50
    assert GPTConfig(65, 16, 1, 2, 32).hidden_width == 128


def test_chapter_10s_later_sections_run_on_the_learners_parts():
    """The stored notebook (which strict nbval proves is what the code produces) builds the Llama-parity
    model with section 5's build_gpt, so the notebook's RMSNorm and RotaryEmbedding (the learner's, once
    their checks pass) run in it: counted by forward hooks during one forward pass and a generation."""
    import nbformat

    nb = nbformat.read(Path(__file__).resolve().parents[1] / "chapters" / "10_modern_decoder.ipynb", as_version=4)
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith("calls = {")]
    text = "".join(o.get("text", "") for o in cell.outputs)
    assert "the model's norms are this notebook's RMSNorm (yours if 10.1 passed): True" in text
    assert "its rotation is this notebook's (your rotate_halves if 10.3 passed): True" in text
    assert "calls in one forward pass and a 4-token generation: {'RMSNorm': 25, 'RotaryEmbedding': 20}" in text
    checks = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    for exercise in ("10.1 (RMSNorm)", "10.3 (rotate_halves)", "10.5 (modern_parts)"):
        assert f"✅ Exercise {exercise}: passed - the rest of the chapter uses yours" in checks


def test_the_llama_loader_builds_through_the_modern_module_so_a_replaced_part_is_used(monkeypatch):
    """What the notebook relies on: load_hf_llama calls modern.build_gpt, which looks its parts up by
    name, so a replaced RMSNorm (the learner's, in the notebook) is the one that runs."""
    from transformer_course import llama, modern

    calls = []

    class CountingRMSNorm(modern.RMSNorm):
        def forward(self, x):
            calls.append(1)
            return super().forward(x)

    monkeypatch.setattr(modern, "RMSNorm", CountingRMSNorm)
    hf = llama.make_llama_stand_in()
    ours = llama.load_hf_llama(hf)
    with torch.no_grad():
        ours(torch.zeros(1, 3, dtype=torch.long))
    assert isinstance(ours.ln_f, CountingRMSNorm) and len(calls) == 2 * ours.cfg.n_layer + 1
