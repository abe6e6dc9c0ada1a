// Compare with last success: the run's diff against the pipeline's last
// successful run before it (`…/diff?against=last-success`), its hunks in
// place of the log, the first divergence in view. Line numbers are links:
// the new run's to `#L…` here, the old run's to that line of the old run.
  const MAX_DIFF_ROWS = 5000;           // lines of hunks in the DOM at most
  const diffEl = $('diff'), compareBtn = $('compare');
  const cmp = { on: false, rows: 0, against: '' };

  function closeCompare() {
    if (!cmp.on) return;
    cmp.on = false;
    diffEl.hidden = true; diffEl.replaceChildren();
    els.log.hidden = false;
    compareBtn.setAttribute('aria-pressed', 'false');
    compareBtn.textContent = 'Compare with last success';
    schedule();
  }
  async function compare(after) {
    const gen = st.gen;
    if (!st.runId) { setStatus('choose a pipeline and a run', 'error'); return; }
    let data;
    try { data = await getJson(`${runPath()}/diff?against=last-success${after != null ? '&after=' + enc(after) : ''}`); }
    catch (err) { if (gen === st.gen) showError(err); return; }
    if (gen !== st.gen) return;
    if (after == null) openDiff(data);
    for (const hunk of data.hunks || []) addHunk(hunk, data);
    if (data.next != null && cmp.rows < MAX_DIFF_ROWS) addMore(data.next);
    if (after == null) {
      const first = diffEl.querySelector('.dl.add, .dl.del');
      if (first) first.scrollIntoView({ block: 'center' });
    }
  }
  function openDiff(data) {
    cmp.on = true; cmp.rows = 0; cmp.against = data.against;
    els.log.hidden = true; diffEl.hidden = false;
    compareBtn.setAttribute('aria-pressed', 'true');
    compareBtn.textContent = 'Back to the log';
    const head = document.createElement('div');
    head.className = 'dh';
    const rules = (data.rules || []).join(', ');
    head.textContent = data.identical
      ? `${data.run} shows the same lines as ${data.against} (the last success), once ${rules} are set aside`
      : `${data.run} (${data.newLines} lines) against ${data.against} (the last success, ${data.oldLines} lines); set aside: ${rules}`;
    diffEl.replaceChildren(head);
    setStatus(data.identical ? 'identical to the last success' : `compared with ${data.against}`, 'ok');
  }
  function lineLink(n, run) {
    const a = document.createElement('a');
    a.className = 'no';
    if (n == null) return a;
    a.textContent = String(n);
    if (run === st.runId) {
      a.href = `#L${n}`;
      a.addEventListener('click', (e) => { e.preventDefault(); closeCompare(); select(n - 1, n - 1, true); });
    } else a.href = `?fqn=${enc(st.fqn)}&run=${enc(run)}#L${n}`;
    return a;
  }
  function addHunk(hunk, data) {
    const head = document.createElement('div');
    head.className = 'dh';
    head.textContent = `@@ -${hunk.old[0]},${hunk.old[1]} +${hunk.new[0]},${hunk.new[1]} @@`;
    diffEl.appendChild(head);
    for (const line of hunk.lines) {
      if (cmp.rows >= MAX_DIFF_ROWS) { note(`… the first ${MAX_DIFF_ROWS} lines of the diff are shown`); return; }
      cmp.rows++;
      const row = document.createElement('div'), op = document.createElement('span'), tx = document.createElement('span');
      row.className = 'dl ' + (line.op === '+' ? 'add' : line.op === '-' ? 'del' : 'ctx');
      op.className = 'op'; op.textContent = line.op;
      tx.className = 'tx';
      paint(tx, parseLine(String(line.text)), [], false);
      row.append(lineLink(line.old, data.against), lineLink(line.new, data.run), op, tx);
      diffEl.appendChild(row);
    }
  }
  function note(text) { const n = document.createElement('div'); n.className = 'dh'; n.textContent = text; diffEl.appendChild(n); }
  function addMore(next) {
    const b = document.createElement('button');
    b.type = 'button'; b.textContent = 'More changes';
    b.addEventListener('click', () => { b.remove(); compare(next); });
    diffEl.appendChild(b);
  }
  compareBtn.addEventListener('click', () => { if (cmp.on) closeCompare(); else compare(null); });
  window.addEventListener('hashchange', () => { if (cmp.on && /^#L\d/.test(location.hash)) { closeCompare(); fromHash(); } });
