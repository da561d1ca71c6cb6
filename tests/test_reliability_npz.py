""".npz uploads, hostile or broken: any header, shape, dtype, zip structure or corruption gets a 4xx
problem at /file, never a 5xx, and nothing is inflated past what its header allows."""

from __future__ import annotations

import ast
import io
import zipfile

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calibd.api.calibrators.upload import parse_npz
from calibd.api.limits import RowBudget
from calibd.api.problems import Problem

BUDGET = RowBudget(1_000_000, "CALIBD_MAX_HOLDOUT_ROWS", 64 * 2**20)

DTYPES = ["<f8", "<f4", "<i8", "|i1", "|b1", "|O", "<U3", "|V4", "<c16", "<M8[s]", "garbage", ">f8"]
SHAPES = st.one_of(
    st.just(()),
    st.tuples(st.integers(0, 40)),
    st.tuples(st.integers(0, 40), st.integers(0, 4)),
    st.tuples(st.sampled_from([10**12, 2**62, 2**63 + 5, 1_000_001])),
    st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)),
    st.just("(-1,)"), st.just("'x'"), st.just("(1.5,)"),
)


def npy(version: tuple[int, int], descr: str, shape, fortran: bool, data: bytes, raw_header: bytes | None) -> bytes:
    """A .npy member: numpy's magic, a header as numpy writes it (or ``raw_header``), then ``data``."""
    header = raw_header
    if header is None:
        shape_text = shape if isinstance(shape, str) else repr(tuple(shape))
        header = ("{'descr': %r, 'fortran_order': %r, 'shape': %s, }" % (descr, fortran, shape_text)).encode("latin1")
    header += b" " * (-(len(header) + 12) % 64) + b"\n"
    size = len(header).to_bytes(2 if version[0] == 1 else 4, "little")
    return b"\x93NUMPY" + bytes(version) + size + header + data


members = st.tuples(
    st.sampled_from(["scores.npy", "labels.npy", "sample_weight.npy", "classes.npy", "features.npy", "x", "scores.npy"]),
    st.sampled_from([(1, 0), (2, 0), (3, 0), (9, 9)]),
    st.sampled_from(DTYPES),
    SHAPES,
    st.booleans(),
    st.binary(max_size=400),
    st.one_of(st.none(), st.binary(max_size=40)),
    st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]),
)


@st.composite
def archives(draw) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, version, descr, shape, fortran, data, raw, compression in draw(st.lists(members, min_size=0, max_size=4)):
            archive.writestr(name, npy(version, descr, shape, fortran, data, raw), compress_type=compression)
    content = out.getvalue()
    mutation = draw(st.sampled_from(["none", "truncate", "flip", "garbage"]))
    if mutation == "truncate" and content:
        content = content[: draw(st.integers(2, len(content)))]
    elif mutation == "flip" and content:
        at = draw(st.integers(0, len(content) - 1))
        content = content[:at] + bytes([content[at] ^ draw(st.integers(1, 255))]) + content[at + 1:]
    elif mutation == "garbage":
        content = b"PK" + draw(st.binary(max_size=200))
    return content


def _valid(content: bytes) -> dict:
    """What numpy itself makes of the archive, where it reads it (None: it refuses it)."""
    try:
        with np.load(io.BytesIO(content), allow_pickle=False) as loaded:
            return {key: loaded[key] for key in loaded.files}
    except Exception:  # noqa: BLE001 - any refusal
        return None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(archives())
def test_parse_npz_answers_arrays_or_a_4xx_problem(content):
    try:
        arrays = parse_npz(content, BUDGET)
    except Problem as problem:
        assert 400 <= problem.status < 500 and problem.errors[0]["pointer"].startswith("/file")
        return
    # Accepted: the arrays are numpy's own reading of the archive, 1-d or more, without objects.
    expected = _valid(content)
    assert expected is not None
    for key, value in expected.items():
        got = arrays.get(key, arrays.get({"u_holdout": "scores", "y_holdout": "labels"}.get(key, key)))
        if key == "classes":
            assert got == value.tolist()
        else:
            assert value.ndim >= 1 and value.dtype.kind != "O" and np.array_equal(got, value, equal_nan=True)


def test_the_500s_found_before_are_422_at_file():
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (10**12,)})
    huge = io.BytesIO()
    with zipfile.ZipFile(huge, "w") as archive:
        archive.writestr("scores.npy", b"\x93NUMPY\x01\x00" + header.getvalue()[8:] + bytes(64))
        archive.writestr("labels.npy", b"\x93NUMPY\x01\x00" + header.getvalue()[8:])
    zero_d = io.BytesIO()
    np.savez(zero_d, scores=np.array(0.5), labels=np.array(1))
    for content, where in ((huge.getvalue(), "/file/scores"), (b"PK" + b"\x00garbage" * 20, "/file"), (zero_d.getvalue(), "/file/scores")):
        for budget in (BUDGET, None):
            with pytest.raises(Problem) as refused:
                parse_npz(content, budget)
            assert refused.value.status == 422 and refused.value.errors[0]["pointer"] == where


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(content=archives())
def test_npz_uploads_never_get_a_5xx(server, row_counts, content):
    before = row_counts()
    response = httpx.post(server.url + "/calibrators", data={"name": "npz-fuzz", "method": "platt"},
                          files={"file": ("h.npz", content)}, timeout=60)
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert response.json()["errors"][0]["pointer"].startswith(("/file", "/holdout"))
        assert row_counts() == before
    else:
        httpx.delete(server.url + "/calibrators/npz-fuzz", timeout=60)


def test_the_header_is_read_as_numpy_reads_it():
    """The fuzzer's headers are numpy's own format (a literal dict), so that a refusal is calibd's
    check and not a header nobody could read."""
    member = npy((1, 0), "<f8", (3,), False, np.arange(3.0).tobytes(), None)
    assert np.array_equal(np.load(io.BytesIO(member)), np.arange(3.0))
    length = int.from_bytes(member[8:10], "little")
    assert ast.literal_eval(member[10:10 + length].decode().strip())["shape"] == (3,)
