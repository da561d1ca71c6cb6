"""Real data: a classifier trained on scikit-learn's breast-cancer set, calibrated through the API."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split
from sklearn.naive_bayes import GaussianNB

from calibd.metrics import ece


@pytest.fixture(scope="module")
def holdout():
    X, y = load_breast_cancer(return_X_y=True)
    X_train, X_hold, y_train, y_hold = train_test_split(X, y, test_size=0.5, random_state=0, stratify=y)
    # Naive Bayes on correlated features is famously overconfident.
    model = GaussianNB().fit(X_train, y_train)
    scores = model.predict_proba(X_hold)[:, 1]
    return scores, y_hold


@pytest.mark.parametrize("method", ["platt", "isotonic"])
def test_cross_fitted_ece_improves(client, name, holdout, method):
    scores, labels = holdout
    body = {"name": name, "method": method, "holdout": {"scores": scores.tolist(), "labels": labels.tolist()}}
    response = client.post("/calibrators", json=body)
    assert response.status_code == 201, response.text
    summary = response.json()["summary"]
    assert summary["before"]["ece"] == pytest.approx(ece(scores, labels))
    assert summary["after"]["ece"] < summary["before"]["ece"]
    assert summary["after"]["log_loss"] < summary["before"]["log_loss"]
