"""The report page in a real headless Chromium: load it, check the DOM, save a screenshot.

The screenshot is written to artifacts/report-page.png (CI keeps it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser

import numpy as np
import pytest

from .conftest import REPO

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACT = REPO / "artifacts" / "report-page.png"


def chromium(*args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [
                CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={profile}", "--virtual-time-budget=5000", *args,
            ],
            capture_output=True, text=True, timeout=120,
        )


class Elements(HTMLParser):
    """Collects the ids, tags and text of a rendered DOM."""

    def __init__(self):
        super().__init__()
        self.ids: dict[str, str] = {}
        self.tags: list[str] = []
        self.text: list[str] = []
        self._open: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        attributes = dict(attrs)
        if "id" in attributes:
            self.ids[attributes["id"]] = attributes.get("class") or ""

    def handle_data(self, data):
        if data.strip():
            self.text.append(data.strip())


@pytest.fixture
def drifted(client, name):
    rng = np.random.default_rng(7)
    scores = rng.uniform(0.01, 0.99, 3000)
    labels = (rng.uniform(size=3000) < scores).astype(int)
    body = {"name": name, "method": "isotonic", "holdout": {"scores": scores.tolist(), "labels": labels.tolist()}}
    assert client.post("/calibrators", json=body).status_code == 201
    for batch in range(6):
        p = rng.uniform(0.01, 0.99, 2000)
        z = np.log(p / (1 - p)) + 1.0
        y = (rng.uniform(size=2000) < 1 / (1 + np.exp(-z))).astype(int)
        client.post("/feedback", json={"calibrator": name, "probabilities": p.tolist(), "labels": y.tolist()})
    return name


@pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"), reason="Debian's chromium is not installed")
def test_report_page_in_headless_chromium(server, drifted):
    assert CHROMIUM is not None, "CI needs Debian's chromium (.ci/run installs it)"
    url = f"{server.url}/calibrators/{drifted}/report?format=html"
    dom = chromium("--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = Elements()
    page.feed(dom.stdout)
    for element in ("title", "reliability-diagram", "holdout-metrics", "feedback-windows", "feedback-history",
                    "versions", "drift-alarm", "recalibration"):
        assert element in page.ids, f"#{element} missing from the rendered page"
    assert "svg" in page.tags
    assert page.ids["drift-alarm"] == "alarm on"  # the drifted feedback raised the alarm
    text = " ".join(page.text)
    assert drifted in text and "isotonic" in text and "perfect calibration" in text

    ARTIFACT.parent.mkdir(exist_ok=True)
    ARTIFACT.unlink(missing_ok=True)
    shot = chromium(f"--screenshot={ARTIFACT}", "--window-size=1280,2400", url)
    assert shot.returncode == 0 and ARTIFACT.exists() and ARTIFACT.stat().st_size > 20_000, shot.stderr[-2000:]
    print(f"screenshot: {ARTIFACT}")
