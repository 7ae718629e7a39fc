"""What we know of each accelerator, per chip: memory, dense bf16 peak, and
the bandwidths of its memory and of its links to other chips.

Keyed by what JAX reports as `device.device_kind`. A TPU v5p reports
"TPU v5" and a v5e "TPU v5 lite", so the longest matching key wins. When a
chip shows up as several devices (a TPU v4 without megacore: one device
per TensorCore), each device gets its share.
"""

import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class Chip:
  hbm_gib: float  # High-bandwidth memory per chip.
  bf16_tflops: float  # Dense bf16 peak per chip.
  hbm_gbps: float  # Memory bandwidth, GB/s.
  link_gbps: float  # Chip-to-chip bandwidth (ICI; NVLink on GPUs), GB/s.


# Sources: cloud.google.com/tpu/docs/{v4,v5e,v5p,v6e} ("Interchip
# Interconnect BW" in Gbps / 8); NVIDIA's H100, H200 and A100 datasheets
# (SXM parts: HBM bandwidth; NVLink bandwidth, both directions together).
CHIPS = {
    "TPU v4": Chip(32, 275, 1200, 2400 / 8),
    "TPU v5 lite": Chip(16, 197, 819, 1600 / 8),  # v5e
    "TPU v5": Chip(95, 459, 2765, 4800 / 8),  # v5p
    "TPU v6 lite": Chip(32, 918, 1640, 3584 / 8),  # v6e (Trillium)
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
  """(HBM, chip-to-chip) bytes/s per device; None for an unknown chip."""
  chip = chip_of(device_kind)
  if chip is None:
    return None
  return (chip.hbm_gbps * 1e9 / devices_per_chip,
          chip.link_gbps * 1e9 / devices_per_chip)
