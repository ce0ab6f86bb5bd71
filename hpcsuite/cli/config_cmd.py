"""`hpcsuite config`: the merged configuration and where each value came from."""

from __future__ import annotations

import click

from . import FilePath, emit_json, main, profile_option, set_option


@main.group()
def config():
    """Inspect layered configuration.

    Layers, lowest first: built-in, site ($HPCSUITE_SITE_DIR/profile.yaml, else
    /etc/hpcsuite/profile.yaml, or --profile; a profile in /etc/hpcsuite with pinned: true
    cannot be replaced), user (~/.config/hpcsuite/profile.yaml), project
    (./.hpcsuite/profile.yaml), the job spec, and --set. Keys the site locks, and the keys
    that describe the cluster (partitions, mpi, module_init), no later layer can change.
    """


@config.command()
@click.argument("spec", required=False, type=FilePath(dir_okay=False))
@profile_option
@set_option
@click.option("--origin", is_flag=True,
              help="Show which layer set each value, and mark the values the site locks.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def show(spec, profile_path, sets, origin, as_json):
    """Print the merged configuration (of SPEC, if given)."""
    from ..submit.config import is_locked, merged_view, resolve
    from ..submit.pinning import pinned_file, pinned_warning

    if spec:
        resolve(spec, profile_path, sets)  # a complete job must validate
    view, origins, locks = merged_view(spec, profile_path, sets)
    in_vain = pinned_warning(profile_path)
    if in_vain:
        click.echo(f"warning: {in_vain}", err=True)
    no_effect = f"no effect: only {pinned_file()} is pinned"   # beside the value, when in vain
    used = _template_file(view, locks) if origin else None
    if as_json:
        locked = sorted(k for k in origins if is_locked(k, locks))
        emit_json({"config": view, "origins": origins, "locked": locked,
                   "template_file": used} if origin else view)
        return
    if origin:
        width = max(len(k) for k in origins)
        for key in sorted(origins):
            value = _lookup(view, key)
            mark = "  [locked]" if is_locked(key, locks) else ""
            if key == "site.pinned" and in_vain:
                mark = f"  [{no_effect}]"
            where = origins[key]
            if key == "job.template" and used:   # the value's layer, and the file it names
                where += f"; file: {used['path']} ({used['layer']})" if used["path"] else \
                    "; no such template on the search path"
            click.echo(f"{key:{width}}  {_fmt(value):30}  # {where}{mark}")
        return
    import yaml

    text = yaml.safe_dump(view, sort_keys=False, default_flow_style=False)
    if in_vain:     # two spaces in: a key of site: or job:, and no job key is named pinned
        text = text.replace("\n  pinned: true\n", f"\n  pinned: true  # {no_effect}\n")
    click.echo(text, nl=False)


def _template_file(view: dict, locks) -> dict | None:
    """The template file a submit from here would render: its search-path layer and path
    (a site, user or project file can stand in for a built-in name)."""
    from ..submit.templating import SearchPath

    name = (view.get("job") or {}).get("template")
    if not isinstance(name, str):
        return None
    found = SearchPath.default(site_only="template" in locks).candidates(name)
    return {"name": name, "layer": found[0][0] if found else None,
            "path": str(found[0][1]) if found else None}


def _lookup(view: dict, key: str):
    node = view
    for part in key.split("."):
        node = node[part]
    return node


def _fmt(value) -> str:
    import json

    return json.dumps(value)
