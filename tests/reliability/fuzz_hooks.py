"""schemathesis hooks for fuzzing calibd (loaded by the CLI through SCHEMATHESIS_HOOKS).

- The fuzzer holds the bootstrap admin key. Its stateful phase finds key ids
  in GET /keys and would revoke that key, after which every request gets 401
  and nothing deeper is tested; a DELETE /keys/{key_id} naming it is pointed
  at another (unknown) id instead.
- Generated calibrator names almost never exist, so /calibrate, /feedback and
  the per-name routes would only ever answer 404. Half of the generated names
  that are valid (strings in the body, names matching the path pattern) are
  replaced by calibrators the test fitted beforehand (never on DELETE, which
  would remove them), so that the fuzzer reaches the code behind the lookup.
  A valid value is swapped for another valid value, so a case stays positive
  or negative for the reason it was generated.
- POST /calibrators?async=true answers 202 before the body is read (the fit
  job validates it, as a synchronous fit would). A schema-violating body
  accepted that way is not counted as a failure only if its job, followed at
  its Location, then fails with a 4xx problem; any other outcome stays a
  failure. Every failure dropped so is counted in the JSON report
  ("filtered").
"""

from __future__ import annotations

import os
import random
import re
import time

import httpx
import schemathesis

ADMIN_KEY_ID = os.environ.get("CALIBD_FUZZ_ADMIN_KEY_ID", "")
KEY = os.environ.get("CALIBD_FUZZ_KEY", "")
NAMES = [name for name in os.environ.get("CALIBD_FUZZ_NAMES", "").split(",") if name]
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_random = random.Random(int(os.environ.get("CALIBD_FUZZ_SEED", "0")))


@schemathesis.hook
def before_call(context, case, kwargs) -> None:
    operation = case.operation
    parameters = case.path_parameters
    if operation.path == "/keys/{key_id}" and parameters and parameters.get("key_id") == ADMIN_KEY_ID:
        parameters["key_id"] = "fuzzother"
    if not NAMES:
        return
    generated = parameters.get("name") if parameters else None
    if isinstance(generated, str) and NAME.match(generated) and operation.method.upper() != "DELETE":
        if _random.random() < 0.5:  # a valid name for another valid name: the case stays what it was
            parameters["name"] = _random.choice(NAMES)
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("calibrator"), str) and _random.random() < 0.5:
        body["calibrator"] = _random.choice(NAMES)


@schemathesis.hook
def filter_failure(context, failure, case, response) -> bool:
    """True keeps the failure."""
    if type(failure).__name__ != "AcceptedNegativeData":
        return True
    if case.operation.method.upper() != "POST" or case.operation.path != "/calibrators" or response.status_code != 202:
        return True
    if str((case.query or {}).get("async", "")).lower() not in ("true", "1"):
        return True
    location = response.headers.get("location") or response.headers.get("Location")
    if isinstance(location, list):
        location = location[0] if location else None
    if not location:
        return True
    url = str(response.request.url).split("/calibrators")[0] + location
    deadline = time.monotonic() + 120
    with httpx.Client(headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as http:
        while time.monotonic() < deadline:
            job = http.get(url)
            if job.status_code != 200:
                return True
            body = job.json()
            if body["state"] == "failed":
                return not (body.get("problem") and 400 <= body["problem"]["status"] < 500)
            if body["state"] == "succeeded":
                return True
            time.sleep(0.1)
    return True
