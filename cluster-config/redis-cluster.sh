#!/usr/bin/env bash
# A local Redis Cluster to try things on: three masters and three replicas
# on 127.0.0.1 (ports $TAILRACE_REDIS_CLUSTER_PORT .. +5, default 7000-7005;
# each also uses its port + 10000 for the cluster bus), append-only files
# synced on every write, a node timeout of 1 s (a killed master's replica
# takes over within a few seconds).
#
#   cluster-config/redis-cluster.sh          start the six servers and join them
#   cluster-config/redis-cluster.sh status   what each node serves
#   cluster-config/redis-cluster.sh stop     stop them (data is kept; delete
#                                            $TAILRACE_RUN_DIR to start anew)
#
# Data, pids and logs go to $TAILRACE_RUN_DIR (default: run/redis-cluster).
# Needs redis-server and redis-cli (Debian: redis-server, redis-tools).
#
# To run the nodes on it, give each node's config (e.g. node-1.toml)
#   [adapters.redis]  url = "redis://127.0.0.1:7000", cluster = true,
#                     wait_replicas = 1
#   [archive]         redis_url = "redis://127.0.0.1:7000"
# (any of the six ports is a seed; see docs/operations.md, "Running on a
# Redis Cluster", for what wait_replicas costs during a failover).
set -euo pipefail

run="${TAILRACE_RUN_DIR:-run/redis-cluster}"
first="${TAILRACE_REDIS_CLUSTER_PORT:-7000}"
ports=$(seq "$first" $((first + 5)))

stop() {
    for port in $ports; do
        if redis-cli -p "$port" ping >/dev/null 2>&1; then
            echo "stopping 127.0.0.1:$port"
            redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
        fi
    done
}

status() {
    redis-cli -p "$first" cluster info | grep -E 'cluster_state|cluster_slots_ok|cluster_known_nodes'
    redis-cli -p "$first" cluster nodes | awk '{print $2, $3, $9}'
}

start() {
    for port in $ports; do
        if redis-cli -p "$port" ping >/dev/null 2>&1; then
            echo "127.0.0.1:$port already answers"
            continue
        fi
        mkdir -p "$run/$port"
        redis-server --bind 127.0.0.1 --port "$port" --cluster-enabled yes \
            --cluster-config-file nodes.conf --cluster-node-timeout 1000 \
            --appendonly yes --appendfsync always --save "" \
            --dir "$run/$port" --logfile redis.log --daemonize yes \
            --pidfile "$(cd "$run/$port" && pwd)/redis.pid"
    done
    for port in $ports; do
        for _ in $(seq 1 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
    done
    if redis-cli -p "$first" cluster info | grep -q 'cluster_state:ok'; then
        echo "the cluster is already formed"
    else
        # shellcheck disable=SC2046
        redis-cli --cluster create $(for p in $ports; do printf '127.0.0.1:%s ' "$p"; done) \
            --cluster-replicas 1 --cluster-yes >/dev/null
        for _ in $(seq 1 200); do
            redis-cli -p "$first" cluster info | grep -q 'cluster_state:ok' && break
            sleep 0.1
        done
    fi
    status
    echo "seeds: $(for p in $ports; do printf 'redis://127.0.0.1:%s ' "$p"; done)"
}

case "${1:-start}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: $0 [start|status|stop]" >&2; exit 2 ;;
esac
