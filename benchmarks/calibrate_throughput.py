"""/calibrate throughput against two bare echo servers, MLServer and an in-app baseline (targets 1a-1d, 7, 32.1).

    .venv/bin/python benchmarks/calibrate_throughput.py [--runs 7] [--seconds 2] [--no-postgres] [--no-mlserver]
        [--against PATH]

Needs wrk (apt-get install -y wrk). Servers, each a process of its own, pinned
together to one core (``split_cpus``), wrk to the other:

  * ``calibd serve`` (one uvicorn worker, auth on with one key, JSON access log
    on, request metrics on, as deployed), with CALIBD_BENCHMARK_ROUTES=1;
  * the bare echo app (benchmarks/echo_app.py): FastAPI on the same uvicorn
    with the same flags and worker count, parsing the same body with orjson and
    answering an equal-sized orjson array; no middleware, auth, log or metrics.
    The floor a user would compare calibd with: every figure's ratio is to it;
  * the raw ASGI echo (benchmarks/echo_app.py --raw): the same answer from a
    plain ASGI callable on the same uvicorn flags, no framework: the floor of
    any Python service on this server (targets 32.1a-d: /calibrate over it);
  * on SQLite, a second ``calibd serve`` with ``CALIBD_KERNELS=0``: the same
    service calibrating on numpy alone, without the compiled kernels
    (app/calibration/kernels.py); /calibrate over it is what they gain served;
  * MLServer 1.7.1 (its own virtualenv, .venv-mlserver/, built on first use by
    tests/mlserver_env.py) serving scikit-learn's IsotonicRegression fitted on
    the same 50,000-row holdout as calibd's isotonic calibrator (its sklearn
    runtime, a joblib), asked through the Open Inference Protocol (v2) REST
    route for the same 100 scores (target 7).

The in-app baseline, ``POST /benchmark/calibrate-baseline``, is a second
column: the same request read, parsed and checked by the same code, behind the
same layer and key check, its scores made the float64 array /calibrate hands
its calibrator, answered without calibrating; /calibrate over it is what the
calibration step costs by itself.

Load: wrk (one thread, --connections keep-alive connections) posting one fixed
body per workload:
  * isotonic, batches of 1, 100 and 10,000 binary scores (probabilities drawn
    uniformly, full double precision, so the answer is the size of the request);
  * temperature, 100 rows x 10 classes (logits).
Each run measures every server back to back on the workload (their order
rotating from run to run); figures are medians over runs, each ratio the
median of the per-run ratios. p50 and p99 are wrk's. The same is repeated
against PostgreSQL (the hot path never reads the database after warm-up).

``--against PATH`` (the root of another calibd checkout, with its own .venv)
serves that checkout's ``calibd serve`` too, with the same settings, calibrators
and key, as one more server in every run's rotation: two codes measured in the
same runs, so that the machine's load, which moves separate runs by 20-40%,
moves both alike. It prints a comparison table per database (each code over the
echoes, and this code over the other per run) and writes no results file: the
run is a comparison, not this code's figures. ``--against .`` (this checkout
against itself) shows how far apart two servers of the same code come out.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (  # noqa: E402
    EchoServer, Server, Target, fmt_rate, machine, median, postgres_available, postgres_schema, run_wrk,
    WRK_MISSING, split_cpus, wrk_available, write_results,
)

WORKLOADS = [
    # key, label, calibrator, shape, requirement (/calibrate over the bare echo)
    ("1a", "isotonic, 1 score", "iso", (1,), 0.85),
    ("1b", "isotonic, 100 scores", "iso", (100,), 0.85),
    ("1c", "isotonic, 10,000 scores", "iso", (10_000,), 0.75),
    ("1d", "temperature, 100 rows x 10 classes", "temp10", (100, 10), 0.85),
]
#: Target 7: /calibrate over MLServer serving the same isotonic calibrator, on this workload.
MLSERVER_WORKLOAD, MLSERVER_NEED = "1b", 5.0
MLSERVER_MODEL = "iso"

#: Run in MLServer's virtualenv: scikit-learn's IsotonicRegression on the holdout (an .npz), as a joblib.
TRAIN_ISOTONIC = """
import sys
import joblib
import numpy as np
from sklearn.isotonic import IsotonicRegression

holdout = np.load(sys.argv[2])
model = IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0).fit(holdout["scores"], holdout["labels"])
joblib.dump(model, sys.argv[1])
"""


def fit_calibrators(server: Server, rng: np.random.Generator) -> dict:
    """An isotonic calibrator on 50,000 rows and a 10-class temperature calibrator; the isotonic
    calibrator's size and holdout."""
    s = rng.random(50_000)
    y = (rng.random(s.shape[0]) < s**1.4).astype(int)
    iso = server.fit("iso", "isotonic", s, y)
    z = rng.normal(0.0, 2.0, size=(5_000, 10))
    p = np.exp(z / 1.7)
    p /= p.sum(axis=1, keepdims=True)
    labels = np.array([rng.choice(10, p=row) for row in p])
    server.fit("temp10", "temperature", z, labels, input="logit")
    return {"iso_thresholds": iso["summary"]["fit"]["n_thresholds"], "holdout": (s, y)}


def bodies(rng: np.random.Generator) -> dict[str, bytes]:
    out = {}
    for key, _, name, shape, _ in WORKLOADS:
        scores = rng.random(shape) if name == "iso" else rng.normal(0.0, 2.0, size=shape)
        out[key] = orjson.dumps({"calibrator": name, "scores": scores.tolist()})
    return out


def inference_body(payload: bytes) -> bytes:
    """The same scores as an Open Inference Protocol (v2) request: one FP64 tensor of shape [n, 1]."""
    scores = orjson.loads(payload)["scores"]
    return orjson.dumps({"inputs": [{"name": "scores", "shape": [len(scores), 1], "datatype": "FP64", "data": scores}]})


@contextmanager
def mlserver(holdout: tuple[np.ndarray, np.ndarray]) -> Iterator:
    """MLServer 1.7.1 serving IsotonicRegression fitted on ``holdout`` (its virtualenv built if needed)."""
    from tests.mlserver_env import MLServer

    folder = Path(tempfile.mkdtemp(prefix="mlserver-bench-"))
    try:
        np.savez(folder / "holdout.npz", scores=holdout[0], labels=holdout[1])
        with MLServer(folder / "models", MLSERVER_MODEL, TRAIN_ISOTONIC, (str(folder / "holdout.npz"),)) as server:
            yield server
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def agreement(calibd: Server, ml, payload: bytes) -> float:
    """The largest difference between calibd's and MLServer's probabilities for the workload's scores."""
    import httpx

    ours = np.asarray(calibd.post("/calibrate", orjson.loads(payload))["probabilities"])
    answer = httpx.post(f"{ml.url}/v2/models/{MLSERVER_MODEL}/infer", content=inference_body(payload),
                        headers={"Content-Type": "application/json"}, timeout=30)
    answer.raise_for_status()
    theirs = np.asarray(answer.json()["outputs"][0]["data"], dtype=float)
    return float(np.max(np.abs(ours - theirs)))


def measure(server: Server, echo: EchoServer, payloads: dict[str, bytes], runs: int, seconds: float,
            connections: int, ml=None, numpy_path: Server | None = None, raw: EchoServer | None = None,
            against: Server | None = None) -> dict:
    auth = server.headers["Authorization"]
    pids = {"calibd": server.serving_pids(), "echo": echo.serving_pids()}
    if raw is not None:
        pids["raw"] = raw.serving_pids()
    if ml is not None:
        pids["mlserver"] = [ml.process.pid]
    if numpy_path is not None:
        pids["numpy"] = numpy_path.serving_pids()
    if against is not None:
        pids["against"] = against.serving_pids()
    cpus = split_cpus([pid for group in pids.values() for pid in group])  # the servers on one core, wrk on the other
    if cpus:  # this process, which reads calibd's log lines as a log collector would, off the servers' core too
        os.sched_setaffinity(0, cpus)
    targets = {  # route: (url, body of the workload, pids)
        "echo": (echo.url, None, pids["echo"]),
        **({"raw": (raw.url, None, pids["raw"])} if raw is not None else {}),
        "baseline": (server.url + "/benchmark/calibrate-baseline", None, pids["calibd"]),
        "calibrate": (server.url + "/calibrate", None, pids["calibd"]),
    }
    if against is not None:  # the other checkout's /calibrate, the same key; next to /calibrate in each run
        targets["against"] = (against.url + "/calibrate", None, pids["against"])
    if ml is not None:
        targets["mlserver"] = (f"{ml.url}/v2/models/{MLSERVER_MODEL}/infer", "v2", pids["mlserver"])
    if numpy_path is not None:  # the same key: the benchmark gives both servers its own
        targets["numpy"] = (numpy_path.url + "/calibrate", None, pids["numpy"])

    def routes(key: str) -> list[str]:
        return [r for r in targets if r != "mlserver" or key == MLSERVER_WORKLOAD]

    def body(key: str, route: str) -> bytes:
        return inference_body(payloads[key]) if targets[route][1] == "v2" else payloads[key]

    for key in payloads:  # warm-up: caches, code paths, allocator
        for route in routes(key):
            run_wrk(targets[route][0], body(key, route), auth, 1.0, connections, cpus=cpus)
    results: dict[str, dict[str, list]] = {key: {route: [] for route in routes(key)} for key in payloads}
    for run in range(runs):
        for key in payloads:
            order = routes(key)
            order = order[run % len(order):] + order[:run % len(order)]  # each server first in turn
            got = {route: run_wrk(targets[route][0], body(key, route), auth, seconds, connections,
                                  server_pids=targets[route][2], cpus=cpus) for route in order}
            for route, result in got.items():
                results[key][route].append(result)
            shown = ", ".join(f"{route} {got[route].rate:,.0f}/s" for route in routes(key))
            print(f"  run {run + 1} {key}: {shown}; /calibrate over echo {got['calibrate'].rate / got['echo'].rate:.3f}",
                  file=sys.stderr, flush=True)
    return results


def summarise(results: dict) -> dict[str, dict]:
    summary = {}
    for key, r in results.items():
        s: dict = {}
        for route, windows in r.items():
            s[route] = {
                "rate": median([x.rate for x in windows]),
                "p50": median([x.p50 for x in windows]),
                "p99": median([x.p99 for x in windows]),
                "cpu": median([x.server_cpu for x in windows]),
            }
        cal = r["calibrate"]
        for route in r:
            if route != "calibrate":
                ratios = [c.rate / o.rate for c, o in zip(cal, r[route])]
                s[route]["ratios"] = ratios
                s[route]["ratio"] = median(ratios)
        if "against" in r:  # the other code over the echoes, per run, as /calibrate is above
            for echo in ("echo", "raw"):
                if echo in r:
                    s["against"][f"over_{echo}"] = [a.rate / e.rate for a, e in zip(r["against"], r[echo])]
        summary[key] = s
    return summary


def _cell(s: dict) -> str:
    return f"{fmt_rate(s['rate'])} ({s['p50'] * 1e3:.2f} / {s['p99'] * 1e3:.2f} ms)"


#: Targets 32.1a-d: /calibrate over the raw ASGI echo, by workload.
RAW_NEED = {"1a": 0.8, "1b": 0.8, "1c": 0.85, "1d": 0.8}


def table(summary: dict[str, dict]) -> list[str]:
    ml = any("mlserver" in s for s in summary.values())
    numpy_path = any("numpy" in s for s in summary.values())
    raw = any("raw" in s for s in summary.values())
    lines = [
        "| workload | "
        + ("raw ASGI echo req/s (p50 / p99) | **/calibrate / raw echo** (each run) | " if raw else "")
        + "bare echo req/s (p50 / p99) | /calibrate req/s (p50 / p99) | **/calibrate / echo** (each run) "
        "| in-app baseline req/s (p50 / p99) | /calibrate / baseline "
        + ("| kernels off (CALIBD_KERNELS=0) req/s (p50 / p99) | /calibrate / kernels off " if numpy_path else "")
        + ("| MLServer req/s (p50 / p99) | /calibrate / MLServer " if ml else "")
        + "| server CPU per request: " + ("raw echo / " if raw else "") + "echo / /calibrate | target |",
        "|---|" + ("---:|---|" if raw else "") + "---:|---:|---|---:|---:|" + ("---:|---:|" if numpy_path else "")
        + ("---:|---:|" if ml else "") + "---:|---|",
    ]
    for key, label, _, _, need in WORKLOADS:
        s = summary[key]
        runs = ", ".join(f"{r:.2f}" for r in s["echo"]["ratios"])
        numpy_cells = ""
        if numpy_path:
            numpy_cells = f"| {_cell(s['numpy'])} | {s['numpy']['ratio']:.3f} " if "numpy" in s else "| | "
        mlcells = ""
        if ml:
            mlcells = (f"| {_cell(s['mlserver'])} | **{s['mlserver']['ratio']:.2f}x** " if "mlserver" in s else "| | ")
        raw_cells = raw_cpu = raw_target = ""
        if "raw" in s:
            raw_runs = ", ".join(f"{r:.2f}" for r in s["raw"]["ratios"])
            raw_cells = f"{_cell(s['raw'])} | **{s['raw']['ratio']:.3f}** ({raw_runs}) | "
            raw_cpu = f"{s['raw']['cpu'] * 1e6:.0f} / "
            met = s["raw"]["ratio"] >= RAW_NEED[key]
            raw_target = f"; >= {RAW_NEED[key]}x raw echo: {'met' if met else 'NOT met'}"
        lines.append(
            f"| {label} | {raw_cells}{_cell(s['echo'])} | {_cell(s['calibrate'])} | **{s['echo']['ratio']:.3f}** ({runs}) "
            f"| {_cell(s['baseline'])} | {s['baseline']['ratio']:.3f} {numpy_cells}{mlcells}"
            f"| {raw_cpu}{s['echo']['cpu'] * 1e6:.0f} / {s['calibrate']['cpu'] * 1e6:.0f} us "
            f"| >= {need}x echo: {'met' if s['echo']['ratio'] >= need else 'NOT met'}{raw_target} |"
        )
    return lines


#: The no-regression check of issue 29: this code over the bare echo at least this share of the other code's.
NO_REGRESSION = 0.95


def against_table(summary: dict[str, dict]) -> list[str]:
    """This code against the other checkout (--against), measured in the same runs."""
    def runs(values: list[float]) -> str:
        return ", ".join(f"{v:.2f}" for v in values)

    lines = [
        "| workload | this code req/s | other code req/s | this / raw echo | other / raw echo "
        "| **this / bare echo** (each run) | **other / bare echo** (each run) | this / other (each run) "
        "| calibd CPU per request: this / other | no regression (this / other >= 0.95) |",
        "|---|---:|---:|---:|---:|---|---|---|---:|---|",
    ]
    for key, label, _, _, _ in WORKLOADS:
        s = summary[key]
        this, other = s["echo"]["ratio"], median(s["against"]["over_echo"])
        raw = (f"{s['raw']['ratio']:.3f} | {median(s['against']['over_raw']):.3f}" if "raw" in s else " | ")
        # Within a run, (this / echo) / (other / echo) is this / other: its median over runs decides.
        paired = s["against"]["ratio"]
        verdict = "within 5%" if paired >= NO_REGRESSION else "**more than 5% below**"
        lines.append(
            f"| {label} | {fmt_rate(s['calibrate']['rate'])} | {fmt_rate(s['against']['rate'])} | {raw} "
            f"| **{this:.3f}** ({runs(s['echo']['ratios'])}) | **{other:.3f}** ({runs(s['against']['over_echo'])}) "
            f"| {s['against']['ratio']:.3f} ({runs(s['against']['ratios'])}) "
            f"| {s['calibrate']['cpu'] * 1e6:.0f} / {s['against']['cpu'] * 1e6:.0f} us | {paired - 1:+.1%}: {verdict} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per workload, each measuring every server (default 7)")
    parser.add_argument("--seconds", type=float, default=2.0, help="length of each wrk window (default 2)")
    parser.add_argument("--connections", type=int, default=8, help="wrk connections (default 8)")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    parser.add_argument("--no-mlserver", action="store_true", help="without MLServer (target 7 not measured)")
    parser.add_argument("--against", type=Path, metavar="PATH",
                        help="another calibd checkout (with its own .venv) to serve in the same runs; writes no results")
    args = parser.parse_args(argv)
    if not wrk_available():
        print(WRK_MISSING, file=sys.stderr)
        return 2
    other = args.against and str(args.against.resolve() / ".venv" / "bin" / "calibd")
    if other and not os.access(other, os.X_OK):
        print(f"no calibd at {other}", file=sys.stderr)
        return 2

    rng = np.random.default_rng(0)
    payloads = bodies(rng)
    backends = [("SQLite", None)]
    if not args.no_postgres and postgres_available():
        backends.append(("PostgreSQL", "postgres"))
    summaries, info = {}, {}
    started_machine = machine()
    for label, kind in backends:
        print(f"{label}:", file=sys.stderr, flush=True)
        with ExitStack() as stack:
            url = stack.enter_context(postgres_schema()) if kind == "postgres" else None
            against = None
            if other:  # its own database (a schema of its own migrated by its own code), the same key
                other_url = stack.enter_context(postgres_schema(other)) if kind == "postgres" else None
            server = stack.enter_context(Server(database_url=url))
            echo = stack.enter_context(EchoServer(workers=server.workers))
            raw = stack.enter_context(EchoServer(workers=server.workers, raw=True))
            info[label] = fit_calibrators(server, np.random.default_rng(1))
            numpy_path = None
            if label == "SQLite":  # calibd on numpy alone: what the compiled kernels gain served
                numpy_path = stack.enter_context(Server(env={"CALIBD_KERNELS": "0"}, key=server.key))
                fit_calibrators(numpy_path, np.random.default_rng(1))
            if other:
                against = stack.enter_context(Server(database_url=other_url, key=server.key, calibd=other))
                fit_calibrators(against, np.random.default_rng(1))
            ml = None
            if label == "SQLite" and not args.no_mlserver:
                ml = stack.enter_context(mlserver(info[label]["holdout"]))
                info[label]["agreement"] = agreement(server, ml, payloads[MLSERVER_WORKLOAD])
            summaries[label] = summarise(
                measure(server, echo, payloads, args.runs, args.seconds, args.connections, ml, numpy_path, raw, against))

    lines = [
        "## /calibrate throughput against two bare echo servers (targets 1a-1d, 7, 32.1a-d)",
        "",
        f"`benchmarks/calibrate_throughput.py --runs {args.runs} --seconds {args.seconds:g} --connections {args.connections}`; "
        f"{started_machine}. Each server a process of its own, one uvicorn worker, pinned together to one core; "
        f"wrk -t1 -c{args.connections} and this process (reading calibd's log lines from its pipe, as a log collector "
        "would) on the other, each server in turn per run. calibd: `calibd serve`, auth on "
        "(one key), JSON access log on, request metrics on. Bare echo: benchmarks/echo_app.py, FastAPI + orjson on "
        "the same uvicorn flags, answering the scores it was sent. Raw ASGI echo: benchmarks/echo_app.py --raw, the same "
        "answer from a plain ASGI callable (orjson in and out), no framework: what uvicorn itself costs. In-app baseline: `POST /benchmark/calibrate-baseline`, "
        "everything /calibrate does but calibrating. Kernels off: a second `calibd serve` with CALIBD_KERNELS=0, "
        "calibrating on numpy alone (app/calibration/kernels.py). Ratios: median over runs of /calibrate req/s over the other's, "
        "measured back to back; p50 / p99 are wrk's medians over runs. "
        f"Isotonic calibrator: {info['SQLite']['iso_thresholds']} thresholds (50,000-row holdout)"
        + (f"; MLServer 1.7.1 serves scikit-learn's IsotonicRegression fitted on the same holdout (mlserver-sklearn, "
           f"a joblib), asked by `POST /v2/models/{MLSERVER_MODEL}/infer` for the same 100 scores as one FP64 tensor; "
           f"its answers differ from calibd's by at most {info['SQLite']['agreement']:.1e}" if "agreement" in info["SQLite"] else "")
        + ".",
        "",
    ]
    for label in summaries:
        lines += [f"### {label}", "", *table(summaries[label]), ""]
    if other:
        for label in summaries:
            lines += [f"### {label}: this code against {args.against} (`--against`, the same runs)", "",
                      *against_table(summaries[label]), ""]
        print("\n".join(lines))
        return 0
    sqlite = summaries["SQLite"]
    targets = [
        Target(
            key=key, target=f"/calibrate throughput, {label}, over a bare FastAPI + orjson echo",
            figure=f"{fmt_rate(sqlite[key]['calibrate']['rate'])} req/s (p50 {sqlite[key]['calibrate']['p50'] * 1e3:.2f} ms, "
                   f"p99 {sqlite[key]['calibrate']['p99'] * 1e3:.2f} ms)",
            baseline=f"{fmt_rate(sqlite[key]['echo']['rate'])} req/s (p50 {sqlite[key]['echo']['p50'] * 1e3:.2f} ms, "
                     f"p99 {sqlite[key]['echo']['p99'] * 1e3:.2f} ms), bare echo",
            ratio=sqlite[key]["echo"]["ratio"], requirement=f">= {need}x", met=sqlite[key]["echo"]["ratio"] >= need,
            note=f"SQLite; in-app baseline {sqlite[key]['baseline']['ratio']:.3f}x" + (
                f"; PostgreSQL {summaries['PostgreSQL'][key]['echo']['ratio']:.3f}x" if "PostgreSQL" in summaries else ""),
        )
        for key, label, _, _, need in WORKLOADS
    ]
    targets += [
        Target(
            key=f"32.1{key[1]}", target=f"/calibrate throughput, {label}, over a raw ASGI echo (no framework, orjson)",
            figure=f"{fmt_rate(sqlite[key]['calibrate']['rate'])} req/s",
            baseline=f"{fmt_rate(sqlite[key]['raw']['rate'])} req/s (p50 {sqlite[key]['raw']['p50'] * 1e3:.2f} ms, "
                     f"p99 {sqlite[key]['raw']['p99'] * 1e3:.2f} ms), raw ASGI echo",
            ratio=sqlite[key]["raw"]["ratio"], requirement=f">= {RAW_NEED[key]}x",
            met=sqlite[key]["raw"]["ratio"] >= RAW_NEED[key],
            note=f"SQLite; server CPU per request {sqlite[key]['calibrate']['cpu'] * 1e6:.0f} us against "
                 f"{sqlite[key]['raw']['cpu'] * 1e6:.0f} us",
        )
        for key, label, _, _, _ in WORKLOADS if "raw" in sqlite[key]
    ]
    if "mlserver" in sqlite[MLSERVER_WORKLOAD]:
        s = sqlite[MLSERVER_WORKLOAD]
        targets.append(Target(
            key="7", target="/calibrate over MLServer 1.7.1 serving the same isotonic calibrator, 100 scores",
            figure=f"{fmt_rate(s['calibrate']['rate'])} req/s", baseline=f"{fmt_rate(s['mlserver']['rate'])} req/s "
            f"(p50 {s['mlserver']['p50'] * 1e3:.2f} ms, p99 {s['mlserver']['p99'] * 1e3:.2f} ms), MLServer",
            ratio=s["mlserver"]["ratio"], requirement=f">= {MLSERVER_NEED:g}x", met=s["mlserver"]["ratio"] >= MLSERVER_NEED,
        ))
    write_results("calibrate_throughput", "\n".join(lines), targets)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
