r"""Few-shot linear evaluation sweeps (the paper's Fig. 2/5 protocol).

    vit-jax fewshot --config=configs/fewshot.py:digits \
        --checkpoints=workdirs/demo/pretrain --workdir=workdirs/fewshot

Presets: `digits` (the demo's 16-px `digits` model on the built-in digits;
what its checkpoints score: docs/evaluation.md) and `paper` (224 px,
pre-logits of ViT-B/16 by default, on CIFAR-100, Oxford Pets and Flowers;
the paper's ImageNet 5-shot is with `--datasets=imagenet2012` and
`--config.fewshot.train_split='train[:10%]'`).
`standard` is big_vision's standard few-shot set (vit_jax/fewshot/bundles.py:
Caltech-101, Cars196, CIFAR-100, DTD, Oxford Pets, UC Merced and ImageNet
`train[:65000]` against `validation`, 1/5/10/25 shots, 3 seeds, L2 2^10,
resize 256 then central crop 224); `standard,imagenet=0` leaves out
ImageNet (a manual download). The pre-training recipes run the same set
periodically with `fewshot=standard` (configs/pretrain.py).
`variant=NAME` picks the model; `runlocal` shrinks to a tiny model (what
the tests run).
"""

from vit_jax.config import defaults
from vit_jax.errors import UserError
from vit_jax.fewshot import bundles


def get_config(arg=None):
  args = defaults.parse_arg(arg, first="digits", variant="ViT-B/16",
                            imagenet="1")
  config = defaults.get_config()
  config.eval_batch_size = 512
  config.fewshot.shots = (1, 5, 10, 25)
  config.fewshot.seeds = 3
  if args.first == "digits" or args.runlocal:
    config.dataset = "digits"
    config.image_size = 16
    config.pp_eval = "resize|value_range"
    config.eval_batch_size = 128
    config.model.variant = "digits" if args.first == "digits" else "testing"
    config.fewshot.datasets = ("digits",)
  elif args.first == "paper":
    config.image_size = 224
    config.pp_eval = "resize|value_range"
    config.model.variant = args.variant
    config.model.dtype = "bfloat16"
    config.fewshot.datasets = ("cifar100", "oxford_iiit_pet",
                               "oxford_flowers102")
  elif args.first == "standard":
    config.image_size = 224
    config.model.variant = args.variant
    config.model.dtype = "bfloat16"
    bundles.use_standard(config, imagenet=args.imagenet not in ("0", "no"))
  else:
    raise UserError(f"Unknown few-shot preset {args.first!r}; use digits, "
                    "paper or standard.")
  if args.runlocal:
    config.model.variant = "testing"
    config.fewshot.shots = (1, 5)
    config.fewshot.seeds = 2
  return config.lock()
