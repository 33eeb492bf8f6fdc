import json,sys
for f in sys.argv[1:]:
    r=json.load(open(f))
    s=r['http'][0]['open_loop']['series']
    print(f, 'p99/s:', ' '.join(str(round(e['latency']['p99_ms'])) for e in s))
