"""Derive the shipped trace excerpt from the Alibaba GenAI serving trace (GenTD26).

    python -m stack.data.derive /path/to/alibaba-genai-2026/lora_request_trace.csv

Counts the requests of four weekdays (2024-12-02 to 2024-12-05) per 15 minutes and writes
``offset_seconds,requests`` rows to ``genai_requests_15min.csv`` next to this file. Only counts
per bin leave the trace; no request row is copied. ``tests/up`` re-derives the file when the
trace is present and checks it matches, so the excerpt's provenance stays checkable.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

FIRST_DAY = "2024-12-02"
DAYS = 4
BIN = "15min"
OUTPUT = Path(__file__).with_name("genai_requests_15min.csv")


def derive(trace_csv: str | Path) -> str:
    """The excerpt's CSV text: one row per 15-minute bin, offsets from the first bin."""
    times = pd.read_csv(trace_csv, usecols=["gmt_create"], parse_dates=["gmt_create"])
    start = pd.Timestamp(FIRST_DAY)
    end = start + pd.Timedelta(days=DAYS)
    inside = times[(times.gmt_create >= start) & (times.gmt_create < end)]
    counts = inside.set_index("gmt_create").resample(BIN).size()
    counts = counts.reindex(pd.date_range(start, end, freq=BIN, inclusive="left"), fill_value=0)
    lines = ["offset_seconds,requests"]
    for stamp, count in counts.items():
        lines.append(f"{int((stamp - start).total_seconds())},{int(count)}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m stack.data.derive PATH/lora_request_trace.csv", file=sys.stderr)
        return 2
    OUTPUT.write_text(derive(argv[0]))
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
