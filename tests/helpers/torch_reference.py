"""Independent PyTorch ViTs (timm, Hugging Face), timm's ViT families
(DINOv2, DeiT III, CLIP, ...) and timm's MLP-Mixer, built locally, random
weights.

Used where torch is installed, never by the suite itself:
tests/references/generate.py stores what these models compute, and
benchmarks/timm_speed.py imports timm through here. Nothing is downloaded:
the models are constructed from their classes. The package registry's
torchvision does not load beside torch's CPU build (.venv-torch), and timm
imports torchvision at import time (for data transforms and a frozen batch
norm that a ViT never uses). When the real torchvision fails to import, a
placeholder package stands in for it (for timm, and for transformers, which
also imports it when installed), so that their own ViT code, which is what
the references record, runs unchanged.
"""

import importlib.abc
import importlib.machinery
import sys
import types

import numpy as np


class _AnyAttribute(type):
  """A class whose every attribute is another placeholder class."""

  def __getattr__(cls, name):
    if name.startswith("__"):
      raise AttributeError(name)
    return _AnyAttribute(name, (), {"__init__": lambda self, *a, **k: None})


class _PlaceholderModule(types.ModuleType):
  __path__ = []

  def __getattr__(self, name):
    if name.startswith("__"):
      raise AttributeError(name)
    return _AnyAttribute(name, (), {"__init__": lambda self, *a, **k: None})


class _PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):

  def find_spec(self, fullname, path, target=None):
    del path, target
    if fullname == "torchvision" or fullname.startswith("torchvision."):
      return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
    return None

  def create_module(self, spec):
    return _PlaceholderModule(spec.name)

  def exec_module(self, module):
    pass


def _make_torchvision_importable():
  """Both timm and transformers import torchvision when it is installed."""
  try:
    import torchvision  # noqa: F401  pylint: disable=g-import-not-at-top
  except Exception:  # pylint: disable=broad-except
    for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
      del sys.modules[name]
    sys.meta_path.insert(0, _PlaceholderFinder())


_make_torchvision_importable()  # Before timm or transformers is imported.


def import_timm():
  import timm  # pylint: disable=g-import-not-at-top
  return timm


def randomize(module, seed: int = 0, scale: float = 0.2):
  """Every parameter random (their inits leave biases and tokens at zero)."""
  import torch  # pylint: disable=g-import-not-at-top
  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in module.parameters():
      p.copy_(torch.randn(p.shape, generator=generator) * scale)
  return module.eval()


# The timm models `timm_vit` and `timm_mixer` follow (their classes'
# defaults are these functions' options, at another size).
TINY_TIMM_FUNCTION = "vit_base_patch16_224"
TINY_MIXER_FUNCTION = "mixer_b16_224"


def timm_vit(width=32, depth=2, heads=4, mlp=64, patch=8, size=32, classes=10):
  timm = import_timm()
  model = timm.models.vision_transformer.VisionTransformer(
      img_size=size, patch_size=patch, embed_dim=width, depth=depth,
      num_heads=heads, mlp_ratio=mlp / width, num_classes=classes)
  return randomize(model)


def timm_hybrid_vit(
    stages=(1, 1), width=16, heads=2, mlp=32, size=32, classes=5):
  """The paper's hybrid in timm: a ResNetV2 stem (64 wide), patch size 1."""
  import torch  # pylint: disable=g-import-not-at-top
  import_timm()
  from timm.models import vision_transformer_hybrid as hybrid  # pylint: disable=g-import-not-at-top
  model = hybrid._create_vision_transformer_hybrid(  # pylint: disable=protected-access
      "vit_jax_test_hybrid",
      backbone=hybrid._resnetv2(stages),  # pylint: disable=protected-access
      img_size=size,
      embed_dim=width,
      depth=1,
      num_heads=heads,
      mlp_ratio=mlp / width,
      num_classes=classes)
  model = randomize(model, seed=2)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name and name.endswith("weight"):
        p.add_(1.0)  # GroupNorm scales near 1 keep activations O(1).
      elif "backbone" in name and p.ndim == 4:
        # Unit-variance kernels: the standardisation epsilons (timm 1e-8,
        # the released code 1e-5) then differ by 1e-5 relative, not 2.5e-4.
        p.mul_(5.0)
  return model


def timm_mixer(width=32, layers=2, mlp_ratio=(0.5, 4.0), patch=8, size=32,
               classes=10):
  """timm's MLP-Mixer: 16 tokens, token MLP 16 wide, channel MLP 128."""
  timm = import_timm()
  model = timm.models.mlp_mixer.MlpMixer(
      img_size=size, patch_size=patch, embed_dim=width, num_blocks=layers,
      mlp_ratio=mlp_ratio, num_classes=classes)
  model = randomize(model, seed=3)
  import torch  # pylint: disable=g-import-not-at-top
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name and name.endswith("weight"):
        # LayerNorm scales near 1: pre-activations O(1), where the GELU
        # forms differ (tanh vs erf) by more than the parity tolerance.
        p.add_(1.0)
  return model


# timm's ViT families at the tiny size (tests/references/tiny_<family>.*):
# family -> (the timm model whose definition the options are taken from,
# those options). Copied from timm 1.0.31's model definitions (the model
# functions in timm/models/vision_transformer.py and deit.py);
# `timm_family_check` builds that timm model too and checks that the two
# agree. `norm_eps` is no constructor argument: it stands for
# norm_layer=partial(timm.layers.LayerNorm, eps=norm_eps), which CLIP's
# definitions pass (the default is timm's LayerNorm, eps 1e-6).
TINY_FAMILY_SIZE = dict(img_size=32, patch_size=8, embed_dim=32, depth=2,
                        num_heads=4, mlp_ratio=4.0, qkv_bias=True,
                        num_classes=10)
TINY_FAMILIES = {
    # DINOv2: layer scale (timm's init 1e-5), the class token has a
    # position embedding, class-token pooling.
    "dinov2": ("vit_small_patch14_dinov2",
               dict(init_values=1e-5, class_token=True, no_embed_class=False,
                    reg_tokens=0, global_pool="token")),
    # DINOv2 with 4 registers: timm's definition also sets
    # no_embed_class=True, so neither the class token nor the registers
    # have a position embedding (pos_embed covers the 16 patches only).
    "dinov2_reg": ("vit_small_patch14_reg4_dinov2",
                   dict(init_values=1e-5, class_token=True, no_embed_class=True,
                        reg_tokens=4, global_pool="token")),
    # DeiT III: layer scale (init 1e-6), no position embedding for the
    # class token, class-token pooling.
    "deit3": ("deit3_small_patch16_224",
              dict(init_values=1e-6, class_token=True, no_embed_class=True,
                   global_pool="token")),
    # OpenAI's CLIP image tower: a LayerNorm before the blocks (norm_pre;
    # the patch embedding then has no bias), LayerNorm eps 1e-5, QuickGELU.
    "clip": ("vit_base_patch16_clip_quickgelu_224",
             dict(pre_norm=True, norm_eps=1e-5, act_layer="quick_gelu",
                  class_token=True, global_pool="token")),
    # OpenCLIP's: the same with erf GELU (timm's default activation).
    "clip_gelu": ("vit_base_patch16_clip_224",
                  dict(pre_norm=True, norm_eps=1e-5, class_token=True,
                       global_pool="token")),
    # A plain ViT that averages the patch tokens (not the class token) and
    # normalises the average (fc_norm; then there is no final `norm`).
    "avg_fc_norm": ("vit_small_patch16_224",
                    dict(class_token=True, global_pool="avg", fc_norm=True)),
    # ViT-Medium/16 with global average pooling: no class token, the mean
    # of the patch tokens after the final norm (fc_norm=False), layer
    # scale (init 1e-6), no query/key/value biases (qkv_bias=False).
    "medium_gap": ("vit_medium_patch16_gap_256",
                   dict(class_token=False, global_pool="avg", qkv_bias=False,
                        init_values=1e-6, fc_norm=False)),
    # LayerNorms over each head's queries and keys (attn.q_norm, k_norm),
    # with query/key/value biases, class-token pooling.
    "qk_norm": ("vit_small_patch16_224",
                dict(qk_norm=True, class_token=True, global_pool="token")),
}
# What no timm model function defines, passed to the one a family follows.
_NOT_IN_THE_FUNCTION = {
    "avg_fc_norm": dict(global_pool="avg", fc_norm=True),
    "qk_norm": dict(qk_norm=True),
}


def tiny_family_kwargs(family: str) -> dict:
  """What `timm_family` passes to VisionTransformer, JSON-able: a
  norm_layer as the string 'LayerNorm(eps=...)'."""
  _, options = TINY_FAMILIES[family]
  kwargs = dict(TINY_FAMILY_SIZE)
  for key, value in options.items():
    if key == "norm_eps":
      kwargs["norm_layer"] = f"LayerNorm(eps={value})"
    else:
      kwargs[key] = value
  return kwargs


def tiny_family_norm_eps(family: str) -> float:
  return TINY_FAMILIES[family][1].get("norm_eps", 1e-6)


def _family_options(family: str) -> dict:
  import functools  # pylint: disable=g-import-not-at-top
  timm = import_timm()
  options = dict(TINY_FAMILIES[family][1])
  if "norm_eps" in options:
    options["norm_layer"] = functools.partial(timm.layers.LayerNorm,
                                              eps=options.pop("norm_eps"))
  return options


def randomize_family(model, seed: int, layer_scales=(".gamma",)):
  """`randomize`, then LayerNorm scales near 1 (pre-activations O(1),
  where QuickGELU and GELU differ) and layer-scale gammas (the parameters
  whose names end with one of `layer_scales`) of std 0.5 (not timm's 1e-5
  or 1e-6, so that they matter)."""
  import torch  # pylint: disable=g-import-not-at-top
  model = randomize(model, seed=seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name and name.endswith("weight"):
        p.add_(1.0)
      elif name.endswith(layer_scales):
        p.mul_(2.5)
  return model


def timm_family(family: str, seed: int = None):
  """One of TINY_FAMILIES: timm's VisionTransformer, random weights."""
  timm = import_timm()
  if seed is None:
    seed = 10 + list(TINY_FAMILIES).index(family)
  model = timm.models.vision_transformer.VisionTransformer(**{
      **TINY_FAMILY_SIZE,
      **_family_options(family)
  })
  return randomize_family(model, seed)


def timm_family_check(family: str, model, images_BxHxWxC: np.ndarray):
  """Builds TINY_FAMILIES[family]'s timm model by its registered name (at
  the tiny size) and checks that its state dict's names and shapes, its
  LayerNorm eps, activation and prefix tokens are `model`'s, and that it
  computes the same logits with `model`'s weights."""
  import torch  # pylint: disable=g-import-not-at-top
  timm = import_timm()
  name, options = TINY_FAMILIES[family]
  # The size, but what the family sets as its function does (qkv_bias).
  overrides = {k: v for k, v in TINY_FAMILY_SIZE.items() if k not in options}
  overrides.update(_NOT_IN_THE_FUNCTION.get(family, {}))
  reference = timm.create_model(name, pretrained=False, **overrides).eval()
  assert type(reference) is type(model), (family, type(reference))
  ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
  theirs = {k: tuple(v.shape) for k, v in reference.state_dict().items()}
  assert ours == theirs, (family, ours, theirs)
  for attribute in ("num_prefix_tokens", "no_embed_class", "global_pool",
                    "has_class_token", "num_reg_tokens"):
    assert getattr(model, attribute) == getattr(reference,
                                                attribute), (family, attribute)
  epsilons = {
      m.eps for m in model.modules() if isinstance(m, torch.nn.LayerNorm)
  }
  assert epsilons == {
      m.eps for m in reference.modules() if isinstance(m, torch.nn.LayerNorm)
  }
  assert epsilons == {options.get("norm_eps", 1e-6)}, (family, epsilons)
  assert (type(model.blocks[0].mlp.act) is type(
      reference.blocks[0].mlp.act)), family
  reference.load_state_dict(model.state_dict())
  np.testing.assert_array_equal(torch_logits(model, images_BxHxWxC),
                                torch_logits(reference, images_BxHxWxC))


def torch_features(model, images_BxHxWxC: np.ndarray) -> np.ndarray:
  """timm's `forward_features`: B x tokens x D, after the final norm."""
  import torch  # pylint: disable=g-import-not-at-top
  x = torch.from_numpy(
      np.ascontiguousarray(images_BxHxWxC.transpose(0, 3, 1, 2)))
  with torch.no_grad():
    return model.forward_features(x).numpy()


def hugging_face_vit(width=32, depth=2, heads=4, mlp=64, patch=8, size=32,
                     classes=10):
  from transformers import ViTConfig  # pylint: disable=g-import-not-at-top
  from transformers import ViTForImageClassification  # pylint: disable=g-import-not-at-top
  config = ViTConfig(hidden_size=width, num_hidden_layers=depth,
                     num_attention_heads=heads, intermediate_size=mlp,
                     image_size=size, patch_size=patch, num_labels=classes)
  return randomize(ViTForImageClassification(config), seed=1)


def torch_logits(model, images_BxHxWxC: np.ndarray) -> np.ndarray:
  import torch  # pylint: disable=g-import-not-at-top
  x = torch.from_numpy(
      np.ascontiguousarray(images_BxHxWxC.transpose(0, 3, 1, 2)))
  with torch.no_grad():
    out = model(x) if not hasattr(model, "vit") else model(pixel_values=x)
  return (out.logits if hasattr(out, "logits") else out).numpy()


def save_timm_file(model, path: str, function: str = None):
  """The weights file timm's `save_for_hf` writes for `model` (the
  model.safetensors its Hub repositories hold, or for another suffix the
  pytorch_model.bin it writes by torch.save), copied to `path`. It also
  writes a config.json (not kept) from the model's pretrained_cfg, which
  timm's builder gives a model made by its function: one made from its
  class is given that of `function`, the timm model it follows."""
  import shutil  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  timm = import_timm()
  if not hasattr(model, "pretrained_cfg"):
    model.pretrained_cfg = timm.models.get_pretrained_cfg(function).to_dict()
  safe = path.endswith(".safetensors")
  with tempfile.TemporaryDirectory() as directory:
    timm.models.save_for_hf(model, directory, safe_serialization=safe)
    shutil.copyfile(
        f"{directory}/{'model.safetensors' if safe else 'pytorch_model.bin'}",
        path)


def save_pretrained_checked(model, directory: str, compute, out: dict):
  """`model.save_pretrained(directory)` (a fresh directory: config.json and
  model.safetensors, the names transformers writes), then its class's
  from_pretrained of it (local, nothing downloaded) must load every
  weight (none missing, unexpected or of another shape) and compute `out`
  again: `compute(model)` -> {key: array}."""
  import os  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.rmtree(directory, ignore_errors=True)
  os.makedirs(directory)
  model.save_pretrained(directory)
  loaded, info = type(model).from_pretrained(
      directory, local_files_only=True, output_loading_info=True,
      attn_implementation=model.config._attn_implementation)  # pylint: disable=protected-access
  problems = {k: v for k, v in info.items() if v}
  if problems:
    raise ValueError(f"{directory}: {problems}")
  again = compute(loaded.eval())
  for key, value in out.items():
    np.testing.assert_array_equal(again[key], value, err_msg=key)


# Hugging Face transformers' DINOv2s at the tiny size
# (tests/references/tiny_hf_<name>/): name -> (config class
# name, model class name, extra config arguments). The `image_size` is the
# images' (32), so the model does not interpolate its position embeddings.
TINY_HF_DINOV2_CONFIG = dict(
    image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
    num_attention_heads=4, mlp_ratio=4, layerscale_value=1.0,
    use_swiglu_ffn=False, qkv_bias=True, layer_norm_eps=1e-6, hidden_act="gelu")
TINY_HF_MODELS = {
    # DINOv2 (no head): cls_token, mask_token, position_embeddings
    # (1 x 1+16 x D: the class token has one), layer scale (lambda1).
    "dinov2": ("Dinov2Config", "Dinov2Model", {}),
    # With 4 registers: position_embeddings still 1 x 1+16 x D (class
    # token and patches); the registers are put between them after the
    # position embeddings are added, so they have none.
    "dinov2_reg": ("Dinov2WithRegistersConfig", "Dinov2WithRegistersModel",
                   dict(num_register_tokens=4)),
}


def tiny_hf_config(name: str):
  """TINY_HF_MODELS[name]'s transformers config (eager attention)."""
  import transformers  # pylint: disable=g-import-not-at-top
  config_class, _, extra = TINY_HF_MODELS[name]
  config = getattr(transformers, config_class)(**TINY_HF_DINOV2_CONFIG, **extra)
  config._attn_implementation = "eager"  # pylint: disable=protected-access
  return config


def hugging_face_dinov2(name: str = "dinov2", seed: int = None):
  """TINY_HF_MODELS[name], random weights as `randomize_family`'s:
  LayerNorm scales near 1, layer-scale lambdas of std 0.5."""
  import transformers  # pylint: disable=g-import-not-at-top
  if seed is None:
    seed = 20 + list(TINY_HF_MODELS).index(name)
  model_class = getattr(transformers, TINY_HF_MODELS[name][1])
  return randomize_family(model_class(tiny_hf_config(name)), seed,
                          (".lambda1",))


def hugging_face_outputs(model, images_BxHxWxC: np.ndarray):
  """A transformers backbone's (last_hidden_state, pooler_output) of NHWC
  images: B x tokens x D after the final layernorm, and B x D."""
  import torch  # pylint: disable=g-import-not-at-top
  x = torch.from_numpy(
      np.ascontiguousarray(images_BxHxWxC.transpose(0, 3, 1, 2)))
  with torch.no_grad():
    out = model(pixel_values=x)
  # pooler_output is a view (strided): safetensors would store the memory
  # it points into, not its values.
  return (np.ascontiguousarray(out.last_hidden_state.numpy()),
          np.ascontiguousarray(out.pooler_output.numpy()))


def hf_vit_logits_from_dir(directory: str,
                           images_nhwc: np.ndarray) -> np.ndarray:
  """Logits of transformers' ViTForImageClassification.from_pretrained(
  directory) (a local directory: config.json and model.safetensors, as
  save_pretrained writes them; nothing is downloaded) of NHWC images.
  Raises ValueError if a weight is missing, unexpected or of another
  shape."""
  from transformers import ViTForImageClassification  # pylint: disable=g-import-not-at-top
  model, info = ViTForImageClassification.from_pretrained(
      directory, local_files_only=True, output_loading_info=True)
  # from_pretrained only warns of missing weights (and initialises them at
  # random) and ignores unexpected ones: a wrong name must fail here.
  problems = {k: v for k, v in info.items() if v}
  if problems:
    raise ValueError(f"{directory}: {problems}")
  return torch_logits(model.eval(), images_nhwc)


def timm_logits_from_dir(directory: str, images_nhwc: np.ndarray) -> np.ndarray:
  """Logits of timm.create_model('local-dir:' + directory, pretrained=True)
  of NHWC images: the directory as timm's save_for_hf writes it (a
  config.json with 'architecture', 'num_classes', 'pretrained_cfg' and
  'model_args', and model.safetensors, or another checkpoint timm finds
  there); nothing is downloaded."""
  timm = import_timm()
  model = timm.create_model("local-dir:" + str(directory),
                            pretrained=True).eval()
  return torch_logits(model, images_nhwc)


def hf_dinov2_timm_check(name: str, model, images_BxHxWxC: np.ndarray):
  """Loads TINY_HF_MODELS[name]'s weights into timm's VisionTransformer of
  the matching TINY_FAMILIES entry (no head) and checks that its
  forward_features is the transformers model's last_hidden_state: the
  tokens in the same order (class token, registers, patches), and the
  class token's position embedding added to it (timm's 4-register DINOv2
  is no_embed_class, so the class token it is given is transformers'
  cls_token + position_embeddings[:, 0]; the registers have none)."""
  import torch  # pylint: disable=g-import-not-at-top
  timm = import_timm()
  size = dict(TINY_FAMILY_SIZE, num_classes=0)
  reference = timm.models.vision_transformer.VisionTransformer(
      **size, **_family_options(name)).eval()
  hf = model.state_dict()
  state = {
      "cls_token": hf["embeddings.cls_token"],
      "pos_embed": hf["embeddings.position_embeddings"],
      "patch_embed.proj.weight":
          hf["embeddings.patch_embeddings.projection.weight"],
      "patch_embed.proj.bias":
          hf["embeddings.patch_embeddings.projection.bias"],
      "norm.weight": hf["layernorm.weight"],
      "norm.bias": hf["layernorm.bias"],
  }
  if "embeddings.register_tokens" in hf:
    state["reg_token"] = hf["embeddings.register_tokens"]
    state["cls_token"] = state["cls_token"] + state["pos_embed"][:, :1]
    state["pos_embed"] = state["pos_embed"][:, 1:]
  for i in range(len(reference.blocks)):
    src, dst = f"encoder.layer.{i}.", f"blocks.{i}."
    for kind in ("weight", "bias"):
      state[dst + f"attn.qkv.{kind}"] = torch.cat(
          [hf[src + f"attention.{p}_proj.{kind}"] for p in "qkv"])
      for a, b in (("norm1", "norm1"), ("norm2", "norm2"), ("attention.o_proj",
                                                            "attn.proj"),
                   ("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2")):
        state[dst + f"{b}.{kind}"] = hf[src + f"{a}.{kind}"]
    state[dst + "ls1.gamma"] = hf[src + "layer_scale1.lambda1"]
    state[dst + "ls2.gamma"] = hf[src + "layer_scale2.lambda1"]
  reference.load_state_dict(state)  # Strict: every name, every shape.
  features = torch_features(reference, images_BxHxWxC)
  hidden, pooled = hugging_face_outputs(model, images_BxHxWxC)
  np.testing.assert_allclose(features, hidden, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(pooled, hidden[:, 0])
