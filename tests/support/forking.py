"""Running a step in a forked child of the test process.

The child inherits everything the parent holds at the moment of the fork
(leases, event loops, clients, locks taken by other threads), which is the
point of these tests. It must never return into pytest: whatever the step does,
the child leaves through ``os._exit`` with a code that says how the step ended.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable

import pytest

RETURNED = 10
"""Exit code of a child whose step returned normally."""
RAISED = 11
"""Exit code of a child whose step raised an exception of the expected type."""
FAILED = 12
"""Exit code of a child whose step raised anything else (printed to stderr)."""

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork() (POSIX)")


def in_child(step: Callable[[], object], expected: type[BaseException]) -> int:
    """Run ``step()`` in a forked child and return the child's exit code:
    ``RETURNED``, ``RAISED`` (``expected`` was raised; its message goes to
    stderr) or ``FAILED``. Waits for the child; ``step`` must end on its own."""
    pid = os.fork()
    if pid == 0:
        code = FAILED
        try:
            step()
            code = RETURNED
        except expected as exc:
            print(f"child {os.getpid()}: {type(exc).__name__}: {exc}", file=sys.stderr)
            code = RAISED
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)
