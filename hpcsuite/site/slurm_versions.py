"""`doctor`'s answers about versions: the Slurm it meets (``sbatch --version``, ``scontrol show
config``) with :mod:`hpcsuite.submit.slurm_rules` applied to the site profile's scripts, and the
MPI its launcher says it is against the flavour's record (:mod:`hpcsuite.mpis`). Pure judges of
recorded output: doctor asks."""

from __future__ import annotations

from .. import mpis
from ..errors import UserError
from ..submit.slurm_rules import SlurmFacts, dotted, facts_from, pmix_topology_note, script_hits


def slurm_line(facts: SlurmFacts) -> str:
    c = facts.config
    return (f"Slurm {facts.name}; PreemptMode {c.get('PreemptMode', '?')}, TaskPlugin "
            f"{c.get('TaskPlugin', '?')}, MpiDefault {c.get('MpiDefault', '?')}")


def judge_slurm(version: tuple[int, str], config: tuple[int, str],
                scripts: dict[str, str]) -> tuple[str, str, str]:
    """(status, detail, hint) from ``(exit code, output)`` of ``sbatch --version`` and of
    ``scontrol show config``, and the profile's rendered scripts by launcher."""
    for (code, out), argv in ((version, "sbatch --version"), (config, "scontrol show config")):
        if code != 0:
            return "fail", f"{argv}: {(out.splitlines() or [f'exit {code}'])[-1][:200]}", \
                "is the controller up and SLURM_CONF right?"
    try:
        facts = facts_from(version[1], config[1])
    except UserError as e:
        return "fail", str(e), "doctor reads Slurm 22.05 and later"
    errors, warnings = [], []
    for launcher, text in sorted(scripts.items()):
        for hit in script_hits(text, facts):
            said = f"{launcher} job: {hit.sentence(dotted(facts.server))}"
            (errors if hit.level == "error" else warnings).append((said, hit.instead))
    note = pmix_topology_note(facts)
    if note and not any("PMIx" in said for said, _ in warnings):
        warnings.append((note, ""))
    seen = f"{slurm_line(facts)}; the profile's scripts ({', '.join(sorted(scripts)) or 'none'})"
    if errors or warnings:
        found = errors or warnings
        return ("fail" if errors else "warn"), f"{seen}: " + "; ".join(s for s, _ in found), \
            found[0][1]
    return "pass", f"{seen}: no rule of Slurm 23.02-26.05 fires", ""


def judge_mpi(code: int, out: str, flavour: str = mpis.DEFAULT) -> tuple[str, str, str]:
    """(status, detail, hint) of the flavour's launcher's ``--version`` (exit code, output):
    does the MPI it names belong to the flavour (:data:`hpcsuite.mpis.FLAVOURS`)?"""
    want = mpis.FLAVOURS.get(flavour, mpis.FLAVOURS[mpis.DEFAULT])
    program = want.launcher
    first = out.splitlines()[0] if out else ""
    if code != 0:
        return "fail", first or f"{program} exit {code}", \
            "load the MPI module in the profile (modules:) or install the MPI"
    found = mpis.identify(out)
    if found is None:
        return "fail", f"{program} --version says no MPI hpcsuite knows: {first[:120]}", \
            f"set mpi.flavour to the MPI the site loads ({', '.join(mpis.FLAVOURS)})"
    detail = f"{found} ({program} --version)"
    if not want.covers(found):
        fits = mpis.flavour_of(found)
        instead = f"set mpi.flavour to {fits} (the MPI on PATH)" if fits else \
            "set mpi.flavour to the MPI on PATH"
        return "fail", f"{detail}, but the profile's mpi.flavour is {flavour}", \
            f"{instead}, or load the {want.words} module"
    return "pass", detail, ""
