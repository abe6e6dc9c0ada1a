// The SSE stream, the theme, and the wiring of controls and keys.
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
    Object.assign(st, { total: 0, pages: new Map(), times: new Map(), runStartMs: null, loading: new Set(), markers: new Map(), groups: [], groupAt: new Map(),
                        same: new Map(), repeatAt: new Map(),
                        toggled: new Map(), ranges: null, groupsTo: 0, levelsTo: 0, levelsReady: false, errors: 0, warnings: 0,
                        levelsCapped: false, search: null, follow: true });
    els.hits.textContent = ''; els.levels.replaceChildren();
  }
  async function follow(fqn, runId, after) {
    if (!fqn || !runId) { setStatus('choose a pipeline and a run', 'error'); return; }
    stop();
    Object.assign(st, { fqn, runId, failures: 0, info: null, sel: null, firstError: null });
    closeCompare();
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
    // A failed run opens at its first error; any other at its tail.
    if (!fromHash()) { if (st.info && st.info.state === 'failed') openAtFirstError(gen); else schedule(true); }
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
  $('times').addEventListener('click', () => {
    const next = TIME_MODES[(TIME_MODES.indexOf(timesMode()) + 1) % TIME_MODES.length];
    try { localStorage.setItem(TIMES_KEY, next); } catch (_) {}
    showTimesButton();
    schedule();
  });
  showTimesButton();
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
