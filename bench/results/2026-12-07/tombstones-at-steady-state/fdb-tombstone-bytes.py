#!/usr/bin/env python3
"""Key-value bytes of one tombstone on the FDB-style store (embedded engine
and FoundationDB): the tombstone row and its expiry index entry, encoded as
store-fdb/src/keys.rs lays them out (FoundationDB's tuple encoding under the
prefix b"idem"), averaged over 100,000 key digests."""
import hashlib

def enc_bytes(code, data):
    return bytes([code]) + data.replace(b"\x00", b"\x00\xff") + b"\x00"

def enc_int(n):
    if n == 0:
        return b"\x14"
    size = (n.bit_length() + 7) // 8
    return bytes([0x14 + size]) + n.to_bytes(size, "big")

def enc(*items):
    out = b""
    for item in items:
        if isinstance(item, str):
            out += enc_bytes(0x02, item.encode())
        elif isinstance(item, bytes):
            out += enc_bytes(0x01, item)
        else:
            out += enc_int(item)
    return out

PREFIX, CALLER, SHARDS = b"idem", "demo", 16
EXPIRES_MS = 1_796_000_000_000 + 7 * 86_400_000
total = 0
N = 100_000
for i in range(N):
    digest = hashlib.sha256(b"label:%d:1:v1" % i).digest()
    tombstone = PREFIX + enc("t", CALLER, digest)
    expiry = PREFIX + enc("x", digest[0] % SHARDS, EXPIRES_MS, "t", CALLER, digest)
    total += len(tombstone) + 8 + len(expiry)  # the tombstone's value: its expiry, u64 BE; the index entry's: empty
print(f"caller {CALLER!r}, prefix {PREFIX!r}: {total / N:.1f} key-value bytes per tombstone (tombstone row and expiry entry)")
