"""Masked patch prediction: corruption, targets, the loss, the model parts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from tests.helpers import tiny_models
from vit_jax import models
from vit_jax import objectives
from vit_jax import sharding
from vit_jax import weights
from vit_jax.config import defaults
from vit_jax.data import input_pipeline
from vit_jax.data import specs
from vit_jax.errors import UserError
from vit_jax.loop import checks
from vit_jax.models import masked_patch as mp
from vit_jax.objectives import masked_patch_prediction
from vit_jax.performance import planning
from vit_jax.training import optim
from vit_jax.training import steps
from vit_jax.training import train_state

MASKED_PARTS = {"mask_token"} | {
    f"masked_patch_head/{p}"
    for p in ("Dense_0/kernel", "Dense_0/bias", "LayerNorm_0/scale",
              "LayerNorm_0/bias", "Dense_1/kernel", "Dense_1/bias")
}
TINY = dict(hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1, patch_size=4)


def _mp_config(**overrides):
  config = defaults.get_config().masked_patch
  config.update(overrides)
  return config


def test_corruption_rates_and_split():
  """Exactly the rate's share of each image's patches is corrupted, every
  position equally often, split 80/10/10 into masked/replaced/kept."""
  batch, num = 4000, 16
  c = mp.sample_corruption(jax.random.key(0), batch, num)
  kind = np.asarray(c.kind_BxN)
  corrupted = kind != mp.UNTOUCHED
  np.testing.assert_array_equal(corrupted.sum(1), 8)  # Exactly half.
  np.testing.assert_allclose(corrupted.mean(0), 0.5, atol=0.03)  # Uniform.
  shares = [
      np.mean(kind[corrupted] == k) for k in (mp.MASKED, mp.REPLACED, mp.KEPT)
  ]
  np.testing.assert_allclose(shares, [0.8, 0.1, 0.1], atol=0.01)
  # BERT's 15% of 196 tokens (ViT-B/16 at 224 px): round(29.4) = 29.
  c = mp.sample_corruption(jax.random.key(1), 8, 196, corrupt_rate=0.15)
  np.testing.assert_array_equal(np.sum(np.asarray(c.corrupted_BxN), 1), 29)


def test_replacement_is_another_patch_of_the_same_image():
  batch, num = 2000, 5
  c = mp.sample_corruption(jax.random.key(2), batch, num)
  source = np.asarray(c.source_BxN)
  own = np.arange(num)[None, :]
  assert np.all(source != own) and source.min() >= 0 and source.max() < num
  # Uniform over the other four positions.
  for position in range(num):
    counts = np.bincount(source[:, position], minlength=num)
    assert counts[position] == 0
    np.testing.assert_allclose(
        np.delete(counts, position) / batch, 0.25, atol=0.04)


def test_corrupt_touches_only_corrupted_patches():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(3, 6, 4)), jnp.float32)
  mask_token = jnp.asarray([9.0, 8.0, 7.0, 6.0])
  kind = np.array([[0, 1, 2, 3, 0, 1]] * 3, np.int32)
  source = np.array([[1, 0, 5, 0, 0, 0]] * 3, np.int32)
  out = np.asarray(mp.corrupt(x, mask_token, mp.Corruption(kind, source)))
  x = np.asarray(x)
  for p, want in enumerate(
      [x[:, 0], mask_token, x[:, 5], x[:, 3], x[:, 4], mask_token]):
    np.testing.assert_array_equal(out[:, p], np.broadcast_to(want, (3, 4)))


def _color_image(colors_GxGx3, stride):
  """An image of flat patches: patch (i, j) has colour colors[i, j] (0..255)
  after value_range, as the pipeline gives it."""
  pixels = np.repeat(np.repeat(colors_GxGx3, stride, 0), stride, 1)
  return jnp.asarray(pixels[None] / 127.5 - 1.0, jnp.float32)


def test_a_flat_patch_maps_to_its_3_bit_colour_class():
  colors = np.array(
      [[[200, 30, 100], [255, 255, 255]], [[0, 0, 0], [31, 32, 224]]],
      np.float64)
  # Each channel's bin is floor(value / 255 * 8); the class is R*64+G*8+B.
  want = [6 * 64 + 0 * 8 + 3, 511, 0, 0 * 64 + 1 * 8 + 7]
  targets = mp.patch_targets(_color_image(colors, 4), (2, 2), "mean_color", 3,
                             4)
  np.testing.assert_array_equal(targets, [want])
  # With 1 bit per channel: 8 classes.
  targets = mp.patch_targets(_color_image(colors, 4), (2, 2), "mean_color", 1,
                             4)
  np.testing.assert_array_equal(targets, [[4 + 0 + 0, 7, 0, 1]])


def test_downsized_and_pixel_targets():
  rng = np.random.default_rng(0)
  images = jnp.asarray(rng.uniform(-1, 1, (2, 32, 32, 3)), jnp.float32)
  downsized = mp.patch_targets(images, (2, 2), "downsized", 3, 4)
  pixels = mp.patch_targets(images, (2, 2), "pixels_l2", 3, 4)
  # The paper's 16 x 16 patch: 4 x 4 cells of 512 classes; 256 x 3 values.
  assert downsized.shape == (2, 4, 16) and downsized.dtype == jnp.int32
  assert pixels.shape == (2, 4, 768)
  assert int(downsized.max()) < 512 and int(downsized.min()) >= 0
  # Patch 1 is the top-right one; its cell (1, 2) covers rows 4..7 and
  # columns 16+8..16+11; its pixel values in row-major order.
  cell = np.asarray(images)[0, 4:8, 24:28].mean((0, 1))
  want = mp.color_classes(jnp.asarray(cell), 3)
  assert int(downsized[0, 1, 1 * 4 + 2]) == int(want)
  np.testing.assert_array_equal(pixels[0, 1],
                                np.asarray(images)[0, :16, 16:].reshape(-1))
  assert mp.output_width("downsized", 16, 3, 4) == 16 * 512
  assert mp.output_width("pixels_l2", 16, 3, 4) == 768
  assert mp.output_width("mean_color", 16, 3, 4) == 512


@pytest.mark.parametrize("target", mp.TARGETS)
def test_loss_ignores_uncorrupted_patches(target):
  """Through the gradients: no prediction at an uncorrupted patch moves the
  loss; every corrupted one does. Changing the pixels (hence targets) of
  uncorrupted patches leaves the loss as it was."""
  config = _mp_config(target=target)
  width = mp.output_width(target, 4, 3, 4)
  rng = np.random.default_rng(0)
  images = jnp.asarray(rng.uniform(-1, 1, (2, 8, 8, 3)), jnp.float32)
  predictions = jnp.asarray(rng.normal(size=(2, 4, width)), jnp.float32)
  key = jax.random.key(5)
  corrupted = np.asarray(
      mp.sample_corruption(jax.random.split(key)[0], 2, 4).corrupted_BxN)
  assert corrupted.sum() == 4

  def loss(predictions, images):

    def apply(images, corruption, rngs):
      np.testing.assert_array_equal(corruption.corrupted_BxN, corrupted)
      return None, {"patch_predictions": predictions, "grid": (2, 2)}

    value, _ = masked_patch_prediction.prediction_loss(config, stride=4)(
        apply, {
            "image": images
        }, key)
    return value

  grads = np.abs(np.asarray(jax.grad(loss)(predictions, images))).sum(-1)
  assert np.all(grads[~corrupted] == 0) and np.all(grads[corrupted] > 0)
  untouched = np.repeat(np.repeat(~corrupted.reshape(2, 2, 2), 4, 1), 4, 2)
  changed = jnp.where(untouched[..., None], -images, images)
  np.testing.assert_allclose(loss(predictions, changed),
                             loss(predictions, images), rtol=1e-6)


def test_the_mask_token_and_patch_head_are_composed_around_the_vit():
  """The ViT has neither; `MaskedPatchViT` adds both beside the ViT's own
  parameters (the names of the checkpoints written before it existed)."""
  images = jnp.zeros((2, 16, 16, 3))
  plain = tiny_models.vit(num_classes=None, **TINY)
  model = mp.MaskedPatchViT(plain, 512)
  params = model.init(jax.random.key(0), images)["params"]
  plain_params = plain.init(jax.random.key(0), images)["params"]
  assert set(params) == set(plain_params) | {"mask_token", "masked_patch_head"}
  assert params["mask_token"].shape == (1, 1, 16)
  assert params["masked_patch_head"]["Dense_1"]["kernel"].shape == (16, 512)
  # Nothing corrupted equals no corruption; predictions per patch (not for
  # the class token).
  images = jnp.asarray(
      np.random.default_rng(0).uniform(-1, 1, images.shape), jnp.float32)
  nothing = mp.Corruption(jnp.zeros((2, 16), jnp.int32),
                          jnp.ones((2, 16), jnp.int32))
  _, out = model.apply({"params": params}, images)
  _, same = model.apply({"params": params}, images, corruption=nothing)
  np.testing.assert_array_equal(out["encoded"], same["encoded"])
  assert out["patch_predictions"].shape == (2, 16, 512)
  everything = mp.Corruption(jnp.ones((2, 16), jnp.int32), nothing.source_BxN)
  _, masked = model.apply({"params": params}, images, corruption=everything)
  # Every patch is the [mask] token: the images no longer matter.
  _, other = model.apply({"params": params}, -images, corruption=everything)
  np.testing.assert_allclose(masked["encoded"], other["encoded"], atol=1e-6)
  # Without a corruption the ViT inside computes what the ViT alone does.
  vit_params = {k: v for k, v in params.items() if k in plain_params}
  _, alone = plain.apply({"params": vit_params}, images)
  np.testing.assert_array_equal(out["encoded"], alone["encoded"])


def test_masked_patch_step_is_the_same_on_8_devices(selfsup_config):
  """The corruption is drawn for the global batch, so sharding the batch
  over 8 devices changes nothing."""
  config = selfsup_config
  config.optimizer, config.lr, config.warmup_steps = "sgd", 0.1, 0
  source = input_pipeline.make_source(specs.training(config))
  batches = input_pipeline.make_train_iterator(specs.training(config), source,
                                               labels=False)
  batches = [next(batches) for _ in range(2)]
  model = objectives.model(objectives.decide(config), None)
  tx, schedule = optim.make_optimizer(config, config.total_steps)
  results = []
  for devices in (jax.devices()[:1], jax.devices()):
    mesh = sharding.make_mesh(devices=devices)
    state, state_sharding = train_state.create_train_state(
        model, tx, 16, 0, mesh)
    step = steps.jit_train_step(
        steps.make_train_step(model, tx,
                              objectives.of(config).loss(config), schedule,
                              mesh), state_sharding, mesh)
    losses = []
    for batch in batches:
      state, metrics = step(state, sharding.to_global_batch(batch, mesh))
      losses.append((float(metrics["loss"]), float(metrics["accuracy"])))
    results.append((losses, jax.device_get(state.params)))
  np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(results[0][1]), jax.tree.leaves(
      results[1][1])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("field, value, message", [
    ("objective", "byol", "objective='byol' is not an objective; known: clip, "
     "distill, mae"),
    ("masked_patch.target", "hog", "target='hog' is not one of mean_color"),
    ("masked_patch.corrupt_rate", 0.0, r"corrupt_rate=0.0 must be in \(0, 1\]"),
    ("masked_patch.replace_rate", 0.3, "mask_rate \\+ replace_rate = 1.1"),
    ("masked_patch.color_bits", 8, "color_bits=8 must be in 1..5"),
    ("masked_patch.downsized_size", 3, "does not divide the 4-pixel patches"),
    ("pp_eval", "resize", "pp_eval='resize' must end with value_range"),
    ("image_size", 4, "gives one patch"),
    ("model.variant", "testing-hybrid", "does not take the hybrid"),
    ("model.classifier", "map", "never trains"),
    ("model.representation_size", 16, "never trains"),
])
def test_bad_masked_patch_config_fails_before_compiling(selfsup_config, field,
                                                        value, message):
  config = selfsup_config
  if field == "masked_patch.downsized_size":
    config.masked_patch.target = "downsized"
  section, _, name = field.rpartition(".")
  (config[section] if section else config)[name] = value
  with pytest.raises(UserError, match=message):
    checks.check_config(config, sharding.make_mesh())


def test_plan_compiles_the_masked_patch_step(selfsup_config):
  """No labels and no number of classes are needed to plan it."""
  config = selfsup_config
  config.dataset = "a_dataset_nobody_prepared"
  r = planning.plan(config, "cpu:8")
  model = objectives.model(objectives.decide(config), None)
  assert r["params"] == sum(
      x.size for x in jax.tree.leaves(models.param_shapes(model, 16)))
  assert r["flops_per_step"] > 0


def test_released_weights_start_self_supervised_pre_training(
    selfsup_config, tmp_path):
  """A supervised file loads into the masked-patch model with its [mask]
  token and patch head new; a masked-patch file exports to timm without
  them (timm's model computes the same features)."""
  config = selfsup_config
  supervised = models.build_model(weights.decide(config).model, 10)
  path = str(tmp_path / "supervised.npz")
  weights.save_npz(models.init_on_zeros(supervised, jax.random.key(0), 16),
                   path)
  model = objectives.model(objectives.decide(config), None)
  params = models.param_shapes(model, 16)
  _, report = weights.load_for_config(config, path, params)
  assert {name for name, _ in report.reinitialised} == MASKED_PARTS
  assert {name for name, _ in report.dropped} == {"head/kernel", "head/bias"}
  timm_path = str(tmp_path / "timm.safetensors")
  left_out = weights.save_timm(
      models.init_on_zeros(model, jax.random.key(0), 16), timm_path)
  assert set(left_out) == MASKED_PARTS
  timm = safetensors.numpy.load_file(timm_path)
  assert "blocks.1.mlp.fc2.bias" in timm and not any("mask" in k for k in timm)


@pytest.mark.parametrize("arg", [
    "jft", "jft,dataset=folder:/data/raw,"
    "target=downsized,variant=ViT-L/16", "digits,target=pixels_l2"
])
def test_presets_pass_the_config_checks(arg):
  from configs import selfsup
  config = selfsup.get_config(arg)
  assert config.objective == "masked_patch"
  checks.check_config(config, sharding.make_mesh())


def test_masked_patch_step_without_class_token_and_with_accumulation(
    selfsup_config):
  """classifier=gap (every token is a patch) and two micro-batches, each
  with its own corruption: the step averages the objective's metrics too
  (with the zero-initialised head the loss is ln(512) in each)."""
  selfsup_config.model.classifier = "gap"
  selfsup_config.accum_steps = 2
  checks.check_config(selfsup_config, sharding.make_mesh())
  model = objectives.model(objectives.decide(selfsup_config), None)
  tx, schedule = optim.make_optimizer(selfsup_config, 10)
  mesh = sharding.make_mesh()
  state, state_sharding = train_state.create_train_state(model, tx, 16, 0, mesh)
  step = objectives.train_step(selfsup_config, model, tx, schedule, mesh,
                               state_sharding)
  images = np.random.default_rng(0).uniform(-1, 1, (16, 16, 16, 3))
  _, metrics = step(
      state, sharding.to_global_batch({"image": images.astype(np.float32)},
                                      mesh))
  assert abs(float(metrics["loss"]) - np.log(512)) < 1e-4  # Zero head.
  assert 0.0 <= float(metrics["accuracy"]) <= 1.0
  _, out = model.apply(
      {"params": models.init_on_zeros(model, jax.random.key(0), 16)},
      jnp.zeros((2, 16, 16, 3)))
  assert out["patch_predictions"].shape == (2, 16, 512)


def test_a_model_run_at_another_patch_size_predicts_its_own_patches():
  """config.model.patch_size (FlexiViT's run patch size) sets the grid the
  head predicts and the objective cuts: 2-pixel patches of a 4-pixel
  variant. Every patch corrupted and the head at zero, the pixels_l2 loss
  is the mean square of the images."""
  from configs import selfsup
  config = selfsup.get_config("digits,runlocal,target=pixels_l2")
  config.model.patch_size = 2
  config.masked_patch.corrupt_rate = 1.0
  checks.check_config(config, sharding.make_mesh())
  model = objectives.model(objectives.decide(config), None)
  params = models.init_on_zeros(model, jax.random.key(0), 16)
  images = np.random.default_rng(0).uniform(-1, 1, (2, 16, 16, 3))
  objective = objectives.of(config).loss(config)
  apply = lambda x, **kw: model.apply({"params": params}, x, **kw)
  loss, _ = jax.jit(objective, static_argnums=0)(apply, {
      "image": jnp.asarray(images, jnp.float32)
  }, jax.random.key(1))
  np.testing.assert_allclose(loss, np.mean(images**2), rtol=1e-5)
  _, out = apply(jnp.zeros((2, 16, 16, 3)))
  assert out["patch_predictions"].shape == (2, 64, 2 * 2 * 3)
