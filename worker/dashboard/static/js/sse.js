// A Server-Sent Events parser over a fetch() body (the text/event-stream format of the
// HTML standard). Written here rather than vendored: it is forty lines, and EventSource
// itself cannot be used because it cannot send an Authorization header.

/**
 * Read ``body`` (a ReadableStream of bytes) to its end, calling onEvent({event, data, id})
 * for each dispatched event. Comments (": ping") are ignored.
 */
export async function readSSE(body, onEvent) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  let event = '';
  let data = [];
  let id = null;
  const dispatch = () => {
    if (data.length) onEvent({ event: event || 'message', data: data.join('\n'), id });
    event = '';
    data = [];
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += value;
    let start = 0;
    for (;;) {
      const m = /\r\n|\r|\n/g;
      m.lastIndex = start;
      const found = m.exec(buf);
      // A lone \r at the end of the buffer may be the first half of \r\n.
      if (!found || (found[0] === '\r' && found.index === buf.length - 1)) break;
      const line = buf.slice(start, found.index);
      start = found.index + found[0].length;
      if (line === '') {
        dispatch();
        continue;
      }
      if (line[0] === ':') continue;
      const colon = line.indexOf(':');
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? '' : line.slice(colon + 1);
      if (value[0] === ' ') value = value.slice(1);
      if (field === 'event') event = value;
      else if (field === 'data') data.push(value);
      else if (field === 'id' && !value.includes('\0')) id = value;
    }
    buf = buf.slice(start);
  }
}
