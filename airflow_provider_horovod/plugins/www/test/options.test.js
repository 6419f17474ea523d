// The charts' options as the views build them (src/options.js), checked with node's own test runner
// (scripts/check_ui.sh): axes, series, checkpoint marks and the comparison of two runs.
import assert from "node:assert/strict";
import { test } from "node:test";

import { compareOption, datesOption, metricOption, metricPoints, xRange } from "../src/options.js";

const THEME = {
  fg: "#111", muted: "#555", border: "#ddd", grid: "#eee", panel: "#fff", bg: "#fff", warning: "#c40",
  success: "#090", failed: "#d00", series: ["#12e", "#e51", "#0a8", "#a0e", "#e0a", "#888"],
};

// A metric as the Training view's JSON gives it (plugins/curves.py).
function metric(name, values, extra = {}) {
  return { name, values, rows: null, kept_at: [], deleted_at: [], chosen: false, last: values.at(-1),
    min: Math.min(...values), max: Math.max(...values), ...extra };
}

test("one report: the x axis gives it room on whole numbers, not 0 to 1 in steps of 0.2", () => {
  assert.deepEqual(xRange([1]), { min: 0, max: 2, minInterval: 1 });
  assert.deepEqual(xRange([0]), { min: 0, max: 1, minInterval: 1 }); // epoch 0: nothing below zero
  assert.deepEqual(xRange([7]), { min: 6, max: 8, minInterval: 1 });
  assert.deepEqual(xRange([0.5]), { min: 0.5, max: 1.5 }); // seconds: no whole-number ticks
  const axis = metricOption(THEME, metric("loss", [0.5]), [1], "report").xAxis;
  assert.equal(axis.min, 0);
  assert.equal(axis.max, 2);
  assert.equal(axis.minInterval, 1);
  assert.equal(axis.name, "report");
});

test("few reports: counters tick on whole numbers over their own range; times as they are", () => {
  assert.deepEqual(xRange([0, 1, 2]), { min: "dataMin", max: "dataMax", minInterval: 1 });
  assert.deepEqual(xRange([0, 1.5, 3.25]), { min: "dataMin", max: "dataMax" });
  assert.deepEqual(xRange([null, undefined, NaN]), { min: "dataMin", max: "dataMax" }); // nothing to place
  const axis = metricOption(THEME, metric("loss", [1, 0.5]), [0.0, 1.532], "elapsed_s").xAxis;
  assert.equal(axis.minInterval, undefined);
  assert.equal(axis.name, "time since the first report (s)");
});

test("a sparse metric is drawn on its own reports, its checkpoints kept and deleted apart", () => {
  const column = [0, 1, 2, 3, 4, 5];
  const val = metric("val_loss", [0.6, 0.3], { rows: [2, 5], kept_at: [1], deleted_at: [0] });
  assert.deepEqual(metricPoints(val, column), [[2, 0.6], [5, 0.3]]);
  const option = metricOption(THEME, val, column, "epoch", { logY: true });
  const [line, kept, deleted] = option.series;
  assert.deepEqual(line.data, [[2, 0.6], [5, 0.3]]);
  assert.deepEqual([kept.name, kept.data], ["checkpoint", [[5, 0.3]]]);
  assert.deepEqual([deleted.name, deleted.data], ["deleted checkpoint", [[2, 0.6]]]);
  assert.deepEqual(option.legend.data, ["checkpoint", "deleted checkpoint"]);
  assert.equal(option.yAxis.type, "log"); // all values above zero
  assert.equal(metricOption(THEME, metric("delta", [-1, 1]), [0, 1], "report", { logY: true }).yAxis.type, "value");
});

test("two runs on one chart: one series each, a run without the metric left out, one x range", () => {
  const runs = [
    { label: "2026-11-01 · train", column: [0, 1, 2], metric: metric("loss", [1, 0.5, 0.25]) },
    { label: "2026-11-02 · train", column: [0], metric: undefined },
    { label: "2026-11-03 · train", column: [0, 1, 2, 3], metric: metric("loss", [2, 1, 0.5, 0.2]) },
  ];
  const option = compareOption(THEME, "loss", runs, "epoch");
  assert.deepEqual(option.series.map((s) => s.name), ["2026-11-01 · train", "2026-11-03 · train"]);
  assert.deepEqual(option.series.map((s) => s.color), [THEME.series[0], THEME.series[1]]);
  assert.deepEqual(option.series[1].data.at(-1), [3, 0.2]);
  assert.deepEqual([option.xAxis.min, option.xAxis.max, option.xAxis.minInterval], ["dataMin", "dataMax", 1]);
  // One report each, at the same epoch: room around it, whole-number ticks.
  const single = compareOption(THEME, "loss", runs.map((r) => ({ ...r, column: [3], metric: metric("loss", [1]) })),
    "epoch");
  assert.deepEqual([single.xAxis.min, single.xAxis.max], [2, 4]);
});

test("a number over the runs' dates: runs without it left out, the champion's moves marked", () => {
  const rows = [
    { run_id: "a", date: "2026-11-01T00:00:00+00:00", metrics: { loss: 0.5 }, promoted: true },
    { run_id: "b", date: "2026-11-02T00:00:00+00:00", metrics: {}, promoted: false },
    { run_id: "c", date: "2026-11-03T00:00:00+00:00", metrics: { loss: 0.4 }, promoted: false },
  ];
  const option = datesOption(THEME, "loss", rows, (r) => r.metrics.loss);
  assert.deepEqual(option.series[0].data.map((p) => p.value), [["2026-11-01T00:00:00+00:00", 0.5],
    ["2026-11-03T00:00:00+00:00", 0.4]]);
  assert.equal(option.series[1].name, "champion moved");
  assert.deepEqual(option.series[1].data.map((p) => p.run.run_id), ["a"]);
  assert.equal(option.xAxis.minInterval, 24 * 3600 * 1000); // daily runs: a tick per day at most
});
