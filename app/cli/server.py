"""The commands that run the service or act on its database: serve, migrate, keys."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from .. import __version__

#: What the server's commands import; the base install (the client) has none of them, so this
#: module imports them only inside the commands.
SERVER_MODULES = ("fastapi", "uvicorn", "pydantic_settings", "sqlalchemy", "alembic", "scipy", "sklearn",
                  "prometheus_client")


def missing_server_modules() -> list[str]:
    """The server's modules this environment lacks: empty where calibd[server] is installed."""
    from importlib.util import find_spec

    return [name for name in SERVER_MODULES if find_spec(name) is None]


def server_command(handler):
    """Run a server command (serve, migrate, keys, consume): with the client-only install, one line
    saying what to install instead of a traceback."""

    def run(args: argparse.Namespace) -> int:
        missing = missing_server_modules()
        if missing:
            print(f"calibd: `calibd {args.command}` needs the server: pip install 'calibd[server]' "
                  f"(missing: {', '.join(missing)})", file=sys.stderr)
            return 2
        return handler(args)

    return run


def database_error(engine, error: Exception) -> str:
    """One line for a database that cannot be reached at start: where, and the driver's first line."""
    original = getattr(error, "orig", None) or error
    reason = next((line.strip() for line in str(original).splitlines() if line.strip()), type(original).__name__)
    return f"calibd: cannot reach the database {engine.url.render_as_string()}: {reason}"


def _serve(args: argparse.Namespace) -> int:
    import sqlalchemy.exc

    from ..storage.db import make_engine
    from ..config import get_settings

    engine = make_engine(get_settings().database_url)
    try:
        return _serve_on(args, engine)
    except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError, sqlalchemy.exc.TimeoutError) as error:
        print(database_error(engine, error), file=sys.stderr)  # one line, not a traceback
        return 1


def _serve_on(args: argparse.Namespace, engine) -> int:
    import uvicorn

    from ..config import check_predictor_url, get_settings
    from ..storage import migrate

    settings = get_settings()
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
    predictor = args.predictor or (f"http://{args.predictor_host}" if args.predictor_host else None)
    if predictor:  # transformer mode's default predictor, read by every worker's app
        try:
            check_predictor_url(predictor)
        except ValueError as error:
            print(f"calibd: --predictor {predictor}: {error}", file=sys.stderr)
            return 2
        os.environ["CALIBD_PREDICTOR_URL"] = predictor
        get_settings.cache_clear()
        print(f"calibd: transformer mode: /v2 infer requests without scores go to {predictor}", file=sys.stderr)
    if args.grpc_port is not None:  # read by every worker's app (each binds it, with SO_REUSEPORT)
        os.environ["CALIBD_GRPC_PORT"] = str(args.grpc_port)
        os.environ["CALIBD_GRPC_HOST"] = host
        get_settings.cache_clear()
        print(f"calibd: the inference protocol over gRPC on {host}:{args.grpc_port}", file=sys.stderr)
    if args.workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # Each worker writes its counters to files here, and /metrics adds them up.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="calibd-metrics-")
    print(f"calibd {__version__} on http://{host}:{args.port} (database: {engine.url.render_as_string()})", file=sys.stderr)
    _flush_logs_on_sigterm()
    from .serving import TimedHTTPProtocol

    uvicorn.run(
        "calibd.main:create_app",
        factory=True,
        host=host,
        port=args.port,
        http=TimedHTTPProtocol,  # uvicorn's, with header and body read timeouts
        workers=args.workers,
        log_config=None,  # calibd.main configures JSON logs in every worker
        access_log=False,
    )
    return 0


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _flush_logs_on_sigterm() -> None:
    """After a graceful shutdown uvicorn raises the signal that started it again, under the
    handler it found; this one writes the log lines still queued before the process ends as
    SIGTERM ends it."""
    import signal

    from ..api.logs import flush_logs

    def flush_and_terminate(signum, frame) -> None:
        flush_logs()
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)

    signal.signal(signal.SIGTERM, flush_and_terminate)


def _any_keys(engine) -> bool:
    from sqlalchemy import text

    with engine.connect() as connection:
        return connection.execute(text("SELECT count(*) FROM api_keys")).scalar_one() > 0


def _sessions():
    from ..storage.db import make_engine, make_sessionmaker

    from ..config import get_settings

    return make_sessionmaker(make_engine(get_settings().database_url))


def _parse_duration(text: str):
    from datetime import timedelta

    units = {"d": "days", "h": "hours", "m": "minutes"}
    if not text or text[-1] not in units:
        raise argparse.ArgumentTypeError("durations look like 30d, 12h or 90m")
    try:
        duration = timedelta(**{units[text[-1]]: float(text[:-1])})
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError("durations look like 30d, 12h or 90m, up to 36500d") from None
    if not timedelta(0) < duration <= timedelta(days=36_500):
        raise argparse.ArgumentTypeError("a key lives more than no time and at most 36500d (100 years)")
    return duration


def _keys_create(args: argparse.Namespace) -> int:
    from ..storage import keys
    from ..storage.models import utcnow

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
    from ..storage import keys
    from ..storage.models import utcnow

    now = utcnow()
    print(f"{'KEY ID':<10} {'SCOPES':<28} {'CREATED':<17} {'EXPIRES':<17} STATE  DESCRIPTION")
    for info in keys.list_keys(_sessions()):
        state = "active" if info.active(now) else ("revoked" if info.revoked_at else "expired")
        expires = f"{info.expires_at:%Y-%m-%d %H:%M}" if info.expires_at else "never"
        print(f"{info.key_id:<10} {','.join(info.scopes):<28} {info.created_at:%Y-%m-%d %H:%M} {expires:<17} {state:<6} {info.description}")
    return 0


def _keys_revoke(args: argparse.Namespace) -> int:
    from ..storage import keys

    try:
        keys.revoke_key(_sessions(), args.key_id)
    except keys.KeyNotFound:
        print(f"calibd: no API key with id {args.key_id!r}", file=sys.stderr)
        return 1
    print(f"revoked {args.key_id}", file=sys.stderr)
    return 0


def _migrate(_args: argparse.Namespace) -> int:
    import sqlalchemy.exc

    from ..storage import migrate
    from ..storage.db import make_engine

    from ..config import get_settings

    engine = make_engine(get_settings().database_url)
    try:
        migrate.upgrade(engine)
    except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError) as error:
        print(database_error(engine, error), file=sys.stderr)
        return 1
    print(f"calibd: database at migration {migrate.current_revision(engine)}")
    return 0



def add_server_commands(commands) -> None:
    """serve, migrate and keys: the commands that run the service or act on its database."""
    serve = commands.add_parser("serve", help="serve the HTTP API",
                                description="Serve the HTTP API. Settings come from CALIBD_* environment variables "
                                "(README: Configuration); CALIBD_DATABASE_URL defaults to ./calibd.db (SQLite).")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (another than loopback needs an API key: calibd keys create)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on")
    serve.add_argument("--workers", type=int, default=1, help="serving processes (each with its own fit workers)")
    serve.add_argument("--grpc-port", type=int, metavar="PORT",
                       help="also serve the inference protocol (KServe v2) over gRPC on this port, in the same processes")
    serve.add_argument("--predictor", metavar="URL",
                       help="transformer mode: the inference protocol server whose model outputs calibd calibrates, "
                       "http(s)://host:port (REST) or grpc://host:port (gRPC): the default of calibrators with no "
                       "predictor stored with them (calibd predictor NAME --set URL) nor in CALIBD_PREDICTORS")
    # The arguments KServe gives a transformer container: the predictor's host:port; the model's name
    # (calibd serves each calibrator under its own); the port to listen on.
    serve.add_argument("--predictor_host", help=argparse.SUPPRESS)
    serve.add_argument("--model_name", help=argparse.SUPPRESS)
    serve.add_argument("--http_port", dest="port", type=int, help=argparse.SUPPRESS)
    serve.set_defaults(handler=server_command(_serve))

    migrate = commands.add_parser("migrate", help="apply pending database migrations")
    migrate.set_defaults(handler=server_command(_migrate))

    keys = commands.add_parser("keys", help="manage API keys").add_subparsers(dest="keys_command", required=True)
    create = keys.add_parser("create", help="create a key and print it (once)")
    create.add_argument("--scope", action="append", required=True, choices=["admin", "calibrate", "feedback", "read"],
                        help="what the key may do; repeat for several scopes")
    create.add_argument("--expires", type=_parse_duration, help="lifetime such as 30d, 12h or 90m (default: never)")
    create.add_argument("--description", default="", help="a note to tell keys apart (default: empty)")
    create.set_defaults(handler=server_command(_keys_create))
    keys.add_parser("list", help="list keys (never the keys themselves)").set_defaults(handler=server_command(_keys_list))
    revoke = keys.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("key_id", help="the key's id, as calibd keys list shows it")
    revoke.set_defaults(handler=server_command(_keys_revoke))
