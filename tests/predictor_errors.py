"""What calibd logged about a predictor's failure, found by the error id of the caller's 502/504.

The caller is told a short reason and an error id; where the request went and what the predictor
said are in calibd's log (logger ``calibd.predictor``). A filter on that logger sees every record
(handlers are replaced whenever an app configures logging; a logger's filters are not).
"""

from __future__ import annotations

import logging
import re

import httpx

_ID = re.compile(r"\(error id ([0-9a-f]{12})\)$")


class PredictorErrors(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.records: dict[str, logging.LogRecord] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        error_id = getattr(record, "error_id", None)
        if error_id is not None:
            self.records[error_id] = record
        return True

    def __enter__(self) -> PredictorErrors:
        logging.getLogger("calibd.predictor").addFilter(self)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger("calibd.predictor").removeFilter(self)

    def of(self, response: httpx.Response) -> logging.LogRecord:
        """The log record of a 502/504 answer (asserting that it names an error id and leaks nothing)."""
        error = response.json()["error"]
        found = _ID.search(error)
        assert found, f"no error id in {error!r}"
        record = self.records[found.group(1)]
        assert record.predictor not in error and "://" not in error, error  # never the URL
        if record.detail:
            assert record.detail not in error, error  # never what the predictor said
        return record
