(function () {
  "use strict";
  var T = window.BrokerTopology;
  var isOperator = JSON.parse(document.getElementById("is-operator").textContent);
  var params = new URLSearchParams(location.search);
  var current = { rack: null, node: null };
  var drillEl = document.getElementById("drill");

  function csrf() {
    var m = document.cookie.match(/(?:^|; )csrftoken=([^;]+)/);
    return m ? decodeURIComponent(m[1]) : "";
  }

  function el(tag, attrs, children) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === "text") e.textContent = attrs[k]; else if (k === "dataset") Object.assign(e.dataset, attrs[k]); else e.setAttribute(k, attrs[k]);
    });
    (children || []).forEach(function (c) { if (c) e.appendChild(typeof c === "string" ? document.createTextNode(c) : c); });
    return e;
  }

  function actionForm(action, fields, label, confirmText, cls) {
    var form = el("form", { method: "post", action: action, dataset: { confirm: confirmText } });
    form.appendChild(el("input", { type: "hidden", name: "csrfmiddlewaretoken", value: csrf() }));
    form.appendChild(el("input", { type: "hidden", name: "next", value: "/topology/?rack=" + current.rack + "&node=" + current.node }));
    Object.keys(fields).forEach(function (k) { form.appendChild(el("input", { type: "hidden", name: k, value: fields[k] })); });
    form.appendChild(el("input", { name: "reason", placeholder: "reason", "aria-label": "reason" }));
    form.appendChild(el("button", { type: "submit", class: cls || "secondary small", text: label }));
    return form;
  }

  var rackMap = new T.RackMap(document.getElementById("heatmap"), { onRack: openRack });

  function summarise(data) {
    var totals = { busy: 0, free: 0, unhealthy: 0, reserved: 0, stranded: 0 };
    data.cells.forEach(function (c) { Object.keys(totals).forEach(function (k) { totals[k] += c.counts[k]; }); });
    document.getElementById("rack-summary").textContent = data.cells.length + " racks · " +
      Object.keys(totals).map(function (k) { return k + " " + totals[k]; }).join(" · ");
  }

  function crumbs(rack, node) {
    var c = document.getElementById("crumbs");
    c.innerHTML = "";
    var all = el("a", { href: "#", text: "All racks" });
    all.addEventListener("click", function (e) { e.preventDefault(); closeDrill(); });
    c.appendChild(all);
    if (rack) { c.appendChild(document.createTextNode(" › rack ")); c.appendChild(el("strong", { text: rack.name + " (" + rack.path + ")" })); }
    if (node) { c.appendChild(document.createTextNode(" › node ")); c.appendChild(el("strong", { text: node })); }
  }

  function closeDrill() {
    current = { rack: null, node: null };
    document.getElementById("drill-card").hidden = true;
    document.getElementById("node-card").hidden = true;
  }

  function openRack(rackId, quiet) {
    current.rack = rackId;
    document.getElementById("drill-card").hidden = false;
    return T.loadRack(drillEl, rackId, { onDevice: function (d) { openNode(d.node_id, d.id); }, legend: document.getElementById("team-legend") }).then(function (data) {
      current.rackData = data;
      crumbs(data.rack, null);
      var buttons = document.getElementById("node-buttons");
      buttons.innerHTML = "";
      data.nodes.forEach(function (n) {
        var b = el("button", { type: "button", class: "secondary small", dataset: { node: n.id }, text: n.name + (n.cordoned ? " (cordoned)" : "") });
        b.addEventListener("click", function () { openNode(n.id); });
        buttons.appendChild(b);
      });
      if (!quiet) document.getElementById("drill-card").scrollIntoView({ behavior: "smooth", block: "start" });
      return data;
    });
  }

  function openNode(nodeId, focusDevice, quiet) {
    current.node = nodeId;
    return T.getJSON("/dashboard/api/heatmap/node/" + nodeId + "/").then(function (data) {
      var node = data.node;
      crumbs(current.rackData ? current.rackData.rack : null, node.name);
      document.getElementById("node-card").hidden = false;
      document.getElementById("node-title").textContent = "Node " + node.name + (node.cordoned ? " — cordoned" : "") + " · " + node.path + (node.cluster ? " · cluster " + node.cluster : "");
      var actions = document.getElementById("node-actions");
      actions.innerHTML = "";
      if (isOperator) {
        actions.appendChild(node.cordoned
          ? actionForm("/nodes/" + node.id + "/cordon/", { cordoned: "false" }, "Uncordon node", "Uncordon " + node.name + "? It takes new work again.", "small")
          : actionForm("/nodes/" + node.id + "/cordon/", { cordoned: "true" }, "Cordon node", "Cordon " + node.name + "? It takes no new work; running work stays.", "danger small"));
      }
      var tbody = document.querySelector("#devices tbody");
      tbody.innerHTML = "";
      // A partitioned GPU's partitions follow it, marked as its parts.
      var rows = [];
      data.devices.forEach(function (d) { rows.push(d); (d.partitions || []).forEach(function (p) { rows.push(p); }); });
      rows.forEach(function (d) {
        var what = d.kind === "partition" ? " (partition)" : d.kind === "nic" ? " (NIC)" : "";
        if (d.partitions) what = " · " + d.partitions_used + "/" + d.partitions.length + " partitions used";
        var held = d.workload ? el("a", { href: d.workload.url, text: d.team + " / " + d.workload.name }) : (d.team ? d.team + " (not yours to see)" : "—");
        var tr = el("tr", { dataset: { device: d.id, state: d.state, kind: d.kind }, class: d.kind === "partition" ? "partition-row" : "" }, [
          el("td", { class: "mono", text: (d.kind === "partition" ? "↳ " : "") + d.node + "/" + d.name + what }),
          el("td", { class: "small mono", text: d.pool ? d.driver + " / " + d.pool : "—" }),
          el("td", {}, [el("span", { class: "badge", text: d.state + (d.state === "busy" && d.unavailable ? " · takes no new work" : ""),
            dataset: { deviceState: d.state === "busy" && d.unavailable ? "unhealthy" : d.state } })]),
          el("td", { text: d.health + (d.taints.length ? " · " + d.taints.map(function (t) { return t.key; }).join(",") : "") }),
          el("td", { class: "small", text: d.classes.join(", ") }),
          el("td", {}, [held]),
          el("td", { class: "small mono", text: Object.keys(d.attributes).map(function (k) { return k + "=" + d.attributes[k]; }).join(" ") }),
        ]);
        if (isOperator) {
          var healthy = d.health === "Healthy";
          tr.appendChild(el("td", {}, [actionForm("/devices/" + d.id + "/health/", { health: healthy ? "Unhealthy" : "Healthy" },
            healthy ? "Mark unhealthy" : "Mark healthy", "Mark " + d.node + "/" + d.name + (healthy ? " unhealthy" : " healthy") + "?",
            healthy ? "danger small" : "small")]));
        }
        if (focusDevice === d.id) tr.classList.add("flash");
        tbody.appendChild(tr);
      });
      if (!quiet) document.getElementById("node-card").scrollIntoView({ behavior: "smooth", block: "nearest" });
    });
  }

  document.getElementById("metric").addEventListener("change", function (e) { rackMap.metric = e.target.value; rackMap.draw(); });

  rackMap.load().then(function (data) {
    summarise(data);
    var rack = params.get("rack"), node = params.get("node");
    if (rack && rack !== "null") openRack(rack).then(function () { if (node && node !== "null") openNode(node); });
  });

  // Every change the socket announces rereads the whole rack map and the open rack and node: a
  // completion, a health change or a cordon is shown as it is now, whichever message carried it.
  window.BrokerLive.onChange(function () {
    return rackMap.load().then(function (data) {
      summarise(data);
      if (!current.rack) return null;
      var node = current.node;
      return openRack(current.rack, true).then(function () { return node ? openNode(node, null, true) : null; });
    });
  });
  window.BrokerTopologyPage = { openRack: openRack, openNode: openNode, rackMap: rackMap };
})();
