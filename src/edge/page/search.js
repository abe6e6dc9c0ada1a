// Search over the whole run, error and warning counts, live lines, download.
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
  // A failed run opens at its first error, selected, its group unfolded
  // (again once the groups are known: `scanRun`).
  async function openAtFirstError(gen) {
    let found = null;
    try {
      await scan('level=error&limit=1', 0, gen, (data) => { if (data.matches.length) found = data.matches[0].line - 1; return found != null; });
    } catch (_) { /* the tail, then */ }
    if (gen !== st.gen) return;
    if (found == null) { schedule(true); return; }
    st.firstError = found;
    st.sel = { a: found, b: found };
    scrollToLine(found);
  }
  function showLevels() {
    const plus = st.levelsCapped ? '+' : '';
    const e = document.createElement('span'), w = document.createElement('span');
    e.className = 'e'; w.className = 'w';
    const counted = (n, word) => `${n}${plus} ${word}${n === 1 && !plus ? "" : "s"}`;
    e.textContent = counted(st.errors, "error"); w.textContent = counted(st.warnings, "warning");
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
      if (st.sel && st.sel.a === st.firstError) scrollToLine(st.firstError);
      else if (anchor != null) showAtTop(anchor); else schedule();
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
