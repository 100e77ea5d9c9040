"""Cluster profiles: where and how a job runs.

A profile describes one cluster (or this machine): the scheduler, the Slurm request, the
software environment, the container, the interconnect and what it should deliver, the
preemption contract and where checkpoints live. The dataclasses below are the schema; their
``doc`` strings feed the README's reference and the error messages.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..checkpoint_interval import DEFAULT_NODE_MTBF_HOURS
from . import safety
from .problems import Problems
from .resilience import ResilienceSection
from .schema import doc
from .tracking import TrackingSection, check_tracking

SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "URG")
# Upper bounds that no real cluster reaches and that keep the planner's enumeration (divisors of
# the world size, one entry per data-parallel rank) to seconds.
MAX_NODES = 16384
MAX_GPUS_PER_NODE = 64
MAX_WORLD_SIZE = 131072
MAX_TIME_LIMIT_DAYS = 365


@dataclass(kw_only=True)
class SlurmSection:
    partition: str | None = doc("Partition to submit to (null: the cluster's default).", default=None)
    account: str | None = doc("Account to charge.", default=None)
    qos: str | None = doc("Quality of service.", default=None)
    reservation: str | None = doc("Reservation to run in.", default=None)
    time_limit: str = doc("Wall-clock limit in Slurm's format (e.g. 04:00:00, 2-00:00:00).",
                          default="01:00:00")
    nodes: int = doc("Nodes per job (--nodes on the command line overrides); nodes × "
                     f"gpus_per_node is at most {MAX_WORLD_SIZE:,}.", default=1, at_least=1,
                     at_most=MAX_NODES)
    gpus_per_node: int = doc("GPUs used per node; one task (rank) per GPU. On a CPU profile: "
                             "processes per node.", default=1, at_least=1,
                             at_most=MAX_GPUS_PER_NODE)
    cpus_per_task: int | None = doc("CPUs per task (rank).", default=None, at_least=1, at_most=4096)
    mem: str | None = doc("Memory per node, Slurm format (e.g. 0 for all, 480G).", default=None)
    constraint: str | None = doc("Node features required (--constraint).", default=None)
    exclusive: bool = doc("Ask for whole nodes (--exclusive).", default=False)
    exclude: list[str] = doc("Nodes never to run on (--exclude).", default_factory=list)
    gpu_directive: str = doc("How GPUs are requested: gpus-per-node, gres (--gres=gpu:N) or none.",
                             choices=("gpus-per-node", "gres", "none"), default="gpus-per-node")
    extra_directives: list[str] = doc("Raw #SBATCH directives, e.g. --comment=pretrain. Validated; "
                                      "directives hpctrain sets itself are refused.",
                                      default_factory=list)


@dataclass(kw_only=True)
class NodeSection:
    gpus: int = doc("GPUs a node has (the most slurm.gpus_per_node may ask for). 0 on CPU.",
                    default=0, at_least=0, at_most=MAX_GPUS_PER_NODE)
    gpu_model: str | None = doc("GPU model preflight expects (substring of nvidia-smi's name).",
                                default=None)
    gpu_memory_gb: float | None = doc("Memory per GPU in GiB; the planner's fit limit.", default=None,
                                      at_least=0.001, at_most=16384)
    peak_tflops: float | None = doc("Peak dense TFLOP/s per GPU at the training precision (MFU).",
                                    default=None, at_least=0.001, at_most=1e6)
    host_memory_gb: float | None = doc("Host (CPU) memory per node in GiB: the planner's limit for "
                                       "what a checkpoint save copies to host memory "
                                       "(slurm.mem, when it is a size, is used instead).",
                                       default=None)
    device: str = doc("cuda on GPU clusters; cpu to rehearse on CPUs with gloo.",
                      choices=("cuda", "cpu"), default="cuda")
    kernel_table: str | None = doc("This GPU kind's measured kernel table (JSON written by "
                                   "`hpctrain bench kernels` on one of its GPUs; relative to "
                                   "the profile file; or builtin:NAME, a table hpctrain ships, "
                                   "e.g. builtin:nvidia-h100-80gb-hbm3): the planner's step "
                                   "time from its GEMM, "
                                   "attention and bandwidth timings, and its memory allowance "
                                   "from its measured overheads (null: stated assumptions).",
                                   default=None)


@dataclass(kw_only=True)
class ContainerSection:
    image: str | None = doc("Container image for pyxis/enroot (srun --container-image).", default=None)
    mounts: list[str] = doc("Bind mounts SRC:DST[:FLAGS] (srun --container-mounts).",
                            default_factory=list)
    workdir: str | None = doc("Working directory inside the container.", default=None)
    python: str = doc("Python inside the container.", default="python3")


@dataclass(kw_only=True)
class InterconnectSection:
    kind: str = doc("Inter-node fabric.", choices=("infiniband", "roce", "ethernet", "none"),
                    default="none")
    hcas: list[str] = doc("HCAs every node must have, e.g. mlx5_0 (preflight checks each port).",
                          default_factory=list)
    port_rate_gbps: float | None = doc("Expected link rate of each HCA port in Gb/s (e.g. 400).",
                                       default=None, at_least=0.001, at_most=1e5)
    link_layer: str | None = doc("Expected link layer of the HCA ports.",
                                 choices=("InfiniBand", "Ethernet"), default=None)
    socket_ifname: str | None = doc("Interface for bootstrap/socket traffic (NCCL_SOCKET_IFNAME).",
                                    default=None)
    intra_node_busbw_gbs: float | None = doc("Expected all-reduce bus bandwidth inside a node, GB/s.",
                                             default=None, at_least=0.001, at_most=1e5)
    inter_node_busbw_gbs: float | None = doc("Expected all-reduce bus bandwidth across nodes, GB/s.",
                                             default=None, at_least=0.001, at_most=1e5)
    min_bandwidth_fraction: float = doc("Preflight fails below this fraction of the expected "
                                        "bandwidth.", default=0.8, above=0, at_most=1)


@dataclass(kw_only=True)
class PreemptionSection:
    signal: str = doc("Signal Slurm sends before the end (--signal=B:SIG@lead).", choices=SIGNALS,
                      default="USR1")
    lead_time_s: int = doc("Seconds before the end the signal comes; the emergency checkpoint must "
                           "fit in it (sbatch's limit is 65535).", default=120, at_least=1,
                           at_most=65535)
    max_requeues: int = doc("Requeues allowed per run before hpctrain stops requeueing.", default=10,
                            at_least=0, at_most=10000)
    requeue_on_failure: bool = doc("Also requeue after a crash (not only after preemption or time "
                                   "limit), while the step advances.", default=False)


@dataclass(kw_only=True)
class StorageSection:
    checkpoint_root: str | None = doc("Shared folder under which each run keeps its checkpoints "
                                      "(null: inside the run folder).", default=None)
    runs_root: str | None = doc("Shared folder for run folders (null: ./runs, or $HPCTRAIN_RUNS_DIR).",
                                default=None)
    min_free_gb: float = doc("Preflight fails when the checkpoint folder has less free space.",
                             default=1.0, at_least=0, at_most=1e7)
    group_readable: bool = doc("Create run and checkpoint folders readable by the owner's group "
                               "(0750) instead of private (0700); never group-writable: whoever "
                               "can write them can run code in the job.", default=False)
    write_bandwidth_gbs: float | None = doc("Write bandwidth one node reaches to the checkpoint "
                                            "folder with all its ranks writing, GB/s: the "
                                            "planner's save time (null: 2 GB/s assumed).",
                                            default=None, at_least=0.001, at_most=1e5)


@dataclass(kw_only=True)
class ReliabilitySection:
    node_mtbf_hours: float = doc("Mean time between failures of one node, in hours; the job's is "
                                 "this / nodes. Sets checkpoint.interval_minutes: auto (Young/"
                                 "Daly). Default: Llama 3's pre-training, 419 unexpected "
                                 "interruptions in 54 days on 2,048 nodes (about 6,300 h), "
                                 "rounded down.", default=DEFAULT_NODE_MTBF_HOURS,
                                 at_least=0.1, at_most=1e7)


@dataclass(kw_only=True)
class PreflightSection:
    gate: bool = doc("Run preflight as the first step of every training job; failing nodes are "
                     "excluded and the job requeued.", default=False)
    sizes_mb: list[float] = doc("All-reduce sweep sizes in MB (null: 1 MB-1 GB on GPUs, 0.25-16 MB "
                                "on CPU).", default_factory=list, at_least=0.001,
                                at_most=16384)
    timeout_s: int = doc("Each collective's timeout; a hang becomes a failure naming the ranks.",
                         default=120, at_least=1, at_most=86400)
    outlier_fraction: float = doc("A node (or pair of nodes) whose all-reduce bus bandwidth is below "
                                  "this fraction of the best one's is reported as slow, even without "
                                  "expected bandwidths in the profile.", default=0.5, above=0,
                                  at_most=1)
    counter_interval_s: float = doc("Seconds between the two reads of the InfiniBand error counters "
                                    "(link_downed, symbol_error) that must not grow.", default=2.0,
                                    at_least=0, at_most=3600)
    storage_probe_mb: int = doc("MB written (with fsync) to measure checkpoint write bandwidth "
                                "(0: skip).", default=64, at_least=0, at_most=65536)


# the schedulers a profile may name (``scheduler.choose.BACKENDS`` has one backend for each),
# and so the only ones a run folder's run.yaml records
SCHEDULERS = ("slurm", "local")


@dataclass(kw_only=True)
class ClusterProfile:
    name: str = doc("Profile name: letters, digits and _.+-, not starting with - or . "
                    "(defaults to the file name).",
                    default="")
    description: str = doc("One line about the cluster.", default="")
    scheduler: str = doc("slurm, or local (this machine, submitit's local executor).",
                         choices=SCHEDULERS, default="slurm")
    python: str | None = doc("Python on the nodes (null: the interpreter that submits).", default=None)
    slurm: SlurmSection = doc("The Slurm request.", default_factory=SlurmSection)
    node: NodeSection = doc("What one node has.", default_factory=NodeSection)
    modules: list[str] = doc("Environment modules to load (module load ...).", default_factory=list)
    env: dict[str, str] = doc("Environment variables exported to every rank (NCCL_*, ...); not "
                              "those hpctrain sets (docs/safety.md).",
                              default_factory=dict)
    container: ContainerSection = doc("pyxis container for the training step.",
                                      default_factory=ContainerSection)
    interconnect: InterconnectSection = doc("Fabric and the bandwidth it should deliver.",
                                            default_factory=InterconnectSection)
    preemption: PreemptionSection = doc("Signal, lead time and requeue budget.",
                                        default_factory=PreemptionSection)
    storage: StorageSection = doc("Where checkpoints and run folders live.",
                                  default_factory=StorageSection)
    reliability: ReliabilitySection = doc("How often nodes fail (the checkpoint interval).",
                                          default_factory=ReliabilitySection)
    preflight: PreflightSection = doc("Preflight settings.", default_factory=PreflightSection)
    tracking: TrackingSection = doc("Experiment trackers for every job on this cluster (a "
                                    "cluster-wide MLflow server, a W&B team); a tracker the job "
                                    "names replaces the profile's.",
                                    default_factory=TrackingSection)
    resilience: ResilienceSection = doc("Hot spare nodes and restarts inside the allocation "
                                        "(a job's resilience section overrides them).",
                                        default_factory=ResilienceSection)

    @property
    def world_size(self) -> int:
        return self.slurm.nodes * self.slurm.gpus_per_node

    def with_nodes(self, nodes: int | None) -> "ClusterProfile":
        if nodes is None:
            return self
        return dataclasses.replace(self, slurm=dataclasses.replace(self.slurm, nodes=nodes))


def _time_limit_seconds(text: str) -> int | None:
    """Slurm time format -> seconds (None if unparseable). A bare number is minutes."""
    if not safety.TIME_LIMIT.fullmatch(text or ""):
        return None
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        days = int(d)
        parts = [int(x) for x in text.split(":")]
        parts += [0] * (3 - len(parts))
        h, m, s = parts
    else:
        parts = [int(x) for x in text.split(":")]
        if len(parts) == 1:
            h, m, s = 0, parts[0], 0
        elif len(parts) == 2:
            h, m, s = 0, parts[0], parts[1]
        else:
            h, m, s = parts
    return ((days * 24 + h) * 60 + m) * 60 + s


def time_limit_seconds(profile: ClusterProfile) -> int:
    return _time_limit_seconds(profile.slurm.time_limit) or 0


_MEM_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def host_memory_bytes(profile: ClusterProfile) -> int | None:
    """Host memory a job may use per node: ``slurm.mem`` when it is a size (Slurm's unit is MB
    when none is given), else ``node.host_memory_gb`` (also what ``mem: 0``, all of a node's
    memory, means); None when neither says."""
    import re
    m = re.fullmatch(r"(\d+)([KMGT]?)", profile.slurm.mem or "", re.ASCII)
    if m and int(m.group(1)) > 0:
        return int(m.group(1)) * _MEM_UNITS[m.group(2) or "M"]
    gb = profile.node.host_memory_gb
    return int(gb * 2**30) if gb else None


def check_profile(p: ClusterProfile, problems: Problems) -> None:
    """Cross-field and safety checks; schema types are already checked by the loader."""
    s = p.slurm
    safety.check(safety.JOB_NAME, p.name, "name", problems,
                 "profile name (1-128 of letters, digits and _.+-, not starting with - or .)")
    for key in ("partition", "account", "qos", "reservation"):
        safety.check(safety.SLURM_NAME, getattr(s, key), f"slurm.{key}", problems, f"Slurm {key} name")
    if isinstance(s.time_limit, str):
        limit_s = _time_limit_seconds(s.time_limit)
        if limit_s is None:
            problems.add("slurm.time_limit", f"{safety.short(s.time_limit)} is not a Slurm time "
                                             "limit (use MM, HH:MM:SS or D-HH:MM:SS)")
        elif limit_s > MAX_TIME_LIMIT_DAYS * 86400:
            problems.add("slurm.time_limit", f"{s.time_limit} is more than {MAX_TIME_LIMIT_DAYS} days")
    if isinstance(s.nodes, int) and isinstance(s.gpus_per_node, int) \
            and s.nodes * s.gpus_per_node > MAX_WORLD_SIZE:
        problems.add("slurm.nodes", f"{s.nodes} nodes × {s.gpus_per_node} GPUs = "
                                    f"{s.nodes * s.gpus_per_node:,} ranks; hpctrain plans and runs "
                                    f"at most {MAX_WORLD_SIZE:,}")
    safety.check(safety.MEMORY, s.mem, "slurm.mem", problems, "memory size (e.g. 0, 64G, 480000M)")
    safety.check(safety.CONSTRAINT, s.constraint, "slurm.constraint", problems,
                 "constraint (features joined by , or [..]; & | ( ) are not accepted)")
    for i, node in enumerate(s.exclude or []):
        safety.check(safety.NODE_LIST, node, f"slurm.exclude[{i}]", problems, "node name")
    for key in ("partition", "account", "qos", "reservation", "constraint"):
        safety.check_sbatch_value(getattr(s, key), f"slurm.{key}", problems)
    for i, node in enumerate(s.exclude or []):
        safety.check_sbatch_value(node, f"slurm.exclude[{i}]", problems)
    for i, d in enumerate(s.extra_directives or []):
        safety.check_directive(d, f"slurm.extra_directives[{i}]", problems)
    n = p.node
    if isinstance(n.host_memory_gb, (int, float)) and n.host_memory_gb <= 0:
        problems.add("node.host_memory_gb", f"must be positive (or null), got {n.host_memory_gb}")
    if isinstance(n.gpus, int) and n.gpus > 0 and isinstance(s.gpus_per_node, int) \
            and s.gpus_per_node > n.gpus:
        problems.add("slurm.gpus_per_node", f"asks for {s.gpus_per_node} GPUs per node but node.gpus "
                                            f"says a node has {n.gpus}; lower slurm.gpus_per_node")
    for i, m in enumerate(p.modules or []):
        safety.check(safety.MODULE, m, f"modules[{i}]", problems, "module name")
    for k, v in (p.env or {}).items():
        safety.check_env_value(k, v, f"env.{k}", problems)
    c = p.container
    safety.check(safety.IMAGE, c.image, "container.image", problems, "container image")
    for i, m in enumerate(c.mounts or []):
        safety.check(safety.MOUNT, m, f"container.mounts[{i}]", problems, "mount (SRC:DST[:FLAGS])")
    safety.check_path(c.workdir, "container.workdir", problems, safety.PATH_LIKE)
    safety.check(safety.MODULE, c.python, "container.python", problems, "python command")
    if p.python is not None:
        safety.check_path(p.python, "python", problems, safety.PATH_LIKE, "python path")
    ic = p.interconnect
    for i, h in enumerate(ic.hcas or []):
        safety.check(safety.HCA, h, f"interconnect.hcas[{i}]", problems, "HCA name (e.g. mlx5_0)")
    safety.check(safety.IFNAME, ic.socket_ifname, "interconnect.socket_ifname", problems,
                 "interface name")
    if ic.kind in ("infiniband", "roce") and not ic.hcas:
        problems.add("interconnect.hcas", f"an {ic.kind} profile must name its HCAs (e.g. [mlx5_0])")
    pre = p.preemption
    if isinstance(pre.lead_time_s, int):
        limit = _time_limit_seconds(s.time_limit) if isinstance(s.time_limit, str) else None
        if limit and pre.lead_time_s >= limit:
            problems.add("preemption.lead_time_s", f"{pre.lead_time_s}s is not shorter than "
                                                   f"slurm.time_limit ({s.time_limit}); lower it")
    for key in ("checkpoint_root", "runs_root"):
        safety.check_path(getattr(p.storage, key), f"storage.{key}", problems, safety.PATH_LIKE)
    check_tracking(p.tracking, problems)
