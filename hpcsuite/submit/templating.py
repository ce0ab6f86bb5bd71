"""Template search path and strict, shell-aware Jinja rendering.

Templates resolve through one ordered list of directories, highest precedence first:
``--template-dir``, the project (``./.hpcsuite/templates``), the user
(``~/.config/hpcsuite/templates``), the site (``$HPCSUITE_SITE_DIR/templates``, else
``/etc/hpcsuite/templates``), and the built-in ``templates/`` shipped with hpcsuite.

A template may extend the one it overrides by naming its layer: a site's ``horovod.sbatch.j2``
starts with ``{% extends "builtin/horovod.sbatch.j2" %}`` and overrides only the blocks it
needs (``sbatch``, ``modules``, ``setup``, ``environment``, ``launch``).

Every ``{{ expression }}`` is shell-quoted on output (Jinja's ``finalize`` hook), the way
HTML templates autoescape: a template author cannot forget to quote, and a value cannot
inject shell. Code that builds trusted fragments (an argv already joined) marks them Raw.

Templates render in Jinja's sandbox: a user or project template can arrange text, not run
Python (no ``__class__``/``__globals__`` walks, no mutation of the objects it is given). Every
failure while loading or rendering, whatever raised it, becomes one line naming the template
file and line.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import jinja2
import jinja2.runtime
import jinja2.sandbox

from ..records import Record, record
from ..errors import UserError, close_match, show
from ..shell import Raw, Rendered, quote

SUFFIX = ".sbatch.j2"
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")   # as spec.TEMPLATE_NAME


def check_name(name: str) -> str:
    """A template name is a file name in one directory: no '/', no '..', not too long."""
    if not NAME.fullmatch(name):
        raise UserError(f"template name {show(name)} is not valid: letters, digits, _ . - "
                        "(no /), starting with a letter, digit or _, at most 100 characters")
    return name


def _is(path: Path, test: str) -> bool:
    try:
        return getattr(path, test)()
    except OSError as e:
        raise UserError(f"{path}: {e.strerror}") from None


def builtin_dir() -> Path:
    # The package's own directory (templates/ in the source tree, hpcsuite/templates in a
    # wheel); importlib.resources would cost a login-node command its zipfile import.
    import hpcsuite.templates

    return Path(hpcsuite.templates.__file__).parent


@record
class SearchPath(Record):
    """The template directories, highest precedence first."""
    dirs: tuple[tuple[str, Path], ...]   # (layer, directory), highest precedence first

    @classmethod
    def default(cls, template_dir: str | None = None, cwd: Path | None = None,
                site_only: bool = False) -> "SearchPath":
        """The full search path; ``site_only`` (the site locks ``template``): the site's
        templates and the built-in ones only, so no project, user or --template-dir file
        can stand in for the template the site fixed."""
        from .config import site_dir

        cwd = cwd or Path.cwd()
        config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
        site = site_dir()
        dirs = []
        if template_dir and site_only:
            raise UserError("--template-dir: the site locks the template; its own templates "
                            "are the only ones used")
        if template_dir:
            dirs.append(("cli", Path(template_dir).absolute()))
        if not site_only:
            dirs += [("project", cwd / ".hpcsuite" / "templates"),
                     ("user", config / "hpcsuite" / "templates")]
        dirs += [("site", Path(site) / "templates"),
                 ("builtin", builtin_dir())]
        return cls(tuple(dirs))

    @classmethod
    def builtin_only(cls) -> "SearchPath":
        return cls((("builtin", builtin_dir()),))

    def existing(self) -> list[Path]:
        return [d for _, d in self.dirs if _is(d, "is_dir")]

    def names(self) -> list[str]:
        found = set()
        for d in self.existing():
            found.update(p.name[: -len(SUFFIX)] for p in d.glob(f"*{SUFFIX}"))
        return sorted(n for n in found if NAME.fullmatch(n))

    def candidates(self, name: str) -> list[tuple[str, Path]]:
        """Every (layer, file) that provides ``name``, winner first."""
        check_name(name)
        return [(layer, d / f"{name}{SUFFIX}") for layer, d in self.dirs
                if _is(d / f"{name}{SUFFIX}", "is_file")]

    def listing(self) -> str:
        return "\n".join(f"{i}. {layer:8} {d}{'' if _is(d, 'is_dir') else '  (absent)'}"
                         for i, (layer, d) in enumerate(self.dirs, 1))

    def layer_of(self, file: Path) -> str | None:
        """The search-path layer (cli, project, user, site, builtin) ``file`` lies in."""
        return next((layer for layer, d in self.dirs if file.parent == d), None)

    def which(self, name: str) -> Path:
        check_name(name)
        for d in self.existing():
            path = d / f"{name}{SUFFIX}"
            if _is(path, "is_file"):
                return path
        names = self.names()
        raise UserError(f"template {name!r} not found{close_match(name, names)}; available: "
                        f"{', '.join(names) or 'none'} (search path: "
                        f"{', '.join(str(d) for _, d in self.dirs)})")


class _Block:
    """``super()`` in a template: the parent block's text, which must not be quoted again."""

    def __init__(self, ref: jinja2.runtime.BlockReference):
        self._ref = ref

    def __call__(self) -> Rendered:
        return Rendered(self._ref())

    @property
    def super(self):
        parent = self._ref.super
        return _Block(parent) if isinstance(parent, jinja2.runtime.BlockReference) else parent


class _ShellContext(jinja2.runtime.Context):
    def super(self, name, current):
        ref = super().super(name, current)
        return _Block(ref) if isinstance(ref, jinja2.runtime.BlockReference) else ref


# While rendering, every {{ value }} is emitted as OPEN quoted MID raw CLOSE: the script body
# gets the shell-quoted form, an #SBATCH line the raw one, which must then be a plain word for
# sbatch's tokeniser (shell quoting means nothing to it, and bash reads those lines as
# comments). NUL never comes from a value (quote() refuses it), so text holding a marker is
# template output, passed through like super().
_OPEN, _MID, _CLOSE = "\0<", "\0|", "\0>"
_SPACE = " \t\n\v\f\r"
# Characters sbatch's tokeniser gives meaning to in an #SBATCH line (see sbatch_header.py).
_HEADER_UNSAFE = set(_SPACE) | set("'\"\\#")


# A raw part starting with this was quoted for sbatch's tokeniser by the sbatch_value filter.
_SBATCH_QUOTED = "\0q"
# sbatch looks for these anywhere in an #SBATCH line (Slurm's get_argument, _hetjob_check).
_HETJOB_WORDS = ("hetjob", "packjob")


class _Refused(Exception):
    """A value the finalize hook will not emit (newline, NUL)."""


class SbatchValue(str):
    """A value already quoted for sbatch's tokeniser (``| sbatch_value``); ``.text`` is the
    value itself, which the script body gets shell-quoted."""

    text: str


def sbatch_value(value: object) -> SbatchValue | None:
    """The ``sbatch_value`` filter: free text (a comment with spaces and quotes) as one word
    sbatch reads back exactly, for ``#SBATCH --comment={{ value | sbatch_value }}``."""
    from .sbatch_header import quote_value
    from .spec import header_text_problem

    if value is None:
        return None
    text = str(value)
    problem = header_text_problem(text)
    if problem:
        raise _Refused(f"{show(text, 60)} cannot go into an #SBATCH line: {problem}")
    out = SbatchValue(quote_value(text))
    out.text = text
    return out


def _finalize(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, Rendered) or (isinstance(value, str) and _OPEN in value):
        return str(value)   # output of a block or macro, already rendered under these rules
    if isinstance(value, SbatchValue):
        try:
            return f"{_OPEN}{quote(value.text)}{_MID}{_SBATCH_QUOTED}{value}{_CLOSE}"
        except ValueError as e:
            raise _Refused(str(e)) from None
    try:
        quoted = quote(value)
    except ValueError as e:
        raise _Refused(str(e)) from None
    raw = ("1" if value else "0") if isinstance(value, bool) else str(value)
    return f"{_OPEN}{quoted}{_MID}{raw}{_CLOSE}"


def _unmark(text: str, template_file: Path) -> str:
    """The finished script: values quoted in the body, raw in #SBATCH lines, where a value
    that is not one plain word for sbatch is refused."""
    if "\0" not in text:
        return text
    lines = text.split("\n")
    header = True
    for n, line in enumerate(lines):
        if "\0" not in line and not header:
            continue
        parts = []   # literal text and (quoted, raw) values
        rest = line
        while _OPEN in rest:
            before, _, rest = rest.partition(_OPEN)
            quoted, mid, rest = rest.partition(_MID)
            raw, close, rest = rest.partition(_CLOSE)
            if not (mid and close) or _OPEN in quoted or _OPEN in raw:
                raise UserError(f"{template_file}: rendered line {n + 1}: a value's text was "
                                "cut apart while rendering (by a filter on rendered output?)")
            parts += [before, (quoted, raw)]
        parts.append(rest)
        body = "".join(p if isinstance(p, str) else p[0] for p in parts)
        if "\0" in "".join(p for p in parts if isinstance(p, str)):
            raise UserError(f"{template_file}: rendered line {n + 1}: the template produces a NUL "
                            "character")
        if header and body.startswith(("#SBATCH", "#SLURM")):
            for i, p in enumerate(parts):
                if isinstance(p, str):
                    continue
                trusted = p[1].startswith(_SBATCH_QUOTED)
                value = p[1][len(_SBATCH_QUOTED):] if trusted else p[1]
                parts[i] = (p[0], value)
                word = next((w for w in _HETJOB_WORDS if w in value.lower()), None)
                if word:
                    raise UserError(
                        f"{template_file}: rendered line {n + 1}: the value {show(value, 60)} in "
                        f"an #SBATCH line holds {word!r}, which sbatch reads anywhere in its "
                        "header as a heterogeneous-job separator")
                bad = [c for c in value if c in _HEADER_UNSAFE] if not trusted else []
                if bad:
                    raise UserError(
                        f"{template_file}: rendered line {n + 1}: the value {show(p[1], 60)} in "
                        f"an #SBATCH line holds {bad[0]!r}; sbatch reads its header with its own "
                        "tokeniser, not the shell's, so only plain words (no spaces, quotes, "
                        "backslashes or #) may go there, or text through | sbatch_value")
            lines[n] = "".join(p if isinstance(p, str) else p[1] for p in parts)
            continue
        if header and body.lstrip(_SPACE) and not body.lstrip(_SPACE).startswith("#"):
            header = False   # the first command ends sbatch's header
        lines[n] = body
    return "\n".join(lines)


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """Compiled templates cached on disk (keyed by file and mtime): render skips Jinja's
    lexer and compiler, most of its cost after imports. Best effort: no cache if unwritable."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hpcsuite" / "jinja"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return jinja2.FileSystemBytecodeCache(str(root)) if os.access(root, os.W_OK) else None


class _Sandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """Jinja's sandbox, with the shell-aware context (``super()`` stays unquoted)."""

    context_class = _ShellContext


def environment(path: SearchPath) -> jinja2.Environment:
    by_layer = {layer: jinja2.FileSystemLoader(str(d)) for layer, d in path.dirs if _is(d, "is_dir")}
    env = _Sandbox(
        bytecode_cache=_bytecode_cache(),
        # Plain names resolve through the search path; "LAYER/name" reaches one layer, so a
        # template can extend the very template it overrides.
        loader=jinja2.ChoiceLoader([
            jinja2.FileSystemLoader([str(d) for d in path.existing()]),
            jinja2.PrefixLoader(by_layer),
        ]),
        undefined=jinja2.StrictUndefined,
        finalize=_finalize,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["raw_env_name"] = lambda s: Raw(s) if s.isidentifier() else quote(s)
    env.filters["sbatch_value"] = sbatch_value
    return env


def render(path: SearchPath, name: str, context: dict) -> str:
    """Render template ``name`` with ``context``; every error names the template file and line."""
    template_file = path.which(name)
    env = environment(path)
    try:
        template = env.get_template(template_file.name)
        text = template.render(**context)
    except UserError:
        raise
    except _Refused as e:
        raise UserError(f"{_where(e, template_file)}: refusing to render: {e}") from None
    except jinja2.TemplateSyntaxError as e:
        raise UserError(f"{e.filename or template_file}:{e.lineno}: template syntax error: "
                        f"{_one_line(e.message)}") from None
    except jinja2.UndefinedError as e:
        raise UserError(f"{_where(e, template_file)}: undefined variable: {_one_line(e.message)}") from None
    except jinja2.sandbox.SecurityError as e:
        raise UserError(f"{_where(e, template_file)}: not allowed in a template: {_one_line(e)}") from None
    except jinja2.TemplateNotFound as e:
        raise UserError(f"{_where(e, template_file)}: template not found: {show(e.name)}") from None
    except jinja2.TemplateError as e:
        raise UserError(f"{_where(e, template_file)}: template error: {_one_line(e)}") from None
    except UnicodeDecodeError:
        raise UserError(f"{_loading(template_file)}: not UTF-8 text") from None
    except RecursionError:
        raise UserError(f"{template_file}: the template extends or includes itself; to extend the "
                        f'built-in one write {{% extends "builtin/{template_file.name}" %}}') from None
    except OSError as e:
        raise UserError(f"{_where(e, template_file)}: cannot read a template: {e.strerror}") from None
    except Exception as e:  # noqa: BLE001 - a template's own mistake (1/0, "a" + 1, ...)
        raise UserError(f"{_where(e, template_file)}: {type(e).__name__}: {_one_line(e)}") from None
    return _unmark(text, template_file)


def _one_line(message: object, limit: int = 200) -> str:
    text = " ".join(str(message).split())
    return text if len(text) <= limit else text[:limit] + "…"


def _loading(fallback: Path) -> str:
    """The template file being read when a decode error struck (Jinja's loader frame)."""
    import sys

    tb = sys.exc_info()[2]
    where = str(fallback)
    while tb is not None:
        filename = tb.tb_frame.f_locals.get("filename")
        if isinstance(filename, str) and filename.endswith(SUFFIX):
            where = filename
        tb = tb.tb_next
    return where


def eject(path: SearchPath, name: str, to_dir: Path, force: bool = False) -> Path:
    """Copy the built-in template ``name`` into ``to_dir`` as a starting point.

    Never writes through a symlink: with ``force`` the copy is written beside the target and
    renamed over it, replacing a link itself rather than the file it points to."""
    check_name(name)
    source = builtin_dir() / f"{name}{SUFFIX}"
    if not source.is_file():
        names = SearchPath.builtin_only().names()
        raise UserError(f"no built-in template {name!r}{close_match(name, names)}; "
                        f"built-in templates: {', '.join(names)}")
    target = Path(to_dir) / source.name
    if os.path.lexists(target):
        if not force:
            raise UserError(f"{target} already exists; use --force to overwrite it")
        if os.path.isdir(target) and not os.path.islink(target):
            raise UserError(f"{target} is a directory; not overwriting it")
    staged = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(source.read_text(encoding="utf-8"))
        os.replace(staged, target)
    except OSError as e:
        if os.path.lexists(staged) and not os.path.islink(staged):
            os.unlink(staged)
        raise UserError(f"{e.filename or target}: cannot write the template: {e.strerror}") from None
    return target


def _where(exc: BaseException, fallback: Path) -> str:
    """file:line of the template frame that raised, from the traceback Jinja rewrote."""
    tb = exc.__traceback__
    where = str(fallback)
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if filename.endswith(SUFFIX):
            where = f"{filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where
