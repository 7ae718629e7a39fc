"""What a compiled step moves between devices and where its time goes:
the counts of `vit_jax/performance/{hlo,communication,roofline}.py` against
hand-computed programs."""

import dataclasses

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import optax
import pytest

from vit_jax import objectives
from vit_jax import sharding
from vit_jax.models import variants
from vit_jax.performance import communication
from vit_jax.performance import hlo
from vit_jax.performance import planning
from vit_jax.performance import roofline
from vit_jax.training import fsdp
from vit_jax.training import train_state

MESH_2x2 = {"data": 2, "model": 2}


def _compiled_text(fn, mesh, *shapes):
  args = [
      jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(
          mesh, spec)) for shape, spec in shapes
  ]
  return jax.jit(fn).lower(*args).compile().as_text()


def test_collectives_are_counted_over_what_executes():
  """Per device, on a 2 x 2 mesh, a local f32[8, 128] (4 KiB) block: three
  loop iterations of an all-reduce over `data` (2 x 1/2 x 4 KiB each), an
  all-gather over `model` (1 x 4 KiB) and a reduce-scatter of the gathered
  8 KiB over `model` (1/2 x 8 KiB); then one permute over `data` (4 KiB)."""
  mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "model"))

  def step(x):

    def body(c, _):
      c = jax.lax.psum(c, "data") * 0.5
      g = jax.lax.all_gather(c, "model", tiled=True)
      return jax.lax.psum_scatter(g * 1.5, "model", scatter_dimension=0,
                                  tiled=True), None

    c, _ = jax.lax.scan(body, x, None, length=3)
    return jax.lax.ppermute(c, "data", perm=[(0, 1), (1, 0)])

  sharded = jax.shard_map(step, mesh=mesh, in_specs=P("data", "model"),
                          out_specs=P("data", "model"), check_vma=False)
  text = _compiled_text(sharded, mesh, ((16, 256), P("data", "model")))
  found = communication.collectives(text, MESH_2x2)
  assert sorted((c.kind, c.runs, c.bytes_per_run, c.axes) for c in found) == [
      ("all-gather", 3, 4096, ("model",)),
      ("all-reduce", 3, 4096, ("data",)),
      ("collective-permute", 1, 4096, ("data",)),
      ("reduce-scatter", 3, 4096, ("model",)),
  ]
  totals = communication.totals(found)
  assert totals["bytes"] == 10 * 4096
  assert totals["by_axes"] == {"data": 4 * 4096, "model": 6 * 4096}


# What XLA leaves of a scanned loop whose first iteration it peeled out
# (seen in TPU programs of several slices): the counter starts at 1, not 0.
_PEELED_LOOP = """HloModule peeled, num_partitions=2

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

%body (p: (s32[], f32[8,128])) -> (s32[], f32[8,128]) {
  %p = (s32[], f32[8,128]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[8,128]{1,0} get-tuple-element(%p), index=1
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %r = f32[8,128]{1,0} all-reduce(%x), replica_groups={{0,1}}, to_apply=%add
  ROOT %out = (s32[], f32[8,128]{1,0}) tuple(%next, %r)
}

%cond (q: (s32[], f32[8,128])) -> pred[] {
  %q = (s32[], f32[8,128]{1,0}) parameter(0)
  %n = s32[] constant(12)
  %j = s32[] get-tuple-element(%q), index=0
  ROOT %lt = pred[] compare(%j, %n), direction=LT
}

ENTRY %main (x0: f32[8,128]) -> f32[8,128] {
  %x0 = f32[8,128]{1,0} parameter(0)
  %start = s32[] constant(1)
  %counter = s32[] copy(%start)
  %init = (s32[], f32[8,128]{1,0}) tuple(%counter, %x0)
  %loop = (s32[], f32[8,128]{1,0}) while(%init), condition=%cond, body=%body
  ROOT %result = f32[8,128]{1,0} get-tuple-element(%loop), index=1
}
"""


def test_a_loop_that_starts_past_zero_runs_its_bound_less_its_start():
  """A counter from 1 while below 12: 11 runs of the all-reduce (each 1/2
  of 4 KiB out per device), not 12."""
  computations = hlo.parse_module(_PEELED_LOOP)
  assert hlo.execution_counts(computations)["body"] == 11
  found = communication.collectives(_PEELED_LOOP, {"data": 2})
  assert [(c.kind, c.runs, c.bytes_per_run) for c in found] == [("all-reduce",
                                                                 11, 4096)]
  # A start that is not a constant is taken as 0 (the bound, as a scan's);
  # one at or past the bound runs the body no time.
  unread = _PEELED_LOOP.replace("%counter = s32[] copy(%start)",
                                "%counter = s32[] parameter(1)")
  assert hlo.execution_counts(hlo.parse_module(unread))["body"] == 12
  past = _PEELED_LOOP.replace("s32[] constant(1)\n  %counter",
                              "s32[] constant(20)\n  %counter")
  assert past != _PEELED_LOOP
  assert hlo.execution_counts(hlo.parse_module(past))["body"] == 0


@pytest.mark.parametrize("groups, expected", [
    ("replica_groups={{0,2},{1,3}}, x", [[0, 2], [1, 3]]),
    ("replica_groups=[2,2]<=[4], x", [[0, 1], [2, 3]]),
    ("replica_groups=[2,2]<=[2,2]T(1,0), x", [[0, 2], [1, 3]]),
    ("replica_groups=mesh['a'=2,'b'=2] {'a'}, x", [[0, 2], [1, 3]]),
    ("replica_groups=mesh['a'=2,'b'=2] {'a','b'}, x", [[0, 1, 2, 3]]),
    ("replica_groups={}, x", [[0, 1, 2, 3]]),
])
def test_replica_groups_in_each_of_xlas_forms(groups, expected):
  assert hlo.device_groups(groups, 4) == expected


# One async all-reduce of f32[1024] over 4 devices (2 x 3/4 x 4 KiB = 6 KiB
# sent) started before a 256^3 matmul (2 x 256^3 FLOPs) and waited for after.
_SCHEDULED = """HloModule m, is_scheduled=true

ENTRY %main (p0: f32[256,256], p1: f32[1024]) -> f32[256,256] {
  %p0 = f32[256,256]{1,0} parameter(0)
  %p1 = f32[1024]{0} parameter(1)
  %start = f32[1024]{0} START(%p1), channel_id=1, replica_groups={{0,1,2,3}}
  %dot = f32[256,256]{1,0} dot(%p0, %p0), lhs_contracting_dims={1}
  %done = f32[1024]{0} all-reduce-done(%start)
  ROOT %out = f32[256,256]{1,0} negate(%dot)
}
"""


@pytest.mark.parametrize("seconds_to_send, exposed", [(0.5, 0.0), (2.0, 1.0)])
def test_an_async_collective_overlaps_the_compute_before_its_done(
    seconds_to_send, exposed):
  """The matmul takes 1 s at these rates (memory traffic is free); the
  transfer takes `seconds_to_send`; only what outlasts the matmul waits."""
  rates = roofline.Rates(flops=2 * 256**3, hbm=1e30, ici=6144 / seconds_to_send)
  text = _SCHEDULED.replace("START", "all-reduce-start")
  t = roofline.step_time(text, {"data": 4}, rates)
  assert t["compute_s"] == pytest.approx(1.0)
  assert t["interconnect_s"] == pytest.approx(seconds_to_send)
  assert t["exposed_communication_s"] == pytest.approx(exposed)
  assert t["est_step_s"] == pytest.approx(1.0 + exposed)
  assert t["overlapped_fraction"] == pytest.approx(1 -
                                                   exposed / seconds_to_send)
  # Issued synchronously, it overlaps nothing.
  text = _SCHEDULED.replace("START", "all-reduce").replace(
      "%done = f32[1024]{0} all-reduce-done(%start)\n", "")
  t = roofline.step_time(text, {"data": 4}, rates)
  assert t["overlapped_fraction"] == 0.0
  assert t["est_step_s"] == pytest.approx(1.0 + seconds_to_send)


# TPU7x's form of the same all-reduce: an asynchronous call on the
# SparseCore thread whose computation holds the collective.
_SPARSECORE = "\n".join([
    "HloModule m, is_scheduled=true",
    "%offloaded (a: f32[1024]) -> f32[1024] {",
    "  %a = f32[1024]{0} parameter(0)",
    ("  ROOT %ar = f32[1024]{0} all-reduce(%a), channel_id=1, "
     "replica_groups={{0,1,2,3}}, to_apply=%sum"),
    "}",
    "%sum (x: f32[], y: f32[]) -> f32[] {",
    "  %x = f32[] parameter(0)",
    "  %y = f32[] parameter(1)",
    "  ROOT %s = f32[] add(%x, %y)",
    "}",
    "ENTRY %main (p0: f32[256,256], p1: f32[1024]) -> f32[256,256] {",
    "  %p0 = f32[256,256]{1,0} parameter(0)",
    "  %p1 = f32[1024]{0} parameter(1)",
    ("  %start = ((f32[1024]{0}), f32[1024]{0}) call-start(%p1), "
     'async_execution_thread="sparsecore", to_apply=%offloaded'),
    "  %dot = f32[256,256]{1,0} dot(%p0, %p0), lhs_contracting_dims={1}",
    "  %done = f32[1024]{0} call-done(%start)",
    "  ROOT %out = f32[256,256]{1,0} negate(%dot)",
    "}",
])


def test_an_all_reduce_offloaded_to_sparsecores_is_counted_and_overlaps():
  found = communication.collectives(_SPARSECORE, {"data": 4})
  assert [(c.kind, c.bytes, c.runs) for c in found] == [("all-reduce", 6144, 1)]
  rates = roofline.Rates(flops=2 * 256**3, hbm=1e30, ici=6144 / 0.5)
  t = roofline.step_time(_SPARSECORE, {"data": 4}, rates)
  assert t["interconnect_s"] == pytest.approx(0.5)
  assert t["exposed_communication_s"] == pytest.approx(0.0)
  assert t["est_step_s"] == pytest.approx(1.0)


def test_matmul_flops_are_exact_and_counted_once_per_loop_iteration():
  mesh = Mesh(np.array(jax.devices()[:1]), ("data",))

  def fn(x, w):
    return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None,
                        length=5)[0]

  text = _compiled_text(fn, mesh, ((64, 128), P()), ((128, 128), P()))
  t = roofline.step_time(text, {"data": 1}, roofline.Rates(1.0, 1.0, 1.0))
  assert t["flops"] == 5 * 2 * 64 * 128 * 128


def test_batched_matmuls_written_as_convolutions_count_only_real_work(
    digits_config):
  """On TPU, XLA writes attention's batched matmuls as convolutions over
  padded windows; counting every window position would count the layers'
  FLOPs several times. The compiled step's count is the same whether the
  layers are scanned or not, and close to XLA's own count of the unrolled
  program (which adds the elementwise work). ViT-Ti/16's width with two
  blocks: the unrolled program compiles in a sixth of the time of twelve."""
  variants.register(
      "ViT-Ti/16, 2 blocks",
      dataclasses.replace(variants.VARIANTS["ViT-Ti/16"], num_layers=2))
  plans = {}
  for scan in (False, True):
    with digits_config.unlocked():
      digits_config.model.variant = "ViT-Ti/16, 2 blocks"
      digits_config.image_size = 32
      digits_config.batch_size = 8
      digits_config.model.scan_layers = scan
    plans[scan] = planning.plan(digits_config, "v5e:2x2")
  counted = plans[True]["flops_per_step"]
  assert counted == pytest.approx(plans[False]["flops_per_step"], rel=1e-6)
  assert 0.9 < counted / plans[True]["model_flops_per_step"] < 1.2


def test_the_least_a_sharding_must_move(digits_config):
  """Replicated: every gradient all-reduced (2 x 3/4 of its bytes on 4
  devices). FSDP: block weights gathered twice, the rest once, and every
  gradient reduce-scattered (3/4 of the bytes each time); this config
  computes in float32, so nothing is cast."""
  mesh = sharding.make_mesh(4, 1, jax.devices()[:4])
  model = objectives.model(objectives.decide(digits_config), 10)
  for strategy in ("replicate", "fsdp"):
    with digits_config.unlocked():
      digits_config.sharding.params = ((".*", strategy),)
      digits_config.sharding.fsdp_min_size = 0
    state, shardings = train_state.abstract_train_state(
        model, optax.sgd(0.1), 16, mesh, digits_config.sharding)
    split = {
        "/".join(k.key for k in path): "data" in tuple(spec.spec) for path, spec
        in jax.tree_util.tree_leaves_with_path(shardings.params)
    }
    sizes = {
        "/".join(k.key for k in path): leaf.size * 4 for path, leaf in
        jax.tree_util.tree_leaves_with_path(state.params)
    }
    replicated = sum(v for k, v in sizes.items() if not split[k])
    total = sum(v for k, v in sizes.items() if split[k])
    in_blocks = sum(v for k, v in sizes.items()
                    if split[k] and k.startswith("Transformer/encoderblock_"))
    least = communication.minimum(state.params, shardings.params, mesh,
                                  jnp.float32,
                                  fsdp.blocks_gather(model, shardings.params))
    if strategy == "replicate":
      assert least["by_kind"] == {
          "all-gather": 0.0,
          "reduce-scatter": 0.0,
          "all-reduce": pytest.approx(1.5 * (total + replicated))
      }
    else:
      assert least["by_kind"] == {
          "all-gather": pytest.approx(0.75 * (total + in_blocks)),
          "reduce-scatter": pytest.approx(0.75 * total),
          "all-reduce":
              pytest.approx(1.5 * replicated)  # The head's bias:
      }  # 10 classes do not split over 4 devices.
      assert 0 < replicated < 0.01 * total


def test_fsdp_gradients_are_reduce_scattered_not_all_reduced(digits_config):
  """The compiled step (cpu:4) sums each FSDP gradient into its shard; an
  all-reduce of whole gradients (what the step did before) fails this."""
  with digits_config.unlocked():
    digits_config.sharding.params = ((".*", "fsdp"),)
    digits_config.sharding.fsdp_min_size = 0
  moved = planning.plan(digits_config, "cpu:4")["communication"]
  assert moved["by_kind"]["reduce-scatter"] == pytest.approx(
      moved["minimum_by_kind"]["reduce-scatter"])
  # Left to all-reduce: the head's bias (10 classes do not split over 4
  # devices) and the scalar metrics.
  assert moved["by_kind"][
      "all-reduce"] < 0.05 * moved["by_kind"]["reduce-scatter"]


# A `ppermute` around a ring of two slices, as libtpu compiles it for one
# slice of 16 devices: the pairs inside it a collective-permute, the one
# pair leaving each slice a transfer to the multi-slice runtime.
_PAIRS = ",".join(f"{{{i},{i + 1}}}" for i in range(15))
_TO_RUNTIME = ('_xla_host_transfer_handler_name="xla_megascale_runtime",'
               '_xla_host_transfer_rendezvous="ppermute.19_0",'
               "_xla_megascale_target={{100015->200000},{200015->100000}},"
               '_xla_megascale_transfer_type="ONE_TO_ONE"')
_RING_OF_TWO_SLICES = f"""HloModule ring, num_partitions=16

ENTRY %main (x: f32[128,64]) -> f32[128,64] {{
  %x = f32[128,64]{{1,0}} parameter(0)
  %p = f32[128,64]{{1,0}} collective-permute(%x), channel_id=1, \
source_target_pairs={{{_PAIRS}}}
  %token = token[] after-all()
  %send = (f32[128,64]{{1,0}}, u32[], token[]) send(%x, %token), \
channel_id=4, is_host_transfer=true, frontend_attributes={{{_TO_RUNTIME}}}
  ROOT %out = f32[128,64]{{1,0}} add(%p, %x)
}}
"""


def test_a_ring_over_two_slices_sends_one_hop_each_over_dcn():
  """SigLIP's ring over (slice, data): 15 of a slice's 16 devices send
  their 32 KiB chunk over ICI, one over DCN (per device: 15/16 and 1/16
  of the chunk)."""
  found = communication.collectives(_RING_OF_TWO_SLICES, {
      "slice": 2,
      "data": 16,
      "model": 1
  })
  chunk = 128 * 64 * 4
  by_link = {c.dcn: c.bytes for c in found}
  assert by_link == {False: chunk * 15 / 16, True: chunk / 16}
  assert {c.kind for c in found} == {"collective-permute"}
