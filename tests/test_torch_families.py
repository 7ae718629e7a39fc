"""PyTorch's ViT families from timm files: DINOv2 (with and without
registers), DeiT III, CLIP (OpenAI's QuickGELU and OpenCLIP's GELU) and a
GAP ViT with timm's fc_norm. Each tiny model was built and run by timm
itself (tests/references, `generate.py families`); here its state dict is
converted, the family and the options it needs are recognised from the
parameters alone, and the logits must be timm's."""

import os
import re
import subprocess
import sys

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import numpy as st_numpy

from configs import fewshot as fewshot_configs
from configs import finetune
from tests.helpers import compiled
from tests.helpers import processes
from tests.helpers import tiny_models
from tests.references import stored
from vit_jax import inference
from vit_jax import weights
from vit_jax.commands import export
from vit_jax.config import defaults
from vit_jax.errors import UserError
from vit_jax.fewshot import sweep
from vit_jax.loop import trainer
from vit_jax.models import variants

# What the weights cannot show: OpenAI's CLIP computes QuickGELU; timm's
# fc_norm model pools by the mean of the patches.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NOT_IN_THE_WEIGHTS = {"clip": dict(quick_gelu=True)}
_FAMILY_NAMES = {
    "dinov2": "DINOv2",
    "dinov2_reg": "DINOv2 with 4 registers",
    "deit3": "DeiT III",
    "clip": "CLIP image encoder",
    "clip_gelu": "CLIP image encoder",
    "avg_fc_norm": "ViT with the pooled features' norm",
}


def _register_tiny_timm():
  """The variant of the tiny families' size, for what builds from a file."""
  variants.register(
      "tiny-timm",
      variants.Variant(hidden_size=32, mlp_dim=128, num_heads=4, num_layers=2,
                       patch_size=8))


def _convert(name):
  return weights.convert_tensors("safetensors", stored.tiny_family_state(name),
                                 4, name)


@pytest.mark.parametrize("name", stored.TINY_FAMILIES)
def test_each_family_gives_timms_logits(name, tmp_path):
  converted = _convert(name)
  found = weights.family_options(converted.params,
                                 converted.posemb_prefix_tokens)
  assert weights.family_name(found).startswith(_FAMILY_NAMES[name])
  assert converted.notes[0].startswith(f"family: {_FAMILY_NAMES[name]}")
  kwargs = stored.tiny_family_kwargs(name)
  assert found.get("layer_norm_eps", 1e-6) == pytest.approx(
      stored.tiny_family_layer_norm_eps(name))
  model = tiny_models.vit(
      num_classes=10, hidden_size=32, mlp_dim=128, num_heads=4, num_layers=2,
      patch_size=8,
      classifier="gap" if kwargs.get("global_pool") == "avg" else "token",
      gelu_approximate=False, **found, **_NOT_IN_THE_WEIGHTS.get(name, {}))
  target = jax.eval_shape(model.init, jax.random.key(0),
                          jnp.zeros((1, 32, 32, 3)))["params"]
  path = str(tmp_path / f"{name}.safetensors")
  st_numpy.save_file(stored.tiny_family_state(name), path)
  loaded, report = weights.load(
      path, target, num_prefix_tokens=converted.posemb_prefix_tokens,
      grid=(4, 4))
  assert report.ok and report.origin == "timm"
  params = flax.traverse_util.unflatten_dict(loaded, sep="/")
  logits, out = model.apply({"params": params}, stored.tiny_images())
  error = np.abs(np.asarray(logits) - stored.tiny_family_logits(name)).max()
  assert error < 2e-5, error
  if name == "dinov2_reg":  # Class token, 4 registers, 16 patches.
    np.testing.assert_allclose(out["encoded"],
                               stored.tiny_family_logits("dinov2_reg_features"),
                               atol=2e-5)


def test_a_family_without_its_options_is_refused_with_the_flags_it_needs(
    tmp_path):
  path = str(tmp_path / "dinov2_reg.safetensors")
  st_numpy.save_file(stored.tiny_family_state("dinov2_reg"), path)
  plain = tiny_models.vit(num_classes=10, hidden_size=32, mlp_dim=128,
                          num_heads=4, num_layers=2, patch_size=8)
  target = jax.eval_shape(plain.init, jax.random.key(0),
                          jnp.zeros((1, 32, 32, 3)))["params"]
  with pytest.raises(
      weights.WeightsError, match=r"family: DINOv2 with 4 registers; it needs "
      r"--config.model.num_registers=4 "
      r"--config.model.posemb_covers_prefix=False "
      r"--config.model.layer_scale=1e-05"):
    weights.load(path, target, num_prefix_tokens=1, grid=(4, 4))


def _renamed(state: dict, renames: dict, drop=(), add=()) -> dict:
  """The tiny DINOv2's state dict with names another family has."""
  out = {}
  for name, value in state.items():
    if not any(name.startswith(d) for d in drop):
      for old, new in renames.items():
        name = name.replace(old, new)
      out[name] = value
  out.update({name: np.zeros((4,), np.float32) for name in add})
  return out


def test_families_not_computed_are_refused_by_name_in_one_line(tmp_path):
  """PE spatial and lang (no final LayerNorm), a timm Eva form no family
  reads (EVA-01: a query and value bias, GELU MLPs) and DINOv2's own
  SwiGLU names compute what this project does not (yet): each file is
  refused naming its family, by the command too (one line, exit 2), never
  loaded as a plain ViT."""
  dinov2 = stored.tiny_family_state("dinov2_reg")
  files = {
      "Perception Encoder spatial or lang": _renamed(
          stored.tiny_family_state("clip"), {},
          drop=("norm.weight", "norm.bias")),
      "timm's Eva model in a form": _renamed(dinov2,
                                             {".ls1.gamma": ".attn.q_bias"}),
      "DINOv2's own SwiGLU MLP": _renamed(dinov2, {".mlp.fc1.": ".mlp.w12."}),
  }
  for family, state in files.items():
    path = str(tmp_path / f"{len(family)}.safetensors")
    st_numpy.save_file(state, path)
    with pytest.raises(weights.WeightsError, match=re.escape(f"is {family}")):
      weights.read_architecture(path)
  # A timm directory's config.json names the family where names cannot.
  directory = tmp_path / "vit_pe"
  directory.mkdir()
  st_numpy.save_file(stored.tiny_family_state("clip"),
                     str(directory / "model.safetensors"))
  (directory / "config.json").write_text(
      '{"architecture": "vit_pe_spatial_small_patch16_512", "num_classes": 1}')
  with pytest.raises(weights.WeightsError, match="is Perception Encoder"):
    weights.read_architecture(str(directory))
  image = os.path.join(REPO, "docs", "digits", "0.png")
  done = subprocess.run([
      sys.executable, "-m", "vit_jax", "predict", f"--checkpoint={path}", image
  ], cwd=REPO, env=processes.command_env(), capture_output=True, text=True,
                        timeout=120)
  assert done.returncode == 2 and not done.stdout, done.stderr[-2000:]
  assert done.stderr.splitlines() == [
      f"error: {path} is DINOv2's own SwiGLU MLP (w12, w3: DINOv2's "
      "ViT-g/14), with SwiGLU MLPs in DINOv2's own names, which this project "
      "does not compute yet: it is not loaded (as a plain ViT its logits "
      "would differ); timm's and transformers' DINOv2 files load."
  ]


def test_combinations_no_family_uses_are_refused():
  config = defaults.get_model_config()
  config.variant, config.gelu_approximate = "testing", True
  for change, message in ((dict(
      num_registers=2,
      posemb="sincos2d"), "register tokens come with learned"), (dict(
          posemb_covers_prefix=False,
          classifier="gap"), "posemb_covers_prefix=False leaves"), (dict(
              pooled_norm=True,
              classifier="map"), "a MAP head has its own LayerNorm")):
    bad = config.copy_and_resolve_references()
    bad.update(change)
    with pytest.raises(UserError, match=message):
      tiny_models.build(bad, 10)


@pytest.mark.parametrize("name", stored.TINY_FAMILIES)
def test_each_family_fine_tunes_sweeps_predicts_and_round_trips(
    name, tfds_data_dir, tmp_path):
  """timm's file of each family (a registered variant of its size):
  fine-tuned at 48 px with the options its load report names (position
  embeddings 4x4 -> 6x6, with the right prefix tokens), predicting from the
  workdir, exported to a timm directory that loads back with the same
  logits, and swept few-shot as the model its file holds (DINOv2's probe
  features: class token and mean patch token side by side)."""
  _register_tiny_timm()
  path = str(tmp_path / f"{name}.safetensors")
  st_numpy.save_file(stored.tiny_family_state(name), path)
  converted = _convert(name)
  found = weights.family_options(converted.params,
                                 converted.posemb_prefix_tokens)

  config = finetune.get_config("digits,runlocal")
  config.data_dir = tfds_data_dir
  config.model.update(variant="tiny-timm", **found,
                      **_NOT_IN_THE_WEIGHTS.get(name, {}))
  if found.get("pooled_norm"):
    config.model.classifier = "gap"
  config.image_size = 48
  config.init.checkpoint = path
  config.total_steps = 2
  workdir = str(tmp_path / "ft")
  result = trainer.train_and_evaluate(config, workdir)
  assert 0.0 <= result["test/accuracy"] <= 1.0
  images = np.random.default_rng(0).uniform(-1, 1, (2, 48, 48, 3))
  logits = {}
  for checkpoint in (workdir, str(tmp_path / "timm")):
    if checkpoint != workdir:
      export.export_directory(workdir, "timm-dir", checkpoint)
    loaded = inference.load(checkpoint)
    assert loaded.config.model.gelu_approximate is False  # timm's erf.
    logits[checkpoint] = compiled.logits(loaded.model,
                                         jax.device_get(loaded.params),
                                         images.astype(np.float32))
  first, second = logits.values()
  assert first.shape == (2, 10) and np.abs(first - second).max() < 2e-5

  fewshot_config = fewshot_configs.get_config("runlocal")
  fewshot_config.data_dir = tfds_data_dir
  fewshot_config.image_size = 32
  fewshot_config.model.update(_NOT_IN_THE_WEIGHTS.get(name, {}))
  if name.startswith("dinov2"):
    fewshot_config.fewshot.layer = "class_and_patch_mean"
  table, _ = sweep.sweep(fewshot_config, [path])
  assert 0.0 <= table[path]["digits"]["5shot"] <= 1.0


def test_a_clip_file_says_once_how_to_choose_its_activation(tmp_path, capsys):
  """A bare timm file with CLIP's names cannot say QuickGELU (OpenAI's)
  from GELU (OpenCLIP's): loading it says so in one line, once a process,
  and its logits are timm's once chosen; a choice made is not advised."""
  _register_tiny_timm()
  path = str(tmp_path / "clip.safetensors")
  st_numpy.save_file(stored.tiny_family_state("clip"), path)
  advice = "set --config.model.quick_gelu=True"
  for _ in range(2):
    inference.load(path)
  said = [
      line for line in capsys.readouterr().err.splitlines() if advice in line
  ]
  assert len(said) == 1 and "CLIP's names" in said[0], said
  config = inference.config_for(path)[0]
  config.model.quick_gelu = True
  loaded = inference.load(path, config)
  assert advice not in capsys.readouterr().err
  logits = loaded.model.apply({"params": loaded.params},
                              stored.tiny_images())[0]
  np.testing.assert_allclose(logits, stored.tiny_family_logits("clip"),
                             rtol=2e-5, atol=2e-5)


# transformers 5's module names of DINOv2's attention, which a state dict
# taken by hand has (its files have the Hub's, which save_pretrained writes).
_DINOV2_MODULE_NAMES = (("attention.attention.query", "attention.q_proj"),
                        ("attention.attention.key", "attention.k_proj"),
                        ("attention.attention.value", "attention.v_proj"),
                        ("attention.output.dense", "attention.o_proj"))


@pytest.mark.parametrize("name", ["dinov2", "dinov2_reg"])
@pytest.mark.parametrize("form", ["directory", "file", "module_names"])
def test_hugging_faces_dinov2_gives_its_tokens(name, form, tmp_path):
  """transformers' Dinov2Model and Dinov2WithRegistersModel (stored: the
  directories their save_pretrained wrote): the output tokens after the
  final norm are transformers', from the directory, its model.safetensors
  alone, and a state dict in version 5's module names."""
  state = stored.tiny_hf_state(name)
  path = os.path.join(stored.tiny_hf_directory(name), "model.safetensors")
  if form == "directory":
    path = stored.tiny_hf_directory(name)
  elif form == "module_names":
    for old, new in _DINOV2_MODULE_NAMES:
      state = {k.replace(old, new): v for k, v in state.items()}
    path = str(tmp_path / "model.safetensors")
    st_numpy.save_file(state, path)
  converted = weights.convert_tensors("safetensors", state, 4, path)
  assert converted.origin == "hugging_face"
  assert "embeddings.mask_token" in converted.notes[-1]
  found = weights.family_options(converted.params,
                                 converted.posemb_prefix_tokens)
  model = tiny_models.vit(num_classes=None, hidden_size=32, mlp_dim=128,
                          num_heads=4, num_layers=2, patch_size=8,
                          gelu_approximate=False, **found)
  target = jax.eval_shape(model.init, jax.random.key(0),
                          jnp.zeros((1, 32, 32, 3)))["params"]
  loaded, report = weights.load(
      path, target, num_prefix_tokens=converted.posemb_prefix_tokens,
      grid=(4, 4))
  assert report.ok
  _, out = model.apply(
      {"params": flax.traverse_util.unflatten_dict(loaded, sep="/")},
      stored.tiny_images())
  want = stored.tiny_hf_output(f"{name}_last_hidden_state")
  np.testing.assert_allclose(out["encoded"], want, atol=2e-5)
  np.testing.assert_allclose(out["encoded"][:, 0],
                             stored.tiny_hf_output(f"{name}_pooler"), atol=2e-5)


@pytest.mark.parametrize("name", stored.TINY_FAMILIES)
def test_each_familys_file_says_the_model_it_holds(name, tmp_path):
  """What `predict`, `inspect` and few-shot sweeps build from a file alone
  (a registered variant of its size): its logits are timm's."""
  _register_tiny_timm()
  path = str(tmp_path / f"{name}.safetensors")
  st_numpy.save_file(stored.tiny_family_state(name), path)
  config = defaults.get_config()
  config.image_size = 32
  config.model.update(_NOT_IN_THE_WEIGHTS.get(name, {}))
  loaded = inference.load(path, config=sweep.with_model_of(config, path))
  logits = compiled.logits(loaded.model, jax.device_get(loaded.params),
                           stored.tiny_images())
  assert np.abs(np.asarray(logits) -
                stored.tiny_family_logits(name)).max() < 2e-5
