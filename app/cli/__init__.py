"""The ``calibd`` command: serve, migrate and keys (on the database), and the client commands.

The client commands (fit, calibrate, evaluate, report, export, import, list) talk to a running
calibd over HTTP through ``calibd.client``: CALIBD_URL (default http://127.0.0.1:8000) and
CALIBD_API_KEY. They print results to stdout, progress to stderr, and on error one line on
stderr with a non-zero exit status: 1 for an error answered by calibd, 2 for a bad command
line or input file, 3 when calibd cannot be reached or is unavailable.
"""

from __future__ import annotations

import argparse

from .. import __version__
from .client_commands import add_client_commands
from .server import add_server_commands
from ..streams.cli import add_consume_command


class HelpFormatter(argparse.HelpFormatter):
    """Says each option's default in its help, unless the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unset = action.default is None or action.default is argparse.SUPPRESS or isinstance(action.default, bool)
        if "default" in text or unset or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def with_defaults_shown(parser: argparse.ArgumentParser) -> None:
    """Use HelpFormatter for the parser and every subcommand's parser."""
    parser.formatter_class = HelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                with_defaults_shown(child)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="calibd", description="The calibd calibration service.")
    parser.add_argument("--version", action="version", version=f"calibd {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    add_server_commands(commands)
    add_client_commands(commands)
    add_consume_command(commands)
    with_defaults_shown(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)
