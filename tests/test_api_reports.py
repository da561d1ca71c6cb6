"""The report of a version: JSON, PNG, SVG and HTML, on both databases."""

from __future__ import annotations

import numpy as np
import pytest

from calibd.metrics import ece, evaluate


@pytest.fixture
def reported(client, name):
    rng = np.random.default_rng(3)
    scores = rng.uniform(0.01, 0.99, 2000)
    labels = (rng.uniform(size=2000) < scores**2).astype(int)
    body = {"name": name, "method": "isotonic", "holdout": {"scores": scores.tolist(), "labels": labels.tolist()}}
    assert client.post("/calibrators", json=body).status_code == 201
    p = rng.uniform(0.01, 0.99, 500)
    y = (rng.uniform(size=500) < p).astype(int)
    assert client.post("/feedback", json={"calibrator": name, "probabilities": p.tolist(), "labels": y.tolist()}).status_code == 202
    return name, scores, labels, p, y


def test_json_report_holds_the_cross_fitted_holdout_metrics_diagram_and_feedback(client, reported):
    name, scores, labels, p, y = reported
    report = client.get(f"/calibrators/{name}/report").json()
    assert report["version"] == 1 and report["method"] == "isotonic"
    before = report["holdout"]["before"]
    assert before == evaluate(scores, labels)  # the raw scores, as POST /evaluate computes them
    after = report["holdout"]["after"]
    assert after["metrics"]["ece"]["value"] < before["metrics"]["ece"]["value"]
    assert after["metrics"]["interval_calibration"]["value"] > 0  # cross-fitted: never 0 as in-sample isotonic
    assert sum(b["count"] for b in after["reliability"]["bins"]) == 2000
    assert report["feedback"]["windows"]["1h"]["samples"] == 500
    assert report["feedback"]["windows"]["1h"]["ece"] == pytest.approx(ece(p, y), rel=1e-12)
    assert len(report["feedback"]["history"]) == 1 and report["feedback"]["history"][0]["samples"] == 500
    assert report["feedback"]["drift"]["alarm"] is False
    assert [v["version"] for v in report["versions"]] == [1]


def test_png_svg_and_html(client, reported):
    name = reported[0]
    png = client.get(f"/calibrators/{name}/report", params={"format": "png"})
    assert png.headers["content-type"] == "image/png" and png.content.startswith(b"\x89PNG")
    svg = client.get(f"/calibrators/{name}/report", params={"format": "svg"})
    assert svg.headers["content-type"].startswith("image/svg+xml")
    assert b"<svg" in svg.content and b"observed frequency" in svg.content and b"perfect calibration" in svg.content
    page = client.get(f"/calibrators/{name}/report", params={"format": "html"})
    assert page.headers["content-type"].startswith("text/html")
    text = page.text
    for element in ('id="reliability-diagram"', 'id="holdout-metrics"', 'id="feedback-windows"', 'id="versions"',
                    'id="drift-alarm"', "<svg"):
        assert element in text, element
    # Self-contained: no scripts, stylesheets or images fetched from elsewhere.
    assert "<script" not in text and "<link" not in text
    assert 'src="http' not in text and 'href="http' not in text


def test_report_of_unknown_things(client, reported):
    name = reported[0]
    assert client.get("/calibrators/no-such/report").status_code == 404
    assert client.get(f"/calibrators/{name}/report", params={"version": 9}).status_code == 404
    assert client.get(f"/calibrators/{name}/report", params={"format": "pdf"}).status_code == 422


def test_the_page_shows_autos_candidates_with_their_cross_validated_scores(client, name):
    import html
    import re

    rng = np.random.default_rng(5)
    scores = rng.uniform(0.01, 0.99, 1500)
    labels = (rng.uniform(size=1500) < scores**2).astype(int)
    body = {"name": name, "method": "auto", "options": {"candidates": ["platt", "isotonic", "temperature"]},
            "holdout": {"scores": scores.tolist(), "labels": labels.tolist()}}
    assert client.post("/calibrators", json=body).status_code == 201
    fit = client.get(f"/calibrators/{name}/versions/1").json()["summary"]["fit"]
    page = client.get(f"/calibrators/{name}/report", params={"format": "html"}).text
    table = page[page.index('id="auto-candidates"'):]
    table = table[: table.index("</table>")]
    rows = re.findall(r"<tr( class=\"current\")?><td>([^<]+)</td><td>([^<]+)</td><td>([^<]*)</td></tr>", table)
    shown = {html.unescape(method): float(score) for _, method, score, _ in rows}
    assert shown == pytest.approx(fit["cv_log_loss"], abs=1e-5)
    assert list(shown) == sorted(shown, key=shown.get)  # best first
    marked = [method for current, method, _, note in rows if current and note == "chosen"]
    assert marked == [fit["chosen"]] == [min(fit["cv_log_loss"], key=fit["cv_log_loss"].get)]
