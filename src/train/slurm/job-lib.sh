#!/usr/bin/env bash
# Host-side job library, inlined into every script `train render` writes. The renderer
# sets these before it: RUN_DIR CHUNK CHUNKS REQUEUE COMPLETE_ON_SUCCESS RUNTIME IMAGE and
# the array STEP.
# Logic that Python can hold stays in Python; this only does what must happen in the batch
# shell: the prologue, forwarding the walltime signal to the job step, requeueing, and
# ending the chain (cancel the waiting chunks when done or failed).

train_log() {
    printf '%s train-job[%s/%s]: %s\n' "$(date +%H:%M:%S)" "$CHUNK" "$CHUNKS" "$*" >&2
}

train_event() {
    # one line per event in the chain's record: time chunk job event [detail]
    printf '%s %s %s %s\n' "$(date +%s)" "$CHUNK" "${SLURM_JOB_ID:-0}" "$*" \
        >> "$RUN_DIR/chain.events"
}

train_prologue() {
    mkdir -p "$RUN_DIR/logs"
    train_log "job ${SLURM_JOB_ID:-?} (restart ${SLURM_RESTART_COUNT:-0}) on" \
        "${SLURM_JOB_NODELIST:-?}, ${SLURM_JOB_NUM_NODES:-?} node(s)"
    train_log "submit dir ${SLURM_SUBMIT_DIR:-?}, run dir $RUN_DIR"
    train_log "runtime $RUNTIME, image ${IMAGE:-none}"
    train_event started
}

train_gpu_report() {
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi >&2 || true
    else
        train_log "nvidia-smi not available on $(hostname)"
    fi
}

train_cancel_rest() {
    # cancel the chunks after this one (their ids were recorded before any was released)
    local ids
    [ -s "$RUN_DIR/chain.ids" ] || return 0
    ids=$(tail -n "+$((CHUNK + 1))" "$RUN_DIR/chain.ids" | tr '\n' ' ')
    if [ -n "${ids// /}" ]; then
        train_log "cancelling the waiting chunks: $ids"
        # shellcheck disable=SC2086  # a list of numeric job ids
        scancel $ids 2>/dev/null || true
    fi
}

# shellcheck disable=SC2329  # invoked by the USR1 trap
train_on_usr1() {
    train_log "walltime signal: asking the training step to checkpoint and stop"
    STOP_REQUESTED=1
    if [ -n "${STEP_PID:-}" ]; then
        kill -USR1 "$STEP_PID" 2>/dev/null || true
    fi
}

train_main() {
    STOP_REQUESTED=0
    train_prologue
    trap train_on_usr1 USR1
    "${STEP[@]}" &
    STEP_PID=$!
    local rc=0
    while :; do
        rc=0
        wait "$STEP_PID" || rc=$?
        # a trapped signal interrupts wait: keep waiting while the step is alive
        if kill -0 "$STEP_PID" 2>/dev/null; then
            continue
        fi
        break
    done
    trap - USR1
    if [ "$rc" -ne 0 ]; then
        train_log "training step failed with exit code $rc"
        train_gpu_report
        train_event failed "$rc"
        train_cancel_rest
        exit "$rc"
    fi
    if [ "$COMPLETE_ON_SUCCESS" = 1 ]; then
        touch "$RUN_DIR/COMPLETE"
    fi
    if [ -e "$RUN_DIR/COMPLETE" ]; then
        train_log "run complete"
        train_event complete
        train_cancel_rest
        exit 0
    fi
    if [ "$REQUEUE" = 1 ] && [ "$STOP_REQUESTED" = 1 ]; then
        train_log "checkpoint written; requeueing job $SLURM_JOB_ID"
        train_event requeued
        scontrol requeue "$SLURM_JOB_ID"
        exit 0
    fi
    if [ "$CHUNK" -ge "$CHUNKS" ]; then
        train_log "last chunk ended before the work: resubmit with more chunks to continue"
        train_event incomplete
        exit 0
    fi
    train_event stopped
    exit 0
}
