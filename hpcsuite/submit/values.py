"""The shapes values must have where they reach Slurm: allow-lists (regular expressions and
word lists) for everything the job spec writes into an #SBATCH line or a launcher option.
Pure data, no imports: the spec (:mod:`.spec`) and the header check read them."""

# Allow-lists for values that reach an #SBATCH line. sbatch reads its header with its own
# tokeniser (quotes, backslashes, '#' and white space are all special to it), so these values
# are never quoted there: they must not need quoting. See hpcsuite/submit/sbatch_header.py.
NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
NAME_HELP = "letters, digits, _ . - (starting with a letter or digit, at most 64)"
WALLTIME = (r"\d{1,7}(:\d{1,2})?"                               # minutes[:seconds]
            r"|\d{1,4}:\d{1,2}:\d{1,2}"                         # hours:minutes:seconds
            r"|\d{1,4}-\d{1,2}(:\d{1,2}(:\d{1,2})?)?")           # days-hours[:minutes[:seconds]]
WALLTIME_HELP = ("Slurm's formats: MINUTES, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS "
                 "(in quotes: YAML reads 10:00 unquoted as a number)")
# Paths in the header: no '%' either, which Slurm expands in --output (%j, %u, ...).
PATH = r"[A-Za-z0-9_.+@/][A-Za-z0-9_.+@/-]{0,1023}"
PATH_HELP = "letters, digits and / . _ - + @ only, not starting with - (no % or spaces)"
# A Slurm feature expression: names joined by & | , with counts [*N] and brackets.
CONSTRAINT = r"[A-Za-z0-9_.,:|&*\[\]()-]{1,256}"
CONSTRAINT_HELP = "a Slurm feature expression: names with & | , [ ] ( ) * :"
MAIL_TYPES = ("NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND", "STAGE_OUT",
              "TIME_LIMIT", "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS")
EMAIL = r"[A-Za-z0-9._+-]{1,64}@[A-Za-z0-9-]{1,63}(\.[A-Za-z0-9-]{1,63}){0,8}"
# sbatch --begin, the forms of Slurm's parse_time() hpcsuite accepts (dates checked below).
BEGIN = (r"\d{1,2}:\d{2}(:\d{2})?"                                      # HH:MM[:SS]
         r"|now(\+\d{1,9}(seconds|minutes|hours|days|weeks)?)?"           # now[+N[units]]
         r"|\d{4}-\d{2}-\d{2}(T\d{1,2}:\d{2}(:\d{2})?)?"                 # YYYY-MM-DD[THH:MM[:SS]]
         r"|midnight|noon|elevenses|fika|teatime|today|tomorrow")
BEGIN_HELP = ("Slurm's forms: HH:MM[:SS], now[+N[seconds|minutes|hours|days|weeks]], "
              "YYYY-MM-DD[THH:MM[:SS]], midnight, noon, elevenses, fika, teatime, today, tomorrow")
# CPU binding (Horovod's runner: --bind-to none --map-by slot, each rank manages its threads).
_PLACES = "hwthread|core|l1cache|l2cache|l3cache|socket|package|numa|board"
BIND_TO = rf"(none|{_PLACES})(:(overload-allowed|if-supported)(,(overload-allowed|if-supported))?)?"
MAP_BY = (rf"(slot|node|seq|{_PLACES}|ppr:[1-9]\d{{0,3}}:(node|{_PLACES}))"
          r"(:(PE=[1-9]\d{0,3}|span|oversubscribe|nooversubscribe|nolocal|noinherit|inherit)"
          r"(,(PE=[1-9]\d{0,3}|span|oversubscribe|nooversubscribe|nolocal|noinherit|inherit)){0,5})?")
CPU_BIND = (r"((quiet|verbose),)?(none|rank|sockets|cores|threads|ldoms|boards|rank_ldom"
            r"|(map_cpu|mask_cpu|map_ldom|mask_ldom):[0-9A-Fa-fx,*]{1,1024})")
# srun --gpu-bind (Slurm 22.05): [verbose,]closest, none, single:N, per_task:N, map_gpu:/mask_gpu:.
GPU_BIND = (r"(verbose,)?(closest|none|(single|per_task):[1-9]\d{0,3}"
            r"|(map_gpu|mask_gpu):[0-9A-Fa-fx,*]{1,1024})")
ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]{0,63}"
TEMPLATE_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}"
# User code: FILE.py:function (relative to the submit directory or a train.pythonpath entry)
# or package.module:function (importable from there or the environment).
PY_FILE = r"[A-Za-z0-9_.+@/-]{0,1000}[A-Za-z0-9_+@-]\.py"
PY_MODULE = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
USER_REF = rf"(?:{PY_FILE}|{PY_MODULE}):[A-Za-z_][A-Za-z0-9_]*"
USER_REF_HELP = "FILE.py:function or package.module:function"
# A dependency (spec `after`, `submit --after`): a job id or the name of a job submitted from
# here (its latest run), and when the job may start: ok (it completed), any (it ended), notok
# (it failed).
AFTER = rf"(?:[0-9]{{1,12}}|{NAME})(?::(?:ok|any|notok))?"
AFTER_HELP = ("JOB, JOB:ok, JOB:any or JOB:notok (JOB: a job id or the name of a job "
              "submitted from here)")
# Container images (container.image, site container.allowed_images): a path (/images/x.sif, a
# Charliecloud image directory), a registry reference (nvcr.io/nvidia/pytorch:24.01-py3), a URI
# (docker://..., oras://...) or pyxis's registry#image form. No spaces, quotes, commas or '$':
# pyxis reads --container-image as one option value, apptainer an argument.
IMAGE = r"[A-Za-z0-9/][A-Za-z0-9_.+@/:#-]{0,511}"
IMAGE_HELP = ("a path or registry reference: letters, digits and / . _ - + @ : # only, "
              "e.g. /images/pytorch.sif or docker://nvcr.io/nvidia/pytorch:24.01-py3")
# allowed_images entries: an image, a prefix ending in / or #, or a glob (* and ? stop at /).
IMAGE_PATTERN = r"[A-Za-z0-9/*?][A-Za-z0-9_.+@/:#*?-]{0,511}"
IMAGE_PATTERN_HELP = ("an image, a prefix ending in / or # (a registry or directory), or a glob "
                      "where * and ? do not cross /, e.g. docker://nvcr.io/nvidia/ or /images/*.sif")
# Binds: HOST or HOST:GUEST, absolute plain paths (',' separates binds for apptainer and pyxis,
# ':' host from guest, so neither may be in a path).
BIND_PATH = r"/[A-Za-z0-9_.+@/-]{0,1023}"
BIND = rf"{BIND_PATH}(:{BIND_PATH})?"
BIND_HELP = ("HOST or HOST:GUEST, absolute paths of letters, digits and / . _ - + @ "
             "(no , : or spaces inside a path)")


def walltime_seconds(text: str) -> int:
    """Slurm's time formats (--time, a partition's MaxTime, squeue's %L): minutes, MM:SS,
    HH:MM:SS, D-HH[:MM[:SS]]."""
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        days = int(d)
        parts = [int(p) for p in text.split(":")]
        parts += [0] * (3 - len(parts))
        h, m, s = parts
    else:
        parts = [int(p) for p in text.split(":")]
        if len(parts) == 1:
            h, m, s = 0, parts[0], 0
        elif len(parts) == 2:
            h, m, s = 0, parts[0], parts[1]
        else:
            h, m, s = parts
    return ((days * 24 + h) * 60 + m) * 60 + s
