// Small pieces both views share, styled with Airflow's theme tokens (theme.js), so they look like the
// pages around them in light and dark mode, with no heading of their own above Airflow's.
import { css, stateColors } from "./theme.js";

export const STYLE = `
.ahp-view { color: ${css.fg}; font-family: ${css.font}; font-size: 0.875rem; height: 100%; overflow: auto;
  padding: 12px 16px 24px; box-sizing: border-box; }
.ahp-view a { color: ${css.info}; text-decoration: none; }
.ahp-view a:hover { text-decoration: underline; }
.ahp-bar { display: flex; flex-wrap: wrap; align-items: center; gap: 6px 16px; margin-bottom: 12px; color: ${css.muted}; }
.ahp-bar b { color: ${css.fg}; font-weight: 600; }
.ahp-note { color: ${css.muted}; margin: 8px 0 16px; }
.ahp-problem { color: ${css.warning}; border: 1px solid ${css.border}; border-radius: ${css.radius}; padding: 8px 12px; margin: 8px 0 16px; }
.ahp-facts { display: flex; flex-wrap: wrap; gap: 4px 24px; margin: 0 0 12px; }
.ahp-facts div { display: flex; gap: 6px; }
.ahp-facts dt { color: ${css.muted}; }
.ahp-facts dd { margin: 0; }
.ahp-controls { display: flex; flex-wrap: wrap; align-items: center; gap: 8px 16px; margin: 4px 0 8px; color: ${css.muted}; }
.ahp-controls select { background: ${css.panel}; color: ${css.fg}; border: 1px solid ${css.border}; border-radius: ${css.radius}; padding: 2px 6px; font: inherit; width: auto; }
.ahp-charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(420px, 1fr)); gap: 12px; }
.ahp-card { border: 1px solid ${css.border}; border-radius: ${css.radius}; padding: 8px 8px 0; min-width: 0; }
.ahp-card h3 { font-size: 0.8125rem; font-weight: 600; margin: 0 0 0 8px; display: flex; gap: 12px; align-items: baseline; }
.ahp-card h3 span { font-weight: 400; color: ${css.muted}; }
.ahp-wide { grid-column: 1 / -1; }
.ahp-section { font-size: 0.9375rem; font-weight: 600; margin: 20px 0 8px; }
.ahp-table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
.ahp-table th { text-align: left; font-weight: 600; color: ${css.muted}; border-bottom: 1px solid ${css.border}; padding: 6px 10px; white-space: nowrap; }
.ahp-table td { border-bottom: 1px solid ${css.borderMuted}; padding: 6px 10px; vertical-align: top; }
.ahp-table tr:hover td { background: ${css.subtleBg}; }
.ahp-table td.num, .ahp-table th.num { text-align: right; }
.ahp-mono { font-family: ${css.mono}; font-size: 0.8125rem; word-break: break-all; }
.ahp-badge { display: inline-block; border-radius: 999px; padding: 0 8px; font-size: 0.75rem; line-height: 1.25rem;
  white-space: nowrap; }
.ahp-tag { display: inline-block; border: 1px solid ${css.border}; border-radius: 999px; padding: 0 6px; font-size: 0.75rem; color: ${css.muted}; margin-left: 6px; }
.ahp-deleted { color: ${css.muted}; }
`;

export function View({ children, ...attributes }) {
  return (
    <div className="ahp-view" {...attributes}>
      <style>{STYLE}</style>
      {children}
    </div>
  );
}

export function StateBadge({ state }) {
  return (
    <span className="ahp-badge" data-state={state ?? "none"} style={stateColors(state)}>
      {(state ?? "no status").replaceAll("_", " ")}
    </span>
  );
}

// A link only to http(s): the values come from XComs, which task code writes.
export function Facts({ items }) {
  if (!items?.length) return null;
  return (
    <dl className="ahp-facts">
      {items.map((item) => (
        <div key={item.label}>
          <dt>{item.label}</dt>
          <dd className={item.label === "Ray job" || item.label === "resumed from" ? "ahp-mono" : undefined}>
            {/^https?:\/\//.test(item.href ?? "") ? (
              <a className="ray-job" href={item.href} rel="noopener noreferrer" target="_blank">{item.value}</a>
            ) : item.value}
          </dd>
        </div>
      ))}
    </dl>
  );
}
