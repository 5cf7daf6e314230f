(function () {
  "use strict";
  var el = document.getElementById("cycles-chart");
  if (!el || !window.Plotly) return;

  function draw(series) {
    var traces = [
      { x: series.at, y: series.admitted, name: "admitted", type: "bar", marker: { color: "#12b76a" } },
      { x: series.at, y: series.preempted, name: "preempted", type: "bar", marker: { color: "#d92d20" } },
      { x: series.at, y: series.duration_ms, name: "cycle ms", type: "scatter", mode: "lines", yaxis: "y2",
        line: { color: "#2f6feb", width: 1.5 } },
    ];
    var layout = {
      barmode: "group", margin: { l: 40, r: 50, t: 10, b: 30 }, legend: { orientation: "h", y: 1.12 },
      yaxis: { title: { text: "workloads" }, rangemode: "tozero" },
      yaxis2: { title: { text: "ms" }, overlaying: "y", side: "right", rangemode: "tozero" },
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    };
    Plotly.react(el, traces, layout, { displayModeBar: false, responsive: true });
  }

  draw(JSON.parse(document.getElementById("cycle-series").textContent));
  // Read with the page's live regions, as one read: on every message and on the catch-up after a
  // reconnect (a delta listener missed the cycles committed while the socket was down).
  window.BrokerLive.onChange(function () {
    return fetch("/dashboard/api/overview/", { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.json(); })
      .then(function (data) { draw(data.series); });
  });
})();
