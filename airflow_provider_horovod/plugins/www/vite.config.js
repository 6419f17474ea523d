// One classic script (IIFE) that Airflow's UI imports: React is Airflow's own (window.React, ...), so
// the views run in Airflow's React tree; everything else (ECharts) is bundled.
import { defineConfig } from "vite";

const globals = { react: "React", "react/jsx-runtime": "ReactJSXRuntime" };

export default defineConfig({
  publicDir: "public",
  oxc: { jsx: { runtime: "automatic" } },
  define: { "process.env.NODE_ENV": JSON.stringify("production") },
  build: {
    outDir: process.env.AHP_UI_OUT || "dist",
    emptyOutDir: true,
    target: "es2020",
    lib: { entry: "src/main.jsx", formats: ["iife"], name: "HorovodTrainingViews", fileName: () => "training.js" },
    rolldownOptions: { external: Object.keys(globals), output: { globals } },
  },
});
