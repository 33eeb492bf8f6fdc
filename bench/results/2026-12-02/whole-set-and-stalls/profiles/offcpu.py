import sys,re,collections
# parse perf script output of sched_switch -g -a; off-CPU intervals per switch-out, keyed by a stack signature
ev=[]; cur=None
hdr=re.compile(r'^(\S.*?)\s+(\d+)\s+([\d.]+): sched:sched_switch: prev_comm=(.*?) prev_pid=(\d+) prev_prio=\d+ prev_state=(\S+) ==> next_comm=(.*?) next_pid=(\d+)')
for line in open(sys.argv[1]):
    m=hdr.match(line)
    if m:
        cur=dict(ts=float(m.group(3)),prev=int(m.group(5)),pcomm=m.group(4),state=m.group(6),next=int(m.group(8)),stack=[]); ev.append(cur); continue
    line=line.strip()
    if line and cur is not None:
        parts=line.split(None,1)
        if len(parts)==2: cur['stack'].append(parts[1])
tids=set(int(x) for x in sys.argv[2].split(',')) if len(sys.argv)>2 else None
out={}; agg=collections.defaultdict(lambda:[0,0.0,0.0])
skip=('__schedule','schedule','futex','do_futex','__x64','do_syscall','entry_SYSCALL','syscall','[unknown]','0x','exit_to_user','irqentry','asm_','schedule_','do_epoll','__GI_','epoll_wait','__futex','futex_')
for e in ev:
    if e['next'] in out:
        (t0,sig)=out.pop(e['next']); d=e['ts']-t0; a=agg[sig]; a[0]+=1; a[1]+=d; a[2]=max(a[2],d)
    if tids is None or e['prev'] in tids:
        frames=[f for f in e['stack'] if not f.startswith(skip)]
        sig=e['pcomm']+' '+e['state']+' | '+' < '.join(frames[:3])
        out[e['prev']]=(e['ts'],sig)
rows=sorted(agg.items(), key=lambda kv:-kv[1][2])
for sig,(n,tot,mx) in rows[:40]:
    print('%6d  total %8.1f ms  max %7.2f ms  %s' % (n,tot*1e3,mx*1e3,sig[:200]))
