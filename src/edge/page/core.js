// The viewer's state, settings, HTTP helpers, the pickers and the run's header.
  const $ = (id) => document.getElementById(id);
  const API = '/api/v1';
  const RULES = /*RULES*/;              // the server's error, warning and group patterns
  const params = new URLSearchParams(location.search);
  const PAGE = 1000;                    // lines per page fetched from the store
  const TAIL = 1000;                    // lines shown at once when a run opens
  const CACHE_LINES = Math.max(10 * PAGE, Number(params.get('cacheLines')) || 100000); // memory bound
  const MAX_MATCHES = 10000, MAX_PX = 15e6, OVER = 20;
  const TOKEN_KEY = 'tailrace.token', THEME_KEY = 'tailrace.theme', WRAP_KEY = 'tailrace.wrap', NEWEST_KEY = 'tailrace.newest';
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
               follow: true, total: 0, info: null, pages: new Map(), times: new Map(), runStartMs: null,
               loading: new Set(), sel: null,
               markers: new Map(), groups: [], toggled: new Map(), ranges: null, same: new Map(), repeatAt: new Map(),
               groupsTo: 0, levelsTo: 0, errors: 0, warnings: 0, levelsCapped: false,
               search: null, pending: null, frame: 0, stick: false, programmatic: false, lineH: 19 };

  /* ---------- preferences (localStorage: times, wrap, theme, newest) ---------- */
  function pref(key, fallback) { try { return localStorage.getItem(key) ?? fallback; } catch (_) { return fallback; } }
  function setPref(key, value) { try { localStorage.setItem(key, value); } catch (_) {} }

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
      if (it.state) o.className = 'state-' + it.state;
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
  const runItem = (r) => ({
    value: r.runId,
    label: `${STATE_MARK[r.state] || '·'} ${r.runId} (${r.state || 'unknown'}, ${r.lines ?? 0} lines)`,
    title: r.createdMs ? new Date(r.createdMs).toLocaleString() : '',
    state: r.state || '',
  });
  async function loadRuns(fqn, preferRun) {
    try {
      const data = await getJson(`${API}/logs/${enc(fqn)}/runs`);
      if (fqn !== els.pipeline.value) return;
      listRuns(fqn, data.runs || [], preferRun); // the list, then its live changes (runs.js)
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
