"""Independent PyTorch ViTs (timm, Hugging Face) and timm's MLP-Mixer, built
locally, random weights.

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


def save_state_dict(model, path: str):
  """`.safetensors` via safetensors, anything else via torch.save."""
  import torch  # pylint: disable=g-import-not-at-top
  state = {k: v.contiguous() for k, v in model.state_dict().items()}
  if path.endswith(".safetensors"):
    from safetensors.torch import save_file  # pylint: disable=g-import-not-at-top
    save_file(state, path)
  else:
    torch.save(state, path)
