// forq web: live fragments over server-sent events, countdowns that tick between
// updates, confirmations for destructive actions. No framework, no build step.
(function () {
  "use strict";
  var skew = 0; // browser clock minus Redis clock, from the last fragment's data-now-ms

  function fmt(seconds) {
    if (seconds < 0) seconds = 0;
    if (seconds < 10) return seconds.toFixed(1) + "s";
    if (seconds < 120) return Math.round(seconds) + "s";
    if (seconds < 7200) return Math.floor(seconds / 60) + "m" + Math.round(seconds % 60) + "s";
    return Math.floor(seconds / 3600) + "h" + Math.round((seconds % 3600) / 60) + "m";
  }

  function tick() {
    var now = Date.now() - skew;
    document.querySelectorAll("[data-deadline-ms]").forEach(function (el) {
      var left = (Number(el.dataset.deadlineMs) - now) / 1000;
      el.textContent = left > 0 ? left.toFixed(1) + "s" : "expired";
      el.classList.toggle("late", left <= 0);
    });
    document.querySelectorAll("[data-since-ms]").forEach(function (el) {
      el.textContent = fmt((now - Number(el.dataset.sinceMs)) / 1000);
    });
  }

  function adopt(root) {
    var stamp = root.querySelector("[data-now-ms]");
    if (stamp) skew = Date.now() - Number(stamp.dataset.nowMs);
    tick();
  }

  function live() {
    var region = document.querySelector("[data-live]");
    var status = document.getElementById("live-status");
    if (!region || !window.EventSource) return;
    var source = new EventSource(region.dataset.live);
    source.addEventListener("update", function (event) {
      region.innerHTML = event.data;
      adopt(region);
      document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
      if (status) { status.textContent = "live"; status.className = "live-status on"; }
    });
    source.onerror = function () {
      if (status) { status.textContent = "reconnecting…"; status.className = "live-status off"; }
    };
  }

  document.addEventListener("submit", function (event) {
    var button = event.submitter;
    var question = (button && button.dataset.confirm) || event.target.dataset.confirm;
    if (question && !window.confirm(question)) event.preventDefault();
  });

  document.addEventListener("change", function (event) {
    if (!event.target.matches("[data-select-all]")) return;
    var form = event.target.closest("form");
    form.querySelectorAll("input[name=id]").forEach(function (box) {
      box.checked = event.target.checked;
    });
  });

  document.addEventListener("DOMContentLoaded", function () {
    adopt(document);
    live();
    setInterval(tick, 200);
  });
})();
