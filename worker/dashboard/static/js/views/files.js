// Files: browse the workspace and view a file, read-only, through the tools
// (list_directory, read_file) so the sandbox's containment applies exactly as for an
// agent. Names are shown as the tools quote them; a quoted path is taken back as is.

import { execute } from '../api.js';
import { button, errorBox, fill, fmtBytes, h, spinner, uiCallId } from '../dom.js';
import { highlight, langOf } from '../highlight.js';

// list_directory names each entry relative to the folder listed, quoted when it is not
// plain text ("a\nb"); the tools take a path back one name at a time (dir/"a\nb"), so a
// child's path is the folder's path, "/", and its name as shown.
function childOf(dir, name) {
  return dir === '.' ? name : `${dir}/${name}`;
}

function parentOf(path) {
  if (!path || path === '.') return null;
  const i = path.lastIndexOf('/');
  return i < 0 ? '.' : path.slice(0, i);
}

// #/w/<id>/files/d/<path> is a folder, .../files/f/<path> a file
const href = (id, path, kind = 'd') => `#/w/${encodeURIComponent(id)}/files/${kind}/${encodeURIComponent(path)}`;

export function filesView(panel, id, arg) {
  let alive = true;
  const kind = arg && arg.startsWith('f/') ? 'f' : 'd';
  const here = (arg && /^[df]\//.test(arg) ? arg.slice(2) : arg) || '.';
  const crumbs = h('nav', { class: 'pathbar', 'aria-label': 'Folder' });
  const body = h('div', { class: 'card' }, spinner());
  fill(panel, crumbs, body);

  function showCrumbs(path, isFile) {
    const parts = [h('a', { href: href(id, '.') }, 'workspace')];
    if (path !== '.') {
      const segs = path.split('/');
      segs.forEach((s, i) => {
        const p = segs.slice(0, i + 1).join('/');
        parts.push(' / ', i === segs.length - 1 ? h('code', { class: 'path', 'aria-current': 'page' }, s) : h('a', { href: href(id, p) }, s));
      });
    }
    if (isFile) {
      const up = parentOf(path);
      if (up) parts.push(' ', h('a', { href: href(id, up), class: 'small' }, '(back to folder)'));
    }
    fill(crumbs, parts);
  }

  async function showDir(path) {
    const r = await execute(id, 'list_directory', { path, depth: 1 }, uiCallId('list'));
    if (!alive) return;
    showCrumbs(path, false);
    if (!r.success) {
      fill(body, errorBox(r.error || r.output));
      return;
    }
    const entries = (r.data && r.data.entries) || [];
    if (!entries.length) {
      fill(body, h('p', { class: 'muted' }, 'Empty folder.'));
      return;
    }
    const up = parentOf(path);
    const rows = entries
      .filter((e) => e.depth === undefined || e.depth <= 1)
      .sort((a, b) => ((a.type === 'dir') === (b.type === 'dir') ? a.path.localeCompare(b.path) : a.type === 'dir' ? -1 : 1))
      .map((e) =>
        h(
          'tr',
          null,
          h(
            'td',
            { 'data-label': 'Name' },
            h('a', { href: href(id, childOf(path, e.path), e.type === 'dir' ? 'd' : 'f'), class: `file ${e.type}` }, h('span', { class: 'icon', 'aria-hidden': 'true' }, e.type === 'dir' ? '▸' : e.type === 'symlink' ? '↪' : '·'), ' ', e.path + (e.type === 'dir' ? '/' : '')),
          ),
          h('td', { 'data-label': 'Type' }, e.type),
          h('td', { 'data-label': 'Size', class: 'num' }, e.type === 'file' ? fmtBytes(e.size) : ''),
        ),
      );
    fill(
      body,
      h(
        'table',
        { class: 'grid files' },
        h('thead', null, h('tr', null, ['Name', 'Type', 'Size'].map((t) => h('th', { scope: 'col' }, t)))),
        h('tbody', null, up ? h('tr', null, h('td', { colspan: '3' }, h('a', { href: href(id, up) }, '.. (parent folder)'))) : '', rows),
      ),
      r.data.truncated ? h('p', { class: 'muted' }, 'The listing was cut: the folder has more entries.') : '',
    );
  }

  async function showFile(path) {
    const r = await execute(id, 'read_file', { path }, uiCallId('read'));
    if (!alive) return;
    showCrumbs(path, true);
    if (!r.success) {
      fill(body, errorBox(r.error || r.output));
      return;
    }
    const d = r.data || {};
    if (d.binary) {
      fill(body, h('p', { class: 'muted' }, `Binary file, ${fmtBytes(d.size)}: its content is not shown.`));
      return;
    }
    const text = d.content || '';
    const lang = langOf(path);
    const lines = text.split('\n');
    if (lines.length > 1 && lines[lines.length - 1] === '') lines.pop();
    const code = h('div', { class: 'code-view', role: 'region', 'aria-label': `Content of ${path}`, tabindex: '0' });
    const shown = lines.slice(0, 5000);
    shown.forEach((l, i) => code.append(h('div', { class: 'cl' }, h('span', { class: 'ln', 'aria-hidden': 'true' }, String(i + 1)), h('span', { class: 'code' }, highlight(l, lang)))));
    fill(
      body,
      h('header', { class: 'file-head' }, h('code', { class: 'path' }, d.path || path), h('span', { class: 'muted small' }, `${fmtBytes(d.size)}${d.truncated ? ' (shown in part)' : ''}`)),
      code,
      lines.length > shown.length ? h('p', { class: 'muted' }, `${lines.length - shown.length} more lines not shown.`) : '',
      text === '' ? h('p', { class: 'muted' }, 'Empty file.') : '',
    );
  }

  (async () => {
    try {
      await (kind === 'f' ? showFile(here) : showDir(here));
    } catch (e) {
      if (alive) fill(body, errorBox(e), button('Retry', () => filesView(panel, id, arg)));
    }
  })();
  return {
    destroy() {
      alive = false;
    },
  };
}
