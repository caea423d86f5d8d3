"""`transformer-course serve` against requests that would stall or crash it (issue 55, "The server").

Each test reproduces one finding of the issue: a long chat history that blocked every client (fitted in one
pass now, off the event loop), abandoned plain requests that ran to their end, bodies of any size read
whole, and the 400s that were 500s, silences or wrong words. Nothing here is timed: where a test needs to
know that something is under way (a generation, a prompt being prepared), a hook on the model or the
tokenizer says so, and a timeout is only the backstop of a failure. Servers run in a thread of this process
on 127.0.0.1, but for the `system` test of the command.
"""

import importlib.util
import json
import logging
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

MISSING = [name for name in ("fastapi", "uvicorn", "openai", "httpx") if importlib.util.find_spec(name) is None]
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"the `serve` extra is not installed ({', '.join(MISSING)} "
                                "missing): pip install -e \".[dev]\" (make test does)")

from transformer_course import cli, serve  # noqa: E402
from transformer_course.assistant import fit_history, render_chat  # noqa: E402
from transformer_course.course_model import ASSETS, load_chat_model  # noqa: E402

NAME = "shakespeare_chat"
TEXT = "shakespeare_char"  # the text checkpoint: no end token, so a generation runs to max_tokens
REVERSE = [{"role": "user", "content": "reverse: stars"}]
BACKSTOP = 60  # seconds: only a failing test waits this long


@pytest.fixture(scope="module")
def chat():
    return load_chat_model()


def chat_with(chat, tokenizer, name=NAME) -> serve.Served:
    """The shipped chat model served with `tokenizer` (a wrapper of its own) in place of its tokenizer."""
    return serve.chat_served(SimpleNamespace(model=chat.model, tokenizer=tokenizer), name, "the shipped chat model")


class Running:
    """A uvicorn server of `served` in a thread, listening on 127.0.0.1 (a free port); `guard`: with the Host
    guard that `serve.run` puts in front on a loopback address."""

    def __init__(self, served: serve.Served, guard: bool = False, **options):
        started = threading.Event()
        sock = serve.listen("127.0.0.1", 0)
        if guard:
            options["bound"] = sock.getsockname()[:2]
        self.server = serve.server(served, started.set, **options)
        self.worker = self.server.config.app.state.worker
        self.url, self.port = serve.url(sock), sock.getsockname()[1]
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        assert started.wait(BACKSTOP), "the server did not start"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(BACKSTOP)


@contextmanager
def running(served: serve.Served, **options):
    server = Running(served, **options)
    try:
        yield server
    finally:
        server.stop()


def post(url: str, path: str, body, timeout=BACKSTOP, **headers):
    import httpx

    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(url + path, content=content, headers={"Content-Type": "application/json", **headers},
                      timeout=timeout)


def raw_request(port: int, path: str, body: bytes) -> socket.socket:
    """A socket that has sent a plain POST of `body` to 127.0.0.1:port and reads nothing yet."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=BACKSTOP)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def read_reply(sock: socket.socket) -> tuple[int, bytes]:
    """The status and the text the server sent on `sock` until it closed the connection (or the backstop)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
            head, _, rest = data.partition(b"\r\n\r\n")
            length = re.search(rb"content-length: (\d+)", head, re.IGNORECASE)
            if length and len(rest) >= int(length.group(1)):
                break
    except TimeoutError:
        pass
    found = re.match(rb"HTTP/1\.1 (\d{3}) ", data)
    return (int(found.group(1)) if found else 0), data


# ---------------------------------------------------------------- 1. one request stalls every client
class Counting:
    """A tokenizer that counts the calls of its `encode`."""

    def __init__(self, tok):
        self.tok, self.calls = tok, 0

    def __getattr__(self, name):
        return getattr(self.tok, name)

    def encode(self, text):
        self.calls += 1
        return self.tok.encode(text)


def history(n: int) -> list[dict]:
    return [{"role": ("user", "assistant")[i % 2], "content": f"line {i}"} for i in range(n)] + REVERSE


def test_a_long_history_is_fitted_encoding_about_one_context_of_it(chat):
    """fit_history rendered the whole history again for each message it dropped (quadratic: 4,001 messages
    took 12 s, 50,000 over 10 minutes); the server now walks back from the newest message, each encoded once,
    only as far as the context allows."""
    tok, block = chat.tokenizer, chat.model.cfg.block_size
    messages = history(400)
    counting = Counting(tok)
    ids = serve.chat_ids(chat_with(chat, counting), {"messages": messages}, 24)
    assert ids == render_chat(fit_history(messages, tok, block, 24), tok, True)[0]
    # every message is at least 2 positions (role, end): at most block / 2 of them encoded to fit, and the ones
    # kept encoded again to render them
    assert counting.calls <= block, f"{counting.calls} encodings for a context of {block} tokens"


def test_fit_messages_keeps_what_fit_history_keeps(chat):
    tok, block = chat.tokenizer, chat.model.cfg.block_size
    rng = random.Random(0)

    def fitted(fit, messages, room):
        try:
            return fit(messages, tok, block, room)
        except ValueError:
            return "refused"

    for _ in range(400):
        messages = [{"role": rng.choice(("user", "assistant")), "content": "ab c"[:rng.randint(0, 4)] * rng.randint(
            0, 8)} for _ in range(rng.randint(1, 12))]
        room = rng.randint(1, 70)
        assert fitted(serve.fit_messages, messages, room) == fitted(fit_history, messages, room), (messages, room)


class Gated(Counting):
    """A tokenizer whose `encode` waits at `gate` once armed, having set `entered`: a prompt being prepared."""

    def __init__(self, tok):
        super().__init__(tok)
        self.entered, self.gate, self.armed = threading.Event(), threading.Event(), False

    def encode(self, text):
        if self.armed:
            self.entered.set()
            self.gate.wait(BACKSTOP)
        return super().encode(text)


def test_models_answers_while_a_request_is_being_prepared(chat):
    """The prompt is read, checked and fitted in a worker thread: the event loop answers others meanwhile."""
    import httpx

    gated = Gated(chat.tokenizer)
    with running(chat_with(chat, gated)) as server:
        result = {}
        gated.armed = True
        asking = threading.Thread(target=lambda: result.update(reply=post(
            server.url, "/v1/chat/completions", {"model": NAME, "messages": REVERSE, "temperature": 0})))
        asking.start()
        try:
            assert gated.entered.wait(BACKSTOP), "the chat request never reached the tokenizer"
            models = httpx.get(server.url + "/v1/models", timeout=BACKSTOP / 2)  # the chat request is held at the gate
            assert models.status_code == 200 and models.json()["data"][0]["id"] == NAME
            assert not gated.gate.is_set()
        finally:
            gated.gate.set()
            asking.join(BACKSTOP)
        assert result["reply"].json()["choices"][0]["message"]["content"] == "srats"


def test_a_chat_of_50000_messages_is_answered_from_its_latest(chat):
    counting = Counting(chat.tokenizer)
    messages = history(50_000)
    with running(chat_with(chat, counting)) as server:
        reply = post(server.url, "/v1/chat/completions", {"model": NAME, "messages": messages, "temperature": 0})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] == "srats"
    assert counting.calls <= chat.model.cfg.block_size


# ---------------------------------------------------------------- 2. abandoned requests ran to their end
def test_abandoned_plain_requests_stop_generating():
    """Two plain requests of 4,096 tokens, one generating and one waiting its turn, whose clients go away: the
    first ends at its next token, the second never starts, and the next request is answered at once."""
    served = serve.load_served(ASSETS / f"{TEXT}.pt")
    calls, started, gate = [0], threading.Event(), threading.Event()

    def forward(*_):
        calls[0] += 1
        if calls[0] == 1:
            started.set()
        elif calls[0] == 2:
            gate.wait(BACKSTOP)  # the first generation's second token waits until both clients are gone

    served.model.register_forward_pre_hook(forward)
    body = json.dumps({"model": TEXT, "prompt": "ROMEO:", "max_tokens": 4096, "temperature": 1.0}).encode()
    with running(served) as server:
        first = raw_request(server.port, "/v1/completions", body)
        assert started.wait(BACKSTOP), "the first request did not start generating"
        second = raw_request(server.port, "/v1/completions", body)
        try:
            assert poll(lambda: len(server.worker._cancels) == 2), "the second request never waited its turn"
            first.close()
            second.close()
            assert poll(lambda: all(c.is_set() for c in list(server.worker._cancels))), \
                "the server did not notice that the clients went away"
        finally:
            gate.set()
        before = calls[0]
        nxt = post(server.url, "/v1/completions", {"model": TEXT, "prompt": "a", "max_tokens": 4})
        assert nxt.status_code == 200 and nxt.json()["usage"]["completion_tokens"] == 4
    assert before <= 2, f"the abandoned generations ran {before} forward passes"
    assert calls[0] - before <= 5, f"{calls[0] - before} forward passes for the next request of 4 tokens"


def poll(condition, backstop: float = BACKSTOP) -> bool:
    """Whether `condition()` came true before the backstop (checked every 10 ms: the order of events decides,
    the clock only ends a failing wait)."""
    done = threading.Event()
    for _ in range(int(backstop * 100)):
        if condition():
            return True
        done.wait(0.01)
    return condition()


# ---------------------------------------------------------------- 3. no request-body limit
def test_a_body_announced_over_the_limit_is_refused_before_it_is_read(chat):
    with running(chat_with(chat, chat.tokenizer)) as server:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=BACKSTOP)
        with sock:  # 200 MB announced, none of it sent: the answer cannot wait for the body
            sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                         "Content-Type: application/json\r\nContent-Length: 200000000\r\n\r\n".encode())
            status, reply = read_reply(sock)
        assert status == 413, reply[:300]
        error = json.loads(reply.partition(b"\r\n\r\n")[2])["error"]
        assert error["code"] == "request_too_large" and "200,000,000" in error["message"]
        assert "--max-body-mb" in error["message"]
        assert post(server.url, "/v1/chat/completions", {"model": NAME, "messages": REVERSE}).status_code == 200


def test_a_chunked_body_is_refused_once_over_the_limit(chat):
    limit = 4000
    small = json.dumps({"model": NAME, "messages": REVERSE, "temperature": 0}).encode()
    with running(chat_with(chat, chat.tokenizer), max_body=limit) as server:
        under = small + b" " * (limit - len(small))
        assert post(server.url, "/v1/chat/completions", under).status_code == 200
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=BACKSTOP)
        with sock:  # no Content-Length: the body comes in chunks, 6,000 bytes in all
            chunks = b"".join(b"%x\r\n%s\r\n" % (1000, (small + b" " * 1000)[:1000]) for _ in range(6))
            sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                         "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode() + chunks)
            status, reply = read_reply(sock)
        assert status == 413, reply[:300]
        assert b"at most 4,000" in reply


def test_max_body_mb_is_passed_to_the_server(monkeypatch):
    seen = {}
    monkeypatch.setattr(serve, "load_served", lambda *args: "served")
    monkeypatch.setattr(serve, "run", lambda served, host, port, **kw: seen.update(kw))
    assert cli.main(["serve", "--max-body-mb", "0.5"]) == 0
    assert seen["max_body"] == 2**19
    assert cli.main(["serve"]) == 0
    assert seen["max_body"] == serve.MAX_BODY_BYTES
    for bad in ("0", "-1", "nan", "inf", "lots"):
        with pytest.raises(SystemExit):
            cli.main(["serve", "--max-body-mb", bad])


# ---------------------------------------------------------------- 4. client errors said as such
@pytest.fixture(scope="module")
def http(chat):
    from fastapi.testclient import TestClient

    with TestClient(serve.create_app(serve.chat_served(chat, NAME, "the shipped chat model"))) as client:
        yield client  # raise_server_exceptions: a 500 fails the test with its traceback


def error_of(reply, status: int) -> dict:
    assert reply.status_code == status, reply.text
    return reply.json()["error"]


@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_beyond_the_context_is_said_of_max_tokens(http, key):
    error = error_of(http.post("/v1/chat/completions", json={"model": NAME, "messages": REVERSE, key: 100}), 400)
    assert error["param"] == key and f"{key} is 100" in error["message"], error
    assert "context of 64 tokens" in error["message"] and "at most 61" in error["message"]
    assert "message" not in error["message"].replace("messages", ""), error["message"]
    # room for the answer but not for the message: the message and max_tokens, both named
    error = error_of(http.post("/v1/chat/completions", json={"model": NAME, "messages": REVERSE, key: 50}), 400)
    assert error["param"] == "messages" and error["code"] == "context_length_exceeded"
    assert "the last message is 14 tokens" in error["message"] and "max_tokens 50" in error["message"]


@pytest.mark.parametrize(("body", "words"), [
    (b'{"model": "%s", "prompt": "a", "max_tokens": %s}' % (NAME.encode(), b"1" * 5000), "more than 4300 digits"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"model": "%s", "prompt": "a", "max_tokens": %s}' % (NAME.encode(), b"[" * 900 + b"]" * 900), "max_tokens"),
    (b'{"model": "%s", "prompt": "a", "seed": %s}' % (NAME.encode(), b"9" * 4000), "seed must fit in 64 bits"),
    (json.dumps({"model": NAME, "prompt": "a", "stream": "x" * 100_000}).encode(), "characters)"),
])
def test_numbers_too_long_and_nesting_too_deep_are_client_errors(http, body, words):
    error = error_of(http.post("/v1/completions", content=body, headers={"Content-Type": "application/json"}), 400)
    assert words in error["message"] and len(error["message"]) < 400, error


@pytest.mark.parametrize(("path", "key", "value"), [
    ("/v1/completions", "echo", True),
    ("/v1/completions", "logprobs", 2),
    ("/v1/chat/completions", "logprobs", True),
    ("/v1/chat/completions", "top_logprobs", 3),
    ("/v1/completions", "logit_bias", {"5": 100}),
    ("/v1/completions", "suffix", "the end"),
    ("/v1/completions", "best_of", 3),
    ("/v1/chat/completions", "presence_penalty", 0.5),
    ("/v1/chat/completions", "frequency_penalty", -1),
    ("/v1/chat/completions", "tools", [{"type": "function", "function": {"name": "f"}}]),
    ("/v1/chat/completions", "response_format", {"type": "json_object"}),
])
def test_unsupported_parameters_are_refused_by_name(http, path, key, value):
    base = {"model": NAME, "temperature": 0, **({"prompt": "a"} if path == "/v1/completions" else
                                                {"messages": REVERSE})}
    error = error_of(http.post(path, json={**base, key: value}), 400)
    assert error["param"] == key and error["code"] == "unsupported_parameter" and key in error["message"]


def test_unsupported_parameters_at_their_defaults_are_accepted(http):
    defaults = {"echo": False, "logprobs": None, "logit_bias": {}, "suffix": "", "best_of": 1, "presence_penalty": 0,
                "frequency_penalty": 0.0, "tools": [], "response_format": {"type": "text"}, "top_logprobs": 0}
    reply = http.post("/v1/chat/completions", json={"model": NAME, "messages": REVERSE, "temperature": 0, **defaults})
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == "srats"
    assert http.post("/v1/completions", json={"model": NAME, "prompt": "a", "logprobs": False}).status_code == 200


@pytest.mark.parametrize("delay", ["inf", "nan", "-1", "61", "soon"])
def test_a_token_delay_that_would_fail_every_request_is_refused_at_start(monkeypatch, capsys, delay):
    monkeypatch.setattr(serve, "run", lambda *args, **kw: pytest.fail("the server started"))
    with pytest.raises(SystemExit) as refused:
        cli.main(["serve", f"--token-delay={delay}"])
    assert refused.value.code == 2 and "--token-delay" in capsys.readouterr().err


def test_a_token_delay_that_would_fail_every_request_is_refused_by_the_library(chat):
    served = serve.chat_served(chat, NAME, "the shipped chat model")
    for delay in (float("inf"), float("nan"), -1.0, 1e300):
        with pytest.raises(ValueError, match="token_delay"):
            serve.create_app(served, token_delay=delay)
    with pytest.raises(ValueError, match="token_delay"):
        serve.run(served, "127.0.0.1", 0, token_delay=float("inf"))


def test_an_invalid_host_is_said_of_the_host(monkeypatch, capsys):
    with pytest.raises(OSError, match=r"--host 999\.1\.1\.1 is not a valid address") as invalid:
        serve.listen("999.1.1.1", 0)
    assert "--port" not in str(invalid.value)
    taken = serve.listen("127.0.0.1", 0)
    with taken, pytest.raises(OSError, match="choose another --port"):
        serve.listen("127.0.0.1", taken.getsockname()[1])
    monkeypatch.setattr(serve, "load_served", lambda *args: serve.Served("m", None, None, "a model"))
    assert cli.main(["serve", "--host", "999.1.1.1", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "--host 999.1.1.1 is not a valid address" in err and "--port" not in err, err


@pytest.mark.parametrize(("host", "allowed"), [
    ("127.0.0.1:{port}", True), ("localhost:{port}", True), ("LOCALHOST:{port}", True), ("[::1]:{port}", True),
    ("evil.example:{port}", False), ("evil.example", False), ("127.0.0.1.nip.io:{port}", False),
    ("127.0.0.1:1{port}", False), ("localhost", False), ("10.0.0.1:{port}", False), ("", False),
])
def test_on_a_loopback_address_only_loopback_hosts_are_answered(chat, host, allowed):
    """DNS rebinding: a page on evil.example whose name comes to resolve to 127.0.0.1 reaches the server with
    Host: evil.example. A server on a loopback address answers loopback names at its own port only."""
    with running(serve.chat_served(chat, NAME, "the shipped chat model"), guard=True) as server:
        import httpx

        value = host.format(port=server.port)
        for reply in (httpx.get(server.url + "/v1/models", headers={"Host": value}, timeout=BACKSTOP),
                      post(server.url, "/v1/chat/completions", {"model": NAME, "messages": REVERSE}, Host=value)):
            if allowed:
                assert reply.status_code == 200, reply.text
            else:
                error = error_of(reply, 400)
                assert error["code"] == "invalid_host" and "DNS rebinding" in error["message"]
                assert f"http://127.0.0.1:{server.port}/" in error["message"]


def test_a_server_on_every_interface_answers_any_host(chat):
    from fastapi.testclient import TestClient

    served = serve.chat_served(chat, NAME, "the shipped chat model")
    with TestClient(serve.create_app(served, bound=("0.0.0.0", 8000))) as client:
        assert client.get("/v1/models", headers={"Host": "my-laptop.lan:8000"}).status_code == 200
    with TestClient(serve.create_app(served, bound=("127.0.0.1", 8000))) as client:
        assert client.get("/v1/models", headers={"Host": "my-laptop.lan:8000"}).status_code == 400
        assert client.get("/v1/models", headers={"Host": "localhost:8000"}).status_code == 200


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(self.format(record))


def test_stopping_answers_a_plain_request_in_flight_instead_of_a_traceback():
    """Ctrl-C (or SIGTERM) with a plain generation under way: it ends at its next token and its request is
    answered 503 within uvicorn's grace period, where uvicorn cancelled it and logged 60 lines."""
    served = serve.load_served(ASSETS / f"{TEXT}.pt")
    generating, stopping, calls = threading.Event(), threading.Event(), [0]

    def forward(*_):
        calls[0] += 1
        if calls[0] == 1:
            generating.set()
        elif calls[0] == 2:
            stopping.wait(BACKSTOP)  # the generation cannot end of itself before the server stops

    served.model.register_forward_pre_hook(forward)
    server = Running(served)
    stop = server.worker.stop
    server.worker.stop = lambda: (stop(), stopping.set())
    records = Records()
    logging.getLogger("uvicorn.error").addHandler(records)
    try:
        result = {}
        asking = threading.Thread(target=lambda: result.update(reply=post(
            server.url, "/v1/completions", {"model": TEXT, "prompt": "ROMEO:", "max_tokens": 4096})))
        asking.start()
        assert generating.wait(BACKSTOP), "the request did not start generating"
        server.stop()
        asking.join(BACKSTOP)
    finally:
        logging.getLogger("uvicorn.error").removeHandler(records)
    assert not server.thread.is_alive()
    error = error_of(result["reply"], 503)
    assert error["code"] == "server_stopping" and "stopping" in error["message"]
    assert records.lines == [], records.lines


@pytest.mark.system
def test_the_command_stopped_by_sigterm_says_one_line_and_143():
    """SIGTERM (a service manager's stop) ends the command as Ctrl-C does: one line, no traceback, status 143.
    Before: uvicorn raised the signal again once stopped, and the default action killed the process unheard."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, "-m", "transformer_course.cli", "serve", "--checkpoint",
                                str(ASSETS / f"{TEXT}.pt"), "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        first = process.stdout.readline()  # said once the server listens, its signal handlers in place
        assert "serving" in first, (first, process.stderr.read() if process.poll() is not None else "")
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=BACKSTOP)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 143, (process.returncode, out, err)
    assert out.splitlines() == ["transformer-course serve: stopped"] and err == "", (out, err)


def test_the_command_stopped_with_a_generation_in_flight_says_one_line():
    """The command itself: its Host guard is on (127.0.0.1), and Ctrl-C during a plain generation prints one
    line, no traceback. The generation (4,096 tokens, a second after each) cannot end before the Ctrl-C."""
    import httpx

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, "-m", "transformer_course.cli", "serve", "--checkpoint",
                                str(ASSETS / f"{TEXT}.pt"), "--port", "0", "--token-delay", "1"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    result = {}
    try:
        first = process.stdout.readline()
        found = re.search(r"at (http://127\.0\.0\.1:(\d+))/", first)
        assert found, (first, process.stderr.read() if process.poll() is not None else "")
        url = found.group(1)
        refused = httpx.get(url + "/v1/models", headers={"Host": "evil.example"}, timeout=BACKSTOP)
        assert error_of(refused, 400)["code"] == "invalid_host"

        def ask():
            try:
                result["reply"] = post(url, "/v1/completions", {"model": TEXT, "prompt": "ROMEO:", "max_tokens": 4096})
            except httpx.HTTPError as error:  # the server stopped before it read the request
                result["error"] = error

        asking = threading.Thread(target=ask)
        asking.start()
        assert httpx.get(url + "/v1/models", timeout=BACKSTOP).status_code == 200  # after the long one was sent
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=BACKSTOP)
        asking.join(BACKSTOP)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode in (0, 130), (process.returncode, out, err)
    assert out.splitlines() == ["transformer-course serve: stopped"] and err == "", (out, err)
    assert "error" in result or result["reply"].status_code == 503, result


# ---------------------------------------------------------------- 5. the engine's line and memory (issue 55, round 2)
def status_of(sock: socket.socket) -> int:
    """The status of the reply on `sock`, read as soon as its status line has come (a stream's body need not)."""
    data = b""
    while b"\r\n" not in data and (chunk := sock.recv(1)):
        data += chunk
    found = re.match(rb"HTTP/1\.1 (\d{3}) ", data)
    return int(found.group(1)) if found else 0


def held_text_model(holds: dict[int, threading.Event]):
    """The text checkpoint served, its forward pass number N waiting at `holds[N]` (once set, free): the test
    decides when each step happens. Returns the Served and the events set as each held pass starts."""
    served = serve.load_served(ASSETS / f"{TEXT}.pt")
    calls, reached = [0], {n: threading.Event() for n in holds}

    def forward(*_):
        calls[0] += 1
        if calls[0] in holds:
            reached[calls[0]].set()
            holds[calls[0]].wait(BACKSTOP)

    served.model.register_forward_pre_hook(forward)
    return served, reached


def test_clients_that_left_while_waiting_stop_counting_against_max_waiting():
    """With --max-batch 1, two requests wait behind a long one, then their clients go away. They stayed in the
    engine's line until they reached its head (after the 4,096 tokens of the first), so every new client got
    429 "2 requests are waiting" though no one waited; they now leave the line at the next step."""
    holds = {2: threading.Event(), 3: threading.Event(), 4: threading.Event()}
    served, reached = held_text_model(holds)
    body = json.dumps({"model": TEXT, "prompt": "ROMEO:", "max_tokens": 4096}).encode()
    with running(served, max_batch=1, max_waiting=2) as server:
        first = raw_request(server.port, "/v1/completions", body)
        try:
            assert reached[2].wait(BACKSTOP), "the first request did not start generating"
            waiters = [raw_request(server.port, "/v1/completions", body) for _ in range(2)]
            assert poll(lambda: len(server.worker._inbox) == 2), "the two requests did not wait their turn"
            holds[2].set()  # the next step takes them into the engine's line, behind the first
            assert reached[3].wait(BACKSTOP) and len(server.worker.engine.waiting) == 2
            for sock in waiters:
                sock.close()
            assert poll(lambda: sum(c.is_set() for c in list(server.worker._cancels)) == 2), "the leaving went unseen"
            holds[3].set()
            assert reached[4].wait(BACKSTOP), "the first request stopped generating"
            assert server.worker.waiting == 0, f"{server.worker.waiting} clients that left still count as waiting"
            server.worker.check_room().release()  # a new client would be let in (no 429)
            assert "transformer_course_requests_waiting 0" in server.worker.metrics()
        finally:
            for hold in holds.values():
                hold.set()
            first.close()


def test_a_burst_of_streamed_requests_is_held_to_max_waiting():
    """A streamed request was counted as waiting only once its stream started, after the 429 check: a burst of
    them all passed it (10 sent at once at --max-waiting 2 were all let in). Each is counted from the check on now,
    so exactly two are let in, whatever the order the server reads them in."""
    holds = {1: threading.Event()}
    served, reached = held_text_model(holds)
    body = json.dumps({"model": TEXT, "prompt": "ROMEO:", "max_tokens": 4, "stream": True}).encode()
    with running(served, max_batch=1, max_waiting=2) as server:
        socks = [raw_request(server.port, "/v1/completions", body)]
        try:
            assert reached[1].wait(BACKSTOP), "the first request did not start generating"
            socks += [raw_request(server.port, "/v1/completions", body) for _ in range(10)]  # all at once
            statuses = sorted(status_of(sock) for sock in socks[1:])
            assert statuses == [200] * 2 + [429] * 8, statuses
        finally:
            holds[1].set()
            for sock in socks:
                sock.close()
        assert poll(lambda: server.worker.waiting == 0 and not server.worker.engine.running)


def test_a_stop_string_too_long_is_refused(http):
    """`Stops.feed` costs a stop string's length squared at each token, on the event loop: one stop string of a
    million characters froze every client for seconds per token. The longest is STOP_LENGTH_LIMIT now."""
    limit = serve.STOP_LENGTH_LIMIT
    for stop in ("x" * (limit + 1), ["ok", "y" * 1_000_000]):
        error = error_of(http.post("/v1/completions", json={"model": NAME, "prompt": "a", "stop": stop}), 400)
        assert error["param"] == "stop" and f"at most {limit:,}" in error["message"], error
    reply = http.post("/v1/completions", json={"model": NAME, "prompt": "a", "max_tokens": 2, "stop": "x" * limit})
    assert reply.status_code == 200, reply.text


def test_a_kv_cache_larger_than_memory_is_refused_naming_the_option(chat, monkeypatch, capsys):
    """--kv-cache-mb 1e9 ended in a MemoryError traceback, 100000 in PyTorch's "DefaultCPUAllocator: can't
    allocate memory" naming no option; both are refused before the socket opens now, saying what is ever used."""
    served = serve.chat_served(chat, NAME, "the shipped chat model")
    monkeypatch.setattr(serve, "load_served", lambda *args: served)
    monkeypatch.setattr(serve, "_available_bytes", lambda: 2**30)  # this machine: 1 GiB available
    monkeypatch.setattr(serve, "server", lambda *a, **k: pytest.fail("the server was built"))
    for size in ("1e9", "100000", "2048"):
        assert cli.main(["serve", "--port", "0", "--kv-cache-mb", size, "--max-batch", "2"]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and f"--kv-cache-mb {float(size):g} is more than" in err, err
        assert "1,024 MB" in err and "at --max-batch 2" in err, err
    with pytest.raises(ValueError, match="--kv-cache-mb"):
        serve.create_app(served, kv_cache_mb=1e9)


def test_a_kv_cache_that_cannot_be_allocated_is_said_of_the_option(chat, monkeypatch):
    def refuse(*args):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(serve, "_available_bytes", lambda: None)  # a machine that does not say
    monkeypatch.setattr(serve.PagedKVCache, "from_megabytes", refuse)
    with pytest.raises(ValueError, match=r"--kv-cache-mb 8: the KV cache could not be allocated .*give less"):
        serve.create_app(serve.chat_served(chat, NAME, "the shipped chat model"), kv_cache_mb=8)


def test_a_temperature_that_overflows_is_refused_and_fails_no_one_else():
    """temperature 1e-300 passed the check (0 to 2), then its logits / temperature overflowed inside the engine's
    step: the step failed, and every request decoded with it was answered 500 with that request's error."""
    holds = {2: threading.Event()}
    served, reached = held_text_model(holds)
    with running(served) as server:
        result = {}
        asking = threading.Thread(target=lambda: result.update(reply=post(
            server.url, "/v1/completions", {"model": TEXT, "prompt": "ROMEO:", "max_tokens": 6, "temperature": 1})))
        asking.start()
        try:
            assert reached[2].wait(BACKSTOP), "the first request did not start generating"
            hostile = {"model": TEXT, "prompt": "ROMEO:", "max_tokens": 6, "temperature": 1e-300}
            sock = raw_request(server.port, "/v1/completions", json.dumps(hostile).encode())
            with sock:  # refused at once, or (before) waiting to join the first request's next step
                assert poll(lambda: server.worker.waiting == 1 or _readable(sock))
                holds[2].set()
                status, reply = read_reply(sock)
        finally:
            holds[2].set()
            asking.join(BACKSTOP)
    assert result["reply"].status_code == 200, result["reply"].text  # the neighbour first: it was answered 500
    assert result["reply"].json()["usage"]["completion_tokens"] == 6
    assert status == 400, reply[-300:]
    error = json.loads(reply.partition(b"\r\n\r\n")[2])["error"]
    assert error["param"] == "temperature" and "at least 0.0001" in error["message"], error


def _readable(sock: socket.socket) -> bool:
    import select

    return bool(select.select([sock], [], [], 0)[0])


def test_stream_options_of_another_kind_are_refused(http):
    """include_usage "yes" (or stream_options a list) left the usage out without a word."""
    base = {"model": NAME, "prompt": "a", "max_tokens": 2, "stream": True}
    for options, param in (({"include_usage": "yes"}, "stream_options.include_usage"), ([1], "stream_options")):
        error = error_of(http.post("/v1/completions", json={**base, "stream_options": options}), 400)
        assert error["param"] == param, error


@pytest.mark.parametrize(("option", "value", "words"), [
    ("--max-batch", "0", "argument --max-batch: must be a number of requests, from 1 to 4096, got 0"),
    ("--max-waiting", "-1", "argument --max-waiting: must be a number of requests, from 1 to 1000000, got -1"),
])
def test_engine_options_out_of_range_say_what_they_count(monkeypatch, capsys, option, value, words):
    """The refusal read "argument --max-batch: must be --max-batch, from 1 to 4096", naming no unit."""
    monkeypatch.setattr(serve, "run", lambda *args, **kw: pytest.fail("the server started"))
    with pytest.raises(SystemExit) as refused:
        cli.main(["serve", option, value])
    assert refused.value.code == 2 and words in capsys.readouterr().err


def test_the_command_raises_its_open_files_limit_to_the_most_it_may_have(chat, monkeypatch):
    """1,100 clients that each sent half a request (at a soft limit of 1,024 open files) left the server answering
    no one until they went, asyncio logging a traceback at each accept that failed (478,000 lines in 20 s). The
    command now takes the hard limit (this does not bound connections: it moves the wall to the system's)."""
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard <= 256:
        pytest.skip(f"no finite hard limit above 256 to raise to (hard limit {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        assert serve.more_open_files() == hard == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    seen = []

    class Stub:
        def run(self, sockets):
            seen.append(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
            sockets[0].close()

    monkeypatch.setattr(serve, "more_open_files", lambda: seen.append("raised"))
    monkeypatch.setattr(serve, "server", lambda *args, **kwargs: Stub())
    monkeypatch.setattr(sys, "setswitchinterval", lambda interval: None)
    serve.run(serve.chat_served(chat, NAME, "the shipped chat model"), "127.0.0.1", 0, say=lambda line: None)
    assert seen[0] == "raised" and len(seen) == 2, seen
