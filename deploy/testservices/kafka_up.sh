#!/usr/bin/env bash
# Start a real single-broker Apache Kafka 4.x (KRaft, broker+controller in one JVM) on
# 127.0.0.1 for gpuops tests (shared/DESIGN.md, "Test services").
#
# Usage: deploy/testservices/kafka_up.sh
#   then: export GPUOPS_TEST_KAFKA=127.0.0.1:19092     (the last line it prints)
# Stop:  deploy/testservices/kafka_down.sh [--purge]
#
# Environment (all optional):
#   KAFKA_ROOT             state, config, logs, pid file      (default /tmp/gpuops-kafka)
#   GPUOPS_CACHE           jar cache, outside the repository  (default $HOME/.cache/gpuops)
#   KAFKA_PORT             broker listener port               (default 19092)
#   KAFKA_CONTROLLER_PORT  KRaft controller listener port     (default 19093)
#   KAFKA_VERSION          org.apache.kafka:kafka_2.13 version (default: the one in pom.xml)
#   KAFKA_HEAP_OPTS        JVM heap flags                     (default -Xms128m -Xmx512m)
#   KAFKA_START_TIMEOUT_S  how long to wait for the broker    (default 90)
#   SKIP_APT=1             never apt-get install java/maven
#
# Idempotent: if the broker from $KAFKA_ROOT is already running it only prints the export.
# The jars come from Maven Central once (`mvn dependency:copy-dependencies` on pom.xml next
# to this script) into $GPUOPS_CACHE/kafka/lib; later starts skip Maven.
set -euo pipefail
T0=$(date +%s%N)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
KAFKA_ROOT=${KAFKA_ROOT:-/tmp/gpuops-kafka}
GPUOPS_CACHE=${GPUOPS_CACHE:-$HOME/.cache/gpuops}
KAFKA_PORT=${KAFKA_PORT:-19092}
KAFKA_CONTROLLER_PORT=${KAFKA_CONTROLLER_PORT:-19093}
KAFKA_HEAP_OPTS=${KAFKA_HEAP_OPTS:--Xms128m -Xmx512m}
KAFKA_START_TIMEOUT_S=${KAFKA_START_TIMEOUT_S:-90}
LIB=$GPUOPS_CACHE/kafka/lib
PIDFILE=$KAFKA_ROOT/kafka.pid
LOG=$KAFKA_ROOT/log/server.log
BOOTSTRAP=127.0.0.1:$KAFKA_PORT

ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
log() { printf '[kafka_up +%6sms] %s\n' "$(ms "$T0")" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# our broker: the pid file names a live JVM running kafka.Kafka (guards against pid reuse)
our_broker_pid() {
  local p cmd
  [[ -f $PIDFILE ]] || return 1
  p=$(<"$PIDFILE")
  [[ $p =~ ^[0-9]+$ ]] && [[ -r /proc/$p/cmdline ]] || return 1
  cmd=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null) || return 1
  [[ $cmd == *kafka.Kafka* ]] || return 1
  echo "$p"
}

# ---- 0. already up? ---------------------------------------------------------------
if pid=$(our_broker_pid) && port_open "$KAFKA_PORT"; then
  log "already running (pid $pid) on $BOOTSTRAP"
  echo "export GPUOPS_TEST_KAFKA=$BOOTSTRAP"
  exit 0
fi
if pid=$(our_broker_pid); then
  die "broker pid $pid from $PIDFILE is alive but $BOOTSTRAP does not accept connections; run kafka_down.sh"
fi
rm -f "$PIDFILE"
for p in "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT"; do
  port_open "$p" && die "port $p is taken by another process (set KAFKA_PORT / KAFKA_CONTROLLER_PORT)"
done

# ---- 1. java + maven (idempotent) --------------------------------------------------
if [[ "${SKIP_APT:-0}" != 1 ]] && { ! command -v java || ! command -v mvn; } >/dev/null 2>&1; then
  log "installing java + maven with apt"
  export DEBIAN_FRONTEND=noninteractive
  [[ -n "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -print -quit)" ]] || apt-get update -qq
  apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless maven >/dev/null
fi
command -v java >/dev/null || die "java not found"

# ---- 2. jars (Maven once, then the cache) ------------------------------------------
# The stamp records what the cache was built from: pom.xml + requested version.
want_stamp="$(sha256sum "$HERE/pom.xml" | cut -d' ' -f1) ${KAFKA_VERSION:-pom}"
if [[ ! -f $LIB/.complete ]] || [[ $(<"$LIB/.complete") != "$want_stamp" ]]; then
  command -v mvn >/dev/null || die "mvn not found (needed once to fetch the Kafka jars)"
  log "fetching Kafka jars with Maven into $LIB"
  tmp=$(mktemp -d "$GPUOPS_CACHE/kafka-lib.XXXXXX" 2>/dev/null || { mkdir -p "$GPUOPS_CACHE" && mktemp -d "$GPUOPS_CACHE/kafka-lib.XXXXXX"; })
  mvn_args=(-q -B -Dstyle.color=never -f "$HERE/pom.xml" dependency:copy-dependencies "-DoutputDirectory=$tmp")
  [[ -n ${KAFKA_VERSION:-} ]] && mvn_args+=("-Dkafka.version=$KAFKA_VERSION")
  if ! mvn "${mvn_args[@]}" >&2; then rm -rf "$tmp"; die "maven could not fetch the Kafka jars"; fi
  echo "$want_stamp" >"$tmp/.complete"
  mkdir -p "$(dirname "$LIB")"
  rm -rf "$LIB"
  mv "$tmp" "$LIB"          # whole directory at once: a half-fetched cache is never used
  log "jars cached ($(find "$LIB" -name '*.jar' | wc -l) jars)"
fi
T_JARS=$(date +%s%N)

# ---- 3. config ------------------------------------------------------------------------
mkdir -p "$KAFKA_ROOT"/{data,log}
cat >"$KAFKA_ROOT/server.properties" <<CONF
# written by deploy/testservices/kafka_up.sh: single-node KRaft broker for tests
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$KAFKA_ROOT/data
# tests: topics appear on first use, 4 partitions so per-key ordering is exercised
auto.create.topics.enable=true
delete.topic.enable=true
num.partitions=4
default.replication.factor=1
min.insync.replicas=1
# one broker: every internal topic has one replica; few partitions for a fast first use
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
# consumer groups form at once instead of waiting 3 s for more members
group.initial.rebalance.delay.ms=0
# a 2-core CI machine: few threads, small segments, short retention
num.network.threads=2
num.io.threads=4
log.segment.bytes=67108864
log.retention.hours=24
CONF
cat >"$KAFKA_ROOT/log4j2.properties" <<CONF
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = $LOG
appender.file.append = false
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
CONF

# ---- 4. format storage once ------------------------------------------------------------
if [[ ! -f $KAFKA_ROOT/data/meta.properties ]]; then
  # a Kafka cluster id is 16 random bytes, URL-safe base64 without padding; one that starts
  # with '-' (1 in 64) reads as an option to kafka-storage ("--cluster-id expected one
  # argument"), so draw again, as Kafka's own Uuid.randomUuid does
  cluster_id=-
  while [[ $cluster_id == -* ]]; do
    cluster_id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | cut -c1-22)
  done
  java -Xmx256m -Dlog4j2.configurationFile="$KAFKA_ROOT/log4j2.properties" -cp "$LIB/*" \
    kafka.tools.StorageTool format -t "$cluster_id" -c "$KAFKA_ROOT/server.properties" \
    >"$KAFKA_ROOT/log/format.log" 2>&1 || { cat "$KAFKA_ROOT/log/format.log" >&2; die "storage format failed"; }
  log "storage formatted (cluster id $cluster_id)"
fi
T_FMT=$(date +%s%N)

# ---- 5. start the broker -----------------------------------------------------------------
# shellcheck disable=SC2086  # KAFKA_HEAP_OPTS is a list of flags
nohup java $KAFKA_HEAP_OPTS -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
  -Dlog4j2.configurationFile="$KAFKA_ROOT/log4j2.properties" -Dkafka.logs.dir="$KAFKA_ROOT/log" \
  -cp "$LIB/*" kafka.Kafka "$KAFKA_ROOT/server.properties" \
  </dev/null >"$KAFKA_ROOT/log/stdout.log" 2>&1 &
pid=$!
echo "$pid" >"$PIDFILE"
log "started broker pid $pid; waiting up to ${KAFKA_START_TIMEOUT_S}s"

# ---- 6. wait until it serves (deadline, not a fixed sleep) ----------------------------------
deadline=$(( $(date +%s) + KAFKA_START_TIMEOUT_S ))
ready=0
while (( $(date +%s) < deadline )); do
  if ! kill -0 "$pid" 2>/dev/null; then
    tail -30 "$KAFKA_ROOT/log/stdout.log" "$LOG" >&2 2>/dev/null || true
    rm -f "$PIDFILE"
    die "broker exited during start-up (logs in $KAFKA_ROOT/log)"
  fi
  # "Kafka Server started" is logged once the broker is registered and unfenced
  if port_open "$KAFKA_PORT" && [[ -f $LOG ]] && [[ $(<"$LOG") == *"Kafka Server started"* ]]; then
    ready=1; break
  fi
  sleep 0.1
done
if [[ $ready != 1 ]]; then
  tail -30 "$LOG" >&2 2>/dev/null || true
  die "broker not ready after ${KAFKA_START_TIMEOUT_S}s (pid $pid still running; stop it with kafka_down.sh)"
fi
log "ready on $BOOTSTRAP: jars $(( (T_JARS-T0)/1000000 ))ms, format $(( (T_FMT-T_JARS)/1000000 ))ms, broker $(ms "$T_FMT")ms, total $(ms "$T0")ms"
echo "export GPUOPS_TEST_KAFKA=$BOOTSTRAP"
