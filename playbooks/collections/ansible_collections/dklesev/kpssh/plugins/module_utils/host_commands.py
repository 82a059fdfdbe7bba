# -*- coding: utf-8 -*-
# Copyright kpssh maintainers. Apache-2.0.
"""Read-only commands (argv lists, no shell) for the collection's modules,
and what dklesev.kpssh.host_state answers (its module on the host, its
action plugin on the controller from a sh probe's report)."""
from __future__ import annotations

import subprocess

TAIL = 8192
TIMEOUT = 60
# host_state's read: at most this many bytes of a file
MAX_READ = 64 * 1024
# host_state's units: the systemctl show properties asked, and those returned
UNIT_STATE_PROPS = ('Id', 'ActiveState', 'SubState', 'UnitFileState')


def run(argv, timeout=TIMEOUT):
    """Runs argv with stdin closed: {rc, stdout, stderr} (rc None when it cannot start), output tails."""
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return dict(rc=None, stdout='', stderr=str(e))
    return dict(rc=p.returncode, stdout=p.stdout.decode('utf-8', 'replace')[-TAIL:],
                stderr=p.stderr.decode('utf-8', 'replace')[-TAIL:])


def argv_error(commands, option='commands'):
    """The message for the first value of a name-to-argv dict that is not a non-empty list of strings, or None."""
    for name, argv in commands.items():
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            return '%s.%s must be a non-empty list of strings (argv, no shell)' % (option, name)
    return None


def check_all(module, commands, option='commands'):
    """Fails the module unless every value of a name-to-argv dict is a non-empty list of strings."""
    msg = argv_error(commands, option)
    if msg:
        module.fail_json(msg=msg)


def unit_states(names, shown):
    """host_state's units from systemctl show's output: one block per unit,
    in the order asked, separated by blank lines (empty strings for a unit
    without one)."""
    out = {n: {k: '' for k in UNIT_STATE_PROPS[1:]} for n in names}
    for name, block in zip(names, shown.split('\n\n')):
        for line in block.splitlines():
            k, _, v = line.partition('=')
            if k in out[name]:
                out[name][k] = v
    return out


def run_all(module, commands, option='commands'):
    """Runs every command of a name-to-argv dict (checked first): name to run()'s result."""
    check_all(module, commands, option)
    return {name: run(argv) for name, argv in commands.items()}
