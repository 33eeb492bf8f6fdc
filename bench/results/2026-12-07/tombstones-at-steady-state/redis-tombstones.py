#!/usr/bin/env python3
# RESP commands: N tombstones exactly as store-redis's mark_tombstone writes them
# (SET {prefix}{caller:hex digest}:tomb <until_ms> PXAT <until_ms>).
import hashlib, sys
n = int(sys.argv[1]); until = 1_900_000_000_000
out = sys.stdout.buffer
def cmd(*parts):
    b = [b"*%d\r\n" % len(parts)]
    for p in parts:
        p = p if isinstance(p, bytes) else str(p).encode()
        b.append(b"$%d\r\n%s\r\n" % (len(p), p))
    return b"".join(b)
for i in range(n):
    digest = hashlib.sha256(b"label:%d:1:v1" % i).hexdigest()
    ms = until + i * 250
    out.write(cmd("SET", "idem:{demo:%s}:tomb" % digest, ms, "PXAT", ms))
