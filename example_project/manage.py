#!/usr/bin/env python
"""Django's command-line utility for the example project.

Run from anywhere, e.g. ``python example_project/manage.py issue_invoices 5``:
the directory above this file (the repository root) is put on ``sys.path`` so
that ``example_project`` can be imported.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main() -> None:
    """Run the management command named on the command line."""
    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
