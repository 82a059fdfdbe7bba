package jobexec

import (
	"encoding/json"
	"fmt"
	"path"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
)

// Content is the operator content (roles, collections) a phase pod mounts
// at the paths the controller's own pod has it: KPSSH_JOB_CONTENT, which
// the chart renders from its `content` block. InitContainers fill volumes
// where image volumes are unavailable (a copy of a content image).
type Content struct {
	Volumes        []corev1.Volume      `json:"volumes,omitempty"`
	VolumeMounts   []corev1.VolumeMount `json:"volumeMounts,omitempty"`
	InitContainers []corev1.Container   `json:"initContainers,omitempty"`
}

// reserved are the phase pod's own volumes and mount paths.
var (
	reservedVolumes = map[string]bool{"input": true, "run": true, "tmp": true, "home": true}
	reservedMounts  = []string{InputDir, "/dev/shm", "/tmp", "/home/kpssh"}
)

// ParseContent reads KPSSH_JOB_CONTENT ("" is none) and checks it: volume
// names are DNS labels, unique and not the pod's own; every mount names a
// volume, is absolute and stays off the pod's own paths; content is
// mounted read-only (a phase never writes to it), and ConfigMap and Secret
// sources are made optional (see optional).
func ParseContent(s string) (Content, error) {
	var c Content
	if strings.TrimSpace(s) == "" {
		return c, nil
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Content{}, fmt.Errorf("job content: not the JSON of {volumes, volumeMounts, initContainers}: %w", err)
	}
	vols := map[string]bool{}
	for i, v := range c.Volumes {
		if errs := validation.IsDNS1123Label(v.Name); len(errs) > 0 {
			return Content{}, fmt.Errorf("job content: volume name %q: %s", v.Name, strings.Join(errs, "; "))
		}
		if reservedVolumes[v.Name] || vols[v.Name] {
			return Content{}, fmt.Errorf("job content: volume name %q is taken (the phase pod's own: input, run, tmp, home; or given twice)", v.Name)
		}
		vols[v.Name] = true
		optional(&c.Volumes[i])
	}
	for i, m := range c.VolumeMounts {
		if !vols[m.Name] {
			return Content{}, fmt.Errorf("job content: volumeMount %s names no volume of the content", m.MountPath)
		}
		if !path.IsAbs(m.MountPath) || path.Clean(m.MountPath) != m.MountPath {
			return Content{}, fmt.Errorf("job content: mountPath %q is not a clean absolute path", m.MountPath)
		}
		for _, r := range reservedMounts {
			if mp, rp := varRun(m.MountPath), varRun(r); mp == rp || strings.HasPrefix(mp, rp+"/") || strings.HasPrefix(rp, mp+"/") {
				return Content{}, fmt.Errorf("job content: mountPath %s overlaps the phase pod's own %s", m.MountPath, r)
			}
		}
		c.VolumeMounts[i].ReadOnly = true
	}
	for _, ic := range c.InitContainers {
		if ic.Name == ContainerName || ic.Image == "" {
			return Content{}, fmt.Errorf("job content: init container %q needs another name than %q and an image", ic.Name, ContainerName)
		}
	}
	return c, nil
}

// varRun writes a path under /var/run as under /run: in the image /var/run
// is a symlink to /run, so /run/kpssh is where the inputs are mounted.
func varRun(p string) string {
	if p == "/var/run" || strings.HasPrefix(p, "/var/run/") {
		return strings.TrimPrefix(p, "/var")
	}
	return p
}

// optional makes v's ConfigMap and Secret sources optional. Every phase pod
// mounts all of the content: one missing ConfigMap (deleted, never made in
// the Job namespace) or key would hold the phase pods of every profile at
// ContainerCreating until their deadline. Optional, the pod starts without
// it, and only the profile whose role it held fails (role not found).
func optional(v *corev1.Volume) {
	switch {
	case v.ConfigMap != nil:
		v.ConfigMap.Optional = ptr.To(true)
	case v.Secret != nil:
		v.Secret.Optional = ptr.To(true)
	case v.Projected != nil:
		for i := range v.Projected.Sources {
			s := &v.Projected.Sources[i]
			if s.ConfigMap != nil {
				s.ConfigMap.Optional = ptr.To(true)
			}
			if s.Secret != nil {
				s.Secret.Optional = ptr.To(true)
			}
		}
	}
}
