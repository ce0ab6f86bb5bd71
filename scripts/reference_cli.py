"""The command reference page (docs/reference/cli.md), from walking the Click group: every
command's usage, help and options. scripts/gen_reference.py writes it with the others."""

from __future__ import annotations

import inspect

from reference_md import BANNER, code, md, table


def help_markdown(text: str) -> str:
    """Click help: paragraphs, and ``\\b`` paragraphs (kept as written) as code blocks."""
    out = []
    for para in inspect.cleandoc(text or "").split("\n\n"):
        if para.startswith("\b"):
            out.append("```text\n" + para.lstrip("\b").strip("\n") + "\n```")
        elif para.strip():
            out.append(md(para))
    return "\n\n".join(out)


def param_type(param) -> str:
    import click

    kind = param.type
    if getattr(param, "count", False):
        text = "count"
    elif isinstance(kind, click.Choice):
        text = "one of " + ", ".join(f"`{c}`" for c in kind.choices)
    elif isinstance(kind, (click.IntRange, click.FloatRange)):
        text = f"{kind.name.split()[0]} ({md(range_text(kind))})"
    elif getattr(param, "is_flag", False) and not getattr(param, "secondary_opts", None):
        text = "flag"
    else:
        text = kind.name
    if getattr(param, "multiple", False):
        text += ", repeatable"
    return text


def range_text(kind) -> str:
    """A Click range as its help shows it (``0<=x<=1``, ``x>=1``), from its public bounds."""
    if kind.min is None:
        return f"x{'<' if kind.max_open else '<='}{kind.max}"
    if kind.max is None:
        return f"x{'>' if kind.min_open else '>='}{kind.min}"
    return f"{kind.min}{'<' if kind.min_open else '<='}x{'<' if kind.max_open else '<='}{kind.max}"


def param_default(param, ctx) -> str:
    value = param.get_default(ctx, call=False)
    if callable(value):
        return "computed when run"
    if type(value).__name__ == "Sentinel" or value in (None, (), []) or \
            (value is False and getattr(param, "is_flag", False)):
        return ""
    return code(value)


def param_rows(command, ctx) -> list[list[str]]:
    import click

    rows = []
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False) or param.name == "help":
            continue
        if isinstance(param, click.Argument):
            names = f"`{param.human_readable_name}`"
            help_text = "argument" + (", required" if param.required else ", optional")
        else:
            names = " / ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
            help_text = md(param.help or "")
            if param.envvar and str(param.envvar) not in help_text:
                help_text += f" (env: `{param.envvar}`)"
            if param.required:
                help_text = ("required. " + help_text).strip()
        rows.append([names, param_type(param), param_default(param, ctx), help_text])
    return rows


def commands(group, ctx):
    """(context, command) for the group and every command under it, sorted by name."""
    import click

    yield ctx, group
    if isinstance(group, click.Group):
        for name in sorted(group.list_commands(ctx)):
            sub = group.get_command(ctx, name)
            yield from commands(sub, click.Context(sub, info_name=name, parent=ctx))


def cli_page() -> str:
    import click

    from hpcsuite.cli import main

    out = [BANNER.format(source="hpcsuite/cli (the Click commands)"), "# Command reference\n",
           "Every `hpcsuite` command and option, read from the Click commands themselves "
           "(`hpcsuite COMMAND --help` prints the same). Commands marked *internal* are run by "
           "the batch script on the compute nodes, not by users.\n"]
    # the group's own context_settings (-h too), as `hpcsuite` itself runs with them
    top = click.Context(main, info_name="hpcsuite", **main.context_settings)
    for ctx, command in commands(main, top):
        path = ctx.command_path
        slug = path.replace(" ", "-")
        internal = " *(internal)*" if command.hidden or (ctx.parent and ctx.parent.command.hidden) else ""
        out.append(f"## `{path}`{internal} {{#{slug}}}\n")
        out.append(f"```text\n{path} {' '.join(command.collect_usage_pieces(ctx))}\n```\n")
        if command.help:
            out.append(help_markdown(command.help) + "\n")
        if isinstance(command, click.Group):
            subs = [f"[`{path} {n}`](#{slug}-{n})" for n in sorted(command.list_commands(ctx))]
            out.append("Commands: " + ", ".join(subs) + "\n")
        rows = param_rows(command, ctx)
        if rows:
            out.append(table(["option", "type", "default", "help"], rows))
    return "\n".join(out)
