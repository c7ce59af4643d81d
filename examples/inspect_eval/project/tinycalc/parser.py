"""A recursive-descent parser for + - * / and parentheses over numbers."""

import re

from .ops import add, div, mul, sub

_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|(.))")
_OPS = {"+": add, "-": sub, "*": mul, "/": div}


def _tokens(text):
    for number, op in _TOKEN.findall(text):
        if number:
            yield float(number) if "." in number else int(number)
        elif op.strip():
            yield op


def evaluate(text):
    tokens = list(_tokens(text))
    value, rest = _expr(tokens)
    if rest:
        raise ValueError("unexpected %r" % (rest[0],))
    return value


def _expr(tokens):
    value, tokens = _term(tokens)
    while tokens and tokens[0] in ("+", "-"):
        op, (rhs, tokens) = tokens[0], _term(tokens[1:])
        value = _OPS[op](value, rhs)
    return value, tokens


def _term(tokens):
    value, tokens = _atom(tokens)
    while tokens and tokens[0] in ("*", "/"):
        op, (rhs, tokens) = tokens[0], _atom(tokens[1:])
        value = _OPS[op](value, rhs)
    return value, tokens


def _atom(tokens):
    if not tokens:
        raise ValueError("unexpected end of expression")
    head, rest = tokens[0], tokens[1:]
    if head == "(":
        value, rest = _expr(rest)
        if not rest or rest[0] != ")":
            raise ValueError("missing )")
        return value, rest[1:]
    if head == "-":
        value, rest = _atom(rest)
        return -value, rest
    if isinstance(head, (int, float)):
        return head, rest
    raise ValueError("unexpected %r" % (head,))
