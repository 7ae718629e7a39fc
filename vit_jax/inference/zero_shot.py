"""An image-text checkpoint ready to embed images and texts, and to
classify images zero-shot by class names: for `vit-jax zeroshot` and
`predict --class_names`.

    loaded = zero_shot.load("workdirs/siglip")          # a run's workdir
    loaded = zero_shot.load("webli_en_b16_224.npz", tokenizer="c4_en.model")
    probabilities = zero_shot.classify(loaded, images, ["cat", "dog"])

The config is the workdir's config.json, else read from a two-tower
file's shapes: the image tower as any ViT file (`weights.config_for` on
`FILE:img`), the text tower's sizes, vocabulary, length and pooling
(`weights.text_fields`), SigLIP where the file has a bias. A file ships no
tokenizer: name the one its text tower was trained with. One process: the
parameters replicated on its devices.
"""

import dataclasses
from typing import Any
from typing import Optional
from typing import Sequence

import flax
import jax
from jax.sharding import Mesh
import ml_collections
import numpy as np

from vit_jax import hardware
from vit_jax import models
from vit_jax import objectives
from vit_jax import paths
from vit_jax import sharding
from vit_jax import weights
from vit_jax.config import defaults
from vit_jax.config import imports
from vit_jax.errors import UserError


@dataclasses.dataclass
class LoadedTwoTowers:
  checkpoint: str
  config: ml_collections.ConfigDict
  model: Any  # models.TwoTowers.
  params: Any
  mesh: Mesh
  params_sharding: Any
  trained_here: bool  # Its config is the training workdir's.

  def batch_size(self, requested: int) -> int:
    """`requested` rounded up to split evenly over the local devices."""
    devices = self.mesh.devices.size
    return -(-requested // devices) * devices

  def __post_init__(self):
    model = self.model
    # (params, images or None, tokens or None) -> (zimg, ztxt, outputs).
    self.apply = jax.jit(
        lambda p, images, texts: model.apply({"params": p}, images, texts),
        compiler_options=hardware.compiler_options() or None)
    # The temperature t and bias b (None: none) as the model scores pairs.
    _, _, out = self.apply(self.params, None, None)
    self.t = float(out["t"])
    self.b = float(out["b"]) if "b" in out else None


def config_for(checkpoint: str, tokenizer: Optional[str] = None,
               image_size: Optional[int] = None, need_tokenizer: bool = True):
  """(decided config, whether it is the workdir's) of a two-tower
  checkpoint; `tokenizer` replaces the config's (a file's needs one where
  texts are to be read: `need_tokenizer`)."""
  from vit_jax.data import tokenizer as tokenizers  # pylint: disable=g-import-not-at-top
  check_exists(checkpoint)
  recorded = weights.recorded_config(checkpoint)
  if recorded is not None:
    config = _run_config(recorded)
    if not _has_text_tower(config):
      raise UserError(
          f"{checkpoint} is a run of the {objectives.of(config).name!r} "
          "objective, not an image-text model (siglip, clip): `vit-jax "
          "predict` classifies with its head.")
  else:
    if not weights.is_two_towers_file(checkpoint):
      raise UserError(
          f"{checkpoint} holds no text tower (a two-tower file has img/ and "
          "txt/: big_vision's SigLIP .npz, an image-text run's workdir).")
    config, _, arch = weights.config_for(f"{checkpoint}:img")
    fields = weights.text_fields(checkpoint)
    config.update(objective=fields.pop("objective"))
    config.text.update(fields)
    config.text.image_head = arch.num_classes is not None
    if tokenizer is None and need_tokenizer:
      raise UserError(
          f"{checkpoint} ships no tokenizer: give the one its text tower "
          f"reads ({fields['vocab_size']} pieces), e.g. --tokenizer="
          "PATH/sentencepiece.model (SigLIP's: its c4_en or multilingual "
          "model) or a tokenizer.json.")
  if tokenizer is None and recorded is not None:
    # The file the run kept: the pieces it was trained with.
    tokenizer = tokenizers.kept(weights.training_workdir(checkpoint))
  if tokenizer:
    config.text.tokenizer = tokenizer
  elif recorded is None:  # Texts are not read: the vocabulary is the file's.
    config.text.tokenizer = tokenizers.NO_TEXTS
  if image_size:
    config.image_size = image_size
  config.init.checkpoint = checkpoint
  config.init.dont_load = ()
  return objectives.decide(config), recorded is not None


def check_exists(checkpoint: str):
  """A local checkpoint is there (URLs and released names are fetched,
  and checked, where they load)."""
  file, _ = weights.split_tower(checkpoint)
  if (paths.is_remote(file) or weights.lookup_released(file) is not None or
      paths.resolve(file).exists()):
    return
  raise UserError(f"No weights at {checkpoint}: the path does not exist. "
                  "Give an image-text run's workdir, a two-tower file "
                  "(big_vision's SigLIP .npz) or a transformers SiglipModel "
                  "directory.")


def _run_config(recorded: dict):
  """A run's recorded config over the defaults, its modules loaded."""
  config = defaults.get_config()
  weights.merge_recorded(config, recorded)
  imports.load(config)  # A user's objective is registered by then.
  return config


def _has_text_tower(config) -> bool:
  """Whether the run's objective trains a text tower (reads texts)."""
  return objectives.of(config).carries(config).text


def load(checkpoint: str, tokenizer: Optional[str] = None,
         image_size: Optional[int] = None,
         need_tokenizer: bool = True) -> LoadedTwoTowers:
  """Both towers of `checkpoint`, replicated on this process's devices."""
  config, trained_here = config_for(checkpoint, tokenizer, image_size,
                                    need_tokenizer)
  objective = objectives.of(config)
  model = objective.model(config, None)
  mesh = sharding.make_mesh(devices=jax.local_devices())
  params, params_sharding = sharding.abstract_params(model, config.image_size,
                                                     mesh)
  params = objective.init(config, checkpoint, params, params_sharding)
  return LoadedTwoTowers(checkpoint, config, model, params, mesh,
                         params_sharding, trained_here)


def is_two_towers(checkpoint: str) -> bool:
  """Whether `checkpoint` is an image-text model (a run's workdir, a
  two-tower file or a transformers SiglipModel directory)."""
  recorded = weights.recorded_config(checkpoint)
  if recorded is not None:
    return _has_text_tower(_run_config(recorded))
  return weights.is_two_towers_file(checkpoint)


def flat_params(loaded: LoadedTwoTowers) -> dict:
  """{'/'-joined name: float32 numpy array}, scanned blocks looped."""
  flat = flax.traverse_util.flatten_dict(jax.device_get(loaded.params), sep="/")
  return {
      k: np.asarray(v, np.float32)
      for k, v in weights.looped_two_towers(flat).items()
  }


def predict(loaded: LoadedTwoTowers, batches, files, class_names, templates,
            top_k: int):
  """[(file, class indices, probabilities)] of the `top_k` of
  `class_names` (each put in `templates`, their embeddings averaged) for
  every image of `batches` (`data.image_files.ImageFiles`), best first."""
  from vit_jax.data import tokenizer as tokenizers  # pylint: disable=g-import-not-at-top
  from vit_jax.evaluators import image_text  # pylint: disable=g-import-not-at-top
  tokenizer = tokenizers.for_text(loaded.config.text)
  image_text.check_templates(templates, "--templates")
  embed = lambda t: np.asarray(loaded.apply(loaded.params, None, t)[1])
  classes_KxE = image_text.class_embeddings(
      lambda tokens: image_text.in_chunks(embed, tokens), tokenizer,
      loaded.config.text.length, class_names, templates)
  k = min(top_k, len(class_names))
  rows = []
  for batch in batches:
    zimg = embed_images(loaded, batch["image"])
    probs = scores(loaded, zimg, classes_KxE)
    top = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    for i in range(len(batch["mask"])):
      if batch["mask"][i]:
        rows.append((files[batch["index"][i]], top[i], probs[i, top[i]]))
  return rows


def stride(loaded: LoadedTwoTowers) -> int:
  """Pixels per image token along each side."""
  return models.stride(loaded.config.model)


def embed_images(loaded: LoadedTwoTowers, images_BxHxWx3) -> np.ndarray:
  """Normalised image embeddings (images already preprocessed)."""
  zimg, _, _ = loaded.apply(loaded.params, images_BxHxWx3, None)
  return np.asarray(zimg)


def embed_texts(loaded: LoadedTwoTowers, texts: Sequence[str]) -> np.ndarray:
  """Normalised text embeddings, tokenised by the config's tokenizer."""
  from vit_jax.data import tokenizer as tokenizers  # pylint: disable=g-import-not-at-top
  tokens = tokenizers.for_text(loaded.config.text).encode(
      list(texts), loaded.config.text.length)
  _, ztxt, _ = loaded.apply(loaded.params, None, tokens)
  return np.asarray(ztxt)


def scores(loaded: LoadedTwoTowers, zimg_BxE, ztxt_KxE) -> np.ndarray:
  """Each image's probability of matching each text, with the model's own
  t and b: SigLIP's sigmoid(t z.z' + b) (independent per text), CLIP's
  softmax over texts."""
  logits = loaded.t * np.asarray(zimg_BxE) @ np.asarray(ztxt_KxE).T
  if loaded.b is not None:
    return 1 / (1 + np.exp(-(logits + loaded.b)))
  logits = logits - logits.max(-1, keepdims=True)
  return np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)


def lines_or_list(value):
  """A file's non-empty lines, else the comma-separated items."""
  if value is None:
    return ()
  path = paths.resolve(value)
  if "," not in value and path.is_file():
    return tuple(
        line.strip() for line in path.read_text().splitlines() if line.strip())
  return tuple(item.strip() for item in value.split(",") if item.strip())


def templates_of(value):
  from vit_jax.evaluators import image_text  # pylint: disable=g-import-not-at-top
  if value == "clip":
    return image_text.clip_templates_of("clip")
  templates = lines_or_list(value) if value else ()
  if value and not templates:
    raise UserError(f"--templates={value} gives no template.")
  return templates


def evaluate(loaded: LoadedTwoTowers, dataset=None, split=None, data_dir=None,
             class_names=(), templates=(),
             batch_size: int = 128) -> dict[str, float]:
  """Zero-shot accuracy (and recall where the data has captions) of
  `loaded` on `dataset`'s `split`, as training's evaluators compute them."""
  config = loaded.config.copy_and_resolve_references()
  config.dataset = dataset or config.dataset
  config.eval_split = split or config.eval_split
  config.data_dir = data_dir or config.data_dir
  config.eval_batch_size = loaded.batch_size(batch_size)
  if not config.pp_eval:
    config.pp_eval = "resize|value_range"
  # pylint: disable=g-import-not-at-top  (TensorFlow: only where data is read)
  from vit_jax import console
  from vit_jax.data import sources
  from vit_jax.data import specs
  from vit_jax.evaluators import image_text
  from vit_jax.evaluators import registry
  # pylint: enable=g-import-not-at-top
  data = specs.evaluation(config)
  source = sources.make_source(data)
  context = registry.Context(config, loaded.model, loaded.mesh,
                             loaded.params_sharding, data, source)
  fields = {
      "class_names": tuple(class_names),
      "templates": tuple(templates)
                   or tuple(config.evals.zeroshot.get("templates", ()))
  }
  metrics = {}
  if source.num_classes:  # Zero-shot classifies into the data's classes.
    evaluator = image_text.make_zeroshot(
        registry.Entry("zeroshot", data, fields), context)
    found = evaluator.run(loaded.params)
    console.say("zeroshot: %s", evaluator.summary(found))
    metrics.update({f"zeroshot/{k}": v for k, v in found.items()})
  if sources.has_text(source, config.text.key):
    evaluator = image_text.make_retrieval(registry.Entry("retrieval", data, {}),
                                          context)
    found = evaluator.run(loaded.params)
    console.say("retrieval: %s", evaluator.summary(found))
    metrics.update({f"retrieval/{k}": v for k, v in found.items()})
  if not metrics:
    raise UserError(f"{config.dataset} has neither labels (zero-shot) nor "
                    f"a text feature {config.text.key!r} (retrieval); give "
                    "--dataset a labelled or captioned one.")
  return metrics
