/* Live updates: one authenticated socket per page, deltas patched into the DOM in place.
 * On every (re)connect the page first catches up from the database (/dashboard/api/live/), so a delta
 * lost while the socket was down loses nothing. Reconnects back off exponentially (0.5 s .. 30 s). */
(function () {
  "use strict";
  var statusEl = document.getElementById("live-status");
  var attempt = 0;
  var socket = null;
  var lastCycle = null;

  function setStatus(state, text) {
    if (!statusEl) return;
    statusEl.dataset.state = state;
    statusEl.textContent = text;
  }

  function text(el, value) {
    var v = value === null || value === undefined || value === "" ? "—" : String(value);
    if (el.textContent !== v) el.textContent = v;
  }

  function when(iso) {
    if (!iso) return "—";
    var d = new Date(iso);
    return d.toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
  }

  function patchCounters(counters) {
    if (!counters) return;
    Object.keys(counters).forEach(function (key) {
      document.querySelectorAll('[data-counter="' + key + '"]').forEach(function (el) { text(el, counters[key]); });
    });
  }

  function patchWorkload(row) {
    document.querySelectorAll('[data-workload="' + row.id + '"]').forEach(function (el) {
      var changed = el.dataset.state !== row.state;
      el.dataset.state = row.state;
      el.querySelectorAll("[data-field]").forEach(function (field) {
        var name = field.dataset.field;
        if (!(name in row)) return;
        var value = row[name];
        if (name === "estimated_start" || name === "since" || name === "admitted_at") value = when(value);
        text(field, value);
        if (name === "state" || name === "reason") field.dataset[name === "state" ? "state" : "reason"] = row[name];
      });
      if (changed && el.tagName === "TR") {
        el.classList.remove("flash"); void el.offsetWidth; el.classList.add("flash");
      }
    });
  }

  function patchCapacity(capacity) {
    (capacity || []).forEach(function (row) {
      var tr = document.querySelector('[data-capacity-row="' + row.device_class + '"]');
      if (!tr) return;
      ["busy", "free", "unhealthy", "reserved", "stranded"].forEach(function (state) {
        var cell = tr.querySelector('[data-cap="' + state + '"]');
        if (cell) text(cell, row[state]);
        var seg = tr.querySelector('[data-seg="' + state + '"]');
        if (seg) seg.style.width = (row.total ? (100 * row[state] / row.total) : 0) + "%";
      });
      var idle = tr.querySelector('[data-cap="idle_cost_per_hour"]');
      if (idle) text(idle, Number(row.idle_cost_per_hour).toFixed(2));
    });
  }

  function patchReasons(rows) {
    (rows || []).forEach(function (row) {
      var tr = document.querySelector('[data-reason-row="' + row.reason + '"]');
      if (!tr) return;
      tr.querySelectorAll("[data-field]").forEach(function (f) { text(f, row[f.dataset.field]); });
    });
  }

  function apply(message) {
    if (message.type === "hello" || message.type === "pong") return;
    patchCounters(message.counters);
    (message.workloads || []).forEach(patchWorkload);
    patchCapacity(message.capacity);
    patchReasons(message.pending_by_reason);
    if (message.cycle) lastCycle = message.cycle;
    document.dispatchEvent(new CustomEvent("broker:delta", { detail: message }));
  }

  function workloadIdsOnPage() {
    var ids = {};
    document.querySelectorAll("[data-workload]").forEach(function (el) { ids[el.dataset.workload] = true; });
    return Object.keys(ids).slice(0, 500);
  }

  function catchUp() {
    var url = "/dashboard/api/live/?workloads=" + workloadIdsOnPage().join(",");
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.json(); })
      .then(function (data) { apply(data); })
      .catch(function () { /* the next delta or reconnect catches up */ });
  }

  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    setStatus("connecting", attempt ? "reconnecting…" : "connecting…");
    socket = new WebSocket(scheme + location.host + "/ws/live/");
    socket.onopen = function () {
      attempt = 0;
      setStatus("live", "live");
      catchUp();
    };
    socket.onmessage = function (event) {
      try { apply(JSON.parse(event.data)); } catch (e) { if (window.console) console.error(e); }
    };
    socket.onclose = function (event) {
      // 4401: the session ended (logout here or in another tab, or expiry); retrying cannot help.
      if (event.code === 4401) { setStatus("down", "signed out — log in again"); return; }
      var delay = Math.min(30000, 500 * Math.pow(2, attempt)) * (0.8 + Math.random() * 0.4);
      attempt += 1;
      setStatus("down", "offline — retrying in " + Math.round(delay / 1000) + " s");
      setTimeout(connect, delay);
    };
  }

  window.BrokerLive = {
    apply: apply,
    catchUp: catchUp,
    when: when,
    lastCycle: function () { return lastCycle; },
    socket: function () { return socket; },
  };
  connect();
})();
