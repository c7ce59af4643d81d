// Code: a small notebook on the workspace's kernels. Pick a context (or the default one of
// Python), write code, Run (Ctrl+Enter): stdout and stderr arrive as the code prints them,
// then its results (charts, tables, text) and error, in a cell under the previous ones.
// The state lives in the kernel: a variable set in one cell is there in the next, as it is
// for the model's run_code calls in the same context. Each run is also in the timeline.
//
// Routes (the harness API over HTTP): GET/POST .../code/contexts, POST .../code/execute
// (NDJSON: stdout/stderr lines, results, then the execution).

import { ApiError, get, ndjson, post, ws } from '../api.js';
import { button, errorBox, fill, h, uiCallId } from '../dom.js';
import { outputPart, outputsView, partOfResult } from '../outputs.js';

const DEFAULT = ''; // the default context of the language
const DEFAULT_ID = 'ctx-python'; // its id (worker/kernels/contexts.py: default_context_id)

function statusLine(ex) {
  if (!ex) return h('p', { class: 'warning' }, 'The stream ended without the execution.');
  if (ex.outcome === 'ok') return h('p', { class: 'success muted small' }, `Done${ex.duration_ms ? ` in ${Math.round(ex.duration_ms)} ms` : ''}`);
  const what = ex.message || (ex.error ? `${ex.error.name}: ${ex.error.value}` : ex.outcome);
  return h('p', { class: ex.outcome === 'error' ? 'warning' : 'error' }, what);
}

export function codeView(panel, id) {
  let alive = true;
  let ctl = null;
  const base = ws(id);
  const context = h('select', { id: 'code-context', name: 'context' }, h('option', { value: DEFAULT }, 'default (python)'));
  const newCtx = button('New context', () => makeContext(), { kind: 'ghost' });
  const code = h('textarea', { id: 'code', name: 'code', rows: '5', spellcheck: 'false', autocomplete: 'off', placeholder: 'e.g. import math; math.pi' });
  const timeout = h('input', { id: 'code-timeout', name: 'timeout', type: 'number', min: '1', max: '300', value: '60', inputmode: 'numeric' });
  const runBtn = h('button', { type: 'submit', class: 'primary' }, 'Run');
  const note = h('p', { class: 'muted small' });
  const form = h(
    'form',
    { class: 'card run', 'aria-label': 'Run code' },
    h('div', { class: 'row' }, h('label', { for: 'code-context' }, 'Context'), context, newCtx),
    h('label', { for: 'code' }, 'Code (runs in the context\'s kernel, which keeps its state; Ctrl+Enter runs it)'),
    code,
    h('div', { class: 'row' }, h('label', { for: 'code-timeout' }, 'Timeout (s)'), timeout, h('span', { class: 'spacer' }), runBtn),
    note,
  );
  const cells = h('div', { class: 'cells', 'aria-live': 'polite' });
  fill(panel, form, cells);

  async function loadContexts(select) {
    let r;
    try {
      r = await get(`${base}/code/contexts`);
    } catch (e) {
      if (e instanceof ApiError && (e.status === 404 || e.status === 405)) note.textContent = 'This service has no code contexts to list.';
      else if (alive) note.textContent = `Contexts: ${e.message}`;
      return;
    }
    if (!alive) return;
    const list = (r.contexts || []).filter((c) => c.id !== DEFAULT_ID); // (the first option)
    fill(context, h('option', { value: DEFAULT }, 'default (python)'), list.map((c) => h('option', { value: c.id }, `${c.id} (${c.language}${c.running === false ? ', stopped' : ''})`)));
    if (select) context.value = select;
  }

  async function makeContext() {
    newCtx.disabled = true;
    try {
      const c = await post(`${base}/code/contexts`, { language: 'python' });
      await loadContexts(c.id);
    } catch (e) {
      note.textContent = `New context: ${e.message}`;
    } finally {
      newCtx.disabled = false;
    }
  }

  code.addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && (ev.ctrlKey || ev.metaKey)) {
      ev.preventDefault();
      form.requestSubmit();
    }
  });

  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const source = code.value;
    if (!source.trim() || ctl) return;
    const prompt = h('span', { class: 'out-prompt' }, 'In [ ]:');
    const outputs = outputsView([]);
    const status = h('div', { class: 'cell-status' }, h('p', { class: 'muted small loading', role: 'status' }, 'Running…'));
    const cell = h('article', { class: 'card cell' }, h('div', { class: 'cell-in' }, prompt, h('pre', { class: 'cell-code' }, source)), outputs, status);
    cells.append(cell);
    runBtn.disabled = true;
    ctl = new AbortController();
    const body = { code: source, timeout: Number(timeout.value) || 60, call_id: uiCallId('code') };
    if (context.value) body.context = context.value;
    else body.language = 'python';
    let execution = null;
    let stream = null; // the <pre> the current stream's text goes to
    let streamKind = null;
    try {
      await ndjson(`${base}/code/execute`, {
        body,
        signal: ctl.signal,
        onLine: (ev) => {
          if (ev.type === 'stdout' || ev.type === 'stderr') {
            if (!stream || streamKind !== ev.type) {
              stream = outputPart({ kind: ev.type, text: '' });
              streamKind = ev.type;
              outputs.append(stream);
            }
            stream.append(ev.text);
          } else if (ev.type === 'result') {
            stream = null;
            const el = outputPart(partOfResult(ev), null);
            if (el) outputs.append(el);
          } else if (ev.type === 'execution') {
            execution = ev;
          } else if (ev.type === 'error') {
            outputs.append(errorBox(ev.detail || `HTTP ${ev.status}`)); // the route's own failure, mid-stream
          }
        },
      });
      if (!alive) return;
      if (execution) {
        prompt.textContent = `In [${execution.execution_count ?? ' '}]:`;
        for (const p of outputs.querySelectorAll('.out-prompt')) p.textContent = `Out[${execution.execution_count ?? ''}]:`;
        if (execution.error) outputs.append(outputPart({ kind: 'error', ...execution.error }));
      }
      fill(status, statusLine(execution));
      code.select();
    } catch (e) {
      if (alive) fill(status, e.name === 'AbortError' ? h('p', { class: 'muted' }, 'Stopped watching.') : errorBox(e));
    } finally {
      runBtn.disabled = false;
      ctl = null;
    }
  });

  loadContexts();
  return {
    destroy() {
      alive = false;
      if (ctl) ctl.abort();
    },
  };
}
