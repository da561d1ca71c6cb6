"""The compose stack (docker/, docker-compose.yml), validated without a Docker engine or Grafana.

- Prometheus's config, the alert rules and their unit tests pass promtool; Alertmanager's
  config passes amtool (also after the entrypoint has put a webhook URL in it). Where these
  tools are absent the tests skip, unless CI is set: then they fail (.ci/run installs them).
- `docker compose config` where the docker client has the compose plugin, and checks of the
  compose file, the Dockerfile and Grafana's provisioning that run everywhere.
- Every metric name that the dashboard, the alert rules and their unit tests use is one that a
  live calibd exports on /metrics.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from .conftest import REPO, free_port

DOCKER = REPO / "docker"
COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = DOCKER / "Dockerfile"
PROMETHEUS_CONFIG = DOCKER / "prometheus.yml"
ALERT_RULES = DOCKER / "alerts.yml"
ALERT_TESTS = DOCKER / "alerts_test.yml"
ALERTMANAGER_CONFIG = DOCKER / "alertmanager.yml"
ALERTMANAGER_ENTRYPOINT = DOCKER / "alertmanager-entrypoint.sh"
GRAFANA = DOCKER / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "calibd.json"

ALERTS = {
    "CalibrationDriftAlarm", "CalibrationDriftAlarmSegment", "CalibrationErrorHigh", "FeedbackStalled",
    "LabelDelayDependsOnLabel", "LabelsArriveAfterTheirWindow",
}
#: A metric name in PromQL: an identifier that starts with calibd_.
METRIC_NAME = re.compile(r"(?<![A-Za-z0-9_:])calibd_[A-Za-z0-9_:]*")
#: A PromQL string literal (label values), left out before looking for metric names.
STRING = re.compile(r'"(?:[^"\\]|\\.)*"' r"|'(?:[^'\\]|\\.)*'" r"|`[^`]*`")
#: Variables for the compose file's required settings, as a user would put them in .env.
COMPOSE_ENV = {"CALIBD_BOOTSTRAP_ADMIN_KEY": "calibd_compose_testsecret", "GRAFANA_ADMIN_PASSWORD": "test-password"}


def metric_names(promql: str) -> set[str]:
    return set(METRIC_NAME.findall(STRING.sub('""', promql)))


def tool(name: str) -> str:
    """The path of a command-line tool; a skip where it is absent, a failure in CI."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is required in CI: .ci/run installs Debian's prometheus and prometheus-alertmanager")
        pytest.skip(f"{name} is not installed (apt-get install prometheus prometheus-alertmanager)")
    return path


def run(*args: str | Path, env: dict | None = None) -> str:
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(map(str, args))} exited {result.returncode}:\n{output}"
    return output


def load_yaml(path: Path):
    return yaml.safe_load(path.read_text())


def rules() -> list[dict]:
    return [rule for group in load_yaml(ALERT_RULES)["groups"] for rule in group["rules"]]


# ---------------------------------------------------------------- Prometheus and Alertmanager


def test_promtool_accepts_the_prometheus_config_and_finds_the_rule_file():
    output = run(tool("promtool"), "check", "config", PROMETHEUS_CONFIG)
    assert "SUCCESS: 1 rule files found" in output
    config = load_yaml(PROMETHEUS_CONFIG)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["calibd"].get("metrics_path", "/metrics") == "/metrics"
    assert [target for sd in jobs["calibd"]["dns_sd_configs"] for target in sd["names"]] == ["calibd"]
    assert jobs["calibd"]["dns_sd_configs"][0]["port"] == 8000
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]
    assert (PROMETHEUS_CONFIG.parent / config["rule_files"][0]).resolve() == ALERT_RULES


def test_promtool_accepts_the_alert_rules():
    output = run(tool("promtool"), "check", "rules", ALERT_RULES)
    assert f"SUCCESS: {len(ALERTS)} rules found" in output
    by_name = {rule["alert"]: rule for rule in rules()}
    assert set(by_name) == ALERTS
    for name, rule in by_name.items():
        assert rule["labels"]["severity"] in {"page", "warning", "info"}, name
        assert rule["annotations"]["summary"].strip() and rule["annotations"]["description"].strip(), name


def test_the_alert_rule_unit_tests_pass_and_show_each_alert_firing_and_quiet():
    output = run(tool("promtool"), "test", "rules", ALERT_TESTS)
    assert "SUCCESS" in output
    firing, quiet = set(), set()
    for case in load_yaml(ALERT_TESTS)["tests"]:
        for check in case["alert_rule_test"]:
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    assert firing == ALERTS and quiet == ALERTS


def test_amtool_accepts_the_alertmanager_config_and_it_routes_to_a_webhook():
    output = run(tool("amtool"), "check-config", ALERTMANAGER_CONFIG)
    assert "SUCCESS" in output
    config = load_yaml(ALERTMANAGER_CONFIG)
    receivers = {receiver["name"]: receiver for receiver in config["receivers"]}
    assert config["route"]["receiver"] in receivers
    assert receivers[config["route"]["receiver"]]["webhook_configs"][0]["send_resolved"] is True


def test_the_alertmanager_entrypoint_puts_the_webhook_url_from_the_environment_in_the_config(tmp_path):
    amtool = tool("amtool")
    placeholder = re.search(r"^placeholder='([^']+)'$", ALERTMANAGER_ENTRYPOINT.read_text(), re.MULTILINE).group(1)
    assert placeholder in ALERTMANAGER_CONFIG.read_text()
    url = "https://hooks.example.com/services/T000/B000/XXXX?channel=ml&x=\\1"  # & and \1: inserted literally
    rendered = tmp_path / "alertmanager.yml"
    env = os.environ | {
        "ALERTMANAGER_TEMPLATE": str(ALERTMANAGER_CONFIG),
        "ALERTMANAGER_RENDERED": str(rendered),
        "ALERTMANAGER_WEBHOOK_URL": url,
        "ALERTMANAGER_BIN": "echo",  # stands in for /bin/alertmanager: prints the arguments it gets
    }
    output = run("sh", ALERTMANAGER_ENTRYPOINT, "--storage.path=/alertmanager", env=env)
    assert output.strip() == f"--config.file={rendered} --storage.path=/alertmanager"
    config = load_yaml(rendered)
    assert config["receivers"][0]["webhook_configs"][0]["url"] == url
    assert "SUCCESS" in run(amtool, "check-config", rendered)
    # Without the variable, the config is used as it is.
    env.pop("ALERTMANAGER_WEBHOOK_URL")
    run("sh", ALERTMANAGER_ENTRYPOINT, env=env)
    assert rendered.read_text() == ALERTMANAGER_CONFIG.read_text()


# ---------------------------------------------------------------- compose and the image


def compose_command() -> list[str]:
    """`docker compose`, where the docker client has the compose plugin (no engine needed)."""
    if shutil.which("docker") is None:
        pytest.skip("no docker client on this machine: `docker compose config` not run")
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"this docker client has no compose plugin: `docker compose config` not run ({probe.stderr.strip()[:120]})")
    return ["docker", "compose", "--project-directory", str(REPO), "-f", str(COMPOSE)]


def test_docker_compose_config_accepts_the_stack():
    command = compose_command()
    env = {k: v for k, v in os.environ.items() if k not in COMPOSE_ENV} | COMPOSE_ENV
    config = yaml.safe_load(run(*command, "config", env=env))
    assert set(config["services"]) >= {"calibd", "migrate", "postgres", "prometheus", "alertmanager", "grafana"}
    assert config["services"]["calibd"]["environment"]["CALIBD_BOOTSTRAP_ADMIN_KEY"] == COMPOSE_ENV["CALIBD_BOOTSTRAP_ADMIN_KEY"]
    # Auth is always on: without the first admin key the stack does not start.
    env.pop("CALIBD_BOOTSTRAP_ADMIN_KEY")
    refused = subprocess.run([*command, "config"], capture_output=True, text=True, timeout=60, env=env)
    assert refused.returncode != 0 and "CALIBD_BOOTSTRAP_ADMIN_KEY" in refused.stderr


def test_the_compose_file_wires_the_stack_together():
    compose = load_yaml(COMPOSE)
    services = compose["services"]
    assert set(services) == {"calibd", "migrate", "postgres", "prometheus", "alertmanager", "grafana"}
    for name, service in services.items():
        if name != "migrate":  # the one-shot job
            assert "healthcheck" in service, f"{name} has no healthcheck"
        for dependency, condition in service.get("depends_on", {}).items():
            assert dependency in services, f"{name} depends on an unknown service {dependency}"
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], f"{name} waits for {dependency} to be healthy"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (REPO / source).exists(), f"{name} mounts {source}, which is not in the repository"
            else:
                assert source in compose["volumes"], f"{name} mounts an undeclared volume {source}"
        for port in service.get("ports", []):
            assert "127.0.0.1:" in port, f"{name} publishes {port} beyond loopback by default"

    calibd, migrate = services["calibd"], services["migrate"]
    for service in (calibd, migrate):
        assert service["environment"]["CALIBD_DATABASE_URL"].startswith("postgresql+psycopg://")
        assert service["build"]["dockerfile"] == "docker/Dockerfile"
    assert migrate["command"] == ["calibd", "migrate"]
    assert calibd["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert calibd["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert calibd["command"][:4] == ["calibd", "serve", "--host", "0.0.0.0"]
    # Secrets come from the environment, and are required (`:?`): no default key or password.
    assert calibd["environment"]["CALIBD_BOOTSTRAP_ADMIN_KEY"].startswith("${CALIBD_BOOTSTRAP_ADMIN_KEY:?")
    grafana = services["grafana"]["environment"]
    assert grafana["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")
    assert grafana["GF_USERS_ALLOW_SIGN_UP"] == "false"

    mounts = {v.split(":")[1]: v.split(":")[0] for s in services.values() for v in s.get("volumes", [])}
    assert mounts["/etc/prometheus/prometheus.yml"] == "./docker/prometheus.yml"
    assert mounts["/etc/prometheus/alerts.yml"] == "./docker/alerts.yml"
    assert mounts["/etc/alertmanager/alertmanager.yml"] == "./docker/alertmanager.yml"
    assert mounts["/etc/grafana/provisioning"] == "./docker/grafana/provisioning"
    provider = load_yaml(GRAFANA / "provisioning" / "dashboards" / "calibd.yml")["providers"][0]
    assert mounts[provider["options"]["path"]] == "./docker/grafana/dashboards"
    home = grafana["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (REPO / mounts[str(Path(home).parent)] / Path(home).name).resolve() == DASHBOARD


def dockerfile(keyword: str) -> list[str]:
    """The Dockerfile's instructions of one kind, continuation lines joined."""
    lines = re.sub(r"\\\n", " ", DOCKERFILE.read_text()).splitlines()
    return [line.strip() for line in lines if line.strip() and line.split()[0] == keyword]


def dockerignored(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path.split("/")[0], p) for p in patterns)


def test_the_dockerfile_installs_the_package_and_serves_as_a_non_root_user_with_a_healthcheck():
    keyword = dockerfile
    assert keyword("FROM") == ["FROM python:3.11-slim"]
    user = keyword("USER")[-1].split()[1]
    assert user not in {"root", "0"}
    assert any('pip install ".[server,postgres]"' in line for line in keyword("RUN"))  # the service, not the client alone
    healthcheck = keyword("HEALTHCHECK")[0]
    assert "/healthz" in healthcheck and "127.0.0.1:8000" in healthcheck
    assert keyword("EXPOSE") == ["EXPOSE 8000"]
    assert json.loads(keyword("CMD")[-1][len("CMD"):]) == ["calibd", "serve", "--host", "0.0.0.0", "--port", "8000"]

    # What `pip install .` needs is copied, exists, and is not excluded from the build context.
    ignored = [p.strip() for p in (REPO / ".dockerignore").read_text().splitlines() if p.strip() and not p.startswith("#")]
    copied = [part for line in keyword("COPY") for part in line.split()[1:-1]]
    for source in copied:
        assert (REPO / source).exists(), source
        assert not dockerignored(source, ignored), f"{source} is copied but .dockerignore excludes it"
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    package_dirs = pyproject["tool"]["setuptools"].get("package-dir", {})
    for package in pyproject["tool"]["setuptools"]["packages"]:
        # setuptools maps a package through its longest listed prefix (calibd -> app, calibd.migrations -> migrations)
        prefix = max((p for p in package_dirs if package == p or package.startswith(p + ".")), key=len, default=None)
        directory = package.replace(".", "/") if prefix is None else package_dirs[prefix] + package[len(prefix):].replace(".", "/")
        assert directory.split("/")[0] in copied, f"package {package} ({directory}) is not copied into the image"
    assert pyproject["project"]["readme"] in copied
    assert "setup.py" in copied  # it builds the compiled kernels
    for private in ("calibd.db", ".venv", ".env", ".git"):
        assert dockerignored(private, ignored), f".dockerignore lets {private} into the build context"


def test_pip_install_dot_installs_every_package_of_the_source_tree():
    """The image runs `pip install .` (not an editable install, as make does): every package must be listed."""
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = setuptools["packages"]
    if not isinstance(listed, list):  # [tool.setuptools.packages.find] finds them all
        return
    directories = {v: k for k, v in setuptools.get("package-dir", {}).items()}
    on_disk = set()
    for top in ("app", *directories):
        for init in (REPO / top).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO).as_posix()
            mapped = next((p for d, p in directories.items() if relative == d), None)
            if mapped is None:
                parent = next((d for d in directories if relative.startswith(d + "/")), None)
                mapped = directories[parent] + relative[len(parent):].replace("/", ".") if parent else relative.replace("/", ".")
            on_disk.add(mapped)
    missing = sorted(on_disk - set(listed))
    assert not missing, f"pyproject.toml [tool.setuptools] packages leaves out {missing}: `pip install .` (the image) would lack them"


def test_the_dockerfile_healthcheck_command_reports_a_live_calibd(server):
    """The HEALTHCHECK's own Python command, pointed at a live calibd, exits 0 (and 1 when nothing answers)."""
    healthcheck = dockerfile("HEALTHCHECK")[0]
    command = json.loads(healthcheck[healthcheck.index("CMD") + 3 :])
    assert command[:2] == ["python", "-c"]
    script = command[2]

    def check(port: int) -> int:
        probe = script.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
        return subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=30).returncode

    assert check(server.port) == 0
    assert check(free_port()) != 0


# ---------------------------------------------------------------- Grafana


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(board: dict) -> list[dict]:
    found = []
    for panel in board["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def dashboard_queries(board: dict) -> list[str]:
    """Every PromQL expression: panel targets and template-variable queries."""
    queries = [target["expr"] for panel in panels(board) for target in panel.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            queries.append(query["query"] if isinstance(query, dict) else query)
    return queries


def test_grafana_provisioning_points_at_prometheus_and_loads_the_dashboard():
    datasources = load_yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")["datasources"]
    assert len(datasources) == 1
    source = datasources[0]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090" and source["isDefault"]
    providers = load_yaml(GRAFANA / "provisioning" / "dashboards" / "calibd.yml")["providers"]
    assert providers[0]["type"] == "file"

    board = dashboard()
    assert board["uid"] and board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["current"]["value"] == source["uid"]
    assert variables["calibrator"]["multi"] and variables["window"]["multi"]
    ids = [panel["id"] for panel in panels(board)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels(board):
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}" and target["refId"] and target["expr"].strip()


def test_the_dashboard_shows_calibration_per_calibrator_and_window_feedback_alarms_and_traffic():
    board = dashboard()
    by_metric: dict[str, list[str]] = {}
    for panel in panels(board):
        for target in panel.get("targets", []):
            for metric in metric_names(target["expr"]):
                by_metric.setdefault(metric, []).append(target["expr"])
    for metric in ("calibd_monitor_ece", "calibd_monitor_brier", "calibd_monitor_log_loss"):
        assert any('calibrator=~"$calibrator"' in e and 'window=~"$window"' in e for e in by_metric[metric]), metric
    assert any("rate(calibd_feedback_total" in e for e in by_metric["calibd_feedback_total"])
    assert "calibd_monitor_drift_alarm" in by_metric and "calibd_monitor_drift_log_evalue" in by_metric
    latency = by_metric["calibd_request_duration_seconds_bucket"]
    assert any(e.startswith("histogram_quantile(") and "by (route, le)" in e for e in latency)
    assert "calibd_request_duration_seconds_count" in by_metric
    # The segment row: per-segment ECE over time and the segments in alarm, by the dimension variable.
    assert any('dimension=~"$dimension"' in e and 'window=~"$window"' in e for e in by_metric["calibd_segment_ece"])
    assert any(e.endswith("== 1") and 'dimension=~"$dimension"' in e for e in by_metric["calibd_segment_drift_alarm"])
    dimension = {v["name"]: v for v in board["templating"]["list"]}["dimension"]
    assert dimension["multi"] and "calibd_segment_samples" in dimension["query"]["query"]


# ---------------------------------------------------------------- metric names


def exported_names(exposition: str) -> set[str]:
    """Every series name a scrape of this exposition can produce."""
    names = set()
    for family in text_string_to_metric_families(exposition):
        names.add(family.name)
        if family.type == "counter":
            names |= {f"{family.name}_total", f"{family.name}_created"}
        elif family.type in ("histogram", "summary"):
            names |= {f"{family.name}{suffix}" for suffix in ("_bucket", "_sum", "_count", "_created")}
        names |= {sample.name for sample in family.samples}
    return names


def used_names() -> dict[str, set[str]]:
    """The calibd_ metric names that the dashboard, the alert rules and their unit tests use, by file."""
    used = {
        str(DASHBOARD.relative_to(REPO)): {m for q in dashboard_queries(dashboard()) for m in metric_names(q)},
        str(ALERT_RULES.relative_to(REPO)): {m for rule in rules() for m in metric_names(rule["expr"])},
        str(ALERT_TESTS.relative_to(REPO)): {
            m
            for case in load_yaml(ALERT_TESTS)["tests"]
            for series in case["input_series"]
            for m in metric_names(series["series"].split("{")[0])
        },
    }
    assert all(used.values()), used
    return used


def test_every_metric_name_in_the_dashboard_and_the_alert_rules_is_one_calibd_exports(client, name):
    # A little of every kind of traffic, so that every labelled family has samples.
    rng = np.random.default_rng(7)
    scores = rng.uniform(0.01, 0.99, 300)
    labels = (rng.uniform(size=300) < scores).astype(int)
    body = {"name": name, "method": "platt", "holdout": {"scores": scores.tolist(), "labels": labels.tolist()},
            "segments": {"dimensions": ["country"]}}
    assert client.post("/calibrators", json=body).status_code == 201
    assert client.post("/calibrate", json={"calibrator": name, "scores": [0.2, 0.7], "ids": ["a", "b"]}).status_code == 200
    feedback = {"calibrator": name, "probabilities": [0.2, 0.7, 0.9], "labels": [0, 1, 1],
                "segments": {"country": ["br", "us", "br"]}}
    assert client.post("/feedback", json=feedback).status_code == 202
    response = client.get("/metrics")
    assert response.status_code == 200
    exported = exported_names(response.text)
    assert {"calibd_monitor_ece", "calibd_feedback_total", "calibd_request_duration_seconds_bucket"} <= exported

    unknown = {where: sorted(names - exported) for where, names in used_names().items() if names - exported}
    assert not unknown, f"metric names that calibd does not export: {unknown}"


def test_the_metric_name_pattern_reads_promql():
    expr = 'histogram_quantile(0.9, sum by (le) (rate(calibd_request_duration_seconds_bucket{route="calibd_x"}[5m]))) / calibd_a:b'
    assert metric_names(expr) == {"calibd_request_duration_seconds_bucket", "calibd_a:b"}  # not the label value
    assert metric_names("xcalibd_y + calibd") == set()
