"""The `fewshot` type of config.evals: few-shot linear accuracy of the
model's frozen features during training (the protocol and its solver:
`vit_jax/fewshot/`)."""

from vit_jax import objectives
from vit_jax.evaluators import registry
from vit_jax.fewshot import evaluator as fewshot_evaluator


def _skip(config, fields):
  if not fields["datasets"]:
    return "its datasets are empty"
  why = objectives.evaluated_by(config, "fewshot")
  if why and objectives.of(config).carries(config).text:
    return (f"{why}: an image-text run's model is two towers; sweep its "
            "image tower after training: `vit-jax fewshot "
            "--checkpoints=WORKDIR:img`")
  return why


@registry.register(
    "fewshot",
    fields={
        # Dataset names, or (name, train split, eval split) triples (see
        # vit_jax/fewshot/bundles.py); none: the entry does not run.
        "datasets": (),
    },
    skip=lambda config, fields: _skip(config, fields),
    # The datasets and splits are the entry's and the protocol's.
    reads=("pp", "batch_size", "data_dir", "manual_dir"),
    data_defaults=lambda config: {"pp": config.fewshot.pp_eval})
def make(entry: registry.Entry, context: registry.Context):
  """config.fewshot's protocol on the entry's datasets, preprocessed by its
  data.pp, else config.fewshot.pp_eval, else config.pp_eval."""
  config = context.config
  where = f"config.evals.{entry.name}.datasets"
  return fewshot_evaluator.FewShotEvaluator(
      context.model, config.fewshot,
      fewshot_evaluator.dataset_specs(entry.fields["datasets"], config.fewshot,
                                      entry.data, where), context.mesh,
      context.params_sharding, config.sharding.logical_axis_rules)
