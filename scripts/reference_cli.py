"""The command reference page (docs/reference/cli.md), from walking the Click group: every
command's usage, help and options. scripts/gen_reference.py writes it with the others. An
option's table cell holds the first clause of its help, the list under the table the whole
(the short-cell rule of scripts/reference_md.py)."""

from __future__ import annotations

import inspect

from reference_md import BANNER, code, md, notes, sentence, summary, table


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


def param_rows(command, ctx, slug: str = "") -> list[list[str]]:
    """The option table's rows (an option's help cut to its first clause, linking to its
    entry in :func:`param_notes`)."""
    return [row for row, _ in _params(command, ctx, slug)]


def param_notes(command, ctx, slug: str = "") -> str:
    """The list under the option table: the whole help of each option whose cell is cut."""
    return notes([entry for _, entry in _params(command, ctx, slug) if entry])


def _params(command, ctx, slug: str):
    import click

    for param in command.get_params(ctx):
        if getattr(param, "hidden", False) or param.name == "help":
            continue
        entry = None
        if isinstance(param, click.Argument):
            names = f"`{param.human_readable_name}`"
            cell = "argument" + (", required" if param.required else ", optional")
        else:
            opts = [*param.opts, *param.secondary_opts]
            names = " / ".join(f"`{o}`" for o in opts)
            whole = param.help or ""
            if param.envvar and str(param.envvar) not in whole:
                whole = f"{whole} (env: `{param.envvar}`)".strip()
            if param.required:
                whole = ("required. " + whole).strip()
            first, cut = summary(whole)
            cell = md(first if cut else whole)
            if cut:
                anchor = f"{slug}-{max(param.opts, key=len).lstrip('-')}-option"
                cell += f" [more](#{anchor})"
                entry = (names, anchor, [md(sentence(whole))])
        yield [names, param_type(param), param_default(param, ctx), cell], entry


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
        rows = param_rows(command, ctx, slug)
        if rows:
            out.append(table(["option", "type", "default", "help"], rows))
            listed = param_notes(command, ctx, slug)
            if listed:
                out.append(listed)
    return "\n".join(out)
