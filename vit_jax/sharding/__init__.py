"""Devices, and how batches, parameters and optimizer state lie on them:
the mesh, batches split over it and functions jitted on it (`mesh.py`);
the parameters' partition specs by strategy, and parameters made on their
shards (`partition_specs.py`). FSDP's gathering inside the step is the
training step's (`vit_jax/training/fsdp.py`).
"""

from vit_jax.sharding.mesh import DATA_AXIS
from vit_jax.sharding.mesh import MODEL_AXIS
from vit_jax.sharding.mesh import SLICE_AXIS
from vit_jax.sharding.mesh import batch_axes
from vit_jax.sharding.mesh import batch_sharding
from vit_jax.sharding.mesh import data_shards
from vit_jax.sharding.mesh import jit_on_mesh
from vit_jax.sharding.mesh import local_batch_size
from vit_jax.sharding.mesh import make_mesh
from vit_jax.sharding.mesh import mesh_from_config
from vit_jax.sharding.mesh import replicated
from vit_jax.sharding.mesh import rules_on_mesh
from vit_jax.sharding.mesh import slice_groups
from vit_jax.sharding.mesh import to_global_batch
from vit_jax.sharding.partition_specs import STRATEGIES
from vit_jax.sharding.partition_specs import abstract_params
from vit_jax.sharding.partition_specs import check_strategy_rules
from vit_jax.sharding.partition_specs import init_keys
from vit_jax.sharding.partition_specs import param_partition_specs
from vit_jax.sharding.partition_specs import random_params
from vit_jax.sharding.partition_specs import replicate_all
from vit_jax.sharding.partition_specs import state_shardings
from vit_jax.sharding.partition_specs import with_shardings

__all__ = [
    "DATA_AXIS", "MODEL_AXIS", "SLICE_AXIS", "batch_axes", "batch_sharding",
    "data_shards", "jit_on_mesh", "local_batch_size", "make_mesh",
    "mesh_from_config", "replicated", "rules_on_mesh", "slice_groups",
    "to_global_batch", "STRATEGIES", "abstract_params", "check_strategy_rules",
    "init_keys", "param_partition_specs", "random_params", "replicate_all",
    "state_shardings", "with_shardings"
]
