"use strict";
(function () {
  var REFRESH_MS = 5000;
  var TIMEOUT_MS = 4500;
  var STALE_MS = 12000;
  var WINDOW_S = 15 * 60;
  var CHART_H = 132;
  var SVGNS = "http://www.w3.org/2000/svg";

  var last = null;         // last payload that rendered
  var lastAt = 0;          // Date.now() when it arrived
  var cards = new Map();   // limit name -> card parts, kept across refreshes
  var hovers = new Map();  // limit name -> pointer position over its chart (0..1)
  var sigs = {};           // section -> JSON of what it shows, to skip no-op rebuilds

  function $(id) { return document.getElementById(id); }

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function svgEl(tag, attrs) {
    var e = document.createElementNS(SVGNS, tag);
    for (var k in attrs) e.setAttribute(k, String(attrs[k]));
    return e;
  }

  // Rewriting identical text would still drop an operator's text selection.
  function setText(node, s) {
    s = String(s);
    if (node.textContent !== s) node.textContent = s;
  }

  function num(v) {
    v = Number(v);
    return Number.isFinite(v) ? v : 0;
  }

  function str(v) {
    return v === undefined || v === null ? "" : String(v);
  }

  function count(v) {
    return Math.round(num(v)).toLocaleString("en-US");
  }

  function rate(v) {
    v = num(v);
    if (v === 0) return "0";
    if (v >= 100) return Math.round(v).toLocaleString("en-US");
    if (v >= 10) return v.toFixed(1).replace(/\.0$/, "");
    if (v >= 0.1) return v.toFixed(2).replace(/\.?0+$/, "");
    return String(Number(v.toPrecision(2)));
  }

  function utc(t) {
    var d = new Date(num(t) * 1000);
    return isNaN(d) ? "" : d.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  }

  function duration(s) {
    s = Math.max(0, Math.floor(num(s)));
    if (s < 60) return s + " s";
    var m = Math.floor(s / 60);
    if (m < 10) return m + " min" + (s % 60 ? " " + (s % 60) + " s" : "");
    if (m < 60) return m + " min";
    var h = Math.floor(m / 60);
    if (h < 24) return h + " h" + (m % 60 ? " " + (m % 60) + " min" : "");
    var d = Math.floor(h / 24);
    return d + " d" + (h % 24 ? " " + (h % 24) + " h" : "");
  }

  function relative(t, now, fmt) {
    var d = num(now) - num(t);
    if (fmt === "for") return duration(d);
    return d < 1 ? "just now" : duration(d) + " ago";
  }

  // A time shown relative to the server's clock; refreshTimes() keeps it current.
  function timeEl(t, now, fmt) {
    var e = el("time");
    e.setAttribute("data-t", String(num(t)));
    if (fmt) e.setAttribute("data-fmt", fmt);
    var d = new Date(num(t) * 1000);
    if (!isNaN(d)) e.setAttribute("datetime", d.toISOString());
    e.title = utc(t);
    e.textContent = relative(t, now, fmt);
    return e;
  }

  function appendTime(parent, t, now, fmt) {
    if (num(t) > 0) parent.appendChild(timeEl(t, now, fmt));
  }

  function refreshTimes(now) {
    var all = document.querySelectorAll("time[data-t]");
    for (var i = 0; i < all.length; i++) {
      var e = all[i];
      setText(e, relative(e.getAttribute("data-t"), now, e.getAttribute("data-fmt")));
    }
  }

  function changed(key, value) {
    var s = JSON.stringify(value === undefined ? null : value);
    if (sigs[key] === s) return false;
    sigs[key] = s;
    return true;
  }

  /* ---------- header, store, connections ---------- */

  function renderHeader(data, now) {
    setText($("version"), data.version ? "v" + data.version : "");
    var config = str(data.config) || "(none)";
    setText($("config"), config);
    $("config").title = config;
    var up = $("uptime");
    var started = num(data.started_at);
    setText(up, started > 0 ? "up " + duration(now - started) : "");
    up.title = started > 0 ? "started " + utc(started) : "";
  }

  function renderStore(store, now) {
    store = store || {};
    var deciding = str(store.deciding);
    var target = str(store.target);
    var box = $("store-state");
    document.title = (deciding === "fallback" ? "⚠ FALLBACK · " : "") + "floodgate status";
    if (!changed("store", [deciding, target, store.since])) return;
    box.className = "store store-" + (deciding || "unknown").replace(/[^a-z0-9_-]/gi, "");
    box.textContent = "";
    if (deciding === "redis") {
      box.appendChild(el("span", "label", "Redis"));
      if (target) box.appendChild(el("span", "mono", "(" + target + ")"));
      if (num(store.since) > 0) box.appendChild(el("span", "detail", "healthy since"));
      appendTime(box, store.since, now);
    } else if (deciding === "fallback") {
      box.appendChild(el("span", "label", "FALLBACK:"));
      box.appendChild(document.createTextNode(num(store.since) > 0 ? "Redis unavailable for" : "Redis unavailable"));
      appendTime(box, store.since, now, "for");
      if (target) box.appendChild(el("span", "mono", "(" + target + ")"));
      box.appendChild(el("span", "detail", "— on_failure deciding"));
    } else if (deciding === "memory") {
      box.appendChild(el("span", "label", "memory"));
      box.appendChild(el("span", "detail", "(no Redis): counters are local to this process"));
    } else {
      box.appendChild(el("span", "label", "store: " + (deciding || "unknown")));
      if (target) box.appendChild(el("span", "mono", "(" + target + ")"));
    }
  }

  function renderConnections(c) {
    c = c || {};
    setText($("conn-open"), count(c.open));
    setText($("conn-in-flight"), count(c.in_flight));
    setText($("conn-admin"), count(c.admin_open));
  }

  function renderProtection(p) {
    var box = $("protection");
    box.hidden = !p;
    if (!p) return;
    setText($("protection-limit"), count(p.limit));
    setText($("protection-in-flight"), count(p.in_flight));
    setText(
      $("protection-latency"),
      num(p.latency_ms).toFixed(1) + " ms (" + num(p.min_latency_ms).toFixed(1) + ")"
    );
    setText($("protection-shed"), count(p.shed));
  }

  /* ---------- limits ---------- */

  function niceMax(v) {
    if (!(v > 0)) return 1;
    var p = Math.pow(10, Math.floor(Math.log10(v)));
    var steps = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < steps.length; i++) if (v <= steps[i] * p) return steps[i] * p;
    return 10 * p;
  }

  function series(s, key) {
    var a = s && Array.isArray(s[key]) ? s[key] : [];
    return a.map(num);
  }

  function sum(a) {
    var t = 0;
    for (var i = 0; i < a.length; i++) t += a[i];
    return String(Math.round(t * 1e6) / 1e6);
  }

  function makeCard(name) {
    var root = el("article", "card limit");
    root.setAttribute("data-limit", name);
    var head = el("div", "limit-head");
    var title = el("h3", null, name);
    var algo = el("span", "badge");
    algo.title = "algorithm";
    var key = el("span", "badge");
    key.title = "what the limit counts per";
    var shadow = el("span", "badge shadow", "shadow");
    shadow.title = "shadow mode: refusals are counted, not enforced";
    var readout = el("div", "readout");
    head.append(title, algo, key, shadow);
    var desc = el("p", "desc");
    var plot = el("div", "plot");
    var legend = el("ul", "legend");
    var totals = {};
    legend.appendChild(el("li", "caption", "totals"));
    [["admitted", "admitted"], ["refused", "refused"], ["shadow_refused", "shadow"], ["banned", "banned"]].forEach(function (p) {
      var li = el("li");
      var value = el("b", null, "0");
      li.append(el("span", "swatch " + p[1]), el("span", null, p[0].replace("_", "-")), value);
      legend.appendChild(li);
      totals[p[0]] = { li: li, value: value };
    });
    root.append(head, desc, readout, plot, legend);
    return { root: root, algo: algo, key: key, shadow: shadow, readout: readout, desc: desc, plot: plot, totals: totals, chart: null };
  }

  function renderLimits(limits, data, now) {
    var grid = $("limits");
    var seen = new Set();
    limits.forEach(function (limit, i) {
      var name = str(limit.name);
      seen.add(name);
      var card = cards.get(name);
      if (!card) {
        card = makeCard(name);
        cards.set(name, card);
      }
      if (grid.children[i] !== card.root) grid.insertBefore(card.root, grid.children[i] || null);
      fillCard(card, limit, data, now);
    });
    cards.forEach(function (card, name) {
      if (!seen.has(name)) {
        card.root.remove();
        cards.delete(name);
        hovers.delete(name);
      }
    });
    setText($("limits-count"), limits.length ? "(" + limits.length + ")" : "");
    $("limits-empty").hidden = limits.length > 0;
  }

  function fillCard(card, limit, data, now) {
    setText(card.algo, str(limit.algorithm) || "?");
    setText(card.key, "key: " + (str(limit.key) || "?"));
    card.shadow.hidden = !limit.shadow;
    setText(card.desc, str(limit.description));
    card.desc.hidden = !limit.description;
    var t = limit.totals || {};
    var showShadow = !!limit.shadow || num(t.shadow_refused) > 0;
    Object.keys(card.totals).forEach(function (k) {
      setText(card.totals[k].value, count(t[k]));
    });
    card.totals.shadow_refused.li.hidden = !showShadow;
    card.totals.banned.li.hidden = num(t.banned) === 0;
    drawChart(card, limit, num(data.step_seconds) || 5, now, showShadow);
  }

  // One chart per limit, drawn at the plot's pixel width so text stays crisp.
  function drawChart(card, limit, step, now, showShadow) {
    var name = str(limit.name);
    var s = limit.series || {};
    var adm = series(s, "admitted");
    var ref = series(s, "refused");
    var sha = series(s, "shadow_refused");
    var n = Math.max(adm.length, ref.length, sha.length);
    var start = num(s.start);
    var lastT = start + (n - 1) * step;
    var end = n ? Math.max(now, lastT) : now;
    var span = Math.max(WINDOW_S, (n - 1) * step);
    var x0 = end - span;

    var W = Math.max(200, Math.floor(card.plot.clientWidth || 400));
    var H = CHART_H;
    var L = 46, R = 6, T = 8, B = 20;
    var pw = W - L - R, ph = H - T - B;
    var peak = 0;
    [adm, ref, showShadow ? sha : []].forEach(function (a) {
      for (var i = 0; i < a.length; i++) if (a[i] > peak) peak = a[i];
    });
    var ymax = niceMax(peak);
    function X(i) { return L + ((start + i * step - x0) / span) * pw; }
    function Y(v) { return T + ph - (Math.min(v, ymax) / ymax) * ph; }
    function f(v) { return v.toFixed(1); }

    var svg = svgEl("svg", {
      "class": "chart", width: W, height: H, viewBox: "0 0 " + W + " " + H,
      role: "img", "data-limit": name,
      "data-admitted": sum(adm), "data-refused": sum(ref), "data-shadow-refused": sum(sha),
      "aria-label": name + ": requests per second admitted and refused, last " + duration(span)
    });
    svg.appendChild(svgEl("rect", { "class": "frame", x: L, y: T, width: pw, height: ph }));
    [0.5, 1].forEach(function (q) {
      var y = T + ph - q * ph;
      svg.appendChild(svgEl("line", { "class": "gridline", x1: L, x2: L + pw, y1: f(y), y2: f(y) }));
    });
    [[1, rate(ymax) + "/s"], [0.5, rate(ymax / 2) + "/s"], [0, "0"]].forEach(function (p) {
      var lab = svgEl("text", { "class": "axis", x: L - 6, y: f(T + ph - p[0] * ph + 3.5), "text-anchor": "end" });
      lab.textContent = p[1];
      svg.appendChild(lab);
    });
    for (var m = 0; m * 60 <= span; m += 5) {
      var x = L + pw - (m * 60 / span) * pw;
      if (m > 0 && m * 60 < span) svg.appendChild(svgEl("line", { "class": "gridline", x1: f(x), x2: f(x), y1: T, y2: T + ph }));
      var anchor = m === 0 ? "end" : (m * 60 >= span ? "start" : "middle");
      var label = m === 0 ? "now" : (m * 60 >= span ? m + " min ago" : m + " min");
      var xt = svgEl("text", { "class": "axis", x: f(m * 60 >= span ? L : x), y: H - 5, "text-anchor": anchor });
      xt.textContent = label;
      svg.appendChild(xt);
    }
    if (span % 300 !== 0) {
      var first = svgEl("text", { "class": "axis", x: L, y: H - 5, "text-anchor": "start" });
      first.textContent = duration(span) + " ago";
      svg.appendChild(first);
    }

    function points(a) {
      var out = [];
      for (var i = 0; i < a.length; i++) out.push(f(X(i)) + "," + f(Y(a[i])));
      return out;
    }
    function area(a, cls) {
      if (a.length < 2) return;
      var p = points(a);
      svg.appendChild(svgEl("path", {
        "class": cls,
        d: "M" + f(X(0)) + "," + f(T + ph) + " L" + p.join(" L") + " L" + f(X(a.length - 1)) + "," + f(T + ph) + " Z"
      }));
    }
    function line(a, cls, dot) {
      if (a.length === 1) {
        svg.appendChild(svgEl("circle", { "class": dot, cx: f(X(0)), cy: f(Y(a[0])), r: 2.5 }));
      } else if (a.length > 1) {
        svg.appendChild(svgEl("polyline", { "class": "line " + cls, points: points(a).join(" ") }));
      }
    }

    if (n === 0) {
      var nd = svgEl("text", { "class": "nodata", x: f(L + pw / 2), y: f(T + ph / 2 + 4), "text-anchor": "middle" });
      nd.textContent = "no data yet";
      svg.appendChild(nd);
    } else {
      area(adm, "area-admitted");
      area(ref, "area-refused");
      line(adm, "line-admitted", "dot-admitted");
      line(ref, "line-refused", "dot-refused");
      if (showShadow) line(sha, "line-shadow", "dot-shadow");
    }

    // Pointer readout: the values at the sample under the cursor.
    var cursor = svgEl("line", { "class": "cursor", y1: T, y2: T + ph, x1: -10, x2: -10, visibility: "hidden" });
    svg.appendChild(cursor);
    var hit = svgEl("rect", { "class": "hit", x: L, y: T, width: pw, height: ph });
    svg.appendChild(hit);

    function readout(frac) {
      var r = card.readout;
      r.textContent = "";
      if (n === 0) return;
      var i = n - 1;
      if (frac !== undefined) {
        var t = x0 + frac * span;
        i = Math.round((t - start) / step);
        if (i < 0 || i >= n) {
          cursor.setAttribute("visibility", "hidden");
          return readout(undefined);
        }
        cursor.setAttribute("x1", f(X(i)));
        cursor.setAttribute("x2", f(X(i)));
        cursor.setAttribute("visibility", "visible");
        var at = el("span", null, relative(start + i * step, now) + ": ");
        at.title = utc(start + i * step);
        r.appendChild(at);
      } else {
        cursor.setAttribute("visibility", "hidden");
        r.appendChild(el("span", null, "now: "));
      }
      // Colour only what is flowing, so a quiet limit does not look alarming.
      r.appendChild(el("b", adm[i] > 0 ? "a" : null, rate(adm[i]) + "/s"));
      r.appendChild(document.createTextNode(" admitted · "));
      r.appendChild(el("b", ref[i] > 0 ? "r" : null, rate(ref[i]) + "/s"));
      r.appendChild(document.createTextNode(" refused"));
      if (showShadow) {
        r.appendChild(document.createTextNode(" · "));
        r.appendChild(el("b", null, rate(sha[i]) + "/s"));
        r.appendChild(document.createTextNode(" shadow-refused"));
      }
    }
    hit.addEventListener("mousemove", function (ev) {
      var box = hit.getBoundingClientRect();
      var frac = Math.min(1, Math.max(0, (ev.clientX - box.left) / box.width));
      hovers.set(name, frac);
      readout(frac);
    });
    hit.addEventListener("mouseleave", function () {
      hovers.delete(name);
      readout(undefined);
    });

    if (card.chart) card.plot.replaceChild(svg, card.chart);
    else card.plot.appendChild(svg);
    card.chart = svg;
    readout(hovers.get(name));
  }

  /* ---------- top refused, reloads ---------- */

  function renderTopRefused(rows, now) {
    $("top-refused-empty").hidden = rows.length > 0;
    if (!changed("top", rows)) return;
    var tbody = $("top-refused").tBodies[0];
    var max = 0;
    rows.forEach(function (r) { max = Math.max(max, num(r.refusals)); });
    var fresh = document.createElement("tbody");
    rows.forEach(function (r) {
      var tr = el("tr");
      tr.appendChild(el("td", "client", str(r.client)));
      tr.appendChild(el("td", "tier", str(r.tier) || "—"));
      tr.appendChild(el("td", "limit", str(r.limit)));
      var td = el("td", "num");
      var bar = svgEl("svg", { width: 60, height: 6, "aria-hidden": "true" });
      bar.appendChild(svgEl("rect", { "class": "bar-bg", width: 60, height: 6, rx: 3 }));
      var w = max > 0 ? Math.max(2, (num(r.refusals) / max) * 60) : 0;
      bar.appendChild(svgEl("rect", { "class": "bar", width: w.toFixed(1), height: 6, rx: 3 }));
      td.append(bar, document.createTextNode(count(r.refusals)));
      tr.appendChild(td);
      var last = el("td", "last");
      appendTime(last, r.last, now);
      tr.appendChild(last);
      fresh.appendChild(tr);
    });
    tbody.replaceWith(fresh);
  }

  function renderReloads(reloads, now) {
    if (!changed("reloads", reloads)) return;
    var list = $("reloads");
    list.textContent = "";
    if (!reloads.length) {
      list.appendChild(el("li", "empty", "No reloads since start."));
      return;
    }
    reloads.forEach(function (r) {
      var ok = !!r.ok;
      var li = el("li", ok ? "ok" : "bad");
      li.appendChild(el("span", "mark", ok ? "✓" : "✗"));
      var line = el("div");
      line.appendChild(el("span", "what", ok ? "reloaded" : "refused"));
      appendTime(line, r.at, now);
      li.appendChild(line);
      if (r.reason) li.appendChild(el("pre", "reason", str(r.reason)));
      list.appendChild(li);
    });
  }

  /* ---------- refresh loop ---------- */

  function render(data) {
    var now = num(data.now) || Date.now() / 1000;
    renderHeader(data, now);
    renderStore(data.store, now);
    renderConnections(data.connections);
    renderProtection(data.protection);
    renderLimits(Array.isArray(data.limits) ? data.limits : [], data, now);
    renderTopRefused(Array.isArray(data.top_refused) ? data.top_refused : [], now);
    renderReloads(Array.isArray(data.reloads) ? data.reloads : [], now);
    refreshTimes(now);
  }

  function tickUpdated() {
    var u = $("updated");
    if (!lastAt) {
      setText(u, "never");
    } else {
      var s = Math.floor((Date.now() - lastAt) / 1000);
      setText(u, s < 1 ? "just now" : duration(s) + " ago");
      u.title = utc(lastAt / 1000);
    }
    $("updated-box").classList.toggle("stale", !lastAt || Date.now() - lastAt > STALE_MS);
  }

  function showError(message) {
    var e = $("fetch-error");
    var since = lastAt ? " Showing data from " + duration((Date.now() - lastAt) / 1000) + " ago." : "";
    setText(e, "Could not refresh the status: " + message + "." + since);
    e.hidden = false;
  }

  function poll() {
    var ctl = new AbortController();
    var timer = setTimeout(function () { ctl.abort(); }, TIMEOUT_MS);
    fetch("/v1/status", {
      credentials: "same-origin",
      cache: "no-store",
      headers: { "Accept": "application/json" },
      signal: ctl.signal
    }).then(function (res) {
      if (res.status === 401) {
        $("fetch-error").hidden = true;
        $("session-expired").hidden = false;
        return;
      }
      if (!res.ok) {
        return res.text().then(function (body) {
          body = body.trim().slice(0, 200);
          throw new Error("HTTP " + res.status + (body ? " (" + body + ")" : ""));
        });
      }
      return res.json().then(function (data) {
        if (!data || typeof data !== "object") throw new Error("the answer is not a JSON object");
        render(data);
        last = data;
        lastAt = Date.now();
        $("fetch-error").hidden = true;
        $("session-expired").hidden = true;
      });
    }).catch(function (err) {
      showError(err && err.name === "AbortError" ? "no answer within " + TIMEOUT_MS / 1000 + " s" : String(err && err.message || err));
    }).then(function () {
      clearTimeout(timer);
      tickUpdated();
      setTimeout(poll, REFRESH_MS);
    });
  }

  // Charts are drawn at pixel size: redraw them when the layout width changes.
  var resizeTimer = 0;
  window.addEventListener("resize", function () {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(function () { if (last) render(last); }, 150);
  });

  setInterval(tickUpdated, 1000);
  poll();
})();
