"""Transformer mode's added latency at 100 rows: MLServer directly, through calibd, and through KServe's own transformer.

    .venv/bin/python benchmarks/transformer_latency.py [--pairs 1000] [--no-kserve]

A real MLServer (tests/mlserver_env.py) serves a scikit-learn classifier. In front of it, in turn:
  * calibd in transformer mode (``CALIBD_PREDICTOR_URL``): it forwards the v2 request and calibrates
    ``predict_proba`` with an isotonic calibrator fitted on the classifier's own probabilities;
  * KServe's Python transformer (the ``kserve`` package's ``Model``, in a virtualenv of its own):
    its default ``predict`` forwards the v2 request to the same MLServer (``--predictor_host``), and a
    ``postprocess`` calibrates class 1's probability with the same kind of map (scikit-learn's
    IsotonicRegression fitted on the same rows: its thresholds, applied with ``np.interp``).
One client (httpx, one kept connection per server, no compression), one request at a time, the
three targets in rotating order each round; the figure is the median over rounds of each
transformer's latency less the direct call's in the same round.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _harness import Server, Target, machine, median, split_cpus, write_results  # noqa: E402
from oip import _mlserver_probabilities, infer_body  # noqa: E402
from tests import mlserver_env  # noqa: E402
from tests.processes import free_port, stop, wait_ready  # noqa: E402

NOTE = ("Every server shares one core (the client has the other): a forwarded request also waits for the "
        "predictor's turn on that core, so the added latency grows with the machine's load; compare the two "
        "transformers within one run.")
KSERVE_VENV = Path(tempfile.gettempdir()) / "calibd-bench-kserve"

KSERVE_TRANSFORMER = r"""
import argparse
import os
import numpy as np
import kserve
from kserve import InferOutput, Model, ModelServer, model_server

parser = argparse.ArgumentParser(parents=[model_server.parser])
parser.add_argument("--thresholds", required=True)
args, _ = parser.parse_known_args()
table = np.load(args.thresholds)
xs, ys = table["x"], table["y"]


class Calibrating(Model):
    def __init__(self, name):
        super().__init__(name)
        self.ready = True

    async def postprocess(self, result, headers=None, response_headers=None):
        output = result.outputs[0]
        p = output.as_numpy()
        calibrated = np.interp(p[:, 1] if p.ndim == 2 else p, xs, ys)
        answer = InferOutput(name="probabilities", shape=list(calibrated.shape), datatype="FP64")
        answer.set_data_from_numpy(calibrated, binary_data=False)
        result.outputs = [answer]
        return result


ModelServer(workers=1).start([Calibrating(args.model_name)])
"""


def kserve_python() -> Path:
    """The kserve virtualenv's interpreter (built once: ``pip install kserve``)."""
    python = KSERVE_VENV / "bin" / "python"
    if not (KSERVE_VENV / ".installed").exists():
        subprocess.run([sys.executable, "-m", "venv", str(KSERVE_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "kserve"], check=True)
        (KSERVE_VENV / ".installed").write_text("kserve")
    return python


class KServeTransformer:
    def __init__(self, predictor_url: str, model: str, thresholds: Path):
        self.port = free_port()
        self.predictor_url, self.model, self.thresholds = predictor_url, model, thresholds
        self.process = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        host = self.predictor_url.split("://", 1)[1]
        self.process = subprocess.Popen(
            [str(kserve_python()), "-c", KSERVE_TRANSFORMER, "--model_name", self.model, "--http_port", str(self.port),
             "--grpc_port", str(free_port()), "--predictor_host", host, "--predictor_protocol", "v2",
             "--thresholds", str(self.thresholds)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_ready(self.process, f"{self.url}/v2/health/ready", 180, "KServe's transformer")
        return self

    def __exit__(self, *exc):
        stop(self.process)


def rounds(targets: dict[str, tuple[str, dict]], body: bytes, n: int) -> dict[str, list[float]]:
    import httpx

    names = list(targets)
    times: dict[str, list[float]] = {name: [] for name in names}
    clients = {name: httpx.Client(timeout=30) for name in names}
    try:
        for i in range(50 + n):
            order = names[i % len(names):] + names[:i % len(names)]
            for name in order:
                url, headers = targets[name]
                started = time.perf_counter()
                answer = clients[name].post(url, content=body, headers=headers)
                elapsed = time.perf_counter() - started
                assert answer.status_code == 200, (name, answer.text[:300])
                if i >= 50:
                    times[name].append(elapsed)
    finally:
        for client in clients.values():
            client.close()
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=1000, help="rounds (each calls every target once)")
    parser.add_argument("--no-kserve", action="store_true")
    args = parser.parse_args(argv)
    started_machine = machine()
    plain = {"content-type": "application/json", "accept-encoding": "identity"}
    kserve_note = ""
    with tempfile.TemporaryDirectory(prefix="transformer-") as folder, Server() as fitter:
        folder = Path(folder)
        with mlserver_env.MLServer(folder / "classifier", "classifier") as classifier:
            x = np.random.default_rng(3).normal(size=(2000, 4))
            raw = _mlserver_probabilities(classifier.url, x)
            y = (np.random.default_rng(4).uniform(size=2000) < raw).astype(int)
            fitter.fit("classifier", "isotonic", raw.tolist(), y.tolist())
            from sklearn.isotonic import IsotonicRegression

            iso = IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0).fit(raw, y)
            np.savez(folder / "thresholds.npz", x=iso.X_thresholds_, y=iso.y_thresholds_)
            body = infer_body(np.random.default_rng(5).normal(size=(100, 4)), "input-0")
            body = orjson.dumps({**orjson.loads(body), "outputs": [{"name": "predict_proba"}]})
            path = "/v2/models/classifier/infer"
            with Server(database_url=fitter.database_url, env={"CALIBD_PREDICTOR_URL": classifier.url}) as calibd:
                targets = {"direct": (classifier.url + path, plain),
                           "calibd": (calibd.url + path, {**plain, "authorization": f"Bearer {calibd.key}"})}
                pids = calibd.serving_pids() + [classifier.process.pid]
                kserve = None
                if not args.no_kserve:
                    try:
                        kserve = KServeTransformer(classifier.url, "classifier", folder / "thresholds.npz").__enter__()
                        targets["kserve"] = (kserve.url + path, plain)
                        pids.append(kserve.process.pid)
                    except Exception as error:  # said in the results, precisely
                        kserve_note = f"KServe's transformer not measured: {type(error).__name__}: {error}"
                try:
                    client_cpus = split_cpus(pids)
                    if client_cpus:
                        os.sched_setaffinity(0, client_cpus)
                    times = rounds(targets, body, args.pairs)
                finally:
                    if kserve is not None:
                        kserve.__exit__(None, None, None)
    direct = times["direct"]
    lines = [
        "## Transformer mode: added latency at 100 rows (issue 32, build item 4: at most 0.5 ms added)",
        "",
        f"`benchmarks/transformer_latency.py --pairs {args.pairs}`; {started_machine}. MLServer 1.7.1 serving a "
        "scikit-learn random forest (4 features, 100 rows, `predict_proba`), called directly, through calibd in "
        "transformer mode (auth on, access log on, request metrics on; isotonic calibration of class 1) and through "
        "KServe's own Python transformer (`kserve` " + _kserve_version() + ": a `Model` whose default `predict` forwards "
        "the v2 request to the same MLServer and whose `postprocess` applies the same kind of isotonic map with "
        "`np.interp`). One httpx client, one request at a time, the targets in rotating order each round; "
        "servers pinned to one core, the client on the other. Medians in milliseconds.",
        "",
        "| target | median latency | median added over the direct call, same round |",
        "|---|---:|---:|",
        f"| MLServer directly | {median(direct) * 1e3:.3f} | |",
    ]
    for name, label in (("calibd", "through calibd"), ("kserve", "through KServe's Python transformer")):
        if name in times:
            added = median(np.subtract(times[name], direct).tolist())
            lines.append(f"| {label} | {median(times[name]) * 1e3:.3f} | **{added * 1e3:.3f}** |")
    lines += ["", NOTE]
    if kserve_note:
        lines += ["", kserve_note + "."]
    ours = median(np.subtract(times["calibd"], direct).tolist())
    theirs = (f"; KServe's Python transformer in the same rounds: "
              f"{median(np.subtract(times['kserve'], direct).tolist()) * 1e3:.3f} ms" if "kserve" in times else "")
    targets = [Target("32.2", f"transformer mode: median latency added to MLServer, 100 rows{theirs}",
                      f"{ours * 1e3:.3f} ms", f"{median(direct) * 1e3:.3f} ms direct", None, "<= 0.5 ms", ours <= 0.0005)]
    write_results("transformer_latency", "\n".join(lines), targets)
    print("\n".join(lines))
    return 0


def _kserve_version() -> str:
    try:
        out = subprocess.run([str(KSERVE_VENV / "bin" / "python"), "-c",
                              "from importlib.metadata import version; print(version('kserve'))"],
                             capture_output=True, text=True, timeout=60)
        return out.stdout.strip() or "not installed"
    except Exception:
        return "not installed"


if __name__ == "__main__":
    sys.exit(main())
