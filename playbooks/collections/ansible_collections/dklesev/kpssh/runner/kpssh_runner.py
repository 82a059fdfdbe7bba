# -*- coding: utf-8 -*-
# Copyright kpssh maintainers. Apache-2.0.
"""Pre-warmed ansible-playbook for the kpssh engine (started by the engine,
never by hand).

    python3 kpssh_runner.py [--cold] [--slow-exit] [--no-prebuild] ANSIBLE_PLAYBOOK RUN_DIR

First of all, when the engine asks for it (KPSSH_SANDBOX=1), it applies the
run sandbox to itself (kpssh_sandbox.py, Landlock: the run sees only the
system directories, the collection, the roles and its own RUN_DIR; failing
to apply it is fatal, exit 71) — before ansible is imported, so nothing the
run starts on the controller is outside it. ``--cold`` (no warm runner
available): no warm-up and no ready report, the request is read at once.

The engine starts this *ahead* of a run: in the next run's private directory
(RUN_DIR, the working directory), in its own process group, with the run's
minimal environment (ANSIBLE_CONFIG already names RUN_DIR/ansible.cfg, which
ansible reads while it is imported). It

1. imports what ansible-playbook imports and loads the plugins every kpssh
   run loads (Python start-up, ~700 modules, the ansible.builtin routing
   table, the connection/shell/become/callback plugins): the part of a run
   that does not depend on the run;
2. writes ``R`` to fd 3 and closes it (ready);
3. builds the AnsiballZ payloads of the modules the shipped roles use
   (PREBUILD) into ansible's module cache in RUN_DIR, one by one, until the
   request is there (``--no-prebuild``: not, for the engine's benchmark);
   then blocks on stdin. The engine writes the run's request (JSON: ``argv``,
   the arguments, paths only: never a secret; ``tcp``, the ports the run
   may connect to — a second sandbox layer, applied now) and closes stdin. Stdin closed with
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
nothing behind. With its run (warm or cold), the parent's death ends the
whole run: its process group, the ssh ControlPersist master, the contents of
RUN_DIR (_end_run; the engine's restart sweep removes the directory) — a
controller killed mid-phase (OOM, SIGKILL, a lost leader outside a pod)
leaves no ansible worker or ssh behind.
"""
import atexit
import gc
import json
import os
import runpy
import select
import shutil
import signal
import sys
import warnings

import kpssh_sandbox as _sandbox

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


# The parent-death signal of a runner with its run: caught, so that the
# run's other processes die too (SIGKILL as parent-death signal would end
# this process alone). The engine itself never sends it.
PARENT_DEATH = signal.SIGUSR2


def _proc_stat(pid):
    """(state, pgrp) of pid from /proc, or None."""
    try:
        with open('/proc/%d/stat' % pid) as f:
            fields = f.read().rsplit(')', 1)[1].split()
        return fields[0], int(fields[2])
    except (OSError, IndexError, ValueError):
        return None


def _end_run(run_dir):
    """What the engine would do after a run it can no longer finish: kill
    the run's process group (ansible's workers and their ssh clients: no
    task starts another connection), then every process naming run_dir
    (the ssh ControlPersist master daemonized into a session of its own;
    its title is "ssh: RUN_DIR/cm [mux]"), then empty run_dir (the SSH key,
    the secrets; under the sandbox the directory itself stays for the
    engine's restart sweep), and exit 137 as a SIGKILLed run would."""
    me, pgrp = os.getpid(), os.getpgrp()
    # the directory as a whole path element: not another run's whose name
    # merely starts with it
    needles = (run_dir.encode() + b'/', run_dir.encode() + b'\0')
    for sweep in ('group', 'mentioning'):
        for name in os.listdir('/proc'):
            if not name.isdigit() or int(name) == me:
                continue
            pid = int(name)
            st = _proc_stat(pid)
            if st is None or st[0] == 'Z':
                continue
            if sweep == 'group':
                hit = st[1] == pgrp
            else:
                try:
                    with open('/proc/%d/cmdline' % pid, 'rb') as f:
                        cmd = f.read()
                    hit = any(n in cmd for n in needles)
                except OSError:
                    hit = False
            if hit:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
    shutil.rmtree(run_dir, ignore_errors=True)
    os._exit(137)


def _die_with_parent(ppid, run_dir):
    """Arm PARENT_DEATH: the run ends with the engine (_end_run)."""
    signal.signal(PARENT_DEATH, lambda signum, frame: _end_run(run_dir))
    _parent_death_signal(PARENT_DEATH)
    if os.getppid() != ppid:  # died before the signal was armed
        _end_run(run_dir)


def _gone(pid, within=2.0):
    """Whether pid has exited (a zombie counts: its parent died with it
    unreaped), waiting up to within seconds: the runner's parent-death
    signal comes as the parent dies."""
    import time
    end = time.monotonic() + within
    while True:
        try:
            with open('/proc/%d/stat' % pid) as f:
                state = f.read().rsplit(')', 1)[1].split()[0]
            if state in ('Z', 'X'):
                return True
        except (OSError, IndexError):
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.05)


def _cleanup_helper(run_dir):
    """Fork, before the sandbox, the one process that may remove run_dir
    itself (sandboxed, the runner may empty it but not unlink it from its
    parent). The helper holds only the read end of a pipe: EOF without a
    byte (the runner ended without a run: its parent died, stdin closed
    empty, warm-up failed) removes run_dir; a byte (the hand-off: the
    directory is the engine's from then on) makes it exit. Returns the write
    end (not inherited by the run). While the engine (the runner's parent)
    lives, the directory is its to remove (it may start a cold run in it
    after a failed warm-up): the helper removes it only once the engine is
    gone."""
    engine = os.getppid()
    r, w = os.pipe()
    if os.fork() == 0:
        try:
            os.close(w)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.closerange(3, r)
            os.closerange(r + 1, 1024)
            # the runner's death closes the pipe; SIGTERM/SIGKILL of the run's
            # process group ends this too (the engine removes the directory)
            if not os.read(r, 1) and _gone(engine):
                shutil.rmtree(run_dir, ignore_errors=True)
        finally:
            os._exit(0)
    os.close(r)
    return w


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
                                        init_plugin_loader, inventory_loader, shell_loader, strategy_loader,
                                        vars_loader)

    # ansible-core >= 2.15 installs the collection finder in CLI.run, not
    # at import: without it no ansible_collections.* plugin (our callback,
    # our action plugin, ansible.builtin's routing) can load here. The run's
    # CLI.run makes the same call with the same paths (ansible-playbook has
    # no --collections-path; ansible.cfg is the run's) and finds the finder
    # in place; its "already configured" warning is expected, not shown.
    warnings.filterwarnings('ignore', message='AnsibleCollectionFinder has already been configured')
    init_plugin_loader()

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


# The modules whose AnsiballZ payloads an idle runner builds, most used
# first: the shipped roles' module tasks (TestPrebuiltModules keeps the
# list in step with them). Building a payload (the module_utils scan and
# the zip) costs the controller 0.1-0.7 s per module and run; ansible caches
# it in the run's local temp dir, which is this process's: built here, the
# run's workers only load it.
PREBUILD = (
    'dklesev.kpssh.host_state', 'dklesev.kpssh.files', 'dklesev.kpssh.units',
    'ansible.builtin.command', 'ansible.builtin.systemd_service', 'ansible.builtin.file',
    'ansible.builtin.stat', 'ansible.builtin.copy', 'ansible.builtin.get_url', 'ansible.builtin.uri',
    'ansible.builtin.slurp', 'ansible.builtin.apt', 'ansible.builtin.user',
)


def _request_waiting():
    return bool(select.select([0], [], [], 0)[0])


def _prebuild(names, stop):
    """Builds the payloads of names into ansible's module cache, one by
    one, until stop() says the run's request is there (the run builds what
    is missing itself). A failure leaves that module to the run."""
    from ansible import constants as C
    from ansible.executor import module_common
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import module_loader
    from ansible.template import Templar

    templar = Templar(loader=DataLoader())
    # the interpreter only makes the shebang, which is not in the cache
    task_vars = {'ansible_python_interpreter': '/usr/bin/python3'}
    compression = C.config.get_config_value('DEFAULT_MODULE_COMPRESSION')
    for name in names:
        if stop():
            return
        try:
            ctx = module_loader.find_plugin_with_context(name)
            if ctx.resolved:
                module_common.modify_module(module_name=ctx.plugin_resolved_name, module_path=ctx.plugin_resolved_path,
                                            module_args={}, templar=templar, task_vars=task_vars,
                                            module_compression=compression)
        except Exception:
            pass


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
    if not isinstance(args, dict):
        _fail('bad request: want a JSON object {argv, tcp}')
    argv, tcp = args.get('argv'), args.get('tcp', [])
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        _fail('bad request: argv must be a list of strings')
    if not isinstance(tcp, list) or not all(isinstance(p, int) and 0 < p < 65536 for p in tcp):
        _fail('bad request: tcp must be a list of ports')
    return argv, tcp


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


def _sandbox_fail(e):
    sys.stderr.write('kpssh sandbox: %s\n' % (e,))
    sys.stderr.flush()
    os._exit(_sandbox.EXIT_SANDBOX)


def main():
    argv = sys.argv[1:]
    cold = argv[:1] == ['--cold']
    if cold:
        argv = argv[1:]
    slow_exit = argv[:1] == ['--slow-exit']
    if slow_exit:
        argv = argv[1:]
    prebuild = argv[:1] != ['--no-prebuild']
    if not prebuild:
        argv = argv[1:]
    if len(argv) != 2:
        _fail('usage: kpssh_runner.py [--cold] [--slow-exit] [--no-prebuild] ANSIBLE_PLAYBOOK RUN_DIR')
    playbook_bin, run_dir = argv
    if os.path.realpath(os.getcwd()) != os.path.realpath(run_dir):
        _fail('not started in its run directory')
    # Before anything else (single-threaded, nothing of ansible imported).
    helper = None
    if not cold and os.environ.get('KPSSH_SANDBOX') == '1':
        helper = _cleanup_helper(run_dir)
    try:
        sandboxed = _sandbox.from_env(run_dir)
    except _sandbox.SandboxError as e:
        _sandbox_fail(e)
    if cold:
        ppid = os.getppid()
    else:
        ppid, leave = _idle_until_run(run_dir)
    # As if the entry script had been run: its directory first on sys.path,
    # not this file's.
    sys.path[0] = os.path.dirname(playbook_bin)
    if not cold:
        try:
            _warm()
        except BaseException as e:  # the engine reads stderr's tail if it cares
            _fail('warm-up failed: %r' % (e,))
        try:
            os.write(READY_FD, b'R')
            os.close(READY_FD)
        except OSError:
            pass  # nobody waits for readiness
        # after the ready report: a run that comes early waits for one
        # module's build at most, never for the list
        if prebuild:
            _prebuild(PREBUILD, _request_waiting)

    req = _read_request()
    if req is None:
        if cold:
            _fail('no request')
        leave()
    args, tcp = req
    if helper is not None:
        os.write(helper, b'H')  # handed off: the helper leaves the directory be
        os.close(helper)
    if sandboxed:
        try:
            _sandbox.restrict_tcp(tcp)
        except _sandbox.SandboxError as e:
            _sandbox_fail(e)
    if not cold:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # The run's directory is the engine's from here (its secrets are written
    # before the request); if the engine dies, the run dies with it.
    _die_with_parent(ppid, run_dir)
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
    _run(playbook_bin, args, slow_exit)


if __name__ == '__main__':
    main()
