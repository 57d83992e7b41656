#!/usr/bin/env bash
# Runs README.md's two set-up commands (between the main-command and test-command markers) verbatim,
# as a new user would: in a clean copy of the checkout (its files without build outputs), in a fresh
# venv, one after the other, each timed. Used on the GPU machine, which has no internet: there
# INHERIT_SITE=1 lets the venv see the running python3's packages (torch) through a .pth file, and
# PIP_FIND_LINKS / PIP_NO_INDEX supply the missing wheels.
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
(cd "$REPO" && tar --exclude=./.git --exclude=./build --exclude=./dist --exclude='*.so' --exclude=./.whl \
  --exclude=./.wt --exclude='*.egg-info' --exclude=edsc_ext/_build_meta.py --exclude=__pycache__ -cf - .) \
  | (cd "$WORK/clone" && tar -xf -)
python3 -m venv "$WORK/venv"
if [ -n "${INHERIT_SITE:-}" ]; then
  base_site="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  venv_site="$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "import site; site.addsitedir('$base_site')" > "$venv_site/_inherited_site.pth"
fi

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
