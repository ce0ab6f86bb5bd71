"""`hpcsuite templates` and `hpcsuite lint`: what sysadmins use to fit templates to a site."""

from __future__ import annotations

from pathlib import Path

import click

from . import FilePath, main, profile_option, set_option, template_dir_option
from ..errors import UserError


def _complete_names(ctx, param, incomplete):
    from ..templating import SearchPath

    return [n for n in SearchPath.default(ctx.params.get("template_dir")).names()
            if n.startswith(incomplete)]


name_argument = click.argument("name", shell_complete=_complete_names)


def _path(template_dir):
    from ..templating import SearchPath

    return SearchPath.default(template_dir)


@main.group()
def templates():
    """Find, read, copy and check sbatch templates.

    Search path, first match wins: --template-dir, project (./.hpcsuite/templates),
    user (~/.config/hpcsuite/templates), site ($HPCSUITE_SITE_DIR/templates, else
    /etc/hpcsuite/templates), built-in. A template overriding another can extend it by
    layer: {% extends "builtin/horovod.sbatch.j2" %}.
    """


@templates.command("list")
@template_dir_option
def list_(template_dir):
    """Every template name, the file that wins, and the ones it shadows."""
    path = _path(template_dir)
    click.echo("search path:\n" + path.describe())
    for name in path.names():
        found = path.candidates(name)
        layer, file = found[0]
        shadowed = "".join(f"\n    shadows {l}: {f}" for l, f in found[1:])
        click.echo(f"{name:16} {layer:8} {file}{shadowed}")


@templates.command()
@name_argument
@template_dir_option
def which(name, template_dir):
    """Print the file that template NAME resolves to."""
    click.echo(_path(template_dir).which(name))


@templates.command()
@name_argument
@template_dir_option
def show(name, template_dir):
    """Print the source of template NAME as resolved."""
    click.echo(_path(template_dir).which(name).read_text(), nl=False)


@templates.command()
@name_argument
@click.option("--to", "to_dir", type=FilePath(file_okay=False),
              help="Directory to copy into (default: ./.hpcsuite/templates).")
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
def eject(name, to_dir, force):
    """Copy built-in template NAME to start a site or project template from."""
    from ..templating import eject as do_eject

    target = do_eject(_path(None), name, Path(to_dir or Path.cwd() / ".hpcsuite" / "templates"), force)
    click.echo(f"wrote {target}")


@templates.command()
@click.argument("directory", required=False, type=FilePath(file_okay=False, exists=True))
@profile_option
def validate(directory, profile_path):
    """Render every template (in DIRECTORY, or on the search path) against every example spec.

    Problems are printed as FILE:LINE: message; the exit code is 2 when there are any.
    """
    from ..golden import PROFILE, example_specs, examples_dir
    from ..lint import validate_templates
    from ..templating import SUFFIX

    path = _path(directory)
    if directory:
        names = sorted(p.name[: -len(SUFFIX)] for p in Path(directory).glob(f"*{SUFFIX}"))
        if not names:
            raise UserError(f"{directory}: no *{SUFFIX} templates")
    else:
        names = path.names()
    specs = example_specs(examples_dir())
    problems = validate_templates(path, names, specs, profile_path or str(examples_dir() / PROFILE))
    for line in problems:
        click.echo(line, err=True)
    if problems:
        raise UserError(f"{len(problems)} problem(s) in {len(names)} template(s)")
    click.echo(f"ok: {len(names)} template(s) x {len(specs)} example spec(s) rendered")


@main.command()
@click.argument("spec", type=FilePath(dir_okay=False))
@profile_option
@set_option
def lint(spec, profile_path, sets):
    """Check SPEC against the site profile; exit 2 on errors (render and submit do this too)."""
    from ..config import resolve
    from ..lint import lint as run_lint

    r = resolve(spec, profile_path, sets)
    findings = run_lint(r.job, r.profile)
    for f in findings:
        click.echo(f"{spec}: {f}", err=f.level == "error")
    if any(f.level == "error" for f in findings):
        raise UserError(f"{spec}: {sum(f.level == 'error' for f in findings)} error(s)")
    if not findings:
        click.echo(f"{spec}: ok")
