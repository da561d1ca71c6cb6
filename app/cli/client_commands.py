"""The commands that use a running calibd over HTTP through ``calibd.client``.

fit, calibrate, evaluate, report, export, import, list and predictor: CALIBD_URL (default
http://127.0.0.1:8000) and CALIBD_API_KEY. They print results to stdout, progress to stderr,
and on error one line on stderr with a non-zero exit status: 1 for an error answered by calibd,
2 for a bad command line or input file, 3 when calibd cannot be reached or is unavailable.
"""

from __future__ import annotations

import argparse
import os
import sys

from .output import Progress, format_cell, format_number, print_fit, report_text


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
        from ..client import CalibdError, ConnectionFailed, Unavailable

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
    from ..client import Client

    return Client(args.url, timeout=args.timeout)




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
    progress = Progress(path.name, size)
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
    print_fit(fitted)
    return 0




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
    from ..batch import indexed_columns

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

    from ..batch import calibrate_parquet

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

    from ..batch import output_columns

    calibrated = output_columns(result.probabilities, result.extras)
    names, columns = list(calibrated), list(calibrated.values())
    kept = [(name, values) for name, values in kept if name not in names]
    names = [name for name, _ in kept] + names
    columns = [np.asarray(values, dtype=object) for _, values in kept] + columns
    stream = open(output, "w", newline="", encoding="utf-8") if output else sys.stdout
    try:
        writer = csv.writer(stream, lineterminator="\n")
        writer.writerow(names)
        cells = [[format_cell(v) for v in column.tolist()] for column in columns]
        writer.writerows(zip(*cells))
    finally:
        if output:
            stream.close()




def _evaluate(args: argparse.Namespace) -> int:
    from ..batch import indexed_columns

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
        line = f"{name:<22} {format_number(metric.get('value'))}"
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

    from ..reporting import render_diagram

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
        text = report_text(report)
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
