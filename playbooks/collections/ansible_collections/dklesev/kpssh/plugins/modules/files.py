#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright kpssh maintainers. Apache-2.0.
from __future__ import annotations

DOCUMENTATION = r'''
module: files
short_description: Write several files in one round trip, each only when it differs
description:
  - Writes every file of I(files) whose content, mode, owner or group differs
    from what is on the host (atomically: a temporary file in the same
    directory, fsync, rename), creating missing parent directories (0755),
    after removing what I(remove) matches. One module run instead of one
    C(copy)/C(template) task per file (each of those is two round trips:
    a C(stat), then the copy).
  - A file's bytes come from I(content) (render templates on the controller
    with C(lookup('template', ...))) or from I(src), a file already on the
    host (a binary from a mirror directory or a download cache).
  - In the same run it also makes I(directories) (mode, owner, group),
    unpacks the top level of I(archives), writes a I(manifest) of every path
    it manages and finally runs read-only I(commands) (e.g. the C(--version)
    of a binary it has just written), so a whole install is one task.
  - Then it can start what it wrote: I(units) are converged as by
    C(dklesev.kpssh.units) (enabled, started, stopped, awaited), a unit
    with I(restart_on_change) restarted when this run changed or removed
    a path (but those of its I(restart_ignore)), and systemd reloaded first
    when a changed path is a unit file. Write-then-start in one module run
    instead of two: each is a Python start on the host.
  - Order: I(remove), I(directories), I(archives), I(files), I(manifest),
    I(commands), I(units). Every I(src) is checked before anything is touched: a
    missing one fails the task and nothing is written.
  - Contents are never returned, except in diff mode (C(--diff)): then each
    changed path gets a unified diff of its text (what is on the host
    against what would be written; a content that is one line may show
    masked, as Ansible masks C(no_log) option values) or a line saying what
    differs (binary or large files, modes, owners, removals). Mark the task
    C(no_log) when a content is a secret (the option itself is C(no_log));
    that censors its diff too. Supports check mode (nothing is written;
    I(commands) still run, against what is on the host).
version_added: 0.2.0
options:
  files:
    description: The files.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path.
        type: path
        required: true
      content:
        description: The whole content. Exactly one of I(content) and I(src).
        type: str
      src:
        description:
          - Absolute path of a file on the host whose bytes are the content
            (compared with the file at I(path) by size, then byte by byte).
            Exactly one of I(content) and I(src).
        type: path
        version_added: 1.1.0
      mode:
        description: Octal mode as a string, e.g. C("0644").
        type: str
        required: true
      owner:
        description: Owner name.
        type: str
        default: root
      group:
        description: Group name.
        type: str
        default: root
      force:
        description:
          - C(false) writes the file only when nothing is at I(path) (an
            operator's file, created once, never overwritten or chmod-ed).
        type: bool
        default: true
        version_added: 1.1.0
  directories:
    description:
      - Directories made (with missing parents, 0755) or given this mode,
        owner and group when they differ. Never listed in I(manifest).
    type: list
    elements: dict
    default: []
    version_added: 1.1.0
    suboptions:
      path:
        description: Absolute path.
        type: path
        required: true
      mode:
        description: Octal mode as a string, e.g. C("0755").
        type: str
        required: true
      owner:
        description: Owner name.
        type: str
        default: root
      group:
        description: Group name.
        type: str
        default: root
  archives:
    description:
      - Tar archives on the host (any compression Python's tarfile reads)
        whose regular files at the top level (C(./name) or C(name); nothing
        in a subdirectory, no links) are written into I(dest), each only
        when it differs, with the archive's modification times. The archive
        is read once, as a stream. An archive that cannot be read or holds
        no file at its top level fails the task before I(files) and
        I(manifest) are written.
    type: list
    elements: dict
    default: []
    version_added: 1.1.0
    suboptions:
      src:
        description: Absolute path of the archive on the host.
        type: path
        required: true
      dest:
        description: The directory the files go to (made, 0755, when missing).
        type: path
        required: true
      mode:
        description: Octal mode of every file, e.g. C("0755").
        type: str
        required: true
      owner:
        description: Owner name.
        type: str
        default: root
      group:
        description: Group name.
        type: str
        default: root
  manifest:
    description:
      - A file listing, sorted, one per line, every path of I(files), every
        file of I(archives) and I(extra) (e.g. the manifest itself): what an
        uninstall removes. Written last, like the files, only when it differs.
    type: dict
    version_added: 1.1.0
    suboptions:
      path:
        description: Absolute path.
        type: path
        required: true
      mode:
        description: Octal mode as a string.
        type: str
        default: "0644"
      owner:
        description: Owner name.
        type: str
        default: root
      group:
        description: Group name.
        type: str
        default: root
      extra:
        description: More paths to list.
        type: list
        elements: str
        default: []
  commands:
    description:
      - Read-only commands (argv lists, no shell) by name, run after
        everything is written; each returns rc and stdout/stderr as in
        C(dklesev.kpssh.host_state) (rc null when it cannot start).
    type: dict
    default: {}
    version_added: 1.1.0
  remove:
    description: Glob patterns of files to remove first (directories are left alone).
    type: list
    elements: str
    default: []
  units:
    description:
      - systemd units converged last, in order, as C(dklesev.kpssh.units)
        does (I(name), I(enabled), I(state)). Not run when anything before
        failed.
    type: list
    elements: dict
    default: []
    version_added: 1.2.0
    suboptions:
      name:
        description: Unit name with its suffix, e.g. C(kubelet.service).
        type: str
        required: true
      enabled:
        description: Enabled at boot (C(true)), disabled (C(false)), or left alone (unset).
        type: bool
      state:
        description: C(started), C(restarted), C(stopped), or left alone (unset).
        type: str
        choices: [started, restarted, stopped]
      restart_on_change:
        description:
          - A unit whose I(state) is C(started) is restarted instead when
            this run changed or removed any path (the handler pattern, in
            the same round trip).
        type: bool
        default: false
      restart_ignore:
        description: Paths whose change alone is no reason for I(restart_on_change).
        type: list
        elements: str
        default: []
  daemon_reload:
    description: Reload systemd before the units (it also reloads when a changed path is a unit file, or as C(dklesev.kpssh.units) does).
    type: bool
    default: false
    version_added: 1.2.0
  wait_active:
    description: Seconds to wait for the started and restarted I(units) to be active; 0 does not wait.
    type: int
    default: 0
    version_added: 1.2.0
author:
  - kpssh maintainers
'''

EXAMPLES = r'''
- name: Write the node's files
  dklesev.kpssh.files:
    files:
      - path: /etc/kubernetes/pki/ca.crt
        content: "{{ ca_pem }}"
        mode: "0644"
  register: written

- name: Install binaries from a mirror directory, the CNI plugins, a record
  dklesev.kpssh.files:
    directories:
      - {path: /opt/cni/bin, mode: "0755"}
    files:
      - {path: /usr/local/bin/kubelet, src: /srv/mirror/amd64/kubelet, mode: "0755"}
      - {path: /etc/default/kubelet, content: "KUBELET_EXTRA_ARGS=\n", mode: "0644", force: false}
    archives:
      - {src: /srv/mirror/amd64/cni-plugins.tgz, dest: /opt/cni/bin, mode: "0755"}
    manifest:
      path: /var/lib/example/installed.files
      extra: [/var/lib/example/installed.files]
    commands:
      kubelet_version: [/usr/local/bin/kubelet, --version]
  register: installed

- name: Write the kubelet's configuration and start it (restarted when it changed)
  dklesev.kpssh.files:
    files:
      - {path: /var/lib/kubelet/config.yaml, content: "{{ kubelet_config }}", mode: "0644"}
    units:
      - {name: kubelet.service, enabled: true, state: started, restart_on_change: true}
    wait_active: 60
'''

RETURN = r'''
changed_paths:
  description: The files and directories written or fixed (or, in check mode, that would be).
  type: list
  elements: str
  returned: always
removed:
  description: The files removed (or, in check mode, that would be).
  type: list
  elements: str
  returned: always
archives:
  description: Archive (I(src)) to the paths of its top-level files under I(dest), written or already right.
  type: dict
  returned: always
  version_added: 1.1.0
commands:
  description: Name to C({rc, stdout, stderr}), as in C(dklesev.kpssh.host_state).
  type: dict
  returned: always
  version_added: 1.1.0
actions:
  description: What was done to I(units) (or, in check mode, would be), as C(dklesev.kpssh.units) returns it.
  type: list
  elements: str
  returned: always
  version_added: 1.2.0
active:
  description: C(systemctl is-active) of every unit of I(units) after the last action (and the wait).
  type: dict
  returned: always
  version_added: 1.2.0
'''

import difflib
import glob
import grp
import os
import pwd
import stat
import tarfile
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dklesev.kpssh.plugins.module_utils.host_commands import check_all, run_all
from ansible_collections.dklesev.kpssh.plugins.module_utils.systemd_units import UNIT_DIRS, UNIT_OPTIONS, UnitsFailed, check_units, converge

CHUNK = 1 << 20
# diff mode: files larger than this are described, not diffed
MAX_DIFF = 64 * 1024


class _Fail(Exception):
    pass


def _mode(value, what):
    try:
        return int(value, 8)
    except ValueError:
        raise _Fail('files: mode %r of %s is not octal' % (value, what))


def _ids(owner, group, what):
    try:
        return pwd.getpwnam(owner).pw_uid, grp.getgrnam(group).gr_gid
    except KeyError as e:
        raise _Fail('files: %s: unknown owner or group %s' % (what, e))


def _attrs_differ(path, mode, uid, gid, size):
    """None when path is a regular file with these attributes and size, else True."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    if not stat.S_ISREG(st.st_mode):
        return True
    return (st.st_mode & 0o7777) != mode or st.st_uid != uid or st.st_gid != gid or st.st_size != size or None


def _same_stream(reader, path):
    """Compares the rest of reader with the file at path (same size).

    Returns None when equal, else (offset, chunk): the reader's chunk at
    offset differs (the bytes before it are path's)."""
    off = 0
    with open(path, 'rb') as f:
        while True:
            a = reader.read(CHUNK)
            if not a:
                return None
            if f.read(len(a)) != a:
                return off, a
            off += len(a)


def _write(path, mode, uid, gid, fill, mtime=None):
    """Atomically replaces path with what fill(fileobj) writes."""
    d = os.path.dirname(path)
    os.makedirs(d, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix='.kpssh-', dir=d)
    try:
        os.fchmod(fd, mode)
        os.fchown(fd, uid, gid)
        with os.fdopen(fd, 'wb') as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        if mtime is not None:
            os.utime(tmp, (mtime, mtime))
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _copy_rest(reader, out):
    while True:
        b = reader.read(CHUNK)
        if not b:
            return
        out.write(b)


def _place(path, mode, uid, gid, size, open_reader, check_mode, mtime=None):
    """Makes path hold the bytes of open_reader() (size bytes): True when it changed (would)."""
    with open_reader() as reader:
        diff = True
        if not _attrs_differ(path, mode, uid, gid, size):
            diff = _same_stream(reader, path)
            if diff is None:
                return False
        if check_mode:
            return True
        if diff is True:
            fill = lambda out: _copy_rest(reader, out)  # noqa: E731
        else:
            off, chunk = diff

            def fill(out):
                with open(path, 'rb') as old:  # the equal prefix, then the rest
                    out.write(old.read(off))
                out.write(chunk)
                _copy_rest(reader, out)
        _write(path, mode, uid, gid, fill, mtime)
        return True


def _content(path, data, mode, uid, gid, check_mode):
    if not _attrs_differ(path, mode, uid, gid, len(data)):
        with open(path, 'rb') as f:
            if f.read() == data:
                return False
    if not check_mode:
        _write(path, mode, uid, gid, lambda out: out.write(data))
    return True


def _directory(path, mode, uid, gid, check_mode):
    try:
        st = os.stat(path)  # a link to a directory is a directory (as for the file module)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise _Fail('files: %s exists and is not a directory' % path)
    if st is not None and (st.st_mode & 0o7777) == mode and st.st_uid == uid and st.st_gid == gid:
        return False
    if not check_mode:
        if st is None:
            os.makedirs(path, mode=0o755, exist_ok=True)
        os.chown(path, uid, gid)
        os.chmod(path, mode)
    return True


def _archive(src, dest, mode, uid, gid, check_mode, changed_paths):
    """Writes the top-level regular files of the archive src into dest; returns their paths."""
    paths = []
    try:
        with tarfile.open(src, mode='r|*') as tar:
            for m in tar:
                name = m.name[2:] if m.name.startswith('./') else m.name
                if not m.isreg() or not name or '/' in name or name in ('.', '..'):
                    continue
                path = os.path.join(dest, name)
                paths.append(path)
                if _place(path, mode, uid, gid, m.size, lambda: tar.extractfile(m), check_mode, m.mtime):
                    changed_paths.append(path)
    except (tarfile.TarError, EOFError) as e:
        raise _Fail('files: cannot read archive %s: %s' % (src, e))
    if not paths:
        raise _Fail('files: archive %s holds no files at its top level' % src)
    return paths


def _decode(data):
    if b'\0' in data:
        return None
    try:
        return data.decode('utf-8')
    except UnicodeDecodeError:
        return None


def _before(path):
    """What is at path now, for a diff: (lstat or None, its text or None)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None, None
    text = None
    if stat.S_ISREG(st.st_mode) and st.st_size <= MAX_DIFF:
        try:
            with open(path, 'rb') as f:
                text = _decode(f.read(MAX_DIFF + 1))
        except OSError:
            pass
    return st, text


def _attrs(st, mode, uid, gid):
    parts = []
    if (st.st_mode & 0o7777) != mode:
        parts.append('mode %04o -> %04o' % (st.st_mode & 0o7777, mode))
    if (st.st_uid, st.st_gid) != (uid, gid):
        parts.append('owner %d:%d -> %d:%d' % (st.st_uid, st.st_gid, uid, gid))
    return ', '.join(parts)


def _file_diff(path, before, new, size, mode, uid, gid):
    """The diff text of a changed file: new is its bytes (None: a src file of size bytes)."""
    st, old = before
    if st is not None and not stat.S_ISREG(st.st_mode):
        return '%s: not a regular file on the host, a file would be written\n' % path
    text = _decode(new) if new is not None and len(new) <= MAX_DIFF else None
    if st is None:
        if text is None:
            return '%s: missing, would be written (%d bytes, mode %04o)\n' % (path, size, mode)
        old = ''
    out = ''
    if st is not None:
        a = _attrs(st, mode, uid, gid)
        if a:
            out += '%s: %s\n' % (path, a)
    if old is not None and text is not None:
        out += ''.join(difflib.unified_diff(old.splitlines(True), text.splitlines(True),
                                            fromfile=path if st is not None else '/dev/null',
                                            tofile=path, lineterm='\n'))
        if out and not out.endswith('\n'):
            out += '\n\\ No newline at end of file\n'
    elif st is not None and (st.st_size != size or not out):
        out += '%s: content differs (%d -> %d bytes; binary or larger than %d)\n' % (path, st.st_size, size, MAX_DIFF)
    return out


def _manifest_content(m, files, archives):
    paths = set(p for p, _ in files) | set(m['extra'])
    for ps in archives.values():
        paths.update(ps)
    return ''.join(p + '\n' for p in sorted(paths)).encode('utf-8')


def main():
    owner = dict(owner=dict(type='str', default='root'), group=dict(type='str', default='root'))
    module = AnsibleModule(
        argument_spec=dict(
            files=dict(type='list', elements='dict', default=[], options=dict(
                path=dict(type='path', required=True),
                content=dict(type='str', no_log=True),
                src=dict(type='path'),
                mode=dict(type='str', required=True),
                force=dict(type='bool', default=True),
                **owner
            ), mutually_exclusive=[['content', 'src']], required_one_of=[['content', 'src']]),
            directories=dict(type='list', elements='dict', default=[], options=dict(
                path=dict(type='path', required=True),
                mode=dict(type='str', required=True),
                **owner
            )),
            archives=dict(type='list', elements='dict', default=[], options=dict(
                src=dict(type='path', required=True),
                dest=dict(type='path', required=True),
                mode=dict(type='str', required=True),
                **owner
            )),
            manifest=dict(type='dict', options=dict(
                path=dict(type='path', required=True),
                mode=dict(type='str', default='0644'),
                extra=dict(type='list', elements='str', default=[]),
                **owner
            )),
            commands=dict(type='dict', default={}),
            remove=dict(type='list', elements='str', default=[]),
            units=dict(type='list', elements='dict', default=[], options=dict(
                restart_on_change=dict(type='bool', default=False),
                restart_ignore=dict(type='list', elements='str', default=[]),
                **UNIT_OPTIONS
            )),
            daemon_reload=dict(type='bool', default=False),
            wait_active=dict(type='int', default=0),
        ),
        supports_check_mode=True,
    )
    p, check = module.params, module.check_mode
    changed_paths, removed, archives = [], [], {}
    diffs = []  # diff mode: one prepared text per changed path

    def diff(text):
        if module._diff and text:
            diffs.append({'prepared': text})
    try:
        for what in [d['path'] for d in p['directories']] + [f['path'] for f in p['files']] + \
                [a['dest'] for a in p['archives']] + ([p['manifest']['path']] if p['manifest'] else []):
            if not os.path.isabs(what):
                raise _Fail('files: path %r is not absolute' % what)
        check_all(module, p['commands'])
        check_units(p['units'], p['wait_active'])
        dirs = [(d['path'], _mode(d['mode'], d['path'])) + _ids(d['owner'], d['group'], d['path'])
                for d in p['directories']]
        archs = [(a['src'], a['dest'], _mode(a['mode'], a['src'])) + _ids(a['owner'], a['group'], a['src'])
                 for a in p['archives']]
        m = p['manifest']
        if m:
            man_mode, (man_uid, man_gid) = _mode(m['mode'], m['path']), _ids(m['owner'], m['group'], m['path'])
        files = []
        for f in p['files']:
            path = f['path']
            if not f['force'] and os.path.lexists(path):
                files.append((path, None))
                continue
            entry = (_mode(f['mode'], path),) + _ids(f['owner'], f['group'], path)
            files.append((path, (f['content'].encode('utf-8') if f['src'] is None else None, f['src']) + entry))
        missing = [e[1] for _, e in files if e and e[1] is not None and not os.path.isfile(e[1])]
        missing += [a['src'] for a in p['archives'] if not os.path.isfile(a['src'])]
        if missing:
            raise _Fail('files: no such source file: %s (nothing written)' % ', '.join(missing))

        for pat in p['remove']:
            for path in sorted(glob.glob(pat)):
                if os.path.isfile(path) or os.path.islink(path):
                    removed.append(path)
                    diff('%s: removed\n' % path)
                    if not check:
                        os.unlink(path)
        for path, mode, uid, gid in dirs:
            st = _before(path)[0] if module._diff else None
            if _directory(path, mode, uid, gid, check):
                changed_paths.append(path)
                diff('%s: directory %s\n' % (path, _attrs(st, mode, uid, gid) if st else 'missing, would be made'))
        for a in archs:
            n = len(changed_paths)
            archives[a[0]] = _archive(*a, check_mode=check, changed_paths=changed_paths)
            for path in changed_paths[n:]:
                diff('%s: differs from its copy in archive %s\n' % (path, a[0]))
        for path, e in files:
            if e is None:
                continue
            data, src, mode, uid, gid = e
            before = _before(path) if module._diff else None
            size = len(data) if src is None else os.path.getsize(src)
            if src is None:
                changed = _content(path, data, mode, uid, gid, check)
            else:
                changed = _place(path, mode, uid, gid, size, lambda: open(src, 'rb'), check)
            if changed:
                changed_paths.append(path)
                if before is not None:
                    diff(_file_diff(path, before, data, size, mode, uid, gid))
        if m:
            data = _manifest_content(m, files, archives)
            before = _before(m['path']) if module._diff else None
            if _content(m['path'], data, man_mode, man_uid, man_gid, check):
                changed_paths.append(m['path'])
                if before is not None:
                    diff(_file_diff(m['path'], before, data, len(data), man_mode, man_uid, man_gid))
    except (_Fail, UnitsFailed) as e:
        module.fail_json(msg=str(e), changed_paths=changed_paths, removed=removed)
    except OSError as e:
        module.fail_json(msg='files: %s: %s' % (e.filename or '', e.strerror), changed_paths=changed_paths, removed=removed)
    commands = run_all(module, p['commands'])
    actions, active = _units(module, changed_paths, removed, diff)
    extra = {'diff': diffs} if diffs else {}
    module.exit_json(changed=bool(changed_paths or removed or actions), changed_paths=changed_paths, removed=removed,
                     archives=archives, commands=commands, actions=actions, active=active, **extra)


def _units(module, changed_paths, removed, diff):
    """Converges the units after the write: restart_on_change turns started
    into restarted when a path this run changed or removed is not ignored,
    and a changed unit file reloads systemd first."""
    p = module.params
    touched = changed_paths + removed
    units = [dict(u, state='restarted') if u['restart_on_change'] and u['state'] == 'started'
             and any(t not in u['restart_ignore'] for t in touched) else u for u in p['units']]
    reload = p['daemon_reload'] or any(t.startswith(UNIT_DIRS) for t in touched)
    try:
        actions, active, was = converge(module, units, reload, p['wait_active'])
    except UnitsFailed as e:
        module.fail_json(msg=str(e), changed=bool(touched or e.result.get('actions')),
                         changed_paths=changed_paths, removed=removed, **e.result)
    diff(was)
    return actions, active


if __name__ == '__main__':
    main()
