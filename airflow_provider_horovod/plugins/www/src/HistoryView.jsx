// The "Training history" tab of a DAG: every run of its training tasks by logical date, with the
// final metrics, the evaluation (numbers its other tasks returned), whether the champion moved, the
// duration, the cost and the state; as a table and as charts over the dates; and two runs' curves on one chart.
import { useEffect, useMemo, useRef, useState } from "react";

import { getJson, taskHref, uiHref } from "./api.js";
import { Chart } from "./Chart.jsx";
import { cost, costDetails, date, num, seconds } from "./format.js";
import { compareOption, datesOption } from "./options.js";
import { firstCompared } from "./runs.js";
import { useChartTheme } from "./theme.js";
import { StateBadge, View } from "./ui.jsx";

const RUNS = 200;
const CHARTED = 4; // final metrics and evaluation numbers charted over the dates, the first ones

const rowKey = (r) => `${r.run_id}\u0000${r.task_id}\u0000${r.map_index}`;
const rowLabel = (r) => `${date(r.date)}${r.map_index >= 0 ? ` [${r.map_index}]` : ""}`;

// What a run's curves are when they cannot be read: none.
const NO_CURVES = { metrics: [], axes: ["report"], columns: { report: [] } };

function Compare({ dagId, rows, theme }) {
  const candidates = useMemo(() => rows.filter((r) => r.attempt).slice().reverse(), [rows]); // newest first
  const [picked, setPicked] = useState(() => firstCompared(candidates).map(rowKey));
  const [metricName, setMetricName] = useState(null);
  const [loaded, setLoaded] = useState({});
  const requested = useRef(new Set());
  const chosen = useMemo(
    () => picked.map((key) => candidates.find((r) => rowKey(r) === key)).filter(Boolean),
    [picked, candidates],
  );
  useEffect(() => {
    for (const r of chosen) {
      const key = rowKey(r);
      if (requested.current.has(key)) continue;
      requested.current.add(key);
      getJson("training", { dag_id: dagId, run_id: r.run_id, task_id: r.task_id, map_index: r.map_index })
        .then((answer) => setLoaded((now) => ({ ...now, [key]: answer.curves ?? NO_CURVES })))
        .catch(() => setLoaded((now) => ({ ...now, [key]: NO_CURVES })));
    }
  }, [chosen, dagId]);
  const curves = useMemo(() => chosen.map((r) => loaded[rowKey(r)]), [chosen, loaded]);
  const ready = curves.length > 0 && curves.every(Boolean);
  const names = ready ? [...new Set(curves.flatMap((c) => c.metrics.map((m) => m.name)))] : [];
  const metric = names.includes(metricName) ? metricName : (curves.find((c) => c?.chosen)?.chosen ?? names[0]);
  // The x axis both runs have: their counter (epoch, step) when they share one, else the report.
  const axisKey = ready ? (curves[0].axes.find((a) => curves.every((c) => c.axes.includes(a))) ?? "report") : "report";
  const option = useMemo(() => {
    if (!ready || !metric) return null;
    return compareOption(theme, metric, chosen.map((r, i) => ({
      label: `${rowLabel(r)} · ${r.task_id}`, column: curves[i].columns[axisKey],
      metric: curves[i].metrics.find((m) => m.name === metric),
    })), axisKey);
  }, [ready, metric, axisKey, theme, chosen, curves]);
  if (candidates.length < 2) return null;
  const select = (i) => (
    <select value={picked[i] ?? ""} data-testid={`compare-${i}`}
      onChange={(e) => setPicked((now) => Object.assign([...now], { [i]: e.target.value }))}>
      {candidates.map((r) => <option key={rowKey(r)} value={rowKey(r)}>{rowLabel(r)} · {r.task_id}</option>)}
    </select>
  );
  return (
    <>
      <div className="ahp-section">Two runs' curves</div>
      <div className="ahp-controls">
        {select(0)} <span>against</span> {select(1)}
        {names.length ? (
          <label>metric{" "}
            <select value={metric ?? ""} onChange={(e) => setMetricName(e.target.value)}>
              {names.map((n) => <option key={n} value={n}>{n}</option>)}
            </select>
          </label>
        ) : null}
      </div>
      <div className="ahp-card">
        {option ? <Chart option={option} height={300} className="ahp-chart" data-chart="compare"
          data-series={option.series.length} /> : <p className="ahp-note">{ready ? "These runs reported no metrics."
          : "Loading…"}</p>}
      </div>
    </>
  );
}

function Table({ dagId, data }) {
  const rows = data.rows.slice().reverse(); // newest first
  const metrics = data.metrics;
  const evaluation = data.evaluation;
  const mapped = rows.some((r) => r.map_index >= 0);
  const several = data.training_tasks.length > 1;
  return (
    <table className="ahp-table" data-testid="history-table">
      <thead>
        <tr>
          <th>logical date</th><th>run</th>{several || mapped ? <th>task</th> : null}<th>state</th>
          <th className="num">duration</th><th className="num">cost</th>
          {metrics.map((m) => <th key={`m-${m}`} className="num">{m}</th>)}
          {evaluation.map((m) => <th key={`e-${m}`} className="num">{m}</th>)}
          <th>champion</th>
        </tr>
      </thead>
      <tbody>
        {rows.map((r) => (
          <tr key={rowKey(r)} data-run={r.run_id}>
            <td style={{ whiteSpace: "nowrap" }}>{date(r.date)}</td>
            <td className="ahp-mono">
              <a href={uiHref(`dags/${encodeURIComponent(dagId)}/runs/${encodeURIComponent(r.run_id)}`)}>{r.run_id}</a>
            </td>
            {several || mapped ? (
              <td><a href={taskHref(dagId, r.run_id, r.task_id, r.map_index, "plugin/horovod_training")}>
                {r.task_id}{r.map_index >= 0 ? ` [${r.map_index}]` : ""}</a></td>
            ) : null}
            <td><a href={taskHref(dagId, r.run_id, r.task_id, r.map_index, "plugin/horovod_training")}>
              <StateBadge state={r.state} /></a></td>
            <td className="num">{seconds(r.duration_s)}</td>
            <td className="num" title={costDetails(r.cost)} data-cost={r.cost ? "yes" : "no"}>{cost(r.cost)}</td>
            {metrics.map((m) => <td key={`m-${m}`} className="num">{num(r.metrics[m])}</td>)}
            {evaluation.map((m) => <td key={`e-${m}`} className="num">{num(r.evaluation[m])}</td>)}
            <td>{r.promoted === true ? "moved" : r.promoted === false ? "kept" : "–"}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

export function HistoryView({ dagId }) {
  const theme = useChartTheme();
  // The answer with the DAG it is for: another DAG's shows as loading, not as this one's.
  const [answer, setAnswer] = useState({ dagId: null, data: null, error: "" });
  useEffect(() => {
    let stopped = false;
    getJson("history", { dag_id: dagId, runs: RUNS })
      .then((data) => !stopped && setAnswer({ dagId, data, error: "" }))
      .catch((err) => !stopped && setAnswer({ dagId, data: null, error: String(err.message ?? err) }));
    return () => {
      stopped = true;
    };
  }, [dagId]);
  const data = answer.dagId === dagId ? answer.data : null;
  const error = answer.dagId === dagId ? answer.error : "";
  const charts = useMemo(() => {
    if (!data) return [];
    const out = data.metrics.slice(0, CHARTED)
      .map((m, i) => ({ key: `m-${m}`, title: `final ${m}`,
        option: datesOption(theme, m, data.rows, (r) => r.metrics[m], { color: theme.series[i % 6] }) }));
    out.push(...data.evaluation.slice(0, CHARTED).map((m, i) => ({ key: `e-${m}`, title: `evaluation: ${m}`,
      option: datesOption(theme, m, data.rows, (r) => r.evaluation[m], { color: theme.series[(i + 2) % 6] }) })));
    out.push({ key: "duration", title: "training duration",
      option: datesOption(theme, "duration", data.rows, (r) => r.duration_s, { color: theme.muted, unit: " s" }) });
    return out;
  }, [data, theme]);
  if (!data) {
    return <View data-testid="history-view"><p className="ahp-note">{error
      ? `The training history cannot load: ${error}` : "Loading…"}</p></View>;
  }
  if (!data.rows.length) {
    return (
      <View data-testid="history-view">
        <p className="ahp-note" data-testid="message">No training in the {data.runs} newest runs of this DAG.</p>
      </View>
    );
  }
  return (
    <View data-testid="history-view">
      <div className="ahp-bar">
        <span><b>{data.rows.length}</b> trainings in the <b>{data.runs}</b> newest runs
          {data.runs >= data.limit ? ` (the newest ${data.limit} shown)` : ""}</span>
        {data.score_attribute ? <span>checkpoints ranked by <b>{data.score_attribute}</b></span> : null}
        <span>training {data.training_tasks.length > 1 ? "tasks" : "task"}{" "}
          <b>{data.training_tasks.join(", ")}</b></span>
      </div>
      <div className="ahp-charts">
        {charts.map((c) => (
          <div key={c.key} className="ahp-card">
            <h3>{c.title}</h3>
            <Chart option={c.option} height={240} className="ahp-chart" data-chart={c.key} />
          </div>
        ))}
      </div>
      <Compare dagId={dagId} rows={data.rows} theme={theme} />
      <div className="ahp-section">Runs</div>
      <Table dagId={dagId} data={data} />
    </View>
  );
}
