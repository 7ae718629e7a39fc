"""Model variants by name: golden parameter counts (cross-checked by a
closed form), the released checkpoints' parameter names, and token grids.

Every variant is only traced (`jax.eval_shape`, no memory, no FLOPs).
"""

import functools

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import models
from vit_jax.errors import UserError
from vit_jax.models import VARIANTS
from vit_jax.models import variants

# 1000 classes, 224x224x3 input, no pre-logits. The released checkpoints'
# sizes; a new variant must add its own line here.
GOLDEN_PARAM_COUNTS = {
    "ViT-Ti/16": 5_717_416,
    "ViT-S/16": 22_050_664,
    "ViT-S/32": 22_878_952,
    "ViT-B/16": 86_567_656,
    "ViT-B/32": 88_224_232,
    "ViT-B/8": 86_576_872,
    "ViT-L/16": 304_326_632,
    "ViT-L/32": 306_535_400,
    "ViT-S/14": 22_004_584,
    "ViT-B/14": 86_475_496,
    "ViT-L/14": 304_203_752,
    "ViT-H/14": 632_045_800,
    "ViT-g/14": 1_012_611_432,
    "ViT-G/14": 1_844_440_680,
    # big_vision's table (its plain ViTs and SigLIP towers), counted here in
    # the same form as the rows above.
    "ViT-M/16": 38_837_736,
    "ViT-M/32": 39_942_120,
    "ViT-So400m/14": 413_597_656,
    "ViT-So400m/16": 413_735_896,
    "ViT-g-opt/14": 1_136_101_864,
    "ViT-g-opt/16": 1_136_286_184,
    "ViT-G-opt/14": 1_664_842_216,
    "ViT-e/14": 3_807_214_312,
    # EVA-02's sizes in the plain form (its files add SwiGLU's gate).
    "EVA02-Ti/14": 4_511_656,
    "EVA02-S/14": 17_279_848,
    "EVA02-B/14": 67_588_840,
    "EVA02-L/14": 237_029_336,
    "EVA02-B/16": 67_681_000,
    "R50+ViT-B/16": 98_659_112,
    "R50+ViT-L/32": 328_994_856,
    "R26+ViT-S/32": 36_431_912,
    "R26+ViT-B/32": 101_383_976,
    "R+ViT-Ti/16": 6_337_704,
    "testing": 72_472,
    "testing-hybrid": 155_272,
    "digits": 469_032,
    "digits-small": 185_864,
}


def variant_model(name: str, **kwargs) -> models.VisionTransformer:
  return models.create_model(name, **{"num_classes": 1000, **kwargs})


@functools.lru_cache(maxsize=None)
def abstract_init(name: str, size: int = 224, **kwargs):
  """Traces init of a variant: (param shapes, output shapes, token grid)."""
  model = variant_model(name, **kwargs)
  grid = {}

  def init(images):
    (_, out), variables = model.init_with_output(jax.random.key(0), images)
    grid["grid"] = out.pop("grid")  # Python ints, known while tracing.
    return variables["params"], out

  params, out = jax.eval_shape(
      init, jax.ShapeDtypeStruct((1, size, size, 3), jnp.float32))
  return params, out, grid["grid"]


def flat(params) -> dict:
  return flax.traverse_util.flatten_dict(params, sep="/")


# ------------------------------------------------------------------- sizes --

VIT_VARIANTS = sorted(
    n for n, v in VARIANTS.items() if isinstance(v, variants.Variant))


@pytest.mark.parametrize("name", VIT_VARIANTS)  # Mixers: test_mixer.py.
def test_param_count_matches_golden(name):
  assert name in GOLDEN_PARAM_COUNTS, (
      f"Variant {name!r} has no golden parameter count; add one.")
  # Scanned layers: the same parameters (see test_scan_layers_matches_loop...)
  # but traced in a fraction of the time of 12-32 unrolled blocks.
  params, _, _ = abstract_init(name, scan_layers=True)
  count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  assert count == GOLDEN_PARAM_COUNTS[name]


def plain_vit_param_count(v, image_size: int = 224, classes: int = 1000):
  """Closed form of a plain ViT's parameters (token classifier, no
  pre-logits): patch embedding, class token, position embeddings, per block
  two LayerNorms, q/k/v/out and the two MLP layers, final norm, head."""
  d, f, p = v.hidden_size, v.mlp_dim, v.patch_size
  tokens = (image_size // p)**2 + 1
  block = 2 * 2 * d + 4 * (d * d + d) + (d * f + f) + (f * d + d)
  return ((p * p * 3 * d + d) + d + tokens * d + v.num_layers * block + 2 * d +
          (d * classes + classes))


@pytest.mark.parametrize("name", [
    "ViT-B/16", "ViT-H/14", "ViT-g/14", "ViT-G/14", "ViT-M/16", "ViT-So400m/14",
    "ViT-g-opt/16", "ViT-G-opt/14", "ViT-e/14"
])
def test_golden_count_matches_closed_form(name):
  """An independent check of the golden table (about 1.0B for ViT-g/14 and
  1.8B for ViT-G/14, as Zhai et al. report)."""
  assert plain_vit_param_count(VARIANTS[name]) == GOLDEN_PARAM_COUNTS[name]


def siglip_tower_param_count(v, image_size: int):
  """Closed form of a SigLIP image tower: no class token, learned position
  embeddings, the blocks and final norm, a MAP head (probe, attention,
  LayerNorm, MLP) and no classification head."""
  d, f, p = v.hidden_size, v.mlp_dim, v.patch_size
  attention, mlp = 4 * (d * d + d), (d * f + f) + (f * d + d)
  block = 2 * 2 * d + attention + mlp
  map_head = d + attention + 2 * d + mlp
  return ((p * p * 3 * d + d) + (image_size // p)**2 * d +
          v.num_layers * block + 2 * d + map_head)


@pytest.mark.parametrize(
    "name,size,golden",
    [
        ("ViT-So400m/14", 224, 427_680_704),
        # The "384 px" release: a 27 x 27 grid (big_vision's convolution drops
        # the last 6 pixels; here the image is 378 px).
        ("ViT-So400m/14", 378, 428_225_600),
        ("ViT-B/16", 224, 92_884_224),
    ])
def test_siglip_image_tower_counts(name, size, golden):
  """SigLIP's towers (MAP pooling, no class token, no head): the model's
  count, the closed form's, and the golden number agree."""
  params, _, _ = abstract_init(name, size, classifier="map", class_token=False,
                               num_classes=None, scan_layers=True)
  count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  assert count == siglip_tower_param_count(VARIANTS[name], size) == golden


def test_every_golden_count_is_a_registered_variant():
  assert set(GOLDEN_PARAM_COUNTS) <= set(VIT_VARIANTS)


def test_vit_b16_param_names_match_released_checkpoint():
  params = flat(abstract_init("ViT-B/16")[0])
  expected = {
      "embedding/kernel": (16, 16, 3, 768),
      "embedding/bias": (768,),
      "cls": (1, 1, 768),
      "Transformer/posembed_input/pos_embedding": (1, 197, 768),
      "Transformer/encoderblock_0/LayerNorm_0/scale": (768,),
      "Transformer/encoderblock_11/MultiHeadDotProductAttention_1/query/kernel":
          (768, 12, 64),
      "Transformer/encoderblock_11/MultiHeadDotProductAttention_1/out/kernel": (
          12, 64, 768),
      "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel": (768, 3072),
      "Transformer/encoderblock_0/LayerNorm_2/bias": (768,),
      "Transformer/encoder_norm/scale": (768,),
      "head/kernel": (768, 1000),
  }
  for name, shape in expected.items():
    assert name in params, name
    assert params[name].shape == shape, name
  assert not any(k.startswith("pre_logits") for k in params)
  assert "Transformer/encoderblock_12/LayerNorm_0/scale" not in params


def test_vit_b16_with_representation_has_pre_logits():
  params = flat(abstract_init("ViT-B/16", representation_size=768)[0])
  assert params["pre_logits/kernel"].shape == (768, 768)
  assert params["head/kernel"].shape == (768, 1000)


def test_r50_vit_b16_param_names_match_released_checkpoint():
  params = flat(abstract_init("R50+ViT-B/16")[0])
  assert params["conv_root/kernel"].shape == (7, 7, 3, 64)
  for name in ("gn_root/scale", "block1/unit1/conv1/kernel",
               "block1/unit1/gn_proj/scale", "block3/unit9/conv3/kernel",
               "embedding/kernel", "Transformer/encoder_norm/scale"):
    assert name in params, name
  assert "block3/unit10/conv1/kernel" not in params
  assert "block4/unit1/conv1/kernel" not in params  # Stage 4 is removed.


@pytest.mark.parametrize("name,stride", [("R+ViT-Ti/16", 32),
                                         ("R50+ViT-B/16", 16),
                                         ("ViT-B/16", 16)])
def test_token_count_follows_variant_stride_at_224(name, stride):
  assert VARIANTS[name].stride == stride
  params, out, grid = abstract_init(name)
  assert grid == (224 // stride, 224 // stride)
  num_tokens = grid[0] * grid[1] + 1
  assert params["Transformer"]["posembed_input"]["pos_embedding"].shape[1] == (
      num_tokens)
  assert out["encoded"].shape == (1, num_tokens, VARIANTS[name].hidden_size)


def test_a_variant_the_attention_cannot_split_is_refused():
  with pytest.raises(UserError, match="hidden_size 100 is not divisible by "
                     "num_heads 3"):
    variants.register("odd", variants.Variant(100, 200, 3, 2, 4))
  with pytest.raises(UserError, match="every size must be positive"):
    variants.register("empty", variants.Variant(96, 0, 3, 2, 4))
  with pytest.raises(UserError, match="'ViT-B/16' is registered twice"):
    variants.register("ViT-B/16", variants.Variant(96, 192, 3, 2, 16))
  assert "odd" not in VARIANTS and "empty" not in VARIANTS
  same = VARIANTS["ViT-B/16"]
  assert variants.register("ViT-B/16", same) is same  # Imported twice.


@pytest.mark.parametrize("size, nearest", [(0, 16), (30, 32), (50, 48)])
def test_image_sizes_the_patches_do_not_tile_are_refused(size, nearest):
  with pytest.raises(
      UserError, match=f"--image_size {size} is not a multiple "
      f"of the 16-pixel patches of ViT-B/16; use e.g. {nearest}"):
    variants.check_image_size("ViT-B/16", size, "--image_size")
  variants.check_image_size("ViT-B/16", 32, "--image_size")
