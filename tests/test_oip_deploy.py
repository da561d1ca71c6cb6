"""The deployment examples in deploy/, checked statically.

The Deployment and Service against Kubernetes' own schemas (kubernetes-validate, offline, strict);
the KServe InferenceService (a custom resource without a schema there) by the fields it relies
on. Both against calibd itself: the probe paths are routes it serves, without a key, and the
command lines parse as `calibd serve` arguments.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from calibd.cli import build_parser
from calibd.config import Settings
from calibd.main import create_app

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
KUBERNETES_VERSION = "1.30"


def documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def open_routes() -> set[str]:
    spec = create_app(Settings(database_url="sqlite://")).openapi()
    return {path for path, operations in spec["paths"].items() if "get" in operations and not operations["get"].get("security")}


def serve_arguments(command: list[str], appended: list[str] = ()):
    assert command[:2] == ["calibd", "serve"], command
    return build_parser().parse_args([*command[1:], *appended])


@pytest.mark.parametrize("path", sorted((DEPLOY / "kubernetes").glob("*.yaml")), ids=lambda p: p.name)
def test_kubernetes_manifests_match_the_kubernetes_schemas(path):
    for document in documents(path):
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_the_deployment_probes_the_v2_health_routes_on_its_ports():
    resources = {doc["kind"]: doc for doc in documents(DEPLOY / "kubernetes" / "calibd.yaml")}
    deployment, service = resources["Deployment"], resources["Service"]
    pod = deployment["spec"]["template"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    args = serve_arguments(container["command"])
    assert (args.host, args.port, args.grpc_port) == ("0.0.0.0", ports["http"], ports["grpc"])
    routes = open_routes()
    for probe, path in (("livenessProbe", "/v2/health/live"), ("readinessProbe", "/v2/health/ready")):
        assert container[probe]["httpGet"] == {"path": path, "port": "http"}
        assert path in routes  # served without a key, as a kubelet probes
    assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)
    names = {env["name"] for env in container["env"]}
    assert {"CALIBD_DATABASE_URL", "CALIBD_BOOTSTRAP_ADMIN_KEY"} <= names  # a key: calibd listens beyond loopback
    (migrate,) = pod["spec"]["initContainers"]
    assert migrate["command"] == ["calibd", "migrate"]


def test_the_logger_deployment_serves_http_on_the_same_database_and_probes():
    """deploy/kubernetes/calibd-logger.yaml: calibd for KServe's payload logger, beside calibd.yaml on its
    database and secret, with a Service of its own that the logger's url names."""
    resources = {doc["kind"]: doc for doc in documents(DEPLOY / "kubernetes" / "calibd-logger.yaml")}
    main = {doc["kind"]: doc for doc in documents(DEPLOY / "kubernetes" / "calibd.yaml")}
    deployment, service = resources["Deployment"], resources["Service"]
    pod = deployment["spec"]["template"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    # its pods are not the main Service's: no /calibrate request is routed to them
    assert not main["Service"]["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    args = serve_arguments(container["command"])
    assert (args.host, args.port) == ("0.0.0.0", ports["http"])
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= set(ports)
    routes = open_routes()
    for probe, path in (("livenessProbe", "/v2/health/live"), ("readinessProbe", "/v2/health/ready")):
        assert container[probe]["httpGet"] == {"path": path, "port": "http"} and path in routes
    (main_container,) = main["Deployment"]["spec"]["template"]["spec"]["containers"]
    shared = {env["name"]: env["valueFrom"] for env in main_container["env"]}
    assert {env["name"]: env["valueFrom"] for env in container["env"]} == shared  # the same database and key
    (logger,) = documents(DEPLOY / "kserve" / "payload-logger.yaml")
    host = urlsplit(logger["spec"]["predictor"]["logger"]["url"])
    assert host.hostname.split(".")[0] == service["metadata"]["name"] and host.port == service["spec"]["ports"][0]["port"]


def test_the_kserve_inference_service_runs_calibd_as_the_transformer_of_a_sklearn_v2_predictor():
    (service,) = documents(DEPLOY / "kserve" / "inferenceservice.yaml")
    assert service["apiVersion"] == "serving.kserve.io/v1beta1" and service["kind"] == "InferenceService"
    model = service["spec"]["predictor"]["model"]
    assert model["modelFormat"]["name"] == "sklearn" and model["protocolVersion"] == "v2"
    assert model["storageUri"]
    (container,) = service["spec"]["transformer"]["containers"]
    # KServe appends these to a transformer's arguments; calibd serve takes them.
    name = service["metadata"]["name"]
    args = serve_arguments(
        container["command"], ["--model_name", name, "--predictor_host", f"{name}-predictor.default", "--http_port", "8080"]
    )
    assert args.port == 8080 and args.predictor_host == f"{name}-predictor.default" and args.host == "0.0.0.0"
    assert [port["containerPort"] for port in container["ports"]] == [8080]
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": 8080}
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    env = {item["name"]: item for item in container["env"]}
    assert env["CALIBD_PREDICTOR_OUTPUT"]["value"] == "predict_proba"
    assert "CALIBD_BOOTSTRAP_ADMIN_KEY" in env and "CALIBD_DATABASE_URL" in env
    Settings(predictor_output=env["CALIBD_PREDICTOR_OUTPUT"]["value"],
             predictor_timeout_seconds=env["CALIBD_PREDICTOR_TIMEOUT_SECONDS"]["value"])
