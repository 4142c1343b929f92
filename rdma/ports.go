package rdma

// ResourcePort is one port a configured resource selects, as discovered:
// what a check of the resource's ports (the preflight's) reads.
type ResourcePort struct {
	// Resource is the resource's name, e.g. "rdma/ib".
	Resource string
	// ID is the port's device ID (Device.PortID), e.g. "mlx5_0".
	ID   string
	Port Port
	// NetDevs are the port's interfaces that decide its health (not the
	// virtual ones seen only in its RoCE GID table).
	NetDevs []NetDev
}

// ResourcePorts lists the ports each resource of cfgs selects in devs, in
// the order of cfgs and then of devs. A port two shared resources select
// is listed under both.
func ResourcePorts(devs []Device, cfgs []ResourceConfig) []ResourcePort {
	var out []ResourcePort
	for _, cfg := range cfgs {
		for _, r := range matchPorts(devs, cfg) {
			rp := ResourcePort{Resource: ResourcePrefix + cfg.Name, ID: r.id, Port: r.port}
			for _, nd := range r.port.NetDevs {
				if !nd.Virtual {
					rp.NetDevs = append(rp.NetDevs, nd)
				}
			}
			out = append(out, rp)
		}
	}
	return out
}

// Up reports whether the port itself is usable (state ACTIVE, phys_state
// LinkUp, as the port health check reads them) and, if not, why.
func (p Port) Up() (bool, string) { return p.portUp() }

// Up reports whether the interface can carry traffic (operstate up, or
// unknown while admin-up, as the port health check reads it).
func (n NetDev) Up() bool { return n.up() }

// matchPorts lists the ports of devs that cfg's selectors match.
func matchPorts(devs []Device, cfg ResourceConfig) []portRef {
	var refs []portRef
	for di := range devs {
		d := &devs[di]
		for _, p := range d.Ports {
			if cfg.Selectors.Match(*d, p) {
				refs = append(refs, portRef{id: d.PortID(p.Number), dev: d, port: p})
			}
		}
	}
	return refs
}

// ExclusiveResourceOf names, by RDMA device (Device.Name), the exclusive
// resource ("rdma/<name>") that selects every port of the device, the
// first such in cfgs: the extended resource a whole NIC stands for when
// DRA serves it. A device no exclusive resource selects whole is left
// out, as is every device of a shared resource (a shared resource's slots
// are not devices). Nil when none.
func ExclusiveResourceOf(devs []Device, cfgs []ResourceConfig) map[string]string {
	var out map[string]string
	for _, cfg := range cfgs {
		if cfg.mode() != ModeExclusive {
			continue
		}
		for di := range devs {
			d := &devs[di]
			if _, done := out[d.Name]; done || len(d.Ports) == 0 {
				continue
			}
			all := true
			for _, p := range d.Ports {
				all = all && cfg.Selectors.Match(*d, p)
			}
			if all {
				if out == nil {
					out = map[string]string{}
				}
				out[d.Name] = ResourcePrefix + cfg.Name
			}
		}
	}
	return out
}
