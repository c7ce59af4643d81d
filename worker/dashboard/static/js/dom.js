// DOM helpers. Every string that reaches the page goes through textContent (via
// document.createTextNode or el.textContent), never innerHTML: file names, outputs and
// errors come from sandboxes and may hold anything, "<script>" included.

/** Build an element: h('button', {class: 'x', onclick: fn}, 'text', child, ...). */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'class') el.className = v;
      else if (k === 'text') el.textContent = v;
      else if (k === 'dataset') Object.assign(el.dataset, v);
      else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
      else if (k === 'style') throw new Error('no inline styles (CSP)');
      else if (v === true) el.setAttribute(k, '');
      else el.setAttribute(k, String(v));
    }
  }
  append(el, children);
  return el;
}

/** Append children (nodes, strings, arrays, null) to el; strings become text nodes. */
export function append(el, children) {
  for (const c of [children].flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** Replace el's children. */
export function fill(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

export function $(sel, root = document) {
  return root.querySelector(sel);
}

// -- formatting --------------------------------------------------------------------

export function fmtTime(ts) {
  if (ts === null || ts === undefined) return '';
  const d = new Date(ts * 1000);
  const now = new Date();
  const pad = (n, w = 2) => String(n).padStart(w, '0');
  const time = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  if (d.toDateString() === now.toDateString()) return time;
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${time}`;
}

export function fmtIso(ts) {
  return ts ? new Date(ts * 1000).toISOString() : '';
}

export function fmtDuration(ms) {
  if (ms === null || ms === undefined) return '';
  if (ms < 1) return `${ms.toFixed(2)} ms`;
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
  return `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`;
}

export function fmtBytes(n) {
  if (n === null || n === undefined) return '';
  if (n < 1024) return `${n} B`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let v = n;
  let u = -1;
  do {
    v /= 1024;
    u += 1;
  } while (v >= 1024 && u < units.length - 1);
  return `${v.toFixed(v < 10 ? 1 : 0)} ${units[u]}`;
}

/** A short one-line form of a call's (already shortened) arguments. */
export function fmtArgs(args) {
  if (!args) return '';
  const parts = [];
  for (const [k, v] of Object.entries(args)) {
    const s = typeof v === 'string' ? v : JSON.stringify(v);
    parts.push(`${k}=${s}`);
  }
  return parts.join('  ');
}

// -- feedback ----------------------------------------------------------------------

export function toast(message, kind = 'info') {
  const box = document.getElementById('toasts');
  const t = h('div', { class: `toast ${kind}` }, message);
  box.append(t);
  setTimeout(() => t.remove(), kind === 'error' ? 8000 : 4000);
}

/** A modal dialog (keyboard: Esc closes, focus stays inside). Returns {dialog, body, actions, close}. */
export function dialog(title, { onclose, wide } = {}) {
  const heading = h('h2', { id: `dlg-${Math.random().toString(36).slice(2)}` }, title);
  const body = h('div', { class: 'dialog-body' });
  const actions = h('div', { class: 'dialog-actions' });
  const dlg = h('dialog', { class: wide ? 'wide' : null, 'aria-labelledby': heading.id }, heading, body, actions);
  document.body.append(dlg);
  dlg.addEventListener('close', () => {
    dlg.remove();
    if (onclose) onclose();
  });
  dlg.showModal();
  return { dialog: dlg, body, actions, close: () => dlg.close() };
}

export function button(label, onclick, { kind = '', title, disabled, type = 'button', name } = {}) {
  return h('button', { type, class: kind || null, onclick, title, disabled, name }, label);
}

/** A key/value table (values are text). */
export function kvTable(rows, cls = 'kv') {
  return h(
    'table',
    { class: cls },
    h('tbody', null, rows.filter(Boolean).map(([k, v]) => h('tr', null, h('th', { scope: 'row' }, k), h('td', null, v)))),
  );
}

export function spinner(text = 'Loading…') {
  return h('p', { class: 'muted loading', role: 'status' }, text);
}

export function errorBox(err) {
  return h('p', { class: 'error', role: 'alert' }, err && err.message ? err.message : String(err));
}

/** Random id for the dashboard's own calls (shown in the timeline as such). */
export function uiCallId(what) {
  const bytes = new Uint8Array(6);
  crypto.getRandomValues(bytes);
  return `dashboard-${what}-${Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('')}`;
}
