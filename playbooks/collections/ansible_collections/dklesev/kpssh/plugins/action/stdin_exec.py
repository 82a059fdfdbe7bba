# -*- coding: utf-8 -*-
# Copyright kpssh maintainers. Apache-2.0.
"""dklesev.kpssh.stdin_exec — run one command on the host, feed it a
controller-side file on stdin.

Why an action plugin and not ``script``/``shell``/``raw``:

* ``script`` copies the file to the host (it lands on the host's disk) and
  ``shell``/``raw`` put the payload into the remote command line (visible in
  the host's process table). Here the payload travels only on the SSH
  channel's stdin, over the task's existing (multiplexed) connection.
* It runs no module, so the host needs no Python.
* The result (rc + bounded stdout/stderr tails) is also written to a 0600
  ``result_file`` on the controller, so the caller gets the failure tail even
  when the task runs with ``no_log: true`` (which censors results before any
  callback sees them). The kpssh engine reads that file, redacts it and
  removes it with the run directory.

The same plugin feeds the verified-mode shim its envelope: ``cmd`` is the shim
command, ``stdin_file`` the envelope, ``expected_rc`` the shim's success code.
"""
from __future__ import annotations

import json
import os

from ansible.errors import AnsibleConnectionFailure
from ansible.module_utils.common.text.converters import to_native
from ansible.plugins.action import ActionBase

DEFAULT_TAIL = 16384
MAX_STDIN = 8 * 1024 * 1024

ARGUMENT_SPEC = dict(
    cmd=dict(type='str', required=True),
    stdin_file=dict(type='path'),
    remove_stdin_file=dict(type='bool', default=False),
    result_file=dict(type='path'),
    expected_rc=dict(type='list', elements='int', default=[0]),
    tail_bytes=dict(type='int', default=DEFAULT_TAIL),
    sudoable=dict(type='bool', default=False),
    changed=dict(type='bool', default=True),
    connect_check=dict(type='bool', default=False),
    # the connect check's command: `true`, or the kpssh-shim's `ping` op on
    # a Verified host (under ForceCommand every command reaches the shim)
    connect_cmd=dict(type='str', default='true'),
)


def _tail(text, limit):
    """Last ``limit`` characters of text, and whether anything was dropped."""
    if text is None:
        return '', False
    if limit <= 0:
        return '', bool(text)
    if len(text) <= limit:
        return text, False
    return text[-limit:], True


def _write_result(path, payload):
    """Write the result JSON 0600, never following a symlink."""
    if not path:
        return
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_CLOEXEC', 0)
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
        data = json.dumps(payload, sort_keys=True, ensure_ascii=True).encode('ascii')
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
    finally:
        os.close(fd)


class ActionModule(ActionBase):

    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        if task_vars is None:
            task_vars = dict()
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp  # no remote temp dir is ever created

        validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        cmd = args['cmd']
        result_file = args['result_file']
        tail_bytes = args['tail_bytes']
        expected = args['expected_rc'] or [0]

        in_data = None
        if args['stdin_file']:
            path = args['stdin_file']
            try:
                st = os.stat(path)
                if st.st_size > MAX_STDIN:
                    raise ValueError('stdin_file is larger than %d bytes' % MAX_STDIN)
                with open(path, 'rb') as f:
                    in_data = f.read()
            except (OSError, ValueError) as e:
                result.update(failed=True, rc=-1, msg='cannot read stdin_file: %s' % to_native(e))
                _write_result(result_file, dict(rc=-1, error=result['msg']))
                return result
            finally:
                if args['remove_stdin_file']:
                    try:
                        os.unlink(path)
                    except OSError:
                        pass

        if args['connect_check']:
            # The kpssh engine's connect check, inside this task (one task
            # less per phase): a session that runs `true` before anything of
            # the profile does. result_file says how far it got, so the
            # engine can tell "nothing ran" from "reached", even when the run
            # is killed in the middle of cmd.
            # ssh censors its connection errors in no_log tasks; `true` carries
            # nothing secret, and the reason ("Host key verification failed",
            # refused, timeout) is what the engine reports.
            pc = getattr(self._connection, '_play_context', None) or self._play_context
            no_log = pc.no_log
            pc.no_log = False
            try:
                chk = self._low_level_execute_command(args['connect_cmd'], sudoable=False, executable=False)
            except AnsibleConnectionFailure as e:
                in_data = None
                _write_result(result_file, dict(rc=255, connected=False, connection_error=to_native(e)))
                raise
            finally:
                pc.no_log = no_log
            crc = chk.get('rc', 0)
            if crc != 0:
                in_data = None
                out, out_cut = _tail(chk.get('stdout'), tail_bytes)
                err, err_cut = _tail(chk.get('stderr'), tail_bytes)
                _write_result(result_file, dict(rc=crc, connected=True, connect_rc=crc, stdout=out, stderr=err,
                                                stdout_truncated=out_cut, stderr_truncated=err_cut))
                result.update(failed=True, rc=crc, stdout=out, stderr=err, changed=False,
                              msg='connect check failed on the host (rc=%d)' % crc)
                return result
            _write_result(result_file, dict(connected=True))

        try:
            # executable=False: the command line goes to the login shell as is
            # (no `/bin/sh -c '… && sleep 0'` wrapper), so a ForceCommand shim
            # sees exactly `cmd` in SSH_ORIGINAL_COMMAND.
            res = self._low_level_execute_command(cmd, sudoable=args['sudoable'], in_data=in_data, executable=False)
        except AnsibleConnectionFailure as e:
            # ssh exited 255: the connection failed or broke, or the remote
            # command itself exited 255. Record it, then let Ansible mark the
            # host unreachable.
            payload = dict(rc=255, connection_error=to_native(e))
            if args['connect_check']:
                payload['connected'] = True
            _write_result(result_file, payload)
            raise
        finally:
            in_data = None

        rc = res.get('rc', 0)
        out, out_cut = _tail(res.get('stdout'), tail_bytes)
        err, err_cut = _tail(res.get('stderr'), tail_bytes)
        payload = dict(rc=rc, stdout=out, stderr=err, stdout_truncated=out_cut, stderr_truncated=err_cut)
        if args['connect_check']:
            payload['connected'] = True
        _write_result(result_file, payload)

        result.update(rc=rc, stdout=out, stderr=err, changed=args['changed'])
        if rc not in expected:
            result['failed'] = True
            result['msg'] = 'command exited %d' % rc
        return result
