"""schemathesis against the live app's /openapi.json: no 5xx, every response as documented.

A ``calibd serve`` process on each database, fuzzed by the schemathesis CLI
(its own process) with the bootstrap admin key; see tests/reliability/fuzz.py
for the checks. Requests are counted at the server. The long variant is
``benchmarks/reliability/fuzz.py``.
"""

from __future__ import annotations

import pytest

from calibd.config import Settings
from calibd.main import create_app

from .reliability.fuzz import run_fuzz
from .reliability.harness import CalibdProcess, admin_key

MAX_EXAMPLES = 25  # per operation and phase; about 1,100 requests per database


@pytest.mark.slow
def test_fuzzing_the_openapi_description_finds_no_server_error_and_no_mismatch(fresh_database, tmp_path):
    key = admin_key()
    with CalibdProcess(fresh_database, tmp_path, name="fuzz", bootstrap_admin_key=key) as server:
        result = run_fuzz(server, key, tmp_path / "schemathesis", MAX_EXAMPLES, seed=1)
    assert result["exit_code"] == 0 and not result["failures"] and not result["errors"], result["output"]
    assert result["server_errors"] == 0, result["statuses"]
    assert result["requests"] >= 1000, result["requests"]
    # Every documented operation was exercised, and answered with something other than 401.
    documented = {
        f"{method.upper()} {path}" for path, operations in create_app(Settings()).openapi()["paths"].items() for method in operations
    }
    assert result["operations_tested"] == result["operations_total"] == len(documented)
    assert documented <= set(result["requests_by_operation"]), documented - set(result["requests_by_operation"])
