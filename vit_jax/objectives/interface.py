"""Objectives by name: `config.objective` names a registered `Objective`,
which holds everything the rest of the program asks of it.

An objective is one module that registers one value (`register`): the
package's own are this folder's modules; a user's is a module named in
config.imports, loaded before the config is checked. The step, the
trainer, the input pipeline, the plan and the benchmark ask the
objective; none of them branches on its name. docs/extending.md ("An
objective") has the checklist. Imports no TensorFlow.
"""

import dataclasses
import sys
from typing import Any
from typing import Callable
from typing import Optional

import flax.linen as nn
import ml_collections

from vit_jax import models
from vit_jax import weights
from vit_jax.errors import UserError
from vit_jax.training.losses import Loss
from vit_jax.training.losses import Sums
from vit_jax.training.losses import weighted_sums

__all__ = ["Carries", "Loss", "Objective", "Sums", "weighted_sums"]


@dataclasses.dataclass(frozen=True)
class Carries:
  """What a training batch holds besides its images and mask."""
  labels: bool = False  # One-hot (or multi-hot) `labels` of the classes.
  text: bool = False  # `text`: token ids of config.text's tokenizer.


class Objective:
  """What one objective trains, how, and with which words. A module
  subclasses it, overrides what differs, and `register`s an instance."""
  name: str = ""  # Its config.objective value.
  # Its model has a head of the data's classes (mixup, FlexiViT and a
  # labelled dataset need one).
  classifies: bool = False
  # The evaluator types that evaluate its runs (vit_jax/evaluators/): the
  # default entries of config.evals of these types run, the others do not.
  evaluators: tuple[str, ...] = ()
  # config fields only it reads: another objective with one of them away
  # from its default is refused, naming this one.
  own_fields: tuple[str, ...] = ()
  # `vit-jax benchmark --objective` times it on synthetic images.
  benchmarked: bool = False
  # The section of the config that holds its own fields (config.mae, ...).
  config_section: Optional[str] = None

  def check(self, config: ml_collections.ConfigDict):
    """Its config fields and what it cannot train, before compiling."""

  def config_section_of(self, config: ml_collections.ConfigDict):
    """Its own section of `config` as a dict (None: it has none)."""
    section = self.config_section
    return None if section is None else config[section].to_dict()

  def takes_sequences(self, config: ml_collections.ConfigDict) -> bool:
    """Whether it trains on images at their own shape (pipelines ending
    with patchify); else whole square images."""
    del config
    return False

  def decide(self, config: ml_collections.ConfigDict,
             resumed_workdir=None) -> ml_collections.ConfigDict:
    """What it settles before a model is built, after `weights.decide`."""
    del resumed_workdir
    return config

  def carries(self, config: ml_collections.ConfigDict) -> Carries:
    """What its training batches hold besides images."""
    del config
    return Carries()

  def model(self, config: ml_collections.ConfigDict,
            num_classes: Optional[int]) -> nn.Module:
    """The model it trains, of a decided config: the ViT with a head of
    `num_classes` where it classifies, else without one."""
    return models.build_model(config.model,
                              num_classes if self.classifies else None)

  def loss(self, config: ml_collections.ConfigDict, mesh=None) -> Loss:
    """What the step minimises; `mesh`: where the batch lies (None: one
    array), for a loss with collectives of its own."""
    raise NotImplementedError(f"The objective {self.name!r} has no loss.")

  def teachers(self, config: ml_collections.ConfigDict, mesh, num_classes: int,
               abstract: bool = False) -> tuple:
    """Frozen models its loss reads (training/teachers.py: `Teacher`),
    loaded on `mesh` (`abstract`: their shapes only, for a plan)."""
    del config, mesh, num_classes, abstract
    return ()

  def init(self, config: ml_collections.ConfigDict, checkpoint: str, params,
           params_sharding):
    """`params` (random init) with config.init.checkpoint's weights."""
    return weights.init_params(config, checkpoint, params, params_sharding)

  def keep(self, config: ml_collections.ConfigDict, workdir):
    """Writes what a run must keep beside its config.json (process 0)."""

  def forward_options(self, config: ml_collections.ConfigDict,
                      image_size: int) -> dict:
    """Keyword arguments of the model's forward in training that change
    its cost (MAE's masking), for counting its FLOPs."""
    del config, image_size
    return {}

  def describe(self, config: ml_collections.ConfigDict, num_classes: int,
               teachers: tuple = ()) -> str:
    """What a run learns, in a few words of the console's first line."""
    del config, num_classes, teachers
    return self.name


OBJECTIVES: dict[str, Objective] = {}


def register(objective: Objective) -> Objective:
  """Adds `objective` under its name; the same module loaded again (a
  user's, under another name) replaces its own entry."""
  if not objective.name:
    raise ValueError(f"{type(objective).__name__} has no name.")
  old = OBJECTIVES.get(objective.name)
  if old is not None and _origin(old) != _origin(objective):
    raise UserError(f"The objective {objective.name!r} is registered twice: "
                    f"by {type(old).__module__} and "
                    f"{type(objective).__module__}; rename one.")
  OBJECTIVES[objective.name] = objective
  return objective


def _origin(objective: Objective) -> tuple[str, str]:
  """Where its class is defined: the same for a user's module loaded
  again under another name."""
  cls = type(objective)
  module = sys.modules.get(cls.__module__)
  return (getattr(module, "__file__", None) or cls.__module__, cls.__qualname__)


def get(name: str) -> Objective:
  if name not in OBJECTIVES:
    raise UserError(f"config.objective={name!r} is not an objective; known: "
                    f"{', '.join(sorted(OBJECTIVES))} (a module of "
                    "config.imports may register more).")
  return OBJECTIVES[name]


def of(config: ml_collections.ConfigDict) -> Objective:
  """The config's objective."""
  return get(config.objective)


def evaluated_by(config: ml_collections.ConfigDict,
                 evaluator_type: str) -> Optional[str]:
  """None where the config's objective is evaluated by `evaluator_type`,
  else why not (an evaluator type's `skip`)."""
  objective = of(config)
  if evaluator_type in objective.evaluators:
    return None
  return (f"config.objective={objective.name!r} is evaluated by "
          f"{', '.join(objective.evaluators) or 'no built-in type'}, not "
          f"{evaluator_type}")


def names_where(test: Callable[[Objective], Any]) -> str:
  """The registered objectives for which `test` holds, as words."""
  return ", ".join(
      sorted(name for name, objective in OBJECTIVES.items() if test(objective)))
