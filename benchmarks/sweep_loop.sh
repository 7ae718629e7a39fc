# Sourced by benchmarks/gpu_sweep.sh and cpu_sweep.sh: their candidates run
# in one process, and a process that dies in one is followed by another.
#
#   run_candidates PYTHON SCRIPT OUT DEADLINE [FLAG...]
#
# runs `PYTHON SCRIPT --out=OUT --seconds=LEFT FLAG...` (the protocol of
# benchmarks/sweep.py) until it ends well or DEADLINE (in $SECONDS) is
# less than 30 seconds away. A process that dies leaves "started" in the
# log of the candidate it died in: that log says so, and the next process
# goes on from the next candidate. One that dies before any candidate
# would again: its last lines are shown and the loop ends.
run_candidates() {
  local python=$1 script=$2 out=$3 deadline=$4
  shift 4
  local left status died_in log
  while left=$((deadline - SECONDS)); ((left >= 30)); do
    status=0
    timeout "$left" "$python" "$script" --out="$out" --seconds="$left" "$@" \
      2>>"$out/sweep.log" || status=$?
    ((status == 0)) && break
    died_in=0
    for log in "$out"/*.*.log; do
      if [[ -f $log && $(tail -n 1 "$log") == started ]]; then
        echo "the process died in it (exit status $status)" >>"$log"
        died_in=1
      fi
    done
    if ((!died_in)); then
      tail -n 5 "$out/sweep.log" >&2
      break
    fi
  done
}
