#!/bin/sh
TOKIO_WORKER_THREADS=1 exec /work/target-release/release/server "$@"
