"""The report page in a real browser: headless Chromium (Debian's `chromium`) renders it offline to a PNG
with no console message and visibly non-blank content. Skipped where Chromium is absent.

Chromium logs every console message of the page to stderr as a "CONSOLE" line with --enable-logging;
the report has no scripts, so any such line (a failed load, a script error) fails the test. A page that
does log proves the capture works. Network use is cut off: host resolution fails for every name and the
proxy is a closed port, so a reference to anything outside the file would show up as a console error.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image

CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser")) if p), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (.ci/run installs Debian's "
                                "chromium); the browser rendering check needs it")

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9",
         "--enable-logging=stderr", "--v=0", "--hide-scrollbars")
CONSOLE = re.compile(r":CONSOLE[:(]\d*\)?\]\s*(.*)")


def render(page: Path, png: Path, profile: Path, height: int = 6000) -> list[str]:
    """Screenshot `page` into `png`; return the console messages the page produced."""
    assert CHROMIUM is not None
    argv = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--window-size=1280,{height}",
            f"--screenshot={png}", page.resolve().as_uri()]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
    assert png.is_file(), f"no screenshot (exit {done.returncode}): {done.stderr[-2000:]}"
    return [m.group(1) for line in done.stderr.splitlines() if (m := CONSOLE.search(line))]


def test_the_console_capture_sees_a_pages_errors(tmp_path: Path) -> None:
    page = tmp_path / "bad.html"
    page.write_text('<!DOCTYPE html><html><body><p>x</p><script>console.error("capture-check")</script>'
                    '<img src="http://example.invalid/a.png" alt=""></body></html>')
    messages = render(page, tmp_path / "bad.png", tmp_path / "profile", height=300)
    assert any("capture-check" in m for m in messages), messages


def test_chromium_renders_the_report_offline_without_console_errors(built_report: Path, tmp_path: Path) -> None:
    png = tmp_path / "report.png"
    messages = render(built_report, png, tmp_path / "profile")
    assert messages == []
    pixels = image.imread(str(png))[..., :3]
    assert pixels.shape[1] == 1280
    ink = np.any(pixels < 0.9, axis=-1)  # not (near) white
    assert ink.mean() > 0.02, f"only {ink.mean():.1%} of the page has content"
    colours = np.unique((pixels.reshape(-1, 3) * 15).round(), axis=0)
    assert len(colours) > 20  # text, table rules, and the figures' colours
    rows_with_ink = ink.any(axis=1)
    assert rows_with_ink[: len(rows_with_ink) // 2].mean() > 0.3  # content down the page, not one line
