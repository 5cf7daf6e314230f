/* Live updates: one authenticated socket per page; the database stays the one source of truth.
 *
 * A socket message says that something changed (and carries the new values); a page never adds deltas
 * up. Every region a page marks `data-live-region` is re-read whole from the server on each message (the
 * same view that drew the page draws it again), so a lost, late or reordered message can never leave a
 * count, a position or a reason row wrong: the next message, or the catch-up on reconnect, rereads it.
 * Pages that draw from JSON (the topology, the finance ticker) register their own reader with
 * BrokerLive.onChange. Reads are coalesced: one at a time, and a message that arrives during a read
 * triggers exactly one more.
 *
 * The page pings every PING_MS; a socket that has said nothing for SILENT_MS is treated as dead (a
 * silent network loss never closes a socket by itself): the badge says offline and a new socket is
 * opened. The badge says how long ago the page was last known to be current. */
(function () {
  "use strict";
  // Offline must show within 10 s of a silent loss even on a loaded machine that delays timers, so the
  // silence limit leaves several seconds of slack.
  var PING_MS = 2000;
  var SILENT_MS = 6000;
  var statusEl = document.getElementById("live-status");
  var attempt = 0;
  var socket = null;
  var lastCycle = null;
  var lastHeard = 0;
  var updatedAt = null;
  var readers = [];
  var reading = false;
  var readAgain = false;
  var reconnectTimer = null;
  var lastPing = 0;
  var wasLive = false;
  var pageDrawn = Date.now();

  function setStatus(state, label) {
    if (!statusEl) return;
    statusEl.dataset.state = state;
    statusEl.dataset.label = label;
    showStatus();
  }

  function ago(ms) {
    var s = Math.max(0, Math.round(ms / 1000));
    if (s < 60) return s + " s ago";
    var m = Math.round(s / 60);
    return m < 60 ? m + " min ago" : Math.round(m / 60) + " h ago";
  }

  function showStatus() {
    if (!statusEl) return;
    var label = statusEl.dataset.label || "";
    var text = updatedAt ? label + " · updated " + ago(Date.now() - updatedAt) : label;
    if (statusEl.textContent !== text) statusEl.textContent = text;
    if (updatedAt) statusEl.dataset.updated = new Date(updatedAt).toISOString();
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

  function localTimes(root) {
    (root || document).querySelectorAll("[data-iso]").forEach(function (el) {
      if (el.dataset.iso) el.textContent = when(el.dataset.iso);
    });
  }

  // --- pages that patch single elements (the workload page): the message carries full values ---------

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

  // --- pages with live regions: reread them whole -----------------------------------------------------

  function liveRegions(root) {
    var found = {};
    root.querySelectorAll("[data-live-region]").forEach(function (el) { found[el.dataset.liveRegion] = el; });
    return found;
  }

  function readRegions() {
    return fetch(location.href, { credentials: "same-origin", headers: { Accept: "text/html", "X-Live-Refresh": "1" } })
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.text(); })
      .then(function (html) {
        var fresh = liveRegions(new DOMParser().parseFromString(html, "text/html"));
        var shown = liveRegions(document);
        Object.keys(shown).forEach(function (name) {
          var next = fresh[name];
          if (!next || shown[name].innerHTML === next.innerHTML) return;
          shown[name].innerHTML = next.innerHTML;
          localTimes(shown[name]);
        });
        document.dispatchEvent(new CustomEvent("broker:regions"));
      });
  }

  function onChange(reader) { readers.push(reader); }

  function read() {
    if (reading) { readAgain = true; return Promise.resolve(); }
    reading = true;
    readAgain = false;
    var started = Date.now();
    return Promise.all(readers.map(function (reader) { return reader(); }))
      .then(function () { updatedAt = started; showStatus(); })
      .catch(function (error) { if (window.console) console.warn("live read failed", error); })
      .then(function () {
        reading = false;
        if (readAgain) return read();
      });
  }

  // --- the socket -------------------------------------------------------------------------------------

  function apply(message) {
    if (message.type === "hello") {
      // Live once the server itself answers, not when a socket opens (a proxy may open it and go silent).
      attempt = 0;
      setStatus("live", "live");
      if (message.cycle) lastCycle = message.cycle;
      // The first socket of a page drawn at the cycle the server is still at has nothing to catch up.
      var drawnAt = document.body.dataset.liveCycle;
      if (!wasLive && drawnAt && String(message.cycle) === drawnAt) { updatedAt = pageDrawn; showStatus(); }
      else catchUp();
      wasLive = true;
      return;
    }
    if (message.type === "pong") {
      // Nothing announced since the last read finished and the socket answers: the page is current.
      if (!reading && updatedAt) { updatedAt = Date.now(); showStatus(); }
      return;
    }
    if (message.cycle) lastCycle = message.cycle;
    // Counters come whole in the message: shown at once, then confirmed by the read.
    patchCounters(message.counters);
    if (readers.length) read();
    else (message.workloads || []).forEach(patchWorkload);
    document.dispatchEvent(new CustomEvent("broker:delta", { detail: message }));
    // A delta carries at most 500 rows; when more moved, this page's own may be among those left out.
    if (message.rows_cut && !readers.length) catchUp();
  }

  function workloadIdsOnPage() {
    var ids = {};
    document.querySelectorAll("[data-workload]").forEach(function (el) { ids[el.dataset.workload] = true; });
    return Object.keys(ids).slice(0, 500);
  }

  function catchUp() {
    if (readers.length) return read();
    var url = "/dashboard/api/live/?workloads=" + workloadIdsOnPage().join(",");
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.json(); })
      .then(function (data) { apply(data); updatedAt = Date.now(); showStatus(); })
      .catch(function () { /* the next delta or reconnect catches up */ });
  }

  function reconnectLater(why) {
    if (reconnectTimer) return;
    var delay = Math.min(30000, 500 * Math.pow(2, attempt)) * (0.8 + Math.random() * 0.4);
    attempt += 1;
    setStatus("down", "offline" + (why ? " (" + why + ")" : "") + " — retrying in " + Math.round(delay / 1000) + " s");
    reconnectTimer = setTimeout(function () { reconnectTimer = null; connect(); }, delay);
  }

  function drop(dead, why) {
    if (!dead) return;
    dead.onopen = dead.onmessage = dead.onclose = dead.onerror = null;
    try { dead.close(); } catch (e) { /* already closed */ }
    if (socket === dead) socket = null;
    reconnectLater(why);
  }

  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    // Once offline, the badge stays offline until the server speaks again: a page that is reconnecting
    // is still not current.
    var offline = statusEl && statusEl.dataset.state === "down";
    setStatus(offline ? "down" : "connecting", attempt ? "offline — reconnecting…" : "connecting…");
    var current = new WebSocket(scheme + location.host + "/ws/live/");
    socket = current;
    lastHeard = Date.now();
    current.onopen = function () {
      lastHeard = Date.now();
      var offline = statusEl && statusEl.dataset.state === "down";
      setStatus(offline ? "down" : "connecting", offline ? "offline — waiting for the server…" : "waiting for the server…");
    };
    current.onmessage = function (event) {
      lastHeard = Date.now();
      try { apply(JSON.parse(event.data)); } catch (e) { if (window.console) console.error(e); }
    };
    current.onclose = function (event) {
      // 4401: the session ended (logout here or in another tab, or expiry); retrying cannot help.
      if (event && event.code === 4401) {
        current.onopen = current.onmessage = current.onclose = current.onerror = null;
        if (socket === current) socket = null;
        setStatus("down", "signed out — log in again");
        return;
      }
      drop(current, "");
    };
  }

  function heartbeat() {
    var current = socket;
    if (current && current.readyState === WebSocket.OPEN) {
      if (Date.now() - lastHeard > SILENT_MS) {
        drop(current, "no answer for " + Math.round(SILENT_MS / 1000) + " s");
        return;
      }
      if (Date.now() - lastPing >= PING_MS) {
        lastPing = Date.now();
        try { current.send(JSON.stringify({ type: "ping" })); } catch (e) { drop(current, ""); }
      }
    } else if (current && current.readyState === WebSocket.CONNECTING && Date.now() - lastHeard > SILENT_MS) {
      drop(current, "cannot connect");
    }
    showStatus();
  }

  if (document.querySelector("[data-live-region]")) onChange(readRegions);
  localTimes(document);

  window.BrokerLive = {
    apply: apply,
    catchUp: catchUp,
    read: read,
    onChange: onChange,
    when: when,
    lastCycle: function () { return lastCycle; },
    socket: function () { return socket; },
    // Tests and the bench: close the socket as a network drop would.
    drop: function () { drop(socket, "dropped"); },
    reading: function () { return reading || readAgain; },
  };
  setInterval(heartbeat, 500);
  connect();
})();
