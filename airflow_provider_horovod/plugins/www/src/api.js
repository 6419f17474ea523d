// The plugin's JSON, fetched from Airflow's own api-server (the session cookie authenticates), relative
// to the UI's base URL so a deployment under a sub-path works.
export async function getJson(path, params) {
  const url = new URL(`horovod/api/${path}`, document.baseURI);
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null) url.searchParams.set(key, String(value));
  }
  const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (!response.ok) {
    let detail = "";
    try {
      detail = (await response.json()).detail ?? "";
    } catch {
      // not JSON: the status says enough
    }
    throw new Error(`${response.status} ${response.statusText}${detail ? `: ${detail}` : ""}`);
  }
  return response.json();
}

// Links into Airflow's UI, relative to its base URL.
export function uiHref(path) {
  return new URL(path, document.baseURI).href;
}

export function taskHref(dagId, runId, taskId, mapIndex, tab = "") {
  const e = encodeURIComponent;
  const mapped = mapIndex !== null && mapIndex !== undefined && mapIndex >= 0 ? `/mapped/${mapIndex}` : "";
  return uiHref(`dags/${e(dagId)}/runs/${e(runId)}/tasks/${e(taskId)}${mapped}${tab ? `/${tab}` : ""}`);
}
