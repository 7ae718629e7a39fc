"""The paper's few-shot linear evaluation, solved in closed form.

Features of a few labelled images are standardised with that sample's mean
and standard deviation, a constant bias feature is appended, and ridge
regression maps them to targets 2*onehot - 1 ({-1, 1}^K); the prediction is
the argmax. One eigendecomposition of the smaller Gram matrix (N x N, the
dual form, when there are fewer examples than features; D x D, the primal
form, otherwise) serves every L2 strength of the sweep, and also gives each
strength's leave-one-out predictions on the sample, which pick the strength
(the sample is held out one example at a time; nothing else is used).

Pure jax.numpy (fp32 on the accelerator) or numpy (float64 on the host).
"""

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

DEFAULT_L2_GRID = tuple(2.0**p for p in range(-6, 13, 2))


@dataclasses.dataclass
class RidgeResult:
  l2_grid: tuple  # The strengths tried.
  test_accuracy: np.ndarray  # One per strength.
  loo_accuracy: np.ndarray  # Leave-one-out accuracy on the sample.
  chosen: int  # Index of the strength with the best leave-one-out accuracy.

  @property
  def accuracy(self) -> float:
    return float(self.test_accuracy[self.chosen])


def standardize(train_NxD, test_MxD, xp):
  mean = train_NxD.mean(axis=0, keepdims=True)
  std = train_NxD.std(axis=0, keepdims=True) + 1e-6
  with_bias = lambda x: xp.concatenate(
      [(x - mean) / std, xp.ones((x.shape[0], 1), x.dtype)], axis=1)
  return with_bias(train_NxD), with_bias(test_MxD)


def ridge_weights(x_NxD, y_NxK, l2: float, form: str = "auto", xp=jnp):
  """argmin_W |XW - Y|^2 + l2 |W|^2 directly, primal or dual (for tests)."""
  n, d = x_NxD.shape
  if form == "dual" or (form == "auto" and n < d):
    return x_NxD.T @ xp.linalg.solve(x_NxD @ x_NxD.T + l2 * xp.eye(n), y_NxK)
  return xp.linalg.solve(x_NxD.T @ x_NxD + l2 * xp.eye(d), x_NxD.T @ y_NxK)


def _sweep(x_NxD, y_NxK, test_MxD, l2_grid, xp):
  """Test scores and leave-one-out scores on the sample, per strength.

  Returns (G x M x K test scores, G x N x K leave-one-out scores).
  """
  n, d = x_NxD.shape
  if n <= d:  # Dual: K = X X^T = U diag(s) U^T; W = X^T U (s+l)^-1 U^T Y.
    s, u = xp.linalg.eigh(x_NxD @ x_NxD.T)
    s = xp.maximum(s, 0)
    uty = u.T @ y_NxK
    test_u = test_MxD @ x_NxD.T @ u  # M x N
    inv = 1.0 / (s[None, :] + xp.asarray(l2_grid)[:, None])  # G x N
    test = xp.einsum("mn,gn,nk->gmk", test_u, inv, uty)
    fit = xp.einsum("in,gn,nk->gik", u * s[None, :], inv, uty)
    hat = xp.einsum("in,gn->gi", u**2 * s[None, :], inv)
  else:  # Primal: X^T X = V diag(s) V^T; W = V (s+l)^-1 V^T X^T Y.
    s, v = xp.linalg.eigh(x_NxD.T @ x_NxD)
    s = xp.maximum(s, 0)
    vtxty = v.T @ (x_NxD.T @ y_NxK)
    xv, test_v = x_NxD @ v, test_MxD @ v
    inv = 1.0 / (s[None, :] + xp.asarray(l2_grid)[:, None])
    test = xp.einsum("md,gd,dk->gmk", test_v, inv, vtxty)
    fit = xp.einsum("id,gd,dk->gik", xv, inv, vtxty)
    hat = xp.einsum("id,gd->gi", xv**2, inv)
  # Leave-one-out: y_hat_-i = (y_hat_i - h_ii y_i) / (1 - h_ii).
  loo = (fit - hat[..., None] * y_NxK[None]) / (1.0 - hat[..., None])
  return test, loo


def fewshot_accuracy(train_NxD, train_labels_N, test_MxD, test_labels_M,
                     num_classes: int, l2_grid: Sequence[float] =
                     DEFAULT_L2_GRID, float64: bool = False) -> RidgeResult:
  """Fits on the sample for every strength; reports test accuracy of each."""
  xp = np if float64 else jnp
  dtype = np.float64 if float64 else jnp.float32
  train, test = standardize(xp.asarray(train_NxD, dtype),
                            xp.asarray(test_MxD, dtype), xp)
  targets = 2.0 * xp.asarray(np.eye(num_classes)[train_labels_N], dtype) - 1.0
  fn = _sweep if float64 else jax.jit(_sweep, static_argnums=(3, 4))
  test_scores, loo_scores = fn(train, targets, test, tuple(l2_grid), xp)
  test_acc = np.asarray(
      (xp.argmax(test_scores, -1) == xp.asarray(test_labels_M)[None]).mean(-1))
  loo_acc = np.asarray(
      (xp.argmax(loo_scores, -1) == xp.asarray(train_labels_N)[None]).mean(-1))
  # Ties go to the strongest regularisation (the last best in the grid).
  chosen = len(l2_grid) - 1 - int(np.argmax(loo_acc[::-1]))
  return RidgeResult(tuple(l2_grid), test_acc, loo_acc, chosen)


def sample_shots(labels_N: np.ndarray, shots: int, seed: int,
                 num_classes: int, on_too_few: str = "fail") -> np.ndarray:
  """Indices of `shots` random examples of every class (sorted by class).

  A class with fewer examples fails (naming it) or, with
  `on_too_few='skip'`, contributes all it has.
  """
  rng = np.random.default_rng(seed)
  chosen = []
  for c in range(num_classes):
    members = np.flatnonzero(labels_N == c)
    if len(members) < shots:
      if on_too_few != "skip":
        raise ValueError(
            f"Class {c} has {len(members)} training example(s), fewer than "
            f"{shots} shots; use fewer shots, a larger train split, or "
            "config.fewshot.on_too_few='skip' to use what there is.")
      chosen.append(members)
      continue
    chosen.append(rng.choice(members, shots, replace=False))
  return np.concatenate(chosen)


def run_protocol(train_NxD, train_labels_N, test_MxD, test_labels_M,
                 num_classes: int, shots: Sequence[int], seeds: int,
                 l2_grid: Sequence[float] = DEFAULT_L2_GRID,
                 on_too_few: str = "fail", float64: bool = False) -> dict:
  """Few-shot accuracies (mean and std over seeds) and the full-data probe.

  Returns {"{k}shot": mean, "{k}shot_std": std, ..., "full": accuracy}.
  """
  results = {}
  for k in shots:
    accuracies = []
    for seed in range(seeds):
      index = sample_shots(train_labels_N, k, seed, num_classes, on_too_few)
      accuracies.append(fewshot_accuracy(
          train_NxD[index], train_labels_N[index], test_MxD, test_labels_M,
          num_classes, l2_grid, float64).accuracy)
    results[f"{k}shot"] = float(np.mean(accuracies))
    results[f"{k}shot_std"] = float(np.std(accuracies))
  results["full"] = fewshot_accuracy(
      train_NxD, train_labels_N, test_MxD, test_labels_M, num_classes,
      l2_grid, float64).accuracy
  return results
