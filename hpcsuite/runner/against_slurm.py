"""A job's rendered script against the Slurm it will meet: what changed after 22.05
(:mod:`hpcsuite.submit.slurm_rules`) as lint findings, for ``templates lint --against-slurm``,
``submit`` and ``doctor`` (the site profile's own scripts)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..errors import UserError
from ..submit.lint import Finding


def ask(timeout: float = 30):
    """:class:`~hpcsuite.submit.slurm_rules.SlurmFacts` of the Slurm that ``SLURM_CONF`` points
    to (two quick calls); a Slurm that does not answer is a UserError."""
    from .. import slurm
    from ..submit.slurm_rules import facts_from

    version = slurm.call(["sbatch", "--version"], timeout=timeout)
    config = slurm.call(["scontrol", "show", "config"], timeout=timeout)
    return facts_from(version.stdout, config.stdout)


def rule_findings(script: str, facts=None) -> list[Finding]:
    """Each rule that fires on ``script``, one finding naming the line, the release it applies
    from and what to write instead; ``facts``: the Slurm asked (default: SLURM_CONF's)."""
    from ..submit import slurm_rules

    facts = facts or ask()
    slurm = slurm_rules.dotted(facts.server)
    return [Finding(h.level, h.key, h.sentence(slurm))
            for h in slurm_rules.script_hits(script, facts)]


def rendered(resolved, launchers=None, cwd: Path | None = None) -> dict[str, str]:
    """The resolved job's script, as ``render`` writes it, under each of ``launchers`` (default:
    the job's own); a launcher the job cannot use (a container runtime needing srun) is left
    out."""
    from ..submit.plan import plan
    from ..submit.templating import SearchPath

    path = SearchPath.default(None, cwd, site_only="template" in resolved.locks)
    out = {}
    for launcher in launchers or (resolved.job.launcher,):
        job = dataclasses.replace(resolved.job, launcher=launcher)
        try:
            out[launcher] = plan(job, resolved.profile, path, resolved.locks).script
        except UserError:
            if launchers is None:
                raise
    return out


def profile_scripts(resolved, whole_profile: bool) -> dict[str, str]:
    """What ``doctor`` applies the rules to: the spec's script, or (no spec) a default job's under
    the profile with each launcher."""
    return rendered(resolved, ("srun", "mpirun") if whole_profile else None)
