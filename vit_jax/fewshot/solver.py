"""The paper's few-shot linear evaluation, solved in closed form.

The default is big_vision's published protocol (`evaluators/fewshot_lsr.py`),
so numbers compare with published few-shot tables: k examples per class are
sampled (nested: one permutation of each class per seed, its first k), their
features standardised with the sample's own mean and standard deviation
(+1e-5), a constant feature of 100 appended as the bias (so the bias is
almost unregularised), and ridge regression with a fixed L2 of 2^10 maps
them to targets 2*onehot - 1; the prediction is the argmax.

`l2_selection='loo'` instead picks the L2 from a grid by true leave-one-out
accuracy on the sample: each held-out example is predicted by the ridge
fitted on the other examples, standardised with their statistics alone, so
nothing of it leaks into its own prediction. An example whose class has no
other example in the sample cannot be predicted from the rest, so it is
never held out; a sample with one example per class (1-shot) has nothing to
hold out and uses the fixed L2, saying so.

Memory stays bounded at ImageNet scale: no N x K target matrix (per-class
sums instead), test scores in chunks, and every leave-one-out refit derived
from one D x D Gram matrix.
"""

import dataclasses
import functools
from typing import Optional
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.errors import UserError

BIAS_CONSTANT = 100.0  # big_vision's constant bias feature.
STD_EPS = 1e-5  # Added to the standard deviation of each feature.
FIXED_L2 = 2.0**10  # big_vision's l2_reg.
DEFAULT_L2_GRID = tuple(2.0**p for p in range(-6, 13, 2))
L2_SELECTIONS = ("fixed", "loo")
ON_TOO_FEW = ("fail", "skip")
_TEST_CHUNK = 1024  # Test rows scored at a time.
_REFIT_CHUNK = 8  # Leave-one-out refits computed at a time.


def check_config(fewshot) -> None:
  """Config-time checks of `config.fewshot` (before any feature is computed)."""
  choices = (("l2_selection", L2_SELECTIONS), ("on_too_few", ON_TOO_FEW))
  for field, allowed in choices:
    if fewshot[field] not in allowed:
      raise UserError(f"config.fewshot.{field}={fewshot[field]!r} is not one "
                      f"of {', '.join(allowed)}.")
  if fewshot.l2_reg <= 0 or not fewshot.l2_grid or min(fewshot.l2_grid) <= 0:
    raise UserError("config.fewshot.l2_reg and every value of "
                    "config.fewshot.l2_grid must be positive.")
  if fewshot.loo_max_heldout < 1:
    raise UserError("config.fewshot.loo_max_heldout must be at least 1.")


def _with_bias(z_NxD):
  return jnp.concatenate(
      [z_NxD, jnp.full((z_NxD.shape[0], 1), BIAS_CONSTANT, z_NxD.dtype)], 1)


def _transpose_times_targets(v_NxR, labels_N, num_classes: int):
  """v^T (2 onehot - 1), R x K, without the N x K target matrix."""
  per_class_KxR = jax.ops.segment_sum(v_NxR, labels_N, num_segments=num_classes)
  return 2.0 * per_class_KxR.T - v_NxR.sum(0)[:, None]


def _fit(x_NxD, labels_N, l2_G, num_classes: int):
  """(mean, std, ridge weights G x (D+1) x K), one per L2 strength.

  One eigendecomposition of the smaller Gram matrix serves every strength:
  (Z^T Z + l I)^-1 Z^T Y when N > D (primal), Z^T (Z Z^T + l I)^-1 Y else.
  """
  mean_D = x_NxD.mean(0)
  std_D = x_NxD.std(0) + STD_EPS
  z = _with_bias((x_NxD - mean_D) / std_D)
  n, d = z.shape
  if n > d:
    eigs, q = jnp.linalg.eigh(z.T @ z)
    lhs, rhs = q, q.T @ _transpose_times_targets(z, labels_N, num_classes)
  else:
    eigs, q = jnp.linalg.eigh(z @ z.T)
    lhs, rhs = z.T @ q, _transpose_times_targets(q, labels_N, num_classes)
  scale_GxR = 1.0 / (jnp.maximum(eigs, 0)[None] + l2_G[:, None])
  return mean_D, std_D, jnp.einsum("dr,gr,rk->gdk", lhs, scale_GxR, rhs)


def _count_correct(mean_D, std_D, w_GxDxK, x_MxD, labels_M):
  """Correct argmax predictions per strength, scoring the test in chunks."""
  m, d = x_MxD.shape
  chunk = min(_TEST_CHUNK, m)
  pad = -m % chunk
  x = jnp.pad(x_MxD, ((0, pad), (0, 0))).reshape(-1, chunk, d)
  labels = jnp.pad(labels_M, (0, pad), constant_values=-1).reshape(-1, chunk)

  def one_chunk(args):
    x_CxD, labels_C = args
    scores_GxCxK = jnp.einsum("cd,gdk->gck", _with_bias(
        (x_CxD - mean_D) / std_D), w_GxDxK)
    return jnp.sum(jnp.argmax(scores_GxCxK, -1) == labels_C[None], axis=1)

  return jax.lax.map(one_chunk, (x, labels)).sum(0)


@functools.partial(jax.jit, static_argnames="num_classes")
def _fit_and_count(x_NxD, labels_N, test_MxD, test_labels_M, l2_G, *,
                   num_classes: int):
  """Correct test predictions per L2 strength."""
  w = _fit(x_NxD, labels_N, l2_G, num_classes)
  return _count_correct(*w, test_MxD, test_labels_M)


@functools.partial(jax.jit, static_argnames="num_classes")
def _loo_correct(x_NxD, labels_N, heldout_H, l2_G, *, num_classes: int):
  """Correct leave-one-out predictions per L2 over the held-out examples.

  For held-out i, the other N-1 examples are standardised with their own
  mean and std. With X0 = X - mean (all N), their scatter matrix is
  G0 - N/(N-1) x0_i x0_i^T and their targets' cross term
  X0^T Y - x0_i y_i^T + x0_i (1^T Y - y_i)^T / (N-1); centred features
  make the bias decouple: its weight is 100 (1^T Y - y_i) / (100^2 (N-1) + l).
  So each refit costs one D x D eigendecomposition, whatever N is.
  """
  n = x_NxD.shape[0]
  x0 = x_NxD - x_NxD.mean(0)
  gram_DxD = x0.T @ x0
  cross_DxK = _transpose_times_targets(x0, labels_N, num_classes)
  target_sum_K = 2.0 * jnp.bincount(labels_N, length=num_classes) - n

  def refit(i):
    x0_i = x0[i]
    y_i = 2.0 * jax.nn.one_hot(labels_N[i], num_classes, dtype=x0.dtype) - 1
    scatter = gram_DxD - (n / (n - 1)) * jnp.outer(x0_i, x0_i)
    std_D = jnp.sqrt(jnp.maximum(jnp.diag(scatter), 0) / (n - 1)) + STD_EPS
    others_sum_K = target_sum_K - y_i
    cross = (cross_DxK - jnp.outer(x0_i, y_i) + jnp.outer(x0_i, others_sum_K) /
             (n - 1)) / std_D[:, None]
    eigs, q = jnp.linalg.eigh(scatter / jnp.outer(std_D, std_D))
    z_i = x0_i * (n / (n - 1)) / std_D  # x_i minus the others' mean, scaled.
    scale_GxR = 1.0 / (jnp.maximum(eigs, 0)[None] + l2_G[:, None])
    scores_GxK = jnp.einsum("r,gr,rk->gk", z_i @ q, scale_GxR, q.T @ cross)
    bias_GxK = BIAS_CONSTANT**2 * others_sum_K[None] / (BIAS_CONSTANT**2 *
                                                        (n - 1) + l2_G[:, None])
    return jnp.argmax(scores_GxK + bias_GxK, -1) == labels_N[i]

  return jax.lax.map(refit, heldout_H, batch_size=_REFIT_CHUNK).sum(0)


@dataclasses.dataclass
class RidgeResult:
  accuracy: float  # Test accuracy at the L2 used.
  l2: float  # The L2 used.
  loo_accuracy: Optional[np.ndarray] = None  # Per strength of the grid (loo).
  note: str = ""  # Why the requested selection was not used, if it was not.


def _run(fn, float64: bool, *args, num_classes: int):
  """`fn(*args)` in fp32 on the default device, or float64 on the host."""

  def call(float_dtype):

    def cast(array):
      floating = np.issubdtype(np.asarray(array).dtype, np.floating)
      return jnp.asarray(array, float_dtype if floating else jnp.int32)

    return np.asarray(fn(*map(cast, args), num_classes=num_classes))

  if not float64:
    return call(jnp.float32)
  with jax.enable_x64(True), jax.default_device(jax.devices("cpu")[0]):
    return call(jnp.float64)


def accuracy_per_l2(train_NxD, train_labels_N, test_MxD, test_labels_M,
                    num_classes: int, l2_grid: Sequence[float],
                    float64: bool = False) -> np.ndarray:
  """Test accuracy of the ridge fitted on the sample, per L2 strength."""
  correct = _run(_fit_and_count, float64, train_NxD,
                 train_labels_N, test_MxD, test_labels_M,
                 np.asarray(l2_grid, np.float64), num_classes=num_classes)
  return correct / len(test_labels_M)


def loo_accuracy(train_NxD, train_labels_N, num_classes: int,
                 l2_grid: Sequence[float], max_heldout: int = 256,
                 seed: int = 0, float64: bool = False) -> Optional[np.ndarray]:
  """True leave-one-out accuracy per L2, or None when nothing can be held out.

  Examples whose class has another example in the sample are eligible; at
  most `max_heldout` of them (a seeded random subset) are held out.
  """
  labels = np.asarray(train_labels_N)
  counts = np.bincount(labels, minlength=num_classes)
  eligible = np.flatnonzero(counts[labels] >= 2)
  if len(eligible) == 0:
    return None
  if len(eligible) > max_heldout:
    eligible = np.sort(
        np.random.default_rng(seed).choice(eligible, max_heldout,
                                           replace=False))
  correct = _run(_loo_correct, float64, train_NxD, labels, eligible,
                 np.asarray(l2_grid, np.float64), num_classes=num_classes)
  return correct / len(eligible)


def fewshot_accuracy(train_NxD, train_labels_N, test_MxD, test_labels_M,
                     num_classes: int, l2_selection: str = "fixed",
                     l2_reg: float = FIXED_L2,
                     l2_grid: Sequence[float] = DEFAULT_L2_GRID,
                     max_heldout: int = 256, float64: bool = False,
                     seed: int = 0) -> RidgeResult:
  """Fits the sample and measures test accuracy at the L2 the policy picks."""
  if l2_selection not in L2_SELECTIONS:
    raise UserError(f"config.fewshot.l2_selection={l2_selection!r} is not "
                    f"one of {', '.join(L2_SELECTIONS)}.")
  loo, note, l2 = None, "", l2_reg
  if l2_selection == "loo":
    loo = loo_accuracy(train_NxD, train_labels_N, num_classes, l2_grid,
                       max_heldout, seed, float64)
    if loo is None:
      note = (f"leave-one-out needs two examples of a class; used the fixed "
              f"L2 {l2_reg:g}")
    else:  # Ties go to the strongest regularisation (the last best).
      l2 = float(l2_grid[len(l2_grid) - 1 - int(np.argmax(loo[::-1]))])
  accuracy = accuracy_per_l2(train_NxD, train_labels_N, test_MxD, test_labels_M,
                             num_classes, (l2,), float64)[0]
  return RidgeResult(float(accuracy), l2, loo, note)


def sample_shots(labels_N: np.ndarray, shots: int, seed: int, num_classes: int,
                 on_too_few: str = "fail") -> np.ndarray:
  """Indices of `shots` random examples of every class (grouped by class).

  As big_vision samples: one permutation of each class's examples per seed,
  of which the first `shots` are taken, so a seed's 5-shot sample contains
  its 1-shot sample. A class with fewer examples fails (naming it) or, with
  `on_too_few='skip'`, contributes all it has.
  """
  if on_too_few not in ON_TOO_FEW:
    raise UserError(f"config.fewshot.on_too_few={on_too_few!r} is not one "
                    f"of {', '.join(ON_TOO_FEW)}.")
  rng = np.random.default_rng(seed)
  chosen = []
  for c in range(num_classes):
    members = rng.permutation(np.flatnonzero(labels_N == c))
    if len(members) < shots and on_too_few == "fail":
      raise UserError(
          f"Class {c} has {len(members)} training example(s), fewer than "
          f"{shots} shots; use fewer shots, a larger train split, or "
          "config.fewshot.on_too_few='skip' to use what there is.")
    chosen.append(members[:shots])
  return np.concatenate(chosen)


@dataclasses.dataclass(frozen=True)
class Protocol:
  """What `run_protocol` does (config.fewshot's fields, `of`)."""
  shots: Sequence[int]  # Examples per class of each few-shot problem.
  seeds: int  # Samples of each, averaged.
  l2_selection: str = "fixed"  # See `L2_SELECTIONS`.
  l2_reg: float = FIXED_L2
  l2_grid: Sequence[float] = DEFAULT_L2_GRID
  max_heldout: int = 256  # Leave-one-out's held-out examples at most.
  on_too_few: str = "fail"  # A class with fewer examples: fail or skip.
  float64: bool = False

  @classmethod
  def of(cls, fewshot) -> "Protocol":
    """The protocol of config.fewshot."""
    shots, l2_grid = tuple(fewshot.shots), tuple(fewshot.l2_grid)
    return cls(shots, fewshot.seeds, fewshot.l2_selection, fewshot.l2_reg,
               l2_grid, fewshot.loo_max_heldout, fewshot.on_too_few,
               fewshot.float64)


def run_protocol(train_NxD, train_labels_N, test_MxD, test_labels_M,
                 num_classes: int,
                 protocol: Protocol) -> tuple[dict, list[str]]:
  """Few-shot accuracies over seeds, and the linear probe on all of train.

  Returns ({"{k}shot": mean, "{k}shot_std": std, "{k}shot_l2": median L2
  used, ..., "full": accuracy, "full_l2": L2}, notes about the L2 choice).
  """
  policy = dict(l2_selection=protocol.l2_selection, l2_reg=protocol.l2_reg,
                l2_grid=protocol.l2_grid, max_heldout=protocol.max_heldout,
                float64=protocol.float64)
  results, notes = {}, []
  for k in protocol.shots:
    runs = []
    for seed in range(protocol.seeds):
      index = sample_shots(train_labels_N, k, seed, num_classes,
                           protocol.on_too_few)
      runs.append(
          fewshot_accuracy(train_NxD[index], train_labels_N[index], test_MxD,
                           test_labels_M, num_classes, seed=seed, **policy))
    results[f"{k}shot"] = float(np.mean([r.accuracy for r in runs]))
    results[f"{k}shot_std"] = float(np.std([r.accuracy for r in runs]))
    results[f"{k}shot_l2"] = float(np.median([r.l2 for r in runs]))
    notes += sorted({f"{k}shot: {r.note}" for r in runs if r.note})
  full = fewshot_accuracy(train_NxD, train_labels_N, test_MxD, test_labels_M,
                          num_classes, **policy)
  results["full"], results["full_l2"] = full.accuracy, full.l2
  if full.note:
    notes.append(f"full: {full.note}")
  return results, notes
