// An endpoint's page: the traffic charts (request rate; p50/p95/p99 latency), drawn
// with the locally served plotly.js from the series the page carries
// (#endpoint-series) and refreshed from GET /api/v1/endpoints/<id>/metrics every 5 s;
// and the "try it" box, which posts to the endpoint's completions route with the
// browser's session (and its CSRF token). Answers are shown as text, never as HTML.
(function () {
  "use strict";

  var REFRESH_MS = 5000, HIDDEN_MS = 30000;
  var FONT = 'system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif';
  var CONFIG = { displayModeBar: false, responsive: true };
  var CHARTS = {
    rate: [
      { key: "requests_per_s", name: "requests/s", color: "#2457d6", fill: true },
      { key: "errors_per_s", name: "failed/s", color: "#b42318" },
    ],
    latency: [
      { key: "p50_ms", name: "p50", color: "#15803d" },
      { key: "p95_ms", name: "p95", color: "#a15c07" },
      { key: "p99_ms", name: "p99", color: "#b42318" },
    ],
  };

  function layout(kind, empty) {
    return {
      height: 200,
      margin: { l: 52, r: 12, t: 10, b: 32 },
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: FONT, size: 11.5, color: "#5f6b7a" },
      showlegend: kind === "latency",
      legend: { orientation: "h", x: 0, y: 1.12 },
      xaxis: { type: "date", gridcolor: "#edf0f4", linecolor: "#cfd6e0", tickformat: "%H:%M" },
      yaxis: { gridcolor: "#edf0f4", zeroline: false, rangemode: "tozero",
               ticksuffix: kind === "latency" ? " ms" : "" },
      annotations: empty ? [{ xref: "paper", yref: "paper", x: 0.5, y: 0.5, showarrow: false,
        text: "no requests in this window", font: { size: 12.5, color: "#8a95a3" } }] : [],
    };
  }

  function draw(data) {
    if (!window.Plotly) return;
    var points = data.series || [];
    var times = points.map(function (p) { return p.time; });
    document.querySelectorAll("[data-endpoint-chart]").forEach(function (el) {
      var kind = el.getAttribute("data-endpoint-chart");
      var empty = !points.some(function (p) { return p.requests_per_s > 0; });
      var traces = CHARTS[kind].map(function (line) {
        return {
          x: times, y: points.map(function (p) { return p[line.key]; }),
          type: "scatter", mode: "lines", name: line.name, connectgaps: false,
          line: { color: line.color, width: 1.8, shape: "hv" },
          fill: line.fill ? "tozeroy" : "none", fillcolor: line.color + "14",
          hovertemplate: "%{x|%H:%M:%S} " + line.name + " <b>%{y:,.1f}</b><extra></extra>",
        };
      });
      window.Plotly.react(el, traces, layout(kind, empty), CONFIG);
    });
  }

  function poll(url) {
    var delay = document.hidden ? HIDDEN_MS : REFRESH_MS;
    setTimeout(function () {
      fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (response) { return response.ok ? response.json() : null; })
        .then(function (data) { if (data) draw(data); poll(url); })
        .catch(function () { poll(url); });
    }, delay);
  }

  function tryIt(form) {
    var output = document.querySelector("[data-try-output]");
    var status = form.querySelector("[data-try-status]");
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var chat = form.elements.chat && form.elements.chat.checked;
      var text = form.elements.prompt.value;
      var body = {
        max_tokens: parseInt(form.elements.max_tokens.value, 10),
        temperature: parseFloat(form.elements.temperature.value),
      };
      if (chat) body.messages = [{ role: "user", content: text }];
      else body.prompt = text;
      var url = chat ? form.getAttribute("data-chat-url") : form.getAttribute("data-completions-url");
      var button = form.querySelector("button[type=submit]");
      var started = performance.now();
      button.disabled = true;
      status.textContent = "waiting for a replica…";
      fetch(url, {
        method: "POST",
        credentials: "same-origin",
        headers: {
          "Content-Type": "application/json",
          "X-CSRFToken": form.elements.csrfmiddlewaretoken.value,
        },
        body: JSON.stringify(body),
      })
        .then(function (response) {
          var replica = response.headers.get("X-MTC-Replica");
          return response.json().then(function (data) {
            return { ok: response.ok, status: response.status, data: data, replica: replica };
          });
        })
        .then(function (answer) {
          var ms = Math.round(performance.now() - started);
          output.hidden = false;
          if (!answer.ok) {
            var error = answer.data.error || {};
            output.textContent = "HTTP " + answer.status + " " + (error.code || "") + ": " +
              (error.message || JSON.stringify(answer.data));
            status.textContent = "failed after " + ms + " ms";
            return;
          }
          var choice = answer.data.choices[0];
          var reply = choice.message ? choice.message.content : choice.text;
          // textContent: the model's words are shown as they are, never parsed as HTML.
          output.textContent = (chat ? "" : text) + reply;
          var usage = answer.data.usage || {};
          status.textContent = ms + " ms · replica " + answer.replica + " · " +
            usage.prompt_tokens + " prompt + " + usage.completion_tokens + " new tokens · " +
            "finish: " + choice.finish_reason;
        })
        .catch(function (err) {
          output.hidden = false;
          output.textContent = "No answer: " + err;
          status.textContent = "";
        })
        .finally(function () { button.disabled = false; });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var seriesNode = document.getElementById("endpoint-series");
    var charts = document.getElementById("endpoint-charts");
    if (seriesNode && charts) {
      draw(JSON.parse(seriesNode.textContent));
      poll(charts.getAttribute("data-metrics-url"));
    }
    var form = document.getElementById("try-it");
    if (form) tryIt(form);
  });
})();
