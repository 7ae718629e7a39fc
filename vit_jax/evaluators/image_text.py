"""Evaluators of an image-text model (the two towers of siglip and clip):

  zeroshot   classification without training a head: each class name put
             into prompt templates, the texts' embeddings averaged per
             class; an image's class is the one its embedding is most
             similar to (CLIP's protocol, big_vision's `discriminative`)
  retrieval  image-to-text and text-to-image recall at 1, 5 and 10 over a
             split's images and all their captions (big_vision's
             `retrieval`); identical captions are one text, which
             belongs to every image that has it
"""

import dataclasses
import re
from typing import Callable
from typing import Iterable
from typing import Sequence

import jax
import numpy as np

from vit_jax import objectives
from vit_jax import sharding
from vit_jax.data import input_pipeline
from vit_jax.data import sources
from vit_jax.data import specs
from vit_jax.data import tokenizer as tokenizers
from vit_jax.errors import UserError
from vit_jax.evaluators import clip_templates
from vit_jax.evaluators import registry

RECALL_AT = (1, 5, 10)
_WORDNET_ID = re.compile(r"n\d{8}")  # imagenet2012's label "names".
TEXT_CHUNK = 256  # Class texts embedded per call (padded to it).
# Image-text pairs retrieval ranks on the host: 4 GB of similarities.
MAX_PAIRS = 1 << 30
# CLIP's short ensemble, for names that read as objects; a config may give
# its own (configs/image_text.py: the digits' phrasings).
DEFAULT_TEMPLATES = ("a photo of a {}.", "a picture of a {}.", "{}")


def clip_templates_of(name) -> tuple:
  """`clip`: CLIP's 80 ImageNet templates; anything else as it is."""
  if name == "clip" or tuple(name) == ("clip",):
    return clip_templates.IMAGENET_TEMPLATES
  return tuple(name)


def _skip(config, fields) -> str | None:
  del fields
  return objectives.evaluated_by(config, "zeroshot")


class _Embedder:
  """Jitted embeddings of images (sharded over the batch) and of texts
  (replicated), both as `model` (the two towers) computes them."""

  def __init__(self, model, mesh, params_sharding, rules):
    self.mesh = mesh

    def images(params, batch):  # The batch's other fields come back too:
      # every process then holds the whole global batch's.
      zimg, _, _ = model.apply({"params": params}, batch["image"], None)
      return {**{k: v for k, v in batch.items() if k != "image"}, "z": zimg}

    def texts(params, tokens_NxL):
      _, ztxt, _ = model.apply({"params": params}, None, tokens_NxL)
      return ztxt

    batch, replicated = sharding.batch_sharding(mesh), sharding.replicated(mesh)
    self.images = sharding.jit_on_mesh(images, mesh, rules,
                                       in_shardings=(params_sharding, batch),
                                       out_shardings=replicated)
    self.texts = sharding.jit_on_mesh(
        texts, mesh, rules, in_shardings=(params_sharding, replicated),
        out_shardings=replicated)

  def embed_images(self, params, local_batch) -> dict[str, np.ndarray]:
    """The global batch's image embeddings `z` and other fields."""
    batch = sharding.to_global_batch(local_batch, self.mesh)
    return jax.tree.map(np.asarray, self.images(params, batch))

  def embed_texts(self, params, tokens_NxL: np.ndarray) -> np.ndarray:
    """N texts' embeddings, in chunks of one shape (one compilation)."""
    return in_chunks(lambda t: np.asarray(self.texts(params, t)), tokens_NxL)


def in_chunks(embed, tokens_NxL: np.ndarray) -> np.ndarray:
  """`embed(tokens)` of N texts in chunks of TEXT_CHUNK (the last padded):
  one shape, one compilation, bounded memory."""
  out = []
  for start in range(0, len(tokens_NxL), TEXT_CHUNK):
    chunk = tokens_NxL[start:start + TEXT_CHUNK]
    padded = np.zeros((TEXT_CHUNK,) + chunk.shape[1:], chunk.dtype)
    padded[:len(chunk)] = chunk
    out.append(embed(padded)[:len(chunk)])
  return np.concatenate(out)


def check_templates(templates, where: str):
  """Each template holds exactly one {} (where the name goes)."""
  bad = [
      t for t in templates if t.count("{}") != 1 or
      "{" in t.replace("{}", "") or "}" in t.replace("{}", "")
  ]
  if bad:
    raise UserError(f"{where}: {bad[0]!r} must hold exactly one {{}} (where "
                    "the class name goes) and no other braces.")


def class_embeddings(embed_texts: Callable, tokenizer, length: int,
                     class_names: Sequence[str],
                     templates: Sequence[str]) -> np.ndarray:
  """K x E: per class, the normalised mean of its templates' normalised
  embeddings (CLIP's prompt ensemble)."""
  prompts = [t.format(name) for name in class_names for t in templates]
  z = embed_texts(tokenizer.encode(prompts, length))
  z = z.reshape(len(class_names), len(templates), -1).mean(1)
  return z / np.maximum(np.linalg.norm(z, axis=-1, keepdims=True), 1e-8)


class ZeroShotEvaluator:
  """Top-1 accuracy of the nearest class embedding over one exact pass."""

  def __init__(self, embedder: _Embedder, batches: Callable[[], Iterable],
               class_texts: Callable):
    self._embedder, self._batches = embedder, batches
    self._class_texts = class_texts  # params -> K x E.

  def run(self, params) -> dict[str, float]:
    classes_KxE = self._class_texts(params)
    correct = count = 0.0
    for local in self._batches():
      batch = self._embedder.embed_images(params, local)
      top1 = np.argmax(batch["z"] @ classes_KxE.T, -1)
      hit = batch["labels"][np.arange(len(top1)), top1]
      correct += float(np.sum(hit * batch["mask"]))
      count += float(np.sum(batch["mask"]))
    return {"accuracy": correct / max(count, 1.0), "num_examples": count}

  def summary(self, metrics) -> str:
    return (f"zero-shot accuracy {metrics['accuracy']:.4f} on "
            f"{metrics['num_examples']:.0f} examples")


@registry.register(
    "zeroshot",
    fields={
        # The classes' names in label order; (): the dataset's own.
        "class_names": (),
        # Prompt templates, each with one {} for the name; "clip": CLIP's 80
        # for ImageNet; (): CLIP's short ensemble (DEFAULT_TEMPLATES).
        "templates": (),
    },
    skip=_skip)
def make_zeroshot(entry: registry.Entry, context: registry.Context):
  """Zero-shot accuracy of the two towers on the entry's labelled data."""
  config = context.config
  source = context.source(entry.data)
  if not source.num_classes:
    raise UserError(
        f"config.evals.{entry.name} reads {entry.data.dataset}, which has no "
        "labels: zero-shot classifies into a dataset's classes. Point "
        f"config.evals.{entry.name}.data.dataset (and .split) at a labelled "
        f"set, or set config.evals.{entry.name}.enabled=False.")
  names = list(entry.fields["class_names"] or sources.label_names(entry.data) or
               [])
  if names and all(_WORDNET_ID.fullmatch(n) for n in names):
    names = sources.imagenet_names()  # ImageNet's: readable names.
  if len(names) != source.num_classes:
    raise UserError(
        f"config.evals.{entry.name}: {entry.data.dataset} has "
        f"{source.num_classes} classes but {len(names)} class names were "
        f"found; set config.evals.{entry.name}.class_names to its "
        f"{source.num_classes} names in label order.")
  templates = clip_templates_of(entry.fields["templates"] or DEFAULT_TEMPLATES)
  check_templates(templates, f"config.evals.{entry.name}.templates")
  embedder = _Embedder(context.model, context.mesh, context.params_sharding,
                       config.sharding.logical_axis_rules)
  tokenizer = tokenizers.for_text(config.text)

  def class_texts(params):
    return class_embeddings(lambda t: embedder.embed_texts(params, t),
                            tokenizer, config.text.length, names, templates)

  return ZeroShotEvaluator(
      embedder,
      input_pipeline.make_eval_batches(
          entry.data, source, collector=context.unreadable), class_texts)


def recalls(zimg_NxE, ztxt_MxE, pairs_NxM, ks=RECALL_AT) -> dict[str, float]:
  """Recall at k both ways: an image's query is right when one of its top
  k texts is its own (`pairs_NxM`), a text's when one of its top k images
  has it. Texts no image has, and images without a text, are left out of
  the queries (each still a candidate for the other way's)."""
  sim_NxM = zimg_NxE @ ztxt_MxE.T

  def first_hit(scores, truth):  # Rank of the first true item, per row.
    order = np.argsort(-scores, axis=1, kind="stable")
    return np.argmax(np.take_along_axis(truth, order, 1), axis=1)

  captioned = pairs_NxM.any(1)
  i2t = first_hit(sim_NxM[captioned], pairs_NxM[captioned])
  used = pairs_NxM.any(0)
  t2i = first_hit(sim_NxM.T[used], pairs_NxM.T[used])
  out = {}
  for k in ks:
    out[f"img2txt/recall@{k}"] = float(np.mean(i2t < k))
    out[f"txt2img/recall@{k}"] = float(np.mean(t2i < k))
  return out


class RetrievalEvaluator:
  """Embeds a split's images and all their captions, then ranks."""

  def __init__(self, embedder: _Embedder, batches: Callable[[], Iterable]):
    self._embedder, self._batches = embedder, batches

  def run(self, params) -> dict[str, float]:
    images, tokens, owners = [], [], []
    for local in self._batches():
      batch = self._embedder.embed_images(params, local)
      for i in np.flatnonzero(batch["mask"] > 0):
        real = batch["texts_mask"][i] > 0
        owners += [len(images)] * int(np.sum(real))
        tokens.append(batch["texts"][i][real])
        images.append(batch["z"][i])
    # Identical captions are one text (their ranks would tie).
    unique, which = np.unique(np.concatenate(tokens), axis=0,
                              return_inverse=True)
    if len(images) * len(unique) > MAX_PAIRS:
      raise UserError(
          f"Retrieval over {len(images):,} images and {len(unique):,} texts "
          f"scores {len(images) * len(unique):,} pairs on every host (over "
          f"{MAX_PAIRS:,}): evaluate a smaller split (its data.split, e.g. "
          "train[99.9%:]).")
    pairs = np.zeros((len(images), len(unique)), bool)
    pairs[np.asarray(owners), which.reshape(-1)] = True
    ztxt = self._embedder.embed_texts(params, unique)
    return {
        **recalls(np.stack(images), ztxt, pairs), "num_images": len(images),
        "num_texts": len(unique)
    }

  def summary(self, metrics) -> str:
    at = lambda way: "/".join(f"{metrics[f'{way}/recall@{k}']:.3f}"
                              for k in RECALL_AT)
    return (
        f"recall@{'/'.join(map(str, RECALL_AT))} image->text {at('img2txt')}"
        f", text->image {at('txt2img')} ({metrics['num_images']} images, "
        f"{metrics['num_texts']} distinct texts)")


@registry.register("retrieval", skip=_skip)
def make_retrieval(entry: registry.Entry, context: registry.Context):
  """Recall at 1, 5, 10 both ways on the entry's data and its captions."""
  config = context.config
  data = dataclasses.replace(entry.data, text=specs.text_spec(
      config, all_captions=True))
  source = context.source(data)
  embedder = _Embedder(context.model, context.mesh, context.params_sharding,
                       config.sharding.logical_axis_rules)
  return RetrievalEvaluator(
      embedder,
      input_pipeline.make_eval_batches(data, source, labels=False,
                                       collector=context.unreadable))
