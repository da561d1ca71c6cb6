"""The report page: one self-contained HTML document per calibrator version.

Everything is inline (the diagrams are SVG, there are no scripts and no
external assets), so the page can be saved, mailed or attached to a ticket.
"""

from __future__ import annotations

import html
import io
from datetime import datetime, timedelta
from typing import Any

from matplotlib.dates import DateFormatter
from matplotlib.figure import Figure

from .diagram import print_svg, diagram_figure

STYLE = """
body { font-family: system-ui, -apple-system, Segoe UI, sans-serif; margin: 2rem auto; max-width: 1100px;
       color: #222; padding: 0 1rem; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; } h2 { font-size: 1.2rem; margin-top: 2rem; }
.meta { color: #555; } table { border-collapse: collapse; margin: .5rem 0; font-size: .9rem; }
th, td { border-bottom: 1px solid #ddd; padding: .3rem .7rem; text-align: right; }
th:first-child, td:first-child { text-align: left; } th { background: #f4f4f4; }
.alarm { display: inline-block; padding: .2rem .6rem; border-radius: .3rem; font-weight: 600; }
.alarm.on { background: #c0392b; color: white; } .alarm.off { background: #27ae60; color: white; }
.grid { display: flex; flex-wrap: wrap; gap: 2rem; align-items: flex-start; }
figure { margin: 0; } svg { max-width: 100%; height: auto; }
tr.current td { font-weight: 600; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _number(value: Any, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return _e(value)


def _when(value: Any) -> str:
    """A timestamp to the minute (they arrive as datetimes or ISO strings)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return _e(f"{value:%Y-%m-%d %H:%M} UTC") if isinstance(value, datetime) else _e(value)


def _svg(figure: Figure) -> str:
    buffer = io.StringIO()
    print_svg(figure, buffer)
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _history_svg(history: list[dict[str, Any]]) -> str:
    figure = Figure(figsize=(6.4, 3.6), layout="constrained")
    axis = figure.subplots()
    hours = [point["hour"] for point in history]
    for key, color in (("ece", "#1f77b4"), ("brier", "#ff7f0e")):
        axis.plot(hours, [point[key] for point in history], marker="o", markersize=3, label=key, color=color)
    axis.set_ylabel("metric value")
    axis.set_xlabel("hour (UTC)")
    axis.set_title("feedback, per hour")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
    if len(hours) == 1:  # one point: show the hours around it, not the whole date range
        axis.set_xlim(hours[0] - timedelta(hours=1), hours[0] + timedelta(hours=1))
    axis.xaxis.set_major_formatter(DateFormatter("%m-%d %H:%M"))
    figure.autofmt_xdate()
    return _svg(figure)


def _metrics_table(holdout: dict[str, Any]) -> str:
    names = list(holdout["after"]["metrics"])
    rows = []
    for name in names:
        cells = []
        for part in ("before", "after"):
            metric = holdout[part]["metrics"].get(name, {})
            value = _number(metric.get("value"))
            if metric.get("ci"):
                value += f" <small>[{_number(metric['ci'][0])}, {_number(metric['ci'][1])}]</small>"
            cells.append(f"<td>{value}</td>")
        rows.append(f"<tr><td>{_e(name)}</td>{''.join(cells)}</tr>")
    return (
        '<table id="holdout-metrics"><thead><tr><th>metric</th><th>raw scores</th>'
        "<th>calibrated (cross-fitted)</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )


def _windows_table(windows: dict[str, dict[str, Any]]) -> str:
    keys = ("samples", "ece", "brier", "log_loss", "mean_prediction", "positive_rate", "acceptance_rate")
    head = "".join(f"<th>{_e(k)}</th>" for k in keys)
    rows = "".join(
        f"<tr><td>{_e(window)}</td>" + "".join(f"<td>{_number(values.get(k))}</td>" for k in keys) + "</tr>"
        for window, values in windows.items()
    )
    return f'<table id="feedback-windows"><thead><tr><th>window</th>{head}</tr></thead><tbody>{rows}</tbody></table>'


def _segments_table(segments: list[dict[str, Any]]) -> str:
    """Segments, the strongest evidence of miscalibration first (as the monitor lists them: ECE over its noise,
    ``calibd.monitoring.evidence``), with the minimum detectable error beside each and their drift alarms."""
    if not segments:
        return '<p id="segments">No segment feedback (declare dimensions: PUT /calibrators/{name}/segments).</p>'
    rows = []
    for segment in segments:
        window = segment["windows"].get("last_10000", {})
        evidence = segment.get("evidence", {})
        drift = segment["drift"]
        alarm = (
            f'<span class="alarm on">alarm since batch {_e(drift.get("alarm_batch"))}</span>' if drift["alarm"]
            else '<span class="alarm off">no alarm</span>'
        )
        rows.append(
            f"<tr><td>{_e(segment['dimension'])}</td><td>{_e(segment['segment'])}</td>"
            f"<td>{_number(window.get('ece'))}</td><td>{_number(evidence.get('sigma'), 2)}</td>"
            f"<td>{_number(evidence.get('mde'))}</td><td>{_e(window.get('samples', 0))}</td>"
            f"<td>{_number(window.get('log_loss'))}</td><td>{alarm}</td>"
            f"<td>{_number(drift.get('log_evalue'), 2)} / {_number(drift.get('threshold'), 2)}</td></tr>"
        )
    return (
        '<table id="segments"><thead><tr><th>dimension</th><th>segment</th><th>ECE (last 10,000)</th><th>sigma (ECE / its noise)</th>'
        "<th>minimum detectable error</th><th>labels</th>"
        "<th>log-loss</th><th>drift</th><th>log e-value / alarm at</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _versions_table(versions: list[dict[str, Any]]) -> str:
    rows = []
    for v in versions:
        after = v.get("after") or {}
        css = ' class="current"' if v["current"] else ""
        rows.append(
            f"<tr{css}><td>{v['version']}{' (current)' if v['current'] else ''}</td><td>{_e(v['method'])}</td>"
            f"<td>{_when(v['created_at'])}</td><td>{v['n_samples']}</td><td>{_number(after.get('ece'))}</td>"
            f"<td>{_number(after.get('brier'))}</td><td>{_number(after.get('log_loss'))}</td></tr>"
        )
    return (
        '<table id="versions"><thead><tr><th>version</th><th>method</th><th>created</th><th>holdout rows</th>'
        "<th>ECE after</th><th>Brier after</th><th>log-loss after</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )


def _events_table(events: list[dict[str, Any]]) -> str:
    if not events:
        return "<p>No recalibration events.</p>"
    rows = "".join(
        f"<tr><td>{_when(e.get('created_at'))}</td><td>{_e(e.get('outcome'))}</td><td>{_e(e.get('candidate_version'))}</td>"
        f"<td>{_e(e.get('reason'))}</td></tr>"
        for e in events
    )
    return (
        '<table id="recalibration-events"><thead><tr><th>when</th><th>outcome</th><th>candidate</th><th>why</th></tr></thead>'
        f"<tbody>{rows}</tbody></table>"
    )


def _policy(policy: dict[str, Any] | None) -> str:
    if not policy:
        return "<p>No closed-loop recalibration policy.</p>"
    state = "enabled" if policy.get("enabled", True) else "disabled"
    return (
        f"<p>Policy {state}: trigger {_e(policy.get('trigger'))}, refit on {_e(policy.get('refit_rows'))} rows, "
        f"shadow window {_e(policy.get('shadow_rows'))} rows, margin {_e(policy.get('margin'))}.</p>"
    )


def _candidates_table(fit: dict[str, Any]) -> str:
    """auto's candidates, best first, with their cross-validated log-loss; the chosen one marked."""
    scores = fit.get("cv_log_loss")
    if not isinstance(scores, dict) or not scores:
        return ""
    chosen = fit.get("chosen")
    marked = ' class="current"'
    rows = "".join(
        f"<tr{marked if method == chosen else ''}><td>{_e(method)}</td><td>{_number(score, 5)}</td>"
        f"<td>{'chosen' if method == chosen else ''}</td></tr>"
        for method, score in sorted(scores.items(), key=lambda item: (item[1] is None, item[1]))
    )
    rows += "".join(
        f"<tr><td>{_e(method)}</td><td>–</td><td>skipped: {_e(reason)}</td></tr>"
        for method, reason in (fit.get("skipped") or {}).items()
    )
    return (
        f"<h3>auto's candidates</h3><p>{_e(fit.get('reason', ''))}</p>"
        '<table id="auto-candidates"><thead><tr><th>candidate</th><th>cross-validated log-loss</th><th></th></tr></thead>'
        f"<tbody>{rows}</tbody></table>"
    )


def render_page(report: dict[str, Any]) -> str:
    """The HTML report of one version, from the report's JSON form."""
    name, version = report["calibrator"], report["version"]
    holdout = report["holdout"]
    ece = {part: holdout[part]["metrics"]["ece"]["value"] for part in ("before", "after")}
    diagram = _svg(diagram_figure({p: holdout[p]["reliability"] for p in ("before", "after")}, f"{name} v{version}", ece))
    drift = report["feedback"]["drift"]
    alarm = (
        f'<span id="drift-alarm" class="alarm on">drift alarm since batch {_e(drift.get("alarm_batch"))}</span>'
        if drift["alarm"]
        else '<span id="drift-alarm" class="alarm off">no drift alarm</span>'
    )
    history = report["feedback"]["history"]
    history_part = _history_svg(history) if history else "<p>No labelled feedback yet.</p>"
    fit = report.get("fit") or {}
    fit_rows = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in fit.items() if not isinstance(v, (dict, list)))
    chosen_fit = fit.get("chosen_fit")
    if isinstance(chosen_fit, dict):  # auto: the chosen method's own fit
        fit_rows += "".join(
            f"<tr><td>{_e(fit.get('chosen'))}: {_e(k)}</td><td>{_e(v)}</td></tr>"
            for k, v in chosen_fit.items() if not isinstance(v, (dict, list))
        )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>calibd report: {_e(name)} v{version}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{STYLE}</style></head>
<body>
<h1 id="title">{_e(name)} <small>version {version}</small></h1>
<p class="meta">method <b id="method">{_e(report['method'])}</b> · input {_e(report['input'])} ·
{report['n_classes']} classes · {report['n_samples']} holdout rows · fitted {_when(report['created_at'])} ·
current version {_e(report['current_version'])}</p>
<p>{alarm} <small>log e-value {_number(drift.get('log_evalue'), 2)} (alarm at {_number(drift.get('threshold'), 2)}),
{drift.get('samples', 0)} labels tested</small></p>
<h2>Holdout: reliability and metrics</h2>
<div class="grid"><figure id="reliability-diagram">{diagram}</figure>
<div>{_metrics_table(holdout)}
<h3>Fit</h3><table id="fit"><tbody>{fit_rows}</tbody></table>
{_candidates_table(fit)}</div></div>
<h2>Feedback</h2>
{_windows_table(report['feedback']['windows'])}
<div id="feedback-history">{history_part}</div>
<h3>Segments, the strongest evidence of miscalibration first</h3>
{_segments_table(report['feedback'].get('segments', []))}
<h2>Versions</h2>
{_versions_table(report['versions'])}
<h2>Recalibration</h2>
<section id="recalibration">{_policy(report.get('recalibration_policy'))}{_events_table(report.get('recalibration', []))}</section>
<p class="meta">Calibration error measures agreement between predicted probabilities and outcome
frequencies; it does not measure how close each probability is to the truth.</p>
</body></html>"""
