"""What timm and Hugging Face computed, stored here for the parity tests.

The suite runs without PyTorch: on Python 3.12+ the package registry has
only torch's CUDA build (several GB), and the CPU build this machine kind
keeps on disk is for Python 3.11. So the numbers the tests compare with were
computed by timm and transformers themselves, in a Python 3.11 environment
with the versions of `requirements.txt`, by `generate.py`, and committed.
Each weights file is what its library writes (`generate.py` says how):
timm's the model.safetensors of its `save_for_hf` (timm's Hub files: the
module's names), transformers' the directory of `save_pretrained`
(config.json and model.safetensors, in the names transformers writes):

  tiny_timm.safetensors    timm's ViT (width 32, depth 2, patch 8, 32 px,
                           10 classes), random weights
  tiny_timm.pth            the same, the pytorch_model.bin save_for_hf
                           writes by torch.save
  tiny_hybrid.safetensors  timm's ResNetV2 + ViT hybrid (patch 1, 5 classes)
  tiny_hf/                 transformers' ViTForImageClassification (the
                           tiny timm model's shape): the Hub's names
                           (vit.encoder.layer.N.attention.attention.query)
  tiny_logits.safetensors  the images all tiny models were run on (NHWC)
                           and each model's logits
  tiny_mixer.safetensors   timm's MlpMixer (width 32, 2 blocks, patch 8,
                           32 px so 16 tokens, token MLP 16 and channel MLP
                           128 wide, 10 classes), random weights
  tiny_mixer_logits.safetensors
                           its logits of the same images ("mixer"); a file
                           of its own, written by `generate.py mixer`
  tiny_<family>.safetensors
                           timm's VisionTransformer built with the options
                           of a timm model family (the same tiny size:
                           width 32, depth 2, 4 heads, patch 8, 32 px, MLP
                           128, qkv bias, 10 classes), random weights
                           (LayerNorm scales near 1, layer-scale gammas of
                           std 0.5), for each of TINY_FAMILIES:
                             dinov2       layer scale (ls1/ls2.gamma); the
                                          class token has a position
                                          embedding (pos_embed 1 x 17)
                             dinov2_reg   also 4 registers (reg_token);
                                          as timm's reg4 DINOv2s,
                                          no_embed_class: neither the
                                          class token nor the registers
                                          have a position embedding
                                          (pos_embed 1 x 16)
                             deit3        layer scale, no_embed_class
                             clip         OpenAI's: norm_pre (the patch
                                          embedding has no bias),
                                          LayerNorm eps 1e-5, QuickGELU
                             clip_gelu    OpenCLIP's: the same, erf GELU
                             avg_fc_norm  the mean of the patch tokens,
                                          then fc_norm (no final `norm`)
                           and of TINY_BLOCK_FAMILIES (ViT-22B's block
                           options in timm's form):
                             medium_gap   vit_medium_patch16_gap_256's:
                                          no class token, the mean of
                                          the patch tokens after the
                                          final norm, layer scale, no
                                          query/key/value biases
                                          (qkv_bias=False)
                             qk_norm      LayerNorms over each head's
                                          queries and keys (attn.q_norm,
                                          attn.k_norm), qkv biases
                           all but avg_fc_norm and medium_gap pool the
                           class token
  tiny_families_logits.safetensors
                           their logits of the same images (keys: the
                           families), "dinov2_reg_features" (dinov2_reg's
                           forward_features, 3 x 21 tokens x 32: class
                           token, 4 registers, 16 patches, after the final
                           norm), and in its metadata each family's
                           constructor arguments ("kwargs:<family>", JSON),
                           LayerNorm eps ("layer_norm_eps:<family>") and
                           the timm model it follows ("timm_model:<family>");
                           written by `generate.py families`
  tiny_hf_<name>/          transformers' DINOv2 backbones (no head) for
                           each of TINY_HF_MODELS (width 32, depth 2, 4
                           heads, patch 8, 32 px so no position-embedding
                           interpolation, MLP 128 with erf GELU, qkv bias,
                           layer scale, LayerNorm eps 1e-6), random weights
                           (LayerNorm scales near 1, lambdas of std 0.5),
                           in the names of the Hub's DINOv2s (metadata
                           {"format": "pt"}):
                             embeddings.cls_token          1 x 1 x 32
                             embeddings.mask_token         1 x 32 (unused)
                             embeddings.position_embeddings 1 x 17 x 32
                                 (the class token's first, then 16 patches)
                             embeddings.register_tokens    1 x 4 x 32
                                 (dinov2_reg only)
                             embeddings.patch_embeddings.projection.*
                             encoder.layer.<i>.norm1.*,
                               .attention.attention.{query,key,value}.*,
                               .attention.output.dense.*,
                               .layer_scale1.lambda1, .norm2.*,
                               .mlp.fc1.*, .mlp.fc2.*,
                               .layer_scale2.lambda1
                             layernorm.*
                           (transformers 5's modules call the attention's
                           .attention.{q,k,v,o}_proj)
                             dinov2       Dinov2Model
                             dinov2_reg   Dinov2WithRegistersModel, 4
                                          registers: the class token has
                                          a position embedding, the
                                          registers none (inserted between
                                          it and the patches after the
                                          position embeddings are added)
  tiny_hf_logits.safetensors
                           their outputs of the same images:
                           "<name>_last_hidden_state" (3 x 17 x 32 for
                           dinov2, 3 x 21 x 32 for dinov2_reg: class token,
                           4 registers, 16 patches; after the final
                           layernorm) and "<name>_pooler" (3 x 32: the
                           class token of last_hidden_state), and in its
                           metadata each one's class ("model:<name>") and
                           attention ("attn_implementation:<name>",
                           eager); written by `generate.py hf`
  tiny_<rope model>.safetensors
                           timm's RoPE encoders, built by their model
                           functions at width 32, depth 2, 4 heads, patch
                           8, 32 px, 10 classes, random weights (LayerNorm
                           scales near 1, LayerScale gammas of std 0.5),
                           for each of TINY_ROPE_MODELS:
                             dinov3       vit_small_patch16_dinov3's Eva:
                                          4 registers, LayerScale
                                          (gamma_1, gamma_2), no qkv
                                          biases, RoPE (DINOv3's, base
                                          100), LayerNorm eps 1e-5, the
                                          mean of the patch tokens
                             dinov3_qkvb  the same with q_bias, v_bias
                           and, in TINY_EVA_MODELS (torch_rope_reference
                           says each one's form; `tiny_rope_timm_model`
                           its function): eva02 (SwiGLU packed),
                           eva02_subln (SwiGLU with its LayerNorm, q/k/v
                           apart), eva02_clip (and attn.norm), rope_axial,
                           rope_ape (and a table of the patches),
                           rope_mixed (rope.freqs), rope_sbb (timm's, 1
                           register, no class token), pe (PE core, its
                           RoPE scaled to a 4-patch grid, attn_pool),
                           dinov3_swiglu (vit_small_plus_patch16_dinov3)
  tiny_hf_dinov3/          transformers' DINOv3ViTModel at that size (its
                           defaults: query and value biases, no key bias,
                           4 registers here), random weights likewise, in
                           the names transformers 5 writes and the Hub's
                           DINOv3s have (layer.N.attention.q_proj, ...;
                           its modules' are model.layer.N...)
  tiny_hf_dinov3_gated/    the same with use_gated_mlp (SiLU), seed 51
  tiny_rope_logits.safetensors
                           their logits of tiny_images() ("<name>"), of
                           "wide_images" (2 x 32 x 48: a 4 x 6 grid, read
                           with no resizing) ("<name>_wide"), and their
                           features ("<name>_features": 3 x 21 x 32 after
                           the final norm for DINOv3; 17 for EVA-02 and
                           PE, 16 for rope_sbb); "_wide" only for models
                           without a
                           table; the DINOv3ViTModel's
                           "hf_dinov3_tokens" and "hf_dinov3_pooler" (and
                           "_wide"; "hf_dinov3_gated_*" likewise);
                           metadata: each one's timm model
                           ("timm_model:<name>") and the size;
                           written by `generate.py rope`
  full_size.json           timm's ViT-B/16 and R50+ViT-B/16 and Hugging
                           Face's ViT-B/16 at 224 px: each parameter's name
                           and shape in creation order, and the logits of
                           2 images; the weights are `trained_like_state`
                           (seeded numpy), so both sides make the same ones

Regenerate (`make references`) after changing `generate.py` or the pins.
This module needs numpy and safetensors only; `generate.py` imports it
too.
"""

import json
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TINY_IMAGE_SIZE = 32
FULL_SIZE_IMAGE_SIZE = 224


def path(name: str) -> str:
  """A stored file, e.g. path('tiny_timm.safetensors')."""
  return os.path.join(HERE, name)


TINY_ROPE_MODELS = ("dinov3", "dinov3_qkvb")
TINY_EVA_MODELS = ("eva02", "eva02_subln", "eva02_clip", "rope_axial",
                   "rope_ape", "rope_mixed", "rope_sbb", "pe", "dinov3_swiglu")


def tiny_rope_output(key: str) -> np.ndarray:
  """An array of tiny_rope_logits.safetensors (see the module doc)."""
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  return st_numpy.load_file(path("tiny_rope_logits.safetensors"))[key]


def tiny_rope_metadata(key: str) -> str:
  """A metadata entry of tiny_rope_logits.safetensors."""
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  with safe_open(path("tiny_rope_logits.safetensors"), "np") as f:
    return f.metadata()[key]


def tiny_rope_timm_model(name: str) -> str:
  """The timm model function TINY_ROPE_MODELS[name] was built by."""
  return tiny_rope_metadata(f"timm_model:{name}")


def tiny_images() -> np.ndarray:
  """The (3, 32, 32, 3) float32 images in [-1, 1] the tiny models saw."""
  return _tiny_outputs()["images"]


def tiny_logits(model: str) -> np.ndarray:
  """'timm', 'hybrid' or 'hf': that tiny model's logits of tiny_images()."""
  return _tiny_outputs()[model]


def tiny_mixer_logits() -> np.ndarray:
  """timm's tiny MLP-Mixer's logits of tiny_images()."""
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  return st_numpy.load_file(path("tiny_mixer_logits.safetensors"))["mixer"]


TINY_FAMILIES = ("dinov2", "dinov2_reg", "deit3", "clip", "clip_gelu",
                 "avg_fc_norm")
# Stored the same way (tests/test_block_options.py reads them).
TINY_BLOCK_FAMILIES = ("medium_gap", "qk_norm")


def tiny_family_logits(name: str) -> np.ndarray:
  """One of TINY_FAMILIES' or TINY_BLOCK_FAMILIES' logits of
  tiny_images() (3 x 10), or 'dinov2_reg_features': that model's
  forward_features (3 x 21 x 32)."""
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  return st_numpy.load_file(path("tiny_families_logits.safetensors"))[name]


def _tiny_families_metadata() -> dict:
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  with safe_open(path("tiny_families_logits.safetensors"), "np") as f:
    return f.metadata()


def tiny_family_kwargs(name: str) -> dict:
  """The keyword arguments timm's VisionTransformer was built with for
  that family (a norm_layer as the string 'LayerNorm(eps=1e-05)'; absent:
  timm's LayerNorm, eps 1e-6)."""
  return json.loads(_tiny_families_metadata()[f"kwargs:{name}"])


def tiny_family_layer_norm_eps(name: str) -> float:
  """That family's LayerNorm epsilon (1e-5 for CLIP, else timm's 1e-6)."""
  return float(_tiny_families_metadata()[f"layer_norm_eps:{name}"])


def tiny_family_state(name: str) -> dict:
  """That family's timm state dict: PyTorch name -> float32 array."""
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  return st_numpy.load_file(path(f"tiny_{name}.safetensors"))


TINY_HF_MODELS = ("dinov2", "dinov2_reg")


def tiny_hf_directory(name: str) -> str:
  """The directory one of TINY_HF_MODELS' save_pretrained wrote, or
  'dinov3' or 'dinov3_gated' (DINOv3ViTModel's)."""
  return path(f"tiny_hf_{name}")


def tiny_hf_state(name: str) -> dict:
  """A tiny_hf_directory's weights: PyTorch name -> float32 array, the
  names save_pretrained writes."""
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  return st_numpy.load_file(
      os.path.join(tiny_hf_directory(name), "model.safetensors"))


def tiny_hf_output(key: str) -> np.ndarray:
  """'<name>_last_hidden_state' (3 x tokens x 32) or '<name>_pooler'
  (3 x 32) of one of TINY_HF_MODELS, of tiny_images()."""
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  return st_numpy.load_file(path("tiny_hf_logits.safetensors"))[key]


def _tiny_outputs() -> dict:
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  return st_numpy.load_file(path("tiny_logits.safetensors"))


def full_size_images(batch: int = 2, seed: int = 0) -> np.ndarray:
  """NHWC float32 in [-1, 1], seeded (numpy's generators are stable)."""
  return np.random.default_rng(seed).uniform(
      -1, 1, (batch, FULL_SIZE_IMAGE_SIZE, FULL_SIZE_IMAGE_SIZE, 3)).astype(
          np.float32)


def full_size() -> dict:
  """name -> {'parameters': [[name, shape], ...], 'logits': array,
  'library': ...} of the full-size models (see the module doc)."""
  with open(path("full_size.json")) as f:
    models = json.load(f)["models"]
  for entry in models.values():
    entry["logits"] = np.asarray(entry["logits"], np.float32)
  return models


def trained_like_state(parameters, seed: int = 0) -> dict:
  """A PyTorch-named state dict of float32 numpy arrays at trained scales.

  `parameters`: [(name, shape), ...] in the module's creation order (each
  value is drawn in turn from one seeded generator). Dense kernels std
  1/sqrt(fan-in); stem conv kernels (names with 'backbone') a std drawn
  per layer from [0.01, 0.05]; norm scales 1 + noise; biases, tokens and
  position embeddings O(0.3), as `numpy_reference.trained_like_params`.
  """
  rng = np.random.default_rng(seed)
  state = {}
  for name, shape in parameters:
    shape = tuple(shape)
    if len(shape) == 4 and "backbone" in name:
      value = rng.uniform(0.01, 0.05) * rng.normal(size=shape)
    elif len(shape) >= 2 and name.endswith("weight"):
      value = rng.normal(size=shape) / np.sqrt(np.prod(shape[1:]))
    elif name.endswith("weight"):  # LayerNorm / GroupNorm scales.
      value = 1.0 + 0.2 * rng.normal(size=shape)
    else:
      value = 0.3 * rng.normal(size=shape)
    state[name] = value.astype(np.float32)
  return state
