import { BarChart, LineChart, ScatterChart } from "echarts/charts";
import { DataZoomComponent, GridComponent, LegendComponent, ToolboxComponent, TooltipComponent } from "echarts/components";
// ECharts' ``use`` registers its parts; named apart from React's hooks.
import { init, use as register } from "echarts/core";
import { CanvasRenderer } from "echarts/renderers";
import { useEffect, useRef } from "react";

register([BarChart, LineChart, ScatterChart, DataZoomComponent, GridComponent, LegendComponent, ToolboxComponent,
  TooltipComponent, CanvasRenderer]);

// One ECharts chart. ``option`` is rebuilt by the caller on new data or a new color mode; the zoom the
// user chose survives a live refresh (only the series and axes are replaced).
export function Chart({ option, height = 280, ...attributes }) {
  const element = useRef(null);
  const chart = useRef(null);
  useEffect(() => {
    chart.current = init(element.current, null, { renderer: "canvas" });
    const observer = new ResizeObserver(() => chart.current?.resize());
    observer.observe(element.current);
    return () => {
      observer.disconnect();
      chart.current.dispose();
      chart.current = null;
    };
  }, []);
  useEffect(() => {
    chart.current?.setOption(option, { replaceMerge: ["series", "xAxis", "yAxis", "legend"] });
  }, [option]);
  return <div ref={element} role="img" style={{ height, width: "100%" }} {...attributes} />;
}
