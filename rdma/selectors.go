package rdma

import "slices"

// Match reports whether port p of device d satisfies the selectors.
func (s Selectors) Match(d Device, p Port) bool {
	if len(s.Vendors) > 0 && !slices.ContainsFunc(s.Vendors, func(v string) bool { return normHex(v) == d.PCI.Vendor }) {
		return false
	}
	if len(s.DeviceIDs) > 0 && !slices.ContainsFunc(s.DeviceIDs, func(v string) bool { return normHex(v) == d.PCI.DeviceID }) {
		return false
	}
	if len(s.Drivers) > 0 && !slices.Contains(s.Drivers, d.PCI.Driver) {
		return false
	}
	if len(s.LinkTypes) > 0 && !slices.ContainsFunc(s.LinkTypes, func(v string) bool { return linkLayerOf(v) == p.LinkLayer }) {
		return false
	}
	if len(s.PCIAddresses) > 0 && !slices.ContainsFunc(s.PCIAddresses, func(v string) bool { return normBDF(v) == d.PCI.Address }) {
		return false
	}
	if len(s.NUMANodes) > 0 && !slices.Contains(s.NUMANodes, d.PCI.NUMANode) {
		return false
	}
	if len(s.IfNames) > 0 {
		names := portNetDevNames(d, p, true)
		if !slices.ContainsFunc(s.IfNames, func(v string) bool { return slices.Contains(names, v) }) {
			return false
		}
	}
	return true
}

// portNetDevNames lists the port's netdevs (Virtual ones only when asked),
// falling back to the device's when the port has none of its own.
func portNetDevNames(d Device, p Port, virtual bool) []string {
	nds := p.NetDevs
	if len(nds) == 0 {
		nds = d.NetDevs
	}
	var names []string
	for _, n := range nds {
		if virtual || !n.Virtual {
			names = append(names, n.Name)
		}
	}
	return names
}
