// Snapshots: take one, fork it N ways, restore it (preview, then Confirm), delete it, and
// the fork tree (where this workspace came from, and what was made from it).

import { ApiError, api, get, post, ws } from '../api.js';
import { button, dialog, errorBox, fill, fmtBytes, fmtIso, fmtTime, h, spinner, toast } from '../dom.js';
import { diffView } from '../diffview.js';

const base = (p) => p.split('/').pop();

function wsLink(path, root) {
  // A fork of this service lives beside its parent, under the same root: link to it.
  const id = base(path);
  if (root !== null && path === `${root}/${id}`) return h('a', { href: `#/w/${encodeURIComponent(id)}/snapshots` }, id);
  return h('code', { class: 'path' }, path);
}

export function snapshotsView(panel, id) {
  let alive = true;
  let root = null; // the directory the service's workspaces live in
  const name = h('input', { id: 'snap-name', name: 'snap-name', placeholder: 'name (optional)', autocomplete: 'off', pattern: '[A-Za-z0-9][A-Za-z0-9_.\\-]{0,63}' });
  const scratch = h('input', { id: 'snap-scratch', type: 'checkbox' });
  const take = button('Take snapshot', () => create(), { kind: 'primary', type: 'submit' });
  const form = h(
    'form',
    { class: 'toolbar', 'aria-label': 'Take a snapshot' },
    h('label', { for: 'snap-name' }, 'Name'),
    name,
    h('label', { class: 'check', for: 'snap-scratch' }, scratch, ' with /tmp and $HOME'),
    take,
    h('span', { class: 'spacer' }),
    button('Refresh', () => load()),
  );
  form.addEventListener('submit', (ev) => ev.preventDefault());
  const origin = h('p', { class: 'muted', id: 'snap-origin' });
  const list = h('div', { class: 'card flush' }, spinner());
  const tree = h('div', { class: 'card' });
  fill(panel, form, origin, list, tree);

  async function create() {
    take.disabled = true;
    try {
      const s = await post(`${ws(id)}/snapshots`, { name: name.value || null, with_scratch: scratch.checked });
      toast(`Snapshot ${s.id} taken (${s.files} files)`);
      name.value = '';
      await load();
    } catch (e) {
      toast(e.message, 'error');
    } finally {
      take.disabled = false;
    }
  }

  async function load() {
    let r;
    try {
      const [info, snaps] = await Promise.all([get(ws(id)), get(`${ws(id)}/snapshots`)]);
      root = info.path.slice(0, info.path.length - id.length - 1);
      r = snaps;
    } catch (e) {
      if (alive) fill(list, errorBox(e));
      return;
    }
    if (!alive) return;
    if (r.origin) {
      // The fork record names the fork itself: its parent is the snapshot's workspace.
      const sid = r.origin.snapshot;
      fill(origin, 'Forked from snapshot ', h('code', null, sid), '.');
      get(`${ws(id)}/snapshots/${encodeURIComponent(sid)}`)
        .then((p) => alive && fill(origin, 'Forked from snapshot ', h('code', null, sid), ' of ', wsLink(p.workspace, root), '.'))
        .catch(() => alive && fill(origin, 'Forked from snapshot ', h('code', null, sid), ' (deleted).'));
    } else {
      fill(origin, 'Not a fork.');
    }
    if (!r.snapshots.length) {
      fill(list, h('p', { class: 'muted pad' }, 'No snapshots yet.'));
      fill(tree, '');
      return;
    }
    fill(
      list,
      h(
        'table',
        { class: 'grid snapshots' },
        h('thead', null, h('tr', null, ['Snapshot', 'Taken', 'Files', 'Size', 'Copy', 'Forks', ''].map((t) => h('th', { scope: 'col' }, t)))),
        h('tbody', null, r.snapshots.map((s) => row(s))),
      ),
    );
    fill(
      tree,
      h('h2', null, 'Fork tree'),
      h(
        'ul',
        { class: 'forktree', 'aria-label': 'Fork tree' },
        h(
          'li',
          null,
          h('strong', null, id),
          h(
            'ul',
            null,
            r.snapshots.map((s) =>
              h(
                'li',
                null,
                h('code', null, s.id),
                s.name ? ` ${s.name}` : '',
                s.forks.length
                  ? h(
                      'ul',
                      null,
                      s.forks.map((f) => h('li', { class: s.live_forks.includes(f) ? '' : 'muted' }, wsLink(f, root), s.live_forks.includes(f) ? '' : ' (gone)')),
                    )
                  : '',
                s.children.length ? h('p', { class: 'muted small' }, `snapshots of its forks: ${s.children.join(', ')}`) : '',
              ),
            ),
          ),
        ),
      ),
    );
  }

  function row(s) {
    const count = h('input', { type: 'number', min: '1', max: '64', value: '2', class: 'count', 'aria-label': `Forks of ${s.id}` });
    return h(
      'tr',
      { dataset: { snapshot: s.id } },
      h('td', { 'data-label': 'Snapshot' }, h('code', null, s.id), s.name ? h('span', { class: 'muted' }, ` ${s.name}`) : '', s.with_scratch ? h('span', { class: 'badge' }, 'scratch') : ''),
      h('td', { 'data-label': 'Taken', title: fmtIso(s.created) }, fmtTime(s.created)),
      h('td', { 'data-label': 'Files', class: 'num' }, String(s.files)),
      h('td', { 'data-label': 'Size', class: 'num' }, fmtBytes(s.bytes)),
      h('td', { 'data-label': 'Copy' }, s.strategy),
      h('td', { 'data-label': 'Forks', class: 'num' }, String(s.live_forks.length)),
      h(
        'td',
        { 'data-label': 'Actions', class: 'actions' },
        count,
        button('Fork', () => fork(s, Number(count.value))),
        button('Restore…', () => restore(s)),
        button('Delete…', () => remove(s, false), { kind: 'danger' }),
      ),
    );
  }

  async function fork(s, n) {
    try {
      const r = await post(`${ws(id)}/fork`, { snapshot: s.id, count: n });
      toast(`Forked ${s.id}: ${r.workspaces.map((w) => w.id).join(', ')}`);
      await load();
    } catch (e) {
      toast(e.message, 'error');
    }
  }

  function restore(s) {
    const d = dialog(`Restore ${s.name || s.id}`, { wide: true });
    fill(d.body, spinner('Preparing the preview…'));
    d.actions.replaceChildren(button('Cancel', () => d.close()));
    post(`${ws(id)}/restore`, { snapshot: s.id, dry_run: true })
      .then((p) => {
        const n = p.created.length + p.modified.length + p.removed.length;
        fill(
          d.body,
          h('p', null, n ? `This is what the restore will change: ${p.created.length} created, ${p.modified.length} changed, ${p.removed.length} removed. Nothing has changed yet.` : 'The workspace is already as the snapshot.'),
          h('p', { class: 'muted small' }, 'Every change is recorded in the changelog: the restore can be undone.'),
          diffView(p.diff),
        );
        const confirm = button('Confirm', () => apply(), { kind: 'primary' });
        confirm.disabled = !n;
        d.actions.replaceChildren(button('Cancel', () => d.close()), confirm);
        if (n) confirm.focus();
      })
      .catch((e) => {
        fill(d.body, errorBox(e));
        d.actions.replaceChildren(button('Close', () => d.close()));
      });

    async function apply() {
      fill(d.body, spinner('Restoring…'));
      d.actions.replaceChildren();
      try {
        const r = await post(`${ws(id)}/restore`, { snapshot: s.id });
        fill(
          d.body,
          h('p', { class: r.failed.length ? 'warning' : 'success', role: 'status' }, r.failed.length ? `Restored, except ${r.failed.length} path(s).` : 'Restored.'),
          h('p', null, 'Undo it from the Changes tab: call ', h('code', null, r.call_id), '.'),
        );
        toast(`Restored ${s.id}`);
      } catch (e) {
        fill(d.body, errorBox(e));
      }
      const close = button('Close', () => d.close(), { kind: 'primary' });
      d.actions.replaceChildren(close);
      close.focus();
    }
  }

  function remove(s, force) {
    const d = dialog(`Delete ${s.name || s.id}`);
    const go = async () => {
      try {
        const r = await api('DELETE', `${ws(id)}/snapshots/${encodeURIComponent(s.id)}`, { query: { force } });
        d.close();
        toast(r.left.length ? `Deleted ${s.id}; ${r.left.length} fork(s) stay` : `Deleted ${s.id}`);
        await load();
      } catch (e) {
        if (e instanceof ApiError && e.status === 409 && e.body && e.body.forks) {
          fill(
            d.body,
            h('p', { class: 'warning', role: 'alert' }, 'Forks made from this snapshot still live:'),
            h('ul', { class: 'paths' }, e.body.forks.map((f) => h('li', null, wsLink(f, root)))),
            h('p', null, 'Delete anyway? They stay, independent; their origin becomes a deleted snapshot.'),
          );
          d.actions.replaceChildren(button('Cancel', () => d.close()), button('Delete anyway', () => { force = true; go(); }, { kind: 'danger' }));
          return;
        }
        fill(d.body, errorBox(e));
      }
    };
    fill(d.body, h('p', null, `Delete snapshot ${s.id}? Its files go; its lineage is kept.`));
    const ok = button('Delete', () => go(), { kind: 'danger' });
    d.actions.replaceChildren(button('Cancel', () => d.close()), ok);
    ok.focus();
  }

  load();
  return {
    destroy() {
      alive = false;
    },
  };
}
