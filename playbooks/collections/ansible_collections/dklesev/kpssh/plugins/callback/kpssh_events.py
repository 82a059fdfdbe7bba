# -*- coding: utf-8 -*-
# Copyright kpssh maintainers. Apache-2.0.
from __future__ import annotations

DOCUMENTATION = r'''
name: kpssh_events
type: stdout
short_description: JSON-lines event stream for the kpssh engine
description:
  - Prints one JSON object per line on stdout, one per playbook event, for the
    kpssh controller to parse (C(internal/engine)).
  - Events C(start) (with C(ansible_version), the ansible-core that runs), C(play), C(task), C(ok), C(failed), C(unreachable),
    C(skipped), C(no_hosts) and a final C(stats) line. Host events carry the
    task name, host, rc, msg and bounded stdout/stderr tails.
  - Module arguments (C(invocation)) are never printed. Results of C(no_log)
    tasks arrive censored and are reported as C(censored=true).
  - With C(--diff), an C(ok) event of a changed task carries the task's diff
    (C(diff), the start of Ansible's own rendering, bounded; a loop's item diffs
    are joined). A censored result has none.
  - Every line has C(v=1); consumers ignore lines that are not JSON objects.
version_added: 0.1.0
author:
  - kpssh maintainers
'''

import json
import sys

from ansible.plugins.callback import CallbackBase
from ansible.release import __version__ as ANSIBLE_VERSION

TAIL = 8192
DIFF_HEAD = 4096


def _text(value):
    if value is None:
        return None
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, sort_keys=True, default=str)
    except Exception:  # pragma: no cover - best effort
        return str(value)


def _tail(ev, key, value, limit=TAIL):
    value = _text(value)
    if not value:
        return
    if len(value) > limit:
        ev[key] = value[-limit:]
        ev[key + '_truncated'] = True
    else:
        ev[key] = value


def _internal(task):
    """The kpssh_internal task var marks the engine's own tasks."""
    try:
        v = (getattr(task, 'vars', None) or {}).get('kpssh_internal')
    except Exception:
        return None
    return v if isinstance(v, str) else None


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = 'stdout'
    CALLBACK_NAME = 'dklesev.kpssh.kpssh_events'

    def _emit(self, ev):
        ev['v'] = 1
        line = json.dumps(ev, sort_keys=True, ensure_ascii=True, default=str)
        # One write + flush per event: the controller may kill this process
        # (timeout) and still needs every event written before that.
        sys.stdout.write(line + '\n')
        sys.stdout.flush()

    def _host_event(self, kind, result, **extra):
        task = result._task
        ev = dict(event=kind, task=task.get_name() if task else '', host=result._host.get_name() if result._host else '')
        internal = _internal(task)
        if internal:
            ev['internal'] = internal
        ev.update(extra)
        return ev

    def _details(self, ev, res):
        """rc, msg and output tails of a (failed/unreachable) result."""
        if not isinstance(res, dict):
            return
        if 'censored' in res:
            ev['censored'] = True
        # a loop: report the first failed item
        items = res.get('results')
        if isinstance(items, list):
            for item in items:
                if isinstance(item, dict) and (item.get('failed') or item.get('unreachable')):
                    res = dict(res, **{k: item[k] for k in ('rc', 'msg', 'stderr', 'stdout', 'module_stderr', 'module_stdout', 'censored') if k in item})
                    if 'censored' in item:
                        ev['censored'] = True
                    break
        rc = res.get('rc')
        if isinstance(rc, int) and not isinstance(rc, bool):
            ev['rc'] = rc
        _tail(ev, 'msg', res.get('msg'))
        _tail(ev, 'stderr', res.get('stderr') or res.get('module_stderr'))
        _tail(ev, 'stdout', res.get('stdout') or res.get('module_stdout'))
        if not res.get('msg') and res.get('exception'):
            _tail(ev, 'exception', res.get('exception'), 2048)

    def _diff(self, ev, res):
        """The rendered diff of a changed result (a loop: of its items)."""
        if not isinstance(res, dict) or 'censored' in res:
            return
        diffs = []
        if res.get('diff'):
            diffs.append(res['diff'])
        for item in res.get('results') or []:
            if isinstance(item, dict) and item.get('diff') and 'censored' not in item:
                diffs.append(item['diff'])
        text = ''
        for d in diffs:
            try:
                text += self._get_diff(d)
            except Exception:  # pragma: no cover - a module's odd diff shape
                text += _text(d) + '\n'
        text = text.strip('\n')
        if len(text) > DIFF_HEAD:  # the start: where the file names are
            ev['diff'], ev['diff_truncated'] = text[:DIFF_HEAD], True
        elif text:
            ev['diff'] = text

    # playbook structure

    def v2_playbook_on_start(self, playbook):
        self._emit(dict(event='start', ansible_version=ANSIBLE_VERSION))

    def v2_playbook_on_play_start(self, play):
        self._emit(dict(event='play', name=play.get_name()))

    def v2_playbook_on_task_start(self, task, is_conditional):
        ev = dict(event='task', task=task.get_name())
        internal = _internal(task)
        if internal:
            ev['internal'] = internal
        self._emit(ev)

    def v2_playbook_on_handler_task_start(self, task):
        self._emit(dict(event='task', task=task.get_name(), handler=True))

    def v2_playbook_on_no_hosts_matched(self):
        self._emit(dict(event='no_hosts'))

    def v2_playbook_on_no_hosts_remaining(self):
        self._emit(dict(event='no_hosts_remaining'))

    # host results

    def v2_runner_on_ok(self, result):
        changed = bool(result._result.get('changed', False))
        ev = self._host_event('ok', result, changed=changed)
        if changed:
            self._diff(ev, result._result)
        self._emit(ev)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        ev = self._host_event('failed', result, ignore_errors=bool(ignore_errors))
        self._details(ev, result._result)
        self._emit(ev)

    def v2_runner_on_unreachable(self, result):
        ev = self._host_event('unreachable', result)
        self._details(ev, result._result)
        self._emit(ev)

    def v2_runner_on_skipped(self, result):
        self._emit(self._host_event('skipped', result))

    def v2_runner_on_async_failed(self, result):
        ev = self._host_event('failed', result, ignore_errors=False)
        self._details(ev, result._result)
        self._emit(ev)

    def v2_playbook_on_stats(self, stats):
        totals = dict(ok=0, changed=0, failures=0, unreachable=0, skipped=0, rescued=0, ignored=0)
        for host in sorted(stats.processed.keys()):
            s = stats.summarize(host)
            for k in totals:
                totals[k] += int(s.get(k, 0) or 0)
        self._emit(dict(event='stats', hosts=len(stats.processed), totals=totals))
