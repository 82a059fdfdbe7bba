package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"strings"

	yamlv3 "gopkg.in/yaml.v3"
	"sigs.k8s.io/yaml"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// maxManifestBytes bounds a manifest file the offline commands read.
const maxManifestBytes = 4 << 20

// readObjects decodes every document of kind in a manifest file into a new
// T, strictly (an unknown field is an error, as the apiserver's strict field
// validation makes it); documents of other kinds are skipped, so a file of
// several objects (examples/nodeclass.yaml) can be given as it is. The
// CRD's CEL rules and defaults are not applied offline.
func readObjects[T any](path, kind string) ([]*T, error) {
	return readObjectsOf[T](path, v1beta1.SchemeGroupVersion.String(), kind)
}

// readObjectsOf is readObjects for any apiVersion.
func readObjectsOf[T any](path, apiVersion, kind string) ([]*T, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, usageErr("%v", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxManifestBytes+1))
	if err != nil {
		return nil, usageErr("read %s: %v", path, err)
	}
	if len(data) > maxManifestBytes {
		return nil, usageErr("%s is larger than %d bytes", path, maxManifestBytes)
	}
	dec := yamlv3.NewDecoder(bytes.NewReader(data))
	var out []*T
	for i := 1; ; i++ {
		var doc yamlv3.Node
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, usageErr("%s: document %d: %v", path, i, err)
		}
		raw, err := yamlv3.Marshal(&doc)
		if err != nil {
			return nil, usageErr("%s: document %d: %v", path, i, err)
		}
		var tm struct{ APIVersion, Kind string }
		if err := yaml.Unmarshal(raw, &tm); err != nil {
			return nil, usageErr("%s: document %d: %v", path, i, err)
		}
		if tm.Kind != kind {
			continue
		}
		if tm.APIVersion != apiVersion {
			return nil, usageErr("%s: document %d: %s has apiVersion %q, want %s", path, i, kind, tm.APIVersion, apiVersion)
		}
		js, err := yaml.YAMLToJSONStrict(raw)
		if err != nil {
			return nil, usageErr("%s: document %d: %v", path, i, err)
		}
		obj := new(T)
		jd := json.NewDecoder(bytes.NewReader(js))
		jd.DisallowUnknownFields()
		if err := jd.Decode(obj); err != nil {
			return nil, usageErr("%s: document %d (%s): %v", path, i, kind, err)
		}
		out = append(out, obj)
	}
	if len(out) == 0 {
		return nil, usageErr("%s holds no %s (apiVersion %s)", path, kind, apiVersion)
	}
	return out, nil
}

// readObject is readObjects for a file that must hold exactly one.
func readObject[T any](path, kind string) (*T, error) {
	objs, err := readObjects[T](path, kind)
	return onlyOne(objs, err, path, kind)
}

// readCoreObject is readObject for a core (apiVersion v1) kind.
func readCoreObject[T any](path, kind string) (*T, error) {
	objs, err := readObjectsOf[T](path, "v1", kind)
	return onlyOne(objs, err, path, kind)
}

func onlyOne[T any](objs []*T, err error, path, kind string) (*T, error) {
	if err != nil {
		return nil, err
	}
	if len(objs) != 1 {
		return nil, usageErr("%s holds %d %s documents; give a file with one", path, len(objs), kind)
	}
	return objs[0], nil
}

// multiFlag is a repeatable string flag (--content A --content B).
type multiFlag []string

func (m *multiFlag) String() string { return strings.Join(*m, ",") }
func (m *multiFlag) Type() string   { return "dir" }
func (m *multiFlag) Set(v string) error {
	if strings.TrimSpace(v) == "" {
		return errors.New("empty value")
	}
	*m = append(*m, v)
	return nil
}
