// expiry dashboard: the only script. Pages work without it; it adds two things:
// live pages (body[data-refresh]) refresh their <main> in place while visible, and
// forms with data-confirm ask before they submit.
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

  function refresh() {
    if (!enabled || document.hidden || busy()) return;
    fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (response) {
        if (response.redirected || !response.ok) {
          // Signed out or a server error: show what a full load shows.
          window.location.reload();
          return null;
        }
        return response.text();
      })
      .then(function (html) {
        if (!html) return;
        var next = new DOMParser().parseFromString(html, "text/html");
        var fresh = next.getElementById("main");
        var main = document.getElementById("main");
        if (fresh && main && !busy()) {
          main.innerHTML = fresh.innerHTML;
          document.title = next.title;
        }
      })
      .catch(function () { /* offline for a moment: try again next time */ });
  }
  window.setInterval(refresh, seconds * 1000);
})();
