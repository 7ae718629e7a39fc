"""The update step: sharding and gradient accumulation do not change it."""

import os
import subprocess
import sys

import flax
import jax
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from tests.helpers import tiny_models
from vit_jax import sharding
from vit_jax import weights
from vit_jax.data import input_pipeline
from vit_jax.data import specs
from vit_jax.objectives import supervised
from vit_jax.training import losses
from vit_jax.training import optim
from vit_jax.training import steps
from vit_jax.training import train_state


@pytest.fixture
def setup(digits_config):
  """A tiny model, SGD and three real digits batches of 32.

  SGD keeps updates linear in the gradients. (Adam divides by the gradient's
  scale, which turns float noise in exactly-zero gradients, such as the
  attention key bias's, into lr-sized updates.)
  """
  digits_config.model.dropout_rate = 0.0
  digits_config.optimizer = "sgd"
  digits_config.lr = 0.1
  source = input_pipeline.make_source(specs.training(digits_config))
  batches = input_pipeline.make_train_iterator(specs.training(digits_config),
                                               source)
  batches = [next(batches) for _ in range(3)]
  model = tiny_models.build(
      weights.decide(digits_config).model, source.num_classes)
  tx, schedule = optim.make_optimizer(digits_config, 3)
  return digits_config, model, tx, schedule, batches


def jitted_step(model, tx, schedule, state_sharding, mesh, sharding_config,
                accum_steps=1):
  """The supervised train step, jitted with the state's shardings as the
  trainer does."""
  return steps.jit_train_step(
      steps.make_train_step(model, tx,
                            supervised.classification_loss(
                                losses.softmax_xent), schedule, mesh,
                            accum_steps, params_sharding=state_sharding.params,
                            fp8_sharding=state_sharding.fp8), state_sharding,
      mesh, sharding_config.logical_axis_rules)


def _train(setup, mesh, accum_steps=1, sharding_config=None, keep_state=None):
  config, model, tx, schedule, batches = setup
  sharding_config = sharding_config or config.sharding
  state, state_sharding = train_state.create_train_state(
      model, tx, config.image_size, config.seed, mesh, sharding_config)
  step = jitted_step(model, tx, schedule, state_sharding, mesh, sharding_config,
                     accum_steps)
  losses = []
  for batch in batches:
    state, metrics = step(state, sharding.to_global_batch(batch, mesh))
    losses.append(float(metrics["loss"]))
  if keep_state is not None:
    keep_state.append(state)
  return losses, jax.device_get(state.params)


def _assert_trees_close(a, b, rtol=1e-5, atol=1e-6):
  jax.tree.map(
      lambda x, y: np.testing.assert_allclose(x, y, rtol=rtol, atol=atol), a, b)


# (mesh data, mesh model, strategy, {param path: expected spec}).
LAYOUTS = {
    "data-parallel": (8, 1, "replicate", {
        "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel": P()
    }),
    "fsdp": (8, 1, "fsdp", {
        "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel": P(None, "data"),
        "Transformer/encoderblock_1/MultiHeadDotProductAttention_1/query/kernel":
            P("data", None, None)
    }),
    "tensor-parallel": (4, 2, "tp", {
        "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel": P(
            None, "model"),
        "Transformer/encoderblock_0/MlpBlock_3/Dense_1/kernel": P(
            "model", None),
        "Transformer/encoderblock_1/MultiHeadDotProductAttention_1/out/kernel":
            P("model", None, None)
    }),
    "fsdp+tp": (4, 2, "fsdp+tp", {
        "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel": P(
            "data", "model"),
        "Transformer/encoderblock_1/MultiHeadDotProductAttention_1/key/kernel":
            P("data", "model", None)
    }),
    # Two slices of 4 devices (config.mesh.slices=2): the batch split across
    # them, FSDP and TP inside each, the parameters whole across `slice`.
    "two-slices-fsdp+tp": (2, 2, "fsdp+tp", {
        "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel": P(
            "data", "model"),
        "Transformer/encoderblock_0/LayerNorm_0/scale": P("data")
    }, 2),
}


def _sharded_state_after_training_like_one_device(setup, layout):
  """Trains on one device, then with `layout`; asserts the same losses and
  parameters and returns the sharded run's final state."""
  data, model_axis, strategy, _, *slices = LAYOUTS[layout]
  config = setup[0]
  one_losses, one_params = _train(setup,
                                  sharding.make_mesh(devices=jax.devices()[:1]))
  config.sharding.params = ((".*", strategy),)
  config.sharding.fsdp_min_size = 0
  states = []
  mesh = sharding.make_mesh(data, model_axis, slices=(slices or [-1])[0])
  losses, params = _train(setup, mesh, keep_state=states)
  np.testing.assert_allclose(one_losses, losses, rtol=1e-5)
  _assert_trees_close(one_params, params)
  return states[0]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sharded_layouts_equal_single_device(setup, layout):
  state = _sharded_state_after_training_like_one_device(setup, layout)
  # The layout is really the one asked for, for params and optimizer state.
  flat = flax.traverse_util.flatten_dict(state.params, sep="/")
  momentum = flax.traverse_util.flatten_dict(state.opt_state[-2].trace, sep="/")
  padded = lambda spec, ndim: tuple(spec) + (None,) * (ndim - len(spec))
  for path, spec in LAYOUTS[layout][3].items():
    for tree in (flat, momentum):
      ndim = tree[path].ndim
      assert padded(tree[path].sharding.spec, ndim) == padded(spec, ndim), path


@pytest.mark.parametrize("layout", ["fsdp", "fsdp+tp"])
def test_fsdp_with_scanned_layers_equals_single_device(setup, layout):
  """With FSDP the scanned blocks gather their own weights (per layer, inside
  the scan): the same training as one device. The leading layer axis, which
  the scan slices, is never split. Under FSDP and TP, the blocks are
  EVA-02's and RoPE-Mixed's (learned RoPE frequencies, SwiGLU with its
  LayerNorm, the heads' LayerNorm), SwiGLU's gate split as the MLP is."""
  config, model, *rest = setup
  form = dict(scan_layers=True)
  if layout == "fsdp+tp":
    form.update(posemb="none", rope="mixed", rope_layout="interleaved",
                swiglu=True, mlp_norm=True, attention_norm=True)
  scanned = (config, tiny_models.with_form(model, **form), *rest)
  state = _sharded_state_after_training_like_one_device(scanned, layout)
  blocks = state.params["Transformer"]["encoderblock"]
  specs = [tuple(p.sharding.spec) for p in jax.tree.leaves(blocks)]
  assert all(not spec or spec[0] is None for spec in specs), specs
  assert any("data" in spec for spec in specs)
  if layout == "fsdp+tp":
    assert tuple(
        blocks["MlpBlock_3"]["Gate"]["kernel"].sharding.spec) == (None, "data",
                                                                  "model")
    assert "rope_frequencies" in blocks["MultiHeadDotProductAttention_1"]


@pytest.mark.parametrize("devices", [1, 8])
def test_gradient_accumulation_equals_the_big_batch(setup, devices):
  mesh = sharding.make_mesh(devices=jax.devices()[:devices])
  big_losses, big_params = _train(setup, mesh)
  acc_losses, acc_params = _train(setup, mesh, accum_steps=4)
  np.testing.assert_allclose(big_losses, acc_losses, rtol=1e-5)
  _assert_trees_close(big_params, acc_params)


def test_gradient_accumulation_under_fsdp_equals_the_big_batch(setup):
  """The accumulated gradients are held sharded as the parameters."""
  big_losses, big_params = _train(setup,
                                  sharding.make_mesh(devices=jax.devices()[:1]))
  config = setup[0]
  config.sharding.params = ((".*", "fsdp"),)
  config.sharding.fsdp_min_size = 0
  acc_losses, acc_params = _train(setup, sharding.make_mesh(8, 1),
                                  accum_steps=2)
  np.testing.assert_allclose(big_losses, acc_losses, rtol=1e-5)
  _assert_trees_close(big_params, acc_params)


def test_core_modules_import_no_tensorflow():
  """The model, the step, the benchmark and the default config run where
  TensorFlow is absent."""
  code = ("import sys; import vit_jax.models, vit_jax.training.steps, "
          "vit_jax.training.optim, vit_jax.performance.speed, "
          "vit_jax.data.handover, vit_jax.config.defaults; "
          "vit_jax.config.defaults.get_config(); "
          "assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  done = subprocess.run([sys.executable, "-c", code], cwd=repo,
                        capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr[-2000:]


def test_the_step_knows_no_parameter_names_of_the_model():
  """The FSDP per-block gather asks `models/scan.py` for the model's
  repeated blocks, so the train step names none itself."""
  with open(steps.__file__) as f:
    source = f.read()
  assert "Transformer" not in source and "encoderblock" not in source
