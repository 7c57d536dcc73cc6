"""Sandbox commands of the `coding-env` CLI: `build-image` and `sandbox reap`.

`env_server/cli.py` calls `register` on its sub-parsers; `python -m sandbox.cli` runs them alone.
"""

from __future__ import annotations

import argparse
import logging


def _build_image(args: argparse.Namespace) -> int:
    from sandbox.image import build_image  # imported on use: it needs the docker SDK

    # --offline forces the rootfs path; without it the registry is tried first.
    print(build_image(offline=True if args.offline else None, if_missing=args.if_missing))
    return 0


def _reap(args: argparse.Namespace) -> int:
    from sandbox.docker_backend import reap_orphans

    removed = reap_orphans(all_owners=args.all, older_than_s=args.older_than)
    print(f"removed {len(removed)} sandbox container(s)")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `build-image` and `sandbox reap`; each sets `func(args) -> exit code`."""
    build = subparsers.add_parser("build-image", help="build the sandbox image coding-env-sandbox:latest")
    build.add_argument("--offline", action="store_true", help="build on a debootstrap rootfs (no registry needed)")
    build.add_argument("--if-missing", action="store_true", help="do nothing when the image exists and was built from this checkout's Dockerfile")
    build.set_defaults(func=_build_image)

    sandbox = subparsers.add_parser("sandbox", help="manage sandbox containers")
    actions = sandbox.add_subparsers(dest="sandbox_command", required=True)
    reap = actions.add_parser("reap", help="remove sandbox containers left by processes that are gone")
    reap.add_argument("--all", action="store_true", help="also remove containers of live owners")
    reap.add_argument("--older-than", type=float, default=0.0, metavar="SECONDS", help="only containers older than this")
    reap.set_defaults(func=_reap)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox.cli")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
