package cli

import (
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

// Set at link time (make bin: -X …/internal/cli.version=… -X
// …/internal/cli.commit=…); a plain go build leaves them empty and the
// build info fills in what it knows.
var (
	version string
	commit  string
)

// VersionInfo is what `kpssh version` prints.
type VersionInfo struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	Go        string `json:"go"`
	Platform  string `json:"platform"`
	Karpenter string `json:"karpenter"`
}

// Version is this binary's version: the link-time values, else the build
// info (module version, VCS revision), else "unknown"; Karpenter is the
// version of the sigs.k8s.io/karpenter module compiled in.
func Version() VersionInfo {
	v := VersionInfo{Version: version, Commit: commit, Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v.Version == "" && bi.Main.Version != "" {
			v.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && v.Commit == "" {
				v.Commit = s.Value
			}
		}
		for _, m := range bi.Deps {
			if m.Path == "sigs.k8s.io/karpenter" {
				v.Karpenter = m.Version
				if m.Replace != nil {
					v.Karpenter = m.Replace.Version
				}
			}
		}
	}
	for _, f := range []*string{&v.Version, &v.Commit, &v.Karpenter} {
		if *f == "" {
			*f = "unknown"
		}
	}
	return v
}

// VersionUsage is the help text of `kpssh version`.
const VersionUsage = `usage: kpssh version [-o json|yaml]

Prints kpssh's version and commit, the Go release it was built with, and
the Karpenter core version compiled in.

flags:
`

func (d deps) versionCommand() *cobra.Command {
	var output string
	c := d.command("version", "print the version, commit, Go release and Karpenter core version", VersionUsage,
		func(_ *cobra.Command, pos []string) error {
			if len(pos) != 0 {
				return usageErr("unexpected argument(s) %q", pos)
			}
			v := Version()
			var b []byte
			var err error
			switch output {
			case "":
				b = fmt.Appendf(nil, "kpssh:     %s\ncommit:    %s\ngo:        %s %s\nkarpenter: %s\n", v.Version, v.Commit, v.Go, v.Platform, v.Karpenter)
			case "json":
				b, err = json.MarshalIndent(v, "", "  ")
				b = append(b, '\n')
			case "yaml":
				b, err = yaml.Marshal(v)
			default:
				return usageErr("-o %s: want json or yaml", output)
			}
			if err == nil {
				_, err = d.stdout.Write(b)
			}
			if err != nil {
				return runtimeErr("write output: %w", err)
			}
			return nil
		})
	c.Flags().StringVarP(&output, "output", "o", "", "output `format`: json or yaml (default: lines)")
	_ = c.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"json", "yaml"}, cobra.ShellCompDirectiveNoFileComp))
	c.ValidArgsFunction = cobra.NoFileCompletions
	return c
}
