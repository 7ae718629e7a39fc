"""timm's Eva families beyond DINOv3 (weights/timm/eva.py): EVA-02 (SwiGLU
packed, SwiGLU with its inner LayerNorm, the CLIP tower's LayerNorm over
the heads), RoPE-ViT (axial, with a table, mixed), timm's own RoPE ViT,
Perception Encoder core and DINOv3's SwiGLU models (ViT-S+/16's form).
Each tiny model was built by its timm model function and run by timm
(tests/references, `generate.py rope`); here it loads from the file
alone, its family and form decided from the file, with timm's logits and
features, and at another grid with no resize where it has no table; a
timm directory's model_args change what its function set; a model of
another form is refused with the flags it needs.
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import compiled
from tests.references import stored
from vit_jax import inference
from vit_jax import weights
from vit_jax.config import model_form
from vit_jax.models import sequences
from vit_jax.models import variants
from vit_jax.weights import describe

_AXIAL = dict(rope="axial", rope_layout="interleaved")
# Each family's name (what `inspect` says) and the form its file decides.
FAMILIES = {
    "eva02": ("EVA-02",
              dict(_AXIAL, rope_temperature=10000.0, rope_reference_grid=16,
                   swiglu=True, key_bias=False, pooled_norm=True)),
    "eva02_subln": ("EVA-02",
                    dict(_AXIAL, swiglu=True, mlp_norm=True, key_bias=False,
                         rope_reference_grid=16)),
    "eva02_clip": ("EVA-02",
                   dict(_AXIAL, swiglu=True, mlp_norm=True, attention_norm=True,
                        key_bias=False)),
    "rope_axial": ("RoPE-ViT, axial",
                   dict(_AXIAL, rope_temperature=100.0, rope_axes="column_row",
                        layer_scale=1e-5)),
    "rope_ape": ("RoPE-ViT, axial",
                 dict(_AXIAL, posemb_covers_prefix=False,
                      rope_axes="column_row")),
    "rope_mixed": (
        "RoPE-ViT, mixed", dict(_AXIAL, rope="mixed", rope_axes="column_row")),
    "rope_sbb": ("timm's RoPE ViT",
                 dict(_AXIAL, rope_temperature=10000.0, rope_reference_grid=16,
                      num_registers=1, key_bias=False)),
    "pe": ("Perception Encoder",
           dict(_AXIAL, rope_axes="column_row", rope_grid_offset=1.0,
                rope_reference_grid=4, map_heads=8, pre_norm=True,
                layer_norm_eps=1e-5)),
    "dinov3_swiglu": ("DINOv3",
                      dict(rope="dinov3", swiglu=True, num_registers=4,
                           qkv_bias=False)),
}
POOLING = {
    "eva02": "gap",
    "eva02_subln": "gap",
    "rope_sbb": "gap",
    "pe": "map",
    "dinov3_swiglu": "gap"
}
NO_TABLE = ("rope_axial", "rope_mixed", "rope_sbb", "dinov3_swiglu")


def _register_tiny_sizes():
  for name, mlp in (("tiny-timm", 128), ("tiny-eva", 85)):  # EVA-02: 8/3 D.
    variants.register(
        name,
        variants.Variant(hidden_size=32, mlp_dim=mlp, num_heads=4, num_layers=2,
                         patch_size=8))


def test_eva_families_load_with_timms_outputs_from_files_and_directories(
    tmp_path):
  """Each family from its file alone: `inspect` names it, the form (RoPE's
  base, layout, axes, offset, reference grid; SwiGLU, its LayerNorms;
  biases; PE's pool) is decided, timm's logits and features to 1e-5 at
  32 x 32, and at 32 x 48 (a 4 x 6 grid) with no resize where there is no
  table; a directory's model_args say what its function did not."""
  _register_tiny_sizes()
  wide = stored.tiny_rope_output("wide_images")
  for name in stored.TINY_EVA_MODELS:
    family, form = FAMILIES[name]
    path = stored.path(f"tiny_{name}.safetensors")
    said = describe.describe_model(path)[0]
    assert f"family: {family}" in said, said
    arch = weights.read_architecture(path)
    options = dict(arch.options)
    assert arch.classifier == POOLING.get(name, "token"), name
    for field, value in form.items():
      assert options.get(field, getattr(arch, field,
                                        None)) == value, (name, field)
    loaded = inference.load(path, image_size=32)
    params = jax.device_get(loaded.params)
    logits = compiled.logits(loaded.model, params, stored.tiny_images())
    want = stored.tiny_rope_output(name)
    assert np.abs(want).max() > 0.5
    assert np.abs(logits - want).max() < 1e-5, (name,
                                                np.abs(logits - want).max())
    _, out = jax.jit(loaded.model.apply,
                     static_argnames="return_intermediates")({
                         "params": params
                     }, stored.tiny_images(), return_intermediates=True)
    np.testing.assert_allclose(out["encoded"],
                               stored.tiny_rope_output(f"{name}_features"),
                               atol=1e-5, rtol=0, err_msg=name)
    if name == "pe":  # Its pool reads the class token on sequences too.
      seq = sequences.from_images(stored.tiny_images(), 8, length=20)
      np.testing.assert_allclose(
          jax.jit(loaded.model.apply)({
              "params": params
          }, seq)[0], want, atol=1e-5, rtol=0)
    if name in NO_TABLE:
      target = jax.eval_shape(loaded.model.init, jax.random.key(0),
                              jnp.zeros((1, 32, 48, 3)))["params"]
      prefix = loaded.model.form.num_prefix_tokens
      _, report = weights.load(
          path, target, num_prefix_tokens=prefix, grid=(4, 6),
          model_options=dataclasses.asdict(loaded.model.form))
      assert report.ok and not report.resized, report.table()
      logits = compiled.logits(loaded.model, params, wide)
      assert np.abs(logits -
                    stored.tiny_rope_output(f"{name}_wide")).max() < 1e-5, name

  # A timm directory: its function's name and model_args over the family's
  # defaults (PE's pool heads and pooling as written; a RoPE base changed).
  for name, args, expected in (
      ("pe", {
          "ref_feat_shape": [4, 4],
          "attn_pool_num_heads": 8
      }, {}),
      ("rope_axial", {
          "rope_temperature": 50.0
      }, {
          "rope_temperature": 50.0
      }),
      ("eva02", {}, {}),
      ("rope_mixed", {}, {}),
  ):
    directory = tmp_path / name
    directory.mkdir()
    (directory / "model.safetensors").write_bytes(
        open(stored.path(f"tiny_{name}.safetensors"), "rb").read())
    (directory / "config.json").write_text(
        json.dumps({
            "architecture": stored.tiny_rope_timm_model(name),
            "num_classes": 10,
            "model_args": args
        }))
    from_file = dict(
        weights.read_architecture(
            stored.path(f"tiny_{name}.safetensors")).options)
    from_directory = dict(weights.read_architecture(str(directory)).options)
    assert from_directory == {
        **from_file,
        **expected, "gelu_approximate": False
    }, name


def test_a_model_of_another_form_is_refused_with_the_flags():
  """The axial RoPE-ViT's file into a DINOv3-form model: one line naming
  each field that differs and its flag; nothing loads."""
  _register_tiny_sizes()
  path = stored.path("tiny_rope_axial.safetensors")
  loaded = inference.load(path, image_size=32)
  other = dataclasses.replace(loaded.model.form, rope="dinov3",
                              rope_layout="half", rope_axes="row_column")
  target = jax.eval_shape(loaded.model.init, jax.random.key(0),
                          jnp.zeros((1, 32, 32, 3)))["params"]
  with pytest.raises(weights.WeightsError) as refused:
    weights.load(path, target, num_prefix_tokens=1, grid=(4, 4),
                 model_options=dataclasses.asdict(other))
  assert "\n" not in str(refused.value)
  assert str(refused.value).endswith(
      "set --config.model.rope=axial --config.model.rope_layout=interleaved "
      "--config.model.rope_axes=column_row."), str(refused.value)


def test_the_eva02_preset_is_the_form_its_files_have():
  """`configs/finetune.py`'s family=eva02 sets every field an EVA-02 B/L
  file decides (its tiny reference's: SwiGLU with its LayerNorm), and
  layer-wise decay; a Ti/S file differs in mlp_norm alone."""
  from configs import finetune  # pylint: disable=g-import-not-at-top
  _register_tiny_sizes()
  config = finetune.get_config("digits,family=eva02,runlocal")
  assert (config.layer_decay, config.optimizer) == (0.7, "adam")
  preset = finetune.FAMILIES["eva02"][0]
  for name, differs in (("eva02_subln", {}), ("eva02", {"mlp_norm": False})):
    arch = weights.read_architecture(stored.path(f"tiny_{name}.safetensors"))
    fields = {**model_form.defaults(), **arch.model_fields()}
    # Each field the preset sets, but for the training's and the GELU
    # (timm's files compute erf: decided from their origin).
    assert {
        k: fields[k]
        for k in set(preset) - {"drop_path_rate", "gelu_approximate"}
        if config.model[k] != fields[k]
    } == differs, name
