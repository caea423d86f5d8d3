"""End-to-end: the report card's HTML page (chapter 13, `transformer-course report`) in headless Chromium. Run by
``make test-browser``.

It opens the stored report of the shipped models (``benchmarks/results/report_card/report.html``, written by
``transformer-course report``; tests/test_report_card.py regenerates its figures and compares them) as a file,
the way a teacher opens it from a download: the page must ask for nothing beyond itself (self-contained: every
plot inlined), raise no error, show a heading per model (base, SFT, DPO, GRPO) and a table for each, and every
image must have decoded (a natural width above 0). A full-page screenshot goes to
``build/browser/report_card.png``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from lab_e2e import CHROMIUM, CHROMIUM_ARGS, ensure_chromium  # noqa: E402  (how the project runs Chromium)

PAGE = ROOT / "benchmarks" / "results" / "report_card" / "report.html"
MODELS = ("base", "SFT", "DPO", "GRPO")


def check(page, url: str, requested: list[str]) -> None:
    page.goto(url, wait_until="load")
    headings = page.locator("h2").all_inner_texts()
    for model in MODELS:
        assert any(model in h for h in headings), f"no heading names {model}: {headings}"
    assert page.locator("table").count() >= len(MODELS), "a table per model is missing"
    images = page.evaluate("() => Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth])")
    assert len(images) >= len(MODELS), f"expected a plot per model, found {len(images)}"
    broken = [alt for alt, complete, width in images if not complete or width == 0]
    assert not broken, f"images that did not decode: {broken}"
    outside = [u for u in requested if u != url and not u.startswith("data:")]
    assert not outside, f"the page asked for something beyond itself: {outside}"
    print(f"PASS report card: {len(headings)} headings, {len(images)} plots, nothing fetched", flush=True)


def main() -> int:
    ensure_chromium()
    from playwright.sync_api import sync_playwright

    out = ROOT / "build" / "browser"
    out.mkdir(parents=True, exist_ok=True)
    start, errors, requested, failed = time.monotonic(), [], [], None
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 900})
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("request", lambda r: requested.append(r.url))
            try:
                check(page, PAGE.as_uri(), requested)
                assert not errors, f"the page raised: {errors}"
            except Exception as exc:  # noqa: BLE001 (reported below, after the screenshot)
                failed = exc
            finally:
                page.screenshot(path=str(out / "report_card.png"), full_page=True)
        finally:
            browser.close()
    if failed is not None:
        print(f"FAIL report card: {failed}", flush=True)
        return 1
    print(f"PASS report card page ({time.monotonic() - start:.0f} s; screenshot {out / 'report_card.png'})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
