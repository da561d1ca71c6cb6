"""Row bombs: bodies that declare tens of millions of rows in a few kilobytes (or just past the row
budget, in formats that cannot compress) are refused from their metadata, on every upload route and
format, by a real ``calibd serve``: each within a second, the server's processes growing by less
than 100 MB at their peak, and nothing written. On both databases."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from .conftest import RowCounter
from .processes import free_port, stop, wait_ready

ROWS = 30_000_000
ARROW = "application/vnd.apache.arrow.stream"
FEEDBACK_ROWS = 100_000  # CALIBD_MAX_FEEDBACK_ROWS's default
#: CALIBD_MAX_HOLDOUT_ROWS for these tests (default 5,000,000): JSON and CSV cannot compress, so a
#: body just past the budget is what they can send; a smaller budget keeps that body a few megabytes.
HOLDOUT_ROWS = 1_000_000


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (the fit workers, multiprocessing's helpers)."""
    found = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            found += _tree(int(child))
    return found


def peak_rss(pid: int) -> dict[int, int]:
    """Each process's peak resident size (VmHWM), in bytes."""
    peaks = {}
    for each in _tree(pid):
        try:
            line = next(l for l in Path(f"/proc/{each}/status").read_text().splitlines() if l.startswith("VmHWM:"))
        except (FileNotFoundError, StopIteration):
            continue
        peaks[each] = int(line.split()[1]) * 1024
    return peaks


def growth(before: dict[int, int], after: dict[int, int]) -> int:
    """How much the peaks grew, over the processes of both samples (a new process: all of it)."""
    return sum(size - before.get(pid, 0) for pid, size in after.items())


@pytest.fixture(scope="module")
def served(database_url, tmp_path_factory) -> Iterator[tuple[str, subprocess.Popen]]:
    folder = tmp_path_factory.mktemp("bombs")
    port = free_port()
    log = open(folder / "calibd.log", "wb")
    env = dict(os.environ, CALIBD_DATABASE_URL=database_url, CALIBD_SPOOL_DIR=str(folder), CALIBD_FIT_WORKERS="1",
               CALIBD_MAX_HOLDOUT_ROWS=str(HOLDOUT_ROWS))
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("calibd")), "serve", "--port", str(port)], env=env, stdout=log, stderr=log
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(server, url + "/readyz", 90, "calibd serve", lambda: (folder / "calibd.log").read_text())
        yield url, server
    finally:
        stop(server)
        log.close()


# -- the bombs -------------------------------------------------------------------------------
@lru_cache
def _zeros_table(kind: str) -> pa.Table:
    second = {"feedback": "probability", "fit": "score"}[kind]
    return pa.table({"label": pa.array(np.zeros(ROWS, dtype=np.int8)), second: pa.array(np.full(ROWS, 0.5))})


@lru_cache
def arrow_bomb(kind: str) -> bytes:
    """An Arrow IPC stream of 30 million rows in one zstd-compressed batch (a few kilobytes)."""
    table = _zeros_table(kind)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(table, max_chunksize=ROWS)
    return sink.getvalue().to_pybytes()


@lru_cache
def parquet_bomb(kind: str) -> bytes:
    """A Parquet file of 30 million rows, dictionary- and run-length-encoded, zstd-compressed."""
    sink = io.BytesIO()
    pq.write_table(_zeros_table(kind), sink, use_dictionary=True, compression="zstd", row_group_size=ROWS)
    return sink.getvalue()


@lru_cache
def npz_bomb() -> bytes:
    """An .npz of 30 million scores and labels, deflated to a few hundred kilobytes."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for name, dtype in (("scores", "<f8"), ("labels", "|i1")):
            header = io.BytesIO()
            np.lib.format.write_array_header_1_0(header, {"descr": dtype, "fortran_order": False, "shape": (ROWS,)})
            with archive.open(name + ".npy", "w") as member:
                member.write(b"\x93NUMPY\x01\x00" + header.getvalue()[8:])
                block = bytes(1 << 22)
                left = ROWS * np.dtype(dtype).itemsize
                while left:
                    member.write(block[: min(left, len(block))])
                    left -= min(left, len(block))
    return out.getvalue()


def json_numbers(n: int) -> bytes:
    return b"[" + b"0," * (n - 1) + b"0]"


def _cases():
    over_feedback, over_holdout = FEEDBACK_ROWS + 1, HOLDOUT_ROWS + 1
    feedback_json = b'{"calibrator": "bomb", "probabilities": ' + json_numbers(over_feedback) + b', "labels": [0]}'
    fit_json = b'{"name": "bomb", "method": "platt", "holdout": {"scores": [0.5], "labels": ' + json_numbers(over_holdout) + b"}}"
    csv = b"label,score\n" + b"0,0.5\n" * over_holdout
    fit_fields = {"name": "bomb", "method": "platt"}
    return [
        ("feedback json", "/feedback", {"content": feedback_json, "headers": {"Content-Type": "application/json"}}, "/probabilities"),
        ("feedback arrow", "/feedback?calibrator=bomb", lambda: {"content": arrow_bomb("feedback"), "headers": {"Content-Type": ARROW}}, ""),
        ("feedback parquet", "/feedback", lambda: {"data": {"calibrator": "bomb"}, "files": {"file": ("f.parquet", parquet_bomb("feedback"))}}, "/file"),
        ("fit json", "/calibrators", {"content": fit_json, "headers": {"Content-Type": "application/json"}}, "/holdout/labels"),
        ("fit csv", "/calibrators", {"data": fit_fields, "files": {"file": ("h.csv", csv)}}, "/file"),
        ("fit npz", "/calibrators", lambda: {"data": fit_fields, "files": {"file": ("h.npz", npz_bomb())}}, "/file/scores"),
        ("fit parquet", "/calibrators", lambda: {"data": fit_fields, "files": {"file": ("h.parquet", parquet_bomb("fit"))}}, "/file"),
        ("fit arrow", "/calibrators?name=bomb&method=platt", lambda: {"content": arrow_bomb("fit"), "headers": {"Content-Type": ARROW}}, ""),
        ("evaluate json", "/evaluate", {"content": b'{"probabilities": ' + json_numbers(over_holdout) + b', "labels": [0]}',
                                        "headers": {"Content-Type": "application/json"}}, "/probabilities"),
    ]


CASES = _cases()


@pytest.fixture(scope="module")
def warm(served):
    """A small fit of each kind first, so that the worker has imported what it reads with."""
    url, _ = served
    rng = np.random.default_rng(0)
    scores = rng.uniform(size=200)
    labels = (rng.uniform(size=200) < scores).astype(np.int8)
    table = pa.table({"label": labels, "score": scores})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    parquet = io.BytesIO()
    pq.write_table(table, parquet)
    npz = io.BytesIO()
    np.savez_compressed(npz, scores=scores, labels=labels)
    with httpx.Client(base_url=url, timeout=120) as http:
        assert http.post("/calibrators", json={"name": "warm", "method": "platt",
                                               "holdout": {"scores": scores.tolist(), "labels": labels.tolist()}}).status_code == 201
        assert http.post("/calibrators?name=warm&method=platt", content=sink.getvalue().to_pybytes(),
                         headers={"Content-Type": ARROW}).status_code == 201
        for file in (parquet.getvalue(), npz.getvalue()):
            assert http.post("/calibrators", data={"name": "warm", "method": "platt"}, files={"file": ("f", file)}).status_code == 201
        assert http.post("/feedback", json={"calibrator": "warm", "probabilities": [0.5], "labels": [1]}).status_code == 202
    return served


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_a_row_bomb_is_refused_from_its_metadata(warm, database_url, case):
    url, server = warm
    _, path, request, at = case
    request = request() if callable(request) else request
    counter = RowCounter(database_url)
    try:
        rows_before = counter()
        before = peak_rss(server.pid)
        with httpx.Client(base_url=url, timeout=60) as http:
            started = time.perf_counter()
            response = http.post(path, **request)
            elapsed = time.perf_counter() - started
        after = peak_rss(server.pid)
        assert response.status_code in (413, 422), response.text[:500]
        problem = response.json()
        limit = FEEDBACK_ROWS if path.startswith("/feedback") else HOLDOUT_ROWS
        assert f"at most {limit:,}" in problem["detail"] and "CALIBD_MAX_" in problem["detail"]
        assert problem["errors"][0]["pointer"] == (at or "/")
        assert elapsed < 1.0, f"answered in {elapsed:.2f} s"
        assert growth(before, after) < 100 * 2**20, f"peak RSS grew by {growth(before, after) / 2**20:.0f} MB"
        assert counter() == rows_before
    finally:
        counter.engine.dispose()
    size = len(request.get("content") or next(iter(request.get("files", {}).values()))[1])
    print(f"{case[0]}: {size:,} bytes, {response.status_code} in {elapsed * 1000:.0f} ms, "
          f"peak RSS +{growth(before, after) / 2**20:.1f} MB")


# -- the counting itself, without a server ------------------------------------------------------
def _refusal(check) -> tuple[int, str] | None:
    from calibd.api.problems import Problem

    try:
        check()
    except Problem as problem:
        return problem.status, problem.errors[0]["pointer"]
    return None


def test_json_items_are_counted_per_array_outside_strings():
    import orjson

    from calibd.api.limits import check_json_rows

    # commas and brackets inside strings (escaped quotes too) are no items
    tricky = ["a,b", "[,,]", 'q"u,o"te', "\\", "\\\",,"]
    body = orjson.dumps({"calibrator": "x", "ids": tricky * 2, "labels": [0] * 10, "segments": {"c/o": ["x"] * 11}})
    assert _refusal(lambda: check_json_rows(body, 10, "S")) == (422, "/segments/c~1o")
    assert _refusal(lambda: check_json_rows(body, 11, "S")) is None
    rows = orjson.dumps({"holdout": {"scores": [[0.5, 0.5]] * 7, "labels": [0] * 7}})
    assert _refusal(lambda: check_json_rows(rows, 6, "S")) == (422, "/holdout/scores")
    assert _refusal(lambda: check_json_rows(rows, 7, "S")) is None
    # across the scanner's one-megabyte slices: a string spanning a boundary, an array counted across many
    long = orjson.dumps({"ids": ["x" * 1_500_000, "a,b,c"], "labels": [1] * 600_000})
    assert _refusal(lambda: check_json_rows(long, 599_999, "S")) == (422, "/labels")
    assert _refusal(lambda: check_json_rows(long, 600_000, "S")) is None


def test_decompressed_sizes_past_the_limit_get_413():
    from calibd.api.calibrators.upload import parse_npz
    from calibd.api.limits import RowBudget, check_ipc_stream

    table = pa.table({"label": pa.array(np.zeros(100_000, dtype=np.int8)), "score": pa.array(np.full(100_000, 0.5))})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(table)
    stream = sink.getvalue().to_pybytes()
    assert _refusal(lambda: check_ipc_stream(stream, 10**6, 800_000, "S", ())) == (413, "/")
    assert _refusal(lambda: check_ipc_stream(stream, 10**6, 900_000, "S", ())) is None  # 900,000 bytes decoded
    npz = io.BytesIO()
    np.savez_compressed(npz, scores=np.full(100_000, 0.5), labels=np.zeros(100_000, dtype=np.int8))
    assert _refusal(lambda: parse_npz(npz.getvalue(), RowBudget(10**6, "S", 700_000))) == (413, "/file/scores")
    assert _refusal(lambda: parse_npz(npz.getvalue(), RowBudget(10**6, "S", 900_000))) is None


def test_a_feedback_request_at_the_budget_is_served_within_the_memory_bound(warm, database_url):
    """The bound docs/limits.md states: a /feedback request of CALIBD_MAX_FEEDBACK_ROWS rows, in
    JSON (its costliest form), is stored, and the server's processes peak less than 300 MB higher.
    (Measured against the peaks the bombs above left, which are a few megabytes.)"""
    url, server = warm
    rng = np.random.default_rng(1)
    probabilities = np.round(rng.uniform(size=FEEDBACK_ROWS), 6)
    labels = (rng.uniform(size=FEEDBACK_ROWS) < probabilities).astype(int)
    body = {"calibrator": "warm", "probabilities": probabilities.tolist(), "labels": labels.tolist()}
    before = peak_rss(server.pid)
    with httpx.Client(base_url=url, timeout=300) as http:
        response = http.post("/feedback", json=body)
        over = http.post("/feedback", json={**body, "labels": [*body["labels"], 1], "probabilities": [*body["probabilities"], 0.5]})
    after = peak_rss(server.pid)
    assert response.status_code == 202 and response.json()["count"] == FEEDBACK_ROWS, response.text[:500]
    assert over.status_code == 422 and f"at most {FEEDBACK_ROWS:,}" in over.json()["detail"]
    grown = growth(before, after)
    print(f"feedback at the budget: peak RSS +{grown / 2**20:.0f} MB")
    assert grown < 300 * 2**20, f"peak RSS grew by {grown / 2**20:.0f} MB"
