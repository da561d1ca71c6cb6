"""API keys with scopes: every route against no key, a wrong key and each scope."""

from __future__ import annotations

import subprocess
import sys

import httpx
import numpy as np
import pytest

from app.config import Settings
from app.storage import keys
from app.storage.db import make_engine, make_sessionmaker

from .conftest import REPO, LiveServer

SCOPES = ("admin", "calibrate", "feedback", "read")
NAME = "auth-model"

HOLDOUT = {
    "scores": np.linspace(0.05, 0.95, 40).tolist(),
    "labels": ([0, 1] * 20),
}

# route -> (method, path, body, the scope it needs). Statuses when allowed are those of a
# valid request; unknown names keep the requests from changing state.
ROUTES = {
    "fit": ("POST", "/calibrators", {"name": NAME, "method": "platt", "holdout": HOLDOUT}, "admin"),
    "list": ("GET", "/calibrators", None, "read"),
    "get": ("GET", f"/calibrators/{NAME}", None, "read"),
    "version": ("GET", f"/calibrators/{NAME}/versions/1", None, "read"),
    "monitor": ("GET", f"/calibrators/{NAME}/monitor", None, "read"),
    "promote": ("POST", f"/calibrators/{NAME}/promote", {"version": 1}, "admin"),
    "calibrate": ("POST", "/calibrate", {"calibrator": NAME, "scores": [0.5]}, "calibrate"),
    "feedback": ("POST", "/feedback", {"calibrator": NAME, "probabilities": [0.5], "labels": [1]}, "feedback"),
    "evaluate": ("POST", "/evaluate", {"probabilities": [0.2, 0.8], "labels": [0, 1]}, "read"),
    "keys-list": ("GET", "/keys", None, "admin"),
    "delete": ("DELETE", "/calibrators/no-such-calibrator", None, "admin"),
    "keys-revoke": ("DELETE", "/keys/nosuchid", None, "admin"),
}
OPEN_ROUTES = ("/healthz", "/readyz", "/metrics")


def expected_status(route: str, scope: str | None, valid: bool) -> int:
    """The status a request should get: 401 without a valid key, 403 without the scope."""
    method, path, body, needs = ROUTES[route]
    if not valid:
        return 401
    if scope != "admin" and scope != needs:
        return 403
    return {"fit": 201, "feedback": 202, "delete": 404, "keys-revoke": 404}.get(route, 200)


@pytest.fixture(scope="module")
def live(isolated_database_url):
    sessions = make_sessionmaker(make_engine(isolated_database_url))
    issued = {scope: keys.create_key(sessions, [scope])[0] for scope in SCOPES}
    with LiveServer(Settings(database_url=isolated_database_url)) as server:
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {issued['admin']}"}, timeout=60) as http:
            assert http.post("/calibrators", json=ROUTES["fit"][2]).status_code == 201
        yield server, issued, sessions


TABLE = [(route, scope) for route in ROUTES for scope in (None, "wrong", *SCOPES)]


@pytest.mark.parametrize("route,scope", TABLE, ids=[f"{r}-{s}" for r, s in TABLE])
def test_every_route_against_every_credential(live, route, scope):
    server, issued, _ = live
    method, path, body, _needs = ROUTES[route]
    headers = {}
    if scope == "wrong":
        headers["Authorization"] = "Bearer calibd_deadbeef_not-a-real-secret"
    elif scope is not None:
        headers["Authorization"] = f"Bearer {issued[scope]}"
    response = httpx.request(method, server.url + path, json=body, headers=headers, timeout=60)
    valid = scope not in (None, "wrong")
    assert response.status_code == expected_status(route, scope, valid), response.text
    if response.status_code == 401:
        assert response.headers["WWW-Authenticate"] == "Bearer"
        assert response.headers["content-type"] == "application/problem+json"


def test_health_and_metrics_stay_open(live):
    server, _, _ = live
    for path in OPEN_ROUTES:
        assert httpx.get(server.url + path).status_code == 200, path


def test_metrics_can_be_closed(isolated_database_url, live):
    _, issued, _ = live
    settings = Settings(database_url=isolated_database_url, metrics_require_key=True)
    with LiveServer(settings) as server:
        assert httpx.get(server.url + "/metrics").status_code == 401
        ok = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {issued['read']}"})
        assert ok.status_code == 200 and "calibd_" in ok.text


def test_keys_api_creates_lists_and_revokes(live):
    server, issued, _ = live
    admin = {"Authorization": f"Bearer {issued['admin']}"}
    created = httpx.post(server.url + "/keys", json={"scopes": ["calibrate"], "description": "ci"}, headers=admin)
    assert created.status_code == 201
    new_key, key_id = created.json()["key"], created.json()["key_id"]
    listed = httpx.get(server.url + "/keys", headers=admin).json()
    assert key_id in [k["key_id"] for k in listed]
    assert all("key" not in k for k in listed)  # never shown again
    use = {"Authorization": f"Bearer {new_key}"}
    request = {"calibrator": NAME, "scores": [0.5]}
    assert httpx.post(server.url + "/calibrate", json=request, headers=use).status_code == 200
    assert httpx.delete(f"{server.url}/keys/{key_id}", headers=admin).json()["revoked_at"] is not None
    assert httpx.post(server.url + "/calibrate", json=request, headers=use).status_code == 401
    bad = httpx.post(server.url + "/keys", json={"scopes": ["root"]}, headers=admin)
    assert bad.status_code == 422


def test_expired_keys_are_refused(live):
    server, _, sessions = live
    from datetime import timedelta

    from app.storage.models import utcnow

    key, _ = keys.create_key(sessions, ["read"], expires_at=utcnow() - timedelta(seconds=1))
    import time

    time.sleep(1.2)  # other processes pick keys up within a second
    assert httpx.get(server.url + "/calibrators", headers={"Authorization": f"Bearer {key}"}).status_code == 401


def test_only_a_hash_is_stored(live):
    _, issued, sessions = live
    from sqlalchemy import text

    with sessions() as session:
        stored = [tuple(row) for row in session.execute(text("SELECT key_id, key_sha256 FROM api_keys"))]
    secrets = list(issued.values())
    for key_id, digest in stored:
        assert all(key_id not in s.split("_", 2)[2] for s in secrets)
        assert all(digest != s and s not in digest for s in secrets)


def test_cli_keys_round_trip(isolated_database_url, live):
    env = {"CALIBD_DATABASE_URL": isolated_database_url, "PATH": "/usr/bin:/bin"}
    run = lambda *args: subprocess.run([sys.executable, "-m", "app.cli", "keys", *args], cwd=REPO, env=env, capture_output=True, text=True)
    created = run("create", "--scope", "read", "--expires", "1d", "--description", "from the cli")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    key_id = keys.split_key(key)
    assert key_id and "shown only now" in created.stderr
    assert key_id in run("list").stdout
    assert run("revoke", key_id).returncode == 0
    assert "revoked" in run("list").stdout.split(key_id)[1].splitlines()[0]
    assert run("revoke", "nosuchid").returncode == 1
