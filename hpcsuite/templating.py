"""Template search path and strict, shell-aware Jinja rendering.

Templates resolve through one ordered list of directories, highest precedence first:
``--template-dir``, the project (``./.hpcsuite/templates``), the user
(``~/.config/hpcsuite/templates``), the site (``$HPCSUITE_SITE_DIR/templates``, else
``/etc/hpcsuite/templates``), and the built-in ``templates/`` shipped with hpcsuite.

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

from .errors import UserError, close_match
from .shell import Raw, quote

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

    def which(self, name: str) -> Path:
        for d in self.existing():
            path = d / f"{name}{SUFFIX}"
            if path.is_file():
                return path
        names = self.names()
        raise UserError(f"template {name!r} not found{close_match(name, names)}; available: "
                        f"{', '.join(names) or 'none'} (search path: "
                        f"{', '.join(str(d) for _, d in self.dirs)})")


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
    env = jinja2.Environment(
        bytecode_cache=_bytecode_cache(),
        loader=jinja2.FileSystemLoader([str(d) for d in path.existing()]),
        undefined=jinja2.StrictUndefined,
        finalize=_finalize,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
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
