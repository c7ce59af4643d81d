// Sign in with the API token. The token is checked against the service before it is
// kept (sessionStorage: this browser tab only).

import { ApiError, api, auth } from '../api.js';
import { fill, h } from '../dom.js';

export function signIn(main, message, onDone) {
  const input = h('input', {
    id: 'token',
    name: 'token',
    type: 'password',
    autocomplete: 'current-password',
    required: true,
    spellcheck: 'false',
  });
  const status = h('p', { class: message ? 'muted' : 'muted hidden', role: 'status' }, message || '');
  const error = h('p', { class: 'error hidden', role: 'alert', id: 'signin-error' });
  const submit = h('button', { type: 'submit', class: 'primary' }, 'Sign in');
  const form = h(
    'form',
    { class: 'card signin', 'aria-labelledby': 'signin-title' },
    h('h1', { id: 'signin-title' }, 'Sign in'),
    h('p', { class: 'muted' }, 'This service needs its API token (LOOM_API_TOKEN). It is kept for this browser tab only.'),
    status,
    h('label', { for: 'token' }, 'API token'),
    input,
    error,
    h('div', { class: 'actions' }, submit),
  );
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const token = input.value.trim();
    error.classList.add('hidden');
    if (!token) return;
    submit.disabled = true;
    try {
      await api('GET', '/v1/workspaces', { token });
      auth.set(token);
      onDone('token');
    } catch (e) {
      error.textContent =
        e instanceof ApiError && e.status === 401 ? 'That token was refused.' : `Cannot sign in: ${e.message}`;
      error.classList.remove('hidden');
      input.setAttribute('aria-describedby', 'signin-error');
      input.select();
    } finally {
      submit.disabled = false;
    }
  });
  fill(main, form);
  input.focus();
  return { destroy() {} };
}
