"""``loom-worker cluster status|metrics|gc --ray ADDRESS``: a Ray cluster's nodes, slots and
workspaces (docs/ray.md). The Ray integration is loaded by its entry point only when a
command runs (:mod:`worker.plugins`): without the ``ray`` extra the command says what to
install."""

from __future__ import annotations

import argparse
import sys
from typing import Any

DEFAULT_NAMESPACE = "loom"  # worker.integrations.ray.names.DEFAULT_NAMESPACE, not imported


def add_ray_options(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        required=required,
        help="The Ray cluster (ray.init's address: auto, HOST:PORT, ray://HOST:PORT); needs loom-worker[ray].",
    )
    parser.add_argument(
        "--ray-namespace",
        default=DEFAULT_NAMESPACE,
        metavar="NAME",
        help=f"The Ray namespace of loom's actors (default {DEFAULT_NAMESPACE}; the same for every driver).",
    )


def ray_integration(prog: str) -> Any:
    """The integration's command side, or None after saying why it is missing."""
    from ..plugins import IntegrationUnavailable, integration

    try:
        return integration("ray")
    except IntegrationUnavailable as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return None


def _run(args: argparse.Namespace, _settings: Any) -> int:
    ray_cli = ray_integration("loom-worker cluster")
    if ray_cli is None:
        return 2
    return int(ray_cli.cluster_command(args.action, args.ray, args.ray_namespace, args.json))


def register(sub: Any) -> None:
    cluster = sub.add_parser("cluster", help="A Ray cluster's nodes, slots and workspaces (loom-worker[ray]).")
    actions = cluster.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, text in (
        ("status", "Nodes, alive, slots used/free, workspaces per node, versions."),
        ("metrics", "Each node's numbers: workspaces, sandboxes open, restarts, tunnels."),
        ("gc", "loom-worker gc on every node (exited sandboxes, vanished workspaces)."),
    ):
        p = actions.add_parser(
            name, help=text, epilog="Exit status: 0 ok; 1 the cluster cannot be reached or a node failed; 2 usage."
        )
        add_ray_options(p, required=True)
        p.add_argument("--json", action="store_true", help="Print JSON.")
        p.set_defaults(func=_run, own_settings=True, own_logging=True)
