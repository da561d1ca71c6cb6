"""Label timing: monitors see mature predictions in prediction-time order, whatever order labels arrive in.

Through the real API on both databases: positives' labels first and negatives' at the end of a short window.
With the window declared, no alarm and windows equal to numpy's ECE of the same rows; without one, the
monitor names the label delay difference. Storage level, with hypothesis: the window sums equal a plain
recomputation over the mature rows for random arrival orders, duplicates, early and late labels and restarts.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from .conftest import stored_platt_version

N_BINS = 15


def numpy_bins(p: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Counts, sums of p and sums of y per equal-width bin [k/15, (k+1)/15), the last one closed."""
    b = np.minimum((p * N_BINS).astype(int), N_BINS - 1)
    return (np.bincount(b, minlength=N_BINS), np.bincount(b, weights=p, minlength=N_BINS),
            np.bincount(b, weights=y, minlength=N_BINS))


def numpy_ece(p: np.ndarray, y: np.ndarray) -> float:
    n, sp, sy = numpy_bins(p, y)
    return float(np.abs(sy - sp).sum() / n.sum())


def fit_calibrated(client, name: str, labels: dict | None = None) -> None:
    """Platt on calibrated scores: the identity, nearly (the model is calibrated, the null holds)."""
    rng = np.random.default_rng(1)
    p = rng.beta(2, 5, 4000)
    y = (rng.uniform(size=p.shape[0]) < p).astype(int)
    body = {"name": name, "method": "platt", "holdout": {"scores": p.tolist(), "labels": y.tolist()}}
    if labels is not None:
        body["labels"] = labels
    response = client.post("/calibrators", json=body)
    assert response.status_code == 201, response.text


def serve_and_label(client, name: str, batches: int, n: int, negatives_after: float, seed: int):
    """Calibrate batches with ids, label positives at once and negatives ``negatives_after`` seconds later;
    returns the served probabilities and the labels drawn from them."""
    rng = np.random.default_rng(seed)
    served, drawn = [], []
    for b in range(batches):
        ids = [f"{name}-{b}-{i}" for i in range(n)]
        scores = rng.beta(2, 5, n)
        answer = client.post("/calibrate", json={"calibrator": name, "scores": scores.tolist(), "ids": ids})
        assert answer.status_code == 200, answer.text
        q = np.asarray(answer.json()["probabilities"])
        y = (rng.uniform(size=n) < q).astype(int)
        served.append(q)
        drawn.append(y)
        time.sleep(0.3)  # the prediction log is written every 0.2 s
        positives = [i for i, label in zip(ids, y) if label == 1]
        if positives:
            sent = client.post("/feedback", json={"calibrator": name, "ids": positives, "labels": [1] * len(positives)})
            assert sent.status_code == 202, sent.text
        time.sleep(negatives_after)
        negatives = [i for i, label in zip(ids, y) if label == 0]
        sent = client.post("/feedback", json={"calibrator": name, "ids": negatives, "labels": [0] * len(negatives)})
        assert sent.status_code == 202, sent.text
        assert sent.json().get("late_ids", []) == []
    return np.concatenate(served), np.concatenate(drawn)


def wait_for(client, name: str, condition, timeout: float = 15.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        monitor = client.get(f"/calibrators/{name}/monitor").json()
        if condition(monitor) or time.monotonic() > deadline:
            return monitor
        time.sleep(0.25)


def test_with_a_window_delayed_negatives_raise_no_alarm_and_the_windows_are_numpys(client, name):
    fit_calibrated(client, name, labels={"window": "3s", "missing": "negative"})
    shown = client.get(f"/calibrators/{name}").json()["labels"]
    assert shown == {"window": "3s", "window_seconds": 3.0, "missing": "negative"}
    q, y = serve_and_label(client, name, batches=3, n=400, negatives_after=1.2, seed=2)
    monitor = wait_for(client, name, lambda m: m["windows"]["last_10000"]["samples"] == q.shape[0]
                       and m["labels"]["waiting_labels"] == 0)
    assert monitor["windows"]["last_10000"]["samples"] == q.shape[0]
    assert monitor["windows"]["last_10000"]["ece"] == pytest.approx(numpy_ece(q, y), abs=1e-9)
    assert monitor["drift"]["alarm"] is False and monitor["drift"]["samples"] == q.shape[0]
    timing = monitor["labels"]
    assert timing["late_labels"] == 0 and timing["implied_negatives"] == 0 and timing["delay_mismatch"] is False
    # Positives came at once, negatives 1.2 s later: the delays say so.
    assert timing["delays"]["1"]["count"] == int(y.sum()) and timing["delays"]["0"]["count"] == int((1 - y).sum())
    assert timing["delays"]["0"]["p50_seconds"] > timing["delays"]["1"]["p50_seconds"]
    # A label after maturity is late: counted, left out.
    late = client.post("/feedback", json={"calibrator": name, "ids": [f"{name}-0-0"], "labels": [1]})
    assert late.status_code == 202 and late.json()["late_ids"] == [f"{name}-0-0"] and late.json()["count"] == 0
    after = client.get(f"/calibrators/{name}/monitor").json()
    assert after["labels"]["late_labels"] == 1
    assert after["windows"]["last_10000"] == monitor["windows"]["last_10000"]
    metrics = client.get("/metrics").text
    assert f'calibd_late_labels_total{{calibrator="{name}"}} 1.0' in metrics
    assert f'calibd_label_backlog_labels{{calibrator="{name}"}} 0.0' in metrics


def test_without_a_window_the_monitor_names_the_label_delay_difference(client, name):
    fit_calibrated(client, name)
    serve_and_label(client, name, batches=2, n=300, negatives_after=1.5, seed=3)
    monitor = client.get(f"/calibrators/{name}/monitor").json()
    timing = monitor["labels"]
    assert timing["window"] is None and timing["delay_mismatch"] is True
    assert "labels.window" in timing["diagnostic"] and "PUT /calibrators/" in timing["diagnostic"]
    metrics = client.get("/metrics").text
    assert f'calibd_label_delay_mismatch{{calibrator="{name}"}} 1.0' in metrics
    assert f'calibd_label_delay_seconds{{calibrator="{name}",label="0",quantile="0.5"}}' in metrics
    # Declaring a window clears the diagnostic (the delays stay measured).
    answer = client.put(f"/calibrators/{name}/labels", json={"window": "2m", "missing": "unlabelled"})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"window": "2m", "window_seconds": 120.0, "missing": "unlabelled"}
    assert client.get(f"/calibrators/{name}/monitor").json()["labels"]["delay_mismatch"] is False


@pytest.mark.parametrize(
    "labels, pointer",
    [({"window": "0s"}, "/labels/window"), ({"window": "91d"}, "/labels/window"), ({"window": "7 weeks"}, "/labels/window"),
     ({"window": "7d", "missing": "maybe"}, "/labels/missing"), ({"windw": "7d"}, "/labels/windw"), ("7d", "/labels")],
)
def test_bad_label_settings_are_422s_naming_the_field(client, name, labels, pointer):
    body = {"name": name, "method": "platt", "holdout": {"scores": [0.1, 0.9, 0.4, 0.6], "labels": [0, 1, 0, 1]},
            "labels": labels}
    answer = client.post("/calibrators", json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["errors"][0]["pointer"] == pointer
    assert client.get(f"/calibrators/{name}").status_code == 404  # nothing left behind
    if isinstance(labels, dict):  # the same settings, changed later
        fit_calibrated(client, name)
        put = client.put(f"/calibrators/{name}/labels", json=labels)
        assert put.status_code == 422
        assert put.json()["errors"][0]["pointer"] == pointer.removeprefix("/labels")
        assert client.get(f"/calibrators/{name}").json()["labels"]["window"] is None


def test_self_contained_feedback_with_predicted_at_waits_and_without_is_mature_on_arrival(client, name):
    fit_calibrated(client, name, labels={"window": "2s"})
    now = datetime.now(timezone.utc)
    waiting = client.post("/feedback", json={"calibrator": name, "probabilities": [0.2, 0.7], "labels": [0, 1],
                                             "predicted_at": now.isoformat()})
    assert waiting.status_code == 202 and waiting.json()["count"] == 2
    at_once = client.post("/feedback", json={"calibrator": name, "probabilities": [0.4], "labels": [1]})
    assert at_once.status_code == 202
    monitor = client.get(f"/calibrators/{name}/monitor").json()
    assert monitor["windows"]["last_10000"]["samples"] == 1 and monitor["labels"]["waiting_labels"] == 2
    monitor = wait_for(client, name, lambda m: m["windows"]["last_10000"]["samples"] == 3)
    assert monitor["windows"]["last_10000"]["samples"] == 3 and monitor["labels"]["waiting_labels"] == 0
    past = (now - timedelta(hours=1)).isoformat()
    late = client.post("/feedback", json={"calibrator": name, "probabilities": [0.5], "labels": [1], "predicted_at": [past]})
    assert late.status_code == 202 and late.json()["count"] == 0
    assert client.get(f"/calibrators/{name}/monitor").json()["labels"]["late_labels"] == 1
    future = (now + timedelta(hours=1)).isoformat()
    bad = client.post("/feedback", json={"calibrator": name, "probabilities": [0.5], "labels": [1], "predicted_at": future})
    assert bad.status_code == 422 and bad.json()["errors"][0]["pointer"] == "/predicted_at"
    bad = client.post("/feedback", json={"calibrator": name, "probabilities": [0.5, 0.2], "labels": [1, 0],
                                         "predicted_at": [now.isoformat(), "yesterday"]})
    assert bad.status_code == 422 and bad.json()["errors"][0]["pointer"] == "/predicted_at/1"


# -- storage and services, with the clock in hand ------------------------------------------------------
WINDOW = 60.0

event = st.tuples(st.integers(0, 11), st.integers(0, 1), st.floats(-20.0, 130.0))


@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(labels=st.lists(event, min_size=1, max_size=30), matures=st.lists(st.floats(0.0, 250.0), max_size=6),
       restarts=st.lists(st.floats(0.0, 250.0), max_size=2), missing=st.sampled_from(["negative", "unlabelled"]))
def test_window_sums_equal_a_recomputation_over_the_mature_rows(fresh_database, labels, matures, restarts, missing):
    # A database of its own: the servers other tests run on the shared one mature rows by the real clock,
    # which this test's model of the clock does not expect.
    database_url = fresh_database
    from calibd.services import feedback as service
    from calibd.services import label_timing
    from calibd.services.monitoring import DriftSettings
    from calibd.storage import monitor_state, predictions
    from calibd.storage.db import make_engine, make_sessionmaker

    engine = make_engine(database_url)
    sessions = make_sessionmaker(engine)
    info = stored_platt_version(sessions, f"timing-{uuid.uuid4().hex[:12]}", labels=(WINDOW, missing))
    start = datetime.now(timezone.utc) + timedelta(seconds=1)  # after the cursor's start (creation - window)
    rng = np.random.default_rng(len(labels))
    p = rng.uniform(0.01, 0.99, 12)
    served = [start + timedelta(seconds=10.0 * i) for i in range(12)]
    drift = DriftSettings(0.05, 0.1)
    join = service.PendingJoin(drift, timedelta(days=1), timedelta(days=1))
    # Events in time order: each prediction logged when served, labels, maturity passes, restarts.
    events = [(served[i], 0, "log", i, None) for i in range(12)]
    events += [(served[i] + timedelta(seconds=d), 1, "label", i, y) for i, y, d in labels]
    events += [(start + timedelta(seconds=t), 2, "mature", None, None) for t in matures]
    events += [(start + timedelta(seconds=t), 3, "restart", None, None) for t in restarts]
    events.append((start + timedelta(seconds=400), 2, "mature", None, None))
    events.sort(key=lambda e: (e[0], e[1]))

    cursor = start - timedelta(seconds=2)  # below every prediction time
    recorded: dict[int, int] = {}  # prediction -> its label, as the rules say
    logged: set[int] = set()
    late = 0
    try:
        for moment, _, kind, i, y in events:
            if kind == "log":
                row = {"calibrator_id": info.calibrator_id, "version": info.version, "prediction_id": f"p{i}",
                       "probability": float(p[i]), "probabilities": None, "accepted": None, "scores": None,
                       "segments": None, "features": None, "created_at": served[i]}
                predictions.log_predictions(sessions, [row], lambda session: service.join_pending(session, join, moment))
                logged.add(i)
            elif kind == "label":
                service.record_feedback(sessions, calibrator_id=info.calibrator_id, ids=[f"p{i}"], labels=np.array([y]),
                                        prediction_ttl=timedelta(days=1), drift=drift, now=moment)
                if served[i] <= cursor:
                    late += 1
                else:
                    recorded.setdefault(i, y)
            elif kind == "restart":
                engine.dispose()
                engine = make_engine(database_url)
                sessions = make_sessionmaker(engine)
            else:
                label_timing.mature(sessions, drift, now=moment, batch_rows=4, only=[info.calibrator_id])
                cursor = max(cursor, moment - timedelta(seconds=WINDOW))
                mature = [i for i in range(12) if served[i] <= cursor]
                labelled = [i for i in mature if i in recorded or missing == "negative"]
                expected_p = np.array([p[i] for i in labelled])
                expected_y = np.array([recorded.get(i, 0) for i in labelled], dtype=float)
                state = monitor_state.read_version(sessions, info.calibrator_id, info.version)  # as answered
                sums = state.sums
                for window in ("last_10000", "1h"):
                    n, sp, sy = numpy_bins(expected_p, expected_y) if labelled else (np.zeros(N_BINS),) * 3
                    assert np.array_equal(sums[window].count, n), window
                    assert np.allclose(sums[window].sum_probability, sp, atol=1e-12), window
                    assert np.allclose(sums[window].sum_label, sy, atol=1e-12), window
                backlog = state.labels
                assert backlog.late_labels == late
                unlabelled_mature = len([i for i in mature if i not in recorded])
                if missing == "negative":
                    assert backlog.implied_negatives == unlabelled_mature and backlog.unlabelled == 0
                else:
                    assert backlog.unlabelled == unlabelled_mature and backlog.implied_negatives == 0
                # A label that came before its prediction was logged is a pending label (GET .../unmatched-labels
                # counts it), not a waiting one: it waits for maturity once the log write joins it.
                assert backlog.waiting_labels == len([i for i in recorded if i in logged and served[i] > cursor])
        assert cursor >= served[-1]  # the last pass matured everything
    except AssertionError:  # the events of the failing case, in seconds from the start
        note(repr([(round((m - start).total_seconds(), 6), k, i, y) for m, _, k, i, y in events]))
        raise
    finally:
        engine.dispose()


def test_the_client_and_the_cli_show_and_set_the_label_window(server, client, name, capsys):
    from calibd.cli import main
    from calibd.client import Client

    fit_calibrated(client, name)
    with Client(server.url) as calibd:
        assert calibd.set_labels(name, "7d", "unlabelled") == {"window": "7d", "window_seconds": 604800.0,
                                                               "missing": "unlabelled"}
        assert calibd.calibrator(name)["labels"]["window"] == "7d"
    assert main(["labels", name, "--url", server.url]) == 0
    assert "label window 7d" in capsys.readouterr().out
    assert main(["labels", name, "--window", "none", "--url", server.url]) == 0
    assert "final on arrival" in capsys.readouterr().out
    assert client.get(f"/calibrators/{name}").json()["labels"] == {"window": None, "window_seconds": None,
                                                                  "missing": "negative"}


# -- the closed loop under delayed negatives -----------------------------------------------------------
def logit_stream(n: int, seed: int, shift: float = 0.0):
    rng = np.random.default_rng(seed)
    z = rng.normal(-1.0, 1.5, n)
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-(z + shift)))).astype(int)
    return z, y


def clicks(http, name: str, tag: str, z: np.ndarray, y: np.ndarray) -> None:
    """Serve with ids, then send the positives' labels only: a negative is a click that never comes."""
    ids = [f"{tag}-{i}" for i in range(z.shape[0])]
    assert http.post("/calibrate", json={"calibrator": name, "scores": z.tolist(), "ids": ids}).status_code == 200
    time.sleep(0.3)  # the prediction log is written every 0.2 s
    positives = [i for i, label in zip(ids, y) if label == 1]
    answer = http.post("/feedback", json={"calibrator": name, "ids": positives, "labels": [1] * len(positives)})
    receipt = answer.json()
    # Labels whose prediction is not logged yet wait as pending labels, and are joined when it is.
    assert answer.status_code == 202 and receipt["count"] + receipt["pending"] == len(positives), answer.text


def test_the_closed_loop_refits_on_mature_rows_only(database_url, name):
    import httpx

    from calibd.config import Settings
    from calibd.metrics import log_loss

    from .conftest import LiveServer

    settings = Settings(database_url=database_url, recalibration_interval_seconds=0.3, label_maturity_seconds=0.3)
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=120) as http:
        z, y = logit_stream(3000, 1)
        fit = {"name": name, "method": "platt", "input": "logit", "labels": {"window": "6s", "missing": "negative"},
               "holdout": {"scores": z.tolist(), "labels": y.tolist()}}
        assert http.post("/calibrators", json=fit).status_code == 201
        policy = {"trigger": "alarm", "refit_rows": 3000, "min_refit_rows": 1000, "shadow_rows": 2000, "margin": 0.001}
        assert http.put(f"/calibrators/{name}/recalibration", json=policy).status_code == 200

        # Calibrated, with only the positives ever labelled: nothing to refit.
        for batch in range(6):
            clicks(http, name, f"calm-{batch}", *logit_stream(1000, 10 + batch))
        monitor = wait_for(http, name, lambda m: m["labels"]["implied_negatives"] > 0 and m["labels"]["waiting_labels"] == 0
                           and m["drift"]["samples"] >= 6000, timeout=40)
        assert monitor["drift"]["samples"] >= 6000 and monitor["drift"]["alarm"] is False, monitor["drift"]
        assert http.get(f"/calibrators/{name}/recalibration").json()["events"] == []

        # The world shifts: the alarm fires on mature rows, the refit and shadow rows are mature (with implied
        # negatives, else a refit on positives alone fails), and the promoted version is better.
        for batch in range(40):
            clicks(http, name, f"shift-{batch}", *logit_stream(1000, 100 + batch, shift=1.0))
            events = [e["outcome"] for e in http.get(f"/calibrators/{name}/recalibration").json()["events"]]
            if "promoted" in events:
                break
            time.sleep(0.2)
        state = http.get(f"/calibrators/{name}/recalibration").json()
        outcomes = [e["outcome"] for e in reversed(state["events"])]
        assert outcomes[:2] == ["refit", "promoted"], state
        z_new, y_new = logit_stream(20_000, 999, shift=1.0)
        old = np.array(http.post("/calibrate", json={"calibrator": name, "version": 1, "scores": z_new.tolist()}).json()["probabilities"])
        new = np.array(http.post("/calibrate", json={"calibrator": name, "scores": z_new.tolist()}).json()["probabilities"])
        assert log_loss(new, y_new) < log_loss(old, y_new)
        assert numpy_ece(new, y_new) < numpy_ece(old, y_new)
        # The session's shared server matures this database too: its backlog would turn into implied
        # negatives during later tests, which count rows to show that a refused request wrote none.
        assert http.delete(f"/calibrators/{name}").status_code == 204


def test_a_monitor_answer_is_one_snapshot_while_labels_are_written(fresh_database):
    """The windows, the drift test and the backlog of one answer are read from one snapshot: a label batch
    committed during the read is in all of them or in none (PostgreSQL reads each statement at its own
    snapshot by default; the monitor's reads would straddle a commit)."""
    import threading

    from calibd.services import feedback as service
    from calibd.services import monitoring
    from calibd.services.monitoring import DriftSettings
    from calibd.storage.db import make_engine, make_sessionmaker
    from calibd.storage.feedback import LabelledBatch

    engine = make_engine(fresh_database)
    sessions = make_sessionmaker(engine)
    info = stored_platt_version(sessions, "snapshot")
    drift = DriftSettings(0.05, 0.1)
    rng = np.random.default_rng(4)

    def write() -> None:
        for _ in range(150):
            p = rng.uniform(0.01, 0.99, 20)
            batch = LabelledBatch(info.version, p, (rng.uniform(size=20) < p).astype(np.int64))
            service.record_feedback(sessions, calibrator_id=info.calibrator_id, batches=[batch],
                                    prediction_ttl=timedelta(days=1), drift=drift)
            time.sleep(0.005)  # SQLite's write lock goes to whoever asks first: leave the reader turns

    def read() -> tuple[int, int, int]:
        answer = monitoring.monitor(sessions, info.calibrator_id, info.version, True, 0.05)
        return (answer["windows"]["1h"]["samples"], answer["windows"]["last_10000"]["samples"],
                answer["drift"]["samples"])

    writer = threading.Thread(target=write)
    writer.start()
    seen = []
    try:
        deadline = time.monotonic() + 120
        while writer.is_alive() and time.monotonic() < deadline:
            seen.append(read())
            time.sleep(0.01)  # SQLite: each read takes the write lock; the writer gets it between reads
        writer.join()
        final = read()
    finally:
        engine.dispose()
    assert final == (3000, 3000, 3000) and len(seen) >= 5
    assert [s for s in seen if len(set(s)) > 1] == []


def test_labels_waiting_when_the_window_is_removed_mature_once_with_two_processes_maturing(fresh_database):
    """Every serving process may mature. With the window removed, what waited matures at once, and two
    passes at the same moment must not both feed it: each waiting label reaches the monitors once."""
    import threading

    from calibd.services import feedback as service
    from calibd.services import label_timing, monitoring
    from calibd.services.monitoring import DriftSettings
    from calibd.storage.db import make_engine, make_sessionmaker, transaction
    from calibd.storage.feedback import LabelledBatch

    engine = make_engine(fresh_database)
    sessions = make_sessionmaker(engine)
    info = stored_platt_version(sessions, "removed-window")
    drift = DriftSettings(0.05, 0.1)
    rng = np.random.default_rng(7)
    try:
        for round_ in range(5):
            with transaction(sessions) as session:
                label_timing.set_labels_in(session, "removed-window", label_timing.LabelWindow(3600.0, "negative"))
            now = datetime.now(timezone.utc)
            p = rng.uniform(0.05, 0.95, 200)
            batch = LabelledBatch(info.version, p, (rng.uniform(size=200) < p).astype(np.int64),
                                  predicted_at=[now - timedelta(seconds=60)] * 200)
            service.record_feedback(sessions, calibrator_id=info.calibrator_id, batches=[batch],
                                    prediction_ttl=timedelta(days=1), drift=drift)
            with transaction(sessions) as session:  # the window removed: the 200 waiting labels are mature
                label_timing.set_labels_in(session, "removed-window", label_timing.LabelWindow(None, "negative"))
            start = threading.Barrier(2)
            passes = []

            def mature() -> None:
                start.wait()
                passes.append(label_timing.mature(sessions, drift))

            threads = [threading.Thread(target=mature) for _ in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert sum(each.labelled for each in passes) == 200, (round_, passes)
            answer = monitoring.monitor(sessions, info.calibrator_id, info.version, True, 0.05)
            assert answer["windows"]["1h"]["samples"] == 200 * (round_ + 1), (round_, answer["windows"]["1h"])
            assert answer["drift"]["samples"] == 200 * (round_ + 1), (round_, answer["drift"])
    finally:
        engine.dispose()


def test_the_maturity_check_reads_while_another_writer_holds_sqlite(fresh_database):
    """The serving process asks every second whether there is maturity work: a read, which must not wait
    for (or take) SQLite's write lock, held here by a long write."""
    import sqlite3
    import threading

    from calibd.services import label_timing
    from calibd.storage.db import make_engine, make_sessionmaker

    if not fresh_database.startswith("sqlite"):
        pytest.skip("SQLite's write lock")
    writer = sqlite3.connect(fresh_database.removeprefix("sqlite:///"), isolation_level=None)
    engine = make_engine(fresh_database)
    try:
        writer.execute("BEGIN IMMEDIATE")
        answers: list[bool] = []
        thread = threading.Thread(target=lambda: answers.append(label_timing.has_work(make_sessionmaker(engine))), daemon=True)
        started = time.monotonic()
        thread.start()
        thread.join(5)
        assert answers == [False], f"no answer within {time.monotonic() - started:.1f} s while a writer held the lock"
    finally:
        writer.execute("ROLLBACK")
        thread.join(40)
        writer.close()
        engine.dispose()
