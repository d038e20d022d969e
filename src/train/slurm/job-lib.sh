#!/usr/bin/env bash
# Host-side job library, inlined into the script `train render` writes, below its marker
# line. The renderer sets before it: RUN_DIR MAX_CHUNKS REQUEUE REQUEUE_ALLOWED
# COMPLETE_ON_SUCCESS WALLTIME_SECONDS STOP_SIGNAL STOP_MARGIN STOP_VIA STEP_GRACE STOP_MODE
# KILL_GRACE RUNTIME IMAGE, the arrays RESUME_ARGS and SAVE_PATHS, the function
# step_command (it sets the array STEP: the step's argv), and the contract's names
# (files COMPLETE_FILE PROGRESS_FILE IDS_FILE EVENTS_FILE LOG_DIR, the label
# DOCKER_JOB_LABEL, the step's READY_VAR, the event names EV_*), all defined once in
# train/slurm/contract.py.
# Logic that Python can hold stays in Python; this only does what must happen in the batch
# shell: the prologue, passing the walltime signal to the job step, extending the chain by
# one chunk, requeueing, recording what happened, and ending the chain (cancelling the
# waiting chunk) when it is done, failed or killed.
#
# Every chunk runs this same script; its chunk number is the script's first argument, the
# chain's first chunk its second (1 where it is left out: a resubmitted chain of a run
# whose last chunk stopped before any save continues the count).
# A chunk submits its successor when it starts, with afterok on itself and
# --kill-on-invalid-dep=yes (an #SBATCH line): whatever kills this chunk, Slurm itself
# removes the successor, even where the batch shell gets no chance to.

train_log() {
    # (printf's own clock: no command substitution in what the traps run)
    printf '%(%H:%M:%S)T train-job[%s]: %s\n' -1 "$CHUNK" "$*" >&2
}

train_event() {
    # one line per event in the chain's record: time chunk job event [detail]
    printf '%(%s)T %s %s %s\n' -1 "$CHUNK" "${SLURM_JOB_ID:-0}" "$*" \
        >> "$RUN_DIR/$EVENTS_FILE"
}

train_progress() {
    # the work done so far, "DONE TOTAL", as the trainer last recorded it ("0 0": none yet)
    local done_units=0 total=0
    if [ -r "$RUN_DIR/$PROGRESS_FILE" ]; then
        read -r done_units total _ < "$RUN_DIR/$PROGRESS_FILE" || true
    fi
    case "$done_units" in '' | *[!0-9]*) done_units=0 ;; esac
    case "$total" in '' | *[!0-9]*) total=0 ;; esac
    printf '%s %s\n' "$done_units" "$total"
}

train_prologue() {
    mkdir -p "$RUN_DIR/$LOG_DIR"
    printf -v TRAIN_START '%(%s)T' -1
    START_PROGRESS=$(train_progress)
    train_log "job ${SLURM_JOB_ID:-?} (restart ${SLURM_RESTART_COUNT:-0}) on" \
        "${SLURM_JOB_NODELIST:-?}, ${SLURM_JOB_NUM_NODES:-?} node(s);" \
        "chunk $CHUNK of at most $LAST_CHUNK"
    train_log "submit dir ${SLURM_SUBMIT_DIR:-?}, run dir $RUN_DIR"
    train_log "runtime $RUNTIME, image ${IMAGE:-none}; work done so far: $START_PROGRESS"
    train_event "$EV_STARTED" "${SLURM_RESTART_COUNT:-0} $START_PROGRESS"
}

train_gpu_report() {
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi >&2 || true
    else
        train_log "nvidia-smi not available on $(hostname)"
    fi
}

train_slurm_cmd() {
    # a Slurm command (sbatch, squeue) without this job's own SLURM_*/SBATCH_*/SQUEUE_*
    # variables (a nested sbatch would read or pass them on, squeue would filter by them);
    # SLURM_CONF stays so a site's non-default configuration is found
    (
        for v in $(compgen -v); do
            case "$v" in
                SLURM_CONF) ;;
                SLURM_* | SBATCH_* | SALLOC_* | SQUEUE_*) unset "$v" 2>/dev/null || true ;;
            esac
        done
        "$@"
    )
}

train_sbatch() {
    # (what chunk 1's sbatch in `train submit` leaves out too)
    train_slurm_cmd sbatch "$@"
}

train_find_successors() {
    # The ids of this user's queued jobs that wait on job $1 (afterok) and run this very
    # script (squeue's command: the batch script this chunk runs), one per line: a chunk's
    # successor is the only one. A job of the user's own that waits on the chunk (an
    # evaluation after it) runs another script and is never taken. Fails (with squeue's
    # message) when Slurm cannot be asked.
    local out id dep cmd
    out=$(train_slurm_cmd squeue --noheader --user="$(id -u)" --format='%i %E %o' 2>&1) ||
        { printf '%s' "$out"; return 1; }
    while read -r id dep cmd; do
        # "afterok:JOB(unfulfilled)", also "afterok:JOB_*(...)", among others after commas
        case ",$dep" in *,afterok:"$1"[!0-9]*) ;; *) continue ;; esac
        case "$cmd" in "$TRAIN_SCRIPT" | "$TRAIN_SCRIPT "*) printf '%s\n' "$id" ;; esac
    done <<< "$out"
    return 0
}

train_record_successor() {
    # $1: the next chunk's number, $2: its job id, $3: how it was found (log words)
    printf '%s %s\n' "$1" "$2" >> "$RUN_DIR/$IDS_FILE"
    train_log "chunk $1 $3 job $2 (runs after this one succeeds)"
    train_event "$EV_EXTENDED" "$2"
}

train_array_task() {
    # A sweep's chunk 1 runs as task SLURM_ARRAY_TASK_ID of its job array, recorded as
    # ARRAY_TASK until it starts; from then on its own job id names it (its events, its
    # log, its successor's afterok, what `train status` asks Slurm about). Slurm's own
    # commands (requeue, signals) name it ARRAY_TASK: TRAIN_SELF. (The raw id of an
    # array's last task is the array's: `scontrol requeue` of it requeues every task.)
    local ref="${SLURM_ARRAY_JOB_ID:-}_${SLURM_ARRAY_TASK_ID:-}" tmp
    TRAIN_SELF=${SLURM_JOB_ID:-0}
    [ -n "${SLURM_ARRAY_JOB_ID:-}" ] || return 0
    TRAIN_SELF=$ref
    [ -e "$RUN_DIR/$IDS_FILE" ] || return 0
    grep -q " ${ref}\$" "$RUN_DIR/$IDS_FILE" || return 0
    tmp="$RUN_DIR/.$IDS_FILE.${SLURM_JOB_ID:-0}"
    sed "s/ ${ref}\$/ ${SLURM_JOB_ID:-0}/" "$RUN_DIR/$IDS_FILE" > "$tmp" &&
        mv -f "$tmp" "$RUN_DIR/$IDS_FILE"
}

train_extend() {
    # submit the next chunk (once: a requeued or restarted chunk finds it recorded)
    local next=$((CHUNK + 1)) out id found
    [ "$REQUEUE" = 0 ] && [ "$TRAIN_TERMINATING" = 0 ] || return 0
    [ "$CHUNK" -lt "$LAST_CHUNK" ] || return 0
    if [ -e "$RUN_DIR/$IDS_FILE" ] && grep -q "^$next " "$RUN_DIR/$IDS_FILE"; then
        return 0
    fi
    # An earlier attempt of this job (or of its run before a restart) that sbatch
    # reported failed may have been accepted all the same (its reply lost: "Socket timed
    # out"). Its dependency on this job marks it: look for it before submitting again,
    # so that no second successor waits unseen by the chain.
    if [ "$TRAIN_EXTEND_TRIED" = 1 ] || [ "${SLURM_RESTART_COUNT:-0}" != 0 ]; then
        if ! found=$(train_find_successors "${SLURM_JOB_ID:-0}"); then
            [ "$TRAIN_TERMINATING" = 0 ] || return 1
            train_log "could not look for a chunk $next submitted before (so none is" \
                "submitted again): $found"
            train_event "$EV_EXTEND_FAILED" \
                "squeue: $(printf '%s' "$found" | tr '\n' ' ')"
            return 1
        fi
        if [ -n "$found" ]; then
            id=${found%%$'\n'*}
            if [ "$id" != "$found" ]; then  # (only where a look missed one: cancelled)
                # shellcheck disable=SC2086  # one id per line
                scancel ${found#*$'\n'} 2>/dev/null || true
            fi
            train_record_successor "$next" "$id" \
                "was submitted after all (sbatch's reply was lost) as"
            return 0
        fi
    fi
    TRAIN_EXTEND_TRIED=1
    if ! out=$(train_sbatch --parsable --dependency="afterok:${SLURM_JOB_ID:-0}" \
            "$TRAIN_SCRIPT" "$next" ${TRAIN_FIRST_ARG:+"$TRAIN_FIRST_ARG"} 2>&1); then
        [ "$TRAIN_TERMINATING" = 0 ] || return 1  # the TERM ended sbatch too
        train_log "could not submit chunk $next: $out"
        train_event "$EV_EXTEND_FAILED" "$(printf '%s' "$out" | tr '\n' ' ')"
        return 1
    fi
    id=${out%%;*}
    id=${id##*[!0-9]}
    if [ -z "$id" ]; then
        train_log "could not read a job id from sbatch: $out"
        train_event "$EV_EXTEND_FAILED" "no job id in: $(printf '%s' "$out" | tr '\n' ' ')"
        return 1
    fi
    train_record_successor "$next" "$id" "submitted as"
}

train_cancel_rest() {
    # cancel the chunks after this one (recorded in the ids file before they can run)
    # (builtins only: this runs in the TERM trap too)
    local chunk id ids=()
    [ -s "$RUN_DIR/$IDS_FILE" ] || return 0
    while read -r chunk id _; do
        case "$chunk$id" in '' | *[!0-9]*) continue ;; esac
        [ "$chunk" -gt "$CHUNK" ] && ids+=("$id")
    done < "$RUN_DIR/$IDS_FILE"
    if [ "${#ids[@]}" -gt 0 ]; then
        train_log "cancelling the waiting chunk(s): ${ids[*]}"
        scancel "${ids[@]}" 2>/dev/null || true
    fi
}

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

train_start_step() {
    # The step runs under a small waiter that records its exit status in a file: bash's
    # own `wait` loses a child's status when a trapped signal interrupts it just as the
    # child exits (seen as 138 or -1 for a step that exited 0). The waiter has no traps,
    # so its wait is never interrupted; signals go to the step itself (step.pid).
    TRAIN_TMP=$(mktemp -d "${TMPDIR:-/tmp}/train-job.XXXXXX")
    # what a save is newer than (train_last_save); a file's time comes from a clock that
    # ticks every few milliseconds: the step starts a tick later
    touch "$TRAIN_TMP/start"
    sleep 0.02 2>/dev/null || sleep 1
    TRAIN_READY="$RUN_DIR/.signal-ready-${SLURM_JOB_ID:-0}-${SLURM_RESTART_COUNT:-0}"
    rm -f "$TRAIN_READY"
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
    # chain's or an earlier one's), its arguments end with --resume-args
    # the renderer's step_command sets STEP (the per-node wrapper is known by then)
    step_command
    # shellcheck disable=SC2153  # STEP: set by step_command
    local step_argv=("${STEP[@]}")
    if [ -n "${RESUME_ARGS[*]+x}" ] && [ -e "$RUN_DIR/$SAVED_FILE" ]; then
        step_argv+=("${RESUME_ARGS[@]}")
        train_log "resuming after a checkpointed stop: the program's arguments end with" \
            "${RESUME_ARGS[*]}"
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

# shellcheck disable=SC2329  # invoked by the USR1 trap
train_on_usr1() {
    # Slurm may send the walltime signal up to a minute early, even as the chunk starts;
    # a program that has not yet set its handler (Python starting, imports) would die of
    # it. So until the program says it is ready (the file in $READY_VAR) and at most for
    # the step's first STEP_GRACE seconds, the signal is held and looked at again every
    # second (the trainer's own time budget runs meanwhile).
    local now since
    if [ "$STOP_SIGNAL" = none ]; then
        train_log "USR1 received; the job has no stop signal: not passed on"
        return 0
    fi
    printf -v now '%(%s)T' -1
    since=$((now - ${TRAIN_STEP_START:-$now}))
    if [ -z "${TRAIN_STEP_START:-}" ] || \
            { [ ! -e "$TRAIN_READY" ] && [ "$since" -lt "$STEP_GRACE" ]; }; then
        if [ "$TRAIN_USR1_HELD" = 0 ]; then
            TRAIN_USR1_HELD=1
            train_log "walltime signal ${since}s after the step started: passing it on" \
                "when the program is ready (at most ${STEP_GRACE}s after its start)"
            # one reminder a second until then, from one process started once (a
            # reminder started per signal can be lost: `kill -0` still finds the last
            # one as an unreaped zombie)
            (
                trap - EXIT  # (forked in a trap handler, as train_kill's is)
                i=0
                while [ "$i" -le "$((STEP_GRACE + 1))" ]; do
                    sleep 1
                    kill -USR1 "$$" 2>/dev/null || exit 0
                    i=$((i + 1))
                done
            ) >/dev/null 2>&1 &
            TRAIN_USR1_LATER=$!
        fi
        return 0
    fi
    TRAIN_USR1_HELD=0
    if [ -n "$TRAIN_USR1_LATER" ]; then
        kill "$TRAIN_USR1_LATER" 2>/dev/null || true
        TRAIN_USR1_LATER=
    fi
    [ "$TRAIN_STOP_SENT" = 0 ] || return 0  # the step was asked already (a reminder)
    if [ "$STOP_MODE" = kill ]; then
        train_kill
        return 0
    fi
    train_log "walltime signal: asking the step to checkpoint and stop ($STOP_SIGNAL)"
    TRAIN_STOP_SENT=1
    if [ "$STOP_VIA" = scancel ]; then
        # TERM to the step's tasks only (srun, and this shell, must not get it)
        scancel --signal=TERM "$TRAIN_SELF" 2>/dev/null || train_signal_step TERM
    else
        train_signal_step USR1
    fi
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
    # be asked
    local steps step sent=0
    steps=$(train_slurm_cmd squeue --noheader --steps --jobs="${SLURM_JOB_ID:-0}" \
        --format=%i 2>/dev/null) || steps=
    for step in $steps; do
        case "$step" in *.[0-9]*)
            scancel --signal=KILL "$step" 2>/dev/null && sent=1 ;;
        esac
    done
    [ "$sent" = 1 ] || train_signal_step KILL
}

train_last_save() {
    # The Unix time of the newest file saved since the chunk began: in the run folder
    # (but the chain's own files, SAVE_SKIP) or under a save path. Fails when there is none.
    local entry name skip x newest='' line
    local -a skips paths=()
    read -r -a skips <<< "$SAVE_SKIP"
    for entry in "$RUN_DIR"/* "$RUN_DIR"/.[!.]* "$RUN_DIR"/..?*; do
        [ -e "$entry" ] || [ -L "$entry" ] || continue
        name=${entry##*/}
        skip=0
        for x in "${skips[@]}"; do
            # shellcheck disable=SC2254  # the names are patterns
            case "$name" in $x) skip=1; break ;; esac
        done
        [ "$skip" = 1 ] || paths+=("$entry")
    done
    if [ -n "${SAVE_PATHS[*]+x}" ]; then
        for entry in "${SAVE_PATHS[@]}"; do
            [ -e "$entry" ] && paths+=("$entry")
        done
    fi
    [ "${#paths[@]}" -gt 0 ] || return 1
    while read -r line; do
        line=${line%%.*}
        if [ -z "$newest" ] || [ "$line" -gt "$newest" ]; then newest=$line; fi
    done < <(find "${paths[@]}" -type f -newer "$TRAIN_TMP/start" -printf '%T@\n' \
        2>/dev/null || true)
    [ -n "$newest" ] || return 1
    printf '%s\n' "$newest"
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
    rm -rf "${TRAIN_TMP:-/nonexistent}"
    rm -f "$TRAIN_READY" "${TRAIN_STOP_REQUEST:-/nonexistent}"
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

train_main() {
    CHUNK=${1-1}
    TRAIN_FIRST_ARG=${2-}
    case "$CHUNK ${TRAIN_FIRST_ARG:-1}" in *[!0-9\ ]* | ' '* | '0 '* | *' 0')
        echo "train-job: the chunk number (first argument) and the chain's first chunk" \
            "(second, optional) must be positive integers, got '$CHUNK' '$TRAIN_FIRST_ARG'" >&2
        exit 2 ;;
    esac
    # the chain's own bound: MAX_CHUNKS chunks from its first
    LAST_CHUNK=$((${TRAIN_FIRST_ARG:-1} + MAX_CHUNKS - 1))
    STOP_MODE=${STOP_MODE:-signal}
    KILL_GRACE=${KILL_GRACE:-10}
    TRAIN_SCRIPT=${TRAIN_SCRIPT:-$0}
    TRAIN_TERMINATING=0
    TRAIN_REQUEUING=0
    TRAIN_WAITER=
    TRAIN_TMP=
    TRAIN_STEP_START=
    TRAIN_READY=/nonexistent
    TRAIN_USR1_HELD=0
    TRAIN_USR1_LATER=
    TRAIN_STOP_SENT=0
    TRAIN_STOP_REQUESTED=0
    TRAIN_WATCHER=
    TRAIN_EXTEND_TRIED=0
    TRAIN_KILLED=0
    TRAIN_KILL_AT=
    TRAIN_KILLER=
    trap train_on_exit EXIT
    trap train_on_stop_request USR2
    trap train_on_usr1 USR1
    trap train_on_term TERM
    train_array_task
    train_prologue
    train_start_step
    train_extend || true  # while the step starts up
    if [ "$TRAIN_TERMINATING" = 1 ] && [ "$REQUEUE_ALLOWED" = 0 ]; then
        train_cancel_rest  # the TERM came while the successor was being submitted
    fi
    train_wait_step
    train_step_ended
    local rc=$STEP_RC progress last_save saved
    if [ "$TRAIN_TERMINATING" = 1 ]; then
        train_log "training step ended with exit code $rc after the TERM"
        train_runtime_cleanup
        exit 143
    fi
    if [ "$rc" = 143 ] && [ "$TRAIN_STOP_REQUESTED" = 1 ]; then
        # the TERM it asked for ended a program without a TERM handler: its checkpoint
        # was written before it asked
        train_log "the step ended of the TERM that the program asked for: a stop"
        rc=0
    fi
    if [ "$TRAIN_KILLED" = 1 ]; then
        # whatever it ended with (143 of the TERM, 137 of the KILL, or 0): the tool's stop
        train_log "the step ended (exit code $rc) after the tool ended it (stop mode kill)"
        train_runtime_cleanup
        rc=0
    fi
    if [ "$rc" -ne 0 ]; then
        train_log "training step failed with exit code $rc"
        if [ "$TRAIN_STOP_SENT" = 1 ] && { [ "$rc" = 138 ] || [ "$rc" = 143 ]; }; then
            train_log "the program died of the stop signal $STOP_SIGNAL: it needs a" \
                "handler (checkpoint, exit 0), or submit with --stop-signal none"
        fi
        train_gpu_report
        train_runtime_cleanup
        train_event "$EV_FAILED" "$rc"
        train_cancel_rest
        exit "$rc"
    fi
    if [ "$COMPLETE_ON_SUCCESS" = 1 ] && [ "$TRAIN_STOP_SENT" = 0 ]; then
        # a program that ends with 0 before it is asked to stop has done its work
        touch "$RUN_DIR/$COMPLETE_FILE"
    fi
    progress=$(train_progress)
    if [ -e "$RUN_DIR/$COMPLETE_FILE" ]; then
        train_log "run complete"
        train_event "$EV_COMPLETE" "$progress"
        train_cancel_rest
        exit 0
    fi
    # (a program that never writes progress is not judged by it)
    if { [ "$COMPLETE_ON_SUCCESS" = 0 ] || [ -e "$RUN_DIR/$PROGRESS_FILE" ]; } && \
            [ "${progress%% *}" -le "${START_PROGRESS%% *}" ]; then
        train_log "no work was added in this chunk ($START_PROGRESS -> $progress): the" \
            "chain stops here; see the step's log"
        train_event "$EV_NO_PROGRESS" "$progress"
        train_cancel_rest
        exit 0
    fi
    # a stop counts as checkpointed only when something was saved since the chunk began
    if [ "$progress" != "$START_PROGRESS" ]; then
        printf -v last_save '%(%s)T' -1  # (where no file of it is newer: the progress)
        if saved=$(train_last_save); then last_save=$saved; fi
    elif ! last_save=$(train_last_save); then
        train_log "$UNSAVED_TEXT: the progress file, the run folder" \
            "${SAVE_PATHS[*]+and ${SAVE_PATHS[*]} }show nothing saved since this chunk" \
            "began; the chain stops here. Submit the same job again (with a longer --time" \
            "if the program saves too late for it): the chain goes on at chunk $((CHUNK + 1))"
        train_event "$EV_UNSAVED" "$progress"
        train_cancel_rest
        exit 0
    fi
    if [ "$TRAIN_KILLED" = 1 ] && [ -n "$last_save" ]; then
        train_log "the work since the program's last save is redone by the next chunk:" \
            "$((TRAIN_KILL_AT > last_save ? TRAIN_KILL_AT - last_save : 0))s (last save" \
            "$(printf '%(%H:%M:%S)T' "$last_save"), stopped $(printf '%(%H:%M:%S)T' \
            "$TRAIN_KILL_AT"))"
    fi
    printf '%s %s %s\n' "$CHUNK" "${SLURM_JOB_ID:-0}" "$last_save" > "$RUN_DIR/$SAVED_FILE"
    if [ "$REQUEUE" = 1 ]; then
        if [ $((${SLURM_RESTART_COUNT:-0} + 1)) -lt "$MAX_CHUNKS" ]; then
            train_log "checkpoint written ($progress); requeueing job $SLURM_JOB_ID"
            train_event "$EV_REQUEUED" "$progress"
            TRAIN_REQUEUING=1
            scontrol requeue "$TRAIN_SELF"
            exit 0
        fi
        train_log "bound of $MAX_CHUNKS runs reached before the work ($progress)"
        train_event "$EV_INCOMPLETE" "$progress"
        exit 0
    fi
    if [ "$CHUNK" -ge "$LAST_CHUNK" ]; then
        train_log "bound of $MAX_CHUNKS chunks reached before the work ($progress):" \
            "submit again with a larger --max-chunks to continue"
        train_event "$EV_INCOMPLETE" "$progress"
        exit 0
    fi
    if ! train_extend; then
        train_event "$EV_INCOMPLETE" "$progress"
        exit 0
    fi
    train_log "checkpointed stop ($progress); the next chunk continues"
    train_event "$EV_STOPPED" "$progress"
    exit 0
}
