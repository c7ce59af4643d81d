// Changes: the changelog's entries grouped by call, newest call first, each call and
// each entry with its diff and an Undo; the workspace's cumulative diff; undo of a
// subtask or of everything. Refreshed when a call that changed files arrives.

import { follow, get, ws } from '../api.js';
import { button, errorBox, fill, fmtIso, fmtTime, h, spinner } from '../dom.js';
import { diffView } from '../diffview.js';
import { onUndone, openUndo } from './undo.js';

const STEP = 500;

function groupByCall(entries) {
  // Consecutive entries of one call (entries are recorded in order, a call's together).
  const groups = [];
  for (const e of entries) {
    const last = groups[groups.length - 1];
    if (last && last.call_id === e.call_id && e.call_id !== null) last.entries.push(e);
    else groups.push({ call_id: e.call_id, subtask_id: e.subtask_id, tool: e.tool, ts: e.ts, entries: [e] });
  }
  return groups.reverse();
}

function opLabel(e) {
  const out = [h('span', { class: `op op-${e.op}` }, e.op), ' ', h('code', { class: 'path' }, e.path)];
  if (e.new_path) out.push(' → ', h('code', { class: 'path' }, e.new_path));
  if (e.detail) out.push(' ', h('span', { class: 'muted' }, `[${e.detail}]`));
  return out;
}

function entryFlags(e) {
  const flags = [];
  if (e.origin === 'undo') flags.push(h('span', { class: 'badge' }, `undo of #${e.reverts}`));
  if (e.reverted_by) flags.push(h('span', { class: 'badge' }, `undone (#${e.reverted_by})`));
  if (!e.restorable) flags.push(h('span', { class: 'badge warn', title: e.note || '' }, 'not restorable'));
  if (e.state !== 'applied') flags.push(h('span', { class: 'badge warn' }, e.state));
  return flags;
}

function diffToggle(label, load) {
  const out = h('div', { class: 'diff-box' });
  let shown = false;
  const btn = button(label, async () => {
    if (shown) {
      out.replaceChildren();
      shown = false;
      btn.setAttribute('aria-expanded', 'false');
      return;
    }
    shown = true;
    btn.setAttribute('aria-expanded', 'true');
    fill(out, spinner());
    try {
      fill(out, diffView(await load()));
    } catch (e) {
      fill(out, errorBox(e));
    }
  });
  btn.setAttribute('aria-expanded', 'false');
  return [btn, out];
}

export function changesView(panel, id) {
  let alive = true;
  let limit = STEP;
  const base = ws(id);
  const summary = h('p', { class: 'muted small' });
  const list = h('div', { class: 'groups' }, spinner());
  const [cumBtn, cumOut] = diffToggle('Cumulative diff', async () => (await get(`${base}/diff`)).diff);
  const undoAll = button('Undo everything', () => openUndo(id, { all: true }, 'everything'), { kind: 'danger' });
  const moreBtn = button('Show older changes', () => {
    limit += STEP;
    load();
  }, { kind: 'ghost' });
  const moreBox = h('div', { class: 'more hidden' }, moreBtn);
  fill(
    panel,
    h('div', { class: 'toolbar' }, summary, h('span', { class: 'spacer' }), cumBtn, undoAll),
    cumOut,
    list,
    moreBox,
  );

  async function load() {
    let entries;
    let sum;
    try {
      [entries, sum] = await Promise.all([get(`${base}/changelog`, { limit }), get(`${base}/diff`, { summary: true })]);
    } catch (e) {
      if (alive) fill(list, errorBox(e));
      return;
    }
    if (!alive) return;
    summary.textContent =
      `${sum.created.length} created, ${sum.modified.length} modified, ${sum.deleted.length} deleted, ${sum.renamed.length} renamed` +
      (sum.not_restorable.length ? `, ${sum.not_restorable.length} not restorable` : '');
    moreBox.classList.toggle('hidden', entries.length < limit);
    if (!entries.length) {
      fill(list, h('p', { class: 'muted card' }, 'No recorded changes yet.'));
      return;
    }
    fill(list, groupByCall(entries).map((g) => groupCard(g)));
  }

  function entryUndo(e) {
    const b = button('Undo', () => openUndo(id, { entry: e.id }, `entry #${e.id}`), { kind: 'ghost danger' });
    b.setAttribute('aria-label', `Undo entry #${e.id}`);
    return b;
  }

  function groupCard(g) {
    const live = g.entries.filter((e) => e.state === 'applied' && !e.reverted_by && e.origin !== 'undo');
    const title = g.call_id ? h('code', null, g.call_id) : h('span', { class: 'muted' }, 'changes made outside any call');
    const head = h(
      'header',
      { class: 'group-head' },
      h('span', { class: 'muted', title: fmtIso(g.ts) }, fmtTime(g.ts)),
      ' ',
      h('code', { class: 'tool' }, g.tool),
      ' ',
      title,
      g.subtask_id ? [' ', h('span', { class: 'badge' }, `subtask ${g.subtask_id}`)] : '',
      ' ',
      h('span', { class: 'muted' }, `${g.entries.length} change${g.entries.length === 1 ? '' : 's'}`),
    );
    const actions = h('div', { class: 'actions' });
    const extra = [];
    if (g.call_id) {
      const [diffBtn, out] = diffToggle('Diff', async () => (await get(`${base}/changelog/diff`, { call_id: g.call_id })).diff);
      actions.append(diffBtn);
      extra.push(out);
      if (live.length) actions.append(button('Undo', () => openUndo(id, { call_id: g.call_id }, `call ${g.call_id}`), { kind: 'danger' }));
    }
    if (g.subtask_id && live.length) {
      actions.append(button('Undo subtask', () => openUndo(id, { subtask_id: g.subtask_id }, `subtask ${g.subtask_id}`), { kind: 'ghost danger' }));
    }
    const rows = g.entries.map((e) => {
      const [diffBtn, out] = diffToggle('Diff', async () => (await get(`${base}/changelog/diff`, { entry: e.id })).diff);
      diffBtn.setAttribute('aria-label', `Diff of entry #${e.id}`);
      const undoable = e.state === 'applied' && !e.reverted_by;
      return h(
        'li',
        { class: 'entry', dataset: { entry: String(e.id) } },
        h(
          'div',
          { class: 'entry-line' },
          h('span', { class: 'muted num' }, `#${e.id}`),
          h('span', { class: 'entry-what' }, opLabel(e)),
          entryFlags(e),
          h('span', { class: 'spacer' }),
          diffBtn,
          undoable ? entryUndo(e) : '',
        ),
        !e.restorable && e.note ? h('p', { class: 'muted small' }, e.note) : '',
        out,
      );
    });
    return h('article', { class: 'card group', dataset: { callId: g.call_id || '' } }, head, actions, extra, h('ul', { class: 'entries' }, rows));
  }

  load();
  // Refresh on calls that changed files (debounced) and after an undo.
  let timer = null;
  const refresh = () => {
    clearTimeout(timer);
    timer = setTimeout(() => alive && load(), 300);
  };
  const stopUndo = onUndone(refresh);
  const stream = follow(`${base}/calls/stream`, {
    onEvent: (ev) => {
      if (ev.event === 'call' && JSON.parse(ev.data).files_count > 0) refresh();
    },
  });
  return {
    destroy() {
      alive = false;
      clearTimeout(timer);
      stopUndo();
      stream.close();
    },
  };
}
