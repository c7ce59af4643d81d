// The egress log: the workspace's allowlist and every connection attempt, newest first; each
// use of a secret (its name, the request, the answer's status: never its value).

import { get, ws } from '../api.js';
import { button, errorBox, fill, fmtBytes, fmtDuration, fmtIso, fmtTime, h, spinner } from '../dom.js';

const EVERY_MS = 5000;

export function egressView(panel, id) {
  let alive = true;
  const verdict = h('select', { id: 'verdict' }, ['', 'allowed', 'denied', 'limited', 'error'].map((v) => h('option', { value: v }, v || 'all')));
  const head = h('div', { class: 'toolbar' }, h('label', { for: 'verdict' }, 'Verdict'), verdict, h('span', { class: 'spacer' }), button('Refresh', () => load()));
  const policy = h('div', { class: 'card' }, spinner());
  const log = h('div', { class: 'card flush' });
  fill(panel, head, policy, log);
  verdict.addEventListener('change', () => load());

  async function load() {
    let r;
    try {
      r = await get(`${ws(id)}/egress`, { limit: 500, verdict: verdict.value || undefined });
    } catch (e) {
      if (alive) fill(policy, errorBox(e));
      return;
    }
    if (!alive) return;
    fill(
      policy,
      h('h2', null, 'Network'),
      r.enabled
        ? [
            h('p', null, 'The sandbox may reach only these, through the gateway', r.serving ? ' (served by this service now):' : ':'),
            h('ul', { class: 'paths' }, r.policy.map((p) => h('li', null, h('code', null, p)))),
          ]
        : h('p', { class: 'muted' }, 'No network: the sandbox has only loopback. Allow destinations with PATCH /v1/workspaces/{id} {"egress": [...]}.'),
    );
    const entries = r.entries || [];
    if (!entries.length) {
      fill(log, h('p', { class: 'muted pad' }, 'No egress attempts recorded.'));
      return;
    }
    fill(
      log,
      h(
        'table',
        { class: 'grid egress' },
        h('thead', null, h('tr', null, ['Time', 'Kind', 'Destination', 'Secret', 'Request', 'Verdict', 'Reason', 'Address', 'Up', 'Down', 'Duration'].map((t) => h('th', { scope: 'col' }, t)))),
        h(
          'tbody',
          null,
          entries.map((e) =>
            h(
              'tr',
              { class: e.verdict === 'allowed' ? '' : 'bad' },
              h('td', { 'data-label': 'Time', title: fmtIso(e.time) }, fmtTime(e.time)),
              h('td', { 'data-label': 'Kind' }, e.kind),
              h('td', { 'data-label': 'Destination' }, h('code', null, `${e.host}:${e.port}`)),
              h('td', { 'data-label': 'Secret' }, e.kind === 'secret' ? h('code', null, e.secret || '(none of ours)') : ''),
              h('td', { 'data-label': 'Request' }, e.kind === 'secret' ? h('code', null, `${e.method} ${e.path}${e.status ? ` → ${e.status}` : ''}`) : ''),
              h('td', { 'data-label': 'Verdict' }, h('span', { class: `badge ${e.verdict === 'allowed' ? 'ok' : 'bad'}` }, e.verdict)),
              h('td', { 'data-label': 'Reason' }, e.reason || ''),
              h('td', { 'data-label': 'Address' }, e.address || ''),
              h('td', { 'data-label': 'Up', class: 'num' }, e.kind === 'secret' ? '' : fmtBytes(e.bytes_up)),
              h('td', { 'data-label': 'Down', class: 'num' }, e.kind === 'secret' ? '' : fmtBytes(e.bytes_down)),
              h('td', { 'data-label': 'Duration', class: 'num' }, e.kind === 'secret' ? '' : fmtDuration(e.duration_ms)),
            ),
          ),
        ),
      ),
    );
  }

  load();
  const timer = setInterval(() => {
    if (!document.hidden) load();
  }, EVERY_MS);
  return {
    destroy() {
      alive = false;
      clearInterval(timer);
    },
  };
}
