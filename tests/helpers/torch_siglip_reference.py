"""transformers' SiglipModel (SigLIP: an image and a text tower, sigmoid
logits) at a tiny size, with weights at trained-like scales.

Used where torch is installed (tests/references/generate.py `siglip`),
never by the suite, which reads what it computed (`stored.py`): the
directory `save_pretrained` writes (tests/references/tiny_hf_siglip/) and
its outputs (tiny_hf_siglip_outputs.safetensors). Nothing is downloaded:
the model is built from its config classes.

Also transformers' Siglip2Model (SigLIP 2's NaFlex towers: patches cut
beforehand, each image its own grid, a 4x4 position table resized to it)
at the same sizes (`siglip2_*`; generate.py `siglip2`: the directory
tiny_hf_siglip2/ and tiny_hf_siglip2_outputs.safetensors).
"""

import math

import numpy as np

# For its torchvision stand-in, before transformers is imported.
from tests.helpers import torch_reference  # noqa: F401  pylint: disable=unused-import
from tests.references import stored

BATCH = 4
IMAGE_SIZE = 16
TEXT_LENGTH = 8
# SigLIP's sentencepiece tokenizer: "</s>" (id 1) is both the end of a text
# and the padding (padding="max_length", as the model was trained).
EOS_ID = 1
FIRST_WORD_ID = 2
TINY_SIGLIP_VISION = dict(hidden_size=32, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=2,
                          num_channels=3, image_size=IMAGE_SIZE, patch_size=4,
                          vision_use_head=True)
TINY_SIGLIP_TEXT = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=2, vocab_size=100, max_position_embeddings=TEXT_LENGTH,
    projection_size=32, pad_token_id=EOS_ID, eos_token_id=EOS_ID,
    bos_token_id=None)
LOGIT_SCALE = math.log(5.0)  # exp(): 5.
LOGIT_BIAS = -2.0
SEED = 60


def config():
  """The tiny SiglipConfig (LayerNorm eps 1e-6 and gelu_pytorch_tanh, the
  defaults; eager attention)."""
  import transformers  # pylint: disable=g-import-not-at-top
  cfg = transformers.SiglipConfig(
      text_config=transformers.SiglipTextConfig(**TINY_SIGLIP_TEXT),
      vision_config=transformers.SiglipVisionConfig(**TINY_SIGLIP_VISION))
  cfg._attn_implementation = "eager"  # pylint: disable=protected-access
  return cfg


def siglip_model(seed: int = SEED):
  """The tiny SiglipModel, eval mode, float32, each parameter (in creation
  order) from `stored.trained_like_state`: kernels, embeddings and the
  attention pool's in_proj_weight std 1/sqrt(fan-in), LayerNorm scales
  1 + 0.2 noise, biases and the probe 0.3 noise; then logit_scale log(5),
  logit_bias -2."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  model = transformers.SiglipModel(config())
  parameters = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
  # The parameters are the whole state: nothing else would be saved.
  assert sorted(model.state_dict()) == sorted(n for n, _ in parameters)
  state = stored.trained_like_state(parameters, seed=seed)
  state["logit_scale"] = np.full((1,), LOGIT_SCALE, np.float32)
  state["logit_bias"] = np.full((1,), LOGIT_BIAS, np.float32)
  model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
  return model.float().eval()


def inputs(seed: int = SEED):
  """(pixel_values, input_ids): BATCH x 3 x 16 x 16 float32 in [-1, 1]
  (NCHW, transformers' layout) and BATCH x 8 int64: words in [2, 100), then
  the EOS id, then EOS (the pad) to the end; the last row has 7 words and
  its EOS, no padding."""
  rng = np.random.default_rng(seed)
  pixels = rng.uniform(-1, 1, (BATCH, 3, IMAGE_SIZE, IMAGE_SIZE)).astype(
      np.float32)
  ids = np.full((BATCH, TEXT_LENGTH), EOS_ID, np.int64)
  for row, words in enumerate((3, 5, 1, TEXT_LENGTH - 1)):
    ids[row, :words] = rng.integers(FIRST_WORD_ID,
                                    TINY_SIGLIP_TEXT["vocab_size"], words)
  return pixels, ids


def outputs(model, pixels: np.ndarray, ids: np.ndarray) -> dict:
  """What SiglipModel and its towers compute (no attention mask, as SigLIP
  was trained), each a contiguous float32 array."""
  import torch  # pylint: disable=g-import-not-at-top
  x, t = torch.from_numpy(pixels), torch.from_numpy(ids)
  with torch.no_grad():
    both = model(input_ids=t, pixel_values=x)
    vision = model.vision_model(pixel_values=x)
    text = model.text_model(input_ids=t)
  out = {
      "image_embeds": both.image_embeds,
      "text_embeds": both.text_embeds,
      "logits_per_image": both.logits_per_image,
      "logits_per_text": both.logits_per_text,
      "vision_pooler_output": vision.pooler_output,
      "vision_last_hidden_state": vision.last_hidden_state,
      "text_pooler_output": text.pooler_output,
      "text_last_hidden_state": text.last_hidden_state,
  }
  # Views (strided) would be stored as the memory they point into.
  return {k: np.ascontiguousarray(v.numpy()) for k, v in out.items()}


def check(model, pixels: np.ndarray, ids: np.ndarray, out: dict):
  """What the stored arrays must satisfy, by transformers' own numbers:
  the towers' pooler outputs are the model's embeddings before the L2
  normalisation; the text pools the last position (head(final_layer_norm
  (...)[:, -1])); the logits are text_embeds @ image_embeds.T *
  exp(logit_scale) + logit_bias."""
  import torch  # pylint: disable=g-import-not-at-top
  del pixels, ids
  for tower, embeds in (("vision", "image_embeds"), ("text", "text_embeds")):
    pooled = out[f"{tower}_pooler_output"]
    np.testing.assert_allclose(
        pooled / np.linalg.norm(pooled, axis=-1, keepdims=True), out[embeds],
        rtol=1e-5, atol=1e-6)
  with torch.no_grad():
    head = model.text_model.head(
        torch.from_numpy(out["text_last_hidden_state"][:, -1])).numpy()
  np.testing.assert_allclose(head, out["text_pooler_output"], rtol=1e-5,
                             atol=1e-6)
  logits = (out["text_embeds"] @ out["image_embeds"].T * math.exp(LOGIT_SCALE) +
            LOGIT_BIAS)
  np.testing.assert_allclose(logits, out["logits_per_text"], rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_array_equal(out["logits_per_image"],
                                out["logits_per_text"].T)


def save_pretrained_checked(model, directory: str, pixels: np.ndarray,
                            ids: np.ndarray, out: dict):
  """model.save_pretrained(directory), then SiglipModel.from_pretrained of
  it (local, nothing downloaded) must load every weight (none missing,
  unexpected or of another shape) and compute `out` again."""
  import transformers  # pylint: disable=g-import-not-at-top
  model.save_pretrained(directory)
  loaded, info = transformers.SiglipModel.from_pretrained(
      directory, local_files_only=True, output_loading_info=True,
      attn_implementation="eager")
  problems = {k: v for k, v in info.items() if v}
  if problems:
    raise ValueError(f"{directory}: {problems}")
  again = outputs(loaded.eval(), pixels, ids)
  for key, value in out.items():
    np.testing.assert_array_equal(again[key], value, err_msg=key)


# SigLIP 2 (NaFlex): the images come as patches, each image its own grid of
# (rows, cols) patches, padded to MAX_PATCHES.
SIGLIP2_MAX_PATCHES = 24
SIGLIP2_GRIDS = ((3, 5), (4, 4), (2, 2), (4, 6))
SIGLIP2_PATCH = 4
TINY_SIGLIP2_VISION = dict(hidden_size=32, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=2,
                           num_channels=3, patch_size=SIGLIP2_PATCH,
                           num_patches=16, vision_use_head=True)
TINY_SIGLIP2_TEXT = TINY_SIGLIP_TEXT
SIGLIP2_SEED = 61


def siglip2_config():
  """The tiny Siglip2Config: the SigLIP sizes, a 4x4 position table
  (num_patches 16); LayerNorm eps 1e-6 and gelu_pytorch_tanh, the
  defaults; eager attention."""
  import transformers  # pylint: disable=g-import-not-at-top
  cfg = transformers.Siglip2Config(
      text_config=transformers.Siglip2TextConfig(**TINY_SIGLIP2_TEXT),
      vision_config=transformers.Siglip2VisionConfig(**TINY_SIGLIP2_VISION))
  cfg._attn_implementation = "eager"  # pylint: disable=protected-access
  return cfg


def siglip2_model(seed: int = SIGLIP2_SEED):
  """The tiny Siglip2Model, eval mode, float32, its parameters as
  `siglip_model`'s (`stored.trained_like_state`, then logit_scale log(5),
  logit_bias -2)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  model = transformers.Siglip2Model(siglip2_config())
  parameters = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
  # The parameters are the whole state: nothing else would be saved.
  assert sorted(model.state_dict()) == sorted(n for n, _ in parameters)
  state = stored.trained_like_state(parameters, seed=seed)
  state["logit_scale"] = np.full((1,), LOGIT_SCALE, np.float32)
  state["logit_bias"] = np.full((1,), LOGIT_BIAS, np.float32)
  model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
  return model.float().eval()


def siglip2_inputs(seed: int = SIGLIP2_SEED) -> dict:
  """Siglip2Model's inputs, and the images they were cut from.

  images: BATCH x 16 x 24 x 3 float32, image i uniform in [-1, 1] in its
  top-left image_sizes[i] = (rows * 4, cols * 4) of SIGLIP2_GRIDS[i],
  zeros elsewhere. pixel_values: BATCH x 24 x 48, each image cut into
  patches by transformers' own Siglip2ImageProcessor functions
  (`convert_image_to_patches` of the CHW image: patches row-major over
  the grid, each patch's vector ordered (row in patch, column in patch,
  channel)), then `pad_along_first_dim` to 24 patches with zeros;
  pixel_attention_mask: BATCH x 24 int32, 1 for an image's patches, 0 for
  the padding; spatial_shapes: BATCH x 2 int64 (rows, cols).
  input_ids: as `inputs`' (EOS = pad = 1 at the tail)."""
  import torch  # pylint: disable=g-import-not-at-top

  # pylint: disable-next=g-import-not-at-top
  from transformers.models.siglip2 import image_processing_siglip2
  rng = np.random.default_rng(seed)
  p = SIGLIP2_PATCH
  height = max(r for r, _ in SIGLIP2_GRIDS) * p
  width = max(c for _, c in SIGLIP2_GRIDS) * p
  images = np.zeros((BATCH, height, width, 3), np.float32)
  sizes = np.array([(r * p, c * p) for r, c in SIGLIP2_GRIDS], np.int64)
  pixel_values, masks = [], []
  for i, (h, w) in enumerate(sizes):
    images[i, :h, :w] = rng.uniform(-1, 1, (h, w, 3))
    chw = torch.from_numpy(
        np.ascontiguousarray(images[i, :h, :w].transpose(2, 0, 1)))
    patches = image_processing_siglip2.convert_image_to_patches(chw, p)
    patches, mask = image_processing_siglip2.pad_along_first_dim(
        patches, SIGLIP2_MAX_PATCHES)
    pixel_values.append(patches.numpy())
    masks.append(mask.numpy())
  ids = np.full((BATCH, TEXT_LENGTH), EOS_ID, np.int64)
  for row, words in enumerate((3, 5, 1, TEXT_LENGTH - 1)):
    ids[row, :words] = rng.integers(FIRST_WORD_ID,
                                    TINY_SIGLIP2_TEXT["vocab_size"], words)
  return {
      "images": images,
      "image_sizes": sizes,
      "pixel_values": np.stack(pixel_values).astype(np.float32),
      "pixel_attention_mask": np.stack(masks).astype(np.int32),
      "spatial_shapes": np.array(SIGLIP2_GRIDS, np.int64),
      "input_ids": ids,
  }


def siglip2_outputs(model, inputs: dict) -> dict:
  """What Siglip2Model and its towers compute (the pixel attention mask;
  no text attention mask, as SigLIP was trained), each a contiguous
  float32 array. vision_last_hidden_state's padding rows are whatever
  transformers computes there (nothing attends to them)."""
  import torch  # pylint: disable=g-import-not-at-top
  pixels = torch.from_numpy(inputs["pixel_values"])
  mask = torch.from_numpy(inputs["pixel_attention_mask"])
  shapes = torch.from_numpy(inputs["spatial_shapes"])
  ids = torch.from_numpy(inputs["input_ids"])
  with torch.no_grad():
    both = model(input_ids=ids, pixel_values=pixels, pixel_attention_mask=mask,
                 spatial_shapes=shapes)
    vision = model.vision_model(pixel_values=pixels, pixel_attention_mask=mask,
                                spatial_shapes=shapes)
    text = model.text_model(input_ids=ids)
  out = {
      "image_embeds": both.image_embeds,
      "text_embeds": both.text_embeds,
      "logits_per_image": both.logits_per_image,
      "logits_per_text": both.logits_per_text,
      "vision_pooler_output": vision.pooler_output,
      "vision_last_hidden_state": vision.last_hidden_state,
      "text_pooler_output": text.pooler_output,
      "text_last_hidden_state": text.last_hidden_state,
  }
  # Views (strided) would be stored as the memory they point into.
  return {k: np.ascontiguousarray(v.numpy()) for k, v in out.items()}


def siglip2_check(model, inputs: dict, out: dict):
  """`check`'s relations, and: each patch vector is the image's pixels
  (row in patch, column in patch, channel), the patches row-major, the
  padding zeros with mask 0; the vision outputs of the images' own
  patches do not change when the padding patches' pixels do."""
  p = SIGLIP2_PATCH
  for i, (rows, cols) in enumerate(SIGLIP2_GRIDS):
    h, w = inputs["image_sizes"][i]
    assert (h, w) == (rows * p, cols * p)
    grid = inputs["images"][i, :h, :w].reshape(rows, p, cols, p, 3)
    np.testing.assert_array_equal(
        grid.transpose(0, 2, 1, 3, 4).reshape(rows * cols, p * p * 3),
        inputs["pixel_values"][i, :rows * cols])
    np.testing.assert_array_equal(inputs["pixel_values"][i, rows * cols:], 0)
    np.testing.assert_array_equal(inputs["pixel_attention_mask"][i],
                                  np.arange(SIGLIP2_MAX_PATCHES) < rows * cols)
    np.testing.assert_array_equal(inputs["images"][i, h:], 0)
    np.testing.assert_array_equal(inputs["images"][i, :, w:], 0)
  check(model, None, None, out)
  noisy = dict(inputs)
  noisy["pixel_values"] = np.where(
      inputs["pixel_attention_mask"][..., None] > 0, inputs["pixel_values"],
      np.float32(7.0))
  again = siglip2_outputs(model, noisy)
  np.testing.assert_allclose(again["vision_pooler_output"],
                             out["vision_pooler_output"], rtol=1e-5, atol=1e-6)
  for i, (rows, cols) in enumerate(SIGLIP2_GRIDS):
    np.testing.assert_allclose(
        again["vision_last_hidden_state"][i, :rows * cols],
        out["vision_last_hidden_state"][i, :rows * cols], rtol=1e-5, atol=1e-5)


def siglip2_save_pretrained_checked(model, directory: str, inputs: dict,
                                    out: dict):
  """As `save_pretrained_checked`, by Siglip2Model.from_pretrained."""
  import transformers  # pylint: disable=g-import-not-at-top
  model.save_pretrained(directory)
  loaded, info = transformers.Siglip2Model.from_pretrained(
      directory, local_files_only=True, output_loading_info=True,
      attn_implementation="eager")
  problems = {k: v for k, v in info.items() if v}
  if problems:
    raise ValueError(f"{directory}: {problems}")
  again = siglip2_outputs(loaded.eval(), inputs)
  for key, value in out.items():
    np.testing.assert_array_equal(again[key], value, err_msg=key)
