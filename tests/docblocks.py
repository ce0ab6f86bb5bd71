"""The example blocks of the user docs (docs/user/*.md, docs/howto/*.md), and what checks each one.

A ```yaml block is a whole file, linted against the local cluster's site profile, unless the
HTML comment on the line before it says otherwise:

    <!-- docs-check: fragment -->       a part of a job spec: its keys and values go through
                                        the schema (nothing is linted, it is not a whole job)
    <!-- docs-check: alternatives -->   each line alone is such a fragment
    <!-- docs-check: remotes -->        a remotes.yaml (hpcsuite.remote.config): every
                                        remote in it loads

A block whose first line is ``# PATH`` shows the file PATH (relative to the repository) with
comments of its own: the two must hold the same data, and the file is what gets checked.

A ```bash or ```shell block is checked line by line (:func:`commands`): every ``hpcsuite``
command exists with the options it is given (per the Click group `--help` prints), every
``make`` target exists, every ``cd`` goes to a directory of the repository; a block may also be
run by an end-to-end test on the local cluster (tests/test_e2e_docs.py).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
USER_DOCS = REPO / "docs" / "user"
HOWTO_DOCS = REPO / "docs" / "howto"     # the task pages: checked the same way
MARKER = re.compile(r"<!--\s*docs-check:\s*([a-z-]+)\s*-->")
KINDS = ("file", "fragment", "alternatives", "remotes")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int          # of the opening fence, 1-based
    lang: str
    text: str
    kind: str = "file"

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def shows(self) -> Path | None:
        """The repository file a ``# PATH`` first line names, if it exists."""
        first = self.text.splitlines()[0] if self.text else ""
        m = re.fullmatch(r"#\s*(\S+\.ya?ml)\s*", first)
        return REPO / m.group(1) if m and (REPO / m.group(1)).is_file() else None


def blocks(pages: list[Path] | None = None) -> list[Block]:
    """Every fenced block with a language of ``pages`` (default: docs/user/*.md and
    docs/howto/*.md)."""
    out = []
    for page in pages or sorted(USER_DOCS.glob("*.md")) + sorted(HOWTO_DOCS.glob("*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            m = re.fullmatch(r"```(\w*)\s*", lines[i])
            if not m:
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            marker = MARKER.search(lines[i - 1]) if i else None
            kind = marker.group(1) if marker else "file"
            if kind not in KINDS:
                raise ValueError(f"{page}:{i}: unknown docs-check kind {kind!r}; kinds: {KINDS}")
            if m.group(1):
                out.append(Block(page, i + 1, m.group(1), "\n".join(lines[i + 1:end]) + "\n", kind))
            i = end + 1
    return out


# ---------------------------------------------------------------------- shell lines

# Programs other than hpcsuite, make and cd that a block may name (Slurm's, the shell's, tools
# the docs point to): their lines are not checked further.
OTHER_PROGRAMS = {".", "source", "scancel", "sbatch", "squeue", "scontrol", "sacct",
                  "sha256sum", "tensorboard", "mlflow", "python", "export"}


def commands(text: str) -> list[list[str]]:
    """A shell block's simple commands as argv lists: comments dropped, continued lines
    joined, ``;`` and ``&&`` split, ``eval "$(...)"`` opened to the command inside."""
    joined = re.sub(r"\\\n\s*", " ", text)
    out = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        current: list[str] = []
        for w in words + [";"]:
            if w in (";", "&&", "||"):
                if current:
                    out.append(current)
                current = []
            elif w.endswith(";"):
                current.append(w[:-1])
                out.append(current)
                current = []
            else:
                current.append(w)
    opened = []
    for argv in out:
        if argv[0] == "eval" and len(argv) == 2 and argv[1].startswith("$("):
            opened.append(shlex.split(argv[1][2:-1]))
        else:
            opened.append(argv)
    return opened


def options_of(word: str) -> list[str]:
    """The option names a documented word stands for: ``[--dry-run]`` -> --dry-run,
    ``--rank`` -> --rank, ``--set=K=V`` -> --set; none for an argument."""
    word = word.strip("[]")
    if not word.startswith("-") or word == "-":
        return []
    return [word.split("=", 1)[0]]


def hpcsuite_problems(argv: list[str], group) -> list[str]:
    """What is wrong with one documented ``hpcsuite ...`` line: a command that does not exist
    (each of ``list|which|show`` alternatives), an option its command does not take."""
    import click

    problems = []
    command, words = group, argv[1:]
    path = ["hpcsuite"]
    while isinstance(command, click.Group) and words and not words[0].startswith("-"):
        names = words[0].split("|")
        # get_command: the CLI imports a command's module when it is named (cli.LAZY_COMMANDS)
        found = [command.get_command(click.Context(command), n) for n in names]
        if None in found:
            missing = [n for n, c in zip(names, found) if c is None]
            return [f"{' '.join(path)} has no command {', '.join(missing)}"]
        path.append(words[0])
        words = words[1:]
        if len(found) > 1:         # alternatives: each must take the options that follow
            for n, c in zip(names, found):
                problems += hpcsuite_problems(["hpcsuite", *path[1:-1], n, *words], group)
            return problems
        command = found[0]
    if isinstance(command, click.Group) and words and not words[0].startswith("-"):
        return [f"{' '.join(path)} has no command {words[0]}"]
    known = {"--help"}
    for p in command.params:
        known.update(p.opts)
        known.update(p.secondary_opts)
    for word in words:
        for opt in options_of(word):
            if opt not in known:
                problems.append(f"`{' '.join(path)}` has no option {opt}")
    return problems


def make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z0-9_.-]+):", text, re.MULTILINE)}


def shell_problems(block: Block, group) -> list[str]:
    """Every problem of a shell block's lines (empty: each names what exists)."""
    problems = []
    cwd = REPO
    for argv in commands(block.text):
        program = argv[0]
        if program == "hpcsuite":
            problems += hpcsuite_problems(argv, group)
        elif program == "make":
            problems += [f"make has no target {t}" for t in argv[1:]
                         if not t.startswith("-") and t not in make_targets()]
        elif program == "cd":
            cwd = cwd / argv[1]
            if not cwd.is_dir():
                problems.append(f"cd {argv[1]}: no such directory in the repository")
        elif program not in OTHER_PROGRAMS:
            problems.append(f"{program}: not a program the docs checker knows; add it to "
                            "docblocks.OTHER_PROGRAMS if it is one a user has")
    return [f"{block.where}: {p}" for p in problems]
