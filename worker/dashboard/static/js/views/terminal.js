// Terminal: the workspace's terminals (a list, "New terminal") and one of them on screen,
// xterm.js (vendored: /ui/vendor/, loaded when this tab first opens) over the WebSocket
// GET .../terminals/{tid}/ws (subprotocol loom.terminal.v1, docs/terminals.md).
//
//   #/w/<id>/terminal         the terminal opened last in this tab (else the newest running)
//   #/w/<id>/terminal/<tid>   that one: a reload reattaches and replays its scrollback
//
// The token goes as the subprotocol loom.bearer.<base64url> (a browser cannot set a
// WebSocket's headers); the server never echoes it. A connection lost is reopened from
// the last byte received (?since=), so nothing is shown twice.

import { ApiError, api, auth, get, ws } from '../api.js';
import { button, errorBox, fill, fmtTime, h, spinner, toast } from '../dom.js';

const PROTOCOL = 'loom.terminal.v1';
const LIST_EVERY_MS = 5000;
const LAST = 'loom-worker.terminal.';
const FONT = "ui-monospace, 'DejaVu Sans Mono', 'Cascadia Mono', Menlo, Consolas, monospace";

let xterm = null; // the modules, loaded once: {Terminal, FitAddon}

/**
 * xterm.js writes its colours and cell sizes into <style> elements it makes with
 * document.createElement('style'). The page's Content-Security-Policy refuses inline
 * styles but those carrying the nonce of this page's response (worker/dashboard/routes.py,
 * on the page's stylesheet link): style elements made by this page's own scripts carry it.
 * (Markup injected into the page could not: it is never built with createElement.)
 */
function allowScriptStyles() {
  const link = document.querySelector('link[rel="stylesheet"][nonce]');
  const nonce = link ? link.nonce : '';
  if (!nonce || document.createElement.loomStyleNonce) return;
  const create = Document.prototype.createElement;
  const withNonce = function (tag, options) {
    const el = create.call(this, tag, options);
    if (typeof tag === 'string' && tag.toLowerCase() === 'style') el.nonce = nonce;
    return el;
  };
  withNonce.loomStyleNonce = true;
  document.createElement = withNonce;
}

async function loadXterm() {
  if (xterm) return xterm;
  allowScriptStyles();
  if (!document.querySelector('link[data-xterm]')) {
    document.head.append(h('link', { rel: 'stylesheet', href: '/ui/vendor/xterm/xterm.css', 'data-xterm': '' }));
  }
  const [core, fit] = await Promise.all([
    import('../../vendor/xterm/xterm.mjs'),
    import('../../vendor/xterm-addon-fit/addon-fit.mjs'),
  ]);
  xterm = { Terminal: core.Terminal, FitAddon: fit.FitAddon };
  return xterm;
}

function b64url(text) {
  let bin = '';
  for (const b of new TextEncoder().encode(text)) bin += String.fromCharCode(b);
  return btoa(bin).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

function socketUrl(id, tid, since) {
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  const q = since !== null && since !== undefined ? `?since=${since}` : '';
  return `${scheme}//${location.host}${ws(id)}/terminals/${encodeURIComponent(tid)}/ws${q}`;
}

function label(t) {
  return t.command || 'login shell';
}

function stateBadge(t) {
  if (t.running) return h('span', { class: 'badge ok' }, 'running');
  const how = t.outcome === 'signal' ? `signal ${t.signal ?? ''}` : `exit ${t.exit_code ?? ''}`;
  return h('span', { class: 'badge' }, `ended (${how.trim()})`);
}

export function terminalView(panel, id, arg) {
  let alive = true;
  let current = arg || null; // the terminal on screen
  let screen = null; // {destroy(), fitNow(), size()}
  let listed = [];
  const list = h('ul', { class: 'term-list', 'aria-label': 'Terminals' });
  const newBtn = button('New terminal', () => create(), { kind: 'primary' });
  const side = h('nav', { class: 'card term-side', 'aria-label': 'Terminals of this workspace' }, h('div', { class: 'term-side-head' }, h('h2', null, 'Terminals'), newBtn), list);
  const main = h('section', { class: 'card term-main', 'aria-label': 'Terminal' }, spinner());
  fill(panel, h('div', { class: 'terminals' }, side, main));

  function go(tid, { replace = false } = {}) {
    const hash = `#/w/${encodeURIComponent(id)}/terminal/${encodeURIComponent(tid)}`;
    if (replace) {
      history.replaceState(null, '', hash); // (no hashchange: the view stays)
      current = tid;
      sessionStorage.setItem(LAST + id, tid);
      show(tid);
      renderList();
    } else location.hash = hash;
  }

  let shown = null; // what the list shows now (a refresh that changes nothing keeps it, and the focus)
  function renderList() {
    const key = JSON.stringify([current, listed.map((t) => [t.id, t.command, t.running, t.outcome, t.exit_code, t.signal])]);
    if (key === shown) return;
    shown = key;
    fill(
      list,
      listed.length ? '' : h('li', { class: 'muted' }, 'None yet.'),
      listed.map((t) =>
        h(
          'li',
          { class: t.id === current ? 'active' : null },
          h('a', { href: `#/w/${encodeURIComponent(id)}/terminal/${encodeURIComponent(t.id)}`, 'aria-current': t.id === current ? 'true' : null, 'data-terminal': t.id }, h('code', null, label(t))),
          h('div', { class: 'small muted' }, stateBadge(t), ' ', t.started ? fmtTime(t.started) : ''),
        ),
      ),
    );
  }

  async function loadList() {
    try {
      listed = (await get(`${ws(id)}/terminals`)).terminals || [];
    } catch (e) {
      if (alive) fill(list, h('li', null, errorBox(e)));
      shown = null;
      return null;
    }
    if (alive) renderList();
    return listed;
  }

  async function create() {
    newBtn.disabled = true;
    try {
      const size = screen ? screen.size() : { cols: 80, rows: 24 };
      const t = await api('POST', `${ws(id)}/terminals`, { body: { command: null, cols: size.cols, rows: size.rows } });
      sessionStorage.setItem(LAST + id, t.id);
      go(t.id);
    } catch (e) {
      toast(`Cannot open a terminal: ${e.message}`, 'error');
    } finally {
      newBtn.disabled = false;
    }
  }

  async function show(tid) {
    if (screen) screen.destroy();
    screen = null;
    const info = listed.find((t) => t.id === tid);
    if (!info) {
      fill(main, h('p', { class: 'muted' }, `No terminal ${tid} in this workspace (it ended, or its sandbox stopped).`), button('New terminal', () => create()));
      return;
    }
    let mod;
    try {
      mod = await loadXterm();
    } catch (e) {
      fill(main, errorBox(`The terminal could not be loaded: ${e.message}`));
      return;
    }
    if (!alive || current !== tid) return;
    screen = attach(mod, main, id, info, () => loadList());
  }

  (async () => {
    const found = await loadList();
    if (!alive || found === null) return;
    if (!current) {
      const last = sessionStorage.getItem(LAST + id);
      const pick = found.find((t) => t.id === last) || [...found].reverse().find((t) => t.running);
      if (!pick) {
        fill(main, h('p', { class: 'muted' }, 'No terminal open. A new one runs a login shell in the sandbox (started if it is not).'), button('New terminal', () => create(), { kind: 'primary' }));
        return;
      }
      go(pick.id, { replace: true });
      return;
    }
    sessionStorage.setItem(LAST + id, current);
    renderList();
    show(current);
  })();
  const timer = setInterval(() => {
    if (!document.hidden) loadList();
  }, LIST_EVERY_MS);

  return {
    destroy() {
      alive = false;
      clearInterval(timer);
      if (screen) screen.destroy();
    },
  };
}

/** One terminal on screen: xterm.js, its WebSocket (reopened when lost), its size. */
function attach({ Terminal, FitAddon }, main, id, info, changed) {
  let closed = false;
  let sock = null;
  let cursor = null; // the offset of the next output byte (null: replay the scrollback)
  let delay = 500;
  let retry = null;
  let ended = false;
  const status = h('p', { class: 'term-status small muted', role: 'status' }, 'Connecting…');
  const box = h('div', { class: 'term-box', 'data-terminal': info.id });
  const kill = button('Kill', async () => {
    kill.disabled = true;
    try {
      await api('DELETE', `${ws(id)}/terminals/${encodeURIComponent(info.id)}`);
      changed();
    } catch (e) {
      kill.disabled = false;
      toast(`Kill failed: ${e.message}`, 'error');
    }
  }, { kind: 'ghost danger', title: 'End its program and everything it started' });
  fill(main, h('div', { class: 'term-head' }, h('h2', null, h('code', null, label(info))), h('span', { class: 'muted small' }, info.id), h('span', { class: 'spacer' }), status, kill), box);

  const term = new Terminal({ cols: info.cols || 80, rows: info.rows || 24, fontFamily: FONT, fontSize: 14, scrollback: 5000, convertEol: false });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(box);
  const encoder = new TextEncoder();

  function send(data) {
    if (sock && sock.readyState === WebSocket.OPEN) sock.send(data);
  }
  function sendResize() {
    send(JSON.stringify({ type: 'resize', cols: term.cols, rows: term.rows }));
  }
  term.onData((d) => send(encoder.encode(d)));
  term.onBinary((d) => send(Uint8Array.from(d, (c) => c.charCodeAt(0) & 0xff)));
  term.onResize(() => sendResize());

  let pending = 0;
  function fitNow() {
    pending = 0;
    if (closed || !box.isConnected || box.clientWidth === 0) return;
    try {
      fit.fit(); // (a change of size is sent by onResize)
    } catch {
      // not laid out yet
    }
  }
  const observer = new ResizeObserver(() => {
    if (!pending) pending = requestAnimationFrame(fitNow);
  });
  observer.observe(box);
  fitNow();

  function setStatus(text, kind = 'muted') {
    status.textContent = text;
    status.className = `term-status small ${kind}`;
  }

  function open() {
    if (closed) return;
    const protocols = [PROTOCOL];
    const token = auth.token;
    if (token) protocols.push(`loom.bearer.${b64url(token)}`);
    const s = new WebSocket(socketUrl(id, info.id, cursor), protocols);
    s.binaryType = 'arraybuffer';
    sock = s;
    let attached = false;
    s.onmessage = (ev) => {
      if (sock !== s) return;
      if (typeof ev.data !== 'string') {
        const bytes = new Uint8Array(ev.data);
        cursor = (cursor ?? 0) + bytes.length;
        term.write(bytes);
        return;
      }
      let msg;
      try {
        msg = JSON.parse(ev.data);
      } catch {
        return;
      }
      if (msg.type === 'attached') {
        attached = true;
        delay = 500;
        if (cursor === null && msg.dropped > 0) term.write(`\x1b[2m[${msg.dropped} bytes of earlier output are no longer kept]\x1b[0m\r\n`);
        cursor = msg.cursor;
        setStatus('Connected', 'ok-text');
        if (msg.cols !== term.cols || msg.rows !== term.rows) sendResize();
        term.focus();
      } else if (msg.type === 'exit') {
        ended = true;
        const how = msg.outcome === 'signal' ? `ended by signal ${msg.signal}` : `exited with code ${msg.exit_code}`;
        setStatus(`The program ${how}.`);
        kill.hidden = true;
        changed();
      } else if (msg.type === 'error') {
        toast(`Terminal: ${msg.message}`, 'error');
      }
    };
    s.onclose = (ev) => {
      if (sock !== s || closed) return;
      sock = null;
      if (ended || ev.code === 1000) {
        if (!ended) setStatus('Closed by the service.');
        return;
      }
      if (ev.code >= 4400 && ev.code < 4500) {
        setStatus(ev.reason || `Refused (${ev.code}).`, 'error-text');
        changed();
        return;
      }
      if (ev.code === 4501) {
        setStatus(ev.reason || 'This service does not carry terminals.', 'error-text');
        return;
      }
      if (!attached) {
        // A handshake refused before it was accepted reads as 1006 in a browser: ask
        // the API why (a 401 signs out through api.js; a 404: the terminal is gone).
        get(`${ws(id)}/terminals/${encodeURIComponent(info.id)}`)
          .then(() => reconnect(ev))
          .catch((e) => {
            if (closed) return;
            if (e instanceof ApiError && e.status >= 400 && e.status < 500) {
              setStatus(e.status === 404 ? 'This terminal no longer exists.' : e.message, 'error-text');
              changed();
            } else reconnect(ev);
          });
        return;
      }
      reconnect(ev);
    };
  }

  function reconnect(ev) {
    if (closed) return;
    setStatus(`Connection lost${ev.reason ? `: ${ev.reason}` : ''}; reconnecting…`, 'error-text');
    retry = setTimeout(open, delay);
    delay = Math.min(10000, delay * 2);
  }
  open();

  return {
    size: () => ({ cols: term.cols, rows: term.rows }),
    destroy() {
      closed = true;
      clearTimeout(retry);
      if (pending) cancelAnimationFrame(pending);
      observer.disconnect();
      if (sock) sock.close(1000); // detach: the terminal goes on
      sock = null;
      term.dispose();
    },
  };
}
