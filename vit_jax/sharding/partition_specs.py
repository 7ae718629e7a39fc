"""How parameters and optimizer state lie on the mesh.

Each parameter gets the strategy of the first `config.sharding.params` rule
whose regex matches its '/'-joined path:

  replicate  a full copy on every device;
  fsdp       its largest dimension divisible by the `data` axis is split
             over it (parameters under `fsdp_min_size` elements stay whole);
  tp         its logical axes (`models/partitioning.py`: attention heads,
             MLP hidden units) split over the mesh axes that
             `config.sharding.logical_axis_rules` names;
  fsdp+tp    both (fsdp takes the largest dimension tp left free).

Optimizer-state leaves follow the parameter they mirror. Parameters are
made on their shards (`random_params`, `abstract_params`). FSDP's gathering
is the training step's (`training/fsdp.py`).
"""

import re
from typing import Any
from typing import Sequence

import flax
import jax
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import ml_collections
import numpy as np

from vit_jax import models
from vit_jax.errors import UserError
from vit_jax.models import partitioning
from vit_jax.sharding.mesh import DATA_AXIS
from vit_jax.sharding.mesh import replicated

STRATEGIES = ("replicate", "fsdp", "tp", "fsdp+tp")


def check_strategy_rules(rules: Sequence[tuple[str, str]]):
  """Config-time check of `config.sharding.params` (no parameters needed)."""
  for rule in rules:
    if len(rule) != 2 or rule[1] not in STRATEGIES:
      raise UserError(
          f"config.sharding.params rule {rule!r} must be a pair (regex, "
          f"strategy) with strategy one of {', '.join(STRATEGIES)}.")
    re.compile(rule[0])


def _logical_to_mesh(rules) -> dict[str, str]:
  return {logical: mesh_axis for logical, mesh_axis in rules}


def param_partition_specs(abstract_params, mesh: Mesh,
                          sharding_config: ml_collections.ConfigDict):
  """A PartitionSpec per parameter from the config's rules (see module doc)."""
  rules = list(sharding_config.params)
  check_strategy_rules(rules)
  flat = flax.traverse_util.flatten_dict(abstract_params, sep="/")
  used = set()
  logical = _logical_to_mesh(sharding_config.logical_axis_rules)
  specs = {}
  for path, leaf in flat.items():
    index = next(
        (i for i, (regex, _) in enumerate(rules) if re.fullmatch(regex, path)),
        None)
    if index is None:
      raise UserError(
          f"Parameter {path} matches no rule of config.sharding.params "
          f"{rules}; add a catch-all rule such as ('.*', 'replicate').")
    used.add(index)
    specs[path] = _spec_for(path, leaf.shape, rules[index][1], mesh, logical,
                            sharding_config.fsdp_min_size)
  unused = [rules[i] for i in range(len(rules)) if i not in used]
  if unused:
    raise UserError(
        f"config.sharding.params rules {unused} match no parameter (names "
        f"look like {next(iter(flat))!r}); fix or remove them.")
  return flax.traverse_util.unflatten_dict(specs, sep="/")


def _spec_for(path: str, shape, strategy: str, mesh: Mesh,
              logical: dict[str, str], fsdp_min_size: int) -> P:
  spec: list[Any] = [None] * len(shape)
  if "tp" in strategy:
    names = partitioning.param_logical_axes(path, len(shape))
    for dim, name in enumerate(names):
      axis = logical.get(name)
      if axis is None or axis == DATA_AXIS or mesh.shape[axis] == 1:
        continue
      if shape[dim] % mesh.shape[axis]:
        raise UserError(
            f"Tensor parallelism splits dimension {dim} ({name}) of {path} "
            f"with shape {tuple(shape)} over the {mesh.shape[axis]} devices "
            f"of mesh axis {axis!r}, which does not divide {shape[dim]}; "
            "choose another config.mesh.model or use 'fsdp' for it.")
      spec[dim] = axis
  data = mesh.shape[DATA_AXIS]
  # A scan slices its parameters' leading layer axis: never split that one.
  first = 1 if partitioning.is_scanned_block(path) else 0
  if "fsdp" in strategy and data > 1 and np.prod(shape) >= fsdp_min_size:
    free = [
        d for d in range(first, len(shape))
        if spec[d] is None and shape[d] % data == 0
    ]
    if free:
      spec[max(free, key=lambda d: (shape[d], -d))] = DATA_AXIS
  return P(*spec)


def replicate_all() -> ml_collections.ConfigDict:
  """The sharding config that replicates every parameter (a plain DP run)."""
  return ml_collections.ConfigDict(
      dict(params=((".*", "replicate"),), fsdp_min_size=0,
           logical_axis_rules=()))


def with_shardings(abstract, shardings):
  """ShapeDtypeStructs that carry their shardings (what `jit` lowers for
  devices that need not be attached)."""
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract,
      shardings)


def init_keys(key) -> tuple[jax.Array, jax.Array]:
  """(parameters' key, dropout's key) of a run's key: one rule, so random
  parameters (`random_params`) and a train state's start alike."""
  params_key, dropout_key = jax.random.split(key)
  return params_key, dropout_key


def random_params(model, image_size: int, seed: int, mesh: Mesh,
                  sharding_config=None):
  """The model's parameters at random init (`seed`), made in place on their
  shards (no host copy), and their shardings (`sharding_config`'s rules;
  default: all replicated)."""
  init, shardings = _params_init(model, image_size, mesh, sharding_config)
  return jax.jit(init, out_shardings=shardings)(jax.random.key(seed)), shardings


def abstract_params(model, image_size: int, mesh: Mesh, sharding_config=None):
  """(the parameters' ShapeDtypeStructs, their shardings), as
  `random_params` would make them: nothing is computed."""
  init, shardings = _params_init(model, image_size, mesh, sharding_config)
  return with_shardings(jax.eval_shape(init, jax.random.key(0)),
                        shardings), shardings


def _params_init(model, image_size: int, mesh: Mesh, sharding_config):
  init = lambda key: models.init_on_zeros(model, init_keys(key)[0], image_size)
  specs = param_partition_specs(jax.eval_shape(init, jax.random.key(0)), mesh,
                                sharding_config or replicate_all())
  shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs,
                           is_leaf=lambda x: isinstance(x, P))
  return init, shardings


def state_shardings(abstract_state, abstract_params, param_specs, mesh: Mesh):
  """Shardings of the whole train state.

  Every leaf whose key path ends with a parameter's path and has its shape
  (params, EMA params, Adam moments, momentum) takes that parameter's spec;
  the rest (step, counts, RNG) is replicated.
  """
  specs = flax.traverse_util.flatten_dict(param_specs)
  by_path = {
      names: (tuple(leaf.shape), specs[names]) for names, leaf in
      flax.traverse_util.flatten_dict(abstract_params).items()
  }
  depths = sorted({len(k) for k in by_path})

  def leaf_sharding(key_path, leaf):
    names = partitioning.key_names(key_path)
    for depth in depths:
      match = by_path.get(names[-depth:])
      if match and match[0] == tuple(getattr(leaf, "shape", ())):
        return NamedSharding(mesh, match[1])
    return replicated(mesh)

  return jax.tree_util.tree_map_with_path(leaf_sharding, abstract_state)
