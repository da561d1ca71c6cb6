"""The ``calibd`` command: serve and migrate."""

from __future__ import annotations

import argparse
import sys

from . import __version__
from .config import get_settings


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .storage import migrate
    from .storage.db import make_engine

    settings = get_settings()
    engine = make_engine(settings.database_url)
    if engine.dialect.name == "sqlite":
        migrate.upgrade(engine)
    elif not migrate.is_at_head(engine):
        print(
            f"calibd: the database schema is at {migrate.current_revision(engine)}, "
            f"this calibd needs {migrate.head_revision()}; run `calibd migrate` first",
            file=sys.stderr,
        )
        return 1
    engine.dispose()
    print(f"calibd {__version__} on http://{args.host}:{args.port} (database: {engine.url.render_as_string()})", file=sys.stderr)
    uvicorn.run("app.main:create_app", factory=True, host=args.host, port=args.port, workers=args.workers, log_level="info")
    return 0


def _migrate(_args: argparse.Namespace) -> int:
    from .storage import migrate
    from .storage.db import make_engine

    engine = make_engine(get_settings().database_url)
    migrate.upgrade(engine)
    print(f"calibd: database at migration {migrate.current_revision(engine)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="calibd", description="The calibd calibration service.")
    parser.add_argument("--version", action="version", version=f"calibd {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve the HTTP API")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--workers", type=int, default=1)
    serve.set_defaults(handler=_serve)

    migrate = commands.add_parser("migrate", help="apply pending database migrations")
    migrate.set_defaults(handler=_migrate)

    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
