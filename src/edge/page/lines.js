// The lines (pages of the store in a bounded cache), their arrival times,
// groups, repeated lines, and the rows they show as.
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
    noteRepeats(at, at + lines.length + 1);
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

  /* ---------- repeated lines: consecutive lines that show the same, one row `× N` ---------- */
  // Per page, a flag for each line that shows as the one before it (both
  // loaded; group markers never repeat). Flags outlive evicted pages (a
  // byte per line), so rows do not move when a page goes.
  const plainLine = (raw) => raw.indexOf('\x1b') < 0 && raw.indexOf('\r') < 0;
  const markerLike = (raw) => raw.indexOf('::') >= 0 || raw.indexOf('section_') >= 0;
  function sameShown(a, b) {
    if (a === b) return !markerLike(a);
    if (plainLine(a) && plainLine(b)) return false;
    return !markerLike(a) && !markerLike(b) && visibleText(a) === visibleText(b);
  }
  function noteRepeats(from, to) {
    for (let off = Math.max(1, from); off < to; off++) {
      const a = getLine(off - 1), b = getLine(off);
      if (a === undefined || b === undefined) continue;
      const p = Math.floor(off / PAGE), same = sameShown(a, b) ? 1 : 0;
      let page = st.same.get(p);
      if (!page) { if (!same) continue; page = { flags: new Uint8Array(PAGE), n: 0 }; st.same.set(p, page); }
      if (page.flags[off % PAGE] === same) continue;
      page.flags[off % PAGE] = same;
      page.n += same ? 1 : -1;
      st.ranges = null;
    }
  }
  // The runs of repeats as hidden ranges [a, b); the line before each shows `× N`.
  function repeatRanges(list) {
    st.repeatAt = new Map();
    let start = -1;
    const close = (end) => { if (start >= 0) { list.push([start, end]); st.repeatAt.set(start - 1, end - start + 1); start = -1; } };
    let prev = -2;
    for (const p of [...st.same.keys()].sort((x, y) => x - y)) {
      const page = st.same.get(p);
      if (prev !== p - 1) close((prev + 1) * PAGE);
      prev = p;
      if (!page.n) { close(p * PAGE); continue; }
      for (let i = 0; i < PAGE; i++) {
        if (page.flags[i]) { if (start < 0) start = p * PAGE + i; } else close(p * PAGE + i);
      }
    }
    close((prev + 1) * PAGE);
  }

  /* ---------- when lines arrived (the store's marks, per page, on demand) ---------- */
  const TIMES_KEY = 'tailrace.times', TIME_MODES = ['off', 'clock', 'start'];
  function timesMode() { try { return localStorage.getItem(TIMES_KEY) || 'off'; } catch (_) { return 'off'; } }
  function showTimesButton() { const m = timesMode(); $('times').textContent = m === 'off' ? 'Times' : m === 'clock' ? 'Times: clock' : 'Times: since start'; }
  async function fetchTimes(p) {
    const gen = st.gen, entry = { marks: null, at: Date.now(), complete: (p + 1) * PAGE <= (st.info ? st.info.lines : 0) };
    st.times.set(p, entry);
    try {
      const data = await getJson(`${runPath()}/times?after=${p * PAGE}&limit=${PAGE}`);
      if (st.runStartMs == null) {
        const first = await getJson(`${runPath()}/times?after=0&limit=1`);
        st.runStartMs = first.marks.length ? first.marks[0][1] : (st.info ? st.info.createdMs : 0);
      }
      if (gen !== st.gen) return;
      entry.marks = data.marks.map(([line, ms]) => [line - 1, ms]);
      entry.complete = entry.complete || (p + 1) * PAGE <= st.total - PAGE;
    } catch (_) { entry.marks = []; }
    schedule();
  }
  // When line `off` arrived (ms), or undefined while its page's marks load.
  function arrival(off) {
    const p = Math.floor(off / PAGE), entry = st.times.get(p);
    if (!entry || (!entry.complete && entry.marks && Date.now() - entry.at > 1000)) { fetchTimes(p); return undefined; }
    if (!entry.marks) return undefined;
    let found;
    for (const [at, ms] of entry.marks) { if (at <= off) found = ms; else break; }
    return found;
  }
  // How long a group took: from its first line's arrival to its last's.
  function groupTook(g) {
    const from = arrival(g.start), to = arrival(g.end != null ? g.end : Math.max(g.start, st.total - 1));
    if (from === undefined || to === undefined) return '';
    const ms = Math.max(0, to - from);
    return ms < 10000 ? `${(ms / 1000).toFixed(1)}s` : duration(ms);
  }
  const pad = (n, w) => String(n).padStart(w, '0');
  function formatTime(ms, mode) {
    if (mode === 'clock') { const d = new Date(ms); return `${pad(d.getHours(), 2)}:${pad(d.getMinutes(), 2)}:${pad(d.getSeconds(), 2)}.${pad(d.getMilliseconds(), 3)}`; }
    const t = Math.max(0, ms - (st.runStartMs || ms));
    const m = Math.floor(t / 60000), s = Math.floor(t / 1000) % 60;
    return `+${m}:${pad(s, 2)}.${pad(t % 1000, 3)}`;
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
    repeatRanges(list);
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
