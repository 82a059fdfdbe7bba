package inventory

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// expandRange expands Ansible host ranges: node[01:20] (width kept),
// node[1:9:2] (step), rack[a:f]; several ranges multiply.
func expandRange(pattern string) ([]string, error) {
	i := strings.IndexByte(pattern, '[')
	if i < 0 {
		if strings.ContainsRune(pattern, ']') {
			return nil, errors.New("']' without '['")
		}
		return []string{pattern}, nil
	}
	j := strings.IndexByte(pattern[i:], ']')
	if j < 0 {
		return nil, errors.New("unterminated range '['")
	}
	j += i
	body := pattern[i+1 : j]
	parts := strings.Split(body, ":")
	if len(parts) < 2 || len(parts) > 3 {
		return nil, fmt.Errorf("range [%s]: want [start:end] or [start:end:step]", body)
	}
	step := 1
	if len(parts) == 3 {
		s, err := strconv.Atoi(parts[2])
		if err != nil || s < 1 {
			return nil, fmt.Errorf("range [%s]: step must be a positive integer", body)
		}
		step = s
	}
	var items []string
	lo, hi := parts[0], parts[1]
	if a, errA := strconv.Atoi(lo); errA == nil {
		b, errB := strconv.Atoi(hi)
		if errB != nil || a < 0 || b < a {
			return nil, fmt.Errorf("range [%s]: want numbers start ≤ end", body)
		}
		if (b-a)/step+1 > maxRangeHosts {
			return nil, fmt.Errorf("range [%s] expands to more than %d hosts", body, maxRangeHosts)
		}
		width := 0
		if len(lo) > 1 && lo[0] == '0' {
			width = len(lo)
		}
		for k := a; k <= b; k += step {
			items = append(items, fmt.Sprintf("%0*d", width, k))
		}
	} else {
		if len(lo) != 1 || len(hi) != 1 || !isLower(lo[0]) || !isLower(hi[0]) || hi[0] < lo[0] {
			return nil, fmt.Errorf("range [%s]: want numbers or single lowercase letters start ≤ end", body)
		}
		for c := int(lo[0]); c <= int(hi[0]); c += step {
			items = append(items, string(rune(c)))
		}
	}
	rest, err := expandRange(pattern[j+1:])
	if err != nil {
		return nil, err
	}
	if len(items)*len(rest) > maxRangeHosts {
		return nil, fmt.Errorf("%q expands to more than %d hosts", pattern, maxRangeHosts)
	}
	out := make([]string, 0, len(items)*len(rest))
	for _, it := range items {
		for _, r := range rest {
			out = append(out, pattern[:i]+it+r)
		}
	}
	return out, nil
}

func isLower(c byte) bool { return c >= 'a' && c <= 'z' }
