"""What we know of each accelerator, per chip: memory, dense bf16 peak, and
the bandwidths of its memory, of its links to other chips and of its share
of the data-centre network between slices; how a set of devices lies on
chips; and the XLA options our steps compile with on each backend.

Keyed by what JAX reports as `device.device_kind`. A TPU v5p reports
"TPU v5" and a v5e "TPU v5 lite", so the longest matching key wins. A chip
may show up as several devices: TPU v2, v3, v4 (without megacore) and
TPU7x make each of their two TensorCores a device, and each device gets its
share of the chip. A v5p (and a v4 in megacore mode) makes its two cores one
device.
"""

import dataclasses
import functools
import os
from typing import Optional
from typing import Sequence

from absl import logging


@dataclasses.dataclass(frozen=True)
class Chip:
  hbm_gib: float  # High-bandwidth memory per chip.
  bf16_tflops: float  # Dense bf16 peak per chip.
  hbm_gbps: float  # Memory bandwidth, GB/s.
  # Chip-to-chip bandwidth (ICI; NVLink on GPUs), GB/s; None: unpublished.
  link_gbps: Optional[float]
  # Data-centre network (DCN, between TPU slices), GB/s each way: the chip's
  # share of its host's NICs; None: unpublished.
  dcn_gbps: Optional[float] = None


# Sources, by key:
# - TPU v2, v3, v4: cloud.google.com/tpu/docs/{v2,v3,v4}, "Peak compute per
#   chip" and "HBM2 capacity and bandwidth". The v2 and v3 pages give the
#   interconnect only per Pod (all-reduce and bisection bandwidth), not per
#   chip, so their step time is not estimated. v4: "Interchip Interconnect
#   BW" 2400 Gbps / 8.
# - v5e, v5p, v6e: cloud.google.com/tpu/docs/{v5e,v5p,v6e}; the link is the
#   "Interchip Interconnect BW" in Gbps / 8, which is half the pages'
#   "bidirectional" figure (v5e 400 GBps, v5p 1200 GBps).
# - TPU7x (Ironwood): cloud.google.com/tpu/docs/tpu7x (2307 bf16 TFLOPs and
#   192 GiB per chip) and Google's Ironwood announcement (7.37 TB/s of HBM,
#   1.2 TBps bidirectional ICI, halved as for v5e and v5p).
# - DCN, from the same pages: v5e "Per-host NIC configuration 2 x 100 Gbps
#   NIC" for 8 chips per host (and "Data center network bandwidth per Pod
#   6.4 Tbps" over 256 chips: the same 25 Gbps per chip); v6e "4 x 200 Gbps
#   NIC" per 8-chip host (25.6 Tbps per 256-chip Pod); v5p "Data center
#   network (DCN) bandwidth per chip (Gbps) 50". NIC rates are each way.
#   The v2, v3, v4 and TPU7x pages give none per chip or host (TPU7x: two
#   NICs per 4-chip VM, their rate unsaid), so theirs is None.
# - NVIDIA's H100, H200 and A100 datasheets (SXM parts: HBM bandwidth;
#   NVLink bandwidth, both directions together).
CHIPS = {
    "TPU v2": Chip(16, 45, 600, None),
    "TPU v3": Chip(32, 123, 900, None),
    "TPU v4": Chip(32, 275, 1200, 2400 / 8),
    "TPU v5 lite": Chip(16, 197, 819, 1600 / 8, 2 * 100 / 8 / 8),  # v5e
    "TPU v5": Chip(95, 459, 2765, 4800 / 8, 50 / 8),  # v5p
    "TPU v6 lite": Chip(32, 918, 1640, 3584 / 8, 4 * 200 / 8 / 8),  # v6e
    "TPU7x": Chip(192, 2307, 7370, 1200 / 2),  # Ironwood
    "H100": Chip(80, 989, 3350, 900),
    "H200": Chip(141, 989, 4800, 900),
    "A100": Chip(40, 312, 1555, 600),
    "A100-SXM4-80GB": Chip(80, 312, 2039, 600),
    "A100 80GB": Chip(80, 312, 2039, 600),
}


def chip_of(device_kind: str) -> Optional[Chip]:
  matches = [k for k in CHIPS if k in device_kind]
  return CHIPS[max(matches, key=len)] if matches else None


def hbm_bytes(device_kind: str, devices_per_chip: int = 1) -> Optional[int]:
  chip = chip_of(device_kind)
  return int(chip.hbm_gib * 2**30 / devices_per_chip) if chip else None


def peak_flops(device_kind: str, devices_per_chip: int = 1) -> Optional[float]:
  chip = chip_of(device_kind)
  return chip.bf16_tflops * 1e12 / devices_per_chip if chip else None


def bandwidths(device_kind: str,
               devices_per_chip: int = 1) -> Optional[tuple[float, float]]:
  """(HBM, chip-to-chip) bytes/s per device; None for an unknown chip or
  one whose interconnect bandwidth per chip is not published."""
  chip = chip_of(device_kind)
  if chip is None or chip.link_gbps is None:
    return None
  return (chip.hbm_gbps * 1e9 / devices_per_chip,
          chip.link_gbps * 1e9 / devices_per_chip)


def dcn_bandwidth(device_kind: str,
                  devices_per_chip: int = 1) -> Optional[float]:
  """DCN bytes/s per device, each way; None where unpublished."""
  chip = chip_of(device_kind)
  if chip is None or chip.dcn_gbps is None:
    return None
  return chip.dcn_gbps * 1e9 / devices_per_chip


def missing_dcn(device_kind: str) -> str:
  """Why no DCN time can be estimated for this device ('' if it can)."""
  if dcn_bandwidth(device_kind) is not None:
    return ""
  return (f"Google publishes no data-centre network bandwidth per chip or "
          f"host for a {device_kind}; pass --dcn_gbps")


def missing_rates(device_kind: str) -> str:
  """Why no step time can be estimated for this device ('' if it can)."""
  chip = chip_of(device_kind)
  if chip is None:
    return "no rates known for this device"
  if chip.link_gbps is None:
    return (f"Google publishes no chip-to-chip bandwidth per chip for a "
            f"{device_kind}")
  return ""


@dataclasses.dataclass(frozen=True)
class Placement:
  """How devices lie on chips and hosts."""
  devices: int
  chips: int
  cores_per_chip: int  # TensorCores (1 where a chip does not say).
  devices_per_chip: int
  hosts: int
  tpu: bool = False

  def describe(self) -> str:
    """E.g. '4 chips x 2 cores, a device per core' (empty for devices
    that are not TPU chips)."""
    if not self.tpu:
      return ""
    cores = (f"{self.chips} chips x {self.cores_per_chip} "
             f"core{'s' if self.cores_per_chip > 1 else ''}")
    if self.devices_per_chip == 1:
      return f"{cores}, a device per chip" + (" (megacore)" if
                                              self.cores_per_chip > 1 else "")
    return f"{cores}, a device per core"


def placement(devices: Sequence) -> "Placement":
  """Chips, cores per chip and hosts of `devices`. TPU devices name their
  chip's place (`coords`, and `slice_index` across slices); any other
  device is a chip of its own."""
  tpu = devices[0].platform == "tpu"
  places = {(getattr(d, "slice_index", 0), tuple(d.coords)) if tpu else id(d)
            for d in devices}
  per_chip = max(len(devices) // len(places), 1)
  cores = per_chip * (getattr(devices[0], "num_cores", 1) if tpu else 1)
  return Placement(len(devices), len(places), cores, per_chip,
                   len({d.process_index for d in devices}), tpu)


# XLA's options every jitted step of ours (training, evaluation, `predict`,
# few-shot features) compiles with on a CPU, on top of XLA's own defaults:
# what benchmarks/cpu_sweep.sh found faster with the same results
# (docs/speed.md has the tables).
CPU_COMPILER_OPTIONS = {}
# Set to 0, our defaults are off (XLA's own apply); an option named in
# XLA_FLAGS keeps the value given there.
DEFAULTS_VARIABLE = "VIT_JAX_XLA_DEFAULTS"


def compiler_options() -> dict:
  """The XLA options our jitted functions compile with on the default
  backend (`CPU_COMPILER_OPTIONS` on a CPU; none elsewhere), less those
  XLA_FLAGS sets (the user's value wins) and all of them where
  VIT_JAX_XLA_DEFAULTS=0. Read at each jit, so a process may change
  either; said once at debug level."""
  import jax  # pylint: disable=g-import-not-at-top
  if (jax.default_backend() != "cpu" or
      os.environ.get(DEFAULTS_VARIABLE, "1") == "0"):
    return {}
  flags = os.environ.get("XLA_FLAGS", "")
  options = {
      name: value
      for name, value in CPU_COMPILER_OPTIONS.items()
      if f"--{name}=" not in flags
  }
  _say_once(tuple(sorted(options.items())))
  return options


@functools.cache
def _say_once(options: tuple):
  if options:
    logging.debug(
        "XLA options of our CPU steps: %s (%s=0 turns them off; XLA_FLAGS "
        "overrides each).", ", ".join(f"{k}={v}" for k, v in options),
        DEFAULTS_VARIABLE)
