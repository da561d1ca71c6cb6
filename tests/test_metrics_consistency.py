"""/metrics reads the monitors of every current version at once (arrays, set-based queries), the
monitor route one version: both must show the same values, for binary calibrators with segments
and for multiclass ones, on SQLite and PostgreSQL, over HTTP."""

from __future__ import annotations

import math
import time

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families


def _gauges(text: str) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _close(a: float, b: float) -> bool:
    return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def test_metrics_equal_the_monitor_route(server, name):
    rng = np.random.default_rng(11)
    binary, multiclass, windowed = f"{name}-b", f"{name}-m", f"{name}-w"
    with httpx.Client(base_url=server.url, timeout=60) as client:
        p = rng.uniform(0.05, 0.95, 64)
        y = (rng.uniform(size=64) < p).astype(int)
        assert client.post("/calibrators", json={"name": binary, "method": "platt",
                                                 "holdout": {"scores": p.tolist(), "labels": y.tolist()}}).status_code == 201
        assert client.put(f"/calibrators/{binary}/segments", json={"dimensions": ["country"], "max_values": 2}).status_code == 200
        q = rng.dirichlet([1, 1, 1], size=90)
        labels = (q.cumsum(axis=1) > rng.uniform(size=(90, 1))).argmax(axis=1)
        assert client.post("/calibrators", json={"name": multiclass, "method": "temperature",
                                                 "holdout": {"scores": q.tolist(), "labels": labels.tolist()}}).status_code == 201
        # A label window: its time windows end where its predictions are mature, not now (the read of
        # all versions gives such versions their own bounds).
        p = rng.uniform(0.05, 0.95, 64)
        assert client.post("/calibrators", json={"name": windowed, "method": "platt", "holdout": {
            "scores": p.tolist(), "labels": (rng.uniform(size=64) < p).astype(int).tolist()}}).status_code == 201
        assert client.put(f"/calibrators/{windowed}/labels", json={"window": "1s"}).status_code == 200
        for _ in range(3):
            p = rng.uniform(0.01, 0.99, 40)
            body = {"calibrator": windowed, "probabilities": p.tolist(), "labels": (rng.uniform(size=40) < p).astype(int).tolist()}
            assert client.post("/feedback", json=body).status_code == 202
            p = rng.uniform(0.01, 0.99, 40)
            body = {"calibrator": binary, "probabilities": p.tolist(), "labels": (rng.uniform(size=40) < p).astype(int).tolist(),
                    "segments": {"country": rng.choice(["fr", "de", "it", "es"], 40).tolist()}}
            assert client.post("/feedback", json=body).status_code == 202
            q = rng.dirichlet([2, 1, 1], size=30)
            body = {"calibrator": multiclass, "probabilities": q.tolist(), "labels": rng.integers(0, 3, 30).tolist()}
            assert client.post("/feedback", json=body).status_code == 202
        deadline = time.monotonic() + 30
        while client.get(f"/calibrators/{windowed}/monitor").json()["windows"]["last_10000"]["samples"] < 120:
            assert time.monotonic() < deadline, "the windowed calibrator's labels did not mature"
            time.sleep(0.5)
        # Once all have matured, the moving end of its windows no longer changes what they hold.
        time.sleep(2.1)  # past the shared read's max age: the scrape reads the monitors afresh
        gauges = _gauges(client.get("/metrics").text)
        checked = 0
        for calibrator in (binary, multiclass, windowed):
            monitor = client.get(f"/calibrators/{calibrator}/monitor").json()
            version = str(monitor["version"])
            for window, values in monitor["windows"].items():
                for key in ("samples", "ece", "brier", "log_loss", "mean_prediction", "positive_rate", "acceptance_rate"):
                    labels_ = (("calibrator", calibrator), ("version", version), ("window", window))
                    found = gauges.get((f"calibd_monitor_{key}", labels_))
                    if values[key] is None:
                        assert found is None, (calibrator, window, key, found)
                    else:
                        assert found is not None and _close(found, values[key]), (calibrator, window, key, found, values[key])
                        checked += 1
            labels_ = (("calibrator", calibrator), ("version", version))
            assert _close(gauges[("calibd_monitor_drift_log_evalue", labels_)], monitor["drift"]["log_evalue"])
            assert gauges[("calibd_monitor_drift_alarm", labels_)] == float(monitor["drift"]["alarm"])
            for segment in monitor["segments"]:
                base = (("calibrator", calibrator), ("dimension", segment["dimension"]), ("segment", segment["segment"]),
                        ("version", version))
                assert _close(gauges[("calibd_segment_drift_log_evalue", base)], segment["drift"]["log_evalue"])
                for window, values in segment["windows"].items():
                    at = tuple(sorted((*base, ("window", window))))
                    assert _close(gauges[("calibd_segment_samples", at)], values["samples"])
                    if values["ece"] is not None:
                        assert _close(gauges[("calibd_segment_ece", at)], values["ece"])
                        checked += 1
            for key in ("waiting_labels", "waiting_predictions"):
                metric = {"waiting_labels": "calibd_label_backlog_labels", "waiting_predictions": "calibd_label_backlog_predictions"}[key]
                assert gauges[(metric, (("calibrator", calibrator),))] == monitor["labels"][key]
        assert checked > 30
