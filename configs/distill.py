r"""Distillation: a small ViT taught by a large one, patient and consistent
(Beyer et al. 2022, "Knowledge distillation: A good teacher is patient and
consistent"; big_vision's trainers/proj/distill).

    vit-jax train --config=configs/distill.py:digits --workdir=workdirs/distill

The student matches a frozen teacher's predictions (KL divergence at
temperature T, times T^2; no label term) on exactly the images it sees:
the same inception crop, flip and mixup (coefficient uniform in [0, 1]:
config.mixup.alpha=1, every example mixed), the teacher seeing them at its
own resolution. Long schedules pay: the paper's ResNet-50 student of a
BiT-M R152x2 teacher reaches 80.3% ImageNet top-1 after 300 epochs, 82.3%
after 9,600, 82.8% from an ensemble of a 224 and a 384 px teacher.
Presets:

  digits        the built-in digits at 16 px: a `digits-small` student (the
                `digits` ViT at half its width) taught by
                configs/teachers/digits.npz for 5,000 steps of 64. The
                teacher is the `digits` ViT of configs/digits.py trained
                10,000 steps with mixup 0.2 (seed 0; test accuracy 98.9%):
                `vit-jax train --config=configs/digits.py
                --config.total_steps=10000 --config.mixup.alpha=0.2`, then
                `vit-jax export --format=npz`. What the student reaches,
                against the same student on labels: docs/training.md
                ("Distillation").
  digits_labels the same student, data and steps on the labels alone (the
                comparison's other side; configs/digits.py's recipe).
                `share=20` (either): the students see the first 20% of the
                training images, which the teacher saw all of: it knows
                more than their data shows, as a large checkpoint
                fine-tuned on a task does.
  imagenet2012  ViT-S/16 (GAP, sin-cos position embeddings) from scratch,
                taught by ViT-B/16@i21k-ft-i1k-224 (ImageNet-21k, fine-tuned
                on ImageNet-1k at 224 px); batch 4096, `epochs=300`
                (default) or `epochs=1200`, Adam lr 1e-3, weight decay 1e-4
                on kernels, 10k warmup then cosine, bf16 compute, first
                moment in bf16. The student is evaluated on minival (1% of
                train), validation, ReaL and v2; on validation also its
                agreement with the teacher and the teacher's accuracy
                (once). Not run here; the paper's ResNet figures above are
                the reference.
  oxford_iiit_pet, oxford_flowers102
                a fine-tuned task: ViT-S/16 at 224 px taught by your ViT-B/16
                fine-tuned on it (`teacher=PATH`, e.g. a workdir of
                configs/finetune.py:oxford_iiit_pet,variant=ViT-B/16,
                init=ViT-B/16@i21k), batch 512, `schedule=fast|medium|long`:
                the paper's epochs and temperatures for these datasets (Pet
                1,000 / 3,000 / 30,000 epochs at T 5 / 10 / 2; Flowers 10,000
                / 100,000 / 1,000,000 at T 10 / 1 / 1), long by default. The
                student starts from random init as in the paper, or from
                `init=CHECKPOINT`. Not run here.

`teacher=CHECKPOINT` replaces any preset's teacher (a workdir, a file, a
released name, a timm or transformers directory); several teachers, each
at its resolution: --config.distill.teachers="(('A', 224), ('B', 384))".
`runlocal` shrinks a preset to a few CPU steps on digits with the digits
teacher (what CI runs).
"""

import os

from vit_jax.config import defaults
from vit_jax.errors import UserError

# A `digits` ViT (configs/digits.py, 10,000 steps, mixup 0.2, seed 0),
# exported as the released .npz.
DIGITS_TEACHER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                              "teachers", "digits.npz")
# The paper's schedules for two fine-grained tasks: epochs and temperature
# (big_vision's configs/proj/distill/bigsweep_flowers_pet.py).
SCHEDULES = {
    "oxford_iiit_pet": {
        "fast": (1_000, 5.0),
        "medium": (3_000, 10.0),
        "long": (30_000, 2.0)
    },
    "oxford_flowers102": {
        "fast": (10_000, 10.0),
        "medium": (100_000, 1.0),
        "long": (1_000_000, 1.0)
    },
}
PRESETS = ("digits", "digits_labels", "imagenet2012", *SCHEDULES)


def _function_matching(config):
  """The paper's consistent views: crop and flip on the host, mixup with a
  uniform coefficient on every example, temperature 1, no labels."""
  config.objective = "distill"
  config.mixup.alpha = 1.0
  config.mixup.p = 1.0
  config.distill.temperature = 1.0


def _digits(config, labels: bool, share: str):
  if not share.isdigit() or not 0 < int(share) <= 100:
    raise UserError(f"share={share}: the percentage of digits' training "
                    "images the student sees, 1 to 100.")
  split = "train" if share == "100" else f"train[:{share}%]"
  config.update(
      dict(dataset="digits", train_split=split, image_size=16, batch_size=64,
           eval_batch_size=128, pp_train="inception_crop(0.5)|value_range",
           pp_eval="resize|value_range", shuffle_buffer=2_000, cache=True,
           total_steps=5_000, lr=3e-3, warmup_steps=200, weight_decay=0.1,
           log_every_steps=250, eval_every_steps=1_000,
           checkpoint_every_steps=1_000))
  config.model.variant = "digits-small"
  if not labels:
    _function_matching(config)
    config.distill.teachers = (DIGITS_TEACHER,)


def _imagenet(config, epochs: float):
  config.update(
      dict(dataset="imagenet2012", train_split="train[:99%]",
           eval_split="validation", num_epochs=epochs, batch_size=4096,
           eval_batch_size=4096, lr=1e-3, warmup_steps=10_000,
           decay_type="cosine", weight_decay=0.1, wd_mults=((".*/kernel", 1.0),
                                                            (".*", 0.0)),
           mu_dtype="bfloat16", pp_train="inception_crop|flip_lr|value_range",
           pp_eval="resize_small|central_crop|value_range",
           shuffle_buffer=250_000, log_every_steps=100, eval_every_steps=5_000,
           checkpoint_every_steps=2_000))
  config.model.update(
      dict(variant="ViT-S/16", classifier="gap", posemb="sincos2d",
           dtype="bfloat16"))
  _function_matching(config)
  config.distill.teachers = ("ViT-B/16@i21k-ft-i1k-224",)
  config.evals.minival = defaults.eval_entry(  # Metrics minival/*.
      "classification", data=dict(split="train[99%:]"))
  config.evals.real = defaults.eval_entry(  # Metrics real/*.
      "classification", skip_unlabelled=True, average_label_sets=True,
      data=dict(dataset="imagenet2012_real", split="validation",
                label_key="real_label", cache=False))
  config.evals.v2 = defaults.eval_entry(  # Metrics v2/*.
      "classification", data=dict(dataset="imagenet_v2", split="test",
                                  cache=False))


def _task(config, dataset: str, schedule: str, teacher, init):
  if schedule not in SCHEDULES[dataset]:
    raise UserError(f"Unknown schedule {schedule!r} for {dataset}; use one "
                    f"of {', '.join(SCHEDULES[dataset])}.")
  epochs, temperature = SCHEDULES[dataset][schedule]
  config.update(
      dict(dataset=dataset, train_split="train", eval_split="test",
           num_epochs=float(epochs), batch_size=512, eval_batch_size=512,
           lr=1e-3, warmup_steps=1_500, decay_type="cosine", weight_decay=0.1,
           wd_mults=((".*/kernel", 1.0), (".*", 0.0)), mu_dtype="bfloat16",
           pp_train="inception_crop|flip_lr|value_range",
           pp_eval="resize_small|central_crop|value_range", cache=True,
           log_every_steps=100, eval_every_steps=5_000,
           checkpoint_every_steps=2_500))
  config.model.update(dict(variant="ViT-S/16", dtype="bfloat16"))
  _function_matching(config)
  config.distill.temperature = temperature
  config.distill.teachers = (teacher or "workdirs/finetune_b16_" + dataset,)
  if init:
    config.init.checkpoint = init
    config.init.dont_load = ("head/.*",)


def _runlocal(config):
  """A few CPU steps on digits, the digits teacher at its 16 px."""
  defaults.runlocal(config)
  config.model.variant = "testing"
  config.pp_train = "inception_crop(0.5)|value_range"
  config.mixup.alpha = 1.0 if config.objective == "distill" else 0.0
  for name in ("minival", "real", "v2"):
    if name in config.evals:
      del config.evals[name]
  if config.objective == "distill":
    config.distill.teachers = (DIGITS_TEACHER,)
    config.distill.temperature = 1.0
  config.init.checkpoint = None
  config.mu_dtype = "float32"


def get_config(arg=None):
  args = defaults.parse_arg(arg, first="digits", teacher=None, epochs="300",
                            share="100", schedule="long", init=None)
  if args.first not in PRESETS:
    raise UserError(f"Unknown distillation preset {args.first!r}; use one "
                    f"of {', '.join(PRESETS)}.")
  config = defaults.get_config()
  if args.first.startswith("digits"):
    _digits(config, labels=args.first == "digits_labels", share=args.share)
  elif args.first == "imagenet2012":
    if args.epochs not in ("300", "1200"):
      raise UserError(f"epochs={args.epochs}: the paper's ImageNet schedules "
                      "are 300 and 1200 epochs.")
    _imagenet(config, float(args.epochs))
  else:
    _task(config, args.first, args.schedule, args.teacher, args.init)
  if args.teacher and config.objective == "distill":
    config.distill.teachers = (args.teacher,)
  if args.runlocal:
    _runlocal(config)
  return config.lock()
