// The experiment page of the depthprune gateway (server/ui.py serves it; no build step).
// Every name is put on the page as a text node (never as HTML), the token lives in sessionStorage and
// travels in the Authorization header only, and the page polls its data every second.
"use strict";

(function () {
  const TOKEN_KEY = "depthprune-ui-token";
  const POLL_MS = 1000;
  const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"];
  const CHARTS = [
    { measure: "nll_delta", title: "NLL delta: arm − control, nats per token (lower is better)", none: 0 },
    { measure: "agreement_delta", title: "top-1 agreement: arm − control", none: 0 },
    { measure: "tpot_ratio", title: "TPOT ratio: arm / control, log scale (below 1 is faster)", none: 1, log: true },
    { measure: "e2el_ratio", title: "end-to-end latency ratio: arm / control, log scale", none: 1, log: true },
  ];
  const main = document.getElementById("main");
  const statusLine = document.getElementById("status");
  let timer = null;

  class NeedLogin extends Error {}

  // -- DOM helpers: text only ----------------------------------------------------------------------
  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "text") node.textContent = String(value);
      else if (key === "data") Object.assign(node.dataset, value);
      else if (key === "on") for (const [event, handler] of Object.entries(value)) node.addEventListener(event, handler);
      else node.setAttribute(key, String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function fmt(value, digits = 3, signed = false) {
    if (value === null || value === undefined || Number.isNaN(value)) return "—";
    const text = Math.abs(value) >= 1000 ? value.toFixed(0) : value.toFixed(digits);
    return signed && value > 0 ? "+" + text : text;
  }

  // A figure and, below it, its confidence sequence.
  function figureCell(value, bounds, signed = false) {
    if (value === null || value === undefined) return el("td", { text: "—" });
    return el(
      "td",
      { class: "figure" },
      el("span", { text: fmt(value, 3, signed) }),
      bounds ? el("small", { text: `[${fmt(bounds[0])}, ${fmt(bounds[1])}]` }) : null
    );
  }

  function pct(value) {
    return value === null || value === undefined ? "—" : (100 * value).toFixed(1) + " %";
  }

  function when(seconds) {
    return new Date(seconds * 1000).toLocaleString();
  }

  function verdict(text) {
    return el("span", { class: "verdict verdict-" + (text || "none"), text: text || "—" });
  }

  // -- talking to the gateway ----------------------------------------------------------------------
  function token() {
    return sessionStorage.getItem(TOKEN_KEY);
  }

  async function api(path, options = {}) {
    const headers = Object.assign({}, options.headers || {});
    if (token()) headers.authorization = "Bearer " + token();
    const response = await fetch(path, Object.assign({}, options, { headers, cache: "no-store" }));
    if (response.status === 401 && path.startsWith("/ui/")) {
      showLogin(token() ? "That token was refused." : "");
      throw new NeedLogin();
    }
    return response;
  }

  async function errorMessage(response) {
    try {
      const body = await response.json();
      return (body.error && body.error.message) || JSON.stringify(body);
    } catch (error) {
      return response.statusText;
    }
  }

  function showLogin(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    clearTimeout(timer);
    main.replaceChildren();
    document.getElementById("login").hidden = false;
    document.getElementById("logout").hidden = true;
    document.getElementById("login-error").textContent = message;
    document.getElementById("token").focus();
  }

  function setStatus(text, failed) {
    statusLine.textContent = text;
    statusLine.className = failed ? "error" : "";
  }

  // -- the list of experiments -----------------------------------------------------------------------
  function experimentLink(name) {
    return el("a", { href: "/ui/experiments/" + encodeURIComponent(name), text: name });
  }

  function renderList(data) {
    const rows = data.experiments.map((experiment) =>
      el(
        "tr",
        {},
        el("td", {}, experimentLink(experiment.name)),
        el("td", { text: experiment.version }),
        el("td", { text: experiment.control }),
        el("td", { text: pct(experiment.shadow_rate) }),
        el(
          "td",
          {},
          el(
            "ul",
            { class: "arms" },
            experiment.arms.map((arm) =>
              el(
                "li",
                {},
                el("span", { class: "arm-name", text: arm.name }),
                ` ${arm.variant} · weight ${fmt(arm.weight, 2)} (${pct(arm.share)}) · ${arm.requests ?? 0} requests · `,
                arm.control ? "control" : ["quality ", verdict(arm.quality), " speed ", verdict(arm.speed)]
              )
            )
          )
        )
      )
    );
    const table = el(
      "table",
      { id: "experiments" },
      el("thead", {}, el("tr", {}, ["experiment", "version", "control", "shadow", "arms"].map((h) => el("th", { text: h })))),
      el("tbody", {}, rows)
    );
    const notes = [];
    if (data.pending) notes.push(el("p", { class: "error", text: "Experiments not loaded yet: " + data.pending }));
    if (!rows.length) notes.push(el("p", { text: "This gateway routes no experiment." }));
    main.replaceChildren(el("h1", { text: "Experiments" }), ...notes, table);
  }

  async function pollList() {
    try {
      const response = await api("/ui/api/experiments");
      if (!response.ok) throw new Error(await errorMessage(response));
      renderList(await response.json());
      setStatus("updated " + new Date().toLocaleTimeString(), false);
    } catch (error) {
      if (error instanceof NeedLogin) return;
      setStatus("cannot read the experiments: " + error.message, true);
    }
    timer = setTimeout(pollList, POLL_MS);
  }

  // -- one experiment ------------------------------------------------------------------------------
  const view = {
    name: null,
    state: null,
    points: [],
    seq: -1,
    started: null,
    fields: [],
    maxPoints: 720,
    charts: {},
    chartArms: "",
    armsKey: "",
    historyKey: "",
    samples: null,
  };

  function colorOf(arm) {
    const index = view.state.arms.findIndex((a) => a.name === arm);
    return PALETTE[(index < 0 ? 0 : index) % PALETTE.length];
  }

  function fade(color) {
    return color + "33";
  }

  function skeleton() {
    const charts = CHARTS.map((chart) =>
      el(
        "section",
        { class: "chart", id: "chart-" + chart.measure, data: { measure: chart.measure, points: "0", bands: "0" } },
        el("h3", { text: chart.title }),
        el("div", { class: "legend" }),
        el("div", { class: "plot" })
      )
    );
    main.replaceChildren(
      el("h1", {}, "Experiment ", el("span", { id: "experiment-name", text: view.name })),
      el("p", { id: "summary" }),
      el("div", { id: "notice", hidden: true, role: "status" }),
      el("section", { id: "arms-section" }, el("h2", { text: "Arms" }), el("div", { id: "arms" })),
      el(
        "section",
        { id: "charts-section" },
        el("h2", { text: "Against the control, over time: 95 % confidence sequences (valid at every look)" }),
        el("p", {
          class: "hint",
          text: "Dashed grey: no change. Dotted red (NLL): the quality margin. Vertical lines: changes of the " +
            "experiment (red: a guardrail stopped an arm).",
        }),
        el("div", { id: "charts" }, charts)
      ),
      el("section", { id: "history-section" }, el("h2", { text: "Changes" }), el("div", { id: "history" }))
    );
  }

  function notice(kind, text) {
    const box = document.getElementById("notice");
    box.className = "notice notice-" + kind;
    box.replaceChildren(el("span", { text }), el("button", { type: "button", class: "dismiss", text: "×", on: { click: () => (box.hidden = true) } }));
    box.hidden = false;
  }

  function renderSummary(state) {
    const guards = state.guardrails
      ? Object.entries(state.guardrails)
          .filter(([, value]) => value !== null)
          .map(([key, value]) => `${key} ${value}`)
          .join(", ")
      : "";
    const sampled = state.figures ? "figures of " + new Date(state.figures.time * 1000).toLocaleTimeString() : "no sample yet";
    const peers = state.peers ? Object.entries(state.peers) : [];
    const down = peers.filter(([, error]) => error !== null);
    const parts = [
      `version ${state.version}`,
      `control ${state.control}`,
      `shadow rate ${pct(state.shadow_rate)}`,
      `margin ${state.margin} nats/token`,
      guards ? `guardrails: ${guards}` : "no guardrails",
      `${sampled} (sampled every ${state.interval_s} s)`,
    ];
    if (peers.length) parts.push(`gateways added: this one and ${peers.length - down.length} of ${peers.length} peers`);
    const summary = document.getElementById("summary");
    summary.replaceChildren(parts.join(" · "));
    for (const [peer, error] of down) summary.append(el("br"), el("span", { class: "error", text: `peer ${peer} left out: ${error}` }));
  }

  function renderArms(state) {
    const figures = (state.figures && state.figures.arms) || {};
    const key = JSON.stringify([state.version, state.arms, figures, state.guardrail, state.viewer]);
    if (key === view.armsKey) return;
    view.armsKey = key;
    const header = ["arm", "variant", "removed blocks", "weight", "share", "requests", "shadow scored", "dropped",
      "dense NLL", "top-1 agreement", "NLL delta", "quality", "TPOT ratio", "E2EL ratio", "speed", ""];
    const rows = state.arms.map((arm) => {
      const f = figures[arm.name] || {};
      const versus = f.vs_control || null;
      const stop = state.guardrail[arm.name];
      const removed = arm.removed_blocks.length ? `${arm.removed_blocks.join(", ")} (of ${arm.num_blocks ?? "?"})` : "none";
      const action = arm.weight > 0 && !arm.control
        ? el("button", { type: "button", class: "stop", data: { arm: arm.name }, text: "stop this arm", on: { click: () => stopArm(arm.name) } })
        : null;
      return el(
        "tr",
        { data: { arm: arm.name } },
        el("td", {}, el("span", { class: "swatch", style: null }), el("span", { class: "arm-name", text: arm.name }), arm.control ? " (control)" : ""),
        el("td", { text: arm.variant + (arm.objective ? ` (${arm.objective})` : "") }),
        el("td", { text: removed }),
        el("td", { class: "weight", text: fmt(arm.weight, 2) }),
        el("td", { text: pct(arm.share) }),
        el("td", { class: "requests", text: f.requests ?? "—" }),
        el("td", { text: f.shadow_scored ?? "—" }),
        el("td", { text: f.shadow_dropped ?? "—" }),
        figureCell(f.dense_nll, f.dense_nll_cs95),
        figureCell(f.top1_agreement, f.top1_agreement_cs95),
        figureCell(versus && versus.nll_delta, versus && versus.nll_delta_cs95, true),
        el("td", {}, versus ? verdict(versus.quality) : "—"),
        figureCell(versus && versus.tpot_ratio, versus && versus.tpot_ratio_cs95),
        figureCell(versus && versus.e2el_ratio, versus && versus.e2el_ratio_cs95),
        el("td", {}, versus ? verdict(versus.speed) : "—",
          arm.beyond_ideal ? el("div", { class: "beyond-ideal", text: `TPOT ratio wholly below ${fmt(arm.ideal_tpot_ratio, 3)}, the most its removed blocks can give: an artefact until explained, not a gain` }) : null,
          stop ? el("div", { class: "guardrail", text: `stopped by guardrail (v${stop.version})` }) : null),
        el("td", {}, action)
      );
    });
    const table = el("table", { id: "arms-table" }, el("thead", {}, el("tr", {}, header.map((h) => el("th", { text: h })))), el("tbody", {}, rows));
    for (const row of table.querySelectorAll("tbody tr")) row.querySelector(".swatch").style.background = colorOf(row.dataset.arm);
    const notes = [];
    if (state.shadow_rate > 0) notes.push(el("p", { class: "hint shadow-note", text: `Shadow rate ${pct(state.shadow_rate)}: the control's engine also scores the arms' answers, which slows the control and so flatters every other arm's speed ratios; decide speed on traffic with shadow scoring off or at a low rate.` }));
    if (!state.viewer.admin) notes.push(el("p", { class: "hint", text: "Stopping an arm needs the admin token." }));
    document.getElementById("arms").replaceChildren(table, ...notes);
    for (const button of document.querySelectorAll("button.stop")) button.disabled = !state.viewer.admin;
  }

  function renderHistory(state) {
    const key = JSON.stringify([state.history, state.history_error]);
    if (key === view.historyKey) return;
    view.historyKey = key;
    const rows = state.history.slice().reverse().map((change) =>
      el(
        "tr",
        { class: change.actor === "guardrail" ? "by-guardrail" : "" },
        el("td", { text: change.version }),
        el("td", { text: when(change.changed_at) }),
        el("td", { text: change.actor }),
        el("td", { text: change.action }),
        el("td", { text: change.what }),
        el("td", { text: change.reason || "" })
      )
    );
    const parts = [
      el("table", { id: "history-table" }, el("thead", {}, el("tr", {}, ["version", "time", "actor", "action", "what changed", "reason"].map((h) => el("th", { text: h })))), el("tbody", {}, rows)),
    ];
    if (state.history_error) parts.unshift(el("p", { class: "error", text: "history unavailable: " + state.history_error }));
    if (state.history_total > state.history.length) parts.push(el("p", { class: "hint", text: `the newest ${state.history.length} of ${state.history_total} changes` }));
    document.getElementById("history").replaceChildren(...parts);
  }

  // -- charts ----------------------------------------------------------------------------------------
  function chartedArms(state) {
    return state.arms.filter((arm) => !arm.control).map((arm) => arm.name);
  }

  function displayedPoints(state) {
    const points = view.points.slice();
    const last = points.length ? points[points.length - 1].t : -Infinity;
    if (state.figures && state.figures.time > last + 1e-3) {
      const arms = {};
      for (const [name, row] of Object.entries(state.figures.arms)) arms[name] = view.fields.map((field) => row[field] ?? null);
      points.push({ t: state.figures.time, arms });
    }
    return points;
  }

  function chartData(chart, arms, points, margin) {
    const at = (name) => view.fields.indexOf(name);
    const xs = points.map((point) => point.t);
    const data = [xs, xs.map(() => chart.none)];
    if (chart.measure === "nll_delta") data.push(xs.map(() => margin));
    let drawn = 0;
    let bands = 0;
    for (const arm of arms) {
      const pick = (field) => points.map((point) => (point.arms[arm] ? point.arms[arm][at(field)] : null));
      const estimate = pick(chart.measure);
      const low = pick(chart.measure + "_low");
      const high = pick(chart.measure + "_high");
      drawn += estimate.filter((value) => value !== null).length;
      if (low.some((value, i) => value !== null && high[i] !== null)) bands += 1;
      data.push(estimate, low, high);
    }
    return { data, drawn, bands };
  }

  function drawChanges(u) {
    const changes = (view.state && view.state.history) || [];
    const { ctx } = u;
    const { left, top, width, height } = u.bbox;
    ctx.save();
    ctx.font = `${11 * devicePixelRatio}px sans-serif`;
    for (const [index, change] of changes.entries()) {
      const x = u.valToPos(change.changed_at, "x", true);
      if (!(x >= left && x <= left + width)) continue;
      const guardrail = change.actor === "guardrail";
      ctx.strokeStyle = guardrail ? "#d00000" : "#9a9a9a";
      ctx.fillStyle = ctx.strokeStyle;
      ctx.lineWidth = (guardrail ? 2 : 1) * devicePixelRatio;
      ctx.setLineDash(guardrail ? [] : [3 * devicePixelRatio, 3 * devicePixelRatio]);
      ctx.beginPath();
      ctx.moveTo(x, top);
      ctx.lineTo(x, top + height);
      ctx.stroke();
      const labelY = top + (12 + 13 * (index % 3)) * devicePixelRatio; // changes close in time stay legible
      ctx.fillText(guardrail ? `v${change.version} guardrail` : `v${change.version}`, x + 3 * devicePixelRatio, labelY);
    }
    ctx.restore();
  }

  function buildChart(chart, arms, section) {
    const plot = section.querySelector(".plot");
    const series = [{}, { label: "no change", stroke: "#777", dash: [6, 4], width: 1, points: { show: false } }];
    if (chart.measure === "nll_delta") series.push({ label: "margin", stroke: "#c00", dash: [2, 5], width: 1, points: { show: false } });
    const bands = [];
    for (const arm of arms) {
      const color = colorOf(arm);
      const base = series.length;
      series.push({ label: arm, stroke: color, width: 2 });
      series.push({ label: arm + " low", stroke: fade(color), width: 0.5, points: { show: false } });
      series.push({ label: arm + " high", stroke: fade(color), width: 0.5, points: { show: false } });
      bands.push({ series: [base + 2, base + 1], fill: fade(color) });
    }
    const legend = section.querySelector(".legend");
    legend.replaceChildren(
      ...arms.map((arm) => {
        const swatch = el("span", { class: "swatch" });
        swatch.style.background = colorOf(arm);
        return el("span", { class: "legend-item" }, swatch, el("span", { class: "arm-name", text: arm }));
      })
    );
    const options = {
      width: Math.max(320, plot.clientWidth || 560),
      height: 220,
      legend: { show: false },
      scales: { x: { time: true }, y: chart.log ? { distr: 3, log: 10 } : {} },
      axes: [{}, { size: 72 }],
      series,
      bands,
      hooks: { draw: [drawChanges] },
    };
    plot.replaceChildren();
    const empty = [[], [], ...series.slice(2).map(() => [])];
    return new uPlot(options, empty, plot);
  }

  function renderCharts(state) {
    const arms = chartedArms(state);
    const armsKey = JSON.stringify(arms);
    const points = displayedPoints(state);
    for (const chart of CHARTS) {
      const section = document.getElementById("chart-" + chart.measure);
      if (armsKey !== view.chartArms || !view.charts[chart.measure]) {
        if (view.charts[chart.measure]) view.charts[chart.measure].destroy();
        view.charts[chart.measure] = buildChart(chart, arms, section);
      }
      const { data, drawn, bands } = chartData(chart, arms, points, state.margin);
      view.charts[chart.measure].setData(data);
      section.dataset.points = String(drawn);
      section.dataset.bands = String(bands);
    }
    view.chartArms = armsKey;
  }

  async function readSeries() {
    const path = `/ui/api/experiments/${encodeURIComponent(view.name)}/series?after=${view.seq}`;
    const response = await api(path);
    if (!response.ok) return;
    const body = await response.json();
    if (body.started !== view.started) {
      // a new series (the gateway restarted, or the experiment was made again): start over
      const asked = view.seq;
      view.points = [];
      view.seq = -1;
      view.started = body.started;
      if (asked !== -1) return readSeries();
    }
    view.fields = body.fields;
    view.maxPoints = body.max_points;
    for (const point of body.points) {
      view.points.push(point);
      view.seq = point.seq;
    }
    if (view.points.length > 2 * view.maxPoints) view.points = view.points.filter((_, index) => index % 2 === 0);
  }

  async function pollExperiment() {
    try {
      const response = await api("/ui/api/experiments/" + encodeURIComponent(view.name));
      if (response.status === 404) {
        setStatus("this gateway routes no experiment of that name (deleted?)", true);
      } else if (!response.ok) {
        throw new Error(await errorMessage(response));
      } else {
        const state = await response.json();
        if (state.samples !== view.samples) {
          await readSeries(); // a new point exists only after a new sample
          view.samples = state.samples;
        }
        view.state = state;
        renderSummary(state);
        renderArms(state);
        renderHistory(state);
        renderCharts(state);
        main.dataset.version = String(state.version);
        setStatus("updated " + new Date().toLocaleTimeString(), false);
      }
    } catch (error) {
      if (error instanceof NeedLogin) return;
      setStatus("cannot read the experiment: " + error.message, true);
    }
    clearTimeout(timer);
    timer = setTimeout(pollExperiment, POLL_MS);
  }

  // -- the one action --------------------------------------------------------------------------------
  async function stopArm(arm) {
    const state = view.state;
    const shown = state.version;
    const question = `Stop arm "${arm}" of experiment "${view.name}"? Its weight becomes 0 (written against ` +
      `version ${shown}); its users move to the other arms by the sticky rule.`;
    if (!window.confirm(question)) return;
    const spec = JSON.parse(JSON.stringify(state.spec));
    for (const item of spec.arms) if (item.name === arm) item.weight = 0;
    let response;
    try {
      response = await api("/admin/experiments/" + encodeURIComponent(view.name), {
        method: "PUT",
        headers: { "content-type": "application/json", "if-match": `"${shown}"`, "x-depthprune-actor": "ui" },
        body: JSON.stringify(spec),
      });
    } catch (error) {
      notice("error", `Arm ${arm} was not stopped: the gateway did not answer (${error.message}).`);
      return;
    }
    const etag = (response.headers.get("etag") || "").replaceAll('"', "");
    if (response.ok) {
      notice("ok", `Arm ${arm} stopped: the experiment is now at version ${etag}.`);
    } else if (response.status === 412) {
      notice(
        "error",
        `412 Precondition Failed: the experiment changed since version ${shown}, the one this page showed` +
          (etag ? ` (it is at version ${etag} now)` : "") +
          `; nothing was changed. The page now shows the current state: check it, and stop the arm again if you still mean to.`
      );
    } else if (response.status === 401 || response.status === 403) {
      notice("error", `${response.status}: stopping an arm needs the admin token. ${await errorMessage(response)}`);
    } else {
      notice("error", `${response.status}: ${await errorMessage(response)}`);
    }
    clearTimeout(timer);
    await pollExperiment();
  }

  // -- start -----------------------------------------------------------------------------------------
  function start() {
    document.getElementById("login").hidden = true;
    document.getElementById("logout").hidden = !token();
    const match = location.pathname.match(/^\/ui\/experiments\/([^/]+)$/);
    if (match) {
      view.name = decodeURIComponent(match[1]);
      document.title = view.name + " · depthprune experiments";
      skeleton();
      pollExperiment();
    } else {
      pollList();
    }
  }

  document.getElementById("login").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value);
    document.getElementById("token").value = "";
    start();
  });
  document.getElementById("logout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    location.reload();
  });
  window.addEventListener("resize", () => {
    for (const [measure, chart] of Object.entries(view.charts)) {
      const plot = document.querySelector(`#chart-${measure} .plot`);
      if (plot) chart.setSize({ width: Math.max(320, plot.clientWidth), height: 220 });
    }
  });
  start();
})();
