"""The Python client (calibd.client) against calibd served over real HTTP, on SQLite and PostgreSQL.

No fakes: errors come from the service, 503s from a calibd whose database is unreachable,
and the lost answer of the idempotent-retry test from a real TCP proxy that drops it.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from email.utils import format_datetime
from datetime import datetime, timedelta, timezone

import httpx
import numpy as np
import pytest

from calibd import client as client_module
from calibd.api import transfer
from calibd.calibration import from_dict
from calibd.client import (
    AsyncClient,
    Calibration,
    CalibdError,
    Client,
    Conflict,
    ConnectionFailed,
    Forbidden,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    RetryPolicy,
    Unauthorized,
    Unavailable,
    parse_retry_after,
)
from calibd.config import Settings
from calibd.main import create_app
from calibd.storage import keys
from calibd.storage.db import make_engine, make_sessionmaker

from .conftest import LiveServer, free_port

IMPORT_ROUTE = "/calibrators/{name}/import"


def ensure_import_route(live: LiveServer) -> LiveServer:
    """Serve the import route on a running test server if app/main.py does not include it yet
    (test_the_app_serves_the_import_route says whether it does)."""
    app = live.server.config.app
    if IMPORT_ROUTE not in app.openapi()["paths"]:
        app.include_router(transfer.router)
        app.openapi_schema = None
    return live


@pytest.fixture
def calibd(server):
    with Client(ensure_import_route(server).url) as client:
        yield client


def holdout(n=600, seed=0, power=2.0):
    """Scores that are miscalibrated (the true probability is score**power)."""
    rng = np.random.default_rng(seed)
    scores = rng.uniform(0.01, 0.99, n)
    labels = (rng.uniform(size=n) < scores**power).astype(int)
    return scores, labels


def requests_sent(client: Client) -> list[httpx.Request]:
    """Every request the client puts on the wire, retries included (an httpx event hook)."""
    sent: list[httpx.Request] = []
    client.http.event_hooks["request"].append(sent.append)
    return sent


def test_the_app_serves_the_import_route():
    """app/main.py includes calibd.api.transfer's router (the line: `transfer` in the router tuple)."""
    paths = create_app(Settings(database_url="sqlite://")).openapi()["paths"]
    assert IMPORT_ROUTE in paths, "add `transfer` to the router tuple in app/main.py (from .api import transfer)"


def test_fit_calibrate_feedback_evaluate_and_report(calibd, name):
    scores, labels = holdout()
    fitted = calibd.fit(name, scores, labels, method="platt")
    assert (fitted.name, fitted.version, fitted.current, fitted.method, fitted.n_samples) == (name, 1, True, "platt", 600)
    assert set(fitted.before) >= {"ece", "brier", "log_loss"} and fitted.after["ece"] < fitted.before["ece"]
    assert "before=" in repr(fitted) and "holdout" not in repr(fitted)  # a readable repr, without the diagram data

    new = np.array([0.05, 0.5, 0.95])
    result = calibd.calibrate(name, new, ids=["a", "b", "c"])
    assert isinstance(result, Calibration) and isinstance(result.probabilities, np.ndarray)
    assert result.probabilities.shape == (3,) and result.version == 1 and result.calibrator == name
    assert np.array_equal(np.asarray(result), result.probabilities) and len(result) == 3
    assert np.all(np.diff(result.probabilities) > 0)

    receipt = calibd.feedback(name, [0, 1, 1], ids=["a", "b", "zzz"])
    # Labels for predictions the log has not written yet wait for them ("zzz" waits in vain).
    assert receipt.count + receipt.pending == 3 and "zzz" in receipt.unknown_ids and not receipt.replayed
    assert len(receipt.idempotency_key) == 36
    deadline = time.monotonic() + 10
    while calibd.monitor(name)["windows"]["1h"]["samples"] < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    again = calibd.feedback(name, [1], ids=["a"])
    assert (again.count, again.pending, again.duplicate_ids) == (0, 0, ["a"])
    labelled = calibd.feedback(name, labels[:100], probabilities=calibd.calibrate(name, scores[:100]).probabilities)
    assert labelled.count == 100
    assert calibd.monitor(name)["windows"]["1h"]["samples"] == 102

    evaluation = calibd.evaluate(scores, labels, options={"n_bins": 10})
    assert evaluation.values["ece"] == pytest.approx(fitted.before["ece"], abs=0.05)
    assert len(evaluation.reliability["bins"]) == 10

    report = calibd.report(name)
    assert report["calibrator"] == name and report["version"] == 1
    assert calibd.report(name, format="png")[:8] == b"\x89PNG\r\n\x1a\n"
    assert calibd.report(name, format="svg").lstrip().startswith("<?xml")
    assert "<html" in calibd.report(name, format="html").lower()


def test_arrays_of_every_common_kind_are_sent(calibd, name):
    scores, labels = holdout(seed=1)
    calibd.fit(name, scores.astype(np.float32), labels.astype(bool).astype(np.int8), method="isotonic",
               sample_weight=np.ones(600, dtype=np.float16))
    from_list = calibd.calibrate(name, scores[:5].tolist()).probabilities
    from_float32 = calibd.calibrate(name, scores[:5].astype(np.float32)).probabilities
    from_view = calibd.calibrate(name, scores[::-1][-5:][::-1]).probabilities  # a strided view
    assert np.allclose(from_list, from_float32, atol=1e-6) and np.array_equal(from_list, from_view)


def test_multiclass_with_class_names(calibd, name):
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(400, 3)) * 2
    truth = np.exp(logits / 2) / np.exp(logits / 2).sum(axis=1, keepdims=True)
    labels = np.array([rng.choice(["cat", "dog", "eel"], p=p) for p in truth])
    fitted = calibd.fit(name, logits, labels, method="temperature", input="logit", classes=["cat", "dog", "eel"])
    assert fitted.raw["classes"] == ["cat", "dog", "eel"] and fitted.raw["n_classes"] == 3
    result = calibd.calibrate(name, logits[:4], costs=1 - np.eye(3))
    assert result.probabilities.shape == (4, 3) and np.allclose(result.probabilities.sum(axis=1), 1)
    assert result.classes == ["cat", "dog", "eel"]
    expected = [result.classes[k] for k in result.probabilities.argmax(axis=1)]  # 0-1 costs: the likeliest class
    assert result.decisions.tolist() == expected


def test_binary_decisions_threshold_at_the_cost_ratio(calibd, name):
    scores, labels = holdout(seed=15)
    calibd.fit(name, scores, labels, method="platt")
    result = calibd.calibrate(name, np.linspace(0.05, 0.95, 19), costs={"false_positive": 1, "false_negative": 3})
    assert result.decisions.tolist() == (result.probabilities >= 0.25).astype(int).tolist()


def test_calibrators_iterates_over_every_page(calibd, name):
    scores, labels = holdout(200, seed=3)
    names = [f"{name}-{i}" for i in range(3)]
    for each in names:
        calibd.fit(each, scores, labels, method="platt")
    sent = requests_sent(calibd)
    listed = [item["name"] for item in calibd.calibrators(page_size=2)]
    assert [n for n in listed if n in names] == names
    assert listed == sorted(listed) and len(listed) == len(set(listed))
    assert len(sent) == -(-len(listed) // 2)  # a request per page of two
    assert calibd.calibrator(names[0])["current_version"] == 1
    assert calibd.version(names[0], 1)["parameters"]["method"] == "platt"


def test_promote_and_delete(calibd, name):
    scores, labels = holdout(200, seed=4)
    calibd.fit(name, scores, labels, method="platt")
    second = calibd.fit(name, scores, labels, method="isotonic", promote=False)
    assert (second.version, second.current) == (2, False)
    assert calibd.calibrate(name, [0.5]).version == 1
    assert calibd.promote(name, 2)["current_version"] == 2
    assert calibd.calibrate(name, [0.5]).version == 2
    assert calibd.delete(name) is None
    with pytest.raises(NotFound):
        calibd.calibrator(name)


@pytest.mark.parametrize("method", ["auto", "isotonic", "venn_abers", "beta"])
def test_an_export_gives_identical_outputs_offline_and_once_imported(calibd, name, method):
    scores, labels = holdout(seed=5)
    fitted = calibd.fit(name, scores, labels, method=method)
    export = calibd.export(name)
    assert export["format"] == client_module.EXPORT_FORMAT == transfer.EXPORT_FORMAT
    assert export["format_version"] == client_module.EXPORT_FORMAT_VERSION == transfer.EXPORT_FORMAT_VERSION
    assert (export["name"], export["version"], export["method"], export["input"], export["n_classes"]) == (
        name, 1, method, "probability", 2)
    assert export["summary"] == fitted.summary and len(export["holdout_sha256"]) == 64

    probe = np.linspace(0.0, 1.0, 101)
    served = calibd.calibrate(name, probe)
    offline = from_dict(export["parameters"])
    assert np.array_equal(offline.predict(probe), served.probabilities)  # bit for bit

    copy = f"{name}-copy"
    imported = calibd.import_calibrator(export, name=copy)
    assert (imported.name, imported.version, imported.current, imported.method) == (copy, 1, True, method)
    assert imported.summary["imported"] == {key: export[key] for key in ("name", "version", "created_at", "exported_at", "calibd_version")}
    stored = calibd.version(copy, 1)
    assert stored["parameters"] == export["parameters"] and stored["holdout_sha256"] == export["holdout_sha256"]
    again = calibd.calibrate(copy, probe)
    assert np.array_equal(again.probabilities, served.probabilities)
    assert again.extras.keys() == served.extras.keys()
    for key in served.extras:
        assert np.array_equal(again.extras[key], served.extras[key])
    if method == "venn_abers":
        assert served.intervals.shape == (101, 2)  # extras read as attributes
    assert calibd.report(copy)["holdout"] == calibd.report(name)["holdout"]

    # Into an existing name it is the next version; promote=False leaves the current one serving.
    back = calibd.import_calibrator(export, promote=False)
    assert (back.name, back.version, back.current) == (name, 2, False)


def test_an_import_that_does_not_load_is_refused_and_writes_nothing(calibd, name, row_counts):
    scores, labels = holdout(seed=6)
    calibd.fit(name, scores, labels, method="platt")
    export = calibd.export(name)
    before = row_counts()

    def tampered(**changes):
        return {**export, **changes}

    cases = [
        (tampered(format="something-else"), "/format"),
        (tampered(format_version=2), "/format_version"),
        (tampered(method="isotonic"), "/parameters/method"),
        (tampered(input="logit"), "/input"),
        (tampered(n_classes=3), "/n_classes"),
        (tampered(holdout_sha256="not-a-digest"), "/holdout_sha256"),
        (tampered(parameters={**export["parameters"], "state": {}}), "/parameters"),
        (tampered(parameters={**export["parameters"], "params": {"no_such_option": 1}}), "/parameters"),
        (tampered(parameters={**export["parameters"], "state": {"a_": "x", "b_": [1, 2]}}), "/parameters/state/a_"),
        (tampered(parameters={**export["parameters"], "method": "no-such-method"}), "/parameters/method"),
        ({key: value for key, value in export.items() if key != "parameters"}, "/parameters"),
    ]
    for document, pointer in cases:
        with pytest.raises(InvalidInput) as refused:
            calibd.import_calibrator(document, name=f"{name}-bad")
        assert refused.value.status == 422
        assert [e["pointer"] for e in refused.value.errors][:1] == [pointer], (pointer, refused.value.problem)
    assert row_counts() == before


def test_errors_are_typed_and_carry_the_problem_details(calibd, name):
    with pytest.raises(NotFound) as missing:
        calibd.calibrate("no-such-calibrator", [0.5])
    error = missing.value
    assert isinstance(error, CalibdError) and error.status == 404 and error.title == "Not Found"
    assert "does not exist" in error.detail and error.type == "urn:calibd:problem:not-found"
    assert str(error).startswith("404 Not Found: ")

    scores, labels = holdout(seed=7)
    calibd.fit(name, scores, labels, method="platt", promote=False)
    with pytest.raises(Conflict) as no_current:
        calibd.calibrate(name, [0.5])
    assert no_current.value.status == 409

    with pytest.raises(InvalidInput) as invalid:
        calibd.calibrate(name, [0.5, float("nan")], version=1)
    assert invalid.value.status == 422 and invalid.value.errors[0]["pointer"] == "/scores/1"
    with pytest.raises(InvalidInput) as bad_fit:
        calibd.fit(name, [0.1, 1.5] * 10, [0, 1] * 10, method="platt")
    assert bad_fit.value.errors[0]["pointer"] == "/holdout/scores/1"
    with pytest.raises(InvalidInput) as bad_name:
        calibd.fit("Not A Name", scores, labels)
    assert bad_name.value.errors[0]["pointer"] == "/name"


def test_a_body_over_the_limit_is_payload_too_large(database_url, name):
    with LiveServer(Settings(database_url=database_url, max_body_bytes=2000)) as live, Client(live.url) as calibd:
        scores, labels = holdout(400, seed=8)
        with pytest.raises(PayloadTooLarge) as too_large:
            calibd.fit(name, scores, labels, method="platt")
        assert too_large.value.status == 413 and "CALIBD_MAX_BODY_BYTES" in too_large.value.detail


def test_api_keys_are_sent_from_the_environment(isolated_database_url, name, monkeypatch):
    sessions = make_sessionmaker(make_engine(isolated_database_url))
    admin, _ = keys.create_key(sessions, ["admin"])
    reader, _ = keys.create_key(sessions, ["read"])
    scores, labels = holdout(200, seed=9)
    with LiveServer(Settings(database_url=isolated_database_url)) as live:
        monkeypatch.delenv("CALIBD_API_KEY", raising=False)
        with Client(live.url) as anonymous, pytest.raises(Unauthorized) as unauthorized:
            anonymous.fit(name, scores, labels, method="platt")
        assert unauthorized.value.status == 401 and "API key" in unauthorized.value.detail
        with Client(live.url, api_key=reader) as read_only, pytest.raises(Forbidden) as forbidden:
            read_only.fit(name, scores, labels, method="platt")
        assert forbidden.value.status == 403 and "'admin'" in forbidden.value.detail
        monkeypatch.setenv("CALIBD_URL", live.url)
        monkeypatch.setenv("CALIBD_API_KEY", admin)
        with Client() as from_environment:
            assert from_environment.url == live.url
            assert from_environment.fit(name, scores, labels, method="platt").version == 1
            created = from_environment.create_key(["calibrate"], description="client test")
            assert created["key"].startswith("calibd_")
            assert created["key_id"] in [k["key_id"] for k in from_environment.keys()]
            from_environment.revoke_key(created["key_id"])


def test_defaults_without_environment(monkeypatch):
    monkeypatch.delenv("CALIBD_URL", raising=False)
    monkeypatch.delenv("CALIBD_API_KEY", raising=False)
    with Client() as calibd:
        assert calibd.url == "http://127.0.0.1:8000" and "Authorization" not in calibd.http.headers
    with Client("http://example.invalid:9/", api_key="calibd_x_y") as calibd:
        assert calibd.url == "http://example.invalid:9" and calibd.http.headers["Authorization"] == "Bearer calibd_x_y"


# -- retries ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def unavailable():
    """calibd whose database is unreachable: every keyed route answers 503 with Retry-After: 5."""
    url = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/none?connect_timeout=1"
    with LiveServer(Settings(database_url=url)) as live:
        yield live


def test_503_is_retried_a_bounded_number_of_times_for_idempotent_calls(unavailable):
    with Client(unavailable.url, retries=2, max_retry_delay=0.01) as calibd:
        sent = requests_sent(calibd)
        for call in (
            lambda: list(calibd.calibrators()),
            lambda: calibd.calibrate("x", [0.5]),
            lambda: calibd.evaluate([0.2, 0.8], [0, 1]),
            lambda: calibd.feedback("x", [1], probabilities=[0.5]),
        ):
            sent.clear()
            with pytest.raises(Unavailable) as error:
                call()
            assert len(sent) == 3  # the first attempt and two retries
            assert error.value.status == 503 and error.value.retry_after == 5.0
            assert error.value.title == "Service Unavailable" and "API keys" in error.value.detail
        feedback_keys = {request.headers["Idempotency-Key"] for request in sent}
        assert len(feedback_keys) == 1  # one key across the retries of one call


def test_fits_and_other_writes_are_not_retried_after_a_503(unavailable):
    with Client(ensure_import_route(unavailable).url, retries=2, max_retry_delay=0.01) as calibd:
        sent = requests_sent(calibd)
        for call in (
            lambda: calibd.fit("x", [0.2, 0.8] * 10, [0, 1] * 10, method="platt"),
            lambda: calibd.promote("x", 1),
            lambda: calibd.delete("x"),
            lambda: calibd.import_calibrator({"name": "x"}),
        ):
            sent.clear()
            with pytest.raises(Unavailable):
                call()
            assert len(sent) == 1


def test_the_wait_honours_retry_after(unavailable):
    # backoff 0: without Retry-After a retry would follow at once; Retry-After: 5, capped at 0.5 s, is waited.
    with Client(unavailable.url, retries=1, backoff=0.0, max_retry_delay=0.5) as calibd:
        started = time.monotonic()
        with pytest.raises(Unavailable):
            calibd.calibrate("x", [0.5])
        assert time.monotonic() - started >= 0.5


def test_retry_policy_arithmetic():
    policy = RetryPolicy(retries=3, backoff=0.5, max_delay=30)
    assert policy.wait(0, 5.0) == 5.0 and policy.wait(0, 120.0) == 30.0 and policy.wait(3, 5.0) is None
    assert 0.25 <= policy.wait(0, None) <= 0.5 and 1.0 <= policy.wait(2, None) <= 2.0
    assert parse_retry_after("7") == 7.0 and parse_retry_after("soon") is None and parse_retry_after(None) is None
    later = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=20), usegmt=True)
    assert 15 <= parse_retry_after(later) <= 20


def test_a_connection_that_cannot_be_made_is_retried_for_any_call_then_reported():
    with Client(f"http://127.0.0.1:{free_port()}", retries=2, backoff=0.01) as calibd:
        sent = requests_sent(calibd)
        with pytest.raises(ConnectionFailed) as error:
            calibd.fit("x", [0.2, 0.8] * 10, [0, 1] * 10, method="platt")  # nothing was sent: safe even for a fit
        assert len(sent) == 3 and error.value.status is None and isinstance(error.value, Unavailable)
        assert "cannot reach" in str(error.value)


class DroppingProxy:
    """A TCP proxy to calibd that forwards the first request but drops its answer (closing the
    connection once the answer starts, so the service has done its work), then relays normally."""

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.dropped = 0
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            drop = self.connections == 1
            threading.Thread(target=self._pump, args=(downstream, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, downstream, drop), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, drop: bool) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if drop:
                    self.dropped += 1
                    break
                target.sendall(data)
        except OSError:
            pass
        for end in (source, target):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            end.close()

    def close(self) -> None:
        self.listener.close()


def test_a_feedback_retried_after_a_lost_answer_is_counted_once(calibd, server, name):
    scores, labels = holdout(seed=10)
    calibd.fit(name, scores, labels, method="platt")
    probabilities = calibd.calibrate(name, scores[:50]).probabilities
    proxy = DroppingProxy(server.port)
    try:
        with Client(f"http://127.0.0.1:{proxy.port}", retries=2, backoff=0.01) as flaky:
            sent = requests_sent(flaky)
            receipt = flaky.feedback(name, labels[:50], probabilities=probabilities)
    finally:
        proxy.close()
    assert proxy.dropped == 1 and len(sent) == 2  # the answer was lost once and the call retried
    assert sent[0].headers["Idempotency-Key"] == sent[1].headers["Idempotency-Key"] == receipt.idempotency_key
    assert receipt.count == 50 and receipt.replayed  # the service answered the retry from its record
    assert calibd.monitor(name)["windows"]["1h"]["samples"] == 50  # counted once
    calibd.feedback(name, labels[:50], probabilities=probabilities)  # a new call is a new key: counted again
    assert calibd.monitor(name)["windows"]["1h"]["samples"] == 100


def test_a_fit_whose_answer_is_lost_is_not_retried(server, name):
    scores, labels = holdout(200, seed=11)
    proxy = DroppingProxy(server.port)
    try:
        with Client(f"http://127.0.0.1:{proxy.port}", retries=2, backoff=0.01) as flaky:
            sent = requests_sent(flaky)
            with pytest.raises(ConnectionFailed) as lost:
                flaky.fit(name, scores, labels, method="platt")
    finally:
        proxy.close()
    assert len(sent) == 1 and "lost the connection" in str(lost.value)
    with Client(server.url) as calibd:
        assert calibd.calibrator(name)["latest_version"] == 1  # the one fit happened, once


# -- jobs, files and the async client ----------------------------------------------------------


def test_fit_file_reports_the_upload_and_the_fit(calibd, name, tmp_path):
    scores, labels = holdout(3000, seed=12)
    path = tmp_path / "holdout.csv"
    path.write_text("label,score\n" + "".join(f"{y},{s!r}\n" for y, s in zip(labels.tolist(), scores.tolist())))
    events = []
    fitted = calibd.fit_file(name, path, method="isotonic", progress=lambda *event: events.append(event))
    assert fitted.version == 1 and fitted.n_samples == 3000
    uploads = [fraction for stage, fraction, _ in events if stage == "upload"]
    assert uploads[-1] == 1.0 and uploads == sorted(uploads)
    assert ("fit", None, None) in events and events.index(("fit", None, None)) > len(uploads) - 1
    as_job = calibd.fit_file(name, path, method="isotonic", job=True)  # the same fit as a job
    assert as_job.version == 2 and as_job.raw["holdout_sha256"] == fitted.raw["holdout_sha256"]


def test_a_fit_job_is_followed_to_its_end(calibd, name):
    scores, labels = holdout(200_000, seed=14)
    events = []
    fitted = calibd.fit(name, scores, labels, method="isotonic", job=True, progress=lambda *event: events.append(event))
    assert fitted.version == 1 and fitted.n_samples == 200_000
    states = [stage for stage, _, _ in events]
    assert states[0] == "fit" and set(states[1:]) <= {"queued", "running"} and len(states) > 1
    fractions = [fraction for stage, fraction, _ in events if stage == "running"]
    assert fractions == sorted(fractions)
    with pytest.raises(InvalidInput) as failed:  # a job that fails raises its problem
        calibd.fit(name, [0.2, 1.5] * 20, [0, 1] * 20, method="platt", job=True)
    assert failed.value.errors[0]["pointer"] == "/holdout/scores/1"


def test_the_async_client_has_the_same_methods(server, name):
    ensure_import_route(server)
    scores, labels = holdout(seed=13)

    async def run():
        async with AsyncClient(server.url) as calibd:
            fitted = await calibd.fit(name, scores, labels, method="platt")
            result = await calibd.calibrate(name, scores[:10])
            names = [item["name"] async for item in calibd.calibrators(page_size=1000)]
            export = await calibd.export(name)
            imported = await calibd.import_calibrator(export, name=f"{name}-copy")
            receipt = await calibd.feedback(name, labels[:10], probabilities=result.probabilities)
            try:
                await calibd.calibrate("no-such-calibrator", [0.5])
            except NotFound as error:
                missing = error
            return fitted, result, names, export, imported, receipt, missing

    fitted, result, names, export, imported, receipt, missing = asyncio.run(run())
    with Client(server.url) as sync:
        assert np.array_equal(result.probabilities, sync.calibrate(name, scores[:10]).probabilities)
    assert fitted.version == 1 and name in names and imported.version == 1 and receipt.count == 10
    assert export["parameters"]["method"] == "platt" and missing.status == 404
    sync_methods = {m for m in dir(Client) if not m.startswith("_")}
    async_methods = {m for m in dir(AsyncClient) if not m.startswith("_")}
    assert sync_methods - {"close"} == async_methods - {"aclose"}
