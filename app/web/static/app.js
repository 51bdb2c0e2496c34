// FrogFix dashboard: our own small script, no library. Every page works without it; it adds
// confirmations, live updates by polling, and fold/unfold-all on trajectories.
// Text from the server is always inserted with textContent (never as HTML), except whole regions
// re-fetched from our own server-rendered (escaped) pages.
"use strict";

(function () {
  function onReady(fn) {
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", fn);
    else fn();
  }

  // Ask before actions that change a job (delegated, so forms swapped in later are covered too).
  function confirmations() {
    document.addEventListener("submit", function (event) {
      var form = event.target;
      if (form instanceof HTMLFormElement && form.hasAttribute("data-confirm")) {
        if (!window.confirm(form.getAttribute("data-confirm"))) event.preventDefault();
      }
    });
  }

  // Replace the elements with these ids by their fresh server-rendered versions.
  function swapFromServer(ids) {
    return fetch(window.location.href, { headers: { Accept: "text/html" }, credentials: "same-origin" })
      .then(function (response) {
        if (response.redirected || response.status === 401) { window.location.reload(); return null; }
        return response.ok ? response.text() : null;
      })
      .then(function (html) {
        if (!html) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        ids.forEach(function (id) {
          var mine = document.getElementById(id);
          var fresh = doc.getElementById(id);
          if (mine && fresh && fresh.innerHTML !== mine.innerHTML) mine.innerHTML = fresh.innerHTML;
        });
      });
  }

  // Regions marked data-refresh="<ms>" are re-fetched from the same URL and swapped in place.
  function refreshRegions() {
    document.querySelectorAll("[data-refresh][id]").forEach(function (region) {
      var every = parseInt(region.getAttribute("data-refresh"), 10);
      if (!every || every < 1000) return;
      var busy = false;
      setInterval(function () {
        if (busy || document.hidden) return;
        busy = true;
        swapFromServer([region.id])
          .catch(function () { /* the next tick tries again */ })
          .finally(function () { busy = false; });
      }, every);
    });
  }

  function badge(status, label) {
    var span = document.createElement("span");
    span.className = "badge s-" + status;
    span.setAttribute("data-status", status);
    span.textContent = label;
    return span;
  }

  function setText(id, text) {
    var el = document.getElementById(id);
    if (el) el.textContent = text;
  }

  // The job page polls a small JSON document while the job is active.
  function liveJob() {
    var live = document.getElementById("live");
    if (!live || !live.getAttribute("data-progress-url")) return;
    var url = live.getAttribute("data-progress-url");
    var after = parseInt(live.getAttribute("data-after") || "0", 10);
    var every = parseInt(live.getAttribute("data-poll") || "2000", 10);
    var failures = 0;
    var state = live.getAttribute("data-state");
    var dot = live.querySelector(".live-dot");
    if (dot) dot.classList.add("pulse");

    function apply(p) {
      var holder = document.getElementById("job-status");
      if (holder) {
        holder.textContent = "";
        holder.appendChild(badge(p.status, p.status_label));
        if (p.cancel_requested && p.active) {
          holder.appendChild(document.createTextNode(" "));
          var c = badge("cancel-req", "cancelling");
          c.className = "badge s-cancel-req";
          holder.appendChild(c);
        }
      }
      setText("live-status", p.status_label + (p.cancel_requested && p.active ? " (cancel requested)" : ""));
      var steps = p.steps ? "step " + p.steps : "";
      if (p.attempt) steps = "attempt " + p.attempt.number + (p.attempt.steps ? ", step " + p.attempt.steps : "");
      setText("live-steps", steps);
      setText("fact-steps", String(p.steps));
      if (p.attempt) setText("attempt-steps-" + p.attempt.id, p.attempt.steps + (p.attempt.steps === 1 ? " step" : " steps"));
      setText("live-duration", p.duration);
      setText("fact-duration", p.duration);
      var current = "";
      if (p.current_step && p.current_step.calls.length) {
        current = p.current_step.calls.map(function (c) {
          return c.name + (c.headline ? " " + c.headline : "");
        }).join(" · ");
      }
      setText("live-current", current || "—");
      if (p.cancel_requested) {
        var button = document.getElementById("cancel-button");
        if (button) button.disabled = true;
      }
      var body = document.getElementById("timeline");
      (p.events || []).forEach(function (e) {
        after = Math.max(after, e.id);
        if (!body || body.querySelector('[data-event-id="' + e.id + '"]')) return;
        var row = document.createElement("tr");
        row.setAttribute("data-event-id", String(e.id));
        row.className = "new";
        var when = document.createElement("td"); when.className = "when"; when.textContent = e.at;
        var kind = document.createElement("td");
        var k = document.createElement("span"); k.className = "kind k-" + e.kind; k.textContent = e.kind;
        kind.appendChild(k);
        var msg = document.createElement("td"); msg.className = "msg"; msg.textContent = e.message;
        row.appendChild(when); row.appendChild(kind); row.appendChild(msg);
        body.appendChild(row);
      });
      live.setAttribute("data-after", String(after));
    }

    function tick() {
      fetch(url + "?after=" + after, { headers: { Accept: "application/json" }, credentials: "same-origin" })
        .then(function (response) {
          if (response.status === 401) { window.location.reload(); return null; }
          if (!response.ok) throw new Error("HTTP " + response.status);
          return response.json();
        })
        .then(function (p) {
          if (!p) return;
          failures = 0;
          apply(p);
          if (p.active && p.state !== state) {
            // Status, attempt or MR changed: refresh the server-rendered parts of the page.
            state = p.state;
            swapFromServer(["job-actions", "job-flags", "stages", "facts", "attempts", "provenance"])
              .catch(function () { /* shown on the next change or reload */ });
          }
          if (!p.active) {
            // Finished: load the page again for the patch, tests and final timeline.
            setTimeout(function () { window.location.reload(); }, 600);
            return;
          }
          setTimeout(tick, document.hidden ? every * 3 : every);
        })
        .catch(function () {
          failures += 1;
          setTimeout(tick, Math.min(30000, every * Math.pow(2, failures)));
        });
    }
    setTimeout(tick, every);
  }

  function foldAll() {
    document.querySelectorAll("[data-expand-all]").forEach(function (button) {
      button.addEventListener("click", function () {
        document.querySelectorAll("details").forEach(function (d) { d.open = true; });
      });
    });
    document.querySelectorAll("[data-collapse-all]").forEach(function (button) {
      button.addEventListener("click", function () {
        document.querySelectorAll("details").forEach(function (d) { d.open = false; });
      });
    });
  }

  onReady(function () {
    confirmations();
    refreshRegions();
    liveJob();
    foldAll();
  });
})();
