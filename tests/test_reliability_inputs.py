"""What fuzzing found, pinned down: hostile inputs get a 4xx problem, never a 500, on both databases.

Each test here is a request schemathesis once turned into a 500 (or a
response that did not match the OpenAPI description).
"""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from calibd.api.logs import JsonFormatter
from calibd.config import Settings

from .conftest import LiveServer, migrated_database
from .reliability.harness import admin_key, fit_body

BIG = 2**40  # beyond PostgreSQL's integer, and 2**70 beyond SQLite's


@pytest.fixture
def fitted(client, name):
    response = client.post("/calibrators", json=fit_body(name))
    assert response.status_code == 201, response.text
    return name


def assert_problem(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    return response.json()


@pytest.mark.parametrize("version", [BIG, 2**70])
def test_versions_beyond_the_database_integer_are_refused(client, fitted, version):
    name = fitted
    assert_problem(client.get(f"/calibrators/{name}/versions/{version}"), 422)
    assert_problem(client.get(f"/calibrators/{name}/monitor", params={"version": version}), 422)
    assert_problem(client.post(f"/calibrators/{name}/promote", json={"version": version}), 422)
    problem = assert_problem(client.post("/calibrate", json={"calibrator": name, "version": version, "scores": [0.5]}), 422)
    assert problem["errors"][0]["pointer"] == "/version"
    body = {"calibrator": name, "version": version, "probabilities": [0.5], "labels": [1]}
    assert_problem(client.post("/feedback", json=body), 422)
    # The largest version a database holds is still an ordinary 404.
    assert_problem(client.get(f"/calibrators/{name}/versions/{2**31 - 1}"), 404)


def test_nul_characters_are_refused_not_sent_to_the_database(client, fitted):
    name = fitted
    cursor = "AAAAAAAA"  # base64 of NUL bytes
    problem = assert_problem(client.get("/calibrators", params={"cursor": cursor}), 422)
    assert problem["errors"][0]["pointer"] == "/query/cursor"
    problem = assert_problem(client.post("/calibrate", json={"calibrator": name, "scores": [0.5], "ids": ["a\x00b"]}), 422)
    assert problem["errors"][0]["pointer"] == "/ids/0"
    problem = assert_problem(client.post("/feedback", json={"calibrator": name, "ids": ["a\x00b"], "labels": [1]}), 422)
    assert problem["errors"][0]["pointer"] == "/ids/0"
    # A name with NUL can name no calibrator: 404 or 422 depending on the database, never 500.
    response = client.post("/calibrate", json={"calibrator": "x\x00y", "scores": [0.5]})
    assert response.status_code in (404, 422), response.text
    response = client.post("/feedback", json={"calibrator": "x\x00y", "probabilities": [0.5], "labels": [1]})
    assert response.status_code in (404, 422), response.text


def test_an_upload_that_is_not_utf8_is_a_422(client, name):
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"
    response = client.post("/calibrators", data={"name": name, "method": "platt"}, files={"file": ("holdout.csv", png)})
    problem = assert_problem(response, 422)
    assert problem["errors"][0]["pointer"] == "/file" and "UTF-8" in problem["detail"]


def test_a_405_names_every_method_of_the_path(client):
    response = client.request("PATCH", "/calibrators")
    assert_problem(response, 405)
    assert set(response.headers["Allow"].replace(" ", "").split(",")) >= {"GET", "POST"}
    response = client.request("PUT", "/calibrators/some-name")
    assert set(response.headers["Allow"].replace(" ", "").split(",")) >= {"GET", "DELETE"}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def keyed(request, tmp_path_factory):
    """A server of its own with an admin key (auth on), for requests that create keys."""
    key = admin_key()
    with migrated_database(request.param, tmp_path_factory.mktemp("keyed")) as url:
        with LiveServer(Settings(database_url=url, bootstrap_admin_key=key)) as live:
            with httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
                yield http


def test_key_expiry_and_descriptions_out_of_range_are_422(keyed):
    assert_problem(keyed.post("/keys", json={"scopes": ["read"], "expires_in_days": 3.5e29}), 422)
    assert keyed.post("/keys", json={"scopes": ["read"], "expires_in_days": 36500}).status_code == 201
    # PostgreSQL cannot store NUL in text; SQLite can. Either way, no 500.
    response = keyed.post("/keys", json={"scopes": ["read"], "description": "a\x00b"})
    assert response.status_code in (201, 422), response.text
    response = keyed.delete("/keys/a%00b")
    assert response.status_code in (404, 422), response.text


def test_an_unexpected_error_is_a_problem_with_the_request_id_in_the_answer_and_the_log(database_url):
    lines: list[dict] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(json.loads(JsonFormatter().format(record)))

    live = LiveServer(Settings(database_url=database_url))

    async def boom() -> None:
        raise RuntimeError("a bug")

    live.server.config.app.add_api_route("/boom", boom)
    handler = Collect()
    logging.getLogger("calibd").addHandler(handler)
    try:
        with live:
            response = httpx.get(live.url + "/boom", headers={"X-Request-ID": "trace-500"})
    finally:
        logging.getLogger("calibd").removeHandler(handler)
    problem = assert_problem(response, 500)
    assert response.headers["X-Request-ID"] == "trace-500" and "trace-500" in problem["detail"]
    errors = [line for line in lines if line["level"] == "error"]
    assert errors and errors[0]["request_id"] == "trace-500" and "RuntimeError: a bug" in errors[0]["exception"]


def test_every_error_is_documented_as_a_problem(client):
    """Problem details everywhere, but for the inference protocol's routes, whose errors are its own JSON shape."""
    spec = client.get("/openapi.json").json()
    assert spec["components"]["schemas"]["Problem"]["required"] == ["type", "title", "status", "detail"]
    for path, operations in spec["paths"].items():
        oip = path == "/v2" or path.startswith("/v2/")
        for method, operation in operations.items():
            responses = operation["responses"]
            for code, response in responses.items():
                if code[0] in "45" and oip:
                    assert response["content"] == {
                        "application/json": {"schema": {"$ref": "#/components/schemas/InferenceError"}}
                    }, (method, path, code)
                elif code[0] in "45":
                    assert list(response["content"]) == ["application/problem+json"], (method, path, code)
            if operation.get("security"):
                assert {"401", "403", "503"} <= set(responses), (method, path)
            if "requestBody" in operation:
                assert {"400", "413", "415", "422"} <= set(responses), (method, path)


def _duplicate_parquet(columns: list[str]) -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_arrays([pa.array([0, 1, 1]), pa.array([0.2, 0.7, 0.9]), pa.array([0.3, 0.6, 0.8])], names=columns)
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def test_a_parquet_file_with_a_duplicate_column_is_named_without_pyarrow_internals(client, fitted, row_counts):
    before = row_counts()
    for path, fields, columns in (
        ("/calibrators", {"name": "dupes", "method": "platt"}, ["label", "score", "score"]),
        ("/feedback", {"calibrator": fitted}, ["label", "probability", "probability"]),
    ):
        response = client.post(path, data=fields, files={"file": ("t.parquet", _duplicate_parquet(columns))})
        problem = assert_problem(response, 422)
        assert problem["errors"][0]["pointer"] == f"/file/{columns[1]}" and "appears twice" in problem["detail"]
        assert "__" not in response.text
    assert row_counts() == before


def test_csv_takes_quoted_numbers_and_names_the_line_of_a_bad_one(client, name):
    rows = [(1, 0.9), (0, 0.2), (1, 0.8), (0, 0.1), (1, 0.6), (0, 0.4), (1, 0.7), (0, 0.3), (1, 0.55), (0, 0.45), (0, 0.65), (1, 0.35)]
    quoted = b'"label","score"\n' + b"".join(
        (b'"%d","%g"\n' if i % 3 == 0 else b'%d,"%g"\n' if i % 3 == 1 else b"%d,%g\n") % row for i, row in enumerate(rows)
    )
    fitted = client.post("/calibrators", data={"name": name, "method": "platt"}, files={"file": ("h.csv", quoted)})
    assert fitted.status_code == 201, fitted.text
    plain = client.post("/calibrators", data={"name": name, "method": "platt"},
                        files={"file": ("h.csv", quoted.replace(b'"', b""))})
    for part in ("before", "after"):  # the same numbers, quoted or not
        assert plain.json()["summary"][part] == fitted.json()["summary"][part]
    bad = client.post("/calibrators", data={"name": name, "method": "platt"},
                      files={"file": ("h.csv", b"label,score\n1,0.9\n0,0.5_0\n")})
    assert "line 3, column score: '0.5_0' is not a number" in assert_problem(bad, 422)["detail"]


def test_a_calibrator_watches_at_most_16_segment_dimensions(client, fitted, row_counts):
    """The documented limit: 1 to 16 dimensions, for PUT /segments and for a fit's "segments"."""
    sixteen = [f"d{i}" for i in range(16)]
    assert client.put(f"/calibrators/{fitted}/segments", json={"dimensions": sixteen}).status_code == 200
    before = row_counts()
    problem = assert_problem(client.put(f"/calibrators/{fitted}/segments", json={"dimensions": [*sixteen, "d16"]}), 422)
    assert problem["errors"][0]["pointer"].endswith("/dimensions") and "1 to 16" in problem["detail"]
    body = fit_body("seventeen") | {"segments": {"dimensions": [*sixteen, "d16"]}}
    problem = assert_problem(client.post("/calibrators", json=body), 422)
    assert problem["errors"][0]["pointer"] == "/segments/dimensions" and "1 to 16" in problem["detail"]
    assert row_counts() == before
    assert client.get(f"/calibrators/{fitted}/segments").json()["declared"]["dimensions"] == sixteen
