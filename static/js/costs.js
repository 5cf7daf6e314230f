// Finance page: four charts from the cost API and a running-cost ticker over ws/costs/ (polling if the
// socket cannot connect).
(function () {
  "use strict";
  const params = new URLSearchParams(window.location.search);
  const windowParam = params.get("window") || "30d";
  const step = params.get("step") || "day";
  // The bar chart of the costliest workloads: the API sums the rest into one line, which the chart leaves out.
  const TOP_WORKLOADS = 15;
  const colors = { allocated: "#2f6feb", idle: "#d0d5dd", stranded: "#7a5af8", unhealthy: "#d92d20",
                   reserved_unused: "#f79009", pending: "#12b76a" };
  const errorBox = document.getElementById("cost-error");
  const MONEY_AXIS = { title: { text: "cost (USD)" }, tickprefix: "$", separatethousands: true };
  // Each chart says it is loading until its data is drawn (or says why it is not).
  const drawn = (id) => document.getElementById(id).setAttribute("aria-busy", "false");
  const failed = (message) => document.querySelectorAll(".chart[aria-busy='true']").forEach((el) => {
    el.setAttribute("aria-busy", "false"); el.dataset.error = message;
  });

  function api(path, query) {
    const url = path + "?" + new URLSearchParams(query).toString();
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } }).then((r) =>
      r.json().then((body) => {
        if (!r.ok) { throw new Error(Object.values(body).flat().join(" ")); }
        return body;
      }));
  }
  const num = (value) => Number(value || 0);
  const money = (value) => num(value).toLocaleString(undefined, { style: "currency", currency: "USD" });
  // Device-hours come to four places: a share of a shared device or a partition bills fractions of one.
  const deviceHours = (value) => num(value).toLocaleString(undefined,
    { minimumFractionDigits: 1, maximumFractionDigits: 4 }) + " device-h";

  function stacked(report) {
    const x = report.steps.map((s) => s.start);
    const traces = ["allocated", "reserved_unused", "unhealthy", "stranded", "idle"].map((name) => ({
      type: "bar", name: name.replace("_", " "), x: x, marker: { color: colors[name] },
      y: report.steps.map((s) => num(s.totals[name].cost)),
    }));
    Plotly.newPlot("stacked", traces, { barmode: "stack", margin: { t: 10 }, yaxis: MONEY_AXIS },
                   { displaylogo: false, responsive: true });
  }

  function idleVsPending(report, pending) {
    const x = report.steps.map((s) => s.start);
    Plotly.newPlot("idle-vs-pending", [
      { type: "scatter", mode: "lines", name: "idle + stranded", x: x, line: { color: colors.stranded },
        y: report.steps.map((s) => num(s.totals.idle.cost) + num(s.totals.stranded.cost)) },
      { type: "scatter", mode: "lines", name: "pending (not billed)", x: pending.steps.map((s) => s.start),
        line: { color: colors.pending, dash: "dot" }, y: pending.steps.map((s) => num(s.total.cost)) },
    ], { margin: { t: 10 }, yaxis: MONEY_AXIS }, { displaylogo: false, responsive: true });
  }

  function treemap(report) {
    const ids = [], labels = [], parents = [], values = [];
    const teams = {};
    Object.entries(report.totals.allocations).forEach(([key, row]) => {
      const [team, deviceClass] = key.split("/");
      teams[team] = (teams[team] || 0) + num(row.cost);
      ids.push(key); labels.push(deviceClass); parents.push(team); values.push(num(row.cost));
    });
    Object.entries(teams).forEach(([team, cost]) => { ids.push(team); labels.push(team); parents.push(""); values.push(cost); });
    Plotly.newPlot("treemap", [{ type: "treemap", ids, labels, parents, values, branchvalues: "total",
                                 texttemplate: "%{label}<br>%{value:$,.2f}" }],
                   { margin: { t: 10, l: 0, r: 0, b: 0 } }, { displaylogo: false, responsive: true });
  }

  function topWorkloads(report) {
    const rows = Object.entries(report.totals.allocations).filter(([key]) => key !== report.other)
      .sort((a, b) => num(b[1].cost) - num(a[1].cost)).slice(0, TOP_WORKLOADS).reverse();
    Plotly.newPlot("top-workloads", [{ type: "bar", orientation: "h", marker: { color: colors.allocated },
      x: rows.map(([, row]) => num(row.cost)), y: rows.map(([key]) => key),
      text: rows.map(([, row]) => deviceHours(row.device_hours)), hoverinfo: "x+y+text" }],
      { margin: { t: 10, l: 220 }, xaxis: MONEY_AXIS }, { displaylogo: false, responsive: true });
  }

  const base = { window: windowParam, step: step };
  Promise.all([
    api("/api/costs/allocation", { ...base, aggregate: "team" }),
    api("/api/costs/pending", { ...base, aggregate: "team" }),
    api("/api/costs/allocation", { window: windowParam, step: "month", aggregate: "team,device_class" }),
    api("/api/costs/allocation", { window: windowParam, step: "month", aggregate: "workload", top: TOP_WORKLOADS }),
  ]).then(([byTeam, pending, byClass, byWorkload]) => {
    stacked(byTeam); drawn("stacked");
    idleVsPending(byTeam, pending); drawn("idle-vs-pending");
    treemap(byClass); drawn("treemap");
    topWorkloads(byWorkload); drawn("top-workloads");
  }).catch((error) => { errorBox.textContent = error.message; failed(error.message); });

  // --- ticker ---
  const ticker = document.getElementById("ticker");
  function show(payload) {
    ticker.querySelectorAll("[data-field]").forEach((el) => {
      const [group, name] = el.dataset.field.split(".");
      el.textContent = money(payload[group] && payload[group][name]);
    });
    ticker.dataset.updated = payload.at;
    document.getElementById("ticker-as-of").textContent = "As of " + new Date(payload.at).toLocaleString() + ".";
  }
  let polling = null;
  function poll() {
    if (polling) { return; }
    const once = () => api(ticker.dataset.poll, {}).then(show).catch(() => {});
    once();
    polling = setInterval(once, 5000);
  }
  try {
    const scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + window.location.host + ticker.dataset.ws);
    socket.onmessage = (event) => show(JSON.parse(event.data));
    socket.onerror = poll;
    socket.onclose = poll;
  } catch (e) { poll(); }
})();
