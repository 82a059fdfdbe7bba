#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright kpssh maintainers. Apache-2.0.
from __future__ import annotations

DOCUMENTATION = r'''
module: files
short_description: Write several small files in one round trip, each only when it differs
description:
  - Writes every file of I(files) whose content, mode, owner or group differs
    from what is on the host (atomically: a temporary file in the same
    directory, fsync, rename), creating missing parent directories (0755),
    after removing what I(remove) matches. One module run instead of one
    C(copy)/C(template) task per file (each of those is two round trips:
    a C(stat), then the copy).
  - Render templates on the controller with C(lookup('template', ...)).
  - Contents are never returned; mark the task C(no_log) when a content is a
    secret (the option itself is C(no_log)). Supports check mode.
version_added: 0.2.0
options:
  files:
    description: The files.
    type: list
    elements: dict
    required: true
    suboptions:
      path:
        description: Absolute path.
        type: path
        required: true
      content:
        description: The whole content.
        type: str
        required: true
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
  remove:
    description: Glob patterns of files to remove first (directories are left alone).
    type: list
    elements: str
    default: []
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
'''

RETURN = r'''
changed_paths:
  description: The files written (or, in check mode, that would be).
  type: list
  elements: str
  returned: always
removed:
  description: The files removed (or, in check mode, that would be).
  type: list
  elements: str
  returned: always
'''

import glob
import grp
import os
import pwd
import tempfile

from ansible.module_utils.basic import AnsibleModule


def _differs(path, data, mode, uid, gid):
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    if not os.path.isfile(path) or os.path.islink(path):
        return True
    if (st.st_mode & 0o7777) != mode or st.st_uid != uid or st.st_gid != gid or st.st_size != len(data):
        return True
    with open(path, 'rb') as f:
        return f.read() != data


def _write(path, data, mode, uid, gid):
    d = os.path.dirname(path)
    os.makedirs(d, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix='.kpssh-', dir=d)
    try:
        os.fchmod(fd, mode)
        os.fchown(fd, uid, gid)
        with os.fdopen(fd, 'wb') as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def main():
    module = AnsibleModule(
        argument_spec=dict(
            files=dict(type='list', elements='dict', required=True, options=dict(
                path=dict(type='path', required=True),
                content=dict(type='str', required=True, no_log=True),
                mode=dict(type='str', required=True),
                owner=dict(type='str', default='root'),
                group=dict(type='str', default='root'),
            )),
            remove=dict(type='list', elements='str', default=[]),
        ),
        supports_check_mode=True,
    )
    files = []
    for f in module.params['files']:
        path = f['path']
        if not os.path.isabs(path):
            module.fail_json(msg='files: path %r is not absolute' % path)
        try:
            mode = int(f['mode'], 8)
        except ValueError:
            module.fail_json(msg='files: mode %r of %s is not octal' % (f['mode'], path))
        try:
            uid = pwd.getpwnam(f['owner']).pw_uid
            gid = grp.getgrnam(f['group']).gr_gid
        except KeyError as e:
            module.fail_json(msg='files: %s: unknown owner or group %s' % (path, e))
        files.append((path, f['content'].encode('utf-8'), mode, uid, gid))

    removed = []
    for pat in module.params['remove']:
        for p in sorted(glob.glob(pat)):
            if os.path.isfile(p) or os.path.islink(p):
                removed.append(p)
                if not module.check_mode:
                    os.unlink(p)
    changed_paths = []
    for path, data, mode, uid, gid in files:
        if not _differs(path, data, mode, uid, gid):
            continue
        changed_paths.append(path)
        if not module.check_mode:
            try:
                _write(path, data, mode, uid, gid)
            except OSError as e:
                module.fail_json(msg='files: writing %s: %s' % (path, e.strerror), changed_paths=changed_paths, removed=removed)
    module.exit_json(changed=bool(changed_paths or removed), changed_paths=changed_paths, removed=removed)


if __name__ == '__main__':
    main()
