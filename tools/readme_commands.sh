#!/usr/bin/env bash
# Runs README.md's two set-up commands (between the main-command and test-command markers) verbatim,
# as a new user would: in a clean copy of the checkout's tracked files, in a fresh venv, one after the
# other, each timed. Used on the GPU machine (which has no internet: its torch comes from the system's
# site-packages, VENV_FLAGS=--system-site-packages, and missing wheels from PIP_FIND_LINKS).
#   bash tools/readme_commands.sh [WORK_DIR]     (logs: WORK_DIR/main.log, WORK_DIR/test.log)
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${1:-$(mktemp -d)}"
mkdir -p "$WORK"
command_between() {
  sed -n "/<!-- $1 -->/,/<!-- \/$1 -->/p" "$REPO/README.md" | grep -v -e '^<!--' -e '^```'
}
MAIN_COMMAND="$(command_between main-command)"
TEST_COMMAND="$(command_between test-command)"

rm -rf "$WORK/clone" "$WORK/venv"
mkdir -p "$WORK/clone"
if git -C "$REPO" rev-parse --git-dir > /dev/null 2>&1; then
  git -C "$REPO" ls-files -z | (cd "$REPO" && xargs -0 cp --parents -t "$WORK/clone")
else  # a copy of the working tree without .git: all but build outputs
  (cd "$REPO" && tar --exclude=./build --exclude='*.so' --exclude=./.whl --exclude=./.wt --exclude='*.egg-info' \
    --exclude=edsc_ext/_build_meta.py -cf - .) | (cd "$WORK/clone" && tar -xf -)
fi
python3 -m venv ${VENV_FLAGS:-} "$WORK/venv"

status=0
run() {  # run NAME COMMAND
  local start=$SECONDS
  echo "=== $1: $2"
  if (cd "$WORK/clone" && export PATH="$WORK/venv/bin:$PATH" VIRTUAL_ENV="$WORK/venv" && bash -euo pipefail -c "$2") \
      > "$WORK/$1.log" 2>&1; then
    echo "=== $1: exit 0 in $((SECONDS - start)) s"
  else
    echo "=== $1: FAILED (exit $?) after $((SECONDS - start)) s"; status=1
  fi
  grep -a "^edsc_ext: \|self-check\|  ok \|FAIL\|passed\|failed\|warning\|Error" "$WORK/$1.log" | tail -25
}
run main "$MAIN_COMMAND"
run test "$TEST_COMMAND"
exit $status
