#!/bin/sh
# hetrun's requeue nudge: an EpilogSlurmctld for sites on Slurm 22.05.
# `hetrun cluster up` renders it (the @...@ fields); docs/PREEMPTION.md says how a site
# installs it ("After the hold: who starts the job").
#
# Why: Slurm starts a heterogeneous job only from its backfill scheduler, and the backfill
# scheduler skips its pass unless a job, node, partition or reservation changed since the
# last one (_more_work in src/plugins/sched/backfill/backfill.c). A requeued job becomes
# eligible when its begin time passes, and that is no change: a requeued het job whose
# preemptor freed the nodes before that moment waits for the next, unrelated event
# (21-35 s on an idle cluster, the length of a quiet period on a busy one).
#
# What: as EpilogSlurmctld (no arguments) it returns at once. For a het job's leader it
# starts a watcher in a session of its own with no inherited descriptors (slurmctld waits
# for its epilog's output to close before the job may complete) and exits 0. The watcher
# waits while the job completes; if the job is then PENDING, it was requeued: the watcher
# sleeps until its EligibleTime and updates the job once with a value it already has
# (its own Requeue flag), which changes nothing but the controller's time stamp of the
# last job change, so the next backfill pass (bf_interval) considers the job. A job that ended,
# started or vanished ends the watcher; it gives up after MAX_WAIT_S. A lock in LOCKS keeps
# it to one watcher per job.
SCONTROL=@SCONTROL@
SETSID=@SETSID@
FLOCK=@FLOCK@
LOCKS=@LOCKS@
LOG=@LOG@
MAX_WAIT_S=@MAX_WAIT_S@

if [ "${1:-}" != "--watch" ]; then
    [ -n "${SLURM_HET_JOB_ID:-}" ] && [ "${SLURM_HET_JOB_OFFSET:-}" = 0 ] || exit 0
    case ${SLURM_JOB_ID:-} in '' | *[!0-9]*) exit 0 ;; esac
    "$SETSID" "$0" --watch "$SLURM_JOB_ID" </dev/null >>"$LOG" 2>&1 &
    child=$!
    # Return only once the watcher leads a session of its own: when its epilog exits,
    # slurmctld kills the epilog's process group (SIGTERM, then SIGKILL 10 ms later), and a
    # watcher still in it dies, at once or at its first wait (the TERM arrives blocked).
    tries=0
    while [ "$tries" -lt 200 ]; do
        stat=$(cat "/proc/$child/stat" 2>/dev/null) || break  # gone: nothing to wait for
        set -- ${stat##*) }  # state ppid pgrp session ...
        [ "${4:-}" = "$child" ] && break
        sleep 0.01
        tries=$((tries + 1))
    done
    exit 0
fi

job=${2:-}
case $job in '' | *[!0-9]*) echo "requeue_nudge: not a job id: '$job'" >&2; exit 2 ;; esac
# One watcher per job: Slurm may run the epilog of a het job's leader twice on one requeue.
exec 9>>"$LOCKS/requeue_nudge.$job.lock"
"$FLOCK" -n 9 || exit 0
trap 'rm -f "$LOCKS/requeue_nudge.$job.lock"' EXIT

# field NAME LINE: the value of NAME=... in a `scontrol show job -o` line.
field() {
    case $2 in *" $1="*) ;; *) return 1 ;; esac
    v=${2#* $1=}
    printf '%s\n' "${v%% *}"
}

end=$(( $(date +%s) + MAX_WAIT_S ))
while :; do
    now=$(date +%s)
    if [ "$now" -ge "$end" ]; then
        echo "$(date +%Y-%m-%dT%H:%M:%S) JobId=$job: gave up after ${MAX_WAIT_S} s (last state: ${state:-unknown})"
        exit 0
    fi
    out=$("$SCONTROL" show job -o "$job" 2>&1)
    case $out in *"Invalid job id"*) exit 0 ;; esac  # purged: nothing to start
    line=$(printf '%s\n' "$out" | head -n 1)
    # No answer (a controller busy or restarting): ask again.
    state=$(field JobState "$line") || { sleep 1; continue; }
    case $state in
        COMPLETING | REQUEUE* | STAGE_OUT) sleep 1; continue ;;  # still ending
        PENDING) ;;                                              # requeued
        *) exit 0 ;;                                             # ended, started, cancelled
    esac
    eligible=$(field EligibleTime "$line") || exit 0
    at=$(date -d "$eligible" +%s 2>/dev/null) || at=$now
    if [ "$at" -gt "$now" ]; then
        # Re-read after the sleep: the owner may have moved the begin time meanwhile.
        sleep $(( at - now ))
        continue
    fi
    requeue=$(field Requeue "$line") || exit 0
    case $requeue in 0 | 1) ;; *) exit 0 ;; esac
    if "$SCONTROL" update JobId="$job" Requeue="$requeue" >/dev/null 2>&1; then how=done; else how=refused; fi
    echo "$(date +%Y-%m-%dT%H:%M:%S) JobId=$job eligible $eligible, still pending: nudged the backfill scheduler (scontrol update Requeue=$requeue: $how)"
    exit 0
done
