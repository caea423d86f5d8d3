"""End-to-end: the chapters with widgets run in JupyterLab inside headless Chromium; and the student
edition of two chapters run and solved in the browser as a learner would.

Run with ``make test-browser`` (CI runs it last). By default it runs the chapters whose stored outputs
hold a widget other than the quiz (``widget_chapters``: the quiz is one widget, the same in every
chapter, so it is tried in those; strict nbval runs every chapter). For each chapter notebook it:

1. opens the notebook in JupyterLab (served from a scratch copy of the chapters, so nothing in the
   repository is modified), clears the stored outputs and runs all cells;
2. asserts that the kernel finishes, that no cell produced an error output, that the page never says
   "Error displaying widget", and that every widget output is rendered and visible;
3. for the first widget that has a slider or a text box (else a quiz question), changes the control
   and asserts that the widget's displayed output changes;
4. saves a screenshot to ``build/browser/<chapter>.png``.

The student edition (``transformer_course.classroom.edition.write_student_edition``) is written into
the same scratch folder (``student/chapters/``, served by the same JupyterLab) and its chapters in
``STUDENT_CHAPTERS`` (02 and 03) are items of their own, named ``student/<chapter>.ipynb``. For each:

5. runs all cells with every exercise unsolved and asserts that the kernel finishes, that no cell
   produced an error output, that the last cell ran, and that every check line printed is
   "⏳ Exercise N.M (...): not done yet ...", one per exercise cell (tagged ``exercise``);
6. for a chapter in ``ANSWERS`` (03: the build exercise ``def causal_mask(``, an exported cell whose
   body is the stub), types into that cell's editor like a learner (click in the editor, Ctrl+A, then
   the new text inserted as typed text: the cell's source with the stub line replaced by an answer),
   runs it with Shift+Enter, clicks into the check cell (the first cell after it that names the
   check) and runs it with Shift+Enter: a wrong answer (no ``tril``) must print "❌ ...: <hint> - the
   chapter carries on with the package's causal_mask"; then a right one, which prints a marker each
   time it is called, must print "✅ ... uses yours", and after "Run Selected Cell and All Below" a
   later cell's output must hold the marker (the rest of the chapter runs the learner's code), with
   no error output anywhere;
7. saves screenshots to ``build/browser/student-<chapter>.png`` (and ``-wrong.png`` at the ❌ line).

``--student-from DIR`` builds the student edition from the chapter notebooks in DIR instead of the
course's (to try a reworked chapter before it is committed).

It installs Debian's chromium when ``/usr/bin/chromium`` is missing (root only), starts JupyterLab on
127.0.0.1 with a throwaway configuration (no token, no browser), and always stops the server and the
browser, also on failure. Each chapter has a time limit (``--chapter-timeout``; a student chapter
solved in the browser gets it twice: for its first run, and for the answers and the run below), and
so does the run.

``--jobs N`` (default 2) splits the chapters into N groups and runs each group in a child process of
this script, with its own JupyterLab (own port, own scratch copy, log ``jupyter-lab-<k>.log``) and its
own Chromium, and ``OMP_NUM_THREADS=1`` so that concurrent chapters do not fight over cores. Groups
are balanced with the chapters' last measured run times (``tests/durations.py``; a student
chapter solved in the browser runs twice, so counts double), longest first. The children's
lines are printed prefixed with ``[k]``; the run fails if any child fails. When the run times out or
is interrupted, the children are stopped and whatever they started is killed. ``--jobs 1`` runs
every chapter in this process, one after another.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from durations import cost  # noqa: E402  (each chapter's last measured run time, to balance --jobs)

from transformer_course.checks import RESULT_LINE  # noqa: E402  (the one line every check prints)
from transformer_course.classroom.edition import write_student_edition  # noqa: E402
from transformer_course.classroom.exercise_cells import EXERCISE_TAG  # noqa: E402

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
JS_MODEL = ("() => { const w = window.jupyterapp.shell.currentWidget; "
            "return w && w.context ? w.context.model.toJSON() : null; }")
JS_KERNEL = """() => { const w = window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return k ? k.status : 'none'; }"""
# what wait_until_run polls each second, without serialising the notebook (its outputs hold every plot):
# the first error outputs anywhere, and how many non-empty code cells of `cells` (null: all) have not run
# since execution count `after`
JS_PROGRESS = """({cells, after}) => { const list = window.jupyterapp.shell.currentWidget.content.model.cells;
  const errors = []; let pending = 0;
  for (let i = 0; i < list.length; i++) {
    const c = list.get(i);
    if (c.type !== 'code') continue;
    for (let j = 0; j < c.outputs.length; j++) {
      const o = c.outputs.get(j);
      if (o.type === 'error') { const d = o.toJSON(); errors.push(`${d.ename}: ${d.evalue}`.slice(0, 300)); }
    }
    if ((cells === null || cells.includes(i)) && c.sharedModel.getSource().trim() && !((c.executionCount || 0) > after))
      pending++;
  }
  return {errors, pending}; }"""
JS_BUSY_CELLS = ("() => Array.from(document.querySelectorAll('.jp-InputPrompt'))"
                 ".filter(e => e.textContent.includes('*')).length")
# mark cell `i` of the open notebook (its DOM node) so that a locator can find it
JS_MARK_CELL = """i => { document.querySelectorAll('[data-e2e-cell]').forEach(e => e.removeAttribute('data-e2e-cell'));
  window.jupyterapp.shell.currentWidget.content.widgets[i].node.setAttribute('data-e2e-cell', String(i)); }"""
JS_CELL_SOURCE = "i => window.jupyterapp.shell.currentWidget.content.widgets[i].model.sharedModel.getSource()"
JS_ACTIVE_CELL = "() => window.jupyterapp.shell.currentWidget.content.activeCellIndex"

STUDENT = "student/"  # an item named student/<chapter>.ipynb runs that chapter's student edition
STUDENT_CHAPTERS = ("02_embeddings_and_positions.ipynb", "03_single_head_attention.ipynb")


@dataclass(frozen=True)
class Answer:
    """A build exercise the test solves in the browser: first wrongly, then rightly."""

    defines: str  # the exercise cell is the one (tagged `exercise`) whose source holds this
    check: str  # its check cell is the first cell after it whose source holds this
    name: str  # the package's version the chapter carries on with when the answer fails
    wrong: str  # body put in place of the stub line (at its indentation)
    right: str  # a correct body that prints `marker` each time it runs
    marker: str


ANSWERS = {
    "03_single_head_attention": Answer(
        defines="def causal_mask(",
        check="check_causal_mask",
        name="causal_mask",
        wrong="return torch.ones(T, T, dtype=torch.bool, device=device)  # every position sees the future",
        right='print("(the learner\'s causal_mask)")\nreturn torch.ones(T, T, dtype=torch.bool, device=device).tril()',
        marker="(the learner's causal_mask)",
    ),
}


def is_student(item: str) -> bool:
    return item.startswith(STUDENT)


def item_name(arg: str) -> str:
    """A command-line chapter (``chapters/03_x.ipynb``, ``student/03_x.ipynb``) -> the item's name."""
    path = Path(arg)
    return STUDENT + path.name if "student" in path.parts[:-1] else path.name


QUIZ_WIDGET = "Quick check:"  # the text/plain of the quiz widget (transformer_course.quiz), in most chapters


def widget_chapters() -> list[str]:
    """The chapters the browser runs by default: those whose stored outputs hold a widget other than the
    quiz (an explorer, a chat box, a progress bar). The quiz is the same widget in every chapter, so the
    chapters that show nothing else add nothing here; nbval runs every chapter."""
    chosen = []
    for path in sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            views = [o["data"] for o in cell.get("outputs", [])
                     if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
            if any(not "".join(v.get("text/plain", "")).startswith(QUIZ_WIDGET) for v in views):
                chosen.append(path.name)
                break
    return chosen


def item_cost(item: str) -> float:
    """Relative run time: a student chapter solved in the browser runs (most of) its cells twice."""
    return cost(item) * (2 if is_student(item) and Path(item).stem in ANSWERS else 1)


def notebook_url_path(item: str) -> str:
    """Where JupyterLab serves the item, relative to its root (the scratch folder)."""
    return f"student/chapters/{Path(item).name}" if is_student(item) else f"chapters/{item}"


def screenshot_stem(item: str) -> str:
    return f"student-{Path(item).stem}" if is_student(item) else Path(item).stem


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


def prepare_workspace(tmp: Path, student_from: Path | None = None) -> Path:
    """A scratch copy of chapters/ (next to links to what chapters read by relative path); with
    ``student_from``, the student edition of the chapters there in ``student/`` (as a teacher hands it out)."""
    work = tmp / "course"
    shutil.copytree(ROOT / "chapters", work / "chapters",
                    ignore=shutil.ignore_patterns("src", ".ipynb_checkpoints", "checkpoints"))
    for name in ("benchmarks", "docs"):
        if (ROOT / name).exists():
            (work / name).symlink_to(ROOT / name)
    if student_from is not None:
        write_student_edition(work / "student", chapters_dir=student_from)
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


class Abort(BaseException):
    """The run's watchdog fired or the process was told to stop: ends the run, not just a chapter."""


def _abort(signum, _frame):
    signal.alarm(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # let the clean-up finish
    raise Abort("browser test exceeded --total-timeout" if signum == signal.SIGALRM
                else f"stopped by {signal.Signals(signum).name}")


def die_with_parent(parent: int) -> None:
    """A child of --jobs: get SIGTERM (so clean up) when the parent process dies, even by SIGKILL."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG (Linux)
    if os.getppid() != parent:  # the parent died before prctl
        os.kill(os.getpid(), signal.SIGTERM)


def source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def printed(cell: dict) -> str:
    """What a cell printed (its stream outputs)."""
    texts = [out.get("text", "") for out in cell.get("outputs", []) if out.get("output_type") == "stream"]
    return "".join("".join(t) if isinstance(t, list) else t for t in texts)


def check_lines(cell: dict) -> list[re.Match]:
    """The check verdicts a cell printed ("✅|❌|⏳ Exercise N.M (name): message")."""
    return [m for line in printed(cell).splitlines() if (m := RESULT_LINE.match(line.strip()))]


def last_count(model: dict) -> int:
    return max((c.get("execution_count") or 0 for c in model["cells"] if c["cell_type"] == "code"), default=0)


def wait_until_run(page, name: str, deadline: float, cells=None, after: int = 0) -> dict:
    """Wait until every non-empty code cell in ``cells`` (indices; default all) has run since execution
    count ``after`` and the kernel is idle; fail at once on an error output. Returns the model as JSON."""
    pending = 0
    wanted = {"cells": None if cells is None else list(cells), "after": after}
    while time.monotonic() < deadline:
        page.wait_for_timeout(1000)
        state = page.evaluate(JS_PROGRESS, wanted)
        if state["errors"]:
            raise ChapterFailure(f"{name}: error output: {state['errors'][0]}")
        pending = state["pending"]
        if not pending and page.evaluate(JS_BUSY_CELLS) == 0 and page.evaluate(JS_KERNEL) == "idle":
            return page.evaluate(JS_MODEL)  # the kernel is idle: these outputs are the ones just checked
    raise ChapterFailure(f"{name}: kernel did not finish in time "
                         + (f"({pending} cells not run)" if pending else "(still busy)"))


def run_all(page, name: str, timeout: float) -> dict:
    """Clear outputs, run every cell, wait (``timeout`` s) for the kernel; return the notebook model as JSON."""
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget "
                           "&& window.jupyterapp.shell.currentWidget.context", timeout=60_000)
    page.wait_for_function(f"() => ({JS_KERNEL})() === 'idle'", timeout=120_000)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs')")
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    return wait_until_run(page, name, time.monotonic() + timeout)


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


def try_instructor(page, item: str, timeout: float, out: Path) -> str:
    """Steps 1-3 of the module docstring; returns the verdict."""
    model = run_all(page, item, timeout)
    return f"{len(model['cells'])} cells; {check_widgets(page, item, model)}"


def check_not_done(name: str, model: dict) -> str:
    """Every exercise unsolved: one "⏳ ... not done yet" line per exercise cell, and the last cell ran."""
    cells = model["cells"]
    exercises = [c for c in cells if c["cell_type"] == "code" and EXERCISE_TAG in c.get("metadata", {}).get("tags", [])]
    if not exercises:
        raise ChapterFailure(f"{name}: no cell is tagged '{EXERCISE_TAG}' in the student edition")
    lines = [m for c in cells for m in check_lines(c)]
    wrong = [m.group(0) for m in lines if m["icon"] != "⏳" or not m["message"].startswith("not done yet")]
    if wrong:
        raise ChapterFailure(f"{name}: with every exercise unsolved a check printed {wrong[0]!r}")
    if len(lines) != len(exercises):
        raise ChapterFailure(f"{name}: {len(exercises)} exercise cells but {len(lines)} check lines "
                             f"({', '.join(m['exercise'] for m in lines) or 'none'})")
    last = next(c for c in reversed(cells) if c["cell_type"] == "code" and source(c).strip())
    if not last.get("execution_count"):
        raise ChapterFailure(f"{name}: the last code cell did not run")
    return f"{len(cells)} cells; {len(exercises)} exercises, each '⏳ not done yet'"


def cell_locator(page, index: int):
    """The DOM node of cell ``index`` of the open notebook."""
    page.evaluate(JS_MARK_CELL, index)
    return page.locator(f"[data-e2e-cell='{index}']")


def type_into_cell(page, name: str, index: int, text: str) -> None:
    """Replace the text of code cell ``index`` as a learner does: click into its editor, select all
    (Ctrl+A) and type. The text is inserted as typed input (``keyboard.insert_text``, like a paste),
    not key by key, so that CodeMirror's auto-indent and bracket closing do not change it."""
    editor = cell_locator(page, index).locator(".jp-InputArea-editor .cm-content")
    editor.scroll_into_view_if_needed()
    editor.click()
    page.keyboard.press("ControlOrMeta+a")
    page.keyboard.insert_text(text)
    deadline = time.monotonic() + 10
    while page.evaluate(JS_CELL_SOURCE, index) != text:
        if time.monotonic() > deadline:
            raise ChapterFailure(f"{name}: typed into cell {index} but its source is now "
                                 f"{page.evaluate(JS_CELL_SOURCE, index)!r}")
        page.wait_for_timeout(200)


def run_exercise(page, name: str, exercise: int, check: int, deadline: float) -> re.Match:
    """Shift+Enter in the exercise cell (its editor has the focus), then click into the check cell and
    Shift+Enter; return the one verdict line the check cell printed."""
    after = last_count(page.evaluate(JS_MODEL))
    page.keyboard.press("Shift+Enter")
    cell_locator(page, check).locator(".jp-InputArea-editor .cm-content").click()
    page.keyboard.press("Shift+Enter")
    model = wait_until_run(page, name, deadline, cells=[exercise, check], after=after)
    lines = check_lines(model["cells"][check])
    if len(lines) != 1:
        raise ChapterFailure(f"{name}: the check cell {check} printed {len(lines)} verdict lines: "
                             f"{printed(model['cells'][check])!r}")
    return lines[0]


def solve_in_browser(page, name: str, model: dict, answer: Answer, timeout: float, out: Path) -> str:
    """Step 6 of the module docstring (within ``timeout`` s); returns the verdict."""
    deadline = time.monotonic() + timeout
    cells = model["cells"]
    exercise = next((i for i, c in enumerate(cells) if c["cell_type"] == "code" and answer.defines in source(c)
                     and EXERCISE_TAG in c.get("metadata", {}).get("tags", [])), None)
    if exercise is None:
        raise ChapterFailure(f"{name}: no exercise cell defines `{answer.defines}` (the exported cell as the exercise)")
    check = next((i for i in range(exercise + 1, len(cells)) if answer.check in source(cells[i])), None)
    if check is None:
        raise ChapterFailure(f"{name}: no cell after the exercise cell {exercise} calls {answer.check}")
    stub = source(cells[exercise]).split("\n")
    at = next((i for i, line in enumerate(stub) if line.lstrip().startswith("raise NotImplementedError(")), None)
    if at is None:
        raise ChapterFailure(f"{name}: the exercise cell {exercise} has no NotImplementedError stub")
    indent = stub[at][: len(stub[at]) - len(stub[at].lstrip())]

    def with_body(body: str) -> str:
        return "\n".join(stub[:at] + [indent + line for line in body.split("\n")] + stub[at + 1:])

    carries_on = f"the chapter carries on with the package's {answer.name}"
    type_into_cell(page, name, exercise, with_body(answer.wrong))
    wrong = run_exercise(page, name, exercise, check, deadline)
    hint = wrong["message"].split(f" - {carries_on}")[0].strip()
    if wrong["icon"] != "❌" or not hint or carries_on not in wrong["message"]:
        raise ChapterFailure(f"{name}: a wrong {answer.name} gave {wrong.group(0)!r}, "
                             f"not '❌ ...: <hint> - {carries_on}'")
    cell_locator(page, check).scroll_into_view_if_needed()
    page.screenshot(path=str(out / f"{screenshot_stem(name)}-wrong.png"))

    type_into_cell(page, name, exercise, with_body(answer.right))
    right = run_exercise(page, name, exercise, check, deadline)
    if right["icon"] != "✅" or "uses yours" not in right["message"]:
        raise ChapterFailure(f"{name}: a right {answer.name} gave {right.group(0)!r}, not '✅ ... uses yours'")

    # Shift+Enter left the cell after the check cell selected: Run > Run Selected Cell and All Below
    if page.evaluate(JS_ACTIVE_CELL) != check + 1:
        raise ChapterFailure(f"{name}: after Shift+Enter in the check cell, cell {page.evaluate(JS_ACTIVE_CELL)} "
                             f"is selected, not {check + 1}")
    after = last_count(page.evaluate(JS_MODEL))
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-below')")
    model = wait_until_run(page, name, deadline, cells=range(check + 1, len(cells)), after=after)
    uses = [i for i in range(check + 1, len(cells)) if answer.marker in printed(model["cells"][i])]
    if not uses:
        raise ChapterFailure(f"{name}: no cell after the check printed {answer.marker!r}: "
                             f"the chapter does not run the learner's {answer.name}")
    cell_locator(page, uses[0]).scroll_into_view_if_needed()
    return (f"{answer.name}: wrong answer '{wrong['icon']} {hint[:60]}', "
            f"right answer '{right['icon']} {right['message']}', "
            f"used by {len(uses)} later cells (first: cell {uses[0]})")


def try_student(page, item: str, timeout: float, out: Path) -> str:
    """Steps 5-6 of the module docstring; returns the verdict."""
    model = run_all(page, item, timeout)
    verdict = check_not_done(item, model)
    answer = ANSWERS.get(Path(item).stem)
    if answer is not None:
        verdict += "; " + solve_in_browser(page, item, model, answer, timeout, out)
    return verdict


def split(notebooks: list[str], jobs: int) -> list[list[str]]:
    """Longest first, each chapter into the group with the least total cost so far."""
    groups: list[list[str]] = [[] for _ in range(jobs)]
    totals = [0.0] * jobs
    for name in sorted(notebooks, key=lambda n: (-item_cost(n), n)):
        k = min(range(jobs), key=lambda i: totals[i])
        groups[k].append(name)
        totals[k] += item_cost(name)
    return [sorted(g) for g in groups if g]


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, start time) of every process, from /proc (Linux)."""
    table = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            table[int(entry.name)] = (int(fields[1]), fields[19])
    return table


def descendants(pid: int) -> set[tuple[int, str]]:
    """(pid, start time) of every process below ``pid``: JupyterLab, kernels and Chromium included,
    although they run in sessions of their own."""
    table = process_table()
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found, todo = set(), list(children.get(pid, []))
    while todo:
        p = todo.pop()
        found.add((p, table[p][1]))
        todo.extend(children.get(p, []))
    return found


def kill_leftovers(seen: set[tuple[int, str]]) -> list[str]:
    """SIGKILL each process of ``seen`` that still runs (same pid and start time); return their names."""
    table, killed = process_table(), []
    for pid, started in seen:
        if pid in table and table[pid][1] == started:
            try:
                name = Path(f"/proc/{pid}/comm").read_text().strip()
                os.kill(pid, signal.SIGKILL)
                killed.append(f"{name}[{pid}]")
            except OSError:
                pass
    return killed


def run_jobs(args, notebooks: list[str], out: Path, jobs: int) -> int:
    """Run the chapters in ``jobs`` child processes of this script; stream their lines; sum up."""
    start = time.monotonic()
    groups = split(notebooks, jobs)
    # TMPDIR: the children's scratch copies and Chromium profiles, removed at the end whatever happens
    scratch = Path(tempfile.mkdtemp(prefix="lab-e2e-jobs-"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TMPDIR": str(scratch)}
    child_timeout = max(args.total_timeout - 60, 0.9 * args.total_timeout)  # children stop first, cleanly
    lock = threading.Lock()
    passed: set[str] = set()
    reported: set[str] = set()
    procs: list[subprocess.Popen] = []
    seen: set[tuple[int, str]] = set()
    failures: list[str] = []

    def pump(k: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            line = line.rstrip("\n")
            m = re.match(r"(PASS|FAIL) (\S+\.ipynb):", line)
            with lock:
                if m:
                    reported.add(m.group(2))
                    if m.group(1) == "PASS":
                        passed.add(m.group(2))
                print(f"[{k}] {line}", flush=True)

    for sig in (signal.SIGALRM, signal.SIGTERM):
        signal.signal(sig, _abort)
    signal.alarm(int(args.total_timeout))
    threads = []
    try:
        for k, group in enumerate(groups, 1):
            print(f"[{k}] {len(group)} chapter{'s' if len(group) > 1 else ''} "
                  f"(cost {sum(map(item_cost, group)):g}): {' '.join(group)}", flush=True)
            cmd = [
                sys.executable, str(Path(__file__).resolve()), "--jobs", "1", "--child-of", str(os.getpid()),
                "--chapter-timeout", str(args.chapter_timeout), "--total-timeout", str(child_timeout),
                "--out", str(out), "--lab-log", str(out / f"jupyter-lab-{k}.log"), *group,
            ]
            if args.student_from:
                cmd[2:2] = ["--student-from", str(args.student_from)]
            # own session: a Ctrl-C reaches this process only, which stops the children in order
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, encoding="utf-8", errors="replace", bufsize=1,
                                    start_new_session=True)
            procs.append(proc)
            threads.append(threading.Thread(target=pump, args=(k, proc), daemon=True))
            threads[-1].start()
        while any(p.poll() is None for p in procs):
            seen |= descendants(os.getpid())  # what to kill should a child die without cleaning up
            time.sleep(2)
    except (Exception, Abort, KeyboardInterrupt) as exc:
        failures.append(f"run: {type(exc).__name__}: {exc}")
        print(f"FAIL run: {type(exc).__name__}: {exc}; stopping the jobs", flush=True)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave orphans
        seen |= descendants(os.getpid())
        alive = [p for p in procs if p.poll() is None]
        for p in alive:  # a child ends its chapter, closes its browser and stops its JupyterLab
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 45
        for p in alive:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        killed = kill_leftovers(seen)
        if killed:
            print(f"killed {len(killed)} leftover processes of the jobs: {' '.join(sorted(killed))}", flush=True)
        for p in procs:
            p.wait()
        for t in threads:
            t.join(timeout=5)
        shutil.rmtree(scratch, ignore_errors=True)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for k, (p, group) in enumerate(zip(procs, groups, strict=False), 1):
        if p.returncode:
            missing = [n for n in group if n not in reported]
            failures.append(f"job {k}: exit code {p.returncode}")
            print(f"FAIL job {k}: exit code {p.returncode}"
                  + (f"; no verdict for {' '.join(missing)}" if missing else ""), flush=True)
    print(f"browser test: {len(passed)}/{len(notebooks)} chapters passed in {time.monotonic() - start:.0f} s "
          f"with {len(groups)} jobs; screenshots in {out}", flush=True)
    return 1 if failures or len(passed) < len(notebooks) else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("chapters", nargs="*", help="chapter notebooks to run, student/NAME.ipynb for a student "
                        "edition (default: every chapter with a widget other than the quiz, and the student edition of "
                        + " and ".join(STUDENT_CHAPTERS) + ")")
    parser.add_argument("--jobs", type=int, default=2, help="chapters run at the same time, each group in its own "
                        "JupyterLab and Chromium (default 2; 1 runs them one after another in this process)")
    parser.add_argument("--chapter-timeout", type=float, default=600, help="seconds per chapter")
    parser.add_argument("--total-timeout", type=float, default=2700, help="seconds for the whole run")
    parser.add_argument("--out", default=str(ROOT / "build" / "browser"), help="where screenshots go")
    parser.add_argument("--lab-log", help="JupyterLab's log file (default: OUT/jupyter-lab.log)")
    parser.add_argument("--student-from", type=lambda p: Path(p).resolve(),
                        help="build the student edition from the chapter notebooks "
                        "in this folder (default: the course's chapters/)")
    parser.add_argument("--child-of", type=int, help=argparse.SUPPRESS)  # set by --jobs for its children
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")

    ensure_chromium()
    notebooks = [item_name(p) for p in args.chapters] or [*widget_chapters(), *(STUDENT + n for n in STUDENT_CHAPTERS)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = min(args.jobs, len(notebooks))
    if jobs > 1:
        return run_jobs(args, notebooks, out, jobs)
    return run_here(args, notebooks, out)


def run_here(args, notebooks: list[str], out: Path) -> int:
    """Every chapter in this process, one after another, in one JupyterLab and one Chromium."""
    # a watchdog: whatever happens, the run ends (SIGALRM is delivered to this process only); SIGTERM
    # (from the --jobs parent, or its death) ends it the same way, servers and browser stopped
    for sig in (signal.SIGALRM, signal.SIGTERM):
        signal.signal(sig, _abort)
    signal.alarm(int(args.total_timeout))
    if args.child_of:
        die_with_parent(args.child_of)
    from playwright.sync_api import sync_playwright

    start = time.monotonic()
    failures, lab, passed = [], None, 0
    tmp = Path(tempfile.mkdtemp(prefix="lab-e2e-"))
    log_path = Path(args.lab_log) if args.lab_log else out / "jupyter-lab.log"
    try:
        with open(log_path, "w") as log:
            students = any(map(is_student, notebooks))
            work = prepare_workspace(tmp, (args.student_from or ROOT / "chapters") if students else None)
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
                            page.goto(f"{base}/lab/tree/{notebook_url_path(name)}", wait_until="domcontentloaded")
                            attempt = try_student if is_student(name) else try_instructor
                            verdict = attempt(page, name, args.chapter_timeout, out)
                            print(f"PASS {name}: {verdict} ({time.monotonic() - t0:.0f} s)", flush=True)
                            passed += 1
                        except Exception as exc:  # record and go on to the next chapter (an Abort ends the run)
                            failures.append(f"{name}: {exc}")
                            print(f"FAIL {name}: {exc}", flush=True)
                        finally:
                            try:
                                page.screenshot(path=str(out / f"{screenshot_stem(name)}.png"))
                            except Exception:
                                pass
                            page.close()
                            shutdown_kernels(base)
                finally:
                    browser.close()
    except (Exception, Abort) as exc:
        failures.append(f"run: {type(exc).__name__}: {exc}")
        print(f"FAIL run: {exc} (server log: {log_path})", flush=True)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stop(lab)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"browser test: {passed}/{len(notebooks)} chapters passed in {time.monotonic() - start:.0f} s; "
          f"screenshots in {out}", flush=True)
    return 1 if failures or passed < len(notebooks) else 0


if __name__ == "__main__":
    sys.exit(main())
