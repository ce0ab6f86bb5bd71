"""The hpcsuite command line. Commands parse, make one call into the core, and print.

Nothing here imports torch, tensorflow or horovod: login-node commands stay fast.
"""

from __future__ import annotations

import json
import os

import click

from .. import __version__
from ..errors import JobFailed, UserError


INTERNAL_ERROR = 70   # EX_SOFTWARE: a bug in hpcsuite, not in the user's input


class Group(click.Group):
    """Turns UserError into `error: ...` and exit code 2, never a traceback.

    A file the system will not let us read or write is the user's environment (exit 2, the
    file named); anything else is a bug in hpcsuite, reported in one line (exit 70) with the
    traceback only under HPCSUITE_DEBUG=1."""

    def invoke(self, ctx: click.Context):
        try:
            return self.run(ctx)
        except (UserError, JobFailed) as e:
            click.echo(f"error: {e}", err=True)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)
        except BrokenPipeError:
            # The reader went away (`hpcsuite runs | head`): stop quietly, as cat does, and
            # point stdout at /dev/null so the interpreter's last flush cannot complain.
            import os
            import sys

            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            ctx.exit(141)   # 128 + SIGPIPE, what a tool killed by the closed pipe returns
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except OSError as e:
            where = f"{e.filename}: " if e.filename else ""
            click.echo(f"error: {where}{e.strerror or e}", err=True)
            ctx.exit(UserError.exit_code)
        except Exception as e:  # noqa: BLE001 - the last line of defence against a traceback
            import os

            if os.environ.get("HPCSUITE_DEBUG"):
                raise
            text = " ".join(str(e).split())[:200]
            click.echo(f"error: internal error in hpcsuite ({type(e).__name__}: {text}); please "
                       "report it, with HPCSUITE_DEBUG=1 for the traceback", err=True)
            ctx.exit(INTERNAL_ERROR)

    def run(self, ctx: click.Context):
        return super().invoke(ctx)


# Every command's module, imported only when the command is named: `render` and `submit` on a
# login node pay for the command they run, not for the others (`--help` and completion import
# them all to list them).
LAZY_COMMANDS = {"render": "submit_cmd", "submit": "submit_cmd",
                 "status": "runs_cmd", "runs": "runs_cmd", "logs": "runs_cmd",
                 "report": "runs_cmd", "cancel": "runs_cmd",
                 "doctor": "doctor_cmd",
                 "train": "job_cmd", "preflight": "job_cmd", "attempt": "job_cmd",
                 "bench": "bench_cmd", "cluster": "cluster_cmd", "config": "config_cmd",
                 "lint": "templates_cmd", "study": "study_cmd", "sweep": "sweep_cmd",
                 "templates": "templates_cmd",
                 "tracking": "tracking_cmd", "fetch": "remote_cmd"}


class MainGroup(Group):
    """The top-level group: imports a command's module the first time the command is named
    (click's lazily loaded subcommands); `--help` and completion list every command."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(LAZY_COMMANDS))

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["hpcsuite.argv"] = list(args)
        return super().parse_args(ctx, args)

    def run(self, ctx: click.Context):
        """A command given --remote NAME (or HPCSUITE_REMOTE) runs on that remote
        (hpcsuite.remote.forward); any other here."""
        argv = ctx.meta.get("hpcsuite.argv") or []
        if "--remote" in argv or any(a.startswith("--remote=") for a in argv) \
                or os.environ.get("HPCSUITE_REMOTE"):
            from ..remote import forward

            def exists(words) -> bool:
                command = self
                for word in words:
                    command = command.get_command(ctx, word) if isinstance(command, click.Group) \
                        else None
                    if command is None:
                        return False
                return True

            wanted = forward.wanted(argv, exists)
            if wanted is not None:
                ctx.exit(forward.run(ctx, *wanted))
        return super().run(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str):
        if cmd_name not in self.commands and cmd_name in LAZY_COMMANDS:
            import importlib

            importlib.import_module(f"{__name__}.{LAZY_COMMANDS[cmd_name]}")
        return super().get_command(ctx, cmd_name)


@click.group(cls=MainGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hpcsuite")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def main(verbose: int) -> None:
    """Render Slurm sbatch scripts from job specs and run Horovod data-parallel training.

    \b
    Typical use:
      hpcsuite cluster up                      # a local 2-node Slurm cluster (demos, tests)
      hpcsuite render sbatch/quickstart.yaml   # see the exact script
      hpcsuite submit sbatch/quickstart.yaml --wait
      hpcsuite status JOBID / logs JOBID / cancel JOBID
    """
    if verbose:   # logging costs a login-node command ~10 ms to import; only when asked for
        import logging

        level = logging.WARNING - 10 * verbose
        logging.basicConfig(level=max(level, logging.DEBUG),
                            format="%(levelname)s %(name)s: %(message)s")


class FilePath(click.Path):
    """click.Path that also refuses what no file name can hold (NUL, more than PATH_MAX)."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and ("\0" in value or len(value) > 4096):
            self.fail("not a usable file name (NUL character or longer than 4096)", param, ctx)
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            # The one-line contract (`error: PATH: why`, exit 2), not click's 3-line usage error.
            raise UserError(f"{value}: {self.problem(str(value))}") from None

    def problem(self, path: str) -> str:
        """Why click refused ``path``, in the words of hpcsuite's other file errors."""
        import os

        if not os.path.lexists(path):
            return "no such file or directory"
        if os.path.isdir(path) and not self.dir_okay:
            return "is a directory, not a file"
        if not os.path.isdir(path) and not self.file_okay:
            return "is a file, not a directory"
        return f"cannot {'write' if self.writable else 'read'} it (permission denied)"


def note_no_site(site_profile: bool, spec: str) -> None:
    """Say once when no site profile is in force: the site's rules are then not checked."""
    if not site_profile:
        click.echo(f"note: {spec}: no site profile in force (--profile, HPCSUITE_PROFILE, "
                   "$HPCSUITE_SITE_DIR/profile.yaml, /etc/hpcsuite/profile.yaml); only "
                   "hpcsuite's own checks apply", err=True)


def echo_warnings(spec: str, warnings) -> None:
    for warning in warnings:
        click.echo(f"warning: {spec}: {warning.key}: {warning.message}", err=True)


def prepare_request(spec: str, profile_path: str | None, template_dir: str | None, sets=(),
                    against_slurm: bool = False, after: tuple[str, ...] = ()):
    """:func:`hpcsuite.runner.prepare`, its warnings and notes printed: the request that
    `render`, `submit` and `bench` print or submit."""
    from ..runner import prepare

    try:
        prepared = prepare(spec, profile_path, template_dir, sets, against_slurm, after=after)
    except UserError as e:
        echo_warnings(spec, getattr(e, "warnings", ()))
        raise
    echo_warnings(spec, prepared.warnings)
    for note in prepared.notes:
        click.echo(f"note: {spec}: {note}", err=True)
    note_no_site(prepared.site_profile, spec)   # once, beside a success: an error stays one line
    return prepared.request


def emit_json(data: object) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True))


profile_option = click.option(
    "--profile", "profile_path", envvar="HPCSUITE_PROFILE", type=FilePath(dir_okay=False),
    help="Site profile YAML, used instead of $HPCSUITE_SITE_DIR/profile.yaml or "
         "/etc/hpcsuite/profile.yaml (env: HPCSUITE_PROFILE).")
template_dir_option = click.option(
    "--template-dir", type=FilePath(file_okay=False),
    help="Directory searched first for templates.")
after_option = click.option(
    "--after", multiple=True, metavar="JOB[:ok|any|notok]",
    help="Start only after JOB (a job id, or the name of a job submitted from here: its "
         "latest run) completed (ok, the default), ended (any) or failed (notok); added to the "
         "spec's `after`. Repeat for several (sbatch --dependency).")
remote_option = click.option(
    "--remote", "remote", metavar="NAME", expose_value=False,
    help="Run this on the remote NAME of ~/.config/hpcsuite/remotes.yaml, over SSH (env: "
         "HPCSUITE_REMOTE); the files a spec names are sent first (docs/howto/laptop.md).")
set_option = click.option(
    "--set", "sets", multiple=True, metavar="KEY=VALUE",
    help="Override one job key, e.g. --set resources.nodes=2 --set env.NCCL_DEBUG=INFO "
         "(the last and strongest layer).")



@main.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell):
    """Print the shell completion script for SHELL.

    \b
    bash: eval "$(hpcsuite completion bash)"   (add it to ~/.bashrc)
    zsh:  eval "$(hpcsuite completion zsh)"    (add it to ~/.zshrc)
    fish: hpcsuite completion fish > ~/.config/fish/completions/hpcsuite.fish
    """
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    click.echo(cls(main, {}, "hpcsuite", "_HPCSUITE_COMPLETE").source())
