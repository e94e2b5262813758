"""The report as one self-contained HTML page: inline SVG, CSS and a few lines of JS.

Nothing is fetched when the page is viewed (no CDN, no font, no image file), so the file can
be attached to a ticket and opened anywhere. Every chart is SVG drawn here from the
`RunReport`; hovering a segment or marker shows its `<title>`. The page's elements carry
classes and `data-` attributes (`lane`, `fault`, `action`) that the browser test looks for.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from html import escape

from runtime.report.read import Lane, RunReport
from runtime.report.timeline import Fault, followed_by, thin

COLORS = {
    "training": "#2e9e44",
    "healing": "#e0a526",
    "pending": "#8aa4c8",
    "down": "#d63c3c",
    "done": "#bbbbbb",
}
SERIES = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf")
WIDTH, LEFT, RIGHT = 1000, 170, 20
LANE_H = 34

_CSS = """
body { font: 14px system-ui, sans-serif; margin: 24px; color: #222; max-width: 1100px; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
.muted { color: #666; } .legend span { margin-right: 14px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; text-align: left; }
tr:nth-child(even) { background: #f4f4f4; }
pre { background: #f7f7f7; padding: 10px; overflow-x: auto; }
svg text { font: 11px system-ui, sans-serif; fill: #333; }
"""

_JS = """
document.querySelectorAll('[data-epoch]').forEach(function (el) {
  var t = new Date(parseFloat(el.getAttribute('data-epoch')) * 1000);
  el.textContent = t.toLocaleString();
});
"""


def _clock(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _x(t: float, start: float, end: float) -> float:
    span = max(end - start, 1e-9)
    return LEFT + (t - start) / span * (WIDTH - LEFT - RIGHT)


def _ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    """About `n` round tick values between `lo` and `hi`."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def lane_label(lane: Lane) -> str:
    jobs = ", ".join(lane.jobs) or "-"
    return f"replica {lane.replica}: jobs {jobs}; nodes {', '.join(lane.nodes) or '-'}"


def timeline_svg(report: RunReport) -> str:
    """One lane per replica over wall time: state segments, faults, recovery actions."""
    s, e = report.start, report.end
    height = 30 + LANE_H * len(report.lanes) + 24
    out = [f'<svg id="timeline" width="{WIDTH}" height="{height}" role="img">']
    for i, lane in enumerate(report.lanes):
        y = 20 + i * LANE_H
        out.append(
            f'<g class="lane" id="lane-{lane.replica}" data-replica="{lane.replica}">'
            f"<title>{escape(lane_label(lane))}</title>"
            f'<text x="4" y="{y + 14}">replica {lane.replica}</text>'
            f'<text x="4" y="{y + 27}" class="muted">{escape(_short_jobs(lane))}</text>'
            f'<rect x="{LEFT}" y="{y}" width="{WIDTH - LEFT - RIGHT}" height="22" fill="#f3f3f3"/>'
        )
        for seg in lane.segments:
            x0, x1 = _x(seg.start, s, e), _x(seg.end, s, e)
            tip = f"{seg.state}: {seg.seconds:.1f} s from +{seg.start - s:.1f} s"
            out.append(
                f'<rect class="segment {seg.state}" x="{x0:.1f}" y="{y}" '
                f'width="{max(x1 - x0, 0.5):.1f}" height="22" fill="{COLORS[seg.state]}">'
                f"<title>{escape(tip)}</title></rect>"
            )
        for a in lane.actions:
            x = _x(a.t, s, e)
            out.append(
                f'<g class="action {escape(a.kind)}" data-replica="{lane.replica}">'
                f"<title>{escape(f'{a.text} ({a.status})')}</title>"
                f'<rect x="{x - 4:.1f}" y="{y + 7}" width="8" height="8" fill="#6a3d9a" '
                f'transform="rotate(45 {x:.1f} {y + 11})"/></g>'
            )
        for f in lane.faults:
            x = _x(f.t, s, e)
            out.append(
                f'<g class="fault" data-replica="{lane.replica}">'
                f"<title>{escape(_fault_text(f, s))}</title>"
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y - 3}" y2="{y + 25}" '
                'stroke="#000" stroke-width="2"/>'
                f'<path d="M{x - 6:.1f},{y - 8} L{x + 6:.1f},{y - 8} L{x:.1f},{y} Z" '
                'fill="#d63c3c" stroke="#000"/></g>'
            )
        out.append("</g>")
    axis_y = 20 + LANE_H * len(report.lanes) + 4
    out.extend(_time_axis(s, e, axis_y))
    out.append("</svg>")
    return "".join(out)


def _short_jobs(lane: Lane) -> str:
    """The lane's second line: its jobs and nodes, cut to fit (the full text is its title)."""
    text = ", ".join(lane.nodes)
    if lane.jobs:
        text = f"job {', '.join(lane.jobs)}" + (f" on {text}" if text else "")
    return text if len(text) <= 28 else text[:27] + "…"


def _fault_text(f: Fault, start: float) -> str:
    at = f"step {f.step}" if f.step is not None else "step unknown"
    return f"replica {f.replica} fault at +{f.t - start:.1f} s ({at}): {f.cause}"


def _time_axis(s: float, e: float, y: float) -> list[str]:
    out = [f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y}" y2="{y}" stroke="#999"/>']
    for tick in _ticks(0.0, e - s):
        x = _x(s + tick, s, e)
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y}" y2="{y + 4}" stroke="#999"/>'
            f'<text x="{x:.1f}" y="{y + 16}" text-anchor="middle">{tick:g} s</text>'
        )
    return out


def line_chart(
    series: Mapping[str, Sequence[tuple[float, float]]],
    x_label: str,
    y_label: str,
    chart_id: str,
    marks: Sequence[tuple[float, str]] = (),
    x_range: tuple[float, float] | None = None,
) -> str:
    """Lines of (x, y) points, with vertical dashed marks at (x, title), over `x_range` (by
    default the points' and marks' own)."""
    points = [p for pts in series.values() for p in pts]
    if not points:
        return '<p class="muted">nothing to draw</p>'
    xs = [p[0] for p in points] + [m[0] for m in marks] + list(x_range or ())
    ys = [p[1] for p in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if y1 <= y0:
        y0, y1 = y0 - 1, y1 + 1
    if x1 <= x0:
        x1 = x0 + 1
    h, top, bottom = 256, 26, 30

    def px(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * (WIDTH - LEFT - RIGHT)

    def py(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * (h - top - bottom)

    out = [f'<svg id="{chart_id}" width="{WIDTH}" height="{h}" role="img">']
    for tick in _ticks(y0, y1, 5):
        out.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py(tick):.1f}" y2="{py(tick):.1f}" '
            f'stroke="#eee"/><text x="{LEFT - 6}" y="{py(tick) + 4:.1f}" '
            f'text-anchor="end">{tick:.4g}</text>'
        )
    for tick in _ticks(x0, x1):
        out.append(
            f'<text x="{px(tick):.1f}" y="{h - bottom + 16}" text-anchor="middle">{tick:g}</text>'
        )
    out.append(
        f'<text x="{WIDTH - RIGHT}" y="{h - 2}" text-anchor="end">{escape(x_label)}</text>'
        f'<text x="4" y="14">{escape(y_label)}</text>'
    )
    for x, title in marks:
        out.append(
            f'<g class="fault-mark"><title>{escape(title)}</title>'
            f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{top}" y2="{h - bottom}" '
            'stroke="#d63c3c" stroke-dasharray="4 3" stroke-width="1.5"/></g>'
        )
    for i, (name, pts) in enumerate(series.items()):
        color = SERIES[i % len(SERIES)]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        out.append(
            f'<polyline class="series" fill="none" stroke="{color}" stroke-width="1.5" '
            f'points="{path}"><title>{escape(name)}</title></polyline>'
        )
        out.append(
            f'<text x="{LEFT + 110 * i}" y="14" fill="{color}" '
            f'style="fill:{color}">{escape(name)}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def _legend() -> str:
    items = "".join(
        f'<span><i style="background:{c}"></i>{name}</span>'
        for name, c in COLORS.items()
        if name != "done"  # a lane simply ends when its replica is done
    )
    return (
        f'<p class="legend">{items}<span>▼ fault</span>'
        '<span style="color:#6a3d9a">◆ drain / requeue / relaunch</span></p>'
    )


def _faults_table(report: RunReport) -> str:
    if not report.faults:
        return "<p>No faults.</p>"
    rows = []
    for f in report.faults:
        acts = followed_by(f, report.faults, [a for lane in report.lanes for a in lane.actions])
        then = "; ".join(f"{a.text} ({a.status})" for a in acts) or "-"
        step = "-" if f.step is None else str(f.step)
        rows.append(
            f'<tr class="fault-row" data-replica="{f.replica}"><td>+{f.t - report.start:.1f} s'
            f"</td><td>{f.replica}</td><td>{step}</td><td>{escape(f.cause)}</td>"
            f"<td>{escape(then)}</td></tr>"
        )
    return (
        '<table id="faults"><tr><th>when</th><th>replica</th><th>step</th><th>cause</th>'
        f"<th>then</th></tr>{''.join(rows)}</table>"
    )


def _effective(report: RunReport) -> str:
    eff = report.effective
    rows = "".join(
        f"<tr><td>{k}</td><td>{eff.training_s[k]:.1f}</td><td>{eff.healing_s[k]:.1f}</td>"
        f"<td>{eff.pending_s[k]:.1f}</td><td>{eff.down_s[k]:.1f}</td></tr>"
        for k in eff.training_s
    )
    return (
        f'<p id="effective">Effective training time: <b>{eff.fraction:.1%}</b> of '
        f"{eff.replicas} replicas x {eff.span_s:.1f} s wall time "
        f"({sum(eff.training_s.values()):.1f} replica-seconds training).</p>"
        "<table><tr><th>replica</th><th>training s</th><th>healing s</th><th>pending s</th>"
        f"<th>down s</th></tr>{rows}</table>"
    )


def _metrics(report: RunReport) -> str:
    notes = "".join(f'<p class="muted">{escape(n)}</p>' for n in report.notes)
    return _metric_charts(report) + notes


def _metric_charts(report: RunReport) -> str:
    if not report.metrics:
        return (
            '<p id="no-metrics">No metrics were recorded in this run (a trainer on the native '
            "API calls <code>ft.record(loss=...)</code>; a torchft trainer adds "
            '<code>"metrics": {"loss": ...}</code> to the lines of its progress file).</p>'
        )
    marks = [
        (float(f.step), _fault_text(f, report.start)) for f in report.faults if f.step is not None
    ]
    parts = []
    for name, by_replica in report.metrics.items():
        series = {
            f"replica {k}": [(float(s), v) for s, v in thin(pts)] for k, pts in by_replica.items()
        }
        parts.append(f"<h3>{escape(name)}</h3>")
        parts.append(line_chart(series, "step", name, f"metric-{escape(name)}", marks))
    return "".join(parts)


def render_html(report: RunReport, status_text: str) -> str:
    """The whole page; `status_text` is the status table as `fthsdp status` prints it."""
    state = (
        "finished"
        if report.finished
        else f'live, as of <span data-epoch="{report.made_at}">{_clock(report.made_at)}</span>'
    )
    rate = (
        '<p class="muted">fewer than two committed steps: no rate yet</p>'
        if not report.step_rate
        else line_chart(
            {"steps/s": [(t - report.start, r) for t, r in report.step_rate]},
            "seconds since start",
            "committed steps per second",
            "step-rate",
            [(f.t - report.start, _fault_text(f, report.start)) for f in report.faults],
            (0.0, report.end - report.start),
        )
    )
    body = [
        f"<h1>fthsdp run {escape(report.name)}</h1>",
        f'<p class="muted">{escape(report.run_dir)} · {report.kind} run · {state} · from '
        f'<span data-epoch="{report.start}">{_clock(report.start)}</span>, '
        f"{report.end - report.start:.1f} s shown</p>",
        "<h2>Replicas over time</h2>",
        _legend(),
        timeline_svg(report),
        "<h2>Faults</h2>",
        _faults_table(report),
        "<h2>Effective training time</h2>",
        _effective(report),
        "<h2>Step rate</h2>",
        rate,
        "<h2>Recorded metrics</h2>",
        _metrics(report),
        "<h2>Status</h2>",
        f'<pre id="status">{escape(status_text)}</pre>',
    ]
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>fthsdp report: {escape(report.name)}</title><style>{_CSS}</style></head>"
        f"<body>{''.join(body)}<script>{_JS}</script></body></html>\n"
    )
