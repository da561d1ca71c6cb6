"""The segment drift tests through the API: family-wise false alarms at the null's edge, and a planted drift found.

A server of its own with alpha = 0.3, so that a few streams (one calibrator
each) can check the family-wise rate: at alpha = 0.05 a handful of streams
could not tell a test that keeps its promise from one that does not.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from scipy.special import expit

from calibd.config import Settings

from .conftest import LiveServer
from .test_api_feedback import fit

ALPHA = 0.3
COUNTRIES = ["br", "us", "fr", "de", "in", "jp", "mx", "ca"]
DEVICES = ["ios", "android", "web"]


@pytest.fixture(scope="module")
def family_client(database_url):
    with LiveServer(Settings(database_url=database_url, monitor_alpha=ALPHA)) as live:
        with httpx.Client(base_url=live.url, timeout=300) as http:  # a first fit starts a worker process
            yield http


def stream(client, name: str, seed: int, shift_br: float, batches: int = 5, n: int = 400) -> dict:
    """Feedback at the null's edge (every label drawn at logit + tolerance), br shifted by ``shift_br`` more."""
    fit(client, name, segments={"dimensions": ["country", "device"], "max_values": 10})
    rng = np.random.default_rng(seed)
    for _ in range(batches):
        p = rng.uniform(0.05, 0.6, n)
        country = rng.choice(COUNTRIES, size=n)
        device = rng.choice(DEVICES, size=n)
        eta = np.log(p / (1 - p)) + 0.1 + np.where(country == "br", shift_br, 0.0)
        y = (rng.uniform(size=n) < expit(eta)).astype(int)
        response = client.post("/feedback", json={
            "calibrator": name, "probabilities": p.tolist(), "labels": y.tolist(),
            "segments": {"country": country.tolist(), "device": device.tolist()},
        })
        assert response.status_code == 202, response.text
    monitor = client.get(f"/calibrators/{name}/monitor").json()
    return {(s["dimension"], s["segment"]): s["drift"] for s in monitor["segments"]}


@pytest.mark.slow
def test_family_wise_false_alarms_at_most_alpha_and_a_planted_drift_is_found(family_client):
    n_streams = 6
    alarmed = 0
    for seed in range(n_streams):
        drift = stream(family_client, f"family-null-{seed}-{np.random.default_rng().integers(1 << 40)}", seed, 0.0)
        assert len(drift) == len(COUNTRIES) + len(DEVICES)
        # The budget given out never exceeds alpha; every test has the one threshold log(1/alpha).
        assert sum(d["alpha"] for d in drift.values()) <= ALPHA
        assert all(d["threshold"] == pytest.approx(np.log(1 / ALPHA)) for d in drift.values())
        alarmed += any(d["alarm"] for d in drift.values())
    # P(5 or more of 6 streams alarm) <= 0.011 when each does with probability <= 0.3.
    assert alarmed <= 4
    for seed in range(2):
        drift = stream(family_client, f"family-drift-{seed}-{np.random.default_rng().integers(1 << 40)}", 100 + seed, 1.5)
        assert drift[("country", "br")]["alarm"] is True
        assert drift[("country", "br")]["top_alternative"].startswith("shift+")
