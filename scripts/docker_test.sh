#!/usr/bin/env bash
# make docker-test: build both images from docker/ (Dockerfiles as they are), bring docker/compose.yaml
# up, check the deployment through its containers only (tests/docker), then take it down with its
# volumes. docker/README.md ("Run it for real") says what each step does and why.
#
#   DOCKER_TEST_IMAGES=standins (default)  base images built here (docker/standins/), for machines
#                                          that cannot pull from a registry
#   DOCKER_TEST_IMAGES=real                the real base images, pulled
#   DOCKER_TEST_KEEP=1                     leave the deployment up (and the engine running) afterwards
#
# Without a running Docker engine it starts Debian's dockerd for the run and stops it afterwards,
# with its iptables handling off (it would set the FORWARD policy to DROP, cutting the namespaced
# hosts of the multi-host tests), and puts the FORWARD policy and bridge netfilter back as found.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
IMAGES=${DOCKER_TEST_IMAGES:-standins}
PROJECT=airflow-provider-horovod
WORK=$ROOT/.build/docker-test
# Debian's docker.io CLI: its built-in BuildKit needs no buildx plugin (COPY --chmod needs BuildKit).
DOCKER=${DOCKER:-docker}
[ -x /usr/bin/docker ] && DOCKER=/usr/bin/docker
export DOCKER_BUILDKIT=1
# The example's training lasts less than a minute: deferred sooner, the triggerer's tests have it to restart.
export AHP_DEFER_AFTER_SECONDS=${AHP_DEFER_AFTER_SECONDS:-10}
mkdir -p "$WORK"
log() { printf '[docker-test %(%H:%M:%S)T] %s\n' -1 "$*"; }

# --- the engine -----------------------------------------------------------------------------------
started_engine=""
forward_policy="" bridge_nf4="" bridge_nf6=""
record_host() {
  forward_policy=$(iptables -S FORWARD 2>/dev/null | awk '$1 == "-P" {print $3}' || true)
  bridge_nf4=$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null || true)
  bridge_nf6=$(cat /proc/sys/net/bridge/bridge-nf-call-ip6tables 2>/dev/null || true)
}
restore_host() {
  if [ -n "$forward_policy" ] && [ "$(iptables -S FORWARD | awk '$1 == "-P" {print $3}')" != "$forward_policy" ]; then
    iptables -P FORWARD "$forward_policy"
  fi
  [ -n "$bridge_nf4" ] && echo "$bridge_nf4" > /proc/sys/net/bridge/bridge-nf-call-iptables
  [ -n "$bridge_nf6" ] && echo "$bridge_nf6" > /proc/sys/net/bridge/bridge-nf-call-ip6tables
  return 0
}
start_engine() { # start_engine NICENESS
  if [ -z "$started_engine" ] && $DOCKER info > /dev/null 2>&1; then
    log "using the running Docker engine"
    return
  fi
  [ "$(id -u)" = 0 ] || { echo "no Docker engine running, and starting one needs root" >&2; exit 1; }
  local missing=()
  command -v dockerd > /dev/null || missing+=(docker.io)
  command -v docker-compose > /dev/null || $DOCKER compose version > /dev/null 2>&1 || missing+=(docker-compose)
  command -v iptables > /dev/null || missing+=(iptables)
  [ "$IMAGES" = standins ] && ! command -v mmdebstrap > /dev/null && missing+=(mmdebstrap)
  if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]}"
    # policy-rc.d keeps the package from starting dockerd with its defaults.
    local policy=/usr/sbin/policy-rc.d added_policy=""
    if [ ! -e $policy ]; then printf '#!/bin/sh\nexit 101\n' > $policy && chmod 755 $policy && added_policy=1; fi
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" > "$WORK/apt.log"
    if [ -n "$added_policy" ]; then rm -f $policy; fi
  fi
  [ -n "$forward_policy$bridge_nf4" ] || record_host
  log "starting dockerd at nice $1 (no iptables rules, no IP forwarding: builds use the host's network)"
  # Addresses away from the 10.x networks of the namespaced hosts.
  nice -n "$1" dockerd --iptables=false --ip-forward=false --ip-masq=false \
    --bip 172.31.0.1/24 --default-address-pool base=172.30.0.0/16,size=24 \
    --pidfile "$WORK/dockerd.pid" > "$WORK/dockerd.log" 2>&1 &
  started_engine=$!
  for _ in $(seq 60); do
    $DOCKER info > /dev/null 2>&1 && return
    sleep 1
  done
  echo "dockerd did not start: $WORK/dockerd.log" >&2
  exit 1
}
stop_engine() {
  if [ -n "$started_engine" ]; then
    log "stopping dockerd"
    kill "$started_engine" 2> /dev/null || true
    for _ in $(seq 60); do kill -0 "$started_engine" 2> /dev/null || break; sleep 1; done
    started_engine=""
    # dockerd leaves its default bridge behind.
    ip link del docker0 2> /dev/null || true
  fi
}

# --- compose --------------------------------------------------------------------------------------
# Compose v2 (`docker compose`) reads compose.yaml as it is. Debian 12 has only compose v1
# (docker-compose 1.29), which does not know the top-level `name`: it gets a copy without that line
# and the same project name with -p.
compose_file=$ROOT/docker/compose.yaml
if $DOCKER compose version > /dev/null 2>&1; then
  COMPOSE=("$DOCKER" compose -p "$PROJECT" -f "$compose_file")
else
  grep -v '^name:' "$compose_file" > "$ROOT/docker/.compose-v1.yaml"
  COMPOSE=(docker-compose -p "$PROJECT" -f "$ROOT/docker/.compose-v1.yaml")
fi

finish() {
  local status=$?
  if [ "${DOCKER_TEST_KEEP:-}" = 1 ]; then
    log "left up (DOCKER_TEST_KEEP=1): ${COMPOSE[*]} down -v; then stop dockerd (pid ${started_engine:-none})"
    exit $status
  fi
  if $DOCKER info > /dev/null 2>&1; then
    "${COMPOSE[@]}" logs --no-color > "$WORK/compose.log" 2>&1 || true
    "${COMPOSE[@]}" down -v --remove-orphans > /dev/null 2>&1 || true
  fi
  rm -f "$ROOT/docker/.compose-v1.yaml"
  stop_engine
  restore_host
  exit $status
}

# The builds run in the engine (BuildKit), so the engine's priority is theirs: nice 10 on shared
# cores. The deployment then runs at normal priority (an engine started afresh), or its health
# checks time out on a busy machine.
start_engine 10
trap finish EXIT

# --- images ---------------------------------------------------------------------------------------
build() { # build TAG FILE CONTEXT [ARGS...]: one timed image build, at low priority
  local tag=$1 file=$2 context=$3
  shift 3
  local t0=$SECONDS
  nice -n 10 $DOCKER build --progress=plain "${NETWORK[@]}" -t "$tag" -f "$file" "$@" "$context" \
    > "$WORK/build-${tag//[\/:]/_}.log" 2>&1 || { tail -40 "$WORK/build-${tag//[\/:]/_}.log"; return 1; }
  log "built $tag in $((SECONDS - t0)) s"
}
NETWORK=()
if [ "$IMAGES" = standins ]; then
  # Without Docker's NAT a build reaches the package indexes through the host's network.
  NETWORK=(--network host)
  if ! $DOCKER image inspect ahp-standins/debian:bookworm > /dev/null 2>&1; then
    log "making the Debian 12 base (mmdebstrap)"
    nice -n 10 mmdebstrap --quiet --variant=minbase \
      --include=python3.11,python3-venv,python3-pip,ca-certificates,curl,procps,dumb-init,netbase \
      bookworm "$WORK/base.tar" http://deb.debian.org/debian
    $DOCKER import "$WORK/base.tar" ahp-standins/debian:bookworm > /dev/null
    rm -f "$WORK/base.tar"
  fi
  # The stand-ins' build context: their files, this machine's CA bundle, the CPU torch wheel, and
  # the Airflow side's versions as constraints (the official image installs with Airflow's own).
  context=$WORK/standins
  rm -rf "$context" && mkdir -p "$context/wheels"
  cp docker/standins/* "$context/"
  cp /etc/ssl/certs/ca-certificates.crt "$context/"
  torch_wheel=$(ls "${AHP_TORCH_WHEELS:-/opt/wheels}"/torch-2.13.0+cpu-cp311-*.whl | head -1)
  ln "$torch_wheel" "$context/wheels/" 2> /dev/null || cp "$torch_wheel" "$context/wheels/"
  .venv-airflow/bin/python -m pip freeze --exclude-editable | grep -v ' @ ' > "$context/constraints-airflow.txt"
  build python:3.11-slim "$context/python.Dockerfile" "$context"
  build postgres:16 "$context/postgres.Dockerfile" "$context"
  minio=$(awk '$1 == "image:" && $2 ~ /^minio\/minio:/ {print $2}' docker/compose.yaml)
  mc=$(awk '$1 == "image:" && $2 ~ /^minio\/mc:/ {print $2}' docker/compose.yaml)
  build "$minio" "$context/minio.Dockerfile" "$context" --target minio
  build "$mc" "$context/minio.Dockerfile" "$context" --target mc
  build apache/airflow:3.3.2-python3.11 "$context/airflow.Dockerfile" "$context"
  build rayproject/ray:2.60.0-py311-cpu "$context/ray.Dockerfile" "$context"
fi
# The project's images, as compose.yaml builds them (same files, context and tags).
build airflow-provider-horovod/airflow:3.3.2 docker/airflow.Dockerfile .
build airflow-provider-horovod/ray:cpu docker/ray.Dockerfile . --build-arg VARIANT=cpu

# --- the deployment -------------------------------------------------------------------------------
if [ -n "$started_engine" ]; then
  stop_engine
  start_engine 0
fi
mkdir -p docker/secrets
[ -s docker/secrets/ray_token ] || python3 -c "import secrets; print(secrets.token_hex(32))" > docker/secrets/ray_token
[ -s docker/secrets/airflow_jwt_secret ] ||
  python3 -c "import secrets; print(secrets.token_urlsafe(64))" > docker/secrets/airflow_jwt_secret
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'; }
# Published on free ports: this machine's own tests may hold 8080 or 8265.
AIRFLOW_PORT=$(free_port) RAY_DASHBOARD_PORT=$(free_port) MINIO_CONSOLE_PORT=$(free_port)
export AIRFLOW_PORT RAY_DASHBOARD_PORT MINIO_CONSOLE_PORT
log "compose up (Airflow on :$AIRFLOW_PORT, Ray dashboard on :$RAY_DASHBOARD_PORT)"
# compose gives up on a dependency found unhealthy; one that was only slow to start (the api-server
# on busy cores) is healthy by the next try, which goes on from there.
for try in 1 2 3; do
  "${COMPOSE[@]}" up -d --no-build > "$WORK/compose-up.log" 2>&1 && break
  [ "$try" = 3 ] && { cat "$WORK/compose-up.log"; exit 1; }
  log "compose up: $(grep -m1 ERROR "$WORK/compose-up.log" || tail -1 "$WORK/compose-up.log"); trying again"
  sleep 30
done

# The checks, from Airflow's environment (pytest, httpx); they reach the deployment through the
# published ports and `compose exec` only.
export DOCKER_TEST_COMPOSE="${COMPOSE[*]}" DOCKER_TEST_PROJECT=$PROJECT DOCKER_TEST_DOCKER=$DOCKER
.venv-airflow/bin/pytest -p no:cacheprovider -q -x --timeout=1800 tests/docker "$@"
