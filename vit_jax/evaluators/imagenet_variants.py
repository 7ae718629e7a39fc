"""ImageNet ReaL and ImageNet-v2 accuracy of an ImageNet model.

Both read other TFDS datasets with the ImageNet classes in the same order
(the sorted WordNet ids of `imagenet2012`), so the model's 1,000-class head
is scored as it is, with the config's evaluation preprocessing:

- `real` (config.real): the ImageNet validation images with the "Reassessed
  Labels" of Beyer et al. 2020 (`imagenet2012_real`, feature `real_label`, a
  set of classes per image). The top-1 class is correct when it is one of
  the image's ReaL labels; images whose set is empty are not counted.
  TFDS builds it from the ImageNet validation tar (the manual download of
  imagenet2012, found through config.manual_dir).
- `v2` (config.v2): ImageNet-v2 (Recht et al. 2019; `imagenet_v2`, by
  default its matched-frequency test set of 10,000 images).

They run as the `test` evaluator does: every config.eval_every_steps steps
(0: at the end only) and at the last step; metrics `real/accuracy`,
`v2/accuracy`, with their loss and image counts. ReaL's loss with
softmax_xent is the cross-entropy against the uniform distribution over the
image's ReaL labels (the multi-hot set divided by its size), so that it is
on the scale of test/loss; with sigmoid_xent, whose classes are separate
yes/no questions, it is against the multi-hot set itself.
"""

import jax.numpy as jnp

from vit_jax.data import input_pipeline
from vit_jax.data import sources
from vit_jax.errors import UserError
from vit_jax.evaluators import classification
from vit_jax.training import steps

REAL_DATASET = "imagenet2012_real"
REAL_LABELS = "real_label"
IMAGENET_CLASSES = 1000


def real_loss(loss: str):
  """The loss `loss` (a steps.LOSSES name) on ReaL's label sets; see the
  module doc."""
  loss_fn = steps.LOSSES[loss]
  if loss != "softmax_xent":
    return loss_fn

  def normalised(logits, labels):
    # An empty set stays all zeros (a loss of 0; the image is not counted).
    sizes = jnp.maximum(jnp.sum(labels, -1, keepdims=True), 1.0)
    return loss_fn(logits, labels / sizes)

  return normalised


def _evaluator(config, model, mesh, params_sharding, train_source, field,
               dataset, split, label_key=None, skip_unlabelled=False,
               loss_fn=None):
  if train_source.num_classes != IMAGENET_CLASSES:
    raise UserError(
        f"config.{field}.enabled scores the model's head on ImageNet's "
        f"{IMAGENET_CLASSES} classes, but {config.dataset} has "
        f"{train_source.num_classes}; turn it on only for an ImageNet model "
        "(e.g. configs/finetune.py:imagenet2012).")
  eval_config = config.copy_and_resolve_references()
  eval_config.dataset, eval_config.eval_split = dataset, split
  eval_config.cache = False  # Tens of thousands of decoded images.
  source = sources.TfdsSource(dataset, config.data_dir, config.manual_dir,
                              label_key=label_key)
  if source.num_classes != IMAGENET_CLASSES:
    raise UserError(f"config.{field}: {dataset} has {source.num_classes} "
                    f"classes, not ImageNet's {IMAGENET_CLASSES}.")
  return config.eval_every_steps, classification.ClassificationEvaluator(
      model, input_pipeline.make_eval_batches(eval_config, source), mesh,
      loss_fn or steps.LOSSES[config.loss], params_sharding,
      config.sharding.logical_axis_rules, skip_unlabelled=skip_unlabelled)


def real_from_config(config, model, mesh, params_sharding, source):
  """ReaL accuracy where config.real.enabled (supervised training)."""
  if not config.real.enabled or config.objective != "supervised":
    return None
  return _evaluator(config, model, mesh, params_sharding, source, "real",
                    REAL_DATASET, config.real.split, label_key=REAL_LABELS,
                    skip_unlabelled=True, loss_fn=real_loss(config.loss))


def v2_from_config(config, model, mesh, params_sharding, source):
  """ImageNet-v2 accuracy where config.v2.enabled (supervised training)."""
  if not config.v2.enabled or config.objective != "supervised":
    return None
  return _evaluator(config, model, mesh, params_sharding, source, "v2",
                    config.v2.dataset, config.v2.split)
