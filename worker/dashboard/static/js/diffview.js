// A unified diff (as the API returns it) rendered per file: the file's name as the API
// quoted it, added/removed/context lines coloured, the code in them highlighted, and
// the diff's own notes (binary files, content not kept, trees) said in words.

import { button, h } from './dom.js';
import { highlight, langOf } from './highlight.js';

const MAX_LINES = 4000;

function pathOf(header) {
  // "--- a/x" / "+++ b/x" or quoted: "--- \"a/x\\ny\"" (the name stays as quoted)
  let p = header.slice(4);
  if (p === '/dev/null') return null;
  const quoted = p.startsWith('"');
  if (quoted) p = p.slice(1, -1);
  p = p.replace(/^[ab]\//, '');
  return quoted ? `"${p}"` : p;
}

/** Split a unified diff into files: [{old, new, lines: [...], notes: [...]}]. */
export function parseDiff(text) {
  const files = [];
  let cur = null;
  let oldLeft = 0; // lines of the current hunk still to come: they are content, whatever they start with
  let newLeft = 0;
  const lines = text.split('\n');
  if (lines[lines.length - 1] === '') lines.pop();
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    if (cur && (oldLeft > 0 || newLeft > 0)) {
      cur.lines.push(line);
      if (line[0] === '-') oldLeft -= 1;
      else if (line[0] === '+') newLeft -= 1;
      else if (line[0] === ' ') {
        oldLeft -= 1;
        newLeft -= 1;
      }
      continue;
    }
    const hunk = /^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@/.exec(line);
    if (hunk && cur) {
      oldLeft = hunk[1] === undefined ? 1 : Number(hunk[1]);
      newLeft = hunk[2] === undefined ? 1 : Number(hunk[2]);
      cur.lines.push(line);
      continue;
    }
    if (line.startsWith('--- ') && i + 1 < lines.length && lines[i + 1].startsWith('+++ ')) {
      cur = { old: pathOf(line), new: pathOf(lines[i + 1]), lines: [], notes: [] };
      files.push(cur);
      i += 1;
      continue;
    }
    if (/^(Binary files |Only in |Changed in )/.test(line) || line.startsWith('(entry ')) {
      files.push({ old: null, new: null, lines: [], notes: [line] });
      cur = null;
      continue;
    }
    if (!cur) {
      cur = { old: null, new: null, lines: [], notes: [] };
      files.push(cur);
    }
    cur.lines.push(line);
  }
  return files;
}

function lineNode(line, lang, numbers) {
  const c = line[0];
  let cls = 'ctx';
  let sign = ' ';
  let body = line.slice(1);
  if (line.startsWith('@@')) {
    const m = /^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@/.exec(line);
    if (m) {
      numbers.old = Number(m[1]);
      numbers.new = Number(m[2]);
      return h('div', { class: 'dl hunk' }, h('span', { class: 'ln' }), h('span', { class: 'ln' }), h('span', { class: 'code' }, line));
    }
    // "@@ (note) @@": the changelog's words for content it cannot show as text
    return h('div', { class: 'dl note' }, h('span', { class: 'ln' }), h('span', { class: 'ln' }), h('span', { class: 'code' }, line.replace(/^@@ | @@$/g, '')));
  }
  if (c === '\\') return h('div', { class: 'dl meta' }, h('span', { class: 'ln' }), h('span', { class: 'ln' }), h('span', { class: 'code' }, line));
  let o = '';
  let n = '';
  if (c === '+') {
    cls = 'add';
    sign = '+';
    n = numbers.new++;
  } else if (c === '-') {
    cls = 'del';
    sign = '-';
    o = numbers.old++;
  } else {
    if (c !== ' ') body = line;
    o = numbers.old++;
    n = numbers.new++;
  }
  return h(
    'div',
    { class: `dl ${cls}` },
    h('span', { class: 'ln', 'aria-hidden': 'true' }, String(o)),
    h('span', { class: 'ln', 'aria-hidden': 'true' }, String(n)),
    h('span', { class: 'code' }, h('span', { class: 'sign' }, sign), highlight(body, lang)),
  );
}

function fileTitle(f) {
  if (f.old && f.new && f.old !== f.new) return [h('span', { class: 'path' }, f.old), ' → ', h('span', { class: 'path' }, f.new)];
  if (!f.old && f.new) return [h('span', { class: 'path' }, f.new), h('span', { class: 'badge add' }, 'created')];
  if (f.old && !f.new) return [h('span', { class: 'path' }, f.old), h('span', { class: 'badge del' }, 'deleted')];
  return [h('span', { class: 'path' }, f.new || f.old || '')];
}

function renderLines(f, box, limit) {
  const lang = langOf(f.new || f.old);
  const numbers = { old: 0, new: 0 };
  const shown = f.lines.slice(0, limit);
  for (const l of shown) box.append(lineNode(l, lang, numbers));
  if (f.lines.length > limit) {
    const more = button(`Show ${f.lines.length - limit} more lines`, () => {
      box.replaceChildren();
      renderLines(f, box, Infinity);
    });
    box.append(h('div', { class: 'dl meta' }, more));
  }
}

/** The element showing ``text`` (a unified diff); "No changes" when empty. */
export function diffView(text) {
  const root = h('div', { class: 'diff' });
  if (!text || !text.trim()) {
    root.append(h('p', { class: 'muted' }, 'No changes.'));
    return root;
  }
  let budget = MAX_LINES;
  for (const f of parseDiff(text)) {
    if (f.notes.length && !f.lines.length) {
      root.append(h('div', { class: 'diff-file note' }, h('div', { class: 'diff-note' }, f.notes.join('\n'))));
      continue;
    }
    const box = h('div', { class: 'diff-lines', role: 'table', 'aria-label': 'diff' });
    renderLines(f, box, Math.max(200, budget));
    budget -= f.lines.length;
    root.append(h('section', { class: 'diff-file' }, h('header', { class: 'diff-head' }, fileTitle(f)), box));
  }
  return root;
}
