"""`vit-jax export --format=hf` and `--format=timm-dir`: directories that
transformers and timm load by themselves, with the same logits.

Every tiny model here is exported both ways. A format that cannot hold a
model refuses it in one line naming one that can. The directories written
load back here (their config.json says what the weights cannot: GELU form,
LayerNorm epsilon) and, where the PyTorch environment exists
(tests/references/torch_env.sh, as for benchmarks/gpu_check.sh's dry run),
in transformers and timm themselves, in one subprocess for all of them. The
reference logits are those timm or transformers computed for the models
they built (tests/references), or ours for the models only this project
builds (big_vision's plain and MAP-head ViTs).
"""

import json
import os
import subprocess
import sys

from etils import epath
import flax
import jax
import numpy as np
import pytest
from safetensors import numpy as st_numpy

from tests import test_big_vision
from tests.helpers import compiled
from tests.helpers import tiny_models
from tests.helpers import torch_env
from tests.references import stored
from vit_jax import inference
from vit_jax import models
from vit_jax import weights
from vit_jax.commands import export
from vit_jax.config import defaults
from vit_jax.errors import UserError
from vit_jax.fewshot import sweep
from vit_jax.models import variants

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH_PYTHON = torch_env.TORCH_PYTHON
_SIZES = {
    "tiny-families": variants.Variant(hidden_size=32, mlp_dim=128, num_heads=4,
                                      num_layers=2, patch_size=8),
    "tiny-vit": variants.Variant(**test_big_vision.TINY),
    # The FlexiViT file's model as exported: run (and written) at patch 4.
    "tiny-vit-p4": variants.Variant(**dict(test_big_vision.TINY, patch_size=4)),
    "tiny-mixer": variants.MixerVariant(32, 16, 128, 2, 8),  # timm's own.
    # EVA-02's MLP: 8/3 of the width.
    "tiny-eva": variants.Variant(hidden_size=32, mlp_dim=85, num_heads=4,
                                 num_layers=2, patch_size=8),
}
# timm's Eva families written back by timm's Eva (eva_export.py): SwiGLU
# packed, SwiGLU with both LayerNorms, learned frequencies, registers and
# no class token, PE's pool over a class token, DINOv3's SwiGLU.
_EVA = ("eva02", "eva02_clip", "rope_mixed", "rope_sbb", "pe", "dinov3_swiglu")
# What the weights cannot show: OpenAI's CLIP computes QuickGELU; our
# Mixer-S/32 was built with the erf GELU (a released file's is tanh).
_CONFIG = {
    "clip": dict(quick_gelu=True),
    "mixer_s32": dict(gelu_approximate=False),
    "flexi_p8_run_at_4": dict(patch_size=4),
}
_BIG_VISION = {  # Built only here: (model options, reference = ours).
    # ViT-22B's finer form that both libraries have (their qkv_bias=False).
    "no_qkv_bias": dict(qkv_bias=False),
    "plain_gap_sincos": dict(posemb="sincos2d", class_token=False,
                             classifier="gap"),
    "siglip_map": dict(class_token=False, classifier="map"),
    # No head: the pre-logits layer's output (transformers' ViTModel pooler).
    "pre_logits_no_head": dict(representation_size=16),
    # FlexiViT: stored at patch 8, run at 4 (the export bakes that in).
    "flexi_p8_run_at_4": dict(run_patch_size=4),
}
_TIMM_DIR = "--format=timm-dir"
# timm's files of its families, and of its block options' forms.
_TIMM_FAMILIES = stored.TINY_FAMILIES + stored.TINY_BLOCK_FAMILIES
FORMATS = ("hf", "timm-dir")
# model -> per format of FORMATS: None where it holds the model, else what
# its refusal names.
MODELS = {
    **dict.fromkeys(_TIMM_FAMILIES, (_TIMM_DIR, None)),
    "timm_vit": (None, None),
    "hf_vit": (None, None),
    "no_qkv_bias": (None, None),
    # timm's functions build Mixer-S/B/L only (a smaller one is refused).
    "mixer_s32": (_TIMM_DIR, None),
    "tiny_mixer": (_TIMM_DIR, "--format=timm "),
    "plain_gap_sincos": (_TIMM_DIR, None),
    "siglip_map": (_TIMM_DIR, None),
    "pre_logits_no_head": (None, "--format=npz"),
    "flexi_p8_run_at_4": (None, None),
    # timm's tiny DINOv3s (RoPE): timm's Eva writes them back.
    **dict.fromkeys(stored.TINY_ROPE_MODELS, (_TIMM_DIR, None)),
    **dict.fromkeys(_EVA, (_TIMM_DIR, None)),
    # transformers' DINOv3ViTModel (no head), and its gated form: both
    # write it.
    "hf_dinov3": (None, None),
    "hf_dinov3_gated": (None, None),
}


def _source(name: str, folder) -> tuple[str, np.ndarray]:
  """(a weights file of model `name`, its reference logits of
  stored.tiny_images())."""
  path = str(folder / f"{name}.file")
  if name in _TIMM_FAMILIES:
    st_numpy.save_file(stored.tiny_family_state(name), path)
    return path, stored.tiny_family_logits(name)
  if name.startswith("hf_dinov3"):  # Its pooler output: the class token.
    return stored.path(f"tiny_{name}"), stored.tiny_rope_output(
        f"{name}_pooler")
  if name in stored.TINY_ROPE_MODELS + _EVA:
    return (stored.path(f"tiny_{name}.safetensors"),
            stored.tiny_rope_output(name))
  if name == "timm_vit":
    return stored.path("tiny_timm.safetensors"), stored.tiny_logits("timm")
  if name == "hf_vit":  # Its weights alone: the model's LayerNorm eps.
    return stored.path("tiny_hf/model.safetensors"), stored.tiny_logits("hf")
  if name == "tiny_mixer":
    return stored.path("tiny_mixer.safetensors"), stored.tiny_mixer_logits()
  if name == "mixer_s32":  # At 32 px: one token. Random, head included.
    model = models.create_model(  # timm's MlpMixer computes erf.
        "Mixer-S/32", 10, classifier="gap", gelu_approximate=False)
    params = test_big_vision.random_params(model, scale=0.05)
    flat = flax.traverse_util.flatten_dict(params, sep="/")
    weights.save_npz(flat, path + ".npz")
    return path + ".npz", compiled.logits(model, params, stored.tiny_images())
  model = tiny_models.vit(
      num_classes=None if name == "pre_logits_no_head" else 10,
      **test_big_vision.TINY, **_BIG_VISION[name])
  params = test_big_vision.random_params(model, seed=len(name))
  np.savez(path + ".npz", **test_big_vision.big_vision_file(params))
  return path + ".npz", test_big_vision.logits(model, params,
                                               stored.tiny_images())


def _config(name: str, path: str):
  """The config `predict` would build from the file, plus what the file
  cannot say."""
  config = defaults.get_config()
  config.image_size = 32
  config.pp_eval = "resize|value_range"
  config.model.update(_CONFIG.get(name, {}))
  return sweep.with_model_of(config, path)


def _logits(checkpoint: str, images=None) -> np.ndarray:
  """What `predict`'s model computes from the checkpoint alone."""
  loaded = inference.load(checkpoint)
  images = stored.tiny_images() if images is None else images
  return compiled.logits(loaded.model, jax.device_get(loaded.params), images)


def _their_logits(directories: dict, images, folder) -> dict:
  """{(name, format): logits} that transformers / timm compute from
  {(name, format): directory}, in one run of the PyTorch environment."""
  torch_env.require()
  np.save(folder / "images.npy", images)
  requests = [
      f"{name}@{fmt}={fmt}:{directory}"
      for (name, fmt), directory in directories.items()
  ]
  env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
  done = subprocess.run([
      TORCH_PYTHON, "-m", "tests.helpers.exported_logits",
      str(folder / "images.npy"),
      str(folder / "logits.npz"), *requests
  ], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  with np.load(folder / "logits.npz") as logits:
    return {tuple(k.split("@")): logits[k] for k in logits.files}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  """{(model, format): (directory, or the refusal's message; reference
  logits)} for every model and both formats."""
  for name, variant in _SIZES.items():
    variants.register(name, variant)
  folder = tmp_path_factory.mktemp("exports")
  out = {}
  for name in MODELS:
    path, reference = _source(name, folder)
    config = _config(name, path)
    for fmt in FORMATS:
      directory = str(folder / f"{name}-{fmt}")
      try:
        export.export_directory(path, fmt, directory, config=config)
        out[name, fmt] = (directory, reference)
      except UserError as e:
        out[name, fmt] = (f"refused: {e}", reference)
  return out


@pytest.fixture(scope="module")
def their_logits(exported, tmp_path_factory):
  """{(model, format): logits transformers / timm compute from the
  directory}, from one run in the PyTorch environment."""
  return _their_logits(
      {
          key: directory
          for key, (directory, _) in exported.items()
          if not directory.startswith("refused")
      }, stored.tiny_images(), tmp_path_factory.mktemp("theirs"))


_EXPORTS = [(name, fmt)
            for name, refusals in MODELS.items()
            for fmt, refusal in zip(FORMATS, refusals)
            if refusal is None]
_REFUSALS = [(name, fmt)
             for name, refusals in MODELS.items()
             for fmt, refusal in zip(FORMATS, refusals)
             if refusal is not None]

# The tests of the `exported` directories share one xdist worker, so that
# the exports and the PyTorch run are made once, not once per worker.
_ONE_WORKER = pytest.mark.xdist_group("exports")


@_ONE_WORKER
@pytest.mark.parametrize("name,fmt", _EXPORTS)
def test_their_library_computes_the_same_logits_from_the_directory(
    name, fmt, exported, their_logits):
  _, reference = exported[name, fmt]
  assert np.abs(reference).max() > 0.1  # Logits that say something.
  error = np.abs(their_logits[name, fmt] - reference).max()
  assert error < 2e-5, error


@_ONE_WORKER
@pytest.mark.parametrize("name,fmt", _EXPORTS)
def test_the_directory_loads_back_here_with_the_same_logits(
    name, fmt, exported):
  """From the directory alone: its config.json gives what the weights do
  not (QuickGELU for CLIP, the GELU form, the LayerNorm epsilon)."""
  directory, reference = exported[name, fmt]
  assert not directory.startswith("refused"), directory
  error = np.abs(_logits(directory) - reference).max()
  assert error < 2e-5, error


@_ONE_WORKER
@pytest.mark.parametrize("name,fmt", _REFUSALS)
def test_a_format_that_cannot_hold_the_model_names_one_that_can(
    name, fmt, exported):
  message, _ = exported[name, fmt]
  assert message.startswith("refused: ") and "\n" not in message, message
  assert MODELS[name][FORMATS.index(fmt)] in message, message


@_ONE_WORKER
def test_the_written_configs_say_what_the_libraries_need(exported):
  directory, _ = exported["timm_vit", "hf"]
  config = json.loads(open(os.path.join(directory, "config.json")).read())
  assert config["model_type"] == "vit" and config["architectures"] == [
      "ViTForImageClassification"
  ]
  assert (config["hidden_act"], config["layer_norm_eps"],
          config["qkv_bias"]) == ("gelu", 1e-6, True)
  assert config["id2label"]["3"] == "LABEL_3"
  with open(os.path.join(directory, "model.safetensors"), "rb") as f:
    header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
  assert header["__metadata__"] == {"format": "pt"}
  names = st_numpy.load_file(os.path.join(directory, "model.safetensors"))
  assert "vit.encoder.layer.1.attention.attention.query.weight" in names
  processor = json.loads(
      open(os.path.join(directory, "preprocessor_config.json")).read())
  assert processor["image_processor_type"] == "ViTImageProcessor"
  assert processor["size"] == {"height": 32, "width": 32}
  assert processor["image_mean"] == processor["image_std"] == [0.5] * 3

  directory, _ = exported["dinov2_reg", "timm-dir"]
  config = json.loads(open(os.path.join(directory, "config.json")).read())
  args = config["model_args"]
  assert (args["reg_tokens"], args["no_embed_class"], args["init_values"],
          args["class_token"]) == (4, True, 1e-5, True)
  assert config["pretrained_cfg"]["input_size"] == [3, 32, 32]
  directory, _ = exported["medium_gap", "timm-dir"]
  args = json.loads(open(os.path.join(directory,
                                      "config.json")).read())["model_args"]
  assert (args["qkv_bias"], args["class_token"], args["global_pool"], "qk_norm"
          in args) == (False, False, "avg", False)
  directory, _ = exported["qk_norm", "timm-dir"]
  args = json.loads(open(os.path.join(directory,
                                      "config.json")).read())["model_args"]
  assert (args["qkv_bias"], args["qk_norm"]) == (True, True)
  directory, _ = exported["clip", "timm-dir"]
  config = json.loads(open(os.path.join(directory, "config.json")).read())
  assert config["architecture"] == "vit_base_patch16_clip_224"  # eps 1e-5
  assert config["model_args"]["act_layer"] == "quick_gelu"
  assert config["model_args"]["pre_norm"] is True
  for name in stored.TINY_ROPE_MODELS:
    directory, _ = exported[name, "timm-dir"]
    config = json.loads(open(os.path.join(directory, "config.json")).read())
    assert config["architecture"] == stored.tiny_rope_timm_model(name)
    args = config["model_args"]
    assert (args["num_reg_tokens"], args["rope_temperature"],
            args["global_pool"]) == (4, 100.0, "avg")
  directory, _ = exported["hf_dinov3", "hf"]
  config = json.loads(open(os.path.join(directory, "config.json")).read())
  assert (config["model_type"], config["num_register_tokens"],
          config["query_bias"], config["key_bias"]) == ("dinov3_vit", 4, True,
                                                        False)
  directory, _ = exported["hf_dinov3_gated", "hf"]
  config = json.loads(open(os.path.join(directory, "config.json")).read())
  assert (config["use_gated_mlp"], config["hidden_act"]) == (True, "silu")
  # The names transformers' save_pretrained writes (`layer.N.`).
  names = st_numpy.load_file(os.path.join(directory, "model.safetensors"))
  assert sorted(names) == sorted(stored.tiny_hf_state("dinov3_gated"))
  # Eva's function by LayerNorm epsilon; model_args say the form.
  for name, function, rope in (("eva02", "eva02_tiny_patch14_224", "cat"),
                               ("pe", "vit_pe_core_tiny_patch16_384",
                                "cat"), ("rope_mixed", "eva02_tiny_patch14_224",
                                         "mixed")):
    directory, _ = exported[name, "timm-dir"]
    config = json.loads(open(os.path.join(directory, "config.json")).read())
    assert (config["architecture"],
            config["model_args"]["rope_type"]) == (function, rope), name


def test_a_hybrid_is_refused_by_both_formats_naming_npz(tmp_path):
  variants.register(
      "tiny-hybrid-export",
      variants.Variant(hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1,
                       patch_size=1, resnet=variants.ResNetSpec((1, 1), 1.0)))
  path = stored.path("tiny_hybrid.safetensors")
  config = defaults.get_config()
  config.image_size = 32
  config = sweep.with_model_of(config, path)
  for fmt in ("hf", "timm-dir"):
    with pytest.raises(UserError, match="--format=npz"):
      export.export_directory(path, fmt, str(tmp_path / fmt), config=config)
    assert not (tmp_path / fmt).exists()


def _run_export(*args):
  return subprocess.run([sys.executable, "-m", "vit_jax", "export", *args],
                        cwd=REPO, capture_output=True, text=True, timeout=600)


@pytest.mark.xdist_group("trained_digits")
def test_a_trained_workdir_exports_for_both_from_the_command_line(
    trained_digits, tmp_path):
  """The fine-tuning workflow's end: class names from the dataset, the
  evaluation preprocessing, and the logits of `predict`'s model."""
  images = np.random.default_rng(0).uniform(-1, 1, (3, 16, 16, 3))
  images = images.astype(np.float32)
  ours = _logits(trained_digits, images)
  written = {}
  for fmt in ("hf", "timm-dir"):
    out = tmp_path / fmt
    done = _run_export(f"--checkpoint={trained_digits}", f"--format={fmt}",
                       f"--out={out}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "class names from the training dataset (digits)" in done.stdout
    written[fmt] = json.loads((out / "config.json").read_text())
    back = _logits(str(out), images)
    assert np.abs(back - ours).max() < 2e-5
    names, source = inference.class_names(inference.load(str(out)))
    assert names == [str(i) for i in range(10)], names
    assert source == f"{out}'s config.json"
  assert written["hf"]["id2label"]["7"] == "7"  # digits' class names.
  assert written["timm-dir"]["label_names"] == [str(i) for i in range(10)]
  assert written["timm-dir"]["pretrained_cfg"]["crop_mode"] == "squash"
  theirs = _their_logits({("digits", fmt): tmp_path / fmt for fmt in written},
                         images, tmp_path)
  for fmt in written:
    assert np.abs(theirs["digits", fmt] - ours).max() < 2e-5, fmt

  refused = _run_export(f"--checkpoint={trained_digits}", "--format=hf",
                        f"--out={tmp_path / 'bad'}",
                        "--pp_eval=inception_crop|value_range")
  assert refused.returncode == 2, refused.stderr[-2000:]
  last = refused.stderr.strip().splitlines()[-1]
  assert last.startswith("error: ") and "--pp_eval" in last, last
  assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("config,options", [
    ({
        "architecture": "vit_base_patch16_clip_quickgelu_224"
    }, dict(gelu_approximate=False, layer_norm_eps=1e-5, quick_gelu=True)),
    ({
        "architecture": "vit_base_patch14_dinov2"
    }, dict(gelu_approximate=False)),
    ({
        "model_type": "vit",
        "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": 1e-12
    }, dict(gelu_approximate=True, layer_norm_eps=1e-12)),
])
def test_a_hub_directory_says_what_its_weights_cannot(config, options,
                                                      tmp_path):
  """A directory as the Hub serves it (timm's: the architecture's name,
  often without model_args; transformers': hidden_act, layer_norm_eps)."""
  (tmp_path / "config.json").write_text(json.dumps(config))
  (tmp_path / "model.safetensors").write_bytes(b"")
  assert weights.stated_options(epath.Path(tmp_path)) == options
  assert weights.stated_options(epath.Path(tmp_path / "elsewhere")) == {}
