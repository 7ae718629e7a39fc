"""The checkpoints of big_vision: plain ViTs (sincos2d or learned position
embeddings, with or without a class token, tok / gap / map, with or without
pre-logits, looped or scanned), SigLIP's image tower out of a two-tower
file, and FlexiViT's PI-resize of the patch embedding.

Files are written in big_vision's layout from a model's random parameters
(its names: top-level `pos_embedding` without the class token's entry,
current-Flax block names, `params/` and for SigLIP `params/img/`), loaded
by the one loader, and must give the same logits.
"""

import re

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from configs import fewshot as fewshot_configs
from configs import finetune
from tests.helpers import compiled
from tests.helpers import tiny_models
from vit_jax import inference
from vit_jax import weights
from vit_jax.commands import export
from vit_jax.fewshot import sweep
from vit_jax.loop import trainer
from vit_jax.models import patch_resize

TINY = dict(hidden_size=32, mlp_dim=64, num_heads=4, num_layers=2, patch_size=8)
_BIG_VISION_BLOCK = {
    "MultiHeadDotProductAttention_1": "MultiHeadDotProductAttention_0",
    "LayerNorm_2": "LayerNorm_1",
    "MlpBlock_3": "MlpBlock_0"
}


def images(size=32, batch=2, seed=0):
  rng = np.random.default_rng(seed)
  return rng.uniform(-1, 1, (batch, size, size, 3)).astype(np.float32)


def random_params(model, size=32, seed=0, scale=0.3):
  shapes = jax.eval_shape(model.init, jax.random.key(0),
                          jnp.zeros((1, size, size, 3)))["params"]
  rng = np.random.default_rng(seed)
  return jax.tree.map(
      lambda x: (scale * rng.normal(size=x.shape)).astype(np.float32), shapes)


logits = compiled.logits


def big_vision_file(params, scanned=False, tower=""):
  """{npz name: array} of `params` as big_vision writes them. A class
  token's position embedding is zeroed in `params` (big_vision has none)."""
  flat = flax.traverse_util.flatten_dict(params, sep="/")
  out = {}
  for name, value in flat.items():
    for ours, theirs in _BIG_VISION_BLOCK.items():
      name = name.replace(f"/{ours}/", f"/{theirs}/")
    if name == weights.POSEMB:
      if "cls" in flat:
        value[:, 0] = 0.0
        value = value[:, 1:]
      name = "pos_embedding"
    out[f"params/{tower}{name}"] = value
  if scanned:
    prefix = f"params/{tower}Transformer/"
    blocks = sorted({
        m.group(1) for k in out if (m := re.search(r"(encoderblock_\d+)/", k))
    })
    rests = {
        re.sub(r".*encoderblock_\d+/", "", k)
        for k in out
        if "encoderblock_" in k
    }
    for rest in rests:
      out[f"{prefix}encoderblock/{rest}"] = np.stack(
          [out.pop(f"{prefix}{b}/{rest}") for b in blocks])
  return out


def load(path, model, size=32, **kwargs):
  """Loads `path` into `model`; returns (params, report)."""
  target = jax.eval_shape(lambda: model.init(jax.random.key(
      0), jnp.zeros((1, size, size, 3)))["params"])
  stride = model.size.patch_size
  loaded, report = weights.load(path, target,
                                num_prefix_tokens=model.num_prefix_tokens,
                                grid=(size // stride,) * 2, **kwargs)
  return flax.traverse_util.unflatten_dict(loaded, sep="/"), report


# ------------------------------------------------------- plain ViTs --


@pytest.mark.parametrize(
    "classifier,class_token,posemb,representation_size,scanned", [
        ("gap", None, "sincos2d", 24, False),
        ("map", None, "learn", None, True),
        ("token", None, "sincos2d", None, True),
        ("token", None, "learn", 48, False),
        ("map", True, "sincos2d", 16, False),
    ])
def test_big_vision_plain_vits_load_with_the_same_logits(
    tmp_path, classifier, class_token, posemb, representation_size, scanned):
  model = tiny_models.vit(num_classes=5, classifier=classifier,
                          class_token=class_token, posemb=posemb,
                          representation_size=representation_size, **TINY)
  params = random_params(model)
  path = str(tmp_path / "bv.npz")
  np.savez(path, **big_vision_file(params, scanned))
  loaded, report = load(path, model)
  assert report.origin == "big_vision" and report.ok
  assert ("fixed 2D sin-cos" in report.table()) == (posemb == "sincos2d")
  np.testing.assert_array_equal(logits(model, loaded, images()),
                                logits(model, params, images()))


def test_option_mismatches_name_the_config_that_fits(tmp_path):
  sincos_gap = tiny_models.vit(num_classes=5, classifier="gap",
                               posemb="sincos2d", **TINY)
  path = str(tmp_path / "bv.npz")
  np.savez(path, **big_vision_file(random_params(sincos_gap)))
  for model, fix in (
      (tiny_models.vit(num_classes=5, classifier="gap",
                       **TINY), "config.model.posemb=sincos2d"),
      (tiny_models.vit(num_classes=5, posemb="sincos2d",
                       **TINY), "config.model.classifier=gap or map"),
      (tiny_models.vit(num_classes=5, classifier="map", posemb="sincos2d",
                       **TINY), "config.model.classifier=map"),
  ):
    if fix == "config.model.classifier=map":
      fix = "The file has no MAP head"
    with pytest.raises(weights.WeightsError, match=fix):
      load(path, model)


# ------------------------------------------------------------ SigLIP --


def _siglip_file(tmp_path, tower_params):
  """A two-tower file: the image tower under params/img/, a text tower,
  and the temperature and bias of the sigmoid loss."""
  contents = big_vision_file(tower_params, scanned=True, tower="img/")
  contents["params/txt/Embed_0/embedding"] = np.ones((7, 32), np.float32)
  contents["params/txt/head/kernel"] = np.ones((32, 32), np.float32)
  contents["params/t"] = np.ones((1,), np.float32)
  contents["params/b"] = np.ones((1,), np.float32)
  path = str(tmp_path / "siglip.npz")
  np.savez(path, **contents)
  return path


def test_siglip_image_tower_by_name_or_found_by_itself(tmp_path):
  tower = tiny_models.vit(num_classes=32, classifier="map", **TINY)
  params = random_params(tower)
  path = _siglip_file(tmp_path, params)
  want = logits(tower, params, images())
  for name, note in ((f"{path}:img", "read the tower img/ that the path names"),
                     (path, "read the image tower (img/) of a two-tower file; "
                      "left out b, t, txt/")):
    loaded, report = load(name, tower)
    assert report.notes[0] == note and note in report.table()
    np.testing.assert_array_equal(logits(tower, loaded, images()), want)
  # `inspect` lists the tower it reads, not the whole file.
  with np.load(path) as whole:
    in_tower = [k for k in whole.files if k.startswith("params/img/")]
    assert len(in_tower) < len(whole.files)
  for name in (f"{path}:img", path):
    first = weights.describe_weights(name).splitlines()[0]
    assert first.startswith(f"{name}: npz, {len(in_tower)} arrays, "), first
    assert "read the" in first and "img/" in first
  with pytest.raises(weights.WeightsError, match="has no tower 'image'"):
    load(f"{path}:image", tower)
  with pytest.raises(weights.WeightsError, match="has no ViT parameters"):
    load(f"{path}:txt", tower)


def test_siglip_tower_exports_losslessly_and_its_architecture_is_read(tmp_path):
  tower = tiny_models.vit(num_classes=16, classifier="map", hidden_size=16,
                          mlp_dim=32, num_heads=2, num_layers=2,
                          patch_size=4)  # The `testing` variant.
  params = random_params(tower, size=16)
  path = _siglip_file(tmp_path, params)
  assert weights.read_architecture(path) == weights.Architecture(
      variant="testing", classifier="map", class_token=False, posemb="learn",
      representation_size=None, num_classes=16, image_size=16)
  out = str(tmp_path / "tower.npz")
  weights.save_npz(weights.released_params(f"{path}:img"), out)
  loaded, report = load(out, tower, size=16)
  assert report.ok and report.origin == "released"
  np.testing.assert_array_equal(logits(tower, loaded, images(16)),
                                logits(tower, params, images(16)))


def test_sincos2d_architecture_assumes_224_px(tmp_path):
  model = tiny_models.vit(num_classes=None, classifier="gap", posemb="sincos2d",
                          hidden_size=16, mlp_dim=32, num_heads=2, num_layers=2,
                          patch_size=4)
  path = str(tmp_path / "bv.npz")
  np.savez(path, **big_vision_file(random_params(model, size=16)))
  arch = weights.read_architecture(path)
  assert (arch.classifier, arch.class_token, arch.posemb,
          arch.image_size) == ("gap", False, "sincos2d", 224)


# ---------------------------------------------------- FlexiViT: PI-resize --


def test_pi_resize_to_the_same_size_is_exactly_the_identity():
  kernel = np.random.default_rng(0).normal(size=(8, 8, 3, 5))
  assert patch_resize.pi_resize(kernel, (8, 8)) is kernel


def test_the_resize_is_tensorflows_bilinear_resize():
  """FlexiViT's code builds its matrix with tf.image.resize (bilinear,
  half-pixel centres, no antialiasing): the same operator."""
  x = np.random.default_rng(1).normal(size=(6, 6))
  for new in (3, 8, 13):
    want = tf.image.resize(x[None, ..., None], (new, new),
                           method="bilinear")[0, ..., 0].numpy()
    ours = patch_resize.resize_operator((6, 6), (new, new)) @ x.reshape(-1)
    np.testing.assert_allclose(ours.reshape(new, new), want, atol=3e-6)


@pytest.mark.parametrize("new", [9, 16, 24, 40])
def test_pi_resize_embeds_resized_patches_as_the_original_kernel(new):
  """FlexiViT's defining property, in float64: for a larger patch size,
  <resize(x), PI-resize(w)> = <x, w> for every patch x."""
  rng = np.random.default_rng(2)
  kernel = rng.normal(size=(8, 8, 3, 6))
  patches = rng.normal(size=(20, 8, 8, 3))
  resized = np.stack([
      tf.image.resize(p, (new, new), method="bilinear").numpy().astype(
          np.float64) for p in patches
  ])
  new_kernel = patch_resize.pi_resize(kernel, (new, new))
  original = np.einsum("nhwc,hwcd->nd", patches, kernel)
  # tf.image.resize computes in float32: the error is its rounding.
  np.testing.assert_allclose(np.einsum("nhwc,hwcd->nd", resized, new_kernel),
                             original, atol=1e-4)
  exact = np.einsum("ij,njc->nic",
                    patch_resize.resize_operator((8, 8), (new, new)),
                    patches.reshape(20, 64, 3)).reshape(20, new, new, 3)
  np.testing.assert_allclose(np.einsum("nhwc,hwcd->nd", exact, new_kernel),
                             original, atol=1e-10)


def test_a_flexivit_file_loads_at_any_patch_size(tmp_path):
  """A patch-8 checkpoint into patch-16 and patch-4 models (the grid, and
  so the position embeddings, follow); the report says PI-resize. At
  patch 16 with each 8 x 8 patch resized to 16 x 16, the patch embeddings
  are the original ones."""
  flexi = tiny_models.vit(num_classes=5, classifier="gap", **TINY)
  params = random_params(flexi)
  path = str(tmp_path / "flexivit.npz")
  np.savez(path, **big_vision_file(params))
  for patch, size in ((16, 64), (4, 32)):
    model = tiny_models.with_size(flexi, patch_size=patch)
    loaded, report = load(path, model, size=size)
    resized = {r[0]: r[3] for r in report.resized}
    assert resized["embedding/kernel"] == "PI-resize, as FlexiViT"
    # The same 4 x 4 grid at patch 16; 8 x 8 at patch 4.
    assert (weights.POSEMB in resized) == (patch == 4)
  x = images(32)
  grid = x.reshape(2, 4, 8, 4, 8, 3).transpose(0, 1, 3, 2, 4, 5)
  up = patch_resize.resize_operator((8, 8), (16, 16))
  x16 = np.einsum("ij,bghjc->bghic", up, grid.reshape(2, 4, 4, 64, 3))
  x16 = x16.reshape(2, 4, 4, 16, 16, 3).transpose(0, 1, 3, 2, 4, 5).reshape(
      2, 64, 64, 3).astype(np.float32)
  big, _ = load(path, tiny_models.with_size(flexi, patch_size=16), size=64)

  def embeddings(model, p, inputs):
    seen = []
    model.apply({"params": p}, inputs,
                patch_embeddings_fn=lambda e: seen.append(e) or e)
    return np.asarray(seen[0])

  np.testing.assert_allclose(
      embeddings(tiny_models.with_size(flexi, patch_size=16), big, x16),
      embeddings(flexi, params, x), atol=2e-5)


# ------------------------------------------- end to end on the digits --


def _testing_variant(**kwargs):
  return tiny_models.vit(hidden_size=16, mlp_dim=32, num_heads=2, num_layers=2,
                         patch_size=4, **kwargs)


def _siglip_and_plain_files(tmp_path) -> tuple[str, str]:
  """A SigLIP two-tower file (MAP, 16 classes) and a big_vision plain ViT
  (sincos2d, GAP, pre-logits 24, 10 classes), the `testing` variant."""
  siglip = _siglip_file(
      tmp_path,
      random_params(_testing_variant(num_classes=16, classifier="map"),
                    size=16))
  plain = str(tmp_path / "plain.npz")
  np.savez(
      plain,
      **big_vision_file(
          random_params(
              _testing_variant(num_classes=10, classifier="gap",
                               posemb="sincos2d", representation_size=24),
              size=16)))
  return siglip, plain


def test_each_kind_fine_tunes_sweeps_predicts_and_exports(
    tfds_data_dir, tmp_path):
  """A SigLIP image tower (two-tower file, MAP, no class token) and a
  big_vision plain ViT (sincos2d, GAP, pre-logits), both the `testing`
  variant at 16 px: fine-tuned at 32 px for a few steps; swept few-shot
  beside a paper ViT (each as the model its file holds); the fine-tuned
  workdirs predict and export to .npz that loads back with equal logits."""
  siglip, plain = _siglip_and_plain_files(tmp_path)
  paper = str(tmp_path / "paper.npz")
  weights.save_npz(random_params(_testing_variant(num_classes=10), size=16),
                   paper)

  for name, path, model in (("siglip", f"{siglip}:img", dict(classifier="map")),
                            ("plain", plain,
                             dict(classifier="gap", posemb="sincos2d",
                                  representation_size=24))):
    config = finetune.get_config("digits,runlocal")
    config.data_dir = tfds_data_dir
    config.model.variant = "testing"
    config.model.update(model)
    config.init.checkpoint = path
    config.total_steps = 3
    workdir = str(tmp_path / name)
    result = trainer.train_and_evaluate(config, workdir)
    assert 0.0 <= result["test/accuracy"] <= 1.0, result

    loaded = inference.load(workdir)
    assert loaded.config.model.classifier == model["classifier"]
    x = images(32, batch=3)
    want = np.asarray(
        loaded.model.apply({"params": jax.device_get(loaded.params)}, x)[0])
    exported = str(tmp_path / f"{name}_export.npz")
    weights.save_npz(weights.released_params(workdir), exported)
    again = inference.load(exported, config=loaded.config)
    np.testing.assert_allclose(
        np.asarray(
            again.model.apply({"params": jax.device_get(again.params)}, x)[0]),
        want, atol=1e-6)

  fewshot_config = fewshot_configs.get_config("runlocal")
  fewshot_config.data_dir = tfds_data_dir
  table, _ = sweep.sweep(fewshot_config, [paper, f"{siglip}:img", plain])
  for path in (paper, f"{siglip}:img", plain):
    assert 0.0 <= table[path]["digits"]["5shot"] <= 1.0, table


def test_a_flexivit_file_fine_tunes_at_another_size_sweeps_and_exports(
    tfds_data_dir, tmp_path):
  """A FlexiViT file (big_vision's layout, stored at patch 4 for 16 px) is
  fine-tuned at 32 px run at patch 8 (kernel PI-resized, position
  embeddings resized to the grid), predicts at that size from its workdir,
  exports to .npz at its stored size (loaded back with the workdir's
  config: the same logits) and is swept few-shot at patch 8 beside a paper
  ViT. Directory exports at the run size: test_exports.py."""
  flexi = str(tmp_path / "flexivit.npz")
  np.savez(
      flexi,
      **big_vision_file(random_params(_testing_variant(num_classes=10),
                                      size=16)))
  config = finetune.get_config("digits,runlocal")
  config.data_dir = tfds_data_dir
  config.model.variant, config.model.patch_size = "testing", 8
  config.init.checkpoint = flexi
  config.total_steps = 3
  workdir = str(tmp_path / "flexi")
  result = trainer.train_and_evaluate(config, workdir)
  assert config.image_size == 32 and 0.0 <= result["test/accuracy"] <= 1.0

  loaded = inference.load(workdir)
  assert loaded.config.model.patch_size == loaded.model.form.patch_size == 8
  assert weights.describe_model(workdir)[1].endswith(
      "--config.model.patch_size=8 --config.image_size=32")
  assert loaded.params["embedding"]["kernel"].shape[:2] == (4, 4)  # Stored.
  x = images(32, batch=3)
  want = np.asarray(
      loaded.model.apply({"params": jax.device_get(loaded.params)}, x)[0])
  exported = str(tmp_path / "flexi_export.npz")
  said = export.export_file(workdir, "npz", exported)  # The stored kernel.
  assert "--config.model.patch_size=8" in said, said
  again = inference.load(exported, config=loaded.config)
  np.testing.assert_allclose(
      np.asarray(
          again.model.apply({"params": jax.device_get(again.params)}, x)[0]),
      want, atol=1e-6)

  paper = str(tmp_path / "paper.npz")
  weights.save_npz(random_params(_testing_variant(num_classes=10), size=32),
                   paper)
  fewshot_config = fewshot_configs.get_config("runlocal")
  fewshot_config.data_dir = tfds_data_dir
  fewshot_config.image_size = 32
  fewshot_config.model.patch_size = 8
  table, _ = sweep.sweep(fewshot_config, [paper, flexi])
  for path in (paper, flexi):
    assert 0.0 <= table[path]["digits"]["5shot"] <= 1.0, table


def test_inspect_says_what_each_kind_holds_and_the_config_that_builds_it(
    tmp_path):
  """`vit-jax inspect FILE` (weights.describe without a config) names the
  model of a plain ViT, a SigLIP tower and a Mixer, with the fields that
  build it."""
  from tests import test_mixer  # pylint: disable=g-import-not-at-top
  siglip, plain = _siglip_and_plain_files(tmp_path)
  mixer = str(tmp_path / "mixer.npz")
  mixer_model = tiny_models.mixer(num_classes=10, **test_mixer.TINY)
  weights.save_npz(test_mixer.random_params(mixer_model, 16), mixer)
  said = {
      path: weights.describe_weights(path).splitlines()[1:3]
      for path in (plain, siglip, mixer)
  }
  assert said[plain] == [
      "The model: ViT testing, for any size (224 px in its config, as "
      "big_vision trains), written by big_vision: classifier gap, no class "
      "token, fixed sincos2d position embeddings, a 24-wide pre-logits "
      "layer, a head of 10 classes.",
      "Its config: --config.model.variant=testing --config.model.classifier="
      "gap --config.model.class_token=False --config.model.posemb=sincos2d "
      "--config.model.representation_size=24 --config.image_size=224"
  ]
  assert said[siglip][0] == (
      "The model: ViT testing, trained at 16 px, written by big_vision; read "
      "the image tower (img/) of a two-tower file; left out b, t, txt/: "
      "classifier map, no class token, learned position embeddings, no "
      "pre-logits layer, a head of 16 classes.")
  # A PyTorch file does not store its heads: the width's variants', or
  # --num_heads (no variant is 40 wide).
  timm_file = str(tmp_path / "timm.safetensors")
  weights.save_timm(
      random_params(
          tiny_models.vit(num_classes=3, hidden_size=40, mlp_dim=80,
                          num_heads=5, num_layers=1, patch_size=4), size=16),
      timm_file)
  described = weights.describe_weights(timm_file)
  assert "pass --num_heads" in described.splitlines()[1]
  assert "num_heads=5, num_layers=1" in weights.describe_weights(
      timm_file, num_heads=5).splitlines()[1]
  assert said[mixer] == [
      "The model: MLP-Mixer testing-mixer, trained at 16 px, written by "
      "google-research/vision_transformer: classifier gap, no position "
      "embeddings, no pre-logits layer, a head of 10 classes.",
      "Its config: --config.model.variant=testing-mixer "
      "--config.model.classifier=gap --config.image_size=16"
  ]
