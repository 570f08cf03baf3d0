#!/usr/bin/env bash
# One stage of `make setup` / `make demo`: one line with its name and time on the terminal, the
# command's own output (pip's, vLLM's) appended to LOG; when the stage fails, the log's last lines
# and where the whole log is.
# usage: tools/stage.sh LOG "what the stage does" COMMAND [ARG...]
set -uo pipefail
if [ $# -lt 3 ]; then
    echo "usage: tools/stage.sh LOG NAME COMMAND [ARG...]" >&2
    exit 2
fi
log=$1
name=$2
shift 2
mkdir -p "$(dirname "$log")"
printf '==> %s: %s\n' "$name" "$*" >>"$log"
printf '%-58s ' "$name"
start=$(date +%s)
"$@" >>"$log" 2>&1
code=$?
took=$(($(date +%s) - start))
if [ "$code" -ne 0 ]; then
    printf 'FAILED after %d s (exit %d)\n' "$took" "$code"
    echo "---- last lines of $log ----"
    tail -n 40 "$log"
    echo "---- the whole output: $log ----"
    exit "$code"
fi
printf '%3d s\n' "$took"
