"""Where a served request's time goes: py-spy on `calibd serve` and on the two bare echoes, by part.

    .venv/bin/python benchmarks/hot_path_profile.py [--workloads 1b,1c,1d] [--seconds 8] [--py-spy PATH]
    .venv/bin/python benchmarks/hot_path_profile.py --raw profile.txt --rate 1504 --label "..."  # a saved profile

py-spy (``--py-spy PATH``, else on PATH or /tmp/prof-venv/bin/py-spy; not a
calibd dependency: ``pip install py-spy`` in a scratch virtualenv) samples the
serving process while wrk loads it (server and echo pinned to one core, wrk
to the other, as in calibrate_throughput.py), on /calibrate and on the bare
echo app for the same body. Each sample is given to the innermost frame that
belongs to one of the parts below (leaf first); a part's time per request is
its share of the samples times the wall time per request at the rate wrk saw
while py-spy ran (one worker on one core: the server is busy all the time).
Sampling slows the server a little; the shares, not the rates, are the figure.
Samples of a thread waiting (the log writer asleep, an idle worker thread)
are left out: py-spy counts some of them as active, and they cost no CPU.
``--raw`` categorises a profile saved before (py-spy ``-f raw``).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibrate_throughput as ct  # noqa: E402
from _harness import EchoServer, Server, machine, run_wrk, split_cpus, write_results  # noqa: E402

#: (part, pattern of a frame's function and file): the first part, from the leaf up, whose pattern matches.
PARTS = [
    ("calibration (predict_details and its numpy)", r"app/calibration/"),
    ("JSON nesting check", r"check_depth|_structure_depth|nesting_depth"),
    ("JSON parse (orjson)", r"parse_json"),
    ("scores to a float64 array", r"(?<!as_)float_array"),
    ("key check", r"app/api/auth\.py|app/storage/keys\.py|fastapi/security/"),
    ("access log (record, format, write)", r"app/api/logs\.py|logging/__init__\.py|access_line"),
    ("duration histogram, counters", r"app/api/observability\.py|prometheus_client/"),
    ("FastAPI / Starlette: middleware, routing, dependencies, Request/Response", r"fastapi/|starlette/"),
    ("endpoint and calibd's ASGI layer (envelope, answer encoding)", r"app/api/|^(?!<module> |main )\S+ \(\S*echo_app\.py"),
    ("uvicorn HTTP (httptools parse, send)", r"uvicorn/protocols/|uvicorn/middleware/"),
]
OTHER = "event loop, sockets, other (uvloop: Runner.run's own time)"
#: Leaf frames of a thread that waits (asleep, or for work): py-spy counts some such samples as active; not CPU.
WAITING = re.compile(r"^(Condition\.wait|Event\.wait|Queue\.get|BackgroundStreamHandler\._write_forever|select|sleep) \(")


def categorise(raw: str) -> tuple[collections.Counter, int]:
    compiled = [(name, re.compile(pattern)) for name, pattern in PARTS]
    parts: collections.Counter = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        if WAITING.match(stack.rsplit(";", 1)[-1]):
            continue
        total += n
        for frame in reversed(stack.split(";")):
            name = next((name for name, pattern in compiled if pattern.search(frame)), None)
            if name is not None:
                parts[name] += n
                break
        else:
            parts[OTHER] += n
    return parts, total


def table(columns: dict[str, tuple[collections.Counter, int, float]]) -> list[str]:
    """One row per part; per column, us per request (share of samples)."""
    names = list(columns)
    lines = ["| part | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for part in [name for name, _ in PARTS] + [OTHER]:
        cells = []
        for name in names:
            parts, total, rate = columns[name]
            share = parts[part] / total if total else 0.0
            cells.append(f"{share * 1e6 / rate:.1f} us ({share:.1%})" if parts[part] else "")
        lines.append(f"| {part} | " + " | ".join(cells) + " |")
    cells = [f"**{1e6 / rate:.1f} us** ({rate:,.0f} req/s, {total} samples)" for _, total, rate in columns.values()]
    lines.append("| per request, all parts | " + " | ".join(cells) + " |")
    return lines


def record(py_spy: str, pid: int, url: str, body: bytes, auth: str, seconds: float, cpus) -> tuple[str, float]:
    """py-spy's raw profile of ``pid`` while wrk loads ``url``; and wrk's rate meanwhile."""
    run_wrk(url, body, auth, 1.0, 8, cpus=cpus)
    folder = Path(tempfile.mkdtemp(prefix="py-spy-"))
    try:
        spy = subprocess.Popen([py_spy, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "500", "-f", "raw",
                                "-o", str(folder / "raw.txt"), "--nonblocking"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        result = run_wrk(url, body, auth, seconds + 1, 8, cpus=cpus)
        spy.wait()
        raw = (folder / "raw.txt").read_text() if (folder / "raw.txt").exists() else ""
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return raw, result.rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="1b,1c,1d", help="calibrate_throughput workloads (default 1b,1c,1d)")
    parser.add_argument("--seconds", type=float, default=8.0, help="py-spy recording per server and workload")
    parser.add_argument("--py-spy", default=None, help="py-spy executable")
    parser.add_argument("--raw", help="categorise this saved py-spy raw profile instead, and print its table")
    parser.add_argument("--rate", type=float, help="with --raw: the rate wrk saw while it was recorded")
    parser.add_argument("--label", default="profile", help="with --raw: the column's name")
    args = parser.parse_args(argv)
    if args.raw:
        parts, total = categorise(Path(args.raw).read_text())
        print("\n".join(table({args.label: (parts, total, args.rate)})))
        return 0
    py_spy = args.py_spy or shutil.which("py-spy") or (
        "/tmp/prof-venv/bin/py-spy" if Path("/tmp/prof-venv/bin/py-spy").exists() else None)
    if not py_spy:
        missing = "py-spy not found: pip install py-spy (in a scratch virtualenv), then --py-spy PATH"
        print(missing, file=sys.stderr)
        write_results("hot_path_profile", f"## Where a served request's time goes (py-spy)\n\nNot run: {missing}.", [])
        return 0
    payloads = ct.bodies(np.random.default_rng(0))
    labels = {key: label for key, label, *_ in ct.WORKLOADS}
    started_machine = machine()
    columns = {}
    with Server() as server, EchoServer(workers=server.workers) as echo, EchoServer(server.workers, raw=True) as raw_echo:
        ct.fit_calibrators(server, np.random.default_rng(1))
        cpus = split_cpus(server.serving_pids() + echo.serving_pids() + raw_echo.serving_pids())
        auth = server.headers["Authorization"]
        for key in args.workloads.split(","):
            for name, pid, url in (("/calibrate", server.process.pid, server.url + "/calibrate"),
                                   ("raw ASGI echo", raw_echo.process.pid, raw_echo.url),
                                   ("bare echo", echo.process.pid, echo.url)):
                raw, rate = record(py_spy, pid, url, payloads[key], auth, args.seconds, cpus)
                parts, total = categorise(raw)
                columns[f"{name}, {labels[key]}"] = (parts, total, rate)
                print(f"  {name}, {key}: {rate:,.0f} req/s, {total} samples", file=sys.stderr, flush=True)
    lines = [
        "## Where a served request's time goes (py-spy)",
        "",
        f"`benchmarks/hot_path_profile.py --workloads {args.workloads} --seconds {args.seconds:g}`; {started_machine}. "
        "py-spy at 500 Hz on the serving process under wrk -t1 -c8 (server on one core, wrk on the other); each sample "
        "goes to the innermost frame of a part below; time per request = share of samples x wall time per request at "
        "the rate seen while sampling. calibd: `calibd serve`, auth on, JSON access log on, metrics on.",
        "",
        *table(columns),
    ]
    before = Path(__file__).resolve().parent / "reference" / "hot_path_before.md"
    if before.exists():
        lines += ["", before.read_text().rstrip()]
    write_results("hot_path_profile", "\n".join(lines), [])
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
