# -*- coding: utf-8 -*-
# Copyright kpssh maintainers. Apache-2.0.
"""The run sandbox of the kpssh engine (Landlock), applied by kpssh_runner.py
to itself before it imports ansible: everything the run does on the
controller — ansible-playbook, its workers, ssh, and whatever a task makes
run there (a lookup, a ``delegate_to: localhost`` module, ``connection:
local``) — inherits it and cannot lose it.

The engine passes the policy in the environment (paths only, never a secret):

    KPSSH_SANDBOX=1            apply it; failing to is fatal (exit 71)
    KPSSH_SANDBOX_READ=a:b:…   extra read-only trees (collections, roles,
                               the ansible-playbook and its interpreter)

What the run may then touch on the controller's filesystem:

- read and execute: /usr, /bin, /sbin, /lib*, /etc, /proc (other processes'
  memory, environ and fds stay out of reach: Landlock denies ptrace-mode
  access across its domain) and KPSSH_SANDBOX_READ;
- read and write: its own run directory (the working directory) and the
  character devices a process needs (/dev/null, …, ptys);
- in /dev/shm: create, read, write and remove files — POSIX semaphores
  (sem_open) live there, and ansible's multiprocessing needs them; no
  directory listing. Landlock grants a right on a whole tree, so another
  run's directory is out of reach only where run directories are not in
  /dev/shm (the engine prefers /run/kpssh, a tmpfs of their own);
- nothing else: not the ServiceAccount token (/var/run/secrets/…), not the
  other runs' directories, not /tmp or $HOME.

On kernels with Landlock ABI >= 4 the run also may not listen on TCP nor
connect to any TCP port but the ones given to restrict_tcp() at the hand-off
(the host's SSH port), and from ABI 6 on it may not signal processes outside
its domain (the controller) nor connect to their abstract unix sockets.
"""
import ctypes
import os

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446  # same on every architecture
PR_SET_NO_NEW_PRIVS = 38
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH, RULE_NET_PORT = 1, 2

FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_FILE = 1 << 5
FS_MAKE_REG = 1 << 8
FS_TRUNCATE = 1 << 14
FS_IOCTL_DEV = 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1 << 0, 1 << 1

SYSTEM_READ = ('/usr', '/bin', '/sbin', '/lib', '/lib32', '/lib64', '/libx32', '/etc', '/proc')
DEVICES = ('/dev/null', '/dev/zero', '/dev/full', '/dev/random', '/dev/urandom', '/dev/tty', '/dev/ptmx', '/dev/pts')
EXIT_SANDBOX = 71


class SandboxError(Exception):
    pass


class _Ruleset(ctypes.Structure):
    _fields_ = [('handled_access_fs', ctypes.c_uint64), ('handled_access_net', ctypes.c_uint64),
                ('scoped', ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [('allowed_access', ctypes.c_uint64), ('parent_fd', ctypes.c_int32)]


class _NetPort(ctypes.Structure):
    _fields_ = [('allowed_access', ctypes.c_uint64), ('port', ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _sys(nr, *args):
    r = _libc.syscall(ctypes.c_long(nr), *args)
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


def abi():
    """The kernel's Landlock ABI version (0: none, or refused by seccomp)."""
    try:
        return _sys(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    except OSError:
        return 0


def _fs_all(v):
    bits = (1 << 13) - 1  # ABI 1: execute … make_sym
    if v >= 2:
        bits |= 1 << 13  # refer
    if v >= 3:
        bits |= FS_TRUNCATE
    if v >= 5:
        bits |= FS_IOCTL_DEV
    return bits


def _file_rights(v):
    bits = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE
    if v >= 3:
        bits |= FS_TRUNCATE
    if v >= 5:
        bits |= FS_IOCTL_DEV
    return bits


def _restrict(v, attr, size, rules):
    fd = _sys(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    try:
        for kind, rule in rules:
            _sys(SYS_ADD_RULE, ctypes.c_int(fd), ctypes.c_int(kind), ctypes.byref(rule), ctypes.c_uint32(0))
        if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            e = ctypes.get_errno()
            raise OSError(e, 'no_new_privs: ' + os.strerror(e))
        _sys(SYS_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0))
    finally:
        os.close(fd)


def _path_rule(path, rights, v):
    try:
        pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return None  # absent on this system: nothing to allow
    try:
        if not os.path.isdir(path):
            rights &= _file_rights(v)
        return pfd, _PathBeneath(rights, pfd)
    except BaseException:
        os.close(pfd)
        raise


def apply(run_dir, read_paths=()):
    """Restrict this process (single-threaded: call it first) and all it
    starts to the policy above. Raises SandboxError when it cannot."""
    v = abi()
    if v < 1:
        raise SandboxError('Landlock is not available (kernel without it, not in its lsm= list, '
                           'or the landlock_* system calls are refused by seccomp)')
    fs = _fs_all(v)
    ro = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
    dev = FS_READ_FILE | FS_WRITE_FILE | FS_READ_DIR | (FS_TRUNCATE if v >= 3 else 0) | (FS_IOCTL_DEV if v >= 5 else 0)
    # TCP is the second layer's (restrict_tcp, at the hand-off: the port is
    # the run's).
    attr, size = _Ruleset(fs, 0, 0), 8
    if v >= 6:
        attr.scoped, size = SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL, 24
    wanted = [(p, ro) for p in SYSTEM_READ + tuple(p for p in read_paths if p)]
    wanted += [(p, dev) for p in DEVICES]
    wanted.append(('/dev/shm', FS_READ_FILE | FS_WRITE_FILE | FS_MAKE_REG | FS_REMOVE_FILE | (FS_TRUNCATE if v >= 3 else 0)))
    wanted.append((run_dir, fs))
    fds, rules = [], []
    try:
        for path, rights in wanted:
            r = _path_rule(path, rights, v)
            if r is not None:
                fds.append(r[0])
                rules.append((RULE_PATH_BENEATH, r[1]))
        try:
            _restrict(v, attr, size, rules)
        except OSError as e:
            raise SandboxError('Landlock: %s' % e)
    finally:
        for fd in fds:
            os.close(fd)
    return v


def restrict_tcp(ports):
    """A second layer (ABI >= 4): TCP connect only to ports, no bind.
    Without TCP rules in the kernel it does nothing."""
    v = abi()
    if v < 4:
        return
    rules = [(RULE_NET_PORT, _NetPort(NET_CONNECT_TCP, int(p))) for p in sorted(set(ports))]
    try:
        _restrict(v, _Ruleset(0, NET_BIND_TCP | NET_CONNECT_TCP, 0), 16, rules)
    except OSError as e:
        raise SandboxError('Landlock (tcp): %s' % e)


def from_env(run_dir):
    """Apply the policy the engine asked for in the environment; True when
    applied, False when not asked for."""
    if os.environ.get('KPSSH_SANDBOX') != '1':
        return False
    read = [p for p in os.environ.get('KPSSH_SANDBOX_READ', '').split(':') if p]
    apply(run_dir, read)
    return True


def tcp_from_env():
    """The TCP ports of KPSSH_SANDBOX_TCP (a cold run knows its host's port
    at start), as restrict_tcp takes them."""
    return [int(p) for p in os.environ.get('KPSSH_SANDBOX_TCP', '').split(',') if p.strip()]
