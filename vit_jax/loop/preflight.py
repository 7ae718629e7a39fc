"""Before the first step: compile the train step for the real devices, log
its per-device memory, and stop now, not minutes later with an
out-of-memory error, where it cannot fit (`vit-jax plan` does the same
for devices that are not attached: `vit_jax/performance/planning.py`).
"""

from typing import Optional

from absl import logging
import jax

from vit_jax.errors import UserError


def memory_bytes(compiled) -> dict[str, int]:
  """Per-device bytes of a compiled executable (donated buffers counted
  once: outputs that alias arguments are not counted twice)."""
  stats = compiled.memory_analysis()
  out = {
      "argument_bytes": stats.argument_size_in_bytes,
      "output_bytes": stats.output_size_in_bytes,
      "alias_bytes": stats.alias_size_in_bytes,
      "temp_bytes": stats.temp_size_in_bytes
  }
  out["total_bytes"] = (out["argument_bytes"] + out["output_bytes"] -
                        out["alias_bytes"] + out["temp_bytes"])
  return out


def device_memory_limit(device) -> Optional[int]:
  """Bytes the backend lets one device use (None where it does not say,
  e.g. on CPU)."""
  stats = device.memory_stats()
  return (stats or {}).get("bytes_limit")


def check_fit(train_step, state, batch) -> dict[str, int]:
  """Compiles the train step for the real devices before the first step,
  logs its per-device memory, and fails now, not minutes later with an
  out-of-memory error, when it cannot fit."""
  memory = memory_bytes(train_step.compile(state, batch))
  limit = device_memory_limit(jax.local_devices()[0])
  gib = lambda b: f"{b / 2**30:.2f} GiB"
  logging.info(
      "Train step per device: arguments %s + temporaries %s + "
      "outputs %s - aliased %s = %s (device limit %s).",
      gib(memory["argument_bytes"]), gib(memory["temp_bytes"]),
      gib(memory["output_bytes"]), gib(memory["alias_bytes"]),
      gib(memory["total_bytes"]),
      gib(limit) if limit else "not reported")
  if limit and memory["total_bytes"] > limit:
    raise UserError(
        f"The compiled train step needs {gib(memory['total_bytes'])} per "
        f"device (arguments {gib(memory['argument_bytes'])}, temporaries "
        f"{gib(memory['temp_bytes'])}) but a device has {gib(limit)}. Lower "
        "config.batch_size or raise config.accum_steps, set "
        "config.model.remat='full', or shard the parameters "
        "(config.sharding.params=(('.*', 'fsdp'),)); `vit-jax plan` tries "
        "a setting without devices.")
  return memory
