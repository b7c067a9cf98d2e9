// counter-gateway dashboard. Reads only the public JSON API (/v1) with a
// `read` key kept in sessionStorage and sent as `Authorization: Bearer`,
// never in a URL. Draws its chart as plain SVG; loads nothing from another
// host. Initial state may come from the URL fragment
// (#entity=VIDEO&action=VIEW&interval=last_week&uuid=...). A link may come
// from anyone, so the fragment is not trusted: a `key` there leaves the URL
// at once and is used only after the user accepts it with the page's
// button (a planted key would show its owner's data as the operator's),
// and `refresh` is held between REFRESH_MIN and REFRESH_MAX seconds.
// The values of the top list follow GET /v1/stream (Server-Sent Events)
// between refreshes: read with fetch, since an EventSource sends no
// Authorization header and the key would have to go in the URL.
"use strict";
(function () {
  const KEY_STORE = "counter-gateway.read-key";
  const SVG = "http://www.w3.org/2000/svg";
  const TOP_SIZE = 20;
  // A refresh is five requests or so: every 2 s at most, every hour at least.
  const REFRESH_MIN = 2;
  const REFRESH_MAX = 3600;
  const REFRESH_DEFAULT = 5;
  const $ = (id) => document.getElementById(id);

  // Everything the page shows is a function of this state (and the data).
  const state = {
    tenant: "", entity: "", action: "", interval: "all", from: "", to: "",
    category: "", uuid: "", avg_action: "", min_quantity: "1", rank: "", days: "30",
    size: "20", refresh: "5", half_life: "24h",
  };
  // Cursors of the stale pages seen so far: staleCursors[n] starts page n.
  let staleCursors = [null];
  let stalePage = 0;
  let staleNext = null;
  let generation = 0;
  let refreshes = 0;
  let timer = null;
  // A key from the link, waiting for the user's yes or no.
  let offeredKey = null;
  // The live stream of the top list's values: what it follows, and its end.
  let live = null;
  let liveEvents = 0;
  // How long a stream that ended or was refused waits before it reconnects.
  const LIVE_RETRY_MS = 3000;

  class ApiError extends Error {
    constructor(status, type, reason) {
      super(reason);
      this.status = status;
      this.type = type;
    }
  }

  // --- state and the URL fragment -------------------------------------

  function readFragment() {
    const p = new URLSearchParams(location.hash.slice(1));
    if (p.has("key")) {
      // Out of the URL (and the history) right away; kept in this variable
      // only, until the user accepts it (useLinkKey) or drops it.
      offeredKey = p.get("key");
      $("link-key").hidden = false;
      p.delete("key");
      const rest = p.toString();
      history.replaceState(null, "", location.pathname + location.search + (rest ? "#" + rest : ""));
    }
    for (const k of Object.keys(state)) {
      if (p.has(k)) state[k] = p.get(k);
    }
    if (!p.has("interval") && p.has("from")) state.interval = "range";
  }

  function writeFragment() {
    const p = new URLSearchParams();
    for (const [k, v] of Object.entries(state)) {
      if (v !== "" && !(k === "interval" && v === "all")) p.set(k, v);
    }
    history.replaceState(null, "", location.pathname + location.search + "#" + p.toString());
  }

  function fillInputs() {
    $("tenant").value = state.tenant;
    $("entity").value = state.entity;
    $("action").value = state.action;
    $("interval").value = state.interval;
    $("from").value = state.from;
    $("to").value = state.to;
    $("category").value = state.category;
    $("avg-action").value = state.avg_action;
    $("min-quantity").value = state.min_quantity;
    $("avg-rank").checked = state.rank === "bayesian";
    $("half-life").value = state.half_life;
    $("days").value = state.days;
    $("page-size").value = state.size;
    showRange();
    $("refresh-note").textContent = refreshEvery().note;
  }

  // The refresh interval the state asks for, held within its bounds, and
  // what the page says of it.
  function refreshEvery() {
    const asked = Number(state.refresh);
    const every = (secs, why) => ({ secs, note: "refreshes every " + secs + " s while open" + why });
    if (state.refresh.trim() === "" || !Number.isFinite(asked) || asked < 0) {
      return every(REFRESH_DEFAULT, " (refresh=" + state.refresh + " is not a number of seconds)");
    }
    if (asked === 0) return { secs: 0, note: "automatic refresh is off" };
    if (asked < REFRESH_MIN) return every(REFRESH_MIN, ", the shortest interval (" + state.refresh + " s was asked)");
    if (asked > REFRESH_MAX) return every(REFRESH_MAX, ", the longest interval (" + state.refresh + " s was asked)");
    return every(asked, "");
  }

  function readInputs() {
    const before = state.entity + "\u0000" + state.action + "\u0000" + state.tenant;
    state.tenant = $("tenant").value.trim();
    state.entity = $("entity").value.trim();
    state.action = $("action").value.trim();
    state.interval = $("interval").value;
    state.from = $("from").value;
    state.to = $("to").value;
    state.category = $("category").value.trim();
    state.avg_action = $("avg-action").value.trim();
    state.min_quantity = $("min-quantity").value || "1";
    state.rank = $("avg-rank").checked ? "bayesian" : "";
    state.half_life = $("half-life").value || "24h";
    state.days = $("days").value || "30";
    state.size = $("page-size").value || "20";
    if (before !== state.entity + "\u0000" + state.action + "\u0000" + state.tenant) state.uuid = "";
  }

  function showRange() {
    const range = $("interval").value === "range";
    for (const el of document.querySelectorAll(".range")) el.hidden = !range;
  }

  function windowParams(forChart) {
    if (state.interval === "range") return { from: state.from, to: state.to };
    if (forChart && state.interval === "all") return { interval: "last_month" };
    return { interval: state.interval };
  }

  // --- the API ----------------------------------------------------------

  async function api(path, params, accept) {
    const url = new URL(path, location.origin);
    for (const [k, v] of Object.entries(params || {})) {
      if (v !== "" && v !== null && v !== undefined) url.searchParams.set(k, v);
    }
    const headers = { Accept: accept || "application/json" };
    const key = sessionStorage.getItem(KEY_STORE);
    if (key) headers.Authorization = "Bearer " + key;
    if (state.tenant) headers["X-Tenant"] = state.tenant;
    let res;
    try {
      res = await fetch(url, { headers, cache: "no-store", credentials: "omit" });
    } catch (e) {
      throw new ApiError(0, "unreachable", "the gateway cannot be reached (" + e.message + ")");
    }
    if (!res.ok) {
      let type = "", reason = res.statusText;
      try {
        const body = await res.json();
        type = body.error.type;
        reason = body.error.reason;
      } catch (_) { /* not the JSON error shape */ }
      throw new ApiError(res.status, type, reason);
    }
    return accept === "text/csv" ? res : res.json();
  }

  const enc = encodeURIComponent;
  const pair = () => enc(state.entity) + "/" + enc(state.action);

  // --- messages ---------------------------------------------------------

  function explain(err) {
    const hasKey = !!sessionStorage.getItem(KEY_STORE);
    switch (err.status) {
      case 401:
        return hasKey
          ? "The read key was refused: " + err.message + ". Enter a valid read key above."
          : "This gateway needs a read key: enter it above (" + err.message + ").";
      case 403:
        return "This key may not read this data: " + err.message + ".";
      case 0:
        return "The gateway cannot be reached: " + err.message + ".";
      default:
        return "The gateway answered " + err.status + " " + err.type + ": " + err.message;
    }
  }

  function say(text, kind) {
    const m = $("message");
    m.textContent = text;
    m.className = kind || "error";
    m.dataset.kind = kind || "error";
    m.hidden = !text;
  }

  // --- rendering ----------------------------------------------------------

  function cell(tr, text, cls) {
    const td = document.createElement("td");
    td.textContent = text === null || text === undefined ? "" : String(text);
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }

  function fillTable(id, rows, columns, make) {
    const body = $(id).tBodies[0];
    body.replaceChildren();
    if (!rows.length) {
      const tr = body.insertRow();
      const td = cell(tr, "nothing to show", "empty");
      td.colSpan = columns;
      return;
    }
    rows.forEach((row, i) => body.appendChild(make(row, i)));
  }

  function renderTop(top) {
    $("top-window").textContent = top.from ? top.from + " to " + top.to : "all time";
    fillTable("top", top.counters, 4, (c, i) => {
      const tr = document.createElement("tr");
      tr.dataset.uuid = c.uuid;
      tr.dataset.value = String(c.value);
      if (c.uuid === selectedUuid(top)) tr.className = "selected";
      cell(tr, i + 1);
      cell(tr, c.uuid, "uuid");
      cell(tr, c.category || "", "category");
      cell(tr, c.value, "num value");
      tr.addEventListener("click", () => {
        state.uuid = c.uuid;
        writeFragment();
        refresh();
      });
      return tr;
    });
  }

  // The trending list: scores in 4 significant digits (the API gives 9).
  function renderTrending(trending) {
    $("trending-note").textContent = "half-life " + trending.half_life + (trending.exact ? "" : ", not exact");
    fillTable("trending", trending.counters, 4, (c, i) => {
      const tr = document.createElement("tr");
      tr.dataset.uuid = c.uuid;
      tr.dataset.score = String(c.score);
      cell(tr, i + 1);
      cell(tr, c.uuid, "uuid");
      cell(tr, c.category || "", "category");
      cell(tr, Number(c.score.toPrecision(4)).toString(), "num score");
      return tr;
    });
  }

  // --- live values ---------------------------------------------------------

  // Follows the values of `top`'s rows (none: stops following). A stream
  // already following the same keys, key and tenant is kept.
  function follow(top) {
    const rows = top && state.entity && state.action ? top.counters : [];
    const keys = rows.map((c) => pair() + "/" + enc(c.uuid)).join(",");
    const key = sessionStorage.getItem(KEY_STORE) || "";
    const id = [keys, state.tenant, key].join("\u0000");
    if (live && live.id === id) return;
    if (live) live.stop.abort();
    live = null;
    if (!keys) return;
    live = { id, stop: new AbortController() };
    stream(live, keys, key, state.tenant);
  }

  async function stream(me, keys, key, tenant) {
    const url = new URL("/v1/stream", location.origin);
    url.search = "keys=" + keys;
    const headers = { Accept: "text/event-stream" };
    if (key) headers.Authorization = "Bearer " + key;
    if (tenant) headers["X-Tenant"] = tenant;
    while (live === me) {
      try {
        const res = await fetch(url, { headers, cache: "no-store", credentials: "omit", signal: me.stop.signal });
        // Refused for good (key, tenant, keys): the next refresh says why.
        if (res.status >= 400 && res.status < 500) return;
        if (res.ok && res.body) {
          const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
          let buf = "";
          for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            buf += value.replace(/\r\n?/g, "\n");
            let end;
            while ((end = buf.indexOf("\n\n")) >= 0) {
              liveBlock(buf.slice(0, end));
              buf = buf.slice(end + 2);
            }
          }
        }
      } catch (_) {
        if (me.stop.signal.aborted) return;
      }
      // Ended (a restart, a proxy) or full (503): again after a while.
      await new Promise((done) => setTimeout(done, LIVE_RETRY_MS));
    }
  }

  // One block of the stream: a `counter` event updates its row's value.
  function liveBlock(block) {
    let event = "", data = "";
    for (const line of block.split("\n")) {
      if (line.startsWith("event:")) event = line.slice(6).trim();
      else if (line.startsWith("data:")) data += line.slice(5).replace(/^ /, "");
    }
    if (event !== "counter") return;
    let c;
    try {
      c = JSON.parse(data);
    } catch (_) {
      return;
    }
    for (const tr of $("top").tBodies[0].rows) {
      if (tr.dataset.uuid === c.uuid && tr.cells.length === 4) {
        tr.dataset.value = String(c.value);
        tr.cells[3].textContent = String(c.value);
      }
    }
    liveEvents += 1;
    document.body.dataset.liveEvents = String(liveEvents);
  }

  function selectedUuid(top) {
    if (state.uuid) return state.uuid;
    return top && top.counters.length ? top.counters[0].uuid : "";
  }

  function svg(name, attrs, parent) {
    const el = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
    if (parent) parent.appendChild(el);
    return el;
  }

  const DAY_MS = 86400000;
  const dayMs = (d) => Date.parse(d + "T00:00:00Z");
  const dayOf = (ms) => new Date(ms).toISOString().slice(0, 10);

  function renderChart(uuid, hist, note) {
    const chart = $("chart");
    chart.replaceChildren();
    $("chart-title").textContent = uuid ? uuid + (hist ? " (" + hist.from + " to " + hist.to + ", total " + hist.total + ")" : "") : "";
    chart.dataset.uuid = uuid || "";
    if (!hist) {
      const t = svg("text", { x: 300, y: 130, "text-anchor": "middle" }, chart);
      t.textContent = note || "no counter chosen";
      return;
    }
    // One point per day of the window, days without a bucket at 0.
    const byDay = new Map(hist.buckets.map((b) => [b.day, b.value]));
    const days = [];
    for (let ms = dayMs(hist.from); ms <= dayMs(hist.to); ms += DAY_MS) days.push(dayOf(ms));
    const values = days.map((d) => byDay.get(d) || 0);
    const W = 600, H = 260, L = 48, R = 12, T = 12, B = 28;
    const max = Math.max(1, ...values), min = Math.min(0, ...values);
    const x = (i) => L + (days.length === 1 ? (W - L - R) / 2 : (i * (W - L - R)) / (days.length - 1));
    const y = (v) => T + ((max - v) * (H - T - B)) / (max - min || 1);
    for (const v of [min, (min + max) / 2, max]) {
      svg("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid" }, chart);
      const t = svg("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end" }, chart);
      t.textContent = Number.isInteger(v) ? String(v) : v.toFixed(1);
    }
    svg("line", { x1: L, x2: W - R, y1: y(min), y2: y(min), class: "axis" }, chart);
    svg("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }, chart);
    const first = svg("text", { x: x(0), y: H - 8, "text-anchor": "start" }, chart);
    first.textContent = days[0];
    if (days.length > 1) {
      const last = svg("text", { x: x(days.length - 1), y: H - 8, "text-anchor": "end" }, chart);
      last.textContent = days[days.length - 1];
    }
    svg("polyline", { class: "line", points: values.map((v, i) => x(i) + "," + y(v)).join(" ") }, chart);
    values.forEach((v, i) => {
      const c = svg("circle", { class: "point", cx: x(i), cy: y(v), r: days.length > 60 ? 1.5 : 3, "data-day": days[i], "data-value": v }, chart);
      svg("title", {}, c).textContent = days[i] + ": " + v;
    });
  }

  function renderAverages(avg) {
    fillTable("averages", avg.averages, 5, (a, i) => {
      const tr = document.createElement("tr");
      tr.dataset.uuid = a.uuid;
      cell(tr, i + 1);
      cell(tr, a.uuid, "uuid");
      cell(tr, a.average === null ? "" : a.average.toFixed(2), "num average");
      cell(tr, a.quantity, "num quantity");
      // Bayesian rank: the weighted rating; otherwise no score.
      cell(tr, typeof a.score === "number" ? a.score.toFixed(3) : "", "num score");
      return tr;
    });
  }

  function renderStale(stale) {
    staleNext = stale.next_cursor;
    fillTable("stale", stale.counters, 5, (c) => {
      const tr = document.createElement("tr");
      tr.dataset.id = c.id;
      cell(tr, c.entity);
      cell(tr, c.action);
      cell(tr, c.uuid, "uuid");
      cell(tr, c.value, "num value");
      cell(tr, c.recorded_timestamp, "touched");
      return tr;
    });
    $("stale-page").textContent = "page " + (stalePage + 1);
    $("stale-prev").disabled = stalePage === 0;
    $("stale-next").disabled = !staleNext;
  }

  function renderUnused(unused) {
    fillTable("unused", unused.pairs, 5, (p) => {
      const tr = document.createElement("tr");
      cell(tr, p.entity);
      cell(tr, p.action);
      cell(tr, p.last_touch);
      cell(tr, p.total, "num total");
      cell(tr, p.counters, "num");
      return tr;
    });
  }

  // --- loading --------------------------------------------------------------

  function staleParams() {
    return { days: state.days, entity: state.entity, action: state.action, size: state.size, cursor: staleCursors[stalePage] };
  }

  async function refresh() {
    const mine = ++generation;
    const chosen = state.entity && state.action;
    const jobs = {
      unused: api("/v1/reports/unused", { days: state.days }),
      stale: api("/v1/reports/stale", staleParams()),
    };
    if (chosen) {
      jobs.top = api("/v1/top/" + pair(), { ...windowParams(false), category: state.category, size: TOP_SIZE });
      jobs.trending = api("/v1/trending/" + pair(), { half_life: state.half_life, category: state.category, size: 10 });
      jobs.averages = api("/v1/top-averages/" + enc(state.entity) + "/" + enc(state.avg_action || state.action), {
        ...windowParams(false), category: state.category, min_quantity: state.min_quantity, size: 10,
        rank: state.rank === "bayesian" ? "bayesian" : "",
      });
    }
    const names = Object.keys(jobs);
    const settled = await Promise.allSettled(Object.values(jobs));
    if (mine !== generation) return; // a newer refresh started meanwhile
    const got = {};
    let failure = null;
    names.forEach((n, i) => {
      if (settled[i].status === "fulfilled") got[n] = settled[i].value;
      else if (!failure || settled[i].reason.status === 401) failure = settled[i].reason;
    });
    if (got.unused) renderUnused(got.unused);
    if (got.stale) renderStale(got.stale);
    if (got.averages) renderAverages(got.averages);
    if (got.trending) renderTrending(got.trending);
    if (got.top) renderTop(got.top);
    follow(failure ? null : got.top);
    let chartNote = chosen ? "no counter in this list" : "choose an entity and an action";
    const uuid = selectedUuid(got.top);
    let hist = null;
    if (chosen && uuid && !failure) {
      try {
        hist = await api("/v1/counters/" + pair() + "/" + enc(uuid) + "/histogram", windowParams(true));
      } catch (e) {
        if (e.status === 404) chartNote = uuid + " has never been counted";
        else failure = failure || e;
      }
      if (mine !== generation) return;
    }
    renderChart(uuid, hist, chartNote);
    if (failure) {
      const text = explain(failure);
      say(text, failure.status === 401 || failure.status === 403 ? "auth" : "error");
      if (failure.status === 401 || failure.status === 403) clearTables();
    } else if (!chosen) {
      say("Choose an entity and an action above to see their top list.", "info");
    } else {
      say("");
    }
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
    refreshes += 1;
    document.body.dataset.refreshes = String(refreshes);
  }

  function clearTables() {
    for (const id of ["top", "trending", "averages", "stale", "unused"]) $(id).tBodies[0].replaceChildren();
    $("chart").replaceChildren();
  }

  function schedule() {
    if (timer) clearInterval(timer);
    const secs = refreshEvery().secs;
    if (secs > 0) {
      timer = setInterval(() => { if (!document.hidden) refresh(); }, secs * 1000);
    }
  }

  function resetStale() {
    staleCursors = [null];
    stalePage = 0;
  }

  async function downloadCsv() {
    // The whole report, page after page (1,000 rows each), as one file.
    let cursor = null, out = "", pages = 0;
    try {
      do {
        const res = await api("/v1/reports/stale", { days: state.days, entity: state.entity, action: state.action, size: 1000, cursor }, "text/csv");
        const text = await res.text();
        out += pages === 0 ? text : text.slice(text.indexOf("\n") + 1);
        cursor = res.headers.get("x-next-cursor");
        pages += 1;
      } while (cursor && pages < 1000);
    } catch (e) {
      say(explain(e), "error");
      return;
    }
    const a = document.createElement("a");
    a.href = URL.createObjectURL(new Blob([out], { type: "text/csv" }));
    a.download = "stale-" + (state.entity || "all") + "-" + (state.action || "all") + "-" + state.days + "d.csv";
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
  }

  function useLinkKey(accepted) {
    if (accepted && offeredKey) sessionStorage.setItem(KEY_STORE, offeredKey);
    offeredKey = null;
    $("link-key").hidden = true;
    showKeyState();
    if (accepted) refresh();
  }

  function showKeyState() {
    $("key-state").textContent = sessionStorage.getItem(KEY_STORE) ? "key set for this tab" : "no key";
  }

  // --- wiring -----------------------------------------------------------------

  document.addEventListener("DOMContentLoaded", () => {
    readFragment();
    fillInputs();
    showKeyState();
    $("interval").addEventListener("change", showRange);
    $("controls").addEventListener("submit", (e) => {
      e.preventDefault();
      readInputs();
      resetStale();
      writeFragment();
      refresh();
    });
    for (const id of ["averages-form", "stale-form"]) {
      $(id).addEventListener("submit", (e) => {
        e.preventDefault();
        readInputs();
        resetStale();
        writeFragment();
        refresh();
      });
    }
    $("half-life").addEventListener("change", () => {
      readInputs();
      writeFragment();
      refresh();
    });
    $("avg-rank").addEventListener("change", () => {
      readInputs();
      writeFragment();
      refresh();
    });
    $("stale-next").addEventListener("click", () => {
      if (!staleNext) return;
      staleCursors[stalePage + 1] = staleNext;
      stalePage += 1;
      refresh();
    });
    $("stale-prev").addEventListener("click", () => {
      if (stalePage > 0) stalePage -= 1;
      refresh();
    });
    $("stale-csv").addEventListener("click", downloadCsv);
    $("key-form").addEventListener("submit", (e) => {
      e.preventDefault();
      const key = $("key").value.trim();
      if (key) sessionStorage.setItem(KEY_STORE, key);
      $("key").value = "";
      showKeyState();
      refresh();
    });
    $("use-link-key").addEventListener("click", () => useLinkKey(true));
    $("drop-link-key").addEventListener("click", () => useLinkKey(false));
    $("forget-key").addEventListener("click", () => {
      sessionStorage.removeItem(KEY_STORE);
      showKeyState();
      refresh();
    });
    window.addEventListener("hashchange", () => {
      readFragment();
      fillInputs();
      resetStale();
      showKeyState();
      refresh();
      schedule();
    });
    refresh();
    schedule();
  });
})();
