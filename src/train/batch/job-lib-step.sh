#!/usr/bin/env bash
# shellcheck disable=SC2034,SC2153,SC2329  # (alone: job-lib.sh sets and calls; render checks both as one)
# The job library's step: starting the job step under its waiter, passing the walltime
# signal (or the program's stop request) on to it, ending it (stop mode kill), waiting for
# it, and removing what a killed step leaves behind. Inlined after job-lib.sh, below the
# rendered script's marker line; the names it uses are set there (see job-lib.sh).

train_runtime_cleanup() {
    # a step killed outright (SIGKILL) cannot stop its containers: remove them, on every
    # node of the job (each has its own engine), or on this one where no step can start
    local sweep label="$DOCKER_JOB_LABEL=${SLURM_JOB_ID:-0}"
    [ "$RUNTIME" = docker ] || return 0
    # shellcheck disable=SC2016  # expanded by the sweeping shell
    sweep='ids=$(docker ps -aq --filter "label=$1" 2>/dev/null) || exit 0
[ -z "$ids" ] || { echo "removing containers left on $(hostname): $(echo $ids)" >&2
    docker rm -f $ids >/dev/null 2>&1; }
exit 0'
    if [ "${SLURM_JOB_NUM_NODES:-1}" -gt 1 ] && timeout 120 srun --nodes="$SLURM_JOB_NUM_NODES" \
            --ntasks-per-node=1 --kill-on-bad-exit=0 bash -c "$sweep" sweep "$label"; then
        return 0
    fi
    command -v docker >/dev/null 2>&1 || return 0
    bash -c "$sweep" sweep "$label" || true
}

train_stale_tmp() {
    # The node temporary folders of this chain's earlier jobs, and of this job's earlier
    # runs (requeued), as the task wrapper's patterns JOBID-RESTART
    local chunk id r out=()
    if [ -f "$RUN_DIR/$IDS_FILE" ] && [ -r "$RUN_DIR/$IDS_FILE" ]; then
        while read -r chunk id _; do
            case "$chunk$id" in '' | *[!0-9]*) continue ;; esac
            [ "$id" = "${SLURM_JOB_ID:-0}" ] || out+=("$id-*")
        done < "$RUN_DIR/$IDS_FILE"
    fi
    case "${SLURM_RESTART_COUNT:-0}" in *[!0-9]*) ;; *)
        for ((r = 0; r < ${SLURM_RESTART_COUNT:-0}; r++)); do
            out+=("${SLURM_JOB_ID:-0}-$r")
        done ;;
    esac
    printf '%s' "${out[*]}"
}

train_first_failure() {
    # The step failed (STEP_RC): the code and node (STEP_NODE) of the task that failed
    # first, as the task wrappers recorded them (one line "CODE TIME NODE" a task), never
    # the TERM (143) or KILL (137) that Slurm sent the other tasks after it. Unchanged
    # where no task says (srun failed before any task ran).
    local f rc at node sec frac key best=''
    STEP_NODE=
    for f in "$TRAIN_TMP/exits"/task-*; do
        [ -f "$f" ] || continue
        rc='' at='' node=''
        read -r -n 256 rc at node _ < "$f" || true
        case "$rc" in '' | *[!0-9]* | 0* | 137 | 143 | ????*) continue ;; esac
        sec=${at%%.*}
        frac=${at#"$sec"}
        frac=${frac#.}000000
        case "$sec${frac:0:6}" in '' | *[!0-9]*) continue ;; esac
        [ "${#sec}" -le 12 ] || continue
        key=$((10#$sec * 1000000 + 10#${frac:0:6}))
        if [ -z "$best" ] || [ "$key" -lt "$best" ]; then
            best=$key
            STEP_RC=$((10#$rc))
            case "$node" in *[!A-Za-z0-9._-]*) STEP_NODE= ;; *) STEP_NODE=$node ;; esac
        fi
    done
}

train_chunk_folder() {
    # The chunk's own folder (TRAIN_TMP) in the run folder, never a node's /tmp: a chunk
    # killed at its walltime cannot remove it, the next one does, on whichever node it
    # runs. The tasks record their exit codes in it, and remove what this chain's earlier
    # jobs left in their nodes' temporary folders.
    local stale
    for stale in "$RUN_DIR/$CHUNK_DIR_PREFIX"*; do
        if [ -d "$stale" ] && [ ! -L "$stale" ]; then rm -rf "$stale"; fi
    done
    TRAIN_TMP="$RUN_DIR/$CHUNK_DIR_PREFIX${SLURM_JOB_ID:-0}-${SLURM_RESTART_COUNT:-0}"
    mkdir -p "$TRAIN_TMP/exits"
    export "$TASK_EXITS_VAR=$TRAIN_TMP/exits" "$STALE_TMP_VAR=$(train_stale_tmp)"
}

train_start_step() {
    # The step runs under a small waiter that records its exit status in a file: bash's
    # own `wait` loses a child's status when a trapped signal interrupts it just as the
    # child exits (seen as 138 or -1 for a step that exited 0). The waiter has no traps,
    # so its wait is never interrupted; signals go to the step itself (step.pid).
    train_chunk_folder
    # what a save is newer than (train_last_save); a file's time comes from a clock that
    # ticks every few milliseconds: the step starts a tick later
    touch "$TRAIN_TMP/start"
    sleep 0.02 2>/dev/null || sleep 1
    TRAIN_READY="$RUN_DIR/.signal-ready-${SLURM_JOB_ID:-0}-${SLURM_RESTART_COUNT:-0}"
    rm -f "$TRAIN_READY" "$TRAIN_READY$READY_RANK"*
    export "$READY_VAR=$TRAIN_READY"
    # the walltime contract: what every program of the step is told (README, "Your own
    # program"): where to write, which chunk this is, when to have checkpointed by, how
    # to say that the work is complete
    local now
    printf -v now '%(%s)T' -1
    export TRAIN_RUN_DIR="$RUN_DIR" TRAIN_CHUNK="$CHUNK" TRAIN_MAX_CHUNKS="$LAST_CHUNK" \
        TRAIN_STOP_SIGNAL="$STOP_SIGNAL" TRAIN_STOP_MARGIN="$STOP_MARGIN" \
        TRAIN_DEADLINE=$((TRAIN_START + WALLTIME_SECONDS - STOP_MARGIN)) \
        TRAIN_TIME_BUDGET=$((TRAIN_START + WALLTIME_SECONDS - STOP_MARGIN - now)) \
        TRAIN_COMPLETE_FILE="$RUN_DIR/$COMPLETE_FILE" \
        TRAIN_PROGRESS_FILE="$RUN_DIR/$PROGRESS_FILE" \
        TRAIN_METRICS_FILE="$RUN_DIR/$METRICS_FILE" \
        TRAIN_STOP_REQUEST="$RUN_DIR/.stop-request-${SLURM_JOB_ID:-0}-${SLURM_RESTART_COUNT:-0}"
    rm -f "$TRAIN_STOP_REQUEST"
    # a program that has checkpointed may ask for its chunk to end (`train launch`'s
    # scontrol stand-in does, when Lightning asks to requeue): looked at every second
    (
        while [ ! -e "$TRAIN_STOP_REQUEST" ]; do sleep 1; done
        kill -USR2 "$$" 2>/dev/null
    ) >/dev/null 2>&1 &
    TRAIN_WATCHER=$!
    # a program that resumes only when told: after a checkpointed stop of the run (this
    # chain's or an earlier one's), its arguments end with --resume-args (expanded)
    # the renderer's step_command sets STEP (the per-node wrapper is known by then)
    step_command
    # shellcheck disable=SC2153  # STEP: set by step_command
    local step_argv=("${STEP[@]}")
    if train_resume_argv; then
        step_argv+=(${TRAIN_RESUME_ARGV[@]+"${TRAIN_RESUME_ARGV[@]}"})
    fi
    {
        "${step_argv[@]}" &
        echo "$!" > "$TRAIN_TMP/step.pid"
        # (after the step started: it must not inherit these as ignored)
        trap '' USR1 TERM INT
        waiter_rc=0
        wait "$!" || waiter_rc=$?
        echo "$waiter_rc" > "$TRAIN_TMP/step.rc"
    } &
    TRAIN_WAITER=$!
    printf -v TRAIN_STEP_START '%(%s)T' -1
}

# shellcheck disable=SC2329  # invoked by the traps
train_signal_step() {
    # send signal $1 to the running step (its pid file appears right after it starts)
    local pid='' i
    [ -n "${TRAIN_WAITER:-}" ] || return 0
    for ((i = 0; i < 100; i++)); do
        [ -s "$TRAIN_TMP/step.pid" ] && break
        sleep 0.02
    done
    read -r pid < "$TRAIN_TMP/step.pid" 2>/dev/null || return 0
    kill "-$1" "$pid" 2>/dev/null || true
}

# shellcheck disable=SC2329  # invoked by train_on_usr1
train_count_ready() {
    # TRAIN_RANKS_READY: how many of the step's ranks said their handler is set, each in a
    # file of its own ($READY_VAR with $READY_RANK and its rank appended by the per-task
    # wrapper or `train launch`); the step's own file, touched by a program that no
    # wrapper started, counts as one rank
    local f
    TRAIN_RANKS_READY=0
    for f in "$TRAIN_READY$READY_RANK"*; do
        [ ! -e "$f" ] || TRAIN_RANKS_READY=$((TRAIN_RANKS_READY + 1))
    done
    if [ "$TRAIN_RANKS_READY" = 0 ] && [ -e "$TRAIN_READY" ]; then
        TRAIN_RANKS_READY=1
    fi
}

# shellcheck disable=SC2329  # invoked by train_on_usr1
train_remind_usr1() {
    # one reminder (USR1 to this shell) a second until stopped, from one process started
    # once (a reminder started per signal can be lost: `kill -0` still finds the last one
    # as an unreaped zombie); train_step_ended and the EXIT trap end it
    [ -z "$TRAIN_USR1_LATER" ] || return 0
    (
        trap - EXIT  # (forked in a trap handler, as train_kill's is)
        while sleep 1; do
            kill -USR1 "$$" 2>/dev/null || exit 0
        done
    ) >/dev/null 2>&1 &
    TRAIN_USR1_LATER=$!
}

# shellcheck disable=SC2329  # invoked by train_on_usr1
train_end_reminder() {
    if [ -n "$TRAIN_USR1_LATER" ]; then
        kill "$TRAIN_USR1_LATER" 2>/dev/null || true
        TRAIN_USR1_LATER=
    fi
}

# shellcheck disable=SC2329  # invoked by train_on_usr1
train_pass_stop() {
    if [ "$STOP_VIA" = scancel ]; then
        # TERM to the step's tasks only (srun, and this shell, must not get it)
        scancel --signal=TERM "$TRAIN_SELF" 2>/dev/null || train_signal_step TERM
    else
        train_signal_step USR1
    fi
    train_overrun_guard
}

# shellcheck disable=SC2329  # invoked by the USR1 trap
train_on_usr1() {
    # Slurm may send the walltime signal up to a minute early, even as the chunk starts;
    # a program that has not yet set its handler (Python starting, imports; a node still
    # unpacking the image, where Apptainer's starter drops the signal) would die of it or
    # never see it. So until every rank of the step says it is ready (STEP_RANKS files,
    # see train_count_ready) and at most for the step's first STEP_GRACE seconds, the
    # signal is held and looked at again every second (the trainer's own time budget runs
    # meanwhile). Passed on at the grace with ranks missing, it is passed on again each
    # time one more rank says it is ready (that rank may have missed it; the others get
    # it twice), until all have.
    local now since ranks=${STEP_RANKS:-1}
    if [ "$STOP_SIGNAL" = none ]; then
        train_log "USR1 received; the job has no stop signal: not passed on"
        return 0
    fi
    printf -v now '%(%s)T' -1
    since=$((now - ${TRAIN_STEP_START:-$now}))
    train_count_ready
    if [ "$TRAIN_STOP_SENT" = 1 ]; then
        # a reminder after the stop was passed on
        # (a stop the program asked for has no count: nothing to pass on again)
        if [ "$STOP_MODE" != kill ] && [ -n "$TRAIN_READY_AT_STOP" ] && \
                [ "$TRAIN_RANKS_READY" -gt "$TRAIN_READY_AT_STOP" ]; then
            train_log "$TRAIN_RANKS_READY of $ranks ranks ready now ($TRAIN_READY_AT_STOP" \
                "when the stop was passed on): passing it on again for the late ones"
            TRAIN_READY_AT_STOP=$TRAIN_RANKS_READY
            train_pass_stop
        fi
        [ "$TRAIN_RANKS_READY" -lt "$ranks" ] || train_end_reminder
        return 0
    fi
    if [ -z "${TRAIN_STEP_START:-}" ] || \
            { [ "$TRAIN_RANKS_READY" -lt "$ranks" ] && [ "$since" -lt "$STEP_GRACE" ]; }; then
        if [ "$TRAIN_USR1_HELD" = 0 ]; then
            TRAIN_USR1_HELD=1
            train_log "walltime signal ${since}s after the step started: passing it on" \
                "when the program is ready (at most ${STEP_GRACE}s after its start;" \
                "$TRAIN_RANKS_READY of $ranks rank(s) ready now)"
            train_remind_usr1
        fi
        return 0
    fi
    TRAIN_USR1_HELD=0
    TRAIN_STOP_SENT=1
    TRAIN_READY_AT_STOP=$TRAIN_RANKS_READY
    if [ "$STOP_MODE" = kill ]; then
        train_end_reminder
        train_kill
        return 0
    fi
    train_log "walltime signal: asking the step to checkpoint and stop ($STOP_SIGNAL)"
    if [ "$TRAIN_RANKS_READY" -lt "$ranks" ]; then
        train_log "only $TRAIN_RANKS_READY of $ranks ranks are ready after ${since}s: passed" \
            "on again when a late one is"
        train_remind_usr1
    else
        train_end_reminder
    fi
    train_pass_stop
}

# shellcheck disable=SC2329  # invoked by train_on_usr1
train_kill() {
    # stop mode kill: the program has no handler and saves on its own; the chunk ends it
    # (TERM to the step's tasks, KILL to its steps after KILL_GRACE seconds) and the next
    # chunk continues from its last save
    train_log "walltime signal: ending the program (stop mode kill): TERM, then KILL" \
        "after ${KILL_GRACE}s"
    TRAIN_STOP_SENT=1
    TRAIN_KILLED=1
    printf -v TRAIN_KILL_AT '%(%s)T' -1
    scancel --signal=TERM "$TRAIN_SELF" 2>/dev/null || train_signal_step TERM
    # (forked in a trap handler: a TERM that comes before it resets the traps can run this
    # shell's EXIT trap in it, which removes TRAIN_TMP; it is ended with KILL)
    (
        trap - EXIT USR1 USR2 TERM
        sleep "$KILL_GRACE" 2>/dev/null
        train_log "the program is still running ${KILL_GRACE}s after the TERM: KILL"
        train_kill_steps
    ) >/dev/null &
    TRAIN_KILLER=$!
}

# shellcheck disable=SC2329  # invoked by train_kill's background process
train_kill_steps() {
    # KILL to the job's steps, never to the batch shell (`scancel --signal=KILL JOB` would
    # cancel the whole job): each numbered step by its id; srun itself where Slurm cannot
    # be asked. The job is TRAIN_SELF: an array task as ARRAY_TASK (the raw id of an
    # array's last task is the array's, whose steps are every task's)
    local steps step sent=0 self=${TRAIN_SELF:-${SLURM_JOB_ID:-0}}
    steps=$(train_slurm_cmd squeue --noheader --steps --jobs="$self" \
        --format=%i 2>/dev/null) || steps=
    for step in $steps; do
        case "$step" in *.[0-9]*)
            scancel --signal=KILL "$step" 2>/dev/null && sent=1 ;;
        esac
    done
    [ "$sent" = 1 ] || train_signal_step KILL
}

# shellcheck disable=SC2329  # invoked by the USR2 trap
train_on_stop_request() {
    # the program checkpointed and asked to end this chunk: TERM to the step's tasks
    # (never to srun or this shell), recorded as a checkpointed stop
    [ "$TRAIN_TERMINATING" = 0 ] && [ "$TRAIN_STOP_REQUESTED" = 0 ] || return 0
    train_log "the program asked to end this chunk after its checkpoint: stopping the step"
    TRAIN_STOP_REQUESTED=1
    TRAIN_STOP_SENT=1
    scancel --signal=TERM "$TRAIN_SELF" 2>/dev/null || train_signal_step TERM
}

# shellcheck disable=SC2329  # invoked by the TERM trap
train_on_term() {
    # Slurm sends TERM (KillWait seconds before KILL) to every process of the job at the
    # walltime, on scancel, on preemption and on requeue: the step's tasks get it from
    # Slurm and checkpoint (passing it on to srun would only make srun kill them). Record
    # which it was, and cancel the waiting chunk unless this job may come back (requeue
    # or preemption with requeue).
    local elapsed kind now
    [ "$TRAIN_REQUEUING" = 0 ] && [ "$TRAIN_TERMINATING" = 0 ] || return 0
    TRAIN_TERMINATING=1
    printf -v now '%(%s)T' -1
    elapsed=$((now - TRAIN_START))
    if [ "$elapsed" -ge $((WALLTIME_SECONDS - 15)) ]; then
        kind=$EV_TIMEOUT
        train_log "walltime reached after ${elapsed}s: the step did not stop in time"
    else
        kind=$EV_TERMINATED
        train_log "terminated by Slurm after ${elapsed}s (scancel, preemption or requeue)"
    fi
    train_event "$kind" "$elapsed"
    if [ "$REQUEUE_ALLOWED" = 0 ]; then
        train_cancel_rest
    fi
}

# shellcheck disable=SC2329  # invoked by the EXIT trap
train_on_exit() {
    # A sweep's array task: the log files Slurm opened for it beside the sweep's logs
    # (${!ARRAY_LOG_VAR}.out/.err; its output goes to its chain's own log) are removed
    # when nothing was written to them. (Its successors are no array tasks.)
    local f
    if [ -n "${SLURM_ARRAY_JOB_ID:-}" ] && [ -n "${ARRAY_LOG_VAR:-}" ] \
        && [ -n "${!ARRAY_LOG_VAR:-}" ]; then
        for f in "${!ARRAY_LOG_VAR}.out" "${!ARRAY_LOG_VAR}.err"; do
            if [ -f "$f" ] && [ ! -s "$f" ]; then
                rm -f "$f"
            fi
        done
    fi
    rm -rf "${TRAIN_TMP:-/nonexistent}"
    rm -f "$TRAIN_READY" "${TRAIN_STOP_REQUEST:-/nonexistent}"
    [ -z "${TRAIN_READY:-}" ] || rm -f "$TRAIN_READY$READY_RANK"*
    if [ -n "${TRAIN_WATCHER:-}" ]; then
        kill "$TRAIN_WATCHER" 2>/dev/null || true
    fi
    if [ -n "${TRAIN_USR1_LATER:-}" ]; then
        kill "$TRAIN_USR1_LATER" 2>/dev/null || true
    fi
    if [ -n "${TRAIN_KILLER:-}" ]; then
        kill -KILL "$TRAIN_KILLER" 2>/dev/null || true
    fi
}

train_wait_step() {
    # a trapped signal interrupts `wait`: wait again until the waiter is gone
    while :; do
        wait "$TRAIN_WAITER" 2>/dev/null || true
        kill -0 "$TRAIN_WAITER" 2>/dev/null || break
    done
    TRAIN_WAITER=
    STEP_RC=255  # no status: the waiter itself was killed
    if [ -s "$TRAIN_TMP/step.rc" ]; then
        read -r STEP_RC < "$TRAIN_TMP/step.rc"
    fi
}

train_step_ended() {
    # The step has ended. A walltime USR1 or a stop request's USR2 that comes now has
    # nothing left to stop, and must not end this shell (their default action would: 138
    # or 140, the chunk counted failed, its successor removed by Slurm): from here on both
    # are ignored, then the reminder and the watcher that send them are stopped.
    local pid
    trap '' USR1 USR2
    if [ -n "$TRAIN_KILLER" ]; then
        kill -KILL "$TRAIN_KILLER" 2>/dev/null || true
        wait "$TRAIN_KILLER" 2>/dev/null || true
    fi
    for pid in "$TRAIN_USR1_LATER" "$TRAIN_WATCHER"; do
        [ -n "$pid" ] || continue
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    TRAIN_USR1_LATER=
    TRAIN_WATCHER=
    TRAIN_KILLER=
    # a program that asked to end its chunk and exited before the watcher saw the request
    # (it looks once a second) has asked all the same: a stop, never "complete"
    if [ "$TRAIN_STOP_REQUESTED" = 0 ] && [ -e "${TRAIN_STOP_REQUEST:-/nonexistent}" ]; then
        train_log "the program asked to end this chunk after its checkpoint, and has ended"
        TRAIN_STOP_REQUESTED=1
        TRAIN_STOP_SENT=1
    fi
}
