"""ViT-22B's block options (config.model.parallel_block, use_bias, qkv_bias,
qk_norm): each against an independent float64 numpy forward, timm's forms
(qkv_bias=False, qk_norm, the fused ParallelScalingBlock) loading with timm's
logits, a checkpoint of the other form refused in one line, and a short
run on digits that resumes.

The numpy forward below is written from the options' definitions (Dehghani
et al. 2023, "Scaling Vision Transformers to 22 Billion Parameters",
Section 2; timm's `Attention(qk_norm=True)`), never from `vit_jax`:

  sequential block  x + A(LN0(x)), then + MLP(LN2(.))
  parallel block    x + A(LN0(x)) + MLP(LN0(x))          (no LN2)
  use_bias=False    no bias in the query/key/value/out projections nor in
                    any LayerNorm of the encoder (pre_norm, blocks,
                    encoder_norm); the MLP keeps its biases
  qkv_bias=False    no bias in the query/key/value projections alone
  qk_norm           LayerNorm over each head's features of the queries and
                    keys (eps 1e-6), before the 1/sqrt(K) scaling
"""

import functools
import json
import math
import os
import subprocess
import sys

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import numpy as st_numpy

from tests.helpers import compiled
from tests.helpers import numpy_reference as ref
from tests.helpers import processes
from tests.helpers import tiny_models
from tests.helpers import torch_env
from tests.references import stored
from tests.test_weights import TORCH_LIKE
from tests.test_weights import init
from tests.test_weights import load_params
from vit_jax import inference
from vit_jax import models
from vit_jax import weights
from vit_jax.loop import trainer
from vit_jax.models import scan
from vit_jax.models import variants

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH_PYTHON = torch_env.TORCH_PYTHON
TINY = dict(num_classes=7, hidden_size=32, mlp_dim=64, num_heads=4,
            num_layers=2, patch_size=4)
ALL = dict(parallel_block=True, use_bias=False, qkv_bias=False, qk_norm=True)
CASES = {
    "default": {},
    "parallel_block": dict(parallel_block=True),
    "use_bias=False": dict(use_bias=False),
    "qkv_bias=False": dict(qkv_bias=False),
    "qk_norm": dict(qk_norm=True),
    "all four": ALL,
    # timm's ViT-22B-like form (biased LayerNorms), with LayerScale in the
    # parallel branches, a pre-norm and GAP.
    "parallel, qkv_bias=False, qk_norm, LayerScale, pre-norm, GAP": dict(
        parallel_block=True, qkv_bias=False, qk_norm=True, layer_scale=0.1,
        pre_norm=True, classifier="gap"),
}

# ---------------------------------------------------- float64 reference --


def _layer_norm(x, p, eps=1e-6):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean)**2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * p["scale"] + p.get("bias", 0.0)


def _heads(x_BxNxD, p):
  return np.einsum("bnd,dhk->bnhk", x_BxNxD, p["kernel"]) + p.get("bias", 0.0)


def _block(x, p, options, given_weights):
  """(output, attention weights): the weights from this forward's own
  float64 softmax; the output computed with `given_weights` (see the test)."""
  scale = lambda name: p[name]["scale"] if name in p else 1.0
  y = _layer_norm(x, p["LayerNorm_0"])
  mha = p["MultiHeadDotProductAttention_1"]
  q, k = _heads(y, mha["query"]), _heads(y, mha["key"])
  if options.get("qk_norm"):
    q, k = _layer_norm(q, mha["query_ln"]), _layer_norm(k, mha["key_ln"])
  weights_BxHxMxN = ref.softmax(
      np.einsum("bmhk,bnhk->bhmn", q, k) / np.sqrt(q.shape[-1]))
  a = np.einsum("bhmn,bnhk->bmhk", given_weights, _heads(y, mha["value"]))
  a = np.einsum("bmhk,hkd->bmd", a, mha["out"]["kernel"]) + mha["out"].get(
      "bias", 0.0)
  a = a * scale("LayerScale_attention")
  if not options.get("parallel_block"):
    x, a = x + a, 0.0
    y = _layer_norm(x, p["LayerNorm_2"])
  m = ref.mlp_block(y, p["MlpBlock_3"], ref.gelu_tanh) * scale("LayerScale_mlp")
  return x + a + m, weights_BxHxMxN


def _forward(params, images, options, given_weights):
  """(logits, encoded, per-block outputs, per-block attention weights)."""
  p = jax.tree.map(lambda v: np.asarray(v, np.float64), params)
  kernel = p["embedding"]["kernel"]
  x = ref.patchify(images, TINY["patch_size"]) @ kernel.reshape(
      -1, kernel.shape[-1]) + p["embedding"]["bias"]
  if "cls" in p:
    x = np.concatenate([np.broadcast_to(p["cls"], (len(x), 1, x.shape[-1])), x],
                       axis=1)
  enc = p["Transformer"]
  x = x + enc["posembed_input"]["pos_embedding"]
  if "pre_norm" in enc:
    x = _layer_norm(x, enc["pre_norm"])
  blocks, weights_ = [], []
  for i in range(TINY["num_layers"]):
    x, w = _block(x, enc[f"encoderblock_{i}"], options, given_weights[i])
    blocks.append(x)
    weights_.append(w)
  encoded = _layer_norm(x, enc["encoder_norm"])
  pooled = encoded[:, 0] if "cls" in p else encoded.mean(axis=1)
  logits = pooled @ p["head"]["kernel"] + p["head"]["bias"]
  return logits, encoded, np.stack(blocks), np.stack(weights_)


def _expected_names(options) -> set:
  """Block 0's parameters and the encoder's LayerNorms, by the options'
  definitions."""
  use_bias = options.get("use_bias", True)
  norm = ["scale", "bias"] if use_bias else ["scale"]
  attention = "MultiHeadDotProductAttention_1/"
  names = {f"LayerNorm_0/{n}" for n in norm}
  if not options.get("parallel_block"):
    names |= {f"LayerNorm_2/{n}" for n in norm}
  for proj in ("query", "key", "value"):
    names.add(f"{attention}{proj}/kernel")
    if use_bias and options.get("qkv_bias", True):
      names.add(f"{attention}{proj}/bias")
  names |= {f"{attention}out/kernel"
           } | ({f"{attention}out/bias"} if use_bias else set())
  if options.get("qk_norm"):
    names |= {
        f"{attention}{ln}/{n}" for ln in ("query_ln", "key_ln") for n in norm
    }
  names |= {
      f"MlpBlock_3/Dense_{i}/{n}" for i in (0, 1) for n in ("kernel", "bias")
  }
  if options.get("layer_scale"):
    names |= {"LayerScale_attention/scale", "LayerScale_mlp/scale"}
  encoder = {f"encoder_norm/{n}" for n in norm}
  if options.get("pre_norm"):
    encoder |= {f"pre_norm/{n}" for n in norm}
  return {f"encoderblock_0/{n}" for n in names} | encoder


@pytest.mark.parametrize("case", CASES)
def test_each_option_matches_a_float64_numpy_forward(case):
  """The model in float64 against the numpy forward: the parameters the
  options define, and every block's output and the encoder's to 1e-10.
  The attention softmax stays fp32 by the model's precision policy (its
  weights match to fp32 rounding); the numpy blocks are fed the model's
  weights so the rest is compared in float64. The head runs in fp32."""
  options = CASES[case]
  x = np.random.default_rng(0).normal(size=(2, 16, 16, 3))
  with jax.enable_x64(True):
    model = tiny_models.vit(**TINY, **options, dtype=jnp.float64,
                            param_dtype=jnp.float64)
    shapes = jax.eval_shape(model.init, jax.random.key(0), x)["params"]
    params = jax.tree.map(lambda v: v.astype(np.float64),
                          ref.trained_like_params(shapes, seed=2))
    forward = jax.jit(functools.partial(model.apply, return_intermediates=True))
    logits, out = forward({"params": params}, x)
  flat = flax.traverse_util.flatten_dict(params["Transformer"], sep="/")
  assert {
      n for n in flat
      if n.startswith(("encoderblock_0/", "encoder_norm/", "pre_norm/"))
  } == _expected_names(options)
  assert out["blocks"].dtype == jnp.float64
  given = np.asarray(out["attention_weights"], np.float64)
  want_logits, encoded, blocks, want_weights = _forward(params, x, options,
                                                        given)
  np.testing.assert_allclose(given, want_weights, rtol=0, atol=2e-6)
  np.testing.assert_allclose(out["blocks"], blocks, rtol=1e-10, atol=1e-10)
  np.testing.assert_allclose(out["encoded"], encoded, rtol=1e-10, atol=1e-10)
  np.testing.assert_allclose(logits, want_logits, rtol=1e-5, atol=1e-5)
  assert np.abs(want_logits).max() > 0.5  # Not trivially zero.


# ------------------------------------------------------- timm's forms --

# What each stored timm family's parameters say (tests/references).
_TIMM_OPTIONS = {
    "medium_gap": dict(layer_scale=1e-5, qkv_bias=False),
    "qk_norm": dict(qk_norm=True),
}

# The tiny timm models' size. Another test may have registered the same
# size under another name first: the variant read is compared by size.
TINY_TIMM = variants.Variant(hidden_size=32, mlp_dim=128, num_heads=4,
                             num_layers=2, patch_size=8)


def _register_tiny_timm():
  variants.register("tiny-timm", TINY_TIMM)


@pytest.mark.parametrize("name", stored.TINY_BLOCK_FAMILIES)
def test_timms_forms_load_from_the_file_alone_with_timms_logits(name, tmp_path):
  """timm's qkv_bias=False (vit_medium_patch16_gap_256's options) and
  qk_norm=True (attn.q_norm/k_norm -> query_ln/key_ln), built and run by
  timm (tests/references): the options read from the parameters, the
  model `predict` builds from the file alone, timm's logits; into a
  default model, one line naming the flags."""
  _register_tiny_timm()
  state = stored.tiny_family_state(name)
  path = str(tmp_path / f"{name}.safetensors")
  st_numpy.save_file(state, path)
  converted = weights.convert_tensors("safetensors", state, 4, path)
  found = weights.family_options(converted.params,
                                 converted.posemb_prefix_tokens)
  assert found == _TIMM_OPTIONS[name]
  assert converted.notes[0].endswith(f"it needs {weights.config_fix(found)}")
  arch = weights.read_architecture(path)
  assert variants.get_variant(arch.variant) == TINY_TIMM
  assert dict(arch.options) == found
  loaded = inference.load(path, image_size=32)
  assert loaded.config.model.gelu_approximate is False  # timm's erf.
  logits = compiled.logits(loaded.model, jax.device_get(loaded.params),
                           stored.tiny_images())
  assert np.abs(logits - stored.tiny_family_logits(name)).max() < 2e-5

  plain = tiny_models.vit(num_classes=10, **dict(TORCH_LIKE, mlp_dim=128),
                          classifier="gap" if name == "medium_gap" else "token",
                          layer_scale=found.get("layer_scale"))
  block = {k: v for k, v in found.items() if k != "layer_scale"}
  with pytest.raises(weights.WeightsError) as refused:
    load_params(path, plain, grid=(4, 4))
  assert "\n" not in str(refused.value)
  assert str(refused.value).endswith(
      f"set {weights.config_fix(block)} (or name the parameters to "
      "re-initialise and the file entries to ignore in "
      "config.init.dont_load).")


# timm's ParallelScalingBlock (vit_pwee_patch16_reg1_gap_256's), tiny: the
# default (qkv_bias: MLP and query/key/value biases in in_proj's) and
# qkv_bias=False (a separate mlp_bias), qk_norm, proj_bias=False.
_PWEE = dict(embed_dim=32, depth=2, num_heads=4, mlp_ratio=4, patch_size=8,
             img_size=32, num_classes=10)
_QK = dict(qkv_bias=False, qk_norm=True)  # The options that case reads.
_PWEE_CASES = {
    "qkv_bias": ({}, {}),
    "mlp_bias, qk_norm, no proj_bias": (dict(qkv_bias=False, qk_norm=True,
                                             proj_bias=False), _QK),
}


def _fuse_out_proj(state):
  """`state` with each block's attn_out_proj and mlp_out_proj as timm's
  fuse_out_proj=True `out_proj` (columns [attention, MLP], one bias)."""
  state, fused = dict(state), {}
  for name in [n for n in state if n.endswith(".attn_out_proj.weight")]:
    pre = name[:-len("attn_out_proj.weight")]
    mlp_weight = state.pop(pre + "mlp_out_proj.weight")
    fused[pre + "out_proj.weight"] = np.concatenate(
        [state.pop(name), mlp_weight], axis=1)
    fused[pre + "out_proj.bias"] = (
        state.pop(pre + "attn_out_proj.bias", 0) +
        state.pop(pre + "mlp_out_proj.bias", np.zeros(32, np.float32)))
  return {**state, **fused}


def _built_by_timm(name: str, images, folder, kwargs=None):
  """(the safetensors file of timm's `name` built with random weights at
  trained scales in .venv-torch, timm's logits of `images`)."""
  np.save(folder / "images.npy", images.astype(np.float32))
  env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
  done = subprocess.run([
      TORCH_PYTHON, "-m", "tests.helpers.timm_built", name,
      str(folder / "images.npy"),
      str(folder)
  ] + ([json.dumps(kwargs)] if kwargs else []), cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  want = np.load(folder / "logits.npy")
  assert np.abs(want).max() > 0.5  # Logits that say something.
  return str(folder / "model.safetensors"), want


@pytest.mark.parametrize("case", _PWEE_CASES)
def test_timms_parallel_scaling_block_loads_with_timms_logits(case, tmp_path):
  """timm's fused ParallelScalingBlock (in_norm; in_proj = [MLP hidden, q,
  k, v]; one LayerScale `ls` on the sum of the branches), built and run by
  timm with random weights at trained scales: read from the file alone as
  config.model.parallel_block (no LayerNorm_2), `ls` both branches'
  LayerScales, timm's logits; its fuse_out_proj form the same model; its
  differential attention (vit_dpwee) refused in one line."""
  torch_env.require()
  kwargs, options = _PWEE_CASES[case]
  _register_tiny_timm()
  images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3))
  path, want = _built_by_timm("vit_pwee_patch16_reg1_gap_256", images, tmp_path,
                              dict(_PWEE, **kwargs))
  state = st_numpy.load_file(path)
  assert "blocks.0.in_proj.weight" in state
  assert ("blocks.0.mlp_bias" in state) == (kwargs.get("qkv_bias") is False)
  converted = weights.convert_tensors("safetensors", state, 4, path)
  gamma = state["blocks.1.ls.gamma"]
  for branch in ("attention", "mlp"):
    np.testing.assert_array_equal(
        converted.params[f"Transformer/encoderblock_1/LayerScale_{branch}/"
                         "scale"], gamma)
  arch = weights.read_architecture(path)
  assert variants.get_variant(arch.variant) == TINY_TIMM
  assert arch.classifier == "gap"
  assert not arch.class_token
  assert dict(arch.options) == dict(num_registers=1, posemb_covers_prefix=False,
                                    layer_scale=1e-5, pooled_norm=True,
                                    parallel_block=True, **options)
  for form in ("separate", "fuse_out_proj"):
    if form == "fuse_out_proj":
      st_numpy.save_file(_fuse_out_proj(state), path)
    loaded = inference.load(path, image_size=32)
    assert loaded.config.model.parallel_block is True
    logits = compiled.logits(loaded.model, jax.device_get(loaded.params),
                             images.astype(np.float32))
    assert np.abs(logits - want).max() < 2e-5, (form,
                                                np.abs(logits - want).max())

  state["blocks.0.sub_norm.weight"] = np.ones(16, np.float32)
  with pytest.raises(
      weights.WeightsError,
      match=r"^vit_dpwee.pt: timm's parallel block blocks.0 has "
      r"\['sub_norm.weight'\], [^\n]*not converted.$"):
    weights.convert_tensors("safetensors", state, 4, "vit_dpwee.pt")


def test_timms_vit_medium_patch16_gap_256_predicts_timms_logits(tmp_path):
  """The model of the issue, full size (ViT-M/16 at 256 px, no class token,
  GAP, LayerScale, qkv_bias=False), built by timm itself by name with
  random weights at trained scales (where .venv-torch is): its file, read
  alone as `predict` reads it, gives timm's logits."""
  torch_env.require()
  images = np.random.default_rng(0).uniform(-1, 1, (1, 256, 256, 3))
  path, want = _built_by_timm("vit_medium_patch16_gap_256", images, tmp_path)
  arch = weights.read_architecture(path)
  assert (arch.variant, arch.classifier, arch.class_token,
          arch.image_size) == ("ViT-M/16", "gap", False, 256)
  assert dict(arch.options) == dict(layer_scale=1e-5, qkv_bias=False)
  loaded = inference.load(path)
  logits = compiled.logits(loaded.model, jax.device_get(loaded.params),
                           images.astype(np.float32))
  assert np.abs(logits - want).max() < 2e-5, np.abs(logits - want).max()


def test_all_four_scanned_and_rematerialised_compute_the_looped_model():
  """Scan over layers and remat (what FSDP's gathered blocks use) keep the
  options' function: the same loss and gradients as the plain loop."""
  images = jnp.asarray(
      np.random.default_rng(0).uniform(-1, 1, (2, 16, 16, 3)), jnp.float32)
  looped = tiny_models.vit(**TINY, **ALL)
  params = looped.init(jax.random.key(0), images)["params"]
  scanned = tiny_models.vit(**TINY, **ALL, scan_layers=True, remat="dots")

  def loss_and_grad(model, p):
    loss = lambda p: jnp.sum(jnp.sin(model.apply({"params": p}, images)[0]))
    return jax.jit(jax.value_and_grad(loss))(p)

  want_loss, want_grads = loss_and_grad(looped, params)
  loss, grads = loss_and_grad(scanned, scan.stack_layers(params))
  np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
  flat = lambda t: flax.traverse_util.flatten_dict(t, sep="/")
  want, got = flat(want_grads), flat(scan.unstack_layers(grads))
  assert got.keys() == want.keys()
  for name in want:
    np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-6,
                               err_msg=name)


# ------------------------------------------- a checkpoint of the other form --


@pytest.mark.parametrize(
    "file_options, model_options, fix", [
        ({}, dict(parallel_block=True), "--config.model.parallel_block=False"),
        (dict(parallel_block=True), {}, "--config.model.parallel_block=True"),
        ({}, dict(use_bias=False), "--config.model.use_bias=True"),
        ({}, dict(qkv_bias=False), "--config.model.qkv_bias=True"),
        ({}, dict(qk_norm=True), "--config.model.qk_norm=False"),
        (ALL, {}, "--config.model.parallel_block=True "
         "--config.model.use_bias=False --config.model.qk_norm=True"),
        (dict(qkv_bias=False), dict(use_bias=False),
         "--config.model.use_bias=True --config.model.qkv_bias=False"),
    ], ids=[
        "into parallel", "parallel into standard", "into use_bias=False",
        "into qkv_bias=False", "into qk_norm", "all four into standard",
        "qkv_bias=False into use_bias=False"
    ])
def test_a_checkpoint_of_the_other_form_is_refused_in_one_line(
    file_options, model_options, fix, tmp_path):
  path = str(tmp_path / "m.npz")
  weights.save_npz(
      init(tiny_models.vit(num_classes=5, **TORCH_LIKE, **file_options)), path)
  model = tiny_models.vit(num_classes=5, **TORCH_LIKE, **model_options)
  with pytest.raises(weights.WeightsError) as refused:
    load_params(path, model, grid=(4, 4))
  message = str(refused.value)
  assert "\n" not in message and f"; set {fix} (or name" in message, message
  # The file says its own form (what `predict` and `inspect` build from).
  converted = weights.read_converted(path, 4)
  found = weights.family_options(converted.params,
                                 converted.posemb_prefix_tokens)
  moot = file_options.get("use_bias") is False  # No qkv biases either way.
  assert found == {
      k: v for k, v in file_options.items() if not (moot and k == "qkv_bias")
  }


def test_other_differences_keep_the_table_and_add_the_block_sentence(tmp_path):
  """A file that differs by more than its block form (here LayerScale
  too): the whole table, with the block's sentence among its hints."""
  path = str(tmp_path / "m.npz")
  weights.save_npz(
      init(
          tiny_models.vit(num_classes=5, **TORCH_LIKE, parallel_block=True,
                          layer_scale=0.1)), path)
  with pytest.raises(weights.WeightsError) as refused:
    load_params(path, tiny_models.vit(num_classes=5, **TORCH_LIKE), grid=(4, 4))
  message = str(refused.value)
  assert message.startswith(f"{path} does not fit this model; nothing was "
                            "loaded.\n"), message
  assert "LayerScale_attention/scale" in message  # In the table.
  assert "set --config.model.parallel_block=True (or name" in message


def test_dont_load_still_moves_weights_between_the_forms(tmp_path):
  """A sequential checkpoint into a parallel-block model, its LayerNorm_2
  named in config.init.dont_load: loaded (the rest matches)."""
  path = str(tmp_path / "m.npz")
  weights.save_npz(init(tiny_models.vit(num_classes=5, **TORCH_LIKE)), path)
  parallel = tiny_models.vit(num_classes=5, **TORCH_LIKE, parallel_block=True)
  _, report = load_params(path, parallel, grid=(4, 4),
                          dont_load=(".*/LayerNorm_2/.*",))
  assert report.ok and len(report.dropped) == 4


def test_fine_tuning_from_the_other_form_exits_2_with_one_line(
    tfds_data_dir, tmp_path):
  """`vit-jax train` from a standard checkpoint with parallel blocks:
  status 2, one line naming the flag, before the train step compiles."""
  path = str(tmp_path / "standard.npz")
  weights.save_npz(init(models.create_model("testing", 10), size=16), path)
  done = subprocess.run([
      sys.executable, "-m", "vit_jax", "train",
      "--config=configs/digits.py:runlocal", f"--workdir={tmp_path / 'run'}",
      f"--config.data_dir={tfds_data_dir}", f"--config.init.checkpoint={path}",
      "--config.model.parallel_block=True"
  ], cwd=REPO, env=processes.command_env(), capture_output=True, text=True,
                        timeout=300)
  assert done.returncode == 2, done.stderr[-3000:]
  assert "Traceback" not in done.stderr, done.stderr[-3000:]
  errors = [
      line for line in done.stderr.splitlines() if line.startswith("error: ")
  ]
  assert errors == [
      f"error: {path} has blocks with parallel_block=False but the model's "
      "have parallel_block=True; set --config.model.parallel_block=False (or "
      "name the parameters to re-initialise and the file entries to ignore "
      "in config.init.dont_load)."
  ], errors
  assert "Training testing on digits" not in done.stderr  # Said once compiled.


# ------------------------------------------------------ trained on digits --


def test_all_four_train_on_digits_and_resume(digits_config, tmp_path, capsys):
  """The `testing` model with all four options: a run stopped at step 15
  resumes from its checkpoint, and the loss falls from ln(10) (the zero
  head's) by step 30."""
  digits_config.model.update(ALL)
  digits_config.lr = 0.03
  digits_config.total_steps = digits_config.checkpoint_every_steps = 15
  workdir = str(tmp_path / "run")
  first = trainer.train_and_evaluate(digits_config, workdir)
  digits_config.total_steps = 30
  second = trainer.train_and_evaluate(digits_config, workdir)
  assert "Resuming at step 15" in capsys.readouterr().err
  assert second["train/loss"] < min(first["train/loss"],
                                    math.log(10) - 0.1), (first, second)
  restored = inference.load(workdir)
  assert {k: restored.config.model[k] for k in ALL} == ALL
