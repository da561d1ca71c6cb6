"""The transformer is not an SSRF or leak channel (issue: hostile inputs, item 5), on SQLite and PostgreSQL.

- Every URL outside CALIBD_PREDICTOR_ALLOW, or not a literal host:port (gRPC resolver schemes,
  credentials, ``0``, numeric host forms, non-ASCII or badly escaped paths), is refused with a 422
  naming the field when the predictor is set, by PUT .../predictor or by a fit, and nothing is written.
- An allowed predictor that errs or is down gets the caller a 502 with a short reason and an error
  id: never its body, never its URL (both are in calibd's log under the id).
- An allowed predictor that answers a huge body gets a 502, and calibd stops reading at the cap.
- An allowed name that resolves to an address the list does not allow is refused at connect
  time: no connection is made to it.

Every connection made here is to loopback; other addresses appear only where they are refused
before anything connects.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from concurrent import futures

import grpc
import httpx
import pytest

from calibd.config import Settings
from calibd.grpc_v2 import SERVICE, ModelInferRequest, ModelInferResponse
from calibd.predictor_urls import AllowList, PredictorUrlError, parse
from calibd.storage import predictors as predictor_store
from calibd.storage.db import make_engine, make_sessionmaker

from .conftest import LiveServer, RowCounter
from .predictor_errors import PredictorErrors
from .test_api_feedback import fit

REQUEST = {"inputs": [{"name": "input-0", "datatype": "FP64", "shape": [1, 2], "data": [0.5, 1.5]}]}
SECRET = "SECRET-UPSTREAM-4f1d"
CAP = 1024 * 1024  # CALIBD_PREDICTOR_MAX_ANSWER_BYTES here


class Upstream:
    """A loopback HTTP server that counts its connections and answers every request one way:
    ``error`` (500 with a secret body), ``huge`` (a Content-Length of 300 MB, then that many bytes),
    ``chunked`` (chunks without end), ``silent-close`` (nothing). It counts the bytes it got out."""

    def __init__(self, mode: str):
        self.mode = mode
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.sent = 0
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.listener.settimeout(0.2)
        while not self.stop.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                continue
            self.connections += 1
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            connection.settimeout(10)
            try:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += connection.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = int([h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")][0].split(b":")[1])
                while len(body) < length:
                    body += connection.recv(65536)
                if self.mode == "error":
                    text = ('{"error": "%s: traceback of the model server"}' % SECRET).encode()
                    connection.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                                       b"Content-Length: %d\r\n\r\n%s" % (len(text), text))
                elif self.mode == "huge":
                    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                                       % (300 * 1024 * 1024))
                    self._flood(connection, b"0" * 65536)
                elif self.mode == "chunked":
                    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
                    self._flood(connection, b"10000\r\n" + b" " * 65536 + b"\r\n")
            except OSError:
                pass

    def _flood(self, connection: socket.socket, piece: bytes) -> None:
        while self.sent < 300 * 1024 * 1024:
            connection.sendall(piece)  # raises once calibd has closed the connection
            self.sent += len(piece)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.stop.set()
        self.listener.close()


def huge_grpc_server() -> tuple[grpc.Server, int]:
    """A gRPC predictor on loopback whose ModelInfer answers 4 MiB, four times the cap."""

    def infer(request, context):
        answer = ModelInferResponse(model_name=request.model_name)
        answer.outputs.add(name="predict_proba", datatype="FP64", shape=[524288])
        answer.raw_output_contents.append(b"\0" * (4 * CAP))
        return answer

    handler = grpc.method_handlers_generic_handler(SERVICE, {"ModelInfer": grpc.unary_unary_rpc_method_handler(
        infer, request_deserializer=ModelInferRequest.FromString, response_serializer=ModelInferResponse.SerializeToString,
    )})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=[("grpc.max_send_message_length", 8 * CAP)])
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


@pytest.fixture(scope="module")
def upstreams():
    made = {mode: Upstream(mode) for mode in ("error", "huge", "chunked", "silent-close")}
    dead = socket.socket()  # bound, not listening: connections are refused
    dead.bind(("127.0.0.1", 0))
    grpc_server, grpc_port = huge_grpc_server()
    made["dead"] = dead.getsockname()[1]
    made["grpc"] = grpc_port
    yield made
    grpc_server.stop(0)
    dead.close()
    for upstream in made.values():
        if isinstance(upstream, Upstream):
            upstream.close()


@pytest.fixture(scope="module")
def live(isolated_database_url, upstreams):
    # Loopback only at these ports; any IPv4 address at the "elsewhere" port, which a name may resolve
    # into, except loopback and link-local, which a wide network never allows.
    ports = [upstreams[m].port for m in ("error", "huge", "chunked")] + [upstreams["dead"], upstreams["grpc"]]
    allow = ", ".join(f"127.0.0.1:{p}" for p in ports) + f", 0.0.0.0/0:{upstreams['silent-close'].port}"
    settings = Settings(database_url=isolated_database_url, predictor_allow=allow, predictor_max_answer_bytes=CAP,
                        predictor_timeout_seconds=5)
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=60) as http, PredictorErrors() as logged:
        yield server, http, logged


def refused_urls(upstreams) -> list[str]:
    allowed = upstreams["error"].port
    elsewhere = upstreams["silent-close"].port
    return [
        "http://127.0.0.1:1",  # loopback, at a port not listed
        f"http://127.0.0.1:{elsewhere}",  # loopback under 0.0.0.0/0: needs an entry of its own
        f"http://169.254.169.254:{elsewhere}/latest/meta-data",  # link-local (cloud metadata), same
        f"http://[::1]:{allowed}", f"http://[::ffff:127.0.0.1]:{elsewhere}",
        "http://10.0.0.1:8080", "http://metadata.google.internal/computeMetadata/v1",  # not listed
        f"http://0:{allowed}", f"http://0.0.0.0:{allowed}", f"http://[::]:{allowed}",
        f"http://127.1:{allowed}", f"http://2130706433:{allowed}", f"http://0x7f000001:{allowed}",
        "grpc://unix:1", "grpc://unix-abstract:calibd", "grpc://dns:53", "grpc://ipv4:1", "grpc://dns:///x:1",
        f"http://user:secret@127.0.0.1:{allowed}", f"http://127.0.0.1@127.0.0.1:{allowed}",
        f"http://127.0.0.1:{allowed}/\u4e2d\u6587", f"http://127.0.0.1:{allowed}/caf\u00e9", f"http://127.0.0.1:{allowed}/%zz",
        f"http://127.0.0.1:{allowed}/a b", f"http://127.0.0.1:{allowed}/../admin", f"http://127.0.0.1:{allowed}/x\\y",
        f"http://[fe80::1%25eth0]:{allowed}", f"http://224.0.0.1:{allowed}", f"http://:{allowed}", "http://127.0.0.1:0",
        f"ftp://127.0.0.1:{allowed}", "file:///etc/passwd", f"grpc://127.0.0.1:{allowed}/v2",
    ]


def test_every_refused_url_is_422_naming_the_field_and_writes_nothing(live, upstreams, name, isolated_database_url):
    _, http, _ = live
    fit(http, name)
    counter = RowCounter(isolated_database_url)
    try:
        before = counter()
        for url in refused_urls(upstreams):
            response = http.put(f"/calibrators/{name}/predictor", json={"url": url})
            assert response.status_code == 422, (url, response.text)
            assert response.json()["errors"][0]["pointer"] == "/url", (url, response.text)
            holdout = {"scores": [0.2, 0.4, 0.6, 0.8] * 10, "labels": [0, 0, 1, 1] * 10}
            response = http.post("/calibrators", json={"name": name, "method": "platt", "holdout": holdout,
                                                       "predictor": {"url": url}})
            assert response.status_code == 422, (url, response.text)
            assert response.json()["errors"][0]["pointer"] == "/predictor/url", (url, response.text)
        assert counter() == before
    finally:
        counter.engine.dispose()
    assert http.get(f"/calibrators/{name}/predictor").json()["stored"] is None
    assert upstreams["silent-close"].connections == 0


def _infer(live, name: str, url: str) -> httpx.Response:
    _, http, _ = live
    fit(http, name)
    assert http.put(f"/calibrators/{name}/predictor", json={"url": url, "model": "m"}).status_code == 200
    return http.post(f"/v2/models/{name}/infer", json=REQUEST)


def test_an_allowed_predictor_that_errs_or_is_down_is_502_without_its_body_or_url(live, upstreams, name):
    logged = live[2]
    response = _infer(live, name, upstreams["error"].url + "/serving")
    assert response.status_code == 502
    error = response.json()["error"]
    assert error.startswith("the predictor answered HTTP 500 (error id ") and SECRET not in response.text, error
    record = logged.of(response)  # the detail is in calibd's log, under the id
    assert SECRET in record.detail and record.predictor == f"{upstreams['error'].url}/serving/v2/models/m/infer"
    dead = _infer(live, name, f"http://127.0.0.1:{upstreams['dead']}")
    assert dead.status_code == 502 and dead.json()["error"].startswith("the predictor could not be reached (error id ")
    assert "ConnectionRefusedError" in logged.of(dead).detail


@pytest.mark.parametrize("mode", ["huge", "chunked"])
def test_an_answer_larger_than_the_cap_is_502_and_is_not_read_to_its_end(live, upstreams, name, mode):
    upstream = upstreams[mode]
    response = _infer(live, name, upstream.url)
    assert response.status_code == 502, response.text
    assert response.json()["error"].startswith(f"the predictor's answer is larger than {CAP} bytes (error id ")
    live[2].of(response)
    assert upstream.sent < 64 * CAP  # calibd closed the connection: the 300 MB were never sent


def test_a_grpc_answer_larger_than_the_cap_is_502(live, upstreams, name):
    response = _infer(live, name, f"grpc://127.0.0.1:{upstreams['grpc']}")
    assert response.status_code == 502, response.text
    assert response.json()["error"].startswith(f"the predictor's answer is larger than {CAP} bytes (error id ")


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_a_name_that_resolves_to_an_address_not_allowed_is_refused_at_connect(live, upstreams, name, scheme):
    """``localhost`` at the port 0.0.0.0/0 allows is accepted when set (a name may resolve into the
    network), but it resolves to loopback, which that entry does not allow: no connection is made,
    though a server listens there."""
    upstream = upstreams["silent-close"]
    response = _infer(live, name, f"{scheme}://localhost:{upstream.port}")
    assert response.status_code == 502, response.text
    assert response.json()["error"].startswith("the predictor's address is not allowed (CALIBD_PREDICTOR_ALLOW) (error id ")
    assert "none allowed" in live[2].of(response).detail
    assert upstream.connections == 0


def test_a_stored_url_that_predates_the_rules_is_502_not_500(live, isolated_database_url, name):
    """The non-Latin-1 path that once made every infer a 500, written to the database directly."""
    _, http, logged = live
    fit(http, name)
    engine = make_engine(isolated_database_url)
    try:
        predictor_store.set_predictor(make_sessionmaker(engine), name, {"url": "http://127.0.0.1:1/\u4e2d"})
    finally:
        engine.dispose()
    response = None
    for _ in range(200):  # until this process has read the stored predictor (it polls the registry)
        response = http.post(f"/v2/models/{name}/infer", json=REQUEST)
        if response.status_code != 422:
            break
        time.sleep(0.02)
    assert response.status_code == 502, response.text
    assert "not a valid predictor URL" in logged.of(response).detail


def test_the_allow_list_rules():
    allow = AllowList.parse("0.0.0.0/0, ::/0, models.internal:8080, 127.0.0.1:9000, [::1]:9001, 169.254.10.0/24")
    address = ipaddress.ip_address
    assert allow.permits_address(address("10.1.2.3"), 80) and allow.permits_address(address("2001:db8::1"), 443)
    # Loopback and link-local only through entries inside them; 169.254.169.254 is outside the one given.
    assert not allow.permits_address(address("127.0.0.1"), 80) and allow.permits_address(address("127.0.0.1"), 9000)
    assert not allow.permits_address(address("::1"), 9000) and allow.permits_address(address("::1"), 9001)
    assert not allow.permits_address(address("169.254.169.254"), 80) and allow.permits_address(address("169.254.10.7"), 80)
    assert not allow.permits_address(address("::ffff:127.0.0.1"), 80)  # an IPv4-mapped address is its IPv4 one
    assert not allow.permits_address(address("0.0.0.0"), 80) and not allow.permits_address(address("224.0.0.1"), 80)
    # A listed name is allowed at what it resolves to; any other name only at allowed addresses.
    assert allow.connectable("models.internal", 8080, ["127.0.0.1", "10.0.0.5"]) == [address("127.0.0.1"), address("10.0.0.5")]
    assert allow.connectable("models.internal", 8081, ["127.0.0.1", "10.0.0.5"]) == [address("10.0.0.5")]
    assert allow.connectable("other.example", 80, ["127.0.0.1", "::1", "169.254.169.254", "0.0.0.0"]) == []
    assert AllowList().refusal(parse("http://10.0.0.1:80")) is not None  # none allowed by default
    assert AllowList.parse("10.0.0.0/8").refusal(parse("http://anything.example:81")) is None  # checked at connect
    assert AllowList.parse("10.0.0.0/8:80").refusal(parse("http://anything.example:81")) is not None
    # The operator's own predictors are allowed as if listed.
    own = Settings(predictor_url="http://127.0.0.1:7000").allowed_predictors()
    assert own.permits_address(address("127.0.0.1"), 7000) and not own.permits_address(address("127.0.0.1"), 7001)
    for bad in ("0.0.0.0", "224.0.0.0/4", "[::]:80", "host:port", "a..b", "10.0.0.0/33", "127.1"):
        with pytest.raises(PredictorUrlError):
            AllowList.parse(bad)
    with pytest.raises(ValueError, match="predictor_allow"):
        Settings(predictor_allow="localhost, 0.0.0.0:80")
