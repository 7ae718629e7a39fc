r"""VTAB-1k: fine-tune on one of its 19 tasks with the ViT paper's setting.

One task:

    vit-jax train --config=configs/vtab.py:clevr_count,init=PATH \
        --workdir=workdirs/vtab/clevr_count \
        --config.data_dir=~/tensorflow_datasets

All 19 (or `--tasks=a,b`), one sub-workdir each, with the group means:

    vit-jax vtab --config=configs/vtab.py --checkpoint=PATH \
        --workdir=workdirs/vtab --config.data_dir=~/tensorflow_datasets

Argument: `TASK` (a name of `vit_jax/data/vtab_tasks.py`, default
cifar100; the `vtab` command replaces it by each task), `split=test`
(default: train on train800val200, the task's 1,000 training images,
evaluate on its test split: the reported protocol) or `split=val` (train
on train800, evaluate on val200: for choosing settings), `variant=NAME`
(default ViT-B/16), `init=PATH` (or --config.init.checkpoint / the command's
--checkpoint) and `runlocal` (the tiny `testing` model for a few steps at
16 px on the task's data).

The setting is the paper's one for every VTAB task (App. B.1.1, Table 4):
SGD with momentum 0.9, lr 0.01, 2,500 steps of batch 512, cosine decay,
global-norm clip 1, no weight decay, 384 px, a new zero-initialised linear
head. Our choices where the paper is silent: 500 warmup steps (as our other
fine-tuning presets) and a plain resize to 384 px for training and
evaluation: no random crop or flip, which would corrupt the labels of the
structured tasks (positions, orientations, distances). The paper reaches a
mean of 72.7% over the 19 tasks with ViT-L/16 pre-trained on ImageNet-21k
and 77.6% with ViT-H/14 on JFT-300M (Table 2); we have not run these at
full size. The datasets must be prepared in config.data_dir (Retinopathy
and RESISC45 need manual downloads, see TFDS).
"""

from vit_jax.config import defaults
from vit_jax.data import vtab_tasks
from vit_jax.errors import UserError


def get_config(arg=None):
  args = defaults.parse_arg(arg, first="cifar100", split="test",
                            variant="ViT-B/16", init=None)
  task = vtab_tasks.get(args.first)
  if args.split not in vtab_tasks.PROTOCOLS:
    raise UserError(f"split={args.split} is not one of "
                    f"{', '.join(vtab_tasks.PROTOCOLS)} (test: train800val200 "
                    "-> test; val: train800 -> val200).")
  config = defaults.get_config()
  defaults.paper_transfer(config, args.variant, args.init)
  config.total_steps = 2_500
  config.lr = 0.01
  config.shuffle_buffer = vtab_tasks.TRAIN_SIZE + vtab_tasks.VAL_SIZE
  config.log_every_steps = 50
  config.eval_every_steps = 0  # At the end only: test sets are large.
  config.checkpoint_every_steps = 500
  config.keep_checkpoints = 1  # 19 tasks: only what a resume needs.
  if args.runlocal:
    defaults.runlocal(config, image_size=16)
  # After runlocal, which would read the digits: the task stays the data.
  config.dataset = f"vtab:{task.name}"
  config.train_split, config.eval_split = vtab_tasks.PROTOCOLS[args.split]
  config.pp_train = config.pp_eval = "resize|value_range"
  return config.lock()
