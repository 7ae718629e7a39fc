"""What training learns: the objectives, each a value registered by name
(`interface.py`), and a config's objective put to work (`assembly.py`).

  supervised               the data's labels (config.loss)
  distill                  frozen teachers' predictions (function matching)
  masked_patch             the paper's masked patch prediction
  mae                      a masked autoencoder's pixels
  siglip, clip             image-text pairs, two towers

    objective = objectives.of(config)     # config.objective's
    model = objective.model(config, num_classes)
    step = objectives.train_step(config, model, tx, schedule, mesh, shardings)

A new one is a module that registers an `Objective` (in this folder, or a
user's named in config.imports): docs/extending.md, "An objective".
"""

from vit_jax.objectives import function_matching
from vit_jax.objectives import image_text_pairs
from vit_jax.objectives import masked_autoencoding
from vit_jax.objectives import masked_patch_prediction
from vit_jax.objectives import supervised
from vit_jax.objectives.assembly import abstract_batch
from vit_jax.objectives.assembly import check_config
from vit_jax.objectives.assembly import check_labels
from vit_jax.objectives.assembly import decide
from vit_jax.objectives.assembly import model
from vit_jax.objectives.assembly import train_step
from vit_jax.objectives.assembly import training_data
from vit_jax.objectives.interface import OBJECTIVES
from vit_jax.objectives.interface import Carries
from vit_jax.objectives.interface import Loss
from vit_jax.objectives.interface import Objective
from vit_jax.objectives.interface import Sums
from vit_jax.objectives.interface import evaluated_by
from vit_jax.objectives.interface import get
from vit_jax.objectives.interface import of
from vit_jax.objectives.interface import register
from vit_jax.objectives.interface import weighted_sums

__all__ = [
    "OBJECTIVES", "Carries", "Loss", "Objective", "Sums", "abstract_batch",
    "check_config", "check_labels", "decide", "evaluated_by", "get", "model",
    "of", "register", "train_step", "training_data", "weighted_sums",
    "function_matching", "image_text_pairs", "masked_autoencoding",
    "masked_patch_prediction", "supervised"
]
