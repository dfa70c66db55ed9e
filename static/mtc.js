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
