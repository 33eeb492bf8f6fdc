"""Shares of a thread's on-CPU samples by the part of a request they are in.

Usage: perf script -i perf.data --comm tokio-rt-worker -F comm,tid,ip,sym > stacks.txt
       python3 categories.py stacks.txt
Each sample goes to the first category (in the order below) that some frame
of its stack matches; 'leaf' counts samples whose innermost frame is the
allocator or memmove/memcpy.
"""
import sys, re, collections
cats = [
 ('metrics', re.compile(r'metrics::|metrics_exporter|metrics_util')),
 ('tracing', re.compile(r'tracing_subscriber|tracing_core::|tracing::span|tracing::instrument::Instrumented<.*>::(new|drop)')),
 ('carrier call (reqwest/hyper client)', re.compile(r'reqwest::|hyper_util::client|hyper::client|Purchase::buy|carrier::client')),
 ('store: claim', re.compile(r'IdempotencyStore>::claim|claim_resending')),
 ('store: find_for_parcel', re.compile(r'find_for_parcel')),
 ('store: commit label', re.compile(r'LabelStore>::commit|handlers::commit')),
 ('store: other', re.compile(r'store_fdb::|fjall::|lsm_tree::')),
 ('hyper server dispatch', re.compile(r'hyper::proto::h1|hyper::server')),
 ('tokio scheduler/io driver', re.compile(r'tokio::runtime::(scheduler|io|time)|tokio::runtime::park|epoll_wait')),
]
leafcats = [
 ('alloc', re.compile(r'^(_?mi_|mi_|__rust_alloc|__rust_dealloc|__rustc::__rust)')),
 ('memcpy', re.compile(r'memmove|memcpy')),
]
tot = collections.Counter(); leaf = collections.Counter(); n = 0
stack = []
def flush():
    global n
    if not stack: return
    n += 1
    s = '\n'.join(stack)
    c = 'other'
    for name, rx in cats:
        if rx.search(s): c = name; break
    tot[c] += 1
    lf = stack[0]
    for name, rx in leafcats:
        if rx.search(lf): leaf[name] += 1
for line in open(sys.argv[1]):
    if line.startswith('tokio') or line.startswith('idem') or line.startswith('fjall'):
        flush(); stack = []
    elif line.strip():
        parts = line.strip().split(None, 1)
        if len(parts) == 2: stack.append(parts[1])
flush()
for c, v in tot.most_common(): print(f'{100*v/n:5.1f}% {c}')
print('leaf:', {k: f'{100*v/n:.1f}%' for k, v in leaf.items()}, 'samples', n)
