"""A directory that transformers loads, offline, as `save_pretrained` writes
it:

    model = ViTForImageClassification.from_pretrained(DIR)  # with a head
    model = ViTModel.from_pretrained(DIR)  # without one (the pooler is the
        # pre-logits layer where the model has one)
    processor = AutoImageProcessor.from_pretrained(DIR)

`config.json` (model_type `vit`: sizes, `hidden_act`, `layer_norm_eps`,
`qkv_bias`, `id2label`), `model.safetensors` with `{"format": "pt"}`
metadata in the Hub's names (`vit.encoder.layer.N.attention.attention.query`,
which transformers 5 still writes and reads), and `preprocessor_config.json`
with the evaluation preprocessing.

transformers' ViT is the paper's: a class token whose output is classified,
learned position embeddings over it and the patches, nothing else. A model
of DINOv3's form (RoPE) without a head is written as its
`DINOv3ViTModel` (`hf_dinov3.py`). Other models are refused in one line
naming the format that holds them.
"""

import json

from vit_jax import paths
from vit_jax.errors import WeightsError
from vit_jax.weights import architecture
from vit_jax.weights import eval_preprocessing
from vit_jax.weights import exports
from vit_jax.weights import families
from vit_jax.weights import mixer_layout
from vit_jax.weights import writers
from vit_jax.weights.names import POSEMB
from vit_jax.weights.names import posemb_prefix
from vit_jax.weights.transformers import hf_dinov3
from vit_jax.weights.transformers import hf_names

_TIMM_DIR = "use --format=timm-dir (timm builds it) or --format=npz"


def write(directory: str, params: dict, model_config, image_size: int,
          pp: eval_preprocessing.EvalPreprocessing, class_names=None):
  """Writes the three files into `directory` (see the module doc)."""
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  mixer = mixer_layout.is_mixer(params)
  writer = exports.writer("hf", model_config, mixer)
  if writer == "hf-dinov3":  # DINOv3's backbone, DINOv3ViTModel.
    state, config = hf_dinov3.write_model(params, model_config, image_size)
    write_files(directory, config,
                st_numpy.save(state, metadata={"format": "pt"}), pp)
    return
  if mixer:
    raise WeightsError("transformers has no MLP-Mixer; use --format=timm-dir "
                       "(timm's MlpMixer) or --format=npz.")
  exports.refuse_unwritten(model_config, writer)
  _check(params)
  params = writers.with_posemb_table(params, image_size, model_config.posemb)
  params = writers.with_class_token_entry(params, posemb_prefix(params))
  head = params.get("head/kernel")
  pre_logits = params.get("pre_logits/kernel")
  classify = head is not None
  state = hf_names.to_hugging_face(params)
  if classify:  # ViTForImageClassification: the encoder under `vit.`.
    state = {
        (k if k.startswith("classifier.") else "vit." + k): v
        for k, v in state.items()
    }
  variant = architecture.variant_of(params, "the model")
  grid = round((params[POSEMB].shape[1] - 1)**0.5)
  model_class = "ViTForImageClassification" if classify else "ViTModel"
  config = {
      "architectures": [model_class],
      "model_type": "vit",
      "hidden_size": variant.hidden_size,
      "num_hidden_layers": variant.num_layers,
      "num_attention_heads": variant.num_heads,
      "intermediate_size": variant.mlp_dim,
      "hidden_act": _activation(model_config),
      "hidden_dropout_prob": 0.0,
      "attention_probs_dropout_prob": 0.0,
      "initializer_range": 0.02,
      "layer_norm_eps": model_config.layer_norm_eps,
      "image_size": grid * variant.patch_size,
      "patch_size": variant.patch_size,
      "num_channels": 3,
      # ViTConfig's own field: projections without biases load as such.
      "qkv_bias": families.block_options(params).get("qkv_bias", True),
      "encoder_stride": variant.patch_size,
      "dtype": "float32",
  }
  if pre_logits is not None:
    config.update(pooler_output_size=pre_logits.shape[-1], pooler_act="tanh")
  if classify:
    names = class_names or [f"LABEL_{i}" for i in range(head.shape[-1])]
    config["id2label"] = {str(i): name for i, name in enumerate(names)}
    config["label2id"] = {name: i for i, name in enumerate(names)}
  write_files(directory, config, st_numpy.save(state,
                                               metadata={"format": "pt"}), pp)


def write_files(directory, config: dict, weights_bytes: bytes,
                pp: eval_preprocessing.EvalPreprocessing):
  out = paths.resolve(directory)
  out.mkdir(parents=True, exist_ok=True)
  (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
  (out / "model.safetensors").write_bytes(weights_bytes)
  (out / "preprocessor_config.json"
  ).write_text(json.dumps(image_processor(pp), indent=2) + "\n")


def _activation(model_config) -> str:
  if model_config.quick_gelu:
    return "quick_gelu"
  return "gelu_pytorch_tanh" if model_config.gelu_approximate else "gelu"


def _check(params):
  """Refuses what transformers' ViT cannot compute of the fields it writes
  (`exports`: the classifier's class token, learned position embeddings or
  a table of fixed ones, the pooler), before writing."""
  if any(k.startswith("conv_root") for k in params):
    raise WeightsError("transformers' ViT has no ResNet stem for this "
                       "hybrid; use --format=npz.")
  if POSEMB + "_y" in params:
    raise WeightsError(
        "transformers' ViT has no factorized position embeddings (NaViT's, "
        "config.model.posemb=factorized): use --format=npz.")
  if "pre_logits/kernel" in params and "head/kernel" in params:
    raise WeightsError(
        "ViTForImageClassification classifies the class token without the "
        "pre-logits layer this model has; export it without a head (a "
        "ViTModel, whose pooler is that layer) or use --format=npz.")


def image_processor(pp: eval_preprocessing.EvalPreprocessing) -> dict:
  """preprocessor_config.json: ViTImageProcessor for a plain resize,
  DeiTImageProcessor for a resize and a crop, BitImageProcessor for a
  shorter-side resize and a crop. Bilinear (PIL's 2), [0, 1] scaled."""
  crop = {"height": pp.image_size, "width": pp.image_size}
  config = {
      "do_resize": True,
      "resample": 2,
      "do_rescale": True,
      "rescale_factor": 1 / 255,
      "do_normalize": True,
      "image_mean": list(pp.mean),
      "image_std": list(pp.std),
  }
  if pp.keep_aspect:
    return {
        **config, "image_processor_type": "BitImageProcessor",
        "size": {
            "shortest_edge": pp.resize_to
        },
        "do_center_crop": True,
        "crop_size": crop,
        "do_convert_rgb": True
    }
  if pp.resize_to != pp.image_size:
    return {
        **config, "image_processor_type": "DeiTImageProcessor",
        "size": {
            "height": pp.resize_to,
            "width": pp.resize_to
        },
        "do_center_crop": True,
        "crop_size": crop
    }
  return {**config, "image_processor_type": "ViTImageProcessor", "size": crop}
