"""The synthetic-data benchmark: its FLOP count and its report."""

import types

import jax
import pytest

from tests.helpers import tiny_models
from vit_jax import models
from vit_jax import objectives
from vit_jax.config import defaults
from vit_jax.performance import flops
from vit_jax.performance import profiling
from vit_jax.performance import speed


def _vit_macs(width, mlp, layers, heads, patch, size, classes):
  """Multiply-adds of a ViT forward pass, from the paper's equations."""
  tokens = (size // patch)**2 + 1
  per_block = (
      4 * tokens * width * width  # q, k, v and out projections
      + 2 * tokens * tokens * width  # q.k and attention x v
      + 2 * tokens * width * mlp)  # the two MLP layers
  embedding = (tokens - 1) * patch * patch * 3 * width
  return layers * per_block + embedding + width * classes


@pytest.mark.parametrize("scan_layers", [False, True])
def test_forward_macs_match_the_paper_formula(scan_layers):
  config = defaults.get_model_config()
  config.variant, config.gelu_approximate = "ViT-B/16", True
  config.scan_layers = scan_layers
  macs = flops.forward_macs(tiny_models.build(config, 1000), 224)
  assert macs == _vit_macs(768, 3072, 12, 12, 16, 224, 1000) == 17_563_828_224


@pytest.mark.parametrize("options", [
    dict(parallel_block=True),
    dict(use_bias=False),
    dict(qkv_bias=False),
    dict(qk_norm=True),
    dict(parallel_block=True, use_bias=False, qk_norm=True),
])
def test_vit_22b_block_options_keep_the_papers_matmuls(options):
  """A parallel block reorders the same matmuls; biases and LayerNorms
  are no matmuls: every option's model FLOPs are the formula's."""
  model = models.create_model("ViT-B/16", 1000, **options)
  macs = flops.forward_macs(model, 224)
  assert macs == _vit_macs(768, 3072, 12, 12, 16, 224, 1000)


def _blocks_macs(tokens, width, mlp, layers):
  return layers * (4 * tokens * width * width + 2 * tokens * tokens * width +
                   2 * tokens * width * mlp)


def test_mae_counts_its_encoder_on_the_visible_patches():
  """ViT-B/16 at 224 px with MAE's decoder (512 wide, 8 blocks of MLP
  2048): the encoder embeds and encodes 49 of the 196 patches and the
  class token, the decoder every patch (`flops.forward_macs` as the
  benchmark calls it for config.objective=mae)."""
  config = defaults.get_config()
  config.model.variant, config.model.gelu_approximate = "ViT-B/16", True
  config.model.posemb, config.objective = "sincos2d", "mae"
  model = objectives.model(objectives.decide(config), None)
  encoder = (_blocks_macs(50, 768, 3072, 12) + 49 * 16 * 16 * 3 * 768)
  decoder = (50 * 768 * 512 + _blocks_macs(197, 512, 2048, 8) +
             196 * 512 * 16 * 16 * 3)
  assert speed.forward_macs(model, config, 224) == encoder + decoder
  whole = _vit_macs(768, 3072, 12, 12, 16, 224, 0)
  assert 4.0 < whole / encoder < 4.1  # 197 tokens against 50, and N^2.


def test_benchmark_reports_its_options_and_the_compiled_bytes():
  result = speed.run(
      "testing", batch=8, image_size=32, num_steps=2, model_options=dict(
          parallel_block=True, qk_norm=True), mu_dtype="bfloat16")
  assert result["parallel_block"] and result["qk_norm"]
  assert result["use_bias"] and result["mu_dtype"] == "bfloat16"
  assert len(
      result["losses"]) == 2 and result["final_loss"] == result["losses"][-1]
  memory = result["compiled_memory"]
  assert memory["total_bytes"] >= memory["argument_bytes"] > 0
  assert result["bytes_accessed"] > memory["argument_bytes"]


def test_benchmark_reports_speed_and_mfu():
  result = speed.run("testing", batch=8, image_size=32, num_steps=2,
                     peak_tflops=1.0)
  assert result["images_per_sec"] == pytest.approx(8 / result["step_s"])
  assert result["compile_s"] > 0 and result["peak_host_rss_gib"] > 0
  assert result["mfu"] == pytest.approx(
      result["model_tflops_per_sec"] / jax.device_count())
  assert result["forward_gmacs_per_image"] * 1e9 == _vit_macs(
      16, 32, 2, 2, 4, 32, 1000)


def test_profile_says_where_the_time_goes():
  result = speed.run("testing", batch=8, image_size=32, num_steps=1,
                     profile_steps=2)
  profile = result["profile"]
  assert profile.get("device_ms_per_step", 0) > 0, profile
  assert sum(profile["share_by_kind"].values()) == pytest.approx(1.0)
  assert profile["top_ops"] and all(
      0 < op["share"] <= 1 for op in profile["top_ops"])
  # The CPU runtime's spans around the ops are not counted as ops.
  assert not any("ThunkExecutor" in op["name"] for op in profile["top_ops"])


@pytest.mark.parametrize(
    "name, kind",
    [("nvjet_sm90_tst_128x160_64x5_2x1_v_bz_NNT", "matmul"),
     ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16",
      "fused attention"), ("loop_convert_multiply_fusion_11", "other fusion"),
     ("dot.3", "matmul"), ("transpose_copy_fusion.1", "copy/transpose"),
     ("all-reduce.2", "collective")])
def test_ops_are_sorted_into_kinds(name, kind):
  assert profiling.kind_of(name) == kind


def test_an_empty_device_plane_leaves_the_hosts_ops_counted():
  """libtpu, once loaded in a process (to compile for a TPU), adds a device
  plane with no events to every trace; on CPU the ops are the host's."""
  event = lambda name, ns: types.SimpleNamespace(name=name, duration_ns=ns)
  line = lambda name, *events: types.SimpleNamespace(name=name, events=events)
  plane = lambda name, *lines: types.SimpleNamespace(name=name, lines=lines)
  profile = types.SimpleNamespace(planes=[
      plane("/device:CUSTOM:Megascale Trace"),
      plane("/device:TPU:0", line("XLA Ops")),
      plane(
          "/host:CPU",
          line("XLA Ops", event("dot.1", 3), event("ThunkExecutor::Execute", 9),
               event("fusion.2", 1)))
  ])
  assert list(profiling._device_events(profile)) == [("dot.1", 3),
                                                     ("fusion.2", 1)]
