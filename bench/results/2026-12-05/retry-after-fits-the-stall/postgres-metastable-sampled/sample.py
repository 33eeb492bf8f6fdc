#!/usr/bin/env python3
# sample.py ADDRESS PORT OUT: once a second, the service's own figures.
import sys, time, urllib.request, subprocess, re
addr, port, out = sys.argv[1], sys.argv[2], sys.argv[3]
prev = {}
def scrape():
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=2).read().decode()
    vals = {}
    for line in text.splitlines():
        if line.startswith('#'): continue
        m = re.match(r'([a-z_]+)(\{[^}]*\})?\s+([0-9.eE+-]+)$', line)
        if not m: continue
        name, labels, v = m.group(1), m.group(2) or '', float(m.group(3))
        if name in ('idem_http_requests_in_flight','idem_admission_queue_waiting','idem_connections_open'):
            vals[name] = v
        elif name == 'idem_work_done_total':
            vals['work'+labels] = v
        elif name == 'idem_admission_shed_total':
            vals['shed'] = vals.get('shed',0)+v
        elif name in ('idem_store_operation_duration_seconds_sum','idem_store_operation_duration_seconds_count') and ('claim' in labels):
            vals[name+labels] = v
        elif name in ('idem_http_request_duration_seconds_sum','idem_http_request_duration_seconds_count') and 'route="/v1/labels"' in labels and 'POST' in labels:
            vals[name] = vals.get(name,0)+v
        elif name in ('idem_carrier_call_duration_seconds_sum','idem_carrier_call_duration_seconds_count'):
            vals[name] = vals.get(name,0)+v
    return vals
def accept_q():
    r = subprocess.run(['ss','-ltnH',f'sport = :{port}'],capture_output=True,text=True).stdout.split()
    return r[1] if len(r)>1 else '?'
with open(out,'w') as f:
    f.write("t server_request_mean_ms in_flight adm_queue conns acceptQ shed/s work/s(by label) claim_mean_ms carrier_mean_ms\n")
    while True:
        try: v = scrape()
        except Exception as e: break
        t = time.strftime('%H:%M:%S')
        d = {k: v[k]-prev.get(k,0) for k in v}
        works = ' '.join(f"{k[4:]}={d[k]:.0f}" for k in sorted(v) if k.startswith('work'))
        cs = sum(d[k] for k in d if k.startswith('idem_store_operation_duration_seconds_sum'))
        cc = sum(d[k] for k in d if k.startswith('idem_store_operation_duration_seconds_count'))
        ks, kc = d.get('idem_carrier_call_duration_seconds_sum',0), d.get('idem_carrier_call_duration_seconds_count',0)
        hs, hc = d.get('idem_http_request_duration_seconds_sum',0), d.get('idem_http_request_duration_seconds_count',0)
        f.write(f"{t} server_mean_ms={1000*hs/hc if hc else 0:.1f} {v.get('idem_http_requests_in_flight',0):.0f} {v.get('idem_admission_queue_waiting',0):.0f} {v.get('idem_connections_open',0):.0f} {accept_q()} {d.get('shed',0):.0f} {works} claim={1000*cs/cc if cc else 0:.1f} carrier={1000*ks/kc if kc else 0:.1f}\n")
        f.flush(); prev = v; time.sleep(1)
