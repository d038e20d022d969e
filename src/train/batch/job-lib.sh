#!/usr/bin/env bash
# shellcheck disable=SC2034  # (alone: job-lib-step.sh reads what this sets; render checks both as one)
# Host-side job library, inlined into the script `train render` writes, below its marker
# line. The renderer sets before it: RUN_DIR MAX_CHUNKS REQUEUE REQUEUE_ALLOWED
# COMPLETE_ON_SUCCESS WALLTIME_SECONDS STOP_SIGNAL STOP_MARGIN STOP_VIA STEP_GRACE STOP_MODE
# KILL_GRACE RUNTIME IMAGE, the arrays RESUME_ARGS and SAVE_PATHS, the function
# step_command (it sets the array STEP: the step's argv), and the contract's names
# (files COMPLETE_FILE PROGRESS_FILE IDS_FILE EVENTS_FILE LOG_DIR, the label
# DOCKER_JOB_LABEL, the step's READY_VAR, the event names EV_*), all defined once in
# train/batch/contract.py.
# Logic that Python can hold stays in Python; this only does what must happen in the batch
# shell: the prologue, passing the walltime signal to the job step, extending the chain by
# one chunk, requeueing, recording what happened, and ending the chain (cancelling the
# waiting chunk) when it is done, failed or killed. This file holds the chain (events,
# ids, extending, cancelling, train_main and its steps); job-lib-step.sh, inlined after
# it, the job step (starting, signalling, ending and waiting for it); job-lib-resume.sh,
# last, the resume arguments, progress read from a framework's saves, and overruns.
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
    # The work done so far, "DONE TOTAL": as the program last recorded it in the progress
    # file, else as its saves show it (job-lib-resume.sh). Where neither says: "0 0", and
    # the function fails.
    local done_units=0 total=0
    # (a regular file: a FIFO would hold the chain here; one line of 256 at most is read)
    if [ -f "$RUN_DIR/$PROGRESS_FILE" ] && [ -r "$RUN_DIR/$PROGRESS_FILE" ]; then
        read -r -n 256 done_units total _ < "$RUN_DIR/$PROGRESS_FILE" || true
        # (integers bash can compare: 18 digits at most)
        case "$done_units" in '' | *[!0-9]* | ???????????????????*) done_units=0 ;; esac
        case "$total" in '' | *[!0-9]* | ???????????????????*) total=0 ;; esac
        printf '%s %s\n' "$((10#$done_units))" "$((10#$total))"  # (09: nine, not octal)
        return 0
    fi
    train_framework_progress && return 0
    printf '0 0\n'
    return 1
}

train_prologue() {
    mkdir -p "$RUN_DIR/$LOG_DIR"
    printf -v TRAIN_START '%(%s)T' -1
    START_KNOWN=1
    START_PROGRESS=$(train_progress) || START_KNOWN=0
    train_log "job ${SLURM_JOB_ID:-?} (restart ${SLURM_RESTART_COUNT:-0}) on" \
        "${SLURM_JOB_NODELIST:-?}, ${SLURM_JOB_NUM_NODES:-?} node(s);" \
        "chunk $CHUNK of at most $LAST_CHUNK"
    train_log "submit dir ${SLURM_SUBMIT_DIR:-?}, run dir $RUN_DIR"
    train_log "runtime $RUNTIME, image ${IMAGE:-none}; work done so far:" \
        "$(train_progress_words "$START_PROGRESS" "$START_KNOWN")"
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

train_last_save() {
    # The Unix time of the newest file saved since the chunk began: in the run folder
    # (but the chain's own files, SAVE_SKIP) or under a save path. Fails when there is none.
    # A save path that holds run folders (`--save-path .`) is looked through without them
    # (the tool's own files change in every chunk) and without Python's __pycache__.
    local entry name skip x newest='' line
    local -a skips paths=() runs=() files=()
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
            # (one inside the run folder was looked at above, without the chain's files)
            case "$entry/" in "$RUN_DIR"/*) continue ;; esac
            [ -e "$entry" ] && paths+=("$entry")
        done
    fi
    [ "${#paths[@]}" -gt 0 ] || return 1
    local -a records=()
    read -r -a x <<< "$RUN_RECORDS"
    for name in "${x[@]}"; do records+=(-o -name "$name"); done
    # "R FOLDER": a folder holding a run's record; "F TIME PATH": a file newer than the start
    while IFS= read -r -d '' line; do
        case "$line" in
            'R '*) runs+=("${line#R }/") ;;
            'F '*) files+=("${line#F }") ;;
        esac
    done < <(find "${paths[@]}" \( -path "$RUN_DIR" -o -name __pycache__ \) -prune -o \
        -type f \( \( -false "${records[@]}" \) -printf 'R %h\0' -o \
        -newer "$TRAIN_TMP/start" -printf 'F %T@ %p\0' \) 2>/dev/null || true)
    for line in ${files[@]+"${files[@]}"}; do
        for entry in ${runs[@]+"${runs[@]}"}; do
            case "${line#* }" in "$entry"*) continue 2 ;; esac
        done
        line=${line%% *}
        line=${line%%.*}
        if [ -z "$newest" ] || [ "$line" -gt "$newest" ]; then newest=$line; fi
    done
    [ -n "$newest" ] || return 1
    printf '%s\n' "$newest"
}

train_setup() {
    # the chunk's arguments and the chain's bound; the shell's state; the traps
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
    STEP_NODE=
    TRAIN_STEP_START=
    TRAIN_READY=/nonexistent
    TRAIN_USR1_HELD=0
    TRAIN_USR1_LATER=
    TRAIN_STOP_SENT=0
    TRAIN_READY_AT_STOP=  # ranks ready when the walltime stop was passed on
    TRAIN_RANKS_READY=0
    TRAIN_STOP_REQUESTED=0
    TRAIN_WATCHER=
    TRAIN_EXTEND_TRIED=0
    TRAIN_KILLED=0
    TRAIN_KILL_AT=
    TRAIN_KILLER=
    TRAIN_KNOWN=0
    TRAIN_OVERRAN=0
    OVERRUN_RESERVE=${OVERRUN_RESERVE:-10}
    PROGRAM_DIR=${PROGRAM_DIR:-$PWD}
    trap train_on_exit EXIT
    trap train_on_stop_request USR2
    trap train_on_usr1 USR1
    trap train_on_term TERM
}

train_step_status() {
    # How the step ended (STEP_RC): after the TERM the chunk ends with 143, and a failure
    # ends the chain with the step's code; the stops the tool made count as 0.
    if [ "$TRAIN_TERMINATING" = 1 ]; then
        train_log "training step ended with exit code $STEP_RC after the TERM"
        train_runtime_cleanup
        exit 143
    fi
    if [ "$STEP_RC" = 143 ] && [ "$TRAIN_STOP_REQUESTED" = 1 ]; then
        # the TERM it asked for ended a program without a TERM handler: its checkpoint
        # was written before it asked
        train_log "the step ended of the TERM that the program asked for: a stop"
        STEP_RC=0
    fi
    if [ "$TRAIN_KILLED" = 1 ]; then
        # whatever it ended with (143 of the TERM, 137 of the KILL, or 0): the tool's stop
        train_log "the step ended (exit code $STEP_RC) after the tool ended it (stop mode" \
            "kill)"
        train_runtime_cleanup
        STEP_RC=0
    fi
    if [ -e "$TRAIN_TMP/overran" ]; then
        train_overran  # (goes on, STEP_RC 0, or ends the chain)
    fi
    if [ "$STEP_RC" -ne 0 ]; then
        local step_rc=$STEP_RC where=''
        train_first_failure
        [ -z "$STEP_NODE" ] || where=" on node $STEP_NODE"
        [ "$STEP_RC" = "$step_rc" ] || where+=" (srun's: $step_rc)"
        train_log "training step failed with exit code $STEP_RC$where"
        if [ "$TRAIN_STOP_SENT" = 1 ] && { [ "$STEP_RC" = 138 ] || [ "$STEP_RC" = 143 ]; }; then
            train_log "the program died of the stop signal $STOP_SIGNAL: it needs a" \
                "handler (checkpoint, exit 0), or submit with --stop-signal none"
        fi
        train_gpu_report
        train_runtime_cleanup
        train_event "$EV_FAILED" "$STEP_RC${STEP_NODE:+ $STEP_NODE}"
        train_cancel_rest
        exit "$STEP_RC"
    fi
}

train_end_if_done() {
    # the chain ends here when the work is complete, or when this chunk added none
    local progress=$1
    if [ -e "$RUN_DIR/$COMPLETE_FILE" ]; then
        train_log "run complete"
        train_event "$EV_COMPLETE" "$progress"
        train_cancel_rest
        exit 0
    fi
    # (a program whose progress the tool cannot read is not judged by it; nor a chunk
    # that ran into its walltime: it goes on from the save before, a bounded number of times)
    if { [ "$COMPLETE_ON_SUCCESS" = 0 ] || [ "$TRAIN_KNOWN" = 1 ]; } && \
            [ "$TRAIN_OVERRAN" = 0 ] && [ "${progress%% *}" -le "${START_PROGRESS%% *}" ]; then
        train_log "the program made no progress in this chunk (work done $START_PROGRESS" \
            "at its start, $progress now): it started over from zero or did no work; the" \
            "chain stops here. $(train_resume_hint); see the step's log"
        train_event "$EV_NO_PROGRESS" "$progress"
        train_cancel_rest
        exit 0
    fi
}

train_saved_at() {
    # When the chunk last saved (TRAIN_LAST_SAVE). A stop counts as checkpointed only when
    # something was saved since the chunk began: the chain ends here where nothing was.
    local progress=$1 saved why
    if ! why=$(train_placeholders_match); then
        train_log "$UNSAVED_TEXT the next chunk can go on from: $why; the chain stops here"
        train_event "$EV_UNSAVED" "$progress"
        train_cancel_rest
        exit 0
    fi
    if [ "$TRAIN_OVERRAN" = 1 ] && ! train_last_save >/dev/null; then
        TRAIN_LAST_SAVE=''
        if [ -f "$RUN_DIR/$SAVED_FILE" ]; then  # the one before
            read -r -n 256 _ _ TRAIN_LAST_SAVE _ < "$RUN_DIR/$SAVED_FILE" || true
        fi
        case "$TRAIN_LAST_SAVE" in '' | *[!0-9]*) printf -v TRAIN_LAST_SAVE '%(%s)T' -1 ;; esac
    elif [ "$progress" != "$START_PROGRESS" ]; then
        printf -v TRAIN_LAST_SAVE '%(%s)T' -1  # (where no file of it is newer: the progress)
        if saved=$(train_last_save); then TRAIN_LAST_SAVE=$saved; fi
    elif ! TRAIN_LAST_SAVE=$(train_last_save); then
        train_log "$UNSAVED_TEXT: the progress file, the run folder" \
            "${SAVE_PATHS[*]+and ${SAVE_PATHS[*]} }show nothing saved since this chunk" \
            "began; the chain stops here. Submit the same job again (with a longer --time" \
            "if the program saves too late for it): the chain goes on at chunk $((CHUNK + 1))"
        train_event "$EV_UNSAVED" "$progress"
        train_cancel_rest
        exit 0
    fi
}

train_continue() {
    # a checkpointed stop: requeue this job, or let the next chunk go on, within the bound
    local progress=$1 words
    words=$(train_progress_words "$progress" "$TRAIN_KNOWN")
    if [ "$REQUEUE" = 1 ]; then
        if [ $((${SLURM_RESTART_COUNT:-0} + 1)) -lt "$MAX_CHUNKS" ]; then
            train_log "checkpoint written ($words); requeueing job $SLURM_JOB_ID"
            train_event "$EV_REQUEUED" "$progress"
            TRAIN_REQUEUING=1
            scontrol requeue "$TRAIN_SELF"
            exit 0
        fi
        train_log "bound of $MAX_CHUNKS runs reached before the work was done ($words)"
        train_event "$EV_INCOMPLETE" "$progress"
        exit 0
    fi
    if [ "$CHUNK" -ge "$LAST_CHUNK" ]; then
        train_log "bound of $MAX_CHUNKS chunks reached before the work was done ($words):" \
            "submit again with a larger --max-chunks to continue"
        train_event "$EV_INCOMPLETE" "$progress"
        exit 0
    fi
    if ! train_extend; then
        train_event "$EV_INCOMPLETE" "$progress"
        exit 0
    fi
    if [ "$TRAIN_KNOWN" = 1 ]; then
        train_log "checkpointed stop ($words); the next chunk goes on from it"
    else
        train_log "stopped after a save ($words); the next chunk starts:" \
            "$(train_resume_hint next)"
    fi
    train_event "$EV_STOPPED" "$progress"
    exit 0
}

train_after_step() {
    # what the step's end means for the chain: failed, complete, no progress, unsaved,
    # requeued, incomplete at its bound, or stopped with the next chunk to go on
    local progress
    train_step_status
    if [ "$COMPLETE_ON_SUCCESS" = 1 ] && [ "$TRAIN_STOP_SENT" = 0 ]; then
        # a program that ends with 0 before it is asked to stop has done its work
        touch "$RUN_DIR/$COMPLETE_FILE"
    fi
    TRAIN_KNOWN=1
    progress=$(train_progress) || TRAIN_KNOWN=0
    train_end_if_done "$progress"
    train_saved_at "$progress"
    if [ "$TRAIN_KILLED" = 1 ] && [ -n "$TRAIN_LAST_SAVE" ]; then
        train_log "the work since the program's last save is redone by the next chunk:" \
            "$((TRAIN_KILL_AT > TRAIN_LAST_SAVE ? TRAIN_KILL_AT - TRAIN_LAST_SAVE : 0))s" \
            "(last save $(printf '%(%H:%M:%S)T' "$TRAIN_LAST_SAVE"), stopped" \
            "$(printf '%(%H:%M:%S)T' "$TRAIN_KILL_AT"))"
    fi
    printf '%s %s %s\n' "$CHUNK" "${SLURM_JOB_ID:-0}" "$TRAIN_LAST_SAVE" \
        > "$RUN_DIR/$SAVED_FILE"
    train_continue "$progress"
}

train_main() {
    train_setup "$@"
    train_array_task
    train_prologue
    train_start_step
    train_extend || true  # while the step starts up
    if [ "$TRAIN_TERMINATING" = 1 ] && [ "$REQUEUE_ALLOWED" = 0 ]; then
        train_cancel_rest  # the TERM came while the successor was being submitted
    fi
    train_wait_step
    train_step_ended
    train_after_step
}
