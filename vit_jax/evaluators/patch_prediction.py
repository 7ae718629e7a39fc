"""The self-supervised objectives' own losses on the eval split: masked
patch prediction's loss and per-patch accuracy on the corrupted patches,
MAE's reconstruction loss on the dropped ones (the `masked_patch` and
`mae` types of config.evals: `objective_loss.ObjectiveLossEvaluator`,
counting patches). Each evaluation corrupts (or masks) the same patches
of the same images (batch i's draw comes from the config's seed and i),
so evaluations at different steps compare; every image counts once
(padding is masked). Labels are not read.
"""

from vit_jax import objectives
from vit_jax.data import input_pipeline
from vit_jax.data import specs
from vit_jax.evaluators import registry
from vit_jax.evaluators.objective_loss import ObjectiveLossEvaluator


def _make(entry: registry.Entry, context: registry.Context, counted: str):
  config = context.config
  return ObjectiveLossEvaluator(
      context.model,
      input_pipeline.make_eval_batches(entry.data, context.source(
          entry.data), labels=False, collector=context.unreadable),
      context.mesh,
      objectives.of(config).loss(config, context.mesh), config.seed,
      context.params_sharding, config.sharding.logical_axis_rules, counted)


def _runs_on(evaluator_type: str):
  return lambda config, fields: objectives.evaluated_by(config, evaluator_type)


_READS = tuple(f for f in specs.DATA_FIELDS if f != "label_key")


@registry.register("masked_patch", skip=_runs_on("masked_patch"), reads=_READS)
def make(entry: registry.Entry, context: registry.Context):
  """Masked patch prediction's loss and per-patch accuracy on the entry's
  data."""
  return _make(entry, context, "corrupted patches")


@registry.register("mae", skip=_runs_on("mae"), reads=_READS)
def make_mae(entry: registry.Entry, context: registry.Context):
  """MAE's reconstruction loss (the training loss: the squared error on the
  dropped patches, normalised pixels as config.mae says) on the entry's
  data."""
  return _make(entry, context, "dropped patches")
