"""API keys with scopes: every route against no key, a wrong key and each scope.

The table ROUTES names every route of the OpenAPI description (a test fails
when a route is added without an entry), and its scope column is checked
against the route's own dependency, so the expected statuses come from the
code's declarations, not from the table alone.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from datetime import timedelta

import httpx
import numpy as np
import pytest
from sqlalchemy import event

from calibd.config import Settings
from calibd.main import create_app
from calibd.storage import keys
from calibd.storage.db import make_engine, make_sessionmaker
from calibd.storage.models import utcnow

from .conftest import REPO, LiveServer

SCOPES = ("admin", "calibrate", "feedback", "read")
NAME = "auth-model"

HOLDOUT = {
    "scores": np.linspace(0.05, 0.95, 40).tolist(),
    "labels": ([0, 1] * 20),
}

V2_INFER = {"inputs": [{"name": "scores", "datatype": "FP64", "shape": [1], "data": [0.5]}]}

# route -> (method, path, body, the scope it needs: "a_or_b" for either). Statuses when allowed are those of a
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
    "cloudevents": ("POST", "/cloudevents", {}, "feedback"),  # allowed, it is read: no ce-* headers, a 422
    "evaluate": ("POST", "/evaluate", {"probabilities": [0.2, 0.8], "labels": [0, 1]}, "read"),
    "report": ("GET", f"/calibrators/{NAME}/report", None, "read"),
    "job": ("GET", "/jobs/nosuchjob", None, "read"),
    "recalibration": ("GET", f"/calibrators/{NAME}/recalibration", None, "read"),
    "recalibration-set": ("PUT", f"/calibrators/{NAME}/recalibration", {"enabled": False}, "admin"),
    "keys-list": ("GET", "/keys", None, "admin"),
    "keys-create": ("POST", "/keys", {"scopes": ["read"], "description": "from the auth table"}, "admin"),
    "delete": ("DELETE", "/calibrators/no-such-calibrator", None, "admin"),
    "keys-revoke": ("DELETE", "/keys/nosuchid", None, "admin"),
    "import": ("POST", f"/calibrators/{NAME}/import", {}, "admin"),
    "segments": ("GET", f"/calibrators/{NAME}/segments", None, "read"),
    "segments-set": ("PUT", f"/calibrators/{NAME}/segments", {"dimensions": ["country"], "max_values": 5}, "admin"),
    "labels-set": ("PUT", f"/calibrators/{NAME}/labels", {"window": None, "missing": "negative"}, "admin"),
    "unmatched-labels": ("GET", f"/calibrators/{NAME}/unmatched-labels", None, "read"),
    "predictor": ("GET", f"/calibrators/{NAME}/predictor", None, "read"),
    "predictor-set": ("PUT", f"/calibrators/{NAME}/predictor", {"url": "http://127.0.0.1:9"}, "admin"),
    "predictor-delete": ("DELETE", f"/calibrators/{NAME}/predictor", None, "admin"),
    "v2-metadata": ("GET", f"/v2/models/{NAME}", None, "calibrate_or_read"),
    "v2-version-metadata": ("GET", f"/v2/models/{NAME}/versions/1", None, "calibrate_or_read"),
    "v2-ready": ("GET", f"/v2/models/{NAME}/ready", None, "calibrate_or_read"),
    "v2-version-ready": ("GET", f"/v2/models/{NAME}/versions/1/ready", None, "calibrate_or_read"),
    "v2-infer": ("POST", f"/v2/models/{NAME}/infer", V2_INFER, "calibrate"),
    "v2-version-infer": ("POST", f"/v2/models/{NAME}/versions/1/infer", V2_INFER, "calibrate"),
}
OPEN_ROUTES = ("/healthz", "/readyz", "/metrics", "/v2/health/live", "/v2/health/ready", "/v2")


# Credentials: what each request sends, and the scopes it carries (None: not a valid key).
CREDENTIALS: dict[str, tuple[str, ...] | None] = {
    "none": None,  # no Authorization header
    "wrong": None,  # a well-formed key nobody issued
    "garbage": None,  # a bearer token that is not a key at all
    "basic": None,  # another scheme
    "revoked": None,  # an admin key, revoked
    "expired": None,  # an admin key past its expiry
    **{scope: (scope,) for scope in SCOPES},
    "calibrate+feedback": ("calibrate", "feedback"),  # a key with two scopes
}


def expected_status(route: str, credential: str) -> int:
    """The status a request should get: 401 without a valid key, 403 without the scope."""
    method, path, body, needs = ROUTES[route]
    scopes = CREDENTIALS[credential]
    if scopes is None:
        return 401
    if "admin" not in scopes and not set(needs.split("_or_")) & set(scopes):
        return 403
    return {"fit": 201, "feedback": 202, "keys-create": 201, "delete": 404, "keys-revoke": 404, "job": 404,
            "import": 422, "cloudevents": 422}.get(route, 200)


@pytest.fixture(scope="module")
def live(isolated_database_url):
    sessions = make_sessionmaker(make_engine(isolated_database_url))
    issued = {scope: keys.create_key(sessions, [scope])[0] for scope in SCOPES}
    issued["calibrate+feedback"] = keys.create_key(sessions, ["calibrate", "feedback"])[0]
    issued["revoked"], revoked = keys.create_key(sessions, ["admin"], description="revoked")
    keys.revoke_key(sessions, revoked.key_id)
    issued["expired"] = keys.create_key(sessions, ["admin"], expires_at=utcnow() - timedelta(minutes=1))[0]
    issued["wrong"] = "calibd_deadbeef_not-a-real-secret"
    with LiveServer(Settings(database_url=isolated_database_url, predictor_allow="127.0.0.1")) as server:
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {issued['admin']}"}, timeout=60) as http:
            assert http.post("/calibrators", json=ROUTES["fit"][2]).status_code == 201
        yield server, issued, sessions


TABLE = [(route, credential) for route in ROUTES for credential in CREDENTIALS]


def authorization(issued: dict[str, str], credential: str) -> dict[str, str]:
    if credential == "none":
        return {}
    if credential == "garbage":
        return {"Authorization": "Bearer not-a-key"}
    if credential == "basic":
        return {"Authorization": "Basic dXNlcjpwYXNzd29yZA=="}
    return {"Authorization": f"Bearer {issued[credential]}"}


@pytest.mark.parametrize("route,credential", TABLE, ids=[f"{r}-{c}" for r, c in TABLE])
def test_every_route_against_every_credential(live, route, credential):
    server, issued, _ = live
    method, path, body, _needs = ROUTES[route]
    response = httpx.request(method, server.url + path, json=body, headers=authorization(issued, credential), timeout=60)
    assert response.status_code == expected_status(route, credential), response.text
    if response.status_code in (401, 403):  # the inference protocol's errors are JSON with an "error" field
        oip = path.startswith("/v2")
        assert response.headers["content-type"] == ("application/json" if oip else "application/problem+json")
        assert ("error" in response.json()) == oip
    if response.status_code == 401:
        assert response.headers["WWW-Authenticate"] == "Bearer"


def _template(path: str, templates: set[tuple[str, str]], method: str) -> tuple[str, str] | None:
    for template_method, template in templates:
        pattern = "^" + re.sub(r"\\{[^/]+?\\}", "[^/]+", re.escape(template)) + "$"
        if template_method == method and re.match(pattern, path):
            return template_method, template
    return None


def test_the_table_covers_every_route_of_the_openapi_description():
    """A route added without an entry in ROUTES (or in OPEN_ROUTES) fails here."""
    spec = create_app(Settings()).openapi()
    documented = {(method.upper(), path) for path, operations in spec["paths"].items() for method in operations}
    covered = {_template(path, documented, method) for method, path, _, _ in ROUTES.values()}
    covered |= {("GET", path) for path in OPEN_ROUTES}
    assert None not in covered, "an entry of ROUTES matches no documented route"
    assert documented - covered == set(), f"routes without an entry in the auth table: {sorted(documented - covered)}"
    # The secured routes are documented as such; the open ones are not.
    for method, path in documented:
        secured = bool(spec["paths"][path][method.lower()].get("security"))
        assert secured == (path not in OPEN_ROUTES), (method, path)


def test_the_table_scopes_are_the_routes_own():
    """Each entry's scope is the one the route's dependency requires (so the table cannot drift)."""
    def api_routes(routes):
        for route in routes:
            included = getattr(route, "original_router", None)  # FastAPI's included routers
            yield from api_routes(included.routes) if included is not None else [route]

    required = {}
    for route in api_routes(create_app(Settings()).routes):
        for dependency in getattr(route, "dependencies", []):
            name = getattr(dependency.dependency, "__name__", "")
            if name.startswith("require_"):
                for method in route.methods:
                    required[(method, route.path)] = name.removeprefix("require_")
    templates = set(required)
    for entry, (method, path, _, needs) in ROUTES.items():
        assert required[_template(path, templates, method)] == needs, entry


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

    from calibd.storage.models import utcnow

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
    run = lambda *args: subprocess.run([sys.executable, "-m", "calibd.cli", "keys", *args], cwd=REPO, env=env, capture_output=True, text=True)
    created = run("create", "--scope", "read", "--expires", "1d", "--description", "from the cli")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    key_id = keys.split_key(key)
    assert key_id and "shown only now" in created.stderr
    assert key_id in run("list").stdout
    assert run("revoke", key_id).returncode == 0
    assert "revoked" in run("list").stdout.split(key_id)[1].splitlines()[0]
    assert run("revoke", "nosuchid").returncode == 1


def test_the_key_poll_rereads_the_keys_only_when_they_change(fresh_database):
    engine = make_engine(fresh_database)
    sessions = make_sessionmaker(engine)
    ring = keys.KeyRing(sessions)
    first, _ = keys.create_key(sessions, ["read"])
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda _c, _k, statement, *_: statements.append(statement))

    def reads_keys() -> bool:
        statements.clear()
        ring.refresh()
        return any("key_sha256" in statement for statement in statements)

    assert reads_keys() and ring.check(first) is not None
    assert not reads_keys()  # unchanged: the fingerprint alone
    # Another replica's changes, each seen at the next poll.
    second, second_info = keys.create_key(sessions, ["calibrate"])
    assert reads_keys() and ring.check(second).scopes == ("calibrate",)
    assert not reads_keys()
    keys.revoke_key(sessions, second_info.key_id)
    assert reads_keys() and ring.check(second) is None and ring.check(first) is not None
    assert not reads_keys()


def test_a_key_made_here_and_gone_from_the_table_before_the_next_poll_is_forgotten(tmp_path):
    """The process that creates a key applies it at once; the next poll must reread the keys even
    when the table looks as it did before the creation (the key was removed meanwhile)."""
    from sqlalchemy import text

    from .conftest import migrated_database

    with migrated_database("sqlite", tmp_path) as url, LiveServer(Settings(database_url=url)) as server, \
            httpx.Client(base_url=server.url, timeout=30) as http:
        created = http.post("/keys", json={"scopes": ["read"], "description": "short-lived"})
        assert created.status_code == 201, created.text
        engine = make_engine(url)
        with engine.begin() as connection:
            connection.execute(text("DELETE FROM api_keys"))
        engine.dispose()
        assert http.get("/calibrators").status_code == 401  # until the next poll
        deadline = time.monotonic() + 5
        while http.get("/calibrators").status_code == 401:
            assert time.monotonic() < deadline, "the deleted key is still enforced"
            time.sleep(0.05)
