"""The fast paths of /calibrate, fits and feedback give what the general paths give.

Each shortcut (isotonic's grid lookup, the list and array quick checks, the
multiclass temperature softmax, the JSON-list conversion in the router, the
blocked Newton fit, the unit-weight tie pooling, the log formatter, binary COPY
of feedback) is compared with the code it stands in for: identical outputs (or
within 1e-12), and the same errors for the same bad input.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from calibd.api.bodies import float_array
from calibd.api.logs import JsonFormatter, _utc_milliseconds, format_access, new_request_id, request_id
from calibd.api.pending_metrics import PendingCounter, PendingCounters, PendingHistogram
from calibd.calibration import kernels
from calibd.calibration._logistic import fit_logistic
from calibd.calibration._multiclass import as_logits, softmax
from calibd.calibration.base import Calibrator
from calibd.inputs import CalibrationInputError
from calibd.calibration.isotonic import IsotonicCalibrator, _GridLookup, _pool_unit_weights, _slopes, pool_ties
from calibd.calibration.platt import PlattCalibrator
from calibd.calibration.temperature import TemperatureCalibrator
from calibd.storage.cache import estimate_nbytes

from .conftest import stored_platt_version


def _isotonic(rng, n, input="probability", rounded=None):
    scores = rng.random(n) if input == "probability" else rng.normal(0, 3, n)
    if rounded is not None:
        scores = np.round(scores, rounded)
    p = scores if input == "probability" else 1 / (1 + np.exp(-scores))
    labels = (rng.random(n) < p**1.3).astype(int)
    labels[:2], labels[2:4] = 0, 1
    return IsotonicCalibrator(input=input).fit(scores, labels)


def _errors_of(function, *args):
    try:
        function(*args)
    except CalibrationInputError as error:
        return (error.field, error.index, error.detail)
    return None


# -- isotonic: the grid ---------------------------------------------------------------
@pytest.mark.parametrize("seed", range(12))
def test_grid_lookup_is_np_interp_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    input = "probability" if seed % 2 == 0 else "logit"
    model = _isotonic(rng, int(rng.integers(200, 50_000)), input, rounded=3 if seed % 3 == 0 else None)
    x, y = model.x_thresholds_, model.y_thresholds_
    queries = np.concatenate([
        rng.random(3000) if input == "probability" else rng.normal(0, 4, 3000),
        x, np.nextafter(x, np.inf), np.nextafter(x, -np.inf), [x[0] - 1.0, x[-1] + 1.0],
    ])
    if input == "probability":
        queries = np.clip(queries, 0.0, 1.0)
    expected = np.interp(queries, x, y)
    lookup = _GridLookup.build(x, y, _slopes(x, y))
    if lookup is not None:
        np.testing.assert_array_equal(lookup(queries), expected)
    np.testing.assert_array_equal(model.predict(queries), expected)  # >= 256 scores: through the grid
    np.testing.assert_array_equal(model.predict(queries[:100]), expected[:100])  # compiled interp


def test_clustered_thresholds_keep_np_interp():
    rng = np.random.default_rng(0)
    scores = np.concatenate([rng.normal(0, 1e-9, 3000), rng.normal(1e6, 1, 3000)])
    labels = (rng.random(6000) < 0.5).astype(int)
    model = IsotonicCalibrator(input="logit").fit(scores, labels)
    queries = rng.choice(scores, 2000)
    np.testing.assert_array_equal(model.predict(queries), np.interp(queries, model.x_thresholds_, model.y_thresholds_))


def _lookup_built(lookup) -> bool:
    """The compiled lookup where the kernels are built, else the numpy grid."""
    return lookup.kernel is not None if kernels.available() else lookup.grid is not None


def test_auto_prepares_the_calibrator_it_chose():
    from calibd.calibration.auto import AutoCalibrator

    rng = np.random.default_rng(2)
    scores = rng.random(20_000)
    labels = (rng.random(20_000) < scores**1.3).astype(int)
    model = AutoCalibrator(candidates=["isotonic"]).fit(scores, labels)
    assert getattr(model.calibrator_, "_lookup", None) is None
    plain = estimate_nbytes(model)
    model.prepare()
    assert _lookup_built(model.calibrator_._lookup)
    assert estimate_nbytes(model) > plain


def test_the_grid_is_built_when_cached_and_counted():
    model = _isotonic(np.random.default_rng(1), 20_000)
    plain = estimate_nbytes(model)
    model.prepare()
    assert _lookup_built(model._lookup)
    assert estimate_nbytes(model) > plain
    # A refit replaces the thresholds, and with them the grid.
    before = model._lookup
    model.fit(np.linspace(0.01, 0.99, 50), np.r_[np.zeros(25), np.ones(25)].astype(int))
    model.predict(np.linspace(0, 1, 300))
    assert model._lookup is not before


# -- the quick checks: the same answers and the same errors ---------------------------------------
BAD_LISTS = [
    [0.5, float("nan")], [0.5, float("inf")], [0.5, -float("inf")], [0.5, 1.5], [0.5, -0.1],
    [0.5, "0.3"], [0.5, None], [0.5, [0.3]], [True, False], [0.5, 10**400], [], 0.5,
]


@pytest.mark.parametrize("bad", BAD_LISTS, ids=range(len(BAD_LISTS)))
def test_isotonic_rejects_what_the_full_check_rejects(bad):
    model = _isotonic(np.random.default_rng(2), 500)
    full = _errors_of(Calibrator.predict_details, model, bad)
    assert _errors_of(model.predict_details, bad) == full
    if isinstance(bad, list) and bad and all(isinstance(v, float) for v in bad):
        assert _errors_of(model.predict_details, np.array(bad)) == full


@pytest.mark.parametrize("input", ["probability", "logit"])
def test_lists_and_arrays_give_the_same_probabilities(input):
    rng = np.random.default_rng(3)
    model = _isotonic(rng, 5000, input)
    for n in (1, 7, 100, 256, 257, 3000):
        scores = (rng.random(n) if input == "probability" else rng.normal(0, 3, n)).tolist()
        scores[0] = float(scores[0])
        mixed = [scores[0], *[int(round(v)) if i % 5 == 0 else v for i, v in enumerate(scores[1:])]]
        for values in (scores, mixed):
            expected = np.interp(np.asarray(values, dtype=float), model.x_thresholds_, model.y_thresholds_)
            np.testing.assert_array_equal(model.predict_details(values)[0], expected)
            np.testing.assert_array_equal(model.predict_details(np.asarray(values, dtype=float))[0], expected)


def test_platt_quick_check():
    rng = np.random.default_rng(4)
    s = rng.random(400)
    model = PlattCalibrator().fit(s, (rng.random(400) < s).astype(int))
    q = rng.random(300)
    np.testing.assert_array_equal(model.predict(q), model.predict(q.tolist()))
    for bad in ([0.5, np.nan], [0.5, 2.0]):
        assert _errors_of(model.predict, np.array(bad)) == _errors_of(Calibrator.predict_details, model, bad)


# -- temperature: the multiclass fast path ---------------------------------------------------
@pytest.mark.parametrize("k", [2, 3, 10])
@pytest.mark.parametrize("scale", [0.01, 1.0, 30.0, 400.0])
def test_temperature_rows_match_softmax(k, scale):
    rng = np.random.default_rng(k)
    z = rng.normal(0, scale, (600, k))
    labels = np.repeat(np.arange(k), 600 // k)
    model = TemperatureCalibrator(input="logit").fit(z, labels)
    rows = rng.normal(0, scale, (250, k)) + rng.normal(0, scale, (250, 1))
    expected = softmax(as_logits(rows, "logit") / model.temperature_)
    got, extras = model.predict_details(rows)
    assert extras == {}
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(model.predict_details(rows.tolist())[0], expected, rtol=0, atol=1e-12)
    # A finite logit whose square overflows takes the checks by extremes, and the shifted softmax.
    huge = np.r_[rows[:2], [[1e200] + [0.0] * (k - 1)]]
    np.testing.assert_allclose(model.predict_details(huge)[0], softmax(huge / model.temperature_), rtol=0, atol=1e-12)
    infinite = [np.r_[rows[:2], [[value] + [0.0] * (k - 1)]] for value in (np.inf, -np.inf)]
    for bad in (np.r_[rows[:2], [[np.nan] * k]], *infinite, rows[:, :1]):
        assert _errors_of(model.predict_details, bad) == _errors_of(Calibrator.predict_details, model, bad)


# -- the router's list conversion --------------------------------------------------------------
def test_float_array_is_np_asarray_or_declines():
    rng = np.random.default_rng(5)
    long = rng.random(1000).tolist()
    np.testing.assert_array_equal(float_array(long), np.asarray(long))
    mixed = [0.5, *[1, 0, 0.25] * 100]
    np.testing.assert_array_equal(float_array(mixed), np.asarray(mixed, dtype=float))
    # Booleans are not numbers: declined, so that the calibrator's checks point at them.
    assert float_array([*mixed, True]) is None and float_array([[0.5, 0.25], [0.5, False]] * 200) is None
    rows = rng.normal(size=(50, 4)).tolist()
    np.testing.assert_array_equal(float_array(rows), np.asarray(rows))
    assert float_array(rows).flags.writeable
    for declined in (long[:10], [1, *long], [*long, "x"], [*long, None], [*long, [0.1]], [*long, 10**400],
                     [[0.1, 0.2], [0.3]], [[0.1, 0.2], 0.3], [[0.1, "a"]], [], "0.1", None):
        assert float_array(declined) is None


# -- fits ------------------------------------------------------------------------------------------
def _reference_fit_logistic(features, targets, weights, init, max_iter=100, tol=1e-10):
    """The Newton iteration as it was before the blocked version: the reference."""
    n, d = features.shape
    beta = np.asarray(init, dtype=np.float64).copy()

    def loss_of(eta):
        return float(np.dot(weights, np.logaddexp(0.0, eta) - targets * eta))

    eta = features @ beta
    loss = loss_of(eta)
    for _ in range(max_iter):
        p = np.exp(-np.logaddexp(0.0, -eta))
        gradient = features.T @ (weights * (p - targets))
        hessian = (features * (weights * p * (1.0 - p))[:, None]).T @ features
        hessian[np.diag_indices(d)] += 1e-12 * (np.trace(hessian) + 1.0)
        step = np.linalg.solve(hessian, gradient)
        slack, scale = 1e-12 * abs(loss), 1.0
        while True:
            candidate = beta - scale * step
            candidate_eta = features @ candidate
            candidate_loss = loss_of(candidate_eta)
            if candidate_loss <= loss + slack or scale < 1e-10:
                break
            scale *= 0.5
        converged = scale * np.max(np.abs(step)) <= tol * (1.0 + np.max(np.abs(beta)))
        beta, eta, loss = candidate, candidate_eta, candidate_loss
        if converged:
            break
    return beta


@pytest.mark.parametrize("seed", range(8))
def test_blocked_newton_matches_the_reference(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(50, 70_000))  # several blocks of 16,384 rows, and fewer
    d = int(rng.integers(1, 4))
    x = rng.normal(0, 2, (n, d))
    if d > 1 and seed % 2:
        x[:, -1] = 1.0  # an intercept column
    truth = rng.normal(0, 1, d)
    targets = (rng.random(n) < 1 / (1 + np.exp(-x @ truth))).astype(float)
    if seed % 3 == 0:
        targets = np.where(targets == 1, 0.97, 0.02)  # soft targets
    weights = np.ones(n) if seed % 4 < 2 else rng.uniform(0.1, 3, n)
    init = np.ones(d)
    np.testing.assert_allclose(
        fit_logistic(x, targets, weights, init=init), _reference_fit_logistic(x, targets, weights, init), rtol=1e-8, atol=1e-9
    )


def test_pooling_of_unit_weights_matches_the_general_path():
    rng = np.random.default_rng(6)
    for trial in range(40):
        n = int(rng.integers(1, 3000))
        s = [rng.random(n), np.round(rng.random(n), 2), np.clip(rng.normal(0, 0.7, n), -1.99, 1.99)][trial % 3]
        s[rng.random(n) < 0.05] = -0.0
        y = (rng.random(n) < 0.4).astype(np.int8)
        fast = _pool_unit_weights(s, y)
        order = np.argsort(s)
        ss, yy = s[order], y[order].astype(float)
        starts = np.flatnonzero(np.concatenate(([True], ss[1:] != ss[:-1])))
        expected = (ss[starts], np.add.reduceat(np.ones(n), starts), np.add.reduceat(yy, starts),
                    np.add.reduceat(1 - yy, starts))
        for got, want in zip(fast, expected):
            np.testing.assert_array_equal(got, want)
        for got, want in zip(pool_ties(s, y, np.ones(n)), expected):
            np.testing.assert_array_equal(got, want)
    assert _pool_unit_weights(np.array([0.5, 2.5]), np.array([0, 1], dtype=np.int8)) is None


# -- logs --------------------------------------------------------------------------------------------
def test_log_time_and_ids_are_the_standard_ones():
    rng = np.random.default_rng(7)
    for created in [*rng.uniform(0, 2e9, 2000), 1700000000.9999995, 1700000000.0009995, 0.0]:
        assert _utc_milliseconds(created) == datetime.fromtimestamp(created, timezone.utc).isoformat(timespec="milliseconds")
    for _ in range(100):
        value = uuid.UUID(hex=new_request_id())
        assert value.version == 4 and value.variant == uuid.RFC_4122


def test_json_formatter_output_parses_the_same():
    formatter = JsonFormatter()
    logger = logging.getLogger("calibd.test")
    plain = logger.makeRecord("calibd.access", logging.INFO, "f", 1, "%s %d", ("POST", 200), None,
                              extra={"status": 200, "duration_ms": 0.25, "route": None, "ok": True, "path": "/ü\t"})
    line = json.loads(formatter.format(plain))
    assert line["message"] == "POST 200" and line["status"] == 200 and line["route"] is None and line["path"] == "/ü\t"
    odd = logger.makeRecord("calibd", logging.WARNING, "f", 1, "m", (), None,
                            extra={"when": datetime(2026, 1, 2, tzinfo=timezone.utc), "nan": math.nan, "big": 10**30})
    text = formatter.format(odd)
    assert '"when": "2026-01-02 00:00:00+00:00"' in text and "NaN" in text  # json.dumps(default=str), as before


def test_a_queued_access_entry_is_the_line_the_formatter_makes_of_its_record():
    formatter = JsonFormatter()
    logger = logging.getLogger("calibd.access")
    for method, path, route, status, duration in [("POST", "/calibrate", "/calibrate", 200, 0.0012345),
                                                  ("GET", "/x/ü\t\"", None, 404, 2.5), ("PUT", "/a", "/a", 500, 0.0)]:
        created, rid = 1_700_000_000.123456, "rid-1"
        record = logger.makeRecord("calibd.access", logging.INFO, "(unknown file)", 0, "%s %s %d", (method, path, status),
                                   None, extra={"method": method, "path": path, "route": route, "status": status,
                                                "duration_ms": round(duration * 1000, 3)})
        record.created = created
        token = request_id.set(rid)
        try:
            expected = json.loads(formatter.format(record))
        finally:
            request_id.reset(token)
        assert json.loads(format_access((created, rid, method, path, route, status, duration))) == expected


def test_pending_metrics_add_up_to_what_prometheus_client_counts():
    """Observations and increments counted by pending_metrics, flushed in several batches, give the
    exposition prometheus-client's own observe/inc give."""
    registry = CollectorRegistry()
    buckets = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
    reference = Histogram("reference_seconds", "r", ["route"], buckets=buckets, registry=registry)
    ours = PendingHistogram(Histogram("ours_seconds", "o", ["route"], buckets=buckets, registry=registry))
    reference_total = Counter("reference_total", "r", ["name"], registry=registry)
    ours_total = PendingCounter(Counter("ours_total", "o", ["name"], registry=registry))
    # Two counters counted together (a request and its scores), as calibd counts /calibrate's.
    reference_requests = Counter("reference_requests_total", "r", ["name"], registry=registry)
    reference_scores = Counter("reference_scores_total", "r", ["name"], registry=registry)
    ours_pair = PendingCounters(Counter("ours_requests_total", "o", ["name"], registry=registry),
                                Counter("ours_scores_total", "o", ["name"], registry=registry))
    values = [*np.random.default_rng(3).exponential(0.01, 500), *buckets, 0.0, 11.0, 1e-9]
    for i, value in enumerate(values):
        route = ("/a", "/b")[i % 2]
        reference.labels(route).observe(value)
        ours.observe((route,), value)
        reference_total.labels(route).inc(i)
        ours_total.inc((route,), i)
        reference_requests.labels(route).inc(1)
        reference_scores.labels(route).inc(i % 3)  # zero scores too: the series appears, at 0
        ours_pair.inc((route,), 1, i % 3)
        if i % 97 == 0:
            ours.flush()
            ours_total.flush()
            ours_pair.flush()

    def samples(name: str) -> list[tuple]:
        return [(s.name.replace(name, ""), s.labels, s.value) for metric in registry.collect()
                for s in metric.samples if s.name.startswith(name) and not s.name.endswith("_created")]

    assert samples("ours_seconds") != samples("reference_seconds")  # the last observations wait for a flush
    assert samples("ours_requests_total") != samples("reference_requests_total")
    ours.flush()
    ours_total.flush()
    ours_pair.flush()
    # Counts exact; the sums added in another order agree to rounding.
    exact = [(kind, labels, value) for kind, labels, value in samples("ours_seconds") if kind != "_sum"]
    assert exact == [(kind, labels, value) for kind, labels, value in samples("reference_seconds") if kind != "_sum"]
    sums = [value for kind, _, value in samples("ours_seconds") if kind == "_sum"]
    assert sums == pytest.approx([value for kind, _, value in samples("reference_seconds") if kind == "_sum"], rel=1e-12)
    assert len(sums) == 2 and len(exact) == 2 * (len(buckets) + 2)
    assert samples("ours_total") == samples("reference_total")
    assert samples("ours_requests_total") == samples("reference_requests_total")
    assert samples("ours_scores_total") == samples("reference_scores_total")
    assert samples("ours_requests_total")[0][2] > 0


# -- feedback rows by COPY -------------------------------------------------------------------------------
def test_feedback_rows_round_trip(database_url):
    from calibd.services import feedback as service
    from calibd.storage import feedback as store
    from calibd.storage.db import make_engine, make_sessionmaker, transaction
    from calibd.storage.models import FeedbackRow
    from sqlalchemy import select

    engine = make_engine(database_url)
    sessions = make_sessionmaker(engine)
    info = stored_platt_version(sessions, f"copy-{uuid.uuid4().hex[:12]}")
    ids = ["plain", "tab\there", "back\\slash", "new\nline", "ünï", "quote'\"", "x" * 128]
    p = np.linspace(0.1, 0.9, len(ids)) + 1e-17
    scores = [0.1, [0.2, 0.3], None, 1e-300, {"a": 1}, 0.5, -2.0]
    now = datetime.now(timezone.utc)
    batch = store.LabelledBatch(info.version, p, np.array([0, 1, 0, 1, 1, 0, 1]), prediction_ids=ids,
                                accepted=np.array([True, False, True, True, False, True, True]), scores=scores)
    service.record_feedback(sessions, calibrator_id=info.calibrator_id, batches=[batch], prediction_ttl=timedelta(days=1),
                            drift=service.DriftSettings(0.05, 0.1), now=now)
    with transaction(sessions) as session:
        rows = session.execute(
            select(FeedbackRow.prediction_id, FeedbackRow.probability, FeedbackRow.label, FeedbackRow.accepted,
                   FeedbackRow.scores, FeedbackRow.received_at)
            .where(FeedbackRow.calibrator_id == info.calibrator_id).order_by(FeedbackRow.id)
        ).all()
    engine.dispose()
    rows = sorted(rows, key=lambda r: ids.index(r[0]))  # rows with ids are inserted sorted by id
    assert [r[0] for r in rows] == ids
    assert [r[1] for r in rows] == p.tolist()  # every float exactly
    assert [r[2] for r in rows] == [0, 1, 0, 1, 1, 0, 1]
    assert [r[3] for r in rows] == [True, False, True, True, False, True, True]
    assert [r[4] for r in rows] == scores
    assert all(abs((r[5] - now).total_seconds()) < 1e-3 for r in rows)


# -- the route ---------------------------------------------------------------------------------------------
def test_calibrate_answers_what_the_calibrator_predicts(client, name):
    rng = np.random.default_rng(8)
    s = rng.random(5000)
    y = (rng.random(5000) < s**1.3).astype(int)
    assert client.post("/calibrators", json={"name": name, "method": "isotonic",
                                             "holdout": {"scores": s.tolist(), "labels": y.tolist()}}).status_code == 201
    model = IsotonicCalibrator().fit(s, y)
    for n in (1, 100, 2000):
        q = rng.random(n).tolist()
        got = client.post("/calibrate", json={"calibrator": name, "scores": q}).json()["probabilities"]
        np.testing.assert_allclose(got, model.predict(q), rtol=0, atol=1e-12)
    bad = client.post("/calibrate", content=b'{"calibrator": "%s", "scores": [0.5, NaN]}' % name.encode(),
                      headers={"Content-Type": "application/json"})
    assert bad.status_code == 422 and bad.json()["errors"][0]["pointer"] == "/scores/1"
