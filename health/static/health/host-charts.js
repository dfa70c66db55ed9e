// The node page's host charts (CPU, load, memory, disk, network over the recent
// reports), drawn with the locally served plotly.js from the JSON the page carries
// (#node-series, built by health.metrics.node_series).
(function () {
  "use strict";

  var FONT = 'system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif';
  var PALETTE = ["#2457d6", "#15803d", "#a15c07", "#b42318", "#6b3fb8", "#0e7490"];

  function line(x, y, name, color, unit, format, extra) {
    var trace = {
      x: x, y: y, type: "scatter", name: name, connectgaps: false,
      mode: x.length < 3 ? "lines+markers" : "lines",
      line: { color: color, width: 1.8 }, marker: { size: 4, color: color },
      hovertemplate: name + " <b>%{y:" + format + "}</b> " + unit + "<extra></extra>",
    };
    return Object.assign(trace, extra || {});
  }

  function traces(key, series) {
    var host = series.host, disk = series.disk;
    if (key === "cpu_util_pct") {
      return [line(host.time, host.cpu_util_pct, "CPU", PALETTE[0], "%", ",.1f",
        { fill: "tozeroy", fillcolor: PALETTE[0] + "14" })];
    }
    if (key === "load1") {
      return [
        line(host.time, host.load1, "load", PALETTE[1], "", ",.2f"),
        line(host.time, host.cpu_count, "CPUs", "#8a94a3", "", ",.0f",
          { line: { color: "#8a94a3", width: 1, dash: "dot" } }),
      ];
    }
    if (key === "mem_used_pct") {
      return [line(host.time, host.mem_used_pct, "memory", PALETTE[4], "%", ",.1f",
        { fill: "tozeroy", fillcolor: PALETTE[4] + "14" })];
    }
    if (key === "disk") {
      return disk.paths.map(function (p, i) {
        return line(disk.time, p.used_pct, p.path.split("/").slice(-2).join("/"),
          PALETTE[(i + 2) % PALETTE.length], "%", ",.1f");
      });
    }
    if (key === "net") {
      return [
        line(host.time, host.net_rx_mbps, "received", PALETTE[5], "MB/s", ",.3f"),
        line(host.time, host.net_tx_mbps, "sent", PALETTE[3], "MB/s", ",.3f"),
      ];
    }
    return [];
  }

  function layout(key) {
    var percent = key === "cpu_util_pct" || key === "mem_used_pct" || key === "disk";
    var legend = key === "disk" || key === "net" || key === "load1";
    return {
      height: 200,
      margin: { l: 52, r: 10, t: legend ? 26 : 10, b: 30 },
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: FONT, size: 11, color: "#5f6b7a" },
      showlegend: legend,
      legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom", font: { size: 10 } },
      xaxis: { type: "date", gridcolor: "#edf0f4", linecolor: "#cfd6e0", zeroline: false, tickformat: "%H:%M" },
      yaxis: {
        gridcolor: "#edf0f4", zeroline: false, rangemode: "tozero", fixedrange: true, automargin: true,
        range: percent ? [0, 100] : undefined,
      },
      hovermode: "x unified",
      hoverlabel: { bgcolor: "#111a2b", bordercolor: "#111a2b", font: { family: FONT, size: 12, color: "#fff" } },
    };
  }

  document.addEventListener("DOMContentLoaded", function () {
    var box = document.getElementById("host-charts");
    var source = document.getElementById("node-series");
    if (!box || !source) return;
    if (!window.Plotly) {
      var note = box.querySelector("[data-chart-empty]");
      if (note) {
        note.textContent = "The charts could not be drawn: plotly.js did not load.";
        note.hidden = false;
      }
      return;
    }
    var series = JSON.parse(source.textContent);
    box.querySelectorAll("[data-host-chart]").forEach(function (el) {
      var key = el.getAttribute("data-host-chart");
      window.Plotly.newPlot(el, traces(key, series), layout(key), { displayModeBar: false, responsive: true });
    });
    box.setAttribute("data-charts-ready", "1");
  });
})();
