"""schemathesis against a live calibd: every operation of /openapi.json, every check that can hold.

The fuzzer runs as its own process (the schemathesis CLI: examples, coverage,
fuzzing and stateful phases), holding the bootstrap admin key; calibd runs as
``calibd serve``. Requests are counted at the server, from its access log, so
the figure is what calibd actually answered, and any 5xx there fails the run
even if schemathesis missed it.

Checks (schemathesis names): no server error; status codes, content types,
headers and bodies as documented; schema-violating requests rejected; every
secured route refusing a missing or wrong key; 405 for undocumented methods
(with Allow); a deleted calibrator gone afterwards. Left out:
``positive_data_acceptance`` (a schema cannot say that a holdout needs both
classes, or that ids and probabilities exclude each other, so valid-looking
requests are rightly refused) and ``object_level_authorization`` (keys are
scoped by route, not by object).
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from .harness import PYTHON, CalibdProcess, fit_body

CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
    "missing_required_header",
    "ignored_auth",
    "unsupported_method",
    "allow_header_conformance",
    "use_after_free",
    "ensure_resource_availability",
)
HOOKS = Path(__file__).with_name("fuzz_hooks.py")

#: Calibrators fitted before the run, so that generated requests can reach past the name lookup.
SEEDED = {"fuzz-binary": "platt", "fuzz-isotonic": "isotonic", "fuzz-venn": "venn_abers"}


def seed_calibrators(url: str, key: str) -> list[str]:
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, headers=headers, timeout=120) as http:
        for i, (name, method) in enumerate(SEEDED.items()):
            response = http.post("/calibrators", json=fit_body(name, seed=i, n=200, method=method))
            assert response.status_code == 201, response.text
            feedback = {"calibrator": name, "probabilities": [0.2, 0.7, 0.9], "labels": [0, 1, 1]}
            assert http.post("/feedback", json=feedback).status_code == 202
    return list(SEEDED)


def run_fuzz(server: CalibdProcess, key: str, workdir: Path, max_examples: int, seed: int, max_time: float | None = None) -> dict[str, Any]:
    """Fuzz ``server``; returns the figures (and schemathesis's verdict) without asserting."""
    names = seed_calibrators(server.url, key)
    workdir.mkdir(parents=True, exist_ok=True)
    before = len(_access(server))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALIBD_")} | {
        "SCHEMATHESIS_HOOKS": str(HOOKS),
        "CALIBD_FUZZ_ADMIN_KEY_ID": key.split("_")[1],
        "CALIBD_FUZZ_KEY": key,
        "CALIBD_FUZZ_NAMES": ",".join(names),
        "CALIBD_FUZZ_SEED": str(seed),
    }
    command = [
        PYTHON, "-m", "schemathesis.cli", "run", f"{server.url}/openapi.json",
        "--header", f"Authorization: Bearer {key}",
        "--checks", ",".join(CHECKS),
        "--max-examples", str(max_examples),
        "--seed", str(seed),
        "--workers", "1",
        "--request-timeout", "120",
        "--suppress-health-check", "all",
        "--report", "json", "--report-dir", str(workdir),
        "--output-truncate", "false",
    ]
    if max_time:
        command += ["--max-time", str(int(max_time))]
    started = time.monotonic()
    result = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=3600)
    seconds = time.monotonic() - started
    (workdir / "schemathesis.txt").write_text(result.stdout + result.stderr)
    reports = sorted(glob.glob(str(workdir / "json-*.json")))
    report = json.loads(Path(reports[-1]).read_text()) if reports else {}
    access = _access(server)[before:]
    statuses = Counter(line["status"] for line in access)
    operations = Counter((line["method"], line["route"]) for line in access if line.get("route"))
    return {
        "exit_code": result.returncode,
        "output": result.stdout[-30000:] + result.stderr[-5000:],
        "seconds": round(seconds, 1),
        "requests": len(access),
        "statuses": dict(sorted(statuses.items())),
        "server_errors": sum(n for status, n in statuses.items() if status >= 500),
        "operations_hit": len(operations),
        "requests_by_operation": {f"{m} {r}": n for (m, r), n in sorted(operations.items())},
        "test_cases": report.get("test_cases", {}).get("generated"),
        "operations_tested": report.get("operations", {}).get("tested"),
        "operations_total": report.get("operations", {}).get("total"),
        "failures": report.get("failures", []),
        "failures_dropped_after_verifying_the_async_job": report.get("filtered", 0),
        "errors": report.get("errors", []),
        "checks": list(CHECKS),
        "max_examples": max_examples,
        "seed": seed,
    }


def _access(server: CalibdProcess) -> list[dict[str, Any]]:
    return [r for r in server.log_records() if r.get("logger") == "calibd.access"]
