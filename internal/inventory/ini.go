package inventory

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"strings"
)

// DetectFormat: a YAML inventory starts with a mapping key ("all:", a group
// name followed by ":") or a document marker; an INI one with a section or a
// host line.
func DetectFormat(data []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64*1024), MaxBytes)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || l[0] == '#' || l[0] == ';' {
			continue
		}
		if l == "---" || l == "{" || (strings.HasSuffix(l, ":") && !strings.HasPrefix(l, "[")) {
			return "yaml"
		}
		return "ini"
	}
	return "ini"
}

// parseINI reads Ansible's INI inventory: [group], [group:vars],
// [group:children] sections, host lines "name k=v k='v w'", hosts before any
// section in group "ungrouped", # and ; comments.
func (inv *Inventory) parseINI(data []byte) error {
	section, kind := "ungrouped", "hosts"
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64*1024), MaxBytes)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if line[0] == '[' {
			if !strings.HasSuffix(line, "]") {
				return inv.at(n, "malformed section header %q", line)
			}
			name := strings.TrimSpace(line[1 : len(line)-1])
			section, kind = name, "hosts"
			if i := strings.LastIndexByte(name, ':'); i >= 0 {
				section, kind = name[:i], name[i+1:]
				if kind != "vars" && kind != "children" {
					return inv.at(n, "section [%s]: unknown suffix %q (want :vars or :children)", name, kind)
				}
			}
			if err := validGroupName(section); err != nil {
				return inv.at(n, "section [%s]: %v", name, err)
			}
			inv.group(section, n)
			continue
		}
		switch kind {
		case "vars":
			k, v, ok := strings.Cut(line, "=")
			k = strings.TrimSpace(k)
			if !ok || k == "" || strings.ContainsAny(k, " \t") {
				return inv.at(n, "[%s:vars]: want NAME=VALUE, got %q", section, line)
			}
			val, err := unquote(strings.TrimSpace(v))
			if err != nil {
				return inv.at(n, "[%s:vars] %s: %v", section, k, err)
			}
			g := inv.group(section, n)
			if prev, dup := g.varPos[k]; dup {
				return inv.at(n, "[%s:vars]: %s set twice (first on %s)", section, k, prev)
			}
			g.vars[k], g.varPos[k] = val, Pos{inv.src, n}
		case "children":
			if strings.ContainsAny(line, " \t=") {
				return inv.at(n, "[%s:children]: want one group name per line, got %q", section, line)
			}
			if err := validGroupName(line); err != nil {
				return inv.at(n, "[%s:children] %q: %v", section, line, err)
			}
			inv.addChild(inv.group(section, n), line, n)
		default:
			fields, err := splitINIFields(line)
			if err != nil {
				return inv.at(n, "%v", err)
			}
			vars := map[string]string{}
			for _, f := range fields[1:] {
				k, v, ok := strings.Cut(f, "=")
				if !ok || k == "" {
					return inv.at(n, "host %s: want NAME=VALUE, got %q", fields[0], f)
				}
				if _, dup := vars[k]; dup {
					return inv.at(n, "host %s: %s set twice", fields[0], k)
				}
				if vars[k], err = unquote(v); err != nil {
					return inv.at(n, "host %s: %s: %v", fields[0], k, err)
				}
			}
			// Ansible's "host:port" form (the port after any range).
			pattern := fields[0]
			if i := strings.LastIndexByte(pattern, ':'); i > strings.LastIndexByte(pattern, ']') && strings.Count(pattern, "[") == strings.Count(pattern, "]") {
				if _, set := vars["ansible_port"]; set {
					return inv.at(n, "host %s: port given twice (host:port and ansible_port)", pattern)
				}
				pattern, vars["ansible_port"] = pattern[:i], pattern[i+1:]
			}
			if err := inv.addHost(section, pattern, n, vars); err != nil {
				return err
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read inventory: %w", err)
	}
	return nil
}

// splitINIFields splits a host line on blanks outside quotes, keeping the
// quotes (unquote removes them per value). A '#' after a blank starts a
// comment.
func splitINIFields(line string) ([]string, error) {
	var out []string
	var cur strings.Builder
	var quote byte
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quote != 0:
			cur.WriteByte(c)
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
			cur.WriteByte(c)
		case c == ' ' || c == '\t':
			if cur.Len() > 0 {
				out = append(out, cur.String())
				cur.Reset()
			}
		case c == '#' && cur.Len() == 0:
			i = len(line)
		default:
			cur.WriteByte(c)
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote", quote)
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	if len(out) == 0 {
		return nil, errors.New("empty host line")
	}
	return out, nil
}

func unquote(v string) (string, error) {
	if len(v) >= 2 && (v[0] == '\'' || v[0] == '"') {
		if v[len(v)-1] != v[0] {
			return "", fmt.Errorf("unterminated quote in %q", v)
		}
		return v[1 : len(v)-1], nil
	}
	if strings.ContainsAny(v, "'\"") {
		return "", fmt.Errorf("stray quote in %q", v)
	}
	return v, nil
}

func validGroupName(name string) error {
	if name == "" {
		return errors.New("empty group name")
	}
	for _, c := range name {
		if !(c == '_' || c == '-' || c == '.' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return fmt.Errorf("group name %q has character %q", name, c)
		}
	}
	return nil
}
