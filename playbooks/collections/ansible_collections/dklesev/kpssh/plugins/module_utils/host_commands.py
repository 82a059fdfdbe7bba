# -*- coding: utf-8 -*-
# Copyright kpssh maintainers. Apache-2.0.
"""Read-only commands (argv lists, no shell) for the collection's modules."""
from __future__ import annotations

import subprocess

TAIL = 8192


def run(argv, timeout=60):
    """Runs argv with stdin closed: {rc, stdout, stderr} (rc None when it cannot start), output tails."""
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return dict(rc=None, stdout='', stderr=str(e))
    return dict(rc=p.returncode, stdout=p.stdout.decode('utf-8', 'replace')[-TAIL:],
                stderr=p.stderr.decode('utf-8', 'replace')[-TAIL:])


def check_all(module, commands, option='commands'):
    """Fails the module unless every value of a name-to-argv dict is a non-empty list of strings."""
    for name, argv in commands.items():
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            module.fail_json(msg='%s.%s must be a non-empty list of strings (argv, no shell)' % (option, name))


def run_all(module, commands, option='commands'):
    """Runs every command of a name-to-argv dict (checked first): name to run()'s result."""
    check_all(module, commands, option)
    return {name: run(argv) for name, argv in commands.items()}
