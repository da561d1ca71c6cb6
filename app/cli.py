"""The ``calibd`` command: serve, migrate and keys (on the database), and the client commands.

The client commands (fit, calibrate, evaluate, report, export, import, list) talk to a running
calibd over HTTP through ``calibd.client``: CALIBD_URL (default http://127.0.0.1:8000) and
CALIBD_API_KEY. They print results to stdout, progress to stderr, and on error one line on
stderr with a non-zero exit status: 1 for an error answered by calibd, 2 for a bad command
line or input file, 3 when calibd cannot be reached or is unavailable.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from . import __version__
from .config import check_predictor_url, get_settings


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .storage import migrate
    from .storage.db import make_engine

    settings = get_settings()
    engine = make_engine(settings.database_url)
    if engine.dialect.name == "sqlite":
        migrate.upgrade(engine)
    elif not migrate.is_at_head(engine):
        print(
            f"calibd: the database schema is at {migrate.current_revision(engine)}, "
            f"this calibd needs {migrate.head_revision()}; run `calibd migrate` first",
            file=sys.stderr,
        )
        return 1
    host = args.host
    if not settings.bootstrap_admin_key and not _any_keys(engine) and host not in LOOPBACK:
        print(
            f"calibd: no API keys exist, so auth is off; listening on 127.0.0.1 instead of {host}. "
            "Create a key (calibd keys create --scope admin) to serve other hosts.",
            file=sys.stderr,
        )
        host = "127.0.0.1"
    elif not settings.bootstrap_admin_key and not _any_keys(engine):
        print("calibd: no API keys exist: auth is off (loopback only)", file=sys.stderr)
    engine.dispose()
    predictor = args.predictor or (f"http://{args.predictor_host}" if args.predictor_host else None)
    if predictor:  # transformer mode's default predictor, read by every worker's app
        try:
            check_predictor_url(predictor)
        except ValueError as error:
            print(f"calibd: --predictor {predictor}: {error}", file=sys.stderr)
            return 2
        os.environ["CALIBD_PREDICTOR_URL"] = predictor
        get_settings.cache_clear()
        print(f"calibd: transformer mode: /v2 infer requests without scores go to {predictor}", file=sys.stderr)
    if args.grpc_port is not None:  # read by every worker's app (each binds it, with SO_REUSEPORT)
        os.environ["CALIBD_GRPC_PORT"] = str(args.grpc_port)
        os.environ["CALIBD_GRPC_HOST"] = host
        get_settings.cache_clear()
        print(f"calibd: the inference protocol over gRPC on {host}:{args.grpc_port}", file=sys.stderr)
    if args.workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # Each worker writes its counters to files here, and /metrics adds them up.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="calibd-metrics-")
    print(f"calibd {__version__} on http://{host}:{args.port} (database: {engine.url.render_as_string()})", file=sys.stderr)
    _flush_logs_on_sigterm()
    from .serving import TimedHTTPProtocol

    uvicorn.run(
        "calibd.main:create_app",
        factory=True,
        host=host,
        port=args.port,
        http=TimedHTTPProtocol,  # uvicorn's, with header and body read timeouts
        workers=args.workers,
        log_config=None,  # calibd.main configures JSON logs in every worker
        access_log=False,
    )
    return 0


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _flush_logs_on_sigterm() -> None:
    """After a graceful shutdown uvicorn raises the signal that started it again, under the
    handler it found; this one writes the log lines still queued before the process ends as
    SIGTERM ends it."""
    import signal

    from .api.logs import flush_logs

    def flush_and_terminate(signum, frame) -> None:
        flush_logs()
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)

    signal.signal(signal.SIGTERM, flush_and_terminate)


def _any_keys(engine) -> bool:
    from sqlalchemy import text

    with engine.connect() as connection:
        return connection.execute(text("SELECT count(*) FROM api_keys")).scalar_one() > 0


def _sessions():
    from .storage.db import make_engine, make_sessionmaker

    return make_sessionmaker(make_engine(get_settings().database_url))


def _parse_duration(text: str):
    from datetime import timedelta

    units = {"d": "days", "h": "hours", "m": "minutes"}
    if not text or text[-1] not in units:
        raise argparse.ArgumentTypeError("durations look like 30d, 12h or 90m")
    try:
        duration = timedelta(**{units[text[-1]]: float(text[:-1])})
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError("durations look like 30d, 12h or 90m, up to 36500d") from None
    if not timedelta(0) < duration <= timedelta(days=36_500):
        raise argparse.ArgumentTypeError("a key lives more than no time and at most 36500d (100 years)")
    return duration


def _keys_create(args: argparse.Namespace) -> int:
    from .storage import keys
    from .storage.models import utcnow

    expires = utcnow() + args.expires if args.expires else None
    try:
        key, info = keys.create_key(_sessions(), args.scope, expires, args.description)
    except ValueError as error:
        print(f"calibd: {error}", file=sys.stderr)
        return 2
    print(key)
    print(
        f"key id {info.key_id}, scopes {', '.join(info.scopes)}"
        + (f", expires {info.expires_at:%Y-%m-%d %H:%M} UTC" if info.expires_at else "")
        + ". The key is shown only now.",
        file=sys.stderr,
    )
    return 0


def _keys_list(_args: argparse.Namespace) -> int:
    from .storage import keys
    from .storage.models import utcnow

    now = utcnow()
    print(f"{'KEY ID':<10} {'SCOPES':<28} {'CREATED':<17} {'EXPIRES':<17} STATE  DESCRIPTION")
    for info in keys.list_keys(_sessions()):
        state = "active" if info.active(now) else ("revoked" if info.revoked_at else "expired")
        expires = f"{info.expires_at:%Y-%m-%d %H:%M}" if info.expires_at else "never"
        print(f"{info.key_id:<10} {','.join(info.scopes):<28} {info.created_at:%Y-%m-%d %H:%M} {expires:<17} {state:<6} {info.description}")
    return 0


def _keys_revoke(args: argparse.Namespace) -> int:
    from .storage import keys

    try:
        keys.revoke_key(_sessions(), args.key_id)
    except keys.KeyNotFound:
        print(f"calibd: no API key with id {args.key_id!r}", file=sys.stderr)
        return 1
    print(f"revoked {args.key_id}", file=sys.stderr)
    return 0


def _migrate(_args: argparse.Namespace) -> int:
    from .storage import migrate
    from .storage.db import make_engine

    engine = make_engine(get_settings().database_url)
    migrate.upgrade(engine)
    print(f"calibd: database at migration {migrate.current_revision(engine)}")
    return 0


# -- client commands: talk to a running calibd through calibd.client -----------------------------

#: Holdout files at least this large are fitted as a job (POST /calibrators?async=true), where the
#: service runs jobs; a service without jobs answers such a request synchronously, as usual.
JOB_THRESHOLD_BYTES = 8 * 1024 * 1024


class InputFileError(Exception):
    """A local file the command cannot use (exit status 2)."""


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _client_command(handler):
    """Run a client command: errors become one line on stderr and an exit status, never a traceback."""

    def run(args: argparse.Namespace) -> int:
        from .client import CalibdError, ConnectionFailed, Unavailable

        try:
            return handler(args)
        except ConnectionFailed as error:
            print(f"calibd: {_one_line(error.detail)} (is calibd running there? set CALIBD_URL or --url)", file=sys.stderr)
            return 3
        except Unavailable as error:
            print(f"calibd: {_one_line(error)}", file=sys.stderr)
            return 3
        except CalibdError as error:
            hint = " (set CALIBD_API_KEY)" if error.status == 401 else ""
            print(f"calibd: {_one_line(error)}{hint}", file=sys.stderr)
            return 1
        except InputFileError as error:
            print(f"calibd: {_one_line(error)}", file=sys.stderr)
            return 2
        except BrokenPipeError:  # the reader went away (| head): stop quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141
        except OSError as error:
            where = f"{error.filename}: " if error.filename else ""
            print(f"calibd: {where}{_one_line(error.strerror or error)}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("calibd: interrupted", file=sys.stderr)
            return 130
        except Exception as error:  # a bug: still one line, unless CALIBD_DEBUG asks for the traceback
            if os.environ.get("CALIBD_DEBUG"):
                raise
            print(f"calibd: unexpected error: {type(error).__name__}: {_one_line(error)} (CALIBD_DEBUG=1 shows where)",
                  file=sys.stderr)
            return 1

    return run


def _client(args: argparse.Namespace):
    from .client import Client

    return Client(args.url, timeout=args.timeout)


class _Progress:
    """Upload and fit progress on stderr.

    On a terminal, one line redrawn in place: the upload's bar, then the fit's elapsed time (or a
    fit job's bar and time left); it is cleared at the end. Either way, a finished fit leaves one
    line saying how long the upload and the fit took, and a failed one leaves only the error.
    """

    def __init__(self, label: str, total_bytes: int, stream=None):
        import threading
        import time

        self._time = time
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.label = label
        self.total = total_bytes
        self.started = time.monotonic()
        self.uploaded: float | None = None  # when the last byte was sent
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._last_draw = 0.0
        self._job: str | None = None

    def __call__(self, stage: str, fraction: float | None, eta: float | None) -> None:
        with self._lock:
            if stage == "upload":
                self._upload(fraction or 0.0)
            elif stage == "fit":
                self._fitting()
            else:  # a fit job's state
                self._job_state(stage, fraction, eta)

    def _upload(self, fraction: float) -> None:
        now = self._time.monotonic()
        if self.tty and (fraction >= 1.0 or now - self._last_draw > 0.05):
            self._last_draw = now
            self._draw(f"uploading {self.label} {_bar(fraction)} {fraction:4.0%} of {_size(self.total)}")

    def _fitting(self) -> None:
        if self.uploaded is not None:
            return
        self.uploaded = self._time.monotonic()
        if not self.tty:
            return
        import threading

        def tick() -> None:
            spinner = "|/-\\"
            index = 0
            while not self._stop.wait(0.1):
                with self._lock:
                    if self._job is None:
                        self._draw(f"fitting {spinner[index % 4]} {self._time.monotonic() - self.uploaded:5.1f} s")
                index += 1

        self._ticker = threading.Thread(target=tick, daemon=True)
        self._ticker.start()

    def _job_state(self, state: str, fraction: float | None, eta: float | None) -> None:
        self._job = state
        if self.tty:
            left = f", about {eta:.0f} s left" if eta is not None else ""
            done = f" {_bar(fraction)} {fraction:4.0%}" if fraction is not None else ""
            self._draw(f"fit job {state}{done}{left}")

    def finish(self, ok: bool) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        with self._lock:
            if self.tty:
                self._draw("")
            if ok:
                now = self._time.monotonic()
                uploaded = self.uploaded or now
                self.stream.write(
                    f"uploaded {self.label} ({_size(self.total)}) in {uploaded - self.started:.1f} s, "
                    f"fitted in {now - uploaded:.1f} s\n"
                )
            self.stream.flush()

    def _draw(self, text: str) -> None:
        self.stream.write("\r\x1b[K" + text)
        self.stream.flush()


def _bar(fraction: float, width: int = 24) -> str:
    filled = int(round(max(0.0, min(fraction, 1.0)) * width))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _number(value: object, width: int = 9) -> str:
    if value is None:
        return "-".rjust(width)
    if isinstance(value, float):
        return f"{value:{width}.4f}"
    return str(value).rjust(width)


def _parse_options(text: str | None) -> dict:
    import json

    if not text:
        return {}
    try:
        options = json.loads(text)
    except ValueError as error:
        raise InputFileError(f"--options is not JSON: {error}") from None
    if not isinstance(options, dict):
        raise InputFileError('--options must be a JSON object, such as \'{"n_bins": 10}\'')
    return options


def _parse_costs(text: str | None):
    import json

    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError as error:
        raise InputFileError(f"--costs is not JSON: {error}") from None


def _fit(args: argparse.Namespace) -> int:
    from pathlib import Path

    path = Path(args.file)
    if not path.is_file():
        raise InputFileError(f"{path}: no such file")
    options = _parse_options(args.options)
    size = path.stat().st_size
    job = args.job == "always" or (args.job == "auto" and size >= JOB_THRESHOLD_BYTES)
    progress = _Progress(path.name, size)
    with _client(args) as client:
        try:
            fitted = client.fit_file(
                args.name, path, method=args.method, input=args.input, options=options,
                promote=not args.no_promote, job=job, progress=progress,
            )
        except BaseException:
            progress.finish(ok=False)
            raise
        progress.finish(ok=True)
    _print_fit(fitted)
    return 0


def _print_fit(fitted) -> None:
    chosen = f" (chose {fitted.chosen})" if fitted.chosen else ""
    state = "current" if fitted.current else "not current: promote it to serve it"
    print(f"{fitted.name} version {fitted.version} ({state}): {fitted.method}{chosen}, {fitted.n_samples} holdout rows")
    metrics = [m for m in ("ece", "brier", "log_loss") if m in fitted.before or m in fitted.after]
    print(f"{'metric':<10} {'before':>9} {'after':>9}")
    for metric in metrics:
        print(f"{metric:<10} {_number(fitted.before.get(metric))} {_number(fitted.after.get(metric))}")
    print("(after: cross-fitted, each row scored by a calibrator fitted without it)")


def _read_csv(path: str) -> tuple[list[str], list[list[str]]]:
    """The header and rows of a CSV file ('-' is stdin)."""
    import csv

    stream = sys.stdin if path == "-" else open(path, newline="", encoding="utf-8-sig")
    with stream:
        reader = csv.reader(stream)
        try:
            header = [column.strip() for column in next(reader)]
        except StopIteration:
            raise InputFileError(f"{path}: empty file; expected a header row") from None
        except UnicodeDecodeError:
            raise InputFileError(f"{path}: not a UTF-8 CSV file") from None
        try:
            rows = [row for row in reader if row]
        except (csv.Error, UnicodeDecodeError) as error:
            raise InputFileError(f"{path}: line {reader.line_num}: {error}") from None
    if not rows:
        raise InputFileError(f"{path}: the header has no rows under it")
    for number, row in enumerate(rows):
        if len(row) != len(header):
            raise InputFileError(f"{path}: line {number + 2} has {len(row)} fields but the header names {len(header)}")
    return header, rows


def _numbers(path: str, header: list[str], rows: list[list[str]], columns: list[str], kind=float):
    """The named columns as a numpy array: (n,) for one column, (n, k) for several."""
    import numpy as np

    positions = [header.index(column) for column in columns]
    out = []
    for position, column in zip(positions, columns):
        values = [row[position].strip() for row in rows]
        try:
            out.append(np.array(values, dtype=np.float64))
        except ValueError:
            for number, value in enumerate(values):
                try:
                    float(value)
                except ValueError:
                    raise InputFileError(f"{path}: line {number + 2}, column {column}: {value!r} is not a number") from None
    array = out[0] if len(out) == 1 else np.column_stack(out)
    if kind is int:
        if not np.all(np.isfinite(array)) or np.any(array != np.round(array)):
            raise InputFileError(f"{path}: column {columns[0]}: labels must be integers (0/1, or 0..K-1)")
        array = array.astype(np.int64)
    return array


def _calibrate(args: argparse.Namespace) -> int:
    from .batch import indexed_columns

    if args.input is not None:
        return _calibrate_parquet(args)
    if args.name is None or args.file is None:
        raise InputFileError("give a calibrator's name and a CSV file, or --input scores.parquet --output calibrated.parquet")
    header, rows = _read_csv(args.file)
    if "score" in header:
        columns = ["score"]
    else:
        columns = indexed_columns(header, "score")
        if not columns:
            raise InputFileError(f"{args.file}: expected a 'score' column, or score_0, score_1, ... (header: {','.join(header)})")
    scores = _numbers(args.file, header, rows, columns)
    ids = [row[header.index("id")] for row in rows] if "id" in header else None
    with _client(args) as client:
        result = client.calibrate(args.name, scores, version=args.version, ids=ids, costs=_parse_costs(args.costs))
    # Columns other than the scores (id, label, ...) are copied through, so that the output can
    # go on to `calibd evaluate`.
    kept = [(column, [row[position] for row in rows]) for position, column in enumerate(header) if column not in columns]
    _write_calibration(result, kept, args.output)
    print(f"calibrated {len(result)} rows with {result.calibrator} version {result.version}"
          + (f", written to {args.output}" if args.output else ""), file=sys.stderr)
    return 0


def _calibrate_parquet(args: argparse.Namespace) -> int:
    """Parquet in, Parquet out, calibrated here with calibd.batch (the Spark module's code):
    from an export file, or from the named calibrator's export fetched from calibd."""
    import json

    from .batch import calibrate_parquet

    if args.output is None or not args.input.endswith(".parquet") or not args.output.endswith(".parquet"):
        raise InputFileError("--input and --output are both .parquet files")
    if args.export is not None:
        try:
            with open(args.export, encoding="utf-8") as stream:
                exported = json.load(stream)
        except (OSError, ValueError) as error:
            raise InputFileError(f"{args.export}: {error}") from None
    elif args.name is not None:
        with _client(args) as client:
            exported = client.export(args.name, version=args.version)
    else:
        raise InputFileError("name the calibrator, or give --export FILE (written by calibd export)")
    try:
        rows = calibrate_parquet(args.input, args.output, exported)
    except (OSError, ValueError, KeyError) as error:  # a missing file or column, a bad score
        raise InputFileError(f"{args.input}: {error}") from None
    source = args.export or f"{exported.get('name')} version {exported.get('version')}"
    print(f"calibrated {rows} rows with {source}, written to {args.output}", file=sys.stderr)
    return 0


def _write_calibration(result, kept: list[tuple[str, list[str]]], output: str | None) -> None:
    import csv

    import numpy as np

    from .batch import output_columns

    calibrated = output_columns(result.probabilities, result.extras)
    names, columns = list(calibrated), list(calibrated.values())
    kept = [(name, values) for name, values in kept if name not in names]
    names = [name for name, _ in kept] + names
    columns = [np.asarray(values, dtype=object) for _, values in kept] + columns
    stream = open(output, "w", newline="", encoding="utf-8") if output else sys.stdout
    try:
        writer = csv.writer(stream, lineterminator="\n")
        writer.writerow(names)
        cells = [[_cell(v) for v in column.tolist()] for column in columns]
        writer.writerows(zip(*cells))
    finally:
        if output:
            stream.close()


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _evaluate(args: argparse.Namespace) -> int:
    from .batch import indexed_columns

    header, rows = _read_csv(args.file)
    if "label" not in header:
        raise InputFileError(f"{args.file}: expected a 'label' column (header: {','.join(header)})")
    if "probability" in header:
        columns = ["probability"]
    else:
        columns = indexed_columns(header, "p")
        if len(columns) < 2:
            raise InputFileError(f"{args.file}: expected a 'probability' column, or p_0, p_1, ... (header: {','.join(header)})")
    probabilities = _numbers(args.file, header, rows, columns)
    labels = _numbers(args.file, header, rows, ["label"], kind=int)
    weights = _numbers(args.file, header, rows, ["weight"]) if "weight" in header else None
    options: dict = {"n_bins": args.bins, "binning": args.binning}
    if args.bootstrap:
        options["bootstrap"] = {"n_resamples": args.bootstrap, "seed": args.seed, "level": args.level}
    with _client(args) as client:
        evaluation = client.evaluate(probabilities, labels, sample_weight=weights, options=options)
    with_ci = any(m.get("ci") for m in evaluation.metrics.values())
    print(f"{len(labels)} predictions from {args.file}")
    print(f"{'metric':<22} {'value':>9}" + (f"  {args.level:.0%} interval" if with_ci else ""))
    for name, metric in evaluation.metrics.items():
        line = f"{name:<22} {_number(metric.get('value'))}"
        if with_ci and metric.get("ci"):
            low, high = metric["ci"]
            line += f"  [{low:.4f}, {high:.4f}]"
        if metric.get("p_value") is not None:
            line += f"  (p = {metric['p_value']:.3g})"
        print(line)
    if args.plot:
        _plot(evaluation, args)
        print(f"reliability diagram written to {args.plot}", file=sys.stderr)
    return 0


def _plot(evaluation, args: argparse.Namespace) -> None:
    from pathlib import Path

    from .reporting import render_diagram

    reliability = evaluation.reliability
    if reliability.get("bins") is not None:
        curves = {Path(args.file).name: reliability}
        ece = {Path(args.file).name: evaluation.values.get("ece")}
    else:  # classwise: a curve per class
        curves = {f"class {c['class']}": {"bins": c["bins"], "target": "classwise"} for c in reliability["classes"]}
        ece = None
    ece = {k: v for k, v in (ece or {}).items() if v is not None} or None
    title = f"{Path(args.file).name}: {reliability.get('target', '')} reliability, {reliability.get('n_bins')} bins"
    image = render_diagram(curves, title, Path(args.plot).suffix.lstrip(".").lower() == "svg" and "svg" or "png", ece)
    Path(args.plot).write_bytes(image)


def _report(args: argparse.Namespace) -> int:
    import json

    fmt = "json" if args.format == "text" else args.format
    with _client(args) as client:
        report = client.report(args.name, format=fmt, version=args.version, hours=args.hours)
    if args.format == "text":
        text = _report_text(report)
    elif args.format == "json":
        text = json.dumps(report, indent=2)
    else:
        text = report
    if args.output:
        mode = "wb" if isinstance(text, bytes) else "w"
        with open(args.output, mode, **({} if mode == "wb" else {"encoding": "utf-8"})) as out:
            out.write(text)
        print(f"{args.format} report of {args.name} written to {args.output}", file=sys.stderr)
    elif isinstance(text, bytes):
        if sys.stdout.isatty():
            raise InputFileError(f"a {args.format.upper()} image is not for a terminal: add --output FILE")
        sys.stdout.buffer.write(text)
    else:
        print(text)
    return 0


def _report_text(report: dict) -> str:
    lines = []
    current = "current" if report["version"] == report.get("current_version") else "not current"
    lines.append(
        f"{report['calibrator']} version {report['version']} ({current}): {report['method']}, input {report['input']}, "
        f"{report['n_classes']} classes, {report['n_samples']} holdout samples, created {str(report['created_at'])[:19]}"
    )
    chosen = (report.get("fit") or {}).get("chosen")
    if chosen:
        lines.append(f"auto chose {chosen}")
    holdout = report.get("holdout") or {}
    lines.append("")
    lines.append(f"{'holdout':<24} {'ece':>9} {'brier':>9} {'log_loss':>9}")
    for part, label in (("before", "raw scores"), ("after", "calibrated (cross-fit)")):
        metrics = (holdout.get(part) or {}).get("metrics", {})
        values = [(metrics.get(m) or {}).get("value") for m in ("ece", "brier", "log_loss")]
        lines.append(f"{label:<24} " + " ".join(_number(v) for v in values))
    feedback = report.get("feedback") or {}
    windows = feedback.get("windows") or {}
    if windows:
        lines.append("")
        lines.append(f"{'feedback window':<24} {'samples':>9} {'ece':>9} {'brier':>9} {'log_loss':>9}")
        for window, metrics in windows.items():
            samples = metrics.get("samples")
            values = [metrics.get(m) for m in ("ece", "brier", "log_loss")]
            lines.append(f"{window:<24} {int(samples or 0):>9} " + " ".join(_number(v) for v in values))
    drift = feedback.get("drift") or {}
    if drift:
        state = "ALARM" if drift.get("alarm") else "no alarm"
        lines.append("")
        lines.append(
            f"drift: {state} (log e-value {drift.get('log_evalue', 0.0):.2f}, alarm at {drift.get('threshold', 0.0):.2f}; "
            f"{drift.get('samples', 0)} labels)"
        )
    versions = report.get("versions") or []
    if versions:
        lines.append("")
        lines.append(f"{'version':<8} {'method':<16} {'samples':>9} {'ece after':>9}  created")
        for v in versions:
            mark = "*" if v.get("current") else " "
            ece = (v.get("after") or {}).get("ece")
            lines.append(f"{mark}{v['version']:<7} {v['method']:<16} {v['n_samples']:>9} {_number(ece)}  {str(v['created_at'])[:19]}")
    return "\n".join(lines)


def _export(args: argparse.Namespace) -> int:
    import json

    with _client(args) as client:
        export = client.export(args.name, version=args.version)
    text = json.dumps(export, indent=2)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as out:
            out.write(text + "\n")
        print(f"exported {export['name']} version {export['version']} ({export['method']}) to {args.output}", file=sys.stderr)
    else:
        print(text)
    return 0


def _import(args: argparse.Namespace) -> int:
    import json

    try:
        with (sys.stdin if args.file == "-" else open(args.file, encoding="utf-8")) as stream:
            data = json.load(stream)
    except ValueError as error:
        raise InputFileError(f"{args.file}: not JSON: {error}") from None
    if not isinstance(data, dict) or data.get("format") is None:
        raise InputFileError(f"{args.file}: not a calibd export (no 'format' field)")
    if not (args.name or data.get("name")):
        raise InputFileError(f"{args.file}: the export names no calibrator; pass --name")
    with _client(args) as client:
        stored = client.import_calibrator(data, name=args.name, promote=not args.no_promote)
    source = f"{data.get('name')} version {data.get('version')}" if data.get("name") else args.file
    state = "current" if stored.current else "not current"
    print(f"imported {source} as {stored.name} version {stored.version} ({state}; {stored.method}, not refitted)")
    return 0


def _predictor(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if args.delete:
            out = client.delete_predictor(args.name)
        elif args.set:
            out = client.set_predictor(args.name, args.set, model=args.model, output=args.output_name)
        else:
            out = client.predictor(args.name)
    effective = out["effective"]
    if effective is None:
        print(f"{args.name}: no predictor (its /v2 infer requests need scores)")
    else:
        source = "stored with the calibrator" if effective["source"] == "calibrator" else f"from {effective['source']}"
        print(f"{args.name}: {effective['url']}, model {effective['model']}, output {effective['output']} ({source})")
    return 0


def _list(args: argparse.Namespace) -> int:
    with _client(args) as client:
        items = list(client.calibrators())
    print(f"{'NAME':<32} {'CURRENT':>7} {'LATEST':>6} {'METHOD':<16} {'CLASSES':>7}  UPDATED")
    for item in items:
        current = item["current_version"] if item["current_version"] is not None else "-"
        print(f"{item['name']:<32} {current:>7} {item['latest_version']:>6} {item['method'] or '-':<16} "
              f"{item['n_classes'] or '-':>7}  {str(item['updated_at'])[:19]}")
    return 0


class HelpFormatter(argparse.HelpFormatter):
    """Says each option's default in its help, unless the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unset = action.default is None or action.default is argparse.SUPPRESS or isinstance(action.default, bool)
        if "default" in text or unset or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def with_defaults_shown(parser: argparse.ArgumentParser) -> None:
    """Use HelpFormatter for the parser and every subcommand's parser."""
    parser.formatter_class = HelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                with_defaults_shown(child)


def add_client_commands(commands) -> None:
    """The commands that use a running calibd (CALIBD_URL, CALIBD_API_KEY) through calibd.client."""
    connection = argparse.ArgumentParser(add_help=False)
    connection.add_argument("--url", help="calibd's URL (default: CALIBD_URL, else http://127.0.0.1:8000)")
    connection.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for an answer (default 60)")

    def command(name: str, handler, help: str, description: str | None = None) -> argparse.ArgumentParser:
        parser = commands.add_parser(name, parents=[connection], help=help, description=description or help)
        parser.set_defaults(handler=_client_command(handler))
        return parser

    fit = command("fit", _fit, "fit a calibrator from a holdout CSV (or Parquet, or .npz) and store it as a new version",
                  "Upload a labelled holdout and fit a calibrator on it. The CSV has a header row: label, then score "
                  "(binary) or score_0..score_{K-1}, and optionally weight; a Parquet file has the same columns.")
    fit.add_argument("file", help="holdout CSV, Parquet (.parquet) or .npz")
    fit.add_argument("--name", required=True, help="the calibrator's name")
    fit.add_argument("--method", default="auto", help="platt, isotonic, beta, ... or auto (default: auto)")
    fit.add_argument("--input", default="probability", choices=["probability", "logit"],
                     help="what the scores are: probabilities in [0, 1] or logits")
    fit.add_argument("--options", help="the method's options as a JSON object (default: none)")
    fit.add_argument("--no-promote", action="store_true", help="store the version without making it current")
    fit.add_argument("--job", choices=["auto", "always", "never"], default="auto",
                     help=f"fit as a job and follow its progress (auto: for files of {JOB_THRESHOLD_BYTES >> 20} MiB or more)")

    calibrate = command("calibrate", _calibrate, "calibrate the scores of a CSV file; prints a CSV of probabilities",
                        "Reads a CSV with a score column (or score_0..score_{K-1}); an id column logs the predictions "
                        "for feedback by id. Writes the other columns as they were (id, label...), then probability "
                        "(or p_0..p_{K-1}) and any extras the method returns.")
    calibrate.add_argument("name", nargs="?", help="the calibrator's name")
    calibrate.add_argument("file", nargs="?", help="CSV of scores ('-' reads stdin)")
    calibrate.add_argument("--version", type=int, help="a version (default: the current one)")
    calibrate.add_argument("--output", "-o", help="write the CSV (or with --input, the Parquet file) here instead of stdout")
    calibrate.add_argument("--input", metavar="SCORES.parquet",
                           help="calibrate a Parquet file here, without sending it (calibd.batch, as in Spark): "
                                "columns score or score_0..score_{K-1}, and the method's extra arrays (default: none; "
                                "NAME FILE sends a CSV to calibd)")
    calibrate.add_argument("--export", metavar="FILE",
                           help="with --input: the calibrator from this file, written by calibd export "
                                "(default: NAME's export, fetched from calibd)")
    calibrate.add_argument("--costs", help='add a decisions column of least expected cost: '
                           '\'{"false_positive": 1, "false_negative": 5}\' (binary) or a K x K matrix as JSON')

    evaluate = command("evaluate", _evaluate, "print the calibration metrics of a CSV of predictions and labels",
                       "Reads a CSV with label and probability (or p_0..p_{K-1}) columns, optionally weight.")
    evaluate.add_argument("file", help="CSV of predictions ('-' reads stdin)")
    evaluate.add_argument("--plot", help="write the reliability diagram here (PNG, or SVG by extension)")
    evaluate.add_argument("--bins", type=int, default=15, help="bins of the ECE and the diagram (default 15)")
    evaluate.add_argument("--binning", choices=["uniform", "quantile"], default="uniform",
                          help="bins of equal width or of equal count")
    evaluate.add_argument("--bootstrap", type=int, metavar="N", help="add N-resample bootstrap intervals (default: none)")
    evaluate.add_argument("--seed", type=int, default=0, help="seed of the bootstrap")
    evaluate.add_argument("--level", type=float, default=0.95, help="level of the intervals (default 0.95)")

    report = command("report", _report, "a calibrator's report: text summary, JSON, PNG/SVG diagram or HTML page")
    report.add_argument("name", help="the calibrator's name")
    report.add_argument("--format", choices=["text", "json", "png", "svg", "html"], default="text",
                        help="what to write")
    report.add_argument("--version", type=int, help="a version (default: the current one)")
    report.add_argument("--hours", type=int, help="feedback history to include (default 48)")
    report.add_argument("--output", "-o", help="write the report here instead of stdout")

    export = command("export", _export, "write a stored calibrator as portable JSON")
    export.add_argument("name", help="the calibrator's name")
    export.add_argument("--version", type=int, help="a version (default: the current one, else the latest)")
    export.add_argument("--output", "-o", help="write the JSON here instead of stdout")

    imported = command("import", _import, "store an exported calibrator as a new version, without refitting")
    imported.add_argument("file", help="a file written by calibd export ('-' reads stdin)")
    imported.add_argument("--name", help="store under this name (default: the name it was exported from)")
    imported.add_argument("--no-promote", action="store_true", help="store the version without making it current")

    command("list", _list, "list the calibrators")

    predictor = command("predictor", _predictor, "show, set or remove the predictor a calibrator forwards to (transformer mode)",
                        "A calibrator's /v2 infer requests without scores go to its predictor, an inference protocol "
                        "server; the one stored with it comes before CALIBD_PREDICTORS and calibd serve --predictor.")
    predictor.add_argument("name", help="the calibrator's name")
    change = predictor.add_mutually_exclusive_group()
    change.add_argument("--set", metavar="URL", help="store this predictor: http(s)://host:port (REST) or grpc://host:port")
    change.add_argument("--delete", action="store_true", help="remove the stored predictor")
    predictor.add_argument("--model", help="with --set: the model's name on the predictor (default: the calibrator's)")
    predictor.add_argument("--output-name", metavar="OUTPUT",
                           help="with --set: the predictor's output to calibrate (default: CALIBD_PREDICTOR_OUTPUT)")



def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="calibd", description="The calibd calibration service.")
    parser.add_argument("--version", action="version", version=f"calibd {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve the HTTP API",
                                description="Serve the HTTP API. Settings come from CALIBD_* environment variables "
                                "(README: Configuration); CALIBD_DATABASE_URL defaults to ./calibd.db (SQLite).")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (another than loopback needs an API key: calibd keys create)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on")
    serve.add_argument("--workers", type=int, default=1, help="serving processes (each with its own fit workers)")
    serve.add_argument("--grpc-port", type=int, metavar="PORT",
                       help="also serve the inference protocol (KServe v2) over gRPC on this port, in the same processes")
    serve.add_argument("--predictor", metavar="URL",
                       help="transformer mode: the inference protocol server whose model outputs calibd calibrates, "
                       "http(s)://host:port (REST) or grpc://host:port (gRPC): the default of calibrators with no "
                       "predictor stored with them (calibd predictor NAME --set URL) nor in CALIBD_PREDICTORS")
    # The arguments KServe gives a transformer container: the predictor's host:port; the model's name
    # (calibd serves each calibrator under its own); the port to listen on.
    serve.add_argument("--predictor_host", help=argparse.SUPPRESS)
    serve.add_argument("--model_name", help=argparse.SUPPRESS)
    serve.add_argument("--http_port", dest="port", type=int, help=argparse.SUPPRESS)
    serve.set_defaults(handler=_serve)

    migrate = commands.add_parser("migrate", help="apply pending database migrations")
    migrate.set_defaults(handler=_migrate)

    keys = commands.add_parser("keys", help="manage API keys").add_subparsers(dest="keys_command", required=True)
    create = keys.add_parser("create", help="create a key and print it (once)")
    create.add_argument("--scope", action="append", required=True, choices=["admin", "calibrate", "feedback", "read"],
                        help="what the key may do; repeat for several scopes")
    create.add_argument("--expires", type=_parse_duration, help="lifetime such as 30d, 12h or 90m (default: never)")
    create.add_argument("--description", default="", help="a note to tell keys apart (default: empty)")
    create.set_defaults(handler=_keys_create)
    keys.add_parser("list", help="list keys (never the keys themselves)").set_defaults(handler=_keys_list)
    revoke = keys.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("key_id", help="the key's id, as calibd keys list shows it")
    revoke.set_defaults(handler=_keys_revoke)

    add_client_commands(commands)
    with_defaults_shown(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
