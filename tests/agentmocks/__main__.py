"""``python -m tests.agentmocks --port 8443 [--turns 20] [--ca-out ca.pem]``: serve the mock
providers (both APIs, HTTPS) on loopback for manual use, printing each request as it comes."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tests.agentmocks.script import session
from tests.agentmocks.server import MockProviders


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.agentmocks")
    ap.add_argument("--port", type=int, default=8443)
    ap.add_argument("--address", default="127.0.0.1")
    ap.add_argument("--turns", type=int, default=20, help="tool calls in the scripted session")
    ap.add_argument("--ca-out", type=Path, default=Path("agentmocks-ca.pem"), help="where to write the CA (PEM)")
    ap.add_argument("--plain", action="store_true", help="plain HTTP instead of HTTPS")
    args = ap.parse_args(argv)
    if args.turns < 0:
        ap.error("--turns: must be >= 0")
    mock = MockProviders(session(args.turns), address=args.address, port=args.port, tls=not args.plain).start()
    if not args.plain:
        args.ca_out.write_bytes(mock.ca_pem())
    print(f"mock providers on {mock.url} (CA: {args.ca_out})", file=sys.stderr)
    shown = 0
    try:
        while True:
            time.sleep(0.2)
            for seen in mock.seen[shown:]:
                print(f"{seen.method} {seen.path} key={'yes' if seen.key() else 'no'}", file=sys.stderr)
            shown = len(mock.seen)
    except KeyboardInterrupt:
        mock.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
