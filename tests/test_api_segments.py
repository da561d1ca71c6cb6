"""Segments through the API: declared at fit time or by PUT, sent with feedback or /calibrate, monitored per segment."""

from __future__ import annotations


import numpy as np
import pytest

from calibd.metrics import brier, ece, log_loss
from calibd.monitoring.segments import OTHER

from .test_api_feedback import fit, pairs, wait_logged


def declare(client, name, dimensions=("country", "device"), max_values=50):
    response = client.put(f"/calibrators/{name}/segments", json={"dimensions": list(dimensions), "max_values": max_values})
    assert response.status_code == 200, response.text
    return response.json()


def segments_of(monitor):
    return {(s["dimension"], s["segment"]): s for s in monitor["segments"]}


def test_declared_at_fit_time_and_changed_by_put(client, name):
    fit(client, name, segments={"dimensions": ["country"], "max_values": 3})
    assert client.get(f"/calibrators/{name}/segments").json() == {
        "calibrator": name, "declared": {"dimensions": ["country"], "max_values": 3}, "other": OTHER, "tracked": {},
    }
    out = declare(client, name, ("country", "device"), 10)
    assert out["declared"] == {"dimensions": ["country", "device"], "max_values": 10}
    bad = client.put(f"/calibrators/{name}/segments", json={"dimensions": ["country"], "max_values": 0})
    assert bad.status_code == 422 and bad.json()["errors"][0]["pointer"] == "/max_values"
    bad = client.post(
        "/calibrators", json={"name": name, "method": "platt", "holdout": {"scores": [0.2, 0.8], "labels": [0, 1]},
                              "segments": {"dimensions": ["a", "a"]}},
    )
    assert bad.status_code == 422 and bad.json()["errors"][0]["pointer"] == "/segments/dimensions/1"
    assert client.get(f"/calibrators/{name}/segments").json()["declared"]["max_values"] == 10
    assert client.get("/calibrators/nope-nope/segments").status_code == 404


def test_each_segment_has_the_windows_of_its_own_rows_and_values_past_the_cap_pool(client, name):
    fit(client, name)
    declare(client, name, ("country", "device"), max_values=2)
    p, y = pairs(1200, 3)
    rng = np.random.default_rng(4)
    country = rng.choice(["br", "us", "fr", "de"], size=p.shape[0], p=[0.4, 0.3, 0.2, 0.1])
    device = rng.choice(["ios", "android"], size=p.shape[0])
    for part in (slice(0, 500), slice(500, 1200)):
        response = client.post("/feedback", json={
            "calibrator": name, "probabilities": p[part].tolist(), "labels": y[part].tolist(),
            "segments": {"country": country[part].tolist(), "device": device[part].tolist()},
        })
        assert response.status_code == 202, response.text
    # First come, first tracked: the first two countries met in the rows as sent.
    first_two = list(dict.fromkeys(country.tolist()))[:2]
    tracked = client.get(f"/calibrators/{name}/segments").json()["tracked"]
    assert tracked["country"] == first_two
    assert sorted(tracked["device"]) == ["android", "ios"]
    monitor = client.get(f"/calibrators/{name}/monitor").json()
    found = segments_of(monitor)
    expected = {("country", c): np.isin(country, [c]) for c in first_two}
    expected[("country", OTHER)] = ~np.isin(country, first_two)
    expected |= {("device", d): device == d for d in ("ios", "android")}
    assert set(found) == set(expected)
    for key, rows in expected.items():
        for window in ("1h", "24h", "last_10000"):
            values = found[key]["windows"][window]
            assert values["samples"] == rows.sum()
            assert values["ece"] == pytest.approx(ece(p[rows], y[rows]), rel=1e-9)
            assert values["brier"] == pytest.approx(brier(p[rows], y[rows]), rel=1e-9)
            assert values["log_loss"] == pytest.approx(log_loss(p[rows], y[rows]), rel=1e-9)
        assert found[key]["drift"]["samples"] == rows.sum()
        assert found[key]["drift"]["batches"] == 2
        # Each label's start mass, G(i - 1) - G(i) with G(N) = (1 + N / 20000)^-1/2, half to its
        # segment in each of the 2 dimensions: the segment's share of alpha is alpha times its labels' mass.
        def survival(n):
            return (1.0 + n / 20_000) ** -0.5

        mass = sum(
            (survival(part.start) - survival(part.stop)) / 2 * rows[part].sum() / (part.stop - part.start)
            for part in (slice(0, 500), slice(500, 1200))
        )
        assert found[key]["drift"]["alpha"] == pytest.approx(0.05 * mass, rel=1e-9)
        assert found[key]["drift"]["threshold"] == pytest.approx(np.log(1 / 0.05))
    # The strongest evidence of miscalibration first: each ECE over its noise, sqrt(brier / samples).
    last = [s["windows"]["last_10000"] for s in monitor["segments"]]
    sigmas = [w["ece"] / np.sqrt(w["brier"] / w["samples"]) for w in last]
    assert sigmas == sorted(sigmas, reverse=True)
    for segment, sigma, w in zip(monitor["segments"], sigmas, last):  # shown beside each, with its MDE
        assert segment["evidence"]["sigma"] == pytest.approx(sigma, rel=1e-9)
        assert segment["evidence"]["mde"] == pytest.approx(5 * np.sqrt(w["brier"] / w["samples"]), rel=1e-9)
    # The calibrator's own monitor is unchanged by segments.
    assert monitor["windows"]["last_10000"]["samples"] == 1200


@pytest.mark.parametrize(
    "segments, pointer",
    [
        ({"colour": ["red"] * 4}, "/segments/colour"),
        ({"country": ["br"] * 3}, "/segments/country"),
        ({"country": ["br", "us", 7, "fr"]}, "/segments/country/2"),
        ({"country": ["br", "us", None, "fr"]}, "/segments/country/2"),
        (["br", "us"], "/segments"),
    ],
)
def test_bad_segments_are_refused_naming_the_field_and_nothing_is_written(client, name, row_counts, segments, pointer):
    fit(client, name)
    declare(client, name, ("country",))
    before = row_counts()
    response = client.post("/feedback", json={
        "calibrator": name, "probabilities": [0.1, 0.5, 0.7, 0.9], "labels": [0, 1, 1, 1], "segments": segments,
    })
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["pointer"] == pointer
    assert row_counts() == before


def test_undeclared_calibrator_refuses_segments(client, name):
    fit(client, name)
    response = client.post("/feedback", json={
        "calibrator": name, "probabilities": [0.1], "labels": [0], "segments": {"country": ["br"]},
    })
    assert response.status_code == 422 and response.json()["errors"][0]["pointer"] == "/segments"


def test_labels_by_id_inherit_the_segments_logged_by_calibrate(client, name, row_counts):
    fit(client, name)
    declare(client, name, ("country",))
    ids = [f"r{i}" for i in range(6)]
    scores = [0.1, 0.2, 0.3, 0.7, 0.8, 0.9]
    country = ["br", "br", "us", "us", "br", "us"]
    bad = client.post("/calibrate", json={"calibrator": name, "scores": scores, "segments": {"country": country}})
    assert bad.status_code == 422 and bad.json()["errors"][0]["pointer"] == "/segments"
    bad = client.post("/calibrate", json={"calibrator": name, "scores": scores, "ids": ids, "segments": {"device": country}})
    assert bad.status_code == 422 and bad.json()["errors"][0]["pointer"] == "/segments/device"
    served = client.post("/calibrate", json={"calibrator": name, "scores": scores, "ids": ids, "segments": {"country": country}})
    assert served.status_code == 200, served.text
    probabilities = np.array(served.json()["probabilities"])
    wait_logged(row_counts, name, 6)
    labels = [0, 1, 0, 1, 1, 1]
    # The last two labels come with a segment of their own, which overrides the logged one.
    first = client.post("/feedback", json={"calibrator": name, "ids": ids[:4], "labels": labels[:4]})
    assert first.status_code == 202 and first.json()["count"] == 4
    second = client.post("/feedback", json={
        "calibrator": name, "ids": ids[4:], "labels": labels[4:], "segments": {"country": ["fr", "fr"]},
    })
    assert second.status_code == 202 and second.json()["count"] == 2
    found = segments_of(client.get(f"/calibrators/{name}/monitor").json())
    y = np.array(labels)
    for value, rows in (("br", [0, 1]), ("us", [2, 3]), ("fr", [4, 5])):
        values = found[("country", value)]["windows"]["last_10000"]
        assert values["samples"] == len(rows)
        assert values["ece"] == pytest.approx(ece(probabilities[rows], y[rows]), rel=1e-9)


def test_drift_in_one_segment_raises_that_segment_alarm_only(client, name):
    fit(client, name)
    declare(client, name, ("country",), max_values=4)
    rng = np.random.default_rng(11)
    for batch in range(6):
        p = rng.uniform(0.05, 0.95, 2000)
        country = rng.choice(["br", "us", "fr", "de"], size=p.shape[0])
        z = np.log(p / (1 - p)) + np.where(country == "br", 1.5, 0.0)
        y = (rng.uniform(size=p.shape[0]) < 1 / (1 + np.exp(-z))).astype(int)
        response = client.post("/feedback", json={
            "calibrator": name, "probabilities": p.tolist(), "labels": y.tolist(), "segments": {"country": country.tolist()},
        })
        assert response.status_code == 202, response.text
    found = segments_of(client.get(f"/calibrators/{name}/monitor").json())
    assert found[("country", "br")]["drift"]["alarm"] is True
    assert found[("country", "br")]["drift"]["log_evalue"] >= found[("country", "br")]["drift"]["threshold"]
    for other in ("us", "fr", "de"):
        assert found[("country", other)]["drift"]["alarm"] is False
    # One threshold for every segment: the family shares alpha through the start mass, not the threshold.
    assert found[("country", "br")]["drift"]["threshold"] == pytest.approx(np.log(1 / 0.05))
    # The report lists the segments the worst calibrated first, with their alarms.
    report = client.get(f"/calibrators/{name}/report").json()
    assert report["feedback"]["segments"][0]["segment"] == "br"
    page = client.get(f"/calibrators/{name}/report", params={"format": "html"}).text
    table = page[page.index('<table id="segments">'):]
    table = table[: table.index("</table>")]
    rows = table.split("<tr>")[2:]
    assert len(rows) == 4 and "<td>br</td>" in rows[0] and "alarm since batch" in rows[0]
    assert all("no alarm" in row for row in rows[1:])
    metrics = client.get("/metrics").text
    assert f'calibd_segment_drift_alarm{{calibrator="{name}",dimension="country",segment="br",version="1"}} 1.0' in metrics
    assert f'calibd_segment_drift_alarm{{calibrator="{name}",dimension="country",segment="us",version="1"}} 0.0' in metrics
    assert f'calibd_segment_samples{{calibrator="{name}",dimension="country",segment="fr",version="1",window="1h"}}' in metrics


def test_monitor_ranks_segments_by_evidence_not_raw_ece():
    """A 28-row segment with a large ECE on noise alone ranks below a large segment with a small, real error."""
    from calibd.monitoring.evidence import rank_segments

    small = {"samples": 28, "ece": 0.12, "brier": 0.2}  # sd = sqrt(0.2 / 28) = 0.0845: sigma 1.42
    large = {"samples": 10_000, "ece": 0.02, "brier": 0.2}  # sd = 0.00447: sigma 4.47
    empty = {"samples": 0, "ece": None, "brier": None}
    ranked = rank_segments([{"segment": s, "windows": {"last_10000": w}} for s, w in (("small", small), ("empty", empty), ("large", large))])
    assert [s["segment"] for s in ranked] == ["large", "small", "empty"]
    assert ranked[0]["evidence"]["sigma"] == pytest.approx(0.02 / np.sqrt(0.2 / 10_000))
    assert ranked[1]["evidence"]["mde"] == pytest.approx(5 * np.sqrt(0.2 / 28))
    assert ranked[2]["evidence"] == {"window": "last_10000", "sigma": None, "mde": None}
