"""A process's output kept within bounds: :class:`Capped` keeps the head and the tail of a
stream and counts what it dropped."""

import collections


class Capped(object):
    """Keeps the first and last ``cap/2`` bytes of a stream; memory stays bounded."""

    def __init__(self, cap):
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail = collections.deque()  # type: collections.deque
        self.tail_len = 0
        self.total = 0

    def add(self, chunk):
        self.total += len(chunk)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail.append(bytes(chunk))
            self.tail_len += len(chunk)
            # (a cap of 0 keeps nothing: the deque empties)
            while self.tail and self.tail_len - len(self.tail[0]) >= self.tail_cap:
                self.tail_len -= len(self.tail.popleft())

    def value(self):
        tail = b"".join(self.tail)
        if len(tail) > self.tail_cap:
            tail = tail[len(tail) - self.tail_cap :]
        kept = len(self.head) + len(tail)
        if kept >= self.total:
            return bytes(self.head) + tail, False
        marker = ("\n[... %d bytes omitted ...]\n" % (self.total - kept)).encode()
        return bytes(self.head) + marker + tail, True
