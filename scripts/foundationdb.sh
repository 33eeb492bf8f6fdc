# FoundationDB for the test scripts, sourced by scripts/test and
# scripts/test-foundationdb (never run on its own): finding a distribution
# (a system install, else the archive in ../shared/foundationdb, unpacked
# once under target/foundationdb/), starting a throw-away, single-process
# fdbserver on a free loopback port, and the idem-bench smoke runs.
#
#   IDEM_FDB_STORAGE_ENGINE=memory   storage engine of the test database (ssd by default)
#   IDEM_FDB_ARCHIVE=path            another FoundationDB archive of the same version
# Nothing is installed system-wide: the library path is given to the linker
# (LIBRARY_PATH) and to the test processes (LD_LIBRARY_PATH) by
# use_client_library only. LIBRARY_PATH, unlike RUSTFLAGS, does not
# invalidate cargo's build cache.

FDB_VERSION=7.3.79
FDB_ARCHIVE="${IDEM_FDB_ARCHIVE:-../shared/foundationdb/foundationdb-${FDB_VERSION}-linux-x86_64.tar.xz}"
FDB_UNPACKED="${CARGO_TARGET_DIR:-target}/foundationdb"
STORAGE_ENGINE="${IDEM_FDB_STORAGE_ENGINE:-ssd}"
# Ports from 32768 up are Linux's default ephemeral range, where outgoing
# connections could take the port between our check and fdbserver's bind.
PORT_MIN=20000
PORT_MAX=32767
PORT_TRIES=50
# How long the new database may take to report itself available.
AVAILABLE_WAIT_S_MAX=60
# How long fdbcli may take to create it: on a loaded machine (a shared
# runner, other builds) 30 s were not always enough.
CONFIGURE_TIMEOUT_S=60

started_at=$SECONDS

skip() {
    {
        echo
        echo "################################################################################"
        echo "## FOUNDATIONDB SUITES SKIPPED: NOT RUN, NOT PASSED"
        echo "## $1"
        echo "## Neither a system install (fdbserver and fdbcli on PATH, libfdb_c.so where"
        echo "## the linker finds it) nor the archive $FDB_ARCHIVE was found."
        echo "## See store-fdb/FOUNDATIONDB.md, \"What this repository checks\"."
        echo "################################################################################"
        echo
    } >&2
    exit 0
}

system_lib_dir() {
    local dir
    for dir in /usr/lib /usr/lib64 /usr/local/lib /usr/lib/x86_64-linux-gnu; do
        [ -e "$dir/libfdb_c.so" ] && { echo "$dir"; return 0; }
    done
    return 1
}

# Sets FDB_BIN_DIR and FDB_LIB_DIR; returns 1 when there is no distribution.
find_distribution() {
    if command -v fdbserver >/dev/null && command -v fdbcli >/dev/null && FDB_LIB_DIR=$(system_lib_dir); then
        FDB_BIN_DIR=$(dirname "$(command -v fdbserver)")
        echo "FoundationDB: system install ($FDB_BIN_DIR, $FDB_LIB_DIR)"
        return 0
    fi
    local root="$FDB_UNPACKED/foundationdb-$FDB_VERSION"
    if [ ! -x "$root/bin/fdbserver" ]; then
        [ -f "$FDB_ARCHIVE" ] || return 1
        echo "FoundationDB: unpacking $FDB_ARCHIVE into $FDB_UNPACKED"
        mkdir -p "$FDB_UNPACKED"
        # Unpack beside the final place and move it there, so an interrupted
        # unpack is never mistaken for a complete one.
        local partial
        partial=$(mktemp -d "$FDB_UNPACKED/unpacking.XXXXXX")
        tar -xJf "$FDB_ARCHIVE" -C "$partial"
        rm -rf "$root"
        mv "$partial/foundationdb-$FDB_VERSION" "$root"
        rmdir "$partial"
    fi
    FDB_BIN_DIR=$(cd "$root/bin" && pwd)
    FDB_LIB_DIR=$(cd "$root/lib" && pwd)
    echo "FoundationDB: $FDB_VERSION from the archive ($FDB_BIN_DIR)"
}

port_is_free() {
    if command -v python3 >/dev/null; then
        python3 -c 'import socket, sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)' "$1"
    else
        ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
    fi
}

pick_port() {
    local try port
    for ((try = 0; try < PORT_TRIES; try++)); do
        port=$((PORT_MIN + RANDOM % (PORT_MAX - PORT_MIN + 1)))
        port_is_free "$port" && { echo "$port"; return 0; }
    done
    echo "no free loopback port in $PORT_MIN-$PORT_MAX after $PORT_TRIES tries" >&2
    return 1
}

fdbcli() {
    "$FDB_BIN_DIR/fdbcli" -C "$CLUSTER_FILE" "$@"
}

server_pid=""
work_dir=""
stop_server() {
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    [ -z "$work_dir" ] || rm -rf "$work_dir"
}

start_server() {
    work_dir=$(mktemp -d "${TMPDIR:-/tmp}/idem-fdb.XXXXXX")
    trap stop_server EXIT
    trap 'exit 130' INT TERM
    local port
    port=$(pick_port)
    CLUSTER_FILE="$work_dir/fdb.cluster"
    echo "idemtest:$(printf '%08x' $((RANDOM * RANDOM)))@127.0.0.1:$port" >"$CLUSTER_FILE"
    mkdir "$work_dir/data" "$work_dir/logs"
    "$FDB_BIN_DIR/fdbserver" -p "127.0.0.1:$port" -C "$CLUSTER_FILE" \
        -d "$work_dir/data" -L "$work_dir/logs" >"$work_dir/fdbserver.out" 2>&1 &
    server_pid=$!
    echo "fdbserver: pid $server_pid on 127.0.0.1:$port, storage engine $STORAGE_ENGINE, in $work_dir"
    fdbcli --exec "configure new single $STORAGE_ENGINE" --timeout "$CONFIGURE_TIMEOUT_S" || {
        cat "$work_dir/fdbserver.out" >&2
        echo "fdbcli could not configure the new database (fdbserver output above)" >&2
        return 1
    }
    wait_until_available
    export FDB_CLUSTER_FILE="$CLUSTER_FILE"
}

wait_until_available() {
    local deadline=$((SECONDS + AVAILABLE_WAIT_S_MAX)) status=""
    while ((SECONDS < deadline)); do
        kill -0 "$server_pid" 2>/dev/null || {
            cat "$work_dir/fdbserver.out" >&2
            echo "fdbserver exited before the database became available" >&2
            return 1
        }
        status=$(fdbcli --exec "status minimal" --timeout 5 2>&1 || true)
        if [[ $status == *"The database is available"* ]]; then
            echo "fdbserver: database available after $((SECONDS - started_at)) s"
            return 0
        fi
        sleep 1
    done
    echo "the database was not available within $AVAILABLE_WAIT_S_MAX s; last status: $status" >&2
    return 1
}

# The client library for the linker and the test processes.
use_client_library() {
    export LIBRARY_PATH="$FDB_LIB_DIR${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export LD_LIBRARY_PATH="$FDB_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

run_suites() {
    local targets=() file
    for file in store-fdb/tests/*_foundationdb.rs; do
        targets+=(--test "$(basename "$file" .rs)")
    done
    use_client_library
    local phase_started=$SECONDS
    echo "== store-fdb on FoundationDB"
    if cargo nextest --version >/dev/null 2>&1; then
        cargo nextest run -p store-fdb --features foundationdb --locked --no-fail-fast "${targets[@]}"
    else
        cargo test -p store-fdb --features foundationdb --locked --no-fail-fast "${targets[@]}"
    fi
    echo "== store-fdb on FoundationDB: $((SECONDS - phase_started)) s"
    phase_started=$SECONDS
    # The server's FoundationDB tests only: its other tests ran in
    # scripts/test, on a build without the feature. Their names all say
    # foundationdb (a module `foundationdb` in the HTTP suite, a suffix in
    # the reliability suite).
    echo "== server on FoundationDB"
    # The reliability tests' figures (RELIABILITY lines) are shown even when
    # they pass.
    if cargo nextest --version >/dev/null 2>&1; then
        # Both runs, even if the first fails.
        local failed=0
        cargo nextest run -p server --features foundationdb --locked --no-fail-fast \
            --test http -E 'test(/foundationdb/)' || failed=1
        cargo nextest run -p server --features foundationdb --locked --no-fail-fast \
            --test reliability -E 'test(/foundationdb/)' --success-output final || failed=1
        ((failed == 0)) || return 1
    else
        cargo test -p server --features foundationdb --locked --no-fail-fast \
            --test http --test reliability -- foundationdb --nocapture
    fi
    echo "== server on FoundationDB: $((SECONDS - phase_started)) s"
}

# Runs target/debug/idem-bench and target/debug/server, built with their
# `foundationdb` features by the caller.
bench_smoke() {
    local phase_started=$SECONDS report_dir
    echo "== idem-bench on FoundationDB (smoke, not a measurement)"
    report_dir="$work_dir/bench"
    mkdir "$report_dir"
    "${CARGO_TARGET_DIR:-target}/debug/idem-bench" store --backend foundationdb --rate 100 --duration-s 2 --warmup-s 1 \
        --saturate-s 1 --saturate-rounds 1 --concurrency 4 --json "$report_dir/store.json"
    # Store mode exits 0 whatever its outcomes: every intent must be a first
    # run, every baseline pair committed.
    python3 - "$report_dir/store.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
[run] = report["store"]
loads = [run["open_loop"], run["saturation"], run["baseline"]["summary"]]
for load in loads:
    assert load["failures"] == 0 and load["successes"] > 0, load.get("label")
print("store smoke: " + ", ".join(f"{load['label']}: {load['successes']} ok" for load in loads) + ", no failures")
PY
    # The server binary the server tests built (features foundationdb and
    # failpoints; no failpoint is set here). Exits non-zero unless the
    # audit passes.
    "${CARGO_TARGET_DIR:-target}/debug/idem-bench" http --store-kind foundationdb --server-bin "${CARGO_TARGET_DIR:-target}/debug/server" \
        --rate 50 --duration-s 3 --warmup-s 1 --duplicate-share 0.1 \
        --carrier-latency-ms-min 0 --carrier-latency-ms-max 5 --json "$report_dir/http.json"
    # Preload's bulk path on FoundationDB (the store crate's tests check the
    # records it writes read back and replay): exits non-zero unless every
    # record was written.
    "${CARGO_TARGET_DIR:-target}/debug/idem-bench" preload --store-kind foundationdb --records 2000 \
        --batch-records 500 --quiet --json "$report_dir/preload.json"
    echo "== idem-bench on FoundationDB: $((SECONDS - phase_started)) s"
}

