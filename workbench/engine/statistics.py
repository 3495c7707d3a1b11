"""Statistics over many trials of one config, as RL results should be reported: the mean,
the interquartile mean (the mean of the middle half, robust to a few outlying seeds) and a
95% percentile-bootstrap interval of each (Agarwal et al., "Deep RL at the Edge of the
Statistical Precipice", 2021). Pure functions of numpy arrays."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

BOOTSTRAP_RESAMPLES = 2_000
CONFIDENCE = 0.95


def interquartile_mean(values: Sequence[float]) -> float:
    """The mean of the middle 50% of ``values``: ``floor(n/4)`` values are cut from each
    end (so fewer than four values are simply averaged)."""
    from scipy.stats import trim_mean

    array = np.asarray(values, np.float64)
    if array.size == 0:
        raise ValueError("interquartile_mean of no values")
    return float(trim_mean(array, 0.25))


def bootstrap_interval(values: Sequence[float], statistic: Callable[[np.ndarray], float],
                       *, resamples: int = BOOTSTRAP_RESAMPLES, confidence: float = CONFIDENCE,
                       seed: int = 0) -> tuple[float, float]:
    """A percentile-bootstrap interval of ``statistic`` over ``values`` (resampled with
    replacement ``resamples`` times, from a fixed ``seed`` so reports are reproducible).
    One value gives the point itself at both ends."""
    array = np.asarray(values, np.float64)
    if array.size == 0:
        raise ValueError("bootstrap_interval of no values")
    if array.size == 1:
        point = float(statistic(array))
        return point, point
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, array.size, size=(resamples, array.size))
    estimates = np.array([statistic(array[row]) for row in picks])
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(estimates, [tail, 1.0 - tail])
    return float(low), float(high)


def summarize(values: Sequence[float | None], *, seed: int = 0) -> dict:
    """``count``, ``missing`` (None entries: trials that never got there), ``mean``,
    ``iqm`` and the 95% bootstrap intervals ``mean_ci`` and ``iqm_ci`` of the rest."""
    present = [float(v) for v in values if v is not None and np.isfinite(v)]
    summary: dict = {"count": len(present), "missing": len(values) - len(present)}
    if not present:
        return {**summary, "mean": None, "iqm": None, "mean_ci": None, "iqm_ci": None}
    return {
        **summary,
        "mean": float(np.mean(present)),
        "iqm": interquartile_mean(present),
        "mean_ci": bootstrap_interval(present, np.mean, seed=seed),
        "iqm_ci": bootstrap_interval(present, interquartile_mean, seed=seed),
    }


def curve_band(curves: Sequence[Sequence[float]]) -> dict[str, list[float]]:
    """Per-point interquartile mean and the 25th/75th percentiles of several curves of
    equal length (NaN points, updates without a finished episode, are left out)."""
    stacked = np.asarray(curves, np.float64)
    if stacked.ndim != 2 or stacked.shape[0] == 0:
        return {"iqm": [], "low": [], "high": []}
    iqm, low, high = [], [], []
    for column in stacked.T:
        finite = column[np.isfinite(column)]
        if finite.size == 0:
            iqm.append(float("nan"))
            low.append(float("nan"))
            high.append(float("nan"))
            continue
        iqm.append(interquartile_mean(finite))
        q25, q75 = np.percentile(finite, [25, 75])
        low.append(float(q25))
        high.append(float(q75))
    return {"iqm": iqm, "low": low, "high": high}
