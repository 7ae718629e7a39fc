"""The main job: a small ViT on the built-in digits dataset, on a laptop CPU.

    vit-jax train --config=configs/digits.py --workdir=workdirs/digits

A 4-layer, 64-wide ViT (patch 4) on digits upsampled to 16x16 px, sized
for a laptop CPU; what it reaches is step 1 of README.md's demo table, and
how long it takes is in docs/training.md. The argument `runlocal` shrinks
it to a few steps of the `testing` model.
"""

from vit_jax.config import defaults


def get_config(arg=None):
  config = defaults.get_config()
  config.dataset = "digits"
  config.image_size = 16
  # Digits are not mirror-symmetric: no flip; a milder crop than ImageNet's.
  config.pp_train = "inception_crop(0.5)|value_range"
  config.pp_eval = "resize|value_range"
  config.shuffle_buffer = 2_000
  config.cache = True
  config.batch_size = 64
  config.eval_batch_size = 128
  config.total_steps = 2_500  # 111 epochs.
  config.lr = 3e-3
  config.warmup_steps = 200
  config.weight_decay = 0.1
  config.model.variant = "digits"
  config.log_every_steps = 100
  config.eval_every_steps = 500
  if arg == "runlocal":
    config.model.variant = "testing"
    config.total_steps = 10
    config.warmup_steps = 2
    config.batch_size = 32
    config.eval_batch_size = 64
    config.log_every_steps = 5
    config.eval_every_steps = 0
  return config.lock()
