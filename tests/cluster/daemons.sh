# Long-lived processes `tests/cluster/up` starts and finds again (kube-proxy, CoreDNS, the
# agent): sourced by `up` and by tests/unit/test_cluster_daemons.py. Needs CACHE, IN (the
# command prefix into the cluster's network namespace, maybe empty) and log().
#
# A daemon is known by the pid in $CACHE/<name>.pid and by <name> in that process's command
# line (a pid file left by an earlier boot may name a pid now reused by something else).
# `$!` names the forked shell until it execs the command, and until then its command line is
# the starting script's: a check made right after the fork took a live daemon for dead (a
# fresh machine's CI: "coredns died", CoreDNS serving). So nothing returns before the exec.

# proc_gone PID: PID has exited (no such process, or a zombie).
proc_gone() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  [[ ${stat%% *} == Z ]]
}

# proc_is PID PATTERN: PID is alive and its command line holds PATTERN.
proc_is() {
  ! proc_gone "$1" && grep -q "$2" "/proc/$1/cmdline" 2>/dev/null
}

# await_exec PID PATTERN: return once PID is PATTERN's process or gone (at most 20 s).
await_exec() {
  local _
  for _ in $(seq 1 400); do
    proc_is "$1" "$2" && return 0
    proc_gone "$1" && return 0
    sleep 0.05
  done
}

# daemon_alive NAME [PATTERN]: the daemon <name> started by start_daemon still runs.
# A live pid whose command line does not hold PATTERN is asked again for up to 3 s before it
# counts as someone else's: a daemon started through a chain of execs (nohup, `ip netns exec`,
# the daemon) is seen between two of them with its old command line or none at all (the
# kernel sets the new one late in execve), and a CI run under load took CoreDNS for dead there
# after await_exec had seen only the first exec. A pid that is gone or a zombie is dead at once.
daemon_alive() {
  local pid _
  pid=$(cat "$CACHE/$1.pid" 2>/dev/null) || return 1
  [[ -n "$pid" ]] || return 1
  for _ in $(seq 1 60); do
    proc_is "$pid" "${2:-$1}" && return 0
    proc_gone "$pid" && return 1
    sleep 0.05
  done
  return 1
}

# daemon_describe NAME: what its pid file names, for the message of a daemon found dead.
daemon_describe() {
  local pid
  pid=$(cat "$CACHE/$1.pid" 2>/dev/null) || { echo "$1: no pid file"; return 0; }
  echo "$1: pid $pid, stat: $(cat "/proc/$pid/stat" 2>/dev/null || echo gone)," \
       "cmdline: $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || echo gone)"
}

# start_daemon NAME [--match PATTERN] CMD ARGS...: run CMD in the cluster's namespace, in the
# background, logging to $CACHE/logs/<name>.log, unless it already runs. PATTERN (default NAME)
# is what its command line holds once it runs.
start_daemon() {
  local name=$1 pattern=$1; shift
  if [[ ${1:-} == --match ]]; then pattern=$2; shift 2; fi
  if daemon_alive "$name" "$pattern"; then return 0; fi
  log "starting $name"
  ( nohup "${IN[@]}" "$@" >>"$CACHE/logs/$name.log" 2>&1 </dev/null 9>&- & echo $! >"$CACHE/$name.pid" )
  await_exec "$(cat "$CACHE/$name.pid")" "$pattern"
}
