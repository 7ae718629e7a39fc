"""What a compiled step moves between devices, and the least it must.

`collectives(text, mesh)` counts, per device and per step, the bytes each
collective of a compiled program sends, over what executes: an instruction
in a loop body counts once per iteration, one in a fusion once per run of
the fusion, an asynchronous start/done pair once; the pieces XLA splits one
collective into (a TPU async collective fusion's start, continuation and
done share its channel and chain ids) count once. Bytes sent per device,
for a group of n devices and a buffer of S bytes (the bandwidth-optimal
algorithms, which a ring or a torus dimension achieves):

  all-gather          (n - 1) / n x S, S the gathered result
  reduce-scatter      (n - 1) / n x S, S the input
  all-reduce          2 (n - 1) / n x S (a reduce-scatter, then an all-gather)
  all-to-all          (n - 1) / n x S
  collective-permute  S, for each device that sends

On several slices, what goes between them takes the data-centre network
(DCN); the rest the chips' own links (ICI). libtpu compiles a multi-slice
program for one slice's devices, its collectives inside the slice, and
sends what crosses slices as host transfers to its "megascale" runtime (a
`send` naming the collective it stands for and the slices it joins),
counted by the formulas above with n the slices joined and S the buffer's
logical bytes (the buffer sent is padded to TPU tiles). Elsewhere (CPU
devices split into slices) the program spans every device and a collective
whose groups (or pairs) span slices (`slice_of`: each mesh position's
slice) is DCN's.

`minimum(...)` is the least a strategy must move, from the parameters and
their shardings (see its docstring for the formulas).
"""

import dataclasses
import math
import re
from typing import Optional
from typing import Sequence

import jax
import numpy as np

from vit_jax import sharding
from vit_jax.models import scan
from vit_jax.performance import hlo

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all",
         "collective-permute")
_CHANNEL = re.compile(r"channel_id=(\d+)")
_CHAIN = re.compile(r'chain_id="(\d+)"')
_MEGASCALE = re.compile(r'_xla_megascale_target="\{([\d,:]*)\}x[^"]*",'
                        r'_xla_megascale_transfer_type="(\w+)"')
# A `ppermute`'s pairs that cross slices (SigLIP's ring): sent one to one,
# `{{A->B},{C->D}}`, each id its slice's index x 100000 + its device's.
_ONE_TO_ONE = re.compile(r"_xla_megascale_target=\{(\{\d+->\d+\}"
                         r"(?:,\{\d+->\d+\})*)\},_xla_megascale_transfer_type"
                         r'="ONE_TO_ONE"')
_PAIR = re.compile(r"\{(\d+)->(\d+)\}")
_SLICE_ID = 100_000
_RENDEZVOUS = re.compile(r'_xla_host_transfer_rendezvous="([^"]+)"')
_PARTITIONS = re.compile(r"\bnum_partitions=(\d+)")


@dataclasses.dataclass(frozen=True)
class Collective:
  kind: str  # One of KINDS.
  name: str  # The instruction (the first piece, where XLA split it).
  computation: str
  bytes_per_run: float  # Sent by one device, by one execution.
  runs: int  # Executions per step.
  axes: tuple[str, ...]  # The mesh axes its groups span.
  dcn: bool = False  # Its groups span slices.

  @property
  def bytes(self) -> float:
    return self.bytes_per_run * self.runs


def _kind(opcode: str) -> Optional[str]:
  base = opcode[:-len("-start")] if opcode.endswith("-start") else opcode
  return "all-to-all" if base == "ragged-all-to-all" else (
      base if base in KINDS else None)


def _operand_bytes(instruction: hlo.Instruction,
                   computation: hlo.Computation) -> float:
  """Bytes of the operands (the buffer a collective sends from)."""
  found = [computation.by_name.get(o) for o in instruction.operands]
  if found and all(found):
    if instruction.opcode == "collective-permute-start":
      found = found[:1]  # Later operands are in-place outputs and offsets.
    return sum(o.bytes for o in found)
  # Operands not named here: infer from the result.
  first = instruction.arrays()
  return hlo.type_bytes(
      instruction.type) if not first else (hlo.DTYPE_BYTES[first[0][0]] *
                                           math.prod(first[0][1]))


def _axes(groups_or_pairs, mesh_shape: dict[str, int]) -> tuple[str, ...]:
  """The mesh axes along which the devices of a group (or of each
  source-target pair) differ. Device ids are positions in the mesh's
  device order (row-major over its axes)."""
  names, sizes = list(mesh_shape), list(mesh_shape.values())
  varying = set()
  for group in groups_or_pairs:
    coords = np.array(np.unravel_index(np.array(group), sizes))
    varying |= {names[i] for i in range(len(names)) if len(set(coords[i])) > 1}
  return tuple(n for n in names if n in varying)


def _spans_slices(groups_or_pairs, slice_of: Optional[Sequence[int]]) -> bool:
  return slice_of is not None and any(
      len({slice_of[d] for d in group}) > 1 for group in groups_or_pairs)


def program_mesh(
    text: str, mesh_shape: dict[str,
                                int], slice_of: Optional[Sequence[int]] = None
) -> tuple[dict[str, int], int, Optional[Sequence[int]]]:
  """(the mesh a compiled program's replica groups index, its devices, the
  slice of each where its groups may span slices): the whole mesh and
  `slice_of`, or one slice's part of the mesh and None where libtpu
  compiled the program for one slice (fewer partitions than devices; its
  groups stay inside it): the `slice` axis, or the slice-major `data` axis
  spanning slices, divided by the slices."""
  total = math.prod(mesh_shape.values())
  found = _PARTITIONS.search(text[:text.find("\n")])
  partitions = int(found.group(1)) if found else total
  if partitions >= total or total % partitions:
    return mesh_shape, total, slice_of
  shape, slices = dict(mesh_shape), total // partitions
  for axis, size in shape.items():
    shape[axis] = size // math.gcd(size, slices)
    slices //= math.gcd(size, slices)
  return shape, partitions, None


def _megascale(instruction: hlo.Instruction) -> Optional[tuple[str, int]]:
  """(kind, slices joined) of a send to libtpu's multi-slice runtime; for
  a one-to-one transfer (a collective-permute's pairs between slices),
  ("collective-permute", -pairs each slice sends)."""
  if instruction.opcode != "send":
    return None
  pairs = _ONE_TO_ONE.search(instruction.attributes)
  if pairs:
    sources = [int(a) for a, _ in _PAIR.findall(pairs.group(1))]
    slices = len({a // _SLICE_ID for a in sources})
    return "collective-permute", -(len(sources) // max(slices, 1))
  found = _MEGASCALE.search(instruction.attributes)
  if not found:
    return None
  joined = 0
  for item in found.group(1).split(","):
    first, _, last = item.partition(":")
    joined += int(last or first) - int(first) + 1
  kind = found.group(2).lower().replace("_", "-")
  return (kind if kind in KINDS else "collective-permute"), joined


def _logical_bytes(instruction: hlo.Instruction,
                   computation: hlo.Computation) -> float:
  """Bytes of a sent buffer before its padding to TPU tiles (bitcasts and
  "ZeroCrop" custom calls, which widen it to whole tiles)."""
  found = computation.by_name.get(instruction.operands[0])
  size = found.bytes if found else hlo.type_bytes(instruction.type)
  while found is not None and (found.opcode == "bitcast" or
                               'custom_call_target="ZeroCrop"'
                               in found.attributes):
    found = computation.by_name.get(found.operands[0])
    size = min(size, found.bytes) if found else size
  return size


def megascale_recv(instruction: hlo.Instruction) -> bool:
  """Whether this receives a multi-slice transfer (its done ends one)."""
  return (instruction.opcode == "recv" and
          _RENDEZVOUS.search(instruction.attributes) is not None)


def channel(instruction: hlo.Instruction, computation: str = "") -> str:
  """What identifies one collective across the pieces XLA splits it into:
  a TPU async collective fusion's start, continuation and done carry the
  same channel and chain id; a multi-slice transfer's send and receive the
  same rendezvous. Elsewhere each instruction is its own (JAX may give
  many collectives one channel id)."""
  rendezvous = _RENDEZVOUS.search(instruction.attributes)
  if rendezvous:
    return f"rendezvous {rendezvous.group(1)}"
  chain = _CHAIN.search(instruction.attributes)
  found = _CHANNEL.search(instruction.attributes)
  if chain and found:
    return f"channel {found.group(1)} chain {chain.group(1)}"
  return f"{computation}/{instruction.name}"


def measure(instruction: hlo.Instruction, computation: hlo.Computation,
            mesh_shape: dict[str, int], num_devices: int,
            slice_of: Optional[Sequence[int]] = None,
            dcn_axes: tuple[str, ...] = (sharding.SLICE_AXIS,)):
  """(kind, bytes one device sends, mesh axes, whether over DCN) of a
  collective instruction (counted at its start), or of a multi-slice
  transfer (over `dcn_axes`); None for anything else."""
  megascale = _megascale(instruction)
  if megascale:
    kind, n = megascale
    size = _logical_bytes(instruction, computation)
    if n < 0:  # One to one: -n of the slice's devices send, the rest none.
      return kind, size * -n / num_devices, dcn_axes, True
    return kind, _sent(kind, n, size), dcn_axes, True
  kind = _kind(instruction.opcode)
  if kind is None:
    return None
  size = _operand_bytes(instruction, computation)
  if kind == "collective-permute":
    pairs = hlo.source_target_pairs(instruction.attributes)
    sent, groups = size * len(pairs) / num_devices, pairs
  else:
    groups = hlo.device_groups(instruction.attributes, num_devices)
    sent = _sent(kind, len(groups[0]), size)
  return kind, sent, _axes(groups, mesh_shape), _spans_slices(groups, slice_of)


def _sent(kind: str, n: int, size: float) -> float:
  """Bytes one device sends in a group of n, `size` the bytes it gives."""
  return {
      "all-gather": (n - 1) * size,
      "reduce-scatter": (n - 1) / n * size,
      "all-reduce": 2 * (n - 1) / n * size,
      "all-to-all": (n - 1) / n * size,
      "collective-permute": size,
  }[kind]


def collectives(text: str, mesh_shape: dict[str, int],
                slice_of: Optional[Sequence[int]] = None) -> list[Collective]:
  """Every collective of a compiled program's text, counted per step
  (`slice_of`: each mesh position's slice, where there are several)."""
  computations = hlo.parse_module(text)
  runs = hlo.execution_counts(computations)
  dcn_axes = (sharding.SLICE_AXIS,) if sharding.SLICE_AXIS in mesh_shape else (
      next(iter(mesh_shape)),)  # FSDP over slices: `data` spans them.
  mesh_shape, num_devices, slice_of = program_mesh(text, mesh_shape, slice_of)
  found: dict[tuple, Collective] = {}
  for computation in computations.values():
    for instruction in computation.instructions:
      measured = measure(instruction, computation, mesh_shape, num_devices,
                         slice_of, dcn_axes)
      if measured is None or runs[computation.name] == 0:
        continue
      kind, sent, axes, dcn = measured
      key = (kind, channel(instruction, computation.name))
      this = Collective(kind, instruction.name, computation.name, sent,
                        runs[computation.name], axes, dcn)
      if key not in found or found[key].runs < this.runs:
        found[key] = this
  return [c for c in found.values() if c.bytes > 0]


def totals(found: list[Collective]) -> dict:
  """Bytes per step and device: in all, by kind and by mesh axes; and of
  them, over DCN (by kind) and over ICI."""
  by_kind = {k: 0.0 for k in KINDS}
  dcn_by_kind = {k: 0.0 for k in KINDS}
  by_axes: dict[str, float] = {}
  for c in found:
    by_kind[c.kind] += c.bytes
    if c.dcn:
      dcn_by_kind[c.kind] += c.bytes
    axes = "+".join(c.axes) or "none"
    by_axes[axes] = by_axes.get(axes, 0.0) + c.bytes
  total, dcn = sum(by_kind.values()), sum(dcn_by_kind.values())
  return {
      "bytes": total,
      "by_kind": by_kind,
      "by_axes": by_axes,
      "ici_bytes": total - dcn,
      "dcn_bytes": dcn,
      "dcn_by_kind": dcn_by_kind,
  }


def minimum(abstract_params, params_sharding, mesh, compute_dtype,
            gathered_in_blocks: bool, activations: float = 0.0, *,
            data_slices: int = 1) -> dict:
  """The least a step must move per device, from the parameters' shardings.

  n is the size of the mesh's `data` axis; B a parameter's bytes on a
  device once gathered over `data` (its tensor-parallel split kept), in the
  dtype it travels in: the encoder blocks' kernels (two or more
  dimensions per layer) gathered in the compute dtype (the blocks cast them
  before gathering; their gradients come back in it); a replicated kernel's
  gradient in the compute dtype (the layer's matmul makes it so); the rest
  in their own dtype.

    replicated over data   its gradient all-reduced:  2 (n-1)/n x B
    FSDP (split over data) gathered for the forward pass, gathered again for
                           the backward pass where the encoder blocks
                           gather their own (`gathered_in_blocks`), and its
                           gradient reduce-scattered:  (2 or 1 + 1) (n-1)/n x B

  With tensor parallelism, `activations` (`tensor_parallel_activations`)
  are added as all-reduces. On s slices (the mesh's `slice` axis), every
  gradient is all-reduced over `slice`, over DCN, in the dtype it has over
  `data`, each of a slice's n devices taking its 1/n share (its FSDP shard;
  a replicated gradient is reduce-scattered over `data` first):
  2 (s-1)/s x B / n. Where `data` spans `data_slices` slices (FSDP over
  slices), its collectives cross them once, the rest inside each (so
  libtpu splits them): (data_slices - 1) / (n - 1) of what goes over `data`
  is DCN's. The result's `by_kind` counts both links, `dcn_bytes` DCN's.
  """
  n = mesh.shape[sharding.DATA_AXIS]
  s = mesh.shape.get(sharding.SLICE_AXIS, 1)
  blocks = set(scan.encoder_blocks(abstract_params))
  scanned = scan.is_scanned(abstract_params)
  parts = {"all-gather": 0.0, "reduce-scatter": 0.0, "all-reduce": activations}
  over_dcn = {"all-gather": 0.0, "reduce-scatter": 0.0, "all-reduce": 0.0}
  crossing = (data_slices - 1) / (n - 1) if n > 1 else 0.0

  def over_data(kind: str, sent: float):
    parts[kind] += (1 - crossing) * sent
    over_dcn[kind] += crossing * sent

  def add(path, leaf, spec):
    names = [getattr(k, "key", str(k)) for k in path]
    in_block = names[0] == scan.ENCODER and names[1] in blocks
    layer_ndim = leaf.ndim - (1 if in_block and scanned else 0)
    kernel = layer_ndim >= 2
    axes = jax.tree.leaves(tuple(spec.spec))
    fsdp = sharding.DATA_AXIS in axes
    if fsdp:  # Only the blocks' gather casts (fsdp.gather_over_data).
      cast = in_block and gathered_in_blocks and kernel
    else:  # The gradient leaves the layer in the compute dtype.
      cast = kernel
    dtype = compute_dtype if cast else leaf.dtype
    split = math.prod(mesh.shape[a]
                      for a in axes
                      if a is not None and a != sharding.DATA_AXIS)
    size = leaf.size * np.dtype(dtype).itemsize / split
    share = (n - 1) / n
    if fsdp:
      gathers = 2 if (in_block and gathered_in_blocks) else 1
      over_data("all-gather", gathers * share * size)
      over_data("reduce-scatter", share * size)
    else:
      over_data("all-reduce", 2 * share * size)
    over_dcn["all-reduce"] += 2 * (s - 1) / s * size / n

  jax.tree_util.tree_map_with_path(add, abstract_params, params_sharding)
  by_kind = {k: parts[k] + over_dcn[k] for k in parts}
  return {
      "bytes": sum(by_kind.values()),
      "by_kind": by_kind,
      "dcn_bytes": sum(over_dcn.values()),
      "dcn_by_kind": over_dcn
  }


def tensor_parallel_activations(batch_per_shard: int, tokens: int, hidden: int,
                                layers: int, model_devices: int,
                                dtype_bytes: int,
                                forward_recomputed: bool) -> float:
  """The least tensor parallelism (Megatron's split: attention heads and
  the MLP's hidden units over `model`) moves per device: each block's
  attention and MLP outputs all-reduced in the forward pass, their inputs'
  gradients in the backward pass, and, where remat recomputes the forward
  pass, the attention output again (the block's output is kept); each an
  activation of batch x tokens x hidden."""
  if model_devices == 1:
    return 0.0
  per_block = 4 + (1 if forward_recomputed else 0)
  size = batch_per_shard * tokens * hidden * dtype_bytes
  share = 2 * (model_devices - 1) / model_devices
  return layers * per_block * share * size
