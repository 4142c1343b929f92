package gpu

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// Time-slicing as NVIDIA's device plugin configures it (k8s-device-plugin
// v0.17-v0.20, api/config/v1/replicas.go and resources.go): each
// resource listed gets Replicas device IDs "<uuid>::<n>" per device, n from
// 0, optionally under another name; a container asking for one gets the
// whole device, shared in time with the other holders.
const (
	// ReplicaSeparator joins a device's UUID and its replica number in a
	// replica's device ID (NVIDIA's internal/rm AnnotatedID).
	ReplicaSeparator = "::"
	// SharedSuffix is appended to a resource's name by renameByDefault
	// (NVIDIA's DefaultSharedResourceNameSuffix).
	SharedSuffix = ".shared"
	// MaxReplicas bounds replicas per device. NVIDIA's plugin sets none;
	// 1024 keeps a resource's ListAndWatch answer far below the kubelet's
	// 4 MiB gRPC message limit on an 8-GPU node (see maxResourceDevices for
	// nodes with many MIG devices).
	MaxReplicas = 1024
	// resourceNameMax is NVIDIA's MaxResourceNameLength: a resource name,
	// prefix included, is at most 63 characters.
	resourceNameMax = 63
	// nvidiaDomain prefixes names written without a domain, as NVIDIA's
	// NewResourceName does ("gpu" is nvidia.com/gpu).
	nvidiaDomain = "nvidia.com/"
)

// TimeSlicing is the sharing.timeSlicing configuration: which resources
// are served as time-sliced replicas. Its JSON (and YAML) form is NVIDIA's,
// read strictly: unknown keys are errors naming the key.
type TimeSlicing struct {
	// RenameByDefault serves every shared resource without a Rename as
	// <name>.shared.
	RenameByDefault bool
	// FailRequestsGreaterThanOne refuses Allocate of more than one device
	// to a container when any of them is a replica: a second replica of a
	// shared GPU gives no more of it.
	FailRequestsGreaterThanOne bool
	// Resources are the shared resources, in the order written.
	Resources []SharedResource
}

// SharedResource is one entry of sharing.timeSlicing.resources.
type SharedResource struct {
	// Name is the resource whose devices are shared: nvidia.com/gpu or a
	// mixed-strategy nvidia.com/mig-<profile> (a name written without
	// "nvidia.com/" gets it, as NVIDIA's plugin does).
	Name string
	// Replicas is how many device IDs each shared device gets (2 or more).
	Replicas int
	// Rename, if set, is the resource the replicas are served as.
	Rename string
	// Devices chooses which of the resource's devices are shared; the
	// others stay under Name, unshared.
	Devices SharedDevices
}

// SharedDevices is a shared resource's `devices`: "all" (the zero value),
// a count, or a list of GPU indexes ("0"), MIG indexes ("<gpu>:<mig>",
// the MIG device's NVML handle index on its GPU) and GPU or MIG UUIDs.
type SharedDevices struct {
	// Count, when positive, shares the first Count devices in NVML order
	// (GPU index, then MIG index). NVIDIA's plugin takes Count devices in
	// map order, which is random; this is deterministic.
	Count int
	// List, when not empty, shares exactly the devices it names.
	List []string
}

// All reports whether every device of the resource is shared.
func (d SharedDevices) All() bool { return d.Count == 0 && len(d.List) == 0 }

// ServedName is the resource name the replicas are served as: Rename, or
// with renameByDefault <Name>.shared, else Name.
func (r SharedResource) ServedName(renameByDefault bool) string {
	switch {
	case r.Rename != "":
		return r.Rename
	case renameByDefault:
		return r.Name + SharedSuffix
	}
	return r.Name
}

// Lookup returns the entry sharing resource name (nvidia.com/gpu or
// nvidia.com/mig-<profile>), if any.
func (t *TimeSlicing) Lookup(name string) (SharedResource, bool) {
	if t == nil {
		return SharedResource{}, false
	}
	for _, r := range t.Resources {
		if r.Name == name {
			return r, true
		}
	}
	return SharedResource{}, false
}

// LabelSharing is what gpu-feature-discovery's labels say about the shared
// resources (NVIDIA's internal/lm/resource.go): the replicas per device and
// whether the replicas are served under another name. nil when nothing is
// shared.
func (t *TimeSlicing) LabelSharing() topology.Sharing {
	if t == nil || len(t.Resources) == 0 {
		return nil
	}
	s := topology.Sharing{}
	for _, r := range t.Resources {
		// GFD's isRenamed: a rename was written or renameByDefault made one.
		s[r.Name] = topology.SharedResource{Replicas: r.Replicas, Renamed: r.Rename != "" || t.RenameByDefault}
	}
	return s
}

// timeSlicingPath names the section in errors; both the agent's config
// file and NVIDIA's keep it there.
const timeSlicingPath = "sharing.timeSlicing"

// UnmarshalJSON reads NVIDIA's form strictly: unknown keys are errors,
// and every error names the key (sharing.timeSlicing.resources[1].replicas).
// Names are given the nvidia.com/ prefix when written without it.
func (t *TimeSlicing) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	raw, err := object(timeSlicingPath, b, "renameByDefault", "failRequestsGreaterThanOne", "resources")
	if err != nil {
		return err
	}
	out := TimeSlicing{}
	if err := decodeField(raw, timeSlicingPath, "renameByDefault", &out.RenameByDefault); err != nil {
		return err
	}
	if err := decodeField(raw, timeSlicingPath, "failRequestsGreaterThanOne", &out.FailRequestsGreaterThanOne); err != nil {
		return err
	}
	var items []json.RawMessage
	if err := decodeField(raw, timeSlicingPath, "resources", &items); err != nil {
		return err
	}
	for i, item := range items {
		r, err := decodeSharedResource(fmt.Sprintf("%s.resources[%d]", timeSlicingPath, i), item)
		if err != nil {
			return err
		}
		out.Resources = append(out.Resources, r)
	}
	*t = out
	return nil
}

func decodeSharedResource(path string, b []byte) (SharedResource, error) {
	raw, err := object(path, b, "name", "replicas", "rename", "devices")
	if err != nil {
		return SharedResource{}, err
	}
	var r SharedResource
	if err := decodeField(raw, path, "name", &r.Name); err != nil {
		return r, err
	}
	if err := decodeField(raw, path, "replicas", &r.Replicas); err != nil {
		return r, err
	}
	if err := decodeField(raw, path, "rename", &r.Rename); err != nil {
		return r, err
	}
	r.Name, r.Rename = qualify(r.Name), qualify(r.Rename)
	if d, ok := raw["devices"]; ok {
		if r.Devices, err = decodeDevices(path+".devices", d); err != nil {
			return r, err
		}
	}
	return r, nil
}

// qualify prefixes a name without a domain with nvidia.com/, as NVIDIA's
// NewResourceName does.
func qualify(name string) string {
	if name == "" || strings.HasPrefix(name, nvidiaDomain) {
		return name
	}
	return nvidiaDomain + name
}

// deviceRef matches what NVIDIA's ReplicatedDeviceRef accepts: a GPU
// index, a MIG index "<gpu>:<mig>", a GPU UUID or a MIG UUID in either
// form (MIG-<uuid>, or the pre-R470 MIG-GPU-<uuid>/<gi>/<ci>).
var deviceRef = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^(?:[0-9]+|[0-9]+:[0-9]+|GPU-` + uuidRE + `|MIG-` + uuidRE + `|MIG-GPU-` + uuidRE + `/[0-9]+/[0-9]+)$`)
})

const uuidRE = `[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}`

// decodeDevices reads `devices`: "all", a positive count, or a list of
// device references (numbers are GPU indexes).
func decodeDevices(path string, b []byte) (SharedDevices, error) {
	var s string
	if json.Unmarshal(b, &s) == nil {
		if s != "all" {
			return SharedDevices{}, fmt.Errorf("%s: %q is not \"all\", a count or a list of devices", path, s)
		}
		return SharedDevices{}, nil
	}
	var n json.Number
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if dec.Decode(&n) == nil {
		c, err := strconv.Atoi(n.String())
		if err != nil || c <= 0 {
			return SharedDevices{}, fmt.Errorf("%s: %s is not a positive count of devices", path, n)
		}
		return SharedDevices{Count: c}, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(b, &items); err != nil {
		return SharedDevices{}, fmt.Errorf("%s: %s is not \"all\", a count or a list of devices", path, b)
	}
	if len(items) == 0 {
		return SharedDevices{}, fmt.Errorf("%s: the list is empty (leave devices out to share them all)", path)
	}
	var d SharedDevices
	for i, item := range items {
		var ref string
		var idx uint64
		switch {
		case json.Unmarshal(item, &idx) == nil:
			ref = strconv.FormatUint(idx, 10)
		case json.Unmarshal(item, &ref) == nil && deviceRef().MatchString(ref):
		default:
			return SharedDevices{}, fmt.Errorf("%s[%d]: %s is not a GPU index, a MIG index (<gpu>:<mig>), a GPU UUID or a MIG UUID", path, i, item)
		}
		if slices.Contains(d.List, ref) {
			return SharedDevices{}, fmt.Errorf("%s[%d]: %s is listed twice", path, i, ref)
		}
		d.List = append(d.List, ref)
	}
	return d, nil
}

// object decodes b as a JSON object with only the allowed keys.
func object(path string, b []byte, allowed ...string) (map[string]json.RawMessage, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil || raw == nil {
		if path == "" {
			return nil, fmt.Errorf("want an object, got %s", b)
		}
		return nil, fmt.Errorf("%s: want an object, got %s", path, b)
	}
	var unknown []string
	for k := range raw {
		if !slices.Contains(allowed, k) {
			unknown = append(unknown, join(path, k))
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return nil, fmt.Errorf("unknown field %s (known: %s)", strings.Join(unknown, ", "), strings.Join(allowed, ", "))
	}
	return raw, nil
}

// decodeField decodes raw[key] into v when present and not null.
func decodeField(raw map[string]json.RawMessage, path, key string, v any) error {
	b, ok := raw[key]
	if !ok || string(b) == "null" {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %s: %w", join(path, key), b, unwrapJSON(err))
	}
	return nil
}

// join is the path of key under path ("" is the top level).
func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// unwrapJSON shortens encoding/json's type errors to what was expected.
func unwrapJSON(err error) error {
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) {
		return err
	}
	want := te.Type.String()
	switch te.Type.Kind() {
	case reflect.Int:
		want = "an integer"
	case reflect.Bool:
		want = "true or false"
	case reflect.String:
		want = "a string"
	case reflect.Slice:
		want = "a list"
	}
	return fmt.Errorf("want %s", want)
}

// Validate checks the section against the MIG strategy the resources are
// built under, naming the key of every error.
func (t *TimeSlicing) Validate(migStrategy string) error {
	if t == nil {
		return nil
	}
	if migStrategy == "" {
		migStrategy = MIGStrategyNone
	}
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if len(t.Resources) == 0 {
		add("%s.resources: no resources to share", timeSlicingPath)
	}
	names := map[string]int{}
	served := map[string]int{}
	for i, r := range t.Resources {
		path := fmt.Sprintf("%s.resources[%d]", timeSlicingPath, i)
		switch {
		case r.Name == "":
			add("%s.name: missing", path)
		case r.Name != ResourceGPU && !IsMIGResource(r.Name):
			add("%s.name: %q is not a resource this agent serves (%s, or %s<profile> under mig-strategy %s)", path, r.Name, ResourceGPU, migResourcePrefix, MIGStrategyMixed)
		case IsMIGResource(r.Name) && migStrategy != MIGStrategyMixed:
			add("%s.name: %s is served only under mig-strategy %s (it is %s; under %s MIG devices are %s)", path, r.Name, MIGStrategyMixed, migStrategy, MIGStrategySingle, ResourceGPU)
		default:
			if err := checkResourceName(r.Name); err != nil {
				add("%s.name: %w", path, err)
			}
		}
		if j, dup := names[r.Name]; dup && r.Name != "" {
			add("%s.name: %s is already shared by resources[%d]", path, r.Name, j)
		}
		names[r.Name] = i
		if r.Replicas < 2 || r.Replicas > MaxReplicas {
			add("%s.replicas: %d is not between 2 and %d", path, r.Replicas, MaxReplicas)
		}
		if r.Rename != "" {
			if err := checkResourceName(r.Rename); err != nil {
				add("%s.rename: %w", path, err)
			}
		}
		if sn := r.ServedName(t.RenameByDefault); sn != r.Name {
			if j, dup := served[sn]; dup {
				add("%s.rename: %s is already the name of resources[%d]'s replicas", path, sn, j)
			}
			served[sn] = i
		}
	}
	for i, r := range t.Resources {
		sn := r.ServedName(t.RenameByDefault)
		if j, ok := names[sn]; ok && j != i {
			add("%s.resources[%d].rename: %s is the name of resources[%d], another shared resource", timeSlicingPath, i, sn, j)
		}
		if IsMIGResource(r.Name) && sn == ResourceGPU {
			add("%s.resources[%d].rename: MIG devices cannot be served as %s next to whole GPUs", timeSlicingPath, i, ResourceGPU)
		}
	}
	return errors.Join(errs...)
}

// checkResourceName checks a full resource name as NVIDIA's NewResourceName
// does: in nvidia.com, at most 63 characters, a valid extended resource name.
func checkResourceName(name string) error {
	if !strings.HasPrefix(name, nvidiaDomain) {
		return fmt.Errorf("%q is not in the %s domain", name, strings.TrimSuffix(nvidiaDomain, "/"))
	}
	if len(name) > resourceNameMax {
		return fmt.Errorf("%q is longer than %d characters", name, resourceNameMax)
	}
	if msgs := validation.IsQualifiedName(name); len(msgs) > 0 {
		return fmt.Errorf("%q is not a valid resource name: %s", name, strings.Join(msgs, "; "))
	}
	return nil
}
