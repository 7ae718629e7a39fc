"""Writes the stored timm / Hugging Face references (see `stored.py`).

    make references     # = the torch environment, then:
    .venv-torch/bin/python -m tests.references.generate
    .venv-torch/bin/python -m tests.references.generate mixer   # that only
    .venv-torch/bin/python -m tests.references.generate families  # ditto
    .venv-torch/bin/python -m tests.references.generate hf        # ditto
    .venv-torch/bin/python -m tests.references.generate rope      # ditto
    .venv-torch/bin/python -m tests.references.generate siglip    # ditto
    .venv-torch/bin/python -m tests.references.generate siglip2   # ditto
    .venv-torch/bin/python -m tests.references.generate naflex    # ditto

Runs where torch, timm and transformers are installed (the pins of
`requirements.txt`; `make torch-env` builds that environment on Python 3.11
with torch's CPU build), not where vit_jax is: nothing of ours is imported,
so what is stored is what those libraries compute. Nothing is downloaded:
the models are built from their classes, with random weights.

Each weights file is what its library writes, as users get it: timm's by
its `save_for_hf` (the model.safetensors of its Hub repositories, or its
pytorch_model.bin), transformers' as the directory `save_pretrained`
writes (config.json, model.safetensors), checked to load back by
`from_pretrained`; never a `state_dict()` saved by hand, whose names no
released file has. (MAE's and big_vision's files are written by their
authors' code, which is not installed here: `mae_reference.py`,
`big_vision_naflex.py`, `big_vision_siglip.py` say how.)
"""

import functools
import json
import os
import platform
import shutil
import sys

import numpy as np

from tests.helpers import torch_reference
from tests.helpers import torch_rope_reference
from tests.helpers import torch_siglip_reference
from tests.references import generate_naflex
from tests.references import stored


def _tiny_images() -> np.ndarray:
  """What `stored.tiny_images()` reads back."""
  return np.random.default_rng(0).uniform(
      -1, 1, (3, stored.TINY_IMAGE_SIZE, stored.TINY_IMAGE_SIZE, 3)).astype(
          np.float32)


def write_tiny(versions: dict):
  """The tiny models' weights (timm's safetensors and .pth, transformers'
  directory) and their logits of the images the tests use."""
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  images = _tiny_images()
  outputs = {"images": images}
  model = torch_reference.timm_vit()
  for suffix in ("safetensors", "pth"):
    torch_reference.save_timm_file(model, stored.path(f"tiny_timm.{suffix}"),
                                   torch_reference.TINY_TIMM_FUNCTION)
  outputs["timm"] = torch_reference.torch_logits(model, images)
  model = torch_reference.timm_hybrid_vit()
  torch_reference.save_timm_file(model, stored.path("tiny_hybrid.safetensors"))
  outputs["hybrid"] = torch_reference.torch_logits(model, images)
  model = torch_reference.hugging_face_vit()
  compute = functools.partial(_hf_logits, images=images)
  computed = compute(model)
  torch_reference.save_pretrained_checked(model, stored.path("tiny_hf"),
                                          compute, computed)
  outputs.update(computed)
  st_numpy.save_file(outputs, stored.path("tiny_logits.safetensors"),
                     metadata=versions)


def _hf_logits(model, images) -> dict:
  return {"hf": torch_reference.torch_logits(model, images)}


def write_tiny_mixer(versions: dict):
  """timm's tiny MLP-Mixer: its state dict, and its logits of the same
  images, in a file of their own (the other files' bytes stay as they
  were)."""
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  model = torch_reference.timm_mixer()
  torch_reference.save_timm_file(model, stored.path("tiny_mixer.safetensors"),
                                 torch_reference.TINY_MIXER_FUNCTION)
  logits = torch_reference.torch_logits(model, _tiny_images())
  st_numpy.save_file({"mixer": logits},
                     stored.path("tiny_mixer_logits.safetensors"),
                     metadata=versions)


def write_tiny_families(versions: dict):
  """timm's tiny ViT families (`torch_reference.TINY_FAMILIES`): each one's
  state dict, and in one file of their own (the other files' bytes stay
  as they were) their logits of the same images, the 4-register DINOv2's
  `forward_features`, and each one's constructor arguments."""
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  images = _tiny_images()
  outputs = {}
  metadata = dict(versions)
  for family in torch_reference.TINY_FAMILIES:
    model = torch_reference.timm_family(family)
    torch_reference.timm_family_check(family, model, images)
    torch_reference.save_timm_file(model,
                                   stored.path(f"tiny_{family}.safetensors"),
                                   torch_reference.TINY_FAMILIES[family][0])
    outputs[family] = torch_reference.torch_logits(model, images)
    if family == "dinov2_reg":
      outputs["dinov2_reg_features"] = torch_reference.torch_features(
          model, images)
    metadata[f"kwargs:{family}"] = json.dumps(
        torch_reference.tiny_family_kwargs(family), sort_keys=True)
    metadata[f"layer_norm_eps:{family}"] = repr(
        torch_reference.tiny_family_norm_eps(family))
    metadata[f"timm_model:{family}"] = torch_reference.TINY_FAMILIES[family][0]
  st_numpy.save_file(outputs, stored.path("tiny_families_logits.safetensors"),
                     metadata=metadata)


def write_tiny_hf(versions: dict):
  """transformers' tiny DINOv2s (`torch_reference.TINY_HF_MODELS`): the
  directory each one's save_pretrained writes (tiny_hf_<name>/), and in
  one file of their own (the other files' bytes stay as they were) their
  last_hidden_state and pooler_output of the same images."""
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  images = _tiny_images()
  outputs = {}
  metadata = dict(versions)
  for name in torch_reference.TINY_HF_MODELS:
    model = torch_reference.hugging_face_dinov2(name)
    torch_reference.hf_dinov2_timm_check(name, model, images)
    compute = functools.partial(_dinov2_outputs, name=name, images=images)
    computed = compute(model)
    torch_reference.save_pretrained_checked(
        model, stored.path(f"tiny_hf_{name}"), compute, computed)
    outputs.update(computed)
    metadata[f"model:{name}"] = type(model).__name__
    metadata[f"attn_implementation:{name}"] = (
        model.config._attn_implementation)  # pylint: disable=protected-access
  st_numpy.save_file(outputs, stored.path("tiny_hf_logits.safetensors"),
                     metadata=metadata)
  _sort_metadata(stored.path("tiny_hf_logits.safetensors"))


def _dinov2_outputs(model, name, images) -> dict:
  hidden, pooled = torch_reference.hugging_face_outputs(model, images)
  return {f"{name}_last_hidden_state": hidden, f"{name}_pooler": pooled}


def _sort_metadata(filename: str):
  """Rewrites a safetensors header with its metadata's keys sorted, padded
  to the same length: safetensors writes them in a hash map's order, which
  changes from run to run, and so would the file's bytes."""
  with open(filename, "r+b") as f:
    length = int.from_bytes(f.read(8), "little")
    header = json.loads(f.read(length))
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= length, (len(text), length)
    f.seek(8)
    f.write(text + b" " * (length - len(text)))


def full_size_models():
  """(name, library's description, module) of the full-size models."""
  timm = torch_reference.import_timm()
  from transformers import ViTConfig  # pylint: disable=g-import-not-at-top
  from transformers import ViTForImageClassification  # pylint: disable=g-import-not-at-top
  size = stored.FULL_SIZE_IMAGE_SIZE
  for name in ("vit_base_patch16_224", "vit_base_r50_s16_224"):
    yield name, f"timm {name} (erf GELU)", timm.create_model(
        name, pretrained=False, num_classes=1000)
  yield ("hf_vit_base", "Hugging Face ViTForImageClassification (erf GELU)",
         ViTForImageClassification(ViTConfig(image_size=size, num_labels=1000)))


def write_rope(versions: dict):
  """timm's tiny RoPE encoders (`torch_rope_reference.TINY_ROPE_MODELS`):
  each one's weights file, transformers' DINOv3ViTModel's directories
  (plain and gated), and in one file of their own their outputs
  (`torch_rope_reference.outputs`, `.hf_outputs`), the wide images, and
  each timm model's function and size."""
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  images, wide = _tiny_images(), torch_rope_reference.wide_images()
  out, metadata = {"wide_images": wide}, dict(versions)
  for name, function in torch_rope_reference.TINY_ROPE_MODELS.items():
    model = torch_rope_reference.timm_rope_model(name)
    torch_reference.save_timm_file(model,
                                   stored.path(f"tiny_{name}.safetensors"))
    out.update(torch_rope_reference.outputs(name, model, images, wide))
    metadata[f"timm_model:{name}"] = function
  metadata["size"] = json.dumps(torch_rope_reference.TINY_ROPE_SIZE,
                                sort_keys=True)
  for name, model in (("hf_dinov3", torch_rope_reference.hf_dinov3()),
                      ("hf_dinov3_gated",
                       torch_rope_reference.hf_dinov3(seed=51, gated=True))):
    compute = functools.partial(torch_rope_reference.hf_outputs,
                                images_BxHxWxC=images, wide_BxHxWxC=wide,
                                name=name)
    outputs = compute(model)
    torch_reference.save_pretrained_checked(model, stored.path(f"tiny_{name}"),
                                            compute, outputs)
    out.update(outputs)
  st_numpy.save_file(out, stored.path("tiny_rope_logits.safetensors"),
                     metadata=metadata)


def write_siglip(versions: dict):
  """transformers' tiny SiglipModel (`torch_siglip_reference`): the
  directory its save_pretrained writes (tiny_hf_siglip/: config.json,
  model.safetensors), checked to load back by from_pretrained, and in a
  file of their own its inputs and outputs
  (`torch_siglip_reference.outputs`) and its config."""
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  model = torch_siglip_reference.siglip_model()
  pixels, ids = torch_siglip_reference.inputs()
  out = torch_siglip_reference.outputs(model, pixels, ids)
  torch_siglip_reference.check(model, pixels, ids, out)
  directory = stored.path("tiny_hf_siglip")
  shutil.rmtree(directory, ignore_errors=True)
  os.makedirs(directory)
  torch_siglip_reference.save_pretrained_checked(model, directory, pixels, ids,
                                                 out)
  metadata = dict(versions)
  metadata["config"] = json.dumps(model.config.to_dict(), sort_keys=True)
  metadata["model"] = type(model).__name__
  # pylint: disable-next=protected-access
  metadata["attn_implementation"] = model.config._attn_implementation
  metadata["eos_id"] = str(torch_siglip_reference.EOS_ID)
  metadata["text_pooling"] = "last position"
  filename = stored.path("tiny_hf_siglip_outputs.safetensors")
  st_numpy.save_file({
      "pixel_values": pixels,
      "input_ids": ids,
      **out
  }, filename, metadata=metadata)
  _sort_metadata(filename)


def write_siglip2(versions: dict):
  """transformers' tiny Siglip2Model (`torch_siglip_reference.siglip2_*`):
  the directory its save_pretrained writes (tiny_hf_siglip2/: config.json,
  model.safetensors), checked to load back by from_pretrained, and in a
  file of their own its inputs (with the images the patches were cut
  from), outputs and config."""
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  model = torch_siglip_reference.siglip2_model()
  inputs = torch_siglip_reference.siglip2_inputs()
  out = torch_siglip_reference.siglip2_outputs(model, inputs)
  torch_siglip_reference.siglip2_check(model, inputs, out)
  directory = stored.path("tiny_hf_siglip2")
  shutil.rmtree(directory, ignore_errors=True)
  os.makedirs(directory)
  torch_siglip_reference.siglip2_save_pretrained_checked(
      model, directory, inputs, out)
  metadata = dict(versions)
  metadata["config"] = json.dumps(model.config.to_dict(), sort_keys=True)
  metadata["model"] = type(model).__name__
  # pylint: disable-next=protected-access
  metadata["attn_implementation"] = model.config._attn_implementation
  metadata["eos_id"] = str(torch_siglip_reference.EOS_ID)
  metadata["text_pooling"] = "last position"
  metadata["patch_order"] = "row in patch, column in patch, channel"
  filename = stored.path("tiny_hf_siglip2_outputs.safetensors")
  st_numpy.save_file({**inputs, **out}, filename, metadata=metadata)
  _sort_metadata(filename)


def write_naflex(versions: dict):
  """timm's tiny NaFlexViTs (`generate_naflex.py`)."""
  generate_naflex.write({k: versions[k] for k in ("python", "torch", "timm")})


def write_full_size(versions: dict):
  """Each model's parameter names and shapes, and its logits of
  `stored.full_size_images()` with `stored.trained_like_state` weights."""
  import torch  # pylint: disable=g-import-not-at-top
  images = stored.full_size_images()
  models = {}
  for name, description, module in full_size_models():
    parameters = [[n, list(p.shape)] for n, p in module.named_parameters()]
    # The parameters are the whole state: nothing else would be loaded.
    assert sorted(module.state_dict()) == sorted(n for n, _ in parameters)
    state = stored.trained_like_state(parameters)
    module.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    logits = torch_reference.torch_logits(module.eval(), images)
    models[name] = {
        "description": description,
        "parameters": parameters,
        "logits": logits.tolist()
    }
  with open(stored.path("full_size.json"), "w") as f:
    json.dump({"versions": versions, "models": models}, f)
    f.write("\n")


def main(argv):
  """No argument: every file; `mixer`: the Mixer's files only;
  `families`: the ViT families' files only; `hf`: the transformers
  DINOv2s' files only; `rope`: the RoPE encoders' only; `siglip`: the
  transformers SiglipModel's only; `siglip2`: the transformers
  Siglip2Model's only; `naflex`: timm's NaFlexViTs' only."""
  import timm  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  versions = {
      "python": platform.python_version(),
      "torch": torch.__version__,
      "timm": timm.__version__,
      "transformers": transformers.__version__
  }
  groups = ("mixer", "families", "hf", "rope", "siglip", "siglip2", "naflex")
  if argv[1:] and (len(argv) > 2 or argv[1] not in groups):
    raise SystemExit(f"usage: {argv[0]} [{' | '.join(groups)}]")
  if not argv[1:]:
    write_tiny(versions)
    write_full_size(versions)
  if argv[1:] in ([], ["mixer"]):
    write_tiny_mixer(versions)
  if argv[1:] in ([], ["families"]):
    write_tiny_families(versions)
  if argv[1:] in ([], ["hf"]):
    write_tiny_hf(versions)
  if argv[1:] in ([], ["rope"]):
    write_rope(versions)
  if argv[1:] in ([], ["siglip"]):
    write_siglip(versions)
  if argv[1:] in ([], ["siglip2"]):
    write_siglip2(versions)
  if argv[1:] in ([], ["naflex"]):
    write_naflex(versions)
  print("Wrote tests/references with " +
        ", ".join(f"{k} {v}" for k, v in versions.items()))


if __name__ == "__main__":
  main(sys.argv)
