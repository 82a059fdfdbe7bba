package engine

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// yq renders s as a YAML double-quoted scalar that PyYAML (Ansible's loader)
// reads back byte for byte: quotes, backslashes, line breaks and every
// character outside YAML's printable set are escaped (NEL, U+2028 and U+2029
// too: YAML folds them as line breaks). s must be valid UTF-8.
func yq(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r >= 0x20 && r <= 0x7e:
			b.WriteRune(r)
		case r >= 0xa0 && r <= 0xd7ff && r != 0x2028 && r != 0x2029, r >= 0xe000 && r <= 0xfffd && r != 0xfeff, r >= 0x10000 && r <= 0x10ffff:
			b.WriteRune(r)
		case r <= 0xffff:
			fmt.Fprintf(&b, `\u%04X`, r)
		default:
			fmt.Fprintf(&b, `\U%08X`, r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// checkYAMLString rejects strings yq cannot carry.
func checkYAMLString(s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("not valid UTF-8")
	}
	return nil
}
