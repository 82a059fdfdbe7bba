# -*- coding: utf-8 -*-
# Copyright kpssh maintainers. Apache-2.0.
"""Converging systemd units in a few systemctl calls: the dklesev.kpssh.units
module, and dklesev.kpssh.files's units (write then start in one round trip)."""
from __future__ import annotations

import time

# is-enabled states that need no enable (as ansible.builtin.systemd_service treats them).
ENABLED_STATES = ('enabled', 'enabled-runtime', 'static', 'alias', 'indirect', 'generated', 'transient')

# Where unit files live: a change here needs a daemon-reload before a start.
UNIT_DIRS = ('/etc/systemd/', '/run/systemd/system/', '/usr/lib/systemd/', '/lib/systemd/')

UNIT_OPTIONS = dict(
    name=dict(type='str', required=True),
    enabled=dict(type='bool'),
    state=dict(type='str', choices=['started', 'restarted', 'stopped']),
)


class UnitsFailed(Exception):
    """msg for fail_json, with what was done so far (actions, active)."""

    def __init__(self, msg, **result):
        Exception.__init__(self, msg)
        self.result = result


def _props(module, systemctl, names):
    """ActiveState, LoadState and NeedDaemonReload of every unit, one systemctl call."""
    rc, out, err = module.run_command([systemctl, 'show', '--property=Id,LoadState,ActiveState,NeedDaemonReload', '--'] + names)
    if rc != 0:
        raise UnitsFailed('units: systemctl show: %s' % (err.strip() or out.strip()))
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
        raise UnitsFailed('units: systemctl show returned %d units for %d names' % (len(props), len(names)))
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


def check_units(units, wait_active):
    """Raises UnitsFailed on a name that is not a unit's or a negative wait, before anything is done."""
    for u in units:
        n = u['name']
        if not n or n.startswith('-') or '/' in n or '.' not in n:
            raise UnitsFailed('units: %r is not a unit name with its suffix (e.g. kubelet.service)' % n)
    if wait_active < 0:
        raise UnitsFailed('units: wait_active must be ≥ 0, got %d' % wait_active)


def converge(module, units, daemon_reload=False, wait_active=0):
    """Converges units (dicts of UNIT_OPTIONS) in order: daemon-reload when
    asked or when a unit about to (re)start changed on disk, every enable in
    one call, every disable in another, then each state, then the wait.
    Returns (actions, active, diff text or ''); raises UnitsFailed (with the
    actions done so far). In check mode nothing is done, only listed."""
    names = [u['name'] for u in units]
    if not names:
        return [], {}, ''
    check_units(units, wait_active)
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
            raise UnitsFailed('units: systemctl %s %s: %s' % (verb, ' '.join(these), (err.strip() or out.strip() or 'exit %d' % rc)),
                              actions=actions, active=_is_active(module, systemctl, names))

    props = _props(module, systemctl, names)
    # A unit about to (re)start runs what systemd loaded: reload first if
    # its file changed on disk. Only for those: systemd 257 also flags a unit
    # whose enable link changed (our own enable --no-reload), which needs no
    # reload to stop, disable or leave running.
    starting = [u['name'] for u in units if u['state'] == 'restarted' or (
        u['state'] == 'started' and props[u['name']].get('ActiveState') not in ('active', 'activating', 'reloading'))]
    if daemon_reload or any(props[n].get('NeedDaemonReload') == 'yes' for n in starting):
        actions.append('daemon-reload')
        if not check:
            rc, out, err = module.run_command([systemctl, 'daemon-reload'])
            if rc != 0:
                raise UnitsFailed('units: systemctl daemon-reload: %s' % (err.strip() or out.strip()), actions=actions)
            props = _props(module, systemctl, names)
    for u in units:
        if props[u['name']].get('LoadState') == 'not-found' and (u['enabled'] or u['state'] in ('started', 'restarted')):
            raise UnitsFailed('units: %s: unit not found' % u['name'], actions=actions)
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
            raise UnitsFailed('units: still running after stop: %s' % ', '.join('%s %s' % (n, active[n]) for n in up),
                              actions=actions, active=active)
    if not check and waited and wait_active > 0:
        deadline = time.monotonic() + wait_active
        while any(active[n] != 'active' for n in waited) and time.monotonic() < deadline:
            time.sleep(0.25)
            active = _is_active(module, systemctl, names)
        down = [n for n in waited if active[n] != 'active']
        if down:
            raise UnitsFailed('units: not active after %ds: %s' % (wait_active, ', '.join('%s %s' % (n, active[n]) for n in down)),
                              actions=actions, active=active)
    was = ''
    if actions:
        # diff mode: what is done and what each unit was before
        was = ''.join(a + '\n' for a in actions) + ''.join(
            '%s was %s/%s\n' % (n, ufs.get(n) or 'unknown', props[n].get('ActiveState') or 'unknown')
            for n in names if any(a.endswith(' ' + n) for a in actions))
    return actions, active, was
