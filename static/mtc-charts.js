// A recipe job's training charts (loss, tokens/s, reward by step), drawn with the
// locally served plotly.js. The page renders the series as JSON (json_script,
// #training-series); while the job is active the charts follow the REST endpoint
// GET /api/v1/clusters/<id>/jobs/<job_id>/metrics every 5 s (30 s while the tab is
// hidden). The job page's live fragment is swapped every few seconds: the drawn
// charts are moved into each new fragment instead of being drawn again.
(function () {
  "use strict";

  var REFRESH_MS = 5000, HIDDEN_MS = 30000;
  var FONT = 'system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif';
  var CHARTS = {
    loss: { color: "#2457d6", format: ".4f", label: "loss", fromZero: false },
    tokens_per_s: { color: "#15803d", format: ",.0f", label: "tokens/s", fromZero: true },
    reward: { color: "#a15c07", format: ".3f", label: "reward", fromZero: true },
  };
  var CONFIG = { displayModeBar: false, responsive: true };

  var charts = null;   // the #training-charts element, kept across fragment swaps
  var data = null;     // {step: [...], loss: [...], ...}
  var resumed = null;  // the step a resumed run restarted from
  var timer = null;
  var polling = false;

  function jobActive() {
    var live = document.getElementById("job-live");
    return !!live && live.getAttribute("data-job-terminal") !== "1";
  }

  function finite(value) {
    return typeof value === "number" && isFinite(value) ? value : null;
  }

  // The API's [{step, time, loss, ...}, ...] -> {step: [...], loss: [...], ...}.
  function columns(series) {
    var out = { step: [] };
    Object.keys(CHARTS).forEach(function (key) { out[key] = []; });
    series.forEach(function (point) {
      out.step.push(point.step);
      Object.keys(CHARTS).forEach(function (key) { out[key].push(finite(point[key])); });
    });
    return out;
  }

  function hasValues(list) {
    return !!list && list.some(function (v) { return v !== null && v !== undefined; });
  }

  function layout(key, steps) {
    var xaxis = {
      title: { text: "step", standoff: 4 },
      gridcolor: "#edf0f4", linecolor: "#cfd6e0", zeroline: false,
      ticks: "outside", tickcolor: "#cfd6e0", ticklen: 4, rangemode: "tozero",
    };
    if (steps > 0) xaxis.range = [0, steps];
    var shapes = [], annotations = [];
    if (resumed !== null && resumed !== undefined && resumed !== "") {
      shapes.push({
        type: "line", xref: "x", yref: "paper", x0: resumed, x1: resumed, y0: 0, y1: 1,
        line: { color: "#8a95a3", width: 1, dash: "dot" },
      });
      annotations.push({
        xref: "x", yref: "paper", x: resumed, y: 1, text: "resumed at step " + resumed,
        showarrow: false, xanchor: "left", yanchor: "bottom", xshift: 3,
        font: { size: 10.5, color: "#5f6b7a" },
      });
    }
    var empty = !hasValues(data && data[key]);
    if (empty) {
      annotations.push({
        xref: "paper", yref: "paper", x: 0.5, y: 0.5, showarrow: false,
        text: data && data.step.length ? "not reported by this run" : "waiting for the first step",
        font: { size: 12.5, color: "#8a95a3" },
      });
    }
    return {
      height: 224,
      margin: { l: 58, r: 12, t: 16, b: 36 },
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: FONT, size: 11, color: "#5f6b7a" },
      xaxis: xaxis,
      yaxis: {
        gridcolor: "#edf0f4", zeroline: false, tickformat: key === "tokens_per_s" ? "~s" : "",
        automargin: true, fixedrange: true, rangemode: CHARTS[key].fromZero ? "tozero" : "normal",
        showticklabels: !empty,
      },
      hovermode: "x",
      hoverlabel: {
        bgcolor: "#111a2b", bordercolor: "#111a2b", font: { family: FONT, size: 12, color: "#fff" },
      },
      showlegend: false,
      shapes: shapes,
      annotations: annotations,
    };
  }

  function trace(key) {
    var spec = CHARTS[key];
    var n = data.step.length;
    return {
      x: data.step,
      y: data[key] || [],
      type: "scatter",
      mode: n < 3 ? "lines+markers" : "lines",
      line: { color: spec.color, width: 2, shape: "linear" },
      marker: { color: spec.color, size: 5 },
      fill: spec.fromZero ? "tozeroy" : "none",
      fillcolor: spec.color + "14",
      connectgaps: false,
      hovertemplate: "step %{x}<br>" + spec.label + " <b>%{y:" + spec.format + "}</b><extra></extra>",
    };
  }

  function draw() {
    if (!charts || !data) return;
    var steps = parseInt(charts.getAttribute("data-steps") || "0", 10);
    charts.querySelectorAll("[data-chart]").forEach(function (el) {
      var key = el.getAttribute("data-chart");
      if (!CHARTS[key]) return;
      window.Plotly.react(el, [trace(key)], layout(key, steps), CONFIG);
    });
  }

  function schedule() {
    clearTimeout(timer);
    if (polling) timer = setTimeout(refresh, document.hidden ? HIDDEN_MS : REFRESH_MS);
  }

  function refresh() {
    clearTimeout(timer);
    var last = !jobActive(); // the job has ended: this read is the final one
    fetch(charts.getAttribute("data-metrics-url"), {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    })
      .then(function (response) {
        if (response.status === 401 || response.status === 403 || response.status === 404) {
          polling = false; // signed out, or the job is gone: keep what is drawn
          return null;
        }
        return response.ok ? response.json() : null;
      })
      .then(function (body) {
        if (body && Array.isArray(body.series)) {
          data = columns(body.series);
          if (body.summary && body.summary.resumed_from_step !== undefined) {
            resumed = body.summary.resumed_from_step;
          }
          draw();
        }
        if (last) polling = false;
        schedule();
      })
      .catch(function () { schedule(); });
  }

  // The live fragment replaced #job-live: put the drawn charts into the new copy.
  document.addEventListener("mtc:refreshed", function (event) {
    if (!charts || !event.detail || event.detail.id !== "job-live") return;
    var fresh = document.getElementById("training-charts");
    if (fresh && fresh !== charts) {
      fresh.replaceWith(charts);
      if (window.Plotly) {
        charts.querySelectorAll("[data-chart]").forEach(function (el) {
          window.Plotly.Plots.resize(el);
        });
      }
    }
    if (polling && !jobActive()) refresh(); // it just ended: read the last points now
  });

  document.addEventListener("visibilitychange", function () {
    if (polling && !document.hidden) refresh();
    else schedule();
  });

  document.addEventListener("DOMContentLoaded", function () {
    charts = document.getElementById("training-charts");
    var source = document.getElementById("training-series");
    if (!charts || !source) return;
    if (!window.Plotly) {
      var note = charts.querySelector("[data-chart-empty]");
      if (note) {
        note.textContent = "The charts could not be drawn: plotly.js did not load.";
        note.hidden = false;
      }
      return;
    }
    var initial = JSON.parse(source.textContent) || {};
    data = { step: initial.step || [] };
    Object.keys(CHARTS).forEach(function (key) {
      data[key] = initial[key] || data.step.map(function () { return null; });
    });
    var mark = charts.getAttribute("data-resumed");
    resumed = mark ? parseInt(mark, 10) : null;
    draw();
    charts.setAttribute("data-charts-ready", "1");
    polling = jobActive();
    schedule();
  });
})();
