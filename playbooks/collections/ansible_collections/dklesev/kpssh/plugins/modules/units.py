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

import time

# is-enabled states that need no enable (as ansible.builtin.systemd_service treats them).
ENABLED_STATES = ('enabled', 'enabled-runtime', 'static', 'alias', 'indirect', 'generated', 'transient')

from ansible.module_utils.basic import AnsibleModule


def _props(module, systemctl, names):
    """ActiveState, LoadState and NeedDaemonReload of every unit, one systemctl call."""
    rc, out, err = module.run_command([systemctl, 'show', '--property=Id,LoadState,ActiveState,NeedDaemonReload', '--'] + names)
    if rc != 0:
        module.fail_json(msg='units: systemctl show: %s' % (err.strip() or out.strip()))
    props, cur = [], {}
    for line in out.splitlines() + ['']:
        if not line.strip():
            if cur:
                props.append(cur)
                cur = {}
            continue
        k, _, v = line.partition('=')
        cur[k] = v
    if len(props) != len(names):
        module.fail_json(msg='units: systemctl show returned %d units for %d names' % (len(props), len(names)))
    return dict(zip(names, props))


def _is_enabled(module, systemctl, names):
    """systemctl is-enabled of every unit (read from disk: the UnitFileState
    property is systemd's cached view, stale after an enable --no-reload on
    systemd 257). A unit without a file prints nothing on stdout, so one
    call for all and a unit at a time when the lines do not add up."""
    if not names:
        return {}
    _, out, _ = module.run_command([systemctl, 'is-enabled', '--'] + names)
    states = out.split()
    if len(states) == len(names):
        return dict(zip(names, states))
    res = {}
    for n in names:
        _, out, _ = module.run_command([systemctl, 'is-enabled', '--', n])
        res[n] = out.strip() or 'not-found'
    return res


def _is_active(module, systemctl, names):
    # is-active prints one line per unit, in order, and exits non-zero unless all are active.
    _, out, _ = module.run_command([systemctl, 'is-active', '--'] + names)
    states = out.split()
    if len(states) != len(names):
        states = (states + ['unknown'] * len(names))[:len(names)]
    return dict(zip(names, states))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            units=dict(type='list', elements='dict', required=True, options=dict(
                name=dict(type='str', required=True),
                enabled=dict(type='bool'),
                state=dict(type='str', choices=['started', 'restarted', 'stopped']),
            )),
            daemon_reload=dict(type='bool', default=False),
            wait_active=dict(type='int', default=0),
        ),
        supports_check_mode=True,
    )
    units = module.params['units']
    names = [u['name'] for u in units]
    if not names:
        module.exit_json(changed=False, actions=[], active={})
    for n in names:
        if not n or n.startswith('-') or '/' in n or '.' not in n:
            module.fail_json(msg='units: %r is not a unit name with its suffix (e.g. kubelet.service)' % n)
    if module.params['wait_active'] < 0:
        module.fail_json(msg='units: wait_active must be ≥ 0, got %d' % module.params['wait_active'])
    systemctl = module.get_bin_path('systemctl', required=True)
    check = module.check_mode
    actions = []

    def run_all(verb, these, flags=()):
        if not these:
            return
        actions.extend('%s %s' % (verb, n) for n in these)
        if check:
            return
        rc, out, err = module.run_command([systemctl, verb] + list(flags) + ['--'] + these)
        if rc != 0:
            module.fail_json(msg='units: systemctl %s %s: %s' % (verb, ' '.join(these), (err.strip() or out.strip() or 'exit %d' % rc)),
                             actions=actions, active=_is_active(module, systemctl, names))

    props = _props(module, systemctl, names)
    # A unit about to (re)start runs what systemd loaded: reload first if
    # its file changed on disk. Only for those: systemd 257 also flags a unit
    # whose enable link changed (our own enable --no-reload), which needs no
    # reload to stop, disable or leave running.
    starting = [u['name'] for u in units if u['state'] == 'restarted' or (
        u['state'] == 'started' and props[u['name']].get('ActiveState') not in ('active', 'activating', 'reloading'))]
    if module.params['daemon_reload'] or any(props[n].get('NeedDaemonReload') == 'yes' for n in starting):
        actions.append('daemon-reload')
        if not check:
            rc, out, err = module.run_command([systemctl, 'daemon-reload'])
            if rc != 0:
                module.fail_json(msg='units: systemctl daemon-reload: %s' % (err.strip() or out.strip()), actions=actions)
            props = _props(module, systemctl, names)
    for u in units:
        if props[u['name']].get('LoadState') == 'not-found' and (u['enabled'] or u['state'] in ('started', 'restarted')):
            module.fail_json(msg='units: %s: unit not found' % u['name'], actions=actions)
    # Every enable in one systemctl call, every disable in another, neither
    # reloading systemd: the links only matter at the next boot, and start
    # and stop need no reload (one ran above when a unit file changed).
    ufs = _is_enabled(module, systemctl, [u['name'] for u in units
                                          if u['enabled'] is not None and props[u['name']].get('LoadState') != 'not-found'])
    run_all('enable', [u['name'] for u in units if u['enabled'] is True and ufs[u['name']] not in ENABLED_STATES], ['--no-reload'])
    run_all('disable', [u['name'] for u in units if u['enabled'] is False and ufs.get(u['name']) in ('enabled', 'enabled-runtime')], ['--no-reload'])
    # States one unit at a time, in order: systemctl start waits for the
    # unit to be up, so a unit is started after those before it are.
    for u in units:
        name = u['name']
        active = props[name].get('ActiveState') in ('active', 'activating', 'reloading')
        if u['state'] == 'started' and not active:
            run_all('start', [name])
        elif u['state'] == 'restarted':
            run_all('restart', [name])
        elif u['state'] == 'stopped' and props[name].get('ActiveState') not in ('inactive', 'failed', ''):
            run_all('stop', [name])

    waited = [u['name'] for u in units if u['state'] in ('started', 'restarted')]
    active = _is_active(module, systemctl, names)
    # A unit whose process exited non-zero on SIGTERM is left "failed";
    # stopped means inactive. (In check mode nothing was stopped.)
    stopped = [u['name'] for u in units if u['state'] == 'stopped']
    if not check:
        failed = [n for n in stopped if active[n] == 'failed']
        if failed:
            run_all('reset-failed', failed)
            active = _is_active(module, systemctl, names)
        up = [n for n in stopped if active[n] in ('active', 'activating', 'reloading', 'deactivating')]
        if up:
            module.fail_json(msg='units: still running after stop: %s' % ', '.join('%s %s' % (n, active[n]) for n in up),
                             changed=bool(actions), actions=actions, active=active)
    if not check and waited and module.params['wait_active'] > 0:
        deadline = time.monotonic() + module.params['wait_active']
        while any(active[n] != 'active' for n in waited) and time.monotonic() < deadline:
            time.sleep(0.25)
            active = _is_active(module, systemctl, names)
        down = [n for n in waited if active[n] != 'active']
        if down:
            module.fail_json(msg='units: not active after %ds: %s' % (
                module.params['wait_active'], ', '.join('%s %s' % (n, active[n]) for n in down)),
                changed=bool(actions), actions=actions, active=active)
    extra = {}
    if module._diff and actions:
        # diff mode: what is done and what each unit was before
        was = ''.join('%s was %s/%s\n' % (n, ufs.get(n) or 'unknown', props[n].get('ActiveState') or 'unknown')
                      for n in names if any(a.endswith(' ' + n) for a in actions))
        extra['diff'] = {'prepared': ''.join(a + '\n' for a in actions) + was}
    module.exit_json(changed=bool(actions), actions=actions, active=active, **extra)


if __name__ == '__main__':
    main()
