// Rendering the rows near the viewport; selection and #L links.
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
    const stuck = st.stick || (st.follow && !st.paused);
    if (stuck) setScroll(g.maxScroll);
    st.stick = false;
    const top = g.maxScroll > 0 ? els.log.scrollTop / g.maxScroll * g.span : 0;
    const first = Math.max(0, Math.floor(top) - OVER), last = Math.min(g.rows, Math.ceil(top + g.h / g.lh) + OVER);
    const frag = document.createDocumentFragment(), used = new Set(), want = new Set();
    const search = st.search, sel = st.sel, mode = timesMode();
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
      if (mode !== 'off') {
        const ts = document.createElement('span'), ms = arrival(off);
        ts.className = 'ts';
        ts.textContent = ms === undefined ? '' : formatTime(ms, mode);
        el.append(ts);
      }
      el.append(mk, tx);
      if (sel && off >= sel.a && off <= sel.b) el.classList.add('sel');
      const group = st.groupAt && st.groupAt.get(off);
      if (raw !== undefined) painted(off);
      if (raw === undefined) { el.classList.add('gap'); tx.textContent = '…'; want.add(p); }
      else if (group) {
        el.classList.add('grp');
        if (shut(group)) el.classList.add('shut');
        tx.textContent = group.title;
        const cnt = document.createElement('span'), took = groupTook(group);
        cnt.className = 'cnt';
        cnt.textContent = `${groupLines(group)} lines`;
        tx.appendChild(cnt);
        if (took) { const dur = document.createElement('span'); dur.className = 'dur'; dur.textContent = took; tx.appendChild(dur); }
      } else {
        const parsed = parseLine(raw);
        if (ERR.test(parsed.text)) el.classList.add('err'); else if (WARN.test(parsed.text)) el.classList.add('warn');
        const hits = search && search.js ? matchesIn(search.js, parsed.text) : [];
        paint(tx, parsed, hits, search && search.lines[search.at] === off);
        const times = !filtering() && st.repeatAt.get(off);
        if (times) { const rep = document.createElement('span'); rep.className = 'rep'; rep.textContent = `× ${times}`; tx.appendChild(rep); }
      }
      frag.appendChild(el);
    }
    els.rows.replaceChildren(frag);
    const y = wrapped() ? wrappedAt(g, top, first, last, stuck) : els.log.scrollTop - (top - first) * g.lh;
    els.rows.style.transform = `translateY(${y}px)`;
    for (const p of want) fetchPage(p);
    for (const p of used) { const page = st.pages.get(p); if (page) { st.pages.delete(p); st.pages.set(p, page); } }
    evict(used);
  }
  // Wrapped rows differ in height. When they are all in the DOM they are
  // laid out as they are; else the row at the top of the view is put there
  // by its measured place, and at the end the last row at the bottom (the
  // spacer grows when the rows need more room than one line each).
  const wrapped = () => els.log.classList.contains('wrap');
  function wrappedAt(g, top, first, last, stuck) {
    const kids = els.rows.children, at = els.log.scrollTop;
    if (!kids.length) return at;
    const end = kids[kids.length - 1], height = end.offsetTop + end.offsetHeight;
    if (first === 0 && last >= g.rows) {
      els.spacer.style.height = Math.max(g.height, height) + 'px';
      if (stuck) setScroll(height - g.h);
      return 0;
    }
    let y;
    if (last >= g.rows && at >= g.maxScroll - 1) y = at + g.h - height;
    else {
      const row = kids[Math.max(0, Math.min(kids.length - 1, Math.floor(top) - first))];
      y = at - row.offsetTop - (top - Math.floor(top)) * row.offsetHeight;
    }
    if (y + height > g.height) els.spacer.style.height = Math.min(MAX_PX, y + height) + 'px';
    return y;
  }
  function setWrap(on) {
    els.log.classList.toggle('wrap', on);
    $('wrap').setAttribute('aria-pressed', String(on));
    $('wrap').textContent = on ? 'Wrap: on' : 'Wrap';
  }
  $('wrap').addEventListener('click', () => { setWrap(!wrapped()); setPref(WRAP_KEY, wrapped() ? '1' : ''); schedule(); });
  setWrap(pref(WRAP_KEY, '') === '1');
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
