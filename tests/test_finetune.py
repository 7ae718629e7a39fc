"""Fine-tuning from a checkpoint through `train_and_evaluate`: a model
pre-trained at 16 px predicts well at 32 px right after loading."""

import pytest

from configs import finetune
from vit_jax.loop import trainer


@pytest.mark.xdist_group("trained_digits")
def test_finetuning_at_a_new_resolution(trained_digits, tfds_data_dir,
                                        tmp_path):
  config = finetune.get_config("digits")
  config.data_dir = tfds_data_dir
  config.init.checkpoint = trained_digits
  config.init.dont_load = ()  # Keep the trained head: evaluate at once.
  config.total_steps = 0
  config.ema_decay = 0.99  # The average starts from the loaded weights.
  loaded = trainer.train_and_evaluate(config, str(tmp_path / "ft0"))
  # Position embeddings resized from 4x4 to 8x8: still far above chance.
  assert loaded["test/accuracy"] > 0.5, loaded

  config.init.dont_load = ("head/.*",)  # The paper's policy: a new head.
  config.total_steps = 60
  config.eval_every_steps = 0
  tuned = trainer.train_and_evaluate(config, str(tmp_path / "ft"))
  assert tuned["test/accuracy"] > 0.5
  # Rerunning resumes from the workdir's checkpoint, not from init.
  again = trainer.train_and_evaluate(config, str(tmp_path / "ft"))
  assert again["test/accuracy"] == tuned["test/accuracy"]
