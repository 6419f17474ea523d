import { useEffect, useState } from "react";

// Airflow's UI is built on Chakra UI, whose theme tokens are CSS variables on the page, switched by
// its color mode (the "dark" class on <html>). The views' HTML uses them as they are; the charts draw
// on a canvas, so they take the values, read again whenever the mode changes. The second value of
// each is only for a page without them (an Airflow whose theme names them otherwise).
const v = (name, fallback) => `var(--chakra-${name}, ${fallback})`;

export const css = {
  fg: v("colors-fg", "#18181b"),
  muted: v("colors-fg-muted", "#52525b"),
  subtle: v("colors-fg-subtle", "#a1a1aa"),
  bg: v("colors-bg", "#ffffff"),
  panel: v("colors-bg-panel", "#ffffff"),
  subtleBg: v("colors-bg-subtle", "#fafafa"),
  mutedBg: v("colors-bg-muted", "#f4f4f5"),
  border: v("colors-border", "#e4e4e7"),
  borderMuted: v("colors-border-muted", "#f4f4f5"),
  info: v("colors-fg-info", "#2563eb"),
  warning: v("colors-fg-warning", "#c2410c"),
  error: v("colors-fg-error", "#dc2626"),
  success: v("colors-fg-success", "#16a34a"),
  font: v("fonts-body", "system-ui, sans-serif"),
  mono: v("fonts-mono", "ui-monospace, monospace"),
  radius: v("radii-md", "6px"),
};

// Airflow's own colors of task states (its theme's semantic tokens), for state badges.
export function stateColors(state) {
  const name = state ?? "none";
  return { background: v(`colors-${name}-solid`, "#71717a"), color: v(`colors-${name}-contrast`, "#ffffff") };
}

const CHART = {
  fg: ["--chakra-colors-fg", "#18181b"],
  muted: ["--chakra-colors-fg-muted", "#52525b"],
  border: ["--chakra-colors-border", "#e4e4e7"],
  grid: ["--chakra-colors-border-muted", "#f4f4f5"],
  panel: ["--chakra-colors-bg-panel", "#ffffff"],
  bg: ["--chakra-colors-bg", "#ffffff"],
  warning: ["--chakra-colors-fg-warning", "#c2410c"],
  success: ["--chakra-colors-success-solid", "#16a34a"],
  failed: ["--chakra-colors-failed-solid", "#dc2626"],
};
// Line colors: Chakra's palette (Airflow's theme keeps it), whose solid tones read on light and dark.
const SERIES = [
  ["--chakra-colors-blue-solid", "#2563eb"],
  ["--chakra-colors-orange-solid", "#ea580c"],
  ["--chakra-colors-teal-solid", "#0d9488"],
  ["--chakra-colors-purple-solid", "#9333ea"],
  ["--chakra-colors-pink-solid", "#db2777"],
  ["--chakra-colors-cyan-solid", "#0891b2"],
];

// The theme's colors are oklch(); ECharts blends and fades colors it can parse (hex, rgb) only, so
// each goes through a canvas, which takes any CSS color and gives its sRGB bytes.
let scratch;
function rgb(color) {
  scratch ??= document.createElement("canvas").getContext("2d", { willReadFrequently: true });
  scratch.clearRect(0, 0, 1, 1);
  scratch.fillStyle = "#000";
  scratch.fillStyle = color;
  scratch.fillRect(0, 0, 1, 1);
  const [r, g, b] = scratch.getImageData(0, 0, 1, 1).data;
  return `#${[r, g, b].map((x) => x.toString(16).padStart(2, "0")).join("")}`;
}

function readTheme() {
  const style = getComputedStyle(document.body);
  const read = ([name, fallback]) => rgb(style.getPropertyValue(name).trim() || fallback);
  const theme = Object.fromEntries(Object.entries(CHART).map(([key, token]) => [key, read(token)]));
  theme.series = SERIES.map(read);
  theme.dark = document.documentElement.classList.contains("dark");
  return theme;
}

// The chart colors of the current color mode; components re-render when it changes.
export function useChartTheme() {
  const [theme, setTheme] = useState(readTheme);
  useEffect(() => {
    const observer = new MutationObserver(() => setTheme(readTheme()));
    observer.observe(document.documentElement, { attributes: true, attributeFilter: ["class", "style"] });
    return () => observer.disconnect();
  }, []);
  return theme;
}
