#!/usr/bin/python3
"""Memory per idle connection from the device bench's snapshots.

    VT3_BENCH_SMAPS=DIR VT3_BENCH_IDLE=N cargo bench -p vt3d --bench device -- --short
    tools/idle-memory.py DIR N

DIR holds /proc/PID/{status,smaps} of both vt3d processes (a, b) before
and after the N idle connections opened. Prints what grew, in KiB per
connection per process (the bench's rss_per_idle_conn_kib is the VmRSS
line): VmRSS = RssAnon (vt3d's own) + RssFile + RssShmem (guest RAM pages
vt3d touched); VmPTE (page tables) is not in VmRSS. Anonymous mappings
are grouped by size, since the kernel merges neighbouring ones.
"""
import collections
import re
import sys


def status(path):
    out = {}
    for line in open(path):
        key, _, value = line.partition(':')
        if value.strip().endswith('kB'):
            out[key] = int(value.split()[0])
    return out


def size_class(kib):
    for limit, name in [(64, '<=64K'), (132, '<=132K'), (1028, '<=1M'), (8200, '<=8M')]:
        if kib <= limit:
            return name
    return '>8M'


def smaps(path):
    """Rss (kB) and mapping count by mapping name ([anon SIZE] for anonymous ones)."""
    rss, count = collections.Counter(), collections.Counter()
    name = None
    for line in open(path):
        if re.match(r'^[0-9a-f]+-[0-9a-f]+ ', line):
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split('-'))
            name = fields[5] if len(fields) > 5 else '[anon %s]' % size_class((hi - lo) // 1024)
            count[name] += 1
        elif line.startswith('Rss:') and name:
            rss[name] += int(line.split()[1])
    return rss, count


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    where, conns = sys.argv[1], int(sys.argv[2])
    grown = collections.Counter()
    for side in 'ab':
        before = status(f'{where}/{side}-before-status')
        after = status(f'{where}/{side}-after-status')
        for key in ['VmRSS', 'RssAnon', 'RssFile', 'RssShmem', 'VmPTE']:
            grown[key] += after[key] - before[key]
        rss_before, _ = smaps(f'{where}/{side}-before-smaps')
        rss_after, _ = smaps(f'{where}/{side}-after-smaps')
        for name in set(rss_before) | set(rss_after):
            grown['Rss of ' + name] += rss_after[name] - rss_before[name]
    for key, value in grown.items():
        if value:
            print(f'{key:40s} {value / 2 / conns:7.2f} KiB per connection per process')


main()
