"""Few-shot linear accuracy of frozen representations (the paper's protocol).

For each dataset, features of its train and test splits are extracted once
per call of `run`, then every shot count, seed and L2 strength reuses them
(`vit_jax/fewshot/solver.py`). The protocol (shots, seeds, L2, layer) is
`config.fewshot`. Training runs it as a `fewshot` entry of config.evals, on
the entry's `datasets` with its `data`'s preprocessing and batch (see
`vit_jax/evaluators/fewshot_linear.py`); the sweep command runs it on
checkpoints, on config.fewshot.datasets.
"""

import dataclasses
import re

from absl import logging

from vit_jax import models
from vit_jax.data import input_pipeline
from vit_jax.data import sources
from vit_jax.data import specs
from vit_jax.errors import UserError
from vit_jax.fewshot import features
from vit_jax.fewshot import solver


def dataset_splits(datasets, train_split: str, eval_split: str,
                   where: str) -> list[tuple[str, str, str, str]]:
  """[(key, dataset, train split, eval split)] of `datasets`, whose entries
  are a name (with `train_split` / `eval_split`) or a (name, train split,
  eval split) triple. The key, which names the metrics, is the name without
  a TFDS version (`cars196:2.1.0` -> `cars196`)."""
  out = []
  for entry in datasets:
    if isinstance(entry, str):
      name, train, test = entry, train_split, eval_split
    elif (isinstance(entry, (tuple, list)) and len(entry) == 3 and
          all(isinstance(e, str) for e in entry)):
      name, train, test = entry
    else:
      raise UserError(
          f"{where} entry {entry!r} is neither a dataset name nor a (name, "
          "train split, eval split) triple such as ('uc_merced', "
          "'train[:1000]', 'train[1000:]').")
    key = re.sub(r"^(\w+):\d+(\.\d+)*$", r"\1", name)
    out.append((key, name, train, test))
  keys = [key for key, *_ in out]
  if len(set(keys)) != len(keys):
    raise UserError(f"{where} names a dataset twice: {keys}.")
  return out


def dataset_specs(datasets, protocol, base: specs.DataSpec, where: str):
  """[(key, train spec, test spec)]: `base` (preprocessing, batch, data
  dirs) with each dataset and its splits, not cached."""
  if not datasets:
    raise UserError(f"{where} is empty; name at least one dataset (a TFDS "
                    "name, folder:/path or digits).")
  out = []
  for key, name, train, test in dataset_splits(datasets, protocol.train_split,
                                               protocol.eval_split, where):
    one = dataclasses.replace(base, dataset=name, cache=False, label_key=None)
    out.append((key, dataclasses.replace(
        one, split=train), dataclasses.replace(one, split=test)))
  return out


class FewShotEvaluator:
  """`run(params) -> {'DATASET/Kshot': accuracy, ..., 'DATASET/full': ...}`."""

  def __init__(self, model, protocol, datasets, mesh, params_sharding,
               logical_axis_rules=()):
    """`protocol`: config.fewshot; `datasets`: `dataset_specs`'s."""
    solver.check_config(protocol)
    vit = models.vit_of(model)
    features.check_layer(protocol.layer, vit.size.num_layers,
                         vit.has_class_token)
    self._protocol = protocol
    self._mesh = mesh
    self._feature_fn = features.make_feature_fn(
        model, protocol.layer, mesh, params_sharding, logical_axis_rules)
    self._splits = {
        key: (sources.make_source(train), (train, test))
        for key, train, test in datasets
    }

  def dataset_features(self, params, name: str):
    """(train features, train labels, test features, test labels, classes)."""
    source, split_specs = self._splits[name]
    out = []
    for spec in split_specs:
      batches = input_pipeline.numpy_eval_batches(spec, source)
      out += features.extract(self._feature_fn, params, batches, self._mesh,
                              input_pipeline.num_eval_batches(spec, source),
                              f"{name} {spec.split}")
    return (*out, source.num_classes)

  def run_with_notes(self, params) -> tuple[dict[str, float], list[str]]:
    """(metrics, notes on the L2 choice, e.g. where loo fell back)."""
    metrics, notes = {}, []
    for name in self._splits:
      *arrays, num_classes = self.dataset_features(params, name)
      results, dataset_notes = solver.run_protocol(
          *arrays, num_classes, solver.Protocol.of(self._protocol))
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
        if k.endswith((f"/{max(self._protocol.shots)}shot", "/full"))
    ]
    return ", ".join(f"{k} {100 * metrics[k]:.2f}%" for k in shown)


def protocol_specs(config, datasets=None):
  """`dataset_specs` of config.fewshot's protocol on `datasets` (default:
  its own), read as the config's evaluation data with
  config.fewshot.pp_eval; the protocol checked first."""
  solver.check_config(config.fewshot)
  where = "--datasets" if datasets else "config.fewshot.datasets"
  base = specs.evaluation(config, {"pp": config.fewshot.pp_eval})
  return dataset_specs(tuple(datasets or config.fewshot.datasets),
                       config.fewshot, base, where)


def from_protocol(model, config, mesh, params_sharding,
                  datasets=None) -> FewShotEvaluator:
  """`protocol_specs`'s evaluation of `model`: what `vit-jax fewshot`
  sweeps."""
  return FewShotEvaluator(model, config.fewshot, protocol_specs(
      config, datasets), mesh, params_sharding,
                          config.sharding.logical_axis_rules)
