"""What loading did to every parameter (`Report`), and the sentences that
say why a file does not fit a model: another size, other options (position
embeddings, class token, MAP head), a Mixer at another resolution, another
GELU, an untrained head.
"""

import dataclasses
import re
from typing import Optional

from absl import logging
import numpy as np

from vit_jax.weights import origins
from vit_jax.weights.names import PATCH_KERNEL
from vit_jax.weights.names import POSEMB

GELU_NAMES = {True: "tanh approximation", False: "exact erf"}


@dataclasses.dataclass
class Report:
  """What happened to every parameter; `table()` prints it."""
  path: str
  origin: str  # The code base that wrote the file (origins.detect).
  matched: list = dataclasses.field(default_factory=list)
  # (name, old shape, new shape, how).
  resized: list = dataclasses.field(default_factory=list)
  reinitialised: list = dataclasses.field(default_factory=list)  # (name, why)
  dropped: list = dataclasses.field(default_factory=list)  # (name, why)
  missing: list = dataclasses.field(default_factory=list)
  unexpected: list = dataclasses.field(default_factory=list)
  mismatched: list = dataclasses.field(default_factory=list)  # (name, f, t)
  warnings: list = dataclasses.field(default_factory=list)
  # Choices the file cannot make for the model, said on the console once.
  advice: list = dataclasses.field(default_factory=list)
  notes: list = dataclasses.field(default_factory=list)  # What was read.
  gelu: str = ""  # The GELU of the file's origin and of the model.

  @property
  def ok(self) -> bool:
    return not (self.missing or self.unexpected or self.mismatched)

  def summary(self) -> str:
    """One line: what loaded, and what did not."""
    parts = [f"{len(self.matched)} parameters loaded"]
    for what, items in (("resized", self.resized),
                        ("re-initialised", self.reinitialised), ("dropped",
                                                                 self.dropped)):
      if items:
        parts.append(f"{len(items)} {what} "
                     f"({', '.join(str(i[0]) for i in items[:3])}"
                     f"{', ...' if len(items) > 3 else ''})")
    return f"{self.path}: {'; '.join(parts)}"

  def table(self, limit: int = 12) -> str:
    rows = [
        f"{self.path} (written by {origins.words(self.origin)}): "
        f"{len(self.matched)} matching"
    ]
    rows += [f"  {note}" for note in self.notes]
    if self.gelu:
      rows.append(f"  GELU: {self.gelu}")
    resized = [f"{n}: {o} -> {t} ({how})" for n, o, t, how in self.resized]
    reinitialised = [f"{n} ({why})" for n, why in self.reinitialised]
    dropped = [f"{n} ({why})" for n, why in self.dropped]
    mismatched = [f"{n}: {f} vs {t}" for n, f, t in self.mismatched]
    sections = (
        ("resized", resized),
        ("re-initialised", reinitialised),
        ("dropped from the file", dropped),
        ("MISSING from the file", self.missing),
        ("UNEXPECTED in the file", self.unexpected),
        ("SHAPE MISMATCH (file vs config)", mismatched),
        ("warnings", self.warnings),
    )
    for title, items in sections:
      if items:
        rows.append(f"  {title} ({len(items)}):")
        rows += [f"    {item}" for item in items[:limit]]
        if len(items) > limit:
          rows.append(f"    ... and {len(items) - limit} more")
    return "\n".join(rows)


def compare_gelu(file: Optional[bool], model: Optional[bool], report):
  """`file`, `model`: the GELU form (True: tanh) each computes."""
  if model is None:
    return
  if file is None:
    report.gelu = f"model {GELU_NAMES[model]}; the file's origin is unknown"
    return
  report.gelu = (f"model {GELU_NAMES[model]}, file's origin "
                 f"({report.origin}) {GELU_NAMES[file]}")
  if file != model:
    message = (
        f"The weights' origin ({report.origin}) computes GELU with the "
        f"{GELU_NAMES[file]} but the model uses the {GELU_NAMES[model]}: "
        "logits differ slightly (about 1e-4 to 1e-3). Unset "
        "config.model.gelu_approximate to follow the file, or set it to "
        f"{file}.")
    report.warnings.append(message)
    logging.warning(message)


def advise_activation(path: str, file_params, stated: dict,
                      quick_gelu: Optional[bool], report):
  """A file with CLIP's names (a pre-norm image encoder) cannot say its
  activation: OpenAI's weights compute QuickGELU, OpenCLIP's GELU. Where
  nothing beside it says (a timm or transformers directory's config.json
  does) and the model computes GELU, the report says how to choose. A
  family that states its form (PE's RoPE) is not CLIP."""
  if (quick_gelu is not False or
      "Transformer/pre_norm/scale" not in file_params or
      {"quick_gelu", "gelu_approximate", "rope"} & set(stated)):
    return
  message = (
      f"{path} has CLIP's names (a LayerNorm before the blocks), and the "
      "file cannot say its activation: OpenAI's CLIP weights compute "
      "QuickGELU, OpenCLIP's GELU (what this model computes); for OpenAI's, "
      "set --config.model.quick_gelu=True.")
  report.warnings.append(message)
  report.advice.append(message)


def warn_zero_head(loaded, report):
  kernel = loaded.get("head/kernel")
  if kernel is not None and not np.any(kernel):
    message = ("The head loaded from the file is all zeros (a checkpoint "
               "saved before its head was trained?): every prediction is "
               "the same until the head is trained.")
    report.warnings.append(message)
    logging.warning(message)


# (what the file has, what the model has, the config that matches the file)
# for the parts a config's options add or remove.
_OPTION_HINTS = (
    (POSEMB, "learned position embeddings", "fixed ones",
     "config.model.posemb=learn"),
    ("cls", "a class token", "none",
     "config.model.class_token=True (or classifier=token)"),
    ("MAPHead_0/probe", "a MAP head", "none", "config.model.classifier=map"),
)
_OPTION_HINTS_REVERSED = (
    (POSEMB, "no position embeddings (fixed sincos2d ones)", "learned ones",
     "config.model.posemb=sincos2d"),
    ("cls", "no class token", "one",
     "config.model.classifier=gap or map (or class_token=False)"),
    ("MAPHead_0/probe", "no MAP head", "one",
     "config.model.classifier=token or gap"),
)


def hint(file_params, target_flat) -> str:
  """Says when the file is a different model size (e.g. B/16 into L/16),
  or a model with other options (position embeddings, class token, MAP)."""

  def describe(flat):
    kernel = flat.get(PATCH_KERNEL)
    layers = len({
        m.group(1)
        for k in flat
        if (m := re.match(r"Transformer/encoderblock_(\d+)/", k))
    })
    if kernel is None:
      return None
    return f"width {kernel.shape[-1]}, {layers} layers"

  token_mixing = "MixerBlock_0/token_mixing/Dense_0/kernel"
  if token_mixing in file_params and token_mixing in target_flat and (
      file_params[token_mixing].shape != target_flat[token_mixing].shape):
    return (f"An MLP-Mixer's token-mixing weights are sized by its number "
            f"of patches: {file_params[token_mixing].shape[0]} in the file, "
            f"{target_flat[token_mixing].shape[0]} at the config's "
            "resolution. Fine-tune it at the file's resolution, or at K "
            "times it with config.model.mixer_tiles=K (the Mixer paper's "
            "Supplementary C).\n")
  theirs, ours = describe(file_params), describe(target_flat)
  if theirs and ours and theirs != ours:
    return (f"The file is a different model ({theirs}) from the config's "
            f"({ours}).\n")
  hints = [
      f"The file has {has}, the model {other}: set {fix}.\n"
      for name, has, other, fix in _OPTION_HINTS
      if name in file_params and name not in target_flat
  ] + [
      f"The file has {has}, the model {other}: set {fix}.\n"
      for name, has, other, fix in _OPTION_HINTS_REVERSED
      if name not in file_params and name in target_flat
  ]
  return "".join(hints)
