"""End-to-end: every chapter run in JupyterLab inside headless Chromium, widgets included.

Run with ``make test-browser`` (CI runs it after ``make test``). For each chapter notebook it:

1. opens the notebook in JupyterLab (served from a scratch copy of the chapters, so nothing in the
   repository is modified), clears the stored outputs and runs all cells;
2. asserts that the kernel finishes, that no cell produced an error output, that the page never says
   "Error displaying widget", and that every widget output is rendered and visible;
3. for the first widget that has a slider or a text box (else a quiz question), changes the control
   and asserts that the widget's displayed output changes;
4. saves a screenshot to ``build/browser/<chapter>.png``.

It installs Debian's chromium when ``/usr/bin/chromium`` is missing (root only), starts JupyterLab on
127.0.0.1 with a throwaway configuration (no token, no browser), and always stops the server and the
browser, also on failure. Each chapter has a time limit (``--chapter-timeout``), and so does the run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
# JS helpers evaluated in the page; `window.jupyterapp` exists thanks to expose_app_in_browser
JS_MODEL = "() => { const w = window.jupyterapp.shell.currentWidget; return w && w.context ? w.context.model.toJSON() : null; }"
JS_KERNEL = """() => { const w = window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return k ? k.status : 'none'; }"""
JS_BUSY_CELLS = "() => Array.from(document.querySelectorAll('.jp-InputPrompt')).filter(e => e.textContent.includes('*')).length"


def ensure_chromium() -> None:
    if Path(CHROMIUM).exists():
        return
    if os.geteuid() != 0:
        sys.exit(f"{CHROMIUM} is missing; install it with: sudo apt-get install -y chromium")
    print("installing Debian's chromium ...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=True, env=env)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare_workspace(tmp: Path) -> Path:
    """A scratch copy of chapters/ (next to links to what chapters read by relative path)."""
    work = tmp / "course"
    shutil.copytree(ROOT / "chapters", work / "chapters", ignore=shutil.ignore_patterns("src", ".ipynb_checkpoints", "checkpoints"))
    for name in ("benchmarks", "docs"):
        if (ROOT / name).exists():
            (work / name).symlink_to(ROOT / name)
    settings = tmp / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    # render every cell (no virtual scrolling) so all outputs exist in the DOM
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    news = tmp / "settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)  # no "get notified about Jupyter news?" pop-up over the screenshots
    (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    return work


def start_lab(work: Path, tmp: Path, port: int, log) -> subprocess.Popen:
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(tmp / "config"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    cmd = [
        str(Path(sys.executable).with_name("jupyter")), "lab", "--no-browser", f"--port={port}",
        "--ServerApp.ip=127.0.0.1", "--IdentityProvider.token=", "--ServerApp.password=",
        "--ServerApp.disable_check_xsrf=True", "--LabApp.expose_app_in_browser=True",
        f"--ServerApp.root_dir={work}", f"--LabApp.user_settings_dir={tmp / 'settings'}",
        f"--LabApp.workspaces_dir={tmp / 'workspaces'}", "--ServerApp.allow_root=True",
        "--ServerApp.open_browser=False",
    ]
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_for_http(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("jupyter lab exited early")
        try:
            with urllib.request.urlopen(url, timeout=3) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f} s")


def stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def shutdown_kernels(base: str) -> None:
    """Delete every session (and its kernel) so each chapter starts from a fresh, lone kernel."""
    with urllib.request.urlopen(f"{base}/api/sessions", timeout=10) as r:
        sessions = json.loads(r.read())
    for session in sessions:
        request = urllib.request.Request(f"{base}/api/sessions/{session['id']}", method="DELETE")
        urllib.request.urlopen(request, timeout=30).close()


class ChapterFailure(AssertionError):
    pass


def errors_in(model: dict) -> list[str]:
    found = []
    for cell in model["cells"]:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                found.append(f"{out.get('ename')}: {out.get('evalue')}"[:300])
    return found


def run_all(page, name: str, timeout: float) -> dict:
    """Clear outputs, run every cell, wait for the kernel; return the notebook model as JSON."""
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget && window.jupyterapp.shell.currentWidget.context", timeout=60_000)
    page.wait_for_function(f"() => ({JS_KERNEL})() === 'idle'", timeout=120_000)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs')")
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    deadline = time.monotonic() + timeout
    code_cells = None
    while time.monotonic() < deadline:
        page.wait_for_timeout(1000)
        model = page.evaluate(JS_MODEL)
        errors = errors_in(model)
        if errors:
            raise ChapterFailure(f"{name}: error output: {errors[0]}")
        code_cells = [c for c in model["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
        done = all(c.get("execution_count") for c in code_cells)
        if done and page.evaluate(JS_BUSY_CELLS) == 0 and page.evaluate(JS_KERNEL) == "idle":
            return model
    pending = sum(not c.get("execution_count") for c in code_cells or [])
    raise ChapterFailure(f"{name}: kernel did not finish within {timeout:.0f} s ({pending} cells not run)")


def widget_areas(page):
    """Rendered widget outputs: one locator per output that holds a widget view."""
    return page.locator(".jp-OutputArea-output:has(.jupyter-widgets)")


def displayed(area) -> str:
    """What a widget shows, leaving out its own controls: Output widgets, HTML, images, plots."""
    return area.evaluate(
        """el => Array.from(el.querySelectorAll('.widget-output, .widget-html-content, img, .widget-label, pre'))
                 .map(e => e.tagName === 'IMG' ? e.src.length + ':' + e.src.slice(-200) : e.innerText).join('\\n')"""
    )


def _press_action_button(area) -> str:
    """Widgets that redraw on a button (e.g. "Generate") need the click after the control change."""
    button = area.locator("button.jupyter-button:not(:has-text('Check'))").first
    if button.count():
        button.click()
        return " and its button pressed"
    return ""


def interact(page, area) -> str | None:
    """Change one control in ``area``; return a description, or None if it has no usable control."""
    handle = area.locator(".noUi-handle").first
    if handle.count():
        handle.scroll_into_view_if_needed()
        handle.focus()
        for _ in range(3):
            page.keyboard.press("ArrowRight")
        return "slider moved 3 steps" + _press_action_button(area)
    text = area.locator(".widget-text input[type=text], .widget-textarea textarea").first
    if text.count():
        text.scroll_into_view_if_needed()
        text.fill("To be, or not to be")
        if text.evaluate("e => e.tagName") == "INPUT":
            text.press("Enter")
        return "text box changed" + _press_action_button(area)
    select = area.locator(".widget-dropdown select").first
    if select.count():
        select.scroll_into_view_if_needed()
        current = select.input_value()
        values = select.locator("option").evaluate_all("opts => opts.map(o => o.value)")
        select.select_option(next(v for v in values if v != current))
        return "dropdown changed" + _press_action_button(area)
    radio = area.locator(".widget-radio-box input").first
    button = area.locator("button:has-text('Check')").first
    if radio.count() and button.count():
        radio.scroll_into_view_if_needed()
        radio.check()
        button.click()
        return "quiz answered"
    return None


def check_widgets(page, name: str, model: dict) -> str:
    expected = sum(
        "application/vnd.jupyter.widget-view+json" in out.get("data", {})
        for cell in model["cells"] for out in cell.get("outputs", [])
    )
    if "Error displaying widget" in page.inner_text("body"):
        raise ChapterFailure(f"{name}: the page says 'Error displaying widget'")
    areas = widget_areas(page)
    if areas.count() < expected:
        raise ChapterFailure(f"{name}: {expected} widget outputs but only {areas.count()} rendered")
    for i in range(areas.count()):
        areas.nth(i).scroll_into_view_if_needed()
        box = areas.nth(i).bounding_box()
        if not box or box["width"] < 5 or box["height"] < 5:
            raise ChapterFailure(f"{name}: widget output {i} is not visible")
    if not expected:
        return "no widgets"
    order = sorted(range(areas.count()), key=lambda i: areas.nth(i).locator(".widget-radio-box").count() > 0)
    for i in order:  # widgets with sliders/text boxes first, quizzes last
        area = areas.nth(i)
        before = displayed(area)
        action = interact(page, area)
        if action is None:
            continue
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            page.wait_for_timeout(500)
            now = displayed(area)
            if now != before and page.evaluate(JS_KERNEL) == "idle":
                page.wait_for_timeout(1500)  # let the redraw settle before the screenshot
                area.scroll_into_view_if_needed()
                return f"{expected} widgets rendered; {action}: output changed"
        raise ChapterFailure(f"{name}: {action} but the widget's output did not change")
    raise ChapterFailure(f"{name}: {expected} widgets, none with a control to change")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("chapters", nargs="*", help="chapter notebooks to run (default: all)")
    parser.add_argument("--chapter-timeout", type=float, default=600, help="seconds per chapter")
    parser.add_argument("--total-timeout", type=float, default=2700, help="seconds for the whole run")
    parser.add_argument("--out", default=str(ROOT / "build" / "browser"), help="where screenshots go")
    args = parser.parse_args(argv)

    ensure_chromium()
    from playwright.sync_api import sync_playwright

    notebooks = [Path(p).name for p in args.chapters] or sorted(p.name for p in (ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    failures, lab = [], None
    # a watchdog: whatever happens, the run ends (SIGALRM is delivered to this process only)
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("browser test exceeded --total-timeout")))
    signal.alarm(int(args.total_timeout))
    tmp = Path(tempfile.mkdtemp(prefix="lab-e2e-"))
    log_path = out / "jupyter-lab.log"
    try:
        with open(log_path, "w") as log:
            work = prepare_workspace(tmp)
            port = free_port()
            lab = start_lab(work, tmp, port, log)
            base = f"http://127.0.0.1:{port}"
            wait_for_http(f"{base}/lab", lab, timeout=120)
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
                try:
                    for name in notebooks:
                        t0 = time.monotonic()
                        page = browser.new_page(viewport={"width": 1400, "height": 1000})
                        page_errors = []
                        page.on("pageerror", lambda exc, errs=page_errors: errs.append(str(exc)))
                        try:
                            page.goto(f"{base}/lab/tree/chapters/{name}", wait_until="domcontentloaded")
                            model = run_all(page, name, args.chapter_timeout)
                            verdict = check_widgets(page, name, model)
                            print(f"PASS {name}: {len(model['cells'])} cells; {verdict} ({time.monotonic() - t0:.0f} s)", flush=True)
                        except Exception as exc:  # record and go on to the next chapter
                            failures.append(f"{name}: {exc}")
                            print(f"FAIL {name}: {exc}", flush=True)
                        finally:
                            try:
                                page.screenshot(path=str(out / f"{Path(name).stem}.png"))
                            except Exception:
                                pass
                            page.close()
                            shutdown_kernels(base)
                finally:
                    browser.close()
    except Exception as exc:
        failures.append(f"run: {type(exc).__name__}: {exc}")
        print(f"FAIL run: {exc} (server log: {log_path})", flush=True)
    finally:
        signal.alarm(0)
        stop(lab)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"browser test: {len(notebooks) - len([f for f in failures if not f.startswith('run:')])}/{len(notebooks)} chapters passed "
          f"in {time.monotonic() - start:.0f} s; screenshots in {out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
