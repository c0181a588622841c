#!/usr/bin/env python3
"""Runs PyPI drain3 over the first N lines of a log and prints its speed and template count.

Usage: drain3_bench.py LOG [--lines N]

drain3 is configured like warden's miner (diagnosis/src/drain.rs): depth 4, similarity
0.4, 100 children, no cluster cap, and masking that mirrors ours: UUIDs, hex-digit runs
that contain a digit (and 0x literals) become <*>, remaining digit runs inside words
become <*>, and a token left with only <*> and .:/+,- collapses to one <*>.
Prints a `RESULT key=value ...` line for scripts/bench-diagnosis.
"""

import argparse
import itertools
import resource
import sys
import time

from drain3 import TemplateMiner
from drain3.masking import MaskingInstruction
from drain3.template_miner_config import TemplateMinerConfig

NOT_ALNUM_BEFORE = r"(?<![A-Za-z0-9])"
NOT_ALNUM_AFTER = r"(?![A-Za-z0-9])"
HEX = "[0-9a-fA-F]"
SEP = r"[.:/+,\-]"


def config() -> TemplateMinerConfig:
    c = TemplateMinerConfig()
    c.drain_depth = 4
    c.drain_sim_th = 0.4
    c.drain_max_children = 100
    c.drain_max_clusters = None
    c.parametrize_numeric_tokens = True
    c.profiling_enabled = False
    uuid = f"{HEX}{{8}}-{HEX}{{4}}-{HEX}{{4}}-{HEX}{{4}}-{HEX}{{12}}"
    c.masking_instructions = [
        MaskingInstruction(f"{NOT_ALNUM_BEFORE}{uuid}{NOT_ALNUM_AFTER}", "*"),
        MaskingInstruction(
            f"{NOT_ALNUM_BEFORE}(?:0[xX]{HEX}+|{HEX}*[0-9]{HEX}*){NOT_ALNUM_AFTER}", "*"
        ),
        MaskingInstruction(r"[0-9]+", "*"),
        MaskingInstruction(
            rf"(?<!\S){SEP}*<\*>(?:{SEP}*<\*>)*{SEP}*(?!\S)", "*"
        ),
    ]
    return c


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--lines", type=int, default=1_000_000)
    args = ap.parse_args()

    miner = TemplateMiner(config=config())
    lines = 0
    nbytes = 0
    with open(args.log, "rb") as f:
        start = time.perf_counter()
        for raw in itertools.islice(f, args.lines):
            nbytes += len(raw)
            miner.add_log_message(raw.decode("utf-8", "replace").rstrip("\n"))
            lines += 1
        secs = time.perf_counter() - start
    clusters = sorted(miner.drain.clusters, key=lambda c: -c.size)
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        f"drain3: {lines} lines, {nbytes / 2**20:.1f} MiB in {secs:.2f} s: "
        f"{lines / secs:.0f} lines/s, {nbytes / 2**20 / secs:.2f} MiB/s; "
        f"{len(clusters)} templates, peak RSS {rss_kib / 1024:.1f} MiB"
    )
    for c in clusters[:5]:
        print(f"  {c.size:>10}  {c.get_template()[:140]}")
    print(
        f"RESULT impl=drain3 mode=file lines={lines} bytes={nbytes} secs={secs:.4f} "
        f"lines_per_sec={lines / secs:.0f} templates={len(clusters)} peak_rss_kib={rss_kib}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
