"""Comparing two calibrators' monitors over HTTP: the same labels sent two ways must give the same answer."""

from __future__ import annotations

import httpx
import pytest


def flat(tree: dict, prefix: str = "") -> dict:
    """A nested dict's leaves, keyed by their path (pytest.approx compares flat dicts)."""
    out = {}
    for key, value in tree.items():
        out.update(flat(value, f"{prefix}{key}/") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def monitor(http: httpx.Client, name: str) -> dict:
    """The calibrator's windows and drift test, as its monitor route answers them."""
    answer = http.get(f"/calibrators/{name}/monitor")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    return {"windows": body["windows"], "drift": body["drift"]}


def assert_same_monitors(got: dict, expected: dict) -> None:
    """Equal up to the order of floating-point sums. The drift state's count of batches depends on how
    rows were grouped into requests, and updated_at on when: both are left out."""
    got, expected = {**got, "drift": dict(got["drift"])}, {**expected, "drift": dict(expected["drift"])}
    for volatile in ("batches", "updated_at"):
        got["drift"].pop(volatile), expected["drift"].pop(volatile)
    got, expected = flat(got), flat(expected)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, float):
            assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
        else:
            assert got[key] == value, key
