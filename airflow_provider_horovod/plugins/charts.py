"""The training view as HTML: a line chart (inline SVG) per reported metric, the run's facts, its
checkpoints and a link to its Ray job. Pure: from the task's result dict and its result record."""

from __future__ import annotations

import html
from collections.abc import Sequence

WIDTH, HEIGHT, PAD = 640, 220, 40
LEFT = 80  # room for the y labels, such as "9.74e-13"


def polyline(values: Sequence[float], steps: Sequence[float]) -> str:
    """SVG points of ``values`` against ``steps``, scaled into the chart's box."""
    low, high = min(values), max(values)
    first, last = min(steps), max(steps)
    span_y, span_x = (high - low) or 1.0, (last - first) or 1.0
    return " ".join(f"{LEFT + (x - first) / span_x * (WIDTH - LEFT - PAD):.1f},"
                    f"{HEIGHT - PAD - (y - low) / span_y * (HEIGHT - 2 * PAD):.1f}" for x, y in zip(steps, values))


def chart(name: str, history: list[dict]) -> str:
    points = [(p["report"], p["metrics"][name]) for p in history if name in p.get("metrics", {})]
    if not points:
        return ""
    steps, values = [s for s, _ in points], [v for _, v in points]
    marks = "".join(f'<circle cx="{xy.split(",")[0]}" cy="{xy.split(",")[1]}" r="3"/>'
                    for xy, p in zip(polyline(values, steps).split(), history) if p.get("checkpoint"))
    return (f'<figure><figcaption>{html.escape(name)}: {values[0]:.6g} &rarr; {values[-1]:.6g} '
            f'(min {min(values):.6g}, max {max(values):.6g}, {len(values)} reports)</figcaption>'
            f'<svg class="chart" data-metric="{html.escape(name)}" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
            f'height="{HEIGHT}" role="img" aria-label="{html.escape(name)} per report">'
            f'<rect x="{LEFT}" y="{PAD}" width="{WIDTH - LEFT - PAD}" height="{HEIGHT - 2 * PAD}" class="box"/>'
            f'<polyline points="{polyline(values, steps)}" class="line"/>{marks}'
            f'<text x="{LEFT}" y="{HEIGHT - 10}">report {steps[0]}</text>'
            f'<text x="{WIDTH - PAD}" y="{HEIGHT - 10}" text-anchor="end">report {steps[-1]}</text>'
            f'<text x="{LEFT - 4}" y="{PAD}" text-anchor="end">{max(values):.3g}</text>'
            f'<text x="{LEFT - 4}" y="{HEIGHT - PAD}" text-anchor="end">{min(values):.3g}</text></svg></figure>')


def metric_names(history: list[dict]) -> list[str]:
    """The metrics reported, loss-like ones first."""
    names = {name for p in history for name in p.get("metrics", {})}
    return sorted(names, key=lambda n: (0 if "loss" in n else 1 if "acc" in n else 2, n))


def page(result: dict | None, record: dict | None, *, title: str, problem: str = "") -> str:
    """The whole training view."""
    body = [f"<h1>{html.escape(title)}</h1>"]
    if problem:
        body.append(f'<p class="problem">{html.escape(problem)}</p>')
    if result:
        timings = result.get("timings") or {}
        worker_s = (timings.get("fit_s") or 0) * (result.get("world_size") or 0)
        facts = [("world size", result.get("world_size")), ("attempt", result.get("attempt")),
                 ("trainer", result.get("trainer_api")),
                 ("training time", f"{timings['fit_s']:.1f} s" if timings.get("fit_s") else None),
                 ("cost", f"{worker_s / 3600:.3f} worker-hours" if worker_s else None),
                 ("resumed from", result.get("resumed_from"))]
        body.append("<dl>" + "".join(f"<dt>{k}</dt><dd>{html.escape(str(v))}</dd>" for k, v in facts if v) + "</dl>")
        if result.get("dashboard_url"):
            body.append(f'<p><a class="ray-job" href="{html.escape(result["dashboard_url"])}" target="_blank">Ray job '
                        f'{html.escape(result.get("submission_id") or "")}</a></p>')
    history = (record or {}).get("history") or []
    if history:
        body += [chart(name, history) for name in metric_names(history)]
        saved = [p for p in history if p.get("checkpoint")]
        if saved:
            rows = "".join(f"<tr><td>{p['report']}</td><td>" + ", ".join(
                f"{html.escape(k)}={v:.6g}" for k, v in sorted(p["metrics"].items())) + "</td></tr>" for p in saved)
            body.append(f"<h2>Checkpoints ({len(saved)})</h2><table><tr><th>report</th><th>metrics</th></tr>{rows}"
                        "</table>")
    elif record is not None:
        body.append("<p>This run reported no metrics.</p>")
    if result:
        for label, key in (("latest checkpoint", "checkpoint_uri"), ("best checkpoint", "best_checkpoint_uri"),
                           ("timeline", "timeline_uri")):
            if result.get(key):
                body.append(f"<p>{label}: <code>{html.escape(result[key])}</code></p>")
    style = ("body{font-family:sans-serif;margin:16px;color:#222}.box{fill:none;stroke:#ccc}"
             ".line{fill:none;stroke:#017cee;stroke-width:2}circle{fill:#e43921}text{font-size:11px;fill:#555}"
             "dl{display:grid;grid-template-columns:max-content auto;gap:2px 12px}dt{color:#666}"
             ".problem{color:#a00}table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:2px 6px}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>")
