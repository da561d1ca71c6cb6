"""Reading request bodies: content types, JSON and its nesting (the size limit is calibd.api.edge's).

Large arrays never pass through per-element pydantic validation: bodies are
parsed with orjson and their arrays validated as numpy arrays by the core.
"""

from __future__ import annotations

import json
import re
import struct
from typing import Any

import numpy as np
import orjson

from ..calibration._fastpath import LIST_MAX
from ..inputs import boolean_index, may_hold_booleans
from .problems import Problem


class BodyTooLarge(Problem):
    def __init__(self, limit: int):
        super().__init__(413, f"request body exceeds the limit of {limit} bytes (CALIBD_MAX_BODY_BYTES)")


def media_type(headers: Any) -> str:
    return headers.get("content-type", "").split(";")[0].strip().lower()


def require_json(headers: Any) -> None:
    kind = media_type(headers)
    if kind and kind != "application/json" and not kind.endswith("+json"):
        raise Problem(415, f"expected Content-Type: application/json, got {kind}")


#: The deepest nesting of arrays and objects a JSON body may have. calibd's own bodies
#: need fewer than ten levels; the limit keeps far below the depths at which parsers and
#: serialisers give up (orjson reads 1,024 and writes 254 levels, and ``json`` recurses).
MAX_JSON_DEPTH = 64


class TooDeep(Problem):
    def __init__(self) -> None:
        super().__init__(400, f"body is not accepted: arrays and objects are nested more than {MAX_JSON_DEPTH} levels deep")


def nesting_depth(body: bytes | memoryview | np.ndarray) -> int:
    """How deeply the arrays and objects of a JSON text nest, without parsing it (no recursion).

    Brackets inside strings do not count: a quote preceded by an odd run of
    backslashes is escaped, and the others open and close strings in turn, so a
    bracket is outside every string when an even number of quotes precede it.
    The depth is then the largest running sum of +1 per ``[``/``{`` and -1 per
    ``]``/``}``. Vectorised (numpy lets go of the GIL for large arrays); for
    invalid JSON the figure is only indicative.
    """
    text = body if isinstance(body, np.ndarray) else np.frombuffer(body, dtype=np.uint8)
    folded = text & 0xDF  # '{' (0x7B) -> '[' (0x5B), '}' (0x7D) -> ']' (0x5D)
    opens = folded == 0x5B
    brackets = np.flatnonzero(opens | (folded == 0x5D))
    if not brackets.size:
        return 0
    quotes = np.flatnonzero(text == 0x22)
    if quotes.size:
        slashes = np.flatnonzero(text == 0x5C)
        if slashes.size:  # runs of backslashes: an odd run escapes the character after it
            breaks = np.flatnonzero(np.diff(slashes) != 1)
            starts, ends = slashes[np.r_[0, breaks + 1]], slashes[np.r_[breaks, slashes.size - 1]]
            after = ends[((ends - starts) % 2 == 0) & (ends + 1 < text.size)] + 1
            escaped = after[text[after] == 0x22]
            if escaped.size:
                quotes = quotes[~np.isin(quotes, escaped, assume_unique=True)]
        brackets = brackets[np.searchsorted(quotes, brackets) % 2 == 0]
    steps = np.where(opens[brackets], np.int32(1), np.int32(-1))
    return int(np.cumsum(steps).max(initial=0))


def check_depth(body: bytes | np.ndarray) -> None:
    """Raise 400 if the JSON text nests deeper than MAX_JSON_DEPTH; cheap for shallow bodies."""
    if isinstance(body, bytes):
        depth = _structure_depth(body)
        if depth is not None:
            if depth > MAX_JSON_DEPTH:
                raise TooDeep()
            return
    if nesting_depth(body) > MAX_JSON_DEPTH:
        raise TooDeep()


#: Every byte but those that make a JSON text's structure: brackets, braces, quotes, backslashes.
_NOT_STRUCTURE = bytes(c for c in range(256) if c not in b'[]{}"\\')
#: ``{`` and ``}`` as ``[`` and ``]``: for depth, an object is an array.
_FOLD = bytes.maketrans(b"{}", b"[]")
_STRING = re.compile(rb'"[^"]*"')


def _structure_depth(body: bytes) -> int | None:
    """The nesting depth by bytes methods alone (a bound, when that bound is at most
    MAX_JSON_DEPTH; capped at MAX_JSON_DEPTH + 1), or None when ``nesting_depth`` must decide
    (a backslash, or text that is not JSON).

    Nesting cannot exceed the number of opening brackets, found with ``bytes.find`` (memchr:
    ``bytes.count`` of one byte loops byte by byte, 2 ns each). Past that, the text is cut to
    its structure (``translate``, braces folded into brackets); without a backslash every
    quote opens or closes a string, so the strings go with one regular expression, and each
    pass that removes the innermost ``[]`` pairs is one level.
    """
    opens = 0
    for bracket in (b"[", b"{"):
        at = body.find(bracket)
        while at >= 0 and opens <= MAX_JSON_DEPTH:
            opens += 1
            at = body.find(bracket, at + 1)
    if opens <= MAX_JSON_DEPTH:
        return opens
    structure = body.translate(_FOLD, _NOT_STRUCTURE)
    if b"\\" in structure:
        return None
    structure = _STRING.sub(b"", structure)
    depth = 0
    while structure and depth <= MAX_JSON_DEPTH:
        shorter = structure.replace(b"[]", b"")  # every innermost pair at once: one level
        if len(shorter) == len(structure):
            return None  # unbalanced: not JSON
        structure, depth = shorter, depth + 1
    return depth


def parse_json(body: bytes, check_nesting: bool = True) -> Any:
    """Parse a JSON body of at most MAX_JSON_DEPTH levels (``check_nesting=False``: the caller
    checks the nesting of what orjson parsed itself, by ``check_depth`` or by its shape).

    NaN and Infinity literals are accepted here (through ``json``, which orjson
    refuses them to) so that validation can point at the element, instead of
    failing the whole body. Whatever the body, the answer is the data or a 400.
    """
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        check_depth(body)
        try:
            data = json.loads(body)
            # What orjson refused and json took must still be storable: no lone surrogates.
            orjson.dumps(data)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise Problem(400, f"body is not valid JSON: {error}") from None
        except orjson.JSONEncodeError:
            raise Problem(400, "body is not valid JSON: a string holds a lone surrogate (\\ud800-\\udfff)") from None
        return data
    if check_nesting:
        check_depth(body)
    return data


def parse_json_object(body: bytes, check_nesting: bool = True) -> dict[str, Any]:
    data = parse_json(body, check_nesting)
    if not isinstance(data, dict):
        if not check_nesting:
            check_depth(body)  # too deep is the answer to a deep array, as it is with the check on
        raise Problem(400, "body must be a JSON object")
    return data


def float_array(values: object) -> np.ndarray | None:
    """A JSON list of more than LIST_MAX floats, or of equal-length rows of floats, as a
    float64 array; else None.

    ``np.asarray`` inspects every element of a list to find its dtype (about
    20-35 ns a number here); ``struct`` packs them straight into the array's
    buffer (about 9 ns). It starts from a float, so numpy would also have made
    float64 of the list, and it converts ints inside the list as numpy would.
    Anything else (strings, nulls, nesting, ragged rows, an int first, a boolean)
    returns None, and the calibrator validates the list itself, errors included.
    /calibrate and the inference protocol's JSON tensors pack their floats with it.
    """
    if type(values) is not list or not values:
        return None
    first = values[0]
    try:
        if type(first) is float and len(values) > LIST_MAX:  # shorter lists are checked as lists
            out = np.empty(len(values))
            struct.pack_into(f"{len(values)}d", out, 0, *values)
            return _unless_booleans(out, values)
        if type(first) is list and first and type(first[0]) is float:
            width = len(first)
            flat: list = []
            for row in values:
                if type(row) is not list or len(row) != width:
                    return None
                flat += row
            out = np.empty((len(values), width))
            struct.pack_into(f"{len(flat)}d", out, 0, *flat)
            return _unless_booleans(out, values)
    except (struct.error, TypeError, OverflowError):
        return None
    return None


def _unless_booleans(out: np.ndarray, values: list) -> np.ndarray | None:
    """``out``, or None when ``values`` held a boolean (``struct`` packs it as 0 or 1): the
    calibrator's own checks then refuse it, pointing at it."""
    if may_hold_booleans(out) and boolean_index(values, out.ndim) is not None:
        return None
    return out
