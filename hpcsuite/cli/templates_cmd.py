"""`hpcsuite templates` and `hpcsuite lint`: what sysadmins use to fit templates to a site."""

from __future__ import annotations

from pathlib import Path

import click

from . import (FilePath, main, note_no_site, profile_option, remote_option, set_option,
               template_dir_option)
from ..errors import UserError


def _complete_names(ctx, param, incomplete):
    from ..submit.templating import SearchPath

    return [n for n in SearchPath.default(ctx.params.get("template_dir")).names()
            if n.startswith(incomplete)]


name_argument = click.argument("name", shell_complete=_complete_names)


def _path(template_dir):
    """The search path render uses here: under the site's ``locked: [template]``, the site's
    templates and the built-in ones only (a user's or project's file is never rendered)."""
    from ..submit.config import load_profile_layer, site_location
    from ..submit.templating import SearchPath

    site = site_location().profile
    locked = site is not None and "template" in load_profile_layer("site", str(site)).locked
    return SearchPath.default(template_dir, site_only=locked)


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
    if not any(layer in ("project", "user") for layer, _ in path.dirs):
        click.echo("the site locks the template (locked: [template]): only the site's and the "
                   "built-in templates are rendered")
    click.echo("search path:\n" + path.listing())
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
    from ..submit.templating import eject as do_eject

    target = do_eject(_path(None), name, Path(to_dir or Path.cwd() / ".hpcsuite" / "templates"), force)
    click.echo(f"wrote {target}")


@templates.command()
@click.argument("directory", required=False, type=FilePath(file_okay=False, exists=True))
@profile_option
def validate(directory, profile_path):
    """Render every template (in DIRECTORY, or on the search path) against every example spec.

    Problems are printed as FILE:LINE: message; the exit code is 2 when there are any.
    """
    from ..submit.golden import PROFILE, example_specs, examples_dir
    from ..runner import validate_templates
    from ..submit.templating import SUFFIX

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


STUDY_ONLY = {"mode", "repeats", "warmup_steps"}
SWEEP_ONLY = {"random", "max_parallel"}


def _grid_file(path: str) -> tuple[str, str] | None:
    """("study"|"sweep", its base spec's path) when ``path`` is a study or sweep file (its
    own keys checked: one line naming the key when wrong); None for a job spec."""
    from ..study.points import load_study
    from ..submit.schema import read_yaml
    from ..sweep.spec import load_sweep

    data = read_yaml(path)
    if not isinstance(data, dict) or "base" not in data or "axes" not in data:
        return None
    kinds = [("study", load_study), ("sweep", load_sweep)]
    if SWEEP_ONLY & set(data) or not STUDY_ONLY & set(data) and all(
            "." in str(k) for k in (data.get("axes") or {})):
        kinds.reverse()                   # a sweep's axes are job keys: train.lr
    first = None
    for kind, load in kinds:
        try:
            grid = load(path)
        except UserError as e:
            first = first or e
            continue
        return kind, str(Path(path).parent / grid.base)
    raise first


@main.command()
@click.argument("spec", type=FilePath(dir_okay=False))
@profile_option
@set_option
@click.option("--slurm/--no-slurm", "against_slurm", default=None,
              help="Check the job against the partitions of the Slurm that SLURM_CONF points to "
                   "(nodes, CPUs and GPUs per node), and its rendered script against what "
                   "changed in that Slurm's release since 22.05 (docs/admin/slurm-versions.md), "
                   "and the profile's module_init and modules against the module system here. "
                   "Default: when Slurm answers.")
@click.option("--build", is_flag=True,
              help="Also open the job's data and build its model here, in one process, as a "
                   "rank does when it starts: a data factory's return, the model's backend and "
                   "its output shape against the data, the loss. Imports torch/TensorFlow "
                   "(seconds); nothing else here does.")
@remote_option
def lint(spec, profile_path, sets, against_slurm, build):
    """Check SPEC against the site profile (and Slurm); exit 2 on errors.

    Every finding is one line, `error: SPEC: key: ...` or `warning: SPEC: key: ...` (render and
    submit run the same checks; submit also asks Slurm)."""
    from ..submit.config import resolve
    from ..submit.lint import build_findings, pinned_findings
    from ..runner import check

    grid = _grid_file(spec)
    if grid is not None:      # a study's or sweep's file: checked, then its base spec is linted
        kind, base = grid
        click.echo(f"{spec}: {kind} file ok; linting its base spec {base}", err=True)
        spec = base
    r = resolve(spec, profile_path, sets)
    findings = pinned_findings(profile_path) + check(r)
    if against_slurm is not False:
        from ..runner import slurm_findings

        try:
            # One problem, one line: what the site profile already refused, Slurm's check
            # would say again in other words (the partition's CPUs, GPUs, nodes).
            refused = {f.key for f in findings if f.level == "error"}
            findings += [f for f in slurm_findings(r.job) if f.key not in refused]
            from ..site.job_prologue import module_problems
            from ..submit.lint import Finding

            findings += [Finding("error", key, why) for key, why in module_problems(r.profile)]
            if not refused:      # the rendered script against what changed after 22.05
                from ..runner.against_slurm import rendered, rule_findings

                findings += rule_findings(rendered(r)[r.job.launcher])
        except UserError as e:
            if against_slurm:
                raise
            click.echo(f"note: {spec}: not checked against Slurm ({e})", err=True)
    if build and not any(f.level == "error" for f in findings):
        findings += build_findings(r.job)
    for f in findings:
        click.echo(f"{f.level}: {spec}: {f.key}: {f.message}", err=True)
    if any(f.level == "error" for f in findings):
        raise click.exceptions.Exit(UserError.exit_code)
    note_no_site(any(layer.name == "site" for layer in r.layers), spec)   # beside a success only
    if not findings:
        click.echo(f"{spec}: ok" + (" (data, model and loss built)" if build else ""))
