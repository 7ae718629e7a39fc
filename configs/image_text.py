r"""Image-text pre-training (SigLIP, CLIP, LiT) on the built-in digits.

    vit-jax train --config=configs/image_text.py --workdir=workdirs/siglip

Recipes (the first word of the argument):

  digits      SigLIP from scratch (the default): both towers the `digits`
              variant (4 layers, 64 wide; the image tower MAP-pooled with
              sin-cos positions, as SigLIP's), on `digits_captions` (each
              image with five captions written from its label, one drawn
              per step) and the SentencePiece model trained from them;
              evaluated by zero-shot accuracy on the test split (the
              captions' phrasings as prompts) and image<->text recall
  clip        the same with CLIP's softmax loss both ways
  lit_digits  LiT: the image tower is `configs/digits.py`'s ViT, loaded
              from `init=WORKDIR` (that config's run: `make demo` writes
              workdirs/demo/pretrain) and locked (config.frozen: no
              gradient, no optimizer state); only the text tower learns,
              projecting to the image tower's 64-wide features

Full size (not run here: a pod's days; what each needs is stated):

  siglip_b16  SigLIP B/16 at 224 px from scratch, in the form of the
              released webli_en_b16_224 (ViT-B/16 MAP-pooled with a learned
              table and no projection; a B-sized text tower reading 64
              tokens of a 32,000-piece SentencePiece model; 768-wide
              embeddings; t = 10, b = -10): `dataset=` (img2dataset:/PATH
              for LAION / DataComp shards, or a TFDS name), `tokenizer=`
              (the SentencePiece model, e.g. SigLIP's c4_en), batch 32,768
              (the SigLIP paper's), Adam lr 1e-3 with weight decay 1e-4 and
              10k warmup steps, bf16. Target: the released model's
              ImageNet zero-shot accuracy, which `vit-jax zeroshot
              --checkpoint=ViT-B/16@siglip-224 --tokenizer=... --dataset=
              imagenet2012 --split=validation --templates=clip` measures
  lit_b16     LiT from ViT-B/16@i21k (locked, class token, no projection)
              with a B-sized text tower of 16 tokens: big_vision's
              siglip_lit_coco.py settings (batch 512, 5,000 steps, lr 1e-3,
              warmup 150 steps, t = 10, b = -2.71, resize, flip,
              RandAugment(2, 10)) on `dataset=` (CC12M as img2dataset
              writes it, the LiT paper's; or a TFDS captions set)
  siglip2     SigLIP 2's NaFlex B/16 two towers (`init=`, default
              ViT-B/16@siglip2-naflex) trained further on `dataset=`: each
              image at its own shape (256 patches), Gemma's tokenizer
              (`tokenizer=`, 64 tokens of 256,000 pieces, the texts
              lower-cased as SigLIP 2's were), lr 1e-5, batch
              1,024, 2,000 steps: our choice for continuing it (the paper
              publishes no fine-tuning recipe)

`runlocal` (e.g. `digits,runlocal`) shrinks any recipe to a few steps of
the `testing` towers on the built-in captions (lit_digits keeps the digits
image tower its checkpoint needs; the full-size ones start from random
weights, not locked).
"""

from vit_jax.config import defaults
from vit_jax.data import digits_captions
from vit_jax.errors import UserError

RECIPES = ("digits", "clip", "lit_digits", "siglip_b16", "lit_b16", "siglip2")


def _digits(config, objective: str):
  config.dataset = "digits_captions"
  config.image_size = 16
  config.pp_train = "inception_crop(0.5)|value_range"
  config.pp_eval = "resize|value_range"
  config.cache = True
  config.shuffle_buffer = 2_000
  config.batch_size = 128
  config.eval_batch_size = 128
  config.total_steps = 1_000
  config.lr = 3e-3
  config.warmup_steps = 100
  config.weight_decay = 0.1
  config.objective = objective
  config.model.variant = "digits"
  config.model.classifier = "map"  # SigLIP's image towers pool so.
  config.model.class_token = False
  config.model.posemb = "sincos2d"
  config.text.variant = "digits"
  config.text.tokenizer = "digits"
  config.text.length = 8
  config.text.embedding_dim = 64
  config.evals.zeroshot.templates = digits_captions.TEMPLATES
  config.log_every_steps = 100
  config.eval_every_steps = 500


def _lit_digits(config, init):
  _digits(config, "siglip")
  # configs/digits.py's model and preprocessing, as its checkpoint has them.
  config.model.classifier = "token"
  config.model.class_token = None
  config.model.posemb = "learn"
  config.pp_train = "inception_crop(0.5)|value_range"
  config.text.image_head = False  # The locked tower's features, as LiT.
  config.frozen = ("img/.*",)
  config.init.checkpoint = init
  config.init.dont_load = ("head/.*",)  # Its classifier: not a projection.


def _full_size(config, args):
  """What the three full-size recipes share: the data, the tokenizer."""
  config.objective = "siglip"
  config.dataset = args.dataset
  config.text.key = args.text_key
  config.text.tokenizer = args.tokenizer
  config.train_split, config.eval_split = "train[:99%]", "train[99%:]"
  config.model.dtype = "bfloat16"
  config.grad_clip_norm = 1.0
  config.text.variant = "ViT-B/16"
  config.text.embedding_dim = 768
  config.text.image_head = False
  config.log_every_steps = 100
  config.eval_every_steps = 1_000


def _siglip_b16(config, args):
  _full_size(config, args)
  config.image_size = 224
  config.pp_train = config.pp_eval = "resize|value_range"
  config.model.variant = "ViT-B/16"
  config.model.classifier = "map"
  config.model.class_token = False
  config.text.length = 64
  config.batch_size = config.eval_batch_size = 32_768
  config.optimizer, config.lr, config.weight_decay = "adam", 1e-3, 1e-4
  config.warmup_steps, config.total_steps = 10_000, 100_000


def _lit_b16(config, args):
  _full_size(config, args)
  config.image_size = 224
  config.pp_train = "resize|flip_lr|randaug(2,10)|value_range"
  config.pp_eval = "resize|value_range"
  config.model.variant = "ViT-B/16"  # Class token, learned table: i21k's.
  config.text.length = 16
  config.text.bias_init = -2.71
  config.frozen = ("img/.*",)
  config.init.checkpoint = args.init or "ViT-B/16@i21k"
  config.init.dont_load = ("head/.*", "pre_logits/.*")
  config.batch_size = config.eval_batch_size = 512
  config.optimizer, config.lr, config.weight_decay = "adam", 1e-3, 0.01
  config.warmup_steps, config.total_steps = 150, 5_000


def _siglip2(config, args):
  _full_size(config, args)
  config.image_size = 256  # The 16 x 16 table its NaFlex tower learned.
  config.sequence_length = 256
  config.pp_train = ("aspect_crop(0.3)|flip_lr|resize_to_sequence|"
                     "value_range|patchify")
  config.pp_eval = "resize_to_sequence|value_range|patchify"
  config.model.variant = "ViT-B/16"
  config.model.classifier = "map"
  config.model.class_token = False
  config.text.length = 64
  config.text.lowercase = True  # SigLIP 2's texts (its paper, 3.1).
  config.init.checkpoint = args.init or "ViT-B/16@siglip2-naflex"
  config.batch_size = config.eval_batch_size = 1_024
  config.optimizer, config.lr, config.weight_decay = "adam", 1e-5, 1e-4
  config.warmup_steps, config.total_steps = 200, 2_000


def _shrunk(config):
  """runlocal for the full-size recipes: the testing towers on the
  built-in captions, from random weights."""
  config.dataset, config.text.key = "digits_captions", "captions"
  config.train_split, config.eval_split = "train", "test"
  config.text.tokenizer, config.text.length = "digits", 8
  config.text.embedding_dim = variants_width("testing")
  config.model.dtype = "float32"
  config.image_size = 16
  config.pp_eval = "resize|value_range"
  config.pp_train = "inception_crop(0.5)|value_range"
  config.frozen, config.init.checkpoint = (), None
  if config.sequence_length:
    config.sequence_length = 16
    config.pp_train = "aspect_crop(0.5)|resize_to_sequence|value_range|" + (
        "patchify")
    config.pp_eval = "resize_to_sequence|value_range|patchify"


def variants_width(name: str) -> int:
  from vit_jax.models import variants  # pylint: disable=g-import-not-at-top
  return variants.get_variant(name).hidden_size


def get_config(arg=None):
  """A recipe (above) and its KEY=VALUE arguments, with `,runlocal`."""
  args = defaults.parse_arg(arg, first="digits", init=None, dataset=None,
                            tokenizer=None, text_key="caption")
  config = defaults.get_config()
  if args.first == "digits":
    _digits(config, "siglip")
  elif args.first == "clip":
    _digits(config, "clip")
  elif args.first == "lit_digits":
    _lit_digits(config, args.init)
  elif args.first in ("siglip_b16", "lit_b16", "siglip2"):
    {
        "siglip_b16": _siglip_b16,
        "lit_b16": _lit_b16,
        "siglip2": _siglip2
    }[args.first](config, args)
  else:
    raise UserError(f"configs/image_text.py has no recipe {args.first!r}; "
                    f"it has {', '.join(RECIPES)}.")
  if args.runlocal and args.first in ("siglip_b16", "lit_b16", "siglip2"):
    _shrunk(config)
  if args.runlocal:
    if args.first != "lit_digits":
      config.model.variant = config.text.variant = "testing"
    config.total_steps = 10
    config.warmup_steps = 2
    config.batch_size = 32
    config.eval_batch_size = 64
    config.log_every_steps = 5
    config.eval_every_steps = 0
  return config.lock()
