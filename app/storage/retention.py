"""Retention: what is deleted once it is past its time."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import delete

from . import segments as segment_store
from .db import transaction
from .models import FeedbackRow, IdempotencyRow, MonitorBucketRow, PendingLabelRow, PredictionRow
from .sql import Sessions


def purge(sessions: Sessions, now: datetime, prediction_ttl: timedelta, feedback_retention: timedelta) -> dict[str, int]:
    """Delete expired predictions, and feedback, buckets, unmatched labels and idempotency keys past retention.

    Predictions are kept at least until their label window has passed: the
    maturity of a calibrator with a window reads them (CALIBD_PREDICTION_TTL
    should be longer than the longest label window).
    """
    with transaction(sessions) as session:
        counts = {
            # Expired ids are still reported as expired for a day after their TTL.
            "predictions": session.execute(
                delete(PredictionRow).where(PredictionRow.created_at < now - prediction_ttl - timedelta(days=1))
            ).rowcount,
            "feedback": session.execute(
                delete(FeedbackRow).where(FeedbackRow.received_at < now - feedback_retention, ~FeedbackRow.waiting)
            ).rowcount,
            "monitor_buckets": session.execute(
                delete(MonitorBucketRow).where(MonitorBucketRow.bucket_start < now - feedback_retention)
            ).rowcount,
            "idempotency_keys": session.execute(
                delete(IdempotencyRow).where(IdempotencyRow.created_at < now - timedelta(days=1))
            ).rowcount,
            # Joined labels leave the table; what stays is unmatched (or still in its grace period).
            "pending_labels": session.execute(
                delete(PendingLabelRow).where(PendingLabelRow.received_at < now - feedback_retention)
            ).rowcount,
            **segment_store.purge(session, now - feedback_retention),
        }
    return counts
