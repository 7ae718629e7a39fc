"""Starting weights of an image-text model (`models/two_towers.py`).

A two-tower file (big_vision's SigLIP `.npz`: `img/`, `txt/`, `t`, `b`,
or an image-text run's workdir) loads whole: the image tower as any ViT
checkpoint (`loader.init_params` on `FILE:img`: big_vision's names, the
position table resized to the run's grid, the report), the text tower and
the scalars here. Any other checkpoint is an image tower: LiT's start, the
text tower, `t` and `b` at their random init.
"""

import flax
import jax

from vit_jax import console
from vit_jax import paths
from vit_jax.errors import WeightsError
from vit_jax.models import scan
from vit_jax.models.variants import VARIANTS
from vit_jax.models.variants import Variant
from vit_jax.weights import loader
from vit_jax.weights.big_vision import flax_names
from vit_jax.weights.files import directories
from vit_jax.weights.files import formats
from vit_jax.weights.transformers import hf_siglip

TEXT_ENCODER = "Encoder_0"  # The text tower's blocks (the image's:
# `Transformer`), renamed to reuse the image tower's block helpers.


def _towers(path: str, cache_dir=None) -> dict | None:
  """{name: array} of a two-tower file without its wrappers (a
  transformers SiglipModel's in our names); None for a file that is not
  one."""
  file, _ = formats.split_tower(path)
  fmt, tensors = formats.read(file, cache_dir)
  if fmt != "orbax" and hf_siglip.is_siglip(tensors):
    config = directories.config_json(paths.resolve(file))
    if config is None:
      raise WeightsError(f"{file} holds a SiglipModel's weights but no "
                         "config.json beside them (its heads are there).")
    return hf_siglip.two_towers(tensors, *hf_siglip.heads(config), file)
  tensors = flax_names.strip_prefixes(tensors)
  top = {name.split("/")[0] for name in tensors}
  return tensors if {"img", "txt"} <= top else None


def _renamed_encoder(tensors: dict, old: str, new: str) -> dict:
  """`tensors` with the names under `old/` under `new/`."""
  return {
      (new + k[len(old):] if k.startswith(old + "/") else k): v
      for k, v in tensors.items()
  }


def text_tower_names(tensors: dict, scanned_layers: int = 0) -> dict:
  """A text tower's entries (without `txt/`) in this project's names:
  big_vision's current-Flax block names as the released ones (as the image
  tower's), its scanned blocks looped, or stacked for a scanned target of
  `scanned_layers` layers."""
  as_image = scan.unstack_flat(
      _renamed_encoder(tensors, TEXT_ENCODER, scan.ENCODER))
  as_image = {flax_names.rename_block(k): v for k, v in as_image.items()}
  if scanned_layers:
    as_image = scan.stack_flat(as_image, scanned_layers)
  return _renamed_encoder(as_image, scan.ENCODER, TEXT_ENCODER)


def _text_and_scalars(tensors: dict, target_flat: dict, path: str) -> dict:
  """The file's `txt/...`, `t` and `b` for the target's names, checked."""
  scanned = [
      v.shape[0]
      for k, v in target_flat.items()
      if k.startswith(f"txt/{TEXT_ENCODER}/encoderblock/")
  ]
  text = text_tower_names(
      {
          k[len("txt/"):]: v for k, v in tensors.items() if k.startswith("txt/")
      }, scanned[0] if scanned else 0)
  source = {f"txt/{k}": v for k, v in text.items()}
  source.update({k: v for k, v in tensors.items() if k in ("t", "b")})
  wanted = {k: v for k, v in target_flat.items() if not k.startswith("img/")}
  missing = sorted(set(wanted) - set(source))
  unexpected = sorted(set(source) - set(wanted))
  resized = [
      f"{k} {tuple(source[k].shape)} (the model's {tuple(wanted[k].shape)})"
      for k in sorted(set(wanted) & set(source))
      if tuple(source[k].shape) != tuple(wanted[k].shape)
  ]
  if missing or unexpected or resized:
    said = [("the model has, the file not", missing),
            ("the file has, the model not", unexpected),
            ("of another shape", resized)]
    lines = "; ".join(f"{what}: {', '.join(names[:6])}"
                      f"{' ...' if len(names) > 6 else ''}"
                      for what, names in said
                      if names)
    raise WeightsError(
        f"{path}'s text tower does not match config.text's ({lines}). Set "
        "config.text.variant, vocab_size, length, pool and embedding_dim as "
        "the file has them (`vit-jax inspect` on it says), and "
        "the siglip objective where it has a bias b.")
  return {k: v.astype(wanted[k].dtype) for k, v in source.items()}


def init_two_towers(config, path: str, params, params_sharding):
  """`params` (the two towers': `img/`, `txt/`, `t`, `b`) from the
  checkpoint at `path`: both towers and the scalars where it is a two-tower
  file, else the image tower alone (config.model's ViT; config.init's
  policy: dont_load, the position embeddings' resize)."""
  file, _ = formats.split_tower(path)
  tensors = _towers(path, config.init.cache_dir)
  image_path = f"{file}:img" if tensors is not None else path
  image = loader.init_params(config, image_path, params["img"],
                             params_sharding["img"],
                             role="Image tower initialised")
  if tensors is None:
    return {**params, "img": image}
  target = flax.traverse_util.flatten_dict(params, sep="/")
  shardings = flax.traverse_util.flatten_dict(params_sharding, sep="/")
  loaded = _text_and_scalars(tensors, target, path)
  for name, value in loaded.items():
    target[name] = jax.make_array_from_callback(value.shape, shardings[name],
                                                lambda index, v=value: v[index])
  console.say("Text tower, t%s from %s (%d arrays).",
              " and b" if "b" in loaded else "", file, len(loaded))
  out = flax.traverse_util.unflatten_dict(target, sep="/")
  out["img"] = image
  return out


def looped_two_towers(params: dict) -> dict:
  """A two-tower model's flat params with either tower's scanned blocks
  (`scan_layers`) as looped ones."""
  out = {k: v for k, v in params.items() if k in ("t", "b")}
  image = {k[4:]: v for k, v in params.items() if k.startswith("img/")}
  out.update({f"img/{k}": v for k, v in scan.unstack_flat(image).items()})
  text = {k[4:]: v for k, v in params.items() if k.startswith("txt/")}
  text = scan.unstack_flat(_renamed_encoder(text, TEXT_ENCODER, scan.ENCODER))
  out.update({
      f"txt/{k}": v
      for k, v in _renamed_encoder(text, scan.ENCODER, TEXT_ENCODER).items()
  })
  return out


def is_two_towers_file(path: str, cache_dir=None) -> bool:
  """Whether `path` holds both towers (a two-tower file or workdir)."""
  try:
    return _towers(path, cache_dir) is not None
  except (OSError, WeightsError):
    return False


GEMMA_VOCABULARY = 256_000  # SigLIP 2's tokenizer's pieces.


def text_fields(path: str, cache_dir=None) -> dict:
  """The config.text fields a two-tower file's text tower shows (its
  sizes as a variant's name, vocabulary, length, pooling, projection),
  and `objective`: siglip where it has a bias b, else clip."""
  tensors = _towers(path, cache_dir)
  if tensors is None:
    raise WeightsError(f"{path} is not a two-tower file (no img/ and txt/).")
  text = text_tower_names({
      k[len("txt/"):]: v for k, v in tensors.items() if k.startswith("txt/")
  })
  vocab, width = text["Embed_0/embedding"].shape
  block = f"{TEXT_ENCODER}/encoderblock_{{}}/"
  depth = 0
  while any(k.startswith(block.format(depth)) for k in text):
    depth += 1
  first = block.format(0)
  mlp_dim = text[first + "MlpBlock_3/Dense_0/kernel"].shape[-1]
  heads = text[first + "MultiHeadDotProductAttention_1/query/kernel"].shape[1]
  sizes = (width, mlp_dim, heads, depth)
  names = [
      name for name, v in VARIANTS.items()
      if isinstance(v, Variant) and (v.hidden_size, v.mlp_dim, v.num_heads,
                                     v.num_layers) == sizes
  ]
  if not names:
    raise WeightsError(
        f"{path}'s text tower ({width} wide, {depth} blocks, MLP "
        f"{mlp_dim}, {heads} heads) has the sizes of no variant "
        "of vit_jax/models/variants.py; add one with them.")
  return dict(
      objective="siglip" if "b" in tensors else "clip",
      variant=names[0],
      # SigLIP 2's texts were lower-cased (its paper, 3.1): its towers read
      # Gemma's 256,000 pieces, which no SigLIP 1 tower does.
      lowercase=int(vocab) == GEMMA_VOCABULARY,
      vocab_size=int(vocab),
      length=int(text["pos_embedding"].shape[1]),
      pool="map" if any(k.startswith("MAPHead_0/") for k in text) else "last",
      embedding_dim=int(text["head/kernel"].shape[-1] if "head/kernel" in
                        text else width))


def as_big_vision_file(params: dict, naflex: bool = False) -> dict:
  """A two-tower model's flat params (ours) as big_vision's two-tower
  file has them (`params/img/...`, `params/txt/...`, `params/t`,
  `params/b`): what its SigLIP code and this project load alike."""
  image = {k[4:]: v for k, v in params.items() if k.startswith("img/")}
  out = {
      f"img/{k}": v
      for k, v in flax_names.to_big_vision(image, naflex=naflex).items()
  }
  text = {k[4:]: v for k, v in params.items() if k.startswith("txt/")}
  as_image = scan.unstack_flat(
      _renamed_encoder(text, TEXT_ENCODER, scan.ENCODER))
  as_image = {flax_names.current_flax_block(k): v for k, v in as_image.items()}
  out.update({
      f"txt/{k}": v for k, v in _renamed_encoder(as_image, scan.ENCODER,
                                                 TEXT_ENCODER).items()
  })
  out.update({k: v for k, v in params.items() if k in ("t", "b")})
  return {f"params/{k}": v for k, v in out.items()}
