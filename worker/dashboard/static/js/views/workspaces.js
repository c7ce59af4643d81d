// The workspaces: list, create (with optional sandbox settings), delete (files kept
// unless asked, after a confirmation), each with its sandbox's state.

import { ApiError, api, get, post, ws } from '../api.js';
import { button, dialog, errorBox, fill, fmtBytes, h, spinner, toast } from '../dom.js';

function stateBadge(s) {
  if (!s) return h('span', { class: 'badge' }, '…');
  if (s.error) return h('span', { class: 'badge warn', title: s.error }, 'unknown');
  if (s.backend === null) return h('span', { class: 'badge' }, 'n/a');
  if (s.running) return h('span', { class: 'badge ok' }, 'running');
  return h('span', { class: 'badge' }, s.exists ? s.status || 'stopped' : 'not started');
}

function createForm(onCreated) {
  const name = h('input', { id: 'new-name', name: 'name', autocomplete: 'off', placeholder: 'random', pattern: '[A-Za-z0-9][A-Za-z0-9_.\\-]{0,63}' });
  const image = h('input', { id: 'new-image', name: 'image', autocomplete: 'off', placeholder: 'default' });
  const memory = h('input', { id: 'new-memory', name: 'memory', autocomplete: 'off', placeholder: 'default, e.g. 2g' });
  const error = h('p', { class: 'error hidden', role: 'alert' });
  const submit = h('button', { type: 'submit', class: 'primary' }, 'Create');
  const form = h(
    'form',
    { class: 'card create', 'aria-labelledby': 'create-title' },
    h('h2', { id: 'create-title' }, 'New workspace'),
    h(
      'div',
      { class: 'fields' },
      h('div', null, h('label', { for: 'new-name' }, 'Name'), name),
      h('div', null, h('label', { for: 'new-image' }, 'Image'), image),
      h('div', null, h('label', { for: 'new-memory' }, 'Memory'), memory),
    ),
    error,
    h('div', { class: 'actions' }, submit),
  );
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    error.classList.add('hidden');
    const body = {};
    if (name.value.trim()) body.name = name.value.trim();
    const settings = {};
    if (image.value.trim()) settings.image = image.value.trim();
    if (memory.value.trim()) settings.memory = memory.value.trim();
    if (Object.keys(settings).length) body.settings = settings;
    submit.disabled = true;
    try {
      const made = await post('/v1/workspaces', body);
      form.reset();
      toast(`Workspace ${made.id} created`);
      onCreated(made);
    } catch (e) {
      error.textContent = e.message;
      error.classList.remove('hidden');
    } finally {
      submit.disabled = false;
    }
  });
  return form;
}

function confirmDelete(id, onDeleted) {
  const d = dialog(`Delete workspace ${id}?`);
  const keep = h('input', { type: 'checkbox', id: 'delete-files' });
  d.body.append(
    h('p', null, 'Its sandbox is stopped. Its files are kept on the host unless you ask for them to be deleted too.'),
    h('p', { class: 'check' }, keep, h('label', { for: 'delete-files' }, 'Also delete its files (this cannot be undone)')),
  );
  const error = h('p', { class: 'error hidden', role: 'alert' });
  d.body.append(error);
  const go = button(
    'Delete',
    async () => {
      go.disabled = true;
      try {
        const r = await api('DELETE', ws(id), { query: { delete_files: keep.checked } });
        d.close();
        toast(r.files_deleted ? `Workspace ${id} and its files deleted` : `Workspace ${id} removed (files kept)`);
        onDeleted();
      } catch (e) {
        error.textContent = e.message;
        error.classList.remove('hidden');
        go.disabled = false;
      }
    },
    { kind: 'danger' },
  );
  d.actions.append(button('Cancel', () => d.close()), go);
  go.focus();
}

export function workspacesView(main) {
  let alive = true;
  const list = h('div', { class: 'card' }, spinner());
  const page = h('div', { class: 'page' }, h('h1', null, 'Workspaces'), list, createForm(() => load()));
  fill(main, page);

  function deleteButton(id) {
    const b = button('Delete…', () => confirmDelete(id, load), { kind: 'ghost danger' });
    b.setAttribute('aria-label', `Delete workspace ${id}`);
    return b;
  }

  async function load() {
    let items;
    try {
      items = await get('/v1/workspaces');
    } catch (e) {
      if (alive) fill(list, errorBox(e));
      return;
    }
    if (!alive) return;
    if (!items.length) {
      fill(list, h('p', { class: 'muted' }, 'No workspaces yet: create one below, or with POST /v1/workspaces.'));
      return;
    }
    const rows = items.map((w) => {
      const state = h('td', { 'data-label': 'Sandbox' }, stateBadge(null));
      const usage = h('td', { 'data-label': 'Memory', class: 'num' }, '');
      const tr = h(
        'tr',
        { dataset: { ws: w.id } },
        h('td', { 'data-label': 'Workspace' }, h('a', { href: `#/w/${encodeURIComponent(w.id)}` }, w.id)),
        h('td', { 'data-label': 'Path', class: 'path' }, w.path),
        state,
        usage,
        h('td', { class: 'actions' }, deleteButton(w.id)),
      );
      return { tr, state, usage, id: w.id };
    });
    fill(
      list,
      h(
        'table',
        { class: 'grid' },
        h('thead', null, h('tr', null, ['Workspace', 'Path', 'Sandbox', 'Memory', ''].map((t) => h('th', { scope: 'col' }, t)))),
        h('tbody', null, rows.map((r) => r.tr)),
      ),
    );
    // Sandbox states, four at a time (each asks the engine), for the first 100.
    const queue = rows.slice(0, 100);
    const worker = async () => {
      for (let r = queue.shift(); r && alive; r = queue.shift()) {
        try {
          const s = await get(`${ws(r.id)}/sandbox`);
          fill(r.state, stateBadge(s));
          if (s.usage && s.usage.memory_bytes !== null) r.usage.textContent = fmtBytes(s.usage.memory_bytes);
        } catch (e) {
          fill(r.state, stateBadge({ error: e instanceof ApiError ? e.message : String(e) }));
        }
      }
    };
    await Promise.all([worker(), worker(), worker(), worker()]);
  }

  load();
  return {
    destroy() {
      alive = false;
    },
  };
}
