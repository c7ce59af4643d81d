// The timeline: every tool call of the workspace, newest first, live (the calls stream,
// Server-Sent Events read with fetch), older ones a page at a time. An execution of code
// (run_code) shows what it showed right under its row (its charts, tables and text:
// outputs.js renders them without letting any of it reach the page).

import { follow, get, ws } from '../api.js';
import { button, errorBox, fill, fmtArgs, fmtDuration, fmtIso, fmtTime, h, kvTable, spinner } from '../dom.js';
import { diffView } from '../diffview.js';
import { outputsView } from '../outputs.js';
import { openUndo } from './undo.js';

const PAGE = 100;
// The dashboard's own file views (Files tab): hidden unless asked for. Commands it runs
// (dashboard-run-...) change things and are always shown.
const UI_READS = ['dashboard-list-', 'dashboard-read-'];

export function outcomeOf(c) {
  if (c.success) return ['ok', 'ok'];
  if (c.outcome && c.outcome !== 'exit') return [c.outcome, 'bad'];
  if (c.error_kind) return [c.error_kind, 'warn'];
  return ['failed', 'bad'];
}

function filesCell(c) {
  if (!c.files_count) return h('span', { class: 'muted' }, '—');
  const first = c.files_changed.slice(0, 2);
  const more = c.files_count - first.length;
  return [
    h('span', { class: 'count' }, String(c.files_count)),
    ' ',
    first.map((p, i) => [i ? ', ' : '', h('code', { class: 'path' }, p)]),
    more > 0 ? h('span', { class: 'muted' }, ` +${more}`) : '',
  ];
}

export function timelineView(panel, id) {
  let alive = true;
  const seen = new Set();
  let oldest = null; // the `before` of the next page; null when everything is shown
  let loading = false;
  let handle = null;

  const live = h('span', { class: 'stream-state', role: 'status' }, 'Connecting…');
  const count = h('span', { class: 'muted small' });
  const showUi = h('input', { type: 'checkbox', id: 'show-ui' });
  const tbody = h('tbody');
  const table = h(
    'table',
    { class: 'grid timeline hide-ui' },
    h(
      'thead',
      null,
      h('tr', null, ['Time', 'Tool', 'Arguments', 'Outcome', 'Exit', 'Duration', 'Files changed'].map((t) => h('th', { scope: 'col' }, t))),
    ),
    tbody,
  );
  const more = button('Load older calls', () => loadOlder(), { kind: 'ghost' });
  const moreBox = h('div', { class: 'more hidden' }, more);
  const empty = h('p', { class: 'muted hidden', id: 'timeline-empty' }, 'No calls yet. They appear here as they are made, from any client.');
  showUi.addEventListener('change', () => table.classList.toggle('hide-ui', !showUi.checked));
  fill(
    panel,
    h(
      'div',
      { class: 'toolbar' },
      live,
      count,
      h('span', { class: 'spacer' }),
      h('span', { class: 'check' }, showUi, h('label', { for: 'show-ui' }, "Show the dashboard's own reads")),
    ),
    h('div', { class: 'card flush' }, table, empty, moreBox),
  );

  function updateCount() {
    count.textContent = `${seen.size} call${seen.size === 1 ? '' : 's'} shown${oldest !== null ? ' (more older)' : ''}`;
    empty.classList.toggle('hidden', seen.size > 0);
  }

  function details(c) {
    const box = h('div', { class: 'details' });
    const args = Object.entries(c.args || {}).map(([k, v]) => [k, h('code', { class: 'pre' }, typeof v === 'string' ? v : JSON.stringify(v))]);
    box.append(
      kvTable([
        ['Call id', h('code', null, c.call_id || '—')],
        c.subtask_id ? ['Subtask', h('code', null, c.subtask_id)] : null,
        ['Started', fmtIso(c.started)],
        ['Finished', fmtIso(c.ts)],
        ['Duration', fmtDuration(c.duration_ms)],
        c.outcome ? ['Outcome', c.outcome] : null,
        c.exit_code !== null && c.exit_code !== undefined ? ['Exit code', String(c.exit_code)] : null,
        c.error ? ['Error', h('span', { class: 'pre error-text' }, c.error)] : null,
        c.pid ? ['Process', String(c.pid)] : null,
        ...args,
      ]),
    );
    if (c.files_count) {
      box.append(
        h('h3', null, `Files changed (${c.files_count})`),
        h('ul', { class: 'paths' }, c.files_changed.map((p) => h('li', null, h('code', { class: 'path' }, p)))),
        c.files_count > c.files_changed.length ? h('p', { class: 'muted' }, `and ${c.files_count - c.files_changed.length} more`) : '',
      );
      const out = h('div', { class: 'diff-box' });
      const diffBtn = button('Diff', async () => {
        diffBtn.disabled = true;
        fill(out, spinner());
        try {
          const r = await get(`${ws(id)}/changelog/diff`, { call_id: c.call_id });
          fill(out, diffView(r.diff));
        } catch (e) {
          fill(out, errorBox(e));
        } finally {
          diffBtn.disabled = false;
        }
      });
      const undoBtn = button('Undo', () => openUndo(id, { call_id: c.call_id }, `call ${c.call_id}`), { kind: 'danger' });
      box.append(h('div', { class: 'actions' }, diffBtn, undoBtn), out);
    }
    return box;
  }

  function row(c) {
    const [label, tone] = outcomeOf(c);
    const ui = UI_READS.some((p) => (c.call_id || '').startsWith(p));
    const tr = h(
      'tr',
      {
        class: `call ${tone}${ui ? ' ui-call' : ''}`,
        tabindex: '0',
        'aria-expanded': 'false',
        dataset: { cursor: String(c.cursor), callId: c.call_id || '' },
      },
      h('td', { 'data-label': 'Time', title: fmtIso(c.ts) }, fmtTime(c.ts)),
      h('td', { 'data-label': 'Tool' }, h('code', null, c.tool)),
      h('td', { 'data-label': 'Arguments', class: 'args' }, fmtArgs(c.args)),
      h('td', { 'data-label': 'Outcome' }, h('span', { class: `badge ${tone}` }, label)),
      h('td', { 'data-label': 'Exit', class: 'num' }, c.exit_code === null || c.exit_code === undefined ? '' : String(c.exit_code)),
      h('td', { 'data-label': 'Duration', class: 'num' }, fmtDuration(c.duration_ms)),
      h('td', { 'data-label': 'Files changed', class: 'files' }, filesCell(c)),
    );
    let open = null;
    // An execution's outputs: a row of their own under the call, always shown.
    const shown = Array.isArray(c.outputs) && c.outputs.length
      ? h('tr', { class: `outputs-row${ui ? ' ui-call' : ''}`, dataset: { callId: c.call_id || '' } }, h('td', { colspan: '7' }, outputsView(c.outputs)))
      : null;
    const toggle = () => {
      if (open) {
        open.remove();
        open = null;
        tr.setAttribute('aria-expanded', 'false');
        return;
      }
      open = h('tr', { class: `detail${ui ? ' ui-call' : ''}` }, h('td', { colspan: '7' }, details(c)));
      (shown || tr).after(open);
      tr.setAttribute('aria-expanded', 'true');
    };
    tr.addEventListener('click', (ev) => {
      if (ev.target.closest('a,button')) return;
      toggle();
    });
    tr.addEventListener('keydown', (ev) => {
      if (ev.target !== tr) return;
      if (ev.key === 'Enter' || ev.key === ' ') {
        ev.preventDefault();
        toggle();
      } else if (ev.key === 'ArrowDown' || ev.key === 'ArrowUp') {
        ev.preventDefault();
        let next = ev.key === 'ArrowDown' ? tr.nextElementSibling : tr.previousElementSibling;
        while (next && !next.classList.contains('call')) next = ev.key === 'ArrowDown' ? next.nextElementSibling : next.previousElementSibling;
        if (next) next.focus();
      }
    });
    if (!shown) return [tr];
    tr.classList.add('has-outputs');
    return [tr, shown];
  }

  function addNewest(c) {
    if (seen.has(c.cursor)) return;
    seen.add(c.cursor);
    const rows = row(c);
    rows[0].classList.add('fresh');
    tbody.prepend(...rows);
    updateCount();
  }

  async function loadOlder() {
    if (loading || (oldest === null && seen.size)) return;
    loading = true;
    more.disabled = true;
    try {
      const page = await get(`${ws(id)}/calls`, { limit: PAGE, before: oldest === null ? undefined : oldest });
      if (!alive) return;
      for (const c of page.calls) {
        if (seen.has(c.cursor)) continue;
        seen.add(c.cursor);
        tbody.append(...row(c));
      }
      oldest = page.next;
      moreBox.classList.toggle('hidden', oldest === null);
      updateCount();
    } catch (e) {
      if (alive) panel.append(errorBox(e));
    } finally {
      loading = false;
      more.disabled = false;
    }
  }

  const observer = new IntersectionObserver((entries) => {
    if (entries.some((e) => e.isIntersecting) && oldest !== null) loadOlder();
  });
  observer.observe(moreBox);

  (async () => {
    let first;
    try {
      first = await get(`${ws(id)}/calls`, { limit: PAGE });
    } catch (e) {
      if (alive) fill(panel, errorBox(e));
      return;
    }
    if (!alive) return;
    for (const c of first.calls) {
      seen.add(c.cursor);
      tbody.append(...row(c));
    }
    oldest = first.next;
    moreBox.classList.toggle('hidden', oldest === null);
    updateCount();
    const after = first.calls.length ? first.calls[0].cursor : -1;
    handle = follow(`${ws(id)}/calls/stream`, {
      query: { after },
      onEvent: (ev) => {
        if (ev.event !== 'call') return;
        addNewest(JSON.parse(ev.data));
      },
      onState: (state, detail) => {
        live.className = `stream-state ${state}`;
        live.textContent = state === 'live' ? 'Live' : state === 'reconnecting' ? 'Reconnecting…' : `Not live: ${detail}`;
      },
    });
  })();

  return {
    destroy() {
      alive = false;
      observer.disconnect();
      if (handle) handle.close();
    },
  };
}
