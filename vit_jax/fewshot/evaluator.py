"""Few-shot linear accuracy of frozen representations (the paper's protocol).

For each dataset of `config.fewshot.datasets`, features of its train and
test splits are extracted once per call of `run`, then every shot count,
seed and L2 strength reuses them (`vit_jax/fewshot/solver.py`). Training
runs it as the `fewshot` evaluator (see `vit_jax/evaluators/__init__.py`);
the sweep command runs it on checkpoints.
"""

import re

from absl import logging
import ml_collections

from vit_jax.data import input_pipeline
from vit_jax.errors import UserError
from vit_jax.fewshot import features
from vit_jax.fewshot import solver


def dataset_splits(fewshot) -> list[tuple[str, str, str, str]]:
  """[(key, dataset, train split, eval split)] of `fewshot.datasets`, whose
  entries are a name (with `fewshot.train_split` / `eval_split`) or a
  (name, train split, eval split) triple. The key, which names the metrics,
  is the name without a TFDS version (`cars196:2.1.0` -> `cars196`)."""
  out = []
  for entry in fewshot.datasets:
    if isinstance(entry, str):
      name, train, test = entry, fewshot.train_split, fewshot.eval_split
    elif (isinstance(entry, (tuple, list)) and len(entry) == 3 and
          all(isinstance(e, str) for e in entry)):
      name, train, test = entry
    else:
      raise UserError(
          f"config.fewshot.datasets entry {entry!r} is neither a dataset name "
          "nor a (name, train split, eval split) triple such as "
          "('uc_merced', 'train[:1000]', 'train[1000:]').")
    key = re.sub(r"^(\w+):\d+(\.\d+)*$", r"\1", name)
    out.append((key, name, train, test))
  keys = [key for key, *_ in out]
  if len(set(keys)) != len(keys):
    raise UserError(f"config.fewshot.datasets names a dataset twice: {keys}.")
  return out


class FewShotEvaluator:
  """`run(params) -> {'DATASET/Kshot': accuracy, ..., 'DATASET/full': ...}`."""

  def __init__(self, model, config: ml_collections.ConfigDict, mesh,
               params_sharding):
    fewshot = config.fewshot
    if not fewshot.datasets:
      raise UserError("config.fewshot.datasets is empty; name at least one "
                      "dataset (a TFDS name, folder:/path or digits).")
    solver.check_config(fewshot)
    features.check_layer(fewshot.layer, model.num_layers)
    self._config = config
    self._mesh = mesh
    self._feature_fn = features.make_feature_fn(
        model, fewshot.layer, mesh, params_sharding,
        config.sharding.logical_axis_rules)
    self._splits = {}
    for key, name, train_split, eval_split in dataset_splits(fewshot):
      split_configs = []
      for split in (train_split, eval_split):
        split_config = config.copy_and_resolve_references()
        split_config.dataset, split_config.eval_split = name, split
        split_config.pp_eval = fewshot.pp_eval or config.pp_eval
        split_config.cache = False
        split_configs.append(split_config)
      source = input_pipeline.make_source(split_configs[0])
      self._splits[key] = (source, split_configs)

  def dataset_features(self, params, name: str):
    """(train features, train labels, test features, test labels, classes)."""
    source, split_configs = self._splits[name]
    out = []
    for split_config in split_configs:
      batches = input_pipeline.make_eval_dataset(split_config, source)
      out += features.extract(
          self._feature_fn, params, batches.as_numpy_iterator(), self._mesh,
          input_pipeline.num_eval_batches(split_config, source),
          f"{name} {split_config.eval_split}")
    return (*out, source.num_classes)

  def run_with_notes(self, params) -> tuple[dict[str, float], list[str]]:
    """(metrics, notes on the L2 choice, e.g. where loo fell back)."""
    fewshot = self._config.fewshot
    metrics, notes = {}, []
    for name in self._splits:
      *arrays, num_classes = self.dataset_features(params, name)
      results, dataset_notes = solver.run_protocol(
          *arrays, num_classes, fewshot.shots, fewshot.seeds,
          l2_selection=fewshot.l2_selection, l2_reg=fewshot.l2_reg,
          l2_grid=fewshot.l2_grid, max_heldout=fewshot.loo_max_heldout,
          on_too_few=fewshot.on_too_few, float64=fewshot.float64)
      metrics.update({f"{name}/{k}": v for k, v in results.items()})
      notes += [f"{name} {note}" for note in dataset_notes]
    return metrics, notes

  def run(self, params) -> dict[str, float]:
    metrics, notes = self.run_with_notes(params)
    for note in notes:
      logging.info("Few-shot: %s.", note)
    return metrics

  def summary(self, metrics) -> str:
    """The console line: the largest shot count and the full probe."""
    shown = [
        k for k in metrics
        if k.endswith((f"/{max(self._config.fewshot.shots)}shot", "/full"))
    ]
    return ", ".join(f"{k} {100 * metrics[k]:.2f}%" for k in shown)


def from_config(config, model, mesh, params_sharding, source):
  """(every_steps, evaluator) when config.fewshot.every_steps is set."""
  del source  # Few-shot reads its own datasets.
  if not config.fewshot.every_steps:
    return None
  return config.fewshot.every_steps, FewShotEvaluator(model, config, mesh,
                                                      params_sharding)
