(() => {
  'use strict';
  const $ = (id) => document.getElementById(id);
  const API = '/api/v1';
  const RULES = /*RULES*/;              // the server's error, warning and group patterns
  const params = new URLSearchParams(location.search);
  const PAGE = 1000;                    // lines per page fetched from the store
  const TAIL = 1000;                    // lines shown at once when a run opens
  const CACHE_LINES = Math.max(10 * PAGE, Number(params.get('cacheLines')) || 100000); // memory bound
  const MAX_MATCHES = 10000, MAX_PX = 15e6, OVER = 20;
  const TOKEN_KEY = 'tailrace.token', THEME_KEY = 'tailrace.theme';
  const BACKOFF_START_MS = 500, BACKOFF_CAP_MS = 10000, MAX_FAILURES = 6;
  const enc = encodeURIComponent;
  const jsRegex = (pattern, flags) => pattern.startsWith('(?i)')
    ? new RegExp(pattern.slice(4), flags + 'i') : new RegExp(pattern, flags);
  const ERR = jsRegex(RULES.error, ''), WARN = jsRegex(RULES.warning, ''), GROUP = jsRegex(RULES.group, '');
  const els = { pipeline: $('pipeline'), run: $('run'), token: $('token'), pause: $('pause'), log: $('log'),
                spacer: $('spacer'), rows: $('rows'), status: $('status'), actions: $('actions'), head: $('run-head'),
                q: $('q'), regex: $('regex'), case: $('case'), filter: $('filter'), hits: $('hits'), levels: $('levels') };

  // One follow session; `gen` invalidates the callbacks of older ones.
  const st = { fqn: '', runId: '', cursor: null, ctrl: null, timer: null, gen: 0, failures: 0, paused: false,
               follow: true, total: 0, info: null, pages: new Map(), loading: new Set(), sel: null,
               markers: new Map(), groups: [], toggled: new Map(), ranges: null,
               groupsTo: 0, levelsTo: 0, errors: 0, warnings: 0, levelsCapped: false,
               search: null, pending: null, frame: 0, stick: false, programmatic: false, lineH: 19 };

  /* ---------- token, status and HTTP ---------- */
  function loadToken() { try { return sessionStorage.getItem(TOKEN_KEY) || ''; } catch (_) { return ''; } }
  function saveToken() {
    const t = els.token.value.trim();
    try { if (t) sessionStorage.setItem(TOKEN_KEY, t); else sessionStorage.removeItem(TOKEN_KEY); } catch (_) {}
  }
  function authHeaders() { const t = els.token.value.trim(); return t ? { Authorization: 'Bearer ' + t } : {}; }
  function setStatus(text, kind) { els.status.textContent = text; els.status.className = kind || ''; }
  const setFollowing = () => setStatus(`following (${st.total} lines)`, 'ok');
  async function httpError(res) {
    let text = '';
    try { text = (await res.text()).trim(); } catch (_) {}
    try { const j = JSON.parse(text); text = j.message || j.error || text; } catch (_) {}
    const err = new Error(`HTTP ${res.status}${text ? ': ' + String(text).slice(0, 300) : ''}`);
    err.status = res.status;
    return err;
  }
  async function getJson(path) {
    const res = await fetch(path, { headers: authHeaders(), cache: 'no-store' });
    if (!res.ok) throw await httpError(res);
    return res.json();
  }
  function showError(err) {
    if (err && (err.status === 401 || err.status === 403)) {
      setStatus(`${err.message} — please enter a valid token`, 'error');
      els.token.focus();
    } else setStatus(String((err && err.message) || err), 'error');
  }
  const runPath = () => `${API}/logs/${enc(st.fqn)}/runs/${enc(st.runId)}`;
  const lastPath = () => `${API}/services/ingestionPipelines/logs/${enc(st.fqn)}/last?runId=${enc(st.runId)}`;

  /* ---------- pickers ---------- */
  function fillSelect(sel, items, prefer) {
    sel.replaceChildren();
    for (const it of items) {
      const o = new Option(it.label, it.value);
      if (it.title) o.title = it.title;
      sel.appendChild(o);
    }
    if (prefer && !items.some((it) => it.value === prefer)) sel.prepend(new Option(prefer, prefer));
    sel.value = prefer || (items[0] ? items[0].value : '');
  }
  async function loadPipelines(preferFqn, preferRun) {
    try {
      const data = await getJson(`${API}/logs/pipelines`);
      fillSelect(els.pipeline, (data.pipelines || []).map((p) => ({ value: p, label: p })), preferFqn);
      if (els.pipeline.value) await loadRuns(els.pipeline.value, preferRun); else fillSelect(els.run, [], '');
    } catch (err) { if (!st.runId) showError(err); }
  }
  const STATE_MARK = { success: '✓', failed: '✗', stopped: '■', running: '●', queued: '○', partialSuccess: '◐' };
  async function loadRuns(fqn, preferRun) {
    try {
      const data = await getJson(`${API}/logs/${enc(fqn)}/runs`);
      if (fqn !== els.pipeline.value) return;
      fillSelect(els.run, (data.runs || []).map((r) => ({
        value: r.runId,
        label: `${STATE_MARK[r.state] || '·'} ${r.runId} (${r.state || 'unknown'}, ${r.lines ?? 0} lines)`,
        title: r.createdMs ? new Date(r.createdMs).toLocaleString() : '',
      })), preferRun);
    } catch (err) { if (!st.runId) showError(err); }
  }

  /* ---------- the run header ---------- */
  const bytes = (n) => n < 1024 ? `${n} B` : n < 1 << 20 ? `${(n / 1024).toFixed(1)} KiB` : `${(n / 1048576).toFixed(1)} MiB`;
  function duration(ms) {
    const s = Math.max(0, Math.round(ms / 1000));
    return s < 60 ? `${s}s` : s < 3600 ? `${Math.floor(s / 60)}m ${s % 60}s` : `${Math.floor(s / 3600)}h ${Math.floor(s % 3600 / 60)}m`;
  }
  function showHead() {
    const i = st.info;
    const items = [['pipeline', st.fqn], ['run', st.runId]];
    if (i) {
      const live = !i.state || i.state === 'running' || i.state === 'queued';
      items.push(['started', i.createdMs ? new Date(i.createdMs).toLocaleString() : '—'],
                 ['duration', duration((live ? Date.now() : i.updatedMs) - i.createdMs)],
                 ['lines', String(Math.max(i.lines, st.total))], ['bytes', bytes(i.bytes)]);
    }
    const parts = items.map(([k, v]) => { const s = document.createElement('span'); s.append(k + ' ');
      const b = document.createElement('b'); b.textContent = v; s.append(b); return s; });
    const state = document.createElement('span');
    state.id = 'run-state';
    state.className = 'state ' + ((i && i.state) || '');
    state.textContent = (i && i.state) || 'no status';
    els.head.replaceChildren(state, ...parts);
  }
  async function refreshHead(gen) {
    try { st.info = await getJson(runPath()); } catch (_) { return; }
    if (gen === st.gen) showHead();
  }

  /* ---------- ANSI: escape sequences to styled text nodes (never HTML) ---------- */
  const ESC = /\x1b(?:\[([0-?]*)[ -\/]*([@-~])|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_]?)/g;
  const CUBE = [0, 95, 135, 175, 215, 255];
  function color256(n) {
    if (n < 16) return `var(--c${n})`;
    if (n < 232) { n -= 16; return `rgb(${CUBE[Math.floor(n / 36)]},${CUBE[Math.floor(n / 6) % 6]},${CUBE[n % 6]})`; }
    const g = 8 + 10 * (n - 232); return `rgb(${g},${g},${g})`;
  }
  function extended(codes, i) { // 38;5;n or 38;2;r;g;b: [colour, codes used]
    if (codes[i + 1] === 5 && codes[i + 2] >= 0 && codes[i + 2] < 256) return [color256(codes[i + 2]), 3];
    if (codes[i + 1] === 2 && codes.length > i + 4) return [`rgb(${codes[i + 2] & 255},${codes[i + 3] & 255},${codes[i + 4] & 255})`, 5];
    return [null, 1];
  }
  function sgr(s, list) {
    const codes = list === '' ? [0] : list.split(/[;:]/).map((c) => c === '' ? 0 : Number(c));
    for (let i = 0; i < codes.length; i++) {
      const c = codes[i];
      if (c === 0) { s.fg = s.bg = null; s.b = s.d = s.i = s.u = s.v = s.x = false; }
      else if (c === 1) s.b = true; else if (c === 2) s.d = true; else if (c === 3) s.i = true;
      else if (c === 4) s.u = true; else if (c === 7) s.v = true; else if (c === 9) s.x = true;
      else if (c === 22) s.b = s.d = false; else if (c === 23) s.i = false; else if (c === 24) s.u = false;
      else if (c === 27) s.v = false; else if (c === 29) s.x = false;
      else if (c >= 30 && c <= 37) s.fg = `var(--c${c - 30})`; else if (c === 39) s.fg = null;
      else if (c >= 40 && c <= 47) s.bg = `var(--c${c - 40})`; else if (c === 49) s.bg = null;
      else if (c >= 90 && c <= 97) s.fg = `var(--c${c - 82})`; else if (c >= 100 && c <= 107) s.bg = `var(--c${c - 92})`;
      else if (c === 38 || c === 48) { const [col, used] = extended(codes, i); if (col) s[c === 38 ? 'fg' : 'bg'] = col; i += used - 1; }
    }
  }
  // A line as a terminal shows it: its last `\r` state, as [text, segments].
  function parseLine(raw) {
    const trimmed = raw.replace(/\r+$/, '');
    const cr = trimmed.lastIndexOf('\r');
    const line = cr >= 0 ? trimmed.slice(cr + 1) : trimmed;
    if (line.indexOf('\x1b') < 0) return { text: line, segs: [{ from: 0, to: line.length, s: null }] };
    const s = { fg: null, bg: null }, segs = [];
    let text = '', last = 0, m;
    const push = (chunk) => {
      if (!chunk) return;
      segs.push({ from: text.length, to: text.length + chunk.length, s: { ...s } });
      text += chunk;
    };
    ESC.lastIndex = 0;
    while ((m = ESC.exec(line))) {
      push(line.slice(last, m.index));
      if (m[2] === 'm') sgr(s, m[1]);
      last = ESC.lastIndex;
      if (m[0] === '') ESC.lastIndex++;
    }
    push(line.slice(last));
    return { text, segs };
  }
  const visibleText = (raw) => parseLine(raw).text;
  function styled(seg, text) {
    const s = seg.s;
    if (!s) return document.createTextNode(text);
    const span = document.createElement('span');
    span.textContent = text;
    const cls = [s.b && 'a1', s.d && 'a2', s.i && 'a3', s.u && 'a4', s.x && 'a9'].filter(Boolean);
    if (cls.length) span.className = cls.join(' ');
    const fg = s.v ? (s.bg || 'var(--panel)') : s.fg, bg = s.v ? (s.fg || 'var(--fg)') : s.bg;
    if (fg) span.style.color = fg;
    if (bg) span.style.backgroundColor = bg;
    return span;
  }
  // Fills `into` with the line's text, styled, with search matches marked.
  function paint(into, parsed, hits, now) {
    for (const seg of parsed.segs) {
      let at = seg.from;
      for (const [a, b] of hits) {
        if (b <= at || a >= seg.to) continue;
        if (a > at) into.appendChild(styled(seg, parsed.text.slice(at, a)));
        const mark = document.createElement('mark');
        if (now) mark.className = 'now';
        mark.appendChild(styled(seg, parsed.text.slice(Math.max(a, at), Math.min(b, seg.to))));
        into.appendChild(mark);
        at = Math.min(b, seg.to);
      }
      if (at < seg.to) into.appendChild(styled(seg, parsed.text.slice(at, seg.to)));
    }
  }

  /* ---------- the lines: pages of the store, a bounded cache ---------- */
  function getLine(off) {
    const page = st.pages.get(Math.floor(off / PAGE));
    return page ? page[off % PAGE] : undefined;
  }
  function put(at, lines) {
    for (let i = 0; i < lines.length; i++) {
      const off = at + i, p = Math.floor(off / PAGE);
      let page = st.pages.get(p);
      if (!page) { page = new Array(PAGE); st.pages.set(p, page); }
      page[off % PAGE] = lines[i];
    }
  }
  function evict(keep) {
    const tail = Math.floor(Math.max(0, st.total - 1) / PAGE);
    for (const p of st.pages.keys()) {
      if (st.pages.size * PAGE <= CACHE_LINES) break;
      if (!keep.has(p) && p !== tail) st.pages.delete(p);
    }
  }
  async function fetchPage(p) {
    if (st.loading.has(p)) return;
    st.loading.add(p);
    const gen = st.gen;
    try {
      let at = p * PAGE;
      const end = Math.min((p + 1) * PAGE, st.total);
      while (at < end) {
        const data = await getJson(`${lastPath()}&after=${at}&limit=${end - at}`);
        if (gen !== st.gen) return;
        const count = (data.after != null ? Number(data.after) : Number(data.total)) - at;
        if (!(count > 0)) break;
        put(at, String(data.logs).split('\n').slice(0, count));
        at += count;
      }
    } catch (err) { if (gen === st.gen) showError(err); }
    finally { st.loading.delete(p); if (gen === st.gen) schedule(); }
  }

  /* ---------- groups: ::group:: / ::endgroup::, section_start / section_end ---------- */
  function marker(raw) {
    const plain = raw.replace(ESC, '');
    if (!GROUP.test(plain)) return null;
    if (plain.startsWith('::group::')) return { start: true, title: plain.slice(9) || 'group' };
    if (plain.startsWith('::endgroup::')) return { start: false };
    const gitlab = /^section_(start|end):[0-9]+:([^\r\[]*)[^\r]*(?:\r(.*))?$/.exec(plain);
    if (!gitlab) return null;
    return gitlab[1] === 'start' ? { start: true, title: (gitlab[3] || gitlab[2] || 'section').trim() } : { start: false };
  }
  function noteMarkers(at, lines) {
    let changed = false;
    for (let i = 0; i < lines.length; i++) {
      if (lines[i].indexOf('::') < 0 && lines[i].indexOf('section_') < 0) continue;
      const m = marker(lines[i]);
      if (m && !st.markers.has(at + i)) { st.markers.set(at + i, m); changed = true; }
    }
    if (changed) buildGroups();
  }
  function buildGroups() {
    const stack = [], groups = [];
    for (const off of [...st.markers.keys()].sort((a, b) => a - b)) {
      const m = st.markers.get(off);
      if (m.start) { const g = { start: off, end: null, title: m.title, depth: stack.length }; groups.push(g); stack.push(g); }
      else if (stack.length) stack.pop().end = off;
    }
    st.groups = groups;
    st.groupAt = new Map(groups.map((g) => [g.start, g]));
    st.ranges = null;
  }
  const shut = (g) => st.toggled.has(g.start) ? st.toggled.get(g.start) : g.end != null;
  // Hidden line ranges [a, b), sorted and disjoint, with the rows they fold.
  function ranges() {
    if (st.ranges) return st.ranges;
    const list = [];
    let coveredTo = -1;
    for (const g of st.groups) {
      if (g.start < coveredTo) continue;
      if (shut(g)) { const b = g.end != null ? g.end + 1 : Math.max(st.total, g.start + 1); list.push([g.start + 1, b]); coveredTo = b; }
      else if (g.end != null) list.push([g.end, g.end + 1]);
    }
    list.sort((x, y) => x[0] - y[0]);
    const merged = [];
    for (const r of list) {
      const prev = merged[merged.length - 1];
      if (prev && r[0] <= prev[1]) prev[1] = Math.max(prev[1], r[1]); else merged.push([r[0], r[1]]);
    }
    let hidden = 0;
    const out = merged.map(([a, b]) => { const rowStart = a - hidden; hidden += b - a; return { a, b, rowStart, cum: hidden }; });
    st.ranges = out;
    return out;
  }
  function lastRange(list, key, value) { // the last entry whose `key` is <= value, by bisection
    let lo = 0, hi = list.length - 1, found = -1;
    while (lo <= hi) { const mid = (lo + hi) >> 1; if (list[mid][key] <= value) { found = mid; lo = mid + 1; } else hi = mid - 1; }
    return found;
  }
  function groupLines(g) { return (g.end != null ? g.end : st.total) - g.start - 1; }

  /* ---------- rows: lines as shown (groups folded, or only matches) ---------- */
  const filtering = () => els.filter.checked && st.search ? st.search.lines : null;
  function rowCount() {
    const only = filtering();
    if (only) return only.length;
    const list = ranges();
    const hidden = list.reduce((n, r) => n + Math.max(0, Math.min(r.b, st.total) - Math.min(r.a, st.total)), 0);
    return Math.max(0, st.total - hidden);
  }
  function lineOf(row) {
    const only = filtering();
    if (only) return only[row];
    const list = ranges(), i = lastRange(list, 'rowStart', row);
    return i < 0 ? row : row + list[i].cum;
  }
  function rowOf(line) {
    const only = filtering();
    if (only) return Math.max(0, lastRange(only.map((l) => ({ l })), 'l', line));
    const list = ranges(), i = lastRange(list, 'a', line);
    if (i < 0) return line;
    if (line < list[i].b) return rowOf(list[i].a - 1);
    return line - list[i].cum;
  }
  function reveal(line) { // opens every folded group that hides `line`
    let changed = false;
    for (const g of st.groups) {
      if (g.start < line && (g.end == null || line <= g.end) && shut(g)) { st.toggled.set(g.start, false); changed = true; }
    }
    if (changed) st.ranges = null;
  }

  /* ---------- rendering: only the rows near the viewport are in the DOM ---------- */
  function schedule(stick) {
    if (stick) st.stick = true;
    if (!st.frame) st.frame = requestAnimationFrame(render);
  }
  function geometry() {
    const rows = rowCount(), h = els.log.clientHeight, lh = st.lineH;
    const height = Math.min(rows * lh, MAX_PX);
    const maxScroll = Math.max(0, height - h), span = Math.max(0, rows - h / lh);
    return { rows, h, lh, height, maxScroll, span };
  }
  function render() {
    st.frame = 0;
    const g = geometry();
    els.spacer.style.height = g.height + 'px';
    if (st.stick || (st.follow && !st.paused)) setScroll(g.maxScroll);
    st.stick = false;
    const top = g.maxScroll > 0 ? els.log.scrollTop / g.maxScroll * g.span : 0;
    const first = Math.max(0, Math.floor(top) - OVER), last = Math.min(g.rows, Math.ceil(top + g.h / g.lh) + OVER);
    const frag = document.createDocumentFragment(), used = new Set(), want = new Set();
    const search = st.search, sel = st.sel;
    for (let row = first; row < last; row++) {
      const off = lineOf(row);
      const raw = getLine(off), p = Math.floor(off / PAGE);
      used.add(p);
      const el = document.createElement('div');
      el.className = 'ln';
      el.dataset.n = String(off + 1);
      el.dataset.off = String(off);
      const mk = document.createElement('span'), tx = document.createElement('span');
      mk.className = 'mk'; tx.className = 'tx';
      el.append(mk, tx);
      if (sel && off >= sel.a && off <= sel.b) el.classList.add('sel');
      const group = st.groupAt && st.groupAt.get(off);
      if (raw !== undefined) painted(off);
      if (raw === undefined) { el.classList.add('gap'); tx.textContent = '…'; want.add(p); }
      else if (group) {
        el.classList.add('grp');
        if (shut(group)) el.classList.add('shut');
        tx.textContent = group.title;
        const cnt = document.createElement('span');
        cnt.className = 'cnt';
        cnt.textContent = `${groupLines(group)} lines`;
        tx.appendChild(cnt);
      } else {
        const parsed = parseLine(raw);
        if (ERR.test(parsed.text)) el.classList.add('err'); else if (WARN.test(parsed.text)) el.classList.add('warn');
        const hits = search && search.js ? matchesIn(search.js, parsed.text) : [];
        paint(tx, parsed, hits, search && search.lines[search.at] === off);
      }
      frag.appendChild(el);
    }
    els.rows.replaceChildren(frag);
    els.rows.style.transform = `translateY(${els.log.scrollTop - (top - first) * g.lh}px)`;
    for (const p of want) fetchPage(p);
    for (const p of used) { const page = st.pages.get(p); if (page) { st.pages.delete(p); st.pages.set(p, page); } }
    evict(used);
  }
  // Marks for `bench viewer`: when the run's last line, and a search's
  // first match, were first painted (ms since navigation).
  function painted(off) {
    if (st.tailPaintedMs == null && st.total > 0 && off === st.total - 1) st.tailPaintedMs = performance.now();
    const s = st.search;
    if (s && s.searchMs == null && s.lines[s.at] === off) st.searchMs = s.searchMs = performance.now() - s.t0;
  }
  function matchesIn(re, text) {
    const out = [];
    re.lastIndex = 0;
    let m;
    while ((m = re.exec(text)) && out.length < 100) {
      if (m[0] === '') { re.lastIndex++; continue; }
      out.push([m.index, m.index + m[0].length]);
    }
    return out;
  }
  function scrollToLine(off) {
    reveal(off);
    st.follow = false;
    const g = geometry(), row = rowOf(off);
    els.spacer.style.height = g.height + 'px';
    const top = Math.max(0, row - g.h / g.lh / 3);
    setScroll(g.span > 0 ? Math.min(1, top / g.span) * g.maxScroll : 0);
    schedule();
  }
  function showAtTop(off) {
    reveal(off);
    const g = geometry();
    els.spacer.style.height = g.height + 'px';
    setScroll(g.span > 0 ? Math.min(1, rowOf(off) / g.span) * g.maxScroll : 0);
    schedule();
  }
  // Scrolls the log itself; the scroll event this causes is not the user's.
  function setScroll(value) {
    const target = Math.max(0, Math.min(value, els.log.scrollHeight - els.log.clientHeight));
    if (Math.abs(els.log.scrollTop - target) < 1) return;
    st.programmatic = true;
    els.log.scrollTop = target;
  }
  function topRow() { const g = geometry(); return g.maxScroll > 0 ? els.log.scrollTop / g.maxScroll * g.span : 0; }
  function atBottom() { return els.log.scrollTop >= els.log.scrollHeight - els.log.clientHeight - 2; }
  els.log.addEventListener('scroll', () => {
    if (st.programmatic) st.programmatic = false; else st.follow = atBottom();
    schedule();
  });
  window.addEventListener('resize', () => schedule());

  /* ---------- selection and links: #L120, #L120-L180 ---------- */
  function select(a, b, scroll) {
    st.sel = { a: Math.min(a, b), b: Math.max(a, b) };
    const { a: x, b: y } = st.sel;
    history.replaceState(null, '', location.pathname + location.search + (x === y ? `#L${x + 1}` : `#L${x + 1}-L${y + 1}`));
    if (scroll) scrollToLine(x); else schedule();
  }
  function fromHash() {
    const m = /^#L(\d+)(?:-L(\d+))?$/.exec(location.hash);
    if (!m) return false;
    const a = Number(m[1]) - 1, b = m[2] ? Number(m[2]) - 1 : a;
    st.sel = { a: Math.min(a, b), b: Math.max(a, b) };
    scrollToLine(st.sel.a);
    return true;
  }
  window.addEventListener('hashchange', fromHash);
  els.log.addEventListener('click', (e) => {
    const row = e.target.closest('.ln');
    if (!row) return;
    const off = Number(row.dataset.off);
    const gutter = parseFloat(getComputedStyle(row, '::before').width) || 0;
    if (e.clientX - row.getBoundingClientRect().left <= gutter) {
      if (e.shiftKey && st.sel) select(st.sel.a, off, false); else select(off, off, false);
      st.follow = false;
    } else if (row.classList.contains('grp')) {
      const g = st.groupAt.get(off);
      st.toggled.set(off, !shut(g));
      st.ranges = null;
      schedule();
    }
  });
  $('copy-link').addEventListener('click', async () => {
    try { await navigator.clipboard.writeText(location.href); setStatus('link copied', 'ok'); }
    catch (_) { setStatus(location.href, 'ok'); }
  });

  /* ---------- search over the whole run (the store's search endpoint) ---------- */
  function searchJs(q, regex, matchCase) {
    try { return new RegExp(regex ? q : q.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'), matchCase ? 'g' : 'gi'); }
    catch (_) { return null; }
  }
  // Pages through `query` from `after` (all of the run, or until `enough`); `each` gets every page.
  async function scan(query, after, gen, each, enough) {
    let next = String(after);
    while (next != null && gen === st.gen) {
      const data = await getJson(`${runPath()}/search?${query}&after=${next}`);
      if (gen !== st.gen) return null;
      const stop = each(data);
      next = data.next != null ? data.next : null;
      if (stop || (enough && enough())) return next;
    }
    return next;
  }
  async function startSearch() {
    const q = els.q.value;
    const gen = st.gen;
    if (!q || !st.runId) { st.search = null; els.hits.textContent = ''; schedule(); return; }
    const query = `q=${enc(q)}&regex=${els.regex.checked ? 1 : 0}&case=${els.case.checked ? 1 : 0}`;
    const search = { q, query, js: searchJs(q, els.regex.checked, els.case.checked), lines: [], at: -1, done: false, to: 0,
                     t0: performance.now(), searchMs: null };
    st.search = search;
    els.hits.textContent = 'searching…';
    try {
      const left = await scan(query, 0, gen, (data) => {
        if (st.search !== search) return true;
        for (const m of data.matches) if (search.lines.length < MAX_MATCHES) search.lines.push(m.line - 1);
        search.to = data.next != null ? Number(data.next) : data.total;
        showHits();
        return false;
      }, () => search.lines.length >= MAX_MATCHES);
      if (st.search !== search) return;
      search.done = left == null;
      showHits();
      if (search.lines.length) { search.at = -1; nextMatch(1); }
    } catch (err) { if (st.search === search) { els.hits.textContent = ''; showError(err); } }
  }
  function showHits() {
    const s = st.search;
    if (!s) { els.hits.textContent = ''; return; }
    const total = `${s.lines.length}${s.done ? '' : '+'}`;
    els.hits.textContent = s.lines.length ? `${s.at + 1} / ${total}` : (s.done ? 'no match' : `0 / ${total}`);
    if (els.filter.checked) schedule();
  }
  function current() { return st.sel ? st.sel.a : lineOf(Math.floor(topRow())) || 0; }
  function nextMatch(dir) {
    const s = st.search;
    if (!s || !s.lines.length) return;
    const here = s.at >= 0 ? s.lines[s.at] : current() - (dir > 0 ? 1 : 0);
    let i = dir > 0 ? s.lines.findIndex((l) => l > here) : s.lines.findLastIndex((l) => l < here);
    if (i < 0) i = dir > 0 ? 0 : s.lines.length - 1;
    s.at = i;
    showHits();
    const off = s.lines[i];
    st.sel = { a: off, b: off };
    scrollToLine(off);
  }
  async function nextError() {
    const gen = st.gen, from = (st.sel ? st.sel.a : current()) + 1;
    let found = null;
    try {
      await scan('level=error&limit=1', from, gen, (data) => { if (data.matches.length) found = data.matches[0].line - 1; return found != null; });
    } catch (err) { showError(err); return; }
    if (gen !== st.gen) return;
    if (found == null) { setStatus('no error after this line', 'warn'); return; }
    select(found, found, true);
  }
  function showLevels() {
    const plus = st.levelsCapped ? '+' : '';
    const e = document.createElement('span'), w = document.createElement('span');
    e.className = 'e'; w.className = 'w';
    e.textContent = `${st.errors}${plus} errors`; w.textContent = `${st.warnings}${plus} warnings`;
    els.levels.replaceChildren(e, ' · ', w);
  }
  // Counts errors and warnings over the run, and the group markers, from the store.
  async function scanRun(gen, to) {
    try {
      let end = to;
      for (const level of ['error', 'warning']) {
        let n = 0;
        const left = await scan(`level=${level}`, 0, gen, (data) => {
          n += data.matches.length;
          end = Math.max(end, data.next != null ? Number(data.next) : data.total);
          return false;
        }, () => n >= MAX_MATCHES);
        if (gen !== st.gen) return;
        if (left != null) st.levelsCapped = true;
        st[level === 'error' ? 'errors' : 'warnings'] += n;
      }
      st.levelsTo = end;
      st.levelsReady = true;
      showLevels();
      await scan('groups=1', 0, gen, (data) => {
        for (const m of data.matches) { const mk = marker(m.text); if (mk) st.markers.set(m.line - 1, mk); }
        return false;
      });
      if (gen !== st.gen) return;
      st.groupsTo = to;
      // Folding what finished must not move what the reader looks at.
      const anchor = st.follow && !st.paused ? null : lineOf(Math.floor(topRow()));
      buildGroups();
      if (st.sel) reveal(st.sel.a);
      if (anchor != null) showAtTop(anchor); else schedule();
    } catch (_) { /* the view works without them */ }
  }

  /* ---------- live lines ---------- */
  function received(at, lines) {
    put(at, lines);
    st.total = Math.max(st.total, at + lines.length);
    st.ranges = null;
    // What the store's scans did not cover yet, counted here.
    const fresh = lines.map((l, i) => [at + i, l]);
    noteMarkers(at, lines);
    for (const [off, l] of fresh) {
      const text = visibleText(l);
      if (st.levelsReady && off >= st.levelsTo) { if (ERR.test(text)) st.errors++; else if (WARN.test(text)) st.warnings++; }
      const s = st.search;
      if (s && s.done && s.js && off >= s.to && s.lines.length < MAX_MATCHES) {
        s.js.lastIndex = 0;
        if (s.js.test(text)) s.lines.push(off);
      }
    }
    if (st.levelsReady) showLevels();
    if (st.search) { st.search.to = Math.max(st.search.to, st.total); showHits(); }
    schedule(st.follow && !st.paused);
  }

  /* ---------- download ---------- */
  const downloadUrl = (fqn, runId) => `${API}/services/ingestionPipelines/logs/${enc(fqn)}/last/download?runId=${enc(runId)}`;
  const fileName = (fqn, runId) => `${fqn}-${runId}.log`.replace(/[^\w.-]+/g, '_');
  function clickLink(href, name) {
    const a = document.createElement('a');
    a.href = href; a.download = name;
    document.body.appendChild(a); a.click(); a.remove();
  }
  async function download(fqn, runId) {
    if (!fqn || !runId) { setStatus('choose a pipeline and a run', 'error'); return; }
    const url = downloadUrl(fqn, runId), headers = authHeaders();
    if (!headers.Authorization) { clickLink(url, fileName(fqn, runId)); return; }
    try {
      const res = await fetch(url, { headers, cache: 'no-store' });
      if (!res.ok) throw await httpError(res);
      const blobUrl = URL.createObjectURL(await res.blob());
      clickLink(blobUrl, fileName(fqn, runId));
      setTimeout(() => URL.revokeObjectURL(blobUrl), 60000);
    } catch (err) { showError(err); }
  }
  function addResumeButton() {
    const b = document.createElement('button');
    b.type = 'button'; b.id = 'resume'; b.textContent = 'Resume';
    b.addEventListener('click', resume);
    els.actions.replaceChildren(b);
  }
  function addDownloadLink() {
    const { fqn, runId } = st;
    const a = document.createElement('a');
    a.id = 'download-link'; a.href = downloadUrl(fqn, runId); a.download = fileName(fqn, runId);
    a.textContent = 'download the full log';
    a.addEventListener('click', (e) => { if (authHeaders().Authorization) { e.preventDefault(); download(fqn, runId); } });
    els.actions.replaceChildren(a);
  }

  /* ---------- the SSE stream, over fetch (EventSource cannot send headers) ---------- */
  function streamUrl() {
    let url = `${API}/services/ingestionPipelines/logs/${enc(st.fqn)}/stream/${enc(st.runId)}`;
    if (st.cursor != null && st.cursor !== '') url += '?after=' + enc(st.cursor);
    return url;
  }
  function stop() {
    st.gen++;
    clearTimeout(st.timer); st.timer = null;
    clearInterval(st.headTimer);
    if (st.ctrl) st.ctrl.abort();
    st.ctrl = null;
    els.actions.replaceChildren();
  }
  function reset() {
    Object.assign(st, { total: 0, pages: new Map(), loading: new Set(), markers: new Map(), groups: [], groupAt: new Map(),
                        toggled: new Map(), ranges: null, groupsTo: 0, levelsTo: 0, levelsReady: false, errors: 0, warnings: 0,
                        levelsCapped: false, search: null, follow: true });
    els.hits.textContent = ''; els.levels.replaceChildren();
  }
  async function follow(fqn, runId, after) {
    if (!fqn || !runId) { setStatus('choose a pipeline and a run', 'error'); return; }
    stop();
    Object.assign(st, { fqn, runId, failures: 0, info: null, sel: null });
    reset();
    const gen = st.gen;
    showHead();
    setStatus('opening');
    try { st.info = await getJson(runPath()); } catch (err) { if (err.status !== 404) { showError(err); } }
    if (gen !== st.gen) return;
    st.total = st.info ? st.info.lines : 0;
    showHead();
    st.cursor = after != null ? after : String(Math.max(0, st.total - TAIL));
    connect(gen);
    if (!fromHash()) schedule(true);
    if (st.total > 0) scanRun(gen, st.total); else { st.levelsReady = true; showLevels(); }
    st.headTimer = setInterval(() => refreshHead(gen), 10000);
    if (els.q.value) startSearch();
  }
  function resume() { stop(); st.failures = 0; connect(st.gen); }
  async function connect(gen) {
    const ctrl = new AbortController();
    st.ctrl = ctrl;
    els.actions.replaceChildren();
    setStatus('connecting');
    try {
      const res = await fetch(streamUrl(), { headers: { ...authHeaders(), Accept: 'text/event-stream' }, cache: 'no-store', signal: ctrl.signal });
      if (!res.ok) {
        const err = await httpError(res);
        if (res.status >= 400 && res.status < 500 && res.status !== 408 && res.status !== 429) { if (gen === st.gen) showError(err); return; }
        throw err;
      }
      if (gen !== st.gen) return;
      setFollowing();
      const reader = res.body.getReader(), dec = new TextDecoder();
      let buf = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf = (buf + dec.decode(value, { stream: true })).replace(/\r\n/g, '\n');
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const frame = buf.slice(0, i);
          buf = buf.slice(i + 2);
          if (gen !== st.gen) return;
          if (handleFrame(frame, gen)) { ctrl.abort(); return; }
        }
      }
    } catch (err) { if (ctrl.signal.aborted || gen !== st.gen) return; }
    if (gen === st.gen) scheduleReconnect(gen);
  }
  function scheduleReconnect(gen) {
    st.failures++;
    if (st.failures >= MAX_FAILURES) { setStatus('disconnected', 'error'); addResumeButton(); return; }
    const base = Math.min(BACKOFF_CAP_MS, BACKOFF_START_MS * 2 ** (st.failures - 1));
    const delay = Math.round(base / 2 + Math.random() * base / 2);
    setStatus(`reconnecting in ${(delay / 1000).toFixed(1)}s`, 'warn');
    st.timer = setTimeout(() => { if (gen === st.gen) connect(gen); }, delay);
  }
  const END_REASONS = { runFinished: 'run finished', idleTimeout: 'stream ended: no new output (idle timeout)',
                        maxDuration: 'stream ended: maximum stream duration reached', maxBytes: 'stream ended: size limit reached' };
  function handleFrame(frame, gen) {
    st.failures = 0;
    const data = frame.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(l.startsWith('data: ') ? 6 : 5)).join('\n');
    if (!data) return false;
    let ev;
    try { ev = JSON.parse(data); } catch (_) { return false; }
    switch (ev && ev.eventType) {
      case 'logs': {
        if (ev.truncated) { reset(); st.cursor = null; schedule(true); }
        if (ev.after != null) {
          const after = Number(ev.after), lines = ev.logs === '' && after === Number(st.cursor) ? [] : String(ev.logs).split('\n');
          received(after - lines.length, lines);
          st.cursor = String(ev.after);
        }
        setFollowing();
        return false;
      }
      case 'complete': {
        if (ev.after != null) st.cursor = String(ev.after);
        let text = END_REASONS[ev.reason] || 'stream ended' + (ev.reason ? ': ' + ev.reason : '');
        if (ev.message) text += ' — ' + ev.message;
        setStatus(text, ev.reason === 'runFinished' ? 'ok' : 'warn');
        if (ev.reason === 'idleTimeout' || ev.reason === 'maxDuration') addResumeButton();
        else if (ev.reason === 'maxBytes') addDownloadLink();
        refreshHead(gen);
        clearInterval(st.headTimer);
        return true;
      }
      case 'error':
        setStatus('error: ' + (ev.message || 'unknown error'), 'error');
        return true;
      default:
        return false;
    }
  }

  /* ---------- theme ---------- */
  function applyTheme() {
    let theme = null;
    try { theme = localStorage.getItem(THEME_KEY); } catch (_) {}
    if (!theme) theme = matchMedia('(prefers-color-scheme: dark)').matches ? 'dark' : 'light';
    document.documentElement.dataset.theme = theme;
  }
  $('theme').addEventListener('click', () => {
    const next = document.documentElement.dataset.theme === 'dark' ? 'light' : 'dark';
    try { localStorage.setItem(THEME_KEY, next); } catch (_) {}
    applyTheme();
  });
  matchMedia('(prefers-color-scheme: dark)').addEventListener('change', applyTheme);
  applyTheme();

  /* ---------- wiring and keys ---------- */
  $('controls').addEventListener('submit', (e) => { e.preventDefault(); saveToken(); follow(els.pipeline.value, els.run.value, null); });
  $('find').addEventListener('submit', (e) => { e.preventDefault(); startSearch(); });
  for (const box of [els.regex, els.case]) box.addEventListener('change', () => { if (els.q.value) startSearch(); });
  els.filter.addEventListener('change', () => { st.ranges = null; schedule(); });
  $('next').addEventListener('click', () => nextMatch(1));
  $('prev').addEventListener('click', () => nextMatch(-1));
  $('next-error').addEventListener('click', nextError);
  els.pipeline.addEventListener('change', () => loadRuns(els.pipeline.value, ''));
  els.token.addEventListener('change', () => { saveToken(); loadPipelines(els.pipeline.value, els.run.value); });
  function toEnd() { st.paused = false; st.follow = true; setPaused(false); schedule(true); }
  function setPaused(paused) {
    st.paused = paused;
    els.pause.textContent = paused ? 'Resume auto-scroll' : 'Pause auto-scroll';
    els.pause.setAttribute('aria-pressed', String(paused));
  }
  els.pause.addEventListener('click', () => { setPaused(!st.paused); if (!st.paused) toEnd(); });
  $('end').addEventListener('click', toEnd);
  $('download').addEventListener('click', () => {
    const fqn = els.pipeline.value, runId = els.run.value;
    if (fqn && runId) download(fqn, runId); else download(st.fqn, st.runId);
  });
  document.addEventListener('keydown', (e) => {
    const typing = /^(INPUT|SELECT|TEXTAREA)$/.test(e.target.tagName);
    if (typing) { if (e.key === 'Escape') e.target.blur(); return; }
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    if (e.key === '/') { e.preventDefault(); els.q.focus(); els.q.select(); }
    else if (e.key === 'n') nextMatch(1);
    else if (e.key === 'N') nextMatch(-1);
    else if (e.key === 'End') { e.preventDefault(); toEnd(); }
    else if (e.key === 'g') {
      const n = Number(prompt('Go to line', st.sel ? String(st.sel.a + 1) : ''));
      if (n >= 1) select(n - 1, n - 1, true);
    }
  });

  // ?fqn=..&run=..[&after=..][&token=..] start following at once; #L… selects lines.
  const urlToken = params.get('token');
  els.token.value = urlToken != null ? urlToken : loadToken();
  if (urlToken != null) {
    saveToken();
    params.delete('token');
    const qs = params.toString();
    history.replaceState(null, '', location.pathname + (qs ? '?' + qs : '') + location.hash);
  }
  const probe = document.createElement('div');
  probe.className = 'ln'; probe.textContent = 'x';
  els.rows.appendChild(probe);
  st.lineH = probe.getBoundingClientRect().height || 19;
  probe.remove();
  const qFqn = params.get('fqn') || '', qRun = params.get('run') || '';
  if (qFqn) fillSelect(els.pipeline, [], qFqn);
  if (qRun) fillSelect(els.run, [], qRun);
  if (qFqn && qRun) follow(qFqn, qRun, params.get('after'));
  loadPipelines(qFqn, qRun);
  window.tailraceViewer = { state: st, rows: () => rowCount() };
})();
