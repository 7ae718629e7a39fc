"""The GKE manifests of launch/gke.py, rendered and read back: pods per
host, resources, node selectors, the processes' way to find each other
(within a slice and across slices), the restart policy, the grace period;
the Job inside each JobSet checked against Kubernetes' own schema
(kubernetes-validate, strict, offline: a client's --dry-run=client needs a
cluster to read the schema from), and its arguments against the flags
`vit-jax train` defines."""

import functools
import os
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE = "us-docker.pkg.dev/my-project/vit/vit-jax:tpu"
# The oldest and the newest Kubernetes the Job must be valid for.
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())


def _render(*args):
  return subprocess.run(
      [sys.executable,
       os.path.join(REPO, "launch", "gke.py"), *args], capture_output=True,
      text=True, timeout=60)


def _manifest(*args):
  done = _render(*args)
  assert done.returncode == 0, done.stderr
  return done.stdout, yaml.safe_load(done.stdout)


def _job(jobset, slices=1):
  [replicated] = jobset["spec"]["replicatedJobs"]
  assert replicated["replicas"] == slices
  return replicated["template"]["spec"]


def _container(jobset):
  [container] = _job(jobset)["template"]["spec"]["containers"]
  return container


def _check_common(jobset, name, hosts, workdir, grace=120, restarts=10,
                  slices=1):
  assert jobset["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
  assert jobset["metadata"]["name"] == name
  spec = jobset["spec"]
  assert spec["network"] == {
      "enableDNSHostnames": True,
      "publishNotReadyAddresses": True
  }
  # A failed pod fails its Job, and the JobSet restarts every pod...
  job = _job(jobset, slices)
  assert job["parallelism"] == job["completions"] == hosts
  assert job["completionMode"] == "Indexed" and job["backoffLimit"] == 0
  assert spec["failurePolicy"]["maxRestarts"] == restarts
  # ... except after a mistake in the command (exit 2), which would recur.
  [rule] = job["podFailurePolicy"]["rules"]
  assert rule == {
      "action": "FailJob",
      "onExitCodes": {
          "containerName": "vit-jax",
          "operator": "In",
          "values": [2]
      }
  }
  assert spec["failurePolicy"]["rules"] == [{
      "name": "command-error",
      "action": "FailJobSet",
      "onJobFailureReasons": ["PodFailurePolicy"]
  }]
  pod = job["template"]["spec"]
  assert pod["restartPolicy"] == "Never"
  assert pod["terminationGracePeriodSeconds"] == grace
  [container] = pod["containers"]
  assert container["args"][:4] == [
      "train", "--config=configs/pretrain.py:i1k", f"--workdir={workdir}",
      "--preempted_exit_code=143"
  ]  # A preempted run is not a finished one.
  # Nothing local holds the workdir; at most /dev/shm and a read-only data
  # bucket are volumes.
  for volume in pod.get("volumes", []):
    assert (volume == {
        "name": "shm",
        "emptyDir": {
            "medium": "Memory"
        }
    } or volume["csi"]["readOnly"])
  batch_job = {
      "apiVersion": "batch/v1",
      "kind": "Job",
      "metadata": {
          "name": f"{name}-workers-0"
      },
      "spec": job
  }
  for version in KUBERNETES_VERSIONS:
    kubernetes_validate.validate(batch_job, version, strict=True)


@functools.cache
def _train_flags() -> frozenset[str]:
  """The flags `vit-jax train` defines (read in a process of its own: the
  command's module defines them globally)."""
  done = subprocess.run([
      sys.executable, "-c",
      "import vit_jax.commands.train; from absl import flags; "
      "print(' '.join(flags.FLAGS))"
  ], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  return frozenset(done.stdout.split())


def _check_train_flags(args):
  """Every --flag of the manifest's command exists in `vit-jax train`."""
  for arg in args[1:]:
    name = arg[2:].split("=")[0]
    if not name.startswith("config."):
      assert name in _train_flags(), arg


def test_a_v5e_16_slice_is_4_pods_of_4_chips():
  text, jobset = _manifest(
      "--name=vit-b16", "--tpu=v5e:4x4", f"--image={IMAGE}",
      "--config=configs/pretrain.py:i1k", "--workdir=gs://bucket/runs/b16",
      "--", "--config.data_dir=gs://bucket/tfds")
  _check_common(jobset, "vit-b16", 4, "gs://bucket/runs/b16")
  # One slice, one node pool.
  topology = "alpha.jobset.sigs.k8s.io/exclusive-topology"
  assert jobset["metadata"]["annotations"] == {
      topology: "cloud.google.com/gke-nodepool"
  }
  pod = _job(jobset)["template"]["spec"]
  assert pod["nodeSelector"] == {
      "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
      "cloud.google.com/gke-tpu-topology": "4x4",
      "node.kubernetes.io/instance-type": "ct5lp-hightpu-4t"
  }
  container = _container(jobset)
  assert container["image"] == IMAGE
  assert container["resources"] == {
      "limits": {
          "google.com/tpu": 4
      },
      "requests": {
          "google.com/tpu": 4
      }
  }
  # GKE gives TPU pods the slice's host names; --distributed reads them.
  assert container["args"][4:] == [
      "--distributed", "--config.data_dir=gs://bucket/tfds"
  ]
  assert "env" not in container and "volumes" not in pod
  # One slice keeps the pod network (no DCN traffic to route).
  assert "hostNetwork" not in pod and "dnsPolicy" not in pod
  _check_train_flags(container["args"])
  assert ("--machine-type=ct5lp-hightpu-4t --tpu-topology=4x4 --num-nodes=4"
          in text)
  assert "kubectl delete jobset vit-b16" in text


def test_a_v5p_64_slice_is_8_pods():
  text, jobset = _manifest(
      "--name=vit-h14", "--tpu=v5p:2x4x4", f"--image={IMAGE}",
      "--config=configs/pretrain.py:i1k", "--workdir=gs://bucket/runs/h14",
      "--grace_seconds=300", "--max_restarts=50")
  _check_common(jobset, "vit-h14", 8, "gs://bucket/runs/h14", grace=300,
                restarts=50)
  pod = _job(jobset)["template"]["spec"]
  assert pod["nodeSelector"] == {
      "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
      "cloud.google.com/gke-tpu-topology": "2x4x4",
      "node.kubernetes.io/instance-type": "ct5p-hightpu-4t"
  }
  assert _container(jobset)["resources"]["limits"] == {"google.com/tpu": 4}
  assert "--machine-type=ct5p-hightpu-4t --tpu-topology=2x4x4" in text


def test_two_v5e_16_slices_are_two_jobs_of_4_pods_joined_over_dcn():
  text, jobset = _manifest(
      "--name=vit-g14", "--tpu=v5e:4x4", "--slices=2", f"--image={IMAGE}",
      "--config=configs/pretrain.py:i1k", "--workdir=gs://bucket/runs/g14")
  # A Job per slice, of the slice's 4 pods...
  _check_common(jobset, "vit-g14", 4, "gs://bucket/runs/g14", slices=2)
  # ... each Job in a node pool of its own.
  topology = "alpha.jobset.sigs.k8s.io/exclusive-topology"
  assert jobset["metadata"]["annotations"] == {
      topology: "cloud.google.com/gke-nodepool"
  }
  pod = _job(jobset, slices=2)["template"]["spec"]
  assert pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "4x4"
  [container] = pod["containers"]
  assert container["resources"]["limits"] == {"google.com/tpu": 4}
  assert container["args"][4:] == ["--distributed"]
  # libtpu and `--distributed` join the slices: host 0 of slice 0 by its
  # JobSet host name, the slice count, and each pod's slice, its Job's index.
  index = "jobset.sigs.k8s.io/job-index"
  assert container["env"] == [{
      "name": "MEGASCALE_COORDINATOR_ADDRESS",
      "value": "vit-g14-workers-0-0.vit-g14"
  }, {
      "name": "MEGASCALE_NUM_SLICES",
      "value": "2"
  }, {
      "name": "MEGASCALE_SLICE_ID",
      "valueFrom": {
          "fieldRef": {
              "fieldPath": f"metadata.annotations['{index}']"
          }
      }
  }]
  # DCN over the hosts' NICs; the pods keep their cluster DNS names.
  assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True,
                                                    "ClusterFirstWithHostNet")
  # The header asks for a node pool per slice and follows slice 0's host 0.
  assert "and 2 node pools, one per slice" in text
  assert "for i in $(seq 0 1); do" in text
  assert ("node-pools create vit-g14-pool-$i" in text and
          "--machine-type=ct5lp-hightpu-4t --tpu-topology=4x4 --num-nodes=4; "
          "done" in text)
  assert ("batch.kubernetes.io/job-completion-index=0,"
          "jobset.sigs.k8s.io/job-index=0") in text


def test_a_v5e_8_slice_is_one_host_of_8_chips_without_distributed():
  _, jobset = _manifest("--name=vit-s16", "--tpu=v5e:2x4", f"--image={IMAGE}",
                        "--config=configs/pretrain.py:i1k",
                        "--workdir=gs://bucket/runs/s16")
  _check_common(jobset, "vit-s16", 1, "gs://bucket/runs/s16")
  pod = _job(jobset)["template"]["spec"]
  # Not two hosts of 4 chips: a 2x4 node pool of either shape matches the
  # other labels.
  assert pod["nodeSelector"]["node.kubernetes.io/instance-type"] == \
      "ct5lp-hightpu-8t"
  container = _container(jobset)
  assert container["resources"]["limits"] == {"google.com/tpu": 8}
  assert container["args"][4:] == []  # One process: nothing to find.


def test_two_nodes_of_8_gpus_find_pod_0_by_its_jobset_host_name():
  text, jobset = _manifest(
      "--name=vit-gpu", "--gpu=nvidia-h100-80gb:8", "--hosts=2",
      "--image=us-docker.pkg.dev/my-project/vit/vit-jax:cuda",
      "--config=configs/pretrain.py:i1k", "--workdir=gs://bucket/runs/gpu",
      "--service_account=vit-trainer", "--", "--config.batch_size=1024")
  _check_common(jobset, "vit-gpu", 2, "gs://bucket/runs/gpu")
  job = _job(jobset)
  pod = job["template"]["spec"]
  assert pod["nodeSelector"] == {
      "cloud.google.com/gke-accelerator": "nvidia-h100-80gb"
  }
  assert pod["serviceAccountName"] == "vit-trainer"
  container = _container(jobset)
  assert container["resources"]["limits"] == {"nvidia.com/gpu": 8}
  # JobSet names pods <jobset>-<replicated job>-<job index>-<pod index>
  # under a headless service named like the JobSet.
  pod_0 = (f"{jobset['metadata']['name']}-"
           f"{jobset['spec']['replicatedJobs'][0]['name']}-0-0."
           f"{jobset['metadata']['name']}")
  assert container["args"][4:] == [
      f"--coordinator_address={pod_0}:8482", "--num_processes=2",
      "--process_id=$(VIT_JAX_PROCESS_ID)", "--config.batch_size=1024"
  ]
  [index] = container["env"]
  annotation = "batch.kubernetes.io/job-completion-index"
  assert index == {
      "name": "VIT_JAX_PROCESS_ID",
      "valueFrom": {
          "fieldRef": {
              "fieldPath": f"metadata.annotations['{annotation}']"
          }
      }
  }
  assert container["volumeMounts"] == [{"name": "shm", "mountPath": "/dev/shm"}]
  _check_train_flags(container["args"])
  assert ("--machine-type=a3-highgpu-8g --accelerator=type=nvidia-h100-80gb,"
          "count=8,gpu-driver-version=latest --num-nodes=2") in text


def test_a_data_bucket_is_mounted_read_only_for_records_read_by_index():
  _, jobset = _manifest(
      "--name=vit-b16", "--tpu=v5e:4x4", f"--image={IMAGE}",
      "--config=configs/pretrain.py:i1k", "--workdir=gs://bucket/runs/b16",
      "--data_bucket=my-data", "--", "--config.data_dir=/data/my-data/tfds")
  _check_common(jobset, "vit-b16", 4, "gs://bucket/runs/b16")
  job = _job(jobset)
  assert job["template"]["metadata"] == {
      "annotations": {
          "gke-gcsfuse/volumes": "true"
      }
  }
  assert job["template"]["spec"]["volumes"] == [{
      "name": "data",
      "csi": {
          "driver": "gcsfuse.csi.storage.gke.io",
          "readOnly": True,
          "volumeAttributes": {
              "bucketName": "my-data",
              "mountOptions": "implicit-dirs"
          }
      }
  }]
  assert _container(jobset)["volumeMounts"] == [{
      "name": "data",
      "mountPath": "/data/my-data",
      "readOnly": True
  }]


@pytest.mark.parametrize("args, message", [
    (["--tpu=v5e:4x4", "--workdir=/mnt/runs/b16"
     ], "--workdir='/mnt/runs/b16': use object storage (gs://BUCKET/PATH)"),
    (["--tpu=v3:4x4", "--workdir=gs://b/r"
     ], "the generation must be one of v4, v5e, v5p, v6e, tpu7x"),
    (["--tpu=v5p:4x4", "--workdir=gs://b/r"
     ], "a v5p topology has 3 sizes, e.g. v5p:2x2x2"),
    (["--tpu=v5p:1x1x1", "--workdir=gs://b/r"
     ], "1 chips are neither one v5p host (4 chips) nor hosts of 4"),
    (["--tpu=v6e:3x3", "--workdir=gs://b/r"
     ], "9 chips are neither one v6e host (1, 4, 8 chips) nor hosts of 4"),
    (["--gpu=nvidia-h100-80gb:8", "--workdir=gs://b/r"
     ], "--gpu needs --hosts, the number of nodes"),
    (["--tpu=v5e:4x4", "--hosts=4", "--workdir=gs://b/r"
     ], "a TPU slice's hosts follow from --tpu"),
    (["--tpu=v5e:4x4", "--workdir=gs://b/r", "--", "--workdir=gs://c"
     ], "--workdir=gs://c: give it to gke.py itself (before --)"),
    (["--tpu=v5e:4x4", "--slices=0", "--workdir=gs://b/r"
     ], "--slices=0: give the number of TPU slices, 1 or more"),
    (["--tpu=v5e:2x4", "--slices=2", "--workdir=gs://b/r"
     ], "GKE joins multi-host slices only, and v5e:2x4 is one host"),
    ([
        "--gpu=nvidia-h100-80gb:8", "--hosts=2", "--slices=2",
        "--workdir=gs://r"
    ], "--slices: only TPUs come in slices"),
])
def test_mistakes_get_one_line_that_names_the_fix(args, message):
  done = _render("--name=run", f"--image={IMAGE}", "--config=configs/digits.py",
                 *args)
  assert done.returncode == 2
  assert message in done.stderr.splitlines()[-1], done.stderr
  assert done.stdout == ""


def test_names_that_kubernetes_host_names_cannot_hold_are_refused():
  for name in ("Vit", "vit_b16", "-vit", "v" * 41):
    done = _render(f"--name={name}", f"--image={IMAGE}", "--tpu=v5e:2x2",
                   "--config=configs/digits.py", "--workdir=gs://b/r")
    assert done.returncode == 2 and "--name=" in done.stderr, name
  _, jobset = _manifest("--name=v" + "1" * 39, f"--image={IMAGE}",
                        "--tpu=v6e:1x1", "--config=configs/digits.py",
                        "--workdir=gs://b/r")
  assert _container(jobset)["resources"]["limits"] == {"google.com/tpu": 1}


def test_one_gpu_node_needs_no_coordinator():
  _, jobset = _manifest("--name=vit-gpu", "--gpu=nvidia-l4:4", "--hosts=1",
                        "--image=i:cuda", "--config=configs/pretrain.py:i1k",
                        "--workdir=gs://bucket/runs/gpu")
  _check_common(jobset, "vit-gpu", 1, "gs://bucket/runs/gpu")
  container = _container(jobset)
  assert container["args"][4:] == []
  assert container["resources"]["limits"] == {"nvidia.com/gpu": 4}
