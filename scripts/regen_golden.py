"""Rewrite sbatch/*.sbatch from sbatch/*.yaml (run by `make golden`)."""

from pathlib import Path

from hpcsuite.submit.golden import expected_scripts

root = Path(__file__).resolve().parent.parent / "sbatch"
for path, text in expected_scripts(root).items():
    old = path.read_text() if path.exists() else None
    if old != text:
        path.write_text(text)
        print(f"wrote {path.relative_to(root.parent)}")
