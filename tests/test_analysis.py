"""The paper's analyses (vit_jax/analysis/measures.py) on attention and
embeddings with known answers, a hybrid's grid, and the analyze command end
to end."""

import itertools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import processes
from tests.helpers import tiny_models
from vit_jax import inference
from vit_jax import models
from vit_jax import weights
from vit_jax.analysis import figures
from vit_jax.analysis import measures
from vit_jax.config import defaults

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _attention(layers, batch, heads, tokens, rows):
  """L x B x H x T x T, every query's row given by `rows` (T x T)."""
  return jnp.broadcast_to(jnp.asarray(rows, jnp.float32),
                          (layers, batch, heads, tokens, tokens))


@pytest.mark.parametrize("prefix", [0, 1])
def test_attention_to_itself_is_at_distance_zero(prefix):
  grid, stride = (3, 4), 16
  tokens = prefix + 12
  distance = measures.mean_attention_distance(
      _attention(2, 3, 4, tokens, np.eye(tokens)),
      measures.patch_distances(grid, stride), prefix)
  assert distance.shape == (2, 3, 4)
  np.testing.assert_array_equal(distance, 0.0)


def test_uniform_attention_gives_the_grids_mean_distance():
  """Uniform over every token (class token included): after dropping the
  class token and renormalising, each query weighs every patch alike, so
  the answer is the mean distance over all ordered pairs of cells."""
  g, stride = 5, 16
  cells = list(itertools.product(range(g), range(g)))
  pairs = [((r1 - r2)**2 + (c1 - c2)**2)**0.5 * stride
           for (r1, c1), (r2, c2) in itertools.product(cells, cells)]
  expected = sum(pairs) / len(pairs)
  tokens = g * g + 1
  distance = measures.mean_attention_distance(
      _attention(3, 2, 2, tokens, np.full((tokens, tokens), 1 / tokens)),
      measures.patch_distances((g, g), stride), num_prefix=1)
  np.testing.assert_allclose(distance, expected, rtol=1e-5)
  assert 40 < expected < 45  # 2.6 cells of 16 px on a 5 x 5 grid.


def test_rollout_of_identity_attention_stays_on_the_class_token():
  tokens = 10
  attention = _attention(4, 2, 3, tokens, np.eye(tokens))
  rollout = measures.rollout_matrix(attention)
  np.testing.assert_allclose(rollout,
                             jnp.broadcast_to(jnp.eye(tokens), rollout.shape))
  class_row = rollout[:, 0]
  np.testing.assert_allclose(class_row, np.eye(tokens)[[0, 0]])
  reads = measures.head_reads("token", tokens, batch=2)
  np.testing.assert_allclose(measures.attention_rollout(attention, reads, 1),
                             0.0)


def test_rollout_matches_the_recipe_computed_by_hand():
  rng = np.random.default_rng(0)
  layers, heads, tokens = 3, 2, 5
  attention = rng.dirichlet(np.ones(tokens), (layers, 1, heads, tokens))
  product = np.eye(tokens)
  for layer in range(layers):  # Abnar & Zuidema: (A + I) / 2, then chain.
    mixed = 0.5 * attention[layer, 0].mean(axis=0) + 0.5 * np.eye(tokens)
    product = mixed @ product
  attention = jnp.asarray(attention, jnp.float32)
  token = measures.attention_rollout(attention,
                                     measures.head_reads("token", tokens, 1), 1)
  np.testing.assert_allclose(token[0], product[0, 1:], rtol=1e-5)
  gap = measures.attention_rollout(attention,
                                   measures.head_reads("gap", tokens, 1), 0)
  np.testing.assert_allclose(gap[0], product.mean(axis=0), rtol=1e-5)
  probe = rng.dirichlet(np.ones(tokens), (1, heads, 1))  # B x H x 1 x T
  map_head = measures.attention_rollout(
      attention, measures.head_reads("map", tokens, 1, jnp.asarray(probe)), 0)
  np.testing.assert_allclose(map_head[0], probe[0, :, 0].mean(0) @ product,
                             rtol=1e-5)
  np.testing.assert_allclose(map_head.sum(), 1.0, rtol=1e-5)


def test_principal_components_are_orthonormal_and_ordered():
  rng = np.random.default_rng(1)
  scales = np.array([5.0, 3.0, 2.0, 1.0] + [0.1] * 44)  # 4 x 4 x 3 filters.
  filters = rng.normal(size=(200, 48)) * scales[rng.permutation(48)]
  kernel = filters.T.reshape(4, 4, 3, 200)
  components, ratio = measures.embedding_filters_pca(kernel, 10)
  assert components.shape == (10, 4, 4, 3)
  flat = components.reshape(10, -1)
  np.testing.assert_allclose(flat @ flat.T, np.eye(10), atol=1e-10)
  assert np.all(np.diff(ratio) <= 0) and 0 < ratio.sum() <= 1
  # The same directions as the covariance matrix's leading eigenvectors.
  centred = filters - filters.mean(axis=0)
  values, vectors = np.linalg.eigh(centred.T @ centred)
  leading = vectors[:, ::-1][:, :4].T
  np.testing.assert_allclose(np.abs(np.sum(leading * flat[:4], axis=1)), 1,
                             atol=1e-8)
  np.testing.assert_allclose(ratio[:4], values[::-1][:4] / values.sum())


def test_position_similarity_is_one_with_itself():
  posemb = np.random.default_rng(2).normal(size=(16, 8)) * 7
  similarity = measures.position_similarity(posemb)
  np.testing.assert_allclose(np.diag(similarity), 1.0)
  np.testing.assert_allclose(similarity, similarity.T)
  assert np.all(np.abs(similarity) <= 1 + 1e-12)


def _random_batches(size, count, batch=8):
  """Batches of 8 (one per test device), the last 3 of each padding."""
  rng = np.random.default_rng(0)
  for _ in range(count):
    yield {
        "image": rng.uniform(-1, 1, (batch, size, size, 3)).astype(np.float32),
        "mask": np.array([1] * 5 + [0] * 3, np.float32)
    }


def test_a_hybrids_grid_is_its_stems_grid(tmp_path):
  """A released-style hybrid file, read without a config: the analysis's
  grid is what its ResNet stem outputs, and every map has that shape."""
  config = defaults.get_model_config()
  config.variant, config.gelu_approximate = "testing-hybrid", True
  model = tiny_models.build(config, num_classes=5)
  x = jnp.zeros((1, 32, 32, 3))
  params = jax.jit(model.init)(jax.random.key(0), x)["params"]
  path = str(tmp_path / "hybrid.npz")
  weights.save_npz(params, path)
  assert weights.read_architecture(path) == weights.Architecture(
      "testing-hybrid", "token", True, "learn", None, 5, 32)
  stem = model.apply({"params": params}, x,
                     return_intermediates=True)[1]["stem"]
  stem_grid = [s // model.size.patch_size for s in stem.shape[1:3]]

  loaded = inference.load(path)
  result = measures.run(loaded, _random_batches(32, 2), max_images=7,
                        num_shown=2)
  assert result["grid"] == stem_grid == [4, 4]
  assert result["num_images"] == 7  # 5 real images, then 2 of the next.
  assert result["position_embedding_similarity"].shape == (16, 16)
  assert result["mean_attention_distance"].shape == (1, 2)
  assert [s.rollout_map.shape for s in result["attention_rollout"]
         ] == [(4, 4)] * 2
  # A hybrid's pixels meet the stem's root convolution, not the embedding.
  assert result["embedding_filters"]["layer"].startswith("conv_root")
  assert result["embedding_filters"]["components"].shape[1:] == (7, 7, 3)


@pytest.mark.parametrize("classifier", ["gap", "map"])
def test_models_without_a_class_token(tmp_path, classifier):
  """No prefix token: every position embedding is a patch's, and the
  rollout of what the head reads spreads a total of 1 over the patches."""
  model = models.create_model("testing", 3, classifier=classifier)
  params = jax.jit(model.init)(jax.random.key(0), jnp.zeros(
      (1, 16, 16, 3)))["params"]
  path = str(tmp_path / f"{classifier}.npz")
  weights.save_npz(params, path)
  loaded = inference.load(path)
  assert loaded.config.model.classifier == classifier
  result = measures.run(loaded, _random_batches(16, 1), max_images=5)
  assert result["grid"] == [4, 4]
  assert result["position_embedding_similarity"].shape == (16, 16)
  for shown in result["attention_rollout"]:
    np.testing.assert_allclose(shown.rollout_map.sum(), 1.0, rtol=1e-5)


def test_the_upsampled_map_keeps_each_cell_over_its_pixels():
  for row, column in [(0, 0), (1, 2), (3, 3)]:
    cells = np.zeros((4, 4))
    cells[row, column] = 1.0
    pixels = figures.upsample(cells, (64, 64))
    peak = np.unravel_index(np.argmax(pixels), pixels.shape)
    assert (peak[0] // 16, peak[1] // 16) == (row, column)
    block = pixels[row * 16:(row + 1) * 16, column * 16:(column + 1) * 16]
    if (row, column) == (1, 2):  # Inside the grid: centred on its pixels.
      np.testing.assert_allclose(block, block[::-1, ::-1], atol=1e-12)
      assert pixels[row * 16 + 7:row * 16 + 9,
                    column * 16 + 7:column * 16 + 9].min() > 0.9


@pytest.mark.xdist_group("trained_digits")
def test_analyze_writes_the_figures_and_numbers(trained_digits, tmp_path):
  out = tmp_path / "analysis"
  done = subprocess.run([
      sys.executable, "-m", "vit_jax", "analyze",
      f"--checkpoint={trained_digits}", "--num_images=40", "--num_shown=3",
      f"--out={out}"
  ], cwd=REPO, env=processes.command_env(), capture_output=True, text=True,
                        timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  for name in ("embedding_filters.png", "position_embedding_similarity.png",
               "mean_attention_distance.png", "attention_rollout.png"):
    assert (out / name).read_bytes().startswith(b"\x89PNG"), name
  numbers = json.loads((out / "analysis.json").read_text())
  assert numbers["num_images"] == 40 and numbers["grid"] == [4, 4]
  distance = np.array(numbers["mean_attention_distance"])
  assert distance.shape == (4, 4)  # digits: 4 layers of 4 heads.
  # Between attending only to itself and only to the farthest patch.
  assert np.all(distance > 0) and np.all(distance < 3 * 4 * 2**0.5)
  assert len(numbers["attention_rollout"]) == 3
  assert numbers["attention_rollout"][0]["image"] == "digits:test #0"
  assert len(numbers["embedding_filters"]["components"]) == 28
  by_layer = numbers["mean_attention_distance_by_layer"]
  assert by_layer[0]["min"] <= by_layer[0]["mean"] <= by_layer[0]["max"]
  assert "layer  4" in done.stderr and str(out) in done.stderr
