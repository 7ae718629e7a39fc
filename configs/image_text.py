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

What each reaches and in how long: docs/image_text.md. `runlocal` (e.g.
`digits,runlocal`) shrinks any recipe to a few steps of the `testing`
towers (lit_digits keeps the digits image tower its checkpoint needs).
"""

from vit_jax.config import defaults
from vit_jax.data import digits_captions
from vit_jax.errors import UserError

RECIPES = ("digits", "clip", "lit_digits")


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


def get_config(arg=None):
  """`digits` | `clip` | `lit_digits,init=WORKDIR`, with `,runlocal`."""
  args = defaults.parse_arg(arg, first="digits", init=None)
  config = defaults.get_config()
  if args.first == "digits":
    _digits(config, "siglip")
  elif args.first == "clip":
    _digits(config, "clip")
  elif args.first == "lit_digits":
    _lit_digits(config, args.init)
  else:
    raise UserError(f"configs/image_text.py has no recipe {args.first!r}; "
                    f"it has {', '.join(RECIPES)}.")
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
