// Run: a command box for shell_execute with its output as it arrives, and the
// workspace's background processes with their live output and a Kill button.
//
// The streaming routes (POST .../execute/stream, GET .../processes...) come with the
// processes issue; until a service has them (404), the command runs through POST
// .../execute and its output is shown when it ends, and the processes panel is hidden.

import { ApiError, api, execute, follow, get, stream, ws } from '../api.js';
import { button, errorBox, fill, fmtDuration, fmtTime, h, spinner, uiCallId } from '../dom.js';

let streamSupported = null; // learnt from the first try: true | false

function resultLine(r) {
  const d = r.data || {};
  const parts = [];
  if (d.outcome) parts.push(d.outcome === 'exit' ? `exit code ${d.exit_code}` : d.outcome);
  if (d.duration_ms !== undefined) parts.push(fmtDuration(d.duration_ms));
  return h('p', { class: r.success ? 'success' : 'warning', role: 'status' }, r.success ? 'Done' : 'Failed', parts.length ? ` (${parts.join(', ')})` : '', r.success || !r.error ? '' : `: ${r.error}`);
}

export function runView(panel, id) {
  let alive = true;
  const base = ws(id);
  const cmd = h('textarea', { id: 'command', name: 'command', rows: '2', required: true, spellcheck: 'false', autocomplete: 'off', placeholder: 'e.g. pytest -q' });
  const timeout = h('input', { id: 'timeout', name: 'timeout', type: 'number', min: '1', max: '300', value: '60', inputmode: 'numeric' });
  const runBtn = h('button', { type: 'submit', class: 'primary' }, 'Run');
  const stopBtn = button('Stop watching', () => ctl && ctl.abort(), { kind: 'ghost' });
  stopBtn.hidden = true;
  const out = h('pre', { class: 'output', id: 'run-output', 'aria-live': 'polite', tabindex: '0' });
  const status = h('div', { class: 'run-status' });
  const mode = h('p', { class: 'muted small' });
  const form = h(
    'form',
    { class: 'card run', 'aria-label': 'Run a command' },
    h('label', { for: 'command' }, 'Command (runs with sh -c in the sandbox; Ctrl+Enter runs it)'),
    cmd,
    h('div', { class: 'row' }, h('label', { for: 'timeout' }, 'Timeout (s)'), timeout, h('span', { class: 'spacer' }), stopBtn, runBtn),
    mode,
  );
  const procs = h('section', { class: 'card procs hidden', 'aria-labelledby': 'procs-title' });
  fill(panel, form, h('div', { class: 'card' }, h('h2', null, 'Output'), status, out), procs);
  let ctl = null;

  cmd.addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && (ev.ctrlKey || ev.metaKey)) {
      ev.preventDefault();
      form.requestSubmit();
    }
  });

  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const command = cmd.value;
    if (!command.trim()) return;
    const args = { command, timeout: Number(timeout.value) || 60 };
    const callId = uiCallId('run');
    runBtn.disabled = true;
    out.textContent = '';
    fill(status, spinner('Running…'));
    ctl = new AbortController();
    try {
      if (streamSupported !== false) {
        try {
          await runStreamed(args, callId);
          streamSupported = true;
          return;
        } catch (e) {
          if (!(e instanceof ApiError) || (e.status !== 404 && e.status !== 405)) throw e;
          streamSupported = false;
        }
      }
      mode.textContent = 'This service does not stream output yet: it is shown when the command ends.';
      const r = await execute(id, 'shell_execute', args, callId);
      if (!alive) return;
      out.textContent = r.output;
      fill(status, resultLine(r));
    } catch (e) {
      if (e.name === 'AbortError') fill(status, h('p', { class: 'muted' }, 'Stopped watching (the command goes on until it ends or times out).'));
      else if (alive) fill(status, errorBox(e));
    } finally {
      runBtn.disabled = false;
      stopBtn.hidden = true;
      ctl = null;
    }
  });

  async function runStreamed(args, callId) {
    stopBtn.hidden = false;
    let result = null;
    await stream('POST', `${base}/execute/stream`, {
      body: { tool: 'shell_execute', arguments: args, call_id: callId },
      signal: ctl.signal,
      onOpen: () => {
        mode.textContent = 'Output is shown as the command prints it.';
      },
      onEvent: (ev) => {
        if (ev.event === 'output') {
          const d = JSON.parse(ev.data);
          const span = h('span', { class: d.stream === 'stderr' ? 'stderr' : null }, d.text);
          out.append(span);
          out.scrollTop = out.scrollHeight;
        } else if (ev.event === 'result') {
          result = JSON.parse(ev.data);
        }
      },
    });
    if (!alive) return;
    if (result) {
      fill(status, resultLine(result));
      if (!out.textContent && result.output) out.textContent = result.output;
    } else fill(status, h('p', { class: 'warning' }, 'The stream ended without a result.'));
  }

  // -- background processes (feature-detected) ------------------------------------
  const followers = new Map();
  let timer = null;

  async function loadProcs() {
    let r;
    try {
      r = await get(`${base}/processes`);
    } catch (e) {
      if (e instanceof ApiError && (e.status === 404 || e.status === 405)) {
        procs.classList.add('hidden'); // this service has no processes API (yet)
        return false;
      }
      if (alive) fill(procs, h('h2', { id: 'procs-title' }, 'Background processes'), errorBox(e));
      procs.classList.remove('hidden');
      return true;
    }
    if (!alive) return false;
    procs.classList.remove('hidden');
    const list = r.processes || [];
    const ids = new Set(list.map((p) => String(p.id)));
    for (const [key, f] of followers) {
      if (!ids.has(key)) {
        if (f.handle) f.handle.close();
        followers.delete(key);
      }
    }
    fill(
      procs,
      h('h2', { id: 'procs-title' }, 'Background processes'),
      list.length ? '' : h('p', { class: 'muted' }, 'None.'),
      list.map((p) => procCard(p)),
    );
    return true;
  }

  function procCard(p) {
    const key = String(p.id);
    let f = followers.get(key);
    if (!f) {
      const pre = h('pre', { class: 'output small' });
      f = { pre, handle: null };
      followers.set(key, f);
      f.handle = follow(`${base}/processes/${encodeURIComponent(key)}/output`, {
        query: { follow: 1 },
        resumeParam: 'since',
        cursorOf: (ev) => {
          try {
            const d = JSON.parse(ev.data);
            return d.cursor !== undefined ? d.cursor : ev.id;
          } catch {
            return ev.id;
          }
        },
        onEvent: (ev) => {
          const d = JSON.parse(ev.data);
          const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
          if (ev.event === 'output') pre.append(h('span', { class: d.stream === 'stderr' ? 'stderr' : null }, d.text));
          else if (ev.event === 'exit') pre.append(h('span', { class: 'muted' }, `\n[exited: ${d.outcome || ''} ${d.exit_code ?? ''}]\n`));
          if (atEnd) pre.scrollTop = pre.scrollHeight; // follow the output unless the user scrolled up
        },
      });
    }
    const kill = button('Kill', async () => {
      kill.disabled = true;
      try {
        await api('POST', `${base}/processes/${encodeURIComponent(key)}/kill`, { body: {} });
        loadProcs();
      } catch (e) {
        kill.disabled = false;
        procs.append(errorBox(e));
      }
    }, { kind: 'danger' });
    return h(
      'article',
      { class: 'proc' },
      h('header', null, h('code', null, p.command), ' ', h('span', { class: `badge ${p.running ? 'ok' : ''}` }, p.running ? 'running' : `ended${p.exit_code !== null && p.exit_code !== undefined ? ` (${p.exit_code})` : ''}`), ' ', h('span', { class: 'muted small' }, p.started ? fmtTime(p.started) : ''), p.running ? kill : ''),
      f.pre,
    );
  }

  loadProcs().then((has) => {
    if (has && alive) timer = setInterval(loadProcs, 3000);
  });

  return {
    destroy() {
      alive = false;
      if (ctl) ctl.abort();
      clearInterval(timer);
      for (const f of followers.values()) if (f.handle) f.handle.close();
    },
  };
}
