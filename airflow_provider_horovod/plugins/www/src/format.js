// Numbers and times as the views show them.
export function num(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  if (value === 0) return "0";
  const size = Math.abs(value);
  if (size >= 1e5 || size < 1e-3) return value.toExponential(3);
  return String(Number(value.toPrecision(5)));
}

export function seconds(value) {
  if (value === null || value === undefined) return "–";
  if (value < 60) return `${value.toFixed(1)} s`;
  if (value < 3600) return `${Math.floor(value / 60)} min ${Math.round(value % 60)} s`;
  return `${Math.floor(value / 3600)} h ${Math.round((value % 3600) / 60)} min`;
}

// A run's date in UTC, as Airflow names runs: the day alone when it starts at midnight.
export function date(iso) {
  if (!iso) return "–";
  const text = new Date(iso).toISOString();
  return text.endsWith("T00:00:00.000Z") ? text.slice(0, 10) : `${text.slice(0, 16).replace("T", " ")} UTC`;
}

export const AXIS_NAMES = { report: "report", elapsed_s: "time since the first report (s)" };
export const axisName = (axis) => AXIS_NAMES[axis] ?? axis;

// What a run cost (a history row's ``cost``): the amount where prices were given, else worker-seconds.
export function cost(value) {
  if (!value) return "–";
  if (value.amount !== null && value.amount !== undefined) {
    return `${value.amount.toFixed(4)}${value.currency ? ` ${value.currency}` : ""}`;
  }
  return `${num(value.worker_s)} worker-s`;
}

// The cost's details, for a tooltip: by kind, and the failed attempts' share.
export function costDetails(value) {
  if (!value) return undefined;
  const failed = value.failed_attempts
    ? `; ${value.failed_attempts} failed attempt${value.failed_attempts > 1 ? "s" : ""}: ${num(value.failed_worker_s)} worker-s`
    : "";
  return `${num(value.worker_s)} worker-s (CPU ${num(value.cpu_s)} s, GPU ${num(value.gpu_s)} s) over ` +
    `${value.attempts} attempt${value.attempts > 1 ? "s" : ""}${failed}`;
}
