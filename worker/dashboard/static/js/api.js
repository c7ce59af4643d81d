// The public HTTP API, as the dashboard uses it: the token is sent as an Authorization
// header (never a cookie, never in a URL) and kept in sessionStorage, so it lives as long
// as the browser tab and no other origin can read it.

import { readSSE } from './sse.js';

const KEY = 'loom-worker.token';
const listeners = new Set();

export const auth = {
  get token() {
    return sessionStorage.getItem(KEY);
  },
  set(token) {
    sessionStorage.setItem(KEY, token);
  },
  clear() {
    sessionStorage.removeItem(KEY);
  },
  /** Called with no argument when the service answers 401 (token gone or changed). */
  onUnauthorized(fn) {
    listeners.add(fn);
  },
};

export class ApiError extends Error {
  constructor(status, message, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

/** FastAPI's error detail as one readable line, naming the field (detail[].loc). */
export function detailText(body, status) {
  if (!body) return `HTTP ${status}`;
  const d = body.detail !== undefined ? body.detail : body;
  if (typeof d === 'string') return d;
  if (Array.isArray(d)) {
    return d
      .map((e) => {
        const loc = Array.isArray(e.loc) ? e.loc.filter((x) => x !== 'body' && x !== 'query').join('.') : '';
        return loc ? `${loc}: ${e.msg}` : e.msg;
      })
      .join('; ');
  }
  return JSON.stringify(d);
}

function headers(extra) {
  const hs = { Accept: 'application/json', ...extra };
  const t = auth.token;
  if (t) hs.Authorization = `Bearer ${t}`;
  return hs;
}

export function url(path, query) {
  if (!query) return path;
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) if (v !== null && v !== undefined) q.set(k, String(v));
  const s = q.toString();
  return s ? `${path}?${s}` : path;
}

/** One API request. Resolves to the parsed body; rejects with ApiError (status, message). */
export async function api(method, path, { body, query, signal, token } = {}) {
  const extra = body !== undefined ? { 'Content-Type': 'application/json' } : {};
  const hs = headers(extra);
  if (token !== undefined) {
    if (token) hs.Authorization = `Bearer ${token}`;
    else delete hs.Authorization;
  }
  let r;
  try {
    r = await fetch(url(path, query), {
      method,
      headers: hs,
      body: body !== undefined ? JSON.stringify(body) : undefined,
      signal,
      credentials: 'omit',
      cache: 'no-store',
    });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(0, `The service does not answer (${e.message})`, null);
  }
  const ct = r.headers.get('content-type') || '';
  let data = null;
  if (ct.includes('json')) data = await r.json().catch(() => null);
  else data = await r.text();
  if (r.status === 401 && token === undefined) for (const fn of listeners) fn();
  if (!r.ok) throw new ApiError(r.status, detailText(data, r.status), data);
  return data;
}

export const get = (path, query, opts) => api('GET', path, { ...opts, query });
export const post = (path, body, opts) => api('POST', path, { ...opts, body });

export const ws = (id) => `/v1/workspaces/${encodeURIComponent(id)}`;

/** Run one tool in a workspace (POST .../execute): the ToolResult. */
export function execute(id, tool, args, callId) {
  return post(`${ws(id)}/execute`, { tool, arguments: args, call_id: callId });
}

/**
 * Read a Server-Sent Events stream with fetch() (EventSource cannot send the
 * Authorization header). onEvent({event, data, id}) for each event. Resolves when the
 * stream ends; rejects with ApiError for an HTTP error, or on a network error.
 */
export async function stream(method, path, { query, body, signal, onEvent, onOpen, lastEventId } = {}) {
  const hs = headers({ Accept: 'text/event-stream' });
  if (body !== undefined) hs['Content-Type'] = 'application/json';
  if (lastEventId) hs['Last-Event-ID'] = lastEventId;
  const r = await fetch(url(path, query), {
    method,
    headers: hs,
    body: body !== undefined ? JSON.stringify(body) : undefined,
    signal,
    credentials: 'omit',
    cache: 'no-store',
  });
  if (!r.ok) {
    const ct = r.headers.get('content-type') || '';
    const data = ct.includes('json') ? await r.json().catch(() => null) : await r.text();
    if (r.status === 401) for (const fn of listeners) fn();
    throw new ApiError(r.status, detailText(data, r.status), data);
  }
  if (onOpen) onOpen();
  await readSSE(r.body, onEvent);
}

/**
 * POST ``body`` and read the answer as NDJSON (one JSON value a line, as it comes):
 * onLine(value) for each. Resolves when the body ends; rejects with ApiError for an HTTP
 * error (before the stream: its JSON detail), or on a network error.
 */
export async function ndjson(path, { body, signal, onLine } = {}) {
  const r = await fetch(path, {
    method: 'POST',
    headers: headers({ Accept: 'application/x-ndjson', 'Content-Type': 'application/json' }),
    body: JSON.stringify(body),
    signal,
    credentials: 'omit',
    cache: 'no-store',
  });
  if (!r.ok) {
    const ct = r.headers.get('content-type') || '';
    const data = ct.includes('json') ? await r.json().catch(() => null) : await r.text();
    if (r.status === 401) for (const fn of listeners) fn();
    throw new ApiError(r.status, detailText(data, r.status), data);
  }
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += value;
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl).trim();
      buf = buf.slice(nl + 1);
      if (line) onLine(JSON.parse(line));
    }
  }
  if (buf.trim()) onLine(JSON.parse(buf));
}

/**
 * Follow a stream for as long as the returned handle is not closed: reconnects after a
 * network error (1 s, then up to 10 s apart), resuming from the last event's id.
 * onState('live' | 'reconnecting' | 'error', detail). ``cursorOf(event)`` is where the
 * resume cursor is (default: the event's id).
 */
export function follow(path, { query = {}, onEvent, onState, resumeParam = 'after', cursorOf = (ev) => ev.id }) {
  const ctl = new AbortController();
  let last = query[resumeParam] !== undefined ? String(query[resumeParam]) : null;
  let delay = 1000;
  let closed = false;
  (async () => {
    while (!closed) {
      try {
        const q = { ...query };
        if (last !== null) q[resumeParam] = last;
        await stream('GET', path, {
          query: q,
          signal: ctl.signal,
          onOpen: () => {
            delay = 1000;
            if (onState) onState('live');
          },
          onEvent: (ev) => {
            const c = cursorOf(ev);
            if (c !== null && c !== undefined && c !== '') last = String(c);
            onEvent(ev);
          },
        });
      } catch (e) {
        if (closed || e.name === 'AbortError') return;
        if (e instanceof ApiError && e.status >= 400 && e.status < 500) {
          if (onState) onState('error', e.message);
          return;
        }
      }
      if (closed) return;
      if (onState) onState('reconnecting');
      await new Promise((res) => setTimeout(res, delay));
      delay = Math.min(10000, delay * 2);
    }
  })();
  return {
    close() {
      closed = true;
      ctl.abort();
    },
  };
}
