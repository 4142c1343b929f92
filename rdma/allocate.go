package rdma

import (
	"slices"
	"strconv"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"tags.cncf.io/container-device-interface/pkg/parser"
)

// CDI vendor and class of RDMA port devices: a port is
// "gpu-node-agent.io/rdma=<port ID>". WriteCDISpec writes the spec that
// defines them.
const (
	CDIVendor = "gpu-node-agent.io"
	CDIClass  = "rdma"
)

// Environment variables set on every RDMA allocation.
const (
	// EnvDevices lists the ibdev names, e.g. "mlx5_0,mlx5_1".
	EnvDevices = "RDMA_DEVICES"
	// EnvNetDevs lists the netdevs of the allocated ports.
	EnvNetDevs = "RDMA_NETDEVS"
	// EnvNCCLHCA points NCCL at exactly the allocated ports. The leading
	// "=" asks NCCL for exact names: without it "mlx5_1" also matches
	// mlx5_10 and mlx5_11.
	EnvNCCLHCA = "NCCL_IB_HCA"
)

// PortCharDevs lists the character devices a container needs to use one
// port: the device's uverbs node, the port's umad and (InfiniBand only)
// issm nodes, and the shared rdma_cm.
func (d Device) PortCharDevs(p Port) []CharDev {
	var out []CharDev
	for _, c := range []*CharDev{d.UVerbs, p.UMAD, p.ISSM, d.RDMACM} {
		if c != nil {
			out = append(out, *c)
		}
	}
	return out
}

// containerResponse builds the allocation of a set of ports: device specs
// (or CDI names) and the environment describing them.
func containerResponse(refs []portRef, cdi bool) *pluginapi.ContainerAllocateResponse {
	resp := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{}}
	seenPath := map[string]bool{}
	var ibdevs, netdevs, hcas []string
	for _, r := range refs {
		if cdi {
			resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: parser.QualifiedName(CDIVendor, CDIClass, r.id)})
		} else {
			for _, c := range r.dev.PortCharDevs(r.port) {
				if seenPath[c.Path] {
					continue // uverbs and rdma_cm are shared between ports
				}
				seenPath[c.Path] = true
				resp.Devices = append(resp.Devices, &pluginapi.DeviceSpec{ContainerPath: c.Path, HostPath: c.HostPath, Permissions: "rw"})
			}
		}
		if !slices.Contains(ibdevs, r.dev.Name) {
			ibdevs = append(ibdevs, r.dev.Name)
		}
		hcas = append(hcas, r.dev.Name+":"+strconv.FormatUint(uint64(r.port.Number), 10))
		for _, n := range portNetDevNames(*r.dev, r.port, false) {
			if !slices.Contains(netdevs, n) {
				netdevs = append(netdevs, n)
			}
		}
	}
	resp.Envs[EnvDevices] = strings.Join(ibdevs, ",")
	resp.Envs[EnvNCCLHCA] = "=" + strings.Join(hcas, ",")
	if len(netdevs) > 0 {
		resp.Envs[EnvNetDevs] = strings.Join(netdevs, ",")
	}
	return resp
}
