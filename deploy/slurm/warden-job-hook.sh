#!/usr/bin/env bash
# Tell the Warden controller that a Slurm job starts or ends: its id, name, nodes and
# ranks, and at the end how it ended (exit code or signal), as
# POST /api/v1/jobs/{job}/lifecycle (docs/API.md). The Warden job is the Slurm job id,
# the name the agents give lines of `slurm-<job id>.out`.
#
# Install it once and name it in slurm.conf for both hooks (docs/DEPLOY.md):
#   PrologSlurmctld=/usr/local/libexec/warden/warden-job-hook.sh
#   EpilogSlurmctld=/usr/local/libexec/warden/warden-job-hook.sh
# It tells start from end by SLURM_SCRIPT_CONTEXT, by its own name (prolog.sh and
# epilog.sh here are links to it) or by an argument (`start` or `end`).
#
# It never fails the job: every error, an unreachable controller included, is logged
# (syslog and stderr) and the hook exits 0 within WARDEN_HOOK_TIMEOUT_SECS or so.
set -euo pipefail
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

log() {
    printf 'warden-job-hook: %s\n' "$*" >&2
    logger -t warden-job-hook -- "$*" 2>/dev/null || true
}

event=""
finish() {
    local rc=$?
    if ((rc != 0)); then
        log "job ${SLURM_JOB_ID:-?} not reported (${event:-unknown event}, status $rc); the job goes on"
    fi
    exit 0
}
trap finish EXIT

# A JSON string: backslash, quote and control characters escaped or dropped.
json_string() {
    local s=$1
    s=${s//\\/\\\\}
    s=${s//\"/\\\"}
    s=${s//$'\t'/\\t}
    s=${s//$'\n'/\\n}
    s=${s//$'\r'/\\r}
    s=$(printf '%s' "$s" | tr -d '\000-\037')
    printf '"%s"' "$s"
}

# A value from the environment as it may go in a log line: short, no control characters.
shown() {
    printf '%s' "${1:0:40}" | tr -d '\000-\037'
}

# The JSON fields ("exit_code":N or "signal":N, names prefixed with $1) of a wait(2)
# status, the form of SLURM_JOB_EXIT_CODE and SLURM_JOB_DERIVED_EC: the exit code in
# the high byte when the low 7 bits are 0, else the signal in those 7 bits (0x7f is a
# stopped process, never an end; 0x80 is the core-dump flag). Prints nothing for
# anything else: digits only, at most 5 (a status is 16 bits), nothing out of range.
status_fields() {
    local prefix=$1 v=$2 sig code
    [[ $v =~ ^[0-9]{1,5}$ ]] || return 0
    v=$((10#$v))
    if ((v > 65535)); then
        return 0
    fi
    sig=$((v & 0x7f))
    code=$((v >> 8))
    if ((sig == 0 && (v & 0x80) == 0)); then
        printf '"%sexit_code":%d' "$prefix" "$code"
    elif ((sig != 0 && sig != 0x7f && code == 0)); then
        printf '"%ssignal":%d' "$prefix" "$sig"
    fi
}

# The same from SLURM_JOB_EXIT_CODE2, "exit:signal" (e.g. 1:0, 0:9), for a Slurm that
# sets only that: one of the two is 0, as wait(2) gives one or the other.
exit2_fields() {
    local v=$1 code sig
    [[ $v =~ ^([0-9]{1,3}):([0-9]{1,3})$ ]] || return 0
    code=$((10#${BASH_REMATCH[1]}))
    sig=$((10#${BASH_REMATCH[2]}))
    if ((sig == 0 && code <= 255)); then
        printf '"exit_code":%d' "$code"
    elif ((code == 0 && sig <= 127)); then
        printf '"signal":%d' "$sig"
    fi
}

conf=${WARDEN_HOOK_CONFIG:-/etc/warden/slurm-hook.env}
if [[ -r $conf ]]; then
    # shellcheck source=slurm-hook.env
    source "$conf"
fi
# slurmctld runs the hook with only the job's SLURM_* variables: a slurm.conf outside
# /etc/slurm reaches scontrol through SLURM_CONF set in the config file.
if [[ -n ${SLURM_CONF:-} ]]; then
    export SLURM_CONF
fi
url=${WARDEN_CONTROLLER_URL:-http://warden-controller:9460}
timeout_secs=${WARDEN_HOOK_TIMEOUT_SECS:-5}
token_file=${WARDEN_TOKEN_FILE:-/etc/warden/hook-token}
scontrol=${WARDEN_SCONTROL:-scontrol}

case "${1:-}" in
start | end) event=$1 ;;
"")
    case "${SLURM_SCRIPT_CONTEXT:-}" in
    prolog_slurmctld | prolog_slurmd) event=start ;;
    epilog_slurmctld | epilog_slurmd) event=end ;;
    *)
        case "$(basename "$0")" in
        *prolog*) event=start ;;
        *epilog*) event=end ;;
        esac
        ;;
    esac
    ;;
esac
if [[ -z $event ]]; then
    log "cannot tell start from end (no argument, SLURM_SCRIPT_CONTEXT=${SLURM_SCRIPT_CONTEXT:-unset})"
    exit 0
fi

job_id=${SLURM_JOB_ID:-}
if [[ ! $job_id =~ ^[0-9]+$ ]]; then
    log "SLURM_JOB_ID is not a job id: '${job_id}'"
    exit 0
fi

# Nodes: the compact list (gpu[01-04]) expanded by scontrol.
nodes_json="[]"
if [[ -n ${SLURM_JOB_NODELIST:-} ]]; then
    if hosts=$(timeout "$timeout_secs" "$scontrol" show hostnames "$SLURM_JOB_NODELIST"); then
        nodes_json=""
        while IFS= read -r h; do
            [[ -n $h ]] || continue
            nodes_json+="${nodes_json:+,}$(json_string "$h")"
        done <<<"$hosts"
        nodes_json="[${nodes_json}]"
    else
        log "scontrol show hostnames '$SLURM_JOB_NODELIST' failed; reporting no nodes"
    fi
fi

# Ranks: the job's task count, from the environment or from scontrol.
ranks="null"
if [[ ${SLURM_NTASKS:-} =~ ^[0-9]+$ ]]; then
    ranks=$SLURM_NTASKS
elif info=$(timeout "$timeout_secs" "$scontrol" show job -o "$job_id" 2>/dev/null); then
    if [[ $info =~ (^|[[:space:]])NumTasks=([0-9]+) ]]; then
        ranks=${BASH_REMATCH[2]}
    fi
fi

# How it ended, when slurmctld says (EpilogSlurmctld sets these; slurmd's Epilog does
# not): a missing or malformed value is logged and left out, and the end is reported
# without it. Nothing here may fail the hook: a failing epilog can drain the node.
exit_json=""
if [[ $event == end ]]; then
    exit_json=$(status_fields "" "${SLURM_JOB_EXIT_CODE:-}")
    if [[ -z $exit_json ]]; then
        exit_json=$(exit2_fields "${SLURM_JOB_EXIT_CODE2:-}")
    fi
    if [[ -z $exit_json && -n ${SLURM_JOB_EXIT_CODE:-}${SLURM_JOB_EXIT_CODE2:-} ]]; then
        log "job $job_id: no exit state in SLURM_JOB_EXIT_CODE='$(shown "${SLURM_JOB_EXIT_CODE:-}")' SLURM_JOB_EXIT_CODE2='$(shown "${SLURM_JOB_EXIT_CODE2:-}")'; the end goes without it"
    fi
    derived=$(status_fields derived_ "${SLURM_JOB_DERIVED_EC:-}")
    if [[ -z $derived && -n ${SLURM_JOB_DERIVED_EC:-} ]]; then
        log "job $job_id: SLURM_JOB_DERIVED_EC='$(shown "$SLURM_JOB_DERIVED_EC")' is not a wait status; the end goes without it"
    fi
    if [[ -n $derived ]]; then
        exit_json+="${exit_json:+,}$derived"
    fi
fi

body=$(printf '{"event":"%s","scheduler":"slurm","scheduler_job_id":"%s","name":%s,"nodes":%s,"ranks":%s%s}' \
    "$event" "$job_id" "$(json_string "${SLURM_JOB_NAME:-}")" "$nodes_json" "$ranks" \
    "${exit_json:+,$exit_json}")

headers=(-H "Content-Type: application/json")
if [[ -r $token_file ]]; then
    # Through a file descriptor, so the token never shows in the process list.
    exec 3< <(printf 'Authorization: Bearer %s\n' "$(tr -d '[:space:]' <"$token_file")")
    headers+=(-H @/dev/fd/3)
fi

# The answer's body goes to stdout, then its status on a line of its own.
if ! answer=$(curl --silent --show-error --output - --write-out '\n%{http_code}' \
    --connect-timeout 2 --max-time "$timeout_secs" -X POST "${headers[@]}" \
    --data-binary "$body" "${url%/}/api/v1/jobs/${job_id}/lifecycle"); then
    log "controller at $url unreachable; job $job_id ($event) not reported"
    exit 0
fi
code=${answer##*$'\n'}
reply=${answer%$'\n'*}
reply=$(printf '%s' "${reply:0:300}" | tr -d '\000-\037')
case "$code" in
2??) log "reported job $job_id: $event" ;;
404) log "controller at $url answered 404 (a controller without the job lifecycle endpoint?): $reply; job $job_id ($event) not reported" ;;
*) log "controller at $url answered $code: $reply; job $job_id ($event) not reported" ;;
esac
exit 0
