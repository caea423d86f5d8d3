"""`transformer-course serve` (issue 37): the OpenAI-compatible server, talked to with the real `openai` client.

Most tests share one server of the shipped chat model, uvicorn in a thread of this process (so that hooks on
the model can see how requests run on it); the command itself runs as a subprocess once, to be stopped with
SIGINT. Every answer is compared with chapter 07's `generate` (or chapter 11's `reply_stream`) run here with
the same seed. The browser test of the chat page is tests/browser/chat_page_e2e.py (`make test-browser`).
"""

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

MISSING = [name for name in ("fastapi", "uvicorn", "openai", "httpx") if importlib.util.find_spec(name) is None]
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"the `serve` extra is not installed ({', '.join(MISSING)} "
                                "missing): pip install -e \".[dev]\" (make test does)")

from transformer_course import cli  # noqa: E402
from transformer_course.assistant import fit_history, render_chat, reply_stream  # noqa: E402
from transformer_course.course_model import load_chat_model  # noqa: E402
from transformer_course.generation import generate  # noqa: E402

NAME = "shakespeare_chat"
REVERSE = [{"role": "user", "content": "reverse: stars"}]


class Hooked:
    """The shipped chat model served in a thread, its forward passes counted: how many ran at once at most,
    on which threads, and how many in all."""

    def __init__(self):
        from transformer_course import serve

        self.chat = load_chat_model()
        self.active = self.most = self.calls = 0
        self.threads: set[int] = set()
        self._lock = threading.Lock()
        self.chat.model.register_forward_pre_hook(self._enter)
        self.chat.model.register_forward_hook(self._leave)
        started = threading.Event()
        self.server = serve.server(serve.chat_served(self.chat, NAME, "the shipped chat model"), started.set)
        sock = serve.listen("127.0.0.1", 0)
        self.url = serve.url(sock)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        assert started.wait(30), "the server did not start"

    def _enter(self, *_):
        with self._lock:
            self.active += 1
            self.calls += 1
            self.most = max(self.most, self.active)
            self.threads.add(threading.get_ident())
        time.sleep(0.0005)  # widen the window in which two requests could meet on the model

    def _leave(self, *_):
        with self._lock:
            self.active -= 1

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def hooked():
    served = Hooked()
    yield served
    served.stop()


@pytest.fixture(scope="module")
def client(hooked):
    import openai

    return openai.OpenAI(base_url=hooked.url + "/v1", api_key="not-needed", max_retries=0, timeout=60)


def expected_chat(chat, messages, max_tokens, temperature=0.0, top_p=None, seed=0):
    """The reply `generate` writes for `messages` in chapter 11's format, and its finish reason."""
    tok = chat.tokenizer
    ids = render_chat(fit_history(messages, tok, chat.model.cfg.block_size, max_tokens), tok, True)[0]
    idx = torch.tensor([ids])
    out = generate(chat.model, idx, max_tokens, temperature, None, top_p, generator=torch.Generator().manual_seed(seed),
                   eos_id=tok.end_id, allowed=[*range(tok.base.vocab_size), tok.end_id])[0, idx.size(1):].tolist()
    if tok.end_id in out:
        return tok.decode(out[:out.index(tok.end_id)]), "stop"
    return tok.decode(out), "length"


def expected_completion(chat, prompt, max_tokens, temperature, top_p=None, seed=0):
    tok = chat.tokenizer
    idx = torch.tensor([tok.encode(prompt)])
    out = generate(chat.model, idx, max_tokens, temperature, None, top_p, generator=torch.Generator().manual_seed(seed),
                   eos_id=tok.end_id, allowed=[*range(tok.base.vocab_size), tok.end_id])[0, idx.size(1):].tolist()
    return tok.decode(out[:out.index(tok.end_id)] if tok.end_id in out else out)


def test_models_lists_the_one_model_served(client, hooked):
    (card,) = client.models.list().data
    assert card.id == NAME and card.object == "model"
    assert client.models.retrieve(NAME).id == NAME


def test_chat_plain_and_streamed_equal_generate(client, hooked):
    plain = client.chat.completions.create(model=NAME, messages=REVERSE, temperature=0)
    assert plain.choices[0].message.content == "srats" and plain.choices[0].finish_reason == "stop"
    assert plain.choices[0].message.role == "assistant"
    assert plain.usage.prompt_tokens == len(render_chat(REVERSE, hooked.chat.tokenizer, True)[0])
    assert plain.usage.completion_tokens == 6  # five characters and <|end|>
    # sampled: temperature, top_p and seed reach generate; the conversation is kept in chapter 11's format
    history = [*REVERSE, {"role": "assistant", "content": "srats"}, {"role": "user", "content": "upper: rose"}]
    for temperature, top_p, seed in [(0.9, None, 1), (1.3, 0.9, 7), (1.0, 0.5, 123)]:
        want, finish = expected_chat(hooked.chat, history, 20, temperature, top_p, seed)
        kwargs = dict(model=NAME, messages=history, max_tokens=20, temperature=temperature, seed=seed)
        if top_p is not None:
            kwargs["top_p"] = top_p
        got = client.chat.completions.create(**kwargs)
        assert (got.choices[0].message.content, got.choices[0].finish_reason) == (want, finish)
        chunks = list(client.chat.completions.create(**kwargs, stream=True))
        pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        assert "".join(pieces) == want and all(len(p) == 1 for p in pieces)  # one token (character) per event
        assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices[0].finish_reason == finish
    # chapter 11's reply_stream, which `transformer-course chat` prints, says the same
    mine = "".join(reply_stream(hooked.chat.model, hooked.chat.tokenizer, history, 20, 0.9,
                                generator=torch.Generator().manual_seed(1)))
    assert mine == expected_chat(hooked.chat, history, 20, 0.9, None, 1)[0]


def test_completions_plain_and_streamed_equal_generate(client, hooked):
    prompt = "ROMEO:\nWhat"
    want = expected_completion(hooked.chat, prompt, 30, 1.0, None, 5)
    got = client.completions.create(model=NAME, prompt=prompt, max_tokens=30, temperature=1.0, seed=5)
    assert got.choices[0].text == want and got.usage.completion_tokens <= 30
    streamed = client.completions.create(model=NAME, prompt=prompt, max_tokens=30, temperature=1.0, seed=5,
                                         stream=True, stream_options={"include_usage": True})
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want
    assert chunks[-1].usage.completion_tokens == got.usage.completion_tokens
    # the chat format written by hand is a chat: the same answer, ended by <|end|>
    chat_prompt = "<|user|>reverse: stars<|end|><|assistant|>"
    done = client.completions.create(model=NAME, prompt=chat_prompt, temperature=0, max_tokens=24)
    assert (done.choices[0].text, done.choices[0].finish_reason) == ("srats", "stop")
    # stop strings cut the text before them
    cut = client.completions.create(model=NAME, prompt=chat_prompt, temperature=0, max_tokens=24, stop=["at"])
    assert (cut.choices[0].text, cut.choices[0].finish_reason) == ("sr", "stop")


def test_eight_concurrent_clients_all_answered_one_at_a_time_on_the_model(client, hooked):
    hooked.most, hooked.threads = 0, set()

    def ask(seed: int):
        kwargs = dict(model=NAME, messages=[{"role": "user", "content": "upper: rose"}], max_tokens=12,
                      temperature=1.2, seed=seed)
        if seed % 2:
            chunks = client.chat.completions.create(**kwargs, stream=True)
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return client.chat.completions.create(**kwargs).choices[0].message.content

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(ask, range(8)))
    most, threads = hooked.most, set(hooked.threads)  # before `generate` runs the model here
    want = [expected_chat(hooked.chat, [{"role": "user", "content": "upper: rose"}], 12, 1.2, None, s)[0]
            for s in range(8)]
    assert got == want  # all eight answered, each its own seed's answer
    assert most == 1 and len(threads) == 1  # never two forward passes at once; one model thread


ERROR_KEYS = {"message", "type", "param", "code"}


@pytest.mark.parametrize(("path", "body", "status", "param"), [
    ("/v1/chat/completions", {"model": "gpt-4o", "messages": REVERSE}, 404, "model"),
    ("/v1/completions", {"model": "nobody", "prompt": "a"}, 404, "model"),
    ("/v1/completions", {"model": NAME, "prompt": "a", "max_tokens": -1}, 400, "max_tokens"),
    ("/v1/chat/completions", {"model": NAME, "messages": REVERSE, "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"model": NAME, "prompt": "a" * 65}, 400, "prompt"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "a" * 60}]}, 400, "messages"),
    ("/v1/completions", b'{"model": "shakespeare_chat", "prompt": ', 400, None),
    ("/v1/completions", b"\xff\xfe", 400, None),
    ("/v1/completions", [1, 2], 400, None),
    ("/v1/completions", {"model": NAME, "prompt": "a", "max_tokens": "3"}, 400, "max_tokens"),
    ("/v1/completions", {"model": NAME, "prompt": "a", "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {"model": NAME, "prompt": "a", "temperature": 2.5}, 400, "temperature"),
    ("/v1/completions", {"model": NAME, "prompt": "a", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"model": NAME, "prompt": "a", "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"model": NAME, "prompt": 5}, 400, "prompt"),
    ("/v1/completions", {"model": NAME, "prompt": "a", "seed": 1.5}, 400, "seed"),
    ("/v1/completions", {"model": NAME, "prompt": "a", "n": 2}, 400, "n"),
    ("/v1/completions", {"model": NAME, "prompt": "héllo ☃"}, 400, "prompt"),
    ("/v1/completions", {"model": 3, "prompt": "a"}, 400, "model"),
    ("/v1/chat/completions", {"model": NAME, "messages": "reverse: stars"}, 400, "messages"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "system", "content": "be nice"}]}, 400,
     "messages[0].role"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": 7}]}, 400,
     "messages[0].content"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "a<|end|>"}]}, 400, "messages"),
    ("/v1/nothing", {"model": NAME}, 404, None),
])
def test_bad_requests_get_an_openai_error_and_the_server_keeps_serving(hooked, client, path, body, status, param):
    import httpx

    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    reply = httpx.post(hooked.url + path, content=content, headers={"Content-Type": "application/json"}, timeout=30)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == ERROR_KEYS and isinstance(error["message"], str) and error["message"]
    assert error["param"] == param and isinstance(error["type"], str)
    again = client.chat.completions.create(model=NAME, messages=REVERSE, temperature=0)
    assert again.choices[0].message.content == "srats"


def test_the_openai_client_raises_its_own_errors(client):
    import openai

    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4o", messages=REVERSE)
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as long:
        client.completions.create(model=NAME, prompt="x" * 100)
    assert long.value.code == "context_length_exceeded" and "64" in long.value.message


def test_a_client_that_goes_away_ends_its_generation(hooked, client):
    import httpx

    before = hooked.calls
    body = {"model": NAME, "prompt": "ROMEO:", "max_tokens": 4000, "temperature": 1.0, "seed": 0, "stream": True}
    with httpx.stream("POST", hooked.url + "/v1/completions", json=body, timeout=30) as reply:
        first = next(reply.iter_lines())
        assert first.startswith("data: ")
    answer = client.chat.completions.create(model=NAME, messages=REVERSE, temperature=0)  # waits its turn
    assert answer.choices[0].message.content == "srats"
    assert hooked.calls - before < 2000, "the abandoned generation ran on"


def test_the_chat_page_is_one_offline_file(hooked):
    import httpx

    page = httpx.get(hooked.url + "/", timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "/v1/chat/completions" in page.text and "getReader" in page.text and "AbortController" in page.text
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page.text), "the page loads something remote"
    assert not re.search(r"@import|url\(", page.text)


def test_a_text_checkpoint_serves_completions_only():
    from fastapi.testclient import TestClient

    from transformer_course import serve
    from transformer_course.course_model import ASSETS, load_course_model

    served = serve.load_served(ASSETS / "shakespeare_char.pt")
    assert not served.chat and served.name == "shakespeare_char"
    ckpt = load_course_model()
    idx = torch.tensor([ckpt.tokenizer.encode("JULIET:")])
    want = ckpt.tokenizer.decode(generate(ckpt.model, idx, 40, 0.8, None, 0.95, generator=torch.Generator()
                                          .manual_seed(9), allowed=ckpt.tokenizer)[0, idx.size(1):].tolist())
    with TestClient(serve.create_app(served)) as http:
        got = http.post("/v1/completions", json={"model": "shakespeare_char", "prompt": "JULIET:", "max_tokens": 40,
                                                 "temperature": 0.8, "top_p": 0.95, "seed": 9}).json()
        assert got["choices"][0]["text"] == want and got["choices"][0]["finish_reason"] == "length"
        chat = http.post("/v1/chat/completions", json={"model": "shakespeare_char", "messages": REVERSE})
        assert chat.status_code == 400 and chat.json()["error"]["code"] == "model_not_chat"


def test_serve_refuses_checkpoint_with_model_and_names_the_missing_extra(monkeypatch, capsys):
    from transformer_course import serve

    with pytest.raises(SystemExit, match="not both"):
        cli.main(["serve", "--checkpoint", "x.pt", "--model", "dpo"])
    monkeypatch.setattr(serve, "missing_extra", lambda: ["uvicorn"])
    assert cli.main(["serve"]) == 2
    assert "serve extra" in capsys.readouterr().err.replace("`", "")


@pytest.mark.system
def test_the_command_serves_a_shipped_model_and_ctrl_c_stops_it_with_one_line():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, "-m", "transformer_course.cli", "serve", "--model", "dpo", "--port",
                                "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        first = process.stdout.readline()
        found = re.search(r"at (http://127\.0\.0\.1:\d+)/", first)
        assert found, (first, process.stderr.read() if process.poll() is not None else "")
        import openai

        client = openai.OpenAI(base_url=found.group(1) + "/v1", api_key="-", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == ["shakespeare_dpo"]
        got = client.chat.completions.create(model="shakespeare_dpo", messages=REVERSE, temperature=0)
        dpo = load_chat_model(shipped="shakespeare_dpo")
        assert got.choices[0].message.content == "".join(reply_stream(dpo.model, dpo.tokenizer, REVERSE, 24))
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode in (0, 130), (process.returncode, out, err)
    assert out.splitlines() == ["transformer-course serve: stopped"] and err == "", (out, err)
