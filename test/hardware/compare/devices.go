package compare

import (
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-node-agent/gpu-node-agent/dra"
	"github.com/gpu-node-agent/gpu-node-agent/gpu"
)

// devicePlugin holds what the device plugin served (run/kubelet.json)
// against the census: every served ID (a replica's without its "::n") is
// a census GPU or MIG device, and every census GPU is served, whole or as
// its MIG devices (which the MIG strategy decides).
func devicePlugin(r *Report, in *Input, gpus []*censusGPU) {
	c := checker{r: r, subject: "device plugin", ref: "served"}
	if in.Kubelet == nil {
		c.notCompared("devices", "run/kubelet.json: "+in.KubeletWhy)
		return
	}
	if !in.Kubelet.Exercised {
		c.notCompared("devices", "run/kubelet.json: no plugin was exercised: "+in.Kubelet.Error)
		return
	}
	served := map[string]string{}
	for name, res := range in.Kubelet.Resources {
		for _, d := range res.Devices {
			id, _, _ := strings.Cut(d.ID, gpu.ReplicaSeparator)
			served[id] = name
		}
	}
	known := map[string]bool{}
	want := 0
	for _, g := range gpus {
		known[g.UUID] = true
		gc := checker{r: r, subject: "gpu " + fmt.Sprint(g.Index)}
		var migUUIDs, migServed []string
		for _, m := range g.migs {
			known[m.UUID] = true
			migUUIDs = append(migUUIDs, m.UUID)
			if _, ok := served[m.UUID]; ok {
				migServed = append(migServed, m.UUID)
			}
		}
		switch res, whole := served[g.UUID]; {
		case whole:
			want++
			gc.add("device plugin", Agree, fmt.Sprintf("census UUID %s, served as %s", g.UUID, res))
		case g.migEnabled() && len(migUUIDs) > 0:
			want += len(migUUIDs)
			o := Agree
			if len(migServed) != len(migUUIDs) {
				o = Disagree
			}
			gc.add("device plugin", o, fmt.Sprintf("census MIG devices %v, served %v", migUUIDs, migServed))
		default:
			want++
			gc.add("device plugin", Disagree, fmt.Sprintf("census UUID %s, not served", g.UUID))
		}
	}
	ids := make([]string, 0, len(served))
	for id := range served {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if !known[id] {
			c.add("devices", Disagree, fmt.Sprintf("%s serves %s, which the census does not know", served[id], id))
		}
	}
	c.numbers("count", "census", "", reading{v: float64(want)}, reading{v: float64(len(served))}, Exact)
}

// draDevices holds the DRA devices dra.Build makes of the agent's topology
// (as the agent publishes them, without a PCI tree to resolve pcieRoot)
// against the census: a GPU not in MIG mode is one gpu device with its
// UUID; one in MIG mode is its MIG devices.
func draDevices(r *Report, in *Input, gpus []*censusGPU) {
	c := checker{r: r, subject: "dra", ref: "dra"}
	if in.Topology == nil {
		c.notCompared("devices", "agent/topology.json: "+in.TopologyWhy)
		return
	}
	res, err := dra.Build(in.Topology, dra.Options{})
	if err != nil {
		c.add("devices", Disagree, "dra.Build: "+err.Error())
		return
	}
	type draDev struct{ name, typ, parent string }
	byUUID := map[string]draDev{}
	for _, d := range res.Devices {
		typ := strAttr(d, dra.AttrType)
		if typ != dra.TypeGPU && typ != dra.TypeMIG {
			continue
		}
		byUUID[strAttr(d, dra.AttrUUID)] = draDev{name: d.Name, typ: typ, parent: strAttr(d, dra.AttrParentUUID)}
	}
	known := map[string]bool{}
	want := 0
	for _, g := range gpus {
		known[g.UUID] = true
		gc := checker{r: r, subject: "gpu " + fmt.Sprint(g.Index)}
		if !g.migEnabled() {
			want++
			switch d, ok := byUUID[g.UUID]; {
			case !ok:
				gc.add("dra", Disagree, fmt.Sprintf("census UUID %s, no DRA device has it", g.UUID))
			case d.typ != dra.TypeGPU:
				gc.add("dra", Disagree, fmt.Sprintf("census GPU %s is DRA device %s of type %s", g.UUID, d.name, d.typ))
			default:
				gc.add("dra", Agree, fmt.Sprintf("census UUID %s, DRA device %s", g.UUID, d.name))
			}
			continue
		}
		for _, m := range g.migs {
			known[m.UUID] = true
			want++
			mc := checker{r: r, subject: fmt.Sprintf("gpu %d mig %d", g.Index, m.Index)}
			switch d, ok := byUUID[m.UUID]; {
			case !ok:
				mc.add("dra", Disagree, fmt.Sprintf("census MIG UUID %s, no DRA device has it", m.UUID))
			case d.typ != dra.TypeMIG || d.parent != g.UUID:
				mc.add("dra", Disagree, fmt.Sprintf("census MIG device %s of GPU %s is DRA device %s of type %s, parent %s", m.UUID, g.UUID, d.name, d.typ, d.parent))
			default:
				mc.add("dra", Agree, fmt.Sprintf("census MIG UUID %s, DRA device %s", m.UUID, d.name))
			}
		}
	}
	uuids := make([]string, 0, len(byUUID))
	for u := range byUUID {
		uuids = append(uuids, u)
	}
	slices.Sort(uuids)
	for _, u := range uuids {
		if !known[u] {
			c.add("devices", Disagree, fmt.Sprintf("DRA device %s has UUID %q, which the census does not know", byUUID[u].name, u))
		}
	}
	c.numbers("count", "census", "", reading{v: float64(want)}, reading{v: float64(len(byUUID))}, Exact)
}

// strAttr is a device's string attribute; "" when it has none.
func strAttr(d resourceapi.Device, name resourceapi.QualifiedName) string {
	if a, ok := d.Attributes[name]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}
