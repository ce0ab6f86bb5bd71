"""The job spec a user writes (YAML), as typed, validated, frozen dataclasses."""

from __future__ import annotations

import json
from dataclasses import field
from typing import Any, Literal, Optional, Union

from . import knobs as _knobs
from ..records import Record, meta, record
from .resources import Binding, Resources, begin_problem, header_text_problem  # noqa: F401
from .schema import build, read_yaml, to_dict
from .tracking import Tracking

from .values import (  # noqa: F401 (the allow-lists, re-exported for their readers)
    NAME, NAME_HELP, WALLTIME, WALLTIME_HELP, PATH, PATH_HELP, CONSTRAINT, CONSTRAINT_HELP,
    MAIL_TYPES, EMAIL, BEGIN, BEGIN_HELP, BIND_TO, MAP_BY, CPU_BIND, GPU_BIND, ENV_NAME, TEMPLATE_NAME,
    PY_FILE, PY_MODULE, USER_REF, USER_REF_HELP, AFTER, AFTER_HELP, IMAGE, IMAGE_HELP, BIND,
    BIND_HELP,
)

# Horovod variables the template derives from train.horovod: variable -> knob (hpcsuite.submit.knobs).
HOROVOD_KNOBS = _knobs.BY_ENV
# Variables bash gives meaning to (exporting them changes how the batch script itself runs).
SHELL_VARS = frozenset(
    "SHELLOPTS BASHOPTS UID EUID PPID BASHPID IFS PS4 ENV CDPATH GLOBIGNORE POSIXLY_CORRECT "
    "HOME PWD OLDPWD OPTIND OPTARG OPTERR RANDOM SRANDOM SECONDS LINENO FUNCNAME GROUPS SHLVL "
    "PIPESTATUS DIRSTACK HOSTTYPE MACHTYPE OSTYPE HISTFILE PROMPT_COMMAND EPOCHSECONDS "
    "EPOCHREALTIME PATH SHELL".split())
# Names the rendered script and the launchers use for themselves.
OWN_VARS = frozenset({"RUN_DIR", "launcher", "status"})
OWNED_PREFIXES = {"SLURM_": "Slurm", "SBATCH_": "Slurm", "SRUN_": "Slurm", "SALLOC_": "Slurm",
                  "BASH_": "bash", "HPCSUITE_": "hpcsuite", "PMI_": "the MPI launcher",
                  "PMIX_": "the MPI launcher", "OMPI_COMM_WORLD_": "the MPI launcher"}


def reserved_env_name(name: str) -> str | None:
    """Why ``name`` may not be set through ``env``, or None when it may."""
    if name in HOROVOD_KNOBS:
        return f"hpcsuite sets {name} from train.horovod.{HOROVOD_KNOBS[name]}; set that instead"
    if name in SHELL_VARS:
        return (f"{name} belongs to the shell that runs the batch script; setting it would "
                "change how the script itself runs")
    if name in OWN_VARS:
        return f"{name} is used by the rendered script itself"
    for prefix, owner in OWNED_PREFIXES.items():
        if name.startswith(prefix):
            return f"{prefix}* variables belong to {owner}"
    return None


PRECISIONS = {"torch": ("fp32", "amp"), "tensorflow": ("fp32", "amp", "mixed_float16")}


def precision_problem(backend: str, precision: str) -> str | None:
    """Why ``precision`` does not exist for ``backend`` (one place for both frameworks)."""
    if precision in PRECISIONS[backend]:
        return None
    if backend == "torch" and precision == "mixed_float16":
        return ("mixed_float16 is TensorFlow's policy; for torch use amp (float16 with a gradient "
                "scaler on CUDA, bfloat16 on the CPU)")
    return f"{precision} is not available for {backend}; choose {', '.join(PRECISIONS[backend])}"


def path_problem(text: str) -> str | None:
    """Why an image or bind path could name something other than it reads: '..' segments
    (/images/../home/x.sif would pass a /images/ prefix) and empty ones."""
    for part in text.replace("://", "/", 1).split(":"):
        segments = part.split("/")
        if ".." in segments:
            return f"{text!r}: '..' is not allowed in a path"
        if "" in segments[1:-1]:
            return f"{text!r}: '//' is not allowed in a path"
    return None


@record
class Data(Record):
    """What the ranks train on: generated samples, arrays, an HDF5 file or your factory."""
    kind: Literal["synthetic", "npy", "hdf5", "python"] = field(default="synthetic", metadata=meta(
        "where the samples come from: synthetic (a learnable set generated from train.seed), "
        "npy (.npy arrays), hdf5 (datasets in an HDF5 file) or python (your factory function)"))
    samples: int = field(default=4096, metadata=meta("synthetic: number of samples", min=1))
    shape: list[int] = field(default_factory=lambda: [32], metadata=meta(
        "synthetic: shape of one input, e.g. [32] or [3, 16, 16] (channels first)", min=1))
    classes: int = field(default=10, metadata=meta("synthetic: number of classes", min=2))
    path: Optional[str] = field(default=None, metadata=meta(
        "npy: directory of inputs-*.npy / labels-*.npy shards; hdf5: the .h5 file (relative to "
        "the submit directory)", nonempty=True))
    inputs: str = field(default="inputs", metadata=meta(
        "hdf5: the dataset holding the inputs, [N, *shape]", pattern=r"[A-Za-z0-9_./-]{1,256}",
        pattern_help="an HDF5 dataset path like inputs or train/x"))
    labels: str = field(default="labels", metadata=meta(
        "hdf5: the dataset holding the labels (integers: classes) or targets (floats), [N, ...]",
        pattern=r"[A-Za-z0-9_./-]{1,256}", pattern_help="an HDF5 dataset path like labels or train/y"))
    factory: Optional[str] = field(default=None, metadata=meta(
        "python: FILE.py:function returning a map-style dataset: len(ds), and ds[ids] -> "
        "(inputs, targets) arrays for an array of sample ids", pattern=USER_REF,
        pattern_help=USER_REF_HELP))
    args: dict[str, Any] = field(default_factory=dict, metadata=meta(
        "python: keyword arguments for the factory", key_pattern=r"[A-Za-z_][A-Za-z0-9_]{0,63}",
        key_help="not a Python argument name",
        keys="Python argument names"))
    workers: int = field(default=0, metadata=meta(
        "loader worker processes per rank, started once for the run (both backends); 0 loads "
        "in the training process, best for in-memory data; raise it for data on disk or a slow "
        "dataset",
        min=0, max=64))
    prefetch: int = field(default=2, metadata=meta(
        "read ahead per rank: with workers, blocks of micro-batches (up to 4 MiB) per worker; "
        "on a GPU with workers 0, the micro-batches a thread gathers ahead into pinned memory",
        min=1, max=64))
    on_device: Union[bool, Literal["auto"]] = field(default="auto", metadata=meta(
        "torch on a GPU: copy the data to the GPU once and gather each batch there; auto does "
        "when it takes at most a quarter of the GPU's free memory", union_help="auto, true or false"))


@record
class HorovodKnobs(Record):
    """Rendered as HOROVOD_* variables for every rank by the template (not set from Python);
    names, defaults and variables: :data:`hpcsuite.submit.knobs.KNOBS`."""
    compression: Literal["none", "fp16"] = field(default=_knobs.default("compression"), metadata=meta(
        "fp16: gradients travel as float16 (Horovod's Compression.fp16, half the bytes); none: "
        "as they are"))
    op: Literal["average", "adasum"] = field(default=_knobs.default("op"), metadata=meta(
        "how the ranks' gradients combine: average (ring allreduce) or adasum (Horovod's "
        "Adasum)"))
    fusion_threshold_mb: int = field(default=_knobs.default("fusion_threshold_mb"),
                                     metadata=meta(min=0, max=4096))
    cycle_time_ms: float = field(default=_knobs.default("cycle_time_ms"),
                                 metadata=meta(min=0.0, max=10000.0))
    stall_check_seconds: int = field(default=_knobs.default("stall_check_seconds"), metadata=meta(
        "warn when ranks wait on each other this long (0 disables the check)", min=0))
    stall_shutdown_seconds: int = field(default=_knobs.default("stall_shutdown_seconds"), metadata=meta(
        "abort the job when a stall lasts this long, e.g. after a dead rank (0: never)", min=0))
    timeline: bool = field(default=_knobs.default("timeline"), metadata=meta(
        "write a Horovod timeline to the run directory"))
    autotune: bool = field(default=_knobs.default("autotune"), metadata=meta(
        "let Horovod tune fusion and cycle time"))
    allreduce: bool = field(default=_knobs.default("allreduce"), metadata=meta(
        "false: skip the gradient allreduce, each rank trains its own replica (benchmarks only: "
        "the no-communication limit a scaling study compares with)"))


@record
class Checkpoint(Record):
    """When rank 0 saves the run's state, where, how many it keeps, and resuming from it."""
    every_steps: int = field(default=0, metadata=meta("save every N optimizer steps (0: off)", min=0))
    every_minutes: float = field(default=0.0, metadata=meta("save at least every N minutes (0: off)",
                                                          min=0.0))
    keep: int = field(default=2, metadata=meta("checkpoints kept", min=1))
    dir: Optional[str] = field(default=None, metadata=meta(
        "where checkpoints live (default: OUTPUT_DIR/NAME/checkpoints); shared by resubmissions",
        nonempty=True))
    resume: bool = field(default=True, metadata=meta("continue from the latest good checkpoint"))

    @property
    def enabled(self) -> bool:
        return self.every_steps > 0 or self.every_minutes > 0


@record
class Monitor(Record):
    """What the ranks record while they train: utilisation, TensorBoard, Prometheus, timelines."""
    enabled: bool = field(default=False, metadata=meta(
        "sample every rank's utilisation and memory while training (GPU through NVML when the "
        "rank has one, CPU through psutil otherwise) into results.json"))
    interval_seconds: float = field(default=1.0, metadata=meta("seconds between samples",
                                                             min=0.05, max=3600.0))
    prometheus_dir: Optional[str] = field(default=None, metadata=meta(
        "a directory (e.g. node_exporter's textfile collector's) where each rank rewrites "
        "hpcsuite-CLUSTER-USER-JOBID-rank-N.prom every sample; relative to the submit directory",
        pattern=PATH, pattern_help=PATH_HELP, nonempty=True))
    timeline_steps: int = field(default=0, metadata=meta(
        "record a Horovod timeline over this many optimizer steps (0: off), on rank 0's "
        "node-local disk ($TMPDIR), then copied to the run directory as "
        "horovod-timeline-steps-A-B.json; independent of enabled", min=0, max=1_000_000))
    timeline_start_step: int = field(default=10, metadata=meta(
        "the step the timeline window opens at (past the first steps' warm-up)", min=0))
    tensorboard: bool = field(default=False, metadata=meta(
        "rank 0 writes TensorBoard event files to the run directory's tensorboard/ (one per "
        "attempt, steps are the job's optimizer steps): loss, learning rate, samples/s, "
        "validation loss and accuracy, a script's run.log() values, and with enabled each "
        "rank's utilisation; `tensorboard --logdir RUN_DIR/tensorboard`; independent of enabled"))


@record
class Preemption(Record):
    """What the job does when Slurm preempts it or its time runs out: save, stop, requeue."""
    signal: Literal["USR1", "USR2", "TERM"] = field(default="USR1", metadata=meta(
        "the signal Slurm sends the batch shell lead_seconds before the time limit (sbatch "
        "--signal): the ranks save a checkpoint and stop"))
    lead_seconds: Optional[int] = field(default=None, metadata=meta(
        "ask Slurm for SIGNAL this long before the time limit (0: off). Default, when "
        "checkpoints are on: 30 s, and the ranks also stop by themselves once the time left is "
        "about what their measured checkpoint save (twice over), two votes and the exit need",
        min=0, max=65535))
    requeue: bool = field(default=False, metadata=meta(
        "after a checkpoint on a signal or before the time limit, requeue the job so it "
        "resumes by itself (without limit: each of those attempts saved its work)"))
    max_failures: int = field(default=0, metadata=meta(
        "requeue the job after a failed attempt (a crash, a lost node) at most this many "
        "times in all; it resumes from the last checkpoint. A failure of the job's input "
        "(exit 2) is never retried", min=0, max=1000))

    AUTO_LEAD_SECONDS = 30

    def signal_lead(self, checkpoints: bool) -> int:
        """Seconds before the time limit Slurm signals the batch shell (0: no signal)."""
        if self.lead_seconds is not None:
            return self.lead_seconds
        return self.AUTO_LEAD_SECONDS if checkpoints else 0

    def watches_time_limit(self, checkpoints: bool) -> bool:
        """Whether the ranks stop by themselves before the time limit (lead_seconds: 0 is off)."""
        return checkpoints and self.lead_seconds != 0


@record
class Optimizer(Record):
    """The optimizer both frameworks build the same way."""
    name: Literal["sgd", "adam", "adamw"] = field(default="sgd", metadata=meta(
        "the optimizer, the same in torch and TensorFlow: sgd (with momentum), adam or adamw"))
    momentum: float = field(default=0.9, metadata=meta("sgd: momentum", min=0.0, max=1.0))
    weight_decay: float = field(default=0.0, metadata=meta(
        "weight decay (sgd in torch: L2 added to the gradient; adamw, and Keras: decoupled)",
        min=0.0, max=1.0))
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999], metadata=meta(
        "adam, adamw: decay rates of the moment estimates", min=0.0, max=0.999999))
    eps: float = field(default=1e-8, metadata=meta("adam, adamw: numerical stability term",
                                                 min=0.0, max=1.0))


@record
class Schedule(Record):
    """Learning rate over training, as a function of epochs done (a fraction), so a run
    resumed from a checkpoint, on any number of ranks, continues it exactly."""
    scale_by_world_size: bool = field(default=False, metadata=meta(
        "Horovod's linear scaling rule: the peak rate is lr x ranks"))
    warmup_epochs: float = field(default=0.0, metadata=meta(
        "rise linearly to the peak over this many epochs (from lr when scaling, else from 0)",
        min=0.0, max=10000.0))
    decay: Literal["constant", "step", "cosine"] = field(default="constant", metadata=meta(
        "after warm-up: constant, step (x gamma every step_epochs) or cosine (down to min_lr "
        "at the last epoch)"))
    step_epochs: float = field(default=30.0, metadata=meta(
        "step: multiply by gamma every this many epochs after warm-up", min=0.001))
    gamma: float = field(default=0.1, metadata=meta("step: the factor", min=0.0, max=1.0))
    min_lr: float = field(default=0.0, metadata=meta("cosine: the rate it ends at", min=0.0))


@record
class Eval(Record):
    """Validation on held-out data."""
    split: float = field(default=0.0, metadata=meta(
        "hold out this fraction of the training data (a fixed random subset) for validation",
        min=0.0, max=0.9))
    data: Optional[Data] = field(default=None, metadata=meta(
        "a separate held-out dataset instead of a split (same keys as train.data)"))
    every_epochs: int = field(default=1, metadata=meta("validate after every N epochs", min=1))
    batch_size: Optional[int] = field(default=None, metadata=meta(
        "samples per rank per validation batch (default: train.batch_size)", min=1))

    @property
    def enabled(self) -> bool:
        return self.split > 0 or self.data is not None


@record
class Train(Record):
    """What every rank runs: the framework, the model or your script, the data and the schedule."""
    backend: Literal["torch", "tensorflow"] = field(default="torch", metadata=meta(
        "the framework the ranks train with: torch (horovod.torch) or tensorflow "
        "(horovod.tensorflow, Keras 3)"))
    model: str = field(default="mlp", metadata=meta(
        "a built-in model (mlp, resnet) or a builder FILE.py:function / package.module:function "
        "called as function(input_shape, classes) (classes: the target shape for mse)",
        pattern=rf"[a-z][a-z0-9_]*|{USER_REF}",
        pattern_help=f"a model name from models/ or {USER_REF_HELP}"))
    model_args: dict[str, Any] = field(default_factory=dict, metadata=meta(
        "keyword arguments for a FILE.py:function model builder, called as "
        "function(input_shape, classes, **model_args) (a sweep can vary them: "
        "train.model_args.NAME)", key_pattern=r"[A-Za-z_][A-Za-z0-9_]{0,63}",
        key_help="not a Python argument name",
        keys="Python argument names"))
    pythonpath: list[str] = field(default_factory=list, metadata=meta(
        "directories (relative to the submit directory) searched for user code, after the "
        "submit directory itself", nonempty=True))
    loss: str = field(default="cross_entropy", metadata=meta(
        "cross_entropy (integer labels), mse (float targets), or FILE.py:function(outputs, "
        "targets) returning one loss per sample", pattern=rf"cross_entropy|mse|{USER_REF}",
        pattern_help=f"cross_entropy, mse or {USER_REF_HELP}"))
    data: Data = field(default_factory=Data)
    eval: Optional[Eval] = field(default=None, metadata=meta(
        "validation: a split of the training data or a held-out dataset"))
    batch_size: int = field(default=64, metadata=meta("samples per rank per step", min=1))
    epochs: Optional[int] = field(default=None, metadata=meta(
        "passes over the data; unset: 1, or as many as train.max_steps needs when only it is "
        "set (with both, whichever is reached first ends training)", min=1))
    max_steps: Optional[int] = field(default=None, metadata=meta(
        "stop after this many optimizer steps in total (counting resumed ones)", min=1))
    lr: float = field(default=0.05, metadata=meta(
        "learning rate (the base of train.schedule)", min=0.0))
    optimizer: Optimizer = field(default_factory=Optimizer)
    schedule: Schedule = field(default_factory=Schedule)
    script: Optional[str] = field(default=None, metadata=meta(
        "script mode: run this Horovod training script (FILE.py) on every rank instead of the "
        "managed loop; it uses hpcsuite.api for sharding, checkpoints and preemption",
        pattern=PY_FILE, pattern_help="a FILE.py path"))
    args: list[str] = field(default_factory=list, metadata=meta(
        "script mode: the script's command-line arguments"))
    precision: Literal["fp32", "amp", "mixed_float16"] = field(default="fp32", metadata=meta(
        "fp32; amp: the framework's mixed precision (torch autocast, TensorFlow "
        "mixed_float16); mixed_float16: TensorFlow only"))
    grad_accumulation: int = field(default=1, metadata=meta(
        "micro-batches per optimizer step", min=1, max=1024))
    horovod: HorovodKnobs = field(default_factory=HorovodKnobs)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    preemption: Preemption = field(default_factory=Preemption)
    ledger: bool = field(default=False, metadata=meta(
        "record every sample id each rank trains on (ledger/ in the run directory)"))
    monitor: Monitor = field(default_factory=Monitor)
    tracking: Optional[Tracking] = field(default=None, metadata=meta(
        "experiment tracking: {mlflow: {uri, experiment}} (rank 0 logs to MLflow); unset: off",
        omit_unset=True))      # job.json (and the spec's digest) as before when unset
    seed: int = field(default=1234, metadata=meta(
        "the random seed: the model's initial weights, synthetic data, the validation split "
        "and each epoch's order of samples", min=0, max=2**32 - 1))
    startup_timeout_seconds: int = field(default=600, metadata=meta(
        "end the job when a rank has trained no step this many seconds after it started, "
        "naming where the ranks stopped (before Horovod's init, inside it, before the first "
        "step) instead of leaving it to its time limit; 0: never. The clock starts when "
        "`hpcsuite train` starts on the rank (the queue and the batch script's set-up do not "
        "count) and does not run while a checkpoint is restored; the framework's imports, "
        "Horovod's init, opening the data, building the model and the first step (with any "
        "compilation) count: raise it for a model that compiles for longer. Default 600",
        min=0, max=7 * 24 * 3600))

    def epoch_limit(self, steps_per_epoch: int) -> float:
        """Epochs to train: train.epochs; unset, 1, or with only train.max_steps set the
        (fractional) epochs its steps take, so max_steps alone is never capped at one epoch."""
        if self.epochs is not None:
            return float(self.epochs)
        if self.max_steps is None:
            return 1.0
        return self.max_steps / max(steps_per_epoch, 1)


@record
class Container(Record):
    """The image every rank runs in; the site profile's container.runtime starts it."""
    image: Optional[str] = field(default=None, metadata=meta(
        "the image the ranks run in (unset: on the host): a .sif file or docker:// URI "
        "(apptainer, singularity), an image reference or registry#image (pyxis), an image "
        "directory (charliecloud); the site's container.allowed_images apply",
        pattern=IMAGE, pattern_help=IMAGE_HELP, check=path_problem))
    binds: list[str] = field(default_factory=list, metadata=meta(
        "more host paths bound into the container, HOST or HOST:GUEST (the submit and run "
        "directories, checkpoints and data are bound already)", pattern=BIND,
        pattern_help=BIND_HELP, check=path_problem))


@record
class FabricPreflight(Record):
    """The allreduce every node pair (a ring of neighbours above 16 nodes) runs before training."""
    min_busbw_gbps: Union[float, Literal["site"]] = field(default="site", metadata=meta(
        "the bus bandwidth each pair must reach, in GB/s (1e9 bytes/s, nccl-tests' busbw); "
        "site: 80 % of the site profile's fabric (its preset's or its bandwidth)",
        min=0.001, max=100000.0, union_help="a bandwidth in GB/s (e.g. 10) or site"))
    size_mb: int = field(default=16, metadata=meta(
        "MiB of float32 each pair reduces per call (large enough to measure bandwidth, not "
        "latency)", min=1, max=1024))


@record
class Preflight(Record):
    """Checks before training: a node that would fail or slow the job ends it at once (exit
    2, the nodes named, the figures in the run directory's preflight.json), not hours in."""
    fabric: Optional[FabricPreflight] = field(default=None, metadata=meta(
        "measure the bus bandwidth between every pair of nodes (a ring above 16 nodes) with "
        "MPI's allreduce; unset: off"))
    gpu: bool = field(default=False, metadata=meta(
        "check each rank's GPU through NVML: volatile uncorrected ECC errors, retired pages or "
        "remapped rows pending, clocks slowed (not idle), another process on it, free memory"))
    gpu_free_gib: float = field(default=0.0, metadata=meta(
        "with gpu: the free GPU memory each rank needs, in GiB (0: not checked)",
        min=0.0, max=100000.0))

    @property
    def enabled(self) -> bool:
        return self.fabric is not None or self.gpu


LAUNCHER_HINT = ("; launcher: mpirun means the MPI's own launcher, which is mpiexec for the "
                 "site profile's mpi.flavour mpich or intelmpi")


@record
class JobSpec(Record):
    """A job: its name, template, resources, training and environment."""
    name: str = field(metadata=meta("job name", pattern=NAME, pattern_help=NAME_HELP))
    template: str = field(default="horovod", metadata=meta(
        "the sbatch template, NAME.sbatch.j2 found first on the search path: --template-dir, "
        "the project's, the user's, the site's, the built-in ones", pattern=TEMPLATE_NAME, pattern_help="a template name: letters, digits, _ . - (no /)"))
    launcher: Literal["mpirun", "srun"] = field(default="mpirun", metadata=meta(
        "how the batch script starts the ranks: mpirun, the MPI's own launcher (Open MPI's "
        "mpirun, Hydra's mpiexec for the site's mpi.flavour mpich or intelmpi), or srun (with "
        "the site's mpi.srun_mpi plugin: pmix for Open MPI, pmi2 for MPICH, by default)",
        hints={"mpiexec": LAUNCHER_HINT, "mpiexec.hydra": LAUNCHER_HINT}))
    output_dir: str = field(default="runs", metadata=meta(
        "where run directories go, relative to the submit directory (it names the Slurm log in "
        "the #SBATCH header, so only plain path characters)", pattern=PATH, pattern_help=PATH_HELP,
        nonempty=True))
    resources: Resources = field(default_factory=Resources)
    env: dict[str, str] = field(default_factory=dict, metadata=meta(
        "environment for every rank", key_pattern=ENV_NAME,
        key_help="not a valid environment variable name (letters, digits, _; at most 64)",
        keys="environment variable names, except those the batch shell, Slurm, Horovod's "
             "knobs and hpcsuite own (SHELLOPTS, SLURM_*, HOROVOD_FUSION_THRESHOLD, ...)",
        reserved_keys=reserved_env_name, values={"coerce": True}))
    train: Train = field(default_factory=Train)
    container: Container = field(default_factory=Container)
    preflight: Preflight = field(default_factory=Preflight)
    after: list[str] = field(default_factory=list, metadata=meta(
        "start only after these jobs: JOB (it completed), JOB:any (it ended) or JOB:notok (it "
        "failed); JOB is a job id or the name of a job submitted from here (its latest run). "
        "Submitting resolves names to job ids (sbatch --dependency)",
        pattern=AFTER, pattern_help=AFTER_HELP, coerce=True))

    @property
    def world_size(self) -> int:
        return self.resources.nodes * self.resources.tasks_per_node

    def to_dict(self) -> dict:
        return to_dict(self)

    def digest(self) -> str:
        """A stable hash of the whole spec (for results and checkpoints)."""
        import hashlib  # OpenSSL's import costs a login-node command ~5 ms; only needed here

        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_spec(path: str) -> JobSpec:
    return spec_from_dict(read_yaml(path), path)


def spec_from_dict(data: dict, source: str) -> JobSpec:
    return build(JobSpec, data, source)
