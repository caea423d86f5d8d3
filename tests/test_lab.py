"""`make lab` serves JupyterLab on the chapters (the README's first command, run headless)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read()


@pytest.mark.system
def test_make_lab_serves_the_chapters(tmp_path):
    # `make lab` in the venv running this test (.venv under make test, .venv-torch-X.Y.Z under make test-torch),
    # whose set-up make already did: so nothing is installed here and the wait below is only for JupyterLab
    # to start. (In a venv make did not set up, `make lab` would first install: minutes, not this test's job.)
    venv = Path(sys.prefix)
    if not (venv / ".transformer-course-lab").is_file():
        pytest.skip(f"{venv} was not set up by make (no .transformer-course-lab): run `make install` first")
    port = _free_port()
    args = f"--no-browser --port {port} --ServerApp.ip=127.0.0.1 --IdentityProvider.token= --ServerApp.password="
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt")}
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(
        ["make", "-s", "lab", f"VENV={venv}", f"JUPYTER_ARGS={args}"], cwd=ROOT, env=env, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300  # a guard against a server that never answers, not a speed limit
        status = None
        while time.monotonic() < deadline:
            try:
                status, body = _get(f"http://127.0.0.1:{port}/lab")
                break
            except OSError:
                assert proc.poll() is None, (tmp_path / "lab.log").read_text()
                time.sleep(0.5)
        assert status == 200, (tmp_path / "lab.log").read_text()
        assert b"JupyterLab" in body
        status, body = _get(f"http://127.0.0.1:{port}/api/contents")
        listed = {item["name"] for item in json.loads(body)["content"]}
        chapters = {p.name for p in (ROOT / "chapters").glob("[0-9][0-9]_*.ipynb")}
        assert chapters and chapters <= listed
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
