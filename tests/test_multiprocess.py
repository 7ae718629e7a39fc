"""Two processes on localhost (JAX's CPU collectives) train as one.

The multi-host command of docs/scaling.md runs twice, with 2 or 4 fake CPU
devices per process; the checkpoint they write together equals, bit for
bit, one process training on as many devices with the same global batches
(process 0's share, then process 1's) and the same collectives
(`tests/helpers/gloo_reference.py`).
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
from PIL import Image
import pytest

from tests.helpers import gloo_reference
from tests.helpers import processes
from vit_jax import objectives
from vit_jax import sharding
from vit_jax.data import input_pipeline
from vit_jax.data import specs
from vit_jax.training import optim
from vit_jax.training import train_state

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 4
DEVICES_PER_PROCESS = 2
OVERRIDES = {
    "total_steps": STEPS,
    "checkpoint_every_steps": STEPS,
    "eval_every_steps": 0,
    "optimizer": "sgd",
    "lr": 0.1,
    "sharding.params": ((".*", "fsdp"),),
    "sharding.fsdp_min_size": 0
}


def _launch_two_processes(
    workdir, data_dir, overrides=None, sigterm_process_1_at=None, flags=(),
    kill_process_1_at=None, flags_of=None, devices=DEVICES_PER_PROCESS):
  """Runs the multi-host command (docs/scaling.md) twice (with `flags` added),
  each process with `devices` CPU devices; optionally sends SIGTERM (or
  SIGKILL) to process 1 alone once process 0 logs `sigterm_process_1_at`
  (`kill_process_1_at`). Returns ([return codes], [(stdout, stderr)]), and
  with `kill_process_1_at` the seconds process 0 took to exit after the
  kill."""
  port = gloo_reference.free_port()
  env = processes.command_env(devices)
  procs = []
  for process_id in range(2):
    cmd = [
        sys.executable, "-m", "vit_jax", "train",
        "--config=configs/digits.py:runlocal", f"--workdir={workdir}",
        f"--config.data_dir={data_dir}",
        f"--coordinator_address=localhost:{port}", "--num_processes=2",
        f"--process_id={process_id}", *flags,
        *(flags_of or {}).get(process_id, ())
    ]
    cmd += [f"--config.{k}={v}" for k, v in (overrides or OVERRIDES).items()]
    procs.append(
        subprocess.Popen(cmd, cwd=REPO, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE))
  outputs = [([], []) for _ in procs]
  readers = [
      threading.Thread(
          target=lambda f=f, lines=lines: lines.extend(iter(f.readline, "")),
          daemon=True)
      for proc, output in zip(procs, outputs)
      for f, lines in zip((proc.stdout, proc.stderr), output)
  ]
  for reader in readers:
    reader.start()
  signal_at = sigterm_process_1_at or kill_process_1_at
  try:
    if signal_at is not None:
      deadline = time.time() + 300
      while not any(signal_at in line for line in outputs[0][1]):
        assert time.time() < deadline and procs[0].poll() is None, ("".join(
            outputs[0][1])[-3000:])
        time.sleep(0.05)
      procs[1].send_signal(
          signal.SIGKILL if kill_process_1_at else signal.SIGTERM)
    sent = time.time()
    codes = [proc.wait(timeout=400) for proc in procs]
    seconds = time.time() - sent
  except BaseException:  # A hung or failed launch must not outlive the test.
    for proc in procs:
      proc.kill()
    raise
  for reader in readers:
    reader.join(timeout=30)
  outputs = [("".join(out), "".join(err)) for out, err in outputs]
  return (codes, outputs, seconds) if kill_process_1_at else (codes, outputs)


def _restore(config, workdir, step, devices):
  """The parameters the processes saved at `step`, restored onto this
  process's first `devices` devices, laid out as the config's mesh."""
  mesh = sharding.mesh_from_config(config, jax.devices()[:devices])
  source = input_pipeline.make_source(specs.training(config))
  model = objectives.model(objectives.decide(config), source.num_classes)
  tx, _ = optim.make_optimizer(config, config.total_steps)
  target, _ = train_state.abstract_train_state(model, tx, config.image_size,
                                               mesh, config.sharding)
  return ocp.StandardCheckpointer().restore(
      os.path.join(workdir, "checkpoints", str(step), "default"), target).params


def _assert_same(params, expected: dict):
  """Bit for bit, every parameter."""
  got = gloo_reference.flat_params(params)
  assert got.keys() == expected.keys()
  for path, value in got.items():
    np.testing.assert_array_equal(value, expected[path], err_msg=path)


def test_two_slices_equal_one_process_and_resume_before_a_damaged_checkpoint(
    digits_config, tmp_path):
  """Two processes stand for two TPU slices (config.mesh.slices=2: each
  process's 4 devices are a slice) training SigLIP on the built-in
  captions: FSDP inside each slice, the batch split across both, the
  sigmoid loss's ring of `ppermute`s crossing from one slice (and process)
  to the other; the state equals one process's on the same mesh bit for
  bit, and only process 0 reports the zero-shot accuracy and recall. Then
  they restore together: one that cannot restore the newest step marks it
  and the run stops (exit 75); the rerun sets the step aside and resumes
  from the one before."""
  from tests.test_checkpoint import _damage
  workdir = tmp_path / "two"
  # Not prepared yet: process 0 prepares it while process 1 waits.
  data_dir = str(tmp_path / "tfds")
  overrides = {
      **OVERRIDES, "checkpoint_every_steps": 2,
      "mesh.slices": 2,
      "objective": "siglip",
      "dataset": "digits_captions",
      "text.variant": "testing",
      "text.length": 8,
      "text.embedding_dim": 16
  }
  codes, outputs = _launch_two_processes(str(workdir), data_dir, overrides,
                                         devices=4)
  assert codes == [0, 0], _stderr_tails(outputs)
  # Evaluated at the end on the 360 test digits and their 50 captions, by
  # process 0 alone.
  said = outputs[0][0].split()
  assert {"zeroshot/num_examples=360", "retrieval/num_texts=50"} <= set(said)
  assert "zeroshot/" not in outputs[1][0]
  assert "mesh {'slice': 2, 'data': 4, 'model': 1}" in outputs[0][1]

  assert "digits_captions downloaded and prepared" in outputs[0][0]
  assert "prepared" not in outputs[1][0]
  expected = gloo_reference.compute(data_dir, overrides, 8, STEPS)
  digits_config.data_dir = data_dir
  gloo_reference.apply_overrides(digits_config, overrides)
  saved = _restore(digits_config, workdir, STEPS, devices=8)
  # FSDP inside each slice: every kernel is split over `data`, whole
  # across `slice`.
  kernel = saved["img"]["Transformer"]["encoderblock_0"]["MlpBlock_3"][
      "Dense_0"]["kernel"]
  assert tuple(kernel.sharding.spec) == (None, "data")
  _assert_same(saved, gloo_reference.params_of(expected, "after"))

  _damage(workdir / "checkpoints" / str(STEPS), "truncated")
  overrides["total_steps"] = STEPS + 2
  codes, outputs = _launch_two_processes(str(workdir), data_dir, overrides,
                                         devices=4)
  assert codes == [75, 75], _stderr_tails(outputs)
  said = "".join(err for _, err in outputs)
  assert f"The checkpoint at step {STEPS} in " in said
  assert ("it is marked damaged, and rerunning every process resumes from "
          "the step before.") in said

  codes, outputs = _launch_two_processes(str(workdir), data_dir, overrides,
                                         devices=4)
  assert codes == [0, 0], _stderr_tails(outputs)
  assert f"Resuming at step {STEPS - 2} from" in outputs[0][1]
  assert sorted(os.listdir(workdir / "checkpoints")) == [
      str(STEPS - 2),
      str(STEPS), f"{STEPS}.damaged",
      str(STEPS + 2)
  ]


def test_two_processes_distil_from_a_teacher_split_over_both(
    digits_config, tfds_data_dir, tmp_path):
  """Distillation with the teacher split by FSDP over both processes'
  devices, as the student is: the checkpoint equals one process's on the
  same devices bit for bit; only process 0 records the teacher and reports
  its accuracy (the digits teacher's own, 98.9%)."""
  teacher = os.path.join(REPO, "configs", "teachers", "digits.npz")
  overrides = {
      **OVERRIDES, "objective": "distill",
      "distill.teachers": (teacher,),
      "mixup.alpha": 1.0
  }
  workdir = tmp_path / "two"
  codes, outputs = _launch_two_processes(str(workdir), tfds_data_dir, overrides)
  assert codes == [0, 0], _stderr_tails(outputs)
  assert "distill/teacher_accuracy=0.988889" in outputs[0][0]
  assert "distill/" not in outputs[1][0]
  assert (workdir / "teachers.json").exists()
  expected = gloo_reference.compute(tfds_data_dir, overrides,
                                    2 * DEVICES_PER_PROCESS, STEPS)
  gloo_reference.apply_overrides(digits_config, overrides)
  _assert_same(_restore(digits_config, workdir, STEPS, 2 * DEVICES_PER_PROCESS),
               gloo_reference.params_of(expected, "after"))


def _image_folder(root):
  """ROOT/{train,test}/CLASS/*.png: 10 classes of 16x16 images."""
  rng = np.random.default_rng(0)
  for split, count in (("train", 12), ("test", 4)):
    for c in range(10):
      os.makedirs(root / split / f"class_{c}")
      for i in range(count):
        pixels = rng.integers(0, 50, (16, 16, 3)) + 20 * c
        Image.fromarray(pixels.astype(np.uint8)).save(
            root / split / f"class_{c}" / f"{i}.png")
  return f"folder:{root}"


def _stderr_tails(outputs) -> str:
  """The end of each process's stderr, before the list of extension modules
  that a fatal Python error appends (it would hide the reason)."""
  return "\n".join(
      err.split("\nExtension modules:")[0][-4000:] for _, err in outputs)


def _preempted_after_step_4(workdir, data_dir, overrides):
  """Two processes, process 1 sent SIGTERM once step 4 is logged: both
  exit 143 (as on GKE). Returns (the step they saved, their outputs)."""
  codes, outputs = _launch_two_processes(workdir, data_dir, overrides,
                                         sigterm_process_1_at="Step 4/",
                                         flags=["--preempted_exit_code=143"])
  assert codes == [143, 143], _stderr_tails(outputs)
  step = int(
      float(re.search(r"preempted_at_step=([\d.]+)", outputs[0][0]).group(1)))
  return step, outputs


def test_a_preempted_then_killed_run_resumed_on_one_process_ends_where_it_would(
    digits_config, tfds_data_dir, tmp_path):
  """One run meets both faults and a change of host count, so it is
  launched three times, not five.

  Preemption of one host (SIGTERM to process 1): all processes agree on a
  step (JAX's preemption sync point), save it together and exit with the
  status asked for (what a Kubernetes pod's restart policy reads). The
  rerun resumes there; then process 1 is killed (SIGKILL: no notice, no
  save), and process 0 names it in one line and exits with 75 within
  --lost_process_timeout (and a beat or two). The third run, on one
  process with the devices of both (and gloo's collectives, which sum in
  the same order however the devices are spread), resumes from the last
  checkpoint and ends bit for bit where an uninterrupted run does: records
  are read by index, so the global batches are the same on any number of
  processes. The run is MAE's, whose masking is drawn from the seed and
  the step for the global batch: it too is the same on any number of
  processes and after a resume.
  """
  total, timeout_s, devices = 20, 4, 2 * DEVICES_PER_PROCESS
  folder = _image_folder(tmp_path / "images")
  overrides = {
      **OVERRIDES,
      "total_steps": total,
      "log_every_steps": 4,
      "checkpoint_every_steps": 5,
      "dataset": folder,
      "decay_type": "constant",  # The last steps count fully.
      "lr": 0.02,  # Stable: lr 0.1 diverges, and amplifies drift.
      "objective": "mae",
      "mae.decoder_width": 16,
      "mae.decoder_depth": 1,
      "mae.decoder_heads": 2,
      "mae.decoder_mlp_dim": 32
  }
  workdir = str(tmp_path / "run")
  step, outputs = _preempted_after_step_4(workdir, tfds_data_dir, overrides)
  assert 4 < step < total
  for _, err in outputs:  # Both stopped at that step.
    assert f"Stopped at step {step} after a preemption notice" in err
  saved = [
      int(d)
      for d in os.listdir(os.path.join(workdir, "checkpoints"))
      if d.isdigit()
  ]
  assert max(saved) == step  # Saved there, beside the regular steps.
  # Process 0 listed the folder once, for both, into the workdir.
  assert [f for f in os.listdir(workdir) if f.startswith("folder_index_")]
  assert "Listed" in outputs[0][1] and "Listed" not in outputs[1][1]

  codes, outputs, seconds = _launch_two_processes(
      workdir, tfds_data_dir, overrides, kill_process_1_at="Step 16/",
      flags=[f"--lost_process_timeout={timeout_s}"])
  assert f"Resuming at step {step}" in outputs[0][1]
  assert codes == [75, -signal.SIGKILL], _stderr_tails(outputs)
  assert seconds < timeout_s + 10, seconds
  errors = [line for line in outputs[0][1].splitlines() if "error:" in line]
  assert errors == [
      f"error: process 1 of 2 has sent no heartbeat for {timeout_s} s "
      "(killed, crashed or its host is gone); process 0 stops too. Rerun "
      "every process to resume from the last checkpoint."
  ]
  assert "Traceback" not in outputs[0][1]

  cmd = [
      sys.executable, "-m", "vit_jax", "train",
      "--config=configs/digits.py:runlocal", f"--workdir={workdir}",
      f"--config.data_dir={tfds_data_dir}",
      f"--coordinator_address=localhost:{gloo_reference.free_port()}",
      "--num_processes=1", "--process_id=0"
  ] + [f"--config.{k}={v}" for k, v in overrides.items()]
  done = subprocess.run(
      cmd, cwd=REPO, capture_output=True, text=True,
      timeout=600, env=processes.command_env(
          devices, JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo"))
  assert done.returncode == 0, done.stderr[-3000:]
  resumed = int(re.search(r"Resuming at step (\d+)", done.stderr).group(1))
  assert step <= resumed <= 15
  expected = gloo_reference.compute(tfds_data_dir, overrides, devices, total,
                                    also_before_last=True)
  gloo_reference.apply_overrides(digits_config, overrides)
  final = _restore(digits_config, workdir, total, devices=devices)
  _assert_same(final, gloo_reference.params_of(expected, "after"))
  # One step less moves the parameters: the check can fail.
  with pytest.raises(AssertionError):
    _assert_same(final, gloo_reference.params_of(expected, "before"))


@pytest.mark.parametrize("failing", [0, 1])
def test_an_error_in_one_process_stops_the_other_at_once(
    tfds_data_dir, tmp_path, failing):
  """One process alone meets a mistake (a dataset that does not exist) after
  both joined the run: it exits with its one line, and the other, which
  would wait for it in a collective, stops at once naming it (process 0,
  which runs the coordination service, waits for the other to go first)."""
  other = 1 - failing
  codes, outputs = _launch_two_processes(
      str(tmp_path / "run"), tfds_data_dir,
      flags_of={failing: ["--config.dataset=no_such_dataset"]})
  assert codes[failing] == 2 and codes[other] == 75, _stderr_tails(outputs)
  errors = [[line
             for line in err.splitlines()
             if line.startswith("error:")]
            for _, err in outputs]
  assert len(errors[failing]) == 1 and "no_such_dataset" in errors[failing][0]
  assert errors[other] == [
      f"error: process {failing} of 2 stopped: {errors[failing][0]}; process "
      f"{other} stops too. Rerun every process to resume from the last "
      "checkpoint."
  ], _stderr_tails(outputs)


def test_two_processes_leave_out_and_list_unreadable_images(
    tfds_data_dir, tmp_path):
  """Each process leaves out the broken files it meets and lists them in
  its own file; together they name every one, and the console counts each
  once."""
  folder = _image_folder(tmp_path / "images")
  broken = []
  for split in ("train", "test"):
    for c in (0, 5):
      path = tmp_path / "images" / split / f"class_{c}" / "broken.png"
      path.write_bytes(b"<html>not an image</html>")
      broken.append(str(path))
  overrides = {**OVERRIDES, "dataset": folder, "max_unreadable_share": 0.5}
  workdir = tmp_path / "run"
  codes, outputs = _launch_two_processes(str(workdir), tfds_data_dir, overrides)
  assert codes == [0, 0], _stderr_tails(outputs)
  listed = []
  for i in range(2):
    listed += (workdir /
               f"unreadable_files.process{i}.txt").read_text().splitlines()
  # Each process lists the files it met; both read from the whole split, so
  # both may meet a file (in different epochs), and it is counted once.
  assert sorted(set(listed)) == sorted(broken)
  assert "Left out 4 unreadable images so far" in outputs[0][1]
  said = re.findall(r"Left out (\d+) unreadable", outputs[0][1])
  assert max(map(int, said)) == 4
  assert "(2 unreadable images left out)" in outputs[0][1]
