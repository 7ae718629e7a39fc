r"""Writes the Kubernetes manifest of a training run on GKE: a JobSet with one
pod per host of a TPU slice or a GPU node pool, run from the container
image (Dockerfile), restarted whole on a failure and resumed from its
gs:// workdir.

    python3 launch/gke.py --name=vit-b16 --tpu=v5e:4x4 \
        --image=us-docker.pkg.dev/PROJECT/REPO/vit-jax:tpu \
        --config=configs/pretrain.py:i1k --workdir=gs://BUCKET/runs/vit-b16 \
        -- --config.data_dir=gs://BUCKET/tfds > vit-b16.yaml
    kubectl apply -f vit-b16.yaml

`--tpu=GENERATION:TOPOLOGY` names the slice as `vit-jax plan --topology`
does (v4, v5e, v5p, v6e, tpu7x); one pod per host: one host where the
slice fits one machine (e.g. v5e:2x4, 8 chips), else hosts of 4 chips.
`--gpu=TYPE:COUNT --hosts=N` takes N nodes of COUNT GPUs of GKE's TYPE
(`nvidia-h100-80gb`, ...). Flags after `--` go to `vit-jax train`. The
manifest's header says which node pools it needs and how to watch, stop and
resume the run. Needs PyYAML (in the project's .venv).

`--slices=N` (TPUs; default 1) runs on N slices of `--tpu`'s shape, each
a node pool of its own (GKE's Multislice; multi-host slices only):

    python3 launch/gke.py --name=vit-g14 --tpu=v5e:4x4 --slices=2 \
        --image=us-docker.pkg.dev/PROJECT/REPO/vit-jax:tpu \
        --config=configs/pretrain.py:i1k --workdir=gs://BUCKET/runs/vit-g14

Within a slice the chips talk over ICI; between slices only over the
data-centre network (DCN), which is far slower. So the slices split the
batch: vit_jax's mesh groups the devices by their `slice_index` into a
`slice` axis (`config.mesh.slices`), each slice lays out its share as one
slice would, and only the data-parallel reduction of the gradients crosses
DCN (unless `config.mesh.fsdp_over_slices`).

What the manifest does, and why:
- One Job of N indexed pods (`completionMode: Indexed`); JobSet gives them
  stable host names behind a headless service, so the processes find each
  other: on TPUs GKE tells each pod the slice's hosts (TPU_WORKER_HOSTNAMES)
  and `--distributed` reads them; on GPUs the pods are told pod 0's address
  and their index (`--coordinator_address`, `--process_id`).
- Several slices: the replicated Job has a replica, a Job, per slice, and
  the JobSet's exclusive-topology annotation gives each Job a node pool of
  its own. Every pod is told host 0 of slice 0 (JAX's process 0:
  MEGASCALE_COORDINATOR_ADDRESS), the slice count (MEGASCALE_NUM_SLICES)
  and its own slice, its Job's index (MEGASCALE_SLICE_ID, from the
  `jobset.sigs.k8s.io/job-index` annotation): libtpu joins the slices over
  DCN with them, and `--distributed` numbers the processes slice by slice.
  The pods use their hosts' network (`hostNetwork`, as Google's xpk runs
  Multislice), so DCN traffic goes straight to the hosts' NICs.
- A failure of any pod ends the Job (`backoffLimit: 0`) and the JobSet
  recreates every pod (`maxRestarts`), which resume from the last
  checkpoint. A run that stops after a preemption notice exits 143
  (`--preempted_exit_code`) so that it counts as a failure and restarts,
  not as a finished run. A mistake in the command (exit status 2) ends the
  JobSet at once: it would fail the same way again. A storage error that
  may pass (exit status 75) restarts it like a crash.
- Pods get `--grace_seconds` between SIGTERM and SIGKILL for the
  coordinated save (see `benchmarks/preemption_save.py`; on Spot VMs GKE
  gives less, whatever is asked).
- Nothing local is mounted: the workdir must be object storage, since every
  host writes checkpoint shards and a restarted pod may land elsewhere.
  `--data_bucket=BUCKET` mounts one bucket read-only at /data/BUCKET with
  GKE's Cloud Storage FUSE CSI driver (the pod's `gke-gcsfuse/volumes`
  annotation; the cluster needs the driver's add-on): TFDS datasets in
  ArrayRecord files are read by index from a local path only, so point
  `--config.data_dir` there (e.g. /data/BUCKET/tfds). With `--slices`
  above 1 the pods use the host's network, which the driver's sidecar
  supports only on recent GKE versions: check GKE's notes for yours (not
  tried here).
"""

import argparse
import math
import re
import sys

import yaml

# For each TPU generation: GKE's node label value, the prefix of its node
# pools' machine types, the chips per host those machines come with, and the
# number of dimensions of its topologies. A slice of one of those chip
# counts is one host; larger slices take hosts of 4 chips.
TPUS = {
    "v4": ("tpu-v4-podslice", "ct4p-hightpu-", (4,), 3),
    "v5e": ("tpu-v5-lite-podslice", "ct5lp-hightpu-", (1, 4, 8), 2),
    "v5p": ("tpu-v5p-slice", "ct5p-hightpu-", (4,), 3),
    "v6e": ("tpu-v6e-slice", "ct6e-standard-", (1, 4, 8), 2),
    "tpu7x": ("tpu7x", "tpu7x-standard-", (1, 4), 3),
}
# Machine types of GKE node pools with 8 GPUs of a type, for the header's
# node-pool command.
GPU_MACHINES = {
    "nvidia-h100-80gb": "a3-highgpu-8g",
    "nvidia-h100-mega-80gb": "a3-megagpu-8g",
    "nvidia-h200-141gb": "a3-ultragpu-8g",
    "nvidia-a100-80gb": "a2-ultragpu-8g",
    "nvidia-tesla-a100": "a2-highgpu-8g"
}
CONTAINER = "vit-jax"
EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
REPLICATED_JOB = "workers"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"  # A Job's index in its replicas.
PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM, what a killed process returns.
USER_ERROR_EXIT_CODE = 2  # vit_jax.cli: a mistake in the command.
COORDINATOR_PORT = 8482  # Any free port; JAX uses this one on TPU pods.
GRACE_SECONDS = 120
JOBSET_MANIFESTS = ("https://github.com/kubernetes-sigs/jobset/releases/"
                    "download/v0.12.0/manifests.yaml")
NAME = re.compile(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?")


class Hosts:
  """What the pods run on: node selector, resources per pod, pod count."""

  def __init__(self, selector, resources, count, pool_flags, summary):
    self.selector, self.resources, self.count = selector, resources, count
    self.pool_flags, self.summary = pool_flags, summary


def _count(number: int, noun: str) -> str:
  return f"{number} {noun}{'s' if number != 1 else ''}"


def tpu_hosts(spec: str) -> Hosts:
  generation, _, topology = spec.partition(":")
  if generation not in TPUS:
    raise ValueError(f"--tpu={spec!r}: the generation must be one of "
                     f"{', '.join(TPUS)}, as in v5e:4x4 or v5p:2x4x4")
  accelerator, machine_prefix, one_host, dims = TPUS[generation]
  sizes = topology.split("x")
  if len(sizes) != dims or not all(s.isdigit() and int(s) > 0 for s in sizes):
    raise ValueError(f"--tpu={spec!r}: a {generation} topology has {dims} "
                     f"sizes, e.g. {generation}:{'x'.join(['2'] * dims)}")
  chips = math.prod(int(s) for s in sizes)
  per_host = chips if chips in one_host else 4
  if chips % per_host:
    raise ValueError(f"--tpu={spec!r}: {chips} chips are neither one "
                     f"{generation} host ({', '.join(map(str, one_host))} "
                     "chips) nor hosts of 4")
  hosts, machine = chips // per_host, f"{machine_prefix}{per_host}t"
  return Hosts(
      {
          "cloud.google.com/gke-tpu-accelerator": accelerator,
          "cloud.google.com/gke-tpu-topology": topology,
          # A 2x4 slice is one host of 8 chips, or two of 4: say which.
          "node.kubernetes.io/instance-type": machine
      },
      {"google.com/tpu": per_host},
      hosts,
      f"--machine-type={machine} --tpu-topology={topology} "
      f"--num-nodes={hosts}",
      f"{generation} {topology}: {_count(chips, 'chip')} on "
      f"{_count(hosts, 'host')}")


def gpu_hosts(spec: str, count: int) -> Hosts:
  kind, _, per_host = spec.partition(":")
  if not kind.startswith("nvidia-") or per_host not in ("1", "2", "4", "8"):
    raise ValueError(f"--gpu={spec!r}: use GKE's accelerator name and the "
                     "GPUs per node, e.g. nvidia-h100-80gb:8")
  if count < 1:
    raise ValueError("--hosts: give the number of GPU nodes (1 or more)")
  machine = GPU_MACHINES.get(kind) if per_host == "8" else None
  return Hosts(
      {"cloud.google.com/gke-accelerator": kind},
      {"nvidia.com/gpu": int(per_host)}, count,
      f"--machine-type={machine or 'MACHINE_TYPE'} "
      f"--accelerator=type={kind},count={per_host},gpu-driver-version=latest "
      f"--num-nodes={count}", f"{_count(count, 'node')} of {per_host} {kind}")


def pod_0(args) -> str:
  """The stable host name of slice 0's host 0 (JAX's process 0): JobSet
  names pods <jobset>-<replicated job>-<job index>-<pod index> under a
  headless service named like the JobSet."""
  return f"{args.name}-{REPLICATED_JOB}-0-0.{args.name}"


def slice_env(args) -> list[dict]:
  """What JAX and libtpu read to join the slices over DCN: host 0 of slice
  0 (process 0, where JAX's coordinator runs), the slice count and this
  pod's slice, its Job's index. libtpu's port (MEGASCALE_PORT) keeps its
  default."""
  return [{
      "name": "MEGASCALE_COORDINATOR_ADDRESS",
      "value": pod_0(args)
  }, {
      "name": "MEGASCALE_NUM_SLICES",
      "value": str(args.slices)
  }, {
      "name": "MEGASCALE_SLICE_ID",
      "valueFrom": {
          "fieldRef": {
              "fieldPath": f"metadata.annotations['{JOB_INDEX}']"
          }
      }
  }]


def train_args(args, hosts: Hosts, gpu: bool) -> list[str]:
  command = [
      "train", f"--config={args.config}", f"--workdir={args.workdir}",
      f"--preempted_exit_code={PREEMPTED_EXIT_CODE}"
  ]
  if hosts.count == 1:
    return command + args.flags
  if not gpu:  # TPU: GKE's environment names the slice's hosts.
    return command + ["--distributed", *args.flags]
  return command + [
      f"--coordinator_address={pod_0(args)}:{COORDINATOR_PORT}",
      f"--num_processes={hosts.count}", "--process_id=$(VIT_JAX_PROCESS_ID)",
      *args.flags
  ]


def pod_spec(args, hosts: Hosts, gpu: bool) -> dict:
  container = {
      "name": CONTAINER,
      "image": args.image,
      "args": train_args(args, hosts, gpu),
      "resources": {
          "limits": dict(hosts.resources),
          "requests": dict(hosts.resources)
      }
  }
  spec = {
      "restartPolicy": "Never",
      "terminationGracePeriodSeconds": args.grace_seconds,
      "nodeSelector": hosts.selector,
      "containers": [container]
  }
  if gpu and hosts.count > 1:
    # The index the Job controller gives each pod, for $(...) in args.
    container["env"] = [{
        "name": "VIT_JAX_PROCESS_ID",
        "valueFrom": {
            "fieldRef": {
                "fieldPath": "metadata.annotations['batch.kubernetes.io"
                             "/job-completion-index']"
            }
        }
    }]
  if args.slices > 1:
    container["env"] = slice_env(args)
    # DCN traffic on the host's own NICs, not through the pod network (as
    # Google's xpk runs Multislice); cluster DNS still names the pods.
    spec["hostNetwork"] = True
    spec["dnsPolicy"] = "ClusterFirstWithHostNet"
  mounts, volumes = [], []
  if gpu:  # NCCL exchanges data through /dev/shm, 64 MiB in a pod by default.
    mounts.append({"name": "shm", "mountPath": "/dev/shm"})
    volumes.append({"name": "shm", "emptyDir": {"medium": "Memory"}})
  if args.data_bucket:  # ArrayRecord files are read from local paths only.
    mounts.append({
        "name": "data",
        "mountPath": f"/data/{args.data_bucket}",
        "readOnly": True
    })
    volumes.append({
        "name": "data",
        "csi": {
            "driver": "gcsfuse.csi.storage.gke.io",
            "readOnly": True,
            "volumeAttributes": {
                "bucketName": args.data_bucket,
                "mountOptions": "implicit-dirs"
            }
        }
    })
  if mounts:
    container["volumeMounts"], spec["volumes"] = mounts, volumes
  if args.service_account:
    spec["serviceAccountName"] = args.service_account
  return spec


def jobset(args, hosts: Hosts, gpu: bool) -> dict:
  job = {
      "parallelism": hosts.count,
      "completions": hosts.count,
      "completionMode": "Indexed",
      "backoffLimit": 0,
      "podFailurePolicy": {
          "rules": [{
              "action": "FailJob",
              "onExitCodes": {
                  "containerName": CONTAINER,
                  "operator": "In",
                  "values": [USER_ERROR_EXIT_CODE]
              }
          }]
      },
      "template": {
          "spec": pod_spec(args, hosts, gpu)
      }
  }
  if args.data_bucket:  # Asks GKE to add its FUSE sidecar to each pod.
    job["template"]["metadata"] = {
        "annotations": {
            "gke-gcsfuse/volumes": "true"
        }
    }
  metadata = {"name": args.name}
  if args.namespace:
    metadata["namespace"] = args.namespace
  if not gpu:  # Each slice is a node pool: keep a Job's pods in one.
    metadata["annotations"] = {
        EXCLUSIVE_TOPOLOGY: "cloud.google.com/gke-nodepool"
    }
  return {
      "apiVersion": "jobset.x-k8s.io/v1alpha2",
      "kind": "JobSet",
      "metadata": metadata,
      "spec": {
          "failurePolicy": {
              "maxRestarts": args.max_restarts,
              "rules": [{
                  "name": "command-error",
                  "action": "FailJobSet",
                  "onJobFailureReasons": ["PodFailurePolicy"]
              }]
          },
          "network": {
              "enableDNSHostnames": True,
              "publishNotReadyAddresses": True
          },
          "replicatedJobs": [{
              "name": REPLICATED_JOB,
              "replicas": args.slices,  # A Job per slice.
              "template": {
                  "spec": job
              }
          }]
      }
  }


def header(args, hosts: Hosts) -> str:
  name, first = args.name, (f"jobset.sigs.k8s.io/jobset-name={args.name},"
                            "batch.kubernetes.io/job-completion-index=0")
  what, pools = f"{hosts.summary}, a pod on each", f"""\
# and a node pool such as
#   gcloud container node-pools create {name}-pool --cluster=CLUSTER \\
#     --location=LOCATION --node-locations=ZONE {hosts.pool_flags}"""
  if args.slices > 1:  # Host 0 of each slice has completion index 0.
    first += f",{JOB_INDEX}=0"
    what = (f"{args.slices} slices joined over DCN, each {hosts.summary}, "
            "a pod per host")
    pools = f"""\
# and {args.slices} node pools, one per slice, each of the slice's shape:
#   for i in $(seq 0 {args.slices - 1}); do
#     gcloud container node-pools create {name}-pool-$i --cluster=CLUSTER \\
#       --location=LOCATION --node-locations=ZONE {hosts.pool_flags}; done"""
  return f"""\
# vit-jax train on GKE: {what}.
# Written by launch/gke.py; see docs/scaling.md. The cluster needs JobSet
# (once: kubectl apply --server-side -f {JOBSET_MANIFESTS})
{pools}
# Start or resume:  kubectl apply -f THIS_FILE
# Watch:            kubectl get jobset {name}; kubectl logs -f -l {first}
# Stop (all pods save the same step): kubectl delete jobset {name}
"""


def parse(argv: list[str]) -> tuple[argparse.Namespace, Hosts, bool]:
  ours, flags = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) \
      if "--" in argv else (argv, [])
  parser = argparse.ArgumentParser(prog="launch/gke.py",
                                   description=__doc__.split("\n\n")[0],
                                   epilog="Flags after -- go to vit-jax train.")
  parser.add_argument(
      "--name", required=True,
      help="The JobSet's name: up to 40 lowercase letters, "
      "digits and '-', starting with a letter.")
  parser.add_argument("--image", required=True, help="The container image.")
  where = parser.add_mutually_exclusive_group(required=True)
  where.add_argument("--tpu", help="GENERATION:TOPOLOGY, e.g. v5e:4x4.")
  where.add_argument(
      "--gpu", help="TYPE:GPUS_PER_NODE, e.g. "
      "nvidia-h100-80gb:8 (with --hosts).")
  parser.add_argument("--hosts", type=int,
                      help="GPU nodes (a TPU slice's count follows from it).")
  parser.add_argument(
      "--slices", type=int, help="TPU slices of --tpu's shape, "
      "joined over the data-centre network (default 1).")
  parser.add_argument(
      "--config", required=True, help="FILE.py[:ARG], a path "
      "inside the image (ours: configs/...).")
  parser.add_argument("--workdir", required=True, help="gs://BUCKET/PATH.")
  parser.add_argument("--grace_seconds", type=int, default=GRACE_SECONDS,
                      help="SIGTERM to SIGKILL, for the coordinated save.")
  parser.add_argument(
      "--max_restarts", type=int, default=10,
      help="Whole-JobSet restarts (failures, preemptions) "
      "before it gives up.")
  parser.add_argument(
      "--service_account", help="The pods' Kubernetes "
      "service account (the one allowed to write the bucket).")
  parser.add_argument("--namespace", help="Kubernetes namespace.")
  parser.add_argument(
      "--data_bucket", help="A bucket (no gs://) mounted read-only at "
      "/data/BUCKET, for data read by index (ArrayRecord).")
  args = parser.parse_args(ours)
  args.flags = flags
  try:
    if not NAME.fullmatch(args.name):
      raise ValueError(f"--name={args.name!r}: up to 40 lowercase letters, "
                       "digits and '-', starting with a letter")
    if not re.match(r"[a-z0-9]+://", args.workdir):
      raise ValueError(f"--workdir={args.workdir!r}: use object storage "
                       "(gs://BUCKET/PATH); every host writes checkpoint "
                       "shards and a restarted pod may run on another node")
    for flag in flags:
      if flag.split("=")[0] in ("--config", "--workdir", "--distributed"):
        raise ValueError(f"{flag}: give it to gke.py itself (before --)")
    if args.tpu:
      if args.hosts is not None:
        raise ValueError("--hosts: a TPU slice's hosts follow from --tpu")
      hosts = tpu_hosts(args.tpu)
      args.slices = 1 if args.slices is None else args.slices
      if args.slices < 1:
        raise ValueError(f"--slices={args.slices}: give the number of TPU "
                         "slices, 1 or more")
      if args.slices > 1 and hosts.count == 1:
        raise ValueError(f"--slices={args.slices}: GKE joins multi-host "
                         f"slices only, and {args.tpu} is one host")
      return args, hosts, False
    if args.slices is not None:
      raise ValueError("--slices: only TPUs come in slices; for more GPUs "
                       "raise --hosts")
    args.slices = 1
    if args.hosts is None:
      raise ValueError("--gpu needs --hosts, the number of nodes")
    return args, gpu_hosts(args.gpu, args.hosts), True
  except ValueError as e:
    parser.error(str(e))


def main(argv: list[str]) -> None:
  args, hosts, gpu = parse(argv)
  sys.stdout.write(header(args, hosts))
  yaml.safe_dump(jobset(args, hosts, gpu), sys.stdout, sort_keys=False)


if __name__ == "__main__":
  main(sys.argv[1:])
