"""Image-text models (SigLIP, CLIP, LiT): the two towers against big_vision's
own code and transformers' SiglipModel (their outputs stored:
`tests/references/big_vision_siglip.py`, `generate.py siglip`), loaded
whole and written back as the same files; the recipes trained end to end
on the built-in captions over 8 devices (SigLIP's loss on the ring); LiT's
locked tower; recall with repeated captions.
"""

import json
import pathlib

import flax
import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from configs import image_text as recipes
from tests.references import stored
from vit_jax import objectives
from vit_jax import sharding
from vit_jax import weights
from vit_jax.commands import export
from vit_jax.errors import UserError
from vit_jax.evaluators import image_text
from vit_jax.inference import zero_shot
from vit_jax.loop import checks
from vit_jax.loop import trainer
from vit_jax.models import variants

REFERENCES = stored.HERE
BIG_VISION = f"{REFERENCES}/tiny_siglip_big_vision.npz"
HF = f"{REFERENCES}/tiny_hf_siglip"
HF2 = f"{REFERENCES}/tiny_hf_siglip2"


@pytest.fixture
def tiny_towers(monkeypatch):
  """The references' towers are 32 wide, 2 blocks of 2 heads, MLP 64:
  sizes of no shipped variant, so the test names them."""
  monkeypatch.setitem(
      variants.VARIANTS, "tiny-siglip",
      variants.Variant(hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2,
                       patch_size=4))


def _close(got, want, what):
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5,
                             err_msg=what)


def test_big_vision_and_transformers_siglip_load_whole_and_write_back(
    tiny_towers, tmp_path):
  """big_vision's file and transformers' SiglipModel and Siglip2Model
  (NaFlex) directories load whole (the text tower, t and b read from them,
  the config read from their shapes) and give their library's embeddings
  and logits; written back, each is the same file; each converts into the
  other."""
  del tiny_towers
  io = np.load(f"{REFERENCES}/tiny_siglip_big_vision_io.npz")
  loaded = zero_shot.load(BIG_VISION, need_tokenizer=False)
  config = loaded.config
  assert (config.objective, config.text.variant, config.text.pool,
          config.text.length, config.text.embedding_dim,
          config.text.image_head) == ("siglip", "tiny-siglip", "last", 8, 24,
                                      True)
  assert (config.model.classifier, config.model.class_token) == ("map", False)
  zimg, ztxt, out = loaded.apply(loaded.params, io["images"], io["texts"])
  _close(zimg, io["zimg"], "big_vision zimg")
  _close(ztxt, io["ztxt"], "big_vision ztxt")
  _close(out["t"] * zimg @ ztxt.T + out["b"], io["logits"], "big_vision logits")
  export.export_two_towers(BIG_VISION, "npz", str(tmp_path / "bv.npz"))
  original, written = dict(np.load(BIG_VISION)), dict(
      np.load(tmp_path / "bv.npz"))
  assert written.keys() == original.keys()
  for name, value in original.items():
    np.testing.assert_array_equal(written[name], value, err_msg=name)

  hf_io = load_file(f"{REFERENCES}/tiny_hf_siglip_outputs.safetensors")
  loaded = zero_shot.load(HF, need_tokenizer=False)
  assert (loaded.config.text.image_head, loaded.config.text.embedding_dim,
          loaded.config.model.layer_norm_eps) == (False, 32, 1e-6)
  images = hf_io["pixel_values"].transpose(0, 2, 3, 1)
  zimg, ztxt, out = loaded.apply(loaded.params, images,
                                 hf_io["input_ids"].astype(np.int32))
  _close(zimg, hf_io["image_embeds"], "SiglipModel image_embeds")
  _close(ztxt, hf_io["text_embeds"], "SiglipModel text_embeds")
  logits = out["t"] * zimg @ ztxt.T + out["b"]
  _close(logits, hf_io["logits_per_image"], "SiglipModel logits")
  _close(zero_shot.scores(loaded, zimg, ztxt), 1 / (1 + np.exp(-logits)),
         "SigLIP's probabilities")
  # transformers -> ours -> transformers, and by way of big_vision's file.
  export.export_two_towers(HF, "hf", str(tmp_path / "hf"))
  export.export_two_towers(HF, "npz", str(tmp_path / "from_hf.npz"))
  export.export_two_towers(str(tmp_path / "from_hf.npz"), "hf",
                           str(tmp_path / "hf2"))
  for out_dir in ("hf", "hf2"):
    _same_directory(HF, tmp_path / out_dir)
  # SigLIP 2's NaFlex towers (Siglip2Model): images as patch sequences.
  io2 = load_file(f"{REFERENCES}/tiny_hf_siglip2_outputs.safetensors")
  loaded = zero_shot.load(HF2, need_tokenizer=False)
  assert (loaded.config.sequence_length,
          loaded.config.model.posemb_interpolation,
          loaded.config.pp_eval) == (16, "bilinear",
                                     "resize_to_sequence|value_range|patchify")
  zimg, ztxt, out = loaded.apply(loaded.params, _sequences(io2),
                                 io2["input_ids"].astype(np.int32))
  _close(zimg, io2["image_embeds"], "Siglip2Model image_embeds")
  _close(ztxt, io2["text_embeds"], "Siglip2Model text_embeds")
  _close(out["t"] * zimg @ ztxt.T + out["b"], io2["logits_per_image"],
         "Siglip2Model logits")
  export.export_two_towers(HF2, "npz", str(tmp_path / "naflex.npz"))
  for source, out_dir in ((HF2, "hf2_direct"), (str(
      tmp_path / "naflex.npz"), "hf2_by_npz")):
    export.export_two_towers(source, "hf", str(tmp_path / out_dir))
    _same_directory(HF2, tmp_path / out_dir)
  # big_vision's image tower has a projection SiglipModel has no place for.
  with pytest.raises(UserError, match="image_head=False"):
    export.export_two_towers(BIG_VISION, "hf", str(tmp_path / "no"))
  with pytest.raises(UserError, match="ships no tokenizer"):
    zero_shot.load(BIG_VISION)


def _same_directory(want_dir, got_dir):
  """The same weights, architectures and towers' configs."""
  original = load_file(f"{want_dir}/model.safetensors")
  written = load_file(str(pathlib.Path(got_dir) / "model.safetensors"))
  assert written.keys() == original.keys()
  for name, value in original.items():
    np.testing.assert_array_equal(written[name], value, err_msg=name)
  want, got = (json.loads((pathlib.Path(p) / "config.json").read_text())
               for p in (want_dir, got_dir))
  assert got["architectures"] == want["architectures"]
  for tower in ("vision_config", "text_config"):
    assert {
        k: v for k, v in got[tower].items() if k in want[tower]
    } == want[tower]


def _sequences(io):
  """Siglip2Model's patches (row, column, channel in each, as ours), its
  mask and grids as our PatchSequence's fields."""
  mask = io["pixel_attention_mask"].astype(np.int32)
  grids = io["spatial_shapes"].astype(np.int32)
  coords = np.zeros(mask.shape + (2,), np.int32)
  for b, (rows, cols) in enumerate(grids):
    index = np.arange(rows * cols)
    coords[b, :rows * cols] = np.stack([index // cols, index % cols], -1)
  return dict(patches=io["pixel_values"], coords=coords, segments=mask,
              grids=grids[:, None])


def test_recall_counts_a_repeated_caption_as_one_text():
  """Three images; texts 0 and 1 are image 0's, text 1 is also image 1's
  (the same caption); text 2 is image 2's."""
  zimg = np.eye(3)
  ztxt = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
  pairs = np.array([[1, 1, 0], [0, 1, 0], [0, 0, 1]], bool)
  got = image_text.recalls(zimg, ztxt, pairs, ks=(1, 2))
  # Image 0's nearest text is text 1 (its own): a hit; image 1's nearest
  # is text 0 (image 0's), its own second; image 2's is its own.
  assert got["img2txt/recall@1"] == pytest.approx(2 / 3)
  assert got["img2txt/recall@2"] == 1.0
  # Text 0's nearest image is 1 (not its), text 1's is 0 (its), text 2's 2.
  assert got["txt2img/recall@1"] == pytest.approx(2 / 3)
  assert got["txt2img/recall@2"] == 1.0
  # A fourth image, whose text could not be read, is no query (it would
  # otherwise count as a hit at rank 0) but a candidate of the texts':
  # it is now text 2's nearest image.
  zimg = np.concatenate([zimg, [[0.0, 0.0, 2.0]]])
  pairs = np.concatenate([pairs, [[False] * 3]])
  got = image_text.recalls(zimg, ztxt, pairs, ks=(1, 2))
  assert got["img2txt/recall@1"] == pytest.approx(2 / 3)
  assert got["txt2img/recall@1"] == pytest.approx(1 / 3)


def _count(result, name):
  """An accuracy over the 360 test digits as a whole count of them."""
  correct = result[name] * 360
  assert abs(correct - round(correct)) < 1e-3, (name, correct)


def test_clip_trains_over_eight_devices_and_evaluates_as_the_command_does(
    tfds_data_dir, tmp_path):
  """CLIP's recipe (runlocal, 2 steps) trains on the built-in captions over
  8 devices, evaluates zero-shot on the 360 test digits and recall over
  their 50 distinct captions; `vit-jax zeroshot`'s evaluation of the
  workdir, with the tokenizer file the run kept, gives what training's
  gave. (SigLIP's ring, trained and
  evaluated: tests/test_multiprocess.py.)"""
  config = recipes.get_config("clip,runlocal")
  config.data_dir = tfds_data_dir
  config.total_steps = 2
  result = trainer.train_and_evaluate(config, str(tmp_path))
  assert np.isfinite(result["train/loss"])
  assert result["zeroshot/num_examples"] == 360
  _count(result, "zeroshot/accuracy")
  assert (result["retrieval/num_images"],
          result["retrieval/num_texts"]) == (360, 50)
  for way in ("img2txt", "txt2img"):
    at = [result[f"retrieval/{way}/recall@{k}"] for k in (1, 5, 10)]
    assert 0 <= at[0] <= at[1] <= at[2] <= 1, (way, at)
  loaded = zero_shot.load(str(tmp_path))
  assert loaded.trained_here and "b" not in loaded.params
  # The run kept its tokenizer's file: its checkpoint reads with it.
  assert loaded.config.text.tokenizer == str(tmp_path / "tokenizer.model")
  again = zero_shot.evaluate(loaded, data_dir=tfds_data_dir)
  for name in ("zeroshot/accuracy", "retrieval/img2txt/recall@1",
               "retrieval/txt2img/recall@5"):
    assert again[name] == result[name], name


@pytest.mark.xdist_group("trained_digits")
def test_lit_trains_the_text_tower_on_a_locked_digits_vit(
    trained_digits, tfds_data_dir, tmp_path):
  """LiT from the trained digits ViT: the image tower is the checkpoint's,
  unchanged after training (no gradient, no optimizer state), its head
  not loaded; the text tower left its random init. Without a checkpoint
  the recipe is refused before anything runs."""
  config = recipes.get_config(f"lit_digits,init={trained_digits},runlocal")
  config.data_dir = tfds_data_dir
  # The evaluators are the CLIP test's and the two-process SigLIP test's.
  config.evals.zeroshot.enabled = config.evals.retrieval.enabled = False
  trainer.train_and_evaluate(config, str(tmp_path))
  final = zero_shot.load(str(tmp_path))
  params = zero_shot.flat_params(final)
  vit = weights.read_converted(trained_digits, 4).params
  image = {k[4:]: v for k, v in params.items() if k.startswith("img/")}
  assert "head/kernel" not in image and image.keys() <= vit.keys()
  for name, value in image.items():
    np.testing.assert_array_equal(value, vit[name], err_msg=name)
  initial, _ = sharding.random_params(final.model, final.config.image_size,
                                      final.config.seed, final.mesh)
  initial = flax.traverse_util.flatten_dict(jax.device_get(initial), sep="/")
  text = [k for k in params if k.startswith("txt/")]
  assert text and all(
      not np.array_equal(params[k], initial[k]) for k in text), text
  with pytest.raises(UserError, match="config.init.checkpoint"):
    objectives.check_config(recipes.get_config("lit_digits,runlocal"))


@pytest.mark.parametrize("arg", [
    "siglip_b16,dataset=img2dataset:/data/laion,tokenizer=/c4_en.model",
    "lit_b16,dataset=img2dataset:/data/cc12m,tokenizer=/c4_en.model",
    "siglip2,dataset=coco_captions,tokenizer=/gemma/tokenizer.json",
    "siglip_b16,runlocal", "lit_b16,runlocal", "siglip2,runlocal"
])
def test_full_size_presets_pass_the_config_checks(arg, tfds_data_dir):
  """The presets not trained here are valid configs (their shrunk forms
  pass every check before compiling, on this machine's mesh)."""
  config = recipes.get_config(arg)
  checks.check_fields(config)
  if arg.endswith("runlocal"):
    config.unlock().data_dir = tfds_data_dir
    checks.check_config(config, sharding.make_mesh())
