"""Rotary position embeddings (config.model.rope, models/rope.py) and
DINOv3's files: timm's tiny DINOv3s (tests/references, built and run by
timm) load from the file alone with timm's logits and features at two
shapes, with no resize step; an independent float64 numpy forward of a
RoPE model; the sequence path (one image or two packed) equals the image
path at any shape; scanned and rematerialised equal looped.

The numpy forward is written from DINOv3's definition (Siméoni et al.
2025, its RopePositionEmbedding), never from `vit_jax`:

  p     = 2 (c + 0.5) / n - 1 per axis (row of n rows, column of n columns)
  T_k   = base^(4k / K), k < K/4, K the head width
  theta = 2 pi p / T_k: the row's K/4 angles, then the column's
  x'    = x cos(theta, theta) + [-x2, x1] sin(theta, theta), x = [x1, x2]
          (halves), on the patch tokens' queries and keys after their
          projection; the class token and registers are not rotated

and the other forms from timm's RotaryEmbeddingCat and RoPE-ViT's paper
(Heo et al. 2024): axial p = (c + offset) r / n (r a reference grid, where
set), theta = p / T_k, channel pairs (2j, 2j + 1) where interleaved;
mixed theta_h = p_row f_0h + p_col f_1h of learned f.
"""

import dataclasses
import functools
import os

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import numpy as st_numpy

from tests.helpers import compiled
from tests.helpers import numpy_reference as ref
from tests.helpers import tiny_models
from tests.references import stored
from vit_jax import inference
from vit_jax import sharding
from vit_jax import weights
from vit_jax.models import rope
from vit_jax.models import sequences
from vit_jax.models import variants

TINY_TIMM = variants.Variant(hidden_size=32, mlp_dim=128, num_heads=4,
                             num_layers=2, patch_size=8)
ROPE = dict(posemb="none", rope="dinov3", rope_temperature=100.0)
# The tiny DINOv3's form (what its file's family note says).
DINOV3 = dict(ROPE, num_registers=4, layer_scale=1e-5, layer_norm_eps=1e-5,
              classifier="gap", class_token=True, gelu_approximate=False)


def test_dinov3_files_load_with_timms_outputs_at_any_shape(tmp_path):
  """Each tiny DINOv3 of timm (no qkv biases; `_qkvb`'s query and value
  biases): read from the file alone (family, RoPE, registers, LayerScale,
  pooling), timm's logits at 32 x 32 and at 32 x 48 (a 4 x 6 grid: nothing
  is resized) and its features (all 21 tokens); a timm directory as the
  file; into a model without RoPE, one line with the flags."""
  variants.register("tiny-timm", TINY_TIMM)
  wide = stored.tiny_rope_output("wide_images")
  for name in stored.TINY_ROPE_MODELS:
    path = stored.path(f"tiny_{name}.safetensors")
    arch = weights.read_architecture(path)
    assert (arch.classifier, arch.class_token, arch.posemb) == ("gap", True,
                                                                "none")
    options = dict(arch.options)
    assert {
        k: options[k]
        for k in ("rope", "rope_temperature", "num_registers", "layer_norm_eps")
    } == {
        "rope": "dinov3",
        "rope_temperature": 100.0,
        "num_registers": 4,
        "layer_norm_eps": 1e-5
    }
    # No biases, or the query's and value's only.
    assert (options.get("qkv_bias", True), options.get(
        "key_bias", True)) == ((True, False) if name == "dinov3_qkvb" else
                               (False, True))
    loaded = inference.load(path, image_size=32)
    params = jax.device_get(loaded.params)
    # At a 4 x 6 grid the file loads as it is: no step resizes anything.
    target = jax.eval_shape(loaded.model.init, jax.random.key(0),
                            jnp.zeros((1, 32, 48, 3)))["params"]
    at_wide, report = weights.load(
        path, target, num_prefix_tokens=5, grid=(4, 6),
        model_options=dataclasses.asdict(loaded.model.form))
    assert report.ok and not report.resized and len(
        report.matched) == len(at_wide), report.table()
    for images, key in ((stored.tiny_images(), name), (wide, f"{name}_wide")):
      logits = compiled.logits(loaded.model, params, images)
      want = stored.tiny_rope_output(key)
      assert np.abs(want).max() > 0.5
      assert np.abs(logits - want).max() < 1e-5, (key,
                                                  np.abs(logits - want).max())
    _, out = loaded.model.apply({"params": params}, stored.tiny_images(),
                                return_intermediates=True)
    np.testing.assert_allclose(out["encoded"],
                               stored.tiny_rope_output(f"{name}_features"),
                               atol=1e-5, rtol=0)

  # A timm directory (save_for_hf's layout) reads as the file.
  directory = tmp_path / "dinov3_dir"
  directory.mkdir()
  (directory / "model.safetensors").write_bytes(
      open(stored.path("tiny_dinov3.safetensors"), "rb").read())
  (directory / "config.json").write_text(
      '{"architecture": "vit_small_patch16_dinov3", "num_classes": 10}')
  from_file = weights.read_architecture(stored.path("tiny_dinov3.safetensors"))
  from_directory = weights.read_architecture(str(directory))
  assert from_directory == dataclasses.replace(
      from_file, options=from_file.options + (("gelu_approximate", False),))

  plain = tiny_models.vit(num_classes=10, **dataclasses.asdict(TINY_TIMM),
                          num_registers=4, layer_scale=1e-5, qkv_bias=False)
  target = jax.eval_shape(plain.init, jax.random.key(0),
                          jnp.zeros((1, 32, 32, 3)))["params"]
  with pytest.raises(weights.WeightsError) as refused:
    weights.load(stored.path("tiny_dinov3.safetensors"), target,
                 num_prefix_tokens=5, grid=(4, 4),
                 model_options=dataclasses.asdict(plain.form))
  assert "\n" not in str(refused.value)
  assert str(refused.value).endswith(
      "but the model has posemb=learn, rope=none, layer_norm_eps=1e-06: set "
      "--config.model.posemb=none --config.model.rope=dinov3 "
      "--config.model.layer_norm_eps=1e-05.")


@pytest.mark.parametrize("name", ["hf_dinov3", "hf_dinov3_gated"])
def test_transformers_dinov3_files_give_its_outputs(name, tmp_path):
  """transformers' DINOv3ViTModel (4 registers, no head: it pools the class
  token) and its gated form (SwiGLU), as its save_pretrained wrote them
  (blocks `layer.N.`, the Hub's DINOv3s' names): the directory, and its
  model.safetensors alone, give transformers' tokens and pooler output at
  32 x 32 and 32 x 48; so does a state dict in its modules' names
  (`model.layer.N.`)."""
  variants.register("tiny-timm", TINY_TIMM)
  directory = stored.path(f"tiny_{name}")
  file = os.path.join(directory, "model.safetensors")
  state = st_numpy.load_file(file)
  assert "layer.0.norm1.weight" in state
  modules = str(tmp_path / "state_dict.safetensors")
  st_numpy.save_file(
      {
          ("model." + k if k.startswith("layer.") else k): v
          for k, v in state.items()
      }, modules)
  wide = stored.tiny_rope_output("wide_images")
  for checkpoint in (directory, file, modules):
    loaded = inference.load(checkpoint, image_size=32)
    assert (loaded.model.form.classifier, loaded.model.form.key_bias,
            loaded.model.form.swiglu, loaded.model.form.num_registers,
            loaded.model.num_classes) == ("token", False,
                                          name.endswith("gated"), 4, None)
    for images, suffix in ((stored.tiny_images(), ""), (wide, "_wide")):
      _, out = jax.jit(loaded.model.apply)({
          "params": jax.device_get(loaded.params)
      }, images)
      for ours, theirs in (("encoded", "tokens"), ("pre_logits", "pooler")):
        np.testing.assert_allclose(
            out[ours], stored.tiny_rope_output(f"{name}_{theirs}{suffix}"),
            atol=1e-5, rtol=0, err_msg=f"{checkpoint} {ours}{suffix}")


# ---------------------------------------------------- float64 reference --


def _positions(grid, form):
  """(h*w, 2) positions of the patches, by the module doc's definitions."""
  h, w = grid
  rows, cols = np.divmod(np.arange(h * w), w)
  if form.get("rope", "dinov3") == "dinov3":
    p = np.stack([2 * (rows + 0.5) / h - 1, 2 * (cols + 0.5) / w - 1], -1)
  else:  # timm's index grid: offset, then scaled to the reference grid.
    p = np.stack([rows, cols], -1) + form.get("rope_grid_offset", 0.0)
    if form.get("rope_reference_grid"):
      p = p / np.array([h, w]) * form["rope_reference_grid"]
  return p[:, ::-1] if form.get("rope_axes") == "column_row" else p


def _rope_tables(grid, head_dim, form, frequencies=None):
  """(sin, cos), (h*w, K) or with mixed frequencies (h*w, H, K)."""
  p = _positions(grid, form)
  if frequencies is not None:  # theta_h = p_0 f_0h + p_1 f_1h.
    theta = np.einsum("na,ahk->nhk", p, frequencies)
  else:
    periods = form.get("rope_temperature",
                       100.0)**(4 * np.arange(head_dim // 4) / head_dim)
    scale = 2 * np.pi if form.get("rope", "dinov3") == "dinov3" else 1.0
    theta = (scale * p[:, :, None] / periods).reshape(len(p), -1)
  if form.get("rope_layout", "half") == "half":
    theta = np.concatenate([theta, theta], -1)
  else:
    theta = np.repeat(theta, 2, -1)
  return np.sin(theta), np.cos(theta)


def _rotated(x_BxNxHxK, sin, cos, prefix, layout="half"):
  patches = x_BxNxHxK[:, prefix:]
  if layout == "half":
    half = x_BxNxHxK.shape[-1] // 2
    turned = np.concatenate([-patches[..., half:], patches[..., :half]], -1)
  else:  # Channel pairs (2j, 2j + 1) -> (-x_2j+1, x_2j).
    turned = np.stack([-patches[..., 1::2], patches[..., ::2]], -1).reshape(
        patches.shape)
  if sin.ndim == 2:
    sin, cos = sin[:, None], cos[:, None]
  patches = patches * cos + turned * sin
  return np.concatenate([x_BxNxHxK[:, :prefix], patches], 1)


def _silu(x):
  return x / (1 + np.exp(-x))


def _numpy_forward(params, images, patch, registers, form):
  """Logits of a RoPE ViT: class token, registers, no position table,
  LayerScale, the mean of the patch tokens; with `form`'s SwiGLU MLP
  (SiLU(x Gate) * (x Dense_0)), LayerNorms inside the MLP and over the
  attention's heads, and RoPE-Mixed's frequencies per block."""
  p = jax.tree.map(lambda v: np.asarray(v, np.float64), params)
  kernel = p["embedding"]["kernel"]
  grid = (images.shape[1] // patch, images.shape[2] // patch)
  x = ref.patchify(images, patch) @ kernel.reshape(
      -1, kernel.shape[-1]) + p["embedding"]["bias"]
  batch, width = len(x), x.shape[-1]
  prefix = np.concatenate([
      np.broadcast_to(p["cls"], (batch, 1, width)),
      np.broadcast_to(p["registers"], (batch, registers, width))
  ], 1)
  x = np.concatenate([prefix, x], 1)
  enc = p["Transformer"]
  for i in range(2):
    block = enc[f"encoderblock_{i}"]
    mha = block["MultiHeadDotProductAttention_1"]
    y = ref.layer_norm(x, block["LayerNorm_0"])
    heads = lambda name, y=y, mha=mha: (np.einsum("bnd,dhk->bnhk", y, mha[name][
        "kernel"]) + mha[name]["bias"])
    q, k, v = heads("query"), heads("key"), heads("value")
    sin, cos = _rope_tables(grid, q.shape[-1], form,
                            mha.get("rope_frequencies"))
    layout = form.get("rope_layout", "half")
    q, k = (_rotated(t, sin, cos, 1 + registers, layout) for t in (q, k))
    a = ref.softmax(np.einsum("bmhk,bnhk->bhmn", q, k) / np.sqrt(q.shape[-1]))
    a = np.einsum("bhmn,bnhk->bmhk", a, v)
    if "heads_ln" in mha:  # One LayerNorm over all heads' outputs.
      flat = a.reshape(*a.shape[:2], -1)
      flat = ref.layer_norm(
          flat, {n: mha["heads_ln"][n].reshape(-1) for n in ("scale", "bias")})
      a = flat.reshape(a.shape)
    a = np.einsum("bmhk,hkd->bmd", a, mha["out"]["kernel"]) + mha["out"]["bias"]
    x = x + a * block["LayerScale_attention"]["scale"]
    mlp, y = block["MlpBlock_3"], ref.layer_norm(x, block["LayerNorm_2"])
    if "Gate" in mlp:
      h = _silu(ref.dense(y, mlp["Gate"])) * ref.dense(y, mlp["Dense_0"])
    else:
      h = ref.gelu_tanh(ref.dense(y, mlp["Dense_0"]))
    if "LayerNorm_0" in mlp:
      h = ref.layer_norm(h, mlp["LayerNorm_0"])
    x = x + ref.dense(h, mlp["Dense_1"]) * block["LayerScale_mlp"]["scale"]
  x = ref.layer_norm(x, enc["encoder_norm"])[:, 1 + registers:].mean(1)
  return ref.dense(x, p["head"])


def _tiny_rope_model(**options):
  return tiny_models.vit(num_classes=7, hidden_size=32, mlp_dim=64, num_heads=4,
                         num_layers=2, patch_size=4, **{
                             **ROPE, "classifier": "gap",
                             **options
                         })


# The forms the float64 forward checks: DINOv3's; EVA-02's axial RoPE
# (interleaved, column first, offset, reference grid) with SwiGLU and its
# LayerNorms; RoPE-Mixed's learned frequencies.
_FORMS = (
    dict(ROPE),
    dict(rope="axial", rope_temperature=10000.0, rope_layout="interleaved",
         rope_axes="column_row", rope_grid_offset=1.0, rope_reference_grid=6,
         posemb="none", swiglu=True, mlp_norm=True, attention_norm=True),
    dict(rope="mixed", rope_temperature=10.0, rope_layout="interleaved",
         posemb="none"),
)


def test_a_rope_model_matches_a_float64_numpy_forward_at_two_shapes():
  """In float64, at 16 x 16 and 12 x 20 px (4 x 4 and 3 x 5 grids), the
  same weights, for each RoPE form (`_FORMS`): logits to 1e-5 (RoPE's
  angles are float32, as DINOv3's and timm's); RoPE stores nothing but the
  mixed form's frequencies (no position table), and without it the logits
  differ (the check can fail)."""
  rng = np.random.default_rng(0)
  for form in _FORMS:
    model = _tiny_rope_model(class_token=True, num_registers=2, layer_scale=0.5,
                             **form)
    with jax.enable_x64(True):
      model = tiny_models.with_form(model, dtype="float64",
                                    param_dtype="float64")
      shapes = jax.eval_shape(model.init, jax.random.key(0),
                              np.zeros((1, 16, 16, 3)))["params"]
      params = jax.tree.map(lambda v: v.astype(np.float64),
                            ref.trained_like_params(shapes, seed=3))
      flat = flax.traverse_util.flatten_dict(params, sep="/")
      assert not [n for n in flat if "posembed" in n]
      assert bool([n for n in flat if "rope_frequencies" in n
                  ]) == (form["rope"] == "mixed")
      for size in ((16, 16), (12, 20)):
        images = rng.normal(size=(2, *size, 3))
        logits, _ = jax.jit(model.apply)({"params": params}, images)
        want = _numpy_forward(params, images, 4, 2, form)
        assert np.abs(want).max() > 0.5
        np.testing.assert_allclose(logits, want, atol=1e-5, rtol=0,
                                   err_msg=form["rope"])
        if form["rope"] != "mixed":  # Its frequencies are parameters.
          without = tiny_models.with_form(model, rope="none")
          plain, _ = jax.jit(without.apply)({"params": params}, images)
          assert np.abs(plain - want).max() > 1e-2


def _packed(first, second):
  """Two one-image sequences as one sequence of both."""
  cat = lambda a, b: jnp.concatenate([a, b], axis=1)
  return sequences.PatchSequence(
      patches=cat(first.patches, second.patches), coords=cat(
          first.coords, second.coords), segments=cat(
              first.segments, 2 * second.segments), grids=cat(
                  first.grids, second.grids))


def test_sequences_equal_images_and_scanned_equals_looped():
  """A RoPE model (no prefix tokens, GAP) of each form (`_FORMS`: DINOv3's;
  axial with an offset and a reference grid, which scale by each image's
  own grid; mixed) on a square and a non-square image: each as a
  one-image sequence, and both packed in one, gives the image path's
  logits; scanned and rematerialised, the looped model's."""
  from vit_jax.models import scan  # pylint: disable=g-import-not-at-top
  square = np.random.default_rng(1).normal(size=(2, 16, 16, 3))
  wide = np.random.default_rng(2).normal(size=(2, 12, 20, 3))
  one = [sequences.from_images(x, 4, length=16) for x in (square, wide)]
  for form in _FORMS:
    model = _tiny_rope_model(**form)
    params = model.init(jax.random.key(0), square)["params"]
    params = jax.tree.map(jnp.asarray, ref.trained_like_params(params, seed=4))
    apply = jax.jit(lambda x, m=model, p=params: m.apply({"params": p}, x)[0])
    by_image = [apply(square), apply(wide)]
    assert np.abs(by_image[0]).max() > 0.1
    for seq, want in zip(one, by_image):
      np.testing.assert_allclose(apply(seq), want, atol=1e-5, rtol=0)
    both = apply(_packed(*one))  # B x 2 x classes.
    np.testing.assert_allclose(both[:, 0], by_image[0], atol=1e-5, rtol=0)
    np.testing.assert_allclose(both[:, 1], by_image[1], atol=1e-5, rtol=0)

    scanned = tiny_models.with_form(model, scan_layers=True, remat="full")
    stacked = scan.stack_layers(params)
    got = jax.jit(functools.partial(scanned.apply,
                                    {"params": stacked}))(wide)[0]
    np.testing.assert_allclose(got, by_image[1], atol=1e-5, rtol=0,
                               err_msg=form["rope"])


def test_a_dinov3_file_fine_tunes_at_two_shapes_predicts_exports_and_sweeps(
    tfds_data_dir, tmp_path, capsys):
  """timm's tiny DINOv3 with `configs/finetune.py`'s family=dinov3 (the
  form its family note names, layer decay): fine-tuned on digits at 48 px
  (a 6 x 6 grid; it stores no table: nothing is resized) and on
  non-square crops as patch sequences (each image its own grid); the
  48-px workdir predicts as its export to a timm directory does; swept
  few-shot over the class token and mean patch token together (DINOv3's
  linear probe)."""
  from configs import fewshot as fewshot_configs  # pylint: disable=g-import-not-at-top
  from configs import finetune  # pylint: disable=g-import-not-at-top
  from vit_jax.commands import export  # pylint: disable=g-import-not-at-top
  from vit_jax.fewshot import sweep  # pylint: disable=g-import-not-at-top
  from vit_jax.loop import trainer  # pylint: disable=g-import-not-at-top
  variants.register("tiny-timm", TINY_TIMM)
  path = stored.path("tiny_dinov3.safetensors")
  arch = weights.read_architecture(path)
  base = finetune.get_config("digits,family=dinov3,runlocal")
  base = base.copy_and_resolve_references()
  # The preset's form is the one the file's family note names.
  for field, value in arch.model_fields().items():
    if field != "variant":
      assert base.model[field] == value, field
  assert base.layer_decay == 0.75
  base.data_dir, base.init.checkpoint, base.total_steps = tfds_data_dir, path, 2
  base.model.variant = arch.variant
  runs = {
      "48px": dict(image_size=48),
      "sequences": dict(
          sequence_length=24, pp_train="aspect_crop(0.5)|resize_to_sequence|"
          "value_range|patchify", pp_eval="resize_to_sequence|value_range|"
          "patchify"),
  }
  for name, change in runs.items():
    config = base.copy_and_resolve_references()
    config.update(change)
    result = trainer.train_and_evaluate(config, str(tmp_path / name))
    assert result["test/num_examples"] == 360 and np.isfinite(
        result["train/loss"])
    said = capsys.readouterr().err
    assert "Initialised from" in said and "resized" not in said, said

  images = np.random.default_rng(0).uniform(-1, 1, (2, 48, 48, 3))
  outputs = []  # (logits of the new head, the features it reads).
  for checkpoint in (str(tmp_path / "48px"), str(tmp_path / "timm")):
    if checkpoint.endswith("timm"):
      export.export_directory(str(tmp_path / "48px"), "timm-dir", checkpoint)
    loaded = inference.load(checkpoint)
    assert loaded.config.model.rope == "dinov3"
    logits, out = jax.jit(loaded.model.apply)({
        "params": jax.device_get(loaded.params)
    }, images.astype(np.float32))
    outputs.append((logits, out["pre_logits"]))
  (logits, features), (logits_back, features_back) = outputs
  assert np.abs(logits).max() > 1e-5 and np.abs(features).max() > 0.5
  np.testing.assert_allclose(logits_back, logits, atol=1e-6, rtol=0)
  np.testing.assert_allclose(features_back, features, atol=2e-5, rtol=0)

  fewshot_config = fewshot_configs.get_config("runlocal")
  fewshot_config.data_dir = tfds_data_dir
  fewshot_config.image_size = 32
  fewshot_config.fewshot.layer = "class_and_patch_mean"
  table, _ = sweep.sweep(fewshot_config, [path])
  assert 0.1 < table[path]["digits"]["5shot"] <= 1.0


def test_dinovs_position_augmentations_apply_in_training_only():
  """rope_shift, rope_jitter and rope_rescale (DINOv3's) leave evaluation
  as without them; in training they move the positions, with one draw for
  the whole batch by default (two copies of one image in a batch get the
  same logits) and one per image with rope_augment_per=image (the copies
  differ); the same for the same rng, another for another (a step's)."""
  model = _tiny_rope_model(rope_shift=0.2, rope_jitter=1.5, rope_rescale=2.0)
  assert model.form.rope_augment_per == "block"
  image = np.random.default_rng(5).normal(size=(1, 16, 16, 3))
  twice = np.concatenate([image, image])
  params = model.init(jax.random.key(0), twice)["params"]
  params = jax.tree.map(jnp.asarray, ref.trained_like_params(params, seed=6))
  plain = tiny_models.with_form(model, rope_shift=0.0, rope_jitter=1.0,
                                rope_rescale=1.0)

  @functools.partial(jax.jit, static_argnums=(0, 2))
  def logits(m, x, train, seed=0):
    return m.apply({"params": params}, x, train=train,
                   rngs={"dropout": jax.random.key(seed)})[0]

  np.testing.assert_array_equal(logits(model, twice, False),
                                logits(plain, twice, False))
  for per in ("block", "batch", "image"):
    m = tiny_models.with_form(model, rope_augment_per=per)
    trained = logits(m, twice, True)
    copies_differ = np.abs(trained[0] - trained[1]).max()
    if per == "image":
      assert copies_differ > 1e-3, per  # A draw per image.
    else:
      assert copies_differ == 0, per  # One draw for the batch.
    assert np.abs(trained - logits(plain, twice, True)).max() > 1e-3, per
    np.testing.assert_array_equal(trained, logits(m, twice, True))
    assert np.abs(trained - logits(m, twice, True, 1)).max() > 1e-3, per


def test_dinovs_draws_are_per_block_or_per_batch_as_the_form_says(monkeypatch):
  """Every draw of the augmentations (`rope.augmented`), recorded: by
  default (DINOv3's code) each block draws its own for the whole batch (2
  blocks: 2 draws of one transform each, not alike); batch: one draw of one
  transform for every block; image: one draw, a transform per image."""
  drawn = []

  def recorded(form, positions, rng):
    moved = augmented(form, positions, rng)
    drawn.append(np.asarray(moved))
    return moved

  augmented = rope.augmented
  monkeypatch.setattr(rope, "augmented", recorded)
  model = _tiny_rope_model(rope_shift=0.3, rope_jitter=1.5, rope_rescale=2.0)
  images = np.random.default_rng(1).normal(size=(3, 16, 16, 3))
  params = model.init(jax.random.key(0), images)["params"]
  assert not drawn  # Not at init, nor in evaluation.
  for per, draws, rows in (("block", 2, 1), ("batch", 1, 1), ("image", 1, 3)):
    drawn.clear()
    tiny_models.with_form(model, rope_augment_per=per).apply(
        {"params": params}, images, train=True,
        rngs={"dropout": jax.random.key(0)})
    assert [d.shape[0] for d in drawn] == [rows] * draws, per
    assert drawn[0].shape[1:] == (16, 2)
    if per == "block":
      assert np.abs(drawn[0] - drawn[1]).min() > 0
    if per == "image":
      assert np.abs(drawn[0][0] - drawn[0][1]).max() > 1e-3


def test_dinovs_draws_are_the_same_on_any_mesh():
  """A batch of 8 split over 8, 2 or 1 of the simulated devices computes
  the same logits in training, each form of the draws: a draw is a
  function of the rng, not of where the batch lives."""
  images = np.random.default_rng(2).normal(size=(8, 16, 16, 3))
  model = _tiny_rope_model(rope_shift=0.3, rope_jitter=1.5, rope_rescale=2.0)
  params = model.init(jax.random.key(0), images[:1])["params"]
  params = jax.tree.map(jnp.asarray, ref.trained_like_params(params, seed=4))
  for per in ("block", "image"):
    m = tiny_models.with_form(model, rope_augment_per=per)

    def apply(x, m=m):
      return m.apply({"params": params}, x, train=True,
                     rngs={"dropout": jax.random.key(3)})[0]

    outputs = []
    for devices in (8, 2, 1):
      mesh = sharding.make_mesh(devices, 1, jax.devices()[:devices])
      batch = jax.device_put(images, sharding.batch_sharding(mesh))
      outputs.append(np.asarray(jax.jit(apply)(batch)))
    assert np.abs(outputs[0]).max() > 0.1
    for other in outputs[1:]:
      np.testing.assert_allclose(other, outputs[0], atol=1e-6, rtol=0,
                                 err_msg=per)
