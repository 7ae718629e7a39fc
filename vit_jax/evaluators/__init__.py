"""Evaluators: plug-ins the training loop runs the same way.

An evaluator has `run(params) -> {metric: value}` and `summary(metrics) ->
str` (its console line). `EVALUATORS` maps a name to a factory
`(config, model, mesh, params_sharding, source) -> (every_steps, evaluator)`,
or None where the config leaves it off. The loop runs each one every
`every_steps` steps (0: only at the end) and at the last step, and writes its
metrics as `NAME/metric` scalars.
"""

from vit_jax.evaluators import classification
from vit_jax.evaluators import imagenet_variants
from vit_jax.evaluators import patch_prediction
from vit_jax.fewshot import evaluator as fewshot_evaluator

EVALUATORS = {
    "test": classification.from_config,  # Accuracy and loss on eval_split.
    # Self-supervised: per-patch accuracy and loss on eval_split.
    "masked_patch": patch_prediction.from_config,
    "fewshot": fewshot_evaluator.from_config,  # config.fewshot's protocol.
    # An ImageNet model on ImageNet ReaL labels (config.real) and on
    # ImageNet-v2 (config.v2).
    "real": imagenet_variants.real_from_config,
    "v2": imagenet_variants.v2_from_config,
}


def from_config(config, model, mesh, params_sharding, source):
  """[(name, every_steps, evaluator)] for those the config turns on."""
  made = []
  for name, factory in EVALUATORS.items():
    entry = factory(config, model, mesh, params_sharding, source)
    if entry is not None:
      made.append((name, *entry))
  return made
