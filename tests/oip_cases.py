"""Calibrators and comparisons that the inference protocol's tests share."""

from __future__ import annotations

import time
import uuid

import httpx
import numpy as np


def overconfident_binary(n, seed):
    rng = np.random.default_rng(seed)
    truth = rng.uniform(0.02, 0.98, n)
    labels = (rng.uniform(size=n) < truth).astype(int)
    scores = 1 / (1 + np.exp(-2.5 * np.log(truth / (1 - truth))))
    return scores, labels


def overconfident_multiclass(n, k, seed):
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 2.0, (n, k))
    truth = np.exp(z / 2.5)
    truth /= truth.sum(axis=1, keepdims=True)
    labels = (truth.cumsum(axis=1) > rng.uniform(size=(n, 1))).argmax(axis=1)
    return z, labels


def fit_models(url: str, headers: dict[str, str] | None = None) -> dict[str, str]:
    """A binary isotonic calibrator (two versions), a multiclass temperature one with class names,
    and a venn_abers one (its intervals are an extra output)."""
    names = {}
    with httpx.Client(base_url=url, timeout=120, headers=headers) as http:
        tag = uuid.uuid4().hex[:8]
        scores, labels = overconfident_binary(2000, 1)
        names["binary"] = f"oip-binary-{tag}"
        for _ in range(2):
            body = {"name": names["binary"], "method": "isotonic", "holdout": {"scores": scores.tolist(), "labels": labels.tolist()}}
            assert http.post("/calibrators", json=body).status_code == 201
            scores, labels = overconfident_binary(2000, 2)
        z, labels = overconfident_multiclass(1500, 3, 3)
        names["multiclass"] = f"oip-multiclass-{tag}"
        body = {
            "name": names["multiclass"], "method": "temperature", "input": "logit",
            "holdout": {"scores": z.tolist(), "labels": np.array(["cat", "dog", "eel"])[labels].tolist()},
        }
        assert http.post("/calibrators", json=body).status_code == 201
        scores, labels = overconfident_binary(800, 4)
        names["venn"] = f"oip-venn-{tag}"
        body = {"name": names["venn"], "method": "venn_abers", "holdout": {"scores": scores.tolist(), "labels": labels.tolist()}}
        assert http.post("/calibrators", json=body).status_code == 201
    return names


def calibrate(client, name, scores, version=None, **fields):
    body = {"calibrator": name, "scores": scores.tolist(), **fields}
    if version is not None:
        body["version"] = version
    response = client.post("/calibrate", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def assert_bit_identical(actual, expected):
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.dtype == np.float64 and actual.shape == expected.shape
    assert np.array_equal(actual.view(np.uint64), expected.view(np.uint64))




def assert_feedback_joined(client, name: str, ids: list[str], labels: list[int], timeout: float = 10.0) -> None:
    """Labels sent once by the logged ids are all joined to their predictions (at once, or behind the answer)."""
    receipt = client.post("/feedback", json={"calibrator": name, "ids": ids, "labels": labels}).json()
    assert receipt["count"] + receipt["pending"] == len(ids), receipt
    assert receipt["duplicate_ids"] == receipt["expired_ids"] == [], receipt
    deadline = time.monotonic() + timeout
    while True:
        samples = client.get(f"/calibrators/{name}/monitor").json()["windows"]["last_10000"]["samples"]
        if samples >= len(ids) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert samples == len(ids)
