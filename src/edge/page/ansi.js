// ANSI escape sequences to styled text nodes (log text never becomes HTML).
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
