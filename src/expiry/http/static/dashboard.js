// expiry dashboard: the only script. Pages work without it; it adds two things:
// live pages (body[data-refresh]) refresh their <main> and footer in place while
// visible, and say when a refresh fails ("last updated 40 s ago: the server is
// not answering") instead of showing old numbers as if they were live; and forms
// with data-confirm ask before they submit.
(function () {
  "use strict";

  document.addEventListener("submit", function (event) {
    var form = event.target;
    var message = form && form.getAttribute && form.getAttribute("data-confirm");
    if (message && !window.confirm(message)) {
      event.preventDefault();
    }
  });

  var seconds = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
  if (!seconds) return;
  var toggle = document.getElementById("refresh-toggle");
  var enabled = window.localStorage.getItem("expiry.refresh") !== "off";

  function show() {
    if (!toggle) return;
    toggle.hidden = false;
    toggle.setAttribute("aria-pressed", enabled ? "true" : "false");
    toggle.textContent = enabled ? "Auto-refresh on" : "Auto-refresh off";
  }
  if (toggle) {
    toggle.addEventListener("click", function () {
      enabled = !enabled;
      window.localStorage.setItem("expiry.refresh", enabled ? "on" : "off");
      show();
    });
  }
  show();

  function busy() {
    // Never swap the page under someone using it.
    var active = document.activeElement;
    var main = document.getElementById("main");
    return active && active !== main && active !== document.body && main && main.contains(active);
  }

  var status = document.getElementById("refresh-status");
  var updated = Date.now();
  var failing = false;

  function ago() {
    var s = Math.round((Date.now() - updated) / 1000);
    return s < 90 ? s + " s" : Math.round(s / 60) + " min";
  }

  function stale() {
    // The numbers on the page are as old as the last answer: say so.
    failing = true;
    document.body.classList.add("stale");
    if (status) {
      status.hidden = false;
      status.textContent = "Last updated " + ago() + " ago: the server is not answering";
    }
  }

  function fresh() {
    failing = false;
    updated = Date.now();
    document.body.classList.remove("stale");
    if (status) {
      status.hidden = true;
      status.textContent = "";
    }
  }

  function swap(next, id) {
    var part = next.getElementById(id);
    var here = document.getElementById(id);
    if (part && here) here.innerHTML = part.innerHTML;
  }

  function refresh() {
    if (!enabled || document.hidden || busy()) {
      if (failing) stale();  // keep the age it states moving
      return;
    }
    fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (response) {
        if (response.status >= 500) {
          stale();  // a server that cannot answer now: keep the page, say how old it is
          return null;
        }
        if (response.redirected || !response.ok) {
          // Signed out, or the page is gone: show what a full load shows.
          window.location.reload();
          return null;
        }
        return response.text();
      })
      .then(function (html) {
        if (!html) return;
        var next = new DOMParser().parseFromString(html, "text/html");
        if (busy()) return;
        swap(next, "main");
        swap(next, "footer");
        document.title = next.title;
        fresh();
      })
      .catch(stale);  // no answer at all: the server is down or unreachable
  }
  window.setInterval(refresh, seconds * 1000);
})();
