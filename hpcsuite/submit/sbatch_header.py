"""Read an sbatch script's ``#SBATCH`` header the way sbatch itself reads it.

Shell quoting makes a value inert for bash, not for sbatch: sbatch tokenises ``#SBATCH`` lines
with its own rules (``get_argument`` in Slurm's ``src/sbatch/opt.c``), where a backslash escapes
the next character even inside single quotes, an unquoted ``#`` ends the line, and one line may
carry several options. This module follows those rules, then sbatch's ``getopt_long`` (long
options, unique prefixes, clustered short options), so hpcsuite can check the options Slurm
will obey, whatever template or value produced the script.

Rules followed (Slurm 22.05, with the change of later releases noted):
- only lines starting with ``#SBATCH`` (or the deprecated ``#SLURM``) in column 1 count;
  reading stops at the first line that is not blank and not a comment;
- whitespace separates words unless quoted with ``'`` or ``"``; quotes do not nest and are
  removed; an unmatched quote is fatal; ``\\`` makes the next character literal, inside
  quotes too (22.05 drops a backslash before a space and ends the word; later releases keep
  the space); an unquoted, unescaped ``#`` starts a comment;
- ``hetjob``/``packjob`` as the first word separates heterogeneous components (refused here:
  hpcsuite submits one component); later on a line sbatch blanks the word out, and the blank
  ends the line (no word is read after it).
"""

from __future__ import annotations

from typing import Callable

from ..records import Record, record
from ..errors import UserError

MAGIC = ("#SBATCH", "#SLURM")

# sbatch's options in Slurm 22.05 (src/common/slurm_opt.c): name -> (argument, short letter).
# Argument: "1" required, "0" none, "?" optional. Aliases share a canonical name below.
_TABLE = (
    "account:1:A acctg-freq:1 array:1:a batch:1 begin:1:b bb:1 bbf:1 cluster-constraint:1 "
    "chdir:1:D cluster:1 clusters:1:M comment:1 container:1 context:1 contiguous:0 "
    "constraint:1:C core-spec:1:S cores-per-socket:1 cpu-freq:1 cpus-per-gpu:1 "
    "cpus-per-task:1:c deadline:1 delay-boot:1 dependency:1:d distribution:1:m error:1:e "
    "exclude:1:x exclusive:? export:1 export-file:1 extra-node-info:1:B get-user-env:? gid:1 "
    "gpu-bind:1 gpu-freq:1 gpus:1:G gpus-per-node:1 gpus-per-socket:1 gpus-per-task:1 gres:1 "
    "gres-flags:1 help:0:h hint:1 hold:0:H ignore-pbs:0 input:1:i job-name:1:J "
    "kill-on-invalid-dep:1 licenses:1:L mail-type:1 mail-user:1 mcs-label:1 mem:1 mem-bind:1 "
    "mem-per-cpu:1 mem-per-gpu:1 mincpus:1 network:1 nice:? no-kill:?:k no-requeue:0 "
    "nodefile:1:F nodelist:1:w nodes:1:N ntasks:1:n ntasks-per-core:1 ntasks-per-gpu:1 "
    "ntasks-per-node:1 ntasks-per-socket:1 ntasks-per-tres:1 open-mode:1 output:1:o "
    "overcommit:0:O oversubscribe:0:s parsable:0 partition:1:p power:1 prefer:1 priority:1 "
    "profile:1 propagate:? qos:1:q quiet:0:Q reboot:0 requeue:0 reservation:1 signal:1 "
    "sockets-per-node:1 spread-job:0 switches:1 tasks-per-node:1 test-only:0 thread-spec:1 "
    "threads-per-core:1 time:1:t time-min:1 tmp:1 uid:1 use-min-nodes:0 verbose:0:v "
    "version:0:V usage:0 wait:0:W wait-all-nodes:1 wckey:1 wrap:1"
)
ALIASES = {"tasks-per-node": "ntasks-per-node"}

LONG: dict[str, str] = {}     # long name -> argument kind
SHORT: dict[str, str] = {}    # letter -> long name
for _entry in _TABLE.split():
    _name, _arg, *_short = _entry.split(":")
    LONG[_name] = _arg
    if _short:
        SHORT[_short[0]] = _name


class HeaderError(UserError):
    """The header would make sbatch fail or do something hpcsuite cannot vouch for."""


@record
class Option(Record):
    """One #SBATCH option of a script, as sbatch reads it."""
    name: str            # canonical long name, e.g. "partition"
    value: str | None    # None for options without an argument
    line: int            # 1-based line of the script


_SPACE = " \t\n\v\f\r"   # C's isspace() in the C locale (not Python's str.isspace)


def _starts_word(line: str, i: int, word: str) -> bool:
    end = i + len(word)
    return line[i:end].lower() == word and line[i:end].isascii() and \
        (end == len(line) or line[end] in _SPACE)


def tokenize(line: str, lineno: int, source: str, keep_escaped_space: bool = False) -> list[str]:
    """The words sbatch reads from the text after ``#SBATCH`` on one line."""
    words: list[str] = []
    i, n = 0, len(line)
    while True:
        while i < n and line[i] in _SPACE:
            i += 1
        separator = next((w for w in ("hetjob", "packjob") if _starts_word(line, i, w)), None)
        if separator and not words:
            raise HeaderError(f"{source}:{lineno}: heterogeneous job separator in the #SBATCH "
                              "header; hpcsuite submits one job component")
        if separator:   # later on a line sbatch blanks the word out, which ends the line
            return words
        if i < n and line[i] == ":":
            raise HeaderError(f"{source}:{lineno}: sbatch refuses ':' at the start of a word")
        word: list[str] = []
        quote = ""
        while i < n and (quote or line[i] not in _SPACE):
            c = line[i]
            if c == "\\":
                i += 1
                if i < n and line[i] == " " and keep_escaped_space:
                    word.append(" ")   # later releases keep an escaped space in the word
                    i += 1
                elif i < n and (quote or line[i] not in _SPACE):
                    word.append(line[i])   # any other character is taken literally
                    i += 1
                # 22.05: before unquoted white space the backslash is dropped, the word ends
                continue
            if quote:
                if c == quote:
                    quote = ""
                    i += 1
                    continue
            elif c in "\"'":
                quote = c
                i += 1
                continue
            elif c == "#":
                break   # the rest of the line is a comment
            word.append(c)
            i += 1
        if quote:
            raise HeaderError(f"{source}:{lineno}: unmatched {quote} in the #SBATCH header "
                              "(sbatch stops with an error)")
        if not word:
            # No character copied (end of line, '#', '' or ""): sbatch stops reading the line.
            return words
        words.append("".join(word))


def header_words(script: str, source: str = "script",
                 keep_escaped_space: bool = False) -> list[tuple[str, int]]:
    """Every word of every ``#SBATCH`` line, with its line number, as sbatch collects them."""
    out: list[tuple[str, int]] = []
    for lineno, line in enumerate(script.split("\n"), 1):
        magic = next((m for m in MAGIC if line.startswith(m)), None)
        if magic is None:
            stripped = line.lstrip(_SPACE)
            if stripped and not stripped.startswith("#"):
                break   # the first command ends the header
            continue
        rest = line[len(magic):]
        out += [(w, lineno) for w in tokenize(rest, lineno, source, keep_escaped_space)]
    return out


def _long(word: str, lineno: int, source: str) -> tuple[str, str | None]:
    name, eq, value = word[2:].partition("=")
    if name in LONG:
        matches = [name]
    else:
        matches = [n for n in LONG if n.startswith(name)]
        # getopt_long accepts an abbreviation when all its matches are the same option
        if len({(ALIASES.get(m, m), LONG[m]) for m in matches}) > 1:
            raise HeaderError(f"{source}:{lineno}: #SBATCH option --{name} is ambiguous "
                              f"({', '.join('--' + m for m in matches)})")
    if not matches:
        raise HeaderError(f"{source}:{lineno}: #SBATCH option --{name} is not an sbatch option")
    return matches[0], (value if eq else None)


def parse_header(script: str, source: str = "script",
                 keep_escaped_space: bool = False) -> list[Option]:
    """The options sbatch takes from the header, in order (later ones override earlier)."""
    words = header_words(script, source, keep_escaped_space)
    options: list[Option] = []
    i = 0
    while i < len(words):
        word, lineno = words[i]
        i += 1
        if word == "--" or not word.startswith("-") or word == "-":
            raise HeaderError(f"{source}:{lineno}: {word[:40]!r} in the #SBATCH header is not an "
                              "option (sbatch refuses the script)")
        if word.startswith("--"):
            name, value = _long(word, lineno, source)
            kind = LONG[name]
            if kind == "0" and value is not None:
                raise HeaderError(f"{source}:{lineno}: --{name} takes no value")
            if kind == "1" and value is None:
                if i >= len(words):
                    raise HeaderError(f"{source}:{lineno}: --{name} needs a value")
                value, i = words[i][0], i + 1
            options.append(Option(ALIASES.get(name, name), value, lineno))
            continue
        j = 1
        while j < len(word):
            letter = word[j]
            name = SHORT.get(letter)
            if name is None:
                raise HeaderError(f"{source}:{lineno}: #SBATCH option -{letter} is not an "
                                  "sbatch option")
            kind = LONG[name]
            j += 1
            if kind == "0":
                options.append(Option(name, None, lineno))
                continue
            value = word[j:] or None
            if value is None and kind == "1":
                if i >= len(words):
                    raise HeaderError(f"{source}:{lineno}: -{letter} needs a value")
                value, i = words[i][0], i + 1
            options.append(Option(name, value, lineno))
            break
    return options


def effective(options: list[Option]) -> dict[str, Option]:
    """The last occurrence of each option: the one sbatch keeps."""
    return {o.name: o for o in options}


# In check_fixed: the option must be there without a value (``#SBATCH --exclusive``).
FLAG = "\0flag"   # NUL never comes from a value


def quote_value(text: str) -> str:
    """``text`` as one word for sbatch's tokeniser: as it is when plain, else in double quotes
    with backslash and double quote escaped (both rules, 22.05's and later, read it back as
    ``text``). The caller refuses control characters and the heterogeneous-job words."""
    if text and not any(c in _SPACE or c in "'\"\\#" for c in text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def check_fixed(script: str, fixed: dict[str, str | None], source: str,
                why: dict[str, str] | None = None,
                unasked: Callable[[str], str | None] | None = None) -> dict[str, Option]:
    """Refuse a script whose header does not carry exactly the ``fixed`` options.

    ``fixed`` maps an sbatch long option to the value the site requires (``None``: the option
    must be absent); ``unasked(name)`` says why any other option the header carries is refused
    (None: it may stay). The header is read with the tokeniser of Slurm 22.05 and with that of
    later releases; both readings must agree with the site."""
    why = why or {}
    found: dict[str, Option] = {}
    for keep in (False, True):
        found = effective(parse_header(script, source, keep_escaped_space=keep))
        for name, want in fixed.items():
            got = found.get(name)
            reason = why.get(name, "the site fixes it")
            if want is None and got is not None:
                raise HeaderError(f"{source}:{got.line}: #SBATCH --{name} is not allowed here "
                                  f"({reason})")
            if want == FLAG and (got is None or got.value is not None):
                seen = "missing" if got is None else f"--{name}={_short(got.value)} on line {got.line}"
                raise HeaderError(f"{source}: #SBATCH --{name} must be there without a value "
                                  f"({reason}); the header sbatch reads has {seen}")
            if want not in (None, FLAG) and (got is None or got.value != want):
                seen = "missing" if got is None else f"--{name}={_short(got.value)} on line {got.line}"
                raise HeaderError(f"{source}: #SBATCH --{name} must be {want!r} ({reason}); "
                                  f"the header sbatch reads has {seen}")
        for name, got in found.items():
            problem = unasked(name) if unasked and name not in fixed else None
            if problem:
                raise HeaderError(f"{source}:{got.line}: #SBATCH --{name} is not allowed here "
                                  f"({problem})")
    return found


def _short(value: str | None, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"
