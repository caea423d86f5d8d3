"""`transformer-course serve`: a course model behind an OpenAI-compatible HTTP API, and a chat page (issue 37).

Hand-written, not exported. ``/v1/models``, ``/v1/completions`` and, for a chat model (chapters 11 and 12),
``/v1/chat/completions`` in chapter 11's chat format (``assistant.render_chat`` and ``fit_history``), each
answer plain or streamed as server-sent events; ``/`` is the chat page (``static/chat.html``, one file,
nothing fetched from elsewhere). The server is FastAPI on uvicorn: the course's optional extra ``serve``.

The model has one thread, running chapter 15's continuous-batching ``batching.Engine`` over a paged KV cache
(``--kv-cache-mb``) with a prefix cache: requests join and leave between two decode steps, each drawing with
its own ``torch.Generator`` seeded by the request's ``seed`` (``temperature`` 0 is greedy, ``top_p`` the
nucleus, a chat model stops at its ``<|end|>``), so each reply is, token for token, what chapter 07's
``generate`` gives that request alone (``--max-batch 1`` serves one request at a time). A request waits in
line while the batch or the cache is full; past ``--max-waiting`` waiting (counted from the check on, and
without the clients that left), a new one gets 429 with ``Retry-After``. A client that goes away (the page's
Stop button) ends its generation and frees its blocks
before the next step, plain or streamed. ``/metrics`` reports the engine in Prometheus' text format. Errors
have the OpenAI API's body, ``{"error": {"message", "type", "param", "code"}}``, with status 400 (a bad
request), 404 (an unknown model or path), 413 (a body over ``max_body`` bytes), 429 (too many waiting), 503
(the server is stopping) or 500.

No one request can stall the others (issue 55): a body is read up to ``max_body`` bytes only (413 beyond),
parsed and fitted to the context in a worker thread, never on the event loop, and a chat's history is fitted
from its newest message backwards, as far as the context allows (`fit_messages`, linear). Stopping (Ctrl-C,
SIGTERM) ends every generation at its next token, each request answered 503. Parameters of the OpenAI API
this server does not implement are refused by name rather than ignored. Listening on a loopback address, it
answers only requests whose Host header names a loopback address and its port (DNS rebinding).
"""

import asyncio
import ipaddress
import json
import re
import secrets
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import torch

from .batching import Engine, Request, Sequence
from .generation import decode_stream
from .paged_cache import PagedKVCache

# what the `serve` extra installs (pyproject.toml): the module each needs, by package name
SERVE_EXTRA = {"fastapi": "fastapi", "uvicorn": "uvicorn"}
COMPLETION_MAX_TOKENS = 16  # the defaults of the OpenAI API (completions) and of `transformer-course chat`
CHAT_MAX_TOKENS = 24
MAX_TOKENS_LIMIT = 4096  # a completion longer than the context slides its window; this bounds one request
MAX_BODY_BYTES = 4 * 2**20  # the largest request body read (`--max-body-mb`); a longer one gets 413 unread
TOKEN_DELAY_LIMIT = 60.0  # the longest `token_delay`, in seconds
MIN_TEMPERATURE = 1e-4  # the smallest temperature above 0: logits / temperature stay far from float32's overflow
STOP_LENGTH_LIMIT = 1000  # the longest stop string: `Stops.feed` costs its length squared at every token
KV_CACHE_MB = 32.0  # the paged KV cache's memory (`--kv-cache-mb`): 512 blocks of 16 positions of the chat model
KV_BLOCK_SIZE = 16  # positions per block of the paged KV cache (chapter 15)
MAX_BATCH = 64  # the most sequences decoded at once (`--max-batch`; 1: one request at a time, as before)
SWITCH_INTERVAL = 2e-4  # seconds: how soon Python hands the GIL between the event loop and the engine (`run`)
MAX_WAITING = 256  # the most requests waiting for a place; one more gets 429 with Retry-After (`--max-waiting`)
CHAT_PROMPT_MIN = 3  # the shortest chat prompt: <|user|>, <|end|> (an empty message) and <|assistant|>
# the OpenAI API's parameters this server does not implement: what it would have to do, and the values that
# ask for nothing (accepted, as null is); any other value is refused, naming the parameter
UNSUPPORTED = {
    "echo": ("echo the prompt back", (False,)),
    "logprobs": ("return log probabilities", (False,)),
    "top_logprobs": ("return log probabilities", (0,)),
    "logit_bias": ("bias the logits", ({},)),
    "suffix": ("write text before a suffix (insertion)", ("",)),
    "best_of": ("sample several answers and keep the best", (1,)),
    "presence_penalty": ("penalize repeated tokens (temperature, top_p and seed are its sampling)", (0,)),
    "frequency_penalty": ("penalize repeated tokens (temperature, top_p and seed are its sampling)", (0,)),
    "tools": ("call tools (its models only chat, chapter 11)", ([],)),
    "response_format": ("constrain the answer's format (it writes plain text)", ({"type": "text"},)),
}
SHIPPED_DESCRIPTIONS = {  # what the page and /v1/models say of each shipped chat model
    "shakespeare_chat": "chapter 11's assistant (supervised fine-tuning)",
    "shakespeare_dpo": "chapter 12's assistant trained with DPO",
    "shakespeare_grpo": "chapter 12's assistant trained with GRPO",
}


class RequestError(ValueError):
    """A request the server refuses: HTTP `status` and the OpenAI error's `param` and `code`."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.param, self.code, self.status, self.headers = param, code, status, headers


def missing_extra() -> list[str]:
    """The packages of the `serve` extra that are not installed."""
    import importlib.util

    return [package for package, module in SERVE_EXTRA.items() if importlib.util.find_spec(module) is None]


# ---------------------------------------------------------------- the model served
@dataclass
class Served:
    """A model as the server sees it: its id in the API, the GPT (eval mode), its tokenizer, and for a chat
    model (a ChatTokenizer) the end token every answer stops at."""

    name: str
    model: torch.nn.Module
    tokenizer: object
    description: str
    chat: bool = False
    eos_id: int | None = None
    allowed: object = None  # the ids that may be sampled (generation.stream's `allowed`)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def block_size(self) -> int:
        return self.model.cfg.block_size


def chat_served(chat, name: str, description: str) -> Served:
    """A `course_model.ChatModel` served: completions and chat, the turn markers never sampled (as
    `assistant.reply_stream` does), each answer ending at <|end|>."""
    tok = chat.tokenizer
    return Served(name, chat.model.eval(), tok, description, chat=True, eos_id=tok.end_id,
                  allowed=[*range(tok.base.vocab_size), tok.end_id])


def load_served(checkpoint=None, shipped: str = "shakespeare_chat", name: str | None = None) -> Served:
    """The model to serve: the shipped chat model `shipped` (course_model.SHIPPED_CHAT_MODELS) when
    `checkpoint` is None, else the file `checkpoint`: a chat model (assistant.save_chat_model) or a text
    checkpoint (checkpoint.save_checkpoint, served for completions only)."""
    from .checkpoint import load_checkpoint
    from .course_model import load_chat_model
    from .modern import build_gpt

    if checkpoint is None:
        chat = load_chat_model(None, shipped=shipped)
        return chat_served(chat, name or shipped, SHIPPED_DESCRIPTIONS.get(shipped, "a chat model the course ships"))
    path = Path(checkpoint)
    try:
        chat = load_chat_model(path)
    except ValueError as not_chat:
        if "is not a chat model" not in str(not_chat):
            raise
    else:
        return chat_served(chat, name or path.stem, f"the chat model {path}")
    try:
        ckpt = load_checkpoint(path, build_gpt)  # chapter 06's GPT or chapter 10's modern one
    except ValueError as error:
        raise ValueError(f"{path} is neither a chat model (assistant.save_chat_model) nor a checkpoint "
                         f"(checkpoint.save_checkpoint): {error}") from None
    if ckpt.tokenizer is None:
        raise ValueError(f"checkpoint {path} has no tokenizer, so the server could not read prompts: save it with "
                         "save_checkpoint(..., tokenizer=tok)")
    if ckpt.tokenizer.vocab_size < ckpt.model.cfg.vocab_size:
        raise ValueError(f"checkpoint {path}: its tokenizer knows {ckpt.tokenizer.vocab_size} tokens but the model "
                         f"samples from {ckpt.model.cfg.vocab_size}: save it with the tokenizer it was trained with")
    return Served(name or path.stem, ckpt.model.eval(), ckpt.tokenizer, f"the text model {path} (completions only)",
                  allowed=ckpt.tokenizer)


# ---------------------------------------------------------------- requests
@dataclass
class Sampling:
    """A request's sampling: what `generation.stream` takes, and the stop strings; ``ignore_eos`` (vLLM's
    extension of the API, for load tests): the end token is an ordinary token, so max_tokens are written."""

    max_tokens: int
    temperature: float
    top_p: float | None
    seed: int
    stop: list[str]
    ignore_eos: bool = False


def _show(value, limit: int = 80) -> str:
    """A value of a request as JSON for an error message, cut to about `limit` characters (a request's value
    may be megabytes long, or nested too deeply to write)."""
    try:
        text = json.dumps(value)
    except (RecursionError, ValueError):  # ValueError: an integer of more digits than Python writes
        text = f"a {type(value).__name__} too large to show"
    return text if len(text) <= limit else f"{text[:limit - 20]}... ({len(text):,} characters)"


def _number(body: dict, key: str, default, low=None, high=None, whole=False, low_open=False):
    value = body.get(key)
    if value is None:
        return default
    kinds = "an integer" if whole else "a number"
    if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
        raise RequestError(f"{key} must be {kinds}, got {_show(value)}", key, "invalid_type")
    if value != value or value in (float("inf"), float("-inf")):
        raise RequestError(f"{key} must be a finite number, got {value}", key, "invalid_value")
    if low is not None and (value <= low if low_open else value < low):
        raise RequestError(f"{key} must be {'>' if low_open else '>='} {low}, got {_show(value)}", key,
                           "invalid_value")
    if high is not None and value > high:
        raise RequestError(f"{key} must be <= {high}, got {_show(value)}", key, "invalid_value")
    return value


def sampling(body: dict, default_max_tokens: int) -> Sampling:
    """The sampling settings of a request's JSON body, checked (a RequestError naming the bad one)."""
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _number(body, key, default_max_tokens, low=1, high=MAX_TOKENS_LIMIT, whole=True)
    temperature = _number(body, "temperature", 1.0, low=0, high=2)
    if 0 < temperature < MIN_TEMPERATURE:  # the logits divided by it overflow, failing the whole batch's step
        raise RequestError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got {_show(temperature)}:"
                           " below that, sampling is greedy in effect and the logits overflow", "temperature",
                           "invalid_value")
    top_p = _number(body, "top_p", 1.0, low=0, high=1, low_open=True)
    seed = _number(body, "seed", None, whole=True)
    if seed is not None and not -(2**63) <= seed < 2**64:
        raise RequestError(f"seed must fit in 64 bits, got {_show(seed)}", "seed", "invalid_value")
    if _number(body, "n", 1, low=1, whole=True) != 1:
        raise RequestError("n must be 1: this server writes one answer per request", "n", "invalid_value")
    stop = body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise RequestError("stop must be a non-empty string or a list of at most 4 of them", "stop", "invalid_value")
    if longest := max((len(s) for s in stop if len(s) > STOP_LENGTH_LIMIT), default=0):
        raise RequestError(f"a stop string is {longest:,} characters and this server takes at most "
                           f"{STOP_LENGTH_LIMIT:,}: shorten it", "stop", "invalid_value")
    return Sampling(max_tokens, float(temperature), None if top_p >= 1 else float(top_p),
                    secrets.randbits(63) if seed is None else seed % 2**64, stop, _flag(body, "ignore_eos"))


def _flag(body: dict, key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(f"{key} must be true or false, got {_show(value)}", key, "invalid_type")
    return value


def refuse_unsupported(body: dict) -> None:
    """A RequestError naming the first parameter of `body` this server does not implement (`UNSUPPORTED`)
    set to a value that asks for something: it is refused rather than silently ignored."""
    for key, (what, defaults) in UNSUPPORTED.items():
        value = body.get(key)
        if value is not None and not any(value == d and isinstance(value, bool) == isinstance(d, bool)
                                         for d in defaults):
            raise RequestError(f"{key} is not supported: this server does not {what}; leave it out (got "
                               f"{_show(value)})", key, "unsupported_parameter")


def completion_ids(served: Served, body: dict, room: int) -> list[int]:
    """The token ids of a completion request's prompt: one string (a chat model reads its turn markers)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise RequestError("prompt must be a string (one prompt per request)", "prompt",
                           "invalid_type" if not isinstance(prompt, list) else "invalid_value")
    if not prompt:
        raise RequestError("prompt is empty: give at least one character", "prompt", "invalid_value")
    try:
        ids = served.tokenizer.encode(prompt)
    except ValueError as error:
        raise RequestError(f"the prompt cannot be read by this model's tokenizer: {error}", "prompt",
                           "invalid_value") from None
    if len(ids) > served.block_size:
        raise RequestError(f"the prompt is {len(ids)} tokens and {served.name} reads at most {served.block_size}: "
                           "shorten it", "prompt", "context_length_exceeded")
    return ids


def _text(content, where: str) -> str:
    """A message's content: a string, or OpenAI's list of text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise RequestError(f"{where} must be a string or a list of text parts", where, "invalid_type")


def fit_messages(messages: list[dict], tok, block_size: int, room: int) -> list[dict]:
    """Chapter 11's `assistant.fit_history` (newest message first, each encoded once, only as far as the
    context allows: a history of any length costs about one context), with the server's own refusals: a
    message holding a turn marker, wherever it is (render_chat's ValueError), and a last message that does
    not fit, said in terms of max_tokens."""
    from .assistant import SPECIALS, fit_history

    for i, m in enumerate(messages):
        if marker := next((s for s in SPECIALS if s in m["content"]), None):
            raise ValueError(f"messages[{i}] holds the turn marker {marker}: a message may not contain the turn "
                             f"markers {' '.join(SPECIALS)}")
    try:
        last = len(tok.encode(messages[-1]["content"]))
    except ValueError as error:
        raise ValueError(f"messages[{len(messages) - 1}] cannot be read by this model's tokenizer: {error}") from None
    if last + CHAT_PROMPT_MIN + room > block_size:
        raise ValueError(f"the last message is {last} tokens, and with max_tokens {room} a context of "
                         f"{block_size} leaves it at most {max(block_size - room - CHAT_PROMPT_MIN, 0)}: shorten "
                         "it, or lower max_tokens")
    return fit_history(messages, tok, block_size, room)


def chat_ids(served: Served, body: dict, room: int) -> list[int]:
    """The token ids of a chat request in chapter 11's format: the latest messages that leave `room`
    positions for the answer (`fit_messages`, as `assistant.fit_history`), then <|assistant|>."""
    from .assistant import ROLES, render_chat

    if not served.chat:
        raise RequestError(f"{served.name} is a text model with no chat format (chapter 11 makes one): use "
                           "/v1/completions", "model", "model_not_chat")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise RequestError("messages must be a non-empty list of {\"role\", \"content\"} objects", "messages",
                           "invalid_type" if not isinstance(raw, list) else "invalid_value")
    messages = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise RequestError(f"messages[{i}] must be an object with a role and a content", f"messages[{i}]",
                               "invalid_type")
        if m.get("role") not in ROLES:
            raise RequestError(f"messages[{i}].role is {_show(m.get('role'))}: this model was fine-tuned on "
                               f"the roles {' and '.join(ROLES)} only (chapter 11)", f"messages[{i}].role",
                               "invalid_value")
        messages.append({"role": m["role"], "content": _text(m.get("content"), f"messages[{i}].content")})
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    if room + CHAT_PROMPT_MIN > served.block_size:
        raise RequestError(f"{key} is {room}, too large for {served.name}'s context of {served.block_size} tokens: "
                           f"a chat's prompt takes at least {CHAT_PROMPT_MIN} of them, so {key} can be at most "
                           f"{served.block_size - CHAT_PROMPT_MIN}", key, "invalid_value")
    try:
        kept = fit_messages(messages, served.tokenizer, served.block_size, room)
        return render_chat(kept, served.tokenizer, generation_prompt=True)[0]
    except ValueError as error:
        code = "context_length_exceeded" if "shorten it" in str(error) else "invalid_value"
        raise RequestError(str(error), "messages", code) from None


# ---------------------------------------------------------------- generation: the engine's thread
@dataclass
class Answer:
    """What a generation produced so far: the finish reason once it ended, and the token counts."""

    prompt_tokens: int
    completion_tokens: int = 0
    finish_reason: str | None = None

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


class Stops:
    """Text pieces in, text out, cut before the first stop string; what might be the start of one waits."""

    def __init__(self, stops: list[str]):
        self.stops, self.held, self.hit = stops, "", False

    def feed(self, piece: str) -> str:
        text = self.held + piece
        found = [i for s in self.stops if (i := text.find(s)) >= 0]
        if found:
            self.held, self.hit = "", True
            return text[:min(found)]
        keep = max((k for s in self.stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        self.held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def flush(self) -> str:
        held, self.held = self.held, ""
        return held


def check_token_delay(token_delay) -> float:
    """`token_delay` as seconds, 0 to TOKEN_DELAY_LIMIT (a ValueError otherwise: inf would fail every request)."""
    if isinstance(token_delay, bool) or not isinstance(token_delay, (int, float)) \
            or not 0 <= token_delay <= TOKEN_DELAY_LIMIT:  # nan fails the comparison too
        raise ValueError(f"token_delay must be a number of seconds from 0 to {TOKEN_DELAY_LIMIT:g}, got "
                         f"{token_delay!r}")
    return float(token_delay)


class _Feed:
    """Token ids handed to `decode_stream` one at a time: it reads one id per piece it writes, so a next() on
    its generator after each id pushed never finds the feed empty before `done`."""

    def __init__(self):
        self.ids: deque[int] = deque()
        self.done = False

    def __iter__(self):
        return self

    def __next__(self) -> int:
        if self.ids:
            return self.ids.popleft()
        raise StopIteration


class _Cancel(threading.Event):
    """A request's cancel flag: setting it (the client went away, the server stops) also cancels its
    sequence in the engine, which frees its blocks before the next step."""

    seq: Sequence | None = None  # set by the engine's thread once the request is submitted

    def set(self) -> None:
        super().set()
        if self.seq is not None:
            self.seq.cancel()


@dataclass(eq=False)
class _Ticket:
    """One request between the event loop and the engine's thread: what it asks, where its tokens go."""

    request: Request
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue  # a token id, ("end", finish) or an exception, for `ModelWorker.pieces`
    cancel: _Cancel


def _deliver(items: list[tuple[_Ticket, object]]) -> None:
    """On the event loop: hand each item to its request."""
    for ticket, item in items:
        ticket.queue.put_nowait(item)


def _send(items: list[tuple[_Ticket, object]]) -> None:
    """From the engine's thread: one wake-up of each event loop per step, whatever the number of tokens."""
    loops: dict[asyncio.AbstractEventLoop, list] = {}
    for ticket, item in items:
        loops.setdefault(ticket.loop, []).append((ticket, item))
    for loop, batch in loops.items():
        try:
            loop.call_soon_threadsafe(_deliver, batch)
        except RuntimeError:  # the loop is gone: the server stopped
            for ticket, _ in batch:
                ticket.cancel.set()


class _ServedEngine(Engine):
    """Chapter 15's `Engine`, each forward pass made through the model's ``__call__``, so that the model's
    forward hooks (a profiler, the tests' counters) see one call per pass, as they did when requests ran one
    at a time."""

    def _compute(self, seqs):
        model = self.model
        model.forward = lambda: Engine._compute(self, seqs)  # this one call, then the class's forward again
        try:
            return model()
        finally:
            del model.forward


class ModelWorker:
    """The model's one thread, running chapter 15's continuous-batching `Engine` over a paged KV cache of
    ``kv_cache_mb`` megabytes: requests join and leave between two decode steps, each with its own sampling,
    ``max_batch`` at most at once; the others wait in line (past ``max_waiting`` waiting, a new one gets 429).
    A request that stops listening frees its blocks before the next step, and `stop` (the server stopping)
    ends them all. ``token_delay`` seconds pass after each step (to watch the tokens come)."""

    def __init__(self, served: Served, token_delay: float = 0.0, kv_cache_mb: float = KV_CACHE_MB,
                 max_batch: int = MAX_BATCH, max_waiting: int = MAX_WAITING):
        from .generation import _never_sampled

        self.served = served
        self.token_delay = check_token_delay(token_delay)  # seconds to wait after each step (to watch them come)
        self.max_waiting = _positive(max_waiting, "max_waiting")
        never = _never_sampled(served.allowed, served.model.cfg.vocab_size, next(served.model.parameters()).device)
        check_engine(served, kv_cache_mb, max_batch, max_waiting)
        self.engine = _ServedEngine(served.model, _kv_cache(served, kv_cache_mb), max_batch=max_batch, never=never)
        self._cancels: set[threading.Event] = set()
        self.placed = 0  # places in line given by `check_room` to requests not queued yet (a stream not started)
        self._inbox: list[_Ticket] = []
        self._tickets: dict[Sequence, _Ticket] = {}
        self._wake = threading.Condition()
        self._stopped = threading.Event()
        self.stopping = self._closed = False
        self.started, self.rate = time.monotonic(), _Rate()
        self._thread = threading.Thread(target=self._loop, name="model", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        """Requests not decoding yet: let in by `check_room` and not queued yet, in the inbox, or in the engine's
        queue (a client that left leaves it at the next step)."""
        return len(self._inbox) + len(self.engine.waiting) + self.placed

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not (self._inbox or self._tickets or self._closed):
                    self._wake.wait()
                if self._closed:
                    return
                inbox, self._inbox = self._inbox, []
            for ticket in inbox:
                self._submit(ticket)
            if self._tickets:
                self._step()
                if self.token_delay:
                    self._stopped.wait(self.token_delay)

    def _submit(self, ticket: _Ticket) -> None:
        if ticket.cancel.is_set():  # the client left while waiting: it never starts
            _send([(ticket, ("end", None))])
            return
        try:
            seq = self.engine.submit(ticket.request)
        except ValueError as error:
            _send([(ticket, RequestError(f"{error} (the server's --kv-cache-mb)", None, "kv_cache_too_small"))])
            return
        self._tickets[seq] = ticket
        ticket.cancel.seq = seq
        if ticket.cancel.is_set():
            seq.cancel()

    def _step(self) -> None:
        for seq, ticket in self._tickets.items():
            if ticket.cancel.is_set():
                seq.cancel()
        if any(seq.cancelled for seq in self.engine.waiting):  # gone while waiting: out of the line now, wherever
            for seq in self.engine.waiting:  # it stands (the engine drops one only at the line's head), so that
                if seq.cancelled:  # clients that left count against --max-waiting no longer
                    seq.finish = "cancelled"
            self.engine.waiting = deque(seq for seq in self.engine.waiting if not seq.cancelled)
        try:
            events = self.engine.step()
        except Exception as error:  # every sequence in flight is answered with it; the engine starts afresh
            for seq in [*self.engine.running, *self.engine.waiting]:
                seq.cancel()
            self.engine.step()
            events = [(seq, error) for seq in self._tickets]
        items = [(self._tickets[seq], token) for seq, token in events]
        self.rate.add(sum(1 for _, t in events if isinstance(t, int)))
        for seq in [s for s in self._tickets if s.finish is not None]:
            items.append((self._tickets.pop(seq), ("end", None if seq.finish == "cancelled" else seq.finish)))
        _send(items)

    async def pieces(self, ids: list[int], s: Sampling, answer: Answer, cancel: threading.Event | None = None,
                     place: "_Place | None" = None) -> AsyncIterator[str]:
        """The answer's text, piece by piece (one per token), cut at a stop string; `answer` gets the rest.
        Setting `cancel` (the client went away) ends it before the next step; the server stopping raises a
        RequestError (503)."""
        if self.stopping:
            raise _stopping()
        loop, queue, stops, feed = asyncio.get_running_loop(), asyncio.Queue(), Stops(s.stop), _Feed()
        flag = cancel if cancel is not None else _Cancel()
        request = Request(ids, s.max_tokens, s.temperature, None, s.top_p, s.seed,
                          None if s.ignore_eos else self.served.eos_id)
        self._cancels.add(flag)
        with self._wake:
            self._inbox.append(_Ticket(request, loop, queue, flag))
            self._wake.notify()
        if place is not None:  # counted in the inbox from now on
            place.release()
        text = decode_stream(self.served.tokenizer, feed)
        try:
            while not isinstance(item := await queue.get(), tuple):
                if isinstance(item, BaseException):
                    raise item
                answer.completion_tokens += 1
                if item == request.eos_id:
                    continue  # the end token is counted, never written; ("end", "stop") follows
                feed.ids.append(item)
                if (piece := stops.feed(next(text))) or stops.hit:
                    if piece:
                        yield piece
                    if stops.hit:
                        answer.finish_reason = "stop"
                        return
            answer.finish_reason = item[1]
            if self.stopping and answer.finish_reason is None:
                raise _stopping()
            piece = stops.feed("".join(text))  # a character the last bytes left unfinished, if any
            if stops.hit:
                answer.finish_reason = "stop"
            if piece := piece + ("" if stops.hit else stops.flush()):
                yield piece
        finally:
            flag.set()
            self._cancels.discard(flag)

    def metrics(self) -> str:
        """The engine's state in Prometheus' text format."""
        engine, pool = self.engine, self.engine.cache.pool
        prefix = engine.prefix
        rows = [
            ("requests_running", "gauge", "requests being decoded", len(engine.running)),
            ("requests_waiting", "gauge", "requests waiting for a place in the batch or for blocks", self.waiting),
            ("kv_cache_blocks_used", "gauge", "KV cache blocks held by a sequence", pool.used),
            ("kv_cache_blocks_total", "gauge", f"KV cache blocks of {pool.block_size} positions", pool.num_blocks),
            ("prefix_cache_hits_total", "counter", "prompt blocks found in the prefix cache", prefix.hits),
            ("prefix_cache_lookups_total", "counter", "full prompt blocks looked up", prefix.lookups),
            ("generated_tokens_total", "counter", "tokens generated", engine.tokens),
            ("tokens_per_second", "gauge", "tokens generated per second over the last 10 seconds", self.rate.now()),
        ]
        lines = []
        for name, kind, what, value in rows:
            lines += [f"# HELP transformer_course_{name} {what}", f"# TYPE transformer_course_{name} {kind}",
                      f"transformer_course_{name} {value:g}" if isinstance(value, float)
                      else f"transformer_course_{name} {value}"]
        return "\n".join(lines) + "\n"

    def check_room(self) -> "_Place":
        """A place in line, counted as waiting until its request is queued (`pieces`) or its answer ends; a
        RequestError (429, Retry-After) when ``max_waiting`` requests already wait."""
        if self.waiting >= self.max_waiting:
            raise RequestError(f"{self.waiting} requests are waiting already (the server's --max-waiting): try again "
                               "shortly", None, "rate_limit_exceeded", 429, headers={"Retry-After": "1"})
        return _Place(self)

    def stop(self) -> None:
        """The server is stopping: every generation ends before the next step (its request answered 503), those
        waiting never start, and no new one does. Called on the event loop's thread."""
        self.stopping = True
        self._stopped.set()
        for cancel in list(self._cancels):
            cancel.set()

    def close(self) -> None:
        self.stop()
        with self._wake:
            self._closed = True
            self._wake.notify()


class _Place:
    """A place in line given by `ModelWorker.check_room`: a request is counted as waiting from the check on,
    not only once its stream starts, so that a burst of streamed requests cannot all pass the check first."""

    def __init__(self, worker: ModelWorker):
        self.worker, self.held = worker, True
        worker.placed += 1

    def release(self) -> None:
        if self.held:
            self.held = False
            self.worker.placed -= 1


class _Rate:
    """Tokens per second over the last 10 seconds (the events of the steps in that window)."""

    WINDOW = 10.0

    def __init__(self):
        self.events: deque[tuple[float, int]] = deque()

    def add(self, n: int) -> None:
        self.events.append((time.monotonic(), n))
        while self.events and self.events[0][0] < time.monotonic() - self.WINDOW:
            self.events.popleft()

    def now(self) -> float:
        recent = [n for t, n in self.events if t >= time.monotonic() - self.WINDOW]
        return round(sum(recent) / self.WINDOW, 1)


def _positive(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"--{name.replace('_', '-')} must be a whole number >= 1, got {value!r}")
    return value


def check_engine(served: Served, kv_cache_mb: float = KV_CACHE_MB, max_batch: int = MAX_BATCH,
                 max_waiting: int = MAX_WAITING) -> None:
    """A ValueError naming the option when the engine's settings cannot serve `served` (checked before the
    socket opens): the KV cache must hold one full context."""
    _positive(max_batch, "max_batch")
    _positive(max_waiting, "max_waiting")
    if isinstance(kv_cache_mb, bool) or not isinstance(kv_cache_mb, (int, float)) or not kv_cache_mb > 0:
        raise ValueError(f"--kv-cache-mb must be a positive number of megabytes, got {kv_cache_mb!r}")
    cfg = served.model.cfg
    need = -(-cfg.block_size // KV_BLOCK_SIZE) * PagedKVCache.block_bytes(cfg, KV_BLOCK_SIZE)
    if kv_cache_mb * 2**20 < need:
        raise ValueError(f"--kv-cache-mb {kv_cache_mb:g} cannot hold one full context of {served.name} "
                         f"({need / 2**20:.3g} MB): give at least that")
    free = _available_bytes()
    if free is not None and kv_cache_mb * 2**20 > free:
        raise ValueError(f"--kv-cache-mb {kv_cache_mb:g} is more than this machine's available memory "
                         f"({free / 2**20:,.0f} MB); {served.name} never uses more than --max-batch full contexts "
                         f"({max_batch * need / 2**20:.3g} MB at --max-batch {max_batch}): give at most that")


def _available_bytes() -> int | None:
    """The memory this machine can still give (Linux' MemAvailable), None where it does not say."""
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            found = re.search(r"^MemAvailable:\s+(\d+) kB", info.read(), re.MULTILINE)
    except OSError:
        return None
    return int(found.group(1)) * 1024 if found else None


def _kv_cache(served: Served, kv_cache_mb: float) -> PagedKVCache:
    """The paged KV cache of `served` in `kv_cache_mb` megabytes; an allocation that fails is said of the option."""
    try:
        return PagedKVCache.from_megabytes(served.model, kv_cache_mb, KV_BLOCK_SIZE)
    except (MemoryError, RuntimeError) as error:  # RuntimeError: PyTorch's allocator ("can't allocate memory")
        raise ValueError(f"--kv-cache-mb {kv_cache_mb:g}: the KV cache could not be allocated "
                         f"({str(error).splitlines()[0][:160] or type(error).__name__}): give less") from None


def _stopping() -> RequestError:
    return RequestError("the server is stopping (Ctrl-C or SIGTERM): this answer was cut short; ask again once "
                        "it is back", None, "server_stopping", 503)


# ---------------------------------------------------------------- the application
def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """An error as the OpenAI API writes it."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _param(loc) -> str | None:
    """A FastAPI error location ('body', 'messages', 0, 'content') -> 'messages[0].content'."""
    text = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text or None


def page() -> str:
    """The chat page: one HTML file shipped in the package."""
    return resources.files("transformer_course").joinpath("static/chat.html").read_text(encoding="utf-8")


def _refuse(status: int, message: str, param=None, code=None, kind="invalid_request_error", headers=None):
    """An error answered with the OpenAI API's body (`error_body`) and HTTP `status`: a JSONResponse."""
    from fastapi.responses import JSONResponse

    return JSONResponse(error_body(message, kind, param, code), status_code=status, headers=headers)


async def _refused(_request, error: RequestError):
    return _refuse(error.status, str(error), error.param, error.code,
                   "rate_limit_error" if error.status == 429 else "invalid_request_error", error.headers)


async def _invalid(_request, error):
    first = error.errors()[0] if error.errors() else {}
    return _refuse(400, f"{first.get('msg', 'invalid request')}", _param(first.get("loc", ())), first.get("type"))


async def _http(_request, error):
    code = "not_found" if error.status_code == 404 else None
    return _refuse(error.status_code, str(error.detail), None, code)


async def _crash(_request, error: Exception):
    return _refuse(500, f"the server failed: {type(error).__name__}: {error}", kind="server_error")


def _handle_errors(app) -> None:
    """Every error of `app` in the OpenAI API's body: a refused request (its status), FastAPI's validation
    (400), an HTTP error such as an unknown path (404), anything else (500)."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    app.add_exception_handler(RequestError, _refused)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(HTTPException, _http)
    app.add_exception_handler(Exception, _crash)


def _model_card(served: Served) -> dict:
    """What /v1/models says of `served`."""
    return {"id": served.name, "object": "model", "created": served.created, "owned_by": "transformer-course",
            "description": served.description, "chat": served.chat, "context_length": served.block_size}


async def _read_bytes(request, limit: int) -> bytes:
    """A request's body, refused with 413 (a RequestError) as soon as it is known to be over `limit` bytes: by
    its Content-Length before any of it is read, else once more than `limit` bytes have come."""
    def too_large(size: str) -> RequestError:
        return RequestError(f"the request body is {size} bytes and this server reads at most {limit:,} (its "
                            "--max-body-mb): send less (of a long chat, only the latest messages fit in the "
                            "model's context anyway)", None, "request_too_large", 413)

    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large(f"{int(length):,}")
    from starlette.requests import ClientDisconnect

    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise too_large(f"more than {limit:,}")
    except ClientDisconnect:  # gone before the whole body came: no one to answer, nothing to log
        raise RequestError("the client closed the request", None, "client_closed_request", 499) from None
    return bytes(body)


def _read_body(served: Served, raw: bytes) -> dict:
    """A POST request's JSON body, an object naming the model served (else a RequestError)."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RequestError(f"the body is not valid JSON: {error}", None, "invalid_json") from None
    except RecursionError:
        raise RequestError(f"the body is nested too deeply to read (arrays and objects more than about "
                           f"{sys.getrecursionlimit()} levels deep): no parameter takes that", None,
                           "invalid_json") from None
    except ValueError as error:  # an integer of more digits than Python reads (sys.get_int_max_str_digits)
        why = (f"it holds an integer of more than {sys.get_int_max_str_digits()} digits: no parameter takes one "
               "that long" if "digits" in str(error) else str(error))
        raise RequestError(f"the body cannot be read: {why}", None, "invalid_json") from None
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object", None, "invalid_type")
    if body.get("model") != served.name:
        if not isinstance(body.get("model"), str):
            raise RequestError(f"model must be a string: this server has {served.name!r}", "model",
                               "invalid_type" if "model" in body else "missing")
        raise RequestError(f"the model {body['model']!r} does not exist here: this server has {served.name!r}",
                           "model", "model_not_found", 404)
    return body


def _stream_options(body: dict) -> None:
    """A RequestError unless `stream_options` is null or an object whose include_usage is null, true or false
    (a usage asked for in another way was left out without a word)."""
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError(f"stream_options must be an object such as {{\"include_usage\": true}}, got "
                           f"{_show(options)}", "stream_options", "invalid_type")
    usage = (options or {}).get("include_usage")
    if usage is not None and not isinstance(usage, bool):
        raise RequestError(f"stream_options.include_usage must be true or false, got {_show(usage)}",
                           "stream_options.include_usage", "invalid_type")


def _prepare(served: Served, kind: str, raw: bytes) -> tuple[dict, Sampling, list[int]]:
    """A completion (`kind` "text") or chat ("chat") request's body `raw` read and checked: the body, its
    sampling and the prompt's ids (else a RequestError). Run in a worker thread, off the event loop."""
    chat = kind == "chat"
    try:
        body = _read_body(served, raw)
        s = sampling(body, CHAT_MAX_TOKENS if chat else COMPLETION_MAX_TOKENS)
        _flag(body, "stream")
        _stream_options(body)
        refuse_unsupported(body)
        return body, s, (chat_ids if chat else completion_ids)(served, body, s.max_tokens)
    except RecursionError:  # a value nested too deeply to look at
        raise RequestError("the body is nested too deeply to read: no parameter takes that", None,
                           "invalid_value") from None


async def _gone(request, cancel: threading.Event) -> None:
    """Wait for the client of `request` (whose body has been read) to go away, then set `cancel`."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    cancel.set()


async def _answer(worker: ModelWorker, kind: str, request, body: dict, ids: list[int], s: Sampling):
    """The answer to a completion (`kind` "text") or chat ("chat") request for the prompt `ids`: a JSON
    object, or with `stream` true a StreamingResponse of server-sent events. A client that goes away ends
    its generation at the next token (a stream: when a chunk cannot be sent; a plain answer: on its
    disconnect, watched for meanwhile)."""
    chat = kind == "chat"
    rid, created = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time())
    head = {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
            "model": worker.served.name}
    result = Answer(prompt_tokens=len(ids))
    place = worker.check_room()  # 429 past the queue's limit, before any answer starts
    if not _flag(body, "stream"):
        cancel = _Cancel()
        watch = asyncio.ensure_future(_gone(request, cancel))
        try:
            text = "".join([piece async for piece in worker.pieces(ids, s, result, cancel, place)])
            left = watch.done() and not watch.cancelled() and watch.exception() is None
        finally:
            watch.cancel()
            place.release()
        if left:  # the client went away: no one reads this
            return _refuse(499, "the client closed the request", None, "client_closed_request")
        choice = ({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
        return {**head, "choices": [{"index": 0, **choice, "finish_reason": result.finish_reason,
                                     "logprobs": None}], "usage": result.usage()}
    head["object"] = "chat.completion.chunk" if chat else "text_completion"
    return _streamed(worker, chat, head, body, ids, s, result, place)


def _streamed(worker: ModelWorker, chat: bool, head: dict, body: dict, ids: list[int], s: Sampling,
              result: Answer, place: _Place):
    """A streamed answer: a StreamingResponse of server-sent events, each chunk starting with `head`, the
    usage last if `stream_options.include_usage`, then [DONE]; an error on the way is an event."""
    from fastapi.responses import StreamingResponse

    options = body.get("stream_options") or {}
    usage = isinstance(options, dict) and options.get("include_usage") is True

    def event(delta: dict | None, finish=None, **extra) -> str:
        choices = [] if delta is None else [
            {"index": 0, **({"delta": delta} if chat else {"text": delta.get("content", "")}),
             "finish_reason": finish, "logprobs": None}]
        return f"data: {json.dumps({**head, 'choices': choices, **extra})}\n\n"

    async def events() -> AsyncIterator[str]:
        try:
            if chat:
                yield event({"role": "assistant", "content": ""})
            async for piece in worker.pieces(ids, s, result, place=place):
                yield event({"content": piece})
            yield event({}, result.finish_reason)
            if usage:
                yield event(None, usage=result.usage())
        except RequestError as error:  # the server stopping: the status line has gone, the error is an event
            yield f"data: {json.dumps(error_body(str(error), 'server_error', error.param, error.code))}\n\n"
        except Exception as error:
            yield f"data: {json.dumps(error_body(f'the server failed: {error}', 'server_error'))}\n\n"
        yield "data: [DONE]\n\n"

    class Stream(StreamingResponse):  # the place is given back however the answer ends, even unstarted
        async def __call__(self, scope, receive, send):
            try:
                await super().__call__(scope, receive, send)
            finally:
                place.release()

    return Stream(events(), media_type="text/event-stream",
                  headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _add_routes(app, served: Served, worker: ModelWorker, max_body: int) -> None:
    """The routes of `app`: the chat page at /, the OpenAI API's models, completions and chat completions."""
    from fastapi import Request
    from fastapi.responses import HTMLResponse, PlainTextResponse
    from starlette.concurrency import run_in_threadpool

    @app.get("/", response_class=HTMLResponse)
    async def chat_page():
        return HTMLResponse(page())

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics():  # Prometheus' text format
        return PlainTextResponse(worker.metrics(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_model_card(served)]}

    @app.get("/v1/models/{name:path}")
    async def one_model(name: str):
        if name != served.name:
            raise RequestError(f"the model {name!r} does not exist here: this server has {served.name!r}", "model",
                               "model_not_found", 404)
        return _model_card(served)

    async def answer(kind: str, request: Request):
        raw = await _read_bytes(request, max_body)
        body, s, ids = await run_in_threadpool(_prepare, served, kind, raw)  # off the event loop
        return await _answer(worker, kind, request, body, ids, s)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await answer("text", request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await answer("chat", request)


def loopback(host: str) -> bool:
    """Whether `host` (a name or an address) is this machine only: localhost, 127.0.0.0/8 or ::1."""
    host = host.strip("[]").lower().rstrip(".")
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class HostGuard:
    """ASGI middleware of a server listening on a loopback address, against DNS rebinding: a web page
    whose own name an attacker points at 127.0.0.1 could otherwise use the server as if it were on that
    page's site. Each request's Host header must name a loopback address (localhost, 127.0.0.1, [::1])
    and the port listened on; any other is refused with 400 before the application sees it."""

    def __init__(self, app, host: str, port: int):
        self.app, self.host, self.port = app, host, port

    def allowed(self, value: str | None) -> bool:
        if value is None:  # HTTP/1.0 without Host: no browser sends that
            return True
        found = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[^:\[\]]+)(?::(\d{1,5}))?", value)
        return bool(found) and loopback(found.group(1)) and int(found.group(2) or 80) == self.port

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            values = [v for k, v in scope["headers"] if k == b"host"]
            value = values[0].decode("latin-1") if len(values) == 1 else None if not values else "(several)"
            if not self.allowed(value):
                address = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
                response = _refuse(400, f"the Host header {_show(value)} does not name this server: listening on "
                                        f"{address}, this machine only, it answers requests for localhost:"
                                        f"{self.port} or {address} only (a guard against DNS rebinding); open "
                                        f"http://{address}/", None, "invalid_host")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(served: Served, on_start=None, token_delay: float = 0.0, max_body: int = MAX_BODY_BYTES,
               bound: tuple[str, int] | None = None, **engine):
    """The FastAPI application serving `served`; `on_start()` is called once it is ready; `token_delay`
    seconds pass after each decode step (0: none), to watch the tokens arrive; a request body over `max_body`
    bytes gets 413. `bound`, the (host, port) listened on: a loopback host puts the `HostGuard` in front.
    ``engine``: `ModelWorker`'s ``kv_cache_mb``, ``max_batch`` and ``max_waiting``."""
    from fastapi import FastAPI

    if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body < 1:
        raise ValueError(f"max_body must be a positive number of bytes, got {max_body!r}")
    worker = ModelWorker(served, token_delay, **engine)

    @asynccontextmanager
    async def lifespan(_app):
        if on_start is not None:
            on_start()
        try:
            yield
        finally:
            worker.close()

    app = FastAPI(title="transformer-course", lifespan=lifespan, docs_url=None, redoc_url=None)  # no CDN pages
    app.state.worker = worker
    _handle_errors(app)
    _add_routes(app, served, worker, max_body)
    if bound is not None and loopback(bound[0]):
        app.add_middleware(HostGuard, host=bound[0], port=bound[1])
    return app


def listen(host: str = "127.0.0.1", port: int = 0):
    """A socket listening on host:port (0: a free port), refused in words naming --host or --port."""
    import errno
    import socket

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # each connection accepted inherits it (Linux): a small write (one streamed token) goes out at once instead
    # of waiting up to 40 ms for the client's delayed acknowledgement of the last one (Nagle's algorithm)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        why = error.strerror or str(error)
        if isinstance(error, socket.gaierror):
            raise OSError(f"--host {host} is not a valid address ({why}): give an IP address of this machine, "
                          "such as 127.0.0.1 (this machine only, the default) or 0.0.0.0 (every network "
                          "interface)") from None
        if error.errno == errno.EADDRNOTAVAIL:
            raise OSError(f"--host {host} is not an address of this machine ({why}): give one of its own, such "
                          "as 127.0.0.1 (this machine only, the default) or 0.0.0.0 (every network "
                          "interface)") from None
        raise OSError(f"cannot listen on {host}:{port} ({why}): choose another --port (0 picks a free one)") from None
    sock.listen(128)
    return sock


def more_open_files() -> int | None:
    """Raise this process's limit of open files to the most it may have (the hard limit) and return it (None
    where the system does not say): every connection holds one, and at a soft limit of 1,024, as many clients
    that send half a request each left the server answering no one until they went (asyncio's accept failing,
    and logging a traceback at each try)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard != resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY and soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, ValueError, OSError):  # not a Unix, or a limit the system refuses: keep the one there is
        return None


def url(sock) -> str:
    """The address of a listening socket, http://HOST:PORT."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def server(served: Served, on_start=None, token_delay: float = 0.0, max_body: int = MAX_BODY_BYTES,
           bound: tuple[str, int] | None = None, **engine):
    """A uvicorn server of `create_app(served, ...)`, quiet but for warnings; `server.run(sockets=[listen()])`
    serves (in a thread too: stop it with `server.should_exit = True`), `bound` being that socket's address.
    Stopping first ends every generation (`ModelWorker.stop`), so that each request in flight is answered
    (503) within uvicorn's grace period rather than cancelled with a traceback."""
    import uvicorn

    app = create_app(served, on_start, token_delay, max_body, bound, **engine)

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None):
            app.state.worker.stop()
            await super().shutdown(sockets)

    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=2, lifespan="on")
    return Server(config)


def run(served: Served, host: str = "127.0.0.1", port: int = 8000, say=print, token_delay: float = 0.0,
        max_body: int = MAX_BODY_BYTES, **engine) -> None:
    """Serve `served` on host:port (0: a free port) until Ctrl-C (a KeyboardInterrupt, or a return where SIGINT
    was ignored, as in a shell's background job) or SIGTERM; the first line said names the address. Request
    bodies over `max_body` bytes get 413; on a loopback host, the `HostGuard` checks each request's Host.
    ``engine``: `ModelWorker`'s ``kv_cache_mb``, ``max_batch`` and ``max_waiting``."""
    check_token_delay(token_delay)  # before the socket: a bad one fails here, not at each request
    sock = listen(host, port)
    address = url(sock)

    def started() -> None:
        say(f"serving {served.name} ({served.description}) at {address}/: the chat page at /, the OpenAI API at "
            f"{address}/v1 - Ctrl-C stops")

    try:
        check_engine(served, **engine)
        app_server = server(served, started, token_delay, max_body, sock.getsockname()[:2], **engine)
    except BaseException:
        sock.close()
        raise
    # the engine's thread lets go of the GIL at every PyTorch call and waits to get it back while the event loop
    # answers clients: at Python's default switch interval (5 ms) a decode step of a few milliseconds would wait
    # that long several times over; a shorter interval hands the GIL back sooner
    sys.setswitchinterval(SWITCH_INTERVAL)
    more_open_files()
    app_server.run(sockets=[sock])  # returns on SIGINT or SIGTERM (or KeyboardInterrupt)
