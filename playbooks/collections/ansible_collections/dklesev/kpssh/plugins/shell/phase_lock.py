# -*- coding: utf-8 -*-
# Copyright kpssh maintainers. Apache-2.0.
"""dklesev.kpssh.phase_lock — the POSIX shell, with every module run under
the host's kpssh phase lock.

A script phase holds ``/run/kpssh-phase.lock`` (flock(1)) for its whole
script. A role or task phase runs modules one after another; what a killed
``ansible-playbook`` (a controller crash, a cancel) leaves on the host is
the one module it was running, which goes on without its connection. Here
each module's interpreter runs under ``flock -w WAIT``, so the resumed
run's modules wait for that orphan instead of running beside it (two apt
runs, two kubelet restarts). The run's tag rides in the command line
(``env KPSSH_RUN=<tag>``) so that the engine's stop of an interrupted run
finds a module that waits for the lock or runs under it.

Only the module command changes; everything else is ``sh``'s.
"""
from __future__ import annotations

DOCUMENTATION = """
name: phase_lock
short_description: POSIX shell whose module runs hold the host's kpssh phase lock
description:
  - The sh shell plugin, with each module's interpreter run under flock(1) on the host's kpssh phase lock.
extends_documentation_fragment:
  - shell_common
options:
  phase_lock_wait:
    description: Seconds a module waits for the lock (0 waits as long as it takes).
    type: int
    default: 0
    vars:
      - name: kpssh_phase_lock_wait
  phase_run_tag:
    description: The run's tag, put into the module's command line.
    type: str
    default: ''
    vars:
      - name: kpssh_run_tag
"""

import re
import shlex

from ansible.plugins.shell.sh import ShellModule as ShModule

LOCK = '/run/kpssh-phase.lock'
TAG = re.compile(r'^[A-Za-z0-9_.-]{1,64}$')


class ShellModule(ShModule):

    def lock_command(self):
        """The argv prefix that runs a command under the phase lock, tagged."""
        wait = int(self.get_option('phase_lock_wait') or 0)
        tag = self.get_option('phase_run_tag') or ''
        # -o: the lock stays with flock, not with what the module leaves
        # running (an async job's daemon would hold it past the module and
        # its async_status polls would wait for it).
        lock = ['flock', '-o']
        if wait > 0:
            lock += ['-w', str(wait)]
        lock.append(LOCK)
        if TAG.match(tag):
            lock += ['env', 'KPSSH_RUN=' + tag]
        return lock

    def build_module_command(self, env_string, shebang, cmd, arg_path=None):
        module_cmd = super().build_module_command('', shebang, cmd, arg_path)
        env_string = env_string.strip()
        return (env_string + ' ' if env_string else '') + shlex.join(self.lock_command()) + ' ' + module_cmd
