# -*- coding: utf-8 -*-
# Copyright kpssh maintainers. Apache-2.0.
"""dklesev.kpssh.host_state — the module's probe as one POSIX sh run.

A role's probe is on every warm join's critical path, and most of a module
task's time on the host is Python's: the interpreter's start and the
AnsiballZ payload's imports (≈ 0.15 s a task on a small host) for what is a
few file tests and a ``--version``. This action plugin sends the same probe
as a POSIX sh script on stdin over the task's connection (under the phase
lock when the phase_lock shell is in use, as a module would run) and
returns exactly what the module returns. A host whose sh lacks what the
script uses (``base64``, ``mktemp``, ``timeout``) answers with an
incomplete report, and the module runs instead.
"""
from __future__ import annotations

import base64
import binascii
import shlex

from ansible.plugins.action import ActionBase
from ansible_collections.dklesev.kpssh.plugins.module_utils.host_commands import (
    MAX_READ, TAIL, TIMEOUT, UNIT_STATE_PROPS, argv_error, unit_states)

HEADER = 'kpssh-host-state 1'

ARGUMENT_SPEC = dict(
    read=dict(type='list', elements='path', default=[]),
    exists=dict(type='list', elements='path', default=[]),
    commands=dict(type='dict', default={}),
    units=dict(type='list', elements='str', default=[]),
)


def script(read, exists, commands, units):
    """The probe: one line per answer, every value base64 behind an x (so no
    field is ever empty), numbered in the order asked."""
    q = shlex.quote
    lines = [
        # a missing tool would read as empty answers: no report at all instead
        'for c in base64 head mktemp tail timeout tr uname; do command -v "$c" >/dev/null 2>&1 || exit 98; done',
        'd=$(mktemp -d) || exit 97',
        'trap \'rm -rf "$d"\' EXIT',
        'b() { base64 | tr -d "\\n"; }',
        'echo ' + q(HEADER),
        'printf "m x"; uname -m | b; echo',
    ]
    for i, path in enumerate(read):
        lines.append('if [ -f %(p)s ] && [ -r %(p)s ]; then printf "r %(i)d x"; head -c %(n)d -- %(p)s | b; echo; '
                     'else echo "r %(i)d -"; fi' % dict(p=q(path), i=i, n=MAX_READ))
    for i, path in enumerate(exists):
        lines.append('if [ -e %(p)s ] || [ -L %(p)s ]; then echo "e %(i)d 1"; else echo "e %(i)d 0"; fi' % dict(p=q(path), i=i))
    for i, (_, argv) in enumerate(commands):
        lines.append('if command -v -- %(a0)s >/dev/null 2>&1; then timeout %(t)d %(argv)s </dev/null >"$d/o" 2>"$d/e"; '
                     'printf "c %(i)d %%d x" "$?"; tail -c %(n)d "$d/o" | b; printf " x"; tail -c %(n)d "$d/e" | b; echo; '
                     'else echo "c %(i)d - x x"; fi' % dict(a0=q(argv[0]), t=TIMEOUT, argv=shlex.join(argv), i=i, n=TAIL))
    if units:
        lines.append('printf "u x"; systemctl show --property=%s -- %s 2>/dev/null | b; echo'
                     % (','.join(UNIT_STATE_PROPS), shlex.join(units)))
    lines.append('echo end')
    return '\n'.join(lines) + '\n'


def _text(field):
    return base64.b64decode(field[1:], validate=True).decode('utf-8', 'replace')


def parse(out, read, exists, commands, units):
    """The module's result from the probe's output; None when the report is
    not complete (the host's sh lacked something: run the module)."""
    lines = out.splitlines()
    if HEADER not in lines or 'end' not in lines:
        return None
    lines = lines[lines.index(HEADER) + 1:lines.index('end')]
    res = dict(changed=False, read={}, exists={}, commands={}, units=unit_states(units, ''), machine=None)
    try:
        for line in lines:
            f = line.split(' ')
            if f[0] == 'm':
                res['machine'] = _text(f[1]).strip()
            elif f[0] == 'r':
                res['read'][read[int(f[1])]] = None if f[2] == '-' else _text(f[2])
            elif f[0] == 'e':
                res['exists'][exists[int(f[1])]] = f[2] == '1'
            elif f[0] == 'c':
                name, argv = commands[int(f[1])]
                if f[2] == '-':
                    res['commands'][name] = dict(rc=None, stdout='', stderr='[Errno 2] No such file or directory: %r' % argv[0])
                else:
                    res['commands'][name] = dict(rc=int(f[2]), stdout=_text(f[3])[-TAIL:], stderr=_text(f[4])[-TAIL:])
            elif f[0] == 'u':
                res['units'] = unit_states(units, _text(f[1]))
    except (IndexError, ValueError, binascii.Error):
        return None
    if res['machine'] is None or len(res['read']) != len(read) or len(res['exists']) != len(exists) \
            or len(res['commands']) != len(commands):
        return None
    return res


class ActionModule(ActionBase):

    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        if task_vars is None:
            task_vars = dict()
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        _, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        msg = argv_error(args['commands'])
        if msg:
            result.update(failed=True, msg=msg)
            return result
        commands = list(args['commands'].items())
        shell = self._connection._shell
        lock = shell.lock_command() if hasattr(shell, 'lock_command') else []
        res = self._low_level_execute_command(shlex.join(lock + ['sh', '-s']), sudoable=True,
                                              in_data=script(args['read'], args['exists'], commands, args['units']))
        probe = parse(res.get('stdout', ''), args['read'], args['exists'], commands, args['units']) if res.get('rc') == 0 else None
        if probe is None:
            # Not a host this sh probe suits: the module does the same in Python.
            result.update(self._execute_module(module_name='dklesev.kpssh.host_state', module_args=self._task.args,
                                               task_vars=task_vars))
            return result
        result.update(probe)
        return result
