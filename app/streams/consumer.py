"""Labels from a Redis stream into calibd's feedback, each counted exactly once.

The consumer reads a stream through a consumer group (``XREADGROUP``), records each message's
rows as ``POST /feedback`` records them, and acknowledges a message (``XACK``) only after its rows
are committed. What a consumer that died left pending is reclaimed (``XAUTOCLAIM``) once it has
been idle for ``claim_idle_ms``. A message that can never be recorded (not JSON, no calibrator, a
422 from the feedback rules) goes to the dead-letter stream with the reason, and is acknowledged:
the consumer never stalls on one.

Exactly once, whatever crashes:

* a batch message (its own ``/feedback`` body, or an Arrow IPC table) is recorded under the
  idempotency key ``stream:<stream>:<message id>``: stored in the same transaction as its rows, so
  a message recorded and then redelivered (the consumer died before ``XACK``) is answered from the
  key and counted once;
* row messages (one ``id`` and its ``label``) are merged, consecutive ones of a calibrator, into
  one request. A label for an id that already has one is a duplicate under ``/feedback``'s rules
  and is not counted again, so a merged batch sent again after a crash counts nothing twice.

Message fields (all strings): ``format`` (``json``, the default, or ``arrow``) and ``data`` (the
payload). A JSON payload is either one row, ``{"calibrator": "fraud-model", "id": "req-1",
"label": 1}``, or a whole ``/feedback`` body; an Arrow payload is the table ``/feedback`` takes as
``application/vnd.apache.arrow.stream``, with the fields ``calibrator`` (and optionally
``version``) beside it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from .metrics import StreamMetrics

log = logging.getLogger("calibd.streams")

ARROW_STREAM = "application/vnd.apache.arrow.stream"


@dataclass(frozen=True)
class FeedbackTarget:
    """Where feedback is recorded: a calibd's URL and a feedback-scoped key."""

    url: str
    api_key: str | None = None
    timeout: float = 120.0


class Transient(Exception):
    """calibd could not record it now (unreachable, 429, 5xx): try again later, do not dead-letter."""


class Refused(Exception):
    """calibd refused it for good (4xx): the message goes to the dead-letter stream."""


def record_feedback(http: httpx.Client, target: FeedbackTarget, body: bytes, content_type: str,
                    params: dict[str, str], idempotency_key: str) -> dict[str, Any]:
    """Record one feedback request, as ``POST /feedback`` does, and return its receipt.

    The one place the consumer records feedback: it posts to calibd's ``/feedback``, so the
    duplicate, pending-label and idempotency rules are the route's own. The idempotency key is
    stored with the rows in one transaction.
    """
    headers = {"Content-Type": content_type, "Idempotency-Key": idempotency_key}
    if target.api_key:
        headers["Authorization"] = f"Bearer {target.api_key}"
    try:
        response = http.post(target.url.rstrip("/") + "/feedback", content=body, params=params, headers=headers,
                             timeout=target.timeout)
    except httpx.TransportError as error:
        raise Transient(f"{type(error).__name__}: {error}") from None
    if response.status_code in (200, 202):
        return orjson.loads(response.content)
    if response.status_code in (408, 429) or response.status_code >= 500:
        raise Transient(f"{response.status_code}: {response.text[:300]}")
    try:
        problem = response.json()
        reason = problem.get("detail") or problem.get("title") or response.text
    except ValueError:
        reason = response.text
    raise Refused(f"{response.status_code}: {reason}"[:1000])


@dataclass
class Message:
    id: str
    fields: dict[str, bytes]
    row: dict[str, Any] | None = None  # a row message, parsed
    request: tuple[bytes, str, dict[str, str]] | None = None  # a batch message: body, type, params


@dataclass
class StreamConsumer:
    """One consumer of a group on one stream (see the module docstring)."""

    redis: Any  # redis.Redis
    stream: str
    group: str
    consumer: str
    target: FeedbackTarget
    dead_letter: str | None = None  # default: "<stream>:dead-letter"
    batch: int = 5000  # messages per read
    block_ms: int = 1000
    claim_idle_ms: int = 30_000
    metrics: StreamMetrics = field(default_factory=StreamMetrics.default)
    http: httpx.Client = field(default_factory=httpx.Client)
    retry_delay: float = 0.5

    def __post_init__(self) -> None:
        self.dead_letter = self.dead_letter or f"{self.stream}:dead-letter"
        self.stopping = False

    def ensure_group(self) -> None:
        """The consumer group, made at the start of the stream (and the stream) if missing."""
        import redis

        try:
            self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise

    def run(self, until_idle: bool = False) -> None:
        """Consume until ``stop()`` (or, with ``until_idle``, until nothing is new nor pending)."""
        self.ensure_group()
        # This consumer's own pending messages first (a restart under the same name).
        self.handle(self._read("0"))
        cursor = "0-0"
        while not self.stopping:
            cursor, claimed = self._claim(cursor)
            if claimed:
                self.handle(claimed)
                continue
            messages = self._read(">")
            self.handle(messages)
            self.update_lag()
            if until_idle and not messages and not self.pending():
                return

    def stop(self) -> None:
        self.stopping = True

    def pending(self) -> int:
        return int(self.redis.xpending(self.stream, self.group)["pending"])

    def update_lag(self) -> None:
        for info in self.redis.xinfo_groups(self.stream):
            if _text(info["name"]) == self.group:
                lag = info.get("lag")
                self.metrics.lag.labels(self.stream, self.group).set(float(lag) if lag is not None else float("nan"))
                self.metrics.pending.labels(self.stream, self.group).set(info["pending"])

    def _read(self, start: str) -> list[tuple[str, dict[bytes, bytes]]]:
        answer = self.redis.xreadgroup(self.group, self.consumer, {self.stream: start}, count=self.batch,
                                       block=None if start != ">" else self.block_ms)
        return [(_text(i), f) for _, entries in answer or [] for i, f in entries if f is not None]

    def _claim(self, cursor: str) -> tuple[str, list]:
        answer = self.redis.xautoclaim(self.stream, self.group, self.consumer, self.claim_idle_ms, cursor,
                                       count=self.batch)
        next_cursor, entries = _text(answer[0]), answer[1]
        claimed = [(_text(i), f) for i, f in entries if f]
        for gone in answer[2] if len(answer) > 2 else []:  # deleted from the stream while pending
            self.redis.xack(self.stream, self.group, gone)
        return next_cursor, claimed

    # -- one read's messages ------------------------------------------------------------------

    def handle(self, entries: Iterable[tuple[str, dict[bytes, bytes]]]) -> None:
        """Record one read's messages in order; acknowledge each only after its rows are committed."""
        group: list[Message] = []
        for message_id, raw in entries:
            self.metrics.messages.labels(self.stream).inc()
            fields = {_text(k): v for k, v in raw.items()}
            message = Message(message_id, fields)
            try:
                parse(message)
            except ValueError as error:
                self.dead(message, str(error))
                continue
            if message.row is not None:
                if group and group[0].row["calibrator"] != message.row["calibrator"]:
                    self.send_rows(group)
                    group = []
                group.append(message)
                continue
            if group:
                self.send_rows(group)
                group = []
            self.send_one(message)
        if group:
            self.send_rows(group)

    def send_rows(self, group: list[Message]) -> None:
        body = orjson.dumps({
            "calibrator": group[0].row["calibrator"],
            "ids": [m.row["id"] for m in group],
            "labels": [m.row["label"] for m in group],
        })
        key = f"stream:{self.stream}:{group[0].id}-{group[-1].id}:{len(group)}"
        try:
            receipt = self._record(body, "application/json", {}, key)
        except Refused as error:
            if len(group) == 1:
                self.dead(group[0], str(error))
                return
            # One bad row refuses the whole request: record each alone, dead-letter the bad ones.
            for message in group:
                self.send_rows([message])
            return
        self.done(group, receipt)

    def send_one(self, message: Message) -> None:
        body, content_type, params = message.request
        try:
            receipt = self._record(body, content_type, params, f"stream:{self.stream}:{message.id}")
        except Refused as error:
            self.dead(message, str(error))
            return
        self.done([message], receipt)

    def _record(self, body: bytes, content_type: str, params: dict[str, str], key: str) -> dict[str, Any]:
        """Record, retrying what calibd could not do now (it is down, or busy) until it can or we stop."""
        delay = self.retry_delay
        while True:
            try:
                return record_feedback(self.http, self.target, body, content_type, params, key)
            except Transient as error:
                self.metrics.errors.labels(self.stream, "transient").inc()
                log.warning("feedback not recorded yet (%s); retrying in %.1f s", error, delay)
                if self.stopping:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 10.0)

    def done(self, messages: list[Message], receipt: dict[str, Any]) -> None:
        self.redis.xack(self.stream, self.group, *[m.id for m in messages])
        self.metrics.rows.labels(self.stream).inc(receipt.get("count", 0))
        self.metrics.acked.labels(self.stream).inc(len(messages))

    def dead(self, message: Message, reason: str) -> None:
        """The message, whole, to the dead-letter stream with the reason; then acknowledged (one transaction)."""
        entry = {**message.fields, "reason": reason, "stream": self.stream, "message_id": message.id}
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.xadd(self.dead_letter, entry)
            pipe.xack(self.stream, self.group, message.id)
            pipe.execute()
        self.metrics.errors.labels(self.stream, "dead_letter").inc()
        log.warning("message %s of %s to %s: %s", message.id, self.stream, self.dead_letter, reason)


def parse(message: Message) -> None:
    """Read a message's fields into a row or a request; ValueError says why it cannot be recorded."""
    kind = _text(message.fields.get("format", b"json"))
    data = message.fields.get("data")
    if data is None:
        raise ValueError("no data field")
    if kind == "arrow":
        calibrator = message.fields.get("calibrator")
        if not calibrator:
            raise ValueError("an arrow message needs a calibrator field")
        params = {"calibrator": _text(calibrator)}
        if message.fields.get("version"):
            params["version"] = _text(message.fields["version"])
        message.request = (data, ARROW_STREAM, params)
        return
    if kind != "json":
        raise ValueError(f"format is {kind!r}: json or arrow")
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError as error:
        raise ValueError(f"data is not JSON: {error}") from None
    if not isinstance(payload, dict):
        raise ValueError("data is not a JSON object")
    if not isinstance(payload.get("calibrator"), str) or not payload["calibrator"]:
        raise ValueError("data has no calibrator (a string)")
    if "id" in payload or "label" in payload:
        extra = set(payload) - {"calibrator", "id", "label"}
        if extra or not isinstance(payload.get("id"), str) or "label" not in payload:
            raise ValueError('a row is {"calibrator": ..., "id": "<string>", "label": ...} and nothing else')
        message.row = payload
        return
    message.request = (bytes(data), "application/json", {})


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
