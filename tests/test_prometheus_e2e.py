"""A real Prometheus scrapes calibd, sees the drift alarm, and fires the alert rule.

calibd runs on loopback (a LiveServer on a database of its own, on each backend). Prometheus
(Debian's `prometheus`; .ci/run installs it) runs as a subprocess on a free loopback port with a
temporary config and data folder, scraping calibd every second and evaluating
docker/alerts.yml. The test sends drifting feedback until calibd's drift test alarms, then asks
Prometheus's HTTP API until `calibd_monitor_drift_alarm` is 1 and `calibd_monitor_ece` has a
sample for the calibrator, and until the CalibrationDriftAlarm alert fires. Every query of the
Grafana dashboard is then run against this Prometheus: each must be valid PromQL, and the main
panels must have data. A second test drifts one segment of a calibrator's declared dimension
and checks that only that segment's alarm is 1 in Prometheus, and that only its
CalibrationDriftAlarmSegment alert fires.

Without prometheus installed the test skips, unless CI is set: then it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from calibd.config import Settings

from .conftest import REPO, LiveServer, free_port, migrated_database

ALERT_RULES = REPO / "docker" / "alerts.yml"
DASHBOARD = REPO / "docker" / "grafana" / "dashboards" / "calibd.json"


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is required in CI: .ci/run installs Debian's prometheus package")
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    return path


@pytest.fixture
def own_database_url(database_url, tmp_path) -> Iterator[str]:
    """A fresh migrated database of the same backend as ``database_url``.

    Prometheus scrapes calibd every second, and each scrape reads the monitors of every
    calibrator in the database: a database of its own keeps the scrapes small and the test
    independent of what other tests left behind.
    """
    kind = "sqlite" if database_url.startswith("sqlite") else "postgresql"
    with migrated_database(kind, tmp_path) as url:
        yield url


class Prometheus:
    """A Prometheus process on a loopback port, scraping one calibd every second."""

    def __init__(self, binary: str, folder: Path, target: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = folder / "prometheus.log"
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(ALERT_RULES)],
            "scrape_configs": [{"job_name": "calibd", "metrics_path": "/metrics", "static_configs": [{"targets": [target]}]}],
        }
        config_file = folder / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config))
        self.command = [
            binary,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> Prometheus:
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"prometheus exited {self.process.returncode}:\n{self.logs()}"
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.__exit__()
        raise AssertionError(f"prometheus did not become ready:\n{self.logs()}")

    def __exit__(self, *exc) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""

    def query(self, promql: str) -> list[dict]:
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        body = response.json()
        assert response.status_code == 200 and body["status"] == "success", f"{promql}: {response.text}"
        return body["data"]["result"]

    def wait_for(self, what: str, check, seconds: float = 30.0):
        """Polls ``check()`` until it returns something truthy; fails with Prometheus's view otherwise."""
        deadline = time.monotonic() + seconds
        while True:
            result = check()
            if result:
                return result
            if time.monotonic() > deadline:
                targets = httpx.get(f"{self.url}/api/v1/targets", timeout=10).text
                raise AssertionError(f"timed out waiting for {what}\ntargets: {targets}\nlog:\n{self.logs()}")
            time.sleep(0.25)


def pairs(n: int, seed: int, shift: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Probabilities and labels whose true logit is the prediction's logit plus ``shift``."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.01, 0.99, n)
    z = np.log(p / (1 - p)) + shift
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-z))).astype(int)
    return p, y


def dashboard_queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    queries = []
    for panel in board["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            queries += [target["expr"] for target in inner.get("targets", [])]
    return queries


def grafana_to_promql(expr: str, calibrator: str) -> str:
    """What Grafana sends for the dashboard's variables, with one calibrator and every window selected."""
    replacements = {"$__rate_interval": "30s", "$__interval": "1s", "$__range": "1m", "$calibrator": calibrator, "$window": ".*",
                    "$dimension": ".*"}
    for variable, value in replacements.items():
        expr = expr.replace(variable, value).replace("${" + variable[1:] + "}", value)
    assert "$" not in expr, f"a dashboard variable left in {expr}"
    return expr


def test_prometheus_sees_the_drift_alarm_and_fires_the_alert(own_database_url, tmp_path, name):
    binary = prometheus_binary()
    started = time.monotonic()
    with LiveServer(Settings(database_url=own_database_url)) as calibd, httpx.Client(base_url=calibd.url, timeout=60) as client:
        with Prometheus(binary, tmp_path, f"127.0.0.1:{calibd.port}") as prometheus:
            prometheus.wait_for(
                "Prometheus to scrape calibd",
                lambda: [r for r in prometheus.query('up{job="calibd"}') if r["value"][1] == "1"],
            )

            rng = np.random.default_rng(3)
            scores = rng.uniform(0.01, 0.99, 500)
            labels = (rng.uniform(size=500) < scores).astype(int)
            body = {"name": name, "method": "platt", "holdout": {"scores": scores.tolist(), "labels": labels.tolist()}}
            assert client.post("/calibrators", json=body).status_code == 201
            assert client.post("/calibrate", json={"calibrator": name, "scores": [0.1, 0.5, 0.9]}).status_code == 200

            # Feedback whose true logit is the prediction's plus 1: drift, batch after batch.
            for batch in range(20):
                p, y = pairs(2000, 100 + batch, shift=1.0)
                response = client.post("/feedback", json={"calibrator": name, "probabilities": p.tolist(), "labels": y.tolist()})
                assert response.status_code == 202, response.text
                if client.get(f"/calibrators/{name}/monitor").json()["drift"]["alarm"]:
                    break
            else:
                pytest.fail("calibd's drift test did not alarm on 20 batches of drifting feedback")

            selector = f'calibrator="{name}"'
            alarm = prometheus.wait_for(
                "calibd_monitor_drift_alarm to be 1 in Prometheus",
                lambda: [r for r in prometheus.query(f"calibd_monitor_drift_alarm{{{selector}}}") if r["value"][1] == "1"],
            )
            assert alarm[0]["metric"]["version"] == "1" and alarm[0]["metric"]["job"] == "calibd"
            ece = prometheus.wait_for(
                "a calibd_monitor_ece sample", lambda: prometheus.query(f"calibd_monitor_ece{{{selector}}}")
            )
            assert {r["metric"]["window"] for r in ece} == {"1h", "24h", "last_10000"}
            assert all(0 < float(r["value"][1]) < 1 for r in ece)

            # The alert rule from docker/alerts.yml, evaluated by this Prometheus.
            def firing() -> list[dict]:
                alerts = httpx.get(f"{prometheus.url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
                return [
                    a for a in alerts
                    if a["labels"]["alertname"] == "CalibrationDriftAlarm" and a["labels"].get("calibrator") == name
                    and a["state"] == "firing"
                ]

            alert = prometheus.wait_for("the CalibrationDriftAlarm alert to fire", firing)[0]
            assert alert["labels"]["version"] == "1" and alert["labels"]["severity"] == "warning"
            assert name in alert["annotations"]["summary"]

            # Every dashboard query is valid PromQL here, and the main panels have data.
            results = {}
            for expr in dashboard_queries():
                results[expr] = prometheus.query(grafana_to_promql(expr, name))
            for metric in (
                "calibd_monitor_ece", "calibd_monitor_brier", "calibd_monitor_log_loss", "calibd_monitor_drift_alarm",
                "calibd_monitor_drift_log_evalue", "calibd_feedback_total", "calibd_request_duration_seconds_bucket",
            ):
                assert any(results[e] for e in results if metric + "{" in e or metric + "[" in e), f"no panel data for {metric}"
    assert time.monotonic() - started < 90


def test_prometheus_sees_the_alarm_of_the_one_drifting_segment_and_no_other(own_database_url, tmp_path, name):
    binary = prometheus_binary()
    countries = ("br", "us", "fr", "de")
    with LiveServer(Settings(database_url=own_database_url)) as calibd, httpx.Client(base_url=calibd.url, timeout=60) as client:
        with Prometheus(binary, tmp_path, f"127.0.0.1:{calibd.port}") as prometheus:
            rng = np.random.default_rng(5)
            scores = rng.uniform(0.01, 0.99, 500)
            labels = (rng.uniform(size=500) < scores).astype(int)
            body = {"name": name, "method": "platt", "holdout": {"scores": scores.tolist(), "labels": labels.tolist()},
                    "segments": {"dimensions": ["country"], "max_values": 4}}
            assert client.post("/calibrators", json=body).status_code == 201

            # Calibrated feedback everywhere but in br, whose true logit is the prediction's plus 1.5.
            for batch in range(20):
                p = rng.uniform(0.05, 0.95, 2000)
                country = rng.choice(countries, size=p.shape[0])
                z = np.log(p / (1 - p)) + np.where(country == "br", 1.5, 0.0)
                y = (rng.uniform(size=p.shape[0]) < 1 / (1 + np.exp(-z))).astype(int)
                response = client.post("/feedback", json={
                    "calibrator": name, "probabilities": p.tolist(), "labels": y.tolist(),
                    "segments": {"country": country.tolist()},
                })
                assert response.status_code == 202, response.text
                monitor = client.get(f"/calibrators/{name}/monitor").json()
                if {s["segment"]: s["drift"]["alarm"] for s in monitor["segments"]}.get("br"):
                    break
            else:
                pytest.fail("the br segment's drift test did not alarm on 20 batches of drifting feedback")
            assert not any(s["drift"]["alarm"] for s in monitor["segments"] if s["segment"] != "br")

            selector = f'calibrator="{name}"'

            def alarms() -> dict[str, str]:
                found = prometheus.query(f"calibd_segment_drift_alarm{{{selector}}}")
                return {r["metric"]["segment"]: r["value"][1] for r in found}

            seen = prometheus.wait_for(
                "every segment's alarm in Prometheus, br's at 1",
                lambda: (lambda a: a if set(a) == set(countries) and a["br"] == "1" else None)(alarms()),
            )
            assert seen == {"br": "1", "us": "0", "fr": "0", "de": "0"}
            ece = prometheus.wait_for(
                "calibd_segment_ece samples", lambda: prometheus.query(f'calibd_segment_ece{{{selector}, window="1h"}}')
            )
            by_segment = {r["metric"]["segment"]: float(r["value"][1]) for r in ece}
            assert by_segment["br"] > max(by_segment[c] for c in countries if c != "br")

            def firing() -> list[dict]:
                alerts = httpx.get(f"{prometheus.url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
                return [
                    a for a in alerts
                    if a["labels"]["alertname"] == "CalibrationDriftAlarmSegment" and a["labels"].get("calibrator") == name
                    and a["state"] == "firing"
                ]

            alerts = prometheus.wait_for("the CalibrationDriftAlarmSegment alert to fire", firing)
            assert [(a["labels"]["dimension"], a["labels"]["segment"]) for a in alerts] == [("country", "br")]

            # The dashboard's segment panels have data.
            for expr in dashboard_queries():
                if "calibd_segment_" in expr:
                    assert prometheus.query(grafana_to_promql(expr, name)), expr
