#!/bin/sh
# The Label service with one tokio worker thread; SERVER is the binary (default: target/release/server).
TOKIO_WORKER_THREADS=1 exec "${SERVER:-target/release/server}" "$@"
