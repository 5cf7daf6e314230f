/* The topology heatmap: racks (aggregated by the server) -> nodes x devices of one rack -> one node's
 * devices. Each level is one JSON call; the rack level is a few thousand cells even at 100k devices. */
(function () {
  "use strict";
  var STATE_COLORS = { free: "#d0d5dd", stranded: "#7a5af8", reserved: "#f79009", unhealthy: "#d92d20" };
  var TEAM_COLORS = ["#2f6feb", "#12b76a", "#0e9384", "#155eef", "#66c61c", "#0086c9", "#099250", "#444ce7"];
  var HIGHLIGHT = "#101828";
  var METRICS = {
    busy: { label: "busy", scale: [[0, "#f2f4f7"], [1, "#1849a9"]] },
    free: { label: "free", scale: [[0, "#f2f4f7"], [1, "#475467"]] },
    unhealthy: { label: "unhealthy", scale: [[0, "#f2f4f7"], [1, "#b42318"]] },
    reserved: { label: "reserved", scale: [[0, "#f2f4f7"], [1, "#dc6803"]] },
    stranded: { label: "stranded", scale: [[0, "#f2f4f7"], [1, "#6938ef"]] },
  };
  var CONFIG = { displayModeBar: false, responsive: true };
  var RACK_MARGIN = { l: 130, r: 20, t: 10, b: 30 };  // the rack chart's, kept by its preview too
  var COLORBAR_WIDTH = 90;

  /* Plotly draws its labels from a subset of HTML (<a href>, <span style>, <b>): a rack or node named
   * "<a href=...>" by an operator would be a link for everyone. Names are escaped to text first. */
  function plain(value) {
    // Without a "<" no tag starts; Plotly decodes &amp; &lt; &gt; back to the characters (not &quot;).
    return String(value).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  /* On the topology page Plotly is only preloaded (<link rel="preload">, downloading while the page and
   * the heatmap JSON load): running its 4.6 MB bundle blocks the page for seconds on a slow client, so
   * it runs once the rack map has drawn its preview (or when a chart is wanted first). Pages that load
   * Plotly with a plain <script> have window.Plotly already. */
  var plotlyPromise = null;
  function plotlyReady() {
    if (!plotlyPromise) {
      plotlyPromise = new Promise(function (resolve, reject) {
        if (window.Plotly) { resolve(); return; }
        var preload = document.querySelector('link[rel="preload"][data-plotly]');
        if (!preload) { reject(new Error("Plotly is not on this page")); return; }
        var script = document.createElement("script");
        script.src = preload.href;
        script.onload = function () { resolve(); };
        script.onerror = function () { reject(new Error("Plotly did not load")); };
        document.head.appendChild(script);
      });
    }
    return plotlyPromise;
  }

  /* After the next frame is painted (so what was just drawn is on screen before Plotly blocks). */
  function afterPaint(fn) {
    requestAnimationFrame(function () { setTimeout(fn, 0); });
  }

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } }).then(function (r) {
      if (!r.ok) throw new Error(url + " answered " + r.status);
      return r.json();
    });
  }

  /* The server gives each team its colour (by team, the same on every load); the palette is the fallback. */
  function teamColor(teams, team, colors) {
    if (colors && colors[team]) return colors[team];
    var i = teams.indexOf(team);
    return TEAM_COLORS[(i < 0 ? 0 : i) % TEAM_COLORS.length];
  }

  /* A legend of the teams drawn, in their colours, into `el` (if the page has one). */
  function teamLegend(el, teams, colors) {
    if (!el) return;
    el.innerHTML = "";
    teams.forEach(function (team) {
      var item = document.createElement("span");
      var swatch = document.createElement("i");
      swatch.style.background = teamColor(teams, team, colors);
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(team));
      el.appendChild(item);
    });
    el.hidden = !teams.length;
  }

  function discreteScale(colors) {
    var n = colors.length, scale = [];
    colors.forEach(function (c, i) { scale.push([i / n, c]); scale.push([(i + 1) / n, c]); });
    return scale;
  }

  function describeCounts(cell) {
    var c = cell.counts, parts = [];
    var teams = Object.keys(cell.teams || {}).map(function (t) { return t + " " + cell.teams[t]; });
    parts.push("busy " + c.busy + (teams.length ? " (" + teams.join(", ") + ")" : ""));
    ["free", "unhealthy", "reserved", "stranded"].forEach(function (k) { parts.push(k + " " + c[k]); });
    // The counts are physical devices (a partitioned GPU once, busy while any partition is): say what
    // the GPUs are cut into or shared by, and how much of that is in use, and how many are NICs.
    if (cell.partitions) {
      var used = cell.partitions_busy || 0;
      parts.push("partitions " + used + "/" + cell.partitions + " in use (" + Math.round(100 * used / cell.partitions) + "%)");
    }
    if (cell.shared) {
      parts.push("time-sliced " + (cell.shared_busy || 0) + "/" + cell.shared + " in use, " +
        Math.round(100 * (cell.share_use || 0)) + "% of their capacity taken");
    }
    if (cell.nics) parts.push("of which NICs " + cell.nics);
    return parts.join("<br>");
  }

  /* "3/7 partitions used" for a partitioned device, with the teams holding them; "" for any other. */
  function partitionNote(d) {
    if (!d.partitions) return "";
    var teams = Object.keys(d.partition_teams || {}).map(function (t) { return plain(t) + " " + d.partition_teams[t]; });
    return d.partitions_used + "/" + d.partitions.length + " partitions used" + (teams.length ? " (" + teams.join(", ") + ")" : "");
  }

  /* What a cell of the rack drill-down says on its face: a partitioned GPU its partitions in use, a NIC
   * that it is one, so neither passes for a whole GPU. */
  function cellMark(d) {
    if (d.partitions) return d.partitions_used + "/" + d.partitions.length;
    return d.kind === "nic" ? "NIC" : "";
  }

  /* ---- rack level ---- */
  function RackMap(el, options) {
    this.el = el;
    this.options = options || {};
    this.metric = "busy";
    this.data = null;
  }

  /* Resolves with the data as soon as it is drawn: as a canvas preview while Plotly's bundle is still
   * being parsed (seconds on a slow client: it is 4.6 MB), which the interactive chart replaces. */
  RackMap.prototype.load = function () {
    var self = this;
    return getJSON("/dashboard/api/heatmap/").then(function (data) {
      self.data = data; self.draw();
      if (!window.Plotly) afterPaint(function () { plotlyReady().then(function () { self.draw(); }); });
      return data;
    }, function (error) {
      plotlyReady();  // the rest of the page (drill-down) still wants it
      throw error;
    });
  };

  RackMap.prototype.grid = function () {
    var rows = this.data.rows, byRow = {}, width = 0;
    rows.forEach(function (r) { byRow[r] = []; });
    this.data.cells.forEach(function (cell) { (byRow[cell.row] = byRow[cell.row] || []).push(cell); });
    rows.forEach(function (r) { width = Math.max(width, byRow[r].length); });
    return { rows: rows, byRow: byRow, width: width };
  };

  /* z (the cell's value under the metric), hover text and rack id per cell, rows by block. */
  RackMap.prototype.matrix = function () {
    var g = this.grid(), metric = this.metric, z = [], text = [], ids = [];
    var teams = this.data.teams;
    g.rows.forEach(function (r) {
      var zr = [], tr = [], ir = [];
      for (var i = 0; i < g.width; i++) {
        var cell = g.byRow[r][i];
        if (!cell) { zr.push(null); tr.push(""); ir.push(null); continue; }
        var value;
        if (metric === "team") {
          var best = null, most = 0;
          Object.keys(cell.teams).forEach(function (t) { if (cell.teams[t] > most) { most = cell.teams[t]; best = t; } });
          value = best === null ? 0 : 1 + teams.indexOf(best);
        } else {
          value = cell.total ? cell.counts[metric] / cell.total : 0;
        }
        zr.push(value);
        tr.push("<b>" + plain(cell.name) + "</b> · " + plain(r) + "<br>" + cell.nodes + " nodes, " + cell.total + " devices<br>" + describeCounts(cell));
        ir.push(cell.id);
      }
      z.push(zr); text.push(tr); ids.push(ir);
    });
    return { grid: g, z: z, text: text, ids: ids };
  };

  RackMap.prototype.scale = function () {
    var teams = this.data.teams, colors = this.data.team_colors;
    if (this.metric === "team") {
      return {
        colorscale: discreteScale(["#eaecf0"].concat(teams.map(function (t) { return teamColor(teams, t, colors); }))),
        zmin: -0.5, zmax: teams.length + 0.5,
      };
    }
    return { colorscale: METRICS[this.metric].scale, zmin: 0, zmax: 1 };
  };

  RackMap.prototype.height = function (rows) { return Math.max(260, 28 * rows + 60); };

  RackMap.prototype.draw = function () {
    if (!this.data) return;  // a control changed before the map's data arrived: the load draws it
    if (window.Plotly) this.drawChart(); else this.drawPreview();
  };

  RackMap.prototype.drawChart = function () {
    var self = this, m = this.matrix(), g = m.grid, metric = this.metric, teams = this.data.teams;
    var preview = this.el.querySelector("canvas.hm-preview");
    if (preview) preview.remove();
    this.ids = m.ids;
    var scale = this.scale();
    var trace = {
      type: "heatmap", z: m.z, text: m.text, hoverinfo: "text", xgap: 2, ygap: 2,
      y: g.rows.map(plain), x: Array.from({ length: g.width }, function (_, i) { return i + 1; }),
      colorscale: scale.colorscale, zmin: scale.zmin, zmax: scale.zmax,
    };
    if (metric === "team") {
      trace.colorbar = { tickvals: [0].concat(teams.map(function (_, i) { return i + 1; })), ticktext: ["idle"].concat(teams.map(plain)) };
    } else {
      trace.colorbar = { title: { text: METRICS[metric].label }, tickformat: ".0%" };
    }
    var layout = {
      margin: RACK_MARGIN, height: this.height(g.rows.length),
      xaxis: { title: { text: "rack in block" }, dtick: 1, showgrid: false },
      yaxis: { autorange: "reversed", showgrid: false, type: "category" },
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    };
    Plotly.react(this.el, [trace], layout, CONFIG);
    if (!this.bound) {
      this.bound = true;
      this.el.on("plotly_click", function (event) {
        var p = event.points[0];
        var id = self.ids[p.pointIndex[0]][p.pointIndex[1]];
        if (id !== null && self.options.onRack) self.options.onRack(id);
      });
    }
  };

  /* The same cells, colours and row labels on a plain canvas, without hover or click: what the page
   * shows until Plotly has loaded (drawChart removes it). */
  RackMap.prototype.drawPreview = function () {
    var m = this.matrix(), g = m.grid, scale = this.scale();
    var canvas = this.el.querySelector("canvas.hm-preview");
    if (!canvas) {
      canvas = document.createElement("canvas");
      canvas.className = "hm-preview";
      canvas.setAttribute("role", "img");
      canvas.setAttribute("aria-label", "Rack heatmap (the interactive chart is loading)");
      this.el.appendChild(canvas);
    }
    var width = Math.max(this.el.clientWidth, 320), height = this.height(g.rows.length), ratio = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * ratio); canvas.height = Math.round(height * ratio);
    canvas.style.width = width + "px"; canvas.style.height = height + "px";
    var ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    // The chart's margins and room for its colour bar, so the chart replaces it in place.
    var left = RACK_MARGIN.l, top = RACK_MARGIN.t, right = RACK_MARGIN.r + COLORBAR_WIDTH, bottom = RACK_MARGIN.b;
    var cellW = (width - left - right) / Math.max(g.width, 1), cellH = (height - top - bottom) / Math.max(g.rows.length, 1);
    ctx.font = "12px system-ui, sans-serif"; ctx.textAlign = "right"; ctx.textBaseline = "middle";
    var span = scale.zmax - scale.zmin;
    m.z.forEach(function (row, r) {
      var y = top + r * cellH;
      ctx.fillStyle = "#444";
      ctx.fillText(String(g.rows[r]), left - 6, y + cellH / 2);
      row.forEach(function (value, i) {
        if (value === null) return;
        ctx.fillStyle = colorAt(scale.colorscale, (value - scale.zmin) / span);
        ctx.fillRect(left + i * cellW + 1, y + 1, Math.max(cellW - 2, 1), Math.max(cellH - 2, 1));
      });
    });
    canvas.dataset.cells = String(this.data.cells.length);
  };

  function rgb(hex) {
    var n = parseInt(hex.slice(1), 16);
    return [(n >> 16) & 255, (n >> 8) & 255, n & 255];
  }

  /* The colour a Plotly colorscale ([[position, "#rrggbb"], ...]) gives position t (0..1): linear
   * between the stops around it, as Plotly interpolates. */
  function colorAt(scale, t) {
    t = Math.min(1, Math.max(0, isFinite(t) ? t : 0));
    for (var i = 1; i < scale.length; i++) {
      if (t <= scale[i][0] || i === scale.length - 1) {
        var a = scale[i - 1], b = scale[i], f = b[0] > a[0] ? (t - a[0]) / (b[0] - a[0]) : 0;
        var ca = rgb(a[1]), cb = rgb(b[1]);
        return "rgb(" + ca.map(function (c, k) { return Math.round(c + (cb[k] - c) * Math.min(1, Math.max(0, f))); }).join(",") + ")";
      }
    }
    return scale[0][1];
  }

  RackMap.prototype.patch = function (cells) {
    if (!this.data || !cells || !cells.length) return;
    var byId = {};
    this.data.cells.forEach(function (c) { byId[c.id] = c; });
    cells.forEach(function (c) {
      var cell = byId[c.id];
      if (!cell) return;
      cell.counts = c.counts; cell.total = c.total; cell.teams = c.teams;
      Object.keys(c.teams).forEach(function (t) { if (this.data.teams.indexOf(t) < 0) this.data.teams.push(t); }, this);
    }, this);
    this.draw();
  };

  /* ---- rack -> nodes x devices ---- */
  function drawRack(el, data, options) {
    options = options || {};
    var nodes = data.nodes.map(function (n) { return n.name; });
    var perNode = {};
    data.devices.forEach(function (d) { (perNode[d.node] = perNode[d.node] || []).push(d); });
    // GPUs first, then the NICs, so a node's NICs sit at its row's end and columns stay GPU indexes.
    Object.keys(perNode).forEach(function (n) {
      perNode[n] = perNode[n].filter(function (d) { return d.kind !== "nic"; }).concat(perNode[n].filter(function (d) { return d.kind === "nic"; }));
    });
    var marks = [];
    var width = 0;
    nodes.forEach(function (n) { width = Math.max(width, (perNode[n] || []).length); });
    var teams = [];
    data.devices.forEach(function (d) { if (d.team && teams.indexOf(d.team) < 0) teams.push(d.team); });
    teams.sort();
    var palette = [STATE_COLORS.free, STATE_COLORS.stranded, STATE_COLORS.reserved, STATE_COLORS.unhealthy, HIGHLIGHT]
      .concat(teams.map(function (t) { return teamColor(teams, t, data.team_colors); }));
    var code = { free: 0, stranded: 1, reserved: 2, unhealthy: 3 };
    var z = [], text = [], ids = [];
    nodes.forEach(function (n) {
      var zr = [], tr = [], ir = [], list = perNode[n] || [];
      for (var i = 0; i < width; i++) {
        var d = list[i];
        if (!d) { zr.push(null); tr.push(""); ir.push(null); continue; }
        // A busy device that failed or sits on a cordoned node shows as unavailable at once (its team in the hover).
        var value = d.state === "busy" && !d.unavailable ? (d.highlight ? 4 : 5 + teams.indexOf(d.team))
          : code[d.state === "busy" ? "unhealthy" : d.state];
        zr.push(value);
        var who = d.partitions ? "" : d.team ? "<br>" + plain(d.team) + (d.workload ? " · " + plain(d.workload.name) : " (another team's workload)") : "";
        var shown = d.state === "busy" && d.unavailable ? "busy, " + (d.health !== "Healthy" ? plain(d.health).toLowerCase() : d.cordoned ? "node cordoned" : "tainted") : d.state;
        var kind = d.kind === "nic" ? " · NIC" : d.partitions ? " · partitioned GPU" : "";
        var note = partitionNote(d);
        tr.push("<b>" + plain(d.node) + "/" + plain(d.name) + "</b>" + kind + " · " + shown + who + (note ? "<br>" + note : "") +
          "<br>" + plain(d.health) + (d.cordoned ? " · node cordoned" : "") +
          (d.taints && d.taints.length ? " · tainted" : "") + "<br>" + plain(d.classes.join(", ")));
        ir.push(d);
        var mark = cellMark(d);
        // On a white label, so it reads on every state and team colour alike.
        if (mark) marks.push({ x: "dev " + i, y: plain(n), text: mark, showarrow: false, bgcolor: "#ffffff", borderpad: 1, font: { size: 10, color: "#101828" } });
      }
      z.push(zr); text.push(tr); ids.push(ir);
    });
    var trace = {
      type: "heatmap", z: z, text: text, hoverinfo: "text", xgap: 3, ygap: 3, showscale: false,
      y: nodes.map(plain), x: Array.from({ length: width }, function (_, i) { return "dev " + i; }),
      colorscale: discreteScale(palette), zmin: -0.5, zmax: palette.length - 0.5,
    };
    var layout = {
      margin: { l: 90, r: 10, t: 26, b: 30 }, height: Math.max(160, 34 * nodes.length + 70),
      title: { text: "rack " + plain(data.rack.name) + " <span style='color:#667085'>" + plain(data.rack.path) + "</span>", font: { size: 13 }, x: 0 },
      yaxis: { autorange: "reversed", type: "category" }, xaxis: { type: "category" },
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", annotations: marks,
    };
    Plotly.react(el, [trace], layout, CONFIG);
    el._brokerIds = ids;
    if (!el._brokerBound) {
      el._brokerBound = true;
      el.on("plotly_click", function (event) {
        var p = event.points[0];
        var d = el._brokerIds[p.pointIndex[0]][p.pointIndex[1]];
        if (d && el._brokerOnDevice) el._brokerOnDevice(d);
      });
    }
    el._brokerOnDevice = options.onDevice || null;
    teamLegend(options.legend, teams, data.team_colors);
    return { teams: teams };
  }

  function loadRack(el, rackId, options) {
    options = options || {};
    var url = "/dashboard/api/heatmap/rack/" + rackId + "/" + (options.highlight ? "?highlight=" + options.highlight : "");
    return Promise.all([getJSON(url), plotlyReady()]).then(function (got) { drawRack(el, got[0], options); return got[0]; });
  }

  window.BrokerTopology = {
    RackMap: RackMap, drawRack: drawRack, teamLegend: teamLegend, loadRack: loadRack, getJSON: getJSON, plotlyReady: plotlyReady,
    partitionNote: partitionNote, cellMark: cellMark,
    STATE_COLORS: STATE_COLORS, TEAM_COLORS: TEAM_COLORS, HIGHLIGHT: HIGHLIGHT,
  };
})();
