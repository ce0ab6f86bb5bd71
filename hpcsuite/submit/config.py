"""Layered configuration: built-in < site < user < project < job spec < --set.

Site, user and project layers are profile files (YAML) that hold site-profile keys
(:class:`~hpcsuite.submit.site_profile.SiteProfile`), ``env`` (environment for every rank: a shorthand for
``defaults.env``), ``defaults`` (any job-spec keys) and, in the site layer only, ``locked``: job
keys (``resources.partition``) and profile keys (``site.python``) no later layer may change.
Every layer is validated on its own, so an error names the file that holds the bad key; then
layers are merged key by key, remembering which layer set each value (``hpcsuite config show
--origin``).

What a site profile says holds at every layer: the keys that describe the cluster
(:data:`SITE_ONLY`: partitions with their accounts, QOS and time limits, MPI arguments,
``module_init``) are the site's alone once a site profile is in force; its ``modules`` and
``setup`` lines are always kept (user and project layers add to them, :data:`APPENDED`); and a
site that sets ``pinned: true`` in ``/etc/hpcsuite/profile.yaml`` cannot be swapped out by
``--profile``, ``HPCSUITE_PROFILE`` or ``HPCSUITE_SITE_DIR``.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Iterable

import yaml

from ..records import Record, record
from ..errors import ConfigError, UserError, close_match, key_text, show
from .site_profile import SiteProfile
from .schema import build, convert, key_paths, read_yaml, to_dict
from .strict_yaml import Ambiguous, StrictYAMLError, load
from .spec import JobSpec, spec_from_dict

PROFILE_FILE = "profile.yaml"
LAYER_EXTRAS = ("defaults", "env", "locked")
# Where a site pins its profile. A constant, not a setting: nothing a user controls moves it.
SYSTEM_DIR = Path("/etc/hpcsuite")
# Profile keys that describe the cluster: once a site profile is in force, only it sets them.
SITE_ONLY = ("name", "contact", "pinned", "allow_unlimited_time", "module_init", "partitions",
             "mpi", "sbatch_allowed", "container", "sweep_max_parallel")
# Job keys that are mappings of names: `--set` (and a sweep's axes) may name one entry.
MAPPINGS = ("env.", "train.model_args.", "train.data.args.")
# Profile lists that later layers add to and never replace: the site's lines always run.
APPENDED = ("modules", "module_paths", "setup")


@record
class Layer(Record):
    """One configuration layer: its name, file and partial job spec."""
    name: str                 # builtin, site, user, project, spec, set
    source: str               # the file (or "--set")
    job: dict                 # validated partial job spec
    profile: dict             # validated partial site profile
    locked: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return self.name if self.name == "builtin" else f"{self.name} ({self.source})"


@record
class Resolved(Record):
    """The job and site profile after every layer, and which layer set each key."""
    job: JobSpec
    profile: SiteProfile
    origins: dict[str, str]   # dotted key -> layer label ("job.resources.nodes": "spec (x.yaml)")
    layers: tuple[Layer, ...]

    @property
    def locks(self) -> tuple[str, ...]:
        """Every locked key, job keys as written (``resources.partition``), profile keys with
        ``site.``; the site-only profile keys are included when a site profile is in force."""
        return locked_keys(self.layers)


def locked_keys(layers: Iterable[Layer]) -> tuple[str, ...]:
    out: list[str] = []
    for layer in layers:
        if layer.name == "site":
            out += [*layer.locked, *(f"site.{k}" for k in SITE_ONLY)]
    return tuple(dict.fromkeys(out))


def is_locked(key: str, locks: Iterable[str]) -> bool:
    """Whether ``job.X``/``site.X`` (a `config show` key) is covered by a lock."""
    for lock in locks:
        full = lock if lock.startswith("site.") else f"job.{lock}"
        if _covers(full, key):
            return True
    return False


# ---------------------------------------------------------------------- layer files

@record
class SiteLocation(Record):
    """Where the site's profile and templates are, and whether the profile is pinned."""
    profile: Path | None   # the site profile file in force, if any
    dir: Path              # the site directory (its templates/ are on the search path)
    pinned: bool


def site_location(profile_path: str | None = None) -> SiteLocation:
    """Where the site profile and templates are. A pinned system profile wins over
    ``--profile``/``HPCSUITE_PROFILE`` and ``HPCSUITE_SITE_DIR``, which are then refused."""
    system = SYSTEM_DIR / PROFILE_FILE
    if _is_file(system) and read_yaml(str(system)).get("pinned") is True:
        if profile_path and Path(profile_path).absolute() != system:
            raise UserError(f"--profile/HPCSUITE_PROFILE: this site pins its profile at {system} "
                            "(pinned: true); another site profile cannot be used")
        env_dir = os.environ.get("HPCSUITE_SITE_DIR")
        if env_dir and Path(env_dir).absolute() != SYSTEM_DIR:
            raise UserError(f"HPCSUITE_SITE_DIR: this site pins its profile at {system} "
                            "(pinned: true); unset HPCSUITE_SITE_DIR")
        return SiteLocation(system, SYSTEM_DIR, True)
    directory = Path(os.environ.get("HPCSUITE_SITE_DIR") or SYSTEM_DIR)
    if profile_path:
        return SiteLocation(Path(profile_path), directory, False)
    found = directory / PROFILE_FILE
    return SiteLocation(found if _is_file(found) else None, directory, False)


def site_dir() -> Path:
    return site_location().dir


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError as e:   # a name too long, a permission denied on the way
        raise UserError(f"{path}: {e.strerror}") from None


def user_dir() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "hpcsuite"


def project_dir(cwd: Path | None = None) -> Path:
    return (cwd or Path.cwd()) / ".hpcsuite"


def builtin_layer() -> Layer:
    return Layer("builtin", "hpcsuite", _defaults(JobSpec), _defaults(SiteProfile))


def _defaults(cls) -> dict:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = to_dict(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = to_dict(f.default_factory())
    return out


def load_profile_layer(name: str, path: str, site: str | None = None) -> Layer:
    """One profile file as a layer; ``site``: the site profile in force below it, if any."""
    data = read_yaml(path)
    valid = [f.name for f in dataclasses.fields(SiteProfile)] + list(LAYER_EXTRAS)
    for key in data:
        if key not in valid:
            hint = close_match(key, valid) if isinstance(key, str) and len(key) < 100 else ""
            raise ConfigError(path, key_text(key), f"unknown key{hint}; "
                                                   f"valid keys: {', '.join(sorted(valid))}")
        if site and name != "site" and key in SITE_ONLY:
            raise ConfigError(path, key, f"only the site profile ({site}) sets {key}; it "
                                         "describes the cluster")
    extras = {k: data.pop(k) for k in LAYER_EXTRAS if k in data}
    profile = build(SiteProfile, data, path, partial=True)
    job = build(JobSpec, extras.get("defaults") or {}, path, "defaults", partial=True)
    if "env" in extras:
        env_field = next(f for f in dataclasses.fields(JobSpec) if f.name == "env")
        env = convert(dict[str, str], extras["env"], path, "env", env_field.metadata)
        job["env"] = {**job.get("env", {}), **env}
    locked: tuple[str, ...] = ()
    if "locked" in extras:
        if name != "site":
            raise ConfigError(path, "locked", "only the site profile can lock keys")
        locked = tuple(convert(list[str], extras["locked"], path, "locked"))
        for i, key in enumerate(locked):
            if key.startswith("site."):
                check_profile_key(key[5:], path, f"locked[{i}]")
            else:
                check_job_key(key, path, f"locked[{i}]")
    return Layer(name, path, job, profile, locked)


def check_job_key(key: str, source: str, where: str) -> None:
    valid = key_paths(JobSpec)
    if key in valid or any(key.startswith(m) and key[len(m):].isidentifier() for m in MAPPINGS):
        return
    option = key[len("resources.extra_sbatch."):]
    if key.startswith("resources.extra_sbatch.") and option.replace("-", "").isalnum():
        return   # one sbatch option (the site's sbatch_allowed decides which)
    # Said as a file's unknown key is: the first unknown part, its close match and the valid
    # keys at that level.
    if where != key:                 # a lock names a key: the closest whole key
        raise ConfigError(source, where, f"{show(key)} is not a job key{close_match(key, valid)}")
    parts = key.split(".")
    for i in range(len(parts)):
        prefix = ".".join(parts[:i + 1])
        if not any(v == prefix or v.startswith(prefix + ".") for v in valid):
            break
    parent = ".".join(parts[:i])
    level = sorted({v[len(parent) + 1:].split(".")[0] if parent else v.split(".")[0]
                    for v in valid if not parent or v.startswith(parent + ".")})
    raise ConfigError(source, ".".join(parts[:i + 1]),
                      f"unknown key{close_match(parts[i], level)}; valid keys: {', '.join(level)}")


def check_profile_key(key: str, source: str, where: str) -> None:
    valid = key_paths(SiteProfile)
    if key in valid or (key.startswith("partitions.") and key.count(".") >= 1):
        return
    raise ConfigError(source, where, f"{show('site.' + key)} is not a site profile key"
                                     f"{close_match(key, valid)}")


def set_layer(assignments: Iterable[str]) -> Layer:
    """``--set resources.nodes=2 --set env.NCCL_DEBUG=INFO`` as the last layer."""
    data: dict = {}
    for item in assignments:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise UserError(f"--set: expected KEY=VALUE, got {item!r}")
        check_job_key(key, "--set", key)
        try:
            value = load(text) if text else ""
        except (yaml.YAMLError, StrictYAMLError):
            value = text
        if isinstance(value, (dict, list)):
            raise ConfigError("--set", key, "a single value is expected, not a mapping or list")
        if key.startswith("env.") or value is None or isinstance(value, Ambiguous):
            value = text   # on a command line 10:00 is the text the user typed
        _put(data, key, value)
    return Layer("set", "--set", build(JobSpec, data, "--set", partial=True), {})


def discover(spec_path: str | None, profile_path: str | None = None, sets: Iterable[str] = (),
             cwd: Path | None = None, ambient: bool = True) -> list[Layer]:
    """The layers in force, lowest first. ``profile_path`` replaces the site profile file;
    ``ambient=False`` ignores the site, user and project files found on this machine."""
    layers = [builtin_layer()]
    site = None
    if ambient:
        site = site_location(profile_path).profile
    elif profile_path:
        site = Path(profile_path)
    if site is not None:
        layers.append(load_profile_layer("site", str(site)))
    for name, d in (("user", user_dir()), ("project", project_dir(cwd))):
        if ambient and _is_file(d / PROFILE_FILE):
            layers.append(load_profile_layer(name, str(d / PROFILE_FILE),
                                             str(site) if site else None))
    if spec_path:
        layers.append(Layer("spec", spec_path, build(JobSpec, read_yaml(spec_path), spec_path,
                                                     partial=True), {}))
    sets = list(sets)
    if sets:
        layers.append(set_layer(sets))
    return layers


# ---------------------------------------------------------------------- merging

def merge(layers: list[Layer]) -> tuple[dict, dict, dict[str, str]]:
    job: dict = {}
    profile: dict = {}
    origins: dict[str, str] = {}
    locks: dict[str, tuple[Layer, dict]] = {}   # lock -> (site layer, configuration then)
    for layer in layers:
        changes = [(key, value) for key, value in _leaves(layer.job)]
        changes += [(f"site.{key}", value) for key, value in _leaves(layer.profile)]
        for key, value in changes:
            for lock, (site, frozen) in locks.items():
                if _covers(lock, key) and _changes(key, value, frozen):
                    contact = site.profile.get("contact")
                    hint = f"talk to {contact}" if contact else "talk to your site's HPC support"
                    raise ConfigError(layer.source, key, f"the site fixes {lock} (in {site.source}); "
                                                         f"{hint} to change it")
        _deep_merge(job, layer.job, origins, "job", layer.label)
        _deep_merge(profile, layer.profile, origins, "site", layer.label, append=APPENDED)
        for lock in layer.locked:
            locks[lock] = (layer, {**_snapshot(job), "site": _snapshot(profile)})
    return job, profile, origins


def _changes(key: str, value: Any, frozen: dict) -> bool:
    if key.startswith("site.") and key[5:] in APPENDED:
        return bool(value)   # adding lines to a locked list changes it
    return _get(frozen, key, _MISSING) != value


def resolve(spec_path: str | None, profile_path: str | None = None, sets: Iterable[str] = (),
            cwd: Path | None = None, ambient: bool = True) -> Resolved:
    layers = discover(spec_path, profile_path, sets, cwd, ambient)
    job, profile, origins = merge(layers)
    built = spec_from_dict(job, spec_path or "(no spec)")
    site = build(SiteProfile, profile, next((l.source for l in layers if l.name == "site"), "site"))
    check_site_rules(built, site, origins, layers)
    return Resolved(built, site, origins, tuple(layers))


def check_site_rules(job: JobSpec, profile: SiteProfile, origins: dict[str, str],
                     layers: Iterable[Layer]) -> None:
    """What the job asks of Slurm against what the site allows: the partition's account, QOS,
    reservation and constraint, its allow-lists, and the site's sbatch_allowed. Errors name
    the file (layer) that set the key."""
    r = job.resources
    partition = profile.partitions.get(r.partition or "")

    def refuse(key: str, message: str) -> None:
        raise ConfigError(_source_of(f"job.{key}", origins, layers), key, message)

    for key, allowed in (("account", "allow_accounts"), ("qos", "allow_qos")):
        value = getattr(r, key)
        if value is None or partition is None:
            continue
        fixed, choices = getattr(partition, key), getattr(partition, allowed)
        if fixed and value != fixed:
            refuse(f"resources.{key}", f"partition {r.partition} runs every job with {key} "
                                       f"{fixed}; leave resources.{key} unset or write {fixed}")
        if choices and value not in choices:
            refuse(f"resources.{key}", f"{value!r} is not allowed on partition {r.partition}"
                                       f"{close_match(value, choices)}; it allows: "
                                       f"{', '.join(choices)}")
    if r.constraint and partition is not None and partition.constraint \
            and r.constraint != partition.constraint:
        refuse("resources.constraint", f"partition {r.partition} requires the features "
                                       f"{partition.constraint} for every job; leave "
                                       "resources.constraint unset")
    from .containers import problems as container_problems

    for key, message in container_problems(job, profile.container)[:1]:
        # A launcher left at its default is refused where the image was asked for.
        where = key if origins.get(f"job.{key}", "builtin") != "builtin" else "container.image"
        raise ConfigError(_source_of(f"job.{where}", origins, layers), key, message)
    from .preflight import check_site   # the file that asked names the key
    check_site(job, profile, origins, lambda key: _source_of(key, origins, layers))
    if "NONE" in r.mail_type and len(r.mail_type) > 1:
        refuse("resources.mail_type", "NONE cannot be combined with other mail types")
    allowed = profile.sbatch_allowed
    for option, value in r.extra_sbatch.items():
        key = f"resources.extra_sbatch.{option}"
        if option not in allowed:
            listed = ", ".join(allowed) if allowed else "none (sbatch_allowed is empty)"
            refuse(key, f"--{option} is not an sbatch option this site allows"
                        f"{close_match(option, allowed)}; it allows: {listed}")
        problem = _extra_problem(option, value, partition)
        if problem:
            refuse(key, problem)


def _extra_problem(option: str, value: bool | str, partition: Any) -> str | None:
    from .sbatch_header import LONG

    kind = LONG[option]   # sbatch_allowed holds sbatch options only
    if kind == "0" and not isinstance(value, bool):
        return f"--{option} takes no value: write true (or false to leave it out)"
    if kind == "1" and isinstance(value, bool):
        return f"--{option} needs a value"
    if partition is not None and getattr(partition, option.replace("-", "_"), None):
        return f"the partition sets --{option} for every job"
    return None


def _source_of(key: str, origins: dict[str, str], layers: Iterable[Layer]) -> str:
    """The file of the layer that set ``key`` (or the nearest key above or below it)."""
    label = origins.get(key) or next((v for k, v in origins.items() if k.startswith(key + ".")),
                                     None)
    parent = key
    while label is None and "." in parent:
        parent = parent.rsplit(".", 1)[0]
        label = origins.get(parent)
    for layer in layers:
        if label and layer.label == label.split(" + ")[-1]:
            return layer.source
    return label or "(configuration)"


def merged_view(spec_path: str | None, profile_path: str | None = None, sets: Iterable[str] = (),
                cwd: Path | None = None) -> tuple[dict, dict[str, str], tuple[str, ...]]:
    """Merged configuration, no complete job required (`config show`), and the locked keys."""
    layers = discover(spec_path, profile_path, sets, cwd)
    job, profile, origins = merge(layers)
    return {"job": job, "site": profile}, origins, locked_keys(layers)


_MISSING = object()


def _leaves(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value:
            yield from _leaves(value, path)
        else:
            yield path, value


def _covers(lock: str, key: str) -> bool:
    return key == lock or key.startswith(lock + ".")


def _get(tree: dict, key: str, default: Any) -> Any:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _put(tree: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    for part in parts[:-1]:
        tree = tree.setdefault(part, {})
    tree[parts[-1]] = value


def _snapshot(tree: dict) -> dict:
    return {k: _snapshot(v) if isinstance(v, dict) else v for k, v in tree.items()}


def _deep_merge(into: dict, new: dict, origins: dict[str, str], prefix: str, label: str,
                append: tuple[str, ...] = ()) -> None:
    for key, value in new.items():
        path = f"{prefix}.{key}"
        if key in append and isinstance(value, list) and into.get(key):
            if not value:
                continue
            old = into[key]
            into[key] = old + ([v for v in value if v not in old] if key != "setup" else value)
            origins[path] = f"{origins[path]} + {label}" if path in origins else label
        elif isinstance(value, dict) and isinstance(into.get(key), dict):
            if value:
                origins.pop(path, None)   # the container's own origin gives way to its keys
                _deep_merge(into[key], value, origins, path, label)
            elif not into[key]:
                origins[path] = label
        else:
            into[key] = _snapshot(value) if isinstance(value, dict) else value
            for stale in [k for k in origins if k.startswith(path + ".")]:
                del origins[stale]
            if isinstance(value, dict) and value:
                for leaf, _ in _leaves(value, path):
                    origins[leaf] = label
            else:
                origins[path] = label
