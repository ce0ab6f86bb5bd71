"""Two studies side by side: their inputs (sha256), resolved job specs, versions and each
configuration's throughput, marked where the difference is beyond the repeats' spread.

Versions are compared as one short line each (:func:`hpcsuite.study.env.summary`); a version
that either study failed to record is a warning, never a difference.
"""

from __future__ import annotations

import json

from .points import StudyDir
from .bundle import BUNDLE_FILE, ENVIRONMENT, read_manifest
from .env import failed, pending, summary
from .env import warnings as warnings_of
from .report import analyse, axes_label


def _flatten(tree, prefix=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, tree


def _environment(sd: StudyDir) -> dict:
    """The study's versions; an unreadable record is itself a version not recorded."""
    try:
        env = json.loads((sd.path / ENVIRONMENT).read_text())
    except (OSError, ValueError):
        env = None
    return env if isinstance(env, dict) else {
        "versions": {"error": f"{sd.path / ENVIRONMENT} is missing or unreadable"}}


def compare_environments(env_a: dict, env_b: dict) -> tuple[list[dict], list[str]]:
    """The versions that differ, each side on one short line; a version either side failed to
    record (or a dry run left pending) is a warning, not a difference."""
    warnings = warnings_of(env_a, "A") + warnings_of(env_b, "B")
    blind = {k for env in (env_a, env_b) for k, v in env.items() if failed(v) or k in pending(env)}
    diffs = []
    for key in sorted(set(env_a) | set(env_b)):
        if key in ("made",) or key in blind:
            continue
        a, b = summary(env_a.get(key)), summary(env_b.get(key))
        if a != b:
            diffs.append({"key": key, "a": a, "b": b})
    return diffs, warnings


def compare(a: StudyDir, b: StudyDir) -> dict:
    """What differs between two studies: inputs (by sha256), resolved job specs, environment,
    and each configuration's throughput, flagged where the difference is beyond the spread."""
    import yaml

    # What the jobs ran from; bundle.json and environment.json describe the making (the
    # environment is compared on its own below).
    about = {BUNDLE_FILE, ENVIRONMENT}
    ma, mb = ({k: v for k, v in read_manifest(sd.path).items() if k not in about} for sd in (a, b))
    inputs = {
        "only_in_a": sorted(set(ma) - set(mb)), "only_in_b": sorted(set(mb) - set(ma)),
        "different": sorted(k for k in set(ma) & set(mb) if ma[k] != mb[k]),
    }
    specs = []
    pb = {p.id: p for p in b.points()}
    for p in a.points():
        if p.id not in pb or not a.point_spec(p).is_file() or not b.point_spec(p).is_file():
            continue
        ja = dict(_flatten(yaml.safe_load(a.point_spec(p).read_text())))
        jb = dict(_flatten(yaml.safe_load(b.point_spec(p).read_text())))
        for key in sorted(set(ja) | set(jb)):
            if key in ("output_dir",) or ja.get(key) == jb.get(key):
                continue
            specs.append({"point": p.id, "key": key, "a": ja.get(key), "b": jb.get(key)})
    env, warnings = compare_environments(_environment(a), _environment(b))
    ra = {r["config"]: r for r in analyse(a)["rows"]}
    rb = {r["config"]: r for r in analyse(b)["rows"]}
    results = []
    for cid in sorted(set(ra) & set(rb)):
        x, y = ra[cid]["throughput"], rb[cid]["throughput"]
        if not x["n"] or not y["n"]:
            continue
        beyond = x["max"] < y["min"] or y["max"] < x["min"]
        results.append({"config": cid, "axes": ra[cid]["axes"], "a": x, "b": y,
                        "ratio": y["median"] / x["median"] if x["median"] else None,
                        "beyond_spread": beyond})
    return {"a": str(a.path), "b": str(b.path), "inputs": inputs, "specs": specs,
            "environment": env, "warnings": warnings, "results": results}


def compare_text(c: dict) -> str:
    lines = [f"A: {c['a']}", f"B: {c['b']}", *c.get("warnings", []), "inputs:"]
    i = c["inputs"]
    if not any(i.values()):
        lines.append("  identical (every sha256 matches)")
    for key, word in (("different", "differs"), ("only_in_a", "only in A"), ("only_in_b", "only in B")):
        lines += [f"  {name}: {word}" for name in i[key]]
    lines.append("job specs:" + ("" if c["specs"] else " identical"))
    lines += [f"  {s['point']} {s['key']}: {s['a']!r} -> {s['b']!r}" for s in c["specs"][:50]]
    lines.append("environment:" + ("" if c["environment"] else " identical"))
    lines += [f"  {e['key']}: {e['a']} -> {e['b']}" for e in c["environment"]]
    lines.append("results (samples/s median [min-max]):")
    for r in c["results"]:
        a, b = r["a"], r["b"]
        verdict = "DIFFERS beyond the repeats' spread" if r["beyond_spread"] else "within the spread"
        lines.append(f"  {r['config']} ({axes_label(r['axes'])}): A {a['median']:.1f} [{a['min']:.1f}-"
                     f"{a['max']:.1f}]  B {b['median']:.1f} [{b['min']:.1f}-{b['max']:.1f}]  "
                     f"B/A {r['ratio']:.3f}  {verdict}")
    if not c["results"]:
        lines.append("  (no configuration has results in both)")
    return "\n".join(lines)
