#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright kpssh maintainers. Apache-2.0.
from __future__ import annotations

DOCUMENTATION = r'''
module: host_state
short_description: Learn what a phase needs to know about the host in one round trip
description:
  - Reads small files, tests paths, runs read-only commands and reads systemd
    units' state, all in one module run, so a role learns the host's state
    with one task instead of one C(stat)/C(slurp)/C(command)/C(systemd) task
    each (every module task is a round trip plus a Python start on the host).
  - Also returns the machine type (C(uname -m)), so a role maps it to a
    release architecture without a task of its own.
  - Never changes anything; never fails because a file, command or unit is
    missing (that is what it reports). Supports check mode.
  - Its action plugin asks the same as one POSIX sh script on the task's
    connection (no Python start on the host: about 0.15 s less per probe)
    and runs this module only when the host's sh lacks a tool the script
    uses (C(base64), C(mktemp), C(timeout)).
version_added: 0.2.0
options:
  read:
    description: Files whose text is returned (at most 64 KiB each); a missing file reads as null.
    type: list
    elements: path
    default: []
  exists:
    description: Paths reported as existing or not.
    type: list
    elements: path
    default: []
  commands:
    description: Read-only commands (argv lists, no shell) by name; each returns rc and stdout/stderr (rc null when it cannot start).
    type: dict
    default: {}
  units:
    description: systemd units whose ActiveState, SubState and UnitFileState are returned.
    type: list
    elements: str
    default: []
author:
  - kpssh maintainers
'''

EXAMPLES = r'''
- name: Learn the host's state
  dklesev.kpssh.host_state:
    read: [/var/lib/kubelet/kpssh-node-name]
    exists: [/etc/kubernetes/kubelet.conf]
    commands:
      kubelet_version: [/usr/local/bin/kubelet, --version]
    units: [kubelet.service]
  register: state
'''

RETURN = r'''
read:
  description: Path to text (null when missing or unreadable).
  type: dict
  returned: always
exists:
  description: Path to bool.
  type: dict
  returned: always
commands:
  description: Name to C({rc, stdout, stderr}).
  type: dict
  returned: always
units:
  description: Unit to C({ActiveState, SubState, UnitFileState}) (empty strings for an unknown unit).
  type: dict
  returned: always
machine:
  description: The machine type, as C(uname -m) prints it (C(platform.machine())), e.g. C(x86_64), C(aarch64).
  type: str
  returned: always
  version_added: 1.1.0
'''

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dklesev.kpssh.plugins.module_utils.host_commands import (
    MAX_READ, UNIT_STATE_PROPS, run, run_all, unit_states)


def _read(path):
    try:
        with open(path, 'rb') as f:
            data = f.read(MAX_READ + 1)
    except OSError:
        return None
    return data[:MAX_READ].decode('utf-8', 'replace')


def _units(names):
    if not names:
        return unit_states(names, '')
    r = run(['systemctl', 'show', '--property=' + ','.join(UNIT_STATE_PROPS), '--'] + list(names))
    return unit_states(names, r['stdout'])


def main():
    module = AnsibleModule(
        argument_spec=dict(
            read=dict(type='list', elements='path', default=[]),
            exists=dict(type='list', elements='path', default=[]),
            commands=dict(type='dict', default={}),
            units=dict(type='list', elements='str', default=[]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    commands = run_all(module, p['commands'])
    module.exit_json(
        changed=False,
        read={path: _read(path) for path in p['read']},
        exists={path: os.path.lexists(path) for path in p['exists']},
        commands=commands,
        units=_units(p['units']),
        machine=os.uname().machine,
    )


if __name__ == '__main__':
    main()
