// Undo, always in two steps: "Undo" shows what would change (the dry run's diff and
// steps), "Confirm" applies exactly that. Files changed since the entries were recorded
// are a conflict: listed, with the choice to force (previewed again before it applies).

import { ApiError, post, ws } from '../api.js';
import { button, dialog, errorBox, fill, h, spinner, toast } from '../dom.js';
import { diffView } from '../diffview.js';

const done = new Set(); // listeners told after an undo applied (views refresh)

export function onUndone(fn) {
  done.add(fn);
  return () => done.delete(fn);
}

function stepsTable(steps) {
  if (!steps.length) return h('p', { class: 'muted' }, 'Nothing to undo.');
  return h(
    'table',
    { class: 'grid steps' },
    h('thead', null, h('tr', null, ['Entry', 'Path', 'Action', 'Status', ''].map((t) => h('th', { scope: 'col' }, t)))),
    h(
      'tbody',
      null,
      steps.map((s) =>
        h(
          'tr',
          { class: s.status === 'failed' || s.status === 'not_restorable' ? 'bad' : '' },
          h('td', { 'data-label': 'Entry', class: 'num' }, `#${s.entry_id}`),
          h('td', { 'data-label': 'Path' }, h('code', { class: 'path' }, s.path)),
          h('td', { 'data-label': 'Action' }, s.action.replace('_', ' ')),
          h('td', { 'data-label': 'Status' }, h('span', { class: `badge ${s.status === 'not_restorable' || s.status === 'failed' ? 'bad' : 'ok'}` }, s.status.replace('_', ' '))),
          h('td', { 'data-label': 'Note' }, s.message || '', s.paths && s.paths.length ? h('ul', { class: 'paths' }, s.paths.map((p) => h('li', null, h('code', { class: 'path' }, p)))) : ''),
        ),
      ),
    ),
  );
}

/**
 * Undo what ``selector`` names ({entry} | {call_id} | {subtask_id} | {all: true}) in
 * workspace ``id``, after a preview. ``label`` names it in the dialog's title.
 */
export function openUndo(id, selector, label) {
  const d = dialog(`Undo ${label}`, { wide: true });
  const path = `${ws(id)}/undo`;

  async function preview(force) {
    fill(d.body, spinner('Preparing the preview…'));
    d.actions.replaceChildren(button('Cancel', () => d.close()));
    let r;
    try {
      r = await post(path, { ...selector, dry_run: true, force });
    } catch (e) {
      showError(e, force);
      return;
    }
    const lost = r.steps.filter((s) => s.status === 'not_restorable');
    fill(
      d.body,
      h('p', null, force ? 'Forced: files changed since will be overwritten. ' : '', 'This is what undo will change. Nothing has changed yet.'),
      lost.length ? h('p', { class: 'warning' }, `${lost.length} change(s) cannot be restored (their earlier content was not kept).`) : '',
      stepsTable(r.steps),
      h('h3', null, 'Diff'),
      diffView(r.diff),
    );
    const confirm = button('Confirm', () => apply(force), { kind: force ? 'danger' : 'primary' });
    const wanted = r.steps.some((s) => s.status === 'would_revert');
    confirm.disabled = !wanted;
    d.actions.replaceChildren(button('Cancel', () => d.close()), confirm);
    if (wanted) confirm.focus();
  }

  function showError(e, force) {
    if (e instanceof ApiError && e.status === 409 && e.body && Array.isArray(e.body.conflicts) && e.body.conflicts.length) {
      fill(
        d.body,
        h('p', { class: 'warning', role: 'alert' }, 'Conflict: these files changed after the change was recorded. Undoing now would overwrite that later work.'),
        h('ul', { class: 'conflicts' }, e.body.conflicts.map((c) => h('li', null, h('code', { class: 'pre' }, c)))),
        h('p', null, 'Force undoes anyway, overwriting them (you will see the preview first).'),
      );
      const forceBtn = button('Force', () => preview(true), { kind: 'danger' });
      d.actions.replaceChildren(button('Cancel', () => d.close()), forceBtn);
      forceBtn.focus();
      return;
    }
    fill(d.body, errorBox(e));
    d.actions.replaceChildren(button('Close', () => d.close()));
    if (force === undefined) return;
  }

  async function apply(force) {
    fill(d.body, spinner('Undoing…'));
    d.actions.replaceChildren();
    let r;
    try {
      r = await post(path, { ...selector, dry_run: false, force });
    } catch (e) {
      showError(e, force);
      return;
    }
    const failed = r.steps.filter((s) => s.status === 'failed' || s.status === 'not_restorable');
    fill(
      d.body,
      h('p', { class: failed.length ? 'warning' : 'success', role: 'status' }, failed.length ? `Undone, except ${failed.length} step(s) below.` : 'Undone.'),
      stepsTable(r.steps),
    );
    const close = button('Close', () => d.close(), { kind: 'primary' });
    d.actions.replaceChildren(close);
    close.focus();
    toast(`Undid ${label}`);
    for (const fn of done) fn();
  }

  preview(false);
}
