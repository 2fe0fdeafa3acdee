// The retry-sidecar console: polls /api/state, /api/series and /api/tap once a second and draws them.
// Plain JavaScript, no build step; uPlot (vendored) draws the charts. Everything shown comes from the
// JSON endpoints (docs/console.md), so a script can read the same.
'use strict';
(function () {
  const PERIOD = 1000;          // ms between polls
  const POINTS = 300;           // chart points kept: 5 minutes at one a second
  const TAP_ROWS = 100;         // requests listed in the tap
  const ENDPOINT_ROWS = 200;    // endpoint rows shown per upstream until "show all"
  const SEVERITY = { draining: 0, ejected: 1, probing: 2, cooldown: 3, active: 4 };
  const STATE_TEXT = {
    active: 'active', cooldown: 'cooldown (overloaded)', ejected: 'ejected', probing: 'probing', draining: 'draining',
  };
  const PALETTE = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2', '#17becf',
    '#7f7f7f', '#bcbd22'];
  const $ = (id) => document.getElementById(id);

  // What the tests and bench/console.py read: polls done, render times, the charts' last point.
  const stats = { polls: 0, failures: 0, renderMs: [], lastT: null, points: 0 };
  window.sidecarConsole = stats;

  const view = {
    seriesNext: -1, epoch: null, tapNext: -1, tapRows: [], notable: [], missed: 0,
    t: [], pairs: new Map(), endpoints: new Map(), charts: {}, showAll: new Set(),
    listeners: new Set(), upstreams: new Set(),
  };

  // -- formatting ------------------------------------------------------------------------------------
  function esc(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));
  }
  function missing(v) { return v === null || v === undefined || Number.isNaN(v); }
  function rate(v) {
    if (missing(v)) return '–';
    return v < 10 ? v.toFixed(1) : String(Math.round(v));
  }
  function pct(v) { return missing(v) ? '–' : (v * 100).toFixed(1) + ' %'; }
  function fixed(v, d) { return missing(v) ? '–' : v.toFixed(d); }
  function ms(v) {
    if (missing(v)) return '–';
    return v < 10 ? v.toFixed(2) : v < 100 ? v.toFixed(1) : String(Math.round(v));
  }
  function count(v) { return missing(v) ? '–' : String(v); }
  function list(obj, fmt) {
    const parts = Object.entries(obj || {}).filter(([, n]) => n).map(([k, n]) => esc(k) + ' ' + fmt(n));
    return parts.length ? parts.join(' · ') : '–';
  }
  function sum(obj) { return Object.values(obj || {}).reduce((a, b) => a + b, 0); }
  function clock(t) {
    const d = new Date(t * 1000);
    return d.toLocaleTimeString([], { hour12: false }) + '.' + String(d.getMilliseconds()).padStart(3, '0');
  }
  function pairKey(p) { return p.listener + ' → ' + p.upstream; }
  function endpointKey(e) { return e.upstream + ' ' + e.endpoint; }
  function cell(field, value, text) {
    return '<td data-field="' + field + '" data-value="' + esc(value) + '">' + text + '</td>';
  }

  // -- fetching --------------------------------------------------------------------------------------
  async function getJSON(url) {
    const r = await fetch(url, { cache: 'no-store' });
    if (!r.ok) throw new Error(url + ' answered ' + r.status + ': ' + (await r.text()).trim());
    return r.json();
  }

  // Each answer is drawn as soon as it arrives (the tables first: /api/state is the quickest to make).
  async function poll() {
    const began = performance.now();
    let drawMs = 0;
    const timed = (f) => { const t = performance.now(); f(); drawMs += performance.now() - t; };
    try {
      const paused = $('tap-pause').checked;
      const tapUrl = '/api/tap?since=' + view.tapNext + '&limit=' + (paused ? 0 : TAP_ROWS);
      const [st] = await Promise.all([
        getJSON('/api/state').then((st) => { timed(() => drawState(st)); return st; }),
        getJSON('/api/series?since=' + view.seriesNext).then((series) => timed(() => { takeSeries(series); drawCharts(); })),
        getJSON(tapUrl).then((tap) => timed(() => { if (!paused) takeTap(tap); drawTap(); })),
      ]);
      stats.renderMs.push(drawMs);
      if (stats.renderMs.length > 600) stats.renderMs.splice(0, 300);
      stats.polls += 1;
      showBanner(null);
      $('updated').textContent = 'updated ' + clock(st.sidecar.now).slice(0, 8) + ' · drawn in '
        + drawMs.toFixed(0) + ' ms';
    } catch (e) {
      stats.failures += 1;
      showBanner('Cannot reach the sidecar (' + e.message + '); trying again every second.');
    }
    setTimeout(poll, Math.max(0, PERIOD - (performance.now() - began)));
  }

  function showBanner(text) {
    const b = $('banner');
    b.hidden = text === null;
    if (text !== null) b.textContent = text;
  }

  function drawState(st) {
    drawHeader(st);
    drawTraffic(st);
    drawUpstreams(st);
    drawListeners(st);
  }

  // -- header ----------------------------------------------------------------------------------------
  function drawHeader(st) {
    const ready = $('ready');
    ready.textContent = st.sidecar.ready ? 'ready' : 'not ready';
    ready.className = 'badge ' + (st.sidecar.ready ? 'ok' : 'bad');
    ready.dataset.ready = String(st.sidecar.ready);
    $('version').textContent = 'v' + st.sidecar.version + ' · up ' + Math.round(st.sidecar.uptime_s) + ' s';
    const cfg = st.config;
    const g = $('generation');
    g.dataset.generation = cfg.generation;
    let text = 'config generation ' + cfg.generation;
    let title = 'loaded at ' + clock(cfg.loaded_at);
    if (cfg.last_reload) {
      text += ' · last reload ' + cfg.last_reload.result + ' at ' + clock(cfg.last_reload.at).slice(0, 8);
      if (cfg.last_reload.messages.length) title += '\n' + cfg.last_reload.messages.join('\n');
    }
    g.textContent = text;
    g.title = title;
    g.className = cfg.last_reload && cfg.last_reload.result === 'rejected' ? 'warn' : '';
    $('tapstate').textContent = 'tap ' + (st.tap.armed ? 'recording' : 'idle') + ' · ' + st.tap.seq + ' requests';
  }

  // -- traffic ---------------------------------------------------------------------------------------
  function drawTraffic(st) {
    const rows = [];
    const totals = [];
    for (const p of st.traffic) {
      const key = esc(pairKey(p));
      const l = p.last || {};
      const retries = l.retries_by_cause || {};
      rows.push('<tr data-pair="' + key + '"><th>' + key + '</th>'
        + cell('rps', l.rps, rate(l.rps)) + cell('success', l.success, pct(l.success))
        + cell('amplification', l.amplification, fixed(l.amplification, 2))
        + cell('retries', l.retries, list(retries, rate)) + cell('hedges', l.hedges, rate(l.hedges))
        + cell('throttled', l.throttled, rate(l.throttled))
        + cell('deadline_expired', l.deadline_expired, rate(l.deadline_expired))
        + cell('p50', l.p50, ms(l.p50)) + cell('p99', l.p99, ms(l.p99)) + '</tr>');
      const t = p.totals;
      totals.push('<tr data-pair="' + key + '"><th>' + key + '</th>'
        + cell('requests', sum(t.requests), count(sum(t.requests))) + cell('by_reason', '', list(t.requests, count))
        + cell('attempts', sum(t.attempts), list(t.attempts, count))
        + cell('retries', sum(t.retries), list(t.retries, count))
        + cell('hedges', t.hedges, count(t.hedges)) + cell('throttled', t.throttled, count(t.throttled))
        + cell('deadline_expired', t.deadline_expired, count(t.deadline_expired)) + '</tr>');
    }
    const empty = '<tr><td colspan="10" class="muted">no request yet</td></tr>';
    $('traffic').tBodies[0].innerHTML = rows.join('') || empty;
    $('totals').tBodies[0].innerHTML = totals.join('') || empty;
  }

  // -- upstreams -------------------------------------------------------------------------------------
  function drawUpstreams(st) {
    const out = [];
    for (const u of st.upstreams) {
      view.upstreams.add(u.name);
      const facts = [];
      for (const t of u.throttles) facts.push('retry budget ' + esc(t.kind) + ': ' + fixed(t.tokens, 1) + ' / ' + fixed(t.capacity, 0) + ' tokens');
      if (u.retry_budget) {
        facts.push('retry_budget (' + esc(u.retry_budget.scope) + '): ' + fixed(u.retry_budget.tokens, 1)
          + ' tokens, ' + u.retry_budget.refused + ' refused');
      }
      if (u.fleet_share !== null) facts.push('fleet share ' + pct(u.fleet_share));
      if (u.ejections) facts.push('ejections: ' + list(u.ejections, count));
      if (u.concurrency) {
        facts.push('concurrency ' + esc(u.concurrency.mode) + ' ' + u.concurrency.min + '…' + u.concurrency.max);
      }
      const eps = u.endpoints.slice().sort((a, b) => SEVERITY[a.state] - SEVERITY[b.state]);
      const all = view.showAll.has(u.name);
      const shown = all ? eps : eps.slice(0, ENDPOINT_ROWS);
      const rows = shown.map((e) => {
        const c = e.concurrency;
        const left = missing(e.left_s) ? '' : ' ' + e.left_s.toFixed(1) + ' s';
        const outcomes = e.outcomes === null ? '<span class="muted">tap idle</span>' : outcomeBar(e.outcomes);
        const name = e.name ? ' <span class="muted">' + esc(e.name) + '</span>' : '';
        return '<tr data-endpoint="' + esc(e.endpoint) + '" data-state="' + esc(e.state) + '"><td>' + esc(e.endpoint) + name + '</td>'
          + '<td><span class="state ' + esc(e.state) + '">' + esc(STATE_TEXT[e.state] || e.state) + left + '</span></td>'
          + cell('outstanding', e.outstanding, count(e.outstanding))
          + cell('limit', c ? c.limit : '', c ? count(c.limit) : '–')
          + cell('in_use', c ? c.in_use : '', c ? count(c.in_use) : '–')
          + cell('queued', c ? c.queued : '', c ? count(c.queued) : '–')
          + cell('probe', c ? c.probe : '', c ? esc(c.probe) : '–')
          + '<td data-field="outcomes">' + outcomes + '</td></tr>';
      });
      let more = '';
      if (eps.length > ENDPOINT_ROWS) {
        more = '<button class="more" data-upstream="' + esc(u.name) + '">'
          + (all ? 'show the first ' + ENDPOINT_ROWS : 'show all ' + eps.length + ' endpoints') + '</button>';
      }
      out.push('<div class="upstream" data-upstream="' + esc(u.name) + '"><h3>' + esc(u.name)
        + ' <small>' + u.endpoints.length + ' endpoint' + (u.endpoints.length === 1 ? '' : 's') + '</small></h3>'
        + '<p class="facts">' + (facts.join(' · ') || '<span class="muted">no retry budget</span>') + '</p>'
        + '<table class="endpoints"><thead><tr><th>endpoint</th><th>state</th><th>outstanding</th><th>limit</th>'
        + '<th>in use</th><th>queued</th><th>probe</th><th>recent outcomes (10 s)</th></tr></thead><tbody>'
        + rows.join('') + '</tbody></table>' + more + '</div>');
    }
    $('upstreams').innerHTML = out.join('') || '<p class="muted">no upstream</p>';
  }

  function outcomeBar(outcomes) {
    const total = sum(outcomes);
    if (!total) return '<span class="muted">none</span>';
    // widths in twentieths, by class (console.css): the page's CSP allows no inline style attribute
    const bar = Object.entries(outcomes).filter(([, n]) => n)
      .map(([k, n]) => '<i class="o-' + esc(k) + ' w' + Math.max(1, Math.round((20 * n) / total)) + '"></i>').join('');
    return '<span class="bar" title="' + esc(list(outcomes, count)) + '">' + bar + '</span> ' + list(outcomes, count);
  }

  $('upstreams').addEventListener('click', (ev) => {
    const b = ev.target.closest('button.more');
    if (!b) return;
    const name = b.dataset.upstream;
    if (view.showAll.has(name)) view.showAll.delete(name); else view.showAll.add(name);
    if (view.lastState) drawUpstreams(view.lastState);
  });

  // -- listeners -------------------------------------------------------------------------------------
  function drawListeners(st) {
    view.lastState = st;
    const rows = st.listeners.map((l) => {
      view.listeners.add(l.name);
      const a = l.admission;
      let door = '<span class="muted">none</span>';
      let refusals = '–';
      if (a) {
        const parts = [];
        const reasons = [];
        for (const kind of ['requests', 'connections']) {
          const b = a[kind];
          if (!b) continue;
          parts.push(kind + ' ' + fixed(b.available, 1) + ' tokens free of ' + fixed(b.rate * b.burst, 0) + ' (' + rate(b.rate) + '/s)');
          for (const [r, n] of Object.entries(b.rejected)) reasons.push(esc(kind + ' ' + r) + ' ' + n);
        }
        door = esc(a.profile) + (a.shadow ? ' (shadow)' : '') + ': ' + parts.join('; ');
        refusals = reasons.join(' · ') || '–';
      }
      return '<tr data-listener="' + esc(l.name) + '"><th>' + esc(l.name) + '</th><td>' + esc(l.protocol) + '</td><td>'
        + esc(l.address) + '</td>' + cell('inflight', l.inflight, count(l.inflight))
        + cell('refused', l.refused_per_s, rate(l.refused_per_s)) + '<td>' + door + '</td><td>' + refusals + '</td>'
        + '<td>' + list(l.rejected, count) + '</td></tr>';
    });
    $('listeners').tBodies[0].innerHTML = rows.join('');
    fillSelect($('tap-listener'), view.listeners);
    fillSelect($('tap-upstream'), view.upstreams);
  }

  function fillSelect(sel, names) {
    if (sel.options.length - 1 === names.size) return;
    const keep = sel.value;
    sel.innerHTML = '<option value="">all</option>' + [...names].sort().map((n) => '<option>' + esc(n) + '</option>').join('');
    sel.value = keep;
  }

  // -- series and charts -----------------------------------------------------------------------------
  function takeSeries(s) {
    if (view.epoch !== s.epoch) {  // a new process: start over
      view.epoch = s.epoch;
      view.t = [];
      view.pairs.clear();
      view.endpoints.clear();
      if (view.seriesNext >= 0) { view.seriesNext = -1; return; }
    }
    const n = s.t.length;
    if (!n) return;
    const before = view.t.length;
    view.t.push(...s.t);
    append(view.pairs, s.pairs.map((p) => [pairKey(p), p]), ['success', 'amplification', 'p99'], before, n);
    append(view.endpoints, s.endpoints.map((e) => [endpointKey(e), e]), ['limit'], before, n);
    const extra = view.t.length - POINTS;
    if (extra > 0) {
      view.t.splice(0, extra);
      for (const m of [view.pairs, view.endpoints]) for (const lines of m.values()) for (const a of Object.values(lines)) a.splice(0, extra);
    }
    view.seriesNext = s.next - 1;
    stats.lastT = view.t[view.t.length - 1];
    stats.points = view.t.length;
  }

  function append(into, incoming, names, before, n) {
    const seen = new Set();
    for (const [key, src] of incoming) {
      seen.add(key);
      let lines = into.get(key);
      if (!lines) {
        lines = {};
        for (const name of names) lines[name] = new Array(before).fill(null);
        into.set(key, lines);
      }
      for (const name of names) lines[name].push(...src[name]);
    }
    for (const [key, lines] of into) {
      if (!seen.has(key)) for (const name of names) lines[name].push(...new Array(n).fill(null));
    }
  }

  const CHARTS = [
    { id: 'chart-success', from: 'pairs', line: 'success', range: [0, 1], ticks: (v) => (v * 100).toFixed(0) + ' %' },
    { id: 'chart-amplification', from: 'pairs', line: 'amplification' },
    { id: 'chart-p99', from: 'pairs', line: 'p99' },
    { id: 'chart-limit', from: 'endpoints', line: 'limit' },
  ];
  const LEGEND_MAX = 10;        // more lines than this: no legend (the tables name them)
  const hhmmss = (t) => new Date(t * 1000).toLocaleTimeString([], { hour12: false });

  function drawCharts() {
    for (const c of CHARTS) {
      const el = $(c.id);
      const source = c.from === 'pairs' ? view.pairs : view.endpoints;
      const keys = [...source.keys()].sort();
      const data = [view.t, ...keys.map((k) => source.get(k)[c.line])];
      const signature = keys.join('\n');
      let chart = view.charts[c.id];
      if (!chart || chart.signature !== signature) {
        if (chart) chart.plot.destroy();
        el.textContent = '';
        if (!keys.length) {
          el.innerHTML = '<p class="muted">' + (c.from === 'endpoints' ? 'no upstream with a concurrency block' : 'no data yet') + '</p>';
          view.charts[c.id] = { signature, plot: { destroy() {}, setData() {} } };
          continue;
        }
        const opts = {
          width: Math.max(280, el.clientWidth), height: 190,
          // the x axis always spans the last 5 minutes, the newest point at its right edge
          scales: { x: { time: true, range: (u, min, max) => [max - POINTS, max] }, y: c.range ? { range: c.range } : { auto: true } },
          axes: [
            { space: 70, values: (u, ticks) => ticks.map(hhmmss) },
            c.ticks ? { size: 56, values: (u, ticks) => ticks.map(c.ticks) } : { size: 56 },
          ],
          series: [{}, ...keys.map((k, i) => ({ label: k, stroke: PALETTE[i % PALETTE.length], width: 1.5, spanGaps: false }))],
          legend: { show: keys.length <= LEGEND_MAX, live: false },
        };
        chart = view.charts[c.id] = { signature, plot: new uPlot(opts, data, el) };
        if (keys.length > LEGEND_MAX) {
          el.insertAdjacentHTML('beforeend', '<p class="muted">' + keys.length + ' lines' + (c.from === 'endpoints'
            ? ' (the first endpoints seen, 32 at most an upstream); every limit is in the table below' : '') + '</p>');
        }
      } else {
        chart.plot.setData(data);
      }
      el.dataset.points = String(view.t.length);
      el.dataset.lastT = String(view.t.length ? view.t[view.t.length - 1] : '');
    }
  }

  window.addEventListener('resize', () => {
    for (const c of CHARTS) {
      const chart = view.charts[c.id];
      const el = $(c.id);
      if (chart && chart.plot.setSize) chart.plot.setSize({ width: Math.max(280, el.clientWidth), height: 190 });
    }
  });

  // -- tap -------------------------------------------------------------------------------------------
  // a request worth a look: it was retried (or hedged), or it did not end in success
  const notable = (r) => r.attempts.length > 1 || r.reason !== 'success';

  function takeTap(tap) {
    view.tapNext = tap.next;
    view.missed = tap.missed;
    if (!tap.records.length) return;
    const newest = tap.records.slice().reverse();
    view.tapRows = newest.concat(view.tapRows).slice(0, TAP_ROWS);
    view.notable = newest.filter(notable).concat(view.notable).slice(0, TAP_ROWS);
  }

  function attemptText(a) {
    let s = '<span class="attempt"><b>#' + a.n + (a.hedge ? ' hedge' : '') + '</b> ' + esc(a.endpoint) + ' ';
    if (a.outcome) {
      s += '<span class="o o-' + esc(a.outcome) + '">' + esc(a.outcome) + (a.detail ? ' ' + esc(a.detail) : '') + '</span>';
    } else if (a.cancelled) {
      s += '<span class="o o-cancelled">cancelled: ' + esc(a.cancelled) + '</span>';
    } else {
      s += '<span class="muted">in flight</span>';
    }
    if (a.ms !== undefined) s += ' ' + ms(a.ms) + ' ms';
    if (a.pushback_ms !== undefined) s += ', pushback ' + ms(a.pushback_ms) + ' ms';
    if (a.pushback === 'stop') s += ', pushback: do not retry';
    if (a.decision) s += ' → <span class="decision">' + esc(a.decision) + '</span>';
    if (a.wait_ms) s += ' (wait ' + ms(a.wait_ms) + ' ms)';
    return s + '</span>';
  }

  function drawTap() {
    const lf = $('tap-listener').value;
    const uf = $('tap-upstream').value;
    const source = $('tap-notable').checked ? view.notable : view.tapRows;
    const rows = source.filter((r) => (!lf || r.listener === lf) && (!uf || r.upstream === uf)).map((r) => {
      const result = esc(r.reason || '–') + (r.status ? ' (' + esc(r.status) + ')' : '');
      return '<tr data-seq="' + r.seq + '" data-reason="' + esc(r.reason) + '"><td>' + clock(r.at) + '</td><td>'
        + esc(r.listener + ' → ' + r.upstream) + '</td><td class="route">' + esc(r.route) + '</td><td>'
        + (r.attempts.map(attemptText).join('<br>') || '<span class="muted">no attempt</span>')
        + (r.deadline_ms !== undefined ? '<br><span class="muted">client deadline ' + ms(r.deadline_ms) + ' ms</span>' : '')
        + '</td><td class="r-' + esc(r.reason) + '">' + result + (r.error ? '<br><span class="muted">' + esc(r.error) + '</span>' : '')
        + '</td><td>' + ms(r.total_ms) + '</td></tr>';
    });
    $('tap').tBodies[0].innerHTML = rows.join('') || '<tr><td colspan="6" class="muted">no request since the tap started recording</td></tr>';
    $('tap-missed').textContent = view.missed ? view.missed + ' more in the last second not listed' : '';
  }

  for (const id of ['tap-notable', 'tap-listener', 'tap-upstream']) $(id).addEventListener('change', drawTap);

  poll();
})();
