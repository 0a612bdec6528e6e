#!/bin/bash
# CLI findings: each case prints its exit status and the key lines.
A=/work/main/.venv/bin/agentwal
here=$(cd "$(dirname "$0")" && pwd); mkdir -p "$here/runs"; cd "$here"
echo "== 1. --archive with a scheme the drill cannot use: traceback, status 1 (a FAIL), not a usage error (2)"
$A crashtest runs --level sync --kills 0 --power-cuts 0 --archive ftp://host/x > cli1.out 2> cli1.err; echo "exit $?"
grep -E "Traceback|ValueError" cli1.err
echo "== 2. --rpo-ms beyond what the engine accepts: reported as an engine FAIL ('the child failed by itself'), status 1"
$A crashtest runs --level interval --rpo-ms 100000000000 --kills 2 --power-cuts 0 --seed 1 > cli2.out 2> cli2.err; echo "exit $?"
grep -E "^interval |child failed|ArgumentError" cli2.out | cut -c1-160
echo "== 3. --archive with --machine-losses 0 and no kills/cuts: nothing drilled, no table, status 0"
$A crashtest runs --level sync --kills 0 --power-cuts 0 --archive "file://$here/arch" --machine-losses 0 > cli3.out 2> cli3.err; echo "exit $?"
grep -cE "PASS|FAIL" cli3.out | sed 's/^/lines with a verdict: /'
