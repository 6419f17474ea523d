// What the history view picks from its rows (src/runs.js) and how it shows a run's cost (src/format.js).
import assert from "node:assert/strict";
import { test } from "node:test";

import { cost, costDetails } from "../src/format.js";
import { firstCompared } from "../src/runs.js";

const row = (run_id, metrics) => ({ run_id, metrics, attempt: 1 });

test("the comparison starts on the newest runs that reported metrics, not on the newest two", () => {
  const newestFirst = [row("killed", {}), row("failed", {}), row("b", { loss: 0.4 }), row("a", { loss: 0.5 })];
  assert.deepEqual(firstCompared(newestFirst).map((r) => r.run_id), ["b", "a"]);
  // Only one reported: it, and the newest of the others.
  assert.deepEqual(firstCompared(newestFirst.slice(0, 3)).map((r) => r.run_id), ["b", "killed"]);
  assert.deepEqual(firstCompared([row("x", {})]).map((r) => r.run_id), ["x"]);
  assert.deepEqual(firstCompared([]), []);
});

test("a run's cost: the amount where prices were given, else worker-seconds; details on hover", () => {
  const counted = { worker_s: 48.25, cpu_s: 48.25, gpu_s: 0, amount: null, currency: "", attempts: 2,
    failed_attempts: 1, failed_worker_s: 4 };
  assert.equal(cost(counted), "48.25 worker-s");
  assert.equal(cost({ ...counted, amount: 0.0482, currency: "EUR" }), "0.0482 EUR");
  assert.equal(cost(null), "–");
  assert.equal(costDetails(counted), "48.25 worker-s (CPU 48.25 s, GPU 0 s) over 2 attempts; 1 failed attempt: 4 worker-s");
  assert.equal(costDetails({ ...counted, attempts: 1, failed_attempts: 0 }), "48.25 worker-s (CPU 48.25 s, GPU 0 s) over 1 attempt");
});
