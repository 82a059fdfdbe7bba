# -*- coding: utf-8 -*-
# Copyright kpssh maintainers. Apache-2.0.
# Documentation stub: the work is done by the action plugin of the same name
# (plugins/action/stdin_exec.py); this module never runs on a host.
from __future__ import annotations

DOCUMENTATION = r'''
module: stdin_exec
short_description: Run a command on the host and feed it a controller-side file on stdin
description:
  - Runs I(cmd) on the host over the task's connection, exactly as given (the
    login shell interprets it; no C(/bin/sh -c) wrapper), and writes the bytes
    of the controller-side file I(stdin_file) to its stdin.
  - Nothing is written to the host's disk and nothing but I(cmd) appears in the
    host's process arguments, so secrets carried in the file stay off both.
  - No Python is needed on the host.
  - The rc and bounded stdout/stderr tails are returned and, when
    I(result_file) is set, also written there (mode 0600) - readable by the
    caller even when the task runs with C(no_log).
version_added: 0.1.0
options:
  cmd:
    description: Command line run on the host, e.g. C(bash -s) or C(sudo -n bash -s).
    type: str
    required: true
  stdin_file:
    description: Controller-side file whose bytes are fed to the command's stdin.
    type: path
  remove_stdin_file:
    description: Unlink I(stdin_file) on the controller as soon as it is read.
    type: bool
    default: false
  result_file:
    description:
      - Controller-side file receiving C({rc, stdout, stderr, stdout_truncated, stderr_truncated}) as JSON (mode 0600),
        or C({rc, connection_error}) with rc 255 when ssh fails.
    type: path
  expected_rc:
    description: Exit codes that count as success.
    type: list
    elements: int
    default: [0]
  tail_bytes:
    description: How many characters of stdout and of stderr are kept.
    type: int
    default: 16384
  sudoable:
    description: Let the play's C(become) wrap the command. Off by default - callers choose C(sudo -n …) themselves.
    type: bool
    default: false
  changed:
    description: What to report as C(changed) on success.
    type: bool
    default: true
  connect_check:
    description:
      - Run C(true) over the connection first (the kpssh engine's connect check). When that fails, I(cmd) does not run,
        and I(result_file) says C(connected=false) (ssh failed) or carries C(connect_rc) (C(true) failed on the host).
      - Once it succeeded, I(result_file) holds C({connected=true}) while I(cmd) runs, and every later result carries
        C(connected=true).
    type: bool
    default: false
  connect_cmd:
    description: The connect check's command (C(kpssh-shim ping) on a Verified host, where sshd's ForceCommand runs the shim for every command).
    type: str
    default: "true"
author:
  - kpssh maintainers
'''

EXAMPLES = r'''
- name: run a script as root without Python on the host
  dklesev.kpssh.stdin_exec:
    cmd: sudo -n bash -s
    stdin_file: /dev/shm/run/script.sh
    result_file: /dev/shm/run/result.json
  no_log: true
'''

RETURN = r'''
rc:
  description: Exit status of the command.
  type: int
  returned: always
stdout:
  description: Tail of stdout.
  type: str
  returned: always
stderr:
  description: Tail of stderr.
  type: str
  returned: always
'''
