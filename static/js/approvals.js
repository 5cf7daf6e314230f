/* The approvals inbox, live: ws/approvals/ names a workload; the row is fetched rendered for this user.
 * New requests appear, decided ones leave, escalations are flagged (and announced to admins). On every
 * (re)connect the whole list is read again, so a message lost while the socket was down loses nothing. */
(function () {
  "use strict";
  var table = document.querySelector("#approvals tbody");
  if (!table) return;
  var empty = document.getElementById("approvals-empty");
  var count = document.getElementById("awaiting-count");
  var notice = document.getElementById("approvals-notice");
  var attempt = 0;

  function refreshCount() {
    var n = table.querySelectorAll("tr[data-approval-row]").length;
    count.textContent = n;
    empty.hidden = n > 0;
  }

  function say(text) {
    var div = document.createElement("div");
    div.className = "message warning";
    div.textContent = text;
    notice.appendChild(div);
  }

  function upsert(id, flash) {
    return fetch("/governance/approvals/" + id + "/row/", { credentials: "same-origin" })
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.text(); })
      .then(function (html) {
        var holder = document.createElement("tbody");
        holder.innerHTML = html.trim();
        var fresh = holder.querySelector("tr");
        var here = table.querySelector('tr[data-approval-row="' + id + '"]');
        if (!fresh || fresh.dataset.gone) {
          if (here) here.remove();
        } else if (here) {
          here.replaceWith(fresh);
        } else {
          table.appendChild(fresh);
        }
        if (fresh && !fresh.dataset.gone && flash) { fresh.classList.add("flash"); }
        refreshCount();
      })
      .catch(function () { /* the next message or reconnect catches up */ });
  }

  function catchUp() {
    return fetch(location.pathname, { credentials: "same-origin" })
      .then(function (r) { return r.text(); })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.querySelector("#approvals tbody");
        // Keep a row someone is typing a comment into; replace the rest.
        var typing = document.activeElement && table.contains(document.activeElement);
        if (fresh && !typing) { table.innerHTML = fresh.innerHTML; refreshCount(); }
      })
      .catch(function () {});
  }

  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var socket = new WebSocket(scheme + location.host + "/ws/approvals/");
    socket.onopen = function () {
      attempt = 0;
      document.body.dataset.approvalsLive = "true";
    };
    socket.onmessage = function (event) {
      var message = JSON.parse(event.data);
      if (message.type === "approval.requested") upsert(message.workload, true);
      else if (message.type === "approval.updated" || message.type === "approval.decided") upsert(message.workload, false);
      else if (message.type === "approval.escalated") {
        say("Escalated: request #" + message.workload + " has waited too long for a decision.");
        upsert(message.workload, true);
      }
    };
    socket.onclose = function () {
      document.body.dataset.approvalsLive = "false";
      var delay = Math.min(30000, 500 * Math.pow(2, attempt)) * (0.8 + Math.random() * 0.4);
      attempt += 1;
      setTimeout(function () { connect(); catchUp(); }, delay);
    };
  }
  connect();
})();
