"""The cyclic garbage collector paused over one bounded computation.

A cycle, a commit or a report over 100,000 devices builds hundreds of thousands of small objects (rows,
tuples, dict entries) that all live until it ends. None of them is garbage meanwhile, yet every few
hundred allocations the collector walks the young ones, and every so often the whole grown heap: at that
size its passes cost a fifth to a third of the computation. Reference counting still frees what it can;
the collector resumes, and catches up, when the computation ends.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager


@contextmanager
def collector_paused():
    """Pause the cyclic collector for the block, if it ran; nested blocks leave it paused."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
