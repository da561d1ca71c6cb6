"""Settings, read from environment variables with the prefix CALIBD_."""

from __future__ import annotations

from datetime import timedelta
from functools import lru_cache

from pydantic import BaseModel, Field, field_validator
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict

from .predictor_urls import SCHEMES, AllowList, PredictorUrlError, check_url

#: How a predictor is reached: the inference protocol over REST (http, https) or gRPC.
PREDICTOR_SCHEMES = SCHEMES


def check_predictor_url(url: str | None) -> str | None:
    """A predictor's URL: ``http(s)://host[:port][/prefix]`` (REST) or ``grpc://host:port`` (gRPC),
    without its trailing slash (the rules: predictor_urls.py)."""
    if url is None:
        return None
    try:
        return check_url(url)
    except PredictorUrlError as error:
        raise PydanticCustomError("predictor_url", "{reason}", {"reason": str(error)}) from None


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
    #: Most rows one /feedback request may carry (JSON arrays, table rows), counted before parsing.
    max_feedback_rows: int = Field(default=100_000, gt=0)
    #: Most bytes the arrays of one uploaded table or archive (Arrow, Parquet, .npz) may take once
    #: decompressed; checked from the file's metadata before anything is decompressed.
    max_decoded_bytes: int = Field(default=1024 * 1024 * 1024, gt=0)
    #: A client has this long to send a request's headers (from its connection, or from the end of the
    #: previous answer), else the connection gets 408 and is closed (``calibd serve``).
    header_timeout_seconds: float = Field(default=10, gt=0)
    #: A request body that stops arriving for this long is abandoned and its connection closed.
    body_timeout_seconds: float = Field(default=30, gt=0)
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
    #: How often predictions past their calibrator's label window are fed to the monitors.
    label_maturity_seconds: float = Field(default=1.0, gt=0)
    #: Logged predictions waiting to be written; beyond this they are dropped and counted.
    prediction_log_queue: int = Field(default=200_000, gt=0)
    #: POST /cloudevents: inference request and response halves waiting for their other half, per
    #: process; beyond this (or older than cloudevents_pair_seconds) the oldest is dropped and counted.
    cloudevents_max_unpaired: int = Field(default=100_000, gt=0)
    cloudevents_pair_seconds: float = Field(default=300, gt=0)
    #: A half unpaired in a process for this long is written to the database, where its other half,
    #: if it reached another process (replica or worker), pairs with it. 0: pairs only in a process.
    cloudevents_share_seconds: float = Field(default=5, ge=0)
    #: A key registered with the admin scope at start (the compose stack's first key).
    bootstrap_admin_key: str | None = None
    #: Require a key with the read scope for /metrics (open by default, as Prometheus expects).
    metrics_require_key: bool = False
    #: How often each process adds its pending request metrics to the Prometheus ones (api/pending_metrics.py):
    #: with several workers, a scrape sees another worker's requests at most this much later.
    metrics_flush_seconds: float = Field(default=1.0, gt=0)
    #: How long a /metrics scrape waits for the monitors' database read (one read at most every 2 s,
    #: shared by all scrapers, on a connection of its own); past it, the last values are served.
    metrics_timeout_seconds: float = Field(default=5, gt=0)
    #: How long /readyz waits for the database (its own connection) before it answers not ready.
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

    #: The predictors calibd may connect to: host names, IP addresses and CIDR networks, each with an
    #: optional port, separated by commas ("models.internal:8080, 10.0.0.0/8, 127.0.0.1:8081"). Empty:
    #: none but CALIBD_PREDICTOR_URL's and CALIBD_PREDICTORS' own. Loopback and link-local addresses
    #: need an entry inside their ranges (docs/transformer.md).
    predictor_allow: str = ""
    #: The largest answer a predictor may give, in bytes (REST: headers and body; gRPC: its message);
    #: a larger one is cut off and the caller gets 502.
    predictor_max_answer_bytes: int = Field(default=64 * 1024 * 1024, gt=0)

    _predictor_url = field_validator("predictor_url")(check_predictor_url)

    @field_validator("predictor_allow")
    @classmethod
    def _check_allow(cls, value: str) -> str:
        try:
            AllowList.parse(value)
        except PredictorUrlError as error:
            raise PydanticCustomError("predictor_allow", "{reason}", {"reason": str(error)}) from None
        return value

    def allowed_predictors(self) -> AllowList:
        """CALIBD_PREDICTOR_ALLOW, with the operator's own predictors (CALIBD_PREDICTOR_URL,
        CALIBD_PREDICTORS) allowed too: whoever sets those needs no second setting."""
        own = [p.url for p in self.predictors.values()] + ([self.predictor_url] if self.predictor_url else [])
        return AllowList.parse(self.predictor_allow).including(own)

    #: How often the closed-loop recalibration looks at calibrators with a policy.
    recalibration_interval_seconds: float = Field(default=30, gt=0)

    #: False-alarm probability of each version's drift test, over its whole life.
    monitor_alpha: float = Field(default=0.05, gt=0, lt=1)
    #: Calibration error the drift test tolerates, as a logit shift of the true probability.
    monitor_tolerance: float = Field(default=0.1, ge=0)


@lru_cache
def get_settings() -> Settings:
    return Settings()
