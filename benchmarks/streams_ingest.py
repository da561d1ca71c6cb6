"""Labels from a Redis stream against POST /feedback, and KServe's payload logger route (issue 33).

    .venv/bin/python benchmarks/streams_ingest.py [--runs 3] [--batches 20] [--pairs 2000] [--clients 4] [--latency-requests 1000]
        [--cloudevents-only] [--floor] [--pin] [--load python|wrk] [--paced MS,MS] [--intake same|separate]
        [--pin-database] [--profile DIR]

A `calibd serve` process (one uvicorn worker, auth on) on a fresh schema of the local PostgreSQL
(CALIBD_BENCH_POSTGRES_URL) and the local Redis (CALIBD_BENCH_REDIS_URL, default 127.0.0.1:6379).

* Stream against HTTP, the same rows: ``--batches`` batches of 5,000 self-contained labels
  ({"calibrator", "probabilities", "labels"}). POST /feedback: one client posts them in turn, rows
  per second from the first request to the last 202. The stream: `calibd consume` is started
  and waits on an empty stream; the batches are added (one message each, XADD in one pipeline)
  and rows per second run from the first XADD until the group has read and acknowledged every
  message (XINFO GROUPS: lag 0, pending 0), that is, until every row is committed. The two run
  back to back, their order alternating between runs.
* POST /cloudevents: ``--pairs`` request/response pairs, shaped as KServe's logger sends them
  (tests/test_cloudevents.py), from ``--clients`` concurrent clients; against /calibrate with
  ids, one row per request, as many requests from as many clients, in the same run.
* /calibrate's p99 (100 scores, one client, ``--latency-requests`` requests) idle, and while a
  process of its own posts CloudEvents pairs flat out from ``--clients`` threads.

``--cloudevents-only`` skips the stream comparison (the CloudEvents figures alone, a shorter run).
``--floor`` also times /calibrate while the load posts the same events to /benchmark/cloudevents-floor,
which takes them as /cloudevents does (edge, key, headers, body read) and answers 202 unparsed and unpaired:
the part of the p99 any route answering each event over HTTP in this process costs.
``--pin`` puts the logger's load on CPU 1, the server and this process (the /calibrate client) on CPU 0.
``--load wrk`` posts the logger's load with wrk (benchmarks/cloudevents_logger.lua, ``--clients``
connections, one thread) in place of a Python process: KServe's logger is a Go agent beside the
model, whose own CPU per event is far below a Python client's. ``--paced 8,4,2,1`` adds the logger
paced below its full rate (each connection waits that many ms between an answer and its next
request): /calibrate's p99 against the rate at which the model's predictions are logged.
``--intake separate`` sends the logger's load to a second `calibd serve` on the same database, as
docs/cloudevents.md advises beyond a few hundred logged predictions a second (the logger's `url` pointing
at a calibd deployment of its own), while /calibrate is timed on the first; with ``--pin`` the second
server shares CPU 1 with the load. ``--pin-database`` (with ``--pin``) puts the local PostgreSQL's
processes on CPU 1 too, for the run: a database on a host of its own, as in a deployment (the server
timed reads none per /calibrate, but the prediction log's writes take CPU). ``--profile DIR`` records the server with py-spy (when installed) while the logger load runs, one
flame graph per run in DIR.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (CALIBD, Server, Target, fmt_rate, machine, median, pinned, pinned_database, postgres_available,  # noqa: E402
                      postgres_schema, write_results)

BATCH = 5_000
REDIS_URL = os.environ.get("CALIBD_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


def post_feedback(server: Server, bodies: list[bytes]) -> float:
    import httpx

    started = time.perf_counter()
    with httpx.Client(base_url=server.url, headers={**server.headers, "Content-Type": "application/json"}, timeout=120) as http:
        for body in bodies:
            answer = http.post("/feedback", content=body)
            if answer.status_code != 202 or answer.json()["count"] != BATCH:
                raise RuntimeError(f"/feedback: {answer.status_code} {answer.text[:300]}")
    return time.perf_counter() - started


def consume_stream(server: Server, redis_client, bodies: list[bytes]) -> float:
    stream = f"calibd-bench:{uuid.uuid4().hex}"
    consumer = subprocess.Popen(
        [CALIBD, "consume", "--redis", REDIS_URL, "--stream", stream, "--group", "g", "--url", server.url],
        env={**os.environ, "CALIBD_API_KEY": server.key}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not (redis_client.exists(stream) and redis_client.xinfo_groups(stream)):  # the consumer is up
            if consumer.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"calibd consume did not start: {consumer.stderr.read().decode()[-2000:]}")
            time.sleep(0.05)
        time.sleep(0.5)
        started = time.perf_counter()
        pipe = redis_client.pipeline(transaction=False)
        for body in bodies:
            pipe.xadd(stream, {"data": body})
        pipe.execute()
        while True:
            (group,) = redis_client.xinfo_groups(stream)
            if group["entries-read"] == len(bodies) and group["pending"] == 0:
                break
            if consumer.poll() is not None or time.perf_counter() - started > 600:
                raise RuntimeError(f"calibd consume stopped: {consumer.stderr.read().decode()[-2000:]}")
            time.sleep(0.01)
        seconds = time.perf_counter() - started
        if redis_client.xlen(f"{stream}:dead-letter"):
            raise RuntimeError("messages went to the dead-letter stream")
        return seconds
    finally:
        consumer.terminate()
        consumer.wait(timeout=30)
        redis_client.delete(stream, f"{stream}:dead-letter")


def cloudevent(ce_id: str, kind: str, service: str, p: float) -> tuple[dict[str, str], bytes]:
    """Headers and body as KServe's logger sends them (pkg/logger/worker.go)."""
    headers = {
        "ce-id": ce_id, "ce-type": f"org.kubeflow.serving.inference.{kind}", "ce-source": "http://localhost:9081/",
        "ce-specversion": "1.0", "ce-time": "2026-01-01T00:00:00Z", "content-type": "application/json",
        "ce-inferenceservicename": service, "ce-namespace": "default", "ce-component": "predictor", "ce-endpoint": "",
        "ce-metadata": "{}", "ce-recordedtime": "2026-01-01T00:00:00Z",
    }
    if kind == "request":
        body = {"inputs": [{"name": "input-0", "shape": [1, 4], "datatype": "FP32", "data": [[6.8, 2.8, 4.8, 1.4]]}]}
    else:
        body = {"model_name": service, "id": ce_id,
                "outputs": [{"name": "predict_proba", "shape": [1, 2], "datatype": "FP64", "data": [1 - p, p]}]}
    return headers, json.dumps(body).encode()


def timed_posts(server: Server, requests: list[tuple[str, dict[str, str], bytes]], clients: int, status: int) -> float:
    """Every (path, headers, body) posted, shared among ``clients`` in order; seconds."""
    import httpx

    shares = [requests[i::clients] for i in range(clients)]

    def run(share: list) -> None:
        with httpx.Client(base_url=server.url, headers=server.headers, timeout=120) as http:
            for path, headers, body in share:
                answer = http.post(path, headers=headers, content=body)
                if answer.status_code != status:
                    raise RuntimeError(f"{path}: {answer.status_code} {answer.text[:300]}")

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(run, shares))
    return time.perf_counter() - started


def calibrate_latencies(server: Server, requests: int) -> list[float]:
    """Seconds of each of ``requests`` sequential /calibrate requests (100 scores), one client."""
    import httpx

    body = orjson.dumps({"calibrator": "ids", "scores": np.linspace(0.01, 0.99, 100).tolist()})
    seconds = []
    with httpx.Client(base_url=server.url, headers={**server.headers, "Content-Type": "application/json"}, timeout=60) as http:
        for _ in range(requests):
            started = time.perf_counter()
            answer = http.post("/calibrate", content=body)
            seconds.append(time.perf_counter() - started)
            if answer.status_code != 200:
                raise RuntimeError(f"/calibrate: {answer.status_code} {answer.text[:300]}")
    return seconds


def logger_load(url: str, key: str, clients: int, stop_file: str, path: str = "/cloudevents") -> None:
    """A process of its own posting CloudEvents pairs to ``path`` flat out from ``clients`` threads until
    ``stop_file`` exists; then writes when each post was answered (time.perf_counter, the system's monotonic
    clock) to ``stop_file``.npy."""
    import httpx

    answered: list[list[float]] = [[] for _ in range(clients)]

    def run(worker: int) -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
            i = 0
            while not os.path.exists(stop_file):
                ce_id = f"load-{worker}-{i}-{uuid.uuid4().hex[:8]}"
                for kind in ("request", "response"):
                    headers, body = cloudevent(ce_id, kind, "ce", 0.4)
                    http.post(path, headers=headers, content=body)
                    answered[worker].append(time.perf_counter())
                i += 1

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(run, range(clients)))
    np.save(stop_file + ".npy", np.sort(np.concatenate([np.asarray(times) for times in answered])))


LOGGER_SCRIPT = Path(__file__).resolve().parent / "cloudevents_logger.lua"


def wrk_load(url: str, key: str, clients: int, path: str, cpus: str | None, delay_ms: int = 0) -> subprocess.Popen:
    """wrk posting CloudEvents pairs to ``path`` on ``clients`` connections, each waiting ``delay_ms``
    between an answer and its next request (0: flat out), until it is sent SIGINT (then it prints its
    summary: requests, seconds, non-2xx answers)."""
    prefix = f"wrk-{uuid.uuid4().hex[:8]}"
    command = ["wrk", "-t1", f"-c{clients}", "-d3600s", "-s", str(LOGGER_SCRIPT), url, "--", path, key, prefix, str(delay_ms)]
    return subprocess.Popen(pinned(command, cpus), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wrk_rate(output: str) -> float:
    """Requests per second from wrk's summary; raises if any answer was not 2xx."""
    if "Non-2xx" in output or "Socket errors" in output:
        raise RuntimeError(f"the logger's load got errors:\n{output}")
    for line in output.splitlines():
        if line.startswith("Requests/sec:"):
            return float(line.split()[1])
    raise RuntimeError(f"no wrk summary:\n{output}")


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` (its threads included), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def under_load(server: Server, args, run: int, path: str, rates: dict, prefix: str, delay_ms: int = 0,
               intake: Server | None = None) -> None:
    """/calibrate's p99 on ``server`` while a process of its own posts CloudEvents pairs to ``path`` of
    ``intake`` (by default the same server) at its full rate; the load's rate, and the share of a core the
    servers and the load's process took meanwhile."""
    stop_file = str(server.tmp / f"stop-{run}-{prefix}")
    target = intake or server
    if args.load == "wrk":
        load = wrk_load(target.url, target.key, args.clients, path, "1" if args.pin else None, delay_ms)
    else:
        load = subprocess.Popen(pinned([sys.executable, __file__, "--logger-load", target.url, target.key, str(args.clients),
                                        stop_file, path], "1" if args.pin else None))
    profiler = None
    try:
        time.sleep(2.0)
        if args.profile:
            Path(args.profile).mkdir(parents=True, exist_ok=True)
            profiler = subprocess.Popen(
                [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(server.process.pid), "--rate", "200",
                 "--format", "raw", "--output", f"{args.profile}/{prefix}run{run + 1}.txt", "--nonblocking"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        me = threading.get_native_id()  # the /calibrate client's thread

        def cpu_now() -> dict[str, float]:
            return {"timed": cpu_seconds(server.process.pid), "load": cpu_seconds(load.pid),
                    "events": cpu_seconds(target.process.pid), "clock": time.perf_counter()}

        waits_before = runqueue_seconds(server.process.pid), runqueue_seconds(os.getpid(), me)
        cpu_before = cpu_now()
        rates[prefix + "loaded_p99"].append(p99(calibrate_latencies(server, args.latency_requests)))
        cpu_after = cpu_now()
        waits_after = runqueue_seconds(server.process.pid), runqueue_seconds(os.getpid(), me)
    finally:
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)
            profiler.wait(timeout=60)
        if args.load == "wrk":
            load.send_signal(signal.SIGINT)
        else:
            Path(stop_file).touch()
        output, _ = load.communicate(timeout=60)
    # While timed: the load's rate, and the CPU per event of the server taking the events (when that is the
    # server timed, its share of the /calibrate requests is included).
    spent = {key: cpu_after[key] - cpu_before[key] for key in cpu_before}
    wall = spent["clock"]
    if args.load == "wrk":  # over wrk's whole run, which starts 2 s before the timing and stops after it
        rates[prefix + "load_rate"].append(wrk_rate(output))
    else:
        answered = np.load(stop_file + ".npy")
        rates[prefix + "load_rate"].append(np.count_nonzero((answered >= cpu_before["clock"]) & (answered <= cpu_after["clock"])) / wall)
    rates[prefix + "server_cpu"].append(spent["timed"] / wall)
    rates[prefix + "load_cpu"].append(spent["load"] / wall)
    rates[prefix + "cpu_per_event"].append(spent["events"] / (rates[prefix + "load_rate"][-1] * wall))
    rates[prefix + "p99_ratio"].append(rates[prefix + "loaded_p99"][-1] / rates["idle_p99"][-1])
    # How long the server's event loop and the /calibrate client waited for a CPU, a millisecond a second.
    rates[prefix + "server_wait"].append((waits_after[0] - waits_before[0]) / wall * 1e3)
    rates[prefix + "client_wait"].append((waits_after[1] - waits_before[1]) / wall * 1e3)


def runqueue_seconds(pid: int, tid: int | None = None) -> float:
    """Seconds thread ``tid`` of ``pid`` (its main thread by default) has waited, runnable, for a CPU
    (/proc schedstat's second field)."""
    return int(Path(f"/proc/{pid}/task/{tid or pid}/schedstat").read_text().split()[1]) / 1e9


def p99(seconds: list[float]) -> float:
    return float(np.percentile(seconds, 99))


def cloudevents_section(args, rates: dict, started_machine: str) -> list[str]:
    """The --cloudevents-only run's section: a subsection of the issue-33 one."""

    def each(key: str, fmt) -> str:
        return ", ".join(fmt(r) for r in rates[key])

    ms, ratio, rate = (lambda r: f"{r * 1e3:.1f}"), (lambda r: f"{r:.2f}"), (lambda r: f"{r:,.0f}")
    us = lambda r: f"{r * 1e6:.0f}"  # noqa: E731
    def row(label: str, prefix: str, bold: bool = False, cpu_note: str = "") -> str:
        """One loaded row: the p99, its ratio to idle, the load's rate, CPU an event, waits for a CPU."""
        b = "**" if bold else ""
        return (f"| {label} | {b}{ms(median(rates[prefix + 'loaded_p99']))} ms{b} ({each(prefix + 'loaded_p99', ms)}) "
                f"| {b}{ratio(median(rates[prefix + 'p99_ratio']))}x{b} ({each(prefix + 'p99_ratio', ratio)}) "
                f"| {rate(median(rates[prefix + 'load_rate']))} ({each(prefix + 'load_rate', rate)}) "
                f"| {us(median(rates[prefix + 'cpu_per_event']))} ({each(prefix + 'cpu_per_event', us)}){cpu_note} "
                f"| {median(rates[prefix + 'server_wait']):.0f} / {median(rates[prefix + 'client_wait']):.0f} |")

    separate = args.intake == "separate"
    options = " --floor" * args.floor + " --pin" * args.pin + " --pin-database" * args.pin_database + (" --load wrk" if args.load == "wrk" else "") + (
        f" --paced {','.join(map(str, args.paced_delays))}" if args.paced_delays else "") + " --intake separate" * separate
    lines = [
        "### /calibrate p99 while the payload logger posts at its full rate to a calibd deployment of its own" if separate else
        "### /calibrate p99 under the payload logger's full rate, and its floor",
        "",
        f"`benchmarks/streams_ingest.py --cloudevents-only{options} --runs {args.runs} --pairs {args.pairs} "
        f"--clients {args.clients} --latency-requests {args.latency_requests}`; {started_machine}. " + (
            "Two `calibd serve` processes of one uvicorn worker each (auth on) on one PostgreSQL database on the same "
            "machine: /calibrate timed on the first, the logger posting to the second (its own deployment); " if separate else
            "One uvicorn worker (auth on), PostgreSQL on the same machine; ") + (
            ("the logger's load and the second server" if separate else "the logger's load") +
            (" and PostgreSQL's processes on CPU 1, " if args.pin_database else " on CPU 1, ") +
            "the server timed and the /calibrate client on CPU 0. " if args.pin else "nothing pinned (as the section above). ") +
        "/calibrate: 100 scores, one client, one request at a time. Load: " + (
            f"wrk (benchmarks/cloudevents_logger.lua), {args.clients} connections posting CloudEvents pairs flat out"
            if args.load == "wrk" else
            f"a process of its own, {args.clients} threads posting CloudEvents pairs flat out") +
        ". Medians over runs, each run's figures in brackets.",
        "",
        "| | /calibrate p99 | over idle, same run | load's rate (events/s) | "
        f"{'the second server' if separate else 'server'} CPU an event (us) "
        "| waits for a CPU, ms a second: server's loop / /calibrate client |",
        "|---|---:|---:|---:|---:|---:|",
        f"| idle | {ms(median(rates['idle_p99']))} ms ({each('idle_p99', ms)}) | | | "
        f"| {median(rates['idle_server_wait']):.0f} / {median(rates['idle_client_wait']):.0f} |",
        row(f"the logger posting to POST /cloudevents{' of the second server' if separate else ''}", "", bold=True),
    ]
    if separate:
        lines.append(row("the same load posting to the server timed (one worker takes the events and /calibrate)", "same_",
                         cpu_note=", the server timed"))
    if args.floor:
        lines.append(row("the same load posting to the floor route (202, body unread)", "floor_"))
    for delay_ms in args.paced_delays:
        lines.append(row(f"the logger paced: {args.clients} connections, each {delay_ms} ms between an answer and its next request",
                         f"paced{delay_ms}_"))
    target = median(rates["p99_ratio"])
    lines += ["", f"Target (issue 33): /calibrate p99 under the logger at most 1.5x idle: "
                  f"**{'met' if target <= 1.5 else 'NOT met'}** ({ratio(target)}x). " + (
                      "The second server's CPU an event is its own alone: it serves no /calibrate." if separate else
                      "The server's CPU an event includes its share of the /calibrate requests timed meanwhile.")]
    return lines


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--logger-load":
        logger_load(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batches", type=int, default=20, help="batches of 5,000 labels per run (default 20)")
    parser.add_argument("--pairs", type=int, default=2000, help="CloudEvents request/response pairs per run")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients for the CloudEvents comparison")
    parser.add_argument("--latency-requests", type=int, default=1000, help="/calibrate requests timed idle and under the logger")
    parser.add_argument("--cloudevents-only", action="store_true", help="skip the Redis stream against /feedback comparison")
    parser.add_argument("--floor", action="store_true",
                        help="also /calibrate's p99 while the load posts to the benchmark floor route (202 unread)")
    parser.add_argument("--pin", action="store_true",
                        help="the logger's load on CPU 1, the server and the /calibrate client on CPU 0 (PostgreSQL unpinned, "
                             "unless --pin-database)")
    parser.add_argument("--load", choices=("python", "wrk"), default="python",
                        help="what posts the logger's load: a Python process (threads of httpx clients) or wrk")
    parser.add_argument("--paced", default="", metavar="MS,MS",
                        help="with --load wrk: also the logger paced, each connection waiting MS ms between an answer "
                             "and its next request (e.g. 8,4,2,1): /calibrate's p99 against the logger's rate")
    parser.add_argument("--intake", choices=("same", "separate"), default="same",
                        help="where the logger posts: the server timed (same) or a second calibd serve on the same database "
                             "(separate; with --pin, on CPU 1 beside the load)")
    parser.add_argument("--pin-database", action="store_true",
                        help="with --pin: the local PostgreSQL's processes on CPU 1 too (a database on a host of its own), "
                             "their CPU sets restored afterwards")
    parser.add_argument("--profile", metavar="DIR", help="py-spy record the server under the logger load, into DIR")
    args = parser.parse_args(argv)
    if args.pin_database and not args.pin:
        parser.error("--pin-database needs --pin")
    if (args.intake == "separate" or args.pin_database) and not args.cloudevents_only:
        parser.error("--intake separate and --pin-database need --cloudevents-only (their rows are in that section)")
    if args.paced and (args.load != "wrk" or not args.cloudevents_only):
        parser.error("--paced needs --load wrk and --cloudevents-only (its rows are in that section)")
    import redis

    redis_client = redis.Redis.from_url(REDIS_URL)
    if not postgres_available():
        print("PostgreSQL unreachable: streams_ingest not run", file=sys.stderr)
        return 1
    redis_client.ping()
    rng = np.random.default_rng(0)
    started_machine = machine()
    paced = args.paced_delays = [int(ms) for ms in args.paced.split(",") if ms.strip()]
    rates: dict[str, list[float]] = defaultdict(list)  # figure -> one value per run
    if args.pin:
        os.sched_setaffinity(0, {0})
    with (pinned_database({1} if args.pin_database else None), postgres_schema() as url,
          Server(database_url=url, cpus="0" if args.pin else None) as server,
          # the same key opens both: it is the same database
          Server(database_url=url, key=server.key, cpus="1" if args.pin else None) if args.intake == "separate"
          else contextlib.nullcontext() as intake):
        s = rng.random(20_000)
        for name in ("http", "stream", "ce", "ids"):
            server.fit(name, "platt", s, (rng.random(s.shape[0]) < s).astype(int))
        for run in range(args.runs):
            if not args.cloudevents_only:
                batches = []
                for _ in range(args.batches):
                    p = rng.random(BATCH)
                    batches.append((p.tolist(), (rng.random(BATCH) < p).astype(int).tolist()))
                for step in (("http", "stream") if run % 2 == 0 else ("stream", "http")):
                    bodies = [orjson.dumps({"calibrator": step, "probabilities": p, "labels": y}) for p, y in batches]
                    seconds = post_feedback(server, bodies) if step == "http" else consume_stream(server, redis_client, bodies)
                    rates[step].append(args.batches * BATCH / seconds)
                rates["ratio"].append(rates["stream"][-1] / rates["http"][-1])

            scores = rng.random(args.pairs)
            ids = [str(uuid.uuid4()) for _ in range(args.pairs)]
            events = [("/cloudevents", *cloudevent(ids[i], kind, "ce", float(scores[i])))
                      for i in range(args.pairs) for kind in ("request", "response")]
            # The same number of requests to /calibrate, one row each, with an id.
            calls = [("/calibrate", {"Content-Type": "application/json"},
                      orjson.dumps({"calibrator": "ids", "scores": [float(scores[i // 2])], "ids": [f"{ids[i // 2]}-{i % 2}"]}))
                     for i in range(2 * args.pairs)]
            for step in (("ce", "calibrate") if run % 2 == 0 else ("calibrate", "ce")):
                if step == "ce":
                    rates["ce"].append(len(events) / timed_posts(server, events, args.clients, 202))
                else:
                    rates["calibrate"].append(len(calls) / timed_posts(server, calls, args.clients, 200))
            rates["ce_ratio"].append(rates["ce"][-1] / rates["calibrate"][-1])
            # /calibrate's p99, idle and while a process of its own posts CloudEvents at its full rate.
            me, started = threading.get_native_id(), time.perf_counter()
            waits = runqueue_seconds(server.process.pid), runqueue_seconds(os.getpid(), me)
            rates["idle_p99"].append(p99(calibrate_latencies(server, args.latency_requests)))
            wall = time.perf_counter() - started
            rates["idle_server_wait"].append((runqueue_seconds(server.process.pid) - waits[0]) / wall * 1e3)
            rates["idle_client_wait"].append((runqueue_seconds(os.getpid(), me) - waits[1]) / wall * 1e3)
            # The floor (--floor) before the logger in even runs, after it in odd ones; with --intake separate the
            # same load on the server timed as well, after the logger in even runs, before it in odd ones.
            loads = [("/benchmark/cloudevents-floor", "floor_", intake)] * args.floor + [("/cloudevents", "", intake)] + (
                [("/cloudevents", "same_", None)] if intake is not None else [])
            for path, prefix, events_to in (loads if run % 2 == 0 else loads[::-1]):
                under_load(server, args, run, path, rates, prefix, intake=events_to)
            for delay_ms in paced:
                under_load(server, args, run, "/cloudevents", rates, f"paced{delay_ms}_", delay_ms, intake=intake)
            streams = "" if args.cloudevents_only else (
                f"/feedback {rates['http'][-1]:,.0f} rows/s, stream {rates['stream'][-1]:,.0f} rows/s ({rates['ratio'][-1]:.2f}x); ")
            print(f"  run {run + 1}: {streams}/cloudevents {rates['ce'][-1]:,.0f} events/s, "
                  f"/calibrate one row {rates['calibrate'][-1]:,.0f} requests/s; /calibrate p99 {rates['idle_p99'][-1] * 1e3:.1f} ms idle, "
                  f"{rates['loaded_p99'][-1] * 1e3:.1f} ms under the logger ({rates['load_rate'][-1]:,.0f} events/s; server timed "
                  f"{rates['server_cpu'][-1]:.0%} of a core, {'the second server ' if intake is not None else ''}"
                  f"{rates['cpu_per_event'][-1] * 1e6:.0f} us CPU an event; "
                  f"logger process {rates['load_cpu'][-1]:.0%}; waits for a CPU, ms a second, server/client: idle "
                  f"{rates['idle_server_wait'][-1]:.0f}/{rates['idle_client_wait'][-1]:.0f}, loaded "
                  f"{rates['server_wait'][-1]:.0f}/{rates['client_wait'][-1]:.0f})" + (
                      f"; {rates['floor_loaded_p99'][-1] * 1e3:.1f} ms under the floor route ({rates['floor_load_rate'][-1]:,.0f} "
                      f"events/s; server {rates['floor_server_cpu'][-1]:.0%}, {rates['floor_cpu_per_event'][-1] * 1e6:.0f} us an event)"
                      if args.floor else "") + (
                      f"; {rates['same_loaded_p99'][-1] * 1e3:.1f} ms with the same load on the server timed "
                      f"({rates['same_load_rate'][-1]:,.0f} events/s, {rates['same_p99_ratio'][-1]:.2f}x)"
                      if intake is not None else ""), file=sys.stderr, flush=True)

    if args.cloudevents_only:
        section = cloudevents_section(args, rates, started_machine)
        if args.intake == "separate":  # a section and a target row of its own; the one-process figures stay as they are
            p99_ratio = median(rates["p99_ratio"])
            write_results("streams_ingest_intake", "\n".join(section), [Target(
                "33b.2", "/calibrate p99 while KServe's logger posts CloudEvents at its full rate to a calibd deployment "
                "of its own on the same database, over idle", f"{median(rates['loaded_p99']) * 1e3:.1f} ms",
                f"{median(rates['idle_p99']) * 1e3:.1f} ms (idle)", p99_ratio, "<= 1.5x", p99_ratio <= 1.5,
                f"{args.clients} logger connections ({'wrk' if args.load == 'wrk' else 'Python'}), "
                f"{fmt_rate(median(rates['load_rate']))} events/s; " + (
                    "the second server, the load" + (" and PostgreSQL" if args.pin_database else "") + " on CPU 1"
                    if args.pin else "nothing pinned"))])
        else:
            write_results("streams_ingest_cloudevents", "\n".join(section), [])
        print("\n".join(section))
        return 0
    http_rate, stream_rate, ratio = median(rates["http"]), median(rates["stream"]), median(rates["ratio"])
    ce_rate, calibrate_rate, ce_ratio = median(rates["ce"]), median(rates["calibrate"]), median(rates["ce_ratio"])
    idle_p99, loaded_p99, p99_ratio = median(rates["idle_p99"]), median(rates["loaded_p99"]), median(rates["p99_ratio"])

    def each(key: str, fmt=fmt_rate) -> str:
        return ", ".join(fmt(r) for r in rates[key])

    lines = [
        "## Labels from Redis Streams, and KServe's payload logger (issue 33)",
        "",
        f"`benchmarks/streams_ingest.py --runs {args.runs} --batches {args.batches} --pairs {args.pairs} "
        f"--clients {args.clients}{' --floor' * args.floor}{' --pin' * args.pin}"
        f"{' --load wrk' if args.load == 'wrk' else ''}`; {started_machine}. One uvicorn worker (auth on), PostgreSQL and Redis on the same "
        "machine. Medians over runs, each run's figures in brackets; the two sides of each comparison run back to "
        "back in the same run, their order alternating.",
        "",
        "| what | figure (each run) | baseline, same run (each run) | ratio (each run) | target |",
        "|---|---:|---:|---:|---|",
        f"| `calibd consume`: rows from XADD to committed and acknowledged, batches of 5,000 (one message each) | "
        f"**{fmt_rate(stream_rate)} rows/s** ({each('stream')}) | POST /feedback, the same rows, one client: "
        f"{fmt_rate(http_rate)} rows/s ({each('http')}) | **{ratio:.2f}x** ({each('ratio', lambda r: f'{r:.2f}')}) "
        f"| >= 0.8x: {'met' if ratio >= 0.8 else 'NOT met'} |",
        f"| POST /cloudevents: events (request and response halves, {args.clients} clients) | "
        f"**{fmt_rate(ce_rate)} events/s** ({each('ce')}), {fmt_rate(ce_rate / 2)} pairs/s | /calibrate with ids, "
        f"one row per request, as many requests: {fmt_rate(calibrate_rate)} requests/s ({each('calibrate')}) "
        f"| {ce_ratio:.2f}x ({each('ce_ratio', lambda r: f'{r:.2f}')}) | |",
        f"| /calibrate p99 (100 scores, one client, {args.latency_requests} requests) while " + (
            f"wrk (benchmarks/cloudevents_logger.lua) posts CloudEvents pairs flat out on {args.clients} connections "
            f"({fmt_rate(median(rates['load_rate']))} events/s)" if args.load == "wrk" else
            f"{args.clients} clients in a process of their own post CloudEvents pairs flat out") +
        f" | **{loaded_p99 * 1e3:.1f} ms** "
        f"({each('loaded_p99', lambda r: f'{r * 1e3:.1f}')}) | idle: {idle_p99 * 1e3:.1f} ms "
        f"({each('idle_p99', lambda r: f'{r * 1e3:.1f}')}) | **{p99_ratio:.2f}x** ({each('p99_ratio', lambda r: f'{r:.2f}')}) "
        f"| <= 1.5x: {'met' if p99_ratio <= 1.5 else 'NOT met'} |",
    ]
    if args.floor:
        floor_p99, floor_ratio = median(rates["floor_loaded_p99"]), median(rates["floor_p99_ratio"])
        lines.append(
            f"| the same, the load posting to the floor route (202 with the body unread: edge, key, headers; "
            f"{fmt_rate(median(rates['floor_load_rate']))} events/s) | {floor_p99 * 1e3:.1f} ms "
            f"({each('floor_loaded_p99', lambda r: f'{r * 1e3:.1f}')}) | idle: {idle_p99 * 1e3:.1f} ms | {floor_ratio:.2f}x "
            f"({each('floor_p99_ratio', lambda r: f'{r:.2f}')}) | what any route answering each event over HTTP costs |")
    lines += [
        "",
        "The logger's load shares the one uvicorn worker (and the machine's two cores) with /calibrate.",
    ]
    targets = [
        Target("33a", "calibd consume (Redis Streams to committed, batches of 5,000) over POST /feedback, same rows",
               f"{fmt_rate(stream_rate)} rows/s", f"{fmt_rate(http_rate)} rows/s (POST /feedback)", ratio, ">= 0.8x",
               ratio >= 0.8, "same run, order alternating"),
        Target("33b", "/calibrate p99 while KServe's logger posts CloudEvents at its full rate, over idle",
               f"{loaded_p99 * 1e3:.1f} ms", f"{idle_p99 * 1e3:.1f} ms (idle)", p99_ratio, "<= 1.5x", p99_ratio <= 1.5,
               f"{args.clients} logger {'connections (wrk)' if args.load == 'wrk' else 'clients'}, one uvicorn worker; "
               "results/streams_ingest_cloudevents.md: the p99 against the logger's rate"),
    ]
    write_results("streams_ingest", "\n".join(lines), targets)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
