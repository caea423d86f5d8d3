"""Continuous batching (chapter 15): every request's tokens are those chapter 07's `generate` gives it alone,
greedy or sampled with its seed, with or without the prefix cache, past the context, and with requests
waiting for blocks; every block is freed at the end."""

import importlib.util

import pytest
import torch

from transformer_course.batching import Engine, Request, static_batch_slots
from transformer_course.course_model import load_chat_model
from transformer_course.generation import generate
from transformer_course.paged_cache import PagedKVCache


@pytest.fixture(scope="module")
def chat():
    return load_chat_model()


def _alone(model, r: Request) -> list[int]:
    out = generate(model, torch.tensor([r.prompt]), r.max_tokens, r.temperature, r.top_k, r.top_p,
                   generator=torch.Generator().manual_seed(r.seed), eos_id=r.eos_id)
    return out[0, len(r.prompt):].tolist()


def _requests(tok, n: int, sampled: bool) -> list[Request]:
    words = ["king", "gentle", "night", "rose", "crown", "moon", "sword", "heart", "death", "love"]
    return [Request(tok.encode(f"<|user|>one word. {['upper', 'reverse'][i % 2]}: {words[i % 10]}<|end|>"
                               "<|assistant|>"), max_tokens=3 + 5 * (i % 4), eos_id=tok.end_id, seed=i,
                    temperature=[0.0, 0.7, 1.0, 1.3][i % 4] if sampled else 0.0,
                    top_p=[None, 0.9][i % 2] if sampled else None, top_k=[None, 5][i % 2] if sampled else None)
            for i in range(n)]


@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("prefix_cache", [False, True])
def test_every_request_gets_its_tokens_alone(chat, sampled, prefix_cache):
    reqs = _requests(chat.tokenizer, 10, sampled)
    engine = Engine(chat.model, PagedKVCache(chat.model, num_blocks=14, block_size=8), max_batch=4,
                    prefix_cache=prefix_cache)  # 14 blocks: some requests wait for blocks
    seqs = engine.run(reqs)
    assert [s.out for s in seqs] == [_alone(chat.model, r) for r in reqs]
    assert engine.cache.pool.used == 0 and all(s.finish in ("stop", "length") for s in seqs)
    assert (engine.prefix is not None and engine.prefix.hits > 0) == prefix_cache


def test_past_the_context_it_crops_as_generate_does(chat):
    tok = chat.tokenizer
    prompt = tok.encode("<|user|>" + "to be or not to be, " * 2 + "<|end|><|assistant|>")
    reqs = [Request(prompt, max_tokens=40), Request(prompt[:10], max_tokens=70, temperature=1.0, seed=3)]
    engine = Engine(chat.model, PagedKVCache(chat.model, num_blocks=16, block_size=16), max_batch=2)
    seqs = engine.run(reqs)
    assert len(prompt) + 40 > chat.model.cfg.block_size
    assert [s.out for s in seqs] == [_alone(chat.model, r) for r in reqs]
    assert engine.cache.pool.used == 0


def test_a_cancelled_sequence_leaves_and_frees_its_blocks(chat):
    reqs = _requests(chat.tokenizer, 3, False)
    engine = Engine(chat.model, PagedKVCache(chat.model, num_blocks=40, block_size=4), max_batch=4)
    seqs = [engine.submit(r) for r in reqs]
    engine.step()
    seqs[2].cancel()  # the longest (13 tokens): 1 made
    engine.step()
    assert seqs[2].finish == "cancelled" and seqs[2] not in engine.running and len(seqs[2].out) == 1
    assert engine.cache.pool.used == len({b for s in engine.running for b in s.table.blocks})  # shared prefix once
    while engine.running:
        engine.step()
    assert engine.cache.pool.used == 0 and [s.out for s in seqs[:2]] == [_alone(chat.model, r) for r in reqs[:2]]


def test_never_sampled_ids_are_never_sampled(chat):
    never = torch.zeros(chat.model.cfg.vocab_size, dtype=torch.bool)
    never[chat.tokenizer.end_id] = True
    r = Request(chat.tokenizer.encode("<|user|>upper: king<|end|><|assistant|>"), max_tokens=12, temperature=1.5)
    engine = Engine(chat.model, PagedKVCache(chat.model, num_blocks=8, block_size=16), never=never)
    seq = engine.run([r])[0]
    assert len(seq.out) == 12 and chat.tokenizer.end_id not in seq.out


def test_bad_requests_are_refused_with_the_fix(chat):
    engine = Engine(chat.model, PagedKVCache(chat.model, num_blocks=2, block_size=8))
    with pytest.raises(ValueError, match="give the KV cache more memory"):
        engine.submit(Request([1] * 20, max_tokens=20))
    with pytest.raises(ValueError, match="temperature"):
        engine.submit(Request([1], max_tokens=2, temperature=-1))
    with pytest.raises(ValueError, match="vocabulary"):
        engine.submit(Request([1000], max_tokens=2))


def test_static_batch_slots_by_hand():
    assert static_batch_slots([2, 5], [3, 1]) == (2 * (5 + 3), 2 + 3 + 5 + 1)
    with pytest.raises(ValueError, match="one answer length per request"):
        static_batch_slots([1, 2], [3])


# ---------------------------------------------------------------- the server runs the engine
serve_missing = [m for m in ("fastapi", "uvicorn", "openai", "httpx") if importlib.util.find_spec(m) is None]
needs_serve = pytest.mark.skipif(bool(serve_missing), reason=f"the `serve` extra is not installed ({serve_missing})")
BACKSTOP = 60.0


class _Server:
    """`transformer-course serve` of the shipped chat model in a thread, its forward passes counted."""

    def __init__(self, chat, **engine):
        import threading

        from transformer_course import serve

        self.calls, self.gate = 0, threading.Event()
        self.gate.set()
        self.hook = chat.model.register_forward_pre_hook(self._count)
        started = threading.Event()
        self.server = serve.server(serve.chat_served(chat, "shakespeare_chat", "the chat model"), started.set,
                                   **engine)
        self.worker = self.server.config.app.state.worker
        sock = serve.listen("127.0.0.1", 0)
        self.url = serve.url(sock)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        assert started.wait(BACKSTOP)

    def _count(self, *_):
        self.calls += 1
        self.gate.wait(BACKSTOP)

    def metrics(self) -> dict[str, float]:
        import httpx

        text = httpx.get(self.url + "/metrics", timeout=BACKSTOP).text
        return {line.split()[0].removeprefix("transformer_course_"): float(line.split()[1])
                for line in text.splitlines() if line and not line.startswith("#")}

    def close(self):
        self.gate.set()
        self.server.should_exit = True
        self.thread.join(BACKSTOP)
        self.hook.remove()


def _poll(condition) -> bool:
    import threading

    for _ in range(int(BACKSTOP * 100)):
        if condition():
            return True
        threading.Event().wait(0.01)
    return condition()


def _expected(chat, messages, max_tokens, temperature, top_p, seed, stop=None) -> tuple[str, str]:
    from transformer_course.assistant import fit_history, render_chat

    tok = chat.tokenizer
    ids = render_chat(fit_history(messages, tok, chat.model.cfg.block_size, max_tokens), tok, True)[0]
    out = generate(chat.model, torch.tensor([ids]), max_tokens, temperature, None, top_p,
                   generator=torch.Generator().manual_seed(seed), eos_id=tok.end_id,
                   allowed=[*range(tok.base.vocab_size), tok.end_id])[0, len(ids):].tolist()
    ended = tok.end_id in out
    text, finish = (tok.decode(out[:out.index(tok.end_id)]), "stop") if ended else (tok.decode(out), "length")
    if stop and stop in text:
        return text[:text.index(stop)], "stop"
    return text, finish


@needs_serve
def test_sixteen_concurrent_requests_each_get_the_reply_it_gets_alone_in_fewer_passes(chat):
    import asyncio

    import openai

    words = ["rose", "king", "night", "crown", "stars", "moon", "sword", "queen"]
    asks = [dict(messages=[{"role": "user", "content": f"{['upper', 'reverse'][i % 2]}: {words[i % 8]}"}],
                 max_tokens=[4, 12, 20][i % 3], temperature=[0.0, 0.8, 1.3, 1.0][i % 4], seed=i,
                 top_p=[1.0, 0.9][i % 2], stop=["o"] if i % 5 == 0 else None) for i in range(16)]
    server = _Server(chat, max_batch=8)
    try:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="-", max_retries=0, timeout=BACKSTOP)

        async def ask(i: int, kw: dict):
            if i % 2:  # streamed
                chunks = [c async for c in await client.chat.completions.create(model="shakespeare_chat", stream=True,
                                                                                 **kw)]
                return ("".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
                        chunks[-1].choices[0].finish_reason)
            reply = await client.chat.completions.create(model="shakespeare_chat", **kw)
            return reply.choices[0].message.content, reply.choices[0].finish_reason

        async def everyone():  # the engine's first forward pass waits until all 16 are in: no race with the CPU
            replies = asyncio.gather(*(ask(i, kw) for i, kw in enumerate(asks)))
            arrived = await asyncio.to_thread(
                _poll, lambda: server.worker.waiting + len(server.worker.engine.running) == len(asks))
            server.gate.set()
            assert arrived, "the 16 requests did not all reach the server"
            return await replies

        server.gate.clear()
        got = asyncio.run(everyone())
        calls, metrics = server.calls, server.metrics()
    finally:
        server.close()
    want = [_expected(chat, kw["messages"], kw["max_tokens"], kw["temperature"],
                      None if kw["top_p"] == 1.0 else kw["top_p"], kw["seed"], (kw["stop"] or [None])[0])
            for kw in asks]
    assert got == want
    assert calls < sum(kw["max_tokens"] for kw in asks) // 2  # decoded together: far fewer passes than tokens
    assert metrics["requests_running"] == metrics["requests_waiting"] == metrics["kv_cache_blocks_used"] == 0
    assert metrics["generated_tokens_total"] > 0 and metrics["kv_cache_blocks_total"] == 512


@needs_serve
def test_a_full_queue_gets_429_with_retry_after_and_a_client_that_leaves_frees_its_blocks(chat):
    import httpx

    server = _Server(chat, max_batch=1, max_waiting=1, kv_cache_mb=0.25)  # 4 blocks: one full context
    body = {"model": "shakespeare_chat", "prompt": "ROMEO:", "max_tokens": 4000, "temperature": 1.0, "stream": True}
    try:
        server.gate.clear()  # the engine stops at its first forward pass until the queue is full
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=BACKSTOP) as first:
            assert _poll(lambda: server.calls == 1)
            with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=BACKSTOP):
                assert _poll(lambda: server.worker.waiting == 1)
                third = httpx.post(server.url + "/v1/completions", json={**body, "stream": False}, timeout=BACKSTOP)
                assert third.status_code == 429 and third.headers["Retry-After"] == "1"
                assert third.json()["error"]["code"] == "rate_limit_exceeded"
                server.gate.set()
                lines = first.iter_lines()
                assert next(lines).startswith("data: ")  # the second client leaves while waiting
            assert next(line for line in lines if line).startswith("data: ")
        assert _poll(lambda: server.metrics()["kv_cache_blocks_used"] == 0), "the blocks were not freed"
        small = httpx.post(server.url + "/v1/completions", json={**body, "stream": False, "max_tokens": 3},
                           timeout=BACKSTOP)
        assert small.status_code == 200 and small.json()["usage"]["completion_tokens"] <= 3
    finally:
        server.close()


@needs_serve
def test_serve_refuses_engine_settings_that_cannot_work(chat, capsys):
    from transformer_course import cli, serve

    served = serve.chat_served(chat, "shakespeare_chat", "the chat model")
    with pytest.raises(ValueError, match="--kv-cache-mb 0.1 cannot hold one full context"):
        serve.check_engine(served, kv_cache_mb=0.1)
    with pytest.raises(ValueError, match="--max-batch must be a whole number"):
        serve.check_engine(served, max_batch=0)
    with pytest.raises(SystemExit) as refused:
        cli.main(["serve", "--max-batch", "0"])
    assert refused.value.code == 2 and "--max-batch" in capsys.readouterr().err
