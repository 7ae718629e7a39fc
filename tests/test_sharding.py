"""vit_jax/sharding.py: the mesh, batch shares, the rules that place each
parameter, the train state's shardings, and the FSDP gather (8 fake CPU
devices; see tests/test_steps.py for whole sharded steps against one
device)."""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import ml_collections
import numpy as np
import pytest

from vit_jax import models
from vit_jax import sharding
from vit_jax import weights
from vit_jax.performance import communication
from vit_jax.training import fsdp
from vit_jax.training import optim
from vit_jax.training import train_state


def _rules(params, fsdp_min_size=0):
  return ml_collections.ConfigDict(
      dict(
          params=params, fsdp_min_size=fsdp_min_size,
          logical_axis_rules=(("batch", "data"), ("heads", "model"),
                              ("mlp", "model"))))


def _abstract(tree):
  return jax.tree.map(lambda shape: jax.ShapeDtypeStruct(shape, np.float32),
                      tree, is_leaf=lambda x: isinstance(x, tuple))


BLOCK = {
    "MultiHeadDotProductAttention_1": {
        "query": {
            "kernel": (64, 4, 16)
        },
        "out": {
            "kernel": (4, 16, 64)
        }
    },
    "MlpBlock_3": {
        "Dense_0": {
            "kernel": (64, 256),
            "bias": (256,)
        }
    },
    "LayerNorm_0": {
        "scale": (64,)
    }
}


def test_mesh_sizes_fill_the_devices():
  assert dict(sharding.make_mesh().shape) == {"data": 8, "model": 1}
  assert dict(sharding.make_mesh(data=2, model=-1).shape) == {
      "data": 2,
      "model": 4
  }


def test_mesh_must_fit_the_devices():
  with pytest.raises(ValueError, match="does not fit 8 devices"):
    sharding.make_mesh(data=-1, model=3)


def test_one_slice_is_todays_mesh():
  """Devices of one slice: the (data, model) mesh JAX makes, as before."""
  today = jax.make_mesh((4, 2), ("data", "model"),
                        axis_types=(jax.sharding.AxisType.Auto,) * 2)
  for slices in (-1, 1):
    assert sharding.make_mesh(4, 2, slices=slices) == today
  assert sharding.batch_axes(today) == "data"
  assert sharding.batch_sharding(today).spec == P("data")


def test_two_slices_split_the_batch_across_them_and_the_rest_within():
  """In one process, slices=2 takes consecutive devices as each slice
  (several processes: whole processes; TPUs: their slice_index)."""
  mesh = sharding.make_mesh(-1, 2, slices=2)
  assert dict(mesh.shape) == {"slice": 2, "data": 2, "model": 2}
  assert [d.id for d in mesh.devices[1].flat] == [4, 5, 6, 7]
  assert sharding.batch_sharding(mesh).spec == P(("slice", "data"))
  assert sharding.data_shards(mesh) == 4
  with pytest.raises(ValueError, match="4 data shards of the mesh; use a "
                     "multiple of 4"):
    sharding.local_batch_size(6, mesh)
  # FSDP splits over a slice's `data` only: whole across slices.
  specs = sharding.param_partition_specs(_abstract({"w": (64, 256)}), mesh,
                                         _rules(((".*", "fsdp"),)))
  assert specs["w"] == P(None, "data")
  # The activations' batch dimension follows the batch over both axes.
  assert sharding.rules_on_mesh(
      (("batch", "data"), ("mlp", "model")),
      mesh) == (("batch", ("slice", "data")), ("mlp", "model"))
  # Or FSDP over every device, the slices stacked along `data`.
  across = sharding.make_mesh(-1, 2, slices=2, fsdp_over_slices=True)
  assert dict(across.shape) == {"data": 4, "model": 2}
  assert [d.id for d in across.devices[2:].flat] == [4, 5, 6, 7]


def test_tpu_devices_are_grouped_by_their_slice(monkeypatch):
  """libtpu's description of two v5e:2x2 slices (no TPU needed), on which
  jax.make_mesh refuses to build a mesh."""
  from jax.experimental import topologies
  for name, value in (("TPU_SKIP_MDS_QUERY", "1"), ("TPU_WORKER_HOSTNAMES",
                                                    "localhost"),
                      ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")):
    monkeypatch.setenv(name, value)
  devices = topologies.get_topology_desc(topology_name="v5e:2x2",
                                         platform="tpu", num_slices=2).devices
  mesh = sharding.make_mesh(devices=devices)
  assert dict(mesh.shape) == {"slice": 2, "data": 4, "model": 1}
  for index, row in enumerate(mesh.devices):
    assert {d.slice_index for d in row.flat} == {index}
  with pytest.raises(
      ValueError, match=r"^config.mesh.slices=3, but the 8 "
      r"devices lie on 2 slices; set config.mesh.slices=-1"):
    sharding.make_mesh(devices=devices, slices=3)


@pytest.mark.parametrize("slices, message", [
    (0, "config.mesh.slices=0: give the number of slices, or -1"),
    (3, "config.mesh.slices=3 does not divide the device count, 8"),
])
def test_a_slice_count_that_cannot_be_gets_one_line(slices, message):
  with pytest.raises(ValueError, match=message):
    sharding.make_mesh(slices=slices)


def test_mesh_from_config_must_fit_the_devices(digits_config):
  digits_config.mesh.model = 3
  with pytest.raises(ValueError, match="config.mesh"):
    sharding.mesh_from_config(digits_config)


@pytest.mark.parametrize("batch, accumulation, processes, message", [
    (12, 1, 1, "not divisible by the 8 data shards of the mesh; use a "
     "multiple of 8"),
    (16, 4, 1, "accum_steps=4 micro-batches over 8 data shards; use a "
     "multiple of 32"),
    (24, 1, 16, "not divisible by the 16 processes"),
])
def test_a_batch_that_does_not_split_says_the_multiple_to_use(
    batch, accumulation, processes, message):
  with pytest.raises(ValueError, match=message):
    sharding.local_batch_size(batch, sharding.make_mesh(),
                              accumulation=accumulation,
                              process_count=processes)


def test_each_process_reads_its_share_of_the_batch():
  mesh = sharding.make_mesh()
  assert sharding.local_batch_size(64, mesh, process_count=4) == 16
  assert sharding.local_batch_size(64, mesh, accumulation=2) == 64


def test_fsdp_splits_the_largest_divisible_dimension_of_large_parameters():
  specs = sharding.param_partition_specs(
      _abstract(BLOCK), sharding.make_mesh(),
      _rules(((".*", "fsdp"),), fsdp_min_size=200))
  attention = specs["MultiHeadDotProductAttention_1"]
  assert attention["query"]["kernel"] == P("data", None, None)  # 64 > 16 > 4
  assert attention["out"]["kernel"] == P(None, None, "data")
  assert specs["MlpBlock_3"]["Dense_0"]["kernel"] == P(None, "data")
  assert specs["MlpBlock_3"]["Dense_0"]["bias"] == P("data")  # 256 >= 200.
  assert specs["LayerNorm_0"]["scale"] == P(None)  # 64 < fsdp_min_size.


def test_tensor_parallelism_splits_heads_and_mlp_units_by_logical_axes():
  specs = sharding.param_partition_specs(_abstract(BLOCK),
                                         sharding.make_mesh(data=2, model=4),
                                         _rules(((".*", "fsdp+tp"),)))
  attention = specs["MultiHeadDotProductAttention_1"]
  assert attention["query"]["kernel"] == P("data", "model", None)
  assert attention["out"]["kernel"] == P("model", None, "data")
  assert specs["MlpBlock_3"]["Dense_0"]["kernel"] == P("data", "model")
  assert specs["LayerNorm_0"]["scale"] == P("data")  # No logical axes.


def test_fsdp_never_splits_the_scanned_layer_axis(digits_config):
  """A scan slices the leading layer axis of its parameters, so FSDP picks
  another dimension, or none, even where the layer count would divide."""
  abstract = {
      "Transformer": {
          "encoderblock": {
              "MlpBlock_3": {
                  "Dense_0": {
                      "bias": jax.ShapeDtypeStruct((8, 64), np.float32)
                  },
                  "Dense_1": {
                      "bias": jax.ShapeDtypeStruct((8, 3), np.float32)
                  }
              }
          }
      }
  }
  config = digits_config.sharding
  config.fsdp_min_size = 0
  specs = {}
  for strategy, model_axis in (("fsdp", 1), ("fsdp+tp", 4)):
    config.params = ((".*", strategy),)
    mlp = sharding.param_partition_specs(
        abstract, sharding.make_mesh(8 // model_axis, model_axis), config)
    mlp = mlp["Transformer"]["encoderblock"]["MlpBlock_3"]
    specs[strategy] = (mlp["Dense_0"]["bias"], mlp["Dense_1"]["bias"])
  assert specs["fsdp"] == (P(None, "data"), P(None, None))
  assert specs["fsdp+tp"] == (P(None, "model"), P(None, None))


@pytest.mark.parametrize("rules, mesh_shape, message", [
    (((".*/kernel", "fsdp"),), (8, 1), "matches no rule.*catch-all"),
    ((("head/.*", "fsdp"), ("heads/.*", "tp"), (".*", "replicate")),
     (8, 1), r"rules \[\('heads/\.\*', 'tp'\)\] match no parameter"),
    (((".*", "zero3"),), (8, 1), "strategy one of replicate, fsdp"),
    (((".*", "tp"),), (2, 4), "does not divide 2"),
])
def test_bad_sharding_rules_fail_before_the_first_step(digits_config, rules,
                                                       mesh_shape, message):
  digits_config.sharding.params = rules
  model = models.build_model(weights.decide(digits_config).model, 10)
  tx, _ = optim.make_optimizer(digits_config, 10)
  with pytest.raises(ValueError, match=message):
    train_state.create_train_state(model, tx, 16, 0,
                                   sharding.make_mesh(*mesh_shape),
                                   digits_config.sharding)


def test_optimizer_state_and_ema_follow_their_parameter(digits_config):
  digits_config.sharding.params = ((".*", "fsdp"),)
  digits_config.sharding.fsdp_min_size = 0
  model = models.build_model(weights.decide(digits_config).model, 10)
  tx, _ = optim.make_optimizer(digits_config, 10)
  _, shardings = train_state.abstract_train_state(
      model, tx, 16, sharding.make_mesh(), digits_config.sharding, ema=True)
  flat = lambda tree: jax.tree.leaves(jax.tree.map(lambda s: s.spec, tree))
  params = flat(shardings.params)
  assert any("data" in spec for spec in params)
  assert flat(shardings.ema_params) == params
  moments = [s for s in jax.tree.leaves(shardings.opt_state) if s.spec != P()]
  assert [s.spec for s in moments] == params * 2  # Adam's mu and nu.
  assert shardings.step.spec == P()


def test_the_fsdp_gather_is_exact_and_reduce_scatters_the_gradient():
  """On each device's share of the batch: the shard gathered whole, the
  loss averaged over the shares, and the gradient summed straight into
  each device's shard: a reduce-scatter, never an all-reduce of it."""
  mesh = sharding.make_mesh()
  shard = NamedSharding(mesh, P("data", None))
  p = jax.device_put(jnp.arange(64.0).reshape(16, 4), shard)
  batch = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("data")))

  def local_loss(params, batch, rng, frozen):
    del rng, frozen
    full = fsdp.gather_over_data(params, shard)
    return jnp.sum(full**2) * jnp.mean(batch), {"total": jnp.sum(full)}

  loss = fsdp.over_data_shards(local_loss, mesh, shard)
  step = jax.jit(jax.value_and_grad(loss, has_aux=True))
  (value, metrics), grad = step(p, batch, jax.random.key(0), ())
  squares = np.sum(np.arange(64.0)**2)
  np.testing.assert_allclose(value, squares * 3.5)  # The batch's mean.
  np.testing.assert_allclose(metrics["total"], np.sum(np.arange(64.0)))
  np.testing.assert_allclose(grad, 2 * 3.5 * np.arange(64.0).reshape(16, 4))
  assert grad.sharding.is_equivalent_to(shard, grad.ndim)
  text = step.lower(p, batch, jax.random.key(0), ()).compile().as_text()
  kinds = {
      c.kind: c.bytes_per_run
      for c in communication.collectives(text, dict(mesh.shape))
  }
  assert kinds["reduce-scatter"] == pytest.approx(7 / 8 * 64 * 4)
  assert kinds.get("all-reduce", 0) < 64  # Only the scalars averaged.
