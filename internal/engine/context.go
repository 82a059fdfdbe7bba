package engine

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"unicode/utf8"
)

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// IsIdentifier reports whether s is a shell identifier ([A-Za-z_][A-Za-z0-9_]*).
func IsIdentifier(s string) bool { return identRE.MatchString(s) }

// Fixed KPSSH_* names: exported in every phase (empty when the phase does not
// get the value).
const (
	EnvClusterEndpoint = "KPSSH_CLUSTER_ENDPOINT"
	EnvClusterCAB64    = "KPSSH_CLUSTER_CA_B64"
	EnvBootstrapToken  = "KPSSH_BOOTSTRAP_TOKEN"
	EnvNodeName        = "KPSSH_NODE_NAME"
	EnvProviderID      = "KPSSH_PROVIDER_ID"
	EnvHostAddress     = "KPSSH_HOST_ADDRESS"
	EnvNodeAddress     = "KPSSH_NODE_ADDRESS"
	EnvNodeLabels      = "KPSSH_NODE_LABELS"
	EnvTaints          = "KPSSH_TAINTS"
	EnvVarPrefix       = "KPSSH_VAR_"
	EnvSecretPrefix    = "KPSSH_SECRET_"
)

// phaseContext applies the environment contract to whatever the caller
// passed: leave (and any phase without a node class in hand) sees only the
// host's addresses; only join sees the bootstrap token.
func phaseContext(p Phase, c Context) Context {
	if p.AddressesOnly() {
		return Context{HostAddress: c.HostAddress, NodeAddress: c.NodeAddress}
	}
	out := c
	if p != PhaseJoin {
		out.BootstrapToken = ""
	}
	return out
}

// checkContext validates names and values before anything runs: every var
// and secret name must be a shell identifier, upper-cased secret names must
// not collide, and no value may hold a NUL byte (it cannot be exported) or
// invalid UTF-8 (it cannot be passed through YAML). Messages name keys, never
// values.
func checkContext(c Context) error {
	for _, k := range sortedKeys(c.Vars) {
		if !IsIdentifier(k) {
			return fmt.Errorf("var name %q is not a shell identifier ([A-Za-z_][A-Za-z0-9_]*)", k)
		}
		if err := checkValue(c.Vars[k]); err != nil {
			return fmt.Errorf("var %s: %w", k, err)
		}
	}
	upper := map[string]string{}
	for _, k := range sortedKeys(c.Secrets) {
		if !IsIdentifier(k) {
			return fmt.Errorf("secret key %q is not a shell identifier ([A-Za-z_][A-Za-z0-9_]*)", k)
		}
		u := strings.ToUpper(k)
		if o, ok := upper[u]; ok {
			return fmt.Errorf("secret keys %q and %q both map to %s%s", o, k, EnvSecretPrefix, u)
		}
		upper[u] = k
		if err := checkValue(c.Secrets[k]); err != nil {
			return fmt.Errorf("secret %s: %w", k, err)
		}
	}
	fixed := map[string]string{
		"cluster endpoint": c.ClusterEndpoint, "cluster CA": c.ClusterCAB64, "bootstrap token": c.BootstrapToken,
		"node name": c.NodeName, "provider ID": c.ProviderID, "host address": c.HostAddress,
		"node address": c.NodeAddress, "node labels": c.NodeLabels, "taints": c.Taints,
	}
	for _, k := range sortedKeys(fixed) {
		if err := checkValue(fixed[k]); err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
	}
	return nil
}

func checkValue(v string) error {
	if strings.IndexByte(v, 0) >= 0 {
		return fmt.Errorf("value contains a NUL byte")
	}
	if !utf8.ValidString(v) {
		return fmt.Errorf("value is not valid UTF-8")
	}
	return nil
}

// Env returns the KPSSH_* environment of a phase (contract applied): the
// fixed names always (empty when the phase does not get them), and for every
// phase but leave KPSSH_VAR_<key> and, if withSecrets, KPSSH_SECRET_<KEY>.
func Env(p Phase, c Context, withSecrets bool) map[string]string {
	c = phaseContext(p, c)
	env := map[string]string{
		EnvClusterEndpoint: c.ClusterEndpoint,
		EnvClusterCAB64:    c.ClusterCAB64,
		EnvBootstrapToken:  c.BootstrapToken,
		EnvNodeName:        c.NodeName,
		EnvProviderID:      c.ProviderID,
		EnvHostAddress:     c.HostAddress,
		EnvNodeAddress:     c.NodeAddress,
		EnvNodeLabels:      c.NodeLabels,
		EnvTaints:          c.Taints,
	}
	if p.AddressesOnly() {
		return env
	}
	for k, v := range c.Vars {
		env[EnvVarPrefix+k] = v
	}
	if withSecrets {
		for k, v := range c.Secrets {
			env[EnvSecretPrefix+strings.ToUpper(k)] = v
		}
	}
	return env
}

// ShellQuote single-quotes s for bash: '…', with each ' written as '\”.
func ShellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// Preamble is the strict preamble prepended to every script: `set -euo
// pipefail`, then one `export NAME='value'` line per variable, sorted by
// name. Every name is validated as a shell identifier first.
func Preamble(env map[string]string) (string, error) {
	names := sortedKeys(env)
	for _, n := range names {
		if !IsIdentifier(n) {
			return "", fmt.Errorf("environment name %q is not a shell identifier", n)
		}
		if strings.IndexByte(env[n], 0) >= 0 {
			return "", fmt.Errorf("environment value of %s contains a NUL byte", n)
		}
	}
	var b strings.Builder
	b.WriteString("set -euo pipefail\n")
	for _, n := range names {
		b.WriteString("export ")
		b.WriteString(n)
		b.WriteByte('=')
		b.WriteString(ShellQuote(env[n]))
		b.WriteByte('\n')
	}
	return b.String(), nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
