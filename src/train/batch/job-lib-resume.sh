#!/usr/bin/env bash
# shellcheck disable=SC2034,SC2329  # (alone: job-lib.sh sets and calls; render checks all as one)
# The job library's resume side: --resume-args with their {newest:GLOB} placeholders
# expanded at the chunk's start, the progress a framework leaves in its saves (Hugging
# Face's trainer_state.json, Lightning's epoch=E-step=S.ckpt) where the program writes no
# progress file, and a chunk that ran into its walltime after the stop signal. Inlined
# after job-lib-step.sh; the names it uses are set there (see job-lib.sh), and
# PROGRAM_DIR, the folder the program runs in, that a relative GLOB is from.
# Nothing of the user's is evaluated: a pattern is only globbed (IFS empty, no split), a
# match is only ever one array item.

train_name_number() {
    # the step in a save's name $1 (step=S, else the last number in it): TRAIN_NUMBER;
    # fails where the name has none (or one too long to compare)
    local digits
    if [[ $1 =~ step=([0-9]+) ]] || [[ $1 =~ ([0-9]+)[^0-9]*$ ]]; then
        digits=${BASH_REMATCH[1]}
        digits=${digits#"${digits%%[!0]*}"}
        [ "${#digits}" -le 18 ] || return 1
        TRAIN_NUMBER=$((10#${digits:-0}))
        return 0
    fi
    return 1
}

train_newest() {
    # The newest path matching the glob $1 (from the current folder): TRAIN_NEWEST. Newest
    # by the number in the name where every match has one, else by modification time;
    # where some matches are folders holding trainer_state.json (the file the Trainer
    # writes last into a checkpoint), a folder without it (a save cut short) is passed over.
    # Fails where nothing matches.
    local pattern=$1 m name best='' best_n=-1 numbered=1 intact=0
    local -a matches=() kept=()
    local IFS=''
    shopt -s nullglob
    # shellcheck disable=SC2206  # the pattern is globbed on purpose, never split (IFS '')
    matches=($pattern)
    shopt -u nullglob
    for m in "${matches[@]}"; do
        [ -e "$m" ] || continue
        kept+=("$m")
        if [ -f "$m/trainer_state.json" ]; then intact=1; fi
    done
    [ "${#kept[@]}" -gt 0 ] || return 1
    matches=()
    for m in "${kept[@]}"; do
        if [ "$intact" = 1 ] && [ ! -f "$m/trainer_state.json" ]; then continue; fi
        matches+=("$m")
        name=${m%/}
        train_name_number "${name##*/}" || numbered=0
    done
    for m in "${matches[@]}"; do
        name=${m%/}
        if [ "$numbered" = 1 ]; then
            train_name_number "${name##*/}"
            if [ "$TRAIN_NUMBER" -gt "$best_n" ] || \
                    { [ "$TRAIN_NUMBER" = "$best_n" ] && [ "$m" -nt "$best" ]; }; then
                best=$m best_n=$TRAIN_NUMBER
            fi
        elif [ -z "$best" ] || [ "$m" -nt "$best" ]; then
            best=$m
        fi
    done
    TRAIN_NEWEST=$best
}

train_resume_words() {
    # (in a subshell: it changes folder) the resume arguments with every {newest:GLOB}
    # replaced, each ended by NUL, after a first record: "ok", or why there are none
    local word out rest pattern
    local -a words=()
    cd "$PROGRAM_DIR" 2>/dev/null || { printf 'cannot enter %s\0' "$PROGRAM_DIR"; return 0; }
    for word in "${RESUME_ARGS[@]}"; do
        out=''
        while [[ $word == *"{newest:"*"}"* ]]; do
            out+=${word%%"{newest:"*}
            rest=${word#*"{newest:"}
            pattern=${rest%%\}*}
            word=${rest#*\}}
            if ! train_newest "$pattern"; then
                printf 'nothing matches %s (in %s)\0' "$pattern" "$PROGRAM_DIR"
                return 0
            fi
            out+=$TRAIN_NEWEST
        done
        words+=("$out$word")
    done
    printf 'ok\0'
    printf '%s\0' "${words[@]}"
}

train_resume_argv() {
    # After a checkpointed stop of the run: the job's --resume-args, expanded, in the array
    # TRAIN_RESUME_ARGV. Fails where there are none: a fresh run, no --resume-args, or a
    # {newest:GLOB} that matches nothing yet (the arguments are then left out whole).
    local -a got=()
    TRAIN_RESUME_ARGV=()
    [ -n "${RESUME_ARGS[*]+x}" ] && [ -e "$RUN_DIR/$SAVED_FILE" ] || return 1
    mapfile -d '' -t got < <(train_resume_words)
    if [ "${got[0]:-}" != ok ]; then
        train_log "after a checkpointed stop, yet the resume arguments are left out:" \
            "${got[0]:-they could not be expanded}"
        return 1
    fi
    TRAIN_RESUME_ARGV=("${got[@]:1}")
    train_log "resuming after a checkpointed stop: the program's arguments end with" \
        "${TRAIN_RESUME_ARGV[*]}"
}

train_state_progress() {
    # "DONE TOTAL" of a Trainer's trainer_state.json $1 (global_step, max_steps; written by
    # json.dump with indent=2, top-level keys two spaces in); fails on anything else
    local key value done_units='' total=0 size
    [ -f "$1" ] && [ ! -L "$1" ] || return 1
    size=$(stat -c %s -- "$1" 2>/dev/null) || return 1
    [ "$size" -le 268435456 ] || return 1  # 256 MiB: a log_history beyond reason
    while IFS=': ,' read -r key value _; do
        case "$value" in '' | *[!0-9]* | ???????????????????*) continue ;; esac
        case "$key" in
            '"global_step"') done_units=$((10#$value)) ;;
            '"max_steps"') total=$((10#$value)) ;;
        esac
    done < <(grep -m 2 -E '^  "(global_step|max_steps)": [0-9]+' -- "$1" 2>/dev/null)
    [ -n "$done_units" ] || return 1
    printf '%s %s\n' "$done_units" "$total"
}

train_save_progress() {
    # "DONE TOTAL" of one save $1: a Trainer checkpoint (or output) folder, or a file named
    # with its step (Lightning's epoch=E-step=S.ckpt: TOTAL 0, unknown); fails on others
    local name=${1%/}
    if [ -d "$1" ]; then
        train_state_progress "$1/trainer_state.json"
        return
    fi
    name=${name##*/}
    [[ $name == *step=[0-9]* ]] && train_name_number "$name" || return 1
    printf '%s 0\n' "$TRAIN_NUMBER"
}

train_framework_progress() {
    # (in a subshell: it changes folder) the furthest "DONE TOTAL" the program's saves
    # show: the newest match of each {newest:GLOB} of --resume-args, and of each
    # --save-path the path itself, its newest checkpoint-N folder and its newest
    # *step=S*.ckpt file; fails where none shows any
    local word rest path got best=''
    local -a saves=()
    if cd "$PROGRAM_DIR" 2>/dev/null; then
        for word in ${RESUME_ARGS[@]+"${RESUME_ARGS[@]}"}; do
            while [[ $word == *"{newest:"*"}"* ]]; do
                rest=${word#*"{newest:"}
                word=${rest#*\}}
                if train_newest "${rest%%\}*}"; then
                    [[ $TRAIN_NEWEST == /* ]] || TRAIN_NEWEST=$PWD/$TRAIN_NEWEST
                    saves+=("$TRAIN_NEWEST")
                fi
            done
        done
    fi
    for path in ${SAVE_PATHS[@]+"${SAVE_PATHS[@]}"}; do
        saves+=("$path")
        if [ ! -d "$path" ] || ! cd "$path" 2>/dev/null; then continue; fi
        if train_newest 'checkpoint-*'; then saves+=("$path/$TRAIN_NEWEST"); fi
        if train_newest '*step=*.ckpt'; then saves+=("$path/$TRAIN_NEWEST"); fi
    done
    for path in ${saves[@]+"${saves[@]}"}; do
        got=$(train_save_progress "$path") || continue
        if [ -z "$best" ] || [ "${got%% *}" -gt "${best%% *}" ]; then best=$got; fi
    done
    [ -n "$best" ] || return 1
    printf '%s\n' "$best"
}

train_progress_words() {
    # the progress "DONE TOTAL" $1 in words, where $2 (1: known) says the tool could read it
    local done_units=${1%% *} total=${1##* }
    if [ "${2:-0}" != 1 ]; then
        printf 'progress not known: no progress file, and no save of the program names its step'
    elif [ "$total" -gt 0 ]; then
        printf 'at %s/%s' "$done_units" "$total"
    else
        printf 'at step %s' "$done_units"
    fi
}

train_overruns() {
    # how many chunks of this chain (the jobs of its ids file) ran into their walltime
    # after the stop signal and went on
    local -A mine=()
    local chunk id n=0 j ev
    [ -s "$RUN_DIR/$IDS_FILE" ] && [ -s "$RUN_DIR/$EVENTS_FILE" ] || { echo 0; return 0; }
    while read -r chunk id _; do
        [ -n "$id" ] && mine[$id]=1
    done < "$RUN_DIR/$IDS_FILE"
    while read -r _ chunk j ev _; do
        if [ "$ev" = "$EV_OVERRAN" ] && [ -n "$j" ] && [ -n "${mine[$j]+x}" ]; then
            n=$((n + 1))
        fi
    done < <(grep -F " $EV_OVERRAN" -- "$RUN_DIR/$EVENTS_FILE" 2>/dev/null || true)
    echo "$n"
}

# shellcheck disable=SC2329  # invoked by train_on_usr1
train_overrun_guard() {
    # Stop mode signal, once the stop signal is sent: a step still running KILL_GRACE +
    # OVERRUN_RESERVE seconds before the walltime is ended by the tool (TERM, then KILL
    # after KILL_GRACE), so that the chunk ends before Slurm's TIMEOUT (which would fail its
    # successor's afterok) and the chain can go on from an earlier save (train_overran).
    # Only where the margin leaves the program time to stop first; looks at the clock
    # every second (ended with KILL, it leaves no long sleep behind).
    local at=$((TRAIN_START + WALLTIME_SECONDS - KILL_GRACE - OVERRUN_RESERVE)) now
    [ "$STOP_MARGIN" -gt $((KILL_GRACE + OVERRUN_RESERVE)) ] || return 0
    # (one guard a step: the stop is passed on again when a late rank says it is ready)
    [ -z "${TRAIN_KILLER:-}" ] || return 0
    (
        trap - EXIT USR1 USR2 TERM
        while printf -v now '%(%s)T' -1 && [ "$now" -lt "$at" ]; do sleep 1; done
        : > "$TRAIN_TMP/overran"
        train_log "the step has not stopped after the stop signal, and the walltime is" \
            "near: ending it (TERM, then KILL after ${KILL_GRACE}s)"
        scancel --signal=TERM "$TRAIN_SELF" 2>/dev/null || train_signal_step TERM
        sleep "$KILL_GRACE" 2>/dev/null
        train_kill_steps
    ) >/dev/null &
    TRAIN_KILLER=$!
}

train_placeholders_match() {
    # every {newest:GLOB} of --resume-args matches (where there are any); else says which
    # does not, and fails
    local -a got=()
    [[ "${RESUME_ARGS[*]+${RESUME_ARGS[*]}}" == *"{newest:"* ]] || return 0
    mapfile -d '' -t got < <(train_resume_words)
    [ "${got[0]:-}" = ok ] && return 0
    printf '%s\n' "${got[0]:-the resume arguments could not be expanded}"
    return 1
}

train_resume_point() {
    # a save the next chunk can go on from: one of this chunk, or the run's last
    # checkpointed stop; and every {newest:GLOB} of --resume-args matches
    train_last_save >/dev/null || [ -e "$RUN_DIR/$SAVED_FILE" ] || return 1
    train_placeholders_match >/dev/null
}

train_resume_hint() {
    # what makes a program go on from its save (with $1 "next": what the next chunk does)
    if [ -n "${RESUME_ARGS[*]+x}" ]; then
        printf 'the program gets --resume-args %s: it must go on from them' \
            "${RESUME_ARGS[*]}"
    elif [ "${1:-}" = next ]; then
        printf 'it goes on from the save only if the program resumes by itself'
    else
        printf "a program that resumes only when told needs --resume-args, e.g. %s %s" \
            "'--resume_from_checkpoint {newest:out/checkpoint-*}' (Hugging Face Trainer)" \
            "or '--ckpt_path {newest:checkpoints/*.ckpt}' (Lightning)"
    fi
}

# shellcheck disable=SC2329  # invoked by train_step_status
train_overran() {
    # The step ran into the walltime after the stop signal, and the tool ended it (an
    # evaluation after training, a save that took too long). With a save to go on from,
    # the chain goes on at most OVERRUN_BOUND times (TRAIN_OVERRAN=1); beyond, or with
    # none, the chunk failed of its walltime.
    local count progress elapsed now
    count=$(($(train_overruns) + 1))
    progress=$(train_progress) || true
    if [ "$count" -le "$OVERRUN_BOUND" ] && train_resume_point; then
        train_log "the step ran into the walltime after the stop signal (it ended with" \
            "exit code $STEP_RC, ended by the tool): the chain goes on from the last save" \
            "($count of at most $OVERRUN_BOUND times in this chain)"
        train_event "$EV_OVERRAN" "$count $progress"
        STEP_RC=0
        TRAIN_OVERRAN=1
        return 0
    fi
    printf -v now '%(%s)T' -1
    elapsed=$((now - TRAIN_START))
    if [ "$count" -gt "$OVERRUN_BOUND" ]; then
        train_log "the step ran into the walltime after the stop signal again: it did" \
            "$OVERRUN_BOUND times already in this chain; the chain stops"
    else
        train_log "the step ran into the walltime after the stop signal, with no save to" \
            "go on from; the chain stops"
    fi
    train_runtime_cleanup
    train_event "$EV_TIMEOUT" "$elapsed"
    train_cancel_rest
    exit 143
}
