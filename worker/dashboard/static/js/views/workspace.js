// One workspace: a header and its tabs (a real tablist: arrow keys move between tabs).

import { get, ws } from '../api.js';
import { errorBox, fill, h } from '../dom.js';
import { changesView } from './changes.js';
import { codeView } from './code.js';
import { egressView } from './egress.js';
import { filesView } from './files.js';
import { runView } from './run.js';
import { sandboxView } from './sandbox.js';
import { snapshotsView } from './snapshots.js';
import { terminalView } from './terminal.js';
import { timelineView } from './timeline.js';

const TABS = [
  ['timeline', 'Timeline', timelineView],
  ['changes', 'Changes', changesView],
  ['files', 'Files', filesView],
  ['run', 'Run', runView],
  ['code', 'Code', codeView],
  ['terminal', 'Terminal', terminalView],
  ['sandbox', 'Sandbox', sandboxView],
  ['snapshots', 'Snapshots', snapshotsView],
  ['egress', 'Egress', egressView],
];

// The page is rebuilt on every route change: a tab chosen by keyboard gets the focus back.
let refocus = null;

export function workspaceView(main, id, tab, arg) {
  const known = TABS.find((t) => t[0] === tab) || TABS[0];
  const path = h('p', { class: 'path muted small' });
  const head = h('div', { class: 'ws-head' }, h('h1', null, id), path);
  const list = h('div', { class: 'tabs', role: 'tablist', 'aria-label': 'Workspace' });
  const panel = h('section', { class: 'tabpanel', role: 'tabpanel', id: 'panel', tabindex: '-1' });
  const buttons = TABS.map(([key, label]) => {
    const selected = key === known[0];
    const a = h(
      'a',
      {
        role: 'tab',
        id: `tab-${key}`,
        href: `#/w/${encodeURIComponent(id)}/${key}`,
        'aria-selected': selected ? 'true' : 'false',
        'aria-controls': 'panel',
        tabindex: selected ? '0' : '-1',
        class: selected ? 'tab active' : 'tab',
      },
      label,
    );
    return a;
  });
  list.append(...buttons);
  list.addEventListener('keydown', (ev) => {
    const i = buttons.indexOf(document.activeElement);
    if (i < 0) return;
    let j = null;
    if (ev.key === 'ArrowRight') j = (i + 1) % buttons.length;
    else if (ev.key === 'ArrowLeft') j = (i - 1 + buttons.length) % buttons.length;
    else if (ev.key === 'Home') j = 0;
    else if (ev.key === 'End') j = buttons.length - 1;
    if (j === null) return;
    ev.preventDefault();
    refocus = TABS[j][0];
    buttons[j].click();
  });
  panel.setAttribute('aria-labelledby', `tab-${known[0]}`);
  fill(main, h('div', { class: 'page' }, head, list, panel));
  if (refocus === known[0]) buttons[TABS.indexOf(known)].focus();
  refocus = null;

  let alive = true;
  get(ws(id))
    .then((info) => {
      if (alive) path.textContent = info.path;
    })
    .catch((e) => {
      if (!alive) return;
      if (e.status === 404) fill(panel, errorBox(`Workspace ${id} not found.`));
      else path.textContent = '';
    });

  const view = known[2](panel, id, arg);
  return {
    destroy() {
      alive = false;
      if (view && view.destroy) view.destroy();
    },
  };
}
