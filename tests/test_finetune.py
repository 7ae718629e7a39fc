"""Fine-tuning from a checkpoint through `train_and_evaluate`: a model
pre-trained at 16 px predicts well at 32 px right after loading."""

from configs import finetune
from vit_jax import train


def test_finetuning_at_a_new_resolution(digits_config, tmp_path):
  digits_config.model.variant = "digits"
  digits_config.total_steps = 400
  digits_config.warmup_steps = 20
  digits_config.lr = 3e-3
  digits_config.eval_every_steps = 0
  pretrained = train.train_and_evaluate(digits_config, str(tmp_path / "pre"))
  assert pretrained["test_accuracy"] > 0.6, pretrained

  config = finetune.get_config("digits")
  config.data_dir = digits_config.data_dir
  config.init.checkpoint = str(tmp_path / "pre")
  config.init.dont_load = ()  # Keep the trained head: evaluate at once.
  config.total_steps = 0
  config.ema_decay = 0.99  # The average starts from the loaded weights.
  loaded = train.train_and_evaluate(config, str(tmp_path / "ft0"))
  # Position embeddings resized from 4x4 to 8x8: still far above chance.
  assert loaded["test_accuracy"] > 0.5, (pretrained, loaded)

  config.init.dont_load = ("head/.*",)  # The paper's policy: a new head.
  config.total_steps = 60
  config.eval_every_steps = 0
  tuned = train.train_and_evaluate(config, str(tmp_path / "ft"))
  assert tuned["test_accuracy"] > 0.5
  # Rerunning resumes from the workdir's checkpoint, not from init.
  again = train.train_and_evaluate(config, str(tmp_path / "ft"))
  assert again["test_accuracy"] == tuned["test_accuracy"]
