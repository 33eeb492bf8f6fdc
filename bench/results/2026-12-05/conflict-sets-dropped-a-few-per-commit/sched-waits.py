"""Waits of the Label service's threads over 2 ms: in the run queue, or asleep
(with the thread that woke them). Input: tids.txt ("TID COMM" per line, from
/proc/PID/task) and sched.txt, from
  perf record -e sched:sched_switch -e sched:sched_wakeup -a -o sched.data -- sleep 12
  perf script -i sched.data -F comm,tid,cpu,time,event,trace > sched.txt
Times are seconds from the trace's start. A wake-up by `swapper` comes from
an interrupt on an idle CPU."""
import sys, re, collections
svc = {int(l.split()[0]): l.split()[1] for l in open('tids.txt')}
head = re.compile(r'^\s*(.*?)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+sched:(sched_\w+):\s*(.*)$')
ev = []
for line in open('sched.txt'):
    m = head.match(line)
    if m: ev.append((float(m.group(4)), m.group(1), int(m.group(2)), int(m.group(3)), m.group(5), m.group(6)))
t_start = ev[0][0]
out = {}      # tid -> (t, state)
runq = {}     # tid -> time it became runnable (woken or preempted)
waits = []
cpu_running = {}
for t, comm, tid, cpu, e, f in ev:
    if e == 'sched_switch':
        pm = re.search(r'prev_comm=(.*?) prev_pid=(\d+) prev_prio=\d+ prev_state=(\S+) ==> next_comm=(.*?) next_pid=(\d+)', f)
        prev, state, nxt = int(pm.group(2)), pm.group(3), int(pm.group(5))
        out[prev] = (t, state, cpu)
        if state.startswith('R'): runq[prev] = t
        if nxt in runq:
            d = t - runq.pop(nxt)
            if nxt in svc and d * 1000 >= 2: waits.append(('runqueue', d, t, nxt, None, cpu))
        cpu_running[cpu] = (nxt, pm.group(4))
    elif e == 'sched_wakeup':
        wm = re.search(r'comm=(.*?) pid=(\d+)', f)
        w = int(wm.group(2))
        if w in out:
            t0, state, c0 = out[w]
            d = t - t0
            if w in svc and state.startswith(('S', 'D')) and d * 1000 >= 3:
                waits.append(('sleep', d, t0, w, (comm, tid), cpu))
        runq[w] = t
waits.sort(key=lambda x: x[2])
for kind, d, t0, w, waker, cpu in waits:
    print(f'{t0 - t_start:8.3f}s {kind:8s} {d*1000:6.2f} ms {svc[w]:16s} {w}  waker={waker}')
