"""Inter-teacher agreement on 1-5 scores: Cohen's kappa (plain and weighted) and Spearman's rho, in numpy."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from keyshot.data_synth.labels import StoreContents

CATEGORIES = (1, 2, 3, 4, 5)


def cohen_kappa(a: Sequence[int], b: Sequence[int], weights: str | None = None) -> float:
    """Cohen's kappa of two raters over the 1-5 categories; ``weights`` None, "linear" or "quadratic".

    Returns nan for no pairs; 1.0 when both raters agree on everything, even on a single category.
    """
    if len(a) != len(b):
        raise ValueError(f"rater lists differ in length: {len(a)} vs {len(b)}")
    if not a:
        return math.nan
    k = len(CATEGORIES)
    index = {c: i for i, c in enumerate(CATEGORIES)}
    observed = np.zeros((k, k))
    for x, y in zip(a, b, strict=True):
        observed[index[x], index[y]] += 1
    observed /= observed.sum()
    expected = np.outer(observed.sum(axis=1), observed.sum(axis=0))
    i, j = np.indices((k, k))
    if weights is None:
        w = (i != j).astype(float)
    elif weights == "linear":
        w = np.abs(i - j) / (k - 1)
    elif weights == "quadratic":
        w = ((i - j) / (k - 1)) ** 2
    else:
        raise ValueError(f"unknown kappa weights {weights!r}; choose None, 'linear' or 'quadratic'")
    disagreement_expected = float((w * expected).sum())
    disagreement_observed = float((w * observed).sum())
    if disagreement_expected == 0:
        return 1.0 if disagreement_observed == 0 else math.nan
    return 1.0 - disagreement_observed / disagreement_expected


def _ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks 1..n with ties given their average rank."""
    arr = np.asarray(values, dtype=float)
    order = np.argsort(arr, kind="mergesort")
    ranks = np.empty(len(arr))
    sorted_vals = arr[order]
    start = 0
    for end in range(1, len(arr) + 1):
        if end == len(arr) or sorted_vals[end] != sorted_vals[start]:
            ranks[order[start:end]] = (start + end + 1) / 2
            start = end
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (Pearson on average ranks); nan when either side is constant."""
    if len(a) != len(b):
        raise ValueError(f"lists differ in length: {len(a)} vs {len(b)}")
    if len(a) < 2:
        return math.nan
    ra, rb = _ranks(a), _ranks(b)
    ra -= ra.mean()
    rb -= rb.mean()
    denom = math.sqrt(float((ra**2).sum() * (rb**2).sum()))
    return float((ra * rb).sum() / denom) if denom else math.nan


@dataclass
class PairAgreement:
    teacher_a: str
    teacher_b: str
    n: int
    exact: float
    kappa: float
    kappa_linear: float
    kappa_quadratic: float
    spearman: float


def pairwise_agreement(contents: StoreContents) -> list[PairAgreement]:
    """Agreement of every pair of teachers on the screenshots both labelled validly."""
    scores: dict[str, dict[tuple[str, int], int]] = {}
    for (uid, step, teacher), label in contents.labels.items():
        if label.valid and label.score in CATEGORIES:
            scores.setdefault(teacher, {})[(uid, step)] = label.score
    out = []
    for ta, tb in itertools.combinations(sorted(scores), 2):
        common = sorted(set(scores[ta]) & set(scores[tb]))
        a = [scores[ta][k] for k in common]
        b = [scores[tb][k] for k in common]
        out.append(
            PairAgreement(
                teacher_a=ta,
                teacher_b=tb,
                n=len(common),
                exact=sum(x == y for x, y in zip(a, b, strict=True)) / len(common) if common else math.nan,
                kappa=cohen_kappa(a, b),
                kappa_linear=cohen_kappa(a, b, "linear"),
                kappa_quadratic=cohen_kappa(a, b, "quadratic"),
                spearman=spearman(a, b),
            )
        )
    return out
