// ECharts options of the views, in the colors of Airflow's theme (theme.js): axes with titles,
// gridlines, a tooltip, and zoom (wheel or drag inside the chart, the slider below it, or a box).
import { axisName, date, num } from "./format.js";

function axis(theme, name, extra = {}) {
  return {
    name,
    nameTextStyle: { color: theme.muted },
    axisLine: { lineStyle: { color: theme.border } },
    axisTick: { lineStyle: { color: theme.border } },
    axisLabel: { color: theme.muted, hideOverlap: true },
    splitLine: { show: true, lineStyle: { color: theme.grid } },
    ...extra,
  };
}

function frame(theme, { legend = false } = {}) {
  return {
    animation: false,
    textStyle: { fontFamily: "inherit" },
    grid: { left: 64, right: 28, top: legend ? 56 : 40, bottom: 76 },
    tooltip: {
      trigger: "axis",
      confine: true,
      backgroundColor: theme.panel,
      borderColor: theme.border,
      textStyle: { color: theme.fg, fontSize: 12 },
      axisPointer: { type: "line", lineStyle: { color: theme.muted } },
    },
    legend: legend ? { top: 4, left: 56, right: 96, textStyle: { color: theme.muted }, itemHeight: 10 }
      : { show: false },
    toolbox: {
      right: 8, top: 0, itemSize: 13,
      iconStyle: { borderColor: theme.muted },
      feature: { dataZoom: { yAxisIndex: "none", title: { zoom: "Zoom to a box", back: "Zoom back" } },
        restore: { title: "Reset" } },
    },
    dataZoom: [
      { type: "inside", xAxisIndex: 0, filterMode: "none" },
      {
        type: "slider", xAxisIndex: 0, filterMode: "none", height: 18, bottom: 8,
        borderColor: theme.border, textStyle: { color: theme.muted }, fillerColor: `${theme.series[0]}22`,
        dataBackground: { lineStyle: { color: theme.muted }, areaStyle: { color: theme.grid } },
        handleStyle: { color: theme.panel, borderColor: theme.muted },
      },
    ],
  };
}

function yAxis(theme, name, logY) {
  return axis(theme, name, {
    type: logY ? "log" : "value", scale: true, nameLocation: "end", nameGap: 14,
    nameTextStyle: { color: theme.fg, align: "left", fontWeight: 600 },
    axisLabel: { color: theme.muted, formatter: (value) => num(value) },
  });
}

// The x axis's range and ticks over its values: whole numbers (a report, an epoch) tick on whole
// numbers; a single value (one report) gets a unit of room after it, and before it above zero, where
// ECharts would stretch it over 0 to 1 in steps of 0.2.
export function xRange(values) {
  let low = Infinity;
  let high = -Infinity;
  let whole = true;
  for (const value of values) {
    if (typeof value !== "number" || !Number.isFinite(value)) continue;
    low = Math.min(low, value);
    high = Math.max(high, value);
    whole &&= Number.isInteger(value);
  }
  if (low > high) return { min: "dataMin", max: "dataMax" };
  const range = low === high ? { min: low >= 1 ? low - 1 : low, max: high + 1 } : { min: "dataMin", max: "dataMax" };
  return whole ? { ...range, minInterval: 1 } : range;
}

function xAxis(theme, name, values) {
  return axis(theme, name, { type: "value", nameLocation: "middle", nameGap: 26, ...xRange(values) });
}

// A metric's points as [x, y]: its own rows of the x column (a sparse metric has fewer rows).
export function metricPoints(metric, column) {
  return metric.values.map((y, i) => [column[metric.rows ? metric.rows[i] : i], y]);
}

function tooltip(xName) {
  return (params) => {
    const list = Array.isArray(params) ? params : [params];
    const lines = [`${xName} ${num(list[0]?.value?.[0])}`];
    for (const p of list) lines.push(`${p.marker} ${p.seriesName}: ${num(p.value[1])}`);
    return lines.join("<br/>");
  };
}

// One metric of one training, its checkpoints marked on its own points: filled where Ray keeps the
// checkpoint, hollow where Ray deleted it.
export function metricOption(theme, metric, column, axisKey, { logY = false, color } = {}) {
  const points = metricPoints(metric, column).filter(([x]) => x !== null && x !== undefined);
  const at = (positions) => positions.map((i) => metricPoints(metric, column)[i]).filter(([x]) => x != null);
  const kept = at(metric.kept_at);
  const deleted = at(metric.deleted_at);
  const line = color ?? theme.series[0];
  const option = frame(theme, { legend: kept.length + deleted.length > 0 });
  option.tooltip.formatter = tooltip(axisName(axisKey));
  option.xAxis = xAxis(theme, axisName(axisKey), points.map(([x]) => x));
  option.yAxis = yAxis(theme, metric.name, logY && metric.min > 0);
  option.series = [
    {
      name: metric.name, type: "line", data: points, color: line, lineStyle: { width: 2 },
      showSymbol: points.length <= 60, symbolSize: 5, sampling: "lttb", emphasis: { disabled: true },
    },
  ];
  // The legend names the marks only: the line is the chart's own title.
  option.legend.data = ["checkpoint", "deleted checkpoint"].slice(kept.length ? 0 : 1, deleted.length ? 2 : 1);
  if (kept.length) {
    option.series.push({ name: "checkpoint", type: "scatter", data: kept, color: line, symbolSize: 9,
      itemStyle: { borderColor: theme.panel, borderWidth: 1.5 }, z: 3 });
  }
  if (deleted.length) {
    option.series.push({ name: "deleted checkpoint", type: "scatter", data: deleted, symbolSize: 9,
      color: theme.bg, itemStyle: { borderColor: theme.muted, borderWidth: 2 }, z: 3 });
  }
  return option;
}

// Two runs of a training task, one metric, on one chart.
export function compareOption(theme, metricName, runs, axisKey, { logY = false } = {}) {
  const option = frame(theme, { legend: true });
  option.tooltip.formatter = tooltip(axisName(axisKey));
  const drawn = runs.filter(({ metric }) => metric);
  const points = drawn.map(({ metric, column }) => metricPoints(metric, column));
  option.xAxis = xAxis(theme, axisName(axisKey), points.flat().map(([x]) => x));
  const positive = runs.every(({ metric }) => !metric || metric.min > 0);
  option.yAxis = yAxis(theme, metricName, logY && positive);
  option.series = drawn.map(({ label, metric }, i) => ({
    name: label, type: "line", data: points[i], color: theme.series[i % theme.series.length],
    lineStyle: { width: 2 }, showSymbol: metric.values.length <= 60, symbolSize: 5, sampling: "lttb",
  }));
  return option;
}

// A number over the runs' dates; the runs where the champion moved marked apart.
export function datesOption(theme, name, rows, valueOf, { color, unit = "" } = {}) {
  const points = rows.filter((r) => valueOf(r) !== undefined && valueOf(r) !== null && r.date)
    .map((r) => ({ value: [r.date, valueOf(r)], run: r }));
  const promoted = points.filter((p) => p.run.promoted);
  const option = frame(theme, { legend: promoted.length > 0 });
  option.tooltip.formatter = (params) => {
    const list = Array.isArray(params) ? params : [params];
    const run = list[0]?.data?.run;
    const lines = [`${date(list[0]?.value?.[0])}${run ? ` · ${run.run_id}` : ""}`];
    for (const p of list) lines.push(`${p.marker} ${p.seriesName}: ${num(p.value[1])}${unit}`);
    return lines.join("<br/>");
  };
  // Runs at midnight (a daily schedule, a backfill): a tick per day at most, named by the day.
  const daily = points.every((p) => new Date(p.value[0]).getUTCHours() === 0);
  option.xAxis = axis(theme, "logical date", {
    type: "time", nameLocation: "middle", nameGap: 26,
    ...(daily ? { minInterval: 24 * 3600 * 1000, axisLabel: { color: theme.muted, hideOverlap: true,
      formatter: "{MM}-{dd}" } } : {}),
  });
  option.yAxis = yAxis(theme, unit ? `${name} (${unit.trim()})` : name, false);
  option.series = [{ name, type: "line", data: points, color: color ?? theme.series[0], lineStyle: { width: 2 },
    showSymbol: points.length <= 120, symbolSize: 6 }];
  if (promoted.length) {
    option.series.push({ name: "champion moved", type: "scatter", data: promoted, symbol: "diamond",
      symbolSize: 12, color: theme.success, z: 3 });
  }
  return option;
}
