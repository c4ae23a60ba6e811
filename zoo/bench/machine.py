"""What a benchmark ran on, in words: the CPU model and core count, and the load at the time.

Every table the benchmark and the experiment scripts write states both: on a shared machine a
timing means little without the load beside it (BENCHMARKS.md, "How to measure")."""

from __future__ import annotations

import os


def describe_machine() -> str:
    """``"<cpu model name>, <n> cores"`` (``"cpu, <n> cores"`` where /proc/cpuinfo is not readable)."""
    cpu = "cpu"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores"


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, ``"0.52, 0.61, 0.70"``."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())
