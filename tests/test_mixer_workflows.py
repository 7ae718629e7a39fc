"""MLP-Mixer through everything a ViT goes through: the released and timm
layouts load with the same logits, fine-tuning, a refusal of a new
resolution that says why, sharding rules for its two MLPs, few-shot sweeps
beside a ViT, export both ways, and `analyze` saying what a Mixer has none
of."""

import os
import subprocess
import sys

import flax
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from configs import fewshot as fewshot_configs
from configs import finetune
from tests.helpers import numpy_reference
from tests.helpers import processes
from tests.helpers import tiny_models
from vit_jax import inference
from vit_jax import models
from vit_jax import sharding
from vit_jax import weights
from vit_jax.config import defaults
from vit_jax.fewshot import sweep
from vit_jax.loop import trainer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mixer_config(gelu=True):
  config = defaults.get_model_config()
  config.variant, config.classifier, config.gelu_approximate = ("testing-mixer",
                                                                "gap", gelu)
  return config


def _released_mixer(tmp_path, num_classes=10):
  """A `testing-mixer` at 16 px with trained-like random weights, as a
  released-layout .npz; returns (path, model, params)."""
  model = tiny_models.build(_mixer_config(), num_classes)
  shapes = jax.eval_shape(model.init, jax.random.key(0),
                          jnp.zeros((1, 16, 16, 3)))["params"]
  params = numpy_reference.trained_like_params(shapes, seed=5)
  path = str(tmp_path / "mixer.npz")
  weights.save_npz(params, path)
  return path, model, params


def _images(size=16, batch=3):
  return np.random.default_rng(0).uniform(-1, 1, (batch, size, size, 3)).astype(
      np.float32)


def test_released_and_timm_layouts_load_with_the_same_logits(tmp_path):
  path, model, params = _released_mixer(tmp_path)
  timm_path = str(tmp_path / "mixer.safetensors")
  weights.save_timm(params, timm_path)
  want = np.asarray(model.apply({"params": params}, _images())[0])
  target = jax.eval_shape(model.init, jax.random.key(0),
                          jnp.zeros((1, 16, 16, 3)))["params"]
  for file, origin in ((path, "released"), (timm_path, "timm")):
    loaded, report = weights.load(file, target, num_prefix_tokens=0,
                                  grid=(4, 4))
    assert report.ok and report.origin == origin
    got = model.apply(
        {"params": flax.traverse_util.unflatten_dict(loaded, sep="/")},
        _images())[0]
    np.testing.assert_array_equal(np.asarray(got), want)
  for file in (path, timm_path):
    assert weights.read_architecture(file) == weights.Architecture(
        "testing-mixer", "gap", False, "learn", None, 10, 16)
  text = weights.describe_weights(path)
  assert "MixerBlock_1/token_mixing/Dense_0/kernel" in text


@pytest.mark.parametrize("k", [2, 3])
def test_at_k_times_the_resolution_it_starts_as_the_checkpoint_on_each_tile(
    tmp_path, k):
  """The Mixer paper's Supplementary C: K^2 copies of the token-mixing MLP,
  block-diagonal, one per K x K tile; every other layer works token by
  token, so the logits of a K x K mosaic are the mean of the checkpoint's
  logits of its tiles."""
  path, model, params = _released_mixer(tmp_path)
  config = _mixer_config()
  config.mixer_tiles = k
  wide = tiny_models.build(config, 10)
  target = models.param_shapes(wide, 16 * k)
  loaded, report = weights.load(path, target, num_prefix_tokens=0,
                                grid=(4 * k,) * 2)
  resized = {name: how for name, _, _, how in report.resized}
  assert len(resized) == 2 * 4 and all(
      "block-diagonal" in how for how in resized.values())
  tiles = _images(16, batch=k * k * 2).reshape(2, k, k, 16, 16, 3)
  mosaic = tiles.transpose(0, 1, 3, 2, 4, 5).reshape(2, 16 * k, 16 * k, 3)
  got = wide.apply(
      {"params": flax.traverse_util.unflatten_dict(loaded, sep="/")}, mosaic)[0]
  each = model.apply({"params": params}, tiles.reshape(-1, 16, 16, 3))[0]
  np.testing.assert_allclose(
      np.asarray(got),
      np.asarray(each).reshape(2, k * k, 10).mean(axis=1), atol=1e-5)


def test_a_vit_config_and_a_mixer_file_or_the_reverse_are_refused(tmp_path):
  path, _, _ = _released_mixer(tmp_path)
  config = defaults.get_config()
  config.model.variant, config.model.gelu_approximate = "testing", True
  target = models.param_shapes(tiny_models.build(config.model, 10), 16)
  with pytest.raises(
      weights.WeightsError, match="holds an MLP-Mixer but the "
      "config's model is a ViT"):
    weights.load(path, target, num_prefix_tokens=1, grid=(4, 4))
  with pytest.raises(Exception, match="is an MLP-Mixer: it pools by the mean"):
    config.model.variant = "testing-mixer"
    tiny_models.build(config.model, 10)  # classifier=token.


def test_sharding_rules_split_both_mlps_by_their_hidden_units():
  shapes = models.param_shapes(tiny_models.build(_mixer_config(), 10), 16)
  rules = defaults.get_config().sharding
  with rules.unlocked():
    rules.params = ((".*", "fsdp+tp"),)
    rules.fsdp_min_size = 0
  specs = sharding.param_partition_specs(shapes,
                                         sharding.make_mesh(data=2, model=4),
                                         rules)
  block = specs["MixerBlock_0"]
  # Token mixing: (tokens 16, hidden 8) -> hidden over `model`.
  assert block["token_mixing"]["Dense_0"]["kernel"] == P("data", "model")
  assert block["token_mixing"]["Dense_1"]["kernel"] == P("model", "data")
  assert block["channel_mixing"]["Dense_0"]["kernel"] == P("data", "model")
  assert block["channel_mixing"]["Dense_1"]["kernel"] == P("model", "data")


def test_fine_tune_sweep_export_and_analyze(tfds_data_dir, tmp_path):
  path, _, _ = _released_mixer(tmp_path)
  config = finetune.get_config("digits,runlocal")
  config.data_dir = tfds_data_dir
  config.model.variant, config.model.classifier = "testing-mixer", "gap"
  config.init.checkpoint = path
  config.total_steps = 3
  with pytest.raises(
      weights.WeightsError,
      match="token-mixing weights are sized by its number of "
      "patches: 16 in the file, 64 at the config's resolution. "
      "Fine-tune it at the file's resolution, or at K times it "
      "with config.model.mixer_tiles=K"):
    trainer.train_and_evaluate(config, str(tmp_path / "at32"))
  config.model.mixer_tiles = 2  # Twice the resolution: 2 x 2 tiles.
  workdir = str(tmp_path / "ft")
  result = trainer.train_and_evaluate(config, workdir)
  assert 0.0 <= result["test/accuracy"] <= 1.0

  loaded = inference.load(workdir)
  assert loaded.config.model.mixer_tiles == 2
  want = np.asarray(
      loaded.model.apply({"params": jax.device_get(loaded.params)},
                         _images(32))[0])
  for save, name in ((weights.save_npz, "m.npz"), (weights.save_timm,
                                                   "m.safetensors")):
    out = str(tmp_path / name)
    save(weights.released_params(workdir), out)
    # Its architecture read from the file (the widened token MLP says 2).
    assert weights.read_architecture(out).mixer_tiles == 2
    again = inference.load(out, config=loaded.config)  # timm's: erf GELU.
    got = again.model.apply({"params": jax.device_get(again.params)},
                            _images(32))[0]
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-6)

  vit = str(tmp_path / "vit.npz")
  vit_model = tiny_models.build(_vit_config(), 10)
  weights.save_npz(models.init_on_zeros(vit_model, jax.random.key(0), 16), vit)
  fewshot_config = fewshot_configs.get_config("runlocal")
  fewshot_config.data_dir = tfds_data_dir
  fewshot_config.image_size = 32
  table, _ = sweep.sweep(fewshot_config, [vit, workdir])
  assert set(table) == {vit, workdir}
  assert 0.0 <= table[workdir]["digits"]["5shot"] <= 1.0

  done = subprocess.run([
      sys.executable, "-m", "vit_jax", "analyze", f"--checkpoint={workdir}",
      "--num_images=4", f"--out={tmp_path / 'analysis'}"
  ], cwd=REPO, env=processes.command_env(), capture_output=True, text=True,
                        timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  said = done.stdout + done.stderr
  assert ("Not computed: mean attention distance and attention rollout: an "
          "MLP-Mixer has no attention") in said
  assert "an MLP-Mixer has no position embeddings" in said
  assert set(os.listdir(
      tmp_path / "analysis")) == {"embedding_filters.png", "analysis.json"}


def _vit_config():
  config = defaults.get_model_config()
  config.variant, config.gelu_approximate = "testing", True
  return config


def test_a_mixer_trains_with_fsdp_and_tensor_parallelism(
    digits_config, tmp_path):
  """Its parameters split over `data` (FSDP) and its MLPs' hidden units
  over `model`: the loss after 3 steps is the replicated run's."""
  config = digits_config
  config.model.variant, config.model.classifier = "testing-mixer", "gap"
  config.total_steps = 3
  replicated = trainer.train_and_evaluate(config, str(tmp_path / "r"))
  config.mesh.data, config.mesh.model = 4, 2
  config.sharding.params = ((".*", "fsdp+tp"),)
  config.sharding.fsdp_min_size = 0
  split = trainer.train_and_evaluate(config, str(tmp_path / "s"))
  np.testing.assert_allclose(split["train/loss"], replicated["train/loss"],
                             rtol=1e-4)
