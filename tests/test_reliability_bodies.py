"""Any body on any route gets a 2xx or a 4xx, never a 5xx.

Explicit cases first (nesting far past every parser's limit, booleans inside
number arrays, lone surrogates), then a hypothesis property over JSON bodies
for every route that reads one: each starts from a valid body for its route
and is mutated (a value replaced by any JSON, a boolean slipped into an array,
unicode in every string field, a field nested up to thousands of levels deep,
huge and tiny numbers), and the answer must be a 2xx or a 4xx problem. Fits
sent with ``?async=true`` are followed to their end: a job never fails with a
5xx either.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from sqlalchemy import create_engine, text

from calibd.api.bodies import MAX_JSON_DEPTH, TooDeep, check_depth, nesting_depth
from calibd.config import Settings
from calibd.main import create_app

SCORES = np.linspace(0.05, 0.95, 20).round(4).tolist()
LABELS = [0, 1] * 10


def deep(depth: int, kind: str = "[", leaf: str = "0.5") -> str:
    """JSON text nesting ``leaf`` ``depth`` levels deep, built without recursion."""
    if kind == "[":
        return "[" * depth + leaf + "]" * depth
    return '{"a":' * depth + leaf + "}" * depth


@pytest.fixture(scope="module")
def fitted(server) -> dict[str, Any]:
    """A fitted binary calibrator, with a logged id, and its export."""
    name = f"bodies-{uuid.uuid4().hex[:12]}"
    with httpx.Client(base_url=server.url, timeout=60) as http:
        response = http.post("/calibrators", json={"name": name, "method": "isotonic", "holdout": {"scores": SCORES, "labels": LABELS}})
        assert response.status_code == 201, response.text
        stored = http.get(f"/calibrators/{name}/versions/1").json()
    export = {"format": "calibd-calibrator", "format_version": 1, "name": name, "version": 1} | {
        key: stored[key]
        for key in ("method", "input", "n_classes", "classes", "n_samples", "holdout_sha256", "fit_seconds", "summary", "parameters")
    }
    return {"name": name, "export": export}


def json_routes() -> list[tuple[str, str]]:
    """(method, path template) of every route that reads a JSON body, from the OpenAPI description."""
    routes = []
    for path, operations in create_app(Settings()).openapi()["paths"].items():
        for method, operation in operations.items():
            if "application/json" in operation.get("requestBody", {}).get("content", {}):
                routes.append((method.upper(), path))
    return sorted(routes)


ROUTES = json_routes()


def base_body(method: str, path: str, fitted: dict[str, Any]) -> dict[str, Any]:
    """A valid body for the route (an empty object for a route this test does not know)."""
    name = fitted["name"]
    bodies = {
        ("POST", "/calibrators"): {
            "name": f"{name}-fuzz", "method": "histogram", "input": "probability", "options": {"n_bins": 4},
            "promote": False, "holdout": {"scores": SCORES, "labels": LABELS, "sample_weight": [1.0] * 20},
        },
        ("POST", "/calibrators/{name}/promote"): {"version": 1},
        ("POST", "/calibrate"): {"calibrator": name, "scores": [0.1, 0.5, 0.9], "ids": ["a", "b", "c"], "version": 1},
        ("POST", "/feedback"): {"calibrator": name, "probabilities": [0.2, 0.7], "labels": [0, 1], "scores": [0.1, 0.8]},
        ("POST", "/evaluate"): {
            "probabilities": [0.2, 0.7, 0.4], "labels": [0, 1, 1], "sample_weight": [1.0, 2.0, 1.0], "metrics": ["ece", "brier"],
        },
        ("PUT", "/calibrators/{name}/recalibration"): {
            "enabled": False, "trigger": "schedule", "schedule_hours": 24.0, "method": "isotonic", "options": {},
        },
        ("POST", "/calibrators/{name}/import"): fitted["export"],
        ("POST", "/keys"): {"scopes": ["read"], "description": "fuzz", "expires_in_days": 1.0},
    }
    infer = {"id": "r", "inputs": [{"name": "scores", "shape": [3], "datatype": "FP64", "data": [0.1, 0.5, 0.9]}]}
    bodies[("POST", "/v2/models/{name}/infer")] = bodies[("POST", "/v2/models/{name}/versions/{version}/infer")] = infer
    return json.loads(json.dumps(bodies.get((method, path), {})))


def url(path: str, fitted: dict[str, Any]) -> str:
    return re.sub(r"\{[^}]+\}", fitted["name"], path.replace("{version}", "1"))


def assert_problem(response: httpx.Response) -> None:
    """A 2xx, or a 4xx with its error: a problem, or on the inference protocol's routes (/v2) the
    protocol's own ``{"error": ...}``."""
    assert response.status_code < 500, (response.status_code, response.text[:2000])
    if response.status_code >= 400:
        if response.request.url.path.startswith("/v2/"):
            assert response.json()["error"], response.text
            return
        assert response.headers["content-type"] == "application/problem+json", response.headers
        problem = response.json()
        assert problem["status"] == response.status_code and problem["detail"], problem


def follow_job(client: httpx.Client, response: httpx.Response) -> None:
    """An accepted asynchronous fit ends, and never with a 5xx problem."""
    if response.status_code != 202:
        return
    job = response.json()["id"]
    deadline = time.monotonic() + 60
    while True:
        info = client.get(f"/jobs/{job}").json()
        if info["state"] in ("succeeded", "failed"):
            break
        assert time.monotonic() < deadline, info
        time.sleep(0.05)
    if info["state"] == "failed":
        assert info["problem"]["status"] < 500, info["problem"]


# -- explicit cases -----------------------------------------------------------------


@pytest.mark.parametrize("method,path", ROUTES)
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 1025, 100_000])
def test_deep_nesting_is_refused_on_every_route(client, fitted, row_counts, method, path, depth):
    before = row_counts()
    for kind in ("[", "{"):
        # The whole body, and one field of a valid body.
        body = base_body(method, path, fitted)
        field = next(iter(body), "x")
        body[field] = "__DEEP__"
        for text in (deep(depth, kind), json.dumps(body).replace('"__DEEP__"', deep(depth, kind))):
            response = client.request(method, url(path, fitted), content=text, headers={"content-type": "application/json"})
            assert response.status_code == 400, (path, response.status_code, response.text[:500])
            error = response.json()
            assert f"more than {MAX_JSON_DEPTH} levels" in error.get("detail", error.get("error")), error
    assert row_counts() == before


def test_nesting_up_to_the_limit_is_read(client):
    """64 levels parse (and are then judged as values): a 422 pointing into the body, not a 400."""
    inner = deep(MAX_JSON_DEPTH - 2)
    response = client.post("/evaluate", content=f'{{"probabilities": {inner}, "labels": [0]}}',
                           headers={"content-type": "application/json"})
    assert response.status_code == 422 and response.json()["errors"][0]["pointer"] == "/probabilities", response.text


def test_deep_asynchronous_fit_is_refused_before_it_is_accepted(client, row_counts, name):
    before = row_counts()
    holdout = {"scores": SCORES, "labels": LABELS}
    for options in (deep(1025, "{", "1"), deep(MAX_JSON_DEPTH + 1, "{", "1")):
        text = json.dumps({"name": name, "method": "platt", "options": "__DEEP__", "holdout": holdout})
        text = text.replace('"__DEEP__"', options)
        response = client.post("/calibrators", params={"async": "true"}, content=text,
                               headers={"content-type": "application/json"})
        assert response.status_code == 400 and "levels" in response.json()["detail"], response.text
        # The same through a form's options field.
        response = client.post("/calibrators", params={"async": "true"}, data={"name": name, "method": "platt", "options": options},
                               files={"file": ("h.csv", "label,score\n" + "".join(f"{y},{s}\n" for y, s in zip(LABELS, SCORES)))})
        assert response.status_code == 400 and "levels" in response.json()["detail"], response.text
    # A large body (spooled to a file as it arrives) is scanned there.
    big = {"name": name, "method": "platt", "holdout": holdout, "padding": "__DEEP__"}
    text = json.dumps(big).replace('"__DEEP__"', json.dumps(["x" * 100] * 12_000)[:-1] + "," + deep(2000) + "]")
    assert len(text) > 1 << 20
    response = client.post("/calibrators", params={"async": "true"}, content=text, headers={"content-type": "application/json"})
    assert response.status_code == 400 and "levels" in response.json()["detail"], response.text
    assert row_counts() == before


@pytest.mark.parametrize("run_async", [False, True])
def test_large_bodies_of_any_content_get_a_4xx(client, name, run_async):
    """Bodies of megabytes (spooled to a file for the fit worker): not JSON, invalid UTF-8, a
    huge string of any Unicode, a huge number array with a boolean at its end."""
    rng = np.random.default_rng(11)
    text = "".join(map(chr, rng.integers(0x20, 0x2FFF, 400_000))).replace('"', "").replace("\\", "")
    bodies = [
        rng.integers(0, 256, 3_000_000, dtype=np.uint8).tobytes(),
        b'{"name": "' + b"\xff\xfe" * 1_000_000 + b'"}',
        json.dumps({"name": name, "method": "platt", "holdout": {"scores": SCORES, "labels": LABELS}, "note": text}).encode(),
        json.dumps({"name": name, "method": "platt", "holdout": {"scores": [0.5] * 400_000 + [True], "labels": [0, 1] * 200_000 + [1]}}).encode(),
    ]
    for body in bodies:
        assert len(body) > 1 << 20
        response = client.post("/calibrators", params={"async": "true"} if run_async else None, content=body,
                               headers={"content-type": "application/json"})
        assert_problem(response)
        if run_async and response.status_code == 202:  # else refused up front (random bytes nest deep)
            follow_job(client, response)
            assert client.get(response.headers["Location"]).json()["state"] == "failed"
        else:
            assert 400 <= response.status_code < 500, response.text


def test_nesting_depth_scan_agrees_with_a_parser():
    """The scan gives the depth a parser finds, brackets and escapes inside strings included."""
    strings = st.text(alphabet='[]{}"\\ab', max_size=6)
    values = st.recursive(
        st.none() | st.booleans() | st.floats(allow_nan=False) | strings,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(strings, inner, max_size=3),
        max_leaves=30,
    )

    def depth(value: Any) -> int:
        if isinstance(value, list):
            return 1 + max(map(depth, value), default=0)
        if isinstance(value, dict):
            return 1 + max(map(depth, value.values()), default=0)
        return 0

    @settings(max_examples=500, deadline=None)
    @given(values)
    def check(value):
        assert nesting_depth(json.dumps(value).encode()) == depth(value)

    check()


BOOLEAN_CASES = [
    ("/calibrate", {"scores": [0.1, True]}, "/scores/1"),
    ("/calibrate", {"scores": [False, 0.2]}, "/scores/0"),
    ("/calibrate", {"scores": [0.3] * 300 + [True]}, "/scores/300"),
    ("/feedback", {"probabilities": [0.2, True], "labels": [0, 1]}, "/probabilities/1"),
    ("/feedback", {"probabilities": [0.2, 0.7], "labels": [0, True]}, "/labels/1"),
    ("/feedback", {"probabilities": [0.2, 0.7], "labels": [0, 1], "scores": [0.1, False]}, "/scores/1"),
    ("/evaluate", {"probabilities": [0.2, 0.7, True], "labels": [0, 1, 1]}, "/probabilities/2"),
    ("/evaluate", {"probabilities": [[0.2, 0.8], [0.3, True], [0.5, 0.5]], "labels": [0, 1, 1]}, "/probabilities/1/1"),
    ("/evaluate", {"probabilities": [0.2, 0.7, 0.5], "labels": [0, True, 1]}, "/labels/1"),
    ("/evaluate", {"probabilities": [0.2, 0.7, 0.5], "labels": [0, 1, 1], "sample_weight": [1, 1, True]}, "/sample_weight/2"),
]


@pytest.mark.parametrize("path,changes,at", BOOLEAN_CASES, ids=[f"{c[0]}{c[2]}" for c in BOOLEAN_CASES])
def test_booleans_in_number_arrays_are_refused_at_the_element(client, fitted, row_counts, path, changes, at):
    before = row_counts()
    body = base_body("POST", path, fitted) | changes
    if path == "/calibrate":
        body.pop("ids")
    response = client.post(path, json=body)
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["errors"][0]["pointer"].startswith(at), problem
    assert "not true or false" in problem["detail"], problem
    assert row_counts() == before


@pytest.mark.parametrize(
    "datatype,shape,data",
    [("FP32", [3], [0.1, True, 0.3]), ("FP64", [3, 1], [[0.1], [False], [0.3]]), ("FP64", [3], [0.1, 0.2, True])],
)
def test_booleans_in_inference_tensors_are_refused(client, fitted, datatype, shape, data):
    body = {"inputs": [{"name": "scores", "shape": shape, "datatype": datatype, "data": data}]}
    response = client.post(f"/v2/models/{fitted['name']}/infer", json=body)
    assert 400 <= response.status_code < 500, response.text
    assert "not true or false" in response.text, response.text


@pytest.mark.parametrize(
    "field,value,at",
    [
        ("scores", SCORES[:5] + [True] + SCORES[6:], "/holdout/scores/5"),
        ("labels", [0, True] * 10, "/holdout/labels/1"),
        ("labels", [True, False] * 10, "/holdout/labels/0"),
        ("sample_weight", [1.0] * 19 + [False], "/holdout/sample_weight/19"),
    ],
)
def test_booleans_in_a_holdout_are_refused_at_the_element(client, row_counts, name, field, value, at):
    before = row_counts()
    holdout = {"scores": SCORES, "labels": LABELS} | {field: value}
    response = client.post("/calibrators", json={"name": name, "method": "platt", "holdout": holdout})
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["pointer"] == at, response.text
    assert row_counts() == before


def test_booleans_in_extra_arrays_are_refused(client, row_counts, name):
    rng = np.random.default_rng(0)
    features = rng.normal(size=(40, 2)).round(3).tolist()
    features[7][1] = True
    scores = rng.uniform(0.05, 0.95, 40).round(3).tolist()
    holdout = {"scores": scores, "labels": [0, 1] * 20, "features": features}
    before = row_counts()
    response = client.post("/calibrators", json={"name": name, "method": "selective", "holdout": holdout})
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["pointer"] == "/holdout/features/7/1", response.text
    assert row_counts() == before


@pytest.mark.parametrize("text", ['"\\ud800"', '"a\\udfffb"', '"\\udc00\\ud800"'])
def test_lone_surrogates_are_refused(client, fitted, text):
    """orjson refuses them, and the fallback parser (there for NaN literals) must not let them through."""
    for path, field in (("/feedback", "calibrator"), ("/keys", "description"), ("/calibrate", "calibrator")):
        body = json.dumps(base_body("POST", path, fitted) | {field: "__S__", "extra": float("nan")}).replace('"__S__"', text)
        response = client.post(path, content=body, headers={"content-type": "application/json"})
        assert response.status_code == 400, response.text
        assert "surrogate" in response.json()["detail"]


# -- the property -------------------------------------------------------------------

NUMBERS = st.one_of(
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, -1, 0.0, -0.0, 1.0, 5e-324, 2.2250738585072014e-308, 1e-300, 1.7976931348623157e308, 2**63, 2**64, -(2**63) - 1, 10**40]),
)
ODD_TEXT = st.sampled_from(["", "\x00", "\ud800", "\udfff", "a\u0000b", "\u202e", "😀", "\U0010ffff", "ǅ", "\ufeff", "../", "%00", "x" * 300])
TEXT = st.one_of(st.text(max_size=40), st.text(st.characters(codec=None, exclude_categories=()), max_size=10), ODD_TEXT)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TEXT, inner, max_size=5), max_leaves=25)


def paths_of(value: Any, here: tuple = ()) -> list[tuple]:
    """Every path to a value inside ``value`` (the root included)."""
    found = [here]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths_of(item, here + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += paths_of(item, here + (index,))
    return found


def set_at(root: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    parent = root
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return root


def get_at(root: Any, path: tuple) -> Any:
    for key in path:
        root = root[key]
    return root


@st.composite
def mutated_bodies(draw, routes, fitted) -> tuple[str, str, bytes, bool]:
    method, path = draw(st.sampled_from(routes))
    body = base_body(method, path, fitted)
    deep_text = None
    for _ in range(draw(st.integers(1, 3))):
        places = paths_of(body)
        kind = draw(st.sampled_from(["replace", "boolean", "strings", "deep", "add", "number"]))
        if kind == "replace":
            body = set_at(body, draw(st.sampled_from(places)), draw(JSON))
        elif kind == "number":
            body = set_at(body, draw(st.sampled_from(places)), draw(NUMBERS))
        elif kind == "boolean":
            arrays = [p for p in places if isinstance(get_at(body, p), list)]
            if arrays:
                array = get_at(body, draw(st.sampled_from(arrays)))
                array.insert(draw(st.integers(0, len(array))), draw(st.booleans()))
        elif kind == "strings":
            for place in places:
                if place and isinstance(get_at(body, place), str):
                    set_at(body, place, draw(TEXT))
        elif kind == "add" and isinstance(body, dict):
            body[draw(TEXT)] = draw(JSON)
        elif kind == "deep" and deep_text is None:
            depth = draw(st.sampled_from([2, MAX_JSON_DEPTH - 3, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 255, 1024, 1025, 5000]))
            deep_text = deep(depth, draw(st.sampled_from(["[", "{"])), json.dumps(draw(SCALARS)))
            body = set_at(body, draw(st.sampled_from(places)), "\x01DEEP\x01")
    ascii_only = draw(st.booleans())
    text = json.dumps(body, ensure_ascii=ascii_only)  # NaN and Infinity as literals, as Python clients send them
    if deep_text is not None:
        text = text.replace(json.dumps("\x01DEEP\x01", ensure_ascii=ascii_only), deep_text)
    run_async = method == "POST" and path == "/calibrators" and draw(st.booleans())
    return method, url(path, fitted), text.encode("utf-8", "surrogatepass"), run_async


def forget_key(database_url: str, client: httpx.Client, key_id: str) -> None:
    """Delete a key a mutated body happened to create: one key switches auth on for the session's
    server, and every later test of it would get 401. Waits until the server has seen it go."""
    engine = create_engine(database_url)
    try:
        with engine.begin() as connection:
            connection.execute(text("DELETE FROM api_keys WHERE key_id = :key_id"), {"key_id": key_id})
    finally:
        engine.dispose()
    deadline = time.monotonic() + 10
    while client.get("/calibrators").status_code == 401:
        assert time.monotonic() < deadline, "the server still asks for a key"
        time.sleep(0.05)


def test_no_json_body_gets_a_server_error(server, fitted, database_url):
    with httpx.Client(base_url=server.url, timeout=60) as client:

        @settings(max_examples=int(os.environ.get("CALIBD_FUZZ_EXAMPLES", "300")), deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(mutated_bodies(ROUTES, fitted))
        def check(request):
            method, target, content, run_async = request
            note(f"{method} {target}{'?async=true' if run_async else ''} {content[:1000]!r}")
            response = client.request(method, target, content=content, params={"async": "true"} if run_async else None,
                                      headers={"content-type": "application/json"})
            assert_problem(response)
            if target == "/keys" and response.status_code == 201:
                forget_key(database_url, client, response.json()["key_id"])
            if run_async:
                follow_job(client, response)

        check()


def test_no_form_options_get_a_server_error(server, fitted):
    """The options field of a multipart fit is JSON text too."""
    csv = "label,score\n" + "".join(f"{y},{s}\n" for y, s in zip(LABELS, SCORES))
    options = st.one_of(
        JSON.map(json.dumps), TEXT,
        st.sampled_from([deep(1025, "{", "1"), deep(70), '{"n_bins": true}', '{"n_bins": 1e400}', '{"n_bins": NaN}']),
    )
    with httpx.Client(base_url=server.url, timeout=60) as client:

        @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(options, st.booleans())
        def check(text, run_async):
            note(f"options {text[:1000]!r} async={run_async}")
            response = client.post(
                "/calibrators", params={"async": "true"} if run_async else None,
                data={"name": f"{fitted['name']}-form", "method": "histogram", "promote": "false", "options": text.encode("utf-8", "surrogatepass")},
                files={"file": ("holdout.csv", csv)},
            )
            assert_problem(response)
            if run_async:
                follow_job(client, response)

        check()


def test_the_depth_check_refuses_exactly_the_bodies_nested_too_deep():
    """check_depth's bytes-only path (wide bodies with brackets in strings, no escapes among them)
    and its fallback to the scan both refuse a body exactly when a parser finds it too deep."""
    strings = st.text(alphabet='[]{}"\\ab', max_size=6) | st.text(alphabet="[]{}ab", max_size=6)
    values = st.recursive(
        st.none() | st.booleans() | st.floats(allow_nan=False) | strings,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(strings, inner, max_size=3),
        max_leaves=30,
    )

    def depth(value: Any) -> int:
        if isinstance(value, list):
            return 1 + max(map(depth, value), default=0)
        if isinstance(value, dict):
            return 1 + max(map(depth, value.values()), default=0)
        return 0

    @settings(max_examples=500, deadline=None)
    @given(values, st.integers(0, MAX_JSON_DEPTH + 8), st.integers(1, 40))
    def check(value, wrap, width):
        for _ in range(wrap):
            value = [value]
        body = {"rows": [value] * width, "name": "[{"}  # wide: more brackets than the limit
        text = json.dumps(body).encode()
        try:
            check_depth(text)
            refused = False
        except TooDeep:
            refused = True
        assert refused == (depth(body) > MAX_JSON_DEPTH)

    check()
