"""The pieces of big_vision's plain ViTs and SigLIP towers in the model:
fixed 2D sin-cos position embeddings, the MAP head, and the refusals of
options that do not go together (their whole forward passes are checked
against the numpy reference in test_models.py)."""

import jax
import numpy as np
import pytest

from tests.helpers import numpy_reference as ref
from tests.helpers import tiny_models
from tests.test_models import TINY
from tests.test_models import images
from tests.test_models import random_params
from tests.test_models import run
from tests.test_models import tiny_model
from vit_jax import models
from vit_jax.config import defaults
from vit_jax.errors import UserError
from vit_jax.models import embeddings
from vit_jax.models import vit as vit_module


@pytest.mark.parametrize("grid,width", [((4, 4), 32), ((3, 5), 8),
                                        ((14, 14), 768)])
def test_sincos2d_matches_numpy_reference(grid, width):
  table = np.asarray(embeddings.posemb_sincos2d(*grid, width))
  assert table.shape == (1, grid[0] * grid[1], width)
  np.testing.assert_allclose(table[0], ref.sincos2d(*grid, width), atol=2e-6)


def test_sincos2d_properties():
  """Token (row 0, col 0) is [0.., 1.., 0.., 1..]; the first frequency is 1
  rad per token; columns vary only the first half, rows the second."""
  table = np.asarray(embeddings.posemb_sincos2d(3, 4, 16))[0]
  np.testing.assert_allclose(table[0], [0] * 4 + [1] * 4 + [0] * 4 + [1] * 4,
                             atol=1e-7)
  np.testing.assert_allclose(table[1, 0], np.sin(1.0), atol=1e-7)
  np.testing.assert_allclose(table[4, 8], np.sin(1.0), atol=1e-7)  # Row 1.
  np.testing.assert_allclose(table[0, 8:], table[3, 8:])  # Same row.
  np.testing.assert_allclose(table[0, :8], table[4, :8])  # Same column.


def test_map_head_matches_numpy_reference():
  head = vit_module.MAPHead(mlp_dim=24, num_heads=2, form=models.ModelForm())
  x = np.random.default_rng(3).normal(size=(2, 5, 8)).astype(np.float32)
  params = ref.trained_like_params(
      jax.eval_shape(head.init, jax.random.key(0), x)["params"], seed=4)
  pooled, weights = head.apply({"params": params}, x)
  assert weights.shape == (2, 2, 1, 5)
  np.testing.assert_allclose(pooled, ref.map_head(x, params), rtol=1e-5,
                             atol=1e-5)


def test_sincos2d_model_stores_no_position_embeddings_and_sees_position():
  """Nothing learned, yet moving a patch changes the output (the table is
  added), and the grid follows the image: a 2x larger image just works."""
  model = tiny_model(classifier="gap", posemb="sincos2d")
  x = images()
  params = random_params(model, x)
  assert "posembed_input" not in params["Transformer"]
  rolled = np.roll(x, TINY["patch_size"], axis=2)  # One patch to the right.
  plain, _ = run(tiny_model(classifier="gap", posemb="none"), params, x)
  np.testing.assert_allclose(
      run(tiny_model(classifier="gap", posemb="none"), params, rolled)[0],
      plain, rtol=1e-4, atol=1e-4)  # Rolls commute.
  assert np.abs(run(model, params, x)[0] -
                run(model, params, rolled)[0]).max() > 1e-3
  big = images(shape=(1, 32, 32, 3))
  assert run(model, params, big)[0].shape == (1, 7)


def test_token_pooling_without_a_class_token_is_refused_before_tracing():
  config = defaults.get_model_config()
  config.variant, config.gelu_approximate = "testing", True
  config.class_token = False
  with pytest.raises(UserError, match="classifier=token reads the class"):
    tiny_models.build(config, 3)
  config.class_token, config.posemb = None, "sincos2d"
  config.variant = "testing"
  tiny_models.build(config, 3)  # Width 16: fine.
  config.posemb = "fixed"
  with pytest.raises(UserError, match="posemb='fixed' is not one of"):
    tiny_models.build(config, 3)
