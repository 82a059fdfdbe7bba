#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright kpssh maintainers. Apache-2.0.
from __future__ import annotations

DOCUMENTATION = r'''
module: units
short_description: Enable, start, restart or stop several systemd units in one round trip, and wait for them
description:
  - Converges every unit of I(units) after a C(systemctl daemon-reload)
    when I(daemon_reload) is true or systemd reports that the file of a
    unit about to be started or restarted changed on disk
    (C(NeedDaemonReload)): the units to enable in one C(systemctl
    enable --no-reload), those to disable in one C(systemctl disable
    --no-reload) (starting and stopping need no reload of systemd, which
    costs about 0.25 s on a small host), then each unit's state in order
    (C(systemctl start) waits for the unit to be up). One module run instead of
    one C(ansible.builtin.systemd) task per unit (each is a Python start on
    the host) and a C(command) polling C(systemctl is-active).
  - A unit whose state is C(stopped) ends C(inactive): one that systemd
    left C(failed) (already failed, or its process exited non-zero on
    SIGTERM) is reset (C(systemctl reset-failed)), and the module fails naming any
    unit still active.
  - With I(wait_active) > 0, waits up to that many seconds for every unit
    whose state is C(started) or C(restarted) to be active (a unit that
    systemd restarts after an early exit gets its time), and fails naming
    the units that are not.
  - Supports check mode (nothing is reloaded, started or waited for) and
    diff mode (the actions, and each acted-on unit's state before).
version_added: 1.1.0
options:
  units:
    description: The units, converged in this order.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: Unit name with its suffix, e.g. C(kubelet.service).
        type: str
        required: true
      enabled:
        description: Enabled at boot (C(true)), disabled (C(false)), or left alone (unset).
        type: bool
      state:
        description: C(started), C(restarted) (always restarted, or started if stopped), C(stopped) (and not C(failed)), or left alone (unset).
        type: str
        choices: [started, restarted, stopped]
  daemon_reload:
    description: Run C(systemctl daemon-reload) first (it also runs when a unit's file changed on disk).
    type: bool
    default: false
  wait_active:
    description: Seconds to wait for the started and restarted units to be active; 0 does not wait.
    type: int
    default: 0
author:
  - kpssh maintainers
'''

EXAMPLES = r'''
- name: Start the node
  dklesev.kpssh.units:
    daemon_reload: "{{ units_changed }}"
    units:
      - {name: containerd.service, enabled: true, state: started}
      - {name: kubelet.service, enabled: true, state: "{{ 'restarted' if kubelet_changed else 'started' }}"}
    wait_active: 60
'''

RETURN = r'''
actions:
  description: What was done (or, in check mode, would be), in order, e.g. C(enable kubelet.service).
  type: list
  elements: str
  returned: always
active:
  description: C(systemctl is-active) of every unit after the last action (and the wait).
  type: dict
  returned: always
'''

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dklesev.kpssh.plugins.module_utils.systemd_units import UNIT_OPTIONS, UnitsFailed, converge


def main():
    module = AnsibleModule(
        argument_spec=dict(
            units=dict(type='list', elements='dict', required=True, options=UNIT_OPTIONS),
            daemon_reload=dict(type='bool', default=False),
            wait_active=dict(type='int', default=0),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        actions, active, was = converge(module, p['units'], p['daemon_reload'], p['wait_active'])
    except UnitsFailed as e:
        module.fail_json(msg=str(e), changed=bool(e.result.get('actions')), **e.result)
    extra = {'diff': {'prepared': was}} if module._diff and was else {}
    module.exit_json(changed=bool(actions), actions=actions, active=active, **extra)


if __name__ == '__main__':
    main()
