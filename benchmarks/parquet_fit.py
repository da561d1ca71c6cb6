"""A 5,000,000-row binary holdout as Parquet against the same rows as JSON: the whole POST /calibrators, isotonic.

    .venv/bin/python benchmarks/parquet_fit.py [--rows 5000000] [--runs 3]

Two ``calibd serve`` processes, one taking the JSON bodies and one the Parquet
uploads (so that each reports its own peak RSS), each warmed by a small fit. Each
run fits the same rows on both, as a JSON body and as a Parquet upload
(multipart, as ``calibd fit --file holdout.parquet`` sends it); which goes first
alternates. The wall time is the client's, from the first byte sent to the 201
(upload, parsing, the fit and its cross-fitted summary, storing). The bodies are
built before the clock starts, as a warehouse export would be. The JSON server's
body limit is raised (CALIBD_MAX_BODY_BYTES) to take the ~100 MB body. Peak RSS is
VmHWM of the serving process, and of its fit worker. Target: Parquet at least 5x
faster end to end.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _harness import Server, Target, _children, cpu_seconds, machine, median, write_results  # noqa: E402

MB = 1024 * 1024


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for {pid}")


def bodies(rows: int) -> tuple[bytes, bytes, str]:
    rng = np.random.default_rng(0)
    scores = rng.uniform(size=rows)
    labels = (rng.uniform(size=rows) < scores**2).astype(np.int8)
    sink = io.BytesIO()
    pq.write_table(pa.table({"label": labels, "score": scores}), sink)
    body = {"name": "bench", "method": "isotonic", "holdout": {"scores": scores, "labels": labels.astype(np.int64)}}
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), sink.getvalue(), pa.__version__


def fit_seconds(http: httpx.Client) -> float:
    """Seconds the service has spent in fit_calibrator (the fit and its cross-fitted summary), from /metrics."""
    for line in http.get("/metrics").text.splitlines():
        if line.startswith('calibd_fit_duration_seconds_sum{method="isotonic"}'):
            return float(line.split()[-1])
    return 0.0


def one_fit(kind: str, server: Server, http: httpx.Client, json_body: bytes, parquet_body: bytes) -> dict:
    before = fit_seconds(http)
    pids = [server.process.pid, *_children(server.process.pid)]
    cpu = cpu_seconds(pids)
    started = time.perf_counter()
    if kind == "json":
        response = http.post("/calibrators", content=json_body, headers={"Content-Type": "application/json"})
    else:
        response = http.post("/calibrators", data={"name": "bench", "method": "isotonic"},
                             files={"file": ("holdout.parquet", parquet_body, "application/vnd.apache.parquet")})
    seconds = time.perf_counter() - started
    if response.status_code != 201:
        raise RuntimeError(f"{kind}: {response.status_code} {response.text[:500]}")
    cpu = cpu_seconds(pids) - cpu
    fitted = response.json()
    detail = http.get(f"/calibrators/bench/versions/{fitted['version']}").json()
    fitting = fit_seconds(http) - before
    return {"seconds": seconds, "fit": fitting, "intake": seconds - fitting, "cpu": cpu,
            "sha": detail["holdout_sha256"], "parameters": detail["parameters"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=5_000_000, help="holdout rows")
    parser.add_argument("--runs", type=int, default=3, help="pairs of fits (JSON and Parquet)")
    args = parser.parse_args()
    started_machine = machine()
    json_body, parquet_body, arrow_version = bodies(args.rows)
    print(f"JSON body {len(json_body) / MB:.1f} MB, Parquet file {len(parquet_body) / MB:.1f} MB", file=sys.stderr)
    limit = str(max(len(json_body), len(parquet_body)) * 2)
    runs: list[dict[str, dict]] = []
    peaks: dict[str, tuple[int, int]] = {}
    with Server(env={"CALIBD_MAX_BODY_BYTES": limit}) as json_server, Server(env={"CALIBD_MAX_BODY_BYTES": limit}) as parquet_server:
        servers = {"json": json_server, "parquet": parquet_server}
        clients = {kind: httpx.Client(base_url=s.url, headers=s.headers, timeout=1800) for kind, s in servers.items()}
        for kind, http in clients.items():  # the fit worker started and warm
            warm = http.post("/calibrators", json={"name": "warm", "method": "isotonic",
                                                   "holdout": {"scores": [0.2, 0.4, 0.6, 0.8] * 50, "labels": [0, 0, 1, 1] * 50}})
            assert warm.status_code == 201, warm.text
        for run in range(args.runs):
            order = ("json", "parquet") if run % 2 == 0 else ("parquet", "json")
            pair = {kind: one_fit(kind, servers[kind], clients[kind], json_body, parquet_body) for kind in order}
            runs.append(pair)
            print(f"  run {run + 1}: JSON {pair['json']['seconds']:.2f} s (fit {pair['json']['fit']:.2f} s), "
                  f"Parquet {pair['parquet']['seconds']:.2f} s (fit {pair['parquet']['fit']:.2f} s)", file=sys.stderr, flush=True)
        for kind, server in servers.items():
            pid = server.process.pid
            peaks[kind] = (peak_rss(pid), max((peak_rss(w) for w in _children(pid)), default=0))
        for http in clients.values():
            http.close()
    same = all(p["json"]["sha"] == p["parquet"]["sha"] and p["json"]["parameters"] == p["parquet"]["parameters"] for p in runs)
    ratios = [p["json"]["seconds"] / p["parquet"]["seconds"] for p in runs]
    ratio = median(ratios)
    intake_ratio = median([p["json"]["intake"] / p["parquet"]["intake"] for p in runs])

    def med(kind: str, key: str) -> float:
        return median([p[kind][key] for p in runs])

    command = f"benchmarks/parquet_fit.py --rows {args.rows} --runs {args.runs}"
    section = "\n".join([
        f"## Parquet against JSON: POST /calibrators, isotonic, {args.rows:,} rows",
        "",
        f"`{command}`; {started_machine}; pyarrow {arrow_version}. The whole POST as the client sees it, JSON "
        f"and Parquet each on a server of its own (one fit worker, warmed up), alternating first; medians over {args.runs} runs. "
        f"Bodies: JSON {len(json_body) / MB:.1f} MB (body limit raised for it), Parquet {len(parquet_body) / MB:.1f} MB "
        "(multipart upload). Peak RSS is VmHWM.",
        "",
        "| body | POST /calibrators, wall | of which the fit and its summary | the rest: upload, parse, store | CPU (server + worker) | serving process peak RSS | fit worker peak RSS |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *(f"| {label} | {med(kind, 'seconds'):.2f} s | {med(kind, 'fit'):.2f} s | {med(kind, 'intake'):.2f} s | "
          f"{med(kind, 'cpu'):.2f} s | {peaks[kind][0] / MB:.0f} MB | {peaks[kind][1] / MB:.0f} MB |"
          for kind, label in (("json", "JSON"), ("parquet", "Parquet"))),
        "",
        f"End to end, Parquet is **{ratio:.2f}x** as fast as JSON (each run: {', '.join(f'{r:.2f}' for r in ratios)}; "
        f"target >= 5x: {'met' if ratio >= 5 else 'NOT met'}). Getting the holdout in (the wall time less the time in "
        f"fit_calibrator, read from calibd_fit_duration_seconds) is {intake_ratio:.1f}x as fast. The fit and its "
        "cross-fitted summary (5-fold out-of-fold predictions and the headline metrics before and after, of every row; "
        "every other metric of a 200,000-row subsample) are the same work for both bodies and bound the end-to-end ratio. Same holdout fingerprint and parameters both ways: "
        f"{'yes' if same else 'NO'}.",
    ])
    print(section)
    write_results("parquet_fit", section, [
        Target("7", f"POST /calibrators, isotonic, {args.rows:,} rows: Parquet against JSON",
               f"{med('parquet', 'seconds'):.2f} s (peak RSS {peaks['parquet'][0] / MB:.0f} MB)",
               f"JSON {med('json', 'seconds'):.2f} s (peak RSS {peaks['json'][0] / MB:.0f} MB)", ratio, ">= 5x",
               ratio >= 5 and same, "ratio = JSON time / Parquet time"),
    ])


if __name__ == "__main__":
    main()
