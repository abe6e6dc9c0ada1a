#!/usr/bin/env bash
# A local three-node cluster on one Redis: cluster-config/node-{1,2,3}.toml.
#
#   cluster-config/local-3.sh         start redis-server on 127.0.0.1:6379 if
#                                     none answers there, then the three nodes
#                                     in the background (edges on :8581-8583)
#   cluster-config/local-3.sh stop    stop the nodes with SIGTERM (a graceful
#                                     leave) and the redis-server it started
#
# Pids and logs go to $TAILRACE_RUN_DIR (default: run/local-3). The binary is
# $TAILRACE_BIN, else `tailrace` on the PATH, else the newer of
# target/release/tailrace (what the README's `cargo run --release` builds)
# and target/debug/tailrace.
# The nodes authenticate each other with $TAILRACE_COOKIE; without it, a
# random cookie is made once and kept in $TAILRACE_RUN_DIR/cookie.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
run="${TAILRACE_RUN_DIR:-run/local-3}"
built() {
    local release="$here/../target/release/tailrace" debug="$here/../target/debug/tailrace"
    if [ -x "$release" ] && { [ ! -x "$debug" ] || [ "$release" -nt "$debug" ]; }; then echo "$release"; else echo "$debug"; fi
}
bin="${TAILRACE_BIN:-$(command -v tailrace || built)}"
mkdir -p "$run"

redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; }

stop() {
    for pidfile in "$run"/node-*.pid "$run"/redis.pid; do
        [ -e "$pidfile" ] || continue
        pid="$(cat "$pidfile")"
        if kill -TERM "$pid" 2>/dev/null; then
            echo "stopping $(basename "$pidfile" .pid) (pid $pid)"
            for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        fi
        rm -f "$pidfile"
    done
}

start() {
    if ! redis_up; then
        echo "starting redis-server on 127.0.0.1:6379 (data in $run)"
        # fsync before every reply: a crash loses no acknowledged write.
        redis-server --port 6379 --bind 127.0.0.1 --appendonly yes --appendfsync always --dir "$run" \
            --daemonize no >"$run/redis.log" 2>&1 &
        echo $! >"$run/redis.pid"
        for _ in $(seq 1 100); do redis_up && break; sleep 0.1; done
        redis_up || { echo "redis-server did not start: see $run/redis.log" >&2; exit 1; }
    fi
    if [ -z "${TAILRACE_COOKIE:-}" ]; then
        if [ ! -s "$run/cookie" ]; then
            (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$run/cookie")
        fi
        TAILRACE_COOKIE="$(cat "$run/cookie")"
    fi
    export TAILRACE_COOKIE
    for n in 1 2 3; do
        if [ -e "$run/node-$n.pid" ] && kill -0 "$(cat "$run/node-$n.pid")" 2>/dev/null; then
            echo "node-$n already runs (pid $(cat "$run/node-$n.pid"))"
            continue
        fi
        "$bin" node --config "$here/node-$n.toml" >"$run/node-$n.log" 2>&1 &
        echo $! >"$run/node-$n.pid"
        echo "node-$n: pid $!, edge http://127.0.0.1:858$n/ (log $run/node-$n.log)"
    done
    echo "cluster: curl http://127.0.0.1:8581/api/v1/admin/cluster; stop: $0 stop"
}

case "${1:-start}" in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 [start|stop]" >&2; exit 2 ;;
esac
