#!/usr/bin/env bash
# Owns the GPU smoke check: on a machine with a real NVIDIA GPU it starts the BUILT service
# (dist/src/main.js), puts a real CUDA process on GPU 0 and checks, end to end, that nodecompute
# sees what CI can only fake: the process on GPU 0 attributed to its shard, the shard computing on
# CUDA, its memory counted as shard memory, readiness going starting -> ready, and a shard that
# never touches its GPU turning on-cpu after its grace. With --record it also saves the real
# nvidia-smi answers to the exact queries the service makes, as test fixtures: as soon as the CUDA
# process holds its memory, before the checks that may fail, since they do not depend on them. The
# doctor's report is printed after the table (and recorded), as evidence, not as a check. Outside
# the host's PID namespace, where nvidia-smi's PIDs are not this /proc's, it says so in one row and
# skips the checks that cannot pass then. On a GPU 0 with MIG enabled the CUDA process runs on its
# first MIG device.
# That run names its backend, NODECOMPUTE_BACKEND=nvidia-smi. Then, while the same CUDA process still
# holds GPU 0, the service runs a second time with NODECOMPUTE_BACKEND=nvml, and NVML must agree with
# nvidia-smi: the same GPUs (index, UUID) with the same memory total, the CUDA process on GPU 0 with
# the same usedMiB, to the MiB, and the shard ready. Where NVML cannot be loaded (the service's
# /readyz says NODECOMPUTE_NVML_NOT_FOUND), one INFO row says so (a FAIL with --require-nvml).
# It needs only what it carries: dist/, node_modules/ and scripts/ (scripts/README.md).
# Overrides (so CI can run it against the fake nvidia-smi, test/scripts/gpu-smoke.test.ts):
#   NODE                  node to run (default: node/bin/node in a travel pack, else node on PATH;
#                         >= 20)
#   NVIDIA_SMI            nvidia-smi to use, by the service and by --record (default: nvidia-smi)
#   NVML_LIBRARY          the NVML library the second run loads, as NODECOMPUTE_NVML_LIBRARY
#                         (default: unset, so the service finds libnvidia-ml.so.1 as it would itself)
#   SMOKE_CUDA_CMD        sh command that holds memory on GPU 0 and then writes its own pid to
#                         "$SMOKE_CUDA_PID_FILE" (default: python3 scripts/cuda-hold.py, 1 GiB
#                         through the CUDA driver API, libcuda.so.1, or else through torch)
#   SMOKE_CUDA_DRIVER_LIB the driver library cuda-hold.py loads (default: libcuda.so.1)
#   SMOKE_CUDA_WAY_TIMEOUT_S how long cuda-hold.py --check may take for each way, the driver's
#                         and torch's (default 60)
#   SMOKE_CUDA_PID_FILE   where that pid is written (default: in the work directory)
#   SMOKE_START_TIMEOUT_S how long the service may take to answer /livez (default 20)
#   SMOKE_READY_TIMEOUT_S how long smoke-gpu may take to become ready (default 60)
#   SMOKE_CUDA_TIMEOUT_S  how long the CUDA process may take to report its pid (default 120)
#   SMOKE_MIN_MIB         shard memory expected on GPU 0 (default 900)
#   SMOKE_HTTP_CLIENT     curl or node (default: curl when present)
# shellcheck disable=SC2016,SC2317 # $$ and $1 belong to the child sh; cleanup runs from the trap
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: scripts/gpu-smoke.sh [--record [DIR]] [--require-cuda] [--require-nvml] [--keep]

Starts dist/src/main.js on a free loopback port with NODECOMPUTE_BACKEND=nvidia-smi, runs a CUDA
process on GPU 0 and checks what nodecompute reports about it; then starts it again with
NODECOMPUTE_BACKEND=nvml, while the CUDA process still runs, and checks that NVML sees what
nvidia-smi saw. Prints a PASS/FAIL table; exits 1 when any check fails.

  --record [DIR]  also save the real nvidia-smi outputs of the service's queries into DIR
                  (default: test/fixtures/recorded/) as nvsmi-real_<gpu>_<driver>_<query>.txt,
                  with the doctor's report, as soon as the CUDA process holds GPU 0; and, when
                  NVML answers, both runs' /gpus answers (_gpus-nvidia-smi.json, _gpus-nvml.json)
                  and the doctor's report under NVML (_doctor-nvml.txt)
  --require-cuda  fail, rather than skip, the CUDA checks when no CUDA process can be started
                  (for a run whose point is the GPU: a skipped check is no proof)
  --require-nvml  fail, rather than note, when NVML cannot be loaded (libnvidia-ml.so.1, or
                  NVML_LIBRARY): for a run whose point is comparing the two backends
  --keep          keep the work directory (service log, state file) for a look afterwards
  -h, --help      this text

Run `npm run build` first, or carry it with scripts/pack-smoke.sh (see scripts/README.md).
EOF
}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The Node a travel pack carries (scripts/pack-smoke.sh --with-node), else the one on PATH.
if [ -z "${NODE:-}" ] && "$ROOT/node/bin/node" --version >/dev/null 2>&1; then NODE=$ROOT/node/bin/node; fi
NODE=${NODE:-node}
NVIDIA_SMI=${NVIDIA_SMI:-nvidia-smi}
START_TIMEOUT_S=${SMOKE_START_TIMEOUT_S:-20}
READY_TIMEOUT_S=${SMOKE_READY_TIMEOUT_S:-60}
CUDA_TIMEOUT_S=${SMOKE_CUDA_TIMEOUT_S:-120}
WAY_TIMEOUT_S=${SMOKE_CUDA_WAY_TIMEOUT_S:-60}
MIN_MIB=${SMOKE_MIN_MIB:-900}
# smoke-gpu must not turn on-cpu while the CUDA process starts (torch takes seconds to import): its
# grace outlasts the readiness wait.
GPU_GRACE_MS=$(((READY_TIMEOUT_S + 30) * 1000))
CPU_GRACE_MS=3000
RECORD_DIR=''
KEEP=0
REQUIRE_CUDA=0
REQUIRE_NVML=0
NVML_LIBRARY=${NVML_LIBRARY:-}

while [ $# -gt 0 ]; do
  case "$1" in
    --record)
      RECORD_DIR="$ROOT/test/fixtures/recorded"
      if [ $# -gt 1 ] && [ "${2#-}" = "$2" ]; then
        RECORD_DIR=$2
        shift
      fi
      ;;
    --keep) KEEP=1 ;;
    --require-cuda) REQUIRE_CUDA=1 ;;
    --require-nvml) REQUIRE_NVML=1 ;;
    -h | --help)
      usage
      exit 0
      ;;
    *)
      echo "gpu-smoke: unknown argument \"$1\"" >&2
      usage >&2
      exit 2
      ;;
  esac
  shift
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/nodecompute-gpu-smoke.XXXXXX")
SERVICE_PID=''
# The service logs, one per backend run, shown when a check failed.
SERVICE_LOGS=()
# The doctor's reports: "<backend> <exit status>" each, printed after the table from $WORK/doctor-<backend>.txt.
DOCTORS=()
# What the header says of NVML: its library once it answered, or why it was not compared.
NVML_NOTE='not tried'
MIG_MODE=''
MIG_UUID=''
# nvidia-smi reports the host's PIDs. 4026531836 (PROC_PID_INIT_INO) is the kernel's initial PID
# namespace: the host's (or a VM's own), shared by a container run with --pid=host.
PID_NS=$(readlink /proc/self/ns/pid 2>/dev/null || echo unknown)
case "$PID_NS" in
  'pid:[4026531836]') PID_NS_NOTE=" (the initial one)" ;;
  unknown) PID_NS_NOTE='' ;;
  *) PID_NS_NOTE=" (not the initial one: a container's own?)" ;;
esac
KILL_GROUPS=()

# ---------------------------------------------------------------------------------------------
# Cleanup: every process this script started goes, whatever way it ends.

group_alive() {
  kill -0 -- "-$1" 2>/dev/null
}

stop_group() {
  local pgid=$1 i
  group_alive "$pgid" || return 0
  kill -TERM -- "-$pgid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    group_alive "$pgid" || return 0
    sleep 0.1
  done
  kill -KILL -- "-$pgid" 2>/dev/null || true
}

cleanup() {
  local pgid
  for pgid in "${KILL_GROUPS[@]}"; do stop_group "$pgid"; done
  if [ -n "$SERVICE_PID" ] && kill -0 "$SERVICE_PID" 2>/dev/null; then
    kill -KILL "$SERVICE_PID" 2>/dev/null || true
  fi
  if [ "$KEEP" = 1 ]; then
    echo "gpu-smoke: work directory kept: $WORK" >&2
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------------------------------------
# Results

NAMES=()
RESULTS=()
DETAILS=()

check() {
  NAMES+=("$1")
  RESULTS+=("$2")
  DETAILS+=("$3")
  printf 'gpu-smoke: %-4s %s: %s\n' "$2" "$1" "$3" >&2
}

now_ms() {
  date +%s%3N
}

finish() {
  local i passed=0 failed=0 skipped=0 noted=0 summary entry log
  echo
  echo "nodecompute GPU smoke check: nvidia-smi ${NVIDIA_SMI}, NVML ${NVML_NOTE}, driver ${DRIVER:-unknown}, GPU 0 ${GPU_NAME:-unknown} (MIG ${MIG_MODE:-unknown}${MIG_UUID:+; CUDA on its MIG device $MIG_UUID}), PID namespace ${PID_NS}${PID_NS_NOTE}, node ${NODE} ${NODE_VERSION:-}"
  printf '%-6s %-34s %s\n' RESULT CHECK DETAIL
  for i in "${!NAMES[@]}"; do
    printf '%-6s %-34s %s\n' "${RESULTS[$i]}" "${NAMES[$i]}" "${DETAILS[$i]}"
    case "${RESULTS[$i]}" in
      PASS) passed=$((passed + 1)) ;;
      FAIL) failed=$((failed + 1)) ;;
      INFO) noted=$((noted + 1)) ;;
      *) skipped=$((skipped + 1)) ;;
    esac
  done
  summary="${passed} passed, ${failed} failed, ${skipped} skipped"
  [ "$noted" = 0 ] || summary+=", ${noted} noted"
  echo "$summary"
  for entry in "${DOCTORS[@]}"; do
    # Indented, so that its OK/WARN/FAIL lines are not read as rows of the table.
    echo
    echo "nodecompute doctor with NODECOMPUTE_BACKEND=${entry% *} (exit ${entry##* }; evidence, not a check of this script):"
    sed 's/^/    /' "$WORK/doctor-${entry% *}.txt"
  done
  if [ "$failed" -gt 0 ]; then
    for log in "${SERVICE_LOGS[@]}"; do
      [ -s "$log" ] || continue
      echo "--- last lines of the nodecompute log ($log) ---" >&2
      tail -n 20 "$log" >&2
    done
    exit 1
  fi
  exit 0
}

die() {
  check "$1" FAIL "$2"
  finish
}

# ---------------------------------------------------------------------------------------------
# HTTP and JSON: curl when present, else node's fetch; JSON is read with node, which is needed anyway.

HTTP_CLIENT=${SMOKE_HTTP_CLIENT:-}
if [ -z "$HTTP_CLIENT" ]; then
  if command -v curl >/dev/null 2>&1; then HTTP_CLIENT=curl; else HTTP_CLIENT=node; fi
fi
STATUS=000
BODY=''

# http METHOD PATH [JSON]: sets STATUS (000: no answer) and BODY; the body also stays in $WORK/body.
http() {
  local method=$1 path=$2 data=${3-}
  rm -f "$WORK/body"
  if [ "$HTTP_CLIENT" = curl ]; then
    local args=(-sS -o "$WORK/body" -w '%{http_code}' -X "$method" --max-time 10)
    if [ -n "$data" ]; then args+=(-H 'Content-Type: application/json' --data-binary "$data"); fi
    STATUS=$(curl "${args[@]}" "$BASE$path" 2>"$WORK/http.err") || STATUS=000
  else
    STATUS=$("$NODE" -e "
      const fs = require('node:fs');
      const [method, url, data, out] = process.argv.slice(1);
      const init = { method, signal: AbortSignal.timeout(10000) };
      if (data) Object.assign(init, { headers: { 'content-type': 'application/json' }, body: data });
      fetch(url, init)
        .then(async (r) => { fs.writeFileSync(out, await r.text()); process.stdout.write(String(r.status)); })
        .catch((e) => { fs.writeFileSync(out, String(e.cause?.message ?? e.message)); process.stdout.write('000'); });
    " "$method" "$BASE$path" "$data" "$WORK/body") || STATUS=000
  fi
  BODY=$(cat "$WORK/body" 2>/dev/null || true)
}

# js EXPR [ARG...]: prints EXPR evaluated with b = the last response body parsed as JSON and
# a = the ARGs; prints nothing and fails when the body is not JSON or lacks what EXPR reads.
js() {
  js_in "$WORK/body" "$@"
}

# js_in FILE EXPR [ARG...]: js, with b = FILE parsed as JSON.
js_in() {
  "$NODE" -e "
    try {
      const b = JSON.parse(require('node:fs').readFileSync(process.argv[1], 'utf8'));
      const a = process.argv.slice(2);
      const v = ($2);
      process.stdout.write(typeof v === 'string' ? v : JSON.stringify(v ?? null));
    } catch {
      process.exitCode = 3;
    }
  " "$1" "${@:3}"
}

short() {
  local text=${1//$'\n'/ }
  if [ "${#text}" -gt 160 ]; then text="${text:0:157}..."; fi
  printf '%s' "$text"
}

# Waits until FILE holds a pid (written whole), for at most SECONDS, or until process group PGID
# (when given) has no process left to write it; prints it.
wait_for_pid_file() {
  local file=$1 seconds=$2 pgid=${3:-} deadline content gone=0
  deadline=$(($(now_ms) + seconds * 1000))
  while [ "$(now_ms)" -lt "$deadline" ]; do
    content=$(cat "$file" 2>/dev/null || true)
    if [[ $content =~ ^[0-9]+$ ]]; then
      printf '%s' "$content"
      return 0
    fi
    # One more look at the file after the group is gone: it may have written it just before.
    [ "$gone" = 1 ] && return 1
    if [ -n "$pgid" ] && ! group_alive "$pgid"; then gone=1; fi
    sleep 0.1
  done
  return 1
}

# ---------------------------------------------------------------------------------------------
# Preflight

[ -f "$ROOT/dist/src/main.js" ] || die "built service present" "$ROOT/dist/src/main.js is missing: run \`npm run build\` there, or carry dist/ along (scripts/README.md)"
[ -d "$ROOT/node_modules" ] || die "built service present" "$ROOT/node_modules is missing: run \`npm ci --omit=dev\` there, or carry node_modules/ along"
command -v "$NODE" >/dev/null 2>&1 || die "node present" "\"$NODE\" is not found: install Node.js >= 20 or set NODE to its path"
NODE_VERSION=$("$NODE" --version 2>&1) || die "node present" "\"$NODE\" does not run: $(short "$NODE_VERSION")"
NODE_MAJOR=$("$NODE" -p 'process.versions.node.split(".")[0]')
[ "$NODE_MAJOR" -ge 20 ] || die "node present" "$NODE is Node $NODE_VERSION; nodecompute needs >= 20"
command -v setsid >/dev/null 2>&1 || die "setsid present" "setsid (util-linux) is needed to give the test processes their own process groups"

if ! "$NVIDIA_SMI" -L >"$WORK/list-L.txt" 2>&1; then
  die "nvidia-smi answers" "\"$NVIDIA_SMI\" -L failed: $(short "$(cat "$WORK/list-L.txt")")"
fi
DRIVER=$("$NVIDIA_SMI" --version 2>/dev/null | sed -n 's/^DRIVER version *: *//p' | head -n 1 || true)
# GPU 0's first MIG device, where MIG is enabled: `  MIG 1c.3g.71gb  Device  0: (UUID: MIG-...)`
# lines under `GPU 0: ...` (older drivers: MIG-GPU-<uuid>/<gi>/<ci>). CUDA sees MIG devices only.
MIG_UUID=$(sed -n '/^GPU 0:/,/^GPU /s/.*(UUID: \(MIG-[^) ]*\)).*/\1/p' "$WORK/list-L.txt" | head -n 1 || true)
# The queries the service makes, read from the build itself so the recording cannot drift from it.
QUERY_FIELDS=$("$NODE" -e "
  import(require('node:url').pathToFileURL(process.argv[1]).href).then((m) => {
    process.stdout.write(m.GPU_QUERY_FIELDS.join(',') + '\n' + m.COMPUTE_APPS_FIELDS.join(',') + '\n');
  });
" "$ROOT/dist/src/system/nvidia-smi.js") || die "built service present" "cannot read the nvidia-smi fields from $ROOT/dist/src/system/nvidia-smi.js: is dist/ complete?"
GPU_FIELDS=$(sed -n 1p <<<"$QUERY_FIELDS")
APPS_FIELDS=$(sed -n 2p <<<"$QUERY_FIELDS")

# ---------------------------------------------------------------------------------------------
# The service

# backend_env BACKEND: sets BACKEND_ENV, the environment that has the service (or the doctor) take
# its GPU figures from BACKEND; NVML_LIBRARY, when set, names the library NVML loads.
backend_env() {
  BACKEND_ENV=("NODECOMPUTE_BACKEND=$1")
  if [ "$1" = nvml ] && [ -n "$NVML_LIBRARY" ]; then BACKEND_ENV+=("NODECOMPUTE_NVML_LIBRARY=$NVML_LIBRARY"); fi
}

# start_service BACKEND: starts the service on a free loopback port with NODECOMPUTE_BACKEND=BACKEND,
# its log in $WORK/service-BACKEND.log; sets SERVICE_PID, SERVICE_LOG, PORT and BASE. Waits for a 200
# from /livez; fails with WHY set when none comes.
start_service() {
  local started
  SERVICE_LOG="$WORK/service-$1.log"
  SERVICE_LOGS+=("$SERVICE_LOG")
  PORT=$("$NODE" -e "const s = require('node:net').createServer().listen(0, '127.0.0.1', () => { process.stdout.write(String(s.address().port)); s.close(); });")
  BASE="http://127.0.0.1:$PORT"
  backend_env "$1"
  env "${BACKEND_ENV[@]}" "$NODE" "$ROOT/dist/src/main.js" serve --host 127.0.0.1 --port "$PORT" \
    --state-file "$WORK/state/shards-$1.json" --nvidia-smi "$NVIDIA_SMI" \
    --gpu-grace-ms "$GPU_GRACE_MS" --log-level info >"$SERVICE_LOG" 2>&1 </dev/null &
  SERVICE_PID=$!
  started=$(now_ms)
  until http GET /livez && [ "$STATUS" = 200 ]; do
    if ! kill -0 "$SERVICE_PID" 2>/dev/null; then
      WHY="it exited: $(short "$(tail -n 3 "$SERVICE_LOG")")"
      return 1
    fi
    if [ $(($(now_ms) - started)) -ge $((START_TIMEOUT_S * 1000)) ]; then
      WHY="no 200 from /livez within $START_TIMEOUT_S s (last: HTTP $STATUS)"
      return 1
    fi
    sleep 0.2
  done
}

# stop_service NAME: SIGTERM, then the row NAME says how the service exited.
stop_service() {
  local code=0
  kill -TERM "$SERVICE_PID"
  wait "$SERVICE_PID" || code=$?
  SERVICE_PID=''
  if [ "$code" = 0 ]; then
    check "$1" PASS "exit 0"
  else
    check "$1" FAIL "exit $code"
  fi
}

mkdir -p "$WORK/state"
WHY=''
start_service nvidia-smi || die "service starts" "$WHY"
check "service starts" PASS "pid $SERVICE_PID answers /livez on 127.0.0.1:$PORT (NODECOMPUTE_BACKEND=nvidia-smi)"

started=$(now_ms)
until http GET /readyz && [ "$STATUS" = 200 ]; do
  [ $(($(now_ms) - started)) -lt 15000 ] && { sleep 0.3; continue; }
  break
done
if [ "$STATUS" = 200 ]; then
  check "/readyz" PASS "nvidia-smi answers, its PIDs are visible and registrations can be stored"
else
  check "/readyz" FAIL "HTTP $STATUS: $(short "$BODY")"
fi

http GET /gpus
GPU_NAME=$(js 'b.gpus.find((g) => g.index === 0)?.name ?? ""' 2>/dev/null || true)
if [ "$STATUS" = 200 ] && [ -n "$GPU_NAME" ]; then
  MIG_MODE=$(js 'b.gpus.find((g) => g.index === 0).migMode ?? "mode not reported"' 2>/dev/null || true)
  check "/gpus lists GPU 0" PASS "$GPU_NAME, $(js 'b.gpus.length') GPU(s), driver ${DRIVER:-unknown}"
else
  die "/gpus lists GPU 0" "HTTP $STATUS: $(short "$BODY")"
fi

# ---------------------------------------------------------------------------------------------
# Evidence that does not depend on attribution: --record's real nvidia-smi answers to the service's
# queries, and the doctor's report. Taken once, as soon as the CUDA process holds GPU 0 (or as soon
# as it is known that none will), so that a check failing later still leaves them.

record() {
  local slug prefix file query status=0 failed=''
  slug=$(tr '[:upper:]' '[:lower:]' <<<"$GPU_NAME" | sed -e 's/[^a-z0-9]\{1,\}/-/g' -e 's/^-//' -e 's/-$//')
  prefix="nvsmi-real_${slug:-unknown-gpu}_${DRIVER:-unknown-driver}"
  mkdir -p "$RECORD_DIR"
  {
    echo "# Recorded by scripts/gpu-smoke.sh --record on $(date -u +%Y-%m-%dT%H:%M:%SZ) with $NVIDIA_SMI"
    echo "# nodecompute $("$NODE" "$ROOT/dist/src/main.js" --version), node $("$NODE" --version), PID namespace $PID_NS$PID_NS_NOTE"
    if [ -n "$CUDA_PID" ]; then
      echo "# while pid $CUDA_PID ($CUDA_WHAT) held memory on GPU 0, in the process group of pid ${LEADER:-?}"
    else
      echo "# with no CUDA process of this script running${SKIP_CUDA:+ ($SKIP_CUDA)}"
    fi
    echo "# Each file holds the command's stdout, byte for byte."
  } >"$RECORD_DIR/${prefix}_commands.txt"
  for query in query-gpu query-compute-apps version list-L; do
    file="$RECORD_DIR/${prefix}_${query}.txt"
    local args=()
    case "$query" in
      query-gpu) args=("--query-gpu=$GPU_FIELDS" --format=csv) ;;
      query-compute-apps) args=("--query-compute-apps=$APPS_FIELDS" --format=csv) ;;
      version) args=(--version) ;;
      list-L) args=(-L) ;;
    esac
    status=0
    "$NVIDIA_SMI" "${args[@]}" >"$file" 2>"$WORK/record.err" || status=$?
    echo "$(basename "$file"): nvidia-smi ${args[*]} (exit $status)" >>"$RECORD_DIR/${prefix}_commands.txt"
    if [ "$status" != 0 ]; then failed+=" $query (exit $status: $(short "$(cat "$file" "$WORK/record.err")"))"; fi
  done
  RECORD_PREFIX=$prefix
  if [ -z "$failed" ]; then
    check "record nvidia-smi outputs" PASS "$RECORD_DIR/${prefix}_*.txt"
  else
    check "record nvidia-smi outputs" FAIL "failed:$failed"
  fi
}

# The doctor's report on the real node is evidence too, not a gate: it is printed after the table,
# and saved with the recordings (as _doctor.txt under nvidia-smi, _doctor-nvml.txt under NVML).
# doctor BACKEND: the report with NODECOMPUTE_BACKEND=BACKEND, into $WORK/doctor-BACKEND.txt.
doctor() {
  local code=0 name=doctor
  backend_env "$1"
  env "${BACKEND_ENV[@]}" timeout 60 "$NODE" "$ROOT/dist/src/main.js" doctor --nvidia-smi "$NVIDIA_SMI" \
    --state-file "$WORK/state/doctor-shards-$1.json" >"$WORK/doctor-$1.txt" 2>&1 </dev/null || code=$?
  DOCTORS+=("$1 $code")
  echo "gpu-smoke: nodecompute doctor with NODECOMPUTE_BACKEND=$1 exited $code (printed after the table)" >&2
  if [ -n "$RECORD_PREFIX" ]; then
    [ "$1" = nvidia-smi ] || name=doctor-$1
    cp "$WORK/doctor-$1.txt" "$RECORD_DIR/${RECORD_PREFIX}_$name.txt"
    echo "${RECORD_PREFIX}_$name.txt: nodecompute doctor with NODECOMPUTE_BACKEND=$1 (exit $code; not an nvidia-smi output, not a fixture)" >>"$RECORD_DIR/${RECORD_PREFIX}_commands.txt"
  fi
}

# The recordings first: they are the most valuable output of a run.
EVIDENCE_TAKEN=0
RECORD_PREFIX=''
take_evidence() {
  [ "$EVIDENCE_TAKEN" = 0 ] || return 0
  EVIDENCE_TAKEN=1
  if [ -n "$RECORD_DIR" ]; then record; fi
  doctor nvidia-smi
}

# ---------------------------------------------------------------------------------------------
# A CUDA process on GPU 0, in a child of a process-group leader: an engine computing in a child.

CUDA_PID_FILE=${SMOKE_CUDA_PID_FILE:-$WORK/cuda.pid}
rm -f "$CUDA_PID_FILE"
CUDA_CMD=${SMOKE_CUDA_CMD:-}
CUDA_WHAT="the SMOKE_CUDA_CMD command"
SKIP_CUDA=''
HOLD_WAYS=''
if [ -z "$CUDA_CMD" ]; then
  # scripts/cuda-hold.py: 1 GiB on the first GPU in PCI order (nvidia-smi's GPU 0, or its first MIG
  # device), through the CUDA driver API, which needs nothing but the driver, or else torch. Each
  # way is tried with its own time limit: a torch that takes minutes to import must not use up the
  # driver's time, nor a hanging driver torch's.
  if ! command -v python3 >/dev/null 2>&1; then
    SKIP_CUDA="python3 is not installed"
  else
    reasons=()
    for way in driver torch; do
      code=0
      hold_way=$(NVIDIA_SMI=$NVIDIA_SMI timeout "$WAY_TIMEOUT_S" python3 "$ROOT/scripts/cuda-hold.py" --ways "$way" --check 2>"$WORK/hold-check.err") || code=$?
      if [ "$code" = 0 ]; then
        # Holding may still fail where checking did not (an allocation): the later way stays a fallback.
        HOLD_WAYS=$way
        if [ "$way" = driver ]; then HOLD_WAYS=driver,torch; fi
        CUDA_WHAT="python3 scripts/cuda-hold.py through $hold_way, 1 GiB on GPU 0"
        break
      elif [ "$code" = 124 ]; then
        reasons+=("the $way way gave no answer within ${WAY_TIMEOUT_S} s (SMOKE_CUDA_WAY_TIMEOUT_S)")
      elif [ -s "$WORK/hold-check.err" ]; then
        # Not shortened: each way gives its reason.
        reasons+=("$(tail -n 1 "$WORK/hold-check.err" | sed 's/^cuda-hold: cannot hold memory on GPU 0: //')")
      else
        reasons+=("cuda-hold.py --ways $way --check exited $code saying nothing")
      fi
    done
    if [ -z "$HOLD_WAYS" ]; then
      joined=''
      for reason in "${reasons[@]}"; do joined+="${joined:+; }$reason"; done
      SKIP_CUDA="python3 cannot hold GPU memory: $joined"
      if [ "$MIG_MODE" = Enabled ] && [ -z "$MIG_UUID" ]; then
        SKIP_CUDA+=" (MIG is enabled on GPU 0 and nvidia-smi -L lists no MIG device on it: CUDA has no device there to use)"
      fi
    fi
  fi
  CUDA_CMD='exec python3 "$SMOKE_CUDA_HOLDER" --ways "$SMOKE_CUDA_HOLD_WAYS"'
fi

# The checks that need the CUDA process, for skipping them all at once.
CUDA_CHECKS=("register smoke-gpu" "host PID namespace" "smoke-gpu starting -> ready" "/gpus: CUDA pid on GPU 0" "/shards/smoke-gpu/compute" "/gpus/foreign-memory")
CUDA_PID=''
OTHER_PID_NS=''
SMI_SEEN=''

# GET /shards/smoke-gpu/ready once: STATE (the verdict, or HTTP-<status>), READY_STATUS,
# READY_REASON and SEEN (the verdicts in the order they came) are updated; succeeds when the answer
# settles it (ready, a verdict that will not turn ready, or no verdict at all, such as a 404 when the
# registration failed).
look_at_readiness() {
  http GET /shards/smoke-gpu/ready
  READY_STATUS=$STATUS
  READY_REASON=$(js 'b.reason ?? b.message ?? ""' 2>/dev/null || true)
  STATE=$(js 'b.state ?? "HTTP-" + a[0]' "$STATUS" 2>/dev/null || echo "HTTP-$STATUS")
  [ "${SEEN##*-> }" = "$STATE" ] || SEEN="${SEEN:+$SEEN -> }$STATE"
  case "$STATE" in
    ready | on-cpu | gpu-lost | stopped | exited | unverified) return 0 ;;
  esac
  case "$STATUS" in
    200 | 503) return 1 ;;
  esac
  return 0
}

# Whether nvidia-smi sees the CUDA process under the pid this /proc gives it. nvidia-smi reports host
# PIDs: in a container without the host's PID namespace the holder is listed under a pid this /proc
# does not have (or not at all), and every check of attribution fails for that one reason. So it is
# told at once, and those checks are skipped. Sets OTHER_PID_NS to the reason when it is so.
check_pid_namespace() {
  local started listed readyz_code pid what missing pids first_pids='' first_at=0
  started=$(now_ms)
  while [ $(($(now_ms) - started)) -lt 10000 ]; do
    # /readyz first: /gpus then answers from the same snapshot, or a newer one.
    http GET /readyz
    readyz_code=$(js 'b.code ?? ""' 2>/dev/null || true)
    http GET /gpus
    listed=$(js 'b.gpus.filter((g) => g.processes.some((p) => p.pid === Number(a[0]))).map((g) => g.index).join(",")' "$CUDA_PID" 2>/dev/null || true)
    if [ -n "$listed" ]; then
      check "host PID namespace" PASS "nvidia-smi lists the CUDA process as pid $CUDA_PID (GPU $listed), the pid this /proc (PID namespace $PID_NS) has for it"
      return 0
    fi
    # GPU 0's processes whose pids this /proc does not have: "pid (name, N MiB)" each.
    missing=''
    pids=''
    while IFS=' ' read -r pid what || [ -n "$pid" ]; do
      if [ -n "$pid" ] && [ ! -d "/proc/$pid" ]; then
        missing+="${missing:+, }pid $pid ($what)"
        pids+=" $pid"
      fi
    done < <(js '(b.gpus.find((g) => g.index === 0)?.processes ?? []).map((p) => `${p.pid} ${p.name}, ${p.usedMiB ?? "[N/A]"} MiB`).join("\n")' 2>/dev/null || true)
    # One look may catch a process that exited after nvidia-smi listed it: the same ones missing two
    # seconds apart, or the service's own verdict (which also weighs two snapshots), settle it.
    if [ "$readyz_code" = NODECOMPUTE_PID_NAMESPACE ] || { [ -n "$pids" ] && [ "$pids" = "$first_pids" ] && [ $(($(now_ms) - first_at)) -ge 2000 ]; }; then
      OTHER_PID_NS="not the host's PID namespace: nvidia-smi reports ${missing:-no process on GPU 0}${missing:+ on GPU 0}, and this /proc (PID namespace $PID_NS) has ${missing:+no such pid, while it has }the CUDA process as pid $CUDA_PID, which nvidia-smi does not list"
      if [ "$readyz_code" = NODECOMPUTE_PID_NAMESPACE ]; then OTHER_PID_NS+=" (/readyz: NODECOMPUTE_PID_NAMESPACE)"; fi
      OTHER_PID_NS+=". Run this with the host's PID namespace (docker run --pid=host, hostPID: true in Kubernetes)"
      check "host PID namespace" FAIL "$OTHER_PID_NS"
      return 0
    fi
    if [ "$pids" != "$first_pids" ]; then
      first_pids=$pids
      first_at=$(now_ms)
    fi
    sleep 0.5
  done
  check "host PID namespace" SKIP "cannot tell: within 10 s nvidia-smi listed neither the CUDA process (pid $CUDA_PID) nor any pid missing from this /proc (PID namespace $PID_NS)"
}

if [ -n "$SKIP_CUDA" ]; then
  echo "gpu-smoke: SKIPPING the CUDA checks: $SKIP_CUDA. Check that the NVIDIA driver is installed and libcuda.so.1 loads (or install torch with CUDA), or set SMOKE_CUDA_CMD." >&2
  for name in "${CUDA_CHECKS[@]}"; do
    if [ "$REQUIRE_CUDA" = 1 ]; then check "$name" FAIL "$SKIP_CUDA (--require-cuda)"; else check "$name" SKIP "$SKIP_CUDA"; fi
  done
else
  # CUDA_VISIBLE_DEVICES: none (CUDA's device 0 is then GPU 0, in PCI order), or GPU 0's first MIG
  # device, as cuda-hold.py chooses for itself; this is for a SMOKE_CUDA_CMD of one's own.
  visible=(-u CUDA_VISIBLE_DEVICES)
  [ -z "$MIG_UUID" ] || visible=("CUDA_VISIBLE_DEVICES=$MIG_UUID")
  SMOKE_CUDA_PID_FILE=$CUDA_PID_FILE SMOKE_CUDA_HOLDER="$ROOT/scripts/cuda-hold.py" SMOKE_CUDA_HOLD_WAYS=${HOLD_WAYS:-driver,torch} \
    NVIDIA_SMI=$NVIDIA_SMI CUDA_DEVICE_ORDER=PCI_BUS_ID env "${visible[@]}" \
    setsid sh -c 'echo $$ > "$1"; sh -c "$2" & wait' smoke-leader "$WORK/leader.pid" "$CUDA_CMD" \
    </dev/null >"$WORK/cuda.log" 2>&1 &
  LEADER=$(wait_for_pid_file "$WORK/leader.pid" 10) || die "register smoke-gpu" "the process-group leader did not start"
  KILL_GROUPS+=("$LEADER")

  http PUT /shards/smoke-gpu "{\"pid\":$LEADER,\"gpus\":[0],\"engine\":\"other\"}"
  if [ "$STATUS" = 201 ]; then
    check "register smoke-gpu" PASS "pid $LEADER (its process group), GPU 0; CUDA process: $CUDA_WHAT"
  else
    check "register smoke-gpu" FAIL "HTTP $STATUS: $(short "$BODY")"
  fi

  # Until the CUDA process says it holds the memory (its pid in the file), or its group is gone:
  # readiness is watched meanwhile (starting while it loads; it may already turn ready).
  SEEN=''
  STATE=''
  READY_STATUS=''
  READY_REASON=''
  watching=1
  registered=$(now_ms)
  gone=0
  while :; do
    # Readiness first: the first look comes right after the registration, while the process loads.
    if [ "$watching" = 1 ] && look_at_readiness; then watching=0; fi
    content=$(cat "$CUDA_PID_FILE" 2>/dev/null || true)
    if [[ $content =~ ^[0-9]+$ ]]; then
      CUDA_PID=$content
      break
    fi
    # One more look at the file after the group is gone: it may have written it just before.
    [ "$gone" = 1 ] && break
    group_alive "$LEADER" || gone=1
    [ $(($(now_ms) - registered)) -lt $((CUDA_TIMEOUT_S * 1000)) ] || break
    sleep 0.3
  done

  if [ -n "$CUDA_PID" ]; then
    # nvidia-smi lists the process once it holds memory; the recording should show it.
    started=$(now_ms)
    until http GET /gpus && [ "$(js '(b.gpus.find((g) => g.index === 0)?.processes.length ?? 0) > 0' 2>/dev/null)" = true ]; do
      [ $(($(now_ms) - started)) -lt 5000 ] || break
      sleep 0.3
    done
    take_evidence
    check_pid_namespace
  else
    check "host PID namespace" SKIP "no CUDA process to look for"
  fi

  if [ -n "$OTHER_PID_NS" ]; then
    for name in "smoke-gpu starting -> ready" "/gpus: CUDA pid on GPU 0" "/shards/smoke-gpu/compute" "/gpus/foreign-memory"; do
      check "$name" SKIP "cannot pass outside the host's PID namespace (see host PID namespace)"
    done
  else
    # Readiness: starting while the CUDA process loads, then ready; never on-cpu or exited. Looked
    # at once more at least, however long the CUDA process took.
    while [ "$watching" = 1 ]; do
      if look_at_readiness; then break; fi
      [ $(($(now_ms) - registered)) -lt $((READY_TIMEOUT_S * 1000)) ] || break
      sleep 0.5
    done
    waited=$((($(now_ms) - registered) / 1000))
    expected='^(starting -> )?ready$'
    SMI_SEEN=$SEEN
    if [ "$STATE" = ready ] && [[ $SEEN =~ $expected ]]; then
      check "smoke-gpu starting -> ready" PASS "$SEEN after ${waited} s"
    else
      check "smoke-gpu starting -> ready" FAIL "$SEEN (HTTP $READY_STATUS) after ${waited} s: $(short "$READY_REASON")"
    fi

    if [ -n "$CUDA_PID" ]; then
      http GET /gpus
      on_gpu=$(js 'JSON.stringify(b.gpus.find((g) => g.index === 0)?.processes.find((p) => p.pid === Number(a[0])) ?? null)' "$CUDA_PID") || on_gpu=null
      if [ "$(js '(b.gpus.find((g) => g.index === 0)?.processes ?? []).some((p) => p.pid === Number(a[0]) && p.shard === "smoke-gpu")' "$CUDA_PID")" = true ]; then
        check "/gpus: CUDA pid on GPU 0" PASS "$on_gpu"
      elif [ "$on_gpu" != null ]; then
        check "/gpus: CUDA pid on GPU 0" FAIL "listed but not attributed to smoke-gpu: $on_gpu"
      else
        check "/gpus: CUDA pid on GPU 0" FAIL "pid $CUDA_PID is not among GPU 0's processes (HTTP $STATUS): $(short "$(js 'b.gpus.find((g) => g.index === 0).processes' || printf '%s' "$BODY")")"
      fi

      http GET /shards/smoke-gpu/compute
      if [ "$(js 'b.backend === "CUDA" && b.gpus.some((g) => g.index === 0) && b.devices.some((d) => d.startsWith("GPU 0:"))' 2>/dev/null)" = true ]; then
        check "/shards/smoke-gpu/compute" PASS "backend CUDA, devices $(js 'b.devices.join(", ")')"
      else
        check "/shards/smoke-gpu/compute" FAIL "HTTP $STATUS: $(short "$BODY")"
      fi

      # The snapshot may come from before the allocation (a CUDA context alone is about 500 MiB on
      # an H200): looked at for up to 5 s.
      started=$(now_ms)
      while :; do
        http GET /gpus/foreign-memory
        shard_mib=$(js 'b.gpus.find((g) => g.index === 0)?.shardMiB ?? -1' 2>/dev/null || echo -1)
        [ "$shard_mib" -lt "$MIN_MIB" ] && [ $(($(now_ms) - started)) -lt 5000 ] || break
        sleep 0.5
      done
      if [ "$shard_mib" -ge "$MIN_MIB" ]; then
        check "/gpus/foreign-memory" PASS "GPU 0: shardMiB $shard_mib (>= $MIN_MIB), foreignMiB $(js 'b.gpus.find((g) => g.index === 0).foreignMiB')"
      else
        check "/gpus/foreign-memory" FAIL "GPU 0: shardMiB $shard_mib after 5 s, expected >= $MIN_MIB: $(short "$BODY")"
      fi
    else
      if group_alive "$LEADER"; then
        why="the CUDA process ($CUDA_WHAT) did not write its pid to $CUDA_PID_FILE within ${CUDA_TIMEOUT_S} s: $(short "$(tail -n 3 "$WORK/cuda.log")")"
      else
        why="the CUDA process ($CUDA_WHAT) exited without writing its pid: $(short "$(tail -n 3 "$WORK/cuda.log")")"
      fi
      for name in "/gpus: CUDA pid on GPU 0" "/shards/smoke-gpu/compute" "/gpus/foreign-memory"; do check "$name" FAIL "$why"; done
    fi
  fi
fi

take_evidence

# ---------------------------------------------------------------------------------------------
# A shard placed on GPU 0 that never touches it: starting during its grace, then on-cpu.

if [ -n "$OTHER_PID_NS" ]; then
  # Its verdict would be unverified, not on-cpu: nvidia-smi's PIDs cannot be matched to it.
  check "smoke-cpu starting -> on-cpu" SKIP "cannot pass outside the host's PID namespace (see host PID namespace)"
else
  setsid sh -c 'echo $$ > "$1"; exec sleep 600' smoke-cpu "$WORK/cpu.pid" </dev/null >/dev/null 2>&1 &
  CPU_LEADER=$(wait_for_pid_file "$WORK/cpu.pid" 10) || die "smoke-cpu starting -> on-cpu" "the sleep process did not start"
  KILL_GROUPS+=("$CPU_LEADER")
  registered=$(now_ms)
  http PUT /shards/smoke-cpu "{\"pid\":$CPU_LEADER,\"gpus\":[0],\"graceMs\":$CPU_GRACE_MS}"
  if [ "$STATUS" != 201 ]; then
    check "smoke-cpu starting -> on-cpu" FAIL "registration: HTTP $STATUS: $(short "$BODY")"
  else
    seen=''
    state=''
    first_look=''
    while [ $(($(now_ms) - registered)) -lt $((CPU_GRACE_MS + 15000)) ]; do
      http GET /shards/smoke-cpu/ready
      first_look=${first_look:-$(($(now_ms) - registered))}
      state=$(js 'b.state ?? "HTTP-" + a[0]' "$STATUS" 2>/dev/null || echo "HTTP-$STATUS")
      [ "${seen##*-> }" = "$state" ] || seen="${seen:+$seen -> }$state"
      case "$state" in on-cpu | gpu-lost | stopped | exited) break ;; esac
      sleep 0.5
    done
    elapsed=$(($(now_ms) - registered))
    # A machine too busy to look before the grace ran out cannot see `starting`; that is no fault.
    late=''
    if [ "$seen" = on-cpu ] && [ "$first_look" -ge "$CPU_GRACE_MS" ]; then
      late=" (starting not seen: the first look came $((first_look / 1000)) s after registering)"
      seen="starting -> on-cpu"
    fi
    if [ "$seen" = "starting -> on-cpu" ] && [ "$STATUS" = 503 ] && [ "$elapsed" -ge "$CPU_GRACE_MS" ]; then
      check "smoke-cpu starting -> on-cpu" PASS "on-cpu after $((elapsed / 1000)) s (grace $((CPU_GRACE_MS / 1000)) s)$late: $(short "$(js 'b.reason')")"
    else
      check "smoke-cpu starting -> on-cpu" FAIL "$seen (HTTP $STATUS) after ${elapsed} ms, grace ${CPU_GRACE_MS} ms: $(short "$BODY")"
    fi
  fi
fi

# ---------------------------------------------------------------------------------------------
# Removal and shutdown

# What NVML's /gpus is compared with (below): nvidia-smi's, taken while smoke-gpu is still registered.
http GET /gpus
SMI_GPUS_STATUS=$STATUS
cp "$WORK/body" "$WORK/gpus-nvidia-smi.json" 2>/dev/null || : >"$WORK/gpus-nvidia-smi.json"

removed=''
for id in smoke-gpu smoke-cpu; do
  http DELETE "/shards/$id"
  [ "$STATUS" = 204 ] || [ "$STATUS" = 404 ] || removed+=" $id: HTTP $STATUS $(short "$BODY")"
done
if [ -z "$removed" ]; then
  check "DELETE shards" PASS "smoke-gpu and smoke-cpu removed"
else
  check "DELETE shards" FAIL "$removed"
fi

stop_service "service stops on SIGTERM"

# ---------------------------------------------------------------------------------------------
# The same node through NVML: the service again, with NODECOMPUTE_BACKEND=nvml, while the CUDA
# process still holds GPU 0 (it goes only when this script ends). NVML must see what nvidia-smi saw,
# to the MiB.

# record_nvml: with --record, both /gpus answers beside the nvidia-smi recordings.
record_nvml() {
  local backend
  [ -n "$RECORD_PREFIX" ] || return 0
  for backend in nvidia-smi nvml; do
    cp "$WORK/gpus-$backend.json" "$RECORD_DIR/${RECORD_PREFIX}_gpus-$backend.json"
    echo "${RECORD_PREFIX}_gpus-$backend.json: GET /gpus with NODECOMPUTE_BACKEND=$backend (the service's answer, not an nvidia-smi output)" >>"$RECORD_DIR/${RECORD_PREFIX}_commands.txt"
  done
}

# GPU 0's process of pid $CUDA_PID in the /gpus answer in FILE, as JSON; null when it is not there.
cuda_process_in() {
  js_in "$1" 'b.gpus.find((g) => g.index === 0)?.processes.find((p) => p.pid === Number(a[0])) ?? null' "$CUDA_PID" 2>/dev/null || echo null
}

nvml_run() {
  local said nvml_source doctor_status doctor_detail readyz_code started waited expected differences nvml_process smi_process cuda_skip=''
  if ! start_service nvml; then
    check "nvml backend" FAIL "the service with NODECOMPUTE_BACKEND=nvml does not start: $WHY"
    NVML_NOTE="not compared (the service did not start)"
    return 0
  fi
  # The start log names the backend and its source: `GPU figures come from nvml (<source>): <why>`.
  said=$("$NODE" -e "
    for (const line of require('node:fs').readFileSync(process.argv[1], 'utf8').split('\n')) {
      try {
        const entry = JSON.parse(line);
        if (/^GPU figures come from /.test(entry.msg)) { process.stdout.write(entry.backend + '\t' + entry.source + '\t' + entry.msg); break; }
      } catch {}
    }
  " "$SERVICE_LOG" 2>/dev/null || true)
  nvml_source=$(cut -f 2 <<<"$said")
  http GET /doctor
  doctor_status=$(js 'b.checks.find((c) => c.name === "nvml")?.status ?? "missing"' 2>/dev/null || echo "HTTP-$STATUS")
  doctor_detail=$(js 'b.checks.find((c) => c.name === "nvml")?.detail ?? ""' 2>/dev/null || short "HTTP $STATUS: $BODY")
  if [ "$doctor_status" != ok ]; then
    # Not loadable at all, which /readyz says once the first snapshot has been tried: NVML is not
    # there to compare. Loaded but failing, while nvidia-smi answers, is a fault.
    started=$(now_ms)
    while :; do
      http GET /readyz
      readyz_code=$(js 'b.code ?? ""' 2>/dev/null || true)
      if [ -n "$readyz_code" ] || [ "$STATUS" = 200 ] || [ $(($(now_ms) - started)) -ge 10000 ]; then break; fi
      sleep 0.3
    done
    if [ "$readyz_code" = NODECOMPUTE_NVML_NOT_FOUND ]; then
      NVML_NOTE="not available"
      kill -TERM "$SERVICE_PID" 2>/dev/null || true
      wait "$SERVICE_PID" 2>/dev/null || true
      SERVICE_PID=''
      if [ "$REQUIRE_NVML" = 1 ]; then
        check "nvml backend" FAIL "NVML cannot be loaded, so it was not compared with nvidia-smi (--require-nvml): $doctor_detail"
      else
        check "nvml backend" INFO "NVML cannot be loaded, so only nvidia-smi was checked (NVML_LIBRARY names a library; --require-nvml makes this a FAIL): $doctor_detail"
      fi
      return 0
    fi
    NVML_NOTE="${nvml_source:-?} (loads, but does not answer)"
    check "nvml backend" FAIL "NVML loads but its doctor row is $doctor_status, while nvidia-smi answers: $(short "$doctor_detail")"
  elif [ "$(cut -f 1 <<<"$said")" != nvml ]; then
    NVML_NOTE="${nvml_source:-?}"
    check "nvml backend" FAIL "NODECOMPUTE_BACKEND=nvml, but the start log does not say the figures come from nvml: $(short "${said:-no such line}")"
  else
    NVML_NOTE=$nvml_source
    check "nvml backend" PASS "start log: $(cut -f 3 <<<"$said"); doctor: $doctor_detail"
  fi

  if [ -n "$SKIP_CUDA" ]; then
    cuda_skip="no CUDA process (see register smoke-gpu)"
  elif [ -n "$OTHER_PID_NS" ]; then
    cuda_skip="cannot pass outside the host's PID namespace (see host PID namespace)"
  elif [ -z "$CUDA_PID" ]; then
    cuda_skip="no CUDA process (see /gpus: CUDA pid on GPU 0)"
  fi

  # The shard reads ready as it did under nvidia-smi: the same process group, holding GPU 0 already.
  if [ -n "$cuda_skip" ]; then
    check "nvml: smoke-gpu ready" SKIP "$cuda_skip"
  else
    http PUT /shards/smoke-gpu "{\"pid\":$LEADER,\"gpus\":[0],\"engine\":\"other\"}"
    if [ "$STATUS" != 201 ]; then
      check "nvml: smoke-gpu ready" FAIL "registration: HTTP $STATUS: $(short "$BODY")"
    else
      SEEN=''
      STATE=''
      started=$(now_ms)
      until look_at_readiness; do
        [ $(($(now_ms) - started)) -lt $((READY_TIMEOUT_S * 1000)) ] || break
        sleep 0.5
      done
      waited=$((($(now_ms) - started) / 1000))
      expected='^(starting -> )?ready$'
      if [ "$STATE" = ready ] && [[ $SEEN =~ $expected ]]; then
        check "nvml: smoke-gpu ready" PASS "$SEEN after ${waited} s, as under nvidia-smi ($SMI_SEEN)"
      else
        check "nvml: smoke-gpu ready" FAIL "$SEEN (HTTP $READY_STATUS) after ${waited} s, under nvidia-smi $SMI_SEEN: $(short "$READY_REASON")"
      fi
    fi
  fi

  # /gpus: once it lists the CUDA process as smoke-gpu's (a snapshot may predate the registration).
  started=$(now_ms)
  while :; do
    http GET /gpus
    [ -n "$cuda_skip" ] && break
    [ "$(js '(b.gpus.find((g) => g.index === 0)?.processes ?? []).some((p) => p.pid === Number(a[0]) && p.shard === "smoke-gpu")' "$CUDA_PID" 2>/dev/null)" = true ] && break
    [ $(($(now_ms) - started)) -lt 10000 ] || break
    sleep 0.5
  done
  cp "$WORK/body" "$WORK/gpus-nvml.json" 2>/dev/null || : >"$WORK/gpus-nvml.json"
  record_nvml

  # The same GPUs (index, UUID), each with the same memory total.
  if [ "$SMI_GPUS_STATUS" != 200 ]; then
    check "nvml: /gpus same GPUs" FAIL "nothing to compare with: /gpus answered HTTP $SMI_GPUS_STATUS under nvidia-smi"
  elif [ "$STATUS" != 200 ]; then
    check "nvml: /gpus same GPUs" FAIL "HTTP $STATUS: $(short "$BODY")"
  else
    differences=$(js '(() => {
      const s = JSON.parse(require("node:fs").readFileSync(a[0], "utf8"));
      const list = (r) => r.gpus.map((g) => `GPU ${g.index} ${g.uuid}`).join(", ") || "no GPU";
      if (list(s) !== list(b)) return `nvidia-smi lists ${list(s)}; nvml lists ${list(b)}`;
      return s.gpus.flatMap((g, i) => {
        const [was, is] = [g.memory.totalMiB, b.gpus[i].memory.totalMiB];
        return was === is ? [] : [`GPU ${g.index}: memory total ${was} MiB under nvidia-smi, ${is} MiB under nvml`];
      }).join("; ");
    })()' "$WORK/gpus-nvidia-smi.json") || differences="cannot compare the two answers: $(short "$BODY")"
    if [ -z "$differences" ]; then
      check "nvml: /gpus same GPUs" PASS "$(js 'b.gpus.length') GPU(s), the same index, UUID and memory total as under nvidia-smi (GPU 0: $(js 'b.gpus.find((g) => g.index === 0)?.memory.totalMiB') MiB)"
    else
      check "nvml: /gpus same GPUs" FAIL "$differences"
    fi
  fi

  # The CUDA process on GPU 0, smoke-gpu's, with the same usedMiB as nvidia-smi said.
  if [ -n "$cuda_skip" ]; then
    check "nvml: CUDA pid on GPU 0" SKIP "$cuda_skip"
  else
    smi_process=$(cuda_process_in "$WORK/gpus-nvidia-smi.json")
    nvml_process=$(cuda_process_in "$WORK/gpus-nvml.json")
    if [ "$nvml_process" = null ]; then
      check "nvml: CUDA pid on GPU 0" FAIL "pid $CUDA_PID is not among GPU 0's processes (HTTP $STATUS): $(short "$(js 'b.gpus.find((g) => g.index === 0).processes' 2>/dev/null || printf '%s' "$BODY")")"
    elif [ "$(js_in "$WORK/gpus-nvml.json" 'b.gpus.find((g) => g.index === 0).processes.some((p) => p.pid === Number(a[0]) && p.shard === "smoke-gpu")' "$CUDA_PID")" != true ]; then
      check "nvml: CUDA pid on GPU 0" FAIL "listed but not attributed to smoke-gpu: $nvml_process"
    elif [ "$smi_process" = null ]; then
      check "nvml: CUDA pid on GPU 0" FAIL "nothing to compare with: nvidia-smi's last /gpus did not list pid $CUDA_PID on GPU 0; nvml: $nvml_process"
    else
      differences=$("$NODE" -e "
        const [s, n] = process.argv.slice(1).map((j) => JSON.parse(j));
        if (s.usedMiB !== n.usedMiB) process.stdout.write('usedMiB ' + s.usedMiB + ' under nvidia-smi, ' + n.usedMiB + ' under nvml');
      " "$smi_process" "$nvml_process")
      if [ -z "$differences" ]; then
        check "nvml: CUDA pid on GPU 0" PASS "the same usedMiB as under nvidia-smi: $nvml_process"
      else
        check "nvml: CUDA pid on GPU 0" FAIL "pid $CUDA_PID on GPU 0: $differences"
      fi
    fi
  fi

  doctor nvml
  stop_service "nvml: service stops on SIGTERM"
}

nvml_run
finish
