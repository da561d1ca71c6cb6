"""The reliability scenarios: load, crash, database outage, replicas.

Each ``run_*`` sets calibd up as real ``calibd serve`` processes, drives it,
checks what must hold (raising AssertionError with the evidence), and returns
its figures. The tests in ``make test`` call them at a small size; the scripts
in ``benchmarks/reliability/`` at full size, for docs/RELIABILITY.md.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from .harness import (
    PYTHON,
    REPO,
    CalibdProcess,
    PrivatePostgres,
    admin_key,
    fit_body,
    metric_values,
    rows,
    scalar,
    wait_until,
)


def _client(url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120)


def _fit(http: httpx.Client, name: str, seed: int = 0, **extra: Any) -> dict:
    response = http.post("/calibrators", json=fit_body(name, seed=seed, **extra))
    assert response.status_code == 201, response.text
    return response.json()


def _stored_feedback(url: str) -> dict[str, int]:
    return {
        name: int(count)
        for name, count in rows(
            url, "SELECT c.name, count(*) FROM feedback f JOIN calibrators c ON c.id = f.calibrator_id GROUP BY c.name"
        )
    }


def _server_faults(server: CalibdProcess) -> list[str]:
    """5xx answers and error-level log lines of a server (excluding expected 503s)."""
    faults = []
    for record in server.log_records():
        if record.get("logger") == "calibd.access" and record.get("status", 0) >= 500 and record.get("status") != 503:
            faults.append(f"{record['method']} {record['path']} -> {record['status']}")
        elif record.get("level") in ("error", "critical"):
            faults.append(f"{record.get('logger')}: {record.get('message')}")
    return faults


# -- load ----------------------------------------------------------------------------------


def run_load(database_url: str, workdir: Path, seconds: float, concurrency: int = 8, seed: int = 0) -> dict[str, Any]:
    """Mixed traffic from a separate process; zero errors; feedback stored == acknowledged."""
    workdir.mkdir(parents=True, exist_ok=True)
    key = admin_key()
    names = {"load-platt": "platt", "load-isotonic": "isotonic", "load-venn": "venn_abers", "load-fits": "platt"}
    with CalibdProcess(database_url, workdir, name="load", bootstrap_admin_key=key) as server:
        with _client(server.url, key) as http:
            for i, (name, method) in enumerate(names.items()):
                _fit(http, name, seed=i, method=method)
        out = workdir / "load-result.json"
        command = [
            PYTHON, "-m", "tests.reliability.load_client", "--url", server.url, "--key", key,
            "--seconds", str(seconds), "--concurrency", str(concurrency), "--seed", str(seed),
            "--calibrators", ",".join(names), "--fit-name", "load-fits", "--out", str(out),
        ]
        client = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=seconds + 600)
        assert client.returncode == 0, client.stderr[-5000:]
        result = json.loads(out.read_text())
        waiting = "SELECT count(*) FROM pending_labels WHERE unmatched_at IS NULL"
        wait_until(lambda: scalar(database_url, waiting) == 0, 30, 0.2, "labels that came early to be joined")
        metrics = httpx.get(server.url + "/metrics", timeout=60).text
        with _client(server.url, key) as http:
            fits = http.get("/calibrators/load-fits").json()
        faults = _server_faults(server)

    assert result["errors"] == 0, result["error_samples"]
    assert result["requests"] > 0 and all(result["by_kind"].get(kind) for kind in ("calibrate", "feedback", "evaluate", "fit")), result["by_kind"]
    acknowledged = {name: count for name, count in result["feedback_acknowledged"].items() if count}
    stored = _stored_feedback(database_url)
    assert stored == acknowledged, (stored, acknowledged)
    counted = {name: int(sum(metric_values(metrics, "calibd_feedback_total", calibrator=name).values())) for name in names}
    assert {n: c for n, c in counted.items() if c} == acknowledged, (counted, acknowledged)
    # Fits under load: consecutive versions, none lost, none doubled.
    assert [v["version"] for v in fits["versions"]] == list(range(1, result["fits"] + 2))
    assert faults == [], faults[:20]
    return {
        "database": "postgresql" if database_url.startswith("postgresql") else "sqlite",
        "seconds": result["seconds"],
        "concurrency": concurrency,
        "requests": result["requests"],
        "requests_per_second": result["requests_per_second"],
        "by_kind": result["by_kind"],
        "errors": result["errors"],
        "feedback_acknowledged": sum(acknowledged.values()),
        "feedback_stored": sum(stored.values()),
        "feedback_lost": sum(acknowledged.values()) - sum(stored.values()),
        "feedback_by_id_unknown_at_send": result["feedback_unknown_ids"],
        "fits": result["fits"],
        "latency_ms": result["latency_ms"],
        "server_faults": len(faults),
    }


# -- crash -------------------------------------------------------------------------------


def run_crash(database_url: str, workdir: Path, batches: int, kills: int, batch_size: int = 50, concurrency: int = 4) -> dict[str, Any]:
    """kill -9 the server while a client process sends feedback; every acknowledged item is stored, once."""
    workdir.mkdir(parents=True, exist_ok=True)
    key = admin_key()
    server = CalibdProcess(database_url, workdir, name="crash", bootstrap_admin_key=key)
    server.start()
    client: subprocess.Popen | None = None
    try:
        # Half the batches label logged predictions by id (rows carry the id), half send labelled
        # probabilities; each calibrator gets one kind, so rows can be traced to batches.
        with _client(server.url, key) as http:
            _fit(http, "crash-ids", seed=1)
            _fit(http, "crash-probs", seed=2)
            rng = np.random.default_rng(3)
            plan = []
            for i in range(batches):
                if i % 2 == 0:
                    ids = [f"b{i}-{j}" for j in range(batch_size)]
                    served = http.post("/calibrate", json={"calibrator": "crash-ids", "scores": rng.uniform(0, 1, batch_size).tolist(), "ids": ids})
                    assert served.status_code == 200, served.text
                    body = {"calibrator": "crash-ids", "ids": ids, "labels": rng.integers(0, 2, batch_size).tolist()}
                else:
                    p = rng.uniform(0.01, 0.99, batch_size)
                    body = {"calibrator": "crash-probs", "probabilities": p.tolist(), "labels": (rng.uniform(size=batch_size) < p).astype(int).tolist()}
                plan.append({"key": f"crash-batch-{i}", "body": body})
        logged = batch_size * ((batches + 1) // 2)
        count_logged = "SELECT count(*) FROM predictions p JOIN calibrators c ON c.id = p.calibrator_id WHERE c.name = 'crash-ids'"
        wait_until(lambda: scalar(database_url, count_logged) == logged, 60, 0.2, "the prediction log to be written")

        plan_path, acks_path = workdir / "crash-plan.json", workdir / "crash-acks.jsonl"
        plan_path.write_text(json.dumps(plan))
        acks_path.unlink(missing_ok=True)
        client = subprocess.Popen(
            [PYTHON, "-m", "tests.reliability.feedback_client", "--url", server.url, "--key", key, "--plan", str(plan_path),
             "--acks", str(acks_path), "--concurrency", str(concurrency), "--deadline", "900"],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=open(workdir / "crash-client.log", "w"),
        )

        def acknowledged() -> list[dict]:
            if not acks_path.exists():
                return []
            return [json.loads(line) for line in acks_path.read_text().splitlines() if line.strip()]

        kill_log = []
        for k in range(kills):
            target = (k + 1) * batches // (kills + 1)
            wait_until(lambda: len(acknowledged()) >= target, 300, 0.01, f"{target} acknowledged batches")
            before_kill = acknowledged()
            server.kill()
            killed_at = time.monotonic()
            kill_log.append({"acknowledged_before": len(before_kill), "keys": [a["key"] for a in before_kill]})
            time.sleep(0.5)
            server.start()
            kill_log[-1]["down_seconds"] = round(time.monotonic() - killed_at, 2)
        assert client.wait(timeout=900) == 0, (workdir / "crash-client.log").read_text()[-3000:]
        summary = json.loads(Path(str(acks_path) + ".summary").read_text())
        acks = acknowledged()
        faults = _server_faults(server)
    finally:
        if client is not None and client.poll() is None:  # the scenario failed: do not leave it retrying
            client.kill()
            client.wait()
        server.stop()

    # Every batch acknowledged exactly once by the client, with its full count.
    assert sorted(a["batch"] for a in acks) == list(range(batches))
    assert all(a["count"] == batch_size and not a["unknown_ids"] for a in acks), [a for a in acks if a["count"] != batch_size][:5]
    # Rows of the by-id batches: each planned id stored exactly once.
    per_id = dict(rows(database_url, "SELECT f.prediction_id, count(*) FROM feedback f JOIN calibrators c ON c.id = f.calibrator_id WHERE c.name = 'crash-ids' GROUP BY f.prediction_id"))
    expected_ids = {pid for batch in plan if batch["body"]["calibrator"] == "crash-ids" for pid in batch["body"]["ids"]}
    missing = sorted(expected_ids - set(per_id))
    doubled = sorted(pid for pid, n in per_id.items() if n != 1)
    assert not missing and not doubled and set(per_id) == expected_ids, (missing[:10], doubled[:10])
    # Probability batches: the calibrator holds exactly their rows; every acknowledged key is recorded.
    stored = _stored_feedback(database_url)
    acknowledged_items = sum(a["count"] for a in acks)
    assert stored.get("crash-probs", 0) == batch_size * (batches // 2), stored
    assert sum(stored.values()) == acknowledged_items, (stored, acknowledged_items)
    keys = {k for (k,) in rows(database_url, "SELECT key FROM idempotency_keys")}
    calibrator_of = {batch["key"]: batch["body"]["calibrator"] for batch in plan}
    assert {f"{calibrator_of[a['key']]}:{a['key']}" for a in acks} <= keys
    # What was acknowledged before each kill is there (implied by the above; counted for the record).
    before = [len(entry["keys"]) for entry in kill_log]
    assert faults == [], faults[:20]
    return {
        "database": "postgresql" if database_url.startswith("postgresql") else "sqlite",
        "batches": batches,
        "batch_size": batch_size,
        "client_concurrency": concurrency,
        "kills": kills,
        "acknowledged_before_each_kill": before,
        "down_seconds": [entry["down_seconds"] for entry in kill_log],
        "items_acknowledged": acknowledged_items,
        "items_stored": sum(stored.values()),
        "items_lost": acknowledged_items - sum(stored.values()),
        "items_doubled": len(doubled),
        "acknowledged_on_replay": sum(1 for a in acks if a["replayed"]),
        "client_connection_errors": summary["connection_errors"],
        "client_503s": summary["unavailable"],
    }


# -- database outage ---------------------------------------------------------------------------


def run_outage(workdir: Path, outage_seconds: float, warm_seconds: float = 2.0, after_seconds: float = 2.0) -> dict[str, Any]:
    """Stop a private PostgreSQL during traffic: /calibrate keeps serving, /feedback answers 503 then recovers."""
    from calibd.storage import migrate
    from calibd.storage.db import make_engine

    workdir.mkdir(parents=True, exist_ok=True)
    key = admin_key()
    with PrivatePostgres() as postgres:
        engine = make_engine(postgres.url)
        migrate.upgrade(engine)
        engine.dispose()
        server = CalibdProcess(postgres.url, workdir, name="outage", bootstrap_admin_key=key)
        server.start()
        stop = threading.Event()
        threads: list[threading.Thread] = []
        try:
            with _client(server.url, key) as http:
                _fit(http, "outage-model", seed=4)
                assert http.post("/calibrate", json={"calibrator": "outage-model", "scores": [0.5]}).status_code == 200
            pid = server.pid

            calibrations: list[tuple[float, int]] = []
            feedback: list[tuple[float, int, bool]] = []  # (time, status, Retry-After present)
            acks: list[dict] = []
            unexpected: list[str] = []

            def calibrate_loop() -> None:
                rng = np.random.default_rng(5)
                n = 0
                with _client(server.url, key) as http:
                    while not stop.is_set():
                        n += 1
                        ids = [f"o{n}-{j}" for j in range(5)]
                        body = {"calibrator": "outage-model", "scores": rng.uniform(0, 1, 5).tolist(), "ids": ids}
                        try:
                            response = http.post("/calibrate", json=body)
                            calibrations.append((time.monotonic(), response.status_code))
                            if response.status_code != 200:
                                unexpected.append(f"calibrate {response.status_code} {response.text[:200]}")
                        except httpx.HTTPError as error:
                            calibrations.append((time.monotonic(), 0))
                            unexpected.append(f"calibrate {type(error).__name__}: {error}")
                        time.sleep(0.01)

            def feedback_loop() -> None:
                rng = np.random.default_rng(6)
                batch = 0
                with _client(server.url, key) as http:
                    while not stop.is_set():
                        p = rng.uniform(0.01, 0.99, 20)
                        body = {"calibrator": "outage-model", "probabilities": p.tolist(), "labels": (rng.uniform(size=20) < p).astype(int).tolist()}
                        idempotency_key = f"outage-{batch}"
                        while True:  # the same batch, until acknowledged
                            try:
                                response = http.post("/feedback", json=body, headers={"Idempotency-Key": idempotency_key})
                            except httpx.HTTPError as error:
                                unexpected.append(f"feedback {type(error).__name__}: {error}")
                                time.sleep(0.1)
                                continue
                            now = time.monotonic()
                            if response.status_code == 202:
                                feedback.append((now, 202, False))
                                acks.append({"key": idempotency_key, "count": response.json()["count"], "at": now})
                                break
                            if response.status_code == 503:
                                problem = response.headers.get("content-type") == "application/problem+json"
                                feedback.append((now, 503, "Retry-After" in response.headers and problem))
                                time.sleep(0.2)  # faster than Retry-After, to time the recovery
                                if stop.is_set():
                                    break
                                continue
                            unexpected.append(f"feedback {response.status_code} {response.text[:200]}")
                            break
                        batch += 1
                        time.sleep(0.02)

            threads = [threading.Thread(target=calibrate_loop, daemon=True), threading.Thread(target=feedback_loop, daemon=True)]
            for thread in threads:
                thread.start()
            time.sleep(warm_seconds)

            down_at = time.monotonic()
            postgres.stop("immediate")
            stopped_at = time.monotonic()
            # While the database is away: reads and fits answer 503 with Retry-After too; readiness fails.
            time.sleep(min(1.0, outage_seconds / 3))
            with _client(server.url, key) as http:
                during = {
                    "GET /calibrators": http.get("/calibrators"),
                    "POST /calibrators": http.post("/calibrators", json=fit_body("outage-model", seed=9)),
                    "GET /readyz": http.get("/readyz"),
                }
            remaining = outage_seconds - (time.monotonic() - stopped_at)
            if remaining > 0:
                time.sleep(remaining)
            start_seconds = postgres.start()
            back_at = time.monotonic()
            wait_until(lambda: any(t > back_at and s == 202 for t, s, _ in feedback), 120, 0.05, "feedback to succeed again")
            recovered_at = min(t for t, s, _ in feedback if t > back_at and s == 202)
            time.sleep(after_seconds)
            stop.set()
            for thread in threads:
                thread.join(timeout=120)
            with _client(server.url, key) as http:
                ready_after = http.get("/readyz").status_code
                metrics = http.get("/metrics").text
            still_same_process = server.process.poll() is None and server.pid == pid and server.starts == 1
            faults = _server_faults(server)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=120)
            server.stop()
        stored = _stored_feedback(postgres.url)
        idempotency = {k for (k,) in rows(postgres.url, "SELECT key FROM idempotency_keys")}

    outage = [(t, s) for t, s in calibrations if down_at <= t <= back_at]
    refused = [(t, s, retry) for t, s, retry in feedback if s == 503]
    acknowledged = sum(a["count"] for a in acks)
    dropped = sum(metric_values(metrics, "calibd_prediction_log_dropped_total", calibrator="outage-model").values())

    assert unexpected == [], unexpected[:10]
    assert all(s == 200 for _, s in calibrations), Counter(s for _, s in calibrations)
    assert len(outage) >= 10, f"only {len(outage)} /calibrate requests during the outage"
    assert refused and all(retry for _, _, retry in refused), "feedback during the outage must get 503 with Retry-After"
    assert all(down_at - 1 <= t <= recovered_at for t, _, _ in refused), "a 503 outside the outage"
    for what, response in during.items():
        assert response.status_code == 503 and "Retry-After" in response.headers, (what, response.status_code, response.text)
    assert still_same_process, "calibd was restarted"
    assert ready_after == 200
    assert stored.get("outage-model", 0) == acknowledged, (stored, acknowledged)
    assert {f"outage-model:{a['key']}" for a in acks} <= idempotency
    assert dropped > 0, "predictions logged during the outage must be counted as dropped"
    assert faults == [], faults[:20]
    return {
        "outage_seconds": round(back_at - down_at, 2),
        "postgres_restart_seconds": round(start_seconds, 2),
        "calibrate_requests": len(calibrations),
        "calibrate_requests_during_outage": len(outage),
        "calibrate_failures": sum(1 for _, s in calibrations if s != 200),
        "feedback_503_with_retry_after": len(refused),
        "feedback_recovery_seconds": round(recovered_at - back_at, 2),
        "feedback_batches_acknowledged": len(acks),
        "items_acknowledged": acknowledged,
        "items_stored": stored.get("outage-model", 0),
        "items_lost": acknowledged - stored.get("outage-model", 0),
        "prediction_log_dropped": int(dropped),
        "calibd_restarted": not still_same_process,
    }


# -- replicas ----------------------------------------------------------------------------------


def run_replicas(database_url: str, workdir: Path, promotions: int, feedback_batches: int, fits: int = 20) -> dict[str, Any]:
    """Two calibd processes on one database behave as one service."""
    workdir.mkdir(parents=True, exist_ok=True)
    key = admin_key()
    a = CalibdProcess(database_url, workdir, name="replica-a", bootstrap_admin_key=key)
    b = CalibdProcess(database_url, workdir, name="replica-b", bootstrap_admin_key=key)
    with ThreadPoolExecutor(2) as pool:  # both register the bootstrap key at once
        list(pool.map(lambda p: p.start(), (a, b)))
    try:
        clients = [_client(a.url, key), _client(b.url, key)]

        # Concurrent fits of one name, half on each process: versions 1..fits, no duplicate or gap.
        def fit(i: int) -> int:
            with _client((a, b)[i % 2].url, key) as http:
                return _fit(http, "replica-fits", seed=100 + i)["version"]

        with ThreadPoolExecutor(fits) as pool:
            versions = list(pool.map(fit, range(fits)))
        assert sorted(versions) == list(range(1, fits + 1)), sorted(versions)
        for http in clients:
            listed = [v["version"] for v in http.get("/calibrators/replica-fits").json()["versions"]]
            assert listed == list(range(1, fits + 1)), listed

        # Promotions: made on one process, served by the other within a second.
        first, second = clients
        _fit(first, "replica-model", seed=7)
        _fit(first, "replica-model", seed=8, promote=False)

        def served(http: httpx.Client) -> int:
            response = http.post("/calibrate", json={"calibrator": "replica-model", "scores": [0.3]})
            assert response.status_code == 200, response.text
            return response.json()["version"]

        assert served(second) == 1 and served(first) == 1
        delays = []
        for i in range(promotions):
            target = 2 if i % 2 == 0 else 1
            promoter, observer = (first, second) if i % 2 == 0 else (second, first)
            response = promoter.post("/calibrators/replica-model/promote", json={"version": target})
            assert response.status_code == 200, response.text
            promoted = time.monotonic()
            assert served(promoter) == target
            while served(observer) != target:
                assert time.monotonic() - promoted < 1.0, f"promotion {i}: the other process still serves the old version after 1 s"
                time.sleep(0.005)
            delays.append(time.monotonic() - promoted)

        # Monitor values: feedback sent to either process, the same numbers on both.
        rng = np.random.default_rng(9)
        sent = 0
        for i in range(feedback_batches):
            p = rng.uniform(0.01, 0.99, 40)
            y = (rng.uniform(size=40) < np.clip(p + 0.1, 0, 1)).astype(int)
            response = clients[i % 2].post("/feedback", json={"calibrator": "replica-model", "probabilities": p.tolist(), "labels": y.tolist()})
            assert response.status_code == 202, response.text
            sent += response.json()["count"]
        monitors = [http.get("/calibrators/replica-model/monitor").json() for http in clients]
        assert monitors[0] == monitors[1], monitors
        version = monitors[0]["version"]
        assert all(w["samples"] == sent for w in monitors[0]["windows"].values()), monitors[0]["windows"]

        def gauges(http: httpx.Client) -> list[str]:
            text = http.get("/metrics").text
            return sorted(line for line in text.splitlines() if line.startswith("calibd_monitor_") and 'calibrator="replica-model"' in line)

        exported = [gauges(http) for http in clients]
        assert exported[0] == exported[1] and exported[0], exported
        for http in clients:
            http.close()
        faults = _server_faults(a) + _server_faults(b)
    finally:
        a.stop()
        b.stop()
    assert faults == [], faults[:20]
    return {
        "database": "postgresql" if database_url.startswith("postgresql") else "sqlite",
        "concurrent_fits": fits,
        "versions": f"{min(versions)}..{max(versions)}, {len(set(versions))} distinct",
        "promotions": promotions,
        "promotion_delay_seconds": {
            "median": round(statistics.median(delays), 3),
            "mean": round(statistics.fmean(delays), 3),
            "max": round(max(delays), 3),
        },
        "feedback_batches": feedback_batches,
        "feedback_items": sent,
        "monitor_version": version,
        "monitor_identical": True,
        "metrics_gauge_lines_identical": len(exported[0]),
    }
