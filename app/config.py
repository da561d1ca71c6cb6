"""Settings, read from environment variables with the prefix CALIBD_."""

from __future__ import annotations

from datetime import timedelta
from functools import lru_cache
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, field_validator
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict

#: How a predictor is reached: the inference protocol over REST (http, https) or gRPC.
PREDICTOR_SCHEMES = ("http", "https", "grpc")


def check_predictor_url(url: str | None) -> str | None:
    """A predictor's URL: ``http(s)://host[:port][/prefix]`` (REST) or ``grpc://host:port`` (gRPC),
    without its trailing slash."""
    if url is None:
        return None
    try:
        parts = urlsplit(url)
        port = parts.port  # a port that is not a number raises here
    except ValueError:
        raise PydanticCustomError("predictor_url", "is not a URL") from None
    if parts.scheme not in PREDICTOR_SCHEMES:
        raise PydanticCustomError("predictor_url", "must be an http://, https:// or grpc:// URL")
    if not parts.hostname:
        raise PydanticCustomError("predictor_url", "must name the predictor's host")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise PydanticCustomError("predictor_url", "must have no query, fragment or credentials")
    if parts.scheme == "grpc" and (port is None or parts.path.strip("/")):
        raise PydanticCustomError("predictor_url", "a gRPC predictor is grpc://host:port, with no path")
    return url.rstrip("/")


class PredictorSetting(BaseModel):
    """A calibrator's upstream model server (transformer mode): its URL, the model's name there
    (default: the calibrator's), and the output to calibrate (default: CALIBD_PREDICTOR_OUTPUT)."""

    url: str = Field(max_length=2048, description="http(s)://host[:port][/prefix] (REST) or grpc://host:port (gRPC)")
    model: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,255}$",
        description="the model's name on the predictor (default: the calibrator's name)",
    )
    output: str | None = Field(
        default=None, min_length=1, max_length=256,
        description="the predictor's output to calibrate, probabilities or logits (default: CALIBD_PREDICTOR_OUTPUT)",
    )

    _url = field_validator("url")(check_predictor_url)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CALIBD_", extra="ignore")

    #: SQLAlchemy URL; PostgreSQL is ``postgresql+psycopg://user@host/db``.
    database_url: str = "sqlite:///./calibd.db"
    #: Largest request body accepted, in bytes; larger ones get 413 before they are read.
    max_body_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    #: Most scores one /calibrate request may carry.
    max_batch_scores: int = Field(default=1_000_000, gt=0)
    #: Most rows a holdout may have (methods may allow fewer; the error says which limit applies).
    max_holdout_rows: int = Field(default=5_000_000, gt=0)
    #: How often each process checks the database for promotions made by other processes.
    version_poll_seconds: float = Field(default=0.5, gt=0)
    #: Memory budget of the in-process cache of loaded calibrators, in bytes.
    calibrator_cache_bytes: int = Field(default=256 * 1024 * 1024, gt=0)

    #: Logs as JSON lines with request ids (false: leave logging to the host application).
    json_logs: bool = True
    log_level: str = "INFO"

    #: Worker processes that run fits (at lower priority); 0 fits in a thread of the serving process.
    fit_workers: int = Field(default=1, ge=0)
    #: A fit running longer than this is stopped (its worker is killed and replaced).
    fit_timeout_seconds: float = Field(default=600, gt=0)
    #: Where fit bodies of a megabyte or more wait for their worker (None: /dev/shm where
    #: writable, else the temporary directory); files a killed process left are removed at start.
    spool_dir: str | None = None

    #: How long a prediction logged by /calibrate (with ``ids``) can receive feedback by id
    #: (seconds, or ISO 8601 such as P7D).
    prediction_ttl: timedelta = timedelta(days=7)
    #: How long labelled feedback and the monitor sums are kept.
    feedback_retention: timedelta = timedelta(days=30)
    #: How long a label for an id not in the prediction log yet waits for its prediction (seconds);
    #: after that it is counted as unmatched and listed by GET /calibrators/{name}/unmatched-labels.
    pending_label_grace_seconds: float = Field(default=600, gt=0)
    #: How often each process joins pending labels whose prediction was written (by any process).
    pending_label_sweep_seconds: float = Field(default=1.0, gt=0)
    #: Logged predictions waiting to be written; beyond this they are dropped and counted.
    prediction_log_queue: int = Field(default=200_000, gt=0)
    #: A key registered with the admin scope at start (the compose stack's first key).
    bootstrap_admin_key: str | None = None
    #: Require a key with the read scope for /metrics (open by default, as Prometheus expects).
    metrics_require_key: bool = False
    #: How long a /metrics scrape waits for the monitors' database read (shared by all scrapers,
    #: at most one every 2 s); past it, the last values read are served. Also each statement's limit.
    metrics_timeout_seconds: float = Field(default=5, gt=0)
    #: How long /readyz waits for the database before it answers "not ready".
    readiness_timeout_seconds: float = Field(default=2, gt=0)

    #: Serve the inference protocol over gRPC on this port too (``calibd serve --grpc-port``); None: no gRPC.
    grpc_port: int | None = Field(default=None, ge=0, le=65535)
    #: The address the gRPC port listens on (``calibd serve`` sets it to its --host).
    grpc_host: str = "127.0.0.1"

    # Transformer mode: a calibrator's predictor is, first, the one stored with it (PUT
    # /calibrators/{name}/predictor, or "predictor" in its fit), then its entry in ``predictors``,
    # then ``predictor_url``. A /v2 infer request without ``scores`` is forwarded to it.
    #: The default predictor of every calibrator (``calibd serve --predictor``): an inference protocol
    #: server, http(s)://host:port (REST) or grpc://host:port (gRPC); the model is the calibrator's name.
    predictor_url: str | None = None
    #: The predictor's output that is calibrated (sklearn's under MLServer: predict_proba).
    predictor_output: str = "predict_proba"
    #: Per calibrator, a predictor, as JSON: {"name": {"url": ..., "model": ..., "output": ...}}
    #: (a predictor stored with the calibrator takes precedence).
    predictors: dict[str, PredictorSetting] = Field(default_factory=dict)
    #: Seconds a predictor may take to answer before the caller gets 504.
    predictor_timeout_seconds: float = Field(default=10, gt=0)
    #: Connections kept open to REST predictors, all together (requests beyond wait for one, within the
    #: timeout); a gRPC predictor has one channel, its requests multiplexed on one HTTP/2 connection.
    predictor_max_connections: int = Field(default=32, gt=0)

    _predictor_url = field_validator("predictor_url")(check_predictor_url)

    #: How often the closed-loop recalibration looks at calibrators with a policy.
    recalibration_interval_seconds: float = Field(default=30, gt=0)

    #: False-alarm probability of each version's drift test, over its whole life.
    monitor_alpha: float = Field(default=0.05, gt=0, lt=1)
    #: Calibration error the drift test tolerates, as a logit shift of the true probability.
    monitor_tolerance: float = Field(default=0.1, ge=0)


@lru_cache
def get_settings() -> Settings:
    return Settings()
