"""Mixed traffic against a running calibd, from a process of its own.

    python -m tests.reliability.load_client --url http://127.0.0.1:8000 --seconds 60 \\
        --calibrators a,b --fit-name load-fits --out result.json [--key calibd_...]

``--concurrency`` clients (asyncio tasks, one connection each) send, for
``--seconds``: /calibrate (with and without prediction ids), /feedback
(labelled probabilities with an Idempotency-Key, and labels for logged ids),
fits (POST /calibrators, small holdouts) and /evaluate, in fixed proportions.
Any answer other than the expected 2xx, and any transport error, is an error.
The result (JSON) holds the requests, errors, latencies, and the feedback
acknowledged per calibrator (the receipts' counts), which the caller compares
with what the database stored.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
import uuid
from collections import Counter, defaultdict, deque
from pathlib import Path

import httpx
import numpy as np

#: Share of each kind of request.
MIX = {
    "calibrate": 0.50,
    "calibrate_ids": 0.10,
    "feedback": 0.20,
    "feedback_ids": 0.07,
    "evaluate": 0.10,
    "fit": 0.03,
}
EXPECTED = {"calibrate": 200, "calibrate_ids": 200, "feedback": 202, "feedback_ids": 202, "evaluate": 200, "fit": 201}


class Load:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.names = args.calibrators.split(",")
        self.random = random.Random(args.seed)
        self.rng = np.random.default_rng(args.seed)
        self.requests: Counter[str] = Counter()
        self.statuses: dict[str, Counter[int]] = defaultdict(Counter)
        self.latencies: dict[str, list[float]] = defaultdict(list)
        self.errors: list[str] = []
        self.error_count = 0
        self.acknowledged: Counter[str] = Counter()
        self.unknown_ids = 0
        self.logged: deque[tuple[float, str, list[str]]] = deque(maxlen=2000)
        self.fits = 0
        self.versions: set[tuple[str, int]] = set()

    def body(self, kind: str) -> tuple[str, str, dict]:
        r, rng = self.random, self.rng
        name = r.choice(self.names)
        if kind == "calibrate":
            return "POST", "/calibrate", {"calibrator": name, "scores": rng.uniform(0, 1, r.choice((1, 10, 100))).tolist()}
        if kind == "calibrate_ids":
            ids = [uuid.uuid4().hex for _ in range(r.choice((5, 20)))]
            return "POST", "/calibrate", {"calibrator": name, "scores": rng.uniform(0, 1, len(ids)).tolist(), "ids": ids}
        if kind == "feedback":
            p = rng.uniform(0.01, 0.99, r.choice((10, 50)))
            y = (rng.uniform(size=p.shape[0]) < p).astype(int)
            return "POST", "/feedback", {"calibrator": name, "probabilities": p.tolist(), "labels": y.tolist()}
        if kind == "feedback_ids":
            ready = [entry for entry in self.logged if time.monotonic() - entry[0] > 1.0]
            if not ready:
                return self.body("feedback")
            entry = ready[0]
            self.logged.remove(entry)
            _, logged_name, ids = entry
            labels = [int(x) for x in (rng.uniform(size=len(ids)) < 0.5)]
            return "POST", "/feedback", {"calibrator": logged_name, "ids": ids, "labels": labels}
        if kind == "evaluate":
            p = rng.uniform(0, 1, 200)
            return "POST", "/evaluate", {"probabilities": p.tolist(), "labels": (rng.uniform(size=200) < p).astype(int).tolist()}
        if kind == "fit":
            s = rng.uniform(0.01, 0.99, 200)
            y = (rng.uniform(size=200) < s).astype(int)
            method = r.choice(("platt", "isotonic", "temperature", "histogram"))
            return "POST", "/calibrators", {"name": self.args.fit_name, "method": method, "holdout": {"scores": s.tolist(), "labels": y.tolist()}}
        raise ValueError(kind)

    async def worker(self, http: httpx.AsyncClient, deadline: float) -> None:
        kinds, weights = zip(*MIX.items())
        while time.monotonic() < deadline:
            kind = self.random.choices(kinds, weights)[0]
            method, path, body = self.body(kind)
            if kind == "feedback_ids" and "ids" not in body:
                kind = "feedback"
            headers = {"Idempotency-Key": uuid.uuid4().hex} if path == "/feedback" else {}
            started = time.perf_counter()
            try:
                response = await http.request(method, path, json=body, headers=headers)
            except httpx.HTTPError as error:
                self.record_error(kind, f"{kind}: {type(error).__name__}: {error}")
                continue
            self.latencies[kind].append(time.perf_counter() - started)
            self.requests[kind] += 1
            self.statuses[kind][response.status_code] += 1
            if response.status_code != EXPECTED[kind]:
                self.record_error(kind, f"{kind}: {response.status_code} {response.text[:300]}")
                continue
            data = response.json()
            if path == "/feedback":
                # Labels whose prediction was not written yet wait for it, and are joined (the caller waits).
                self.acknowledged[body["calibrator"]] += data["count"] + data["pending"]
                self.unknown_ids += len(data["unknown_ids"])
            elif kind == "calibrate_ids":
                self.logged.append((time.monotonic(), body["calibrator"], body["ids"]))
            elif kind == "fit":
                self.fits += 1
                self.versions.add((data["name"], data["version"]))

    def record_error(self, kind: str, message: str) -> None:
        self.error_count += 1
        if len(self.errors) < 20:
            self.errors.append(message)

    async def run(self) -> dict:
        headers = {"Authorization": f"Bearer {self.args.key}"} if self.args.key else {}
        limits = httpx.Limits(max_connections=self.args.concurrency, max_keepalive_connections=self.args.concurrency)
        async with httpx.AsyncClient(base_url=self.args.url, headers=headers, timeout=self.args.timeout, limits=limits) as http:
            started = time.monotonic()
            deadline = started + self.args.seconds
            await asyncio.gather(*(self.worker(http, deadline) for _ in range(self.args.concurrency)))
            elapsed = time.monotonic() - started
        total = sum(self.requests.values())

        def percentiles(values: list[float]) -> dict[str, float]:
            if not values:
                return {}
            array = np.array(values) * 1000
            return {"p50": round(float(np.percentile(array, 50)), 2), "p99": round(float(np.percentile(array, 99)), 2),
                    "max": round(float(array.max()), 2)}

        return {
            "seconds": round(elapsed, 2),
            "concurrency": self.args.concurrency,
            "requests": total,
            "requests_per_second": round(total / elapsed, 1),
            "by_kind": dict(self.requests),
            "statuses": {kind: dict(counter) for kind, counter in self.statuses.items()},
            "latency_ms": {kind: percentiles(values) for kind, values in self.latencies.items()},
            "errors": self.error_count,
            "error_samples": self.errors,
            "feedback_acknowledged": dict(self.acknowledged),
            "feedback_unknown_ids": self.unknown_ids,
            "fits": self.fits,
            "fit_versions": sorted(v for _, v in self.versions),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", default=None)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--calibrators", required=True, help="comma-separated names fitted beforehand")
    parser.add_argument("--fit-name", default="load-fits")
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    result = asyncio.run(Load(args).run())
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
