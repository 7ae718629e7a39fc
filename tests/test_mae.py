"""Masked autoencoders (`models/mae.py`): against facebookresearch/mae's own
code, the loss against float64 numpy, the encoder on the visible patches
against the whole encoder, the step sharded, configs and their errors."""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from safetensors import numpy as st_numpy

from configs import fewshot as fewshot_configs
from configs import mae as mae_configs
from tests.helpers import tiny_models
from tests.references import stored
from vit_jax import evaluators
from vit_jax import inference
from vit_jax import models
from vit_jax import objectives
from vit_jax import sharding
from vit_jax import weights
from vit_jax.analysis import reconstructions
from vit_jax.data import input_pipeline
from vit_jax.data import specs
from vit_jax.errors import UserError
from vit_jax.fewshot import sweep
from vit_jax.loop import checks
from vit_jax.loop import trainer
from vit_jax.models import embeddings
from vit_jax.models import mae
from vit_jax.models import sequences
from vit_jax.models import variants
from vit_jax.objectives import masked_autoencoding
from vit_jax.training import optim
from vit_jax.training import train_state

# tests/references/mae_reference.py's model: 16 px, patch 4, width 32, 2
# blocks of 4 heads, a 32-wide 2-block decoder of 16 heads.
REFERENCE = dict(hidden_size=32, mlp_dim=128, num_heads=4, num_layers=2,
                 patch_size=4, gelu_approximate=False)
REFERENCE_DECODER = mae.DecoderSize(32, 2, 16, 128)


def _register_reference():
  """The reference's encoder as the variant `mae-reference`."""
  variants.register(
      "mae-reference",
      models.Variant(**{
          k: v for k, v in REFERENCE.items() if k != "gelu_approximate"
      }))


def _images(batch=2, size=16, seed=0):
  rng = np.random.default_rng(seed)
  return jnp.asarray(rng.uniform(-1, 1, (batch, size, size, 3)), jnp.float32)


def _params(model, images, masking, seed=0, scale=0.3):
  """Random parameters at a useful scale everywhere (drawn by numpy)."""
  shapes = jax.eval_shape(
      lambda: model.init(jax.random.key(0), images, masking=masking))["params"]
  rng = np.random.default_rng(seed)
  return jax.tree.map(
      lambda x: jnp.asarray(scale * rng.normal(size=x.shape), jnp.float32),
      shapes)


def test_mae_computes_what_facebookresearch_mae_computes():
  """Its `models_mae.py` on the same weights (its full checkpoint, read
  without torch) and the same mask: the encoder's output, every patch's
  prediction, and the loss of both targets (stored outputs)."""
  io = st_numpy.load_file(stored.path("tiny_mae_io.safetensors"))
  images = jnp.asarray(io["images"])
  masking = mae.masking_from_noise(jnp.asarray(io["noise"]), 0.75)
  np.testing.assert_array_equal(masking.ids_restore_BxN, io["ids_restore"])
  np.testing.assert_array_equal(masking.removed_BxN, io["mask"])
  model = mae.MaskedAutoencoder(tiny_models.vit(**REFERENCE), REFERENCE_DECODER)
  target = jax.eval_shape(
      lambda: model.init(jax.random.key(0), images, masking=masking))["params"]
  loaded, report = weights.load(stored.path("tiny_mae_full.pth"), target,
                                num_prefix_tokens=1, grid=(4, 4),
                                gelu_approximate=False)
  assert report.origin == "mae" and not report.reinitialised
  assert not report.dropped and not report.warnings
  assert any("fixed sin-cos ones the decoder computes" in n
             for n in report.notes), report.notes
  params = flax.traverse_util.unflatten_dict(loaded, sep="/")
  _, out = model.apply({"params": params}, images, masking=masking)
  np.testing.assert_allclose(out["encoded"], io["latent"], atol=1e-5)
  np.testing.assert_allclose(out["mae_predictions"], io["pred"], atol=1e-5)
  for name, normalize in (("loss", True), ("loss_pixels", False)):
    sums = masked_autoencoding.reconstruction_sums(
        lambda x, **kw: model.apply({"params": params}, x, masking=masking),
        images, jax.random.key(0), _mae_config(normalize), 4, masking=masking)
    np.testing.assert_allclose(sums.mean(), io[name][0], rtol=1e-5)


def _mae_config(normalize=True, ratio=0.75):
  config = mae_configs.get_config("digits,runlocal").unlock()
  config.mae.norm_pix_loss, config.mae.mask_ratio = normalize, ratio
  return config.mae


def _numpy_loss(images, predictions, removed, patch, normalize):
  """MAE's loss from its definition, in float64."""
  x = np.asarray(images, np.float64)
  b, h, w, c = x.shape
  target = x.reshape(b, h // patch, patch, w // patch, patch, c).transpose(
      0, 1, 3, 2, 4, 5).reshape(b, -1, patch * patch * c)
  if normalize:
    mean = target.mean(-1, keepdims=True)
    var = target.var(-1, ddof=1, keepdims=True)
    target = (target - mean) / np.sqrt(var + 1e-6)
  per_patch = ((np.asarray(predictions, np.float64) - target)**2).mean(-1)
  return (per_patch * removed).sum() / removed.sum()


@pytest.mark.parametrize("normalize", [True, False])
def test_loss_is_the_float64_definition_and_reads_dropped_patches_only(
    normalize):
  images = _images(3, 8)
  predictions = jnp.asarray(
      np.random.default_rng(1).normal(size=(3, 4, 48)), jnp.float32)
  masking = mae.sample_masking(jax.random.key(3), 3, 4, 0.5)
  removed = np.asarray(masking.removed_BxN)
  assert (removed.sum(1) == 2).all()
  config = _mae_config(normalize, 0.5)

  def loss(predictions, images):
    apply = lambda x, **kw: (None, {"mae_predictions": predictions})
    sums = masked_autoencoding.reconstruction_sums(apply, images,
                                                   jax.random.key(0), config, 4,
                                                   masking=masking)
    return sums.mean()

  np.testing.assert_allclose(
      loss(predictions, images),
      _numpy_loss(images, predictions, removed, 4, normalize), rtol=1e-6)
  # Only the dropped patches' predictions and pixels reach the loss.
  grads = np.abs(np.asarray(jax.grad(loss)(predictions, images))).sum(-1)
  assert np.all(grads[removed == 0] == 0) and np.all(grads[removed == 1] > 0)
  pixel_grads = np.abs(np.asarray(jax.grad(loss, 1)(predictions, images)))
  visible = np.repeat(np.repeat((removed == 0).reshape(3, 2, 2), 4, 1), 4, 2)
  assert np.all(pixel_grads[visible] == 0)


def test_masking_keeps_the_same_count_per_image_drawn_from_the_key():
  masking = mae.sample_masking(jax.random.key(7), 64, 16, 0.75)
  assert masking.keep == 4 and mae.num_kept(196, 0.75) == 49
  removed = np.asarray(masking.removed_BxN)
  assert (removed.sum(1) == 12).all()
  np.testing.assert_array_equal(
      np.sort(np.asarray(masking.ids_keep_BxK), 1),
      np.stack([np.flatnonzero(r == 0) for r in removed]))
  # Every patch is kept by about a quarter of the images; the draw is the
  # key's alone.
  assert 0.1 < (1 - removed).mean(0).min() and (1 -
                                                removed).mean(0).max() < 0.45
  again = mae.sample_masking(jax.random.key(7), 64, 16, 0.75)
  np.testing.assert_array_equal(masking.ids_shuffle_BxN, again.ids_shuffle_BxN)


FORMS = {
    "learned, class token": dict(),
    "sincos2d, gap": dict(posemb="sincos2d", classifier="gap"),
    "factorized, registers": dict(posemb="factorized", num_registers=2),
    "axial RoPE": dict(posemb="none", rope="axial", rope_layout="interleaved"),
}


def test_the_encoder_on_visible_patches_is_the_whole_encoder_masked():
  """With each position-embedding form: the ViT on the visible patches
  alone gives, at those patches (and the prefix tokens), what it gives on
  the whole image when nothing attends to a dropped patch (the dropped
  patches a second image of the sequence)."""
  images = _images(2, 16)
  masking = mae.sample_masking(jax.random.key(1), 2, 16, 0.75)
  for name, form in FORMS.items():
    vit = tiny_models.vit(hidden_size=16, mlp_dim=32, num_heads=2, num_layers=2,
                          patch_size=4, **form)
    params = jax.jit(vit.init)(jax.random.key(0), images)["params"]
    whole = sequences.from_images(images, 4)
    segments = 2 - (np.asarray(masking.removed_BxN) == 0)  # 1 kept, 2 not.
    whole = whole.replace(segments=jnp.asarray(segments, jnp.int32))
    apply = jax.jit(vit.apply)
    _, masked = apply({"params": params}, whole)
    _, visible = apply({"params": params},
                       mae.visible_patches(images, 4, masking))
    prefix = vit.form.num_prefix_tokens
    at_kept = jnp.take_along_axis(masked["encoded"][:, prefix:],
                                  masking.ids_keep_BxK[..., None], axis=1)
    np.testing.assert_allclose(visible["encoded"][:, prefix:], at_kept,
                               atol=2e-6, err_msg=name)
    np.testing.assert_allclose(visible["encoded"][:, :prefix],
                               masked["encoded"][:, :prefix], atol=2e-6,
                               err_msg=name)


def test_decoder_sits_beside_the_vit_and_the_vit_alone_is_unchanged():
  """The decoder's parameters are all under `mae_decoder/`; without a
  masking the model is the ViT alone; with one, each prediction reads the
  [mask] token where its patch was dropped."""
  images = _images(2, 16)
  plain = tiny_models.vit(hidden_size=16, mlp_dim=32, num_heads=2, num_layers=2,
                          patch_size=4)
  model = mae.MaskedAutoencoder(plain, mae.DecoderSize(8, 1, 2, 16))
  masking = mae.sample_masking(jax.random.key(2), 2, 16, 0.75)
  params = _params(model, images, masking)
  plain_params = plain.init(jax.random.key(0), images)["params"]
  assert set(params) == set(plain_params) | {"mae_decoder"}
  assert set(
      params["mae_decoder"]) == {"embed", "mask_token", "Transformer", "pred"}
  _, alone = plain.apply(
      {"params": {
          k: v for k, v in params.items() if k != "mae_decoder"
      }}, images)
  _, out = model.apply({"params": params}, images)
  np.testing.assert_array_equal(out["encoded"], alone["encoded"])
  assert "mae_predictions" not in out
  _, out = model.apply({"params": params}, images, masking=masking)
  assert out["mae_predictions"].shape == (2, 16, 48)
  # The dropped patches' pixels are never read.
  removed = np.asarray(masking.removed_BxN).reshape(2, 4, 4)
  hidden = np.repeat(np.repeat(removed, 4, 1), 4, 2)[..., None] == 1
  _, other = model.apply({"params": params}, jnp.where(hidden, -images, images),
                         masking=masking)
  np.testing.assert_array_equal(out["mae_predictions"],
                                other["mae_predictions"])


def test_mae_step_under_fsdp_tp_scan_and_remat_equals_one_device(digits_config):
  """The masking is drawn for the global batch before the step splits it,
  so two steps on 8 devices (FSDP over 4, tensor parallelism over 2; the
  decoder's blocks tensor-parallel too), and on 4 (FSDP's explicit
  per-shard step, two micro-batches), train as one device does, the
  encoder scanned and rematerialised throughout."""
  config = mae_configs.get_config("digits,runlocal").unlock()
  config.data_dir = digits_config.data_dir
  config.optimizer, config.lr, config.warmup_steps = "sgd", 0.1, 0
  config.model.scan_layers, config.model.remat = True, "full"
  source = input_pipeline.make_source(specs.training(config))
  batches = input_pipeline.make_train_iterator(specs.training(config), source,
                                               labels=False)
  batches = [next(batches) for _ in range(2)]
  tx, schedule = optim.make_optimizer(config, config.total_steps)
  results = []
  for data, tp, accum in ((1, 1, 1), (4, 2, 1), (4, 1, 2)):
    config.accum_steps = accum
    config.sharding.params = ((".*", "fsdp+tp" if tp > 1 else
                               "fsdp" if data > 1 else "replicate"),)
    config.sharding.fsdp_min_size = 0
    mesh = sharding.make_mesh(data, tp, devices=jax.devices()[:data * tp])
    model = objectives.model(objectives.decide(config), None)
    state, state_sharding = train_state.create_train_state(
        model, tx, 16, 0, mesh, config.sharding)
    step = objectives.train_step(config, model, tx, schedule, mesh,
                                 state_sharding)
    losses = []
    for batch in batches:
      state, metrics = step(state, sharding.to_global_batch(batch, mesh))
      losses.append(float(metrics["loss"]))
    results.append((losses, jax.device_get(state.params)))
    if tp > 1:
      decoder_query = state.params["mae_decoder"]["Transformer"][
          "encoderblock_0"]["MultiHeadDotProductAttention_1"]["query"]["kernel"]
      assert "model" in tuple(decoder_query.sharding.spec)
  assert results[0][0][1] < results[0][0][0]
  for losses, params in results[1:]:
    np.testing.assert_allclose(results[0][0], losses, rtol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
        results[0][1], params)


@pytest.mark.parametrize("field, value, message", [
    ("model.variant", "testing-hybrid", "ResNet stem"),
    ("model.variant", "testing-mixer", "a Mixer cannot"),
    ("model.classifier", "map", "never trains"),
    ("mae.mask_ratio", 1.0, "mask_ratio=1.0 must leave some"),
    ("mae.mask_ratio", 0.0, "mask_ratio=0.0 must leave some"),
    ("mae.decoder_width", 30, "decoder_width=30 must be a multiple of 4"),
    ("mae.decoder_depth", 0, "decoder_depth=0 must be a positive"),
    ("sequence_length", 16, "masks whole images"),
    ("mixup.alpha", 0.2, "mixes labels"),
])
def test_bad_mae_config_fails_before_compiling(tfds_data_dir, field, value,
                                               message):
  config = mae_configs.get_config("digits,runlocal").unlock()
  config.data_dir = tfds_data_dir
  section, _, name = field.rpartition(".")
  (config[section] if section else config)[name] = value
  if value == "testing-mixer":  # A Mixer pools by the mean of its patches.
    config.model.classifier = "gap"
  with pytest.raises(UserError, match=message):
    checks.check_config(config, sharding.make_mesh())


@pytest.mark.parametrize("arg", [
    "digits", "digits_finetune,init=/tmp/mae", "i1k", "i1k,variant=ViT-L/16",
    "i1k,init=ViT-B/16@mae-full", "i1k_finetune,init=ViT-B/16@mae",
    "i1k_finetune,variant=ViT-L/16"
])
def test_presets_pass_the_config_checks(arg):
  config = mae_configs.get_config(arg)
  checks.check_fields(config)
  if arg.startswith("i1k_finetune"):  # MAE's FINETUNE.md, B and L.
    large = "L/16" in arg
    assert config.layer_decay == (0.75 if large else 0.65)
    assert config.lr == pytest.approx(4e-3 if large else 2e-3)
    assert (config.num_epochs,
            config.model.drop_path_rate) == ((50, 0.2) if large else (100, 0.1))
  if arg.startswith("i1k") and config.objective == "mae":
    assert config.lr == pytest.approx(2.4e-3) and config.num_epochs == 800


def test_imagenet_pretraining_keeps_maes_table_for_fine_tuning():
  """MAE's pre-training from scratch starts a learned table, frozen, at
  MAE's sin-cos values, so its checkpoint holds the table that fine-tuning
  (whose model has the same table) loads and trains, as MAE's does."""
  tables = {}
  for arg in ("i1k,runlocal", "i1k_finetune,runlocal"):
    config = weights.decide(mae_configs.get_config(arg))
    checks.check_fields(config)
    model = objectives.model(config, None if "finetune" not in arg else 10)
    params = model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)))["params"]
    tables[arg] = params["Transformer"]["posembed_input"]["pos_embedding"]
  pretrain, finetune = tables.values()
  assert pretrain.shape == finetune.shape == (1, 1 + 16, 16)
  np.testing.assert_array_equal(pretrain[0, 0], 0.0)  # The class token's.
  np.testing.assert_allclose(pretrain[0, 1:],
                             embeddings.mae_sincos_table(4, 4, 16))
  assert mae_configs.get_config("i1k").frozen == (
      "Transformer/posembed_input/pos_embedding",)


@pytest.fixture(scope="module")
def continued(tfds_data_dir, tmp_path_factory):
  """facebookresearch/mae's full file (the stored reference's; a variant of
  its size registered here) continued for 30 MAE steps on digits, its
  position table frozen as MAE's: (workdir, config, what it loaded, final
  metrics)."""
  _register_reference()
  config = mae_configs.get_config("digits,runlocal").unlock()
  config.data_dir = tfds_data_dir
  config.model.variant = "mae-reference"
  config.total_steps, config.lr = 30, 3e-3
  config.mae.update(
      dict(
          zip(("decoder_width", "decoder_depth", "decoder_heads",
               "decoder_mlp_dim"), REFERENCE_DECODER)))
  config.init.checkpoint = stored.path("tiny_mae_full.pth")
  config.frozen = ("Transformer/posembed_input/pos_embedding",)
  decided = weights.decide(config)
  assert decided.model.gelu_approximate is False  # timm's, MAE's encoder.
  target = models.param_shapes(objectives.model(decided, None), 16)
  loaded, report = weights.load_for_config(decided, config.init.checkpoint,
                                           target)
  assert not report.reinitialised and not report.dropped
  workdir = str(tmp_path_factory.mktemp("mae"))
  return workdir, config, loaded, trainer.train_and_evaluate(config, workdir)


def test_a_full_checkpoint_continues_pre_training(continued, tfds_data_dir):
  """Loaded whole, encoder and decoder, it trains on: the reconstruction
  loss falls below the loaded weights' own, its position table stays as
  loaded (frozen), the rest moves; evaluating the saved parameters again
  gives what the run logged (the same masking each time). `analyze`'s
  reconstructions read its decoder (sizes from the workdir) and paste the
  visible patches back exactly, with MAE's loss on the dropped ones."""
  workdir, config, loaded, result = continued
  assert result["mae/num_examples"] == 360
  assert result["mae/num_patches"] == 360 * 12  # 12 of 16 dropped.
  assert "test/accuracy" not in result  # No labels, no classification.
  final = weights.read_converted(workdir, 4).params
  np.testing.assert_array_equal(final[weights.POSEMB], loaded[weights.POSEMB])
  for name in ("mae_decoder/mask_token", "mae_decoder/pred/kernel",
               "embedding/kernel"):
    assert not np.array_equal(final[name], loaded[name]), name
  mesh = sharding.mesh_from_config(config)
  model = objectives.model(objectives.decide(config), None)
  state, shardings = train_state.create_train_state(model, optax.identity(), 16,
                                                    1, mesh)
  params = weights.init_params(config, workdir, state.params, shardings.params)
  [entry] = evaluators.from_config(
      config, model, mesh, shardings.params,
      input_pipeline.make_source(specs.training(config)))
  assert entry.name == "mae"  # The only entry for this objective.
  again = entry.evaluator.run(params)
  assert again["loss"] == pytest.approx(result["mae/loss"], rel=1e-6)
  before = entry.evaluator.run(
      weights.init_params(config, config.init.checkpoint, state.params,
                          shardings.params))
  assert result["mae/loss"] < 0.9 * before["loss"], (result, before)

  checkpoint = inference.load(workdir)
  decoder = reconstructions.decoder_of(checkpoint)
  assert decoder.size == REFERENCE_DECODER and decoder.mask_ratio == 0.75
  images = _images(3)
  masked, predicted, pasted, loss = reconstructions.reconstruct(
      checkpoint, decoder, images, seed=1)
  masking = mae.sample_masking(jax.random.key(1), 3, 16, 0.75)
  dropped = np.asarray(masking.removed_BxN).reshape(3, 4, 1, 4, 1)
  dropped = np.broadcast_to(dropped, (3, 4, 4, 4, 4)).reshape(3, 16, 16, 1)
  np.testing.assert_array_equal(np.where(dropped, predicted, images), pasted)
  np.testing.assert_array_equal(np.where(dropped, 0.0, images), masked)
  sums = masked_autoencoding.reconstruction_sums(
      lambda x, **kw: model.apply({"params": params}, x, **kw), images,
      jax.random.key(0), config.mae, 4, masking=masking)
  np.testing.assert_allclose(loss.mean(), sums.mean(), rtol=1e-5)


def test_an_encoder_file_loads_as_the_full_files_vit():
  """facebookresearch/mae's encoder file (`mae_pretrain_vit_*.pth`: the
  full file without the decoder; what `ViT-B/16@mae` names) reads as the
  full file's ViT, its sin-cos table as a learned one, and fine-tunes: only
  the new head is initialised."""
  full = weights.read_converted(stored.path("tiny_mae_full.pth"), 4).params
  encoder = weights.read_converted(stored.path("tiny_mae_encoder.pth"),
                                   4).params
  assert encoder.keys() == {k for k in full if not k.startswith("mae_decoder")}
  for name, value in encoder.items():
    np.testing.assert_array_equal(value, full[name], err_msg=name)
  _register_reference()
  config = mae_configs.get_config(
      f"digits_finetune,init={stored.path('tiny_mae_encoder.pth')},runlocal")
  config.model.variant = "mae-reference"
  decided = weights.decide(config)
  target = models.param_shapes(objectives.model(decided, 10), 16)
  _, report = weights.load_for_config(decided, config.init.checkpoint, target)
  assert not report.dropped
  assert {name for name, _ in report.reinitialised} == {
      "head/kernel", "head/bias"
  }


def test_the_checkpoint_fine_tunes_and_sweeps_as_any_vit(
    continued, tfds_data_dir):
  """Fine-tuning loads the ViT and leaves the decoder out; few-shot
  sweeps it."""
  workdir, *_ = continued
  finetune = mae_configs.get_config(f"digits_finetune,init={workdir},runlocal")
  finetune.data_dir = tfds_data_dir
  finetune.model.variant = "mae-reference"
  decided = weights.decide(finetune)
  target = models.param_shapes(objectives.model(decided, 10), 16)
  _, report = weights.load_for_config(decided, workdir, target)
  dropped = {name for name, _ in report.dropped}
  assert dropped and all(n.startswith("mae_decoder/") for n in dropped)
  assert {name for name, _ in report.reinitialised} == {
      "head/kernel", "head/bias"
  }
  fewshot = fewshot_configs.get_config("digits,runlocal")
  fewshot.data_dir = tfds_data_dir
  table, _ = sweep.sweep(fewshot, [workdir])
  assert 0.1 <= table[workdir]["digits"]["1shot"] <= 1.0
