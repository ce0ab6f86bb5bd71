"""User code named in a job spec: ``FILE.py:function`` or ``package.module:function``.

Two halves. :func:`check` runs on the login node (``lint``, ``render``, ``submit``): it finds
the file and reads it with :mod:`ast`, never importing it, so a model file that imports torch
costs nothing and a broken one cannot run. :func:`load` runs on the compute nodes and imports
it for real. Both look in the same places: the submit directory, then each ``train.pythonpath``
entry (relative to the submit directory), then, for modules only, the environment's own paths.
"""

from __future__ import annotations

import ast
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class UserRef:
    """A FILE.py:function or package.module:function reference from a spec."""
    text: str            # as written in the spec
    file: str | None     # "models/net.py" for FILE.py:function
    module: str | None   # "mypkg.nets" for package.module:function
    name: str            # the function (or class) to call

    @property
    def where(self) -> str:
        return self.file or self.module or ""


def parse(text: str) -> UserRef | None:
    """The reference in ``text``, or None for a plain name (a built-in model, a loss name)."""
    if ":" not in text:
        return None
    target, _, name = text.rpartition(":")
    if target.endswith(".py"):
        return UserRef(text, target, None, name)
    return UserRef(text, None, target, name)


def search_dirs(pythonpath: list[str] | tuple[str, ...], base: Path | None = None) -> list[Path]:
    base = Path(base or Path.cwd())
    return [base, *[(base / p) for p in pythonpath]]


def locate(ref: UserRef, dirs: list[Path]) -> Path:
    """The file holding ``ref``; LookupError saying where it looked."""
    if ref.file is not None:
        candidates = [Path(ref.file)] if Path(ref.file).is_absolute() else [d / ref.file for d in dirs]
    else:
        parts = ref.module.split(".")
        roots = [*dirs, *(Path(p) for p in sys.path if p)]
        candidates = [r.joinpath(*parts[:-1], parts[-1] + ".py") for r in roots]
        candidates += [r.joinpath(*parts, "__init__.py") for r in roots]
    for path in candidates:
        try:
            if path.is_file():
                return path
        except OSError:
            continue
    looked = ", ".join(str(d) for d in dirs[:4]) + (" and the Python path" if ref.module else "")
    what = f"no file {ref.file}" if ref.file else f"no module {ref.module}"
    raise LookupError(f"{what} (looked in {looked})")


def defined_names(tree: ast.Module) -> set[str]:
    """Names a module defines at its top level: functions, classes, assignments, imports."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def check(ref: UserRef, dirs: list[Path]) -> str | None:
    """What is wrong with ``ref`` as far as can be told without running it, or None."""
    try:
        path = locate(ref, dirs)
    except LookupError as e:
        return f"{ref.text}: {e}"
    try:
        source = path.read_bytes()
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as e:
        where = f"{path}:{e.lineno}" if e.lineno else str(path)
        return f"{ref.text}: {where}: syntax error: {e.msg}"
    except (OSError, ValueError) as e:   # unreadable, NUL bytes
        return f"{ref.text}: {path}: cannot read it ({getattr(e, 'strerror', None) or e})"
    if ref.name not in defined_names(tree):
        return f"{ref.text}: {path} defines no {ref.name}"
    return None


def compile_problem(path: Path, shown: str) -> str | None:
    """Why ``path`` does not compile, as ``SHOWN:LINE: SyntaxError: message``, or None. The
    builtin compile() on its source: nothing in it runs, nothing it imports is loaded, and
    what only the compiler finds (a ``return`` outside a function) is found too."""
    import warnings

    try:
        source = path.read_bytes()
        with warnings.catch_warnings():        # an invalid escape is the job's to warn about
            warnings.simplefilter("ignore")
            compile(source, str(path), "exec", dont_inherit=True)
    except SyntaxError as e:                   # IndentationError and TabError too
        where = f"{shown}:{e.lineno}" if e.lineno else shown
        return f"{where}: {type(e).__name__}: {e.msg}"
    except (OSError, ValueError) as e:         # unreadable, NUL bytes
        return f"{shown}: cannot read it ({getattr(e, 'strerror', None) or e})"
    return None


def load(ref: UserRef, dirs: list[Path]):
    """Import the file or module and return the named object (compute nodes only)."""
    import importlib
    import importlib.util

    for d in reversed(dirs):               # the user's own imports resolve like ours
        if str(d) not in sys.path:
            sys.path.insert(0, str(d))
    if ref.module is not None:
        module = importlib.import_module(ref.module)
    else:
        path = locate(ref, dirs)
        name = f"hpcsuite_user_{abs(hash(str(path.resolve())))}"
        if name in sys.modules:
            module = sys.modules[name]
        else:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
    try:
        return getattr(module, ref.name)
    except AttributeError:
        raise LookupError(f"{ref.text}: {getattr(module, '__file__', ref.where)} defines no "
                          f"{ref.name}") from None


@contextmanager
def blame(key: str, ref: str | None):
    """User code run inside this block that raises is named by its spec key: the exception
    gets ``hpcsuite_key`` ("train.model (net.py:build)") for the failure's first line and a
    note under its traceback. hpcsuite's own UserErrors already name their key."""
    from .errors import UserError

    try:
        yield
    except UserError:
        raise
    except BaseException as e:  # noqa: BLE001 - user code can raise anything; re-raised
        if getattr(e, "hpcsuite_key", None) is None and ref is not None:
            where = f"{key} ({ref})" if ":" in ref else key
            try:
                e.hpcsuite_key = where
                e.add_note(f"(raised in {where})")
            except (AttributeError, TypeError):
                pass
        raise
