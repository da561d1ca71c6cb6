"""The client commands of ``calibd``, run as subprocesses against calibd served over HTTP
(the ``server`` fixture, on SQLite and PostgreSQL), found through CALIBD_URL."""

from __future__ import annotations

import csv
import importlib.metadata
import io
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from calibd.calibration import from_dict
from calibd.client import Client

from .conftest import REPO, free_port
from .test_client import ensure_import_route


@pytest.fixture
def cli(server, tmp_path):
    """Run ``calibd ARGS`` in tmp_path with CALIBD_URL pointing at the test server."""
    ensure_import_route(server)
    env = {key: value for key, value in os.environ.items() if not key.startswith("CALIBD_")}
    env |= {"CALIBD_URL": server.url, "PYTHONPATH": str(REPO)}

    def run(*args: str, url: str | None = None, stdin: str | None = None, text: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "calibd.cli", *args], cwd=tmp_path, env=env | ({"CALIBD_URL": url} if url else {}),
            capture_output=True, text=text, input=stdin, timeout=300,
        )

    return run


def write_holdout(path, n=1500, seed=0):
    rng = np.random.default_rng(seed)
    scores = rng.uniform(0.01, 0.99, n)
    labels = (rng.uniform(size=n) < scores**2).astype(int)
    path.write_text("label,score\n" + "".join(f"{y},{s!r}\n" for y, s in zip(labels.tolist(), scores.tolist())))
    return scores, labels


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """The whole of stderr, which must be one line starting with 'calibd: ' (no traceback)."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("calibd: ") and "Traceback" not in result.stderr
    return lines[0]


def test_fit_from_csv_shows_progress_and_the_summary(cli, tmp_path, name):
    write_holdout(tmp_path / "holdout.csv")
    result = cli("fit", "holdout.csv", "--name", name, "--method", "auto")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert re.match(rf"{name} version 1 \(current\): auto \(chose \w+\), 1500 holdout rows$", lines[0]), lines[0]
    assert lines[1].split() == ["metric", "before", "after"]
    table = {line.split()[0]: [float(v) for v in line.split()[1:]] for line in lines[2:5]}
    assert set(table) == {"ece", "brier", "log_loss"}
    assert table["ece"][1] < table["ece"][0]  # the holdout is miscalibrated; the fit helps
    assert re.match(r"uploaded holdout\.csv \(\d+\.\d KB\) in \d+\.\d s, fitted in \d+\.\d s$", result.stderr.strip())

    again = cli("fit", "holdout.csv", "--name", name, "--method", "platt", "--options", '{"smooth_targets": true}',
                "--no-promote", "--job", "always")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"{name} version 2 (not current: promote it to serve it): platt, ")


def test_calibrate_prints_a_csv_of_the_service_probabilities(cli, tmp_path, server, name):
    scores, _ = write_holdout(tmp_path / "holdout.csv")
    assert cli("fit", "holdout.csv", "--name", name, "--method", "isotonic").returncode == 0
    (tmp_path / "scores.csv").write_text("id,score\n" + "".join(f"r{i},{s!r}\n" for i, s in enumerate(scores[:20].tolist())))
    result = cli("calibrate", name, "scores.csv")
    assert result.returncode == 0, result.stderr
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert rows[0] == ["id", "probability"] and [r[0] for r in rows[1:]] == [f"r{i}" for i in range(20)]
    with Client(server.url) as calibd:
        expected = calibd.calibrate(name, scores[:20]).probabilities
    assert np.array_equal(np.array([float(r[1]) for r in rows[1:]]), expected)  # full precision
    assert result.stderr.strip() == f"calibrated 20 rows with {name} version 1"

    to_file = cli("calibrate", name, "-", "--output", "out.csv", stdin="score\n0.2\n0.8\n")
    assert to_file.returncode == 0 and to_file.stdout == ""
    assert (tmp_path / "out.csv").read_text().splitlines()[0] == "probability"

    decided = cli("calibrate", name, "-", "--costs", '{"false_positive": 1, "false_negative": 4}', stdin="score\n0.05\n0.95\n")
    assert decided.stdout.splitlines() == [
        "probability,decisions", f"{calibd_probability(server, name, 0.05)!r},0", f"{calibd_probability(server, name, 0.95)!r},1"]

    # Other columns are copied through, so that calibrated rows can be evaluated with their labels.
    piped = cli("calibrate", name, "holdout.csv")
    assert piped.stdout.splitlines()[0] == "label,probability"
    evaluated = cli("evaluate", "-", stdin=piped.stdout)
    assert evaluated.returncode == 0 and evaluated.stdout.startswith("1500 predictions from -")


def calibd_probability(server, name, score):
    with Client(server.url) as calibd:
        return float(calibd.calibrate(name, [score]).probabilities[0])


def test_calibrate_writes_the_extras_of_a_method(cli, tmp_path, name):
    write_holdout(tmp_path / "holdout.csv", seed=1)
    assert cli("fit", "holdout.csv", "--name", name, "--method", "venn_abers").returncode == 0
    result = cli("calibrate", name, "-", stdin="score\n0.2\n0.8\n")
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert rows[0] == ["probability", "intervals_0", "intervals_1"] and len(rows) == 3
    for row in rows[1:]:
        p, low, high = map(float, row)
        assert low <= high and 0 <= p <= 1


def test_multiclass_from_csv_to_probability_rows(cli, tmp_path, name):
    rng = np.random.default_rng(6)
    logits = rng.normal(size=(600, 3)) * 2
    truth = np.exp(logits / 2) / np.exp(logits / 2).sum(axis=1, keepdims=True)
    labels = np.array([rng.choice(3, p=p) for p in truth])
    rows = "".join(f"{k},{a!r},{b!r},{c!r}\n" for k, (a, b, c) in zip(labels.tolist(), logits.tolist()))
    (tmp_path / "multi.csv").write_text("label,score_0,score_1,score_2\n" + rows)
    fitted = cli("fit", "multi.csv", "--name", name, "--method", "temperature", "--input", "logit")
    assert fitted.returncode == 0, fitted.stderr
    result = cli("calibrate", name, "multi.csv")
    out = list(csv.reader(io.StringIO(result.stdout)))
    assert out[0] == ["label", "p_0", "p_1", "p_2"] and len(out) == 601
    assert np.allclose(np.array(out[1:], dtype=float)[:, 1:].sum(axis=1), 1)
    evaluated = cli("evaluate", "-", stdin=result.stdout)  # rows of probabilities with their labels
    assert evaluated.returncode == 0 and evaluated.stdout.startswith("600 predictions from -")


def test_evaluate_prints_metrics_and_draws_the_diagram(cli, tmp_path):
    rng = np.random.default_rng(2)
    p = rng.uniform(size=800)
    y = (rng.uniform(size=800) < p).astype(int)
    (tmp_path / "preds.csv").write_text("label,probability\n" + "".join(f"{a},{b!r}\n" for a, b in zip(y.tolist(), p.tolist())))
    result = cli("evaluate", "preds.csv", "--plot", "reliability.png", "--bootstrap", "100")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "800 predictions from preds.csv" and lines[1].split()[:2] == ["metric", "value"]
    ece_line = next(line for line in lines if line.startswith("ece "))
    assert re.match(r"ece\s+0\.\d{4}\s+\[0\.\d{4}, 0\.\d{4}\]$", ece_line), ece_line
    assert (tmp_path / "reliability.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result.stderr.strip() == "reliability diagram written to reliability.png"

    rows = rng.dirichlet([1, 1, 1], size=300)
    labels = np.array([rng.choice(3, p=r) for r in rows])
    (tmp_path / "multi.csv").write_text(
        "label,p_0,p_1,p_2\n" + "".join(f"{k},{a!r},{b!r},{c!r}\n" for k, (a, b, c) in zip(labels.tolist(), rows.tolist())))
    multi = cli("evaluate", "multi.csv", "--plot", "multi.svg")
    assert multi.returncode == 0, multi.stderr
    assert "<svg" in (tmp_path / "multi.svg").read_text()


def test_report_as_text_html_and_image(cli, tmp_path, name):
    write_holdout(tmp_path / "holdout.csv", seed=3)
    assert cli("fit", "holdout.csv", "--name", name, "--method", "platt").returncode == 0
    text = cli("report", name)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith(f"{name} version 1 (current): platt, input probability, 2 classes, 1500 holdout samples")
    assert "calibrated (cross-fit)" in text.stdout and "drift: no alarm" in text.stdout
    html = cli("report", name, "--format", "html", "--output", "report.html")
    assert html.returncode == 0 and html.stderr.strip() == f"html report of {name} written to report.html"
    assert "<html" in (tmp_path / "report.html").read_text().lower()
    as_json = cli("report", name, "--format", "json")
    assert json.loads(as_json.stdout)["calibrator"] == name
    png = cli("report", name, "--format", "png", text=False)  # stdout is not a terminal: the bytes go there
    assert png.returncode == 0 and png.stdout[:8] == b"\x89PNG\r\n\x1a\n"


def test_export_and_import_round_trip(cli, tmp_path, server, name):
    write_holdout(tmp_path / "holdout.csv", seed=4)
    assert cli("fit", "holdout.csv", "--name", name, "--method", "beta").returncode == 0
    exported = cli("export", name, "--output", "model.json")
    assert exported.returncode == 0, exported.stderr
    assert exported.stderr.strip() == f"exported {name} version 1 (beta) to model.json"
    document = json.loads((tmp_path / "model.json").read_text())
    assert document["format"] == "calibd-calibrator" and document["method"] == "beta"
    on_stdout = json.loads(cli("export", name).stdout)
    assert on_stdout | {"exported_at": None} == document | {"exported_at": None}

    copy = f"{name}-copy"
    imported = cli("import", "model.json", "--name", copy)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == f"imported {name} version 1 as {copy} version 1 (current; beta, not refitted)"
    probe = np.linspace(0, 1, 51)
    with Client(server.url) as calibd:
        original = calibd.calibrate(name, probe).probabilities
        assert np.array_equal(calibd.calibrate(copy, probe).probabilities, original)
    assert np.array_equal(from_dict(document["parameters"]).predict(probe), original)
    again = cli("import", "-", "--no-promote", stdin=(tmp_path / "model.json").read_text())
    assert again.stdout.strip() == f"imported {name} version 1 as {name} version 2 (not current; beta, not refitted)"


SERVICE_ERRORS = {
    "unknown-calibrator": (("calibrate", "no-such-calibrator", "scores.csv"), {"scores.csv": "score\n0.5\n"},
                           "calibd: 404 Not Found: calibrator 'no-such-calibrator' does not exist"),
    "probability-out-of-range": (("evaluate", "preds.csv"), {"preds.csv": "label,probability\n1,0.5\n0,1.5\n"},
                                 "calibd: 422 Unprocessable Entity: /probabilities/1: probabilities must lie in [0, 1]"),
    "bad-name": (("fit", "holdout.csv", "--name", "Bad Name"), {"holdout.csv": "label,score\n1,0.5\n"},
                 "calibd: 422 Unprocessable Entity: /name: must match"),
    "bad-holdout-value": (("fit", "holdout.csv", "--name", "x-bad-csv"), {"holdout.csv": "label,score\n1,0.5\n0,oops\n"},
                          "calibd: 422 Unprocessable Entity: line 3, column score: 'oops' is not a number"),
    "report-unknown": (("report", "no-such-calibrator", "--format", "html"), {}, "calibd: 404 Not Found"),
    "export-unknown": (("export", "no-such-calibrator"), {}, "calibd: 404 Not Found"),
}


@pytest.mark.parametrize("case", SERVICE_ERRORS)
def test_errors_from_the_service_exit_1_with_one_line(cli, tmp_path, case):
    args, files, message = SERVICE_ERRORS[case]
    for filename, content in files.items():
        (tmp_path / filename).write_text(content)
    result = cli(*args)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert one_line_error(result).startswith(message)


# Refused before calibd is asked: CALIBD_URL points where nothing listens.
LOCAL_ERRORS = {
    "missing-file": (("calibrate", "x", "missing.csv"), {}, "calibd: missing.csv: No such file or directory"),
    "no-score-column": (("calibrate", "x", "scores.csv"), {"scores.csv": "value\n0.5\n"},
                        "calibd: scores.csv: expected a 'score' column, or score_0, score_1, ... (header: value)"),
    "not-a-number": (("calibrate", "x", "scores.csv"), {"scores.csv": "score\n0.5\nhigh\n"},
                     "calibd: scores.csv: line 3, column score: 'high' is not a number"),
    "ragged-row": (("calibrate", "x", "scores.csv"), {"scores.csv": "id,score\na,0.5\nb\n"},
                   "calibd: scores.csv: line 3 has 1 fields but the header names 2"),
    "fractional-label": (("evaluate", "preds.csv"), {"preds.csv": "label,probability\n1,0.5\n0.5,0.5\n"},
                         "calibd: preds.csv: column label: labels must be integers (0/1, or 0..K-1)"),
    "options-not-object": (("fit", "holdout.csv", "--name", "x", "--options", "[1]"), {"holdout.csv": "label,score\n1,0.5\n"},
                           "calibd: --options must be a JSON object"),
    "fit-missing-file": (("fit", "missing.csv", "--name", "x"), {}, "calibd: missing.csv: no such file"),
    "import-not-json": (("import", "model.json"), {"model.json": "{not json"}, "calibd: model.json: not JSON"),
    "import-not-export": (("import", "model.json"), {"model.json": '{"name": "x"}'},
                          "calibd: model.json: not a calibd export (no 'format' field)"),
}


@pytest.mark.parametrize("case", LOCAL_ERRORS)
def test_bad_input_files_exit_2_with_one_line(tmp_path, case):
    args, files, message = LOCAL_ERRORS[case]
    for filename, content in files.items():
        (tmp_path / filename).write_text(content)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALIBD_")}
    env |= {"PYTHONPATH": str(REPO), "CALIBD_URL": f"http://127.0.0.1:{free_port()}"}
    result = subprocess.run([sys.executable, "-m", "calibd.cli", *args], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert one_line_error(result).startswith(message)


def test_an_unreachable_service_is_one_line_and_status_3(cli, tmp_path):
    result = cli("list", url=f"http://127.0.0.1:{free_port()}")
    assert result.returncode == 3
    line = one_line_error(result)
    assert line.startswith("calibd: cannot reach http://127.0.0.1:") and line.endswith("(is calibd running there? set CALIBD_URL or --url)")


def test_a_missing_api_key_says_how_to_send_one(isolated_database_url, tmp_path):
    from calibd.config import Settings
    from calibd.storage import keys
    from calibd.storage.db import make_engine, make_sessionmaker

    from .conftest import LiveServer

    keys.create_key(make_sessionmaker(make_engine(isolated_database_url)), ["admin"])
    with LiveServer(Settings(database_url=isolated_database_url)) as live:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CALIBD_")} | {"PYTHONPATH": str(REPO)}
        result = subprocess.run([sys.executable, "-m", "calibd.cli", "list", "--url", live.url], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert one_line_error(result) == (
        "calibd: 401 Unauthorized: an API key is required: send Authorization: Bearer <key> (set CALIBD_API_KEY)")


def test_list(cli, tmp_path, name):
    write_holdout(tmp_path / "holdout.csv", n=200, seed=5)
    assert cli("fit", "holdout.csv", "--name", name, "--method", "platt").returncode == 0
    result = cli("list")
    assert result.returncode == 0
    assert result.stdout.splitlines()[0].split() == ["NAME", "CURRENT", "LATEST", "METHOD", "CLASSES", "UPDATED"]
    row = next(line for line in result.stdout.splitlines() if line.startswith(name + " "))
    assert row.split()[:5] == [name, "1", "1", "platt", "2"]


def test_version_and_the_database_commands_still_work(tmp_path):
    version = importlib.metadata.version("calibd")  # the installed metadata (pyproject's dynamic version)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALIBD_")} | {
        "PYTHONPATH": str(REPO), "CALIBD_DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}"}
    run = lambda *args: subprocess.run([sys.executable, "-m", "calibd.cli", *args], cwd=tmp_path, env=env,
                                       capture_output=True, text=True, timeout=120)
    shown = run("--version")
    assert shown.returncode == 0 and shown.stdout.strip() == f"calibd {version}"
    migrated = run("migrate")
    assert migrated.returncode == 0 and migrated.stdout.startswith("calibd: database at migration ")
    listed = run("keys", "list")
    assert listed.returncode == 0 and listed.stdout.startswith("KEY ID")
    usage = run("fit")
    assert usage.returncode == 2 and "usage: calibd fit" in usage.stderr


def test_progress_is_a_bar_redrawn_on_a_terminal():
    from calibd.cli.output import Progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    progress = Progress("holdout.csv", 3 * 1024 * 1024, stream=stream)
    for fraction in (0.25, 0.5, 1.0):
        progress("upload", fraction, None)
    progress("fit", None, None)
    progress.finish(ok=True)
    out = stream.getvalue()
    assert "\r\x1b[Kuploading holdout.csv [######" in out and " 100% of 3.0 MB" in out
    assert out.count("\n") == 1 and out.endswith("\r\x1b[Kuploaded holdout.csv (3.0 MB) in 0.0 s, fitted in 0.0 s\n")

    jobs = Terminal()
    progress = Progress("big.csv", 10, stream=jobs)
    progress("running", 0.4, 12.0)
    progress.finish(ok=True)
    assert "fit job running [##########..............]  40%, about 12 s left" in jobs.getvalue()


def test_fit_from_parquet_fits_what_the_csv_fits(cli, tmp_path, server, name):
    import pyarrow as pa
    import pyarrow.parquet as pq

    scores, labels = write_holdout(tmp_path / "holdout.csv")
    pq.write_table(pa.table({"label": labels, "score": scores}), tmp_path / "holdout.parquet")
    for file in ("holdout.csv", "holdout.parquet"):
        result = cli("fit", file, "--name", name, "--method", "isotonic")
        assert result.returncode == 0, result.stderr
    with Client(server.url) as client:
        from_csv, from_parquet = (client.version(name, v) for v in (1, 2))
    assert from_parquet["holdout_sha256"] == from_csv["holdout_sha256"]
    assert from_parquet["parameters"] == from_csv["parameters"]


def _parsers(parser):
    import argparse

    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from _parsers(child)


def test_every_option_has_a_help_text_that_says_its_default():
    from calibd.cli import build_parser

    for parser in _parsers(build_parser()):
        formatter = parser._get_formatter()
        for action in parser._actions:
            if action.help == "==SUPPRESS==" or type(action).__name__ in ("_HelpAction", "_VersionAction", "_SubParsersAction"):
                continue
            assert action.help, f"{parser.prog} {action.dest}: no help text"
            if action.option_strings and action.default is not None and not isinstance(action.default, bool):
                assert "default" in formatter._expand_help(action), f"{parser.prog} {action.option_strings}: no default"
    serve = subprocess.run([sys.executable, "-m", "calibd.cli", "serve", "--help"], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert "port to listen on (default: 8000)" in serve.stdout
    assert "(default: 127.0.0.1)" in serve.stdout
