"""The results file a job leaves behind, and its human summary. Framework-free."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_json_atomic(path: Path, data: object) -> None:
    """Write JSON so readers see the old file or the new one, never half of one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def summarize(run_dir: str | Path) -> str:
    run_dir = Path(run_dir)
    r = json.loads((run_dir / "results.json").read_text())
    losses = r.get("loss", [])
    sums = r.get("param_checksums", [])
    same = "identical on all ranks" if sums and len(set(sums)) == 1 else "DIFFER across ranks"
    resumed = f", resumed at step {r['start_step']}" if r.get("resumed_from") else ""
    lines = [
        f"job {r.get('job_id')} ({r.get('job')}): {r.get('status', 'completed')} at step "
        f"{r.get('final_step', r['steps'])}{resumed}; {r['world_size']} ranks on "
        f"{', '.join(r.get('hosts', [])) or '?'}, backend {r.get('backend')}",
        f"  samples/s {r['samples_per_s']:.1f} overall, {r.get('samples_per_s_steady', 0):.1f} "
        f"after warm-up; step time median {r['step_time_s']['median'] * 1e3:.2f} ms",
        f"  loss {losses[0]:.4f} -> {losses[-1]:.4f}" if losses else "  no loss recorded",
        f"  parameters: {same}",
        *([f"  checkpoints: {len(r['checkpoints'])} saved, last {r['checkpoints'][-1]['path']}"]
          if r.get("checkpoints") else []),
        f"  outputs: {run_dir}",
    ]
    return "\n".join(lines)
