"""End-to-end: `transformer-course serve`'s chat page in headless Chromium (issue 37). Run by ``make test-browser``.

It starts ``transformer-course serve`` (the shipped chat model, a free port, ``--token-delay`` so that a reply
takes long enough to be watched and stopped), opens ``/`` in Chromium (launched as tests/browser/lab_e2e.py
does) and, as a user would:

1. types "reverse: stars" and Enter: the reply must arrive token by token (the bubble is seen growing through
   at least three lengths) and end as "srats", the shipped model's greedy answer;
2. asks "reverse: moonlight" and clicks Stop after the first tokens: the reply stops growing, stays in the
   conversation marked stopped, and is a strict prefix of the whole answer (chapter 11's ``reply_stream`` for
   the messages the page sent);
3. asks "upper: rose": the request carries the whole conversation (five messages) and its answer completes,
   so the stopped generation no longer holds the model.

Every request the page makes goes to the server (nothing from elsewhere) and the page raises no error. The
server is stopped with SIGINT and must exit with 0 or 130. A screenshot goes to ``build/browser/chat_page.png``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from lab_e2e import CHROMIUM, CHROMIUM_ARGS, ensure_chromium  # noqa: E402  (how the project runs Chromium)

TOKEN_DELAY = 0.25  # seconds after each token: "srats" and its <|end|> take 1.5 s
TIMEOUT_MS = 60_000

# the texts the last assistant bubble has shown, in order (a MutationObserver on the conversation)
JS_WATCH = """() => { window.seen = [];
  new MutationObserver(() => { const all = document.querySelectorAll('.msg.assistant');
    const text = all.length ? all[all.length - 1].textContent : '';
    if (window.seen[window.seen.length - 1] !== text) window.seen.push(text); })
  .observe(document.getElementById('log'), {subtree: true, childList: true, characterData: true}); }"""
JS_LAST = "() => { const a = document.querySelectorAll('.msg.assistant'); return a[a.length - 1].textContent; }"


def start_server() -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen([sys.executable, "-m", "transformer_course.cli", "serve", "--port", "0",
                               "--token-delay", str(TOKEN_DELAY)], cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env)
    line = server.stdout.readline()
    found = re.search(r"at (http://127\.0\.0\.1:\d+)/", line)
    if not found:
        server.kill()
        sys.exit(f"transformer-course serve did not start: {line!r}")
    return server, found.group(1)


def ask(page, text: str, sent: list) -> None:
    page.evaluate(JS_WATCH)
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    page.wait_for_selector("body[data-state=streaming]", timeout=TIMEOUT_MS)


def check(page, base: str, sent: list, requested: list) -> None:
    from transformer_course.assistant import reply_stream
    from transformer_course.course_model import load_chat_model

    page.goto(base + "/")
    page.wait_for_selector("body[data-state=idle]", timeout=TIMEOUT_MS)

    # 1. tokens arrive one by one, and the answer is the greedy one
    ask(page, "reverse: stars", sent)
    page.wait_for_selector("body[data-state=idle]", timeout=TIMEOUT_MS)
    seen = page.evaluate("() => window.seen")
    assert page.evaluate(JS_LAST) == "srats", seen
    growing = [s for s in seen if s]
    assert len(growing) >= 3 and all("srats".startswith(s) for s in growing), f"no tokens seen arriving: {seen}"
    assert page.inner_text("#status") == "done"
    print(f"PASS streamed: the reply grew through {growing}", flush=True)

    # 2. Stop aborts the stream; the partial reply stays
    ask(page, "reverse: moonlight", sent)
    page.wait_for_function("() => window.seen.some(s => s.length >= 2)", timeout=TIMEOUT_MS)
    page.click("#stop")
    page.wait_for_selector("body[data-state=idle]", timeout=TIMEOUT_MS)
    stopped = page.evaluate(JS_LAST)
    time.sleep(4 * TOKEN_DELAY)
    assert page.evaluate(JS_LAST) == stopped, "the reply went on growing after Stop"
    assert page.inner_text("#status") == "stopped"
    assert page.locator(".msg.assistant.stopped").count() == 1
    chat = load_chat_model()
    whole = "".join(reply_stream(chat.model, chat.tokenizer, sent[-1]["messages"], sent[-1]["max_tokens"]))
    assert len(stopped) < len(whole) and whole.startswith(stopped), (stopped, whole)
    print(f"PASS stopped: {stopped!r} of {whole!r}", flush=True)

    # 3. the conversation is kept, and the model is free again
    ask(page, "upper: rose", sent)
    page.wait_for_selector("body[data-state=idle]", timeout=TIMEOUT_MS)
    assert page.inner_text("#status").startswith("done")
    roles = [m["role"] for m in sent[-1]["messages"]]
    assert roles == ["user", "assistant", "user", "assistant", "user"], roles
    assert sent[-1]["messages"][3]["content"] == stopped
    whole = "".join(reply_stream(chat.model, chat.tokenizer, sent[-1]["messages"], sent[-1]["max_tokens"]))
    assert page.evaluate(JS_LAST) == whole
    assert page.locator(".msg").count() == 6
    print(f"PASS kept: the third request carried {len(roles)} messages, answered {whole!r}", flush=True)

    # 4. "New conversation" starts over, and the second message of a fresh conversation is answered (issue 51)
    page.click("#clear")
    page.wait_for_selector("body[data-state=idle]", timeout=TIMEOUT_MS)
    assert page.locator(".msg").count() == 0 and page.evaluate("() => window.chatMessages.length") == 0
    for question in ("count: rose", "upper: rose"):
        ask(page, question, sent)
        page.wait_for_selector("body[data-state=idle]", timeout=TIMEOUT_MS)
    roles = [m["role"] for m in sent[-1]["messages"]]
    assert roles == ["user", "assistant", "user"], roles
    assert page.evaluate(JS_LAST) == "ROSE", page.evaluate(JS_LAST)
    print("PASS new conversation: started over; the second message 'upper: rose' was answered 'ROSE'", flush=True)

    outside = [u for u in requested if not u.startswith(base + "/")]
    assert not outside, f"the page asked for something elsewhere: {outside}"


def main() -> int:
    ensure_chromium()
    from playwright.sync_api import sync_playwright

    out = ROOT / "build" / "browser"
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    server, base = start_server()
    errors, sent, requested, failed = [], [], [], None
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 900, "height": 800})
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.on("request", lambda r: requested.append(r.url))
                page.on("request", lambda r: r.method == "POST" and sent.append(json.loads(r.post_data)))
                try:
                    check(page, base, sent, requested)
                    assert not errors, f"the page raised: {errors}"
                except Exception as exc:
                    failed = exc
                finally:
                    page.screenshot(path=str(out / "chat_page.png"))
            finally:
                browser.close()
    finally:
        server.send_signal(signal.SIGINT)
        try:
            status = server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            status = "none: killed after 30 s"
    if failed is None and status not in (0, 130):
        failed = AssertionError(f"the server's exit status after SIGINT is {status}, not 0 or 130")
    if failed is not None:
        print(f"FAIL chat page: {failed}", flush=True)
        return 1
    print(f"PASS chat page ({time.monotonic() - start:.0f} s; screenshot {out / 'chat_page.png'})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
