r"""Few-shot sweep: checkpoints x datasets x shots, as a table, JSON and CSV.

    vit-jax fewshot --config=configs/fewshot.py:digits \
        --checkpoints=workdirs/demo/pretrain,/tmp/digits16.npz \
        --datasets=digits --workdir=workdirs/fewshot

Each checkpoint (any format `config.init.checkpoint` reads, or `random`:
`config.model` at random init with `config.seed`, the baseline a learnt
representation should beat) is loaded without a head into the model it holds
(its variant, pooling, class token and position embeddings read from the file,
the rest of `config.model` kept), so a SigLIP image tower (`FILE:img`) is swept
beside a ViT; the features of each dataset's train and test splits are
extracted once and reused for every shot count, seed and L2 strength. Writes
WORKDIR/fewshot.json and fewshot.csv; prints the table (mean accuracy over
seeds; `full` is the linear probe on the whole train split).
"""

import csv
import io
import json

from absl import logging
import ml_collections

from vit_jax import models
from vit_jax import paths
from vit_jax import sharding
from vit_jax import weights
from vit_jax.errors import UserError
from vit_jax.fewshot import evaluator as fewshot_evaluator

# The checkpoint name of the config's model at random init (a path of that
# name is given as ./random).
RANDOM_INIT = "random"


def sweep(config: ml_collections.ConfigDict, checkpoints, datasets=None):
  """({checkpoint: {dataset: {'1shot': acc, ..., 'full': acc}}}, notes).

  Each checkpoint is read with the GELU of its origin unless
  `config.model.gelu_approximate` says otherwise (see weights.decide);
  `RANDOM_INIT` is the model initialised with `config.seed`.
  """
  if not checkpoints:
    raise UserError("No checkpoints to evaluate; pass --checkpoints.")
  models.check_image_size(config.model, config.image_size, "config.image_size")
  fewshot_evaluator.protocol_specs(config, datasets)  # Before compiling.
  mesh = sharding.mesh_from_config(config)
  by_model = {}  # Model config -> (model, its shapes, shardings, evaluator).
  table, notes = {}, []
  for path in checkpoints:
    random_init = path == RANDOM_INIT
    path_config = weights.decide(
        config if random_init else with_model_of(config, path),
        checkpoint=None if random_init else path)
    key = path_config.model.to_json()
    if key not in by_model:
      model = models.build_model(path_config.model, num_classes=None)
      abstract, params_sharding = sharding.abstract_params(
          model, config.image_size, mesh, config.sharding)
      by_model[key] = (model, abstract, params_sharding,
                       fewshot_evaluator.from_protocol(
                           model, config, mesh, params_sharding, datasets))
    model, abstract, params_sharding, evaluator = by_model[key]
    # Initialised only for `random`, or where a file lacks a parameter.
    random_params = lambda m=model: sharding.random_params(
        m, config.image_size, config.seed, mesh, config.sharding)[0]
    params = random_params() if random_init else weights.init_params(
        path_config, path, abstract, params_sharding, fill=random_params)
    metrics, path_notes = evaluator.run_with_notes(params)
    notes += [f"{path}: {note}" for note in path_notes]
    table[path] = {}
    for key, value in metrics.items():
      dataset, _, column = key.rpartition("/")
      table[path].setdefault(dataset, {})[column] = value
    logging.info("Few-shot results of %s: %s", path, table[path])
  return table, notes


def with_model_of(config: ml_collections.ConfigDict,
                  path: str) -> ml_collections.ConfigDict:
  """`config` with the model the checkpoint at `path` holds."""
  arch = weights.read_architecture(path, cache_dir=config.init.cache_dir)
  config = config.copy_and_resolve_references()
  config.model.update(arch.model_fields())
  models.check_image_size(config.model, config.image_size,
                          f"config.image_size (for {path})")
  return config


def describe_protocol(fewshot_config) -> str:
  """One line saying how the numbers below were computed."""
  if fewshot_config.l2_selection == "fixed":
    l2 = f"fixed L2 {fewshot_config.l2_reg:g} (big_vision's published protocol)"
  else:
    l2 = ("L2 by leave-one-out on each sample from "
          f"{{{', '.join(f'{v:g}' for v in fewshot_config.l2_grid)}}}")
  return (f"Few-shot linear regression on {fewshot_config.layer}: {l2}; "
          f"mean over {fewshot_config.seeds} seeds.")


def format_table(table, shots) -> str:
  columns = [f"{k}shot" for k in shots] + ["full"]
  rows = [(path, dataset, [cells[c]
                           for c in columns])
          for path, by_dataset in table.items()
          for dataset, cells in by_dataset.items()]
  width = max(len(f"{p} | {d}") for p, d, _ in rows)
  lines = [
      f"{'checkpoint | dataset':<{width}}  " +
      "  ".join(f"{c:>7}" for c in columns)
  ]
  lines += [
      f"{f'{p} | {d}':<{width}}  " + "  ".join(f"{100 * v:6.2f}%"
                                               for v in values)
      for p, d, values in rows
  ]
  return "\n".join(lines)


def write(table, workdir: str):
  """WORKDIR/fewshot.json and fewshot.csv (WORKDIR local or a URL)."""
  directory = paths.make_workdir(workdir)
  (directory / paths.FEWSHOT_TABLE).write_text(json.dumps(table, indent=2))
  rows = io.StringIO()
  writer = csv.writer(rows)
  writer.writerow(["checkpoint", "dataset", "metric", "value"])
  for path, by_dataset in table.items():
    for dataset, cells in by_dataset.items():
      for metric, value in cells.items():
        writer.writerow([path, dataset, metric, value])
  (directory / paths.FEWSHOT_CSV).write_text(rows.getvalue())
