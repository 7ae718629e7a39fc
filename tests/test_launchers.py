"""The TPU VM and SLURM launchers, run for real against stand-ins.

`tests/helpers/launch_fakes/bin/gcloud` records its calls and plays a slice
whose workers are folders: `scp` copies into them and `ssh` runs the command
there with bash, so `launch/tpu_pod.sh` drives the real
`launch/setup_host.sh` and `launch/tpu_worker.sh` on every "worker"; it
also plays the slices of a queued resource (Multislice), each a TPU VM of
its own. The workers' python3 is a stand-in of a chosen version (Google's
Ubuntu 22.04 TPU images: 3.10), and so are uv, the venv's pip and python,
and a `vit-jax` that logs steps until SIGTERM.
"""

import os
import signal
import subprocess
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKES = os.path.join(REPO, "tests", "helpers", "launch_fakes")


class Slice:
  """Runs launch/tpu_pod.sh against a fake slice of `workers` workers, or
  against the named `slices` of a queued resource, of `workers` each."""

  def __init__(self, root, workers, python_version, slices=()):
    self.root, self.workers, self.slices = root, workers, slices
    # gcloud's ssh key, as after a first use (see the first-contact test).
    (root / "home" / ".ssh").mkdir(parents=True)
    (root / "home" / ".ssh" / "google_compute_engine").write_text("")
    self.log = root / "calls.log"
    self.env = {
        "PATH": f"{FAKES}/bin:/usr/bin:/bin",
        "HOME": str(root / "home"),
        "FAKES_DIR": FAKES,
        "FAKE_LOG": str(self.log),
        "FAKE_ROOT": str(root / "slice"),
        "FAKE_WORKERS": str(workers),
        "FAKE_PYTHON_VERSION": python_version,
        "FAKE_SLICES": " ".join(slices),
        "VIT_JAX_START_SECONDS": "1"
    }  # How long `start` watches a run.

  def run(self, *args, ok=True, **env):
    done = subprocess.run([os.path.join(REPO, "launch", "tpu_pod.sh"), *args],
                          env={
                              **self.env,
                              **env
                          }, capture_output=True, text=True, timeout=120)
    if ok:
      assert done.returncode == 0, done.stdout + done.stderr
    return done

  def home(self, worker, tpu=""):
    return self.root / "slice" / tpu / f"worker{worker}"

  def calls(self, prefix=""):
    return [
        c for c in self.log.read_text().splitlines() if c.startswith(prefix)
    ]

  def kill_runs(self):
    for tpu in self.slices or [""]:
      for w in range(self.workers):
        self._kill(self.home(w, tpu) / "vit_jax" / "logs" / "train.pid")

  @staticmethod
  def _kill(pidfile):
    if pidfile.exists():
      try:
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
      except ProcessLookupError:
        pass


@pytest.fixture
def make_slice(tmp_path):
  made = []

  def make(workers=2, python_version="3.10.12", slices=()):
    made.append(
        Slice(tmp_path / f"slice{len(made)}", workers, python_version, slices))
    return made[-1]

  yield make
  for fake in made:
    fake.kill_runs()


def test_setup_on_a_python_3_10_image_fetches_python_3_13_with_uv(make_slice):
  fake = make_slice(workers=2, python_version="3.10.12")
  done = fake.run("setup", "my-tpu", "us-central2-b")
  assert "my-tpu: 2 workers." in done.stdout
  for w in range(2):
    # The install's line, then the device check every worker ran at once.
    assert f"worker {w}: Python 3.13.14, JAX 0.12.0.1\n" in done.stdout
    assert (f"worker {w}: Python 3.13.14, JAX 0.12.0.1, 4 TPU v5 lite devices "
            "here, 8 in 2 processes") in done.stdout
    assert fake.calls(f"worker{w}: ") == [
        f"worker{w}: python3 --version",  # launch/find_python.sh's question,
        f"worker{w}: python3 --version",  # then for the line it prints.
        f"worker{w}: python3 -m pip install --quiet --user uv",
        f"worker{w}: uv python install 3.13",
        f"worker{w}: uv venv --seed --python 3.13 .venv",
        f"worker{w}: pip install --quiet --upgrade pip",
        f"worker{w}: pip install --quiet -c constraints.txt -e .[tpu]"
    ]
    copy = fake.home(w) / "vit_jax"
    assert (copy / "setup.py").is_file()
    assert os.access(copy / "launch" / "tpu_worker.sh", os.X_OK)
    assert not (fake.home(w) / "vit_jax.tar.gz").exists()
  gcloud = fake.calls("gcloud ")
  assert gcloud[0] == ("gcloud compute tpus tpu-vm describe my-tpu "
                       "--zone=us-central2-b "
                       "--format=value(state,networkEndpoints.len())")
  assert gcloud[1].startswith("gcloud compute tpus tpu-vm scp ")
  assert gcloud[1].endswith("my-tpu:~/vit_jax.tar.gz --zone=us-central2-b "
                            "--worker=all --quiet")
  ssh = [c for c in gcloud if " ssh " in c]
  assert sorted(c.split("--worker=")[1][0] for c in ssh) == ["0", "0", "1", "1"]


def test_setup_on_a_new_enough_python_uses_it_and_a_rerun_keeps_the_venv(
    make_slice):
  fake = make_slice(workers=1, python_version="3.12.3")
  done = fake.run("setup", "my-tpu", "europe-west4-a")
  assert "worker 0: Python 3.12.3, JAX 0.12.0.1\n" in done.stdout
  assert fake.calls("worker0: ") == [
      "worker0: python3 --version", "worker0: python3 -m venv .venv",
      "worker0: pip install --quiet --upgrade pip",
      "worker0: pip install --quiet -c constraints.txt -e .[tpu]"
  ]
  stale = fake.home(0) / "vit_jax" / "stale_file.py"
  stale.write_text("")
  again = fake.run("setup", "my-tpu", "europe-west4-a")
  assert "worker 0: Python 3.12.3, JAX 0.12.0.1, 4 TPU v5 lite" in again.stdout
  assert "python3 -m venv" not in "".join(fake.calls("worker0: ")[4:])
  assert not stale.exists()  # The copy is replaced; .venv is kept.


def test_a_worker_that_fails_to_install_is_named_in_one_line(make_slice):
  fake = make_slice(workers=4)
  done = fake.run("setup", "my-tpu", "us-central2-b", ok=False,
                  FAKE_FAILING_WORKER="2")
  assert done.returncode == 1
  errors = done.stderr.strip().splitlines()
  assert len(errors) == 1, done.stderr
  assert errors[0].startswith(
      "error: setup failed on worker 2 of 4 (worker 2: ERROR: No matching "
      "distribution found for jax[tpu]==0.12.0.1); each worker's output is in ")
  kept = errors[0].rsplit(" ", 1)[1]
  with open(os.path.join(kept, "worker2.txt")) as output:
    assert "No matching distribution" in output.read()
  assert "worker 0: Python 3.13.14, JAX 0.12.0.1" in done.stdout
  assert not any("tpu_worker.sh check" in c for c in fake.calls("gcloud "))


def _wait_for(predicate, seconds=30):
  deadline = time.time() + seconds
  while not predicate():
    assert time.time() < deadline, "timed out"
    time.sleep(0.2)


def test_train_runs_detached_on_every_worker_then_stop_saves_and_resumes(
    make_slice):
  fake = make_slice(workers=2)
  fake.run("setup", "my-tpu", "us-central2-b")
  flags = ["--config=configs/pretrain.py:i1k", "--workdir=gs://b/run one"]
  done = fake.run("train", "my-tpu", "us-central2-b", *flags)
  for w in range(2):
    assert f"worker {w}: running (pid " in done.stdout
    args = fake.home(w) / "vit_jax_args"
    _wait_for(args.exists)
    # Every worker gets the same flags, quoting intact, and --distributed.
    assert args.read_text().splitlines() == ["train", "--distributed", *flags]

  log = fake.home(0) / "vit_jax" / "logs" / "train.log"
  _wait_for(lambda: "Step 2/1000" in log.read_text())
  status = fake.run("status", "my-tpu", "us-central2-b")
  assert "worker 0: running (pid " in status.stdout
  assert "worker 1: running (pid " in status.stdout
  follow = fake.run("logs", "my-tpu", "us-central2-b", ok=False,
                    FAKE_SSH_SECONDS="1")
  assert "Step 1/1000: loss 2.3" in follow.stdout

  again = fake.run("train", "my-tpu", "us-central2-b", *flags, ok=False)
  assert again.returncode == 1
  assert "error: train failed on worker 0,1 of 2 (worker 0: error: a run " \
      "is going (pid" in again.stderr

  stop = fake.run("stop", "my-tpu", "us-central2-b")
  for w in range(2):
    assert f"worker {w}: stopped after " in stop.stdout
  assert "after a preemption notice (SIGTERM)" in stop.stdout
  assert "not running" in fake.run("status", "my-tpu", "us-central2-b").stdout

  # Resuming is the same train command; the log keeps both runs.
  fake.run("train", "my-tpu", "us-central2-b", *flags)
  _wait_for(lambda: log.read_text().count("vit-jax train --distributed") == 2)
  fake.run("stop", "my-tpu", "us-central2-b")


def test_mount_shows_a_bucket_on_every_worker_once(make_slice):
  fake = make_slice(workers=2)
  fake.run("setup", "my-tpu", "us-central2-b")
  done = fake.run("mount", "my-tpu", "us-central2-b", "my-data")
  for w in range(2):
    target = fake.home(w) / "data" / "my-data"
    assert f"worker {w}: gs://my-data mounted at {target}" in done.stdout
  assert sorted(fake.calls("gcsfuse")) == [
      f"gcsfuse --implicit-dirs -o ro my-data {fake.home(w)}/data/my-data "
      f"(worker {w})" for w in range(2)
  ]
  again = fake.run("mount", "my-tpu", "us-central2-b", "my-data")
  assert "worker 1: gs://my-data is mounted at" in again.stdout
  assert len(fake.calls("gcsfuse")) == 2  # Not mounted twice.
  usage = fake.run("mount", "my-tpu", "us-central2-b", ok=False)
  assert usage.returncode == 2
  assert "error: name one bucket (no gs://)" in usage.stderr
  # A VM restarted: its mount is gone, and a run reading it is refused.
  (fake.home(1) / "data" / "my-data" / ".fake_mounted").unlink()
  done = fake.run("train", "my-tpu", "us-central2-b",
                  "--config=configs/pretrain.py:i1k", "--workdir=gs://b/r",
                  "--config.data_dir=~/data/my-data/tfds", ok=False)
  assert done.returncode == 1
  assert (f"{fake.home(1)}/data/my-data is not mounted (the VM restarted?); "
          "run: launch/tpu_pod.sh mount TPU ZONE my-data") in done.stderr


def test_a_run_that_fails_at_once_is_named_and_the_others_stopped(make_slice):
  fake = make_slice(workers=2)
  fake.run("setup", "my-tpu", "z")
  done = fake.run("train", "my-tpu", "z", "--config.totl_steps=5", ok=False,
                  FAKE_FAILING_WORKER="1")
  assert done.returncode == 1
  assert done.stderr.strip().splitlines() == [
      "error: train failed on worker 1 of 2 (worker 1: error: the run ended "
      "at once: error: the config has no field 'totl_steps'); each worker's "
      f"output is in {done.stderr.strip().rsplit(' ', 1)[1]}"
  ]
  # Worker 0 had started; it is stopped rather than left waiting for 1.
  status = fake.run("status", "my-tpu", "z")
  assert "worker 0: not running: Stopped at step" in status.stdout


def test_a_tpu_that_is_not_ready_is_refused(make_slice):
  fake = make_slice(workers=4)
  done = fake.run("status", "my-tpu", "z", ok=False, FAKE_STATE="CREATING")
  assert done.returncode == 1
  assert done.stderr.startswith("error: my-tpu is CREATING, not READY")
  assert fake.calls("gcloud ") == [
      "gcloud compute tpus tpu-vm describe my-tpu --zone=z "
      "--format=value(state,networkEndpoints.len())"
  ]


def test_the_first_ssh_goes_alone_so_gcloud_makes_its_key_once(make_slice):
  fake = make_slice(workers=3, python_version="3.11.9")
  os.remove(fake.env["HOME"] + "/.ssh/google_compute_engine")
  fake.run("status", "my-tpu", "z", ok=False)  # Nothing set up there yet.
  ssh = [c for c in fake.calls("gcloud ") if " ssh " in c]
  assert ssh[0].endswith("--worker=0 --quiet --command=true")
  assert len(ssh) == 4


def test_usage_and_unknown_commands(make_slice):
  fake = make_slice(workers=1)
  done = fake.run(ok=False)
  assert done.returncode == 2
  assert "launch/tpu_pod.sh setup  TPU ZONE" in done.stderr
  done = fake.run("deploy", "my-tpu", "z", ok=False)
  assert done.returncode == 2
  assert "error: unknown command 'deploy'" in done.stderr


def test_the_archive_is_the_committed_tree(make_slice):
  fake = make_slice(workers=1, python_version="3.11.9")
  fake.run("setup", "my-tpu", "z")
  listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout.split()
  copy = fake.home(0) / "vit_jax"
  for name in ("setup.py", "constraints.txt", "launch/setup_host.sh",
               "vit_jax/commands/train.py", "configs/pretrain.py"):
    assert name in listed and (copy / name).is_file(), name


def test_the_slices_of_a_queued_resource_are_set_up_and_run_as_one(make_slice):
  """Worker S/W is worker W of the S-th slice named; every command reaches
  every worker of every slice."""
  names = ["my-run-0", "my-run-1"]
  fake = make_slice(workers=2, python_version="3.12.3", slices=names)
  tpus = ",".join(names)
  done = fake.run("setup", tpus, "z")
  assert "my-run-0,my-run-1: 2 slices of 2 workers." in done.stdout
  for s, tpu in enumerate(names):
    for w in range(2):
      # All four processes start JAX together.
      assert (f"worker {s}/{w}: Python 3.12.3, JAX 0.12.0.1, 4 TPU v5 lite "
              "devices here, 16 in 4 processes") in done.stdout
      assert (fake.home(w, tpu) / "vit_jax" / "setup.py").is_file()
  gcloud = fake.calls("gcloud ")
  assert gcloud[:2] == [
      f"gcloud compute tpus tpu-vm describe {tpu} --zone=z "
      "--format=value(state,networkEndpoints.len())" for tpu in names
  ]
  assert [c.split()[6] for c in gcloud if " scp " in c] == [
      f"{tpu}:~/vit_jax.tar.gz" for tpu in names
  ]
  ssh = {
      (c.split()[5], c.split("--worker=")[1][0]) for c in gcloud if " ssh " in c
  }
  assert ssh == {(tpu, w) for tpu in names for w in "01"}

  # Every worker gets the same command; one that fails is named, and the
  # others, on either slice, are stopped.
  flags = ["--config=configs/pretrain.py:i1k", "--workdir=gs://b/run"]
  done = fake.run("train", tpus, "z", *flags, ok=False,
                  FAKE_FAILING_WORKER="my-run-1/0")
  assert done.stderr.startswith(
      "error: train failed on worker 1/0 of 4 (worker 1/0: error: the run "
      "ended at once: error: the config has no field 'totl_steps'); each "
      "worker's output is in "), done.stderr
  for tpu in names:
    for w in range(2):
      args = fake.home(w, tpu) / "vit_jax_args"
      assert args.read_text().splitlines() == ["train", "--distributed", *flags]
  status = fake.run("status", tpus, "z").stdout
  for worker in ("0/0", "0/1", "1/1"):
    assert f"worker {worker}: not running: Stopped at step" in status


def test_a_slice_not_found_or_not_named_is_refused(make_slice):
  fake = make_slice(workers=2, slices=["my-run-0", "my-run-1"])
  done = fake.run("status", "my-run-0,my-run-2", "z", ok=False)
  assert done.returncode == 1
  # After gcloud's own message:
  assert done.stderr.splitlines()[-1].startswith(
      "error: my-run-2 is not found, not READY")
  done = fake.run("status", "my-run-0,,my-run-1", "z", ok=False)
  assert (done.returncode, done.stderr) == (2, (
      "error: 'my-run-0,,my-run-1': name the TPU, or its slices "
      "comma-separated\n"))
  done = fake.run("logs", "my-run-0,my-run-1", "z", "2/0", ok=False)
  assert done.returncode == 2
  assert done.stderr.startswith("error: no worker 2/0; use W (0-1) or, on "
                                "several slices, S/W")
  assert not fake.calls("gcloud compute tpus tpu-vm ssh")


def test_slurm_runs_one_distributed_process_per_node(tmp_path):
  """The batch script under a stand-in srun that records its arguments."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  srun = bin_dir / "srun"
  srun.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$PWD" "$@" '
                  '> "$SRUN_LOG"\n')
  srun.chmod(0o755)
  log = tmp_path / "srun.log"
  done = subprocess.run(
      [
          "bash",
          os.path.join(REPO, "launch", "slurm.sbatch"),
          "--config=configs/pretrain.py:i1k", "--workdir=/shared/run one"
      ], env={
          "PATH": f"{bin_dir}:/usr/bin:/bin",
          "SRUN_LOG": str(log),
          "SLURM_SUBMIT_DIR": REPO
      }, capture_output=True, text=True, timeout=60)
  assert done.returncode == 0, done.stderr
  assert log.read_text().splitlines() == [
      REPO, "--kill-on-bad-exit=1", ".venv/bin/vit-jax", "train",
      "--distributed", "--config=configs/pretrain.py:i1k",
      "--workdir=/shared/run one"
  ]
  header = open(os.path.join(REPO, "launch", "slurm.sbatch")).read()
  assert "launch/setup_host.sh cuda" in header  # How to get Python 3.12+.
