// What an execution of code showed: a run_code call's `outputs` in the call journal
// (worker/calls/outputs.py), or the events of the code route's NDJSON stream. Nothing the
// code produced reaches the page as markup or script:
//   - text (stdout, stderr, text/plain, Markdown, LaTeX, JSON, tracebacks) as text nodes;
//   - images as data: URLs of an image type (PNG, JPEG, GIF, WebP, SVG: an SVG in an <img>
//     runs no script), only when the data is base64;
//   - HTML in an <iframe sandbox=""> (srcdoc): no scripts, no forms, an opaque origin, and
//     the page's own CSP inherited (no inline script or style either).

import { h } from './dom.js';

const IMAGE_TYPES = new Set(['image/png', 'image/jpeg', 'image/gif', 'image/webp', 'image/svg+xml']);
const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

/** An <img> of base64 ``data`` of an image type, or null for anything else. */
export function imageOf(mime, data, { width, height, alt } = {}) {
  if (!IMAGE_TYPES.has(mime) || typeof data !== 'string' || !BASE64.test(data)) return null;
  const attrs = { class: 'out-image', src: `data:${mime};base64,${data}`, alt: alt || mime, decoding: 'async' };
  if (Number.isInteger(width) && Number.isInteger(height) && width > 0 && height > 0) Object.assign(attrs, { width, height });
  return h('img', attrs);
}

// Left out of an HTML result before it is framed, as text (parsing it here would apply
// them to this page's CSP check): <script> and <style> elements, style="..." and on...=
// attributes. The frame would refuse them anyway (no scripts in a sandbox; the page's CSP,
// which a srcdoc frame inherits, refuses inline styles), but each refusal is an error in
// the console (a pandas table brings a <style> and style attributes). What protects the
// page is the sandbox and the CSP, not this.
const ELEMENTS = /<(script|style)\b[\s\S]*?(<\/\1\s*>|$)/gi;
const TAG = /<[a-zA-Z][^>]*>/g;
const ATTRS = /\s(?:style|on[a-z]+)\s*=\s*(?:"[^"]*"|'[^']*'|[^\s>]+)/gi;

/** ``html`` without what the frame would refuse, and how tall it is, roughly (a frame
 * without scripts cannot be measured). */
function framed(html) {
  const text = html.replace(ELEMENTS, '').replace(TAG, (tag) => tag.replace(ATTRS, ''));
  const lines = (text.match(/<(tr|p|li|br|h[1-6]|div|pre)\b/gi) || []).length;
  return [text, lines <= 4 ? 'short' : lines <= 12 ? 'medium' : 'tall'];
}

/** HTML shown in a sandboxed frame: no script of it runs, nothing of it reaches the page. */
export function htmlFrame(html) {
  const [doc, size] = framed(html);
  return h('iframe', { class: `out-html ${size}`, sandbox: '', srcdoc: doc, title: 'HTML output', referrerpolicy: 'no-referrer' });
}

/** Base64 of a string's UTF-8 (an SVG for a data: URL). */
function utf8Base64(text) {
  const bytes = new TextEncoder().encode(text);
  let bin = '';
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(bin);
}

function textBlock(text, cls) {
  return h('pre', { class: `out-text ${cls || ''}`.trim() }, text);
}

function resultPart(o, count) {
  const label = o.main ? h('span', { class: 'out-prompt' }, count !== null && count !== undefined ? `Out[${count}]:` : 'Out:') : null;
  let body = null;
  if (o.data !== undefined && o.data !== null) {
    body = imageOf(o.mime_type, o.data, { width: o.width, height: o.height, alt: o.text || o.mime_type });
  }
  if (!body && o.mime_type === 'text/html') body = htmlFrame(o.text || '');
  if (!body) body = textBlock(o.text || '', o.mime_type === 'text/plain' ? '' : 'rich');
  return h('div', { class: 'out-result', dataset: { mime: o.mime_type || '' } }, label, body);
}

/** One part of a record's ``outputs`` as an element. */
export function outputPart(o, count) {
  switch (o.kind) {
    case 'stdout':
      return textBlock(o.text, 'stdout');
    case 'stderr':
      return textBlock(o.text, 'stderr');
    case 'error':
      return textBlock(o.traceback || `${o.name}: ${o.value}`, 'error-text out-error');
    case 'note':
      return h('p', { class: 'muted small out-note' }, o.text);
    case 'result':
      return resultPart(o, count);
    default:
      return null;
  }
}

/** A box with every part of ``outputs`` in order (``count``: the execution's In/Out number). */
export function outputsView(outputs, count) {
  const box = h('div', { class: 'outputs' });
  for (const o of outputs || []) {
    const el = outputPart(o, count);
    if (el) box.append(el);
  }
  return box;
}

/**
 * A Result of the code route's stream ({type: 'result', text, html, png, ...}) as an
 * ``outputs`` part, in its richest format (as worker/calls/outputs.py picks it).
 */
export function partOfResult(r) {
  const main = !!r.is_main_result;
  const text = typeof r.text === 'string' ? r.text : '';
  for (const [field, mime] of [['png', 'image/png'], ['jpeg', 'image/jpeg']]) {
    if (typeof r[field] === 'string' && r[field]) return { kind: 'result', main, mime_type: mime, data: r[field].replace(/\s+/g, ''), text };
  }
  if (typeof r.svg === 'string' && r.svg) return { kind: 'result', main, mime_type: 'image/svg+xml', data: utf8Base64(r.svg), text };
  if (typeof r.html === 'string' && r.html) return { kind: 'result', main, mime_type: 'text/html', text: r.html };
  if (typeof r.markdown === 'string' && r.markdown) return { kind: 'result', main, mime_type: 'text/markdown', text: r.markdown };
  if (typeof r.latex === 'string' && r.latex) return { kind: 'result', main, mime_type: 'text/latex', text: r.latex };
  if (r.json !== undefined && r.json !== null) return { kind: 'result', main, mime_type: 'application/json', text: JSON.stringify(r.json, null, 1) };
  return { kind: 'result', main, mime_type: 'text/plain', text };
}
