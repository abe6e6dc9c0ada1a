// The pipeline's runs, live: the run list follows `…/runs/stream`; with
// "follow the newest run", a run that starts while the page is open opens.
  const MAX_LISTED = 500;               // runs kept in the list (the oldest go)
  const feed = { fqn: '', runs: new Map(), ctrl: null, cursor: null, failures: 0, timer: null, gen: 0 };

  function showRuns(prefer) {
    const runs = [...feed.runs.values()]
      .sort((a, b) => (b.createdMs || 0) - (a.createdMs || 0) || (a.runId < b.runId ? 1 : -1));
    for (const old of runs.slice(MAX_LISTED)) feed.runs.delete(old.runId);
    fillSelect(els.run, runs.slice(0, MAX_LISTED).map(runItem), prefer);
  }
  // The listing of `fqn` (`GET …/runs`), then its changes as they come.
  function listRuns(fqn, runs, preferRun) {
    if (feed.fqn !== fqn) feed.runs = new Map();
    // A new pipeline, or the stream gave up (a token typed in since, say).
    if (feed.fqn !== fqn || feed.failures > MAX_FAILURES) watchRuns(fqn);
    for (const r of runs) if (!feed.runs.has(r.runId)) feed.runs.set(r.runId, r);
    showRuns(preferRun);
  }
  function watchRuns(fqn) {
    feed.gen++;
    if (feed.ctrl) feed.ctrl.abort();
    clearTimeout(feed.timer);
    Object.assign(feed, { fqn, ctrl: null, cursor: null, failures: 0 });
    if (fqn) connectRuns(feed.gen);
  }
  async function connectRuns(gen) {
    const ctrl = new AbortController();
    feed.ctrl = ctrl;
    let url = `${API}/logs/${enc(feed.fqn)}/runs/stream`;
    if (feed.cursor != null) url += '?after=' + enc(feed.cursor);
    try {
      const res = await fetch(url, { headers: { ...authHeaders(), Accept: 'text/event-stream' }, cache: 'no-store', signal: ctrl.signal });
      if (!res.ok) throw await httpError(res);
      const reader = res.body.getReader(), dec = new TextDecoder();
      let buf = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done || gen !== feed.gen) break;
        buf = (buf + dec.decode(value, { stream: true })).replace(/\r\n/g, '\n');
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const data = buf.slice(0, i).split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trim()).join('');
          buf = buf.slice(i + 2);
          let ev = null;
          try { ev = JSON.parse(data); } catch (_) {}
          if (ev && gen === feed.gen) runsEvent(ev);
        }
      }
    } catch (_) { if (ctrl.signal.aborted) return; }
    if (gen !== feed.gen) return;
    // Closed (`complete`, a network failure, the edge stopping): again from the cursor.
    feed.failures++;
    if (feed.failures > MAX_FAILURES) return;
    const base = Math.min(BACKOFF_CAP_MS, BACKOFF_START_MS * 2 ** (feed.failures - 1));
    feed.timer = setTimeout(() => { if (gen === feed.gen) connectRuns(gen); }, base / 2 + Math.random() * base / 2);
  }
  function runsEvent(ev) {
    if (ev.after != null) feed.cursor = ev.after;
    if (ev.eventType !== 'run') return;
    feed.failures = 0;
    const known = feed.runs.has(ev.runId);
    feed.runs.set(ev.runId, ev);
    showRuns(els.run.value);
    if (ev.runId === st.runId && ev.pipeline === st.fqn) {
      st.info = { ...(st.info || {}), ...ev };
      showHead();
    }
    const newer = !st.runId || st.fqn !== ev.pipeline || (ev.createdMs || 0) > ((st.info && st.info.createdMs) || 0);
    if (!known && $('newest').checked && ev.pipeline === els.pipeline.value && newer) openRun(ev.pipeline, ev.runId);
  }
  // Follows another run, and says so in the address (a reload stays on it).
  function openRun(fqn, runId) {
    els.run.value = runId;
    const q = new URLSearchParams(location.search);
    q.set('fqn', fqn); q.set('run', runId); q.delete('after');
    history.replaceState(null, '', location.pathname + '?' + q.toString());
    follow(fqn, runId, null);
  }
  $('newest').checked = pref(NEWEST_KEY, '') === '1';
  $('newest').addEventListener('change', () => setPref(NEWEST_KEY, $('newest').checked ? '1' : ''));
