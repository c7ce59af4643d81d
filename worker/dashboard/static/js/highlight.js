// A small, line-by-line syntax highlighter for diff lines: comments, strings, numbers
// and keywords, chosen by the file's extension. It returns text nodes wrapped in spans
// (never HTML), so whatever a file holds stays text. One line at a time (a diff shows
// fragments, so a block comment or a string spanning lines is not tracked).

import { h } from './dom.js';

const KW = {
  py: 'False None True and as assert async await break class continue def del elif else except finally for from global if import in is lambda nonlocal not or pass raise return try while with yield match case self',
  js: 'async await break case catch class const continue debugger default delete do else export extends false finally for function if import in instanceof let new null return static super switch this throw true try typeof undefined var void while with yield of',
  go: 'break case chan const continue default defer else fallthrough for func go goto if import interface map package range return select struct switch type var nil true false',
  rs: 'as async await break const continue crate dyn else enum extern false fn for if impl in let loop match mod move mut pub ref return self Self static struct super trait true type unsafe use where while',
  c: 'auto break case char const continue default do double else enum extern float for goto if inline int long register return short signed sizeof static struct switch typedef union unsigned void volatile while bool true false NULL nullptr class public private protected namespace template typename new delete',
  sh: 'if then else elif fi for while until do done case esac in function return local export set unset echo exit',
  java: 'abstract boolean break byte case catch char class const continue default do double else enum extends final finally float for if implements import instanceof int interface long new package private protected public return short static super switch this throw throws try void while null true false',
};
const EXT = {
  py: 'py', pyi: 'py', js: 'js', mjs: 'js', cjs: 'js', ts: 'js', tsx: 'js', jsx: 'js', json: 'json',
  go: 'go', rs: 'rs', c: 'c', h: 'c', cc: 'c', cpp: 'c', hpp: 'c', cs: 'java', java: 'java', kt: 'java',
  sh: 'sh', bash: 'sh', zsh: 'sh', yaml: 'yaml', yml: 'yaml', toml: 'toml', ini: 'toml', cfg: 'toml',
  md: 'md', css: 'css', html: 'html', xml: 'html',
};
const HASH_COMMENT = new Set(['py', 'sh', 'yaml', 'toml']);
const SLASH_COMMENT = new Set(['js', 'go', 'rs', 'c', 'java', 'css', 'json']);

const cache = new Map();
function keywords(lang) {
  if (!cache.has(lang)) cache.set(lang, new Set((KW[lang] || '').split(' ').filter(Boolean)));
  return cache.get(lang);
}

/** The language of a path (by extension), or null. */
export function langOf(path) {
  if (!path) return null;
  const base = path.replace(/^"|"$/g, '').split('/').pop();
  if (base === 'Makefile' || base === 'Dockerfile') return 'sh';
  const dot = base.lastIndexOf('.');
  return dot > 0 ? EXT[base.slice(dot + 1).toLowerCase()] || null : null;
}

const TOKEN = /("(?:[^"\\]|\\.)*"?|'(?:[^'\\]|\\.)*'?|`(?:[^`\\]|\\.)*`?)|(\/\/.*|#.*|\/\*.*?(?:\*\/|$)|<!--.*?(?:-->|$))|(\b\d[\d_]*(?:\.\d+)?(?:[eE][+-]?\d+)?\b|\b0x[0-9a-fA-F]+\b)|([A-Za-z_$][\w$]*)/g;

/** Nodes for one line of code in ``lang`` (null: the text as is). */
export function highlight(text, lang) {
  if (!lang || text.length > 2000) return [text];
  const kws = keywords(lang);
  const out = [];
  let last = 0;
  TOKEN.lastIndex = 0;
  for (let m = TOKEN.exec(text); m; m = TOKEN.exec(text)) {
    let cls = null;
    if (m[1] !== undefined) cls = lang === 'md' ? null : 'tok-str';
    else if (m[2] !== undefined) {
      const hash = m[2][0] === '#';
      if ((hash && HASH_COMMENT.has(lang)) || (!hash && m[2][0] === '/' && SLASH_COMMENT.has(lang)) || m[2].startsWith('<!--')) cls = 'tok-com';
      else {
        // not a comment in this language: let the rest be tokenized
        TOKEN.lastIndex = m.index + 1;
        continue;
      }
    } else if (m[3] !== undefined) cls = 'tok-num';
    else if (m[4] !== undefined && kws.has(m[4])) cls = 'tok-kw';
    if (!cls) continue;
    if (m.index > last) out.push(text.slice(last, m.index));
    out.push(h('span', { class: cls }, m[0]));
    last = m.index + m[0].length;
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}
