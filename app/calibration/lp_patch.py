"""Patching a multiclass predictor's rounded bins until its l_p calibration error is small.

Bairaktari & Nguyen, "Sample-efficient multiclass calibration under l_p error"
(papers/001), Algorithm 2, in a practical form. Notation as in the paper and
``calibd.metrics.lp``: f(x) is the input's probability row (softmax for logits),
K classes, R(u)_i = floor(lambda u_i) / lambda the rounding, a bin v one
distinct R(f(x)), and

    rho(v) = v + ((1 - sum_i v_i) / K) 1

the canonical distribution of bin v (the even spread keeps every coordinate
below v_i + 1/lambda, so R(rho(v)) = v). pi is the Euclidean projection onto
the simplex, by sorting (Held, Wolfe & Crowder 1974; Duchi et al. 2008).

The holdout is shuffled (``seed``) and split into 1 + 2L equal pools: pool 0
estimates the bins' masses mu_v, and for each group size 2^i, i < L, one pool
estimates the groups' masses P_S and one their label sums
E_{S,j} = mean of y_j 1[R(f) in S]. L is the smallest number of levels with
|B| < 2^L, B the high-mass bins found with that split.

Accuracy from the pool size. Lemma 8 answers n_q adaptively chosen, disjoint
queries with k coordinates each to accuracy alpha with probability 1 - delta_q
from m = 32 ln(4 n_q k / delta_q) / alpha^2 rows, adding Laplace noise of scale
8 / (m alpha) to each empirical mean. Inverted, with m the pool's (Kish
effective) size, n_q = 2^L - 1 >= |B| and delta_q = delta / (3L):

    alpha_E = sqrt(32 ln(4 n_q K / delta_q) / m)    (label sums, k = K)
    alpha_P = sqrt(32 ln(4 n_q / delta_q) / m)      (masses, k = 1)

and the mass pool's accuracy alpha_mu solves Lemma 7's count (its proof),
m = ln(4 / (alpha_mu delta_1)) / (2 alpha_mu^2)
    + 4 ln(2 |V| / delta_1) / (3 alpha_mu),  delta_1 = delta / 3,
|V| = C(lambda + K, K) (Lemma 2).

The loop is the paper's with beta = 2 alpha_E in place of its
beta = eps^(p/(p-1)) / 2^(1/(p-1)) (whose constants need about 10^10 rows):
B = {v : mu_hat_v >= beta / 6}; one group per bin of B, pred({v}) = rho(v);
while some group S and class j have
Err_hat(S, j) = |P_hat_S pred(S)_j - E_hat_{S,j}| > beta / 2 = alpha_E, take
the largest, set z = pred(S), z_j = clip(E_hat_{S,j} / P_hat_S, 0, 1) (the
noise can leave the ratio outside [0, 1]), pred(S) = pi(z); a group whose new
level set R(pred) is another group's is merged with it, keeping the prediction
of the one with the larger P_hat; P_hat_S and E_hat_S are sums over the
estimation groups (sizes powers of 2, merged pairwise, each estimated once from
its size's pool). A cap of MAX_STEPS updates stops a loop that cycles on the
noise (the fit summary says whether it converged).

Output, piecewise constant on bins:

    h(x) = pred(S)       if R(f(x)) is in a patched group S,
           rho(R(f(x)))  otherwise (bins outside B, and bins of B never updated).

The epsilon reached. If every estimate is within its accuracy (probability
>= 1 - delta, unit weights), the proof of Lemma 14 bounds every cell of the
population error of h by

    b = max_{S, j} (Err_hat(S, j) + L_S (alpha_P pred(S)_j + alpha_E)) + beta / 6 + alpha_mu

(L_S estimation groups in S; bins outside B have mass below beta/6 + alpha_mu),
and then Err_p(h) <= eps = (2 b^(p-1))^(1/p) (eps = b for p = inf), since the
cells' errors sum to at most 2. Both are computed from the final state and
reported; b is capped at 1, the most a cell can hold. This is a statement about
the distribution the holdout was drawn from, not about the holdout itself.

Defaults: p = 2 and lambda = 10, as ``calibd.metrics.lp``; delta = 0.1; seed = 0.
p only sets which epsilon is reported (the loop does not depend on it); p = 1
is rejected: the bound on Err_1 is the trivial 2.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

import numpy as np

from ..metrics.lp import DEFAULT_LAMBDA, bin_ids, check_lambda, check_order, round_codes
from ._multiclass import as_probabilities
from ..inputs import CalibrationInputError
from .base import Calibrator

DEFAULT_P = 2.0
DEFAULT_DELTA = 0.1
#: Updates before the loop gives up (each is O(K log K); far below the paper's O(1/beta^2) bound in practice).
MAX_STEPS = 20_000


def canonical(codes: np.ndarray, lam: int) -> np.ndarray:
    """rho(v) for rows of codes floor(lambda u): v + ((1 - sum v) / K) 1, the deficit from the integer sum."""
    k = codes.shape[-1]
    deficit = (lam - codes.sum(axis=-1, keepdims=True)) / (lam * k)
    return codes / lam + deficit


def project_to_simplex(z: np.ndarray) -> np.ndarray:
    """argmin over the simplex of ||u - z||_2: max(z - theta, 0) with theta found by sorting."""
    u = np.sort(z)[::-1]
    excess = np.cumsum(u) - 1.0
    ranks = np.arange(1, z.shape[0] + 1)
    r = int(np.flatnonzero(u - excess / ranks > 0)[-1]) + 1
    return np.maximum(z - excess[r - 1] / r, 0.0)


def query_accuracy(m: float, n_queries: int, k: int, delta: float) -> float:
    """alpha with m = 32 ln(4 n k / delta) / alpha^2 (Lemma 8); inf for an empty pool."""
    if m <= 0:
        return math.inf
    return math.sqrt(32.0 * math.log(4.0 * max(n_queries, 1) * k / delta) / m)


def mass_accuracy(m: float, log_bins: float, delta: float) -> float:
    """alpha_1 at which Lemma 7's count ln(4/(a d))/(2a^2) + 4 ln(2|V|/d)/(3a) equals m; at most 1."""

    def needed(a: float) -> float:
        return math.log(4.0 / (a * delta)) / (2.0 * a * a) + 4.0 * (math.log(2.0 / delta) + log_bins) / (3.0 * a)

    if m <= 0 or needed(1.0) > m:
        return 1.0
    lo, hi = 1e-12, 1.0  # needed() is decreasing in a
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if needed(mid) > m:
            lo = mid
        else:
            hi = mid
    return hi


def log_level_sets(lam: int, k: int) -> float:
    """ln |V| = ln C(lambda + K, K) (Lemma 2)."""
    return math.lgamma(lam + k + 1) - math.lgamma(lam + 1) - math.lgamma(k + 1)


def effective_size(weights: np.ndarray) -> float:
    """Kish's (sum w)^2 / sum w^2: the pool size for weighted rows (the count for unit weights)."""
    total = float(weights.sum())
    squares = float(np.dot(weights, weights))
    return total * total / squares if squares > 0 else 0.0


class LpPatchCalibrator(Calibrator):
    """l_p patching: h(x) = pred(S) if R(f(x)) is in a patched group S, else rho(R(f(x))).

    R(u)_i = floor(lambda u_i) / lambda rounds a probability row f(x) to its bin, and
    rho(v) = v + ((1 - sum v) / K) 1 is the bin's canonical point. Bins of high mass are grouped
    and each group's prediction is patched toward its mean label while its estimated error
    exceeds alpha, the accuracy the holdout's size allows (Algorithm 2, with Laplace noise).
    ``info_["epsilon"]`` is the bound on the l_p error reached.

    Parameters
    ----------
    input : {"probability", "logit"}, default="probability"
        The scale the scores come on (logit rows enter as p = softmax(z)).
    p : float or "inf", default=2.0
        The order of the l_p error whose bound is reported, > 1.
    lam : int, default=10
        lambda, 1 to 1000000: coordinates are rounded down to multiples of 1 / lambda. The
        service's option is named ``lambda``.
    delta : float, default=0.1
        The failure probability the accuracies are derived for, in (0, 1).
    seed : int, default=0
        Seeds the shuffle into pools and the Laplace noise, so that a fit is reproducible.

    Attributes
    ----------
    groups_ : list of dict
        The patched groups: their bins (as integer codes lambda v) and their prediction.
    info_ : dict
        What the fit reached: ``epsilon``, ``alpha``, the pools, the bins seen and patched,
        and whether the loop converged.

    References
    ----------
    K. Bairaktari and H. L. Nguyen, "Sample-efficient multiclass calibration under l_p
    error" (papers/001).

    Examples
    --------
    >>> import numpy as np
    >>> from calibd.calibration.lp_patch import LpPatchCalibrator
    >>> rng = np.random.default_rng(0)
    >>> rows = np.where(rng.random((20000, 1)) < 0.5, [0.9, 0.05, 0.05], [0.05, 0.05, 0.9])
    >>> labels = rng.integers(0, 3, 20000)  # uniform labels: the rows are overconfident
    >>> calibrator = LpPatchCalibrator().fit(rows, labels)
    >>> len(calibrator.groups_), round(calibrator.info_["alpha"], 3)
    (2, 0.248)
    >>> calibrator.predict([[0.9, 0.05, 0.05], [0.2, 0.3, 0.5]]).round(3)  # the second row: its bin's point
    array([[0.558, 0.221, 0.221],
           [0.2  , 0.3  , 0.5  ]])
    """

    method = "lp_patch"
    tasks = ("multiclass",)
    monotone = False
    option_aliases = {"lambda": "lam"}
    fitted_attributes = ("groups_", "info_")

    def __init__(
        self,
        input: str = "probability",
        p: float | str = DEFAULT_P,
        lam: int = DEFAULT_LAMBDA,
        delta: float = DEFAULT_DELTA,
        seed: int = 0,
    ):
        self.input = input
        self.p = p
        self.lam = lam
        self.delta = delta
        self.seed = seed

    def _check_params(self) -> None:
        check_lambda(self.lam, "options.lambda")
        if check_order(self.p, "options.p") <= 1:
            raise CalibrationInputError("options.p", "must be > 1 or 'inf' (Algorithm 2's bound does not hold at p = 1)")
        delta = self.delta
        if isinstance(delta, bool) or not isinstance(delta, Real) or not 0 < delta < 1:
            raise CalibrationInputError("options.delta", "must be a number in (0, 1)")
        seed = self.seed
        if isinstance(seed, bool) or not isinstance(seed, Integral) or not 0 <= seed < 2**63:
            raise CalibrationInputError("options.seed", "must be a non-negative integer")

    # -- fit ------------------------------------------------------------------
    def _fit(self, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> None:
        lam, delta = int(self.lam), float(self.delta)
        f = as_probabilities(scores, self.input)
        n, k = f.shape
        codes = round_codes(f, lam)
        ids = bin_ids(codes, lam)
        n_bins = int(ids.max()) + 1
        rng = np.random.default_rng(int(self.seed))
        order = rng.permutation(n)
        log_v = log_level_sets(lam, k)

        # The smallest L whose split finds fewer than 2^L high-mass bins.
        levels = 1
        while True:
            plan = self._plan(order, ids, weights, n_bins, levels, k, log_v, delta)
            if plan["high"].shape[0] < 2**levels:  # holds once 2^L > bins seen
                break
            levels += 1
        high = plan["high"]
        alpha_e, alpha_p, alpha_mu, beta = plan["alpha_e"], plan["alpha_p"], plan["alpha_mu"], plan["beta"]
        n_high = high.shape[0]
        pools = plan["pools"]
        m = plan["rows_per_pool"]

        # Per pool, each high-mass bin's weighted mass and label sums (bins outside B are dropped).
        position = np.full(n_bins, -1, dtype=np.int64)
        position[high] = np.arange(n_high)
        mass_sums, label_sums = [], []
        for level in range(levels):
            rows = pools[1 + 2 * level]
            b = position[ids[rows]]
            keep = b >= 0
            mass_sums.append(np.bincount(b[keep], weights=weights[rows][keep], minlength=n_high) / weights[rows].sum())
            rows = pools[2 + 2 * level]
            b = position[ids[rows]]
            keep = b >= 0
            flat = b[keep] * k + labels[rows][keep]
            sums = np.bincount(flat, weights=weights[rows][keep], minlength=n_high * k).reshape(n_high, k)
            label_sums.append(sums / weights[rows].sum())
        noise_p = 8.0 / (m * alpha_p) if m > 0 else 0.0
        noise_e = 8.0 / (m * alpha_e) if m > 0 else 0.0

        # The estimation structure M: bins, and the noisy estimates made once when the group is formed.
        est_bins: list[list[int]] = []
        est_p: list[float] = []
        est_e: list[np.ndarray] = []

        def estimate(bins: list[int]) -> int:
            level = len(bins).bit_length() - 1  # sizes are powers of 2
            est_bins.append(bins)
            est_p.append(float(mass_sums[level][bins].sum()) + float(rng.laplace(0.0, noise_p)))
            est_e.append(label_sums[level][bins].sum(axis=0) + rng.laplace(0.0, noise_e, size=k))
            return len(est_bins) - 1

        # The prediction structure G: one group per bin of B, pred = rho(v).
        _, first_row = np.unique(ids, return_index=True)  # every bin number occurs
        high_codes = codes[first_row[high]]
        pred = canonical(high_codes, lam).reshape(n_high, k)
        members: list[list[int]] = [[g] for g in range(n_high)]
        parts: list[list[int]] = [[estimate([g])] for g in range(n_high)]
        total_p = np.array([est_p[parts[g][0]] for g in range(n_high)])
        total_e = np.array([est_e[parts[g][0]] for g in range(n_high)]).reshape(n_high, k)
        alive = np.ones(n_high, dtype=bool)
        patched = np.zeros(n_high, dtype=bool)
        error = np.abs(total_p[:, None] * pred - total_e)
        level_set: dict[bytes, int] = {}
        key = [b""] * n_high
        for g in range(n_high):
            key[g] = round_codes(pred[g], lam).tobytes()
            level_set.setdefault(key[g], g)

        steps = 0
        converged = n_high == 0
        while n_high and steps < MAX_STEPS:
            flat_index = int(np.argmax(np.where(alive[:, None], error, -np.inf)))
            g, j = divmod(flat_index, k)
            if error[g, j] <= beta / 2:
                converged = True
                break
            steps += 1
            z = pred[g].copy()
            ratio = total_e[g, j] / total_p[g] if total_p[g] > 0 else (1.0 if total_e[g, j] > 0 else 0.0)
            z[j] = min(max(ratio, 0.0), 1.0)
            pred[g] = project_to_simplex(z)
            patched[g] = True
            if level_set.get(key[g]) == g:
                del level_set[key[g]]
            key[g] = round_codes(pred[g], lam).tobytes()
            other = level_set.get(key[g])
            if other is not None:
                # Same level set as another group: merge, keeping the prediction of the larger estimated mass.
                if total_p[g] <= total_p[other]:
                    pred[g] = pred[other]
                members[g] += members[other]
                parts[g] += parts[other]
                alive[other] = False
                members[other], parts[other] = [], []
                merged = True
                while merged:
                    merged = False
                    sizes = [len(est_bins[e]) for e in parts[g]]
                    for a in range(len(sizes)):
                        twin = next((b for b in range(a + 1, len(sizes)) if sizes[b] == sizes[a]), None)
                        if twin is not None:
                            first, second = parts[g][a], parts[g][twin]
                            parts[g] = [e for e in parts[g] if e not in (first, second)]
                            parts[g].append(estimate(est_bins[first] + est_bins[second]))
                            merged = True
                            break
                total_p[g] = sum(est_p[e] for e in parts[g])
                total_e[g] = np.sum([est_e[e] for e in parts[g]], axis=0)
            level_set[key[g]] = g
            error[g] = np.abs(total_p[g] * pred[g] - total_e[g])

        # The bound of Lemma 14 from the final estimates.
        group_bound = 0.0
        for g in np.flatnonzero(alive):
            count = len(parts[g])
            group_bound = max(group_bound, float(np.max(error[g] + count * (alpha_p * pred[g] + alpha_e))))
        cell_bound = min(1.0, group_bound + beta / 6 + alpha_mu)
        order_p = check_order(self.p, "options.p")
        epsilon = cell_bound if math.isinf(order_p) else (2.0 * cell_bound ** (order_p - 1.0)) ** (1.0 / order_p)

        self.groups_ = [
            {"bins": high_codes[members[g]].tolist(), "value": [float(x) for x in pred[g]]}
            for g in np.flatnonzero(alive & patched)
        ]
        self.info_ = {
            "epsilon": float(epsilon),
            "cell_error_bound": float(cell_bound),
            "p": "inf" if math.isinf(order_p) else float(order_p),
            "lambda": lam,
            "delta": delta,
            "seed": int(self.seed),
            "pools": 1 + 2 * levels,
            "size_levels": levels,
            "rows_per_pool": float(m),
            "alpha": float(alpha_e),
            "alpha_mass": float(alpha_p),
            "alpha_bins": float(alpha_mu),
            "patch_threshold": float(beta / 2),
            "bin_mass_threshold": float(beta / 6),
            "bins_seen": n_bins,
            "high_mass_bins": n_high,
            "patched_groups": len(self.groups_),
            "patched_bins": int(sum(len(group["bins"]) for group in self.groups_)),
            "steps": steps,
            "converged": bool(converged),
        }
        self.info_ = {name: (None if isinstance(v, float) and not math.isfinite(v) else v) for name, v in self.info_.items()}

    @staticmethod
    def _plan(
        order: np.ndarray, ids: np.ndarray, weights: np.ndarray, n_bins: int, levels: int, k: int, log_v: float, delta: float
    ) -> dict[str, Any]:
        """The 1 + 2L pools, their accuracies, beta = 2 alpha_E, and B = {v : mu_hat_v >= beta / 6}."""
        count = 1 + 2 * levels
        pools = [order[q::count] for q in range(count)]
        m = min(effective_size(weights[rows]) for rows in pools)
        n_queries = 2**levels - 1
        alpha_e = query_accuracy(m, n_queries, k, delta / (3 * levels))
        alpha_p = query_accuracy(m, n_queries, 1, delta / (3 * levels))
        alpha_mu = mass_accuracy(effective_size(weights[pools[0]]), log_v, delta / 3)
        beta = 2.0 * alpha_e
        rows = pools[0]
        total = float(weights[rows].sum())
        mu = np.bincount(ids[rows], weights=weights[rows], minlength=n_bins) / total if total > 0 else np.zeros(n_bins)
        high = np.flatnonzero(mu >= beta / 6) if math.isfinite(beta) else np.empty(0, dtype=np.int64)
        return {"pools": pools, "rows_per_pool": m, "alpha_e": alpha_e, "alpha_p": alpha_p,
                "alpha_mu": alpha_mu, "beta": beta, "high": high}

    # -- predict --------------------------------------------------------------
    def _predict(self, scores: np.ndarray) -> np.ndarray:
        lam = int(self.lam)
        f = as_probabilities(scores, self.input)
        n, k = f.shape
        codes = round_codes(f, lam)
        out = canonical(codes, lam)
        if not self.groups_:
            return out
        patched_codes = np.array([row for group in self.groups_ for row in group["bins"]], dtype=np.int64).reshape(-1, k)
        group_of = np.repeat(np.arange(len(self.groups_)), [len(group["bins"]) for group in self.groups_])
        values = np.array([group["value"] for group in self.groups_], dtype=np.float64)
        # One numbering of the patched bins and the query's bins together.
        ids = bin_ids(np.vstack([patched_codes, codes]), lam)
        lookup = np.full(int(ids.max()) + 1, -1, dtype=np.int64)
        lookup[ids[: patched_codes.shape[0]]] = group_of
        group = lookup[ids[patched_codes.shape[0]:]]
        hit = group >= 0
        out[hit] = values[group[hit]]
        return out

    def fit_info(self) -> dict[str, Any]:
        return dict(self.info_)

    @classmethod
    def _from_state(cls, params: dict[str, Any], state: dict[str, Any]) -> LpPatchCalibrator:
        # The groups are a list of JSON objects, not an array.
        calibrator = cls(**params)
        calibrator.groups_ = [{"bins": [list(map(int, row)) for row in g["bins"]], "value": [float(x) for x in g["value"]]}
                              for g in state["groups_"]]
        calibrator.info_ = dict(state["info_"])
        calibrator.n_classes_ = 2
        return calibrator
