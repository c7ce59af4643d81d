// The sandbox's state (running or not, image, runtime, limits, CPU and memory now,
// refreshed while the tab is open) and the workspace's settings.

import { get, ws } from '../api.js';
import { errorBox, fill, fmtBytes, h, kvTable, spinner } from '../dom.js';

const EVERY_MS = 3000;

function value(v) {
  if (v === null || v === undefined || v === '') return h('span', { class: 'muted' }, '—');
  if (typeof v === 'object') return h('code', { class: 'pre' }, JSON.stringify(v));
  return String(v);
}

export function sandboxView(panel, id) {
  let alive = true;
  const state = h('div', { class: 'card' }, h('h2', null, 'Sandbox'), spinner());
  const settings = h('div', { class: 'card' }, h('h2', null, 'Settings'), spinner());
  fill(panel, h('div', { class: 'two' }, state, settings));

  async function loadState() {
    let s;
    try {
      s = await get(`${ws(id)}/sandbox`);
    } catch (e) {
      if (alive) fill(state, h('h2', null, 'Sandbox'), errorBox(e));
      return;
    }
    if (!alive) return;
    if (s.backend === null) {
      fill(state, h('h2', null, 'Sandbox'), h('p', { class: 'muted' }, 'This service\'s sandbox backend does not report its state.'));
      return;
    }
    const u = s.usage || {};
    const lim = s.limits || {};
    const badge = s.running ? h('span', { class: 'badge ok' }, 'running') : h('span', { class: 'badge' }, s.exists ? s.status : 'not started');
    fill(
      state,
      h('h2', null, 'Sandbox ', badge),
      s.exists
        ? kvTable([
            ['Container', value(s.container)],
            ['Image', value(s.image)],
            ['Runtime', value(s.runtime)],
            ['Started', value(s.started_at)],
            ['CPU now', s.running ? value(u.cpu_percent === null || u.cpu_percent === undefined ? null : `${u.cpu_percent}%`) : value(null)],
            ['Memory now', s.running && u.memory_bytes !== null && u.memory_bytes !== undefined ? `${fmtBytes(u.memory_bytes)} of ${fmtBytes(lim.memory_bytes || u.memory_limit_bytes)}` : value(null)],
            ['Processes', s.running ? value(u.pids) : value(null)],
            ['CPU limit', value(lim.cpus)],
            ['Memory limit', lim.memory_bytes ? fmtBytes(lim.memory_bytes) : value(null)],
            ['Process limit', value(lim.pids)],
            s.oom_killed ? ['Note', 'the engine killed it for memory'] : null,
          ])
        : h('p', { class: 'muted' }, 'No container: it starts at the workspace\'s next tool call.'),
    );
  }

  async function loadSettings() {
    let r;
    try {
      r = await get(ws(id));
    } catch (e) {
      if (alive) fill(settings, h('h2', null, 'Settings'), errorBox(e));
      return;
    }
    if (!alive) return;
    const own = r.settings || {};
    const eff = r.effective || {};
    const keys = Array.from(new Set([...Object.keys(eff), ...Object.keys(own)])).sort();
    fill(
      settings,
      h('h2', null, 'Settings'),
      h('p', { class: 'muted small' }, 'Its own settings override the service\'s defaults (change them with PATCH /v1/workspaces/{id} or loom-worker workspace set).'),
      h(
        'table',
        { class: 'grid settings' },
        h('thead', null, h('tr', null, ['Setting', 'Effective', 'Own'].map((t) => h('th', { scope: 'col' }, t)))),
        h('tbody', null, keys.map((k) => h('tr', null, h('th', { scope: 'row' }, k), h('td', { 'data-label': 'Effective', title: String(eff[k] ?? '') }, k === 'memory' && typeof eff[k] === 'number' ? fmtBytes(eff[k]) : value(eff[k])), h('td', { 'data-label': 'Own' }, k in own ? value(own[k]) : h('span', { class: 'muted' }, 'default'))))),
      ),
    );
  }

  loadState();
  loadSettings();
  const timer = setInterval(() => {
    if (!document.hidden) loadState();
  }, EVERY_MS);
  return {
    destroy() {
      alive = false;
      clearInterval(timer);
    },
  };
}
