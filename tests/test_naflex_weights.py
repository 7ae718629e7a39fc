"""NaFlex weights (SigLIP 2's image towers): big_vision's own NaFlex model
computed logits on our machine (`tests/references/big_vision_naflex.py`);
the file it saved, read by our loader as a tower of a two-tower file, must
give them. Then predict on a non-square image, at its aspect ratio."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.helpers import processes
from tests.helpers import torch_env
from vit_jax import inference
from vit_jax import weights
from vit_jax.commands import export
from vit_jax.data import image_files
from vit_jax.models import sequences

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCES = os.path.join(REPO, "tests", "references")
PARAMS = os.path.join(REFERENCES, "tiny_naflex_big_vision.npz")


def big_vision_batch():
  """The patch sequences big_vision ran (its (patches, type, y, x) tuple)
  as ours, and its logits."""
  io = np.load(os.path.join(REFERENCES, "tiny_naflex_big_vision_io.npz"))
  coords = np.stack([io["yabs"], io["xabs"]], axis=-1)
  valid = io["type"] == 1
  grids = np.where(valid[..., None], coords, 0).max(axis=1)[:, None] + 1
  seq = sequences.PatchSequence(io["patches"], coords, valid.astype(np.int32),
                                grids.astype(np.int32))
  return seq, io["logits"]


@pytest.fixture(scope="module")
def two_tower_file(tmp_path_factory):
  """The tower as SigLIP 2 ships it: `params/img/...` beside a text tower
  and the temperature and bias."""
  path = tmp_path_factory.mktemp("siglip2") / "siglip2_tiny_naflex.npz"
  tower = dict(np.load(PARAMS))
  np.savez(
      path, **{
          f"params/img/{k[len('params/'):]}": v for k, v in tower.items()
      }, **{
          "params/txt/Embed_0/embedding": np.zeros((5, 16), np.float32),
          "params/t": np.ones((1,), np.float32),
          "params/b": np.zeros((1,), np.float32)
      })
  return str(path)


def test_big_visions_naflex_tower_loads_and_gives_its_logits(two_tower_file):
  checkpoint = f"{two_tower_file}:img"
  arch = weights.read_architecture(checkpoint)
  assert (arch.variant, arch.classifier, arch.class_token, arch.image_size,
          arch.sequences) == ("testing", "map", False, 16, True)
  loaded = inference.load(checkpoint)
  config = loaded.config
  assert config.model.posemb_interpolation == "bilinear"
  assert config.model.gelu_approximate is True
  assert config.sequence_length == 16 and config.pp_eval.endswith("patchify")
  seq, expected = big_vision_batch()
  logits, _ = loaded.model.apply({"params": loaded.params}, seq)
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)


def _png(path, height, width, seed=0):
  pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3),
                                                np.uint8)
  path.write_bytes(tf.io.encode_png(pixels).numpy())


def test_predict_takes_a_non_square_image_at_its_aspect_ratio(tmp_path):
  wide, tall = tmp_path / "wide.png", tmp_path / "tall.png"
  _png(wide, 12, 44)
  _png(tall, 40, 10, seed=1)
  loaded = inference.load(PARAMS)
  batch = next(
      iter(
          image_files.ImageFiles([str(wide), str(tall)], loaded.config.pp_eval,
                                 16, 2, loaded.stride,
                                 loaded.config.sequence_length)))
  grids = batch["image"]["grids"][:, 0].tolist()
  assert grids == [[2, 8], [8, 2]]  # 16 patches at most, aspect kept.
  logits, _ = loaded.model.apply({"params": loaded.params}, batch["image"])
  done = subprocess.run([
      sys.executable, "-m", "vit_jax", "predict", f"--checkpoint={PARAMS}",
      "--top_k=1",
      str(wide),
      str(tall)
  ], cwd=REPO, env=processes.command_env(), capture_output=True, text=True,
                        timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  lines = done.stdout.splitlines()
  best = np.asarray(logits).argmax(-1)
  assert [line.split()[1] for line in lines] == [str(c) for c in best]


def timm_batch():
  """The patch sequences timm's NaFlexViTs ran, as ours, and the logits."""
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  io = st_numpy.load_file(
      os.path.join(REFERENCES, "tiny_naflex_timm_io.safetensors"))
  valid = io["valid"]
  coords = io["coords"].astype(np.int32)
  grids = np.where(valid[..., None], coords, 0).max(axis=1)[:, None] + 1
  seq = sequences.PatchSequence(io["patches"], coords, valid.astype(np.int32),
                                grids.astype(np.int32))
  return seq, io


def timm_directory(tmp_path, name, pickled=False) -> str:
  """The reference as timm's `save_for_hf` writes it: config.json naming
  the model function and its model_args, beside model.safetensors (or,
  `pickled`, pytorch_model.bin, its default)."""
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  metadata = st_numpy.safe_open(
      os.path.join(REFERENCES, "tiny_naflex_timm_io.safetensors"),
      "np").metadata()
  size = json.loads(metadata["size"])
  size["pos_embed_grid_size"] = list(size["pos_embed_grid_size"])
  directory = tmp_path / name
  directory.mkdir()
  (directory / "config.json").write_text(
      json.dumps({
          "architecture": json.loads(metadata["functions"])[name],
          "num_classes": size["num_classes"],
          "model_args": size
      }))
  weights = ("tiny_naflex_timm_gap.bin", "pytorch_model.bin") if pickled else (
      f"tiny_naflex_timm_{name}.safetensors", "model.safetensors")
  shutil.copy(os.path.join(REFERENCES, weights[0]), directory / weights[1])
  return str(directory)


@pytest.mark.parametrize("name,options", [
    ("gap",
     dict(posemb="learn", posemb_interpolation="bicubic", num_registers=4,
          pooled_norm=True, gelu_approximate=False)),
    ("parfac",
     dict(posemb="factorized", posemb_keep_aspect=True, num_registers=4,
          gelu_approximate=False)),
    ("siglip",
     dict(posemb="learn", posemb_interpolation="bilinear", classifier="map",
          gelu_approximate=True)),
])
@pytest.mark.parametrize("form", ["file", "directory"])
def test_timms_naflexvits_load_and_give_timms_logits(name, options, form,
                                                     tmp_path, pickled=False):
  """As a timm directory, or as the bare file (its names say all but
  aspect-preserving resizing, which a file of `parfac` needs set)."""
  path = os.path.join(REFERENCES, f"tiny_naflex_timm_{name}.safetensors")
  config = None
  if form == "directory":
    path = timm_directory(tmp_path, name, pickled)
  elif options.get("posemb_keep_aspect"):
    config = inference.config_for(path)[0]
    config.model.posemb_keep_aspect = True
  loaded = inference.load(path, config)
  for field, value in options.items():
    assert loaded.config.model[field] == value, field
  assert loaded.config.sequence_length == 16
  seq, io = timm_batch()
  logits, _ = loaded.model.apply({"params": loaded.params}, seq)
  np.testing.assert_allclose(logits, io[f"logits_{name}"], rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("name", ["gap", "siglip"])
def test_a_square_image_of_another_grid_gives_timms_logits(name):
  """A NaFlexViT given a square image of another grid than its table's (2 x
  2 patches, the table 4 x 4: timm's third sequence, as an image) computes
  what timm does: read at the image's rows and columns when loaded at its
  own size, and with the table resized once, as it reads it (half-pixel,
  antialiased, bicubic or bilinear), when loaded at the image's."""
  seq, io = timm_batch()
  patches = np.asarray(seq.patches[2])[:4].reshape(2, 2, 4, 4, 3)
  image = patches.transpose(0, 2, 1, 3, 4).reshape(1, 8, 8, 3)
  path = os.path.join(REFERENCES, f"tiny_naflex_timm_{name}.safetensors")
  for image_size in (None, 8):
    loaded = inference.load(path, image_size=image_size)
    logits, _ = loaded.model.apply({"params": loaded.params}, image)
    np.testing.assert_allclose(logits[0], io[f"logits_{name}"][2], rtol=2e-5,
                               atol=2e-5)


TORCH_PYTHON = torch_env.TORCH_PYTHON


@pytest.mark.parametrize("name", ["gap", "parfac", "siglip"])
def test_a_naflex_model_exports_to_a_timm_directory_timm_loads(name, tmp_path):
  """Exported as timm's NaFlexViT (config.json naming its function, the
  state dict under its names): read back by our loader with the same
  logits, and by timm itself (where .venv-torch is) with timm's."""
  source = timm_directory(tmp_path, name)
  seq, io = timm_batch()
  out = str(tmp_path / "exported")
  export.export_directory(source, "timm-dir", out)
  written = json.loads((tmp_path / "exported" / "config.json").read_text())
  assert written["architecture"].startswith("naflexvit_")
  loaded = inference.load(out)
  logits, _ = loaded.model.apply({"params": loaded.params}, seq)
  np.testing.assert_allclose(logits, io[f"logits_{name}"], rtol=2e-5, atol=2e-5)
  torch_env.require()
  np.savez(tmp_path / "sequences.npz", patches=np.asarray(seq.patches),
           coords=np.asarray(seq.coords), valid=np.asarray(seq.segments) > 0)
  env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
  done = subprocess.run([
      TORCH_PYTHON, "-m", "tests.helpers.exported_logits",
      str(tmp_path / "sequences.npz"),
      str(tmp_path / "logits.npz"), f"timm=timm-naflex:{out}"
  ], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  with np.load(tmp_path / "logits.npz") as theirs:
    np.testing.assert_allclose(theirs["timm"], io[f"logits_{name}"], rtol=2e-5,
                               atol=2e-5)


def test_a_timm_directory_with_pytorch_model_bin_loads_without_torch(tmp_path):
  """config.json beside pytorch_model.bin (timm's save_for_hf default):
  the pickle read without PyTorch (`torch_pickle.py`)."""
  test_timms_naflexvits_load_and_give_timms_logits(
      "gap", dict(posemb_interpolation="bicubic", num_registers=4), "directory",
      tmp_path, pickled=True)


def test_factorized_tables_are_resized_for_another_resolution(tmp_path):
  """Fine-tuning a factorized model at 32 px: each axis's table resized
  from 4 to 8 entries (corner to corner, as the 2D tables are)."""
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  stored = st_numpy.load_file(
      os.path.join(REFERENCES, "tiny_naflex_timm_parfac.safetensors"))
  loaded = inference.load(timm_directory(tmp_path, "parfac"), image_size=32)
  tables = loaded.params["Transformer"]["posembed_input"]
  for axis in ("y", "x"):
    table = np.asarray(tables[f"pos_embedding_{axis}"])[0]
    before = stored[f"embeds.pos_embed_{axis}"][0]
    assert table.shape == (8, 16)
    np.testing.assert_allclose(table[[0, -1]], before[[0, -1]], atol=1e-6)
    np.testing.assert_allclose(
        table[1], before[0] + (before[1] - before[0]) * 3 / 7, atol=1e-5)
