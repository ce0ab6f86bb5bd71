"""Write the docs site's reference pages (docs/reference/*.md) from the code's own metadata.

Every key of the job spec, the site profile, a sweep file and a study file comes from the
schema's dataclass fields (type, default, range and help from ``metadata=meta(...)``); what a site
can lock comes from :mod:`hpcsuite.submit.config` (its lock check, ``SITE_ONLY``, ``APPENDED``);
every command and option from walking the Click group (scripts/reference_cli.py; the Markdown
helpers both use are scripts/reference_md.py). Nothing is hand-written,
so a new key (or option) appears by running this again:

    .venv/bin/python scripts/gen_reference.py           # rewrite what changed (also `make docs`)
    .venv/bin/python scripts/gen_reference.py --check   # exit 1 naming the stale pages

tests/test_docs.py regenerates the pages in memory and fails when the committed ones differ.
The output is deterministic: fields in declaration order, commands sorted, no paths or times.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import reference_cli
from reference_md import BANNER, REGENERATE, code, docstring, md, notes, sentence, summary, table

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:       # this checkout's hpcsuite, also where it is not installed
    sys.path.insert(0, str(REPO))
DOCS = REPO / "docs"


# ---------------------------------------------------------------------- schema fields

def strip_optional(tp: Any) -> tuple[Any, bool]:
    if get_origin(tp) in (typing.Union, types.UnionType) and type(None) in get_args(tp):
        inner = [a for a in get_args(tp) if a is not type(None)]
        return (inner[0] if len(inner) == 1 else typing.Union[tuple(inner)]), True
    return tp, False


SCALAR_NAMES = {int: "integer", float: "number", str: "text", bool: "true or false", Any: "any value"}


LITERALS_IN_A_CELL = 3     # a choice of more values is "one of N values" in its table cell


def type_text(tp: Any, anchor_of, short: bool = False) -> str:
    """What a value of schema type ``tp`` is, in words (a record links to its section);
    ``short``: a long choice of values only counted, for a table cell."""
    tp, optional = strip_optional(tp)
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        text = (f"one of {len(args)} values" if short and len(args) > LITERALS_IN_A_CELL
                else "one of " + ", ".join(f"`{a}`" for a in args))
    elif origin in (typing.Union, types.UnionType):
        text = " or ".join(type_text(a, anchor_of, short) for a in args)
    elif origin in (list, tuple):
        text = f"list of {type_text(args[0], anchor_of, short)}"
    elif origin is dict:
        text = f"mapping of names to {type_text(args[1], anchor_of, short)}"
    elif dataclasses.is_dataclass(tp):
        anchor = anchor_of(tp)
        text = f"[{tp.__name__}](#{anchor})" if anchor else tp.__name__
    else:
        text = SCALAR_NAMES.get(tp, getattr(tp, "__name__", str(tp)))
    return f"{text} or null" if optional else text


def allowed_text(meta: dict) -> str:
    """The field's constraints (range, pattern, length) as one cell."""
    parts = []
    lo, hi = meta.get("min"), meta.get("max")
    if lo is not None and hi is not None:
        parts.append(f"{lo} to {hi}")
    elif lo is not None:
        parts.append(f"at least {lo}")
    elif hi is not None:
        parts.append(f"at most {hi}")
    for key in ("pattern_help", "union_help"):
        if meta.get(key):
            parts.append(md(meta[key]))
    if meta.get("key_pattern"):
        parts.append(keys_text(meta))
    if meta.get("max_length"):
        parts.append(f"at most {meta['max_length']} characters")
    if meta.get("nonempty"):
        parts.append("not empty")
    if meta.get("coerce"):
        parts.append("numbers read as text")
    return "; ".join(parts)


def keys_text(meta: dict) -> str:
    """What a mapping's keys may be, said positively: its ``keys`` text and the pattern they
    match. ``key_help`` is the refusal a user gets ("not a ..."), not a description."""
    if not meta.get("keys"):
        raise ValueError(f"a field with key_pattern {meta['key_pattern']!r} has no keys= text "
                         "saying what its keys are (the reference does not print key_help, "
                         "the error)")
    return f"keys: {md(meta['keys'])} (`{meta['key_pattern']}`)"


def default_text(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "**required**"
    if dataclasses.is_dataclass(value) and not _differs_from_own_defaults(value):
        return "(section)"
    if value is None:
        return "unset"
    return code(value)


def _differs_from_own_defaults(value: Any) -> bool:
    try:
        return value != type(value)()
    except TypeError:      # a record with required keys
        return True


@dataclasses.dataclass
class Section:
    path: str              # dotted key of the section ("" for the top level)
    cls: type
    rows: list = dataclasses.field(default_factory=list)


def sections(cls: type) -> list[Section]:
    """Every record of a schema, depth first in field order; a record type met again (eval.data
    has train.data's keys) links to its first section instead of repeating it."""
    out: list[Section] = []
    seen: dict[type, str] = {}

    def visit(record: type, path: str) -> None:
        seen[record] = path
        out.append(Section(path, record))
        hints = typing.get_type_hints(record)
        for f in dataclasses.fields(record):
            if not f.init:
                continue
            inner, _ = strip_optional(hints[f.name])
            key = f"{path}.{f.name}" if path else f.name
            if get_origin(inner) is dict:          # partitions: {NAME: Partition}
                inner, key = get_args(inner)[1], f"{key}.NAME"
            for tp in (inner, *get_args(inner)):
                if dataclasses.is_dataclass(tp) and tp not in seen:
                    visit(tp, key)
    visit(cls, "")
    return out


def anchor(path: str) -> str:
    return path or "top-level"


DEFAULT_IN_A_CELL = 36     # a longer default is in the key's entry under the table

KEY_TABLE = ["key", "type", "default", "help"]

HOW_TO_READ = ("A section's table gives each key's type, default and, in a few words, what it is "
               "for; the list under the table has the whole help (where the row links to it), "
               "what a value must be (*Allowed*) and anything else the row leaves out.")


@dataclasses.dataclass
class Key:
    """One key of a section: its table row and its entry in the list under the table."""
    key: str
    type_cell: str
    type_full: str
    default: str
    allowed: str
    help: str              # the whole help, Markdown
    help_cell: str         # its first clause, Markdown
    lock: str | None

    @property
    def anchor(self) -> str:
        return f"key-{self.key}"

    def moved(self) -> bool:
        """Whether the row leaves out some of the help, the type or the default."""
        return (self.help_cell != self.help or self.type_cell != self.type_full
                or len(self.default) > DEFAULT_IN_A_CELL)

    def row(self) -> list[str]:
        default = self.default if len(self.default) <= DEFAULT_IN_A_CELL else "(below)"
        more = f" [more](#{self.anchor})" if self.moved() else ""
        return [f"`{self.key}`", self.type_cell, default, self.help_cell + more]

    def parts(self, usual_lock: str | None) -> list[str]:
        out = [sentence(self.help)] if self.help_cell != self.help else []
        if self.type_cell != self.type_full:
            out.append(f"*Type:* {sentence(self.type_full)}")
        if len(self.default) > DEFAULT_IN_A_CELL:
            out.append(f"*Default:* {sentence(self.default)}")
        if self.allowed:
            out.append(f"*Allowed:* {sentence(self.allowed)}")
        if self.lock is not None and lock_kind(self.key, self.lock) != usual_lock:
            out.append(f"*Site lock:* {sentence(self.lock)}")
        return out


def lock_kind(key: str, lock: str) -> str:
    """A key's site lock with the key itself left out: `site.python` is `site.KEY`."""
    return lock.replace(f"`site.{key}`", "`site.KEY`")


def schema_page(title: str, source: str, intro: str, cls: type, lock_of) -> str:
    """One reference page: a section per record, a row per key, the list under each table."""
    found = sections(cls)
    anchors = {s.cls: anchor(s.path) for s in found}
    keyed = [(section, _keys(section, anchors.get, lock_of)) for section in found]
    kinds = collections.Counter(lock_kind(k.key, k.lock) for _, keys in keyed for k in keys
                                if k.lock is not None)
    usual = kinds.most_common(1)[0][0] if kinds else None
    out = [BANNER.format(source=source), f"# {title}\n", intro.strip() + "\n", HOW_TO_READ + "\n"]
    if usual:
        out.append(f"*Site lock*: {usual} for every key below, unless its entry under its "
                   "table says otherwise.\n")
    for section, keys in keyed:
        name = f"`{section.path}`" if section.path else "Top level"
        out.append(f"## {name} {{#{anchor(section.path)}}}\n")
        doc = docstring(section.cls) if section.cls.__doc__ else ""
        if doc and not doc.startswith(f"{section.cls.__name__}("):   # not dataclass's own
            out.append(doc + "\n")
        out.append(table(KEY_TABLE, [k.row() for k in keys]))
        listed = notes([(f"`{k.key}`", k.anchor, k.parts(usual)) for k in keys])
        if listed:
            out.append(listed)
    return "\n".join(out)


def _keys(section: Section, anchor_of, lock_of) -> list[Key]:
    hints = typing.get_type_hints(section.cls)
    keys = []
    for f in dataclasses.fields(section.cls):
        if not f.init:
            continue
        key = f"{section.path}.{f.name}" if section.path else f.name
        meta = dict(f.metadata)
        whole = meta.get("help", "")
        extra = _extra_help(section.cls, f.name)
        if extra:
            whole = f"{sentence(whole)} {extra}"
        cell, cut = summary(whole)
        keys.append(Key(key, type_text(hints[f.name], anchor_of, short=True),
                        type_text(hints[f.name], anchor_of), default_text(f), allowed_text(meta),
                        md(whole), md(cell) if cut else md(whole),
                        lock_of(key) if lock_of else None))
    return keys


def _extra_help(cls: type, name: str) -> str:
    """What a Horovod knob sets for every rank (hpcsuite.submit.knobs, the knobs' one table)."""
    from hpcsuite.submit import knobs
    from hpcsuite.submit.spec import HorovodKnobs

    if cls is HorovodKnobs and knobs.BY_NAME[name].env:
        variables = ", ".join(f"`{v}`" for v in knobs.BY_NAME[name].env)
        return f"Sets {variables} for every rank."
    return ""


# ---------------------------------------------------------------------- the four schemas

def job_lock(key: str) -> str:
    """Whether the site profile's ``locked:`` takes the job key (its own check decides)."""
    from hpcsuite.errors import UserError
    from hpcsuite.submit.config import check_job_key

    try:
        check_job_key(key, "locked", "locked[0]")
    except UserError:
        return "no"
    return "yes"


def profile_lock(key: str) -> str:
    from hpcsuite.errors import UserError
    from hpcsuite.submit.config import APPENDED, SITE_ONLY, check_profile_key

    top = key.split(".")[0]
    if top in SITE_ONLY:
        return "site only"
    if top in APPENDED:
        return "site lines kept, later layers add"
    try:
        check_profile_key(key, "locked", "locked[0]")
    except UserError:
        return "no"
    return f"`site.{key}`"


def job_spec_page() -> str:
    from hpcsuite.submit.spec import JobSpec

    intro = """
Every key of a job spec (`hpcsuite.submit.spec.JobSpec`), in the order the schema declares
them. An unknown key, a wrong type or a value outside *allowed* is refused when the file is
read, naming the file and the dotted key (exit 2). The same keys are what `--set KEY=VALUE`,
a profile's `defaults:`, a sweep's axes and a site's `locked:` name. *site lock*: what a site
profile writes in `locked:` to fix the key for every user, project, spec and `--set`
([Site profiles](../admin/site-profiles.md), [Locks](../admin/locks.md)); a mapping's entries
lock one by one too (`env.NCCL_IB_HCA`).
"""
    return schema_page("Job spec reference", "hpcsuite/submit/spec.py", intro, JobSpec, job_lock)


def site_profile_page() -> str:
    from hpcsuite.submit import config
    from hpcsuite.submit.site_profile import SiteProfile

    extras = ", ".join(f"`{k}`" for k in config.LAYER_EXTRAS)
    intro = f"""
Every key of a site profile (`hpcsuite.submit.site_profile.SiteProfile`). A profile file
(site, user or project layer) holds these keys and also {extras}.
How the layers combine (`hpcsuite.submit.config`):

{docstring(config)}

*site lock*: `site only` keys (`SITE_ONLY`) are the site profile's alone once one is in
force; lists marked as kept (`APPENDED`) always run the site's lines, user and project layers
add theirs after them; any other key is locked by naming it with `site.` in `locked:`.
"""
    return schema_page("Site profile reference", "hpcsuite/submit/site_profile.py", intro,
                       SiteProfile, profile_lock)


def sweep_page() -> str:
    from hpcsuite.sweep import spec

    metrics = ", ".join(f"`{k}` ({goal})" for k, goal in spec.METRICS.items())
    intro = f"""
Every key of a sweep file (`hpcsuite.sweep.spec.Sweep`), read by `hpcsuite sweep run`.

{docstring(spec)}

Metrics a report ranks by, with their goal unless `metric.goal` says otherwise: {metrics},
and `metrics.KEY` (a script's own number). Distributions for `random`:
{", ".join(f"`{d}`" for d in spec.DISTRIBUTIONS)}. At most {spec.MAX_ELEMENTS} elements.
Keys a sweep sets for every element and no axis may vary: {", ".join(f"`{k}`" for k in spec.SWEEP_SETS)}.
The site's locks apply to every element as to a `--set`; the sweep file itself has no site keys.
"""
    return schema_page("Sweep file reference", "hpcsuite/sweep/spec.py", intro, spec.Sweep, None)


def study_page() -> str:
    from hpcsuite.study import points

    rows = [[f"`{axis}`", f"`{key}`"] for axis, key in points.AXES.items()]
    rows += [[f"`horovod.{knob}`", f"`train.horovod.{knob}`"] for knob in points.HOROVOD_AXES]
    intro = f"""
Every key of a study file (`hpcsuite.study.points.Study`), read by `hpcsuite study run`.

{docstring(points)}

The axes a study sweeps, and the job key each sets:

{table(["axis", "job key"], rows)}
Every point goes through the site's layers and locks as a job spec does; the study file
itself has no site keys.
"""
    return schema_page("Study file reference", "hpcsuite/study/points.py", intro, points.Study,
                       None)


# ---------------------------------------------------------------------- the pages

PAGES = {
    "reference/job-spec.md": job_spec_page,
    "reference/site-profile.md": site_profile_page,
    "reference/sweep.md": sweep_page,
    "reference/study.md": study_page,
    "reference/cli.md": reference_cli.cli_page,
}


def pages() -> dict[Path, str]:
    """Every generated page's path and text, built in memory."""
    return {DOCS / name: make().rstrip("\n") + "\n" for name, make in PAGES.items()}


def stale(generated: dict[Path, str]) -> list[Path]:
    return [p for p, text in generated.items()
            if not p.is_file() or p.read_text(encoding="utf-8") != text]


def main(argv: list[str]) -> int:
    generated = pages()
    old = stale(generated)
    if "--check" in argv:
        for path in old:
            print(f"stale: {path.relative_to(REPO)}; run {REGENERATE}", file=sys.stderr)
        return 1 if old else 0
    for path in old:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(generated[path], encoding="utf-8")
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
