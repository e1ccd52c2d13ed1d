"""The replay report as one self-contained HTML file, readable at a glance on call.

:func:`write_html_report` takes the replay report dict (spec/recording.md, "Replay
report", plus ``metrics.model`` / ``metrics.rules_baseline`` / ``metrics.comparison`` from
:mod:`models.evaluation`) and writes a page with inline CSS and plots embedded as base64
PNG: the headline side by side, decisions by evidence grade, per-class recall bars, the
lead-time distribution, a timeline of decisions against incidents, and the missed
incidents and false actions.
matplotlib (``pip install gpuops[report]``) is imported only here, through its Agg
canvas, so the rest of gpuops never needs it. Every string from the report is escaped.
"""

from __future__ import annotations

import base64
import io
from datetime import datetime, timezone
from html import escape
from pathlib import Path
from typing import Any, Mapping

from collector.schema import NODE_FAULTS
from models.evaluation import HEADLINE, PREDICTIVE_LEAD_S, count_actions

#: Rows shown in the missed-incident and false-action tables, and nodes on the timeline.
TABLE_ROWS = 50
TIMELINE_NODES = 80

_CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:1.5em auto;max-width:1200px;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0}td,th{padding:3px 10px;border-bottom:1px solid #eee;
text-align:right}th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
.good{color:#137333;font-weight:600}.bad{color:#b3261e;font-weight:600}.muted{color:#777}
img{max-width:100%;display:block;margin:.5em 0}code{background:#f4f4f4;padding:0 3px}"""
_FAULT_COLOURS = dict(zip([f.value for f in NODE_FAULTS] + ["app_error"],
                          ["#d62728", "#9467bd", "#1f77b4", "#8c564b", "#ff7f0e", "#bcbd22",
                           "#17becf", "#7f7f7f", "#e377c2"]))
_ACTION_MARKERS = {"drain": "v", "reset": "D", "requeue": "s", "alert": "o"}
_LABELS = {"recall": "Recall (node faults)", "predictive_recall": "Predictive recall (lead ≥ 60 s)",
           "median_lead_s": "Median lead time", "false_actions_per_1k_node_days":
           "False actions / 1,000 node-days", "alerts_per_1k_node_days": "Alerts / 1,000 node-days",
           "actions_on_app_errors": "Drains/resets on app errors",
           "idle_gpu_h": "GPU-hours idled by actions", "saved_gpu_h": "GPU-hours of work saved",
           "net_gpu_h": "Net GPU-hours (saved − idle)"}


def _figure_api():
    """Import matplotlib's object API lazily, with the Agg canvas (no global pyplot)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError("the HTML report needs matplotlib: pip install gpuops[report]") from e
    return Figure, FigureCanvasAgg


def _png(fig, canvas_cls) -> str:
    canvas_cls(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _img(data: str, alt: str) -> str:
    return f'<img src="data:image/png;base64,{data}" alt="{escape(alt)}">'


def _mpl(s: Any) -> str:
    """Text for matplotlib: ``$`` would start mathtext, so escape it."""
    return str(s).replace("$", r"\$")


def _fmt(key: str, v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return escape(str(v))
    if key.endswith("recall"):
        return f"{v:.1%}" if abs(v) <= 1 else f"{v:.3f}"
    if key.endswith("_s"):
        return f"{v / 60:.1f} min" if abs(v) >= 60 else f"{v:.0f} s"
    return f"{v:,}" if isinstance(v, int) else f"{v:,.1f}"


def _utc(ts: Any) -> str:
    try:
        return datetime.fromtimestamp(float(ts), timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError, OverflowError, OSError):
        return "—"


def _table(header: list[str], rows: list[list[str]]) -> str:
    """A table from already-escaped cells."""
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _at_a_glance(report: Mapping[str, Any], model: Mapping) -> str:
    """One line on what was replayed: the fleet's size and span, its incidents, the decisions."""
    summary = report.get("summary") or {}
    bits = [f"{_fmt('n', model.get('node_days'))} node-days" if model.get("node_days") is not None else None,
            f"{_fmt('n', summary.get('gpu_samples'))} GPU samples" if summary.get("gpu_samples") is not None else None,
            f"{model['node_fault_incidents']} node-fault incidents" if model.get("node_fault_incidents") is not None
            else None,
            f"{model['app_error_incidents']} application errors" if model.get("app_error_incidents") else None,
            f"{len(report.get('decisions') or [])} model decisions",
            f"scored every {_fmt('cadence_s', summary.get('cadence_s'))}" if summary.get("cadence_s") else None]
    held = summary.get("held_at_end")
    if held:
        bits.append(f"held at the end: {', '.join(str(h) for h in held)}")
    return f'<p class="muted">{escape("; ".join(b for b in bits if b))}.</p>'


#: the replay's own statistics (``summary``): their labels, in this order; keys not named here follow
_RUN_ROWS: dict[str, str] = {
    "gpu_samples": "GPU samples", "port_samples": "port samples", "xid_events": "XID events",
    "rejected_rows": "rows rejected (contract)", "late_rows": "rows too late for their tick",
    "not_replayed_before_first_gpu_sample": "left out: before the first GPU sample",
    "ticks": "ticks scored", "cadence_s": "scoring cadence", "maintenance_windows": "maintenance windows",
    "muted_node_ticks": "node-ticks muted (maintenance, silence)",
    "baseline_restarts": "parts whose baseline restarted (repair, reboot, swap)",
    "unplanned_resets": "parts reset outside a repair (baseline kept)", "gpu_swaps": "GPUs swapped",
    "held_at_end": "nodes held at the end", "suppressed_by_cause": "decisions held back, by cause",
    "baseline_suppressed_by_cause": "rules baseline: held back, by cause",
    "wall_s": "wall time", "cpu_s": "CPU time", "stage_cpu_s": "CPU time by stage",
    "gpu_samples_per_s": "GPU samples per wall second", "state_bytes": "window state in memory",
}


def _run_value(key: str, v: Any) -> str:
    seconds = key in ("wall_s", "cpu_s", "stage_cpu_s")
    if isinstance(v, Mapping):
        if not v:
            return "none"
        return ", ".join(f"{escape(str(k))} {f'{x:.1f} s' if seconds else _fmt('n', x)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return escape(", ".join(str(x) for x in v)) if v else "none"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return _fmt(key, v)
    if seconds:
        return f"{v:,.1f} s"
    if key == "state_bytes":
        return f"{v / 2**20:,.1f} MiB"
    if key.endswith("_per_s"):   # a rate, not a duration
        return f"{v:,.0f}"
    return _fmt(key, v)


def _run_table(summary: Mapping[str, Any]) -> str:
    """The replay's own statistics, labelled for people, the known ones first."""
    keys = [k for k in _RUN_ROWS if k in summary] + [k for k in summary if k not in _RUN_ROWS]
    rows = [[escape(_RUN_ROWS.get(k, k)), _run_value(k, summary[k])] for k in keys if summary[k] is not None]
    return _table(["", ""], rows) if rows else '<p class="muted">No statistics.</p>'


def _headline(model: Mapping, base: Mapping) -> str:
    rows = []
    for key, better in HEADLINE.items():
        m, b = model.get(key), base.get(key)
        cls = ""
        if isinstance(m, (int, float)) and isinstance(b, (int, float)) and m != b:
            cls = "good" if (m > b) == (better == "higher") else "bad"
        rows.append([escape(_LABELS[key]), f'<span class="{cls}">{_fmt(key, m)}</span>', _fmt(key, b)])
    return _table(["metric", "model", "rules baseline"], rows)


def _alternatives(report: Mapping[str, Any], model: Mapping) -> str:
    """``--compare-policy``: each alternative policy beside the replay's own, on the same scores."""
    alts = report.get("alternatives") or {}
    keys = ("recall", "predictive_recall", "median_lead_s", "false_actions_per_1k_node_days", "alerts_per_1k_node_days")
    rows = [["--policy (this report)"] + [_fmt(k, model.get(k)) for k in keys] + ["", ""]] if model else []
    for name, alt in alts.items():
        m, vs = alt.get("metrics") or {}, alt.get("against_policy") or {}
        if not m:
            rows.append([escape(name)] + ["–"] * len(keys) + [f"{len(alt.get('decisions') or [])} decisions", ""])
            continue
        gained, lost = vs.get("ahead_only_by_alternative", []), vs.get("ahead_only_by_policy", [])
        rows.append([escape(name)] + [_fmt(k, m.get(k)) for k in keys]
                    + [escape(", ".join(gained)) or "none", escape(", ".join(lost)) or "none"])
    return _table(["policy"] + [_LABELS[k] for k in keys] + ["caught ahead only by it", "only by --policy"], rows)


#: evidence grades, strongest first, and the actions shown per grade
_GRADES = ("certain", "corroborated", "predicted", "advisory", "unknown")
_GRADE_ACTIONS = ("drain", "reset", "requeue", "alert", "resume")


def _grade_table(decisions: list[Mapping], baseline: list[Mapping]) -> str:
    """Decisions per evidence grade and action, and per follow-up: model / rules baseline."""
    m, b = count_actions(decisions), count_actions(baseline)
    mg, bg = m["actions_by_grade"], b["actions_by_grade"]
    rows = []
    for g in _GRADES:
        if g not in mg and g not in bg:
            continue
        cell = lambda a: f"{mg.get(g, {}).get(a, 0)} / {bg.get(g, {}).get(a, 0)}"  # noqa: E731
        rows.append([escape(g)] + [cell(a) for a in _GRADE_ACTIONS])
    for f in sorted(set(m["actions_by_follow_up"]) | set(b["actions_by_follow_up"])):
        n = f"{m['actions_by_follow_up'].get(f, 0)} / {b['actions_by_follow_up'].get(f, 0)}"
        rows.append([f"then {escape(f)}", n, "", "", "", ""])
    return _table(["grade (model / rules)"] + list(_GRADE_ACTIONS), rows)


def _class_table(model: Mapping, base: Mapping) -> str:
    rows = []
    for cls, m in model.get("per_class", {}).items():
        b = base.get("per_class", {}).get(cls, {})
        pair = lambda k: f"{_fmt(k, m.get(k))} / {_fmt(k, b.get(k))}"  # noqa: E731
        rows.append([escape(cls), _fmt("n", m.get("incidents")), _fmt("n", m.get("predictable")),
                     pair("caught"), pair("caught_predictively"), pair("median_lead_s"), pair("false_actions")])
    return _table(["fault", "incidents", "predictable", "caught (model / rules)",
                   "caught ≥ 60 s", "median lead", "false actions"], rows)


def _class_bars(api, model: Mapping, base: Mapping) -> str:
    Figure, canvas = api
    classes = list(model.get("per_class", {}) or base.get("per_class", {}))
    fig = Figure(figsize=(11, 3.6))
    for ax, key in zip(fig.subplots(1, 2), ("recall", "predictive_recall")):
        for k, (name, metrics, colour) in enumerate((("model", model, "#1f77b4"),
                                                     ("rules baseline", base, "#aaaaaa"))):
            vals = [metrics.get("per_class", {}).get(c, {}).get(key) for c in classes]
            ax.bar([i + (k - 0.5) * 0.4 for i in range(len(classes))],
                   [0 if v is None else v for v in vals], width=0.4, label=name, color=colour)
        counts = [(model.get("per_class", {}).get(c) or base.get("per_class", {}).get(c) or {}).get("incidents")
                  for c in classes]
        ax.set_xticks(range(len(classes)), [_mpl(f"{c} ({n})") for c, n in zip(classes, counts)],
                      rotation=30, ha="right")
        ax.set_ylim(0, 1.2)
        ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
        ax.set_title(_LABELS[key])
        ax.legend(fontsize=8, loc="upper center", ncol=2)
    return _img(_png(fig, canvas), "per-class recall and predictive recall, model vs rules baseline")


def _leads(metrics: Mapping) -> list[float]:
    return [r["lead_s"] / 60 for r in metrics.get("per_incident", []) if r.get("caught")]


def _lead_hist(api, model: Mapping, base: Mapping) -> str:
    Figure, canvas = api
    m, b = _leads(model), _leads(base)
    fig = Figure(figsize=(11, 3.2))
    ax = fig.subplots()
    if m or b:
        lo, hi = min(m + b), max(m + b)
        bins = [lo + (hi - lo + 1e-9) * i / 40 for i in range(41)]
        ax.hist(m, bins=bins, histtype="stepfilled", alpha=0.5, label=f"model ({len(m)})")
        ax.hist(b, bins=bins, histtype="step", linewidth=2, color="#555", label=f"rules baseline ({len(b)})")
    ax.axvline(PREDICTIVE_LEAD_S / 60, color="#b3261e", linestyle="--", label="1 min: predictive")
    ax.set_xlabel("lead time before failure (minutes; negative = after)")
    ax.set_ylabel("caught incidents")
    ax.legend(fontsize=8)
    return _img(_png(fig, canvas), "lead-time distribution, model vs rules baseline")


def _timeline(api, incidents: list[Mapping], decisions: list[Mapping], baseline: list[Mapping]) -> str:
    Figure, canvas = api
    acting = [d for d in decisions + baseline if str(d.get("action")) in _ACTION_MARKERS]
    rank: dict[str, int] = {}               # nodes with incidents first, then drained/reset ones
    for d in acting:
        node = str(d.get("node"))
        rank[node] = min(rank.get(node, 2), 1 if d["action"] in ("drain", "reset") else 2)
    rank.update({str(i.get("node")): 0 for i in incidents})
    keep = sorted(rank, key=lambda n: (rank[n], n))[:TIMELINE_NODES]
    note = (f"Showing {TIMELINE_NODES} of {len(rank)} nodes, those with incidents first."
            if len(rank) > TIMELINE_NODES else "")
    nodes = sorted(keep)
    if not nodes:
        return '<p class="muted">No incidents and no actions to draw.</p>'
    row = {n: i for i, n in enumerate(nodes)}
    times = [float(i["failure_ts"]) for i in incidents] + [float(d["ts"]) for d in acting]
    t0 = min(times)
    fig = Figure(figsize=(11, min(2 + 0.28 * len(nodes), 30)))
    ax = fig.subplots()
    seen: set[str] = set()
    for inc in incidents:
        if str(inc.get("node")) not in row:
            continue
        y, fault = row[str(inc["node"])], str(inc.get("fault"))
        start = float(inc["onset_ts"] if inc.get("onset_ts") is not None else inc["failure_ts"])
        colour = _FAULT_COLOURS.get(fault, "#000")
        ax.barh(y, (float(inc["failure_ts"]) - start) / 3600, left=(start - t0) / 3600, height=0.7,
                color=colour, alpha=0.5, label=None if fault in seen else _mpl(fault))
        ax.plot([(float(inc["failure_ts"]) - t0) / 3600], [y], "x", color=colour, markersize=10, mew=2)
        seen.add(fault)
    for ds, name, colour, dy in ((decisions, "model", "#111", 0.0), (baseline, "rules", "#999", 0.3)):
        for action, marker in _ACTION_MARKERS.items():
            pts = [d for d in ds if str(d.get("action")) == action and str(d.get("node")) in row]
            if pts:
                quiet = action in ("alert", "requeue")          # hollow: changes nothing on the node
                ax.scatter([(float(d["ts"]) - t0) / 3600 for d in pts], [row[str(d["node"])] + dy for d in pts],
                           marker=marker, s=16 if quiet else 30, label=f"{name} {action}", zorder=3,
                           facecolors="none" if quiet else colour, edgecolors=colour)
    ax.set_yticks(range(len(nodes)), [_mpl(n) for n in nodes], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"telemetry time (hours since {_utc(t0)} UTC); bar = onset→failure, × = failure")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return (f'<p class="muted">{escape(note)}</p>' if note else "") + _img(
        _png(fig, canvas), "timeline of decisions against incidents")


def _missed(model: Mapping, base: Mapping) -> str:
    base_caught = {r["id"] for r in base.get("per_incident", []) if r.get("caught")}
    missed = [r for r in model.get("per_incident", [])
              if not r.get("caught") and r.get("fault") != "app_error"]
    rows = [[escape(str(r.get("id"))), escape(str(r.get("node"))), _fmt("n", r.get("gpu")),
             escape(str(r.get("fault"))), "yes" if r.get("predictable") else "no", _utc(r.get("onset_ts")),
             _utc(r.get("failure_ts")), "yes" if r.get("id") in base_caught else "no"]
            for r in missed[:TABLE_ROWS]]
    head = f"<p>{len(missed)} node-fault incidents missed by the model.</p>"
    return head + (_table(["incident", "node", "gpu", "fault", "predictable", "onset (UTC)",
                           "failure (UTC)", "rules caught it"], rows) if rows else "")


def _false(model: Mapping, decisions: list[Mapping]) -> str:
    idx = model.get("false_decisions", [])
    rows = []
    for i in idx[:TABLE_ROWS]:
        d = decisions[i] if 0 <= i < len(decisions) else {}
        score = d.get("score")
        rows.append([_utc(d.get("ts")), escape(str(d.get("node"))), _fmt("n", d.get("gpu")),
                     escape(str(d.get("action"))), escape(str(d.get("fault"))),
                     f"{score:.2f}" if isinstance(score, (int, float)) else "—", escape(str(d.get("reason", "")))])
    head = f"<p>{len(idx)} drains/resets caught no incident.</p>"
    return head + (_table(["time (UTC)", "node", "gpu", "action", "fault", "score", "reason"], rows)
                   if rows else "")


def _budget(fb: Mapping[str, Any]) -> str:
    """The false-action budget at the end of the replay: prediction holds per class by how they ended."""
    rows = [[escape(f), str(c.get("unconfirmed", 0)), str(c.get("confirmed", 0)),
             escape(str((fb.get("braked") or {}).get(f, ""))) or "no"]
            for f, c in sorted((fb.get("outcomes") or {}).items())]
    head = (f'<p class="muted">{fb.get("per_1k_node_days", 0):g} per 1,000 node-days per class; '
            f'{fb.get("node_days", 0):.0f} node-days replayed. A hold ended healthy when gpuops resumed the node '
            "with no failure within the prediction's horizon, or a person said so (docs/engine.md).</p>")
    if not rows:
        return head + "<p>No hold taken on a prediction ended.</p>"
    return head + _table(["fault class", "holds ended healthy", "holds that came true", "braked at the end"], rows)


def _coverage(cov: Mapping[str, Any]) -> str:
    """The precursor signals nodes did not send (models/coverage.py), and the incidents on such nodes."""
    rows = [[escape(name), str(len(s["nodes"])), escape(", ".join(s["nodes"][:TABLE_ROWS])),
             escape(", ".join(s["faults"])), escape(s["enable"])]
            for name, s in (cov.get("signals") or {}).items() if s.get("nodes")]
    if not rows:
        return f"<p>Every one of the {cov.get('nodes_scored', 0)} nodes scored sent every precursor signal.</p>"
    inc = cov.get("incidents_on_blind_nodes") or []
    head = (f'<p class="muted">A node that does not send a signal gives gpuops nothing to predict its classes from: '
            f"its faults there are seen only when they happen. {len(inc)} incident(s) fell on such a node"
            + (": " + escape(", ".join(f"{i['id']} ({i['fault']} on {i['node']})" for i in inc[:TABLE_ROWS])) if inc
               else "") + ".</p>")
    return head + _table(["signal", "nodes", "which", "warns of", "turn on"], rows)


def write_html_report(report: Mapping[str, Any], path: str | Path) -> Path:
    """Write *report* (a replay report dict) as one self-contained HTML file at *path*.

    Works without ``metrics`` (a recording without incidents): then only the summary
    and the timeline of decisions are shown. Raises ``ImportError`` naming
    ``pip install gpuops[report]`` when matplotlib is missing. Returns the path written.
    """
    api = _figure_api()
    metrics = report.get("metrics") or {}
    model, base = metrics.get("model") or {}, metrics.get("rules_baseline") or {}
    comparison = metrics.get("comparison") or {}
    decisions = list(report.get("decisions") or [])
    baseline = list(report.get("baseline_decisions") or [])
    incidents = list(report.get("incidents") or model.get("per_incident") or [])
    parts = [f"<h1>gpuops replay: {escape(str(report.get('recording', '')))}</h1>", _at_a_glance(report, model)]
    if model:
        parts += ["<h2>Model vs rules baseline</h2>", _headline(model, base),
                  f'<p class="muted">Lead p10 / p90 (model): {_fmt("p10_lead_s", model.get("p10_lead_s"))}'
                  f' / {_fmt("p90_lead_s", model.get("p90_lead_s"))}. Caught only by the model: '
                  f'{len(comparison.get("caught_only_by_model", []))}; only by the rules: '
                  f'{len(comparison.get("caught_only_by_baseline", []))}. Scored by spec/recording.md.</p>',
                  "<h2>Per fault class</h2>", _class_bars(api, model, base), _class_table(model, base),
                  "<h2>Lead time</h2>", _lead_hist(api, model, base)]
    else:
        parts.append('<p class="muted">No ground truth (incidents.jsonl): metrics unavailable.</p>')
    if report.get("alternatives"):
        parts += ["<h2>Policies compared</h2>", _alternatives(report, model),
                  '<p class="muted">Each alternative (<code>--compare-policy</code>) decided on the same scores as '
                  'this report\'s policy, by the policy alone (no engine).</p>']
    if (report.get("false_budget") or {}).get("per_1k_node_days"):
        parts += ["<h2>False-action budget</h2>", _budget(report["false_budget"])]
    parts += ["<h2>Decisions by evidence</h2>", _grade_table(decisions, baseline),
              '<p class="muted">Certain: a rule on hard evidence; corroborated: a prediction backed by a '
              'sustained rise or a second signal; predicted: a prediction alone (drain only); advisory: '
              'alerts and resumes.</p>']
    parts += ["<h2>Timeline</h2>", _timeline(api, incidents, decisions, baseline)]
    if model:
        parts += ["<h2>Missed incidents</h2>", _missed(model, base),
                  "<h2>False actions (model)</h2>", _false(model, decisions)]
    if report.get("coverage"):
        parts += ["<h2>Signals not sent</h2>", _coverage(report["coverage"])]
    parts += ["<h2>The replay run</h2>", _run_table(report.get("summary") or {})]
    title = escape(f"gpuops replay — {report.get('recording', '')}")
    page = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            f"<style>{_CSS}</style></head><body>{''.join(parts)}</body></html>")
    out = Path(path)
    out.write_text(page, encoding="utf-8")
    return out
