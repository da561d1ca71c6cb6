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
    host = args.host
    if not settings.bootstrap_admin_key and not _any_keys(engine) and host not in LOOPBACK:
        print(
            f"calibd: no API keys exist, so auth is off; listening on 127.0.0.1 instead of {host}. "
            "Create a key (calibd keys create --scope admin) to serve other hosts.",
            file=sys.stderr,
        )
        host = "127.0.0.1"
    elif not settings.bootstrap_admin_key and not _any_keys(engine):
        print("calibd: no API keys exist: auth is off (loopback only)", file=sys.stderr)
    engine.dispose()
    print(f"calibd {__version__} on http://{host}:{args.port} (database: {engine.url.render_as_string()})", file=sys.stderr)
    uvicorn.run(
        "app.main:create_app",
        factory=True,
        host=host,
        port=args.port,
        workers=args.workers,
        log_config=None,  # app.main configures JSON logs in every worker
        access_log=False,
    )
    return 0


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _any_keys(engine) -> bool:
    from sqlalchemy import text

    with engine.connect() as connection:
        return connection.execute(text("SELECT count(*) FROM api_keys")).scalar_one() > 0


def _sessions():
    from .storage.db import make_engine, make_sessionmaker

    return make_sessionmaker(make_engine(get_settings().database_url))


def _parse_duration(text: str):
    from datetime import timedelta

    units = {"d": "days", "h": "hours", "m": "minutes"}
    if not text or text[-1] not in units:
        raise argparse.ArgumentTypeError("durations look like 30d, 12h or 90m")
    try:
        return timedelta(**{units[text[-1]]: float(text[:-1])})
    except ValueError:
        raise argparse.ArgumentTypeError("durations look like 30d, 12h or 90m") from None


def _keys_create(args: argparse.Namespace) -> int:
    from .storage import keys
    from .storage.models import utcnow

    expires = utcnow() + args.expires if args.expires else None
    try:
        key, info = keys.create_key(_sessions(), args.scope, expires, args.description)
    except ValueError as error:
        print(f"calibd: {error}", file=sys.stderr)
        return 2
    print(key)
    print(
        f"key id {info.key_id}, scopes {', '.join(info.scopes)}"
        + (f", expires {info.expires_at:%Y-%m-%d %H:%M} UTC" if info.expires_at else "")
        + ". The key is shown only now.",
        file=sys.stderr,
    )
    return 0


def _keys_list(_args: argparse.Namespace) -> int:
    from .storage import keys
    from .storage.models import utcnow

    now = utcnow()
    print(f"{'KEY ID':<10} {'SCOPES':<28} {'CREATED':<17} {'EXPIRES':<17} STATE  DESCRIPTION")
    for info in keys.list_keys(_sessions()):
        state = "active" if info.active(now) else ("revoked" if info.revoked_at else "expired")
        expires = f"{info.expires_at:%Y-%m-%d %H:%M}" if info.expires_at else "never"
        print(f"{info.key_id:<10} {','.join(info.scopes):<28} {info.created_at:%Y-%m-%d %H:%M} {expires:<17} {state:<6} {info.description}")
    return 0


def _keys_revoke(args: argparse.Namespace) -> int:
    from .storage import keys

    try:
        keys.revoke_key(_sessions(), args.key_id)
    except keys.KeyNotFound:
        print(f"calibd: no API key with id {args.key_id!r}", file=sys.stderr)
        return 1
    print(f"revoked {args.key_id}", file=sys.stderr)
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

    keys = commands.add_parser("keys", help="manage API keys").add_subparsers(dest="keys_command", required=True)
    create = keys.add_parser("create", help="create a key and print it (once)")
    create.add_argument("--scope", action="append", required=True, choices=["admin", "calibrate", "feedback", "read"])
    create.add_argument("--expires", type=_parse_duration, help="lifetime such as 30d, 12h or 90m (default: never)")
    create.add_argument("--description", default="")
    create.set_defaults(handler=_keys_create)
    keys.add_parser("list", help="list keys (never the keys themselves)").set_defaults(handler=_keys_list)
    revoke = keys.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("key_id")
    revoke.set_defaults(handler=_keys_revoke)

    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
