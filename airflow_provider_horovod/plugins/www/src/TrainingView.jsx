// The "Training" tab of a task instance: the curves of what rank 0 reported, live while the training
// runs (refreshed every few seconds from the file the runtime rewrites after each report), the
// checkpoints Ray still keeps, and the run's facts. Tasks that do not train get one neutral line.
import { useEffect, useMemo, useState } from "react";

import { getJson } from "./api.js";
import { Chart } from "./Chart.jsx";
import { axisName, num } from "./format.js";
import { metricOption } from "./options.js";
import { useChartTheme } from "./theme.js";
import { Facts, View } from "./ui.jsx";

// Fetches the training view's data; again every ``refresh_s`` while the task instance may still report.
export function useTraining(dagId, runId, taskId, mapIndex) {
  // The answers with the task instance they are for: another one's show as loading, not as this one's.
  const key = [dagId, runId, taskId, mapIndex ?? -1].join("\u0000");
  const [state, setState] = useState({ key: null, data: null, error: "", updated: null });
  useEffect(() => {
    let timer;
    let stopped = false;
    let loaded = false;
    async function load() {
      if (document.hidden && loaded) {
        // Nobody looks: check again later rather than fetch what no one sees.
        timer = setTimeout(load, 5_000);
        return;
      }
      try {
        const answer = await getJson("training", { dag_id: dagId, run_id: runId, task_id: taskId,
          map_index: mapIndex ?? -1 });
        if (stopped) return;
        loaded = true;
        setState({ key, data: answer, error: "", updated: new Date() });
        if (answer.live) timer = setTimeout(load, answer.refresh_s * 1000);
      } catch (err) {
        if (stopped) return;
        const error = String(err.message ?? err);
        setState((now) => (now.key === key ? { ...now, error } : { key, data: null, error, updated: null }));
        timer = setTimeout(load, 10_000);
      }
    }
    load();
    return () => {
      stopped = true;
      clearTimeout(timer);
    };
  }, [key, dagId, runId, taskId, mapIndex]);
  return state.key === key ? state : { data: null, error: "", updated: null };
}

function Header({ data, updated }) {
  return (
    <div className="ahp-bar" data-testid="training-header">
      {data.attempt ? <span>attempt <b>{data.attempt}</b></span> : null}
      {data.map_index !== null && data.map_index !== undefined
        ? <span data-testid="map-index">map index <b>{data.map_index}</b></span> : null}
      {data.curves ? <span><b>{data.curves.reports}</b> {data.curves.reports === 1 ? "report" : "reports"}</span> : null}
      {data.live ? (
        <span data-testid="live">live: refreshed every {data.refresh_s} s{updated
          ? `, last at ${updated.toLocaleTimeString()}` : ""}</span>
      ) : null}
    </div>
  );
}

function Charts({ curves, theme }) {
  const [axis, setAxis] = useState(null);
  const [logY, setLogY] = useState(false);
  const axisKey = curves.axes.includes(axis) ? axis : curves.axes[0];
  const column = curves.columns[axisKey];
  const options = useMemo(
    () => curves.metrics.map((metric) => metricOption(theme, metric, column, axisKey, { logY })),
    [curves, theme, column, axisKey, logY],
  );
  if (!curves.metrics.length) return null;
  return (
    <>
      <div className="ahp-controls">
        <label>
          x axis{" "}
          <select value={axisKey} onChange={(e) => setAxis(e.target.value)} data-testid="x-axis">
            {curves.axes.map((key) => <option key={key} value={key}>{axisName(key)}</option>)}
          </select>
        </label>
        <label><input type="checkbox" checked={logY} onChange={(e) => setLogY(e.target.checked)} /> log scale</label>
        <span>zoom: the wheel, the slider, or a box (top right); reset there too</span>
      </div>
      <div className="ahp-charts">
        {curves.metrics.map((metric, i) => (
          <div key={metric.name} className={`ahp-card${metric.chosen ? " ahp-wide" : ""}`}>
            <h3>
              {metric.name}
              {metric.chosen ? <span>{curves.score_attribute === metric.name
                ? "chosen: it ranks the checkpoints" : "chosen: a loss"}</span> : null}
              <span>last {num(metric.last)} · min {num(metric.min)} · max {num(metric.max)}
                {metric.rows ? ` · on ${metric.values.length} of ${curves.reports} reports` : ""}</span>
            </h3>
            <Chart option={options[i]} height={metric.chosen ? 320 : 260} className="ahp-chart"
              data-metric={metric.name} data-points={metric.values.length}
              data-kept={metric.kept_at.length} data-deleted={metric.deleted_at.length} />
          </div>
        ))}
      </div>
    </>
  );
}

function Checkpoints({ curves }) {
  const all = curves.checkpoints;
  if (!all.length) return null;
  const kept = all.filter((c) => c.exists !== false);
  const deleted = all.filter((c) => c.exists === false);
  const chosen = curves.chosen;
  return (
    <>
      <div className="ahp-section">Checkpoints ({kept.length})</div>
      <table className="ahp-table" data-testid="checkpoints">
        <thead>
          <tr><th>checkpoint</th><th className="num">report</th>
            {chosen ? <th className="num">{chosen}</th> : null}</tr>
        </thead>
        <tbody>
          {kept.map((c) => (
            <tr key={`${c.row}`} data-checkpoint={c.name ?? ""}>
              <td className="ahp-mono" title={c.uri ?? undefined}>{c.name ?? "(name not recorded)"}
                {c.best ? <span className="ahp-tag">best</span> : null}
                {c.latest ? <span className="ahp-tag">latest</span> : null}</td>
              <td className="num">{c.report}</td>
              {chosen ? <td className="num">{num(c.metrics[chosen])}</td> : null}
            </tr>
          ))}
        </tbody>
      </table>
      {deleted.length ? (
        <p className="ahp-note ahp-deleted" data-testid="deleted-checkpoints" data-count={deleted.length}>
          Deleted by Ray (it keeps <code>checkpoint_num_to_keep</code> of them), hollow on the charts:{" "}
          <span className="ahp-mono">{deleted.map((c) => c.name).join(", ")}</span>
        </p>
      ) : null}
    </>
  );
}

// Why attempts of this task run failed, as their records keep it after the cluster is gone.
function Failures({ failures }) {
  if (!failures?.length) return null;
  return (
    <>
      <div className="ahp-section">Failed attempts ({failures.length})</div>
      {failures.map((f) => (
        <div key={f.attempt} className="ahp-problem" data-testid="failure" data-attempt={f.attempt}
          data-class={f.class}>
          <div>attempt <b>{f.attempt}</b>: <b>{f.class}</b>{f.rank !== null && f.rank !== undefined
            ? `, rank ${f.rank}` : ""}: {f.summary}</div>
          {f.traceback ? <pre className="ahp-mono" style={{ whiteSpace: "pre-wrap", margin: "6px 0" }}>
            {f.traceback}</pre> : null}
          {f.hint ? <div>What to do: {f.hint}</div> : null}
        </div>
      ))}
    </>
  );
}

export function TrainingView({ dagId, runId, taskId, mapIndex }) {
  const theme = useChartTheme();
  const { data, error, updated } = useTraining(dagId, runId, taskId, mapIndex);
  if (!data) {
    return <View data-testid="training-view"><p className="ahp-note">{error ? `The training view cannot load: ${error}`
      : "Loading…"}</p></View>;
  }
  return (
    <View data-testid="training-view" data-trains={data.trains ? "yes" : "no"} data-live={data.live ? "yes" : "no"}>
      {data.trains ? <Header data={data} updated={updated} /> : null}
      {error ? <p className="ahp-problem">The last refresh failed: {error}</p> : null}
      {data.problem ? <p className="ahp-problem" data-testid="problem">{data.problem}</p> : null}
      {data.message ? <p className={data.killed ? "ahp-problem" : "ahp-note"} data-testid="message"
        data-killed={data.killed ? "yes" : "no"}>{data.message}</p> : null}
      <Facts items={data.facts} />
      <Failures failures={data.failures} />
      {data.curves ? <Charts curves={data.curves} theme={theme} /> : null}
      {data.curves ? <Checkpoints curves={data.curves} /> : null}
      {data.uris?.length ? (
        <dl className="ahp-facts" style={{ marginTop: 16, flexDirection: "column" }}>
          {data.uris.map((u) => <div key={u.label}><dt>{u.label}</dt><dd className="ahp-mono">{u.value}</dd></div>)}
        </dl>
      ) : null}
    </View>
  );
}
