# -*- coding: utf-8 -*-
# Copyright kpssh maintainers. Apache-2.0.
"""Pre-warmed ansible-playbook for the kpssh engine (started by the engine,
never by hand).

    python3 kpssh_runner.py ANSIBLE_PLAYBOOK RUN_DIR

The engine starts this *ahead* of a run: in the next run's private directory
(RUN_DIR, the working directory), in its own process group, with the run's
minimal environment (ANSIBLE_CONFIG already names RUN_DIR/ansible.cfg, which
ansible reads while it is imported). It

1. imports what ansible-playbook imports and loads the plugins every kpssh
   run loads (Python start-up, ~700 modules, the ansible.builtin routing
   table, the connection/shell/become/callback plugins): the part of a run
   that does not depend on the run;
2. writes ``R`` to fd 3 and closes it (ready);
3. blocks on stdin. The engine writes the run's arguments (a JSON list of
   strings, paths only: never a secret) and closes stdin. Stdin closed with
   nothing on it means "not needed": exit 0;
4. points stdin at /dev/null and runs the ansible-playbook entry script
   ANSIBLE_PLAYBOOK exactly as the interpreter would (``sys.argv``,
   ``sys.path[0]``, ``__main__``);
5. exits with ansible-playbook's status *quickly*: stdout/stderr flushed and
   the atexit handlers run (ansible's temp-dir cleanup, multiprocessing's
   joins and queue flushes), then ``os._exit`` — tearing down ~700 modules
   and collecting the heap is 0.1-0.4 s that nobody needs (``--slow-exit``
   keeps the interpreter's own exit, for the engine's benchmark).

One process per run, started by the engine: its process-group kill, timeout
and reaping, the ControlPersist cleanup and the run directory's removal work
as for a cold ``ansible-playbook``.

Until it has its run, the process owns RUN_DIR (only ansible.cfg and empty
temp dirs in it): when its parent dies (SIGTERM as parent-death signal, set
here too, so that it holds under a sandbox that sets its own) or stdin
closes empty, it removes RUN_DIR and exits 0 — an idle runner leaves
nothing behind. With its run, the parent-death signal is SIGKILL again, as
for a cold ``ansible-playbook`` (the engine's restart sweep removes a
killed run's directory).
"""
import atexit
import gc
import json
import os
import runpy
import shutil
import signal
import sys

READY_FD = 3
MAX_REQUEST = 64 * 1024


def _fail(msg):
    sys.stderr.write('kpssh runner: %s\n' % msg)
    sys.stderr.flush()
    os._exit(70)  # EX_SOFTWARE; the engine falls back to a cold start


PR_SET_PDEATHSIG = 1


def _parent_death_signal(sig):
    """prctl(PR_SET_PDEATHSIG, sig); False where it cannot be set."""
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except Exception:
        return False


def _idle_until_run(run_dir):
    """While idle: a parent's death (or SIGTERM) removes run_dir and exits."""
    ppid = os.getppid()

    def leave(signum=None, frame=None):
        shutil.rmtree(run_dir, ignore_errors=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, leave)
    _parent_death_signal(signal.SIGTERM)
    if os.getppid() != ppid:  # died before the signal was armed
        leave()
    return ppid, leave


def _warm():
    # ansible.cli reads the configuration (ANSIBLE_CONFIG) and installs the
    # collection loader; the playbook CLI pulls in inventory, vars, executor.
    import ansible.cli.playbook  # noqa: F401
    # imported lazily during a run otherwise (the first task, the play's
    # flush_handlers)
    import ansible.executor.process.worker  # noqa: F401
    import ansible.playbook.handler_task_include  # noqa: F401
    import multiprocessing.popen_fork  # noqa: F401
    from ansible.plugins.loader import (action_loader, become_loader, callback_loader, connection_loader,
                                        inventory_loader, shell_loader, strategy_loader, vars_loader)

    # The same calls PlaybookExecutor.run, TaskQueueManager.load_callbacks and
    # the vars manager make on every run: plugin modules end up in
    # sys.modules and the loaders' path caches, so the run's own calls are
    # cheap. Nothing here depends on the run's arguments.
    for loader in (connection_loader, shell_loader, become_loader, callback_loader, vars_loader):
        for _ in loader.all(class_only=True):
            pass
    # Resolving these parses the ansible.builtin routing table and the
    # kpssh collection's metadata once.
    strategy_loader.get('linear', class_only=True)
    inventory_loader.get('yaml', class_only=True)
    callback_loader.get('dklesev.kpssh.kpssh_events', class_only=True)
    action_loader.get('dklesev.kpssh.stdin_exec', class_only=True)
    action_loader.get('ansible.builtin.normal', class_only=True)
    # Everything loaded so far lives as long as the process: keep it out of
    # the cyclic collector's work during the run.
    gc.collect()
    gc.freeze()


def _read_request():
    data = b''
    while True:
        chunk = os.read(0, 65536)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_REQUEST:
            _fail('request too large')
    if not data.strip():
        return None
    try:
        args = json.loads(data.decode('utf-8'))
    except ValueError as e:
        _fail('bad request: %s' % e)
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        _fail('bad request: want a JSON list of strings')
    return args


def _exit_code(e):
    """The status the interpreter would exit with for SystemExit e."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xff
    sys.stderr.write('%s\n' % (e.code,))
    return 1


def _run(playbook_bin, args, slow_exit):
    sys.argv = [playbook_bin] + args
    if slow_exit:
        runpy.run_path(playbook_bin, run_name='__main__')
        return
    code = 0
    try:
        runpy.run_path(playbook_bin, run_name='__main__')
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException:
        import traceback
        traceback.print_exc()
        code = 1
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    atexit._run_exitfuncs()
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    os._exit(code)


def main():
    argv = sys.argv[1:]
    slow_exit = argv[:1] == ['--slow-exit']
    if slow_exit:
        argv = argv[1:]
    if len(argv) != 2:
        _fail('usage: kpssh_runner.py [--slow-exit] ANSIBLE_PLAYBOOK RUN_DIR')
    playbook_bin, run_dir = argv
    if os.path.realpath(os.getcwd()) != os.path.realpath(run_dir):
        _fail('not started in its run directory')
    ppid, leave = _idle_until_run(run_dir)
    # As if the entry script had been run: its directory first on sys.path,
    # not this file's.
    sys.path[0] = os.path.dirname(playbook_bin)
    try:
        _warm()
    except BaseException as e:  # the engine reads stderr's tail if it cares
        _fail('warm-up failed: %r' % (e,))
    try:
        os.write(READY_FD, b'R')
        os.close(READY_FD)
    except OSError:
        pass  # nobody waits for readiness

    args = _read_request()
    if args is None:
        leave()
    # The run's directory is the engine's from here (its secrets are written
    # before the request): die with the parent as a cold run would.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _parent_death_signal(signal.SIGKILL)
    if os.getppid() != ppid:  # nobody is left to run it or clean up after it
        shutil.rmtree(run_dir, ignore_errors=True)
        os._exit(137)
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
    _run(playbook_bin, args, slow_exit)


if __name__ == '__main__':
    main()
