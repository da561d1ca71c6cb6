"""How the client commands show things: progress on stderr, fits, tables, reports."""

from __future__ import annotations

import sys


class Progress:
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
            self._draw(f"uploading {self.label} {progress_bar(fraction)} {fraction:4.0%} of {file_size(self.total)}")

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
            done = f" {progress_bar(fraction)} {fraction:4.0%}" if fraction is not None else ""
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
                    f"uploaded {self.label} ({file_size(self.total)}) in {uploaded - self.started:.1f} s, "
                    f"fitted in {now - uploaded:.1f} s\n"
                )
            self.stream.flush()

    def _draw(self, text: str) -> None:
        self.stream.write("\r\x1b[K" + text)
        self.stream.flush()


def progress_bar(fraction: float, width: int = 24) -> str:
    filled = int(round(max(0.0, min(fraction, 1.0)) * width))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def file_size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def format_number(value: object, width: int = 9) -> str:
    if value is None:
        return "-".rjust(width)
    if isinstance(value, float):
        return f"{value:{width}.4f}"
    return str(value).rjust(width)




def print_fit(fitted) -> None:
    chosen = f" (chose {fitted.chosen})" if fitted.chosen else ""
    state = "current" if fitted.current else "not current: promote it to serve it"
    print(f"{fitted.name} version {fitted.version} ({state}): {fitted.method}{chosen}, {fitted.n_samples} holdout rows")
    metrics = [m for m in ("ece", "brier", "log_loss") if m in fitted.before or m in fitted.after]
    print(f"{'metric':<10} {'before':>9} {'after':>9}")
    for metric in metrics:
        print(f"{metric:<10} {format_number(fitted.before.get(metric))} {format_number(fitted.after.get(metric))}")
    print("(after: cross-fitted, each row scored by a calibrator fitted without it)")




def format_cell(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)




def report_text(report: dict) -> str:
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
        lines.append(f"{label:<24} " + " ".join(format_number(v) for v in values))
    feedback = report.get("feedback") or {}
    windows = feedback.get("windows") or {}
    if windows:
        lines.append("")
        lines.append(f"{'feedback window':<24} {'samples':>9} {'ece':>9} {'brier':>9} {'log_loss':>9}")
        for window, metrics in windows.items():
            samples = metrics.get("samples")
            values = [metrics.get(m) for m in ("ece", "brier", "log_loss")]
            lines.append(f"{window:<24} {int(samples or 0):>9} " + " ".join(format_number(v) for v in values))
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
            lines.append(f"{mark}{v['version']:<7} {v['method']:<16} {v['n_samples']:>9} {format_number(ece)}  {str(v['created_at'])[:19]}")
    return "\n".join(lines)
