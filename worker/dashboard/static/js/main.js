// The dashboard's entry point: sign-in, then a hash router over the views.
//   #/                      workspaces
//   #/w/<id>/<tab>[/<arg>]  one workspace: timeline | changes | files | run | code | terminal |
//                           sandbox | snapshots | egress

import { ApiError, api, auth } from './api.js';
import { $, button, errorBox, fill, h } from './dom.js';
import { signIn } from './views/signin.js';
import { workspaceView } from './views/workspace.js';
import { workspacesView } from './views/workspaces.js';

const main = $('#main');
let current = null; // the view on screen: {destroy()}
let tokenMode = null; // 'token' | 'open' (no token configured: loopback only)

function destroyCurrent() {
  if (current && current.destroy) current.destroy();
  current = null;
}

function crumbs(parts) {
  const nav = $('#crumbs');
  fill(nav);
  const ol = h('ol');
  parts.forEach(([label, href], i) => {
    const last = i === parts.length - 1;
    ol.append(h('li', null, last ? h('span', { 'aria-current': 'page' }, label) : h('a', { href }, label)));
  });
  nav.append(ol);
}

function route() {
  destroyCurrent();
  const hash = decodeURIComponent(location.hash.replace(/^#/, '')) || '/';
  const parts = hash.split('/').filter(Boolean);
  if (parts[0] === 'w' && parts[1]) {
    const id = parts[1];
    const tab = parts[2] || 'timeline';
    const arg = parts.slice(3).join('/');
    crumbs([
      ['Workspaces', '#/'],
      [id, `#/w/${encodeURIComponent(id)}`],
    ]);
    current = workspaceView(main, id, tab, arg);
  } else {
    crumbs([['Workspaces', '#/']]);
    current = workspacesView(main);
  }
}

function showSignIn(message) {
  destroyCurrent();
  fill($('#crumbs'));
  $('#signout').hidden = true;
  $('#mode').textContent = '';
  current = signIn(main, message, start);
}

/** Called once the service accepted us (with the token, or without one configured). */
function start(mode) {
  tokenMode = mode;
  const out = $('#signout');
  out.hidden = mode !== 'token';
  $('#mode').textContent = mode === 'open' ? 'no API token: loopback only' : '';
  window.addEventListener('hashchange', route);
  route();
}

async function boot() {
  auth.onUnauthorized(() => {
    if (tokenMode === 'open') return;
    auth.clear();
    window.removeEventListener('hashchange', route);
    showSignIn('Your token is no longer accepted: sign in again.');
  });
  $('#signout').addEventListener('click', () => {
    auth.clear();
    window.removeEventListener('hashchange', route);
    showSignIn('Signed out.');
  });
  // Without a token configured the service answers at once: open directly.
  try {
    await api('GET', '/v1/workspaces', { token: null });
    start('open');
    return;
  } catch (e) {
    if (!(e instanceof ApiError) || e.status !== 401) {
      fill(main, errorBox(e), button('Retry', () => location.reload()));
      return;
    }
  }
  const stored = auth.token;
  if (stored) {
    try {
      await api('GET', '/v1/workspaces', { token: stored });
      start('token');
      return;
    } catch (e) {
      if (!(e instanceof ApiError) || e.status !== 401) {
        fill(main, errorBox(e), button('Retry', () => location.reload()));
        return;
      }
      auth.clear();
    }
  }
  showSignIn();
}

boot();
