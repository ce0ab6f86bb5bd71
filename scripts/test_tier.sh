#!/usr/bin/env bash
# Run one test tier in stages, each with its own time bound (docs/contributing/test-tiers.md):
#
#   bash scripts/test_tier.sh ci     what `make test` and .ci/run run: unit, then e2e without the
#                                    repeats of tests/tiers.py's FULL, then the Debian 13 tier
#   bash scripts/test_tier.sh fast   unit (fewer fuzz cases), then tests/tiers.py's FAST e2e
#   bash scripts/test_tier.sh full   unit, every e2e test, the Debian 13 tier
#
# The unit stage runs first and a failure there stops the run (a broken commit fails in
# minutes); the e2e stage stops after MAXFAIL failures. Each stage's time is printed, and a loud
# line when CI's e2e stage passes its 30-minute budget. PYTEST_ARGS go to every pytest stage.
set -uo pipefail
cd "$(dirname "$0")/.."
TIER=${1:?usage: test_tier.sh ci|fast|full}
PY=${VENV:-.venv}/bin/python
MAXFAIL=${MAXFAIL:-5}
E2E_BUDGET_MIN=${E2E_BUDGET_MIN:-30}
read -r -a EXTRA <<< "${PYTEST_ARGS:-}"
declare -a SUMMARY=()
FAILED=0

stage() {   # stage NAME MINUTES COMMAND...: run it under `timeout`, print and keep its time
  local name=$1 minutes=$2; shift 2
  local start=$SECONDS rc
  printf '\n==== stage %s (bound %s min): %s\n' "$name" "$minutes" "$*"
  timeout --kill-after=60 "${minutes}m" "$@"
  rc=$?
  local took=$((SECONDS - start))
  [[ $rc == 124 || $rc == 137 ]] && echo "==== stage $name passed its bound of $minutes min: stopped"
  SUMMARY+=("$(printf '%-9s %4d s (%2d min %02d s)  exit %d' "$name" "$took" $((took / 60)) \
    $((took % 60)) "$rc")")
  LAST_TOOK=$took
  return "$rc"
}

finish() {
  printf '\n==== %s tier, stage times:\n' "$TIER"
  printf '  %s\n' "${SUMMARY[@]}"
  printf '  total     %4d s\n' "$SECONDS"
  exit "$FAILED"
}

case $TIER in
  ci)   unit_env=(HPCSUITE_FUZZ_EXAMPLES=200 HPCSUITE_LOCK_PROBES=30); e2e_mark="e2e and not full" ;;
  fast) unit_env=(HPCSUITE_FUZZ_EXAMPLES=100 HPCSUITE_LOCK_PROBES=30); e2e_mark="e2e and fast" ;;
  full) unit_env=(); e2e_mark="e2e" ;;
  *) echo "test_tier.sh: no tier '$TIER' (ci, fast or full)" >&2; exit 2 ;;
esac

# With PYTEST_ARGS naming tests, a stage none of them is in collects nothing (pytest's exit 5):
# no failure of that stage, but a run where no stage ran a test is one.
RAN=0
pytest_stage() {
  local rc=0
  stage "$@" || rc=$?
  if [[ $rc == 5 && ${#EXTRA[@]} -gt 0 ]]; then echo "==== (none of PYTEST_ARGS' tests here)"; return 0; fi
  [[ $rc == 0 ]] && RAN=1
  return "$rc"
}
# The unit tests run in UNIT_WORKERS processes (pytest-xdist; default: 2, or 0 on one core):
# they share nothing but the machine. The e2e tests share one Slurm cluster and run in order.
UNIT_WORKERS=${UNIT_WORKERS:-$(( $(nproc) >= 2 ? 2 : 0 ))}
if ! pytest_stage unit 25 env "${unit_env[@]}" "$PY" -m pytest -m "not e2e" -n "$UNIT_WORKERS" \
    "${EXTRA[@]}"; then
  FAILED=1; echo "==== the unit stage failed: the end-to-end stages do not run"; finish
fi
pytest_stage e2e 50 env "${unit_env[@]}" "$PY" -m pytest -m "$e2e_mark" --maxfail="$MAXFAIL" \
  "${EXTRA[@]}" || FAILED=1
[[ $RAN == 1 || $FAILED == 1 ]] || { echo "==== no stage ran a test"; FAILED=1; }
if [[ $TIER == ci && $LAST_TOOK -gt $((E2E_BUDGET_MIN * 60)) ]]; then
  printf '\n!!!! WARNING: the e2e stage took %d min %02d s, over its %d-minute budget.\n' \
    $((LAST_TOOK / 60)) $((LAST_TOOK % 60)) "$E2E_BUDGET_MIN"
  printf '!!!! A new end-to-end test asserts on a job another test already runs unless it needs\n'
  printf '!!!! its own (docs/contributing/test-tiers.md); CI stops at 90 minutes.\n'
fi
if [[ $TIER != fast ]]; then
  stage debian13 15 bash scripts/debian13.sh || FAILED=1
fi
finish
