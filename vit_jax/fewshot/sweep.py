r"""Few-shot sweep: checkpoints x datasets x shots, as a table, JSON and CSV.

    python -m vit_jax.fewshot --config=configs/fewshot.py:digits \
        --checkpoints=workdirs/demo/pretrain,/tmp/digits16.npz \
        --datasets=digits --workdir=workdirs/fewshot

Each checkpoint (any format `config.init.checkpoint` reads) is loaded into
`config.model` without a head; the features of each dataset's train and test
splits are extracted once and reused for every shot count, seed and L2
strength. Writes WORKDIR/fewshot.json and fewshot.csv; prints the table
(mean accuracy over seeds; `full` is the linear probe on the whole train
split).
"""

import csv
import json
import os

from absl import logging
import ml_collections
import optax

from vit_jax import models, sharding, steps, weights
from vit_jax.evaluators import fewshot


def sweep(config: ml_collections.ConfigDict, checkpoints, datasets=None):
  """{checkpoint: {dataset: {'1shot': acc, ..., 'full': acc}}}."""
  if not checkpoints:
    raise ValueError("No checkpoints to evaluate; pass --checkpoints.")
  config = config.copy_and_resolve_references()
  if datasets:
    config.fewshot.datasets = tuple(datasets)
  mesh = sharding.mesh_from_config(config)
  model = models.build_model(config.model, num_classes=None)
  state, state_sharding = steps.create_train_state(
      model, optax.identity(), config.image_size, config.seed, mesh,
      config.sharding)
  evaluator = fewshot.FewShotEvaluator(model, config, mesh,
                                       state_sharding.params)
  table = {}
  for path in checkpoints:
    config.init.checkpoint = path
    params = weights.init_params(config, state.params, state_sharding.params)
    metrics = evaluator.run(params)
    table[path] = {}
    for key, value in metrics.items():
      dataset, _, column = key.rpartition("/")
      table[path].setdefault(dataset, {})[column] = value
    logging.info("Few-shot results of %s: %s", path, table[path])
  return table


def format_table(table, shots) -> str:
  columns = [f"{k}shot" for k in shots] + ["full"]
  rows = [(path, dataset, [cells[c] for c in columns])
          for path, by_dataset in table.items()
          for dataset, cells in by_dataset.items()]
  width = max(len(f"{p} | {d}") for p, d, _ in rows)
  lines = [f"{'checkpoint | dataset':<{width}}  " +
           "  ".join(f"{c:>7}" for c in columns)]
  lines += [f"{f'{p} | {d}':<{width}}  " +
            "  ".join(f"{100 * v:6.2f}%" for v in values)
            for p, d, values in rows]
  return "\n".join(lines)


def write(table, workdir: str):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "fewshot.json"), "w") as f:
    json.dump(table, f, indent=2)
  with open(os.path.join(workdir, "fewshot.csv"), "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["checkpoint", "dataset", "metric", "accuracy"])
    for path, by_dataset in table.items():
      for dataset, cells in by_dataset.items():
        for metric, value in cells.items():
          writer.writerow([path, dataset, metric, value])
