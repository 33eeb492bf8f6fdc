import os, sys, time
pid = sys.argv[1]; secs = int(sys.argv[2]); out = open(sys.argv[3], 'w')
hz = os.sysconf('SC_CLK_TCK')
prev = {}
def snap():
    d = {}
    for t in os.listdir(f'/proc/{pid}/task'):
        try:
            s = open(f'/proc/{pid}/task/{t}/stat').read()
            name = s[s.index('(')+1:s.rindex(')')]
            f = s[s.rindex(')')+2:].split()
            d[(t, name)] = int(f[11]) + int(f[12])
        except Exception: pass
    return d
prev = snap()
for i in range(secs):
    time.sleep(1)
    cur = snap()
    agg = {}
    for k, v in cur.items():
        dv = v - prev.get(k, v)
        name = k[1]
        agg[name] = agg.get(name, 0) + dv
    prev = cur
    busy = ' '.join(f'{n}={v*100//hz}%' for n, v in sorted(agg.items(), key=lambda x: -x[1]) if v > 0)
    out.write(f'{i} {busy}\n'); out.flush()
