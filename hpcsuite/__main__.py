import sys

if sys.argv[1:2] == ["train"]:
    # In-job entry: catch the preemption signals before anything else is imported, so one that
    # comes while the rank starts is remembered, not fatal (hpcsuite.runtime.rank.signals).
    from hpcsuite.runtime.rank.signals import EARLY_SIGNALS, FLAG

    FLAG.install(EARLY_SIGNALS)

from hpcsuite.cli import main  # noqa: E402

main(prog_name="hpcsuite")
