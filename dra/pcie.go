package dra

import (
	"fmt"
	"path/filepath"

	"k8s.io/dynamic-resource-allocation/deviceattribute"
)

// PCIeRootResolver returns the PCIe root complex of a PCI device, as the
// standard resource.kubernetes.io/pcieRoot attribute spells it
// ("pci0000:40"), given its bus ID in "0000:40:00.0" form.
type PCIeRootResolver func(busID string) (string, error)

// SysfsPCIeRoot resolves PCIe roots with the library's helper
// (k8s.io/dynamic-resource-allocation/deviceattribute
// GetPCIeRootAttributeByPCIBusID, v0.37.2) reading <hostRoot>/sys: it
// follows /sys/bus/pci/devices/<bdf> to /sys/devices/pci<dom>:<bus>/... and
// takes the first element. The helper takes the sysfs root as an option
// (WithFSFromRoot), so the agent's --host-root and the simulator's fake
// sysfs work alike.
func SysfsPCIeRoot(hostRoot string) PCIeRootResolver {
	sys := filepath.Join(hostRoot, "sys")
	return func(busID string) (string, error) {
		attr, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(busID, deviceattribute.WithFSFromRoot(sys))
		if err != nil {
			return "", err
		}
		if attr.Value.StringValue == nil {
			return "", fmt.Errorf("pcie root of %s: helper returned no string value", busID)
		}
		return *attr.Value.StringValue, nil
	}
}
