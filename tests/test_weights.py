"""Weights from every format: round trips, released and big_vision origins,
position-embedding resizing, head policy, inspection and bad files (parity
with timm and Hugging Face: tests/test_parity.py)."""

import json
import os
import subprocess
import sys

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import ndimage

from tests.helpers import compiled
from tests.helpers import processes
from tests.helpers import tiny_models
from tests.references import stored
from vit_jax import models
from vit_jax import weights
from vit_jax.config import defaults
from vit_jax.models import VARIANTS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH_LIKE = dict(hidden_size=32, mlp_dim=64, num_heads=4, num_layers=2,
                  patch_size=8)  # The shape of the stored tiny models.
ERF = dict(gelu_approximate=False)  # timm's and Hugging Face's GELU.


def images(size=32, batch=3, seed=0, width=None):
  rng = np.random.default_rng(seed)
  return rng.uniform(-1, 1, (batch, size, width or size, 3)).astype(np.float32)


def init(model, size=32, width=None, seed=0, scale=0.2):
  """Random parameters everywhere (the head and biases too), drawn by numpy
  (an eager JAX draw per leaf compiles a program per shape)."""
  shapes = jax.eval_shape(model.init, jax.random.key(seed),
                          jnp.zeros((1, size, width or size, 3)))["params"]
  rng = np.random.default_rng(seed + 1)
  return jax.tree.map(
      lambda x: (scale * rng.normal(size=x.shape)).astype(np.float32), shapes)


def load_params(path, model, size=32, width=None, **kwargs):
  """Loads `path` into `model`'s tree (re-initialised entries stay zero)."""
  target = jax.eval_shape(lambda: model.init(
      jax.random.key(0), jnp.zeros((1, size, width or size, 3)))["params"])
  grid = kwargs.pop("grid")
  loaded, report = weights.load(
      path, target, num_prefix_tokens=int(model.form.classifier == "token"),
      grid=grid, **kwargs)
  flat = {
      k: np.zeros(v.shape, v.dtype)
      for k, v in flax.traverse_util.flatten_dict(target, sep="/").items()
  }
  flat.update(loaded)
  return flax.traverse_util.unflatten_dict(flat, sep="/"), report


def tiny_hybrid():
  return models.create_model("testing-hybrid", 5)


logits = compiled.logits

# -------------------------------------------------------- round trips --


@pytest.mark.parametrize("save, name", [(weights.save_npz, "m.npz"),
                                        (weights.save_timm, "m.safetensors")])
def test_export_and_import_round_trip_exactly(tmp_path, save, name):
  model = tiny_models.vit(num_classes=7, **TORCH_LIKE)
  params = init(model)
  path = str(tmp_path / name)
  save(params, path)
  loaded, report = load_params(path, model, grid=(4, 4))
  assert report.ok and not report.resized and not report.reinitialised
  np.testing.assert_array_equal(logits(model, loaded, images()),
                                logits(model, params, images()))


def test_older_released_hybrid_names_load(tmp_path):
  """GroupNorm parameters stored as (1, 1, 1, C), as older releases did."""
  v = VARIANTS["testing-hybrid"]
  model = tiny_hybrid()
  params = init(model)
  flat = flax.traverse_util.flatten_dict(params, sep="/")
  old = {
      k: (v.reshape(1, 1, 1, -1) if "/gn" in f"/{k}" else v)
      for k, v in flat.items()
  }
  assert any(v.ndim == 4 and v.shape[:3] == (1, 1, 1) for v in old.values())
  path = str(tmp_path / "hybrid.npz")
  weights.save_npz(old, path)
  loaded, report = load_params(path, model, grid=(32 // v.stride,) * 2)
  assert report.ok
  np.testing.assert_array_equal(logits(model, loaded, images()),
                                logits(model, params, images()))


def test_released_gap_model_and_class_token_posemb_policy(tmp_path):
  """Position embeddings stored without the class token (a gap model) load
  into a gap model as they are, and into a token model with a zero one."""
  gap = tiny_models.vit(num_classes=5, classifier="gap", **TORCH_LIKE)
  params = init(gap)
  path = str(tmp_path / "gap.npz")
  weights.save_npz(params, path)
  loaded, _ = load_params(path, gap, grid=(4, 4))
  np.testing.assert_array_equal(logits(gap, loaded, images()),
                                logits(gap, params, images()))
  token = tiny_models.vit(num_classes=5, **TORCH_LIKE)
  with pytest.raises(weights.WeightsError, match="MISSING.*\n.*cls"):
    load_params(path, token, grid=(4, 4))
  loaded, report = load_params(path, token, grid=(4, 4), dont_load=("cls",))
  assert loaded["Transformer"]["posembed_input"]["pos_embedding"].shape == (1,
                                                                            17,
                                                                            32)
  assert not np.any(loaded["Transformer"]["posembed_input"]["pos_embedding"][0,
                                                                             0])


@pytest.mark.parametrize("scanned", [False, True])
def test_big_vision_checkpoint_loads(tmp_path, scanned):
  """big_vision names; its class token gets no position embedding."""
  model = tiny_models.vit(num_classes=5, **TORCH_LIKE)
  params = init(model)
  params["Transformer"]["posembed_input"]["pos_embedding"][:, 0] = 0.0
  flat = flax.traverse_util.flatten_dict(params, sep="/")
  bv = {}
  for name, value in flat.items():
    name = (name.replace("MultiHeadDotProductAttention_1",
                         "MultiHeadDotProductAttention_0").replace(
                             "LayerNorm_2", "LayerNorm_1").replace(
                                 "MlpBlock_3", "MlpBlock_0"))
    if name == weights.POSEMB:
      name, value = "pos_embedding", value[:, 1:]
    bv["params/" + name] = value
  if scanned:
    blocks = sorted({k.split("/")[2] for k in bv if "encoderblock_" in k})
    for rest in {k.split("/", 3)[3] for k in bv if "encoderblock_" in k}:
      bv[f"params/Transformer/encoderblock/{rest}"] = np.stack(
          [bv.pop(f"params/Transformer/{b}/{rest}") for b in blocks])
  bv["opt/state/mu/head/kernel"] = np.ones(1)  # Optimizer state is ignored.
  path = str(tmp_path / "bv.npz")
  np.savez(path, **bv)
  loaded, report = load_params(path, model, grid=(4, 4))
  assert report.origin == "big_vision"
  np.testing.assert_allclose(logits(model, loaded, images()),
                             logits(model, params, images()), atol=1e-6)


def test_released_names_of_current_flax_load(tmp_path):
  """vision_transformer run with a current Flax: blocks named
  MultiHeadDotProductAttention_0 / LayerNorm_1 / MlpBlock_0, and still
  Transformer/posembed_input (which big_vision does not have)."""
  model = tiny_models.vit(num_classes=5, **TORCH_LIKE)
  params = init(model)
  flat = flax.traverse_util.flatten_dict(params, sep="/")
  names = {
      "MultiHeadDotProductAttention_1": "MultiHeadDotProductAttention_0",
      "LayerNorm_2": "LayerNorm_1",
      "MlpBlock_3": "MlpBlock_0"
  }
  renamed = {}
  for key, value in flat.items():
    for old, new in names.items():
      key = key.replace(old, new)
    renamed[key] = value
  assert weights.POSEMB in renamed
  path = str(tmp_path / "current_flax.npz")
  np.savez(path, **renamed)
  loaded, report = load_params(path, model, grid=(4, 4))
  assert report.origin == "released_current_flax" and report.ok
  np.testing.assert_array_equal(logits(model, loaded, images()),
                                logits(model, params, images()))

  mixed = dict(renamed)
  mixed["Transformer/encoderblock_1/LayerNorm_2/scale"] = mixed.pop(
      "Transformer/encoderblock_1/LayerNorm_1/scale")
  np.savez(path, **mixed)
  with pytest.raises(weights.WeightsError, match="mixes two block namings"):
    load_params(path, model, grid=(4, 4))


# ------------------------------------------------------------------ GELU --


def _config_for(path, gelu=None):
  config = defaults.get_config()
  config.init.checkpoint = path
  config.model.gelu_approximate = gelu
  return config


def test_gelu_follows_the_weights_origin_unless_set(tmp_path):
  timm_path = stored.path("tiny_timm.safetensors")
  npz = str(tmp_path / "released.npz")
  weights.save_npz(init(tiny_models.vit(num_classes=4, **TORCH_LIKE)), npz)
  assert weights.file_origin(timm_path) == ("timm", False)
  assert weights.file_origin(npz) == ("released", True)
  resolved = weights.decide(_config_for(timm_path))
  assert resolved.model.gelu_approximate is False
  assert weights.decide(_config_for(npz)).model.gelu_approximate is True
  assert weights.decide(_config_for(None)).model.gelu_approximate is True
  kept = _config_for(timm_path, gelu=True)
  assert weights.decide(kept).model.gelu_approximate is True
  kept.model.posemb_interpolation = "bilinear"  # Nothing left open.
  assert weights.decide(kept) is kept
  # A resumed run keeps what it was trained with (one recorded before the
  # option existed computed erf).
  resumed = tmp_path / "checkpoints" / "run1"  # Its own, not its parent's.
  resumed.mkdir(parents=True)
  for recorded, decided in (({
      "gelu_approximate": False
  }, False), ({
      "gelu_approximate": True
  }, True), ({}, False)):
    (resumed / "config.json").write_text(json.dumps({"model": recorded}))
    assert weights.decide(
        _config_for(npz),
        resumed_workdir=resumed).model.gelu_approximate is decided
  # Nothing builds a model from an undecided config.
  with pytest.raises(ValueError, match="weights.decide"):
    models.build_model(_config_for(None).model, 4)

  # The config differs from the origin: loading says so.
  model = tiny_models.vit(num_classes=10, **TORCH_LIKE)
  _, report = load_params(timm_path, model, grid=(4, 4), gelu_approximate=True)
  assert "model tanh approximation, file's origin (timm) exact erf" in (
      report.table())
  assert any(
      "exact erf but the model uses the tanh" in w for w in report.warnings)


def test_gelu_of_a_workdir_is_read_from_its_config(tmp_path):
  workdir = tmp_path / "run"
  (workdir / "checkpoints" / "7").mkdir(parents=True)
  step = str(workdir / "checkpoints" / "7")
  assert weights.origin_gelu(step, "orbax") is None  # No config.json.
  (workdir / "config.json").write_text('{"model": {"variant": "testing"}}')
  # Written before the option existed: this project computed erf then.
  assert weights.origin_gelu(step, "orbax") is False
  (workdir / "config.json").write_text('{"model": {"gelu_approximate": true}}')
  assert weights.origin_gelu(str(workdir), "orbax") is True
  assert weights.origin_gelu(step, "orbax") is True


# ------------------------------------------------------------ resizing --


def test_same_grid_resize_is_bit_exact():
  table = np.random.default_rng(0).normal(size=(1, 197, 8)).astype(np.float32)
  out = weights.resize_posemb(table, 1, (14, 14), (14, 14))
  assert out is table


@pytest.mark.parametrize("new_grid", [(24, 24), (14, 20), (7, 9)])
def test_resize_matches_scipy_zoom_order_1(new_grid):
  table = np.random.default_rng(0).normal(size=(1, 197, 8)).astype(np.float32)
  out = weights.resize_posemb(table, 1, (14, 14), new_grid)
  np.testing.assert_array_equal(out[:, :1], table[:, :1])  # Class token kept.
  zoom = (new_grid[0] / 14, new_grid[1] / 14, 1)
  expected = ndimage.zoom(table[0, 1:].reshape(14, 14, 8), zoom, order=1)
  np.testing.assert_allclose(out[0, 1:].reshape(*new_grid, 8), expected,
                             atol=1e-6)


def test_bicubic_resize_keeps_smooth_grids_and_corners():
  rows, cols = np.meshgrid(np.linspace(0, 1, 14), np.linspace(0, 1, 14),
                           indexing="ij")
  plane = (2 * rows + 3 * cols)[..., None].astype(np.float32)
  out = weights.resize_grid(plane, (24, 20), "bicubic")
  rows, cols = np.meshgrid(np.linspace(0, 1, 24), np.linspace(0, 1, 20),
                           indexing="ij")
  np.testing.assert_allclose(out[..., 0], 2 * rows + 3 * cols, atol=1e-5)


def test_loading_at_a_new_resolution_resizes_and_runs(tmp_path):
  model = tiny_models.vit(num_classes=5, **TORCH_LIKE)
  path = str(tmp_path / "m.npz")
  weights.save_npz(init(model), path)
  loaded, report = load_params(path, model, size=48, width=64, grid=(6, 8))
  assert [r[0] for r in report.resized] == [weights.POSEMB]
  out = logits(model, loaded, images(size=48, width=64))
  assert out.shape == (3, 5) and np.all(np.isfinite(out))


def test_hybrid_grid_follows_the_stem_stride(tmp_path):
  v = VARIANTS["testing-hybrid"]
  model = tiny_hybrid()
  path = str(tmp_path / "hybrid.npz")
  weights.save_npz(init(model, size=32), path)
  loaded, report = load_params(path, model, size=64, grid=(64 // v.stride,) * 2)
  assert report.resized[0][1:] == ((1, 17, 16), (1, 65, 16),
                                   "4x4 -> 8x8 grid, bilinear")
  assert np.all(np.isfinite(logits(model, loaded, images(size=64))))


# --------------------------------------------------------- head policy --


def test_head_policy_and_pre_logits(tmp_path):
  pretrain = tiny_models.vit(num_classes=9, representation_size=16,
                             **TORCH_LIKE)
  path = str(tmp_path / "pretrained.npz")
  weights.save_npz(init(pretrain), path)
  finetune = tiny_models.vit(num_classes=4, **TORCH_LIKE)
  loaded, report = load_params(path, finetune, grid=(4, 4))
  assert {n for n, _ in report.reinitialised} == {"head/kernel", "head/bias"}
  assert {n for n, _ in report.dropped} == {
      "pre_logits/kernel", "pre_logits/bias"
  }
  assert not np.any(loaded["head"]["kernel"])  # The paper's zero head.
  kept, report = load_params(path, pretrain, grid=(4, 4),
                             dont_load=("Transformer/encoder_norm/.*",))
  assert len(report.reinitialised) == 2 and "pre_logits" in kept


def test_zero_head_for_inference_is_warned_about(tmp_path):
  model = tiny_models.vit(num_classes=4, **TORCH_LIKE)
  params = init(model)
  params["head"]["kernel"][:] = 0.0
  path = str(tmp_path / "untrained_head.npz")
  weights.save_npz(params, path)
  _, report = load_params(path, model, grid=(4, 4))
  assert any("all zeros" in w for w in report.warnings)


def test_dont_load_regex_that_matches_nothing_is_an_error(tmp_path):
  model = tiny_models.vit(num_classes=4, **TORCH_LIKE)
  path = str(tmp_path / "m.npz")
  weights.save_npz(init(model), path)
  with pytest.raises(weights.WeightsError,
                     match="dont_load regex 'heads/.*' matches no param"):
    load_params(path, model, grid=(4, 4), dont_load=("heads/.*",))


def test_export_never_drops_a_layer(tmp_path):
  """timm has no pre-logits layer: exporting one is refused, not dropped."""
  pretrained = tiny_models.vit(num_classes=9, representation_size=16,
                               **TORCH_LIKE)
  path = str(tmp_path / "m.safetensors")
  with pytest.raises(weights.WeightsError, match="pre-logits layer"):
    weights.save_timm(init(pretrained), path)
  assert not os.path.exists(path)
  flat = flax.traverse_util.flatten_dict(
      init(tiny_models.vit(num_classes=9, **TORCH_LIKE)), sep="/")
  flat["extra/kernel"] = np.ones((2, 2), np.float32)
  with pytest.raises(weights.WeightsError, match=r"no place for \['extra"):
    weights.save_timm(flat, path)


# ----------------------------------------------------------- bad files --


def test_bad_files_give_one_clear_error_each(tmp_path):
  model = tiny_models.vit(num_classes=4, **TORCH_LIKE)
  text = tmp_path / "notes.txt"
  text.write_text("not weights")
  mixer = str(tmp_path / "mixer.npz")
  np.savez(mixer, **{"MixerBlock_0/token_mixing/Dense_0/kernel": np.ones(2)})
  good = str(tmp_path / "good.npz")
  weights.save_npz(init(model), good)
  truncated = str(tmp_path / "truncated.npz")
  with open(good, "rb") as f, open(truncated, "wb") as g:
    g.write(f.read()[:3000])
  st = str(tmp_path / "good.safetensors")
  weights.save_timm(init(model), st)
  st_truncated = str(tmp_path / "truncated.safetensors")
  with open(st, "rb") as f, open(st_truncated, "wb") as g:
    g.write(f.read()[:-100])
  cases = [(str(text), "notes.txt is not a weights file"),
           (mixer, "holds an MLP-Mixer but the config.s model is a ViT"),
           (str(tmp_path / "absent.npz"), "absent.npz: the path does not "),
           (truncated, "truncated.npz.*truncated or corrupt"),
           (st_truncated, "truncated.safetensors is a truncated"),
           (str(tmp_path), "not an Orbax checkpoint")]
  for path, message in cases:
    with pytest.raises(weights.WeightsError, match=message):
      load_params(path, model, grid=(4, 4))


def test_another_variant_is_refused_with_the_table(tmp_path):
  """Like B/16 weights into an L/16 config: a table, and nothing loaded."""
  wide = tiny_models.vit(num_classes=4, **dict(TORCH_LIKE, hidden_size=64))
  path = str(tmp_path / "wide.npz")
  weights.save_npz(init(wide), path)
  narrow = tiny_models.vit(num_classes=4, **TORCH_LIKE)
  with pytest.raises(weights.WeightsError,
                     match=r"(?s)SHAPE MISMATCH.*different model \(width 64"):
    load_params(path, narrow, grid=(4, 4))


# --------------------------------------------------- command line tools --


def test_inspect_and_export_commands(tmp_path):
  model = tiny_models.vit(num_classes=10, **dict(TORCH_LIKE, patch_size=4))
  npz = str(tmp_path / "m.npz")
  weights.save_npz(init(model, size=16), npz)
  env = processes.command_env()
  run = lambda *args: subprocess.run([
      sys.executable, "-m", *args
  ], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  st = str(tmp_path / "m.safetensors")
  done = run("vit_jax", "export", f"--checkpoint={npz}", "--format=timm",
             f"--out={st}")
  assert done.returncode == 0, done.stderr[-2000:]
  done = run("vit_jax", "inspect", st,
             "--config=configs/finetune.py:digits,variant=testing",
             "--config.model.variant=testing")
  assert done.returncode == 0, done.stderr[-2000:]
  assert "blocks.0.attn.qkv.weight" in done.stdout
  assert "The model: " in done.stdout.splitlines()[1]
  assert "Does NOT load into testing" in done.stdout  # Width 32 vs 16.
