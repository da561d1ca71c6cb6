"""Closed-loop recalibration of versions fitted on named features (multicalibration, auto given features).

/calibrate with ids keeps the features it was sent with each logged prediction, and labels by id
inherit them; self-contained /feedback rows may carry their own. The loop refits on those rows and
their features, and scores the candidate in shadow with them.
"""

from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pytest
from sqlalchemy import text

from calibd.calibration import get_method
from calibd.config import Settings
from calibd.metrics import log_loss

from .conftest import LiveServer
from .test_api_feedback import wait_logged
from .test_recalibration import client_events, events

COUNTRIES = np.array(["br", "us", "in"])


def world(n, seed, drift=0.0):
    """Logits, labels and features (a country, an age with some ages unknown). The scores are
    off by a logit of 1 for India; ``drift`` shifts the true logit of Brazil alone. No function
    of the score alone corrects either."""
    rng = np.random.default_rng(seed)
    country = rng.choice(COUNTRIES, n)
    age = rng.uniform(18, 80, n)
    z = rng.normal(-1.0, 1.5, n)
    truth = z - 1.0 * (country == "in") + drift * (country == "br")
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-truth))).astype(int)
    return z, y, {"country": country.tolist(), "age": [None if a < 21 else float(a) for a in age]}


def rows_of(features, rows):
    return {k: [v[i] for i in rows] for k, v in features.items()}


@pytest.fixture
def live(database_url, row_counts):
    with LiveServer(Settings(database_url=database_url, recalibration_interval_seconds=0.3)) as server:
        with httpx.Client(base_url=server.url, timeout=120) as http:
            yield http


class Traffic:
    """Serves batches and labels them three ways, keeping what was sent in the order it is stored:
    by id (the features logged by /calibrate), self-contained with features, self-contained
    without (which a refit on features leaves out)."""

    def __init__(self, http, row_counts, name):
        self.http, self.row_counts, self.name = http, row_counts, name
        self.logged = 0
        self.scores: list[float] = []
        self.labels: list[int] = []
        self.features: list[dict | None] = []

    def calibrate(self, z, features, ids=None):
        body = {"calibrator": self.name, "scores": z.tolist(), "features": features, **({"ids": ids} if ids else {})}
        served = self.http.post("/calibrate", json=body)
        assert served.status_code == 200, served.text
        return served.json()

    def batch(self, index, z, y, features, by_id=400, plain=100):
        n = len(z)
        # Labels by id: the prediction is logged first, so they join at once (none wait as pending).
        ids = [f"b{index:03d}-{i:05d}" for i in range(by_id)]
        self.calibrate(z[:by_id], rows_of(features, range(by_id)), ids)
        self.logged += by_id
        wait_logged(self.row_counts, self.name, self.logged)
        labelled = self.http.post("/feedback", json={"calibrator": self.name, "ids": ids, "labels": y[:by_id].tolist()})
        assert labelled.status_code == 202 and labelled.json()["count"] == by_id, labelled.text
        # Self-contained, with and without features.
        for rows, keep in ((range(by_id, n - plain), True), (range(n - plain, n), False)):
            rows = list(rows)
            served = self.calibrate(z[rows], rows_of(features, rows))
            body = {"calibrator": self.name, "version": served["version"], "probabilities": served["probabilities"],
                    "scores": z[rows].tolist(), "labels": y[rows].tolist(),
                    **({"features": rows_of(features, rows)} if keep else {})}
            response = self.http.post("/feedback", json=body)
            assert response.status_code == 202, response.text
        for i in range(n):
            self.scores.append(float(z[i]))
            self.labels.append(int(y[i]))
            self.features.append({k: v[i] for k, v in features.items()} if i < n - plain else None)


@pytest.mark.parametrize("method, options", [
    ("multicalibration", {"max_rounds": 2}),
    ("auto", {"candidates": ["multicalibration", "platt"]}),
])
def test_drift_in_one_segment_is_refitted_with_features_and_promoted(live, row_counts, name, method, options):
    z, y, features = world(4000, 1)
    fit = {"name": name, "method": method, "input": "logit", "options": options,
           "holdout": {"scores": z.tolist(), "labels": y.tolist(), "features": features}}
    created = live.post("/calibrators", json=fit)
    assert created.status_code == 201, created.text
    if method == "auto":
        assert created.json()["summary"]["fit"]["chosen"] == "multicalibration"

    # Brazil drifts. Batches go in until the drift alarm is on; then the policy is set, and the loop
    # refits on all of them (set before, it could refit on part of a batch).
    traffic = Traffic(live, row_counts, name)
    for batch in range(30):
        traffic.batch(batch, *world(1000, 100 + batch, drift=1.5))
        if live.get(f"/calibrators/{name}/monitor").json()["drift"]["alarm"]:
            break
    else:
        pytest.fail("the drift alarm never fired")
    policy = {"trigger": "alarm", "refit_rows": 100_000, "min_refit_rows": 500, "shadow_rows": 1500, "margin": 0.001}
    assert live.put(f"/calibrators/{name}/recalibration", json=policy).status_code == 200
    deadline = time.monotonic() + 120
    while not events(live, name):
        assert time.monotonic() < deadline, "no refit"
        time.sleep(0.2)
    state = live.get(f"/calibrators/{name}/recalibration").json()
    assert client_events(state) == [("refit", 2)], state
    refit = state["events"][0]
    with_features = [i for i, f in enumerate(traffic.features) if f is not None]
    assert refit["details"]["rows"] == len(with_features)
    assert refit["details"]["rows_without_features"] == len(traffic.features) - len(with_features) == 100 * (batch + 1)
    assert set(refit["details"]["features"]) == {"country", "age"}
    assert "and their features" in refit["reason"]

    # The candidate is the method fitted directly on the same rows and features, in the order stored.
    stored_options = live.get(f"/calibrators/{name}/versions/1").json()["parameters"]["params"]
    direct = get_method(method).from_options("logit", {k: v for k, v in stored_options.items() if k != "input"})
    direct.fit(
        np.array([traffic.scores[i] for i in with_features]), np.array([traffic.labels[i] for i in with_features]),
        features={k: [traffic.features[i][k] for i in with_features] for k in ("country", "age")},
    )
    z_probe, y_probe, f_probe = world(3000, 999, drift=1.5)
    candidate = live.post("/calibrate", json={"calibrator": name, "version": 2, "scores": z_probe.tolist(), "features": f_probe})
    assert candidate.status_code == 200, candidate.text
    np.testing.assert_allclose(candidate.json()["probabilities"], direct.predict(z_probe, features=f_probe), rtol=0, atol=1e-12)

    # Shadow rows served by version 1 (with features) decide; the candidate wins.
    for batch in range(batch + 1, batch + 12):
        traffic.batch(batch, *world(1000, 100 + batch, drift=1.5))
        if ("promoted", 2) in events(live, name):
            break
        time.sleep(0.4)
    deadline = time.monotonic() + 60
    while ("promoted", 2) not in events(live, name):
        assert time.monotonic() < deadline, live.get(f"/calibrators/{name}/recalibration").json()
        time.sleep(0.2)
    state = live.get(f"/calibrators/{name}/recalibration").json()
    assert client_events(state)[:2] == [("refit", 2), ("promoted", 2)], state
    promoted = state["events"][0]["details"]
    assert promoted["rows"] == 1500 and set(promoted["features"]) == {"country", "age"}
    assert promoted["improvement"] > 0.001 and promoted["interval"][0] > 0
    assert live.get(f"/calibrators/{name}").json()["current_version"] == 2

    # On fresh drifted traffic, the promoted version corrects Brazil; version 1 does not.
    new = np.array(live.post("/calibrate", json={"calibrator": name, "scores": z_probe.tolist(), "features": f_probe}).json()["probabilities"])
    old = np.array(live.post("/calibrate", json={"calibrator": name, "version": 1, "scores": z_probe.tolist(),
                                                 "features": f_probe}).json()["probabilities"])
    assert log_loss(new, y_probe) < log_loss(old, y_probe) - 0.01
    brazil = np.array(f_probe["country"]) == "br"
    gap_new, gap_old = (abs(p[brazil].mean() - y_probe[brazil].mean()) for p in (new, old))
    assert gap_new < gap_old / 2, (gap_new, gap_old)


def stored_features(row_counts, name):
    """The feedback rows' features by prediction id (self-contained rows: by position)."""
    query = text(
        "SELECT f.prediction_id, f.features FROM feedback f JOIN calibrators c ON c.id = f.calibrator_id "
        "WHERE c.name = :name ORDER BY f.id"
    )
    with row_counts.engine.connect() as connection:
        rows = connection.execute(query, {"name": name}).all()
    return [(i, json.loads(f) if isinstance(f, str) else f) for i, f in rows]


def fit_features(client, name, n=2000, seed=3, method="multicalibration"):
    z, y, features = world(n, seed)
    body = {"name": name, "method": method, "input": "logit",
            "holdout": {"scores": z.tolist(), "labels": y.tolist(), **({"features": features} if method != "platt" else {})}}
    created = client.post("/calibrators", json=body)
    assert created.status_code == 201, created.text


def test_features_are_kept_by_id_self_contained_and_for_pending_labels(client, row_counts, name):
    fit_features(client, name)
    z, y, features = world(6, 4)
    features["age"][1] = None
    # Labels that arrive before their prediction wait, and inherit its features when it is logged.
    early = client.post("/feedback", json={"calibrator": name, "ids": ["p0", "p1"], "labels": y[:2].tolist()})
    assert early.status_code == 202 and early.json()["pending"] == 2
    served = client.post("/calibrate", json={"calibrator": name, "scores": z[:4].tolist(), "ids": ["p0", "p1", "p2", "p3"],
                                             "features": rows_of(features, range(4))})
    assert served.status_code == 200, served.text
    wait_logged(row_counts, name, 4)
    late = client.post("/feedback", json={"calibrator": name, "ids": ["p2", "p3"], "labels": y[2:4].tolist()})
    assert late.status_code == 202 and late.json()["count"] == 2
    probabilities = client.post("/calibrate", json={"calibrator": name, "scores": z[4:].tolist(),
                                                    "features": rows_of(features, range(4, 6))}).json()["probabilities"]
    alone = client.post("/feedback", json={"calibrator": name, "probabilities": probabilities, "labels": y[4:].tolist(),
                                           "scores": z[4:].tolist(), "features": rows_of(features, range(4, 6))})
    assert alone.status_code == 202, alone.text
    deadline = time.monotonic() + 10
    while len(stored := stored_features(row_counts, name)) < 6:
        assert time.monotonic() < deadline, stored
        time.sleep(0.05)
    expected = [{k: v[i] for k, v in features.items()} for i in range(6)]
    assert sorted(stored[:4], key=lambda r: r[0]) == [(f"p{i}", expected[i]) for i in range(4)]
    assert stored[4:] == [(None, expected[4]), (None, expected[5])]
    assert expected[1]["age"] is None  # a missing number is kept as null


def test_features_are_not_kept_for_a_method_without_them(client, row_counts, name):
    fit_features(client, name, method="platt")
    z, y, _ = world(3, 5)
    assert client.post("/calibrate", json={"calibrator": name, "scores": z.tolist(), "ids": ["a", "b", "c"]}).status_code == 200
    wait_logged(row_counts, name, 3)
    assert client.post("/feedback", json={"calibrator": name, "ids": ["a", "b", "c"], "labels": y.tolist()}).json()["count"] == 3
    assert [f for _, f in stored_features(row_counts, name)] == [None, None, None]


GOOD = {"country": ["br", "us", "in", "br"], "age": [30.0, None, 45.5, 60.0]}


@pytest.mark.parametrize(
    "body, pointer",
    [
        ({"features": {**GOOD, "plan": ["a"] * 4}}, "/features/plan"),  # not a column of the fit
        ({"features": {"country": GOOD["country"]}}, "/features/age"),  # a column of the fit missing
        ({"features": {**GOOD, "country": ["br", "us", "in"]}}, "/features/country"),  # wrong length
        ({"features": {**GOOD, "country": ["br", "us", 7, "br"]}}, "/features/country/2"),  # a number among strings
        ({"features": {**GOOD, "country": [1.0, 2.0, 3.0, 4.0]}}, "/features/country"),  # numeric, fitted categorical
        ({"features": {**GOOD, "age": [30.0, "x", 45.5, 60.0]}}, "/features/age/1"),
        ({"features": ["br", "us"]}, "/features"),
        ({"features": GOOD, "scores": None}, "/features"),  # features without scores: nothing to refit on
        ({"features": GOOD, "ids": ["a", "b", "c", "d"], "probabilities": None, "scores": None}, "/features"),
    ],
)
def test_bad_feedback_features_are_refused_naming_the_field_and_nothing_is_written(client, row_counts, name, body, pointer):
    fit_features(client, name)
    before = row_counts()
    request = {"calibrator": name, "probabilities": [0.1, 0.4, 0.6, 0.9], "scores": [-2.0, -0.4, 0.4, 2.0],
               "labels": [0, 0, 1, 1], **body}
    response = client.post("/feedback", json={k: v for k, v in request.items() if v is not None})
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["pointer"] == pointer
    assert row_counts() == before


def test_feedback_features_for_a_version_without_features_are_refused(client, row_counts, name):
    fit_features(client, name, method="platt")
    before = row_counts()
    response = client.post("/feedback", json={"calibrator": name, "probabilities": [0.1, 0.9], "scores": [-2.0, 2.0],
                                              "labels": [0, 1], "features": {"country": ["br", "us"]}})
    assert response.status_code == 422 and response.json()["errors"][0]["pointer"] == "/features", response.text
    assert row_counts() == before


def test_the_columns_a_refit_takes():
    from calibd.services.recalibration import feature_columns, fitted_features

    z, y, features = world(3000, 6)
    multicalibration = get_method("multicalibration").from_options("logit", {"max_rounds": 1})
    assert set(fitted_features(multicalibration.fit(z, y, features=features))) == {"country", "age"}
    assert fitted_features(get_method("multicalibration").from_options("logit", {"max_rounds": 1}).fit(z, y)) is None
    assert fitted_features(get_method("platt").from_options("logit", {}).fit(z, y)) is None
    # auto fitted with features names them through the method it chose; one that chose a method
    # ignoring them still takes them (any columns); one fitted without them takes none.
    rng = np.random.default_rng(7)
    y_plain = (rng.uniform(size=3000) < 1 / (1 + np.exp(-z))).astype(int)  # calibrated: the features do not help
    auto = get_method("auto").from_options("logit", {"candidates": ["platt", "multicalibration"]})
    auto.fit(z, y_plain, features=features)
    assert auto.chosen_ == "platt" and fitted_features(auto) == []
    assert fitted_features(get_method("auto").from_options("logit", {"candidates": ["platt"]}).fit(z, y)) is None

    rows = [{"country": "br", "age": 30.0}, None, {"country": "us"}, {"country": "in", "age": None, "plan": "a"}]
    assert feature_columns(rows, ["country", "age"]) == ([0, 3], {"country": ["br", "in"], "age": [30.0, None]})
    # No names known: the newest row's columns.
    assert feature_columns(rows, []) == ([3], {"country": ["in"], "age": [None], "plan": ["a"]})


# -- features (and segments) as table columns: feature.<name>, segment.<dimension> ----------------
def _table(columns: dict) -> "pa.Table":
    import pyarrow as pa

    return pa.table({
        key: pa.array(values).dictionary_encode() if key == "feature.country" else pa.array(values, pa.float64() if key == "feature.age" else None)
        for key, values in columns.items()
    })


def _send_table(client, kind, path, fields, table):
    from .test_api_tables import arrow_stream, parquet

    if kind == "arrow":
        return client.post(path, params=fields, content=arrow_stream(table), headers={"Content-Type": "application/vnd.apache.arrow.stream"})
    return client.post(path, data=fields, files={"file": ("t.parquet", parquet(table), "application/vnd.apache.parquet")})


@pytest.mark.parametrize("kind", ["arrow", "parquet"])
def test_a_fit_takes_its_features_as_feature_columns_of_a_table(client, name, kind):
    from .test_api_tables import same_fit, stored

    z, y, features = world(1500, 6)
    table = _table({"label": y.tolist(), "score": z.tolist(), **{f"feature.{k}": v for k, v in features.items()}})
    fields = {"name": name, "method": "multicalibration", "input": "logit"}
    response = _send_table(client, kind, "/calibrators", fields, table)
    assert response.status_code == 201, response.text
    from_table = stored(client, response.json())
    as_json = client.post("/calibrators", json=fields | {"holdout": {"scores": z.tolist(), "labels": y.tolist(), "features": features}})
    assert as_json.status_code == 201, as_json.text
    same_fit(from_table, stored(client, as_json.json()))


@pytest.mark.parametrize("kind", ["arrow", "parquet"])
def test_feedback_tables_carry_features_and_segments_as_json_does(client, row_counts, name, kind):
    fit_features(client, name)
    declared = client.put(f"/calibrators/{name}/segments", json={"dimensions": ["country"], "max_values": 5})
    assert declared.status_code == 200, declared.text
    z, y, features = world(40, 7)
    probabilities = client.post("/calibrate", json={"calibrator": name, "scores": z.tolist(), "features": features}).json()["probabilities"]
    table = _table({"probability": probabilities, "score": z.tolist(), "label": y.tolist(),
                    **{f"feature.{k}": v for k, v in features.items()}, "segment.country": features["country"]})
    response = _send_table(client, kind, "/feedback", {"calibrator": name, "version": "1"}, table)
    assert response.status_code == 202, response.text
    assert response.json()["count"] == 40
    stored = stored_features(row_counts, name)
    assert [f for _, f in stored] == [{k: v[i] for k, v in features.items()} for i in range(40)]
    monitor = client.get(f"/calibrators/{name}/monitor").json()
    samples = {s["segment"]: s["windows"]["last_10000"]["samples"] for s in monitor["segments"] if s["dimension"] == "country"}
    assert samples == {c: features["country"].count(c) for c in set(features["country"])}


@pytest.mark.parametrize(
    "extra, pointer",
    [
        ({"feature.country": [1.0, 2.0, 3.0]}, "/feature.country"),  # fitted as categorical
        ({"feature.colour": ["a", "b", "c"]}, "/feature.colour"),  # not a feature of the version
        ({"segment.device": ["ios", "ios", "web"]}, "/segment.device"),  # not a declared dimension
        ({"feature.flag": [True, False, True]}, "/feature.flag"),  # booleans are neither strings nor numbers
    ],
)
def test_bad_feature_or_segment_columns_are_a_422_naming_them_and_write_nothing(client, row_counts, name, extra, pointer):
    fit_features(client, name)
    client.put(f"/calibrators/{name}/segments", json={"dimensions": ["country"], "max_values": 5})
    z, y, features = world(3, 8)
    probabilities = client.post("/calibrate", json={"calibrator": name, "scores": z.tolist(), "features": features}).json()["probabilities"]
    columns = {"probability": probabilities, "score": z.tolist(), "label": y.tolist(),
               **{f"feature.{k}": v for k, v in features.items()}}
    table = _table(columns | extra)
    before = row_counts()
    response = _send_table(client, "arrow", "/feedback", {"calibrator": name}, table)
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["pointer"].startswith(pointer), response.json()
    assert row_counts() == before


def test_a_fit_table_with_segment_columns_is_a_422_naming_the_column(client, name):
    z, y, features = world(200, 9)
    table = _table({"label": y.tolist(), "score": z.tolist(), "feature.country": features["country"],
                    "segment.country": features["country"]})
    response = _send_table(client, "arrow", "/calibrators", {"name": name, "method": "multicalibration", "input": "logit"}, table)
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["pointer"] == "/segment.country"
    assert client.get(f"/calibrators/{name}").status_code == 404
