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
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import jinja2
import jinja2.runtime

from .errors import UserError, close_match
from .shell import Raw, Rendered, quote

SUFFIX = ".sbatch.j2"


def builtin_dir() -> Path:
    return Path(str(resources.files("hpcsuite.templates")))


@dataclass(frozen=True)
class SearchPath:
    dirs: tuple[tuple[str, Path], ...]   # (layer, directory), highest precedence first

    @classmethod
    def default(cls, template_dir: str | None = None, cwd: Path | None = None) -> "SearchPath":
        cwd = cwd or Path.cwd()
        config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
        site = os.environ.get("HPCSUITE_SITE_DIR") or "/etc/hpcsuite"
        dirs = []
        if template_dir:
            dirs.append(("cli", Path(template_dir).absolute()))
        dirs += [("project", cwd / ".hpcsuite" / "templates"),
                 ("user", config / "hpcsuite" / "templates"),
                 ("site", Path(site) / "templates"),
                 ("builtin", builtin_dir())]
        return cls(tuple(dirs))

    @classmethod
    def builtin_only(cls) -> "SearchPath":
        return cls((("builtin", builtin_dir()),))

    def existing(self) -> list[Path]:
        return [d for _, d in self.dirs if d.is_dir()]

    def names(self) -> list[str]:
        found = set()
        for d in self.existing():
            found.update(p.name[: -len(SUFFIX)] for p in d.glob(f"*{SUFFIX}"))
        return sorted(found)

    def candidates(self, name: str) -> list[tuple[str, Path]]:
        """Every (layer, file) that provides ``name``, winner first."""
        return [(layer, d / f"{name}{SUFFIX}") for layer, d in self.dirs
                if (d / f"{name}{SUFFIX}").is_file()]

    def describe(self) -> str:
        return "\n".join(f"{i}. {layer:8} {d}{'' if d.is_dir() else '  (absent)'}"
                         for i, (layer, d) in enumerate(self.dirs, 1))

    def which(self, name: str) -> Path:
        for d in self.existing():
            path = d / f"{name}{SUFFIX}"
            if path.is_file():
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


def _finalize(value: object) -> str:
    if value is None:
        return ""
    try:
        return quote(value)
    except ValueError as e:
        raise UserError(f"refusing to render: {e}") from None


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """Compiled templates cached on disk (keyed by file and mtime): render skips Jinja's
    lexer and compiler, most of its cost after imports. Best effort: no cache if unwritable."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hpcsuite" / "jinja"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return jinja2.FileSystemBytecodeCache(str(root)) if os.access(root, os.W_OK) else None


def environment(path: SearchPath) -> jinja2.Environment:
    by_layer = {layer: jinja2.FileSystemLoader(str(d)) for layer, d in path.dirs if d.is_dir()}
    env = jinja2.Environment(
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
    env.context_class = _ShellContext
    env.filters["raw_env_name"] = lambda s: Raw(s) if s.isidentifier() else quote(s)
    return env


def render(path: SearchPath, name: str, context: dict) -> str:
    """Render template ``name`` with ``context``; errors name the template file and line."""
    template_file = path.which(name)
    env = environment(path)
    try:
        template = env.get_template(template_file.name)
        return template.render(**context)
    except jinja2.TemplateSyntaxError as e:
        raise UserError(f"{e.filename or template_file}:{e.lineno}: template syntax error: {e.message}") from None
    except jinja2.UndefinedError as e:
        raise UserError(f"{_where(e, template_file)}: undefined variable: {e.message}") from None
    except jinja2.TemplateError as e:
        raise UserError(f"{_where(e, template_file)}: template error: {e}") from None
    except RecursionError:
        raise UserError(f"{template_file}: the template extends itself; to extend the built-in "
                        f'one write {{% extends "builtin/{template_file.name}" %}}') from None


def eject(path: SearchPath, name: str, to_dir: Path, force: bool = False) -> Path:
    """Copy the built-in template ``name`` into ``to_dir`` as a starting point."""
    source = builtin_dir() / f"{name}{SUFFIX}"
    if not source.is_file():
        names = SearchPath.builtin_only().names()
        raise UserError(f"no built-in template {name!r}{close_match(name, names)}; "
                        f"built-in templates: {', '.join(names)}")
    target = Path(to_dir) / source.name
    if target.exists() and not force:
        raise UserError(f"{target} already exists; use --force to overwrite it")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(source.read_text())
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
