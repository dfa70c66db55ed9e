// mtc pages: live refresh of cluster state, the wizard's "add pool", the
// reference editor's id field, copy buttons. No framework; pages work without it.
(function () {
  "use strict";

  // --- live refresh --------------------------------------------------------
  // An element #live with data-live-url is fetched again and swapped in place:
  // every 2 s while data-live-active="1", every 15 s otherwise, and slower
  // while the tab is hidden. A 404 (the cluster is gone) goes to data-gone-url.
  var FAST_MS = 2000, IDLE_MS = 15000, HIDDEN_MS = 30000;
  var timer = null;

  function liveDelay(el) {
    if (document.hidden) return HIDDEN_MS;
    return el.getAttribute("data-live-active") === "1" ? FAST_MS : IDLE_MS;
  }

  function schedule() {
    var el = document.getElementById("live");
    if (!el || !el.getAttribute("data-live-url")) return;
    clearTimeout(timer);
    timer = setTimeout(refresh, liveDelay(el));
  }

  function refresh() {
    var el = document.getElementById("live");
    if (!el) return;
    var url = el.getAttribute("data-live-url");
    fetch(url, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (response) {
        if (response.status === 404 && el.getAttribute("data-gone-url")) {
          window.location.assign(el.getAttribute("data-gone-url"));
          return null;
        }
        if (!response.ok || response.redirected) return null;
        return response.text();
      })
      .then(function (html) {
        if (html) {
          var doc = new DOMParser().parseFromString(html, "text/html");
          var fresh = doc.getElementById("live");
          var current = document.getElementById("live");
          if (fresh && current) current.replaceWith(document.importNode(fresh, true));
        }
        schedule();
      })
      .catch(function () { schedule(); });
  }

  document.addEventListener("visibilitychange", function () {
    if (!document.hidden) { clearTimeout(timer); refresh(); } else { schedule(); }
  });

  // --- wizard: add a compute pool ------------------------------------------
  function addPool(button) {
    var container = document.querySelector("[data-pools]");
    var template = document.getElementById("pool-template");
    if (!container || !template) return;
    var prefix = container.getAttribute("data-prefix");
    var total = document.getElementById("id_" + prefix + "-TOTAL_FORMS");
    var index = parseInt(total.value, 10);
    var html = template.innerHTML.replace(/__prefix__/g, String(index));
    var wrapper = document.createElement("div");
    wrapper.innerHTML = html.trim();
    var node = wrapper.firstElementChild;
    var legend = node.querySelector("legend");
    if (legend) legend.textContent = "Compute pool " + (index + 1);
    var idInput = node.querySelector("input[name$='-pool_id']");
    if (idInput) idInput.value = "pool" + (index + 1);
    container.appendChild(node);
    total.value = String(index + 1);
    if (idInput) idInput.focus();
  }

  // --- reference editor: the id field rewrites the JSON's cluster_id ---------
  function syncClusterId(input) {
    var area = document.getElementById("id_spec_text");
    if (!area) return;
    try {
      var spec = JSON.parse(area.value);
      if (spec && typeof spec === "object" && !Array.isArray(spec)) {
        spec.cluster_id = input.value;
        area.value = JSON.stringify(spec, null, 2);
      }
    } catch (e) { /* the user is editing the JSON: leave it alone */ }
  }

  // --- copy buttons and the example filler -----------------------------------
  function copyFrom(button) {
    var source = document.querySelector(button.getAttribute("data-copy"));
    if (!source || !navigator.clipboard) return;
    navigator.clipboard.writeText(source.textContent.trim()).then(function () {
      var label = button.textContent;
      button.textContent = "Copied";
      setTimeout(function () { button.textContent = label; }, 1500);
    });
  }

  function fillExample(button) {
    var target = document.querySelector(button.getAttribute("data-fill-example"));
    var source = document.querySelector(button.getAttribute("data-example-source"));
    if (target && source) { target.value = source.textContent; target.focus(); }
  }

  document.addEventListener("click", function (event) {
    var el = event.target.closest("[data-add-pool], [data-copy], [data-fill-example]");
    if (!el) return;
    if (el.hasAttribute("data-add-pool")) addPool(el);
    else if (el.hasAttribute("data-copy")) copyFrom(el);
    else fillExample(el);
  });

  document.addEventListener("input", function (event) {
    if (event.target.matches("form.spec-form input[name='cluster_id']")) syncClusterId(event.target);
  });

  document.addEventListener("DOMContentLoaded", schedule);
})();

// Job pages: live regions (the queue's table, the job's state), confirmations on
// control buttons, and the job's output tail read from the REST API.
(function () {
  "use strict";

  // --- live regions ----------------------------------------------------------
  // An element with an id, data-refresh-url and data-refresh-ms is fetched again
  // every data-refresh-ms (30 s while the tab is hidden) and replaced by the element
  // with the same id in the answer. data-refresh-ms="0" (a finished job) stops it.
  var HIDDEN_MS = 30000;
  var timers = {};

  function regionDelay(el) {
    var ms = parseInt(el.getAttribute("data-refresh-ms") || "0", 10);
    if (!ms) return 0;
    return document.hidden ? Math.max(ms, HIDDEN_MS) : ms;
  }

  function scheduleRegion(id) {
    clearTimeout(timers[id]);
    var el = document.getElementById(id);
    if (!el) return;
    var delay = regionDelay(el);
    if (delay) timers[id] = setTimeout(function () { refreshRegion(id); }, delay);
  }

  function refreshRegion(id) {
    var el = document.getElementById(id);
    if (!el) return;
    var stop = false;
    fetch(el.getAttribute("data-refresh-url"), {
      credentials: "same-origin",
      headers: { "X-Requested-With": "fetch" },
    })
      .then(function (response) {
        if (response.redirected || response.status === 404 || response.status === 403) {
          stop = true; // signed out, or the thing is gone: leave the page as it is
          return null;
        }
        return response.ok ? response.text() : null;
      })
      .then(function (html) {
        if (html) {
          var doc = new DOMParser().parseFromString(html, "text/html");
          var fresh = doc.getElementById(id);
          var current = document.getElementById(id);
          if (fresh && current) {
            current.replaceWith(document.importNode(fresh, true));
            document.dispatchEvent(new CustomEvent("mtc:refreshed", { detail: { id: id } }));
          }
        }
        if (!stop) scheduleRegion(id);
      })
      .catch(function () { scheduleRegion(id); });
  }

  function regions() {
    return Array.prototype.slice.call(document.querySelectorAll("[data-refresh-url][id]"));
  }

  document.addEventListener("visibilitychange", function () {
    regions().forEach(function (el) {
      if (!document.hidden && regionDelay(el)) { clearTimeout(timers[el.id]); refreshRegion(el.id); }
      else scheduleRegion(el.id);
    });
  });

  // --- confirmations -----------------------------------------------------------
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form.matches || !form.matches("form[data-confirm]")) return;
    if (!window.confirm(form.getAttribute("data-confirm"))) {
      event.preventDefault();
      return;
    }
    var button = form.querySelector("button[type=submit]");
    if (button) setTimeout(function () { button.disabled = true; }, 0);
  });

  // --- output tail ---------------------------------------------------------------
  // GET <data-output-url>?stream=stdout&offset=N answers {data, next_offset, eof, ...}.
  // Read each stream to its end, then again every 1.5 s; stop once the job was
  // already finished before a read that reached the end of both.
  var MAX_CHARS = 2000000;

  function jobFinished() {
    var live = document.getElementById("job-live");
    return !!live && live.getAttribute("data-job-terminal") === "1";
  }

  function humanBytes(n) {
    if (n < 1024) return n + " B";
    if (n < 1048576) return (n / 1024).toFixed(1) + " KiB";
    return (n / 1048576).toFixed(1) + " MiB";
  }

  function append(pre, text) {
    var atBottom = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 24;
    pre.appendChild(document.createTextNode(text));
    if (pre.textContent.length > MAX_CHARS) {
      pre.textContent = "[… earlier output not shown …]\n" + pre.textContent.slice(-MAX_CHARS / 2);
    }
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  }

  function startOutput(card) {
    var url = card.getAttribute("data-output-url");
    var status = card.querySelector("[data-output-status]");
    var streams = {};
    var names = [];
    card.querySelectorAll("pre[data-stream]").forEach(function (pre) {
      var name = pre.getAttribute("data-stream");
      streams[name] = { pre: pre, offset: 0, eof: false };
      names.push(name);
    });
    if (!names.length) return;

    function setStatus(kind, text) {
      if (!status) return;
      status.className = "output-status" + (kind ? " " + kind : "");
      status.textContent = text;
    }

    function read(name) {
      var s = streams[name];
      var query = "?stream=" + encodeURIComponent(name) + "&offset=" + s.offset;
      return fetch(url + query, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (response) {
          if (!response.ok) throw new Error("HTTP " + response.status);
          return response.json();
        })
        .then(function (body) {
          if (body.data) append(s.pre, body.data);
          s.offset = body.next_offset;
          s.eof = body.eof;
          var size = card.querySelector('[data-size-for="' + name + '"]');
          if (size) size.textContent = body.size ? humanBytes(body.size) : "";
        });
    }

    function round() {
      var finished = jobFinished();
      Promise.all(names.map(read))
        .then(function () {
          if (names.some(function (n) { return !streams[n].eof; })) {
            setTimeout(round, 50); // more is there already: keep reading
          } else if (finished) {
            setStatus("done", "complete");
            card.setAttribute("data-output-done", "1");
          } else {
            setStatus("live", "following");
            setTimeout(round, document.hidden ? 10000 : 1500);
          }
        })
        .catch(function () {
          setStatus("", "cannot read the output; retrying…");
          setTimeout(round, 5000);
        });
    }
    round();
  }

  document.addEventListener("click", function (event) {
    var tab = event.target.closest("[data-stream-tab]");
    if (!tab) return;
    var card = tab.closest("[data-output-url]");
    var name = tab.getAttribute("data-stream-tab");
    card.querySelectorAll("[data-stream-tab]").forEach(function (t) {
      var on = t === tab;
      t.classList.toggle("active", on);
      t.setAttribute("aria-selected", on ? "true" : "false");
    });
    card.querySelectorAll("pre[data-stream]").forEach(function (pre) {
      pre.hidden = pre.getAttribute("data-stream") !== name;
    });
  });

  document.addEventListener("DOMContentLoaded", function () {
    regions().forEach(function (el) { scheduleRegion(el.id); });
    document.querySelectorAll("[data-output-url]").forEach(startOutput);
  });
})();

// Recipe launch page: once a field changes, the preview no longer shows what Launch
// would submit. Say so and hold Launch back until Preview was pressed again (the
// server checks the same thing).
(function () {
  "use strict";

  function markStale(event) {
    var form = event.target.closest && event.target.closest("form[data-recipe-form]");
    if (!form || !event.target.name || event.target.name === "previewed") return;
    var preview = form.querySelector("#preview");
    if (!preview || preview.classList.contains("stale")) return;
    preview.classList.add("stale");
    var note = preview.querySelector("[data-preview-stale]");
    if (note) note.hidden = false;
    var launch = form.querySelector("button[name=launch]");
    if (launch) {
      launch.disabled = true;
      launch.title = "Preview the changed values first";
    }
  }

  document.addEventListener("input", markStale);
  document.addEventListener("change", markStale);

  // After a post: to the first field with an error, else to the preview.
  document.addEventListener("DOMContentLoaded", function () {
    var form = document.querySelector("form[data-recipe-form][data-scroll-to]");
    if (!form) return;
    var error = form.getAttribute("data-scroll-to") === "error";
    var target = error
      ? form.querySelector(".has-error") || form.querySelector("[data-testid=form-errors]")
      : form.querySelector("#preview");
    if (!target) return;
    target.scrollIntoView({ block: error ? "center" : "start" });
    var input = target.querySelector("input, select, textarea");
    if (input && target.classList.contains("has-error")) input.focus({ preventScroll: true });
  });
})();

// Node health pages: the repair form's confirmation names the chosen action, the
// repair queue's cluster filter applies on change, and the node page's charts (speed
// check and per-GPU telemetry over its recent reports) are drawn with the locally
// served plotly.js from the JSON the page carries (#node-series).
(function () {
  "use strict";

  // Runs before the generic data-confirm handler (capture phase).
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form.matches || !form.matches("form[data-confirm-template]")) return;
    var select = form.querySelector("select[data-repair-action]");
    if (!select || select.selectedIndex < 0) return;
    var label = select.options[select.selectedIndex].text.replace(/\s*\(.*\)$/, "");
    form.setAttribute("data-confirm", form.getAttribute("data-confirm-template").replace("{ACTION}", label));
  }, true);

  document.addEventListener("change", function (event) {
    if (event.target.matches && event.target.matches("select[data-autosubmit]")) {
      event.target.form.submit();
    }
  });

  var FONT = 'system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif';
  var PALETTE = ["#2457d6", "#15803d", "#a15c07", "#b42318", "#6b3fb8", "#0e7490", "#be185d", "#4d7c0f"];
  var METRICS = {
    gflops: { label: "GFLOP/s", format: ",.3f" },
    temperature_c: { label: "°C", format: ",.0f" },
    power_w: { label: "W", format: ",.0f" },
    utilization_pct: { label: "%", format: ",.0f" },
    memory_used_mib: { label: "MiB", format: ",.0f" },
  };

  function traces(key, series) {
    if (key === "gflops") {
      var n = series.speed.time.length;
      return [{
        x: series.speed.time, y: series.speed.gflops, type: "scatter", name: "speed",
        mode: n < 3 ? "lines+markers" : "lines", line: { color: PALETTE[0], width: 2 },
        marker: { size: 5, color: PALETTE[0] }, fill: "tozeroy", fillcolor: PALETTE[0] + "14",
        hovertemplate: "%{x|%H:%M:%S}<br><b>%{y:" + METRICS.gflops.format + "}</b> GFLOP/s<extra></extra>",
      }];
    }
    return series.gpus.map(function (gpu, i) {
      var color = PALETTE[i % PALETTE.length];
      return {
        x: gpu.time, y: gpu[key], type: "scatter", name: "GPU " + gpu.index,
        mode: gpu.time.length < 3 ? "lines+markers" : "lines", line: { color: color, width: 1.6 },
        marker: { size: 4, color: color }, connectgaps: false,
        hovertemplate: "GPU " + gpu.index + " <b>%{y:" + METRICS[key].format + "}</b> " +
          METRICS[key].label + "<extra></extra>",
      };
    });
  }

  function allZero(data) {
    return data.every(function (t) {
      return t.y.every(function (v) { return v === null || v === 0; });
    });
  }

  function layout(key, data, emulated) {
    var flat = allZero(data);
    var annotations = [];
    if (flat && key !== "gflops") {
      annotations.push({
        xref: "paper", yref: "paper", x: 0.5, y: 0.55, showarrow: false,
        text: emulated ? "emulated GPUs report zeros" : "all zero",
        font: { size: 12, color: "#6b3fb8" },
      });
    }
    return {
      height: 200,
      margin: { l: 52, r: 10, t: 10, b: 30 },
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: FONT, size: 11, color: "#5f6b7a" },
      xaxis: { type: "date", gridcolor: "#edf0f4", linecolor: "#cfd6e0", zeroline: false, tickformat: "%H:%M" },
      yaxis: {
        gridcolor: "#edf0f4", zeroline: false, rangemode: "tozero", fixedrange: true, automargin: true,
        range: flat ? [0, 1] : undefined, tickformat: key === "memory_used_mib" && !flat ? "~s" : "",
      },
      hovermode: "x unified",
      hoverlabel: { bgcolor: "#111a2b", bordercolor: "#111a2b", font: { family: FONT, size: 12, color: "#fff" } },
      showlegend: !flat && key !== "gflops" && data.length > 1 && data.length <= 8,
      legend: { orientation: "h", y: -0.22, x: 0, font: { size: 10.5 } },
      annotations: annotations,
    };
  }

  document.addEventListener("DOMContentLoaded", function () {
    var box = document.getElementById("node-charts");
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
    var series = JSON.parse(source.textContent) || { speed: { time: [], gflops: [] }, gpus: [] };
    var emulated = box.getAttribute("data-emulated") === "1";
    box.querySelectorAll("[data-node-chart]").forEach(function (el) {
      var key = el.getAttribute("data-node-chart");
      if (!METRICS[key]) return;
      var data = traces(key, series);
      if (data.length > 8) {
        // Many GPUs: keep the legend off and the lines thin.
        data.forEach(function (t) { t.line.width = 1.2; });
      }
      window.Plotly.newPlot(el, data, layout(key, data, emulated), { displayModeBar: false, responsive: true });
    });
    box.setAttribute("data-charts-ready", "1");
  });
})();
